//! Accepting child proxies that dial in (started by a scheduler's launcher, see
//! [`crate::secure`]): a listener, and a task per connection that lets a peer in only once
//! it has proven the job's secret and greeted.
//!
//! A stranger (a port scanner, garbage, a wrong secret, a peer that stalls) is dropped
//! within [`HANDSHAKE_WAIT`] with a warning, on a task of its own: it never holds up the
//! proxies that belong to the job.

use std::io;
use std::net::{IpAddr, SocketAddr};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::mpsc;

use crate::link::{self, Greeting, ProxyProcess};
use crate::secure::{self, Secret};

/// How long a peer has to finish the handshake and greet.
pub const HANDSHAKE_WAIT: Duration = Duration::from_secs(5);
/// Handshakes under way at once; a connection beyond them is closed at once. Each holds a
/// descriptor and a few KiB for at most [`HANDSHAKE_WAIT`].
const MAX_HANDSHAKES: usize = 64;
/// After a failed accept (out of descriptors, say), the listener stays readable: a pause
/// keeps the loop from spinning.
const ACCEPT_PAUSE: Duration = Duration::from_millis(100);
/// Strangers are each named in a warning up to this many; then one warning a second says
/// how many there were.
const NAMED_STRANGERS: u64 = 100;

/// A proxy that dialed in and said who it is.
pub struct Dialed {
    pub process: ProxyProcess,
    pub greeting: Greeting,
}

/// A listener on `ip`, on a port of the kernel's choosing.
pub fn listen(ip: IpAddr) -> io::Result<(tokio::net::TcpListener, SocketAddr)> {
    let listener = std::net::TcpListener::bind(SocketAddr::new(ip, 0))?;
    listener.set_nonblocking(true)?;
    let address = listener.local_addr()?;
    Ok((tokio::net::TcpListener::from_std(listener)?, address))
}

/// Lets in every peer that proves `secret`, and hands it to `dialed`, until `dialed` is gone.
pub async fn accept(
    listener: tokio::net::TcpListener,
    secret: Secret,
    dialed: mpsc::UnboundedSender<Dialed>,
) {
    let permits = Arc::new(tokio::sync::Semaphore::new(MAX_HANDSHAKES));
    let warnings = Arc::new(Mutex::new(Warnings::default()));
    while !dialed.is_closed() {
        let (stream, peer) = match listener.accept().await {
            Ok(accepted) => accepted,
            Err(e) => {
                warn(&warnings, || format!("accepting a connection failed: {e}"));
                tokio::time::sleep(ACCEPT_PAUSE).await;
                continue;
            }
        };
        let Ok(permit) = permits.clone().try_acquire_owned() else {
            drop(stream);
            let busy = format!("{MAX_HANDSHAKES} handshakes are under way");
            warn(&warnings, || format!("dropped a connection from {peer}: {busy}"));
            continue;
        };
        let (secret, dialed, warnings) = (secret.clone(), dialed.clone(), warnings.clone());
        tokio::spawn(async move {
            let _permit = permit;
            let why = match tokio::time::timeout(HANDSHAKE_WAIT, admit(stream, &secret)).await {
                Ok(Ok(proxy)) => {
                    let _ = dialed.send(proxy);
                    return;
                }
                Ok(Err(why)) => why,
                Err(_) => "no handshake within 5 s".to_string(),
            };
            warn(&warnings, || format!("dropped a connection from {peer}: {why}"));
        });
    }
}

/// Warnings about strangers: each named, up to [`NAMED_STRANGERS`]; past that, at most one
/// a second, saying how many there were, so that a flood of connections cannot flood the
/// log too.
#[derive(Default)]
struct Warnings {
    count: u64,
    last: Option<std::time::Instant>,
}

fn warn(warnings: &Mutex<Warnings>, what: impl FnOnce() -> String) {
    let mut w = warnings.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
    w.count += 1;
    let now = std::time::Instant::now();
    let quiet = w.last.is_some_and(|t| now - t < Duration::from_secs(1));
    if w.count <= NAMED_STRANGERS || !quiet {
        w.last = Some(now);
        let count = w.count;
        drop(w);
        tracing::warn!(strangers = count, "{}", what());
    }
}

/// Lets a peer in if it proves the secret, then reads its hello and greeting.
async fn admit(stream: tokio::net::TcpStream, secret: &Secret) -> Result<Dialed, String> {
    stream.set_nodelay(true).map_err(|e| e.to_string())?;
    let (r, w) = stream.into_split();
    let link = secure::accept(r, w, secret, HANDSHAKE_WAIT).await.map_err(|e| e.to_string())?;
    // Encrypted: read, never spliced.
    let mut process = ProxyProcess::over(Box::new(link.reader), Box::new(link.writer));
    let greeting = link::read_greeting(&mut process.from_child).await.map_err(|e| e.to_string())?;
    Ok(Dialed { process, greeting })
}
