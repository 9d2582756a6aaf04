//! The Root driven without processes. A Root built for a small plan is fed the events its
//! loop would take (ranks' ends, the tracker's news, signals, deadlines) and checked by the
//! causes it records and the exit status they give; and whole jobs run through its loop
//! (`run_in`) in a world of in-memory links, with proxies the tests script, checked by what
//! the proxies are sent, the output files, the report and the exit status.

use rlaunch_protocol::ids::Gid;
use std::time::Duration;

use nix::sys::signal::Signal;
use rlaunch_protocol::control::{
    DownFrame, LinkDown, LinkUp, RankPlan, Segment, SpawnCmd, SpawnOutcome, SpawnRequest,
};
use rlaunch_protocol::ids::{ExitOutcome, Stream};
use rlaunch_protocol::io::FrameReader;
use rlaunch_protocol::record::NodeRecord;
use rlaunch_tree::dialin::Dialed;
use rlaunch_tree::link::{pump, Greeting, ProxyProcess};

use super::*;

/// A job of `size` ranks, all on one forked node, nothing started.
fn plan(size: u32) -> Plan {
    plan_of(&[size])
}

/// A job with `ranks[i]` ranks on node `i` (host `n{i}`), ranks numbered node by node.
fn plan_of(ranks: &[u32]) -> Plan {
    let segment = Segment {
        exe: b"./a".to_vec(),
        args: vec![],
        inherit_env: true,
        env: vec![],
        wdir: b"/w".to_vec(),
    };
    let size = ranks.iter().sum();
    let job = Job::simple("j", size, vec![segment]);
    let (mut roots, mut rank_node, mut first) = (Vec::new(), Vec::new(), 0);
    for (index, &count) in ranks.iter().enumerate() {
        let ranks = (first..first + count).map(|rank| RankPlan { rank, segment: 0 }).collect();
        roots.push(NodePlan {
            index: rlaunch_protocol::ids::NodeId(index as u32),
            host: format!("n{index}"),
            fork: true,
            ranks,
            children: vec![],
        });
        rank_node.resize(rank_node.len() + count as usize, index as u32);
        first += count;
    }
    Plan {
        job,
        node_hosts: roots.iter().map(|r| r.host.clone()).collect(),
        roots,
        rank_node,
        proxy_exe: "rlaunch-proxy".into(),
        output: OutputSpec::default(),
        print_all_exit_codes: false,
        report_bindings: false,
        timeout: None,
        forked: Vec::new(),
        dial: None,
        notices: Vec::new(),
        report: None,
        timeline: None,
        command: vec!["rlaunch".into()],
        started_us: 0,
        universe: crate::place::Universe::new(&[], false, size),
        own_host: "n0".into(),
        forced_remote: false,
        tracker: None,
    }
}

fn root(plan: Plan) -> Root {
    let (drop_output, _) = watch::channel(false);
    let (spawned_jobs, _) = std::sync::mpsc::channel();
    Root::new(plan, None, drop_output, spawned_jobs)
}

fn ended(rank: u32, outcome: ExitOutcome) -> Up {
    let usage = Default::default();
    Up::RankExited { rank: Gid(rank), pid: 100 + rank, outcome, unfinalized: false, usage }
}

/// The exit status the Root's first cause gives (0 without one).
fn status(root: &Root) -> i32 {
    root.causes.first().map_or(0, Cause::exit_code)
}

#[tokio::test(flavor = "current_thread")]
async fn the_first_failing_rank_decides_and_a_clean_job_exits_0() {
    let mut clean = root(plan(2));
    clean.handle_up(ended(0, ExitOutcome::Exited(0)));
    clean.handle_up(ended(1, ExitOutcome::Exited(0)));
    assert!(clean.roll.all_ended() && clean.causes.is_empty());
    assert_eq!(status(&clean), 0);

    let mut failing = root(plan(3));
    failing.handle_up(ended(1, ExitOutcome::Exited(3)));
    failing.handle_up(ended(2, ExitOutcome::Signaled(9)));
    assert!(matches!(failing.causes[0], Cause::RankFailed { rank: Gid(1), pid: 101, .. }));
    assert_eq!(status(&failing), 3);
    assert!(failing.teardown.started(), "the first failure starts the teardown");
}

#[tokio::test(flavor = "current_thread")]
async fn a_rank_gone_before_it_joined_the_tracker_strands_the_workers_that_did() {
    let mut root = root(plan(3));
    root.turnout = Some(crate::tracker::rabit::Turnout::new(3));
    root.tracker_news(crate::tracker::News::Started { rank: 0 });
    root.handle_up(ended(1, ExitOutcome::Exited(0)));
    assert!(matches!(root.causes[0], Cause::TrackerAbsent { rank: Gid(1) }), "{:?}", root.causes);
    assert_eq!(status(&root), 255);
}

#[tokio::test(flavor = "current_thread")]
async fn ends_of_a_forwarded_sigint_within_its_grace_are_its_doing() {
    let mut root = root(plan(2));
    root.on_signal(Signal::SIGINT);
    // Python's KeyboardInterrupt ends each rank by the signal itself: held, not a failure.
    root.handle_up(ended(0, ExitOutcome::Signaled(Signal::SIGINT as i32)));
    assert!(root.causes.is_empty(), "{:?}", root.causes);
    // Every rank ended of it: the job ends now, interrupted.
    root.handle_up(ended(1, ExitOutcome::Signaled(Signal::SIGINT as i32)));
    assert!(matches!(root.causes[0], Cause::Forwarded(Signal::SIGINT)), "{:?}", root.causes);
    assert_eq!(status(&root), 130);
}

#[tokio::test(flavor = "current_thread")]
async fn the_earliest_deadline_is_next_and_the_timeout_ends_the_job() {
    let mut plan = plan(1);
    plan.timeout = Some(Duration::from_secs(5));
    let mut root = root(plan);
    let (at, which) = root.next_deadline().expect("the timeout");
    assert_eq!(which, deadline::Deadline::Timeout);
    let left = at.saturating_duration_since(Instant::now());
    assert!(left > Duration::from_secs(4) && left <= Duration::from_secs(5), "{left:?}");
    root.on_deadline(which, false);
    assert!(matches!(root.causes[0], Cause::TimedOut(t) if t == Duration::from_secs(5)));
    assert_eq!(status(&root), 124);
    // The teardown's own deadlines come next; the timeout is spent.
    assert!(root.next_deadline().is_none_or(|(_, next)| next != deadline::Deadline::Timeout));
}

/// A proxy in memory: it reads what the Root sends down its link and answers as a proxy
/// would, as a test script says.
struct FakeProxy {
    down: FrameReader<tokio::io::ReadHalf<tokio::io::DuplexStream>>,
    said_hello: bool,
    up: mpsc::UnboundedSender<Up>,
}

impl FakeProxy {
    /// A proxy for `host` that has greeted, and the Root's end of its link.
    fn new(host: &str) -> (FakeProxy, ProxyProcess) {
        FakeProxy::linked(Some(host))
    }

    /// A proxy for `host` that dialed in: its greeting came with the dial, not on its link.
    fn dialed(host: &str) -> (FakeProxy, Dialed) {
        let (fake, process) = FakeProxy::linked(None);
        let greeting = Greeting { host: host.to_string(), pid: 4242, preamble: Vec::new() };
        (fake, Dialed { process, greeting })
    }

    /// A proxy and the Root's end of its link; the proxy says hello and greets as `host`.
    fn linked(host: Option<&str>) -> (FakeProxy, ProxyProcess) {
        let (ours, theirs) = tokio::io::duplex(1 << 20);
        let (read, write) = tokio::io::split(ours);
        let process = ProxyProcess::over(Box::new(read), Box::new(write));
        let (read, mut write) = tokio::io::split(theirs);
        let (up, mut up_rx) = mpsc::unbounded_channel();
        let (link, mut link_rx) = mpsc::unbounded_channel();
        if let Some(host) = host {
            link.send(LinkUp::Greeting { host: host.to_string(), pid: 4242 }).expect("open");
        }
        let hello = host.is_some();
        tokio::spawn(async move {
            let _link = link;
            let _ = pump(&mut write, hello, &mut link_rx, &mut up_rx, None, None).await;
            // The proxy is gone: the Root reads the end of its link.
            let _ = tokio::io::AsyncWriteExt::shutdown(&mut write).await;
        });
        (FakeProxy { down: FrameReader::new(read), said_hello: false, up }, process)
    }

    /// The next of the job's messages down its link (the link's own, pings and clock
    /// probes, are the tree's business: skipped).
    async fn next(&mut self) -> Down {
        loop {
            match self.frame().await {
                DownFrame::Job(down) => return down,
                DownFrame::Link(_) => continue,
            }
        }
    }

    /// The next frame down its link, the link's own included.
    async fn frame(&mut self) -> DownFrame {
        if !std::mem::replace(&mut self.said_hello, true) {
            self.down.read_hello().await.expect("the Root's hello");
        }
        self.down.next::<DownFrame>().await.expect("a frame").expect("the link open")
    }

    fn send(&self, up: Up) {
        self.up.send(up).expect("its link is open");
    }

    /// Its launch came, with its node's plan: returns the node.
    async fn launched(&mut self, host: &str) -> NodeId {
        match self.next().await {
            Down::Launch(launch) => {
                assert_eq!(launch.node.host, host);
                launch.node.index
            }
            other => panic!("expected the launch, got {other:?}"),
        }
    }

    /// Its subtree is finished: says so and closes its link.
    fn done(self, node: NodeId) {
        let record = Box::new(NodeRecord { node, ..Default::default() });
        self.send(Up::NodeDone { node, record });
    }
}

/// What a test sends the Root as this process's world would: signals, stdin's chunks
/// (`None`: its end), and its processes' ends.
struct Outside {
    signals: mpsc::UnboundedSender<Signal>,
    stdin: mpsc::Sender<Option<Vec<u8>>>,
    ended: mpsc::UnboundedSender<rlaunch_tree::procs::Ended>,
}

/// The pid of the launcher of an in-memory world: one no process has (the kernel's pids stop
/// short of it).
const LAUNCHER_PID: i32 = i32::MAX - 1;

/// Proxies in memory: the Root's ends of the top ones' links, by index, of those the run
/// starts later, by host, and the proxies that dial in once the launcher starts, in order.
struct InMemory {
    top: Vec<Option<ProxyProcess>>,
    late: Vec<(String, ProxyProcess)>,
    dialing: Vec<Dialed>,
}

impl world::Proxies for InMemory {
    fn top(&mut self, index: usize, _: &NodePlan) -> std::io::Result<Option<ProxyProcess>> {
        // None: it dials in.
        Ok(self.top.get_mut(index).and_then(Option::take))
    }

    fn late(&mut self, node: &NodePlan, _: bool) -> std::io::Result<ProxyProcess> {
        let at = self.late.iter().position(|(host, _)| *host == node.host);
        let at = at.ok_or_else(|| std::io::Error::other(format!("no proxy for {}", node.host)))?;
        Ok(self.late.remove(at).1)
    }

    fn dial(
        &mut self,
        plan: &DialPlan,
        hosts: &[&str],
        dialed: mpsc::UnboundedSender<Dialed>,
    ) -> std::io::Result<dial::Started> {
        let callers: Vec<&str> = self.dialing.iter().map(|d| d.greeting.host.as_str()).collect();
        assert_eq!(plan.launcher, ["srun"]);
        assert!(callers.iter().all(|c| hosts.contains(c)), "{callers:?} not all in {hosts:?}");
        let dialing = std::mem::take(&mut self.dialing);
        let acceptor = tokio::spawn(async move {
            for proxy in dialing {
                let _ = dialed.send(proxy);
            }
        });
        Ok(dial::Started { pid: LAUNCHER_PID, acceptor })
    }
}

/// A world of in-memory proxies, one per top node and one per host of `late` (for the run to
/// start): the Root's ends go to the Root, the proxies' ends to the test, with the signals and
/// stdin it sends.
fn world_with(hosts: &[&str], late: &[&str]) -> (World, Vec<FakeProxy>, Vec<FakeProxy>, Outside) {
    let (fakes, top): (Vec<_>, Vec<_>) =
        hosts.iter().map(|h| FakeProxy::new(h)).map(|(f, p)| (f, Some(p))).unzip();
    let (late_fakes, late): (Vec<_>, Vec<_>) = late
        .iter()
        .map(|h| {
            let (fake, process) = FakeProxy::new(h);
            (fake, (h.to_string(), process))
        })
        .unzip();
    let proxies = Box::new(InMemory { top, late, dialing: Vec::new() });
    let (world, outside) = world_of(proxies);
    (world, fakes, late_fakes, outside)
}

/// A world of `proxies`, and what the test sends it.
fn world_of(proxies: Box<InMemory>) -> (World, Outside) {
    let (signals_tx, signals) = mpsc::unbounded_channel();
    let (stdin_tx, stdin) = mpsc::channel(1);
    let (ended_tx, ended) = mpsc::unbounded_channel();
    let outside = Outside { signals: signals_tx, stdin: stdin_tx, ended: ended_tx };
    let world = World { proxies, signals, stdin: Some(stdin), ended, sweeps: false };
    (world, outside)
}

/// A world whose proxies are started by a scheduler's launcher, one per host of `hosts`,
/// each dialing in, in that order.
fn dialing_world(hosts: &[&str]) -> (World, Vec<FakeProxy>, Outside) {
    let (fakes, dialing): (Vec<_>, Vec<_>) = hosts.iter().map(|h| FakeProxy::dialed(h)).unzip();
    let proxies = Box::new(InMemory { top: Vec::new(), late: Vec::new(), dialing });
    let (world, outside) = world_of(proxies);
    (world, fakes, outside)
}

/// [`world_with`] no proxy started later.
fn world(hosts: &[&str]) -> (World, Vec<FakeProxy>, Outside) {
    let (world, fakes, _, outside) = world_with(hosts, &[]);
    (world, fakes, outside)
}

/// A directory of a test's own, removed at its end.
struct Scratch(std::path::PathBuf);

impl Scratch {
    fn new(name: &str) -> Scratch {
        let dir = std::env::temp_dir().join(format!("rlaunch-root-{}-{name}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).expect("scratch directory");
        Scratch(dir)
    }

    fn path(&self) -> &std::path::Path {
        &self.0
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// The output of a plan's ranks goes to files under `dir` (`DIR/rank.R/stdout`), and its
/// report to `dir/report.json`.
fn to_files(plan: &mut Plan, dir: &std::path::Path) {
    plan.output.dir =
        Some(crate::output::OutputDir { path: dir.to_path_buf(), copy: false, per_job: false });
    plan.report = Some(OutFile::create(dir.join("report.json")).expect("report file"));
}

/// One rank on each of n0 and n1, no stdin, output and report to files under `dir`.
fn two_nodes_to_files(dir: &std::path::Path) -> Plan {
    let mut plan = plan_of(&[1, 1]);
    plan.job.stdin = StdinTarget::None;
    to_files(&mut plan, dir);
    plan
}

fn read_report(dir: &std::path::Path) -> serde_json::Value {
    let text = std::fs::read_to_string(dir.join("report.json")).expect("report written");
    serde_json::from_str(&text).expect("report is JSON")
}

#[tokio::test(flavor = "current_thread")]
async fn a_whole_job_runs_over_in_memory_links() {
    let dir = Scratch::new("whole");
    let plan = two_nodes_to_files(dir.path());
    let (world, fakes, _outside) = world(&["n0", "n1"]);
    let proxies = fakes.into_iter().enumerate().map(|(i, mut proxy)| async move {
        let rank = Gid(i as u32);
        let node = proxy.launched(&format!("n{i}")).await;
        proxy.send(Up::RankStarted { rank, pid: 100 + rank.0, cpus: None, gpus: None });
        let line = format!("hello from {i}\n").into_bytes();
        proxy.send(Up::Output { rank, stream: Stream::Stdout, data: line });
        proxy.send(Up::OutputEnd { rank, stream: Stream::Stdout });
        // The fence completes once both top proxies are in, with every pair.
        let pairs = vec![(format!("k{i}"), format!("v{i}"))];
        proxy.send(Up::FenceIn { epoch: 0, pairs });
        match proxy.next().await {
            Down::FenceOut { epoch: 0, mut pairs } => {
                pairs.sort();
                let want = [("k0", "v0"), ("k1", "v1")].map(|(k, v)| (k.into(), v.into()));
                assert_eq!(pairs, want, "node {i}");
            }
            other => panic!("expected the fence's end, got {other:?}"),
        }
        proxy.send(ended(rank.0, ExitOutcome::Exited(0)));
        proxy.done(node);
    });
    let (code, _) = tokio::join!(run_in(plan, world), futures_join(proxies));
    assert_eq!(code, 0);
    for i in 0..2 {
        let out = std::fs::read_to_string(dir.path().join(format!("rank.{i}/stdout")));
        assert_eq!(out.expect("rank's output file"), format!("hello from {i}\n"));
    }
    let report = read_report(dir.path());
    assert_eq!(report["job"]["exit_code"], 0);
    assert_eq!(report["job"]["fences"], 1);
    let pids: Vec<_> =
        report["ranks"].as_array().expect("ranks").iter().map(|r| &r["pid"]).collect();
    assert_eq!(pids, [100, 101]);
}

#[tokio::test(flavor = "current_thread")]
async fn a_proxy_whose_link_ends_before_it_is_done_is_lost_and_the_rest_torn_down() {
    let dir = Scratch::new("lost");
    let plan = two_nodes_to_files(dir.path());
    let grace = plan.job.kill_grace_ms;
    let (world, mut fakes, _outside) = world(&["n0", "n1"]);
    let (mut lasting, mut lost) = (fakes.remove(0), fakes.remove(0));
    let script = async move {
        let node = lasting.launched("n0").await;
        lost.launched("n1").await;
        drop(lost);
        match lasting.next().await {
            Down::Terminate { grace_ms } => assert_eq!(grace_ms, grace),
            other => panic!("expected the teardown, got {other:?}"),
        }
        lasting.send(ended(0, ExitOutcome::Signaled(15)));
        lasting.done(node);
    };
    let (code, _) = tokio::join!(run_in(plan, world), script);
    assert_eq!(code, 255);
    let report = read_report(dir.path());
    assert_eq!(report["job"]["cause"], "lost proxy on n1 (its connection closed)");
}

#[tokio::test(flavor = "current_thread")]
async fn signals_go_down_to_every_proxy_and_stdin_to_the_rank_that_reads_it() {
    let mut plan = plan_of(&[1, 1]);
    plan.job.stdin = StdinTarget::Rank(1);
    let (world, fakes, outside) = world(&["n0", "n1"]);
    let proxies = fakes.into_iter().enumerate().map(|(i, mut proxy)| {
        let (signals, stdin) = (outside.signals.clone(), outside.stdin.clone());
        async move {
            let node = proxy.launched(&format!("n{i}")).await;
            if i == 1 {
                // Only rank 1 reads stdin: its proxy alone gets it.
                stdin.send(Some(b"abc".to_vec())).await.expect("stdin");
                match proxy.next().await {
                    Down::Stdin { seq, data } => {
                        assert_eq!(data, b"abc");
                        proxy.send(Up::StdinAck { seq });
                    }
                    other => panic!("expected stdin, got {other:?}"),
                }
                stdin.send(None).await.expect("stdin's end");
            }
            // Its end goes to every proxy (a rank that reads none has its stdin closed).
            assert!(matches!(proxy.next().await, Down::StdinEof));
            if i == 1 {
                signals.send(Signal::SIGTERM).expect("signal");
            }
            match proxy.next().await {
                Down::Signal { signo } => assert_eq!(signo, Signal::SIGTERM as i32),
                other => panic!("expected the signal, got {other:?}"),
            }
            proxy.send(ended(i as u32, ExitOutcome::Signaled(Signal::SIGTERM as i32)));
            proxy.done(node);
        }
    });
    let (code, _) = tokio::join!(run_in(plan, world), futures_join(proxies));
    // Every rank ended of the signal rlaunch forwarded: 128 + 15.
    assert_eq!(code, 143);
}

/// `plan` started by srun, its proxies dialing back to rlaunch on loopback.
fn dialing(plan: &mut Plan) {
    plan.dial = Some(DialPlan {
        launcher: vec!["srun".into()],
        proxy_path: "rlaunch-proxy".into(),
        bind: std::net::Ipv4Addr::LOCALHOST.into(),
        overlap: false,
    });
}

/// How the launcher ended, as this process's reaper would say.
fn launcher_ended(outcome: ExitOutcome) -> rlaunch_tree::procs::Ended {
    let pid = LAUNCHER_PID;
    rlaunch_tree::procs::Ended { pid, outcome, user_us: 0, system_us: 0, maxrss_kib: 0 }
}

#[tokio::test(flavor = "current_thread")]
async fn proxies_that_dial_in_go_where_the_tree_puts_them_and_the_job_waits_for_the_launcher() {
    // n1 is n0's child: it dials rlaunch first, and is sent on once n0 listens.
    let mut plan = plan_of(&[1, 1]);
    plan.job.stdin = StdinTarget::None;
    let n1 = plan.roots.pop().expect("two roots");
    plan.roots[0].children.push(n1);
    dialing(&mut plan);
    let (world, mut fakes, outside) = dialing_world(&["n1", "n0"]);
    let (mut n1, mut n0) = (fakes.remove(0), fakes.remove(0));
    let script = async move {
        let node = n0.launched("n0").await;
        n0.send(Up::Listening { node, address: "127.0.0.1:7001".into() });
        match n1.frame().await {
            DownFrame::Link(LinkDown::Redirect { to }) => assert_eq!(to, "127.0.0.1:7001"),
            other => panic!("expected n1 sent on to n0, got {other:?}"),
        }
        // n0's subtree (n1 with it) runs both ranks; rlaunch hears of them through n0.
        n0.send(ended(1, ExitOutcome::Exited(0)));
        n0.send(ended(0, ExitOutcome::Exited(0)));
        n0.done(node);
        outside.ended.send(launcher_ended(ExitOutcome::Exited(0))).expect("the Root runs");
    };
    let (code, _) = tokio::join!(run_in(plan, world), script);
    assert_eq!(code, 0);
}

#[tokio::test(flavor = "current_thread")]
async fn a_launcher_that_ends_before_a_proxy_called_back_loses_that_proxy_and_ends_the_job() {
    let dir = Scratch::new("dial-lost");
    let mut plan = two_nodes_to_files(dir.path());
    dialing(&mut plan);
    // Only n0's proxy calls back.
    let (world, mut fakes, outside) = dialing_world(&["n0"]);
    let mut n0 = fakes.remove(0);
    let script = async move {
        let node = n0.launched("n0").await;
        outside.ended.send(launcher_ended(ExitOutcome::Exited(1))).expect("the Root runs");
        assert!(matches!(n0.next().await, Down::Terminate { .. }));
        n0.send(ended(0, ExitOutcome::Signaled(15)));
        n0.done(node);
    };
    let (code, _) = tokio::join!(run_in(plan, world), script);
    assert_eq!(code, 255);
    let report = read_report(dir.path());
    let cause = "lost proxy on n1 (srun exited with code 1 before its proxy called back)";
    assert_eq!(report["job"]["cause"], cause);
}

/// Runs the futures together on this task.
async fn futures_join<F: std::future::Future<Output = ()>>(all: impl IntoIterator<Item = F>) {
    let mut set: Vec<_> = all.into_iter().map(Box::pin).collect();
    std::future::poll_fn(|cx| {
        set.retain_mut(|f| f.as_mut().poll(cx).is_pending());
        if set.is_empty() {
            std::task::Poll::Ready(())
        } else {
            std::task::Poll::Pending
        }
    })
    .await
}

/// rlaunch reads at most [`STDIN_WINDOW`] chunks of its stdin ahead of the ranks: the next is
/// read, and sent, only once an earlier one was written into every rank that reads it.
#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn stdin_goes_down_in_a_window_that_acknowledgements_reopen() {
    let mut plan = plan_of(&[1]);
    plan.job.stdin = StdinTarget::Rank(0);
    let (world, mut fakes, outside) = world(&["n0"]);
    let mut proxy = fakes.remove(0);
    let window = STDIN_WINDOW as u64;
    let feeder = async move {
        for i in 0..=window {
            outside.stdin.send(Some(vec![i as u8])).await.expect("stdin is read");
        }
        outside.stdin.send(None).await.expect("stdin's end is read");
    };
    let script = async move {
        let node = proxy.launched("n0").await;
        for seq in 1..=window {
            match proxy.next().await {
                Down::Stdin { seq: got, data } => {
                    assert_eq!((got, data), (seq, vec![seq as u8 - 1]))
                }
                other => panic!("expected stdin, got {other:?}"),
            }
        }
        // The window is full: the next chunk waits, however long the rank takes (the clock
        // is paused: a second passes only once everything is idle).
        let more = tokio::time::timeout(Duration::from_secs(1), proxy.next()).await;
        assert!(more.is_err(), "a chunk past the window: {more:?}");
        proxy.send(Up::StdinAck { seq: 1 });
        match proxy.next().await {
            Down::Stdin { seq, data } => assert_eq!((seq, data), (window + 1, vec![window as u8])),
            other => panic!("expected the chunk the acknowledgement let through, got {other:?}"),
        }
        // Full again: even stdin's end waits for room.
        let more = tokio::time::timeout(Duration::from_secs(1), proxy.next()).await;
        assert!(more.is_err(), "stdin's end past the window: {more:?}");
        proxy.send(Up::StdinAck { seq: 2 });
        assert!(matches!(proxy.next().await, Down::StdinEof));
        proxy.send(ended(0, ExitOutcome::Exited(0)));
        proxy.done(node);
    };
    let (code, _, _) = tokio::join!(run_in(plan, world), feeder, script);
    assert_eq!(code, 0);
}

/// MPI_Comm_spawn onto a host the job had no proxy on (`add-host`): the Root starts one there
/// through its world, launched late for the spawned job alone; the parent hears its children
/// started, and their ends and the parent's end the job.
#[tokio::test(flavor = "current_thread")]
async fn a_spawn_onto_a_new_host_starts_a_late_proxy_there() {
    let mut plan = plan_of(&[1]);
    plan.job.stdin = StdinTarget::None;
    let (world, mut fakes, mut late, _outside) = world_with(&["n0"], &["n9"]);
    let (mut parent, mut child) = (fakes.remove(0), late.remove(0));
    let script = async move {
        let node = parent.launched("n0").await;
        let cmd = SpawnCmd {
            exe: "./child".into(),
            args: vec![],
            nprocs: 1,
            info: vec![("add-host".into(), "n9".into())],
            env: vec![],
        };
        let request = SpawnRequest { cmds: vec![cmd], preput: vec![] };
        parent.send(Up::Spawn { rank: Gid(0), tag: Some("t".into()), request });
        let late_node = match child.next().await {
            Down::Launch(launch) => {
                assert!(launch.late && launch.node.ranks.is_empty(), "{launch:?}");
                assert_eq!(launch.node.host, "n9");
                launch.node.index
            }
            other => panic!("expected the late proxy's launch, got {other:?}"),
        };
        let spawned = match child.next().await {
            Down::Spawn(spawned) => spawned,
            other => panic!("expected the spawn, got {other:?}"),
        };
        assert_eq!((spawned.job, spawned.first, spawned.size()), (1, 1, 1));
        assert_eq!(spawned.nodes, [(late_node, "n9".to_string())]);
        child.send(Up::SpawnStarted { job: 1, node: late_node, refused: None });
        // Every node hears of the spawn; the parent's then has its answer.
        assert!(matches!(parent.next().await, Down::Spawn(_)));
        match parent.next().await {
            Down::SpawnAnswer { rank: Gid(0), tag, outcome: SpawnOutcome::Started { kvsname } } => {
                assert_eq!((tag.as_deref(), kvsname), (Some("t"), spawned.kvsname.clone()))
            }
            other => panic!("expected the spawn's answer, got {other:?}"),
        }
        child.send(ended(1, ExitOutcome::Exited(0)));
        child.done(late_node);
        parent.send(ended(0, ExitOutcome::Exited(0)));
        parent.done(node);
    };
    let (code, _) = tokio::join!(run_in(plan, world), script);
    assert_eq!(code, 0);
}
