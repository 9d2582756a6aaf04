//! A job a rank spawned (MPI_Comm_spawn), as a node that runs some of its ranks sees it: made
//! from the launched job and the root's [`SpawnJob`] alone, so that a test can check it.

use std::sync::Arc;

use rlaunch_protocol::control::{Job, Segment, SpawnJob};
use rlaunch_protocol::ids::{Gid, NodeId};

use super::{JobRank, JobRanks, JobState};
use crate::kvs::{FenceScope, Kvs};
use crate::pmi::PmiJob;

/// Spawned job `sj` on tree node `node` of a run whose launched job is `launched`: the job
/// its ranks start as, its ranks here (rank in the job, global id, segment) in local order,
/// and its PMI state on this node.
pub(super) fn job(launched: &Job, sj: &SpawnJob, node: NodeId) -> (Job, JobRanks, JobState) {
    let mut segments = Vec::new();
    let mut rank_app = Vec::new();
    for (appnum, cmd) in sj.request.cmds.iter().enumerate() {
        let info = |k: &str| cmd.info.iter().find(|(key, _)| key == k).map(|(_, v)| v.clone());
        let exe = match info("path") {
            Some(dir) if !cmd.exe.contains('/') => format!("{dir}/{}", cmd.exe),
            _ => cmd.exe.clone(),
        };
        let wdir = info("wdir").map(String::into_bytes);
        let mut env = vec![(b"PMI_SPAWNED".to_vec(), b"1".to_vec())];
        env.extend(cmd.env.iter().map(|var| match var.split_once('=') {
            Some((name, value)) => (name.as_bytes().to_vec(), value.as_bytes().to_vec()),
            None => (var.as_bytes().to_vec(), Vec::new()),
        }));
        segments.push(Segment {
            exe: exe.into_bytes(),
            args: cmd.args.iter().map(|a| a.clone().into_bytes()).collect(),
            inherit_env: true,
            env,
            wdir: wdir.unwrap_or_else(|| launched.segments[0].wdir.clone()),
        });
        rank_app.extend((0..cmd.nprocs).map(|_| appnum as u32));
    }
    let size = sj.size();
    let mut job = launched.clone();
    job.jobid = sj.kvsname.clone();
    job.size = size;
    job.segments = segments;
    job.nodes = sj.nodes.len() as u32;
    // Its rank 0 serves no rendezvous rlaunch knows of, nor is rlaunch its tracker.
    job.rendezvous = None;
    job.tracker = None;
    // Its ranks see the GPUs the proxy sees: the launched job's ranks hold theirs. They are
    // placed by slot (bound as the launched job's are): a spawn is laid out by its own hints,
    // and no `ppr` count must refuse it on one node while others start.
    job.gpus = None;
    job.mapping = None;
    // Its ranks join the launched ones, which hold their shares of the cores already.
    job.spread = false;
    // Inside an allocation, its ranks' step is its own nodes.
    if job.slurm_nodes.is_some() {
        let hosts: Vec<&str> = sj.nodes.iter().map(|(_, host)| host.as_str()).collect();
        job.slurm_nodes = Some(hosts.join(","));
    }
    let pmi = Arc::new(PmiJob {
        kvsname: sj.kvsname.clone(),
        size,
        process_mapping: sj.process_mapping.clone(),
        spawner: Some(sj.parent_kvsname.clone()),
    });
    let here = sj.ranks_on(node);
    let scope = if sj.nodes.len() > 1 { FenceScope::Root } else { FenceScope::ThisNode };
    let kvs = Kvs::new(scope, here.len(), sj.request.preput.iter().cloned());
    let group = (sj.node_id(node).unwrap_or(0), sj.nodes.len() as u32);
    let ranks = here
        .into_iter()
        .map(|r| JobRank { rank: r, gid: Gid(sj.first + r), segment: rank_app[r as usize] })
        .collect();
    (job, ranks, JobState { pmi, kvs, group })
}

#[cfg(test)]
mod tests {
    use super::*;
    use rlaunch_protocol::control::{Rendezvous, SpawnCmd, SpawnRequest};

    fn launched() -> Job {
        let segment = Segment {
            exe: b"/bin/parent".to_vec(),
            args: vec![],
            inherit_env: true,
            env: vec![],
            wdir: b"/home/u".to_vec(),
        };
        let mut job = Job::simple("kvs_0", 4, vec![segment]);
        job.rendezvous = Some(Rendezvous { addr: "10.0.0.1".into(), port: 29500, jax_port: 0 });
        job.slurm_nodes = Some("a,b,c".into());
        job
    }

    fn cmd(exe: &str, nprocs: u32, info: &[(&str, &str)], env: &[&str]) -> SpawnCmd {
        SpawnCmd {
            exe: exe.into(),
            args: vec!["-x".into()],
            nprocs,
            info: info.iter().map(|&(k, v)| (k.into(), v.into())).collect(),
            env: env.iter().map(|&v| v.into()).collect(),
        }
    }

    /// Two executables over tree nodes 4 and 2 (the job's nodes 0 and 1): rank 1 on node 4,
    /// ranks 0 and 2 on node 2.
    fn spawn() -> SpawnJob {
        let cmds = vec![
            cmd("worker", 2, &[("path", "/opt/bin")], &["A=1=2", "B"]),
            cmd("/abs/tool", 1, &[("path", "/ignored"), ("wdir", "/scratch")], &[]),
        ];
        SpawnJob {
            job: 3,
            kvsname: "kvs_3".into(),
            parent_kvsname: "kvs_0".into(),
            nodes: vec![(NodeId(4), "n4".into()), (NodeId(2), "n2".into())],
            rank_node: vec![1, 0, 1],
            process_mapping: Some("(vector,(0,2,1))".into()),
            first: 10,
            parent: Gid(0),
            tag: None,
            request: SpawnRequest { cmds, preput: vec![("PARENT".into(), "port".into())] },
        }
    }

    #[test]
    fn a_spawned_job_runs_its_own_programs_with_its_ranks_here_numbered_past_the_launched_ones() {
        let (job, ranks, state) = job(&launched(), &spawn(), NodeId(2));
        assert_eq!((job.jobid.as_str(), job.size, job.nodes), ("kvs_3", 3, 2));
        let exes: Vec<&[u8]> = job.segments.iter().map(|s| &s.exe[..]).collect();
        assert_eq!(exes, [&b"/opt/bin/worker"[..], b"/abs/tool"], "path joins a bare name only");
        let wdirs: Vec<&[u8]> = job.segments.iter().map(|s| &s.wdir[..]).collect();
        assert_eq!(wdirs, [&b"/home/u"[..], b"/scratch"], "the launched job's, unless wdir");
        let env = &job.segments[0].env;
        let pair = |k: &[u8], v: &[u8]| (k.to_vec(), v.to_vec());
        assert_eq!(env, &[pair(b"PMI_SPAWNED", b"1"), pair(b"A", b"1=2"), pair(b"B", b"")]);
        assert_eq!(job.segments[1].args, [b"-x".to_vec()]);
        let expected = [
            JobRank { rank: 0, gid: Gid(10), segment: 0 },
            JobRank { rank: 2, gid: Gid(12), segment: 1 },
        ];
        assert_eq!(ranks, expected);
        // Nothing of the launched job's rendezvous, tracker, GPUs or mapping; its own step.
        assert_eq!((job.rendezvous, job.tracker, job.gpus, job.mapping), (None, None, None, None));
        assert_eq!(job.slurm_nodes.as_deref(), Some("n4,n2"));
        assert_eq!(state.group, (1, 2));
        assert_eq!(state.pmi.spawner.as_deref(), Some("kvs_0"));
        assert_eq!(state.pmi.process_mapping.as_deref(), Some("(vector,(0,2,1))"));
        assert_eq!(state.kvs.get("PARENT").as_deref(), Some("port"));
    }

    #[test]
    fn a_node_the_spawn_does_not_use_runs_none_of_its_ranks() {
        let (_, ranks, state) = job(&launched(), &spawn(), NodeId(7));
        assert!(ranks.is_empty());
        assert_eq!(state.group, (0, 2));
        let (_, ranks, _) = job(&launched(), &spawn(), NodeId(4));
        assert_eq!(ranks, [JobRank { rank: 1, gid: Gid(11), segment: 0 }]);
    }
}
