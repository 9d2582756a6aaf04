//! The signals rlaunch catches and forwards to the ranks, and what the ranks' ends after a
//! forwarded signal mean.

use std::time::Duration;

use nix::sys::signal::Signal;
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

/// After rlaunch forwards a signal that may end the ranks (INT, TERM, HUP, QUIT, USR1,
/// USR2), their failing ends are its doing, not theirs: for `--kill-grace` they are held
/// rather than taken as the job's failure, so that one rank's quick exit does not cut the
/// others' handlers short (Python's `except KeyboardInterrupt` cleanup, a shell's trap).
/// Pure: the caller brings the clock.
#[derive(Debug, Default)]
pub(crate) struct Forwarded {
    /// The last such signal and when it was forwarded.
    last: Option<(Signal, Instant)>,
    /// Failing ends held since then.
    held: usize,
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

    /// A rank failed at `now`: true if it is held (a signal was forwarded less than `grace`
    /// ago), false if it is the job's failure as usual.
    pub(crate) fn hold(&mut self, now: Instant, grace: Duration) -> bool {
        let held = self.last.is_some_and(|(_, at)| now < at + grace);
        self.held += usize::from(held);
        held
    }

    /// When the held ends must be acted on: the grace after the signal, if any are held.
    pub(crate) fn deadline(&self, grace: Duration) -> Option<Instant> {
        let (_, at) = self.last?;
        (self.held > 0).then_some(at + grace)
    }

    /// The signal the held ends are blamed on, if any are held; they are acted on now.
    pub(crate) fn take(&mut self) -> Option<Signal> {
        let (sig, _) = self.last?;
        (std::mem::take(&mut self.held) > 0).then_some(sig)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const GRACE: Duration = Duration::from_secs(1);

    #[test]
    fn ends_within_the_grace_after_a_forwarded_signal_are_held() {
        let t0 = Instant::now();
        let mut f = Forwarded::default();
        assert!(!f.hold(t0, GRACE), "no signal: a failure is a failure");
        f.sent(Signal::SIGINT, t0);
        assert_eq!(f.deadline(GRACE), None, "nothing held yet");
        assert!(f.hold(t0 + Duration::from_millis(10), GRACE));
        assert!(f.hold(t0 + Duration::from_millis(20), GRACE));
        assert_eq!(f.deadline(GRACE), Some(t0 + GRACE));
        assert_eq!(f.take(), Some(Signal::SIGINT));
        assert_eq!(f.take(), None, "taken once");
        assert!(!f.hold(t0 + GRACE, GRACE), "after the grace, a failure is a failure");
    }

    #[test]
    fn job_control_signals_hold_nothing() {
        let t0 = Instant::now();
        let mut f = Forwarded::default();
        f.sent(Signal::SIGTSTP, t0);
        f.sent(Signal::SIGCONT, t0);
        assert!(!f.hold(t0, GRACE));
    }
}
