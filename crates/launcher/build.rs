//! The commit rlaunch is built from, for `rlaunch --version` (`RLAUNCH_COMMIT`): git's short
//! hash, or `unknown` outside a git checkout (a source tarball). Not whether the tree had
//! changes: a build script reruns only when the files it names change, and naming every
//! source file to keep a `-dirty` true is not worth a rerun on each edit.

use std::process::Command;

fn main() {
    let git = |args: &[&str]| {
        let out = Command::new("git").args(args).output().ok()?;
        out.status.success().then(|| String::from_utf8_lossy(&out.stdout).trim().to_string())
    };
    let commit = git(&["rev-parse", "--short=12", "HEAD"]).unwrap_or_else(|| "unknown".into());
    println!("cargo::rustc-env=RLAUNCH_COMMIT={commit}");
    // A new commit, or a change of branch, changes the answer.
    if let Some(dir) = git(&["rev-parse", "--absolute-git-dir"]) {
        println!("cargo::rerun-if-changed={dir}/HEAD");
        if let Some(head) = git(&["symbolic-ref", "-q", "HEAD"]) {
            println!("cargo::rerun-if-changed={dir}/{head}");
        }
    }
}
