//! PMI spawn (MPI_Comm_spawn) through the proxies, for PMI-1 and PMI-2. Debian's MPICH
//! cannot spawn over UCX, so a raw client (tests/scripts/spawn_client.py) sends the wire
//! bytes docs/pmi.md describes.

use std::collections::BTreeMap;

use rlaunch_tests::output::{report_hosts, report_vars, rlaunch_lines, sorted};
use rlaunch_tests::{spawn_client, Run};

fn python() -> &'static str {
    let ok = std::process::Command::new("python3")
        .arg("--version")
        .output()
        .is_ok_and(|o| o.status.success());
    assert!(ok, "python3 is needed to run the raw PMI spawn client");
    "python3"
}

#[test]
fn pmi1_spawn_starts_a_new_job_with_its_own_kvs_and_preput() {
    let client = spawn_client();
    let out =
        Run::new(&["--launcher", "fork", "--hosts", "n1,n2", "-n", "2", python(), &client, "1"])
            .run();
    out.assert_code(0);
    let lines = out.lines();
    assert_eq!(lines.iter().filter(|l| l.ends_with("cmd=spawn_result rc=0")).count(), 2, "{out}");
    let children: Vec<_> = lines.iter().filter(|l| l.starts_with("child ")).collect();
    assert_eq!(children.len(), 4, "{out}");
    for child in &children {
        assert!(
            child.contains(" of 2 kvs ") && child.contains("port port-of-parent peer here0"),
            "{child}"
        );
    }
    // Two spawns, two new kvsnames, neither the parent's.
    let kvsnames: std::collections::BTreeSet<_> =
        children.iter().map(|c| c.split_whitespace().nth(5).unwrap().to_string()).collect();
    assert_eq!(kvsnames.len(), 2, "{out}");
}

/// The `child ...` lines, sorted, each cut at its rank's kvsname or spawner (which differ
/// per run).
fn children(lines: &[String]) -> Vec<String> {
    sorted(lines.iter().filter(|l| l.starts_with("child ")).cloned())
}

#[test]
fn spawned_ranks_go_after_the_last_slot_round_the_hosts_with_proxies_where_none_was() {
    // One rank on n1; the three children on n2, n3 (no proxy there yet) and n1 again. Their
    // node map counts the job's own nodes, in the order it first uses them.
    for version in ["1", "2"] {
        let dir = rlaunch_tests::tempdir();
        let report = dir.path().join("report.json");
        let hosts = ["--launcher", "fork", "--hosts", "n1,n2,n3", "-n", "1", "--report"];
        let out = Run::new(&hosts)
            .arg(&report)
            .args([python(), &spawn_client(), version])
            .env("SPAWN_NPROCS", "3")
            .run();
        out.assert_code(0);
        assert_eq!(rlaunch_lines(&out.stderr_str()), Vec::<&str>::new(), "{out}");
        assert_eq!(report_hosts(&report, 1), ["n2", "n3", "n1"], "{out}");
        let kids = children(&out.lines());
        assert_eq!(kids.len(), 3, "{out}");
        assert!(kids.iter().all(|l| l.ends_with(" map (vector,(0,3,1))")), "{out}");
        // torchrun's variables are the spawned job's own: each child alone on its node.
        for (rank, kid) in kids.iter().enumerate() {
            assert!(kid.contains(&format!(" torch {rank}/3 group {rank}/3 on ")), "{kid}");
        }
        if version == "1" {
            // Every child got the pair child 0 put on another node: the fence spans them.
            assert!(kids.iter().all(|l| l.contains(" peer here0 ")), "{out}");
        }
        // The report shows each child's variables: its own job's place, no rendezvous.
        for (rank, vars) in report_vars(&report, 1).iter().enumerate() {
            let get = |name: &str| vars.get(name).map(String::as_str);
            for name in ["RANK", "GROUP_RANK", "PMI_RANK"] {
                assert_eq!(get(name), Some(rank.to_string().as_str()), "{name}: {vars:?}");
            }
            for name in ["WORLD_SIZE", "GROUP_WORLD_SIZE", "PMI_SIZE"] {
                assert_eq!(get(name), Some("3"), "{name}: {vars:?}");
            }
            assert_eq!((get("LOCAL_RANK"), get("MASTER_ADDR")), (Some("0"), None), "{vars:?}");
        }
        out.tag.wait_until_none(std::time::Duration::from_secs(5)).unwrap();
    }
}

#[test]
fn spawn_hints_choose_the_hosts_and_a_host_not_in_the_job_fails_the_spawn_call() {
    let run = |version: &str, info: &str, report: &std::path::Path| {
        let hosts = ["--launcher", "fork", "--hosts", "n1:2,n2:2", "-n", "1", "--report"];
        Run::new(&hosts)
            .arg(report)
            .args([python(), &spawn_client(), version])
            .env("SPAWN_NPROCS", "3")
            .env("SPAWN_INFO", info)
            .run()
    };
    let dir = rlaunch_tests::tempdir();
    let report = dir.path().join("report.json");
    let mut placed = BTreeMap::new();
    for (version, info) in [
        ("1", "host=n2"),
        ("2", "host=n1,n2;map-by=node"),
        ("2", "host=n1:1,n2"),
        ("1", "add-host=n7:2"),
    ] {
        let out = run(version, info, &report);
        out.assert_code(0);
        assert_eq!(children(&out.lines()).len(), 3, "{out}");
        placed.insert(info, report_hosts(&report, 1));
    }
    let want: BTreeMap<_, _> = [
        // Past the slots the hints give, round them again.
        ("host=n2", vec!["n2", "n2", "n2"]),
        ("host=n1,n2;map-by=node", vec!["n1", "n2", "n1"]),
        ("host=n1:1,n2", vec!["n1", "n2", "n2"]),
        ("add-host=n7:2", vec!["n7", "n7", "n7"]),
    ]
    .into_iter()
    .map(|(k, v)| (k, v.into_iter().map(String::from).collect::<Vec<_>>()))
    .collect();
    assert_eq!(placed, want);
    // A host the job does not have: the spawn call fails (the program goes on and says so),
    // and the job is not hung.
    for version in ["1", "2"] {
        let out = run(version, "host=n9", &report);
        out.assert_code(0);
        let want = "rlaunch: note: the spawn of rank 0 failed: host n9 is not one of the job's \
                    hosts (the add-host hint adds one)";
        assert_eq!(rlaunch_lines(&out.stderr_str()), [want], "{out}");
        let parent = out.lines().into_iter().find(|l| l.starts_with("parent 0 ")).unwrap();
        let refused = match version {
            "1" => "parent 0 cmd=spawn_result rc=-1 msg=host_n9_is_not_one_of_the_job's_hosts_(the_add-host_hint_adds_one)",
            _ => "parent 0 rc=1 thrid=t7 jobid= errmsg=host n9 is not one of the job's hosts \
                  (the add-host hint adds one)",
        };
        assert_eq!(parent, refused);
        assert!(children(&out.lines()).is_empty(), "{out}");
    }
}

#[test]
fn pmi2_spawn_echoes_thrid_and_children_know_their_spawner() {
    let out = Run::new(&["-n", "1", python(), &spawn_client(), "2"]).run();
    out.assert_code(0);
    let text = out.stdout_str();
    let parent = text.lines().find(|l| l.starts_with("parent 0")).expect("parent line");
    assert!(parent.contains("rc=0 thrid=t7 jobid="), "{text}");
    let jobid = parent.rsplit("jobid=").next().unwrap();
    let spawner = jobid.rsplit_once('_').unwrap().0;
    for r in 0..3 {
        assert!(text.contains(&format!("child {r} of 3 spawner {spawner} port port2")), "{text}");
    }
}

/// A lone rank's proxy writes its output into rlaunch's stdout itself (a pipe here); when
/// the rank spawns, the proxy hands stdout back to rlaunch, which writes the children's lines
/// too. The line the parent left open across the spawn is not cut by theirs.
#[test]
fn a_lone_rank_that_spawns_hands_stdout_back_without_cutting_a_line() {
    let out = Run::new(&["-n", "1", python(), &spawn_client(), "2"])
        .env("OPEN_LINE", "5000")
        .env("CHILD_LINES", "2000")
        .env("RLAUNCH_LOG", "debug")
        .run();
    out.assert_code(0);
    let lines = out.lines();
    let parent: Vec<_> = lines.iter().filter(|l| l.starts_with("parent line ")).collect();
    assert_eq!(parent.len(), 5000, "{out}");
    assert!(parent.iter().enumerate().all(|(i, l)| **l == format!("parent line {i}")));
    let open = lines.iter().filter(|l| l.contains("opens a line")).collect::<Vec<_>>();
    assert_eq!(open, ["parent opens a line and ends it after the spawn"], "{out}");
    for child in 0..3 {
        let mine: Vec<_> =
            lines.iter().filter(|l| l.starts_with(&format!("child {child} line "))).collect();
        assert_eq!(mine.len(), 2000, "{out}");
        assert!(mine.iter().enumerate().all(|(i, l)| **l == format!("child {child} line {i}")));
    }
    assert_eq!(lines.len(), 5000 + 1 + 3 * 2001 + 1, "{out}");
    // The parent's lines went in from its proxy; the rest came through rlaunch.
    let (written, _) = rlaunch_tests::output::written_by_the_proxy(&out.stderr_str());
    let parent_bytes: u64 = parent.iter().map(|l| l.len() as u64 + 1).sum();
    assert_eq!(written, parent_bytes, "{out}");
}

#[test]
fn a_failing_spawned_rank_fails_the_run_and_is_named() {
    // A variant of the client whose spawned children exit 3 after finalize.
    let dir = rlaunch_tests::tempdir();
    let script = dir.path().join("bad_child.py");
    let source = std::fs::read_to_string(spawn_client()).unwrap().replace(
        "    assert line(\"cmd=finalize\") == \"cmd=finalize_ack\"",
        "    assert line(\"cmd=finalize\") == \"cmd=finalize_ack\"\n    sys.exit(3 if spawned else 0)",
    );
    std::fs::write(&script, source).unwrap();
    let out = Run::new(&["-n", "1", python(), script.to_str().unwrap(), "1"]).run();
    out.assert_code(3);
    assert!(out.stderr_str().contains("of spawned job 1 (pid "), "{out}");
}

#[test]
fn a_spawn_of_more_processes_than_a_node_can_run_ends_the_job_naming_the_rank() {
    // An uninitialised maxprocs must not make rlaunch lay out billions of ranks.
    let out = Run::new(&["-n", "1", python(), &spawn_client(), "1"])
        .env("SPAWN_NPROCS", "4294967295")
        .run();
    out.assert_code(255);
    let want = format!(
        "rlaunch: rank 0 on {} asked to spawn 4294967295 processes, more than a node can run",
        rlaunch_tests::hosts::hostname()
    );
    assert_eq!(rlaunch_tests::output::rlaunch_lines(&out.stderr_str()), [want], "{out}");
    out.tag.wait_until_none(std::time::Duration::from_secs(5)).unwrap();
}
