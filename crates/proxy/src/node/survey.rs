//! Where this node's ranks are, when rlaunch asks (`Down::Survey`, for its hang report):
//! each rank's process from /proc and its place in its job's fences, and when asked their
//! stacks (read on a thread: [`crate::stacks`]), with the child subtrees' answers merged in
//! ([`Gather`]) before one answer goes up.

use std::time::Duration;

use rlaunch_protocol::ids::Gid;
use rlaunch_protocol::stacks::StackTree;

use rlaunch_protocol::control::Up;
use rlaunch_protocol::survey::{PmiNow, ProcessNow, RankNow, Survey};
use rlaunch_tree::procs;
use rlaunch_tree::survey::Gather;

use super::{Event, Node};
use crate::ranks::{PmiState, RankState};

impl Node {
    /// rlaunch asks where every rank is: this node's answer goes up once its children's
    /// (and its own ranks' stacks, if asked) have come, or after `within`.
    pub(super) fn survey_asked(&mut self, id: u32, within: Duration, stacks: bool) {
        let own = self.own_survey();
        let live: Vec<(Gid, i32)> = own
            .ranks
            .iter()
            .filter(|r| matches!(r.process, ProcessNow::Live { state, .. } if state != 'Z'))
            .map(|r| (r.rank, r.pid as i32))
            .collect();
        let mut gather = Gather::start(id, within, stacks, own, &self.children);
        if stacks && !live.is_empty() {
            gather.own_later();
            // The stacks must be up before the children's time is: they go up with them.
            let until = tokio::time::Instant::now().into_std() + within * 3 / 4;
            let events = self.events.clone();
            crate::stacks::read_on_a_thread(live, until, move |tree| {
                let _ = events.send(Event::Stacks { id, tree });
            });
        }
        self.survey = Some(gather);
        self.survey_step();
    }

    /// This node's ranks' stacks were read.
    pub(super) fn stacks_read(&mut self, id: u32, tree: StackTree) {
        let part = Survey { stacks: tree, ..Survey::default() };
        let taken = self.survey.as_mut().is_some_and(|g| g.own_came(id, part));
        match taken {
            true => self.survey_step(),
            false => tracing::debug!(id, "stacks read too late for their survey"),
        }
    }

    /// A child subtree answered.
    pub(super) fn survey_answered(&mut self, child: usize, id: u32, survey: Survey) {
        let taken = self.survey.as_mut().is_some_and(|g| g.answered(child, id, survey));
        match taken {
            true => self.survey_step(),
            false => tracing::debug!(child, id, "a survey answer nobody waits for"),
        }
    }

    /// Sends the answer if nothing more is to come (a child that is lost or finished will
    /// not answer).
    pub(super) fn survey_step(&mut self) {
        if self.survey.as_mut().is_some_and(|g| g.settled(&self.children)) {
            self.survey_send();
        }
    }

    /// Sends what was gathered, complete or not (its time is up).
    pub(super) fn survey_send(&mut self) {
        let Some(gather) = self.survey.take() else { return };
        let id = gather.id;
        let survey = Box::new(gather.finish());
        tracing::debug!(
            id,
            bytes = rlaunch_protocol::control::wire_len(&survey),
            stack_bytes = rlaunch_protocol::control::wire_len(&survey.stacks),
            "survey answered up"
        );
        let _ = self.up.control.send(Up::Survey { id, survey });
    }

    /// This node's own ranks, as they are now.
    fn own_survey(&self) -> Survey {
        let node = self.plan.index;
        let ranks = self.ranks.iter().enumerate().map(|(local, rank)| {
            let process = match rank.state {
                _ if rank.pid <= 0 => ProcessNow::NeverStarted,
                RankState::Running => match procs::snapshot(rank.pid) {
                    Some((state, cpu_ms, rss_kib)) => ProcessNow::Live { state, cpu_ms, rss_kib },
                    None => ProcessNow::Ended(None),
                },
                RankState::Reaped(outcome) => ProcessNow::Ended(Some(outcome)),
                RankState::Judged => ProcessNow::Ended(None),
            };
            let pmi = self.pmix.client_now(rank.gid, rank.job).unwrap_or_else(|| {
                let fence = self.jobs.get(&rank.job).map(|j| j.kvs.fence_of(local));
                match (rank.pmi, fence) {
                    (PmiState::Closed { clean: true }, _) if rank.seen.pmi_init.is_some() => {
                        PmiNow::Finalized
                    }
                    (_, Some((epoch, inside))) if rank.seen.pmi_init.is_some() => {
                        PmiNow::Pmi { epoch, inside }
                    }
                    _ => PmiNow::Silent,
                }
            });
            RankNow {
                rank: rank.gid,
                job: rank.job,
                node,
                pid: rank.pid.max(0) as u32,
                process,
                pmi,
            }
        });
        let activity = self.outputs.bytes_read() + self.pmi_activity;
        Survey { ranks: ranks.collect(), activity, ..Survey::default() }
    }
}
