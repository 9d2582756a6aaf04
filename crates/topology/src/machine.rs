//! Reading a node's shape from sysfs: its CPUs (with their core, L3 cache, NUMA node and
//! socket) and the GPUs on its PCI bus.

use std::collections::HashMap;
use std::fs;
use std::io;
use std::path::{Path, PathBuf};

use nix::sched::CpuSet;
use nix::unistd::Pid;
use rlaunch_protocol::control::CpuUnit;

use crate::cpulist;
use crate::gpu::{self, Gpu};
use crate::sysfs::{cut, invalid, names_in, read_id};

/// A directory that stands for `/` when rlaunch reads a node's shape: it reads
/// `$RLAUNCH_TOPOLOGY_ROOT/sys/devices/system/...` and `.../sys/bus/pci/devices/...` instead
/// of the machine's own, and takes the CPUs it may use from
/// `sys/fs/cgroup/cpuset.cpus.effective` there (all online CPUs without it). A copy of
/// another machine binds nothing here: its CPUs are not this machine's. For tests, and for
/// trying a placement on a machine one does not have.
pub const ROOT_VAR: &str = "RLAUNCH_TOPOLOGY_ROOT";

/// One CPU this proxy may use.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Cpu {
    pub id: u32,
    /// `physical_package_id`; some platforms say -1 when they do not know.
    pub socket: i64,
    /// `core_id`: unique within its socket only.
    pub core: i64,
    /// The first CPU of the L3 cache it shares; without cache files, `-1 - socket` (one L3 a
    /// socket).
    pub l3: i64,
    pub numa: u32,
}

/// A node as rlaunch places ranks on it.
#[derive(Debug, Clone, PartialEq)]
pub struct Machine {
    /// The CPUs this proxy may use, sorted by (socket, core, id): the order objects are
    /// handed out in.
    cpus: Vec<Cpu>,
    /// The GPUs on the PCI bus, sorted by PCI address; empty unless asked for.
    pub gpus: Vec<Gpu>,
    /// Read from [`ROOT_VAR`]'s copy, not from this machine.
    pub stand_in: bool,
}

impl Machine {
    /// This node as this process sees it: the CPUs it may run on (a cgroup cpuset or taskset
    /// narrows them) and, if `gpus`, the GPUs. Reads [`ROOT_VAR`]'s copy if it is set.
    pub fn of_this_process(gpus: bool) -> Result<Machine, String> {
        if let Some(root) = std::env::var_os(ROOT_VAR).filter(|r| !r.is_empty()) {
            let root = PathBuf::from(root);
            let cpuset = root.join("sys/fs/cgroup/cpuset.cpus.effective");
            let allowed = match fs::read_to_string(&cpuset) {
                Ok(text) => Some(cpulist::parse(&text).ok_or_else(|| {
                    format!("{} is not a CPU list: {:?}", cpuset.display(), cut(&text))
                })?),
                Err(_) => None,
            };
            let mut machine = Machine::read(&root, allowed.as_deref(), gpus)
                .map_err(|e| format!("cannot read the topology under {}: {e}", root.display()))?;
            machine.stand_in = true;
            return Ok(machine);
        }
        let allowed = nix::sched::sched_getaffinity(Pid::from_raw(0))
            .map_err(|e| format!("cannot read the CPUs this proxy may use: {}", e.desc()))?;
        let allowed: Vec<u32> = (0..CpuSet::count())
            .filter(|&i| allowed.is_set(i).unwrap_or(false))
            .map(|i| i as u32)
            .collect();
        Machine::read(Path::new("/"), Some(&allowed), gpus)
            .map_err(|e| format!("cannot read this machine's topology under /sys: {e}"))
    }

    /// Reads the machine under `root` (a stand-in for `/`), keeping the online CPUs of
    /// `allowed` (every online CPU if `None`), and its GPUs if `gpus`.
    pub fn read(root: &Path, allowed: Option<&[u32]>, gpus: bool) -> io::Result<Machine> {
        let system = root.join("sys/devices/system");
        let online = match fs::read_to_string(system.join("cpu/online")) {
            Ok(text) => Some(
                cpulist::parse(&text).ok_or_else(|| invalid("cpu/online", "a CPU list", &text))?,
            ),
            // Without the file, trust the affinity mask: the kernel only sets online CPUs.
            Err(e) if e.kind() == io::ErrorKind::NotFound => None,
            Err(e) => return Err(e),
        };
        let candidates: Vec<u32> = match (allowed, &online) {
            (Some(allowed), _) => allowed.to_vec(),
            (None, Some(online)) => online.clone(),
            (None, None) => return Err(invalid("cpu/online", "there", "")),
        };
        let nodes = read_numa_nodes(&system.join("node"))?;
        let mut cpus = Vec::new();
        for id in candidates {
            if online.as_ref().is_some_and(|o| !o.contains(&id)) {
                continue;
            }
            let dir = system.join(format!("cpu/cpu{id}"));
            // A CPU without topology files (some virtual machines) is a core of its own.
            let socket = read_id(&dir.join("topology/physical_package_id"))?.unwrap_or(0);
            let core = read_id(&dir.join("topology/core_id"))?.unwrap_or(i64::from(id));
            let l3 = read_l3(&dir.join("cache"))?.unwrap_or(-1 - socket);
            let numa = nodes.iter().find(|(_, cpus)| cpus.contains(&id)).map_or(0, |(n, _)| *n);
            cpus.push(Cpu { id, socket, core, l3, numa });
        }
        if cpus.is_empty() {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                "none of the CPUs this proxy may use is online",
            ));
        }
        cpus.sort_by_key(|c| (c.socket, c.core, c.id));
        let mut machine = Machine { cpus, gpus: Vec::new(), stand_in: false };
        if gpus {
            let numa_cpus = |numa| machine.numa_cpus(numa);
            machine.gpus = gpu::read_pci(root, &machine.cpu_ids(), numa_cpus)?;
        }
        Ok(machine)
    }

    /// The CPUs, sorted by (socket, core, id).
    pub fn cpus(&self) -> &[Cpu] {
        &self.cpus
    }

    /// Every usable CPU's id, sorted.
    pub fn cpu_ids(&self) -> Vec<u32> {
        let mut ids: Vec<u32> = self.cpus.iter().map(|c| c.id).collect();
        ids.sort_unstable();
        ids
    }

    /// The usable CPUs of NUMA node `numa`, sorted.
    pub fn numa_cpus(&self, numa: u32) -> Vec<u32> {
        let mut ids: Vec<u32> = self.cpus.iter().filter(|c| c.numa == numa).map(|c| c.id).collect();
        ids.sort_unstable();
        ids
    }

    /// The objects of `unit`, each as its CPUs (sorted), ordered by (socket, core, first
    /// cpu): the order in which ranks are given them.
    pub fn objects(&self, unit: CpuUnit) -> Vec<Vec<u32>> {
        let key = |c: &Cpu| match unit {
            CpuUnit::Hwthread => (0, i64::from(c.id)),
            CpuUnit::Core => (c.socket, c.core),
            CpuUnit::L3 => (c.socket, c.l3),
            CpuUnit::Numa => (0, i64::from(c.numa)),
            CpuUnit::Socket => (c.socket, 0),
        };
        let mut index = HashMap::new();
        let mut objects: Vec<Vec<u32>> = Vec::new();
        // The CPUs are sorted, so each object first shows up at its (socket, core, first cpu).
        for cpu in &self.cpus {
            let at = *index.entry(key(cpu)).or_insert_with(|| {
                objects.push(Vec::new());
                objects.len() - 1
            });
            objects[at].push(cpu.id);
        }
        objects.iter_mut().for_each(|cpus| cpus.sort_unstable());
        objects
    }
}

/// `node/nodeM/cpulist` for every NUMA node; empty when the kernel has no NUMA support
/// (every CPU is then on node 0).
fn read_numa_nodes(dir: &Path) -> io::Result<Vec<(u32, Vec<u32>)>> {
    let mut nodes = Vec::new();
    for name in names_in(dir)? {
        let Some(node) = name.to_str().and_then(|n| n.strip_prefix("node")?.parse().ok()) else {
            continue;
        };
        let text = fs::read_to_string(dir.join(&name).join("cpulist"))?;
        let cpus = cpulist::parse(&text).ok_or_else(|| {
            invalid(&format!("node/{}/cpulist", name.to_string_lossy()), "a CPU list", &text)
        })?;
        nodes.push((node, cpus));
    }
    Ok(nodes)
}

/// The first CPU sharing this CPU's L3 cache (`cache/indexN` whose `level` is 3; x86 puts
/// it at index3), or `None` without cache files.
fn read_l3(cache: &Path) -> io::Result<Option<i64>> {
    for index in [3, 0, 1, 2, 4, 5] {
        let dir = cache.join(format!("index{index}"));
        match read_id(&dir.join("level"))? {
            Some(3) => {}
            Some(_) => continue,
            None if index == 3 => continue,
            None => return Ok(None),
        }
        let path = dir.join("shared_cpu_list");
        let text = fs::read_to_string(&path)?;
        let cpus = cpulist::parse(&text)
            .ok_or_else(|| invalid(&path.display().to_string(), "a CPU list", &text))?;
        return Ok(cpus.first().map(|&c| i64::from(c)));
    }
    Ok(None)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fake::FakeSys;

    fn all(n: u32) -> Vec<u32> {
        (0..n).collect()
    }

    #[test]
    fn objects_of_each_unit_follow_socket_then_core() {
        let sys = FakeSys::two_by_two_by_two();
        let machine = sys.read(Some(&all(8)));
        assert_eq!(
            machine.objects(CpuUnit::Hwthread),
            [[0], [4], [1], [5], [2], [6], [3], [7]].map(Vec::from)
        );
        let cores = [[0, 4], [1, 5], [2, 6], [3, 7]].map(Vec::from);
        assert_eq!(machine.objects(CpuUnit::Core), cores);
        let sockets = [[0, 1, 4, 5], [2, 3, 6, 7]].map(Vec::from);
        assert_eq!(machine.objects(CpuUnit::Socket), sockets);
        assert_eq!(machine.objects(CpuUnit::Numa), sockets);
        // No cache files: one L3 a socket.
        assert_eq!(machine.objects(CpuUnit::L3), sockets);
    }

    #[test]
    fn only_allowed_cpus_count() {
        let sys = FakeSys::two_by_two_by_two();
        // As under `taskset -c 1-3,5,6`: core 0 of socket 0 is not ours at all.
        let machine = sys.read(Some(&[1, 2, 3, 5, 6]));
        assert_eq!(machine.objects(CpuUnit::Core), [vec![1, 5], vec![2, 6], vec![3]]);
        assert_eq!(machine.objects(CpuUnit::Socket), [vec![1, 5], vec![2, 3, 6]]);
        assert_eq!(machine.objects(CpuUnit::Hwthread).len(), 5);
    }

    #[test]
    fn offline_cpus_are_left_out() {
        let sys = FakeSys::new(&[(0, 0, 0), (1, 0, 1), (2, 0, 2)], "0,2", None);
        assert_eq!(sys.read(Some(&all(3))).objects(CpuUnit::Core), [vec![0], vec![2]]);
        assert_eq!(sys.read(None).objects(CpuUnit::Core), [vec![0], vec![2]]);
    }

    #[test]
    fn without_numa_every_cpu_is_on_node_zero() {
        let sys = FakeSys::new(&[(0, 0, 0), (1, 1, 0)], "0-1", None);
        let machine = sys.read(Some(&all(2)));
        assert_eq!(machine.objects(CpuUnit::Numa), [vec![0, 1]]);
        assert_eq!(machine.objects(CpuUnit::Socket), [vec![0], vec![1]]);
    }

    #[test]
    fn core_ids_repeat_across_sockets_and_may_have_gaps() {
        // Real machines number cores 0,1,2,4,8,... within each socket.
        let sys = FakeSys::new(&[(0, 1, 4), (1, 0, 4), (2, 0, 0), (3, 1, 0)], "0-3", None);
        let cores = sys.read(Some(&all(4))).objects(CpuUnit::Core);
        assert_eq!(cores, [vec![2], vec![1], vec![3], vec![0]]);
    }

    #[test]
    fn missing_topology_files_make_each_cpu_a_core() {
        let sys = FakeSys::new(&[], "0-1", None);
        let machine = sys.read(Some(&all(2)));
        assert_eq!(machine.objects(CpuUnit::Core), [vec![0], vec![1]]);
        assert_eq!(machine.objects(CpuUnit::Socket), [vec![0, 1]]);
    }

    #[test]
    fn no_usable_cpu_is_an_error() {
        let sys = FakeSys::new(&[(0, 0, 0)], "0", None);
        assert!(Machine::read(&sys.0, Some(&[5]), false).is_err());
    }
}
