//! What the Root takes from the world around it. [`World::of_this_process`] is rlaunch's:
//! proxies forked, exec'd, started over a remote shell or by a scheduler's launcher (srun)
//! to dial back, the signals it catches, its stdin, and its children's ends as they are
//! reaped. A test builds a world of in-memory links instead, sends signals, stdin and
//! processes' ends itself, and runs the whole Root without a process (`job/tests/`).

use std::ffi::OsString;
use std::io;

use nix::sys::signal::Signal;
use rlaunch_protocol::control::{Bootstrap, NodePlan, StdinTarget};
use rlaunch_tree::dialin::Dialed;
use rlaunch_tree::link::{self, ForkedProxy, ProxyProcess};
use rlaunch_tree::procs::Reaper;
use tokio::sync::mpsc;

use super::dial::{self, DialBack, DialPlan};
use super::signals::ForwardedSignals;
use super::Plan;
use crate::stdin;

/// How the Root's proxies start: the top ones, and those started during the run for spawned
/// ranks on a host that has none.
pub(crate) trait Proxies: Send {
    /// Starts top proxy `index` of the plan: `Ok(None)` for one that will dial in.
    fn top(&mut self, index: usize, node: &NodePlan) -> io::Result<Option<ProxyProcess>>;
    /// Starts the proxy of `node` during the run; `fork`: on this machine.
    fn late(&mut self, node: &NodePlan, fork: bool) -> io::Result<ProxyProcess>;
    /// Starts the scheduler's launcher that starts a proxy on each of `hosts`; they dial
    /// in, and arrive on `dialed`.
    fn dial(
        &mut self,
        plan: &DialPlan,
        hosts: &[&str],
        dialed: mpsc::UnboundedSender<Dialed>,
    ) -> io::Result<dial::Started>;
    /// Starts the scheduler's launcher of one proxy on `host` during the run, which dials in
    /// at `back` as the first ones did; the launcher's pid.
    fn dial_late(&mut self, plan: &DialPlan, host: &str, back: &DialBack) -> io::Result<i32>;
}

/// A world with no proxy to start (the Root of a unit test that drives it by its events).
pub(crate) struct NoProxies;

impl Proxies for NoProxies {
    fn top(&mut self, _: usize, node: &NodePlan) -> io::Result<Option<ProxyProcess>> {
        Err(io::Error::other(format!("no proxy for {} in this world", node.host)))
    }

    fn late(&mut self, node: &NodePlan, _: bool) -> io::Result<ProxyProcess> {
        Err(io::Error::other(format!("no proxy for {} in this world", node.host)))
    }

    fn dial(
        &mut self,
        _: &DialPlan,
        _: &[&str],
        _: mpsc::UnboundedSender<Dialed>,
    ) -> io::Result<dial::Started> {
        Err(io::Error::other("no launcher in this world"))
    }

    fn dial_late(&mut self, _: &DialPlan, _: &str, _: &DialBack) -> io::Result<i32> {
        Err(io::Error::other("no launcher in this world"))
    }
}

/// This process's proxies: forked already by `main`, forked and exec'd, or started over the
/// job's remote shell; none when a scheduler's launcher starts them (they dial in).
struct ThisProcess {
    forked: Vec<Option<io::Result<ForkedProxy>>>,
    bootstrap: Bootstrap,
    exe: OsString,
    dialing: bool,
}

impl Proxies for ThisProcess {
    fn top(&mut self, index: usize, node: &NodePlan) -> io::Result<Option<ProxyProcess>> {
        if self.dialing {
            return Ok(None);
        }
        match self.forked.get_mut(index).and_then(Option::take) {
            Some(proxy) => proxy.and_then(ProxyProcess::forked).map(Some),
            None => self.late(node, node.fork).map(Some),
        }
    }

    fn late(&mut self, node: &NodePlan, fork: bool) -> io::Result<ProxyProcess> {
        link::spawn_proxy(&self.bootstrap, &node.host, fork, &self.exe)
    }

    fn dial(
        &mut self,
        plan: &DialPlan,
        hosts: &[&str],
        dialed: mpsc::UnboundedSender<Dialed>,
    ) -> io::Result<dial::Started> {
        dial::start(plan, hosts, dialed)
    }

    fn dial_late(&mut self, plan: &DialPlan, host: &str, back: &DialBack) -> io::Result<i32> {
        dial::start_late(plan, host, back)
    }
}

pub(crate) struct World {
    pub proxies: Box<dyn Proxies>,
    /// Signals for the ranks (or for rlaunch itself: a second SIGINT, SIGTSTP).
    pub signals: mpsc::UnboundedReceiver<Signal>,
    /// rlaunch's stdin, for the ranks that read it; `None` when there is none to read.
    pub stdin: Option<stdin::Chunks>,
    /// Where the ends of the world's processes (its proxies, a scheduler's launcher) are
    /// heard of.
    pub ended: Reaper,
    /// `rlaunch ps` and `rlaunch stacks` from another terminal, and the socket they come to
    /// (`None` where it could not be made: the job runs without).
    pub asks: Option<(mpsc::UnboundedReceiver<crate::ctl::Asked>, crate::ctl::Listening)>,
}

impl World {
    /// This process's world. Takes the proxies `plan` forked already
    /// ([`super::fork_local_proxies`]); starts the others itself, and those for spawned ranks
    /// later, or a scheduler's launcher that starts them ([`Plan::dial`]). Installs the
    /// signal handlers before the proxies start; the reaper reaps once first, for a proxy
    /// forked in `main` may have ended before there was a SIGCHLD handler to hear it.
    pub(crate) fn of_this_process(plan: &mut Plan) -> World {
        let ended = Reaper::this_process();
        let mut forwarded = ForwardedSignals::new();
        let (signals_tx, signals) = mpsc::unbounded_channel();
        tokio::spawn(async move { while signals_tx.send(forwarded.recv().await).is_ok() {} });
        let proxies = Box::new(ThisProcess {
            forked: std::mem::take(&mut plan.forked),
            bootstrap: plan.job.bootstrap.clone(),
            exe: plan.proxy_exe.clone(),
            dialing: plan.dial.is_some(),
        });
        let reads_stdin = plan.job.stdin != StdinTarget::None;
        let stdin = if reads_stdin { stdin::start() } else { None };
        let (asks_tx, asks_rx) = mpsc::unbounded_channel();
        let asks = match crate::ctl::listen(asks_tx) {
            Ok(listening) => Some((asks_rx, listening)),
            Err(e) => {
                tracing::debug!("no socket for rlaunch ps: {e}");
                None
            }
        };
        World { proxies, signals, stdin, ended, asks }
    }
}
