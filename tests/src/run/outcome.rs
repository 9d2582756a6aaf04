//! How a run ended, and the texts failure messages show.

use std::fmt;
use std::os::unix::process::ExitStatusExt;
use std::process::ExitStatus;
use std::time::Duration;

use nix::sys::signal::Signal;

use crate::procs::Tag;

/// Output beyond this is cut from the middle in failure messages.
pub(super) const EXCERPT: usize = 16 * 1024;

/// How a run ended. Dropping it SIGKILLs any process still carrying its tag.
pub struct Outcome {
    pub status: ExitStatus,
    /// The exit code, `None` when a signal ended the program.
    pub code: Option<i32>,
    pub stdout: Vec<u8>,
    pub stderr: Vec<u8>,
    /// From the start to the end of the output.
    pub elapsed: Duration,
    pub command_line: String,
    /// Check for leftovers with [`Tag::wait_until_none`].
    pub tag: Tag,
}

impl Outcome {
    /// The signal that ended the program.
    pub fn signal(&self) -> Option<i32> {
        self.status.signal()
    }

    pub fn stdout_str(&self) -> String {
        String::from_utf8_lossy(&self.stdout).into_owned()
    }

    pub fn stderr_str(&self) -> String {
        String::from_utf8_lossy(&self.stderr).into_owned()
    }

    /// Stdout's lines, without newlines.
    pub fn lines(&self) -> Vec<String> {
        self.stdout_str().lines().map(str::to_owned).collect()
    }

    pub fn stderr_lines(&self) -> Vec<String> {
        self.stderr_str().lines().map(str::to_owned).collect()
    }

    /// Panics, showing the whole outcome, unless the program exited with `code`.
    pub fn assert_code(&self, code: i32) -> &Outcome {
        assert_eq!(self.code, Some(code), "expected exit code {code}: {self}");
        self
    }

    /// Panics, showing the whole outcome, unless `sig` ended the program.
    pub fn assert_signal(&self, sig: Signal) -> &Outcome {
        assert_eq!(self.signal(), Some(sig as i32), "expected death by {sig}: {self}");
        self
    }
}

impl fmt::Display for Outcome {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "`{}` {} after {:.2?}\n{}",
            self.command_line,
            status_text(self.status),
            self.elapsed,
            transcript(&self.stdout, &self.stderr)
        )
    }
}

impl fmt::Debug for Outcome {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(self, f)
    }
}

pub(super) fn status_text(status: ExitStatus) -> String {
    if let Some(code) = status.code() {
        return format!("exited with code {code}");
    }
    let Some(number) = status.signal() else {
        return format!("ended with {status}");
    };
    let name =
        Signal::try_from(number).map_or_else(|_| format!("signal {number}"), |s| s.to_string());
    let core = if status.core_dumped() { " (core dumped)" } else { "" };
    format!("was killed by {name}{core}")
}

pub(super) fn transcript(stdout: &[u8], stderr: &[u8]) -> String {
    format!(
        "--- stdout ({} bytes) ---\n{}\n--- stderr ({} bytes) ---\n{}\n--- end ---",
        stdout.len(),
        excerpt(stdout),
        stderr.len(),
        excerpt(stderr)
    )
}

/// The output, cut in the middle when long.
pub(super) fn excerpt(bytes: &[u8]) -> String {
    if bytes.len() <= EXCERPT {
        return String::from_utf8_lossy(bytes).into_owned();
    }
    let half = EXCERPT / 2;
    format!(
        "{}\n[... {} bytes cut ...]\n{}",
        String::from_utf8_lossy(&bytes[..half]),
        bytes.len() - 2 * half,
        String::from_utf8_lossy(&bytes[bytes.len() - half..])
    )
}
