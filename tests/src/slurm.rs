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
//! The cluster's names (bridge `rlsbr0`, namespaces `rls-nI`) are global to the machine: a
//! test binary brings up one cluster and runs its Slurm scenarios one after another on it
//! (one `#[test]`, as `tests/tests/slurm.rs` does), so that the cluster's drop ends it.

use std::ffi::OsStr;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use crate::cluster::Script;
use crate::{procfs, Run, TempDir};

/// `tests/cluster/slurm.sh`.
const SCRIPT: Script = Script("slurm.sh");

/// A running cluster of fake nodes `n1..nN`; dropping it (or [`SlurmCluster::down`]) stops
/// every daemon and removes its namespaces, bridge and `/etc/netns` files.
#[derive(Debug)]
pub struct SlurmCluster {
    /// Config, state, spool and logs of every daemon; removed after the cluster is down.
    dir: TempDir,
    nodes: usize,
    /// What a client needs (`SLURM_CONF=...`), from `DIR/env`.
    env: Vec<(String, String)>,
    /// Set once `slurm.sh down` has run, so that drop does not run it again.
    down: bool,
}

impl SlurmCluster {
    /// Brings up `nodes` nodes and returns once `sinfo` shows them all idle; panics with the
    /// script's report (the daemons' last log lines) if they do not come up.
    pub fn up(nodes: usize) -> SlurmCluster {
        assert!(
            nix::unistd::geteuid().is_root(),
            "the Slurm tests need root to make network namespaces and run Slurm's daemons"
        );
        // The one piece of process-wide state here: the names are global, so a second cluster
        // (a second #[test] in the same binary, on a parallel thread) could only fail later
        // and more confusingly, on "interface rlsbr0 already exists".
        assert!(
            !UP.swap(true, Ordering::SeqCst),
            "one SlurmCluster per test process: run every Slurm scenario in one #[test]"
        );
        let dir = crate::tempdir();
        let out = SCRIPT.run("up", dir.path(), &[nodes.to_string()]);
        // From here on a drop takes down whatever `up` left, even after a failure.
        let mut cluster = SlurmCluster { dir, nodes, env: Vec::new(), down: false };
        assert!(
            out.status.success(),
            "error: Slurm cluster did not come up ({}):\n{}",
            out.status,
            String::from_utf8_lossy(&out.stderr)
        );
        let env = std::fs::read_to_string(cluster.dir.join("env"))
            .unwrap_or_else(|e| panic!("error: cannot read the cluster's env file: {e}"));
        cluster.env = parse_env(&env);
        cluster
    }

    /// The directory holding `slurm.conf`, the daemons' state and their logs.
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// The node names, `n1..nN`.
    pub fn nodes(&self) -> Vec<String> {
        (1..=self.nodes).map(|i| format!("n{i}")).collect()
    }

    /// The environment a Slurm client (`srun`, `salloc`, ...) needs to talk to this cluster.
    pub fn env(&self) -> &[(String, String)] {
        &self.env
    }

    /// `program` with the client environment, and without any `SLURM_*` variable the test
    /// itself may have inherited (from a real allocation it runs in, say).
    pub fn command(&self, program: impl AsRef<OsStr>) -> Command {
        let mut command = Command::new(program);
        for key in inherited_slurm_vars() {
            command.env_remove(key);
        }
        command.envs(self.env.iter().map(|(k, v)| (k, v)));
        command
    }

    /// Like [`SlurmCluster::command`], as a tagged [`Run`] with a timeout: every process of
    /// the job, on every node, carries the run's tag (Slurm passes the environment on).
    pub fn run(&self, program: impl Into<PathBuf>, args: &[&str]) -> Run {
        let mut run = Run::program(program, args);
        for key in inherited_slurm_vars() {
            run = run.env_remove(key);
        }
        self.env.iter().fold(run, |run, (k, v)| run.env(k, v))
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

    /// The daemons `up` started (munged, slurmctld, one slurmd per node) that still run.
    pub fn running_daemons(&self) -> Vec<(i32, String)> {
        let pids = std::fs::read_to_string(self.dir.join("pids")).unwrap_or_default();
        parse_pids(&pids)
            .into_iter()
            .filter(|(pid, _)| procfs::stat(*pid).is_some_and(|s| s.state != 'Z'))
            .collect()
    }

    /// Takes the cluster down now and checks that nothing of it is left: no daemon, namespace,
    /// bridge or `/etc/netns` entry. Panics naming what is.
    pub fn down(mut self) {
        let daemons = self.running_daemons();
        self.stop();
        let mut left: Vec<String> = daemons
            .into_iter()
            .filter(|(pid, _)| procfs::stat(*pid).is_some_and(|s| s.state != 'Z'))
            .map(|(pid, name)| format!("{name} (pid {pid})"))
            .collect();
        for i in 1..=self.nodes {
            for path in [format!("/run/netns/rls-n{i}"), format!("/etc/netns/rls-n{i}")] {
                if Path::new(&path).exists() {
                    left.push(path);
                }
            }
            if Path::new(&format!("/sys/class/net/rlsv-n{i}")).exists() {
                left.push(format!("interface rlsv-n{i}"));
            }
        }
        if Path::new("/sys/class/net/rlsbr0").exists() {
            left.push("interface rlsbr0".into());
        }
        assert!(left.is_empty(), "left after the Slurm cluster went down: {}", left.join(", "));
    }

    fn stop(&mut self) {
        if std::mem::replace(&mut self.down, true) {
            return;
        }
        // Another cluster may come up once this one is gone, whatever `down` reports.
        let _up = ResetOnDrop;
        SCRIPT.down(self.dir.path(), "Slurm");
    }
}

impl Drop for SlurmCluster {
    fn drop(&mut self) {
        self.stop();
    }
}

/// Whether this process has a [`SlurmCluster`] up.
static UP: AtomicBool = AtomicBool::new(false);

/// Clears [`UP`] when `slurm.sh down` has run (or panicked).
struct ResetOnDrop;

impl Drop for ResetOnDrop {
    fn drop(&mut self) {
        UP.store(false, Ordering::SeqCst);
    }
}

/// The `SLURM_*` variables of the test's own environment.
fn inherited_slurm_vars() -> Vec<String> {
    std::env::vars_os()
        .filter_map(|(k, _)| k.into_string().ok())
        .filter(|k| k.starts_with("SLURM_"))
        .collect()
}

/// `KEY=VALUE` lines.
fn parse_env(text: &str) -> Vec<(String, String)> {
    text.lines()
        .filter_map(|l| l.split_once('='))
        .map(|(k, v)| (k.to_owned(), v.to_owned()))
        .collect()
}

/// `PID NAME LOG` lines of `DIR/pids`.
fn parse_pids(text: &str) -> Vec<(i32, String)> {
    text.lines()
        .filter_map(|l| {
            let mut words = l.split(' ');
            Some((words.next()?.parse().ok()?, words.next()?.to_owned()))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn env_and_pid_files_parse() {
        assert_eq!(
            parse_env("SLURM_CONF=/d/slurm.conf\n"),
            [("SLURM_CONF".into(), "/d/slurm.conf".into())]
        );
        assert_eq!(
            parse_pids("12 munged /d/munge/munged.log\n13 slurmd-n1 /d/n1/slurmd.log\nbad\n"),
            [(12, "munged".into()), (13, "slurmd-n1".into())]
        );
    }
}
