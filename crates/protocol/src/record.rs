//! What the tree reports about each rank and node besides how it ended: the figures of
//! `rlaunch --report` and the spans of `--timeline`. They travel in the exit reports that
//! exist anyway: a rank's in [`crate::control::Up::RankExited`], a node's in
//! [`crate::control::Up::NodeDone`], its children's nodes nested in it.
//!
//! Times are microseconds since the Unix epoch on the clock of the host that took them; each
//! node's record says how far its clock is from its parent's ([`NodeRecord::offset_us`]), so
//! that rlaunch can put every time on its own clock.

use serde::{Deserialize, Serialize};

use crate::ids::{Gid, NodeId};

/// Microseconds since the Unix epoch, on the clock of the host that took it.
pub type Micros = u64;

/// The wall clock now.
pub fn now_us() -> Micros {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_micros() as u64)
        .unwrap_or(0)
}

/// A rank's run: when it started and ended, and its resource use from its `wait4` rusage,
/// which includes the descendants it waited for. All zero for a rank that never started.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct RankUsage {
    /// When the proxy started it.
    pub started: Micros,
    /// When the proxy reaped it.
    pub ended: Micros,
    pub user_us: u64,
    pub system_us: u64,
    /// Peak resident set, KiB.
    pub maxrss_kib: u64,
}

/// A moment in a node's launch.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum Phase {
    /// The parent started the proxy (fork, ssh, the scheduler's launcher): the parent's time.
    Bootstrap,
    /// The proxy's hello reached its parent: the parent's time.
    Hello,
    /// The proxy had its launch.
    Launched,
    /// The proxy had started all its ranks.
    RanksStarted,
    /// All the node's ranks had ended and their output was sent.
    Done,
}

impl Phase {
    pub fn name(self) -> &'static str {
        match self {
            Phase::Bootstrap => "bootstrap",
            Phase::Hello => "hello",
            Phase::Launched => "launched",
            Phase::RanksStarted => "ranks_started",
            Phase::Done => "done",
        }
    }
}

/// What a node's proxy saw of one of its ranks, besides its end.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct RankRecord {
    pub rank: Gid,
    /// Bytes the rank wrote to its stdout and its stderr (all of them, whether rlaunch wrote
    /// them out or dropped them at the end of a failed job).
    pub stdout_bytes: u64,
    pub stderr_bytes: u64,
    /// When its first output was read.
    pub first_output: Option<Micros>,
    /// When it initialised PMI: its PMI-1/PMI-2 init, or its PMIx client connected.
    pub pmi_init: Option<Micros>,
    /// The variables rlaunch set for it (its place, the frameworks' contract), when a report
    /// asks for them ([`crate::control::Job::report_vars`]); the PMI channel's own are left
    /// out.
    pub vars: Vec<(String, String)>,
    /// The CPUs it was bound to (a cpulist); `None`: not bound.
    pub cpus: Option<String>,
    /// The GPUs it was given; `None`: its job asked for none (`--gpus-per-rank`).
    pub gpus: Option<Vec<GpuUse>>,
}

/// A GPU a rank was given.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct GpuUse {
    /// What names it in its vendor's variable (`CUDA_VISIBLE_DEVICES`, ...).
    pub entry: String,
    /// `nvidia`, `amd` or `intel`.
    pub vendor: String,
    /// Its PCI address and NUMA node; `None` where the allocation named it by UUID only.
    pub pci: Option<String>,
    pub numa: Option<u32>,
}

/// A fence of the launched job on one node: from when the node entered it (its first local
/// rank, PMI-1/2; its PMIx server, PMIx) to when it completed there. `epoch` counts the
/// job's fences from 0.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct FenceSpan {
    pub epoch: u64,
    pub entered: Micros,
    pub completed: Micros,
}

/// A node's fences as they open and close.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct FenceTimes {
    open: Option<Micros>,
    pub done: Vec<FenceSpan>,
}

impl FenceTimes {
    /// The node is in the next fence (again: only the first entry counts).
    pub fn enter(&mut self, now: Micros) {
        self.open.get_or_insert(now);
    }

    /// The open fence completed.
    pub fn complete(&mut self, now: Micros) {
        let entered = self.open.take().unwrap_or(now);
        let epoch = self.done.len() as u64;
        self.done.push(FenceSpan { epoch, entered, completed: now });
    }
}

/// What a process of the tree itself used, rlaunch's or a proxy's (its ranks and child
/// proxies not counted): the costs the launch model prices (bench/model.py).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct OwnUsage {
    /// CPU time of all its threads, from `getrusage(RUSAGE_SELF)` when it took the record.
    pub user_us: u64,
    pub system_us: u64,
    /// Its peak resident set so far, KiB.
    pub maxrss_kib: u64,
    /// Its open descriptors when all the ranks below it had started (rlaunch: every node
    /// had said so; a proxy: its own ranks); 0 when that moment never came.
    pub fds_running: u32,
}

/// What one node's proxy saw, on its own clock.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct NodeRecord {
    pub node: NodeId,
    pub host: String,
    pub pid: u32,
    /// This node's clock minus its parent's, in microseconds, measured by the parent from a
    /// round trip after the hello; 0 when the parent did not measure it.
    pub offset_us: i64,
    /// The round trip the offset was measured from: its error is at most half of it.
    pub round_trip_us: u64,
    pub phases: Vec<(Phase, Micros)>,
    pub ranks: Vec<RankRecord>,
    pub fences: Vec<FenceSpan>,
    /// What the proxy itself used, up to its record.
    pub usage: OwnUsage,
    /// The records of the child proxies that finished.
    pub children: Vec<NodeRecord>,
}

impl NodeRecord {
    /// When `phase` happened, if it did.
    pub fn phase(&self, phase: Phase) -> Option<Micros> {
        self.phases.iter().find(|(p, _)| *p == phase).map(|&(_, at)| at)
    }

    /// This record and every record below it, depth first, each with its clock's offset
    /// from the top's (the offsets summed along the path).
    pub fn walk(&self) -> Vec<(&NodeRecord, i64)> {
        let mut out = Vec::new();
        let mut stack = vec![(self, 0i64)];
        while let Some((record, above)) = stack.pop() {
            out.push((record, above));
            for child in record.children.iter().rev() {
                stack.push((child, above + child.offset_us));
            }
        }
        out
    }
}

/// The offset of a peer's clock from ours, from one round trip: we sent at `sent` and heard
/// back at `heard` (our clock); the peer read its clock at `theirs` in between. Returns the
/// offset (theirs minus ours) and the round trip.
pub fn clock_offset(sent: Micros, theirs: Micros, heard: Micros) -> (i64, u64) {
    let mid = sent + heard.saturating_sub(sent) / 2;
    (theirs as i64 - mid as i64, heard.saturating_sub(sent))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_offset_is_taken_at_the_middle_of_the_round_trip() {
        assert_eq!(clock_offset(1_000, 1_550, 1_100), (500, 100));
        assert_eq!(clock_offset(1_000, 900, 1_100), (-150, 100));
    }

    #[test]
    fn a_fence_spans_from_its_first_entry_to_its_completion() {
        let mut times = FenceTimes::default();
        times.enter(10);
        times.enter(12);
        times.complete(20);
        times.enter(30);
        times.complete(31);
        let want = [
            FenceSpan { epoch: 0, entered: 10, completed: 20 },
            FenceSpan { epoch: 1, entered: 30, completed: 31 },
        ];
        assert_eq!(times.done, want);
    }

    #[test]
    fn walking_sums_the_offsets_down_the_tree() {
        let leaf = NodeRecord { node: NodeId(2), offset_us: -5, ..Default::default() };
        let mid = NodeRecord {
            node: NodeId(1),
            offset_us: 100,
            children: vec![leaf],
            ..Default::default()
        };
        let top =
            NodeRecord { node: NodeId(0), offset_us: 7, children: vec![mid], ..Default::default() };
        let walked: Vec<(u32, i64)> = top.walk().iter().map(|(r, o)| (r.node.0, *o)).collect();
        assert_eq!(walked, vec![(0, 0), (1, 100), (2, 95)]);
    }
}
