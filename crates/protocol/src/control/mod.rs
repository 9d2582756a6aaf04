//! The control channel between a parent (launcher or proxy) and a child proxy.
//!
//! ```text
//! child -> parent:  HELLO(magic, version)  then Up frames
//! parent -> child:  HELLO(magic, version)  then Down frames (Launch first)
//! frame:            u32 BE length | u8 tag | body        (length counts tag + body)
//!   tag 0: a bincode-encoded message (Up or Down)
//!   tag 1: rank output (Up) or stdin data (Down), raw bytes after a small fixed header
//!   tag 2: PMIx fence data: up, u64 BE epoch | u32 BE node | raw bytes (a part); down,
//!          u8 end (0: a part, 1: the fence's Out) | u64 BE epoch | raw bytes
//!   tag 3: the link's own business (LinkUp or LinkDown), bincode-encoded
//!   tag 4: broadcast file data (Down): u64 BE offset in the files' stream | raw bytes
//! ```
//!
//! Two layers: the link's own messages ([`LinkUp`], [`LinkDown`]: greeting, heartbeats,
//! credit, clock probes, redirects) are consumed by the ends of one link, in rlaunch-tree;
//! the job's ([`Up`], [`Down`]) are routed through the tree and read by its dispatchers.
//! [`UpFrame`] and [`DownFrame`] are what a link carries: one or the other.
//!
//! The hello is raw bytes, not bincode, so that two binaries that disagree about the message
//! encoding still agree on how to say "wrong version". Over ssh a remote shell may print before
//! the proxy runs: [`scan_hello`] finds the magic and reports what came before it.
//!
//! Output, stdin and PMIx fence data use tags of their own so that bulk bytes are copied
//! once, not serialised element by element through serde.

use serde::{de::DeserializeOwned, Serialize};

use crate::ids::{Gid, NodeId, Stream};

mod messages;
mod plan;
mod services;

pub use messages::{Down, DownFrame, LinkDown, LinkUp, Up, UpFrame};
pub use plan::{
    Adoption, Bcast, BcastFile, Binding, Bootstrap, CpuUnit, GpuBind, Gpus, Job, Launch, Liveness,
    Mapping, NodePlan, PmixJob, RankPlan, Rendezvous, Segment, StdinTarget, ADOPTION_DIAL,
};
pub use pmi_wire::services::{LookupWait, NameAnswer, NameOp, NameValue, SpawnCmd, SpawnRequest};
pub use services::{DmodexAnswer, DmodexAsk, DmodexData, SpawnJob, SpawnOutcome};

/// First bytes on every control channel, in both directions.
pub const MAGIC: [u8; 8] = *b"\x7fRLAUNCH";
/// Bumped whenever a frame changes meaning.
pub const PROTOCOL_VERSION: u32 = 29;
/// Length of the raw hello: magic + u32 BE version.
pub const HELLO_LEN: usize = MAGIC.len() + 4;
/// Largest frame either side accepts; checked before any allocation.
pub const MAX_FRAME_LEN: usize = 64 << 20;
/// How much of a PMIx fence's data one frame carries: more travels in several
/// ([`Up::PmixFencePart`], [`Down::PmixFencePart`]), so that no fence is too large for a frame.
pub const PMIX_FENCE_PART: usize = 16 << 20;
/// The most data one PMIx fence may gather, every node's together: a node's PMIx server takes
/// a fence's data in one message (the proxy's host wire carries this much at most), so the
/// root fails a fence that gathers more.
pub const PMIX_FENCE_MAX: usize = 1 << 30;
/// The most of a rank's error file that goes up ([`Up::RankError`]).
pub const MAX_ERROR_REPORT: usize = 64 << 10;
/// How much a peer may print before its hello before we give up looking for it.
pub const MAX_PREAMBLE: usize = 64 << 10;

const TAG_MSG: u8 = 0;
const TAG_DATA: u8 = 1;
const TAG_PMIX_FENCE: u8 = 2;
const TAG_LINK: u8 = 3;
const TAG_BCAST: u8 = 4;

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum FrameError {
    #[error("frame of {len} bytes exceeds the limit of {MAX_FRAME_LEN} bytes")]
    TooLarge { len: usize },
    #[error("empty frame")]
    Empty,
    #[error("unknown frame tag {0}")]
    UnknownTag(u8),
    #[error("malformed frame: {0}")]
    Malformed(String),
    #[error("no rlaunch hello in the first {MAX_PREAMBLE} bytes")]
    NoHello,
}

/// The raw hello this side sends.
pub fn hello() -> [u8; HELLO_LEN] {
    let mut out = [0u8; HELLO_LEN];
    out[..MAGIC.len()].copy_from_slice(&MAGIC);
    out[MAGIC.len()..].copy_from_slice(&PROTOCOL_VERSION.to_be_bytes());
    out
}

/// What [`scan_hello`] found at the start of a stream.
#[derive(Debug, PartialEq, Eq)]
pub struct HelloFound {
    /// Bytes before the magic (a chatty login shell, an error from ssh).
    pub preamble_len: usize,
    /// The peer's protocol version.
    pub version: u32,
    /// Bytes consumed up to and including the hello.
    pub consumed: usize,
}

/// Looks for the hello in what has arrived so far. `Ok(None)` means "need more bytes".
pub fn scan_hello(buf: &[u8]) -> Result<Option<HelloFound>, FrameError> {
    let Some(at) = buf.windows(MAGIC.len()).position(|w| w == MAGIC) else {
        if buf.len() > MAX_PREAMBLE {
            return Err(FrameError::NoHello);
        }
        return Ok(None);
    };
    let end = at + HELLO_LEN;
    if buf.len() < end {
        return Ok(None);
    }
    let version = u32::from_be_bytes(buf[at + MAGIC.len()..end].try_into().expect("4 bytes"));
    Ok(Some(HelloFound { preamble_len: at, version, consumed: end }))
}

/// Reads the length of the frame at the start of `buf`, checking the limit before anyone
/// allocates. `Ok(None)`: the length itself has not arrived yet.
pub fn frame_len(buf: &[u8]) -> Result<Option<usize>, FrameError> {
    let Some(head) = buf.get(..4) else { return Ok(None) };
    let len = u32::from_be_bytes(head.try_into().expect("4 bytes")) as usize;
    if len > MAX_FRAME_LEN {
        return Err(FrameError::TooLarge { len });
    }
    if len == 0 {
        return Err(FrameError::Empty);
    }
    Ok(Some(len))
}

/// A message that travels in frames.
pub trait Frame: Sized {
    /// Appends one complete frame (length prefix included) to `out`.
    fn encode(&self, out: &mut Vec<u8>);
    /// Decodes the body of one frame (the bytes after the length prefix).
    fn decode_body(body: &[u8]) -> Result<Self, FrameError>;
    /// Bytes between the tag of a bulk-data frame and its data.
    const DATA_HEAD: usize;
    /// A bulk-data frame from the `DATA_HEAD` bytes after its tag and its data, which a
    /// reader may have read straight into its own buffer (see `io::FrameReader`).
    fn from_data(head: &[u8], data: Vec<u8>) -> Result<Self, FrameError>;
}

/// The bytes before a frame's message: its length (4) and its tag (1).
pub const FRAME_HEAD: usize = 5;

/// The tag of a bulk-data frame: `Up::Output`, `Down::Stdin`.
pub const DATA_TAG: u8 = TAG_DATA;

/// Decodes one frame from the start of `buf`: `Ok(None)` for every strict prefix of a frame,
/// otherwise the message and the number of bytes it took.
pub fn decode<M: Frame>(buf: &[u8]) -> Result<Option<(M, usize)>, FrameError> {
    let Some(len) = frame_len(buf)? else { return Ok(None) };
    let Some(body) = buf.get(4..4 + len) else { return Ok(None) };
    Ok(Some((M::decode_body(body)?, 4 + len)))
}

fn bincode_config() -> impl bincode::config::Config {
    bincode::config::standard().with_limit::<MAX_FRAME_LEN>()
}

/// How many bytes `msg` takes in a frame's body (for logs and measurements).
pub fn wire_len<T: Serialize>(msg: &T) -> usize {
    let mut count = Count(0);
    let _ = bincode::serde::encode_into_std_write(msg, &mut count, bincode_config());
    count.0
}

/// A writer that only counts what it is given.
struct Count(usize);

impl std::io::Write for Count {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0 += buf.len();
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

fn encode_msg<T: Serialize>(msg: &T, out: &mut Vec<u8>) {
    let start = out.len();
    out.extend_from_slice(&[0, 0, 0, 0, TAG_MSG]);
    bincode::serde::encode_into_std_write(msg, out, bincode_config())
        .expect("encoding into a Vec cannot fail");
    patch_len(out, start);
}

fn patch_len(out: &mut [u8], start: usize) {
    let len = (out.len() - start - 4) as u32;
    out[start..start + 4].copy_from_slice(&len.to_be_bytes());
}

/// What was wrong with a frame's body, as a sentence fragment: bincode's own errors print
/// as Debug dumps, and quote counts that change with every new message kind.
fn decode_failure(e: bincode::error::DecodeError) -> String {
    use bincode::error::DecodeError as E;
    match e {
        E::UnexpectedEnd { additional: 1 } => "it ends a byte short".into(),
        E::UnexpectedEnd { additional } => format!("it ends {additional} bytes short"),
        E::LimitExceeded => "it holds more than a frame may".into(),
        E::UnexpectedVariant { found, .. } => format!("unknown kind {found}"),
        E::InvalidBooleanValue(b) => format!("{b} is not a boolean"),
        E::InvalidCharEncoding(_) | E::CStringNulError { .. } => "a bad character".into(),
        E::OtherString(s) if s.contains("variant index") => "an unknown kind of message".into(),
        E::OtherString(s) if s.contains("utf-8") || s.contains("UTF-8") => {
            "a string that is not UTF-8".into()
        }
        _ => "its contents do not decode".into(),
    }
}

fn decode_msg<T: DeserializeOwned>(body: &[u8]) -> Result<T, FrameError> {
    let (msg, used) = bincode::serde::decode_from_slice(body, bincode_config())
        .map_err(|e| FrameError::Malformed(decode_failure(e)))?;
    if used != body.len() {
        return Err(FrameError::Malformed(format!(
            "{} trailing bytes after the message",
            body.len() - used
        )));
    }
    Ok(msg)
}

/// A frame of PMIx fence data going down: a part of it, or its end (`PmixFenceOut`).
fn encode_pmix_fence_down(end: bool, epoch: u64, data: &[u8], out: &mut Vec<u8>) {
    let start = out.len();
    out.extend_from_slice(&[0, 0, 0, 0, TAG_PMIX_FENCE, u8::from(end)]);
    out.extend_from_slice(&epoch.to_be_bytes());
    out.extend_from_slice(data);
    patch_len(out, start);
}

/// The body of a PMIx fence data frame going down, after its tag: (end, epoch, data).
fn decode_pmix_fence_down(rest: &[u8]) -> Result<(bool, u64, Vec<u8>), FrameError> {
    let head = take::<9>(rest, "PMIx fence header")?;
    let end = match head[0] {
        0 => false,
        1 => true,
        other => return Err(FrameError::Malformed(format!("bad PMIx fence kind {other}"))),
    };
    let epoch = u64::from_be_bytes(head[1..].try_into().expect("8 bytes"));
    Ok((end, epoch, rest[9..].to_vec()))
}

fn split_tag(body: &[u8]) -> Result<(u8, &[u8]), FrameError> {
    body.split_first().map(|(t, rest)| (*t, rest)).ok_or(FrameError::Empty)
}

fn take<const N: usize>(body: &[u8], what: &str) -> Result<[u8; N], FrameError> {
    body.get(..N)
        .and_then(|b| b.try_into().ok())
        .ok_or_else(|| FrameError::Malformed(format!("short {what}")))
}

impl Frame for Down {
    const DATA_HEAD: usize = 8;

    fn from_data(head: &[u8], data: Vec<u8>) -> Result<Self, FrameError> {
        let seq = u64::from_be_bytes(take::<8>(head, "stdin header")?);
        Ok(Down::Stdin { seq, data })
    }

    fn encode(&self, out: &mut Vec<u8>) {
        match self {
            Down::Stdin { seq, data } => {
                let start = out.len();
                out.extend_from_slice(&[0, 0, 0, 0, TAG_DATA]);
                out.extend_from_slice(&seq.to_be_bytes());
                out.extend_from_slice(data);
                patch_len(out, start);
            }
            Down::PmixFencePart { epoch, data } => encode_pmix_fence_down(false, *epoch, data, out),
            Down::PmixFenceOut { epoch, data } => encode_pmix_fence_down(true, *epoch, data, out),
            Down::BcastData { offset, data } => {
                let start = out.len();
                out.extend_from_slice(&[0, 0, 0, 0, TAG_BCAST]);
                out.extend_from_slice(&offset.to_be_bytes());
                out.extend_from_slice(data);
                patch_len(out, start);
            }
            other => encode_msg(other, out),
        }
    }

    fn decode_body(body: &[u8]) -> Result<Self, FrameError> {
        match split_tag(body)? {
            (TAG_MSG, rest) => decode_msg(rest),
            (TAG_DATA, rest) => {
                let head = take::<8>(rest, "stdin header")?;
                Down::from_data(&head, rest[8..].to_vec())
            }
            (TAG_PMIX_FENCE, rest) => match decode_pmix_fence_down(rest)? {
                (false, epoch, data) => Ok(Down::PmixFencePart { epoch, data }),
                (true, epoch, data) => Ok(Down::PmixFenceOut { epoch, data }),
            },
            (TAG_BCAST, rest) => {
                let offset = u64::from_be_bytes(take::<8>(rest, "broadcast header")?);
                Ok(Down::BcastData { offset, data: rest[8..].into() })
            }
            (tag, _) => Err(FrameError::UnknownTag(tag)),
        }
    }
}

fn encode_link<T: Serialize>(msg: &T, out: &mut Vec<u8>) {
    let start = out.len();
    out.extend_from_slice(&[0, 0, 0, 0, TAG_LINK]);
    bincode::serde::encode_into_std_write(msg, out, bincode_config())
        .expect("encoding into a Vec cannot fail");
    patch_len(out, start);
}

impl Frame for DownFrame {
    const DATA_HEAD: usize = <Down as Frame>::DATA_HEAD;

    fn from_data(head: &[u8], data: Vec<u8>) -> Result<Self, FrameError> {
        Down::from_data(head, data).map(DownFrame::Job)
    }

    fn encode(&self, out: &mut Vec<u8>) {
        match self {
            DownFrame::Link(link) => encode_link(link, out),
            DownFrame::Job(down) => down.encode(out),
        }
    }

    fn decode_body(body: &[u8]) -> Result<Self, FrameError> {
        match split_tag(body)? {
            (TAG_LINK, rest) => decode_msg(rest).map(DownFrame::Link),
            _ => Down::decode_body(body).map(DownFrame::Job),
        }
    }
}

impl Frame for UpFrame {
    const DATA_HEAD: usize = <Up as Frame>::DATA_HEAD;

    fn from_data(head: &[u8], data: Vec<u8>) -> Result<Self, FrameError> {
        Up::from_data(head, data).map(UpFrame::Job)
    }

    fn encode(&self, out: &mut Vec<u8>) {
        match self {
            UpFrame::Link(link) => encode_link(link, out),
            UpFrame::Job(up) => up.encode(out),
        }
    }

    fn decode_body(body: &[u8]) -> Result<Self, FrameError> {
        match split_tag(body)? {
            (TAG_LINK, rest) => decode_msg(rest).map(UpFrame::Link),
            _ => Up::decode_body(body).map(UpFrame::Job),
        }
    }
}

/// The link's own messages travel alone in frames of their own tag: no bulk data.
macro_rules! link_frame {
    ($message:ty) => {
        impl Frame for $message {
            const DATA_HEAD: usize = 0;

            fn from_data(_: &[u8], _: Vec<u8>) -> Result<Self, FrameError> {
                Err(FrameError::Malformed("the link's own messages carry no bulk data".into()))
            }

            fn encode(&self, out: &mut Vec<u8>) {
                encode_link(self, out)
            }

            fn decode_body(body: &[u8]) -> Result<Self, FrameError> {
                match split_tag(body)? {
                    (TAG_LINK, rest) => decode_msg(rest),
                    (tag, _) => Err(FrameError::UnknownTag(tag)),
                }
            }
        }
    };
}

link_frame!(LinkDown);
link_frame!(LinkUp);

/// Appends the head of an [`Up::Output`] frame of `data_len` bytes of data: the frame is
/// this head and then the data, which a writer may send from where it lies (`writev`).
pub fn encode_output_head(rank: Gid, stream: Stream, data_len: usize, out: &mut Vec<u8>) {
    let len = (1 + 4 + 1 + data_len) as u32;
    out.extend_from_slice(&len.to_be_bytes());
    out.push(TAG_DATA);
    out.extend_from_slice(&rank.0.to_be_bytes());
    out.push(stream as u8);
}

impl Frame for Up {
    const DATA_HEAD: usize = 5;

    fn from_data(head: &[u8], data: Vec<u8>) -> Result<Self, FrameError> {
        let head = take::<5>(head, "output header")?;
        let rank = Gid(u32::from_be_bytes(head[..4].try_into().expect("4 bytes")));
        let stream = Stream::from_u8(head[4])
            .ok_or_else(|| FrameError::Malformed(format!("bad stream {}", head[4])))?;
        Ok(Up::Output { rank, stream, data })
    }

    fn encode(&self, out: &mut Vec<u8>) {
        match self {
            Up::Output { rank, stream, data } => {
                encode_output_head(*rank, *stream, data.len(), out);
                out.extend_from_slice(data);
            }
            Up::PmixFencePart { epoch, node, data } => {
                let start = out.len();
                out.extend_from_slice(&[0, 0, 0, 0, TAG_PMIX_FENCE]);
                out.extend_from_slice(&epoch.to_be_bytes());
                out.extend_from_slice(&node.0.to_be_bytes());
                out.extend_from_slice(data);
                patch_len(out, start);
            }
            other => encode_msg(other, out),
        }
    }

    fn decode_body(body: &[u8]) -> Result<Self, FrameError> {
        match split_tag(body)? {
            (TAG_MSG, rest) => decode_msg(rest),
            (TAG_PMIX_FENCE, rest) => {
                let head = take::<12>(rest, "PMIx fence header")?;
                let epoch = u64::from_be_bytes(head[..8].try_into().expect("8 bytes"));
                let node = u32::from_be_bytes(head[8..].try_into().expect("4 bytes"));
                Ok(Up::PmixFencePart { epoch, node: NodeId(node), data: rest[12..].to_vec() })
            }
            (TAG_DATA, rest) => {
                let head = take::<5>(rest, "output header")?;
                Up::from_data(&head, rest[5..].to_vec())
            }
            (tag, _) => Err(FrameError::UnknownTag(tag)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ids::ExitOutcome;
    use crate::record::{NodeRecord, RankUsage};

    fn roundtrip<M: Frame + PartialEq + std::fmt::Debug>(msg: M) {
        let mut buf = Vec::new();
        msg.encode(&mut buf);
        for cut in 0..buf.len() {
            assert_eq!(decode::<M>(&buf[..cut]).unwrap().map(|(_, n)| n), None, "prefix {cut}");
        }
        let (back, used) = decode::<M>(&buf).unwrap().unwrap();
        assert_eq!(used, buf.len());
        assert_eq!(back, msg);
    }

    #[test]
    fn frames_roundtrip_and_prefixes_are_incomplete() {
        roundtrip(Up::Output { rank: Gid(7), stream: Stream::Stderr, data: b"a\nb".to_vec() });
        roundtrip(Up::RankExited {
            rank: Gid(1),
            pid: 99,
            outcome: ExitOutcome::Signaled(11),
            unfinalized: true,
            usage: RankUsage { started: 1, ended: 2, user_us: 3, system_us: 4, maxrss_kib: 5 },
        });
        let leaf =
            NodeRecord { node: NodeId(2), host: "n2".into(), offset_us: -40, ..Default::default() };
        let record = NodeRecord {
            node: NodeId(1),
            host: "n1".into(),
            pid: 42,
            phases: vec![(crate::record::Phase::Launched, 9)],
            children: vec![leaf],
            ..Default::default()
        };
        roundtrip(Up::NodeDone { node: NodeId(1), record: Box::new(record) });
        roundtrip(LinkDown::ClockProbe { sent: 1 << 50 });
        roundtrip(LinkUp::ClockEcho { sent: 1 << 50, at: (1 << 50) + 3 });
        roundtrip(UpFrame::Link(LinkUp::Greeting { host: "n1".into(), pid: 7 }));
        roundtrip(UpFrame::Job(Up::Output { rank: Gid(1), stream: Stream::Stdout, data: vec![1] }));
        roundtrip(DownFrame::Link(LinkDown::Credit { bytes: 1 << 20 }));
        roundtrip(DownFrame::Job(Down::Stdin { seq: 9, data: vec![7; 3] }));
        roundtrip(DownFrame::Job(Down::PmixFenceOut { epoch: 5, data: vec![2] }));
        roundtrip(Down::Stdin { seq: 3, data: vec![0, 255, 10] });
        roundtrip(Down::Terminate { grace_ms: 1000 });
        roundtrip(Up::PmixFencePart { epoch: 1 << 40, node: NodeId(7), data: vec![1, 2, 3] });
        roundtrip(Up::PmixFenceIn { epoch: 2, served: true });
        roundtrip(Down::PmixFencePart { epoch: 3, data: vec![0; 1000] });
        roundtrip(Down::PmixFenceOut { epoch: 4, data: b"x".to_vec() });
        roundtrip(Down::BcastData { offset: 1 << 33, data: vec![9; 300].into() });
        roundtrip(DownFrame::Job(Down::BcastData { offset: 0, data: Vec::new().into() }));
        roundtrip(Up::BcastAck { bytes: 1 << 40 });
        roundtrip(Up::BcastFailed { host: "n3".into(), why: "no space".into() });
    }

    #[test]
    fn a_pmix_fence_frame_of_an_unknown_kind_or_cut_short_is_malformed() {
        let mut buf = Vec::new();
        Down::PmixFenceOut { epoch: 0, data: Vec::new() }.encode(&mut buf);
        buf[5] = 2;
        let want = FrameError::Malformed("bad PMIx fence kind 2".into());
        assert_eq!(decode::<Down>(&buf).unwrap_err(), want);
        let short = [0, 0, 0, 5, TAG_PMIX_FENCE, 0, 0, 0, 0];
        let want = FrameError::Malformed("short PMIx fence header".into());
        assert_eq!(decode::<Up>(&short).unwrap_err(), want);
    }

    #[test]
    fn oversized_length_is_refused_before_allocation() {
        let buf = [0xff, 0xff, 0xff, 0xff, 0];
        assert!(matches!(decode::<Up>(&buf), Err(FrameError::TooLarge { .. })));
    }

    #[test]
    fn hello_is_found_after_a_preamble() {
        let mut buf = b"Welcome to n1\n".to_vec();
        assert_eq!(scan_hello(&buf).unwrap(), None);
        buf.extend_from_slice(&hello());
        let found = scan_hello(&buf).unwrap().unwrap();
        assert_eq!(found.preamble_len, 14);
        assert_eq!(found.version, PROTOCOL_VERSION);
        assert_eq!(found.consumed, buf.len());
    }
}
