//! The local channel to a running rlaunch: `rlaunch ps` and `rlaunch stacks`, typed in another
//! terminal on rlaunch's machine, ask the job where its ranks are, and the job goes on
//! (docs/hangs.md).
//!
//! ```text
//!  rlaunch ps ──connect──► $DIR/<pid>.sock ──(peer uid checked)──► Root: a survey of the tree
//!            ◄──the table, as text, then end of file─────────────┘
//! ```
//!
//! Each job listens on a Unix socket named after rlaunch's pid, in a directory only its user
//! can enter: `$XDG_RUNTIME_DIR/rlaunch` where that is set, else `/tmp/rlaunch-UID`, made mode
//! 0700 and refused if it is another user's or open to others. The socket is 0600, and a
//! peer whose uid is not the job's is dropped unread. Requests are one short line (`ps`,
//! `stacks`); the answer is the text to print.

use std::ffi::OsString;
use std::io::{self, Read, Write};
use std::os::unix::fs::{DirBuilderExt, MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::time::Duration;

use tokio::io::{AsyncBufReadExt, AsyncWriteExt};
use tokio::sync::{mpsc, oneshot};

/// What another terminal asks of a running job.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ask {
    /// Every rank: host, pid, state, CPU, memory, fence.
    Ps,
    /// The hang report, now.
    Stacks,
}

impl Ask {
    fn word(self) -> &'static str {
        match self {
            Ask::Ps => "ps",
            Ask::Stacks => "stacks",
        }
    }

    /// `rlaunch ps` / `rlaunch stacks`: the subcommand `word` names, if any.
    pub fn from_word(word: &std::ffi::OsStr) -> Option<Ask> {
        [Ask::Ps, Ask::Stacks].into_iter().find(|a| word == a.word())
    }
}

/// A request that reached the job, and where its answer goes.
pub(crate) struct Asked {
    pub ask: Ask,
    pub reply: oneshot::Sender<String>,
}

/// The longest request line read (the words are short).
const MAX_REQUEST: u64 = 64;
/// How long a peer may take to say what it wants.
const REQUEST_WAIT: Duration = Duration::from_secs(5);
/// How long `rlaunch ps` and `rlaunch stacks` wait for the job's answer: a survey's 2 s
/// (10 s with the stacks), and a margin for a busy machine.
const ANSWER_WAIT: Duration = Duration::from_secs(30);

/// This user's directory of job sockets.
fn socket_dir() -> PathBuf {
    let uid = nix::unistd::geteuid().as_raw();
    match std::env::var_os("XDG_RUNTIME_DIR").filter(|d| Path::new(d).is_absolute()) {
        Some(runtime) => Path::new(&runtime).join("rlaunch"),
        None => PathBuf::from(format!("/tmp/rlaunch-{uid}")),
    }
}

/// The directory, made if `create`; an error if it is not a directory of this user's that
/// only this user can enter.
fn private_dir(create: bool) -> io::Result<PathBuf> {
    let dir = socket_dir();
    if create {
        match std::fs::DirBuilder::new().mode(0o700).create(&dir) {
            Ok(()) => {}
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {}
            Err(e) => return Err(e),
        }
    }
    let meta = std::fs::symlink_metadata(&dir)?;
    let uid = nix::unistd::geteuid().as_raw();
    if !meta.is_dir() || meta.uid() != uid || meta.permissions().mode() & 0o077 != 0 {
        let what = format!("{} is not a private directory of this user's", dir.display());
        return Err(io::Error::new(io::ErrorKind::PermissionDenied, what));
    }
    Ok(dir)
}

/// The job's socket, while it runs: removed when dropped.
pub(crate) struct Listening {
    path: PathBuf,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for Listening {
    fn drop(&mut self) {
        self.task.abort();
        let _ = std::fs::remove_file(&self.path);
    }
}

/// Listens for `rlaunch ps` and `rlaunch stacks`; their requests go to `asks`.
pub(crate) fn listen(asks: mpsc::UnboundedSender<Asked>) -> io::Result<Listening> {
    let dir = private_dir(true)?;
    sweep(&dir);
    let path = dir.join(format!("{}.sock", std::process::id()));
    // A socket left by an rlaunch that had this pid before (killed with SIGKILL).
    let _ = std::fs::remove_file(&path);
    let listener = tokio::net::UnixListener::bind(&path)?;
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600))?;
    let task = tokio::spawn(async move {
        loop {
            let Ok((stream, _)) = listener.accept().await else { continue };
            let ours = nix::unistd::geteuid().as_raw();
            match stream.peer_cred() {
                Ok(cred) if cred.uid() == ours => {}
                peer => {
                    tracing::warn!(?peer, "a peer of another user at the job's socket, dropped");
                    continue;
                }
            }
            tokio::spawn(serve(stream, asks.clone()));
        }
    });
    Ok(Listening { path, task })
}

/// Removes the sockets of rlaunch processes that are gone: one killed with SIGKILL cannot
/// remove its own.
fn sweep(dir: &Path) {
    let Ok(entries) = std::fs::read_dir(dir) else { return };
    for entry in entries.flatten() {
        let name = entry.file_name();
        let pid = name.to_str().and_then(|n| n.strip_suffix(".sock")?.parse::<i32>().ok());
        if pid.is_some_and(|pid| rlaunch_tree::procs::Stat::read(pid).is_none()) {
            let _ = std::fs::remove_file(entry.path());
        }
    }
}

/// One peer: its request line, the job's answer, the end.
async fn serve(stream: tokio::net::UnixStream, asks: mpsc::UnboundedSender<Asked>) {
    let (read, mut write) = stream.into_split();
    let mut line = String::new();
    let mut limited = tokio::io::BufReader::new(tokio::io::AsyncReadExt::take(read, MAX_REQUEST));
    let read = tokio::time::timeout(REQUEST_WAIT, limited.read_line(&mut line)).await;
    let answer = match (read, Ask::from_word(std::ffi::OsStr::new(line.trim()))) {
        (Ok(Ok(_)), Some(ask)) => {
            let (reply, answer) = oneshot::channel();
            if asks.send(Asked { ask, reply }).is_err() {
                return;
            }
            match answer.await {
                Ok(text) => text,
                Err(_) => "the job ended before it could answer\n".to_string(),
            }
        }
        _ => "unknown request: expected ps or stacks\n".to_string(),
    };
    let _ = write.write_all(answer.as_bytes()).await;
    let _ = write.shutdown().await;
}

#[derive(Debug, thiserror::Error)]
pub enum AskError {
    #[error("{0}: expected at most a pid (rlaunch's, of a running job) or a job id")]
    Usage(String),
    #[error("no running rlaunch job of yours (none listens in {0})")]
    NoJob(String),
    #[error("no rlaunch job of yours has pid {pid} (none listens at {path})")]
    NoSuchJob { pid: u32, path: String },
    #[error("cannot reach the job at {path}: {error}")]
    Unreachable { path: String, error: io::Error },
    #[error("the job's directory of sockets: {0}")]
    Dir(io::Error),
}

impl AskError {
    /// Its exit status: a bad command line is a usage error; the rest, rlaunch's failure.
    pub fn exit_code(&self) -> i32 {
        match self {
            AskError::Usage(_) => crate::exit::USAGE,
            _ => crate::exit::FAILURE,
        }
    }
}

/// `rlaunch ps [PID]` / `rlaunch stacks [PID]`: asks the job of rlaunch `PID`, or the newest
/// of this user's, and returns its answer.
pub fn ask(ask: Ask, args: &[OsString]) -> Result<String, AskError> {
    let pid = match args {
        [] => None,
        [pid] => Some(
            pid.to_str()
                .and_then(pid_of)
                .ok_or_else(|| AskError::Usage(crate::quote::cut(&pid.to_string_lossy())))?,
        ),
        [_, extra, ..] => return Err(AskError::Usage(crate::quote::cut(&extra.to_string_lossy()))),
    };
    let dir = private_dir(false).map_err(|e| match e.kind() {
        io::ErrorKind::NotFound => AskError::NoJob(socket_dir().display().to_string()),
        _ => AskError::Dir(e),
    })?;
    let (path, mut stream) = match pid {
        Some(pid) => {
            let path = dir.join(format!("{pid}.sock"));
            match std::os::unix::net::UnixStream::connect(&path) {
                Ok(stream) => (path, stream),
                Err(e) if gone(&e) => {
                    let path = path.display().to_string();
                    return Err(AskError::NoSuchJob { pid, path });
                }
                Err(error) => {
                    return Err(AskError::Unreachable { path: path.display().to_string(), error })
                }
            }
        }
        // The newest job that answers; a socket no rlaunch listens at any more (one killed
        // with SIGKILL left it) is removed on the way.
        None => newest_first(&dir)
            .into_iter()
            .find_map(|path| match std::os::unix::net::UnixStream::connect(&path) {
                Ok(stream) => Some((path, stream)),
                Err(e) if gone(&e) => {
                    let _ = std::fs::remove_file(&path);
                    None
                }
                Err(_) => None,
            })
            .ok_or_else(|| AskError::NoJob(dir.display().to_string()))?,
    };
    let unreachable = |error| AskError::Unreachable { path: path.display().to_string(), error };
    stream.set_read_timeout(Some(ANSWER_WAIT)).map_err(unreachable)?;
    stream.write_all(format!("{}\n", ask.word()).as_bytes()).map_err(unreachable)?;
    let mut answer = String::new();
    stream.read_to_string(&mut answer).map_err(unreachable)?;
    Ok(answer)
}

/// The rlaunch pid an argument names: the pid itself, or a job id (`rlaunch_PID_XXXXXXXX`,
/// as `--report`, the ranks' `TORCHELASTIC_RUN_ID` and PMI's kvsname show it), which holds
/// its rlaunch's pid.
fn pid_of(arg: &str) -> Option<u32> {
    let pid = match arg.strip_prefix("rlaunch_") {
        Some(id) => id.split('_').next()?,
        None => arg,
    };
    pid.parse().ok()
}

/// Nothing listens there: no socket, or one left behind.
fn gone(e: &io::Error) -> bool {
    matches!(e.kind(), io::ErrorKind::NotFound | io::ErrorKind::ConnectionRefused)
}

/// The sockets of this user's jobs whose rlaunch pid is alive, the latest started first.
fn newest_first(dir: &Path) -> Vec<PathBuf> {
    let Ok(entries) = std::fs::read_dir(dir) else { return Vec::new() };
    let mut live: Vec<(u64, PathBuf)> = entries
        .flatten()
        .filter_map(|entry| {
            let name = entry.file_name();
            let pid: u32 = name.to_str()?.strip_suffix(".sock")?.parse().ok()?;
            // When its rlaunch started (clock ticks after boot).
            let started = rlaunch_tree::procs::Stat::read(pid as i32)?.number(22)?;
            Some((started, entry.path()))
        })
        .collect();
    live.sort_by(|a, b| b.cmp(a));
    live.into_iter().map(|(_, path)| path).collect()
}
