//! Starting a job: what every rank finds in its environment, placement on fake nodes, the tree
//! of proxies, and the proxy rlaunch forks for its own machine. Every test runs the real
//! rlaunch and rlaunch-proxy binaries with `rankprog` as the rank program.

use std::collections::BTreeSet;
use std::time::Duration;

use nix::sys::signal::Signal;
use rlaunch_tests::hosts::{hostname, node_list, waiting_fake_node_job};
use rlaunch_tests::output::envs_by_rank;
use rlaunch_tests::{procfs, rankprog_str, stdin_sum_line, Run};

const WAIT: Duration = Duration::from_secs(30);

#[test]
fn ranks_get_their_variables_and_the_launch_environment() {
    let out = Run::new(&["-l", "-n", "3", &rankprog_str(), "env"])
        .env("RLAUNCH_TEST_FORWARDED", "yes")
        .run();
    out.assert_code(0);
    let envs = envs_by_rank(&out.lines());
    assert_eq!(envs.len(), 3);
    let host = hostname();
    for (rank, env) in &envs {
        assert_eq!(env["PMI_RANK"], rank.to_string());
        assert_eq!(env["PMI_SIZE"], "3");
        assert_eq!(env["MPI_LOCALRANKID"], rank.to_string());
        assert_eq!(env["MPI_LOCALNRANKS"], "3");
        assert_eq!(env["MPIR_CVAR_CH3_INTERFACE_HOSTNAME"], host);
        assert_eq!(env["GFORTRAN_UNBUFFERED_PRECONNECTED"], "y");
        assert_eq!(env["RLAUNCH_TEST_FORWARDED"], "yes");
        assert!(env.contains_key("PMI_FD"));
        assert!(!env.contains_key("PMI_SPAWNED"));
    }
}

#[test]
fn fake_hosts_place_ranks_in_blocks() {
    let out = Run::new(&[
        "--launcher",
        "fork",
        "--hosts",
        "n1:4,n2:4,n3:4",
        "-l",
        "-n",
        "12",
        &rankprog_str(),
        "env",
    ])
    .run();
    out.assert_code(0);
    let envs = envs_by_rank(&out.lines());
    assert_eq!(envs.len(), 12);
    for (rank, env) in &envs {
        assert_eq!(env["MPIR_CVAR_CH3_INTERFACE_HOSTNAME"], format!("n{}", rank / 4 + 1));
        assert_eq!(env["MPI_LOCALRANKID"], (rank % 4).to_string());
        assert_eq!(env["MPI_LOCALNRANKS"], "4");
        assert_eq!(env["PMI_SIZE"], "12");
    }
}

/// How many proxies a process runs under: its ancestors whose command is rlaunch-proxy.
fn proxy_ancestors(pid: i32) -> usize {
    let mut count = 0;
    let mut pid = pid;
    while pid > 1 {
        let Some(stat) = procfs::stat(pid) else { break };
        if stat.comm == "rlaunch-proxy" {
            count += 1;
        }
        pid = stat.ppid;
    }
    count
}

#[test]
fn tree_width_two_over_seven_nodes_is_three_proxies_deep() {
    let hosts = node_list(7);
    let mut job = Run::new(&[
        "--launcher",
        "fork",
        "--hosts",
        &hosts,
        "--tree-width",
        "2",
        "--stdin",
        "all",
        "-n",
        "7",
        &rankprog_str(),
        "ready",
        "stdin-sum",
    ])
    .stdin_piped()
    .spawn();
    let ready = job.wait_for_ready(7, WAIT);
    let depths: BTreeSet<usize> =
        ready.iter().map(|(_, pid)| proxy_ancestors(pid.as_raw())).collect();
    // Two proxies started by rlaunch, four by them, one more level below.
    assert_eq!(depths, BTreeSet::from([1, 2, 3]), "proxy depth of each rank");
    job.close_stdin();
    let out = job.wait(WAIT);
    out.assert_code(0);
    assert_eq!(out.stdout_str().matches(&stdin_sum_line(b"")).count(), 7);
}

/// rlaunch forks its own machine's proxy instead of exec'ing one (one exec fewer per job):
/// that proxy must still look and behave like one. It is named rlaunch-proxy, leaves the
/// user's stdin and stdout alone (a pipe into `wc` must see its end of file when rlaunch
/// exits), and the proxies it starts on this machine are forked the same way (no exec).
#[test]
fn the_local_proxy_is_forked_named_and_detached_from_stdio() {
    let (mut job, pids) = waiting_fake_node_job("n1,n2", 2, &["--tree-width", "1"]);
    let forked = procfs::parent_pid(pids[&0]);
    let below = procfs::parent_pid(pids[&1]);
    assert_eq!(procfs::parent_pid(below), forked, "n2's proxy hangs below n1's");
    let exe = |pid: i32| std::fs::read_link(format!("/proc/{pid}/exe")).unwrap();
    assert_eq!(exe(forked), rlaunch_tests::rlaunch().canonicalize().unwrap());
    assert_eq!(exe(below), rlaunch_tests::rlaunch().canonicalize().unwrap(), "forked by n1's");
    for pid in [forked, below] {
        assert_eq!(procfs::stat(pid).unwrap().comm, "rlaunch-proxy", "pid {pid}");
        for fd in [0, 1] {
            let target = std::fs::read_link(format!("/proc/{pid}/fd/{fd}")).unwrap();
            assert_eq!(target, std::path::Path::new("/dev/null"), "pid {pid} fd {fd}");
        }
        let group = nix::unistd::getpgid(Some(nix::unistd::Pid::from_raw(pid))).unwrap();
        assert_eq!(group.as_raw(), pid, "proxy {pid} leads its own process group");
    }
    job.signal(Signal::SIGTERM);
    let out = job.wait(WAIT);
    // Forwarded to the ranks, which die of it: 128 + 15.
    out.assert_code(143);
    out.tag.wait_until_none(Duration::from_secs(2)).unwrap();
}

/// The local proxy is forked holding its launch and starts the ranks at once: it can finish
/// the whole job and exit before rlaunch's runtime (and its SIGCHLD handler) exists. strace
/// holds rlaunch (and only rlaunch: no -f) in its runtime's first epoll_create1 for half a
/// second, long after the proxy is gone; rlaunch must still reap it and end.
#[test]
fn a_proxy_that_ends_before_rlaunch_is_ready_is_still_reaped() {
    let rlaunch = rlaunch_tests::rlaunch();
    let rlaunch = rlaunch.to_str().unwrap();
    let delay = "inject=epoll_create1:delay_exit=500000:when=1";
    let args = ["-o", "/dev/null", "-e", "trace=epoll_create1", "-e", delay, rlaunch];
    let rank = ["-n", "1", &rankprog_str(), "print", "1"];
    let out = Run::program("strace", &args).args(rank).timeout(WAIT).run();
    out.assert_code(0);
    assert_eq!(out.lines(), ["rank 0 line 0"]);
}

/// A rank holds three of its proxy's descriptors once it runs (its stdout, stderr and PMI
/// socket), and seven only while it starts: 200 ranks run within 1,024 descriptors, which
/// starting them all at once (1,400) could not.
#[test]
fn ranks_hold_three_descriptors_each_once_started() {
    let out = Run::program("prlimit", &["--nofile=1024:1024", "--"])
        .arg(rlaunch_tests::rlaunch())
        .args(["-n", "200", &rankprog_str(), "ready", "sleep", "1"])
        .run();
    out.assert_code(0);
    let ready = out.lines().iter().filter(|line| line.starts_with("ready ")).count();
    assert_eq!(ready, 200, "{out}");
}

/// Each rank leads a session of its own where the node's ranks are no more than its CPUs, as
/// Hydra's ranks do (and so a process group the proxy signals): under the kernel's autogroup
/// a CPU share of its own. With more ranks than CPUs they share the proxy's session, each in
/// a process group of its own, so that the kernel's `sched_yield` passes the CPU among them
/// (docs/measurements.md, *Ranks beside other work*).
#[test]
fn ranks_lead_sessions_of_their_own_where_each_has_a_cpu() {
    let cpus = std::thread::available_parallelism().unwrap().get();
    // Field 6 of /proc/PID/stat is the session, field 5 the process group (`sh` has no
    // space in its name).
    let script = "echo $$ $(cut -d' ' -f5,6 /proc/$$/stat)";
    for (n, own) in [(cpus, true), (cpus + 1, false)] {
        let n_arg = n.to_string();
        let out = Run::new(&["-n", &n_arg, "/bin/sh", "-c", script]).timeout(WAIT).run();
        out.assert_code(0);
        let lines = out.lines();
        assert_eq!(lines.len(), n, "{out}");
        for line in lines {
            let ids: Vec<&str> = line.split(' ').collect();
            assert_eq!(ids[1], ids[0], "a rank's process group: {line}");
            assert_eq!(ids[2] == ids[0], own, "{n} ranks on {cpus} CPUs, session: {line}");
        }
    }
}
