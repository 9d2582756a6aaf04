//! Frames on an async byte stream: a reader that owns its buffer (check, then parse).

use tokio::io::{AsyncRead, AsyncReadExt};

use crate::control::{self, Frame, FrameError, HelloFound};

#[derive(Debug, thiserror::Error)]
pub enum ReadError {
    #[error(transparent)]
    Io(#[from] std::io::Error),
    #[error(transparent)]
    Frame(#[from] FrameError),
    #[error("connection closed in the middle of a frame")]
    Truncated,
    #[error("connection closed before the hello")]
    ClosedBeforeHello {
        /// What the peer sent before closing (a shell's or ssh's complaint, usually).
        preamble: Vec<u8>,
    },
}

/// Reads hello and frames from one stream. One reader per connection; it alone owns the
/// buffer.
pub struct FrameReader<R> {
    inner: R,
    buf: Vec<u8>,
    /// Start of the unconsumed bytes in `buf`.
    pos: usize,
    /// How much room a read asks for.
    chunk: usize,
}

/// For links that carry output: big reads, few wakeups.
const READ_CHUNK: usize = 256 << 10;

impl<R: AsyncRead + Unpin> FrameReader<R> {
    pub fn new(inner: R) -> Self {
        Self::with_chunk(inner, READ_CHUNK)
    }

    /// A reader that asks for `chunk` bytes at a time, for streams that carry little (the
    /// control traffic down the tree); a frame larger than that still arrives whole.
    pub fn with_chunk(inner: R, chunk: usize) -> Self {
        FrameReader { inner, buf: Vec::new(), pos: 0, chunk }
    }

    /// Reads more bytes; false at end of file.
    async fn fill(&mut self, want: usize) -> std::io::Result<bool> {
        if self.pos > 0 && (self.pos == self.buf.len() || self.pos > self.buf.capacity() / 2) {
            self.buf.drain(..self.pos);
            self.pos = 0;
        }
        self.buf.reserve(want.max(self.chunk / 4));
        Ok(self.inner.read_buf(&mut self.buf).await? > 0)
    }

    /// Waits for the peer's hello; returns it with whatever the peer printed before it.
    pub async fn read_hello(&mut self) -> Result<(HelloFound, Vec<u8>), ReadError> {
        loop {
            if let Some(found) = control::scan_hello(&self.buf[self.pos..])? {
                let preamble = self.buf[self.pos..self.pos + found.preamble_len].to_vec();
                self.pos += found.consumed;
                return Ok((found, preamble));
            }
            if !self.fill(self.chunk).await? {
                return Err(ReadError::ClosedBeforeHello {
                    preamble: self.buf[self.pos..].to_vec(),
                });
            }
        }
    }

    /// The next frame; `Ok(None)` at a clean end of stream (between frames).
    pub async fn next<M: Frame>(&mut self) -> Result<Option<M>, ReadError> {
        loop {
            let avail = &self.buf[self.pos..];
            if let Some((msg, used)) = control::decode::<M>(avail)? {
                self.pos += used;
                return Ok(Some(msg));
            }
            let want = control::frame_len(avail)?.map_or(0, |len| 4 + len - avail.len());
            if !self.fill(want).await? {
                return if self.pos == self.buf.len() {
                    Ok(None)
                } else {
                    Err(ReadError::Truncated)
                };
            }
        }
    }
}
