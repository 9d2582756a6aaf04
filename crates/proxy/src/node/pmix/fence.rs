//! PMIx fences through the tree. The launched job's fence folds up like a PMI fence: this
//! node's server and each live child subtree are its parties. Each node's data goes up on
//! its own, in parts of at most [`PMIX_FENCE_PART`] bytes named after the node, passed on by
//! interior proxies as they come: no frame is too large however much the ranks put, no proxy
//! holds a subtree's data, and the root puts each node's parts back together. Every node's
//! data comes down the same way, for the server to hand back whole. A node whose server is
//! gone (or never started, when the job can do without PMIx) is still a party, in at once
//! with nothing, so that the rest of the job's fences complete. A fence over other processes
//! goes to the root, which folds it with the other nodes involved.
//!
//! ```text
//!   host ──Fence(id, data)──► PmixFencePart(this node) × n ──────────────► parent
//!   child ──PmixFencePart(any node)─────────────────────────────────────► parent
//!   host entered, child ──PmixFenceIn──► FenceFold ──every party in: PmixFenceIn──► parent
//!   parent ──PmixFencePart × n, PmixFenceOut──► children, and ──ModexDone(id, all)──► host
//! ```

use rlaunch_protocol::control::{Down, Up, PMIX_FENCE_PART};
use rlaunch_protocol::ids::{Gid, NodeId};

use crate::node::Node;
use rlaunch_tree::fence::{in_parts, FenceFold};

/// This node's share of the launched job's PMIx fences.
#[derive(Default)]
pub(super) struct NodeFence {
    /// The parties in: this node's own, and each child subtree's.
    fold: FenceFold<()>,
    /// This node's own party is in for the current epoch: its server entered, or it has none.
    own_in: bool,
    /// Some party of the current epoch entered with a PMIx server (see `Up::PmixFenceIn`).
    served: bool,
}

impl Node {
    /// Every local client entered the launched job's fence (the server waits for its
    /// completion): this node's `data` goes up.
    pub(super) fn pmix_fence_entered(&mut self, data: Vec<u8>) {
        self.fences.enter(rlaunch_protocol::record::now_us());
        let (epoch, node) = (self.pmix.fence.fold.epoch(), self.plan.index);
        for data in in_parts([data], PMIX_FENCE_PART).into_iter().filter(|d| !d.is_empty()) {
            let _ = self.up.control.send(Up::PmixFencePart { epoch, node, data });
        }
        self.pmix.fence.own_in = true;
        self.pmix.fence.served = true;
        self.pmix_fence_arrive();
    }

    /// A child subtree entered PMIx fence `epoch` (its nodes' data went ahead).
    pub(in crate::node) fn pmix_child_fence(&mut self, epoch: u64, served: bool) {
        self.pmix.fence.served |= served;
        let expected = self.pmix.fence.fold.epoch();
        if epoch != expected {
            tracing::warn!(epoch, expected, "PMIx fence entry for another epoch");
        }
        self.pmix_fence_arrive();
    }

    /// This node has no PMIx server (any more), nor one waiting for its first client: its
    /// party of each fence is in at once, with no data. Nothing to do for a job that serves
    /// no PMIx, nor on a late node, which is no party.
    pub(super) fn pmix_fence_without_server(&mut self) {
        let server = self.pmix.server.is_some() || self.pmix.late.is_some();
        if self.job.pmix.is_none() || server || self.pmix.fence.own_in || self.late {
            return;
        }
        self.pmix.fence.own_in = true;
        self.pmix_fence_arrive();
    }

    fn pmix_fence_arrive(&mut self) {
        self.pmix.fence.fold.arrive([]);
        let parties = 1 + self.children.fence_parties();
        if let Some((epoch, _)) = self.pmix.fence.fold.complete(parties) {
            let served = self.pmix.fence.served;
            let _ = self.up.control.send(Up::PmixFenceIn { epoch, served });
        }
    }

    /// Part of the data of PMIx fence `epoch`, on its way down before its completion.
    pub(in crate::node) fn pmix_fence_part(&mut self, epoch: u64, data: Vec<u8>) {
        if let Some(pmix) = self.pmix.server.as_mut() {
            pmix.state.fence_part(&data);
        }
        self.children.broadcast(&Down::PmixFencePart { epoch, data });
    }

    /// PMIx fence `epoch` is complete tree-wide; `data` is the end of its data.
    pub(in crate::node) fn pmix_fence_out(&mut self, epoch: u64, data: Vec<u8>) {
        if let Some(pmix) = self.pmix.server.as_mut() {
            if let Some(done) = pmix.state.fence_out(&data) {
                pmix.host.send(done);
            }
        }
        self.children.broadcast(&Down::PmixFenceOut { epoch, data });
        if self.pmix.fence.served {
            self.fences.complete(rlaunch_protocol::record::now_us());
        }
        if !self.pmix.fence.fold.finish(epoch) {
            tracing::warn!(epoch, "PMIx fence completion for another epoch");
        }
        self.pmix.fence.own_in = false;
        self.pmix.fence.served = false;
        self.pmix_fence_without_server();
    }

    /// A fence over `members` is complete, with every participating node's data.
    pub(in crate::node) fn pmix_group_fence_out(
        &mut self,
        node: NodeId,
        members: Vec<Gid>,
        data: Vec<u8>,
    ) {
        if node != self.plan.index {
            let down = Down::PmixGroupFenceOut { node, members, data };
            self.children.send_toward_node(node, down);
            return;
        }
        let Some(pmix) = self.pmix.server.as_mut() else { return };
        if let Some(done) = pmix.state.group_fence_out(&members, data) {
            pmix.host.send(done);
        }
    }
}
