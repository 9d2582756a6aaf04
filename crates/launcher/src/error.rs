//! Why rlaunch does not start a job: the command line asks for something it cannot do
//! ([`UsageError`], exit status 2), or it cannot run at all ([`SetupError`], 255). Each
//! renders as the one line rlaunch prints after `rlaunch: `.

use std::io;
use std::path::PathBuf;

use crate::hosts::plain;

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
}
