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
//!  SIGCHLD, SIGTERM/HUP/INT ──► Node     output hub, child frames ┘ (bounded data channel)
//! ```
//!
//! Starting ranks (the launched job's and spawned jobs') is in [`launch`]; what a rank's PMI
//! connection asks of the node, in [`calls`].

mod calls;
mod dmodex;
mod launch;
mod pmix;
mod pmix_fence;
mod pmix_spawn;

use std::collections::{HashMap, HashSet};
use std::ffi::OsString;
use std::sync::Arc;
use std::time::Duration;

use nix::sys::signal::Signal;
use pmi_wire::control::{Bootstrap, Down, Job, Launch, NodePlan, Up};
use pmi_wire::ids::Stream;
use pmi_wire::io::FrameReader;
use pmi_wire::record::{self, FenceTimes, Micros, NodeRecord, Phase};
use tokio::signal::unix::{signal, SignalKind};
use tokio::sync::mpsc;
use tokio::time::Instant;

use crate::binding::Binder;
use crate::children::{ChildNews, Children, Lost};
use crate::credit::{self, Outbox, Queued, Window};
use crate::dialin::{self, Dialed};
use crate::kill::{Escalation, KillStep};
use crate::kvs::{FenceScope, Kvs, Local};
use crate::link::{self, LinkEvent};
use crate::link::{LinkRead, LinkWrite};
use crate::outputs::{Carrying, Outputs, StreamEnd};
use crate::pmi::{PmiAnswer, PmiCall, PmiJob, PmiPeer};
use crate::procs;
use crate::rank::StdinChunk;
use crate::ranks::RankTable;
use crate::secure::Secret;
use crate::splice::{self, Carriers};

/// What the dispatcher hears about, besides PMI calls and signals.
pub(crate) enum Event {
    Down(Down),
    UpstreamClosed(String),
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
}

/// What a proxy that dialed its parent needs to accept its own children the same way.
#[derive(Clone)]
pub struct DialContext {
    pub secret: Secret,
    /// This proxy's address on its link to its parent: one its siblings can reach too.
    pub ip: std::net::IpAddr,
}

/// How a proxy's service ended.
pub enum Served {
    /// The process's exit code.
    Exit(i32),
    /// Its parent sent it elsewhere before launching it: dial this address.
    Redirect(String),
}

/// The first frame a proxy gets from its parent.
enum Received {
    Launch(Box<Launch>),
    Redirect(String),
}

/// One job's state on this node: the launched job (0), and any job its ranks spawned here.
struct JobState {
    pmi: Arc<PmiJob>,
    kvs: Kvs,
}

/// What goes to the parent: control messages, and the bounded channel that output and
/// child proxies' frames share (so backpressure reaches them).
struct Upstream {
    control: mpsc::UnboundedSender<Up>,
    data: mpsc::UnboundedSender<Queued>,
    /// Set when the parent is lost: the pump stops writing to it and drops what comes.
    abandon: tokio::sync::watch::Sender<bool>,
    /// Set when rlaunch drops the job's output: the pump throws away the output queued for
    /// it (this node's ranks' and its child proxies') instead of writing it.
    shed_output: tokio::sync::watch::Sender<bool>,
}

pub(crate) struct Node {
    job: Arc<Job>,
    /// When this node reached each phase of its launch, for its record.
    phases: Vec<(Phase, Micros)>,
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
    kill: Escalation,
    /// The parent is gone: finish cleaning up, then exit quietly.
    orphaned: bool,
    /// When the parent was last heard from; silence past the job's timeout means it is gone.
    last_heard: Instant,
    /// The job is stopped (SIGTSTP): so may be the launcher, whose silence then means nothing.
    stopped: bool,
    /// Whatever the ranks left behind was killed once they had all ended.
    swept: bool,
    binder: Binder,
    /// Each (job, segment)'s program, prepared once for all its ranks.
    programs: HashMap<(u32, u32), Result<Arc<crate::rank::Program>, pmi_wire::ids::ExitOutcome>>,
    /// The `rlaunch-proxy` this proxy starts its child proxies with.
    proxy_exe: OsString,
    /// This proxy dialed its parent: its children dial it.
    dial: Option<DialContext>,
    /// Children that have not dialed in by then are lost.
    dial_deadline: Option<Instant>,
    /// This node's PMIx server, if the job serves PMIx.
    pmix: Option<pmix::Pmix>,
    /// This node's share of the launched job's PMIx fences, with or without a server.
    pmix_fence: pmix_fence::NodeFence,
    /// Direct modex requests of other nodes that this node's server is answering.
    dmodex: dmodex::Asks,
    /// The launcher's stdin that came while the ranks waited to start, in order.
    held_stdin: Vec<StdinChunk>,
}

/// A proxy's control channel on its own descriptors (a socketpair or pipes from its parent
/// or the remote shell), not a link it dialed.
#[derive(Clone, Copy)]
pub struct PlainChannel {
    pub input: std::os::fd::RawFd,
    pub output: std::os::fd::RawFd,
    /// The proxy was exec'd, so it may be across a remote shell: its guard watches the
    /// channel (see [`crate::guard`]).
    pub guarded: bool,
}

/// Runs a proxy on its control channel until its subtree is finished; child proxies are
/// started as `proxy_exe`. Returns the exit code of the proxy process. `launch` is what a
/// proxy forked from rlaunch was given; any other reads it from its parent. `host` is the
/// name this proxy greets its parent with. `plain`: the control channel's own descriptors,
/// when it is not a link this proxy dialed.
pub async fn serve(
    up_in: LinkRead,
    up_out: LinkWrite,
    proxy_exe: OsString,
    launch: Option<Launch>,
    host: String,
    dial: Option<DialContext>,
    plain: Option<PlainChannel>,
) -> Served {
    procs::become_subreaper();
    let (control_tx, control_rx) = mpsc::unbounded_channel();
    let (data_tx, data_rx) = mpsc::unbounded_channel();
    let window = Arc::new(Window::default());
    let _ = control_tx.send(Up::Greeting { host: host.clone(), pid: std::process::id() });
    let (abandon, abandoned) = tokio::sync::watch::channel(false);
    let (shed_output, shed) = tokio::sync::watch::channel(false);
    let outbox = Outbox::new(data_rx, window.clone(), shed);
    // The ranks' output goes up in carriers, spliced, when the channel takes splices.
    let splice_to = plain.filter(|_| splice::enabled()).and_then(|c| splice::target(c.output));
    let carrying = plain
        .filter(|_| splice_to.is_some())
        .and_then(|c| splice::target(c.output))
        .map(|upstream| Carrying { carriers: Carriers::new(), upstream });
    let pump = link::pump_until_abandoned(up_out, true, control_rx, outbox, splice_to, abandoned);
    let pump = tokio::spawn(pump);

    // Down the tree come control messages and stdin, not output: small reads will do.
    let mut reader = FrameReader::with_chunk(up_in, 16 << 10);
    let launch = match launch {
        Some(launch) => Ok(Received::Launch(Box::new(launch))),
        None => receive_launch(&mut reader).await,
    };
    let launched_at = record::now_us();
    let launch = match launch {
        Ok(Received::Launch(launch)) => *launch,
        Ok(Received::Redirect(to)) => return Served::Redirect(to),
        Err(msg) => {
            eprintln!("rlaunch-proxy on {host}: {msg}");
            return Served::Exit(1);
        }
    };
    link::heartbeat(&control_tx, launch.job.liveness.heartbeat(), || Up::Ping);
    if launch.job.progress {
        let _ = control_tx.send(Up::Progress { node: launch.node.index, pmi_inited: 0 });
    }
    let guarded = plain.filter(|c| c.guarded);
    if let (Some(PlainChannel { input, output, .. }), Bootstrap::Remote { .. }) =
        (guarded, &launch.job.bootstrap)
    {
        // Longer than this proxy's own teardown once its channel is gone.
        let grace = Duration::from_millis(launch.job.kill_grace_ms);
        // The escalation (grace, the child proxies' grace, an orphan's last wait), the
        // last flush of the pump, and a margin.
        let patience = grace + crate::kill::CHILD_PROXY_GRACE * 2 + Duration::from_secs(7);
        crate::guard::start(input, output, patience);
    }
    let (events_tx, events_rx) = mpsc::unbounded_channel();
    // Weak: the pump ends when the dispatcher's control sender goes, not when the reader's.
    tokio::spawn(read_upstream(reader, window, control_tx.downgrade(), events_tx.clone()));

    let closed = events_tx.clone();
    let outputs = Outputs::start(data_tx.clone(), carrying, move |end| {
        let _ = closed.send(Event::OutputClosed(end));
    });
    let outputs = match outputs {
        Ok(outputs) => outputs,
        Err(e) => {
            eprintln!("rlaunch-proxy on {host}: cannot set up output relaying: {e}");
            return Served::Exit(1);
        }
    };
    let (pmi_tx, pmi_rx) = mpsc::unbounded_channel();
    let launched = JobState {
        pmi: Arc::new(PmiJob {
            kvsname: launch.job.jobid.clone(),
            size: launch.job.size,
            process_mapping: launch.job.process_mapping.clone(),
            spawner: None,
        }),
        kvs: Kvs::new(FenceScope::Tree, launch.node.ranks.len(), []),
    };
    let mut node = Node {
        phases: vec![(Phase::Launched, launched_at)],
        fences: FenceTimes::default(),
        jobs: HashMap::from([(0, launched)]),
        pmi_calls: pmi_tx,
        binder: Binder::new(launch.node.host.clone()),
        programs: HashMap::new(),
        proxy_exe,
        job: Arc::new(launch.job),
        plan: launch.node,
        ranks: RankTable::default(),
        children: Children::default(),
        up: Upstream { control: control_tx, data: data_tx, abandon, shed_output },
        outputs,
        events: events_tx,
        kill: Escalation::default(),
        orphaned: false,
        last_heard: Instant::now(),
        stopped: false,
        swept: false,
        dial,
        dial_deadline: None,
        pmix: None,
        pmix_fence: pmix_fence::NodeFence::default(),
        dmodex: dmodex::Asks::default(),
        held_stdin: Vec::new(),
    };
    let code = node.run(events_rx, pmi_rx).await;
    drop(node);
    let _ = tokio::time::timeout(Duration::from_secs(5), pump).await;
    Served::Exit(code)
}

async fn receive_launch(reader: &mut FrameReader<LinkRead>) -> Result<Received, String> {
    let (found, _) = reader.read_hello().await.map_err(|e| e.to_string())?;
    if found.version != pmi_wire::control::PROTOCOL_VERSION {
        return Err(format!(
            "the launcher speaks protocol version {}, this proxy speaks version {}",
            found.version,
            pmi_wire::control::PROTOCOL_VERSION
        ));
    }
    match reader.next::<Down>().await {
        Ok(Some(Down::Launch(launch))) => Ok(Received::Launch(launch)),
        Ok(Some(Down::Redirect { to })) => Ok(Received::Redirect(to)),
        Ok(Some(_)) => Err("the first frame from the launcher was not a launch".into()),
        Ok(None) => Err("the launcher closed the connection before the launch".into()),
        Err(e) => Err(e.to_string()),
    }
}

/// Hands every frame from the parent to the dispatcher, then how the connection ended;
/// credit goes straight to the window and a clock probe is answered at once (the dispatcher
/// may be busy, and the probe's answer must be prompt to be worth anything). Reads on after
/// the dispatcher is gone: the pump still needs credit to send the last output up.
async fn read_upstream(
    mut reader: FrameReader<LinkRead>,
    window: Arc<Window>,
    control: mpsc::WeakUnboundedSender<Up>,
    events: mpsc::UnboundedSender<Event>,
) {
    loop {
        let event = match reader.next::<Down>().await {
            Ok(Some(Down::Credit { bytes })) => {
                window.grant(bytes);
                continue;
            }
            Ok(Some(Down::ClockProbe { sent })) => {
                if let Some(control) = control.upgrade() {
                    let _ = control.send(Up::ClockEcho { sent, at: record::now_us() });
                }
                continue;
            }
            Ok(Some(down)) => Event::Down(down),
            Ok(None) => Event::UpstreamClosed("its parent closed the connection".into()),
            Err(e) => Event::UpstreamClosed(e.to_string()),
        };
        let last = matches!(event, Event::UpstreamClosed(_));
        let _ = events.send(event);
        if last {
            return;
        }
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
        self.start_launched();
        self.reap();
        let silence = self.job.liveness.silence();
        let mut pmix_ping = tokio::time::interval(self.job.liveness.heartbeat());
        pmix_ping.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        while !self.finished() {
            let deadline = self.kill.deadline();
            // Watched until the parent is found unreachable (not only told to go).
            let watch = !*self.up.abandon.borrow() && !self.stopped;
            let silent_at = self.last_heard + silence;
            let pmix_silent_at = self.pmix_silent_at();
            let linger_at = self.children.linger_deadline(crate::kill::CHILD_PROXY_GRACE);
            tokio::select! {
                ev = events.recv() => match ev {
                    Some(ev) => self.handle(ev),
                    None => break,
                },
                Some((peer, call)) = pmi.recv() => self.pmi_call(peer, call),
                _ = sigchld.recv() => {
                    // What a rank said before it died comes first: a protocol fault that
                    // made it exit is the story, not the exit.
                    while let Ok((peer, call)) = pmi.try_recv() {
                        self.pmi_call(peer, call);
                    }
                    self.reap()
                }
                _ = sigterm.recv() => self.lose_upstream("the proxy received SIGTERM", false),
                _ = sighup.recv() => self.lose_upstream("the proxy received SIGHUP", false),
                _ = sigint.recv() => self.lose_upstream("the proxy received SIGINT", false),
                _ = tokio::time::sleep_until(deadline.unwrap_or_else(Instant::now)), if deadline.is_some() => {
                    let steps = self.kill.on_deadline(Instant::now(), self.orphaned);
                    self.apply(steps);
                }
                _ = tokio::time::sleep_until(self.dial_deadline.unwrap_or_else(Instant::now)), if self.dial_deadline.is_some() => {
                    self.dial_deadline = None;
                    let wait = link::HELLO_WAIT.as_secs();
                    let reason = format!("its proxy did not call back within {wait} s");
                    for lost in self.children.give_up_dialing(&reason) {
                        self.report_lost(lost);
                    }
                }
                _ = tokio::time::sleep_until(linger_at.unwrap_or_else(Instant::now)), if linger_at.is_some() => {
                    self.children.kill_lingering(crate::kill::CHILD_PROXY_GRACE)
                }
                _ = pmix_ping.tick(), if self.pmix.is_some() => self.ping_pmix(),
                _ = tokio::time::sleep_until(pmix_silent_at.unwrap_or_else(Instant::now)), if pmix_silent_at.is_some() => {
                    self.pmix_silent()
                }
                _ = tokio::time::sleep_until(silent_at), if watch => {
                    let secs = silence.as_secs_f64();
                    self.lose_upstream(&format!("it heard nothing from its parent for {secs} s"), true);
                }
            }
        }
        // Nothing of this node outlives it, whatever was left waiting.
        procs::kill_descendants(&HashSet::new());
        if !self.orphaned {
            let record = Box::new(self.record());
            let done = Up::NodeDone { node: self.plan.index, record };
            let _ = self.up.data.send(Queued::plain(done));
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
            children: self.children.take_records(),
            ..Default::default()
        }
    }

    fn relay(&self) -> Relay {
        Relay {
            data: self.up.data.clone(),
            control: self.up.control.clone(),
            events: self.events.clone(),
        }
    }

    fn start_children(&mut self) {
        let plans = std::mem::take(&mut self.plan.children);
        let dialing = self.job.bootstrap == Bootstrap::Dial;
        if dialing && !plans.is_empty() {
            if let Err(why) = self.listen_for_children() {
                for plan in &plans {
                    let reason = format!("its parent cannot listen for it: {why}");
                    self.report_lost(Lost { host: plan.host.clone(), reason });
                }
                return;
            }
            self.dial_deadline = Some(Instant::now() + link::HELLO_WAIT);
        }
        let relay = self.relay();
        let (job, exe) = (&self.job, &self.proxy_exe);
        let (children, lost) = Children::start(
            job,
            &plans,
            credit::CHILDREN_BUDGET,
            |_, plan| match dialing {
                true => Ok(None),
                false => link::spawn_proxy(&job.bootstrap, &plan.host, plan.fork, exe).map(Some),
            },
            |child| {
                let relay = relay.clone();
                move |event| relay_child(child, event, relay.clone())
            },
        );
        self.children = children;
        for lost in lost {
            self.report_lost(lost);
        }
    }

    /// Listens where this proxy's children can dial it, and says so up the tree (rlaunch
    /// sends them here).
    fn listen_for_children(&mut self) -> Result<(), String> {
        let dial = self.dial.clone().ok_or("it did not dial in itself")?;
        let (listener, address) = dialin::listen(dial.ip).map_err(|e| e.to_string())?;
        let node = self.plan.index;
        let _ = self.up.control.send(Up::Listening { node, address: address.to_string() });
        let (tx, mut rx) = mpsc::unbounded_channel();
        tokio::spawn(dialin::accept(listener, dial.secret, tx));
        let events = self.events.clone();
        tokio::spawn(async move {
            while let Some(dialed) = rx.recv().await {
                if events.send(Event::Dialed(Box::new(dialed))).is_err() {
                    return;
                }
            }
        });
        Ok(())
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
                self.last_heard = Instant::now();
                self.handle_down(down);
            }
            Event::UpstreamClosed(why) => self.lose_upstream(&why, true),
            Event::Pmix(news) => self.pmix_news(news),
            Event::OutputClosed(end) => {
                let seen = &mut self.ranks.get_mut(end.local).seen;
                match end.stream {
                    Stream::Stdout => seen.stdout_bytes = end.bytes,
                    Stream::Stderr => seen.stderr_bytes = end.bytes,
                }
                seen.first_output = seen.first_output.into_iter().chain(end.first).min();
                self.ranks.stream_closed(end.local);
            }
            Event::Child { child, event } => match self.children.on_link(child, event) {
                Some(ChildNews::Up(Up::FenceIn { pairs, .. })) => {
                    let parties = self.children.fence_parties();
                    let step = self.kvs(0).map(|kvs| kvs.child_entered(pairs, parties));
                    self.fence_step(step);
                }
                Some(ChildNews::Up(Up::PmixFenceIn { epoch, served })) => {
                    self.pmix_child_fence(epoch, served)
                }
                // relay_child sends every other frame straight up.
                Some(ChildNews::Up(_)) | None => {}
                Some(ChildNews::Lost(lost)) => self.report_lost(lost),
            },
        }
    }

    fn handle_down(&mut self, down: Down) {
        match down {
            Down::Launch(_) | Down::Redirect { .. } => {
                tracing::warn!("ignoring a second launch")
            }
            // Credit and clock probes are answered as they are read (see read_upstream).
            Down::Ping | Down::Credit { .. } | Down::ClockProbe { .. } => {}
            Down::Stdin { seq, data } => {
                self.children.send_stdin(seq, &data);
                self.stdin_to_ranks(StdinChunk::Data { seq, data: Arc::from(data) });
            }
            Down::StdinEof => {
                self.children.broadcast(&Down::StdinEof);
                self.stdin_to_ranks(StdinChunk::Eof);
            }
            Down::Signal { signo } => {
                self.children.broadcast(&Down::Signal { signo });
                if let Ok(sig) = Signal::try_from(signo) {
                    match sig {
                        Signal::SIGTSTP => self.stopped = true,
                        Signal::SIGCONT => {
                            self.stopped = false;
                            self.pmix_resumed();
                        }
                        _ => {}
                    }
                    self.signal_ranks(sig);
                }
            }
            Down::Terminate { grace_ms } => self.terminate(Duration::from_millis(grace_ms)),
            Down::DropOutput => {
                self.children.broadcast(&Down::DropOutput);
                self.outputs.drop_all();
                let _ = self.up.shed_output.send(true);
            }
            Down::FenceOut { epoch, pairs } => {
                self.children.broadcast(&Down::FenceOut { epoch, pairs: pairs.clone() });
                if let Some(kvs) = self.kvs(0) {
                    let released = kvs.complete(epoch, pairs);
                    self.send_replies(released);
                    self.fences.complete(record::now_us());
                }
            }
            Down::PmixFencePart { epoch, data } => self.pmix_fence_part(epoch, data),
            Down::PmixFenceOut { epoch, data } => self.pmix_fence_out(epoch, data),
            // Every node hears of a spawn: the spawner's starts it, and the others' PMIx
            // servers learn its namespace, for their ranks that are its parents too.
            Down::Spawn(sj) => {
                let size: u32 = sj.request.cmds.iter().map(|c| c.nprocs).sum();
                self.children.add_ranks(sj.node, sj.first..sj.first + size);
                self.children.broadcast(&Down::Spawn(sj.clone()));
                if sj.node == self.plan.index {
                    self.start_spawned(*sj);
                } else if pmix::pmix_id(&sj.tag).is_some() {
                    self.pmix_spawned_elsewhere(&sj);
                }
            }
            Down::PmixGroupFenceOut { node, members, data } => {
                self.pmix_group_fence_out(node, members, data)
            }
            Down::DmodexAsk(ask) => self.dmodex_ask(ask),
            Down::DmodexAnswer(answer) => self.dmodex_answer(answer),
            Down::NameReply { rank, tag, answer } => {
                let local = self.ranks.find(rank).is_some();
                match pmix::pmix_id(&tag) {
                    Some(id) if local => return self.pmix_name_answer(id, answer),
                    _ => {}
                }
                match self.ranks.find(rank).and_then(|r| r.answers.as_ref()) {
                    Some(tx) => {
                        let _ = tx.send(Box::new(PmiAnswer::Name { answer, tag }));
                    }
                    None => {
                        self.children.send_toward_rank(rank, Down::NameReply { rank, tag, answer });
                    }
                }
            }
        }
    }

    /// Hands a chunk of the launcher's stdin (or its end) to the local ranks that read it;
    /// while they wait to start (for their PMIx environment) it waits with them.
    fn stdin_to_ranks(&mut self, chunk: StdinChunk) {
        if self.holding_ranks() {
            self.held_stdin.push(chunk);
            return;
        }
        match chunk {
            StdinChunk::Data { seq, data } => {
                let stdin = self.job.stdin;
                for rank in self.ranks.iter().filter(|r| r.job == 0 && stdin.includes(r.gid)) {
                    let queued = rank.stdin.as_ref().is_some_and(|tx| {
                        tx.send(StdinChunk::Data { seq, data: data.clone() }).is_ok()
                    });
                    if !queued {
                        let _ = self.up.control.send(Up::StdinAck { seq });
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
            procs::signal_group(pid, sig);
        }
    }

    /// SIGTERM now, SIGKILL after the grace period; child proxies do the same below.
    fn terminate(&mut self, grace: Duration) {
        tracing::debug!(?grace, "terminating ranks");
        let steps = self.kill.terminate(Instant::now(), grace);
        self.apply(steps);
    }

    fn apply(&mut self, steps: Vec<KillStep>) {
        for step in steps {
            match step {
                KillStep::TerminateChildren(grace) => self.children.terminate(grace),
                KillStep::SignalRanks(sig) => self.signal_ranks(sig),
                KillStep::KillStragglers => {
                    // The PMIx server goes with the ranks, on purpose: not news.
                    self.drop_pmix();
                    procs::kill_descendants(&self.children.pids())
                }
                KillStep::KillChildProxies => self.children.kill_unfinished(),
                KillStep::GiveUp => tracing::warn!("giving up on what is left of this node"),
            }
        }
    }

    /// The parent is gone, or this proxy was told to go (a signal): the node goes down.
    /// `unreachable`: the parent cannot read any more (its link closed or went silent), so
    /// what is still sent up is dropped rather than left to block the teardown behind a
    /// socket that will never drain. A signalled proxy keeps sending: its parent wants the
    /// ranks' ends (a scheduler signals every task of a job at once).
    fn lose_upstream(&mut self, why: &str, unreachable: bool) {
        if unreachable {
            let _ = self.up.abandon.send(true);
        }
        if self.orphaned {
            return;
        }
        tracing::debug!("lost upstream: {why}");
        self.orphaned = true;
        self.terminate(Duration::from_millis(self.job.kill_grace_ms));
    }

    fn reap(&mut self) {
        for ended in procs::reap_ended() {
            let (pid, outcome) = (ended.pid, ended.outcome);
            if let Some(local) = self.ranks.by_pid(pid) {
                let usage = &mut self.ranks.get_mut(local).usage;
                usage.ended = record::now_us();
                usage.user_us = ended.user_us;
                usage.system_us = ended.system_us;
                usage.maxrss_kib = ended.maxrss_kib;
                self.rank_reaped(local, outcome);
            } else if let Some(lost) = self.children.reaped(pid, outcome) {
                self.report_lost(lost);
            }
        }
        if !self.swept && !self.holding_ranks() && self.ranks.all_reaped() {
            // Whatever the ranks left behind (a daemonized grandchild holding a pipe or its
            // PMI socket open) goes now, so that their output and PMI reach end of file.
            self.swept = true;
            // The PMIx server has no one left to serve: it goes first, on purpose.
            self.drop_pmix();
            procs::kill_descendants(&self.children.pids());
        }
    }

    fn report_lost(&self, Lost { host, reason }: Lost) {
        let _ = self.up.control.send(Up::ProxyLost { host, reason });
    }

    fn finished(&self) -> bool {
        self.kill.gave_up()
            || (!self.holding_ranks() && self.ranks.finished() && self.children.settled())
    }
}

/// Where a child's frames go up: its ranks' output (and each rank's start, which its output
/// files are named after) on the data path, holding the child's credit until it goes, so that
/// backpressure reaches the child; everything else through the control channel, ahead of
/// queued output, as this
/// node's own reports go. A rank's end must not wait behind megabytes of output at every hop
/// (found by the chaos runner: under heavy output over ssh, a rank's end reached rlaunch
/// after the job's timeout). A PMIx fence part goes up here before the child's entry that
/// follows it, which passes through the dispatcher: the order the root needs.
#[derive(Clone)]
struct Relay {
    data: mpsc::UnboundedSender<Queued>,
    control: mpsc::UnboundedSender<Up>,
    events: mpsc::UnboundedSender<Event>,
}

/// Routes what a child proxy's link reports: its frames go up unchanged (see [`Relay`]),
/// except NodeDone and the fence entries, which are ours to aggregate; everything else about
/// the link goes to the dispatcher.
async fn relay_child(child: usize, event: LinkEvent, relay: Relay) -> bool {
    match event {
        LinkEvent::Up(Up::Ping) => true,
        // With the parent gone, frames have nowhere to go; the link still runs, so that its
        // end reaches the dispatcher.
        LinkEvent::Output { rank, stream, data, debt } => {
            let _ = relay.data.send(Queued::owing(Up::Output { rank, stream, data }, debt));
            true
        }
        LinkEvent::Up(up @ (Up::OutputEnd { .. } | Up::RankStarted { .. })) => {
            let _ = relay.data.send(Queued::plain(up));
            true
        }
        LinkEvent::Up(up)
            if !matches!(up, Up::NodeDone { .. } | Up::FenceIn { .. } | Up::PmixFenceIn { .. }) =>
        {
            let _ = relay.control.send(up);
            true
        }
        event => relay.events.send(Event::Child { child, event }).is_ok(),
    }
}
