//! `--tracker rabit`: rlaunch is the job's dmlc/rabit tracker, so that XGBoost and dmlc-core
//! programs run with no tracker started beside the launcher. Its listener is bound at plan
//! time to an address every node reaches; every rank gets `DMLC_TRACKER_URI`,
//! `DMLC_TRACKER_PORT`, `DMLC_TASK_ID` (its rank), `DMLC_NUM_WORKER`, `DMLC_ROLE=worker` and
//! `DMLC_NUM_SERVER=0`.
//!
//! This is the socket layer: one connection at a time, as the reference trackers serve them
//! (a worker's peers learn its port only at the end of its exchange), each read bounded in
//! size and time; what the bytes mean is [`rabit`]'s. A connection that is no rabit worker's
//! (a port scan, a stray client) is dropped with a warning and the job goes on.
//!
//! ```text
//!   worker ──magic──► tracker ──magic──► worker
//!   worker ──rank, world, task, cmd──► start/recover: Start ──► (good links ──► Links ──►
//!          errors)* ──► its listening port │ print: a line on rlaunch's stderr │ shutdown
//! ```

pub mod rabit;

use std::io;
use std::net::{IpAddr, TcpListener};
use std::time::{Duration, Instant};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use crate::error::cut;

/// Both sides' first four bytes (the int 0xff99, little-endian).
const MAGIC: i32 = 0xff99;
/// A worker that says nothing for this long mid-exchange is dropped (the others wait while
/// it is served).
const READ_WAIT: Duration = Duration::from_secs(60);
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

/// Serves the job's `n` workers until every one has shut down.
pub async fn serve(listener: Listener, n: u32) {
    let socket = match tokio::net::TcpListener::from_std(listener.socket) {
        Ok(socket) => socket,
        Err(e) => return eprintln!("rlaunch: warning: the rabit tracker cannot listen: {e}"),
    };
    let mut tracker = rabit::Tracker::new(n);
    let mut first: Option<Instant> = None;
    let mut reported = false;
    loop {
        let Ok((mut conn, peer)) = socket.accept().await else { continue };
        first.get_or_insert_with(Instant::now);
        let _ = conn.set_nodelay(true);
        match serve_one(&mut conn, peer.ip(), &mut tracker).await {
            Ok(Served::AllDone) => {
                tracing::debug!("rabit tracker: every worker shut down");
                return;
            }
            Ok(Served::Done) => {}
            Err(why) => {
                eprintln!(
                    "rlaunch: warning: dropped a connection to the rabit tracker from {}: {why}",
                    peer.ip()
                );
            }
        }
        if tracker.all_started() && !reported {
            reported = true;
            let took = first.map(|t| t.elapsed()).unwrap_or_default();
            tracing::debug!(workers = n, ?took, "rabit tracker: every worker's links assigned");
        }
    }
}

enum Served {
    Done,
    AllDone,
}

/// One worker's connection, whole.
async fn serve_one(
    conn: &mut TcpStream,
    peer: IpAddr,
    tracker: &mut rabit::Tracker,
) -> Result<Served, String> {
    let magic = read_i32(conn).await?;
    if magic != MAGIC {
        return Err(format!("it is no rabit worker (it began with {magic:#x})"));
    }
    write(conn, &[MAGIC]).await?;
    let mut head = [0u8; 8];
    read_exact(conn, &mut head).await?;
    // XGBoost from 2.1 sends a length and JSON ({"rank": ...}) where the classic protocol
    // sends its rank and world size.
    if head[4] == b'{' {
        return Err("it speaks XGBoost 2.1's tracker protocol, which rlaunch does not serve yet"
            .to_string());
    }
    let rank = i32::from_le_bytes(head[..4].try_into().expect("4 bytes"));
    let world = i32::from_le_bytes(head[4..].try_into().expect("4 bytes"));
    let task = read_string(conn).await?;
    let cmd = read_string(conn).await?;
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
                conn.write_all(&out).await.map_err(|e| e.to_string())?;
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

fn put_i32(out: &mut Vec<u8>, v: i32) {
    out.extend_from_slice(&v.to_le_bytes());
}

async fn write(conn: &mut TcpStream, values: &[i32]) -> Result<(), String> {
    let mut out = Vec::with_capacity(values.len() * 4);
    for &v in values {
        put_i32(&mut out, v);
    }
    conn.write_all(&out).await.map_err(|e| e.to_string())
}

async fn read_exact(conn: &mut TcpStream, buf: &mut [u8]) -> Result<(), String> {
    match tokio::time::timeout(READ_WAIT, conn.read_exact(buf)).await {
        Ok(Ok(_)) => Ok(()),
        Ok(Err(e)) if e.kind() == io::ErrorKind::UnexpectedEof => {
            Err("it closed the connection mid-message".to_string())
        }
        Ok(Err(e)) => Err(e.to_string()),
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
