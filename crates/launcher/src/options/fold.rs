//! The command line's parts folded, in order, into [`Options`]: each option to the group of
//! settings it belongs to (placement, the tree, the services ranks are served, the ranks'
//! environment, what rlaunch reports), then the environment's settings where the command
//! line said nothing, then the checks that need every setting.

use std::ffi::OsString;
use std::os::unix::ffi::OsStringExt;
use std::path::{Path, PathBuf};
use std::time::Duration;

use rlaunch_protocol::control::Liveness;

use super::values::{
    self, output_spec, parse_bind_to, parse_command, parse_gpu_bind, parse_launcher, parse_map_by,
    parse_seconds, split_pair, OutputOptions,
};
use super::{
    EnvBase, HangReport, HostSource, MapBy, OptionError, Options, PmiKinds, Request, Rmk,
    SegmentSpec,
};
use crate::allocation::Scheduler;
use crate::args::{Item, Key, Part};
use crate::output::OutputSpec;

/// Folds the command line's `parts` into the options of a run. `env` is rlaunch's
/// environment, `cwd` its directory.
pub(super) fn fold(
    parts: Vec<Part>,
    env: &[(OsString, OsString)],
    cwd: &Path,
) -> Result<Request, OptionError> {
    let mut fold = Fold::new(env, cwd);
    for (index, part) in parts.iter().enumerate() {
        let mut segment = Segment::new(part, index == 0);
        for item in &part.items {
            fold.item(item, &mut segment)?;
        }
        fold.o.segments.push(segment.done());
    }
    fold.done()
}

/// The options so far, and what only the end of the command line decides.
struct Fold<'a> {
    o: Options,
    output: OutputOptions,
    /// The first segment's `-wdir`: the others' unless they give their own.
    default_wdir: Option<PathBuf>,
    timeout: Option<Duration>,
    /// `--silence-timeout` as written, for messages.
    silence_given: Option<String>,
    env: &'a [(OsString, OsString)],
    cwd: &'a Path,
}

/// One segment being folded.
struct Segment {
    spec: SegmentSpec,
    /// Its own `-wdir`.
    wdir: Option<PathBuf>,
    /// The first segment's options also set the job's defaults.
    first: bool,
}

impl Segment {
    fn new(part: &Part, first: bool) -> Segment {
        let spec = SegmentSpec {
            np: None,
            hosts: None,
            wdir: PathBuf::new(),
            gpus: None,
            env_base: None,
            env: Vec::new(),
            command: part.command.clone(),
        };
        Segment { spec, wdir: None, first }
    }

    fn done(mut self) -> SegmentSpec {
        self.spec.wdir = self.wdir.unwrap_or_default();
        self.spec
    }
}

/// An option's value as text (empty for a flag), and the error of a value that is not
/// `what` it should be.
fn value_of(item: &Item) -> String {
    item.value.as_ref().map(|v| v.to_string_lossy().into_owned()).unwrap_or_default()
}

fn expected(item: &Item, what: &'static str) -> OptionError {
    OptionError::Expected { option: item.name, value: value_of(item), what }
}

impl<'a> Fold<'a> {
    fn new(env: &'a [(OsString, OsString)], cwd: &'a Path) -> Fold<'a> {
        let o = Options {
            segments: Vec::new(),
            hosts: None,
            ppn: None,
            map_by: MapBy::Slot,
            mapping: None,
            pe: None,
            launcher: None,
            launcher_exec: None,
            proxy_path: None,
            bind_address: None,
            tree_width: 32,
            rmk: Rmk::Detect,
            env_base: EnvBase::All,
            genv: Vec::new(),
            stdin: "0".into(),
            kill_grace: Duration::from_secs(1),
            max_restarts: 0,
            restart_backoff: Duration::ZERO,
            spare_hosts: Vec::new(),
            goes_on: false,
            liveness: Liveness::default(),
            timeout: None,
            hang_report: HangReport::default(),
            stall_report: None,
            pmi_port: false,
            pmi: PmiKinds::Auto,
            psets: Vec::new(),
            binding: None,
            bind_given: false,
            gpus: None,
            gpu_bind: None,
            gpu_share: false,
            report_bindings: false,
            rabit: false,
            bcast: Vec::new(),
            bcast_dir: None,
            output: OutputSpec::default(),
            print_all_exit_codes: false,
            report: None,
            timeline: None,
            command: Vec::new(),
            verbose: 0,
            notices: Vec::new(),
        };
        let output = OutputOptions::default();
        Fold { o, output, default_wdir: None, timeout: None, silence_given: None, env, cwd }
    }

    /// One option of `segment`'s, to its group.
    fn item(&mut self, item: &Item, segment: &mut Segment) -> Result<(), OptionError> {
        match item.key {
            Key::Np
            | Key::Hosts
            | Key::Hostfile
            | Key::Ppn
            | Key::MapBy
            | Key::Oversubscribe
            | Key::BindTo
            | Key::ReportBindings
            | Key::GpusPerRank
            | Key::GpuBind
            | Key::GpuShare => self.placement(item, segment),
            Key::Launcher
            | Key::LauncherExec
            | Key::ProxyPath
            | Key::BindAddress
            | Key::Iface
            | Key::TreeWidth
            | Key::Rmk
            | Key::Heartbeat
            | Key::SilenceTimeout
            | Key::Timeout
            | Key::HangReport
            | Key::StallReport
            | Key::MaxRestarts
            | Key::RestartBackoff
            | Key::SpareHosts
            | Key::OnFailure
            | Key::KillGrace => self.tree(item),
            Key::Pmi | Key::PmiPort | Key::Pset | Key::Tracker | Key::Bcast | Key::BcastDir => {
                self.services(item)
            }
            Key::Genv
            | Key::Export
            | Key::Genvall
            | Key::Genvnone
            | Key::Genvlist
            | Key::Env
            | Key::Envall
            | Key::Envnone
            | Key::Envlist
            | Key::Wdir
            | Key::Stdin
            | Key::Mca => self.environment(item, segment),
            Key::PrependRank
            | Key::PrependPattern
            | Key::TagOutput
            | Key::TimestampOutput
            | Key::OutfilePattern
            | Key::ErrfilePattern
            | Key::OutputFilename
            | Key::PrintAllExitCodes
            | Key::Report
            | Key::Timeline
            | Key::Verbose => {
                self.reporting(item);
                Ok(())
            }
            // Taken before the fold (`options::parse`).
            Key::Configfile | Key::Help | Key::HelpAll | Key::Version | Key::Info => Ok(()),
            Key::Habit(why) => {
                tracing::debug!("{} has no effect: {why}", item.name);
                Ok(())
            }
            Key::NoEffect(why) => {
                let notice = format!("note: {} has no effect: {why}", item.name);
                if !self.o.notices.contains(&notice) {
                    self.o.notices.push(notice);
                }
                Ok(())
            }
        }
    }

    /// Where ranks go: how many, on which hosts, in which order, bound to what.
    fn placement(&mut self, item: &Item, segment: &mut Segment) -> Result<(), OptionError> {
        let (o, value) = (&mut self.o, value_of(item));
        match item.key {
            Key::Np => {
                let n = value.parse::<u32>().map_err(|_| expected(item, "a number of ranks"))?;
                if n == 0 {
                    return Err(OptionError::NoRanks { option: item.name, value });
                }
                segment.spec.np = Some(n);
            }
            Key::Hosts | Key::Hostfile => {
                let source = if item.key == Key::Hosts {
                    HostSource::List(value)
                } else {
                    HostSource::File(self.cwd.join(item.value.as_deref().expect("value")))
                };
                if segment.first {
                    o.hosts = Some(source.clone());
                }
                segment.spec.hosts = Some(source);
            }
            Key::Ppn => {
                let n = value.parse::<u32>().ok().filter(|&n| n > 0);
                o.ppn = Some(n.ok_or_else(|| expected(item, "a number of ranks per host"))?);
            }
            Key::MapBy => {
                let spec = parse_map_by(item.name, &value)?;
                o.map_by = spec.over_hosts;
                if spec.ppn.is_some() {
                    o.ppn = spec.ppn;
                }
                (o.mapping, o.pe) = (spec.mapping, spec.pe);
            }
            Key::Oversubscribe => {}
            Key::BindTo => {
                o.binding = parse_bind_to(item.name, &value)?;
                o.bind_given = true;
            }
            Key::GpusPerRank => {
                let n = value.parse::<u32>().map_err(|_| expected(item, "a number of GPUs"))?;
                if segment.first {
                    o.gpus = Some(n);
                }
                segment.spec.gpus = Some(n);
            }
            Key::GpuBind => o.gpu_bind = Some(parse_gpu_bind(item.name, &value)?),
            Key::GpuShare => o.gpu_share = true,
            Key::ReportBindings => o.report_bindings = true,
            other => unreachable!("{other:?} is no placement option"),
        }
        Ok(())
    }

    /// How the tree of proxies is started and watched, and how long the job may take.
    fn tree(&mut self, item: &Item) -> Result<(), OptionError> {
        let (o, value) = (&mut self.o, value_of(item));
        match item.key {
            Key::Launcher => o.launcher = Some(parse_launcher(item.name, &value)?),
            Key::LauncherExec => o.launcher_exec = Some(parse_command(item.name, &value)?),
            Key::ProxyPath => o.proxy_path = Some(value),
            Key::BindAddress => {
                let address = value.parse().map_err(|_| expected(item, "an IP address"))?;
                o.bind_address = Some(address);
            }
            Key::Iface => o.bind_address = Some(values::interface_address(item.name, &value)?),
            Key::TreeWidth => {
                o.tree_width = value.parse().map_err(|_| expected(item, "a number of children"))?
            }
            Key::Rmk => {
                o.rmk = match value.as_str() {
                    "none" => Rmk::Off,
                    name => Rmk::Use(
                        Scheduler::parse(name)
                            .ok_or_else(|| expected(item, "slurm, sge, pbs, lsf or none"))?,
                    ),
                }
            }
            Key::Heartbeat => {
                let every = parse_seconds(item.name, &value)?;
                if every < Duration::from_millis(1) {
                    return Err(OptionError::ShortHeartbeat(value));
                }
                o.liveness.heartbeat_ms = every.as_millis() as u64;
            }
            Key::SilenceTimeout => {
                let silence = parse_seconds(item.name, &value)?;
                o.liveness.silence_ms = silence.as_millis() as u64;
                self.silence_given = Some(value);
            }
            Key::Timeout => self.timeout = Some(parse_seconds(item.name, &value)?),
            Key::HangReport => {
                o.hang_report = match value.as_str() {
                    // Open MPI's flag comes as its spelling.
                    "fences" | "--report-state-on-timeout" => HangReport::Fences,
                    "stacks" | "--get-stack-traces" => HangReport::Stacks,
                    "none" => HangReport::None,
                    _ => return Err(expected(item, "stacks, fences or none")),
                }
            }
            Key::StallReport => o.stall_report = Some(parse_seconds(item.name, &value)?),
            Key::KillGrace => o.kill_grace = parse_seconds(item.name, &value)?,
            Key::MaxRestarts => {
                o.max_restarts =
                    value.trim().parse().map_err(|_| expected(item, "a number of restarts"))?
            }
            Key::RestartBackoff => o.restart_backoff = parse_seconds(item.name, &value)?,
            Key::OnFailure => {
                o.goes_on = match value.as_str() {
                    "end" => false,
                    // Hydra's flag comes as its spelling.
                    "continue" | "--disable-auto-cleanup" | "-disable-auto-cleanup" => true,
                    _ => return Err(expected(item, "end or continue")),
                }
            }
            Key::SpareHosts => {
                let hosts = crate::hosts::parse_host_list(&value)
                    .map_err(|_| expected(item, "a host list, e.g. a,b"))?;
                o.spare_hosts.extend(hosts.into_iter().map(|h| h.name));
            }
            other => unreachable!("{other:?} is no option of the tree"),
        }
        Ok(())
    }

    /// What the ranks are served besides their stdio: PMI, PMIx process sets, a tracker.
    fn services(&mut self, item: &Item) -> Result<(), OptionError> {
        let (o, value) = (&mut self.o, value_of(item));
        match item.key {
            Key::PmiPort => o.pmi_port = true,
            Key::Pmi => {
                o.pmi = match value.as_str() {
                    "auto" => PmiKinds::Auto,
                    "all" => PmiKinds::All,
                    "simple" | "pmi" | "pmi1" | "pmi2" => PmiKinds::Simple,
                    "pmix" => PmiKinds::Pmix,
                    _ => return Err(expected(item, "auto, all, simple or pmix")),
                }
            }
            Key::Tracker => match value.as_str() {
                "rabit" | "dmlc" | "xgboost" => o.rabit = true,
                _ => return Err(expected(item, "rabit")),
            },
            Key::Pset => {
                let pset = values::pset(&value);
                o.psets.push(pset.ok_or_else(|| expected(item, "NAME=RANKS, e.g. io=0-3,8"))?);
            }
            Key::Bcast => {
                let (file, dest) = values::bcast(&value).ok_or_else(|| {
                    expected(item, "FILE or FILE:DEST, DEST a relative name without '..'")
                })?;
                o.bcast.push((self.cwd.join(file), dest));
            }
            Key::BcastDir if !value.starts_with('/') => {
                return Err(expected(item, "an absolute directory"))
            }
            Key::BcastDir => o.bcast_dir = Some(value),
            other => unreachable!("{other:?} is no option of the services"),
        }
        Ok(())
    }

    /// What the ranks start with: their variables, directory and stdin.
    fn environment(&mut self, item: &Item, segment: &mut Segment) -> Result<(), OptionError> {
        let value = value_of(item);
        let getenv = getenv(self.env, &value);
        let o = &mut self.o;
        match item.key {
            Key::Genv => o.genv.push(split_pair(item)?),
            Key::Export => match value.split_once('=') {
                Some(_) => o.genv.push(split_pair(item)?),
                None => {
                    if let Some(v) = getenv {
                        o.genv.push((value.into_bytes(), v.into_vec()));
                    }
                }
            },
            Key::Genvall => o.env_base = EnvBase::All,
            Key::Genvnone => o.env_base = EnvBase::Only(Vec::new()),
            Key::Genvlist => o.env_base.add_list(&value),
            Key::Env => segment.spec.env.push(split_pair(item)?),
            Key::Envall => segment.spec.env_base = Some(EnvBase::All),
            Key::Envnone => segment.spec.env_base = Some(EnvBase::Only(Vec::new())),
            Key::Envlist => {
                segment.spec.env_base.get_or_insert(EnvBase::Only(Vec::new())).add_list(&value)
            }
            Key::Wdir => {
                let dir = self.cwd.join(item.value.as_deref().expect("value"));
                if segment.first {
                    self.default_wdir = Some(dir.clone());
                }
                segment.wdir = Some(dir);
            }
            Key::Stdin => o.stdin = value,
            Key::Mca => {
                let (name, value) = split_pair(item)?;
                o.genv.push(([b"OMPI_MCA_", &name[..]].concat(), value));
            }
            other => unreachable!("{other:?} is no option of the environment"),
        }
        Ok(())
    }

    /// What rlaunch says: the ranks' output's form, its reports, its own verbosity.
    fn reporting(&mut self, item: &Item) {
        let (o, output, value) = (&mut self.o, &mut self.output, value_of(item));
        match item.key {
            Key::PrependRank => output.prepend_rank = true,
            Key::PrependPattern => output.prepend_pattern = Some(value),
            Key::TagOutput => output.tag = true,
            Key::TimestampOutput => output.timestamp = true,
            Key::OutfilePattern => output.outfile = Some(value),
            Key::ErrfilePattern => output.errfile = Some(value),
            Key::OutputFilename => output.dir = Some(value),
            Key::PrintAllExitCodes => o.print_all_exit_codes = true,
            Key::Report => o.report = Some(self.cwd.join(&value)),
            Key::Timeline => o.timeline = Some(self.cwd.join(&value)),
            Key::Verbose => o.verbose = o.verbose.saturating_add(1),
            other => unreachable!("{other:?} is no option of reporting"),
        }
    }

    /// The command line is folded: the segments get the job's defaults, settings from the
    /// environment fill what the command line left, and the settings are checked together.
    fn done(self) -> Result<Request, OptionError> {
        let Fold { mut o, output, default_wdir, timeout, silence_given, env, cwd } = self;
        o.output = output_spec(&output)?;
        let base_wdir = default_wdir.unwrap_or_else(|| cwd.to_path_buf());
        for seg in &mut o.segments {
            if seg.wdir.as_os_str().is_empty() {
                seg.wdir.clone_from(&base_wdir);
            }
            if seg.hosts.is_none() {
                seg.hosts.clone_from(&o.hosts);
            }
        }
        from_environment(&mut o, env, cwd, timeout)?;
        if o.timeout == Some(Duration::ZERO) {
            return Err(OptionError::ZeroTimeout);
        }
        if o.liveness.silence_ms <= o.liveness.heartbeat_ms {
            let silence = silence_given
                .unwrap_or_else(|| format!("{} (the default)", o.liveness.silence().as_secs_f64()));
            let heartbeat = o.liveness.heartbeat().as_secs_f64();
            return Err(OptionError::ShortSilence { silence, heartbeat });
        }
        Ok(Request::Run(Box::new(o)))
    }
}

/// Settings from the environment, where the command line said nothing: rlaunch's own names
/// first, then Hydra's. `timeout`: the command line's.
fn from_environment(
    o: &mut Options,
    env: &[(OsString, OsString)],
    cwd: &Path,
    timeout: Option<Duration>,
) -> Result<(), OptionError> {
    let setting = |names: &[&'static str]| -> Option<(&'static str, String)> {
        names.iter().find_map(|n| {
            getenv(env, n)
                .map(|v| v.to_string_lossy().trim().to_string())
                .filter(|v| !v.is_empty())
                .map(|v| (*n, v))
        })
    };
    if o.hosts.is_none() {
        if let Some((_, file)) = setting(&["RLAUNCH_HOSTFILE", "HYDRA_HOST_FILE"]) {
            let source = HostSource::File(cwd.join(file));
            for seg in o.segments.iter_mut().filter(|s| s.hosts.is_none()) {
                seg.hosts = Some(source.clone());
            }
            o.hosts = Some(source);
        }
    }
    if o.launcher.is_none() {
        let names = ["RLAUNCH_LAUNCHER", "HYDRA_LAUNCHER", "HYDRA_BOOTSTRAP"];
        if let Some((name, v)) = setting(&names) {
            o.launcher = Some(parse_launcher(name, &v)?);
        }
    }
    if o.launcher_exec.is_none() {
        let names = ["RLAUNCH_LAUNCHER_EXEC", "HYDRA_LAUNCHER_EXEC", "HYDRA_BOOTSTRAP_EXEC"];
        if let Some((name, v)) = setting(&names) {
            o.launcher_exec = Some(parse_command(name, &v)?);
        }
    }
    o.timeout = match timeout {
        Some(t) => Some(t),
        None => match setting(&["RLAUNCH_TIMEOUT", "MPIEXEC_TIMEOUT"]) {
            Some((name, v)) => Some(parse_seconds(name, &v)?),
            None => None,
        },
    };
    Ok(())
}

fn getenv(env: &[(OsString, OsString)], name: &str) -> Option<OsString> {
    env.iter().find(|(k, _)| k == name).map(|(_, v)| v.clone())
}
