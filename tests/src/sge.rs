//! A real Grid Engine cluster on this machine for the tests: `tests/cluster/sge.sh` brings up
//! sge_qmaster on the head and one sge_execd per fake node `n1..nN` (network and UTS
//! namespaces), with a parallel environment `rl` whose jobs start tasks on their nodes with
//! `qrsh -inherit`; [`SgeCluster`] runs it and takes it down on drop. Needs root.
//!
//! ```text
//!   test ──SgeCluster::up(3)──► sge.sh up DIR 3 ──► sge_qmaster          (head, 10.215.0.1)
//!     │                                         └─► sge_execd in rlg-n1..rlg-n3 (n1..n3)
//!     └── cluster.run("qsub", ..) ── DIR/client qsub .. ──► a job on n1..n3
//! ```
//!
//! Every client runs through `DIR/client`, which gives it the cluster's environment and the
//! head's view of the names (the nodes resolve there; see sge.sh). Grid Engine passes none of
//! the submitter's environment on unless told: a test hands its run's tag to a job with
//! `-v RLAUNCH_TEST_TAG`, and rlaunch hands it on to the ranks. The proxies, which `qrsh
//! -inherit` starts with a fresh environment, carry no tag: [`SgeCluster::job_processes`]
//! finds them, and everything else on the nodes, by namespace.
//!
//! What it shares with Slurm's cluster (bringing it up and down, checking nothing is left) is
//! [`crate::scheduler`]'s; its names are bridge `rlgbr0`, namespaces `rlg-nI`, ports
//! 16444-16445.

use std::ffi::OsStr;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::AtomicBool;
use std::time::{Duration, Instant};

use crate::cluster::Script;
use crate::scheduler::{Flavor, SchedulerCluster};
use crate::{procfs, Run};

static SGE: Flavor =
    Flavor { script: Script("sge.sh"), name: "Grid Engine", prefix: "rlg", up: &UP };
static UP: AtomicBool = AtomicBool::new(false);

/// A process on one of the cluster's nodes that is not the node's execd: part of a job.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NodeProcess {
    pub pid: i32,
    pub comm: String,
    /// `n1`, `n2`, ...
    pub node: String,
}

/// A running cluster of fake nodes `n1..nN`; dropping it (or [`SgeCluster::down`]) stops every
/// daemon and job and removes its namespaces, bridge and `/etc/netns` files.
#[derive(Debug)]
pub struct SgeCluster(SchedulerCluster);

impl SgeCluster {
    /// Brings up `nodes` nodes (sge_qmaster, an sge_execd each) and returns once every node's
    /// queue instance is usable; panics with the script's report (the daemons' last log
    /// lines) if they do not come up.
    pub fn up(nodes: usize) -> SgeCluster {
        SgeCluster(SchedulerCluster::up(&SGE, nodes))
    }

    /// The directory holding SGE_ROOT, the spools and the daemons' logs.
    pub fn dir(&self) -> &Path {
        self.0.dir()
    }

    /// The node names, `n1..nN`.
    pub fn nodes(&self) -> Vec<String> {
        self.0.nodes()
    }

    /// The environment a Grid Engine client needs to talk to this cluster (`DIR/client` sets
    /// it by itself).
    pub fn env(&self) -> &[(String, String)] {
        self.0.env()
    }

    /// The daemons `up` started (sge_qmaster, one sge_execd per node) that still run.
    pub fn running_daemons(&self) -> Vec<(i32, String)> {
        self.0.running_daemons()
    }

    /// Takes the cluster down now and checks that nothing of it is left; panics naming what
    /// is.
    pub fn down(self) {
        self.0.down()
    }

    /// `DIR/client program`: a client run as the head runs it, with the cluster's environment
    /// and names, and without any Grid Engine variable the test itself may have inherited
    /// (from a real job it runs in, say).
    pub fn command(&self, program: impl AsRef<OsStr>) -> Command {
        let mut command = Command::new(self.client());
        for key in inherited_sge_vars() {
            command.env_remove(key);
        }
        command.arg(program);
        command
    }

    /// Like [`SgeCluster::command`], as a tagged [`Run`] with a timeout.
    pub fn run(&self, program: &str, args: &[&str]) -> Run {
        let run = Run::program(self.client(), &[program]).args(args);
        inherited_sge_vars().into_iter().fold(run, |run, key| run.env_remove(key))
    }

    fn client(&self) -> PathBuf {
        self.dir().join("client")
    }

    /// Every live process on the nodes (in their network namespaces) but the execds: the
    /// shepherds, `qrsh -inherit`'s tasks and whatever they started. Empty when no job runs.
    pub fn job_processes(&self) -> Vec<NodeProcess> {
        let daemons: Vec<i32> = self.running_daemons().into_iter().map(|(pid, _)| pid).collect();
        let namespaces: Vec<(String, (u64, u64))> = self
            .nodes()
            .into_iter()
            .filter_map(|node| {
                let meta = std::fs::metadata(format!("/run/netns/rlg-{node}")).ok()?;
                Some((node, (meta.dev(), meta.ino())))
            })
            .collect();
        let mut found = Vec::new();
        for pid in procfs::pids() {
            if daemons.contains(&pid) {
                continue;
            }
            let Ok(meta) = std::fs::metadata(format!("/proc/{pid}/ns/net")) else { continue };
            let Some((node, _)) = namespaces.iter().find(|(_, id)| *id == (meta.dev(), meta.ino()))
            else {
                continue;
            };
            if let Some(stat) = procfs::stat(pid).filter(|s| s.state != 'Z') {
                found.push(NodeProcess { pid, comm: stat.comm, node: node.clone() });
            }
        }
        found.sort_by_key(|p| p.pid);
        found
    }

    /// Waits until no job is known to the qmaster and no process of one is left on any node;
    /// returns what is still there after `timeout`.
    pub fn wait_idle(&self, timeout: Duration) -> Result<(), String> {
        let deadline = Instant::now() + timeout;
        loop {
            let jobs = self.command("qstat").args(["-u", "*"]).output();
            let jobs = match &jobs {
                Ok(out) if out.status.success() => {
                    String::from_utf8_lossy(&out.stdout).into_owned()
                }
                Ok(out) => format!("qstat failed: {}", String::from_utf8_lossy(&out.stderr)),
                Err(e) => format!("cannot run qstat: {e}"),
            };
            let left = self.job_processes();
            if jobs.trim().is_empty() && left.is_empty() {
                return Ok(());
            }
            if Instant::now() >= deadline {
                return Err(format!("jobs: {jobs:?}; processes on the nodes: {left:?}"));
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

/// The Grid Engine variables of the test's own environment: its cluster's, or a job's.
fn inherited_sge_vars() -> Vec<String> {
    const JOB_VARS: [&str; 4] = ["JOB_ID", "PE_HOSTFILE", "NSLOTS", "NHOSTS"];
    std::env::vars_os()
        .filter_map(|(k, _)| k.into_string().ok())
        .filter(|k| k.starts_with("SGE_") || JOB_VARS.contains(&k.as_str()))
        .collect()
}
