//! Who each process of the run is, for the patterns and tags: the launched job's ranks come
//! from the plan, spawned jobs' from the root as it starts them.

use std::sync::mpsc;

use rlaunch_protocol::ids::Gid;

/// A job a rank spawned, as the root tells the writer.
#[derive(Debug, Clone)]
pub(crate) struct SpawnedJob {
    /// Index of the job (the launched job is 0).
    pub job: u32,
    /// Global id of its rank 0.
    pub first: Gid,
    pub size: u32,
    /// The hosts of its nodes, and each rank's (an index into `hosts`).
    pub hosts: Vec<String>,
    pub rank_node: Vec<u32>,
    /// Its kvsname, which `%t` gives for its ranks.
    pub jobid: String,
}

/// Where one process sits.
pub(crate) struct Place<'a> {
    /// Index of its job (the launched job is 0).
    pub job: u32,
    /// Rank within its job.
    pub rank: u32,
    /// Size of its job.
    pub size: u32,
    pub host: &'a str,
    pub jobid: &'a str,
}

pub(crate) struct Roster {
    jobid: String,
    node_hosts: Vec<String>,
    /// Node index of each rank of the launched job.
    rank_node: Vec<u32>,
    spawned: Vec<SpawnedJob>,
    /// The root sends each spawned job here before it asks a proxy to start it, so a job is
    /// known by the time its ranks' output arrives: no ordering with the output channel is
    /// needed, and the dispatcher never waits on the writer.
    news: mpsc::Receiver<SpawnedJob>,
}

impl Roster {
    pub(crate) fn new(
        jobid: String,
        node_hosts: Vec<String>,
        rank_node: Vec<u32>,
        news: mpsc::Receiver<SpawnedJob>,
    ) -> Roster {
        Roster { jobid, node_hosts, rank_node, spawned: Vec::new(), news }
    }

    /// The place of the process with global id `gid`.
    pub(crate) fn place(&mut self, Gid(gid): Gid) -> Place<'_> {
        let size = self.rank_node.len() as u32;
        if gid < size {
            let host = &self.node_hosts[self.rank_node[gid as usize] as usize];
            return Place { job: 0, rank: gid, size, host, jobid: &self.jobid };
        }
        let holds = |j: &SpawnedJob| (j.first.0..j.first.0 + j.size).contains(&gid);
        if !self.spawned.iter().any(holds) {
            self.spawned.extend(self.news.try_iter());
        }
        match self.spawned.iter().find(|j| holds(j)) {
            Some(j) => Place {
                job: j.job,
                rank: gid - j.first.0,
                size: j.size,
                host: &j.hosts[j.rank_node[(gid - j.first.0) as usize] as usize],
                jobid: &j.jobid,
            },
            None => {
                tracing::warn!(gid, "output of a process no job holds");
                Place { job: 0, rank: gid, size, host: "unknown", jobid: &self.jobid }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn launched_and_spawned_ranks_are_placed() {
        let (tx, rx) = mpsc::channel();
        let mut roster = Roster::new("j".into(), vec!["a".into(), "b".into()], vec![0, 0, 1], rx);
        let p = roster.place(Gid(2));
        assert_eq!((p.job, p.rank, p.size, p.host, p.jobid), (0, 2, 3, "b", "j"));
        let (hosts, rank_node) = (vec!["a".into(), "c".into()], vec![0, 1]);
        tx.send(SpawnedJob {
            job: 1,
            first: Gid(3),
            size: 2,
            hosts,
            rank_node,
            jobid: "j_1".into(),
        })
        .unwrap();
        let p = roster.place(Gid(4));
        assert_eq!((p.job, p.rank, p.size, p.host, p.jobid), (1, 1, 2, "c", "j_1"));
        assert_eq!(roster.place(Gid(9)).host, "unknown");
    }
}
