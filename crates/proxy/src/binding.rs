//! CPU binding of ranks (`--bind-to`): the node's CPU topology as the kernel shows it under
//! /sys, and which CPUs each local rank gets. No hwloc: for hardware threads, cores, sockets
//! and NUMA nodes the sysfs files say all we need.
//!
//! ```text
//!  sched_getaffinity(0)  (what a cgroup cpuset or taskset lets this proxy use)
//!  cpu/online, cpu/cpuN/topology/{core_id,physical_package_id}, node/nodeM/cpulist
//!        │
//!        ▼
//!  Topology: the allowed online CPUs, each with its core, socket and NUMA node
//!        │ objects(unit): ordered by (socket, core, first cpu)
//!        ▼
//!  local rank i of Binding { unit, count }: objects [i*count, i*count+count) mod their number
//!        │
//!        ▼
//!  RankCpus: a cpu_set_t for sched_setaffinity in the child, a cpulist for the launcher
//! ```
//!
//! [`Binder`] is what the node holds: it reads the topology the first time a rank needs it.

use std::collections::HashMap;
use std::fs;
use std::io;
use std::path::Path;

use nix::sched::CpuSet;
use nix::unistd::Pid;
use pmi_wire::control::{Binding, CpuUnit};

/// Where the kernel describes the CPUs (`cpu/`) and NUMA nodes (`node/`).
const SYSFS: &str = "/sys/devices/system";

/// One CPU this proxy may use.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Cpu {
    id: u32,
    /// `physical_package_id`; some platforms say -1 when they do not know.
    socket: i64,
    /// `core_id`: unique within its socket only.
    core: i64,
    numa: u32,
}

/// The CPUs this proxy may use, with where each sits.
#[derive(Debug)]
pub(crate) struct Topology {
    /// Sorted by (socket, core, id): the order objects are handed out in.
    cpus: Vec<Cpu>,
}

impl Topology {
    /// The topology of this machine, restricted to the CPUs this process may run on.
    fn of_this_process() -> Result<Topology, String> {
        let allowed = nix::sched::sched_getaffinity(Pid::from_raw(0))
            .map_err(|e| format!("cannot read the CPUs this proxy may use: {}", e.desc()))?;
        let allowed: Vec<u32> = (0..CpuSet::count())
            .filter(|&i| allowed.is_set(i).unwrap_or(false))
            .map(|i| i as u32)
            .collect();
        Topology::read(Path::new(SYSFS), &allowed)
            .map_err(|e| format!("cannot read the CPU topology under {SYSFS}: {e}"))
    }

    /// Reads the topology under `root` (a stand-in for /sys/devices/system), keeping the
    /// online CPUs of `allowed`.
    pub(crate) fn read(root: &Path, allowed: &[u32]) -> io::Result<Topology> {
        let online = match fs::read_to_string(root.join("cpu/online")) {
            Ok(text) => Some(
                parse_cpulist(&text).ok_or_else(|| invalid("cpu/online", "a CPU list", &text))?,
            ),
            // Without the file, trust the affinity mask: the kernel only sets online CPUs.
            Err(e) if e.kind() == io::ErrorKind::NotFound => None,
            Err(e) => return Err(e),
        };
        let nodes = read_numa_nodes(&root.join("node"))?;
        let mut cpus = Vec::new();
        for &id in allowed {
            if online.as_ref().is_some_and(|o| !o.contains(&id)) {
                continue;
            }
            let dir = root.join(format!("cpu/cpu{id}/topology"));
            // A CPU without topology files (some virtual machines) is a core of its own.
            let socket = read_id(&dir.join("physical_package_id"))?.unwrap_or(0);
            let core = read_id(&dir.join("core_id"))?.unwrap_or(i64::from(id));
            let numa = nodes.iter().find(|(_, cpus)| cpus.contains(&id)).map_or(0, |(n, _)| *n);
            cpus.push(Cpu { id, socket, core, numa });
        }
        if cpus.is_empty() {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                "none of the CPUs this proxy may use is online",
            ));
        }
        cpus.sort_by_key(|c| (c.socket, c.core, c.id));
        Ok(Topology { cpus })
    }

    /// The objects of `unit`, each as its CPUs, ordered by (socket, core, first cpu).
    pub(crate) fn objects(&self, unit: CpuUnit) -> Vec<Vec<u32>> {
        let key = |c: &Cpu| match unit {
            CpuUnit::Hwthread => (0, i64::from(c.id)),
            CpuUnit::Core => (c.socket, c.core),
            CpuUnit::Socket => (c.socket, 0),
            CpuUnit::Numa => (0, i64::from(c.numa)),
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
    let entries = match fs::read_dir(dir) {
        Ok(entries) => entries,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(e),
    };
    let mut nodes = Vec::new();
    for entry in entries {
        let name = entry?.file_name();
        let Some(node) = name.to_str().and_then(|n| n.strip_prefix("node")?.parse().ok()) else {
            continue;
        };
        let text = fs::read_to_string(dir.join(&name).join("cpulist"))?;
        let cpus = parse_cpulist(&text).ok_or_else(|| {
            invalid(&format!("node/{}/cpulist", name.to_string_lossy()), "a CPU list", &text)
        })?;
        nodes.push((node, cpus));
    }
    Ok(nodes)
}

/// A number in a sysfs file; `None` when the file does not exist.
fn read_id(path: &Path) -> io::Result<Option<i64>> {
    match fs::read_to_string(path) {
        Ok(text) => text
            .trim()
            .parse()
            .map(Some)
            .map_err(|_| invalid(&path.display().to_string(), "a number", &text)),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(e),
    }
}

fn invalid(what: &str, expected: &str, text: &str) -> io::Error {
    let msg = format!("{what} is not {expected}: {:?}", text.trim());
    io::Error::new(io::ErrorKind::InvalidData, msg)
}

/// Parses a Linux cpulist (`0-3,8,10-11`; empty for none).
pub(crate) fn parse_cpulist(text: &str) -> Option<Vec<u32>> {
    let mut cpus = Vec::new();
    for part in text.trim().split(',').filter(|p| !p.is_empty()) {
        match part.split_once('-') {
            Some((a, b)) => {
                let (a, b): (u32, u32) = (a.parse().ok()?, b.parse().ok()?);
                if a > b {
                    return None;
                }
                cpus.extend(a..=b);
            }
            None => cpus.push(part.parse().ok()?),
        }
    }
    cpus.sort_unstable();
    cpus.dedup();
    Some(cpus)
}

/// Formats CPU ids as a Linux cpulist: `0-3,8,10-11`.
pub(crate) fn format_cpulist(cpus: &[u32]) -> String {
    let mut sorted = cpus.to_vec();
    sorted.sort_unstable();
    sorted.dedup();
    let mut out = String::new();
    let mut i = 0;
    while i < sorted.len() {
        let start = sorted[i];
        while i + 1 < sorted.len() && sorted[i + 1] == sorted[i] + 1 {
            i += 1;
        }
        if !out.is_empty() {
            out.push(',');
        }
        if sorted[i] == start {
            out.push_str(&start.to_string());
        } else {
            out.push_str(&format!("{start}-{}", sorted[i]));
        }
        i += 1;
    }
    out
}

/// The CPUs of local rank `local`: `count` objects from its position on, wrapping around.
pub(crate) fn rank_cpus(objects: &[Vec<u32>], count: u32, local: usize) -> Vec<u32> {
    let n = objects.len();
    if n == 0 {
        return Vec::new();
    }
    // A count past the number of objects takes them all; reduce first so nothing overflows.
    let count = (count.max(1) as usize).min(n);
    let start = ((local % n) * count) % n;
    let mut cpus: Vec<u32> = (0..count).flat_map(|j| &objects[(start + j) % n]).copied().collect();
    cpus.sort_unstable();
    cpus
}

/// The CPUs one rank is bound to: as the kernel takes them and as people read them.
pub(crate) struct RankCpus {
    /// A `libc::cpu_set_t` (`CpuSet` is a transparent wrapper), built before the fork so that
    /// the child only makes the syscall.
    pub(crate) mask: CpuSet,
    /// The same CPUs as a cpulist, for `--report-bindings`.
    pub(crate) list: String,
}

impl RankCpus {
    fn new(cpus: &[u32]) -> RankCpus {
        let mut mask = CpuSet::new();
        for &cpu in cpus {
            // Only CPUs the affinity mask could name get here, so this cannot fail.
            let _ = mask.set(cpu as usize);
        }
        RankCpus { mask, list: format_cpulist(cpus) }
    }
}

/// What [`Binder`] has told the user already: each notice goes out once per proxy.
#[derive(Default)]
struct Told {
    unreadable: bool,
    wraps: bool,
}

/// This node's binding state: the topology, read the first time a rank is bound.
pub(crate) struct Binder {
    /// The node's name in the launcher's host list, for notices.
    host: String,
    /// `None` until a rank needs it; `Err` when this machine's topology cannot be read.
    topology: Option<Result<Topology, String>>,
    /// The objects of each unit asked for so far: every rank of a job asks for the same.
    objects: Vec<(CpuUnit, Vec<Vec<u32>>)>,
    told: Told,
    /// Notices not yet sent to the launcher.
    notices: Vec<String>,
}

impl Binder {
    pub(crate) fn new(host: String) -> Binder {
        Binder {
            host,
            topology: None,
            objects: Vec::new(),
            told: Told::default(),
            notices: Vec::new(),
        }
    }

    /// Notices for the user, to send to the launcher (which prints them, whatever host this
    /// is: over ssh a proxy's stderr is not the user's).
    pub(crate) fn take_notices(&mut self) -> Vec<String> {
        std::mem::take(&mut self.notices)
    }

    /// The CPUs of local rank `local` of a job with `local_count` ranks on this node, or
    /// `None` when this node cannot bind (the user has been told why).
    pub(crate) fn cpus(
        &mut self,
        binding: Binding,
        local: usize,
        local_count: usize,
    ) -> Option<RankCpus> {
        let topology = self.topology.get_or_insert_with(Topology::of_this_process);
        let topology = match topology {
            Ok(topology) => topology,
            Err(why) => {
                if !std::mem::replace(&mut self.told.unreadable, true) {
                    let why = why.clone();
                    self.notice(&format!("{why}: ranks are not bound"));
                }
                return None;
            }
        };
        let cached = self.objects.iter().position(|(unit, _)| *unit == binding.unit);
        let at = cached.unwrap_or_else(|| {
            self.objects.push((binding.unit, topology.objects(binding.unit)));
            self.objects.len() - 1
        });
        let objects = &self.objects[at].1;
        let cpus = RankCpus::new(&rank_cpus(objects, binding.count, local));
        let here_count = objects.len() as u64;
        let count = u64::from(binding.count.max(1));
        let wraps = local_count as u64 * count > here_count;
        if wraps && !std::mem::replace(&mut self.told.wraps, true) {
            let ranks = plural(local_count as u64, ("rank", "ranks"));
            let (each, here) = (
                plural(count, unit_name(binding.unit)),
                plural(here_count, unit_name(binding.unit)),
            );
            self.notice(&format!("{ranks} x {each} but only {here} here: bindings wrap around"));
        }
        Some(cpus)
    }

    fn notice(&mut self, what: &str) {
        tracing::debug!(host = %self.host, "binding notice: {what}");
        self.notices.push(what.to_string());
    }
}

fn unit_name(unit: CpuUnit) -> (&'static str, &'static str) {
    match unit {
        CpuUnit::Hwthread => ("hwthread", "hwthreads"),
        CpuUnit::Core => ("core", "cores"),
        CpuUnit::Socket => ("socket", "sockets"),
        CpuUnit::Numa => ("NUMA node", "NUMA nodes"),
    }
}

fn plural(n: u64, (one, many): (&str, &str)) -> String {
    format!("{n} {}", if n == 1 { one } else { many })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::PathBuf;

    /// A fake /sys/devices/system in a temporary directory, removed on drop.
    struct FakeSys(PathBuf);

    impl FakeSys {
        /// `cpus`: (id, socket, core); `nodes`: each NUMA node's cpulist, or `None` for a
        /// kernel without NUMA.
        fn new(cpus: &[(u32, i64, i64)], online: &str, nodes: Option<&[&str]>) -> FakeSys {
            use std::sync::atomic::{AtomicU32, Ordering};
            static NEXT: AtomicU32 = AtomicU32::new(0);
            let root = std::env::temp_dir().join(format!(
                "rlaunch-binding-{}-{}",
                std::process::id(),
                NEXT.fetch_add(1, Ordering::Relaxed)
            ));
            let write = |path: &str, text: &str| {
                let path = root.join(path);
                fs::create_dir_all(path.parent().unwrap()).unwrap();
                fs::write(path, format!("{text}\n")).unwrap();
            };
            write("cpu/online", online);
            for &(id, socket, core) in cpus {
                write(&format!("cpu/cpu{id}/topology/physical_package_id"), &socket.to_string());
                write(&format!("cpu/cpu{id}/topology/core_id"), &core.to_string());
            }
            if let Some(nodes) = nodes {
                for (i, list) in nodes.iter().enumerate() {
                    write(&format!("node/node{i}/cpulist"), list);
                }
                write("node/online", &format!("0-{}", nodes.len() - 1));
            }
            FakeSys(root)
        }

        /// Two sockets x two cores x two hardware threads, numbered as Linux does on x86:
        /// the first thread of every core first (0-3), then their siblings (4-7).
        fn two_by_two_by_two() -> FakeSys {
            let cpus = [
                (0, 0, 0),
                (1, 0, 1),
                (2, 1, 0),
                (3, 1, 1),
                (4, 0, 0),
                (5, 0, 1),
                (6, 1, 0),
                (7, 1, 1),
            ];
            FakeSys::new(&cpus, "0-7", Some(&["0-1,4-5", "2-3,6-7"]))
        }

        fn read(&self, allowed: &[u32]) -> Topology {
            Topology::read(&self.0, allowed).unwrap()
        }
    }

    impl Drop for FakeSys {
        fn drop(&mut self) {
            let _ = fs::remove_dir_all(&self.0);
        }
    }

    fn all(n: u32) -> Vec<u32> {
        (0..n).collect()
    }

    #[test]
    fn objects_of_each_unit_follow_socket_then_core() {
        let sys = FakeSys::two_by_two_by_two();
        let topo = sys.read(&all(8));
        assert_eq!(
            topo.objects(CpuUnit::Hwthread),
            [[0], [4], [1], [5], [2], [6], [3], [7]].map(Vec::from)
        );
        assert_eq!(topo.objects(CpuUnit::Core), [[0, 4], [1, 5], [2, 6], [3, 7]].map(Vec::from));
        assert_eq!(topo.objects(CpuUnit::Socket), [[0, 1, 4, 5], [2, 3, 6, 7]].map(Vec::from));
        assert_eq!(topo.objects(CpuUnit::Numa), [[0, 1, 4, 5], [2, 3, 6, 7]].map(Vec::from));
    }

    #[test]
    fn only_allowed_cpus_count() {
        let sys = FakeSys::two_by_two_by_two();
        // As under `taskset -c 1-3,5,6`: core 0 of socket 0 is not ours at all.
        let topo = sys.read(&[1, 2, 3, 5, 6]);
        assert_eq!(topo.objects(CpuUnit::Core), [vec![1, 5], vec![2, 6], vec![3]]);
        assert_eq!(topo.objects(CpuUnit::Socket), [vec![1, 5], vec![2, 3, 6]]);
        assert_eq!(topo.objects(CpuUnit::Hwthread).len(), 5);
    }

    #[test]
    fn offline_cpus_are_left_out() {
        let sys = FakeSys::new(&[(0, 0, 0), (1, 0, 1), (2, 0, 2)], "0,2", None);
        assert_eq!(sys.read(&all(3)).objects(CpuUnit::Core), [vec![0], vec![2]]);
    }

    #[test]
    fn without_numa_every_cpu_is_on_node_zero() {
        let sys = FakeSys::new(&[(0, 0, 0), (1, 1, 0)], "0-1", None);
        let topo = sys.read(&all(2));
        assert_eq!(topo.objects(CpuUnit::Numa), [vec![0, 1]]);
        assert_eq!(topo.objects(CpuUnit::Socket), [vec![0], vec![1]]);
    }

    #[test]
    fn core_ids_repeat_across_sockets_and_may_have_gaps() {
        // Real machines number cores 0,1,2,4,8,... within each socket.
        let sys = FakeSys::new(&[(0, 1, 4), (1, 0, 4), (2, 0, 0), (3, 1, 0)], "0-3", None);
        assert_eq!(sys.read(&all(4)).objects(CpuUnit::Core), [vec![2], vec![1], vec![3], vec![0]]);
    }

    #[test]
    fn missing_topology_files_make_each_cpu_a_core() {
        let sys = FakeSys::new(&[], "0-1", None);
        let topo = sys.read(&all(2));
        assert_eq!(topo.objects(CpuUnit::Core), [vec![0], vec![1]]);
        assert_eq!(topo.objects(CpuUnit::Socket), [vec![0, 1]]);
    }

    #[test]
    fn no_usable_cpu_is_an_error() {
        let sys = FakeSys::new(&[(0, 0, 0)], "0", None);
        assert!(Topology::read(&sys.0, &[5]).is_err());
    }

    #[test]
    fn each_local_rank_takes_the_next_objects_and_wraps() {
        let sys = FakeSys::two_by_two_by_two();
        let cores = sys.read(&all(8)).objects(CpuUnit::Core);
        let lists = |count, ranks: usize| -> Vec<String> {
            (0..ranks).map(|i| format_cpulist(&rank_cpus(&cores, count, i))).collect()
        };
        assert_eq!(lists(1, 5), ["0,4", "1,5", "2,6", "3,7", "0,4"]);
        assert_eq!(lists(2, 3), ["0-1,4-5", "2-3,6-7", "0-1,4-5"]);
        assert_eq!(lists(3, 2), ["0-2,4-6", "0-1,3-5,7"]);
        // More objects than there are: all of them, and no endless loop for a huge count.
        assert_eq!(lists(u32::MAX, 2), ["0-7", "0-7"]);
        // A count of 0 never reaches here from the command line; it means 1.
        assert_eq!(lists(0, 1), ["0,4"]);
    }

    #[test]
    fn restricted_set_binds_within_it() {
        let sys = FakeSys::two_by_two_by_two();
        let topo = sys.read(&[1, 2, 3, 5, 6]);
        let threads = topo.objects(CpuUnit::Hwthread);
        let got: Vec<_> = (0..6).map(|i| format_cpulist(&rank_cpus(&threads, 1, i))).collect();
        assert_eq!(got, ["1", "5", "2", "6", "3", "1"]);
    }

    #[test]
    fn cpulists_round_trip() {
        assert_eq!(format_cpulist(&[0, 1, 2, 3, 8, 10, 11]), "0-3,8,10-11");
        assert_eq!(format_cpulist(&[5]), "5");
        assert_eq!(format_cpulist(&[3, 1, 2, 2]), "1-3");
        assert_eq!(format_cpulist(&[]), "");
        assert_eq!(parse_cpulist("0-3,8,10-11\n"), Some(vec![0, 1, 2, 3, 8, 10, 11]));
        assert_eq!(parse_cpulist(""), Some(vec![]));
        assert_eq!(parse_cpulist("3-1"), None);
        assert_eq!(parse_cpulist("x"), None);
    }

    #[test]
    fn rank_cpus_carry_a_matching_mask() {
        let cpus = RankCpus::new(&[1, 2, 5]);
        assert_eq!(cpus.list, "1-2,5");
        let set: Vec<usize> =
            (0..CpuSet::count()).filter(|&i| cpus.mask.is_set(i).unwrap()).collect();
        assert_eq!(set, [1, 2, 5]);
    }
}
