//! How the ranks' output reaches rlaunch's stdout: whole lines, each rank's in order, bytes
//! unchanged, a last line without a newline; a closed stdout ends the job, and a slow reader
//! slows the ranks down instead of growing rlaunch's memory.

use std::time::{Duration, Instant};

use rlaunch_tests::{check_flood, check_ragged, procfs, rankprog_str, Run};

const WAIT: Duration = Duration::from_secs(30);

#[test]
fn output_lines_are_whole_and_in_order_per_rank() {
    let bytes_per_rank = 4 << 20;
    let out = Run::new(&["-n", "4", &rankprog_str(), "flood", &bytes_per_rank.to_string()]).run();
    out.assert_code(0);
    check_flood(&out.stdout, 4, bytes_per_rank).unwrap();
}

#[test]
fn a_last_line_without_newline_arrives_and_bytes_pass_unchanged() {
    let out = Run::new(&["-n", "1", &rankprog_str(), "noeol", "abc"]).run();
    out.assert_code(0);
    assert_eq!(out.stdout, b"abc");
    let out = Run::new(&["-n", "1", &rankprog_str(), "binary"]).run();
    out.assert_code(0);
    assert_eq!(out.stdout, (0..=255u8).collect::<Vec<_>>());
}

/// Found by rlaunch's writer (4 ranks), or by the proxy that writes a lone rank's output
/// into rlaunch's stdout itself: the same end, status and message.
#[test]
fn a_closed_stdout_ends_the_job_promptly() {
    for ranks in [4, 1] {
        // The shell's status is head's; rlaunch's own goes to stderr.
        let rlaunch = rlaunch_tests::rlaunch();
        let script = format!(
            "{{ {} -n {ranks} yes; echo \"rlaunch exited $?\" >&2; }} | head -1",
            rlaunch.display()
        );
        let start = Instant::now();
        let out = Run::program("/bin/sh", &["-c", &script]).timeout(WAIT).run();
        out.assert_code(0);
        assert_eq!(out.stdout_str(), "y\n");
        assert_eq!(out.stderr_lines(), ["rlaunch exited 141"], "{out}");
        assert!(start.elapsed() < Duration::from_secs(10), "took {:?}", start.elapsed());
    }
}

/// A reader that stops reading, then closes stdout: the proxy's move into the full pipe
/// fails when it gets room, and the job ends at once as when rlaunch's writer finds it.
#[test]
fn a_stdout_closed_while_full_ends_a_lone_ranks_job_promptly() {
    for ranks in ["1", "4"] {
        let mut child = std::process::Command::new(rlaunch_tests::rlaunch())
            .args(["-n", ranks, &rankprog_str(), "flood", &(1u64 << 40).to_string()])
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .stdin(std::process::Stdio::null())
            .spawn()
            .unwrap();
        std::thread::sleep(Duration::from_millis(500));
        let closed = Instant::now();
        drop(child.stdout.take());
        let status = child.wait().unwrap();
        let took = closed.elapsed();
        assert_eq!(status.code(), Some(141), "{ranks} ranks");
        assert!(took < Duration::from_secs(3), "{ranks} ranks: took {took:?}");
        let mut stderr = String::new();
        std::io::Read::read_to_string(&mut child.stderr.take().unwrap(), &mut stderr).unwrap();
        assert_eq!(stderr, "", "{ranks} ranks");
    }
}

#[test]
fn a_slow_reader_slows_the_ranks_down_without_growing_memory() {
    use std::io::Read;
    let tag = rlaunch_tests::Tag::new();
    let bytes_per_rank: u64 = 32 << 20;
    let mut child = std::process::Command::new(rlaunch_tests::rlaunch())
        .args(["-n", "4", &rankprog_str(), "flood", &bytes_per_rank.to_string()])
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

/// What the writer says it spliced (`RLAUNCH_LOG=debug`).
fn spliced_bytes(stderr: &str) -> u64 {
    logged_bytes(stderr, " bytes of output spliced")
}

/// What the proxies say they carried up without reading it, all told.
fn carried_bytes(stderr: &str) -> u64 {
    logged_bytes(stderr, " bytes of output carried")
}

/// `ranks` ranks writing `bytes` of ragged lines each, with rlaunch's debug log on stderr.
fn ragged(ranks: u32, bytes: u64) -> Run {
    Run::new(&["-n", &ranks.to_string(), &rankprog_str(), "ragged", &bytes.to_string()])
        .env("RLAUNCH_LOG", "debug")
}

fn logged_bytes(stderr: &str, what: &str) -> u64 {
    let lines: Vec<&str> = stderr.lines().filter(|l| l.contains(what)).collect();
    assert!(!lines.is_empty(), "no{what} in {stderr}");
    let count = |line: &&str| -> u64 {
        let words: Vec<&str> = line.split_whitespace().collect();
        let at = words.iter().position(|&w| w == "bytes").unwrap();
        words[at - 1].parse::<u64>().unwrap()
    };
    lines.iter().map(count).sum()
}

/// What the writer says the link readers spliced straight into rlaunch's stdout.
fn direct_bytes(stderr: &str) -> u64 {
    let line = stderr.lines().find(|l| l.contains(" of them straight from the links"));
    let words: Vec<&str> = line.expect("the writer's count").split_whitespace().collect();
    let at = words.iter().position(|&w| w == "them").unwrap();
    words[at - 2].parse().unwrap()
}

/// Whole lines in whole writes, read as fast as they come: the link readers splice them
/// from their sockets straight into rlaunch's stdout while the writer thread has nothing to
/// do, and no line is cut.
#[test]
fn whole_lines_go_straight_into_a_pipe_and_stay_whole() {
    let bytes: u64 = 24 << 20;
    let args = ["-n", "4", &rankprog_str(), "flood", &bytes.to_string()];
    let out = Run::new(&args).env("RLAUNCH_LOG", "debug").run();
    out.assert_code(0);
    check_flood(&out.stdout, 4, bytes).unwrap();
    let direct = direct_bytes(&out.stderr_str());
    assert!(direct <= spliced_bytes(&out.stderr_str()));
}

/// A lone rank's output goes into rlaunch's stdout from its proxy, not through rlaunch:
/// spliced, whole lines at a time (lines of 22 to 3022 bytes written in pieces of 65521 bytes,
/// so each piece ends mid-line), byte for byte. With stderr in the same pipe (`2>&1`), or
/// with splicing off, it is relayed as before: the same bytes.
#[test]
fn a_lone_ranks_output_into_a_pipe_is_spliced_by_its_proxy_and_arrives_byte_for_byte() {
    let bytes: u64 = 24 << 20;
    let out = ragged(1, bytes).run();
    out.assert_code(0);
    let lines = check_ragged(&out.stdout, 1, bytes).unwrap();
    let expected: Vec<u8> =
        (0..lines[0]).flat_map(|seq| rlaunch_tests::ragged_line(0, seq)).collect();
    assert!(out.stdout == expected, "the bytes differ from what the rank wrote");
    let (written, copied) = rlaunch_tests::output::written_by_the_proxy(&out.stderr_str());
    assert_eq!(written, expected.len() as u64);
    // Only the start of the last line of each piece goes through memory.
    assert!(copied < bytes / 8, "{copied} of {bytes} bytes were copied");
    assert_eq!(spliced_bytes(&out.stderr_str()), 0, "rlaunch itself wrote none of it");

    // stderr in stdout's pipe: relayed (and spliced by rlaunch).
    let script = format!(
        "RLAUNCH_LOG=debug {} -n 1 {} ragged {bytes} 2>&1",
        rlaunch_tests::rlaunch().display(),
        rankprog_str()
    );
    let both = Run::program("/bin/sh", &["-c", &script]).run();
    both.assert_code(0);
    let text = String::from_utf8_lossy(&both.stdout);
    let log: String =
        text.lines().filter(|l| !l.starts_with("r000000 ")).map(|l| format!("{l}\n")).collect();
    assert!(spliced_bytes(&log) > bytes / 2, "{log}");
    assert!(!log.contains("written into rlaunch's stdout"), "{log}");

    // Off: read and written as before, the same bytes.
    let off = ragged(1, bytes).env("RLAUNCH_SPLICE", "0").run();
    off.assert_code(0);
    assert!(off.stdout == expected, "the bytes differ from what the rank wrote");
    assert_eq!((spliced_bytes(&off.stderr_str()), carried_bytes(&off.stderr_str())), (0, 0));
}

#[test]
fn spliced_lines_of_several_ranks_stay_whole_in_a_pipe_and_in_a_file() {
    let bytes: u64 = 8 << 20;
    let out = ragged(4, bytes).run();
    out.assert_code(0);
    check_ragged(&out.stdout, 4, bytes).unwrap();
    assert!(spliced_bytes(&out.stderr_str()) > 0);

    // Into a file (the shell's `>`): spliced too; with `>>` (O_APPEND, which splice refuses)
    // written as usual. Both whole.
    let dir = rlaunch_tests::tempdir();
    for (redirect, splices) in [(">", true), (">>", false)] {
        let file = dir.path().join(format!("out{}", redirect.len()));
        let script = format!(
            "RLAUNCH_LOG=debug {} -n 4 {} ragged {bytes} {redirect} {}",
            rlaunch_tests::rlaunch().display(),
            rankprog_str(),
            file.display()
        );
        let out = Run::program("/bin/sh", &["-c", &script]).run();
        out.assert_code(0);
        check_ragged(&std::fs::read(&file).unwrap(), 4, bytes).unwrap();
        assert_eq!(spliced_bytes(&out.stderr_str()) > 0, splices, "{redirect}");
    }
}

#[test]
fn prefixed_output_is_not_spliced() {
    let out = Run::new(&["-l", "-n", "2", &rankprog_str(), "flood", "1048576"])
        .env("RLAUNCH_LOG", "debug")
        .run();
    out.assert_code(0);
    let report = rlaunch_tests::scan_flood(&out.stdout).unwrap();
    assert!(report.all_prefixed() && report.total_lines() == 2 * 16384, "{report:?}");
    assert_eq!(spliced_bytes(&out.stderr_str()), 0);
}

/// A user other than root has a quota of pipe pages over all of its pipes (64 MiB by default),
/// counted by capacity: 64 ranks with 1 MiB pipes spend all of it, and then every new pipe the
/// user makes gets 8 KiB. A node's rank pipes keep to a quarter of it: 256 KiB each for 64.
#[test]
fn an_unprivileged_users_ranks_leave_most_of_its_pipe_quota_alone() {
    let soft = std::fs::read_to_string("/proc/sys/fs/pipe-user-pages-soft").unwrap();
    assert_eq!(soft.trim(), "16384", "the sizes below are for the default quota");
    // Binaries where the user `nobody` can run them.
    let dir = rlaunch_tests::tempdir();
    for program in [rlaunch_tests::rlaunch(), rlaunch_tests::proxy(), rlaunch_tests::rankprog()] {
        std::fs::copy(&program, dir.join(program.file_name().unwrap())).unwrap();
    }
    let bin = |name: &str| dir.join(name).to_string_lossy().into_owned();
    let mut job = Run::program(
        "setpriv",
        &["--reuid=65534", "--regid=65534", "--clear-groups", &bin("rlaunch"), "-n", "64"],
    )
    .args([bin("rankprog").as_str(), "ready", "wait-signal", "pipe-sizes"])
    .current_dir(dir.path())
    .spawn();
    // Once a rank's `ready` is out, the proxy has sized its pipe.
    job.wait_for_ready(64, WAIT);
    job.signal(nix::sys::signal::Signal::SIGUSR1);
    let out = job.wait(WAIT);
    out.assert_code(0);
    let stdout = out.stdout_str();
    let sizes: Vec<&str> = stdout.lines().filter(|l| l.starts_with("pipes ")).collect();
    assert_eq!(sizes, vec!["pipes stdout=262144 new=65536"; 64], "{out}");
}
