//! Proxies that dial in: inside a Slurm allocation, one `srun` starts every node's proxy,
//! and srun multiplexes all its tasks' stdio into one stream, so no proxy can have its pipes
//! as a channel. Each dials rlaunch's listener instead and proves it holds the job's secret
//! (see [`rlaunch_tree::secure`]); the secret reaches it in srun's environment, never on a
//! command line.
//!
//! ```text
//!  rlaunch ── srun --nodes N ... rlaunch-proxy ──► a proxy per node
//!     ▲ listener (bind address)                        │ dials, handshake, proof,
//!     └── Event::Dialed(process, greeting) ◄───────────┘ greeting with its node's name
//! ```
//!
//! Strangers are dealt with by [`dialin`]. The proxies form the tree of `--tree-width`: each
//! dials rlaunch first (its address is the one they all know), and rlaunch sends those that
//! are not its own children to their parent's listener (`LinkDown::Redirect`), once that parent
//! has said where it listens (`Up::Listening`).

use rlaunch_protocol::ids::NodeId;
use std::collections::HashMap;
use std::io;
use std::net::{IpAddr, Ipv4Addr, SocketAddr, ToSocketAddrs, UdpSocket};
use std::os::unix::process::CommandExt;
use std::process::{Command, Stdio};

use rlaunch_protocol::control::LinkDown;
use rlaunch_tree::children::Lost;
use rlaunch_tree::dialin::{self, Dialed};
use rlaunch_tree::secure::{self, Secret};
use tokio::sync::mpsc;

use super::cause::Cause;
use super::{route, Event, Root};
use crate::output::Feed;
use crate::quote::cut;
use crate::quote::io_error;

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
    let (listener, address) = dialin::listen(plan.bind)?;
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
        // The address and the secret travel in srun's environment: --export=NONE (often in
        // batch scripts, as SLURM_EXPORT_ENV) would leave the proxies without them.
        .arg("--export=ALL")
        .args(plan.overlap.then_some("--overlap"))
        .arg(&plan.proxy_path)
        .env(rlaunch_proxy::PARENT_VAR, address.to_string())
        .env(secure::SECRET_VAR, secret.to_hex())
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .process_group(0);
    let child = srun.spawn()?;
    let acceptor = tokio::spawn(dialin::accept(listener, secret, dialed));
    Ok(Started { pid: child.id() as i32, acceptor })
}

/// An address of this machine that the `nodes` can reach it at: the local end of the route
/// to the first node whose name is not this machine's (Debian maps its own name to
/// 127.0.1.1, and rlaunch often runs on the allocation's first node). A node's address is
/// its name's, or where its name does not resolve here (sites often list their nodes to
/// slurmctld only: `NodeName=n[1-3] NodeAddr=10.1.0.[11-13]`), the `NodeAddr` that
/// `scontrol` gives. Loopback only if every node is this machine. An error names the node
/// and what was tried.
pub(crate) fn reaching(nodes: &[String]) -> Result<IpAddr, (String, io::Error)> {
    let mut slurm: Option<Result<HashMap<String, String>, String>> = None;
    for node in nodes {
        let target = match ipv4_of(node) {
            Ok(target) => target,
            Err(by_name) => {
                let known = slurm.get_or_insert_with(|| slurm_addresses(nodes));
                let by_slurm = match known {
                    Ok(known) => match known.get(node) {
                        Some(addr) => ipv4_of(addr).map_err(|e| format!("{}: {e}", cut(addr))),
                        None => Err("scontrol does not show it".to_string()),
                    },
                    Err(e) => Err(e.clone()),
                };
                by_slurm.map_err(|by_slurm| {
                    let tried = format!("its name: {by_name}; Slurm's NodeAddr: {by_slurm}");
                    (node.clone(), io::Error::new(io::ErrorKind::NotFound, tried))
                })?
            }
        };
        if target.ip().is_loopback() {
            continue;
        }
        // A UDP "connection" sends nothing; it only asks the kernel for the route.
        let route = || -> io::Result<IpAddr> {
            let probe = UdpSocket::bind((Ipv4Addr::UNSPECIFIED, 0))?;
            probe.connect(target)?;
            Ok(probe.local_addr()?.ip())
        };
        return route().map_err(|e| (node.clone(), e));
    }
    Ok(IpAddr::V4(Ipv4Addr::LOCALHOST))
}

/// The first IPv4 address `host` (a name or an address) resolves to, or why there is none.
fn ipv4_of(host: &str) -> Result<SocketAddr, String> {
    let resolved = (host, 9).to_socket_addrs().map_err(|e| io_error(&e))?;
    resolved.into_iter().find(SocketAddr::is_ipv4).ok_or_else(|| "no IPv4 address".to_string())
}

/// Each node's `NodeAddr`, as `scontrol -o show node` gives it for `nodes`.
fn slurm_addresses(nodes: &[String]) -> Result<HashMap<String, String>, String> {
    let shown = Command::new("scontrol")
        .args(["-o", "show", "node", &nodes.join(",")])
        .stdin(Stdio::null())
        .stderr(Stdio::piped())
        .output()
        .map_err(|e| format!("cannot run scontrol: {}", io_error(&e)))?;
    if !shown.status.success() {
        // Its last line says why (the ones before, where it looked).
        let said = String::from_utf8_lossy(&shown.stderr);
        let why = said.lines().rev().find(|l| !l.trim().is_empty()).unwrap_or_default();
        return Err(format!("scontrol failed ({}): {}", shown.status, cut(why.trim())));
    }
    Ok(crate::allocation::slurm::node_addresses(&String::from_utf8_lossy(&shown.stdout)))
}

/// The one process (srun) that started every proxy of a dialing launch.
pub(super) struct Launcher {
    pub pid: i32,
    pub name: String,
    pub ended: Option<rlaunch_protocol::ids::ExitOutcome>,
    pub acceptor: tokio::task::JoinHandle<()>,
}

impl Root {
    /// A proxy dialed in: it becomes the child of its name, if one waits for it; a proxy
    /// deeper in the tree is sent to its parent.
    pub(super) fn attach(
        &mut self,
        proxy: Dialed,
        events: &mpsc::UnboundedSender<Event>,
        output: &Feed,
    ) {
        let report = self.plan.report_bindings;
        let host = proxy.greeting.host.clone();
        if let Some(&parent) = self.parent_of.get(&host) {
            match self.listening.get(&parent) {
                Some(address) => redirect(proxy, address.clone()),
                None => self.redirects.push((proxy, parent)),
            }
            return;
        }
        let job = &self.plan.job;
        let attached = self.children.attach(proxy.process, proxy.greeting, job, |child| {
            let (output, events) = (output.clone(), events.clone());
            move |event| route(child, event, output.clone(), events.clone(), report)
        });
        match attached {
            Ok(_) if self.children.dialing() == 0 => self.dial_deadline = None,
            Ok(_) => {}
            Err(why) => tracing::warn!(%host, "dropped a proxy that dialed in: {why}"),
        }
    }

    /// The proxies still to dial in are lost, for `reason`.
    pub(super) fn give_up_dialing(&mut self, reason: &str) {
        self.dial_deadline = None;
        for Lost { host, reason } in self.children.give_up_dialing(reason) {
            self.fail(Cause::LostProxy { host, reason });
        }
    }

    /// The proxy of `node` listens at `address`: the proxies waiting for it go there.
    pub(super) fn listening(&mut self, node: NodeId, address: String) {
        tracing::debug!(%node, %address, "a proxy listens for its children");
        let (now, later) = std::mem::take(&mut self.redirects)
            .into_iter()
            .partition(|(_, parent)| *parent == node);
        self.redirects = later;
        for (proxy, _) in now {
            redirect(proxy, address.clone());
        }
        self.listening.insert(node, address);
    }
}

/// Sends a proxy that dialed rlaunch to its parent's listener, and lets it go.
fn redirect(proxy: Dialed, to: String) {
    use rlaunch_protocol::control::Frame;
    use tokio::io::AsyncWriteExt;
    tracing::debug!(host = %proxy.greeting.host, %to, "sending a proxy to its parent");
    let mut frames = rlaunch_protocol::control::hello().to_vec();
    LinkDown::Redirect { to }.encode(&mut frames);
    let mut writer = proxy.process.to_child;
    tokio::spawn(async move {
        if writer.write_all(&frames).await.is_ok() {
            let _ = writer.flush().await;
        }
    });
}
