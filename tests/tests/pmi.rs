//! The PMI server of rlaunch against real clients: Slurm's `libpmi2` (a C program from
//! `tests/c/`), the Rust client of `pmi_wire::client` (`pmiprog`), and raw bytes that no
//! client would send. Whatever a rank sends, nothing may crash or hang: the job ends with one
//! line naming the rank and what it sent, and nothing is left running.

use std::time::Duration;

use rlaunch_tests::hosts::hostname;
use rlaunch_tests::mpi::CProgram;
use rlaunch_tests::output::{rlaunch_lines, sorted};
use rlaunch_tests::{pmiprog_str, tempdir, Outcome, Run};

/// The harness's bound for every run here.
const LIMIT: Duration = Duration::from_secs(40);
/// How fast a job with a misbehaving rank must end. pmiprog's own patience is 20 s, so a
/// launcher that merely waits for the rank to give up fails this.
const PROMPT: Duration = Duration::from_secs(10);
/// rlaunch's exit status when a rank broke the PMI protocol, closing its PMI socket before
/// finalize included (README, "Exit status").
const PROTOCOL_FAULT: i32 = 255;

/// rlaunch with `options`, then `-n n pmiprog script...`.
fn pmi_run(options: &[&str], n: u32, script: &[&str]) -> Run {
    Run::new(options)
        .args(["-n".to_string(), n.to_string(), pmiprog_str()])
        .args(script)
        .timeout(LIMIT)
}

/// The stdout lines that start with `prefix`, sorted.
fn lines_with(out: &Outcome, prefix: &str) -> Vec<String> {
    sorted(out.lines().into_iter().filter(|l| l.starts_with(prefix)))
}

#[test]
fn slurm_libpmi2_client_on_two_fake_nodes() {
    let out = Run::new(&["--launcher", "fork", "--hosts", "a:2,b:2", "-n", "4"])
        .arg(CProgram::Pmi2.path())
        .timeout(LIMIT)
        .run();
    out.assert_code(0);
    assert!(!out.stderr_str().contains("FAIL"), "{out}");
    let ok = lines_with(&out, "OK ");
    let jobids: std::collections::BTreeSet<&str> =
        ok.iter().filter_map(|line| line.split_once(" jobid ").map(|(_, id)| id)).collect();
    assert_eq!(jobids.len(), 1, "every rank sees the same job id: {out}");
    let jobid = jobids.into_iter().next().unwrap();
    let want = (0..4).flat_map(|rank| {
        // Node a holds ranks 0 and 1, node b ranks 2 and 3: each node's attribute is its own.
        let putter = rank / 2 * 2;
        [
            format!("OK {rank} init size 4 spawned 0 appnum 0"),
            format!("OK {rank} jobid {jobid}"),
            format!("OK {rank} kvs 4 keys"),
            format!("OK {rank} nodeattr put-by-{putter}"),
            format!("OK {rank} mapping (vector,(0,2,2))"),
            format!("OK {rank} finalized"),
        ]
    });
    assert_eq!(ok, sorted(want), "{out}");
}

#[test]
fn rust_client_allgathers_over_pmi1_and_pmi2() {
    let layouts: [&[&str]; 3] = [
        &[],
        &["--launcher", "fork", "--hosts", "a:2,b:2"],
        &["--pmi-port", "--launcher", "fork", "--hosts", "a:3,b:1"],
    ];
    for layout in layouts {
        for version in ["v1", "v2"] {
            let out = pmi_run(layout, 4, &[version, "allgather"]).run();
            out.assert_code(0);
            let want = sorted((0..4).map(|r| format!("allgather ok {r} 4")));
            assert_eq!(lines_with(&out, "allgather"), want, "{version} {layout:?}: {out}");
        }
    }
}

#[test]
fn a_put_is_visible_only_after_the_fence_to_every_rank_the_putter_included() {
    for version in ["v1", "v2"] {
        let out =
            pmi_run(&["--launcher", "fork", "--hosts", "a:2,b:2"], 4, &[version, "visibility"])
                .run();
        out.assert_code(0);
        let want = sorted((1..=2).flat_map(|round| {
            (0..4).flat_map(move |r| {
                [
                    format!("round {round} before {r} found=-"),
                    format!("round {round} after {r} found=0,1,2,3"),
                ]
            })
        }));
        assert_eq!(lines_with(&out, "round "), want, "{version}: {out}");
    }
}

#[test]
fn process_mapping_describes_the_fake_nodes() {
    for version in ["v1", "v2"] {
        let out = pmi_run(
            &["--launcher", "fork", "--hosts", "a:2,b:2"],
            4,
            &[version, "get", "PMI_process_mapping"],
        )
        .run();
        out.assert_code(0);
        let want = sorted((0..4).map(|r| format!("get {r} PMI_process_mapping=(vector,(0,2,2))")));
        assert_eq!(lines_with(&out, "get "), want, "{version}: {out}");
    }
    // One node: one triple holding every rank.
    let out = pmi_run(&[], 3, &["v1", "get", "PMI_process_mapping"]).run();
    out.assert_code(0);
    let want = sorted((0..3).map(|r| format!("get {r} PMI_process_mapping=(vector,(0,1,3))")));
    assert_eq!(lines_with(&out, "get "), want, "{out}");
}

/// Where a misbehaving rank runs: the job's options and size, which rank misbehaves, and the
/// host name rlaunch should blame. Every other rank is a bystander waiting in a fence.
struct Layout<'a> {
    options: &'a [&'a str],
    size: u32,
    bad: u32,
    host: String,
}

impl Layout<'_> {
    /// Two ranks on this machine; rank 1 misbehaves.
    fn local() -> Layout<'static> {
        Layout { options: &[], size: 2, bad: 1, host: hostname() }
    }

    /// Runs `script` on the bad rank once every bystander waits in its fence. The run is
    /// bounded by [`PROMPT`]: a launcher that hangs fails here.
    fn run(&self, script: &[&str]) -> Outcome {
        let dir = tempdir();
        let sync = dir.path().to_str().expect("the temporary directory is UTF-8");
        let only = format!("@{}", self.bad);
        let mut args = vec![only.as_str(), "--sync", sync];
        args.extend_from_slice(script);
        pmi_run(self.options, self.size, &args).timeout(PROMPT).run()
    }

    /// Checks that the job failed with `code` and one line from rlaunch, blaming the bad rank on
    /// its host and showing `sent`; that the bystanders were still waiting; that nothing is left.
    fn check_blamed(&self, out: &Outcome, code: i32, sent: &str) {
        out.assert_code(code);
        let err = out.stderr_str();
        let ours = rlaunch_lines(&err);
        assert_eq!(ours.len(), 1, "one line from rlaunch, naming the culprit only: {out}");
        let line = ours[0];
        assert!(line.starts_with(&format!("rlaunch: rank {} (pid ", self.bad)), "{out}");
        assert!(line.contains(&format!(" on {}) ", self.host)), "{out}");
        assert!(line.contains(sent), "the line should show {sent:?}: {out}");
        let stdout = out.stdout_str();
        for rank in (0..self.size).filter(|&r| r != self.bad) {
            assert!(stdout.contains(&format!("waiting {rank}\n")), "{out}");
        }
        assert!(!stdout.contains("fenced"), "no fence may complete: {out}");
        out.tag.wait_until_none(Duration::from_secs(5)).unwrap_or_else(|left| {
            panic!("left running after a bad rank: {left:?}");
        });
    }
}

/// [`Layout::local`]: runs `script` on rank 1 of 2.
fn bad_rank_run(script: &[&str]) -> Outcome {
    Layout::local().run(script)
}

/// [`Layout::check_blamed`] for [`Layout::local`].
fn check_blamed(out: &Outcome, code: i32, sent: &str) {
    Layout::local().check_blamed(out, code, sent);
}

#[test]
fn an_unknown_command_ends_the_job() {
    check_blamed(&bad_rank_run(&["raw", "cmd=frobnicate\\n"]), PROTOCOL_FAULT, "frobnicate");
    check_blamed(
        &bad_rank_run(&["raw", "--init", "cmd=frobnicate with=args\\n"]),
        PROTOCOL_FAULT,
        "frobnicate",
    );
}

#[test]
fn a_bad_rank_deep_in_the_proxy_tree_is_blamed_by_its_host() {
    // A chain of proxies a -> b -> c: the fault travels up two links to rlaunch.
    let options = ["--launcher", "fork", "--hosts", "a,b,c", "--tree-width", "1"];
    let layout = Layout { options: &options, size: 3, bad: 2, host: "c".into() };
    let out = layout.run(&["raw", "--init", "cmd=frobnicate\\n"]);
    layout.check_blamed(&out, PROTOCOL_FAULT, "frobnicate");
}

#[test]
fn an_unknown_pmi2_command_ends_the_job() {
    // The PMI-2 opening line, then a frame: a 6-byte length and the body.
    let bytes = "cmd=init pmi_version=2 pmi_subversion=0\\n15    cmd=frobnicate;";
    check_blamed(&bad_rank_run(&["raw", bytes]), PROTOCOL_FAULT, "frobnicate");
}

#[test]
fn a_get_from_a_foreign_kvsname_ends_the_job() {
    let out = bad_rank_run(&["raw", "--init", "cmd=get kvsname=wrong_kvs key=k0\\n"]);
    check_blamed(&out, PROTOCOL_FAULT, "wrong_kvs");
}

#[test]
fn an_overlong_line_ends_the_job() {
    // 2000 bytes and no newline: a real client never sends this (PMI-1 lines are at most 1024
    // bytes), and a server that waits for the newline hangs.
    let line = format!("cmd=put kvsname=x key=k value={}", "a".repeat(2000 - 30));
    assert_eq!(line.len(), 2000);
    check_blamed(&bad_rank_run(&["raw", "--init", &line]), PROTOCOL_FAULT, "cmd=put kvsname=x");
}

#[test]
fn garbage_bytes_end_the_job() {
    let garbage = "\\x00\\xff\\xfe\\x80\\x01".repeat(400);
    // However rlaunch quotes the bytes, the leading NUL must show somehow.
    let nul = ["\\0", "\\x00", "\\u{0}", "\\u0000"];
    for script in [&["raw", "--init", &garbage][..], &["raw", &garbage]] {
        let out = bad_rank_run(script);
        let err = out.stderr_str();
        let shown = rlaunch_lines(&err).iter().any(|l| nul.iter().any(|n| l.contains(n)));
        assert!(shown, "the line should show what the rank sent: {out}");
        check_blamed(&out, PROTOCOL_FAULT, "rank 1");
    }
}

#[test]
fn a_pmi2_abort_ends_the_job_with_its_message() {
    let bytes = "cmd=init pmi_version=2 pmi_subversion=0\\n31    cmd=abort;isworld=TRUE;msg=bye;";
    let out = bad_rank_run(&["raw", bytes]);
    check_blamed(&out, 1, "aborted the job with exit code 1: bye");
}

#[test]
fn end_of_file_before_finalize_fails_the_rank() {
    // docs/pmi.md, *Who answers what*: a rank whose PMI socket closes before finalize has failed, even if it exits
    // with 0 (Hydra records exit status 1).
    let out = pmi_run(&[], 1, &["v1", "quit"]).timeout(PROMPT).run();
    assert!(out.stdout_str().contains("quitting 0\n"), "{out}");
    out.assert_code(PROTOCOL_FAULT);
    let err = out.stderr_str();
    let ours = rlaunch_lines(&err);
    assert_eq!(ours.len(), 1, "{out}");
    assert!(ours[0].starts_with("rlaunch: rank 0 (pid "), "{out}");
}

#[test]
fn end_of_file_before_finalize_does_not_leave_the_others_waiting() {
    // The bystander waits in a fence that rank 1 will never enter: only tearing the job down
    // ends it.
    for version in ["v1", "v2"] {
        let out = bad_rank_run(&[version, "quit"]);
        assert!(out.stdout_str().contains("quitting 1\n"), "{out}");
        check_blamed(&out, PROTOCOL_FAULT, "rank 1");
    }
}

#[test]
fn ranks_that_never_speak_pmi_are_fine() {
    let out = Run::new(&["-n", "3", "true"]).timeout(LIMIT).run();
    out.assert_code(0);
    assert_eq!(out.stderr_str(), "", "{out}");
    let out =
        Run::new(&["--launcher", "fork", "--hosts", "a,b", "-n", "2", "true"]).timeout(LIMIT).run();
    out.assert_code(0);
    // Side by side with a rank that does speak PMI (init, get, finalize; no fence).
    let script = format!(
        "if [ \"$PMI_RANK\" = 0 ]; then exec {} v1 get PMI_process_mapping; fi",
        pmiprog_str()
    );
    let out = Run::new(&["-n", "2", "/bin/sh", "-c", &script]).timeout(LIMIT).run();
    out.assert_code(0);
    assert_eq!(out.stdout_str(), "get 0 PMI_process_mapping=(vector,(0,1,2))\n", "{out}");
}

/// A PMI-1 `init` on the rank's PMI_FD, in bash.
const BASH_INIT: &str =
    "printf 'cmd=init pmi_version=1 pmi_subversion=1\\n' >&$PMI_FD; read -r -u $PMI_FD reply";

#[test]
fn a_failing_rank_is_named_even_while_its_child_holds_its_pmi_socket() {
    // Rank 0 leaves a child that inherits its PMI socket and fails; rank 1 waits in a fence
    // that will not complete. The failure must end the job now, not when the child ends.
    let script = format!(
        "{BASH_INIT}; if [ $PMI_RANK = 0 ]; then (sleep 300 </dev/null >/dev/null 2>&1 &); \
         exit 3; fi; printf 'cmd=barrier_in\\n' >&$PMI_FD; read -r -u $PMI_FD reply"
    );
    let start = std::time::Instant::now();
    let out = Run::new(&["-n", "2", "bash", "-c", &script]).timeout(LIMIT).run();
    out.assert_code(3);
    assert!(start.elapsed() < PROMPT, "took {:?}", start.elapsed());
    let err = out.stderr_str();
    let ours = rlaunch_lines(&err);
    assert_eq!(ours.len(), 1, "{out}");
    assert!(ours[0].starts_with("rlaunch: rank 0 (pid "), "{out}");
    assert!(ours[0].ends_with(&format!(" on {}) exited with code 3", hostname())), "{out}");
    out.tag.wait_until_none(Duration::from_secs(5)).unwrap();
}

#[test]
fn a_rank_that_leaves_pmi_and_lives_on_ends_the_job_at_once() {
    // Its peers would wait for it in their next fence for ever.
    let script = format!("{BASH_INIT}; eval \"exec $PMI_FD>&-\"; sleep 30");
    let start = std::time::Instant::now();
    let out = Run::new(&["-n", "2", "bash", "-c", &script]).timeout(LIMIT).run();
    out.assert_code(255);
    assert!(start.elapsed() < PROMPT, "took {:?}", start.elapsed());
    let err = out.stderr_str();
    let ours = rlaunch_lines(&err);
    assert_eq!(ours.len(), 1, "{out}");
    let host = hostname();
    let line = ours[0];
    assert!(line.starts_with("rlaunch: rank ") && line.contains(" (pid "), "{out}");
    assert!(
        line.ends_with(&format!(" on {host}) closed its PMI connection before calling finalize")),
        "{out}"
    );
    out.tag.wait_until_none(Duration::from_secs(5)).unwrap();
}
