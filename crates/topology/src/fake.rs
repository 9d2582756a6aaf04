//! Fake machines for tests: sysfs trees, files only, written to a directory laid out as `/`
//! is ([`crate::ROOT_VAR`]). Four shapes people run on: a Frontier-like node (AMD GPUs whose
//! NUMA map is not the identity), a Polaris-like one (NVIDIA GPUs in reverse order of their
//! cores), a DGX-like one (8 NVIDIA GPUs on 2 sockets, with NVSwitches, NICs and a BMC's VGA
//! on the bus), and a 2-CPU virtual machine with no GPU and no NUMA.

use std::fs;
use std::path::{Path, PathBuf};

/// A fake machine's root directory, removed on drop.
pub struct FakeSys(pub PathBuf);

/// A PCI device: address, vendor, class, NUMA node (-1: none).
pub type Pci = (&'static str, u32, u32, i32);

/// A machine's shape, numbered as Linux does on x86: the first hardware thread of every core
/// first (cpu = thread * cores + core), cores counted across sockets, NUMA nodes and L3
/// caches in core order.
pub struct Shape {
    pub sockets: u32,
    pub cores_per_socket: u32,
    pub threads: u32,
    /// NUMA nodes per socket; 0: a kernel without NUMA (no `node/` directory).
    pub numa_per_socket: u32,
    /// Cores sharing an L3 cache; 0: no cache files.
    pub l3_cores: u32,
    pub pci: &'static [Pci],
}

const NVIDIA: u32 = 0x10de;
const AMD: u32 = 0x1002;
const THREE_D: u32 = 0x030200;
const DISPLAY_OTHER: u32 = 0x038000;
const VGA: u32 = 0x030000;

/// OLCF Frontier: one 64-core EPYC (NPS4: 4 NUMA nodes, 8 L3 caches of 8 cores), 2 threads a
/// core, 8 MI250X GCDs. GCDs 0-1 sit on NUMA node 3, 2-3 on 1, 4-5 on 0, 6-7 on 2.
pub const FRONTIER: Shape = Shape {
    sockets: 1,
    cores_per_socket: 64,
    threads: 2,
    numa_per_socket: 4,
    l3_cores: 8,
    pci: &[
        ("0000:c1:00.0", AMD, DISPLAY_OTHER, 3),
        ("0000:c6:00.0", AMD, DISPLAY_OTHER, 3),
        ("0000:c9:00.0", AMD, DISPLAY_OTHER, 1),
        ("0000:ce:00.0", AMD, DISPLAY_OTHER, 1),
        ("0000:d1:00.0", AMD, DISPLAY_OTHER, 0),
        ("0000:d6:00.0", AMD, DISPLAY_OTHER, 0),
        ("0000:d9:00.0", AMD, DISPLAY_OTHER, 2),
        ("0000:de:00.0", AMD, DISPLAY_OTHER, 2),
    ],
};

/// ALCF Polaris: one 32-core EPYC (NPS4, 8-core L3s), 2 threads a core, 4 A100s, GPU 0 by
/// the last cores and GPU 3 by the first.
pub const POLARIS: Shape = Shape {
    sockets: 1,
    cores_per_socket: 32,
    threads: 2,
    numa_per_socket: 4,
    l3_cores: 8,
    pci: &[
        ("0000:07:00.0", NVIDIA, THREE_D, 3),
        ("0000:46:00.0", NVIDIA, THREE_D, 2),
        ("0000:85:00.0", NVIDIA, THREE_D, 1),
        ("0000:c7:00.0", NVIDIA, THREE_D, 0),
    ],
};

/// A DGX H100-like node: 2 sockets of 56 cores (one NUMA node and one L3 each), 2 threads a
/// core, 8 GPUs, 4 a socket; NVSwitches (bridges), ConnectX NICs and the BMC's VGA are on
/// the bus too and are no GPUs.
pub const DGX: Shape = Shape {
    sockets: 2,
    cores_per_socket: 56,
    threads: 2,
    numa_per_socket: 1,
    l3_cores: 56,
    pci: &[
        ("0000:03:00.0", 0x1a03, VGA, -1),
        ("0000:18:00.0", 0x15b3, 0x020700, 0),
        ("0000:1b:00.0", NVIDIA, THREE_D, 0),
        ("0000:43:00.0", NVIDIA, THREE_D, 0),
        ("0000:52:00.0", NVIDIA, THREE_D, 0),
        ("0000:61:00.0", NVIDIA, THREE_D, 0),
        ("0000:86:00.0", NVIDIA, 0x068000, 1),
        ("0000:9d:00.0", NVIDIA, THREE_D, 1),
        ("0000:c3:00.0", NVIDIA, THREE_D, 1),
        ("0000:d1:00.0", NVIDIA, THREE_D, 1),
        ("0000:df:00.0", NVIDIA, THREE_D, 1),
        ("0000:df:00.1", NVIDIA, 0x040300, 1),
    ],
};

/// This kind of test machine: a 2-CPU virtual machine, no NUMA, no cache files, QEMU's VGA.
pub const VM: Shape = Shape {
    sockets: 1,
    cores_per_socket: 2,
    threads: 1,
    numa_per_socket: 0,
    l3_cores: 0,
    pci: &[("0000:00:02.0", 0x1234, VGA, -1)],
};

impl FakeSys {
    /// A fresh empty root in the temporary directory.
    fn fresh() -> FakeSys {
        use std::sync::atomic::{AtomicU32, Ordering};
        static NEXT: AtomicU32 = AtomicU32::new(0);
        // Thousands of small files: memory's file system writes them twenty times faster
        // than a virtual machine's disk.
        let shm = Path::new("/dev/shm");
        let base = if shm.is_dir() { shm.to_path_buf() } else { std::env::temp_dir() };
        let root = base.join(format!(
            "rlaunch-topology-{}-{}",
            std::process::id(),
            NEXT.fetch_add(1, Ordering::Relaxed)
        ));
        let _ = fs::remove_dir_all(&root);
        FakeSys(root)
    }

    /// Writes `text` (and a newline) to `path` under the root.
    pub fn write(&self, path: &str, text: &str) {
        let path = self.0.join(path);
        let parent = path.parent().unwrap();
        if !parent.is_dir() {
            fs::create_dir_all(parent).unwrap();
        }
        fs::write(path, format!("{text}\n")).unwrap();
    }

    /// A machine of `shape`.
    pub fn of(shape: &Shape) -> FakeSys {
        let sys = FakeSys::fresh();
        sys.write_shape(shape);
        sys
    }

    fn write_shape(&self, s: &Shape) {
        let cores = s.sockets * s.cores_per_socket;
        let cpus = cores * s.threads;
        let cpu = |thread: u32, core: u32| thread * cores + core;
        let core_cpus = |range: std::ops::Range<u32>| -> String {
            let ids: Vec<u32> =
                (0..s.threads).flat_map(|t| range.clone().map(move |c| cpu(t, c))).collect();
            crate::cpulist::format(&ids)
        };
        let system = "sys/devices/system";
        self.write(&format!("{system}/cpu/online"), &format!("0-{}", cpus - 1));
        for core in 0..cores {
            for thread in 0..s.threads {
                let dir = format!("{system}/cpu/cpu{}", cpu(thread, core));
                let socket = core / s.cores_per_socket;
                self.write(&format!("{dir}/topology/physical_package_id"), &socket.to_string());
                let core_id = core % s.cores_per_socket;
                self.write(&format!("{dir}/topology/core_id"), &core_id.to_string());
                if let Some(l3) = core.checked_div(s.l3_cores) {
                    let first = l3 * s.l3_cores;
                    self.write(&format!("{dir}/cache/index3/level"), "3");
                    self.write(
                        &format!("{dir}/cache/index3/shared_cpu_list"),
                        &core_cpus(first..first + s.l3_cores),
                    );
                }
            }
        }
        let nodes = s.sockets * s.numa_per_socket;
        let node_cpus = |node: u32| {
            let per = cores / nodes;
            core_cpus(node * per..node * per + per)
        };
        if nodes > 0 {
            self.write(&format!("{system}/node/online"), &format!("0-{}", nodes - 1));
            for node in 0..nodes {
                self.write(&format!("{system}/node/node{node}/cpulist"), &node_cpus(node));
            }
        }
        // AMD's driver topology: node 0 the CPUs, then the GPUs in PCI order.
        let amd = s.pci.iter().filter(|(_, vendor, class, _)| *vendor == AMD && class >> 16 == 3);
        if s.pci.iter().any(|(_, vendor, _, _)| *vendor == AMD) {
            self.write("sys/class/kfd/kfd/topology/nodes/0/gpu_id", "0");
            self.write("sys/class/kfd/kfd/topology/nodes/0/properties", "cpu_cores_count 64");
        }
        for (i, (address, ..)) in amd.enumerate() {
            self.kfd_node(i as u32 + 1, address);
        }
        for &(address, vendor, class, numa) in s.pci {
            let dir = format!("sys/bus/pci/devices/{address}");
            self.write(&format!("{dir}/vendor"), &format!("0x{vendor:04x}"));
            self.write(&format!("{dir}/class"), &format!("0x{class:06x}"));
            self.write(&format!("{dir}/numa_node"), &numa.to_string());
            let local = if numa >= 0 && nodes > 0 {
                node_cpus(numa as u32)
            } else {
                crate::cpulist::format(&(0..cpus).collect::<Vec<_>>())
            };
            self.write(&format!("{dir}/local_cpulist"), &local);
        }
    }

    /// Makes AMD driver topology node `node` the GPU at PCI `address` (`0000:c1:00.0`).
    pub fn kfd_node(&self, node: u32, address: &str) {
        let hex = |s: &str| u64::from_str_radix(s, 16).unwrap();
        let (domain, rest) = address.split_once(':').unwrap();
        let (bus, rest) = rest.split_once(':').unwrap();
        let (device, function) = rest.split_once('.').unwrap();
        let location = hex(bus) << 8 | hex(device) << 3 | hex(function);
        let dir = format!("sys/class/kfd/kfd/topology/nodes/{node}");
        self.write(&format!("{dir}/gpu_id"), &(1000 + node).to_string());
        let properties = format!("simd_count 440\ndomain {}\nlocation_id {location}", hex(domain));
        self.write(&format!("{dir}/properties"), &properties);
    }

    /// `cpus`: (id, socket, core); `nodes`: each NUMA node's cpulist, or `None` for a kernel
    /// without NUMA. No cache files, no PCI devices.
    pub fn new(cpus: &[(u32, i64, i64)], online: &str, nodes: Option<&[&str]>) -> FakeSys {
        let sys = FakeSys::fresh();
        let system = "sys/devices/system";
        sys.write(&format!("{system}/cpu/online"), online);
        for &(id, socket, core) in cpus {
            let dir = format!("{system}/cpu/cpu{id}/topology");
            sys.write(&format!("{dir}/physical_package_id"), &socket.to_string());
            sys.write(&format!("{dir}/core_id"), &core.to_string());
        }
        if let Some(nodes) = nodes {
            for (i, list) in nodes.iter().enumerate() {
                sys.write(&format!("{system}/node/node{i}/cpulist"), list);
            }
            sys.write(&format!("{system}/node/online"), &format!("0-{}", nodes.len() - 1));
        }
        sys
    }

    /// Two sockets x two cores x two hardware threads.
    pub fn two_by_two_by_two() -> FakeSys {
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

    pub fn path(&self) -> &Path {
        &self.0
    }

    /// The machine, with its GPUs, keeping `allowed` (all online CPUs if `None`).
    pub fn read(&self, allowed: Option<&[u32]>) -> crate::Machine {
        crate::Machine::read(&self.0, allowed, true).unwrap()
    }
}

impl Drop for FakeSys {
    fn drop(&mut self) {
        let _ = fs::remove_dir_all(&self.0);
    }
}
