//! `--max-restarts`: a failed job torn down and started again as a fresh attempt, saying
//! one line a restart; what is not worth a restart (a program that cannot start, the user's
//! Ctrl-C) is not restarted. A torch DDP job (Debian's `python3-torch`, gloo) whose rank dies
//! mid-training resumes from its checkpoint and ends with an uninterrupted run's parameters;
//! XGBoost (Debian's 1.7, PyPI's 3.2) under `--tracker rabit`, served afresh for the new
//! attempt, trains the model an uninterrupted run trains.

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use nix::sys::signal::Signal;
use rlaunch_tests::output::rlaunch_lines;
use rlaunch_tests::{torch_job, venv_python, xgboost_job, Outcome, Run};

const WAIT: Duration = Duration::from_secs(30);

/// Each rank says its attempt as both variables give it, the most restarts, its rank and
/// the rendezvous port; then, in the attempts before `fail_until`, rank 1 exits 3.
fn attempt_script(fail_until: u32) -> String {
    format!(
        "echo attempt $RLAUNCH_RESTART_COUNT $TORCHELASTIC_RESTART_COUNT \
         $TORCHELASTIC_MAX_RESTARTS rank $PMI_RANK port $MASTER_PORT; \
         if [ $RLAUNCH_RESTART_COUNT -lt {fail_until} ] && [ $PMI_RANK = 1 ]; then exit 3; fi; \
         sleep 0.3"
    )
}

/// The restart line rlaunch prints for a rank's end, with its pid cut out.
fn without_pid(line: &str) -> String {
    match (line.find("(pid "), line.find(" on ")) {
        (Some(a), Some(b)) if a < b => format!("{}(pid P{}", &line[..a], &line[b..]),
        _ => line.to_string(),
    }
}

/// rlaunch's own lines on the job's stderr, pids cut out.
fn said(out: &Outcome) -> Vec<String> {
    rlaunch_lines(&out.stderr_str()).into_iter().map(without_pid).collect()
}

#[test]
fn a_rank_that_fails_once_restarts_the_job_which_then_completes() {
    let tmp = rlaunch_tests::tempdir();
    let report = tmp.path().join("report.json");
    let timeline = tmp.path().join("timeline.json");
    let host = rlaunch_tests::hosts::hostname();
    let out = Run::new(&["-n", "3", "--max-restarts", "2", "--report"])
        .arg(report.to_str().unwrap())
        .arg("--timeline")
        .arg(timeline.to_str().unwrap())
        .args(["sh", "-c", &attempt_script(1)])
        .timeout(WAIT)
        .run();
    out.assert_code(0);
    let said = said(&out);
    let restart = format!(
        "rlaunch: rank 1 (pid P on {host}) exited with code 3; restarting the job (restart 1 of 2)"
    );
    assert_eq!(said, [restart], "{out}");
    // Every rank ran in attempt 1, which knew itself as such; no attempt 2.
    let lines = out.lines();
    let attempt = |n: u32| -> BTreeSet<String> {
        let head = format!("attempt {n} {n} 2 rank ");
        lines.iter().filter_map(|l| l.strip_prefix(&head)).map(|r| r[..1].to_string()).collect()
    };
    assert_eq!(attempt(1), BTreeSet::from(["0".into(), "1".into(), "2".into()]), "{out}");
    assert!(attempt(2).is_empty(), "{out}");
    // A fresh rendezvous port for the new attempt.
    let ports: BTreeSet<&str> = lines.iter().filter_map(|l| l.split(" port ").nth(1)).collect();
    assert_eq!(ports.len(), 2, "one port an attempt: {out}");
    // The report is the last attempt's, with the one before it.
    let text = std::fs::read_to_string(&report).unwrap();
    let json: serde_json::Value = serde_json::from_str(&text).unwrap();
    assert_eq!(json["job"]["exit_code"], 0);
    let restarts = json["job"]["restarts"].as_array().expect("restarts in the report");
    assert_eq!(restarts.len(), 1, "{text}");
    assert_eq!(restarts[0]["exit_code"], 3);
    let cause = without_pid(restarts[0]["cause"].as_str().unwrap());
    assert_eq!(cause, format!("rank 1 (pid P on {host}) exited with code 3"));
    let ranks = json["ranks"].as_array().unwrap();
    assert!(ranks.iter().all(|r| r["exit_code"] == 0), "the last attempt's ranks: {text}");
    // The timeline marks the restart where the first attempt ended, with its cause.
    let trace: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&timeline).unwrap()).unwrap();
    let events = trace["traceEvents"].as_array().unwrap();
    let marks: Vec<&serde_json::Value> =
        events.iter().filter(|e| e["name"] == "restart 1").collect();
    assert_eq!(marks.len(), 1, "{trace}");
    assert_eq!(marks[0]["args"]["exit_code"], 3);
    let ended_us =
        restarts[0]["end_us"].as_u64().unwrap() - json["job"]["start_us"].as_u64().unwrap();
    assert_eq!(marks[0]["ts"].as_f64(), Some(ended_us as f64), "{trace}");
    out.tag.wait_until_none(Duration::from_secs(2)).unwrap();
}

#[test]
fn restarts_used_up_end_the_job_with_the_last_attempts_status_after_doubling_waits() {
    let started = Instant::now();
    let out = Run::new(&["-n", "2", "--max-restarts", "2", "--restart-backoff", "0.25"])
        .args([
            "sh",
            "-c",
            "[ $PMI_RANK = 0 ] && exit $((5 + RLAUNCH_RESTART_COUNT)); exec sleep 30",
        ])
        .timeout(WAIT)
        .run();
    let took = started.elapsed();
    out.assert_code(7);
    let host = rlaunch_tests::hosts::hostname();
    let said = said(&out);
    let ended = |code: u32| format!("rlaunch: rank 0 (pid P on {host}) exited with code {code}");
    assert_eq!(
        said,
        [
            format!("{}; restarting the job in 0.25 s (restart 1 of 2)", ended(5)),
            format!("{}; restarting the job in 0.5 s (restart 2 of 2)", ended(6)),
            ended(7),
        ],
        "{out}"
    );
    assert!(took >= Duration::from_millis(750), "waited 0.25 + 0.5 s: {took:?}");
}

#[test]
fn a_program_that_cannot_start_is_not_restarted() {
    let out = Run::new(&["-n", "2", "--max-restarts", "3", "/nonexistent/program"]).run();
    out.assert_code(127);
    let host = rlaunch_tests::hosts::hostname();
    let lines = rlaunch_lines(&out.stderr_str()).join("\n");
    let expected =
        format!("rlaunch: cannot start /nonexistent/program on {host}: No such file or directory");
    assert_eq!(lines, expected, "{out}");
}

#[test]
fn ctrl_c_while_the_job_waits_to_restart_ends_it_at_once() {
    let mut job = Run::new(&["-n", "2", "--max-restarts", "2", "--restart-backoff", "20"])
        .args(["sh", "-c", "echo ran; exit 4"])
        .spawn();
    // The restart line comes once the attempt is done; then the wait.
    job.wait_for_stderr_line(|l| l.contains("; restarting the job in 20 s"), WAIT);
    let sent = Instant::now();
    job.signal(Signal::SIGINT);
    let out = job.wait(WAIT);
    assert!(sent.elapsed() < Duration::from_secs(10), "did not wait out the backoff");
    out.assert_code(130);
    let said = said(&out);
    let host = rlaunch_tests::hosts::hostname();
    let restart = format!(
        "rlaunch: rank 0 (pid P on {host}) exited with code 4; restarting the job in 20 s \
         (restart 1 of 2)"
    );
    let said_rank1 = restart.replace("rank 0", "rank 1");
    assert!(said[0] == restart || said[0] == said_rank1, "{out}");
    assert_eq!(said[1..], ["rlaunch: interrupted by SIGINT"], "{out}");
    out.tag.wait_until_none(Duration::from_secs(2)).unwrap();
}

#[test]
fn a_torch_ddp_job_whose_rank_dies_resumes_from_its_checkpoint_to_the_same_parameters() {
    // Importing torch takes seconds; beside other tests, several times that.
    let limit = Duration::from_secs(120);
    let python = "/usr/bin/python3";
    let reference = Run::program(python, &[&torch_job(), "reference"]).timeout(limit).run();
    reference.assert_code(0);
    let want = reference.lines().into_iter().find(|l| l.starts_with("params ")).unwrap();
    let tmp = rlaunch_tests::tempdir();
    let dir = tmp.path().to_str().unwrap();
    let out = Run::new(&["-n", "2", "--max-restarts", "1", python, &torch_job(), "resume", dir])
        .timeout(limit)
        .run();
    out.assert_code(0);
    let host = rlaunch_tests::hosts::hostname();
    let said = said(&out);
    let restart = format!(
        "rlaunch: rank 1 (pid P on {host}) exited with code 1; restarting the job (restart 1 of 1)"
    );
    assert_eq!(said, [restart], "{out}");
    let lines = out.lines();
    let mut attempts: Vec<&str> =
        lines.iter().filter(|l| l.starts_with("attempt ")).map(String::as_str).collect();
    attempts.sort();
    let expected = [
        "attempt 0 rank 0 from step 0",
        "attempt 0 rank 1 from step 0",
        "attempt 1 rank 0 from step 5",
        "attempt 1 rank 1 from step 5",
    ];
    assert_eq!(attempts, expected, "{out}");
    let params: Vec<&String> = lines.iter().filter(|l| l.starts_with("params ")).collect();
    assert_eq!(params, [&want], "{out}");
}

/// A host of the list that no rank was placed on is a spare: the fake node b's proxy is
/// killed (by its own rank) in the first attempt, and the restart puts b's rank on c.
#[test]
fn a_lost_node_is_replaced_by_a_host_the_job_left_spare() {
    let script = "echo attempt $RLAUNCH_RESTART_COUNT rank $PMI_RANK on \
                  $MPIR_CVAR_CH3_INTERFACE_HOSTNAME; \
                  if [ $RLAUNCH_RESTART_COUNT = 0 ] && [ $PMI_RANK = 1 ]; then kill -9 $PPID; \
                  exec sleep 30; fi; sleep 0.3";
    let options = ["--launcher", "fork", "--hosts", "a,b,c", "-n", "2", "--ppn", "1"];
    let out =
        Run::new(&options).args(["--max-restarts", "1", "sh", "-c", script]).timeout(WAIT).run();
    out.assert_code(0);
    let restart = "rlaunch: lost proxy on b (its proxy was killed by signal 9 (SIGKILL)); \
                   restarting the job with c for b (restart 1 of 1)";
    assert_eq!(rlaunch_lines(&out.stderr_str()), [restart], "{out}");
    let lines = out.lines();
    let second: BTreeSet<&str> =
        lines.iter().filter(|l| l.starts_with("attempt 1 ")).map(String::as_str).collect();
    assert_eq!(second, BTreeSet::from(["attempt 1 rank 0 on a", "attempt 1 rank 1 on c"]));
    // b's rank, orphaned by its proxy's death, is gone too.
    out.tag.wait_until_none(Duration::from_secs(5)).unwrap();
}

#[test]
fn an_xgboost_job_whose_worker_dies_trains_the_same_model_in_the_next_attempt() {
    let limit = Duration::from_secs(120);
    for (version, python) in
        [("1.7", "/usr/bin/python3".to_string()), ("3.2", venv_python("xgboost3"))]
    {
        let job = |what: &str, more: &[&str]| {
            Run::new(&["--tracker", "rabit", "-n", "2"])
                .args(more)
                .args([python.as_str(), &xgboost_job(), what])
                .timeout(limit)
                .run()
        };
        let models = |out: &rlaunch_tests::Outcome| -> BTreeSet<String> {
            let lines = out.lines();
            lines.iter().filter(|l| l.starts_with("model ")).map(|l| l[6..].to_string()).collect()
        };
        let plain = job("train", &[]);
        plain.assert_code(0);
        let out = job("restart", &["--max-restarts", "1"]);
        out.assert_code(0);
        let host = rlaunch_tests::hosts::hostname();
        let said = said(&out);
        let restart = format!(
            "rlaunch: rank 1 (pid P on {host}) was killed by signal 9 (SIGKILL); restarting the \
             job (restart 1 of 1)"
        );
        assert_eq!(said, [restart], "{version}: {out}");
        // Both workers of the second attempt, each with the model of a run without a death.
        assert_eq!(models(&out), models(&plain), "{version}: {out}");
        assert_eq!(models(&out).len(), 2, "{version}: {out}");
    }
}

/// `--on-failure continue` (Hydra's `-disable-auto-cleanup`): rank 1 of a PMI job exits 3
/// after init; the others' fence completes without it, they read `PMI_dead_processes` (PMI-1
/// get, PMI-2 kvs-get), fence again and finalize. On one node, over two fake nodes, and over
/// four with rank 1 alone on its node; the job's status is still rank 1's.
#[test]
fn with_on_failure_continue_pmi_ranks_fence_without_the_failed_one_and_are_told() {
    let pmiprog = rlaunch_tests::pmiprog_str();
    // The last: rank 1 alone on its node, which stays a party of the others' fences.
    for (spelling, version, options) in [
        ("--on-failure=continue", "v1", vec![]),
        ("-disable-auto-cleanup", "v2", vec!["--launcher", "fork", "--hosts", "a,b"]),
        (
            "--on-failure=continue",
            "v1",
            vec!["--launcher", "fork", "--hosts", "a,b,c,d", "--ppn", "1"],
        ),
    ] {
        let out = Run::new(&options)
            .args(["-n", "4", spelling, &pmiprog, version, "survive"])
            .timeout(WAIT)
            .run();
        out.assert_code(3);
        let said = said(&out);
        assert_eq!(said.len(), 1, "{spelling}: {out}");
        assert!(said[0].starts_with("rlaunch: rank 1 (pid P on "), "{spelling}: {out}");
        assert!(said[0].ends_with(") exited with code 3"), "{spelling}: {out}");
        let survivors: BTreeSet<String> = out.lines().into_iter().collect();
        let want: BTreeSet<String> =
            [0, 2, 3].iter().map(|r| format!("survived {r} dead=1")).collect();
        assert_eq!(survivors, want, "{spelling}: {out}");
    }
}

/// Any program can poll `RLAUNCH_DEAD_RANKS_FILE`: the failed ranks, as ranges, once some
/// failed; removed at the end.
#[test]
fn with_on_failure_continue_the_failed_ranks_are_in_a_file_every_rank_can_read() {
    let script = "case $PMI_RANK in 1|3) exit 3;; esac; \
                  while [ \"$(cat $RLAUNCH_DEAD_RANKS_FILE 2>/dev/null)\" != 1,3 ]; do sleep 0.02; done; \
                  echo $PMI_RANK saw $(cat $RLAUNCH_DEAD_RANKS_FILE) in $RLAUNCH_DEAD_RANKS_FILE";
    let out =
        Run::new(&["-n", "4", "--on-failure", "continue", "--timeout", "20", "sh", "-c", script])
            .timeout(WAIT)
            .run();
    out.assert_code(3);
    let lines = out.lines();
    assert_eq!(lines.len(), 2, "{out}");
    for line in &lines {
        let file = line.rsplit(' ').next().unwrap();
        assert!(line.starts_with("0 saw 1,3 in ") || line.starts_with("2 saw 1,3 in "), "{out}");
        assert!(!std::path::Path::new(file).exists(), "{file} left behind");
    }
    // Both failures are the job's: the first decides, the table lists them.
    let said = rlaunch_lines(&out.stderr_str()).join("\n");
    assert!(said.contains("rlaunch: 2 ranks failed:"), "{out}");
}

/// `--on-failure continue` and PMIx: the other ranks' handlers for `PMIX_ERR_PROC_ABORTED`
/// hear that rank 1 failed (each node's server tells its own clients), a fence over the
/// whole job completes without it, and they finalize.
#[test]
fn with_on_failure_continue_pmix_clients_are_told_by_an_event() {
    let program = rlaunch_tests::mpi::CProgram::Dead.path_str();
    for options in [
        vec![],
        vec!["--launcher", "fork", "--hosts", "a,b"],
        vec!["--launcher", "fork", "--hosts", "a,b,c,d"],
    ] {
        let out = Run::new(&options)
            .args(["-n", "4", "--pmi", "pmix", "--on-failure", "continue", &program])
            .timeout(WAIT)
            .run();
        let want = [0, 2, 3].iter().map(|r| format!("rank {r} told rank 1 failed")).collect();
        rank_1_failed_alone(&out, &options, want);
    }
}

/// `--on-failure continue` and Open MPI: rank 1 exits after a barrier; the others hear it by
/// their PMIx handlers, compute over a communicator without it (1 rank a node too, where
/// the failed rank's node has no live client), and `MPI_Finalize` returns.
#[test]
fn with_on_failure_continue_an_open_mpi_program_is_told_and_its_survivors_finish() {
    let program = rlaunch_tests::mpi::CProgram::OmpiSurvive.path_str();
    for options in [
        vec![],
        vec!["--launcher", "fork", "--hosts", "a:2,b:2"],
        vec!["--launcher", "fork", "--hosts", "a,b,c,d"],
    ] {
        let out = Run::new(&options)
            .args(["-n", "4", "--on-failure", "continue", &program])
            .timeout(WAIT)
            .run();
        let want = [0, 2, 3]
            .iter()
            .flat_map(|r| {
                [
                    format!("rank {r} told rank 1 failed, survivors' sum 5"),
                    format!("rank {r} finalized"),
                ]
            })
            .collect();
        rank_1_failed_alone(&out, &options, want);
    }
}

/// Rank 1 exited with 3 and the job went on without it: the others' lines are `want`, and
/// rlaunch's only line is about rank 1.
fn rank_1_failed_alone(out: &Outcome, options: &[&str], want: BTreeSet<String>) {
    out.assert_code(3);
    let lines: BTreeSet<String> = out.lines().into_iter().collect();
    assert_eq!(lines, want, "{options:?}: {out}");
    let said = said(out);
    assert_eq!(said.len(), 1, "{options:?}: {out}");
    assert!(said[0].starts_with("rlaunch: rank 1 (pid"), "{options:?}: {out}");
    assert!(said[0].ends_with(") exited with code 3"), "{options:?}: {out}");
}

/// `--on-failure continue` and lost nodes: interior proxies are killed while every rank
/// fences in a loop, in a tree of width 2 over 15 fake nodes (n1 and n2 rlaunch's; n3, n4
/// n1's; n5, n6 n2's; n7, n8 n3's; ...; n15 n7's). Their children dial rlaunch and are
/// adopted, with the nodes under them: only the lost nodes' own ranks fail. The others'
/// fences complete without them, they read which in `PMI_dead_processes` and end by
/// themselves, and the job's status is the lost node's. `kill` are the ranks whose proxies
/// are killed; `failed`, what the others are told; rlaunch's one line names one of `lost`
/// (killed together, either may be heard of first).
fn lost_interior_nodes(kill: &[u32], failed: &str, lost: &[&str]) {
    lost_interior_nodes_of(&rlaunch_tests::chaosrank().to_string_lossy(), kill, failed, lost)
}

/// [`lost_interior_nodes`] with the ranks `program` (`chaosrank`'s arguments and files).
fn lost_interior_nodes_of(program: &str, kill: &[u32], failed: &str, lost: &[&str]) {
    let dir = rlaunch_tests::tempdir();
    let files = dir.path().to_str().expect("a UTF-8 temporary directory").to_owned();
    let hosts: Vec<String> = (1..=15).map(|n| format!("n{n}")).collect();
    let hosts = hosts.join(",");
    // A node that never calls (its proxy was killed too) is given up two heartbeats and 5 s
    // after rlaunch hears of its parent's loss.
    let liveness = ["--heartbeat", "0.25", "--silence-timeout", "2"];
    let options = ["--on-failure", "continue", "--launcher", "fork", "--hosts", &hosts];
    let tree = ["--tree-width", "2", "-n", "15", program, &files, "fence"];
    let job = Run::new(&[&liveness[..], &options, &tree].concat()).timeout(WAIT).spawn();
    // Every rank is past its first fence, and fencing in its loop.
    let ready = Instant::now() + WAIT;
    while !(0..15).all(|r| dir.path().join(format!("ready.{r}")).exists()) {
        assert!(Instant::now() < ready, "the ranks never got ready");
        std::thread::sleep(Duration::from_millis(20));
    }
    let read = |name: String| std::fs::read_to_string(dir.path().join(name)).unwrap_or_default();
    for rank in kill {
        let pid: i32 = read(format!("pid.{rank}")).trim().parse().expect("the rank's pid");
        let proxy = rlaunch_tests::procfs::parent_pid(pid);
        nix::sys::signal::kill(nix::unistd::Pid::from_raw(proxy), Signal::SIGKILL).unwrap();
    }
    let out = job.wait(WAIT);
    out.assert_code(255);
    let killed = |host: &&str| {
        format!("rlaunch: lost proxy on {host} (its proxy was killed by signal 9 (SIGKILL))")
    };
    let said = self::said(&out);
    assert!(said.len() == 1 && lost.iter().map(killed).any(|l| l == said[0]), "{out}");
    // The same ranges as a Linux cpulist: `1-2,6`.
    let dead = rlaunch_topology::cpulist::parse(failed).expect("a list of ranks");
    for rank in (0..15).filter(|r| !dead.contains(r)) {
        assert_eq!(read(format!("told.{rank}")), failed, "rank {rank}: {out}");
    }
    out.tag.wait_until_none(Duration::from_secs(5)).unwrap();
}

/// n2 (rlaunch's own child) and n3 (below n1) are lost: n5, n6 (each with a subtree) and
/// n7, n8 (n7 with n15 under it) are adopted.
#[test]
fn with_on_failure_continue_the_children_of_lost_interior_nodes_are_adopted() {
    lost_interior_nodes(&[1, 2], "1-2", &["n2", "n3"]);
}

/// PMIx ranks in a loop of fences that collect data: the nodes below n2 and n3 had their
/// parts of the fence under way on their way up through them; adopted, they send them
/// again, and the fences complete with every survivor's data.
#[test]
fn with_on_failure_continue_adopted_nodes_send_their_pmix_fence_data_again() {
    let chaospmix = rlaunch_tests::mpi::CProgram::ChaosPmix.path_str();
    lost_interior_nodes_of(&chaospmix, &[1, 2], "1-2", &["n2", "n3"]);
}

/// n3 and its child n7 are lost together: n8 is adopted, and so is n15, n7's child, which
/// calls once its own parent is gone; n7 never calls, and its rank fails after the wait.
#[test]
fn with_on_failure_continue_a_lost_node_under_a_lost_node_fails_alone() {
    // n7's loss is found only once it does not call: n3's comes first.
    lost_interior_nodes(&[2, 6], "2,6", &["n3"]);
}

/// `--stdin all` under continue: n2's proxy (an interior node, ranks 2-3) is killed while
/// stdin flows. Its ranks write nothing more, and rlaunch's window of stdin chunks in flight
/// no longer waits for them; n5 and n6 below it, adopted, are sent again what may have been
/// lost with it (each drops what it had): every other rank reads all of stdin, intact.
#[test]
fn with_on_failure_continue_stdin_flows_on_past_a_lost_node_to_every_survivor() {
    let hosts = "n1:2,n2:2,n3:2,n4:2,n5:2,n6:2,n7:2";
    let liveness = ["--heartbeat", "0.25", "--silence-timeout", "2"];
    let options = ["--on-failure", "continue", "--stdin", "all", "--launcher", "fork"];
    let tree = ["--hosts", hosts, "--tree-width", "2", "-n", "14"];
    let rankprog = rlaunch_tests::rankprog_str();
    let ranks = [rankprog.as_str(), "ready", "stdin-sum"];
    let args = [&liveness[..], &options, &tree, &ranks].concat();
    let mut job = Run::new(&args).stdin_piped().timeout(WAIT).spawn();
    let ready = job.wait_for_ready(14, WAIT);
    // Some stdin is on its way before the loss, the most after it: far past the window of
    // 8 chunks in flight.
    let input: Vec<u8> = (0..4u32 << 20).map(|i| (i % 251) as u8).collect();
    job.write_stdin(&input[..64 << 10]);
    let (_, rank2) = ready[2];
    let proxy = rlaunch_tests::procfs::parent_pid(rank2.as_raw());
    nix::sys::signal::kill(nix::unistd::Pid::from_raw(proxy), Signal::SIGKILL).unwrap();
    job.write_stdin(&input[64 << 10..]);
    job.close_stdin();
    let out = job.wait(WAIT);
    out.assert_code(255);
    let want = format!("stdin {} {:016x}", input.len(), rlaunch_tests::fnv1a64(&input));
    let sums = out.stdout_str().lines().filter(|l| l.starts_with("stdin ")).count();
    assert_eq!(sums, 12, "every rank but n2's two read stdin: {out}");
    for line in out.stdout_str().lines().filter(|l| l.starts_with("stdin ")) {
        assert_eq!(line, want, "{out}");
    }
    assert!(
        out.stderr_str().starts_with("rlaunch: lost proxy on n2 (its proxy was killed by signal 9"),
        "{out}"
    );
}
