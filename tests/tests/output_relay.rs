//! How the ranks' output reaches rlaunch's stdout: whole lines, each rank's in order, bytes
//! unchanged, a last line without a newline; a closed stdout ends the job, and a slow reader
//! slows the ranks down instead of growing rlaunch's memory.

use std::time::{Duration, Instant};

use rlaunch_tests::{check_flood, procfs, rankprog_str, Run};

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

#[test]
fn a_closed_stdout_ends_the_job_promptly() {
    // The shell's status is head's; rlaunch's own goes to stderr.
    let rlaunch = rlaunch_tests::rlaunch();
    let script =
        format!("{{ {} -n 4 yes; echo \"rlaunch exited $?\" >&2; }} | head -1", rlaunch.display());
    let start = Instant::now();
    let out = Run::program("/bin/sh", &["-c", &script]).timeout(WAIT).run();
    out.assert_code(0);
    assert_eq!(out.stdout_str(), "y\n");
    assert!(out.stderr_lines().contains(&"rlaunch exited 141".to_owned()), "{out}");
    assert!(start.elapsed() < Duration::from_secs(10), "took {:?}", start.elapsed());
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
