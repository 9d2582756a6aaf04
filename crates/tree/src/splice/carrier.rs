//! The proxy's side of splicing: a chunk of a rank's output moved out of the rank's pipe
//! into a pipe of its own (a carrier), without copying, and from there into the upstream
//! socket after its frame head, by the pump. The bytes the rank wrote are the bytes in the
//! socket: two copies fewer than reading them in and writing them out.
//!
//! A carrier is one pipe per chunk, not a shared one: a chunk can be dropped (the output
//! shed, the parent lost) without anyone reading the bytes it holds, and its pipe closes
//! with it. Empty carriers go back to a small pool.

use std::io;
use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::sync::{Arc, Mutex};

use nix::libc;
use tokio::io::unix::AsyncFd;
use tokio::io::Interest;

use super::splice;

/// Carriers kept for reuse. An empty carrier still counts its capacity against its user's
/// pipe-pages quota (see [`crate::fdio::rank_pipe_capacity`]): four hold the node's output
/// budget (1 MiB) twice over.
const POOL: usize = 4;
/// A carrier's capacity: a chunk of carried output (`CARRIED_CHUNK` in outputs.rs, 512 KiB) in
/// pages. Pages a rank filled only in part take a slot each, so such a chunk is smaller.
const CAPACITY: i32 = 512 << 10;

/// The pool of empty carriers, and where new ones come from.
#[derive(Default)]
pub struct Carriers {
    free: Mutex<Vec<(OwnedFd, OwnedFd)>>,
}

/// A chunk of a rank's output, in a carrier.
pub struct Carried {
    read: Option<OwnedFd>,
    write: Option<OwnedFd>,
    len: usize,
    pool: Arc<Carriers>,
    /// Told when the chunk is gone, sent or dropped.
    gone: Option<Gone>,
}

/// Where a carried chunk's sender hears that the chunk is gone: `(key, sent)` sent to `to`,
/// `sent` false if it was dropped with bytes still in it (the link lost, the output shed).
pub struct Gone {
    pub to: crate::mailbox::Sender<(u64, bool)>,
    pub key: u64,
}

impl Carriers {
    pub fn new() -> Arc<Carriers> {
        Arc::new(Carriers::default())
    }

    /// Moves up to `max` bytes out of the pipe `from` into a carrier, without blocking, if
    /// the pipe holds at least `min` (`pending`, as its owner asked it); `None` (nothing
    /// moved) otherwise.
    pub fn take(
        self: &Arc<Self>,
        from: RawFd,
        pending: usize,
        min: usize,
        max: usize,
    ) -> io::Result<Option<Carried>> {
        if pending < min {
            return Ok(None);
        }
        let (read, write) = self.pipe()?;
        let mut carried = Carried {
            read: Some(read),
            write: Some(write),
            len: 0,
            pool: self.clone(),
            gone: None,
        };
        let to = carried.write.as_ref().expect("open").as_raw_fd();
        let flags = libc::SPLICE_F_MOVE | libc::SPLICE_F_NONBLOCK;
        match splice(from, to, max, flags) {
            Ok(n) => carried.len = n,
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
            Err(e) => return Err(e),
        }
        Ok((carried.len > 0).then_some(carried))
    }

    fn pipe(&self) -> io::Result<(OwnedFd, OwnedFd)> {
        if let Some(pipe) = self.free.lock().expect("not poisoned").pop() {
            return Ok(pipe);
        }
        let (read, write) = super::pipe(libc::O_NONBLOCK)?;
        crate::fdio::enlarge_pipe(&write, CAPACITY);
        Ok((read, write))
    }
}

/// `fd` (a proxy's upstream channel), registered on its own, for writing only: for the pump
/// to splice carriers into, or the hub to wait for room in, if it takes splices.
pub fn target(fd: RawFd) -> Option<AsyncFd<OwnedFd>> {
    if !super::takes_splices(fd) {
        return None;
    }
    match super::registered_dup(fd, Interest::WRITABLE) {
        Ok(fd) => Some(fd),
        Err(e) => {
            tracing::debug!("cannot splice output upstream: {e}");
            None
        }
    }
}

impl Carried {
    /// Has `gone` told when this chunk is sent or dropped.
    pub fn tell_when_gone(&mut self, gone: Gone) {
        self.gone = Some(gone);
    }

    /// Bytes still in the carrier.
    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// What it holds, read out (for a link that cannot take splices).
    pub fn into_bytes(mut self) -> io::Result<Vec<u8>> {
        let from = self.read.as_ref().expect("open").as_raw_fd();
        let bytes = super::read_exact_now(from, self.len)?;
        self.len = 0;
        Ok(bytes)
    }

    /// Moves what it holds into `to` without blocking; how much went (`WouldBlock` when `to`
    /// takes nothing now).
    pub fn splice_into(&mut self, to: RawFd) -> io::Result<usize> {
        let from = self.read.as_ref().expect("open").as_raw_fd();
        let flags = libc::SPLICE_F_MOVE | libc::SPLICE_F_NONBLOCK;
        let n = splice(from, to, self.len, flags)?;
        self.len -= n;
        Ok(n)
    }
}

impl Drop for Carried {
    fn drop(&mut self) {
        if let Some(Gone { to, key }) = self.gone.take() {
            let _ = to.send((key, self.len == 0));
        }
        // A carrier that still holds bytes closes with them.
        if self.len == 0 {
            let pipe = (self.read.take().expect("open"), self.write.take().expect("open"));
            let mut free = self.pool.free.lock().expect("not poisoned");
            if free.len() < POOL {
                free.push(pipe);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::fs::File;
    use std::io::{Read, Write};
    use std::os::unix::net::UnixStream;

    #[test]
    fn a_chunk_goes_from_a_pipe_through_a_carrier_into_a_socket_and_the_carrier_is_reused() {
        let carriers = Carriers::new();
        let (rank, writer) = super::super::pipe(libc::O_NONBLOCK).unwrap();
        let mut writer = File::from(writer);
        // Too little to carry.
        writer.write_all(b"short\n").unwrap();
        let take = |max| {
            let held = crate::fdio::pending(rank.as_raw_fd()).unwrap();
            carriers.take(rank.as_raw_fd(), held, 16, max).unwrap()
        };
        assert!(take(1024).is_none());
        writer.write_all(&[b'x'; 40_000]).unwrap();
        let mut carried = take(30_000).unwrap();
        assert_eq!(carried.len(), 30_000);
        let (a, mut b) = UnixStream::pair().unwrap();
        while !carried.is_empty() {
            carried.splice_into(a.as_raw_fd()).unwrap();
        }
        let mut got = vec![0; 30_000];
        b.read_exact(&mut got).unwrap();
        assert_eq!(&got[..6], b"short\n");
        assert!(got[6..].iter().all(|&c| c == b'x'));
        drop(carried);
        assert_eq!(carriers.free.lock().unwrap().len(), 1);

        // A carrier dropped full is closed, not pooled.
        let full = take(1 << 20).unwrap();
        assert_eq!(full.len(), 40_006 - 30_000);
        drop(full);
        assert_eq!(carriers.free.lock().unwrap().len(), 0);
    }
}
