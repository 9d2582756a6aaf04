//! Why rlaunch does not start a job: the command line asks for something it cannot do
//! ([`UsageError`], exit status 2), or it cannot run at all ([`SetupError`], 255). Each
//! renders as the one line rlaunch prints after `rlaunch: `.

use std::io;
use std::path::PathBuf;

use crate::allocation::AllocationError;
use crate::args::ArgsError;
use crate::configfile::ConfigfileError;
use crate::hosts::HostsError;
use crate::quote::{cut, io_error};

/// An option, or a setting from the environment, that rlaunch cannot use as given.
#[derive(Debug, thiserror::Error)]
pub enum OptionError {
    /// `option` as spelled, or the environment variable the setting came from.
    #[error("{option} {}: expected {what}", cut(.value))]
    Expected { option: &'static str, value: String, what: &'static str },
    #[error("{option} {}: a segment needs at least 1 rank", cut(.value))]
    NoRanks { option: &'static str, value: String },
    #[error("{option} {}: empty variable name", cut(.pair))]
    EmptyName { option: &'static str, pair: String },
    #[error("{0}: empty command")]
    EmptyCommand(&'static str),
    #[error("the timeout must be more than 0 seconds")]
    ZeroTimeout,
    /// `known`: the interfaces with an IPv4 address.
    #[error("{option} {}: no interface of that name has an IPv4 address (these do: {known})", cut(.name))]
    NoInterface { option: &'static str, name: String, known: String },
    #[error("--heartbeat {}: must be at least 0.001 seconds", cut(.0))]
    ShortHeartbeat(String),
    /// The silence timeout must leave room for heartbeats, or every link would be lost.
    #[error("--silence-timeout {}: must be longer than the heartbeat ({heartbeat} s)", cut(.silence))]
    ShortSilence { silence: String, heartbeat: f64 },
    #[error("-l and --prepend-pattern both set the line prefix; give one")]
    TwoPrefixes,
    /// `reason`: what the pattern parser said.
    #[error("{option} {}: {reason}", cut(.pattern))]
    Pattern { option: &'static str, pattern: String, reason: String },
    #[error("--output-filename {}: no directory given", cut(.0))]
    NoOutputDir(String),
    #[error("--output-filename {}: unknown option {} (known: nocopy, nojobid)", cut(.arg), cut(.option))]
    OutputDirOption { arg: String, option: String },
    /// `-configfile` with a program on the command line too.
    #[error("{0}: give the programs either in the file or on the command line")]
    ProgramsTwice(&'static str),
    #[error("no program given: rlaunch -n N PROGRAM [ARGS]")]
    NoProgram,
    /// `''` where a program should be: nothing could run it.
    #[error("empty program name")]
    EmptyProgram,
    /// A map gives each rank one GPU.
    #[error("--gpu-bind map gives each rank one GPU, not {0} (--gpus-per-rank)")]
    MapManyGpus(u32),
}

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
    /// A file `--bcast` cannot send (`why`: not there, not a file, not readable), or two
    /// sent to one name.
    #[error("--bcast {}: {why}", cut(.file))]
    Bcast { file: String, why: String },
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
