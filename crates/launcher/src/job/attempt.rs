//! The job's attempts (`--max-restarts`): once the policy has torn an attempt down to start
//! again and every proxy of it is done, the Root says why on one line, waits the backoff,
//! and starts the whole job again as a fresh attempt: new proxies (each with a new PMI KVS
//! and PMIx server), a new rendezvous port, the tracker served afresh, the same placement.
//! What the ranks see of it: `TORCHELASTIC_RESTART_COUNT` and `RLAUNCH_RESTART_COUNT`.
//!
//! ```text
//!   policy: Restart { attempt, after } ──► say why, record the attempt, restart_at
//!   deadline Restart ──BackoffOver──► policy: StartAttempt ──► start_attempt()
//! ```

use std::time::Duration;

use rlaunch_protocol::control::Down;
use rlaunch_protocol::record;
use rlaunch_tree::fence::FenceFold;
use tokio::sync::mpsc;
use tokio::time::Instant;

use super::report::AttemptFacts;
use super::roll::Roll;
use super::teardown::Teardown;
use super::{dial, names, pmix_fence, spawn, Root, Tracker};
use crate::output::Chunk;

impl Root {
    /// The policy restarts the job as attempt `attempt`, `after` from now: the attempt that
    /// ended is recorded and said, and each host in `lost` gets a spare in its place while
    /// spares last (the same host is tried again after that).
    pub(super) fn restart(&mut self, attempt: u32, after: Duration, lost: &[String]) {
        let cause = self.policy.past().last();
        let why = cause.and_then(|c| c.message(&self.roll, false));
        let why = why.unwrap_or_else(|| "the job failed".to_string());
        let ended = record::now_us();
        self.attempts.push(AttemptFacts {
            started: self.attempt_began,
            ended,
            exit_code: cause.map_or(1, |c| c.exit_code()),
            cause: why.clone(),
        });
        let mut moved = Vec::new();
        for host in lost {
            if self.plan.spares.is_empty() {
                break;
            }
            let spare = self.plan.spares.remove(0);
            self.replace_host(host, &spare);
            moved.push(format!("{spare} for {host}"));
        }
        let with = match moved.is_empty() {
            true => String::new(),
            false => format!(" with {}", moved.join(", ")),
        };
        let max = self.plan.job.max_restarts;
        let when = match after.is_zero() {
            true => String::new(),
            false => format!(" in {} s", after.as_secs_f64()),
        };
        let line = format!("{why}; restarting the job{with}{when} (restart {attempt} of {max})");
        // Through the writer, after the attempt's output and on a line of its own.
        let written = !*self.drop_output.borrow()
            && self.links.as_ref().is_some_and(|(_, feed)| feed.send(Chunk::Say(line.clone())));
        if !written {
            self.say(&line);
        }
        self.restart_at = Some(Instant::now() + after);
    }

    /// Starts the next attempt: what the last one held of the run is forgotten (its ranks,
    /// fences, names, spawns, teardown), and the top proxies start again.
    pub(super) fn start_attempt(&mut self) {
        self.restart_at = None;
        let attempt = self.policy.attempt();
        tracing::debug!(attempt, "starting the job again");
        self.plan.job.restart = attempt;
        // The port rank 0 served may still be in TIME_WAIT, or taken: a fresh one.
        if let Some(rendezvous) = self.plan.job.rendezvous.as_mut() {
            let fresh = rendezvous.addr.parse().ok().and_then(|addr| {
                rlaunch_proxy::rendezvous::pick(addr)
                    .inspect_err(|e| tracing::debug!("no free port: {e}"))
                    .ok()
            });
            if let Some(fresh) = fresh {
                *rendezvous = fresh;
            }
        }
        self.roll = Roll::new(&self.plan.job, &self.plan.roots, self.plan.node_hosts.clone());
        self.teardown = Teardown::default();
        self.fence = FenceFold::default();
        self.pmix_fence = pmix_fence::PmixFence::default();
        self.group_fences.clear();
        self.names = names::Names::default();
        self.spawns = spawn::Spawns::default();
        self.stdin.restart();
        self.proxy_lost = false;
        self.dead = Default::default();
        self.survey = None;
        self.surveyed_for.clear();
        self.survey_next.clear();
        if let Some(listening) = self.listening.take() {
            listening.acceptor.abort();
        }
        self.dial_deadline = None;
        self.dial_tree = dial::DialTree::default();
        self.ending.send_replace(false);
        // Output dropped behind a slow reader at the last attempt's end: this one's is
        // written again.
        self.drop_output.send_replace(false);
        // Launchers that ended are the last attempt's: a pid of theirs may come again.
        self.launchers.retain(|l| l.ended.is_none());
        self.attempt_began = record::now_us();
        (self.nodes_started, self.fds_running) = (0, 0);
        if let Some(tracker) = self.tracker.take() {
            tracker.task.abort();
            self.tracker_span = None;
            self.serve_tracker(tracker.listener, tracker.news);
        }
        let (Some((events, output)), Some(dialed)) = (self.links.clone(), self.dialed.clone())
        else {
            return tracing::warn!("no links to start the job again with");
        };
        self.start_proxies(&events, &output, dialed);
        if !self.stdin.open {
            self.children.broadcast(&Down::StdinEof);
        }
    }

    /// Puts the ranks of `old`'s node on `spare`: the node keeps its index, place in the
    /// tree and ranks; its name changes wherever the job names it (the PMIx job map, the
    /// node's process set).
    fn replace_host(&mut self, old: &str, spare: &str) {
        fn rename(node: &mut rlaunch_protocol::control::NodePlan, old: &str, spare: &str) {
            if node.host == old {
                node.host = spare.to_string();
            }
            for child in &mut node.children {
                rename(child, old, spare);
            }
        }
        for root in &mut self.plan.roots {
            rename(root, old, spare);
        }
        for host in self.plan.node_hosts.iter_mut().filter(|h| *h == old) {
            *host = spare.to_string();
        }
        if let Some(pmix) = self.plan.job.pmix.as_mut() {
            for host in pmix.hosts.iter_mut().filter(|h| *h == old) {
                *host = spare.to_string();
            }
            let old_set = format!("rlaunch://node/{old}");
            for (name, _) in pmix.psets.iter_mut().filter(|(n, _)| *n == old_set) {
                *name = format!("rlaunch://node/{spare}");
            }
        }
    }

    /// Serves `--tracker rabit` on `listener` for this attempt, its news to `news`.
    pub(super) fn serve_tracker(
        &mut self,
        listener: crate::tracker::Listener,
        news: mpsc::UnboundedSender<crate::tracker::News>,
    ) {
        let workers = self.plan.job.size;
        self.turnout = Some(crate::tracker::rabit::Turnout::new(workers));
        let served = listener.socket.try_clone().map(|socket| crate::tracker::Listener {
            socket,
            addr: listener.addr,
            port: listener.port,
        });
        let task = match served {
            Ok(served) => {
                let ending = self.ending.subscribe();
                tokio::spawn(crate::tracker::serve(served, workers, news.clone(), ending))
            }
            Err(e) => {
                eprintln!("rlaunch: warning: the rabit tracker cannot listen: {e}");
                tokio::spawn(async {})
            }
        };
        self.tracker = Some(Tracker { listener, news, task });
    }
}
