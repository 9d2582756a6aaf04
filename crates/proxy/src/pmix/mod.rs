//! PMIx for Open MPI programs: each node's PMIx server is OpenPMIx's own library, held by a
//! small host process (`pmix/host.c`, built by build.rs and embedded in this executable) that
//! the proxy starts for a job that serves PMIx. The host turns libpmix's server callbacks
//! into [`Event`]s and the dispatcher's [`Command`]s into callback completions; the node
//! (see `node/pmix.rs`) decides everything, on its own thread, with the PMI machinery.
//!
//! ```text
//!   libpmix thread ─callback─► host ─Event─► reader task ─► Node dispatcher (tokio)
//!                     cbfunc ◄─ host ◄─Command── writer task ◄─┘
//! ```
//!
//! libpmix's threads never touch tokio: the two meet on a socket, one reader and one writer
//! task on this side, and the host completes callbacks from its main thread.

pub mod wire;

use std::io;
use std::path::{Path, PathBuf};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::sync::mpsc;

pub use wire::{Command, Event};

/// The OpenPMIx version this proxy's PMIx host was built against, if it has one.
pub fn version() -> Option<&'static str> {
    #[cfg(rlaunch_pmix)]
    return Some(env!("RLAUNCH_PMIX_VERSION"));
    #[cfg(not(rlaunch_pmix))]
    None
}

/// The host executable, embedded: a proxy runs wherever it was copied, alone.
#[cfg(rlaunch_pmix)]
const HOST_EXE: &[u8] = include_bytes!(env!("RLAUNCH_PMIX_HOST"));

/// A running PMIx host: where commands go, and the directories this node's share of the job
/// keeps its files in (removed when the host is dropped).
pub struct Host {
    commands: mpsc::UnboundedSender<Command>,
    pid: i32,
    /// The server's rendezvous and the job's session directory on this node.
    dir: PathBuf,
    /// Open MPI's shared-memory segments of this node's ranks, if /dev/shm is there.
    shm: Option<PathBuf>,
}

/// What the host's reader task reports.
pub enum HostNews {
    Event(Event),
    /// The link closed or broke: the host is gone; why.
    Gone(String),
}

impl Host {
    /// Starts the host for job `jobid` on node `node`, named `host` in the job; `news` hears
    /// its events and its end. Fails if this proxy was built without PMIx or the host cannot
    /// start.
    pub fn start(
        jobid: &str,
        node: u32,
        host_name: &str,
        news: impl Fn(HostNews) -> bool + Send + 'static,
    ) -> io::Result<Host> {
        sweep_leftovers();
        let name = format!("rlaunch-pmix.{}.{}.{}", sanitize(jobid), node, std::process::id());
        let dir = std::env::temp_dir().join(&name);
        private_dir(&dir)?;
        // Open MPI names its shared-memory segments after the host name, the job and the
        // local rank: the ranks of two fake nodes of one machine would share them. A
        // directory per node and job keeps them apart, and goes with the job however its
        // ranks end.
        let shm = Path::new("/dev/shm").join(&name);
        let shm = private_dir(&shm).ok().map(|_| shm);
        let (commands, rx) = mpsc::unbounded_channel();
        // Made first, so that its drop removes the directories whatever fails next.
        let mut host = Host { commands, pid: 0, dir, shm };
        let (pid, link) = spawn_host(&host.dir, host_name)?;
        host.pid = pid;
        link.set_nonblocking(true)?;
        let link = tokio::net::UnixStream::from_std(link)?;
        let (read, write) = link.into_split();
        tokio::spawn(write_commands(write, rx));
        tokio::spawn(read_events(read, news));
        Ok(host)
    }

    pub fn send(&self, command: Command) {
        let _ = self.commands.send(command);
    }

    /// The host's process id (it is this proxy's child: the reaper sees it end).
    pub fn pid(&self) -> i32 {
        self.pid
    }

    /// Where this node's ranks keep their shared-memory segments.
    pub fn shm_dir(&self) -> Option<&Path> {
        self.shm.as_deref()
    }
}

impl Drop for Host {
    fn drop(&mut self) {
        // The writer ends, the link closes, the host finalizes libpmix and exits.
        let _ = std::fs::remove_dir_all(&self.dir);
        if let Some(shm) = &self.shm {
            let _ = std::fs::remove_dir_all(shm);
        }
    }
}

/// Removes what proxies that died without unwinding (SIGKILL, the OOM killer) left: the
/// `rlaunch-pmix.*.PID` directories of this user in the temporary directory and /dev/shm
/// whose proxy PID is gone. Each proxy removes its own on its way out; this catches the rest.
fn sweep_leftovers() {
    let me = nix::unistd::getuid().as_raw();
    for parent in [std::env::temp_dir(), PathBuf::from("/dev/shm")] {
        let Ok(entries) = std::fs::read_dir(&parent) else { continue };
        for entry in entries.flatten() {
            let name = entry.file_name();
            let Some(name) = name.to_str().filter(|n| n.starts_with("rlaunch-pmix.")) else {
                continue;
            };
            let Some(pid) = name.rsplit('.').next().and_then(|p| p.parse::<i32>().ok()) else {
                continue;
            };
            use std::os::unix::fs::MetadataExt;
            let ours = entry.metadata().is_ok_and(|m| m.is_dir() && m.uid() == me);
            let gone = nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), None)
                == Err(nix::errno::Errno::ESRCH);
            if ours && gone && pid > 0 {
                tracing::debug!(dir = %entry.path().display(), "removing a dead proxy's PMIx files");
                let _ = std::fs::remove_dir_all(entry.path());
            }
        }
    }
}

/// Makes a directory only this user may enter.
fn private_dir(dir: &Path) -> io::Result<()> {
    use std::os::unix::fs::DirBuilderExt;
    std::fs::DirBuilder::new()
        .mode(0o700)
        .create(dir)
        .map_err(|e| io::Error::new(e.kind(), format!("{}: {e}", dir.display())))
}

/// A job id fit for a file name.
fn sanitize(jobid: &str) -> String {
    jobid.chars().map(|c| if c.is_ascii_alphanumeric() || c == '-' { c } else { '_' }).collect()
}

/// Starts the embedded host with its link on fd 3; returns its pid and our end of the link.
#[cfg(rlaunch_pmix)]
fn spawn_host(dir: &Path, name: &str) -> io::Result<(i32, std::os::unix::net::UnixStream)> {
    use std::io::Write;
    use std::os::fd::AsRawFd;
    use std::os::unix::process::CommandExt;

    use nix::sys::memfd::{memfd_create, MemFdCreateFlag};
    use nix::sys::socket::{socketpair, AddressFamily, SockFlag, SockType};
    let exe = memfd_create(c"rlaunch-pmix-host", MemFdCreateFlag::MFD_CLOEXEC)?;
    std::fs::File::from(exe.try_clone()?).write_all(HOST_EXE)?;
    let (ours, theirs) =
        socketpair(AddressFamily::Unix, SockType::Stream, None, SockFlag::SOCK_CLOEXEC)?;
    let theirs_fd = theirs.as_raw_fd();
    let parent = std::process::id() as i32;
    let mut command = std::process::Command::new(format!("/proc/self/fd/{}", exe.as_raw_fd()));
    command.arg0("rlaunch-pmix-host").arg(dir).arg(name).stdin(std::process::Stdio::null());
    // libpmix reads the node's topology with hwloc at start: with hwloc's I/O, PCI, OpenCL
    // and GL discovery that is three quarters of its 19 ms here, and the ranks need none of
    // it from the server (measured: 4.5-6 ms without). A user's own setting wins.
    if std::env::var_os("HWLOC_COMPONENTS").is_none() {
        command.env("HWLOC_COMPONENTS", "-pci,-opencl,-gl,-linuxio");
    }
    // SAFETY: only async-signal-safe calls between fork and exec.
    unsafe {
        command.pre_exec(move || {
            // Dies with the proxy, whatever ends it.
            if nix::libc::prctl(nix::libc::PR_SET_PDEATHSIG, nix::libc::SIGKILL) != 0
                || nix::libc::getppid() != parent
            {
                return Err(io::Error::last_os_error());
            }
            let to = 3;
            if theirs_fd == to {
                let flags = nix::libc::fcntl(to, nix::libc::F_GETFD);
                nix::libc::fcntl(to, nix::libc::F_SETFD, flags & !nix::libc::FD_CLOEXEC);
            } else if nix::libc::dup2(theirs_fd, to) < 0 {
                return Err(io::Error::last_os_error());
            }
            Ok(())
        });
    }
    let child = command.spawn()?;
    drop(theirs);
    Ok((child.id() as i32, std::os::unix::net::UnixStream::from(ours)))
}

#[cfg(not(rlaunch_pmix))]
fn spawn_host(_dir: &Path, _name: &str) -> io::Result<(i32, std::os::unix::net::UnixStream)> {
    Err(io::Error::new(
        io::ErrorKind::Unsupported,
        "this rlaunch-proxy was built without PMIx (OpenPMIx's development files were missing)",
    ))
}

async fn write_commands(
    mut link: tokio::net::unix::OwnedWriteHalf,
    mut commands: mpsc::UnboundedReceiver<Command>,
) {
    while let Some(command) = commands.recv().await {
        if link.write_all(&command.encode()).await.is_err() {
            return;
        }
    }
}

async fn read_events(mut link: tokio::net::unix::OwnedReadHalf, news: impl Fn(HostNews) -> bool) {
    let why = loop {
        let mut len = [0u8; 4];
        if let Err(e) = link.read_exact(&mut len).await {
            break match e.kind() {
                io::ErrorKind::UnexpectedEof => "it exited".to_string(),
                _ => e.to_string(),
            };
        }
        let len = u32::from_le_bytes(len) as usize;
        if len == 0 || len > wire::MAX_MESSAGE {
            break format!("it sent a message of {len} bytes");
        }
        let mut body = vec![0; len];
        if let Err(e) = link.read_exact(&mut body).await {
            break e.to_string();
        }
        match Event::decode(&body) {
            Ok(event) => {
                if !news(HostNews::Event(event)) {
                    return;
                }
            }
            Err(e) => break e.to_string(),
        }
    };
    news(HostNews::Gone(why));
}
