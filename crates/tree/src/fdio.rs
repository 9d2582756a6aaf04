//! Async reads and writes on any pollable file descriptor: pipes, sockets, ttys.
//!
//! tokio's own types each want one kind of fd; the control channel is a socketpair under
//! fork and a pair of pipes under ssh, and rank stdio is pipes. One small type serves them all.

use std::io;
use std::os::fd::{AsRawFd, OwnedFd};
use std::pin::Pin;
use std::task::{ready, Context, Poll};

use nix::fcntl::{fcntl, FcntlArg, OFlag};
use nix::libc;
use tokio::io::unix::AsyncFd;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

/// A non-blocking fd registered with the tokio reactor.
pub struct FdStream {
    fd: AsyncFd<OwnedFd>,
}

impl FdStream {
    /// Takes ownership of `fd` and makes it non-blocking. Fails for fds epoll cannot watch
    /// (regular files).
    pub fn new(fd: OwnedFd) -> io::Result<FdStream> {
        set_nonblocking(&fd)?;
        // SAFETY: the OwnedFd stays open, and is the same fd, for as long as the AsyncFd owns it.
        let fd = unsafe { AsyncFd::register(fd) }.map_err(|e| e.into_parts().1)?;
        Ok(FdStream { fd })
    }

    pub fn as_raw_fd(&self) -> i32 {
        self.fd.get_ref().as_raw_fd()
    }
}

/// Capacity asked of a rank's output pipe. With the default 64 KiB a rank that writes fast
/// and the proxy that drains it take turns, a context switch per 64 KiB; 1 MiB lets both run.
/// It is the kernel's default `pipe-max-size`, so it is granted without privilege, and pages
/// are only allocated as they fill. See [`rank_pipe_capacity`] for many ranks.
pub const PIPE_CAPACITY: i32 = 1 << 20;

/// A pipe's default capacity.
const PIPE_DEFAULT: i32 = 64 << 10;

/// The capacity to ask for each stdout pipe of `ranks` ranks on a node.
///
/// A user other than root is held to a quota of pipe pages over all of its pipes
/// (`/proc/sys/fs/pipe-user-pages-soft`, 64 MiB by default), which counts a pipe's capacity,
/// not what it holds. Enlarging a pipe past it is refused, and once a user is at it, every
/// new pipe the user makes (a rank's `popen`, another job of the same user on the node) gets
/// 8 KiB. 64 rank pipes of 1 MiB are the whole default quota; so the ranks' pipes take at
/// most a quarter of it between them: 1 MiB each for up to 16 ranks, 256 KiB for 64, the
/// default 64 KiB from 256.
pub fn rank_pipe_capacity(ranks: usize) -> i32 {
    static QUOTA: std::sync::OnceLock<Option<u64>> = std::sync::OnceLock::new();
    let quota = *QUOTA.get_or_init(|| {
        if nix::unistd::geteuid().is_root() {
            return None;
        }
        let soft = std::fs::read_to_string("/proc/sys/fs/pipe-user-pages-soft").ok()?;
        let pages: u64 = soft.trim().parse().ok()?;
        let page = nix::unistd::sysconf(nix::unistd::SysconfVar::PAGE_SIZE).ok()??;
        (pages > 0).then(|| pages * page as u64)
    });
    capacity_within(quota, ranks)
}

/// [`rank_pipe_capacity`] with the user's quota in bytes (`None`: none).
fn capacity_within(quota: Option<u64>, ranks: usize) -> i32 {
    let Some(quota) = quota else { return PIPE_CAPACITY };
    let share = quota / 4 / ranks.max(1) as u64;
    if share >= PIPE_CAPACITY as u64 {
        return PIPE_CAPACITY;
    }
    if share <= PIPE_DEFAULT as u64 {
        return PIPE_DEFAULT;
    }
    // The kernel rounds a capacity up to a power of two pages: round down instead.
    1 << share.ilog2()
}

/// Asks for a larger pipe buffer; best effort (a user at its pipe-pages quota keeps what the
/// pipe has).
pub fn enlarge_pipe(fd: &impl AsRawFd, size: i32) {
    if let Err(e) = fcntl(fd.as_raw_fd(), FcntlArg::F_SETPIPE_SZ(size)) {
        tracing::debug!("cannot enlarge a pipe to {size} bytes: {e}");
    }
}

pub fn set_nonblocking(fd: &impl AsRawFd) -> io::Result<()> {
    let flags = fcntl(fd.as_raw_fd(), FcntlArg::F_GETFL).map_err(io::Error::from)?;
    let flags = OFlag::from_bits_retain(flags) | OFlag::O_NONBLOCK;
    fcntl(fd.as_raw_fd(), FcntlArg::F_SETFL(flags)).map_err(io::Error::from)?;
    Ok(())
}

impl AsyncRead for FdStream {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        loop {
            let mut guard = ready!(self.fd.poll_read_ready(cx))?;
            // SAFETY: read(2) writes at most `unfilled.len()` bytes into the uninitialised
            // tail and we mark exactly the bytes it reports as filled.
            let unfilled = unsafe { buf.unfilled_mut() };
            let res = guard.try_io(|fd| {
                let n = unsafe {
                    libc::read(fd.as_raw_fd(), unfilled.as_mut_ptr().cast(), unfilled.len())
                };
                if n < 0 {
                    Err(io::Error::last_os_error())
                } else {
                    Ok(n as usize)
                }
            });
            match res {
                Ok(Ok(n)) => {
                    unsafe { buf.assume_init(n) };
                    buf.advance(n);
                    return Poll::Ready(Ok(()));
                }
                Ok(Err(e)) => return Poll::Ready(Err(e)),
                Err(_would_block) => continue,
            }
        }
    }
}

impl FdStream {
    /// Runs `write` (a write(2) or writev(2) on the fd, returning its result) once the fd is
    /// writable, again after each spurious readiness.
    fn poll_write_with(
        &self,
        cx: &mut Context<'_>,
        mut write: impl FnMut(i32) -> isize,
    ) -> Poll<io::Result<usize>> {
        loop {
            let mut guard = ready!(self.fd.poll_write_ready(cx))?;
            let res = guard.try_io(|fd| match write(fd.as_raw_fd()) {
                n if n < 0 => Err(io::Error::last_os_error()),
                n => Ok(n as usize),
            });
            match res {
                Ok(r) => return Poll::Ready(r),
                Err(_would_block) => continue,
            }
        }
    }
}

impl AsyncWrite for FdStream {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        data: &[u8],
    ) -> Poll<io::Result<usize>> {
        // SAFETY: `data` is readable for its length.
        self.poll_write_with(cx, |fd| unsafe { libc::write(fd, data.as_ptr().cast(), data.len()) })
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        slices: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        // At most IOV_MAX at a time; the caller goes on with the rest.
        let slices = &slices[..slices.len().min(1024)];
        // SAFETY: IoSlice is ABI-compatible with iovec, and every slice is readable for the
        // length it says.
        self.poll_write_with(cx, |fd| unsafe {
            libc::writev(fd, slices.as_ptr().cast(), slices.len() as i32)
        })
    }

    fn is_write_vectored(&self) -> bool {
        true
    }

    fn poll_flush(self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Poll::Ready(Ok(()))
    }

    fn poll_shutdown(self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Poll::Ready(Ok(()))
    }
}

impl FdStream {
    /// [`read_now`], once the fd is readable.
    pub async fn read_available(&mut self, max: usize) -> io::Result<Vec<u8>> {
        loop {
            let mut guard = self.fd.readable().await?;
            match guard.try_io(|fd| read_now(fd.as_raw_fd(), max)) {
                Ok(r) => return r,
                Err(_would_block) => continue,
            }
        }
    }
}

/// Bytes waiting in the pipe or socket `fd` (`FIONREAD`).
pub fn pending(fd: i32) -> io::Result<usize> {
    let mut n: libc::c_int = 0;
    // SAFETY: FIONREAD writes one int.
    if unsafe { libc::ioctl(fd, libc::FIONREAD, &mut n) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(n.max(0) as usize)
}

/// Reads what the pipe `fd` holds right now, up to `max` bytes, into a buffer of exactly that
/// size: hundreds of idle ranks then cost no buffer memory. Empty means end of file.
pub fn read_now(fd: i32, max: usize) -> io::Result<Vec<u8>> {
    read_pending(fd, pending(fd).unwrap_or(0), max)
}

/// [`read_now`], for a caller that already asked how much `fd` holds (`pending`).
pub fn read_pending(fd: i32, pending: usize, max: usize) -> io::Result<Vec<u8>> {
    let want = if pending > 0 { pending.min(max) } else { 512 };
    let mut buf = Vec::<u8>::with_capacity(want);
    // SAFETY: read(2) fills at most `want` bytes of the allocation; we set the length to what
    // it reports.
    let n = unsafe { libc::read(fd, buf.as_mut_ptr().cast(), want) };
    if n < 0 {
        return Err(io::Error::last_os_error());
    }
    unsafe { buf.set_len(n as usize) };
    Ok(buf)
}

/// Where a gathered write of `parts` stands, for writers that send many buffers with one
/// `writev` and go on after a short write: the slices still to write, from the first part
/// not yet all written.
pub struct Gather<'a> {
    parts: Vec<&'a [u8]>,
    /// The first part not yet all written, and how much of it was.
    at: usize,
    offset: usize,
}

impl<'a> Gather<'a> {
    /// Empty parts are left out: a gather is done when every byte is written.
    pub fn new(mut parts: Vec<&'a [u8]>) -> Gather<'a> {
        parts.retain(|p| !p.is_empty());
        Gather { parts, at: 0, offset: 0 }
    }

    pub fn is_done(&self) -> bool {
        self.at == self.parts.len()
    }

    /// The next slices to write (at most 512, the rest after them).
    pub fn slices(&self) -> Vec<io::IoSlice<'a>> {
        let window = &self.parts[self.at..self.parts.len().min(self.at + 512)];
        let mut slices: Vec<io::IoSlice<'a>> = window.iter().map(|p| io::IoSlice::new(p)).collect();
        if let Some(first) = slices.first_mut() {
            *first = io::IoSlice::new(&window[0][self.offset..]);
        }
        slices
    }

    /// `n` more bytes were written.
    pub fn advance(&mut self, mut n: usize) {
        while n > 0 {
            let left = self.parts[self.at].len() - self.offset;
            if n >= left {
                (self.at, self.offset, n) = (self.at + 1, 0, n - left);
            } else {
                (self.offset, n) = (self.offset + n, 0);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_gather_goes_on_after_short_writes_where_they_stopped() {
        let parts: Vec<&[u8]> = vec![b"abc", b"", b"defg", b"h", b""];
        let mut gather = Gather::new(parts);
        let mut out = Vec::new();
        // Writes of 2 bytes at most: parts are cut and resumed.
        while !gather.is_done() {
            let slices = gather.slices();
            let all: Vec<u8> = slices.iter().flat_map(|s| s.iter().copied()).collect();
            let n = all.len().min(2);
            out.extend_from_slice(&all[..n]);
            gather.advance(n);
        }
        assert_eq!(out, b"abcdefgh");
    }

    #[test]
    fn rank_pipes_share_a_quarter_of_the_users_pipe_quota() {
        let quota = Some(64 << 20);
        let sizes: Vec<i32> =
            [1, 16, 17, 32, 64, 128, 255, 256, 4096].map(|n| capacity_within(quota, n)).into();
        let kib: Vec<i32> = sizes.iter().map(|s| s >> 10).collect();
        assert_eq!(kib, [1024, 1024, 512, 512, 256, 128, 64, 64, 64]);
        // Root, or no quota: the full capacity, however many.
        assert_eq!(capacity_within(None, 4096), PIPE_CAPACITY);
    }
}
