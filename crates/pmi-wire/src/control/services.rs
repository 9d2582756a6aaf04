//! What ranks ask of the job beyond their own node, carried in Up and Down frames:
//! spawning jobs, fetching another node's PMIx data (direct modex), and the name service.

use serde::{Deserialize, Serialize};

/// What a rank asked to spawn: one command per executable of MPI_Comm_spawn_multiple.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SpawnRequest {
    pub cmds: Vec<SpawnCmd>,
    /// Pairs the new job finds in its KVS from the start (PARENT_ROOT_PORT_NAME).
    pub preput: Vec<(String, String)>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SpawnCmd {
    pub exe: String,
    pub args: Vec<String>,
    pub nprocs: u32,
    /// MPI_Info hints; `wdir` and `path` are honoured.
    pub info: Vec<(String, String)>,
    /// `NAME=value` set for the new ranks on top of the job's environment (a PMIx spawn's
    /// application environment: Open MPI's `OMPI_PARENT_PORT`, for one).
    pub env: Vec<String>,
}

/// A spawned job, as the root hands it to the spawning rank's node.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SpawnJob {
    /// Index of the job (the launched job is 0).
    pub job: u32,
    pub kvsname: String,
    pub parent_kvsname: String,
    /// The node that starts the job's ranks (the spawning rank's).
    pub node: u32,
    /// Global id of the job's rank 0; rank r is `first: first + r` in every Up and Down frame.
    pub first: u32,
    /// The spawning rank (global id) and the thrid its answer echoes.
    pub parent: u32,
    pub tag: Option<String>,
    pub request: SpawnRequest,
}

/// A direct modex request: the PMIx server of node `asker` wants what rank `rank` committed
/// (`PMIx_Commit`), because a local client asked for it (`PMIx_Get`) and no fence brought
/// it (Open MPI without `pmix_base_collect_data`, or a spawned job's ranks).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DmodexAsk {
    /// The node that asks, where the answer goes.
    pub asker: u32,
    /// The asking server's request id, echoed by the answer.
    pub id: u32,
    /// The rank's global id (first + r for a spawned job's rank r): it routes the request.
    pub rank: u32,
    /// The rank's namespace and its rank there, as the owning node's server names it.
    pub nspace: String,
    pub nspace_rank: u32,
}

/// The answer to a [`DmodexAsk`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DmodexAnswer {
    pub asker: u32,
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

/// A name-service request (MPI_Publish_name and friends).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum NameOp {
    /// `once`: withdrawn by the first lookup that finds it (PMIx's `PMIX_PERSIST_FIRST_READ`,
    /// which Open MPI's connect/accept exchanges ask for).
    Publish {
        service: String,
        value: NameValue,
        once: bool,
    },
    Unpublish {
        service: String,
    },
    Lookup {
        service: String,
        wait: LookupWait,
    },
}

/// A published value.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum NameValue {
    /// A port name (PMI), or a PMIx string.
    Text(String),
    /// A PMIx value of any other type, packed by the PMIx server that published it, for a
    /// PMIx server to unpack: opaque to rlaunch, and carried whole.
    Packed(Vec<u8>),
}

/// How long a lookup waits for its service to be published.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum LookupWait {
    /// Not at all: PMI's lookups, and PMIx's without `PMIX_WAIT`.
    No,
    /// Up to this long (PMIx's `PMIX_TIMEOUT`).
    For { ms: u64 },
    /// Until the job ends.
    UntilJobEnd,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum NameAnswer {
    /// Publish: false when the service was already published.
    Published(bool),
    /// Unpublish: false when there was no such service.
    Unpublished(bool),
    /// Lookup: `None` when the service is not published (or was not within the wait).
    Lookup(Option<NameValue>),
}
