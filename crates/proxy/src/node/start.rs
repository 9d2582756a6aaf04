//! How a proxy starts serving: its channel to the parent (the pump up, the reader down),
//! the launch it is given, and the [`Node`] built from it, whose event loop then runs.

use std::collections::{HashMap, HashSet};
use std::ffi::OsString;
use std::os::fd::OwnedFd;
use std::sync::Arc;
use std::time::Duration;

use rlaunch_protocol::control::{Bootstrap, Down, DownFrame, Launch, LinkUp, Up};
use rlaunch_protocol::io::FrameReader;
use rlaunch_protocol::record::{self, FenceTimes, Phase};
use tokio::sync::mpsc;
use tokio::time::Instant;

use super::adoption::{Orphan, Rehome};
use super::upstream::{read_upstream, LinkEnd, UpReader};
use super::{Event, Gate, JobState, Node, Parent};
use crate::kill::Escalation;
use crate::kvs::{FenceScope, Kvs};
use crate::outputs::{Carrying, Outputs};
use crate::place::Placer;
use crate::pmi::PmiJob;
use crate::ranks::RankTable;
use rlaunch_tree::children::Children;
use rlaunch_tree::credit::{Outbox, Window};
use rlaunch_tree::link::{self, LinkRead, LinkWrite};
use rlaunch_tree::procs;
use rlaunch_tree::secure::Secret;
use rlaunch_tree::splice::{self, Carriers};

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

/// A proxy's control channel on its own descriptors (a socketpair or pipes from its parent
/// or the remote shell), not a link it dialed.
#[derive(Clone, Copy)]
pub struct PlainChannel {
    pub input: std::os::fd::RawFd,
    pub output: std::os::fd::RawFd,
    /// The proxy was exec'd, so it may be across a remote shell: its guard watches the
    /// channel (see [`rlaunch_tree::guard`]).
    pub guarded: bool,
}

/// What a proxy forked from rlaunch (or from a forked proxy) is given, in the child (see
/// `crate::fork_proxy`).
pub struct Forked {
    pub launch: Launch,
    /// rlaunch's stdout, for a lone rank's output to be moved into by the proxy itself (see
    /// `outputs::direct`).
    pub stdout: Option<OwnedFd>,
    /// Its own child proxies on this machine, forked already, by their index in its plan's
    /// children (`None`: started otherwise).
    pub children: Vec<Option<std::io::Result<rlaunch_tree::link::ForkedProxy>>>,
}

/// Runs a proxy on its control channel until its subtree is finished; child proxies are
/// started as `proxy_exe`. Returns the exit code of the proxy process. `forked` is what a
/// proxy forked from rlaunch was given; any other reads its launch from its parent. `host` is the
/// name this proxy greets its parent with. `plain`: the control channel's own descriptors,
/// when it is not a link this proxy dialed.
pub async fn serve(
    up_in: LinkRead,
    up_out: LinkWrite,
    proxy_exe: OsString,
    forked: Option<Forked>,
    host: String,
    dial: Option<DialContext>,
    plain: Option<PlainChannel>,
) -> Served {
    procs::become_subreaper();
    let (control_tx, control_rx) = mpsc::unbounded_channel();
    // The link's own messages up (greeting, heartbeat, clock echoes), written ahead of the job's.
    let (link_tx, link_rx) = mpsc::unbounded_channel();
    let (data_tx, data_rx) = mpsc::unbounded_channel();
    let window = Arc::new(Window::default());
    let _ = link_tx.send(LinkUp::Greeting { host: host.clone(), pid: std::process::id() });
    let (abandon, abandoned) = tokio::sync::watch::channel(false);
    let (shed_output, shed) = tokio::sync::watch::channel(false);
    let outbox = Outbox::new(data_rx, window.clone(), shed);
    // The ranks' output goes up in carriers, spliced, when the channel takes splices.
    let splice_to = plain.filter(|_| splice::enabled()).and_then(|c| splice::target(c.output));
    let carrying = plain
        .filter(|_| splice_to.is_some())
        .and_then(|c| splice::target(c.output))
        .map(|upstream| Carrying { carriers: Carriers::new(), upstream });
    // Held until the pump ends: a proxy adopted by rlaunch hands the pump its new link.
    let (rehome_tx, rehome_rx) = mpsc::unbounded_channel();
    let (wanted, wanted_rx) = tokio::sync::watch::channel(false);
    let rehoming = link::Rehoming { links: rehome_rx, wanted: wanted_rx };
    let pump = link::pump_until_abandoned(
        up_out, true, link_rx, control_rx, outbox, splice_to, abandoned, rehoming,
    );
    let pump = tokio::spawn(pump);

    // Down the tree come control messages and stdin, not output: small reads will do.
    let mut reader = FrameReader::with_chunk(up_in, 16 << 10);
    let (launch, direct_stdout, forked_children) = match forked {
        Some(Forked { launch, stdout, children }) => (Some(launch), stdout, children),
        None => (None, None, Vec::new()),
    };
    let (probed, probes) = tokio::sync::watch::channel(0);
    let probed = Arc::new(probed);
    let launch = match launch {
        Some(launch) => Ok(Received::Launch(Box::new(launch))),
        None => {
            let link = LinkEnd { window: &window, link: &link_tx, probed: &probed };
            receive_launch(&mut reader, link).await
        }
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
    link::heartbeat(&link_tx, launch.job.liveness.heartbeat(), || LinkUp::Ping);
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
        rlaunch_tree::guard::start(input, output, patience);
    }
    let (events_tx, events_rx) = mpsc::unbounded_channel();
    // Weak: no echo goes up once the dispatcher is done (this function holds the sender).
    let link = link_tx.downgrade();
    let upstream = UpReader { link: 0, events: events_tx.clone() };
    let read = read_upstream(reader, window.clone(), link.clone(), probed.clone(), upstream);
    let reader = Some(tokio::spawn(read));

    let closed = events_tx.clone();
    let outputs = Outputs::start(data_tx.clone(), carrying, direct_stdout, move |end| {
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
    let pmix_sent = Arc::default();
    let rehome =
        Rehome { pump: rehome_tx.clone(), wanted, window, link, probed, reader, pmix_sent };
    let up = super::Upstream {
        control: control_tx,
        data: data_tx,
        abandon,
        shed_output,
        rehome: Some(rehome),
    };
    let (spawner, outside) = super::world::this_process();
    let parts =
        Parts { up, outputs, events: events_tx, pmi_calls: pmi_tx, probes, spawner, sweeps: true };
    let mut node = Node::new(launch, launched_at, proxy_exe, dial, parts);
    node.forked_children = forked_children;
    if let Some(rehome) = node.up.rehome.as_ref() {
        rehome.wanted.send_replace(node.adoptable());
    }
    let code = node.run(events_rx, pmi_rx, outside).await;
    // Its last frames go up on the link it has, or not at all.
    if let Some(rehome) = node.up.rehome.as_ref() {
        rehome.wanted.send_replace(false);
    }
    drop(node);
    // The pump drains the link's channel to its end before it ends.
    drop(link_tx);
    let _ = tokio::time::timeout(Duration::from_secs(5), pump).await;
    drop(rehome_tx);
    Served::Exit(code)
}

/// What a Node talks through: its parent's channels, its ranks' output hub, its own event
/// queue and its ranks' PMI calls' sender, the parent's clock probes answered, and how it
/// starts and cleans up after processes.
pub(super) struct Parts {
    pub(super) up: super::Upstream,
    pub(super) outputs: Outputs,
    pub(super) events: mpsc::UnboundedSender<Event>,
    pub(super) pmi_calls: mpsc::UnboundedSender<(crate::pmi::PmiPeer, crate::pmi::PmiCall)>,
    pub(super) probes: tokio::sync::watch::Receiver<u32>,
    /// How its ranks' processes are created.
    pub(super) spawner: Box<dyn crate::spawn::Spawner>,
    /// What its processes leave behind is this process's to kill (not in a test's world).
    pub(super) sweeps: bool,
}

impl Node {
    /// The Node of `launch` (had at `launched_at`), before it starts anything: no rank, no
    /// child proxy. `serve` runs it; a unit test drives it with events (`node/tests.rs`).
    pub(super) fn new(
        launch: Launch,
        launched_at: rlaunch_protocol::record::Micros,
        proxy_exe: OsString,
        dial: Option<DialContext>,
        parts: Parts,
    ) -> Node {
        let Parts { up, outputs, events, pmi_calls, probes, spawner, sweeps } = parts;
        let launched = JobState {
            pmi: Arc::new(PmiJob {
                kvsname: launch.job.jobid.clone(),
                size: launch.job.size,
                process_mapping: launch.job.process_mapping.clone(),
                spawner: None,
            }),
            kvs: Kvs::new(FenceScope::Tree, launch.node.ranks.len(), []),
            group: (launch.node.index.0, launch.job.nodes),
        };
        Node {
            phases: vec![(Phase::Launched, launched_at)],
            fds_running: 0,
            fences: FenceTimes::default(),
            jobs: HashMap::from([(0, launched)]),
            pmi_calls,
            placer: Placer::new(launch.node.host.clone()),
            programs: HashMap::new(),
            proxy_exe,
            job: Arc::new(launch.job),
            plan: launch.node,
            ranks: RankTable::default(),
            children: Children::default(),
            up,
            outputs,
            events,
            spawner,
            sweeps,
            kill: Escalation::default(),
            parent: Parent::new(Instant::now()),
            swept: false,
            dial,
            dial_deadline: None,
            pmix: Default::default(),
            late: launch.late,
            awaiting_spawn: launch.late,
            over: false,
            survey: None,
            pmi_activity: 0,
            error_dir: None,
            trap: Default::default(),
            probes,
            gate: Gate::default(),
            top: launch.top,
            orphan: Orphan::No,
            upstream_link: 0,
            ends_sent: Vec::new(),
            stdin_seen: 0,
            fence_entry: None,
            pmix_entry: None,
            asks_out: HashMap::new(),
            deferred: Vec::new(),
            deferred_until: None,
            deaths: Default::default(),
            reaping: HashSet::new(),
            job_fences_up: HashSet::new(),
            copies: None,
            forked_children: Vec::new(),
        }
    }
}

/// The hello and the launch (or a redirect, in its place), and the link's own messages that
/// may come first.
async fn receive_launch(
    reader: &mut FrameReader<LinkRead>,
    link: LinkEnd<'_>,
) -> Result<Received, String> {
    let (found, _) = reader.read_hello().await.map_err(|e| e.to_string())?;
    if found.version != rlaunch_protocol::control::PROTOCOL_VERSION {
        return Err(format!(
            "the launcher speaks protocol version {}, this proxy speaks version {}",
            found.version,
            rlaunch_protocol::control::PROTOCOL_VERSION
        ));
    }
    loop {
        match reader.next::<DownFrame>().await {
            Ok(Some(DownFrame::Link(message))) => {
                if let Some(to) = link.take(message) {
                    return Ok(Received::Redirect(to));
                }
            }
            Ok(Some(DownFrame::Job(Down::Launch(launch)))) => return Ok(Received::Launch(launch)),
            Ok(Some(DownFrame::Job(_))) => {
                return Err("the first frame from the launcher was not a launch".into())
            }
            Ok(None) => return Err("the launcher closed the connection before the launch".into()),
            Err(e) => return Err(e.to_string()),
        }
    }
}
