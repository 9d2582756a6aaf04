//! `--bcast`: the files every node gets before its ranks start, checked and opened here, so
//! that a file that cannot be sent stops the launch before anything starts. The job carries
//! what each node needs to know of them ([`Bcast`]); the root feeds their bytes down the
//! tree from the files opened here (`job::Plan::bcast_files`).

use std::fs::File;
use std::io::Read;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use rlaunch_protocol::control::{Bcast, BcastFile, Segment};
use rlaunch_tree::bcast::SourceFile;

use super::{find_program, segment_var};
use crate::error::UsageError;

/// Files opened, with their lengths and names: what the root feeds the tree from.
pub(crate) type Opened = Vec<SourceFile>;

/// The job's broadcast and its files, opened, with their lengths; `None` without `--bcast`.
pub(super) fn bcast(
    files: &[(PathBuf, String)],
    base: Option<&String>,
    segments: &[Segment],
    job_env: &[(Vec<u8>, Vec<u8>)],
) -> Result<Option<(Bcast, Opened)>, UsageError> {
    if files.is_empty() {
        return Ok(None);
    }
    let programs: Vec<Option<PathBuf>> = segments
        .iter()
        .map(|segment| {
            let path = segment_var(segment, job_env, b"PATH").unwrap_or(b"/bin:/usr/bin");
            let found = find_program(&segment.exe, path, &segment.wdir)?;
            std::fs::canonicalize(found).ok()
        })
        .collect();
    let mut sent = Vec::new();
    let mut opened = Vec::new();
    for (path, dest) in files {
        let failed = |why: String| UsageError::Bcast { file: path.display().to_string(), why };
        // Two names for one path (`a/./b`, `a//b`), or a file where another's directory is
        // to be: no node could hold both.
        let clash = |f: &&BcastFile| {
            let (a, b) = (Path::new(&f.dest), Path::new(dest));
            a == b || a.starts_with(b) || b.starts_with(a)
        };
        if let Some(other) = sent.iter().find(clash) {
            let why = match Path::new(&other.dest) == Path::new(dest) {
                true => format!("a file is sent as {dest} already"),
                false => format!("{dest} and {} cannot both be on a node", other.dest),
            };
            return Err(failed(why));
        }
        let mut file = File::open(path).map_err(|e| failed(crate::quote::io_error(&e)))?;
        let meta = file.metadata().map_err(|e| failed(crate::quote::io_error(&e)))?;
        if !meta.is_file() {
            return Err(failed("not a regular file".into()));
        }
        let (crc, size) = checksum(&mut file).map_err(|e| failed(crate::quote::io_error(&e)))?;
        if size != meta.len() {
            return Err(failed("it changed while it was read".into()));
        }
        let canonical = std::fs::canonicalize(path).ok();
        let runs = programs.iter().enumerate().filter(|(_, p)| p.is_some() && **p == canonical);
        sent.push(BcastFile {
            dest: dest.clone(),
            size,
            mode: meta.mode() & 0o7777,
            crc,
            programs: runs.map(|(i, _)| i as u32).collect(),
        });
        opened.push(SourceFile { file, len: size, path: path.clone() });
    }
    Ok(Some((Bcast { files: sent, base: base.cloned() }, opened)))
}

/// The CRC-32 of what `file` holds, and how many bytes it read.
fn checksum(file: &mut File) -> std::io::Result<(u32, u64)> {
    let mut hasher = crc32fast::Hasher::new();
    let mut buf = vec![0; 1 << 20];
    let mut size = 0;
    loop {
        match file.read(&mut buf)? {
            0 => return Ok((hasher.finalize(), size)),
            n => {
                hasher.update(&buf[..n]);
                size += n as u64;
            }
        }
    }
}
