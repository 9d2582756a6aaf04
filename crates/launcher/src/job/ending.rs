//! How the job ends: the policy's actions carried out (the teardown: SIGTERM, the kill
//! grace, then SIGKILL, with a deadline for the output a slow reader has not taken), and at
//! the end one line says why, with the exit status of [`crate::exit`].

use std::collections::HashSet;
use std::io;
use std::time::Duration;

use rlaunch_protocol::record::{self, OwnUsage};
use tokio::time::Instant;

use rlaunch_protocol::control::{Down, NodePlan};
use rlaunch_protocol::ids::{Gid, NodeId};

use super::cause::Cause;
use super::policy::{Action, Event, Now};
use super::report::{self, OutFile};
use super::roll::Roll;
use super::{timeline, Root};

/// What writes a file at the end of the job (`--report`, `--timeline`).
type WriteEnd = fn(
    &mut OutFile,
    &report::JobFacts,
    &Roll,
    &[rlaunch_protocol::record::NodeRecord],
) -> io::Result<()>;

impl Root {
    /// Records why the job must end; the first cause starts the teardown.
    pub(super) fn fail(&mut self, cause: Cause) {
        tracing::debug!(?cause, "job failing");
        self.proxy_lost |= matches!(cause, Cause::LostProxy { .. });
        self.decide(Event::Failed(cause));
    }

    /// Has the policy decide what `event` means, and carries its actions out.
    pub(super) fn decide(&mut self, event: Event) {
        let now = Now { at: Instant::now(), all_ended: self.roll.all_ended() };
        for action in self.policy.on(event, now) {
            tracing::debug!(?action, "policy");
            self.act(action);
        }
    }

    fn act(&mut self, action: Action) {
        match action {
            Action::TearDown { grace, output_wait, only_if_behind } => {
                // Whatever is said next is not about the launch.
                if let Some(progress) = self.progress.as_mut() {
                    progress.clear();
                }
                self.ending.send_replace(true);
                // Lookups waiting for a name will not see it now.
                let answers = self.names.give_up();
                self.name_answers(answers);
                // Proxies waiting to be sent to their parent will not be needed: closing
                // their connections ends them now, and srun with them.
                self.dial_tree.drop_waiting();
                self.terminate(grace, output_wait, only_if_behind);
            }
            Action::Over => {
                self.ending.send_replace(true);
                self.children.broadcast(&Down::Over);
            }
            Action::Forward(sig) => self.children.broadcast(&Down::Signal { signo: sig as i32 }),
            Action::StopSelf => {
                // Stopped with the ranks, as the shell expects (SIGCONT resumes us and them),
                // once the link pumps have had the moment they need to write the signal down.
                tokio::spawn(async {
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    let _ = nix::sys::signal::raise(nix::sys::signal::Signal::SIGSTOP);
                });
            }
            Action::Say(line) => {
                if let Some(progress) = self.progress.as_mut() {
                    progress.clear();
                }
                self.say(line);
            }
            Action::Restart { attempt, after, lost } => self.restart(attempt, after, &lost),
            Action::StartAttempt => self.start_attempt(),
            Action::CancelRestart => self.restart_at = None,
            Action::RankGone(rank) => self.tell_dead([rank]),
            Action::NodeGone(host) => self.node_gone(&host),
        }
    }

    /// `ranks` failed and the job goes on: every node hears of all the failed ranks so far.
    pub(super) fn tell_dead(&mut self, ranks: impl IntoIterator<Item = Gid>) {
        for rank in ranks {
            self.dead.add(&rlaunch_protocol::stacks::RankSet::of(rank));
        }
        self.children.broadcast(&Down::Dead { ranks: self.dead.clone() });
    }

    /// The proxy on `host` was lost and the job goes on: the ranks of its node and of every
    /// node under it in the tree (their proxies end with their lost parent) have failed.
    /// Every node is told; the fences under way stop waiting for them (a lost top proxy is
    /// no party of them now, see `Children::fence_parties`).
    ///
    /// While rlaunch adopts orphaned proxies, only the lost node's own ranks have failed:
    /// the nodes below it are due to call (see [`super::adopt`]), and fail only if they do
    /// not.
    fn node_gone(&mut self, host: &str) {
        fn under(node: &NodePlan, host: &str, lost: bool, nodes: &mut HashSet<NodeId>) {
            let lost = lost || node.host == host;
            if lost {
                nodes.insert(node.index);
            }
            for child in &node.children {
                under(child, host, lost, nodes);
            }
        }
        let mut nodes = HashSet::new();
        if self.adopting.is_some() {
            nodes.extend(super::adopt::plan_node(&self.plan.roots, host).map(|n| n.index));
            self.orphans_due(host);
        } else {
            for root in &self.plan.roots {
                under(root, host, false, &mut nodes);
            }
        }
        // A proxy started during the run for spawned ranks is in no plan: by its host.
        let late =
            (0..self.roll.node_count()).map(NodeId).filter(|&n| self.roll.node_host(n) == host);
        nodes.extend(late);
        let gone = self.roll.gone_with(&nodes);
        tracing::debug!(%host, nodes = nodes.len(), ranks = gone.len(), "a lost node's ranks are gone");
        // Their ranks write no stdin: the window does not wait for them; and what they sent
        // of the PMIx fence under way (perhaps a part of it) is no survivor's business.
        let epoch = self.pmix_fence.epoch();
        for &node in &nodes {
            self.stdin.node_gone(node);
            self.pmix_fence.again(epoch, node);
        }
        self.tell_dead(gone);
        self.pmi_fence_step();
        self.pmix_fence_step();
        self.decide(Event::Gone);
    }

    /// Has every proxy tear its subtree down, drops the output not written `output_wait`
    /// after the grace (what the links still bring is read and thrown away, so the proxies
    /// finish however slow the reader), and kills the proxies that are still there a while
    /// after the grace.
    pub(super) fn terminate(
        &mut self,
        grace: Duration,
        output_wait: Duration,
        only_if_behind: bool,
    ) {
        self.children.terminate(grace);
        let dropped = *self.drop_output.borrow();
        self.teardown.begin(Instant::now(), grace, output_wait, only_if_behind, dropped);
    }

    /// One of rlaunch's last lines on stderr, on a line of its own even when a rank's output
    /// there ended mid-line.
    pub(super) fn say(&mut self, line: &str) {
        if std::mem::take(&mut self.output_mid_line) {
            eprintln!();
        }
        eprintln!("rlaunch: {line}");
    }

    /// Prints why the job failed (the first cause, then the table of the ranks that failed
    /// if more than one did), writes `--report`, and returns the exit status.
    pub(super) fn report(&mut self) -> i32 {
        if let Some(progress) = self.progress.as_mut() {
            progress.clear();
        }
        let listed = self.plan.print_all_exit_codes;
        if listed {
            for line in self.roll.all_outcomes() {
                self.say(&line);
            }
        }
        let (code, line) = match self.policy.first() {
            Some(cause) => (cause.exit_code(), cause.message(&self.roll, listed)),
            None => (0, None),
        };
        if let Some(line) = &line {
            self.say(line);
        }
        // Ranks that a signal to rlaunch ended did not fail: it was the user's wish.
        let first = self.policy.first();
        let wished = matches!(first, Some(Cause::Forwarded(_) | Cause::Interrupted));
        if first.is_some() && !listed && !wished {
            for row in report::failure_table(&self.roll) {
                self.say(&row);
            }
        }
        let facts = report::JobFacts {
            command: &self.plan.command,
            jobid: &self.plan.job.jobid,
            started: self.plan.started_us,
            ended: record::now_us(),
            exit_code: code,
            cause: line,
            fences: self.fence.epoch() + self.pmix_fence.completed(),
            tracker: self.tracker_span,
            hang: self.hang.as_ref(),
            attempts: &self.attempts,
            usage: OwnUsage { fds_running: self.fds_running, ..rlaunch_tree::procs::own_usage() },
        };
        let records = self.children.take_records();
        let roll = &self.roll;
        let writes: [(_, _, WriteEnd); 2] = [
            ("report", self.plan.report.take(), report::write),
            ("timeline", self.plan.timeline.take(), timeline::write),
        ];
        for (what, file, write) in writes {
            let Some(mut file) = file else { continue };
            if let Err(e) = write(&mut file, &facts, roll, &records) {
                let path = file.path.display();
                eprintln!(
                    "rlaunch: cannot write the {what} {path}: {}",
                    crate::quote::io_error(&e)
                );
            }
        }
        code
    }
}
