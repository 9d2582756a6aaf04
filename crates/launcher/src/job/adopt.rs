//! Orphans: while the job goes on after failures (`--on-failure continue`) and the tree has
//! interior proxies, rlaunch listens for proxies whose parent was lost. Such a proxy dials
//! rlaunch instead of taking its subtree down (`Job::adoption`, the proxy's
//! `node/adoption.rs`), and the Root adopts it as a top proxy: its subtree's ranks run on.
//!
//! ```text
//!  node X lost ──NodeGone──► X's own ranks fail; every node below X is due ──┐
//!  an orphan dials in (proves the secret, greets) ──adopt──► a top child;    │ not due any more
//!  a due node not adopted within the silence (and the handshake) ──► its ranks fail
//! ```
//!
//! While a node is due, no fence of the launched job completes: a node below the lost one
//! may hold data of it that has not come up yet. An adopted orphan sends again its fence
//! entry not answered yet: one whose fence is complete already (its answer died with the
//! lost parent) is answered from the last result kept here; one of the fence under way is
//! an arrival, the orphan being a party from its adoption on. It sends its ranks' ends
//! again too (each node below it sends its own: `Down::Resend`); the Roll keeps the first.

use std::collections::{BTreeMap, HashSet};
use std::net::{IpAddr, Ipv4Addr};
use std::time::Duration;

use rlaunch_protocol::control::{
    Adoption, Bootstrap, DmodexAsk, Down, Liveness, NodePlan, Rendezvous, ADOPTION_DIAL,
};
use rlaunch_protocol::ids::NodeId;
use rlaunch_tree::credit;
use rlaunch_tree::dialin::{self, Dialed};
use rlaunch_tree::secure::Secret;
use tokio::sync::mpsc;
use tokio::time::Instant;

use super::cause::Cause;
use super::{dial, route, Event, Root};
use crate::output::Feed;

/// rlaunch's side of adoption, while it listens for orphans.
pub(super) struct Adopting {
    acceptor: tokio::task::JoinHandle<()>,
    /// How long an orphan may take to call once rlaunch hears of the loss (see
    /// [`orphan_wait`]).
    wait: Duration,
    /// Nodes adopted so far (each a top proxy now, with its subtree).
    adopted: HashSet<NodeId>,
    /// Nodes below a lost one, not adopted yet, and until when they may call.
    due: BTreeMap<NodeId, Instant>,
    /// The launched job's last complete PMI fence and PMIx fence, for an orphan whose
    /// answer died with its lost parent.
    pub(super) last_pmi: Option<(u64, Vec<(String, String)>)>,
    pub(super) last_pmix: Option<(u64, Vec<Vec<u8>>)>,
    /// The rendezvous rank 0's proxy chose, which every node was sent (an orphan's lost
    /// parent may not have passed it on).
    pub(super) rendezvous: Option<Rendezvous>,
    /// Direct modex requests for ranks of due nodes, held until the node is adopted (asked
    /// again there) or given up (answered `Missing`).
    parked: Vec<DmodexAsk>,
}

impl Adopting {
    pub(super) fn stop(&self) {
        self.acceptor.abort();
    }
}

/// Listens for orphans if the job goes on and some proxy has children of its own: their
/// address and the job's secret go in every launch (`Job::adoption`). Where it cannot, a
/// lost interior proxy's subtree goes with it, as it would without. Before any proxy starts
/// (rlaunch forks its machine's proxies with their launch, before its runtime runs).
pub(super) fn prepare(plan: &mut super::Plan) {
    let interior = plan.roots.iter().any(|r| !r.children.is_empty());
    if !plan.job.goes_on || !interior || plan.orphan_listener.is_some() {
        return;
    }
    let listening = orphans_ip(plan).and_then(|ip| {
        let secret = Secret::generate()?;
        let listener = std::net::TcpListener::bind((ip, 0))?;
        listener.set_nonblocking(true)?;
        Ok((listener, secret))
    });
    match listening {
        Ok((listener, secret)) => {
            let address = listener.local_addr().map(|a| a.to_string()).unwrap_or_default();
            tracing::debug!(%address, "listening for orphaned proxies");
            plan.job.adoption = Some(Adoption { address, secret: secret.bytes() });
            plan.orphan_listener = Some((listener, secret));
        }
        Err(e) => {
            let why = crate::quote::io_error(&e);
            tracing::warn!("cannot listen for orphaned proxies: {why}");
        }
    }
}

/// How long rlaunch waits for the nodes below a lost one to call. Each hears of the loss
/// when rlaunch does, give or take: the lost proxy's link closing, or its silence, which
/// they measure from its heartbeats as its parent does (two heartbeats of skew); then an
/// orphan tries for [`ADOPTION_DIAL`]; and 2 s for a handshake on a busy machine. A node
/// that was never started (its parent was lost first) is given up after this.
fn orphan_wait(liveness: Liveness) -> Duration {
    liveness.heartbeat() * 2 + ADOPTION_DIAL + Duration::from_secs(2)
}

/// Where the proxies reach rlaunch: the dialing launch's address, else the local end of
/// the route to the first node not started by fork, else loopback.
fn orphans_ip(plan: &super::Plan) -> std::io::Result<IpAddr> {
    if let Some(dial) = &plan.dial {
        return Ok(dial.bind);
    }
    let remote: Vec<String> = (plan.roots.iter().flat_map(|r| r.walk()))
        .filter(|n| !n.fork)
        .map(|n| n.host.clone())
        .collect();
    let Some(first) = remote.first() else { return Ok(IpAddr::V4(Ipv4Addr::LOCALHOST)) };
    // A name only ssh knows (`HostName` in its configuration): where ssh goes.
    let by_ssh = || match &plan.job.bootstrap {
        Bootstrap::Remote { argv, .. } => ssh_hostname(argv, first),
        _ => None,
    };
    let reached =
        dial::reaching(&remote).or_else(|e| by_ssh().ok_or(e).and_then(|to| dial::reaching(&[to])));
    reached.map_err(|(host, e)| std::io::Error::new(e.kind(), format!("no route to {host}: {e}")))
}

/// Where `argv` (the remote shell's command) goes for `host`, when it is ssh: the
/// `hostname` of `ssh -G`, which reads ssh's configuration and connects nowhere.
fn ssh_hostname(argv: &[String], host: &str) -> Option<String> {
    let (program, args) = argv.split_first()?;
    if std::path::Path::new(program).file_name()? != "ssh" {
        return None;
    }
    let shown = std::process::Command::new(program)
        .args(args)
        .args(["-G", host])
        .stdin(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .output()
        .ok()?;
    let text = String::from_utf8_lossy(&shown.stdout);
    let name = text.lines().find_map(|l| l.strip_prefix("hostname "))?.trim().to_string();
    (shown.status.success() && name != host).then_some(name)
}

/// The node of the tree under `roots` on `host` (a host has one proxy).
pub(super) fn plan_node<'a>(roots: &'a [NodePlan], host: &str) -> Option<&'a NodePlan> {
    roots.iter().flat_map(|r| r.walk()).find(|n| n.host == host)
}

impl Root {
    /// Accepts the orphans at the listener [`prepare`] bound (binding it now if the plan's
    /// proxies were not forked first, as in a test's world).
    pub(super) fn listen_for_orphans(&mut self) {
        prepare(&mut self.plan);
        let Some((listener, secret)) = self.plan.orphan_listener.take() else { return };
        let Some(orphans) = self.orphans.clone() else { return };
        let listener = match tokio::net::TcpListener::from_std(listener) {
            Ok(listener) => listener,
            Err(e) => {
                self.plan.job.adoption = None;
                let why = crate::quote::io_error(&e);
                return tracing::warn!("cannot listen for orphaned proxies: {why}");
            }
        };
        let acceptor = tokio::spawn(dialin::accept(listener, secret, orphans));
        let wait = orphan_wait(self.plan.job.liveness);
        self.adopting = Some(Adopting {
            acceptor,
            wait,
            adopted: HashSet::new(),
            due: BTreeMap::new(),
            last_pmi: None,
            last_pmix: None,
            parked: Vec::new(),
            rendezvous: None,
        });
    }

    /// A proxy whose parent was lost dialed in: adopted as a top proxy, unless its own node
    /// was lost too (its ranks failed, and every node was told so), or the job is ending;
    /// then its connection is closed, and it takes its subtree down.
    pub(super) fn adopt(
        &mut self,
        proxy: Dialed,
        events: &mpsc::UnboundedSender<Event>,
        output: &Feed,
    ) {
        let host = proxy.greeting.host.clone();
        let Some(adopting) = self.adopting.as_ref() else { return };
        let top = |n: &&NodePlan| self.plan.roots.iter().any(|r| r.index == n.index);
        let plan = plan_node(&self.plan.roots, &host).filter(|n| !top(n)).cloned();
        let refused = match &plan {
            None => Some("no node below the top has its name"),
            Some(_) if *self.ending.borrow() => Some("the job is ending"),
            Some(node) if adopting.adopted.contains(&node.index) => Some("adopted already"),
            Some(node) if node.ranks.iter().any(|r| self.roll.gone(r.rank)) => {
                Some("its node was lost, its ranks failed")
            }
            Some(_) => None,
        };
        if let Some(why) = refused {
            return tracing::warn!(%host, "refused an orphaned proxy: {why}");
        }
        let plan = plan.expect("refused otherwise");
        let behind: usize = plan.walk().iter().map(|n| n.ranks.len()).sum();
        let window = credit::window(credit::ROOT_BUDGET, behind, self.plan.rank_node.len());
        let (report, attempt) = (self.plan.report_bindings, self.policy.attempt());
        let job = &self.plan.job;
        let child =
            self.children.adopt(proxy.process, proxy.greeting, &plan, job, window, |child| {
                let (output, events) = (output.clone(), events.clone());
                move |event| route(child, attempt, event, output.clone(), events.clone(), report)
            });
        let adopting = self.adopting.as_mut().expect("seen above");
        adopting.adopted.insert(plan.index);
        tracing::debug!(%host, child, ranks = behind, "adopted an orphaned proxy");
        // Its subtree is due no more; the requests for its ranks' data that waited go to it.
        let subtree: HashSet<NodeId> = plan.walk().iter().map(|n| n.index).collect();
        for node in &subtree {
            adopting.due.remove(node);
        }
        let (parked, waiting): (Vec<DmodexAsk>, Vec<DmodexAsk>) =
            std::mem::take(&mut adopting.parked)
                .into_iter()
                .partition(|a| self.roll.node(a.rank).is_some_and(|n| subtree.contains(&n)));
        adopting.parked = waiting;
        for ask in parked {
            self.children.send_ask(ask);
        }
        // What every node has been told so far that this one may have missed: its ranks may
        // wait for the rendezvous or stdin's end, and survivors are told of the dead.
        let rendezvous = self.adopting.as_ref().and_then(|a| a.rendezvous.clone());
        if let Some(rendezvous) = rendezvous {
            self.children.send_to(child, Down::Rendezvous(rendezvous));
        }
        // Stdin in flight may have gone with the lost parent: sent again (a node drops a
        // chunk it had), before its end.
        for (seq, data) in self.stdin.adopted(&subtree) {
            self.children.send_to(child, Down::Stdin { seq, data });
        }
        if !self.stdin.open {
            self.children.send_to(child, Down::StdinEof);
        }
        if *self.drop_output.borrow() {
            self.children.send_to(child, Down::DropOutput);
        }
        if !self.dead.is_empty() {
            self.children.send_to(child, Down::Dead { ranks: self.dead.clone() });
        }
        self.pmi_fence_step();
        self.pmix_fence_step();
    }

    /// Node `host` was lost: the nodes below it that may call to be adopted are due.
    pub(super) fn orphans_due(&mut self, host: &str) {
        let lost = plan_node(&self.plan.roots, host);
        let Some(adopting) = self.adopting.as_mut() else { return };
        let mut below = Vec::new();
        let mut stack: Vec<&NodePlan> =
            lost.map(|n| n.children.iter().collect()).unwrap_or_default();
        while let Some(node) = stack.pop() {
            if adopting.adopted.contains(&node.index) {
                continue;
            }
            below.push(node.index);
            stack.extend(node.children.iter());
        }
        let until = Instant::now() + adopting.wait;
        for &node in &below {
            adopting.due.entry(node).or_insert(until);
        }
        tracing::debug!(%host, due = below.len(), "the nodes below a lost one may be adopted");
    }

    /// A direct modex request for a rank of a node that may yet be adopted: held (true).
    pub(super) fn park_ask(&mut self, ask: DmodexAsk) -> bool {
        let node = self.roll.node(ask.rank);
        let Some(adopting) = self.adopting.as_mut() else { return false };
        if !node.is_some_and(|n| adopting.due.contains_key(&n)) {
            return false;
        }
        tracing::debug!(rank = %ask.rank, "a direct modex request waits for its node's adoption");
        adopting.parked.push(ask);
        true
    }

    /// Whether nodes below a lost one may still call: the launched job's fences wait.
    pub(super) fn orphans_pending(&self) -> bool {
        self.adopting.as_ref().is_some_and(|a| !a.due.is_empty())
    }

    /// The earliest time a due node's call is late.
    pub(super) fn orphans_deadline(&self) -> Option<Instant> {
        self.adopting.as_ref().and_then(|a| a.due.values().min().copied())
    }

    /// Due nodes that did not call in time are lost proxies, their ranks failed.
    pub(super) fn orphans_late(&mut self) {
        let Some(adopting) = self.adopting.as_mut() else { return };
        let now = Instant::now();
        let late: Vec<NodeId> =
            adopting.due.iter().filter(|(_, &until)| until <= now).map(|(&n, _)| n).collect();
        adopting.due.retain(|n, _| !late.contains(n));
        let secs = adopting.wait.as_secs();
        let (missing, waiting): (Vec<DmodexAsk>, Vec<DmodexAsk>) =
            std::mem::take(&mut adopting.parked)
                .into_iter()
                .partition(|a| self.roll.node(a.rank).is_some_and(|n| late.contains(&n)));
        adopting.parked = waiting;
        for ask in missing {
            self.children.send_toward_node(ask.asker, Down::DmodexAnswer(ask.missing()));
        }
        for node in late {
            let host = self.roll.node_host(node).to_string();
            let reason = format!("a proxy above it was lost, and it did not call within {secs} s");
            self.fail(Cause::LostProxy { host, reason, came_up: true });
        }
        self.pmi_fence_step();
        self.pmix_fence_step();
    }

    /// A proxy below reports the loss of `host`'s proxy, which rlaunch adopted since: the
    /// link that broke was the old one, and the node lives on.
    pub(super) fn adopted_host(&self, host: &str) -> bool {
        let adopting = self.adopting.as_ref();
        let node = plan_node(&self.plan.roots, host);
        node.is_some_and(|n| adopting.is_some_and(|a| a.adopted.contains(&n.index)))
    }

    /// An adopted child sent again its entry of a fence complete already (`epoch`, before
    /// the one under way): it gets that fence's result.
    pub(super) fn answer_late_entry(&self, child: usize, pmix: bool, epoch: u64) {
        let Some(adopting) = self.adopting.as_ref() else { return };
        match (pmix, &adopting.last_pmi, &adopting.last_pmix) {
            (false, Some((last, pairs)), _) if *last == epoch => {
                let pairs = pairs.clone();
                self.children.send_to(child, Down::FenceOut { epoch, pairs });
            }
            (true, _, Some((last, parts))) if *last == epoch => {
                for down in super::pmix_fence_downs(epoch, parts.clone()) {
                    self.children.send_to(child, down);
                }
            }
            _ => tracing::warn!(child, epoch, pmix, "a fence entry from long ago"),
        }
    }
}
