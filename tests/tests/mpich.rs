//! Real MPI programs (Debian's MPICH, which speaks PMI-1) under rlaunch: wire-up on one node
//! and on fake nodes, point-to-point traffic, `MPI_Abort`, the name service, `--pmi-port`.
//! The programs are the C sources in `tests/c/`, compiled with `mpicc.mpich` on first use.
//!
//! Every test checks what the ranks report (size, rank, sums), not only exit codes: with a
//! broken PMI, MPICH starts N singletons of size 1 that all exit 0.

use rlaunch_tests::hosts::hostname;
use rlaunch_tests::mpi::{check_abort, check_hello, fake_nodes, mpi_run, CProgram, MPI_LIMIT};
use rlaunch_tests::output::sorted;
use rlaunch_tests::{rankprog_str, Run};

#[test]
fn hello_allreduce_on_one_node() {
    let out = mpi_run(&[], 4, CProgram::Hello, &["4"]).run();
    check_hello(&out, 4);
}

#[test]
fn hello_allreduce_on_four_fake_nodes() {
    let out = mpi_run(&fake_nodes(4, 4), 16, CProgram::Hello, &["16"]).run();
    check_hello(&out, 16);
}

#[test]
fn hello_allreduce_with_32_ranks_on_eight_fake_nodes() {
    // Oversubscribed MPICH spins in its shared-memory barrier; skipping the node-local path
    // and hwloc's PCI scan keeps 32 ranks on 2 cores fast (see notes/bench.md). Without the
    // shm path every rank fetches every business card through the PMI server.
    let out = mpi_run(&fake_nodes(8, 4), 32, CProgram::Hello, &["32"])
        .env("MPIR_CVAR_NOLOCAL", "1")
        .env("HWLOC_COMPONENTS", "-pci,-linuxio")
        .run();
    check_hello(&out, 32);
}

#[test]
fn a_token_goes_around_a_ring_of_eight() {
    let out = mpi_run(&[], 8, CProgram::Ring, &[]).run();
    out.assert_code(0);
    let lines = sorted(out.lines());
    let want = sorted(
        (0..8)
            .map(|r| format!("ring {r} got {}", if r == 0 { 8 } else { r }))
            .chain(["ring done size 8 token 8".to_string()]),
    );
    assert_eq!(lines, want, "{out}");
}

#[test]
fn mpi_abort_ends_the_job_with_its_code_and_names_the_rank() {
    // On one node, and with rank 1 on the first of two fake nodes whose proxies form a chain.
    let chain = [fake_nodes(2, 2), vec!["--tree-width".into(), "1".into()]].concat();
    for (options, host) in [(vec![], hostname()), (chain, "n1".to_string())] {
        let out = mpi_run(&options, 4, CProgram::Abort, &[]).run();
        check_abort(&out, &host);
    }
}

#[test]
fn publish_and_lookup_a_name_between_two_ranks() {
    let port = "rlaunch-test-port#tag=1;x";
    let out = mpi_run(&[], 2, CProgram::Publish, &["rlaunch-test-service", port]).run();
    out.assert_code(0);
    let lines = sorted(out.lines());
    assert_eq!(
        lines,
        [
            "gone rlaunch-test-service".to_string(),
            format!("lookup rlaunch-test-service = {port}"),
            "published rlaunch-test-service".to_string(),
            "unpublished rlaunch-test-service".to_string(),
        ],
        "{out}"
    );
}

#[test]
fn publish_and_lookup_across_fake_nodes() {
    // Ranks 0 and 1 on different proxies: the name table is the launcher's, not a node's.
    let out =
        mpi_run(&fake_nodes(2, 1), 2, CProgram::Publish, &["svc-across", "port-across"]).run();
    out.assert_code(0);
    assert!(out.stdout_str().contains("lookup svc-across = port-across\n"), "{out}");
    assert!(out.stdout_str().contains("gone svc-across\n"), "{out}");
}

#[test]
fn pmi_port_mode_runs_the_hello() {
    // First make sure the mode is really in use: ranks get PMI_PORT and PMI_ID, no PMI_FD.
    let out = Run::new(&["--pmi-port", "-n", "1", &rankprog_str(), "env"]).run();
    out.assert_code(0);
    let text = out.stdout_str();
    assert!(text.lines().any(|l| l.starts_with("PMI_PORT=127.0.0.1:")), "{out}");
    assert!(text.lines().any(|l| l == "PMI_ID=0"), "{out}");
    assert!(!text.lines().any(|l| l.starts_with("PMI_FD=")), "{out}");

    let out = mpi_run(&["--pmi-port".into()], 4, CProgram::Hello, &["4"]).run();
    check_hello(&out, 4);
    let out = mpi_run(
        &[
            "--pmi-port".into(),
            "--launcher".into(),
            "fork".into(),
            "--hosts".into(),
            "a:2,b:2".into(),
        ],
        4,
        CProgram::Hello,
        &["4"],
    )
    .run();
    check_hello(&out, 4);
}

#[test]
fn mpmd_segments_share_one_world_and_see_their_appnum() {
    let prog = CProgram::Appnum.path_str();
    let out = Run::new(&["--launcher", "fork", "--hosts", "n1:2,n2:2"])
        .args(["-n", "1", &prog, "master", ":", "-n", "3", &prog, "worker"])
        .timeout(MPI_LIMIT)
        .run();
    out.assert_code(0);
    let seen = sorted(out.lines());
    let want: Vec<String> = (0..4)
        .map(|r| {
            let (appnum, role) = if r == 0 { (0, "master") } else { (1, "worker") };
            format!("rank {r} size 4 count 4 appnum {appnum} role {role}")
        })
        .collect();
    assert_eq!(seen, want, "{out}");
}
