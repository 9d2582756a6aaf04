//! rlaunch-proxy: one per node. It starts the node's ranks and the proxies below it in the
//! control tree, relays their output, stdin, signals and exits, and cleans up after them.
//!
//! ```text
//!            parent (rlaunch or a proxy)
//!                 │ control channel = this process's stdin/stdout
//!          ┌──────┴───────┐
//!          │ rlaunch-proxy │── rank, rank, ...   (own process group each, piped stdio)
//!          └──────┬───────┘
//!          child proxies (fork or ssh), same protocol
//! ```
//!
//! Start reading at [`node::serve`], the event loop. It routes; the decisions are made by
//! pure state machines with unit tests of their own:
//!
//! * [`ranks`]: the node's ranks, and the one place a rank's end is judged;
//! * [`kvs`]: a job's puts, gets, fences and node attributes on this node;
//! * `rlaunch_tree::fence`: one fence epoch folded from its parties (also the launcher's);
//! * [`kill`]: SIGTERM, grace, SIGKILL, then the child proxies.
//!
//! The tree's own parts, shared with the launcher (the root of the same tree), are
//! rlaunch-tree's: starting child proxies and routing to them, links, the dial-in listener,
//! credit, splice, process bookkeeping, fences. docs/architecture.md tells the whole story.

mod kill;
mod kvs;
pub mod node;
mod outputs;
mod place;
pub mod pmi;
pub mod pmix;
pub mod rank;
mod ranks;
pub mod rendezvous;
pub mod singleton;
mod spawn;
mod stacks;

use std::ffi::OsString;
use std::io;
use std::os::fd::{AsFd, AsRawFd, FromRawFd, OwnedFd};

use rlaunch_protocol::control::{Bootstrap, Job, Launch, NodePlan};
use rlaunch_tree::fdio::FdStream;
use rlaunch_tree::secure::PARENT_VAR;
use rlaunch_tree::{link, null_stdin_stdout, secure};

/// Runs a proxy on the control channel `input`/`output` (its parent's) to the end; child
/// proxies are started as `proxy_exe`. Returns the process's exit code. The caller has moved
/// the channel off stdin/stdout. `launch` is given to a proxy forked from rlaunch, which then
/// reads no hello and no Launch frame; an exec'd proxy reads both from `input`.
pub fn run(
    input: OwnedFd,
    output: OwnedFd,
    proxy_exe: OsString,
    forked: Option<node::Forked>,
) -> i32 {
    // An exec'd proxy may be across a remote shell: its guard watches this channel.
    let plain = node::PlainChannel {
        input: input.as_raw_fd(),
        output: output.as_raw_fd(),
        guarded: forked.is_none(),
    };
    runtime().block_on(async {
        let channel = FdStream::new(input).and_then(|i| Ok((i, FdStream::new(output)?)));
        match channel {
            Ok((up_in, up_out)) => {
                let (up_in, up_out) = (Box::new(up_in), Box::new(up_out));
                match node::serve(up_in, up_out, proxy_exe, forked, own_host(), None, Some(plain))
                    .await
                {
                    node::Served::Exit(code) => code,
                    node::Served::Redirect(_) => {
                        eprintln!("rlaunch-proxy: its parent sent it to dial elsewhere");
                        1
                    }
                }
            }
            Err(e) => {
                eprintln!("rlaunch-proxy: the control channel is not a pipe or socket: {e}");
                1
            }
        }
    })
}

/// Starts a proxy for this machine in a child of the calling process, which runs the proxy's
/// code directly: no exec, no second program to load. A local job's proxy is one exec fewer,
/// about a fifth of `rlaunch -n 1`'s time. The child (see [`link::fork_child`]) has
/// /dev/null on stdin/stdout like an exec'd proxy. It already holds its launch (`job` and
/// `node`, copied in the child), so it starts its ranks at once instead of waiting for
/// rlaunch's runtime to send them; and, still single-threaded, it forks its own child
/// proxies on this machine the same way (fake nodes, `--launcher fork`: a tree of 1024
/// proxies with no exec, where each exec of the static proxy costs its start-up, glibc's
/// probing of the CPU's caches included). `close` are descriptors the child must not keep.
/// `stdout`: the child keeps a copy of rlaunch's stdout, to move a lone rank's output into
/// (see `outputs::direct`). `top`: its parent is rlaunch.
///
/// # Safety
/// The calling process must have one thread: the child of a multithreaded fork may only
/// make async-signal-safe calls, and this one goes on to run a tokio runtime.
pub unsafe fn fork_proxy(
    proxy_exe: &std::ffi::OsStr,
    close: &[std::os::fd::RawFd],
    job: &Job,
    node: &NodePlan,
    stdout: bool,
    top: bool,
) -> io::Result<link::ForkedProxy> {
    let body = |theirs: OwnedFd| {
        let stdout = stdout.then(|| std::io::stdout().as_fd().try_clone_to_owned()).transpose();
        let set_up = stdout.and_then(|stdout| {
            null_stdin_stdout()?;
            Ok((theirs.try_clone()?, stdout))
        });
        match set_up {
            Ok((input, stdout)) => {
                // What the parent freed into malloc's fast bins is consolidated once here,
                // not by each child in pages it must first copy (malloc_consolidate was a
                // seventh of the proxies' CPU time at 1024 fake nodes).
                // SAFETY: malloc_trim only rearranges this process's own heap.
                unsafe { nix::libc::malloc_trim(0) };
                let mut shut = vec![theirs.as_raw_fd(), input.as_raw_fd()];
                shut.extend(stdout.as_ref().map(|s| s.as_raw_fd()));
                // SAFETY: this child has one thread, as fork_child's children do.
                let children = unsafe { fork_children(proxy_exe, shut, job, node) };
                let launch = Launch { job: job.clone(), node: node.clone(), late: false, top };
                let forked = node::Forked { launch, stdout, children };
                run(input, theirs, proxy_exe.to_owned(), Some(forked))
            }
            Err(e) => {
                eprintln!("rlaunch-proxy: cannot set up its control channel: {e}");
                1
            }
        }
    };
    // SAFETY: single-threaded, as our caller promises.
    unsafe { link::fork_child(close, body) }
}

/// Forks the child proxies of `node` that run on this machine (see [`fork_proxy`]), by the
/// index of each in `node.children`; `None` for one started otherwise (a remote shell, or
/// dialing in). `shut`: this process's descriptors that none of them may keep.
///
/// # Safety
/// As [`fork_proxy`]'s.
unsafe fn fork_children(
    proxy_exe: &std::ffi::OsStr,
    mut shut: Vec<std::os::fd::RawFd>,
    job: &Job,
    node: &NodePlan,
) -> Vec<Option<io::Result<link::ForkedProxy>>> {
    let here = |child: &NodePlan| match job.bootstrap {
        Bootstrap::Dial => false,
        Bootstrap::Fork => true,
        Bootstrap::Remote { .. } => child.fork,
    };
    node.children
        .iter()
        .map(|child| {
            here(child).then(|| {
                // SAFETY: single-threaded, as our caller promises.
                let forked = unsafe { fork_proxy(proxy_exe, &shut, job, child, false, false) };
                if let Ok(proxy) = &forked {
                    shut.push(proxy.channel.as_raw_fd());
                }
                forked
            })
        })
        .collect()
}

/// Where a proxy started by a scheduler's launcher (srun) finds its parent: the address to
/// dial and the job's secret, from its environment.
pub struct Dial {
    pub parent: std::net::SocketAddr,
    pub secret: secure::Secret,
    /// How long it waits for its parent's answer (the job's silence timeout).
    pub wait: std::time::Duration,
}

impl Dial {
    /// `Ok(None)`: this proxy was not started to dial. Removes the variables from the
    /// process's environment (before any thread exists), so nothing it starts inherits the
    /// secret.
    pub fn from_env() -> Result<Option<Dial>, String> {
        let Some(parent) = std::env::var_os(PARENT_VAR) else { return Ok(None) };
        let secret = std::env::var_os(secure::SECRET_VAR);
        let wait = std::env::var_os(secure::WAIT_VAR);
        // SAFETY: called from main before any other thread exists.
        unsafe {
            std::env::remove_var(PARENT_VAR);
            std::env::remove_var(secure::SECRET_VAR);
            std::env::remove_var(secure::WAIT_VAR);
        }
        let wait = match wait {
            None => DIAL_WAIT,
            Some(w) => w
                .to_str()
                .and_then(|w| w.parse::<f64>().ok())
                .and_then(|w| std::time::Duration::try_from_secs_f64(w).ok())
                .filter(|w| !w.is_zero())
                .ok_or_else(|| {
                    // Cut: the value is not ours to echo whole.
                    format!(
                        "{} is not a number of seconds: {:.64}",
                        secure::WAIT_VAR,
                        w.to_string_lossy()
                    )
                })?,
        };
        let parent = parent.to_str().and_then(|p| p.parse().ok()).ok_or_else(|| {
            format!("{PARENT_VAR} is not an address:port: {:?}", parent.to_string_lossy())
        })?;
        let secret = secret
            .and_then(|s| s.to_str().and_then(secure::Secret::from_hex))
            .ok_or_else(|| format!("{} is missing or malformed", secure::SECRET_VAR))?;
        Ok(Some(Dial { parent, secret, wait }))
    }
}

/// How long a dialing proxy tries to reach its parent and prove itself, unless its launcher
/// says (`secure::WAIT_VAR`).
const DIAL_WAIT: std::time::Duration = std::time::Duration::from_secs(30);

/// Runs a proxy that dials its parent (started by a scheduler's launcher, whose stdio is
/// not a channel of its own): connects, proves it holds the job's secret, and serves over
/// the encrypted link. Its name is the scheduler's for its node (`SLURMD_NODENAME`), else
/// the host name: its parent finds its place in the tree by it.
pub fn run_dialing(dial: Dial, proxy_exe: OsString) -> i32 {
    let host = std::env::var("SLURMD_NODENAME").ok().filter(|n| !n.is_empty());
    let host = host.unwrap_or_else(own_host);
    runtime().block_on(async {
        let mut parent = dial.parent;
        // rlaunch first; then, for a proxy deeper in the tree, the parent rlaunch names.
        for _ in 0..MAX_REDIRECTS {
            let connected = async {
                let stream = tokio::net::TcpStream::connect(parent).await?;
                stream.set_nodelay(true)?;
                let ip = stream.local_addr()?.ip();
                let (r, w) = stream.into_split();
                let link = secure::connect(r, w, &dial.secret, dial.wait)
                    .await
                    .map_err(io::Error::other)?;
                Ok::<_, io::Error>((link, ip))
            };
            let whom = if parent == dial.parent { "rlaunch" } else { "its parent proxy" };
            let (link, ip) = match tokio::time::timeout(dial.wait, connected).await {
                Ok(Ok(connected)) => connected,
                Ok(Err(e)) => {
                    eprintln!("rlaunch-proxy on {host}: cannot reach {whom} at {parent}: {e}");
                    return 1;
                }
                Err(_) => {
                    eprintln!("rlaunch-proxy on {host}: no answer from {whom} at {parent}");
                    return 1;
                }
            };
            let context = node::DialContext { secret: dial.secret.clone(), ip };
            let (up_in, up_out) = (Box::new(link.reader), Box::new(link.writer));
            let exe = proxy_exe.clone();
            match node::serve(up_in, up_out, exe, None, host.clone(), Some(context), None).await {
                node::Served::Exit(code) => return code,
                node::Served::Redirect(to) => match to.parse() {
                    Ok(to) => parent = to,
                    Err(_) => {
                        eprintln!("rlaunch-proxy on {host}: sent to dial a bad address");
                        return 1;
                    }
                },
            }
        }
        eprintln!("rlaunch-proxy on {host}: sent elsewhere {MAX_REDIRECTS} times");
        1
    })
}

/// A proxy is sent on once (from rlaunch to its parent); more is a loop.
const MAX_REDIRECTS: usize = 4;

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread().enable_all().build().expect("tokio runtime")
}

fn own_host() -> String {
    hostname::get().map(|h| h.to_string_lossy().into_owned()).unwrap_or_default()
}

/// Moves the control channel off stdin/stdout (so nothing the proxy or a library prints can
/// corrupt it) and points fds 0 and 1 at /dev/null.
pub fn take_stdio_channel() -> io::Result<(OwnedFd, OwnedFd)> {
    use nix::fcntl::{fcntl, FcntlArg};
    let dup = |fd: i32| -> io::Result<OwnedFd> {
        let new = fcntl(fd, FcntlArg::F_DUPFD_CLOEXEC(3)).map_err(io::Error::from)?;
        // SAFETY: `new` was just created and is owned by nobody else.
        Ok(unsafe { OwnedFd::from_raw_fd(new) })
    };
    let input = dup(0)?;
    let output = dup(1)?;
    null_stdin_stdout()?;
    Ok((input, output))
}
