//! A real Slurm cluster on this machine for the tests: `tests/cluster/slurm.sh` brings up a
//! private munged and slurmctld on the head and one slurmd per fake node `n1..nN` (network
//! and UTS namespaces); [`SlurmCluster`] runs it and takes it down on drop. Needs root.
//!
//! ```text
//!   test ──SlurmCluster::up(3)──► slurm.sh up DIR 3 ──► munged, slurmctld   (head, 10.214.0.1)
//!     │                                             └─► slurmd -D in rls-n1..rls-n3 (n1..n3)
//!     └── cluster.run("srun", ..) ── SLURM_CONF=DIR/slurm.conf ──► a job on n1..n3
//! ```
//!
//! What it shares with Grid Engine's cluster (bringing it up and down, checking nothing is
//! left) is [`crate::scheduler`]'s; its names are bridge `rlsbr0`, namespaces `rls-nI`.

use std::ffi::OsStr;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::AtomicBool;
use std::time::{Duration, Instant};

use crate::cluster::Script;
use crate::scheduler::{Flavor, SchedulerCluster};
use crate::Run;

static SLURM: Flavor = Flavor { script: Script("slurm.sh"), name: "Slurm", prefix: "rls", up: &UP };
static UP: AtomicBool = AtomicBool::new(false);

/// A running cluster of fake nodes `n1..nN`; dropping it (or [`SlurmCluster::down`]) stops
/// every daemon and removes its namespaces, bridge and `/etc/netns` files.
#[derive(Debug)]
pub struct SlurmCluster(SchedulerCluster);

impl SlurmCluster {
    /// Brings up `nodes` nodes (munged, slurmctld, a slurmd each); panics with the script's
    /// report (the daemons' last log lines) if they do not come up.
    pub fn up(nodes: usize) -> SlurmCluster {
        SlurmCluster(SchedulerCluster::up(&SLURM, nodes))
    }

    /// The directory holding `slurm.conf`, the daemons' state and their logs.
    pub fn dir(&self) -> &Path {
        self.0.dir()
    }

    /// The node names, `n1..nN`.
    pub fn nodes(&self) -> Vec<String> {
        self.0.nodes()
    }

    /// The environment a Slurm client (`srun`, `salloc`, ...) needs to talk to this cluster.
    pub fn env(&self) -> &[(String, String)] {
        self.0.env()
    }

    /// What [`SlurmCluster::env`] gives, for a cluster another process brought up in `dir`.
    pub fn env_in(dir: &Path) -> std::io::Result<Vec<(String, String)>> {
        Ok(crate::scheduler::parse_env(&std::fs::read_to_string(dir.join("env"))?))
    }

    /// The daemons `up` started (munged, slurmctld, one slurmd per node) that still run.
    pub fn running_daemons(&self) -> Vec<(i32, String)> {
        self.0.running_daemons()
    }

    /// Takes the cluster down now and checks that nothing of it is left; panics naming what
    /// is.
    pub fn down(self) {
        self.0.down()
    }

    /// `program` with the client environment, and without any `SLURM_*` variable the test
    /// itself may have inherited (from a real allocation it runs in, say).
    pub fn command(&self, program: impl AsRef<OsStr>) -> Command {
        let mut command = Command::new(program);
        for key in inherited_slurm_vars() {
            command.env_remove(key);
        }
        command.envs(self.env().iter().map(|(k, v)| (k, v)));
        command
    }

    /// Like [`SlurmCluster::command`], as a tagged [`Run`] with a timeout: every process of
    /// the job, on every node, carries the run's tag (Slurm passes the environment on).
    pub fn run(&self, program: impl Into<PathBuf>, args: &[&str]) -> Run {
        let mut run = Run::program(program, args);
        for key in inherited_slurm_vars() {
            run = run.env_remove(key);
        }
        self.env().iter().fold(run, |run, (k, v)| run.env(k, v))
    }

    /// Waits until `sinfo` shows every node idle: nodes stay `completing` for a moment after
    /// a job ends, and a job submitted meanwhile may wait seconds for the next scheduling
    /// pass. Panics with what `sinfo` says after `timeout`.
    pub fn wait_idle(&self, timeout: Duration) {
        let want: Vec<String> = self.nodes().iter().map(|n| format!("{n} idle")).collect();
        let deadline = Instant::now() + timeout;
        loop {
            let out = self.command("sinfo").args(["-h", "-N", "-o", "%N %T"]).output();
            let states = match &out {
                Ok(out) => String::from_utf8_lossy(&out.stdout).into_owned(),
                Err(e) => panic!("error: cannot run sinfo: {e}"),
            };
            let mut lines: Vec<String> = states.lines().map(str::to_owned).collect();
            lines.sort();
            lines.dedup();
            if lines == want {
                return;
            }
            assert!(Instant::now() < deadline, "nodes not idle after {timeout:?}: {states}");
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

/// The `SLURM_*` variables of the test's own environment.
fn inherited_slurm_vars() -> Vec<String> {
    std::env::vars_os()
        .filter_map(|(k, _)| k.into_string().ok())
        .filter(|k| k.starts_with("SLURM_"))
        .collect()
}
