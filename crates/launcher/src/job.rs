//! The root of the control tree: the one owner of the job's state. It starts the top
//! proxies, routes stdin and signals down, collects exits, and alone decides when the job
//! ends and with which status.
//!
//! ```text
//!  link readers ──Up (control)──►┐                       ┌──► link pumps ──► proxies
//!  link readers ──Output──► output thread (bounded)      │
//!  stdin thread ──chunks (credit window)──► Root ──Down──┘
//!  signals, SIGCHLD, timeout ─────────────► Root
//! ```

use std::collections::{HashMap, HashSet};
use std::ffi::OsString;
use std::io;
use std::os::fd::AsRawFd;
use std::time::Duration;

use nix::sys::signal::Signal;
use pmi_wire::control::{
    Down, Job, NameAnswer, NameOp, NodePlan, SpawnJob, SpawnRequest, StdinTarget, Up,
};
use pmi_wire::ids::ExitOutcome;
use rlaunch_proxy::link::{self, ChildState, ForkedProxy, LinkEvent, ProxyProcess};
use rlaunch_proxy::procs;
use tokio::signal::unix::{signal, SignalKind};
use tokio::sync::mpsc;
use tokio::time::Instant;

use crate::output::{self, Chunk, FileFailure, OutputEvent, OutputSpec, Roster, SpawnedJob};
use crate::stdin;

/// Stdin chunks in flight (sent, not yet written into every target rank).
const STDIN_WINDOW: usize = 8;
/// A second Ctrl-C within this time kills the job.
const DOUBLE_INTERRUPT: Duration = Duration::from_secs(5);
/// After the kill grace, how long proxies get to report before rlaunch kills them.
const PROXY_GRACE: Duration = Duration::from_secs(5);

/// Everything the root needs to run a job.
pub struct Plan {
    pub job: Job,
    /// The proxies rlaunch starts itself, each with its subtree.
    pub roots: Vec<NodePlan>,
    /// Host name of each node, by node index.
    pub node_hosts: Vec<String>,
    /// Node index of each rank of the launched job.
    pub rank_node: Vec<u32>,
    pub proxy_exe: OsString,
    /// Prefixes and output files; the writer thread takes it.
    pub output: OutputSpec,
    pub print_all_exit_codes: bool,
    /// `--report-bindings`: a line per rank saying which CPUs it is bound to.
    pub report_bindings: bool,
    pub timeout: Option<Duration>,
    /// Proxies already forked for some of `roots` (by index), by [`fork_local_proxies`].
    pub forked: Vec<Option<io::Result<ForkedProxy>>>,
}

/// Forks the proxies of `roots` that run on this machine, now, with no exec (see
/// [`link::fork_proxy`]); the others are started by [`run`]. Must be called while rlaunch has
/// one thread: before the runtime, the writer and the stdin threads.
pub fn fork_local_proxies(plan: &mut Plan) {
    let mut channels = Vec::new();
    plan.forked = plan
        .roots
        .iter()
        .map(|node| {
            node.fork.then(|| {
                // SAFETY: rlaunch has a single thread until `run`, as main guarantees.
                let forked =
                    unsafe { link::fork_proxy(&plan.proxy_exe, &channels, &plan.job, node) };
                if let Ok(proxy) = &forked {
                    channels.push(proxy.channel.as_raw_fd());
                }
                forked
            })
        })
        .collect();
}

/// Why the job ended early, in the order things happened; the first one decides the exit
/// status.
#[derive(Debug, Clone)]
enum Cause {
    RankFailed { rank: u32, pid: u32, outcome: ExitOutcome },
    TimedOut(Duration),
    Interrupted,
    LostProxy { host: String, reason: String },
    StdoutClosed,
    Aborted { rank: u32, pid: u32, code: i32, msg: String },
    PmiFault { rank: u32, pid: u32, what: String },
    OutputFile(FileFailure),
}

/// What a link to a top proxy reports (its output goes straight to the writer thread).
struct Event {
    child: usize,
    event: LinkEvent,
}

struct Child {
    state: ChildState,
    down: mpsc::UnboundedSender<Down>,
    /// Ranks of its subtree that read stdin.
    stdin_ranks: usize,
}

struct Root {
    plan: Plan,
    children: Vec<Child>,
    child_by_pid: HashMap<i32, usize>,
    /// Every process of the run by global id: the launched job's ranks, then spawned jobs'.
    procs: Vec<Proc>,
    /// Jobs started so far (the launched one is 0).
    jobs: u32,
    causes: Vec<Cause>,
    terminating: bool,
    last_interrupt: Option<Instant>,
    /// Kill the proxies themselves if they have not finished by then.
    proxy_deadline: Option<Instant>,
    timeout_at: Option<Instant>,
    stdin_seq: u64,
    /// Per chunk in flight, the acknowledgements still missing.
    stdin_pending: HashMap<u64, usize>,
    stdin_open: bool,
    /// Top proxies whose subtree entered the current fence, and the pairs they brought.
    fence_in: usize,
    fence_pairs: Vec<(String, String)>,
    fence_epoch: u64,
    /// The job's published names (MPI_Publish_name): service -> port.
    names: HashMap<String, String>,
    /// Tells the output writer about each spawned job before its ranks start.
    spawned_jobs: std::sync::mpsc::Sender<SpawnedJob>,
}

/// One process of the run.
struct Proc {
    job: u32,
    /// Rank within its job.
    rank: u32,
    node: u32,
    exe: String,
    /// Its MPMD segment (for the launched job).
    segment: u32,
    /// The top proxy whose subtree holds it.
    child: usize,
    outcome: Option<(u32, ExitOutcome)>,
}

/// Runs the job to the end; returns rlaunch's exit status.
pub async fn run(mut plan: Plan) -> i32 {
    procs::become_subreaper();
    let (events_tx, mut events) = mpsc::unbounded_channel();
    let (output_tx, output_rx) = mpsc::channel(output::QUEUE);
    let (output_events_tx, mut output_events) = mpsc::unbounded_channel();
    let (spawned_jobs, spawned_rx) = std::sync::mpsc::channel();
    let roster = Roster::new(
        plan.job.jobid.clone(),
        plan.node_hosts.clone(),
        plan.rank_node.clone(),
        spawned_rx,
    );
    let writer = output::Writer::new(std::mem::take(&mut plan.output), roster, output_events_tx);
    let writer = std::thread::spawn(move || writer.run(output_rx));

    let mut sigchld = signal(SignalKind::child()).expect("SIGCHLD handler");
    let mut forwarded = ForwardedSignals::new();

    let mut root = Root {
        timeout_at: plan.timeout.map(|t| Instant::now() + t),
        procs: Vec::new(),
        jobs: 1,
        children: Vec::new(),
        child_by_pid: HashMap::new(),
        causes: Vec::new(),
        terminating: false,
        last_interrupt: None,
        proxy_deadline: None,
        stdin_seq: 0,
        stdin_pending: HashMap::new(),
        stdin_open: plan.job.stdin != StdinTarget::None,
        fence_in: 0,
        fence_pairs: Vec::new(),
        fence_epoch: 0,
        names: HashMap::new(),
        spawned_jobs,
        plan,
    };
    let mut readers = root.start_proxies(&events_tx, &output_tx);
    drop(output_tx);
    // A proxy forked in main starts its ranks at once, and may be gone before the SIGCHLD
    // handler above existed: its signal is lost, but its zombie is still there to reap.
    root.reap();
    let mut stdin = if root.stdin_open { stdin::start() } else { None };
    if stdin.is_none() && root.stdin_open {
        root.stdin_open = false;
        root.broadcast(Down::StdinEof);
    }

    while !root.finished() {
        let stdin_ready = root.stdin_open && root.stdin_pending.len() < STDIN_WINDOW;
        let timeout_at = root.timeout_at;
        let proxy_deadline = root.proxy_deadline;
        tokio::select! {
            ev = events.recv() => match ev {
                Some(ev) => root.handle(ev),
                None => break,
            },
            Some(event) = output_events.recv() => match event {
                OutputEvent::StdoutClosed => root.fail(Cause::StdoutClosed),
                OutputEvent::FileFailed(failure) => root.fail(Cause::OutputFile(failure)),
            },
            chunk = stdin::next(&mut stdin), if stdin_ready => root.stdin_chunk(chunk),
            _ = sigchld.recv() => root.reap(),
            sig = forwarded.recv() => root.on_signal(sig),
            _ = sleep_until(timeout_at), if timeout_at.is_some() => {
                root.timeout_at = None;
                let after = root.plan.timeout.unwrap_or_default();
                root.fail(Cause::TimedOut(after));
            }
            _ = sleep_until(proxy_deadline), if proxy_deadline.is_some() => root.kill_proxies(),
        }
    }

    for r in &mut readers {
        r.abort();
    }
    for r in readers {
        let _ = r.await;
    }
    // Every sender is gone, so the writer is flushing its last bytes: wait for it right here
    // (a blocking-pool thread just for this costs more than the wait).
    let _ = writer.join();
    // The last lines may have met a file that could not be written: the job ended anyway,
    // but not with the output it asked for.
    while let Ok(event) = output_events.try_recv() {
        if let OutputEvent::FileFailed(failure) = event {
            root.causes.push(Cause::OutputFile(failure));
        }
    }
    procs::kill_descendants(&HashSet::new());
    root.report()
}

async fn sleep_until(at: Option<Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}

/// The signals rlaunch forwards to the ranks.
struct ForwardedSignals {
    streams: Vec<(Signal, tokio::signal::unix::Signal)>,
}

impl ForwardedSignals {
    fn new() -> ForwardedSignals {
        let wanted = [
            Signal::SIGINT,
            Signal::SIGTERM,
            Signal::SIGHUP,
            Signal::SIGQUIT,
            Signal::SIGUSR1,
            Signal::SIGUSR2,
            Signal::SIGTSTP,
            Signal::SIGCONT,
        ];
        let streams = wanted
            .into_iter()
            .map(|s| (s, signal(SignalKind::from_raw(s as i32)).expect("signal handler")))
            .collect();
        ForwardedSignals { streams }
    }

    async fn recv(&mut self) -> Signal {
        std::future::poll_fn(|cx| {
            for (sig, stream) in &mut self.streams {
                if stream.poll_recv(cx).is_ready() {
                    return std::task::Poll::Ready(*sig);
                }
            }
            std::task::Poll::Pending
        })
        .await
    }
}

impl Root {
    fn start_proxies(
        &mut self,
        events: &mpsc::UnboundedSender<Event>,
        output: &mpsc::Sender<Chunk>,
    ) -> Vec<tokio::task::JoinHandle<()>> {
        let mut readers = Vec::new();
        let roots = std::mem::take(&mut self.plan.roots);
        let job = &self.plan.job;
        let mut procs: Vec<Option<Proc>> = (0..job.size).map(|_| None).collect();
        for (index, node) in roots.iter().enumerate() {
            for n in node.walk() {
                for r in &n.ranks {
                    procs[r.rank as usize] = Some(Proc {
                        job: 0,
                        rank: r.rank,
                        node: n.index,
                        exe: String::from_utf8_lossy(&job.segments[r.segment as usize].exe)
                            .into_owned(),
                        segment: r.segment,
                        child: self.children.len(),
                        outcome: None,
                    });
                }
            }
            let stdin_ranks = node
                .walk()
                .iter()
                .flat_map(|n| &n.ranks)
                .filter(|r| self.plan.job.stdin.includes(r.rank))
                .count();
            let idx = self.children.len();
            let (output, events) = (output.clone(), events.clone());
            let report = self.plan.report_bindings;
            let process = match self.plan.forked.get_mut(index).and_then(Option::take) {
                Some(forked) => forked.and_then(ProxyProcess::forked),
                None => {
                    link::spawn_proxy(&job.bootstrap, &node.host, node.fork, &self.plan.proxy_exe)
                }
            };
            let started = link::start_child(job, node, process, move |event| {
                route(idx, event, output.clone(), events.clone(), report)
            });
            match started.link {
                Ok(link) => {
                    self.child_by_pid.insert(started.state.pid, idx);
                    readers.push(link);
                }
                Err(reason) => {
                    self.causes.push(Cause::LostProxy { host: node.host.clone(), reason })
                }
            }
            let (state, down_tx) = (started.state, started.down);
            self.children.push(Child { state, down: down_tx, stdin_ranks });
        }
        self.procs = procs.into_iter().map(|p| p.expect("placement covers every rank")).collect();
        self.plan.roots = roots;
        readers
    }

    fn broadcast(&self, down: Down) {
        for c in self.children.iter().filter(|c| !c.state.lost) {
            let _ = c.down.send(down.clone());
        }
    }

    fn handle(&mut self, Event { child, event }: Event) {
        match event {
            LinkEvent::Greeted(g) => tracing::debug!(host = %g.host, pid = g.pid, "proxy up"),
            LinkEvent::Up(up) => self.handle_up(child, up),
            LinkEvent::Stderr(text) => self.children[child].state.add_stderr(&text),
            LinkEvent::Closed(error) => {
                if let Some(reason) = self.children[child].state.on_link_closed(error) {
                    let host = self.children[child].state.host.clone();
                    self.fail(Cause::LostProxy { host, reason });
                }
            }
        }
    }

    fn handle_up(&mut self, child: usize, up: Up) {
        match up {
            Up::RankExited { rank, pid, outcome } => {
                let Some(slot) = self.procs.get_mut(rank as usize).map(|p| &mut p.outcome) else {
                    tracing::warn!(rank, "exit report for an unknown rank");
                    return;
                };
                *slot = Some((pid, outcome));
                tracing::debug!(rank, pid, %outcome, "rank ended");
                if !outcome.is_success() {
                    self.fail(Cause::RankFailed { rank, pid, outcome });
                }
            }
            Up::StdinAck { seq } => {
                if let Some(left) = self.stdin_pending.get_mut(&seq) {
                    *left -= 1;
                    if *left == 0 {
                        self.stdin_pending.remove(&seq);
                    }
                }
            }
            Up::ProxyLost { host, reason } => self.fail(Cause::LostProxy { host, reason }),
            Up::Notice { host, text } => eprintln!("rlaunch: note: on {host}: {text}"),
            Up::NodeDone { .. } => self.children[child].state.done = true,
            Up::Started { node } => tracing::debug!(node, "node started its ranks"),
            Up::FenceIn { epoch, pairs } => {
                if epoch != self.fence_epoch {
                    tracing::warn!(
                        epoch,
                        expected = self.fence_epoch,
                        "fence entry for another epoch"
                    );
                }
                self.fence_pairs.extend(pairs);
                self.fence_in += 1;
                let live = self.children.iter().filter(|c| !c.state.lost).count();
                if self.fence_in >= live {
                    let pairs = std::mem::take(&mut self.fence_pairs);
                    tracing::debug!(epoch, pairs = pairs.len(), "fence complete");
                    self.broadcast(Down::FenceOut { epoch: self.fence_epoch, pairs });
                    self.fence_in = 0;
                    self.fence_epoch += 1;
                }
            }
            Up::Name { rank, tag, op } => {
                let answer = match op {
                    NameOp::Publish { service, port } => {
                        let fresh = !self.names.contains_key(&service);
                        if fresh {
                            self.names.insert(service, port);
                        }
                        NameAnswer::Published(fresh)
                    }
                    NameOp::Unpublish { service } => {
                        NameAnswer::Unpublished(self.names.remove(&service).is_some())
                    }
                    NameOp::Lookup { service } => {
                        NameAnswer::Lookup(self.names.get(&service).cloned())
                    }
                };
                if let Some(c) =
                    self.procs.get(rank as usize).and_then(|p| self.children.get(p.child))
                {
                    let _ = c.down.send(Down::NameReply { rank, tag, answer });
                }
            }
            Up::Abort { rank, pid, code, msg } => {
                self.fail(Cause::Aborted { rank, pid, code, msg })
            }
            Up::PmiFault { rank, pid, what } => self.fail(Cause::PmiFault { rank, pid, what }),
            Up::Spawn { rank, tag, request } => self.spawn(rank, tag, request),
            Up::RankStarted { rank, pid, cpus } => self.report_binding(rank, pid, cpus),
            Up::Greeting { .. } | Up::Output { .. } | Up::OutputEnd { .. } | Up::Ping => {}
        }
    }

    /// `--report-bindings`: one line per rank as it starts (route sends RankStarted here
    /// only then).
    fn report_binding(&self, rank: u32, pid: u32, cpus: Option<String>) {
        if rank as usize >= self.procs.len() {
            tracing::warn!(rank, "start report for an unknown rank");
            return;
        }
        let bound = match cpus {
            Some(cpus) => format!("bound to cpus {cpus}"),
            None => "not bound".to_string(),
        };
        let (who, host) = (self.rank_name(rank), self.rank_host(rank));
        eprintln!("rlaunch: {who} on {host} (pid {pid}) {bound}");
    }

    /// Records why the job must end; the first cause starts the teardown.
    fn fail(&mut self, cause: Cause) {
        tracing::debug!(?cause, "job failing");
        let first = self.causes.is_empty();
        self.causes.push(cause);
        if first {
            self.terminate(Duration::from_millis(self.plan.job.kill_grace_ms));
        }
    }

    fn terminate(&mut self, grace: Duration) {
        self.broadcast(Down::Terminate { grace_ms: grace.as_millis() as u64 });
        let deadline = Instant::now() + grace + PROXY_GRACE;
        if !self.terminating || self.proxy_deadline.is_some_and(|d| d > deadline) {
            self.proxy_deadline = Some(deadline);
        }
        self.terminating = true;
    }

    fn kill_proxies(&mut self) {
        self.proxy_deadline = None;
        for c in self.children.iter().filter(|c| !c.state.reaped()) {
            tracing::warn!(host = %c.state.host, "proxy did not finish; killing it");
            procs::signal_pid(c.state.pid, Signal::SIGKILL);
        }
    }

    fn on_signal(&mut self, sig: Signal) {
        tracing::debug!(%sig, "signal");
        match sig {
            Signal::SIGINT => {
                let now = Instant::now();
                if self.last_interrupt.is_some_and(|t| now - t < DOUBLE_INTERRUPT) {
                    eprintln!("rlaunch: interrupted again; killing the job");
                    self.causes.push(Cause::Interrupted);
                    self.terminate(Duration::ZERO);
                    return;
                }
                self.last_interrupt = Some(now);
                self.broadcast(Down::Signal { signo: sig as i32 });
            }
            Signal::SIGTSTP => {
                self.broadcast(Down::Signal { signo: sig as i32 });
                // Stop ourselves too, as the shell expects (SIGCONT resumes us and the ranks),
                // once the link pumps have had the moment they need to write the signal down.
                tokio::spawn(async {
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    let _ = nix::sys::signal::raise(Signal::SIGSTOP);
                });
            }
            _ => self.broadcast(Down::Signal { signo: sig as i32 }),
        }
    }

    fn stdin_chunk(&mut self, chunk: Option<Vec<u8>>) {
        match chunk {
            Some(data) => {
                self.stdin_seq += 1;
                let seq = self.stdin_seq;
                let mut expected = 0;
                for c in self.children.iter().filter(|c| !c.state.lost && c.stdin_ranks > 0) {
                    expected += c.stdin_ranks;
                    let _ = c.down.send(Down::Stdin { seq, data: data.clone() });
                }
                if expected > 0 {
                    self.stdin_pending.insert(seq, expected);
                }
            }
            None => {
                self.stdin_open = false;
                self.broadcast(Down::StdinEof);
            }
        }
    }

    fn reap(&mut self) {
        for (pid, outcome) in procs::reap_ended() {
            let Some(&child) = self.child_by_pid.get(&pid) else {
                continue;
            };
            if let Some(reason) = self.children[child].state.on_exit(outcome) {
                let host = self.children[child].state.host.clone();
                self.fail(Cause::LostProxy { host, reason });
            }
        }
    }

    fn finished(&self) -> bool {
        self.children.iter().all(|c| c.state.settled())
    }

    fn rank_host(&self, rank: u32) -> &str {
        let node = self.procs[rank as usize].node as usize;
        &self.plan.node_hosts[node]
    }

    /// "rank 3" for the launched job, "rank 1 of spawned job 2" for others.
    fn rank_name(&self, gid: u32) -> String {
        match &self.procs[gid as usize] {
            Proc { job: 0, rank, .. } => format!("rank {rank}"),
            Proc { job, rank, .. } => format!("rank {rank} of spawned job {job}"),
        }
    }

    fn describe(&self, rank: u32, pid: u32, outcome: ExitOutcome) -> String {
        let host = self.rank_host(rank);
        match outcome {
            ExitOutcome::SpawnFailed { errno } => {
                let exe = &self.procs[rank as usize].exe;
                format!(
                    "cannot start {exe} on {host}: {}",
                    crate::hosts::plain(&std::io::Error::from_raw_os_error(errno))
                )
            }
            ExitOutcome::NoWorkdir { errno } => {
                let p = &self.procs[rank as usize];
                let dir = match p.job {
                    0 => self.plan.job.segments[p.segment as usize].wdir.clone(),
                    _ => b"of its spawned job".to_vec(),
                };
                format!(
                    "cannot start {} on {host}: working directory {}: {}",
                    self.rank_name(rank),
                    String::from_utf8_lossy(&dir),
                    crate::hosts::plain(&std::io::Error::from_raw_os_error(errno))
                )
            }
            _ => format!("{} (pid {pid} on {host}) {outcome}", self.rank_name(rank)),
        }
    }

    /// A rank asked for a new job: give it ids and a kvsname and have the rank's node start
    /// it. Its ranks count for the run's outcome like any other.
    fn spawn(&mut self, parent: u32, tag: Option<String>, request: SpawnRequest) {
        let Some(p) = self.procs.get(parent as usize) else { return };
        let (node, child) = (p.node, p.child);
        let job = self.jobs;
        self.jobs += 1;
        let first = self.procs.len() as u32;
        for cmd in &request.cmds {
            for _ in 0..cmd.nprocs {
                let rank = self.procs.len() as u32 - first;
                self.procs.push(Proc {
                    job,
                    rank,
                    node,
                    exe: cmd.exe.clone(),
                    segment: 0,
                    child,
                    outcome: None,
                });
            }
        }
        let spawn = SpawnJob {
            job,
            kvsname: format!("{}_{job}", self.plan.job.jobid),
            parent_kvsname: self.plan.job.jobid.clone(),
            node,
            first,
            parent,
            tag,
            request,
        };
        // Before the proxy hears of it, so the writer knows the job before its first line.
        let _ = self.spawned_jobs.send(SpawnedJob {
            job,
            first,
            size: self.procs.len() as u32 - first,
            host: self.plan.node_hosts[node as usize].clone(),
            jobid: spawn.kvsname.clone(),
        });
        tracing::debug!(job, node, first, "spawning a job");
        let _ = self.children[child].down.send(Down::Spawn(Box::new(spawn)));
    }

    /// Prints why the job failed and returns the exit status.
    fn report(&self) -> i32 {
        if self.plan.print_all_exit_codes {
            for (rank, outcome) in self.procs.iter().map(|p| &p.outcome).enumerate() {
                let rank = rank as u32;
                match outcome {
                    Some((pid, outcome)) => {
                        eprintln!("rlaunch: {}", self.describe(rank, *pid, *outcome))
                    }
                    None => eprintln!(
                        "rlaunch: {} (on {}) did not report an exit",
                        self.rank_name(rank),
                        self.rank_host(rank)
                    ),
                }
            }
        }
        let Some(cause) = self.causes.first() else {
            return 0;
        };
        match cause {
            Cause::RankFailed { rank, pid, outcome } => {
                if !self.plan.print_all_exit_codes {
                    eprintln!("rlaunch: {}", self.describe(*rank, *pid, *outcome));
                }
                outcome.exit_code()
            }
            Cause::TimedOut(after) => {
                eprintln!(
                    "rlaunch: the job timed out after {} s and was killed",
                    after.as_secs_f64()
                );
                124
            }
            Cause::Interrupted => 130,
            Cause::LostProxy { host, reason } => {
                eprintln!("rlaunch: lost proxy on {host} ({reason})");
                255
            }
            Cause::StdoutClosed => 141,
            Cause::Aborted { rank, pid, code, msg } => {
                let host = self.rank_host(*rank);
                let msg = if msg.is_empty() { String::new() } else { format!(": {msg}") };
                let who = self.rank_name(*rank);
                eprintln!("rlaunch: {who} (pid {pid} on {host}) aborted the job with exit code {code}{msg}");
                if *code == 0 {
                    1
                } else {
                    *code
                }
            }
            Cause::PmiFault { rank, pid, what } => {
                eprintln!(
                    "rlaunch: {} (pid {pid} on {}) {what}",
                    self.rank_name(*rank),
                    self.rank_host(*rank)
                );
                255
            }
            Cause::OutputFile(failure) => {
                eprintln!("rlaunch: {failure}");
                255
            }
        }
    }
}

/// Output goes to the writer thread (waiting when it is full: that is the backpressure),
/// everything else to the root. With `report_bindings`, the root gets each RankStarted too:
/// it knows every rank's name and host, spawned ones included.
async fn route(
    child: usize,
    event: LinkEvent,
    output: mpsc::Sender<Chunk>,
    events: mpsc::UnboundedSender<Event>,
    report_bindings: bool,
) -> bool {
    match event {
        LinkEvent::Up(Up::Output { rank, stream, data }) => {
            output.send(Chunk::Data { rank, stream, data }).await.is_ok()
        }
        LinkEvent::Up(Up::RankStarted { rank, pid, cpus }) => {
            if report_bindings {
                let up = Up::RankStarted { rank, pid, cpus: cpus.clone() };
                let _ = events.send(Event { child, event: LinkEvent::Up(up) });
            }
            output.send(Chunk::Started { rank, pid, cpus }).await.is_ok()
        }
        LinkEvent::Up(Up::OutputEnd { rank, stream }) => {
            output.send(Chunk::End { rank, stream }).await.is_ok()
        }
        event => events.send(Event { child, event }).is_ok(),
    }
}
