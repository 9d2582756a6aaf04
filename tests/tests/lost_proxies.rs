//! Losing a proxy: killed, hung (found by its silence), or speaking another protocol version.
//! The job must end, say which node it lost and why, and leave nothing behind.

use std::time::{Duration, Instant};

use nix::sys::signal::Signal;
use rlaunch_tests::hosts::waiting_fake_node_job;
use rlaunch_tests::{procfs, rankprog_str, Run};

const WAIT: Duration = Duration::from_secs(30);

/// Two fake nodes whose ranks wait; returns the job and the pid of n2's proxy.
fn two_node_job_and_proxy_of_n2() -> (rlaunch_tests::Job, i32) {
    let (job, pids) = waiting_fake_node_job("n1,n2", 2, &[]);
    (job, procfs::parent_pid(pids[&1]))
}

/// Kills n2's proxy with SIGKILL: the job must end, say so, and leave nothing behind.
fn kill_the_proxy_of_n2(job: rlaunch_tests::Job, proxy: i32) {
    nix::sys::signal::kill(nix::unistd::Pid::from_raw(proxy), Signal::SIGKILL).unwrap();
    let out = job.wait(WAIT);
    out.assert_code(255);
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
    let out = Run::new(&["-n", "16", &rankprog_str(), "sleep", "0.5", "exit", "0"]).run();
    out.assert_code(0);

    let (job, pids) = waiting_fake_node_job("n1:1,n2:16", 17, &[]);
    kill_the_proxy_of_n2(job, procfs::parent_pid(pids[&1]));
}

#[test]
fn a_hung_proxy_is_found_by_its_silence() {
    // A heartbeat every 0.2 s, and 1 s of silence is a lost proxy (the defaults are 2 and 10).
    let liveness = ["--heartbeat", "0.2", "--silence-timeout", "1"];
    let (job, pids) = waiting_fake_node_job("n1,n2", 2, &liveness);
    let proxy = procfs::parent_pid(pids[&1]);
    let start = Instant::now();
    nix::sys::signal::kill(nix::unistd::Pid::from_raw(proxy), Signal::SIGSTOP).unwrap();
    let out = job.wait(WAIT);
    out.assert_code(255);
    assert!(
        out.stderr_str().contains("rlaunch: lost proxy on n2 (no word from it for 1 s)"),
        "{out}"
    );
    // 1 s of silence, then the kill grace (1 s) and the SIGKILL of what is left.
    assert!(start.elapsed() < Duration::from_secs(6), "took {:?}", start.elapsed());
    out.tag.wait_until_none(Duration::from_secs(5)).unwrap();
}

/// A node whose ranks take longer to start than the silence timeout is not lost: its proxy
/// keeps its heartbeat going between slices of ranks, and does not take its parent's queued
/// heartbeats for silence. Two nodes of 5,000 ranks each take about 6 s to start here; with
/// the whole start in one stretch, both were lost. The silence is 5 s, not less: beside two
/// busy loops the kernel left a proxy runnable and not run for up to 2.9 s (with 1 s of
/// silence and 1,500 ranks a node, this test failed so; docs/reliability.md).
#[test]
fn a_launch_longer_than_the_silence_timeout_is_not_a_lost_node() {
    let out = Run::new(&["--launcher", "fork", "--hosts", "n1:5000,n2:5000"])
        .args(["--heartbeat", "0.2", "--silence-timeout", "5", "-n", "10000", "/bin/true"])
        .timeout(Duration::from_secs(120))
        .run();
    out.assert_code(0);
    assert_eq!(out.stderr_str(), "");
}

#[test]
fn a_proxy_of_another_protocol_version_is_named_clearly() {
    let dir = rlaunch_tests::tempdir();
    let rlaunch = dir.path().join("rlaunch");
    std::fs::copy(rlaunch_tests::rlaunch(), &rlaunch).unwrap();
    let fake = dir.path().join("rlaunch-proxy");
    // A version this rlaunch does not speak: one past its own, as 4 bytes big-endian.
    let theirs = rlaunch_protocol::control::PROTOCOL_VERSION + 1;
    let version: String = theirs.to_be_bytes().iter().map(|b| format!("\\{b:03o}")).collect();
    std::fs::write(&fake, format!("#!/bin/sh\nprintf '\\177RLAUNCH{version}'\nsleep 1\n")).unwrap();
    std::fs::set_permissions(&fake, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    // rlaunch forks the proxies of its own machine (and they theirs); a remote shell execs
    // the proxy path it is given: n1's is the fake.
    let ssh = rlaunch_tests::fakessh();
    let fake_path = fake.to_str().unwrap();
    let args = ["--launcher", "ssh", "--launcher-exec", &ssh, "--proxy-path", fake_path];
    let args = [&args[..], &["--hosts", "n1", "-n", "1", "true"]].concat();
    let out = Run::program(&rlaunch, &args).run();
    out.assert_code(255);
    let err = out.stderr_str();
    assert!(err.contains("lost proxy on n1"), "{err}");
    let ours = rlaunch_protocol::control::PROTOCOL_VERSION;
    assert!(
        err.contains(&format!("protocol version {theirs}, this rlaunch speaks version {ours}")),
        "{err}"
    );
}

/// The proxy held in `exit_group` and stopped there, as `kill -STOP` on its way out would:
/// strace fails the call and sends SIGSTOP. Returns strace, once attached.
fn stop_on_exit(proxy: i32) -> std::process::Child {
    let inject = "inject=exit_group:error=ENOSYS:signal=SIGSTOP";
    let args = ["-o", "/dev/null", "-e", "trace=exit_group", "-e", inject, "-p"];
    let mut strace = std::process::Command::new("strace")
        .args(args)
        .arg(proxy.to_string())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let status = format!("/proc/{proxy}/status");
    let deadline = Instant::now() + Duration::from_secs(10);
    while Instant::now() < deadline {
        match std::fs::read_to_string(&status) {
            Ok(text) if text.contains("TracerPid:\t0\n") => {}
            Ok(_) => return strace,
            Err(_) => break,
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    let _ = strace.kill();
    let _ = strace.wait();
    panic!("strace did not attach to {proxy}");
}

/// A proxy that finished its node and closed its link, then stopped before its process
/// ended (found by the chaos runner: rlaunch waited for its exit for ever). It gets the
/// proxies' grace (5 s) and SIGKILL; the job had succeeded, so rlaunch exits 0.
#[test]
fn a_proxy_stopped_on_its_way_out_is_killed_after_the_grace() {
    let mut job = Run::new(&["-n", "1", &rankprog_str(), "ready", "sleep", "1"]).spawn();
    let ready = job.wait_for_ready(1, WAIT);
    let proxy = procfs::parent_pid(ready[0].1.as_raw());
    let mut strace = stop_on_exit(proxy);
    let start = Instant::now();
    let out = job.wait(WAIT);
    out.assert_code(0);
    let took = start.elapsed();
    assert!(took > Duration::from_secs(5) && took < Duration::from_secs(9), "took {took:?}");
    assert!(out.stderr_str().contains("proxy outlived its connection; killing it"), "{out}");
    assert!(strace.wait().unwrap().success());
    out.tag.wait_until_none(Duration::from_secs(2)).unwrap();
}

/// The forked proxy stopped before it said hello (strace stops it at its runtime's second
/// epoll_create1, before the greeting goes out): a forked proxy has no login to wait for, so
/// the silence timeout finds it, not the 30 s hello wait for ssh.
#[test]
fn a_forked_proxy_stopped_before_its_hello_is_found_by_its_silence() {
    let rlaunch = rlaunch_tests::rlaunch();
    let rlaunch = rlaunch.to_str().unwrap();
    let stop = "inject=epoll_create1:signal=SIGSTOP:when=2";
    let args = ["-f", "-o", "/dev/null", "-e", "trace=epoll_create1", "-e", stop, rlaunch];
    let liveness = ["--heartbeat", "0.2", "--silence-timeout", "1"];
    let rank = ["-n", "1", &rankprog_str(), "print", "1"];
    let start = Instant::now();
    let out = Run::program("strace", &args).args(liveness).args(rank).timeout(WAIT).run();
    out.assert_code(255);
    assert!(out.stderr_str().contains("(no word from it for 1 s)"), "{out}");
    assert!(start.elapsed() < Duration::from_secs(6), "took {:?}", start.elapsed());
}
