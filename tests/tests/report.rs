//! `--report FILE`: the JSON of a job and of every rank's run (docs/report.md), checked
//! field by field against what the ranks did; and the table of failed ranks at the end of
//! stderr.

use std::collections::HashMap;

use rlaunch_tests::output::rlaunch_lines;
use rlaunch_tests::{rankprog_str, Run};
use serde_json::Value;

const HOSTS: &str = "n1:2,n2:2,n3:2,n4:2";

fn read_report(path: &std::path::Path) -> Value {
    let text = std::fs::read_to_string(path).expect("the report was written");
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("the report is not JSON ({e}): {text}"))
}

fn u(v: &Value) -> u64 {
    v.as_u64().unwrap_or_else(|| panic!("not a whole number: {v}"))
}

fn f(v: &Value) -> f64 {
    v.as_f64().unwrap_or_else(|| panic!("not a number: {v}"))
}

/// The pid each rank printed with `ready` (`ready R PID`).
fn ready_pids(stdout: &str) -> HashMap<u64, u64> {
    stdout
        .lines()
        .filter_map(|l| l.strip_prefix("ready "))
        .map(|l| {
            let (rank, pid) = l.split_once(' ').expect("ready R PID");
            (rank.parse().unwrap(), pid.parse().unwrap())
        })
        .collect()
}

#[test]
fn a_failing_job_reports_every_rank_and_node_field_by_field() {
    let dir = rlaunch_tests::tempdir();
    let path = dir.join("report.json");
    let path_str = path.to_str().unwrap().to_string();
    let rankprog = rankprog_str();
    // Rank 0 takes 200 MiB, rank 1 burns 1 s of CPU then fails, rank 2 prints 3 lines, rank 3
    // 2 lines on stderr; every other rank only says it is ready.
    let script =
        ["ready", "@0", "alloc", "200", "@2", "print", "3", "@3", "eprint", "2", "@1", "spin", "1"];
    let mut argv =
        vec!["--launcher", "fork", "--hosts", HOSTS, "-n", "8", "--report", &path_str, &rankprog];
    argv.extend(script);
    argv.extend(["@1", "exit", "3"]);
    let out = Run::new(&argv).run();
    out.assert_code(3);
    let stdout = out.stdout_str();
    let pids = ready_pids(&stdout);
    assert_eq!(pids.len(), 8, "{out}");
    let report = read_report(&path);

    assert_eq!(report["schema"], 1);
    assert_eq!(report["rlaunch"], env!("CARGO_PKG_VERSION"));
    let job = &report["job"];
    let mut command = vec!["rlaunch".to_string()];
    command.extend(argv.iter().map(|a| a.to_string()));
    assert_eq!(job["command"], serde_json::json!(command));
    assert!(job["jobid"].as_str().unwrap().starts_with("rlaunch_"), "{job}");
    let (job_start, job_end) = (u(&job["start_us"]), u(&job["end_us"]));
    assert!(job_start < job_end, "{job}");
    assert!((f(&job["wall_s"]) - (job_end - job_start) as f64 / 1e6).abs() < 1e-6, "{job}");
    assert_eq!(job["exit_code"], 3);
    let culprit = format!("rank 1 (pid {} on n1) exited with code 3", pids[&1]);
    assert_eq!(job["cause"], culprit.as_str());
    assert_eq!(rlaunch_lines(&out.stderr_str()), vec![format!("rlaunch: {culprit}")]);

    // A node's times are on rlaunch's clock through offsets measured over its path, each
    // right to within half its round trip: the slack against rlaunch's own times.
    let nodes = report["nodes"].as_array().unwrap();
    let slack: u64 = 1_000 + nodes.iter().map(|n| u(&n["round_trip_us"])).sum::<u64>();

    let ranks = report["ranks"].as_array().unwrap();
    assert_eq!(ranks.len(), 8);
    for (i, r) in ranks.iter().enumerate() {
        let i = i as u64;
        let what = format!("rank {i}: {r}");
        assert_eq!((u(&r["id"]), u(&r["rank"]), u(&r["job"]), u(&r["segment"])), (i, i, 0, 0));
        assert_eq!(r["host"], format!("n{}", i / 2 + 1), "{what}");
        assert_eq!(u(&r["node"]), i / 2, "{what}");
        assert_eq!(u(&r["pid"]), pids[&i], "{what}");
        assert_eq!(r["exit_code"], if i == 1 { 3 } else { 0 }, "{what}");
        assert!(r["signal"].is_null() && r["failed_to_start"].is_null(), "{what}");
        let (start, end) = (u(&r["start_us"]), u(&r["end_us"]));
        // Proxies on this machine: the clocks are one, within the offsets' error.
        assert!(job_start <= start + slack && start <= end && end <= job_end + slack, "{what}");
        assert!((f(&r["wall_s"]) - (end - start) as f64 / 1e6).abs() < 1e-6, "{what}");
        let ready = format!("ready {i} {}\n", pids[&i]).len() as u64;
        let printed: u64 = (0..3).map(|n| format!("rank 2 line {n}\n").len() as u64).sum();
        let eprinted: u64 = (0..2).map(|n| format!("rank 3 line {n}\n").len() as u64).sum();
        let stdout_bytes = ready + if i == 2 { printed } else { 0 };
        assert_eq!(u(&r["stdout_bytes"]), stdout_bytes, "{what}");
        assert_eq!(u(&r["stderr_bytes"]), if i == 3 { eprinted } else { 0 }, "{what}");
        let (user, system, maxrss) = (f(&r["user_s"]), f(&r["system_s"]), u(&r["maxrss_kib"]));
        assert!(user >= 0.0 && system >= 0.0 && maxrss > 0, "{what}");
        match i {
            0 => assert!(maxrss >= 200 << 10, "{what}"),
            1 => assert!(user >= 0.9, "{what}"),
            // Nobody else took 200 MiB or burnt a second.
            _ => assert!(maxrss < 100 << 10 && user < 0.5, "{what}"),
        }
    }

    assert_eq!(nodes.len(), 4);
    let mut proxies = Vec::new();
    for (i, n) in nodes.iter().enumerate() {
        let what = format!("node {i}: {n}");
        assert_eq!(u(&n["node"]), i as u64, "{what}");
        assert_eq!(n["host"], format!("n{}", i + 1), "{what}");
        proxies.push(u(&n["proxy_pid"]));
        assert!(n["clock_offset_us"].as_i64().unwrap().abs() < 50_000, "{what}");
        assert!(u(&n["round_trip_us"]) > 0, "{what}");
        let phase = |name: &str| u(&n["phases"][name]);
        let order = ["bootstrap", "hello", "done"].map(phase);
        assert!(order.windows(2).all(|w| w[0] <= w[1] + slack), "{what}");
        let own = ["launched", "ranks_started", "done"].map(phase);
        assert!(own.windows(2).all(|w| w[0] <= w[1]), "{what}");
        let (start, end) = (phase("bootstrap"), phase("done"));
        assert!(job_start <= start + slack && end <= job_end + slack, "{what}");
        assert_eq!(n["phases"].as_object().unwrap().len(), 5, "{what}");
    }
    proxies.sort();
    proxies.dedup();
    assert_eq!(proxies.len(), 4, "a proxy per node: {nodes:?}");
}

#[test]
fn failed_ranks_are_tabled_at_the_end_of_stderr_ten_at_most() {
    let dir = rlaunch_tests::tempdir();
    let path = dir.join("report.json");
    // Ranks 2, 4 and 6 fail on their own: 2 first, then 4 and 6 (which ignore the teardown's
    // SIGTERM) within the grace; the other five are ended by the teardown.
    let script = [
        "@4,6",
        "ignore-term",
        "ready",
        "@2",
        "sleep",
        "1",
        "@2",
        "exit",
        "5",
        "@4,6",
        "sleep",
        "1.5",
        "@4,6",
        "exit",
        "6",
        "sleep",
        "30",
    ];
    let out = Run::new(&["--launcher", "fork", "--hosts", HOSTS, "-n", "8", "--kill-grace", "5"])
        .args(["--report", path.to_str().unwrap(), &rankprog_str()])
        .args(script)
        .run();
    out.assert_code(5);
    let pids = ready_pids(&out.stdout_str());
    let pid = |rank: u64| pids[&rank].to_string();
    let width = [2, 4, 6].map(|r| pid(r).len()).into_iter().max().unwrap().max(3);
    let row = |rank: &str, host: &str, pid: &str, how: &str| {
        format!("rlaunch:   {rank:<4}  {host:<4}  {pid:>width$}  {how}")
    };
    let want = vec![
        format!("rlaunch: rank 2 (pid {} on n2) exited with code 5", pid(2)),
        "rlaunch: 3 ranks failed:".to_string(),
        row("rank", "host", "pid", "how it ended"),
        row("2", "n2", &pid(2), "exited with code 5"),
        row("4", "n3", &pid(4), "exited with code 6"),
        row("6", "n4", &pid(6), "exited with code 6"),
        "rlaunch:   (5 more ranks were ended by the teardown)".to_string(),
    ];
    assert_eq!(rlaunch_lines(&out.stderr_str()), want, "{out}");
    let report = read_report(&path);
    let signals: Vec<&Value> =
        report["ranks"].as_array().unwrap().iter().map(|r| &r["signal"]).collect();
    assert_eq!(signals.iter().filter(|s| **s == 15).count(), 5, "{report}");

    // Sixteen ranks fail on their own: ten rows, then how many more.
    let out = Run::new(&["--launcher", "fork", "--hosts", "n1:4,n2:4,n3:4,n4:4", "-n", "16"])
        .args([&rankprog_str(), "ignore-term", "ready", "sleep", "1", "exit", "1"])
        .run();
    out.assert_code(1);
    let err = out.stderr_str();
    let lines = rlaunch_lines(&err);
    assert_eq!(lines.len(), 1 + 1 + 1 + 10 + 1, "{out}");
    assert_eq!(lines[1], "rlaunch: 16 ranks failed:");
    assert_eq!(lines[13], "rlaunch:   and 6 more");
    let rows: Vec<u32> = lines[3..13]
        .iter()
        .map(|l| l.split_whitespace().nth(1).unwrap().parse().unwrap())
        .collect();
    assert_eq!(rows, (0..10).collect::<Vec<_>>(), "rows in rank order: {out}");
}

#[test]
fn a_report_that_cannot_be_written_stops_the_launch() {
    let out = Run::new(&["--report", "/nonexistent/r.json", "-n", "1", "true"]).run();
    out.assert_code(255);
    assert_eq!(
        rlaunch_lines(&out.stderr_str()),
        vec!["rlaunch: cannot write the report /nonexistent/r.json: No such file or directory"]
    );
}

#[test]
fn the_report_comes_up_a_tree_over_ssh_with_every_node_and_rank() {
    // Over the ssh bootstrap (a fake ssh: the same machine), width 2: n1 and n2 under
    // rlaunch, n3 to n6 under them, n7 under n3. Every record travels up the tree.
    let dir = rlaunch_tests::tempdir();
    let path = dir.join("report.json");
    let hosts = "n1,n2,n3,n4,n5,n6,n7";
    let ssh = rlaunch_tests::fakessh();
    let out = Run::new(&["--launcher", "ssh", "--launcher-exec", &ssh, "--hosts", hosts])
        .args(["--tree-width", "2", "-n", "7", "--report", path.to_str().unwrap()])
        .args([&rankprog_str(), "ready"])
        .run();
    out.assert_code(0);
    let pids = ready_pids(&out.stdout_str());
    let report = read_report(&path);
    let nodes = report["nodes"].as_array().unwrap();
    let hosts: Vec<&str> = nodes.iter().map(|n| n["host"].as_str().unwrap()).collect();
    assert_eq!(hosts, ["n1", "n2", "n3", "n4", "n5", "n6", "n7"]);
    for n in nodes {
        assert_eq!(n["phases"].as_object().unwrap().len(), 5, "{n}");
        // One machine's clock, measured through one or two hops of ssh pipes.
        assert!(n["clock_offset_us"].as_i64().unwrap().abs() < 50_000, "{n}");
    }
    for (i, r) in report["ranks"].as_array().unwrap().iter().enumerate() {
        assert_eq!(u(&r["pid"]), pids[&(i as u64)], "{r}");
        assert_eq!(r["exit_code"], 0, "{r}");
        let ready = format!("ready {i} {}\n", pids[&(i as u64)]).len() as u64;
        assert_eq!(u(&r["stdout_bytes"]), ready, "{r}");
    }
}

#[test]
fn every_proxy_of_a_deep_tree_has_its_own_clock_measured() {
    // Seven fake nodes, two children a proxy: the proxies below the top are probed by their
    // parent proxies, whose link alone consumes the echoes. (They used to relay their
    // children's echoes up instead, so a proxy below the top had no measurement of its own
    // and showed its parent's offset and round trip exactly.)
    let dir = rlaunch_tests::tempdir();
    let path = dir.join("report.json");
    let hosts = "n1,n2,n3,n4,n5,n6,n7";
    let argv = ["--tree-width", "2", "--launcher", "fork", "--hosts", hosts, "-n", "7"];
    let out = Run::new(&argv).arg("--report").arg(&path).arg("true").run();
    out.assert_code(0);
    let report = read_report(&path);
    let nodes = report["nodes"].as_array().expect("nodes");
    assert_eq!(nodes.len(), 7, "{report}");
    let mut round_trips: Vec<u64> = nodes.iter().map(|n| u(&n["round_trip_us"])).collect();
    for n in nodes {
        // On one machine every clock is the same: the offset is within half the round trip.
        let (offset, round_trip) = (n["clock_offset_us"].as_i64().unwrap(), u(&n["round_trip_us"]));
        assert!(offset.unsigned_abs() <= round_trip / 2 + 1, "{n}");
    }
    round_trips.sort_unstable();
    round_trips.dedup();
    // A path's round trips summed: each proxy's differs from its parent's by its own link's.
    assert!(round_trips.len() >= 5, "{round_trips:?}: {report}");
}

/// rlaunch's and each proxy's own usage: CPU, peak memory, and the descriptors held while
/// the ranks run, which grow by a fixed number per child proxy (rlaunch) and per running
/// rank (a proxy): costs the launch model prices (docs/scale.md), checked as differences between two jobs
/// so that whatever the harness left open cancels out.
#[test]
fn the_report_says_what_rlaunch_and_each_proxy_used() {
    let dir = rlaunch_tests::tempdir();
    let usage = |hosts: &str, n: &str| {
        let path = dir.join(format!("report-{n}.json"));
        let path_str = path.to_str().unwrap().to_string();
        // The ranks outlive the moment every node says they started: their pipes are open.
        let argv = ["--launcher", "fork", "--hosts", hosts, "-n", n, "--report", &path_str];
        Run::new(&[&argv[..], &["sleep", "0.3"]].concat()).run().assert_code(0);
        let report = read_report(&path);
        let nodes = report["nodes"].as_array().unwrap().clone();
        (report["job"]["rlaunch_usage"].clone(), nodes)
    };
    let (root_one, nodes_one) = usage("n1", "1");
    let (root_four, nodes_four) = usage("n1:3,n2:3,n3:3,n4:3", "12");
    for (what, used) in std::iter::once(("rlaunch", &root_four))
        .chain(nodes_four.iter().map(|n| ("a proxy", &n["proxy_usage"])))
    {
        assert!(f(&used["user_s"]) + f(&used["system_s"]) > 0.0, "{what}: {used}");
        assert!(u(&used["maxrss_kib"]) > 1024, "{what}: {used}");
    }
    // Three more top proxies: 3 descriptors each at rlaunch (docs/report.md).
    let fds = |used: &Value| u(&used["fds_running"]);
    assert_eq!(fds(&root_four), fds(&root_one) + 3 * 3, "{root_one} {root_four}");
    // Two more running ranks on node 0: their stdout and stderr pipes at its proxy (`sleep`
    // gets no PMI socket).
    let (one, four) = (&nodes_one[0]["proxy_usage"], &nodes_four[0]["proxy_usage"]);
    assert_eq!(fds(four), fds(one) + 2 * 2, "{one} {four}");
}
