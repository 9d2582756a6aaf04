//! One rank's PMI socket: the bytes read and not yet understood, the replies not yet written,
//! and which protocol the rank speaks. The same for a socketpair and a `-pmi-port` connection.
//!
//! ```text
//!  socket ──read_more──► buf ──next_request──► Envelope (init answered on the way)
//!  socket ◄───flush───── out ◄──reply/answer── Reply
//! ```
//!
//! Each message is told apart by its first bytes (docs/pmi.md, *Telling the two apart*): `cmd=`/`mcmd=` is a PMI-1
//! line, anything else a PMI-2 frame. The connection's [`Mode`] decides how to word answers
//! that arrive later, and, once PMI-2, that bytes too short to tell are a frame's.

use std::io;

use pmi_wire::pmi1;
use pmi_wire::pmi2;
use pmi_wire::reply::Reply;
use pmi_wire::request::{Envelope, Message, Protocol, SpawnBlocks};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use super::fault::Fault;
use rlaunch_tree::fdio::FdStream;

/// Requests longer than this are a fault (PMI-1 lines are at most 1024 bytes, PMI-2 bodies
/// 64 KiB, spawn blocks 64 KiB).
const MAX_PENDING: usize = 70 << 10;

/// The protocol a connection has settled on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Mode {
    /// Nothing agreed yet (answers are PMI-1).
    Fresh,
    /// `init` asked for version 1.
    Pmi1,
    /// `init` asked for version 2, or a PMI-2 frame arrived.
    Pmi2,
}

pub(crate) struct PmiConn {
    stream: FdStream,
    /// Read, not yet decoded: after [`PmiConn::next_request`] says "none", at most the start
    /// of one message.
    buf: Vec<u8>,
    /// Replies not yet written.
    out: Vec<u8>,
    mode: Mode,
    /// Whether any whole message arrived; a rank that never spoke may close without finalize.
    spoke: bool,
    /// A PMI-1 spawn whose last block is still to come: like `buf`, a message in pieces.
    spawn: SpawnBlocks,
}

impl PmiConn {
    /// `leftover`: bytes already read from `stream`.
    pub(crate) fn new(stream: FdStream, leftover: Vec<u8>) -> PmiConn {
        PmiConn {
            stream,
            buf: leftover,
            out: Vec::new(),
            mode: Mode::Fresh,
            spoke: false,
            spawn: SpawnBlocks::default(),
        }
    }

    pub(crate) fn mode(&self) -> Mode {
        self.mode
    }

    pub(crate) fn spoke(&self) -> bool {
        self.spoke
    }

    /// The `-pmi-port` handshake: the rank id of a connection that opens with
    /// `cmd=initack pmiid=R`; `None` if it opens with anything else or closes first.
    pub(crate) async fn initack(&mut self) -> Option<u32> {
        loop {
            match pmi1::parse_request(&self.buf) {
                Ok(Some((pmi1::Request::InitAck { pmiid }, used))) => {
                    self.buf.drain(..used);
                    return Some(pmiid);
                }
                Ok(None) if self.buf.len() < pmi1::MAX_LINE => match self.read_more().await {
                    Ok(n) if n > 0 => {}
                    _ => return None,
                },
                _ => return None,
            }
        }
    }

    /// Answers the handshake with the rank's place in its job.
    pub(crate) async fn greet(&mut self, size: u32, rank: u32) -> io::Result<()> {
        self.out.extend_from_slice(&pmi1::Response::InitAck { size, rank }.encode());
        self.flush().await
    }

    /// The next whole request in the buffer; `Ok(None)` until more bytes arrive. `init` is
    /// answered here: it settles the protocol, which is this connection's business.
    pub(crate) fn next_request(&mut self) -> Result<Option<Envelope>, Fault> {
        while let Some(message) = self.next_message()? {
            match message {
                Message::Request(envelope) => return Ok(Some(envelope)),
                Message::Init { version, subversion } => self.init(version, subversion)?,
                Message::InitAck { pmiid } => return Err(Fault::Handshake { pmiid }),
                Message::Unknown { protocol, cmd, text } => {
                    return Err(Fault::unknown(protocol, cmd, &text))
                }
            }
        }
        Ok(None)
    }

    /// Decodes and consumes one message, skipping spawn blocks that are not their spawn's last.
    fn next_message(&mut self) -> Result<Option<Message>, Fault> {
        loop {
            if self.buf.is_empty() {
                return Ok(None);
            }
            let protocol = match (self.mode, pmi2::detect(&self.buf)) {
                (Mode::Pmi2, Some(Protocol::Pmi1)) => Protocol::Pmi1,
                (Mode::Pmi2, _) => Protocol::Pmi2,
                (_, Some(protocol)) => protocol,
                (_, None) => return Ok(None),
            };
            let (message, used) = match protocol {
                Protocol::Pmi1 => match pmi1::parse_request(&self.buf) {
                    Ok(Some((request, used))) => {
                        (Message::from_pmi1(request, &mut self.spawn), used)
                    }
                    Ok(None) => return Ok(None),
                    Err(e) => return Err(Fault::malformed(protocol, e, &self.buf)),
                },
                Protocol::Pmi2 => match pmi2::parse_request(&self.buf) {
                    Ok(Some((envelope, used))) => {
                        self.mode = Mode::Pmi2;
                        (Some(Message::from_pmi2(envelope)), used)
                    }
                    Ok(None) => return Ok(None),
                    Err(e) => return Err(Fault::malformed(protocol, e, &self.buf)),
                },
            };
            self.spoke = true;
            self.buf.drain(..used);
            if let Some(message) = message {
                return Ok(Some(message));
            }
        }
    }

    /// Settles the protocol the rank asked for and confirms it (PMI-2 opens with a PMI-1
    /// line, so the confirmation is PMI-1 either way).
    fn init(&mut self, version: u32, subversion: u32) -> Result<(), Fault> {
        let (mode, agreed) = match version {
            1 => (Mode::Pmi1, pmi1::Response::InitOk { version: 1, subversion: 1 }),
            2 => (Mode::Pmi2, pmi1::Response::InitOk { version: 2, subversion: 0 }),
            _ => return Err(Fault::Version { version, subversion }),
        };
        self.mode = mode;
        self.out.extend_from_slice(&agreed.encode());
        Ok(())
    }

    /// Queues the reply to a request, in the protocol the request came in.
    pub(crate) fn reply(&mut self, reply: Reply, protocol: Protocol, tag: Option<&str>) {
        self.out.extend_from_slice(&reply.encode(protocol, tag));
    }

    /// Queues an answer that arrived later, in the protocol the connection has settled on.
    pub(crate) fn answer(&mut self, reply: Reply, tag: Option<&str>) {
        let protocol = if self.mode == Mode::Pmi2 { Protocol::Pmi2 } else { Protocol::Pmi1 };
        self.reply(reply, protocol, tag);
    }

    /// A fault if more is buffered than any message may be long.
    pub(crate) fn overlong(&self) -> Option<Fault> {
        (self.buf.len() > MAX_PENDING).then(|| Fault::overlong(&self.buf))
    }

    /// Writes the queued replies.
    pub(crate) async fn flush(&mut self) -> io::Result<()> {
        if !self.out.is_empty() {
            self.stream.write_all(&self.out).await?;
            self.out.clear();
        }
        Ok(())
    }

    /// Reads what has arrived into the buffer; 0 at end of file. Cancel-safe: nothing is read
    /// unless the future completes.
    pub(crate) async fn read_more(&mut self) -> io::Result<usize> {
        self.stream.read_buf(&mut self.buf).await
    }
}

#[cfg(test)]
mod tests {
    use std::os::fd::OwnedFd;
    use std::os::unix::net::UnixStream;

    use pmi_wire::request::Request;

    use super::*;

    /// A connection and the rank's end of its socketpair.
    fn pair() -> (PmiConn, tokio::net::UnixStream) {
        let (ours, theirs) = UnixStream::pair().unwrap();
        let stream = FdStream::new(OwnedFd::from(ours)).unwrap();
        theirs.set_nonblocking(true).unwrap();
        (PmiConn::new(stream, Vec::new()), tokio::net::UnixStream::from_std(theirs).unwrap())
    }

    /// Sends `bytes` in pieces of `step`, reading after each, and collects the requests.
    async fn feed(
        conn: &mut PmiConn,
        rank: &mut tokio::net::UnixStream,
        bytes: &[u8],
        step: usize,
    ) -> Vec<Request> {
        let mut got = Vec::new();
        for piece in bytes.chunks(step) {
            rank.write_all(piece).await.unwrap();
            let mut read = 0;
            while read < piece.len() {
                read += conn.read_more().await.unwrap();
            }
            while let Some(envelope) = conn.next_request().unwrap() {
                got.push(envelope.request);
            }
        }
        got
    }

    async fn written(conn: &mut PmiConn, rank: &mut tokio::net::UnixStream) -> String {
        let len = conn.out.len();
        conn.flush().await.unwrap();
        let mut back = vec![0; len];
        rank.read_exact(&mut back).await.unwrap();
        String::from_utf8(back).unwrap()
    }

    const PMI1: &[u8] = b"cmd=init pmi_version=1 pmi_subversion=1\ncmd=get_maxes\n\
        mcmd=spawn\nnprocs=1\nexecname=a\ntotspawns=2\nspawnssofar=1\nendcmd\n\
        cmd=barrier_in\n\
        mcmd=spawn\nnprocs=2\nexecname=b\ntotspawns=2\nspawnssofar=2\nendcmd\n\
        cmd=finalize\n";

    #[tokio::test]
    async fn pmi1_split_anywhere_reads_the_same() {
        for step in [1, 2, 3, 5, 7, 13, 64, PMI1.len()] {
            let (mut conn, mut rank) = pair();
            let got = feed(&mut conn, &mut rank, PMI1, step).await;
            assert_eq!(conn.mode(), Mode::Pmi1);
            assert!(conn.spoke());
            let names: Vec<_> = got.iter().map(|r| format!("{r:?}")).collect();
            assert_eq!(got.len(), 4, "step {step}: {names:?}");
            assert_eq!(got[0], Request::GetMaxes);
            assert_eq!(got[1], Request::Fence);
            let Request::Spawn(spawn) = &got[2] else { panic!("{names:?}") };
            let exes: Vec<_> = spawn.cmds.iter().map(|c| (c.exe.as_str(), c.nprocs)).collect();
            assert_eq!(exes, [("a", 1), ("b", 2)]);
            assert_eq!(got[3], Request::Finalize);
            assert_eq!(
                written(&mut conn, &mut rank).await,
                "cmd=response_to_init pmi_version=1 pmi_subversion=1 rc=0\n"
            );
        }
    }

    #[tokio::test]
    async fn pmi2_is_detected_after_its_init_line_and_split_frames() {
        let mut bytes = b"cmd=init pmi_version=2 pmi_subversion=0\n".to_vec();
        bytes.extend_from_slice(b"38    cmd=fullinit;pmirank=0;threaded=FALSE;");
        bytes.extend_from_slice(b"    24cmd=kvs-fence;thrid=0x1;");
        for step in [1, 4, 6, 11, bytes.len()] {
            let (mut conn, mut rank) = pair();
            let got = feed(&mut conn, &mut rank, &bytes, step).await;
            assert_eq!(got, [Request::FullInit, Request::Fence], "step {step}");
            assert_eq!(conn.mode(), Mode::Pmi2);
            assert_eq!(
                written(&mut conn, &mut rank).await,
                "cmd=response_to_init pmi_version=2 pmi_subversion=0 rc=0\n"
            );
            // Later answers are PMI-2, whatever carried the request.
            conn.answer(Reply::Fence, Some("0x1"));
            assert_eq!(
                written(&mut conn, &mut rank).await,
                "    38cmd=kvs-fence-response;thrid=0x1;rc=0;"
            );
        }
    }

    #[tokio::test]
    async fn a_frame_without_init_is_pmi2() {
        let (mut conn, mut rank) = pair();
        let got = feed(&mut conn, &mut rank, b"14    cmd=kvs-fence;", 3).await;
        assert_eq!(got, [Request::Fence]);
        assert_eq!(conn.mode(), Mode::Pmi2);
    }

    #[tokio::test]
    async fn fresh_answers_are_pmi1_and_silence_is_not_speech() {
        let (mut conn, mut rank) = pair();
        assert!(!conn.spoke());
        // Too few bytes to tell the protocols apart: wait.
        assert!(feed(&mut conn, &mut rank, b"cm", 1).await.is_empty());
        assert!(!conn.spoke());
        conn.answer(Reply::Fence, None);
        assert_eq!(written(&mut conn, &mut rank).await, "cmd=barrier_out\n");
    }

    #[tokio::test]
    async fn protocol_breaches_are_faults() {
        let cases: [(&[u8], &str); 6] = [
            (b"cmd=init pmi_version=3 pmi_subversion=1\n", "asked for PMI version 3.1"),
            (b"cmd=initack pmiid=2\n", "sent a -pmi-port handshake (pmiid=2)"),
            (b"cmd=frobnicate a=b\n", r#"sent an unknown PMI-1 command "frobnicate": "cmd=fro"#),
            (b"15    cmd=frobnicate;", r#"sent an unknown PMI-2 command "frobnicate""#),
            (b"cmd=get kvsname=k\n", "sent a bad PMI-1 message (pmi-1 get: missing key)"),
            (b"\0\xff", "sent a bad PMI-2 message (bad pmi-2 length header"),
        ];
        for (bytes, text) in cases {
            let (mut conn, mut rank) = pair();
            rank.write_all(bytes).await.unwrap();
            let mut read = 0;
            while read < bytes.len() {
                read += conn.read_more().await.unwrap();
            }
            let fault = conn.next_request().unwrap_err().to_string();
            assert!(fault.starts_with(text), "{fault}");
        }
    }

    #[tokio::test]
    async fn in_pmi2_mode_a_short_head_is_a_frame() {
        let (mut conn, mut rank) = pair();
        feed(&mut conn, &mut rank, b"14    cmd=kvs-fence;", 20).await;
        rank.write_all(b"c").await.unwrap();
        conn.read_more().await.unwrap();
        let fault = conn.next_request().unwrap_err().to_string();
        assert!(fault.starts_with("sent a bad PMI-2 message"), "{fault}");
    }

    #[tokio::test]
    async fn initack_keeps_what_follows() {
        let (mut conn, mut rank) = pair();
        rank.write_all(b"cmd=initack pmiid=3\ncmd=init pmi_").await.unwrap();
        assert_eq!(conn.initack().await, Some(3));
        conn.greet(4, 3).await.unwrap();
        let mut back = vec![0; 58];
        rank.read_exact(&mut back).await.unwrap();
        assert_eq!(back, b"cmd=initack\ncmd=set size=4\ncmd=set rank=3\ncmd=set debug=0\n");
        assert!(!conn.spoke(), "the handshake is not PMI speech");
        let got =
            feed(&mut conn, &mut rank, b"version=1 pmi_subversion=1\ncmd=get_appnum\n", 9).await;
        assert_eq!(got, [Request::GetAppnum]);
        assert_eq!(conn.mode(), Mode::Pmi1);

        let (mut conn, mut rank) = pair();
        rank.write_all(b"cmd=init pmi_version=1 pmi_subversion=1\n").await.unwrap();
        assert_eq!(conn.initack().await, None);
        let (mut conn, rank) = pair();
        drop(rank);
        assert_eq!(conn.initack().await, None);
    }

    #[tokio::test]
    async fn overlong_buffers_are_named() {
        let (conn, _rank) = pair();
        let conn = PmiConn { buf: vec![b'7'; MAX_PENDING], ..conn };
        assert!(conn.overlong().is_none());
        let conn = PmiConn { buf: vec![b'7'; MAX_PENDING + 1], ..conn };
        let fault = conn.overlong().unwrap().to_string();
        assert!(fault.starts_with("sent an overlong PMI message starting \"7777"), "{fault}");
    }
}
