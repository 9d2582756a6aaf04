//! The proxy's dispatcher: the one owner of this node's state (its ranks, its child proxies,
//! the kill escalation). Other tasks own a process's pipes or a connection and talk to it by
//! messages.
//!
//! ```text
//!  upstream reader ──Down──►┐
//!  child link readers ─────►│ Event ──► Node ──control──► upstream pump ──► parent
//!  output relays ──────────►┘                             ▲
//!  SIGCHLD, SIGTERM/HUP/INT ──► Node         output relays ┘ (bounded data channel)
//! ```

use std::collections::{HashMap, HashSet};
use std::ffi::OsString;
use std::sync::Arc;
use std::time::Duration;

use nix::sys::signal::Signal;
use pmi_wire::control::{Down, Job, Launch, NodePlan, Up};
use pmi_wire::ids::{ExitOutcome, Stream};
use pmi_wire::io::FrameReader;
use tokio::signal::unix::{signal, SignalKind};
use tokio::sync::mpsc;
use tokio::time::Instant;

use crate::fdio::FdStream;
use crate::link::{self, ChildState, LinkEvent};
use crate::pmi::{self, PmiAnswer, PmiCall, PmiJob, PmiPeer};
use crate::procs;
use crate::rank::{self, Placement, PmiSetup, StdinChunk};

/// Frames of rank output buffered towards the parent before ranks feel backpressure.
const DATA_QUEUE: usize = 32;
/// After the kill grace, how long child proxies get to finish before they are killed too.
const CHILD_PROXY_GRACE: Duration = Duration::from_secs(3);

/// What the dispatcher hears about.
pub(crate) enum Event {
    Down(Down),
    UpstreamClosed(String),
    OutputClosed { local: usize },
    Child { child: usize, event: LinkEvent },
}

struct LocalRank {
    rank: u32,
    pid: Option<i32>,
    running: bool,
    open_streams: u8,
    stdin: Option<mpsc::UnboundedSender<StdinChunk>>,
    /// Answers to its PMI connection's task.
    pmi: Option<mpsc::UnboundedSender<PmiAnswer>>,
    /// Its PMI connection closed before finalize.
    pmi_unclean: bool,
}

/// This node's share of the job's key-value space and fences.
#[derive(Default)]
struct Kvs {
    /// Pairs made visible by completed fences: later gets are answered from here.
    visible: HashMap<String, String>,
    /// Pairs put since the last fence, by local ranks and (once they fenced) the subtree.
    pending: Vec<(String, String)>,
    /// Local ranks inside the current fence, with the thrid their answer echoes.
    waiting: Vec<(usize, Option<String>)>,
    /// Child proxies whose subtree has entered the current fence.
    children_in: usize,
    /// FenceIn for the current epoch has gone up.
    sent: bool,
    epoch: u64,
    /// PMI-2 node attributes, and the ranks waiting for one to appear.
    node_attrs: HashMap<String, String>,
    attr_waiters: Vec<(usize, String, Option<String>)>,
}

struct ChildProxy {
    state: ChildState,
    /// The subtree's ranks, for routing stdin.
    ranks: HashSet<u32>,
    down: mpsc::UnboundedSender<Down>,
}

enum Kill {
    /// Nothing pending.
    Idle,
    /// SIGTERM sent; SIGKILL at the deadline.
    Grace,
    /// SIGKILL sent; child proxies that are still there at the deadline get SIGKILL too.
    ChildProxies,
    Done,
}

pub(crate) struct Node {
    job: Arc<Job>,
    plan: NodePlan,
    ranks: Vec<LocalRank>,
    rank_by_pid: HashMap<i32, usize>,
    children: Vec<ChildProxy>,
    child_by_pid: HashMap<i32, usize>,
    control: mpsc::UnboundedSender<Up>,
    data: mpsc::Sender<Up>,
    events: mpsc::UnboundedSender<Event>,
    kill: Kill,
    deadline: Option<Instant>,
    /// The parent is gone: finish cleaning up, then exit quietly.
    orphaned: bool,
    swept: bool,
    kvs: Kvs,
    pmi_job: Arc<PmiJob>,
    pmi_calls: mpsc::UnboundedSender<(PmiPeer, PmiCall)>,
}

/// Runs a proxy on its stdin/stdout channel until its subtree is finished. Returns the exit
/// code of the proxy process.
pub async fn serve(up_in: FdStream, up_out: FdStream) -> i32 {
    procs::become_subreaper();
    let host = hostname::get().map(|h| h.to_string_lossy().into_owned()).unwrap_or_default();
    let (control_tx, control_rx) = mpsc::unbounded_channel();
    let (data_tx, data_rx) = mpsc::channel(DATA_QUEUE);
    let _ = control_tx.send(Up::Greeting { host: host.clone(), pid: std::process::id() });
    let pump = tokio::spawn(link::pump(up_out, true, control_rx, Some(data_rx)));

    let mut reader = FrameReader::new(up_in);
    let launch = match receive_launch(&mut reader).await {
        Ok(launch) => launch,
        Err(msg) => {
            eprintln!("rlaunch-proxy on {host}: {msg}");
            return 1;
        }
    };
    let (events_tx, events_rx) = mpsc::unbounded_channel();
    let upstream_events = events_tx.clone();
    tokio::spawn(async move {
        loop {
            match reader.next::<Down>().await {
                Ok(Some(down)) => {
                    if upstream_events.send(Event::Down(down)).is_err() {
                        return;
                    }
                }
                Ok(None) => {
                    let _ = upstream_events
                        .send(Event::UpstreamClosed("its parent closed the connection".into()));
                    return;
                }
                Err(e) => {
                    let _ = upstream_events.send(Event::UpstreamClosed(e.to_string()));
                    return;
                }
            }
        }
    });

    let (pmi_tx, pmi_rx) = mpsc::unbounded_channel();
    let pmi_job = Arc::new(PmiJob {
        kvsname: launch.job.jobid.clone(),
        size: launch.job.size,
        process_mapping: launch.job.process_mapping.clone(),
    });
    let mut node = Node {
        kvs: Kvs::default(),
        pmi_job,
        pmi_calls: pmi_tx,
        job: Arc::new(launch.job),
        plan: launch.node,
        ranks: Vec::new(),
        rank_by_pid: HashMap::new(),
        children: Vec::new(),
        child_by_pid: HashMap::new(),
        control: control_tx,
        data: data_tx,
        events: events_tx,
        kill: Kill::Idle,
        deadline: None,
        orphaned: false,
        swept: false,
    };
    let code = node.run(events_rx, pmi_rx).await;
    drop(node);
    let _ = tokio::time::timeout(Duration::from_secs(5), pump).await;
    code
}

async fn receive_launch(reader: &mut FrameReader<FdStream>) -> Result<Launch, String> {
    let (found, _) = reader.read_hello().await.map_err(|e| e.to_string())?;
    if found.version != pmi_wire::control::PROTOCOL_VERSION {
        return Err(format!(
            "the launcher speaks protocol version {}, this proxy speaks version {}",
            found.version,
            pmi_wire::control::PROTOCOL_VERSION
        ));
    }
    match reader.next::<Down>().await {
        Ok(Some(Down::Launch(launch))) => Ok(*launch),
        Ok(Some(_)) => Err("the first frame from the launcher was not a launch".into()),
        Ok(None) => Err("the launcher closed the connection before the launch".into()),
        Err(e) => Err(e.to_string()),
    }
}

impl Node {
    async fn run(
        &mut self,
        mut events: mpsc::UnboundedReceiver<Event>,
        mut pmi: mpsc::UnboundedReceiver<(PmiPeer, PmiCall)>,
    ) -> i32 {
        let mut sigchld = signal(SignalKind::child()).expect("SIGCHLD handler");
        let mut sigterm = signal(SignalKind::terminate()).expect("SIGTERM handler");
        let mut sighup = signal(SignalKind::hangup()).expect("SIGHUP handler");
        let mut sigint = signal(SignalKind::interrupt()).expect("SIGINT handler");
        self.start_children();
        let listener = if self.job.pmi_port { pmi::listen() } else { None };
        let port = listener.as_ref().and_then(|l| l.local_addr().ok()).map(|a| a.to_string());
        let unbound = self.start_ranks(port);
        if let Some(listener) = listener {
            let (job, calls) = (self.pmi_job.clone(), self.pmi_calls.clone());
            tokio::spawn(pmi::accept(listener, unbound, job, calls));
        }
        self.reap();
        loop {
            if self.finished() {
                break;
            }
            let deadline = self.deadline;
            tokio::select! {
                ev = events.recv() => match ev {
                    Some(ev) => self.handle(ev),
                    None => break,
                },
                Some((peer, call)) = pmi.recv() => self.pmi_call(peer, call),
                _ = sigchld.recv() => self.reap(),
                _ = sigterm.recv() => self.lose_upstream("the proxy received SIGTERM"),
                _ = sighup.recv() => self.lose_upstream("the proxy received SIGHUP"),
                _ = sigint.recv() => self.lose_upstream("the proxy received SIGINT"),
                _ = tokio::time::sleep_until(deadline.unwrap_or_else(Instant::now)), if deadline.is_some() => {
                    self.escalate();
                }
            }
        }
        if !self.orphaned {
            let _ = self.data.send(Up::NodeDone { node: self.plan.index }).await;
        }
        0
    }

    fn start_children(&mut self) {
        let exe =
            std::env::current_exe().map(OsString::from).unwrap_or_else(|_| "rlaunch-proxy".into());
        let plans = std::mem::take(&mut self.plan.children);
        for plan in &plans {
            let ranks = plan.walk().iter().flat_map(|n| n.ranks.iter().map(|r| r.rank)).collect();
            let (down_tx, down_rx) = mpsc::unbounded_channel();
            let idx = self.children.len();
            let state = match link::spawn_proxy(&self.job.bootstrap, &plan.host, &exe) {
                Ok(process) => {
                    self.child_by_pid.insert(process.pid, idx);
                    let launch = Launch { job: (*self.job).clone(), node: plan.clone() };
                    let _ = down_tx.send(Down::Launch(Box::new(launch)));
                    let state = ChildState::new(plan.host.clone(), process.pid);
                    let data = self.data.clone();
                    let events = self.events.clone();
                    tokio::spawn(link::run_link(process, down_rx, move |event| {
                        relay_child(idx, event, data.clone(), events.clone())
                    }));
                    state
                }
                Err(e) => {
                    let _ = self.control.send(Up::ProxyLost {
                        host: plan.host.clone(),
                        reason: format!("cannot start its launcher: {e}"),
                    });
                    ChildState::failed(plan.host.clone())
                }
            };
            let child = ChildProxy { state, ranks, down: down_tx };
            self.children.push(child);
        }
        self.plan.children = plans;
    }

    /// Starts the node's ranks. In `-pmi-port` mode, returns each rank's PMI answer channel
    /// for the connection that will claim it.
    fn start_ranks(
        &mut self,
        pmi_port: Option<String>,
    ) -> HashMap<u32, (PmiPeer, mpsc::UnboundedReceiver<PmiAnswer>)> {
        let count = self.plan.ranks.len();
        let mut unbound = HashMap::new();
        let setup = match pmi_port {
            Some(addr) => PmiSetup::Port(addr),
            None => PmiSetup::Fd,
        };
        for (local_id, rp) in self.plan.ranks.iter().enumerate() {
            let segment = &self.job.segments[rp.segment as usize];
            let at =
                Placement { rank: rp.rank, local_id, local_count: count, host: &self.plan.host };
            let gets_stdin = self.job.stdin.includes(rp.rank);
            let mut slot = LocalRank {
                rank: rp.rank,
                pid: None,
                running: false,
                open_streams: 0,
                stdin: None,
                pmi: None,
                pmi_unclean: false,
            };
            match rank::spawn(&self.job, segment, &at, gets_stdin, &setup) {
                Ok(started) => {
                    let peer = PmiPeer { local: local_id, rank: rp.rank, appnum: rp.segment };
                    let (answers_tx, answers_rx) = mpsc::unbounded_channel();
                    slot.pmi = Some(answers_tx);
                    match started.pmi {
                        Some(conn) => {
                            let (job, calls) = (self.pmi_job.clone(), self.pmi_calls.clone());
                            tokio::spawn(pmi::serve_rank(
                                conn,
                                Vec::new(),
                                peer,
                                job,
                                calls,
                                answers_rx,
                            ));
                        }
                        None => {
                            unbound.insert(rp.rank, (peer, answers_rx));
                        }
                    }
                    slot.pid = Some(started.pid);
                    slot.running = true;
                    slot.open_streams = 2;
                    self.rank_by_pid.insert(started.pid, local_id);
                    for (stream, fd) in
                        [(Stream::Stdout, started.stdout), (Stream::Stderr, started.stderr)]
                    {
                        let data = self.data.clone();
                        let events = self.events.clone();
                        let r = rp.rank;
                        tokio::spawn(async move {
                            rank::relay_output(r, stream, fd, data).await;
                            let _ = events.send(Event::OutputClosed { local: local_id });
                        });
                    }
                    if gets_stdin {
                        let (tx, rx) = mpsc::unbounded_channel();
                        slot.stdin = Some(tx);
                        tokio::spawn(rank::feed_stdin(started.stdin, rx, self.control.clone()));
                    }
                }
                Err(errno) => {
                    let _ = self.control.send(Up::RankExited {
                        rank: rp.rank,
                        pid: 0,
                        outcome: ExitOutcome::SpawnFailed { errno },
                    });
                }
            }
            self.ranks.push(slot);
        }
        let _ = self.control.send(Up::Started { node: self.plan.index });
        tracing::debug!(node = self.plan.index, ranks = count, "ranks started");
        unbound
    }

    fn handle(&mut self, ev: Event) {
        match ev {
            Event::Down(down) => self.handle_down(down),
            Event::UpstreamClosed(why) => self.lose_upstream(&why),
            Event::OutputClosed { local } => {
                let slot = &mut self.ranks[local];
                slot.open_streams = slot.open_streams.saturating_sub(1);
            }
            Event::Child { child, event } => match event {
                LinkEvent::Greeted(g) => tracing::debug!(host = %g.host, "child proxy up"),
                LinkEvent::Up(Up::NodeDone { .. }) => self.children[child].state.done = true,
                LinkEvent::Up(Up::FenceIn { pairs, .. }) => {
                    self.kvs.pending.extend(pairs);
                    self.kvs.children_in += 1;
                    self.try_fence_in();
                }
                LinkEvent::Up(_) => {}
                LinkEvent::Stderr(text) => self.children[child].state.add_stderr(&text),
                LinkEvent::Closed(error) => {
                    if let Some(reason) = self.children[child].state.on_link_closed(error) {
                        self.report_lost(child, reason);
                    }
                }
            },
        }
    }

    fn handle_down(&mut self, down: Down) {
        match down {
            Down::Launch(_) => tracing::warn!("ignoring a second launch"),
            Down::Stdin { seq, data } => {
                let chunk: Arc<[u8]> = Arc::from(data.as_slice());
                for c in &self.children {
                    if c.ranks.iter().any(|&r| self.job.stdin.includes(r)) {
                        let _ = c.down.send(Down::Stdin { seq, data: data.clone() });
                    }
                }
                for slot in &self.ranks {
                    if !self.job.stdin.includes(slot.rank) {
                        continue;
                    }
                    let queued = slot.stdin.as_ref().is_some_and(|tx| {
                        tx.send(StdinChunk::Data { seq, data: chunk.clone() }).is_ok()
                    });
                    if !queued {
                        let _ = self.control.send(Up::StdinAck { seq });
                    }
                }
            }
            Down::StdinEof => {
                for c in &self.children {
                    let _ = c.down.send(Down::StdinEof);
                }
                for slot in &mut self.ranks {
                    if let Some(tx) = slot.stdin.take() {
                        let _ = tx.send(StdinChunk::Eof);
                    }
                }
            }
            Down::Signal { signo } => {
                for c in &self.children {
                    let _ = c.down.send(Down::Signal { signo });
                }
                if let Ok(sig) = Signal::try_from(signo) {
                    self.signal_ranks(sig);
                }
            }
            Down::Terminate { grace_ms } => self.terminate(Duration::from_millis(grace_ms)),
            Down::FenceOut { epoch, pairs } => self.fence_out(epoch, pairs),
            Down::NameReply { rank, tag, answer } => {
                if let Some(slot) = self.ranks.iter().find(|r| r.rank == rank) {
                    if let Some(tx) = &slot.pmi {
                        let _ = tx.send(PmiAnswer::Name { answer, tag });
                    }
                } else if let Some(c) = self.children.iter().find(|c| c.ranks.contains(&rank)) {
                    let _ = c.down.send(Down::NameReply { rank, tag, answer });
                }
            }
        }
    }

    /// A request from a rank's PMI connection.
    fn pmi_call(&mut self, peer: PmiPeer, call: PmiCall) {
        let slot = &mut self.ranks[peer.local];
        let pid = slot.pid.unwrap_or(0) as u32;
        let answer = |slot: &LocalRank, a: PmiAnswer| {
            if let Some(tx) = &slot.pmi {
                let _ = tx.send(a);
            }
        };
        match call {
            PmiCall::Put { key, value } => self.kvs.pending.push((key, value)),
            PmiCall::Get { key, tag } => {
                let value = self.kvs.visible.get(&key).cloned();
                answer(slot, PmiAnswer::Get { key, value, tag });
            }
            PmiCall::Fence { tag } => {
                self.kvs.waiting.push((peer.local, tag));
                self.try_fence_in();
            }
            PmiCall::PutNodeAttr { key, value } => {
                let waiters = std::mem::take(&mut self.kvs.attr_waiters);
                for (local, k, tag) in waiters {
                    if k == key {
                        answer(
                            &self.ranks[local],
                            PmiAnswer::GetNodeAttr { value: Some(value.clone()), tag },
                        );
                    } else {
                        self.kvs.attr_waiters.push((local, k, tag));
                    }
                }
                self.kvs.node_attrs.insert(key, value);
            }
            PmiCall::GetNodeAttr { key, wait, tag } => match self.kvs.node_attrs.get(&key) {
                Some(v) => answer(slot, PmiAnswer::GetNodeAttr { value: Some(v.clone()), tag }),
                None if wait => self.kvs.attr_waiters.push((peer.local, key, tag)),
                None => answer(slot, PmiAnswer::GetNodeAttr { value: None, tag }),
            },
            PmiCall::Name { op, tag } => {
                let _ = self.control.send(Up::Name { rank: peer.rank, tag, op });
            }
            PmiCall::Abort { code, msg } => {
                let _ = self.control.send(Up::Abort { rank: peer.rank, pid, code, msg });
            }
            PmiCall::Finalized => {}
            PmiCall::Fault(what) => {
                let _ = self.control.send(Up::PmiFault { rank: peer.rank, pid, what });
            }
            PmiCall::Closed { clean } => {
                slot.pmi = None;
                slot.pmi_unclean = !clean;
            }
        }
    }

    /// Sends this subtree's FenceIn once every local rank and every child subtree is in.
    fn try_fence_in(&mut self) {
        let live_children = self.children.iter().filter(|c| !c.state.lost).count();
        let kvs = &mut self.kvs;
        if kvs.sent || kvs.waiting.len() < self.ranks.len() || kvs.children_in < live_children {
            return;
        }
        kvs.sent = true;
        kvs.children_in = 0;
        let pairs = std::mem::take(&mut kvs.pending);
        let _ = self.control.send(Up::FenceIn { epoch: kvs.epoch, pairs });
    }

    fn fence_out(&mut self, epoch: u64, pairs: Vec<(String, String)>) {
        if epoch != self.kvs.epoch {
            tracing::warn!(epoch, expected = self.kvs.epoch, "fence completion for another epoch");
        }
        for c in self.children.iter().filter(|c| !c.state.lost) {
            let _ = c.down.send(Down::FenceOut { epoch, pairs: pairs.clone() });
        }
        for (k, v) in pairs {
            // MPICH never puts a key twice; if a program does, the first value stays (Hydra).
            self.kvs.visible.entry(k).or_insert(v);
        }
        self.kvs.sent = false;
        self.kvs.epoch += 1;
        for (local, tag) in std::mem::take(&mut self.kvs.waiting) {
            if let Some(tx) = &self.ranks[local].pmi {
                let _ = tx.send(PmiAnswer::Fence { tag });
            }
        }
    }

    fn signal_ranks(&self, sig: Signal) {
        for slot in self.ranks.iter().filter(|s| s.running) {
            if let Some(pid) = slot.pid {
                procs::signal_group(pid, sig);
            }
        }
    }

    /// SIGTERM now, SIGKILL after the grace period; child proxies do the same below.
    fn terminate(&mut self, grace: Duration) {
        if !matches!(self.kill, Kill::Idle) {
            return;
        }
        tracing::debug!(?grace, "terminating ranks");
        for c in &self.children {
            let _ = c.down.send(Down::Terminate { grace_ms: grace.as_millis() as u64 });
        }
        self.signal_ranks(Signal::SIGTERM);
        self.signal_ranks(Signal::SIGCONT);
        self.kill = Kill::Grace;
        self.deadline = Some(Instant::now() + grace);
    }

    fn escalate(&mut self) {
        match self.kill {
            Kill::Grace => {
                self.signal_ranks(Signal::SIGKILL);
                procs::kill_descendants(&self.child_pids());
                self.kill = Kill::ChildProxies;
                self.deadline = Some(Instant::now() + CHILD_PROXY_GRACE);
            }
            Kill::ChildProxies => {
                for c in self.children.iter().filter(|c| !c.state.reaped()) {
                    tracing::warn!(host = %c.state.host, "child proxy did not finish; killing it");
                    procs::signal_pid(c.state.pid, Signal::SIGKILL);
                }
                self.kill = Kill::Done;
                self.deadline = None;
            }
            Kill::Idle | Kill::Done => self.deadline = None,
        }
    }

    fn lose_upstream(&mut self, why: &str) {
        if self.orphaned {
            return;
        }
        tracing::debug!("lost upstream: {why}");
        self.orphaned = true;
        let grace = Duration::from_millis(self.job.kill_grace_ms);
        self.terminate(grace);
    }

    fn child_pids(&self) -> HashSet<i32> {
        self.children.iter().filter(|c| !c.state.reaped()).map(|c| c.state.pid).collect()
    }

    fn reap(&mut self) {
        for (pid, outcome) in procs::reap_ended() {
            if let Some(&local) = self.rank_by_pid.get(&pid) {
                let slot = &mut self.ranks[local];
                slot.running = false;
                if let Some(tx) = slot.stdin.take() {
                    let _ = tx.send(StdinChunk::Eof);
                }
                let _ =
                    self.control.send(Up::RankExited { rank: slot.rank, pid: pid as u32, outcome });
            } else if let Some(&child) = self.child_by_pid.get(&pid) {
                if let Some(reason) = self.children[child].state.on_exit(outcome) {
                    self.report_lost(child, reason);
                }
            }
        }
        if !self.swept && self.ranks.iter().all(|r| !r.running) {
            // Whatever the ranks left behind (a daemonized grandchild holding a pipe open)
            // goes now, so that their output reaches end of file.
            self.swept = true;
            procs::kill_descendants(&self.child_pids());
        }
    }

    fn report_lost(&mut self, child: usize, reason: String) {
        let host = self.children[child].state.host.clone();
        let _ = self.control.send(Up::ProxyLost { host, reason });
    }

    fn finished(&self) -> bool {
        self.ranks.iter().all(|r| !r.running && r.open_streams == 0)
            && self.children.iter().all(|c| c.state.settled())
    }
}

/// Routes what a child proxy's link reports: its frames go up unchanged (through the bounded
/// data channel, so backpressure reaches the child), except NodeDone, which is ours to
/// aggregate; everything else about the link goes to the dispatcher.
async fn relay_child(
    child: usize,
    event: LinkEvent,
    data: mpsc::Sender<Up>,
    events: mpsc::UnboundedSender<Event>,
) -> bool {
    match event {
        LinkEvent::Up(up) if !matches!(up, Up::NodeDone { .. } | Up::FenceIn { .. }) => {
            data.send(up).await.is_ok()
        }
        event => events.send(Event::Child { child, event }).is_ok(),
    }
}
