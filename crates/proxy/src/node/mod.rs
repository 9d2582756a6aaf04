//! The proxy's dispatcher: the one owner of this node's state. It runs the event loop and
//! routes; the decisions live in pure state machines it owns: the [`RankTable`] (a rank's
//! verdict), each job's [`Kvs`] (puts, gets, fences, node attributes), the kill
//! [`Escalation`], and [`Children`] (the parent side, shared with the launcher). Other tasks
//! own a process's pipes or a connection and talk to it by messages.
//!
//! ```text
//!  upstream reader ──Down──►┐
//!  child link readers ─────►│ Event ──► Node ──control──► upstream pump ──► parent
//!  output hub (stream ends)►┘  ▲  │                          ▲
//!  rank PMI tasks ──PmiCall────┘  └──PmiAnswer──► ranks      │
//!  SIGCHLD, SIGTERM/HUP/INT ──► Node     output hub, child frames ┘ (data channel: credit-limited)
//! ```
//!
//! How a proxy comes up and gets its launch is in [`start`]; its child proxies, in
//! [`subtree`]; starting ranks (the launched job's and spawned jobs') in [`launch`]; what a
//! rank's PMI connection asks of the node, in [`calls`].

mod adoption;
mod bcast;
mod calls;
mod deadline;
mod gate;
mod launch;
mod parent;
mod pmix;
mod reap;
mod singleton;
mod spawned;
mod start;
mod subtree;
mod survey;
#[cfg(test)]
mod tests;
mod upstream;
mod world;

use crate::spawn::Spawner;
use adoption::Orphan;
use deadline::Deadline;
use gate::{Gate, Wait};
use parent::Parent;
pub use start::{serve, DialContext, Forked, PlainChannel, Served};
use subtree::relay_child;

use std::collections::{HashMap, HashSet};
use std::ffi::OsString;
use std::sync::Arc;
use std::time::Duration;

use nix::sys::signal::Signal;
use rlaunch_protocol::control::{Down, Job, NodePlan, Up};
use rlaunch_protocol::ids::{Gid, Stream};
use rlaunch_protocol::record::{self, FenceTimes, Micros, NodeRecord, OwnUsage, Phase};
use tokio::sync::mpsc;
use tokio::time::Instant;

use crate::kill::{Escalation, KillStep};
use crate::kvs::Kvs;
use crate::outputs::{Outputs, StreamEnd};
use crate::place::Placer;
use crate::pmi::{PmiCall, PmiJob, PmiPeer};
use crate::rank::StdinChunk;
use crate::ranks::Local;
use crate::ranks::RankTable;
use rlaunch_tree::children::{ChildNews, Children, Lost};
use rlaunch_tree::credit::Queued;
use rlaunch_tree::dialin::Dialed;
use rlaunch_tree::link::LinkEvent;
use rlaunch_tree::procs;

/// What the dispatcher hears about, besides PMI calls and signals.
pub(crate) enum Event {
    Down(Down),
    /// The parent's heartbeat (the link's own): it is alive.
    Heard,
    /// The link up (its number: 0, then one more at each adoption) closed, and why.
    UpstreamClosed(u32, String),
    /// rlaunch answered this orphan's call with a link, or could not be reached.
    Adopted(Result<Box<adoption::Rehomed>, String>),
    /// One of a rank's output streams ended, and its end went upstream.
    OutputClosed(StreamEnd),
    Child {
        child: usize,
        event: LinkEvent,
    },
    /// A child proxy dialed in (`Bootstrap::Dial`).
    Dialed(Box<Dialed>),
    /// From this node's PMIx server.
    Pmix(crate::pmix::HostNews),
    /// A rank connected to the socket of a server not started yet ([`crate::pmix::Late`]).
    PmixWanted,
    /// Process `pid` reported at the singleton trap (`crate::singleton`).
    Singleton {
        pid: i32,
        stream: tokio::net::UnixStream,
    },
    /// This node's ranks' stacks, read for survey `id`.
    Stacks {
        id: u32,
        tree: rlaunch_protocol::stacks::StackTree,
    },
}

/// How a proxy lost its parent (see `Node::lose_upstream`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Loss {
    /// A signal told the proxy to go.
    Signalled,
    /// Its link closed (or failed).
    Closed,
    /// Its parent fell silent, or rlaunch could not be reached to adopt it.
    Silent,
}

/// One rank of a job to start here.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct JobRank {
    /// Its rank in its own job (what its PMI and its variables say).
    pub(super) rank: u32,
    /// Its id in every frame: its rank for the launched job, past the launched job's for a
    /// spawned one's.
    pub(super) gid: Gid,
    pub(super) segment: u32,
}

/// The ranks of a job to start here, in local order.
pub(super) type JobRanks = Vec<JobRank>;

/// One job's state on this node: the launched job (0), and any job its ranks spawned here.
struct JobState {
    pmi: Arc<PmiJob>,
    kvs: Kvs,
    /// This node's index among the job's nodes, and how many it has.
    group: (u32, u32),
}

/// What goes to the parent: control messages, and the bounded channel that output and
/// child proxies' frames share (so backpressure reaches them).
pub(super) struct Upstream {
    control: mpsc::UnboundedSender<Up>,
    data: mpsc::UnboundedSender<Queued>,
    /// Set when the parent is lost: the pump stops writing to it and drops what comes.
    abandon: tokio::sync::watch::Sender<bool>,
    /// Set when rlaunch drops the job's output: the pump throws away the output queued for
    /// it (this node's ranks' and its child proxies') instead of writing it.
    shed_output: tokio::sync::watch::Sender<bool>,
    /// How the link up moves to rlaunch if this proxy is adopted; `None` in a unit test.
    rehome: Option<adoption::Rehome>,
}

pub(crate) struct Node {
    job: Arc<Job>,
    /// When this node reached each phase of its launch, for its record.
    phases: Vec<(Phase, Micros)>,
    /// Its open descriptors once its ranks had started, for its record.
    fds_running: u32,
    /// The launched job's fences here, for its record.
    fences: FenceTimes,
    /// This node: its index, host and ranks (its children are in `children`).
    plan: NodePlan,
    ranks: RankTable,
    children: Children,
    jobs: HashMap<u32, JobState>,
    up: Upstream,
    events: mpsc::UnboundedSender<Event>,
    pmi_calls: mpsc::UnboundedSender<(PmiPeer, PmiCall)>,
    /// Carries every local rank's output upstream.
    outputs: Outputs,
    /// Creates the ranks' processes.
    spawner: Box<dyn Spawner>,
    /// What this node's processes leave behind is this process's to kill: not in a test.
    sweeps: bool,
    kill: Escalation,
    /// When the parent was last heard from, whether the job is stopped, whether it is gone.
    parent: Parent,
    /// Whatever the ranks left behind was killed once they had all ended.
    swept: bool,
    placer: Placer,
    /// Each (job, segment)'s program, prepared once for all its ranks.
    programs:
        HashMap<(u32, u32), Result<Arc<crate::rank::Program>, rlaunch_protocol::ids::ExitOutcome>>,
    /// The `rlaunch-proxy` this proxy starts its child proxies with.
    proxy_exe: OsString,
    /// This proxy dialed its parent: its children dial it.
    dial: Option<DialContext>,
    /// Children that have not dialed in by then are lost.
    dial_deadline: Option<Instant>,
    /// What this node serves of PMIx: its server, its share of the PMIx fences, the direct
    /// modex requests it answers.
    pmix: pmix::PmixService,
    /// The trap for Open MPI's singleton start, and the reports it took.
    trap: singleton::Trap,
    /// How many of the parent's clock probes this proxy has answered (see `run`'s end).
    probes: tokio::sync::watch::Receiver<u32>,
    /// What the launched job's ranks wait for before they start, and the stdin that comes
    /// meanwhile.
    gate: Gate,
    /// Started during the run for a spawned job's ranks (`Launch::late`): no part in the
    /// launched job, its ranks or its fences.
    late: bool,
    /// A late node before the spawn it was started for: not finished, whatever it runs.
    awaiting_spawn: bool,
    /// The job went on after failures and rlaunch said it is over (`Down::Over`).
    over: bool,
    /// Where the ranks write why they failed (`TORCHELASTIC_ERROR_FILE`).
    error_dir: Option<std::path::PathBuf>,
    /// rlaunch's question of where every rank is, while the children's answers come.
    survey: Option<rlaunch_tree::survey::Gather>,
    /// PMI-1/PMI-2 requests and PMIx server news so far: the ranks' PMI activity, for
    /// `--stall-report`.
    pmi_activity: u64,
    /// Started by rlaunch itself (`Launch::top`): it never seeks adoption.
    top: bool,
    /// Whether its parent is lost and rlaunch asked to adopt it.
    orphan: Orphan,
    /// The number of the link up now: 0, then one more at each adoption.
    upstream_link: u32,
    /// The ranks' ends sent up, kept (only in a proxy that may be adopted) to be sent again.
    ends_sent: Vec<Up>,
    /// The last stdin chunk taken (`Down::Stdin`'s `seq`): one sent again is dropped.
    stdin_seen: u64,
    /// The launched job's PMI fence entry sent up and not yet answered, kept likewise.
    fence_entry: Option<(u64, Vec<(String, String)>)>,
    /// The launched job's PMIx fence entry sent up and not yet answered (epoch, served).
    pmix_entry: Option<(u64, bool)>,
    /// This node's direct modex requests not answered yet, by id (kept only in a proxy that
    /// may be adopted: sent again on adoption).
    asks_out: HashMap<u32, rlaunch_protocol::control::DmodexAsk>,
    /// Failures reaped while another rank here was dying, in order, and until when they
    /// wait for it (see `reap.rs`).
    deferred: Vec<(Local, rlaunch_protocol::ids::ExitOutcome)>,
    deferred_until: Option<Instant>,
    /// The order in which this node's ranks died, for the failures reaped together.
    deaths: rlaunch_tree::deaths::DeathOrder,
    /// The pids of the reaping pass being judged: in order, none the cause of another's
    /// end before it.
    reaping: HashSet<i32>,
    /// Spawned jobs whose fence entry went up and is not answered yet.
    job_fences_up: HashSet<u32>,
    /// This node's copies of the files broadcast before the ranks start (`--bcast`).
    copies: Option<bcast::Copies>,
    /// Its child proxies on this machine, forked with it (see `crate::fork_proxy`), by their
    /// index in the plan; taken when the children start.
    forked_children: Vec<Option<std::io::Result<rlaunch_tree::link::ForkedProxy>>>,
}

/// How long a finished node waits for its parent's clock probes before it reports.
const PROBE_WAIT: Duration = Duration::from_secs(1);

impl Node {
    async fn run(
        &mut self,
        mut events: mpsc::UnboundedReceiver<Event>,
        mut pmi: mpsc::UnboundedReceiver<(PmiPeer, PmiCall)>,
        outside: world::Outside,
    ) -> i32 {
        let world::Outside { mut ended, mut told_to_go } = outside;
        self.start_children();
        self.error_dir = crate::rank::error_dir();
        if !self.late {
            self.find_rendezvous();
            self.start_launched().await;
        }
        self.sweep_if_all_reaped();
        let mut pmix_ping = tokio::time::interval(self.job.liveness.heartbeat());
        pmix_ping.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        while !self.finished() {
            let next = self.next_deadline();
            tokio::select! {
                ev = events.recv() => match ev {
                    Some(ev) => self.handle(ev),
                    None => break,
                },
                Some((peer, call)) = pmi.recv() => {
                    self.pmi_activity += 1;
                    self.pmi_call(peer, call)
                }
                ends = ended.next() => {
                    // What a rank said before it died comes first: a protocol fault that
                    // made it exit is the story, not the exit.
                    while let Ok((peer, call)) = pmi.try_recv() {
                        self.pmi_call(peer, call);
                    }
                    self.processes_ended(ends);
                }
                Some(sig) = told_to_go.recv() => {
                    self.lose_upstream(&format!("the proxy received {sig}"), Loss::Signalled)
                }
                _ = pmix_ping.tick(), if self.pmix.serving() => self.pmix.ping(),
                _ = rlaunch_tree::sleep_until(next.map(|(at, _)| at)), if next.is_some() => {
                    let (_, which) = next.expect("a deadline");
                    if which == Deadline::ParentSilent {
                        while let Ok(ev) = events.try_recv() {
                            self.handle(ev);
                        }
                    }
                    // The dying rank the failures waited for may have been reaped just now.
                    if which == Deadline::Deferred {
                        self.processes_ended(ended.now());
                    }
                    self.on_deadline(which);
                }
            }
        }
        // Nothing of this node outlives it, whatever was left waiting.
        self.kill_leftovers(&HashSet::new());
        self.remove_bcast();
        if let Some(dir) = self.error_dir.as_deref().filter(|_| self.job.goes_on) {
            let _ =
                std::fs::remove_file(crate::rank::dead_file(dir, &self.job.jobid, self.plan.index));
        }
        if !self.parent.orphaned() {
            // The parent stamps this node's record with its clock's offset when the record
            // comes: a node done before the parent's probes were answered (a parent slow to
            // read its greeting, on a loaded machine) would be stamped unmeasured. The
            // answers go on the control path, ahead of the record. Not in a teardown: a
            // parent tearing its subtree down (itself orphaned, perhaps) may probe no more,
            // and each level's wait would add up (chaos: kill -9 rlaunch during an ssh
            // launch left proxies 3 s later).
            if !self.kill.started() {
                let probed = self.probes.wait_for(|&n| n >= rlaunch_tree::children::CLOCK_PROBES);
                if tokio::time::timeout(PROBE_WAIT, probed).await.is_err() {
                    tracing::debug!("the parent's clock probes did not all come");
                }
            }
            let record = Box::new(self.record());
            let done = Up::NodeDone { node: self.plan.index, record };
            let _ = self.up.data.send(Queued::uncredited(done));
        }
        0
    }

    /// A rank initialised PMI (PMI-1/2 init, or its PMIx client connected): noted for the
    /// record, and told to rlaunch's progress line if it shows one.
    fn pmi_initialised(&mut self, local: Local) {
        let seen = &mut self.ranks.get_mut(local).seen;
        if seen.pmi_init.is_some() {
            return;
        }
        seen.pmi_init = Some(record::now_us());
        if self.job.progress {
            let inited = self.ranks.iter().filter(|r| r.seen.pmi_init.is_some()).count();
            let (node, pmi_inited) = (self.plan.index, inited as u32);
            let _ = self.up.control.send(Up::Progress { node, pmi_inited });
        }
    }

    /// What this node saw, its children's records in it.
    fn record(&mut self) -> NodeRecord {
        let mut phases = std::mem::take(&mut self.phases);
        phases.push((Phase::Done, record::now_us()));
        NodeRecord {
            node: self.plan.index,
            host: self.plan.host.clone(),
            pid: std::process::id(),
            phases,
            ranks: self.ranks.iter().map(|r| r.seen.clone()).collect(),
            fences: std::mem::take(&mut self.fences.done),
            usage: OwnUsage { fds_running: self.fds_running, ..procs::own_usage() },
            children: self.children.take_records(),
            ..Default::default()
        }
    }

    fn handle(&mut self, ev: Event) {
        match ev {
            Event::Dialed(dialed) => {
                let Dialed { process, greeting } = *dialed;
                let host = greeting.host.clone();
                let relay = self.relay();
                let attached = self.children.attach(process, greeting, &self.job, |child| {
                    move |event| relay_child(child, event, relay.clone())
                });
                match attached {
                    Ok(_) if self.children.dialing() == 0 => self.dial_deadline = None,
                    Ok(_) => {}
                    Err(why) => tracing::warn!(%host, "dropped a proxy that dialed in: {why}"),
                }
            }
            Event::Down(down) => {
                self.parent.heard(Instant::now());
                self.handle_down(down);
            }
            Event::Heard => self.parent.heard(Instant::now()),
            Event::UpstreamClosed(link, why) if link == self.upstream_link => {
                self.lose_upstream(&why, Loss::Closed)
            }
            Event::UpstreamClosed(..) => {}
            Event::Adopted(dialed) => self.adopted(dialed),
            Event::Pmix(news) => {
                self.pmi_activity += 1;
                self.pmix_news(news)
            }
            Event::PmixWanted => self.start_late_pmix(),
            Event::Singleton { pid, stream } => self.singleton_reported(pid, stream),
            Event::Stacks { id, tree } => self.stacks_read(id, tree),
            Event::OutputClosed(end) => {
                let seen = &mut self.ranks.get_mut(end.local).seen;
                match end.stream {
                    Stream::Stdout => seen.stdout_bytes = end.bytes,
                    Stream::Stderr => seen.stderr_bytes = end.bytes,
                }
                seen.first_output = seen.first_output.into_iter().chain(end.first).min();
                self.ranks.stream_closed(end.local);
            }
            Event::Child { child, event } => {
                match self.children.on_link(child, event) {
                    Some(ChildNews::Up(Up::FenceIn { pairs, .. })) => {
                        let parties = self.child_parties();
                        let step = self.kvs(0).map(|kvs| kvs.child_entered(pairs, parties));
                        self.fence_step(0, step);
                    }
                    Some(ChildNews::Up(Up::PmixFenceIn { epoch, served })) => {
                        self.pmix_child_fence(epoch, served)
                    }
                    Some(ChildNews::Up(Up::DmodexAnswer(answer))) => {
                        self.dmodex_child_answer(answer)
                    }
                    Some(ChildNews::Up(Up::Survey { id, survey })) => {
                        self.survey_answered(child, id, *survey)
                    }
                    Some(ChildNews::Up(Up::BcastAck { bytes })) => self.bcast_acked(child, bytes),
                    // relay_child sends every other frame straight up.
                    Some(ChildNews::Up(_)) | None => {}
                    Some(ChildNews::Lost(lost)) => self.report_lost(lost),
                }
                self.dmodex_unanswerable();
                self.survey_step();
            }
        }
    }

    /// A frame of the job from the parent: a routing table, each topic's reaction in its
    /// own file (stdin and signals here, fences and answers to ranks' requests in `calls`,
    /// spawns in `launch`, PMIx in `pmix`).
    fn handle_down(&mut self, down: Down) {
        match down {
            Down::Launch(_) => tracing::warn!("ignoring a second launch"),
            Down::Stdin { seq, data } => {
                self.stdin_came(StdinChunk::Data { seq, data: data.into() })
            }
            Down::StdinEof => self.stdin_came(StdinChunk::Eof),
            Down::BcastData { offset, data } => self.bcast_data(offset, data),
            Down::BcastDone => self.bcast_done(),
            Down::Signal { signo } => self.signal_came(signo),
            Down::Terminate { grace_ms } => self.terminate(Duration::from_millis(grace_ms)),
            Down::DropOutput => self.drop_output(),
            // A late node is no party of the launched job's fences.
            Down::FenceOut { .. } | Down::PmixFencePart { .. } | Down::PmixFenceOut { .. }
                if self.late => {}
            Down::FenceOut { epoch, pairs } => self.fence_out(0, epoch, pairs),
            Down::JobFenceOut { job, epoch, pairs } => self.fence_out(job, epoch, pairs),
            Down::PmixFencePart { epoch, data } => self.pmix_fence_part(epoch, data),
            Down::PmixFenceOut { epoch, data } => self.pmix_fence_out(epoch, data),
            Down::PmixGroupFenceOut { node, members, data } => {
                self.pmix_group_fence_out(node, members, data)
            }
            Down::DmodexAsk(ask) => self.dmodex_ask(ask),
            Down::DmodexAnswer(answer) => self.dmodex_answer(answer),
            Down::Rendezvous(rendezvous) => self.rendezvous_found(rendezvous),
            Down::Spawn(sj) => self.spawn_came(*sj),
            Down::SpawnAnswer { rank, tag, outcome } => self.spawn_answer(rank, tag, outcome),
            Down::NameReply { rank, tag, answer } => self.name_reply(rank, tag, answer),
            Down::Dead { ranks } => self.ranks_dead(ranks),
            Down::Resend => self.resend(),
            Down::Over => {
                self.children.broadcast(&Down::Over);
                self.over = true;
            }
            Down::Survey { id, within_ms, stacks } => {
                self.survey_asked(id, Duration::from_millis(within_ms), stacks)
            }
        }
    }

    /// A chunk of the launcher's stdin, or its end: for the child proxies, and the local
    /// ranks that read it.
    fn stdin_came(&mut self, chunk: StdinChunk) {
        match &chunk {
            // Sent again by rlaunch to a proxy it adopted: this node (and so its subtree) had
            // it already.
            StdinChunk::Data { seq, .. } if *seq <= self.stdin_seen => return,
            StdinChunk::Data { seq, data } => {
                self.stdin_seen = *seq;
                self.children.send_stdin(*seq, data);
            }
            StdinChunk::Eof => self.children.broadcast(&Down::StdinEof),
        }
        self.stdin_to_ranks(chunk);
    }

    /// A signal the launcher forwards, for every rank of the job. A stopped job's silence
    /// means nothing, its parent's nor its PMIx server's.
    fn signal_came(&mut self, signo: i32) {
        self.children.broadcast(&Down::Signal { signo });
        let Ok(sig) = Signal::try_from(signo) else { return };
        match sig {
            Signal::SIGTSTP => self.parent.set_stopped(true),
            Signal::SIGCONT => {
                self.parent.set_stopped(false);
                self.pmix.resumed();
            }
            _ => {}
        }
        self.signal_ranks(sig);
    }

    /// rlaunch drops the job's output: what this subtree's ranks write is thrown away here.
    fn drop_output(&mut self) {
        self.children.broadcast(&Down::DropOutput);
        self.outputs.drop_all();
        let _ = self.up.shed_output.send(true);
    }

    /// Hands a chunk of the launcher's stdin (or its end) to the local ranks that read it;
    /// while they wait to start (see [`Gate`]) it waits with them.
    fn stdin_to_ranks(&mut self, chunk: StdinChunk) {
        let Some(chunk) = self.gate.hold(chunk) else { return };
        match chunk {
            StdinChunk::Data { seq, data } => {
                let stdin = self.job.stdin;
                for rank in self.ranks.iter().filter(|r| r.job == 0 && stdin.includes(r.gid.0)) {
                    let queued = rank.stdin.as_ref().is_some_and(|tx| {
                        tx.send(StdinChunk::Data { seq, data: data.clone() }).is_ok()
                    });
                    if !queued {
                        let node = self.plan.index;
                        let _ = self.up.control.send(Up::StdinAck { seq, node });
                    }
                }
            }
            StdinChunk::Eof => {
                for rank in self.ranks.iter_mut() {
                    if let Some(tx) = rank.stdin.take() {
                        let _ = tx.send(StdinChunk::Eof);
                    }
                }
            }
        }
    }

    fn signal_ranks(&self, sig: Signal) {
        for pid in self.ranks.running_pids() {
            procs::signal_group(pid, stop_as(pid, sig));
        }
    }

    /// SIGTERM now, SIGKILL after the grace period; child proxies do the same below.
    fn terminate(&mut self, grace: Duration) {
        tracing::debug!(?grace, "terminating ranks");
        let steps = self.kill.terminate(Instant::now(), grace);
        self.apply(steps);
        // Ranks that waited (for the rendezvous, their PMIx environments) never start:
        // reported so.
        if self.gate.give_up() {
            self.start_launched_ranks();
        }
    }

    /// Without a rendezvous from rlaunch, rank 0's proxy chooses one and tells every node,
    /// and the other nodes' ranks wait for it.
    fn find_rendezvous(&mut self) {
        if self.job.rendezvous.is_some() || self.plan.ranks.is_empty() {
            return;
        }
        if self.plan.ranks.iter().all(|r| r.rank != 0) {
            self.gate.wait(Wait::Rendezvous);
            return;
        }
        let addr = crate::rendezvous::own_address();
        let picked = crate::rendezvous::pick(addr).unwrap_or_else(|e| {
            // Rank 0's programs will say what is wrong with the address; the others must
            // not wait for ever.
            self.notice(format!("no free port for the rendezvous at {addr}: {e}"));
            rlaunch_protocol::control::Rendezvous { addr: addr.to_string(), port: 0, jax_port: 0 }
        });
        tracing::debug!(?picked, "rendezvous chosen");
        let _ = self.up.control.send(Up::Rendezvous(picked.clone()));
        Arc::make_mut(&mut self.job).rendezvous = Some(picked);
    }

    /// Rank 0's proxy chose the rendezvous: the ranks that waited for it start (once their
    /// PMIx environments are in, if they wait for those too).
    fn rendezvous_found(&mut self, rendezvous: rlaunch_protocol::control::Rendezvous) {
        self.children.broadcast(&Down::Rendezvous(rendezvous.clone()));
        if self.job.rendezvous.is_none() {
            Arc::make_mut(&mut self.job).rendezvous = Some(rendezvous);
        }
        if self.gate.came(Wait::Rendezvous) {
            self.start_launched_ranks();
        }
    }

    fn apply(&mut self, steps: Vec<KillStep>) {
        for step in steps {
            match step {
                KillStep::TerminateChildren(grace) => self.children.terminate(grace),
                KillStep::SignalRanks(sig) => self.signal_ranks(sig),
                KillStep::KillStragglers => {
                    // The PMIx server goes with the ranks, on purpose: not news.
                    self.drop_pmix();
                    self.kill_leftovers(&self.children.pids())
                }
                KillStep::KillChildProxies => self.children.kill_unfinished(),
                KillStep::AbandonRanks => self.abandon_unkilled_ranks(),
                KillStep::GiveUp => tracing::warn!("giving up on what is left of this node"),
            }
        }
    }

    /// The parent is gone, or this proxy was told to go (a signal): the node goes down.
    /// `unreachable` (the loss is not a signal): the parent cannot read any more (its link
    /// closed or went silent), so what is still sent up is dropped rather than left to block
    /// the teardown behind a socket that will never drain. A signalled proxy keeps sending:
    /// its parent wants the ranks' ends (a scheduler signals every task of a job at once).
    /// A proxy below the top seeks adoption instead (see `adoption`); one going down lets
    /// its children go, so that they may be adopted, if its link closed (its ssh client was
    /// killed; rlaunch refused it): not if its parent fell silent (rlaunch stopped or cut
    /// off, which no child could reach either) or rlaunch could not be reached.
    fn lose_upstream(&mut self, why: &str, loss: Loss) {
        let unreachable = loss != Loss::Signalled;
        if unreachable && self.may_seek_adoption() {
            return self.seek_adoption(why, loss);
        }
        if unreachable && matches!(self.orphan, Orphan::Seeking(_)) {
            // The lost parent's link, closing after its silence: already acted on.
            return;
        }
        if unreachable {
            // Replaced, not sent: the node reads the switch itself (its parent is watched no
            // more), whether or not the pump still listens.
            self.up.abandon.send_replace(true);
        }
        if !self.parent.lose(unreachable) {
            return;
        }
        tracing::debug!("lost upstream: {why}");
        if loss == Loss::Closed && self.job.goes_on && self.job.adoption.is_some() {
            // Its children may be adopted by rlaunch: they are let go, not taken down.
            self.children.release();
        }
        self.terminate(Duration::from_millis(self.job.kill_grace_ms));
    }

    fn report_lost(&mut self, Lost { host, reason, came_up }: Lost) {
        let _ = self.up.control.send(Up::ProxyLost { host, reason, came_up });
        // Its subtree is fed no more: the others' acknowledgements of the broadcast files
        // may be the least now.
        self.bcast_step();
        if self.job.goes_on {
            // Its subtree's ranks have failed, and the job goes on: the fences under way no
            // longer wait for it, and may be complete now.
            let parties = self.child_parties();
            let step = self.kvs(0).map(|kvs| kvs.recount(parties));
            self.fence_step(0, step);
            if self.job.pmix.is_some() && !self.late {
                self.pmix_fence_recount();
            }
        }
    }

    fn finished(&self) -> bool {
        // With the job going on after failures, a node whose ranks all ended is still a
        // party of the survivors' fences: it waits to be told the job is over.
        let released = !self.job.goes_on || self.over || self.kill.started();
        self.kill.gave_up()
            || (!self.awaiting_spawn
                && !self.holding_ranks()
                && self.ranks.finished()
                && self.children.settled()
                && released)
    }
}

/// The signal that does what `sig` asks of rank `pid`'s process group. A rank that leads a
/// session of its own (`Spawn::own_session`) has a process group with no parent outside it in
/// its session (it is "orphaned"), and the kernel discards a terminal stop (SIGTSTP, SIGTTIN,
/// SIGTTOU) whose action there is the default: a rank that does not catch it is sent SIGSTOP
/// instead (the same stop for a rank in the proxy's session), one that does gets it, for its
/// handler.
fn stop_as(pid: i32, sig: Signal) -> Signal {
    let stop = matches!(sig, Signal::SIGTSTP | Signal::SIGTTIN | Signal::SIGTTOU);
    if stop && !catches(pid, sig) {
        Signal::SIGSTOP
    } else {
        sig
    }
}

/// Whether process `pid` has a handler for `sig` (`SigCgt` in /proc/PID/status).
fn catches(pid: i32, sig: Signal) -> bool {
    let Ok(status) = std::fs::read_to_string(format!("/proc/{pid}/status")) else { return false };
    let caught = status.lines().find_map(|l| l.strip_prefix("SigCgt:"));
    let mask = caught.and_then(|m| u64::from_str_radix(m.trim(), 16).ok()).unwrap_or(0);
    mask & (1 << (sig as i32 - 1)) != 0
}
