//! Open MPI programs (Debian's Open MPI 4.1, a PMIx client) under rlaunch: each node's proxy
//! starts an OpenPMIx server for them. Wire-up on one node and across fake nodes, where Open
//! MPI thinks each rank is, point-to-point traffic, `MPI_Abort`, the name service,
//! `MPI_Comm_spawn` and `MPI_Comm_connect`/`MPI_Comm_accept`, PMIx fences larger than a
//! frame, ScaLAPACK's testers. What each node's PMIx server does for them is `pmix_server`.
//!
//! Every test checks what the ranks report: an Open MPI rank that finds no PMIx server runs
//! as a singleton of size 1 and exits 0.

use std::time::Duration;

use rlaunch_tests::hosts::hostname;
use rlaunch_tests::mpi::{check_abort, check_hello, fake_nodes, mpi_run, CProgram, MPI_LIMIT};
use rlaunch_tests::output::{report_hosts, rlaunch_lines, sorted};
use rlaunch_tests::Run;

#[test]
fn open_mpi_hello_allreduce_on_one_node() {
    let out = mpi_run(&[], 4, CProgram::OmpiHello, &["4"]).run();
    check_hello(&out, 4);
}

#[test]
fn open_mpi_hello_on_four_fake_nodes_sees_each_rank_on_its_node() {
    let out = mpi_run(&fake_nodes(4, 2), 8, CProgram::OmpiHello, &["8"]).run();
    check_hello(&out, 8);
    // Open MPI's processor name is gethostname(), one machine's: where Open MPI believes
    // each rank is shows in its shared-memory communicator and its server's node name.
    let out = mpi_run(&fake_nodes(4, 2), 8, CProgram::OmpiNodes, &[]).run();
    out.assert_code(0);
    let want: Vec<String> =
        (0..8).map(|r| format!("rank {r} size 8 shared 2 host n{}", r / 2 + 1)).collect();
    assert_eq!(sorted(out.lines()), sorted(want), "{out}");
}

#[test]
fn open_mpi_without_a_full_modex_gets_each_remote_rank_by_direct_modex() {
    // With collection off, MPI_Init's fence brings no data: each node's server asks the node
    // of every remote rank its ranks talk to, through the tree.
    for nodes in [2, 4] {
        let n = nodes as u32;
        let out = mpi_run(&fake_nodes(nodes, 1), n, CProgram::OmpiHello, &[&n.to_string()])
            .env("OMPI_MCA_pmix_base_collect_data", "0")
            .run();
        check_hello(&out, n);
    }
}

#[test]
fn direct_modex_reaches_the_owning_node_through_the_tree() {
    // A chain (--tree-width 1) too: requests and answers pass interior proxies.
    let chain = [fake_nodes(3, 1), vec!["--tree-width".into(), "1".into()]].concat();
    for (options, n) in [(fake_nodes(4, 1), 4), (chain, 3)] {
        let out = mpi_run(&options, n, CProgram::Dmodex, &[]).run();
        out.assert_code(0);
        let want = (0..n).map(|r| format!("rank {r} got from {}", (r + 1) % n));
        assert_eq!(sorted(out.lines()), sorted(want), "{out}");
    }
}

#[test]
fn a_direct_modex_request_for_a_rank_that_never_connects_fails_not_hangs() {
    // Rank 1 ends (at once, or a second later) without ever connecting to its server: the
    // request for its data fails when it ends, and so does the rank that asked.
    let dmodex = CProgram::Dmodex.path_str();
    for rank1 in ["exit 0", "exec sleep 1"] {
        let script = format!("[ \"$PMIX_RANK\" = 1 ] && {rank1}; exec {dmodex}");
        let out = Run::new(&["--launcher", "fork", "--hosts", "a,b", "-n", "2", "sh", "-c"])
            .arg(&script)
            .timeout(MPI_LIMIT)
            .run();
        out.assert_code(3);
        assert_eq!(out.lines(), ["rank 0 cannot get 1: NOT-FOUND"], "{out}");
        out.tag.wait_until_none(Duration::from_secs(5)).unwrap_or_else(|left| {
            panic!("left running: {left:?}");
        });
    }
}

/// The request for a rank whose node finishes as the request goes down (its only rank
/// ended without connecting) is answered by whoever sent it there once that node is done:
/// rlaunch, or the node above it in a deeper tree. 1 run in 15 hung, 4 at a time, in
/// either shape, before they kept track of the requests they sent down.
#[test]
fn a_request_to_a_node_that_finishes_meanwhile_fails_not_hangs() {
    let dmodex = CProgram::Dmodex.path_str();
    let script = format!("[ \"$PMIX_RANK\" = 1 ] && exit 0; exec {dmodex}");
    let runs: Vec<_> = (0..4)
        .map(|_| {
            let script = script.clone();
            std::thread::spawn(move || {
                for width in ["32", "1", "32", "1", "32", "1"] {
                    let out = Run::new(&["--launcher", "fork", "--hosts", "a,b", "-n", "2"])
                        .args(["--tree-width", width, "sh", "-c", &script])
                        .timeout(MPI_LIMIT)
                        .run();
                    out.assert_code(3);
                    assert_eq!(out.lines(), ["rank 0 cannot get 1: NOT-FOUND"], "{out}");
                }
            })
        })
        .collect();
    for run in runs {
        run.join().unwrap();
    }
}

#[test]
fn open_mpi_ring_across_three_fake_nodes() {
    let out = mpi_run(&fake_nodes(3, 2), 6, CProgram::OmpiRing, &[]).run();
    out.assert_code(0);
    let want = (0..6)
        .map(|r| format!("ring {r} got {}", if r == 0 { 6 } else { r }))
        .chain(["ring done size 6 token 6".to_string()]);
    assert_eq!(sorted(out.lines()), sorted(want), "{out}");
}

#[test]
fn open_mpi_abort_ends_the_job_with_its_code_and_names_the_rank() {
    let chain = [fake_nodes(2, 2), vec!["--tree-width".into(), "1".into()]].concat();
    for (options, host) in [(vec![], hostname()), (chain, "n1".to_string())] {
        let out = mpi_run(&options, 4, CProgram::OmpiAbort, &[]).run();
        check_abort(&out, &host);
    }
}

#[test]
fn a_rank_that_exits_before_mpi_init_ends_the_job_naming_it() {
    // The others wait in MPI_Init's fence for it; rlaunch must end them, not hang.
    let hello = CProgram::OmpiHello.path_str();
    let script = format!("[ \"$PMIX_RANK\" = 2 ] && exit 3; exec {hello} 4");
    let out = Run::new(&["--launcher", "fork", "--hosts", "a:2,b:2", "-n", "4", "sh", "-c"])
        .arg(&script)
        .timeout(MPI_LIMIT)
        .run();
    out.assert_code(3);
    let err = out.stderr_str();
    let ours = rlaunch_lines(&err);
    assert_eq!(ours.len(), 1, "{out}");
    assert!(ours[0].starts_with("rlaunch: rank 2 (pid "), "{out}");
    assert!(ours[0].ends_with(" on b) exited with code 3"), "{out}");
    out.tag.wait_until_none(Duration::from_secs(5)).unwrap_or_else(|left| {
        panic!("left running: {left:?}");
    });
}

#[test]
fn a_rank_killed_while_the_others_fence_ends_the_job_naming_it() {
    let out = mpi_run(&fake_nodes(2, 2), 4, CProgram::OmpiDie, &["2"]).run();
    out.assert_code(137);
    let err = out.stderr_str();
    let ours = rlaunch_lines(&err);
    assert_eq!(ours.len(), 1, "{out}");
    assert!(ours[0].starts_with("rlaunch: rank 2 (pid "), "{out}");
    assert!(ours[0].ends_with(" on n2) was killed by signal 9 (SIGKILL)"), "{out}");
    assert_eq!(sorted(out.lines()), ["ready 0", "ready 1", "ready 2", "ready 3"], "{out}");
    out.tag.wait_until_none(Duration::from_secs(5)).unwrap_or_else(|left| {
        panic!("left running: {left:?}");
    });
}

#[test]
fn a_rank_that_exits_without_finalize_ends_the_job_naming_it() {
    // Its peers' MPI_Finalize fences wait for it for ever: rlaunch must see that it left
    // without PMIx_Finalize (as it sees it for PMI) and end the job.
    let out = mpi_run(&fake_nodes(2, 1), 2, CProgram::OmpiDie, &["1", "exit"]).run();
    out.assert_code(255);
    let err = out.stderr_str();
    let ours = rlaunch_lines(&err);
    assert_eq!(ours.len(), 1, "{out}");
    assert!(ours[0].starts_with("rlaunch: rank 1 (pid "), "{out}");
    assert!(
        ours[0].ends_with(" on n2) closed its PMI connection before calling finalize"),
        "{out}"
    );
    assert_eq!(sorted(out.lines()), ["ready 0", "ready 1"], "{out}");
    out.tag.wait_until_none(Duration::from_secs(5)).unwrap_or_else(|left| {
        panic!("left running: {left:?}");
    });
    // A rank that finalizes and exits 0 is not judged so, however fast it goes.
    for _ in 0..5 {
        check_hello(&mpi_run(&fake_nodes(2, 2), 4, CProgram::OmpiHello, &["4"]).run(), 4);
    }
}

#[test]
fn open_mpi_publish_and_lookup_on_one_node_and_across_fake_nodes() {
    for options in [vec![], fake_nodes(2, 1)] {
        let port = "ompi-port#1";
        let out = mpi_run(&options, 2, CProgram::OmpiPublish, &["ompi-service", port]).run();
        out.assert_code(0);
        let want = [
            "gone ompi-service".to_string(),
            format!("lookup ompi-service = {port}"),
            "published ompi-service".to_string(),
            "unpublished ompi-service".to_string(),
        ];
        assert_eq!(sorted(out.lines()), want, "{out}");
    }
}

#[test]
fn open_mpi_spawn_starts_children_that_talk_to_their_parent() {
    // One node; and two fake nodes with the spawning rank on the second: its children go
    // after the last slot, round the hosts (a, b).
    let two_nodes = vec!["--launcher".into(), "fork".into(), "--hosts".into(), "a,b".into()];
    for (options, n, spawner, hosts) in [
        (vec![], 1, 0, vec![hostname(), hostname()]),
        (two_nodes, 2, 1, vec!["a".into(), "b".into()]),
    ] {
        let dir = rlaunch_tests::tempdir();
        let report = dir.path().join("report.json");
        let options = [options, vec!["--report".into(), report.to_str().unwrap().into()]].concat();
        let out = mpi_run(&options, n, CProgram::OmpiSpawn, &[&spawner.to_string()]).run();
        out.assert_code(0);
        assert_eq!(sorted(out.lines()), sorted(spawned_pair(spawner, n)), "{out}");
        assert_eq!(rlaunch_lines(&out.stderr_str()), Vec::<&str>::new(), "{out}");
        assert_eq!(report_hosts(&report, 1), hosts, "{out}");
        out.tag.wait_until_none(Duration::from_secs(5)).unwrap_or_else(|left| {
            panic!("left running after the spawn: {left:?}");
        });
    }
}

/// What `spawn SPAWNER` prints on `n` ranks when the spawn works.
fn spawned_pair(spawner: u32, n: u32) -> Vec<String> {
    let mut want = vec![
        format!("parent {spawner} spawned 2"),
        "child 0 of 2 got 100 from 0".to_string(),
        "child 1 of 2 got 100 from 0".to_string(),
        format!("parent {spawner} heard 0: 100"),
        format!("parent {spawner} heard 1: 101"),
    ];
    want.extend((0..n).filter(|&r| r != spawner).map(|r| format!("rank {r} idle")));
    want
}

#[test]
fn open_mpi_spawn_places_children_on_other_nodes_as_its_hints_say() {
    // One rank on a (of a:1,b:1,c:1): by default its two children go to b and c, which had
    // no proxy; the `host` hint puts both on c; `add-host` on a host the job did not have.
    // A host the job does not have fails MPI_Comm_spawn, and the program goes on.
    for (hint, hosts) in [("", ["b", "c"]), ("host=c", ["c", "c"]), ("add-host=d:2", ["d", "d"])] {
        let dir = rlaunch_tests::tempdir();
        let report = dir.path().join("report.json");
        let options = ["--launcher", "fork", "--hosts", "a:1,b:1,c:1", "--report"];
        let out = Run::new(&options)
            .arg(&report)
            .args(["-n", "1", CProgram::OmpiSpawn.path_str().as_str(), "0"])
            .env("SPAWN_INFO", hint)
            .timeout(MPI_LIMIT)
            .run();
        out.assert_code(0);
        assert_eq!(sorted(out.lines()), sorted(spawned_pair(0, 1)), "{out}");
        assert_eq!(rlaunch_lines(&out.stderr_str()), Vec::<&str>::new(), "{out}");
        assert_eq!(report_hosts(&report, 1), hosts, "{hint}: {out}");
        out.tag.wait_until_none(Duration::from_secs(5)).unwrap();
    }
    let out = Run::new(&["--launcher", "fork", "--hosts", "a:1,b:1", "-n", "1"])
        .args([CProgram::OmpiSpawn.path_str().as_str(), "0"])
        .env("SPAWN_INFO", "host=z")
        .timeout(MPI_LIMIT)
        .run();
    out.assert_code(0);
    assert_eq!(out.lines(), ["parent 0 spawn failed"], "{out}");
    let note = "rlaunch: note: the spawn of rank 0 failed: host z is not one of the job's hosts \
                (the add-host hint adds one)";
    assert_eq!(rlaunch_lines(&out.stderr_str()), [note], "{out}");
}

#[test]
fn open_mpi_spawn_collective_over_parents_on_two_nodes() {
    // Every rank spawns over MPI_COMM_WORLD; the children go after the last slot, round the
    // hosts (a, b), and each parent connects to both, gets their data by direct modex, and
    // disconnects through a fence over both jobs' processes on both nodes.
    let dir = rlaunch_tests::tempdir();
    let report = dir.path().join("report.json");
    let options = ["--launcher", "fork", "--hosts", "a:1,b:1", "-n", "2", "--report"];
    let out = Run::new(&options).arg(&report).arg(CProgram::OmpiSpawn.path_str()).arg("world");
    let out = out.timeout(MPI_LIMIT).run();
    out.assert_code(0);
    let mut want = Vec::new();
    for p in 0..2 {
        want.push(format!("parent {p} spawned 2"));
        for c in 0..2 {
            want.push(format!("child {c} of 2 got {} from {p}", 100 + p));
            want.push(format!("parent {p} heard {c}: {}", 100 + p + c));
        }
    }
    assert_eq!(sorted(out.lines()), sorted(want), "{out}");
    assert_eq!(rlaunch_lines(&out.stderr_str()), Vec::<&str>::new(), "{out}");
    assert_eq!(report_hosts(&report, 1), ["a", "b"], "{out}");
    out.tag.wait_until_none(Duration::from_secs(5)).unwrap_or_else(|left| {
        panic!("left running after the spawn: {left:?}");
    });
}

#[test]
fn a_lookup_left_by_a_rank_that_ended_does_not_take_a_value_published_for_one_read() {
    // Rank 1 leaves a waiting lookup behind and exits. Once the root has recorded its end
    // (its debug line), rank 0 publishes a value for one read and looks it up: the value is
    // rank 0's, not the dead rank's.
    let mut job = Run::new(&["-n", "2"])
        .arg(CProgram::Names.path_str())
        .env("RLAUNCH_LOG", "debug")
        .stdin_piped()
        .timeout(MPI_LIMIT)
        .spawn();
    job.wait_for_stderr_line(|l| l.starts_with("DEBUG rank ended rank=1 "), MPI_LIMIT);
    job.write_stdin(b"go\n");
    job.close_stdin();
    let out = job.wait(MPI_LIMIT);
    out.assert_code(0);
    assert_eq!(sorted(out.lines()), ["rank 0 found v1", "rank 1 leaves"], "{out}");
}

#[test]
fn open_mpi_connect_and_accept_through_the_name_service() {
    // Open MPI exchanges its side of a connection through publish and a lookup that waits
    // for the other side's: on one node and across two.
    for options in [vec![], fake_nodes(2, 1)] {
        let out = mpi_run(&options, 2, CProgram::OmpiConnect, &["ompi-connect"]).run();
        out.assert_code(0);
        assert_eq!(sorted(out.lines()), ["accepted 42", "connected 43"], "{out}");
        out.tag.wait_until_none(Duration::from_secs(5)).unwrap_or_else(|left| {
            panic!("left running after connect/accept: {left:?}");
        });
    }
}

#[test]
fn a_pmix_fence_larger_than_a_frame_goes_through_the_tree_in_parts() {
    // Four nodes of 20 MiB each, 80 MiB in all, more than a control frame carries (64 MiB):
    // each node's data goes up in parts, past n1 (an interior proxy with data of its own and
    // two children's), and every node's comes down whole. libpmix's shared-memory store
    // takes no more than 24 MiB or so per job; its hash store has no such limit.
    let options = [fake_nodes(4, 1), vec!["--tree-width".into(), "2".into()]].concat();
    let bytes = (20 << 20).to_string();
    let out =
        mpi_run(&options, 4, CProgram::Fence, &[&bytes, "-"]).env("PMIX_MCA_gds", "hash").run();
    out.assert_code(0);
    let want = (0..4).flat_map(|r| [format!("ready {r}"), format!("rank {r} has 3 blobs")]);
    assert_eq!(sorted(out.lines()), sorted(want), "{out}");
}

#[test]
fn fake_nodes_of_one_machine_tell_open_mpi_they_share_its_cpus() {
    // Each fake node runs no more ranks than the machine has CPUs; together they do.
    let cpus = std::thread::available_parallelism().unwrap().get();
    let said = |per: usize, nodes: usize| {
        let run = Run::new(&[]).args(fake_nodes(nodes, per as u32));
        let run = run.args(["-n", &(per * nodes).to_string(), "sh", "-c"]);
        let out = run.arg("echo ${OMPI_MCA_mpi_oversubscribe-no}").timeout(MPI_LIMIT).run();
        out.assert_code(0);
        out.lines()
    };
    assert_eq!(said(1, cpus), vec!["no"; cpus], "one rank a CPU");
    assert_eq!(said(cpus, 2), vec!["1"; 2 * cpus], "twice as many ranks as CPUs");
}

/// Where Debian's `scalapack-mpi-test` keeps its Open MPI testers.
const SCALAPACK_TESTS: &str = "/usr/lib/x86_64-linux-gnu/scalapack/openmpi-tests";

/// The testers' input: Debian's own files (`LU.dat`, `QR.dat` beside the testers) cut to two
/// problem sizes, one blocking and the two grids of 4 processes (2x2, 1x4). Those prove one
/// world as well as Debian's 240 solves do, and are what keeps the test off the machine's
/// load: 4 oversubscribed Open MPI ranks pass small messages, each hop a wait for the
/// scheduler, and Debian's input took 1.2-3.2 s beside two busy loops but past 60 s with the
/// rest of the suite beside them too (docs/reliability.md, "The suite under load").
const SCALAPACK_INPUT: [(&str, &str); 2] = [
    (
        "LU.dat",
        "'SCALAPACK, LU factorization input file'\n'MPI Machine'\n'LU.out' output file\n\
         6 device out\n2 problem sizes\n17 31 M\n13 50 N\n1 NBs\n3 NB\n1 NRHSs\n3 NRHS\n\
         1 NBRHSs\n3 NBRHS\n2 process grids\n2 1 P\n2 4 Q\n1.0 threshold\n\
         T test condition estimation and iterative refinement\n",
    ),
    (
        "QR.dat",
        "'ScaLAPACK, Orthogonal factorizations input file'\n'MPI machine'\n'QR.out' output file\n\
         6 device out\n6 factorizations\n'QR' 'QL' 'LQ' 'RQ' 'QP' 'TZ'\n2 problem sizes\n\
         13 26 M\n17 20 N\n1 blocking sizes\n5 MB\n3 NB\n2 process grids\n2 1 P\n2 4 Q\n\
         5.0 threshold\n",
    ),
];

#[test]
fn scalapack_testers_built_with_open_mpi_run_on_every_rank_of_one_grid() {
    // Each tester links libscalapack-openmpi.so, and only that library links libmpi: the
    // testers themselves look like plain programs. Run as singletons, each rank prints
    // "ILLEGAL GRID" for every grid of its input and skips those tests.
    let testers = std::path::Path::new(SCALAPACK_TESTS);
    assert!(
        testers.join("xdlu").is_file(),
        "error: {SCALAPACK_TESTS}/xdlu is missing: install Debian's scalapack-mpi-test (./test.sh does)"
    );
    let dir = rlaunch_tests::tempdir();
    for (file, text) in SCALAPACK_INPUT {
        std::fs::write(dir.path().join(file), text).unwrap();
    }
    // Two fake nodes of 2 ranks each are 4 ranks on this machine's 2 CPUs: Open MPI must be
    // told it is oversubscribed, or it polls without yielding.
    let fake = fake_nodes(2, 2);
    for (tester, passed, skipped) in [("xdlu", 4, 0), ("xdqr", 22, 2)] {
        for nodes in [vec![], fake.clone()] {
            let out = Run::new(&[]).args(&nodes).args(["-n", "4"]).arg(testers.join(tester));
            let out = out.current_dir(dir.path()).timeout(MPI_LIMIT).run();
            out.assert_code(0);
            let summary: Vec<String> = out
                .lines()
                .into_iter()
                .filter(|l| l.trim_start().split(' ').nth(1) == Some("tests"))
                .collect();
            let want = [
                format!("{passed} tests completed and passed residual checks."),
                "0 tests completed and failed residual checks.".to_string(),
                format!("{skipped} tests skipped because of illegal input values."),
            ];
            let summary: Vec<&str> = summary.iter().map(|l| l.trim()).collect();
            assert_eq!(summary, want, "{tester} on {nodes:?}, one summary for one world: {out}");
            assert!(!out.lines().iter().any(|l| l.contains("ILLEGAL GRID")), "{out}");
        }
    }
}
