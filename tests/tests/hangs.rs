//! A job that hangs says where, at its timeout (docs/hangs.md): the ranks missing from the
//! fence the others wait in, by rank, pid and host, each rank's process state, and every
//! rank's stacks merged. Real MPICH (PMI-1) and Open MPI (PMIx) programs, one rank of which
//! never calls MPI_Init or spins while the others wait; Python and torch ranks.

use std::collections::HashMap;
use std::time::Duration;

use rlaunch_tests::hosts::hostname;
use rlaunch_tests::mpi::{fake_nodes, mpi_run, CProgram};
use rlaunch_tests::output::{rlaunch_lines, source_line, stack_branch};
use rlaunch_tests::{mpi4py_hang, python_hang, torch_job, xgboost_job, Outcome, Run};

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

/// The hang report's lines before its stacks, and the stacks' lines (after their title).
fn split_stacks(report: &[String]) -> (Vec<String>, Vec<String>) {
    let title = report.iter().position(|l| l == "stacks, outermost call first:");
    match title {
        Some(at) => (report[..at].to_vec(), report[at + 1..].to_vec()),
        None => (report.to_vec(), Vec::new()),
    }
}

fn line_of(source: &str, text: &str) -> usize {
    source_line(source, text)
}

fn branch(stacks: &[String], head: &str) -> Vec<String> {
    stack_branch(stacks, head)
}

/// A private directory in `tmp` for a job's socket (its `XDG_RUNTIME_DIR`).
fn runtime_dir(tmp: &rlaunch_tests::TempDir) -> std::path::PathBuf {
    let runtime = tmp.path().join("runtime");
    std::fs::create_dir(&runtime).unwrap();
    runtime
}

/// Asks the running `job` (`rlaunch stacks PID`, its socket under `runtime`) until the
/// lines of its answer satisfy `done`, for at most `limit`; returns those lines. Ranks say
/// they are ready just before they block: the ask is repeated until they are in.
fn stacks_until(
    job: &rlaunch_tests::Job,
    runtime: &std::path::Path,
    limit: Duration,
    what: &str,
    mut done: impl FnMut(&[String]) -> bool,
) -> Vec<String> {
    let began = std::time::Instant::now();
    loop {
        let asked = Run::new(&["stacks", &job.pid().as_raw().to_string()])
            .env("XDG_RUNTIME_DIR", runtime)
            .timeout(Duration::from_secs(60))
            .run();
        asked.assert_code(0);
        let lines: Vec<String> = asked.stdout_str().lines().map(String::from).collect();
        if done(&lines) {
            return lines;
        }
        assert!(began.elapsed() < limit, "{what}:\n{}", lines.join("\n"));
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// Where the C programs' source is, as their debug info names it.
fn hang_c() -> String {
    format!("{}/c/hang.c", env!("CARGO_MANIFEST_DIR"))
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
    hang_or_spin(options, n, program, &late.to_string(), "-1")
}

/// [`CProgram::Hang`] with rank `late` never in MPI_Init and rank `spin` spinning after it.
fn hang_or_spin(options: &[String], n: u32, program: CProgram, late: &str, spin: &str) -> Outcome {
    let options: Vec<String> = ["--timeout", TIMEOUT]
        .iter()
        .map(|s| s.to_string())
        .chain(options.iter().cloned())
        .collect();
    let out = mpi_run(&options, n, program, &[late, spin]).run();
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
    let (fences, stacks) = split_stacks(&report);
    assert_eq!(
        report[0],
        format!("fence 1 (PMI): 3 of 4 ranks waiting; missing: rank 3 (pid {pid} on {host})")
    );
    // Waiting in a fence is a blocking read, and the late rank pauses.
    assert!(report[1].starts_with("ranks: 0-3 sleeping"), "{out}");
    assert_eq!(fences.len(), 2, "{out}");
    // Rank 3 pauses before MPI_Init; the others wait in it.
    let pause = line_of("c/hang.c", "pause();");
    assert_eq!(branch(&stacks, "+ rank 3:")[0], format!("main ({}:{pause})", hang_c()), "{out}");
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

/// Rank 3 spins in a function of its own while the others wait in MPI_Barrier: the stacks
/// say so, merged (one branch for ranks 0-2, one for rank 3), with file:line from `-g`; and
/// from symbols alone without it, across two fake nodes whose proxies merge their trees.
#[test]
fn stacks_of_waiting_and_spinning_mpich_ranks_are_merged_by_branch() {
    let tmp = rlaunch_tests::tempdir();
    let json = tmp.path().join("report.json");
    let options = ["--report".to_string(), json.to_str().unwrap().to_string()];
    let out = hang_or_spin(&options, 4, CProgram::Hang, "-1", "3");
    let report = report_of(&out);
    let (fences, stacks) = split_stacks(&report);
    // MPICH's ranks poll in MPI_Barrier: running or sleeping, each is named once.
    assert!(fences[0].starts_with("ranks: ") && fences.len() == 1, "{out}");
    let (src, barrier, spin) =
        (hang_c(), line_of("c/hang.c", "MPI_Barrier(MPI"), line_of("c/hang.c", "n++;"));
    let call = line_of("c/hang.c", "spin_for_ever();");
    // The main threads: one root for all four, parting in main.
    assert_eq!(stacks[0], "  ranks 0-3:", "{out}");
    let waiting = branch(&stacks, "+ ranks 0-2:");
    assert_eq!(waiting[0], format!("main ({src}:{barrier})"), "{out}");
    assert!(waiting[1].starts_with("PMPI_Barrier (libmpich.so.12"), "{out}");
    // libmpich's static functions have no name: each is where it starts.
    assert!(waiting[2].starts_with("libmpich.so.12") && waiting[2].contains("@0x"), "{out}");
    let spinning = branch(&stacks, "+ rank 3:");
    assert_eq!(spinning, [format!("main ({src}:{call})"), format!("spin_for_ever ({src}:{spin})")]);
    // Each rank's stacks in --report.
    let doc: serde_json::Value = serde_json::from_slice(&std::fs::read(&json).unwrap()).unwrap();
    let paths = doc["ranks"][3]["at_hang"]["stacks"].as_array().unwrap();
    let innermost: Vec<&str> =
        paths.iter().filter_map(|p| p.as_array()?.last()?.as_str()).collect();
    assert!(innermost.contains(&format!("spin_for_ever ({src}:{spin})").as_str()), "{doc}");

    // No debug info, and the ranks on two nodes (0-1 on n1, 2-3 on n2).
    let out = hang_or_spin(&fake_nodes(2, 2), 4, CProgram::HangNoDebug, "-1", "3");
    let (_, stacks) = split_stacks(&report_of(&out));
    assert_eq!(stacks[0], "  ranks 0-3:", "{out}");
    let waiting = branch(&stacks, "+ ranks 0-2:");
    assert!(waiting[0].starts_with("PMPI_Barrier (libmpich.so.12"), "{out}");
    assert_eq!(branch(&stacks, "+ rank 3:"), ["spin_for_ever (hang-nodebug)"], "{out}");

    // The debug info apart from the program, found through its .gnu_debuglink.
    let out = hang_or_spin(&[], 2, CProgram::HangSplit, "-1", "1");
    let (_, stacks) = split_stacks(&report_of(&out));
    let spinning = branch(&stacks, "+ rank 1:");
    assert_eq!(spinning, [format!("main ({src}:{call})"), format!("spin_for_ever ({src}:{spin})")]);
}

/// Python ranks: their Python frames (function, file:line) in place of the interpreter's,
/// the C frames below them (time.sleep's), and their threads.
#[test]
fn python_ranks_show_their_python_frames() {
    let options = ["--timeout", TIMEOUT, "-n", "3", "/usr/bin/python3"].map(String::from);
    let out = Run::new(&[]).args(&options).args([python_hang()]).run();
    let report = report_of(&out);
    let (_, stacks) = split_stacks(&report);
    let script = python_hang();
    let at = |text: &str| line_of("scripts/python_hang.py", text);
    let (sleep, spin) = (at("time.sleep(100)"), at("n += 1"));
    let sleeping = branch(&stacks, "+ ranks 0,2:");
    assert_eq!(sleeping[0], format!("<module> ({script}:{})", at("    waits_for_ever()")));
    assert_eq!(sleeping[1], format!("waits_for_ever ({script}:{sleep})"), "{out}");
    // libc's frames from its separate debug info (libc6-dbg, by build id).
    assert!(
        sleeping[2].starts_with("__GI___clock_nanosleep (")
            && sleeping[2].contains("/clock_nanosleep.c:")
    );
    // A spinning rank is caught on either line of its loop.
    let spinning = branch(&stacks, "+ rank 1:");
    let loop_lines = [spin - 1, spin].map(|l| format!("spins ({script}:{l})"));
    assert_eq!(spinning[0], format!("<module> ({script}:{})", at("    spins()")), "{out}");
    assert!(spinning.len() == 2 && loop_lines.contains(&spinning[1].to_string()), "{out}");
    // The helper threads: all three ranks' on one path, under a root of their own.
    let helper = format!("    waits_for_ever ({script}:{sleep})");
    let helper = stacks.iter().position(|l| *l == helper);
    let helper = helper.unwrap_or_else(|| panic!("no helper thread: {out}"));
    let root = stacks[..helper].iter().rev().find(|l| l.starts_with("  ranks"));
    assert_eq!(root.map(String::as_str), Some("  ranks 0-2:"), "{out}");
}

/// `rlaunch stacks` on a torch job (gloo) whose rank 1 never reaches all_reduce: the others
/// are in all_reduce, Python frames over torch's C++ ones, rank 1 in late_rank; the job goes
/// on until it is interrupted.
#[test]
fn rlaunch_stacks_shows_torch_ranks_waiting_in_all_reduce() {
    let tmp = rlaunch_tests::tempdir();
    let runtime = runtime_dir(&tmp);
    // Importing torch takes a few seconds; beside two busy loops, up to four times that.
    let limit = Duration::from_secs(120);
    let script = torch_job();
    let mut job = Run::new(&["-n", "3", "/usr/bin/python3", &script, "hang"])
        .env("XDG_RUNTIME_DIR", &runtime)
        .timeout(limit)
        .spawn();
    for _ in 0..2 {
        job.wait_for_line(|l| l.starts_with("waiting "), limit);
    }
    let reduce = format!(
        "<module> ({script}:{})",
        line_of("scripts/torch_job.py", "dist.all_reduce(torch.tensor([rank]")
    );
    let late = line_of("scripts/torch_job.py", "            time.sleep(100)");
    // Both inside all_reduce, where they wait for ever: a look just before (rank 0 still in
    // a wrapper on its way in, while rank 2 is in it; CI at af5a1cd) splits them below
    // the line of the call.
    let waiting = |w: &[String]| {
        w[0].trim() == "+ ranks 0,2:"
            && w[1].trim() == reduce
            && w[2].trim().starts_with("all_reduce (")
    };
    let in_reduce = |lines: &[String]| split_stacks(lines).1.windows(3).any(waiting);
    let lines = stacks_until(&job, &runtime, limit, "ranks 0 and 2 never in all_reduce", in_reduce);
    let (_, stacks) = split_stacks(&lines);
    let at = stacks.iter().position(|l| l.trim() == reduce).unwrap();
    let call = stacks[at + 1].trim();
    assert!(call.starts_with("all_reduce (") && call.contains("distributed_c10d.py:"), "{call}");
    let late_rank = branch(&stacks, "+ rank 1:");
    assert_eq!(late_rank[1], format!("late_rank ({script}:{late})"), "{}", stacks.join("\n"));
    job.signal(nix::sys::signal::Signal::SIGINT);
    let out = job.wait(limit);
    out.assert_code(130);
    assert_eq!(rlaunch_lines(&out.stderr_str()), ["rlaunch: interrupted by SIGINT"], "{out}");
}

/// Ranks whose stacks cannot be read are said so, and the others are read: a rank in D state
/// (the kernel holds it while its vfork child sleeps) and, run by a user without privileges,
/// a rank that made itself non-dumpable.
#[test]
fn ranks_whose_stacks_cannot_be_read_are_said_so() {
    let program = CProgram::Unreadable.path_str();
    let out = Run::new(&["--timeout", TIMEOUT, "-n", "2", &program, "vfork"]).run();
    let (_, stacks) = split_stacks(&report_of(&out));
    let d = "[in uninterruptible sleep (D state): it could not be stopped]";
    assert_eq!(branch(&stacks, "rank 0:"), [d], "{out}");
    assert!(branch(&stacks, "rank 1:").iter().any(|f| f == "wait_readably (unreadable)"), "{out}");

    let tmp = rlaunch_tests::tempdir();
    let runtime = tmp.path().join("runtime");
    std::fs::create_dir(&runtime).unwrap();
    std::os::unix::fs::chown(&runtime, Some(65534), Some(65534)).unwrap();
    let rlaunch = rlaunch_tests::rlaunch();
    let nobody = ["--reuid=nobody", "--regid=nogroup", "--clear-groups"];
    let out = Run::program("setpriv", &nobody)
        .arg(rlaunch)
        .args(["--timeout", TIMEOUT, "-n", "2", &program, "nodump"])
        .env("XDG_RUNTIME_DIR", &runtime)
        .run();
    let (_, stacks) = split_stacks(&report_of(&out));
    let denied = "[stack not read: not permitted to read it (another user's, not dumpable, or \
                  ptrace forbidden)]";
    assert_eq!(branch(&stacks, "rank 0:"), [denied], "{out}");
    assert!(branch(&stacks, "rank 1:").iter().any(|f| f == "wait_readably (unreadable)"), "{out}");
}

/// `rlaunch stacks` on an mpi4py job (Open MPI, PMIx) whose rank 1 never reaches
/// MPI_Barrier: the others' Python line over mpi4py's C extension and Open MPI's barrier.
#[test]
fn rlaunch_stacks_shows_mpi4py_ranks_in_a_c_extension() {
    let tmp = rlaunch_tests::tempdir();
    let runtime = runtime_dir(&tmp);
    let limit = Duration::from_secs(120);
    let script = mpi4py_hang();
    let mut job = Run::new(&["-n", "3", "/usr/bin/python3", &script])
        .env("XDG_RUNTIME_DIR", &runtime)
        .timeout(limit)
        .spawn();
    for _ in 0..3 {
        job.wait_for_line(|l| l.starts_with("ready "), limit);
    }
    let barrier =
        format!("<module> ({script}:{})", line_of("scripts/mpi4py_hang.py", "comm.Barrier()"));
    let late =
        format!("late_rank ({script}:{})", line_of("scripts/mpi4py_hang.py", "time.sleep(100)"));
    let in_barrier = |lines: &[String]| {
        let (_, stacks) = split_stacks(lines);
        let found = stacks.iter().any(|l| l.trim() == "+ ranks 0,2:");
        found && branch(&stacks, "+ ranks 0,2:")[0] == barrier
    };
    let lines =
        stacks_until(&job, &runtime, limit, "ranks 0 and 2 never in MPI_Barrier", in_barrier);
    let (_, stacks) = split_stacks(&lines);
    let waiting = branch(&stacks, "+ ranks 0,2:");
    assert_eq!(branch(&stacks, "+ rank 1:")[1], late, "{}", stacks.join("\n"));
    // Below the Python line: mpi4py's extension, then Open MPI's barrier.
    let extension = waiting.iter().position(|f| f.starts_with("MPI.cpython-"));
    let mpi = waiting.iter().position(|f| f.starts_with("PMPI_Barrier (libmpi.so.40"));
    assert!(extension.is_some() && extension < mpi, "{waiting:?}");
    // Ctrl-C: rank 1 raises KeyboardInterrupt and waits in MPI_Finalize (mpi4py's atexit);
    // ranks 0 and 2, inside MPI_Barrier, never get back to Python to raise theirs. Nothing
    // ends, so it takes the second Ctrl-C, which kills the job (README, Signals).
    job.signal(nix::sys::signal::Signal::SIGINT);
    job.wait_for_stderr_line(|l| l == "KeyboardInterrupt", limit);
    job.signal(nix::sys::signal::Signal::SIGINT);
    let out = job.wait(limit);
    out.assert_code(130);
}

/// `--tracker rabit`: XGBoost workers that started with the tracker wait for one that never
/// comes; the report names it (here on demand, `rlaunch stacks`, until the two are in).
#[test]
fn the_rabit_trackers_rendezvous_names_the_worker_that_never_came() {
    let tmp = rlaunch_tests::tempdir();
    let runtime = runtime_dir(&tmp);
    // Importing XGBoost takes a second or two; beside two busy loops, up to four times that.
    let limit = Duration::from_secs(120);
    // Debian's XGBoost 1.7: the classic rabit protocol.
    let mut job = Run::new(&["--tracker", "rabit", "-n", "3", "/usr/bin/python3"])
        .args([xgboost_job(), "late".to_string()])
        .env("XDG_RUNTIME_DIR", &runtime)
        .timeout(limit)
        .spawn();
    let late = job.wait_for_line(|l| l.starts_with("late 1 "), limit);
    let pid = late.trim().strip_prefix("late 1 ").unwrap().to_string();
    let want = format!(
        "rabit tracker: 2 of 3 workers started; missing: rank 1 (pid {pid} on {})",
        hostname()
    );
    let named = |lines: &[String]| lines.iter().any(|l| *l == want);
    stacks_until(&job, &runtime, limit, &format!("no line {want}"), named);
    job.signal(nix::sys::signal::Signal::SIGINT);
    let out = job.wait(limit);
    out.assert_code(130);
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
    assert_eq!(split_stacks(&report).0.len(), 2, "{out}");

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
    // A socket left by an rlaunch killed with SIGKILL (its pid is gone): the next job
    // removes it.
    let gone = std::process::Command::new("true").spawn().unwrap();
    let gone_pid = gone.id();
    let mut gone = gone;
    gone.wait().unwrap();
    std::fs::create_dir(runtime.join("rlaunch")).unwrap();
    std::fs::set_permissions(
        runtime.join("rlaunch"),
        std::os::unix::fs::PermissionsExt::from_mode(0o700),
    )
    .unwrap();
    let stale = runtime.join("rlaunch").join(format!("{gone_pid}.sock"));
    std::fs::write(&stale, "").unwrap();
    let flag = tmp.path().join("go");
    let script = format!(
        "echo start $PMI_RANK $TORCHELASTIC_RUN_ID; while [ ! -e {} ]; do sleep 0.05; done; \
         echo end $PMI_RANK",
        flag.display()
    );
    let mut job = Run::new(&["--launcher", "fork", "--hosts", "n1:2,n2:2", "-n", "4"])
        .args(["sh", "-c", &script])
        .env("XDG_RUNTIME_DIR", &runtime)
        .spawn();
    let mut jobid = String::new();
    for _ in 0..4 {
        let line = job.wait_for_line(|l| l.starts_with("start "), Duration::from_secs(30));
        jobid = line.split_whitespace().nth(2).unwrap_or_default().to_string();
    }
    let pid = job.pid().as_raw().to_string();
    assert!(!stale.exists(), "a dead rlaunch's socket was left");
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
    let lines: Vec<String> = said.lines().map(String::from).collect();
    assert_eq!(split_stacks(&lines).1[0], "  ranks 0-3:", "{said}");
    // And by its job id, as its ranks' TORCHELASTIC_RUN_ID (and --report) show it.
    assert!(jobid.starts_with(&format!("rlaunch_{pid}_")), "{jobid}");
    let by_id = ask("ps", Some(&jobid));
    by_id.assert_code(0);
    assert_eq!(by_id.stdout_str().lines().count(), 5, "{by_id}");
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
    let want: Vec<String> = (0..4)
        .map(|r| format!("end {r}"))
        .chain((0..4).map(|r| format!("start {r} {jobid}")))
        .collect();
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
