//! rlaunch-topology: a node's shape as Linux shows it in sysfs, and where a job's local ranks
//! go on it. No hwloc and no vendor library: for hardware threads, cores, L3 caches, NUMA
//! nodes, sockets and the GPUs on the PCI bus, the kernel's files say all rlaunch needs.
//!
//! ```text
//!  /sys/devices/system/{cpu,node}, /sys/bus/pci/devices     (or a copy: RLAUNCH_TOPOLOGY_ROOT)
//!  sched_getaffinity(0), CUDA_VISIBLE_DEVICES, ...          (what this proxy may use)
//!        │ Machine::of_this_process
//!        ▼
//!  Machine: the usable CPUs, each with its core, L3, NUMA node and socket; the GPUs
//!        │ place(machine, Request, local ranks)      pure: unit-tested on fake machines
//!        ▼
//!  Place per local rank: the CPUs it is bound to, the GPUs it gets
//!        │ gpu::vars
//!        ▼
//!  CUDA_VISIBLE_DEVICES / ROCR_VISIBLE_DEVICES / ZE_AFFINITY_MASK
//! ```
//!
//! The proxy computes a job's places once per node ([`place::place`]); the launcher reads its
//! own machine only for `--map-by ppr:N:socket` and the like, whose rank count per node is
//! a count of objects.

pub mod cpulist;
#[cfg(any(test, feature = "fake"))]
pub mod fake;
pub mod gpu;
pub mod machine;
pub mod place;
mod sysfs;

pub use machine::{Machine, ROOT_VAR};
pub use place::{place, Place, Placed, Request};
