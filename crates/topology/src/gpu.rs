//! The GPUs of a node: found on the PCI bus in sysfs (no vendor library), narrowed to what
//! the allocation gave this proxy, and handed to ranks through the vendors' visibility
//! variables. Variables, not cgroups: the ranks of a node still see each other's GPUs for
//! peer IPC, which a per-rank device cgroup (Slurm's `--gpu-bind=closest`) takes away.

use std::fs;
use std::io;
use std::path::Path;

use crate::cpulist;
use crate::sysfs::{invalid, names_in, read_id};

/// The GPU makers rlaunch knows, in the order their variables are set.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Vendor {
    Nvidia,
    Amd,
    Intel,
}

impl Vendor {
    const ALL: [Vendor; 3] = [Vendor::Nvidia, Vendor::Amd, Vendor::Intel];

    fn from_pci(id: i64) -> Option<Vendor> {
        match id {
            0x10de => Some(Vendor::Nvidia),
            0x1002 => Some(Vendor::Amd),
            0x8086 => Some(Vendor::Intel),
            _ => None,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Vendor::Nvidia => "nvidia",
            Vendor::Amd => "amd",
            Vendor::Intel => "intel",
        }
    }

    /// The variable that says which of this maker's GPUs a process sees. AMD's is ROCm's
    /// runtime's, not HIP's: `HIP_VISIBLE_DEVICES` applies on top of it, counting from 0
    /// among what ROCR lets through, so setting both would select twice.
    pub fn var(self) -> &'static str {
        match self {
            Vendor::Nvidia => "CUDA_VISIBLE_DEVICES",
            Vendor::Amd => "ROCR_VISIBLE_DEVICES",
            Vendor::Intel => "ZE_AFFINITY_MASK",
        }
    }

    /// The variable (and value) that makes the runtime number its devices in PCI order, as
    /// rlaunch does; AMD's runtime numbers them in its driver's topology order, which
    /// rlaunch reads ([`Gpu::kfd`]).
    fn order(self) -> Option<(&'static str, &'static str)> {
        match self {
            Vendor::Nvidia => Some(("CUDA_DEVICE_ORDER", "PCI_BUS_ID")),
            Vendor::Amd => None,
            Vendor::Intel => Some(("ZE_ENABLE_PCI_ID_DEVICE_ORDER", "1")),
        }
    }

    /// The value of [`Vendor::var`] that shows a process none of this maker's GPUs.
    fn none(self) -> &'static str {
        match self {
            Vendor::Nvidia => "",
            // ROCR hides every device when its variable is set and empty.
            Vendor::Amd => "",
            // Level Zero reads an empty mask as none at all (every device), and skips the
            // indices past its devices: one no numbering reaches.
            Vendor::Intel => "65535",
        }
    }
}

/// Every variable a job with GPUs sets per rank (so the shared environment leaves them out).
pub const VARS: &[&str] = &[
    "CUDA_VISIBLE_DEVICES",
    "CUDA_DEVICE_ORDER",
    "ROCR_VISIBLE_DEVICES",
    "ZE_AFFINITY_MASK",
    "ZE_ENABLE_PCI_ID_DEVICE_ORDER",
];

/// A GPU on the PCI bus.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Gpu {
    /// Its PCI address: `0000:c1:00.0`.
    pub pci: String,
    pub vendor: Vendor,
    /// Its NUMA node; the kernel's -1 ("no NUMA") is node 0.
    pub numa: u32,
    /// The usable CPUs near it: of its `local_cpulist`, else of its NUMA node.
    pub cpus: Vec<u32>,
    /// Its node in the AMD kernel driver's topology (`/sys/class/kfd/kfd/topology/nodes`),
    /// whose order is the ROCm runtime's device order.
    pub kfd: Option<u32>,
}

/// PCI base classes of GPUs: display controllers (VGA, 3D, other) and processing
/// accelerators.
const DISPLAY: i64 = 0x03;
const ACCELERATOR: i64 = 0x12;

/// The GPUs under `root` (a stand-in for `/`), sorted by PCI address. `usable`: the CPUs this
/// proxy may use; `numa_cpus(n)`: those of NUMA node `n`, for a GPU that does not list its own.
pub(crate) fn read_pci(
    root: &Path,
    usable: &[u32],
    numa_cpus: impl Fn(u32) -> Vec<u32>,
) -> io::Result<Vec<Gpu>> {
    let dir = root.join("sys/bus/pci/devices");
    let kfd = read_kfd(&root.join("sys/class/kfd/kfd/topology/nodes"))?;
    let mut gpus = Vec::new();
    for name in names_in(&dir)? {
        let Some(pci) = name.to_str() else { continue };
        let device = dir.join(pci);
        let class = read_hex(&device.join("class"))?;
        if !matches!(class.map(|c| c >> 16), Some(DISPLAY | ACCELERATOR)) {
            continue;
        }
        let Some(vendor) = read_hex(&device.join("vendor"))?.and_then(Vendor::from_pci) else {
            continue;
        };
        let numa = read_id(&device.join("numa_node"))?.and_then(|n| u32::try_from(n).ok());
        let numa = numa.unwrap_or(0);
        // Its local CPUs, else its NUMA node's; only the usable ones (none: near none of ours).
        let cpus = match fs::read_to_string(device.join("local_cpulist")) {
            Ok(text) => cpulist::parse(&text)
                .ok_or_else(|| invalid(&format!("{pci}/local_cpulist"), "a CPU list", &text))?
                .into_iter()
                .filter(|c| usable.contains(c))
                .collect(),
            Err(_) => numa_cpus(numa),
        };
        let kfd = kfd.iter().find(|(_, at)| at == pci).map(|(node, _)| *node);
        gpus.push(Gpu { pci: pci.to_string(), vendor, numa, cpus, kfd });
    }
    gpus.sort_by(|a, b| a.pci.cmp(&b.pci));
    Ok(gpus)
}

/// The GPU nodes of AMD's kernel driver topology, each with its PCI address: a node's
/// `properties` has `domain` and `location_id` (bus << 8 | device << 3 | function); CPU
/// nodes have a `gpu_id` of 0. Empty without the driver.
fn read_kfd(dir: &Path) -> io::Result<Vec<(u32, String)>> {
    let mut nodes = Vec::new();
    for name in names_in(dir)? {
        let Some(node) = name.to_str().and_then(|n| n.parse::<u32>().ok()) else { continue };
        let at = dir.join(&name);
        if read_id(&at.join("gpu_id"))?.unwrap_or(0) == 0 {
            continue;
        }
        let properties = fs::read_to_string(at.join("properties"))?;
        let property = |key: &str| -> Option<u64> {
            properties
                .lines()
                .find_map(|l| l.strip_prefix(key)?.strip_prefix(' ')?.trim().parse().ok())
        };
        let (Some(domain), Some(location)) = (property("domain"), property("location_id")) else {
            continue;
        };
        let (bus, device, function) = (location >> 8, (location >> 3) & 0x1f, location & 7);
        nodes.push((node, format!("{domain:04x}:{bus:02x}:{device:02x}.{function:x}")));
    }
    Ok(nodes)
}

/// A sysfs number written in hex (`0x10de`); `None` when the file does not exist.
fn read_hex(path: &Path) -> io::Result<Option<i64>> {
    match fs::read_to_string(path) {
        Ok(text) => {
            let digits = text.trim().trim_start_matches("0x");
            i64::from_str_radix(digits, 16)
                .map(Some)
                .map_err(|_| invalid(&path.display().to_string(), "a hex number", &text))
        }
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(e),
    }
}

/// A GPU this proxy's ranks may be given.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Usable {
    pub vendor: Vendor,
    /// What names it in its vendor's variable: an index, or the allocation's own entry
    /// (an index relative to its cgroup, a UUID).
    pub entry: String,
    /// Where it is, when known (an allocation that names GPUs by UUID does not say).
    pub gpu: Option<Gpu>,
}

/// The GPUs of a node that ranks may use, in the order ranks are given them.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Visible {
    pub gpus: Vec<Usable>,
    /// Per vendor, the allocation's own variable narrowed the set (then a rank's variable
    /// is a part of it, and the runtime's device order is the allocation's business).
    narrowed: Vec<Vendor>,
    /// The order variables this proxy was given, passed on where the set was narrowed.
    inherited_order: Vec<(&'static str, String)>,
}

impl Visible {
    /// Of a machine's `gpus`, those that this proxy may hand out: all of them, or, where its
    /// environment (`env`) names some (an allocation's `CUDA_VISIBLE_DEVICES`,
    /// `ROCR_VISIBLE_DEVICES`, `ZE_AFFINITY_MASK`), those. Inside Slurm, `SLURM_JOB_GPUS`
    /// gives the job's GPUs by index on the node even when `CUDA_VISIBLE_DEVICES` counts
    /// from 0 within the job's device cgroup.
    pub fn of(gpus: &[Gpu], env: impl Fn(&str) -> Option<String>) -> Visible {
        let mut visible = Visible::default();
        let job_gpus: Option<Vec<usize>> = env("SLURM_JOB_GPUS").and_then(|list| {
            list.split(',').map(|i| i.trim().parse().ok()).collect::<Option<Vec<_>>>()
        });
        for vendor in Vendor::ALL {
            let mut on_bus: Vec<&Gpu> = gpus.iter().filter(|g| g.vendor == vendor).collect();
            // The runtime's numbering: PCI order, but AMD's follows its driver's topology.
            if vendor == Vendor::Amd {
                on_bus.sort_by_key(|g| (g.kfd.is_none(), g.kfd));
            }
            // Another maker's variable on a node with only this maker's GPUs (Slurm sets
            // every maker's unless told which) names nothing here.
            let given = env(vendor.var()).filter(|_| on_bus.is_empty() == gpus.is_empty());
            let Some(given) = given else {
                visible.gpus.extend(on_bus.iter().enumerate().map(|(i, gpu)| Usable {
                    vendor,
                    entry: i.to_string(),
                    gpu: Some((*gpu).clone()),
                }));
                continue;
            };
            visible.narrowed.push(vendor);
            if let Some((name, _)) = vendor.order() {
                if let Some(value) = env(name) {
                    visible.inherited_order.push((name, value));
                }
            }
            let entries: Vec<&str> =
                given.split(',').map(str::trim).filter(|e| !e.is_empty()).collect();
            // Relative to a device cgroup: as many entries as the job's GPUs, counting from 0.
            let relative = job_gpus.as_ref().filter(|job| {
                job.len() == entries.len()
                    && entries.iter().enumerate().all(|(j, e)| e.parse() == Ok(j))
            });
            for (j, entry) in entries.iter().enumerate() {
                let index = match relative {
                    Some(job) => Some(job[j]),
                    // ZE's `device.subdevice` names a part of its device.
                    None => entry.split('.').next().and_then(|d| d.parse::<usize>().ok()),
                };
                let gpu = index.and_then(|i| on_bus.get(i)).map(|g| (*g).clone());
                visible.gpus.push(Usable { vendor, entry: entry.to_string(), gpu });
            }
        }
        visible
    }

    /// The variables of a rank given `chosen` (indexes into [`Visible::gpus`]): for every
    /// maker with GPUs here, the ones it sees, in order; none at all is said explicitly.
    pub fn vars(&self, chosen: &[usize]) -> Vec<(&'static str, String)> {
        let mut vars = Vec::new();
        for vendor in Vendor::ALL {
            if !self.gpus.iter().any(|g| g.vendor == vendor) && !self.narrowed.contains(&vendor) {
                continue;
            }
            let entries: Vec<&str> = chosen
                .iter()
                .map(|&i| &self.gpus[i])
                .filter(|g| g.vendor == vendor)
                .map(|g| g.entry.as_str())
                .collect();
            let value =
                if entries.is_empty() { vendor.none().to_string() } else { entries.join(",") };
            vars.push((vendor.var(), value));
            if let Some((name, value)) = vendor.order() {
                if !self.narrowed.contains(&vendor) {
                    vars.push((name, value.to_string()));
                } else if let Some((_, value)) =
                    self.inherited_order.iter().find(|(n, _)| *n == name)
                {
                    vars.push((name, value.clone()));
                }
            }
        }
        vars
    }
}
