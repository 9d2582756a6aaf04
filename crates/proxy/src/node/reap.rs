//! A process of this node ended: a rank (its verdict, once, with what it wrote in its error
//! file first) or a child proxy (lost, unless it said it was done).

use rlaunch_protocol::control::Up;
use rlaunch_protocol::ids::ExitOutcome;
use rlaunch_protocol::record;
use rlaunch_tree::procs;

use std::time::Duration;

use tokio::time::Instant;

use super::Node;
use crate::ranks::Local;

/// How long a rank's failure waits at most for the PMIx server, or another rank here that is
/// dying (see [`Node::rank_reaped`]). A dying process is reaped within milliseconds on an idle machine,
/// but one freeing gigabytes, or starved on a loaded one, takes longer; only a process stuck
/// in the kernel takes for ever, and the failure must not wait for that one.
const DEFERRED_WAIT: Duration = Duration::from_secs(2);

impl Node {
    /// The processes one reaping pass found ended, in the order they died (see
    /// [`rlaunch_tree::deaths`]): the first failure may be the cause of those after it, and
    /// the first failure is the job's culprit.
    pub(super) fn processes_ended(&mut self, mut ends: Vec<procs::Ended>) {
        self.deaths.sort(&mut ends);
        self.reaping = ends.iter().map(|e| e.pid).collect();
        for end in ends {
            self.process_ended(end);
        }
        self.reaping.clear();
    }

    /// A process of this node ended: a rank, or a child proxy.
    pub(super) fn process_ended(&mut self, ended: procs::Ended) {
        let (pid, outcome) = (ended.pid, ended.outcome);
        if let Some(local) = self.ranks.by_pid(pid) {
            let usage = &mut self.ranks.get_mut(local).usage;
            usage.ended = record::now_us();
            usage.user_us = ended.user_us;
            usage.system_us = ended.system_us;
            usage.maxrss_kib = ended.maxrss_kib;
            self.rank_reaped(local, outcome);
            self.judge_deferred(false);
        } else if let Some(lost) = self.children.reaped(pid, outcome) {
            self.report_lost(lost);
        }
        self.dmodex_unanswerable();
        self.sweep_if_all_reaped();
    }

    /// Once every rank has ended, whatever they left behind (a daemonized grandchild holding
    /// a pipe or its PMI socket open) goes, so that their output and PMI reach end of file.
    pub(super) fn sweep_if_all_reaped(&mut self) {
        if self.swept || self.holding_ranks() || !self.ranks.all_reaped() {
            return;
        }
        self.swept = true;
        // The PMIx server has no one left to serve: it goes first, on purpose.
        self.drop_pmix();
        self.kill_leftovers(&self.children.pids());
    }

    /// Ranks that SIGKILL has not ended by now (in uninterruptible sleep: blocked in the
    /// kernel, frozen by a cgroup) are not waited for any longer: each is said so, and the
    /// node finishes without it. It ends when the kernel lets it, its SIGKILL pending.
    pub(super) fn abandon_unkilled_ranks(&mut self) {
        // A zombie's reap is on its way (with its status): not abandoned.
        let unreaped = |&(_, pid): &(Local, i32)| {
            procs::snapshot(pid).is_none_or(|(state, _, _)| state != 'Z')
        };
        let left: Vec<(Local, i32)> = self.ranks.running().filter(unreaped).collect();
        if !left.is_empty() {
            // Their pipes would never end (they hold them), nor the link's data with them:
            // what is left of every pipe goes now, 3 s after the others' SIGKILL.
            self.outputs.drop_all();
        }
        for (local, pid) in left {
            let gid = self.ranks.get(local).gid;
            let why = match procs::snapshot(pid).map(|(state, _, _)| state) {
                Some('D') => {
                    "it is in uninterruptible sleep (D state: blocked in the kernel, or \
                              frozen)"
                }
                Some('T' | 't') => "it is stopped",
                Some(_) => "it is still running",
                None => "it is gone but was not reaped",
            };
            let secs = crate::kill::CHILD_PROXY_GRACE.as_secs();
            let text = format!(
                "rank {gid} (pid {pid}) did not end {secs} s after SIGKILL: {why}; it is left \
                 to end when the kernel lets it"
            );
            let host = self.plan.host.clone();
            let _ = self.up.control.send(Up::Notice { host, text });
            self.ranks.abandon(local);
        }
    }

    /// Kills every descendant of this process but the child proxies `spare` (and theirs), in a
    /// world where they are this node's.
    pub(super) fn kill_leftovers(&self, spare: &std::collections::HashSet<i32>) {
        if self.sweeps {
            procs::kill_descendants_but_proxies(spare, &self.proxy_exe);
        }
    }

    /// A rank of this node was reaped: judged now, unless the PMIx server holds its verdict
    /// until it has said all it heard of the rank. Where a PMIx server serves the ranks, the
    /// first failure judged must be the cause of those after it: libpmix answers a fence
    /// PARTIAL SUCCESS the moment a member's connection drops, and the others exit 1 (the
    /// job's culprit is the first failure to reach rlaunch). So a failure waits, up to
    /// [`DEFERRED_WAIT`], for the server to catch up (a `Sync`: every lost connection it
    /// reported before is known then), and for any rank that may have died before it and is
    /// not judged: one exiting, not reaped, or reaped with its verdict held by the server.
    /// Then the failures go in the order the server lost their connections, and those it did
    /// not lose (never connected, or finalized) in the order they died. Found by the chaos
    /// runner's PMIx ranks: a rank's SIGSEGV reported after the exit 1 it caused; a rank's
    /// exit 3 after the exit 1 of a rank reaped in the same pass; a rank that left PMIx, whose
    /// last thread waited for a CPU between closing its socket and becoming a zombie, judged
    /// after the survivor's exit 1 it caused.
    pub(super) fn rank_reaped(&mut self, local: Local, outcome: ExitOutcome) {
        let gid = self.ranks.get(local).gid;
        tracing::debug!(%gid, %outcome, "rank reaped");
        // Only where a PMIx server serves the ranks, and not in a teardown (every rank dies).
        if self.pmix.serving() && !self.kill.started() && !outcome.is_success() {
            tracing::debug!(%gid, "its failure waits for the ranks that may have caused it");
            self.deferred.push((local, outcome));
            self.deferred_until.get_or_insert(Instant::now() + DEFERRED_WAIT);
            self.pmix.sync_deferral();
            return;
        }
        if self.pmix_holds_verdict(local, outcome) {
            tracing::debug!(%gid, "its verdict waits for the PMIx server to catch up");
        } else {
            self.judge_reaped(local, outcome);
        }
    }

    /// The failures that waited are judged once the server caught up and no rank that may
    /// have died before them is left (or, `due`, their wait is over): in the order the
    /// server lost their connections, then in the order they died.
    pub(super) fn judge_deferred(&mut self, due: bool) {
        if self.deferred.is_empty() {
            return;
        }
        let mut deferred = std::mem::take(&mut self.deferred);
        // Stable: those never lost keep the order they died in.
        deferred.sort_by_key(|&(local, _)| {
            self.pmix.lost_order(self.ranks.get(local).gid).unwrap_or(u64::MAX)
        });
        self.deferred = deferred;
        if !due && self.rank_dying(None) {
            return;
        }
        self.deferred_until = None;
        for (local, outcome) in std::mem::take(&mut self.deferred) {
            self.judge_reaped(local, outcome);
        }
        self.sweep_if_all_reaped();
    }

    /// Whether a rank here may have died before rank `of` (or, `None`, before the first
    /// failure waiting) and is not judged yet: it has begun to exit and is not reaped (nor
    /// known to have died after), or was reaped with its verdict held by the PMIx server.
    /// The ranks of the reaping pass being judged are in order already.
    fn rank_dying(&mut self, of: Option<Local>) -> bool {
        if self.pmix.catching_up() {
            return true;
        }
        let of = of.or(self.deferred.first().map(|d| d.0));
        let waiting =
            |local: Local| of == Some(local) || self.deferred.iter().any(|d| d.0 == local);
        let others: Vec<i32> = self
            .ranks
            .running()
            .filter(|&(local, pid)| !waiting(local) && pid > 0 && !self.reaping.contains(&pid))
            .map(|(_, pid)| pid)
            .collect();
        let of_pid = of.map(|local| self.ranks.get(local).pid);
        others.into_iter().any(|pid| {
            let after = of_pid.is_some_and(|of_pid| self.deaths.died_after(pid, of_pid));
            !after && procs::is_exiting(pid)
        })
    }

    /// Rank `local`'s verdict, sent up once.
    pub(super) fn judge_reaped(&mut self, local: Local, outcome: ExitOutcome) {
        let gid = self.ranks.get(local).gid;
        if self.pmix.serving() {
            let left = self.pmix.left_unfinalized(gid);
            self.ranks.get_mut(local).pmix_unfinalized = left && outcome.is_success();
        }
        // Why it failed, in its own words, ahead of its verdict.
        let report = self.error_dir.as_deref().filter(|_| !outcome.is_success());
        let jobid = self.jobs.get(&self.ranks.get(local).job).map(|j| j.pmi.kvsname.clone());
        let read = |dir| crate::rank::error_report(dir, jobid.as_deref()?, gid);
        if let Some(report) = report.and_then(read) {
            let _ = self.up.control.send(Up::RankError { rank: gid, report });
        }
        if let Some(verdict) = self.ranks.reaped(local, outcome) {
            self.send_end(verdict);
        }
        self.dmodex_rank_ended(gid);
    }
}
