//! The root of the control tree: the one owner of the job's state. It starts the top
//! proxies, routes stdin and signals down, collects exits, and alone decides when the job
//! ends and with which status.
//!
//! ```text
//!  link readers ──Up (control)──►┐                       ┌──► link pumps ──► proxies
//!  link readers ──Output──► output thread (by credit)    │
//!  stdin thread ──chunks (credit window)──► Root ──Down──┘
//!  signals, SIGCHLD, timeout ─────────────► Root
//! ```
//!
//! The parent side (starting proxies, a lost proxy, routing down) is the proxies' own
//! [`Children`]; a fence is the proxies' [`FenceFold`]. Here: [`start`] (the top proxies),
//! [`dial`] (proxies that call back), [`roll`] (every process of the run), [`cause`] (why
//! the job ends, and its exit status), [`ending`] (the teardown and the last word),
//! [`names`] (publish and lookup), [`spawn`], [`signals`]. The loop runs in a [`World`]: this
//! process's in [`run`], one of in-memory links in a test.

mod adopt;
mod attempt;
mod bcast;
mod bindings;
mod cause;
mod deadline;
mod dial;
mod ending;
mod hang;
mod names;
mod pmix_fence;
mod policy;
pub mod progress;
pub mod report;
mod roll;
mod signals;
mod spawn;
mod stacks;
mod start;
mod stdin_flow;
mod teardown;
#[cfg(test)]
mod tests;
mod timeline;
mod world;

use rlaunch_protocol::ids::{Gid, NodeId};
use std::collections::{BTreeSet, HashMap, HashSet};
use std::ffi::OsString;
use std::io;
use std::time::Duration;

use rlaunch_protocol::control::{DmodexData, Down, Job, NameOp, NodePlan, StdinTarget, Up};
use rlaunch_tree::children::{Answered, ChildNews, Children, Fence};
use rlaunch_tree::dialin::Dialed;
use rlaunch_tree::fence::FenceFold;
use rlaunch_tree::link::{ForkedProxy, LinkEvent};
use rlaunch_tree::procs;
use tokio::sync::{mpsc, watch};
use tokio::time::Instant;

use crate::output::{self, Feed, OutputEvent, OutputSpec, Roster, SpawnedJob};
use crate::stdin;
use cause::Cause;
pub(crate) use dial::reaching;
pub use dial::DialPlan;
use names::{Asker, Names};
use policy::Policy;
use report::OutFile;
use rlaunch_protocol::record::Micros;
use roll::Roll;
pub use start::fork_local_proxies;
use start::route;
use teardown::Teardown;
use world::World;

/// After the kill grace, how long proxies get to report before rlaunch kills them.
const PROXY_GRACE: Duration = Duration::from_secs(5);
/// After the kill grace of a job that failed, how long its output may take to be written
/// before what is left is dropped: less than [`PROXY_GRACE`], so that a slow reader does not
/// get the proxies killed.
const OUTPUT_GRACE: Duration = Duration::from_secs(4);
/// After [`OUTPUT_GRACE`], how often to look again whether the writer is behind.
const OUTPUT_RECHECK: Duration = Duration::from_millis(250);

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
    /// `--hang-report`: what a job that times out says first.
    pub hang_report: crate::options::HangReport,
    /// `--stall-report`: how long a job may do nothing before it says where it is.
    pub stall_report: Option<Duration>,
    /// Proxies already forked for some of `roots` (by index), by [`fork_local_proxies`].
    pub forked: Vec<Option<io::Result<ForkedProxy>>>,
    /// Start every proxy with one launcher (srun), and have them dial back.
    pub dial: Option<DialPlan>,
    /// One line each, for the user, about how the job was laid out.
    pub notices: Vec<String>,
    /// `--report FILE`, opened.
    pub report: Option<OutFile>,
    /// `--timeline FILE`, opened.
    pub timeline: Option<OutFile>,
    /// rlaunch's command line, for the report.
    pub command: Vec<String>,
    /// When rlaunch began to build the job, on its clock: the job's start in the report.
    pub started_us: Micros,
    /// The hosts spawned ranks are placed on, and where the next go.
    pub(crate) universe: crate::place::Universe,
    /// This machine's name: a proxy started during the run (for spawned ranks) on it is
    /// forked, unless `forced_remote` (a launcher named on the command line).
    pub own_host: String,
    pub forced_remote: bool,
    /// `--tracker rabit`: its listener, served while the job runs.
    pub(crate) tracker: Option<crate::tracker::Listener>,
    /// `--restart-backoff` (`--max-restarts` is the job's, its proxies set the variables).
    pub restart_backoff: Duration,
    /// Hosts that take a lost node's ranks on a restart, in the order they are used.
    pub spares: Vec<String>,
    /// The listener for orphaned proxies and the secret they prove, bound before the local
    /// proxies were forked (see [`adopt`]).
    pub(crate) orphan_listener: Option<(std::net::TcpListener, rlaunch_tree::secure::Secret)>,
    /// `--bcast`'s files, opened, with their lengths: the root feeds the tree from them.
    pub bcast_files: Vec<rlaunch_tree::bcast::SourceFile>,
}

/// What a link to a top proxy reports (its output goes straight to the writer thread).
struct Event {
    child: usize,
    /// The attempt whose link it is: a link of an earlier one may still speak (its end, its
    /// last stderr) after the next attempt's children took its place.
    attempt: u32,
    event: LinkEvent,
}

/// `--tracker rabit` as the Root serves it: a task per attempt on one listener.
struct Tracker {
    listener: crate::tracker::Listener,
    news: mpsc::UnboundedSender<crate::tracker::News>,
    task: tokio::task::JoinHandle<()>,
}

struct Root {
    plan: Plan,
    /// The live progress line, on a terminal.
    progress: Option<progress::Progress>,
    children: Children,
    roll: Roll,
    /// What the job does about failures and signals, and why it ends.
    policy: Policy,
    /// When this attempt began (rlaunch's start for the first).
    attempt_began: Micros,
    /// The attempts that ended in a restart, for `--report` and the timeline.
    attempts: Vec<report::AttemptFacts>,
    /// When the next attempt starts, while the job waits to restart.
    restart_at: Option<Instant>,
    /// The ranks that failed while the job went on (`--on-failure continue`).
    dead: rlaunch_protocol::stacks::RankSet,
    /// Where proxies that dial in are handed, for each attempt's launcher.
    dialed: Option<mpsc::UnboundedSender<Dialed>>,
    /// Where orphaned proxies that dial in are handed (see [`adopt`]).
    orphans: Option<mpsc::UnboundedSender<Dialed>>,
    /// rlaunch listens for orphaned proxies: who was adopted, who may still call.
    adopting: Option<adopt::Adopting>,
    /// `--tracker rabit`: its listener (each attempt is served afresh on it), where its news
    /// goes, and the task serving this attempt.
    tracker: Option<Tracker>,
    /// Once the job ends: when the output is dropped and the proxies left are killed.
    teardown: Teardown,
    /// Tells the link readers and the writer thread that the output is dropped.
    drop_output: watch::Sender<bool>,
    timeout_at: Option<Instant>,
    stdin: stdin_flow::StdinFlow,
    /// The launched job's fence: one party per top proxy.
    fence: FenceFold,
    /// The launched job's PMIx fence: one party (a subtree's data) per top proxy.
    pmix_fence: pmix_fence::PmixFence,
    /// PMIx fences over other processes (global ids, sorted): the nodes in so far, and
    /// their data.
    group_fences: HashMap<Vec<Gid>, (BTreeSet<NodeId>, Vec<u8>)>,
    names: Names,
    /// Tells the output writer about each spawned job before its ranks start.
    spawned_jobs: std::sync::mpsc::Sender<SpawnedJob>,
    /// The launchers (srun) that started the proxies that dial in, and how each ended: the
    /// first proxies', then one for each proxy started during the run.
    launchers: Vec<dial::Launcher>,
    /// A proxy was lost (killed, silent, its link broken): a launcher's task that may live
    /// on, stopped or hung, which only the end of its step ends.
    proxy_lost: bool,
    /// Where the proxies that dial in reach rlaunch, while the job runs.
    listening: Option<dial::Listening>,
    /// Proxies that have not dialed in by then are lost.
    dial_deadline: Option<Instant>,
    /// The tree of a dialing launch: where each proxy that dials in goes.
    dial_tree: dial::DialTree<Dialed>,
    /// Spawned jobs on their way, and fences of those over several nodes.
    spawns: spawn::Spawns,
    /// How its proxies start (the world's).
    proxies: Box<dyn world::Proxies>,
    /// Where a proxy started during the run sends its link's news and its output.
    links: Option<(mpsc::UnboundedSender<Event>, Feed)>,
    /// `--tracker rabit`: which workers started with it, and which ranks ended without.
    turnout: Option<crate::tracker::rabit::Turnout>,
    /// The tracker's rendezvous, once every worker's links were assigned.
    tracker_span: Option<(Micros, Micros)>,
    /// True once the job began to end for a cause: what breaks after that (a connection to
    /// the tracker from a rank being killed) is the teardown's doing, not news.
    ending: watch::Sender<bool>,
    /// The ranks' output on rlaunch's stderr ended mid-line (a rank's last line cut short):
    /// rlaunch's own last words start on a line of their own.
    output_mid_line: bool,
    /// The proxies' answers to where every rank is, while they come, and who waits for
    /// them (`--timeout`'s report, `rlaunch ps`).
    survey: Option<rlaunch_tree::survey::Gather>,
    surveyed_for: Vec<hang::Wanted>,
    /// Who waits for the next survey: they want the stacks, and the one on its way has none.
    survey_next: Vec<hang::Wanted>,
    /// Surveys asked so far: the next one's id.
    surveys: u32,
    /// The report made at the timeout, for `--report` and the timeline.
    hang: Option<hang::HangFacts>,
    /// `--stall-report`: the job's activity at the last look, and when to look again.
    stall: Option<hang::StallWatch>,
    /// `--bcast`: the files, and how far each top proxy has them.
    bcast: Option<bcast::Broadcast>,
    /// Nodes that said they had started their ranks, this attempt, and rlaunch's open
    /// descriptors once every node had (for `--report`).
    nodes_started: usize,
    fds_running: u32,
}

impl Root {
    /// A Root for `plan`, before anything runs: no child, no process, no thread of its own.
    /// `run` gives it its world; a unit test drives it with events (see `job/tests/`).
    fn new(
        plan: Plan,
        progress: Option<progress::Progress>,
        drop_output: watch::Sender<bool>,
        spawned_jobs: std::sync::mpsc::Sender<SpawnedJob>,
    ) -> Root {
        Root {
            progress,
            timeout_at: plan.timeout.map(|t| Instant::now() + t),
            roll: Roll::new(&plan.job, &plan.roots, plan.node_hosts.clone()),
            children: Children::default(),
            policy: Policy::new(
                Duration::from_millis(plan.job.kill_grace_ms),
                policy::Restarts {
                    max: plan.job.max_restarts,
                    backoff: plan.restart_backoff,
                    goes_on: plan.job.goes_on,
                },
            ),
            attempt_began: plan.started_us,
            attempts: Vec::new(),
            restart_at: None,
            dead: Default::default(),
            dialed: None,
            orphans: None,
            adopting: None,
            tracker: None,
            teardown: Teardown::default(),
            drop_output,
            stdin: stdin_flow::StdinFlow::new(
                plan.job.stdin != StdinTarget::None,
                (plan.rank_node.iter().enumerate())
                    .filter(|(rank, _)| plan.job.stdin.includes(*rank as u32))
                    .map(|(_, &node)| NodeId(node)),
            ),
            fence: FenceFold::default(),
            pmix_fence: pmix_fence::PmixFence::default(),
            group_fences: HashMap::new(),
            names: Names::default(),
            spawned_jobs,
            launchers: Vec::new(),
            proxy_lost: false,
            listening: None,
            dial_deadline: None,
            dial_tree: dial::DialTree::default(),
            spawns: spawn::Spawns::default(),
            links: None,
            proxies: Box::new(world::NoProxies),
            turnout: None,
            tracker_span: None,
            ending: watch::channel(false).0,
            output_mid_line: false,
            survey: None,
            surveyed_for: Vec::new(),
            survey_next: Vec::new(),
            surveys: 0,
            hang: None,
            stall: plan.stall_report.map(hang::StallWatch::new),
            bcast: None,
            nodes_started: 0,
            fds_running: 0,
            plan,
        }
    }
}

/// Runs the job to the end in this process's world; returns rlaunch's exit status.
pub async fn run(mut plan: Plan) -> i32 {
    procs::become_subreaper();
    let world = World::of_this_process(&mut plan);
    run_in(plan, world).await
}

/// Runs the job to the end in `world`; returns rlaunch's exit status.
async fn run_in(mut plan: Plan, world: World) -> i32 {
    let World { proxies, signals: mut forwarded, mut stdin, mut ended, asks } = world;
    // The socket stays until the job's end (`_listening` is dropped with this function).
    let (mut asks, _listening) = match asks {
        Some((asks, listening)) => (Some(asks), Some(listening)),
        None => (None, None),
    };
    let (events_tx, mut events) = mpsc::unbounded_channel();

    let (drop_output, dropped) = watch::channel(false);
    let (output_tx, output_rx) = output::feed(dropped.clone(), &plan.output);
    let (output_events_tx, mut output_events) = mpsc::unbounded_channel();
    let (spawned_jobs, spawned_rx) = std::sync::mpsc::channel();
    let roster = Roster::new(
        plan.job.jobid.clone(),
        plan.node_hosts.clone(),
        plan.rank_node.clone(),
        spawned_rx,
    );
    let progress = plan.job.progress.then(|| progress::Progress::start(&plan.roots));
    let mut writer =
        output::Writer::new(std::mem::take(&mut plan.output), roster, output_events_tx, dropped);
    writer.clear_first(progress.as_ref().map(|p| p.handle()));
    let writer = std::thread::spawn(move || writer.run(output_rx));

    let mut root = Root::new(plan, progress, drop_output, spawned_jobs);
    root.proxies = proxies;
    let (tracker_news_tx, mut tracker_news) = mpsc::unbounded_channel();
    if let Some(listener) = root.plan.tracker.take() {
        root.serve_tracker(listener, tracker_news_tx);
    }
    let (dialed_tx, mut dialed) = mpsc::unbounded_channel();
    root.dialed = Some(dialed_tx.clone());
    let (orphans_tx, mut orphans) = mpsc::unbounded_channel();
    root.orphans = Some(orphans_tx);
    root.start_proxies(&events_tx, &output_tx, dialed_tx);
    if stdin.is_none() && root.stdin.open {
        root.stdin.open = false;
        root.children.broadcast(&Down::StdinEof);
    }

    loop {
        if root.finished() {
            // The attempt is over: the job may start again, now or after a wait.
            if root.restart_at.is_none() {
                root.decide(policy::Event::Settled);
            }
            if root.restart_at.is_none() {
                break;
            }
        }
        // Every proxy is done and srun lingers: it gets the grace proxies get, then is asked
        // to end its step; at once if a proxy was lost (its task may never end by itself).
        let lingering = root.launchers.iter().any(|l| l.ended.is_none());
        if lingering && root.children.settled() {
            root.teardown.launcher_lingers(Instant::now(), root.proxy_lost);
        }
        // The files go down as far as each subtree's window allows, whatever came last.
        root.bcast_step();
        let stdin_ready = root.stdin.room();
        let next = root.next_deadline();
        tokio::select! {
            ev = events.recv() => match ev {
                Some(ev) => root.handle(ev),
                None => break,
            },
            Some(proxy) = dialed.recv() => root.attach(proxy, &events_tx, &output_tx),
            Some(proxy) = orphans.recv() => root.adopt(proxy, &events_tx, &output_tx),
            Some(news) = tracker_news.recv() => root.tracker_news(news),
            Some(event) = output_events.recv() => match event {
                OutputEvent::StdoutClosed => root.fail(Cause::StdoutClosed),
                OutputEvent::FileFailed(failure) => root.fail(Cause::OutputFile(failure)),
            },
            chunk = stdin::next(&mut stdin), if stdin_ready => root.stdin_chunk(chunk),
            ends = ended.next() => {
                for end in ends {
                    root.process_ended(end);
                }
            }
            Some(sig) = forwarded.recv() => root.decide(policy::Event::Signal(sig)),
            Some(asked) = next_ask(&mut asks) => root.asked(asked),
            _ = rlaunch_tree::sleep_until(next.map(|(at, _)| at)), if next.is_some() => {
                let writer_behind = output_tx.writer_behind();
                root.on_deadline(next.expect("a deadline").1, writer_behind);
            }
        }
    }

    if let Some(listening) = &root.listening {
        listening.acceptor.abort();
    }
    if let Some(adopting) = &root.adopting {
        adopting.stop();
    }
    // The tracker's port closes with the job.
    if let Some(tracker) = root.tracker.take() {
        tracker.task.abort();
    }
    root.children.stop_links().await;
    // The writer ends once every sender of output is gone, the one kept for late proxies too.
    root.links = None;
    drop(output_tx);
    // Every sender is gone, so the writer is flushing its last bytes: wait for it right here
    // (a blocking-pool thread just for this costs more than the wait).
    root.output_mid_line = writer.join().unwrap_or(false);
    // The last lines may have met a file that could not be written: the job ended anyway,
    // but not with the output it asked for.
    let mut late = Vec::new();
    while let Ok(event) = output_events.try_recv() {
        if let OutputEvent::FileFailed(failure) = event {
            late.push(Cause::OutputFile(failure));
        }
    }
    root.decide(policy::Event::After { late });
    // The proxies were this process's children: whatever they left behind goes.
    if ended.of_this_process() {
        procs::kill_descendants(&HashSet::new());
    }
    root.report()
}

/// The next request from `rlaunch ps` or `rlaunch stacks`; never, without a socket.
async fn next_ask(
    asks: &mut Option<mpsc::UnboundedReceiver<crate::ctl::Asked>>,
) -> Option<crate::ctl::Asked> {
    match asks {
        Some(asks) => asks.recv().await,
        None => std::future::pending().await,
    }
}

impl Root {
    /// Every proxy is finished, and so is each launcher that started some.
    fn finished(&self) -> bool {
        self.children.settled() && self.launchers.iter().all(|l| l.ended.is_some())
    }

    fn handle(&mut self, Event { child, attempt, event }: Event) {
        if attempt != self.policy.attempt() {
            return tracing::debug!(attempt, child, "news from an earlier attempt's link");
        }
        match &event {
            // A node's PMIx fence data counts from the link that leads to it now: an adopted
            // proxy sends it again on its own, and what the old path still brings would add
            // a second copy (or a former parent's copy of it would cut it short).
            LinkEvent::Up(Up::PmixFencePart { node, .. } | Up::PmixFenceAgain { node, .. })
                if self.children.route(*node) != Some(child) =>
            {
                return tracing::debug!(%node, child, "PMIx fence data from an old path");
            }
            // A top proxy's subtree is done: its ranks read no more stdin.
            LinkEvent::Up(Up::NodeDone { node, .. }) => {
                let plan = self.plan.roots.iter().flat_map(|r| r.walk()).find(|n| n.index == *node);
                for done in plan.map(|p| p.walk()).unwrap_or_default() {
                    self.stdin.node_gone(done.index);
                }
            }
            _ => {}
        }
        match self.children.on_link(child, event) {
            Some(ChildNews::Up(Up::Survey { id, survey })) => {
                self.survey_answered(child, id, *survey)
            }
            Some(ChildNews::Up(Up::BcastAck { bytes })) => self.bcast_acked(child, bytes),
            // An adopted orphan's entry of a fence that completed while it was on its way.
            Some(ChildNews::Up(Up::FenceIn { epoch, .. })) if epoch < self.fence.epoch() => {
                self.answer_late_entry(child, false, epoch)
            }
            Some(ChildNews::Up(Up::PmixFenceIn { epoch, .. }))
                if epoch < self.pmix_fence.epoch() =>
            {
                self.answer_late_entry(child, true, epoch)
            }
            Some(ChildNews::Up(up)) => self.handle_up(up),
            Some(ChildNews::Lost(lost)) => self.proxy_lost(lost),
            None => {}
        }
        self.dmodex_unanswerable();
        self.survey_step();
    }

    /// Direct modex requests sent to a subtree that finished or was lost without answering
    /// them (it ended as they went down) fail now, rather than leave their rank waiting.
    fn dmodex_unanswerable(&mut self) {
        for ask in self.children.unanswerable() {
            if !self.park_ask(ask.clone()) {
                self.children.send_toward_node(ask.asker, Down::DmodexAnswer(ask.missing()));
            }
        }
    }

    fn handle_up(&mut self, up: Up) {
        match up {
            Up::RankExited { rank, pid, outcome, unfinalized, usage } => {
                if self.adopting.is_some() && self.roll.ended(rank) {
                    // Sent again by an adopted orphan's subtree, or its node's end came first.
                    return tracing::debug!(%rank, "a rank's end heard already");
                }
                if !self.roll.record(rank, pid, outcome, usage, self.teardown.started()) {
                    tracing::warn!(%rank, "exit report for an unknown rank");
                    return;
                }
                tracing::debug!(%rank, pid, %outcome, unfinalized, "rank ended");
                self.names.forget(rank);
                let clean = outcome == rlaunch_protocol::ids::ExitOutcome::Exited(0);
                if let Some(absent) =
                    self.turnout.as_mut().filter(|_| clean).and_then(|r| r.ended(rank.0))
                {
                    self.fail(Cause::TrackerAbsent { rank: Gid(absent) });
                }
                let failure = cause::rank_end(rank, pid, outcome, unfinalized);
                self.decide(policy::Event::RankEnded { outcome, failure });
            }
            Up::RankError { rank, report } => self.roll.set_error(rank, &report),
            Up::StdinAck { seq, node } => self.stdin.acked(seq, node),
            // The old link of a proxy rlaunch adopted since: it lives on.
            Up::ProxyLost { host, .. } if self.adopted_host(&host) => {
                tracing::debug!(%host, "an adopted proxy's old link is gone")
            }
            Up::ProxyLost { host, reason, came_up } => {
                self.fail(Cause::LostProxy { host, reason, came_up })
            }
            Up::Unplaceable { host, why } => self.fail(Cause::Unplaceable { host, why }),
            Up::BcastFailed { host, why } => self.fail(Cause::Bcast { host: Some(host), why }),
            Up::StdoutClosed => self.fail(Cause::StdoutClosed),
            Up::Singleton { rank, pid } => self.fail(Cause::Singleton { rank, pid }),
            Up::Notice { host, text } => eprintln!("rlaunch: note: on {host}: {text}"),
            Up::Started { node } => {
                tracing::debug!(%node, "node started its ranks");
                self.nodes_started += 1;
                if self.nodes_started == self.plan.node_hosts.len() {
                    self.fds_running = rlaunch_tree::procs::open_fds();
                }
                if let Some(progress) = self.progress.as_mut() {
                    progress.node_started(node);
                }
            }
            Up::Progress { node, pmi_inited } => {
                if let Some(progress) = self.progress.as_mut() {
                    progress.node_progress(node, pmi_inited);
                }
            }
            Up::Listening { node, address } => self.listening(node, address),
            Up::FenceIn { epoch, pairs } => {
                if epoch != self.fence.epoch() {
                    let expected = self.fence.epoch();
                    tracing::warn!(epoch, expected, "fence entry for another epoch");
                }
                self.fence.arrive(pairs);
                self.pmi_fence_step();
            }
            Up::PmixFencePart { epoch, node, data } => {
                if let Err(too_large) = self.pmix_fence.part(epoch, node, &data) {
                    self.fail(Cause::PmixFenceTooLarge(too_large));
                }
            }
            Up::PmixFenceAgain { epoch, node } => self.pmix_fence.again(epoch, node),
            Up::PmixFenceIn { epoch, served } => {
                self.pmix_fence.arrive(epoch, served);
                self.pmix_fence_step();
            }
            Up::Name { rank, tag, op } => {
                // A lookup of a rank that ended on its way here is nobody's: parked, it would
                // take a value published for one read.
                if matches!(op, NameOp::Lookup { .. }) && self.roll.ended(rank) {
                    return tracing::debug!(%rank, "a lookup of a rank that ended is dropped");
                }
                let answers = self.names.serve(Asker { rank, tag }, op, Instant::now());
                self.name_answers(answers);
            }
            Up::Abort { rank, pid, code, msg } => {
                self.fail(Cause::Aborted { rank, pid, code, msg })
            }
            Up::PmiFault { rank, pid, what } => self.fail(Cause::PmiFault { rank, pid, what }),
            Up::Spawn { rank, tag, request } => self.spawn(rank, tag, request),
            Up::Rendezvous(rendezvous) => {
                tracing::debug!(?rendezvous, "rank 0's proxy chose the rendezvous");
                if let Some(adopting) = self.adopting.as_mut() {
                    adopting.rendezvous = Some(rendezvous.clone());
                }
                self.children.broadcast(&Down::Rendezvous(rendezvous));
            }
            Up::SpawnStarted { job, node, refused } => self.spawn_started(job, node, refused),
            Up::JobFenceIn { job, epoch, pairs } => self.job_fence(job, epoch, pairs),
            Up::PmixGroupFenceIn { node, members, data } => {
                self.pmix_group_fence(node, members, data)
            }
            Up::DmodexAsk(ask) => {
                let (asker, missing) = (ask.asker, ask.missing());
                if !self.children.send_ask(ask) {
                    // A rank of no subtree, or of one that is finished or lost: nothing will
                    // ever answer.
                    self.children.send_toward_node(asker, Down::DmodexAnswer(missing));
                }
            }
            Up::DmodexAnswer(answer) => {
                let Answered::Settled(ask) = self.children.answered(&answer) else {
                    return tracing::debug!(asker = %answer.asker, "a direct modex request asked again");
                };
                // Missing in a subtree that lost the rank's node's parent: it may be adopted.
                if let Some(ask) = ask.filter(|_| matches!(answer.data, DmodexData::Missing)) {
                    if self.park_ask(ask) {
                        return;
                    }
                }
                self.children.send_toward_node(answer.asker, Down::DmodexAnswer(answer));
            }
            Up::RankStarted { rank, pid, cpus, gpus } => self.report_binding(rank, pid, cpus, gpus),
            // Taken before they get here: output by the writer's path, a subtree's end by
            // `Children`.
            Up::Output { .. } | Up::OutputEnd { .. } | Up::NodeDone { .. } => {}
            // Taken by `handle` with the child it came from.
            Up::Survey { .. } | Up::BcastAck { .. } => {}
        }
    }

    /// Once every top proxy is in the launched job's PMI fence, its pairs go down.
    /// While nodes below a lost one may still be adopted, no fence completes (see [`adopt`]).
    pub(super) fn pmi_fence_step(&mut self) {
        if self.orphans_pending() {
            return;
        }
        let parties = self.children.fence_parties(Fence::Pmi, self.fence.epoch());
        if let Some((epoch, pairs)) = self.fence.complete(parties) {
            // Inside the macro: summed only when the event is logged.
            let bytes = || pairs.iter().map(|(k, v)| k.len() + v.len()).sum::<usize>();
            tracing::debug!(epoch, pairs = pairs.len(), bytes = bytes(), "fence complete");
            if let Some(adopting) = self.adopting.as_mut() {
                adopting.last_pmi = Some((epoch, pairs.clone()));
            }
            self.children.broadcast(&Down::FenceOut { epoch, pairs });
            self.fence.finish(epoch);
        }
    }

    /// Once every live top proxy is in the launched job's PMIx fence, every node's data goes
    /// down in parts.
    pub(super) fn pmix_fence_step(&mut self) {
        if self.orphans_pending() {
            return;
        }
        let parties = self.children.fence_parties(Fence::Pmix, self.pmix_fence.epoch());
        if let Some((epoch, parts)) = self.pmix_fence.complete(parties) {
            let bytes: usize = parts.iter().map(Vec::len).sum();
            tracing::debug!(epoch, bytes, "PMIx fence complete");
            if let Some(adopting) = self.adopting.as_mut() {
                adopting.last_pmix = Some((epoch, parts.clone()));
            }
            for down in pmix_fence_downs(epoch, parts) {
                self.children.broadcast(&down);
            }
        }
    }

    /// Node `node` entered a PMIx fence over `members` (Open MPI's disconnect of parents and
    /// children, say): complete once every node that hosts a member is in, and sent to each.
    fn pmix_group_fence(&mut self, node: NodeId, members: Vec<Gid>, data: Vec<u8>) {
        let nodes: BTreeSet<NodeId> = members.iter().filter_map(|&r| self.roll.node(r)).collect();
        let (arrived, blobs) = self.group_fences.entry(members.clone()).or_default();
        arrived.insert(node);
        blobs.extend_from_slice(&data);
        if !nodes.is_subset(arrived) {
            return;
        }
        let (_, data) = self.group_fences.remove(&members).expect("just seen");
        tracing::debug!(members = members.len(), nodes = nodes.len(), "PMIx group fence complete");
        for node in nodes {
            let down =
                Down::PmixGroupFenceOut { node, members: members.clone(), data: data.clone() };
            self.children.send_toward_node(node, down);
        }
    }

    /// Answers name-service requests, each toward its rank, if it is still there to hear.
    fn name_answers(&self, answers: Vec<(Asker, names::NameAnswer)>) {
        for (Asker { rank, tag }, answer) in answers {
            if self.roll.ended(rank) {
                tracing::debug!(%rank, "no answer to a rank that ended");
                continue;
            }
            self.children.send_toward_rank(rank, Down::NameReply { rank, tag, answer });
        }
    }

    fn tracker_news(&mut self, news: crate::tracker::News) {
        match news {
            crate::tracker::News::Error { rank, msg } => {
                self.fail(Cause::TrackerError { rank: Gid(rank), msg })
            }
            crate::tracker::News::Assigned { first, all } => self.tracker_span = Some((first, all)),
            crate::tracker::News::Started { rank } => {
                if let Some(absent) = self.turnout.as_mut().and_then(|r| r.started(rank)) {
                    self.fail(Cause::TrackerAbsent { rank: Gid(absent) });
                }
            }
        }
    }

    fn stdin_chunk(&mut self, chunk: Option<Vec<u8>>) {
        match chunk {
            Some(data) => {
                let seq = self.stdin.sent(&data);
                self.children.send_stdin(seq, &data);
            }
            None => {
                self.stdin.open = false;
                self.children.broadcast(&Down::StdinEof);
            }
        }
    }

    /// A process of the world ended: the scheduler's launcher, or a proxy.
    fn process_ended(&mut self, procs::Ended { pid, outcome, .. }: procs::Ended) {
        if let Some(launcher) = self.launchers.iter_mut().find(|l| l.pid == pid) {
            launcher.ended = Some(outcome);
            tracing::debug!(launcher = %launcher.name, %outcome, "launcher ended");
            let (name, late) = (launcher.name.clone(), launcher.late);
            self.launcher_ended(late, &format!("{name} {outcome} before its proxy called back"));
        } else if let Some(lost) = self.children.reaped(pid, outcome) {
            self.proxy_lost(lost);
        }
        self.dmodex_unanswerable();
    }
}

/// What goes down once PMIx fence `epoch` is complete: every node's data in `parts`, the
/// last in the `PmixFenceOut`.
fn pmix_fence_downs(epoch: u64, mut parts: Vec<Vec<u8>>) -> impl Iterator<Item = Down> {
    let out = Down::PmixFenceOut { epoch, data: parts.pop().unwrap_or_default() };
    parts.into_iter().map(move |data| Down::PmixFencePart { epoch, data }).chain([out])
}
