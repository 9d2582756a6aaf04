//! How a proxy tears its node down: SIGTERM, a grace period, SIGKILL, then the child proxies
//! that did not finish. Pure: it returns the steps to take and when to call again.
//!
//! ```text
//!  Idle ──terminate──► Grace ──deadline──► ChildProxies ──deadline──► Done ──deadline──► GaveUp
//!        TERM, CONT     (grace)  KILL ranks,  (3 s)       KILL child     (orphan only:
//!        to ranks;               stragglers               proxies;        3 s more)
//!        Terminate down                                   ranks still
//!                                                         there left to
//!                                                         the kernel
//! ```
//!
//! Every step is bounded: a rank that SIGKILL does not end within [`CHILD_PROXY_GRACE`] (one
//! in uninterruptible sleep, D state: blocked in the kernel, or frozen by a cgroup) is said so
//! and no longer waited for; it ends when the kernel lets it, its SIGKILL pending.

use std::time::Duration;

use nix::sys::signal::Signal;
use tokio::time::Instant;

/// After the kill grace, how long child proxies get to finish before they are killed too.
pub const CHILD_PROXY_GRACE: Duration = Duration::from_secs(3);

/// What the dispatcher does at each step.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KillStep {
    /// Tell the child proxies to tear their subtrees down with this grace.
    TerminateChildren(Duration),
    /// Signal every running rank's process group.
    SignalRanks(Signal),
    /// SIGKILL whatever is left below this proxy, except the child proxies.
    KillStragglers,
    /// SIGKILL the child proxies that have not ended.
    KillChildProxies,
    /// Stop waiting for ranks that SIGKILL has not ended, saying why each is still there.
    AbandonRanks,
    /// Stop waiting: the node is finished with whatever is left killed.
    GiveUp,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Stage {
    Idle,
    /// SIGTERM sent; SIGKILL at the deadline.
    Grace,
    /// SIGKILL sent; child proxies still there at the deadline get SIGKILL too.
    ChildProxies,
    Done,
    /// An orphan that waited long enough.
    GaveUp,
}

#[derive(Debug)]
pub struct Escalation {
    stage: Stage,
    deadline: Option<Instant>,
}

impl Default for Escalation {
    fn default() -> Escalation {
        Escalation { stage: Stage::Idle, deadline: None }
    }
}

impl Escalation {
    /// When [`Escalation::on_deadline`] is due.
    pub fn deadline(&self) -> Option<Instant> {
        self.deadline
    }

    /// The node is being torn down: nothing new starts.
    pub fn started(&self) -> bool {
        self.stage != Stage::Idle
    }

    pub fn gave_up(&self) -> bool {
        self.stage == Stage::GaveUp
    }

    /// Starts the teardown; a teardown already under way goes on as it was.
    pub fn terminate(&mut self, now: Instant, grace: Duration) -> Vec<KillStep> {
        if self.stage != Stage::Idle {
            return Vec::new();
        }
        self.stage = Stage::Grace;
        self.deadline = Some(now + grace);
        vec![
            KillStep::TerminateChildren(grace),
            KillStep::SignalRanks(Signal::SIGTERM),
            // A stopped rank cannot act on SIGTERM.
            KillStep::SignalRanks(Signal::SIGCONT),
        ]
    }

    /// The deadline passed. `orphaned`: the parent is gone, so no one will wait for this
    /// proxy to report, and it must not wait forever either.
    pub fn on_deadline(&mut self, now: Instant, orphaned: bool) -> Vec<KillStep> {
        match self.stage {
            Stage::Grace => {
                self.stage = Stage::ChildProxies;
                self.deadline = Some(now + CHILD_PROXY_GRACE);
                vec![KillStep::SignalRanks(Signal::SIGKILL), KillStep::KillStragglers]
            }
            Stage::ChildProxies => {
                self.stage = Stage::Done;
                self.deadline = orphaned.then(|| now + CHILD_PROXY_GRACE);
                vec![KillStep::KillChildProxies, KillStep::AbandonRanks]
            }
            Stage::Done => {
                self.stage = Stage::GaveUp;
                self.deadline = None;
                vec![KillStep::GiveUp]
            }
            Stage::Idle | Stage::GaveUp => {
                self.deadline = None;
                Vec::new()
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use KillStep::*;

    #[test]
    fn term_then_kill_then_child_proxies() {
        let now = Instant::now();
        let grace = Duration::from_millis(500);
        let mut kill = Escalation::default();
        assert_eq!(kill.deadline(), None);
        let steps = kill.terminate(now, grace);
        assert_eq!(
            steps,
            [TerminateChildren(grace), SignalRanks(Signal::SIGTERM), SignalRanks(Signal::SIGCONT)]
        );
        assert_eq!(kill.deadline(), Some(now + grace));
        assert_eq!(kill.terminate(now, Duration::ZERO), [], "a second request changes nothing");
        let later = now + grace;
        assert_eq!(kill.on_deadline(later, false), [SignalRanks(Signal::SIGKILL), KillStragglers]);
        assert_eq!(kill.deadline(), Some(later + CHILD_PROXY_GRACE));
        assert_eq!(kill.on_deadline(later, false), [KillChildProxies, AbandonRanks]);
        // With a parent to report to, the proxy waits for its children's ends.
        assert_eq!(kill.deadline(), None);
        assert!(!kill.gave_up());
    }

    #[test]
    fn an_orphan_gives_up_in_the_end() {
        let now = Instant::now();
        let mut kill = Escalation::default();
        kill.terminate(now, Duration::ZERO);
        kill.on_deadline(now, true);
        assert_eq!(kill.on_deadline(now, true), [KillChildProxies, AbandonRanks]);
        assert_eq!(kill.deadline(), Some(now + CHILD_PROXY_GRACE));
        assert_eq!(kill.on_deadline(now, true), [GiveUp]);
        assert!(kill.gave_up());
        assert_eq!(kill.deadline(), None);
    }
}
