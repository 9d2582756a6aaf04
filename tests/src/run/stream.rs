//! One output pipe of a run, read by a thread, offered line by line or all at once.

use std::io::Read;
use std::sync::mpsc::{self, Receiver, RecvTimeoutError};
use std::time::Instant;

pub(super) enum Missing {
    Eof,
    TimedOut,
}

/// One output pipe, read by a thread that sends what it reads.
pub(super) struct Stream {
    pub(super) name: &'static str,
    /// Chunks as read; disconnected at EOF.
    chunks: Receiver<Vec<u8>>,
    /// Every byte received so far.
    pub(super) seen: Vec<u8>,
    /// Where the next line for `next_line` starts in `seen`.
    cursor: usize,
    eof: bool,
}

impl Stream {
    pub(super) fn start(name: &'static str, mut pipe: impl Read + Send + 'static) -> Stream {
        let (tx, chunks) = mpsc::channel();
        std::thread::spawn(move || {
            let mut buf = vec![0; 64 * 1024];
            loop {
                match pipe.read(&mut buf) {
                    Ok(0) => return,
                    Ok(n) => {
                        if tx.send(buf[..n].to_vec()).is_err() {
                            return;
                        }
                    }
                    Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                    Err(_) => return,
                }
            }
        });
        Stream { name, chunks, seen: Vec::new(), cursor: 0, eof: false }
    }

    /// Takes one chunk into `seen`.
    fn receive(&mut self, deadline: Instant) -> Result<(), Missing> {
        if self.eof {
            return Err(Missing::Eof);
        }
        let left = deadline.saturating_duration_since(Instant::now());
        match self.chunks.recv_timeout(left) {
            Ok(chunk) => {
                self.seen.extend_from_slice(&chunk);
                Ok(())
            }
            Err(RecvTimeoutError::Timeout) => Err(Missing::TimedOut),
            Err(RecvTimeoutError::Disconnected) => {
                self.eof = true;
                Err(Missing::Eof)
            }
        }
    }

    /// The next line with its newline; at EOF, a last line may lack it.
    pub(super) fn next_line(&mut self, deadline: Instant) -> Result<Vec<u8>, Missing> {
        loop {
            let rest = &self.seen[self.cursor..];
            if let Some(end) = rest.iter().position(|&b| b == b'\n') {
                let line = rest[..=end].to_vec();
                self.cursor += end + 1;
                return Ok(line);
            }
            match self.receive(deadline) {
                Ok(()) => {}
                Err(Missing::Eof) if self.cursor < self.seen.len() => {
                    let line = self.seen[self.cursor..].to_vec();
                    self.cursor = self.seen.len();
                    return Ok(line);
                }
                Err(missing) => return Err(missing),
            }
        }
    }

    /// Receives everything up to EOF; false if the deadline came first.
    pub(super) fn drain(&mut self, deadline: Instant) -> bool {
        loop {
            match self.receive(deadline) {
                Ok(()) => {}
                Err(Missing::Eof) => return true,
                Err(Missing::TimedOut) => return false,
            }
        }
    }
}
