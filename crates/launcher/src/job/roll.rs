//! Every process of the run, by global id: the launched job's ranks, then each spawned job's.
//! It names them in messages ("rank 3", "rank 1 of spawned job 2"), places them on their
//! host, and holds each one's outcome.

use rlaunch_protocol::control::{NodePlan, SpawnRequest};
use rlaunch_protocol::ids::ExitOutcome;
use rlaunch_protocol::ids::{Gid, NodeId};
use rlaunch_protocol::record::RankUsage;

/// One process of the run.
struct Proc {
    job: u32,
    /// Rank within its job.
    rank: u32,
    node: NodeId,
    exe: String,
    /// Its MPMD segment (for the launched job).
    segment: u32,
    /// Its pid and how it ended, once reported.
    outcome: Option<(u32, ExitOutcome)>,
    /// Its times and resource use, as its proxy reported them (on the proxy's clock).
    usage: RankUsage,
    /// It ended after the teardown began, by the signal that ends what still runs.
    torn_down: bool,
    /// It ended with its node's lost proxy, the job going on (`--on-failure continue`): no
    /// end of it was reported.
    gone: bool,
    /// Why it failed, as it wrote it in its error file (`TORCHELASTIC_ERROR_FILE`).
    error: Option<RankError>,
}

/// What a failed rank wrote in its error file: torch's `@record` writes the exception and
/// its traceback, `{"message": {"message": "ValueError: ...", "extraInfo": {"py_callstack":
/// "Traceback ..."}}}` (or a plain string for `message`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct RankError {
    pub message: String,
    pub traceback: Option<String>,
}

impl RankError {
    /// The error in `report`, or `None` if it holds none rlaunch can read.
    pub(crate) fn parse(report: &[u8]) -> Option<RankError> {
        let json: serde_json::Value = serde_json::from_slice(report).ok()?;
        let text = |v: &serde_json::Value| v.as_str().map(str::to_string);
        match &json["message"] {
            serde_json::Value::String(message) => {
                Some(RankError { message: message.clone(), traceback: None })
            }
            inner => Some(RankError {
                message: text(&inner["message"])?,
                traceback: text(&inner["extraInfo"]["py_callstack"]),
            }),
        }
    }
}

/// One process of the run as the report shows it.
pub(crate) struct Entry<'a> {
    pub gid: Gid,
    pub job: u32,
    pub rank: u32,
    pub node: NodeId,
    pub host: &'a str,
    pub segment: u32,
    pub outcome: Option<(u32, ExitOutcome)>,
    pub usage: RankUsage,
    pub error: Option<&'a RankError>,
}

pub(crate) struct Roll {
    procs: Vec<Proc>,
    /// Jobs so far (the launched one is 0).
    jobs: u32,
    /// Host name of each node, by node index.
    node_hosts: Vec<String>,
    /// Working directory of each segment of the launched job.
    wdirs: Vec<Vec<u8>>,
    /// How many processes have ended.
    ends: usize,
}

impl Roll {
    /// The launched job's ranks, as `roots` place them.
    pub(crate) fn new(
        job: &rlaunch_protocol::control::Job,
        roots: &[NodePlan],
        node_hosts: Vec<String>,
    ) -> Roll {
        let mut procs: Vec<Option<Proc>> = (0..job.size).map(|_| None).collect();
        for node in roots.iter().flat_map(|root| root.walk()) {
            for r in &node.ranks {
                let exe = String::from_utf8_lossy(&job.segments[r.segment as usize].exe);
                procs[r.rank as usize] = Some(Proc {
                    job: 0,
                    rank: r.rank,
                    node: node.index,
                    exe: exe.into_owned(),
                    segment: r.segment,
                    outcome: None,
                    usage: RankUsage::default(),
                    torn_down: false,
                    gone: false,
                    error: None,
                });
            }
        }
        Roll {
            procs: procs.into_iter().map(|p| p.expect("placement covers every rank")).collect(),
            jobs: 1,
            node_hosts,
            wdirs: job.segments.iter().map(|s| s.wdir.clone()).collect(),
            ends: 0,
        }
    }

    pub(crate) fn len(&self) -> u32 {
        self.procs.len() as u32
    }

    pub(crate) fn contains(&self, gid: Gid) -> bool {
        (gid.index()) < self.procs.len()
    }

    /// The node of process `gid`, if there is one.
    pub(crate) fn node(&self, gid: Gid) -> Option<NodeId> {
        self.procs.get(gid.index()).map(|p| p.node)
    }

    pub(crate) fn node_host(&self, node: NodeId) -> &str {
        &self.node_hosts[node.index()]
    }

    /// How many nodes the run has had: the plan's, then those started for spawns.
    pub(crate) fn node_count(&self) -> u32 {
        self.node_hosts.len() as u32
    }

    /// A node started during the run, on `host`; returns its index.
    pub(crate) fn add_node(&mut self, host: &str) -> NodeId {
        self.node_hosts.push(host.to_string());
        NodeId(self.node_hosts.len() as u32 - 1)
    }

    /// Node `node` runs a process that has not ended: its proxy is there for a while yet.
    pub(crate) fn node_busy(&self, node: NodeId) -> bool {
        self.procs.iter().any(|p| p.node == node && p.outcome.is_none() && !p.gone)
    }

    /// Adds a job of `request`'s processes, process r on node `nodes[r]`; returns its index
    /// and its first process's global id.
    pub(crate) fn add_spawned(&mut self, nodes: &[NodeId], request: &SpawnRequest) -> (u32, u32) {
        let job = self.jobs;
        self.jobs += 1;
        let first = self.len();
        let exes = request.cmds.iter().flat_map(|c| std::iter::repeat_n(&c.exe, c.nprocs as usize));
        for (rank, (exe, &node)) in exes.zip(nodes).enumerate() {
            self.procs.push(Proc {
                job,
                rank: rank as u32,
                node,
                exe: exe.clone(),
                segment: 0,
                outcome: None,
                usage: RankUsage::default(),
                torn_down: false,
                gone: false,
                error: None,
            });
        }
        (job, first)
    }

    /// Process `gid` wrote why it failed in its error file.
    pub(crate) fn set_error(&mut self, gid: Gid, report: &[u8]) {
        match (self.procs.get_mut(gid.index()), RankError::parse(report)) {
            (Some(p), Some(error)) => p.error = Some(error),
            (Some(_), None) => tracing::debug!(%gid, "an error file rlaunch cannot read"),
            (None, _) => tracing::warn!(%gid, "an error report of an unknown rank"),
        }
    }

    /// Rank `rank` of the launched job ended with its lost node.
    pub(crate) fn gone(&self, rank: u32) -> bool {
        self.procs.get(rank as usize).is_some_and(|p| p.gone)
    }

    /// Process `gid` has ended (its end is recorded).
    pub(crate) fn ended(&self, gid: Gid) -> bool {
        self.procs.get(gid.index()).is_some_and(|p| p.outcome.is_some() || p.gone)
    }

    /// The processes on `nodes` not ended yet ended with their lost node: returned, and
    /// counted as ended from now on.
    pub(crate) fn gone_with(&mut self, nodes: &std::collections::HashSet<NodeId>) -> Vec<Gid> {
        let mut gone = Vec::new();
        for (index, p) in self.procs.iter_mut().enumerate() {
            if nodes.contains(&p.node) && p.outcome.is_none() && !p.gone {
                p.gone = true;
                self.ends += 1;
                gone.push(Gid(index as u32));
            }
        }
        gone
    }

    /// Every process of the run has ended, spawned ones included.
    pub(crate) fn all_ended(&self) -> bool {
        self.ends == self.procs.len()
    }

    /// Records how process `gid` ended, and what it used; `tearing_down`: the job's teardown
    /// had begun. False if there is no such process.
    pub(crate) fn record(
        &mut self,
        gid: Gid,
        pid: u32,
        outcome: ExitOutcome,
        usage: RankUsage,
        tearing_down: bool,
    ) -> bool {
        match self.procs.get_mut(gid.index()) {
            Some(p) => {
                self.ends += usize::from(p.outcome.is_none() && !p.gone);
                p.outcome = Some((pid, outcome));
                p.usage = usage;
                let teardown_signal = [nix::libc::SIGTERM, nix::libc::SIGKILL]
                    .map(ExitOutcome::Signaled)
                    .contains(&outcome);
                p.torn_down = tearing_down && teardown_signal;
                true
            }
            None => false,
        }
    }

    /// Every process, in global id order.
    pub(crate) fn entries(&self) -> impl Iterator<Item = Entry<'_>> {
        self.procs.iter().enumerate().map(|(gid, p)| Entry {
            gid: Gid(gid as u32),
            job: p.job,
            rank: p.rank,
            node: p.node,
            host: self.node_host(p.node),
            segment: p.segment,
            outcome: p.outcome,
            usage: p.usage,
            error: p.error.as_ref(),
        })
    }

    /// The processes that ran and ended badly on their own (not ended by the teardown), and
    /// how many the teardown ended. A process that could not start is left out: that is bad
    /// input, which the culprit line names once for all.
    pub(crate) fn failures(&self) -> (Vec<Gid>, usize) {
        let mut own = Vec::new();
        let mut torn_down = 0;
        for (gid, p) in self.procs.iter().enumerate() {
            match p.outcome {
                Some((_, outcome)) if outcome.is_success() => {}
                Some((_, ExitOutcome::SpawnFailed { .. } | ExitOutcome::NoWorkdir { .. })) => {}
                Some(_) if p.torn_down => torn_down += 1,
                Some(_) => own.push(Gid(gid as u32)),
                None => {}
            }
        }
        (own, torn_down)
    }

    pub(crate) fn host(&self, gid: Gid) -> &str {
        self.node_host(self.procs[gid.index()].node)
    }

    /// Its pid and how it ended, once reported.
    pub(crate) fn outcome(&self, gid: Gid) -> Option<(u32, ExitOutcome)> {
        self.procs.get(gid.index()).and_then(|p| p.outcome)
    }

    /// "3" for the launched job, "1 of job 2" for others: for a column of ranks.
    pub(crate) fn short_name(&self, gid: Gid) -> String {
        match &self.procs[gid.index()] {
            Proc { job: 0, rank, .. } => rank.to_string(),
            Proc { job, rank, .. } => format!("{rank} of job {job}"),
        }
    }

    /// "rank 3" for the launched job, "rank 1 of spawned job 2" for others.
    pub(crate) fn name(&self, gid: Gid) -> String {
        match &self.procs[gid.index()] {
            Proc { job: 0, rank, .. } => format!("rank {rank}"),
            Proc { job, rank, .. } => format!("rank {rank} of spawned job {job}"),
        }
    }

    /// How process `gid` ended, in one phrase: "rank 3 (pid 42 on n2) exited with code 7".
    pub(crate) fn describe(&self, gid: Gid, pid: u32, outcome: ExitOutcome) -> String {
        let host = self.host(gid);
        let p = &self.procs[gid.index()];
        match outcome {
            ExitOutcome::SpawnFailed { errno } => {
                let hint = match errno {
                    nix::libc::EMFILE | nix::libc::ENFILE => {
                        " (raise the open-file limit, ulimit -n)"
                    }
                    nix::libc::EAGAIN => " (raise the process limit, ulimit -u)",
                    _ => "",
                };
                format!("cannot start {} on {host}: {}{hint}", p.exe, strerror(errno))
            }
            ExitOutcome::NoWorkdir { errno } => {
                let dir = match p.job {
                    0 => self.wdirs[p.segment as usize].clone(),
                    _ => b"of its spawned job".to_vec(),
                };
                format!(
                    "cannot start {} on {host}: working directory {}: {}",
                    self.name(gid),
                    String::from_utf8_lossy(&dir),
                    strerror(errno)
                )
            }
            _ => {
                let why = match &p.error {
                    Some(e) => format!(": {}", cut(e.message.lines().next().unwrap_or(""))),
                    None => String::new(),
                };
                format!("{} (pid {pid} on {host}) {outcome}{why}", self.name(gid))
            }
        }
    }

    /// One line per process: how it ended, or that it did not say.
    pub(crate) fn all_outcomes(&self) -> Vec<String> {
        (0..self.len())
            .map(Gid)
            .map(|gid| match self.procs[gid.index()].outcome {
                Some((pid, outcome)) => self.describe(gid, pid, outcome),
                None => {
                    format!("{} (on {}) did not report an exit", self.name(gid), self.host(gid))
                }
            })
            .collect()
    }
}

use crate::quote::cut;

fn strerror(errno: i32) -> String {
    crate::quote::io_error(&std::io::Error::from_raw_os_error(errno))
}

#[cfg(test)]
mod tests {
    use super::*;
    use rlaunch_protocol::control::{Job, RankPlan, Segment, SpawnCmd};

    fn job() -> Job {
        let segment = |exe: &str| Segment {
            exe: exe.into(),
            args: vec![],
            inherit_env: true,
            env: vec![],
            wdir: b"/w".to_vec(),
        };
        let mut job = Job::simple("j", 3, vec![segment("./a"), segment("./b")]);
        job.kill_grace_ms = 0;
        job.forked_ranks = 0;
        job
    }

    fn node(index: u32, ranks: &[(u32, u32)], children: Vec<NodePlan>) -> NodePlan {
        NodePlan {
            index: NodeId(index),
            host: format!("n{index}"),
            fork: true,
            ranks: ranks.iter().map(|&(rank, segment)| RankPlan { rank, segment }).collect(),
            children,
        }
    }

    #[test]
    fn ranks_are_named_and_placed_spawned_ones_too() {
        let roots = [node(0, &[(0, 0)], vec![node(1, &[(1, 1), (2, 1)], vec![])])];
        let mut roll = Roll::new(&job(), &roots, vec!["n0".into(), "n1".into()]);
        assert_eq!(
            (roll.len(), roll.host(Gid(2)), roll.name(Gid(2))),
            (3, "n1", "rank 2".to_string())
        );
        let cmd =
            SpawnCmd { exe: "./c".into(), args: vec![], nprocs: 2, info: vec![], env: vec![] };
        let request = SpawnRequest { cmds: vec![cmd], preput: vec![] };
        assert_eq!(roll.add_spawned(&[NodeId(1), NodeId(1)], &request), (1, 3));
        assert!(roll.node_busy(NodeId(1)) && !roll.node_busy(NodeId(2)));
        assert_eq!(roll.name(Gid(4)), "rank 1 of spawned job 1");
        assert!(roll.contains(Gid(4)) && !roll.contains(Gid(5)));
        let used = RankUsage::default();
        assert!(roll.record(Gid(4), 77, ExitOutcome::Exited(3), used, false));
        assert!(!roll.record(Gid(9), 1, ExitOutcome::Exited(0), used, false));
        assert!(roll.record(Gid(1), 78, ExitOutcome::Signaled(nix::libc::SIGTERM), used, true));
        assert!(roll.record(Gid(2), 79, ExitOutcome::Signaled(nix::libc::SIGSEGV), used, true));
        assert_eq!(
            roll.failures(),
            (vec![Gid(2), Gid(4)], 1),
            "a crash in the teardown is its own"
        );
        let lines = roll.all_outcomes();
        assert_eq!(lines[4], "rank 1 of spawned job 1 (pid 77 on n1) exited with code 3");
        assert_eq!(lines[0], "rank 0 (on n0) did not report an exit");
        assert!(roll.record(Gid(0), 0, ExitOutcome::SpawnFailed { errno: 2 }, used, false));
        assert_eq!(
            roll.failures(),
            (vec![Gid(2), Gid(4)], 1),
            "a rank that never ran is not tabled"
        );
    }

    #[test]
    fn a_rank_that_wrote_its_error_is_named_with_it() {
        let roots = [node(0, &[(0, 0), (1, 1), (2, 1)], vec![])];
        let mut roll = Roll::new(&job(), &roots, vec!["n0".into()]);
        let torch = br#"{"message": {"message": "ValueError: no\nmore", "extraInfo":
            {"py_callstack": "Traceback (most recent call last): ...", "timestamp": "1"}}}"#;
        roll.set_error(Gid(1), torch);
        roll.set_error(Gid(2), b"not json");
        let line = roll.describe(Gid(1), 42, ExitOutcome::Exited(1));
        assert_eq!(line, "rank 1 (pid 42 on n0) exited with code 1: ValueError: no");
        let plain = RankError::parse(br#"{"message": "it broke"}"#).unwrap();
        assert_eq!((plain.message.as_str(), plain.traceback), ("it broke", None));
        let entries: Vec<_> = roll.entries().map(|e| e.error.cloned()).collect();
        let traceback = entries[1].as_ref().and_then(|e| e.traceback.clone());
        assert_eq!(traceback.as_deref(), Some("Traceback (most recent call last): ..."));
        assert_eq!(entries[2], None);
    }

    #[test]
    fn ranks_that_never_ran_say_why() {
        let roots = [node(0, &[(0, 0), (1, 1), (2, 1)], vec![])];
        let roll = Roll::new(&job(), &roots, vec!["n0".into()]);
        let missing = roll.describe(Gid(1), 0, ExitOutcome::SpawnFailed { errno: 2 });
        assert_eq!(missing, "cannot start ./b on n0: No such file or directory");
        let nowdir = roll.describe(Gid(0), 0, ExitOutcome::NoWorkdir { errno: 2 });
        assert_eq!(
            nowdir,
            "cannot start rank 0 on n0: working directory /w: No such file or directory"
        );
    }
}
