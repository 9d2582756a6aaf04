//! A cluster of fake hosts reachable over real ssh: network namespaces, each with its own
//! sshd and host name (`tests/cluster/cluster.sh`). Needs root.
//!
//! [`Cluster::up`] brings it up; dropping the [`Cluster`] takes it down, on every path out.
//! The names it uses are global: one such cluster per machine at a time.

use std::path::{Path, PathBuf};
use std::process::Command;

use crate::{Run, TempDir};

pub struct Cluster {
    dir: Dir,
}

/// The cluster's directory: ours to take down, or someone else's cluster we only use.
enum Dir {
    Owned(TempDir),
    Borrowed(PathBuf),
}

/// A script of `tests/cluster/` (`cluster.sh`, `slurm.sh`, `sge.sh`), run as
/// `bash SCRIPT VERB DIR ARGS...`.
#[derive(Debug)]
pub(crate) struct Script(pub(crate) &'static str);

impl Script {
    fn path(&self) -> PathBuf {
        Path::new(env!("CARGO_MANIFEST_DIR")).join("cluster").join(self.0)
    }

    /// Runs `verb` on the cluster in `dir` to its end; panics if bash cannot start.
    pub(crate) fn run(&self, verb: &str, dir: &Path, args: &[String]) -> std::process::Output {
        Command::new("bash")
            .arg(self.path())
            .arg(verb)
            .arg(dir)
            .args(args)
            .output()
            .unwrap_or_else(|e| panic!("error: cannot run {}: {e}", self.path().display()))
    }

    /// Takes the cluster in `dir` down; for drops, so a failure is a warning, not a panic.
    pub(crate) fn down(&self, dir: &Path, what: &str) {
        match Command::new("bash").arg(self.path()).arg("down").arg(dir).output() {
            Ok(out) if out.status.success() => {}
            Ok(out) => eprintln!(
                "warning: {what} cluster down failed ({}): {}",
                out.status,
                String::from_utf8_lossy(&out.stderr)
            ),
            Err(e) => eprintln!("warning: cannot run {}: {e}", self.path().display()),
        }
    }
}

const SCRIPT: Script = Script("cluster.sh");

impl Cluster {
    /// Nodes `n1..n<nodes>`; panics with the script's words if they do not come up.
    pub fn up(nodes: usize) -> Cluster {
        assert!(
            nix::unistd::geteuid().is_root(),
            "the multi-host tests need root to make network namespaces"
        );
        let dir = crate::tempdir();
        let out = SCRIPT.run("up", dir.path(), &[nodes.to_string()]);
        let cluster = Cluster { dir: Dir::Owned(dir) };
        assert!(
            out.status.success(),
            "cluster up failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        cluster
    }

    /// A cluster that someone else brought up (and takes down) in `dir`.
    pub fn attach(dir: &Path) -> Cluster {
        assert!(
            dir.join("ssh_config").is_file(),
            "{} holds no cluster (no ssh_config)",
            dir.display()
        );
        Cluster { dir: Dir::Borrowed(dir.to_path_buf()) }
    }

    /// The script's per-node verbs: `link-down`, `link-up`, `stop-sshd`, `start-sshd`.
    pub fn ctl(&self, verb: &str, node: usize) {
        let out = SCRIPT.run(verb, self.dir(), &[node.to_string()]);
        assert!(
            out.status.success(),
            "cluster {verb} {node}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }

    /// The cluster's directory (see tests/cluster/README.md).
    pub fn dir(&self) -> &Path {
        match &self.dir {
            Dir::Owned(dir) => dir.path(),
            Dir::Borrowed(dir) => dir,
        }
    }

    /// The ssh command line that reaches the nodes from here.
    pub fn ssh(&self) -> String {
        format!("ssh -F {}", self.dir().join("ssh_config").display())
    }

    /// The pids of the nodes' sshd listeners: every process of a remote session descends
    /// from one of them.
    pub fn sshd_pids(&self) -> Vec<i32> {
        let pids = std::fs::read_to_string(self.dir().join("pids")).unwrap_or_default();
        pids.split_whitespace().filter_map(|p| p.parse().ok()).collect()
    }

    /// rlaunch over this cluster's ssh.
    pub fn run(&self, args: &[&str]) -> Run {
        Run::new(&["--launcher", "ssh", "--launcher-exec", &self.ssh()]).args(args)
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        if let Dir::Owned(dir) = &self.dir {
            SCRIPT.down(dir.path(), "ssh");
        }
    }
}
