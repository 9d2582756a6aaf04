//! Spawned jobs (MPI_Comm_spawn) and this node's PMIx server: each is one more namespace of
//! the server, registered with the job's whole map. A node the job places ranks on holds
//! them until their environments are in, starts them, and tells the root; a job the server
//! cannot register never starts here, and the root hears why. Every other node registers
//! the job too, for its ranks that are its parents. The spawner's server hears how the
//! spawn went from the root, once every node of the job has started its ranks.
//!
//! ```text
//!   host ──Spawn(id)──► Up::Spawn ─► root ─► Down::Spawn ─► every node: Setup (its map)
//!   a node with ranks: Clients ──SetupDone, Env × ranks──► Registration
//!        ──ranks start──► Up::SpawnStarted ─► root (refused: why)
//!   root, every node in ──Down::SpawnAnswer──► spawner's node ──SpawnDone(id)──► host
//! ```

use rlaunch_protocol::control::{Job, SpawnCmd, SpawnJob, SpawnOutcome, SpawnRequest, Up};

use super::pending::{Registration, Spawning};
use super::server::{Act, Nspace, State};
use super::PmixService;
use crate::node::{JobRanks, Node};
use crate::pmix::wire::{self, App, Proc};
use crate::pmix::Command;

impl Node {
    /// Registers this node's ranks of a job a rank spawned through PMIx with this node's
    /// server (started now if it waited for a first client); its ranks start once their
    /// environments are in. Hands the job back if there is no server.
    pub(in crate::node) fn pmix_spawn(
        &mut self,
        sj: &SpawnJob,
        job: Job,
        ranks: JobRanks,
    ) -> Option<(Job, JobRanks)> {
        self.pmix_for_spawn();
        let node = sj.node_id(self.plan.index);
        let Some(pmix) = self.pmix.server.as_mut() else { return Some((job, ranks)) };
        let nspace = sj.kvsname.clone();
        pmix.state
            .nspaces
            .insert(nspace.clone(), Nspace { job: sj.job, first: sj.first, size: sj.size() });
        pmix.host.send(setup(sj, node));
        pmix.host.send(Command::Clients {
            nspace: nspace.clone(),
            uid: nix::unistd::getuid().as_raw(),
            gid: nix::unistd::getgid().as_raw(),
            ranks: ranks.iter().map(|r| r.rank).collect(),
        });
        let registration = Registration::new(ranks.len());
        let spawning = Spawning { nspace, job, index: sj.job, ranks, registration };
        if spawning.ranks.is_empty() {
            self.pmix_spawned(spawning);
        } else {
            pmix.state.spawning.insert(sj.job, spawning);
        }
        None
    }

    /// A late node (`Launch::late`), or one whose server waits for its first client, gets
    /// its server now: a PMIx spawn places ranks here.
    fn pmix_for_spawn(&mut self) {
        if self.pmix.server.is_some() || self.job.pmix.is_none() {
            return;
        }
        if self.pmix.late.is_some() {
            return self.start_late_pmix();
        }
        let files = crate::pmix::Files::at(&self.job.jobid, self.plan.index);
        if let Err(e) = self.start_host(files, None) {
            self.notice(format!("PMIx is not served on this node: {e}"));
        }
    }

    /// The server could not take a spawned job: its ranks never start here, and the root
    /// hears why (the spawner's MPI_Comm_spawn fails).
    pub(super) fn pmix_spawn_failed(&mut self, spawning: Spawning, status: wire::Status) {
        let Spawning { nspace, index, .. } = spawning;
        let text = format!("{nspace} does not start: PMIx cannot register it (status {status})");
        self.notice(text.clone());
        self.jobs.remove(&index);
        if let Some(pmix) = self.pmix.server.as_mut() {
            pmix.state.nspaces.remove(&nspace);
            pmix.state.envs.retain(|&(job, _), _| job != index);
        }
        self.spawn_started(index, Some(text));
    }

    /// Every rank of a spawned job here has its environment: they start, and the root hears.
    pub(super) fn pmix_spawned(&mut self, spawning: Spawning) {
        let Spawning { nspace, job, index, ranks, .. } = spawning;
        let refused = self.start_spawned_ranks(&job, index, &ranks).err();
        tracing::debug!(job = index, %nspace, "PMIx spawned job started");
        self.spawn_started(index, refused);
    }
}

/// The registration of spawned job `sj` with a server, as node `node` of the job (`None`:
/// with no rank here).
fn setup(sj: &SpawnJob, node: Option<u32>) -> Command {
    let rank_app: Vec<u32> = (sj.request.cmds.iter().enumerate())
        .flat_map(|(app, cmd)| std::iter::repeat_n(app as u32, cmd.nprocs as usize))
        .collect();
    Command::Setup {
        nspace: sj.kvsname.clone(),
        jobid: sj.kvsname.clone(),
        node,
        hosts: sj.nodes.iter().map(|(_, host)| host.clone()).collect(),
        rank_node: sj.rank_node.clone(),
        rank_app,
        psets: Vec::new(),
        spawned: true,
    }
}

impl State {
    /// A client asked to spawn `apps`: the request goes to the root, tagged with `id`; one
    /// of nothing to start, or from a process the server does not know, is refused at once.
    pub(super) fn spawn_request(&self, id: u32, proc: Proc, apps: Vec<App>) -> Vec<Act> {
        let cmds: Vec<SpawnCmd> = apps.into_iter().map(spawn_cmd).collect();
        match self.gid(&proc) {
            Some(rank) if cmds.iter().any(|c| c.nprocs > 0) => {
                let request = SpawnRequest { cmds, preput: Vec::new() };
                vec![Act::Up(Up::Spawn { rank, tag: super::names::tag(id), request })]
            }
            _ => {
                let (status, nspace) = (wire::ERR_BAD_PARAM, String::new());
                vec![Act::Host(Command::SpawnDone { id, status, nspace })]
            }
        }
    }
}

/// What rlaunch's spawn makes of a PMIx application: its argv after the program's name, its
/// environment, and its hints under the names PMI spawns give them (the first of a name
/// wins: the application's own come ahead of the job's).
fn spawn_cmd(app: App) -> SpawnCmd {
    let App { cmd, argv, env, maxprocs, info } = app;
    let mut hints: Vec<(String, String)> = Vec::new();
    for (key, value) in info {
        let name = match key.as_str() {
            "pmix.wdir" => "wdir",
            "pmix.host" => "host",
            "pmix.hostfile" => "hostfile",
            "pmix.addhost" => "add-host",
            "pmix.addhostfile" => "add-hostfile",
            "pmix.mapby" => "map-by",
            _ => continue,
        };
        if hints.iter().all(|(k, _)| k != name) {
            hints.push((name.to_string(), value));
        }
    }
    let args = argv.into_iter().skip(1).collect();
    SpawnCmd { exe: cmd, args, nprocs: maxprocs, info: hints, env }
}

impl PmixService {
    /// Registers a job a rank spawned through PMIx, with no rank here, with this node's
    /// server, whose ranks may be its parents (a spawn collective over ranks of several
    /// nodes): they connect to it, and get its ranks' data by direct modex.
    pub(in crate::node) fn spawned_elsewhere(&mut self, sj: &SpawnJob) {
        let Some(pmix) = self.server.as_mut() else { return };
        pmix.state
            .nspaces
            .insert(sj.kvsname.clone(), Nspace { job: sj.job, first: sj.first, size: sj.size() });
        pmix.host.send(setup(sj, None));
    }

    /// How the spawn of a local client (the host's request `id`) went.
    pub(in crate::node) fn spawn_answer(&mut self, id: u32, outcome: SpawnOutcome) {
        let Some(pmix) = self.server.as_ref() else { return };
        let (status, nspace) = match outcome {
            SpawnOutcome::Started { kvsname } => (wire::SUCCESS, kvsname),
            SpawnOutcome::Refused { reason } => {
                tracing::info!("a PMIx spawn failed: {reason}");
                (wire::ERR_BAD_PARAM, String::new())
            }
        };
        pmix.host.send(Command::SpawnDone { id, status, nspace });
    }
}
