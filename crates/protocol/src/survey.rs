//! Where a job is, rank by rank: what each proxy says of its ranks when rlaunch asks
//! (`Down::Survey`), merged up the tree into one [`Survey`] per subtree. rlaunch makes its
//! hang report of it: the ranks missing from each fence, each rank's process state, and
//! (when asked) every rank's stacks.

use serde::{Deserialize, Serialize};

use crate::ids::{ExitOutcome, Gid, NodeId};
use crate::stacks::StackTree;

/// What a subtree says of its ranks.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Survey {
    pub ranks: Vec<RankNow>,
    /// The proxies of the subtree that did not answer in time, by host: their ranks are not
    /// in `ranks`.
    pub unanswered: Vec<String>,
    /// What the subtree's ranks have done so far, summed: bytes of output read from them,
    /// and PMI-1/PMI-2 requests and PMIx server events about them. Only its changes mean
    /// anything (`--stall-report`).
    pub activity: u64,
    /// The ranks' stacks merged, when they were asked for: empty otherwise.
    pub stacks: StackTree,
}

impl Survey {
    /// Takes in a child subtree's survey.
    pub fn merge(&mut self, other: Survey) {
        self.ranks.extend(other.ranks);
        self.unanswered.extend(other.unanswered);
        self.activity += other.activity;
        self.stacks.merge(other.stacks);
    }
}

/// One rank, as its proxy sees it now.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RankNow {
    pub rank: Gid,
    /// Its job: 0 for the launched one, then one per spawn.
    pub job: u32,
    pub node: NodeId,
    /// Its process; 0 if it never started.
    pub pid: u32,
    pub process: ProcessNow,
    /// Which PMI it speaks, and where it is in its job's fences.
    pub pmi: PmiNow,
}

/// A rank's process, read from /proc.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub enum ProcessNow {
    /// Alive: its state letter (`R`, `S`, `D`, `T`, `t`, `Z`), CPU time and resident memory.
    Live { state: char, cpu_ms: u64, rss_kib: u64 },
    /// Ended: how, where its proxy still knows (rlaunch knows it from the rank's exit
    /// report).
    Ended(Option<ExitOutcome>),
    /// It never started.
    NeverStarted,
}

/// Where a rank is in its job's fences.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum PmiNow {
    /// It has not spoken PMI-1, PMI-2 or PMIx (yet, or ever).
    Silent,
    /// A PMI-1 or PMI-2 rank; `epoch`: its job's fence in progress on its node (fences are
    /// counted from 0), `inside`: the rank has entered it.
    Pmi { epoch: u64, inside: bool },
    /// A PMIx client. Its node's server enters a fence only once every client of the node
    /// has: `inside` is true then, and before that it is not known of one client.
    Pmix { epoch: u64, inside: bool },
    /// It finalized.
    Finalized,
}
