//! PMI-1 ("simple PMI" 1.1): the line protocol every MPICH rank speaks by default (docs/pmi.md, *PMI-1*).
//!
//! ```text
//! request:  cmd=<name> key=value key=value\n        one line, at most 1024 bytes
//! spawn:    mcmd=spawn\n key=value\n ... endcmd\n   one block per executable, many writes
//! reply:    cmd=<name> key=value ...\n
//! ```
//!
//! There is no escaping: a value runs to the next space or newline and may contain `=`.
//! Server side: [`parse_request`] and [`Response::encode`]. Client side: [`Request::encode`]
//! and [`parse_response`]. Unknown commands parse as [`Request::Unknown`] rather than failing,
//! so that the server can name them when it tears the job down. Spawn blocks are
//! `spawn.rs`'s.

use std::str::FromStr;

mod spawn;

use spawn::parse_block;
pub use spawn::SpawnBlock;

/// Longest line a client accepts or sends, newline included.
pub const MAX_LINE: usize = 1024;
/// Longest `mcmd=spawn ... endcmd` block we buffer before calling it garbage.
pub const MAX_BLOCK: usize = 64 << 10;
/// What the server announces in `cmd=maxes` (Hydra's numbers).
pub const KVSNAME_MAX: usize = 256;
pub const KEYLEN_MAX: usize = 64;
pub const VALLEN_MAX: usize = 1024;
/// With the maxes above MPICH shrinks its value buffer to 1024 - 256 - 64 - 30 bytes, so
/// every value served (including `PMI_process_mapping`) must be shorter than this.
pub const SERVED_VALUE_LIMIT: usize = MAX_LINE - KVSNAME_MAX - KEYLEN_MAX - 30;

#[derive(Debug, Clone, thiserror::Error, PartialEq, Eq)]
pub enum Pmi1Error {
    #[error("pmi-1 line longer than {MAX_LINE} bytes")]
    LineTooLong,
    #[error("pmi-1 spawn block longer than {MAX_BLOCK} bytes")]
    BlockTooLarge,
    #[error("pmi-1 message is not valid utf-8")]
    NotUtf8,
    #[error("not a pmi-1 message: it starts with {0:?}")]
    NotPmi1(String),
    #[error("pmi-1 message has an empty command name")]
    EmptyCommand,
    #[error("pmi-1 {cmd}: {token:?} is not a key=value pair")]
    NoEquals { cmd: String, token: String },
    #[error("pmi-1 {cmd}: missing {key}")]
    MissingKey { cmd: String, key: String },
    #[error("pmi-1 {cmd}: {key}={value} is not a valid number")]
    BadNumber { cmd: String, key: String, value: String },
}

/// A request from a rank.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Request {
    /// `version` 2 is the opening line of a PMI-2 connection.
    Init {
        version: u32,
        subversion: u32,
    },
    GetMaxes,
    GetAppnum,
    GetMyKvsname,
    GetUniverseSize,
    Put {
        kvsname: String,
        key: String,
        value: String,
    },
    Get {
        kvsname: String,
        key: String,
    },
    BarrierIn,
    Finalize,
    /// Old clients send no exit code; the server picks one.
    Abort {
        exitcode: Option<i32>,
    },
    PublishName {
        service: String,
        port: String,
    },
    UnpublishName {
        service: String,
    },
    LookupName {
        service: String,
    },
    /// The `-pmi-port` handshake: which rank this TCP connection belongs to.
    InitAck {
        pmiid: u32,
    },
    Spawn(Box<SpawnBlock>),
    /// A well-formed message with a command we do not serve. `raw` is the message without its
    /// final newline (a whole block for an unknown `mcmd=`).
    Unknown {
        cmd: String,
        raw: String,
    },
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Response {
    InitOk {
        version: u32,
        subversion: u32,
    },
    Maxes,
    Appnum {
        appnum: u32,
    },
    MyKvsname {
        kvsname: String,
    },
    /// Negative means "unknown": MPICH then reports `MPI_UNIVERSE_SIZE` as absent.
    UniverseSize {
        size: i32,
    },
    PutOk,
    GetFound {
        value: String,
    },
    GetNotFound {
        key: String,
    },
    BarrierOut,
    FinalizeAck,
    PublishOk,
    PublishDuplicate,
    UnpublishOk,
    UnpublishNotFound,
    LookupFound {
        port: String,
    },
    LookupNotFound,
    /// `errcodes`, if not empty, must hold one code per new process.
    SpawnOk {
        errcodes: Vec<i32>,
    },
    /// The spawn did not happen: `reason` goes in `msg`, one word as PMI-1 values are.
    SpawnFailed {
        reason: String,
    },
    /// The 4-line answer to [`Request::InitAck`].
    InitAck {
        size: u32,
        rank: u32,
    },
}

/// One line split into its command and pairs; what a client makes of any reply.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Line {
    pub cmd: String,
    /// In wire order, duplicates kept; lookups take the first.
    pub pairs: Vec<(String, String)>,
}

impl Line {
    pub fn get(&self, key: &str) -> Option<&str> {
        self.pairs.iter().find(|(k, _)| k == key).map(|(_, v)| v.as_str())
    }

    pub fn require(&self, key: &str) -> Result<&str, Pmi1Error> {
        self.get(key).ok_or_else(|| missing(&self.cmd, key))
    }

    /// A numeric field; `Ok(None)` when absent.
    pub fn number<T: FromStr>(&self, key: &str) -> Result<Option<T>, Pmi1Error> {
        self.get(key).map(|v| to_number(&self.cmd, key, v)).transpose()
    }

    pub fn require_number<T: FromStr>(&self, key: &str) -> Result<T, Pmi1Error> {
        to_number(&self.cmd, key, self.require(key)?)
    }
}

fn missing(cmd: &str, key: &str) -> Pmi1Error {
    Pmi1Error::MissingKey { cmd: cmd.to_string(), key: key.to_string() }
}

fn to_number<T: FromStr>(cmd: &str, key: &str, value: &str) -> Result<T, Pmi1Error> {
    value.parse().map_err(|_| Pmi1Error::BadNumber {
        cmd: cmd.to_string(),
        key: key.to_string(),
        value: value.to_string(),
    })
}

/// Parses one request from the start of `buf`: `Ok(None)` for every strict prefix of a
/// request, otherwise the request and the number of bytes it took.
pub fn parse_request(buf: &[u8]) -> Result<Option<(Request, usize)>, Pmi1Error> {
    check_start(buf, true)?;
    if buf.starts_with(b"mcmd=") {
        return parse_block(buf);
    }
    let Some((text, used)) = take_line(buf)? else { return Ok(None) };
    Ok(Some((request_from_line(text)?, used)))
}

/// Parses one reply line from the start of `buf` (client side); `Ok(None)` until the whole
/// line has arrived.
pub fn parse_response(buf: &[u8]) -> Result<Option<(Line, usize)>, Pmi1Error> {
    check_start(buf, false)?;
    let Some((text, used)) = take_line(buf)? else { return Ok(None) };
    Ok(Some((split_line(text)?, used)))
}

/// Fails as soon as the first bytes cannot begin `cmd=` (or `mcmd=`), so that garbage is
/// reported without waiting for a newline that may never come.
fn check_start(buf: &[u8], allow_block: bool) -> Result<(), Pmi1Error> {
    let could_be = |p: &[u8]| buf[..buf.len().min(p.len())] == p[..buf.len().min(p.len())];
    if could_be(b"cmd=") || (allow_block && could_be(b"mcmd=")) {
        return Ok(());
    }
    let head = &buf[..buf.len().min(16)];
    Err(Pmi1Error::NotPmi1(String::from_utf8_lossy(head).into_owned()))
}

/// The first line of `buf` without its newline, and the bytes it took with the newline.
fn take_line(buf: &[u8]) -> Result<Option<(&str, usize)>, Pmi1Error> {
    let window = &buf[..buf.len().min(MAX_LINE)];
    let Some(nl) = window.iter().position(|&b| b == b'\n') else {
        return if buf.len() >= MAX_LINE { Err(Pmi1Error::LineTooLong) } else { Ok(None) };
    };
    let text = std::str::from_utf8(&buf[..nl]).map_err(|_| Pmi1Error::NotUtf8)?;
    Ok(Some((text, nl + 1)))
}

/// Splits `cmd=<name> k=v k=v`; runs of spaces are one separator.
fn split_line(text: &str) -> Result<Line, Pmi1Error> {
    let mut tokens = text.split(' ').filter(|t| !t.is_empty());
    let cmd = tokens.next().and_then(|t| t.strip_prefix("cmd=")).unwrap_or("");
    if cmd.is_empty() {
        return Err(Pmi1Error::EmptyCommand);
    }
    let pairs = tokens
        .map(|t| {
            t.split_once('=')
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .ok_or_else(|| Pmi1Error::NoEquals { cmd: cmd.to_string(), token: t.to_string() })
        })
        .collect::<Result<_, _>>()?;
    Ok(Line { cmd: cmd.to_string(), pairs })
}

fn request_from_line(text: &str) -> Result<Request, Pmi1Error> {
    let line = split_line(text)?;
    let string = |key: &str| line.require(key).map(str::to_string);
    Ok(match line.cmd.as_str() {
        "init" => Request::Init {
            version: line.require_number("pmi_version")?,
            subversion: line.require_number("pmi_subversion")?,
        },
        "get_maxes" => Request::GetMaxes,
        "get_appnum" => Request::GetAppnum,
        "get_my_kvsname" => Request::GetMyKvsname,
        "get_universe_size" => Request::GetUniverseSize,
        "put" => Request::Put {
            kvsname: string("kvsname")?,
            key: string("key")?,
            value: string("value")?,
        },
        "get" => Request::Get { kvsname: string("kvsname")?, key: string("key")? },
        "barrier_in" => Request::BarrierIn,
        "finalize" => Request::Finalize,
        "abort" => Request::Abort { exitcode: line.number("exitcode")? },
        "publish_name" => {
            Request::PublishName { service: string("service")?, port: string("port")? }
        }
        "unpublish_name" => Request::UnpublishName { service: string("service")? },
        "lookup_name" => Request::LookupName { service: string("service")? },
        "initack" => Request::InitAck { pmiid: line.require_number("pmiid")? },
        other => Request::Unknown { cmd: other.to_string(), raw: text.to_string() },
    })
}
impl Request {
    /// The bytes a client writes, final newline included. Values must not contain spaces or
    /// newlines (spawn arguments may contain spaces); PMI-1 has no way to escape them.
    pub fn encode(&self) -> Vec<u8> {
        let text = match self {
            Request::Init { version, subversion } => {
                format!("cmd=init pmi_version={version} pmi_subversion={subversion}")
            }
            Request::GetMaxes => "cmd=get_maxes".to_string(),
            Request::GetAppnum => "cmd=get_appnum".to_string(),
            Request::GetMyKvsname => "cmd=get_my_kvsname".to_string(),
            Request::GetUniverseSize => "cmd=get_universe_size".to_string(),
            Request::Put { kvsname, key, value } => {
                format!("cmd=put kvsname={kvsname} key={key} value={value}")
            }
            Request::Get { kvsname, key } => format!("cmd=get kvsname={kvsname} key={key}"),
            Request::BarrierIn => "cmd=barrier_in".to_string(),
            Request::Finalize => "cmd=finalize".to_string(),
            Request::Abort { exitcode: Some(code) } => format!("cmd=abort exitcode={code}"),
            Request::Abort { exitcode: None } => "cmd=abort".to_string(),
            Request::PublishName { service, port } => {
                format!("cmd=publish_name service={service} port={port}")
            }
            Request::UnpublishName { service } => format!("cmd=unpublish_name service={service}"),
            Request::LookupName { service } => format!("cmd=lookup_name service={service}"),
            Request::InitAck { pmiid } => format!("cmd=initack pmiid={pmiid}"),
            Request::Spawn(block) => block.encode_lines(),
            Request::Unknown { raw, .. } => raw.clone(),
        };
        let mut out = text.into_bytes();
        out.push(b'\n');
        out
    }
}

impl Response {
    /// The reply line(s), final newline included. Values must not contain spaces or newlines
    /// and must stay under [`SERVED_VALUE_LIMIT`] bytes.
    pub fn encode(&self) -> Vec<u8> {
        let text = match self {
            Response::InitOk { version, subversion } => format!(
                "cmd=response_to_init pmi_version={version} pmi_subversion={subversion} rc=0"
            ),
            Response::Maxes => format!(
                "cmd=maxes kvsname_max={KVSNAME_MAX} keylen_max={KEYLEN_MAX} \
                 vallen_max={VALLEN_MAX}"
            ),
            Response::Appnum { appnum } => format!("cmd=appnum appnum={appnum}"),
            Response::MyKvsname { kvsname } => format!("cmd=my_kvsname kvsname={kvsname}"),
            Response::UniverseSize { size } => format!("cmd=universe_size size={size}"),
            Response::PutOk => "cmd=put_result rc=0 msg=success".to_string(),
            Response::GetFound { value } => {
                format!("cmd=get_result rc=0 msg=success value={value}")
            }
            Response::GetNotFound { key } => {
                format!("cmd=get_result rc=-1 msg=key_{key}_not_found value=unknown")
            }
            Response::BarrierOut => "cmd=barrier_out".to_string(),
            Response::FinalizeAck => "cmd=finalize_ack".to_string(),
            Response::PublishOk => "cmd=publish_result info=ok rc=0 msg=success".to_string(),
            Response::PublishDuplicate => {
                "cmd=publish_result info=ok rc=1 msg=key_already_present".to_string()
            }
            Response::UnpublishOk => "cmd=unpublish_result info=ok rc=0 msg=success".to_string(),
            Response::UnpublishNotFound => {
                "cmd=unpublish_result info=ok rc=1 msg=service_not_found".to_string()
            }
            Response::LookupFound { port } => {
                format!("cmd=lookup_result port={port} info=ok rc=0 msg=success")
            }
            Response::LookupNotFound => "cmd=lookup_result rc=1 msg=service_not_found".to_string(),
            Response::SpawnOk { errcodes } if errcodes.is_empty() => {
                "cmd=spawn_result rc=0".to_string()
            }
            Response::SpawnOk { errcodes } => {
                let codes: Vec<String> = errcodes.iter().map(i32::to_string).collect();
                format!("cmd=spawn_result rc=0 errcodes={}", codes.join(","))
            }
            Response::SpawnFailed { reason } => {
                let word: String = reason
                    .chars()
                    .map(|c| if c.is_whitespace() || c == '=' { '_' } else { c })
                    .take(VALLEN_MAX)
                    .collect();
                format!("cmd=spawn_result rc=-1 msg={word}")
            }
            Response::InitAck { size, rank } => {
                format!("cmd=initack\ncmd=set size={size}\ncmd=set rank={rank}\ncmd=set debug=0")
            }
        };
        let mut out = text.into_bytes();
        out.push(b'\n');
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse_all(bytes: &[u8]) -> Request {
        for cut in 0..bytes.len() {
            assert_eq!(parse_request(&bytes[..cut]), Ok(None), "prefix {cut} of {bytes:?}");
        }
        let (req, used) = parse_request(bytes).unwrap().unwrap();
        assert_eq!(used, bytes.len());
        req
    }

    fn sample_spawn() -> SpawnBlock {
        SpawnBlock {
            nprocs: 2,
            execname: "/usr/bin/python3".into(),
            totspawns: 1,
            spawnssofar: 1,
            args: vec!["/path/client.py".into(), "child".into(), "arg with space=x".into()],
            preput: vec![("PARENT_ROOT_PORT_NAME".into(), "tag#0$desc=x$".into())],
            info: vec![("wdir".into(), "/some/dir".into())],
        }
    }

    #[test]
    fn requests_roundtrip_and_every_prefix_is_incomplete() {
        let all = [
            Request::Init { version: 1, subversion: 1 },
            Request::Init { version: 2, subversion: 0 },
            Request::GetMaxes,
            Request::GetAppnum,
            Request::GetMyKvsname,
            Request::GetUniverseSize,
            Request::Put { kvsname: "kvs_1".into(), key: "k".into(), value: "segments=2".into() },
            Request::Put { kvsname: "kvs_1".into(), key: "k".into(), value: String::new() },
            Request::Get { kvsname: "kvs_1".into(), key: "PMI_process_mapping".into() },
            Request::BarrierIn,
            Request::Finalize,
            Request::Abort { exitcode: Some(42) },
            Request::Abort { exitcode: None },
            Request::PublishName { service: "s".into(), port: "p".into() },
            Request::UnpublishName { service: "s".into() },
            Request::LookupName { service: "s".into() },
            Request::InitAck { pmiid: 3 },
            Request::Spawn(Box::new(sample_spawn())),
            Request::Unknown { cmd: "frobnicate".into(), raw: "cmd=frobnicate  x=1".into() },
        ];
        for req in all {
            assert_eq!(parse_all(&req.encode()), req);
        }
    }

    #[test]
    fn captured_lines_parse() {
        let line = b"cmd=put kvsname=kvs_7601_0_1545258719_vm key=-bcast-1-0 value=2F6465760A\n";
        assert_eq!(
            parse_all(line),
            Request::Put {
                kvsname: "kvs_7601_0_1545258719_vm".into(),
                key: "-bcast-1-0".into(),
                value: "2F6465760A".into()
            }
        );
        // Token order is irrelevant and runs of spaces separate.
        assert_eq!(
            parse_all(b"cmd=init  pmi_subversion=1 pmi_version=1\n"),
            Request::Init { version: 1, subversion: 1 }
        );
    }

    #[test]
    fn spawn_block_as_the_client_writes_it() {
        let block = "mcmd=spawn\nnprocs=2\nexecname=/usr/bin/python3\ntotspawns=1\n\
                     spawnssofar=1\narg1=/path/client.py\narg2=child\narg3=arg with space=x\n\
                     argcnt=3\npreput_num=1\npreput_key_0=PARENT_ROOT_PORT_NAME\n\
                     preput_val_0=tag#0$desc=x$\ninfo_num=1\ninfo_key_0=wdir\n\
                     info_val_0=/some/dir\nendcmd\n";
        assert_eq!(parse_all(block.as_bytes()), Request::Spawn(Box::new(sample_spawn())));
        // A following request stays in the buffer.
        let mut two = block.as_bytes().to_vec();
        two.extend_from_slice(b"cmd=barrier_in\n");
        assert_eq!(parse_request(&two).unwrap().unwrap().1, block.len());
    }

    #[test]
    fn bad_input_is_named() {
        assert_eq!(
            parse_request(b"GET / HTTP/1.1\r\n"),
            Err(Pmi1Error::NotPmi1("GET / HTTP/1.1\r\n".into()))
        );
        assert!(matches!(parse_request(b"x"), Err(Pmi1Error::NotPmi1(_))));
        assert_eq!(
            parse_request(b"cmd=get kvsname=k\n"),
            Err(Pmi1Error::MissingKey { cmd: "get".into(), key: "key".into() })
        );
        assert_eq!(
            parse_request(b"cmd=abort exitcode=x\n").unwrap_err().to_string(),
            "pmi-1 abort: exitcode=x is not a valid number"
        );
        assert_eq!(
            parse_request(b"cmd=put oops\n").unwrap_err().to_string(),
            "pmi-1 put: \"oops\" is not a key=value pair"
        );
        assert_eq!(parse_request(b"cmd=\n"), Err(Pmi1Error::EmptyCommand));
        assert_eq!(parse_request(b"cmd=get \xff\n"), Err(Pmi1Error::NotUtf8));
        let spawn = b"mcmd=spawn\nnprocs=1\nexecname=a\ntotspawns=1\nspawnssofar=1\nargcnt=2\narg1=x\nendcmd\n";
        assert_eq!(
            parse_request(spawn),
            Err(Pmi1Error::MissingKey { cmd: "spawn".into(), key: "arg2".into() })
        );
        // Garbage inside a block is refused before its endcmd arrives.
        assert_eq!(
            parse_request(
                b"mcmd=spawn
nprocs=1
oops
"
            ),
            Err(Pmi1Error::NoEquals { cmd: "spawn".into(), token: "oops".into() })
        );
    }

    #[test]
    fn unknown_commands_are_not_errors() {
        let (req, _) = parse_request(b"cmd=frobnicate a=b\n").unwrap().unwrap();
        assert_eq!(
            req,
            Request::Unknown { cmd: "frobnicate".into(), raw: "cmd=frobnicate a=b".into() }
        );
        let (req, used) = parse_request(b"mcmd=other\nx=1\nendcmd\n").unwrap().unwrap();
        assert_eq!(
            req,
            Request::Unknown { cmd: "other".into(), raw: "mcmd=other\nx=1\nendcmd".into() }
        );
        assert_eq!(used, 22);
    }

    #[test]
    fn limits() {
        let mut line = b"cmd=put kvsname=k key=k value=".to_vec();
        line.resize(MAX_LINE - 1, b'A');
        line.push(b'\n');
        assert!(parse_request(&line).unwrap().is_some());
        line.insert(40, b'A');
        assert_eq!(parse_request(&line), Err(Pmi1Error::LineTooLong));
        assert_eq!(parse_request(&line[..MAX_LINE]), Err(Pmi1Error::LineTooLong));
        assert_eq!(parse_request(&line[..MAX_LINE - 1]), Ok(None));

        let mut block = b"mcmd=spawn\n".to_vec();
        while block.len() < MAX_BLOCK {
            block.extend_from_slice(b"arg1=xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx\n");
        }
        assert_eq!(parse_request(&block), Err(Pmi1Error::BlockTooLarge));
    }

    #[test]
    fn replies_are_hydras_exact_words() {
        let cases: [(Response, &str); 18] = [
            (
                Response::InitOk { version: 1, subversion: 1 },
                "cmd=response_to_init pmi_version=1 pmi_subversion=1 rc=0\n",
            ),
            (Response::Maxes, "cmd=maxes kvsname_max=256 keylen_max=64 vallen_max=1024\n"),
            (Response::Appnum { appnum: 0 }, "cmd=appnum appnum=0\n"),
            (
                Response::MyKvsname { kvsname: "kvs_fake_0".into() },
                "cmd=my_kvsname kvsname=kvs_fake_0\n",
            ),
            (Response::UniverseSize { size: -1 }, "cmd=universe_size size=-1\n"),
            (Response::PutOk, "cmd=put_result rc=0 msg=success\n"),
            (
                Response::GetFound { value: "(vector,(0,1,1))".into() },
                "cmd=get_result rc=0 msg=success value=(vector,(0,1,1))\n",
            ),
            (
                Response::GetNotFound { key: "-bcast-1-0".into() },
                "cmd=get_result rc=-1 msg=key_-bcast-1-0_not_found value=unknown\n",
            ),
            (Response::BarrierOut, "cmd=barrier_out\n"),
            (Response::FinalizeAck, "cmd=finalize_ack\n"),
            (Response::PublishOk, "cmd=publish_result info=ok rc=0 msg=success\n"),
            (
                Response::PublishDuplicate,
                "cmd=publish_result info=ok rc=1 msg=key_already_present\n",
            ),
            (Response::UnpublishOk, "cmd=unpublish_result info=ok rc=0 msg=success\n"),
            (
                Response::UnpublishNotFound,
                "cmd=unpublish_result info=ok rc=1 msg=service_not_found\n",
            ),
            (
                Response::LookupFound { port: "P".into() },
                "cmd=lookup_result port=P info=ok rc=0 msg=success\n",
            ),
            (Response::LookupNotFound, "cmd=lookup_result rc=1 msg=service_not_found\n"),
            (Response::SpawnOk { errcodes: vec![0, 0] }, "cmd=spawn_result rc=0 errcodes=0,0\n"),
            (
                Response::InitAck { size: 2, rank: 1 },
                "cmd=initack\ncmd=set size=2\ncmd=set rank=1\ncmd=set debug=0\n",
            ),
        ];
        for (resp, text) in cases {
            assert_eq!(String::from_utf8(resp.encode()).unwrap(), text);
        }
        assert_eq!(Response::SpawnOk { errcodes: vec![] }.encode(), b"cmd=spawn_result rc=0\n");
        let failed = Response::SpawnFailed { reason: "host x=1 is not here".into() };
        assert_eq!(failed.encode(), b"cmd=spawn_result rc=-1 msg=host_x_1_is_not_here\n");
        assert_eq!(SERVED_VALUE_LIMIT, 674);
    }

    #[test]
    fn responses_parse_line_by_line() {
        let bytes = Response::InitAck { size: 2, rank: 1 }.encode();
        for cut in 0..12 {
            assert_eq!(parse_response(&bytes[..cut]), Ok(None));
        }
        let (first, used) = parse_response(&bytes).unwrap().unwrap();
        assert_eq!((first.cmd.as_str(), used), ("initack", 12));
        let (second, _) = parse_response(&bytes[used..]).unwrap().unwrap();
        assert_eq!(second.require_number::<u32>("size"), Ok(2));

        let (get, _) =
            parse_response(&Response::GetNotFound { key: "k".into() }.encode()).unwrap().unwrap();
        assert_eq!(get.number::<i32>("rc"), Ok(Some(-1)));
        assert_eq!(get.get("value"), Some("unknown"));
        assert!(parse_response(b"mcmd=spawn\n").is_err());
    }
}
