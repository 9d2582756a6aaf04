//! A cluster of fake hosts reachable over real ssh: network namespaces, each with its own
//! sshd and host name (`tests/cluster/cluster.sh`). Needs root.
//!
//! [`Cluster::up`] brings it up; dropping the [`Cluster`] takes it down, on every path out.
//! The names it uses are global: one such cluster per machine at a time.

use std::path::{Path, PathBuf};
use std::process::Command;

use crate::{Run, TempDir};

pub struct Cluster {
    dir: TempDir,
}

fn script() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("cluster/cluster.sh")
}

impl Cluster {
    /// Nodes `n1..n<nodes>`; panics with the script's words if they do not come up.
    pub fn up(nodes: usize) -> Cluster {
        assert!(
            nix::unistd::geteuid().is_root(),
            "the multi-host tests need root to make network namespaces"
        );
        let dir = crate::tempdir();
        let out = Command::new("bash")
            .arg(script())
            .arg("up")
            .arg(dir.path())
            .arg(nodes.to_string())
            .output()
            .unwrap_or_else(|e| panic!("cannot run {}: {e}", script().display()));
        let cluster = Cluster { dir };
        assert!(
            out.status.success(),
            "cluster up failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        cluster
    }

    /// The script's per-node verbs: `link-down`, `link-up`, `stop-sshd`, `start-sshd`.
    pub fn ctl(&self, verb: &str, node: usize) {
        let out = Command::new("bash")
            .arg(script())
            .arg(verb)
            .arg(self.dir.path())
            .arg(node.to_string())
            .output()
            .unwrap_or_else(|e| panic!("cannot run {}: {e}", script().display()));
        assert!(
            out.status.success(),
            "cluster {verb} {node}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }

    /// The cluster's directory (see tests/cluster/README.md).
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// The ssh command line that reaches the nodes from here.
    pub fn ssh(&self) -> String {
        format!("ssh -F {}", self.dir.path().join("ssh_config").display())
    }

    /// The pids of the nodes' sshd listeners: every process of a remote session descends
    /// from one of them.
    pub fn sshd_pids(&self) -> Vec<i32> {
        let pids = std::fs::read_to_string(self.dir.path().join("pids")).unwrap_or_default();
        pids.split_whitespace().filter_map(|p| p.parse().ok()).collect()
    }

    /// rlaunch over this cluster's ssh.
    pub fn run(&self, args: &[&str]) -> Run {
        Run::new(&["--launcher", "ssh", "--launcher-exec", &self.ssh()]).args(args)
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        let _ = Command::new("bash").arg(script()).arg("down").arg(self.dir.path()).status();
    }
}
