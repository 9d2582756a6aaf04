//! The parent side of the control tree, shared by the launcher (the root) and every proxy:
//! starting child proxies, the parent's view of each, routing frames down to the subtree that
//! holds a rank or a node, noticing a lost child, and killing children that do not finish.
//!
//! ```text
//!  owner (Root or Node) ──start(plans)──► Children ──Down──► link pump ──► child proxy
//!        ▲                                   ▲
//!        └── ChildNews (Up, Lost) ◄─ on_link ┘◄── LinkEvent ◄── link reader ◄──┘
//!                                    reaped  ◄── SIGCHLD (the owner reaps)
//! ```
//!
//! What a child's frames mean is the owner's business; what a child's link and process
//! say about the child itself (greeting, stderr, end of file, exit) is decided here.

mod state;

use std::collections::{HashMap, HashSet};
use std::io;
use std::ops::Range;
use std::sync::Arc;
use std::time::Duration;

use nix::sys::signal::Signal;
use rlaunch_protocol::control::{
    DmodexAnswer, DmodexAsk, DmodexData, Down, Job, Launch, LinkDown, LinkUp, NodePlan, Up,
};
use rlaunch_protocol::ids::{ExitOutcome, Gid, NodeId};
use rlaunch_protocol::record::{self, Micros, NodeRecord, Phase};
use tokio::sync::mpsc;
use tokio::task::JoinHandle;
use tokio::time::Instant;

use crate::credit::{self, ChildCredit};
use crate::link::{self, Greeting, LinkEvent, ProxyProcess};
use crate::procs;
use state::ChildState;

/// A child proxy that is gone before its subtree finished, and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Lost {
    pub host: String,
    pub reason: String,
    /// Its proxy had said hello: the node was lost while up, not while it started.
    pub came_up: bool,
}

/// What a child's link brought that is the owner's to handle.
pub enum ChildNews {
    Up(Up),
    Lost(Lost),
}

struct Child {
    state: ChildState,
    down: mpsc::UnboundedSender<Down>,
    /// The link's own messages to it: heartbeats, clock probes, credit.
    link: mpsc::UnboundedSender<LinkDown>,
    /// What the child's output taken on gives back to it.
    credit: Arc<ChildCredit>,
    /// A child that will dial in: what is sent to it (its launch first) until it does.
    dialing: Option<(mpsc::UnboundedReceiver<LinkDown>, mpsc::UnboundedReceiver<Down>)>,
    /// Ranks of its subtree that read the launcher's stdin.
    stdin_ranks: usize,
    /// When it was started and said hello, and its clock's offset, on our clock.
    clock: ChildClock,
    /// What its subtree saw, once it is done.
    record: Option<NodeRecord>,
    /// Started during the run for spawned ranks (`Launch::late`): no party of the launched
    /// job's fences.
    late: bool,
    /// The last epoch of the launched job's PMI and PMIx fences it entered.
    entered: [Option<u64>; 2],
}

/// How a child joins its parent.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Joins {
    /// Started as the plan says.
    Planned,
    /// Started during the run for a spawn's ranks (`Launch::late`).
    Late,
    /// A proxy whose parent was lost, launched already, taken on by rlaunch.
    Adopted,
}

/// What becomes of an answer to a direct modex request ([`Children::answered`]).
#[derive(Debug, PartialEq)]
pub enum Answered {
    /// It goes on toward its asker; the request it settles, if that went down from here.
    Settled(Option<DmodexAsk>),
    /// The request went to the rank's new subtree: this answer goes no further.
    AskedAgain,
}

/// The launched job's two fences a child proxy enters.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fence {
    Pmi = 0,
    Pmix = 1,
}

#[derive(Default)]
struct ChildClock {
    started: Micros,
    hello: Option<Micros>,
    /// Its clock minus ours, and the round trip that measured it: the shortest of the
    /// probes so far, whose error (at most half its round trip) is the least.
    offset: Option<(i64, u64)>,
    /// Probes answered.
    probes: u32,
}

/// Clock probes sent to a child, one after the other's answer. A child answers at once, but
/// the first answer may wait behind the ranks it starts (docs/measurements.md, *Clock
/// probes*); the shortest of a few is close to the true offset.
pub const CLOCK_PROBES: u32 = 4;

/// Every child proxy of one parent.
#[derive(Default)]
pub struct Children {
    list: Vec<Child>,
    by_pid: HashMap<i32, usize>,
    /// The child whose subtree holds each rank (global id), for routing down.
    rank_child: HashMap<Gid, usize>,
    /// The child whose subtree holds each node (by index), for routing spawns.
    node_child: HashMap<NodeId, usize>,
    /// The tasks that run the links.
    links: Vec<JoinHandle<()>>,
    /// Direct modex requests sent down and not answered yet: (asking node, its id), and the
    /// child they went to.
    asks: HashMap<(NodeId, u32), (usize, DmodexAsk)>,
    /// The job goes on after failures (`Job::goes_on`): a lost child is no party of fences.
    goes_on: bool,
    /// These are rlaunch's own children, the top proxies (`Launch::top`).
    top: bool,
}

impl Children {
    /// Starts a proxy for each of `plans`: `process(i, plan)` starts its process (by fork,
    /// exec or the remote launcher), or returns `None` for a child that will dial in (see
    /// [`Children::attach`]); `deliver(i)` is what child `i`'s link hands its events to (see
    /// [`link::run_link`]). The children share `budget` bytes of output on the way, each in
    /// proportion to the ranks behind it ([`credit::window`]). `top`: the parent is rlaunch.
    /// Returns the children and those that could not start.
    pub fn start<P, D, F, Fut>(
        job: &Job,
        plans: &[NodePlan],
        top: bool,
        budget: u64,
        mut process: P,
        mut deliver: D,
    ) -> (Children, Vec<Lost>)
    where
        P: FnMut(usize, &NodePlan) -> io::Result<Option<ProxyProcess>>,
        D: FnMut(usize) -> F,
        F: FnMut(LinkEvent) -> Fut + Send + 'static,
        Fut: std::future::Future<Output = bool> + Send + 'static,
    {
        let mut children = Children { top, ..Children::default() };
        let mut lost = Vec::new();
        let behind = |plan: &NodePlan| plan.walk().iter().map(|n| n.ranks.len()).sum::<usize>();
        let total: usize = plans.iter().map(behind).sum();
        for (index, plan) in plans.iter().enumerate() {
            let window = credit::window(budget, behind(plan), total);
            let started = process(index, plan);
            if let Err(gone) =
                children.add(job, plan, Joins::Planned, window, started, deliver(index))
            {
                lost.push(gone);
            }
        }
        (children, lost)
    }

    /// Starts a late child (`Launch::late`) for ranks a spawn places on a host that has no
    /// proxy of this parent's: it takes no part in the launched job's fences. `window`: the
    /// output it may have on the way; `process`: as [`Children::start`]'s, `None` for one
    /// that will dial in. Returns its index, or why it is lost.
    pub fn start_late<F, Fut>(
        &mut self,
        job: &Job,
        plan: &NodePlan,
        window: u64,
        process: io::Result<Option<ProxyProcess>>,
        deliver: impl FnOnce(usize) -> F,
    ) -> Result<usize, Lost>
    where
        F: FnMut(LinkEvent) -> Fut + Send + 'static,
        Fut: std::future::Future<Output = bool> + Send + 'static,
    {
        let index = self.list.len();
        self.add(job, plan, Joins::Late, window, process, deliver(index))?;
        Ok(index)
    }

    /// Takes on a child whose process `started` (by fork, exec or the remote launcher; `None`
    /// for one that will dial in): its launch queued, its link running.
    fn add<F, Fut>(
        &mut self,
        job: &Job,
        plan: &NodePlan,
        joins: Joins,
        window: u64,
        started: io::Result<Option<ProxyProcess>>,
        deliver: F,
    ) -> Result<(), Lost>
    where
        F: FnMut(LinkEvent) -> Fut + Send + 'static,
        Fut: std::future::Future<Output = bool> + Send + 'static,
    {
        let index = self.list.len();
        let (down, down_rx) = mpsc::unbounded_channel();
        let (link, link_rx) = mpsc::unbounded_channel();
        let mut dialing = None;
        let mut lost = Ok(());
        let late = joins == Joins::Late;
        // A child forked holding its launch is the one that needs none, as one adopted; a
        // child that will dial in finds its launch queued when it does.
        let launched = |p: &ProxyProcess| p.launched || joins == Joins::Adopted;
        if started.as_ref().is_ok_and(|p| p.as_ref().is_none_or(|p| !launched(p))) {
            let launch = Launch { job: job.clone(), node: plan.clone(), late, top: self.top };
            let _ = down.send(Down::Launch(Box::new(launch)));
        }
        let credit = ChildCredit::open(link.clone(), window);
        let state = match started {
            Ok(None) => {
                dialing = Some((link_rx, down_rx));
                ChildState::without_process(plan.host.clone())
            }
            Ok(Some(process)) => {
                let mut state = if process.pid > 0 {
                    self.by_pid.insert(process.pid, index);
                    ChildState::new(plan.host.clone(), process.pid, &process.what)
                } else {
                    ChildState::without_process(plan.host.clone())
                };
                // A proxy forked with its launch (or one that greeted already) is up: its death
                // may be reaped before its link delivers the greeting.
                state.greeted = process.greeted.is_some() || process.launched;
                self.run_link(&link, (link_rx, down_rx), &credit, process, job, deliver);
                state
            }
            Err(e) => {
                let reason = format!("cannot start its launcher: {e}");
                lost = Err(Lost { host: plan.host.clone(), reason, came_up: false });
                ChildState::failed(plan.host.clone())
            }
        };
        let mut stdin_ranks = 0;
        for node in plan.walk() {
            self.node_child.insert(node.index, index);
            for r in &node.ranks {
                self.rank_child.insert(Gid(r.rank), index);
                stdin_ranks += usize::from(job.stdin.includes(r.rank));
            }
        }
        let clock = ChildClock { started: record::now_us(), ..Default::default() };
        let (record, entered) = (None, [None; 2]);
        let child =
            Child { state, down, link, credit, dialing, stdin_ranks, clock, record, late, entered };
        self.list.push(child);
        self.goes_on = job.goes_on;
        lost
    }

    /// A proxy dialed in and greeted as `greeting.host`: runs its link as the child of that
    /// name, if one is waiting for it. Returns the child's index, or why it was refused.
    pub fn attach<F, Fut>(
        &mut self,
        mut process: ProxyProcess,
        greeting: Greeting,
        job: &Job,
        deliver: impl FnOnce(usize) -> F,
    ) -> Result<usize, String>
    where
        F: FnMut(LinkEvent) -> Fut + Send + 'static,
        Fut: std::future::Future<Output = bool> + Send + 'static,
    {
        let host = greeting.host.clone();
        let Some(index) =
            self.list.iter().position(|c| c.state.host == host && c.dialing.is_some())
        else {
            return Err(format!("no proxy on {host} is expected"));
        };
        let queued = self.list[index].dialing.take().expect("found waiting");
        let (link, credit) = (self.list[index].link.clone(), self.list[index].credit.clone());
        process.greeted = Some(greeting);
        self.run_link(&link, queued, &credit, process, job, deliver(index));
        Ok(index)
    }

    /// Takes on a proxy below the top whose parent was lost and that dialed rlaunch
    /// (`Job::adoption`): the child of `plan`'s node from now on, already launched, with
    /// `window` bytes of output on the way. Every rank and node of its subtree is routed to
    /// it; it is a party of the fences from the epoch it enters. Returns its index.
    pub fn adopt<F, Fut>(
        &mut self,
        mut process: ProxyProcess,
        greeting: Greeting,
        plan: &NodePlan,
        job: &Job,
        window: u64,
        deliver: impl FnOnce(usize) -> F,
    ) -> usize
    where
        F: FnMut(LinkEvent) -> Fut + Send + 'static,
        Fut: std::future::Future<Output = bool> + Send + 'static,
    {
        let index = self.list.len();
        // Its greeting reaches `on_link` first, which probes its clock.
        process.greeted = Some(greeting);
        let started = Ok(Some(process));
        let _ = self.add(job, plan, Joins::Adopted, window, started, deliver(index));
        index
    }

    /// Runs a child's link: its heartbeat, and the task that carries its frames both ways.
    fn run_link<F, Fut>(
        &mut self,
        link: &mpsc::UnboundedSender<LinkDown>,
        queued: (mpsc::UnboundedReceiver<LinkDown>, mpsc::UnboundedReceiver<Down>),
        credit: &Arc<ChildCredit>,
        process: ProxyProcess,
        job: &Job,
        deliver: F,
    ) where
        F: FnMut(LinkEvent) -> Fut + Send + 'static,
        Fut: std::future::Future<Output = bool> + Send + 'static,
    {
        link::heartbeat(link, job.liveness.heartbeat(), || LinkDown::Ping);
        let silence = job.liveness.silence();
        let run = link::run_link(process, queued, credit.clone(), silence, deliver);
        self.links.push(tokio::spawn(run));
    }

    /// The records of the children that finished, taken (each once).
    pub fn take_records(&mut self) -> Vec<NodeRecord> {
        self.list.iter_mut().filter_map(|c| c.record.take()).collect()
    }

    /// Children still waiting to dial in.
    pub fn dialing(&self) -> usize {
        self.list.iter().filter(|c| c.dialing.is_some()).count()
    }

    /// Stops waiting for the children that have not dialed in and that `which(index, late)`
    /// picks: they are lost, for `reason`. Returns each with its index.
    pub fn give_up_dialing(
        &mut self,
        reason: &str,
        which: impl Fn(usize, bool) -> bool,
    ) -> Vec<(usize, Lost)> {
        let mut lost = Vec::new();
        let waiting = self.list.iter_mut().enumerate().filter(|(i, c)| which(*i, c.late));
        for (index, child) in waiting.filter(|(_, c)| c.dialing.is_some()) {
            child.dialing = None;
            child.state.lost = true;
            child.state.link_closed = true;
            let host = child.state.host.clone();
            lost.push((index, Lost { host, reason: reason.to_string(), came_up: false }));
        }
        lost
    }

    /// Takes what child `child`'s link reports: returns what is the owner's to handle.
    pub fn on_link(&mut self, child: usize, event: LinkEvent) -> Option<ChildNews> {
        let Child { state, clock, link, record: kept, entered, .. } = &mut self.list[child];
        match event {
            LinkEvent::Greeted(g) => {
                tracing::debug!(host = %g.host, pid = g.pid, "proxy up");
                state.greeted = true;
                let now = record::now_us();
                clock.hello = Some(now);
                let _ = link.send(LinkDown::ClockProbe { sent: now });
                None
            }
            LinkEvent::Link(LinkUp::ClockEcho { sent, at }) => {
                let (offset, round_trip) = record::clock_offset(sent, at, record::now_us());
                if clock.offset.is_none_or(|(_, best)| round_trip < best) {
                    clock.offset = Some((offset, round_trip));
                }
                clock.probes += 1;
                if clock.probes < CLOCK_PROBES {
                    let _ = link.send(LinkDown::ClockProbe { sent: record::now_us() });
                }
                None
            }
            // Its heartbeat: heard, which is all it is for (see `link::run_link`).
            LinkEvent::Link(LinkUp::Ping) => None,
            LinkEvent::Link(LinkUp::Greeting { host, .. }) => {
                tracing::warn!(host, "a child proxy greeted a second time");
                None
            }
            LinkEvent::Up(Up::NodeDone { record, node }) => {
                tracing::debug!(%node, host = %state.host, "subtree done");
                state.done = true;
                *kept = Some(clock.stamp(*record));
                None
            }
            LinkEvent::Up(up) => {
                let fence = match up {
                    Up::FenceIn { epoch, .. } => Some((Fence::Pmi, epoch)),
                    Up::PmixFenceIn { epoch, .. } => Some((Fence::Pmix, epoch)),
                    _ => None,
                };
                if let Some((fence, epoch)) = fence {
                    // An adopted proxy sends again the entry its lost parent may have dropped,
                    // which may also have been waiting in its own queue: one arrival.
                    if entered[fence as usize].replace(epoch) == Some(epoch) {
                        tracing::debug!(host = %state.host, epoch, ?fence, "a fence entry again");
                        return None;
                    }
                }
                Some(ChildNews::Up(up))
            }
            // The owner's delivery takes output before its link events get here.
            LinkEvent::Output { .. } | LinkEvent::Spliced { .. } => None,
            LinkEvent::Stderr(text) => {
                state.add_stderr(&text);
                None
            }
            LinkEvent::Closed(error) => state.on_link_closed(error).map(ChildNews::Lost),
        }
    }

    /// A child's process ended: returns it as lost if it had not finished.
    pub fn reaped(&mut self, pid: i32, outcome: ExitOutcome) -> Option<Lost> {
        let &child = self.by_pid.get(&pid)?;
        tracing::debug!(child, pid, %outcome, "child proxy ended");
        self.list[child].state.on_exit(outcome)
    }

    /// Sends `down` to every child that is not lost.
    pub fn broadcast(&self, down: &Down) {
        for c in self.list.iter().filter(|c| !c.state.lost) {
            let _ = c.down.send(down.clone());
        }
    }

    /// Sends `down` toward the subtree holding `rank`; false if none does, or if that
    /// subtree's proxy is lost or finished (nothing it is sent will be read).
    pub fn send_toward_rank(&self, rank: Gid, down: Down) -> bool {
        match self.rank_child.get(&rank) {
            Some(&c) => self.send_to(c, down),
            None => false,
        }
    }

    /// The child whose link leads to `node` now (its own, or an ancestor's).
    pub fn route(&self, node: NodeId) -> Option<usize> {
        self.node_child.get(&node).copied()
    }

    /// Sends `down` toward the subtree holding `node`; false as for
    /// [`Children::send_toward_rank`].
    pub fn send_toward_node(&self, node: NodeId, down: Down) -> bool {
        match self.node_child.get(&node) {
            Some(&c) => self.send_to(c, down),
            None => false,
        }
    }

    /// Sends a direct modex request toward the subtree holding its rank, and keeps it until
    /// its answer comes up ([`Children::answered`]); false as for
    /// [`Children::send_toward_rank`].
    pub fn send_ask(&mut self, ask: DmodexAsk) -> bool {
        let Some(&child) = self.rank_child.get(&ask.rank) else { return false };
        let key = (ask.asker, ask.id);
        let sent = self.send_to(child, Down::DmodexAsk(ask.clone()));
        if sent {
            self.asks.insert(key, (child, ask));
        }
        sent
    }

    /// `answer` to a request came up: what becomes of it. A `Missing` from a subtree that
    /// no longer holds the rank (rlaunch adopted the proxy below a lost one since, see
    /// [`Children::adopt`]) is not sent on: the request goes to the rank's new subtree.
    pub fn answered(&mut self, answer: &DmodexAnswer) -> Answered {
        let Some((child, ask)) = self.asks.remove(&(answer.asker, answer.id)) else {
            return Answered::Settled(None);
        };
        let moved = self.rank_child.get(&ask.rank).is_some_and(|&now| now != child);
        if matches!(answer.data, DmodexData::Missing) && moved && self.send_ask(ask.clone()) {
            return Answered::AskedAgain;
        }
        Answered::Settled(Some(ask))
    }

    /// The requests sent to a child that finished or was lost without answering them, for
    /// the owner to answer (`Missing`) toward their askers: a child's `NodeDone` comes after
    /// every answer it sent (answers go up on the control path, ahead of it), and a child
    /// that ended as a request went down never read it. One whose rank is held by another
    /// child now (an adopted proxy's subtree) is asked there instead.
    pub fn unanswerable(&mut self) -> Vec<DmodexAsk> {
        let list = &self.list;
        let gone: Vec<_> = self
            .asks
            .iter()
            .filter(|(_, (c, _))| list[*c].state.lost || list[*c].state.done)
            .map(|(&key, _)| key)
            .collect();
        let mut unanswered = Vec::new();
        for key in gone {
            let (_, ask) = self.asks.remove(&key).expect("just found");
            // The rank's subtree moved to an adopted proxy: asked there.
            if !self.send_ask(ask.clone()) {
                let (asker, id) = key;
                tracing::debug!(%asker, id, "a direct modex request its subtree ended unanswered");
                unanswered.push(ask);
            }
        }
        unanswered
    }

    /// A child's subtree holds `rank`.
    pub fn holds_rank(&self, rank: Gid) -> bool {
        self.rank_child.contains_key(&rank)
    }

    /// The subtree holding `node` holds `ranks` from now on (a spawned job's).
    pub fn add_ranks(&mut self, node: NodeId, ranks: Range<u32>) {
        if let Some(&c) = self.node_child.get(&node) {
            self.rank_child.extend(ranks.map(|r| (Gid(r), c)));
        }
    }

    /// Sends `down` to child `child` alone, if it can still read it.
    pub fn send_to(&self, child: usize, down: Down) -> bool {
        let child = &self.list[child];
        !child.state.lost && !child.state.done && child.down.send(down).is_ok()
    }

    /// Sends a stdin chunk to the children whose subtrees read stdin (what each rank owes
    /// back is counted by node at the root: `job/stdin_flow.rs`).
    pub fn send_stdin(&self, seq: u64, data: &[u8]) {
        for c in self.list.iter().filter(|c| !c.state.lost && c.stdin_ranks > 0) {
            let _ = c.down.send(Down::Stdin { seq, data: data.to_vec() });
        }
    }

    /// How many child subtrees each of the launched job's fences waits for: every child
    /// but the late ones, lost ones included. A lost child fails the job; completing a fence
    /// without its subtree would hand the surviving ranks a key space with holes, and the
    /// errors they then report race the true culprit to the launcher (found by the chaos
    /// runner).
    ///
    /// When the job goes on after failures, a lost child's ranks are failed ones: it is no
    /// party, and if it had entered fence `epoch` of `fence` it counts as there, so that the
    /// arrivals its entry added are matched (the caller's fold counts arrivals, not who).
    pub fn fence_parties(&self, fence: Fence, epoch: u64) -> usize {
        let gone = |c: &Child| self.goes_on && c.state.lost;
        let parties = self.list.iter().filter(|c| !c.late && !gone(c)).count();
        let entered = |c: &&Child| c.entered[fence as usize] == Some(epoch);
        let lost_in = self.list.iter().filter(|c| !c.late && gone(c)).filter(entered).count();
        parties + lost_in
    }

    /// Sends `down` to every child that is neither lost nor finished; returns those it went
    /// to, with their hosts.
    pub fn send_to_live(&self, down: &Down) -> Vec<(usize, String)> {
        let live = self.list.iter().enumerate().filter(|(i, _)| !self.gone(*i));
        live.filter(|(_, c)| c.down.send(down.clone()).is_ok())
            .map(|(i, c)| (i, c.state.host.clone()))
            .collect()
    }

    /// How many children there are, lost and finished ones included (their indexes).
    pub fn len(&self) -> usize {
        self.list.len()
    }

    pub fn is_empty(&self) -> bool {
        self.list.is_empty()
    }

    /// Child `child` was started during the run for a spawn's ranks (`Launch::late`).
    pub fn is_late(&self, child: usize) -> bool {
        self.list.get(child).is_some_and(|c| c.late)
    }

    /// Child `child` is lost.
    pub fn lost(&self, child: usize) -> bool {
        self.list.get(child).is_some_and(|c| c.state.lost)
    }

    /// Child `child` is finished (it said NodeDone) or lost: nothing sent to it is read.
    pub fn gone(&self, child: usize) -> bool {
        self.list.get(child).is_none_or(|c| c.state.lost || c.state.done)
    }

    /// Tells every child to tear its subtree down: SIGTERM, `grace`, SIGKILL.
    pub fn terminate(&self, grace: std::time::Duration) {
        self.broadcast(&Down::Terminate { grace_ms: grace.as_millis() as u64 });
    }

    /// When the first child whose link closed cleanly, and whose process has not ended since,
    /// is to be killed: `grace` after the close.
    pub fn linger_deadline(&self, grace: Duration) -> Option<Instant> {
        let lingering = self.list.iter().filter(|c| !c.state.reaped());
        lingering.filter_map(|c| c.state.lingers_since).map(|at| at + grace).min()
    }

    /// SIGKILLs the children whose process outlived its link by `grace`: stopped, or hung on
    /// its way out. One that had not finished is lost for it once reaped.
    pub fn kill_lingering(&mut self, grace: Duration) {
        let now = Instant::now();
        for c in self.list.iter_mut().filter(|c| !c.state.reaped()) {
            c.state.kill_if_lingering(grace, now);
        }
    }

    /// SIGKILLs the children whose process has not ended.
    pub fn kill_unfinished(&self) {
        for c in self.list.iter().filter(|c| !c.state.reaped()) {
            tracing::warn!(host = %c.state.host, "proxy did not finish; killing it");
            procs::signal_pid(c.state.pid, Signal::SIGKILL);
        }
    }

    /// The children's processes that have not ended: sweeps spare them, as each cleans up
    /// its own subtree.
    pub fn pids(&self) -> HashSet<i32> {
        self.list.iter().filter(|c| !c.state.reaped()).map(|c| c.state.pid).collect()
    }

    /// Every child is finished one way or the other, and nothing more will come from it.
    pub fn settled(&self) -> bool {
        self.list.iter().all(|c| c.state.settled())
    }

    /// Lets every child go on without this proxy, which goes down having lost its own parent
    /// while rlaunch adopts orphans (`Job::adoption`): their links close (each child sees
    /// its parent gone and asks rlaunch to adopt it), and their processes are neither told
    /// to end nor killed. They count as lost, with nothing to report.
    pub fn release(&mut self) {
        for link in &self.links {
            link.abort();
        }
        self.by_pid.clear();
        for c in &mut self.list {
            c.state.lost = true;
            c.state.own_process = false;
        }
    }

    /// Stops reading the links (at the end of the run: what they still hold is not needed).
    pub async fn stop_links(&mut self) {
        for link in &self.links {
            link.abort();
        }
        for link in self.links.drain(..) {
            let _ = link.await;
        }
    }
}

impl ChildClock {
    /// The child's record with what only we saw: its offset, when we started it and when it
    /// said hello (on its clock, as the rest of its record).
    fn stamp(&self, mut record: NodeRecord) -> NodeRecord {
        let (offset, round_trip) = self.offset.unwrap_or((0, 0));
        record.offset_us = offset;
        record.round_trip_us = round_trip;
        let theirs = |at: Micros| at.saturating_add_signed(offset);
        let mut ours = vec![(Phase::Bootstrap, theirs(self.started))];
        ours.extend(self.hello.map(|at| (Phase::Hello, theirs(at))));
        record.phases.splice(0..0, ours);
        record
    }
}

#[cfg(test)]
mod tests;
