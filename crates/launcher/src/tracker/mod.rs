//! `--tracker rabit`: rlaunch is the job's dmlc/rabit tracker, so that XGBoost and dmlc-core
//! programs run with no tracker started beside the launcher. Its listener is bound at plan
//! time to an address every node reaches; every rank gets `DMLC_TRACKER_URI`,
//! `DMLC_TRACKER_PORT`, `DMLC_TASK_ID` (its rank), `DMLC_NUM_WORKER`, `DMLC_ROLE=worker` and
//! `DMLC_NUM_SERVER=0`.
//!
//! This is the socket layer for both protocols in use, told apart by what a worker sends
//! after the magic: the classic one (XGBoost up to 2.0, dmlc-core) and XGBoost 2.1's (a
//! length and JSON). One connection at a time, as the reference trackers serve them (a
//! classic worker's peers learn its port only at the end of its exchange; an XGBoost 2.1
//! worker's start waits, open, until all have started), each read bounded in size and time;
//! what the bytes mean is [`rabit`]'s. A connection that is no rabit worker's (a port scan,
//! a stray client) is dropped with a warning and the job goes on; an error a worker reports
//! ends the job, naming it.
//!
//! ```text
//!   tracker ──magic──► worker ──magic──► tracker
//!   classic: rank, world, task, cmd ──► start/recover: Start ──► (good links ──► Links ──►
//!            errors)* ──► its port │ print: a line on rlaunch's stderr │ shutdown
//!   2.1:     {rank, task_id, world_size} {cmd: start, port} ──► {world_size}, then once all
//!            have started {host, port, rank} of its successor │ print │ shutdown │ error
//! ```

pub mod rabit;

use std::io;
use std::net::{IpAddr, TcpListener};
use std::time::{Duration, Instant};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::sync::mpsc;

use rlaunch_protocol::record::{self, Micros};

use crate::quote::cut;

/// Both sides' first four bytes (the int 0xff99, little-endian).
const MAGIC: i32 = 0xff99;
/// A worker that says nothing for this long mid-exchange is dropped (the others wait while
/// it is served).
const READ_WAIT: Duration = Duration::from_secs(60);
/// Why a connection was dropped when its peer closed it (or died) mid-exchange.
const CLOSED: &str = "it closed the connection mid-message";
/// The longest string a worker may send (a `print` of an evaluation log, a task id).
const MAX_STRING: usize = 64 << 10;

/// The tracker's listener, bound at plan time, and what the ranks are told of it.
#[derive(Debug)]
pub struct Listener {
    pub socket: TcpListener,
    pub addr: IpAddr,
    pub port: u16,
}

/// Binds the tracker's listener on `addr` (an address every node reaches).
pub fn listen(addr: IpAddr) -> io::Result<Listener> {
    let socket = TcpListener::bind((addr, 0))?;
    let port = socket.local_addr()?.port();
    socket.set_nonblocking(true)?;
    Ok(Listener { socket, addr, port })
}

/// What the tracker tells the root.
#[derive(Debug)]
pub enum News {
    /// Worker `rank` reported an error (XGBoost 2.1's `signal_error`): the job fails.
    Error { rank: u32, msg: String },
    /// Worker `rank` started (was given its links, or its place in the ring).
    Started { rank: u32 },
    /// The tracker's own work is done: from the first worker's connection to every worker's
    /// links assigned (its rendezvous), on rlaunch's clock.
    Assigned { first: Micros, all: Micros },
}

/// Serves the job's `n` workers until every one has shut down. `ending` turns true when the
/// job begins to end: connections that break after that are the teardown's doing (a worker
/// killed mid-exchange), and are dropped without a warning.
pub async fn serve(
    listener: Listener,
    n: u32,
    news: mpsc::UnboundedSender<News>,
    ending: tokio::sync::watch::Receiver<bool>,
) {
    let socket = match tokio::net::TcpListener::from_std(listener.socket) {
        Ok(socket) => socket,
        Err(e) => return eprintln!("rlaunch: warning: the rabit tracker cannot listen: {e}"),
    };
    let mut trackers = Trackers {
        classic: rabit::Tracker::new(n),
        ring: rabit::Ring::new(n),
        waiting: Vec::new(),
        news,
        spoke: false,
    };
    let mut first: Option<(Instant, Micros)> = None;
    let mut reported = false;
    loop {
        let Ok((mut conn, peer)) = socket.accept().await else { continue };
        first.get_or_insert_with(|| (Instant::now(), record::now_us()));
        let _ = conn.set_nodelay(true);
        match trackers.serve_one(&mut conn, peer.ip()).await {
            Ok(Served::AllDone) => {
                tracing::debug!("rabit tracker: every worker shut down");
                return;
            }
            Ok(Served::Done) => {}
            Ok(Served::Waiting(rank)) => trackers.waiting_for_all(rank, conn).await,
            // A worker died mid-exchange (it spoke rabit), or the job is ending and killed it:
            // its end is what the user hears of. A worker that says something wrong is still
            // warned about (a task id that is no rank, say: the others would wait for it).
            Err(why) if (trackers.spoke && why == CLOSED) || *ending.borrow() => {
                tracing::debug!(%peer, why, "rabit tracker: a worker's connection dropped");
            }
            Err(why) => {
                eprintln!(
                    "rlaunch: warning: dropped a connection to the rabit tracker from {}: {why}",
                    peer.ip()
                );
            }
        }
        if (trackers.classic.all_started() || trackers.ring.all_started()) && !reported {
            reported = true;
            let (took, first) = first.map(|(t, us)| (t.elapsed(), us)).unwrap_or_default();
            tracing::debug!(workers = n, ?took, "rabit tracker: every worker's links assigned");
            let _ = trackers.news.send(News::Assigned { first, all: record::now_us() });
        }
    }
}

enum Served {
    Done,
    AllDone,
    /// An XGBoost 2.1 worker of this rank started: it waits for the others.
    Waiting(u32),
}

/// Both protocols' state, and the XGBoost 2.1 workers waiting for the others to start.
struct Trackers {
    classic: rabit::Tracker,
    ring: rabit::Ring,
    waiting: Vec<(u32, TcpStream)>,
    news: mpsc::UnboundedSender<News>,
    /// The connection being served began with the rabit magic.
    spoke: bool,
}

/// The first frame of an XGBoost 2.1 connection.
#[derive(serde::Deserialize)]
struct Connect {
    rank: i32,
    #[serde(default)]
    task_id: String,
}

/// The command frame that follows it.
#[derive(serde::Deserialize)]
struct Command {
    cmd: i32,
    #[serde(default)]
    port: i32,
    #[serde(default)]
    msg: String,
}

impl Trackers {
    /// One worker's connection: whole, or up to its start (XGBoost 2.1's, which waits).
    async fn serve_one(&mut self, conn: &mut TcpStream, peer: IpAddr) -> Result<Served, String> {
        self.spoke = false;
        // XGBoost 2.1's workers wait for the tracker's magic; the classic ones send theirs
        // first and take it after.
        write(conn, &[MAGIC]).await?;
        let magic = read_i32(conn).await?;
        if magic != MAGIC {
            return Err(format!("it is no rabit worker (it began with {magic:#x})"));
        }
        self.spoke = true;
        let mut head = [0u8; 8];
        read_exact(conn, &mut head).await?;
        // XGBoost from 2.1 sends a length and JSON ({"rank": ...}) where the classic protocol
        // sends its rank and world size.
        if head[4] == b'{' {
            return self.serve_json(conn, peer, head).await;
        }
        let rank = i32::from_le_bytes(head[..4].try_into().expect("4 bytes"));
        let world = i32::from_le_bytes(head[4..].try_into().expect("4 bytes"));
        let task = read_string(conn).await?;
        let cmd = read_string(conn).await?;
        let tracker = &mut self.classic;
        match cmd.as_str() {
            "print" => {
                let message = read_string(conn).await?;
                eprintln!("{}", message.trim());
                Ok(Served::Done)
            }
            "shutdown" => match tracker.shutdown(rank)? {
                true => Ok(Served::AllDone),
                false => Ok(Served::Done),
            },
            "start" | "recover" => {
                let start = tracker.start(rank, world, &task)?;
                let _ = self.news.send(News::Started { rank: start.rank });
                let mut reply = vec![start.rank as i32, start.parent, start.world as i32];
                reply.push(start.tree.len() as i32);
                reply.extend(&start.tree);
                reply.extend([start.prev, start.next]);
                write(conn, &reply).await?;
                loop {
                    let good = read_i32(conn).await?;
                    if !(0..=4).contains(&good) {
                        return Err(format!("it says it has {good} links"));
                    }
                    let mut have = Vec::new();
                    for _ in 0..good {
                        have.push(read_i32(conn).await?);
                    }
                    let links = tracker.links(start.rank, &have)?;
                    let mut out = Vec::new();
                    put_i32(&mut out, links.connect.len() as i32);
                    put_i32(&mut out, links.accept as i32);
                    for (host, port, peer) in &links.connect {
                        put_i32(&mut out, host.len() as i32);
                        out.extend_from_slice(host.as_bytes());
                        put_i32(&mut out, *port);
                        put_i32(&mut out, *peer as i32);
                    }
                    conn.write_all(&out).await.map_err(failure)?;
                    let errors = read_i32(conn).await?;
                    if errors != 0 {
                        continue;
                    }
                    let port = read_i32(conn).await?;
                    tracker.listening(start.rank, peer.to_string(), port, &links);
                    return Ok(Served::Done);
                }
            }
            other => Err(format!("it asked for {}, which no rabit worker does", cut(other))),
        }
    }

    /// An XGBoost 2.1 connection, `head` its first 8 bytes after the magic: its connect
    /// frame, then one command.
    async fn serve_json(
        &mut self,
        conn: &mut TcpStream,
        peer: IpAddr,
        head: [u8; 8],
    ) -> Result<Served, String> {
        let len = i32::from_le_bytes(head[..4].try_into().expect("4 bytes"));
        let len = usize::try_from(len).ok().filter(|l| (4..=MAX_STRING).contains(l));
        let len = len.ok_or("it sent a frame of a bad length")?;
        let mut body = head[4..].to_vec();
        body.resize(len, 0);
        read_exact(conn, &mut body[4..]).await?;
        let connect: Connect = serde_json::from_slice(&body)
            .map_err(|e| format!("its first message is not what XGBoost sends: {e}"))?;
        let frame = read_string(conn).await?;
        let command: Command = serde_json::from_str(&frame)
            .map_err(|e| format!("its command is not what XGBoost sends: {e}"))?;
        let ring = &mut self.ring;
        match command.cmd {
            1 => {
                let rank = ring.start(&connect.task_id, peer.to_string(), command.port)?;
                let _ = self.news.send(News::Started { rank });
                write_frame(conn, &serde_json::json!({ "world_size": ring.size() })).await?;
                Ok(Served::Waiting(rank))
            }
            2 => match ring.shutdown(connect.rank)? {
                true => Ok(Served::AllDone),
                false => Ok(Served::Done),
            },
            3 => {
                let rank = u32::try_from(connect.rank).ok().filter(|&r| r < ring.size());
                let rank = rank.ok_or_else(|| format!("an error from rank {}", connect.rank))?;
                let _ = self.news.send(News::Error { rank, msg: command.msg });
                Ok(Served::Done)
            }
            4 => {
                eprintln!("{}", command.msg.trim());
                Ok(Served::Done)
            }
            other => Err(format!("it asked for command {other}, which no XGBoost worker does")),
        }
    }

    /// XGBoost 2.1 worker `rank` started; once every worker has, each is told where its
    /// ring successor listens.
    async fn waiting_for_all(&mut self, rank: u32, conn: TcpStream) {
        self.waiting.push((rank, conn));
        let Some(successors) = self.ring.successors() else { return };
        for (rank, mut conn) in self.waiting.drain(..) {
            let next = &successors[rank as usize].1;
            let frame =
                serde_json::json!({ "host": next.host, "port": next.port, "rank": next.rank });
            if let Err(e) = write_frame(&mut conn, &frame).await {
                // Its end, if it ended, is what the user hears of.
                tracing::debug!(rank, %e, "rabit tracker: lost a worker that waited");
            }
        }
    }
}

async fn write_frame(conn: &mut TcpStream, value: &serde_json::Value) -> Result<(), String> {
    let text = value.to_string();
    let mut out = Vec::with_capacity(4 + text.len());
    put_i32(&mut out, text.len() as i32);
    out.extend_from_slice(text.as_bytes());
    conn.write_all(&out).await.map_err(failure)
}

fn put_i32(out: &mut Vec<u8>, v: i32) {
    out.extend_from_slice(&v.to_le_bytes());
}

async fn write(conn: &mut TcpStream, values: &[i32]) -> Result<(), String> {
    let mut out = Vec::with_capacity(values.len() * 4);
    for &v in values {
        put_i32(&mut out, v);
    }
    conn.write_all(&out).await.map_err(failure)
}

/// An I/O error on a worker's connection, in words; a peer gone mid-exchange is [`CLOSED`].
fn failure(e: io::Error) -> String {
    use io::ErrorKind::{BrokenPipe, ConnectionReset, UnexpectedEof};
    match e.kind() {
        UnexpectedEof | ConnectionReset | BrokenPipe => CLOSED.to_string(),
        _ => e.to_string(),
    }
}

async fn read_exact(conn: &mut TcpStream, buf: &mut [u8]) -> Result<(), String> {
    match tokio::time::timeout(READ_WAIT, conn.read_exact(buf)).await {
        Ok(Ok(_)) => Ok(()),
        Ok(Err(e)) => Err(failure(e)),
        Err(_) => Err(format!("it said nothing for {} s", READ_WAIT.as_secs())),
    }
}

async fn read_i32(conn: &mut TcpStream) -> Result<i32, String> {
    let mut buf = [0u8; 4];
    read_exact(conn, &mut buf).await?;
    Ok(i32::from_le_bytes(buf))
}

async fn read_string(conn: &mut TcpStream) -> Result<String, String> {
    let len = read_i32(conn).await?;
    let len = usize::try_from(len).ok().filter(|&l| l <= MAX_STRING);
    let Some(len) = len else { return Err("it sent a string of a bad length".to_string()) };
    let mut buf = vec![0u8; len];
    read_exact(conn, &mut buf).await?;
    Ok(String::from_utf8_lossy(&buf).into_owned())
}
