//! The messages between a proxy and its PMIx host process (`pmix/host.c`), and their codec.
//! A message is a little-endian u32 length, a tag byte, then fields: u32/i32 little-endian,
//! strings and blobs as a u32 length and the bytes. Pure: no I/O.
//!
//! ```text
//!   proxy ──Command──► host: Setup, Clients, ModexDone, OpDone, LookupDone, SpawnDone,
//!                            DmodexAsk, Sync, Dead
//!   proxy ◄──Event──── host: Ready, Env, Fence, Abort, Publish, Lookup, Spawn, Dmodex,
//!                            DmodexData, ...
//! ```
//!
//! A node's server serves the launched job's namespace and one more per job its ranks
//! spawned here: events name the process by namespace and rank ([`Proc`]).
//! Published values are strings, or any other PMIx value packed by the host
//! (`PMIx_Data_pack`) and unpacked by the host that looks it up.

use rlaunch_protocol::control::{LookupWait, NameValue};

/// A PMIx status: 0 is success, negative values are PMIx's error codes.
pub type Status = i32;

pub const SUCCESS: Status = 0;
pub const ERR_NOT_FOUND: Status = -46;
pub const ERR_NOT_SUPPORTED: Status = -47;
pub const ERR_DUPLICATE_KEY: Status = -53;
pub const ERR_BAD_PARAM: Status = -27;

/// PMIx's rank for every process of a namespace.
pub const RANK_WILDCARD: u32 = u32::MAX - 1;

/// Proxy to host.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Command {
    /// Register a job's namespace (this is node `node` of `hosts`, or none of them) and
    /// define its process sets. The launched job's comes first; a `spawned` job's
    /// (MPI_Comm_spawn) is registered beside it, on its own node and on the others, whose
    /// ranks may connect to it.
    Setup {
        nspace: String,
        jobid: String,
        /// `None`: the job has no rank on this node.
        node: Option<u32>,
        hosts: Vec<String>,
        rank_node: Vec<u32>,
        rank_app: Vec<u32>,
        psets: Vec<(String, Vec<u32>)>,
        spawned: bool,
    },
    /// Register these local ranks of `nspace` as clients and answer each with its
    /// environment.
    Clients { nspace: String, uid: u32, gid: u32, ranks: Vec<u32> },
    /// A fence the host entered (its `id`) is complete with every node's data, or a direct
    /// modex request is answered.
    ModexDone { id: u32, status: Status, data: Vec<u8> },
    /// An abort, publish or unpublish is done.
    OpDone { id: u32, status: Status },
    /// A lookup is done: (key, value, publisher's rank) found.
    LookupDone { id: u32, status: Status, found: Vec<(String, NameValue, u32)> },
    /// A spawn is done: its job's namespace, whose ranks are started.
    SpawnDone { id: u32, status: Status, nspace: String },
    /// Answer `Synced { id }` after every event sent before: a barrier on the link.
    Sync { id: u32 },
    /// Another node wants what a local client committed: answered by
    /// [`Event::DmodexData`] with the same `id`.
    DmodexAsk { id: u32, nspace: String, rank: u32 },
    /// These ranks of `nspace` failed and the job goes on (`--on-failure continue`): each
    /// local client with a handler for `PMIX_ERR_PROC_ABORTED` is told, one event a rank.
    Dead { nspace: String, ranks: Vec<u32> },
}

/// A client of the server: its namespace and its rank there.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Proc {
    pub nspace: String,
    pub rank: u32,
}

/// One application of a spawn request (`pmix_app_t`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct App {
    pub cmd: String,
    /// Its whole argv, the program's name first.
    pub argv: Vec<String>,
    /// `NAME=value` for its processes (Open MPI's `OMPI_PARENT_PORT`).
    pub env: Vec<String>,
    pub maxprocs: u32,
    /// Its string-valued directives (`pmix.wdir`, `pmix.prefix`, ...).
    pub info: Vec<(String, String)>,
}

/// Host to proxy.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Event {
    /// The server is up; libpmix's version string.
    Ready {
        version: String,
    },
    /// The server cannot serve the job; why.
    Failed {
        why: String,
    },
    /// A spawned job's namespace is registered, or the status that kept it from it. (The
    /// launched job's failure is [`Event::Failed`].)
    SetupDone {
        nspace: String,
        status: Status,
    },
    /// A rank's environment from `PMIx_server_setup_fork` (`NAME=value` each), or the
    /// status that kept it from one.
    Env {
        nspace: String,
        rank: u32,
        status: Status,
        vars: Vec<Vec<u8>>,
    },
    /// Every local process of a fence over `procs` entered it (`RANK_WILDCARD`: every rank of
    /// its namespace); `data` is this node's share.
    Fence {
        id: u32,
        collect: bool,
        procs: Vec<Proc>,
        data: Vec<u8>,
    },
    /// A rank called `PMIx_Abort`.
    Abort {
        id: u32,
        proc: Proc,
        status: i32,
        msg: String,
    },
    /// `once`: for the first lookup only (`PMIX_PERSIST_FIRST_READ`).
    Publish {
        id: u32,
        proc: Proc,
        once: bool,
        pairs: Vec<(String, NameValue)>,
    },
    Lookup {
        id: u32,
        proc: Proc,
        wait: LookupWait,
        keys: Vec<String>,
    },
    Unpublish {
        id: u32,
        proc: Proc,
        keys: Vec<String>,
    },
    Connected {
        proc: Proc,
    },
    Finalized {
        proc: Proc,
    },
    /// A rank called `PMIx_Spawn` (MPI_Comm_spawn).
    Spawn {
        id: u32,
        proc: Proc,
        apps: Vec<App>,
    },
    /// libpmix wants a rank's data from the node that owns it (direct modex); answered by
    /// [`Command::ModexDone`] with the same `id`.
    Dmodex {
        id: u32,
        proc: Proc,
    },
    /// The answer to [`Command::DmodexAsk`]: the local client's data, or the status that
    /// kept the server from it.
    DmodexData {
        id: u32,
        status: Status,
        data: Vec<u8>,
    },
    /// Something worth a line in the log.
    Notice {
        text: String,
    },
    /// The answer to [`Command::Sync`]: every event before it has been read.
    Synced {
        id: u32,
    },
    /// libpmix lost this client's connection without its finalize; in the order it lost
    /// them.
    Lost {
        proc: Proc,
    },
}

/// Why a message from the host cannot be read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum WireError {
    #[error("a message from the PMIx host is cut short")]
    Short,
    #[error("unknown message {0} from the PMIx host")]
    UnknownTag(u8),
    #[error("a value of unknown kind {0} from the PMIx host")]
    UnknownValue(u32),
}

/// [`Command::Setup`]'s node for a job with no rank on this node.
const NOT_HERE: u32 = u32::MAX;

/// The most data one message carries (a fence's, every node's, for the server to hand its
/// clients whole): the control protocol's limit of a PMIx fence.
pub const MAX_DATA: usize = rlaunch_protocol::control::PMIX_FENCE_MAX;

/// Longest message either side accepts: `MAX_DATA` and room for the fields around it.
pub const MAX_MESSAGE: usize = MAX_DATA + (64 << 10);

/// How a published value travels: a string, or a `pmix_value_t` packed by `PMIx_Data_pack`.
const VALUE_TEXT: u32 = 0;
const VALUE_PACKED: u32 = 1;

struct Out(Vec<u8>);

impl Out {
    fn new(tag: u8) -> Out {
        Out(vec![0, 0, 0, 0, tag])
    }
    fn u32(&mut self, v: u32) {
        self.0.extend_from_slice(&v.to_le_bytes());
    }
    fn i32(&mut self, v: i32) {
        self.0.extend_from_slice(&v.to_le_bytes());
    }
    fn bytes(&mut self, b: &[u8]) {
        self.u32(b.len() as u32);
        self.0.extend_from_slice(b);
    }
    fn str(&mut self, s: &str) {
        self.bytes(s.as_bytes());
    }
    fn value(&mut self, v: &NameValue) {
        match v {
            NameValue::Text(text) => {
                self.u32(VALUE_TEXT);
                self.str(text);
            }
            NameValue::Packed(packed) => {
                self.u32(VALUE_PACKED);
                self.bytes(packed);
            }
        }
    }
    fn done(mut self) -> Vec<u8> {
        let len = (self.0.len() - 4) as u32;
        self.0[..4].copy_from_slice(&len.to_le_bytes());
        self.0
    }
}

impl Command {
    /// The message, length prefix included.
    pub fn encode(&self) -> Vec<u8> {
        match self {
            Command::Setup { nspace, jobid, node, hosts, rank_node, rank_app, psets, spawned } => {
                let mut o = Out::new(1);
                o.u32(u32::from(*spawned));
                o.str(nspace);
                o.str(jobid);
                o.u32(rank_node.len() as u32);
                o.u32(node.unwrap_or(NOT_HERE));
                o.u32(hosts.len() as u32);
                hosts.iter().for_each(|h| o.str(h));
                rank_node.iter().for_each(|n| o.u32(*n));
                rank_app.iter().for_each(|a| o.u32(*a));
                o.u32(psets.len() as u32);
                for (name, members) in psets {
                    o.str(name);
                    o.u32(members.len() as u32);
                    members.iter().for_each(|m| o.u32(*m));
                }
                o.done()
            }
            Command::Clients { nspace, uid, gid, ranks } => {
                let mut o = Out::new(2);
                o.str(nspace);
                o.u32(*uid);
                o.u32(*gid);
                o.u32(ranks.len() as u32);
                ranks.iter().for_each(|r| o.u32(*r));
                o.done()
            }
            Command::ModexDone { id, status, data } => {
                let mut o = Out::new(3);
                o.u32(*id);
                o.i32(*status);
                o.bytes(data);
                o.done()
            }
            Command::OpDone { id, status } => {
                let mut o = Out::new(4);
                o.u32(*id);
                o.i32(*status);
                o.done()
            }
            Command::LookupDone { id, status, found } => {
                let mut o = Out::new(5);
                o.u32(*id);
                o.i32(*status);
                o.u32(found.len() as u32);
                for (key, value, rank) in found {
                    o.str(key);
                    o.value(value);
                    o.u32(*rank);
                }
                o.done()
            }
            Command::SpawnDone { id, status, nspace } => {
                let mut o = Out::new(8);
                o.u32(*id);
                o.i32(*status);
                o.str(nspace);
                o.done()
            }
            Command::Sync { id } => {
                let mut o = Out::new(9);
                o.u32(*id);
                o.done()
            }
            Command::DmodexAsk { id, nspace, rank } => {
                let mut o = Out::new(7);
                o.u32(*id);
                o.str(nspace);
                o.u32(*rank);
                o.done()
            }
            Command::Dead { nspace, ranks } => {
                let mut o = Out::new(10);
                o.str(nspace);
                o.u32(ranks.len() as u32);
                ranks.iter().for_each(|r| o.u32(*r));
                o.done()
            }
        }
    }
}

struct In<'a>(&'a [u8]);

impl In<'_> {
    fn u32(&mut self) -> Result<u32, WireError> {
        let (head, rest) = self.0.split_first_chunk::<4>().ok_or(WireError::Short)?;
        self.0 = rest;
        Ok(u32::from_le_bytes(*head))
    }
    fn i32(&mut self) -> Result<i32, WireError> {
        self.u32().map(|v| v as i32)
    }
    fn bytes(&mut self) -> Result<Vec<u8>, WireError> {
        let n = self.u32()? as usize;
        if self.0.len() < n {
            return Err(WireError::Short);
        }
        let (head, rest) = self.0.split_at(n);
        self.0 = rest;
        Ok(head.to_vec())
    }
    fn str(&mut self) -> Result<String, WireError> {
        Ok(String::from_utf8_lossy(&self.bytes()?).into_owned())
    }
    /// A count of items that each take at least `min` bytes, checked against what is left.
    fn count(&mut self, min: usize) -> Result<usize, WireError> {
        let n = self.u32()? as usize;
        if n.saturating_mul(min) > self.0.len() {
            return Err(WireError::Short);
        }
        Ok(n)
    }
    fn strs(&mut self) -> Result<Vec<String>, WireError> {
        let n = self.count(4)?;
        (0..n).map(|_| self.str()).collect()
    }
    fn proc(&mut self) -> Result<Proc, WireError> {
        Ok(Proc { nspace: self.str()?, rank: self.u32()? })
    }
    fn value(&mut self) -> Result<NameValue, WireError> {
        match self.u32()? {
            VALUE_TEXT => Ok(NameValue::Text(self.str()?)),
            VALUE_PACKED => Ok(NameValue::Packed(self.bytes()?)),
            other => Err(WireError::UnknownValue(other)),
        }
    }
    /// A lookup's `PMIX_WAIT` and `PMIX_TIMEOUT` (seconds, 0 for none).
    fn wait(&mut self) -> Result<LookupWait, WireError> {
        let (wait, secs) = (self.u32()? != 0, self.u32()?);
        Ok(match (wait, secs) {
            (false, _) => LookupWait::No,
            (true, 0) => LookupWait::UntilJobEnd,
            (true, secs) => LookupWait::For { ms: u64::from(secs) * 1000 },
        })
    }
    fn app(&mut self) -> Result<App, WireError> {
        let cmd = self.str()?;
        let argv = self.strs()?;
        let env = self.strs()?;
        let maxprocs = self.u32()?;
        let n = self.count(8)?;
        let info = (0..n).map(|_| Ok((self.str()?, self.str()?))).collect::<Result<_, _>>()?;
        Ok(App { cmd, argv, env, maxprocs, info })
    }
}

impl Event {
    /// Decodes one message body (after the length prefix).
    pub fn decode(body: &[u8]) -> Result<Event, WireError> {
        let (&tag, rest) = body.split_first().ok_or(WireError::Short)?;
        let mut i = In(rest);
        Ok(match tag {
            101 => Event::Ready { version: i.str()? },
            102 => Event::Failed { why: i.str()? },
            103 => {
                let nspace = i.str()?;
                let rank = i.u32()?;
                let status = i.i32()?;
                let n = i.count(4)?;
                let vars = (0..n).map(|_| i.bytes()).collect::<Result<_, _>>()?;
                Event::Env { nspace, rank, status, vars }
            }
            104 => {
                let (id, collect) = (i.u32()?, i.u32()? != 0);
                let n = i.count(8)?;
                let procs = (0..n).map(|_| i.proc()).collect::<Result<_, _>>()?;
                Event::Fence { id, collect, procs, data: i.bytes()? }
            }
            105 => Event::Abort { id: i.u32()?, proc: i.proc()?, status: i.i32()?, msg: i.str()? },
            106 => {
                let (id, proc, once) = (i.u32()?, i.proc()?, i.u32()? != 0);
                let n = i.count(12)?;
                let pairs = (0..n).map(|_| Ok((i.str()?, i.value()?))).collect::<Result<_, _>>()?;
                Event::Publish { id, proc, once, pairs }
            }
            107 => {
                Event::Lookup { id: i.u32()?, proc: i.proc()?, wait: i.wait()?, keys: i.strs()? }
            }
            108 => Event::Unpublish { id: i.u32()?, proc: i.proc()?, keys: i.strs()? },
            109 => Event::Connected { proc: i.proc()? },
            110 => Event::Finalized { proc: i.proc()? },
            111 => Event::Dmodex { id: i.u32()?, proc: i.proc()? },
            112 => Event::DmodexData { id: i.u32()?, status: i.i32()?, data: i.bytes()? },
            113 => Event::Notice { text: i.str()? },
            116 => Event::Synced { id: i.u32()? },
            117 => Event::Lost { proc: i.proc()? },
            114 => Event::SetupDone { nspace: i.str()?, status: i.i32()? },
            115 => {
                let (id, proc) = (i.u32()?, i.proc()?);
                let n = i.count(20)?;
                let apps = (0..n).map(|_| i.app()).collect::<Result<_, _>>()?;
                Event::Spawn { id, proc, apps }
            }
            other => return Err(WireError::UnknownTag(other)),
        })
    }
}

#[cfg(test)]
mod tests;
