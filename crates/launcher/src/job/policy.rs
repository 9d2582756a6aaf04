//! The job's policy: what becomes of the job when a rank fails, a node is lost, a signal comes
//! or time runs out. One type decides, on the Root's events alone, as (state, event) →
//! actions; the Root carries the actions out (`ending.rs`: the teardown; `signals.rs`: the
//! signals). Pure: the caller brings the clock, and unit tests drive it with no process.
//!
//! ```text
//!   RankEnded ─┐                                ┌─► TearDown { grace, output } (first cause)
//!   Failed ────┤                                ├─► Forward(sig), StopSelf, Say(line)
//!   Signal ────┼──► Policy::on(event, now) ─────┼─► Restart { after }   (attempt settled)
//!   GraceOver ─┤      causes (the first decides) ├─► StartAttempt        (backoff over)
//!   Settled ───┤      the forwarded signal's      └─► CancelRestart
//!   BackoffOver┤      held ends; attempts
//!   After ─────┘
//! ```
//!
//! By default the first failure ends the job. With `--max-restarts N`, a failure that a new
//! attempt may not meet again (a rank failed or aborted, a node was lost once it was up)
//! tears the attempt down as a failure would, and once every proxy of it is done
//! the whole job starts again after the backoff, up to N times. What the user or the job's
//! limits end (a signal, the timeout, a closed stdout) ends the job, restart or not, and
//! decides its status.
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
    /// Every proxy of the attempt is done (and each launcher that started some).
    Settled,
    /// The wait before the next attempt is over.
    BackoffOver,
    /// Every link is closed and the output written: the held ends are judged, and `late`
    /// (an output file that failed with the last lines) recorded. Nothing is acted on.
    After { late: Vec<Cause> },
    /// Ranks ended with their lost node ([`Action::NodeGone`]), and are counted as ended.
    Gone,
}

/// What the Root does about it.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum Action {
    /// The job ends: every proxy tears its ranks down with `grace` (SIGTERM, then SIGKILL);
    /// output not written `output_wait` after it is dropped (`only_if_behind`: only while
    /// the writer is behind).
    TearDown { grace: Duration, output_wait: Duration, only_if_behind: bool },
    /// Every rank has ended, the job going on after failures: the nodes, which wait to be
    /// told, may finish. Nothing is killed or dropped: it ends as a job whose ranks all
    /// succeeded does, a proxy that does not finish found by its silence.
    Over,
    /// Send `sig` to every rank.
    Forward(Signal),
    /// Stop rlaunch itself (after Ctrl-Z, as the shell expects).
    StopSelf,
    /// A line for the user now, after "rlaunch: ".
    Say(&'static str),
    /// The attempt is over and the job starts again, as attempt `attempt` (1 for the first
    /// restart), `after` from now; [`Policy::past`]'s last cause is why. `lost`: the hosts
    /// whose proxies the attempt lost, for spares to replace.
    Restart { attempt: u32, after: Duration, lost: Vec<String> },
    /// Start the next attempt now.
    StartAttempt,
    /// The restart that was waiting will not come.
    CancelRestart,
    /// `rank` failed and the job goes on without it: every node is told (`--on-failure
    /// continue`).
    RankGone(rlaunch_protocol::ids::Gid),
    /// The proxy on `host` was lost after it came up, and the job goes on without it: its
    /// ranks and those of the subtree under it have failed, and every node is told.
    NodeGone(String),
}

/// What a failure does to the job: `--max-restarts`, `--restart-backoff`, `--on-failure`.
#[derive(Debug, Clone, Copy, Default)]
pub(super) struct Restarts {
    pub(super) max: u32,
    /// The wait before the first restart, doubled before each next.
    pub(super) backoff: Duration,
    /// `--on-failure continue`: a failed rank ends alone and the others run on.
    pub(super) goes_on: bool,
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
    restarts: Restarts,
    /// The attempt running (0 for the first).
    attempt: u32,
    /// The cause that ended each earlier attempt, in order.
    past: Vec<Cause>,
    /// The attempt is being torn down to start again once every proxy of it is done.
    restarting: bool,
    /// Between attempts: the next waits for its backoff.
    between: bool,
    /// The job is being torn down (for its end or a restart).
    torn: bool,
    /// The cause the attempt being torn down restarts for.
    restart_cause: Option<Cause>,
}

impl Policy {
    pub(super) fn new(grace: Duration, restarts: Restarts) -> Policy {
        Policy {
            grace,
            causes: Vec::new(),
            forwarded: Forwarded::default(),
            last_interrupt: None,
            restarts,
            attempt: 0,
            past: Vec::new(),
            restarting: false,
            between: false,
            torn: false,
            restart_cause: None,
        }
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
                actions.extend(self.over_if_all_ended(now));
                actions
            }
            Event::Gone => self.over_if_all_ended(now).into_iter().collect(),
            Event::Failed(cause) => self.fail(cause, now),
            Event::Signal(sig) => self.signal(sig, now),
            Event::GraceOver => match self.forwarded.take() {
                // The grace is over and ranks are still running: the signal ends the job.
                Some(sig) => self.fail(Cause::Forwarded(sig), now),
                None => Vec::new(),
            },
            Event::Settled if self.restarting => {
                self.restarting = false;
                self.between = true;
                let lost = self.causes.iter().filter_map(|c| match c {
                    Cause::LostProxy { host, .. } => Some(host.clone()),
                    _ => None,
                });
                let mut lost: Vec<String> = lost.collect();
                lost.sort();
                lost.dedup();
                self.past.extend(self.restart_cause.take());
                self.causes.clear();
                self.torn = false;
                self.forwarded = Forwarded::default();
                self.attempt += 1;
                let doubling = 1u32.checked_shl(self.attempt - 1).unwrap_or(u32::MAX);
                let after = self.restarts.backoff.saturating_mul(doubling);
                vec![Action::Restart { attempt: self.attempt, after, lost }]
            }
            Event::Settled => Vec::new(),
            Event::BackoffOver if self.between => {
                self.between = false;
                vec![Action::StartAttempt]
            }
            Event::BackoffOver => Vec::new(),
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

    /// Going on after failures, the nodes wait to be told that the job is over: once every
    /// rank has ended.
    fn over_if_all_ended(&mut self, now: Now) -> Option<Action> {
        if !(now.all_ended && self.restarts.goes_on && !self.torn) {
            return None;
        }
        self.torn = true;
        Some(Action::Over)
    }

    /// Why the job ends, in the order things happened.
    #[cfg(test)]
    pub(super) fn causes(&self) -> &[Cause] {
        &self.causes
    }

    /// The cause that ended each earlier attempt, in order.
    pub(super) fn past(&self) -> &[Cause] {
        &self.past
    }

    /// The attempt running (0 for the first).
    pub(super) fn attempt(&self) -> u32 {
        self.attempt
    }

    /// The cause that decides the job's end, once there is one.
    pub(super) fn first(&self) -> Option<&Cause> {
        self.causes.first()
    }

    /// When the ends held after a forwarded signal are acted on, if any are held.
    pub(super) fn held_deadline(&self) -> Option<Instant> {
        self.forwarded.deadline(self.grace)
    }

    /// Records why the job must end; the first cause tears it down, to start again if it
    /// may. A cause the restart must not outlive (see [`Cause::restartable`]) calls it off
    /// and decides the job's status.
    fn fail(&mut self, cause: Cause, now: Now) -> Vec<Action> {
        // `--on-failure continue`: a rank's failure is its own; the job's status still says
        // the first one at the end. A rank that closed its PMI connection before finalize
        // while still running has failed as surely as one that exited so (which of the two
        // the node sees first is a race): the others are told, and it ends when it ends.
        if let Cause::RankFailed { rank, .. } | Cause::PmiFault { rank, .. } = cause {
            if self.restarts.goes_on && !self.torn {
                self.causes.push(cause);
                return vec![Action::RankGone(rank)];
            }
        }
        // A node lost once up is its ranks' failure, and its subtree's (their proxies end
        // with their lost parent). One that never came up: the job could not start.
        if let Cause::LostProxy { host, came_up: true, .. } = &cause {
            if self.restarts.goes_on && !self.torn {
                let host = host.clone();
                self.causes.push(cause);
                return vec![Action::NodeGone(host)];
            }
        }
        // Between attempts nothing runs that a restart would be for; after the user's signal
        // the failures are its doing (an MPI_Abort in a Ctrl-C handler, say).
        let signalled = self.forwarded.recent(now.at, self.grace);
        let restartable = cause.restartable() && !self.between && !signalled;
        let (first, mut actions) = self.record(cause.clone(), restartable);
        if !first {
            return actions;
        }
        if restartable && self.attempt < self.restarts.max {
            self.restarting = true;
            self.restart_cause = Some(cause.clone());
        }
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
        actions.push(Action::TearDown { grace, output_wait, only_if_behind });
        actions
    }

    /// Adds `cause` to the causes. Returns whether it decides the job's status (the first,
    /// or one that calls a coming restart off), and the action that calls off a restart
    /// waiting for its backoff.
    fn record(&mut self, cause: Cause, restartable: bool) -> (bool, Vec<Action>) {
        // What the teardown itself brings (a proxy that had not dialed in yet, a rank it
        // ended) is no reason to call the restart off: only the user's and the limits' are.
        if (self.restarting || self.between) && !restartable && cause.calls_off_restart() {
            self.restarting = false;
            let cancel = std::mem::take(&mut self.between).then_some(Action::CancelRestart);
            // It ends the job, rather than the failure the restart was for.
            self.causes.insert(0, cause);
            self.torn = true;
            return (true, cancel.into_iter().collect());
        }
        self.causes.push(cause);
        // The first cause that ends the job tears it down (after failed ranks that did not,
        // with the job going on).
        (!std::mem::replace(&mut self.torn, true), Vec::new())
    }

    /// A signal came to rlaunch: forwarded to the ranks; a second Ctrl-C within
    /// [`DOUBLE_INTERRUPT`] kills the job, and Ctrl-Z stops rlaunch too.
    fn signal(&mut self, sig: Signal, now: Now) -> Vec<Action> {
        self.forwarded.sent(sig, now.at);
        // Restarting, the job is ending anyway: a signal that would end the ranks ends it
        // (between attempts, with no rank to end).
        if (self.restarting || self.between) && Forwarded::ends_ranks(sig) {
            let mut actions = self.fail(Cause::Forwarded(sig), now);
            actions.push(Action::Forward(sig));
            return actions;
        }
        match sig {
            Signal::SIGINT => {
                if self.last_interrupt.is_some_and(|t| now.at - t < DOUBLE_INTERRUPT) {
                    let (_, mut actions) = self.record(Cause::Interrupted, false);
                    actions.push(Action::Say("interrupted again; killing the job"));
                    actions.push(Action::TearDown {
                        grace: Duration::ZERO,
                        output_wait: Duration::ZERO,
                        only_if_behind: false,
                    });
                    return actions;
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
        let (t0, mut policy) = (Instant::now(), Policy::new(GRACE, Restarts::default()));
        let clean = Event::RankEnded { outcome: ExitOutcome::Exited(0), failure: None };
        assert_eq!(policy.on(clean, now(t0)), []);
        assert!(policy.first().is_none());
        let first = policy.on(failed(1, ExitOutcome::Exited(3)), now(t0));
        assert_eq!(first, tear_down(GRACE, OUTPUT_GRACE, true));
        let lost = Cause::LostProxy { host: "n1".into(), reason: "gone".into(), came_up: true };
        assert_eq!(policy.on(Event::Failed(lost), now(t0)), []);
        assert!(matches!(policy.first(), Some(Cause::RankFailed { rank: Gid(1), .. })));
        assert_eq!(policy.causes.len(), 2);
        assert_eq!(policy.first().map(Cause::exit_code), Some(3));
    }

    #[test]
    fn ends_after_ctrl_c_are_held_for_the_grace_then_the_signal_ends_the_job() {
        let (t0, mut policy) = (Instant::now(), Policy::new(GRACE, Restarts::default()));
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
        let (t0, mut policy) = (Instant::now(), Policy::new(GRACE, Restarts::default()));
        policy.on(Event::Signal(Signal::SIGTERM), now(t0));
        let last = Now { at: t0 + GRACE / 10, all_ended: true };
        let actions = policy.on(failed(0, ExitOutcome::Signaled(15)), last);
        assert_eq!(actions, tear_down(Duration::ZERO, Duration::ZERO, true));
        assert_eq!(policy.first().map(Cause::exit_code), Some(143));
    }

    #[test]
    fn a_second_ctrl_c_kills_the_job_and_ctrl_z_stops_rlaunch_too() {
        let (t0, mut policy) = (Instant::now(), Policy::new(GRACE, Restarts::default()));
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

        let mut policy = Policy::new(GRACE, Restarts::default());
        policy.on(Event::Signal(Signal::SIGINT), now(t0));
        let later = policy.on(Event::Signal(Signal::SIGINT), now(t0 + DOUBLE_INTERRUPT));
        assert_eq!(later, [Action::Forward(Signal::SIGINT)], "not within 5 s: forwarded");
        let stop = policy.on(Event::Signal(Signal::SIGTSTP), now(t0));
        assert_eq!(stop, [Action::Forward(Signal::SIGTSTP), Action::StopSelf]);
        assert!(policy.first().is_none());
    }

    #[test]
    fn after_the_links_close_held_ends_are_the_signals_and_late_failures_are_recorded() {
        let (t0, mut policy) = (Instant::now(), Policy::new(GRACE, Restarts::default()));
        policy.on(Event::Signal(Signal::SIGHUP), now(t0));
        policy.on(failed(0, ExitOutcome::Exited(1)), now(t0));
        assert_eq!(policy.on(Event::After { late: Vec::new() }, now(t0)), []);
        assert!(matches!(policy.first(), Some(Cause::Forwarded(Signal::SIGHUP))));

        let mut policy = Policy::new(GRACE, Restarts::default());
        let late = vec![Cause::StdoutClosed];
        assert_eq!(policy.on(Event::After { late }, now(t0)), []);
        assert!(matches!(policy.first(), Some(Cause::StdoutClosed)));
    }

    fn restarts(max: u32, backoff: Duration) -> Policy {
        Policy::new(GRACE, Restarts { max, backoff, goes_on: false })
    }

    #[test]
    fn a_failed_rank_restarts_the_job_once_the_attempt_is_settled_up_to_the_most_asked() {
        let (t0, mut policy) = (Instant::now(), restarts(2, Duration::from_secs(1)));
        // Attempt 0 fails: torn down as usual, then restarted after the backoff.
        let first = policy.on(failed(1, ExitOutcome::Exited(3)), now(t0));
        assert_eq!(first, tear_down(GRACE, OUTPUT_GRACE, true));
        assert_eq!(policy.on(failed(2, ExitOutcome::Signaled(15)), now(t0)), [], "the teardown's");
        let restart = Action::Restart { attempt: 1, after: Duration::from_secs(1), lost: vec![] };
        assert_eq!(policy.on(Event::Settled, now(t0)), [restart]);
        assert!(matches!(policy.past(), [Cause::RankFailed { rank: Gid(1), .. }]));
        assert!(policy.first().is_none(), "the next attempt starts clean");
        assert_eq!(policy.on(Event::BackoffOver, now(t0)), [Action::StartAttempt]);
        assert_eq!(policy.attempt(), 1);
        // Attempt 1 fails too: the backoff doubles.
        policy.on(failed(0, ExitOutcome::Exited(1)), now(t0));
        let restart = Action::Restart { attempt: 2, after: Duration::from_secs(2), lost: vec![] };
        assert_eq!(policy.on(Event::Settled, now(t0)), [restart]);
        policy.on(Event::BackoffOver, now(t0));
        // Attempt 2 is the last: its failure ends the job, with its status.
        policy.on(failed(0, ExitOutcome::Exited(7)), now(t0));
        assert_eq!(policy.on(Event::Settled, now(t0)), []);
        assert_eq!(policy.first().map(Cause::exit_code), Some(7));
        assert_eq!(policy.past().len(), 2);
    }

    #[test]
    fn what_the_user_or_a_limit_ends_or_a_start_that_would_fail_again_is_not_restarted() {
        let t0 = Instant::now();
        for (event, at) in [
            (Event::Failed(Cause::TimedOut(GRACE)), now(t0)),
            (Event::Failed(Cause::StdoutClosed), now(t0)),
            (failed(0, ExitOutcome::SpawnFailed { errno: 2 }), now(t0)),
            (
                Event::Failed(Cause::LostProxy {
                    host: "n1".into(),
                    reason: "no route".into(),
                    came_up: false,
                }),
                now(t0),
            ),
        ] {
            let mut policy = restarts(3, Duration::ZERO);
            let what = format!("{event:?}");
            assert!(!policy.on(event, at).is_empty(), "{what}: torn down");
            assert_eq!(policy.on(Event::Settled, now(t0)), [], "{what}: not restarted");
        }
        // A node lost once it was up is restarted, the hosts lost said for spares.
        let mut policy = restarts(3, Duration::ZERO);
        let lost = |host: &str| Cause::LostProxy {
            host: host.into(),
            reason: "gone".into(),
            came_up: true,
        };
        policy.on(Event::Failed(lost("n1")), now(t0));
        policy.on(failed(0, ExitOutcome::Signaled(15)), now(t0));
        policy.on(Event::Failed(lost("n3")), now(t0));
        let lost = vec!["n1".to_string(), "n3".to_string()];
        let restart = Action::Restart { attempt: 1, after: Duration::ZERO, lost };
        assert_eq!(policy.on(Event::Settled, now(t0)), [restart]);
    }

    #[test]
    fn a_signal_or_the_timeout_calls_a_coming_restart_off_and_decides_the_status() {
        let t0 = Instant::now();
        // During the teardown for the restart: the timeout ends the job, saying so.
        let mut policy = restarts(1, Duration::ZERO);
        policy.on(failed(1, ExitOutcome::Exited(3)), now(t0));
        policy.on(Event::Failed(Cause::TimedOut(GRACE)), now(t0));
        assert_eq!(policy.on(Event::Settled, now(t0)), []);
        assert_eq!(policy.first().map(Cause::exit_code), Some(crate::exit::TIMED_OUT));
        // While it waits for its backoff: Ctrl-C ends the job at once.
        let mut policy = restarts(1, Duration::from_secs(10));
        policy.on(failed(1, ExitOutcome::Exited(3)), now(t0));
        policy.on(Event::Settled, now(t0));
        let actions = policy.on(Event::Signal(Signal::SIGINT), now(t0));
        assert_eq!(actions[0], Action::CancelRestart, "{actions:?}");
        assert_eq!(policy.on(Event::BackoffOver, now(t0)), [], "no attempt after it");
        assert_eq!(policy.first().map(Cause::exit_code), Some(130));
        // Ctrl-C during the teardown for a restart: no restart, interrupted.
        let mut policy = restarts(1, Duration::ZERO);
        policy.on(failed(1, ExitOutcome::Exited(3)), now(t0));
        let actions = policy.on(Event::Signal(Signal::SIGINT), now(t0 + GRACE / 10));
        let kill = tear_down(Duration::ZERO, Duration::ZERO, false).remove(0);
        assert_eq!(actions, [kill, Action::Forward(Signal::SIGINT)]);
        assert_eq!(policy.on(Event::Settled, now(t0)), []);
        assert_eq!(policy.first().map(Cause::exit_code), Some(130));
    }

    #[test]
    fn going_on_a_failed_rank_is_told_and_the_job_ends_when_every_rank_has() {
        let t0 = Instant::now();
        let mut policy = Policy::new(GRACE, Restarts { goes_on: true, ..Restarts::default() });
        let gone = policy.on(failed(1, ExitOutcome::Exited(3)), now(t0));
        assert_eq!(gone, [Action::RankGone(Gid(1))]);
        let what = "closed its PMI connection before calling finalize".to_string();
        let closed = Cause::PmiFault { rank: Gid(2), pid: 102, what };
        assert_eq!(policy.on(Event::Failed(closed), now(t0)), [Action::RankGone(Gid(2))]);
        // A node lost once up: its ranks have failed, the job goes on.
        let lost = Cause::LostProxy { host: "n1".into(), reason: "gone".into(), came_up: true };
        assert_eq!(
            policy.on(Event::Failed(lost.clone()), now(t0)),
            [Action::NodeGone("n1".into())]
        );
        // One that never came up: the job could not start as asked, and ends.
        let never = Cause::LostProxy { host: "n2".into(), reason: "ssh".into(), came_up: false };
        assert_eq!(policy.on(Event::Failed(never), now(t0)), tear_down(GRACE, OUTPUT_GRACE, true));
        assert_eq!(policy.first().map(Cause::exit_code), Some(3), "the first failure's status");

        // The lost node's ranks were the last running: the job is over.
        let mut policy = Policy::new(GRACE, Restarts { goes_on: true, ..Restarts::default() });
        policy.on(Event::Failed(lost), now(t0));
        assert_eq!(policy.on(Event::Gone, now(t0)), []);
        let over = [Action::Over];
        assert_eq!(policy.on(Event::Gone, Now { at: t0, all_ended: true }), over);
        assert_eq!(policy.first().map(Cause::exit_code), Some(255));

        // With no failure but the one: every rank's end tells the nodes the job is over.
        let mut policy = Policy::new(GRACE, Restarts { goes_on: true, ..Restarts::default() });
        policy.on(failed(1, ExitOutcome::Exited(3)), now(t0));
        let clean = Event::RankEnded { outcome: ExitOutcome::Exited(0), failure: None };
        let last = Now { at: t0, all_ended: true };
        let over = [Action::Over];
        assert_eq!(policy.on(clean, last), over);
    }

    #[test]
    fn failures_after_the_users_signal_or_of_the_teardown_itself_restart_nothing() {
        let t0 = Instant::now();
        // Ctrl-C, and the handler calls MPI_Abort: the user's wish, not a restart.
        let mut policy = restarts(1, Duration::ZERO);
        policy.on(Event::Signal(Signal::SIGINT), now(t0));
        let abort = Cause::Aborted { rank: Gid(0), pid: 100, code: 7, msg: String::new() };
        policy.on(Event::Failed(abort), now(t0 + GRACE / 2));
        assert_eq!(policy.on(Event::Settled, now(t0)), []);
        assert_eq!(policy.first().map(Cause::exit_code), Some(7));
        // A proxy that had not come up, lost in the teardown for a restart: it goes on.
        let mut policy = restarts(1, Duration::ZERO);
        policy.on(failed(1, ExitOutcome::Exited(3)), now(t0));
        let late = Cause::LostProxy { host: "n2".into(), reason: "srun".into(), came_up: false };
        assert_eq!(policy.on(Event::Failed(late), now(t0)), []);
        let restart =
            Action::Restart { attempt: 1, after: Duration::ZERO, lost: vec!["n2".into()] };
        assert_eq!(policy.on(Event::Settled, now(t0)), [restart]);
        assert!(matches!(policy.past(), [Cause::RankFailed { rank: Gid(1), .. }]));
    }
}
