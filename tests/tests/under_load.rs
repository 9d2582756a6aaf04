//! Under load: many ranks on many fake nodes write as fast as they can into a slow reader,
//! then a Ctrl-C. rlaunch's and every proxy's memory stay bounded, every line comes through
//! whole, and the Ctrl-C ends everything within the kill grace. `tools/underload.py` is the
//! long version (1024 ranks on 64 nodes for a minute; figures in docs/reliability.md).

use std::io::Read;
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::process::{Command, Stdio};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use nix::sys::signal::{killpg, Signal};
use nix::unistd::Pid;
use rlaunch_tests::{hosts, procfs, rankprog_str, scan_flood_stream, Tag, TAG_VAR};

/// rlaunch's default `--kill-grace`.
const KILL_GRACE: Duration = Duration::from_secs(1);
/// How much past the grace the end may come: the last write into the reader, the proxies'
/// and rlaunch's exits, on a busy machine.
const MARGIN: Duration = Duration::from_secs(1);
/// Peak resident sizes allowed. rlaunch holds at most 64 chunks of 128 KiB for its writer
/// and a frame being read per link; a proxy, 32 frames of 128 KiB for its parent and one
/// batch being written. Both are about half of these bounds (18 and 7.5 MiB measured).
const RLAUNCH_MAX_KIB: u64 = 40 << 10;
const PROXY_MAX_KIB: u64 = 16 << 10;

/// The runs below take turns. Each puts 256 ranks that write as fast as the kernel lets them
/// on this machine's CPUs, and the bound on the Ctrl-C's end is for one job's teardown, not
/// for one starved by a twin's 256 busy writers: with both at once, rlaunch saw the SIGINT
/// 1.25 s after it was sent (its debug log) and the end took over 2 s (2.09 to 2.91 s) in 11
/// of 24 runs, against 0.17 to 0.46 s one at a time (2 CPUs).
static ONE_AT_A_TIME: Mutex<()> = Mutex::new(());

#[test]
fn ctrl_c_under_a_slow_reader_ends_everything_within_the_grace_with_every_line_whole() {
    // 16 MiB/s: the ranks could write a hundred times more, and before the teardown dropped
    // what the reader had not taken, the end waited for the 256 MiB in the pipes.
    flood_then_ctrl_c(256, 16, 16 << 20, Duration::from_secs(3));
}

/// At 4 MiB/s shared by 16 links, a proxy's reports of its ranks' ends (which travel behind
/// its output, read as slowly as the reader reads) come after the grace: a rank killed by
/// the forwarded SIGINT is still the signal's doing, not a failure of its own.
#[test]
fn ctrl_c_under_a_very_slow_reader_still_says_interrupted() {
    flood_then_ctrl_c(256, 16, 4 << 20, Duration::from_secs(4));
}

/// `ranks` on `nodes` fake nodes flood a reader of `rate` bytes a second for `flood`; then
/// Ctrl-C. Checks lines, memory, the exit, and the end.
fn flood_then_ctrl_c(ranks: u32, nodes: usize, rate: u64, flood: Duration) {
    let _turn = ONE_AT_A_TIME.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
    let tag = Tag::new();
    let mut child = Command::new(rlaunch_tests::rlaunch())
        .args([
            "--launcher",
            "fork",
            "--hosts",
            &hosts::node_list_with_slots(nodes, ranks / nodes as u32),
        ])
        .args(["-n", &ranks.to_string(), "--pmi", "simple", &rankprog_str(), "flood-for", "600"])
        .env(TAG_VAR, tag.as_str())
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .process_group(0)
        .spawn()
        .expect("cannot start rlaunch");
    let pid = child.id() as i32;
    let pipe = child.stdout.take().unwrap();
    let reader = std::thread::spawn(move || scan_flood_stream(pipe, Some(rate)));
    let mut stderr = child.stderr.take().unwrap();
    let stderr = std::thread::spawn(move || {
        let mut text = String::new();
        let _ = stderr.read_to_string(&mut text);
        text
    });

    // Memory while the ranks flood.
    let started = Instant::now();
    let (mut rlaunch_peak, mut proxy_peak, mut proxies) = (0, 0, 0);
    while started.elapsed() < flood {
        rlaunch_peak = rlaunch_peak.max(procfs::rss_kib(pid));
        let seen: Vec<_> =
            tag.processes().into_iter().filter(|p| p.comm == "rlaunch-proxy").collect();
        proxies = proxies.max(seen.len());
        for proxy in seen {
            proxy_peak = proxy_peak.max(procfs::rss_kib(proxy.pid.as_raw()));
        }
        std::thread::sleep(Duration::from_millis(200));
    }
    assert!(child.try_wait().unwrap().is_none(), "rlaunch ended before the Ctrl-C");

    // Ctrl-C: the terminal signals rlaunch's group (proxies and ranks have groups of their own).
    let sent = Instant::now();
    killpg(Pid::from_raw(pid), Signal::SIGINT).unwrap();
    let gone = tag.wait_until_none(KILL_GRACE + MARGIN + Duration::from_secs(10));
    let took = sent.elapsed();
    let status = child.wait().unwrap();
    let (bytes, lines) = reader.join().unwrap();
    let stderr = stderr.join().unwrap();
    gone.unwrap_or_else(|left| panic!("still running {took:?} after the Ctrl-C: {left:?}"));

    let report = lines.unwrap_or_else(|e| panic!("after {bytes} bytes: {e}"));
    assert!(report.total_lines() > 0, "no output read");
    assert_eq!(report.total_lines() * 64, bytes);
    assert_eq!((status.code(), status.signal()), (Some(130), None), "stderr: {stderr}");
    assert_eq!(stderr, "rlaunch: interrupted by SIGINT\n");
    assert!(took <= KILL_GRACE + MARGIN, "the Ctrl-C took {took:?} to end everything");
    assert!(proxies >= nodes, "saw {proxies} proxies of {nodes}");
    assert!(rlaunch_peak < RLAUNCH_MAX_KIB, "rlaunch grew to {rlaunch_peak} KiB");
    assert!(proxy_peak < PROXY_MAX_KIB, "a proxy grew to {proxy_peak} KiB");
    // Nothing is left a moment later either (a daemon would hold no tag-less pipe).
    tag.wait_until_none(Duration::ZERO).unwrap();
}
