//! What a rank asks of the job beyond the PMI key-value space, in either protocol: to spawn
//! a job, and the name service. The control protocol (rlaunch-protocol) carries these to the
//! root and back.

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
    /// MPI_Info hints: `host`, `hostfile`, `add-host`, `add-hostfile` and `map-by` place
    /// the ranks (at the root), `wdir` and `path` start them (at their nodes).
    pub info: Vec<(String, String)>,
    /// `NAME=value` set for the new ranks on top of the job's environment (a PMIx spawn's
    /// application environment: Open MPI's `OMPI_PARENT_PORT`, for one).
    pub env: Vec<String>,
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
