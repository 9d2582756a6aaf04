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

use rlaunch_protocol::ids::{Gid, NodeId};

use rlaunch_protocol::control::{DmodexAnswer, DmodexAsk, DmodexData, Down, Up};

use super::server::{Act, State};
use crate::node::Node;
use crate::pmix::wire::{self, Proc, Status};
use crate::pmix::Command;
use crate::ranks::RankState;

/// The PMIx status a server's direct modex callback gets for what was found.
pub(super) fn status_of(data: DmodexData) -> (Status, Vec<u8>) {
    match data {
        DmodexData::Found(blob) => (wire::SUCCESS, blob),
        DmodexData::Refused(status) => (status, Vec::new()),
        DmodexData::Missing => (wire::ERR_NOT_FOUND, Vec::new()),
    }
}

impl State {
    /// The server wants `proc`'s data: the node that owns it is asked, through the root.
    pub(super) fn dmodex_request(&mut self, node: NodeId, id: u32, proc: Proc) -> Vec<Act> {
        let Some(rank) = self.gid(&proc) else {
            let (status, data) = status_of(DmodexData::Missing);
            return vec![Act::Host(Command::ModexDone { id, status, data })];
        };
        tracing::debug!(nspace = %proc.nspace, rank = proc.rank, "direct modex request");
        let (nspace, nspace_rank) = (proc.nspace, proc.rank);
        let ask = DmodexAsk { asker: node, id, rank, nspace, nspace_rank };
        vec![Act::Up(Up::DmodexAsk(ask))]
    }

    /// The server answered request `id` of another node.
    pub(super) fn dmodex_data(&mut self, id: u32, status: Status, data: Vec<u8>) -> Vec<Act> {
        let Some(ask) = self.asks.take(id) else {
            tracing::warn!(id, "a direct modex answer to no request");
            return vec![];
        };
        let data = match status {
            wire::SUCCESS => DmodexData::Found(data),
            status => DmodexData::Refused(status),
        };
        vec![Act::Up(Up::DmodexAnswer(DmodexAnswer { asker: ask.asker, id: ask.id, data }))]
    }

    /// Another node asks for local rank `ask.rank`'s data; `ended`: the rank is no longer
    /// running. One that ended without connecting committed nothing: missing at once.
    pub(super) fn dmodex_ask(&mut self, ask: DmodexAsk, ended: bool) -> Act {
        if ended && !self.connected(ask.rank) {
            return Act::Up(missing(ask));
        }
        let (nspace, rank) = (ask.nspace.clone(), ask.nspace_rank);
        let id = self.asks.add(ask);
        Act::Host(Command::DmodexAsk { id, nspace, rank })
    }

    /// A local rank ended: if it never connected, it committed nothing, and the requests
    /// for its data will never be answered by the server.
    pub(super) fn dmodex_rank_ended(&mut self, rank: Gid) -> Vec<Up> {
        if self.connected(rank) {
            return Vec::new();
        }
        self.asks.take_for(rank).into_iter().map(missing).collect()
    }

    /// The server is gone: what it did not answer of other nodes' requests, it never will.
    pub(super) fn unanswered(&mut self) -> Vec<Up> {
        std::mem::take(&mut self.asks).into_open().map(missing).collect()
    }
}

/// The answer to a request for data that will never come.
pub(super) fn missing(ask: DmodexAsk) -> Up {
    Up::DmodexAnswer(ask.missing())
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
        if self.adoptable() && self.asks_out.remove(&answer.id).is_none() {
            // Asked again after an adoption, and answered twice.
            return tracing::debug!(id = answer.id, "a second answer to a direct modex request");
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
        if self.children.answered(&answer) != rlaunch_tree::children::Answered::AskedAgain {
            self.dmodex_up(answer);
        }
    }

    /// Requests sent to a child that finished or was lost without answering them fail now,
    /// rather than leave their rank waiting (the root does the same for its children).
    pub(in crate::node) fn dmodex_unanswerable(&mut self) {
        for ask in self.children.unanswerable() {
            let _ = self.up.control.send(missing(ask));
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
    fn what_was_found_becomes_the_servers_status() {
        assert_eq!(status_of(DmodexData::Found(vec![1])), (wire::SUCCESS, vec![1]));
        assert_eq!(status_of(DmodexData::Refused(-25)), (-25, vec![]));
        assert_eq!(status_of(DmodexData::Missing), (wire::ERR_NOT_FOUND, vec![]));
    }

    #[test]
    fn direct_modex_asks_go_up_and_what_the_server_cannot_answer_is_missing() {
        let now = Instant::now();
        let mut state = State::new(JOB, 4, now);
        let unknown = Event::Dmodex { id: 1, proc: proc("nobody", 0) };
        let not_found = Command::ModexDone { id: 1, status: wire::ERR_NOT_FOUND, data: vec![] };
        assert_eq!(host(one(state.on_event(unknown, &here(true), now))), not_found);
        let known = Event::Dmodex { id: 2, proc: proc(JOB, 3) };
        let Up::DmodexAsk(ask) = up(one(state.on_event(known, &here(true), now))) else {
            panic!("not asked")
        };
        assert_eq!((ask.asker, ask.id, ask.rank, ask.nspace_rank), (NodeId(3), 2, Gid(3), 3));

        // Another node's request for local rank 1: the server is asked, and its answer goes up.
        let ask = |rank, id| DmodexAsk {
            asker: NodeId(0),
            id,
            rank: Gid(rank),
            nspace: JOB.into(),
            nspace_rank: rank,
        };
        let Command::DmodexAsk { id, nspace, rank } = host(state.dmodex_ask(ask(1, 10), false))
        else {
            panic!("the server is not asked")
        };
        assert_eq!((nspace.as_str(), rank), (JOB, 1));
        let data = Event::DmodexData { id, status: wire::SUCCESS, data: b"d".to_vec() };
        let answer =
            DmodexAnswer { asker: NodeId(0), id: 10, data: DmodexData::Found(b"d".into()) };
        assert_eq!(up(one(state.on_event(data, &here(true), now))), Up::DmodexAnswer(answer));
        let again = Event::DmodexData { id, status: wire::SUCCESS, data: vec![] };
        assert!(state.on_event(again, &here(true), now).is_empty(), "answered once");

        // A rank that ended without connecting committed nothing; nor will a server that went.
        let missing =
            |id| Up::DmodexAnswer(DmodexAnswer { asker: NodeId(0), id, data: DmodexData::Missing });
        assert_eq!(up(state.dmodex_ask(ask(2, 11), true)), missing(11));
        assert!(matches!(state.dmodex_ask(ask(2, 12), false), Act::Host(_)));
        assert!(matches!(state.dmodex_ask(ask(0, 13), false), Act::Host(_)));
        assert_eq!(state.dmodex_rank_ended(Gid(2)), vec![missing(12)]);
        assert_eq!(state.unanswered(), vec![missing(13)]);
        assert!(state.unanswered().is_empty());
    }
}
