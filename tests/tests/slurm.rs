//! A real Slurm cluster (tests/cluster/slurm.sh: munged, slurmctld and one slurmd per fake
//! node n1..n3, each in its own network and UTS namespaces) and Slurm's own clients against it:
//! proof that the cluster the launcher's Slurm support will be tested on is real. Needs root.
//!
//! One test function brings the cluster up once, runs every scenario in turn, and takes it
//! down again on every path out (the cluster's Drop), passing or failing; on success it also
//! checks that nothing of the cluster is left.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use rlaunch_tests::mpi::{parse_hello, CProgram, HelloLine};
use rlaunch_tests::output::{rlaunch_lines, sorted, source_line, stack_branch};
use rlaunch_tests::slurm::SlurmCluster;

const NODES: usize = 3;
/// Each Slurm command's bound: the slowest, `sbatch --wait` of a one-line script, took 4.0 s
/// here, and 4.1 s beside two busy loops (`tools/suite-under-load.sh`'s): 5 times that.
const WAIT: Duration = Duration::from_secs(20);
/// The batch script of three framework jobs (an env, torch's and JAX's 5 ranks, each a Python
/// importing its framework on 2 cores): 12.1 s beside one busy loop, 16.1 s beside two, past 20 s
/// in CI's suite; the frameworks tests' own bound (tests/tests/frameworks.rs), 7 times the
/// loaded figure.
const FRAMEWORKS: Duration = Duration::from_secs(120);

/// A scenario run on the shared cluster, and its name for the timing lines.
type Step = (&'static str, fn(&SlurmCluster));

#[test]
fn slurm_runs_steps_allocations_batch_jobs_and_mpi_and_cancels_cleanly() {
    let started = Instant::now();
    let cluster = SlurmCluster::up(NODES);
    eprintln!("slurm cluster up in {:?}", started.elapsed());
    assert_eq!(cluster.running_daemons().len(), 2 + NODES, "munged, slurmctld, a slurmd a node");
    let steps: [Step; 21] = [
        ("srun", srun_runs_a_task_on_each_node),
        ("salloc", salloc_exports_the_allocation),
        ("sbatch", sbatch_wait_runs_a_batch_script_on_the_first_node),
        ("mpich", mpich_over_pmi2_spans_the_nodes),
        ("scancel", scancel_leaves_no_process_of_the_job),
        ("rlaunch", rlaunch_inside_salloc_starts_its_proxies_with_one_srun),
        ("rlaunch-bcast", files_are_broadcast_to_the_proxies_srun_started),
        ("rlaunch-openmpi", open_mpi_inside_salloc_gets_a_pmix_server_on_every_node),
        ("rlaunch-hang", a_hung_job_in_an_allocation_names_the_missing_rank),
        ("rlaunch-spawn", open_mpi_spawns_onto_nodes_of_the_allocation_that_had_no_proxy),
        ("rlaunch-respawn", a_spawn_onto_a_node_whose_proxy_ended_starts_another_there),
        ("rlaunch-sbatch", rlaunch_in_a_batch_script_needs_no_host_options),
        ("rlaunch-frameworks", frameworks_in_a_batch_script_need_no_host_options),
        ("rlaunch-nested", rlaunch_inside_a_step_overlaps_it_instead_of_hanging),
        ("rlaunch-scancel", scancel_of_an_rlaunch_job_leaves_nothing),
        ("rlaunch-kill", killing_rlaunch_in_an_allocation_leaves_nothing),
        ("rlaunch-strangers", strangers_at_the_listener_get_nothing_and_never_disturb_the_job),
        ("rlaunch-tree", the_proxies_srun_starts_form_a_tree_not_a_star),
        ("rlaunch-lost", a_killed_proxy_in_an_allocation_ends_the_job_naming_its_node),
        ("rlaunch-stopped", a_stopped_proxy_in_an_allocation_is_ended_with_its_step),
        ("rlaunch-restart", a_failed_rank_in_an_allocation_restarts_the_job_with_a_new_srun),
    ];
    for (name, step) in steps {
        let step_started = Instant::now();
        cluster.wait_idle(WAIT);
        step(&cluster);
        eprintln!("slurm {name}: {:?}", step_started.elapsed());
    }
    let stopping = Instant::now();
    cluster.down();
    eprintln!("slurm cluster down in {:?}", stopping.elapsed());
}

fn srun_runs_a_task_on_each_node(cluster: &SlurmCluster) {
    let out = cluster.run("srun", &["-N3", "-n3", "hostname"]).timeout(WAIT).run();
    out.assert_code(0);
    assert_eq!(sorted(out.lines()), cluster.nodes(), "{out}");
}

fn salloc_exports_the_allocation(cluster: &SlurmCluster) {
    // salloc runs its command on the head, with the allocation in its environment.
    let out = cluster.run("salloc", &["-N3", "-n5", "env"]).timeout(WAIT).run();
    out.assert_code(0);
    let lines = out.lines();
    let env: BTreeMap<&str, &str> = lines.iter().filter_map(|l| l.split_once('=')).collect();
    for (key, want) in [
        ("SLURM_JOB_NODELIST", "n[1-3]"),
        ("SLURM_TASKS_PER_NODE", "2(x2),1"),
        ("SLURM_JOB_CPUS_PER_NODE", "2(x2),1"),
        ("SLURM_NTASKS", "5"),
        ("SLURM_JOB_NUM_NODES", "3"),
        ("SLURM_CLUSTER_NAME", "rls"),
    ] {
        assert_eq!(env.get(key).copied(), Some(want), "{key}: {out}");
    }
    let job_id = env.get("SLURM_JOB_ID").unwrap_or_else(|| panic!("no SLURM_JOB_ID: {out}"));
    assert!(job_id.parse::<u32>().is_ok_and(|id| id > 0), "SLURM_JOB_ID={job_id}");
}

fn sbatch_wait_runs_a_batch_script_on_the_first_node(cluster: &SlurmCluster) {
    let script = cluster.dir().join("batch.sh");
    let output = cluster.dir().join("batch.out");
    std::fs::write(
        &script,
        "#!/bin/sh\necho \"batch on $(hostname) nodes $SLURM_JOB_NUM_NODES\"\nsrun hostname | sort\n",
    )
    .unwrap();
    let out = cluster
        .run("sbatch", &["--wait", "-N3", "-o", output.to_str().unwrap(), script.to_str().unwrap()])
        .timeout(WAIT)
        .run();
    out.assert_code(0);
    assert!(out.stdout_str().starts_with("Submitted batch job "), "{out}");
    let text = std::fs::read_to_string(&output).unwrap_or_else(|e| panic!("{e}: {out}"));
    assert_eq!(text, "batch on n1 nodes 3\nn1\nn2\nn3\n");
}

fn mpich_over_pmi2_spans_the_nodes(cluster: &SlurmCluster) {
    let hello = CProgram::Hello.path_str();
    let out = cluster
        .run("srun", &["--mpi=pmi2", "-N3", "-n6", &hello, "6"])
        .env("HWLOC_COMPONENTS", "-pci,-linuxio")
        .timeout(WAIT)
        .run();
    out.assert_code(0);
    let mut ranks: Vec<HelloLine> = out
        .lines()
        .iter()
        .map(|l| parse_hello(l).unwrap_or_else(|| panic!("unexpected line {l:?}: {out}")))
        .collect();
    ranks.sort_by_key(|h| h.rank);
    // Block distribution: two ranks a node, in node order; one world of 6, not 6 singletons.
    let want: Vec<HelloLine> = (0..6)
        .map(|rank| HelloLine { rank, size: 6, sum: 15, name: format!("n{}", rank / 2 + 1) })
        .collect();
    assert_eq!(ranks, want, "{out}");
}

fn scancel_leaves_no_process_of_the_job(cluster: &SlurmCluster) {
    let name = format!("rls-cancel-{}", std::process::id());
    let mut job = cluster
        .run(
            "srun",
            &[
                "-N3",
                "-n3",
                "-J",
                &name,
                "sh",
                "-c",
                "echo ready $SLURMD_NODENAME $(hostname); exec sleep 600",
            ],
        )
        .spawn();
    let mut ready: Vec<String> =
        (0..3).map(|_| job.wait_for_line(|l| l.starts_with("ready "), WAIT)).collect();
    ready.sort();
    assert_eq!(ready, ["ready n1 n1", "ready n2 n2", "ready n3 n3"]);
    // The tag travels with srun's environment into every task: one sleep a node, once each
    // shell that said ready has become its sleep (a moment later: the last one was seen
    // still a shell, 1 run in 4).
    let sleeps = || {
        rlaunch_tests::tagged_processes(job.tag())
            .into_iter()
            .filter(|p| p.comm == "sleep" && p.is_running())
            .count()
    };
    let deadline = Instant::now() + WAIT;
    while sleeps() < 3 && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(20));
    }
    assert_eq!(sleeps(), 3, "{:?}", rlaunch_tests::tagged_processes(job.tag()));

    let cancelled = Instant::now();
    let scancel = cluster.run("scancel", &["-n", &name]).timeout(WAIT).run();
    scancel.assert_code(0);
    let out = job.wait(WAIT);
    assert_ne!(out.code, Some(0), "srun of a cancelled job: {out}");
    // srun says so in one of two ways, depending on whether slurmstepd's notice or the
    // step's end reaches it first.
    let err = out.stderr_str();
    assert!(err.contains("CANCELLED") || err.contains("srun: Job step aborted"), "{out}");
    out.tag.wait_until_none(Duration::from_secs(10)).unwrap_or_else(|left| {
        panic!("left on the nodes {:?} after scancel: {left:?}", cancelled.elapsed())
    });
    // COMPLETING comes first while slurmctld hears from the nodes; CANCELLED is where it ends.
    let deadline = Instant::now() + WAIT;
    loop {
        let state = cluster.run("squeue", &["-h", "-t", "all", "-n", &name, "-o", "%T"]).run();
        if state.lines() == ["CANCELLED"] {
            break;
        }
        assert_eq!(state.lines(), ["COMPLETING"], "{state}");
        assert!(Instant::now() < deadline, "still completing after {WAIT:?}: {state}");
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// The head's address on the cluster's network (tests/cluster/slurm.sh). The head does not
/// resolve the nodes' names, as at many sites (slurm.conf's `NodeAddr` alone has them): rlaunch
/// finds the route to a node through Slurm's `NodeAddr`, and listens here, with no option.
/// rlaunch in a batch script runs on the first node, where the names do resolve.
const HEAD_IP: &str = "10.214.0.1";

fn rlaunch_inside_salloc_starts_its_proxies_with_one_srun(cluster: &SlurmCluster) {
    let hello = CProgram::Hello.path_str();
    let rlaunch = rlaunch_tests::rlaunch().to_string_lossy().into_owned();
    let options = ["--rmk", "slurm", "--launcher", "slurm"];
    let args = [&["-N3", "-n6", rlaunch.as_str()][..], &options, &[hello.as_str(), "6"]].concat();
    let out =
        cluster.run("salloc", &args).env("HWLOC_COMPONENTS", "-pci,-linuxio").timeout(WAIT).run();
    out.assert_code(0);
    let mut ranks: Vec<HelloLine> = out.lines().iter().filter_map(|l| parse_hello(l)).collect();
    ranks.sort_by_key(|h| h.rank);
    // The allocation's 2 tasks a node, in node order: one world of 6 across the 3 nodes.
    let want: Vec<HelloLine> = (0..6)
        .map(|rank| HelloLine { rank, size: 6, sum: 15, name: format!("n{}", rank / 2 + 1) })
        .collect();
    assert_eq!(ranks, want, "{out}");
    // Each rank's parent is its node's proxy, whose parent is Slurm's step daemon (Debian
    // names it slurmstepd-wlm): scancel, time limits and accounting cover every rank.
    let lineage = "p=$(cut -d' ' -f4 /proc/$PPID/stat); \
                   echo lineage $(hostname) $(cat /proc/$PPID/comm) $(cat /proc/$p/comm)";
    let args = [&["-N3", "-n3", rlaunch.as_str()][..], &options, &["sh", "-c", lineage]].concat();
    let out = cluster.run("salloc", &args).timeout(WAIT).run();
    out.assert_code(0);
    let lines = sorted(out.lines().into_iter().filter(|l| l.starts_with("lineage ")));
    let want: Vec<String> =
        (1..=3).map(|i| format!("lineage n{i} rlaunch-proxy slurmstepd-wlm")).collect();
    assert_eq!(lines, want, "{out}");
}

/// `--bcast` inside an allocation: the proxies srun started dial back, and the files reach
/// each over the encrypted links of the tree they form (width 1 here: two levels below the
/// top), each node's copy compared with the original by its rank.
fn files_are_broadcast_to_the_proxies_srun_started(cluster: &SlurmCluster) {
    let data: Vec<u8> =
        (0..(1 << 20) + 99u32).map(|i| (i.wrapping_mul(40503) >> 7) as u8).collect();
    let file = cluster.dir().join("bcast-data.bin");
    std::fs::write(&file, &data).unwrap();
    let nodes = cluster.dir().join("bcast-nodes");
    std::fs::create_dir_all(&nodes).unwrap();
    let check = format!(
        "cmp -s {} \"$RLAUNCH_BCAST_DIR/bcast-data.bin\" && echo $(hostname) ok",
        file.display()
    );
    let rlaunch = rlaunch_tests::rlaunch().to_string_lossy().into_owned();
    let args = [
        "-N3",
        "-n3",
        &rlaunch,
        "--rmk",
        "slurm",
        "--launcher",
        "slurm",
        "--tree-width",
        "1",
        "--bcast",
        file.to_str().unwrap(),
        "--bcast-dir",
        nodes.to_str().unwrap(),
        "sh",
        "-c",
        &check,
    ];
    let out = cluster.run("salloc", &args).timeout(WAIT).run();
    out.assert_code(0);
    let lines = sorted(out.lines().into_iter().filter(|l| l.ends_with(" ok")));
    assert_eq!(lines, ["n1 ok", "n2 ok", "n3 ok"], "{out}");
    let left: Vec<_> = std::fs::read_dir(&nodes).unwrap().collect();
    assert!(left.is_empty(), "copies left: {left:?}");
    std::fs::remove_dir(&nodes).unwrap();
    std::fs::remove_file(&file).unwrap();
}

/// The hang report inside an allocation (docs/hangs.md): the proxies under slurmstepd, dialed
/// back over the encrypted links, answer rlaunch's survey with their ranks. Rank 3 (on n2)
/// never calls MPI_Init; the 5 others wait in its fence.
fn a_hung_job_in_an_allocation_names_the_missing_rank(cluster: &SlurmCluster) {
    let hang = CProgram::Hang.path_str();
    let rlaunch = rlaunch_tests::rlaunch().to_string_lossy().into_owned();
    // The rlaunch step above (two 6-rank jobs, each through srun) takes 0.5 s here: 6 s
    // leaves every rank in MPI_Init's fence, or known out of it, on a loaded machine too.
    let timeout = "6";
    let options = ["--launcher", "slurm", "--timeout", timeout];
    let args =
        [&["-N3", "-n6", rlaunch.as_str()][..], &options, &[hang.as_str(), "3", "-1"]].concat();
    let out = cluster.run("salloc", &args).timeout(WAIT).run();
    out.assert_code(124);
    let pid = out.lines().iter().find_map(|l| l.strip_prefix("pid 3 ").map(str::to_owned));
    let pid = pid.unwrap_or_else(|| panic!("rank 3 said no pid: {out}"));
    let err = out.stderr_str();
    let said = rlaunch_lines(&err);
    assert_eq!(
        said[0],
        format!("rlaunch: where the job was at its timeout ({timeout} s):"),
        "{out}"
    );
    let missing = format!("fence 1 (PMI): 5 of 6 ranks waiting; missing: rank 3 (pid {pid} on n2)");
    assert_eq!(said[1], format!("rlaunch:   {missing}"), "{out}");
    // Rank 3's stack, read by its proxy under slurmstepd: in main, where it pauses.
    let pause = source_line("c/hang.c", "pause();");
    let main = format!("main ({}/c/hang.c:{pause})", env!("CARGO_MANIFEST_DIR"));
    assert_eq!(stack_branch(&said, "+ rank 3:")[0], main, "{out}");
    let last = format!("rlaunch: the job timed out after {timeout} s and was killed");
    assert_eq!(said.last().copied(), Some(last.as_str()), "{out}");
}

fn open_mpi_inside_salloc_gets_a_pmix_server_on_every_node(cluster: &SlurmCluster) {
    let hello = CProgram::OmpiHello.path_str();
    let rlaunch = rlaunch_tests::rlaunch().to_string_lossy().into_owned();
    let options = ["--launcher", "slurm"];
    let args = [&["-N3", "-n6", rlaunch.as_str()][..], &options, &[hello.as_str(), "6"]].concat();
    let out = cluster.run("salloc", &args).timeout(WAIT).run();
    out.assert_code(0);
    let want: Vec<HelloLine> = (0..6)
        .map(|rank| HelloLine { rank, size: 6, sum: 15, name: format!("n{}", rank / 2 + 1) })
        .collect();
    assert_eq!(hello_lines(&out.stdout_str()), want, "{out}");
}

fn open_mpi_spawns_onto_nodes_of_the_allocation_that_had_no_proxy(cluster: &SlurmCluster) {
    // One rank on n1 of three nodes with a slot each: its two children go after its slot,
    // round the allocation, to n2 and n3, where no proxy runs yet. Each gets one, started by
    // an srun of its own that overlaps the job's step, and dialing back; the children then
    // talk to their parent across the nodes.
    let spawn = CProgram::OmpiSpawn.path_str();
    let rlaunch = rlaunch_tests::rlaunch().to_string_lossy().into_owned();
    let report = cluster.dir().join("spawn-report.json");
    let report = report.to_str().unwrap();
    let args = ["-N3", "-n3", &rlaunch, "--report", report, "-n", "1", &spawn, "0"];
    let out = cluster.run("salloc", &args).timeout(WAIT).run();
    out.assert_code(0);
    let want = [
        "child 0 of 2 got 100 from 0",
        "child 1 of 2 got 100 from 0",
        "parent 0 heard 0: 100",
        "parent 0 heard 1: 101",
        "parent 0 spawned 2",
    ];
    assert_eq!(sorted(out.lines()), want, "{out}");
    assert_eq!(rlaunch_tests::output::report_hosts(std::path::Path::new(report), 1), ["n2", "n3"]);
    assert!(!out.stderr_str().contains("rlaunch:"), "rlaunch had something to say: {out}");
}

fn a_spawn_onto_a_node_whose_proxy_ended_starts_another_there(cluster: &SlurmCluster) {
    // Width 1: rlaunch -> n1 -> n2 -> n3. Ranks 1 and 2 (on n2 and n3) end at once, and
    // n3's proxy with them; only then does rank 0 (on n1) spawn three (PMI-2) onto n3. The
    // new proxy there comes from an srun that overlaps the first step, which holds n3's CPU
    // until it ends, and it dials in as rlaunch's own child, not n2's as the first one was.
    let rlaunch = rlaunch_tests::rlaunch().to_string_lossy().into_owned();
    let client = rlaunch_tests::spawn_client();
    let go = cluster.dir().join("respawn-go");
    let go = go.to_str().unwrap();
    let waits =
        format!("while [ ! -e {go} ]; do sleep 0.05; done; exec /usr/bin/python3 {client} 2");
    let args = ["-N3", "-n3", &rlaunch, "-vv", "--tree-width", "1", "-n", "1", "sh", "-c"];
    let args = [&args[..], &[waits.as_str(), ":", "-n", "2", "true"]].concat();
    let mut job = cluster.run("salloc", &args).env("SPAWN_INFO", "host=n3").timeout(WAIT).spawn();
    job.wait_for_stderr_line(|l| l.contains("sending a proxy to its parent host=n3"), WAIT);
    let on_n3 = |p: &rlaunch_tests::TaggedProcess| {
        let environ = std::fs::read(format!("/proc/{}/environ", p.pid)).unwrap_or_default();
        p.comm == "rlaunch-proxy" && environ.split(|&b| b == 0).any(|v| v == b"SLURMD_NODENAME=n3")
    };
    let deadline = Instant::now() + WAIT;
    while rlaunch_tests::tagged_processes(job.tag()).iter().any(|p| p.is_running() && on_n3(p)) {
        assert!(Instant::now() < deadline, "n3's proxy still runs after {WAIT:?}");
        std::thread::sleep(Duration::from_millis(20));
    }
    std::fs::write(go, "").unwrap();
    let out = job.wait(WAIT);
    out.assert_code(0);
    let lines = out.lines();
    assert!(lines.iter().any(|l| l.starts_with("parent 0 rc=0 ")), "{out}");
    let children = sorted(lines.into_iter().filter(|l| l.starts_with("child ")));
    assert_eq!(children.len(), 3, "{out}");
    for (c, line) in children.iter().enumerate() {
        let placed = line.starts_with(&format!("child {c} of 3 ")) && line.contains(" on n3 map ");
        assert!(placed, "{line}: {out}");
    }
    let err = out.stderr_str();
    assert!(err.contains("starting a proxy during the run host=n3"), "{out}");
    assert!(!err.lines().any(|l| l.starts_with("rlaunch:")), "{out}");
}

/// Ranks 0..n of a hello run over the allocation `2(x2),1`, in node order.
fn hello_over_2_2_1(n: u32) -> Vec<HelloLine> {
    let node = |rank: u32| format!("n{}", rank / 2 + 1);
    (0..n)
        .map(|rank| HelloLine { rank, size: n, sum: (n * (n - 1) / 2) as u64, name: node(rank) })
        .collect()
}

fn hello_lines(text: &str) -> Vec<HelloLine> {
    let mut ranks: Vec<HelloLine> = text.lines().filter_map(parse_hello).collect();
    ranks.sort_by_key(|h| h.rank);
    ranks
}

fn rlaunch_in_a_batch_script_needs_no_host_options(cluster: &SlurmCluster) {
    // The script runs on n1, which resolves the nodes' names: rlaunch finds the allocation
    // and where to listen by itself.
    let script = cluster.dir().join("rlaunch-batch.sh");
    let output = cluster.dir().join("rlaunch-batch.out");
    let hello = CProgram::Hello.path_str();
    let rlaunch = rlaunch_tests::rlaunch().to_string_lossy().into_owned();
    std::fs::write(&script, format!("#!/bin/sh\nexec {rlaunch} {hello} 5\n")).unwrap();
    let out = cluster
        .run(
            "sbatch",
            &["--wait", "-N3", "-n5", "-o", output.to_str().unwrap(), script.to_str().unwrap()],
        )
        .env("HWLOC_COMPONENTS", "-pci,-linuxio")
        .timeout(WAIT)
        .run();
    out.assert_code(0);
    let text = std::fs::read_to_string(&output).unwrap_or_else(|e| panic!("{e}: {out}"));
    assert_eq!(hello_lines(&text), hello_over_2_2_1(5), "{text}");
    assert!(!text.contains("rlaunch:"), "rlaunch had something to say: {text}");
}

/// PyTorch and JAX jobs in a batch script, with no host options and no wrapper: each rank has
/// the Slurm step variables of its place and torchrun's, rank 0's proxy (on n1) chooses the
/// rendezvous, gloo's all_reduce spans the three nodes, and JAX's `initialize()` with no
/// arguments (its own Slurm detection) finds the coordinator rlaunch chose.
fn frameworks_in_a_batch_script_need_no_host_options(cluster: &SlurmCluster) {
    let script = cluster.dir().join("torch-batch.sh");
    let output = cluster.dir().join("torch-batch.out");
    let rlaunch = rlaunch_tests::rlaunch().to_string_lossy().into_owned();
    let (rankprog, job) = (rlaunch_tests::rankprog_str(), rlaunch_tests::torch_job());
    let (jax, jax_job) = (rlaunch_tests::venv_python("jax"), rlaunch_tests::jax_job());
    let text = format!(
        "#!/bin/sh\n{rlaunch} -l {rankprog} env\n{rlaunch} /usr/bin/python3 {job} allreduce\n\
         exec {rlaunch} {jax} {jax_job} auto\n"
    );
    std::fs::write(&script, text).unwrap();
    let args = ["--wait", "-N3", "-n5", "-o", output.to_str().unwrap(), script.to_str().unwrap()];
    let out = cluster.run("sbatch", &args).timeout(FRAMEWORKS).run();
    out.assert_code(0);
    let text = std::fs::read_to_string(&output).unwrap_or_else(|e| panic!("{e}: {out}"));
    let lines: Vec<String> = text.lines().map(String::from).collect();
    // The ranks' `-l` lines (srun notes its own on the script's stderr; gloo's `[Gloo] ...`).
    let tagged: Vec<String> = lines
        .iter()
        .filter(|l| {
            l.strip_prefix('[').is_some_and(|r| r.starts_with(|c: char| c.is_ascii_digit()))
        })
        .cloned()
        .collect();
    let envs = rlaunch_tests::output::envs_by_rank(&tagged);
    for rank in 0..5u32 {
        let var = |name: &str| envs[&rank].get(name).cloned().unwrap_or_default();
        let want = [
            ("SLURM_PROCID", rank.to_string()),
            ("SLURM_LOCALID", (rank % 2).to_string()),
            ("SLURM_NODEID", (rank / 2).to_string()),
            ("SLURM_NTASKS", "5".to_string()),
            ("SLURM_STEP_NUM_NODES", "3".to_string()),
            ("SLURM_STEP_NODELIST", "n1,n2,n3".to_string()),
            ("RANK", rank.to_string()),
            ("MASTER_ADDR", "10.214.0.11".to_string()),
        ];
        for (name, value) in want {
            assert_eq!(var(name), value, "rank {rank} {name}: {text}");
        }
    }
    let torch: Vec<&String> = lines.iter().filter(|l| l.starts_with("rank ")).collect();
    let want: Vec<String> = (0..5)
        .map(|r| {
            let local_size = if r < 4 { 2 } else { 1 };
            format!("rank {r} of 5 local {} of {local_size} group {} of 3 sum 10", r % 2, r / 2)
        })
        .collect();
    assert_eq!(sorted(torch.into_iter().cloned()), want, "{text}");
    let jax: Vec<&String> = lines.iter().filter(|l| l.starts_with("process ")).collect();
    // Rank 0's node's address, the port its proxy chose (not JAX's guess from the job id).
    let coordinator = jax.first().and_then(|l| l.split(" coordinator ").nth(1)).unwrap_or("");
    assert!(coordinator.starts_with("10.214.0.11:"), "{text}");
    let want: Vec<String> = (0..5)
        .map(|r| format!("process {r} of 5 sum 15 gathered 0,1,2,3,4 coordinator {coordinator}"))
        .collect();
    assert_eq!(sorted(jax.into_iter().cloned()), want, "{text}");
    assert!(!text.contains("rlaunch:"), "rlaunch had something to say: {text}");
}

fn rlaunch_inside_a_step_overlaps_it_instead_of_hanging(cluster: &SlurmCluster) {
    // `srun -n1 rlaunch`: a plain srun inside a step waits for that step's resources for
    // ever; rlaunch's proxies overlap it, over the job's whole allocation.
    let hello = CProgram::Hello.path_str();
    let rlaunch = rlaunch_tests::rlaunch().to_string_lossy().into_owned();
    let out = cluster
        .run("salloc", &["-N3", "-n5", "srun", "-N1", "-n1", &rlaunch, &hello, "5"])
        .env("HWLOC_COMPONENTS", "-pci,-linuxio")
        .timeout(WAIT)
        .run();
    out.assert_code(0);
    assert_eq!(hello_lines(&out.stdout_str()), hello_over_2_2_1(5), "{out}");
}

/// salloc running rlaunch over 3 nodes, a rank a node, each rank ready then waiting; the
/// job (named `name`) and the ready ranks' pids.
fn waiting_rlaunch_job(cluster: &SlurmCluster, name: &str) -> (rlaunch_tests::Job, Vec<i32>) {
    waiting_rlaunch_job_with(cluster, name, &[])
}

/// [`waiting_rlaunch_job`], rlaunch given `options` too.
fn waiting_rlaunch_job_with(
    cluster: &SlurmCluster,
    name: &str,
    options: &[&str],
) -> (rlaunch_tests::Job, Vec<i32>) {
    let rlaunch = rlaunch_tests::rlaunch().to_string_lossy().into_owned();
    let rankprog = rlaunch_tests::rankprog_str();
    let args = ["-N3", "-n3", "-J", name, &rlaunch];
    let args = [&args[..], options, &[rankprog.as_str(), "ready", "sleep", "600"]].concat();
    let mut job = cluster.run("salloc", &args).timeout(WAIT).spawn();
    let ready = job.wait_for_ready(3, WAIT);
    (job, ready.iter().map(|(_, pid)| pid.as_raw()).collect())
}

fn scancel_of_an_rlaunch_job_leaves_nothing(cluster: &SlurmCluster) {
    let name = format!("rls-rlaunch-cancel-{}", std::process::id());
    let (job, ranks) = waiting_rlaunch_job(cluster, &name);
    assert_eq!(ranks.len(), 3);
    let cancelled = Instant::now();
    cluster.run("scancel", &["-n", &name]).timeout(WAIT).run().assert_code(0);
    let out = job.wait(WAIT);
    assert_ne!(out.code, Some(0), "a cancelled job: {out}");
    out.tag.wait_until_none(Duration::from_secs(10)).unwrap_or_else(|left| {
        panic!("left on the nodes {:?} after scancel: {left:?}", cancelled.elapsed())
    });
}

fn killing_rlaunch_in_an_allocation_leaves_nothing(cluster: &SlurmCluster) {
    let name = format!("rls-rlaunch-kill-{}", std::process::id());
    let (job, _) = waiting_rlaunch_job(cluster, &name);
    let rlaunch = rlaunch_tests::tagged_processes(job.tag())
        .into_iter()
        .find(|p| p.comm == "rlaunch")
        .unwrap_or_else(|| {
            panic!("no rlaunch among {:?}", rlaunch_tests::tagged_processes(job.tag()))
        });
    let killed = Instant::now();
    nix::sys::signal::kill(rlaunch.pid, nix::sys::signal::Signal::SIGKILL).unwrap();
    let out = job.wait(WAIT);
    out.tag.wait_until_none(Duration::from_secs(10)).unwrap_or_else(|left| {
        panic!("left on the nodes {:?} after kill -9 of rlaunch: {left:?}", killed.elapsed())
    });
    let _ = out;
}

/// Connects to `address`, sends `bytes` (as much as the peer takes) and returns what came
/// back before the peer closed, and when it closed.
fn stranger(address: std::net::SocketAddr, bytes: Vec<u8>) -> (Vec<u8>, Duration) {
    use std::io::{Read, Write};
    let start = Instant::now();
    let mut stream = std::net::TcpStream::connect(address).unwrap();
    let _ = stream.write_all(&bytes);
    stream.set_read_timeout(Some(Duration::from_secs(15))).unwrap();
    let mut got = Vec::new();
    let _ = stream.read_to_end(&mut got);
    (got, start.elapsed())
}

fn strangers_at_the_listener_get_nothing_and_never_disturb_the_job(cluster: &SlurmCluster) {
    // Width 1 over 3 nodes: rlaunch, n1's proxy and n2's proxy each listen.
    let rlaunch = rlaunch_tests::rlaunch().to_string_lossy().into_owned();
    let rankprog = rlaunch_tests::rankprog_str();
    let args = ["-N3", "-n3", &rlaunch, "-vv", "--tree-width", "1"];
    let args = [&args[..], &[rankprog.as_str(), "ready", "wait-signal", "echo", "done"]].concat();
    let mut job = cluster.run("salloc", &args).timeout(WAIT).spawn();
    let address_in = |line: &str| -> std::net::SocketAddr {
        line.split_whitespace()
            .find_map(|w| w.strip_prefix("address="))
            .and_then(|a| a.parse().ok())
            .unwrap_or_else(|| panic!("no address in {line:?}"))
    };
    let ours = address_in(&job.wait_for_stderr_line(|l| l.contains("listening for proxies"), WAIT));
    assert_eq!(ours.ip().to_string(), HEAD_IP, "listening on {ours}, not the wildcard");
    let mut listeners = vec![ours];
    for _ in 0..2 {
        let line =
            job.wait_for_stderr_line(|l| l.contains("a proxy listens for its children"), WAIT);
        let theirs = address_in(&line);
        // An interior proxy listens on its end of its link to its parent: an address of its
        // node on the cluster's network, not the wildcard, found without a name.
        let ip = theirs.ip().to_string();
        assert!(ip.starts_with("10.214.0.") && ip != HEAD_IP, "a proxy listens on {theirs}");
        listeners.push(theirs);
    }
    let ready = job.wait_for_ready(3, WAIT);

    // At every listener: a peer that connects and stalls, garbage, HTTP, 70 KB of noise, and
    // a wrong-secret handshake (the first Noise message, 48 bytes, whose MAC cannot verify
    // under this job's secret): each gets not one byte back and is dropped within the
    // handshake's 5 s. And a port scan: connect, close.
    let noise: Vec<u8> =
        (0..70_000u32).map(|i| (i.wrapping_mul(2_654_435_761) >> 11) as u8).collect();
    let mut wrong_secret = vec![0, 48];
    wrong_secret.extend((0..48u8).map(|i| i.wrapping_mul(37)));
    let visits: Vec<Vec<u8>> = vec![
        Vec::new(),
        b"\x00\x01garbage".to_vec(),
        b"GET / HTTP/1.1\r\nHost: n1\r\n\r\n".to_vec(),
        noise,
        wrong_secret,
    ];
    let mut threads = Vec::new();
    for &address in &listeners {
        for bytes in &visits {
            let bytes = bytes.clone();
            threads.push(std::thread::spawn(move || stranger(address, bytes)));
        }
        drop(std::net::TcpStream::connect(address).unwrap());
    }
    // A real proxy with the wrong secret is refused.
    let wrong = std::process::Command::new(rlaunch_tests::proxy())
        .env(rlaunch_tests::TAG_VAR, job.tag())
        .env("RLAUNCH_PARENT", ours.to_string())
        .env("RLAUNCH_JOB_SECRET", "00".repeat(32))
        .output()
        .unwrap();
    assert_eq!(wrong.status.code(), Some(1), "{wrong:?}");
    let said = String::from_utf8_lossy(&wrong.stderr);
    assert!(said.contains(&format!("cannot reach rlaunch at {ours}")), "{said}");
    for thread in threads {
        let (got, after) = thread.join().unwrap();
        assert!(got.is_empty(), "a stranger got {} bytes", got.len());
        assert!(after < Duration::from_secs(8), "a stranger was kept {after:?}");
    }

    // The job goes on as if nothing happened.
    for (_, pid) in &ready {
        nix::sys::signal::kill(*pid, nix::sys::signal::Signal::SIGUSR1).unwrap();
    }
    let out = job.wait(WAIT);
    out.assert_code(0);
    let lines = out.lines();
    assert_eq!(lines.iter().filter(|l| *l == "got SIGUSR1").count(), 3, "{out}");
    assert_eq!(lines.iter().filter(|l| *l == "done").count(), 3, "{out}");
    let err = out.stderr_str();
    let dropped = err.lines().filter(|l| l.contains("dropped a connection")).count();
    assert_eq!(dropped, 3 * 6 + 1, "each stranger is logged once, by its listener: {err}");
    assert!(!err.lines().any(|l| l.starts_with("rlaunch:")), "{err}");
}

fn the_proxies_srun_starts_form_a_tree_not_a_star(cluster: &SlurmCluster) {
    // Width 1 over 3 nodes: rlaunch -> n1 -> n2 -> n3. Every proxy dials rlaunch first;
    // n2 and n3 are sent to their parents' listeners once those say where they listen.
    let hello = CProgram::Hello.path_str();
    let rlaunch = rlaunch_tests::rlaunch().to_string_lossy().into_owned();
    // Listening on the cluster bridge, named as Hydra users name it.
    let options = ["-vv", "--tree-width", "1", "-iface", "rlsbr0"];
    let args = [&["-N3", "-n6", rlaunch.as_str()][..], &options, &[hello.as_str(), "6"]].concat();
    let out =
        cluster.run("salloc", &args).env("HWLOC_COMPONENTS", "-pci,-linuxio").timeout(WAIT).run();
    out.assert_code(0);
    assert_eq!(hello_lines(&out.stdout_str()), hello_over_2_2_1_of(6), "{out}");
    let err = out.stderr_str();
    let logged = |what: &str| {
        let mut hosts: Vec<String> = err
            .lines()
            .filter(|l| l.contains(what))
            .filter_map(|l| l.split_whitespace().find_map(|w| w.strip_prefix("host=")))
            .map(String::from)
            .collect();
        hosts.sort();
        hosts
    };
    assert_eq!(logged("sending a proxy to its parent"), ["n2", "n3"], "{err}");
    let listening = err.lines().filter(|l| l.contains("a proxy listens for its children")).count();
    assert_eq!(listening, 2, "n1 and n2 listen: {err}");
}

/// Ranks 0..n over 3 nodes with 2 slots each: hello lines two a node, in node order.
fn hello_over_2_2_1_of(n: u32) -> Vec<HelloLine> {
    hello_over_2_2_1(n)
}

/// The proxy of the ready rank on `node`: the parent of one of `ranks`.
fn proxy_on(node: &str, ranks: &[i32]) -> i32 {
    let var = format!("SLURMD_NODENAME={node}");
    ranks
        .iter()
        .map(|&rank| rlaunch_tests::procfs::parent_pid(rank))
        .find(|&proxy| {
            let environ = std::fs::read(format!("/proc/{proxy}/environ")).unwrap_or_default();
            environ.split(|&b| b == 0).any(|v| v == var.as_bytes())
        })
        .unwrap_or_else(|| panic!("no proxy on {node} among the ranks' parents"))
}

fn a_killed_proxy_in_an_allocation_ends_the_job_naming_its_node(cluster: &SlurmCluster) {
    let name = format!("rls-rlaunch-lost-{}", std::process::id());
    let (job, ranks) = waiting_rlaunch_job(cluster, &name);
    let proxy = proxy_on("n2", &ranks);
    let killed = Instant::now();
    nix::sys::signal::kill(nix::unistd::Pid::from_raw(proxy), nix::sys::signal::Signal::SIGKILL)
        .unwrap();
    let out = job.wait(WAIT);
    out.assert_code(255);
    let err = out.stderr_str();
    assert!(err.contains("rlaunch: lost proxy on n2 ("), "{out}");
    out.tag.wait_until_none(Duration::from_secs(10)).unwrap_or_else(|left| {
        panic!("left on the nodes {:?} after its proxy was killed: {left:?}", killed.elapsed())
    });
}

/// A proxy stopped (SIGSTOP) is lost once silent, and the job ends naming its node; it is
/// no child of rlaunch's, and srun's SIGKILL would leave the step, the stopped proxy and its
/// rank with it: rlaunch has srun end the step (SIGTERM), which kills them.
fn a_stopped_proxy_in_an_allocation_is_ended_with_its_step(cluster: &SlurmCluster) {
    let name = format!("rls-rlaunch-stopped-{}", std::process::id());
    let options = ["--heartbeat", "0.25", "--silence-timeout", "2"];
    let (job, ranks) = waiting_rlaunch_job_with(cluster, &name, &options);
    let proxy = proxy_on("n2", &ranks);
    nix::sys::signal::kill(nix::unistd::Pid::from_raw(proxy), nix::sys::signal::Signal::SIGSTOP)
        .unwrap();
    let out = job.wait(WAIT);
    out.assert_code(255);
    assert!(
        out.stderr_str().contains("rlaunch: lost proxy on n2 (no word from it for 2 s)"),
        "{out}"
    );
    // srun ends the step at once (its KillWait here is 2 s); 3 s of margin for a busy machine.
    out.tag
        .wait_until_none(Duration::from_secs(5))
        .unwrap_or_else(|left| panic!("left on the nodes after rlaunch ended: {left:?}"));
}

/// `--max-restarts` inside an allocation: rank 3 (on n2) fails in the first attempt; the job
/// is torn down, a new srun starts the second attempt's proxies, which dial in afresh, and
/// every rank runs again on its node, told it is restart 1 (`srun N`: its proxy's step).
fn a_failed_rank_in_an_allocation_restarts_the_job_with_a_new_srun(cluster: &SlurmCluster) {
    let rlaunch = rlaunch_tests::rlaunch().to_string_lossy().into_owned();
    let script = r#"if [ "$RLAUNCH_RESTART_COUNT" = 0 ] && [ "$PMI_RANK" = 3 ]; then exit 3; fi
        echo "rank $PMI_RANK attempt $RLAUNCH_RESTART_COUNT on $(hostname) srun $(tr '\0' '\n' < /proc/$PPID/environ | sed -n 's/^SLURM_STEP_ID=//p')""#;
    let options = ["--launcher", "slurm", "--max-restarts", "1"];
    let args = [&["-N3", "-n6", rlaunch.as_str()][..], &options, &["sh", "-c", script]].concat();
    let out = cluster.run("salloc", &args).timeout(WAIT).run();
    out.assert_code(0);
    let err = out.stderr_str();
    let said = rlaunch_lines(&err);
    assert_eq!(said.len(), 1, "{out}");
    let culprit = regex_free_pid(said[0], "rlaunch: rank 3 (pid ", " on n2) exited with code 3");
    assert!(culprit, "{out}");
    assert!(said[0].ends_with("; restarting the job (restart 1 of 1)"), "{out}");
    // The second attempt: every rank on its node of the first, from a step of its own.
    let second: Vec<String> =
        sorted(out.lines().into_iter().filter(|l| l.contains(" attempt 1 on ")));
    let steps: std::collections::BTreeSet<&str> =
        second.iter().filter_map(|l| l.rsplit(" srun ").next()).collect();
    assert_eq!(steps.len(), 1, "one step for the second attempt's proxies: {out}");
    let step = steps.into_iter().next().unwrap();
    let want: Vec<String> =
        (0..6).map(|r| format!("rank {r} attempt 1 on n{} srun {step}", r / 2 + 1)).collect();
    assert_eq!(second, want, "{out}");
    // The first attempt's ranks that printed did so from an earlier step.
    for line in out.lines().iter().filter(|l| l.contains(" attempt 0 on ")) {
        assert!(!line.ends_with(&format!(" srun {step}")), "{out}");
    }
}

/// `line` is `head`, a number, then `tail`.
fn regex_free_pid(line: &str, head: &str, tail: &str) -> bool {
    let Some(rest) = line.strip_prefix(head) else { return false };
    let digits = rest.chars().take_while(char::is_ascii_digit).count();
    digits > 0 && rest[digits..].starts_with(tail)
}
