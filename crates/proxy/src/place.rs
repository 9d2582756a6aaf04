//! This node's part of `--map-by`, `--bind-to` and `--gpus-per-rank`: the node's shape is
//! read once (rlaunch-topology), the first time a job asks, and each job's batch of local
//! ranks is placed at once ([`rlaunch_topology::place`]). A job that asks none of them
//! reads nothing.

use nix::sched::CpuSet;
use rlaunch_protocol::control::Job;
use rlaunch_protocol::record::GpuUse;
use rlaunch_topology::gpu::Visible;
use rlaunch_topology::place::{GpuAsk, Request};
use rlaunch_topology::{cpulist, Machine};

/// The CPUs one rank is bound to: as the kernel takes them and as people read them.
pub(crate) struct RankCpus {
    /// A `libc::cpu_set_t` (`CpuSet` is a transparent wrapper), built before the fork so that
    /// the child only makes the syscall; `None` when the topology is a stand-in's
    /// ([`rlaunch_topology::ROOT_VAR`]), whose CPUs are not this machine's.
    pub(crate) mask: Option<CpuSet>,
    /// The same CPUs as a cpulist, for `--report-bindings` and the report.
    pub(crate) list: String,
}

impl RankCpus {
    fn new(cpus: &[u32], apply: bool) -> RankCpus {
        let mask = apply.then(|| {
            let mut mask = CpuSet::new();
            for &cpu in cpus {
                // Only CPUs the affinity mask could name get here, so this cannot fail.
                let _ = mask.set(cpu as usize);
            }
            mask
        });
        RankCpus { mask, list: cpulist::format(cpus) }
    }
}

/// `count` ranks placed nowhere in particular: not bound, no GPUs.
fn unplaced(count: usize) -> Vec<RankPlace> {
    (0..count).map(|_| RankPlace::default()).collect()
}

/// Where one local rank goes.
#[derive(Default)]
pub(crate) struct RankPlace {
    /// `None`: not bound.
    pub(crate) cpus: Option<RankCpus>,
    /// `None`: the job asks for no GPUs; else the ones it got (maybe none).
    pub(crate) gpus: Option<Vec<GpuUse>>,
    /// The GPU visibility variables it starts with.
    pub(crate) vars: Vec<(&'static str, String)>,
}

/// This node's shape, read the first time a job asks for a placement.
pub(crate) struct Placer {
    /// The node's name in the launcher's host list, for notices.
    host: String,
    /// `None` until needed; `Err` when it cannot be read. Read with GPUs once a job asks.
    machine: Option<Result<Machine, String>>,
    with_gpus: bool,
    /// The GPUs this proxy may hand out, from the machine and the allocation's variables.
    visible: Visible,
    /// Every notice given so far: each goes out once.
    told: std::collections::HashSet<String>,
    /// Notices not yet sent to the launcher.
    notices: Vec<String>,
}

impl Placer {
    pub(crate) fn new(host: String) -> Placer {
        Placer {
            host,
            machine: None,
            with_gpus: false,
            visible: Visible::default(),
            told: Default::default(),
            notices: Vec::new(),
        }
    }

    /// Notices for the user, to send to the launcher (which prints them, whatever host this
    /// is: over ssh a proxy's stderr is not the user's). Each goes out once per proxy.
    pub(crate) fn take_notices(&mut self) -> Vec<String> {
        std::mem::take(&mut self.notices)
    }

    /// The places of a batch of `job`'s local ranks, one per entry of `segments` (each
    /// rank's segment). `shared`: other nodes of the job run on this machine too (fake
    /// nodes), so its cores are not this node's to spread its ranks over. `Err`: why they do
    /// not fit on this node.
    pub(crate) fn place(
        &mut self,
        job: &Job,
        segments: &[u32],
        shared: bool,
    ) -> Result<Vec<RankPlace>, String> {
        let count = segments.len();
        // One rank's share is every core: nothing to bind.
        let spread = job.spread && !shared && count > 1;
        if job.mapping.is_none() && job.binding.is_none() && job.gpus.is_none() && !spread {
            return Ok(unplaced(count));
        }
        let gpus = job.gpus.is_some();
        if self.machine.is_none() || (gpus && !self.with_gpus) {
            self.machine = Some(Machine::of_this_process(gpus));
            self.with_gpus = gpus;
            if let Some(Ok(machine)) = &self.machine {
                self.visible = Visible::of(&machine.gpus, |name| std::env::var(name).ok());
                tracing::debug!(
                    cpus = machine.cpus().len(),
                    gpus = self.visible.gpus.len(),
                    "topology read"
                );
            }
        }
        let machine = match self.machine.as_ref().expect("read above") {
            Ok(machine) => machine,
            Err(why) if gpus => return Err(format!("{why}: cannot give its ranks GPUs")),
            Err(why) => {
                // Said only to one who asked for a binding, not of the spread no one asked for.
                if job.binding.is_some() || job.mapping.is_some() {
                    self.tell(format!("{why}: ranks are not bound"));
                }
                return Ok(unplaced(count));
            }
        };
        let per_rank: Vec<u32> = match &job.gpus {
            Some(g) => {
                segments.iter().map(|&s| g.per_rank.get(s as usize).copied().unwrap_or(0)).collect()
            }
            None => Vec::new(),
        };
        let request = Request {
            mapping: job.mapping,
            binding: job.binding,
            spread,
            gpus: job.gpus.as_ref().map(|g| GpuAsk {
                per_rank: &per_rank,
                bind: &g.bind,
                share: g.share,
                visible: &self.visible,
            }),
        };
        let placed = rlaunch_topology::place(machine, &request, count)?;
        let apply = !machine.stand_in;
        let places = placed
            .places
            .iter()
            .map(|p| RankPlace {
                cpus: p.cpus.as_deref().map(|cpus| RankCpus::new(cpus, apply)),
                gpus: gpus.then(|| p.gpus.iter().map(|&g| self.gpu_use(g)).collect()),
                vars: if gpus { self.visible.vars(&p.gpus) } else { Vec::new() },
            })
            .collect();
        placed.notices.into_iter().for_each(|notice| self.tell(notice));
        Ok(places)
    }

    /// GPU `index` of [`Placer::visible`], as the launcher reports it.
    fn gpu_use(&self, index: usize) -> GpuUse {
        let usable = &self.visible.gpus[index];
        GpuUse {
            entry: usable.entry.clone(),
            vendor: usable.vendor.name().to_string(),
            pci: usable.gpu.as_ref().map(|g| g.pci.clone()),
            numa: usable.gpu.as_ref().map(|g| g.numa),
        }
    }

    /// Queues `notice` for the launcher, unless it was given already.
    fn tell(&mut self, notice: String) {
        if self.told.insert(notice.clone()) {
            tracing::debug!(host = %self.host, "placement notice: {notice}");
            self.notices.push(notice);
        }
    }
}
