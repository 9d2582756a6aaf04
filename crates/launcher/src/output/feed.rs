//! The way from the link readers to the writer thread: the [`Feed`] they send chunks of
//! output on, bounded by their links' windows, the writer's [`Queue`], and the splicer the
//! links use when lines go out as they are.

use std::os::fd::RawFd;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;

use rlaunch_protocol::ids::{Gid, Stream};
use rlaunch_tree::credit::Debt;
use rlaunch_tree::splice::{is_pipe, takes_splices};
use tokio::sync::{mpsc, watch};

use super::splice::{Direct, Spliced, Splicer, Stash, WriterState};
use super::OutputSpec;

/// With this much output queued for the writer thread, the writer is what holds it up.
const BEHIND: usize = 1 << 20;

pub(crate) enum Chunk {
    /// A rank is running; comes before any of its output.
    Started {
        rank: Gid,
        pid: u32,
    },
    Data {
        rank: Gid,
        stream: Stream,
        data: Vec<u8>,
        /// The room the chunk takes in its link's window, given back as it is taken.
        debt: Debt,
    },
    End {
        rank: Gid,
        stream: Stream,
    },
    /// Output of a rank, part of it in the stash (see `output::splice`).
    Spliced {
        output: Spliced,
        debt: Debt,
    },
    /// A line of rlaunch's own for its stderr while the job runs on (a restart): after the
    /// output queued before it, on a line of its own.
    Say(String),
}

impl Chunk {
    /// Bytes of output it carries.
    fn len(&self) -> usize {
        match self {
            Chunk::Data { data, .. } => data.len(),
            Chunk::Spliced { output, .. } => output.len(),
            _ => 0,
        }
    }
}

/// Whether the output is dropped: set once by the root, when the teardown's grace is over.
pub(crate) type Dropped = watch::Receiver<bool>;

/// The link readers' way to the writer thread: its queue (bounded by the links' windows),
/// and the flag that says the output is dropped.
#[derive(Clone)]
pub(crate) struct Feed {
    chunks: mpsc::UnboundedSender<Chunk>,
    /// Bytes of output queued and not yet taken by the writer.
    queued: Arc<AtomicUsize>,
    dropped: Dropped,
    /// Where the link readers splice output, when they do.
    splicer: Option<Splicer>,
    backlog: Arc<Backlog>,
    /// The writer wants each rank's start (its pid in a prefix, its files opened even if it
    /// writes nothing); plain output opens a rank's lanes at its first output instead.
    starts: bool,
}

/// The writer thread's end of the [`Feed`].
pub(crate) struct Queue {
    chunks: mpsc::UnboundedReceiver<Chunk>,
    queued: Arc<AtomicUsize>,
    backlog: Arc<Backlog>,
    /// Chunks taken since the writer last said it had written what it took.
    taken: usize,
}

/// The writer thread's backlog, as the link readers see it: while it has nothing to write,
/// they may splice whole lines straight into rlaunch's stdout and stderr (see
/// `splice::Direct`).
struct Backlog {
    /// Chunks queued for the writer and not yet written: taken, and their batch flushed.
    unwritten: AtomicUsize,
    /// Bytes the link readers spliced straight into the sinks.
    direct: AtomicU64,
    dropped: Dropped,
}

impl WriterState for Backlog {
    fn idle(&self) -> bool {
        self.unwritten.load(Ordering::Acquire) == 0 && !*self.dropped.borrow()
    }

    fn wrote(&self, bytes: usize) {
        self.direct.fetch_add(bytes as u64, Ordering::Relaxed);
    }
}

/// The feed and the queue it fills, for output written as `spec` says.
pub(crate) fn feed(dropped: Dropped, spec: &OutputSpec) -> (Feed, Queue) {
    let (tx, rx) = mpsc::unbounded_channel();
    let queued = Arc::new(AtomicUsize::new(0));
    let backlog = Arc::new(Backlog {
        unwritten: AtomicUsize::new(0),
        direct: AtomicU64::new(0),
        dropped: dropped.clone(),
    });
    let splicer = splicer(spec, &backlog);
    let starts = !spec.unchanged();
    let feed = Feed {
        chunks: tx,
        queued: queued.clone(),
        dropped,
        splicer,
        backlog: backlog.clone(),
        starts,
    };
    (feed, Queue { chunks: rx, queued, backlog, taken: 0 })
}

/// Output is spliced to rlaunch's stdout and stderr (those that take splices: not a
/// terminal) when lines go out as they are: no prefix, tag, timestamp or output file.
/// `RLAUNCH_SPLICE=0` turns it off.
fn splicer(spec: &OutputSpec, backlog: &Arc<Backlog>) -> Option<Splicer> {
    if !spec.unchanged() || !rlaunch_tree::splice::enabled() {
        return None;
    }
    let streams = [takes_splices(1), takes_splices(2)];
    if streams == [false, false] {
        return None;
    }
    // A pipe takes whole lines straight from the links, while the writer is idle: as many
    // as it has room for, so it is given the room a rank's pipe has.
    let pipe = |fd: RawFd| {
        let pipe = streams[fd as usize - 1] && is_pipe(fd);
        pipe.then(|| {
            grow_pipe(fd);
            fd
        })
    };
    let writer: Arc<dyn WriterState> = backlog.clone();
    // Not into stderr when it is stdout's pipe (`2>&1`): a line cut where the pipe was full
    // must end before any other, and the writer writes stdout's batch before stderr's.
    let stderr = pipe(2).filter(|_| !same_file(1, 2));
    let direct = Some(Direct { sinks: [pipe(1), stderr], writer });
    match Stash::new() {
        Ok(stash) => Some(Splicer { stash, streams, direct }),
        Err(e) => {
            tracing::debug!("no output stash: {e}");
            None
        }
    }
}

/// Whether the proxy of a job's one rank may move the rank's output into rlaunch's stdout
/// itself (`rlaunch_proxy::outputs` has the how): when rlaunch would splice it there as it
/// is, and stdout is a pipe that stderr is not (so that no line of the rank's stderr, which
/// rlaunch writes, can cut one of its stdout).
pub(crate) fn lone_rank_stdout(spec: &OutputSpec, ranks: usize) -> bool {
    let splices = spec.unchanged() && rlaunch_tree::splice::enabled();
    ranks == 1 && splices && is_pipe(1) && !same_file(1, 2)
}

/// Whether two descriptors are the same file (pipe).
fn same_file(a: RawFd, b: RawFd) -> bool {
    let id = |fd| nix::sys::stat::fstat(fd).map(|st| (st.st_dev, st.st_ino));
    matches!((id(a), id(b)), (Ok(x), Ok(y)) if x == y)
}

/// Whether `fd` is a pipe at least half full: its reader is behind.
fn pipe_backed_up(fd: RawFd) -> bool {
    let capacity = nix::fcntl::fcntl(fd, nix::fcntl::FcntlArg::F_GETPIPE_SZ).unwrap_or(0);
    let mut unread: nix::libc::c_int = 0;
    // SAFETY: FIONREAD writes one int, the bytes waiting in the pipe, into `unread`.
    let read = unsafe { nix::libc::ioctl(fd, nix::libc::FIONREAD, &mut unread) };
    capacity > 0 && read == 0 && unread as i64 * 2 >= i64::from(capacity)
}

/// Gives rlaunch's stdout or stderr pipe a rank pipe's capacity, unless it has more.
fn grow_pipe(fd: RawFd) {
    let size = nix::fcntl::fcntl(fd, nix::fcntl::FcntlArg::F_GETPIPE_SZ).unwrap_or(0);
    if size < rlaunch_tree::fdio::PIPE_CAPACITY {
        rlaunch_tree::fdio::enlarge_pipe(&fd, rlaunch_tree::fdio::PIPE_CAPACITY);
    }
}

impl Feed {
    pub(crate) fn splicer(&self) -> Option<Splicer> {
        self.splicer.clone()
    }

    /// Whether the writer is behind: output piles up in its queue, or in rlaunch's stdout
    /// pipe, so the reader of rlaunch's output (not the proxy tree) is what holds the output
    /// up. The pipe counts: output spliced into it straight from the links never enters the
    /// queue, and behind a slow reader the queue then stayed short while the pipe was full
    /// (under_load's Ctrl-C waited for the proxies' deadline in 1 run of 3).
    pub(crate) fn writer_behind(&self) -> bool {
        self.queued.load(Ordering::Relaxed) >= BEHIND || pipe_backed_up(1)
    }

    /// Whether the writer is told of each rank's start (see `starts`). Each chunk may wake
    /// the writer thread, and those wakes were most of rlaunch's CPU per rank (docs/scale.md).
    pub(crate) fn wants_starts(&self) -> bool {
        self.starts
    }

    /// Queues `chunk` for the writer; once the output is dropped, throws it away instead
    /// (except what is in the stash: the writer thread, the stash's only reader, empties it).
    /// False once the writer is gone.
    pub(crate) fn send(&self, chunk: Chunk) -> bool {
        if *self.dropped.borrow() && !matches!(chunk, Chunk::Spliced { .. }) {
            return true;
        }
        self.queued.fetch_add(chunk.len(), Ordering::Relaxed);
        self.backlog.unwritten.fetch_add(1, Ordering::AcqRel);
        self.chunks.send(chunk).is_ok()
    }
}

impl Queue {
    pub(super) fn next(&mut self) -> Option<Chunk> {
        let chunk = self.chunks.blocking_recv();
        self.taken(&chunk);
        chunk
    }

    pub(super) fn try_next(&mut self) -> Option<Chunk> {
        let chunk = self.chunks.try_recv().ok();
        self.taken(&chunk);
        chunk
    }

    fn taken(&mut self, chunk: &Option<Chunk>) {
        if let Some(chunk) = chunk {
            self.queued.fetch_sub(chunk.len(), Ordering::Relaxed);
            self.taken += 1;
        }
    }

    /// Bytes the link readers spliced straight into the sinks.
    pub(super) fn direct(&self) -> u64 {
        self.backlog.direct.load(Ordering::Relaxed)
    }

    /// What was taken is written (or thrown away): none of it can follow what the link
    /// readers splice straight into the sinks from now on.
    pub(super) fn written(&mut self) {
        self.backlog.unwritten.fetch_sub(std::mem::take(&mut self.taken), Ordering::AcqRel);
    }
}

#[cfg(test)]
mod tests {
    use std::os::fd::AsRawFd;

    use super::*;

    #[test]
    fn a_pipe_is_backed_up_once_half_full() {
        let (read, write) = nix::unistd::pipe().unwrap();
        let fd = write.as_raw_fd();
        let capacity = nix::fcntl::fcntl(fd, nix::fcntl::FcntlArg::F_GETPIPE_SZ).unwrap();
        assert!(!pipe_backed_up(fd), "empty");
        let half = vec![b'x'; capacity as usize / 2];
        nix::unistd::write(&write, &half[..half.len() - 1]).unwrap();
        assert!(!pipe_backed_up(fd), "just under half");
        nix::unistd::write(&write, b"x").unwrap();
        assert!(pipe_backed_up(fd), "half");
        assert!(pipe_backed_up(read.as_raw_fd()), "either end tells");
        let file = std::fs::File::open("/proc/self/status").unwrap();
        assert!(!pipe_backed_up(file.as_raw_fd()), "not a pipe");
    }
}
