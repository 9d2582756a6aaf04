//! The files broadcast to this node (`--bcast`): written in order into the node's own
//! directory, each checked against its CRC, fed on to the children from the copies
//! (rlaunch-tree's `bcast`), and removed when the node ends. The launched job's ranks wait
//! for them ([`Wait::Files`]), and run with `RLAUNCH_BCAST_DIR` naming the directory (and
//! the copy of their program, when it is one of the files).
//!
//! ```text
//!  Down::BcastData ──► Copies::write ──► files in DIR ──► Feeds ──► children
//!                          │ a file whole: its CRC checked, its mode set
//!                          └ all in: the gate opens     Up::BcastAck(min of subtree) ──► parent
//! ```

use std::fs::File;
use std::io;
use std::os::unix::fs::{DirBuilderExt, FileExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use rlaunch_protocol::control::{Bcast, Segment, Up};
use rlaunch_tree::bcast::{Feeds, Source, SourceFile, CHUNK};
use rlaunch_tree::io_sentence;

use super::{Node, Wait};

/// The variable that names the node's directory of broadcast files, for the ranks.
pub const DIR_VAR: &str = "RLAUNCH_BCAST_DIR";

/// This node's copies of the broadcast files.
pub(super) struct Copies {
    dir: PathBuf,
    files: Vec<Copied>,
    /// Bytes of the stream written so far (every file before the one being written, whole).
    written: u64,
    total: u64,
    /// What the parent was last told this subtree has (`None`: nothing yet).
    acked: Option<u64>,
    /// The copies as a stream, to feed the children from.
    source: Source,
    feeds: Feeds,
    /// Something went wrong here: the job is ending, nothing more is written or fed.
    failed: bool,
}

struct Copied {
    path: PathBuf,
    /// Open for writing until it is whole: a program still open for writing cannot be
    /// run (ETXTBSY).
    file: Option<File>,
    size: u64,
    mode: u32,
    crc: u32,
    hasher: crc32fast::Hasher,
}

impl Copies {
    /// The node's directory for attempt `attempt` of job `jobid` (node `index`, on `host`),
    /// made afresh, with an empty file for each of `bcast`'s. Each attempt has its own: a
    /// lost proxy of the last one may have left its directory behind.
    fn create(bcast: &Bcast, job: (&str, u32), index: u32, host: &str) -> Result<Copies, String> {
        let base = match &bcast.base {
            Some(base) => PathBuf::from(base.replace("%h", host)),
            None => std::env::temp_dir(),
        };
        let (jobid, attempt) = job;
        let dir = base.join(format!("rlaunch-bcast.{jobid}.{attempt}.{index}"));
        std::fs::DirBuilder::new()
            .mode(0o700)
            .create(&dir)
            .map_err(|e| format!("cannot make {}: {}", dir.display(), io_sentence(&e)))?;
        let mut copies = Copies {
            dir,
            files: Vec::new(),
            written: 0,
            total: bcast.total(),
            acked: None,
            source: Source::new(Vec::new()),
            feeds: Feeds::default(),
            failed: false,
        };
        let mut sources = Vec::new();
        for f in &bcast.files {
            let path = copies.dir.join(&f.dest);
            let made = path.parent().map_or(Ok(()), |p| {
                std::fs::DirBuilder::new().recursive(true).mode(0o700).create(p)
            });
            let file = made
                .and_then(|_| {
                    let mut open = std::fs::OpenOptions::new();
                    open.write(true).create_new(true).mode(0o600).open(&path)
                })
                .and_then(|file| Ok((file, File::open(&path)?)));
            let (file, reader) =
                file.map_err(|e| format!("cannot create {}: {}", path.display(), io_sentence(&e)))?;
            sources.push(SourceFile { file: reader, len: f.size, path: path.clone() });
            let (file, hasher) = (Some(file), crc32fast::Hasher::new());
            let (size, mode, crc) = (f.size, f.mode, f.crc);
            copies.files.push(Copied { path, file, size, mode, crc, hasher });
        }
        copies.source = Source::new(sources);
        Ok(copies)
    }

    /// Every file is here, whole and checked.
    fn complete(&self) -> bool {
        self.written == self.total
    }

    /// Writes `data`, the bytes at `offset` of the stream. Bytes written already (sent
    /// again to a proxy rlaunch adopted) are dropped. Err: why this node cannot have its
    /// files (a write failed, a file came out other than it was sent).
    fn write(&mut self, offset: u64, data: &[u8]) -> Result<(), String> {
        let end = offset + data.len() as u64;
        if end <= self.written {
            return Ok(());
        }
        if offset > self.written {
            let gap = offset - self.written;
            return Err(format!("{gap} bytes of the stream at {} never came", self.written));
        }
        let mut data = &data[(self.written - offset) as usize..];
        let mut start = 0;
        for copy in &mut self.files {
            let file_end = start + copy.size;
            if self.written < file_end && !data.is_empty() {
                let at = self.written - start;
                let n = data.len().min((copy.size - at) as usize);
                let written = match &copy.file {
                    Some(file) => file.write_all_at(&data[..n], at),
                    None => Err(io::Error::other("it was closed")),
                };
                written.map_err(|e| {
                    format!("cannot write {}: {}", copy.path.display(), io_sentence(&e))
                })?;
                copy.hasher.update(&data[..n]);
                (self.written, data) = (self.written + n as u64, &data[n..]);
                if self.written == file_end {
                    copy.finish()?;
                }
            }
            start = file_end;
        }
        if !data.is_empty() {
            return Err(format!("{} bytes came past the end of the last file", data.len()));
        }
        Ok(())
    }

    /// Files of no bytes are whole from the start.
    fn finish_empty(&mut self) -> Result<(), String> {
        for copy in self.files.iter_mut().filter(|c| c.size == 0) {
            copy.finish()?;
        }
        Ok(())
    }
}

impl Copied {
    /// The file is written: its bytes are checked, and it gets its mode.
    fn finish(&mut self) -> Result<(), String> {
        let crc = std::mem::take(&mut self.hasher).finalize();
        if crc != self.crc {
            return Err(format!(
                "{} came out with CRC {crc:08x}, not the {:08x} it was sent with",
                self.path.display(),
                self.crc
            ));
        }
        let perms = std::fs::Permissions::from_mode(self.mode & 0o7777);
        let file = self.file.take().ok_or_else(|| io::Error::other("it was closed"));
        file.and_then(|file| file.set_permissions(perms)).map_err(|e| {
            format!("cannot set the mode of {}: {}", self.path.display(), io_sentence(&e))
        })
    }
}

impl Node {
    /// Makes this node's directory for the broadcast files, if the job has some; its ranks
    /// wait for them. A node that cannot make it fails the job, naming itself.
    pub(super) fn start_bcast(&mut self) {
        let Some(bcast) = self.job.bcast.as_ref().filter(|_| !self.late) else { return };
        let job = (self.job.jobid.as_str(), self.job.restart);
        let created = Copies::create(bcast, job, self.plan.index.0, &self.plan.host);
        self.gate.wait(Wait::Files);
        match created {
            Ok(mut copies) => {
                let empty = copies.finish_empty();
                self.copies = Some(copies);
                if let Err(why) = empty {
                    return self.bcast_failed(why);
                }
                // The parent hears that this node is ready for the files (all of them, if
                // they hold no bytes).
                self.bcast_step();
            }
            Err(why) => {
                // Nothing of it to feed the children from: they wait with the ranks until
                // the job ends.
                let (host, job) = (self.plan.host.clone(), self.job.jobid.clone());
                tracing::debug!(%host, %job, "no directory for the broadcast files: {why}");
                let _ = self.up.control.send(Up::BcastFailed { host, why });
            }
        }
    }

    /// Bytes of the broadcast files came from the parent.
    pub(super) fn bcast_data(&mut self, offset: u64, data: Arc<[u8]>) {
        let Some(copies) = self.copies.as_mut().filter(|c| !c.failed) else { return };
        if let Err(why) = copies.write(offset, &data) {
            return self.bcast_failed(why);
        }
        self.bcast_step();
    }

    /// Child `child`'s subtree has `bytes` of the files.
    pub(super) fn bcast_acked(&mut self, child: usize, bytes: u64) {
        if let Some(copies) = self.copies.as_mut() {
            copies.feeds.acked(child, bytes);
            self.bcast_step();
        }
    }

    /// After any news of the broadcast (bytes written, a child's acknowledgement, a child
    /// lost): the children are fed what is here, and the parent told what the whole
    /// subtree has.
    pub(super) fn bcast_step(&mut self) {
        let Some(copies) = self.copies.as_mut().filter(|c| !c.failed) else { return };
        let fed = copies.feeds.feed(&self.children, &mut copies.source, copies.written);
        if let Err(why) = fed {
            return self.bcast_failed(why);
        }
        let (subtree, heard) = match copies.feeds.low(&self.children) {
            Some((low, heard)) => (low.min(copies.written), heard),
            None => (copies.written, true),
        };
        let news = match copies.acked {
            None => heard,
            // At whole chunks, at the end, and whenever the subtree catches up with this
            // node: a level whose least moves in pieces smaller than a chunk holds no byte
            // back from its parent's window.
            Some(acked) => {
                subtree > acked
                    && (subtree - acked >= CHUNK
                        || subtree == copies.total
                        || subtree == copies.written)
            }
        };
        if news {
            copies.acked = Some(subtree);
            let _ = self.up.control.send(Up::BcastAck { bytes: subtree });
        }
    }

    /// Every node has the files: the children hear it, and the ranks start (with the rest
    /// they wait for).
    pub(super) fn bcast_done(&mut self) {
        self.children.broadcast(&rlaunch_protocol::control::Down::BcastDone);
        let Some(copies) = self.copies.as_ref().filter(|c| !c.failed && c.complete()) else {
            let why = "told that every node has the files, before this one had them".to_string();
            return self.bcast_failed(why);
        };
        tracing::debug!(dir = %copies.dir.display(), "the broadcast files are on every node");
        if self.gate.came(Wait::Files) {
            self.start_launched_ranks();
        }
    }

    /// This proxy was adopted: its new parent is told from scratch how far the subtree has
    /// the files.
    pub(super) fn bcast_again(&mut self) {
        if let Some(copies) = self.copies.as_mut() {
            copies.acked = None;
        }
        self.bcast_step();
    }

    fn bcast_failed(&mut self, why: String) {
        if let Some(copies) = self.copies.as_mut() {
            copies.failed = true;
        }
        let host = self.plan.host.clone();
        let _ = self.up.control.send(Up::BcastFailed { host, why });
    }

    /// The launched job's segment `segment` as its ranks here run it: with the node's
    /// broadcast files, in `RLAUNCH_BCAST_DIR`, and from the copy of its program if that is
    /// one of them.
    pub(super) fn with_bcast(&self, segment: u32) -> Option<Segment> {
        let (copies, bcast) = (self.copies.as_ref()?, self.job.bcast.as_ref()?);
        let mut s = self.job.segments.get(segment as usize)?.clone();
        let dir = copies.dir.as_os_str().as_encoded_bytes().to_vec();
        s.env.push((DIR_VAR.as_bytes().to_vec(), dir));
        let program =
            bcast.files.iter().zip(&copies.files).find(|(f, _)| f.programs.contains(&segment));
        if let Some((_, copy)) = program {
            s.exe = copy.path.as_os_str().as_encoded_bytes().to_vec();
        }
        Some(s)
    }

    /// The node ends: its copies go (see `Drop for Copies`).
    pub(super) fn remove_bcast(&mut self) {
        self.copies = None;
    }
}

/// The directory goes with the copies: when the node ends, and when it could not be filled
/// (a file that could not be created, `Copies::create` failing half-way).
impl Drop for Copies {
    fn drop(&mut self) {
        remove_dir(&self.dir);
    }
}

fn remove_dir(dir: &Path) {
    if let Err(e) = std::fs::remove_dir_all(dir) {
        tracing::warn!(dir = %dir.display(), "cannot remove the broadcast files: {e}");
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rlaunch_protocol::control::BcastFile;

    fn bcast(files: &[(&str, &[u8])], base: &Path) -> Bcast {
        let files = files
            .iter()
            .map(|(dest, bytes)| BcastFile {
                dest: dest.to_string(),
                size: bytes.len() as u64,
                mode: 0o755,
                crc: crc32fast::hash(bytes),
                programs: Vec::new(),
            })
            .collect();
        Bcast { files, base: Some(base.to_str().unwrap().to_string()) }
    }

    fn scratch(name: &str) -> PathBuf {
        let pid = std::process::id();
        let dir = std::env::temp_dir().join(format!("rlaunch-bcast-unit.{pid}.{name}"));
        std::fs::create_dir_all(&dir).unwrap();
        dir
    }

    #[test]
    fn pieces_in_order_make_the_files_and_pieces_sent_again_are_dropped() {
        let base = scratch("a");
        let b = bcast(&[("x", b"hello"), ("sub/y", b""), ("z", b"world!")], &base);
        let mut copies = Copies::create(&b, ("job", 0), 3, "n1").unwrap();
        copies.finish_empty().unwrap();
        let stream = b"helloworld!";
        copies.write(0, &stream[..3]).unwrap();
        copies.write(0, &stream[..7]).unwrap();
        assert!(copies.write(9, &stream[9..]).is_err(), "a gap is refused");
        copies.write(7, &stream[7..]).unwrap();
        assert!(copies.complete());
        let dir = base.join("rlaunch-bcast.job.0.3");
        assert_eq!(std::fs::read(dir.join("x")).unwrap(), b"hello");
        assert_eq!(std::fs::read(dir.join("z")).unwrap(), b"world!");
        assert_eq!(std::fs::read(dir.join("sub/y")).unwrap(), b"");
        let mode = std::fs::metadata(dir.join("z")).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o755);
        drop(copies);
        assert!(!dir.exists(), "the directory goes with the copies");
        remove_dir(&base);
    }

    #[test]
    fn bytes_that_do_not_match_their_crc_fail_and_a_used_directory_too() {
        let base = scratch("b");
        let b = bcast(&[("x", b"hello")], &base);
        let mut copies = Copies::create(&b, ("job", 1), 0, "n1").unwrap();
        let why = copies.write(0, b"hellO").unwrap_err();
        assert!(why.contains("came out with CRC"), "{why}");
        let again = Copies::create(&b, ("job", 1), 0, "n1").err().expect("the directory exists");
        assert!(again.starts_with("cannot make ") && again.contains("File exists"), "{again}");
        drop(copies);
        // A file that cannot be created: the directory made for it goes too.
        let clash = bcast(&[("x", b"a"), ("x/y", b"b")], &base);
        let why = Copies::create(&clash, ("job", 2), 0, "n1").err().expect("x is a file");
        assert!(why.starts_with("cannot create ") && why.contains("/x/y: "), "{why}");
        assert_eq!(std::fs::read_dir(&base).unwrap().count(), 0, "nothing left");
        remove_dir(&base);
    }
}
