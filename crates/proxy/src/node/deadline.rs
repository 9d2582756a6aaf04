//! The Node's deadlines: which it holds, the earliest of them (the one its loop waits on),
//! and what it does when one comes. As the Root's (`rlaunch::job`'s `deadline.rs`).

use tokio::time::Instant;

use super::Node;
use crate::kill::CHILD_PROXY_GRACE;
use rlaunch_tree::link;

/// The Node's deadlines, every one waited on by one arm of its loop: the earliest is next.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Deadline {
    /// The teardown's next step (SIGKILL once the grace is over, then giving up).
    Kill,
    /// Child proxies started by a scheduler's launcher have not dialed in.
    Dial,
    /// A child's link ended and its process lingers.
    Linger,
    /// This node's PMIx server has not answered a ping for the job's silence.
    PmixSilent,
    /// Nothing from the parent for the job's silence (watched until the parent is found
    /// unreachable, and not while the job is stopped: so may the launcher be).
    ParentSilent,
    /// Children have not answered rlaunch's survey in time: it goes up without them.
    Survey,
    /// Failures that waited for a dying rank's end wait no longer.
    Deferred,
}

impl Node {
    /// The earliest of the Node's deadlines, and which it is.
    pub(super) fn next_deadline(&self) -> Option<(Instant, Deadline)> {
        rlaunch_tree::earliest([
            (self.kill.deadline(), Deadline::Kill),
            (self.dial_deadline, Deadline::Dial),
            (self.children.linger_deadline(CHILD_PROXY_GRACE), Deadline::Linger),
            (self.pmix_silent_at(), Deadline::PmixSilent),
            (self.parent.silent_at(self.job.liveness.silence()), Deadline::ParentSilent),
            (self.survey.as_ref().map(|s| s.deadline), Deadline::Survey),
            (self.deferred_until, Deadline::Deferred),
        ])
    }

    /// Deadline `which` has come. For [`Deadline::ParentSilent`], the caller first takes
    /// the events already waiting: the parent's frames may be there, behind a long stretch
    /// of work (thousands of ranks starting), and they count.
    pub(super) fn on_deadline(&mut self, which: Deadline) {
        match which {
            Deadline::Kill => {
                let steps = self.kill.on_deadline(Instant::now(), self.parent.orphaned());
                self.apply(steps);
            }
            Deadline::Dial => {
                self.dial_deadline = None;
                let wait = link::HELLO_WAIT.as_secs();
                let reason = format!("its proxy did not call back within {wait} s");
                for (_, lost) in self.children.give_up_dialing(&reason, |_, _| true) {
                    self.report_lost(lost);
                }
            }
            Deadline::Linger => self.children.kill_lingering(CHILD_PROXY_GRACE),
            Deadline::PmixSilent => self.pmix_silent(),
            Deadline::Survey => self.survey_send(),
            Deadline::Deferred => self.judge_deferred(true),
            Deadline::ParentSilent => {
                let silence = self.job.liveness.silence();
                if self.parent.silent(Instant::now(), silence) {
                    let secs = silence.as_secs_f64();
                    let why = format!("it heard nothing from its parent for {secs} s");
                    self.lose_upstream(&why, super::Loss::Silent);
                }
            }
        }
    }
}
