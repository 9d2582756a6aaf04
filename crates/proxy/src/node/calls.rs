//! What a rank's PMI connection asks of the node: puts and gets on the job's key-value
//! space, fences, node attributes, and the requests that go to the root (name service,
//! abort, spawn, protocol faults), and the root's answers to them. The end of a connection
//! is part of the rank's verdict.

use rlaunch_protocol::control::{Down, NameAnswer, SpawnOutcome, Up};
use rlaunch_protocol::ids::Gid;
use rlaunch_protocol::record;
use rlaunch_protocol::stacks::RankSet;

use super::{pmix, Node};
use crate::kvs::{FenceStep, Kvs, Reply};
use crate::pmi::{PmiAnswer, PmiCall, PmiPeer};
use crate::ranks::Local;
use rlaunch_tree::children::Fence;

impl Node {
    pub(super) fn kvs(&mut self, job: u32) -> Option<&mut Kvs> {
        self.jobs.get_mut(&job).map(|j| &mut j.kvs)
    }

    /// The child subtrees the launched job's PMI fence under way waits for (only its fences
    /// span the tree).
    pub(super) fn child_parties(&self) -> usize {
        let epoch = self.jobs.get(&0).map_or(0, |j| j.kvs.epoch());
        self.children.fence_parties(Fence::Pmi, epoch)
    }

    /// A request from a rank's PMI connection.
    pub(super) fn pmi_call(&mut self, peer: PmiPeer, call: PmiCall) {
        let local = peer.local;
        let (gid, pid) = {
            let rank = self.ranks.get(local);
            (rank.gid, rank.pid as u32)
        };
        let child_parties = self.child_parties();
        match call {
            PmiCall::Closed { clean } => {
                // Only an early close needs to know whether the rank is on its way out.
                let exiting = clean || rlaunch_tree::procs::is_exiting(pid as i32);
                if let Some(up) = self.ranks.pmi_closed(local, clean, exiting) {
                    let _ = self.up.control.send(up);
                }
            }
            PmiCall::Opened => self.ranks.pmi_opened(local),
            PmiCall::Put { key, value } => {
                if let Some(kvs) = self.kvs(peer.job) {
                    kvs.put(key, value);
                }
            }
            PmiCall::Get { key, tag } => {
                if let Some(value) = self.kvs(peer.job).map(|kvs| kvs.get(&key)) {
                    self.answer(local, PmiAnswer::Get { key, value, tag });
                }
            }
            PmiCall::JobAttr { key, tag } => {
                if let Some(value) = self.kvs(peer.job).map(|kvs| kvs.get(&key)) {
                    self.answer(local, PmiAnswer::JobAttr { value, tag });
                }
            }
            PmiCall::Fence { tag } => {
                let launched = peer.job == 0;
                if launched {
                    self.fences.enter(record::now_us());
                }
                let step = self.kvs(peer.job).map(|kvs| kvs.enter(local, tag, child_parties));
                if launched && matches!(step, Some(FenceStep::Done(_))) {
                    self.fences.complete(record::now_us());
                }
                self.fence_step(peer.job, step);
            }
            PmiCall::PutNodeAttr { key, value } => {
                if let Some(replies) = self.kvs(peer.job).map(|kvs| kvs.put_node_attr(key, value)) {
                    self.send_replies(replies);
                }
            }
            PmiCall::GetNodeAttr { key, wait, tag } => {
                let answer =
                    self.kvs(peer.job).and_then(|k| k.get_node_attr(local, key, wait, tag));
                if let Some(answer) = answer {
                    self.answer(local, answer);
                }
            }
            PmiCall::Name { op, tag } => {
                let _ = self.up.control.send(Up::Name { rank: gid, tag, op });
            }
            PmiCall::Abort { code, msg } => {
                let _ = self.up.control.send(Up::Abort { rank: gid, pid, code, msg });
            }
            PmiCall::Spawn { request, tag } => {
                let _ = self.up.control.send(Up::Spawn { rank: gid, tag, request });
            }
            PmiCall::Finalized => {}
            PmiCall::Initialized => self.pmi_initialised(local),
            PmiCall::Fault(what) => {
                let _ = self.up.control.send(Up::PmiFault { rank: gid, pid, what });
            }
        }
    }

    /// Where a fence entry of job `job` led: this node's part goes up (the tree's fold for
    /// the launched job, the root's for a spawned one), or a node-local fence is done.
    pub(super) fn fence_step(&mut self, job: u32, step: Option<FenceStep>) {
        match step {
            Some(FenceStep::GoUp { epoch, pairs }) if job == 0 => {
                if self.adoptable() {
                    self.fence_entry = Some((epoch, pairs.clone()));
                }
                let _ = self.up.control.send(Up::FenceIn { epoch, pairs });
            }
            Some(FenceStep::GoUp { epoch, pairs }) => {
                self.job_fences_up.insert(job);
                let _ = self.up.control.send(Up::JobFenceIn { job, epoch, pairs });
            }
            Some(FenceStep::Done(released)) => self.send_replies(released),
            Some(FenceStep::Waiting) | None => {}
        }
    }

    /// Fence `epoch` of job `job` is complete tree-wide (or root-wide, for a spawned job
    /// over several nodes): the subtree hears, and this node's ranks in it get `pairs`.
    pub(super) fn fence_out(&mut self, job: u32, epoch: u64, pairs: Vec<(String, String)>) {
        let down = match job {
            0 => Down::FenceOut { epoch, pairs: pairs.clone() },
            job => Down::JobFenceOut { job, epoch, pairs: pairs.clone() },
        };
        self.children.broadcast(&down);
        match job {
            0 => self.fence_entry = self.fence_entry.take().filter(|(e, _)| *e > epoch),
            job => _ = self.job_fences_up.remove(&job),
        }
        let Some(kvs) = self.kvs(job) else { return };
        let released = kvs.complete(epoch, pairs);
        // A node whose every rank failed (the job going on) is in the next fence at once.
        let children = self.child_parties();
        let next = self.kvs(job).expect("just seen").go_on(children);
        self.send_replies(released);
        if job == 0 {
            self.fences.complete(record::now_us());
        }
        self.fence_step(job, Some(next));
    }

    /// Ranks failed and the job goes on without them (`--on-failure continue`): the subtree
    /// hears; this node's fences stop waiting for its own, and its ranks are told, by the
    /// `PMI_dead_processes` key (as Hydra's `-disable-auto-cleanup` does) and by the file of
    /// `RLAUNCH_DEAD_RANKS_FILE`, rewritten whole.
    pub(super) fn ranks_dead(&mut self, dead: RankSet) {
        self.children.broadcast(&Down::Dead { ranks: dead.clone() });
        let children = self.child_parties();
        let here: Vec<(Local, u32)> = (0..self.ranks.iter().count())
            .filter(|&local| dead.contains(self.ranks.get(local).gid))
            .map(|local| (local, self.ranks.get(local).job))
            .collect();
        for (local, job) in here {
            let step = self.kvs(job).map(|kvs| kvs.depart(local, children));
            self.fence_step(job, step);
        }
        self.pmix_ranks_dead(&dead);
        let list = dead.to_string();
        if let Some(kvs) = self.kvs(0) {
            kvs.set_visible("PMI_dead_processes", list.clone());
        }
        if let Some(dir) = self.error_dir.as_deref() {
            let file = crate::rank::dead_file(dir, &self.job.jobid, self.plan.index);
            let tmp = file.with_extension("dead.tmp");
            let written = std::fs::write(&tmp, format!("{list}\n"))
                .and_then(|()| std::fs::rename(&tmp, &file));
            if let Err(e) = written {
                tracing::warn!(file = %file.display(), "cannot list the failed ranks: {e}");
            }
        }
    }

    /// The root's answer to rank `rank`'s spawn request: for its PMI connection, its PMIx
    /// server (a PMIx request's tag), or the child subtree it is in.
    pub(super) fn spawn_answer(&mut self, rank: Gid, tag: Option<String>, outcome: SpawnOutcome) {
        let Some(here) = self.ranks.find(rank) else {
            let down = Down::SpawnAnswer { rank, tag, outcome };
            self.children.send_toward_rank(rank, down);
            return;
        };
        match pmix::pmix_id(&tag) {
            Some(id) => self.pmix.spawn_answer(id, outcome),
            None => {
                if let Some(tx) = here.answers.as_ref() {
                    let _ = tx.send(Box::new(PmiAnswer::Spawn { outcome, tag }));
                }
            }
        }
    }

    /// The root's answer to rank `rank`'s name-service request, routed the same way.
    pub(super) fn name_reply(&mut self, rank: Gid, tag: Option<String>, answer: NameAnswer) {
        let Some(here) = self.ranks.find(rank) else {
            let down = Down::NameReply { rank, tag, answer };
            self.children.send_toward_rank(rank, down);
            return;
        };
        match pmix::pmix_id(&tag) {
            Some(id) => self.pmix.name_answer(id, answer),
            None => {
                if let Some(tx) = here.answers.as_ref() {
                    let _ = tx.send(Box::new(PmiAnswer::Name { answer, tag }));
                }
            }
        }
    }

    fn answer(&self, local: Local, answer: PmiAnswer) {
        if let Some(tx) = &self.ranks.get(local).answers {
            let _ = tx.send(Box::new(answer));
        }
    }

    pub(super) fn send_replies(&self, replies: Vec<Reply>) {
        for (local, answer) in replies {
            self.answer(local, answer);
        }
    }
}
