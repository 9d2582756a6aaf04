//! MPI_Comm_spawn at the root: a new job's ids and kvsname, sent to the spawning rank's node.

use pmi_wire::control::{Down, SpawnJob, SpawnRequest};

use super::cause::Cause;
use super::Root;
use crate::output::SpawnedJob;

/// The most processes one spawn may ask for: as many as Linux runs on a host (pid_max).
const MAX_SPAWN: u32 = 4_194_304;

impl Root {
    /// A rank asked for a new job: give it ids and a kvsname and have the rank's node start
    /// it. Its ranks count for the run's outcome like any other.
    pub(super) fn spawn(&mut self, parent: u32, tag: Option<String>, request: SpawnRequest) {
        let Some(node) = self.roll.node(parent) else { return };
        // A garbage count (an uninitialised maxprocs) must not lay out billions of ranks:
        // no more than one host can run, and ids must stay within u32.
        let size = request.cmds.iter().try_fold(0u32, |sum, c| sum.checked_add(c.nprocs));
        let fits = size.filter(|&n| n <= MAX_SPAWN && self.roll.len().checked_add(n).is_some());
        if fits.is_none() {
            let asked: u64 = request.cmds.iter().map(|c| u64::from(c.nprocs)).sum();
            return self.fail(Cause::SpawnTooLarge { rank: parent, asked });
        }
        let (job, first) = self.roll.add_spawned(node, &request);
        let size = self.roll.len() - first;
        let spawn = SpawnJob {
            job,
            kvsname: format!("{}_{job}", self.plan.job.jobid),
            parent_kvsname: self.plan.job.jobid.clone(),
            node,
            first,
            parent,
            tag,
            request,
        };
        // Before the proxy hears of it, so the writer knows the job before its first line.
        let _ = self.spawned_jobs.send(SpawnedJob {
            job,
            first,
            size,
            host: self.roll.node_host(node).to_string(),
            jobid: spawn.kvsname.clone(),
        });
        tracing::debug!(job, node, first, "spawning a job");
        // To every node: the spawner's starts the job, and the others' PMIx servers learn
        // it, for the parents a spawn collective over several nodes has there.
        self.children.add_ranks(node, first..first + size);
        self.children.broadcast(&Down::Spawn(Box::new(spawn)));
    }
}
