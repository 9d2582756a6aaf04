//! Proxies that dial in: inside a Slurm allocation, one `srun` starts every node's proxy,
//! and srun multiplexes all its tasks' stdio into one stream, so no proxy can have its pipes
//! as a channel. Each dials rlaunch's listener instead and proves it holds the job's secret
//! (see [`rlaunch_proxy::secure`]); the secret reaches it in srun's environment, never on a
//! command line.
//!
//! ```text
//!  rlaunch ── srun --nodes N ... rlaunch-proxy ──► a proxy per node
//!     ▲ listener (bind address)                        │ dials, handshake, proof,
//!     └── Event::Dialed(process, greeting) ◄───────────┘ greeting with its node's name
//! ```
//!
//! A stranger (a port scanner, garbage, a wrong secret, a peer that stalls) is dropped
//! within [`HANDSHAKE_WAIT`] with a warning, on a task of its own: it never holds up the
//! proxies that belong to the job.

use std::io;
use std::net::{IpAddr, Ipv4Addr, SocketAddr, ToSocketAddrs, UdpSocket};
use std::os::unix::process::CommandExt;
use std::process::{Command, Stdio};
use std::time::Duration;

use pmi_wire::io::FrameReader;
use rlaunch_proxy::link::{self, Greeting, ProxyProcess};
use rlaunch_proxy::secure::{self, Secret};
use tokio::sync::mpsc;

/// How long a peer has to finish the handshake and greet.
pub(crate) const HANDSHAKE_WAIT: Duration = Duration::from_secs(5);

/// How the proxies of a dialing launch are started.
#[derive(Debug, Clone)]
pub struct DialPlan {
    /// The launcher command: `srun`, or what `--launcher-exec` says.
    pub launcher: Vec<String>,
    /// `rlaunch-proxy` on the nodes.
    pub proxy_path: String,
    /// Where rlaunch listens: `--bind-address`, or [`reaching`] the first node.
    pub bind: IpAddr,
    /// rlaunch runs inside a step: the proxies' step must overlap it (`srun --overlap`), or
    /// it waits for that step's resources for ever.
    pub overlap: bool,
}

/// A proxy that dialed in and said who it is.
pub(crate) struct Dialed {
    pub process: ProxyProcess,
    pub greeting: Greeting,
}

/// The launcher process, and the task that accepts the proxies.
pub(crate) struct Started {
    pub pid: i32,
    pub acceptor: tokio::task::JoinHandle<()>,
}

/// Listens, then starts one launcher for all of `nodes`; the proxies that dial in arrive on
/// `dialed`.
pub(crate) fn start(
    plan: &DialPlan,
    nodes: &[&str],
    dialed: mpsc::UnboundedSender<Dialed>,
) -> io::Result<Started> {
    let listener = std::net::TcpListener::bind(SocketAddr::new(plan.bind, 0))?;
    listener.set_nonblocking(true)?;
    let address = listener.local_addr()?;
    let listener = tokio::net::TcpListener::from_std(listener)?;
    let secret = Secret::generate()?;
    tracing::info!(%address, nodes = nodes.len(), "listening for proxies");

    let (program, args) =
        plan.launcher.split_first().ok_or_else(|| io::Error::other("empty launcher command"))?;
    let n = nodes.len().to_string();
    let mut srun = Command::new(program);
    srun.args(args)
        .args(["--nodes", &n, "--ntasks", &n, "--ntasks-per-node=1"])
        .args(["--nodelist", &nodes.join(",")])
        // One failed proxy ends the step; the proxies are no MPI program; they and their
        // ranks may use every CPU of the node, as the allocation gave them.
        .args(["--kill-on-bad-exit=1", "--input=none", "--mpi=none", "--cpu-bind=none"])
        .args(plan.overlap.then_some("--overlap"))
        .arg(&plan.proxy_path)
        .env(rlaunch_proxy::PARENT_VAR, address.to_string())
        .env(secure::SECRET_VAR, secret.to_hex())
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .process_group(0);
    let child = srun.spawn()?;
    let acceptor = tokio::spawn(accept(listener, secret, dialed));
    Ok(Started { pid: child.id() as i32, acceptor })
}

/// The local address of the route to `node`: one the node can reach us at.
pub(crate) fn reaching(node: &str) -> io::Result<IpAddr> {
    let target = (node, 9).to_socket_addrs()?.find(SocketAddr::is_ipv4).ok_or_else(|| {
        io::Error::new(io::ErrorKind::NotFound, format!("{node} has no IPv4 address"))
    })?;
    if target.ip().is_loopback() {
        return Ok(IpAddr::V4(Ipv4Addr::LOCALHOST));
    }
    // A UDP "connection" sends nothing; it only asks the kernel for the route.
    let probe = UdpSocket::bind((Ipv4Addr::UNSPECIFIED, 0))?;
    probe.connect(target)?;
    Ok(probe.local_addr()?.ip())
}

async fn accept(
    listener: tokio::net::TcpListener,
    secret: Secret,
    dialed: mpsc::UnboundedSender<Dialed>,
) {
    loop {
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
