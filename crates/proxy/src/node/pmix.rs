//! What this node's PMIx server asks of the node, and how the node answers: the launched
//! job's ranks wait for their PMIx environment; a PMIx fence folds up the tree like a PMI
//! fence (each node's data concatenated, handed back whole); abort and the name service go
//! to the root as PMI's do.
//!
//! ```text
//!   start_launched ──Setup, Clients──► host ──Env × ranks──► ranks start
//!   host ──Fence(id, data)──► fold (+ children's PmixFenceIn) ──► PmixFenceIn up
//!   PmixFenceOut down ──► ModexDone(id, every node's data) ──► host
//! ```

use std::collections::HashMap;
use std::os::unix::ffi::OsStrExt;

use pmi_wire::control::{Down, NameAnswer, NameOp, Up};

use super::{Event, Node};
use crate::fence::FenceFold;
use crate::pmix::{self, wire, Command, Host, HostNews};

/// The node's PMIx server and what it waits for.
pub(super) struct Pmix {
    host: Host,
    /// Environments of the launched job's local ranks, by rank, until every one is in.
    envs: HashMap<u32, Vec<Vec<u8>>>,
    /// The ranks are waiting for their environments (the start is held until then).
    holding: bool,
    /// The launched job's PMIx fence: this node's server and each live child subtree.
    fence: FenceFold<Vec<u8>>,
    /// The host's id of the fence this node entered, answered when the fence completes.
    entered: Option<u32>,
    /// Name-service requests at the root, by the host's id: the key a lookup asked for.
    lookups: HashMap<u32, String>,
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

impl Node {
    /// Starts this node's PMIx server if the job serves PMIx, and asks it for the local
    /// ranks' environments. Returns true if the ranks' start must wait for them.
    pub(super) fn start_pmix(&mut self) -> bool {
        let Some(job) = self.job.pmix.as_ref() else { return false };
        let events = self.events.clone();
        let started = Host::start(&self.job.jobid, self.plan.index, &self.plan.host, move |news| {
            events.send(Event::Pmix(news)).is_ok()
        });
        let host = match started {
            Ok(host) => host,
            Err(e) => {
                self.notice(format!("PMIx is not served on this node: {e}"));
                return false;
            }
        };
        host.send(Command::Setup {
            nspace: self.job.jobid.clone(),
            jobid: self.job.jobid.clone(),
            node: self.plan.index,
            hosts: job.hosts.clone(),
            rank_node: job.rank_node.clone(),
            rank_app: job.rank_app.clone(),
            psets: job.psets.clone(),
        });
        let ranks: Vec<u32> = self.plan.ranks.iter().map(|r| r.rank).collect();
        let holding = !ranks.is_empty();
        host.send(Command::Clients {
            uid: nix::unistd::getuid().as_raw(),
            gid: nix::unistd::getgid().as_raw(),
            ranks,
        });
        tracing::debug!(pid = host.pid(), "PMIx host started");
        self.pmix = Some(Pmix {
            host,
            envs: HashMap::new(),
            holding,
            fence: FenceFold::default(),
            entered: None,
            lookups: HashMap::new(),
        });
        holding
    }

    /// The PMIx environment of a local rank of the launched job (empty without PMIx). With
    /// more ranks here than CPUs to run them, Open MPI is told it is oversubscribed, as
    /// mpirun tells it, or its ranks busy-poll each other's CPU away.
    pub(super) fn pmix_env(&mut self, rank: u32) -> Vec<Vec<u8>> {
        let Some(mut vars) = self.pmix.as_mut().and_then(|p| p.envs.remove(&rank)) else {
            return Vec::new();
        };
        let cpus = nix::sched::sched_getaffinity(nix::unistd::Pid::from_raw(0))
            .map(|set| {
                (0..nix::sched::CpuSet::count()).filter(|&c| set.is_set(c) == Ok(true)).count()
            })
            .unwrap_or(1);
        let user_sets = |name: &[u8]| self.job.env.iter().any(|(k, _)| k == name);
        if self.plan.ranks.len() > cpus && !user_sets(OVERSUBSCRIBE) {
            vars.push([OVERSUBSCRIBE, b"=1"].concat());
        }
        let shm = self.pmix.as_ref().and_then(|p| p.host.shm_dir());
        if let Some(dir) = shm.filter(|_| !user_sets(VADER_DIR)) {
            vars.push([VADER_DIR, b"=", dir.as_os_str().as_bytes()].concat());
        }
        // Open MPI 4.1 talks to a PMIx server only when it believes a resource manager it
        // knows started it (otherwise each rank is a singleton with an orted of its own):
        // IBM's jsrun is the one whose mark changes nothing else.
        vars.push(b"JSM_JSRUN_PORT=1".to_vec());
        vars
    }

    pub(super) fn pmix_news(&mut self, news: HostNews) {
        let event = match news {
            HostNews::Event(event) => event,
            HostNews::Gone(why) => {
                // Dropped (its ranks are all done): it went as it should.
                let Some(pmix) = self.pmix.as_ref() else { return };
                let holding = pmix.holding;
                self.notice(format!("the PMIx server of this node ended: {why}"));
                self.pmix = None;
                if holding {
                    self.start_launched_ranks();
                }
                return;
            }
        };
        let Some(pmix) = self.pmix.as_mut() else { return };
        match event {
            pmix::Event::Ready { version } => tracing::debug!(%version, "PMIx server ready"),
            pmix::Event::SetupDone => tracing::debug!("PMIx namespace registered"),
            pmix::Event::Failed { why } => {
                let holding = pmix.holding;
                self.pmix = None;
                self.notice(format!("PMIx is not served on this node: {why}"));
                if holding {
                    self.start_launched_ranks();
                }
            }
            pmix::Event::Env { rank, status, vars } => {
                if status != wire::SUCCESS {
                    tracing::warn!(rank, status, "no PMIx environment for a rank");
                }
                pmix.envs.insert(rank, vars);
                if pmix.holding && pmix.envs.len() == self.plan.ranks.len() {
                    pmix.holding = false;
                    self.start_launched_ranks();
                }
            }
            pmix::Event::Fence { id, collect: _, data } => {
                if let Some(old) = pmix.entered.replace(id) {
                    tracing::warn!(old, id, "a PMIx fence entered twice");
                }
                pmix.fence.arrive([data]);
                self.pmix_fence_step();
            }
            pmix::Event::Dmodex { id, rank } => {
                // The fence collects every rank's data; a request for more has none to find.
                tracing::debug!(rank, "direct modex request");
                let data = Vec::new();
                pmix.host.send(Command::ModexDone { id, status: wire::ERR_NOT_FOUND, data });
            }
            pmix::Event::Abort { id, rank, status, mut msg } => {
                // Open MPI 4.1's MPI_Abort always says "N/A": nothing to print.
                if msg == "N/A" {
                    msg.clear();
                }
                let pid = self.ranks.find(rank).map_or(0, |r| r.pid as u32);
                let _ = self.up.control.send(Up::Abort { rank, pid, code: status, msg });
                pmix.host.send(Command::OpDone { id, status: wire::SUCCESS });
            }
            pmix::Event::Publish { id, rank, mut pairs } => match pairs.len() {
                1 => {
                    let (service, port) = pairs.remove(0);
                    let op = NameOp::Publish { service, port };
                    let _ = self.up.control.send(Up::Name { rank, tag: name_tag(id), op });
                }
                n => {
                    let status = if n == 0 { wire::SUCCESS } else { wire::ERR_NOT_SUPPORTED };
                    pmix.host.send(Command::OpDone { id, status });
                }
            },
            pmix::Event::Unpublish { id, rank, mut keys } => match keys.len() {
                1 => {
                    let op = NameOp::Unpublish { service: keys.remove(0) };
                    let _ = self.up.control.send(Up::Name { rank, tag: name_tag(id), op });
                }
                _ => pmix.host.send(Command::OpDone { id, status: wire::ERR_NOT_SUPPORTED }),
            },
            pmix::Event::Lookup { id, rank, mut keys } => match keys.len() {
                1 => {
                    let service = keys.remove(0);
                    pmix.lookups.insert(id, service.clone());
                    let op = NameOp::Lookup { service };
                    let _ = self.up.control.send(Up::Name { rank, tag: name_tag(id), op });
                }
                _ => {
                    let (status, found) = (wire::ERR_NOT_SUPPORTED, Vec::new());
                    pmix.host.send(Command::LookupDone { id, status, found });
                }
            },
            pmix::Event::Connected { rank } => tracing::debug!(rank, "PMIx client connected"),
            pmix::Event::Finalized { rank } => tracing::debug!(rank, "PMIx client finalized"),
            pmix::Event::Notice { text } => tracing::warn!("PMIx server: {text}"),
        }
    }

    /// A child subtree entered PMIx fence `epoch` with its nodes' data.
    pub(super) fn pmix_child_fence(&mut self, epoch: u64, data: Vec<u8>) {
        let Some(pmix) = self.pmix.as_mut() else {
            // No server here: the subtree's data goes on alone.
            let _ = self.up.control.send(Up::PmixFenceIn { epoch, data });
            return;
        };
        if epoch != pmix.fence.epoch() {
            tracing::warn!(
                epoch,
                expected = pmix.fence.epoch(),
                "PMIx fence entry for another epoch"
            );
        }
        pmix.fence.arrive([data]);
        self.pmix_fence_step();
    }

    fn pmix_fence_step(&mut self) {
        let parties = 1 + self.children.live();
        let Some(pmix) = self.pmix.as_mut() else { return };
        if let Some((epoch, blobs)) = pmix.fence.complete(parties) {
            let _ = self.up.control.send(Up::PmixFenceIn { epoch, data: blobs.concat() });
        }
    }

    /// PMIx fence `epoch` is complete tree-wide.
    pub(super) fn pmix_fence_out(&mut self, epoch: u64, data: Vec<u8>) {
        self.children.broadcast(&Down::PmixFenceOut { epoch, data: data.clone() });
        let Some(pmix) = self.pmix.as_mut() else { return };
        if !pmix.fence.finish(epoch) {
            tracing::warn!(epoch, "PMIx fence completion for another epoch");
        }
        if let Some(id) = pmix.entered.take() {
            pmix.host.send(Command::ModexDone { id, status: wire::SUCCESS, data });
        }
    }

    /// The root's answer to a PMIx name-service request of a local rank.
    pub(super) fn pmix_name_answer(&mut self, id: u32, answer: NameAnswer) {
        let Some(pmix) = self.pmix.as_mut() else { return };
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

    fn notice(&self, text: String) {
        tracing::warn!("{text}");
        let _ = self.up.control.send(Up::Notice { host: self.plan.host.clone(), text });
    }
}

impl Node {
    /// The launched job's ranks wait for their PMIx environments.
    pub(super) fn holding_ranks(&self) -> bool {
        self.pmix.as_ref().is_some_and(|p| p.holding)
    }
}
