//! What a rank asks, whichever protocol it speaks (docs/pmi.md, *PMI-1* and *PMI-2*).
//!
//! ```text
//!  pmi1::Request ──Message::from_pmi1──┐   (spawn blocks gathered in SpawnBlocks)
//!                                      ├──► Message::{Init, InitAck, Request(Envelope), Unknown}
//!  pmi2::Envelope ─Message::from_pmi2──┘                          │
//!                                          protocol + thrid + Request
//! ```
//!
//! The server answers a [`Request`] with a [`crate::reply::Reply`], worded in the protocol of
//! the [`Envelope`]. Name-service and spawn requests of both protocols become the control
//! channel's [`NameOp`] and [`SpawnRequest`], so that a proxy forwards them unchanged.
//!
//! PMI-1 sends `MPI_Comm_spawn_multiple` as one `mcmd=spawn` block per executable, each a
//! message of its own; PMI-2 sends one frame. The blocks received so far are per-connection
//! state, so they live in a [`SpawnBlocks`] that the connection owns, next to its byte
//! buffer: both hold a message that has only partly arrived. The mapping stays pure and
//! yields a spawn only once it is whole.

use crate::pmi1;
use crate::pmi2;
pub use crate::pmi2::Protocol;
use crate::services::{LookupWait, NameOp, NameValue, SpawnCmd, SpawnRequest};

/// One message from a rank, as far as the protocol goes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Message {
    /// `cmd=init`, the opening line of both protocols: the version the rank asks for.
    Init {
        version: u32,
        subversion: u32,
    },
    /// `cmd=initack`, the `-pmi-port` handshake: which rank the connection belongs to.
    InitAck {
        pmiid: u32,
    },
    Request(Envelope),
    /// A well-formed message with a command nobody serves; `text` is the message as sent
    /// (without a PMI-1 final newline, or the PMI-2 body), to be named in the error.
    Unknown {
        protocol: Protocol,
        cmd: String,
        text: String,
    },
}

/// A request with what its reply needs: the protocol to word it in and the tag to echo.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Envelope {
    pub protocol: Protocol,
    /// The PMI-2 `thrid` of a threaded client; `None` in PMI-1.
    pub tag: Option<String>,
    pub request: Request,
}

/// A request of either protocol. Fields a server has no use for (the `fullinit` rank hint,
/// `srcid`, name-service info keys, `job-connect` ids) are dropped.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Request {
    /// PMI-2 `fullinit`: rank, size, appnum and parent in one answer.
    FullInit,
    /// PMI-1 `get_maxes`.
    GetMaxes,
    /// PMI-1 `get_appnum`.
    GetAppnum,
    /// PMI-1 `get_my_kvsname`, PMI-2 `job-getid`.
    GetKvsname,
    /// PMI-1 `get_universe_size`, PMI-2 `info-getjobattr` of `universeSize`.
    GetUniverseSize,
    /// PMI-2 `info-getjobattr` of any other key.
    GetJobAttr {
        key: String,
    },
    /// `kvsname` is PMI-1's, which must be the job's own; PMI-2 names none.
    Put {
        kvsname: Option<String>,
        key: String,
        value: String,
    },
    /// `kvsname` is PMI-1's `kvsname` or PMI-2's optional `jobid`.
    Get {
        kvsname: Option<String>,
        key: String,
    },
    /// PMI-1 `barrier_in`, PMI-2 `kvs-fence`.
    Fence,
    PutNodeAttr {
        key: String,
        value: String,
    },
    /// With `wait` the answer waits until some rank of the node puts `key`.
    GetNodeAttr {
        key: String,
        wait: bool,
    },
    Name(NameOp),
    /// A whole spawn: every block of a PMI-1 spawn, or the one PMI-2 frame.
    Spawn(SpawnRequest),
    /// `code` is absent in PMI-2 and from old PMI-1 clients; the server picks one.
    Abort {
        code: Option<i32>,
        msg: String,
    },
    JobConnect,
    JobDisconnect,
    Finalize,
}

/// The blocks of a PMI-1 spawn received before its last one.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SpawnBlocks {
    blocks: Vec<pmi1::SpawnBlock>,
}

impl SpawnBlocks {
    /// Adds a block; the whole spawn once `block` is its last (`spawnssofar` reaches
    /// `totspawns`). The new job's preput pairs are the first block's.
    pub fn add(&mut self, block: pmi1::SpawnBlock) -> Option<SpawnRequest> {
        let last = block.spawnssofar >= block.totspawns;
        self.blocks.push(block);
        if !last {
            return None;
        }
        let mut blocks = std::mem::take(&mut self.blocks).into_iter().peekable();
        let preput = blocks.peek().map(|b| b.preput.clone()).unwrap_or_default();
        let cmds = blocks.map(|b| spawn_cmd(b.execname, b.args, b.nprocs, b.info)).collect();
        Some(SpawnRequest { cmds, preput })
    }

    /// Whether a spawn is half received.
    pub fn is_empty(&self) -> bool {
        self.blocks.is_empty()
    }
}

/// One executable of a spawn, from either protocol's fields.
/// A PMI publish: a port name, kept until it is withdrawn.
fn publish(service: String, port: String) -> NameOp {
    NameOp::Publish { service, value: NameValue::Text(port), once: false }
}

/// A PMI lookup: answered at once, found or not.
fn lookup(service: String) -> NameOp {
    NameOp::Lookup { service, wait: LookupWait::No }
}

fn spawn_cmd(exe: String, args: Vec<String>, nprocs: u32, info: Vec<(String, String)>) -> SpawnCmd {
    SpawnCmd { exe, args, nprocs, info, env: Vec::new() }
}

impl Message {
    /// A PMI-1 message; `None` for a spawn block that is not its spawn's last.
    pub fn from_pmi1(request: pmi1::Request, spawn: &mut SpawnBlocks) -> Option<Message> {
        use pmi1::Request as R;
        let request = match request {
            R::Init { version, subversion } => return Some(Message::Init { version, subversion }),
            R::InitAck { pmiid } => return Some(Message::InitAck { pmiid }),
            R::Unknown { cmd, raw } => {
                return Some(Message::Unknown { protocol: Protocol::Pmi1, cmd, text: raw })
            }
            R::GetMaxes => Request::GetMaxes,
            R::GetAppnum => Request::GetAppnum,
            R::GetMyKvsname => Request::GetKvsname,
            R::GetUniverseSize => Request::GetUniverseSize,
            R::Put { kvsname, key, value } => Request::Put { kvsname: Some(kvsname), key, value },
            R::Get { kvsname, key } => Request::Get { kvsname: Some(kvsname), key },
            R::BarrierIn => Request::Fence,
            R::Finalize => Request::Finalize,
            R::Abort { exitcode } => Request::Abort { code: exitcode, msg: String::new() },
            R::PublishName { service, port } => Request::Name(publish(service, port)),
            R::UnpublishName { service } => Request::Name(NameOp::Unpublish { service }),
            R::LookupName { service } => Request::Name(lookup(service)),
            R::Spawn(block) => Request::Spawn(spawn.add(*block)?),
        };
        Some(Message::Request(Envelope { protocol: Protocol::Pmi1, tag: None, request }))
    }

    /// A PMI-2 message (always a whole request: PMI-2 has no multi-message commands).
    pub fn from_pmi2(envelope: pmi2::Envelope) -> Message {
        use pmi2::Request as R;
        let request = match envelope.request {
            R::FullInit { .. } => Request::FullInit,
            R::JobGetId => Request::GetKvsname,
            R::GetJobAttr { key } if key == "universeSize" => Request::GetUniverseSize,
            R::GetJobAttr { key } => Request::GetJobAttr { key },
            R::KvsPut { key, value } => Request::Put { kvsname: None, key, value },
            R::KvsFence => Request::Fence,
            R::KvsGet { jobid, key, .. } => Request::Get { kvsname: jobid, key },
            R::PutNodeAttr { key, value } => Request::PutNodeAttr { key, value },
            R::GetNodeAttr { key, wait } => Request::GetNodeAttr { key, wait },
            R::NamePublish { name, port, .. } => Request::Name(publish(name, port)),
            R::NameUnpublish { name, .. } => Request::Name(NameOp::Unpublish { service: name }),
            R::NameLookup { name, .. } => Request::Name(lookup(name)),
            R::Spawn(spawn) => {
                let pmi2::Spawn { preput, subcmds } = *spawn;
                let cmds = subcmds
                    .into_iter()
                    .map(|c| spawn_cmd(c.exe, c.argv, c.maxprocs, c.info))
                    .collect();
                Request::Spawn(SpawnRequest { cmds, preput })
            }
            R::Abort { msg, .. } => Request::Abort { code: None, msg },
            R::JobConnect { .. } => Request::JobConnect,
            R::JobDisconnect { .. } => Request::JobDisconnect,
            R::Finalize => Request::Finalize,
            R::Unknown(command) => {
                let text = command.body();
                return Message::Unknown { protocol: Protocol::Pmi2, cmd: command.cmd, text };
            }
        };
        Message::Request(Envelope { protocol: Protocol::Pmi2, tag: envelope.thrid, request })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pmi1(request: pmi1::Request) -> Option<Message> {
        Message::from_pmi1(request, &mut SpawnBlocks::default())
    }

    fn plain1(request: Request) -> Option<Message> {
        Some(Message::Request(Envelope { protocol: Protocol::Pmi1, tag: None, request }))
    }

    fn pmi2(thrid: Option<&str>, request: pmi2::Request) -> Message {
        Message::from_pmi2(pmi2::Envelope { thrid: thrid.map(str::to_string), request })
    }

    fn tagged2(tag: Option<&str>, request: Request) -> Message {
        let tag = tag.map(str::to_string);
        Message::Request(Envelope { protocol: Protocol::Pmi2, tag, request })
    }

    fn s(text: &str) -> String {
        text.to_string()
    }

    fn block(exe: &str, sofar: u32, total: u32, preput: &[(&str, &str)]) -> pmi1::SpawnBlock {
        pmi1::SpawnBlock {
            nprocs: sofar,
            execname: s(exe),
            totspawns: total,
            spawnssofar: sofar,
            args: vec![s("a b"), s("c=d")],
            preput: preput.iter().map(|(k, v)| (s(k), s(v))).collect(),
            info: vec![(s("wdir"), s("/tmp"))],
        }
    }

    fn cmd(exe: &str, nprocs: u32) -> SpawnCmd {
        spawn_cmd(s(exe), vec![s("a b"), s("c=d")], nprocs, vec![(s("wdir"), s("/tmp"))])
    }

    #[test]
    fn every_pmi1_request_maps() {
        use pmi1::Request as R;
        let publish = publish(s("S"), s("P"));
        let cases = [
            (
                R::Init { version: 2, subversion: 0 },
                Some(Message::Init { version: 2, subversion: 0 }),
            ),
            (R::InitAck { pmiid: 3 }, Some(Message::InitAck { pmiid: 3 })),
            (R::GetMaxes, plain1(Request::GetMaxes)),
            (R::GetAppnum, plain1(Request::GetAppnum)),
            (R::GetMyKvsname, plain1(Request::GetKvsname)),
            (R::GetUniverseSize, plain1(Request::GetUniverseSize)),
            (
                R::Put { kvsname: s("kvs"), key: s("k"), value: s("v=w") },
                plain1(Request::Put { kvsname: Some(s("kvs")), key: s("k"), value: s("v=w") }),
            ),
            (
                R::Get { kvsname: s("kvs"), key: s("k") },
                plain1(Request::Get { kvsname: Some(s("kvs")), key: s("k") }),
            ),
            (R::BarrierIn, plain1(Request::Fence)),
            (R::Finalize, plain1(Request::Finalize)),
            (
                R::Abort { exitcode: Some(42) },
                plain1(Request::Abort { code: Some(42), msg: String::new() }),
            ),
            (
                R::Abort { exitcode: None },
                plain1(Request::Abort { code: None, msg: String::new() }),
            ),
            (R::PublishName { service: s("S"), port: s("P") }, plain1(Request::Name(publish))),
            (
                R::UnpublishName { service: s("S") },
                plain1(Request::Name(NameOp::Unpublish { service: s("S") })),
            ),
            (R::LookupName { service: s("S") }, plain1(Request::Name(lookup(s("S"))))),
            (
                R::Spawn(Box::new(block("/bin/a", 1, 1, &[("PARENT_ROOT_PORT_NAME", "p")]))),
                plain1(Request::Spawn(SpawnRequest {
                    cmds: vec![cmd("/bin/a", 1)],
                    preput: vec![(s("PARENT_ROOT_PORT_NAME"), s("p"))],
                })),
            ),
            (
                R::Unknown { cmd: s("frobnicate"), raw: s("cmd=frobnicate a=b") },
                Some(Message::Unknown {
                    protocol: Protocol::Pmi1,
                    cmd: s("frobnicate"),
                    text: s("cmd=frobnicate a=b"),
                }),
            ),
        ];
        for (request, expected) in cases {
            assert_eq!(pmi1(request.clone()), expected, "{request:?}");
        }
    }

    #[test]
    fn pmi1_spawn_blocks_gather_until_the_last() {
        let mut spawn = SpawnBlocks::default();
        let first = block("/bin/a", 1, 3, &[("k", "first")]);
        assert_eq!(Message::from_pmi1(pmi1::Request::Spawn(Box::new(first)), &mut spawn), None);
        assert!(!spawn.is_empty());
        let second = block("/bin/b", 2, 3, &[("k", "second")]);
        assert_eq!(Message::from_pmi1(pmi1::Request::Spawn(Box::new(second)), &mut spawn), None);
        // Other requests may come in between; they pass untouched.
        assert_eq!(
            Message::from_pmi1(pmi1::Request::GetMaxes, &mut spawn),
            plain1(Request::GetMaxes)
        );
        let last = block("/bin/c", 3, 3, &[]);
        let whole = Message::from_pmi1(pmi1::Request::Spawn(Box::new(last)), &mut spawn);
        assert_eq!(
            whole,
            plain1(Request::Spawn(SpawnRequest {
                cmds: vec![cmd("/bin/a", 1), cmd("/bin/b", 2), cmd("/bin/c", 3)],
                preput: vec![(s("k"), s("first"))],
            }))
        );
        assert!(spawn.is_empty());
        // A nonsensical count (sofar past total) still ends the spawn rather than waiting.
        assert!(spawn.add(block("/bin/d", 5, 2, &[])).is_some());
        assert!(spawn.add(block("/bin/d", 0, 0, &[])).is_some());
    }

    #[test]
    fn every_pmi2_request_maps() {
        use pmi2::Request as R;
        let info = vec![(s("a"), s("b"))];
        let cases = [
            (R::FullInit { rank: Some(0), jobid: Some(s("j")), threaded: true }, Request::FullInit),
            (R::JobGetId, Request::GetKvsname),
            (R::GetJobAttr { key: s("universeSize") }, Request::GetUniverseSize),
            (
                R::GetJobAttr { key: s("PMI_process_mapping") },
                Request::GetJobAttr { key: s("PMI_process_mapping") },
            ),
            (
                R::KvsPut { key: s("k"), value: s("a;b") },
                Request::Put { kvsname: None, key: s("k"), value: s("a;b") },
            ),
            (R::KvsFence, Request::Fence),
            (
                R::KvsGet { jobid: Some(s("kvs")), srcid: Some(-1), key: s("k") },
                Request::Get { kvsname: Some(s("kvs")), key: s("k") },
            ),
            (
                R::KvsGet { jobid: None, srcid: None, key: s("k") },
                Request::Get { kvsname: None, key: s("k") },
            ),
            (
                R::PutNodeAttr { key: s("k"), value: s("v") },
                Request::PutNodeAttr { key: s("k"), value: s("v") },
            ),
            (
                R::GetNodeAttr { key: s("k"), wait: true },
                Request::GetNodeAttr { key: s("k"), wait: true },
            ),
            (
                R::NamePublish { name: s("S"), port: s("P"), info: info.clone() },
                Request::Name(publish(s("S"), s("P"))),
            ),
            (
                R::NameUnpublish { name: s("S"), info: info.clone() },
                Request::Name(NameOp::Unpublish { service: s("S") }),
            ),
            (R::NameLookup { name: s("S"), info }, Request::Name(lookup(s("S")))),
            (
                R::Spawn(Box::new(pmi2::Spawn {
                    preput: vec![(s("k"), s("v"))],
                    subcmds: vec![
                        pmi2::SpawnSubcmd {
                            exe: s("/bin/a"),
                            maxprocs: 2,
                            argv: vec![s("a b"), s("c=d")],
                            info: vec![(s("wdir"), s("/tmp"))],
                        },
                        pmi2::SpawnSubcmd {
                            exe: s("/bin/b"),
                            maxprocs: 1,
                            argv: vec![s("a b"), s("c=d")],
                            info: vec![(s("wdir"), s("/tmp"))],
                        },
                    ],
                })),
                Request::Spawn(SpawnRequest {
                    cmds: vec![cmd("/bin/a", 2), cmd("/bin/b", 1)],
                    preput: vec![(s("k"), s("v"))],
                }),
            ),
            (
                R::Abort { isworld: true, msg: s("bye") },
                Request::Abort { code: None, msg: s("bye") },
            ),
            (R::JobConnect { jobid: s("j") }, Request::JobConnect),
            (R::JobDisconnect { jobid: s("j") }, Request::JobDisconnect),
            (R::Finalize, Request::Finalize),
        ];
        for (request, expected) in cases {
            assert_eq!(pmi2(None, request.clone()), tagged2(None, expected.clone()));
            assert_eq!(pmi2(Some("0x7f"), request), tagged2(Some("0x7f"), expected));
        }
    }

    #[test]
    fn unknown_pmi2_commands_keep_their_body() {
        let command = pmi2::Command::new("frobnicate").with("thrid", "1").with("a", "b;c");
        assert_eq!(
            pmi2(Some("1"), pmi2::Request::Unknown(command)),
            Message::Unknown {
                protocol: Protocol::Pmi2,
                cmd: s("frobnicate"),
                text: s("cmd=frobnicate;thrid=1;a=b;;c;"),
            }
        );
    }
}
