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

use super::server::{Act, Nspace, State};
use crate::node::Node;
use crate::pmix::wire::{self, Proc};
use crate::pmix::Command;
use crate::ranks::RankState;
use rlaunch_tree::fence::{in_parts, FenceFold};

/// This node's share of the launched job's PMIx fences.
#[derive(Default)]
pub(super) struct NodeFence {
    /// The parties in: this node's own, and each child subtree's.
    pub(super) fold: FenceFold<()>,
    /// This node's own party is in for the current epoch: its server entered, or it has none.
    pub(super) own_in: bool,
    /// Some party of the current epoch entered with a PMIx server (see `Up::PmixFenceIn`).
    served: bool,
}

impl State {
    /// Every local client entered the launched job's fence: the server's `id` is answered
    /// when it completes; this node's `data` goes up (the Node's fold).
    pub(super) fn fence_entered(&mut self, id: u32, data: Vec<u8>) -> Vec<Act> {
        if let Some(old) = self.entered.replace(id) {
            tracing::warn!(old, id, "a PMIx fence entered twice");
        }
        vec![Act::FenceEntered(data)]
    }

    /// Part of the data of the launched job's PMIx fence, before its completion.
    pub(super) fn fence_part(&mut self, data: &[u8]) {
        if self.entered.is_some() {
            self.fence_out.extend_from_slice(data);
        }
    }

    /// The launched job's PMIx fence is complete, `data` the end of its data: the answer to
    /// the server's fence, if it entered.
    pub(super) fn fence_out(&mut self, data: &[u8]) -> Option<Command> {
        let mut all = std::mem::take(&mut self.fence_out);
        all.extend_from_slice(data);
        let id = self.entered.take()?;
        Some(Command::ModexDone { id, status: wire::SUCCESS, data: all })
    }

    /// A fence over `members` this node entered is complete, with every node's data.
    pub(super) fn group_fence_out(&mut self, members: &[Gid], data: Vec<u8>) -> Option<Command> {
        let Some(id) = self.groups.remove(members) else {
            tracing::warn!(?members, "completion of a PMIx fence this node is not in");
            return None;
        };
        Some(Command::ModexDone { id, status: wire::SUCCESS, data })
    }

    /// Every local process of a fence over `procs` (not the whole launched job) entered it:
    /// the root folds it with the other nodes that host its processes.
    pub(super) fn group_fence(
        &mut self,
        node: NodeId,
        id: u32,
        procs: &[Proc],
        data: Vec<u8>,
    ) -> Vec<Act> {
        let mut members = Vec::new();
        for proc in procs {
            let Some(&Nspace { first, size, .. }) = self.nspaces.get(&proc.nspace) else {
                let text = format!("a fence with {}, a job this node does not know", proc.nspace);
                let (status, data) = (wire::ERR_NOT_SUPPORTED, Vec::new());
                return vec![Act::Notice(text), Act::Host(Command::ModexDone { id, status, data })];
            };
            match proc.rank {
                wire::RANK_WILDCARD => members.extend((first..first + size).map(Gid)),
                rank => members.push(Gid(first + rank)),
            }
        }
        members.sort_unstable();
        members.dedup();
        if let Some(old) = self.groups.insert(members.clone(), id) {
            tracing::warn!(old, id, "a PMIx fence over the same processes entered twice");
        }
        vec![Act::Up(Up::PmixGroupFenceIn { node, members, data })]
    }
}

impl Node {
    /// Every local client entered the launched job's fence (the server waits for its
    /// completion): this node's `data` goes up.
    pub(super) fn pmix_fence_entered(&mut self, data: Vec<u8>) {
        // libpmix completes a node's part without a client whose connection it lost: a rank
        // that died inside the fence. Unless the job goes on without failed ranks, that part
        // stays here: the others would leave the fence without the rank's data, fail on it,
        // and race the true culprit to rlaunch (found by the chaos runner's PMIx ranks, as
        // PMI's fences found it once). The job is ending; its teardown ends the ranks held.
        if !self.job.goes_on && self.pmix_rank_died_connected() {
            return tracing::debug!("a PMIx fence held: a rank here died in it");
        }
        self.fences.enter(rlaunch_protocol::record::now_us());
        let (epoch, node) = (self.pmix.fence.fold.epoch(), self.plan.index);
        for data in in_parts([data], PMIX_FENCE_PART).into_iter().filter(|d| !d.is_empty()) {
            self.pmix_data_up(epoch, &data);
            let _ = self.up.control.send(Up::PmixFencePart { epoch, node, data });
        }
        self.pmix.fence.own_in = true;
        self.pmix.fence.served = true;
        self.pmix_fence_arrive();
    }

    /// A rank of the launched job here died (or is dying) connected to the PMIx server and
    /// not finalized.
    fn pmix_rank_died_connected(&self) -> bool {
        self.ranks.iter().filter(|r| r.job == 0).any(|r| {
            let dead = match r.state {
                RankState::Running => r.pid > 0 && rlaunch_tree::procs::is_exiting(r.pid),
                _ => true,
            };
            dead && self.pmix.left_unfinalized(r.gid)
        })
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
        self.pmix_fence_recount();
    }

    /// Goes up once this node and every child subtree it waits for are in.
    pub(in crate::node) fn pmix_fence_recount(&mut self) {
        let epoch = self.pmix.fence.fold.epoch();
        let parties = 1 + self.children.fence_parties(rlaunch_tree::children::Fence::Pmix, epoch);
        if let Some((epoch, _)) = self.pmix.fence.fold.complete(parties) {
            let served = self.pmix.fence.served;
            if self.adoptable() {
                self.pmix_entry = Some((epoch, served));
            }
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
        // Before the children hear: their data of the next fence may follow at once.
        self.pmix_data_answered();
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
        self.pmix_entry = self.pmix_entry.filter(|(e, _)| *e > epoch);
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::node::pmix::server::tests::{here, host, one, proc, up, JOB};
    use crate::pmix::Event;
    use tokio::time::Instant;

    #[test]
    fn the_whole_jobs_fence_is_answered_with_every_part_and_a_group_fence_goes_to_the_root() {
        let now = Instant::now();
        let mut state = State::new(JOB, 4, now);
        // A part before this node entered is not this node's to keep.
        state.fence_part(b"early");
        let whole = Event::Fence {
            id: 7,
            collect: true,
            procs: vec![proc(JOB, wire::RANK_WILDCARD)],
            data: b"mine".to_vec(),
        };
        match one(state.on_event(whole, &here(true), now)) {
            Act::FenceEntered(data) => assert_eq!(data, b"mine"),
            _ => panic!("not entered"),
        }
        state.fence_part(b"ab");
        let done = state.fence_out(b"cd");
        let data = b"abcd".to_vec();
        assert_eq!(done, Some(Command::ModexDone { id: 7, status: wire::SUCCESS, data }));
        assert_eq!(state.fence_out(b""), None, "answered once");

        let group = Event::Fence {
            id: 8,
            collect: true,
            procs: vec![proc(JOB, 2), proc(JOB, 0), proc(JOB, 2)],
            data: b"g".to_vec(),
        };
        let members = vec![Gid(0), Gid(2)];
        let fence_in = Up::PmixGroupFenceIn { node: NodeId(3), members, data: b"g".to_vec() };
        assert_eq!(up(one(state.on_event(group, &here(true), now))), fence_in);
        let done = state.group_fence_out(&[Gid(0), Gid(2)], b"all".to_vec());
        let data = b"all".to_vec();
        assert_eq!(done, Some(Command::ModexDone { id: 8, status: wire::SUCCESS, data }));
        assert_eq!(state.group_fence_out(&[Gid(0), Gid(2)], vec![]), None);

        let stranger =
            Event::Fence { id: 9, collect: true, procs: vec![proc("nobody", 0)], data: vec![] };
        let acts = state.on_event(stranger, &here(true), now);
        assert!(matches!(&acts[0], Act::Notice(text) if text.contains("nobody")));
        let refused = Command::ModexDone { id: 9, status: wire::ERR_NOT_SUPPORTED, data: vec![] };
        assert_eq!(acts.len(), 2);
        assert_eq!(host(acts.into_iter().nth(1).expect("two")), refused);
    }
}
