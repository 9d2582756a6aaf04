//! rlaunch's exit statuses: the one table that the code, `--help` ([`crate::help`]) and the
//! README's "Exit status" section all follow (a test below holds the README to it).
//!
//! When the job fails, the first thing that went wrong decides the status: a failing rank
//! passes its own code on (or 128 + its signal, as a shell does), everything else has a
//! status of its own.

/// Every rank exited with code 0.
pub const SUCCESS: i32 = 0;
/// A bad command line: rlaunch started nothing.
pub const USAGE: i32 = 2;
/// `--timeout` expired and the job was killed.
pub const TIMED_OUT: i32 = 124;
/// A program could not be started: not executable (or its directory is missing).
pub const NOT_EXECUTABLE: i32 = 126;
/// A program could not be started: not found.
pub const NOT_FOUND: i32 = 127;
/// Added to the number of the signal that killed the first failing rank.
pub const SIGNALED: i32 = 128;
/// A second Ctrl-C killed the job (128 + SIGINT).
pub const INTERRUPTED: i32 = SIGNALED + 2;
/// rlaunch's stdout was closed, so the job ended quietly.
pub const STDOUT_CLOSED: i32 = 141;
/// A proxy or node was lost, a rank broke the PMI protocol or started Open MPI alone without
/// PMIx, an output file could not be written, or rlaunch itself could not run the job.
pub const FAILURE: i32 = 255;

/// The status a rank's end passes on when it decides the job's: its own code, 128 + its
/// signal, or the shell's 127 (not found) / 126 (not executable) when it never ran. A node
/// out of processes, descriptors or memory is no fault of the program: 255.
pub fn of_outcome(outcome: rlaunch_protocol::ids::ExitOutcome) -> i32 {
    use nix::libc::{EAGAIN, EMFILE, ENFILE, ENOENT, ENOMEM};
    use rlaunch_protocol::ids::ExitOutcome;
    match outcome {
        ExitOutcome::Exited(code) => code,
        ExitOutcome::Signaled(sig) => SIGNALED + sig,
        ExitOutcome::SpawnFailed { errno } if errno == ENOENT => NOT_FOUND,
        ExitOutcome::SpawnFailed { errno } if [EMFILE, ENFILE, EAGAIN, ENOMEM].contains(&errno) => {
            FAILURE
        }
        ExitOutcome::SpawnFailed { .. } | ExitOutcome::NoWorkdir { .. } => NOT_EXECUTABLE,
    }
}

/// One row of the table: a status, or a family of them, and what it means.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Row {
    /// As the README writes it: `0`, `N`, `128+S`, `126 / 127`.
    pub status: &'static str,
    /// One sentence fragment; markdown code spans (`--timeout`) are allowed.
    pub meaning: &'static str,
}

const fn row(status: &'static str, meaning: &'static str) -> Row {
    Row { status, meaning }
}

/// Every status rlaunch can end with, in the order the README and `--help` list them.
pub const TABLE: &[Row] = &[
    row("0", "every rank exited with code 0"),
    row("N", "the first failing rank exited with code N"),
    row(
        "128+S",
        "the first failing rank was killed by signal S, or rlaunch was (130 after Ctrl-C)",
    ),
    row("124", "`--timeout` / `MPIEXEC_TIMEOUT` expired"),
    row("126 / 127", "a program could not be started (not executable / not found)"),
    row("141", "rlaunch's stdout was closed"),
    row(
        "255",
        "a proxy or node was lost or could not fit its ranks (GPUs, ppr), a rank broke the \
         PMI protocol or started Open MPI alone without PMIx, a worker reported an error to the rabit tracker or ended before it \
         connected while others waited, an output file could not be written, or rlaunch itself \
         could not run the job",
    ),
    row("2", "bad command line"),
];

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_rank_passes_its_end_on_as_a_shell_would() {
        use rlaunch_protocol::ids::ExitOutcome;
        assert_eq!(of_outcome(ExitOutcome::Exited(7)), 7);
        assert_eq!(of_outcome(ExitOutcome::Signaled(11)), 139);
        assert_eq!(of_outcome(ExitOutcome::SpawnFailed { errno: 2 }), NOT_FOUND);
        assert_eq!(of_outcome(ExitOutcome::SpawnFailed { errno: 13 }), NOT_EXECUTABLE);
        assert_eq!(of_outcome(ExitOutcome::NoWorkdir { errno: 2 }), NOT_EXECUTABLE);
        assert_eq!(of_outcome(ExitOutcome::SpawnFailed { errno: nix::libc::EMFILE }), FAILURE);
    }

    /// The table as the README writes it.
    fn markdown() -> String {
        let mut out = String::from("| status | meaning |\n|---|---|\n");
        for row in TABLE {
            out.push_str(&format!("| {} | {} |\n", row.status, row.meaning));
        }
        out
    }

    #[test]
    fn the_readme_lists_exactly_this_table() {
        let readme = include_str!("../../../README.md");
        let section = readme.split_once("\n### Exit status\n\n").expect("README has the section").1;
        let table = match section.split_once("\n\n") {
            Some((table, _)) => format!("{table}\n"),
            None => section.to_string(),
        };
        assert_eq!(table, markdown(), "README.md's exit status table differs from exit::TABLE");
    }

    #[test]
    fn every_fixed_status_has_its_row() {
        let listed = |code: i32| {
            TABLE.iter().any(|row| row.status.split(" / ").any(|s| s == code.to_string()))
        };
        for code in [SUCCESS, USAGE, TIMED_OUT, NOT_EXECUTABLE, NOT_FOUND, STDOUT_CLOSED, FAILURE] {
            assert!(listed(code), "no row for exit status {code}");
        }
        use nix::sys::signal::Signal;
        assert_eq!(INTERRUPTED, SIGNALED + Signal::SIGINT as i32);
        assert_eq!(STDOUT_CLOSED, SIGNALED + Signal::SIGPIPE as i32);
        assert!(TABLE.iter().any(|row| row.meaning.contains(&format!("{INTERRUPTED} after"))));
    }
}
