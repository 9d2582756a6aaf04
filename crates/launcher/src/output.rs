//! Writes the ranks' output to rlaunch's stdout and stderr, whole lines at a time.
//!
//! One thread owns both descriptors and a partial-line buffer per rank and stream: it writes
//! only complete lines (or a partial line past [`MAX_PARTIAL`], or at end of file), so lines of
//! different ranks never interleave mid-line. Its input is a bounded channel: when a reader of
//! rlaunch's stdout is slow, the thread blocks in write, the channel fills, the link readers
//! wait, and backpressure reaches the ranks. Nothing is dropped and memory stays bounded.

use std::collections::HashMap;
use std::io::{self, Write};
use std::mem::ManuallyDrop;
use std::os::fd::FromRawFd;

use pmi_wire::ids::Stream;
use tokio::sync::mpsc;

/// A partial line longer than this is written without waiting for its newline.
const MAX_PARTIAL: usize = 64 << 10;
/// Output gathered before a write, when more is already queued.
const BATCH: usize = 256 << 10;
/// Chunks queued for the writer thread.
pub const QUEUE: usize = 64;

pub enum Chunk {
    /// A rank is running; comes before any of its output.
    Started {
        rank: u32,
        pid: u32,
        cpus: Option<String>,
    },
    Data {
        rank: u32,
        stream: Stream,
        data: Vec<u8>,
    },
    End {
        rank: u32,
        stream: Stream,
    },
}

/// What the writer thread tells the dispatcher.
#[derive(Debug)]
pub enum OutputEvent {
    /// rlaunch's stdout is closed (`| head -1`): the job should end.
    StdoutClosed,
}

struct Sink {
    file: ManuallyDrop<std::fs::File>,
    buf: Vec<u8>,
    /// Set after a write fails: output is discarded from then on.
    broken: bool,
}

impl Sink {
    fn new(fd: i32) -> Sink {
        // SAFETY: fds 1 and 2 stay open for the life of the process; ManuallyDrop never closes.
        let file = ManuallyDrop::new(unsafe { std::fs::File::from_raw_fd(fd) });
        Sink { file, buf: Vec::with_capacity(BATCH), broken: false }
    }

    /// Writes out what is buffered; returns the error of a newly broken sink.
    fn flush(&mut self) -> Option<io::Error> {
        if self.buf.is_empty() || self.broken {
            self.buf.clear();
            return None;
        }
        let res = self.file.write_all(&self.buf);
        self.buf.clear();
        if self.buf.capacity() > BATCH * 4 {
            self.buf.shrink_to(BATCH);
        }
        res.err().inspect(|_| self.broken = true)
    }
}

pub struct Writer {
    prefix_rank: bool,
    stdout: Sink,
    stderr: Sink,
    partial: HashMap<(u32, Stream), Vec<u8>>,
}

impl Writer {
    pub fn new(prefix_rank: bool) -> Writer {
        Writer { prefix_rank, stdout: Sink::new(1), stderr: Sink::new(2), partial: HashMap::new() }
    }

    /// Runs until every sender is gone.
    pub fn run(
        mut self,
        mut rx: mpsc::Receiver<Chunk>,
        events: mpsc::UnboundedSender<OutputEvent>,
    ) {
        while let Some(chunk) = rx.blocking_recv() {
            self.take(chunk);
            while self.stdout.buf.len() + self.stderr.buf.len() < BATCH {
                match rx.try_recv() {
                    Ok(chunk) => self.take(chunk),
                    Err(_) => break,
                }
            }
            self.flush(&events);
        }
        let rest: Vec<_> = self.partial.drain().collect();
        for ((rank, stream), bytes) in rest {
            self.emit(rank, stream, &bytes);
        }
        self.flush(&events);
    }

    fn flush(&mut self, events: &mpsc::UnboundedSender<OutputEvent>) {
        if let Some(e) = self.stdout.flush() {
            tracing::debug!("stdout closed: {e}");
            let _ = events.send(OutputEvent::StdoutClosed);
        }
        let _ = self.stderr.flush();
    }

    fn sink(&mut self, stream: Stream) -> &mut Sink {
        match stream {
            Stream::Stdout => &mut self.stdout,
            Stream::Stderr => &mut self.stderr,
        }
    }

    fn take(&mut self, chunk: Chunk) {
        match chunk {
            Chunk::Data { rank, stream, data } => {
                let key = (rank, stream);
                let Some(nl) = data.iter().rposition(|&b| b == b'\n') else {
                    let partial = self.partial.entry(key).or_default();
                    partial.extend_from_slice(&data);
                    if partial.len() > MAX_PARTIAL {
                        let long = std::mem::take(partial);
                        self.emit(rank, stream, &long);
                    }
                    return;
                };
                if let Some(head) = self.partial.remove(&key) {
                    self.emit_joined(rank, stream, &head, &data[..=nl]);
                } else {
                    self.emit(rank, stream, &data[..=nl]);
                }
                if nl + 1 < data.len() {
                    self.partial.insert(key, data[nl + 1..].to_vec());
                }
            }
            Chunk::Started { .. } => {}
            Chunk::End { rank, stream } => {
                if let Some(rest) = self.partial.remove(&(rank, stream)) {
                    self.emit(rank, stream, &rest);
                }
            }
        }
    }

    /// Appends `head` + `tail`, which together are whole lines (or a flushed fragment).
    fn emit_joined(&mut self, rank: u32, stream: Stream, head: &[u8], tail: &[u8]) {
        if self.prefix_rank {
            let mut line = Vec::with_capacity(head.len() + tail.len());
            line.extend_from_slice(head);
            line.extend_from_slice(tail);
            self.emit(rank, stream, &line);
        } else {
            let sink = self.sink(stream);
            sink.buf.extend_from_slice(head);
            sink.buf.extend_from_slice(tail);
        }
    }

    fn emit(&mut self, rank: u32, stream: Stream, bytes: &[u8]) {
        let prefix_rank = self.prefix_rank;
        let sink = self.sink(stream);
        if !prefix_rank {
            sink.buf.extend_from_slice(bytes);
            return;
        }
        let prefix = format!("[{rank}] ");
        for line in bytes.split_inclusive(|&b| b == b'\n') {
            sink.buf.extend_from_slice(prefix.as_bytes());
            sink.buf.extend_from_slice(line);
        }
    }
}
