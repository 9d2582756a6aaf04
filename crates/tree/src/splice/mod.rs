//! Output moved by the kernel (`splice(2)`) instead of copied through the proxy and rlaunch.
//!
//! ```text
//!  rank pipe ─splice─► carrier ─splice─► upstream socket        (a proxy: `Carriers`)
//!  link socket ─frame head, read──► link reader ──► Bulk::next_piece (rlaunch: its stash)
//! ```
//!
//! **In a proxy** whose channel up is a socket or pipe of its own, a chunk of a rank's output
//! is moved out of the rank's pipe into a carrier (a pipe of the chunk's own) and spliced from
//! there into the socket after its frame head, by the pump ([`carrier`]).
//!
//! **At a link's reader**, an output frame of [`SPLICE_MIN`] bytes or more, on a link that
//! has a [`Bulk`], is not read: the reader takes the frame's head and hands the rest to the
//! `Bulk`, piece by piece. rlaunch's `Bulk` splices whole lines into its stdout (the
//! launcher's `output::splice`); the pieces it took come back to it through the link's
//! events, each owing its room in the link's window as read output does.
//!
//! The pages the rank wrote into its pipe are then the pages the reader of rlaunch's stdout
//! reads: four copies of each byte fewer. `RLAUNCH_SPLICE=0` turns it all off.

use std::any::Any;
use std::future::Future;
use std::io;
use std::os::fd::{FromRawFd, OwnedFd, RawFd};
use std::pin::Pin;

use nix::libc;
use rlaunch_protocol::control::{Frame, Up};
use rlaunch_protocol::ids::{Gid, Stream};
use rlaunch_protocol::io::ReadError;
use tokio::io::unix::AsyncFd;
use tokio::io::Interest;

mod carrier;

pub use carrier::{target, Carried, Carriers, Gone};

/// A piece of output with fewer bytes than this to splice is read instead: a splice and the
/// peeks around it cost more than copying a few KiB.
pub const SPLICE_MIN: usize = 16 << 10;
/// A link reader that splices reads this much at a time after each large output frame: the
/// head of an output frame (length, tag, rank and stream), so that none of the next frame's
/// data is read with it (more while reads come back full of small frames).
pub const READ_CHUNK: usize = rlaunch_protocol::control::FRAME_HEAD + <Up as Frame>::DATA_HEAD;

/// Where a link's reader hands the rest of a large output frame instead of reading it
/// (rlaunch's stash: its `output::splice::LinkSplice`). Its methods are called in the
/// reader's task, in the order the frames come.
pub trait Bulk: Send {
    /// Output of a rank's stream was read the usual way (it may leave a line open).
    fn saw(&mut self, rank: Gid, stream: Stream, data: &[u8]);
    /// An output frame of `rank`'s `stream` begins with `first`, and its next `rest` bytes
    /// are still in the socket: [`Bulk::next_piece`] takes them all, `first` with them.
    fn begin(&mut self, rank: Gid, stream: Stream, first: Vec<u8>, rest: usize);
    /// Whether a frame's data is still to be taken.
    fn busy(&self) -> bool;
    /// The next piece of the frame begun, once the socket holds some of it. Cancel-safe: it
    /// only waits before it takes anything.
    fn next_piece(&mut self)
        -> Pin<Box<dyn Future<Output = Result<Piece, ReadError>> + Send + '_>>;
}

/// A piece of a large output frame, as a [`Bulk`] took it from the socket.
pub enum Piece {
    Read {
        rank: Gid,
        stream: Stream,
        data: Vec<u8>,
    },
    /// Output the `Bulk` took its own way: `len` bytes of it, described as the `Bulk` likes
    /// (it comes back to its owner in `LinkEvent::Spliced`).
    Taken {
        len: usize,
        output: Box<dyn Any + Send>,
    },
}

/// How long a writer that found its sink (a pipe) full lets the sink's reader drain it before
/// it waits for room: a pipe wakes its writer as soon as a read frees any, and a reader that
/// reads 16 KiB at a time (`wc`) would otherwise have the writer refill 16 KiB after each read,
/// two context switches a time (docs/measurements.md, *Drain pause*). A sink is only full
/// when its reader is what holds the output up, so the pause delays nothing.
pub const DRAIN: std::time::Duration = std::time::Duration::from_micros(100);

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
pub fn registered_dup(fd: RawFd, interest: Interest) -> io::Result<AsyncFd<OwnedFd>> {
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

#[cfg(test)]
mod tests {
    use super::*;
    use std::fs::File;
    use std::os::fd::AsRawFd;
    use std::os::unix::net::UnixStream;

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
