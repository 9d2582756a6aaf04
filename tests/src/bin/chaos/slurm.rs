//! The slurm topology's allocation: the tests' real Slurm (tests/cluster/slurm.sh), one
//! allocation held for the whole run (`salloc --no-shell`, as a user holds one and runs job
//! after job in it), and every trial's rlaunch started with that allocation's environment:
//! it starts its proxies with one `srun` each attempt, and they dial back (README, *Slurm*).

use std::path::Path;
use std::process::Command;

use rlaunch_tests::slurm::SlurmCluster;

/// CPUs each node of the tests' Slurm declares (`RLS_CPUS`, slurm.sh's default): the
/// allocation's slots a node, as `--hosts nI:2` gives the other topologies.
const CPUS: usize = 2;

pub struct Allocation {
    /// The cluster when the run brought it up itself (dropped last: taken down).
    _cluster: Option<SlurmCluster>,
    /// What a client of the cluster needs (`SLURM_CONF`), and the allocation's variables.
    env: Vec<(String, String)>,
    job: String,
}

impl Allocation {
    /// Allocates `nodes` whole nodes of the cluster in `dir` (brought up by the caller), or
    /// of one this brings up.
    pub fn new(dir: Option<&Path>, nodes: usize) -> Allocation {
        let (cluster, client) = match dir {
            Some(dir) => {
                let env = SlurmCluster::env_in(dir).unwrap_or_else(|e| {
                    panic!("chaos: {} holds no Slurm cluster (its env: {e})", dir.display())
                });
                (None, env)
            }
            None => {
                let cluster = SlurmCluster::up(nodes);
                let env = cluster.env().to_vec();
                (Some(cluster), env)
            }
        };
        let out = Command::new("salloc")
            .args(["-N", &nodes.to_string(), "-n", &(nodes * CPUS).to_string()])
            .args(["--no-shell", "-J", "chaos"])
            .envs(client.iter().map(|(k, v)| (k, v)))
            .output()
            .unwrap_or_else(|e| panic!("chaos: cannot run salloc: {e}"));
        let said = String::from_utf8_lossy(&out.stderr).into_owned();
        let job = said
            .lines()
            .find_map(|l| l.strip_prefix("salloc: Granted job allocation "))
            .map(|id| id.trim().to_owned())
            .unwrap_or_else(|| {
                panic!("chaos: salloc granted no allocation ({}): {said}", out.status)
            });
        let mut env = client;
        let per_node = format!("{CPUS}(x{nodes})");
        env.extend([
            ("SLURM_JOB_ID".to_owned(), job.clone()),
            ("SLURM_JOB_NODELIST".to_owned(), format!("n[1-{nodes}]")),
            ("SLURM_TASKS_PER_NODE".to_owned(), per_node.clone()),
            ("SLURM_JOB_CPUS_PER_NODE".to_owned(), per_node),
        ]);
        Allocation { _cluster: cluster, env, job }
    }

    /// The environment rlaunch runs with, inside the allocation.
    pub fn env(&self) -> &[(String, String)] {
        &self.env
    }
}

impl Drop for Allocation {
    fn drop(&mut self) {
        let client = self.env.iter().filter(|(k, _)| k == "SLURM_CONF");
        let _ = Command::new("scancel").arg(&self.job).envs(client.map(|(k, v)| (k, v))).status();
    }
}
