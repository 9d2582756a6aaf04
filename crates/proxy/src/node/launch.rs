//! Starting ranks on this node: the launched job's at start, and a spawned job's when the
//! root asks (MPI_Comm_spawn). Both go through one batch builder, a slice of ranks at a time:
//! the slice's processes first, several at a time, then the tasks that serve each one's
//! output, stdin and PMI.

use rlaunch_protocol::ids::Gid;
use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use rlaunch_protocol::control::{Down, Job, SpawnJob, Up};
use rlaunch_protocol::ids::ExitOutcome;
use rlaunch_protocol::record::{self, Phase};
use rlaunch_tree::procs;
use tokio::sync::mpsc;

use super::{spawned, JobRank, JobRanks, Node, Wait};
use crate::place::RankPlace;
use crate::pmi::{self, PmiPeer};
use crate::rank::{self, Placement, PmiSetup};
use crate::ranks::PmiState;

/// How many ranks are started at once. Until a rank has started, both ends of its pipes and
/// PMI socket (and a /dev/null) are open here, seven descriptors, against three once it runs:
/// thousands of ranks started at once ran past the descriptor limit that their running
/// selves keep to. A slice of 64 leaves 256 more at the most, and launches as fast as one
/// slice did (docs/measurements.md, *Start slice*).
const START_SLICE: usize = 64;

/// What starting one rank takes.
struct StartRank<'a> {
    job: &'a Job,
    job_index: u32,
    /// The id of the rank in every frame: its rank for the launched job.
    gid: Gid,
    segment: u32,
    at: Placement<'a>,
    /// Where `--map-by`, `--bind-to` and `--gpus-per-rank` put it.
    place: RankPlace,
}

/// `--pmi-port` ranks whose connection is still to come, by rank: who they are and where
/// their answers go.
type Unbound = HashMap<u32, (PmiPeer, pmi::AnswerRx)>;

impl Node {
    /// Starts the launched job's ranks on this node, once its PMIx server (if the job serves
    /// PMIx) has their environments, the frameworks' rendezvous is known and the broadcast
    /// files (`--bcast`) are here.
    pub(super) async fn start_launched(&mut self) {
        if self.start_pmix() {
            self.gate.wait(Wait::Environments);
        }
        self.start_bcast();
        if !self.gate.closed() {
            self.start_launched_ranks_yielding().await;
        }
    }

    /// Starts the launched job's ranks, and in `--pmi-port` mode the listener that their
    /// connections will claim.
    pub(super) fn start_launched_ranks(&mut self) {
        let Some((listener, setup)) = self.launch_setup() else { return };
        let (job, host, ranks) = self.launched_ranks();
        let Some(batch) = self.launched_batch(&job, &host, &ranks) else { return };
        let unbound = self.start_batch(batch, &setup);
        self.launched(listener, unbound, ranks.len());
    }

    /// [`Node::start_launched_ranks`] as the node comes up, with no PMIx server to wait for:
    /// between slices the runtime's other tasks run, so that the heartbeat keeps going up
    /// while thousands of ranks, or ranks slow to exec (a cold shared file system), start.
    /// Frames from the parent wait in the event queue, as they would behind one long start.
    async fn start_launched_ranks_yielding(&mut self) {
        let Some((listener, setup)) = self.launch_setup() else { return };
        let (job, host, ranks) = self.launched_ranks();
        let Some(mut batch) = self.launched_batch(&job, &host, &ranks) else { return };
        let local = self.local_after(batch.len());
        let mut unbound = HashMap::new();
        let budget = self.job.liveness.heartbeat() / 4;
        let mut size = START_SLICE;
        while !batch.is_empty() {
            let slice = next_slice(&mut batch, size);
            let (count, began) = (slice.len(), std::time::Instant::now());
            self.start_slice(slice, &setup, local, &mut unbound);
            size = slice_after(size, count, began.elapsed(), budget);
            tokio::task::yield_now().await;
        }
        self.launched(listener, unbound, ranks.len());
    }

    /// Before the launched job's ranks start: unless the node is already going down (then
    /// they never start, and are reported so), how their PMI connections will reach us.
    fn launch_setup(&mut self) -> Option<(Option<std::net::TcpListener>, PmiSetup)> {
        // Nothing was swept while the ranks were held.
        self.swept = false;
        if self.kill.started() || self.parent.orphaned() {
            // The job ended while the ranks waited for their PMIx environments: they never
            // start, and are reported as never run (killed before they began).
            tracing::debug!("the node is going down: its held ranks do not start");
            self.launched_never_run();
            return None;
        }
        let listener = if self.job.pmi_port { pmi::listen() } else { None };
        let setup = match listener.as_ref().and_then(|l| l.local_addr().ok()) {
            Some(addr) => PmiSetup::Port(addr.to_string()),
            None => PmiSetup::Fd,
        };
        Some((listener, setup))
    }

    /// The launched job's batch; `None` if its ranks do not fit here, which ends the job
    /// (they are reported as never run).
    fn launched_batch<'a>(
        &mut self,
        job: &'a Job,
        host: &'a str,
        ranks: &[JobRank],
    ) -> Option<Vec<StartRank<'a>>> {
        match self.batch(job, 0, host, ranks) {
            Ok(batch) => Some(batch),
            Err(why) => {
                let host = self.plan.host.clone();
                tracing::debug!("the ranks do not fit here: {why}");
                let _ = self.up.control.send(Up::Unplaceable { host, why });
                self.launched_never_run();
                None
            }
        }
    }

    /// The launched job's ranks here will never start: each is reported as never run
    /// (killed before it began), and the node as started, so that the root can end.
    fn launched_never_run(&mut self) {
        for rp in self.plan.ranks.clone() {
            let outcome = ExitOutcome::Signaled(nix::libc::SIGTERM);
            let verdict = self.ranks.add_failed(Gid(rp.rank), 0, outcome, Vec::new());
            self.send_end(verdict);
        }
        let _ = self.up.control.send(Up::Started { node: self.plan.index });
    }

    /// The launched job, this node's name, and its ranks as [`Node::batch`] takes them.
    fn launched_ranks(&self) -> (Arc<Job>, String, JobRanks) {
        let ranks = self
            .plan
            .ranks
            .iter()
            .map(|rp| JobRank { rank: rp.rank, gid: Gid(rp.rank), segment: rp.segment })
            .collect();
        (self.job.clone(), self.plan.host.clone(), ranks)
    }

    /// After the launched job's ranks started: the parent hears so, `--pmi-port` connections
    /// are taken, and the stdin that waited goes to them.
    fn launched(&mut self, listener: Option<std::net::TcpListener>, unbound: Unbound, n: usize) {
        let _ = self.up.control.send(Up::Started { node: self.plan.index });
        self.phases.push((Phase::RanksStarted, record::now_us()));
        self.fds_running = procs::open_fds();
        tracing::debug!(node = %self.plan.index, ranks = n, "ranks started");
        if let Some(listener) = listener {
            let (pmi_job, calls) = (self.jobs[&0].pmi.clone(), self.pmi_calls.clone());
            tokio::spawn(pmi::accept(listener, unbound, pmi_job, calls));
        }
        for chunk in self.gate.take_held() {
            self.stdin_to_ranks(chunk);
        }
    }

    /// What starting `ranks` of job `job_index` on this node takes; each is (rank in its job,
    /// id in frames, segment), placed and bound by its index among `ranks`. `Err`: why they
    /// do not fit on this node.
    fn batch<'a>(
        &mut self,
        job: &'a Job,
        job_index: u32,
        host: &'a str,
        ranks: &[JobRank],
    ) -> Result<Vec<StartRank<'a>>, String> {
        let count = ranks.len();
        let (node_id, nodes) = self.jobs.get(&job_index).map_or((0, 1), |j| j.group);
        let segments: Vec<u32> = ranks.iter().map(|r| r.segment).collect();
        // Nodes started by fork share this machine's cores (fake nodes).
        let shared = self.plan.fork && job.forked_ranks as usize > count;
        let places = self.placer.place(job, &segments, shared)?;
        let own_session = !shared && self.local_after(count) <= crate::spawn::cpus_here();
        let batch = ranks
            .iter()
            .zip(places)
            .enumerate()
            .map(|(local_id, (&JobRank { rank, gid, segment }, place))| {
                let error_file = self.error_dir.as_deref().map(|dir| {
                    rank::error_file(dir, &job.jobid, gid).to_string_lossy().into_owned()
                });
                let dead_file = self.error_dir.as_deref().filter(|_| job.goes_on).map(|dir| {
                    let file = rank::dead_file(dir, &self.job.jobid, self.plan.index);
                    file.to_string_lossy().into_owned()
                });
                let at = Placement {
                    rank,
                    local_id,
                    local_count: count,
                    host,
                    node_id,
                    nodes,
                    error_file,
                    dead_file,
                    gpu_vars: place.vars.clone(),
                    own_session,
                };
                StartRank { job, job_index, gid, segment, at, place }
            })
            .collect();
        Ok(batch)
    }

    /// Starts ranks, a slice of them at a time (see [`START_SLICE`]). Returns the ranks
    /// whose PMI connection is still to come.
    fn start_batch(&mut self, mut batch: Vec<StartRank>, setup: &PmiSetup) -> Unbound {
        let local = self.local_after(batch.len());
        let mut unbound = HashMap::new();
        while !batch.is_empty() {
            let slice = next_slice(&mut batch, START_SLICE);
            self.start_slice(slice, setup, local, &mut unbound);
        }
        unbound
    }

    /// How many ranks this node will run once `starting` more have started: their PMIx
    /// environments say so, if their job has them.
    fn local_after(&self, starting: usize) -> usize {
        self.ranks.running_pids().count() + starting
    }

    /// Starts a slice of ranks: their processes first (several at a time), then the tasks
    /// that carry each one's output, stdin and PMI. `local`: how many ranks the node will
    /// run, for their PMIx environments. Ranks whose PMI connection is still to come go into
    /// `unbound`.
    fn start_slice(
        &mut self,
        slice: Vec<StartRank>,
        setup: &PmiSetup,
        local: usize,
        unbound: &mut Unbound,
    ) {
        let prepared: Vec<_> = slice
            .iter()
            .map(|start| {
                let front_env = self.pmix_env(start.job_index, start.at.rank, local);
                let StartRank { job, job_index, segment, .. } = *start;
                let with_bcast = (job_index == 0).then(|| self.with_bcast(segment)).flatten();
                let program = self
                    .programs
                    .entry((job_index, segment))
                    .or_insert_with(|| {
                        let segment =
                            with_bcast.as_ref().unwrap_or(&job.segments[segment as usize]);
                        rank::program(job, segment).map(Arc::new)
                    })
                    .clone()?;
                let gets_stdin = job_index == 0 && job.stdin.includes(start.gid.0);
                let mask = start.place.cpus.as_ref().and_then(|c| c.mask.as_ref());
                rank::prepare(program, job, &start.at, gets_stdin, setup, mask, front_env)
            })
            .collect();
        let started = rank::start_all(prepared, &mut *self.spawner);
        for text in self.placer.take_notices() {
            let _ = self.up.control.send(Up::Notice { host: self.plan.host.clone(), text });
        }
        for (start, result) in slice.into_iter().zip(started) {
            if let Some((peer, answers)) = self.adopt(start, result) {
                unbound.insert(peer.rank, (peer, answers));
            }
        }
    }

    /// Takes a rank that started (or could not) into the node's books, with the tasks that
    /// serve it. Returns its PMI answer channel if its connection is still to come.
    fn adopt(
        &mut self,
        start: StartRank,
        result: Result<rank::Started, ExitOutcome>,
    ) -> Option<(PmiPeer, pmi::AnswerRx)> {
        let StartRank { job, job_index, gid, segment, at, place } = start;
        // Computed again, only for a report: what the rank was started with.
        let vars = || -> Vec<(String, String)> {
            if !job.report_vars {
                return Vec::new();
            }
            rank::vars(job, &at)
                .into_iter()
                .map(|(name, value)| (name.to_string(), value))
                .collect()
        };
        let started = match result {
            Ok(started) => started,
            Err(outcome) => {
                let verdict = self.ranks.add_failed(gid, job_index, outcome, vars());
                self.send_end(verdict);
                return None;
            }
        };
        let pmi_state = if started.pmi.is_some() { PmiState::Open } else { PmiState::Unclaimed };
        let local = self.ranks.add_running(gid, job_index, started.pid, pmi_state);
        if self.sweeps {
            self.deaths.watch(started.pid);
        }
        self.ranks.get_mut(local).usage.started = record::now_us();
        self.ranks.get_mut(local).seen.vars = vars();
        let peer = PmiPeer { local, job: job_index, rank: at.rank, appnum: segment };
        let (answers_tx, answers_rx) = pmi::answer_channel();
        self.ranks.get_mut(local).answers = Some(answers_tx);
        let mut unbound = None;
        match started.pmi {
            Some(conn) => {
                let pmi_job = self.jobs[&job_index].pmi.clone();
                let calls = self.pmi_calls.clone();
                tokio::spawn(pmi::serve_rank(conn, Vec::new(), peer, pmi_job, calls, answers_rx));
            }
            None => unbound = Some((peer, answers_rx)),
        }
        let cpus = place.cpus.map(|c| c.list);
        let seen = &mut self.ranks.get_mut(local).seen;
        (seen.cpus, seen.gpus) = (cpus.clone(), place.gpus.clone());
        let hello = Up::RankStarted { rank: gid, pid: started.pid as u32, cpus, gpus: place.gpus };
        // The start goes ahead of any output on the same ordered path: the launcher names
        // output files after the pid.
        self.outputs.add(gid, local, hello, started.stdout, started.stderr);
        // Prepared with a stdin pipe only if it reads the launcher's stdin.
        if started.stdin.is_some() {
            let (tx, rx) = mpsc::unbounded_channel();
            self.ranks.get_mut(local).stdin = Some(tx);
            let (acks, node) = (self.up.control.clone(), self.plan.index);
            tokio::spawn(rank::feed_stdin(started.stdin, rx, acks, node));
        }
        unbound
    }

    /// Every node hears of a spawn: those it places ranks on start them, and the others'
    /// PMIx servers learn its namespace, for their ranks that are its parents.
    pub(super) fn spawn_came(&mut self, sj: SpawnJob) {
        for (node, ranks) in sj.runs() {
            self.children.add_ranks(node, ranks);
        }
        self.children.broadcast(&Down::Spawn(Box::new(sj.clone())));
        if sj.node_id(self.plan.index).is_some() {
            self.awaiting_spawn = false;
            self.start_spawned(sj);
        } else if super::pmix::pmix_id(&sj.tag).is_some() {
            self.pmix.spawned_elsewhere(&sj);
        }
    }

    /// Starts this node's ranks of a job a rank spawned, and tells the root, which answers
    /// the spawner once every node of the job has; a PMIx spawn's ranks first wait for their
    /// PMIx environments.
    fn start_spawned(&mut self, sj: SpawnJob) {
        let (job, ranks) = self.spawned_job(&sj);
        let (job, ranks) = match super::pmix::pmix_id(&sj.tag) {
            Some(_) => match self.pmix_spawn(&sj, job, ranks) {
                Some(unserved) => unserved,
                None => return,
            },
            None => (job, ranks),
        };
        let refused = self.start_spawned_ranks(&job, sj.job, &ranks).err();
        self.spawn_started(sj.job, refused);
    }

    /// Tells the root that this node started its ranks of spawned job `job`, or why not.
    pub(super) fn spawn_started(&self, job: u32, refused: Option<String>) {
        let _ = self.up.control.send(Up::SpawnStarted { job, node: self.plan.index, refused });
    }

    /// A spawned job as this node runs it ([`spawned::job`]), its state made.
    fn spawned_job(&mut self, sj: &SpawnJob) -> (Job, JobRanks) {
        let (job, ranks, state) = spawned::job(&self.job, sj, self.plan.index);
        self.jobs.insert(sj.job, state);
        // Nothing is swept while the job is on its way.
        self.swept = false;
        (job, ranks)
    }

    /// Starts a spawned job's ranks.
    pub(super) fn start_spawned_ranks(
        &mut self,
        job: &Job,
        index: u32,
        ranks: &[JobRank],
    ) -> Result<(), String> {
        self.swept = false;
        let host = self.plan.host.clone();
        // Bound by the same policy over the spawned job's own local indexes: its ranks share
        // the CPUs of the job that spawned them.
        let batch = self
            .batch(job, index, &host, ranks)
            .map_err(|why| format!("its ranks do not fit on {host}: {why}"))?;
        self.start_batch(batch, &PmiSetup::Fd);
        tracing::debug!(job = index, size = ranks.len(), "spawned job started");
        Ok(())
    }
}

/// The next slice of `batch` to start, `size` ranks at most, taken off its front.
fn next_slice<'a>(batch: &mut Vec<StartRank<'a>>, size: usize) -> Vec<StartRank<'a>> {
    let rest = batch.split_off(batch.len().min(size));
    std::mem::replace(batch, rest)
}

/// The size of the next slice, after one of `count` ranks took `took`: as many as fit in
/// `budget` at that pace (one at least), and back up towards [`START_SLICE`] once they start
/// fast again. On a loaded machine a slice of 64 took 450-600 ms (two busy loops beside two
/// proxies, docs/measurements.md *Start slice*), which a parent's silence timeout would see
/// as a silent node: a quarter of a heartbeat a slice keeps the beats on time.
fn slice_after(size: usize, count: usize, took: Duration, budget: Duration) -> usize {
    if took > budget {
        let fits = count as u128 * budget.as_micros() / took.as_micros().max(1);
        (fits as usize).max(1)
    } else if took < budget / 2 {
        (size * 2).min(START_SLICE)
    } else {
        size
    }
}

#[cfg(test)]
mod slices {
    use super::*;

    #[test]
    fn a_slow_slice_makes_the_next_one_fit_the_budget_and_fast_ones_grow_back() {
        let ms = Duration::from_millis;
        // 64 ranks in 500 ms against a 50 ms budget: 6 fit.
        assert_eq!(slice_after(64, 64, ms(500), ms(50)), 6);
        // However slow, one at a time still goes on.
        assert_eq!(slice_after(6, 6, ms(5000), ms(50)), 1);
        // Fast again: doubling, up to the descriptor bound.
        assert_eq!(slice_after(6, 6, ms(10), ms(50)), 12);
        assert_eq!(slice_after(48, 48, ms(10), ms(50)), START_SLICE);
        // Between half the budget and the budget: kept.
        assert_eq!(slice_after(12, 12, ms(40), ms(50)), 12);
        // The last slice of a batch, short of the size, does not shrink it.
        assert_eq!(slice_after(64, 3, ms(1), ms(50)), 64);
    }
}
