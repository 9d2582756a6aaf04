//! Where whole lines end up: rlaunch's stdout and stderr, and the output files. The writer
//! appends to buffers between two flushes, so that one write carries many lines.
//!
//! The files share one buffer, cut into stretches that each name their file: with a file per
//! rank, a buffer per file would keep memory growing with the number of ranks, and the
//! shared one stays bounded by what the writer gathers before a flush. A flush writes each
//! file's stretches, gathered, in one write.

use std::collections::HashMap;
use std::fmt;
use std::fs::File;
use std::io::{self, Write};
use std::mem::ManuallyDrop;
use std::ops::Range;
use std::os::fd::FromRawFd;
use std::os::unix::fs::FileTypeExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use super::splice::Stash;
use rlaunch_protocol::ids::Stream;
use rlaunch_tree::fdio::Gather;

/// Output gathered before a write, when more is already queued.
pub(crate) const BATCH: usize = 256 << 10;

/// One sink: a terminal stream or an output file.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum SinkId {
    Stdout,
    Stderr,
    File(usize),
}

impl SinkId {
    pub(crate) fn terminal(stream: Stream) -> SinkId {
        match stream {
            Stream::Stdout => SinkId::Stdout,
            Stream::Stderr => SinkId::Stderr,
        }
    }
}

/// rlaunch's own stdout or stderr.
struct Terminal {
    /// Never closed: fds 1 and 2 belong to the process.
    file: ManuallyDrop<File>,
    /// Bytes appended (prefixed lines, short pieces).
    buf: Vec<u8>,
    /// What to write, in order: stretches of `buf`, and chunks of output taken as they came
    /// (whole lines with nothing to add: written from where they lie, not copied).
    parts: Vec<Part>,
    /// Bytes in `parts`.
    len: usize,
    /// Set after a write fails: output is discarded from then on.
    broken: bool,
    /// The last byte taken was not a newline: a rank's last line, cut short by its end.
    open_line: bool,
}

enum Part {
    Buf(Range<usize>),
    Owned(Vec<u8>, Range<usize>),
    /// The next bytes of the stash, spliced (see `super::splice`).
    Stashed(Arc<Stash>, usize),
}

impl Terminal {
    fn new(fd: i32) -> Terminal {
        // SAFETY: fds 1 and 2 stay open for the life of the process; ManuallyDrop never closes.
        let file = ManuallyDrop::new(unsafe { File::from_raw_fd(fd) });
        // Into a pipe (`rlaunch ... | consumer`), a 64 KiB buffer makes this thread and the
        // consumer take turns every 64 KiB; a larger one lets both run (docs/measurements.md,
        // *rlaunch's stdout pipe*).
        if file.metadata().is_ok_and(|m| m.file_type().is_fifo()) {
            rlaunch_tree::fdio::enlarge_pipe(&*file, rlaunch_tree::fdio::PIPE_CAPACITY);
        }
        let buf = Vec::with_capacity(BATCH);
        Terminal { file, buf, parts: Vec::new(), len: 0, broken: false, open_line: false }
    }

    fn append(&mut self, stamp: &[u8], prefix: &[u8], head: &[u8], body: &[u8]) {
        let start = self.buf.len();
        append(&mut self.buf, stamp, prefix, head, body);
        let end = self.buf.len();
        self.len += end - start;
        if end > start {
            self.open_line = self.buf[end - 1] != b'\n';
        }
        match self.parts.last_mut() {
            Some(Part::Buf(last)) if last.end == start => last.end = end,
            _ => self.parts.push(Part::Buf(start..end)),
        }
    }

    fn own(&mut self, data: Vec<u8>, range: Range<usize>) {
        self.len += range.len();
        if let Some(&last) = data[range.clone()].last() {
            self.open_line = last != b'\n';
        }
        self.parts.push(Part::Owned(data, range));
    }

    fn stash(&mut self, stash: Arc<Stash>, len: usize) {
        self.len += len;
        // Whole lines, or the start of one whose rest follows in its own part.
        self.open_line = false;
        self.parts.push(Part::Stashed(stash, len));
    }

    fn part<'a>(&'a self, part: &'a Part) -> &'a [u8] {
        match part {
            Part::Buf(range) => &self.buf[range.clone()],
            Part::Owned(data, range) => &data[range.clone()],
            Part::Stashed(..) => &[],
        }
    }

    /// Writes out what is buffered; returns the error of a newly broken sink.
    fn flush(&mut self) -> Option<io::Error> {
        let res = if self.len == 0 || self.broken { Ok(()) } else { self.write_parts() };
        self.clear();
        if self.buf.capacity() > BATCH * 4 {
            self.buf.shrink_to(BATCH);
        }
        res.err().inspect(|_| self.broken = true)
    }

    /// Every part, in order, with as few writes as the file takes (`writev` for the parts in
    /// memory, a splice for each stashed one). The stashed parts it wrote are taken out of
    /// `parts`; on an error, the caller throws away the rest ([`Terminal::clear`]).
    fn write_parts(&mut self) -> io::Result<()> {
        if let [Part::Buf(range)] = &self.parts[..] {
            return (&*self.file).write_all(&self.buf[range.clone()]);
        }
        let mut from = 0;
        for i in 0..self.parts.len() {
            if let Part::Stashed(stash, len) = &self.parts[i] {
                let (stash, len) = (stash.clone(), *len);
                self.write_gathered(from..i)?;
                self.parts[i] = Part::Buf(0..0);
                stash.empty_into(&self.file, len)?;
                from = i + 1;
            }
        }
        self.write_gathered(from..self.parts.len())
    }

    /// Forgets every part (what the stash holds for parts not written is thrown away).
    fn clear(&mut self) {
        for part in self.parts.drain(..) {
            if let Part::Stashed(stash, len) = part {
                stash.discard(len);
            }
        }
        self.buf.clear();
        self.len = 0;
    }

    fn write_gathered(&self, parts: Range<usize>) -> io::Result<()> {
        if parts.is_empty() {
            return Ok(());
        }
        let mut gather = Gather::new(self.parts[parts].iter().map(|p| self.part(p)).collect());
        while !gather.is_done() {
            match (&*self.file).write_vectored(&gather.slices()) {
                Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
                Ok(n) => gather.advance(n),
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
        }
        Ok(())
    }
}

/// An output file, opened once however many ranks and streams write to it.
struct OutFile {
    path: PathBuf,
    /// `None` when it could not be created.
    file: Option<File>,
    /// Output for it is discarded: it could not be created, or a write failed.
    broken: bool,
}

/// Bytes of the shared file buffer that belong to one file.
struct Stretch {
    file: usize,
    bytes: Range<usize>,
}

/// Why an output file failed; the job cannot keep its output, so it ends.
#[derive(Debug, Clone)]
pub(crate) enum FileFailure {
    /// A file or directory could not be created: `whose` output it was for
    /// ("stdout of rank 3").
    Create { path: PathBuf, whose: String, cause: String },
    /// A write failed (a full disk): several ranks may share the file.
    Write { path: PathBuf, cause: String },
}

impl fmt::Display for FileFailure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            FileFailure::Create { path, whose, cause } => {
                write!(f, "cannot create {} ({whose}): {cause}", path.display())
            }
            FileFailure::Write { path, cause } => {
                write!(f, "cannot write {}: {cause}", path.display())
            }
        }
    }
}

/// Every sink and the bytes they buffer.
pub(crate) struct Sinks {
    stdout: Terminal,
    stderr: Terminal,
    files: Vec<OutFile>,
    /// Files by the path they were opened under (as expanded, not resolved).
    by_path: HashMap<PathBuf, usize>,
    /// What is buffered for the files, in arrival order; `stretches` says for which.
    file_bytes: Vec<u8>,
    stretches: Vec<Stretch>,
    /// Where a file's stretches are gathered for its write.
    gather: Vec<u8>,
}

/// What a flush found broken.
pub(crate) struct Flushed {
    /// rlaunch's stdout is closed (newly).
    pub stdout_closed: bool,
    pub files: Vec<FileFailure>,
}

impl Sinks {
    pub(crate) fn new() -> Sinks {
        Sinks {
            stdout: Terminal::new(1),
            stderr: Terminal::new(2),
            files: Vec::new(),
            by_path: HashMap::new(),
            file_bytes: Vec::new(),
            stretches: Vec::new(),
            gather: Vec::new(),
        }
    }

    /// Whether what went to rlaunch's stderr (or to its stdout, when both are one file: a
    /// terminal, `2>&1`) ends mid-line: rlaunch's own last words then start on a line of
    /// their own.
    pub(crate) fn ends_mid_line(&self) -> bool {
        let same = |a: i32, b: i32| {
            let id = |fd| nix::sys::stat::fstat(fd).ok().map(|s| (s.st_dev, s.st_ino));
            id(a).is_some_and(|x| Some(x) == id(b))
        };
        self.stderr.open_line || (self.stdout.open_line && same(1, 2))
    }

    /// Bytes waiting for the next flush.
    pub(crate) fn buffered(&self) -> usize {
        self.stdout.len + self.stderr.len + self.file_bytes.len()
    }

    fn terminal(&mut self, stream: Stream) -> &mut Terminal {
        match stream {
            Stream::Stdout => &mut self.stdout,
            Stream::Stderr => &mut self.stderr,
        }
    }

    /// Takes `data[range]` (whole lines, nothing to put before them) for rlaunch's stdout or
    /// stderr as it is: written from `data` itself at the next flush.
    pub(crate) fn put_owned(&mut self, stream: Stream, data: Vec<u8>, range: Range<usize>) {
        let terminal = self.terminal(stream);
        if !terminal.broken {
            terminal.own(data, range);
        }
    }

    /// Takes the next `len` bytes of `stash` (whole lines, nothing to put before them) for
    /// rlaunch's stdout or stderr: spliced there at the next flush.
    pub(crate) fn put_stash(&mut self, stream: Stream, stash: Arc<Stash>, len: usize) {
        let terminal = self.terminal(stream);
        match terminal.broken {
            true => stash.discard(len),
            false => terminal.stash(stash, len),
        }
    }

    /// The file at `path`, created (truncated) the first time it is named, after its
    /// directories if `make_dirs`. A file that cannot be created is still a sink, one that
    /// drops what it gets, so that the failure is reported once.
    pub(crate) fn open(
        &mut self,
        path: &Path,
        make_dirs: bool,
        whose: impl FnOnce() -> String,
    ) -> (SinkId, Option<FileFailure>) {
        if let Some(&i) = self.by_path.get(path) {
            return (SinkId::File(i), None);
        }
        let parent = path.parent().filter(|p| make_dirs && !p.as_os_str().is_empty());
        let created = match parent.map(std::fs::create_dir_all) {
            Some(Err(e)) => Err((parent.unwrap_or(path), e)),
            _ => File::create(path).map_err(|e| (path, e)),
        };
        let (file, failure) = match created {
            Ok(file) => (Some(file), None),
            Err((failed, e)) => {
                let (path, cause) = (failed.to_path_buf(), crate::quote::io_error(&e));
                (None, Some(FileFailure::Create { path, whose: whose(), cause }))
            }
        };
        let i = self.files.len();
        self.files.push(OutFile { path: path.into(), broken: file.is_none(), file });
        self.by_path.insert(path.into(), i);
        (SinkId::File(i), failure)
    }

    /// Appends `head` + `body` to a sink, each line after `stamp` and `prefix`. `head` is
    /// the start of a line held back for its end (no newline), `body` whole lines or, at end
    /// of file or past the partial-line bound, a fragment.
    pub(crate) fn put(
        &mut self,
        id: SinkId,
        stamp: &[u8],
        prefix: &[u8],
        head: &[u8],
        body: &[u8],
    ) {
        let terminal = match id {
            SinkId::Stdout => &mut self.stdout,
            SinkId::Stderr => &mut self.stderr,
            SinkId::File(file) => {
                if self.files[file].broken {
                    return;
                }
                let start = self.file_bytes.len();
                append(&mut self.file_bytes, stamp, prefix, head, body);
                let end = self.file_bytes.len();
                match self.stretches.last_mut() {
                    Some(last) if last.file == file && last.bytes.end == start => {
                        last.bytes.end = end
                    }
                    _ => self.stretches.push(Stretch { file, bytes: start..end }),
                }
                return;
            }
        };
        if !terminal.broken {
            terminal.append(stamp, prefix, head, body);
        }
    }

    /// Forgets every buffer (whole lines, not written).
    pub(crate) fn discard(&mut self) {
        self.stdout.clear();
        self.stderr.clear();
        self.file_bytes.clear();
        self.stretches.clear();
    }

    /// Writes out every buffer.
    pub(crate) fn flush(&mut self) -> Flushed {
        let stdout_closed = match self.stdout.flush() {
            Some(e) => {
                tracing::debug!("stdout closed: {e}");
                true
            }
            None => false,
        };
        let _ = self.stderr.flush();
        let files = self.flush_files();
        Flushed { stdout_closed, files }
    }

    fn flush_files(&mut self) -> Vec<FileFailure> {
        let mut failures = Vec::new();
        // Stable: each file's stretches stay in the order they came.
        self.stretches.sort_by_key(|s| s.file);
        for group in self.stretches.chunk_by(|a, b| a.file == b.file) {
            let out = &mut self.files[group[0].file];
            let Some(file) = out.file.as_ref().filter(|_| !out.broken) else { continue };
            let bytes = match group {
                [one] => &self.file_bytes[one.bytes.clone()],
                _ => {
                    self.gather.clear();
                    for s in group {
                        self.gather.extend_from_slice(&self.file_bytes[s.bytes.clone()]);
                    }
                    &self.gather[..]
                }
            };
            if let Err(e) = (&*file).write_all(bytes) {
                out.broken = true;
                let cause = crate::quote::io_error(&e);
                failures.push(FileFailure::Write { path: out.path.clone(), cause });
            }
        }
        self.stretches.clear();
        self.file_bytes.clear();
        for buf in [&mut self.file_bytes, &mut self.gather] {
            if buf.capacity() > BATCH * 4 {
                buf.shrink_to(BATCH);
            }
        }
        failures
    }
}

/// Appends `head` + `body`, with `stamp` and `prefix` at the start of each line.
fn append(buf: &mut Vec<u8>, stamp: &[u8], prefix: &[u8], head: &[u8], body: &[u8]) {
    if stamp.is_empty() && prefix.is_empty() {
        buf.extend_from_slice(head);
        buf.extend_from_slice(body);
        return;
    }
    let mut line_start = true;
    for part in [head, body] {
        for line in part.split_inclusive(|&b| b == b'\n') {
            if line_start {
                buf.extend_from_slice(stamp);
                buf.extend_from_slice(prefix);
            }
            buf.extend_from_slice(line);
            line_start = line.last() == Some(&b'\n');
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn appended(stamp: &str, prefix: &str, head: &str, body: &str) -> String {
        let mut buf = Vec::new();
        append(&mut buf, stamp.as_bytes(), prefix.as_bytes(), head.as_bytes(), body.as_bytes());
        String::from_utf8(buf).unwrap()
    }

    #[test]
    fn each_line_gets_its_prefixes_once() {
        assert_eq!(appended("", "", "ab", "c\nd\n"), "abc\nd\n");
        assert_eq!(appended("T ", "[1] ", "ab", "c\nd\n"), "T [1] abc\nT [1] d\n");
        assert_eq!(appended("", "> ", "", "x\n\ny"), "> x\n> \n> y");
        assert_eq!(appended("", "> ", "", ""), "");
    }

    #[test]
    fn shared_files_get_their_stretches_in_order() {
        let dir = std::env::temp_dir().join(format!("rlaunch-sinks-{}", std::process::id()));
        let mut sinks = Sinks::new();
        let (a, failure) = sinks.open(&dir.join("x/a"), true, || "a".into());
        assert!(failure.is_none());
        let (b, _) = sinks.open(&dir.join("x/b"), true, || "b".into());
        assert_eq!(sinks.open(&dir.join("x/a"), true, || "again".into()).0, a);
        for (id, text) in [(a, "1\n"), (b, "x\n"), (a, "2\n"), (a, "3\n"), (b, "y\n")] {
            sinks.put(id, b"", b"", b"", text.as_bytes());
        }
        assert_eq!(sinks.buffered(), 10);
        assert!(sinks.flush().files.is_empty());
        assert_eq!(std::fs::read_to_string(dir.join("x/a")).unwrap(), "1\n2\n3\n");
        assert_eq!(std::fs::read_to_string(dir.join("x/b")).unwrap(), "x\ny\n");
        assert_eq!(sinks.buffered(), 0);

        let (_, failure) = sinks.open(&dir.join("missing/c"), false, || "rank 9".into());
        let text = failure.unwrap().to_string();
        assert!(text.starts_with("cannot create ") && text.contains("missing/c (rank 9): "));
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
