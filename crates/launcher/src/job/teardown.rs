//! The teardown's clock: once the job ends, when the output not written yet is dropped and
//! when the proxies that have not finished are killed. Pure: the Root brings the time and
//! does what a deadline says.
//!
//! ```text
//!  fail(cause) / a second Ctrl-C ──begin(now, grace, output wait)──► Teardown
//!      output deadline ──output_due(writer behind?)──► Recheck | Drop { note }
//!      proxy deadline ──proxy_due──► the Root kills the proxies left, asks srun to end
//!                                     its step (SIGTERM: it kills every task, a stopped
//!                                     proxy too)
//!      launcher deadline ──launcher_due──► the Root kills the launchers left (SIGKILL)
//! ```

use std::time::Duration;

use tokio::time::Instant;

use super::{OUTPUT_RECHECK, PROXY_GRACE};

/// How long a scheduler's launcher asked to end its step (srun, SIGTERM) may take before
/// it is killed: srun asks for the step's end at once, then waits for the step's tasks
/// (slurm.conf's `KillWait` and more, 30 s by default), which rlaunch need not.
const LAUNCHER_GRACE: Duration = Duration::from_secs(1);

#[derive(Debug, Default)]
pub(super) struct Teardown {
    /// The job is ending: ranks' ends from now on are the teardown's doing.
    started: bool,
    /// Kill the proxies themselves if they have not finished by then.
    proxy_deadline: Option<Instant>,
    /// Kill the scheduler's launchers asked to end their steps if they are still there then.
    launcher_deadline: Option<Instant>,
    /// The proxy deadline came: the launchers were asked to end their steps, once.
    proxies_due: bool,
    /// When the teardown's grace is over: output not written by then is dropped.
    output_deadline: Option<Instant>,
    /// At the output deadline, drop only if the writer is behind (a failed job's teardown),
    /// not at once (a signal to rlaunch ended the job).
    drop_only_if_behind: bool,
    /// Say so when the output is dropped (it was not the user's wish).
    note_drop: bool,
}

/// What the output deadline means when it comes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum OutputDue {
    /// The reader keeps up: what is still coming is on its way; looked at again later.
    Recheck,
    /// Drop what is not written; `note`: and say so.
    Drop { note: bool },
}

impl Teardown {
    pub(super) fn started(&self) -> bool {
        self.started
    }

    /// The proxies tear their subtrees down at `now` with `grace` for the ranks. The output
    /// not written `output_wait` after the grace is dropped (`only_if_behind`: only if the
    /// writer is behind then; unless `dropped` already), and the proxies left
    /// [`PROXY_GRACE`] after the grace are killed. A later call (another cause, a second
    /// Ctrl-C) may bring either deadline forward, never push it back.
    pub(super) fn begin(
        &mut self,
        now: Instant,
        grace: Duration,
        output_wait: Duration,
        only_if_behind: bool,
        dropped: bool,
    ) {
        let dropping = now + grace + output_wait;
        if self.output_deadline.is_none_or(|d| d > dropping) && !dropped {
            self.output_deadline = Some(dropping);
            self.drop_only_if_behind = only_if_behind;
            self.note_drop = !output_wait.is_zero();
        }
        let deadline = now + grace + PROXY_GRACE;
        if !self.started || self.proxy_deadline.is_some_and(|d| d > deadline) {
            self.proxy_deadline = Some(deadline);
        }
        self.started = true;
    }

    /// Every proxy is done but the scheduler's launcher (srun) lingers: it gets the grace
    /// proxies get from `now` (none if a proxy was `lost`: its task, stopped or hung, would
    /// keep srun for ever), or less if a deadline for the proxies comes sooner already;
    /// nothing once that deadline came (srun was asked to end its step).
    pub(super) fn launcher_lingers(&mut self, now: Instant, lost: bool) {
        let grace = if lost { Duration::ZERO } else { PROXY_GRACE };
        if !self.proxies_due && self.proxy_deadline.is_none_or(|d| d > now + grace) {
            self.proxy_deadline = Some(now + grace);
        }
    }

    pub(super) fn output_deadline(&self) -> Option<Instant> {
        self.output_deadline
    }

    pub(super) fn proxy_deadline(&self) -> Option<Instant> {
        self.proxy_deadline
    }

    /// The output deadline came at `now`; `writer_behind`: the writer holds more than it
    /// keeps up with.
    pub(super) fn output_due(&mut self, now: Instant, writer_behind: bool) -> OutputDue {
        if self.drop_only_if_behind && !writer_behind {
            self.output_deadline = Some(now + OUTPUT_RECHECK);
            return OutputDue::Recheck;
        }
        self.output_deadline = None;
        OutputDue::Drop { note: self.note_drop }
    }

    pub(super) fn launcher_deadline(&self) -> Option<Instant> {
        self.launcher_deadline
    }

    /// The proxy deadline came at `now`: the Root kills the proxies left and asks the
    /// launchers left to end their steps; those still there [`LAUNCHER_GRACE`] later are
    /// killed. No other proxy deadline comes.
    pub(super) fn proxy_due(&mut self, now: Instant) {
        self.proxy_deadline = None;
        self.proxies_due = true;
        self.launcher_deadline = Some(now + LAUNCHER_GRACE);
    }

    /// The launcher deadline came: the Root kills the launchers left; no other comes.
    pub(super) fn launcher_due(&mut self) {
        self.launcher_deadline = None;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const GRACE: Duration = Duration::from_secs(1);
    const WAIT: Duration = Duration::from_secs(4);

    #[test]
    fn a_failure_gives_the_grace_then_drops_output_only_while_the_writer_is_behind() {
        let (mut teardown, now) = (Teardown::default(), Instant::now());
        assert!(!teardown.started() && teardown.proxy_deadline().is_none());
        teardown.begin(now, GRACE, WAIT, true, false);
        assert!(teardown.started());
        assert_eq!(teardown.output_deadline(), Some(now + GRACE + WAIT));
        assert_eq!(teardown.proxy_deadline(), Some(now + GRACE + PROXY_GRACE));
        // The reader keeps up: looked at again, not dropped.
        let due = now + GRACE + WAIT;
        assert_eq!(teardown.output_due(due, false), OutputDue::Recheck);
        assert_eq!(teardown.output_deadline(), Some(due + OUTPUT_RECHECK));
        // Behind: dropped, and said, since it was not the user's wish.
        assert_eq!(teardown.output_due(due + OUTPUT_RECHECK, true), OutputDue::Drop { note: true });
        assert!(teardown.output_deadline().is_none());
        teardown.proxy_due(due);
        assert!(teardown.proxy_deadline().is_none());
        assert_eq!(teardown.launcher_deadline(), Some(due + LAUNCHER_GRACE));
        teardown.launcher_due();
        assert!(teardown.launcher_deadline().is_none());
    }

    #[test]
    fn a_later_cause_brings_deadlines_forward_and_never_pushes_them_back() {
        let (mut teardown, now) = (Teardown::default(), Instant::now());
        teardown.begin(now, GRACE, WAIT, true, false);
        // A second Ctrl-C: no grace, output dropped at once, quietly.
        let later = now + Duration::from_millis(100);
        teardown.begin(later, Duration::ZERO, Duration::ZERO, false, false);
        assert_eq!(teardown.output_deadline(), Some(later));
        assert_eq!(teardown.proxy_deadline(), Some(later + PROXY_GRACE));
        assert_eq!(teardown.output_due(later, false), OutputDue::Drop { note: false });
        // A cause with a longer grace changes nothing.
        teardown.begin(later, Duration::from_secs(30), WAIT, true, true);
        assert_eq!(teardown.proxy_deadline(), Some(later + PROXY_GRACE));
        assert!(teardown.output_deadline().is_none(), "the output was dropped already");
    }

    #[test]
    fn a_lingering_launcher_gets_the_proxies_grace_once() {
        let (mut teardown, now) = (Teardown::default(), Instant::now());
        teardown.launcher_lingers(now, false);
        assert_eq!(teardown.proxy_deadline(), Some(now + PROXY_GRACE));
        teardown.launcher_lingers(now + Duration::from_secs(1), false);
        assert_eq!(teardown.proxy_deadline(), Some(now + PROXY_GRACE));
        assert!(!teardown.started(), "a lingering srun is no teardown of the job");
        // A proxy was lost: its task may never end; srun's step is ended now.
        let later = now + Duration::from_secs(2);
        teardown.launcher_lingers(later, true);
        assert_eq!(teardown.proxy_deadline(), Some(later));
        // Asked to end its step, it gets the launchers' grace, and no other proxy deadline.
        teardown.proxy_due(later);
        assert_eq!(teardown.launcher_deadline(), Some(later + LAUNCHER_GRACE));
        teardown.launcher_lingers(later, true);
        assert!(teardown.proxy_deadline().is_none());
    }
}
