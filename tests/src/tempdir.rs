//! Scratch directories for pid files, scripts and working directories.

use std::path::{Path, PathBuf};

/// A fresh directory under [`std::env::temp_dir`], removed with its contents on drop.
#[derive(Debug)]
pub struct TempDir {
    path: PathBuf,
}

/// Creates a [`TempDir`]; panics when it cannot.
pub fn tempdir() -> TempDir {
    let base = std::env::temp_dir();
    loop {
        let path = base.join(format!("rlaunch-test-{}", crate::unique_id()));
        match std::fs::create_dir(&path) {
            Ok(()) => return TempDir { path },
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
            Err(e) => panic!("cannot create a directory in {}: {e}", base.display()),
        }
    }
}

impl TempDir {
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// `self.path().join(name)`.
    pub fn join(&self, name: impl AsRef<Path>) -> PathBuf {
        self.path.join(name)
    }
}

impl AsRef<Path> for TempDir {
    fn as_ref(&self) -> &Path {
        &self.path
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.path);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn created_unique_and_removed() {
        let a = tempdir();
        let b = tempdir();
        assert_ne!(a.path(), b.path());
        std::fs::write(a.join("file"), "x").unwrap();
        let path = a.path().to_path_buf();
        assert!(path.is_dir());
        drop(a);
        assert!(!path.exists());
    }
}
