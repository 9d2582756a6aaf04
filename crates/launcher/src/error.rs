//! Why rlaunch does not start a job: the command line asks for something it cannot do
//! ([`UsageError`], exit status 2), or it cannot run at all ([`SetupError`], 255). Each
//! renders as the one line rlaunch prints after `rlaunch: `.

use std::io;
use std::path::PathBuf;

use crate::allocation::AllocationError;
use crate::args::ArgsError;
use crate::configfile::ConfigfileError;
use crate::hosts::{plain, HostsError};
use crate::options::OptionError;

/// The command line, or a file it names, asks for a job rlaunch cannot run as written.
#[derive(Debug, thiserror::Error)]
pub enum UsageError {
    #[error(transparent)]
    Args(#[from] ArgsError),
    #[error(transparent)]
    Configfile(#[from] ConfigfileError),
    #[error(transparent)]
    Option(#[from] OptionError),
    #[error(transparent)]
    Hosts(#[from] HostsError),
    #[error(transparent)]
    Allocation(#[from] AllocationError),
    /// More than `u32::MAX` ranks in all.
    #[error("too many ranks")]
    TooManyRanks,
    /// More ranks than `hosts` hosts can run, at the most processes Linux runs on one.
    #[error("{ranks} ranks on {hosts} host{}: more than Linux can run (4194304 processes a host)", if *.hosts == 1 { "" } else { "s" })]
    RanksBeyondHosts { ranks: u64, hosts: usize },
    #[error("--stdin {rank}: the job has only {size} ranks")]
    StdinBeyondJob { rank: u32, size: u32 },
    #[error("--pset {}: rank {rank} is beyond the job's {size} ranks", cut(.name))]
    PsetBeyondJob { name: String, rank: u32, size: u32 },
    #[error("--pset {}: a process set of that name is already defined", cut(.name))]
    PsetTwice { name: String },
    /// As written.
    #[error("--stdin {}: expected a rank number, 'all' or 'none'", cut(.0))]
    StdinTarget(String),
}

/// rlaunch itself cannot run the job, whatever the command line.
#[derive(Debug, thiserror::Error)]
pub enum SetupError {
    #[error("cannot read the current directory: {}", plain(.0))]
    CurrentDir(io::Error),
    #[error("cannot find my own executable: {0}")]
    OwnExecutable(io::Error),
    /// Where the proxy should have been.
    #[error("cannot find rlaunch-proxy at {} (install it next to rlaunch)", .0.display())]
    NoProxy(PathBuf),
    /// No address of this machine is known to reach `node`.
    #[error("cannot find the address that reaches {node} to listen on for its proxy ({}); give --bind-address", plain(.cause))]
    NoRoute { node: String, cause: io::Error },
    /// `--tracker rabit` cannot listen.
    #[error("cannot listen at {addr} for the rabit tracker: {}", plain(.error))]
    Tracker { addr: std::net::IpAddr, error: io::Error },
    /// The job needs PMIx and this rlaunch has none.
    #[error("{asks}, which this rlaunch was built without; {}", rlaunch_proxy::pmix::GET_PMIX)]
    NoPmix { asks: &'static str },
    /// `--report FILE` or `--timeline FILE` cannot be created.
    #[error("cannot write the {what} {}: {}", cut(&.path.to_string_lossy()), plain(.error))]
    EndFile { what: &'static str, path: PathBuf, error: io::Error },
}

/// At most this many characters of a culprit are quoted back to the user.
pub(crate) const QUOTED_MAX: usize = 64;

/// `text` as an error line quotes it: whole when short, else its first [`QUOTED_MAX`]
/// characters and `...`, with control characters escaped (`\n`). Input can be a megabyte
/// long and hold newlines; an error line is one short line.
pub(crate) fn cut(text: &str) -> String {
    let mut quoted = String::new();
    let mut shown = 0;
    for c in text.chars() {
        // Invisible or reordering characters (zero-width, bidi controls, line and paragraph
        // separators) could make a culprit read as something else: shown escaped too.
        let invisible = matches!(c, '\u{200b}'..='\u{200f}' | '\u{2028}'..='\u{202e}'
            | '\u{2060}'..='\u{2069}' | '\u{feff}');
        let escaped = (c.is_control() || invisible).then(|| c.escape_default());
        let width = escaped.clone().map_or(1, |e| e.count());
        if shown + width > QUOTED_MAX {
            quoted.push_str("...");
            break;
        }
        shown += width;
        match escaped {
            Some(e) => quoted.extend(e),
            None => quoted.push(c),
        }
    }
    quoted
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn long_culprits_are_cut() {
        assert_eq!(cut("n1"), "n1");
        let long = "é".repeat(100);
        assert_eq!(cut(&long), format!("{}...", "é".repeat(QUOTED_MAX)));
        assert_eq!(cut(&"a".repeat(QUOTED_MAX)), "a".repeat(QUOTED_MAX));
        assert_eq!(cut("a\u{202e}b"), "a\\u{202e}b", "a bidi override is shown, not obeyed");
        // Found by fuzzing: a newline in --hosts made a two-line error.
        assert_eq!(cut("a\nb\t\u{1b}"), "a\\nb\\t\\u{1b}");
    }
}
