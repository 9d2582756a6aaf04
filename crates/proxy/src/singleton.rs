//! The safety net for ranks served no PMIx. An Open MPI 4 program that finds no PMIx server
//! does not fail: it initialises as a singleton, a world of one, forking an `orted` of its
//! own from Open MPI's bindir, and computes alone (N ranks, N worlds, exit 0). No rule on
//! the program's file sees every way there (a `dlopen` of a computed name, `--pmi simple`),
//! so such ranks get `OPAL_BINDIR` naming a directory whose `orted` is a proxy executable.
//! Started as `orted` ([`trapped`]), it reports to the first of its ancestors that listens
//! on the abstract socket named after its pid (the rank's proxy) and waits; the proxy finds
//! the rank it descends from, and the job ends naming it.
//!
//! ```text
//!   rank (Open MPI, no PMIx) ──fork, exec $OPAL_BINDIR/orted──► rlaunch-proxy as `orted`
//!        ──connect @rlaunch-singleton.<ancestor>──► proxy: peer pid ─parents─► rank
//!        ──► Up::Singleton
//! ```
//!
//! The directory is this user's, made once and kept (`$TMPDIR/rlaunch-singleton.<uid>`):
//! checking that it is there costs one `stat`, where making and removing files for each job
//! cost a tenth of a one-rank launch (docs/measurements.md, *Singleton trap directory*). Any proxy executable serves as the
//! trap, so one directory serves every job of the user.

use std::io::{self, Read};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};

/// The program Open MPI's singleton start looks for in its bindir.
pub const ORTED: &str = "orted";

/// The variable that moves Open MPI's bindir (its installdirs' `env` component).
pub const BINDIR_VAR: &str = "OPAL_BINDIR";

/// The abstract socket a proxy with this pid hears its ranks' traps on.
fn report_name(pid: i32) -> String {
    format!("rlaunch-singleton.{pid}")
}

/// This user's trap directory, its `orted` a proxy executable: made if it is not there,
/// found if it is and is the user's alone. `proxy_exe` is what a new `orted` starts.
pub fn trap_dir(proxy_exe: &Path) -> io::Result<PathBuf> {
    use std::os::unix::fs::{DirBuilderExt, MetadataExt};
    let uid = nix::unistd::getuid().as_raw();
    let dir = std::env::temp_dir().join(format!("rlaunch-singleton.{uid}"));
    let orted = dir.join(ORTED);
    // Ours alone: no one else may put an `orted` in it.
    let ours = || {
        let owned = std::fs::symlink_metadata(&dir)?;
        if owned.uid() != uid || owned.mode() & 0o022 != 0 || !owned.is_dir() {
            return Err(io::Error::other(format!("{} is not this user's alone", dir.display())));
        }
        Ok(())
    };
    // Following the link: there, and an executable file.
    if std::fs::metadata(&orted).is_ok_and(|m| m.is_file() && m.mode() & 0o111 != 0) {
        ours()?;
        return Ok(dir);
    }
    match std::fs::DirBuilder::new().mode(0o700).create(&dir) {
        Err(e) if e.kind() == io::ErrorKind::AlreadyExists => ours()?,
        made => made?,
    }
    // A link to an executable that is gone is replaced; two proxies at once may both try.
    let _ = std::fs::remove_file(&orted);
    match std::os::unix::fs::symlink(proxy_exe, &orted) {
        Err(e) if e.kind() != io::ErrorKind::AlreadyExists => Err(e),
        _ => Ok(dir),
    }
}

/// Where a proxy's ranks' trap reports arrive: the abstract socket named after its pid.
pub struct Reports {
    listener: tokio::net::UnixListener,
}

impl Reports {
    /// Listens for this proxy's ranks' traps.
    pub fn listen() -> io::Result<Reports> {
        use std::os::linux::net::SocketAddrExt;
        let name = report_name(std::process::id() as i32);
        let addr = std::os::unix::net::SocketAddr::from_abstract_name(name.as_bytes())?;
        let listener = std::os::unix::net::UnixListener::bind_addr(&addr)?;
        listener.set_nonblocking(true)?;
        Ok(Reports { listener: tokio::net::UnixListener::from_std(listener)? })
    }

    /// The next report: the process that made it (a process of another user is passed
    /// over), and the connection, which holds it until dropped.
    pub async fn report(&self) -> io::Result<(i32, tokio::net::UnixStream)> {
        let me = nix::unistd::getuid().as_raw();
        loop {
            let (stream, _) = self.listener.accept().await?;
            let cred = stream.peer_cred()?;
            if cred.uid() == me {
                return Ok((cred.pid().unwrap_or(0), stream));
            }
        }
    }
}

/// `pid` and its ancestors, nearest first, as /proc shows them (at most 64: a chain that
/// long is not a rank's descendant).
pub fn ancestry(pid: i32) -> Vec<i32> {
    let mut chain = vec![pid];
    while chain.len() < 64 {
        let stat = rlaunch_tree::procs::Stat::read(chain[chain.len() - 1]);
        let parent = stat.and_then(|s| s.field(4)?.parse::<i32>().ok());
        match parent {
            Some(parent) if parent > 1 => chain.push(parent),
            _ => break,
        }
    }
    chain
}

/// This process was started as `orted` by Open MPI's singleton start, in a rank served no
/// PMIx: it tells its proxy and waits for the job to end (the proxy ends the connection, or
/// kills it). Returns the exit status for a trap nobody listens to: that fails Open MPI's
/// start as an orted that cannot run would, rather than let the rank compute alone.
pub fn trapped() -> i32 {
    use std::os::linux::net::SocketAddrExt;
    let me = std::process::id() as i32;
    for pid in ancestry(me).into_iter().skip(1) {
        let Ok(addr) = std::os::unix::net::SocketAddr::from_abstract_name(report_name(pid)) else {
            continue;
        };
        if let Ok(mut stream) = UnixStream::connect_addr(&addr) {
            let _ = stream.read(&mut [0u8; 1]);
            return 1;
        }
    }
    eprintln!("rlaunch-proxy: started as {ORTED}, and no rlaunch-proxy above it listens");
    1
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_process_descends_from_its_parents() {
        let me = std::process::id() as i32;
        let chain = ancestry(me);
        assert_eq!(chain[0], me);
        assert_eq!(chain.get(1).copied(), Some(nix::unistd::getppid().as_raw()).filter(|&p| p > 1));
        assert_eq!(ancestry(-5), [-5], "no such process");
    }
}
