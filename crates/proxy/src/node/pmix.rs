//! What this node's PMIx server asks of the node, and how the node answers: the launched
//! job's ranks wait for their PMIx environment; a PMIx fence folds up the tree like a PMI
//! fence (`super::pmix_fence`); abort, the name service and spawn go to the root as PMI's
//! do. A job spawned here (MPI_Comm_spawn) is one more namespace of this node's server, its
//! ranks held like the launched job's (`super::pmix_spawn`). A server that stops answering
//! is lost as one that died is.
//!
//! A job whose programs may never use PMIx (a shell, python: `PmixJob::late`)
//! starts its ranks at once, told of a server that starts when the first of them connects
//! (`Late`): a job whose ranks never connect pays for no server.
//!
//! ```text
//!   start_launched ──Setup, Clients──► host ──Env × ranks──► ranks start
//!   start_launched (late) ──► ranks start; first connect ──► host (socket) ──Setup, Clients
//!   host ──Fence(id, data)──► super::pmix_fence
//!   host ──Spawn(id)──► Up::Spawn ─► root ─► Down::Spawn ─► super::pmix_spawn
//!   every heartbeat ──Sync──► host ──Synced──► (silent for the silence timeout: lost)
//! ```

use rlaunch_protocol::ids::Gid;
use std::collections::{HashMap, HashSet};
use std::os::unix::ffi::OsStrExt;

use rlaunch_protocol::control::{NameAnswer, NameOp, SpawnCmd, SpawnRequest, Up};
use rlaunch_protocol::ids::ExitOutcome;
use tokio::time::Instant;

use super::pmix_spawn::{Registered, Spawning};
use super::{Event, Node, Wait};
use crate::pmix::wire::Proc;
use crate::pmix::{self, wire, Command, Files, Host, HostNews, Late};
use crate::ranks::Local;

/// The node's PMIx server and what it waits for.
pub(super) struct Pmix {
    pub(super) host: Host,
    /// The namespaces the server knows (the launched job's, and each spawned job's).
    pub(super) nspaces: HashMap<String, Nspace>,
    /// Fences over other processes than the whole launched job (global ids, sorted) this
    /// node entered: the host's id, answered when the root says the fence is complete.
    pub(super) groups: HashMap<Vec<Gid>, u32>,
    /// Environments of local ranks, by job and rank, until their ranks start.
    pub(super) envs: HashMap<(u32, u32), Vec<Vec<u8>>>,
    /// The host's id of the launched job's fence this node entered, answered when the fence
    /// completes (the fold is the node's, `super::pmix_fence`: it outlives the server).
    pub(super) entered: Option<u32>,
    /// The completion of that fence gathered so far, from the parts that came before it.
    pub(super) fence_out: Vec<u8>,
    /// Name-service requests at the root, by the host's id: the key a lookup asked for.
    lookups: HashMap<u32, String>,
    /// Jobs spawned here whose ranks wait for their environments, by job index.
    pub(super) spawning: HashMap<u32, Spawning>,
    /// Local clients (global ids) that connected to the server: only they can have
    /// committed data for a direct modex request.
    connected: HashSet<Gid>,
    /// Local clients (global ids) that called PMIx_Finalize.
    finalized: HashSet<Gid>,
    /// Ranks that exited 0 after connecting, not (yet) known to have finalized: judged once
    /// the host answers the `Sync` of this id (a finalize comes ahead of it on the link).
    syncs: HashMap<u32, (Local, ExitOutcome)>,
    next_sync: u32,
    /// When the host last said anything. It answers a `Sync` every heartbeat: one silent
    /// for the job's silence timeout is wedged (stopped, or stuck before it is ready), and
    /// is given up as if it had died.
    heard: Instant,
}

impl Pmix {
    /// The global id of a process of a namespace this server knows.
    pub(super) fn gid(&self, proc: &Proc) -> Option<Gid> {
        self.nspaces.get(&proc.nspace).map(|n| Gid(n.first + proc.rank))
    }

    pub(super) fn host(&self) -> &Host {
        &self.host
    }

    /// The local rank with this global id connected to the server.
    pub(super) fn connected(&self, gid: Gid) -> bool {
        self.connected.contains(&gid)
    }

    /// How many environments of job `index` are in.
    fn envs_of(&self, index: u32) -> usize {
        self.envs.keys().filter(|(job, _)| *job == index).count()
    }
}

const OVERSUBSCRIBE: &[u8] = b"OMPI_MCA_mpi_oversubscribe";
const VADER_DIR: &[u8] = b"OMPI_MCA_btl_vader_backing_directory";

/// Marks a name-service request as PMIx's: the tag its answer comes back with.
const TAG_PREFIX: &str = "\0pmix:";

fn name_tag(id: u32) -> Option<String> {
    Some(format!("{TAG_PREFIX}{id}"))
}

/// The host's id in a PMIx name-service answer's tag.
pub(super) fn pmix_id(tag: &Option<String>) -> Option<u32> {
    tag.as_deref()?.strip_prefix(TAG_PREFIX)?.parse().ok()
}

/// A server that starts when the first client connects: what the ranks were told, the
/// files they were given, and the task that watches the socket.
pub(super) struct Waiting {
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

/// What this node serves of PMIx, one part of the Node: its methods are in this file,
/// `pmix_fence.rs`, `pmix_spawn.rs` and `dmodex.rs`.
#[derive(Default)]
pub(super) struct PmixService {
    /// This node's PMIx server, if the job serves PMIx and it has started.
    pub(super) server: Option<Pmix>,
    /// What this node's ranks were told of a server that starts when the first of them
    /// connects, until then.
    pub(super) late: Option<Waiting>,
    /// This node's share of the launched job's PMIx fences, with or without a server.
    pub(super) fence: super::pmix_fence::NodeFence,
    /// Direct modex requests of other nodes that this node's server is answering.
    pub(super) asks: super::dmodex::Asks,
}

/// A PMIx namespace: a job the node's server knows.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Nspace {
    /// The job's index (the launched job is 0).
    pub(super) job: u32,
    /// The global id of its rank 0: its rank r is `first + r` in every frame.
    pub(super) first: u32,
    pub(super) size: u32,
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
        self.pmix.server = Some(Pmix {
            host,
            nspaces: HashMap::from([(
                self.job.jobid.clone(),
                Nspace { job: 0, first: 0, size: self.job.size },
            )]),
            groups: HashMap::new(),
            envs: HashMap::new(),
            entered: None,
            fence_out: Vec::new(),
            lookups: HashMap::new(),
            spawning: HashMap::new(),
            connected: HashSet::new(),
            finalized: HashSet::new(),
            syncs: HashMap::new(),
            next_sync: 0,
            heard: Instant::now(),
        });
        Ok(())
    }

    /// Stops this node's server (its ranks are done, or being killed): on purpose, not news.
    pub(super) fn drop_pmix(&mut self) {
        let syncs =
            self.pmix.server.as_mut().map(|p| std::mem::take(&mut p.syncs)).unwrap_or_default();
        // Judged with what the server said before it went.
        for (local, outcome) in syncs.into_values() {
            self.judge_reaped(local, outcome);
        }
        self.pmix.server = None;
        self.pmix.late = None;
        self.dmodex_server_gone();
        self.pmix_fence_without_server();
    }

    /// A rank of this node was reaped with `outcome`: true if the PMIx server holds its
    /// verdict. One that exited 0 after connecting and was not heard to finalize waits for a
    /// `Sync` of the host first (its finalize may still be on the link), then is judged
    /// ([`Node::judge_reaped`]).
    pub(super) fn pmix_holds_verdict(&mut self, local: Local, outcome: ExitOutcome) -> bool {
        let gid = self.ranks.get(local).gid;
        let Some(pmix) = self.pmix.server.as_mut() else { return false };
        let unsure =
            outcome.is_success() && pmix.connected.contains(&gid) && !pmix.finalized.contains(&gid);
        if unsure {
            let id = pmix.next_sync;
            pmix.next_sync = pmix.next_sync.wrapping_add(1);
            pmix.syncs.insert(id, (local, outcome));
            pmix.host.send(Command::Sync { id });
        }
        unsure
    }

    /// The server is gone: ranks held for their environments start without them.
    fn lose_pmix(&mut self, why: String) {
        let Some(pmix) = self.pmix.server.take() else { return };
        self.dmodex_server_gone();
        // A late server started because a rank connected: that rank needs it.
        let never = self.pmix_unavailable(why, self.job.pmix.as_ref().is_some_and(|p| p.late));
        // Ranks that need PMIx keep waiting: the job ends, and its teardown reports them as
        // never run. Others start on PMI.
        if !never && self.gate.came(Wait::Environments) {
            self.start_launched_ranks();
        }
        for (_, Spawning { job, index, ranks, .. }) in pmix.spawning {
            if let Err(why) = self.start_spawned_ranks(&job, index, &ranks) {
                self.spawn_started(index, Some(why));
            }
        }
    }

    /// This node cannot serve PMIx (`why`). If the job needs it (`PmixJob::required`, or
    /// `wanted`: a rank connected) that ends the job, naming the node: ranks started without
    /// it would each run alone as a world of one. Otherwise the user hears of it, and the
    /// ranks run on PMI. Returns true if the ranks must not start.
    fn pmix_unavailable(&mut self, why: String, wanted: bool) -> bool {
        let required = wanted || self.job.pmix.as_ref().is_some_and(|p| p.required);
        if required {
            let reason = format!("it cannot serve PMIx, which the program needs: {why}");
            let _ = self.up.control.send(Up::ProxyLost { host: self.plan.host.clone(), reason });
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
        let held = || self.pmix.server.as_mut().and_then(|p| p.envs.remove(&(index, rank)));
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
        self.pmix.server.as_ref().filter(|_| !self.parent.stopped()).map(|p| p.heard + silence)
    }

    /// The server said nothing for the silence timeout: wedged. It is killed, and lost as
    /// one that died is: its held ranks start without it, or the job fails if it needs it.
    pub(super) fn pmix_silent(&mut self) {
        let Some(pmix) = self.pmix.server.as_ref() else { return };
        pmix.host.kill();
        let secs = self.job.liveness.silence().as_secs_f64();
        self.lose_pmix(format!("the PMIx server of this node did not answer for {secs} s"));
    }

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
        pmix.heard = Instant::now();
        match event {
            pmix::Event::Ready { version } => tracing::debug!(%version, "PMIx server ready"),
            pmix::Event::SetupDone { nspace, status } => {
                let spawning = pmix.spawning.values_mut().find(|s| s.nspace == nspace);
                match (status, spawning) {
                    (wire::SUCCESS, _) => tracing::debug!(%nspace, "PMIx namespace registered"),
                    // Its spawner hears, once every rank's environment is in.
                    (_, Some(spawning)) => spawning.registration.namespace(status),
                    _ => {
                        self.notice(format!("cannot register {nspace} with PMIx (status {status})"))
                    }
                }
            }
            pmix::Event::Failed { why } => self.lose_pmix(why),
            pmix::Event::Env { nspace, rank, status, vars } => {
                if status != wire::SUCCESS {
                    tracing::warn!(%nspace, rank, status, "no PMIx environment for a rank");
                }
                let Some(&Nspace { job: index, .. }) = pmix.nspaces.get(&nspace) else {
                    return tracing::warn!(%nspace, "a PMIx environment for an unknown namespace");
                };
                if index == 0 && !self.gate.waits_for(Wait::Environments) {
                    // A late server's (the rank runs already, with what `Late` gave it), or
                    // after a teardown gave up on the ranks.
                    return;
                }
                pmix.envs.insert((index, rank), vars);
                let have = pmix.envs_of(index);
                if index == 0 {
                    if have == self.plan.ranks.len() && self.gate.came(Wait::Environments) {
                        self.start_launched_ranks();
                    }
                } else if let Some(spawning) = pmix.spawning.get_mut(&index) {
                    match spawning.registration.env(status) {
                        Registered::Waiting => {}
                        Registered::Ready => {
                            let spawning = pmix.spawning.remove(&index).expect("just seen");
                            self.pmix_spawned(spawning);
                        }
                        Registered::Failed(status) => {
                            let spawning = pmix.spawning.remove(&index).expect("just seen");
                            self.pmix_spawn_failed(spawning, status);
                        }
                    }
                }
            }
            pmix::Event::Fence { id, collect: _, procs, data } => {
                let whole = matches!(&procs[..],
                    [p] if p.nspace == self.job.jobid && p.rank == wire::RANK_WILDCARD);
                if !whole {
                    return self.pmix_group_fence(id, &procs, data);
                }
                self.pmix_fence_entered(id, data);
            }
            pmix::Event::Dmodex { id, proc } => self.dmodex_request(id, proc),
            pmix::Event::DmodexData { id, status, data } => self.dmodex_data(id, status, data),
            pmix::Event::Abort { id, proc, status, mut msg } => {
                // Open MPI 4.1's MPI_Abort always says "N/A": nothing to print.
                if msg == "N/A" {
                    msg.clear();
                }
                let rank = pmix.gid(&proc).unwrap_or(Gid(proc.rank));
                let pid = self.ranks.find(rank).map_or(0, |r| r.pid as u32);
                let _ = self.up.control.send(Up::Abort { rank, pid, code: status, msg });
                pmix.host.send(Command::OpDone { id, status: wire::SUCCESS });
            }
            pmix::Event::Publish { id, proc, once, mut pairs } => {
                let rank = pmix.gid(&proc).unwrap_or(Gid(proc.rank));
                match pairs.len() {
                    1 => {
                        let (service, value) = pairs.remove(0);
                        let packed =
                            matches!(value, rlaunch_protocol::control::NameValue::Packed(_));
                        tracing::debug!(%service, once, packed, "PMIx publish");
                        let op = NameOp::Publish { service, value, once };
                        let _ = self.up.control.send(Up::Name { rank, tag: name_tag(id), op });
                    }
                    n => {
                        let status = if n == 0 { wire::SUCCESS } else { wire::ERR_NOT_SUPPORTED };
                        pmix.host.send(Command::OpDone { id, status });
                    }
                }
            }
            pmix::Event::Unpublish { id, proc, mut keys } => match keys.len() {
                1 => {
                    let rank = pmix.gid(&proc).unwrap_or(Gid(proc.rank));
                    let op = NameOp::Unpublish { service: keys.remove(0) };
                    let _ = self.up.control.send(Up::Name { rank, tag: name_tag(id), op });
                }
                _ => pmix.host.send(Command::OpDone { id, status: wire::ERR_NOT_SUPPORTED }),
            },
            pmix::Event::Lookup { id, proc, wait, mut keys } => match keys.len() {
                1 => {
                    let rank = pmix.gid(&proc).unwrap_or(Gid(proc.rank));
                    let service = keys.remove(0);
                    tracing::debug!(%service, ?wait, "PMIx lookup");
                    pmix.lookups.insert(id, service.clone());
                    let op = NameOp::Lookup { service, wait };
                    let _ = self.up.control.send(Up::Name { rank, tag: name_tag(id), op });
                }
                _ => {
                    let (status, found) = (wire::ERR_NOT_SUPPORTED, Vec::new());
                    pmix.host.send(Command::LookupDone { id, status, found });
                }
            },
            pmix::Event::Spawn { id, proc, apps } => {
                let cmds: Vec<SpawnCmd> =
                    apps.into_iter().map(super::pmix_spawn::spawn_cmd).collect();
                match pmix.gid(&proc) {
                    Some(rank) if cmds.iter().any(|c| c.nprocs > 0) => {
                        let request = SpawnRequest { cmds, preput: Vec::new() };
                        let _ =
                            self.up.control.send(Up::Spawn { rank, tag: name_tag(id), request });
                    }
                    _ => {
                        let (status, nspace) = (wire::ERR_BAD_PARAM, String::new());
                        pmix.host.send(Command::SpawnDone { id, status, nspace });
                    }
                }
            }
            pmix::Event::Connected { proc } => {
                tracing::debug!(nspace = proc.nspace, rank = proc.rank, "PMIx client connected");
                let gid = pmix.gid(&proc);
                if let Some(gid) = gid {
                    pmix.connected.insert(gid);
                }
                if let Some(local) = gid.and_then(|g| self.ranks.iter().position(|r| r.gid == g)) {
                    self.pmi_initialised(local);
                }
            }
            pmix::Event::Finalized { proc } => {
                tracing::debug!(nspace = proc.nspace, rank = proc.rank, "PMIx client finalized");
                if let Some(gid) = pmix.gid(&proc) {
                    pmix.finalized.insert(gid);
                }
            }
            pmix::Event::Synced { id } => {
                if let Some((local, outcome)) = pmix.syncs.remove(&id) {
                    self.judge_reaped(local, outcome);
                }
            }
            pmix::Event::Notice { text } => tracing::warn!("PMIx server: {text}"),
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
        self.gate.closed() || self.pmix.server.as_ref().is_some_and(|p| !p.spawning.is_empty())
    }
}

impl PmixService {
    /// Whether rank `gid` connected to the PMIx server and left without finalizing.
    pub(super) fn left_unfinalized(&self, gid: Gid) -> bool {
        self.server
            .as_ref()
            .is_some_and(|p| p.connected.contains(&gid) && !p.finalized.contains(&gid))
    }

    /// Asks the server for a sign of life: it answers `Synced` from its main thread.
    pub(super) fn ping(&mut self) {
        if let Some(pmix) = self.server.as_mut() {
            let id = pmix.next_sync;
            pmix.next_sync = pmix.next_sync.wrapping_add(1);
            pmix.host.send(Command::Sync { id });
        }
    }

    /// The job goes on after a stop: the server's silence while stopped means nothing.
    pub(super) fn resumed(&mut self) {
        if let Some(pmix) = self.server.as_mut() {
            pmix.heard = Instant::now();
        }
    }

    /// The root's answer to a PMIx name-service request of a local rank.
    pub(super) fn name_answer(&mut self, id: u32, answer: NameAnswer) {
        let Some(pmix) = self.server.as_mut() else { return };
        let command = match answer {
            NameAnswer::Published(ok) => {
                let status = if ok { wire::SUCCESS } else { wire::ERR_DUPLICATE_KEY };
                Command::OpDone { id, status }
            }
            NameAnswer::Unpublished(ok) => {
                let status = if ok { wire::SUCCESS } else { wire::ERR_NOT_FOUND };
                Command::OpDone { id, status }
            }
            NameAnswer::Lookup(value) => {
                let key = pmix.lookups.remove(&id).unwrap_or_default();
                // The publisher is not recorded: PMIX_RANK_UNDEF.
                match value {
                    Some(value) => Command::LookupDone {
                        id,
                        status: wire::SUCCESS,
                        found: vec![(key, value, u32::MAX)],
                    },
                    None => Command::LookupDone { id, status: wire::ERR_NOT_FOUND, found: vec![] },
                }
            }
        };
        pmix.host.send(command);
    }
}
