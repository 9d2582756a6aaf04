//! The parent's view of one child proxy: what its link and its process said, and the
//! verdict they give (finished, lingering, lost and why).

use std::time::Duration;

use nix::sys::signal::Signal;
use rlaunch_protocol::ids::ExitOutcome;
use tokio::time::Instant;

use super::Lost;
use crate::procs;

/// The parent's view of one child proxy. A child is lost when its link closes or its process
/// ends before it said NodeDone; the verdict waits for both events, because a proxy that
/// finished cleanly exits right after its last frame and SIGCHLD may overtake that frame.
pub(super) struct ChildState {
    pub(super) host: String,
    /// What its process is, for messages: "its proxy" under fork, "ssh" under ssh.
    pub(super) process: String,
    /// Its process (the proxy under fork, the ssh client under ssh); -1 if it never started
    /// or has none of its own (it dialed in; the launcher that started it is not its own).
    pub(super) pid: i32,
    /// It has a process of its own, whose end is part of its verdict.
    pub(super) own_process: bool,
    /// It said NodeDone: its subtree is finished.
    pub(super) done: bool,
    /// Lost, and reported.
    pub(super) lost: bool,
    pub(super) exit: Option<ExitOutcome>,
    pub(super) link_closed: bool,
    pub(super) link_error: Option<String>,
    /// When its link closed cleanly while its process went on: the process is given
    /// [`Children::linger_deadline`]'s grace to end, then killed.
    pub(super) lingers_since: Option<Instant>,
    /// The last bytes the remote launcher (ssh) printed on stderr.
    pub(super) stderr_tail: Vec<u8>,
    /// Its proxy said hello: a loss from now on is of a node that was up.
    pub(super) greeted: bool,
}

impl ChildState {
    pub(super) fn new(host: String, pid: i32, process: &str) -> ChildState {
        ChildState {
            host,
            process: process.to_string(),
            pid,
            own_process: true,
            done: false,
            lost: false,
            exit: None,
            link_closed: false,
            link_error: None,
            lingers_since: None,
            stderr_tail: Vec::new(),
            greeted: false,
        }
    }

    /// A child that could not even be started.
    pub(super) fn failed(host: String) -> ChildState {
        let mut c = ChildState::new(host, -1, "");
        c.lost = true;
        c.link_closed = true;
        c.exit = Some(ExitOutcome::Exited(127));
        c
    }

    /// A child with no process of its own (one that will dial in, or a link in memory): its
    /// link alone decides.
    pub(super) fn without_process(host: String) -> ChildState {
        let mut c = ChildState::new(host, -1, "its proxy");
        c.own_process = false;
        c
    }

    pub(super) fn reaped(&self) -> bool {
        !self.own_process || self.exit.is_some()
    }

    /// Finished one way or the other, and nothing more will come from it.
    pub(super) fn settled(&self) -> bool {
        (self.done || self.lost) && self.reaped()
    }

    pub(super) fn add_stderr(&mut self, text: &[u8]) {
        self.stderr_tail.extend_from_slice(text);
        if self.stderr_tail.len() > 4096 {
            self.stderr_tail.drain(..self.stderr_tail.len() - 4096);
        }
    }

    /// Its process ended. Returns it as lost, if it now is.
    pub(super) fn on_exit(&mut self, outcome: ExitOutcome) -> Option<Lost> {
        self.exit = Some(outcome);
        self.verdict()
    }

    /// Its link closed (with an error, or at end of file). Returns it as lost, if it now
    /// is; a lost child's process (a hung proxy, or an ssh client on a dead network) is
    /// killed then, as nothing more will come from it.
    ///
    /// A broken link (silence, a read error) has its process killed even when the child said
    /// it was done: a proxy stopped on its way out would otherwise keep its parent waiting
    /// for its exit forever (found by the chaos runner: `kill -STOP` just after NodeDone).
    /// After a clean end of file its process gets a grace to end ([`Children::linger_deadline`]).
    pub(super) fn on_link_closed(&mut self, error: Option<String>) -> Option<Lost> {
        self.link_closed = true;
        let broken = error.is_some();
        self.link_error = error;
        let verdict = self.verdict();
        let running = !self.reaped() && self.pid > 0;
        if running && (verdict.is_some() || broken) {
            procs::signal_pid(self.pid, Signal::SIGKILL);
        } else if running {
            self.lingers_since = Some(Instant::now());
        }
        verdict
    }

    /// Kills its process if it outlived a clean close of the link by `grace` at `now`.
    pub(super) fn kill_if_lingering(&mut self, grace: Duration, now: Instant) {
        if self.reaped() || self.lingers_since.is_none_or(|at| at + grace > now) {
            return;
        }
        self.lingers_since = None;
        tracing::warn!(host = %self.host, "proxy outlived its connection; killing it");
        let secs = grace.as_secs_f64();
        let what = &self.process;
        self.link_error =
            Some(format!("it closed its connection, but {what} did not end within {secs} s"));
        procs::signal_pid(self.pid, Signal::SIGKILL);
    }

    fn verdict(&mut self) -> Option<Lost> {
        if self.done || self.lost || !self.link_closed {
            return None;
        }
        // A broken link says more than the exit status (a version mismatch, say), but an
        // exit after a clean end of file is the story.
        let mut reason = match (&self.link_error, self.exit) {
            (Some(err), _) => err.clone(),
            (None, Some(outcome)) => format!("{} {outcome}", self.process),
            (None, None) if !self.own_process => "its connection closed".to_string(),
            (None, None) => return None,
        };
        self.lost = true;
        let tail = String::from_utf8_lossy(&self.stderr_tail);
        if let Some(last) = tail.lines().rev().find(|l| !l.trim().is_empty()) {
            reason = format!("{reason}: {}", last.trim());
        }
        Some(Lost { host: self.host.clone(), reason, came_up: self.greeted })
    }
}
