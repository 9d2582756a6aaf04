//! Output moved by the kernel (`splice(2)`) instead of copied through the proxy and rlaunch.
//!
//! ```text
//!  rank pipe ─splice─► carrier ─splice─► upstream socket        (a proxy: `Carriers`)
//!  link socket ─frame head, read──► link reader ──Spliced{head, stashed, after}──► writer
//!       ├───── data, spliced ─────► Stash (pipe) ──────── spliced ───────────────┘──► stdout
//!       └───── whole lines, spliced, while the writer is idle (Direct) ──────────────► stdout
//! ```
//!
//! **In a proxy** whose channel up is a socket or pipe of its own, a chunk of a rank's output
//! is moved out of the rank's pipe into a carrier (a pipe of the chunk's own) and spliced from
//! there into the socket after its frame head, by the pump ([`carrier`]).
//!
//! **In rlaunch**, lines must stay whole (ranks share its stdout), so the link reader still
//! finds where the lines of each piece start and end, by peeking at the socket (`MSG_PEEK`,
//! `SO_PEEK_OFF`), not by reading it all: it reads the end of a line it left open (`head`),
//! splices the whole lines after it into the [`Stash`], and reads the start of the last line
//! (`after`), which waits in the writer's lane for its newline like any other
//! ([`reader`]). The writer takes `head`, then the stashed bytes, then `after`, so a piece
//! reaches the sink in order and the stash is emptied in the order it was filled (rlaunch's
//! runtime has one thread, and a piece is stashed and queued with nothing in between).
//! While the writer thread has nothing queued or unwritten and stdout (or stderr) is a pipe,
//! the whole lines of a piece that leaves no line open before it are spliced from the socket
//! straight into that pipe ([`Direct`]): one splice, and no wakeup of the writer; what the
//! pipe does not take goes on through the stash as above.
//! A piece waits (briefly) for a full stash to be emptied down to half rather than be read:
//! when the reader of rlaunch's stdout is what holds the output up, copying would only take
//! CPU time from it.
//! Only output with nothing to add (no prefix, tag, timestamp or output file), for a stdout
//! or stderr that takes splices (a pipe, a socket, a file not opened for appending), and
//! only on a plain link (a socketpair to a forked proxy or to ssh; not an encrypted TCP
//! link). Anything else, and pieces too small to be worth it, is read the usual way.
//!
//! The pages the rank wrote into its pipe are then the pages the reader of rlaunch's stdout
//! reads: four copies of each byte fewer. `RLAUNCH_SPLICE=0` turns it all off.

use rlaunch_protocol::ids::Gid;
use std::fs::File;
use std::io::{self, Read, Write};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use nix::libc;
use rlaunch_protocol::control::{Frame, Up};
use rlaunch_protocol::ids::Stream;
use tokio::io::unix::AsyncFd;
use tokio::io::Interest;
use tokio::sync::Notify;

mod carrier;
mod reader;

pub use carrier::{target, Carried, Carriers, Gone};
pub use reader::LinkSplice;

/// A piece of output with fewer bytes than this to splice is read instead: a splice and the
/// peeks around it cost more than copying a few KiB.
pub const SPLICE_MIN: usize = 16 << 10;
/// A link reader that splices reads this much at a time after each large output frame: the
/// head of an output frame (length, tag, rank and stream), so that none of the next frame's
/// data is read with it (more while reads come back full of small frames).
pub const READ_CHUNK: usize = rlaunch_protocol::control::FRAME_HEAD + <Up as Frame>::DATA_HEAD;
/// How far the reader peeks for the newline that ends a line left open. A longer line is
/// read, not spliced.
const PEEK_HEAD: usize = 64 << 10;
/// How far back from a piece's end the reader peeks for its last newline.
const PEEK_TAIL: usize = 4 << 10;
/// Half the stash's capacity (the default `pipe-max-size`).
const STASH_HALF: usize = 512 << 10;

/// rlaunch's pipe for spliced output, between its link readers (which fill it without
/// blocking) and its writer thread (which empties it into the sinks, blocking).
pub struct Stash {
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
    pub fn new() -> io::Result<Arc<Stash>> {
        let (read, write) = pipe(0)?;
        crate::fdio::set_nonblocking(&write)?;
        crate::fdio::enlarge_pipe(&write, 2 * STASH_HALF as i32);
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
    pub fn empty_into(&self, to: &File, len: usize) -> io::Result<()> {
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
                    if crate::fdio::pending(self.read.as_raw_fd())? == 0 {
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
    pub fn discard(&self, len: usize) {
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

/// How long a writer that found its sink (a pipe) full lets the sink's reader drain it before
/// it waits for room: a pipe wakes its writer as soon as a read frees any, and a reader that
/// reads 16 KiB at a time (`wc`) would otherwise have the writer refill 16 KiB after each read,
/// two context switches a time (docs/measurements.md, *Drain pause*). A sink is only full
/// when its reader is what holds the output up, so the pause delays nothing.
pub const DRAIN: std::time::Duration = std::time::Duration::from_micros(100);

/// Waits until `to`, found full, has room: after [`DRAIN`], for as long as it takes.
fn wait_for_room(to: &File) {
    std::thread::sleep(DRAIN);
    let mut poll = libc::pollfd { fd: to.as_raw_fd(), events: libc::POLLOUT, revents: 0 };
    // SAFETY: one pollfd. An error (EINTR) just has the splice tried again.
    unsafe { libc::poll(&mut poll, 1, -1) };
}

/// Moves up to `len` bytes from `from` to `to` without blocking: fewer when `to` (a pipe) is
/// full or `from` holds less. An error once some bytes moved only stops it.
pub fn splice_now(from: RawFd, to: RawFd, len: usize) -> io::Result<usize> {
    let mut moved = 0;
    while moved < len {
        match splice(from, to, len - moved, libc::SPLICE_F_MOVE | libc::SPLICE_F_NONBLOCK) {
            Ok(0) => break,
            Ok(n) => moved += n,
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) if moved > 0 => {
                tracing::debug!("splicing output stopped: {e}");
                break;
            }
            Err(e) => return Err(e),
        }
    }
    Ok(moved)
}

pub fn splice(from: RawFd, to: RawFd, len: usize, flags: libc::c_uint) -> io::Result<usize> {
    // SAFETY: plain fds; null offsets (both ends are pipes or sockets, or a file at its
    // current position).
    let n =
        unsafe { libc::splice(from, std::ptr::null_mut(), to, std::ptr::null_mut(), len, flags) };
    if n < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(n as usize)
}

/// A new pipe (read end, write end), close-on-exec, with `flags` (`O_NONBLOCK`) on both.
pub fn pipe(flags: libc::c_int) -> io::Result<(OwnedFd, OwnedFd)> {
    let mut fds = [0; 2];
    // SAFETY: pipe2 writes two fds into the array; both are owned from here on.
    if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC | flags) } != 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: just created, owned by nobody else.
    Ok(unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) })
}

/// A duplicate of `fd` (borrowed), registered with the reactor on its own: for splicing
/// from or into a stream whose reads or writes another owner does.
fn registered_dup(fd: RawFd, interest: Interest) -> io::Result<AsyncFd<OwnedFd>> {
    // SAFETY: F_DUPFD_CLOEXEC returns a new fd, owned from here on.
    let dup = unsafe { libc::fcntl(fd, libc::F_DUPFD_CLOEXEC, 0) };
    if dup < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: just created, owned by nobody else.
    let dup = unsafe { OwnedFd::from_raw_fd(dup) };
    // SAFETY: the OwnedFd stays open, and is the same fd, for as long as the AsyncFd owns it.
    unsafe { AsyncFd::register_with_interest(dup, interest) }.map_err(|e| e.into_parts().1)
}

/// Reads exactly `len` bytes that `fd` (a socket or pipe) already holds.
pub fn read_exact_now(fd: RawFd, len: usize) -> io::Result<Vec<u8>> {
    let mut buf = Vec::with_capacity(len);
    while buf.len() < len {
        let want = len - buf.len();
        let spare = buf.spare_capacity_mut();
        // SAFETY: read writes at most `want` bytes into the spare capacity, which holds that
        // many; the length grows by what it reports.
        let n = unsafe { libc::read(fd, spare.as_mut_ptr().cast(), want) };
        match n {
            0 => return Err(io::ErrorKind::UnexpectedEof.into()),
            n if n > 0 => unsafe { buf.set_len(buf.len() + n as usize) },
            _ => {
                let e = io::Error::last_os_error();
                if e.kind() != io::ErrorKind::Interrupted {
                    return Err(e);
                }
            }
        }
    }
    Ok(buf)
}

/// Whether output may be spliced: `RLAUNCH_SPLICE=0` says no (rlaunch and its proxies then
/// copy it, for comparison).
pub fn enabled() -> bool {
    std::env::var_os("RLAUNCH_SPLICE").is_none_or(|v| v != "0")
}

/// Whether `fd` takes splices from a pipe: a pipe, a socket, or a regular file not opened
/// for appending (`>>`; splice refuses those). Not a terminal.
pub fn takes_splices(fd: RawFd) -> bool {
    match file_type(fd) {
        Some(libc::S_IFIFO | libc::S_IFSOCK) => true,
        Some(libc::S_IFREG) => {
            // SAFETY: fcntl(F_GETFL) reads the flags.
            let flags = unsafe { libc::fcntl(fd, libc::F_GETFL) };
            flags >= 0 && flags & libc::O_APPEND == 0
        }
        _ => false,
    }
}

/// Whether `fd` is a pipe: a link's socket splices into it directly.
pub fn is_pipe(fd: RawFd) -> bool {
    file_type(fd) == Some(libc::S_IFIFO)
}

/// The type bits of `fd`'s mode (`S_IFIFO`, ...), if it can be asked.
fn file_type(fd: RawFd) -> Option<libc::mode_t> {
    // SAFETY: fstat writes one struct stat.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    (unsafe { libc::fstat(fd, &mut st) } == 0).then_some(st.st_mode & libc::S_IFMT)
}

/// What rlaunch splices: into its stash, the output of the streams whose sink takes it.
#[derive(Clone)]
pub struct Splicer {
    pub stash: Arc<Stash>,
    /// Stdout's, then stderr's.
    pub streams: [bool; 2],
    /// Whole lines may go straight into these sinks (stdout's, then stderr's: pipes), past
    /// the stash and the writer thread, while the writer has nothing to write.
    pub direct: Option<Direct>,
}

/// rlaunch's leave to splice a piece's whole lines straight from a link into its stdout or
/// stderr, when that is a pipe: one splice instead of two, and no wakeup of the writer
/// thread. Only while the writer has nothing queued or unwritten, and only lines that start
/// no line open in the writer's lanes (the link reader knows which): then nothing written
/// before can follow them, and nothing can come between (rlaunch's runtime has one thread,
/// and what the pipe does not take goes first to the writer, as an ordinary piece).
#[derive(Clone)]
pub struct Direct {
    pub sinks: [Option<RawFd>; 2],
    pub writer: Arc<dyn WriterState>,
}

/// What rlaunch's writer thread tells the link readers.
pub trait WriterState: Send + Sync {
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
pub struct Spliced {
    pub rank: Gid,
    pub stream: Stream,
    pub direct: usize,
    pub head: Vec<u8>,
    pub stashed: usize,
    pub whole: bool,
    pub after: Vec<u8>,
    pub stash: Arc<Stash>,
}

impl Spliced {
    pub fn len(&self) -> usize {
        self.direct + self.head.len() + self.stashed + self.after.len()
    }

    /// Whether anything is left for the writer: not all of it went straight to the sink.
    pub fn for_writer(&self) -> bool {
        self.len() > self.direct
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// A piece of a large output frame, as the link reader took it from the socket.
pub enum Piece {
    Read { rank: Gid, stream: Stream, data: Vec<u8> },
    Spliced(Spliced),
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

    #[test]
    fn pipes_sockets_and_plain_files_take_splices_and_appended_files_do_not() {
        let dir = std::env::temp_dir().join(format!("rlaunch-splice-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let plain = File::create(dir.join("a")).unwrap();
        let appended = File::options().append(true).create(true).open(dir.join("b")).unwrap();
        let (a, _b) = UnixStream::pair().unwrap();
        let null = File::options().write(true).open("/dev/null").unwrap();
        assert!(takes_splices(plain.as_raw_fd()));
        assert!(!takes_splices(appended.as_raw_fd()));
        assert!(takes_splices(a.as_raw_fd()));
        assert!(!takes_splices(null.as_raw_fd()));
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
