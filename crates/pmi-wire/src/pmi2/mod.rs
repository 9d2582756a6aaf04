//! PMI-2: length-framed `key=value;` commands (docs/pmi.md, *PMI-2*).
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
//!
//! This file is the framing and the generic [`Command`]; `commands.rs` the typed requests and
//! replies over it.

use std::str::FromStr;

mod commands;

pub use commands::{parse_request, Envelope, Request, Response, Spawn, SpawnSubcmd};

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
