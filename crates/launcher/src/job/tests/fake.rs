//! The in-memory world the whole-job tests run the Root in: proxies scripted by the test
//! over duplex streams, the launcher of a dialing launch, and what the test sends as this
//! process's world would (signals, stdin, processes' ends).

use rlaunch_protocol::control::{DownFrame, LinkUp};
use rlaunch_protocol::io::FrameReader;
use rlaunch_protocol::record::NodeRecord;
use rlaunch_tree::dialin::Dialed;
use rlaunch_tree::link::{pump, Greeting, ProxyProcess};

use nix::sys::signal::Signal;
use rlaunch_protocol::ids::ExitOutcome;

use super::plan_of;
use crate::job::*;

/// A proxy in memory: it reads what the Root sends down its link and answers as a proxy
/// would, as a test script says.
pub(super) struct FakeProxy {
    down: FrameReader<tokio::io::ReadHalf<tokio::io::DuplexStream>>,
    said_hello: bool,
    up: mpsc::UnboundedSender<Up>,
}

impl FakeProxy {
    /// A proxy for `host` that has greeted, and the Root's end of its link.
    pub(super) fn new(host: &str) -> (FakeProxy, ProxyProcess) {
        FakeProxy::linked(Some(host))
    }

    /// A proxy for `host` that dialed in: its greeting came with the dial, not on its link.
    pub(super) fn dialed(host: &str) -> (FakeProxy, Dialed) {
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
    pub(super) async fn next(&mut self) -> Down {
        loop {
            match self.frame().await {
                DownFrame::Job(down) => return down,
                DownFrame::Link(_) => continue,
            }
        }
    }

    /// The next frame down its link, the link's own included.
    pub(super) async fn frame(&mut self) -> DownFrame {
        if !std::mem::replace(&mut self.said_hello, true) {
            self.down.read_hello().await.expect("the Root's hello");
        }
        self.down.next::<DownFrame>().await.expect("a frame").expect("the link open")
    }

    pub(super) fn send(&self, up: Up) {
        self.up.send(up).expect("its link is open");
    }

    /// Its launch came, with its node's plan: returns the node.
    pub(super) async fn launched(&mut self, host: &str) -> NodeId {
        match self.next().await {
            Down::Launch(launch) => {
                assert_eq!(launch.node.host, host);
                launch.node.index
            }
            other => panic!("expected the launch, got {other:?}"),
        }
    }

    /// Its subtree is finished: says so and closes its link.
    pub(super) fn done(self, node: NodeId) {
        let record = Box::new(NodeRecord { node, ..Default::default() });
        self.send(Up::NodeDone { node, record });
    }
}

/// What a test sends the Root as this process's world would: signals, stdin's chunks
/// (`None`: its end), and its processes' ends.
pub(super) struct Outside {
    pub(super) signals: mpsc::UnboundedSender<Signal>,
    pub(super) stdin: mpsc::Sender<Option<Vec<u8>>>,
    pub(super) ended: mpsc::UnboundedSender<rlaunch_tree::procs::Ended>,
}

/// The pid of the launcher of an in-memory world: one no process has (the kernel's pids stop
/// short of it).
pub(super) const LAUNCHER_PID: i32 = i32::MAX - 1;

/// The pid of the launcher of a proxy started during the run in a dialing world.
pub(super) const LATE_LAUNCHER_PID: i32 = i32::MAX - 2;

/// Proxies in memory: the Root's ends of the top ones' links, by index, of those the run
/// starts later, by host, and the proxies that dial in once the launcher starts, in order;
/// in a dialing world, those its launchers of one proxy start later (which dial in at once),
/// and where they arrive.
struct InMemory {
    top: Vec<Option<ProxyProcess>>,
    late: Vec<(String, ProxyProcess)>,
    dialing: Vec<Dialed>,
    late_dialing: Vec<Dialed>,
    dialed: Option<mpsc::UnboundedSender<Dialed>>,
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
        self.dialed = Some(dialed.clone());
        let acceptor = tokio::spawn(async move {
            for proxy in dialing {
                let _ = dialed.send(proxy);
            }
        });
        let address = std::net::SocketAddr::from((plan.bind, 7000));
        let secret = rlaunch_tree::secure::Secret::generate().expect("random bytes");
        Ok(dial::Started { pid: LAUNCHER_PID, acceptor, back: dial::DialBack { address, secret } })
    }

    /// The proxy of `host` dials in at once, if the test has one for it; otherwise its
    /// launcher runs and it never calls.
    fn dial_late(&mut self, _: &DialPlan, host: &str, _: &dial::DialBack) -> std::io::Result<i32> {
        let at = self.late_dialing.iter().position(|d| d.greeting.host == host);
        if let (Some(at), Some(dialed)) = (at, &self.dialed) {
            let _ = dialed.send(self.late_dialing.remove(at));
        }
        Ok(LATE_LAUNCHER_PID)
    }
}

/// A world of in-memory proxies, one per top node and one per host of `late` (for the run to
/// start): the Root's ends go to the Root, the proxies' ends to the test, with the signals and
/// stdin it sends.
pub(super) fn world_with(
    hosts: &[&str],
    late: &[&str],
) -> (World, Vec<FakeProxy>, Vec<FakeProxy>, Outside) {
    let (fakes, top): (Vec<_>, Vec<_>) =
        hosts.iter().map(|h| FakeProxy::new(h)).map(|(f, p)| (f, Some(p))).unzip();
    let (late_fakes, late): (Vec<_>, Vec<_>) = late
        .iter()
        .map(|h| {
            let (fake, process) = FakeProxy::new(h);
            (fake, (h.to_string(), process))
        })
        .unzip();
    let (dialing, late_dialing, dialed) = (Vec::new(), Vec::new(), None);
    let proxies = Box::new(InMemory { top, late, dialing, late_dialing, dialed });
    let (world, outside) = world_of(proxies);
    (world, fakes, late_fakes, outside)
}

/// A world of `proxies`, and what the test sends it.
fn world_of(proxies: Box<InMemory>) -> (World, Outside) {
    let (signals_tx, signals) = mpsc::unbounded_channel();
    let (stdin_tx, stdin) = mpsc::channel(1);
    let (ended_tx, ended) = mpsc::unbounded_channel();
    let outside = Outside { signals: signals_tx, stdin: stdin_tx, ended: ended_tx };
    let ended = rlaunch_tree::procs::Reaper::Sent(ended);
    let world = World { proxies, signals, stdin: Some(stdin), ended, asks: None };
    (world, outside)
}

/// A world whose proxies are started by a scheduler's launcher, one per host of `hosts`,
/// each dialing in, in that order.
pub(super) fn dialing_world(hosts: &[&str]) -> (World, Vec<FakeProxy>, Outside) {
    let (world, fakes, _, outside) = dialing_world_with(hosts, &[]);
    (world, fakes, outside)
}

/// [`dialing_world`], with a proxy for each host of `late` that the run starts later through
/// a launcher of its own, dialing in as soon as it is started.
pub(super) fn dialing_world_with(
    hosts: &[&str],
    late: &[&str],
) -> (World, Vec<FakeProxy>, Vec<FakeProxy>, Outside) {
    let (fakes, dialing): (Vec<_>, Vec<_>) = hosts.iter().map(|h| FakeProxy::dialed(h)).unzip();
    let (late_fakes, late_dialing): (Vec<_>, Vec<_>) =
        late.iter().map(|h| FakeProxy::dialed(h)).unzip();
    let proxies = Box::new(InMemory {
        top: Vec::new(),
        late: Vec::new(),
        dialing,
        late_dialing,
        dialed: None,
    });
    let (world, outside) = world_of(proxies);
    (world, fakes, late_fakes, outside)
}

/// [`world_with`] no proxy started later.
pub(super) fn world(hosts: &[&str]) -> (World, Vec<FakeProxy>, Outside) {
    let (world, fakes, _, outside) = world_with(hosts, &[]);
    (world, fakes, outside)
}

/// A directory of a test's own, removed at its end.
pub(super) struct Scratch(std::path::PathBuf);

impl Scratch {
    pub(super) fn new(name: &str) -> Scratch {
        let dir = std::env::temp_dir().join(format!("rlaunch-root-{}-{name}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).expect("scratch directory");
        Scratch(dir)
    }

    pub(super) fn path(&self) -> &std::path::Path {
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
pub(super) fn to_files(plan: &mut Plan, dir: &std::path::Path) {
    plan.output.dir =
        Some(crate::output::OutputDir { path: dir.to_path_buf(), copy: false, per_job: false });
    plan.report = Some(OutFile::create(dir.join("report.json")).expect("report file"));
}

/// One rank on each of n0 and n1, no stdin, output and report to files under `dir`.
pub(super) fn two_nodes_to_files(dir: &std::path::Path) -> Plan {
    let mut plan = plan_of(&[1, 1]);
    plan.job.stdin = StdinTarget::None;
    to_files(&mut plan, dir);
    plan
}

pub(super) fn read_report(dir: &std::path::Path) -> serde_json::Value {
    let text = std::fs::read_to_string(dir.join("report.json")).expect("report written");
    serde_json::from_str(&text).expect("report is JSON")
}

/// `plan` started by srun, its proxies dialing back to rlaunch on loopback.
pub(super) fn dialing(plan: &mut Plan) {
    plan.job.bootstrap = rlaunch_protocol::control::Bootstrap::Dial;
    plan.dial = Some(DialPlan {
        launcher: vec!["srun".into()],
        proxy_path: "rlaunch-proxy".into(),
        bind: std::net::Ipv4Addr::LOCALHOST.into(),
        overlap: false,
        silence: std::time::Duration::from_secs(10),
    });
}

/// How the launcher ended, as this process's reaper would say.
pub(super) fn launcher_ended(outcome: ExitOutcome) -> rlaunch_tree::procs::Ended {
    process_ended(LAUNCHER_PID, outcome)
}

/// How process `pid` ended, as this process's reaper would say.
pub(super) fn process_ended(pid: i32, outcome: ExitOutcome) -> rlaunch_tree::procs::Ended {
    rlaunch_tree::procs::Ended { pid, outcome, user_us: 0, system_us: 0, maxrss_kib: 0 }
}

/// `run` to its end, or a failure after 60 s: a whole job that hangs fails its test, not the
/// suite. (Not with a paused clock, which would jump to it whenever the runtime is idle.)
pub(super) async fn within<T>(run: impl std::future::Future<Output = T>) -> T {
    let limit = std::time::Duration::from_secs(60);
    tokio::time::timeout(limit, run).await.expect("the job ends within 60 s")
}

/// Runs the futures together on this task.
pub(super) async fn futures_join<F: std::future::Future<Output = ()>>(
    all: impl IntoIterator<Item = F>,
) {
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
