//! One rank's PMI connection: speaks PMI-1 or PMI-2 (told apart by the first bytes), answers
//! what needs no shared state itself, and passes the rest to the node's dispatcher as typed
//! [`PmiCall`]s. The dispatcher answers with [`PmiAnswer`]s, which this task words in the
//! rank's protocol.
//!
//! ```text
//!  rank ──PMI bytes──► serve_rank ──PmiCall──► Node (KVS cache, fences, node attributes)
//!  rank ◄─PMI bytes─── serve_rank ◄─PmiAnswer── Node
//! ```

use std::sync::Arc;

use pmi_wire::pmi1::{self, Request as Req1, Response as Resp1};
use pmi_wire::pmi2::{self, Request as Req2, Response as Resp2};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::sync::mpsc;

use crate::fdio::FdStream;
use crate::mailbox;

/// What every PMI connection of a job needs to answer on its own.
pub struct PmiJob {
    pub kvsname: String,
    pub size: u32,
    pub process_mapping: Option<String>,
    /// The parent job's kvsname, for a job started by MPI_Comm_spawn.
    pub spawner: Option<String>,
}

/// Who is on the other end of one connection.
#[derive(Clone, Copy)]
pub struct PmiPeer {
    /// Index in the node's rank table.
    pub local: usize,
    /// Its job: 0 for the launched one, then one per MPI_Comm_spawn.
    pub job: u32,
    /// Rank within its job.
    pub rank: u32,
    pub appnum: u32,
}

/// A request that needs the node's state. `tag` is the PMI-2 `thrid`, echoed in the answer.
#[derive(Debug)]
pub enum PmiCall {
    Put {
        key: String,
        value: String,
    },
    Get {
        key: String,
        tag: Option<String>,
    },
    Fence {
        tag: Option<String>,
    },
    PutNodeAttr {
        key: String,
        value: String,
    },
    GetNodeAttr {
        key: String,
        wait: bool,
        tag: Option<String>,
    },
    Name {
        op: pmi_wire::control::NameOp,
        tag: Option<String>,
    },
    Abort {
        code: i32,
        msg: String,
    },
    Spawn {
        request: pmi_wire::control::SpawnRequest,
        tag: Option<String>,
    },
    Finalized,
    /// The rank broke the protocol; it gets no answer, the job ends.
    Fault(String),
    /// The connection ended; `clean` if after finalize (or before any request).
    Closed {
        clean: bool,
    },
}

/// The dispatcher's answer to a call.
#[derive(Debug)]
pub enum PmiAnswer {
    Get { key: String, value: Option<String>, tag: Option<String> },
    Fence { tag: Option<String> },
    GetNodeAttr { value: Option<String>, tag: Option<String> },
    Name { answer: pmi_wire::control::NameAnswer, tag: Option<String> },
    Spawn { kvsname: String, tag: Option<String> },
}

/// Answers on their way to one rank's connection task (see [`crate::mailbox`] for why not a
/// tokio channel). Boxed, so that a queue of them stays small.
pub type AnswerTx = mailbox::Sender<Box<PmiAnswer>>;
pub type AnswerRx = mailbox::Receiver<Box<PmiAnswer>>;

pub fn answer_channel() -> (AnswerTx, AnswerRx) {
    mailbox::channel()
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Mode {
    /// Nothing received yet.
    Fresh,
    Pmi1,
    Pmi2,
}

/// Requests longer than this are a fault (PMI-1 lines are at most 1024 bytes, PMI-2 bodies
/// 64 KiB, spawn blocks 64 KiB).
const MAX_PENDING: usize = 70 << 10;

/// Serves one rank until its connection closes. `leftover` is what the accept path read past
/// the `-pmi-port` handshake.
pub async fn serve_rank(
    mut conn: FdStream,
    leftover: Vec<u8>,
    peer: PmiPeer,
    job: Arc<PmiJob>,
    calls: mpsc::UnboundedSender<(PmiPeer, PmiCall)>,
    mut answers: AnswerRx,
) {
    let mut session = Session {
        peer,
        job,
        calls,
        mode: Mode::Fresh,
        spoke: false,
        finalized: false,
        spawn_blocks: Vec::new(),
    };
    let mut buf = leftover;
    let mut out = Vec::new();
    loop {
        match session.process(&mut buf, &mut out) {
            Ok(()) => {}
            Err(fault) => {
                session.call(PmiCall::Fault(fault));
                // Judged already: the connection ends without a second verdict.
                session.call(PmiCall::Closed { clean: true });
                return;
            }
        }
        if !out.is_empty() {
            if conn.write_all(&out).await.is_err() {
                break;
            }
            out.clear();
        }
        if buf.len() > MAX_PENDING {
            let head = String::from_utf8_lossy(&buf[..80.min(buf.len())]).into_owned();
            session.call(PmiCall::Fault(format!("sent an overlong PMI message starting {head:?}")));
            session.call(PmiCall::Closed { clean: true });
            return;
        }
        tokio::select! {
            read = conn.read_buf(&mut buf) => match read {
                Ok(0) | Err(_) => break,
                Ok(_) => {}
            },
            answer = answers.recv() => match answer {
                Some(answer) => session.answer(*answer, &mut out),
                None => return,
            },
        }
    }
    let clean = session.finalized || !session.spoke;
    session.call(PmiCall::Closed { clean });
}

struct Session {
    peer: PmiPeer,
    job: Arc<PmiJob>,
    calls: mpsc::UnboundedSender<(PmiPeer, PmiCall)>,
    mode: Mode,
    spoke: bool,
    finalized: bool,
    /// PMI-1 spawn blocks received so far for a spawn of several executables.
    spawn_blocks: Vec<pmi1::SpawnBlock>,
}

/// One executable of a spawn request, from either protocol's fields.
fn spawn_cmd(
    exe: String,
    args: Vec<String>,
    nprocs: u32,
    info: Vec<(String, String)>,
) -> pmi_wire::control::SpawnCmd {
    pmi_wire::control::SpawnCmd { exe, args, nprocs, info }
}

impl Session {
    fn call(&self, call: PmiCall) {
        let _ = self.calls.send((self.peer, call));
    }

    /// Handles every complete message in `buf`, appending immediate replies to `out`.
    fn process(&mut self, buf: &mut Vec<u8>, out: &mut Vec<u8>) -> Result<(), String> {
        loop {
            if buf.is_empty() {
                return Ok(());
            }
            let pmi1_next = match self.mode {
                Mode::Pmi2 => pmi2::detect(buf) == Some(pmi2::Protocol::Pmi1),
                _ => match pmi2::detect(buf) {
                    Some(p) => p == pmi2::Protocol::Pmi1,
                    None => return Ok(()),
                },
            };
            let used = if pmi1_next {
                match pmi1::parse_request(buf) {
                    Ok(Some((req, used))) => {
                        self.spoke = true;
                        self.pmi1(req, out)?;
                        used
                    }
                    Ok(None) => return Ok(()),
                    Err(e) => {
                        return Err(format!("sent a bad PMI-1 message ({e}): {}", quote(buf)))
                    }
                }
            } else {
                match pmi2::parse_request(buf) {
                    Ok(Some((env, used))) => {
                        self.spoke = true;
                        self.mode = Mode::Pmi2;
                        self.pmi2(env, out)?;
                        used
                    }
                    Ok(None) => return Ok(()),
                    Err(e) => {
                        return Err(format!("sent a bad PMI-2 message ({e}): {}", quote(buf)))
                    }
                }
            };
            buf.drain(..used);
        }
    }

    fn check_kvsname(&self, kvsname: &str, what: &str) -> Result<(), String> {
        if kvsname == self.job.kvsname {
            Ok(())
        } else {
            Err(format!(
                "sent {what} for kvsname {kvsname:?}, but its job's kvsname is {}",
                self.job.kvsname
            ))
        }
    }

    fn special_key(&self, key: &str) -> Option<Option<String>> {
        match key {
            "PMI_process_mapping" => Some(self.job.process_mapping.clone()),
            "PMI_dead_processes" => Some(Some(String::new())),
            _ => None,
        }
    }

    fn pmi1(&mut self, req: Req1, out: &mut Vec<u8>) -> Result<(), String> {
        let mut reply = |r: Resp1| out.extend_from_slice(&r.encode());
        match req {
            Req1::Init { version, subversion } => match (version, subversion) {
                (1, _) => {
                    self.mode = Mode::Pmi1;
                    reply(Resp1::InitOk { version: 1, subversion: 1 });
                }
                (2, _) => {
                    self.mode = Mode::Pmi2;
                    reply(Resp1::InitOk { version: 2, subversion: 0 });
                }
                _ => {
                    return Err(format!(
                    "asked for PMI version {version}.{subversion}, which rlaunch does not speak"
                ))
                }
            },
            Req1::GetMaxes => reply(Resp1::Maxes),
            Req1::GetAppnum => reply(Resp1::Appnum { appnum: self.peer.appnum }),
            Req1::GetMyKvsname => reply(Resp1::MyKvsname { kvsname: self.job.kvsname.clone() }),
            Req1::GetUniverseSize => reply(Resp1::UniverseSize { size: self.job.size as i32 }),
            Req1::Put { kvsname, key, value } => {
                self.check_kvsname(&kvsname, "a put")?;
                self.call(PmiCall::Put { key, value });
                reply(Resp1::PutOk);
            }
            Req1::Get { kvsname, key } => {
                self.check_kvsname(&kvsname, "a get")?;
                match self.special_key(&key) {
                    Some(Some(value)) => reply(Resp1::GetFound { value }),
                    Some(None) => reply(Resp1::GetNotFound { key }),
                    None => self.call(PmiCall::Get { key, tag: None }),
                }
            }
            Req1::BarrierIn => self.call(PmiCall::Fence { tag: None }),
            Req1::Finalize => {
                self.finalized = true;
                self.call(PmiCall::Finalized);
                reply(Resp1::FinalizeAck);
            }
            Req1::Abort { exitcode } => {
                self.call(PmiCall::Abort { code: exitcode.unwrap_or(1), msg: String::new() });
            }
            Req1::PublishName { service, port } => self.call(PmiCall::Name {
                op: pmi_wire::control::NameOp::Publish { service, port },
                tag: None,
            }),
            Req1::UnpublishName { service } => self.call(PmiCall::Name {
                op: pmi_wire::control::NameOp::Unpublish { service },
                tag: None,
            }),
            Req1::LookupName { service } => self.call(PmiCall::Name {
                op: pmi_wire::control::NameOp::Lookup { service },
                tag: None,
            }),
            Req1::InitAck { pmiid } => {
                return Err(format!(
                    "sent a -pmi-port handshake (pmiid={pmiid}) on its PMI_FD socket"
                ))
            }
            Req1::Spawn(block) => {
                let done = block.spawnssofar >= block.totspawns;
                self.spawn_blocks.push(*block);
                if done {
                    let blocks = std::mem::take(&mut self.spawn_blocks);
                    let preput = blocks[0].preput.clone();
                    let cmds = blocks
                        .into_iter()
                        .map(|b| spawn_cmd(b.execname, b.args, b.nprocs, b.info))
                        .collect();
                    let request = pmi_wire::control::SpawnRequest { cmds, preput };
                    self.call(PmiCall::Spawn { request, tag: None });
                }
            }
            Req1::Unknown { cmd, raw } => {
                return Err(format!(
                    "sent an unknown PMI-1 command {cmd:?}: {}",
                    quote(raw.as_bytes())
                ))
            }
        }
        Ok(())
    }

    fn pmi2(&mut self, env: pmi2::Envelope, out: &mut Vec<u8>) -> Result<(), String> {
        let tag = env.thrid;
        let mut reply = |r: Resp2| out.extend_from_slice(&r.encode(tag.as_deref()));
        match env.request {
            Req2::FullInit { .. } => reply(Resp2::FullInit {
                rank: self.peer.rank,
                size: self.job.size,
                appnum: self.peer.appnum,
                spawner_jobid: self.job.spawner.clone(),
            }),
            Req2::JobGetId => reply(Resp2::JobGetId { jobid: self.job.kvsname.clone() }),
            Req2::GetJobAttr { key } => {
                let value = match key.as_str() {
                    "universeSize" => Some(self.job.size.to_string()),
                    other => self.special_key(other).flatten(),
                };
                reply(Resp2::GetJobAttr { value });
            }
            Req2::KvsPut { key, value } => {
                self.call(PmiCall::Put { key, value });
                reply(Resp2::KvsPut);
            }
            Req2::KvsFence => self.call(PmiCall::Fence { tag }),
            Req2::KvsGet { jobid, key, .. } => {
                if let Some(jobid) = jobid {
                    self.check_kvsname(&jobid, "a kvs-get")?;
                }
                match self.special_key(&key) {
                    Some(value) => reply(Resp2::KvsGet { value }),
                    None => self.call(PmiCall::Get { key, tag }),
                }
            }
            Req2::PutNodeAttr { key, value } => {
                self.call(PmiCall::PutNodeAttr { key, value });
                reply(Resp2::PutNodeAttr);
            }
            Req2::GetNodeAttr { key, wait } => self.call(PmiCall::GetNodeAttr { key, wait, tag }),
            Req2::NamePublish { name, port, .. } => self.call(PmiCall::Name {
                op: pmi_wire::control::NameOp::Publish { service: name, port },
                tag,
            }),
            Req2::NameUnpublish { name, .. } => self.call(PmiCall::Name {
                op: pmi_wire::control::NameOp::Unpublish { service: name },
                tag,
            }),
            Req2::NameLookup { name, .. } => self.call(PmiCall::Name {
                op: pmi_wire::control::NameOp::Lookup { service: name },
                tag,
            }),
            Req2::Abort { msg, .. } => self.call(PmiCall::Abort { code: 1, msg }),
            Req2::JobConnect { .. } => reply(Resp2::JobConnect),
            Req2::JobDisconnect { .. } => reply(Resp2::JobDisconnect),
            Req2::Finalize => {
                self.finalized = true;
                self.call(PmiCall::Finalized);
                reply(Resp2::Finalize);
            }
            Req2::Spawn(spawn) => {
                let spawn = *spawn;
                let cmds = spawn
                    .subcmds
                    .into_iter()
                    .map(|c| spawn_cmd(c.exe, c.argv, c.maxprocs, c.info))
                    .collect();
                let request = pmi_wire::control::SpawnRequest { cmds, preput: spawn.preput };
                self.call(PmiCall::Spawn { request, tag });
            }
            Req2::Unknown(cmd) => {
                return Err(format!(
                    "sent an unknown PMI-2 command {:?}: {}",
                    cmd.cmd,
                    quote(cmd.body().as_bytes())
                ))
            }
        }
        Ok(())
    }

    fn answer(&mut self, answer: PmiAnswer, out: &mut Vec<u8>) {
        use pmi_wire::control::NameAnswer as N;
        if self.mode == Mode::Pmi2 {
            let (resp, tag) = match answer {
                PmiAnswer::Get { value, tag, .. } => (Resp2::KvsGet { value }, tag),
                PmiAnswer::Fence { tag } => (Resp2::KvsFence, tag),
                PmiAnswer::GetNodeAttr { value, tag } => (Resp2::GetNodeAttr { value }, tag),
                PmiAnswer::Spawn { kvsname, tag } => (Resp2::Spawn { jobid: kvsname }, tag),
                PmiAnswer::Name { answer, tag } => {
                    let resp = match answer {
                        N::Published(true) => Resp2::NamePublish,
                        N::Published(false) => Resp2::Failed {
                            cmd: "name-publish".into(),
                            errmsg: "duplicate_service".into(),
                        },
                        N::Unpublished(true) => Resp2::NameUnpublish,
                        N::Unpublished(false) => Resp2::Failed {
                            cmd: "name-unpublish".into(),
                            errmsg: "service_not_found".into(),
                        },
                        N::Lookup(port) => Resp2::NameLookup { port },
                    };
                    (resp, tag)
                }
            };
            out.extend_from_slice(&resp.encode(tag.as_deref()));
            return;
        }
        let resp = match answer {
            PmiAnswer::Get { value: Some(value), .. } => Resp1::GetFound { value },
            PmiAnswer::Get { value: None, key, .. } => Resp1::GetNotFound { key },
            PmiAnswer::Fence { .. } => Resp1::BarrierOut,
            PmiAnswer::GetNodeAttr { .. } => return,
            PmiAnswer::Spawn { .. } => Resp1::SpawnOk { errcodes: Vec::new() },
            PmiAnswer::Name { answer, .. } => match answer {
                N::Published(true) => Resp1::PublishOk,
                N::Published(false) => Resp1::PublishDuplicate,
                N::Unpublished(true) => Resp1::UnpublishOk,
                N::Unpublished(false) => Resp1::UnpublishNotFound,
                N::Lookup(Some(port)) => Resp1::LookupFound { port },
                N::Lookup(None) => Resp1::LookupNotFound,
            },
        };
        out.extend_from_slice(&resp.encode());
    }
}

/// The start of what a rank sent, printable, for error messages.
fn quote(bytes: &[u8]) -> String {
    let end = bytes.iter().position(|&b| b == b'\n').unwrap_or(bytes.len()).min(120);
    let mut text = format!("{:?}", String::from_utf8_lossy(&bytes[..end]));
    if end < bytes.len() && bytes[end] != b'\n' {
        text.push('…');
    }
    text
}

/// The loopback listener of `-pmi-port` mode. Bound by address, not by name: naming a host
/// would link in getaddrinfo, and with it glibc's resolver, NSS and dlopen (a quarter of a
/// static proxy's text, resident in every proxy).
pub fn listen() -> Option<std::net::TcpListener> {
    let loopback = std::net::SocketAddr::from((std::net::Ipv4Addr::LOCALHOST, 0));
    match std::net::TcpListener::bind(loopback) {
        Ok(l) => Some(l),
        Err(e) => {
            tracing::error!("cannot listen for PMI connections on loopback: {e}");
            None
        }
    }
}

/// Accepts `-pmi-port` connections: each must open with `cmd=initack pmiid=R` for one of this
/// node's ranks not yet claimed; then it is served like a socketpair.
pub async fn accept(
    listener: std::net::TcpListener,
    mut unbound: std::collections::HashMap<u32, (PmiPeer, AnswerRx)>,
    job: Arc<PmiJob>,
    calls: mpsc::UnboundedSender<(PmiPeer, PmiCall)>,
) {
    let listener = match listener
        .set_nonblocking(true)
        .and_then(|()| tokio::net::TcpListener::from_std(listener))
    {
        Ok(l) => l,
        Err(e) => {
            tracing::error!("cannot serve PMI on loopback: {e}");
            return;
        }
    };
    while !unbound.is_empty() {
        let Ok((stream, _)) = listener.accept().await else { continue };
        let _ = stream.set_nodelay(true);
        let Ok(std_stream) = stream.into_std() else { continue };
        let Ok(mut conn) = FdStream::new(std::os::fd::OwnedFd::from(std_stream)) else { continue };
        let mut buf = Vec::new();
        let pmiid = loop {
            match pmi1::parse_request(&buf) {
                Ok(Some((Req1::InitAck { pmiid }, used))) => {
                    buf.drain(..used);
                    break Some(pmiid);
                }
                Ok(None) if buf.len() < pmi1::MAX_LINE => match conn.read_buf(&mut buf).await {
                    Ok(n) if n > 0 => continue,
                    _ => break None,
                },
                _ => break None,
            }
        };
        let Some((peer, answers)) = pmiid.and_then(|id| unbound.remove(&id)) else {
            tracing::warn!("dropped a PMI connection without a valid initack for this node");
            continue;
        };
        let hello = Resp1::InitAck { size: job.size, rank: peer.rank }.encode();
        if conn.write_all(&hello).await.is_err() {
            continue;
        }
        tokio::spawn(serve_rank(conn, buf, peer, job.clone(), calls.clone(), answers));
    }
}
