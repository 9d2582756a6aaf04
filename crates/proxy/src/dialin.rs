//! Accepting child proxies that dial in (started by a scheduler's launcher, see
//! [`crate::secure`]): a listener, and a task per connection that lets a peer in only once
//! it has proven the job's secret and greeted.
//!
//! A stranger (a port scanner, garbage, a wrong secret, a peer that stalls) is dropped
//! within [`HANDSHAKE_WAIT`] with a warning, on a task of its own: it never holds up the
//! proxies that belong to the job.

use std::io;
use std::net::{IpAddr, SocketAddr};
use std::time::Duration;

use pmi_wire::io::FrameReader;
use tokio::sync::mpsc;

use crate::link::{self, Greeting, ProxyProcess};
use crate::secure::{self, Secret};

/// How long a peer has to finish the handshake and greet.
pub const HANDSHAKE_WAIT: Duration = Duration::from_secs(5);

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
    while !dialed.is_closed() {
        let (stream, peer) = match listener.accept().await {
            Ok(accepted) => accepted,
            Err(e) => {
                tracing::warn!("accepting a proxy's connection failed: {e}");
                continue;
            }
        };
        let (secret, dialed) = (secret.clone(), dialed.clone());
        tokio::spawn(async move {
            match tokio::time::timeout(HANDSHAKE_WAIT, admit(stream, &secret)).await {
                Ok(Ok(proxy)) => {
                    let _ = dialed.send(proxy);
                }
                Ok(Err(why)) => tracing::warn!(%peer, "dropped a connection: {why}"),
                Err(_) => tracing::warn!(%peer, "dropped a connection: no handshake within 5 s"),
            }
        });
    }
}

/// Lets a peer in if it proves the secret, then reads its hello and greeting.
async fn admit(stream: tokio::net::TcpStream, secret: &Secret) -> Result<Dialed, String> {
    stream.set_nodelay(true).map_err(|e| e.to_string())?;
    let (r, w) = stream.into_split();
    let link = secure::accept(r, w, secret, HANDSHAKE_WAIT).await.map_err(|e| e.to_string())?;
    let mut from_child = FrameReader::new(Box::new(link.reader) as link::LinkRead);
    let greeting = link::read_greeting(&mut from_child).await.map_err(|e| e.to_string())?;
    let process = ProxyProcess {
        pid: -1,
        from_child,
        greeted: None,
        to_child: Box::new(link.writer),
        stderr: None,
        what: "its proxy".to_string(),
        launched: false,
    };
    Ok(Dialed { process, greeting })
}
