//! What the command line asks for, validated: the parts from `args::split` folded, in
//! order, into job-wide settings and one [`SegmentSpec`] per MPMD segment, with settings
//! from the environment filled in where the command line is silent.

use std::ffi::OsString;
use std::os::unix::ffi::{OsStrExt, OsStringExt};
use std::path::{Path, PathBuf};
use std::time::Duration;

use pmi_wire::control::{Binding, Liveness};

use crate::allocation::Scheduler;
use crate::args::{self, Key, Part};
use crate::configfile;
use crate::error::UsageError;
use crate::output::OutputSpec;
use crate::quote::cut;

mod values;

use values::{
    output_spec, parse_bind_to, parse_command, parse_launcher, parse_seconds, split_pair,
    OutputOptions,
};

/// An option, or a setting from the environment, that rlaunch cannot use as given.
#[derive(Debug, thiserror::Error)]
pub enum OptionError {
    /// `option` as spelled, or the environment variable the setting came from.
    #[error("{option} {}: expected {what}", cut(.value))]
    Expected { option: &'static str, value: String, what: &'static str },
    #[error("{option} {}: a segment needs at least 1 rank", cut(.value))]
    NoRanks { option: &'static str, value: String },
    #[error("{option} {}: empty variable name", cut(.pair))]
    EmptyName { option: &'static str, pair: String },
    #[error("{0}: empty command")]
    EmptyCommand(&'static str),
    #[error("the timeout must be more than 0 seconds")]
    ZeroTimeout,
    /// `known`: the interfaces with an IPv4 address.
    #[error("{option} {}: no interface of that name has an IPv4 address (these do: {known})", cut(.name))]
    NoInterface { option: &'static str, name: String, known: String },
    #[error("--heartbeat {}: must be at least 0.001 seconds", cut(.0))]
    ShortHeartbeat(String),
    /// The silence timeout must leave room for heartbeats, or every link would be lost.
    #[error("--silence-timeout {}: must be longer than the heartbeat ({heartbeat} s)", cut(.silence))]
    ShortSilence { silence: String, heartbeat: f64 },
    #[error("-l and --prepend-pattern both set the line prefix; give one")]
    TwoPrefixes,
    /// `reason`: what the pattern parser said.
    #[error("{option} {}: {reason}", cut(.pattern))]
    Pattern { option: &'static str, pattern: String, reason: String },
    #[error("--output-filename {}: no directory given", cut(.0))]
    NoOutputDir(String),
    #[error("--output-filename {}: unknown option {} (known: nocopy, nojobid)", cut(.arg), cut(.option))]
    OutputDirOption { arg: String, option: String },
    /// `-configfile` with a program on the command line too.
    #[error("{0}: give the programs either in the file or on the command line")]
    ProgramsTwice(&'static str),
    #[error("no program given: rlaunch -n N PROGRAM [ARGS]")]
    NoProgram,
    /// `''` where a program should be: nothing could run it.
    #[error("empty program name")]
    EmptyProgram,
}

/// What the command line asks rlaunch to do.
pub enum Request {
    Run(Box<Options>),
    Help { all: bool },
    Version,
    Info,
}

/// Which of rlaunch's own environment the ranks start from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum EnvBase {
    All,
    /// Only these names (none for `-genvnone`).
    Only(Vec<String>),
}

impl EnvBase {
    fn add_list(&mut self, list: &str) {
        let names = list.split(',').map(str::trim).filter(|n| !n.is_empty()).map(String::from);
        match self {
            EnvBase::Only(have) => have.extend(names),
            EnvBase::All => *self = EnvBase::Only(names.collect()),
        }
    }

    /// The variables of `env` this base lets through, in `env`'s order.
    pub(crate) fn filter(&self, env: &[(OsString, OsString)]) -> Vec<(Vec<u8>, Vec<u8>)> {
        env.iter()
            .filter(|(k, _)| match self {
                EnvBase::All => true,
                EnvBase::Only(names) => names.iter().any(|n| n.as_bytes() == k.as_bytes()),
            })
            .map(|(k, v)| (k.as_bytes().to_vec(), v.as_bytes().to_vec()))
            .collect()
    }
}

/// Where a segment's hosts come from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum HostSource {
    List(String),
    File(PathBuf),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MapBy {
    Slot,
    Node,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LauncherKind {
    Fork,
    Ssh,
    Rsh,
    /// One `srun` starts every node's proxy, and each dials back.
    Slurm,
    /// Grid Engine's `qrsh -inherit HOST command`: a remote shell inside the job.
    Sge,
    /// LSF's `blaunch HOST command`: likewise.
    Lsf,
}

/// `--pmi`: which PMI flavours the ranks are served.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PmiKinds {
    /// PMI-1 and PMI-2, and PMIx unless no program of the job can be a PMIx client (see
    /// `plan::elf`): the default.
    Auto,
    /// PMI-1, PMI-2 and PMIx.
    All,
    /// PMI-1 and PMI-2: no PMIx server is started.
    Simple,
    /// PMIx (PMI-1 and PMI-2 stay served: they cost nothing until a rank speaks them).
    Pmix,
}

/// `--rmk`: which batch scheduler's allocation gives the hosts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Rmk {
    /// The one rlaunch runs in, if any (Slurm's, found by its variables).
    Detect,
    /// None: `--rmk none`.
    Off,
    Use(Scheduler),
}

/// One executable of the job and how its ranks are set up.
#[derive(Debug, Clone, PartialEq)]
pub struct SegmentSpec {
    /// `None`: as many ranks as its hosts have slots.
    pub np: Option<u32>,
    /// `None`: the job's hosts.
    pub hosts: Option<HostSource>,
    /// Absolute.
    pub wdir: PathBuf,
    /// `Some` when the segment filters rlaunch's environment itself (`-envnone` ...).
    pub env_base: Option<EnvBase>,
    /// `-env` pairs, in order.
    pub env: Vec<(Vec<u8>, Vec<u8>)>,
    pub command: Vec<OsString>,
}

/// Everything the command line (and the environment) decided.
#[derive(Debug, Clone)]
pub struct Options {
    pub(crate) segments: Vec<SegmentSpec>,
    /// The job's hosts, for segments without their own.
    pub(crate) hosts: Option<HostSource>,
    pub(crate) ppn: Option<u32>,
    pub(crate) map_by: MapBy,
    pub(crate) launcher: Option<LauncherKind>,
    pub(crate) launcher_exec: Option<Vec<String>>,
    pub(crate) proxy_path: Option<String>,
    /// `--bind-address`: where rlaunch listens for proxies that dial in (`--launcher slurm`).
    pub(crate) bind_address: Option<std::net::IpAddr>,
    pub(crate) tree_width: u32,
    /// `--rmk`: the scheduler whose allocation gives the hosts of segments without their own.
    pub(crate) rmk: Rmk,
    pub(crate) env_base: EnvBase,
    /// `-genv` and `-x` pairs, in order.
    pub(crate) genv: Vec<(Vec<u8>, Vec<u8>)>,
    pub(crate) stdin: String,
    pub(crate) kill_grace: Duration,
    /// Heartbeat and silence timeout of the tree's links.
    pub(crate) liveness: Liveness,
    pub(crate) timeout: Option<Duration>,
    pub(crate) pmi_port: bool,
    /// `--pmi`.
    pub(crate) pmi: PmiKinds,
    /// `--pset NAME=RANKS`, in order: names and rank ranges (inclusive).
    pub(crate) psets: Vec<(String, Vec<(u32, u32)>)>,
    pub(crate) binding: Option<Binding>,
    pub(crate) report_bindings: bool,
    /// `--tracker rabit`: rlaunch is the job's dmlc/rabit tracker.
    pub(crate) rabit: bool,
    pub(crate) output: OutputSpec,
    pub(crate) print_all_exit_codes: bool,
    /// `--report FILE` and `--timeline FILE`, from the current directory.
    pub(crate) report: Option<PathBuf>,
    pub(crate) timeline: Option<PathBuf>,
    /// rlaunch's own argv, for the report.
    pub(crate) command: Vec<String>,
    pub verbose: u8,
    /// One line each, for options accepted without effect.
    pub notices: Vec<String>,
}

/// Reads rlaunch's argv (without `argv[0]`). `env` is rlaunch's environment, `cwd` its
/// directory; both are parameters so that this stays a pure function of its input.
pub fn parse(
    args: &[OsString],
    env: &[(OsString, OsString)],
    cwd: &Path,
) -> Result<Request, UsageError> {
    let mut parts = args::split(args)?;
    let all = |key: Key| parts.iter().flat_map(|p| &p.items).any(|i| i.key == key);
    if all(Key::HelpAll) {
        return Ok(Request::Help { all: true });
    }
    if all(Key::Help) {
        return Ok(Request::Help { all: false });
    }
    if all(Key::Version) {
        return Ok(Request::Version);
    }
    if all(Key::Info) {
        return Ok(Request::Info);
    }
    let configfile = parts.iter().flat_map(|p| &p.items).find(|i| i.key == Key::Configfile);
    if let Some(item) = configfile {
        let path = cwd.join(item.value.as_deref().expect("takes a value"));
        if parts.len() > 1 || !parts[0].command.is_empty() {
            return Err(OptionError::ProgramsTwice(item.name).into());
        }
        parts.extend(configfile::read(&path)?);
        // The command line's own options apply to every segment.
        let head = parts.remove(0);
        parts[0].items.splice(0..0, head.items);
    }
    if parts[0].command.is_empty() {
        return Err(OptionError::NoProgram.into());
    }
    if parts.iter().any(|p| p.command[0].is_empty()) {
        return Err(OptionError::EmptyProgram.into());
    }
    let mut options = fold(parts, env, cwd)?;
    if let Request::Run(o) = &mut options {
        o.command = std::iter::once("rlaunch".to_string())
            .chain(args.iter().map(|a| a.to_string_lossy().into_owned()))
            .collect();
    }
    Ok(options)
}

fn fold(
    parts: Vec<Part>,
    env: &[(OsString, OsString)],
    cwd: &Path,
) -> Result<Request, OptionError> {
    let mut o = Options {
        segments: Vec::new(),
        hosts: None,
        ppn: None,
        map_by: MapBy::Slot,
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
        liveness: Liveness::default(),
        timeout: None,
        pmi_port: false,
        pmi: PmiKinds::Auto,
        psets: Vec::new(),
        binding: None,
        report_bindings: false,
        rabit: false,
        output: OutputSpec::default(),
        print_all_exit_codes: false,
        report: None,
        timeline: None,
        command: Vec::new(),
        verbose: 0,
        notices: Vec::new(),
    };
    let mut default_wdir: Option<PathBuf> = None;
    let mut output = OutputOptions::default();
    let getenv = |name: &str| env.iter().find(|(k, _)| k == name).map(|(_, v)| v.clone());
    let mut timeout = None;
    // As written, for messages.
    let mut silence_given: Option<String> = None;
    for (index, part) in parts.iter().enumerate() {
        let mut seg = SegmentSpec {
            np: None,
            hosts: None,
            wdir: PathBuf::new(),
            env_base: None,
            env: Vec::new(),
            command: part.command.clone(),
        };
        let mut wdir = None;
        for item in &part.items {
            let text = || item.value.as_ref().map(|v| v.to_string_lossy().into_owned());
            let value = text().unwrap_or_default();
            let bad =
                |what| OptionError::Expected { option: item.name, value: value.clone(), what };
            match item.key {
                Key::Np => {
                    let n = value.parse::<u32>().map_err(|_| bad("a number of ranks"))?;
                    if n == 0 {
                        return Err(OptionError::NoRanks { option: item.name, value });
                    }
                    seg.np = Some(n);
                }
                Key::Configfile | Key::Help | Key::HelpAll | Key::Version | Key::Info => {}
                Key::Timeout => timeout = Some(parse_seconds(item.name, &value)?),
                Key::KillGrace => {
                    o.kill_grace = parse_seconds(item.name, &value)?;
                }
                Key::PmiPort => o.pmi_port = true,
                Key::Pmi => {
                    o.pmi = match value.as_str() {
                        "auto" => PmiKinds::Auto,
                        "all" => PmiKinds::All,
                        "simple" | "pmi" | "pmi1" | "pmi2" => PmiKinds::Simple,
                        "pmix" => PmiKinds::Pmix,
                        _ => return Err(bad("auto, all, simple or pmix")),
                    }
                }
                Key::Tracker => match value.as_str() {
                    "rabit" | "dmlc" | "xgboost" => o.rabit = true,
                    _ => return Err(bad("rabit")),
                },
                Key::Pset => o
                    .psets
                    .push(values::pset(&value).ok_or_else(|| bad("NAME=RANKS, e.g. io=0-3,8"))?),
                Key::Stdin => o.stdin = value,
                Key::Hosts | Key::Hostfile => {
                    let source = if item.key == Key::Hosts {
                        HostSource::List(value)
                    } else {
                        HostSource::File(cwd.join(item.value.as_deref().expect("value")))
                    };
                    if index == 0 {
                        o.hosts = Some(source.clone());
                    }
                    seg.hosts = Some(source);
                }
                Key::Ppn => {
                    let n = value.parse::<u32>().ok().filter(|&n| n > 0);
                    o.ppn = Some(n.ok_or_else(|| bad("a number of ranks per host"))?);
                }
                Key::MapBy => match value.as_str() {
                    "slot" | "--byslot" | "-byslot" | "core" | "hwthread" | "socket" | "numa" => {
                        o.map_by = MapBy::Slot
                    }
                    "node" | "--bynode" | "-bynode" => o.map_by = MapBy::Node,
                    ppr if ppr.starts_with("ppr:") => {
                        let n = ppr
                            .strip_prefix("ppr:")
                            .and_then(|r| r.strip_suffix(":node"))
                            .and_then(|n| n.parse::<u32>().ok())
                            .filter(|&n| n > 0);
                        o.ppn = Some(n.ok_or_else(|| bad("ppr:N:node"))?);
                    }
                    _ => return Err(bad("slot, node or ppr:N:node")),
                },
                Key::Oversubscribe => {}
                Key::Launcher => o.launcher = Some(parse_launcher(item.name, &value)?),
                Key::LauncherExec => o.launcher_exec = Some(parse_command(item.name, &value)?),
                Key::ProxyPath => o.proxy_path = Some(value),
                Key::BindAddress => {
                    o.bind_address = Some(value.parse().map_err(|_| bad("an IP address"))?)
                }
                Key::Iface => o.bind_address = Some(values::interface_address(item.name, &value)?),
                Key::TreeWidth => {
                    o.tree_width = value.parse().map_err(|_| bad("a number of children"))?
                }
                Key::Rmk => {
                    o.rmk = match value.as_str() {
                        "none" => Rmk::Off,
                        name => Rmk::Use(
                            Scheduler::parse(name)
                                .ok_or_else(|| bad("slurm, sge, pbs, lsf or none"))?,
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
                    silence_given = Some(value);
                }
                Key::Genv => o.genv.push(split_pair(item)?),
                Key::Export => match value.split_once('=') {
                    Some(_) => o.genv.push(split_pair(item)?),
                    None => {
                        if let Some(v) = getenv(&value) {
                            o.genv.push((value.into_bytes(), v.into_vec()));
                        }
                    }
                },
                Key::Genvall => o.env_base = EnvBase::All,
                Key::Genvnone => o.env_base = EnvBase::Only(Vec::new()),
                Key::Genvlist => o.env_base.add_list(&value),
                Key::Env => seg.env.push(split_pair(item)?),
                Key::Envall => seg.env_base = Some(EnvBase::All),
                Key::Envnone => seg.env_base = Some(EnvBase::Only(Vec::new())),
                Key::Envlist => {
                    seg.env_base.get_or_insert(EnvBase::Only(Vec::new())).add_list(&value)
                }
                Key::Wdir => {
                    let dir = cwd.join(item.value.as_deref().expect("value"));
                    if index == 0 {
                        default_wdir = Some(dir.clone());
                    }
                    wdir = Some(dir);
                }
                Key::PrependRank => output.prepend_rank = true,
                Key::PrependPattern => output.prepend_pattern = Some(value),
                Key::TagOutput => output.tag = true,
                Key::TimestampOutput => output.timestamp = true,
                Key::OutfilePattern => output.outfile = Some(value),
                Key::ErrfilePattern => output.errfile = Some(value),
                Key::OutputFilename => output.dir = Some(value),
                Key::PrintAllExitCodes => o.print_all_exit_codes = true,
                Key::Report => o.report = Some(cwd.join(&value)),
                Key::Timeline => o.timeline = Some(cwd.join(&value)),
                Key::BindTo => o.binding = parse_bind_to(item.name, &value)?,
                Key::ReportBindings => o.report_bindings = true,
                Key::Verbose => o.verbose = o.verbose.saturating_add(1),
                Key::Mca => {
                    let (name, value) = split_pair(item)?;
                    o.genv.push(([b"OMPI_MCA_", &name[..]].concat(), value));
                }
                Key::Habit(why) => tracing::debug!("{} has no effect: {why}", item.name),
                Key::NoEffect(why) => {
                    let notice = format!("note: {} has no effect: {why}", item.name);
                    if !o.notices.contains(&notice) {
                        o.notices.push(notice);
                    }
                }
            }
        }
        seg.wdir = wdir.unwrap_or_default();
        o.segments.push(seg);
    }
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

    // Settings from the environment, where the command line said nothing: rlaunch's own
    // names first, then Hydra's.
    let setting = |names: &[&'static str]| -> Option<(&'static str, String)> {
        names.iter().find_map(|n| {
            getenv(n)
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::args::os;
    use pmi_wire::control::CpuUnit;

    fn run(line: &str, env: &[(&str, &str)]) -> Result<Options, UsageError> {
        let args: Vec<OsString> = line.split_whitespace().map(os).collect();
        let env: Vec<_> = env.iter().map(|(k, v)| (os(k), os(v))).collect();
        match parse(&args, &env, Path::new("/work"))? {
            Request::Run(o) => Ok(*o),
            _ => panic!("not a run"),
        }
    }

    #[test]
    fn first_segment_sets_defaults_later_ones_override() {
        let o = run("-hosts a,b -wdir d -n 1 ./m : -n 2 -hosts c -wdir /e ./w : ./x", &[]).unwrap();
        assert_eq!(o.segments.len(), 3);
        assert_eq!(o.segments[0].hosts, Some(HostSource::List("a,b".into())));
        assert_eq!(o.segments[1].hosts, Some(HostSource::List("c".into())));
        assert_eq!(o.segments[2].hosts, Some(HostSource::List("a,b".into())));
        assert_eq!(o.segments[0].wdir, Path::new("/work/d"));
        assert_eq!(o.segments[1].wdir, Path::new("/e"));
        assert_eq!(o.segments[2].wdir, Path::new("/work/d"));
        assert_eq!(o.segments[2].np, None);
    }

    #[test]
    fn environment_options_keep_their_order() {
        let o = run("-genvnone -genv A 1 -x B -x C=3 -genvlist D,E ./a", &[("B", "b")]).unwrap();
        assert_eq!(o.env_base, EnvBase::Only(vec!["D".into(), "E".into()]));
        let names: Vec<_> = o.genv.iter().map(|(k, v)| (k.clone(), v.clone())).collect();
        assert_eq!(
            names,
            vec![
                (b"A".to_vec(), b"1".to_vec()),
                (b"B".to_vec(), b"b".to_vec()),
                (b"C".to_vec(), b"3".to_vec())
            ]
        );
        let o = run("-n 1 ./a : -envnone -env X=1 -envlist Y ./b", &[]).unwrap();
        assert_eq!(o.segments[1].env_base, Some(EnvBase::Only(vec!["Y".into()])));
        assert_eq!(o.segments[0].env_base, None);
    }

    #[test]
    fn settings_from_the_environment_yield_to_the_command_line() {
        let env = [("MPIEXEC_TIMEOUT", "5"), ("RLAUNCH_TIMEOUT", "7"), ("HYDRA_LAUNCHER", "rsh")];
        let o = run("./a", &env).unwrap();
        assert_eq!(o.timeout, Some(Duration::from_secs(7)));
        assert_eq!(o.launcher, Some(LauncherKind::Rsh));
        let o = run("--timeout 3 -launcher ssh ./a", &env).unwrap();
        assert_eq!(o.timeout, Some(Duration::from_secs(3)));
        assert_eq!(o.launcher, Some(LauncherKind::Ssh));
        let e = run("./a", &[("HYDRA_LAUNCHER", "pbs")]).unwrap_err();
        assert_eq!(e.to_string(), "HYDRA_LAUNCHER pbs: expected fork, ssh, rsh, slurm, sge or lsf");
    }

    #[test]
    fn open_mpi_spellings() {
        let o =
            run("-np 4 -H a,b --map-by ppr:2:node --bind-to core:2 --tag-output ./a", &[]).unwrap();
        assert_eq!(o.segments[0].np, Some(4));
        assert_eq!(o.ppn, Some(2));
        assert_eq!(o.binding, Some(Binding { unit: CpuUnit::Core, count: 2 }));
        assert!(o.output.tag);
        assert!(run("--map-by ppr:x:node ./a", &[]).is_err());
        assert!(run("--bind-to cores:0 ./a", &[]).is_err());
        // MCA parameters reach the ranks as mpirun passes them, with nothing said.
        let o = run("--mca btl tcp -mca x=y --allow-run-as-root ./a", &[]).unwrap();
        assert!(o.notices.is_empty(), "{:?}", o.notices);
        let mca = |k: &str, v: &str| (k.as_bytes().to_vec(), v.as_bytes().to_vec());
        assert_eq!(o.genv, [mca("OMPI_MCA_btl", "tcp"), mca("OMPI_MCA_x", "y")]);
    }

    #[test]
    fn heartbeat_and_silence_are_configurable_within_reason() {
        let o = run("./a", &[]).unwrap();
        assert_eq!(o.liveness, Liveness { heartbeat_ms: 2000, silence_ms: 10_000 });
        let o = run("--heartbeat 0.2 --silence-timeout 1 ./a", &[]).unwrap();
        assert_eq!(o.liveness, Liveness { heartbeat_ms: 200, silence_ms: 1000 });
        let e = run("--silence-timeout 2 ./a", &[]).unwrap_err().to_string();
        assert_eq!(e, "--silence-timeout 2: must be longer than the heartbeat (2 s)");
        let e = run("--heartbeat 12 ./a", &[]).unwrap_err().to_string();
        assert_eq!(
            e,
            "--silence-timeout 10 (the default): must be longer than the heartbeat (12 s)"
        );
        let e = run("--heartbeat 0 ./a", &[]).unwrap_err().to_string();
        assert_eq!(e, "--heartbeat 0: must be at least 0.001 seconds");
        assert!(run("--heartbeat x ./a", &[]).is_err());
    }
}
