//! Across real hosts: a cluster of fake hosts (network namespaces, each with its own sshd and
//! host name; tests/cluster/cluster.sh) and rlaunch over real ssh. Needs root, as CI has.
//!
//! One test function brings the cluster up once, runs every scenario in turn, and takes it
//! down again on every path out (the guard's Drop), passing or failing.

use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use nix::sys::signal::Signal;
use rlaunch_tests::cluster::Cluster;
use rlaunch_tests::hosts::node_list;
use rlaunch_tests::mpi::CProgram;
use rlaunch_tests::output::{rlaunch_lines, sorted, source_line, stack_branch};
use rlaunch_tests::{procfs, rankprog_str};

const NODES: usize = 7;
const WAIT: Duration = Duration::from_secs(60);

/// Remote proxies: the `rlaunch-proxy` processes in this cluster's nodes, the network
/// namespaces of its sshd listeners (orphaned or not; other topics' proxies run beside these
/// tests, in the same test binary, in namespaces of their own or in none).
fn remote_proxies(cluster: &Cluster) -> Vec<i32> {
    let netns = |pid: i32| std::fs::read_link(format!("/proc/{pid}/ns/net")).ok();
    let nodes: Vec<_> = cluster.sshd_pids().into_iter().filter_map(netns).collect();
    let proxy = |pid: i32| procfs::stat(pid).is_some_and(|s| s.comm == "rlaunch-proxy");
    let remote = |pid: i32| netns(pid).is_some_and(|ns| nodes.contains(&ns));
    procfs::pids().into_iter().filter(|&pid| proxy(pid) && remote(pid)).collect()
}

fn wait_no_remote_proxies(cluster: &Cluster, within: Duration) {
    let deadline = Instant::now() + within;
    while !remote_proxies(cluster).is_empty() {
        let left = remote_proxies(cluster);
        assert!(Instant::now() < deadline, "remote proxies left: {left:?}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[test]
fn jobs_run_across_hosts_over_ssh_and_failures_leave_nothing() {
    let cluster = Cluster::up(NODES);
    each_node_runs_a_plain_command(&cluster);
    hello_runs_on_four_nodes_with_two_ranks_each(&cluster, CProgram::Hello);
    hello_runs_on_four_nodes_with_two_ranks_each(&cluster, CProgram::OmpiHello);
    a_hung_job_names_the_missing_rank_and_its_host(&cluster);
    tree_spawn_with_width_two_covers_seven_nodes(&cluster);
    files_are_broadcast_down_an_ssh_tree(&cluster);
    spawned_ranks_start_on_hosts_that_had_no_proxy(&cluster);
    torch_meets_at_rank_zeros_address_over_ssh(&cluster);
    an_unknown_host_fails_the_launch(&cluster);
    a_stopped_sshd_fails_the_launch(&cluster);
    a_killed_node_proxy_aborts_the_job(&cluster);
    a_stopped_node_proxy_is_lost_and_its_guard_leaves_nothing(&cluster);
    a_node_whose_link_goes_down_is_lost_and_cleans_up_alone(&cluster);
    an_interior_node_cut_off_under_continue_leaves_its_children_adopted(&cluster);
    a_node_lost_mid_job_is_replaced_by_a_spare_host_on_restart(&cluster);
    killing_rlaunch_leaves_nothing_on_any_host(&cluster);
}

fn each_node_runs_a_plain_command(cluster: &Cluster) {
    let out =
        cluster.run(&["--hosts", &node_list(4), "-l", "-n", "4", "hostname"]).timeout(WAIT).run();
    out.assert_code(0);
    let lines = sorted(out.lines());
    assert_eq!(lines, ["[0] n1", "[1] n2", "[2] n3", "[3] n4"], "{out}");
}

/// A job that times out says where it hung, with the proxies' answers through the tree
/// (docs/hangs.md): rank 5 never calls MPI_Init, the 7 others wait in its fence.
fn a_hung_job_names_the_missing_rank_and_its_host(cluster: &Cluster) {
    // An ssh launch of 4 nodes and MPI_Init's fence take about 1 s here.
    let timeout = "10";
    let hang = CProgram::Hang.path_str();
    let out = cluster
        .run(&["--hosts", &node_list(4), "--ppn", "2", "--timeout", timeout, "-n", "8"])
        .args([hang.as_str(), "5", "-1"])
        .timeout(WAIT)
        .run();
    out.assert_code(124);
    let pid = out.lines().iter().find_map(|l| l.strip_prefix("pid 5 ").map(str::to_owned));
    let pid = pid.unwrap_or_else(|| panic!("rank 5 said no pid: {out}"));
    let err = out.stderr_str();
    let said = rlaunch_lines(&err);
    assert_eq!(said[0], format!("rlaunch: where the job was at its timeout ({timeout} s):"));
    let missing = format!("fence 1 (PMI): 7 of 8 ranks waiting; missing: rank 5 (pid {pid} on n3)");
    assert_eq!(said[1], format!("rlaunch:   {missing}"), "{out}");
    // Rank 5's stack, read by its proxy under sshd on n3: in main, where it pauses.
    let pause = source_line("c/hang.c", "pause();");
    let main = format!("main ({}/c/hang.c:{pause})", env!("CARGO_MANIFEST_DIR"));
    assert_eq!(stack_branch(&said, "+ rank 5:")[0], main, "{out}");
    assert_eq!(said.last().copied(), Some("rlaunch: the job timed out after 10 s and was killed"));
    wait_no_remote_proxies(cluster, Duration::from_secs(10));
}

/// MPICH's hello (PMI-1) or Open MPI's (PMIx, each node its own PMIx server).
fn hello_runs_on_four_nodes_with_two_ranks_each(cluster: &Cluster, program: CProgram) {
    let hello = program.path();
    let hostfile = cluster.dir().join("hostfile");
    std::fs::write(&hostfile, "n1:2\nn2:2\nn3:2\nn4:2\n").unwrap();
    let trace_path = cluster.dir().join("trace.json");
    let trace_arg = trace_path.to_str().unwrap();
    let out = cluster
        .run(&["-f", hostfile.to_str().unwrap(), "--timeline", trace_arg, "-n", "8"])
        .args([hello.to_str().unwrap(), "8"])
        .env("HWLOC_COMPONENTS", "-pci,-linuxio")
        .timeout(WAIT)
        .run();
    out.assert_code(0);
    let text = out.stdout_str();
    for rank in 0..8 {
        let line = text
            .lines()
            .find(|l| l.starts_with(&format!("rank {rank} ")))
            .unwrap_or_else(|| panic!("no line from rank {rank}: {out}"));
        assert!(line.contains(" size 8 ") && line.contains(" sum 28 "), "{line}");
        assert!(line.ends_with(&format!("name n{}", rank / 2 + 1)), "{line}");
    }
    // The launch's trace came up the tree over ssh: every node's fences (PMI-1 barriers or
    // PMIx fences), and each rank's PMI init, on the node it ran on.
    let trace: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&trace_path).unwrap()).unwrap();
    let fences = trace["otherData"]["fences"].as_u64().unwrap();
    assert!(fences >= 1, "{}", trace["otherData"]);
    let events = trace["traceEvents"].as_array().unwrap();
    let count = |pid: u64, what: &dyn Fn(&serde_json::Value) -> bool| {
        events.iter().filter(|e| e["pid"] == pid && what(e)).count() as u64
    };
    for node in 0..4u64 {
        let pid = node + 1;
        assert_eq!(count(pid, &|e| e["cat"] == "fence"), fences, "{program:?} node {node}");
        assert_eq!(count(pid, &|e| e["name"] == "PMI init"), 2, "{program:?} node {node}");
        let name = |e: &serde_json::Value| e["name"] == "process_name";
        assert_eq!(count(pid, &name), 1);
    }
}

/// MPI_Comm_spawn over ssh: one rank on n1 spawns three (PMI-2) after its slot, round the
/// hosts: n2 and n3 get a proxy over ssh then, and each child runs where rlaunch says.
fn spawned_ranks_start_on_hosts_that_had_no_proxy(cluster: &Cluster) {
    let report = cluster.dir().join("spawn-report.json");
    let client = rlaunch_tests::spawn_client();
    let out = cluster
        .run(&["--hosts", "n1,n2,n3", "-n", "1", "--report", report.to_str().unwrap()])
        .args(["/usr/bin/python3", &client, "2"])
        .env("SPAWN_NPROCS", "3")
        .timeout(WAIT)
        .run();
    out.assert_code(0);
    let placed = rlaunch_tests::output::report_hosts(&report, 1);
    assert_eq!(placed, ["n2", "n3", "n1"], "{out}");
    let mut children: Vec<String> =
        out.lines().into_iter().filter(|l| l.starts_with("child ")).collect();
    children.sort();
    assert_eq!(children.len(), 3, "{out}");
    for (child, host) in children.iter().zip(&placed) {
        assert!(child.ends_with(&format!(" on {host} map (vector,(0,3,1))")), "{child}");
    }
    wait_no_remote_proxies(cluster, WAIT);
}

/// A torch.distributed job with no host of its own on this machine: rank 0's proxy (on n1)
/// chooses the rendezvous, at the address its ssh session came in at, and n2's ranks wait
/// for it; gloo's all_reduce then crosses the hosts.
fn torch_meets_at_rank_zeros_address_over_ssh(cluster: &Cluster) {
    let envs = cluster
        .run(&["--hosts", "n1:2,n2:2", "-l", "-n", "4", &rankprog_str(), "env"])
        .timeout(WAIT)
        .run();
    envs.assert_code(0);
    let envs = rlaunch_tests::output::envs_by_rank(&envs.lines());
    let n1 = "10.213.0.11";
    for rank in 0..4 {
        assert_eq!(envs[&rank]["MASTER_ADDR"], n1, "rank {rank}");
        assert_eq!(envs[&rank]["MASTER_PORT"], envs[&0]["MASTER_PORT"], "rank {rank}");
        assert_eq!(envs[&rank]["GROUP_RANK"], (rank / 2).to_string(), "rank {rank}");
    }
    let job = rlaunch_tests::torch_job();
    let out = cluster
        .run(&["--hosts", "n1:2,n2:2", "-n", "4", "/usr/bin/python3", &job, "allreduce"])
        .timeout(WAIT)
        .run();
    out.assert_code(0);
    let want: Vec<String> = (0..4)
        .map(|r| format!("rank {r} of 4 local {} of 2 group {} of 2 sum 6", r % 2, r / 2))
        .collect();
    assert_eq!(sorted(out.lines()), want, "{out}");
    wait_no_remote_proxies(cluster, WAIT);
}

fn tree_spawn_with_width_two_covers_seven_nodes(cluster: &Cluster) {
    let out = cluster
        .run(&["--hosts", &node_list(7), "--tree-width", "2", "-l", "-n", "7", "hostname"])
        .timeout(WAIT)
        .run();
    out.assert_code(0);
    let lines = sorted(out.lines());
    let want: Vec<String> = (0..7).map(|r| format!("[{r}] n{}", r + 1)).collect();
    assert_eq!(lines, want, "{out}");
}

/// `--bcast` over ssh links: 2 MiB and a bit to seven hosts in a width-2 tree (three levels),
/// every host's copy compared with the original by its rank, and gone at the end.
fn files_are_broadcast_down_an_ssh_tree(cluster: &Cluster) {
    let dir = rlaunch_tests::tempdir();
    let data: Vec<u8> =
        (0..(2 << 20) + 777u32).map(|i| (i.wrapping_mul(2654435761) >> 13) as u8).collect();
    let file = dir.join("data.bin");
    std::fs::write(&file, &data).unwrap();
    let nodes = dir.join("nodes");
    std::fs::create_dir(&nodes).unwrap();
    let check =
        format!("cmp -s {} \"$RLAUNCH_BCAST_DIR/data.bin\" && echo $(hostname) ok", file.display());
    let out = cluster
        .run(&["--hosts", &node_list(7), "--tree-width", "2", "--bcast", file.to_str().unwrap()])
        .args(["--bcast-dir", nodes.to_str().unwrap(), "-n", "7", "sh", "-c", &check])
        .timeout(WAIT)
        .run();
    out.assert_code(0);
    let want: Vec<String> = (1..=7).map(|n| format!("n{n} ok")).collect();
    assert_eq!(sorted(out.lines()), want, "{out}");
    let left: Vec<_> = std::fs::read_dir(&nodes).unwrap().collect();
    assert!(left.is_empty(), "copies left: {left:?}");
}

fn an_unknown_host_fails_the_launch(cluster: &Cluster) {
    let start = Instant::now();
    let out = cluster
        .run(&["--hosts", "n1,nosuchhost", "-n", "2", &rankprog_str(), "ready", "sleep", "60"])
        .timeout(WAIT)
        .run();
    out.assert_code(255);
    let err = out.stderr_str();
    assert!(err.contains("rlaunch: lost proxy on nosuchhost (ssh exited with code 255: "), "{err}");
    assert!(err.contains("nosuchhost"), "{err}");
    assert!(start.elapsed() < Duration::from_secs(15), "took {:?}", start.elapsed());
    out.tag.wait_until_none(Duration::from_secs(5)).unwrap();
    wait_no_remote_proxies(cluster, Duration::from_secs(5));
}

fn a_stopped_sshd_fails_the_launch(cluster: &Cluster) {
    cluster.ctl("stop-sshd", 3);
    let out = cluster
        .run(&["--hosts", "n1,n3", "-n", "2", &rankprog_str(), "ready", "sleep", "60"])
        .timeout(WAIT)
        .run();
    cluster.ctl("start-sshd", 3);
    out.assert_code(255);
    let err = out.stderr_str();
    assert!(err.contains("rlaunch: lost proxy on n3 (ssh exited with code 255: "), "{err}");
    assert!(err.contains("Connection refused"), "{err}");
    out.tag.wait_until_none(Duration::from_secs(5)).unwrap();
    wait_no_remote_proxies(cluster, Duration::from_secs(5));
}

fn a_killed_node_proxy_aborts_the_job(cluster: &Cluster) {
    let mut job = cluster
        .run(&[
            "--hosts",
            &node_list(3),
            "--tree-width",
            "1",
            "-n",
            "3",
            &rankprog_str(),
            "ready",
            "sleep",
            "60",
        ])
        .timeout(WAIT)
        .spawn();
    let ready = job.wait_for_ready(3, WAIT);
    // Node n2 sits between n1 and n3 in this chain: losing it must take n3's rank too.
    let rank1 = ready.iter().find(|(r, _)| *r == 1).unwrap().1;
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(procfs::parent_pid(rank1.as_raw())),
        Signal::SIGKILL,
    )
    .unwrap();
    let out = job.wait(WAIT);
    out.assert_code(255);
    assert!(out.stderr_str().contains("rlaunch: lost proxy on n2 ("), "{out}");
    out.tag.wait_until_none(Duration::from_secs(10)).unwrap();
    wait_no_remote_proxies(cluster, Duration::from_secs(10));
}

/// A proxy stopped with SIGSTOP cannot act when its parent gives up on it: across ssh the
/// parent can only kill the ssh client, and the proxy's guard kills the stopped proxy once
/// its channel is gone, and its ranks with it.
fn a_stopped_node_proxy_is_lost_and_its_guard_leaves_nothing(cluster: &Cluster) {
    let mut job = cluster
        .run(&["--heartbeat", "0.25", "--silence-timeout", "1.5", "--hosts", "n1,n2", "-n", "2"])
        .args([rankprog_str().as_str(), "ready", "sleep", "60"])
        .timeout(WAIT)
        .spawn();
    let ready = job.wait_for_ready(2, WAIT);
    let rank1 = ready.iter().find(|(r, _)| *r == 1).unwrap().1;
    let proxy = procfs::parent_pid(rank1.as_raw());
    nix::sys::signal::kill(nix::unistd::Pid::from_raw(proxy), Signal::SIGSTOP).unwrap();
    let stopped = Instant::now();
    let out = job.wait(WAIT);
    out.assert_code(255);
    assert!(
        out.stderr_str().contains("rlaunch: lost proxy on n2 (no word from it for 1.5 s)"),
        "{out}"
    );
    // Silence, the kill grace and the child proxies' grace; the guard acts within 0.1 s.
    out.tag.wait_until_none(Duration::from_secs(3)).unwrap();
    wait_no_remote_proxies(cluster, Duration::from_secs(3));
    assert!(stopped.elapsed() < Duration::from_secs(12), "took {:?}", stopped.elapsed());
}

fn killing_rlaunch_leaves_nothing_on_any_host(cluster: &Cluster) {
    let pidfile = cluster.dir().join("daemon.pid");
    let mut job = cluster
        .run(&[
            "--hosts",
            &node_list(4),
            "--tree-width",
            "2",
            "-n",
            "4",
            &rankprog_str(),
            "@3",
            "daemon",
            pidfile.to_str().unwrap(),
            "ready",
            "sleep",
            "60",
        ])
        .timeout(WAIT)
        .spawn();
    job.wait_for_ready(4, WAIT);
    assert!(Path::new(&pidfile).exists());
    // A proxy on each of the 4 nodes, and its guard (crates/tree/src/guard.rs), forked.
    assert_eq!(remote_proxies(cluster).len(), 8, "a proxy and its guard on each of 4 nodes");
    let tag = job.tag().to_string();
    job.signal(Signal::SIGKILL);
    let killed = Instant::now();
    let left = rlaunch_tests::wait_until_no_tagged(&tag, Duration::from_secs(15));
    let procs = Command::new("ps").args(["-eo", "pid,ppid,stat,etime,args"]).output().unwrap();
    left.unwrap_or_else(|left| {
        panic!(
            "left behind after kill -9 of rlaunch: {left:?}\n{}",
            String::from_utf8_lossy(&procs.stdout)
        )
    });
    assert!(killed.elapsed() < Duration::from_secs(5), "cleanup took {:?}", killed.elapsed());
    wait_no_remote_proxies(cluster, Duration::from_secs(5));
}

/// `--max-restarts` with `--spare-hosts`: n5's link goes down mid-job; once it is lost, the
/// job starts again with n6 in its place, and completes there.
fn a_node_lost_mid_job_is_replaced_by_a_spare_host_on_restart(cluster: &Cluster) {
    let options = ["--heartbeat", "0.5", "--silence-timeout", "3", "--hosts", "n1,n5", "-n", "2"];
    let script = "echo ready $PMI_RANK $RLAUNCH_RESTART_COUNT $(hostname); \
                  [ $RLAUNCH_RESTART_COUNT = 0 ] && exec sleep 60; true";
    let mut job = cluster
        .run(&options)
        .args(["--max-restarts", "1", "--spare-hosts", "n6", "sh", "-c", script])
        .timeout(WAIT)
        .spawn();
    job.wait_for_line(|l| l == "ready 0 0 n1", WAIT);
    job.wait_for_line(|l| l == "ready 1 0 n5", WAIT);
    cluster.ctl("link-down", 5);
    let out = job.wait(WAIT);
    out.assert_code(0);
    let stderr = out.stderr_str();
    let said = rlaunch_lines(&stderr);
    let restart = "rlaunch: lost proxy on n5 (no word from it for 3 s); restarting the job with \
                   n6 for n5 (restart 1 of 1)";
    assert_eq!(said, [restart], "{out}");
    let lines = out.lines();
    assert!(lines.iter().any(|l| l == "ready 0 1 n1"), "{out}");
    assert!(lines.iter().any(|l| l == "ready 1 1 n6"), "{out}");
    out.tag.wait_until_none(Duration::from_secs(20)).unwrap();
    wait_no_remote_proxies(cluster, Duration::from_secs(10));
    cluster.ctl("link-up", 5);
}

/// `--on-failure continue`, a tree of width 2 over seven hosts (n5 and n6 are n2's
/// children), every rank fencing in a loop: n2's network link goes down. Its children hear
/// nothing from it, dial rlaunch and are adopted; only n2's rank fails, the others are told
/// so, finish their fences without it and end. n2, cut off from everyone, ends its rank
/// itself.
fn an_interior_node_cut_off_under_continue_leaves_its_children_adopted(cluster: &Cluster) {
    let dir = rlaunch_tests::tempdir();
    let files = dir.path().to_str().expect("a UTF-8 temporary directory").to_owned();
    let chaosrank = rlaunch_tests::chaosrank().to_string_lossy().into_owned();
    let liveness = ["--heartbeat", "0.5", "--silence-timeout", "3", "--on-failure", "continue"];
    let job = cluster
        .run(&liveness)
        .args(["--hosts", &node_list(7), "--tree-width", "2", "-n", "7", &chaosrank, &files])
        .arg("fence")
        .timeout(WAIT)
        .spawn();
    let ready = Instant::now() + WAIT;
    while !(0..7).all(|r| dir.path().join(format!("ready.{r}")).exists()) {
        assert!(Instant::now() < ready, "the ranks never got ready");
        std::thread::sleep(Duration::from_millis(20));
    }
    let cut = Instant::now();
    cluster.ctl("link-down", 2);
    let out = job.wait(WAIT);
    out.assert_code(255);
    let stderr = out.stderr_str();
    let said = rlaunch_lines(&stderr);
    assert_eq!(said, ["rlaunch: lost proxy on n2 (no word from it for 3 s)"], "{out}");
    let read = |name: String| std::fs::read_to_string(dir.path().join(name)).unwrap_or_default();
    for rank in [0, 2, 3, 4, 5, 6] {
        assert_eq!(read(format!("told.{rank}")), "1", "rank {rank}: {out}");
    }
    // The silence twice (n2's children's, then rlaunch's), and the rest.
    assert!(cut.elapsed() < Duration::from_secs(15), "took {:?}", cut.elapsed());
    out.tag.wait_until_none(Duration::from_secs(20)).unwrap();
    wait_no_remote_proxies(cluster, Duration::from_secs(10));
    cluster.ctl("link-up", 2);
}

fn a_node_whose_link_goes_down_is_lost_and_cleans_up_alone(cluster: &Cluster) {
    let mut job = cluster
        .run(&["--heartbeat", "0.5", "--silence-timeout", "3", "--hosts", "n1,n5", "-n", "2"])
        .args([rankprog_str().as_str(), "ready", "sleep", "60"])
        .timeout(WAIT)
        .spawn();
    job.wait_for_ready(2, WAIT);
    let cut = Instant::now();
    cluster.ctl("link-down", 5);
    let out = job.wait(WAIT);
    out.assert_code(255);
    assert!(
        out.stderr_str().contains("rlaunch: lost proxy on n5 (no word from it for 3 s)"),
        "{out}"
    );
    assert!(cut.elapsed() < Duration::from_secs(10), "noticed after {:?}", cut.elapsed());
    // Cut off from everyone, n5's proxy hears no heartbeat either and ends its rank itself.
    out.tag.wait_until_none(Duration::from_secs(20)).unwrap();
    wait_no_remote_proxies(cluster, Duration::from_secs(10));
    cluster.ctl("link-up", 5);
}
