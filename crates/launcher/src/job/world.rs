//! What the Root takes from the world around it. [`World::of_this_process`] is rlaunch's:
//! proxies forked, exec'd or started over a remote shell, the signals it catches, its stdin,
//! and SIGCHLD to reap its children. A test builds a world of in-memory links instead, sends
//! signals and stdin itself, and runs the whole Root without a process (`job/tests.rs`).

use std::io;

use nix::sys::signal::Signal;
use rlaunch_protocol::control::{NodePlan, StdinTarget};
use rlaunch_tree::link::{self, ProxyProcess};
use tokio::sync::mpsc;

use super::signals::ForwardedSignals;
use super::Plan;
use crate::stdin;

/// Starts top proxy `index` of the plan: `Ok(None)` for one that will dial in.
pub(crate) type StartProxy =
    Box<dyn FnMut(usize, &NodePlan) -> io::Result<Option<ProxyProcess>> + Send>;

pub(crate) struct World {
    pub start: StartProxy,
    /// Signals for the ranks (or for rlaunch itself: a second SIGINT, SIGTSTP).
    pub signals: mpsc::UnboundedReceiver<Signal>,
    /// rlaunch's stdin, for the ranks that read it; `None` when there is none to read.
    pub stdin: Option<stdin::Chunks>,
    /// The proxies are this process's children: reaped on each SIGCHLD, and whatever they
    /// leave behind swept at the end. `None` in a world without processes.
    pub sigchld: Option<tokio::signal::unix::Signal>,
}

impl World {
    /// This process's world. Takes the proxies `plan` forked already
    /// ([`super::fork_local_proxies`]); starts the others itself, unless a scheduler's
    /// launcher starts them ([`Plan::dial`]: that launcher, and late proxies for spawned
    /// ranks, the Root starts itself in any world). Installs the signal handlers, before the
    /// proxies it starts: a forked one may have ended already, and `run_in` reaps once first.
    pub(crate) fn of_this_process(plan: &mut Plan) -> World {
        let sigchld = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::child())
            .expect("SIGCHLD handler");
        let mut forwarded = ForwardedSignals::new();
        let (signals_tx, signals) = mpsc::unbounded_channel();
        tokio::spawn(async move { while signals_tx.send(forwarded.recv().await).is_ok() {} });
        let mut forked = std::mem::take(&mut plan.forked);
        let (bootstrap, exe) = (plan.job.bootstrap.clone(), plan.proxy_exe.clone());
        let dialing = plan.dial.is_some();
        let start: StartProxy = Box::new(move |index, node| {
            if dialing {
                return Ok(None);
            }
            match forked.get_mut(index).and_then(Option::take) {
                Some(proxy) => proxy.and_then(ProxyProcess::forked).map(Some),
                None => link::spawn_proxy(&bootstrap, &node.host, node.fork, &exe).map(Some),
            }
        });
        let reads_stdin = plan.job.stdin != StdinTarget::None;
        let stdin = if reads_stdin { stdin::start() } else { None };
        World { start, signals, stdin, sigchld: Some(sigchld) }
    }
}
