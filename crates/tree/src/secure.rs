//! An authenticated, encrypted byte stream for control links over TCP: the links of proxies
//! started by a launcher that multiplexes all its tasks' stdio into one stream (srun, qrsh,
//! blaunch, pbsdsh), which dial their parent instead of talking over its pipes.
//!
//! The cryptography is the Noise protocol framework's, from the `snow` crate:
//! `Noise_NNpsk0_25519_AESGCM_BLAKE2s`, with the job's secret as the pre-shared key, on ring's
//! AES-GCM (AES-NI), well ahead of the pure-Rust ChaCha20-Poly1305 here (docs/measurements.md,
//! *Encrypted links*).
//!
//! ```text
//!  dialer (child proxy)                         listener (parent)
//!  -> psk, e        ────────────────────────►   wrong secret: MAC fails, dropped
//!                   ◄────────────────────────   <- e, ee
//!  proof record     ────────────────────────►   a replayed first message cannot make it
//!  records both ways (u16 BE length | ciphertext), each direction its own nonce count
//! ```
//!
//! Nothing but the handshake's second message goes to a peer before its proof has arrived,
//! and everything after it is encrypted and authenticated under keys only the two ends hold.
//! Each side has a deadline for the whole exchange, so a peer that stalls is dropped.

use std::fmt;
use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{ready, Context, Poll};
use std::time::Duration;

use snow::StatelessTransportState;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, ReadBuf};

const PATTERN: &str = "Noise_NNpsk0_25519_AESGCM_BLAKE2s";
/// Largest Noise message, and so largest record on the wire.
const MAX_MESSAGE: usize = 65535;
const TAG: usize = 16;
/// Largest plaintext in one record.
const MAX_PLAIN: usize = MAX_MESSAGE - TAG;
/// Both handshake messages of this pattern, with empty payloads: an ephemeral key (32 bytes)
/// and a tag (16). Any other length is refused before anything is allocated for it.
const HANDSHAKE_MESSAGE: usize = 48;
/// What the dialer sends first, once the keys are agreed: proof that it holds them.
const PROOF: &[u8] = b"rlaunch link proof v1";
/// The environment variable that carries the address a dialing proxy connects to (its
/// parent's listener), beside [`SECRET_VAR`].
pub const PARENT_VAR: &str = "RLAUNCH_PARENT";
/// The environment variable that carries the job's secret to the proxies, in hex.
pub const SECRET_VAR: &str = "RLAUNCH_JOB_SECRET";
/// The environment variable that says, in seconds, how long a dialing proxy waits for its
/// parent to answer (the job's `--silence-timeout`: a parent stopped before the link is up
/// is as lost as one that falls silent after).
pub const WAIT_VAR: &str = "RLAUNCH_DIAL_WAIT";

/// The job's shared secret: 32 random bytes, fresh per job. Never printed.
#[derive(Clone, PartialEq, Eq)]
pub struct Secret([u8; 32]);

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Secret(..)")
    }
}

impl Secret {
    /// A fresh secret from the operating system's random source.
    pub fn generate() -> io::Result<Secret> {
        let mut bytes = [0u8; 32];
        getrandom::fill(&mut bytes).map_err(|e| io::Error::other(e.to_string()))?;
        Ok(Secret(bytes))
    }

    /// The secret as it travels inside the tree's own links (`Job::adoption`).
    pub fn bytes(&self) -> [u8; 32] {
        self.0
    }

    pub fn from_bytes(bytes: [u8; 32]) -> Secret {
        Secret(bytes)
    }

    pub fn to_hex(&self) -> String {
        self.0.iter().map(|b| format!("{b:02x}")).collect()
    }

    /// Parses 64 hex digits; `None` for anything else (whose text is not echoed anywhere).
    pub fn from_hex(text: &str) -> Option<Secret> {
        let text = text.trim().as_bytes();
        if text.len() != 64 {
            return None;
        }
        let mut bytes = [0u8; 32];
        for (byte, pair) in bytes.iter_mut().zip(text.chunks(2)) {
            let digits = std::str::from_utf8(pair).ok()?;
            *byte = u8::from_str_radix(digits, 16).ok()?;
        }
        Some(Secret(bytes))
    }
}

/// Why a peer was not let in; said in a warning, and the connection is dropped.
#[derive(Debug, thiserror::Error)]
pub enum HandshakeError {
    #[error("no handshake within {} s", .0.as_secs_f64())]
    Timeout(Duration),
    #[error("it does not hold the job's secret, or sent something else")]
    Rejected,
    #[error("{0}")]
    Io(#[from] io::Error),
}

/// Whatever snow refuses (a message that does not verify, above all) is a peer to drop.
impl From<snow::Error> for HandshakeError {
    fn from(_: snow::Error) -> HandshakeError {
        HandshakeError::Rejected
    }
}

/// The two halves of a link, after the handshake.
pub struct SecureLink<R, W> {
    pub reader: SecureReader<R>,
    pub writer: SecureWriter<W>,
}

/// The dialer's side: proves it holds `secret` and returns the link.
pub async fn connect<R, W>(
    mut reader: R,
    mut writer: W,
    secret: &Secret,
    deadline: Duration,
) -> Result<SecureLink<R, W>, HandshakeError>
where
    R: AsyncRead + Unpin,
    W: AsyncWrite + Unpin,
{
    let exchange = async {
        let mut noise = builder(secret)?.build_initiator()?;
        let mut message = [0u8; 2 * HANDSHAKE_MESSAGE];
        let len = noise.write_message(&[], &mut message)?;
        write_record(&mut writer, &message[..len]).await?;
        let reply = read_handshake(&mut reader).await?;
        noise.read_message(&reply, &mut message)?;
        let keys = noise.into_stateless_transport_mode()?;
        let link = split(reader, writer, keys);
        Ok::<_, HandshakeError>(link)
    };
    let mut link = tokio::time::timeout(deadline, exchange)
        .await
        .map_err(|_| HandshakeError::Timeout(deadline))??;
    link.writer.write_all(PROOF).await?;
    link.writer.flush().await?;
    Ok(link)
}

/// The listener's side: lets in a peer that proves it holds `secret`, within `deadline`.
pub async fn accept<R, W>(
    mut reader: R,
    mut writer: W,
    secret: &Secret,
    deadline: Duration,
) -> Result<SecureLink<R, W>, HandshakeError>
where
    R: AsyncRead + Unpin,
    W: AsyncWrite + Unpin,
{
    let exchange = async {
        let mut noise = builder(secret)?.build_responder()?;
        let mut message = [0u8; 2 * HANDSHAKE_MESSAGE];
        let first = read_handshake(&mut reader).await?;
        noise.read_message(&first, &mut message)?;
        let len = noise.write_message(&[], &mut message)?;
        write_record(&mut writer, &message[..len]).await?;
        let keys = noise.into_stateless_transport_mode()?;
        let mut link = split(reader, writer, keys);
        let mut proof = [0u8; PROOF.len()];
        link.reader.read_exact(&mut proof).await.map_err(|e| match e.kind() {
            io::ErrorKind::InvalidData => HandshakeError::Rejected,
            _ => HandshakeError::Io(e),
        })?;
        if proof != PROOF {
            return Err(HandshakeError::Rejected);
        }
        Ok(link)
    };
    tokio::time::timeout(deadline, exchange).await.map_err(|_| HandshakeError::Timeout(deadline))?
}

fn builder(secret: &Secret) -> Result<snow::Builder<'_>, HandshakeError> {
    let params = PATTERN.parse()?;
    Ok(snow::Builder::new(params).psk(0, &secret.0)?)
}

fn split<R, W>(reader: R, writer: W, keys: StatelessTransportState) -> SecureLink<R, W> {
    let keys = Arc::new(keys);
    SecureLink {
        reader: SecureReader {
            inner: reader,
            keys: keys.clone(),
            nonce: 0,
            raw: Vec::new(),
            plain: Vec::new(),
            taken: 0,
        },
        writer: SecureWriter { inner: writer, keys, nonce: 0, pending: Vec::new(), sent: 0 },
    }
}

async fn write_record<W: AsyncWrite + Unpin>(writer: &mut W, message: &[u8]) -> io::Result<()> {
    let mut record = Vec::with_capacity(2 + message.len());
    record.extend_from_slice(&(message.len() as u16).to_be_bytes());
    record.extend_from_slice(message);
    writer.write_all(&record).await?;
    writer.flush().await
}

/// One handshake message; anything but its one length is refused before it is read.
async fn read_handshake<R: AsyncRead + Unpin>(
    reader: &mut R,
) -> Result<[u8; HANDSHAKE_MESSAGE], HandshakeError> {
    let mut len = [0u8; 2];
    reader.read_exact(&mut len).await?;
    if u16::from_be_bytes(len) as usize != HANDSHAKE_MESSAGE {
        return Err(HandshakeError::Rejected);
    }
    let mut message = [0u8; HANDSHAKE_MESSAGE];
    reader.read_exact(&mut message).await?;
    Ok(message)
}

/// Decrypts the records that arrive on `inner`.
pub struct SecureReader<R> {
    inner: R,
    keys: Arc<StatelessTransportState>,
    nonce: u64,
    /// Bytes of records not yet complete.
    raw: Vec<u8>,
    /// The last record's plaintext, and how much of it was read.
    plain: Vec<u8>,
    taken: usize,
}

/// Encrypts what is written into records on `inner`. Written bytes are accepted into a
/// record at once; `flush` (or the next write) sends what is still pending.
pub struct SecureWriter<W> {
    inner: W,
    keys: Arc<StatelessTransportState>,
    nonce: u64,
    /// Records not yet written, and how much of them was.
    pending: Vec<u8>,
    sent: usize,
}

fn forged() -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, "a record failed authentication")
}

impl<R: AsyncRead + Unpin> AsyncRead for SecureReader<R> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        loop {
            if this.taken < this.plain.len() {
                let n = buf.remaining().min(this.plain.len() - this.taken);
                buf.put_slice(&this.plain[this.taken..this.taken + n]);
                this.taken += n;
                return Poll::Ready(Ok(()));
            }
            if this.raw.len() >= 2 {
                let len = u16::from_be_bytes([this.raw[0], this.raw[1]]) as usize;
                if this.raw.len() >= 2 + len {
                    this.plain.resize(len, 0);
                    let n = this
                        .keys
                        .read_message(this.nonce, &this.raw[2..2 + len], &mut this.plain)
                        .map_err(|_| forged())?;
                    this.nonce += 1;
                    this.plain.truncate(n);
                    this.taken = 0;
                    this.raw.drain(..2 + len);
                    continue;
                }
            }
            let start = this.raw.len();
            this.raw.reserve(MAX_MESSAGE + 2);
            let mut read = ReadBuf::uninit(this.raw.spare_capacity_mut());
            let polled = Pin::new(&mut this.inner).poll_read(cx, &mut read);
            let got = read.filled().len();
            // SAFETY: the inner reader initialised the first `got` bytes of the spare capacity.
            unsafe { this.raw.set_len(start + got) };
            ready!(polled)?;
            if got == 0 {
                return Poll::Ready(if this.raw.is_empty() {
                    Ok(())
                } else {
                    Err(io::Error::new(io::ErrorKind::UnexpectedEof, "a record was cut short"))
                });
            }
        }
    }
}

impl<W: AsyncWrite + Unpin> SecureWriter<W> {
    fn poll_send_pending(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        while self.sent < self.pending.len() {
            let n = ready!(Pin::new(&mut self.inner).poll_write(cx, &self.pending[self.sent..]))?;
            if n == 0 {
                return Poll::Ready(Err(io::ErrorKind::WriteZero.into()));
            }
            self.sent += n;
        }
        self.pending.clear();
        self.sent = 0;
        Poll::Ready(Ok(()))
    }
}

impl<W: AsyncWrite + Unpin> AsyncWrite for SecureWriter<W> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        ready!(this.poll_send_pending(cx))?;
        let chunk = &buf[..buf.len().min(MAX_PLAIN)];
        this.pending.resize(2 + chunk.len() + TAG, 0);
        let n = this
            .keys
            .write_message(this.nonce, chunk, &mut this.pending[2..])
            .map_err(|e| io::Error::other(e.to_string()))?;
        this.nonce += 1;
        this.pending.truncate(2 + n);
        this.pending[..2].copy_from_slice(&(n as u16).to_be_bytes());
        // Start sending now; what the socket does not take yet goes with the next call.
        if let Poll::Ready(Err(e)) = this.poll_send_pending(cx) {
            return Poll::Ready(Err(e));
        }
        Poll::Ready(Ok(chunk.len()))
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        ready!(this.poll_send_pending(cx))?;
        Pin::new(&mut this.inner).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        ready!(this.poll_send_pending(cx))?;
        Pin::new(&mut this.inner).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use tokio::io::{duplex, split, DuplexStream, ReadHalf, WriteHalf};

    use super::*;

    const SOON: Duration = Duration::from_secs(5);

    type Halves = (ReadHalf<DuplexStream>, WriteHalf<DuplexStream>);

    fn pipe() -> (Halves, Halves) {
        let (a, b) = duplex(1 << 20);
        (split(a), split(b))
    }

    fn secret(byte: u8) -> Secret {
        Secret([byte; 32])
    }

    #[tokio::test]
    async fn a_link_carries_bytes_both_ways_in_many_records() {
        let ((ar, aw), (br, bw)) = pipe();
        let s = secret(7);
        let (dialed, accepted) = tokio::join!(connect(ar, aw, &s, SOON), accept(br, bw, &s, SOON));
        let (mut dialed, mut accepted) = (dialed.unwrap(), accepted.unwrap());
        let data: Vec<u8> = (0..300_000u32).map(|i| (i * 7 % 251) as u8).collect();
        let (sent, got) = tokio::join!(
            async {
                dialed.writer.write_all(&data).await.unwrap();
                dialed.writer.shutdown().await.unwrap();
            },
            async {
                let mut got = Vec::new();
                accepted.reader.read_to_end(&mut got).await.unwrap();
                got
            }
        );
        let () = sent;
        assert_eq!(got, data);
        accepted.writer.write_all(b"and back").await.unwrap();
        accepted.writer.flush().await.unwrap();
        let mut back = [0u8; 8];
        dialed.reader.read_exact(&mut back).await.unwrap();
        assert_eq!(&back, b"and back");
    }

    #[tokio::test]
    async fn a_peer_with_the_wrong_secret_is_rejected_and_gets_nothing() {
        let ((ar, aw), (br, bw)) = pipe();
        let (ours, theirs) = (secret(1), secret(2));
        let (dialed, accepted) =
            tokio::join!(connect(ar, aw, &ours, SOON), accept(br, bw, &theirs, SOON));
        assert!(matches!(accepted, Err(HandshakeError::Rejected)), "{:?}", accepted.err());
        // The listener dropped its halves without a byte: the dialer saw only the end.
        match dialed {
            Err(HandshakeError::Io(e)) => assert_eq!(e.kind(), io::ErrorKind::UnexpectedEof),
            other => panic!("{:?}", other.err()),
        }
    }

    #[tokio::test]
    async fn garbage_and_silence_are_dropped_within_the_deadline() {
        let ((_ar, mut aw), (br, bw)) = pipe();
        let noise: Vec<u8> =
            (0..70_000u32).map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8).collect();
        aw.write_all(&noise).await.unwrap();
        let got = accept(br, bw, &secret(3), SOON).await;
        assert!(matches!(got, Err(HandshakeError::Rejected)), "{:?}", got.err());

        let ((_ar, mut aw), (br, bw)) = pipe();
        aw.write_all(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n").await.unwrap();
        let got = accept(br, bw, &secret(3), Duration::from_millis(300)).await;
        assert!(got.is_err(), "HTTP is not a handshake");

        let ((_ar, _aw), (br, bw)) = pipe();
        let start = std::time::Instant::now();
        let got = accept(br, bw, &secret(3), Duration::from_millis(200)).await;
        assert!(matches!(got, Err(HandshakeError::Timeout(_))), "{:?}", got.err());
        assert!(start.elapsed() < Duration::from_secs(2));
    }

    #[tokio::test]
    async fn a_replayed_first_message_proves_nothing() {
        // Capture a genuine first message.
        let s = secret(9);
        let ((ar, aw), (mut br, _bw)) = pipe();
        let capture = async {
            let mut first = vec![0u8; 2 + 48];
            br.read_exact(&mut first).await.unwrap();
            first
        };
        let (_, first) = tokio::join!(connect(ar, aw, &s, Duration::from_millis(300)), capture);
        // Replay it to a listener: it answers, waits for a proof, and the replayer cannot
        // make one.
        let ((mut mr, mut mw), (lr, lw)) = pipe();
        mw.write_all(&first).await.unwrap();
        let replayer = async {
            let mut answer = vec![0u8; 2 + 48];
            mr.read_exact(&mut answer).await.unwrap();
            mw.write_all(&first).await.unwrap();
            let mut more = Vec::new();
            let _ =
                tokio::time::timeout(Duration::from_millis(500), mr.read_to_end(&mut more)).await;
            more
        };
        let (accepted, more) = tokio::join!(accept(lr, lw, &s, SOON), replayer);
        assert!(matches!(accepted, Err(HandshakeError::Rejected)), "{:?}", accepted.err());
        assert!(more.is_empty(), "the listener sent {} bytes after its answer", more.len());
    }

    #[tokio::test]
    async fn a_tampered_record_is_an_error() {
        let s = secret(4);
        let ((ar, aw), (br, bw)) = pipe();
        let (dialed, accepted) = tokio::join!(connect(ar, aw, &s, SOON), accept(br, bw, &s, SOON));
        let (dialed, mut accepted) = (dialed.unwrap(), accepted.unwrap());
        // A record written by hand with the right length and a forged body.
        let SecureWriter { inner: mut raw, .. } = dialed.writer;
        raw.write_all(&[0, 20]).await.unwrap();
        raw.write_all(&[0x55; 20]).await.unwrap();
        let mut buf = [0u8; 4];
        let e = accepted.reader.read(&mut buf).await.unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::InvalidData);
    }

    #[test]
    fn secrets_travel_as_hex_and_are_never_printed() {
        let s = Secret::generate().unwrap();
        assert_ne!(s, Secret::generate().unwrap());
        assert_eq!(Secret::from_hex(&s.to_hex()), Some(s.clone()));
        assert_eq!(format!("{s:?}"), "Secret(..)");
        assert_eq!(Secret::from_hex("abc"), None);
        assert_eq!(Secret::from_hex(&"zz".repeat(32)), None);
    }
}
