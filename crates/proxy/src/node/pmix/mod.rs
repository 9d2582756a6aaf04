//! What this node's PMIx server asks of the node, and how the node answers: the launched
//! job's ranks wait for their PMIx environment; a PMIx fence folds up the tree like a PMI
//! fence ([`fence`]); abort, the name service and spawn go to the root as PMI's
//! do. A job spawned here (MPI_Comm_spawn) is one more namespace of this node's server, its
//! ranks held like the launched job's ([`spawn`]). A server that stops answering
//! is lost as one that died is. What the node does about each thing the server says is
//! decided by [`server::State`], without the server; this module carries it out.
//!
//! A job whose programs may never use PMIx (a shell, python: `PmixJob::late`)
//! starts its ranks at once, told of a server that starts when the first of them connects
//! (`Late`): a job whose ranks never connect pays for no server.
//!
//! ```text
//!   start_launched ──Setup, Clients──► host ──Env × ranks──► ranks start
//!   start_launched (late) ──► ranks start; first connect ──► host (socket) ──Setup, Clients
//!   host ──Fence(id, data)──► fence
//!   host ──Spawn(id)──► Up::Spawn ─► root ─► Down::Spawn ─► spawn
//!   every heartbeat ──Sync──► host ──Synced──► (silent for the silence timeout: lost)
//! ```

mod dmodex;
mod fence;
mod names;
mod pending;
mod server;
mod spawn;

pub(super) use names::pmix_id;

use rlaunch_protocol::ids::{ExitOutcome, Gid};
use std::os::unix::ffi::OsStrExt;

use rlaunch_protocol::control::{NameAnswer, Up};
use rlaunch_protocol::survey::PmiNow;
#[cfg(test)]
use tokio::sync::mpsc;
use tokio::time::Instant;

use super::{Event, Node, Wait};
use crate::pmix::{Command, Files, Host, HostNews, Late};
use crate::ranks::Local;
use pending::Spawning;
use server::{Act, Here, State};

/// The node's PMIx server, and what the node keeps of its clients and requests.
struct Pmix {
    host: Host,
    state: State,
}

const OVERSUBSCRIBE: &[u8] = b"OMPI_MCA_mpi_oversubscribe";
const VADER_DIR: &[u8] = b"OMPI_MCA_btl_vader_backing_directory";

/// A server that starts when the first client connects: what the ranks were told, the
/// files they were given, and the task that watches the socket.
struct Waiting {
    late: Late,
    files: Files,
    _watch: Watch,
}

/// A task that watches a socket for the node, stopped when this is dropped.
pub(super) struct Watch(pub(super) tokio::task::AbortHandle);

impl Drop for Watch {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// What this node serves of PMIx, one part of the Node. How it answers its server is
/// `server::State`'s; the Node's methods that carry that out are in this file, `fence.rs`,
/// `spawn.rs` and `dmodex.rs`.
#[derive(Default)]
pub(super) struct PmixService {
    /// This node's PMIx server, if the job serves PMIx and it has started.
    server: Option<Pmix>,
    /// What this node's ranks were told of a server that starts when the first of them
    /// connects, until then.
    late: Option<Waiting>,
    /// This node's share of the launched job's PMIx fences, with or without a server.
    fence: fence::NodeFence,
}

impl Node {
    /// Starts this node's PMIx server if the job serves PMIx, and asks it for the local
    /// ranks' environments; for a job that may do without it, only makes ready to start one
    /// when a rank connects. Returns true if the ranks' start must wait for their
    /// environments.
    pub(super) fn start_pmix(&mut self) -> bool {
        let Some(job) = self.job.pmix.as_ref() else { return false };
        if job.late && !self.plan.ranks.is_empty() {
            match self.wait_for_client() {
                Ok(waiting) => self.pmix.late = Some(waiting),
                // The job can do without PMIx: its ranks run on PMI, and nothing is said.
                Err(e) => tracing::debug!("PMIx is not served on this node: {e}"),
            }
            return false;
        }
        let required = job.required;
        let files = Files::at(&self.job.jobid, self.plan.index);
        match self.start_host(files, None) {
            // The launched job's ranks wait for the environments asked for them.
            Ok(()) => !self.plan.ranks.is_empty(),
            // A build without PMIx: rlaunch said so once for the job, if it does not need it.
            Err(e) if e.kind() == std::io::ErrorKind::Unsupported && !required => {
                tracing::debug!("PMIx is not served on this node: {e}");
                self.pmix_fence_without_server();
                false
            }
            // Ranks that need PMIx never start (the job fails); others start without it.
            Err(e) => self.pmix_unavailable(e.to_string(), false),
        }
    }

    /// The socket and files of a server that starts when the first rank connects.
    fn wait_for_client(&self) -> std::io::Result<Waiting> {
        let late = Late::listen(self.plan.index)?;
        let files = Files::at(&self.job.jobid, self.plan.index);
        let readable = tokio::io::Interest::READABLE;
        // SAFETY: the descriptor is the AsyncFd's own, open until it is dropped.
        let watched =
            unsafe { tokio::io::unix::AsyncFd::register_with_interest(late.watch()?, readable) }
                .map_err(|e| e.into_parts().1)?;
        let events = self.events.clone();
        let watch = tokio::spawn(async move {
            if watched.readable().await.is_ok() {
                let _ = events.send(Event::PmixWanted);
            }
        });
        Ok(Waiting { late, files, _watch: Watch(watch.abort_handle()) })
    }

    /// A rank connected to the socket of the server that was waiting: it starts now, takes
    /// the socket over, and serves the ranks already running.
    pub(super) fn start_late_pmix(&mut self) {
        let Some(Waiting { late, files, .. }) = self.pmix.late.take() else { return };
        tracing::debug!("a rank connected: starting the PMIx server");
        if let Err(e) = self.start_host(files, Some(late)) {
            // Its clients wait for an answer that will not come: the job ends.
            self.pmix_unavailable(e.to_string(), true);
        }
    }

    /// Starts the host with `files` (on `late`'s socket for a late start), registers the
    /// launched job and its local ranks, and asks for their environments.
    pub(super) fn start_host(&mut self, files: Files, late: Option<Late>) -> std::io::Result<()> {
        let job = self.job.pmix.as_ref().expect("the job serves PMIx");
        let events = self.events.clone();
        let host = Host::start(files, &self.plan.host, late, move |news| {
            events.send(Event::Pmix(news)).is_ok()
        })?;
        // A late node runs none of the launched job's ranks: its map only, for the ranks
        // spawned here, whose parents they are.
        host.send(Command::Setup {
            nspace: self.job.jobid.clone(),
            jobid: self.job.jobid.clone(),
            node: (!self.late).then_some(self.plan.index.0),
            hosts: job.hosts.clone(),
            rank_node: job.rank_node.clone(),
            rank_app: job.rank_app.clone(),
            psets: job.psets.clone(),
            spawned: false,
        });
        let ranks: Vec<u32> = self.plan.ranks.iter().map(|r| r.rank).collect();
        if !ranks.is_empty() {
            host.send(Command::Clients {
                nspace: self.job.jobid.clone(),
                uid: nix::unistd::getuid().as_raw(),
                gid: nix::unistd::getgid().as_raw(),
                ranks,
            });
        }
        tracing::debug!(pid = host.pid(), "PMIx host started");
        let state = State::new(&self.job.jobid, self.job.size, Instant::now());
        self.pmix.server = Some(Pmix { host, state });
        Ok(())
    }

    /// Stops this node's server (its ranks are done, or being killed): on purpose, not news.
    /// The verdicts it held are given first, with what it said before it went; the requests
    /// of other nodes it did not answer fail.
    pub(super) fn drop_pmix(&mut self) {
        let held = self.pmix.server.as_mut().map(|p| p.state.take_held()).unwrap_or_default();
        self.judge_all(held);
        if let Some(mut pmix) = self.pmix.server.take() {
            self.send_unanswered(&mut pmix);
        }
        self.pmix.late = None;
        self.pmix_fence_without_server();
    }

    fn send_unanswered(&mut self, pmix: &mut Pmix) {
        for answer in pmix.state.unanswered() {
            let _ = self.up.control.send(answer);
        }
    }

    /// The verdicts the server held, then the failures that waited for them.
    fn judge_all(&mut self, verdicts: Vec<(Local, ExitOutcome)>) {
        for (local, outcome) in verdicts {
            self.judge_reaped(local, outcome);
        }
        self.judge_deferred(false);
    }

    /// A rank of this node was reaped with `outcome`: true if the PMIx server holds its
    /// verdict until it has said all it heard of the rank (see [`State::holds_verdict`]);
    /// then it is judged ([`Node::judge_reaped`]).
    pub(super) fn pmix_holds_verdict(&mut self, local: Local, outcome: ExitOutcome) -> bool {
        let gid = self.ranks.get(local).gid;
        let Some(pmix) = self.pmix.server.as_mut() else { return false };
        let Some(sync) = pmix.state.holds_verdict(gid, local, outcome) else { return false };
        pmix.host.send(sync);
        true
    }

    /// The server is gone: ranks held for their environments start without them, and the
    /// verdicts it held are given.
    fn lose_pmix(&mut self, why: String) {
        let Some(mut pmix) = self.pmix.server.take() else { return };
        self.send_unanswered(&mut pmix);
        // A late server started because a rank connected: that rank needs it.
        let never = self.pmix_unavailable(why, self.job.pmix.as_ref().is_some_and(|p| p.late));
        // Whether the ranks it held finalized, it can no longer say: its loss is the story,
        // told above, not theirs.
        self.judge_all(pmix.state.take_held());
        // Ranks that need PMIx keep waiting: the job ends, and its teardown reports them as
        // never run. Others start on PMI.
        if !never && self.gate.came(Wait::Environments) {
            self.start_launched_ranks();
        }
        for (_, Spawning { job, index, ranks, .. }) in pmix.state.spawning {
            if let Err(why) = self.start_spawned_ranks(&job, index, &ranks) {
                self.spawn_started(index, Some(why));
            }
        }
        // The ranks it held may have been the last.
        self.sweep_if_all_reaped();
    }

    /// This node cannot serve PMIx (`why`). If the job needs it (`PmixJob::required`, or
    /// `wanted`: a rank connected) that ends the job, naming the node: ranks started without
    /// it would each run alone as a world of one. Otherwise the user hears of it, and the
    /// ranks run on PMI. Returns true if the ranks must not start.
    fn pmix_unavailable(&mut self, why: String, wanted: bool) -> bool {
        let required = wanted || self.job.pmix.as_ref().is_some_and(|p| p.required);
        if required {
            let reason = format!("it cannot serve PMIx, which the program needs: {why}");
            // A node that cannot serve PMIx would not in a new attempt either.
            let host = self.plan.host.clone();
            let _ = self.up.control.send(Up::ProxyLost { host, reason, came_up: false });
        } else {
            self.notice(format!("PMIx is not served on this node: {why}"));
        }
        self.pmix_fence_without_server();
        required
    }

    /// The PMIx environment of a local rank of job `index` (without PMIx, the singleton
    /// trap's: see `super::singleton`), started
    /// with `local` ranks on this node. With more ranks on this machine (this node's, or
    /// those of every node started by fork, which share it) than CPUs to run them, Open MPI
    /// is told it is oversubscribed, as mpirun tells it, or its ranks busy-poll each other's
    /// CPU away.
    pub(super) fn pmix_env(&mut self, index: u32, rank: u32, local: usize) -> Vec<Vec<u8>> {
        let waiting = self.pmix.late.as_ref().filter(|_| index == 0);
        let late = waiting.map(|w| w.late.env(&w.files, &self.job.jobid, rank, &self.plan.host));
        let held = || self.pmix.server.as_mut().and_then(|p| p.state.envs.remove(&(index, rank)));
        let Some(mut vars) = late.or_else(held) else {
            return self.singleton_env();
        };
        let cpus = nix::sched::sched_getaffinity(nix::unistd::Pid::from_raw(0))
            .map(|set| {
                (0..nix::sched::CpuSet::count()).filter(|&c| set.is_set(c) == Ok(true)).count()
            })
            .unwrap_or(1);
        let user_sets = |name: &[u8]| self.job.env.iter().any(|(k, _)| k == name);
        // Nodes started by fork share this machine's CPUs.
        let sharing =
            if self.plan.fork { local.max(self.job.forked_ranks as usize) } else { local };
        if sharing > cpus && !user_sets(OVERSUBSCRIBE) {
            vars.push([OVERSUBSCRIBE, b"=1"].concat());
        }
        let shm = match (&self.pmix.late, &self.pmix.server) {
            (Some(waiting), _) => waiting.files.shm_dir(),
            (None, Some(pmix)) => pmix.host.shm_dir(),
            (None, None) => None,
        };
        if let Some(dir) = shm.filter(|_| !user_sets(VADER_DIR)) {
            vars.push([VADER_DIR, b"=", dir.as_os_str().as_bytes()].concat());
        }
        // Open MPI 4.1 talks to a PMIx server only when it believes a resource manager it
        // knows started it (otherwise each rank is a singleton with an orted of its own):
        // IBM's jsrun is the one whose mark changes nothing else.
        vars.push(b"JSM_JSRUN_PORT=1".to_vec());
        vars
    }

    /// When this node's PMIx server will have been silent too long, if it is watched (not
    /// while the job is stopped).
    pub(super) fn pmix_silent_at(&self) -> Option<Instant> {
        let silence = self.job.liveness.silence();
        let server = self.pmix.server.as_ref().filter(|_| !self.parent.stopped());
        server.map(|p| p.state.silent_at(silence))
    }

    /// The server said nothing for the silence timeout: wedged. It is killed, and lost as
    /// one that died is: its held ranks start without it, or the job fails if it needs it.
    pub(super) fn pmix_silent(&mut self) {
        let Some(pmix) = self.pmix.server.as_ref() else { return };
        pmix.host.kill();
        let secs = self.job.liveness.silence().as_secs_f64();
        self.lose_pmix(format!("the PMIx server of this node did not answer for {secs} s"));
    }

    /// What the server said: the reaction is [`State::on_event`]'s, carried out here.
    pub(super) fn pmix_news(&mut self, news: HostNews) {
        let event = match news {
            HostNews::Event(event) => event,
            HostNews::Gone(why) => {
                // Dropped (its ranks are all done): it went as it should.
                if self.pmix.server.is_none() {
                    return;
                }
                return self.lose_pmix(format!("the PMIx server of this node ended: {why}"));
            }
        };
        let Some(pmix) = self.pmix.server.as_mut() else { return };
        let here = Here {
            node: self.plan.index,
            jobid: &self.job.jobid,
            launched_wait: self.gate.waits_for(Wait::Environments),
            launched_local: self.plan.ranks.len(),
        };
        for act in pmix.state.on_event(event, &here, Instant::now()) {
            self.pmix_act(act);
        }
    }

    fn pmix_act(&mut self, act: Act) {
        match act {
            Act::Host(command) => self.pmix_command(command),
            Act::Up(up) => {
                if let (Up::DmodexAsk(ask), true) = (&up, self.adoptable()) {
                    self.asks_out.insert(ask.id, ask.clone());
                }
                let _ = self.up.control.send(up);
            }
            Act::Notice(text) => self.notice(text),
            Act::Lose(why) => self.lose_pmix(why),
            Act::EnvironmentsIn => {
                if self.gate.came(Wait::Environments) {
                    self.start_launched_ranks();
                }
            }
            Act::Spawned(spawning) => self.pmix_spawned(spawning),
            Act::SpawnFailed(spawning, status) => self.pmix_spawn_failed(spawning, status),
            Act::FenceEntered(data) => self.pmix_fence_entered(data),
            Act::Abort { rank, code, msg } => {
                let pid = self.ranks.find(rank).map_or(0, |r| r.pid as u32);
                let _ = self.up.control.send(Up::Abort { rank, pid, code, msg });
            }
            Act::Connected(gid) => {
                let local = self.ranks.iter().position(|r| r.gid == gid);
                if let Some(local) = local {
                    self.pmi_initialised(local);
                }
            }
            Act::JudgeDeferred => self.judge_deferred(false),
            Act::Judge(local, outcome) => {
                self.judge_all(vec![(local, outcome)]);
                // It may have been the last rank: what was held back from the sweep goes now.
                self.sweep_if_all_reaped();
            }
        }
    }

    /// Tells the server, if it is still there.
    pub(super) fn pmix_command(&self, command: Command) {
        if let Some(pmix) = self.pmix.server.as_ref() {
            pmix.host.send(command);
        }
    }

    pub(super) fn notice(&self, text: String) {
        tracing::warn!("{text}");
        let _ = self.up.control.send(Up::Notice { host: self.plan.host.clone(), text });
    }
}

impl Node {
    /// The launched job's ranks wait to start (see [`super::gate`]), or a spawned job's wait
    /// for their PMIx environments.
    pub(super) fn holding_ranks(&self) -> bool {
        self.gate.closed()
            || self.pmix.server.as_ref().is_some_and(|p| !p.state.spawning.is_empty())
    }
}

impl Node {
    /// Ranks failed and the job goes on (`--on-failure continue`): the local PMIx clients
    /// with a handler for `PMIX_ERR_PROC_ABORTED` hear of each launched rank not told yet.
    pub(super) fn pmix_ranks_dead(&mut self, dead: &rlaunch_protocol::stacks::RankSet) {
        let size = self.job.size;
        let Some(pmix) = self.pmix.server.as_mut() else { return };
        let told = &mut pmix.state.told_dead;
        let all = dead.0.iter().flat_map(|&(first, last)| first..=last);
        let ranks: Vec<u32> = all.filter(|&r| r < size && !told.contains(&r)).collect();
        if ranks.is_empty() {
            return;
        }
        told.extend(&ranks);
        pmix.host.send(Command::Dead { nspace: self.job.jobid.clone(), ranks });
    }
}

impl PmixService {
    /// A server with no process behind it (see [`Host::detached`]), for a test: the
    /// commands sent it come out of the receiver.
    #[cfg(test)]
    pub(super) fn detached(
        jobid: &str,
        size: u32,
    ) -> (PmixService, mpsc::UnboundedReceiver<Command>) {
        let (host, commands) = Host::detached(jobid);
        let state = State::new(jobid, size, Instant::now());
        let service = PmixService { server: Some(Pmix { host, state }), ..Default::default() };
        (service, commands)
    }

    /// This node's server runs.
    pub(super) fn serving(&self) -> bool {
        self.server.is_some()
    }

    /// Whether the server is to catch up before a verdict: a reaped rank's that it holds,
    /// or the failures' waiting for their order.
    pub(super) fn catching_up(&self) -> bool {
        self.server
            .as_ref()
            .is_some_and(|s| !s.state.syncs.is_empty() || s.state.deferral_sync.is_some())
    }

    /// Where client `gid` is in the order libpmix lost connections without a finalize.
    pub(super) fn lost_order(&self, gid: Gid) -> Option<u64> {
        self.server.as_ref().and_then(|s| s.state.lost.get(&gid).copied())
    }

    /// Asks the server to catch up with the failures waiting for their order.
    pub(super) fn sync_deferral(&mut self) {
        if let Some(server) = self.server.as_mut() {
            if let Some(sync) = server.state.sync_deferral() {
                server.host.send(sync);
            }
        }
    }

    /// Where PMIx client `gid` is, for a survey: `None` if it never connected. A client is
    /// known to be in the launched job's fence once the server entered it, which it does
    /// when every local client has.
    pub(super) fn client_now(&self, gid: Gid, job: u32) -> Option<PmiNow> {
        let state = &self.server.as_ref()?.state;
        if !state.connected.contains(&gid) {
            return None;
        }
        if state.finalized.contains(&gid) {
            return Some(PmiNow::Finalized);
        }
        // Spawned jobs' fences are the root's, over their nodes: not counted here.
        let (epoch, inside) = match job {
            0 => (self.fence.fold.epoch(), self.fence.own_in),
            _ => (0, false),
        };
        Some(PmiNow::Pmix { epoch, inside })
    }

    /// Whether rank `gid` connected to the PMIx server and left without finalizing.
    pub(super) fn left_unfinalized(&self, gid: Gid) -> bool {
        self.server.as_ref().is_some_and(|p| p.state.left_unfinalized(gid))
    }

    /// Asks the server for a sign of life: it answers `Synced` from its main thread.
    pub(super) fn ping(&mut self) {
        if let Some(pmix) = self.server.as_mut() {
            pmix.host.send(pmix.state.sync());
        }
    }

    /// The job goes on after a stop: the server's silence while stopped means nothing.
    pub(super) fn resumed(&mut self) {
        if let Some(pmix) = self.server.as_mut() {
            pmix.state.resumed(Instant::now());
        }
    }

    /// The root's answer to a PMIx name-service request of a local rank.
    pub(super) fn name_answer(&mut self, id: u32, answer: NameAnswer) {
        if let Some(pmix) = self.server.as_mut() {
            pmix.host.send(pmix.state.name_answer(id, answer));
        }
    }
}
