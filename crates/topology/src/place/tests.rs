//! Exact placements on the fake machines of [`crate::fake`].

use super::*;
use crate::cpulist;
use crate::fake::{FakeSys, DGX, FRONTIER, POLARIS, VM};
use crate::gpu::Visible;

fn bind(unit: CpuUnit, count: u32) -> Option<Binding> {
    Some(Binding { unit, count })
}

fn map(unit: CpuUnit) -> Option<Mapping> {
    Some(Mapping { unit, per: None })
}

fn ppr(per: u32, unit: CpuUnit) -> Option<Mapping> {
    Some(Mapping { unit, per: Some(per) })
}

/// A node's placement of `count` ranks, each asking `gpus` GPUs (none: no GPU request).
struct Case<'a> {
    sys: &'a FakeSys,
    env: &'a [(&'a str, &'a str)],
    mapping: Option<Mapping>,
    binding: Option<Binding>,
    spread: bool,
    gpus: Option<u32>,
    bind: GpuBind,
    share: bool,
}

impl<'a> Case<'a> {
    fn on(sys: &'a FakeSys) -> Case<'a> {
        Case {
            sys,
            env: &[],
            mapping: None,
            binding: None,
            spread: false,
            gpus: None,
            bind: GpuBind::Closest,
            share: false,
        }
    }

    fn visible(&self) -> Visible {
        let env =
            |name: &str| self.env.iter().find(|(n, _)| *n == name).map(|(_, v)| v.to_string());
        Visible::of(&self.sys.read(None).gpus, env)
    }

    fn place(&self, count: usize) -> Result<(Placed, Visible), String> {
        let visible = self.visible();
        let per_rank = vec![self.gpus.unwrap_or(0); count];
        let ask =
            GpuAsk { per_rank: &per_rank, bind: &self.bind, share: self.share, visible: &visible };
        let request = Request {
            mapping: self.mapping,
            binding: self.binding,
            spread: self.spread,
            gpus: self.gpus.map(|_| ask),
        };
        let placed = place(&self.sys.read(None), &request, count)?;
        Ok((placed, visible))
    }

    /// Each rank's CPU list ("-" unbound).
    fn cpus(&self, count: usize) -> Vec<String> {
        let (placed, _) = self.place(count).unwrap();
        placed
            .places
            .iter()
            .map(|p| p.cpus.as_ref().map_or("-".to_string(), |c| cpulist::format(c)))
            .collect()
    }

    /// Each rank's value of `var`.
    fn var(&self, count: usize, var: &str) -> Vec<String> {
        let (placed, visible) = self.place(count).unwrap();
        placed
            .places
            .iter()
            .map(|p| {
                let vars = visible.vars(&p.gpus);
                vars.iter().find(|(n, _)| *n == var).map(|(_, v)| v.clone()).unwrap_or_default()
            })
            .collect()
    }
}

#[test]
fn frontier_unbound_ranks_get_the_gcd_of_their_share_of_the_cores() {
    let sys = FakeSys::of(&FRONTIER);
    let case = Case { gpus: Some(1), ..Case::on(&sys) };
    // NUMA 0 (cores 0-15) holds GCDs 4 and 5, NUMA 1 GCDs 2 and 3, NUMA 2 6-7, NUMA 3 0-1.
    assert_eq!(case.var(8, "ROCR_VISIBLE_DEVICES"), ["4", "5", "2", "3", "6", "7", "0", "1"]);
    assert_eq!(case.cpus(8), ["-"; 8]);
    // AMD's runtime numbers its devices as its driver lists them: no order variable.
    let (placed, visible) = case.place(1).unwrap();
    assert_eq!(visible.vars(&placed.places[0].gpus), [("ROCR_VISIBLE_DEVICES", "4".into())]);
}

#[test]
fn frontier_map_by_l3cache_binds_each_rank_to_its_ccd_and_the_gcd_there() {
    let sys = FakeSys::of(&FRONTIER);
    let case = Case {
        mapping: map(CpuUnit::L3),
        binding: bind(CpuUnit::L3, 1),
        gpus: Some(1),
        ..Case::on(&sys)
    };
    let cpus: Vec<String> =
        (0..8).map(|i| format!("{}-{},{}-{}", 8 * i, 8 * i + 7, 64 + 8 * i, 71 + 8 * i)).collect();
    assert_eq!(case.cpus(8), cpus);
    assert_eq!(case.var(8, "ROCR_VISIBLE_DEVICES"), ["4", "5", "2", "3", "6", "7", "0", "1"]);
}

#[test]
fn frontier_map_by_numa_bind_to_core_goes_round_the_numa_nodes() {
    let sys = FakeSys::of(&FRONTIER);
    let case = Case {
        mapping: map(CpuUnit::Numa),
        binding: bind(CpuUnit::Core, 1),
        gpus: Some(1),
        ..Case::on(&sys)
    };
    assert_eq!(
        case.cpus(8),
        ["0,64", "16,80", "32,96", "48,112", "1,65", "17,81", "33,97", "49,113"]
    );
    assert_eq!(case.var(8, "ROCR_VISIBLE_DEVICES"), ["4", "2", "6", "0", "5", "3", "7", "1"]);
}

#[test]
fn polaris_gpus_come_in_reverse_as_its_wrapper_scripts_say() {
    let sys = FakeSys::of(&POLARIS);
    let case = Case { gpus: Some(1), ..Case::on(&sys) };
    assert_eq!(case.var(4, "CUDA_VISIBLE_DEVICES"), ["3", "2", "1", "0"]);
    assert_eq!(case.var(4, "CUDA_DEVICE_ORDER"), ["PCI_BUS_ID"; 4]);
    // Mapped by NUMA node and bound to it: the same GPUs.
    let numa = Case { mapping: map(CpuUnit::Numa), binding: bind(CpuUnit::Numa, 1), ..case };
    assert_eq!(numa.cpus(4), ["0-7,32-39", "8-15,40-47", "16-23,48-55", "24-31,56-63"]);
    assert_eq!(numa.var(4, "CUDA_VISIBLE_DEVICES"), ["3", "2", "1", "0"]);
}

#[test]
fn polaris_map_list_is_taken_as_written() {
    let sys = FakeSys::of(&POLARIS);
    let case = Case { gpus: Some(1), bind: GpuBind::Map(vec![0, 1, 2, 3]), ..Case::on(&sys) };
    assert_eq!(case.var(6, "CUDA_VISIBLE_DEVICES"), ["0", "1", "2", "3", "0", "1"]);
    let bad = Case { gpus: Some(1), bind: GpuBind::Map(vec![4]), ..Case::on(&sys) };
    assert_eq!(bad.place(1).unwrap_err(), "--gpu-bind map names GPU 4 but there are 4 here");
}

#[test]
fn two_gpus_a_rank_are_the_two_nearest() {
    let sys = FakeSys::of(&POLARIS);
    let case = Case { gpus: Some(2), ..Case::on(&sys) };
    assert_eq!(case.var(2, "CUDA_VISIBLE_DEVICES"), ["3,2", "1,0"]);
}

#[test]
fn dgx_map_by_socket_alternates_sockets_and_gpus() {
    let sys = FakeSys::of(&DGX);
    let case = Case {
        mapping: map(CpuUnit::Socket),
        binding: bind(CpuUnit::Core, 1),
        gpus: Some(1),
        ..Case::on(&sys)
    };
    assert_eq!(case.cpus(4), ["0,112", "56,168", "1,113", "57,169"]);
    assert_eq!(case.var(8, "CUDA_VISIBLE_DEVICES"), ["0", "4", "1", "5", "2", "6", "3", "7"]);
    // Unbound: ranks 0-3 count as sitting on socket 0, 4-7 on socket 1.
    let unbound = Case { gpus: Some(1), ..Case::on(&sys) };
    assert_eq!(unbound.var(8, "CUDA_VISIBLE_DEVICES"), ["0", "1", "2", "3", "4", "5", "6", "7"]);
}

#[test]
fn dgx_pe_gives_each_rank_that_many_cores_of_its_socket() {
    let sys = FakeSys::of(&DGX);
    let case =
        Case { mapping: map(CpuUnit::Socket), binding: bind(CpuUnit::Core, 4), ..Case::on(&sys) };
    assert_eq!(case.cpus(3), ["0-3,112-115", "56-59,168-171", "4-7,116-119"]);
}

#[test]
fn ppr_fills_each_object_in_turn_and_no_more() {
    let sys = FakeSys::of(&DGX);
    let case = Case {
        mapping: ppr(2, CpuUnit::Socket),
        binding: bind(CpuUnit::Socket, 1),
        ..Case::on(&sys)
    };
    let (zero, one) = ("0-55,112-167", "56-111,168-223");
    assert_eq!(case.cpus(4), [zero, zero, one, one]);
    assert_eq!(
        case.place(5).unwrap_err(),
        "ppr:2:socket places at most 4 ranks here (2 sockets), not 5"
    );
    let cores = Case { binding: bind(CpuUnit::Core, 1), ..case };
    assert_eq!(cores.cpus(4), ["0,112", "1,113", "56,168", "57,169"]);
}

#[test]
fn more_ranks_than_gpus_fail_unless_shared() {
    let sys = FakeSys::of(&DGX);
    let case = Case { gpus: Some(1), ..Case::on(&sys) };
    assert_eq!(
        case.place(9).unwrap_err(),
        "9 ranks ask for 9 GPUs but there are 8 here (--gpu-share lets ranks share them)"
    );
    let shared = Case { share: true, ..case };
    let got = shared.var(16, "CUDA_VISIBLE_DEVICES");
    assert_eq!(
        got,
        ["0", "1", "2", "3", "0", "1", "2", "3", "4", "5", "6", "7", "4", "5", "6", "7"]
    );
}

#[test]
fn a_machine_without_gpus_fails_a_request_and_ignores_other_devices() {
    let sys = FakeSys::of(&VM);
    assert!(sys.read(None).gpus.is_empty());
    let case = Case { gpus: Some(1), share: true, ..Case::on(&sys) };
    assert_eq!(case.place(1).unwrap_err(), "1 rank asks for GPUs but there is none here");
    // DGX: its VGA, NICs, NVSwitches and audio function are no GPUs.
    assert_eq!(FakeSys::of(&DGX).read(None).gpus.len(), 8);
}

#[test]
fn a_rank_given_no_gpu_sees_none() {
    let sys = FakeSys::of(&POLARIS);
    let case = Case { gpus: Some(0), ..Case::on(&sys) };
    assert_eq!(case.var(2, "CUDA_VISIBLE_DEVICES"), ["", ""]);
    let frontier = FakeSys::of(&FRONTIER);
    let amd = Case { gpus: Some(0), ..Case::on(&frontier) };
    assert_eq!(amd.var(1, "ROCR_VISIBLE_DEVICES"), [""]);
}

#[test]
fn an_allocations_gpus_are_the_only_ones_used_and_named_as_it_names_them() {
    let sys = FakeSys::of(&DGX);
    // Without a device cgroup: the node's indices of the job's GPUs (socket 1's).
    let global = [("CUDA_VISIBLE_DEVICES", "4,5,6,7")];
    let case = Case { env: &global, gpus: Some(1), ..Case::on(&sys) };
    assert_eq!(case.var(4, "CUDA_VISIBLE_DEVICES"), ["4", "5", "6", "7"]);
    // The allocation's order is its own: rlaunch does not impose PCI order on it.
    assert_eq!(case.var(1, "CUDA_DEVICE_ORDER"), [""]);
    assert_eq!(
        case.place(5).unwrap_err(),
        "5 ranks ask for 5 GPUs but there are 4 here (--gpu-share lets ranks share them)"
    );
    // Within a device cgroup Slurm counts from 0, and SLURM_JOB_GPUS says which they are:
    // socket 1's, so a rank bound to socket 1's first core gets the job's first GPU.
    let cgroup = [("CUDA_VISIBLE_DEVICES", "0,1,2,3"), ("SLURM_JOB_GPUS", "4,5,6,7")];
    let case = Case {
        env: &cgroup,
        gpus: Some(1),
        mapping: map(CpuUnit::Socket),
        binding: bind(CpuUnit::Core, 1),
        share: true,
        ..Case::on(&sys)
    };
    let visible = case.visible();
    let pcis: Vec<&str> =
        visible.gpus.iter().map(|g| g.gpu.as_ref().unwrap().pci.as_str()).collect();
    assert_eq!(pcis, ["0000:9d:00.0", "0000:c3:00.0", "0000:d1:00.0", "0000:df:00.0"]);
    // Rank 0 (socket 0) has no GPU near: the first; rank 1 (socket 1): the nearest free.
    assert_eq!(case.var(2, "CUDA_VISIBLE_DEVICES"), ["0", "1"]);
    // An allocation that names its GPUs by UUID: handed out in its order.
    let uuids =
        [("CUDA_VISIBLE_DEVICES", "GPU-aaaa,GPU-bbbb"), ("CUDA_DEVICE_ORDER", "FASTEST_FIRST")];
    let case = Case { env: &uuids, gpus: Some(1), ..Case::on(&sys) };
    assert_eq!(case.var(2, "CUDA_VISIBLE_DEVICES"), ["GPU-aaaa", "GPU-bbbb"]);
    assert_eq!(case.var(1, "CUDA_DEVICE_ORDER"), ["FASTEST_FIRST"]);
}

#[test]
fn by_slot_each_local_rank_takes_the_next_objects_and_wraps() {
    let sys = FakeSys::two_by_two_by_two();
    let cores = sys.read(None).objects(CpuUnit::Core);
    let lists = |count, ranks: usize| -> Vec<String> {
        (0..ranks).map(|i| cpulist::format(&rank_cpus(&cores, count, i))).collect()
    };
    assert_eq!(lists(1, 5), ["0,4", "1,5", "2,6", "3,7", "0,4"]);
    assert_eq!(lists(2, 3), ["0-1,4-5", "2-3,6-7", "0-1,4-5"]);
    assert_eq!(lists(3, 2), ["0-2,4-6", "0-1,3-5,7"]);
    // More objects than there are: all of them, and no endless loop for a huge count.
    assert_eq!(lists(u32::MAX, 2), ["0-7", "0-7"]);
    // A count of 0 never reaches here from the command line; it means 1.
    assert_eq!(lists(0, 1), ["0,4"]);
    let case = Case { binding: bind(CpuUnit::Core, 1), ..Case::on(&sys) };
    let (placed, _) = case.place(5).unwrap();
    assert_eq!(placed.notices, ["5 ranks x 1 core but only 4 cores here: bindings wrap around"]);
}

#[test]
fn restricted_set_binds_within_it() {
    let sys = FakeSys::two_by_two_by_two();
    let machine = sys.read(Some(&[1, 2, 3, 5, 6]));
    let threads = machine.objects(CpuUnit::Hwthread);
    let got: Vec<_> = (0..6).map(|i| cpulist::format(&rank_cpus(&threads, 1, i))).collect();
    assert_eq!(got, ["1", "5", "2", "6", "3", "1"]);
}

#[test]
fn a_cpuset_narrows_the_gpus_local_cpus_too() {
    let sys = FakeSys::of(&POLARIS);
    // As a Slurm job given cores 8-15 only: GPU 2 is the one near them.
    let machine = sys.read(Some(&(8..16).collect::<Vec<_>>()));
    let visible = Visible::of(&machine.gpus, |_| None);
    let per_rank = [1];
    let ask =
        GpuAsk { per_rank: &per_rank, bind: &GpuBind::Closest, share: false, visible: &visible };
    let request =
        Request { mapping: None, binding: bind(CpuUnit::Core, 1), spread: false, gpus: Some(ask) };
    let placed = place(&machine, &request, 1).unwrap();
    assert_eq!(placed.places[0].cpus.as_deref(), Some(&[8][..]));
    assert_eq!(visible.vars(&placed.places[0].gpus)[0], ("CUDA_VISIBLE_DEVICES", "2".to_string()));
}

#[test]
fn amd_gpus_are_numbered_as_their_drivers_topology_orders_them() {
    let sys = FakeSys::of(&FRONTIER);
    let case = Case { gpus: Some(1), ..Case::on(&sys) };
    let pcis = |visible: &Visible| -> Vec<String> {
        visible.gpus.iter().map(|g| g.gpu.as_ref().unwrap().pci.clone()).collect()
    };
    // In PCI order on Frontier.
    assert_eq!(pcis(&case.visible())[..2], ["0000:c1:00.0", "0000:c6:00.0"]);
    // A driver that lists the first two the other way round renumbers them, and rank 6 (by
    // NUMA node 3's cores, nearest c1 and c6) is told c1's new number.
    sys.kfd_node(1, "0000:c6:00.0");
    sys.kfd_node(2, "0000:c1:00.0");
    assert_eq!(pcis(&case.visible())[..2], ["0000:c6:00.0", "0000:c1:00.0"]);
    assert_eq!(case.var(8, "ROCR_VISIBLE_DEVICES"), ["4", "5", "2", "3", "6", "7", "0", "1"]);
    let (placed, visible) = case.place(8).unwrap();
    let rank6 = visible.gpus[placed.places[6].gpus[0]].gpu.as_ref().unwrap().pci.clone();
    assert_eq!(rank6, "0000:c6:00.0");
}

#[test]
fn pe_past_the_mapped_object_takes_consecutive_units_as_open_mpi_does() {
    let sys = FakeSys::of(&DGX);
    // --map-by core:PE=2: rank i has cores 2i and 2i+1.
    let cores =
        Case { mapping: map(CpuUnit::Core), binding: bind(CpuUnit::Core, 2), ..Case::on(&sys) };
    assert_eq!(cores.cpus(3), ["0-1,112-113", "2-3,114-115", "4-5,116-117"]);
    let (placed, _) = cores.place(3).unwrap();
    assert_eq!(placed.notices, Vec::<String>::new());
    // --map-by hwthread:PE=2: two hardware threads a rank, a core's pair.
    let threads = Case {
        mapping: map(CpuUnit::Hwthread),
        binding: bind(CpuUnit::Hwthread, 2),
        ..Case::on(&sys)
    };
    assert_eq!(threads.cpus(2), ["0,112", "1,113"]);
}

#[test]
fn ranks_sharing_their_object_by_design_get_no_wrap_notice() {
    let sys = FakeSys::of(&FRONTIER);
    let ppr =
        Case { mapping: ppr(2, CpuUnit::Numa), binding: bind(CpuUnit::Numa, 1), ..Case::on(&sys) };
    assert_eq!(ppr.place(8).unwrap().0.notices, Vec::<String>::new());
    let round =
        Case { mapping: map(CpuUnit::Numa), binding: bind(CpuUnit::Numa, 1), ..Case::on(&sys) };
    assert_eq!(round.place(4).unwrap().0.notices, Vec::<String>::new());
    assert_eq!(
        round.place(5).unwrap().0.notices,
        ["5 ranks x 1 NUMA node by numa but not that many in each: bindings wrap around"]
    );
}

#[test]
fn shared_gpus_double_up_only_as_much_as_the_count_needs() {
    let sys = FakeSys::of(&FRONTIER);
    let case = Case {
        mapping: ppr(5, CpuUnit::Numa),
        binding: bind(CpuUnit::Core, 1),
        gpus: Some(1),
        share: true,
        ..Case::on(&sys)
    };
    let got = case.var(10, "ROCR_VISIBLE_DEVICES");
    let mut uses = std::collections::BTreeMap::new();
    got.iter().for_each(|g| *uses.entry(g.clone()).or_insert(0) += 1);
    // Five ranks on NUMA node 0, five on 1: every GCD used, two of them (NUMA 0's) twice; the
    // ranks past those take the free GCDs, nearest first.
    assert_eq!(uses.len(), 8, "{got:?}");
    assert_eq!(got, ["4", "5", "4", "5", "0", "2", "3", "1", "6", "7"]);
    // No GPU asked for on a node without any, shared or not: nothing to divide.
    let vm = FakeSys::of(&VM);
    let none = Case { gpus: Some(0), share: true, ..Case::on(&vm) };
    assert_eq!(none.var(2, "CUDA_VISIBLE_DEVICES"), ["", ""]);
}

#[test]
fn another_makers_variable_names_no_gpu_here() {
    let sys = FakeSys::of(&FRONTIER);
    // Slurm sets every maker's variable unless told which.
    let env = [("CUDA_VISIBLE_DEVICES", "0,1"), ("ROCR_VISIBLE_DEVICES", "0,1")];
    let case = Case { env: &env, gpus: Some(1), ..Case::on(&sys) };
    assert_eq!(case.visible().gpus.len(), 2);
    assert_eq!(case.var(2, "ROCR_VISIBLE_DEVICES"), ["0", "1"]);
    let (placed, visible) = case.place(1).unwrap();
    assert_eq!(visible.vars(&placed.places[0].gpus), [("ROCR_VISIBLE_DEVICES", "0".to_string())]);
}

#[test]
fn spread_ranks_get_their_shares_of_the_cores_while_they_fit() {
    // Polaris: 32 cores, 2 threads each (core c is CPUs c and c+32).
    let sys = FakeSys::of(&POLARIS);
    let case = Case { spread: true, ..Case::on(&sys) };
    assert_eq!(case.cpus(2), ["0-15,32-47", "16-31,48-63"]);
    assert_eq!(case.cpus(3)[1], "10-20,42-52");
    assert_eq!(case.cpus(32)[5], "5,37");
    // More ranks than cores: none bound, as without spread.
    assert_eq!(case.cpus(33), vec!["-"; 33]);
    assert_eq!(Case::on(&sys).cpus(2), ["-", "-"]);
    // The GPUs follow the shares, as they do unbound.
    let gpus = Case { gpus: Some(1), ..case };
    let (placed, _) = gpus.place(4).unwrap();
    let bound: Vec<bool> = placed.places.iter().map(|p| p.cpus.is_some()).collect();
    assert_eq!(bound, [true; 4]);
}
