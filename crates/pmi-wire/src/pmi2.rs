//! PMI-2: length-framed `key=value;` commands (PMI.md §3).
//!
//! ```text
//! frame:  "38    " "cmd=kvs-put;key=k;value=a;;b;thrid=7;"
//!         6-byte ASCII decimal body length, left- or right-justified with spaces,
//!         then the body: every pair ends with ';', a ';' inside a value is doubled
//! ```
//!
//! A PMI-2 connection still opens with the PMI-1 line `cmd=init pmi_version=2
//! pmi_subversion=0` (see [`crate::pmi1`]); [`detect`] tells the two apart by the first bytes of
//! each message. [`parse_frame`] yields a generic [`Command`]; [`parse_request`] types it as a
//! [`Request`] and keeps the `thrid` that the reply must echo. Replies are [`Response`]s, or
//! any [`Command`] built with [`Command::reply_to`].

use std::collections::HashMap;
use std::str::FromStr;

/// Length of the ASCII length header.
pub const HEADER_LEN: usize = 6;
/// Longest body either side accepts.
pub const MAX_BODY: usize = 64 << 10;
pub const MAX_KEY: usize = 64;
/// Longest value, counted after unescaping.
pub const MAX_VALUE: usize = 1024;

#[derive(Debug, Clone, thiserror::Error, PartialEq, Eq)]
pub enum Pmi2Error {
    #[error("bad pmi-2 length header {0:?}")]
    BadHeader(String),
    #[error("pmi-2 frame of {len} bytes exceeds the limit of {MAX_BODY} bytes")]
    TooLarge { len: usize },
    #[error("empty pmi-2 frame")]
    Empty,
    #[error("pmi-2 frame is not valid utf-8")]
    NotUtf8,
    #[error("pmi-2 frame does not end with ';'")]
    Unterminated,
    #[error("pmi-2 frame does not start with cmd=")]
    NoCommand,
    #[error("pmi-2 pair {0:?} has no '='")]
    NoEquals(String),
    #[error("pmi-2 frame has an empty key")]
    EmptyKey,
    #[error("pmi-2 key of {len} bytes exceeds the limit of {MAX_KEY} bytes")]
    KeyTooLong { len: usize },
    #[error("pmi-2 value of {key} is {len} bytes, over the limit of {MAX_VALUE} bytes")]
    ValueTooLong { key: String, len: usize },
    #[error("pmi-2 {cmd}: missing {key}")]
    MissingKey { cmd: String, key: String },
    #[error("pmi-2 {cmd}: {key}={value} is not a valid {what}")]
    BadValue { cmd: String, key: String, value: String, what: &'static str },
    #[error("pmi-2 spawn has ncmds={ncmds} but {found} subcmd entries")]
    SpawnCount { ncmds: u32, found: usize },
}

/// Which protocol a message on a rank's socket uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Protocol {
    /// A PMI-1 line or `mcmd=` block (this includes the PMI-2 `init` handshake).
    Pmi1,
    /// A length-framed PMI-2 command.
    Pmi2,
}

/// Tells the protocols apart by the first bytes of a message, as Hydra does: `cmd=` or
/// `mcmd=` is PMI-1, anything else PMI-2. `None` while the bytes could still become either.
pub fn detect(first_bytes: &[u8]) -> Option<Protocol> {
    for prefix in [&b"cmd="[..], b"mcmd="] {
        if first_bytes.starts_with(prefix) {
            return Some(Protocol::Pmi1);
        }
        if prefix.starts_with(first_bytes) {
            return None;
        }
    }
    Some(Protocol::Pmi2)
}

/// One PMI-2 message: its command and the other pairs, unescaped, in wire order.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Command {
    pub cmd: String,
    pub pairs: Vec<(String, String)>,
}

/// Parses one frame from the start of `buf`: `Ok(None)` for every strict prefix of a frame,
/// otherwise the command and the number of bytes it took.
pub fn parse_frame(buf: &[u8]) -> Result<Option<(Command, usize)>, Pmi2Error> {
    let Some(len) = parse_header(&buf[..buf.len().min(HEADER_LEN)])? else { return Ok(None) };
    let Some(body) = buf.get(HEADER_LEN..HEADER_LEN + len) else { return Ok(None) };
    let body = std::str::from_utf8(body).map_err(|_| Pmi2Error::NotUtf8)?;
    Ok(Some((parse_body(body)?, HEADER_LEN + len)))
}

/// Accepts `/ *[0-9]+ */` in six bytes, failing on the first byte that cannot fit, and checks
/// the length before anyone waits for (or allocates) the body.
fn parse_header(head: &[u8]) -> Result<Option<usize>, Pmi2Error> {
    let bad = || Pmi2Error::BadHeader(String::from_utf8_lossy(head).into_owned());
    let (mut len, mut digits, mut trailing) = (0usize, false, false);
    for &b in head {
        match b {
            b' ' => trailing = digits,
            b'0'..=b'9' if !trailing => {
                digits = true;
                len = len * 10 + usize::from(b - b'0');
            }
            _ => return Err(bad()),
        }
    }
    if head.len() < HEADER_LEN {
        return Ok(None);
    }
    match len {
        _ if !digits => Err(bad()),
        0 => Err(Pmi2Error::Empty),
        len if len > MAX_BODY => Err(Pmi2Error::TooLarge { len }),
        len => Ok(Some(len)),
    }
}

fn parse_body(body: &str) -> Result<Command, Pmi2Error> {
    let mut pairs = Vec::new();
    let mut rest = body;
    while !rest.is_empty() {
        let Some(stop) = rest.find(['=', ';']) else { return Err(Pmi2Error::Unterminated) };
        if rest.as_bytes()[stop] == b';' {
            return Err(Pmi2Error::NoEquals(rest[..stop].to_string()));
        }
        let key = &rest[..stop];
        if key.is_empty() {
            return Err(Pmi2Error::EmptyKey);
        }
        if key.len() > MAX_KEY {
            return Err(Pmi2Error::KeyTooLong { len: key.len() });
        }
        let (value, after) = unescape_value(&rest[stop + 1..])?;
        if value.len() > MAX_VALUE {
            return Err(Pmi2Error::ValueTooLong { key: key.to_string(), len: value.len() });
        }
        pairs.push((key.to_string(), value));
        rest = after;
    }
    let mut pairs = pairs.into_iter();
    match pairs.next() {
        Some((key, cmd)) if key == "cmd" && !cmd.is_empty() => {
            Ok(Command { cmd, pairs: pairs.collect() })
        }
        _ => Err(Pmi2Error::NoCommand),
    }
}

/// Reads a value up to its terminating `;`, turning `;;` back into `;`. Greedy, like the
/// MPICH client: `a;;;` is the value `a;` followed by the terminator.
fn unescape_value(text: &str) -> Result<(String, &str), Pmi2Error> {
    let mut value = String::new();
    let mut rest = text;
    loop {
        let semi = rest.find(';').ok_or(Pmi2Error::Unterminated)?;
        if rest[semi + 1..].starts_with(';') {
            value.push_str(&rest[..=semi]);
            rest = &rest[semi + 2..];
        } else {
            value.push_str(&rest[..semi]);
            return Ok((value, &rest[semi + 1..]));
        }
    }
}

impl Command {
    pub fn new(cmd: impl Into<String>) -> Command {
        Command { cmd: cmd.into(), pairs: Vec::new() }
    }

    /// The start of a reply to `request`: `cmd=<request>-response`, with the request's
    /// `thrid` echoed right after it, as Hydra does.
    pub fn reply_to(request: &Command) -> Command {
        Command::response(&request.cmd, request.thrid())
    }

    /// The start of a reply to a `cmd` request carrying `thrid`.
    pub fn response(cmd: &str, thrid: Option<&str>) -> Command {
        let reply = Command::new(format!("{cmd}-response"));
        match thrid {
            Some(thrid) => reply.with("thrid", thrid),
            None => reply,
        }
    }

    pub fn with(mut self, key: impl Into<String>, value: impl Into<String>) -> Command {
        self.pairs.push((key.into(), value.into()));
        self
    }

    /// Adds `TRUE` or `FALSE`, the protocol's booleans.
    pub fn with_bool(self, key: impl Into<String>, value: bool) -> Command {
        self.with(key, if value { "TRUE" } else { "FALSE" })
    }

    /// Adds `rc=0`.
    pub fn ok(self) -> Command {
        self.with("rc", "0")
    }

    /// Adds `rc=<rc>;errmsg=<errmsg>`.
    pub fn failed(self, rc: i32, errmsg: impl Into<String>) -> Command {
        self.with("rc", rc.to_string()).with("errmsg", errmsg)
    }

    /// The first value of `key`.
    pub fn get(&self, key: &str) -> Option<&str> {
        self.pairs.iter().find(|(k, _)| k == key).map(|(_, v)| v.as_str())
    }

    pub fn require(&self, key: &str) -> Result<&str, Pmi2Error> {
        self.get(key).ok_or_else(|| missing(&self.cmd, key))
    }

    /// A numeric field; `Ok(None)` when absent.
    pub fn number<T: FromStr>(&self, key: &str) -> Result<Option<T>, Pmi2Error> {
        self.get(key).map(|v| to_number(&self.cmd, key, v)).transpose()
    }

    pub fn require_number<T: FromStr>(&self, key: &str) -> Result<T, Pmi2Error> {
        to_number(&self.cmd, key, self.require(key)?)
    }

    /// A `TRUE`/`FALSE` field (any case); `Ok(None)` when absent.
    pub fn boolean(&self, key: &str) -> Result<Option<bool>, Pmi2Error> {
        self.get(key).map(|v| to_bool(&self.cmd, key, v)).transpose()
    }

    /// The thread tag of a threaded client; replies must echo it.
    pub fn thrid(&self) -> Option<&str> {
        self.get("thrid")
    }

    /// The body: `cmd=..;k=v;` with `;` in values doubled. Keys are written as they are and
    /// must not contain `=` or `;`.
    pub fn body(&self) -> String {
        let mut body = format!("cmd={};", self.cmd.replace(';', ";;"));
        for (k, v) in &self.pairs {
            body.push_str(k);
            body.push('=');
            body.push_str(&v.replace(';', ";;"));
            body.push(';');
        }
        body
    }

    /// A whole frame with a right-justified header, as Hydra writes it. The body must stay
    /// within [`MAX_BODY`]; the peer rejects anything longer.
    pub fn encode(&self) -> Vec<u8> {
        let body = self.body();
        let mut out = format!("{:>6}", body.len()).into_bytes();
        out.extend_from_slice(body.as_bytes());
        out
    }

    /// A whole frame with a left-justified header, as the MPICH and Slurm clients write it.
    pub fn encode_left(&self) -> Vec<u8> {
        let body = self.body();
        let mut out = format!("{:<6}", body.len()).into_bytes();
        out.extend_from_slice(body.as_bytes());
        out
    }
}

fn missing(cmd: &str, key: &str) -> Pmi2Error {
    Pmi2Error::MissingKey { cmd: cmd.to_string(), key: key.to_string() }
}

fn bad_value(cmd: &str, key: &str, value: &str, what: &'static str) -> Pmi2Error {
    Pmi2Error::BadValue {
        cmd: cmd.to_string(),
        key: key.to_string(),
        value: value.to_string(),
        what,
    }
}

fn to_number<T: FromStr>(cmd: &str, key: &str, value: &str) -> Result<T, Pmi2Error> {
    value.parse().map_err(|_| bad_value(cmd, key, value, "number"))
}

fn to_bool(cmd: &str, key: &str, value: &str) -> Result<bool, Pmi2Error> {
    if value.eq_ignore_ascii_case("TRUE") {
        Ok(true)
    } else if value.eq_ignore_ascii_case("FALSE") {
        Ok(false)
    } else {
        Err(bad_value(cmd, key, value, "boolean"))
    }
}

/// A request from a rank (§3.3).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Request {
    /// `rank` comes from `pmirank` (or `pmiid`), sent only when the client's environment had
    /// one; `jobid` is the client's `PMI_JOBID`.
    FullInit {
        rank: Option<u32>,
        jobid: Option<String>,
        threaded: bool,
    },
    JobGetId,
    GetJobAttr {
        key: String,
    },
    KvsPut {
        key: String,
        value: String,
    },
    KvsFence,
    /// `srcid` is the putter's rank if the client knows it (-1 otherwise).
    KvsGet {
        jobid: Option<String>,
        srcid: Option<i64>,
        key: String,
    },
    PutNodeAttr {
        key: String,
        value: String,
    },
    /// With `wait` the reply is held until some rank on the node puts `key`.
    GetNodeAttr {
        key: String,
        wait: bool,
    },
    NamePublish {
        name: String,
        port: String,
        info: Vec<(String, String)>,
    },
    NameLookup {
        name: String,
        info: Vec<(String, String)>,
    },
    NameUnpublish {
        name: String,
        info: Vec<(String, String)>,
    },
    Spawn(Box<Spawn>),
    /// No exit code travels in PMI-2; the server picks a non-zero one.
    Abort {
        isworld: bool,
        msg: String,
    },
    JobConnect {
        jobid: String,
    },
    JobDisconnect {
        jobid: String,
    },
    Finalize,
    /// A well-formed command we do not serve, kept whole so the server can name it.
    Unknown(Command),
}

/// `PMI2_Job_Spawn`: all executables of one `MPI_Comm_spawn_multiple`, in one frame.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Spawn {
    /// Pairs to store in the new job's KVS before its ranks start.
    pub preput: Vec<(String, String)>,
    pub subcmds: Vec<SpawnSubcmd>,
}

#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct SpawnSubcmd {
    pub exe: String,
    pub maxprocs: u32,
    /// Arguments after the executable (`argv0` is the first of them).
    pub argv: Vec<String>,
    pub info: Vec<(String, String)>,
}

/// A typed request with the thread tag its reply must echo.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Envelope {
    pub thrid: Option<String>,
    pub request: Request,
}

/// [`parse_frame`], then [`Request::from_command`].
pub fn parse_request(buf: &[u8]) -> Result<Option<(Envelope, usize)>, Pmi2Error> {
    let Some((command, used)) = parse_frame(buf)? else { return Ok(None) };
    let thrid = command.thrid().map(str::to_string);
    Ok(Some((Envelope { thrid, request: Request::from_command(&command)? }, used)))
}

/// First occurrence of every key; keeps indexed lookups (`argvN`, `ppkeyN`) linear.
fn index<'a>(pairs: impl IntoIterator<Item = &'a (String, String)>) -> HashMap<&'a str, &'a str> {
    let mut map = HashMap::new();
    for (k, v) in pairs {
        map.entry(k.as_str()).or_insert(v.as_str());
    }
    map
}

/// Typed lookups over one group of pairs, with errors naming the command.
struct Fields<'a> {
    cmd: &'a str,
    map: HashMap<&'a str, &'a str>,
}

impl<'a> Fields<'a> {
    fn get(&self, key: &str) -> Result<&'a str, Pmi2Error> {
        self.map.get(key).copied().ok_or_else(|| missing(self.cmd, key))
    }

    fn string(&self, key: &str) -> Result<String, Pmi2Error> {
        self.get(key).map(str::to_string)
    }

    fn number<T: FromStr>(&self, key: &str) -> Result<T, Pmi2Error> {
        to_number(self.cmd, key, self.get(key)?)
    }

    /// Counts and flags that clients may leave out.
    fn number_or<T: FromStr>(&self, key: &str, default: T) -> Result<T, Pmi2Error> {
        if self.map.contains_key(key) {
            self.number(key)
        } else {
            Ok(default)
        }
    }

    fn boolean_or(&self, key: &str, default: bool) -> Result<bool, Pmi2Error> {
        self.map.get(key).map_or(Ok(default), |v| to_bool(self.cmd, key, v))
    }

    /// `count` pairs stored as `<key>0`, `<val>0`, `<key>1`, ...
    fn indexed_pairs(
        &self,
        count: &str,
        key: &str,
        val: &str,
    ) -> Result<Vec<(String, String)>, Pmi2Error> {
        (0..self.number_or::<u32>(count, 0)?)
            .map(|i| Ok((self.string(&format!("{key}{i}"))?, self.string(&format!("{val}{i}"))?)))
            .collect()
    }

    fn info(&self) -> Result<Vec<(String, String)>, Pmi2Error> {
        self.indexed_pairs("infokeycount", "infokey", "infoval")
    }
}

impl Request {
    pub fn from_command(command: &Command) -> Result<Request, Pmi2Error> {
        let f = Fields { cmd: &command.cmd, map: index(&command.pairs) };
        Ok(match command.cmd.as_str() {
            "fullinit" => Request::FullInit {
                rank: match f.map.get("pmirank").or(f.map.get("pmiid")) {
                    Some(v) => Some(to_number(&command.cmd, "pmirank", v)?),
                    None => None,
                },
                jobid: f.map.get("pmijobid").map(|v| v.to_string()),
                threaded: f.boolean_or("threaded", false)?,
            },
            "job-getid" => Request::JobGetId,
            "info-getjobattr" => Request::GetJobAttr { key: f.string("key")? },
            "kvs-put" => Request::KvsPut { key: f.string("key")?, value: f.string("value")? },
            "kvs-fence" => Request::KvsFence,
            "kvs-get" => Request::KvsGet {
                jobid: f.map.get("jobid").map(|v| v.to_string()),
                srcid: match f.map.get("srcid") {
                    Some(v) => Some(to_number(&command.cmd, "srcid", v)?),
                    None => None,
                },
                key: f.string("key")?,
            },
            "info-putnodeattr" => {
                Request::PutNodeAttr { key: f.string("key")?, value: f.string("value")? }
            }
            "info-getnodeattr" => {
                Request::GetNodeAttr { key: f.string("key")?, wait: f.boolean_or("wait", false)? }
            }
            "name-publish" => Request::NamePublish {
                name: f.string("name")?,
                port: f.string("port")?,
                info: f.info()?,
            },
            "name-lookup" => Request::NameLookup { name: f.string("name")?, info: f.info()? },
            "name-unpublish" => Request::NameUnpublish { name: f.string("name")?, info: f.info()? },
            "spawn" => Request::Spawn(Box::new(spawn_from_command(command, &f)?)),
            "abort" => Request::Abort {
                isworld: f.boolean_or("isworld", true)?,
                msg: f.map.get("msg").unwrap_or(&"").to_string(),
            },
            "job-connect" => Request::JobConnect { jobid: f.string("jobid")? },
            "job-disconnect" => Request::JobDisconnect { jobid: f.string("jobid")? },
            "finalize" => Request::Finalize,
            _ => Request::Unknown(command.clone()),
        })
    }

    /// The command a client sends (no `thrid`).
    pub fn to_command(&self) -> Command {
        let info = |mut c: Command, info: &[(String, String)]| {
            c = c.with("infokeycount", info.len().to_string());
            for (i, (k, v)) in info.iter().enumerate() {
                c = c.with(format!("infokey{i}"), k).with(format!("infoval{i}"), v);
            }
            c
        };
        match self {
            Request::FullInit { rank, jobid, threaded } => {
                let mut c = Command::new("fullinit");
                if let Some(rank) = rank {
                    c = c.with("pmirank", rank.to_string());
                }
                if let Some(jobid) = jobid {
                    c = c.with("pmijobid", jobid);
                }
                c.with_bool("threaded", *threaded)
            }
            Request::JobGetId => Command::new("job-getid"),
            Request::GetJobAttr { key } => Command::new("info-getjobattr").with("key", key),
            Request::KvsPut { key, value } => {
                Command::new("kvs-put").with("key", key).with("value", value)
            }
            Request::KvsFence => Command::new("kvs-fence"),
            Request::KvsGet { jobid, srcid, key } => {
                let mut c = Command::new("kvs-get");
                if let Some(jobid) = jobid {
                    c = c.with("jobid", jobid);
                }
                if let Some(srcid) = srcid {
                    c = c.with("srcid", srcid.to_string());
                }
                c.with("key", key)
            }
            Request::PutNodeAttr { key, value } => {
                Command::new("info-putnodeattr").with("key", key).with("value", value)
            }
            Request::GetNodeAttr { key, wait } => {
                Command::new("info-getnodeattr").with("key", key).with_bool("wait", *wait)
            }
            Request::NamePublish { name, port, info: i } => {
                info(Command::new("name-publish").with("name", name).with("port", port), i)
            }
            Request::NameLookup { name, info: i } => {
                info(Command::new("name-lookup").with("name", name), i)
            }
            Request::NameUnpublish { name, info: i } => {
                info(Command::new("name-unpublish").with("name", name), i)
            }
            Request::Spawn(spawn) => spawn.to_command(),
            Request::Abort { isworld, msg } => {
                Command::new("abort").with_bool("isworld", *isworld).with("msg", msg)
            }
            Request::JobConnect { jobid } => Command::new("job-connect").with("jobid", jobid),
            Request::JobDisconnect { jobid } => Command::new("job-disconnect").with("jobid", jobid),
            Request::Finalize => Command::new("finalize"),
            Request::Unknown(command) => command.clone(),
        }
    }
}

/// The per-executable keys repeat once per `subcmd`, so the frame is read in order: each
/// `subcmd` opens a group that runs to the next one.
fn spawn_from_command(command: &Command, f: &Fields<'_>) -> Result<Spawn, Pmi2Error> {
    let ncmds: u32 = f.number("ncmds")?;
    let first_sub =
        command.pairs.iter().position(|(k, _)| k == "subcmd").unwrap_or(command.pairs.len());
    let (head, mut rest) = command.pairs.split_at(first_sub);
    let head = Fields { cmd: f.cmd, map: index(head) };
    let preput = head.indexed_pairs("preputcount", "ppkey", "ppval")?;
    let mut groups: Vec<&[(String, String)]> = Vec::new();
    while let Some(((_, _), tail)) = rest.split_first() {
        let end = tail.iter().position(|(k, _)| k == "subcmd").map_or(rest.len(), |p| p + 1);
        groups.push(&rest[..end]);
        rest = &rest[end..];
    }
    if groups.len() != ncmds as usize {
        return Err(Pmi2Error::SpawnCount { ncmds, found: groups.len() });
    }
    let subcmds = groups
        .into_iter()
        .map(|group| {
            let g = Fields { cmd: f.cmd, map: index(&group[1..]) };
            Ok(SpawnSubcmd {
                exe: group[0].1.clone(),
                maxprocs: g.number("maxprocs")?,
                argv: (0..g.number_or::<u32>("argc", 0)?)
                    .map(|i| g.string(&format!("argv{i}")))
                    .collect::<Result<_, _>>()?,
                info: g.info()?,
            })
        })
        .collect::<Result<_, Pmi2Error>>()?;
    Ok(Spawn { preput, subcmds })
}

impl Spawn {
    fn to_command(&self) -> Command {
        let mut c = Command::new("spawn")
            .with("ncmds", self.subcmds.len().to_string())
            .with("preputcount", self.preput.len().to_string());
        for (i, (k, v)) in self.preput.iter().enumerate() {
            c = c.with(format!("ppkey{i}"), k).with(format!("ppval{i}"), v);
        }
        for sub in &self.subcmds {
            c = c
                .with("subcmd", &sub.exe)
                .with("maxprocs", sub.maxprocs.to_string())
                .with("argc", sub.argv.len().to_string());
            for (i, arg) in sub.argv.iter().enumerate() {
                c = c.with(format!("argv{i}"), arg);
            }
            c = c.with("infokeycount", sub.info.len().to_string());
            for (i, (k, v)) in sub.info.iter().enumerate() {
                c = c.with(format!("infokey{i}"), k).with(format!("infoval{i}"), v);
            }
        }
        c
    }
}

/// A reply from the server, worded as Hydra words it (§3.3).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Response {
    /// `spawner_jobid` is set only for spawned jobs; its presence is what marks them.
    FullInit {
        rank: u32,
        size: u32,
        appnum: u32,
        spawner_jobid: Option<String>,
    },
    JobGetId {
        jobid: String,
    },
    GetJobAttr {
        value: Option<String>,
    },
    KvsPut,
    KvsFence,
    KvsGet {
        value: Option<String>,
    },
    PutNodeAttr,
    GetNodeAttr {
        value: Option<String>,
    },
    NamePublish,
    NameLookup {
        port: Option<String>,
    },
    NameUnpublish,
    Spawn {
        jobid: String,
    },
    JobConnect,
    JobDisconnect,
    Finalize,
    /// Any request refused: `rc=1` and a message. `cmd` is the request's command.
    Failed {
        cmd: String,
        errmsg: String,
    },
}

impl Response {
    /// The reply as a command, `thrid` echoed right after `cmd`.
    pub fn to_command(&self, thrid: Option<&str>) -> Command {
        let reply = |cmd: &str| Command::response(cmd, thrid);
        let found = |c: Command, value: &Option<String>| match value {
            Some(v) => c.with_bool("found", true).with("value", v).ok(),
            None => c.with_bool("found", false).ok(),
        };
        match self {
            Response::FullInit { rank, size, appnum, spawner_jobid } => {
                let mut c = reply("fullinit")
                    .with("pmi-version", "2")
                    .with("pmi-subversion", "0")
                    .with("rank", rank.to_string())
                    .with("size", size.to_string())
                    .with("appnum", appnum.to_string());
                if let Some(parent) = spawner_jobid {
                    c = c.with("spawner-jobid", parent);
                }
                c.with_bool("debugged", false).with_bool("pmiverbose", false).ok()
            }
            Response::JobGetId { jobid } => reply("job-getid").with("jobid", jobid).ok(),
            Response::GetJobAttr { value } => found(reply("info-getjobattr"), value),
            Response::KvsPut => reply("kvs-put").ok(),
            Response::KvsFence => reply("kvs-fence").ok(),
            Response::KvsGet { value } => found(reply("kvs-get"), value),
            Response::PutNodeAttr => reply("info-putnodeattr").ok(),
            Response::GetNodeAttr { value } => found(reply("info-getnodeattr"), value),
            Response::NamePublish => reply("name-publish").ok(),
            Response::NameLookup { port: Some(port) } => {
                reply("name-lookup").with("port", port).with_bool("found", true).ok()
            }
            // Hydra's miss is rc=1 with found=FALSE and no errmsg.
            Response::NameLookup { port: None } => {
                reply("name-lookup").with_bool("found", false).with("rc", "1")
            }
            Response::NameUnpublish => reply("name-unpublish").ok(),
            Response::Spawn { jobid } => {
                reply("spawn").with("rc", "0").with("jobid", jobid).with("nerrs", "0")
            }
            Response::JobConnect => reply("job-connect").with_bool("kvscopy", false).ok(),
            Response::JobDisconnect => reply("job-disconnect").ok(),
            Response::Finalize => reply("finalize").ok(),
            Response::Failed { cmd, errmsg } => reply(cmd).failed(1, errmsg),
        }
    }

    /// The whole frame, right-justified header.
    pub fn encode(&self, thrid: Option<&str>) -> Vec<u8> {
        self.to_command(thrid).encode()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse_all(bytes: &[u8]) -> Command {
        for cut in 0..bytes.len() {
            assert_eq!(parse_frame(&bytes[..cut]), Ok(None), "prefix {cut}");
        }
        let (command, used) = parse_frame(bytes).unwrap().unwrap();
        assert_eq!(used, bytes.len());
        command
    }

    #[test]
    fn both_justifications_parse() {
        let c = Command::new("kvs-put").with("key", "k").with("value", "v");
        assert_eq!(&c.encode()[..6], b"    26");
        assert_eq!(&c.encode_left()[..6], b"26    ");
        assert_eq!(parse_all(&c.encode()), c);
        assert_eq!(parse_all(&c.encode_left()), c);
        assert_eq!(parse_all(b"  26  cmd=kvs-put;key=k;value=v;"), c);
    }

    #[test]
    fn semicolons_are_doubled_and_undoubled() {
        let c = Command::new("kvs-put").with("key", "k").with("value", "card;of;rank=0;");
        let frame = c.encode_left();
        assert!(frame.ends_with(b"value=card;;of;;rank=0;;;"), "{frame:?}");
        assert_eq!(parse_all(&frame), c);
        for value in [";", ";;", "", "a;", ";a", "=;="] {
            let c = Command::new("x").with("v", value).with("w", "z");
            assert_eq!(parse_all(&c.encode()), c, "{value:?}");
        }
    }

    #[test]
    fn malformed_frames_are_refused() {
        let frame = |body: &str| format!("{:<6}{body}", body.len()).into_bytes();
        assert_eq!(parse_frame(&frame("cmd=x")), Err(Pmi2Error::Unterminated));
        assert_eq!(parse_frame(&frame("cmd=x;y;")), Err(Pmi2Error::NoEquals("y".into())));
        assert_eq!(parse_frame(&frame("key=x;")), Err(Pmi2Error::NoCommand));
        assert_eq!(parse_frame(&frame("cmd=x;=y;")), Err(Pmi2Error::EmptyKey));
        assert_eq!(parse_frame(b"000000"), Err(Pmi2Error::Empty));
        assert_eq!(parse_frame(b"      "), Err(Pmi2Error::BadHeader("      ".into())));
        assert_eq!(parse_frame(b"1 2"), Err(Pmi2Error::BadHeader("1 2".into())));
        assert_eq!(parse_frame(b"99999 "), Err(Pmi2Error::TooLarge { len: 99999 }));
        assert!(matches!(parse_frame(b"x"), Err(Pmi2Error::BadHeader(_))));
        let long_key = format!("cmd=x;{}=1;", "k".repeat(MAX_KEY + 1));
        assert_eq!(parse_frame(&frame(&long_key)), Err(Pmi2Error::KeyTooLong { len: 65 }));
        let long_value = format!("cmd=x;v={};", ";;".repeat(MAX_VALUE + 1));
        assert!(matches!(parse_frame(&frame(&long_value)), Err(Pmi2Error::ValueTooLong { .. })));
        let ok_value = format!("cmd=x;v={};", ";;".repeat(MAX_VALUE));
        assert!(parse_frame(&frame(&ok_value)).unwrap().is_some());
    }

    #[test]
    fn requests_roundtrip() {
        let all = [
            Request::FullInit { rank: Some(0), jobid: None, threaded: false },
            Request::FullInit { rank: None, jobid: Some("j".into()), threaded: true },
            Request::JobGetId,
            Request::GetJobAttr { key: "PMI_process_mapping".into() },
            Request::KvsPut { key: "k".into(), value: "a;b".into() },
            Request::KvsFence,
            Request::KvsGet { jobid: Some("kvs_1".into()), srcid: Some(-1), key: "k".into() },
            Request::PutNodeAttr { key: "k".into(), value: "v".into() },
            Request::GetNodeAttr { key: "k".into(), wait: true },
            Request::NamePublish { name: "s".into(), port: "p".into(), info: vec![] },
            Request::NameLookup { name: "s".into(), info: vec![("a".into(), "b".into())] },
            Request::NameUnpublish { name: "s".into(), info: vec![] },
            Request::Spawn(Box::new(Spawn {
                preput: vec![("PARENT_ROOT_PORT_NAME".into(), "port;1".into())],
                subcmds: vec![
                    SpawnSubcmd {
                        exe: "/bin/a".into(),
                        maxprocs: 2,
                        argv: vec!["x y".into(), "z".into()],
                        info: vec![("wdir".into(), "/tmp".into())],
                    },
                    SpawnSubcmd { exe: "/bin/b".into(), maxprocs: 1, argv: vec![], info: vec![] },
                ],
            })),
            Request::Abort { isworld: true, msg: "out of cheese".into() },
            Request::JobConnect { jobid: "j".into() },
            Request::JobDisconnect { jobid: "j".into() },
            Request::Finalize,
            Request::Unknown(Command::new("frobnicate").with("a", "b")),
        ];
        for req in all {
            let mut command = req.to_command();
            command.pairs.insert(0, ("thrid".into(), "0x7f".into()));
            let (env, used) = parse_request(&command.encode_left()).unwrap().unwrap();
            assert_eq!(used, command.encode_left().len());
            assert_eq!(env.thrid.as_deref(), Some("0x7f"));
            match req {
                // Kept whole, thrid included, so that the server can name and answer it.
                Request::Unknown(_) => assert_eq!(env.request, Request::Unknown(command)),
                req => assert_eq!(env.request, req),
            }
        }
    }

    #[test]
    fn captured_requests_parse() {
        let (env, _) =
            parse_request(b"38    cmd=fullinit;pmirank=0;threaded=FALSE;").unwrap().unwrap();
        assert_eq!(env.request, Request::FullInit { rank: Some(0), jobid: None, threaded: false });
        let body = "cmd=spawn;ncmds=1;preputcount=0;subcmd=/bin/a;maxprocs=1;argc=2;argv0=x;";
        let frame = format!("{:<6}{body}", body.len());
        assert_eq!(
            parse_request(frame.as_bytes()),
            Err(Pmi2Error::MissingKey { cmd: "spawn".into(), key: "argv1".into() })
        );
        let body = "cmd=spawn;ncmds=2;preputcount=0;subcmd=/bin/a;maxprocs=1;";
        let frame = format!("{:<6}{body}", body.len());
        assert_eq!(
            parse_request(frame.as_bytes()),
            Err(Pmi2Error::SpawnCount { ncmds: 2, found: 1 })
        );
    }

    #[test]
    fn replies_are_hydras_words() {
        let body = |r: Response, thrid: Option<&str>| r.to_command(thrid).body();
        assert_eq!(
            body(Response::FullInit { rank: 0, size: 2, appnum: 0, spawner_jobid: None }, None),
            "cmd=fullinit-response;pmi-version=2;pmi-subversion=0;rank=0;size=2;appnum=0;\
             debugged=FALSE;pmiverbose=FALSE;rc=0;"
        );
        assert_eq!(
            body(Response::GetJobAttr { value: Some("(vector,(0,1,1))".into()) }, None),
            "cmd=info-getjobattr-response;found=TRUE;value=(vector,(0,1,1));rc=0;"
        );
        assert_eq!(
            body(Response::KvsGet { value: None }, None),
            "cmd=kvs-get-response;found=FALSE;rc=0;"
        );
        assert_eq!(body(Response::KvsFence, Some("t1")), "cmd=kvs-fence-response;thrid=t1;rc=0;");
        assert_eq!(
            body(Response::NameLookup { port: None }, None),
            "cmd=name-lookup-response;found=FALSE;rc=1;"
        );
        assert_eq!(
            body(
                Response::Failed {
                    cmd: "name-publish".into(),
                    errmsg: "duplicate_service_S".into()
                },
                None
            ),
            "cmd=name-publish-response;rc=1;errmsg=duplicate_service_S;"
        );
        assert_eq!(
            body(Response::Spawn { jobid: "kvs_2".into() }, None),
            "cmd=spawn-response;rc=0;jobid=kvs_2;nerrs=0;"
        );
        assert_eq!(
            body(Response::JobConnect, None),
            "cmd=job-connect-response;kvscopy=FALSE;rc=0;"
        );
        let frame = Response::Finalize.encode(None);
        assert_eq!(frame, b"    27cmd=finalize-response;rc=0;");
        let request = Command::new("kvs-get").with("thrid", "9").with("key", "k");
        assert_eq!(Command::reply_to(&request).ok().body(), "cmd=kvs-get-response;thrid=9;rc=0;");
    }

    #[test]
    fn detection_needs_only_a_few_bytes() {
        assert_eq!(detect(b""), None);
        assert_eq!(detect(b"cm"), None);
        assert_eq!(detect(b"mcmd"), None);
        assert_eq!(detect(b"cmd="), Some(Protocol::Pmi1));
        assert_eq!(detect(b"mcmd=spawn\n"), Some(Protocol::Pmi1));
        assert_eq!(detect(b"cmd=init pmi_version=2 pmi_subversion=0\n"), Some(Protocol::Pmi1));
        assert_eq!(detect(b"3"), Some(Protocol::Pmi2));
        assert_eq!(detect(b"    38cmd=kvs-fence;"), Some(Protocol::Pmi2));
        assert_eq!(detect(b"cx"), Some(Protocol::Pmi2));
    }
}
