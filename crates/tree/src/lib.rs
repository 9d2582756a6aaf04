//! rlaunch-tree: what both ends of a link of rlaunch's control tree use. rlaunch is the root
//! of the tree, and every proxy the root of its subtree: each starts its child proxies,
//! routes down to them and hears them up, and notices when one is lost, in the same way.
//!
//! ```text
//!   rlaunch ──link──► proxy ──link──► proxy ...
//!      children: starts and routes to its child proxies (fork, a remote shell, dial-in)
//!      link:     one child's process and connection, its pumps, a forked proxy's channel
//!      dialin:   the listener proxies started by a scheduler dial, over secure (Noise)
//!      credit:   how much output a child may send before its parent has written it
//!      bcast:    feeding the children the files broadcast before the ranks start
//!      splice:   output moved between pipes and sockets without copies
//!      fdio, mailbox, guard, procs, fence: descriptors, queues, the orphan guard,
//!                reaping and sweeping processes, one fence epoch folded from its parties
//! ```
//!
//! It knows nothing of ranks' programs or of PMI: the proxy (rlaunch-proxy) and the launcher
//! (rlaunch) build on it. docs/architecture.md tells the whole story.

pub mod bcast;
pub mod children;
pub mod credit;
pub mod deaths;
pub mod dialin;
pub mod fdio;
pub mod fence;
pub mod guard;
pub mod link;
pub mod mailbox;
pub mod procs;
pub mod secure;
pub mod splice;
pub mod survey;

use std::io;
use std::os::fd::AsRawFd;

/// Returns once `flag` is raised (true); never, if its sender is dropped without raising it.
/// The one-way switches of a teardown (the output dropped, the parent abandoned) are read so.
pub async fn raised(flag: &mut tokio::sync::watch::Receiver<bool>) {
    if flag.wait_for(|&up| up).await.is_err() {
        std::future::pending::<()>().await;
    }
}

/// The earliest of a dispatcher's `deadlines`, each `(when, which)` with `None` for one it does
/// not hold now: the one its loop waits on.
pub fn earliest<D>(
    deadlines: impl IntoIterator<Item = (Option<tokio::time::Instant>, D)>,
) -> Option<(tokio::time::Instant, D)> {
    deadlines
        .into_iter()
        .filter_map(|(at, which)| at.map(|at| (at, which)))
        .min_by_key(|&(at, _)| at)
}

/// Sleeps until `at`; for ever when there is none (a `select!` arm that never fires).
pub async fn sleep_until(at: Option<tokio::time::Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}

/// Points fds 0 and 1 at /dev/null: a proxy reads and writes only its control channel.
pub fn null_stdin_stdout() -> io::Result<()> {
    let null = std::fs::OpenOptions::new().read(true).write(true).open("/dev/null")?;
    for fd in [0, 1] {
        nix::unistd::dup2(null.as_raw_fd(), fd).map_err(io::Error::from)?;
    }
    Ok(())
}

/// Keeps glibc's malloc from handing output buffers back to the kernel between chunks.
/// Output travels in chunks of up to 128 KiB, glibc's default mmap threshold: each one was
/// mmapped, page-faulted in and unmapped again (docs/measurements.md, *malloc thresholds*).
/// Live memory stays bounded by the output queues either way.
pub fn tune_malloc() {
    use nix::libc::{mallopt, M_MMAP_THRESHOLD, M_TRIM_THRESHOLD};
    // SAFETY: mallopt with integer arguments, before any thread exists.
    unsafe {
        mallopt(M_MMAP_THRESHOLD, 4 << 20);
        mallopt(M_TRIM_THRESHOLD, 32 << 20);
    }
}

/// An I/O error as the end of a sentence: its description without Rust's `(os error N)`.
/// The launcher's and the proxies' errors alike (`rlaunch::quote::io_error`).
pub fn io_sentence(e: &io::Error) -> String {
    let text = e.to_string();
    match text.rfind(" (os error") {
        Some(i) => text[..i].to_string(),
        None => text,
    }
}

/// Sets up logging to stderr: `RLAUNCH_LOG` = error|warn|info|debug|trace (default warn).
pub fn init_logging() {
    let level = std::env::var("RLAUNCH_LOG")
        .ok()
        .and_then(|v| v.parse::<tracing::Level>().ok())
        .unwrap_or(tracing::Level::WARN);
    let _ = tracing_subscriber::fmt()
        .with_max_level(level)
        .with_writer(io::stderr)
        .with_target(false)
        .without_time()
        .with_ansi(false)
        .fmt_fields(tracing_subscriber::fmt::format::DefaultFields::new())
        .event_format(tracing_subscriber::fmt::format().with_target(false).without_time().compact())
        .try_init();
}
