//! MPI_Comm_spawn at the root: a new job's ids and kvsname, and where its ranks go. By
//! default after the last slot taken, round the job's hosts (Hydra's and mpirun's rule);
//! the spawn's hints choose otherwise (`host`, `hostfile`, `add-host`, `add-hostfile`,
//! `map-by`). A host with no proxy left gets one, a child of rlaunch's. Every node hears of
//! the job; once each that runs some of its ranks has started them, the spawner hears how it
//! went. A hint that names no host of the job fails the spawn call, not the job.
//!
//! ```text
//!   Up::Spawn ──► place ──► late proxies ──► Down::Spawn (every node)
//!   Up::SpawnStarted × the job's nodes ──► Down::SpawnAnswer ──► the spawner's node
//!   Up::JobFenceIn × the job's nodes ──► Down::JobFenceOut (a job over several nodes)
//! ```

use rlaunch_protocol::ids::{Gid, NodeId};
use std::collections::{BTreeSet, HashMap};

use rlaunch_protocol::control::{
    Bootstrap, Down, NodePlan, SpawnCmd, SpawnJob, SpawnOutcome, SpawnRequest,
};
use rlaunch_tree::children::Lost;
use rlaunch_tree::credit;
use rlaunch_tree::fence::{FenceFold, Pair};

use super::cause::Cause;
use super::{route, Root};
use crate::hosts::{self, Host};
use crate::output::SpawnedJob;
use crate::place::{self, Universe};
use crate::quote::cut;

/// The most processes one spawn may ask for: as many as Linux runs on a host (pid_max).
const MAX_SPAWN: u32 = 4_194_304;

/// The root's spawned jobs on their way, and the fences of those over several nodes.
#[derive(Default)]
pub(super) struct Spawns {
    /// Jobs whose nodes have not all started their ranks, by index.
    pending: HashMap<u32, Pending>,
    /// Jobs over several nodes: their fence, and how many nodes take part.
    fences: HashMap<u32, (FenceFold, usize)>,
    /// Nodes started during the run, by index: their host.
    late: HashMap<NodeId, String>,
}

/// A spawned job before every node of it has started its ranks.
struct Pending {
    parent: Gid,
    tag: Option<String>,
    kvsname: String,
    /// The nodes still to say.
    waiting: BTreeSet<NodeId>,
    /// Why some node did not start its ranks.
    refused: Option<String>,
}

impl Root {
    /// A rank asked for a new job: give it ids and a kvsname, place its ranks and have their
    /// nodes start them. Its ranks count for the run's outcome like any other.
    pub(super) fn spawn(&mut self, parent: Gid, tag: Option<String>, request: SpawnRequest) {
        if self.roll.node(parent).is_none() {
            return;
        }
        // A garbage count (an uninitialised maxprocs) must not lay out billions of ranks:
        // no more than one host can run, and ids must stay within u32.
        let size = request.cmds.iter().try_fold(0u32, |sum, c| sum.checked_add(c.nprocs));
        let fits = size.filter(|&n| n <= MAX_SPAWN && self.roll.len().checked_add(n).is_some());
        if fits.is_none() {
            let asked: u64 = request.cmds.iter().map(|c| u64::from(c.nprocs)).sum();
            return self.fail(Cause::SpawnTooLarge { rank: parent, asked });
        }
        let placed = match self.place_spawn(&request.cmds) {
            Ok(placed) => placed,
            Err(reason) => return self.refuse_spawn(parent, tag, reason),
        };
        let mut nodes: Vec<(NodeId, String)> = Vec::new();
        let mut rank_node = Vec::with_capacity(placed.len());
        let mut starting = Vec::new();
        for host in &placed {
            let node = match nodes.iter().position(|(_, h)| h == host) {
                Some(i) => i,
                None => {
                    let node = match self.live_node(host) {
                        Some(node) => node,
                        None => {
                            let node = self.roll.add_node(host);
                            starting.push(node);
                            node
                        }
                    };
                    nodes.push((node, host.clone()));
                    nodes.len() - 1
                }
            };
            rank_node.push(node as u32);
        }
        let global: Vec<NodeId> = rank_node.iter().map(|&i| nodes[i as usize].0).collect();
        let (job, first) = self.roll.add_spawned(&global, &request);
        let spawn = SpawnJob {
            job,
            kvsname: format!("{}_{job}", self.plan.job.jobid),
            parent_kvsname: self.plan.job.jobid.clone(),
            process_mapping: place::process_mapping(&rank_node),
            nodes,
            rank_node,
            first,
            parent,
            tag,
            request,
        };
        // Before the proxies hear of it, so the writer knows the job before its first line.
        let _ = self.spawned_jobs.send(SpawnedJob {
            job,
            first: Gid(first),
            size: spawn.size(),
            hosts: spawn.nodes.iter().map(|(_, h)| h.clone()).collect(),
            rank_node: spawn.rank_node.clone(),
            jobid: spawn.kvsname.clone(),
        });
        tracing::debug!(job, first, nodes = spawn.nodes.len(), "spawning a job");
        let waiting: BTreeSet<NodeId> = spawn.nodes.iter().map(|&(n, _)| n).collect();
        if waiting.len() > 1 {
            self.spawns.fences.insert(job, (FenceFold::default(), waiting.len()));
        }
        let pending = Pending {
            parent,
            tag: spawn.tag.clone(),
            kvsname: spawn.kvsname.clone(),
            waiting,
            refused: None,
        };
        self.spawns.pending.insert(job, pending);
        for node in starting {
            let ranks = spawn.ranks_on(node).len();
            self.start_late_proxy(node, ranks);
        }
        for (node, ranks) in spawn.runs() {
            self.children.add_ranks(node, ranks);
        }
        // To every node: those with ranks of it start them, and the others' PMIx servers
        // learn it, for the parents a spawn collective over several nodes has there.
        self.children.broadcast(&Down::Spawn(Box::new(spawn)));
    }

    /// The host of each rank of a spawn, command after command.
    fn place_spawn(&mut self, cmds: &[SpawnCmd]) -> Result<Vec<String>, String> {
        let mut placed = Vec::new();
        for cmd in cmds {
            let hints = Hints::read(cmd)?;
            let hosts = match self.chosen_hosts(&hints)? {
                Some(chosen) => Universe::on(&chosen, cmd.nprocs, hints.by_node.unwrap_or(false)),
                None => self.plan.universe.next(cmd.nprocs, hints.by_node),
            };
            placed.extend(hosts);
        }
        Ok(placed)
    }

    /// The hosts a spawn's hints name, with their slots, each one of the job's or added to
    /// it; `None` if they name none.
    fn chosen_hosts(&mut self, hints: &Hints) -> Result<Option<Vec<Host>>, String> {
        if hints.hosts.is_empty() && hints.added.is_empty() {
            return Ok(None);
        }
        let mut chosen = Vec::new();
        for asked in &hints.hosts {
            let known = self.plan.universe.find(&asked.name).or_else(|| {
                // This machine by another of its names.
                let own = &self.plan.own_host;
                let local = hosts::is_local(&asked.name, own);
                self.plan.universe.find(own).filter(|_| local)
            });
            let Some(known) = known else {
                let name = cut(&asked.name);
                return Err(format!(
                    "host {name} is not one of the job's hosts (the add-host hint adds one)"
                ));
            };
            let slots = if asked.counted { asked.slots } else { known.slots };
            chosen.push(Host { name: known.name.clone(), slots });
        }
        for added in &hints.added {
            let host = Host { name: added.name.clone(), slots: added.slots };
            self.plan.universe.add(host.clone());
            chosen.push(host);
        }
        Ok(Some(chosen))
    }

    /// A node on `host` whose proxy will be there to start more ranks: one that runs a
    /// process still, or was started during the run and has not finished.
    fn live_node(&self, host: &str) -> Option<NodeId> {
        (0..self.roll.node_count())
            .map(NodeId)
            .find(|&node| self.roll.node_host(node) == host && self.roll.node_busy(node))
    }

    /// Starts a proxy for node `node` of the run, which had none on its host, as a child of
    /// rlaunch's; `ranks`: how many of the spawn's ranks it runs.
    fn start_late_proxy(&mut self, node: NodeId, ranks: usize) {
        let host = self.roll.node_host(node).to_string();
        let plan = NodePlan {
            index: node,
            host: host.clone(),
            fork: false,
            ranks: Vec::new(),
            children: Vec::new(),
        };
        let Some((events, output)) = self.links.clone() else { return };
        let window = credit::window(credit::ROOT_BUDGET, ranks, self.roll.len() as usize);
        let started = if self.plan.dial.is_some() {
            self.start_late_dialing(&plan, window, &events, &output)
        } else {
            let (job, own) = (&self.plan.job, &self.plan.own_host);
            let fork = job.bootstrap == Bootstrap::Fork
                || (!self.plan.forced_remote && hosts::is_local(&host, own));
            let process = self.proxies.late(&plan, fork);
            let process = match output.splicer() {
                Some(splicer) => process.map(|p| splicer.attach(p)),
                None => process,
            };
            let (report, attempt) = (self.plan.report_bindings, self.policy.attempt());
            self.children.start_late(job, &plan, window, process.map(Some), |child| {
                move |event| route(child, attempt, event, output.clone(), events.clone(), report)
            })
        };
        self.spawns.late.insert(node, host);
        if let Err(lost) = started {
            self.proxy_lost(lost);
        }
    }

    /// The spawn of rank `parent` does not happen, for `reason`: the rank hears so (its
    /// MPI_Comm_spawn fails) and so does the user.
    fn refuse_spawn(&mut self, parent: Gid, tag: Option<String>, reason: String) {
        let who = self.roll.name(parent);
        eprintln!("rlaunch: note: the spawn of {who} failed: {reason}");
        let outcome = SpawnOutcome::Refused { reason };
        self.children.send_toward_rank(parent, Down::SpawnAnswer { rank: parent, tag, outcome });
    }

    /// Node `node` started its ranks of spawned job `job`, or could not (`refused`).
    pub(super) fn spawn_started(&mut self, job: u32, node: NodeId, refused: Option<String>) {
        let Some(pending) = self.spawns.pending.get_mut(&job) else { return };
        pending.waiting.remove(&node);
        if let Some(why) = refused {
            pending.refused.get_or_insert(why);
        }
        if !pending.waiting.is_empty() {
            return;
        }
        let Pending { parent, tag, kvsname, refused, .. } =
            self.spawns.pending.remove(&job).expect("just seen");
        match refused {
            Some(reason) => self.refuse_spawn(parent, tag, reason),
            None => {
                tracing::debug!(job, "spawned job started on every node");
                let outcome = SpawnOutcome::Started { kvsname };
                let down = Down::SpawnAnswer { rank: parent, tag, outcome };
                self.children.send_toward_rank(parent, down);
            }
        }
    }

    /// Every node of spawned job `job` that runs some of its ranks entered a fence:
    /// complete, it goes to every node.
    pub(super) fn job_fence(&mut self, job: u32, epoch: u64, pairs: Vec<Pair>) {
        let Some((fold, parties)) = self.spawns.fences.get_mut(&job) else {
            return tracing::warn!(job, "a fence of a job that fences on one node");
        };
        if epoch != fold.epoch() {
            tracing::warn!(job, epoch, expected = fold.epoch(), "fence entry for another epoch");
        }
        fold.arrive(pairs);
        if let Some((epoch, pairs)) = fold.complete(*parties) {
            fold.finish(epoch);
            tracing::debug!(job, epoch, pairs = pairs.len(), "spawned job's fence complete");
            self.children.broadcast(&Down::JobFenceOut { job, epoch, pairs });
        }
    }

    /// A proxy is lost. One started for a spawn that has not started its ranks yet fails
    /// that spawn (the spawner hears why); any other fails the job.
    pub(super) fn proxy_lost(&mut self, Lost { host, reason, came_up }: Lost) {
        let late = self.spawns.late.iter().map(|(&node, h)| (node, h)).filter(|(_, h)| **h == host);
        let late: Vec<NodeId> = late.map(|(node, _)| node).collect();
        let pending = self.spawns.pending.iter().find_map(|(&job, p)| {
            late.iter().find(|n| p.waiting.contains(n)).map(|&node| (job, node))
        });
        match pending {
            Some((job, node)) => {
                let why = format!("cannot start a proxy on {host}: {reason}");
                self.spawns.late.remove(&node);
                self.spawn_started(job, node, Some(why));
            }
            None => self.fail(Cause::LostProxy { host, reason, came_up }),
        }
    }
}

/// What a spawn command's hints ask for.
#[derive(Debug, Default, PartialEq)]
struct Hints {
    /// Hosts of the job to place on (`host`, `hostfile`).
    hosts: Vec<Asked>,
    /// Hosts to add to the job and place on (`add-host`, `add-hostfile`).
    added: Vec<Asked>,
    /// `map-by`: node (true) or slot (false).
    by_node: Option<bool>,
}

/// A host a hint names, with the slots it gives (`counted`) or one.
#[derive(Debug, PartialEq)]
struct Asked {
    name: String,
    slots: u32,
    counted: bool,
}

impl Hints {
    fn read(cmd: &SpawnCmd) -> Result<Hints, String> {
        let mut hints = Hints::default();
        for (key, value) in &cmd.info {
            match key.as_str() {
                "host" => hints.hosts.extend(listed(value)?),
                "add-host" => hints.added.extend(listed(value)?),
                "hostfile" => hints.hosts.extend(from_file(value)?),
                "add-hostfile" => hints.added.extend(from_file(value)?),
                "map-by" => {
                    // Open MPI's spelling may carry modifiers: `node:OVERSUBSCRIBE`.
                    let policy = value.split(':').next().unwrap_or("").to_ascii_lowercase();
                    hints.by_node = Some(match policy.as_str() {
                        "node" => true,
                        "slot" | "core" => false,
                        _ => {
                            let value = cut(value);
                            return Err(format!(
                                "map-by {value} is not one rlaunch knows for a spawn: slot or node"
                            ));
                        }
                    });
                }
                _ => {}
            }
        }
        Ok(hints)
    }
}

/// The hosts of a `host` hint: names, each with `:N` slots or not, by commas or spaces.
fn listed(value: &str) -> Result<Vec<Asked>, String> {
    let mut asked = Vec::new();
    for item in value.split([',', ' ']).filter(|s| !s.is_empty()) {
        let counted = item.contains(':');
        let host =
            hosts::parse_host_list(item).map_err(|e| format!("host hint {}: {e}", cut(value)))?;
        asked.extend(host.into_iter().map(|h| Asked { name: h.name, slots: h.slots, counted }));
    }
    if asked.is_empty() {
        return Err("a host hint names no host".to_string());
    }
    Ok(asked)
}

/// The hosts of a `hostfile` hint: the file's, with their slots.
fn from_file(path: &str) -> Result<Vec<Asked>, String> {
    let hosts = hosts::read_hostfile(std::path::Path::new(path)).map_err(|e| e.to_string())?;
    Ok(hosts.into_iter().map(|h| Asked { name: h.name, slots: h.slots, counted: true }).collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cmd(info: &[(&str, &str)]) -> SpawnCmd {
        let info = info.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
        SpawnCmd { exe: "x".into(), args: vec![], nprocs: 1, info, env: vec![] }
    }

    #[test]
    fn hints_name_hosts_and_a_mapping() {
        let hints =
            Hints::read(&cmd(&[("host", "a:2,b"), ("add-host", "c"), ("map-by", "node:SPAN")]))
                .unwrap();
        let names: Vec<_> =
            hints.hosts.iter().map(|h| (h.name.as_str(), h.slots, h.counted)).collect();
        assert_eq!(names, [("a", 2, true), ("b", 1, false)]);
        assert_eq!(hints.added[0].name, "c");
        assert_eq!(hints.by_node, Some(true));
        assert_eq!(Hints::read(&cmd(&[("wdir", "/tmp")])).unwrap(), Hints::default());
        let bad = Hints::read(&cmd(&[("map-by", "ppr:2:socket")])).unwrap_err();
        assert_eq!(bad, "map-by ppr:2:socket is not one rlaunch knows for a spawn: slot or node");
        assert_eq!(Hints::read(&cmd(&[("host", " , ")])).unwrap_err(), "a host hint names no host");
        let missing = Hints::read(&cmd(&[("hostfile", "/nonexistent/hosts")])).unwrap_err();
        assert!(missing.contains("/nonexistent/hosts"), "{missing}");
    }
}
