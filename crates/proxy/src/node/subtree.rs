//! This node's child proxies: starting them (or listening for them to dial in), and how
//! their frames go up. The parent side itself is [`Children`], shared with the launcher.

use rlaunch_protocol::control::{Bootstrap, LinkUp, Up};
use tokio::sync::mpsc;
use tokio::time::Instant;

use super::{Event, Node};
use rlaunch_tree::children::{Children, Lost};
use rlaunch_tree::credit::{self, Queued};
use rlaunch_tree::dialin;
use rlaunch_tree::link::{self, LinkEvent};

impl Node {
    pub(super) fn relay(&self) -> Relay {
        Relay {
            data: self.up.data.clone(),
            control: self.up.control.clone(),
            events: self.events.clone(),
            pmix_sent: self.pmix_data_kept(),
        }
    }

    pub(super) fn start_children(&mut self) {
        let plans = std::mem::take(&mut self.plan.children);
        let dialing = self.job.bootstrap == Bootstrap::Dial;
        if dialing && !plans.is_empty() {
            if let Err(why) = self.listen_for_children() {
                for plan in &plans {
                    let reason = format!("its parent cannot listen for it: {why}");
                    self.report_lost(Lost { host: plan.host.clone(), reason, came_up: false });
                }
                return;
            }
            self.dial_deadline = Some(Instant::now() + link::HELLO_WAIT);
        }
        let relay = self.relay();
        let (job, exe) = (&self.job, &self.proxy_exe);
        let mut forked = std::mem::take(&mut self.forked_children);
        let (children, lost) = Children::start(
            job,
            &plans,
            false,
            credit::CHILDREN_BUDGET,
            |i, plan| match (dialing, forked.get_mut(i).and_then(Option::take)) {
                (true, _) => Ok(None),
                (false, Some(proxy)) => link::ProxyProcess::forked(proxy?).map(Some),
                (false, None) => {
                    link::spawn_proxy(&job.bootstrap, &plan.host, plan.fork, exe).map(Some)
                }
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
pub(super) struct Relay {
    data: mpsc::UnboundedSender<Queued>,
    control: mpsc::UnboundedSender<Up>,
    events: mpsc::UnboundedSender<Event>,
    /// Where a child's PMIx fence data is kept as it goes up (see `adoption::Rehome`).
    pmix_sent: Option<super::adoption::PmixSent>,
}

/// Routes what a child proxy's link reports: its frames go up unchanged (see [`Relay`]),
/// except NodeDone, the fence entries and the broadcast's acknowledgements, which are ours to
/// aggregate, and direct modex
/// answers, which settle the requests the dispatcher sent down; everything else about the
/// link goes to the dispatcher.
pub(super) async fn relay_child(child: usize, event: LinkEvent, relay: Relay) -> bool {
    match event {
        LinkEvent::Link(LinkUp::Ping) => true,
        // With the parent gone, frames have nowhere to go; the link still runs, so that its
        // end reaches the dispatcher.
        LinkEvent::Output { rank, stream, data, debt } => {
            let _ = relay.data.send(Queued::owing(Up::Output { rank, stream, data }, debt));
            true
        }
        LinkEvent::Up(up @ (Up::OutputEnd { .. } | Up::RankStarted { .. })) => {
            let _ = relay.data.send(Queued::uncredited(up));
            true
        }
        LinkEvent::Up(up)
            if !matches!(
                up,
                Up::NodeDone { .. }
                    | Up::FenceIn { .. }
                    | Up::PmixFenceIn { .. }
                    | Up::DmodexAnswer(_)
                    | Up::Survey { .. }
                    | Up::BcastAck { .. }
            ) =>
        {
            if let (Up::PmixFencePart { epoch, node, data }, Some(sent)) = (&up, &relay.pmix_sent) {
                sent.lock().expect("not poisoned").push((*epoch, *node, data.clone()));
            }
            let _ = relay.control.send(up);
            true
        }
        event => relay.events.send(Event::Child { child, event }).is_ok(),
    }
}
