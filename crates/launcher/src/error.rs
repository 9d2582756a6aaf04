//! Why rlaunch does not start a job: the command line asks for something it cannot do
//! ([`UsageError`], exit status 2), or it cannot run at all ([`SetupError`], 255). Each
//! renders as the one line rlaunch prints after `rlaunch: `.

use std::io;
use std::path::PathBuf;

use crate::allocation::AllocationError;
use crate::args::ArgsError;
use crate::configfile::ConfigfileError;
use crate::hosts::HostsError;
use crate::options::OptionError;
use crate::quote::{cut, io_error};

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
    /// `--map-by ppr:N:UNIT` counts this machine's UNITs, and cannot.
    #[error("{0}")]
    Topology(String),
    #[error("cannot read the current directory: {}", io_error(.0))]
    CurrentDir(io::Error),
    #[error("cannot find my own executable: {0}")]
    OwnExecutable(io::Error),
    /// Where the proxy should have been.
    #[error("cannot find rlaunch-proxy at {} (install it next to rlaunch)", .0.display())]
    NoProxy(PathBuf),
    /// No address of this machine is known to reach `node`.
    #[error("cannot find the address that reaches {node} to listen on for its proxy ({}); give --bind-address", io_error(.cause))]
    NoRoute { node: String, cause: io::Error },
    /// `--tracker rabit` cannot listen.
    #[error("cannot listen at {addr} for the rabit tracker: {}", io_error(.error))]
    Tracker { addr: std::net::IpAddr, error: io::Error },
    /// The job needs PMIx and this rlaunch has none.
    #[error("{asks}, which this rlaunch was built without; {}", rlaunch_proxy::pmix::GET_PMIX)]
    NoPmix { asks: &'static str },
    /// `--report FILE` or `--timeline FILE` cannot be created.
    #[error("cannot write the {what} {}: {}", cut(&.path.to_string_lossy()), io_error(.error))]
    EndFile { what: &'static str, path: PathBuf, error: io::Error },
}
