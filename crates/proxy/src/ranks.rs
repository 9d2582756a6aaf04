//! The node's ranks, and the one place where a rank's end is judged.
//!
//! A rank's end is known from two events that come in either order: its reap (SIGCHLD) and
//! the end of its PMI connection. A rank that dies closes its socket a moment before it is
//! reaped; a rank that closed PMI early and then exited 0 has failed all the same
//! (docs/pmi.md, *Who answers what*). Each rank is judged once:
//!
//! ```text
//!             reaped(failure) ──────────────────────────────────► Judged ──► RankExited
//!  Running ── reaped(exit 0) ─► Reaped ── pmi_closed(clean) ───► Judged ──► RankExited
//!     │                          (PMI open)                         ▲
//!     └── pmi_closed ──► Closed ───────── reaped(outcome) ──────────┘
//! ```
//!
//! - A failure (a non-zero exit, a signal) is judged at its reap: a leftover child of the
//!   rank may hold its PMI socket open for ever, and the failure must end the job now.
//! - An exit of 0 waits for the connection to close, to know whether it was finalized.
//! - A connection that ends before finalize while its rank lives on (not exiting) is a
//!   protocol fault, reported at once, as any other: the rank's peers would wait for it in
//!   their next fence for ever. A rank that is exiting is judged at its reap, so that a crash
//!   is named as the crash it is.
//! - A rank without a connection to wait for (`--pmi-port` and not connected, or never
//!   started) is judged at its reap.
//!
//! Pure: no I/O; the dispatcher reads whether a rank is exiting, and sends what it returns.

use rlaunch_protocol::ids::Gid;
use std::collections::HashMap;

use rlaunch_protocol::control::Up;
use rlaunch_protocol::ids::ExitOutcome;
use rlaunch_protocol::record::{RankRecord, RankUsage};
use tokio::sync::mpsc;

use crate::pmi::AnswerTx;
use crate::rank::StdinChunk;

/// Index of a rank in the node's rank table.
pub type Local = usize;

/// Where a rank's process is in its life.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RankState {
    Running,
    /// Reaped; its verdict waits for its PMI connection to close.
    Reaped(ExitOutcome),
    /// Its verdict is made (a rank that never started is judged at once).
    Judged,
}

/// Where a rank's PMI connection is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PmiState {
    /// No connection to wait for: `--pmi-port` and not connected (yet, or ever).
    Unclaimed,
    /// Being served: the verdict waits for it to close.
    Open,
    /// Closed; `clean` if after finalize, or if the rank never spoke PMI.
    Closed { clean: bool },
}

/// One rank of this node: the launched job's or a spawned job's.
pub struct Rank {
    /// Its id in every frame: the rank, for the launched job.
    pub gid: Gid,
    /// Its job: 0 for the launched one, then one per MPI_Comm_spawn.
    pub job: u32,
    /// Its process id (and process group); 0 if it never started.
    pub pid: i32,
    pub state: RankState,
    pub pmi: PmiState,
    /// Output streams not yet at end of file (and sent upstream).
    pub open_streams: u8,
    /// Answers to its PMI connection's task.
    pub answers: Option<AnswerTx>,
    /// Its stdin feeder, if it reads the launcher's stdin.
    pub stdin: Option<mpsc::UnboundedSender<StdinChunk>>,
    /// It connected to its node's PMIx server and ended without PMIx_Finalize: failed even
    /// if it exited 0, as with PMI (its peers would wait for it in their next fence).
    pub pmix_unfinalized: bool,
    /// Its times and resource use, filled in by the dispatcher as it starts and is reaped;
    /// they go up with its verdict.
    pub usage: RankUsage,
    /// What else the node saw of it (output, PMI), for the node's record.
    pub seen: RankRecord,
}

#[derive(Default)]
pub struct RankTable {
    ranks: Vec<Rank>,
    by_pid: HashMap<i32, Local>,
}

impl RankTable {
    /// A rank that started as `pid`, with both output streams open.
    pub fn add_running(&mut self, gid: Gid, job: u32, pid: i32, pmi: PmiState) -> Local {
        let local = self.ranks.len();
        self.by_pid.insert(pid, local);
        self.ranks.push(Rank {
            gid,
            job,
            pid,
            state: RankState::Running,
            pmi,
            open_streams: 2,
            answers: None,
            stdin: None,
            pmix_unfinalized: false,
            usage: RankUsage::default(),
            seen: RankRecord { rank: gid, ..Default::default() },
        });
        local
    }

    /// A rank that could not start, with the variables it would have had (for a report):
    /// judged at once.
    pub fn add_failed(
        &mut self,
        gid: Gid,
        job: u32,
        outcome: ExitOutcome,
        vars: Vec<(String, String)>,
    ) -> Up {
        self.ranks.push(Rank {
            gid,
            job,
            pid: 0,
            state: RankState::Judged,
            pmi: PmiState::Unclaimed,
            open_streams: 0,
            answers: None,
            stdin: None,
            pmix_unfinalized: false,
            usage: RankUsage::default(),
            seen: RankRecord { rank: gid, vars, ..Default::default() },
        });
        let usage = RankUsage::default();
        Up::RankExited { rank: gid, pid: 0, outcome, unfinalized: false, usage }
    }

    pub fn get(&self, local: Local) -> &Rank {
        &self.ranks[local]
    }

    pub fn get_mut(&mut self, local: Local) -> &mut Rank {
        &mut self.ranks[local]
    }

    pub fn iter(&self) -> impl Iterator<Item = &Rank> {
        self.ranks.iter()
    }

    pub fn iter_mut(&mut self) -> impl Iterator<Item = &mut Rank> {
        self.ranks.iter_mut()
    }

    /// The rank with this id in frames.
    pub fn find(&self, gid: Gid) -> Option<&Rank> {
        self.ranks.iter().find(|r| r.gid == gid)
    }

    pub fn by_pid(&self, pid: i32) -> Option<Local> {
        self.by_pid.get(&pid).copied()
    }

    /// The ranks still running, with their pids.
    pub fn running(&self) -> impl Iterator<Item = (Local, i32)> + '_ {
        let running = self.ranks.iter().enumerate().filter(|(_, r)| r.state == RankState::Running);
        running.map(|(local, r)| (local, r.pid))
    }

    /// A rank that did not end is no longer waited for: neither its end nor its output.
    pub fn abandon(&mut self, local: Local) {
        let rank = &mut self.ranks[local];
        self.by_pid.remove(&rank.pid);
        rank.state = RankState::Judged;
        rank.open_streams = 0;
    }

    /// Process groups of the ranks still running.
    pub fn running_pids(&self) -> impl Iterator<Item = i32> + '_ {
        self.ranks.iter().filter(|r| r.state == RankState::Running).map(|r| r.pid)
    }

    /// The rank was reaped. Returns its verdict, unless it exited 0 with its PMI connection
    /// still open.
    pub fn reaped(&mut self, local: Local, outcome: ExitOutcome) -> Option<Up> {
        let rank = &mut self.ranks[local];
        if rank.state != RankState::Running {
            tracing::warn!(rank = %rank.gid, "reaped twice");
            return None;
        }
        // Nothing more can be written to it.
        if let Some(tx) = rank.stdin.take() {
            let _ = tx.send(StdinChunk::Eof);
        }
        rank.state = RankState::Reaped(outcome);
        self.judge(local)
    }

    /// A `--pmi-port` connection claimed the rank: its verdict now waits for the close.
    pub fn pmi_opened(&mut self, local: Local) {
        let rank = &mut self.ranks[local];
        if rank.state == RankState::Running && rank.pmi == PmiState::Unclaimed {
            rank.pmi = PmiState::Open;
        }
    }

    /// The rank's PMI connection ended; `exiting`: its process has begun to exit. Returns
    /// its verdict if it was already reaped, or a protocol fault if it left PMI before
    /// finalize and lives on.
    pub fn pmi_closed(&mut self, local: Local, clean: bool, exiting: bool) -> Option<Up> {
        let rank = &mut self.ranks[local];
        rank.answers = None;
        if rank.state == RankState::Judged {
            // A failure judged at its reap, or a `--pmi-port` connection claimed after it.
            tracing::debug!(rank = %rank.gid, clean, "PMI connection of a judged rank closed");
            return None;
        }
        if !clean && rank.state == RankState::Running && !exiting {
            // Reported now; its exit is judged as if the connection had ended cleanly.
            rank.pmi = PmiState::Closed { clean: true };
            let what = "closed its PMI connection before calling finalize".to_string();
            return Some(Up::PmiFault { rank: rank.gid, pid: rank.pid as u32, what });
        }
        rank.pmi = PmiState::Closed { clean };
        self.judge(local)
    }

    fn judge(&mut self, local: Local) -> Option<Up> {
        let rank = &mut self.ranks[local];
        let RankState::Reaped(outcome) = rank.state else { return None };
        let unfinalized = match rank.pmi {
            PmiState::Open if outcome.is_success() => return None,
            PmiState::Open | PmiState::Unclaimed => false,
            PmiState::Closed { clean } => !clean,
        } || rank.pmix_unfinalized;
        rank.state = RankState::Judged;
        let (rank, pid, usage) = (rank.gid, rank.pid as u32, rank.usage);
        Some(Up::RankExited { rank, pid, outcome, unfinalized, usage })
    }

    /// One of the rank's output streams ended.
    pub fn stream_closed(&mut self, local: Local) {
        let rank = &mut self.ranks[local];
        rank.open_streams = rank.open_streams.saturating_sub(1);
    }

    /// No rank is running (some may wait for their PMI connection to close).
    pub fn all_reaped(&self) -> bool {
        self.running_pids().next().is_none()
    }

    /// Every rank is judged and its output is all sent.
    pub fn finished(&self) -> bool {
        self.ranks.iter().all(|r| r.state == RankState::Judged && r.open_streams == 0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const OK: ExitOutcome = ExitOutcome::Exited(0);

    fn exited(rank: Gid, pid: u32, outcome: ExitOutcome, unfinalized: bool) -> Option<Up> {
        Some(Up::RankExited { rank, pid, outcome, unfinalized, usage: RankUsage::default() })
    }

    #[test]
    fn an_exit_of_0_waits_for_the_pmi_close_in_either_order() {
        let mut table = RankTable::default();
        let a = table.add_running(Gid(0), 0, 100, PmiState::Open);
        let b = table.add_running(Gid(1), 0, 101, PmiState::Open);
        assert_eq!(table.reaped(a, OK), None);
        assert_eq!(table.pmi_closed(a, true, true), exited(Gid(0), 100, OK, false));
        // A dying rank's socket ends a moment before its reap.
        assert_eq!(table.pmi_closed(b, true, true), None);
        assert_eq!(table.reaped(b, OK), exited(Gid(1), 101, OK, false));
        assert!(table.all_reaped());
        assert!(!table.finished(), "output streams are still open");
        for local in [a, a, b, b] {
            table.stream_closed(local);
        }
        assert!(table.finished());
    }

    #[test]
    fn a_failure_is_judged_at_its_reap_whatever_holds_its_socket() {
        let mut table = RankTable::default();
        let a = table.add_running(Gid(2), 0, 100, PmiState::Open);
        let crash = ExitOutcome::Signaled(11);
        assert_eq!(table.reaped(a, crash), exited(Gid(2), 100, crash, false));
        // The socket closes later (a leftover child held it): nothing more.
        assert_eq!(table.pmi_closed(a, false, true), None);
        // A crash that closed the socket first is still named as the crash.
        let b = table.add_running(Gid(3), 0, 101, PmiState::Open);
        assert_eq!(table.pmi_closed(b, false, true), None);
        assert_eq!(table.reaped(b, crash), exited(Gid(3), 101, crash, true));
    }

    #[test]
    fn closing_pmi_before_finalize_fails_the_rank() {
        let mut table = RankTable::default();
        // While exiting: judged at the reap, even with an exit of 0.
        let a = table.add_running(Gid(3), 0, 100, PmiState::Open);
        assert_eq!(table.pmi_closed(a, false, true), None);
        assert_eq!(table.reaped(a, OK), exited(Gid(3), 100, OK, true));
        assert_eq!(table.pmi_closed(a, false, true), None, "judged once");
        // Alive: a protocol fault at once, and its exit is judged on its own later.
        let b = table.add_running(Gid(4), 0, 101, PmiState::Open);
        let what = "closed its PMI connection before calling finalize".to_string();
        assert_eq!(
            table.pmi_closed(b, false, false),
            Some(Up::PmiFault { rank: Gid(4), pid: 101, what })
        );
        assert_eq!(table.reaped(b, OK), exited(Gid(4), 101, OK, false));
    }

    #[test]
    fn without_a_connection_the_reap_decides() {
        let mut table = RankTable::default();
        let a = table.add_running(Gid(0), 0, 100, PmiState::Unclaimed);
        assert_eq!(table.by_pid(100), Some(a));
        assert_eq!(table.running_pids().collect::<Vec<_>>(), [100]);
        assert_eq!(table.reaped(a, OK), exited(Gid(0), 100, OK, false));
        assert_eq!(table.reaped(a, OK), None, "reaped twice is ignored");
        // A --pmi-port connection that claims its rank makes the verdict wait for it.
        let b = table.add_running(Gid(1), 0, 101, PmiState::Unclaimed);
        table.pmi_opened(b);
        assert_eq!(table.reaped(b, OK), None);
        assert_eq!(table.pmi_closed(b, false, true), exited(Gid(1), 101, OK, true));
    }

    #[test]
    fn a_rank_that_never_started_is_judged_at_once() {
        let mut table = RankTable::default();
        let failed = ExitOutcome::SpawnFailed { errno: 2 };
        assert_eq!(
            Some(table.add_failed(Gid(5), 0, failed, Vec::new())),
            exited(Gid(5), 0, failed, false)
        );
        assert!(table.all_reaped() && table.finished());
        assert_eq!(table.find(Gid(5)).map(|r| r.state), Some(RankState::Judged));
    }
}
