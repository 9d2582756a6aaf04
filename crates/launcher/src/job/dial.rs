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
//!
//! rlaunch listens while the job runs: a proxy started for spawned ranks on a host that has
//! none gets an srun of its own ([`start_late`]) and dials in the same way, as rlaunch's child.

use rlaunch_protocol::ids::NodeId;
use std::collections::HashMap;
use std::io;
use std::net::{IpAddr, Ipv4Addr, SocketAddr, ToSocketAddrs, UdpSocket};
use std::os::unix::process::CommandExt;
use std::process::{Command, Stdio};

use nix::sys::signal::Signal;
use rlaunch_protocol::control::{LinkDown, NodePlan};
use rlaunch_tree::children::Lost;
use rlaunch_tree::dialin::{self, Dialed};
use rlaunch_tree::secure::{self, Secret};
use rlaunch_tree::{link, procs};
use tokio::sync::mpsc;
use tokio::time::Instant;

use super::{route, Event, Root};
use crate::output::Feed;
use crate::quote::{cut, io_error};

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
    /// `--silence-timeout`: how long a dialing proxy waits for an answer from its parent.
    pub silence: std::time::Duration,
}

/// The launcher process, and the task that accepts the proxies.
pub(crate) struct Started {
    pub pid: i32,
    pub acceptor: tokio::task::JoinHandle<()>,
    /// Where a proxy started later dials, and what it proves.
    pub back: DialBack,
}

/// rlaunch's listener for the proxies of a dialing launch, and the job's secret: what a
/// proxy started during the run (for spawned ranks) is given too, to dial in as the first
/// ones did.
#[derive(Clone)]
pub(crate) struct DialBack {
    pub address: SocketAddr,
    pub secret: Secret,
}

/// Listens, then starts one launcher for all of `nodes`; the proxies that dial in arrive on
/// `dialed`.
pub(crate) fn start(
    plan: &DialPlan,
    nodes: &[&str],
    dialed: mpsc::UnboundedSender<Dialed>,
) -> io::Result<Started> {
    let (listener, address) = dialin::listen(plan.bind)?;
    let back = DialBack { address, secret: Secret::generate()? };
    tracing::info!(%address, nodes = nodes.len(), "listening for proxies");
    let pid = launch(plan, nodes, &back, plan.overlap)?;
    let acceptor = tokio::spawn(dialin::accept(listener, back.secret.clone(), dialed));
    Ok(Started { pid, acceptor, back })
}

/// Starts the launcher of one proxy, on `host`, during the run: it dials in at `back` as
/// the first ones did. Its step overlaps the job's others: the first proxies' step keeps
/// its CPUs until its last proxy ends, on this host too if its proxy ended already.
pub(crate) fn start_late(plan: &DialPlan, host: &str, back: &DialBack) -> io::Result<i32> {
    tracing::debug!(%host, "starting a proxy during the run");
    launch(plan, &[host], back, true)
}

/// Starts the launcher (srun) of a proxy on each of `nodes`, each to dial `back`; its pid.
fn launch(plan: &DialPlan, nodes: &[&str], back: &DialBack, overlap: bool) -> io::Result<i32> {
    let (program, args) =
        plan.launcher.split_first().ok_or_else(|| io::Error::other("empty launcher command"))?;
    let n = nodes.len().to_string();
    let mut srun = Command::new(program);
    srun.args(args)
        .args(["--nodes", &n, "--ntasks", &n, "--ntasks-per-node=1"])
        .args(["--nodelist", &nodes.join(",")])
        // A failed proxy does not end the step: rlaunch ends the job itself, the survivors'
        // output drained (srun's kill would cut it), or goes on without the node (srun would
        // take the survivors' proxies down with it). The proxies are no MPI program; they
        // and their ranks may use every CPU of the node, as the allocation gave them.
        .args(["--kill-on-bad-exit=0", "--input=none", "--mpi=none", "--cpu-bind=none"])
        // The address and the secret travel in srun's environment: --export=NONE (often in
        // batch scripts, as SLURM_EXPORT_ENV) would leave the proxies without them.
        .arg("--export=ALL")
        .args(overlap.then_some("--overlap"))
        .arg(&plan.proxy_path)
        .env(secure::PARENT_VAR, back.address.to_string())
        .env(secure::SECRET_VAR, back.secret.to_hex())
        .env(secure::WAIT_VAR, plan.silence.as_secs_f64().to_string())
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .process_group(0);
    Ok(srun.spawn()?.id() as i32)
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

/// Where each proxy of a dialing launch goes once it dialed rlaunch: rlaunch's own children
/// are attached, the others sent to their parent's listener, once that parent said where it
/// listens (`Up::Listening`). Pure; `P` is a proxy that dialed in.
pub(super) struct DialTree<P> {
    /// The node of the parent of each proxy below the top, by host.
    parent_of: HashMap<String, NodeId>,
    /// Where the interior proxies listen for their children, by node.
    listening: HashMap<NodeId, String>,
    /// Proxies that dialed rlaunch before their parent said where it listens.
    waiting: Vec<(P, NodeId)>,
}

/// Where a proxy that dialed rlaunch goes.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum Arrival<P> {
    /// A child of rlaunch's own: attached.
    Child(P),
    /// Sent to its parent, which listens at this address.
    Redirect(P, String),
    /// Kept until its parent says where it listens.
    Waits,
}

impl<P> DialTree<P> {
    /// The tree of `roots` (rlaunch's children) and every node below them.
    pub(super) fn new(roots: &[NodePlan]) -> DialTree<P> {
        let parent_of = roots
            .iter()
            .flat_map(|r| r.walk())
            .flat_map(|node| node.children.iter().map(|c| (c.host.clone(), node.index)))
            .collect();
        DialTree { parent_of, listening: HashMap::new(), waiting: Vec::new() }
    }

    /// The proxy of `host` is one of rlaunch's own children, started during the run, not the
    /// child of the node above it in the first tree.
    pub(super) fn top(&mut self, host: &str) {
        self.parent_of.remove(host);
    }

    /// The proxy of `host` dialed rlaunch.
    pub(super) fn arrived(&mut self, host: &str, proxy: P) -> Arrival<P> {
        let Some(&parent) = self.parent_of.get(host) else { return Arrival::Child(proxy) };
        match self.listening.get(&parent) {
            Some(address) => Arrival::Redirect(proxy, address.clone()),
            None => {
                self.waiting.push((proxy, parent));
                Arrival::Waits
            }
        }
    }

    /// The proxy of `node` listens at `address`: the proxies that wait for it, to be sent
    /// there.
    pub(super) fn listening(&mut self, node: NodeId, address: String) -> Vec<(P, String)> {
        let (now, later) = std::mem::take(&mut self.waiting).into_iter().partition(|w| w.1 == node);
        self.waiting = later;
        self.listening.insert(node, address.clone());
        now.into_iter().map(|(proxy, _)| (proxy, address.clone())).collect()
    }

    /// The proxies still waiting for their parent, dropped (the job ends: closing their
    /// connections ends them).
    pub(super) fn drop_waiting(&mut self) {
        self.waiting.clear();
    }
}

impl<P> Default for DialTree<P> {
    fn default() -> DialTree<P> {
        DialTree { parent_of: HashMap::new(), listening: HashMap::new(), waiting: Vec::new() }
    }
}

/// A process (srun) that started proxies of a dialing launch: the job's first ones, or one
/// started during the run.
pub(super) struct Launcher {
    pub pid: i32,
    pub name: String,
    pub ended: Option<rlaunch_protocol::ids::ExitOutcome>,
    /// The child it started during the run; `None`: it started the first proxies.
    pub late: Option<usize>,
}

/// rlaunch's listener for the proxies of a dialing launch, while the job runs.
pub(super) struct Listening {
    pub acceptor: tokio::task::JoinHandle<()>,
    pub back: DialBack,
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
        let proxy = match self.dial_tree.arrived(&host, proxy) {
            Arrival::Child(proxy) => proxy,
            Arrival::Redirect(proxy, address) => return redirect(proxy, address),
            Arrival::Waits => return,
        };
        let (job, attempt) = (&self.plan.job, self.policy.attempt());
        let attached = self.children.attach(proxy.process, proxy.greeting, job, |child| {
            let (output, events) = (output.clone(), events.clone());
            move |event| route(child, attempt, event, output.clone(), events.clone(), report)
        });
        match attached {
            Ok(_) if self.children.dialing() == 0 => self.dial_deadline = None,
            Ok(_) => {}
            Err(why) => tracing::warn!(%host, "dropped a proxy that dialed in: {why}"),
        }
    }

    /// The proxies still to dial in that `which(child, late)` picks are lost, for `reason`:
    /// one of the first ends the job, one started for a spawn fails that spawn.
    pub(super) fn give_up_dialing(&mut self, reason: &str, which: impl Fn(usize, bool) -> bool) {
        for (child, lost) in self.children.give_up_dialing(reason, which) {
            // A late proxy's own launcher goes with it: an srun still waiting for its step's
            // resources would otherwise wait until the job's end.
            let started = self.launchers.iter().find(|l| l.late == Some(child));
            if let Some(launcher) = started.filter(|l| l.ended.is_none()) {
                procs::signal_pid(launcher.pid, Signal::SIGTERM);
            }
            self.proxy_lost(lost);
        }
        if self.children.dialing() == 0 {
            self.dial_deadline = None;
        }
    }

    /// A launcher ended: the proxies it started that have not dialed in never will.
    /// `late`: the child it started during the run, or `None` for the first proxies'.
    pub(super) fn launcher_ended(&mut self, late: Option<usize>, reason: &str) {
        match late {
            Some(index) => self.give_up_dialing(reason, |child, _| child == index),
            None => self.give_up_dialing(reason, |_, late| !late),
        }
    }

    /// Starts the proxy of `plan`'s node during the run, with a launcher of its own that
    /// overlaps the job's steps; it dials in as the first proxies did, and is rlaunch's own
    /// child wherever the tree had its host before. `window`: the output it may have on
    /// the way. Returns its index, or why it is lost.
    pub(super) fn start_late_dialing(
        &mut self,
        plan: &NodePlan,
        window: u64,
        events: &mpsc::UnboundedSender<Event>,
        output: &Feed,
    ) -> Result<usize, Lost> {
        let (Some(dial_plan), Some(listening)) = (&self.plan.dial, &self.listening) else {
            let reason = "rlaunch does not listen for proxies (its launcher failed)".to_string();
            return Err(Lost { host: plan.host.clone(), reason, came_up: false });
        };
        let name = dial_plan.launcher.first().cloned().unwrap_or_default();
        let launched = self.proxies.dial_late(dial_plan, &plan.host, &listening.back);
        let process =
            launched.as_ref().map(|_| None).map_err(|e| io::Error::new(e.kind(), io_error(e)));
        let (report, attempt) = (self.plan.report_bindings, self.policy.attempt());
        let index = self.children.start_late(&self.plan.job, plan, window, process, |child| {
            let (output, events) = (output.clone(), events.clone());
            move |event| route(child, attempt, event, output.clone(), events.clone(), report)
        })?;
        let pid = launched.expect("started, or the child is lost");
        self.launchers.push(Launcher { pid, name, ended: None, late: Some(index) });
        self.dial_tree.top(&plan.host);
        let deadline = Instant::now() + link::HELLO_WAIT;
        self.dial_deadline = Some(self.dial_deadline.map_or(deadline, |d| d.max(deadline)));
        Ok(index)
    }

    /// The proxy of `node` listens at `address`: the proxies waiting for it go there.
    pub(super) fn listening(&mut self, node: NodeId, address: String) {
        tracing::debug!(%node, %address, "a proxy listens for its children");
        for (proxy, address) in self.dial_tree.listening(node, address) {
            redirect(proxy, address);
        }
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

#[cfg(test)]
mod tests {
    use super::*;

    /// A node plan of `host` (node `index`) with `children`, and no ranks.
    fn node(index: u32, host: &str, children: Vec<NodePlan>) -> NodePlan {
        let (index, host) = (NodeId(index), host.to_string());
        NodePlan { index, host, fork: false, ranks: vec![], children }
    }

    #[test]
    fn proxies_below_the_top_go_to_their_parent_once_it_listens() {
        // n0 and n5 are rlaunch's; n1 and n2 are n0's children, n3 is n1's, n6 is n5's.
        let n1 = node(1, "n1", vec![node(3, "n3", vec![])]);
        let roots = [
            node(0, "n0", vec![n1, node(2, "n2", vec![])]),
            node(5, "n5", vec![node(6, "n6", vec![])]),
        ];
        let mut tree: DialTree<&str> = DialTree::new(&roots);
        assert_eq!(tree.arrived("n0", "p0"), Arrival::Child("p0"));
        assert_eq!(tree.arrived("n5", "p5"), Arrival::Child("p5"));
        // Before their parents listen: kept.
        assert_eq!(tree.arrived("n3", "p3"), Arrival::Waits);
        assert_eq!(tree.arrived("n1", "p1"), Arrival::Waits);
        // n0 listens: n1, which waited, goes there; n3 waits for n1.
        assert_eq!(tree.listening(NodeId(0), "a0".into()), [("p1", "a0".to_string())]);
        assert_eq!(tree.listening(NodeId(1), "a1".into()), [("p3", "a1".to_string())]);
        // A proxy whose parent listens already goes there at once.
        assert_eq!(tree.arrived("n2", "p2"), Arrival::Redirect("p2", "a0".into()));
        // The job ends: those still waiting are dropped, and n5's listening sends nobody.
        assert_eq!(tree.arrived("n6", "p6"), Arrival::Waits);
        tree.drop_waiting();
        assert!(tree.listening(NodeId(5), "a5".into()).is_empty());
        // A proxy started on n3 during the run is rlaunch's own.
        tree.top("n3");
        assert_eq!(tree.arrived("n3", "p3"), Arrival::Child("p3"));
    }
}
