//! The signals rlaunch catches and forwards to the ranks, and what the ranks' ends after a
//! forwarded signal mean (for the policy, `policy.rs`).

use std::time::Duration;

use nix::sys::signal::Signal;
use rlaunch_protocol::ids::ExitOutcome;
use tokio::signal::unix::{signal, SignalKind};
use tokio::time::Instant;

pub(crate) struct ForwardedSignals {
    streams: Vec<(Signal, tokio::signal::unix::Signal)>,
}

impl ForwardedSignals {
    pub(crate) fn new() -> ForwardedSignals {
        let wanted = [
            Signal::SIGINT,
            Signal::SIGTERM,
            Signal::SIGHUP,
            Signal::SIGQUIT,
            Signal::SIGUSR1,
            Signal::SIGUSR2,
            Signal::SIGTSTP,
            Signal::SIGCONT,
        ];
        let streams = wanted
            .into_iter()
            .map(|s| (s, signal(SignalKind::from_raw(s as i32)).expect("signal handler")))
            .collect();
        ForwardedSignals { streams }
    }

    /// The next signal that arrived.
    pub(crate) async fn recv(&mut self) -> Signal {
        std::future::poll_fn(|cx| {
            for (sig, stream) in &mut self.streams {
                if stream.poll_recv(cx).is_ready() {
                    return std::task::Poll::Ready(*sig);
                }
            }
            std::task::Poll::Pending
        })
        .await
    }
}

/// How late, past the grace, an end the forwarded signal explains is still its doing: the
/// news of a death by it behind a slow reader's output, or a rank that failed because
/// another died of it (a torch rank whose peer closed its socket while Python unwound, which
/// took over a second on a busy machine).
const LATE_NEWS: Duration = Duration::from_secs(30);

/// After rlaunch forwards a signal that may end the ranks (INT, TERM, HUP, QUIT, USR1,
/// USR2), the ends it causes are its doing, not the ranks': for `--kill-grace` after the
/// signal they are held rather than taken as the job's failure, so that one rank's quick exit
/// does not cut the others' handlers short (Python's `except KeyboardInterrupt` cleanup, a
/// shell's trap). Only ends the signal explains are held: killed by it, or (INT, TERM, HUP,
/// QUIT) a non-zero exit, as a handler's; a segfault is a segfault. Pure: the caller brings
/// the clock.
#[derive(Debug, Default)]
pub(crate) struct Forwarded {
    /// The last such signal and when it was forwarded.
    last: Option<(Signal, Instant)>,
    /// The signal the held ends are blamed on and when it was sent: the grace runs from
    /// there, however many signals follow.
    held: Option<(Signal, Instant)>,
}

impl Forwarded {
    /// Whether a forwarded `sig` may end the ranks, so that their ends after it are its.
    pub(crate) fn ends_ranks(sig: Signal) -> bool {
        use Signal::*;
        matches!(sig, SIGINT | SIGTERM | SIGHUP | SIGQUIT | SIGUSR1 | SIGUSR2)
    }

    pub(crate) fn sent(&mut self, sig: Signal, now: Instant) {
        if Self::ends_ranks(sig) {
            self.last = Some((sig, now));
        }
    }

    /// A rank ended badly (`outcome`) at `now`: true if the end is held (the last forwarded
    /// signal, less than `grace` + [`LATE_NEWS`] ago, explains it), false if it is the job's
    /// failure as usual. An end held past the grace is acted on at once (the deadline passed).
    pub(crate) fn hold(&mut self, now: Instant, grace: Duration, outcome: ExitOutcome) -> bool {
        let Some((sig, at)) = self.last else { return false };
        // The grace runs from the signal: every rank got it then.
        if now >= at + grace + LATE_NEWS {
            return false;
        }
        let handled = !matches!(sig, Signal::SIGUSR1 | Signal::SIGUSR2);
        let explained = match outcome {
            ExitOutcome::Signaled(s) => s == sig as i32,
            ExitOutcome::Exited(code) => code != 0 && handled,
            ExitOutcome::SpawnFailed { .. } | ExitOutcome::NoWorkdir { .. } => false,
        };
        if explained && self.held.is_none() {
            self.held = Some((sig, at));
        }
        explained
    }

    /// Whether a signal that asks the ranks to stop (not USR1/2) was forwarded less than
    /// `grace` + [`LATE_NEWS`] before `now`: what fails meanwhile is likely its doing.
    pub(crate) fn recent(&self, now: Instant, grace: Duration) -> bool {
        use Signal::*;
        let asks_to_stop = |sig| matches!(sig, SIGINT | SIGTERM | SIGHUP | SIGQUIT);
        self.last.is_some_and(|(sig, at)| asks_to_stop(sig) && now < at + grace + LATE_NEWS)
    }

    /// When the held ends must be acted on: the grace after their signal, if any are held.
    pub(crate) fn deadline(&self, grace: Duration) -> Option<Instant> {
        self.held.map(|(_, at)| at + grace)
    }

    /// The signal the held ends are blamed on, if any are held; they are acted on now.
    pub(crate) fn take(&mut self) -> Option<Signal> {
        self.held.take().map(|(sig, _)| sig)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const GRACE: Duration = Duration::from_secs(1);

    fn exited(code: i32) -> ExitOutcome {
        ExitOutcome::Exited(code)
    }

    #[test]
    fn ends_within_the_grace_after_a_forwarded_signal_are_held() {
        let t0 = Instant::now();
        let mut f = Forwarded::default();
        assert!(!f.hold(t0, GRACE, exited(3)), "no signal: a failure is a failure");
        f.sent(Signal::SIGINT, t0);
        assert_eq!(f.deadline(GRACE), None, "nothing held yet");
        assert!(f.hold(t0 + Duration::from_millis(10), GRACE, exited(3)));
        assert!(f.hold(t0 + Duration::from_millis(20), GRACE, ExitOutcome::Signaled(2)));
        assert_eq!(f.deadline(GRACE), Some(t0 + GRACE));
        assert_eq!(f.take(), Some(Signal::SIGINT));
        assert_eq!(f.take(), None, "taken once");
        let late = t0 + GRACE * 3;
        assert!(!f.hold(late, GRACE, ExitOutcome::Signaled(15)), "by another signal: a failure");
        assert!(f.hold(late, GRACE, ExitOutcome::Signaled(2)), "killed by it: its doing, late");
        assert!(f.hold(late, GRACE, exited(1)), "a knock-on failure of a slow unwinding: its");
        assert_eq!(f.deadline(GRACE), Some(t0 + GRACE), "the grace ran from the signal");
        f.take();
        let much_later = t0 + GRACE + LATE_NEWS;
        assert!(!f.hold(much_later, GRACE, ExitOutcome::Signaled(2)), "within reason");
        assert!(!f.hold(much_later, GRACE, exited(3)), "long after the signal, a failure is one");
    }

    #[test]
    fn only_ends_the_signal_explains_are_held() {
        let t0 = Instant::now();
        let mut f = Forwarded::default();
        f.sent(Signal::SIGINT, t0);
        assert!(!f.hold(t0, GRACE, ExitOutcome::Signaled(11)), "a segfault is a segfault");
        f.sent(Signal::SIGUSR1, t0);
        assert!(!f.hold(t0, GRACE, exited(1)), "USR1 is not a request to stop");
        assert!(f.hold(t0, GRACE, ExitOutcome::Signaled(10)), "killed by USR1: its doing");
    }

    #[test]
    fn signals_that_keep_coming_do_not_postpone_the_deadline() {
        let t0 = Instant::now();
        let mut f = Forwarded::default();
        f.sent(Signal::SIGHUP, t0);
        assert!(f.hold(t0, GRACE, exited(1)));
        f.sent(Signal::SIGHUP, t0 + GRACE / 2);
        assert!(f.hold(t0 + GRACE / 2, GRACE, exited(1)));
        assert_eq!(f.deadline(GRACE), Some(t0 + GRACE), "from the signal of the first end");
    }

    #[test]
    fn job_control_signals_hold_nothing() {
        let t0 = Instant::now();
        let mut f = Forwarded::default();
        f.sent(Signal::SIGTSTP, t0);
        f.sent(Signal::SIGCONT, t0);
        assert!(!f.hold(t0, GRACE, exited(1)));
    }
}
