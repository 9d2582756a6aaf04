//! Jobs a rank of this node spawns through PMIx (MPI_Comm_spawn): each is one more namespace
//! of the node's server, its ranks held until their environments are in, then started, and
//! the spawner answered; a job the server cannot register never starts, and the spawner
//! hears why. A job spawned on another node is registered here too, for parents here.
//!
//! ```text
//!   host ──Spawn(id)──► Up::Spawn ─► root ─► Down::Spawn ─► Setup, Clients ──► host
//!        ──SetupDone, Env × ranks──► Registration ──ranks start, SpawnDone(id, nspace)──► host
//!                                                 └─refused: SpawnDone(id, status)──────► host
//! ```

use pmi_wire::control::{Job, SpawnCmd, SpawnJob};

use super::launch::JobRanks;
use super::Node;
use crate::pmix::wire::{self, App};
use crate::pmix::Command;

/// A spawned job between its registration with the server and its start.
pub(super) struct Spawning {
    /// The host's id of the spawn request, answered once the ranks are started (or cannot).
    pub(super) id: u32,
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
    /// Registers a job a local rank spawned through PMIx with this node's server; its ranks
    /// start once their environments are in. Hands the job back if there is no server.
    pub(super) fn pmix_spawn(
        &mut self,
        id: u32,
        sj: &SpawnJob,
        job: Job,
        ranks: JobRanks,
    ) -> Option<(Job, JobRanks)> {
        let host_name = self.plan.host.clone();
        let Some(pmix) = self.pmix.as_mut() else { return Some((job, ranks)) };
        let nspace = sj.kvsname.clone();
        pmix.nspaces.insert(nspace.clone(), (sj.job, sj.first, ranks.len() as u32));
        pmix.host.send(Command::Setup {
            nspace: nspace.clone(),
            jobid: nspace.clone(),
            node: Some(0),
            hosts: vec![host_name],
            rank_node: vec![0; ranks.len()],
            rank_app: ranks.iter().map(|&(_, _, segment)| segment).collect(),
            psets: Vec::new(),
            spawned: true,
        });
        pmix.host.send(Command::Clients {
            nspace: nspace.clone(),
            uid: nix::unistd::getuid().as_raw(),
            gid: nix::unistd::getgid().as_raw(),
            ranks: ranks.iter().map(|&(rank, _, _)| rank).collect(),
        });
        let registration = Registration::new(ranks.len());
        let spawning = Spawning { id, nspace, job, index: sj.job, ranks, registration };
        if spawning.ranks.is_empty() {
            self.pmix_spawned(spawning);
        } else {
            pmix.spawning.insert(sj.job, spawning);
        }
        None
    }

    /// Registers a job a rank of another node spawned through PMIx (every rank on that node)
    /// with this node's server, whose ranks may be its parents too (a spawn collective over
    /// ranks of several nodes): they connect to it, and get its ranks' data by direct modex.
    pub(super) fn pmix_spawned_elsewhere(&mut self, sj: &SpawnJob) {
        let Some(pmix) = self.pmix.as_mut() else { return };
        let Some(spawner) = self.job.pmix.as_ref().and_then(|p| p.hosts.get(sj.node as usize))
        else {
            return;
        };
        let rank_app: Vec<u32> = (sj.request.cmds.iter().enumerate())
            .flat_map(|(app, cmd)| std::iter::repeat_n(app as u32, cmd.nprocs as usize))
            .collect();
        let nspace = sj.kvsname.clone();
        pmix.nspaces.insert(nspace.clone(), (sj.job, sj.first, rank_app.len() as u32));
        pmix.host.send(Command::Setup {
            nspace: nspace.clone(),
            jobid: nspace,
            node: None,
            hosts: vec![spawner.clone()],
            rank_node: vec![0; rank_app.len()],
            rank_app,
            psets: Vec::new(),
            spawned: true,
        });
    }

    /// The server could not take a spawned job: its ranks never start, and the spawner hears
    /// why (its MPI_Comm_spawn fails).
    pub(super) fn pmix_spawn_failed(&mut self, spawning: Spawning, status: wire::Status) {
        let Spawning { id, nspace, index, .. } = spawning;
        let text = format!("{nspace} does not start: PMIx cannot register it (status {status})");
        self.notice(text);
        self.jobs.remove(&index);
        if let Some(pmix) = self.pmix.as_mut() {
            pmix.nspaces.remove(&nspace);
            pmix.envs.retain(|&(job, _), _| job != index);
            pmix.host.send(Command::SpawnDone { id, status, nspace: String::new() });
        }
    }

    /// Every rank of a spawned job has its environment: they start, and the spawner hears.
    pub(super) fn pmix_spawned(&mut self, spawning: Spawning) {
        let Spawning { id, nspace, job, index, ranks, .. } = spawning;
        self.start_spawned_ranks(&job, index, &ranks);
        tracing::debug!(job = index, %nspace, "PMIx spawned job started");
        if let Some(pmix) = self.pmix.as_ref() {
            pmix.host.send(Command::SpawnDone { id, status: wire::SUCCESS, nspace });
        }
    }
}

/// What rlaunch's spawn makes of a PMIx application: its argv after the program's name, its
/// working directory, its environment.
pub(super) fn spawn_cmd(app: App) -> SpawnCmd {
    let App { cmd, argv, env, maxprocs, info } = app;
    let info = info
        .into_iter()
        .filter_map(|(key, value)| (key == "pmix.wdir").then(|| ("wdir".to_string(), value)))
        .collect();
    let args = argv.into_iter().skip(1).collect();
    SpawnCmd { exe: cmd, args, nprocs: maxprocs, info, env }
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
