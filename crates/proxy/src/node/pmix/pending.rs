//! What the node's PMIx server holds open while the answer comes from elsewhere: other
//! nodes' direct modex requests it is answering ([`Asks`], see `dmodex`), and jobs spawned
//! here whose ranks wait for their environments ([`Spawning`], see `spawn`). The server's
//! [`State`](super::server::State) keeps them; the topics' files act on them.

use rlaunch_protocol::control::{DmodexAsk, Job};
use rlaunch_protocol::ids::Gid;
use std::collections::HashMap;

use crate::node::JobRanks;
use crate::pmix::wire;

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

/// A spawned job between its registration with the server and the start of its ranks here.
pub(in crate::node) struct Spawning {
    pub(super) nspace: String,
    pub(super) job: Job,
    pub(super) index: u32,
    pub(super) ranks: JobRanks,
    pub(super) registration: Registration,
}

/// How a spawned job's registration with the server goes: ready once every rank's
/// environment is in, failed if the server could not take the job or one of its ranks.
#[derive(Debug)]
pub(super) struct Registration {
    ranks: usize,
    envs: usize,
    /// The first status that kept the server from the job.
    failed: Option<wire::Status>,
}

#[derive(Debug, PartialEq, Eq)]
pub(super) enum Registered {
    Waiting,
    Ready,
    Failed(wire::Status),
}

impl Registration {
    pub(super) fn new(ranks: usize) -> Registration {
        Registration { ranks, envs: 0, failed: None }
    }

    /// The server registered the job's namespace, or could not (`status`).
    pub(super) fn namespace(&mut self, status: wire::Status) {
        if status != wire::SUCCESS {
            self.failed.get_or_insert(status);
        }
    }

    /// A rank's environment is in, or the status that kept the server from it.
    pub(super) fn env(&mut self, status: wire::Status) -> Registered {
        self.envs += 1;
        if status != wire::SUCCESS {
            self.failed.get_or_insert(status);
        }
        match self.failed {
            _ if self.envs < self.ranks => Registered::Waiting,
            None => Registered::Ready,
            Some(status) => Registered::Failed(status),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ask(rank: u32, id: u32) -> DmodexAsk {
        let asker = rlaunch_protocol::ids::NodeId(0);
        DmodexAsk { asker, id, rank: Gid(rank), nspace: "job".into(), nspace_rank: rank }
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
    fn a_spawned_job_is_ready_once_every_environment_is_in_unless_the_server_refused_it() {
        let mut fine = Registration::new(2);
        fine.namespace(wire::SUCCESS);
        assert_eq!(fine.env(wire::SUCCESS), Registered::Waiting);
        assert_eq!(fine.env(wire::SUCCESS), Registered::Ready);
        // The namespace refused: the ranks' environments still come (failed), then the
        // spawner hears the first status.
        let mut refused = Registration::new(2);
        refused.namespace(wire::ERR_BAD_PARAM);
        assert_eq!(refused.env(wire::ERR_NOT_FOUND), Registered::Waiting);
        assert_eq!(refused.env(wire::ERR_NOT_FOUND), Registered::Failed(wire::ERR_BAD_PARAM));
        // One rank without an environment fails the job too.
        let mut rank = Registration::new(2);
        rank.namespace(wire::SUCCESS);
        assert_eq!(rank.env(wire::ERR_NOT_FOUND), Registered::Waiting);
        assert_eq!(rank.env(wire::SUCCESS), Registered::Failed(wire::ERR_NOT_FOUND));
    }
}
