//! A small blocking PMI client for Rust rank programs, PMI-1 or PMI-2, std only.
//!
//! ```text
//! PMI_FD=<fd>           an inherited socket; PMI_RANK and PMI_SIZE say who we are
//! PMI_PORT=host:port    TCP; we send "cmd=initack pmiid=<PMI_ID>", the server answers
//!                       with our size and rank (docs/pmi.md, *The port handshake*)
//! ```
//!
//! Start with [`connect`]: it finds the server, initialises, and returns a [`PmiClient`] that
//! works the same over either version. [`Pmi1Client`] and [`Pmi2Client`] offer the rest of
//! each protocol. Both protocols allow one request in flight, so every call blocks for its
//! reply (except `abort`, which has none).

use std::io::{self, Read, Write};
use std::net::{Shutdown, TcpStream};
use std::os::unix::io::{FromRawFd, RawFd};
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::str::FromStr;
use std::sync::atomic::{AtomicBool, Ordering};

use crate::pmi1::{self, Line};
use crate::pmi2;

mod pmi1_client;
mod pmi2_client;

pub use pmi1_client::Pmi1Client;
pub use pmi2_client::Pmi2Client;

#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    #[error("not started by a pmi launcher: neither PMI_FD nor PMI_PORT is set")]
    NoServer,
    #[error("PMI_PORT is set but PMI_ID is not")]
    NoPmiId,
    #[error("bad {name}={value:?}: {reason}")]
    BadEnv { name: &'static str, value: String, reason: &'static str },
    #[error("PMI_FD is already owned by another pmi connection in this process")]
    FdTaken,
    #[error("cannot connect to the pmi server at {addr}: {cause}")]
    Connect { addr: String, cause: io::Error },
    #[error("pmi connection failed: {0}")]
    Io(#[from] io::Error),
    #[error("the pmi server closed the connection")]
    Closed,
    #[error("bad reply from the pmi server: {0}")]
    Pmi1(#[from] pmi1::Pmi1Error),
    #[error("bad reply from the pmi server: {0}")]
    Pmi2(#[from] pmi2::Pmi2Error),
    #[error("unexpected reply from the pmi server: expected {expected}, got {got}")]
    UnexpectedReply { expected: String, got: String },
    #[error("pmi {op} failed: {reason}")]
    Failed { op: String, reason: String },
    #[error("cannot send {what}: {reason}")]
    Invalid { what: String, reason: &'static str },
}

/// What a rank learns at init.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct JobInfo {
    pub rank: u32,
    pub size: u32,
    /// Index of this rank's executable on an MPMD command line.
    pub appnum: u32,
    /// The kvsname (PMI-1) or job id (PMI-2).
    pub jobid: String,
}

/// The operations every rank program needs, over either protocol version.
pub trait PmiClient {
    fn info(&self) -> &JobInfo;
    fn rank(&self) -> u32 {
        self.info().rank
    }
    fn size(&self) -> u32 {
        self.info().size
    }
    /// Stores a pair; others see it after the next [`fence`](PmiClient::fence).
    fn put(&mut self, key: &str, value: &str) -> Result<(), ClientError>;
    /// Waits until every rank of the job has fenced; puts made before it become visible.
    fn fence(&mut self) -> Result<(), ClientError>;
    /// `Ok(None)` when the key is not (yet) in the job's KVS.
    fn get(&mut self, key: &str) -> Result<Option<String>, ClientError>;
    fn finalize(&mut self) -> Result<(), ClientError>;
    /// Asks the launcher to kill the job. PMI-1 carries only the code, PMI-2 only the
    /// message; print the message yourself if it matters.
    fn abort(&mut self, exitcode: i32, msg: &str) -> Result<(), ClientError>;
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Version {
    Pmi1,
    Pmi2,
}

/// Connects to the server named by the environment and initialises with `version`.
pub fn connect(version: Version) -> Result<Box<dyn PmiClient + Send>, ClientError> {
    let conn = Connection::from_env()?;
    Ok(match version {
        Version::Pmi1 => Box::new(Pmi1Client::init(conn)?),
        Version::Pmi2 => Box::new(Pmi2Client::init(conn)?),
    })
}

enum Transport {
    Unix(UnixStream),
    Tcp(TcpStream),
}

/// One socket to the server with its read buffer: the server may send several lines in one
/// write (Hydra does for `initack`), so bytes past the current reply must be kept.
pub struct Connection {
    stream: Transport,
    buf: Vec<u8>,
    /// Who we are, if the environment or the `initack` handshake said so.
    rank: Option<u32>,
    size: Option<u32>,
    /// `PMI_JOBID`, passed on in the PMI-2 `fullinit`.
    pmi_jobid: Option<String>,
}

impl Connection {
    /// `PMI_FD` first, then `PMI_PORT`, as MPICH does. `PMI_FD` can be taken only once per
    /// process, since the connection closes the fd when dropped.
    pub fn from_env() -> Result<Connection, ClientError> {
        static FD_CLAIMED: AtomicBool = AtomicBool::new(false);
        Connection::from_vars(|name| std::env::var(name).ok(), &FD_CLAIMED)
    }

    fn from_vars(
        var: impl Fn(&str) -> Option<String>,
        fd_claimed: &AtomicBool,
    ) -> Result<Connection, ClientError> {
        let pmi_jobid = var("PMI_JOBID");
        if let Some(value) = var("PMI_FD") {
            let fd: RawFd = env_number("PMI_FD", &value)?;
            let proc_fd = format!("/proc/self/fd/{fd}");
            let known_closed = Path::new("/proc/self/fd").is_dir()
                && Path::new(&proc_fd).symlink_metadata().is_err();
            if fd < 0 || known_closed {
                return Err(ClientError::BadEnv {
                    name: "PMI_FD",
                    value,
                    reason: "no such open file descriptor",
                });
            }
            if fd_claimed.swap(true, Ordering::SeqCst) {
                return Err(ClientError::FdTaken);
            }
            // SAFETY: the launcher left this socket open for us (checked above where /proc
            // allows), and the flag makes this connection its only owner in the process.
            let stream = unsafe { UnixStream::from_raw_fd(fd) };
            let rank = var("PMI_RANK").map(|v| env_number("PMI_RANK", &v)).transpose()?;
            let size = var("PMI_SIZE").map(|v| env_number("PMI_SIZE", &v)).transpose()?;
            let mut conn = Connection::from_unix(stream, rank, size);
            conn.pmi_jobid = pmi_jobid;
            return Ok(conn);
        }
        if let Some(addr) = var("PMI_PORT") {
            let id = var("PMI_ID").ok_or(ClientError::NoPmiId)?;
            let mut conn = Connection::connect_port(&addr, env_number("PMI_ID", &id)?)?;
            conn.pmi_jobid = pmi_jobid;
            return Ok(conn);
        }
        Err(ClientError::NoServer)
    }

    /// A connection over a socket already open; `rank` and `size` as `PMI_RANK` and `PMI_SIZE`
    /// would give them (PMI-1 defaults them to 0 and 1, as MPICH does).
    pub fn from_unix(stream: UnixStream, rank: Option<u32>, size: Option<u32>) -> Connection {
        Connection { stream: Transport::Unix(stream), buf: Vec::new(), rank, size, pmi_jobid: None }
    }

    /// Connects over TCP and does the `initack` handshake, which tells us our rank and size.
    pub fn connect_port(addr: &str, pmiid: u32) -> Result<Connection, ClientError> {
        let stream = TcpStream::connect(addr)
            .map_err(|cause| ClientError::Connect { addr: addr.to_string(), cause })?;
        // Requests are small and strictly alternate with replies: Nagle only adds latency.
        stream.set_nodelay(true)?;
        let mut conn = Connection {
            stream: Transport::Tcp(stream),
            buf: Vec::new(),
            rank: None,
            size: None,
            pmi_jobid: None,
        };
        conn.send(&pmi1::Request::InitAck { pmiid }.encode())?;
        expect_cmd(&conn.read_line()?, "initack")?;
        // Then `set size`, `set rank`, `set debug`, one line each.
        for _ in 0..3 {
            let line = conn.read_line()?;
            expect_cmd(&line, "set")?;
            conn.size = line.number("size")?.or(conn.size);
            conn.rank = line.number("rank")?.or(conn.rank);
        }
        Ok(conn)
    }

    fn send(&mut self, bytes: &[u8]) -> Result<(), ClientError> {
        match &mut self.stream {
            Transport::Unix(s) => s.write_all(bytes)?,
            Transport::Tcp(s) => s.write_all(bytes)?,
        }
        Ok(())
    }

    /// Reads until `parse` finds a whole message, keeping what follows it.
    fn read_with<T, E>(
        &mut self,
        parse: impl Fn(&[u8]) -> Result<Option<(T, usize)>, E>,
    ) -> Result<T, ClientError>
    where
        ClientError: From<E>,
    {
        loop {
            if let Some((msg, used)) = parse(&self.buf)? {
                self.buf.drain(..used);
                return Ok(msg);
            }
            let mut chunk = [0u8; 4096];
            let read = match &mut self.stream {
                Transport::Unix(s) => s.read(&mut chunk),
                Transport::Tcp(s) => s.read(&mut chunk),
            };
            match read {
                Ok(0) => return Err(ClientError::Closed),
                Ok(n) => self.buf.extend_from_slice(&chunk[..n]),
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e.into()),
            }
        }
    }

    fn read_line(&mut self) -> Result<Line, ClientError> {
        self.read_with(pmi1::parse_response)
    }

    /// After `finalize` the server expects end of file, not more requests.
    fn shutdown(&self) {
        // The server may already have closed its end; nothing is lost then.
        let _ = match &self.stream {
            Transport::Unix(s) => s.shutdown(Shutdown::Both),
            Transport::Tcp(s) => s.shutdown(Shutdown::Both),
        };
    }
}

pub(crate) fn env_number<T: FromStr>(name: &'static str, value: &str) -> Result<T, ClientError> {
    value.trim().parse().map_err(|_| ClientError::BadEnv {
        name,
        value: value.to_string(),
        reason: "not a valid number",
    })
}

pub(crate) fn expect_cmd(line: &Line, expected: &str) -> Result<(), ClientError> {
    if line.cmd == expected {
        return Ok(());
    }
    Err(ClientError::UnexpectedReply { expected: expected.to_string(), got: line.cmd.clone() })
}

/// Why a PMI-1 reply said no: its `msg`, or its `rc`.
pub(crate) fn pmi1_failure(op: &str, line: &Line) -> ClientError {
    let reason = match (line.get("msg"), line.get("rc")) {
        (Some(msg), _) => msg.to_string(),
        (None, Some(rc)) => format!("rc={rc}"),
        (None, None) => "no rc in the reply".to_string(),
    };
    ClientError::Failed { op: op.to_string(), reason }
}

/// PMI-1 values end at a space and lines at a newline; neither can be escaped.
pub(crate) fn check_token(what: impl FnOnce() -> String, token: &str) -> Result<(), ClientError> {
    if token.contains([' ', '\n']) {
        return Err(ClientError::Invalid {
            what: what(),
            reason: "pmi-1 cannot carry spaces or newlines",
        });
    }
    Ok(())
}
#[cfg(test)]
mod tests {
    use std::collections::HashMap;
    use std::net::TcpListener;
    use std::os::unix::io::IntoRawFd;
    use std::thread;

    use super::*;
    use crate::pmi1::Response as R1;
    use crate::pmi2::{Protocol, Request as Q2, Response as R2};

    /// A one-rank server speaking both protocols through the codecs; returns the commands
    /// it saw once the client hangs up.
    #[derive(Default)]
    struct FakeServer {
        pending: Vec<(String, String)>,
        kvs: HashMap<String, String>,
        names: HashMap<String, String>,
        seen: Vec<String>,
    }

    impl FakeServer {
        fn serve(mut self, mut stream: impl Read + Write) -> Vec<String> {
            let mut buf = Vec::new();
            loop {
                while let Some(reply) = self.next(&mut buf) {
                    stream.write_all(&reply).unwrap();
                }
                let mut chunk = [0u8; 512];
                match stream.read(&mut chunk).unwrap() {
                    0 => return self.seen,
                    n => buf.extend_from_slice(&chunk[..n]),
                }
            }
        }

        /// Handles one buffered message; `Some(vec![])` for a message without a reply.
        fn next(&mut self, buf: &mut Vec<u8>) -> Option<Vec<u8>> {
            let (reply, used) = match pmi2::detect(buf)? {
                Protocol::Pmi1 => {
                    let (req, used) = pmi1::parse_request(buf).unwrap()?;
                    (self.pmi1(req), used)
                }
                Protocol::Pmi2 => {
                    let (env, used) = pmi2::parse_request(buf).unwrap()?;
                    (self.pmi2(env.request).map(|r| r.encode(env.thrid.as_deref())), used)
                }
            };
            buf.drain(..used);
            Some(reply.unwrap_or_default())
        }

        fn fence(&mut self) {
            self.kvs.extend(self.pending.drain(..));
        }

        fn pmi1(&mut self, req: pmi1::Request) -> Option<Vec<u8>> {
            use pmi1::Request::*;
            self.seen.push(format!("{req:?}").split([' ', '{', '(']).next().unwrap().to_string());
            let reply = match req {
                Init { version, subversion } => R1::InitOk { version, subversion },
                GetMaxes => R1::Maxes,
                GetAppnum => R1::Appnum { appnum: 0 },
                GetMyKvsname => R1::MyKvsname { kvsname: "kvs_test".into() },
                GetUniverseSize => R1::UniverseSize { size: -1 },
                Put { key, value, .. } => {
                    self.pending.push((key, value));
                    R1::PutOk
                }
                Get { key, .. } => match self.kvs.get(&key) {
                    Some(value) => R1::GetFound { value: value.clone() },
                    None => R1::GetNotFound { key },
                },
                BarrierIn => {
                    self.fence();
                    R1::BarrierOut
                }
                Finalize => R1::FinalizeAck,
                PublishName { service, port } if !self.names.contains_key(&service) => {
                    self.names.insert(service, port);
                    R1::PublishOk
                }
                PublishName { .. } => R1::PublishDuplicate,
                UnpublishName { service } => match self.names.remove(&service) {
                    Some(_) => R1::UnpublishOk,
                    None => R1::UnpublishNotFound,
                },
                LookupName { service } => match self.names.get(&service) {
                    Some(port) => R1::LookupFound { port: port.clone() },
                    None => R1::LookupNotFound,
                },
                InitAck { pmiid } => R1::InitAck { size: 1, rank: pmiid },
                Abort { .. } | Spawn(_) | Unknown { .. } => return None,
            };
            Some(reply.encode())
        }

        fn pmi2(&mut self, req: Q2) -> Option<R2> {
            self.seen.push(format!("{req:?}").split([' ', '{', '(']).next().unwrap().to_string());
            Some(match req {
                Q2::FullInit { .. } => {
                    R2::FullInit { rank: 0, size: 1, appnum: 0, spawner_jobid: None }
                }
                Q2::JobGetId => R2::JobGetId { jobid: "kvs_test".into() },
                Q2::GetJobAttr { key } => R2::GetJobAttr {
                    value: (key == "PMI_process_mapping").then(|| "(vector,(0,1,1))".into()),
                },
                Q2::KvsPut { key, value } => {
                    self.pending.push((key, value));
                    R2::KvsPut
                }
                Q2::KvsFence => {
                    self.fence();
                    R2::KvsFence
                }
                Q2::KvsGet { key, .. } => R2::KvsGet { value: self.kvs.get(&key).cloned() },
                Q2::NamePublish { name, port, .. } if !self.names.contains_key(&name) => {
                    self.names.insert(name, port);
                    R2::NamePublish
                }
                Q2::NamePublish { name, .. } => R2::Failed {
                    cmd: "name-publish".into(),
                    errmsg: format!("duplicate_service_{name}"),
                },
                Q2::NameLookup { name, .. } => {
                    R2::NameLookup { port: self.names.get(&name).cloned() }
                }
                Q2::NameUnpublish { name, .. } => match self.names.remove(&name) {
                    Some(_) => R2::NameUnpublish,
                    None => R2::Failed { cmd: "name-unpublish".into(), errmsg: "not found".into() },
                },
                Q2::Finalize => R2::Finalize,
                _ => return None,
            })
        }
    }

    fn exercise(client: &mut dyn PmiClient) {
        assert_eq!(
            (client.rank(), client.size(), client.info().jobid.as_str()),
            (0, 1, "kvs_test")
        );
        client.put("card", "value=with;odd=chars").unwrap();
        // Puts become visible at the next fence, not before.
        assert_eq!(client.get("card").unwrap(), None);
        client.fence().unwrap();
        assert_eq!(client.get("card").unwrap().as_deref(), Some("value=with;odd=chars"));
        client.finalize().unwrap();
    }

    #[test]
    fn pmi1_client_against_a_fake_server() {
        let (ours, theirs) = UnixStream::pair().unwrap();
        let server = thread::spawn(move || FakeServer::default().serve(theirs));
        let mut client = Pmi1Client::init(Connection::from_unix(ours, Some(0), Some(1))).unwrap();
        assert_eq!(client.universe_size().unwrap(), None);
        client.publish("svc", "port-1").unwrap();
        assert!(matches!(client.publish("svc", "port-2"), Err(ClientError::Failed { .. })));
        assert_eq!(client.lookup("svc").unwrap().as_deref(), Some("port-1"));
        client.unpublish("svc").unwrap();
        assert_eq!(client.lookup("svc").unwrap(), None);
        let err = client.put("k", "has space").unwrap_err();
        assert_eq!(
            err.to_string(),
            "cannot send the value of k: pmi-1 cannot carry spaces or newlines"
        );
        exercise(&mut client);
        let seen = server.join().unwrap();
        assert_eq!(&seen[..4], ["Init", "GetMaxes", "GetAppnum", "GetMyKvsname"]);
        assert_eq!(seen.last().unwrap(), "Finalize");
    }

    #[test]
    fn pmi2_client_against_a_fake_server() {
        let (ours, theirs) = UnixStream::pair().unwrap();
        let server = thread::spawn(move || FakeServer::default().serve(theirs));
        let mut client = Pmi2Client::init(Connection::from_unix(ours, Some(0), None)).unwrap();
        assert_eq!(
            client.get_job_attr("PMI_process_mapping").unwrap().as_deref(),
            Some("(vector,(0,1,1))")
        );
        assert_eq!(client.get_job_attr("universeSize").unwrap(), None);
        client.publish("svc", "port;1").unwrap();
        let err = client.publish("svc", "port;2").unwrap_err();
        assert_eq!(err.to_string(), "pmi name-publish failed: duplicate_service_svc");
        assert_eq!(client.lookup("svc").unwrap().as_deref(), Some("port;1"));
        client.unpublish("svc").unwrap();
        assert_eq!(client.lookup("svc").unwrap(), None);
        exercise(&mut client);
        let seen = server.join().unwrap();
        assert_eq!(&seen[..3], ["Init", "FullInit", "JobGetId"]);
    }

    #[test]
    fn port_mode_does_the_initack_handshake() {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap().to_string();
        let server =
            thread::spawn(move || FakeServer::default().serve(listener.accept().unwrap().0));
        let vars = |name: &str| match name {
            "PMI_PORT" => Some(addr.clone()),
            "PMI_ID" => Some("0".to_string()),
            _ => None,
        };
        let conn = Connection::from_vars(vars, &AtomicBool::new(false)).unwrap();
        assert_eq!((conn.rank, conn.size), (Some(0), Some(1)));
        exercise(&mut Pmi1Client::init(conn).unwrap());
        assert_eq!(server.join().unwrap()[0], "InitAck");
    }

    #[test]
    fn fd_mode_takes_the_fd_once() {
        let (ours, theirs) = UnixStream::pair().unwrap();
        let fd = ours.into_raw_fd().to_string();
        let server = thread::spawn(move || FakeServer::default().serve(theirs));
        let claimed = AtomicBool::new(false);
        let vars = |name: &str| match name {
            "PMI_FD" => Some(fd.clone()),
            "PMI_RANK" => Some("0".to_string()),
            _ => None,
        };
        let conn = Connection::from_vars(vars, &claimed).unwrap();
        assert!(matches!(Connection::from_vars(vars, &claimed), Err(ClientError::FdTaken)));
        exercise(&mut Pmi1Client::init(conn).unwrap());
        server.join().unwrap();
    }

    #[test]
    fn environment_errors_are_plain() {
        let none = AtomicBool::new(false);
        let err = |vars: &[(&str, &str)]| {
            let vars: HashMap<String, String> =
                vars.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
            Connection::from_vars(|name| vars.get(name).cloned(), &none).err().unwrap().to_string()
        };
        assert_eq!(err(&[]), "not started by a pmi launcher: neither PMI_FD nor PMI_PORT is set");
        assert_eq!(err(&[("PMI_FD", "six")]), "bad PMI_FD=\"six\": not a valid number");
        assert_eq!(err(&[("PMI_FD", "-1")]), "bad PMI_FD=\"-1\": no such open file descriptor");
        assert_eq!(err(&[("PMI_PORT", "127.0.0.1:1")]), "PMI_PORT is set but PMI_ID is not");
        assert!(err(&[("PMI_PORT", "127.0.0.1:1"), ("PMI_ID", "0")])
            .starts_with("cannot connect to the pmi server at 127.0.0.1:1: "));
    }
}
