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

use rlaunch_protocol::ids::Gid;
use std::ffi::OsStr;
use std::io;
use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::os::unix::process::CommandExt;
use std::process::{Command, Stdio};
use std::sync::Arc;

use nix::sys::socket::{socketpair, AddressFamily, SockFlag, SockType};
use rlaunch_protocol::control::{Bootstrap, Down, LinkDown, LinkUp, Up, UpFrame, PROTOCOL_VERSION};
use rlaunch_protocol::ids::Stream;
use rlaunch_protocol::io::{FrameReader, Next, ReadError};
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::sync::mpsc;

use crate::credit::{ChildCredit, Debt};
use crate::fdio::FdStream;
use crate::splice::{self, Bulk};

mod pump;

pub use pump::{pump, pump_until_abandoned, Rehoming};

/// The reading half of a control channel: a pipe or socketpair, or an encrypted TCP link.
pub type LinkRead = Box<dyn AsyncRead + Send + Unpin>;
/// The writing half of a control channel.
pub type LinkWrite = Box<dyn AsyncWrite + Send + Unpin>;

/// A started child proxy, before the handshake.
pub struct ProxyProcess {
    /// Its process (the proxy, or the remote launcher that runs it); -1 for none of its own.
    pub pid: i32,
    /// Its Up frames (a forked or exec'd child's stdout), and a greeting already read from
    /// them, if the child dialed in and had to say who it is before it got a link.
    pub from_child: FrameReader<LinkRead>,
    pub greeted: Option<Greeting>,
    /// Our Down frames (its stdin).
    pub to_child: LinkWrite,
    /// The remote launcher's stderr (ssh's complaints), quoted when the host fails.
    pub stderr: Option<FdStream>,
    /// What the process is, for messages: "its proxy", or the remote launcher's name.
    pub what: String,
    /// The child was forked holding its launch (see [`fork_proxy`]): it expects neither our
    /// hello nor a Launch frame.
    pub launched: bool,
    /// The descriptor `from_child` reads, when it is a plain socket (not an encrypted link):
    /// output can be spliced from it.
    pub plain: Option<RawFd>,
    /// Where large output frames go instead of being read (see [`ProxyProcess::with_bulk`]).
    pub bulk: Option<Box<dyn Bulk>>,
}

/// A proxy forked from rlaunch itself, with no exec: see [`fork_child`].
pub struct ForkedProxy {
    pub pid: i32,
    /// Our end of its control channel.
    pub channel: OwnedFd,
}

/// Forks a proxy for this machine: a child of the calling process, joined to it by a
/// socket pair, in its own process group, named `rlaunch-proxy`, that runs `body` with its
/// end of the channel and exits with what `body` returns (`_exit`: nothing of the parent's,
/// buffered stdout or atexit handlers, is the child's to run). `close` are descriptors the
/// child must not keep (parent ends of earlier channels: a copy held open would hide their
/// end of file). The proxy crate's `fork_proxy` gives the body: the proxy's own code, with
/// its launch, so that a local job's proxy costs no exec.
///
/// # Safety
/// The calling process must have one thread: the child of a multithreaded fork may only
/// make async-signal-safe calls, and `body` goes on to do anything.
pub unsafe fn fork_child(
    close: &[RawFd],
    body: impl FnOnce(OwnedFd) -> i32,
) -> io::Result<ForkedProxy> {
    let (ours, theirs) =
        socketpair(AddressFamily::Unix, SockType::Stream, None, SockFlag::SOCK_CLOEXEC)
            .map_err(io::Error::from)?;
    upstream_room(&theirs);
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
            let code = body(theirs);
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
        let plain = Some(proxy.channel.as_raw_fd());
        Ok(ProxyProcess {
            pid: proxy.pid,
            to_child: Box::new(FdStream::new(proxy.channel.try_clone()?)?),
            from_child: FrameReader::new(Box::new(FdStream::new(proxy.channel)?)),
            greeted: None,
            stderr: None,
            what: "its proxy".to_string(),
            launched: true,
            plain,
            bulk: None,
        })
    }

    /// A child over `read` and `write` with no process of its own (a proxy that dialed in,
    /// or a test's proxy in memory): its link alone says when it is gone.
    pub fn over(read: LinkRead, write: LinkWrite) -> ProxyProcess {
        ProxyProcess {
            pid: -1,
            from_child: FrameReader::new(read),
            greeted: None,
            to_child: write,
            stderr: None,
            what: "its proxy".to_string(),
            launched: false,
            plain: None,
            bulk: None,
        }
    }

    /// Has the link hand the rest of each large output frame to `bulk` instead of reading it
    /// (see [`crate::splice`]); `bulk` reads `plain`, the link's socket, itself.
    pub fn with_bulk(mut self, bulk: Box<dyn Bulk>) -> ProxyProcess {
        self.bulk = Some(bulk);
        self
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
    upstream_room(&theirs);
    cmd.stdin(Stdio::from(theirs.try_clone()?)).stdout(Stdio::from(theirs));
    cmd.stderr(if remote { Stdio::piped() } else { Stdio::inherit() });
    // Its own process group: a Ctrl-C at the terminal reaches rlaunch alone, which forwards it.
    // (process_group rather than a pre_exec hook lets std use posix_spawn instead of fork.)
    cmd.process_group(0);
    // Name the program that could not start (`qrsh: No such file or directory`).
    let mut child = cmd.spawn().map_err(|e| io::Error::new(e.kind(), format!("{what}: {e}")))?;
    let stderr = child.stderr.take().map(|e| FdStream::new(OwnedFd::from(e))).transpose()?;
    let to_child = FdStream::new(ours.try_clone()?)?;
    let plain = Some(ours.as_raw_fd());
    Ok(ProxyProcess {
        pid: child.id() as i32,
        from_child: FrameReader::new(Box::new(FdStream::new(ours)?)),
        greeted: None,
        to_child: Box::new(to_child),
        stderr,
        what,
        launched: false,
        plain,
        bulk: None,
    })
}

/// Lets a child's end of its channel hold more of its output in flight: the child writes
/// output frames of up to 128 KiB, and the default of 208 KiB makes it wait for the parent
/// after one or two. Best effort (capped by `net.core.wmem_max`).
fn upstream_room(fd: &OwnedFd) {
    use nix::sys::socket::{setsockopt, sockopt::SndBuf};
    if let Err(e) = setsockopt(fd, SndBuf, &UPSTREAM_SNDBUF) {
        tracing::debug!("cannot enlarge a channel's send buffer: {e}");
    }
}

/// What [`upstream_room`] asks for.
const UPSTREAM_SNDBUF: usize = 1 << 20;

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
    #[error("no word from it for {} s", .0.as_secs_f64())]
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
pub async fn read_greeting<R: AsyncRead + Unpin>(
    reader: &mut FrameReader<R>,
) -> Result<Greeting, LinkError> {
    let (found, preamble) = reader.read_hello().await?;
    if found.version != PROTOCOL_VERSION {
        return Err(LinkError::Version { theirs: found.version, ours: PROTOCOL_VERSION });
    }
    match reader.next::<UpFrame>().await? {
        Some(UpFrame::Link(LinkUp::Greeting { host, pid })) => Ok(Greeting { host, pid, preamble }),
        _ => Err(LinkError::NoGreeting),
    }
}

/// Sends `ping` on `tx` every `every` for as long as anyone else holds a sender (the
/// heartbeat alone does not keep a channel open).
pub fn heartbeat<M: Send + 'static>(
    tx: &mpsc::UnboundedSender<M>,
    every: std::time::Duration,
    ping: fn() -> M,
) {
    let weak = tx.downgrade();
    tokio::spawn(async move {
        let mut last = tokio::time::Instant::now();
        loop {
            tokio::time::sleep(every).await;
            // A beat this late means the runtime's one thread was busy elsewhere that long:
            // what a parent's silence timeout would see.
            let late = last.elapsed().saturating_sub(every);
            if late > every {
                tracing::debug!("the heartbeat went {} ms late", late.as_millis());
            }
            last = tokio::time::Instant::now();
            match weak.upgrade() {
                Some(tx) if tx.send(ping()).is_ok() => {}
                _ => return,
            }
        }
    });
}

/// How long a child proxy may take to say hello: ssh's own connect timeout and a login
/// shell come first.
pub const HELLO_WAIT: std::time::Duration = std::time::Duration::from_secs(30);

/// What a link to a child proxy reports to its owner.
pub enum LinkEvent {
    /// The handshake succeeded.
    Greeted(Greeting),
    /// The link's own business after the greeting: a heartbeat, a clock probe's echo. For
    /// its end (`Children::on_link`), never relayed.
    Link(LinkUp),
    /// The job's business: relayed up, or read at the root.
    Up(Up),
    /// A rank's output (`Up::Output`), with the room in the child's window it takes until it
    /// is taken on.
    Output { rank: Gid, stream: Stream, data: Vec<u8>, debt: Debt },
    /// A rank's output, part of it taken by the link's [`Bulk`] (spliced into rlaunch's
    /// stash), as the `Bulk` described it ([`splice::Piece::Taken`]).
    Spliced { output: Box<dyn std::any::Any + Send>, debt: Debt },
    /// Bytes the remote launcher printed on stderr.
    Stderr(Vec<u8>),
    /// The link is gone: `Some` error, or `None` at a clean end of file.
    Closed(Option<String>),
}

/// Drives the link to one child proxy: writes `link` and `down` to it (the link's own
/// messages first), reads its hello and frames and
/// its launcher's stderr, and hands each to `deliver` (which may wait: that is how output
/// backpressure travels up). A link silent for `silence` after the greeting is lost. Stops
/// when the link closes or `deliver` returns false.
pub async fn run_link<F, Fut>(
    process: ProxyProcess,
    (mut link, mut down): (mpsc::UnboundedReceiver<LinkDown>, mpsc::UnboundedReceiver<Down>),
    credit: Arc<ChildCredit>,
    silence: std::time::Duration,
    mut deliver: F,
) where
    F: FnMut(LinkEvent) -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let ProxyProcess { from_child: mut reader, to_child, mut stderr, launched, greeted, .. } =
        process;
    let mut bulk = process.bulk;
    if bulk.is_some() {
        reader.cap_reads(splice::READ_CHUNK);
    }
    tokio::spawn(async move {
        if let Err(e) = pump(to_child, !launched, &mut link, &mut down, None, None).await {
            tracing::debug!("writing to a child proxy failed: {e}");
        }
    });
    // A forked proxy says hello at once: it has no login to go through first.
    let hello_wait = if launched { silence } else { HELLO_WAIT };
    let mut said_hello = greeted.is_some();
    if let Some(greeting) = greeted {
        if !deliver(LinkEvent::Greeted(greeting)).await {
            return;
        }
    }
    let error = loop {
        let next = tokio::select! {
            text = read_stderr(&mut stderr) => match text {
                Some(text) => LinkEvent::Stderr(text),
                None => { stderr = None; continue; }
            },
            r = async {
                if said_hello {
                    next_within(silence, &mut reader, &mut bulk, &credit).await
                } else {
                    match tokio::time::timeout(hello_wait, read_greeting(&mut reader)).await {
                        Ok(r) => r.map(|g| Some(LinkEvent::Greeted(g))),
                        Err(_) => Err(LinkError::Silent(hello_wait)),
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
        said_hello |= matches!(next, LinkEvent::Greeted(_));
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

/// The next frame from a child as an event, or the next piece of a large output frame when
/// the link has a [`Bulk`]. Cancel-safe, as [`FrameReader::next`] and [`Bulk::next_piece`] are.
async fn next_event(
    reader: &mut FrameReader<LinkRead>,
    bulk: &mut Option<Box<dyn Bulk>>,
    credit: &Arc<ChildCredit>,
) -> Result<Option<LinkEvent>, ReadError> {
    let Some(bulk) = bulk else {
        return Ok(reader.next::<UpFrame>().await?.map(|frame| owe(frame, credit)));
    };
    loop {
        if bulk.busy() {
            return Ok(Some(match bulk.next_piece().await? {
                splice::Piece::Read { rank, stream, data } => {
                    owe(UpFrame::Job(Up::Output { rank, stream, data }), credit)
                }
                splice::Piece::Taken { len, output } => {
                    LinkEvent::Spliced { output, debt: Debt::new(credit.clone(), len) }
                }
            }));
        }
        match reader.next_or_bulk::<UpFrame>(splice::SPLICE_MIN).await? {
            None => return Ok(None),
            Some(Next::Frame(frame)) => {
                if let UpFrame::Job(Up::Output { rank, stream, data }) = &frame {
                    bulk.saw(*rank, *stream, data);
                }
                return Ok(Some(owe(frame, credit)));
            }
            Some(Next::Bulk { frame: UpFrame::Job(Up::Output { rank, stream, data }), rest }) => {
                bulk.begin(rank, stream, data, rest);
            }
            // Only output carries bulk data up.
            Some(Next::Bulk { .. }) => {
                let what = "bulk data that is not output".to_string();
                return Err(rlaunch_protocol::control::FrameError::Malformed(what).into());
            }
        }
    }
}

/// The next event from a child within `silence`, else [`LinkError::Silent`]. One that
/// took a third of it is logged at debug, with what it was: how close the link came to
/// being taken for lost.
async fn next_within(
    silence: std::time::Duration,
    reader: &mut FrameReader<LinkRead>,
    bulk: &mut Option<Box<dyn Bulk>>,
    credit: &Arc<ChildCredit>,
) -> Result<Option<LinkEvent>, LinkError> {
    let asked = tokio::time::Instant::now();
    let Ok(next) = tokio::time::timeout(silence, next_event(reader, bulk, credit)).await else {
        return Err(LinkError::Silent(silence));
    };
    let waited = asked.elapsed();
    if waited > silence / 3 {
        let what = match &next {
            Ok(Some(event)) => event_kind(event),
            Ok(None) => "the end of the link".to_string(),
            Err(e) => e.to_string(),
        };
        tracing::debug!("a child's next frame took {} ms: {what}", waited.as_millis());
    }
    next.map_err(LinkError::from)
}

/// What an event is, for a log line.
fn event_kind(event: &LinkEvent) -> String {
    match event {
        LinkEvent::Output { data, .. } => format!("output of {} bytes", data.len()),
        LinkEvent::Spliced { .. } => "a spliced piece".to_string(),
        LinkEvent::Link(l) => format!("{l:?}"),
        LinkEvent::Up(_) => "a job message".to_string(),
        _ => "another event".to_string(),
    }
}

/// A frame from a child as an event: its output owes the child's window.
fn owe(frame: UpFrame, credit: &Arc<ChildCredit>) -> LinkEvent {
    match frame {
        UpFrame::Job(Up::Output { rank, stream, data }) => {
            let debt = Debt::new(credit.clone(), data.len());
            LinkEvent::Output { rank, stream, data, debt }
        }
        UpFrame::Job(up) => LinkEvent::Up(up),
        UpFrame::Link(link) => LinkEvent::Link(link),
    }
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
