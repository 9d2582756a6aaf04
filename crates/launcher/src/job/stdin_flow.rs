//! rlaunch's stdin on its way to the ranks that read it (`--stdin`), in a bounded window of
//! chunks: a chunk stays in flight until every node whose ranks read it has acknowledged it
//! for each of them. Counted by node, so that the job can go on without a node
//! (`--on-failure continue`): a lost node owes nothing, and a proxy rlaunch adopts is sent
//! again every chunk in flight (its lost parent may have held some), each node dropping a
//! chunk it had (`seq` not above the last it took). Pure: no I/O.
//!
//! ```text
//!   read ──sent(data)──► seq, owed by every reader node not lost
//!   Up::StdinAck(seq, node) ──acked──► one fewer; a chunk nobody owes leaves the window
//!   a node lost or done ──node_gone──► it owes nothing
//!   adopted(subtree) ──► chunks to send again
//! ```

use std::collections::{BTreeMap, BTreeSet, HashSet};

use rlaunch_protocol::ids::NodeId;

/// Stdin chunks in flight (sent, not yet written into every target rank).
pub(super) const WINDOW: usize = 8;

pub(super) struct StdinFlow {
    /// Not yet at end of file.
    pub(super) open: bool,
    seq: u64,
    /// Per chunk in flight: its bytes and, per node, the acknowledgements still missing.
    pending: BTreeMap<u64, InFlight>,
    /// The nodes whose ranks read stdin, with how many ranks each.
    readers: BTreeMap<NodeId, usize>,
    /// Reader nodes lost, or done (their ranks all ended): they owe nothing.
    lost: BTreeSet<NodeId>,
}

struct InFlight {
    data: Vec<u8>,
    owing: BTreeMap<NodeId, usize>,
}

impl StdinFlow {
    /// `open`: some rank reads stdin; `readers`: the node of each rank that does.
    pub(super) fn new(open: bool, readers: impl IntoIterator<Item = NodeId>) -> StdinFlow {
        let mut counts = BTreeMap::new();
        for node in readers {
            *counts.entry(node).or_insert(0) += 1;
        }
        StdinFlow { open, seq: 0, pending: BTreeMap::new(), readers: counts, lost: BTreeSet::new() }
    }

    /// Another chunk may be read: stdin is open and the window has room.
    pub(super) fn room(&self) -> bool {
        self.open && self.pending.len() < WINDOW
    }

    /// Chunk `data` goes out: its number, now owed by every reader node not lost.
    pub(super) fn sent(&mut self, data: &[u8]) -> u64 {
        self.seq += 1;
        let owing: BTreeMap<NodeId, usize> = self
            .readers
            .iter()
            .filter(|(node, _)| !self.lost.contains(node))
            .map(|(&node, &n)| (node, n))
            .collect();
        if !owing.is_empty() {
            self.pending.insert(self.seq, InFlight { data: data.to_vec(), owing });
        }
        self.seq
    }

    /// One rank on `node` wrote chunk `seq` (an acknowledgement owed by no one is dropped:
    /// one forgiven at an adoption, say).
    pub(super) fn acked(&mut self, seq: u64, node: NodeId) {
        let Some(chunk) = self.pending.get_mut(&seq) else { return };
        if let Some(left) = chunk.owing.get_mut(&node) {
            *left -= 1;
            if *left == 0 {
                chunk.owing.remove(&node);
            }
        }
        if chunk.owing.is_empty() {
            self.pending.remove(&seq);
        }
    }

    /// Node `node` was lost, or is done: its ranks will never write what is in flight, nor
    /// what comes.
    pub(super) fn node_gone(&mut self, node: NodeId) {
        self.lost.insert(node);
        self.forgive(|n| n == node);
    }

    /// A proxy was adopted with the nodes of `subtree`: every chunk in flight, to send it
    /// again. What those nodes owed is forgiven (their acknowledgements may have gone with
    /// the lost parent); the window is for flow, the nodes' own check for delivery.
    pub(super) fn adopted(&mut self, subtree: &HashSet<NodeId>) -> Vec<(u64, Vec<u8>)> {
        let again = self.pending.iter().map(|(&seq, c)| (seq, c.data.clone())).collect();
        self.forgive(|n| subtree.contains(&n));
        again
    }

    /// The attempt starts again: nothing is in flight, no node is lost.
    pub(super) fn restart(&mut self) {
        self.pending.clear();
        self.lost.clear();
    }

    fn forgive(&mut self, whose: impl Fn(NodeId) -> bool) {
        for chunk in self.pending.values_mut() {
            chunk.owing.retain(|&n, _| !whose(n));
        }
        self.pending.retain(|_, c| !c.owing.is_empty());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_chunk_leaves_the_window_once_every_reader_rank_wrote_it() {
        // Ranks on nodes 0, 0 and 1 read stdin.
        let mut flow = StdinFlow::new(true, [NodeId(0), NodeId(0), NodeId(1)]);
        let seq = flow.sent(b"a");
        for _ in 1..WINDOW {
            flow.sent(b"b");
        }
        assert!(!flow.room());
        flow.acked(seq, NodeId(0));
        flow.acked(seq, NodeId(1));
        assert!(!flow.room(), "node 0 owes one more");
        flow.acked(seq, NodeId(0));
        assert!(flow.room());
    }

    #[test]
    fn a_lost_node_owes_nothing_and_an_adopted_subtree_is_sent_the_chunks_again() {
        let mut flow = StdinFlow::new(true, [NodeId(0), NodeId(1), NodeId(2)]);
        let first = flow.sent(b"a");
        let second = flow.sent(b"b");
        flow.acked(first, NodeId(0));
        flow.acked(second, NodeId(0));
        // Node 1 is lost; node 2 below it is adopted and gets both again.
        flow.node_gone(NodeId(1));
        let again = flow.adopted(&HashSet::from([NodeId(2)]));
        assert_eq!(again, [(first, b"a".to_vec()), (second, b"b".to_vec())]);
        assert!(flow.pending.is_empty(), "nothing is owed any more");
        // What comes next is owed by nodes 0 and 2 only.
        let third = flow.sent(b"c");
        flow.acked(third, NodeId(0));
        assert_eq!(flow.pending[&third].owing, BTreeMap::from([(NodeId(2), 1)]));
        flow.acked(third, NodeId(2));
        // A late acknowledgement of a forgiven chunk changes nothing.
        flow.acked(first, NodeId(2));
        assert!(flow.pending.is_empty());
    }

    #[test]
    fn nothing_is_in_flight_without_a_reader() {
        let mut flow = StdinFlow::new(true, []);
        for _ in 0..2 * WINDOW {
            flow.sent(b"x");
        }
        assert!(flow.room());
    }
}
