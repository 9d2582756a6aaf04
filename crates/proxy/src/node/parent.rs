//! The parent as this node sees it: when it was last heard from, whether the job is stopped
//! (then so may be the launcher, whose silence means nothing), and whether it is gone. Pure:
//! the Node brings the time, and does the teardown a loss calls for.
//!
//! ```text
//!  a frame, a heartbeat ──heard──┐
//!  Down::Signal TSTP / CONT ─────┤ Parent ──silent_at──► the Node's ParentSilent deadline
//!  link closed, silent, signal ──┘   └─ lose: the first loss orphans the node (teardown)
//! ```

use std::time::Duration;

use tokio::time::Instant;

#[derive(Debug)]
pub(super) struct Parent {
    last_heard: Instant,
    stopped: bool,
    /// The parent is gone, or this proxy was told to go: the node finishes cleaning up,
    /// then exits quietly.
    orphaned: bool,
    /// The parent cannot read any more: it is watched no more.
    unreachable: bool,
}

impl Parent {
    pub(super) fn new(now: Instant) -> Parent {
        Parent { last_heard: now, stopped: false, orphaned: false, unreachable: false }
    }

    /// A frame or a heartbeat came from the parent at `now`.
    pub(super) fn heard(&mut self, now: Instant) {
        self.last_heard = now;
    }

    /// The job was stopped (SIGTSTP), or goes on again (SIGCONT).
    pub(super) fn set_stopped(&mut self, stopped: bool) {
        self.stopped = stopped;
    }

    pub(super) fn stopped(&self) -> bool {
        self.stopped
    }

    pub(super) fn orphaned(&self) -> bool {
        self.orphaned
    }

    /// When the parent counts as gone if nothing comes from it until then; `None` while it
    /// is not watched (stopped, or already unreachable).
    pub(super) fn silent_at(&self, silence: Duration) -> Option<Instant> {
        (!self.stopped && !self.unreachable).then_some(self.last_heard + silence)
    }

    /// Nothing has come from the parent for `silence` at `now`.
    pub(super) fn silent(&self, now: Instant, silence: Duration) -> bool {
        self.last_heard + silence <= now
    }

    /// The parent is gone and this proxy asks rlaunch to adopt it: the lost parent is
    /// watched no more, and the node does not go down (yet).
    pub(super) fn detach(&mut self) {
        self.unreachable = true;
    }

    /// rlaunch adopted this proxy at `now`: its new parent, watched from now on.
    pub(super) fn adopted(&mut self, now: Instant) {
        self.unreachable = false;
        self.last_heard = now;
    }

    /// The parent is gone (`unreachable`: it cannot read any more), or this proxy was told
    /// to go. True the first time: the node goes down now.
    pub(super) fn lose(&mut self, unreachable: bool) -> bool {
        self.unreachable |= unreachable;
        !std::mem::replace(&mut self.orphaned, true)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const SILENCE: Duration = Duration::from_secs(10);

    #[test]
    fn a_parent_heard_from_is_watched_from_then_and_not_while_the_job_is_stopped() {
        let now = Instant::now();
        let mut parent = Parent::new(now);
        assert_eq!(parent.silent_at(SILENCE), Some(now + SILENCE));
        let later = now + Duration::from_secs(9);
        assert!(!parent.silent(later, SILENCE));
        parent.heard(later);
        assert_eq!(parent.silent_at(SILENCE), Some(later + SILENCE));
        assert!(!parent.silent(now + SILENCE, SILENCE), "heard since");
        parent.set_stopped(true);
        assert_eq!(parent.silent_at(SILENCE), None);
        parent.set_stopped(false);
        assert!(parent.silent(later + SILENCE, SILENCE));
    }

    #[test]
    fn the_first_loss_orphans_the_node_and_an_unreachable_parent_is_watched_no_more() {
        let mut parent = Parent::new(Instant::now());
        // A signal to the proxy: it keeps sending (its parent wants the ranks' ends), and
        // keeps watching.
        assert!(parent.lose(false));
        assert!(parent.orphaned() && parent.silent_at(SILENCE).is_some());
        // Then its link closes: no second teardown, and no more watching.
        assert!(!parent.lose(true));
        assert_eq!(parent.silent_at(SILENCE), None);
    }
}
