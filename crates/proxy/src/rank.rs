//! One rank: how it is started, and the task that feeds its stdin (its output goes through
//! [`crate::outputs`]).

use rlaunch_protocol::ids::Gid;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::sync::Arc;

use nix::fcntl::OFlag;
use nix::sched::CpuSet;
use nix::sys::socket::{socketpair, AddressFamily, SockFlag, SockType};
use nix::sys::stat::Mode;
use nix::unistd::pipe2;
use rlaunch_protocol::control::{Job, Segment, Up};
use rlaunch_protocol::ids::ExitOutcome;
use tokio::io::AsyncWriteExt;
use tokio::sync::mpsc;

pub use crate::spawn::Program;
use crate::spawn::Spawn;
use rlaunch_tree::fdio::FdStream;

/// Where a rank sits, for its environment.
pub struct Placement<'a> {
    pub rank: u32,
    pub local_id: usize,
    pub local_count: usize,
    pub host: &'a str,
    /// Its node among its job's nodes (torchrun's group), and how many nodes its job has.
    pub node_id: u32,
    pub nodes: u32,
    /// Where it may write why it failed (`TORCHELASTIC_ERROR_FILE`).
    pub error_file: Option<String>,
    /// Where this node lists the ranks that failed while the job goes on
    /// (`RLAUNCH_DEAD_RANKS_FILE`, `--on-failure continue`).
    pub dead_file: Option<String>,
    /// Its GPU visibility variables (`CUDA_VISIBLE_DEVICES`, ...), if its job has GPUs.
    pub gpu_vars: Vec<(&'static str, String)>,
    /// It leads a session of its own: where the node's ranks are no more than its CPUs
    /// (see [`Spawn::own_session`]).
    pub own_session: bool,
}

/// How a rank reaches its PMI server.
pub enum PmiSetup {
    /// A socketpair; the rank inherits its end as `PMI_FD`.
    Fd,
    /// The proxy's loopback listener: `PMI_PORT` and `PMI_ID`.
    Port(String),
}

/// A rank that is running.
pub struct Started {
    pub pid: i32,
    /// The proxy's end of the rank's PMI socketpair.
    pub pmi: Option<FdStream>,
    /// Output pipes, for [`crate::outputs`] (not registered with the runtime).
    pub stdout: OwnedFd,
    pub stderr: OwnedFd,
    pub stdin: Option<FdStream>,
}

/// Variables every rank gets its own value of. The program's shared environment leaves them
/// out, so [`spawn`] must set only these (a name set twice in an environment is read from
/// its first occurrence, which would be the inherited one).
pub const RANK_VARS: &[&str] = &[
    "PMI_RANK",
    "PMI_SIZE",
    "PMI_FD",
    "PMI_PORT",
    "PMI_ID",
    "MPI_LOCALRANKID",
    "MPI_LOCALNRANKS",
    // The other local-rank spellings wrapper scripts read (Cray's PMI, Open MPI's mpirun).
    "PMI_LOCAL_RANK",
    "PMI_LOCAL_SIZE",
    "OMPI_COMM_WORLD_LOCAL_RANK",
    "OMPI_COMM_WORLD_LOCAL_SIZE",
    "MPIR_CVAR_CH3_INTERFACE_HOSTNAME",
    "GFORTRAN_UNBUFFERED_PRECONNECTED",
    // torchrun's contract (torch.distributed's env://, Lightning, Accelerate, DeepSpeed).
    "RANK",
    "WORLD_SIZE",
    "LOCAL_RANK",
    "LOCAL_WORLD_SIZE",
    "GROUP_RANK",
    "GROUP_WORLD_SIZE",
    "ROLE_RANK",
    "ROLE_WORLD_SIZE",
    "ROLE_NAME",
    "TORCHELASTIC_RUN_ID",
    "TORCHELASTIC_RESTART_COUNT",
    "TORCHELASTIC_MAX_RESTARTS",
    "TORCHELASTIC_ERROR_FILE",
    // Which attempt of the job this is (`--max-restarts`), as rlaunch spells it.
    "RLAUNCH_RESTART_COUNT",
    "RLAUNCH_DEAD_RANKS_FILE",
];

/// Set per rank only when the job has a rendezvous: otherwise what the user's environment
/// says reaches the ranks (a rendezvous of their own).
const RENDEZVOUS_VARS: &[&str] = &["MASTER_ADDR", "MASTER_PORT", "JAX_COORDINATOR_ADDRESS"];

/// Set per rank only with `--tracker rabit`: otherwise a tracker the user started beside
/// rlaunch (its `DMLC_*` exported) reaches the ranks.
const TRACKER_VARS: &[&str] = &[
    "DMLC_TRACKER_URI",
    "DMLC_TRACKER_PORT",
    "DMLC_TASK_ID",
    "DMLC_NUM_WORKER",
    "DMLC_ROLE",
    "DMLC_NUM_SERVER",
];

/// Set per rank only inside a Slurm allocation (rlaunch's own step's values would be wrong
/// for every rank but one).
const SLURM_VARS: &[&str] = &[
    "SLURM_PROCID",
    "SLURM_LOCALID",
    "SLURM_NODEID",
    "SLURM_NTASKS",
    "SLURM_NPROCS",
    "SLURM_STEP_NUM_TASKS",
    "SLURM_STEP_NUM_NODES",
    "SLURM_STEP_NODELIST",
];

/// Every variable `job`'s ranks get their own value of.
pub fn rank_vars(job: &Job) -> Vec<&'static str> {
    let mut vars = RANK_VARS.to_vec();
    if job.rendezvous.is_some() {
        vars.extend(RENDEZVOUS_VARS);
    }
    if job.tracker.is_some() {
        vars.extend(TRACKER_VARS);
    }
    if job.slurm_nodes.is_some() {
        vars.extend(SLURM_VARS);
    }
    if job.gpus.is_some() {
        vars.extend(rlaunch_topology::gpu::VARS);
    }
    vars
}

/// Prepares a segment's program for its ranks: the program found on the ranks' PATH, their
/// shared environment, their working directory checked.
pub fn program(job: &Job, segment: &Segment) -> Result<Program, ExitOutcome> {
    Program::new(job, segment, &rank_vars(job))
}

/// A rank ready to start: its pipes and socketpair made, its environment set.
pub struct Prepared {
    spawn: Spawn,
    fds: RankFds,
}

/// A prepared rank's descriptors: the child's ends, closed once it has started, and ours.
struct RankFds {
    theirs: [OwnedFd; 3],
    pmi: Option<(OwnedFd, OwnedFd)>,
    stdout: OwnedFd,
    /// What to enlarge `stdout` to ([`rlaunch_tree::fdio::rank_pipe_capacity`]).
    stdout_capacity: i32,
    stderr: OwnedFd,
    stdin: Option<OwnedFd>,
}

/// Prepares one rank of `program`: piped stdout/stderr and, if it reads the launcher's stdin,
/// a piped stdin (else /dev/null), its PMI channel, its variables, bound to `cpus` if given.
/// [`start_all`] starts it. Returns why if it cannot run.
pub fn prepare(
    program: Arc<Program>,
    job: &Job,
    at: &Placement,
    gets_stdin: bool,
    pmi: &PmiSetup,
    cpus: Option<&CpuSet>,
    front_env: Vec<Vec<u8>>,
) -> Result<Prepared, ExitOutcome> {
    let pipe = || pipe2(OFlag::O_CLOEXEC).map_err(failed);
    let (stdout, stdout_w) = pipe()?;
    let (stderr, stderr_w) = pipe()?;
    let (stdin, stdin_r) = if gets_stdin {
        let (r, w) = pipe()?;
        (Some(w), r)
    } else {
        let null = nix::fcntl::open("/dev/null", OFlag::O_RDONLY | OFlag::O_CLOEXEC, Mode::empty())
            .map_err(failed)?;
        // SAFETY: a descriptor just opened and owned by nothing else.
        (None, unsafe { OwnedFd::from_raw_fd(null) })
    };
    let mut env = vars(job, at);
    // Both ends close on exec; the child clears the flag on its own end only, so each rank
    // inherits exactly one PMI socket: its own.
    let pair = match pmi {
        PmiSetup::Fd => {
            let (ours, theirs) =
                socketpair(AddressFamily::Unix, SockType::Stream, None, SockFlag::SOCK_CLOEXEC)
                    .map_err(failed)?;
            env.push(("PMI_FD", theirs.as_raw_fd().to_string()));
            Some((ours, theirs))
        }
        PmiSetup::Port(addr) => {
            env.push(("PMI_PORT", addr.clone()));
            env.push(("PMI_ID", at.rank.to_string()));
            None
        }
    };
    debug_assert!(env.iter().all(|(name, _)| rank_vars(job).contains(name)), "{env:?}");
    let spawn = Spawn {
        program,
        env,
        stdin: stdin_r.as_raw_fd(),
        stdout: stdout_w.as_raw_fd(),
        stderr: stderr_w.as_raw_fd(),
        keep: pair.as_ref().map(|(_, theirs)| theirs.as_raw_fd()),
        cpus: cpus.copied(),
        own_session: at.own_session,
        front_env: front_env.into_iter().filter_map(|v| std::ffi::CString::new(v).ok()).collect(),
    };
    let theirs = [stdin_r, stdout_w, stderr_w];
    let stdout_capacity = rlaunch_tree::fdio::rank_pipe_capacity(at.local_count);
    let fds = RankFds { theirs, pmi: pair, stdout, stdout_capacity, stderr, stdin };
    Ok(Prepared { spawn, fds })
}

/// The variables a rank at `at` gets besides those of its PMI channel: its place, as MPICH's
/// and the frameworks' programs read it.
pub fn vars(job: &Job, at: &Placement) -> Vec<(&'static str, String)> {
    let mut env = vec![
        ("PMI_RANK", at.rank.to_string()),
        ("PMI_SIZE", job.size.to_string()),
        ("MPI_LOCALRANKID", at.local_id.to_string()),
        ("MPI_LOCALNRANKS", at.local_count.to_string()),
        ("PMI_LOCAL_RANK", at.local_id.to_string()),
        ("PMI_LOCAL_SIZE", at.local_count.to_string()),
        ("OMPI_COMM_WORLD_LOCAL_RANK", at.local_id.to_string()),
        ("OMPI_COMM_WORLD_LOCAL_SIZE", at.local_count.to_string()),
        ("MPIR_CVAR_CH3_INTERFACE_HOSTNAME", at.host.to_string()),
        ("GFORTRAN_UNBUFFERED_PRECONNECTED", "y".to_string()),
    ];
    framework_vars(job, at, &mut env);
    env.extend(at.gpu_vars.iter().cloned());
    env
}

/// What the frameworks read, as torchrun sets it for one role of `job.size` workers: a rank's
/// place, which attempt this is, and where rank 0 serves their rendezvous (if it has one).
fn framework_vars(job: &Job, at: &Placement, env: &mut Vec<(&'static str, String)>) {
    let (rank, size) = (at.rank.to_string(), job.size.to_string());
    env.extend([
        ("RANK", rank.clone()),
        ("WORLD_SIZE", size.clone()),
        ("LOCAL_RANK", at.local_id.to_string()),
        ("LOCAL_WORLD_SIZE", at.local_count.to_string()),
        ("GROUP_RANK", at.node_id.to_string()),
        ("GROUP_WORLD_SIZE", at.nodes.to_string()),
        ("ROLE_RANK", rank),
        ("ROLE_WORLD_SIZE", size),
        ("ROLE_NAME", "default".to_string()),
        ("TORCHELASTIC_RUN_ID", job.jobid.clone()),
        ("TORCHELASTIC_RESTART_COUNT", job.restart.to_string()),
        ("TORCHELASTIC_MAX_RESTARTS", job.max_restarts.to_string()),
        ("RLAUNCH_RESTART_COUNT", job.restart.to_string()),
    ]);
    if let Some(path) = &at.error_file {
        env.push(("TORCHELASTIC_ERROR_FILE", path.clone()));
    }
    if let Some(path) = &at.dead_file {
        env.push(("RLAUNCH_DEAD_RANKS_FILE", path.clone()));
    }
    if let Some(r) = &job.rendezvous {
        env.push(("MASTER_ADDR", r.addr.clone()));
        env.push(("MASTER_PORT", r.port.to_string()));
        // An IPv6 address is bracketed before its port, as gRPC reads it.
        let host = if r.addr.contains(':') { format!("[{}]", r.addr) } else { r.addr.clone() };
        env.push(("JAX_COORDINATOR_ADDRESS", format!("{host}:{}", r.jax_port)));
    }
    if let Some(nodes) = &job.slurm_nodes {
        let size = job.size.to_string();
        env.extend([
            ("SLURM_PROCID", at.rank.to_string()),
            ("SLURM_LOCALID", at.local_id.to_string()),
            ("SLURM_NODEID", at.node_id.to_string()),
            ("SLURM_NTASKS", size.clone()),
            ("SLURM_NPROCS", size.clone()),
            ("SLURM_STEP_NUM_TASKS", size),
            ("SLURM_STEP_NUM_NODES", at.nodes.to_string()),
            ("SLURM_STEP_NODELIST", nodes.clone()),
        ]);
    }
    if let Some((addr, port)) = &job.tracker {
        env.extend([
            ("DMLC_TRACKER_URI", addr.clone()),
            ("DMLC_TRACKER_PORT", port.to_string()),
            // Its rabit rank is its rank: data sharded by rank means the same everywhere.
            ("DMLC_TASK_ID", at.rank.to_string()),
            ("DMLC_NUM_WORKER", job.size.to_string()),
            ("DMLC_ROLE", "worker".to_string()),
            ("DMLC_NUM_SERVER", "0".to_string()),
        ]);
    }
}

/// The directory of the user's ranks' error files (`TORCHELASTIC_ERROR_FILE`),
/// `$TMPDIR/rlaunch-errors.<uid>`: made once and kept (making and removing one per job
/// cost a tenth of a one-rank launch on a slow /tmp), the user's alone; `None` if it cannot
/// be. A rank's file is named after its job and id, read and removed if the rank fails.
pub fn error_dir() -> Option<std::path::PathBuf> {
    use std::os::unix::fs::{DirBuilderExt, MetadataExt};
    let uid = nix::unistd::getuid().as_raw();
    let dir = std::env::temp_dir().join(format!("rlaunch-errors.{uid}"));
    let ours = |dir: &std::path::Path| {
        std::fs::symlink_metadata(dir)
            .is_ok_and(|m| m.is_dir() && m.uid() == uid && m.mode() & 0o022 == 0)
    };
    if !ours(&dir) {
        if let Err(e) = std::fs::DirBuilder::new().mode(0o700).create(&dir) {
            if e.kind() != io::ErrorKind::AlreadyExists {
                tracing::debug!(dir = %dir.display(), "no directory for error files: {e}");
                return None;
            }
        }
        if !ours(&dir) {
            tracing::debug!(dir = %dir.display(), "not this user's alone: no error files");
            return None;
        }
    }
    Some(dir)
}

/// The file in `dir` where node `node` of job `jobid` lists the ranks that failed while the
/// job goes on (`--on-failure continue`).
pub fn dead_file(
    dir: &std::path::Path,
    jobid: &str,
    node: rlaunch_protocol::ids::NodeId,
) -> std::path::PathBuf {
    dir.join(format!("{jobid}.{node}.dead"))
}

/// The error file of the rank with global id `gid` of job `jobid`, in `dir`.
pub fn error_file(dir: &std::path::Path, jobid: &str, gid: Gid) -> std::path::PathBuf {
    dir.join(format!("{jobid}.{gid}.json"))
}

/// What a rank wrote in its error file, at most [`rlaunch_protocol::control::MAX_ERROR_REPORT`]
/// bytes, the file removed; `None` if it wrote nothing.
pub fn error_report(dir: &std::path::Path, jobid: &str, gid: Gid) -> Option<Vec<u8>> {
    use std::io::Read;
    let path = error_file(dir, jobid, gid);
    let file = std::fs::File::open(&path).ok()?;
    let _ = std::fs::remove_file(&path);
    let mut report = Vec::new();
    let limit = rlaunch_protocol::control::MAX_ERROR_REPORT as u64;
    file.take(limit).read_to_end(&mut report).ok()?;
    (!report.is_empty()).then_some(report)
}

/// Starts prepared ranks, each in its own process group, several at a time (see
/// [`crate::spawn::start_all`]); the results come in the same order.
pub(crate) fn start_all(
    batch: Vec<Result<Prepared, ExitOutcome>>,
    spawner: &mut dyn crate::spawn::Spawner,
) -> Vec<Result<Started, ExitOutcome>> {
    let mut spawns = Vec::new();
    let fds: Vec<_> = batch
        .into_iter()
        .map(|p| {
            p.map(|p| {
                spawns.push(p.spawn);
                p.fds
            })
        })
        .collect();
    let mut pids = spawner.start_all(spawns).into_iter();
    fds.into_iter()
        .map(|fds| {
            let fds = fds?;
            let pid = pids.next().expect("a pid for every spawn")?;
            fds.adopt(pid)
        })
        .collect()
}

impl RankFds {
    /// The rank `pid` has our ends now; the child's are the child's.
    fn adopt(self, pid: i32) -> Result<Started, ExitOutcome> {
        drop(self.theirs);
        let wrap = |fd: OwnedFd| FdStream::new(fd).map_err(|e| failed(errno_of(&e)));
        Ok(Started {
            pid,
            pmi: self.pmi.map(|(ours, _theirs)| wrap(ours)).transpose()?,
            stdout: enlarged(self.stdout, self.stdout_capacity),
            stderr: self.stderr,
            stdin: self.stdin.map(wrap).transpose()?,
        })
    }
}

fn failed(e: nix::errno::Errno) -> ExitOutcome {
    ExitOutcome::SpawnFailed { errno: e as i32 }
}

fn errno_of(e: &io::Error) -> nix::errno::Errno {
    nix::errno::Errno::from_raw(e.raw_os_error().unwrap_or(nix::libc::EIO))
}

fn enlarged(fd: OwnedFd, capacity: i32) -> OwnedFd {
    rlaunch_tree::fdio::enlarge_pipe(&fd, capacity);
    fd
}

/// What the dispatcher sends a rank's stdin feeder.
#[derive(Debug)]
pub enum StdinChunk {
    Data { seq: u64, data: Arc<[u8]> },
    Eof,
}

/// Writes the launcher's stdin into one rank, acknowledging each chunk once written (or
/// dropped, when the rank has closed its stdin) so the launcher can send more.
pub async fn feed_stdin(
    mut fd: Option<FdStream>,
    mut chunks: mpsc::UnboundedReceiver<StdinChunk>,
    acks: mpsc::UnboundedSender<Up>,
    node: rlaunch_protocol::ids::NodeId,
) {
    while let Some(chunk) = chunks.recv().await {
        match chunk {
            StdinChunk::Data { seq, data } => {
                if let Some(f) = fd.as_mut() {
                    if let Err(e) = f.write_all(&data).await {
                        tracing::debug!("rank stopped reading stdin: {e}");
                        fd = None;
                    }
                }
                let _ = acks.send(Up::StdinAck { seq, node });
            }
            StdinChunk::Eof => fd = None,
        }
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use rlaunch_protocol::control::Rendezvous;

    use super::*;

    fn job(size: u32) -> Job {
        let mut job = Job::simple("rlaunch_1_ab", size, Vec::new());
        job.nodes = 3;
        job
    }

    fn at(rank: u32, local_id: usize, local_count: usize, node_id: u32) -> Placement<'static> {
        let host = "n2";
        Placement {
            rank,
            local_id,
            local_count,
            host,
            node_id,
            nodes: 3,
            error_file: None,
            dead_file: None,
            gpu_vars: Vec::new(),
            own_session: false,
        }
    }

    fn vars_of(job: &Job, at: &Placement) -> BTreeMap<&'static str, String> {
        let vars = vars(job, at);
        let map: BTreeMap<_, _> = vars.iter().cloned().collect();
        assert_eq!(map.len(), vars.len(), "a name set twice: {vars:?}");
        assert!(map.keys().all(|name| rank_vars(job).contains(name)), "{vars:?}");
        map
    }

    #[test]
    fn a_rank_gets_its_place_as_every_contract_spells_it() {
        // Rank 5 of 7 (an MPMD segment's rank is its rank in the whole job), second of two on
        // the second of three nodes.
        let got = vars_of(&job(7), &at(5, 1, 2, 1));
        let want = [
            ("PMI_RANK", "5"),
            ("PMI_SIZE", "7"),
            ("MPI_LOCALRANKID", "1"),
            ("MPI_LOCALNRANKS", "2"),
            ("PMI_LOCAL_RANK", "1"),
            ("PMI_LOCAL_SIZE", "2"),
            ("OMPI_COMM_WORLD_LOCAL_RANK", "1"),
            ("OMPI_COMM_WORLD_LOCAL_SIZE", "2"),
            ("MPIR_CVAR_CH3_INTERFACE_HOSTNAME", "n2"),
            ("GFORTRAN_UNBUFFERED_PRECONNECTED", "y"),
            ("RANK", "5"),
            ("WORLD_SIZE", "7"),
            ("LOCAL_RANK", "1"),
            ("LOCAL_WORLD_SIZE", "2"),
            ("GROUP_RANK", "1"),
            ("GROUP_WORLD_SIZE", "3"),
            ("ROLE_RANK", "5"),
            ("ROLE_WORLD_SIZE", "7"),
            ("ROLE_NAME", "default"),
            ("TORCHELASTIC_RUN_ID", "rlaunch_1_ab"),
            ("TORCHELASTIC_RESTART_COUNT", "0"),
            ("TORCHELASTIC_MAX_RESTARTS", "0"),
            ("RLAUNCH_RESTART_COUNT", "0"),
        ];
        let want: BTreeMap<_, _> = want.iter().map(|&(k, v)| (k, v.to_string())).collect();
        // No rendezvous, tracker, step or error file: none of their variables.
        assert_eq!(got, want);
    }

    #[test]
    fn the_jobs_services_add_their_variables() {
        let mut job = job(4);
        job.rendezvous = Some(Rendezvous { addr: "fd00::7".into(), port: 4100, jax_port: 4101 });
        job.tracker = Some(("10.0.0.1".into(), 9091));
        job.slurm_nodes = Some("a,b,c".into());
        let mut place = at(2, 0, 1, 2);
        place.error_file = Some("/tmp/e/rlaunch_1_ab.2.json".into());
        let got = vars_of(&job, &place);
        let want = [
            ("MASTER_ADDR", "fd00::7"),
            ("MASTER_PORT", "4100"),
            // IPv6 bracketed before the port, as gRPC reads it.
            ("JAX_COORDINATOR_ADDRESS", "[fd00::7]:4101"),
            ("TORCHELASTIC_ERROR_FILE", "/tmp/e/rlaunch_1_ab.2.json"),
            ("DMLC_TRACKER_URI", "10.0.0.1"),
            ("DMLC_TRACKER_PORT", "9091"),
            ("DMLC_TASK_ID", "2"),
            ("DMLC_NUM_WORKER", "4"),
            ("DMLC_ROLE", "worker"),
            ("DMLC_NUM_SERVER", "0"),
            ("SLURM_PROCID", "2"),
            ("SLURM_LOCALID", "0"),
            ("SLURM_NODEID", "2"),
            ("SLURM_NTASKS", "4"),
            ("SLURM_NPROCS", "4"),
            ("SLURM_STEP_NUM_TASKS", "4"),
            ("SLURM_STEP_NUM_NODES", "3"),
            ("SLURM_STEP_NODELIST", "a,b,c"),
        ];
        for (name, value) in want {
            assert_eq!(got.get(name).map(String::as_str), Some(value), "{name}");
        }
        // An IPv4 rendezvous is not bracketed.
        job.rendezvous = Some(Rendezvous { addr: "10.1.2.3".into(), port: 1, jax_port: 2 });
        assert_eq!(vars_of(&job, &place)["JAX_COORDINATOR_ADDRESS"], "10.1.2.3:2");
    }
}
