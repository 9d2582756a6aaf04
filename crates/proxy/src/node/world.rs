//! What the Node takes from the process around it: how its ranks' processes are created (a
//! [`Spawner`], beside the creation itself in [`crate::spawn`]), where it hears of its
//! children's ends, and the signals that tell the proxy to go (and, in `Parts::sweeps`,
//! whether what its processes leave behind is its to kill). [`this_process`] is the proxy's;
//! a test gives a Node ranks with no process behind them (their pipes and PMI sockets real,
//! their pids no process has, their ends sent by the test) and runs its whole loop
//! (`node/tests.rs`).

use nix::sys::signal::Signal;
use rlaunch_tree::procs::Reaper;
use tokio::signal::unix::{signal, SignalKind};
use tokio::sync::mpsc;

use crate::spawn::{Processes, Spawner};

/// What the world tells a running Node.
pub(crate) struct Outside {
    /// Where the ends of the node's processes (ranks, child proxies, its PMIx server) are
    /// heard of.
    pub(crate) ended: Reaper,
    /// The proxy was told to go: by which signal.
    pub(crate) told_to_go: mpsc::UnboundedReceiver<Signal>,
}

/// This process's world: ranks started by [`Processes`], its children reaped by the Node on
/// SIGCHLD ([`Reaper::ThisProcess`]), and the proxy's SIGTERM, SIGHUP and SIGINT.
pub(crate) fn this_process() -> (Box<dyn Spawner>, Outside) {
    let ended = Reaper::this_process();
    let (told_tx, told_to_go) = mpsc::unbounded_channel();
    for (kind, sig) in [
        (SignalKind::terminate(), Signal::SIGTERM),
        (SignalKind::hangup(), Signal::SIGHUP),
        (SignalKind::interrupt(), Signal::SIGINT),
    ] {
        let mut handler = signal(kind).expect("signal handler");
        let told = told_tx.clone();
        tokio::spawn(async move {
            while handler.recv().await.is_some() {
                if told.send(sig).is_err() {
                    return;
                }
            }
        });
    }
    (Box::new(Processes), Outside { ended, told_to_go })
}
