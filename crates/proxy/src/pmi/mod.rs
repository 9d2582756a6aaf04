//! One rank's PMI connection: speaks PMI-1 or PMI-2 (told apart by the first bytes), answers
//! what needs no shared state itself, and passes the rest to the node's dispatcher as typed
//! [`PmiCall`]s. The dispatcher answers with [`PmiAnswer`]s, which the connection words in the
//! rank's protocol.
//!
//! ```text
//!  rank ──bytes──► PmiConn ──Request──► route ──PmiCall──► Node (KVS cache, fences, node attrs)
//!  rank ◄─bytes─── PmiConn ◄──Reply─────┴──────◄─PmiAnswer── Node
//! ```
//!
//! * `conn`: `PmiConn`, the socket, its buffer and the protocol the rank settled on; the same
//!   for a socketpair ([`serve_rank`]) and a `-pmi-port` connection ([`accept`]).
//! * `route`: which requests are answered here and which go to the node.
//! * `fault`: the ways a rank can break the protocol, in the words the user sees.
//!
//! Parsing, the protocol-neutral request and reply, and their wording per protocol are
//! [`pmi_wire`]'s (`pmi1`, `pmi2`, `request`, `reply`).

use std::sync::Arc;

use pmi_wire::request::Envelope;
use tokio::sync::mpsc;

use rlaunch_tree::fdio::FdStream;
use rlaunch_tree::mailbox;

mod conn;
mod fault;
mod route;
pub(crate) use route::DEAD_PROCESSES;

use conn::{Mode, PmiConn};
use fault::Fault;
use route::route;

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
#[derive(Debug, PartialEq)]
pub enum PmiCall {
    Put {
        key: String,
        value: String,
    },
    Get {
        key: String,
        tag: Option<String>,
    },
    /// A PMI-2 job attribute that only the node knows (the failed ranks).
    JobAttr {
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
        op: rlaunch_protocol::control::NameOp,
        tag: Option<String>,
    },
    Abort {
        code: i32,
        msg: String,
    },
    Spawn {
        request: rlaunch_protocol::control::SpawnRequest,
        tag: Option<String>,
    },
    Finalized,
    /// The rank's PMI-1/PMI-2 init is done (answered on the connection itself).
    Initialized,
    /// A `--pmi-port` connection claimed this rank (a socketpair is open from the start).
    Opened,
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
    JobAttr { value: Option<String>, tag: Option<String> },
    Fence { tag: Option<String> },
    GetNodeAttr { value: Option<String>, tag: Option<String> },
    Name { answer: rlaunch_protocol::control::NameAnswer, tag: Option<String> },
    Spawn { outcome: rlaunch_protocol::control::SpawnOutcome, tag: Option<String> },
}

/// Answers on their way to one rank's connection task (see [`rlaunch_tree::mailbox`] for why not a
/// tokio channel). Boxed, so that a queue of them stays small.
pub type AnswerTx = mailbox::Sender<Box<PmiAnswer>>;
pub type AnswerRx = mailbox::Receiver<Box<PmiAnswer>>;

pub fn answer_channel() -> (AnswerTx, AnswerRx) {
    mailbox::channel()
}

/// Serves one rank until its connection closes. `leftover` is what the accept path read past
/// the `-pmi-port` handshake.
pub async fn serve_rank(
    conn: FdStream,
    leftover: Vec<u8>,
    peer: PmiPeer,
    job: Arc<PmiJob>,
    calls: mpsc::UnboundedSender<(PmiPeer, PmiCall)>,
    answers: AnswerRx,
) {
    serve(PmiConn::new(conn, leftover), peer, job, calls, answers).await;
}

/// What woke the serving loop.
enum Wake {
    Read(std::io::Result<usize>),
    Answer(Option<Box<PmiAnswer>>),
}

/// The most key and value bytes one rank may put in all: MPI libraries put a business card
/// of a few hundred bytes a fence.
pub(crate) const MAX_PUT_BYTES: usize = 8 << 20;

async fn serve(
    mut conn: PmiConn,
    peer: PmiPeer,
    job: Arc<PmiJob>,
    calls: mpsc::UnboundedSender<(PmiPeer, PmiCall)>,
    mut answers: AnswerRx,
) {
    let tell = |call: PmiCall| {
        let _ = calls.send((peer, call));
    };
    let fault = |fault: Fault| {
        tell(PmiCall::Fault(fault.to_string()));
        // Judged already: the connection ends without a second verdict.
        tell(PmiCall::Closed { clean: true });
    };
    let mut finalized = false;
    let mut initialized = false;
    // Key and value bytes this rank has put: every node keeps every pair, so a rank that
    // puts without end would take all the memory of the job's nodes.
    let mut put_bytes = 0usize;
    loop {
        loop {
            let envelope = match conn.next_request() {
                Ok(Some(envelope)) => envelope,
                Ok(None) => break,
                Err(f) => return fault(f),
            };
            let Envelope { protocol, tag, request } = envelope;
            let (call, reply) = match route(&job, &peer, protocol, tag.clone(), request) {
                Ok(routed) => routed.into_parts(),
                Err(f) => return fault(f),
            };
            if let Some(call) = call {
                if let PmiCall::Put { key, value } | PmiCall::PutNodeAttr { key, value } = &call {
                    put_bytes += key.len() + value.len();
                    if put_bytes > MAX_PUT_BYTES {
                        return fault(Fault::TooMuchPut { limit: MAX_PUT_BYTES });
                    }
                }
                finalized |= matches!(call, PmiCall::Finalized);
                tell(call);
            }
            if let Some(reply) = reply {
                conn.reply(reply, protocol, tag.as_deref());
            }
        }
        if !initialized && conn.mode() != Mode::Fresh {
            initialized = true;
            tell(PmiCall::Initialized);
        }
        if conn.flush().await.is_err() {
            break;
        }
        if let Some(f) = conn.overlong() {
            return fault(f);
        }
        let wake = tokio::select! {
            read = conn.read_more() => Wake::Read(read),
            answer = answers.recv() => Wake::Answer(answer),
        };
        match wake {
            Wake::Read(Ok(0) | Err(_)) => break,
            Wake::Read(Ok(_)) => {}
            Wake::Answer(Some(answer)) => {
                let (reply, tag) = route::reply_to(*answer);
                conn.answer(reply, tag.as_deref());
            }
            Wake::Answer(None) => return,
        }
    }
    tell(PmiCall::Closed { clean: finalized || !conn.spoke() });
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
        let Ok(stream) = FdStream::new(std::os::fd::OwnedFd::from(std_stream)) else { continue };
        let mut conn = PmiConn::new(stream, Vec::new());
        let Some((peer, answers)) = conn.initack().await.and_then(|id| unbound.remove(&id)) else {
            tracing::warn!("dropped a PMI connection without a valid initack for this node");
            continue;
        };
        if conn.greet(job.size, peer.rank).await.is_err() {
            continue;
        }
        let _ = calls.send((peer, PmiCall::Opened));
        tokio::spawn(serve(conn, peer, job.clone(), calls.clone(), answers));
    }
}
