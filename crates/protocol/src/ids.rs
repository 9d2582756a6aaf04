//! Small shared vocabulary: which node, how a rank ended, which stream a byte came from.

use std::fmt;

use serde::{Deserialize, Serialize};

/// A node of the job: its index in the launcher's host list, which is also its node id in
/// `PMI_process_mapping` and the index into a job's per-node tables. Not a rank: the two
/// were both bare `u32`s, and the compiler now tells them apart.
#[derive(
    Debug, Clone, Copy, Default, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize,
)]
#[serde(transparent)]
pub struct NodeId(pub u32);

impl NodeId {
    /// As an index into a per-node table.
    pub fn index(self) -> usize {
        self.0 as usize
    }
}

/// A process of the run as every frame names it: rank r of the launched job is `Gid(r)`; rank
/// r of a spawned job is `Gid(first + r)`, past the ids already given. Not its rank in its own
/// job (what its PMI and its variables say), which is a bare `u32`.
#[derive(
    Debug, Clone, Copy, Default, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize,
)]
#[serde(transparent)]
pub struct Gid(pub u32);

impl Gid {
    /// As an index into a per-process table.
    pub fn index(self) -> usize {
        self.0 as usize
    }
}

impl fmt::Display for Gid {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.fmt(f)
    }
}

impl fmt::Display for NodeId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.fmt(f)
    }
}

/// How a rank ended. Never a raw wait status.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum ExitOutcome {
    /// It called exit with this code.
    Exited(i32),
    /// It was killed by this signal.
    Signaled(i32),
    /// It never ran: exec failed with this errno.
    SpawnFailed { errno: i32 },
    /// It never ran: its working directory could not be entered.
    NoWorkdir { errno: i32 },
}

impl ExitOutcome {
    pub fn is_success(self) -> bool {
        self == ExitOutcome::Exited(0)
    }
}

impl fmt::Display for ExitOutcome {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self {
            ExitOutcome::Exited(code) => write!(f, "exited with code {code}"),
            ExitOutcome::Signaled(sig) => {
                write!(f, "was killed by signal {sig} ({})", signal_name(sig))
            }
            ExitOutcome::SpawnFailed { errno } => {
                write!(f, "could not be started: {}", std::io::Error::from_raw_os_error(errno))
            }
            ExitOutcome::NoWorkdir { errno } => write!(
                f,
                "could not enter its working directory: {}",
                std::io::Error::from_raw_os_error(errno)
            ),
        }
    }
}

/// The conventional name of a Linux signal number.
pub fn signal_name(sig: i32) -> String {
    const NAMES: [&str; 32] = [
        "",
        "SIGHUP",
        "SIGINT",
        "SIGQUIT",
        "SIGILL",
        "SIGTRAP",
        "SIGABRT",
        "SIGBUS",
        "SIGFPE",
        "SIGKILL",
        "SIGUSR1",
        "SIGSEGV",
        "SIGUSR2",
        "SIGPIPE",
        "SIGALRM",
        "SIGTERM",
        "SIGSTKFLT",
        "SIGCHLD",
        "SIGCONT",
        "SIGSTOP",
        "SIGTSTP",
        "SIGTTIN",
        "SIGTTOU",
        "SIGURG",
        "SIGXCPU",
        "SIGXFSZ",
        "SIGVTALRM",
        "SIGPROF",
        "SIGWINCH",
        "SIGIO",
        "SIGPWR",
        "SIGSYS",
    ];
    match NAMES.get(sig as usize) {
        Some(name) if sig > 0 => (*name).to_string(),
        _ => format!("SIGRT{sig}"),
    }
}

/// Which of a rank's output streams.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[repr(u8)]
pub enum Stream {
    Stdout = 1,
    Stderr = 2,
}

impl Stream {
    pub fn from_u8(b: u8) -> Option<Stream> {
        match b {
            1 => Some(Stream::Stdout),
            2 => Some(Stream::Stderr),
            _ => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn outcomes_read_as_phrases() {
        assert_eq!(ExitOutcome::Signaled(11).to_string(), "was killed by signal 11 (SIGSEGV)");
    }
}
