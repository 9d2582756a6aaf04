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
use pmi_wire::control::{Down, Job, Launch, NodePlan, Segment, SpawnJob, Up, SILENCE};
use pmi_wire::ids::ExitOutcome;
use pmi_wire::io::FrameReader;
use tokio::signal::unix::{signal, SignalKind};
use tokio::sync::mpsc;
use tokio::time::Instant;

use crate::binding::{Binder, RankCpus};
use crate::fdio::FdStream;
use crate::link::{self, ChildState, LinkEvent};
use crate::outputs::Outputs;
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
    OutputClosed {
        local: usize,
    },
    /// A while ago, this rank closed its PMI connection without finalize.
    PmiClosedEarly {
        local: usize,
    },
    Child {
        child: usize,
        event: LinkEvent,
    },
}

struct LocalRank {
    /// Global id (the rank, for the launched job).
    rank: u32,
    job: u32,
    pid: Option<i32>,
    running: bool,
    open_streams: u8,
    stdin: Option<mpsc::UnboundedSender<StdinChunk>>,
    /// Answers to its PMI connection's task.
    pmi: Option<pmi::AnswerTx>,
    /// How it ended, once reaped.
    exit: Option<ExitOutcome>,
    /// Its PMI connection closed before finalize.
    pmi_unclean: bool,
    /// Its socketpair PMI connection is still being served: the node waits for its verdict.
    pmi_open: bool,
}

/// What [`Node::start_rank`] needs to start one rank.
struct StartRank<'a> {
    job: &'a Job,
    job_index: u32,
    /// The id of the rank in every frame: its rank for the launched job.
    gid: u32,
    segment: u32,
    at: Placement<'a>,
    /// Where `--bind-to` puts it; `None` leaves it on every CPU the proxy may use.
    cpus: Option<RankCpus>,
}

/// One job's state on this node: the launched job, and any job its ranks spawned here.
struct JobState {
    pmi: Arc<PmiJob>,
    kvs: Kvs,
    /// Its ranks on this node.
    local: usize,
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
    /// The subtree's node indices, for routing spawns.
    nodes: HashSet<u32>,
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
    /// An orphan that waited long enough: it exits with whatever is left killed.
    GaveUp,
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
    /// Carries every local rank's output upstream.
    outputs: Outputs,
    kill: Kill,
    deadline: Option<Instant>,
    /// The parent is gone: finish cleaning up, then exit quietly.
    orphaned: bool,
    /// When the parent was last heard from; silence past [`SILENCE`] means it is gone.
    last_heard: Instant,
    /// The job is stopped (SIGTSTP): so may be the launcher, whose silence then means nothing.
    stopped: bool,
    swept: bool,
    jobs: HashMap<u32, JobState>,
    pmi_calls: mpsc::UnboundedSender<(PmiPeer, PmiCall)>,
    binder: Binder,
    /// Each (job, segment)'s program, prepared once for all its ranks.
    programs: HashMap<(u32, u32), Result<Arc<rank::Program>, ExitOutcome>>,
    /// The `rlaunch-proxy` this proxy starts its child proxies with.
    proxy_exe: OsString,
}

/// Runs a proxy on its control channel until its subtree is finished; child proxies are
/// started as `proxy_exe`. Returns the exit code of the proxy process. `launch` is what a
/// proxy forked from rlaunch was given; any other reads it from its parent.
pub async fn serve(
    up_in: FdStream,
    up_out: FdStream,
    proxy_exe: OsString,
    launch: Option<Launch>,
) -> i32 {
    procs::become_subreaper();
    let host = hostname::get().map(|h| h.to_string_lossy().into_owned()).unwrap_or_default();
    let (control_tx, control_rx) = mpsc::unbounded_channel();
    let (data_tx, data_rx) = mpsc::channel(DATA_QUEUE);
    let _ = control_tx.send(Up::Greeting { host: host.clone(), pid: std::process::id() });
    link::heartbeat(&control_tx, || Up::Ping);
    let pump = tokio::spawn(link::pump(up_out, true, control_rx, Some(data_rx)));

    // Down the tree come control messages and stdin, not output: small reads will do.
    let mut reader = FrameReader::with_chunk(up_in, 16 << 10);
    let launch = match launch {
        Some(launch) => Ok(launch),
        None => receive_launch(&mut reader).await,
    };
    let launch = match launch {
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
        spawner: None,
    });
    let closed = events_tx.clone();
    let outputs = Outputs::start(data_tx.clone(), move |local| {
        let _ = closed.send(Event::OutputClosed { local });
    });
    let outputs = match outputs {
        Ok(outputs) => outputs,
        Err(e) => {
            eprintln!("rlaunch-proxy on {host}: cannot set up output relaying: {e}");
            return 1;
        }
    };
    let mut node = Node {
        jobs: HashMap::from([(0, JobState { pmi: pmi_job, kvs: Kvs::default(), local: 0 })]),
        pmi_calls: pmi_tx,
        binder: Binder::new(launch.node.host.clone()),
        programs: HashMap::new(),
        proxy_exe,
        job: Arc::new(launch.job),
        plan: launch.node,
        ranks: Vec::new(),
        rank_by_pid: HashMap::new(),
        children: Vec::new(),
        child_by_pid: HashMap::new(),
        control: control_tx,
        outputs,
        data: data_tx,
        events: events_tx,
        kill: Kill::Idle,
        deadline: None,
        orphaned: false,
        last_heard: Instant::now(),
        stopped: false,
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
            let (job, calls) = (self.jobs[&0].pmi.clone(), self.pmi_calls.clone());
            tokio::spawn(pmi::accept(listener, unbound, job, calls));
        }
        self.reap();
        loop {
            if self.finished() {
                break;
            }
            let deadline = self.deadline;
            let watch = !self.orphaned && !self.stopped;
            let silent_at = self.last_heard + SILENCE;
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
                _ = tokio::time::sleep_until(silent_at), if watch => {
                    self.lose_upstream("it heard nothing from its parent for 10 s");
                }
            }
        }
        // Nothing of this node outlives it, whatever was left waiting.
        procs::kill_descendants(&HashSet::new());
        if !self.orphaned {
            let _ = self.data.send(Up::NodeDone { node: self.plan.index }).await;
        }
        0
    }

    fn start_children(&mut self) {
        let exe = self.proxy_exe.clone();
        let plans = std::mem::take(&mut self.plan.children);
        for plan in &plans {
            let ranks = plan.walk().iter().flat_map(|n| n.ranks.iter().map(|r| r.rank)).collect();
            let nodes = plan.walk().iter().map(|n| n.index).collect();
            let idx = self.children.len();
            let (data, events) = (self.data.clone(), self.events.clone());
            let process = link::spawn_proxy(&self.job.bootstrap, &plan.host, plan.fork, &exe);
            let started = link::start_child(&self.job, plan, process, move |event| {
                relay_child(idx, event, data.clone(), events.clone())
            });
            match started.link {
                Ok(_) => {
                    self.child_by_pid.insert(started.state.pid, idx);
                }
                Err(reason) => {
                    let _ = self.control.send(Up::ProxyLost { host: plan.host.clone(), reason });
                }
            }
            let (state, down_tx) = (started.state, started.down);
            let child = ChildProxy { state, nodes, ranks, down: down_tx };
            self.children.push(child);
        }
        self.plan.children = plans;
    }

    /// Starts the node's ranks. In `-pmi-port` mode, returns each rank's PMI answer channel
    /// for the connection that will claim it.
    fn start_ranks(&mut self, pmi_port: Option<String>) -> HashMap<u32, (PmiPeer, pmi::AnswerRx)> {
        let setup = match pmi_port {
            Some(addr) => PmiSetup::Port(addr),
            None => PmiSetup::Fd,
        };
        let job = self.job.clone();
        let plans = self.plan.ranks.clone();
        let host = self.plan.host.clone();
        let ranks: Vec<_> = plans.iter().map(|rp| (rp.rank, rp.rank, rp.segment)).collect();
        let batch = self.batch(&job, 0, &host, &ranks);
        let unbound = self.start_batch(batch, &setup);
        let _ = self.control.send(Up::Started { node: self.plan.index });
        tracing::debug!(node = self.plan.index, ranks = plans.len(), "ranks started");
        unbound
    }

    /// What starting `ranks` of job `job_index` on this node takes; each is (rank in its job,
    /// id in frames, segment), placed and bound by its index among `ranks`.
    fn batch<'a>(
        &mut self,
        job: &'a Job,
        job_index: u32,
        host: &'a str,
        ranks: &[(u32, u32, u32)],
    ) -> Vec<StartRank<'a>> {
        let count = ranks.len();
        ranks
            .iter()
            .enumerate()
            .map(|(local_id, &(rank, gid, segment))| {
                let at = Placement { rank, local_id, local_count: count, host };
                let cpus = job.binding.and_then(|b| self.binder.cpus(b, local_id, count));
                StartRank { job, job_index, gid, segment, at, cpus }
            })
            .collect()
    }

    /// Starts ranks, all processes first (several at a time), then the tasks that carry each
    /// one's output, stdin and PMI. Returns, by rank, the PMI answer channels of those whose
    /// connection is still to come (`-pmi-port`).
    fn start_batch(
        &mut self,
        batch: Vec<StartRank>,
        setup: &PmiSetup,
    ) -> HashMap<u32, (PmiPeer, pmi::AnswerRx)> {
        let prepared = batch
            .iter()
            .map(|start| {
                let StartRank { job, job_index, segment, .. } = *start;
                let program = self
                    .programs
                    .entry((job_index, segment))
                    .or_insert_with(|| {
                        rank::program(job, &job.segments[segment as usize]).map(Arc::new)
                    })
                    .clone()?;
                let gets_stdin = job_index == 0 && job.stdin.includes(start.gid);
                let mask = start.cpus.as_ref().map(|c| &c.mask);
                rank::prepare(program, job.size, &start.at, gets_stdin, setup, mask)
            })
            .collect();
        let started = rank::start_all(prepared);
        for text in self.binder.take_notices() {
            let _ = self.control.send(Up::Notice { host: self.plan.host.clone(), text });
        }
        let mut unbound = HashMap::new();
        for (start, result) in batch.into_iter().zip(started) {
            if let Some((peer, answers)) = self.adopt_rank(start, result) {
                unbound.insert(peer.rank, (peer, answers));
            }
        }
        unbound
    }

    /// Takes a rank that started (or could not) into the node's books, with the tasks that
    /// serve it. Returns its PMI answer channel if its connection is still to come.
    fn adopt_rank(
        &mut self,
        start: StartRank,
        result: Result<rank::Started, ExitOutcome>,
    ) -> Option<(PmiPeer, pmi::AnswerRx)> {
        let StartRank { job_index, gid, segment, at, cpus, .. } = start;
        let local = self.ranks.len();
        let mut slot = LocalRank {
            rank: gid,
            job: job_index,
            pid: None,
            running: false,
            open_streams: 0,
            stdin: None,
            pmi: None,
            exit: None,
            pmi_unclean: false,
            pmi_open: false,
        };
        let mut unbound = None;
        match result {
            Ok(started) => {
                let peer = PmiPeer { local, job: job_index, rank: at.rank, appnum: segment };
                let (answers_tx, answers_rx) = pmi::answer_channel();
                slot.pmi = Some(answers_tx);
                match started.pmi {
                    Some(conn) => {
                        slot.pmi_open = true;
                        let pmi_job = self.jobs[&job_index].pmi.clone();
                        let calls = self.pmi_calls.clone();
                        tokio::spawn(pmi::serve_rank(
                            conn,
                            Vec::new(),
                            peer,
                            pmi_job,
                            calls,
                            answers_rx,
                        ));
                    }
                    None => unbound = Some((peer, answers_rx)),
                }
                slot.pid = Some(started.pid);
                slot.running = true;
                slot.open_streams = 2;
                self.rank_by_pid.insert(started.pid, local);
                let cpus = cpus.map(|c| c.list);
                let hello = Up::RankStarted { rank: gid, pid: started.pid as u32, cpus };
                let (stdout, stderr) = (started.stdout, started.stderr);
                // The start goes ahead of any output on the same ordered path: the launcher
                // names output files after the pid.
                self.outputs.add(gid, local, hello, stdout, stderr);
                // Prepared with a stdin pipe only if it reads the launcher's stdin.
                if started.stdin.is_some() {
                    let (tx, rx) = mpsc::unbounded_channel();
                    slot.stdin = Some(tx);
                    tokio::spawn(rank::feed_stdin(started.stdin, rx, self.control.clone()));
                }
            }
            Err(outcome) => {
                let _ = self.control.send(Up::RankExited { rank: gid, pid: 0, outcome });
            }
        }
        self.ranks.push(slot);
        if let Some(state) = self.jobs.get_mut(&job_index) {
            state.local += 1;
        }
        unbound
    }

    /// Starts a job a local rank spawned, on this node, and answers the spawner.
    fn start_spawned(&mut self, sj: SpawnJob) {
        let mut segments = Vec::new();
        let mut plan = Vec::new();
        for (appnum, cmd) in sj.request.cmds.iter().enumerate() {
            let info = |k: &str| cmd.info.iter().find(|(key, _)| key == k).map(|(_, v)| v.clone());
            let exe = match info("path") {
                Some(dir) if !cmd.exe.contains('/') => format!("{dir}/{}", cmd.exe),
                _ => cmd.exe.clone(),
            };
            let wdir = info("wdir").map(String::into_bytes);
            segments.push(Segment {
                exe: exe.into_bytes(),
                args: cmd.args.iter().map(|a| a.clone().into_bytes()).collect(),
                inherit_env: true,
                env: vec![(b"PMI_SPAWNED".to_vec(), b"1".to_vec())],
                wdir: wdir.unwrap_or_else(|| self.job.segments[0].wdir.clone()),
            });
            plan.extend((0..cmd.nprocs).map(|_| appnum as u32));
        }
        let size = plan.len() as u32;
        let mut job = (*self.job).clone();
        job.jobid = sj.kvsname.clone();
        job.size = size;
        job.segments = segments;
        let mut kvs = Kvs::default();
        kvs.visible.extend(sj.request.preput.iter().cloned());
        let pmi = Arc::new(PmiJob {
            kvsname: sj.kvsname.clone(),
            size,
            process_mapping: Some(format!("(vector,(0,1,{size}))")),
            spawner: Some(sj.parent_kvsname.clone()),
        });
        self.jobs.insert(sj.job, JobState { pmi, kvs, local: 0 });
        self.swept = false;
        let host = self.plan.host.clone();
        let ranks: Vec<_> = (0..size).zip(plan).map(|(r, seg)| (r, sj.first + r, seg)).collect();
        // Bound by the same policy over the spawned job's own local indexes: its ranks share
        // the CPUs of the job that spawned them.
        let batch = self.batch(&job, sj.job, &host, &ranks);
        self.start_batch(batch, &PmiSetup::Fd);
        tracing::debug!(job = sj.job, size, "spawned job started");
        if let Some(parent) = self.ranks.iter().find(|r| r.rank == sj.parent) {
            if let Some(tx) = &parent.pmi {
                let _ = tx.send(Box::new(PmiAnswer::Spawn { kvsname: sj.kvsname, tag: sj.tag }));
            }
        }
    }

    fn handle(&mut self, ev: Event) {
        match ev {
            Event::Down(down) => {
                self.last_heard = Instant::now();
                self.handle_down(down);
            }
            Event::UpstreamClosed(why) => self.lose_upstream(&why),
            Event::PmiClosedEarly { local } => {
                // Still running: it closed PMI and went on. (A reaped rank was judged then.)
                if self.ranks[local].exit.is_none() {
                    self.pmi_closed_early(local);
                }
            }
            Event::OutputClosed { local } => {
                let slot = &mut self.ranks[local];
                slot.open_streams = slot.open_streams.saturating_sub(1);
            }
            Event::Child { child, event } => match event {
                LinkEvent::Greeted(g) => tracing::debug!(host = %g.host, "child proxy up"),
                LinkEvent::Up(Up::NodeDone { .. }) => self.children[child].state.done = true,
                LinkEvent::Up(Up::FenceIn { pairs, .. }) => {
                    if let Some(state) = self.jobs.get_mut(&0) {
                        state.kvs.pending.extend(pairs);
                        state.kvs.children_in += 1;
                    }
                    self.try_fence_in(0);
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
            Down::Ping => {}
            Down::Stdin { seq, data } => {
                let chunk: Arc<[u8]> = Arc::from(data.as_slice());
                for c in &self.children {
                    if c.ranks.iter().any(|&r| self.job.stdin.includes(r)) {
                        let _ = c.down.send(Down::Stdin { seq, data: data.clone() });
                    }
                }
                for slot in &self.ranks {
                    if slot.job != 0 || !self.job.stdin.includes(slot.rank) {
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
                    match sig {
                        Signal::SIGTSTP => self.stopped = true,
                        Signal::SIGCONT => self.stopped = false,
                        _ => {}
                    }
                    self.signal_ranks(sig);
                }
            }
            Down::Terminate { grace_ms } => self.terminate(Duration::from_millis(grace_ms)),
            Down::FenceOut { epoch, pairs } => self.fence_out(0, epoch, pairs),
            Down::Spawn(sj) => {
                if sj.node == self.plan.index {
                    self.start_spawned(*sj);
                } else if let Some(c) =
                    self.children.iter_mut().find(|c| c.nodes.contains(&sj.node))
                {
                    let size: u32 = sj.request.cmds.iter().map(|c| c.nprocs).sum();
                    c.ranks.extend(sj.first..sj.first + size);
                    let _ = c.down.send(Down::Spawn(sj));
                }
            }
            Down::NameReply { rank, tag, answer } => {
                if let Some(slot) = self.ranks.iter().find(|r| r.rank == rank) {
                    if let Some(tx) = &slot.pmi {
                        let _ = tx.send(Box::new(PmiAnswer::Name { answer, tag }));
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
        let (gid, pid) = (slot.rank, slot.pid.unwrap_or(0) as u32);
        let answers = slot.pmi.clone();
        let answer = |a: PmiAnswer| {
            if let Some(tx) = &answers {
                let _ = tx.send(Box::new(a));
            }
        };
        if let PmiCall::Closed { clean } = call {
            slot.pmi = None;
            slot.pmi_open = false;
            slot.pmi_unclean = !clean;
            match slot.exit {
                _ if clean => {}
                Some(exit) if exit.is_success() => self.pmi_closed_early(peer.local),
                Some(_) => {}
                None => {
                    // A rank that dies closes its socket a moment before it is reaped; give
                    // the reap that moment, so a crash is reported as the crash it is.
                    let events = self.events.clone();
                    tokio::spawn(async move {
                        tokio::time::sleep(Duration::from_millis(200)).await;
                        let _ = events.send(Event::PmiClosedEarly { local: peer.local });
                    });
                }
            }
            return;
        }
        let Some(state) = self.jobs.get_mut(&peer.job) else { return };
        let kvs = &mut state.kvs;
        match call {
            PmiCall::Put { key, value } => kvs.pending.push((key, value)),
            PmiCall::Get { key, tag } => {
                let value = kvs.visible.get(&key).cloned();
                answer(PmiAnswer::Get { key, value, tag });
            }
            PmiCall::Fence { tag } => {
                kvs.waiting.push((peer.local, tag));
                self.try_fence_in(peer.job);
            }
            PmiCall::PutNodeAttr { key, value } => {
                for (local, k, tag) in std::mem::take(&mut kvs.attr_waiters) {
                    if k == key {
                        if let Some(tx) = &self.ranks[local].pmi {
                            let _ = tx.send(Box::new(PmiAnswer::GetNodeAttr {
                                value: Some(value.clone()),
                                tag,
                            }));
                        }
                    } else {
                        kvs.attr_waiters.push((local, k, tag));
                    }
                }
                kvs.node_attrs.insert(key, value);
            }
            PmiCall::GetNodeAttr { key, wait, tag } => match kvs.node_attrs.get(&key) {
                Some(v) => answer(PmiAnswer::GetNodeAttr { value: Some(v.clone()), tag }),
                None if wait => kvs.attr_waiters.push((peer.local, key, tag)),
                None => answer(PmiAnswer::GetNodeAttr { value: None, tag }),
            },
            PmiCall::Name { op, tag } => {
                let _ = self.control.send(Up::Name { rank: gid, tag, op });
            }
            PmiCall::Abort { code, msg } => {
                let _ = self.control.send(Up::Abort { rank: gid, pid, code, msg });
            }
            PmiCall::Spawn { request, tag } => {
                let _ = self.control.send(Up::Spawn { rank: gid, tag, request });
            }
            PmiCall::Finalized | PmiCall::Closed { .. } => {}
            PmiCall::Fault(what) => {
                let _ = self.control.send(Up::PmiFault { rank: gid, pid, what });
            }
        }
    }

    /// Completes a fence once every local rank of the job and every child subtree is in: the
    /// launched job's fence goes up the tree as one FenceIn; a spawned job lives on this node
    /// alone, so its fence completes here.
    fn try_fence_in(&mut self, job: u32) {
        let live_children = self.children.iter().filter(|c| !c.state.lost).count();
        let Some(state) = self.jobs.get_mut(&job) else { return };
        let kvs = &mut state.kvs;
        let children_needed = if job == 0 { live_children } else { 0 };
        if kvs.sent || kvs.waiting.len() < state.local || kvs.children_in < children_needed {
            return;
        }
        kvs.sent = true;
        kvs.children_in = 0;
        let pairs = std::mem::take(&mut kvs.pending);
        if job == 0 {
            let _ = self.control.send(Up::FenceIn { epoch: kvs.epoch, pairs });
        } else {
            let epoch = kvs.epoch;
            self.fence_out(job, epoch, pairs);
        }
    }

    fn fence_out(&mut self, job: u32, epoch: u64, pairs: Vec<(String, String)>) {
        if job == 0 {
            for c in self.children.iter().filter(|c| !c.state.lost) {
                let _ = c.down.send(Down::FenceOut { epoch, pairs: pairs.clone() });
            }
        }
        let Some(state) = self.jobs.get_mut(&job) else { return };
        let kvs = &mut state.kvs;
        if epoch != kvs.epoch {
            tracing::warn!(epoch, expected = kvs.epoch, "fence completion for another epoch");
        }
        for (k, v) in pairs {
            // MPICH never puts a key twice; if a program does, the first value stays (Hydra).
            kvs.visible.entry(k).or_insert(v);
        }
        kvs.sent = false;
        kvs.epoch += 1;
        for (local, tag) in std::mem::take(&mut kvs.waiting) {
            if let Some(tx) = &self.ranks[local].pmi {
                let _ = tx.send(Box::new(PmiAnswer::Fence { tag }));
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
                // An orphan has no one to wait for: past one more moment, it stops waiting.
                self.deadline = self.orphaned.then(|| Instant::now() + CHILD_PROXY_GRACE);
            }
            Kill::Done => {
                tracing::warn!("giving up on what is left of this node");
                self.kill = Kill::GaveUp;
                self.deadline = None;
            }
            Kill::Idle | Kill::GaveUp => self.deadline = None,
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
                slot.exit = Some(outcome);
                if let Some(tx) = slot.stdin.take() {
                    let _ = tx.send(StdinChunk::Eof);
                }
                let unclean = slot.pmi_unclean;
                let _ =
                    self.control.send(Up::RankExited { rank: slot.rank, pid: pid as u32, outcome });
                if unclean && outcome.is_success() {
                    self.pmi_closed_early(local);
                }
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

    /// A rank left PMI without finalize: a failure (PMI.md §5), even if it exits with 0.
    fn pmi_closed_early(&self, local: usize) {
        let slot = &self.ranks[local];
        let (rank, pid) = (slot.rank, slot.pid.unwrap_or(0) as u32);
        let what = "closed its PMI connection before calling finalize".to_string();
        let _ = self.control.send(Up::PmiFault { rank, pid, what });
    }

    fn report_lost(&mut self, child: usize, reason: String) {
        let host = self.children[child].state.host.clone();
        let _ = self.control.send(Up::ProxyLost { host, reason });
    }

    fn finished(&self) -> bool {
        if matches!(self.kill, Kill::GaveUp) {
            return true;
        }
        self.ranks.iter().all(|r| !r.running && r.open_streams == 0 && !r.pmi_open)
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
        LinkEvent::Up(Up::Ping) => true,
        // With the parent gone, frames have nowhere to go; the link still runs, so that its
        // end reaches the dispatcher.
        LinkEvent::Up(up) if !matches!(up, Up::NodeDone { .. } | Up::FenceIn { .. }) => {
            let _ = data.send(up).await;
            true
        }
        event => events.send(Event::Child { child, event }).is_ok(),
    }
}
