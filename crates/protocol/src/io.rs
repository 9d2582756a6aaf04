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
    /// Reads take at most this many bytes (however much room the buffer has), when set.
    cap: Option<Cap>,
    /// A bulk-data frame being read straight into its own buffer. Kept here, not in the
    /// future, so that [`FrameReader::next`] stays cancel-safe (a `select!` may drop it).
    partial: Option<Partial>,
}

/// How much a capped read takes: `least` at first and after bulk data was handed out,
/// twice as much after each read that filled its cap (more is waiting), up to `chunk`.
#[derive(Clone, Copy)]
struct Cap {
    least: usize,
    now: usize,
}

struct Partial {
    /// The bytes between the frame's tag and its data.
    fixed: Vec<u8>,
    data: Vec<u8>,
    data_len: usize,
}

/// What [`FrameReader::next_or_bulk`] found.
#[derive(Debug, PartialEq)]
pub enum Next<M> {
    Frame(M),
    /// A bulk-data frame whose data is mostly still in the stream: `frame` is the message
    /// with the data read so far, and the next `rest` bytes of the stream are the rest of
    /// its data, which the caller must take from the stream itself before asking for more.
    Bulk {
        frame: M,
        rest: usize,
    },
}

/// For links that carry output: big reads, few wakeups.
const READ_CHUNK: usize = 256 << 10;
/// A bulk-data frame at least this long, not all in the buffer yet, is read straight into its
/// own buffer.
const DIRECT: usize = 32 << 10;

impl<R: AsyncRead + Unpin> FrameReader<R> {
    pub fn new(inner: R) -> Self {
        Self::with_chunk(inner, READ_CHUNK)
    }

    /// A reader that asks for `chunk` bytes at a time, for streams that carry little (the
    /// control traffic down the tree); a frame larger than that still arrives whole.
    pub fn with_chunk(inner: R, chunk: usize) -> Self {
        FrameReader { inner, buf: Vec::new(), pos: 0, chunk, cap: None, partial: None }
    }

    /// Caps reads from now on: `least` bytes after each bulk frame handed out, so that a
    /// reader handing bulk data to its caller ([`FrameReader::next_or_bulk`]) copies little
    /// of it on the way; growing again while reads come back full of smaller frames.
    pub fn cap_reads(&mut self, least: usize) {
        self.cap = Some(Cap { least, now: least });
    }

    /// The stream, for the rest of a [`Next::Bulk`] frame.
    pub fn get_mut(&mut self) -> &mut R {
        &mut self.inner
    }

    /// Reads more bytes; false at end of file.
    async fn fill(&mut self, want: usize) -> std::io::Result<bool> {
        if self.pos > 0 && (self.pos == self.buf.len() || self.pos > self.buf.capacity() / 2) {
            self.buf.drain(..self.pos);
            self.pos = 0;
        }
        self.buf.reserve(want.max(self.chunk / 4));
        let n = match &mut self.cap {
            Some(cap) => {
                let limit = cap.now;
                let n =
                    self.inner.read_buf(&mut bytes::BufMut::limit(&mut self.buf, limit)).await?;
                if n == limit {
                    cap.now = (limit * 2).min(self.chunk.max(cap.least));
                }
                n
            }
            None => self.inner.read_buf(&mut self.buf).await?,
        };
        Ok(n > 0)
    }

    /// The rest of the bulk-data frame begun in `partial`, read straight into the frame's own
    /// buffer instead of through ours (one copy of every byte of output less). Each read is
    /// cancel-safe, and what it brought is kept in `partial`.
    async fn read_data<M: Frame>(&mut self) -> Result<M, ReadError> {
        let partial = self.partial.as_mut().expect("called with a frame begun");
        while partial.data.len() < partial.data_len {
            let room = partial.data_len - partial.data.len();
            let n = self.inner.read_buf(&mut bytes::BufMut::limit(&mut partial.data, room)).await?;
            if n == 0 {
                self.partial = None;
                return Err(ReadError::Truncated);
            }
        }
        let Partial { fixed, data, .. } = self.partial.take().expect("begun");
        Ok(M::from_data(&fixed, data)?)
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

    /// The next frame; `Ok(None)` at a clean end of stream (between frames). Cancel-safe:
    /// dropped before it returns, it loses nothing, and the next call goes on where it stopped.
    pub async fn next<M: Frame>(&mut self) -> Result<Option<M>, ReadError> {
        match self.next_frame(None).await? {
            Some(Next::Frame(m)) => Ok(Some(m)),
            Some(Next::Bulk { .. }) => unreachable!("bulk frames are only handed out when asked"),
            None => Ok(None),
        }
    }

    /// [`FrameReader::next`], except that a bulk-data frame with at least `min` bytes of data
    /// not read yet is handed out as [`Next::Bulk`], its data left in the stream. Nothing of
    /// the stream past the frame's head is buffered then (the buffer is empty), so the caller
    /// may read or splice the rest from the stream's descriptor directly.
    pub async fn next_or_bulk<M: Frame>(
        &mut self,
        min: usize,
    ) -> Result<Option<Next<M>>, ReadError> {
        self.next_frame(Some(min)).await
    }

    async fn next_frame<M: Frame>(
        &mut self,
        bulk: Option<usize>,
    ) -> Result<Option<Next<M>>, ReadError> {
        loop {
            if self.partial.is_some() {
                return self.read_data().await.map(|m| Some(Next::Frame(m)));
            }
            let avail = &self.buf[self.pos..];
            if let Some((msg, used)) = control::decode::<M>(avail)? {
                self.pos += used;
                return Ok(Some(Next::Frame(msg)));
            }
            let len = control::frame_len(avail)?;
            let head = control::FRAME_HEAD + M::DATA_HEAD;
            if let Some(len) = len.filter(|&len| len >= DIRECT && avail.len() >= head) {
                if avail[4] == control::DATA_TAG {
                    let data_len = 4 + len - head;
                    let have = avail.len() - head;
                    if bulk.is_some_and(|min| data_len - have >= min) {
                        let frame = M::from_data(
                            &avail[control::FRAME_HEAD..head],
                            avail[head..].to_vec(),
                        )?;
                        self.pos = self.buf.len();
                        if let Some(cap) = &mut self.cap {
                            cap.now = cap.least;
                        }
                        return Ok(Some(Next::Bulk { frame, rest: data_len - have }));
                    }
                    let mut data = Vec::with_capacity(data_len);
                    data.extend_from_slice(&avail[head..]);
                    let fixed = avail[control::FRAME_HEAD..head].to_vec();
                    self.pos = self.buf.len();
                    self.partial = Some(Partial { fixed, data, data_len });
                    continue;
                }
            }
            let want = len.map_or(0, |len| 4 + len - avail.len());
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::control::Up;
    use crate::ids::{Gid, NodeId, Stream};
    use tokio::io::AsyncWriteExt;

    #[tokio::test]
    async fn large_output_is_read_whole_however_it_arrives_and_frames_after_it_too() {
        let (mut tx, rx) = tokio::io::duplex(8 << 10);
        let big: Vec<u8> = (0..200_000u32).map(|i| (i % 251) as u8).collect();
        let frames = [
            Up::Output { rank: Gid(3), stream: Stream::Stderr, data: big.clone() },
            Up::Started { node: NodeId(7) },
            Up::Output { rank: Gid(1), stream: Stream::Stdout, data: b"short\n".to_vec() },
            Up::Output { rank: Gid(2), stream: Stream::Stdout, data: big[..40_000].to_vec() },
        ];
        let mut bytes = Vec::new();
        for f in &frames {
            f.encode(&mut bytes);
        }
        let writer = tokio::spawn(async move {
            // Pieces of odd sizes: heads and data split anywhere.
            for piece in bytes.chunks(7_777) {
                tx.write_all(piece).await.unwrap();
            }
        });
        let mut reader = FrameReader::with_chunk(rx, 4096);
        for want in frames {
            assert_eq!(reader.next::<Up>().await.unwrap(), Some(want));
        }
        writer.await.unwrap();
        assert!(reader.next::<Up>().await.unwrap().is_none());
    }

    #[tokio::test]
    async fn a_large_frame_survives_its_read_being_dropped_halfway() {
        let (mut tx, rx) = tokio::io::duplex(1 << 20);
        let data: Vec<u8> = (0..100_000u32).map(|i| (i % 253) as u8).collect();
        let frame = Up::Output { rank: Gid(4), stream: Stream::Stdout, data };
        let mut bytes = Vec::new();
        frame.encode(&mut bytes);
        Up::Started { node: NodeId(1) }.encode(&mut bytes);
        let mut reader = FrameReader::new(rx);
        // Half of the frame, then a read that is given up (as a select! drops it when its
        // other branch wins: found by the chaos runner, a chunk of output lost when ssh
        // printed on stderr mid-frame), then the rest.
        tx.write_all(&bytes[..50_000]).await.unwrap();
        let wait = std::time::Duration::from_millis(50);
        assert!(tokio::time::timeout(wait, reader.next::<Up>()).await.is_err());
        tx.write_all(&bytes[50_000..]).await.unwrap();
        assert_eq!(reader.next::<Up>().await.unwrap(), Some(frame));
        assert_eq!(reader.next::<Up>().await.unwrap(), Some(Up::Started { node: NodeId(1) }));
    }

    #[tokio::test]
    async fn bulk_data_is_left_in_the_stream_and_the_frames_after_it_are_read() {
        let (mut tx, rx) = tokio::io::duplex(1 << 20);
        let big: Vec<u8> = (0..100_000u32).map(|i| (i % 241) as u8).collect();
        let mut bytes = Vec::new();
        Up::Started { node: NodeId(2) }.encode(&mut bytes);
        Up::Output { rank: Gid(5), stream: Stream::Stdout, data: big.clone() }.encode(&mut bytes);
        Up::Output { rank: Gid(6), stream: Stream::Stderr, data: b"small\n".to_vec() }
            .encode(&mut bytes);
        tx.write_all(&bytes).await.unwrap();
        drop(tx);
        let mut reader = FrameReader::new(rx);
        reader.cap_reads(2048);
        let first = reader.next_or_bulk::<Up>(16 << 10).await.unwrap();
        assert_eq!(first, Some(Next::Frame(Up::Started { node: NodeId(2) })));
        let Some(Next::Bulk { frame: Up::Output { rank: Gid(5), stream, data }, rest }) =
            reader.next_or_bulk::<Up>(16 << 10).await.unwrap()
        else {
            panic!("not handed out as bulk");
        };
        assert_eq!(stream, Stream::Stdout);
        // No more than one capped read of it was taken.
        assert!(data.len() < 2048 && data.len() + rest == big.len(), "{} + {rest}", data.len());
        let mut tail = vec![0; rest];
        tokio::io::AsyncReadExt::read_exact(reader.get_mut(), &mut tail).await.unwrap();
        assert_eq!([data, tail].concat(), big);
        let small = Up::Output { rank: Gid(6), stream: Stream::Stderr, data: b"small\n".to_vec() };
        assert_eq!(reader.next_or_bulk::<Up>(16 << 10).await.unwrap(), Some(Next::Frame(small)));
        assert_eq!(reader.next_or_bulk::<Up>(16 << 10).await.unwrap(), None);
    }

    #[tokio::test]
    async fn capped_reads_grow_with_small_frames_and_shrink_after_bulk_data() {
        let (mut tx, rx) = tokio::io::duplex(1 << 20);
        let small = Up::Output { rank: Gid(1), stream: Stream::Stdout, data: b"a line\n".to_vec() };
        let mut bytes = Vec::new();
        for _ in 0..5000 {
            small.encode(&mut bytes);
        }
        Up::Output { rank: Gid(2), stream: Stream::Stdout, data: vec![b'x'; 100_000] }
            .encode(&mut bytes);
        tx.write_all(&bytes).await.unwrap();
        let mut reader = FrameReader::new(rx);
        reader.cap_reads(2048);
        for _ in 0..5000 {
            assert_eq!(
                reader.next_or_bulk::<Up>(16 << 10).await.unwrap(),
                Some(Next::Frame(small.clone()))
            );
        }
        // 100 KB of small frames: the reads grew past their least.
        assert!(reader.cap.unwrap().now > 2048);
        let next = reader.next_or_bulk::<Up>(16 << 10).await.unwrap();
        assert!(matches!(next, Some(Next::Bulk { .. })), "{next:?}");
        assert_eq!(reader.cap.unwrap().now, 2048);
    }

    #[tokio::test]
    async fn a_large_frame_cut_short_is_truncated() {
        let (mut tx, rx) = tokio::io::duplex(1 << 20);
        let mut bytes = Vec::new();
        Up::Output { rank: Gid(0), stream: Stream::Stdout, data: vec![b'x'; 100_000] }
            .encode(&mut bytes);
        tx.write_all(&bytes[..60_000]).await.unwrap();
        drop(tx);
        let mut reader = FrameReader::new(rx);
        assert!(matches!(reader.next::<Up>().await, Err(ReadError::Truncated)));
    }
}
