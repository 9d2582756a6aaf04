//! The ranks' stacks, merged into one tree of call paths (as LLNL's STAT shows them): the
//! outermost call at a root, each frame once for every rank whose stack passes through it,
//! with the set of those ranks. A proxy puts in its own ranks' threads and merges its
//! children's trees; the tree that reaches rlaunch holds the whole job, and is only as big
//! as the number of different paths, not of ranks.

use serde::{Deserialize, Serialize};

use crate::ids::Gid;

/// The merged stacks of a subtree's ranks.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct StackTree {
    /// The outermost frames (`_start`, a thread's start routine), each with its callees.
    pub roots: Vec<StackNode>,
}

/// A frame of the tree, and the ranks whose stacks pass through it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct StackNode {
    pub frame: StackFrame,
    pub ranks: RankSet,
    /// What these ranks called from here.
    pub callees: Vec<StackNode>,
}

/// One frame as the report shows it; two frames are the same branch when all of it is.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct StackFrame {
    pub kind: FrameKind,
    /// The function; `lib.so+0xOFFSET` where no symbol is known; for a note, the note.
    pub function: String,
    /// `file:line` where debug info (or Python) says, else the file the code is in.
    pub place: Option<String>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum FrameKind {
    Native,
    /// Inlined into the frame that calls it: no machine frame of its own.
    Inlined,
    Python,
    /// Not a frame: why a stack is missing or ends here (a rank that could not be read, a
    /// thread in D state, an unwinder that stopped).
    Note,
}

impl StackFrame {
    pub fn note(text: impl Into<String>) -> StackFrame {
        StackFrame { kind: FrameKind::Note, function: text.into(), place: None }
    }
}

/// A set of ranks as sorted, disjoint, non-adjacent inclusive ranges.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct RankSet(pub Vec<(u32, u32)>);

impl RankSet {
    pub fn of(rank: Gid) -> RankSet {
        RankSet(vec![(rank.0, rank.0)])
    }

    /// How many ranks.
    pub fn len(&self) -> u32 {
        self.0.iter().map(|(a, b)| b - a + 1).sum()
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    pub fn contains(&self, rank: Gid) -> bool {
        self.0.iter().any(|&(a, b)| a <= rank.0 && rank.0 <= b)
    }

    /// Every rank of `other` is in this set too.
    pub fn add(&mut self, other: &RankSet) {
        let mut all: Vec<(u32, u32)> = self.0.iter().chain(&other.0).copied().collect();
        all.sort_unstable();
        let mut merged: Vec<(u32, u32)> = Vec::with_capacity(all.len());
        for (a, b) in all {
            match merged.last_mut() {
                Some(last) if a <= last.1.saturating_add(1) => last.1 = last.1.max(b),
                _ => merged.push((a, b)),
            }
        }
        self.0 = merged;
    }

    /// The first rank.
    pub fn first(&self) -> Option<Gid> {
        self.0.first().map(|&(a, _)| Gid(a))
    }
}

impl std::fmt::Display for RankSet {
    /// `0-3,5,7-9`.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        for (i, &(a, b)) in self.0.iter().enumerate() {
            let comma = if i == 0 { "" } else { "," };
            match a == b {
                true => write!(f, "{comma}{a}")?,
                false => write!(f, "{comma}{a}-{b}")?,
            }
        }
        Ok(())
    }
}

impl StackTree {
    /// Puts in one thread of `rank`: its frames, outermost first.
    pub fn insert(&mut self, rank: Gid, frames: impl IntoIterator<Item = StackFrame>) {
        let one = RankSet::of(rank);
        let mut level = &mut self.roots;
        for frame in frames {
            let at = match level.iter().position(|n| n.frame == frame) {
                Some(at) => at,
                None => {
                    let node = StackNode { frame, ranks: RankSet::default(), callees: Vec::new() };
                    level.push(node);
                    level.len() - 1
                }
            };
            level[at].ranks.add(&one);
            level = &mut level[at].callees;
        }
    }

    /// Takes in another subtree's tree.
    pub fn merge(&mut self, other: StackTree) {
        merge_level(&mut self.roots, other.roots);
    }

    pub fn is_empty(&self) -> bool {
        self.roots.is_empty()
    }

    /// One rank's paths, outermost frame first: its threads' stacks again, as far as the
    /// tree can tell them apart (two threads of a rank on the same path are one).
    pub fn paths_of(&self, rank: Gid) -> Vec<Vec<&StackFrame>> {
        let mut paths = Vec::new();
        let mut path = Vec::new();
        collect(&self.roots, rank, &mut path, &mut paths);
        paths
    }
}

fn merge_level(into: &mut Vec<StackNode>, from: Vec<StackNode>) {
    for node in from {
        match into.iter_mut().find(|n| n.frame == node.frame) {
            Some(same) => {
                same.ranks.add(&node.ranks);
                merge_level(&mut same.callees, node.callees);
            }
            None => into.push(node),
        }
    }
}

fn collect<'a>(
    level: &'a [StackNode],
    rank: Gid,
    path: &mut Vec<&'a StackFrame>,
    paths: &mut Vec<Vec<&'a StackFrame>>,
) {
    for node in level.iter().filter(|n| n.ranks.contains(rank)) {
        path.push(&node.frame);
        // A path ends where none of its callees holds the rank (or there are none).
        if node.callees.iter().any(|c| c.ranks.contains(rank)) {
            collect(&node.callees, rank, path, paths);
        } else {
            paths.push(path.clone());
        }
        path.pop();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn f(name: &str) -> StackFrame {
        StackFrame { kind: FrameKind::Native, function: name.into(), place: None }
    }

    #[test]
    fn rank_sets_stay_compact() {
        let mut set = RankSet::default();
        for r in [5, 0, 2, 1, 3, 9, 7, 8] {
            set.add(&RankSet::of(Gid(r)));
        }
        assert_eq!(set.to_string(), "0-3,5,7-9");
        assert_eq!(set.len(), 8);
        assert!(set.contains(Gid(8)) && !set.contains(Gid(6)));
    }

    #[test]
    fn a_tree_merged_from_parts_is_the_tree_of_all() {
        let stacks = |r: u32| match r {
            3 => vec![f("_start"), f("main"), f("nanosleep")],
            _ => vec![f("_start"), f("main"), f("MPI_Barrier"), f("poll")],
        };
        let mut whole = StackTree::default();
        let (mut a, mut b) = (StackTree::default(), StackTree::default());
        for r in 0..6 {
            whole.insert(Gid(r), stacks(r));
            match r % 2 {
                0 => a.insert(Gid(r), stacks(r)),
                _ => b.insert(Gid(r), stacks(r)),
            }
        }
        a.merge(b);
        a.roots[0].callees[0].callees.sort_by(|x, y| x.frame.function.cmp(&y.frame.function));
        whole.roots[0].callees[0].callees.sort_by(|x, y| x.frame.function.cmp(&y.frame.function));
        assert_eq!(a, whole);
        let main = &whole.roots[0].callees[0];
        assert_eq!(main.ranks.to_string(), "0-5");
        let barrier = main.callees.iter().find(|n| n.frame.function == "MPI_Barrier").unwrap();
        assert_eq!(barrier.ranks.to_string(), "0-2,4-5");
        let names = |p: Vec<&StackFrame>| p.iter().map(|f| f.function.clone()).collect::<Vec<_>>();
        let paths: Vec<_> = whole.paths_of(Gid(3)).into_iter().map(names).collect();
        assert_eq!(paths, vec![vec!["_start", "main", "nanosleep"]]);
    }
}
