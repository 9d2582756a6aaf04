//! How a job ends when a rank fails: the exit status of the README's table (the first
//! failure's code, 128+signal, 126/127 for a program that cannot start, 124 for a timeout), the
//! one line that names the culprit, and the others terminated.

use std::time::{Duration, Instant};

use rlaunch_tests::hosts::hostname;
use rlaunch_tests::output::rlaunch_lines;
use rlaunch_tests::{procfs, rankprog_str, Run};

#[test]
fn exit_status_is_the_first_failure_and_names_the_culprit() {
    let out = Run::new(&["-n", "4", &rankprog_str(), "@3", "exit", "7", "sleep", "30"]).run();
    out.assert_code(7);
    let err = out.stderr_str();
    let host = hostname();
    assert!(err.contains("rlaunch: rank 3 (pid "), "{err}");
    assert!(err.contains(&format!(" on {host}) exited with code 7")), "{err}");
    // The ranks killed by the abort are not blamed.
    assert_eq!(rlaunch_lines(&err).len(), 1, "{err}");

    let out =
        Run::new(&["-n", "2", &rankprog_str(), "@0", "signal", "SIGSEGV", "sleep", "30"]).run();
    out.assert_code(139);
    assert!(out.stderr_str().contains("rank 0 (pid "), "{}", out.stderr_str());
    assert!(out.stderr_str().contains("was killed by signal 11 (SIGSEGV)"), "{}", out.stderr_str());

    Run::new(&["-n", "3", &rankprog_str(), "exit", "0"]).run().assert_code(0);
}

#[test]
fn print_all_exit_codes_lists_every_rank() {
    let mut job = Run::new(&["-print-all-exitcodes", "-n", "3", &rankprog_str()])
        .args(["ready", "@1", "wait-signal", "@1", "exit", "5"])
        .spawn();
    let ready = job.wait_for_ready(3, Duration::from_secs(20));
    // Ranks 0 and 2 end with 0 before rank 1 fails: the teardown cannot overtake them.
    let ended = |pid: i32| procfs::stat(pid).is_none_or(|s| s.state == 'Z');
    for &(_, pid) in ready.iter().filter(|(rank, _)| *rank != 1) {
        let start = Instant::now();
        while !ended(pid.as_raw()) {
            assert!(start.elapsed() < Duration::from_secs(10), "rank pid {pid} did not end");
            std::thread::sleep(Duration::from_millis(10));
        }
    }
    let rank1 = ready.iter().find(|(rank, _)| *rank == 1).expect("rank 1 is ready").1;
    nix::sys::signal::kill(rank1, nix::sys::signal::Signal::SIGUSR1).unwrap();
    let out = job.wait(Duration::from_secs(20));
    out.assert_code(5);
    let host = hostname();
    let err = out.stderr_str();
    let lines = rlaunch_lines(&err);
    let want: Vec<String> = ready
        .iter()
        .map(|&(rank, pid)| {
            let code = if rank == 1 { 5 } else { 0 };
            format!("rlaunch: rank {rank} (pid {pid} on {host}) exited with code {code}")
        })
        .collect();
    assert_eq!(lines, want, "{out}");
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
        &rankprog_str(),
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
fn timeout_kills_the_job_with_124() {
    let start = Instant::now();
    let out = Run::new(&["--timeout", "1", "-n", "2", &rankprog_str(), "sleep", "60"]).run();
    out.assert_code(124);
    assert!(out.stderr_str().contains("timed out after 1 s"), "{}", out.stderr_str());
    assert!(start.elapsed() < Duration::from_secs(10));
    let out =
        Run::new(&["-n", "1", &rankprog_str(), "sleep", "60"]).env("MPIEXEC_TIMEOUT", "1").run();
    out.assert_code(124);
}

#[test]
fn the_culprit_line_starts_a_line_of_its_own_after_a_rank_cut_short_mid_line() {
    // A rank killed mid-line (here: whose stderr ends without a newline) leaves rlaunch's
    // stderr mid-line; the culprit line comes after a newline, not glued to the rank's bytes.
    let out = Run::new(&["-n", "1", "sh", "-c", "printf cut >&2; exit 3"]).run();
    out.assert_code(3);
    let err = out.stderr_str();
    let (first, rest) = err.split_once('\n').unwrap_or_else(|| panic!("{err:?}"));
    assert_eq!(first, "cut", "{err:?}");
    assert!(
        rest.starts_with("rlaunch: rank 0 (pid ") && rest.ends_with(" exited with code 3\n"),
        "{err:?}"
    );
    // A whole last line gets no blank line after it.
    let out = Run::new(&["-n", "1", "sh", "-c", "echo whole >&2; exit 3"]).run();
    out.assert_code(3);
    let err = out.stderr_str();
    assert!(err.starts_with("whole\nrlaunch: rank 0 (pid "), "{err:?}");
}
