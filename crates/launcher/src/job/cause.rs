//! Why a job ends early, what rlaunch says about it, and the exit status it comes to. The
//! first cause recorded decides; every status here is one of [`crate::exit`]'s.

use rlaunch_protocol::ids::Gid;
use std::time::Duration;

use rlaunch_protocol::ids::ExitOutcome;

use rlaunch_protocol::control::PMIX_FENCE_MAX as MAX_DATA;

use super::pmix_fence::TooLarge;
use super::roll::Roll;
use crate::exit;
use crate::output::FileFailure;

/// Why the job ended early, in the order things happened.
#[derive(Debug, Clone)]
pub(crate) enum Cause {
    RankFailed {
        rank: Gid,
        pid: u32,
        how: RankFailure,
    },
    TimedOut(Duration),
    /// A second Ctrl-C.
    Interrupted,
    /// Ranks failed after rlaunch forwarded them this signal (their ends were its doing).
    Forwarded(nix::sys::signal::Signal),
    LostProxy {
        host: String,
        reason: String,
        /// Its proxy had said hello (a node lost while up, not one that never came up).
        came_up: bool,
    },
    /// A node's ranks do not fit on it as asked (`--gpus-per-rank`, `ppr:N:socket`).
    Unplaceable {
        host: String,
        why: String,
    },
    /// Node `host` could not write the `--bcast` files (`None`: rlaunch could not read
    /// them any more).
    Bcast {
        host: Option<String>,
        why: String,
    },
    StdoutClosed,
    Aborted {
        rank: Gid,
        pid: u32,
        code: i32,
        msg: String,
    },
    /// A rank broke the PMI protocol; `what` says how.
    PmiFault {
        rank: Gid,
        pid: u32,
        what: String,
    },
    OutputFile(FileFailure),
    /// A rank served no PMIx started Open MPI alone, as a singleton.
    Singleton {
        rank: Gid,
        pid: u32,
    },
    /// A rank asked to spawn more processes than can be laid out.
    SpawnTooLarge {
        rank: Gid,
        asked: u64,
    },
    /// A PMIx fence gathered more data than a node's PMIx server takes.
    PmixFenceTooLarge(TooLarge),
    /// A worker reported an error to the rabit tracker (`--tracker rabit`).
    TrackerError {
        rank: Gid,
        msg: String,
    },
    /// A rank ended before it connected to the rabit tracker, while workers that did wait for
    /// every one (`--tracker rabit`).
    TrackerAbsent {
        rank: Gid,
    },
}

/// How a rank failed.
#[derive(Debug, Clone, Copy)]
pub(crate) enum RankFailure {
    /// A non-zero exit, a signal, a failed start.
    Ended(ExitOutcome),
    /// It exited with 0, but its PMI connection closed before finalize (docs/pmi.md, *Who answers what*).
    Unfinalized,
}

/// The one judgement of a rank's end at the root: a failure, or `None` for a clean end. A
/// crash is the story, not the PMI connection it closed on the way.
pub(crate) fn rank_end(
    rank: Gid,
    pid: u32,
    outcome: ExitOutcome,
    unfinalized: bool,
) -> Option<Cause> {
    let how = if !outcome.is_success() {
        RankFailure::Ended(outcome)
    } else if unfinalized {
        RankFailure::Unfinalized
    } else {
        return None;
    };
    Some(Cause::RankFailed { rank, pid, how })
}

impl Cause {
    /// Whether a new attempt of the job may not meet this again (`--max-restarts`): a rank
    /// that failed, aborted or broke PMI, a node lost once it was up, a worker's error. Not
    /// what the user or the job's limits ended (a signal, the timeout, a closed stdout, an
    /// output file), nor what would fail the same way again (a program that could not start,
    /// a host that never came up, a layout that does not fit, a singleton, a spawn or fence
    /// too large).
    pub(crate) fn restartable(&self) -> bool {
        match self {
            Cause::RankFailed { how: RankFailure::Ended(outcome), .. } => {
                !matches!(outcome, ExitOutcome::SpawnFailed { .. } | ExitOutcome::NoWorkdir { .. })
            }
            Cause::LostProxy { came_up, .. } => *came_up,
            Cause::RankFailed { how: RankFailure::Unfinalized, .. }
            | Cause::Aborted { .. }
            | Cause::PmiFault { .. }
            | Cause::TrackerError { .. }
            | Cause::TrackerAbsent { .. } => true,
            Cause::TimedOut(_)
            | Cause::Interrupted
            | Cause::Forwarded(_)
            | Cause::Unplaceable { .. }
            | Cause::Bcast { .. }
            | Cause::StdoutClosed
            | Cause::OutputFile(_)
            | Cause::Singleton { .. }
            | Cause::SpawnTooLarge { .. }
            | Cause::PmixFenceTooLarge(_) => false,
        }
    }

    /// Whether this ends the job even while it is torn down to start again: the user's
    /// wish or the job's limits, not what the teardown itself brings about.
    pub(crate) fn calls_off_restart(&self) -> bool {
        matches!(
            self,
            Cause::TimedOut(_)
                | Cause::Interrupted
                | Cause::Forwarded(_)
                | Cause::StdoutClosed
                | Cause::OutputFile(_)
        )
    }

    /// rlaunch's exit status when this cause decides it.
    pub(crate) fn exit_code(&self) -> i32 {
        match self {
            Cause::RankFailed { how: RankFailure::Ended(outcome), .. } => {
                exit::of_outcome(*outcome)
            }
            Cause::RankFailed { how: RankFailure::Unfinalized, .. } => exit::FAILURE,
            Cause::TimedOut(_) => exit::TIMED_OUT,
            Cause::Interrupted => exit::INTERRUPTED,
            Cause::Forwarded(sig) => exit::SIGNALED + *sig as i32,
            Cause::StdoutClosed => exit::STDOUT_CLOSED,
            // MPI_Abort(comm, 0) still ends the job as a failure.
            Cause::Aborted { code: 0, .. } => 1,
            Cause::Aborted { code, .. } => *code,
            Cause::LostProxy { .. }
            | Cause::Unplaceable { .. }
            | Cause::Bcast { .. }
            | Cause::PmiFault { .. }
            | Cause::Singleton { .. }
            | Cause::OutputFile(_)
            | Cause::SpawnTooLarge { .. }
            | Cause::TrackerError { .. }
            | Cause::TrackerAbsent { .. }
            | Cause::PmixFenceTooLarge(_) => exit::FAILURE,
        }
    }

    /// The line rlaunch prints about this cause (without "rlaunch: "), if any. `listed`:
    /// every rank's outcome was printed already (`--print-all-exit-codes`).
    pub(crate) fn message(&self, roll: &Roll, listed: bool) -> Option<String> {
        let rank_said = |rank: Gid, pid: u32, what: &str| {
            format!("{} (pid {pid} on {}) {what}", roll.name(rank), roll.host(rank))
        };
        match self {
            Cause::RankFailed { rank, pid, how: RankFailure::Ended(outcome) } => {
                (!listed).then(|| roll.describe(*rank, *pid, *outcome))
            }
            Cause::RankFailed { rank, pid, how: RankFailure::Unfinalized } => {
                Some(rank_said(*rank, *pid, "closed its PMI connection before calling finalize"))
            }
            Cause::TimedOut(after) => {
                Some(format!("the job timed out after {} s and was killed", after.as_secs_f64()))
            }
            // Said when it happened.
            Cause::Interrupted | Cause::StdoutClosed => None,
            Cause::Forwarded(sig) => Some(format!("interrupted by {sig}")),
            Cause::LostProxy { host, reason, .. } => {
                Some(format!("lost proxy on {host} ({reason})"))
            }
            Cause::Unplaceable { host, why } => {
                Some(format!("cannot place the ranks on {host}: {why}"))
            }
            Cause::Bcast { host: Some(host), why } => {
                Some(format!("--bcast: {host} cannot have the files: {why}"))
            }
            Cause::Bcast { host: None, why } => Some(format!("--bcast: {why}")),
            Cause::Aborted { rank, pid, code, msg } => {
                let msg = if msg.is_empty() { String::new() } else { format!(": {msg}") };
                Some(rank_said(*rank, *pid, &format!("aborted the job with exit code {code}{msg}")))
            }
            Cause::PmiFault { rank, pid, what } => Some(rank_said(*rank, *pid, what)),
            Cause::Singleton { rank, pid } => {
                let get = match rlaunch_proxy::pmix::version() {
                    Some(_) => "which it was not served (run with --pmi pmix)".to_string(),
                    None => format!(
                        "which this rlaunch was built without; {}",
                        rlaunch_proxy::pmix::GET_PMIX
                    ),
                };
                let what = format!(
                    "started Open MPI as a singleton, which would compute alone: it needs PMIx, \
                     {get}"
                );
                Some(rank_said(*rank, *pid, &what))
            }
            Cause::OutputFile(failure) => Some(failure.to_string()),
            Cause::SpawnTooLarge { rank, asked } => Some(format!(
                "{} on {} asked to spawn {asked} processes, more than a node can run",
                roll.name(*rank),
                roll.host(*rank)
            )),
            Cause::TrackerError { rank, msg } => {
                let said = msg.lines().next().map(str::trim).unwrap_or("");
                let said = match said {
                    "" => String::new(),
                    said => format!(": {}", crate::quote::cut(said)),
                };
                let (who, host) = (roll.name(*rank), roll.host(*rank));
                Some(format!("{who} on {host} reported an error to the rabit tracker{said}"))
            }
            Cause::TrackerAbsent { rank } => {
                let ended = match roll.outcome(*rank) {
                    Some((pid, outcome)) => roll.describe(*rank, pid, outcome),
                    None => format!("{} on {} ended", roll.name(*rank), roll.host(*rank)),
                };
                Some(format!(
                    "{ended} before it connected to the rabit tracker: the workers that did \
                     would wait for it for ever"
                ))
            }
            Cause::PmixFenceTooLarge(TooLarge { epoch, bytes }) => Some(format!(
                "PMIx fence {} of the job gathered {} MiB of data, more than the {} MiB a \
                 node's PMIx server takes",
                epoch + 1,
                bytes.div_ceil(1 << 20),
                MAX_DATA >> 20
            )),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_rank_end_is_a_failure_if_it_exited_badly_or_left_pmi_early() {
        assert!(rank_end(Gid(0), 1, ExitOutcome::Exited(0), false).is_none());
        let crash = rank_end(Gid(0), 1, ExitOutcome::Signaled(11), true).unwrap();
        assert_eq!(crash.exit_code(), 139);
        assert_eq!(rank_end(Gid(0), 1, ExitOutcome::Exited(0), true).unwrap().exit_code(), 255);
        let missing = rank_end(Gid(0), 0, ExitOutcome::SpawnFailed { errno: 2 }, false).unwrap();
        assert_eq!(missing.exit_code(), 127);
    }

    #[test]
    fn every_cause_has_its_documented_status() {
        let abort = |code| Cause::Aborted { rank: Gid(0), pid: 1, code, msg: String::new() };
        assert_eq!(abort(0).exit_code(), 1);
        assert_eq!(abort(7).exit_code(), 7);
        assert_eq!(Cause::TimedOut(Duration::from_secs(1)).exit_code(), 124);
        assert_eq!(Cause::Interrupted.exit_code(), 130);
        assert_eq!(Cause::Forwarded(nix::sys::signal::Signal::SIGINT).exit_code(), 130);
        assert_eq!(Cause::Forwarded(nix::sys::signal::Signal::SIGTERM).exit_code(), 143);
        assert_eq!(Cause::StdoutClosed.exit_code(), 141);
        let lost = Cause::LostProxy { host: "n1".into(), reason: "gone".into(), came_up: true };
        assert_eq!(lost.exit_code(), 255);
        let fault = Cause::PmiFault { rank: Gid(0), pid: 1, what: "x".into() };
        assert_eq!(fault.exit_code(), 255);
        let fence = Cause::PmixFenceTooLarge(TooLarge { epoch: 0, bytes: 1 << 31 });
        assert_eq!(fence.exit_code(), 255);
        let tracker = Cause::TrackerError { rank: Gid(1), msg: "no data".into() };
        assert_eq!(tracker.exit_code(), 255);
    }
}
