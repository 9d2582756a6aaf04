//! Harness for rlaunch's integration tests (`tests/tests/`: one binary with a module per
//! topic, `main.rs`, and the chaos and under-load suites apart): they run the real, built
//! binaries with `rankprog` as the rank program, and never leak a process.
//!
//! ```text
//!   test ──Run / Job──► rlaunch ──► rlaunch-proxy ──► rankprog (ranks)
//!    ▲                     │ RLAUNCH_TEST_TAG=<unique> travels in every environment,
//!    └── stdout lines, ────┘ so /proc finds (and Drop kills) whatever the run started
//!        exit status
//! ```
//!
//! * [`Run`] builds one run of `rlaunch` (or of any program) with its arguments, environment,
//!   stdin and timeout; [`Run::run`] returns an [`Outcome`], [`Run::spawn`] a live [`Job`].
//!   A test synchronizes on lines (`rankprog ... ready ...` and [`Job::wait_for_ready`]),
//!   never on sleeps.
//! * [`Tag`] marks a run's processes; [`tagged_processes`] and [`wait_until_no_tagged`] find
//!   them, so a test can check that nothing outlives the launcher. When the `Job` or `Outcome`
//!   holding a tag drops, every process still carrying it is SIGKILLed.
//! * [`rlaunch`], [`proxy`], [`rankprog`] and [`pmiprog`] find the built binaries next to the
//!   test executable, in the target directory of the running profile; [`fakessh`] and
//!   [`spawn_client`] find the scripts of `tests/scripts/`. `cargo test -p rlaunch-tests`
//!   builds `rankprog` but not `rlaunch`: run `cargo build --workspace` first.
//! * [`hosts`] names the hosts ranks run on: this machine ([`hosts::hostname`]) and lists of
//!   fake nodes `n1,n2,...` that `--launcher fork` starts as proxies of their own here
//!   ([`hosts::waiting_fake_node_job`] starts ranks there that wait).
//! * [`output`] reads what a run printed: the ranks' `-l` lines by rank, their environments,
//!   rlaunch's own lines; [`output::sorted`] puts lines that ranks printed side by side in order.
//! * [`procfs`] reads what `/proc` says of a process that is not the test's child (a proxy, a
//!   rank): its command name, state, parent and resident size.
//! * [`mpi`] compiles the MPI and PMI-2 programs of `tests/c/` and checks what they print.
//! * [`slurm`] brings up a real Slurm cluster of fake nodes (`tests/cluster/slurm.sh`; needs
//!   root) and runs Slurm's clients against it; [`sge`] a real Grid Engine cluster
//!   (`tests/cluster/sge.sh`).
//! * [`check_flood`] checks the output of `rankprog flood`, [`fnv1a64`] the answer of
//!   `rankprog stdin-sum`, [`tempdir`] gives a directory removed on drop.
//!
//! `rankprog`'s script language is documented in `src/bin/rankprog.rs`, `pmiprog`'s in
//! `src/bin/pmiprog.rs`.
//!
//! The tests, a file a topic: `launch` (the ranks' environment, placement, the proxy tree),
//! `output_relay` (stdout and stderr on their way to rlaunch's), `output_files` (prefixes and
//! output files), `stdin`, `exit_status` (failures, timeouts), `signals`, `lost_proxies`,
//! `chaos` (random faults, each checked), `under_load` (a loaded machine), `cli` (the
//! drop-in command line), `bad_input` (the catalogue of bad input), `allocation` (schedulers'
//! host lists), `binding`, `gpus` (GPUs and `--map-by` on fake machines), `fakessh` (the ssh
//! bootstrap, with a fake ssh), `multihost` (real ssh between network namespaces; needs
//! root), `slurm` (a real Slurm cluster of fake nodes; needs root), `sge` (a real Grid Engine
//! cluster of fake nodes; needs root), `mpich`,
//! `openmpi`, `pmix_server` (each node's PMIx server as Open MPI programs meet it), `pmi`,
//! `spawn`, `report`, `timeline` and `progress` (what rlaunch says of a
//! job), `frameworks` (PyTorch, JAX, and XGBoost with rlaunch as its tracker), and `rankprog`
//! (the helper itself).
//!
//! ```no_run
//! use rlaunch_tests::{rankprog_str, Run};
//!
//! let out = Run::new(&["-n", "2", &rankprog_str(), "@1", "exit", "3"]).run();
//! out.assert_code(3);
//! ```

pub mod cluster;
mod flood;
pub mod hosts;
pub mod mpi;
pub mod output;
pub mod procfs;
mod procs;
mod programs;
mod run;
mod scheduler;
pub mod sge;
pub mod slurm;
mod tempdir;

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{SystemTime, UNIX_EPOCH};

pub use flood::{
    check_flood, check_ragged, flood_line, flood_lines, ragged_line, scan_flood, scan_flood_stream,
    scan_flood_stream_with, FloodReport, FloodScanner, FLOOD_LINE_LEN,
};
pub use procs::{
    tagged_processes, wait_until_empty, wait_until_no_tagged, wait_until_tagged, Tag,
    TaggedProcess, TAG_VAR,
};
pub use programs::{
    chaos, chaosrank, fake_scheduler_launchers, fakessh, jax_job, mpi4py_hang, pmiprog,
    pmiprog_str, proxy, proxy_str, python_hang, rankprog, rankprog_str, rlaunch,
    rlaunch_without_pmix, spawn_client, torch_job, venv_python, xgboost_job,
};
pub use run::{Job, Outcome, Run, DEFAULT_TIMEOUT};
pub use tempdir::{tempdir, TempDir};

/// FNV-1a, 64 bits: the hash `rankprog stdin-sum` prints.
pub fn fnv1a64(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |hash, &b| {
        (hash ^ u64::from(b)).wrapping_mul(0x0000_0100_0000_01b3)
    })
}

/// The line `rankprog stdin-sum` prints after reading `input`, newline included.
pub fn stdin_sum_line(input: &[u8]) -> String {
    format!("stdin {} {:016x}\n", input.len(), fnv1a64(input))
}

/// A name no other run, test process or earlier test run uses: pid, counter, clock.
fn unique_id() -> String {
    // A process-wide counter: the one piece of shared state the harness needs, since tests
    // run on parallel threads and must not share tags or directories.
    static NEXT: AtomicU64 = AtomicU64::new(0);
    let n = NEXT.fetch_add(1, Ordering::Relaxed);
    let nanos = SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_nanos());
    format!("{}-{n}-{nanos}", std::process::id())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fnv_matches_known_values() {
        assert_eq!(fnv1a64(b""), 0xcbf2_9ce4_8422_2325);
        assert_eq!(fnv1a64(b"a"), 0xaf63_dc4c_8601_ec8c);
        assert_eq!(stdin_sum_line(b"abc"), "stdin 3 e71fa2190541574b\n");
    }

    #[test]
    fn unique_ids_differ() {
        assert_ne!(unique_id(), unique_id());
    }
}
