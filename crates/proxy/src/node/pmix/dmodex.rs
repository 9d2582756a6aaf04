//! Direct modex: a rank's data fetched from the node that owns it, when a client asks for it
//! (`PMIx_Get`) and no fence brought it here (Open MPI with `pmix_base_collect_data=0`, whose
//! MPI_Init fence collects nothing, or the ranks of a job spawned on another node).
//!
//! ```text
//!  asking node:  host ──Dmodex(id, proc)──► Up::DmodexAsk ──► root ──► toward the rank
//!  owning node:  Down::DmodexAsk ──DmodexAsk(ask id)──► host ──DmodexData──► Up::DmodexAnswer
//!  asking node:  root ──► Down::DmodexAnswer ──ModexDone(id, blob)──► host ──► the client
//! ```
//!
//! libpmix on the owning node answers once the rank has committed its data. No request
//! outlives the rank it waits for: the owning node answers `Missing` for a rank that ended
//! without ever connecting to its server (it can commit nothing), and for every request still
//! open when its server goes; the root and interior proxies answer `Missing` for a rank they
//! cannot route to (a finished or lost subtree).

use rlaunch_protocol::ids::Gid;
use std::collections::HashMap;

use rlaunch_protocol::control::{DmodexAnswer, DmodexAsk, DmodexData, Down, Up};

use super::server::{missing, Act};
use crate::node::Node;
use crate::pmix::wire::{self, Status};
use crate::pmix::Command;
use crate::ranks::RankState;

/// Requests of other nodes this node's server is answering, by the id the host echoes.
#[derive(Default)]
pub(super) struct Asks {
    next: u32,
    open: HashMap<u32, DmodexAsk>,
}

impl Asks {
    pub(super) fn add(&mut self, ask: DmodexAsk) -> u32 {
        let id = self.next;
        self.next = self.next.wrapping_add(1);
        self.open.insert(id, ask);
        id
    }

    /// The request the host answered with `id`.
    pub(super) fn take(&mut self, id: u32) -> Option<DmodexAsk> {
        self.open.remove(&id)
    }

    /// Takes the open requests for `rank` (a global id).
    pub(super) fn take_for(&mut self, rank: Gid) -> Vec<DmodexAsk> {
        let ids: Vec<u32> =
            self.open.iter().filter(|(_, a)| a.rank == rank).map(|(&id, _)| id).collect();
        ids.into_iter().filter_map(|id| self.open.remove(&id)).collect()
    }

    /// Every request still open.
    pub(super) fn into_open(self) -> impl Iterator<Item = DmodexAsk> {
        self.open.into_values()
    }
}

/// The PMIx status a server's direct modex callback gets for what was found.
pub(super) fn status_of(data: DmodexData) -> (Status, Vec<u8>) {
    match data {
        DmodexData::Found(blob) => (wire::SUCCESS, blob),
        DmodexData::Refused(status) => (status, Vec::new()),
        DmodexData::Missing => (wire::ERR_NOT_FOUND, Vec::new()),
    }
}

impl Node {
    /// A request from the root: served here if the rank is this node's, else routed on
    /// toward it.
    pub(in crate::node) fn dmodex_ask(&mut self, ask: DmodexAsk) {
        if self.children.holds_rank(ask.rank) {
            if !self.children.send_ask(ask.clone()) {
                let _ = self.up.control.send(missing(ask));
            }
            return;
        }
        let ended = self.ranks.find(ask.rank).is_some_and(|r| r.state != RankState::Running);
        let act = match self.pmix.server.as_mut() {
            Some(pmix) => pmix.state.dmodex_ask(ask, ended),
            None => Act::Up(missing(ask)),
        };
        self.pmix_act(act);
    }

    /// An answer from the root: this node's server's, or routed on toward the asker.
    pub(in crate::node) fn dmodex_answer(&mut self, answer: DmodexAnswer) {
        if answer.asker != self.plan.index {
            let asker = answer.asker;
            if !self.children.send_toward_node(asker, Down::DmodexAnswer(answer)) {
                tracing::debug!(%asker, "a direct modex answer for a node that is gone");
            }
            return;
        }
        let (status, data) = status_of(answer.data);
        self.pmix_command(Command::ModexDone { id: answer.id, status, data });
    }

    /// A local rank ended: the requests for its data the server will never answer fail.
    pub(in crate::node) fn dmodex_rank_ended(&mut self, rank: Gid) {
        let Some(pmix) = self.pmix.server.as_mut() else { return };
        for answer in pmix.state.dmodex_rank_ended(rank) {
            let _ = self.up.control.send(answer);
        }
    }

    fn dmodex_up(&self, answer: DmodexAnswer) {
        let _ = self.up.control.send(Up::DmodexAnswer(answer));
    }

    /// A child's answer to a request sent down goes up, the request settled.
    pub(in crate::node) fn dmodex_child_answer(&mut self, answer: DmodexAnswer) {
        self.children.answered(answer.asker, answer.id);
        self.dmodex_up(answer);
    }

    /// Requests sent to a child that finished or was lost without answering them fail now,
    /// rather than leave their rank waiting (the root does the same for its children).
    pub(in crate::node) fn dmodex_unanswerable(&mut self) {
        for answer in self.children.unanswerable() {
            self.dmodex_up(answer);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ask(rank: u32, id: u32) -> DmodexAsk {
        let (rank, nspace_rank) = (Gid(rank), rank);
        DmodexAsk {
            asker: rlaunch_protocol::ids::NodeId(0),
            id,
            rank,
            nspace: "job".into(),
            nspace_rank,
        }
    }

    #[test]
    fn open_requests_are_taken_by_their_rank() {
        let mut asks = Asks::default();
        let a = asks.add(ask(1, 10));
        let b = asks.add(ask(2, 11));
        let c = asks.add(ask(1, 12));
        assert_eq!(vec![a, b, c], vec![0, 1, 2]);
        let mut taken: Vec<u32> = asks.take_for(Gid(1)).into_iter().map(|a| a.id).collect();
        taken.sort();
        assert_eq!(taken, vec![10, 12]);
        assert!(asks.take_for(Gid(1)).is_empty());
        assert_eq!(asks.open.keys().copied().collect::<Vec<_>>(), vec![b]);
    }

    #[test]
    fn what_was_found_becomes_the_servers_status() {
        assert_eq!(status_of(DmodexData::Found(vec![1])), (wire::SUCCESS, vec![1]));
        assert_eq!(status_of(DmodexData::Refused(-25)), (-25, vec![]));
        assert_eq!(status_of(DmodexData::Missing), (wire::ERR_NOT_FOUND, vec![]));
    }
}
