//! Reading sysfs: a directory's names, a number in a file, and the error that names a file
//! whose text is not what the kernel writes there.

use std::fs;
use std::io;
use std::path::Path;

/// The names in directory `dir`; none when it does not exist (a kernel without NUMA, a
/// machine without a PCI bus or an AMD driver).
pub(crate) fn names_in(dir: &Path) -> io::Result<Vec<std::ffi::OsString>> {
    match fs::read_dir(dir) {
        Ok(entries) => entries.map(|entry| entry.map(|e| e.file_name())).collect(),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(Vec::new()),
        Err(e) => Err(e),
    }
}

/// A number in a sysfs file; `None` when the file does not exist.
pub(crate) fn read_id(path: &Path) -> io::Result<Option<i64>> {
    match fs::read_to_string(path) {
        Ok(text) => text
            .trim()
            .parse()
            .map(Some)
            .map_err(|_| invalid(&path.display().to_string(), "a number", &text)),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(e),
    }
}

pub(crate) fn invalid(what: &str, expected: &str, text: &str) -> io::Error {
    let msg = format!("{what} is not {expected}: {:?}", cut(text));
    io::Error::new(io::ErrorKind::InvalidData, msg)
}

/// At most 40 characters of a file's text, for an error.
pub(crate) fn cut(text: &str) -> String {
    text.trim().chars().take(40).collect()
}
