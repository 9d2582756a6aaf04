//! The commit rlaunch is built from, for `rlaunch --version` (`RLAUNCH_COMMIT`): git's short
//! hash, `-dirty` when the work tree had changes, or `unknown` outside a git checkout (a
//! source tarball).

use std::process::Command;

fn main() {
    let git = |args: &[&str]| {
        let out = Command::new("git").args(args).output().ok()?;
        out.status.success().then(|| String::from_utf8_lossy(&out.stdout).trim().to_string())
    };
    let commit = match git(&["rev-parse", "--short=12", "HEAD"]) {
        Some(hash) => {
            let dirty = git(&["status", "--porcelain", "--untracked-files=no"])
                .is_some_and(|s| !s.is_empty());
            if dirty {
                format!("{hash}-dirty")
            } else {
                hash
            }
        }
        None => "unknown".to_string(),
    };
    println!("cargo::rustc-env=RLAUNCH_COMMIT={commit}");
    // A new commit, or a change of branch, changes the answer.
    if let Some(dir) = git(&["rev-parse", "--absolute-git-dir"]) {
        println!("cargo::rerun-if-changed={dir}/HEAD");
        println!("cargo::rerun-if-changed={dir}/index");
        if let Some(head) = git(&["symbolic-ref", "-q", "HEAD"]) {
            println!("cargo::rerun-if-changed={dir}/{head}");
        }
    }
}
