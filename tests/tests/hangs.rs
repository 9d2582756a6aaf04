//! A job that hangs says where, at its timeout (docs/hangs.md): the ranks missing from the
//! fence the others wait in, by rank, pid and host, and each rank's process state. Real MPICH
//! (PMI-1) and Open MPI (PMIx) programs, one rank of which never calls MPI_Init.

use std::collections::HashMap;
use std::time::Duration;

use rlaunch_tests::hosts::hostname;
use rlaunch_tests::mpi::{fake_nodes, mpi_run, CProgram};
use rlaunch_tests::output::rlaunch_lines;
use rlaunch_tests::{Outcome, Run};

/// The jobs' timeout. Beside two busy loops, 16 ranks on two fake nodes were all in
/// MPI_Init's fence (or known not to be) within 1 s, MPICH's and Open MPI's: 4 s is 4 times that.
const TIMEOUT: &str = "4";

/// Each rank's pid, from the `pid R P` lines of [`CProgram::Hang`].
fn pids(out: &Outcome) -> HashMap<u32, u32> {
    let pids = out.lines().into_iter().filter_map(|l| {
        let mut words = l.strip_prefix("pid ")?.split(' ').map(|w| w.parse::<u32>().ok());
        Some((words.next()??, words.next()??))
    });
    pids.collect()
}

/// The hang report's lines, without their prefix; checks the job's last line and status.
fn report_of(out: &Outcome) -> Vec<String> {
    out.assert_code(124);
    let err = out.stderr_str();
    let lines = rlaunch_lines(&err);
    let (last, report) = lines.split_last().unwrap_or_else(|| panic!("nothing said: {out}"));
    assert_eq!(*last, format!("rlaunch: the job timed out after {TIMEOUT} s and was killed"));
    let (head, body) = report.split_first().unwrap_or_else(|| panic!("no report: {out}"));
    assert_eq!(*head, format!("rlaunch: where the job was at its timeout ({TIMEOUT} s):"));
    body.iter().map(|l| l.strip_prefix("rlaunch:   ").expect("a report line").to_owned()).collect()
}

fn hang(options: &[String], n: u32, program: CProgram, late: u32) -> Outcome {
    let options: Vec<String> = ["--timeout", TIMEOUT]
        .iter()
        .map(|s| s.to_string())
        .chain(options.iter().cloned())
        .collect();
    let out = mpi_run(&options, n, program, &[&late.to_string(), "-1"]).run();
    out.tag.wait_until_none(std::time::Duration::from_secs(5)).unwrap_or_else(|left| {
        panic!("left running: {left:?}");
    });
    out
}

#[test]
fn mpich_ranks_waiting_in_mpi_init_name_the_rank_that_never_came() {
    let host = hostname();
    let tmp = rlaunch_tests::tempdir();
    let (json, trace) = (tmp.path().join("report.json"), tmp.path().join("trace.json"));
    let files = ["--report", json.to_str().unwrap(), "--timeline", trace.to_str().unwrap()];
    let out = hang(&files.map(String::from), 4, CProgram::Hang, 3);
    let (report, pid) = (report_of(&out), pids(&out)[&3]);
    assert_eq!(
        report[0],
        format!("fence 1 (PMI): 3 of 4 ranks waiting; missing: rank 3 (pid {pid} on {host})")
    );
    // Waiting in a fence is a blocking read, and the late rank pauses.
    assert!(report[1].starts_with("ranks: 0-3 sleeping"), "{out}");
    assert_eq!(report.len(), 2, "{out}");
    // The same report in --report, each rank where it was, and a mark on the timeline.
    let doc: serde_json::Value = serde_json::from_slice(&std::fs::read(&json).unwrap()).unwrap();
    assert_eq!(doc["job"]["hang"]["lines"], serde_json::json!(report), "{doc}");
    let pmi: Vec<&str> =
        (0..4).map(|r| doc["ranks"][r]["at_hang"]["pmi"].as_str().unwrap()).collect();
    assert_eq!(
        pmi,
        [["in fence 1 (PMI)"; 3].as_slice(), &["missing from fence 1 (no PMI yet)"]].concat()
    );
    assert_eq!(doc["ranks"][3]["at_hang"]["state"], "S", "{doc}");
    let trace: serde_json::Value = serde_json::from_slice(&std::fs::read(&trace).unwrap()).unwrap();
    let marks =
        trace["traceEvents"].as_array().unwrap().iter().filter(|e| e["name"] == "hang report");
    assert_eq!(marks.count(), 1, "{trace}");

    let out = hang(&fake_nodes(2, 8), 16, CProgram::Hang, 11);
    let (report, pid) = (report_of(&out), pids(&out)[&11]);
    assert_eq!(
        report[0],
        format!("fence 1 (PMI): 15 of 16 ranks waiting; missing: rank 11 (pid {pid} on n2)")
    );
    assert!(report[1].starts_with("ranks: 0-15 sleeping"), "{out}");
}

#[test]
fn open_mpi_ranks_name_the_client_that_never_connected() {
    let host = hostname();
    let out = hang(&[], 4, CProgram::OmpiHang, 3);
    let (report, pid) = (report_of(&out), pids(&out)[&3]);
    // One node: its PMIx server enters no fence before every client has, so of the three that
    // connected nothing more is known.
    assert_eq!(
        report[0],
        format!("PMIx: 3 of 4 ranks connected; not connected: rank 3 (pid {pid} on {host})")
    );
    // Open MPI's ranks may poll while they wait: running or sleeping, each is named once.
    assert!(report[1].starts_with("ranks: "), "{out}");
    assert_eq!(report.len(), 2, "{out}");

    // Two nodes: n1's server is in MPI_Init's fence, n2's waits for rank 3.
    let out = hang(&fake_nodes(2, 2), 4, CProgram::OmpiHang, 3);
    let (report, pids) = (report_of(&out), pids(&out));
    assert_eq!(
        report[0],
        format!(
            "fence 1 (PMIx): 2 of 4 ranks waiting; missing (never connected to PMIx): rank 3 \
             (pid {} on n2); on nodes whose PMIx server is not in (not every client there is): \
             rank 2 (pid {} on n2)",
            pids[&3], pids[&2]
        )
    );
}

#[test]
fn no_hang_report_when_none_is_asked_for() {
    let options = ["--hang-report", "none"].map(String::from);
    let out = hang(&options, 2, CProgram::Hang, 1);
    out.assert_code(124);
    let err = out.stderr_str();
    assert_eq!(
        rlaunch_lines(&err),
        [format!("rlaunch: the job timed out after {TIMEOUT} s and was killed")]
    );
    // Open MPI's spelling asks for the report.
    let options = ["--report-state-on-timeout".to_string()];
    let out = hang(&options, 2, CProgram::Hang, 1);
    assert_eq!(report_of(&out)[0].split(';').next(), Some("fence 1 (PMI): 1 of 2 ranks waiting"));
}

/// `rlaunch ps` and `rlaunch stacks` from another process ask a running job where its ranks
/// are; the job goes on and ends with its own status and all its output. Another user cannot
/// reach its socket.
#[test]
fn ps_and_stacks_ask_a_running_job_and_it_goes_on() {
    let tmp = rlaunch_tests::tempdir();
    let runtime = tmp.path().join("runtime");
    std::fs::create_dir(&runtime).unwrap();
    std::fs::set_permissions(&runtime, std::os::unix::fs::PermissionsExt::from_mode(0o711))
        .unwrap();
    let flag = tmp.path().join("go");
    let script = format!(
        "echo start $PMI_RANK; while [ ! -e {} ]; do sleep 0.05; done; echo end $PMI_RANK",
        flag.display()
    );
    let mut job = Run::new(&["--launcher", "fork", "--hosts", "n1:2,n2:2", "-n", "4"])
        .args(["sh", "-c", &script])
        .env("XDG_RUNTIME_DIR", &runtime)
        .spawn();
    for _ in 0..4 {
        job.wait_for_line(|l| l.starts_with("start "), Duration::from_secs(30));
    }
    let pid = job.pid().as_raw().to_string();
    let ask = |what: &str, pid: Option<&str>| {
        Run::new(&[what])
            .args(pid)
            .env("XDG_RUNTIME_DIR", &runtime)
            .timeout(Duration::from_secs(60))
            .run()
    };
    // The newest job of this user's: this one (its own directory of sockets).
    let ps = ask("ps", None);
    ps.assert_code(0);
    let text = ps.stdout_str();
    let rows: Vec<Vec<&str>> = text.lines().map(|l| l.split_whitespace().collect()).collect();
    assert_eq!(rows[0], ["RANK", "JOB", "HOST", "PID", "STATE", "CPU(s)", "RSS(MiB)", "PMI"]);
    let hosts: Vec<(&str, &str)> = rows[1..].iter().map(|r| (r[0], r[2])).collect();
    assert_eq!(hosts, [("0", "n1"), ("1", "n1"), ("2", "n2"), ("3", "n2")], "{text}");
    assert!(rows[1..].iter().all(|r| r[7] == "-" && r[3].parse::<u32>().is_ok()), "{text}");
    // The same by rlaunch's pid.
    let stacks = ask("stacks", Some(&pid));
    stacks.assert_code(0);
    let said = stacks.stdout_str();
    assert!(said.starts_with("ranks: "), "{said}");
    // Another user cannot open the socket: the directories are this user's alone.
    let socket = runtime.join("rlaunch").join(format!("{pid}.sock"));
    assert!(socket.exists());
    let connect = format!(
        "import socket\ns = socket.socket(socket.AF_UNIX)\ns.connect({:?})\n",
        socket.to_str().unwrap()
    );
    let nobody = std::process::Command::new("setpriv")
        .args(["--reuid=nobody", "--regid=nogroup", "--clear-groups", "/usr/bin/python3", "-c"])
        .arg(&connect)
        .output()
        .unwrap();
    assert_eq!(nobody.status.code(), Some(1));
    let err = String::from_utf8_lossy(&nobody.stderr);
    assert!(err.contains("PermissionError: [Errno 13] Permission denied"), "{err}");
    // A pid that is no job of ours.
    let none = ask("ps", Some("1"));
    none.assert_code(255);
    let err = none.stderr_str();
    assert!(
        err.starts_with("rlaunch: no rlaunch job of yours has pid 1 (none listens at "),
        "{err}"
    );

    std::fs::write(&flag, "").unwrap();
    let out = job.wait(Duration::from_secs(60));
    out.assert_code(0);
    assert_eq!(out.stderr_str(), "", "a job that runs fine prints nothing of rlaunch's own");
    let mut lines = out.lines();
    lines.sort();
    let want: Vec<String> =
        (0..4).map(|r| format!("end {r}")).chain((0..4).map(|r| format!("start {r}"))).collect();
    assert_eq!(lines, want, "{out}");
    assert!(!socket.exists(), "the job's socket outlived it");
}

/// `--stall-report`: a job in which nothing moves says where it is, once, and runs on (here
/// to its timeout); one whose ranks write says nothing.
#[test]
fn a_stalled_job_says_where_it_is_once_and_runs_on() {
    let options = ["--stall-report", "1"].map(String::from);
    let out = hang(&options, 4, CProgram::Hang, 3);
    out.assert_code(124);
    let pid = pids(&out)[&3];
    let err = out.stderr_str();
    let said = rlaunch_lines(&err);
    let stalled = "rlaunch: no rank has written output, spoken PMI or used CPU for 1 s; where the \
                   job is:";
    assert_eq!(said.iter().filter(|l| **l == stalled).count(), 1, "{out}");
    assert_eq!(said[0], stalled, "{out}");
    let missing = format!("fence 1 (PMI): 3 of 4 ranks waiting; missing: rank 3 (pid {pid} on ");
    assert!(said[1].starts_with(&format!("rlaunch:   {missing}")), "{out}");
    // Then the timeout's own report, and the end.
    assert_eq!(said.last().copied(), Some("rlaunch: the job timed out after 4 s and was killed"));

    // Output every 0.1 s for 6 s: never 5 s without (a rank runnable and not run beside two
    // busy loops was seen for up to 2.9 s: docs/reliability.md).
    let writes = "for i in $(seq 60); do echo $i; sleep 0.1; done";
    let out = Run::new(&["--stall-report", "5", "-n", "2", "sh", "-c", writes])
        .timeout(Duration::from_secs(60))
        .run();
    out.assert_code(0);
    assert_eq!(out.stderr_str(), "", "{out}");
    assert_eq!(out.lines().len(), 120);
}
