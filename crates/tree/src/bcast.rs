//! Files broadcast through the tree (`--bcast`), the parent's side, shared by rlaunch and
//! every proxy: each child is fed the files' stream ([`Down::BcastData`]) from a [`Source`]
//! (rlaunch: the files themselves; a proxy: its own copies, as far as it has written them),
//! at most [`WINDOW`] bytes ahead of what the child's whole subtree has acknowledged
//! ([`Up::BcastAck`](rlaunch_protocol::control::Up::BcastAck)).
//!
//! ```text
//!  rlaunch ──chunks──► proxy ──writes──► its copies ──pread──► chunks ──► its children
//!     ▲                  │                                                   │
//!     └─ BcastAck(min) ◄─┴──────────── min(written, children's acks) ◄───────┘
//! ```
//!
//! A node forwards from its own file, not from the frames it was sent, so a child that
//! dials in late is fed from the start, and one that rlaunch adopts from what its subtree
//! acknowledges having, with nothing held for it in memory. The window bounds what is queued for each child (8 MiB);
//! siblings fed the same chunk share one read.

use std::fs::File;
use std::io;
use std::os::unix::fs::FileExt;
use std::path::PathBuf;
use std::sync::Arc;

use rlaunch_protocol::control::Down;

use crate::children::Children;

/// Bytes per frame.
pub const CHUNK: u64 = 512 << 10;
/// How far a child may be fed ahead of its subtree's acknowledgements.
pub const WINDOW: u64 = 8 << 20;

/// One file of a [`Source`]: open for reading, its length, and its name for errors.
pub struct SourceFile {
    pub file: File,
    pub len: u64,
    pub path: PathBuf,
}

/// The stream's bytes: the files, one after another.
pub struct Source {
    files: Vec<SourceFile>,
    /// The last chunk read, by offset: siblings fed in step share it.
    last: Option<(u64, Arc<[u8]>)>,
}

impl Source {
    /// The stream of `files`.
    pub fn new(files: Vec<SourceFile>) -> Source {
        Source { files, last: None }
    }

    pub fn total(&self) -> u64 {
        self.files.iter().map(|f| f.len).sum()
    }

    /// The chunk at `offset`: up to [`CHUNK`] bytes, ending at its file's end or at `upto`,
    /// whichever comes first. Err: why it cannot be read, a sentence naming the file (one
    /// shorter than it was is one that changed since).
    pub fn chunk(&mut self, offset: u64, upto: u64) -> Result<Arc<[u8]>, String> {
        if let Some((at, data)) = &self.last {
            if *at == offset && offset + data.len() as u64 <= upto {
                return Ok(data.clone());
            }
        }
        let (mut start, mut found) = (0, None);
        for f in &self.files {
            if offset < start + f.len {
                found = Some((f, offset - start, start + f.len));
                break;
            }
            start += f.len;
        }
        let Some((f, at, file_end)) = found else {
            return Err(format!("no file holds byte {offset} of the broadcast"));
        };
        let end = (offset + CHUNK).min(file_end).min(upto);
        let mut data = vec![0; (end - offset) as usize];
        f.file.read_exact_at(&mut data, at).map_err(|e| match e.kind() {
            io::ErrorKind::UnexpectedEof => {
                format!("{} is shorter than when the broadcast began", f.path.display())
            }
            _ => format!("cannot read {}: {}", f.path.display(), crate::io_sentence(&e)),
        })?;
        let data: Arc<[u8]> = data.into();
        self.last = Some((offset, data.clone()));
        Ok(data)
    }
}

/// How far each child has been fed, and how far its subtree has acknowledged.
#[derive(Debug, Default, Clone, Copy)]
struct Cursor {
    sent: u64,
    acked: u64,
    /// It has acknowledged at all: its subtree made its directories.
    heard: bool,
    /// It was told that every node has the files ([`Down::BcastDone`]).
    told: bool,
}

/// The parent's feeding of its children, by child index (as in [`Children`]).
#[derive(Default)]
pub struct Feeds {
    cursors: Vec<Cursor>,
}

impl Feeds {
    /// Child `child`'s subtree has written `bytes` of the stream.
    pub fn acked(&mut self, child: usize, bytes: u64) {
        self.grow(child + 1);
        let c = &mut self.cursors[child];
        c.acked = c.acked.max(bytes);
        // An adopted proxy's subtree says what it has already: nothing below that is sent
        // again.
        c.sent = c.sent.max(bytes);
        c.heard = true;
    }

    /// Whether every child still fed has all `total` bytes: then each is told so
    /// ([`Down::BcastDone`]), once (a child adopted later is told when it has them).
    /// Only rlaunch releases: it knows that no subtree lacks them.
    pub fn release(&mut self, children: &Children, total: u64) -> bool {
        self.grow(children.len());
        let fed = |i: &usize| fed_child(children, *i);
        let whole = |c: &Cursor| c.heard && c.acked >= total;
        if !(0..self.cursors.len()).filter(fed).all(|i| whole(&self.cursors[i])) {
            return false;
        }
        for i in (0..self.cursors.len()).filter(fed) {
            if !self.cursors[i].told && children.send_to(i, Down::BcastDone) {
                self.cursors[i].told = true;
            }
        }
        true
    }

    /// Feeds every child that is still fed (neither late nor gone) up to `avail` bytes of the
    /// stream (what this parent has: all of it at rlaunch), each within its window. A read
    /// that fails is returned, as a sentence: the parent cannot feed its children.
    pub fn feed(
        &mut self,
        children: &Children,
        source: &mut Source,
        avail: u64,
    ) -> Result<(), String> {
        self.grow(children.len());
        // Round by round, so that siblings in step share each chunk read.
        loop {
            let mut fed = false;
            for child in 0..self.cursors.len() {
                let c = self.cursors[child];
                if !fed_child(children, child) || c.sent >= avail || c.sent >= c.acked + WINDOW {
                    continue;
                }
                let data = source.chunk(c.sent, avail)?;
                let len = data.len() as u64;
                if children.send_to(child, Down::BcastData { offset: c.sent, data }) {
                    self.cursors[child].sent += len;
                    fed = true;
                }
            }
            if !fed {
                return Ok(());
            }
        }
    }

    /// The least that any child still fed has acknowledged (0 for one not heard from
    /// yet, as for one that has nothing); `None` if no child is fed. `Some` with `false`:
    /// a child has not been heard from.
    pub fn low(&self, children: &Children) -> Option<(u64, bool)> {
        self.grow_view(children.len())
            .enumerate()
            .filter(|(i, _)| fed_child(children, *i))
            .map(|(_, c)| (c.acked, c.heard))
            .reduce(|(a, ha), (b, hb)| (a.min(b), ha && hb))
    }

    /// The cursors of `len` children, those not fed yet as fresh ones.
    fn grow_view(&self, len: usize) -> impl Iterator<Item = Cursor> + '_ {
        let fresh = len.saturating_sub(self.cursors.len());
        self.cursors.iter().copied().chain(std::iter::repeat_n(Cursor::default(), fresh))
    }

    fn grow(&mut self, len: usize) {
        if self.cursors.len() < len {
            self.cursors.resize(len, Cursor::default());
        }
    }
}

/// Whether child `child` takes the broadcast: not a late one (started for spawned ranks,
/// which get no files), not one lost or finished.
fn fed_child(children: &Children, child: usize) -> bool {
    !children.gone(child) && !children.is_late(child)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    fn file(bytes: &[u8]) -> SourceFile {
        let mut f = tempfile().expect("a temporary file");
        f.write_all(bytes).unwrap();
        SourceFile { file: f, len: bytes.len() as u64, path: "in.bin".into() }
    }

    fn tempfile() -> io::Result<File> {
        let dir = std::env::temp_dir();
        let path = dir.join(format!("rlaunch-bcast-test.{}.{}", std::process::id(), rand_u64()));
        let f = std::fs::OpenOptions::new().create_new(true).read(true).write(true).open(&path)?;
        std::fs::remove_file(&path)?;
        Ok(f)
    }

    fn rand_u64() -> u64 {
        use std::hash::{BuildHasher, RandomState};
        RandomState::new().hash_one(0u8)
    }

    #[test]
    fn chunks_end_at_each_files_end_and_at_what_is_there() {
        let big = vec![7u8; (CHUNK + 10) as usize];
        let mut source = Source::new(vec![file(b"abc"), file(&big), file(b"z")]);
        assert_eq!(source.total(), 3 + CHUNK + 10 + 1);
        assert_eq!(&source.chunk(0, u64::MAX).unwrap()[..], b"abc", "not across a file's end");
        assert_eq!(source.chunk(3, u64::MAX).unwrap().len() as u64, CHUNK);
        assert_eq!(&source.chunk(3 + CHUNK, u64::MAX).unwrap()[..], &[7u8; 10]);
        assert_eq!(&source.chunk(3 + CHUNK + 10, u64::MAX).unwrap()[..], b"z");
        assert_eq!(source.chunk(4, 9).unwrap().len(), 5, "only what the parent has");
        assert!(source.chunk(source.total(), u64::MAX).is_err());
    }

    #[test]
    fn a_file_shorter_than_said_is_an_error_naming_it() {
        let short = SourceFile { len: 10, ..file(b"abc") };
        let mut source = Source::new(vec![short]);
        let why = source.chunk(0, 10).unwrap_err();
        assert_eq!(why, "in.bin is shorter than when the broadcast began");
    }
}
