//! What the command line asks for, validated: the parts from `args::split` folded, in
//! order, into job-wide settings and one [`SegmentSpec`] per MPMD segment, with settings
//! from the environment filled in where the command line is silent.

use std::ffi::OsString;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::time::Duration;

use rlaunch_protocol::control::{Binding, GpuBind, Liveness, Mapping};

use crate::allocation::Scheduler;
use crate::args::{self, Key};
use crate::configfile;
pub use crate::error::OptionError;
use crate::error::UsageError;
use crate::output::OutputSpec;

mod fold;
mod values;

use fold::fold;

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

/// `--hang-report`: what a job that times out says before it is killed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum HangReport {
    /// Nothing: the job is killed, as Hydra does.
    None,
    /// The ranks missing from each fence, and every rank's process state.
    Fences,
    /// All of `Fences`, and every live rank's stacks merged into one tree.
    #[default]
    Stacks,
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
    /// `--gpus-per-rank` of this segment's; `None`: the job's.
    pub gpus: Option<u32>,
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
    /// `--map-by UNIT` or `ppr:N:UNIT`: where ranks go within each host.
    pub(crate) mapping: Option<Mapping>,
    /// `--map-by ...:PE=n`: each rank binds n cores (or n of `--bind-to`'s unit).
    pub(crate) pe: Option<u32>,
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
    /// `--max-restarts`: how many times a failed job is started again.
    pub(crate) max_restarts: u32,
    /// `--restart-backoff`: the wait before the first restart, doubled before each next.
    pub(crate) restart_backoff: Duration,
    /// `--spare-hosts`: hosts that take a lost node's ranks on a restart.
    pub(crate) spare_hosts: Vec<String>,
    /// `--on-failure continue`: a failed rank ends alone and the others run on.
    pub(crate) goes_on: bool,
    /// Heartbeat and silence timeout of the tree's links.
    pub(crate) liveness: Liveness,
    pub(crate) timeout: Option<Duration>,
    /// `--hang-report`: what a job that times out says first.
    pub(crate) hang_report: HangReport,
    /// `--stall-report`: how long a job may do nothing before it says where it is.
    pub(crate) stall_report: Option<Duration>,
    pub(crate) pmi_port: bool,
    /// `--pmi`.
    pub(crate) pmi: PmiKinds,
    /// `--pset NAME=RANKS`, in order: names and rank ranges (inclusive).
    pub(crate) psets: Vec<(String, Vec<(u32, u32)>)>,
    pub(crate) binding: Option<Binding>,
    /// `--bind-to` was given (`none` included): a mapping's binding does not apply.
    pub(crate) bind_given: bool,
    /// `--gpus-per-rank` before the first program: every segment's default.
    pub(crate) gpus: Option<u32>,
    /// `--gpu-bind`: `None` when not given, `Some(None)` for `none`.
    pub(crate) gpu_bind: Option<Option<GpuBind>>,
    pub(crate) gpu_share: bool,
    pub(crate) report_bindings: bool,
    /// `--tracker rabit`: rlaunch is the job's dmlc/rabit tracker.
    pub(crate) rabit: bool,
    /// `--bcast FILE[:DEST]`, in order: each file (from the current directory) and its name
    /// on the nodes.
    pub(crate) bcast: Vec<(PathBuf, String)>,
    /// `--bcast-dir`: where each node makes its directory for them.
    pub(crate) bcast_dir: Option<String>,
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::args::os;
    use rlaunch_protocol::control::CpuUnit;

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
    fn map_by_spells_every_level_ppr_and_pe() {
        let mapping = |unit, per| Some(Mapping { unit, per });
        for (value, want) in [
            ("core", mapping(CpuUnit::Core, None)),
            ("hwthread", mapping(CpuUnit::Hwthread, None)),
            ("l3cache", mapping(CpuUnit::L3, None)),
            ("NUMA", mapping(CpuUnit::Numa, None)),
            ("package", mapping(CpuUnit::Socket, None)),
            ("ppr:2:socket", mapping(CpuUnit::Socket, Some(2))),
            ("ppr:1:l3cache:oversubscribe", mapping(CpuUnit::L3, Some(1))),
        ] {
            let o = run(&format!("--map-by {value} ./a"), &[]).unwrap();
            assert_eq!((o.mapping, o.map_by, o.pe), (want, MapBy::Slot, None), "{value}");
        }
        let o = run("--map-by socket:PE=4 ./a", &[]).unwrap();
        assert_eq!((o.mapping, o.pe), (mapping(CpuUnit::Socket, None), Some(4)));
        let o = run("--map-by node:PE=2 ./a", &[]).unwrap();
        assert_eq!((o.mapping, o.map_by, o.pe), (None, MapBy::Node, Some(2)));
        for bad in ["ppr:0:socket", "ppr:2", "ppr:2:bogus", "core:PE=0", "core:span", "corez"] {
            assert!(run(&format!("--map-by {bad} ./a"), &[]).is_err(), "{bad}");
        }
    }

    #[test]
    fn gpu_options_fold_per_segment() {
        let o = run(
            "--gpus-per-rank 2 --gpu-share --gpu-bind map:3,1 ./a : --gpus-per-task 0 ./b",
            &[],
        )
        .unwrap();
        assert_eq!((o.gpus, o.segments[0].gpus, o.segments[1].gpus), (Some(2), Some(2), Some(0)));
        assert_eq!(o.gpu_bind, Some(Some(GpuBind::Map(vec![3, 1]))));
        assert!(o.gpu_share);
        assert_eq!(run("--gpu-bind none ./a", &[]).unwrap().gpu_bind, Some(None));
        assert_eq!(
            run("--gpu-bind map_gpu:0 ./a", &[]).unwrap().gpu_bind,
            Some(Some(GpuBind::Map(vec![0])))
        );
        assert!(run("--gpu-bind map: ./a", &[]).is_err());
        assert!(run("-gpus-per-proc x ./a", &[]).is_err());
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
