//! What the tree carries for ranks' requests beyond their own node: spawned jobs, and another
//! node's PMIx data (direct modex). The requests themselves (spawn, name service) are PMI's:
//! pmi-wire's `services`, re-exported here.

use pmi_wire::services::SpawnRequest;

use crate::ids::{Gid, NodeId};
use serde::{Deserialize, Serialize};

/// A spawned job, as the root hands it to every node: those it places ranks on start them,
/// the others' PMIx servers learn its map, for their ranks that are its parents too.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SpawnJob {
    /// Index of the job (the launched job is 0).
    pub job: u32,
    pub kvsname: String,
    pub parent_kvsname: String,
    /// The nodes that run the job's ranks, each its index in the tree and its host's name,
    /// in the order the job's own node ids count them (its `PMI_process_mapping`, its PMIx
    /// node map).
    pub nodes: Vec<(NodeId, String)>,
    /// Each rank's node: an index into `nodes`.
    pub rank_node: Vec<u32>,
    /// Its `PMI_process_mapping`, if it fits a PMI value.
    pub process_mapping: Option<String>,
    /// Global id of the job's rank 0; rank r is `first: first + r` in every Up and Down frame.
    pub first: u32,
    /// The spawning rank (global id) and the thrid its answer echoes.
    pub parent: Gid,
    pub tag: Option<String>,
    pub request: SpawnRequest,
}

impl SpawnJob {
    pub fn size(&self) -> u32 {
        self.rank_node.len() as u32
    }

    /// The job's own id of tree node `node`, if the job has ranks there.
    pub fn node_id(&self, node: NodeId) -> Option<u32> {
        self.nodes.iter().position(|&(n, _)| n == node).map(|i| i as u32)
    }

    /// The job's ranks on tree node `node`, in order.
    pub fn ranks_on(&self, node: NodeId) -> Vec<u32> {
        let Some(id) = self.node_id(node) else { return Vec::new() };
        (0..self.size()).filter(|&r| self.rank_node[r as usize] == id).collect()
    }

    /// Each run of consecutive global ids on one tree node: (node, ids).
    pub fn runs(&self) -> Vec<(NodeId, std::ops::Range<u32>)> {
        let mut runs: Vec<(NodeId, std::ops::Range<u32>)> = Vec::new();
        for (r, &id) in self.rank_node.iter().enumerate() {
            let (node, gid) = (self.nodes[id as usize].0, self.first + r as u32);
            match runs.last_mut() {
                Some((n, range)) if *n == node && range.end == gid => range.end += 1,
                _ => runs.push((node, gid..gid + 1)),
            }
        }
        runs
    }
}

/// How a spawn went, as the spawning rank hears it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum SpawnOutcome {
    /// Every rank of the new job started: its kvsname (its PMIx namespace).
    Started { kvsname: String },
    /// The job was not started: why, in a sentence the program may print.
    Refused { reason: String },
}

/// A direct modex request: the PMIx server of node `asker` wants what rank `rank` committed
/// (`PMIx_Commit`), because a local client asked for it (`PMIx_Get`) and no fence brought
/// it (Open MPI without `pmix_base_collect_data`, or a spawned job's ranks).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DmodexAsk {
    /// The node that asks, where the answer goes.
    pub asker: NodeId,
    /// The asking server's request id, echoed by the answer.
    pub id: u32,
    /// The rank's global id (first + r for a spawned job's rank r): it routes the request.
    pub rank: Gid,
    /// The rank's namespace and its rank there, as the owning node's server names it.
    pub nspace: String,
    pub nspace_rank: u32,
}

impl DmodexAsk {
    /// The answer to this request when its data will never come.
    pub fn missing(&self) -> DmodexAnswer {
        DmodexAnswer { asker: self.asker, id: self.id, data: DmodexData::Missing }
    }
}

/// The answer to a [`DmodexAsk`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DmodexAnswer {
    pub asker: NodeId,
    pub id: u32,
    pub data: DmodexData,
}

/// What a direct modex request found.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum DmodexData {
    /// The owning server's blob, for the asking server to unpack (opaque to rlaunch).
    Found(Vec<u8>),
    /// The owning server refused, with this PMIx status.
    Refused(i32),
    /// Nothing will ever come: the rank is nowhere in the tree, ended without connecting to
    /// its server, or its node's server is gone.
    Missing,
}
