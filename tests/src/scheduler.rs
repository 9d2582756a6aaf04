//! What the tests' scheduler clusters share: a script of `tests/cluster/` brings up the
//! scheduler's daemons on the head and one per fake node `n1..nN` (network and UTS
//! namespaces on a bridge of its own), and takes them down; [`SchedulerCluster`] runs the
//! script, reads the client environment and the daemons' pids it leaves in its directory,
//! and checks on the way down that nothing of the cluster is left. [`crate::slurm`] and
//! [`crate::sge`] add what differs: how a client is run and when the cluster is idle.
//!
//! A cluster's names (its bridge, namespaces and veths) are global to the machine: a test
//! binary brings up one cluster of a kind and runs its scenarios one after another on it (one
//! `#[test]`), so that the cluster's drop ends it.

use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};

use crate::cluster::Script;
use crate::{procfs, TempDir};

/// A kind of scheduler cluster: its script, its name in messages, and its names on the machine.
#[derive(Debug)]
pub(crate) struct Flavor {
    pub(crate) script: Script,
    /// "Slurm", "Grid Engine".
    pub(crate) name: &'static str,
    /// Its namespaces are `PREFIX-nI`, their veths `PREFIXv-nI`, its bridge `PREFIXbr0`.
    pub(crate) prefix: &'static str,
    /// Whether this process has such a cluster up.
    pub(crate) up: &'static AtomicBool,
}

/// A running cluster of fake nodes `n1..nN`; dropping it (or [`SchedulerCluster::down`]) stops
/// every daemon and removes its namespaces, bridge and `/etc/netns` files.
#[derive(Debug)]
pub(crate) struct SchedulerCluster {
    flavor: &'static Flavor,
    /// The daemons' configuration, state and logs; removed after the cluster is down.
    dir: TempDir,
    nodes: usize,
    /// What a client needs, from `DIR/env`.
    env: Vec<(String, String)>,
    /// Set once the script's `down` has run, so that drop does not run it again.
    down: bool,
}

impl SchedulerCluster {
    /// Brings up `nodes` nodes; panics with the script's report (the daemons' last log
    /// lines) if they do not come up.
    pub(crate) fn up(flavor: &'static Flavor, nodes: usize) -> SchedulerCluster {
        let name = flavor.name;
        assert!(
            nix::unistd::geteuid().is_root(),
            "the {name} tests need root to make network namespaces and run {name}'s daemons"
        );
        // The one piece of process-wide state here: the names are global, so a second
        // cluster (a second #[test] in the same binary, on a parallel thread) could only fail
        // later and more confusingly, on "interface ...br0 already exists".
        assert!(
            !flavor.up.swap(true, Ordering::SeqCst),
            "one {name} cluster per test process: run every {name} scenario in one #[test]"
        );
        let dir = crate::tempdir();
        let out = flavor.script.run("up", dir.path(), &[nodes.to_string()]);
        // From here on a drop takes down whatever `up` left, even after a failure.
        let mut cluster = SchedulerCluster { flavor, dir, nodes, env: Vec::new(), down: false };
        assert!(
            out.status.success(),
            "error: {name} cluster did not come up ({}):\n{}",
            out.status,
            String::from_utf8_lossy(&out.stderr)
        );
        let env = std::fs::read_to_string(cluster.dir.path().join("env"))
            .unwrap_or_else(|e| panic!("error: cannot read the cluster's env file: {e}"));
        cluster.env = parse_env(&env);
        cluster
    }

    /// The directory holding the daemons' configuration, state and logs.
    pub(crate) fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// The node names, `n1..nN`.
    pub(crate) fn nodes(&self) -> Vec<String> {
        (1..=self.nodes).map(|i| format!("n{i}")).collect()
    }

    /// The environment a client needs to talk to this cluster.
    pub(crate) fn env(&self) -> &[(String, String)] {
        &self.env
    }

    /// The daemons `up` started that still run.
    pub(crate) fn running_daemons(&self) -> Vec<(i32, String)> {
        let pids = std::fs::read_to_string(self.dir.path().join("pids")).unwrap_or_default();
        parse_pids(&pids).into_iter().filter(|(pid, _)| is_live(*pid)).collect()
    }

    /// Takes the cluster down now and checks that nothing of it is left: no daemon,
    /// namespace, bridge or `/etc/netns` entry. Panics naming what is.
    pub(crate) fn down(mut self) {
        let daemons = self.running_daemons();
        self.stop();
        let mut left: Vec<String> = daemons
            .into_iter()
            .filter(|(pid, _)| is_live(*pid))
            .map(|(pid, name)| format!("{name} (pid {pid})"))
            .collect();
        let prefix = self.flavor.prefix;
        for i in 1..=self.nodes {
            for path in [format!("/run/netns/{prefix}-n{i}"), format!("/etc/netns/{prefix}-n{i}")] {
                if Path::new(&path).exists() {
                    left.push(path);
                }
            }
            if Path::new(&format!("/sys/class/net/{prefix}v-n{i}")).exists() {
                left.push(format!("interface {prefix}v-n{i}"));
            }
        }
        if Path::new(&format!("/sys/class/net/{prefix}br0")).exists() {
            left.push(format!("interface {prefix}br0"));
        }
        let name = self.flavor.name;
        assert!(left.is_empty(), "left after the {name} cluster went down: {}", left.join(", "));
    }

    fn stop(&mut self) {
        if std::mem::replace(&mut self.down, true) {
            return;
        }
        // Another cluster may come up once this one is gone, whatever `down` reports.
        let _up = ResetOnDrop(self.flavor.up);
        self.flavor.script.down(self.dir.path(), self.flavor.name);
    }
}

impl Drop for SchedulerCluster {
    fn drop(&mut self) {
        self.stop();
    }
}

/// Clears a flavor's "up" flag when its script's `down` has run (or panicked).
struct ResetOnDrop(&'static AtomicBool);

impl Drop for ResetOnDrop {
    fn drop(&mut self) {
        self.0.store(false, Ordering::SeqCst);
    }
}

pub(crate) fn is_live(pid: i32) -> bool {
    procfs::stat(pid).is_some_and(|s| s.state != 'Z')
}

/// `KEY=VALUE` lines.
pub(crate) fn parse_env(text: &str) -> Vec<(String, String)> {
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
            parse_env("SLURM_CONF=/d/slurm.conf\nSGE_CELL=rl\n"),
            [("SLURM_CONF".into(), "/d/slurm.conf".into()), ("SGE_CELL".into(), "rl".into())]
        );
        assert_eq!(
            parse_pids("12 munged /d/munge/munged.log\n13 execd-n1 /d/execd/n1/messages\nbad\n"),
            [(12, "munged".into()), (13, "execd-n1".into())]
        );
    }
}
