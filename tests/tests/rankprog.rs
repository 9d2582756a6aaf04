//! `rankprog` on its own, without rlaunch: the helper must be right before it can judge the
//! launcher.

use std::time::Duration;

use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;
use rlaunch_tests::{
    check_flood, flood_lines, rankprog, scan_flood, stdin_sum_line, tempdir, Run, TAG_VAR,
};

const T: Duration = Duration::from_secs(20);

fn rankprog_run(script: &[&str]) -> Run {
    Run::program(rankprog(), script).env_remove("PMI_RANK")
}

#[test]
fn prints_with_rank_filters() {
    let script = [
        "print",
        "2",
        "@1",
        "echo",
        "one",
        "@0,2",
        "echo",
        "zero-or-two",
        "eprint",
        "1",
        "noeol",
        "end",
    ];
    let out = rankprog_run(&script).env("PMI_RANK", "1").run();
    out.assert_code(0);
    assert_eq!(out.stdout_str(), "rank 1 line 0\nrank 1 line 1\none\nend");
    assert_eq!(out.stderr_str(), "rank 1 line 0\n");
    let out = rankprog_run(&script).run();
    assert_eq!(out.stdout_str(), "rank 0 line 0\nrank 0 line 1\nzero-or-two\nend");
}

#[test]
fn bad_scripts_exit_99() {
    for script in [&["frobnicate"][..], &["print"], &["print", "x"], &["@1"], &["@x", "cwd"]] {
        let out = rankprog_run(script).run();
        out.assert_code(99);
        assert!(out.stderr_str().starts_with("rankprog: "), "{out}");
    }
    let out = rankprog_run(&["cwd", "bogus"]).run();
    assert!(out.stderr_str().contains("unknown command \"bogus\""), "{out}");
    assert!(out.stdout.is_empty(), "{out}");
}

#[test]
fn flood_matches_the_checker() {
    let out = rankprog_run(&["flood", "1000000"]).env("PMI_RANK", "2").run();
    out.assert_code(0);
    assert_eq!(out.stdout.len() as u64, flood_lines(1_000_000) * 64);
    let report = scan_flood(&out.stdout).unwrap();
    assert_eq!(report.lines.get(&2), Some(&flood_lines(1_000_000)));

    let out = rankprog_run(&["flood", "100", "flood", "0"]).run();
    check_flood(&out.stdout, 1, 128).unwrap();
}

#[test]
fn flood_for_writes_checkable_lines_for_its_time() {
    let start = std::time::Instant::now();
    let out = rankprog_run(&["flood-for", "0.3", "echo", "done"]).env("PMI_RANK", "5").run();
    let took = start.elapsed();
    out.assert_code(0);
    let (flood, done) = out.stdout.split_at(out.stdout.len() - b"done\n".len());
    assert_eq!(done, b"done\n");
    let report = scan_flood(flood).unwrap();
    // Whole writes of 1024 lines, at least one.
    let lines = report.lines[&5];
    assert!(lines >= 1024 && lines.is_multiple_of(1024), "{lines} lines");
    assert!(took >= Duration::from_millis(300), "{took:?}");
    rankprog_run(&["flood-for", "-1"]).run().assert_code(99);
}

#[test]
fn binary_bytes() {
    let out = rankprog_run(&["binary"]).run();
    assert_eq!(out.stdout, (0..=255).collect::<Vec<u8>>());
}

#[test]
fn exit_codes_and_signals() {
    rankprog_run(&["echo", "x", "exit", "7", "echo", "never"]).run().assert_code(7);
    rankprog_run(&["signal", "15"]).run().assert_signal(Signal::SIGTERM);
    rankprog_run(&["ignore-term", "signal", "TERM"]).run().assert_signal(Signal::SIGTERM);
    rankprog_run(&["signal", "SIGUSR1"]).run().assert_signal(Signal::SIGUSR1);
}

#[test]
fn stdin_commands() {
    let input: Vec<u8> = (0..3_000_000u32).map(|i| (i * 7 % 256) as u8).collect();
    let out = rankprog_run(&["stdin-sum"]).stdin_bytes(input.clone()).run();
    assert_eq!(out.stdout_str(), stdin_sum_line(&input));
    let out = rankprog_run(&["cat"]).stdin_bytes(input.clone()).run();
    assert!(out.stdout == input, "cat changed its input");

    let out = rankprog_run(&["stdin-is-devnull"]).run();
    assert_eq!(out.stdout_str(), "stdin-devnull yes\n");
    let out = rankprog_run(&["stdin-is-devnull"]).stdin_bytes("x").run();
    assert_eq!(out.stdout_str(), "stdin-devnull no\n");
}

#[test]
fn environment_directory_and_argv() {
    let dir = tempdir();
    let run = rankprog_run(&["env", "cwd", "args"]).env("ZZ_LAST", "z").current_dir(dir.path());
    let out = run.run();
    let lines = out.lines();
    let tag_line = format!("{TAG_VAR}={}", out.tag);
    let env = &lines[..lines.len() - 2];
    assert!(env.contains(&tag_line), "{out}");
    assert!(env.contains(&"ZZ_LAST=z".to_owned()), "{out}");
    let mut sorted = env.to_vec();
    sorted.sort();
    assert_eq!(env, sorted);
    assert_eq!(lines[lines.len() - 2], dir.path().to_str().unwrap());
    let argv0 = rankprog();
    assert_eq!(lines[lines.len() - 1], format!("{}|env|cwd|args", argv0.display()));
}

#[test]
fn fds_lists_the_standard_three_first() {
    let out = rankprog_run(&["fds"]).run();
    assert!(out.stdout_str().starts_with("fds 0,1,2"), "{out}");
}

#[test]
fn wait_signal_catches_a_signal_sent_right_after_ready() {
    for sig in [Signal::SIGINT, Signal::SIGHUP, Signal::SIGQUIT, Signal::SIGUSR2] {
        let mut job = rankprog_run(&["ready", "wait-signal", "echo", "after"]).spawn();
        job.wait_for_ready(1, T);
        job.signal(sig);
        let out = job.wait(T);
        out.assert_code(0);
        assert_eq!(out.lines()[1..], [format!("got {sig}"), "after".to_owned()]);
    }
}

#[test]
fn after_the_last_wait_signal_signals_act_again() {
    let mut job = rankprog_run(&["ready", "wait-signal", "ready", "sleep", "60"]).spawn();
    job.wait_for_ready(1, T);
    job.signal(Signal::SIGUSR1);
    job.wait_for_line(|l| l == "got SIGUSR1", T);
    job.wait_for_ready(1, T);
    job.signal(Signal::SIGINT);
    job.wait(T).assert_signal(Signal::SIGINT);
}

#[test]
fn ignore_term_leaves_term_out_of_wait_signal() {
    let mut job = rankprog_run(&["ignore-term", "ready", "wait-signal"]).spawn();
    let ready = job.wait_for_ready(1, T);
    assert_eq!(ready[0].1, job.pid());
    job.signal(Signal::SIGTERM);
    job.signal(Signal::SIGUSR1);
    let out = job.wait(T);
    out.assert_code(0);
    assert_eq!(out.lines()[1], "got SIGUSR1");
}

#[test]
fn daemon_outlives_the_rank_and_keeps_stdout() {
    let dir = tempdir();
    let pidfile = dir.join("daemon.pid");
    let mut job = rankprog_run(&["daemon", pidfile.to_str().unwrap(), "echo", "rank-done"]).spawn();
    job.wait_for_line(|l| l == "rank-done", T);
    job.wait_exit(T);
    let pid: i32 = std::fs::read_to_string(&pidfile).unwrap().trim().parse().unwrap();
    let running = rlaunch_tests::tagged_processes(job.tag());
    assert!(running.iter().any(|p| p.pid.as_raw() == pid && p.is_running()), "{running:?}");
    assert!(job.stdout_so_far().ends_with(b"rank-done\n"));
    // The daemon holds stdout open: the output ends only with it.
    kill(Pid::from_raw(pid), Signal::SIGTERM).unwrap();
    let out = job.wait(T);
    out.assert_code(0);
    assert_eq!(out.tag.wait_until_none(T), Ok(()));
}
