//! A job that hangs says where, at its timeout (docs/hangs.md): the ranks missing from the
//! fence the others wait in, by rank, pid and host, and each rank's process state. Real MPICH
//! (PMI-1) and Open MPI (PMIx) programs, one rank of which never calls MPI_Init.

use std::collections::HashMap;

use rlaunch_tests::hosts::hostname;
use rlaunch_tests::mpi::{fake_nodes, mpi_run, CProgram};
use rlaunch_tests::output::rlaunch_lines;
use rlaunch_tests::Outcome;

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
    let out = hang(&[], 4, CProgram::Hang, 3);
    let (report, pid) = (report_of(&out), pids(&out)[&3]);
    assert_eq!(
        report[0],
        format!("fence 1 (PMI): 3 of 4 ranks waiting; missing: rank 3 (pid {pid} on {host})")
    );
    // Waiting in a fence is a blocking read, and the late rank pauses.
    assert!(report[1].starts_with("ranks: 0-3 sleeping"), "{out}");
    assert_eq!(report.len(), 2, "{out}");

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
