//! Links between a parent (the launcher or a proxy) and the proxies it starts.
//!
//! ```text
//!  parent                                   child proxy
//!  spawn_proxy()  ── fork or ssh ──────────► rlaunch-proxy (stdin/stdout = channel)
//!  write hello ────────────────────────────► read hello, check version
//!  read hello, Greeting ◄─────────────────── write hello, Greeting
//!  Down frames (Launch first) ─────────────► dispatcher
//!  Up frames ◄────────────────────────────── upstream pump
//! ```
//!
//! A proxy forked from rlaunch ([`fork_proxy`]) is born holding its launch: it reads no hello
//! and no Launch, and starts its ranks while rlaunch is still setting up.

use std::ffi::OsStr;
use std::io;
use std::os::fd::{OwnedFd, RawFd};
use std::os::unix::process::CommandExt;
use std::process::{Command, Stdio};

use nix::sys::socket::{socketpair, AddressFamily, SockFlag, SockType};
use pmi_wire::control::{
    self, Bootstrap, Down, Frame, Job, Launch, NodePlan, Up, HEARTBEAT, PROTOCOL_VERSION, SILENCE,
};
use pmi_wire::io::{FrameReader, ReadError};
use tokio::io::AsyncWriteExt;
use tokio::sync::mpsc;

use crate::fdio::FdStream;

/// A started child proxy, before the handshake.
pub struct ProxyProcess {
    pub pid: i32,
    /// The child's stdout: its Up frames.
    pub from_child: FdStream,
    /// The child's stdin: our Down frames.
    pub to_child: FdStream,
    /// The remote launcher's stderr (ssh's complaints), quoted when the host fails.
    pub stderr: Option<FdStream>,
    /// What the process is, for messages: "its proxy", or the remote launcher's name.
    pub what: String,
    /// The child was forked holding its launch (see [`fork_proxy`]): it expects neither our
    /// hello nor a Launch frame.
    pub launched: bool,
}

/// A proxy forked from rlaunch itself, with no exec: see [`fork_proxy`].
pub struct ForkedProxy {
    pub pid: i32,
    /// Our end of its control channel.
    pub channel: OwnedFd,
}

/// Starts a proxy for this machine in a child of the calling process, which runs the proxy's
/// code directly: no exec, no second program to load. A local job's proxy is one exec fewer,
/// about a fifth of `rlaunch -n 1`'s time. The child is named `rlaunch-proxy`, in its own
/// process group, with /dev/null on stdin/stdout like an exec'd proxy; its own child proxies
/// are exec'd from `proxy_exe`. It already holds its launch (`job` and `node`, copied in the
/// child), so it starts its ranks at once instead of waiting for rlaunch's runtime to send
/// them. `close` are descriptors the child must not keep (parent ends of earlier channels: a
/// copy held open would hide their end of file).
///
/// # Safety
/// The calling process must have one thread: the child of a multithreaded fork may only
/// make async-signal-safe calls, and this one goes on to run a tokio runtime.
pub unsafe fn fork_proxy(
    proxy_exe: &OsStr,
    close: &[RawFd],
    job: &Job,
    node: &NodePlan,
) -> io::Result<ForkedProxy> {
    let (ours, theirs) =
        socketpair(AddressFamily::Unix, SockType::Stream, None, SockFlag::SOCK_CLOEXEC)
            .map_err(io::Error::from)?;
    // SAFETY: single-threaded, as the caller promises.
    match unsafe { nix::unistd::fork() }.map_err(io::Error::from)? {
        nix::unistd::ForkResult::Child => {
            drop(ours);
            for &fd in close {
                // SAFETY: closing our copies of descriptors that the parent keeps.
                unsafe { nix::libc::close(fd) };
            }
            let _ =
                nix::unistd::setpgid(nix::unistd::Pid::from_raw(0), nix::unistd::Pid::from_raw(0));
            // SAFETY: prctl with a NUL-terminated name of at most 16 bytes.
            unsafe { nix::libc::prctl(nix::libc::PR_SET_NAME, c"rlaunch-proxy".as_ptr()) };
            let code = match crate::null_stdin_stdout().and_then(|()| theirs.try_clone()) {
                Ok(input) => {
                    let launch = Launch { job: job.clone(), node: node.clone() };
                    crate::run(input, theirs, proxy_exe.to_owned(), Some(launch))
                }
                Err(e) => {
                    eprintln!("rlaunch-proxy: cannot set up its control channel: {e}");
                    1
                }
            };
            // Not exit(): nothing of rlaunch's (buffered stdout, atexit) is the child's to run.
            // SAFETY: ends the process.
            unsafe { nix::libc::_exit(code) }
        }
        nix::unistd::ForkResult::Parent { child } => {
            // Also here, so that no signal to the group can come before the child's own call.
            let _ = nix::unistd::setpgid(child, child);
            Ok(ForkedProxy { pid: child.as_raw(), channel: ours })
        }
    }
}

impl ProxyProcess {
    /// The parent's side of a [`fork_proxy`] child, registered with the runtime.
    pub fn forked(proxy: ForkedProxy) -> io::Result<ProxyProcess> {
        Ok(ProxyProcess {
            pid: proxy.pid,
            to_child: FdStream::new(proxy.channel.try_clone()?)?,
            from_child: FdStream::new(proxy.channel)?,
            stderr: None,
            what: "its proxy".to_string(),
            launched: true,
        })
    }
}

/// Starts the proxy for `host`: by fork, with `proxy_exe` (this machine's proxy binary), or
/// by the job's remote bootstrap.
pub fn spawn_proxy(
    bootstrap: &Bootstrap,
    host: &str,
    fork: bool,
    proxy_exe: &OsStr,
) -> io::Result<ProxyProcess> {
    let mut cmd;
    let what;
    let remote = match bootstrap {
        Bootstrap::Remote { argv, proxy_path } if !fork => {
            let (prog, args) = argv.split_first().ok_or_else(|| {
                io::Error::new(io::ErrorKind::InvalidInput, "empty launcher command")
            })?;
            cmd = Command::new(prog);
            cmd.args(args).arg(host).arg(remote_command(proxy_path));
            what = prog.rsplit('/').next().unwrap_or(prog).to_string();
            true
        }
        _ => {
            cmd = Command::new(proxy_exe);
            what = "its proxy".to_string();
            false
        }
    };
    let (ours, theirs) =
        socketpair(AddressFamily::Unix, SockType::Stream, None, SockFlag::SOCK_CLOEXEC)
            .map_err(io::Error::from)?;
    cmd.stdin(Stdio::from(theirs.try_clone()?)).stdout(Stdio::from(theirs));
    cmd.stderr(if remote { Stdio::piped() } else { Stdio::inherit() });
    // Its own process group: a Ctrl-C at the terminal reaches rlaunch alone, which forwards it.
    // (process_group rather than a pre_exec hook lets std use posix_spawn instead of fork.)
    cmd.process_group(0);
    let mut child = cmd.spawn()?;
    let stderr = child.stderr.take().map(|e| FdStream::new(OwnedFd::from(e))).transpose()?;
    let to_child = FdStream::new(ours.try_clone()?)?;
    Ok(ProxyProcess {
        pid: child.id() as i32,
        from_child: FdStream::new(ours)?,
        to_child,
        stderr,
        what,
        launched: false,
    })
}

/// The command line the remote shell runs: the proxy, with our log level (the remote
/// environment is the login's, not ours).
fn remote_command(proxy_path: &str) -> String {
    let quoted = if proxy_path.chars().all(|c| c.is_ascii_alphanumeric() || "/._-+".contains(c)) {
        proxy_path.to_string()
    } else {
        format!("'{}'", proxy_path.replace('\'', "'\\''"))
    };
    match std::env::var("RLAUNCH_LOG") {
        Ok(level) if !level.is_empty() && level.chars().all(|c| c.is_ascii_alphabetic()) => {
            format!("RLAUNCH_LOG={level} {quoted}")
        }
        _ => quoted,
    }
}

#[derive(Debug, thiserror::Error)]
pub enum LinkError {
    #[error("its proxy speaks protocol version {theirs}, this rlaunch speaks version {ours}: install the same rlaunch version on every host")]
    Version { theirs: u32, ours: u32 },
    #[error("{0}")]
    Read(#[from] ReadError),
    #[error("the proxy's first frame was not a greeting")]
    NoGreeting,
    #[error("{0}")]
    Io(#[from] io::Error),
    #[error("no word from it for {} s", .0.as_secs())]
    Silent(std::time::Duration),
}

/// What a child proxy said about itself.
#[derive(Debug, Clone)]
pub struct Greeting {
    pub host: String,
    pub pid: u32,
    /// What the remote side printed before the hello (login banners, shell noise).
    pub preamble: Vec<u8>,
}

/// Reads the child's hello and greeting.
pub async fn read_greeting(reader: &mut FrameReader<FdStream>) -> Result<Greeting, LinkError> {
    let (found, preamble) = reader.read_hello().await?;
    if found.version != PROTOCOL_VERSION {
        return Err(LinkError::Version { theirs: found.version, ours: PROTOCOL_VERSION });
    }
    match reader.next::<Up>().await? {
        Some(Up::Greeting { host, pid }) => Ok(Greeting { host, pid, preamble }),
        _ => Err(LinkError::NoGreeting),
    }
}

/// Writes frames to `out` until every sender is gone. Control messages go first; bulk data
/// (bounded, so its senders feel backpressure) fills the rest of each write. Messages that are
/// ready together are written with one syscall.
pub async fn pump<M: Frame>(
    mut out: FdStream,
    hello: bool,
    mut control: mpsc::UnboundedReceiver<M>,
    mut data: Option<mpsc::Receiver<M>>,
) -> io::Result<()> {
    const BATCH: usize = 256 << 10;
    let mut buf = Vec::with_capacity(64 << 10);
    if hello {
        buf.extend_from_slice(&control::hello());
    }
    let mut control_open = true;
    loop {
        if buf.is_empty() {
            if !control_open && data.is_none() {
                return Ok(());
            }
            enum Got<M> {
                Control(Option<M>),
                Data(Option<M>),
            }
            let got = tokio::select! {
                biased;
                m = control.recv(), if control_open => Got::Control(m),
                m = recv_data(&mut data) => Got::Data(m),
            };
            match got {
                Got::Control(Some(m)) | Got::Data(Some(m)) => m.encode(&mut buf),
                Got::Control(None) => control_open = false,
                Got::Data(None) => data = None,
            }
            if buf.is_empty() {
                continue;
            }
        }
        while buf.len() < BATCH {
            if let Ok(m) = control.try_recv() {
                m.encode(&mut buf);
            } else if let Some(m) = data.as_mut().and_then(|d| d.try_recv().ok()) {
                m.encode(&mut buf);
            } else {
                break;
            }
        }
        out.write_all(&buf).await?;
        buf.clear();
        if buf.capacity() > BATCH * 2 {
            buf.shrink_to(64 << 10);
        }
    }
}

async fn recv_data<M>(data: &mut Option<mpsc::Receiver<M>>) -> Option<M> {
    match data {
        Some(rx) => rx.recv().await,
        None => std::future::pending().await,
    }
}

/// The parent's view of one child proxy. A child is lost when its link closes or its process
/// ends before it said NodeDone; the verdict waits for both events, because a proxy that
/// finished cleanly exits right after its last frame and SIGCHLD may overtake that frame.
pub struct ChildState {
    pub host: String,
    /// What its process is, for messages: "its proxy" under fork, "ssh" under ssh.
    process: String,
    /// Its process (the proxy under fork, the ssh client under ssh); -1 if it never started.
    pub pid: i32,
    /// It said NodeDone: its subtree is finished.
    pub done: bool,
    /// Lost, and reported.
    pub lost: bool,
    exit: Option<pmi_wire::ids::ExitOutcome>,
    link_closed: bool,
    link_error: Option<String>,
    /// The last bytes the remote launcher (ssh) printed on stderr.
    stderr_tail: Vec<u8>,
}

impl ChildState {
    pub fn new(host: String, pid: i32, process: String) -> ChildState {
        ChildState {
            host,
            process,
            pid,
            done: false,
            lost: false,
            exit: None,
            link_closed: false,
            link_error: None,
            stderr_tail: Vec::new(),
        }
    }

    /// A child that could not even be started.
    pub fn failed(host: String) -> ChildState {
        let mut c = ChildState::new(host, -1, String::new());
        c.lost = true;
        c.link_closed = true;
        c.exit = Some(pmi_wire::ids::ExitOutcome::Exited(127));
        c
    }

    pub fn reaped(&self) -> bool {
        self.exit.is_some()
    }

    /// Finished one way or the other, and nothing more will come from it.
    pub fn settled(&self) -> bool {
        (self.done || self.lost) && self.reaped()
    }

    pub fn add_stderr(&mut self, text: &[u8]) {
        self.stderr_tail.extend_from_slice(text);
        if self.stderr_tail.len() > 4096 {
            self.stderr_tail.drain(..self.stderr_tail.len() - 4096);
        }
    }

    /// Its process ended. Returns why it is lost, if it now is.
    pub fn on_exit(&mut self, outcome: pmi_wire::ids::ExitOutcome) -> Option<String> {
        self.exit = Some(outcome);
        self.verdict()
    }

    /// Its link closed (with an error, or at end of file). Returns why it is lost, if it
    /// now is; a lost child's process (a hung proxy, or an ssh client on a dead network) is
    /// killed then, as nothing more will come from it.
    pub fn on_link_closed(&mut self, error: Option<String>) -> Option<String> {
        self.link_closed = true;
        self.link_error = error;
        let verdict = self.verdict();
        if verdict.is_some() && !self.reaped() && self.pid > 0 {
            crate::procs::signal_pid(self.pid, nix::sys::signal::Signal::SIGKILL);
        }
        verdict
    }

    fn verdict(&mut self) -> Option<String> {
        if self.done || self.lost || !self.link_closed {
            return None;
        }
        // A broken link says more than the exit status (a version mismatch, say), but an
        // exit after a clean end of file is the story.
        let mut reason = match (&self.link_error, self.exit) {
            (Some(err), _) => err.clone(),
            (None, Some(outcome)) => format!("{} {outcome}", self.process),
            (None, None) => return None,
        };
        self.lost = true;
        let tail = String::from_utf8_lossy(&self.stderr_tail);
        if let Some(last) = tail.lines().rev().find(|l| !l.trim().is_empty()) {
            reason = format!("{reason}: {}", last.trim());
        }
        Some(reason)
    }
}

/// Sends `ping` on `tx` every [`HEARTBEAT`] for as long as anyone else holds a sender (the
/// heartbeat alone does not keep a channel open).
pub fn heartbeat<M: Send + 'static>(tx: &mpsc::UnboundedSender<M>, ping: fn() -> M) {
    let weak = tx.downgrade();
    tokio::spawn(async move {
        loop {
            tokio::time::sleep(HEARTBEAT).await;
            match weak.upgrade() {
                Some(tx) if tx.send(ping()).is_ok() => {}
                _ => return,
            }
        }
    });
}

/// How long a child proxy may take to say hello: ssh's own connect timeout and a login
/// shell come first.
const HELLO_WAIT: std::time::Duration = std::time::Duration::from_secs(30);

/// A child proxy as its parent starts it: the parent's view of it, the sender of its Down
/// frames, and its running link (or why it could not be started).
pub struct StartedChild {
    pub state: ChildState,
    pub down: mpsc::UnboundedSender<Down>,
    pub link: Result<tokio::task::JoinHandle<()>, String>,
}

/// Takes the proxy started for `node` (by [`spawn_proxy`] or [`fork_proxy`]), sends it its
/// launch, keeps its heartbeat going and runs its link, handing what it reports to `deliver`
/// (see [`run_link`]). Shared by the launcher and the proxies, which start their children
/// the same way.
pub fn start_child<F, Fut>(
    job: &Job,
    node: &NodePlan,
    process: io::Result<ProxyProcess>,
    deliver: F,
) -> StartedChild
where
    F: FnMut(LinkEvent) -> Fut + Send + 'static,
    Fut: std::future::Future<Output = bool> + Send + 'static,
{
    let (down, down_rx) = mpsc::unbounded_channel();
    match process {
        Ok(process) => {
            if !process.launched {
                let launch = Launch { job: job.clone(), node: node.clone() };
                let _ = down.send(Down::Launch(Box::new(launch)));
            }
            heartbeat(&down, || Down::Ping);
            let state = ChildState::new(node.host.clone(), process.pid, process.what.clone());
            let link = tokio::spawn(run_link(process, down_rx, deliver));
            StartedChild { state, down, link: Ok(link) }
        }
        Err(e) => StartedChild {
            state: ChildState::failed(node.host.clone()),
            down,
            link: Err(format!("cannot start its launcher: {e}")),
        },
    }
}

/// What a link to a child proxy reports to its owner.
pub enum LinkEvent {
    /// The handshake succeeded.
    Greeted(Greeting),
    Up(Up),
    /// Bytes the remote launcher printed on stderr.
    Stderr(Vec<u8>),
    /// The link is gone: `Some` error, or `None` at a clean end of file.
    Closed(Option<String>),
}

/// Drives the link to one child proxy: writes `down` to it, reads its hello and frames and
/// its launcher's stderr, and hands each to `deliver` (which may wait: that is how output
/// backpressure travels up). Stops when the link closes or `deliver` returns false.
pub async fn run_link<F, Fut>(
    process: ProxyProcess,
    down: mpsc::UnboundedReceiver<Down>,
    mut deliver: F,
) where
    F: FnMut(LinkEvent) -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let ProxyProcess { from_child, to_child, mut stderr, launched, .. } = process;
    tokio::spawn(async move {
        if let Err(e) = pump(to_child, !launched, down, None).await {
            tracing::debug!("writing to a child proxy failed: {e}");
        }
    });
    let mut reader = FrameReader::new(from_child);
    let mut greeted = false;
    let error = loop {
        let next = tokio::select! {
            text = read_stderr(&mut stderr) => match text {
                Some(text) => LinkEvent::Stderr(text),
                None => { stderr = None; continue; }
            },
            r = async {
                if greeted {
                    match tokio::time::timeout(SILENCE, reader.next::<Up>()).await {
                        Ok(r) => r.map(|o| o.map(LinkEvent::Up)).map_err(LinkError::from),
                        Err(_) => Err(LinkError::Silent(SILENCE)),
                    }
                } else {
                    match tokio::time::timeout(HELLO_WAIT, read_greeting(&mut reader)).await {
                        Ok(r) => r.map(|g| Some(LinkEvent::Greeted(g))),
                        Err(_) => Err(LinkError::Silent(HELLO_WAIT)),
                    }
                }
            } => match r {
                Ok(Some(ev)) => ev,
                Ok(None) => break None,
                // The launcher (ssh) or the proxy died before it could speak: its exit status
                // and stderr tell the story better than "connection closed".
                Err(LinkError::Read(ReadError::ClosedBeforeHello { preamble })) => {
                    let said = String::from_utf8_lossy(&preamble).trim().to_string();
                    if said.is_empty() { break None } else { break Some(format!("it printed {said:?} and closed the connection")) }
                }
                // A reset is how a dead peer looks when we wrote last: let its exit status speak.
                Err(LinkError::Read(ReadError::Io(e)))
                    if matches!(e.kind(), io::ErrorKind::ConnectionReset | io::ErrorKind::BrokenPipe) =>
                {
                    break None
                }
                Err(e) => break Some(e.to_string()),
            },
        };
        greeted |= matches!(next, LinkEvent::Greeted(_));
        if !deliver(next).await {
            return;
        }
    };
    // What ssh said last is often the whole story of a failed host: collect it first.
    let drain = async {
        while stderr.is_some() {
            match read_stderr(&mut stderr).await {
                Some(text) => {
                    deliver(LinkEvent::Stderr(text)).await;
                }
                None => stderr = None,
            }
        }
    };
    let _ = tokio::time::timeout(std::time::Duration::from_secs(1), drain).await;
    deliver(LinkEvent::Closed(error)).await;
}

async fn read_stderr(stderr: &mut Option<FdStream>) -> Option<Vec<u8>> {
    match stderr {
        Some(s) => match s.read_available(4096).await {
            Ok(t) if !t.is_empty() => Some(t),
            _ => None,
        },
        None => std::future::pending().await,
    }
}
