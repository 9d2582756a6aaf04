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

use rlaunch_protocol::control::{Job, SpawnCmd, SpawnJob, SpawnOutcome};

use super::server::Nspace;
use super::PmixService;
use crate::node::launch::JobRanks;
use crate::node::Node;
use crate::pmix::wire::{self, App};
use crate::pmix::Command;

/// A spawned job between its registration with the server and the start of its ranks here.
pub(in crate::node) struct Spawning {
    pub(super) nspace: String,
    pub(super) job: Job,
    pub(super) index: u32,
    pub(super) ranks: JobRanks,
    pub(super) registration: Registration,
}

/// How a spawned job's registration with the server goes: ready once every rank's
/// environment is in, failed if the server could not take the job or one of its ranks.
#[derive(Debug)]
pub(super) struct Registration {
    ranks: usize,
    envs: usize,
    /// The first status that kept the server from the job.
    failed: Option<wire::Status>,
}

#[derive(Debug, PartialEq, Eq)]
pub(super) enum Registered {
    Waiting,
    Ready,
    Failed(wire::Status),
}

impl Registration {
    fn new(ranks: usize) -> Registration {
        Registration { ranks, envs: 0, failed: None }
    }

    /// The server registered the job's namespace, or could not (`status`).
    pub(super) fn namespace(&mut self, status: wire::Status) {
        if status != wire::SUCCESS {
            self.failed.get_or_insert(status);
        }
    }

    /// A rank's environment is in, or the status that kept the server from it.
    pub(super) fn env(&mut self, status: wire::Status) -> Registered {
        self.envs += 1;
        if status != wire::SUCCESS {
            self.failed.get_or_insert(status);
        }
        match self.failed {
            _ if self.envs < self.ranks => Registered::Waiting,
            None => Registered::Ready,
            Some(status) => Registered::Failed(status),
        }
    }
}

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

/// What rlaunch's spawn makes of a PMIx application: its argv after the program's name, its
/// environment, and its hints under the names PMI spawns give them (the first of a name
/// wins: the application's own come ahead of the job's).
pub(super) fn spawn_cmd(app: App) -> SpawnCmd {
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_spawned_job_is_ready_once_every_environment_is_in_unless_the_server_refused_it() {
        let mut fine = Registration::new(2);
        fine.namespace(wire::SUCCESS);
        assert_eq!(fine.env(wire::SUCCESS), Registered::Waiting);
        assert_eq!(fine.env(wire::SUCCESS), Registered::Ready);
        // The namespace refused: the ranks' environments still come (failed), then the
        // spawner hears the first status.
        let mut refused = Registration::new(2);
        refused.namespace(wire::ERR_BAD_PARAM);
        assert_eq!(refused.env(wire::ERR_NOT_FOUND), Registered::Waiting);
        assert_eq!(refused.env(wire::ERR_NOT_FOUND), Registered::Failed(wire::ERR_BAD_PARAM));
        // One rank without an environment fails the job too.
        let mut rank = Registration::new(2);
        rank.namespace(wire::SUCCESS);
        assert_eq!(rank.env(wire::ERR_NOT_FOUND), Registered::Waiting);
        assert_eq!(rank.env(wire::SUCCESS), Registered::Failed(wire::ERR_NOT_FOUND));
    }
}
