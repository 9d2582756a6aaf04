//! The launched job's PMIx fence at the root: every node's data comes up in parts named
//! after the node, put back together here, and each top proxy's subtree enters once all its
//! nodes' data is sent; once every live one is in, every node's data, each whole, goes down
//! the tree in parts of at most [`PMIX_FENCE_PART`] bytes. A node's PMIx server takes a
//! fence's data in one message: a fence that gathers more than [`MAX_DATA`] fails the job.
//!
//! ```text
//!   PmixFencePart(node) ──part──► each node's data (over MAX_DATA: TooLarge)
//!   PmixFenceAgain(node) ──again──► that node's data dropped: its parts come again
//!   PmixFenceIn ──arrive──► every live top proxy in ──complete──► PmixFencePart × n, Out
//! ```
//!
//! Parts sent again by a proxy rlaunch adopted may come for a fence completed meanwhile
//! (its lost parent had passed them, and the subtree's entry, on): they are dropped.
//!
//! Pure: no I/O.

use rlaunch_protocol::ids::NodeId;
use std::collections::BTreeMap;

use rlaunch_protocol::control::PMIX_FENCE_MAX as MAX_DATA;
use rlaunch_protocol::control::PMIX_FENCE_PART;
use rlaunch_tree::fence::{in_parts, FenceFold};

/// A fence gathered more data than a PMIx server takes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct TooLarge {
    /// Its epoch (the job's first PMIx fence is 0).
    pub epoch: u64,
    /// What it had gathered when it passed the limit.
    pub bytes: u64,
}

pub(crate) struct PmixFence {
    /// The top proxies in.
    fold: FenceFold<()>,
    /// Each node's data so far, by node.
    data: BTreeMap<NodeId, Vec<u8>>,
    /// Bytes gathered in the current epoch.
    bytes: usize,
    /// The most a fence may gather.
    limit: usize,
    /// The current epoch passed the limit: what comes for it is dropped, and it never
    /// completes (the job is ending).
    too_large: bool,
    /// Some subtree entered the current epoch with a PMIx server.
    served: bool,
    /// The completed epochs that some rank asked for (not those every node entered only for
    /// lack of a server, at the end).
    served_epochs: u64,
}

impl Default for PmixFence {
    fn default() -> PmixFence {
        PmixFence::with_limit(MAX_DATA)
    }
}

impl PmixFence {
    fn with_limit(limit: usize) -> PmixFence {
        let (fold, data) = (FenceFold::default(), BTreeMap::new());
        PmixFence { fold, data, bytes: 0, limit, too_large: false, served: false, served_epochs: 0 }
    }

    /// The epoch being folded.
    pub(crate) fn epoch(&self) -> u64 {
        self.fold.epoch()
    }

    /// The PMIx fences the ranks asked for that completed so far.
    pub(crate) fn completed(&self) -> u64 {
        self.served_epochs
    }

    fn check_epoch(&self, epoch: u64) {
        let expected = self.fold.epoch();
        if epoch != expected {
            tracing::warn!(epoch, expected, "PMIx fence data for another epoch");
        }
    }

    /// Part of node `node`'s data for fence `epoch`. Says once if the fence has gathered
    /// too much.
    pub(crate) fn part(&mut self, epoch: u64, node: NodeId, data: &[u8]) -> Result<(), TooLarge> {
        if epoch < self.fold.epoch() {
            tracing::debug!(epoch, %node, "PMIx fence data sent again for a completed fence");
            return Ok(());
        }
        self.check_epoch(epoch);
        if self.too_large {
            return Ok(());
        }
        self.bytes = self.bytes.saturating_add(data.len());
        if self.bytes > self.limit {
            self.too_large = true;
            self.data.clear();
            return Err(TooLarge { epoch: self.fold.epoch(), bytes: self.bytes as u64 });
        }
        self.data.entry(node).or_default().extend_from_slice(data);
        Ok(())
    }

    /// Node `node`'s data for fence `epoch` comes again from its start: what came of it is
    /// dropped (nothing, for a fence completed already).
    pub(crate) fn again(&mut self, epoch: u64, node: NodeId) {
        if epoch != self.fold.epoch() || self.too_large {
            return;
        }
        if let Some(data) = self.data.remove(&node) {
            self.bytes -= data.len();
        }
    }

    /// A top proxy's subtree entered fence `epoch`; `served`: with a PMIx server somewhere.
    pub(crate) fn arrive(&mut self, epoch: u64, served: bool) {
        self.check_epoch(epoch);
        self.served |= served;
        self.fold.arrive([]);
    }

    /// Once `parties` top proxies are in: the epoch and every node's data in parts, the last
    /// for the `PmixFenceOut`. The next epoch starts.
    pub(crate) fn complete(&mut self, parties: usize) -> Option<(u64, Vec<Vec<u8>>)> {
        if self.too_large {
            return None;
        }
        let (epoch, _) = self.fold.complete(parties)?;
        self.fold.finish(epoch);
        self.bytes = 0;
        self.served_epochs += u64::from(std::mem::take(&mut self.served));
        Some((epoch, in_parts(std::mem::take(&mut self.data).into_values(), PMIX_FENCE_PART)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_node_sent_again_replaces_what_came_of_it_and_a_completed_fences_data_is_dropped() {
        let mut fence = PmixFence::with_limit(100);
        // An orphan's parent had passed n2's first part on; adopted, n2 sends all again.
        for (node, data) in [(1, &b"a1"[..]), (2, b"c1")] {
            assert_eq!(fence.part(0, NodeId(node), data), Ok(()));
        }
        fence.again(0, NodeId(2));
        for data in [&b"c1"[..], b"c2"] {
            assert_eq!(fence.part(0, NodeId(2), data), Ok(()));
        }
        fence.arrive(0, true);
        assert_eq!(fence.complete(1), Some((0, vec![b"a1c1c2".to_vec()])));
        // Sent again after the fence completed (the parent had entered for the subtree):
        // nothing of it enters the next one.
        fence.again(0, NodeId(2));
        assert_eq!(fence.part(0, NodeId(2), b"c1"), Ok(()));
        assert_eq!(fence.part(1, NodeId(1), b"a"), Ok(()));
        fence.arrive(1, true);
        assert_eq!(fence.complete(1), Some((1, vec![b"a".to_vec()])));
    }

    #[test]
    fn each_nodes_parts_are_put_together_whatever_comes_between_them() {
        let mut fence = PmixFence::with_limit(100);
        // Two nodes' parts interleave on their way up: each node's data stays whole.
        for (node, data) in [(2, &b"c1"[..]), (1, b"a1"), (2, b"c2"), (1, b"a2")] {
            assert_eq!(fence.part(0, NodeId(node), data), Ok(()));
        }
        fence.arrive(0, true);
        assert_eq!(fence.complete(2), None);
        fence.arrive(0, false);
        assert_eq!(fence.complete(2), Some((0, vec![b"a1a2c1c2".to_vec()])));
        // The next epoch starts with nothing; entered only for lack of servers, it completes
        // but is no fence the ranks asked for.
        fence.arrive(1, false);
        assert_eq!(fence.complete(1), Some((1, vec![Vec::new()])));
        assert_eq!(fence.completed(), 1);
    }

    #[test]
    fn every_nodes_data_goes_down_in_parts() {
        let mut fence = PmixFence::default();
        let big = vec![7u8; PMIX_FENCE_PART + 5];
        assert_eq!(fence.part(0, NodeId(0), &big), Ok(()));
        assert_eq!(fence.part(0, NodeId(1), b"n2"), Ok(()));
        fence.arrive(0, true);
        let (epoch, parts) = fence.complete(1).expect("in");
        assert_eq!(epoch, 0);
        assert_eq!(parts.iter().map(Vec::len).collect::<Vec<_>>(), [PMIX_FENCE_PART, 7]);
        assert_eq!(parts.concat(), [&big[..], b"n2"].concat());
    }

    #[test]
    fn a_fence_that_gathers_more_than_a_server_takes_is_too_large_once() {
        let mut fence = PmixFence::with_limit(10);
        assert_eq!(fence.part(0, NodeId(0), &[0; 6]), Ok(()));
        assert_eq!(fence.part(0, NodeId(1), &[0; 6]), Err(TooLarge { epoch: 0, bytes: 12 }));
        assert_eq!(fence.part(0, NodeId(2), &[0; 6]), Ok(()));
        fence.arrive(0, true);
        assert_eq!(fence.complete(1), None, "it never completes");
    }
}
