//! The core issue, end to end: ranks, environment, output, stdin, exit codes, abort,
//! timeouts, and no orphans. Every test runs the real rlaunch and rlaunch-proxy binaries with
//! `rankprog` as the rank program.

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

use nix::sys::signal::Signal;
use rlaunch_tests::hosts::{hostname, node_list};
use rlaunch_tests::output::{envs_by_rank, rlaunch_lines, sorted};
use rlaunch_tests::{check_flood, procfs, rankprog_str, stdin_sum_line, Run};

const WAIT: Duration = Duration::from_secs(30);

fn rp() -> String {
    rankprog_str()
}

#[test]
fn ranks_get_their_variables_and_the_launch_environment() {
    let out = Run::new(&["-l", "-n", "3", &rp(), "env"]).env("RLAUNCH_TEST_FORWARDED", "yes").run();
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
        &rp(),
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
        &rp(),
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
/// exits), and the proxies it starts are the real rlaunch-proxy.
#[test]
fn the_local_proxy_is_forked_named_and_detached_from_stdio() {
    let (mut job, pids) = waiting_fake_node_job("n1,n2", 2, &["--tree-width", "1"]);
    let forked = procfs::parent_pid(pids[&0]);
    let execd = procfs::parent_pid(pids[&1]);
    assert_eq!(procfs::parent_pid(execd), forked, "n2's proxy hangs below n1's");
    let exe = |pid: i32| std::fs::read_link(format!("/proc/{pid}/exe")).unwrap();
    assert_eq!(exe(forked), rlaunch_tests::rlaunch().canonicalize().unwrap());
    assert_eq!(exe(execd), rlaunch_tests::proxy().canonicalize().unwrap());
    for pid in [forked, execd] {
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
    assert_ne!(out.code, Some(0));
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
    let rank = ["-n", "1", &rp(), "print", "1"];
    let out = Run::program("strace", &args).args(rank).timeout(WAIT).run();
    out.assert_code(0);
    assert_eq!(out.lines(), ["rank 0 line 0"]);
}

#[test]
fn output_lines_are_whole_and_in_order_per_rank() {
    let bytes_per_rank = 4 << 20;
    let out = Run::new(&["-n", "4", &rp(), "flood", &bytes_per_rank.to_string()]).run();
    out.assert_code(0);
    check_flood(&out.stdout, 4, bytes_per_rank).unwrap();
}

#[test]
fn prepend_rank_tags_every_line_on_both_streams() {
    let out = Run::new(&["-l", "-n", "2", &rp(), "print", "2", "eprint", "1"]).run();
    out.assert_code(0);
    let lines = sorted(out.lines());
    assert_eq!(
        lines,
        ["[0] rank 0 line 0", "[0] rank 0 line 1", "[1] rank 1 line 0", "[1] rank 1 line 1"]
    );
    let err = sorted(out.stderr_lines());
    assert_eq!(err, ["[0] rank 0 line 0", "[1] rank 1 line 0"]);
}

#[test]
fn a_last_line_without_newline_arrives_and_bytes_pass_unchanged() {
    let out = Run::new(&["-n", "1", &rp(), "noeol", "abc"]).run();
    out.assert_code(0);
    assert_eq!(out.stdout, b"abc");
    let out = Run::new(&["-n", "1", &rp(), "binary"]).run();
    out.assert_code(0);
    assert_eq!(out.stdout, (0..=255u8).collect::<Vec<_>>());
}

#[test]
fn a_closed_stdout_ends_the_job_promptly() {
    let script = format!("{} -n 4 yes | head -1", rlaunch_tests::rlaunch().display());
    let start = Instant::now();
    let out = Run::program("/bin/sh", &["-c", &script]).timeout(WAIT).run();
    out.assert_code(0);
    assert_eq!(out.stdout_str(), "y\n");
    assert!(start.elapsed() < Duration::from_secs(10), "took {:?}", start.elapsed());
}

#[test]
fn stdin_goes_to_rank_zero_and_arrives_intact() {
    let input: Vec<u8> = (0..10 << 20).map(|i: u32| (i * 7 + i / 4096) as u8).collect();
    let out = Run::new(&["-l", "-n", "3", &rp(), "stdin-sum"]).stdin_bytes(input.clone()).run();
    out.assert_code(0);
    let lines = sorted(out.lines());
    let empty = stdin_sum_line(b"");
    assert_eq!(
        lines,
        [
            format!("[0] {}", stdin_sum_line(&input).trim_end()),
            format!("[1] {}", empty.trim_end()),
            format!("[2] {}", empty.trim_end()),
        ]
    );
}

#[test]
fn stdin_all_reaches_every_rank_and_none_reaches_none() {
    let input = b"hello ranks\n".repeat(10_000);
    let out = Run::new(&["--stdin", "all", "-n", "3", &rp(), "stdin-sum"])
        .stdin_bytes(input.clone())
        .run();
    out.assert_code(0);
    assert_eq!(
        out.stdout_str().matches(&stdin_sum_line(&input)).count(),
        3,
        "{}",
        out.stdout_str()
    );

    let out = Run::new(&["--stdin", "1", "-l", "-n", "2", &rp(), "stdin-sum"])
        .stdin_bytes(input.clone())
        .run();
    out.assert_code(0);
    assert!(
        out.stdout_str().contains(&format!("[1] {}", stdin_sum_line(&input))),
        "{}",
        out.stdout_str()
    );

    let out = Run::new(&["--stdin", "none", "-n", "2", &rp(), "stdin-is-devnull"])
        .stdin_bytes(input)
        .run();
    out.assert_code(0);
    assert_eq!(out.stdout_str().matches("stdin-devnull yes").count(), 2);
}

#[test]
fn ranks_without_stdin_read_dev_null_and_see_only_their_own_fds() {
    let out =
        Run::new(&["-l", "-n", "2", &rp(), "stdin-is-devnull", "fds", "env"]).stdin_piped().run();
    out.assert_code(0);
    let text = out.stdout_str();
    assert!(text.contains("[0] stdin-devnull no"), "{text}");
    assert!(text.contains("[1] stdin-devnull yes"), "{text}");
    let envs = envs_by_rank(&out.lines());
    for rank in 0..2 {
        let fd = &envs[&rank]["PMI_FD"];
        let expected = format!("[{rank}] fds 0,1,2,{fd}");
        assert!(text.lines().any(|l| l == expected), "rank {rank}: want {expected:?} in\n{text}");
    }
}

#[test]
fn exit_status_is_the_first_failure_and_names_the_culprit() {
    let out = Run::new(&["-n", "4", &rp(), "@3", "exit", "7", "sleep", "30"]).run();
    out.assert_code(7);
    let err = out.stderr_str();
    let host = hostname();
    assert!(err.contains("rlaunch: rank 3 (pid "), "{err}");
    assert!(err.contains(&format!(" on {host}) exited with code 7")), "{err}");
    // The ranks killed by the abort are not blamed.
    assert_eq!(rlaunch_lines(&err).len(), 1, "{err}");

    let out = Run::new(&["-n", "2", &rp(), "@0", "signal", "SIGSEGV", "sleep", "30"]).run();
    out.assert_code(139);
    assert!(out.stderr_str().contains("rank 0 (pid "), "{}", out.stderr_str());
    assert!(out.stderr_str().contains("was killed by signal 11 (SIGSEGV)"), "{}", out.stderr_str());

    Run::new(&["-n", "3", &rp(), "exit", "0"]).run().assert_code(0);
}

#[test]
fn print_all_exit_codes_lists_every_rank() {
    let out = Run::new(&["-print-all-exitcodes", "-n", "3", &rp(), "@1", "exit", "5"]).run();
    out.assert_code(5);
    let err = out.stderr_str();
    assert!(err.contains("rank 0 (pid ") && err.contains("exited with code 0"), "{err}");
    assert!(err.contains("rank 1 (pid ") && err.contains("exited with code 5"), "{err}");
    assert!(err.contains("rank 2 (pid "), "{err}");
}

#[test]
fn a_program_that_cannot_start_fails_at_once_with_127_or_126() {
    let start = Instant::now();
    let out = Run::new(&["-n", "2", "./no-such-program"]).run();
    out.assert_code(127);
    assert!(
        out.stderr_str().contains("rlaunch: cannot start ./no-such-program on "),
        "{}",
        out.stderr_str()
    );
    assert!(out.stderr_str().contains(": No such file or directory"), "{}", out.stderr_str());
    assert!(start.elapsed() < Duration::from_secs(10));

    let dir = rlaunch_tests::tempdir();
    let script = dir.path().join("not-executable");
    std::fs::write(&script, "#!/bin/sh\n").unwrap();
    let out = Run::new(&["-n", "1", script.to_str().unwrap()]).run();
    out.assert_code(126);
    assert!(out.stderr_str().contains("Permission denied"), "{}", out.stderr_str());
}

#[test]
fn a_failure_terminates_the_others_even_those_ignoring_sigterm() {
    let start = Instant::now();
    let out = Run::new(&[
        "--kill-grace",
        "0.5",
        "-n",
        "3",
        &rp(),
        "@0,1",
        "ignore-term",
        "ready",
        "@2",
        "exit",
        "4",
        "sleep",
        "60",
    ])
    .run();
    out.assert_code(4);
    assert!(start.elapsed() < Duration::from_secs(15), "took {:?}", start.elapsed());
    out.tag.wait_until_none(Duration::from_secs(2)).unwrap();
}

#[test]
fn signals_are_forwarded_to_every_rank() {
    for sig in [
        Signal::SIGINT,
        Signal::SIGTERM,
        Signal::SIGHUP,
        Signal::SIGQUIT,
        Signal::SIGUSR1,
        Signal::SIGUSR2,
    ] {
        let mut job = Run::new(&[
            "--launcher",
            "fork",
            "--hosts",
            "a,b",
            "-n",
            "2",
            &rp(),
            "ready",
            "wait-signal",
        ])
        .spawn();
        job.wait_for_ready(2, WAIT);
        job.signal(sig);
        let out = job.wait(WAIT);
        out.assert_code(0);
        assert_eq!(
            out.stdout_str().matches(&format!("got {}", sig.as_str())).count(),
            2,
            "{sig}: {}",
            out.stdout_str()
        );
    }
}

#[test]
fn a_second_interrupt_kills_the_job() {
    let mut job =
        Run::new(&["-n", "2", &rp(), "ignore-term", "ready", "wait-signal", "sleep", "60"]).spawn();
    job.wait_for_ready(2, WAIT);
    job.signal(Signal::SIGINT);
    job.wait_for_line(|l| l.contains("got SIGINT"), WAIT);
    job.wait_for_line(|l| l.contains("got SIGINT"), WAIT);
    job.signal(Signal::SIGINT);
    let out = job.wait(WAIT);
    out.assert_code(130);
    out.tag.wait_until_none(Duration::from_secs(2)).unwrap();
}

#[test]
fn sigtstp_stops_ranks_and_sigcont_resumes_them() {
    let mut job =
        Run::new(&["--stdin", "all", "-n", "2", &rp(), "ready", "stdin-sum"]).stdin_piped().spawn();
    let ready = job.wait_for_ready(2, WAIT);
    job.signal(Signal::SIGTSTP);
    let deadline = Instant::now() + WAIT;
    // rlaunch stops itself too, as a shell's job control expects.
    let pids: Vec<i32> =
        ready.iter().map(|(_, p)| p.as_raw()).chain([job.pid().as_raw()]).collect();
    while pids.iter().any(|&pid| procfs::state(pid) != 'T') {
        assert!(Instant::now() < deadline, "ranks and rlaunch did not stop");
        std::thread::sleep(Duration::from_millis(20));
    }
    job.signal(Signal::SIGCONT);
    while pids.iter().any(|&pid| procfs::state(pid) == 'T') {
        assert!(Instant::now() < deadline, "ranks did not continue");
        std::thread::sleep(Duration::from_millis(20));
    }
    job.close_stdin();
    job.wait(WAIT).assert_code(0);
}

#[test]
fn killing_rlaunch_leaves_nothing_behind_not_even_daemons() {
    let dir = rlaunch_tests::tempdir();
    let pidfile = dir.path().join("daemon-%r.pid");
    let pidfile = pidfile.to_str().unwrap().replace("%r", "x");
    let mut job = Run::new(&[
        "--launcher",
        "fork",
        "--hosts",
        "n1,n2",
        "-n",
        "2",
        &rp(),
        "@1",
        "daemon",
        &pidfile,
        "ready",
        "sleep",
        "60",
    ])
    .spawn();
    job.wait_for_ready(2, WAIT);
    let tag = job.tag().to_string();
    assert!(rlaunch_tests::tagged_processes(&tag).len() >= 6, "proxies, ranks and the daemon");
    job.signal(Signal::SIGKILL);
    rlaunch_tests::wait_until_no_tagged(&tag, Duration::from_secs(2))
        .unwrap_or_else(|left| panic!("left behind after kill -9 of rlaunch: {left:?}"));
}

/// `ranks` ranks over the fake nodes `hosts` (with `more` options), each waiting; returns the
/// job and each rank's pid.
fn waiting_fake_node_job(
    hosts: &str,
    ranks: u32,
    more: &[&str],
) -> (rlaunch_tests::Job, BTreeMap<u32, i32>) {
    let (n, rp) = (ranks.to_string(), rp());
    let placement = ["--launcher", "fork", "--hosts", hosts, "-n", &n];
    let args = [&placement[..], more, &[&rp, "ready", "sleep", "60"]].concat();
    let mut job = Run::new(&args).spawn();
    let ready = job.wait_for_ready(ranks as usize, WAIT);
    let pids = ready.into_iter().map(|(rank, pid)| (rank, pid.as_raw())).collect();
    (job, pids)
}

/// Two fake nodes whose ranks wait; returns the job and the pid of n2's proxy.
fn two_node_job_and_proxy_of_n2() -> (rlaunch_tests::Job, i32) {
    let (job, pids) = waiting_fake_node_job("n1,n2", 2, &[]);
    (job, procfs::parent_pid(pids[&1]))
}

/// Kills n2's proxy with SIGKILL: the job must end, say so, and leave nothing behind.
fn kill_the_proxy_of_n2(job: rlaunch_tests::Job, proxy: i32) {
    nix::sys::signal::kill(nix::unistd::Pid::from_raw(proxy), Signal::SIGKILL).unwrap();
    let out = job.wait(WAIT);
    assert_ne!(out.code, Some(0));
    assert!(out.stderr_str().contains("rlaunch: lost proxy on n2 ("), "{}", out.stderr_str());
    assert!(out.stderr_str().contains("SIGKILL"), "{}", out.stderr_str());
    out.tag.wait_until_none(Duration::from_secs(2)).unwrap();
}

#[test]
fn a_killed_proxy_ends_the_job_and_takes_its_ranks() {
    let (job, proxy) = two_node_job_and_proxy_of_n2();
    kill_the_proxy_of_n2(job, proxy);
}

/// Sixteen ranks on a node start on several threads at once. A rank's PR_SET_PDEATHSIG
/// follows the thread that started it, so those threads must live as long as the proxy:
/// the ranks run to their end, and go with the proxy when it is killed.
#[test]
fn ranks_started_in_parallel_live_and_die_with_their_proxy() {
    let out = Run::new(&["-n", "16", &rp(), "sleep", "0.5", "exit", "0"]).run();
    out.assert_code(0);

    let (job, pids) = waiting_fake_node_job("n1:1,n2:16", 17, &[]);
    kill_the_proxy_of_n2(job, procfs::parent_pid(pids[&1]));
}

#[test]
fn timeout_kills_the_job_with_124() {
    let start = Instant::now();
    let out = Run::new(&["--timeout", "1", "-n", "2", &rp(), "sleep", "60"]).run();
    out.assert_code(124);
    assert!(out.stderr_str().contains("timed out after 1 s"), "{}", out.stderr_str());
    assert!(start.elapsed() < Duration::from_secs(10));
    let out = Run::new(&["-n", "1", &rp(), "sleep", "60"]).env("MPIEXEC_TIMEOUT", "1").run();
    out.assert_code(124);
}

#[test]
fn a_proxy_of_another_protocol_version_is_named_clearly() {
    let dir = rlaunch_tests::tempdir();
    let rlaunch = dir.path().join("rlaunch");
    std::fs::copy(rlaunch_tests::rlaunch(), &rlaunch).unwrap();
    let fake = dir.path().join("rlaunch-proxy");
    std::fs::write(&fake, "#!/bin/sh\nprintf '\\177RLAUNCH\\000\\000\\000\\011'\nsleep 1\n")
        .unwrap();
    std::fs::set_permissions(&fake, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    // rlaunch forks the proxies of its own machine; proxies exec theirs: n2's is the fake.
    let args = ["--launcher", "fork", "--hosts", "n1,n2", "--tree-width", "1", "-n", "2", "true"];
    let out = Run::program(&rlaunch, &args).run();
    out.assert_code(255);
    let err = out.stderr_str();
    assert!(err.contains("lost proxy on n2"), "{err}");
    let ours = pmi_wire::control::PROTOCOL_VERSION;
    assert!(
        err.contains(&format!("protocol version 9, this rlaunch speaks version {ours}")),
        "{err}"
    );
}

#[test]
fn a_slow_reader_slows_the_ranks_down_without_growing_memory() {
    use std::io::Read;
    let tag = rlaunch_tests::Tag::new();
    let bytes_per_rank: u64 = 32 << 20;
    let mut child = std::process::Command::new(rlaunch_tests::rlaunch())
        .args(["-n", "4", &rp(), "flood", &bytes_per_rank.to_string()])
        .env(rlaunch_tests::TAG_VAR, tag.as_str())
        .stdout(std::process::Stdio::piped())
        .stdin(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let pid = child.id() as i32;
    let mut stdout = child.stdout.take().unwrap();
    // The reader stalls: the ranks have 256 MiB to write and can only fill the pipes and the
    // bounded queues. Watch rlaunch's memory meanwhile.
    let mut peak = 0;
    let mut first = [0u8; 64];
    stdout.read_exact(&mut first).unwrap();
    for _ in 0..20 {
        std::thread::sleep(Duration::from_millis(100));
        peak = peak.max(procfs::rss_kib(pid));
    }
    let mut rest = Vec::new();
    stdout.read_to_end(&mut rest).unwrap();
    let status = child.wait().unwrap();
    assert!(status.success(), "{status}");
    let mut all = first.to_vec();
    all.extend_from_slice(&rest);
    check_flood(&all, 4, bytes_per_rank).unwrap();
    assert!(peak < 48 << 10, "rlaunch grew to {peak} KiB while its reader stalled");
}

#[test]
fn a_hung_proxy_is_found_by_its_silence() {
    let (job, proxy) = two_node_job_and_proxy_of_n2();
    let start = Instant::now();
    nix::sys::signal::kill(nix::unistd::Pid::from_raw(proxy), Signal::SIGSTOP).unwrap();
    let out = job.wait(WAIT);
    assert_ne!(out.code, Some(0));
    assert!(
        out.stderr_str().contains("rlaunch: lost proxy on n2 (no word from it for 10 s)"),
        "{out}"
    );
    assert!(start.elapsed() < Duration::from_secs(25), "took {:?}", start.elapsed());
    out.tag.wait_until_none(Duration::from_secs(5)).unwrap();
}

#[test]
fn an_unknown_option_is_refused_not_run_as_the_program() {
    let out = Run::new(&["-n", "1", "--prepend-rnk", "true"]).run();
    out.assert_code(2);
    assert!(out.stderr_str().contains("'--prepend-rnk'"), "{out}");
    assert!(out.stderr_str().contains("'--prepend-rank'"), "{out}");
    // After the program, everything is the program's.
    let out =
        Run::new(&["-n", "1", "sh", "-c", "printf '%s|' \"$@\"", "sh", "-n", "--bogus"]).run();
    out.assert_code(0);
    assert_eq!(out.stdout_str(), "-n|--bogus|", "{out}");
}
