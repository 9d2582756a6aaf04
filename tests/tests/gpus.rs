//! GPUs and topology end to end: real rlaunch and real proxies on fake machines (sysfs trees
//! of a Frontier, a Polaris and a DGX node, and of a GPU-less VM, read through
//! `RLAUNCH_TOPOLOGY_ROOT`), each rank's environment and the report checked exactly.

use std::collections::BTreeMap;

use rlaunch_tests::hosts::hostname;
use rlaunch_tests::output::{envs_by_rank, rlaunch_lines};
use rlaunch_tests::Run;
use rlaunch_topology::fake::{FakeSys, Shape, DGX, FRONTIER, POLARIS, VM};

/// rlaunch on the fake machine `sys`, every rank printing its environment (`-l env`).
fn on(sys: &FakeSys, options: &[&str]) -> Run {
    Run::new(&["-l"])
        .env("RLAUNCH_TOPOLOGY_ROOT", sys.path())
        .env_remove("CUDA_VISIBLE_DEVICES")
        .env_remove("ROCR_VISIBLE_DEVICES")
        .env_remove("ZE_AFFINITY_MASK")
        .env_remove("CUDA_DEVICE_ORDER")
        .env_remove("SLURM_JOB_GPUS")
        .args(options)
        .arg("env")
}

/// Each rank's value of `var` ("unset" where it has none), in rank order.
fn each(lines: &[String], var: &str) -> Vec<String> {
    envs_by_rank(lines)
        .values()
        .map(|env| env.get(var).cloned().unwrap_or_else(|| "unset".into()))
        .collect()
}

fn machine(shape: &Shape) -> FakeSys {
    FakeSys::of(shape)
}

/// [`on`] with `--report`: the outcome, and the report as JSON.
fn reported(sys: &FakeSys, options: &[&str]) -> (rlaunch_tests::Outcome, serde_json::Value) {
    let dir = rlaunch_tests::tempdir();
    let report = dir.join("report.json");
    let out = on(sys, &[&["--report", report.to_str().unwrap()], options].concat()).run();
    out.assert_code(0);
    let json = serde_json::from_str(&std::fs::read_to_string(&report).unwrap()).unwrap();
    (out, json)
}

/// Each rank's `cpus` in a report.
fn cpus(json: &serde_json::Value) -> Vec<&str> {
    json["ranks"].as_array().unwrap().iter().map(|r| r["cpus"].as_str().unwrap()).collect()
}

#[test]
fn frontier_each_rank_gets_the_gcd_by_its_cores_and_every_local_rank_spelling() {
    let sys = machine(&FRONTIER);
    let out = on(&sys, &["--gpus-per-rank", "1", "-n", "8"]).run();
    out.assert_code(0);
    let lines = out.lines();
    assert_eq!(each(&lines, "ROCR_VISIBLE_DEVICES"), ["4", "5", "2", "3", "6", "7", "0", "1"]);
    // No other maker's variable, and AMD's runtime needs no order variable.
    assert_eq!(each(&lines, "CUDA_VISIBLE_DEVICES"), ["unset"; 8]);
    assert_eq!(each(&lines, "ZE_AFFINITY_MASK"), ["unset"; 8]);
    let locals: Vec<String> = (0..8).map(|i| i.to_string()).collect();
    for var in ["LOCAL_RANK", "MPI_LOCALRANKID", "PMI_LOCAL_RANK", "OMPI_COMM_WORLD_LOCAL_RANK"] {
        assert_eq!(each(&lines, var), locals, "{var}");
    }
    for var in
        ["LOCAL_WORLD_SIZE", "MPI_LOCALNRANKS", "PMI_LOCAL_SIZE", "OMPI_COMM_WORLD_LOCAL_SIZE"]
    {
        assert_eq!(each(&lines, var), ["8"; 8], "{var}");
    }
    assert_eq!(rlaunch_lines(&out.stderr_str()), Vec::<&str>::new(), "{out}");
}

#[test]
fn report_bindings_names_cpus_and_gpus_in_one_line_a_rank() {
    let sys = machine(&FRONTIER);
    let options = ["--gpus-per-rank", "1", "--map-by", "l3cache", "--report-bindings", "-n", "2"];
    let out = on(&sys, &options).run();
    out.assert_code(0);
    let host = hostname();
    let mut got: Vec<String> = rlaunch_lines(&out.stderr_str())
        .iter()
        .map(|l| {
            // The pid varies: "(pid 123)" -> "(pid N)".
            let (head, tail) = l.split_once("(pid ").unwrap();
            format!("{head}(pid N){}", &tail[tail.find(')').unwrap() + 1..])
        })
        .collect();
    got.sort();
    assert_eq!(
        got,
        [
            format!("rlaunch: rank 0 on {host} (pid N) bound to cpus 0-7,64-71, GPU 4 (amd 0000:d1:00.0, NUMA 0)"),
            format!("rlaunch: rank 1 on {host} (pid N) bound to cpus 8-15,72-79, GPU 5 (amd 0000:d6:00.0, NUMA 0)"),
        ],
        "{out}"
    );
}

#[test]
fn polaris_map_by_numa_reports_each_ranks_cpus_and_gpu() {
    let sys = machine(&POLARIS);
    let (out, json) = reported(&sys, &["--gpus-per-rank", "1", "--map-by", "numa", "-n", "4"]);
    let lines = out.lines();
    // GPU 0 sits by the last cores: the reversed order ALCF's wrapper script writes by hand.
    assert_eq!(each(&lines, "CUDA_VISIBLE_DEVICES"), ["3", "2", "1", "0"]);
    assert_eq!(each(&lines, "CUDA_DEVICE_ORDER"), ["PCI_BUS_ID"; 4]);
    assert_eq!(cpus(&json), ["0-7,32-39", "8-15,40-47", "16-23,48-55", "24-31,56-63"]);
    let ranks = json["ranks"].as_array().unwrap();
    let gpus: Vec<&serde_json::Value> = ranks.iter().map(|r| &r["gpus"]).collect();
    let gpu = |entry: &str, pci: &str, numa: u32| serde_json::json!([{"entry": entry, "vendor": "nvidia", "pci": pci, "numa": numa}]);
    assert_eq!(
        gpus,
        [
            &gpu("3", "0000:c7:00.0", 0),
            &gpu("2", "0000:85:00.0", 1),
            &gpu("1", "0000:46:00.0", 2),
            &gpu("0", "0000:07:00.0", 3),
        ]
    );
    // The variables are in the report too.
    assert_eq!(ranks[0]["vars"]["CUDA_VISIBLE_DEVICES"], "3");
}

#[test]
fn more_ranks_than_gpus_fail_in_one_line_before_any_rank_runs_unless_shared() {
    let sys = machine(&POLARIS);
    let out = on(&sys, &["--gpus-per-rank", "1", "-n", "5"]).run();
    out.assert_code(255);
    let want = format!(
        "rlaunch: cannot place the ranks on {}: 5 ranks ask for 5 GPUs but there are 4 here \
         (--gpu-share lets ranks share them)",
        hostname()
    );
    assert_eq!(out.stderr_str().lines().collect::<Vec<_>>(), [want.as_str()], "{out}");
    assert_eq!(out.stdout_str(), "", "{out}");
    let shared = on(&sys, &["--gpus-per-rank", "1", "--gpu-share", "-n", "5"]).run();
    shared.assert_code(0);
    // Five ranks over 32 cores: 0-5 (NUMA 0), 6-11 (mostly 1), 12-18 (mostly 1), 19-24
    // (mostly 2), 25-31 (3); each its nearest GPU, none taking more than two.
    assert_eq!(each(&shared.lines(), "CUDA_VISIBLE_DEVICES"), ["3", "2", "2", "1", "0"]);
}

#[test]
fn a_node_without_gpus_refuses_a_gpu_request() {
    let sys = machine(&VM);
    let out = on(&sys, &["--gpus-per-rank", "1", "-n", "1"]).run();
    out.assert_code(255);
    let want = format!(
        "rlaunch: cannot place the ranks on {}: 1 rank asks for GPUs but there is none here",
        hostname()
    );
    assert_eq!(out.stderr_str().lines().collect::<Vec<_>>(), [want.as_str()], "{out}");
}

#[test]
fn dgx_fake_nodes_map_by_socket_alternate_sockets_and_their_gpus() {
    let sys = machine(&DGX);
    let hosts = ["--launcher", "fork", "--hosts", "n1:4,n2:4", "-n", "8"];
    let options = ["--map-by", "socket", "--bind-to", "core", "--gpus-per-rank", "1"];
    let (out, json) = reported(&sys, &[&hosts[..], &options].concat());
    let lines = out.lines();
    assert_eq!(each(&lines, "CUDA_VISIBLE_DEVICES"), ["0", "4", "1", "5", "0", "4", "1", "5"]);
    assert_eq!(each(&lines, "MPIR_CVAR_CH3_INTERFACE_HOSTNAME")[4], "n2");
    let node = ["0,112", "56,168", "1,113", "57,169"];
    assert_eq!(cpus(&json), [node, node].concat());
}

#[test]
fn ppr_per_socket_gives_each_host_that_many_ranks_a_socket() {
    let sys = machine(&DGX);
    let options = ["--launcher", "fork", "--hosts", "n1,n2", "--map-by", "ppr:2:socket"];
    let (out, json) = reported(&sys, &options);
    let hosts = each(&out.lines(), "MPIR_CVAR_CH3_INTERFACE_HOSTNAME");
    assert_eq!(hosts, ["n1", "n1", "n1", "n1", "n2", "n2", "n2", "n2"]);
    let (zero, one) = ("0-55,112-167", "56-111,168-223");
    assert_eq!(cpus(&json), [zero, zero, one, one, zero, zero, one, one]);
    // More than fit: one line naming the node and the counts.
    let over = on(&sys, &["--map-by", "ppr:2:socket", "--ppn", "5", "-n", "5"]).run();
    over.assert_code(255);
    let want = format!(
        "rlaunch: cannot place the ranks on {}: ppr:2:socket places at most 4 ranks here \
         (2 sockets), not 5",
        hostname()
    );
    assert_eq!(over.stderr_str().lines().collect::<Vec<_>>(), [want.as_str()], "{over}");
}

#[test]
fn an_allocations_gpus_are_the_only_ones_handed_out() {
    let sys = machine(&DGX);
    // Without a device cgroup: the node's own indices of the job's GPUs.
    let out =
        on(&sys, &["--gpus-per-rank", "1", "-n", "4"]).env("CUDA_VISIBLE_DEVICES", "4,5,6,7").run();
    out.assert_code(0);
    let lines = out.lines();
    assert_eq!(each(&lines, "CUDA_VISIBLE_DEVICES"), ["4", "5", "6", "7"]);
    // The allocation's numbering is left as it is: no order imposed on it.
    assert_eq!(each(&lines, "CUDA_DEVICE_ORDER"), ["unset"; 4]);
    // Slurm within a device cgroup: indices from 0, SLURM_JOB_GPUS says which they are (the
    // second socket's), so a rank on the first socket's cores is as near one as another.
    let out = on(&sys, &["--gpus-per-rank", "1", "--map-by", "socket", "-n", "2"])
        .env("CUDA_VISIBLE_DEVICES", "0,1,2,3")
        .env("SLURM_JOB_GPUS", "4,5,6,7")
        .run();
    out.assert_code(0);
    assert_eq!(each(&out.lines(), "CUDA_VISIBLE_DEVICES"), ["0", "1"]);
    let too_many =
        on(&sys, &["--gpus-per-rank", "2", "-n", "3"]).env("CUDA_VISIBLE_DEVICES", "4,5,6,7").run();
    too_many.assert_code(255);
    assert!(
        too_many.stderr_str().contains("3 ranks ask for 6 GPUs but there are 4 here"),
        "{too_many}"
    );
}

#[test]
fn map_lists_mpmd_segments_and_gpu_bind_none() {
    let sys = machine(&POLARIS);
    let out = on(&sys, &["--gpu-bind", "map:0,1,2,3", "-n", "4"]).run();
    out.assert_code(0);
    assert_eq!(each(&out.lines(), "CUDA_VISIBLE_DEVICES"), ["0", "1", "2", "3"]);
    // A coordinator with no GPU (an explicit empty set) and workers with one each.
    let out = Run::new(&[
        "-l",
        "-n",
        "1",
        "--gpus-per-rank",
        "0",
        "env",
        ":",
        "-n",
        "2",
        "--gpus-per-rank",
        "1",
        "env",
    ])
    .env("RLAUNCH_TOPOLOGY_ROOT", sys.path())
    .env_remove("CUDA_VISIBLE_DEVICES")
    .run();
    out.assert_code(0);
    // Three local ranks over 32 cores: 0-9, 10-20 (mostly NUMA 1), 21-31 (mostly NUMA 3).
    assert_eq!(each(&out.lines(), "CUDA_VISIBLE_DEVICES"), ["", "2", "0"]);
    // none: rlaunch sets no GPU variable.
    let out = on(&sys, &["--gpus-per-rank", "1", "--gpu-bind", "none", "-n", "5"]).run();
    out.assert_code(0);
    assert_eq!(each(&out.lines(), "CUDA_VISIBLE_DEVICES"), ["unset"; 5]);
}

#[test]
fn gpu_options_that_cannot_work_get_one_line() {
    let out = Run::new(&["--gpus-per-rank", "2", "--gpu-bind", "map:0,1", "-n", "1", "true"]).run();
    out.assert_code(2);
    assert_eq!(
        out.stderr_str(),
        "rlaunch: --gpu-bind map gives each rank one GPU, not 2 (--gpus-per-rank)\n"
    );
}

#[test]
fn without_gpu_options_no_gpu_variable_is_touched() {
    let sys = machine(&DGX);
    let out = on(&sys, &["-n", "2"]).env("CUDA_VISIBLE_DEVICES", "7").run();
    out.assert_code(0);
    let lines = out.lines();
    assert_eq!(each(&lines, "CUDA_VISIBLE_DEVICES"), ["7", "7"]);
    let envs: Vec<BTreeMap<String, String>> = envs_by_rank(&lines).into_values().collect();
    assert!(envs.iter().all(|e| !e.contains_key("CUDA_DEVICE_ORDER")), "{out}");
}

/// `--info` names what a proxy on this machine would see: its CPUs by unit and its GPUs by
/// vendor, as the allocation's visibility variables narrow them.
#[test]
fn info_says_what_this_node_has() {
    let this_node = |sys: &FakeSys, env: &[(&str, &str)]| {
        let mut run = Run::new(&["--info"])
            .env("RLAUNCH_TOPOLOGY_ROOT", sys.path())
            .env_remove("CUDA_VISIBLE_DEVICES")
            .env_remove("ROCR_VISIBLE_DEVICES")
            .env_remove("SLURM_JOB_GPUS");
        for (k, v) in env {
            run = run.env(k, v);
        }
        let out = run.run();
        out.assert_code(0);
        let text = out.stdout_str();
        let line = text.lines().find(|l| l.trim_start().starts_with("this node:"));
        line.unwrap_or_else(|| panic!("no `this node:` line:\n{out}")).trim().to_string()
    };
    let copy = "(a copy: RLAUNCH_TOPOLOGY_ROOT)";
    let dgx = machine(&DGX);
    assert_eq!(
        this_node(&dgx, &[]),
        format!(
            "this node:  224 CPUs (112 cores, 2 L3 caches, 2 NUMA nodes, 2 sockets) {copy}; \
             GPUs: 8 nvidia"
        )
    );
    assert_eq!(
        this_node(&dgx, &[("CUDA_VISIBLE_DEVICES", "2,5")]),
        format!(
            "this node:  224 CPUs (112 cores, 2 L3 caches, 2 NUMA nodes, 2 sockets) {copy}; \
             GPUs: 2 nvidia"
        )
    );
    assert_eq!(
        this_node(&machine(&FRONTIER), &[]),
        format!(
            "this node:  128 CPUs (64 cores, 8 L3 caches, 4 NUMA nodes, 1 socket) {copy}; \
             GPUs: 8 amd"
        )
    );
    assert_eq!(
        this_node(&machine(&VM), &[]),
        format!("this node:  2 CPUs (2 cores, 1 L3 cache, 1 NUMA node, 1 socket) {copy}; no GPUs")
    );
}
