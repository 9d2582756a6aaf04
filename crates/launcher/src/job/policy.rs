//! The job's policy: what becomes of the job when a rank fails, a node is lost, a signal comes
//! or time runs out. One type decides, on the Root's events alone, as (state, event) →
//! actions; the Root carries the actions out (`ending.rs`: the teardown; `signals.rs`: the
//! signals). Pure: the caller brings the clock, and unit tests drive it with no process.
//!
//! ```text
//!   RankEnded ─┐                                ┌─► TearDown { grace, output } (first cause)
//!   Failed ────┤                                ├─► Forward(sig), StopSelf
//!   Signal ────┼──► Policy::on(event, now) ─────┤
//!   GraceOver ─┤      causes (the first decides) └─► Say(line)
//!   After ─────┘      the forwarded signal's held ends
//! ```
//!
//! A node decides nothing of the kind: it reports each rank's end as it saw it (its exit,
//! whether it finalized) and is told to tear its ranks down.

use std::time::Duration;

use nix::sys::signal::Signal;
use rlaunch_protocol::ids::ExitOutcome;
use tokio::time::Instant;

use super::cause::Cause;
use super::signals::Forwarded;
use super::OUTPUT_GRACE;

/// A second Ctrl-C within this time kills the job.
pub(super) const DOUBLE_INTERRUPT: Duration = Duration::from_secs(5);

/// What happened, as the policy hears it.
#[derive(Debug)]
pub(super) enum Event {
    /// A rank ended; `failure`: why its end fails the job, if it does (`cause::rank_end`).
    RankEnded { outcome: ExitOutcome, failure: Option<Cause> },
    /// Something else that fails the job: a lost proxy, an abort, a timeout, ...
    Failed(Cause),
    /// A signal came to rlaunch.
    Signal(Signal),
    /// The grace after a forwarded signal is over ([`Policy::held_deadline`]).
    GraceOver,
    /// Every link is closed and the output written: the held ends are judged, and `late`
    /// (an output file that failed with the last lines) recorded. Nothing is acted on.
    After { late: Vec<Cause> },
}

/// What the Root does about it.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum Action {
    /// The job ends: every proxy tears its ranks down with `grace` (SIGTERM, then SIGKILL);
    /// output not written `output_wait` after it is dropped (`only_if_behind`: only while
    /// the writer is behind).
    TearDown { grace: Duration, output_wait: Duration, only_if_behind: bool },
    /// Send `sig` to every rank.
    Forward(Signal),
    /// Stop rlaunch itself (after Ctrl-Z, as the shell expects).
    StopSelf,
    /// A line for the user now, after "rlaunch: ".
    Say(&'static str),
}

/// What the Root knows when the event comes.
#[derive(Debug, Clone, Copy)]
pub(super) struct Now {
    pub(super) at: Instant,
    /// Every rank of the launched job has ended.
    pub(super) all_ended: bool,
}

#[derive(Debug)]
pub(super) struct Policy {
    /// `--kill-grace`.
    grace: Duration,
    /// Why the job ends, in the order things happened; the first decides.
    causes: Vec<Cause>,
    /// The last signal forwarded to the ranks, and the failing ends held since.
    forwarded: Forwarded,
    last_interrupt: Option<Instant>,
}

impl Policy {
    pub(super) fn new(grace: Duration) -> Policy {
        Policy { grace, causes: Vec::new(), forwarded: Forwarded::default(), last_interrupt: None }
    }

    /// Decides what `event` means for the job.
    pub(super) fn on(&mut self, event: Event, now: Now) -> Vec<Action> {
        match event {
            Event::RankEnded { outcome, failure } => {
                let mut actions = Vec::new();
                if let Some(cause) = failure {
                    if !self.forwarded.hold(now.at, self.grace, outcome) {
                        actions.extend(self.fail(cause, now));
                    }
                }
                // Every rank ended of the signal before its grace was over: the job ends now,
                // not when the grace is.
                if now.all_ended {
                    if let Some(sig) = self.forwarded.take() {
                        actions.extend(self.fail(Cause::Forwarded(sig), now));
                    }
                }
                actions
            }
            Event::Failed(cause) => self.fail(cause, now),
            Event::Signal(sig) => self.signal(sig, now),
            Event::GraceOver => match self.forwarded.take() {
                // The grace is over and ranks are still running: the signal ends the job.
                Some(sig) => self.fail(Cause::Forwarded(sig), now),
                None => Vec::new(),
            },
            Event::After { late } => {
                self.causes.extend(late);
                // Every rank ended within the grace, some failing: the signal is why.
                if let Some(sig) = self.forwarded.take() {
                    self.causes.push(Cause::Forwarded(sig));
                }
                Vec::new()
            }
        }
    }

    /// Why the job ends, in the order things happened.
    #[cfg(test)]
    pub(super) fn causes(&self) -> &[Cause] {
        &self.causes
    }

    /// The cause that decides the job's end, once there is one.
    pub(super) fn first(&self) -> Option<&Cause> {
        self.causes.first()
    }

    /// When the ends held after a forwarded signal are acted on, if any are held.
    pub(super) fn held_deadline(&self) -> Option<Instant> {
        self.forwarded.deadline(self.grace)
    }

    /// Records why the job must end; the first cause tears it down.
    fn fail(&mut self, cause: Cause, now: Now) -> Vec<Action> {
        let first = self.causes.is_empty();
        // A forwarded signal ends the job when the grace after it is over, or when every
        // rank has ended before that: the ranks have had their grace, and what is still
        // running is killed now.
        // Output that waits to be written is dropped at once when a signal to rlaunch ends
        // the job (the user wants it over), and only well after the grace otherwise, so that
        // a reader that keeps up gets every line the ranks wrote before their end. Either
        // way, once every rank has ended, a reader that keeps up gets it all.
        let (grace, output_wait) = match cause {
            Cause::Forwarded(_) => (Duration::ZERO, Duration::ZERO),
            _ => (self.grace, OUTPUT_GRACE),
        };
        let only_if_behind = !output_wait.is_zero() || now.all_ended;
        self.causes.push(cause);
        match first {
            true => vec![Action::TearDown { grace, output_wait, only_if_behind }],
            false => Vec::new(),
        }
    }

    /// A signal came to rlaunch: forwarded to the ranks; a second Ctrl-C within
    /// [`DOUBLE_INTERRUPT`] kills the job, and Ctrl-Z stops rlaunch too.
    fn signal(&mut self, sig: Signal, now: Now) -> Vec<Action> {
        self.forwarded.sent(sig, now.at);
        match sig {
            Signal::SIGINT => {
                if self.last_interrupt.is_some_and(|t| now.at - t < DOUBLE_INTERRUPT) {
                    self.causes.push(Cause::Interrupted);
                    let kill = Action::TearDown {
                        grace: Duration::ZERO,
                        output_wait: Duration::ZERO,
                        only_if_behind: false,
                    };
                    return vec![Action::Say("interrupted again; killing the job"), kill];
                }
                self.last_interrupt = Some(now.at);
                vec![Action::Forward(sig)]
            }
            Signal::SIGTSTP => vec![Action::Forward(sig), Action::StopSelf],
            _ => vec![Action::Forward(sig)],
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rlaunch_protocol::ids::Gid;

    use super::super::cause::RankFailure;

    const GRACE: Duration = Duration::from_secs(1);

    fn now(at: Instant) -> Now {
        Now { at, all_ended: false }
    }

    fn failed(rank: u32, outcome: ExitOutcome) -> Event {
        let how = RankFailure::Ended(outcome);
        let failure = Some(Cause::RankFailed { rank: Gid(rank), pid: 100 + rank, how });
        Event::RankEnded { outcome, failure }
    }

    fn tear_down(grace: Duration, output_wait: Duration, only_if_behind: bool) -> Vec<Action> {
        vec![Action::TearDown { grace, output_wait, only_if_behind }]
    }

    #[test]
    fn the_first_failure_tears_the_job_down_and_decides_later_ones_are_recorded() {
        let (t0, mut policy) = (Instant::now(), Policy::new(GRACE));
        let clean = Event::RankEnded { outcome: ExitOutcome::Exited(0), failure: None };
        assert_eq!(policy.on(clean, now(t0)), []);
        assert!(policy.first().is_none());
        let first = policy.on(failed(1, ExitOutcome::Exited(3)), now(t0));
        assert_eq!(first, tear_down(GRACE, OUTPUT_GRACE, true));
        let lost = Cause::LostProxy { host: "n1".into(), reason: "gone".into() };
        assert_eq!(policy.on(Event::Failed(lost), now(t0)), []);
        assert!(matches!(policy.first(), Some(Cause::RankFailed { rank: Gid(1), .. })));
        assert_eq!(policy.causes.len(), 2);
        assert_eq!(policy.first().map(Cause::exit_code), Some(3));
    }

    #[test]
    fn ends_after_ctrl_c_are_held_for_the_grace_then_the_signal_ends_the_job() {
        let (t0, mut policy) = (Instant::now(), Policy::new(GRACE));
        assert_eq!(
            policy.on(Event::Signal(Signal::SIGINT), now(t0)),
            [Action::Forward(Signal::SIGINT)]
        );
        let soon = now(t0 + GRACE / 10);
        assert_eq!(policy.on(failed(0, ExitOutcome::Signaled(2)), soon), []);
        assert_eq!(policy.held_deadline(), Some(t0 + GRACE));
        assert!(policy.first().is_none(), "held, not a failure");
        // The grace is over, a rank still runs: the signal ends the job, at once.
        let over = policy.on(Event::GraceOver, now(t0 + GRACE));
        assert_eq!(over, tear_down(Duration::ZERO, Duration::ZERO, false));
        assert!(matches!(policy.first(), Some(Cause::Forwarded(Signal::SIGINT))));
        assert_eq!(policy.first().map(Cause::exit_code), Some(130));
        assert_eq!(policy.held_deadline(), None);
    }

    #[test]
    fn every_rank_ended_of_the_signal_ends_the_job_before_the_grace_is_over() {
        let (t0, mut policy) = (Instant::now(), Policy::new(GRACE));
        policy.on(Event::Signal(Signal::SIGTERM), now(t0));
        let last = Now { at: t0 + GRACE / 10, all_ended: true };
        let actions = policy.on(failed(0, ExitOutcome::Signaled(15)), last);
        assert_eq!(actions, tear_down(Duration::ZERO, Duration::ZERO, true));
        assert_eq!(policy.first().map(Cause::exit_code), Some(143));
    }

    #[test]
    fn a_second_ctrl_c_kills_the_job_and_ctrl_z_stops_rlaunch_too() {
        let (t0, mut policy) = (Instant::now(), Policy::new(GRACE));
        policy.on(Event::Signal(Signal::SIGINT), now(t0));
        let again = policy.on(Event::Signal(Signal::SIGINT), now(t0 + DOUBLE_INTERRUPT / 2));
        let [say, kill] = &again[..] else { panic!("{again:?}") };
        assert_eq!(say, &Action::Say("interrupted again; killing the job"));
        assert_eq!(
            vec![kill],
            tear_down(Duration::ZERO, Duration::ZERO, false).iter().collect::<Vec<_>>()
        );
        assert!(matches!(policy.first(), Some(Cause::Interrupted)));
        assert_eq!(policy.first().map(Cause::exit_code), Some(crate::exit::INTERRUPTED));

        let mut policy = Policy::new(GRACE);
        policy.on(Event::Signal(Signal::SIGINT), now(t0));
        let later = policy.on(Event::Signal(Signal::SIGINT), now(t0 + DOUBLE_INTERRUPT));
        assert_eq!(later, [Action::Forward(Signal::SIGINT)], "not within 5 s: forwarded");
        let stop = policy.on(Event::Signal(Signal::SIGTSTP), now(t0));
        assert_eq!(stop, [Action::Forward(Signal::SIGTSTP), Action::StopSelf]);
        assert!(policy.first().is_none());
    }

    #[test]
    fn after_the_links_close_held_ends_are_the_signals_and_late_failures_are_recorded() {
        let (t0, mut policy) = (Instant::now(), Policy::new(GRACE));
        policy.on(Event::Signal(Signal::SIGHUP), now(t0));
        policy.on(failed(0, ExitOutcome::Exited(1)), now(t0));
        assert_eq!(policy.on(Event::After { late: Vec::new() }, now(t0)), []);
        assert!(matches!(policy.first(), Some(Cause::Forwarded(Signal::SIGHUP))));

        let mut policy = Policy::new(GRACE);
        let late = vec![Cause::StdoutClosed];
        assert_eq!(policy.on(Event::After { late }, now(t0)), []);
        assert!(matches!(policy.first(), Some(Cause::StdoutClosed)));
    }
}
