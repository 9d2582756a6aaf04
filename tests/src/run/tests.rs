//! The harness itself, driven with `sh` so that it needs no built binary.

use std::panic::{catch_unwind, AssertUnwindSafe};

use super::outcome::{excerpt, EXCERPT};
use super::*;
use crate::procs::wait_until_no_tagged;

fn sh(script: &str) -> Run {
    Run::program("/bin/sh", &["-c", script])
}

/// Runs `f`, which must panic, and returns the panic message.
fn panic_message(f: impl FnOnce()) -> String {
    let payload = catch_unwind(AssertUnwindSafe(f)).expect_err("expected a panic");
    match payload.downcast::<String>() {
        Ok(message) => *message,
        Err(payload) => {
            payload.downcast::<&str>().map_or_else(|_| String::new(), |m| (*m).to_owned())
        }
    }
}

#[test]
fn run_collects_output_and_exit_code() {
    let out = sh("echo out; echo err >&2; printf tail; exit 3").run();
    out.assert_code(3);
    assert_eq!(out.stdout, b"out\ntail");
    assert_eq!(out.stderr_str(), "err\n");
    assert_eq!(out.lines(), ["out", "tail"]);
    assert_eq!(out.signal(), None);
}

#[test]
fn run_reports_a_signal() {
    let out = sh("kill -TERM $$").run();
    out.assert_signal(Signal::SIGTERM);
    assert_eq!(out.code, None);
    assert!(out.to_string().contains("was killed by SIGTERM"), "{out}");
}

#[test]
fn environment_carries_the_tag() {
    let run =
        sh("echo \"$RLAUNCH_TEST_TAG $FOO ${HOME:-unset}\"").env("FOO", "bar").env_remove("HOME");
    let tag = run.tag().to_owned();
    let out = run.run();
    assert_eq!(out.stdout_str(), format!("{tag} bar unset\n"));
    assert_eq!(out.tag.as_str(), tag);
}

#[test]
fn stdin_bytes_and_cwd() {
    let dir = crate::tempdir();
    let input: Vec<u8> = (0..1_000_000u32).map(|i| (i % 251) as u8).collect();
    let out = Run::program("cat", &[]).stdin_bytes(input.clone()).run();
    assert_eq!(out.stdout, input);
    let out = Run::program("pwd", &[]).current_dir(dir.path()).run();
    assert_eq!(out.stdout_str().trim_end(), dir.path().to_str().unwrap());
}

#[test]
fn stdin_defaults_to_null() {
    let out = sh("cat; echo end").run();
    assert_eq!(out.stdout_str(), "end\n");
}

#[test]
fn job_waits_for_lines_and_takes_signals() {
    let mut job = sh("echo one; echo ready 1 42; echo '[0] ready 0 41'; exec sleep 30").spawn();
    assert_eq!(
        job.wait_for_ready(2, Duration::from_secs(10)),
        [(0, Pid::from_raw(41)), (1, Pid::from_raw(42))]
    );
    assert!(job.try_status().is_none());
    job.signal(Signal::SIGTERM);
    let out = job.wait(Duration::from_secs(10));
    out.assert_signal(Signal::SIGTERM);
    assert_eq!(out.lines(), ["one", "ready 1 42", "[0] ready 0 41"]);
}

#[test]
fn job_stdin_pipe() {
    let mut job = Run::program("cat", &[]).stdin_piped().spawn();
    job.write_stdin(b"ping\n");
    let line = job.wait_for_line(|l| l == "ping", Duration::from_secs(10));
    assert_eq!(line, "ping");
    job.write_stdin(b"last");
    let out = job.wait(Duration::from_secs(10));
    out.assert_code(0);
    assert_eq!(out.stdout, b"ping\nlast");
}

#[test]
fn stderr_lines_and_a_last_line_without_newline() {
    let mut job = sh("echo a >&2; printf b >&2").spawn();
    job.wait_for_stderr_line(|l| l == "a", Duration::from_secs(10));
    job.wait_for_stderr_line(|l| l == "b", Duration::from_secs(10));
    job.wait(Duration::from_secs(10)).assert_code(0);
}

#[test]
fn a_missing_line_fails_with_the_output() {
    let mut job = sh("echo something else; echo oops >&2").spawn();
    let message = panic_message(|| {
        job.wait_for_line(|l| l == "never", Duration::from_secs(10));
    });
    assert!(message.contains("stdout ended before the awaited line"), "{message}");
    assert!(message.contains("something else") && message.contains("oops"), "{message}");
}

#[test]
fn a_timeout_kills_every_tagged_process() {
    let run = sh("sleep 30 & echo started; wait").timeout(Duration::from_millis(300));
    let tag = run.tag().to_owned();
    let message = panic_message(|| drop(run.run()));
    assert!(message.contains("still running after 300ms"), "{message}");
    assert!(message.contains("started"), "{message}");
    assert!(message.contains("(sleep)"), "{message}");
    assert_eq!(wait_until_no_tagged(&tag, Duration::from_secs(10)), Ok(()));
}

#[test]
fn a_leaked_holder_of_stdout_is_named() {
    let run = sh("sleep 30 & echo bye").timeout(Duration::from_millis(500));
    let tag = run.tag().to_owned();
    let message = panic_message(|| drop(run.run()));
    assert!(
        message.contains("exited with code 0, but its stdout or stderr was still open"),
        "{message}"
    );
    assert!(message.contains("(sleep)") && message.contains("bye"), "{message}");
    assert_eq!(wait_until_no_tagged(&tag, Duration::from_secs(10)), Ok(()));
}

#[test]
fn dropping_the_outcome_kills_leftovers() {
    let out = sh("sleep 30 >/dev/null 2>&1 & echo $!").run();
    let pid: i32 = out.stdout_str().trim().parse().unwrap();
    let tag = out.tag.as_str().to_owned();
    let found = out.tag.wait_until_running(1, Duration::from_secs(10));
    assert!(found.as_ref().is_ok_and(|f| f[0].pid.as_raw() == pid), "{found:?}");
    drop(out);
    assert_eq!(wait_until_no_tagged(&tag, Duration::from_secs(10)), Ok(()));
}

#[test]
fn dropping_a_job_kills_it_and_its_descendants() {
    let mut job = sh("sleep 30 & echo ready 0 $!; exec sleep 30").spawn();
    job.wait_for_ready(1, Duration::from_secs(10));
    let tag = job.tag().to_owned();
    let found = crate::wait_until_tagged(&tag, 2, Duration::from_secs(10));
    assert_eq!(found.map(|f| f.len()), Ok(2));
    drop(job);
    assert_eq!(wait_until_no_tagged(&tag, Duration::from_secs(10)), Ok(()));
}

#[test]
fn helpers() {
    assert_eq!(parse_ready("ready 3 77"), Some((3, Pid::from_raw(77))));
    assert_eq!(parse_ready("[3] ready 3 77"), Some((3, Pid::from_raw(77))));
    assert_eq!(parse_ready("ready 3"), None);
    assert_eq!(parse_ready("ready 3 77 more"), None);
    assert_eq!(
        command_line(Path::new("/x/rlaunch"), &["-n".into(), "a b".into()]),
        "rlaunch -n 'a b'"
    );
    let long = vec![b'x'; 3 * EXCERPT];
    assert!(excerpt(&long).contains(&format!("[... {} bytes cut ...]", 2 * EXCERPT)));
}
