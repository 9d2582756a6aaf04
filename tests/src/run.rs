//! Running the program under test: [`Run`] configures a run, [`Job`] is the live process,
//! [`Outcome`] is how it ended.
//!
//! ```text
//!   Run ──spawn()──► Job ──wait(timeout)──► Outcome
//!    └────────run()──────────────────────────┘
//! ```
//!
//! A run's program gets its own process group, so nothing it signals "to its group" can hit
//! the test process, and starts with every signal at its default disposition (`std` already
//! clears the signal mask): a test run from the background of a shell script inherits
//! SIGINT and SIGQUIT ignored, and tests must not depend on how `cargo test` was started.
//! Every failure (timeout, missing line) kills the run's processes first, then panics with
//! what the run printed so far.

mod outcome;
mod stream;

use std::ffi::{OsStr, OsString};
use std::io::Write;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use nix::sys::signal::{kill, killpg, signal, SigHandler, Signal};
use nix::unistd::Pid;

pub use outcome::Outcome;

use crate::procs::{list, Tag, TAG_VAR};
use outcome::{status_text, transcript};
use stream::{Missing, Stream};

/// How long [`Run::run`] lets a run take unless told otherwise.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(60);

/// After a failure, how long to wait for the output of the killed processes.
const DRAIN_AFTER_KILL: Duration = Duration::from_secs(2);

enum Input {
    Null,
    /// Written by a thread, then closed.
    Bytes(Vec<u8>),
    /// Kept open for [`Job::write_stdin`].
    Pipe,
    Stdio(Stdio),
}

/// One run of `rlaunch` (or another program), not started yet.
pub struct Run {
    program: PathBuf,
    args: Vec<OsString>,
    /// `None` removes the variable.
    env: Vec<(OsString, Option<OsString>)>,
    cwd: Option<PathBuf>,
    stdin: Input,
    timeout: Duration,
    tag: Tag,
}

impl Run {
    /// `rlaunch` with `args`; panics if `rlaunch` is not built.
    pub fn new(args: &[&str]) -> Run {
        Run::program(crate::rlaunch(), args)
    }

    /// Any program with `args`, with the same tagging, stdio capture and timeout.
    pub fn program(program: impl Into<PathBuf>, args: &[&str]) -> Run {
        Run {
            program: program.into(),
            args: args.iter().map(OsString::from).collect(),
            env: Vec::new(),
            cwd: None,
            stdin: Input::Null,
            timeout: DEFAULT_TIMEOUT,
            tag: Tag::new(),
        }
    }

    pub fn arg(mut self, arg: impl AsRef<OsStr>) -> Run {
        self.args.push(arg.as_ref().to_owned());
        self
    }

    pub fn args<S: AsRef<OsStr>>(mut self, args: impl IntoIterator<Item = S>) -> Run {
        self.args.extend(args.into_iter().map(|a| a.as_ref().to_owned()));
        self
    }

    /// Sets a variable on top of the test's own environment.
    pub fn env(mut self, key: impl AsRef<OsStr>, value: impl AsRef<OsStr>) -> Run {
        self.env.push((key.as_ref().to_owned(), Some(value.as_ref().to_owned())));
        self
    }

    pub fn env_remove(mut self, key: impl AsRef<OsStr>) -> Run {
        self.env.push((key.as_ref().to_owned(), None));
        self
    }

    pub fn current_dir(mut self, dir: impl Into<PathBuf>) -> Run {
        self.cwd = Some(dir.into());
        self
    }

    /// Feeds these bytes to stdin, then closes it. Stdin is `/dev/null` by default.
    pub fn stdin_bytes(mut self, bytes: impl Into<Vec<u8>>) -> Run {
        self.stdin = Input::Bytes(bytes.into());
        self
    }

    /// A pipe the test writes with [`Job::write_stdin`] and closes with [`Job::close_stdin`].
    pub fn stdin_piped(mut self) -> Run {
        self.stdin = Input::Pipe;
        self
    }

    pub fn stdin(mut self, stdio: Stdio) -> Run {
        self.stdin = Input::Stdio(stdio);
        self
    }

    /// The limit for [`Run::run`]; a [`Job`]'s waits take their own.
    pub fn timeout(mut self, timeout: Duration) -> Run {
        self.timeout = timeout;
        self
    }

    /// The value of `RLAUNCH_TEST_TAG` this run's processes will carry.
    pub fn tag(&self) -> &str {
        self.tag.as_str()
    }

    /// Runs to the end: exit, and EOF on stdout and stderr. Panics with the output so far
    /// if that takes longer than the timeout.
    pub fn run(self) -> Outcome {
        let timeout = self.timeout;
        self.spawn().wait(timeout)
    }

    /// Starts the program; panics if it cannot start.
    pub fn spawn(self) -> Job {
        let Run { program, args, env, cwd, stdin, timeout: _, tag } = self;
        let command_line = command_line(&program, &args);
        let mut command = Command::new(&program);
        command.args(&args);
        for (key, value) in env {
            match value {
                Some(value) => command.env(key, value),
                None => command.env_remove(key),
            };
        }
        command
            .env(TAG_VAR, tag.as_str())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .process_group(0);
        // SAFETY: between fork and exec the closure only calls sigaction, which is
        // async-signal-safe, and allocates nothing.
        unsafe { command.pre_exec(reset_signal_dispositions) };
        if let Some(dir) = cwd {
            command.current_dir(dir);
        }
        let (stdio, feed) = match stdin {
            Input::Null => (Stdio::null(), None),
            Input::Bytes(bytes) => (Stdio::piped(), Some(bytes)),
            Input::Pipe => (Stdio::piped(), None),
            Input::Stdio(stdio) => (stdio, None),
        };
        command.stdin(stdio);
        let mut child =
            command.spawn().unwrap_or_else(|e| panic!("error: cannot start `{command_line}`: {e}"));

        let mut stdin = child.stdin.take();
        if let Some(bytes) = feed {
            let mut pipe = stdin.take().expect("stdin is piped");
            // A thread, so that a program which does not read cannot block the test. Not
            // joined: a leaked process may hold the pipe until the tag's processes die.
            std::thread::spawn(move || {
                let _ = pipe.write_all(&bytes);
            });
        }
        let stdout = Stream::start("stdout", child.stdout.take().expect("stdout is piped"));
        let stderr = Stream::start("stderr", child.stderr.take().expect("stderr is piped"));
        Job {
            child,
            status: None,
            command_line,
            started: Instant::now(),
            stdin,
            stdout,
            stderr,
            tag: Some(tag),
        }
    }
}

/// A running program. Dropping it SIGKILLs the program, then every process of its tag.
pub struct Job {
    child: Child,
    /// Set once `child` is reaped: from then on its pid may name another process.
    status: Option<ExitStatus>,
    command_line: String,
    started: Instant,
    /// The pipe of [`Run::stdin_piped`] until [`Job::close_stdin`].
    stdin: Option<ChildStdin>,
    stdout: Stream,
    stderr: Stream,
    /// Always `Some` while the job lives; [`Job::wait`] hands it to the [`Outcome`].
    tag: Option<Tag>,
}

impl Job {
    pub fn pid(&self) -> Pid {
        Pid::from_raw(self.child.id() as i32)
    }

    pub fn tag(&self) -> &str {
        self.tag.as_ref().map_or("", Tag::as_str)
    }

    /// Reads stdout up to the first line `pred` accepts (lines passed over are not offered
    /// again) and returns it without its newline. Panics on EOF or timeout.
    pub fn wait_for_line(&mut self, pred: impl FnMut(&str) -> bool, timeout: Duration) -> String {
        self.wait_for(Which::Stdout, pred, timeout)
    }

    /// [`Job::wait_for_line`] on stderr.
    pub fn wait_for_stderr_line(
        &mut self,
        pred: impl FnMut(&str) -> bool,
        timeout: Duration,
    ) -> String {
        self.wait_for(Which::Stderr, pred, timeout)
    }

    /// Waits for `n` lines `ready <rank> <pid>` from `rankprog ready` (a `[<rank>] ` prefix
    /// is allowed) and returns `(rank, pid)` by rank.
    pub fn wait_for_ready(&mut self, n: usize, timeout: Duration) -> Vec<(u32, Pid)> {
        let deadline = Instant::now() + timeout;
        let mut ready = Vec::with_capacity(n);
        while ready.len() < n {
            let left = deadline.saturating_duration_since(Instant::now());
            let line = self.wait_for_line(|l| parse_ready(l).is_some(), left);
            ready.extend(parse_ready(&line));
        }
        ready.sort_unstable();
        ready
    }

    /// What stdout has delivered so far, lines already waited for included.
    pub fn stdout_so_far(&self) -> &[u8] {
        &self.stdout.seen
    }

    pub fn stderr_so_far(&self) -> &[u8] {
        &self.stderr.seen
    }

    /// Writes to the pipe of [`Run::stdin_piped`]; blocks while the pipe is full.
    pub fn write_stdin(&mut self, bytes: &[u8]) {
        let pipe =
            self.stdin.as_mut().expect("write_stdin needs Run::stdin_piped, and an open pipe");
        pipe.write_all(bytes)
            .unwrap_or_else(|e| panic!("cannot write the stdin of `{}`: {e}", self.command_line));
    }

    pub fn close_stdin(&mut self) {
        self.stdin = None;
    }

    /// Sends `sig` to the program (not to its ranks).
    pub fn signal(&mut self, sig: Signal) {
        assert!(
            self.try_status().is_none(),
            "cannot send {sig}: `{}` has already exited",
            self.command_line
        );
        kill(self.pid(), sig).unwrap_or_else(|e| panic!("cannot send {sig}: {e}"));
    }

    /// Sends `sig` to the program's process group, as a terminal's Ctrl-C would.
    pub fn signal_group(&mut self, sig: Signal) {
        assert!(
            self.try_status().is_none(),
            "cannot send {sig}: `{}` has already exited",
            self.command_line
        );
        killpg(self.pid(), sig).unwrap_or_else(|e| panic!("cannot send {sig} to the group: {e}"));
    }

    /// The exit status if the program has exited, without waiting.
    pub fn try_status(&mut self) -> Option<ExitStatus> {
        if self.status.is_none() {
            self.status = self.child.try_wait().ok().flatten();
        }
        self.status
    }

    /// SIGKILLs the program, then every process carrying its tag.
    pub fn kill(&mut self) {
        if self.status.is_none() {
            let _ = self.child.kill();
            self.status = self.child.wait().ok();
        }
        if let Some(tag) = &self.tag {
            tag.kill_all();
        }
    }

    /// Closes stdin (as `std`'s `wait` does), waits for the exit and for EOF on stdout and
    /// stderr. Panics with the output so far if that takes longer than `timeout`.
    pub fn wait(mut self, timeout: Duration) -> Outcome {
        self.stdin = None;
        let deadline = Instant::now() + timeout;
        let status = self.poll_exit(deadline);
        let stdout_done = self.stdout.drain(deadline);
        let stderr_done = self.stderr.drain(deadline);
        let status = match status {
            None => self.fail(&format!("still running after {timeout:?}")),
            Some(status) if !(stdout_done && stderr_done) => self.fail(&format!(
                "{}, but its stdout or stderr was still open after {timeout:?}",
                status_text(status)
            )),
            Some(status) => status,
        };
        Outcome {
            status,
            code: status.code(),
            stdout: std::mem::take(&mut self.stdout.seen),
            stderr: std::mem::take(&mut self.stderr.seen),
            elapsed: self.started.elapsed(),
            command_line: std::mem::take(&mut self.command_line),
            tag: self.tag.take().expect("a live job has its tag"),
        }
    }

    /// Waits for the program to exit, whoever still holds its stdout or stderr; panics on
    /// timeout. [`Job::wait`] still gives the outcome afterwards.
    pub fn wait_exit(&mut self, timeout: Duration) -> ExitStatus {
        match self.poll_exit(Instant::now() + timeout) {
            Some(status) => status,
            None => self.fail(&format!("still running after {timeout:?}")),
        }
    }

    fn poll_exit(&mut self, deadline: Instant) -> Option<ExitStatus> {
        let mut pause = Duration::from_millis(1);
        loop {
            if let Some(status) = self.try_status() {
                return Some(status);
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return None;
            }
            std::thread::sleep(pause.min(left));
            pause = (pause * 2).min(Duration::from_millis(20));
        }
    }

    fn wait_for(
        &mut self,
        which: Which,
        mut pred: impl FnMut(&str) -> bool,
        timeout: Duration,
    ) -> String {
        let deadline = Instant::now() + timeout;
        let stream = match which {
            Which::Stdout => &mut self.stdout,
            Which::Stderr => &mut self.stderr,
        };
        let name = stream.name;
        let missing = loop {
            match stream.next_line(deadline) {
                Ok(line) => {
                    let text = String::from_utf8_lossy(&line);
                    let text = text.strip_suffix('\n').unwrap_or(&text);
                    if pred(text) {
                        return text.to_owned();
                    }
                }
                Err(Missing::Eof) => break format!("{name} ended before the awaited line"),
                Err(Missing::TimedOut) => {
                    break format!("the awaited line did not come on {name} within {timeout:?}")
                }
            }
        };
        self.fail(&missing)
    }

    /// Kills everything, collects what is left of the output and panics with it all.
    fn fail(&mut self, what: &str) -> ! {
        let alive = self.tag.as_ref().map(Tag::processes).unwrap_or_default();
        let status = self.try_status();
        self.kill();
        let deadline = Instant::now() + DRAIN_AFTER_KILL;
        self.stdout.drain(deadline);
        self.stderr.drain(deadline);
        let status = match status {
            Some(status) => status_text(status),
            None => "was running".to_owned(),
        };
        let alive = if alive.is_empty() { "none".to_owned() } else { list(&alive) };
        panic!(
            "`{}`: {what}\nit {status}; its running processes were: {alive}\n{}",
            self.command_line,
            transcript(&self.stdout.seen, &self.stderr.seen),
        );
    }
}

impl Drop for Job {
    fn drop(&mut self) {
        self.kill();
    }
}

#[derive(Clone, Copy)]
enum Which {
    Stdout,
    Stderr,
}

/// Undoes inherited `SIG_IGN`s: exec resets handled signals to their default, not ignored
/// ones.
fn reset_signal_dispositions() -> std::io::Result<()> {
    for sig in Signal::iterator() {
        if sig != Signal::SIGKILL && sig != Signal::SIGSTOP {
            // SAFETY: SIG_DFL runs no code in the signal context.
            unsafe { signal(sig, SigHandler::SigDfl) }?;
        }
    }
    Ok(())
}

/// `ready <rank> <pid>`, possibly after a prefix such as `[<rank>] `.
fn parse_ready(line: &str) -> Option<(u32, Pid)> {
    let start = line.find("ready ")?;
    let mut words = line[start..].split_whitespace().skip(1);
    let rank = words.next()?.parse().ok()?;
    let pid = words.next()?.parse().ok()?;
    words.next().is_none().then_some((rank, Pid::from_raw(pid)))
}

fn command_line(program: &Path, args: &[OsString]) -> String {
    let name = program.file_name().unwrap_or(program.as_os_str());
    std::iter::once(name)
        .chain(args.iter().map(OsString::as_os_str))
        .map(|word| {
            let word = word.to_string_lossy();
            if word.is_empty() || word.contains(char::is_whitespace) {
                format!("'{word}'")
            } else {
                word.into_owned()
            }
        })
        .collect::<Vec<_>>()
        .join(" ")
}

#[cfg(test)]
mod tests;
