//! What one trial is: a topology, a phase, a fault and its target, drawn from a seed so that
//! any trial can be replayed alone (`chaos --seed S --trial K`).

use std::fmt;
use std::time::Duration;

/// Where the job runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Topology {
    /// One node: this machine, one proxy.
    Local,
    /// One rank on this machine: its proxy writes its output into rlaunch's stdout itself
    /// (`rlaunch_proxy::outputs::direct`).
    Lone,
    /// Seven fake nodes (`--launcher fork`) in a tree of width 2: depth 3 below rlaunch.
    Tree,
    /// Seven hosts in network namespaces over real ssh, the same tree.
    Ssh,
    /// Seven nodes of the tests' real Slurm (network namespaces, a slurmd each), inside one
    /// allocation: one srun starts the proxies, which dial back and form the same tree.
    Slurm,
}

impl Topology {
    pub const ALL: [Topology; 5] =
        [Topology::Local, Topology::Lone, Topology::Tree, Topology::Ssh, Topology::Slurm];
    /// A run's topologies unless `--topologies` says: Slurm's only when asked for (it brings
    /// up a Slurm cluster, whose names are the machine's: one at a time).
    pub const DEFAULT: [Topology; 4] =
        [Topology::Local, Topology::Lone, Topology::Tree, Topology::Ssh];

    pub fn parse(word: &str) -> Option<Topology> {
        Topology::ALL.into_iter().find(|t| t.name() == word)
    }

    pub fn name(self) -> &'static str {
        match self {
            Topology::Local => "local",
            Topology::Lone => "lone",
            Topology::Tree => "tree",
            Topology::Ssh => "ssh",
            Topology::Slurm => "slurm",
        }
    }

    pub fn nodes(self) -> usize {
        match self {
            Topology::Local | Topology::Lone => 1,
            Topology::Tree | Topology::Ssh | Topology::Slurm => TREE_NODES,
        }
    }

    pub fn ranks(self) -> u32 {
        match self {
            Topology::Local => 4,
            Topology::Lone => 1,
            Topology::Tree | Topology::Ssh | Topology::Slurm => TREE_NODES as u32 * RANKS_PER_NODE,
        }
    }

    /// The node (an index into the host list) that rank `rank` runs on.
    pub fn node_of(self, rank: u32) -> usize {
        match self {
            Topology::Local | Topology::Lone => 0,
            Topology::Tree | Topology::Ssh | Topology::Slurm => (rank / RANKS_PER_NODE) as usize,
        }
    }

    /// The first rank on `node`.
    pub fn first_rank(self, node: usize) -> u32 {
        match self {
            Topology::Local | Topology::Lone => 0,
            Topology::Tree | Topology::Ssh | Topology::Slurm => node as u32 * RANKS_PER_NODE,
        }
    }

    /// The node's parent in the proxy tree, `None` for rlaunch (rlaunch's own tree layout:
    /// breadth first, `--tree-width` 2).
    pub fn parent(self, node: usize) -> Option<usize> {
        match self {
            Topology::Local | Topology::Lone => None,
            Topology::Tree | Topology::Ssh | Topology::Slurm => {
                (node >= TREE_WIDTH).then(|| (node - TREE_WIDTH) / TREE_WIDTH)
            }
        }
    }

    /// Whether `node` is `top` or below it.
    pub fn under(self, node: usize, top: usize) -> bool {
        let mut at = Some(node);
        while let Some(n) = at {
            if n == top {
                return true;
            }
            at = self.parent(n);
        }
        false
    }

    /// Nodes with child proxies.
    pub fn interior(self) -> Vec<usize> {
        (0..self.nodes())
            .filter(|&n| (0..self.nodes()).any(|c| self.parent(c) == Some(n)))
            .collect()
    }

    pub fn leaves(self) -> Vec<usize> {
        let interior = self.interior();
        (0..self.nodes()).filter(|n| !interior.contains(n)).collect()
    }

    /// How long the job may run: what ends a trial whose fault ends nothing (a stopped rank).
    /// Longer than the launch, the fault's delay and the end it causes (a stopped proxy found
    /// by its 5 s of silence; output written before it still drains: over ssh, seconds).
    pub fn timeout(self) -> Duration {
        match self {
            Topology::Local | Topology::Lone | Topology::Tree | Topology::Slurm => {
                Duration::from_secs(12)
            }
            Topology::Ssh => Duration::from_secs(18),
        }
    }
}

pub const TREE_NODES: usize = 7;
pub const TREE_WIDTH: usize = 2;
pub const RANKS_PER_NODE: u32 = 2;

/// What the ranks are doing when the fault strikes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Phase {
    /// Before every proxy has said hello and every rank has started.
    Launch,
    /// Ranks in a loop of PMI fences.
    Fence,
    /// Ranks writing as fast as they can.
    Output,
    /// rlaunch forwarding its stdin to rank 0, which echoes it.
    Stdin,
    /// Ranks finalizing and exiting 0.
    Exit,
}

impl Phase {
    pub const ALL: [Phase; 5] =
        [Phase::Launch, Phase::Fence, Phase::Output, Phase::Stdin, Phase::Exit];

    pub fn name(self) -> &'static str {
        match self {
            Phase::Launch => "launch",
            Phase::Fence => "fence",
            Phase::Output => "output",
            Phase::Stdin => "stdin",
            Phase::Exit => "exit",
        }
    }

    /// The job can end well before or despite the fault: it ends by itself soon.
    pub fn ends_by_itself(self) -> bool {
        matches!(self, Phase::Launch | Phase::Exit)
    }
}

/// The fault a trial injects.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Fault {
    KillRank,
    StopRank,
    /// The rank exits with code 3.
    RankExit,
    /// The rank dies by SIGSEGV.
    RankSignal,
    /// The rank calls PMI abort with code 7.
    RankAbort,
    /// The rank shuts its PMI socket down and exits 0 without finalize.
    RankPmiClose,
    KillLeafProxy,
    KillInteriorProxy,
    StopProxy,
    KillRlaunch,
    StopRlaunch,
    /// The ssh client that carries a node's proxy.
    KillSsh,
    /// The node's network link goes down (and comes back after the trial).
    LinkDown,
}

impl Fault {
    pub const ALL: [Fault; 13] = [
        Fault::KillRank,
        Fault::StopRank,
        Fault::RankExit,
        Fault::RankSignal,
        Fault::RankAbort,
        Fault::RankPmiClose,
        Fault::KillLeafProxy,
        Fault::KillInteriorProxy,
        Fault::StopProxy,
        Fault::KillRlaunch,
        Fault::StopRlaunch,
        Fault::KillSsh,
        Fault::LinkDown,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Fault::KillRank => "kill -9 rank",
            Fault::StopRank => "kill -STOP rank",
            Fault::RankExit => "rank exits 3",
            Fault::RankSignal => "rank dies by SIGSEGV",
            Fault::RankAbort => "rank aborts (PMI)",
            Fault::RankPmiClose => "rank closes PMI",
            Fault::KillLeafProxy => "kill -9 leaf proxy",
            Fault::KillInteriorProxy => "kill -9 interior proxy",
            Fault::StopProxy => "kill -STOP proxy",
            Fault::KillRlaunch => "kill -9 rlaunch",
            Fault::StopRlaunch => "kill -STOP rlaunch",
            Fault::KillSsh => "kill -9 ssh client",
            Fault::LinkDown => "node link down",
        }
    }

    fn fits(self, topology: Topology) -> bool {
        match self {
            Fault::KillInteriorProxy => topology.nodes() > 1,
            Fault::KillSsh | Fault::LinkDown => topology == Topology::Ssh,
            _ => true,
        }
    }

    /// What the target rank does itself (`chaosrank`'s FAULT word), for rank-made faults.
    pub fn rank_word(self) -> Option<&'static str> {
        match self {
            Fault::RankExit => Some("exit:3"),
            Fault::RankSignal => Some("signal:11"),
            Fault::RankAbort => Some("abort:7"),
            Fault::RankPmiClose => Some("pmi-close"),
            _ => None,
        }
    }

    /// Whether the fault aims at a node (a proxy, its ssh, its link) rather than a rank.
    pub fn aims_at_node(self) -> bool {
        matches!(
            self,
            Fault::KillLeafProxy
                | Fault::KillInteriorProxy
                | Fault::StopProxy
                | Fault::KillSsh
                | Fault::LinkDown
        )
    }
}

/// One trial.
#[derive(Clone, Debug)]
pub struct Trial {
    pub index: u32,
    pub topology: Topology,
    pub phase: Phase,
    pub fault: Fault,
    /// The rank a rank fault aims at.
    pub rank: u32,
    /// The node a node fault aims at.
    pub node: usize,
    /// From the moment the phase is reached (or the target is found) to the fault.
    pub delay: Duration,
}

impl Trial {
    /// The target rank strikes itself as it starts (a rank's own fault during the launch),
    /// not on SIGUSR1: the job cannot end well then.
    pub fn strikes_at_start(&self) -> bool {
        self.phase == Phase::Launch && self.fault.rank_word().is_some()
    }

    /// Trial `index` of the run seeded with `seed`, over `topologies`.
    pub fn draw(seed: u64, index: u32, topologies: &[Topology]) -> Trial {
        let mut rng = Rng::new(seed ^ u64::from(index).wrapping_mul(0x9e37_79b9_7f4a_7c15));
        let topology = *rng.pick(topologies);
        let phase = *rng.pick(&Phase::ALL);
        let faults: Vec<Fault> = Fault::ALL.into_iter().filter(|f| f.fits(topology)).collect();
        let fault = *rng.pick(&faults);
        let rank = rng.below(u64::from(topology.ranks())) as u32;
        let nodes: Vec<usize> = match fault {
            Fault::KillInteriorProxy => topology.interior(),
            Fault::KillLeafProxy => topology.leaves(),
            _ => (0..topology.nodes()).collect(),
        };
        let node = *rng.pick(&nodes);
        let delay_ms = match phase {
            Phase::Launch => rng.below(40),
            Phase::Exit => rng.below(250),
            Phase::Fence | Phase::Output | Phase::Stdin => 100 + rng.below(700),
        };
        Trial { index, topology, phase, fault, rank, node, delay: Duration::from_millis(delay_ms) }
    }
}

impl fmt::Display for Trial {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let target = if self.fault.aims_at_node() {
            format!("node {}", self.node)
        } else {
            format!("rank {}", self.rank)
        };
        write!(
            f,
            "trial {}: {} {} during {} on {}, after {} ms",
            self.index,
            self.fault.name(),
            target,
            self.phase.name(),
            self.topology.name(),
            self.delay.as_millis()
        )
    }
}

/// splitmix64: enough to draw trials from a seed.
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Rng {
        Rng(seed)
    }

    pub fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    pub fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }

    pub fn pick<'a, T>(&mut self, items: &'a [T]) -> &'a T {
        &items[self.below(items.len() as u64) as usize]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_tree_is_rlaunchs_breadth_first_layout() {
        let t = Topology::Tree;
        let parents: Vec<Option<usize>> = (0..TREE_NODES).map(|n| t.parent(n)).collect();
        assert_eq!(parents, [None, None, Some(0), Some(0), Some(1), Some(1), Some(2)]);
        assert_eq!(t.interior(), [0, 1, 2]);
        assert_eq!(t.leaves(), [3, 4, 5, 6]);
        assert!(t.under(6, 0) && t.under(6, 2) && !t.under(6, 1));
        assert_eq!(t.node_of(13), 6);
    }

    #[test]
    fn trials_replay_from_their_seed() {
        let all = Topology::ALL;
        let a = Trial::draw(7, 12, &all);
        let b = Trial::draw(7, 12, &all);
        assert_eq!(a.to_string(), b.to_string());
        for i in 0..500 {
            let t = Trial::draw(1, i, &[Topology::Local]);
            assert!(t.fault.fits(Topology::Local) && t.node == 0 && t.rank < 4, "{t}");
            let t = Trial::draw(1, i, &[Topology::Lone]);
            assert!(t.fault.fits(Topology::Lone) && t.node == 0 && t.rank == 0, "{t}");
        }
    }
}
