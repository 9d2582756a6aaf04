//! rlaunch's side of splicing (the kernel moves, and the proxies' side, are
//! `rlaunch_tree::splice`'s): output moved from a link's socket into rlaunch's stdout by
//! `splice(2)` instead of read and written.
//!
//! ```text
//!  link socket ─frame head, read──► link reader ──Spliced{head, stashed, after}──► writer
//!       ├───── data, spliced ─────► Stash (pipe) ──────── spliced ───────────────┘──► stdout
//!       └───── whole lines, spliced, while the writer is idle (Direct) ──────────────► stdout
//! ```
//!
//! Lines must stay whole (ranks share rlaunch's stdout), so the link reader still finds where
//! the lines of each piece start and end, by peeking at the socket (`MSG_PEEK`,
//! `SO_PEEK_OFF`), not by reading it all: it reads the end of a line it left open (`head`),
//! splices the whole lines after it into the [`Stash`], and reads the start of the last line
//! (`after`), which waits in the writer's lane for its newline like any other
//! ([`LinkSplice`], the link's [`Bulk`]). The writer takes `head`, then the stashed bytes,
//! then `after`, so a piece reaches the sink in order and the stash is emptied in the order
//! it was filled (rlaunch's runtime has one thread, and a piece is stashed and queued with
//! nothing in between). While the writer thread has nothing queued or unwritten and stdout
//! (or stderr) is a pipe, the whole lines of a piece that leaves no line open before it are
//! spliced from the socket straight into that pipe ([`Direct`]): one splice, and no wakeup of
//! the writer; what the pipe does not take goes on through the stash as above.
//! A piece waits (briefly) for a full stash to be emptied down to half rather than be read:
//! when the reader of rlaunch's stdout is what holds the output up, copying would only take
//! CPU time from it.
//! Only output with nothing to add (no prefix, tag, timestamp or output file), for a stdout
//! or stderr that takes splices (a pipe, a socket, a file not opened for appending), and
//! only on a plain link (a socketpair to a forked proxy or to ssh; not an encrypted TCP
//! link). Anything else, and pieces too small to be worth it, is read the usual way.

use std::fs::File;
use std::io::{self, Read, Write};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use nix::libc;
use rlaunch_protocol::ids::{Gid, Stream};
use rlaunch_tree::link::ProxyProcess;
use rlaunch_tree::splice::{pipe, splice, splice_now, DRAIN};
use tokio::sync::Notify;

mod reader;

pub(crate) use reader::LinkSplice;

/// How far the reader peeks for the newline that ends a line left open. A longer line is
/// read, not spliced.
const PEEK_HEAD: usize = 64 << 10;
/// How far back from a piece's end the reader peeks for its last newline.
const PEEK_TAIL: usize = 4 << 10;
/// Half the stash's capacity (the default `pipe-max-size`).
const STASH_HALF: usize = 512 << 10;

/// rlaunch's pipe for spliced output, between its link readers (which fill it without
/// blocking) and its writer thread (which empties it into the sinks, blocking).
pub(crate) struct Stash {
    write: OwnedFd,
    read: OwnedFd,
    /// Where bytes nobody wants are spliced to.
    null: File,
    /// Bytes in the stash: filled by the link readers, emptied by the writer thread.
    level: AtomicUsize,
    /// Told when the writer thread has emptied the stash down to half.
    half_empty: Notify,
}

impl Stash {
    pub(crate) fn new() -> io::Result<Arc<Stash>> {
        let (read, write) = pipe(0)?;
        rlaunch_tree::fdio::set_nonblocking(&write)?;
        rlaunch_tree::fdio::enlarge_pipe(&write, 2 * STASH_HALF as i32);
        let null = File::options().write(true).open("/dev/null")?;
        Ok(Arc::new(Stash {
            write,
            read,
            null,
            level: AtomicUsize::new(0),
            half_empty: Notify::new(),
        }))
    }

    /// How many more bytes it takes. A link reader waits a little for room rather than read
    /// output that the stash, full because the reader of rlaunch's stdout is behind, cannot
    /// take: copying it would only take CPU time from that reader.
    pub(super) fn room(&self) -> usize {
        (STASH_HALF * 2).saturating_sub(self.level.load(Ordering::Acquire))
    }

    /// Waits until the writer thread has emptied the stash down to half (or had, since the
    /// last wait). Waiting for that much room, not for any, keeps pieces large.
    pub(super) async fn half_empty(&self) {
        self.half_empty.notified().await
    }

    /// The writer thread took `len` bytes out.
    fn emptied(&self, len: usize) {
        let sub = |level: usize| Some(level.saturating_sub(len));
        let before = self.level.fetch_update(Ordering::AcqRel, Ordering::Acquire, sub);
        let before = before.unwrap_or_else(|level| level);
        if before > STASH_HALF && before.saturating_sub(len) <= STASH_HALF {
            // Every link waiting now, and the next to wait if none is yet.
            self.half_empty.notify_waiters();
            self.half_empty.notify_one();
        }
    }

    /// Moves up to `len` bytes from `from` into the stash, without blocking: fewer when the
    /// stash is full (its reader is behind) or `from` holds less.
    pub(super) fn fill(&self, from: RawFd, len: usize) -> io::Result<usize> {
        let moved = splice_now(from, self.write.as_raw_fd(), len)?;
        self.level.fetch_add(moved, Ordering::AcqRel);
        Ok(moved)
    }

    /// Moves the next `len` bytes of the stash into `to`, waiting for room in it. On an error
    /// the rest of the `len` bytes are thrown away, so that the stash stays in step with the
    /// pieces that name it, and the error is returned.
    pub(crate) fn empty_into(&self, to: &File, len: usize) -> io::Result<()> {
        let result = self.move_into(to, len);
        self.emptied(len);
        result
    }

    fn move_into(&self, to: &File, len: usize) -> io::Result<()> {
        let mut left = len;
        while left > 0 {
            let flags = libc::SPLICE_F_MOVE | libc::SPLICE_F_NONBLOCK;
            match splice(self.read.as_raw_fd(), to.as_raw_fd(), left, flags) {
                Ok(0) => break,
                // Fewer than asked: the stash holds them all, so `to` is full. Trying
                // again at once would find room for just what its reader took meanwhile.
                Ok(n) if n < left => {
                    left -= n;
                    wait_for_room(to)
                }
                Ok(n) => left -= n,
                // Full, unless the stash is what is empty: out of step, which must not spin.
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                    if rlaunch_tree::fdio::pending(self.read.as_raw_fd())? == 0 {
                        return Err(io::Error::other("the output stash is out of step"));
                    }
                    wait_for_room(to)
                }
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                // A sink that turned out not to take splices: copy the rest.
                Err(e) if e.raw_os_error() == Some(libc::EINVAL) => {
                    return self.copy_into(to, left);
                }
                Err(e) => {
                    self.throw_away(left);
                    return Err(e);
                }
            }
        }
        Ok(())
    }

    fn copy_into(&self, to: &File, mut left: usize) -> io::Result<()> {
        let mut buf = vec![0; left.min(64 << 10)];
        // SAFETY: `read` stays open for as long as the stash; ManuallyDrop never closes it.
        let from = std::mem::ManuallyDrop::new(unsafe { File::from_raw_fd(self.read.as_raw_fd()) });
        while left > 0 {
            let want = left.min(buf.len());
            let n = (&*from).read(&mut buf[..want])?;
            if n == 0 {
                break;
            }
            left -= n;
            if let Err(e) = (&*to).write_all(&buf[..n]) {
                self.throw_away(left);
                return Err(e);
            }
        }
        Ok(())
    }

    /// Throws away the next `len` bytes of the stash (output dropped, or a sink broken).
    pub(crate) fn discard(&self, len: usize) {
        self.throw_away(len);
        self.emptied(len);
    }

    fn throw_away(&self, mut len: usize) {
        while len > 0 {
            match splice(self.read.as_raw_fd(), self.null.as_raw_fd(), len, 0) {
                Ok(0) => break,
                Ok(n) => len -= n,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => {
                    tracing::debug!("cannot empty the output stash: {e}");
                    break;
                }
            }
        }
    }
}

/// Waits until `to`, found full, has room: after [`DRAIN`], for as long as it takes.
fn wait_for_room(to: &File) {
    std::thread::sleep(DRAIN);
    let mut poll = libc::pollfd { fd: to.as_raw_fd(), events: libc::POLLOUT, revents: 0 };
    // SAFETY: one pollfd. An error (EINTR) just has the splice tried again.
    unsafe { libc::poll(&mut poll, 1, -1) };
}

/// What rlaunch splices: into its stash, the output of the streams whose sink takes it.
#[derive(Clone)]
pub(crate) struct Splicer {
    pub(crate) stash: Arc<Stash>,
    /// Stdout's, then stderr's.
    pub(crate) streams: [bool; 2],
    /// Whole lines may go straight into these sinks (stdout's, then stderr's: pipes), past
    /// the stash and the writer thread, while the writer has nothing to write.
    pub(crate) direct: Option<Direct>,
}

/// rlaunch's leave to splice a piece's whole lines straight from a link into its stdout or
/// stderr, when that is a pipe: one splice instead of two, and no wakeup of the writer
/// thread. Only while the writer has nothing queued or unwritten, and only lines that start
/// no line open in the writer's lanes (the link reader knows which): then nothing written
/// before can follow them, and nothing can come between (rlaunch's runtime has one thread,
/// and what the pipe does not take goes first to the writer, as an ordinary piece).
#[derive(Clone)]
pub(crate) struct Direct {
    pub(crate) sinks: [Option<RawFd>; 2],
    pub(crate) writer: Arc<dyn WriterState>,
}

/// What rlaunch's writer thread tells the link readers.
pub(crate) trait WriterState: Send + Sync {
    /// Nothing queued for the writer and nothing it took still unwritten; output not dropped.
    fn idle(&self) -> bool;
    /// A link reader spliced `bytes` straight into a sink.
    fn wrote(&self, bytes: usize);
}

impl Splicer {
    pub(super) fn wants(&self, stream: Stream) -> bool {
        self.streams[stream_index(stream)]
    }

    /// The sink `stream`'s whole lines may be spliced into now, if any.
    fn direct_sink(&self, stream: Stream) -> Option<(RawFd, &dyn WriterState)> {
        let direct = self.direct.as_ref()?;
        let fd = direct.sinks[stream_index(stream)]?;
        direct.writer.idle().then_some((fd, &*direct.writer))
    }

    /// Splices up to `len` bytes from `from` into `stream`'s sink without blocking, if the
    /// writer leaves it to us: how many it took (as many as the pipe had room for).
    pub(super) fn splice_direct(&self, from: RawFd, stream: Stream, len: usize) -> usize {
        let Some((to, writer)) = self.direct_sink(stream) else { return 0 };
        // Full: the rest goes through the writer. Closed: the writer finds out.
        let moved = splice_now(from, to, len).unwrap_or(0);
        writer.wrote(moved);
        moved
    }
}

fn stream_index(stream: Stream) -> usize {
    match stream {
        Stream::Stdout => 0,
        Stream::Stderr => 1,
    }
}

/// A piece of a rank's output, part of it in the stash: `head` (read), then `stashed` bytes
/// in the stash, then `after` (read). `head` is empty or ends the line the rank's stream had
/// open, so the stashed bytes start a line. Unless `whole` (the stash took fewer bytes than
/// the whole lines there were), the stashed bytes end mid-line and `after` holds the rest of
/// that line, newline included, first. When `direct` is not 0, that many bytes of whole
/// lines, before all of these, are already in the sink (see [`Direct`]); `head` is empty
/// then, and the stashed bytes may start mid-line.
pub(crate) struct Spliced {
    pub(crate) rank: Gid,
    pub(crate) stream: Stream,
    pub(crate) direct: usize,
    pub(crate) head: Vec<u8>,
    pub(crate) stashed: usize,
    pub(crate) whole: bool,
    pub(crate) after: Vec<u8>,
    pub(crate) stash: Arc<Stash>,
}

impl Spliced {
    pub(crate) fn len(&self) -> usize {
        self.direct + self.head.len() + self.stashed + self.after.len()
    }

    /// Whether anything is left for the writer: not all of it went straight to the sink.
    pub(crate) fn for_writer(&self) -> bool {
        self.len() > self.direct
    }
}

/// A piece of a large output frame, as the link reader took it from the socket.
pub(crate) enum Piece {
    Read { rank: Gid, stream: Stream, data: Vec<u8> },
    Spliced(Spliced),
}

impl Splicer {
    /// Has `process`'s link splice its large output frames into the stash (see
    /// [`LinkSplice`]), if the link is a plain socket; an encrypted one is read.
    pub(crate) fn attach(&self, process: ProxyProcess) -> ProxyProcess {
        let Some(socket) = process.plain else { return process };
        match LinkSplice::new(self.clone(), socket) {
            Ok(splice) => process.with_bulk(Box::new(splice)),
            Err(e) => {
                tracing::debug!("cannot splice output from the link: {e}");
                process
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::net::UnixStream;

    pub(super) fn lines(from: usize, count: usize, len: usize) -> Vec<u8> {
        (from..from + count)
            .flat_map(|i| {
                let mut line = format!("{i:08}").into_bytes();
                line.resize(len - 1, b'.');
                line.push(b'\n');
                line
            })
            .collect()
    }

    pub(super) fn stash_contents(stash: &Stash, len: usize) -> Vec<u8> {
        let (mut a, b) = UnixStream::pair().unwrap();
        let out = File::from(OwnedFd::from(b));
        let reader = std::thread::spawn(move || {
            let mut got = vec![0; len];
            a.read_exact(&mut got).unwrap();
            got
        });
        stash.empty_into(&out, len).unwrap();
        reader.join().unwrap()
    }
}
