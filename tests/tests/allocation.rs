//! Hosts from a batch scheduler's allocation (`--rmk`): the real rlaunch reads the variables
//! and files Slurm, Grid Engine, PBS and LSF give a job, places the ranks as they say, and
//! names the culprit when they are wrong. The proxies start by fork here (`--launcher fork`,
//! fake nodes); starting them through the scheduler is tested against a real Slurm.

use rlaunch_tests::output::{envs_by_rank, rlaunch_lines, sorted};
use rlaunch_tests::{fake_scheduler_launchers, rankprog_str, tempdir, Outcome, Run};

/// rlaunch with `options`, then `-l rankprog env`, in an environment holding `vars` (and
/// none of the schedulers' variables of the machine running the tests).
fn run_in_allocation(vars: &[(&str, &str)], options: &[&str]) -> Outcome {
    let mut run = Run::new(&["--launcher", "fork"]);
    for var in [
        "SLURM_JOB_NODELIST",
        "SLURM_NODELIST",
        "SLURM_TASKS_PER_NODE",
        "SLURM_JOB_CPUS_PER_NODE",
        "PE_HOSTFILE",
        "PBS_NODEFILE",
        "LSB_MCPU_HOSTS",
        "LSB_DJOB_HOSTFILE",
    ] {
        run = run.env_remove(var);
    }
    for (k, v) in vars {
        run = run.env(k, v);
    }
    run.args(options).args(["-l", &rankprog_str(), "env"]).run()
}

/// The host each rank was placed on, in rank order.
fn placement(out: &Outcome) -> Vec<String> {
    out.assert_code(0);
    let envs = envs_by_rank(&out.lines());
    envs.values().map(|env| env["MPIR_CVAR_CH3_INTERFACE_HOSTNAME"].clone()).collect()
}

const SLURM: [(&str, &str); 2] =
    [("SLURM_JOB_NODELIST", "n[1-3]"), ("SLURM_TASKS_PER_NODE", "2(x2),1")];

#[test]
fn a_slurm_allocation_places_its_tasks_per_node() {
    let out = run_in_allocation(&SLURM, &["--rmk", "slurm"]);
    assert_eq!(placement(&out), ["n1", "n1", "n2", "n2", "n3"]);
    assert_eq!(out.stderr_str(), "", "{out}");
    // -n within the allocation fills it in order; --map-by node deals round-robin.
    let out = run_in_allocation(&SLURM, &["--rmk", "slurm", "-n", "3"]);
    assert_eq!(placement(&out), ["n1", "n1", "n2"]);
    let out = run_in_allocation(&SLURM, &["-rmk", "slurm", "--map-by", "node", "-n", "4"]);
    assert_eq!(placement(&out), ["n1", "n2", "n3", "n1"]);
}

#[test]
fn more_ranks_than_slots_wrap_around_with_a_notice() {
    let out = run_in_allocation(&SLURM, &["--rmk", "slurm", "-n", "7"]);
    assert_eq!(placement(&out), ["n1", "n1", "n2", "n2", "n3", "n1", "n1"]);
    let err = out.stderr_str();
    assert_eq!(
        rlaunch_lines(&err),
        ["rlaunch: note: 7 ranks on the 5 slots of the Slurm allocation: placement wraps around"]
    );
}

#[test]
fn hosts_on_the_command_line_win_over_the_allocation() {
    let out = run_in_allocation(&SLURM, &["--rmk", "slurm", "--hosts", "a:2"]);
    assert_eq!(placement(&out), ["a", "a"]);
    let out = run_in_allocation(&SLURM, &["--rmk", "none"]);
    assert_eq!(placement(&out).len(), 1, "no allocation: one rank here");
}

#[test]
fn grid_engine_pbs_and_lsf_allocations_are_read() {
    let dir = tempdir();
    let pe = dir.path().join("pe_hostfile");
    std::fs::write(&pe, "n1 2 all.q@n1 UNDEFINED\nn2 1 all.q@n2 UNDEFINED\n").unwrap();
    let out = run_in_allocation(&[("PE_HOSTFILE", pe.to_str().unwrap())], &["--rmk", "sge"]);
    assert_eq!(placement(&out), ["n1", "n1", "n2"]);

    let nodes = dir.path().join("nodefile");
    std::fs::write(&nodes, "n2\nn2\nn1\n").unwrap();
    let out = run_in_allocation(&[("PBS_NODEFILE", nodes.to_str().unwrap())], &["--rmk", "pbs"]);
    assert_eq!(placement(&out), ["n2", "n2", "n1"]);

    let out = run_in_allocation(&[("LSB_MCPU_HOSTS", "h1 1 h2 2")], &["--rmk", "lsf"]);
    assert_eq!(placement(&out), ["h1", "h2", "h2"]);
    let lsf = [("LSB_DJOB_HOSTFILE", nodes.to_str().unwrap())];
    let out = run_in_allocation(&lsf, &["--rmk", "lsf"]);
    assert_eq!(placement(&out), ["n2", "n2", "n1"]);
}

/// A usage error: exit 2, and one line that is exactly `line`.
fn refused(out: &Outcome, line: &str) {
    out.assert_code(2);
    assert_eq!(out.stderr_str(), format!("rlaunch: {line}\n"), "{out}");
}

#[test]
fn a_missing_or_malformed_allocation_is_named_in_one_line() {
    let out = run_in_allocation(&[], &["--rmk", "slurm"]);
    refused(&out, "--rmk slurm: SLURM_JOB_NODELIST is not set: no Slurm allocation here");
    let bad = [("SLURM_JOB_NODELIST", "n[1-3"), ("SLURM_TASKS_PER_NODE", "1")];
    refused(
        &run_in_allocation(&bad, &["--rmk", "slurm"]),
        "SLURM_JOB_NODELIST n[1-3: unclosed '['",
    );
    let bad = [("SLURM_JOB_NODELIST", "n[1-3]"), ("SLURM_TASKS_PER_NODE", "2(x2)")];
    refused(
        &run_in_allocation(&bad, &["--rmk", "slurm"]),
        "SLURM_TASKS_PER_NODE gives 2 counts, but SLURM_JOB_NODELIST names 3 hosts",
    );
    let huge = [("SLURM_JOB_NODELIST", "n[1-99999999999]"), ("SLURM_TASKS_PER_NODE", "1")];
    refused(
        &run_in_allocation(&huge, &["--rmk", "slurm"]),
        "SLURM_JOB_NODELIST n[1-99999999999]: more than 1048576 hosts",
    );

    let dir = tempdir();
    let pe = dir.path().join("pe_hostfile");
    std::fs::write(&pe, "n1 2 q UNDEFINED\nn2 many q UNDEFINED\n").unwrap();
    let out = run_in_allocation(&[("PE_HOSTFILE", pe.to_str().unwrap())], &["--rmk", "sge"]);
    refused(&out, &format!("{}:2: bad slot count 'many'", pe.display()));
    let out = run_in_allocation(&[("PBS_NODEFILE", "/nonexistent/nodes")], &["--rmk", "pbs"]);
    refused(&out, "cannot read PBS_NODEFILE /nonexistent/nodes: No such file or directory");
    refused(
        &run_in_allocation(&[], &["--rmk", "moab"]),
        "--rmk moab: expected slurm, sge, pbs, lsf or none",
    );
}

#[test]
fn inside_slurm_rlaunch_finds_the_allocation_and_says_where_it_cannot_listen() {
    // No --rmk, no --launcher: Slurm's variables are found, and srun's proxies would dial
    // back; a first node that does not resolve leaves rlaunch nowhere to listen.
    let vars = [
        ("SLURM_JOB_ID", "1"),
        ("SLURM_JOB_NODELIST", "rl-nosuchnode[1-2]"),
        ("SLURM_TASKS_PER_NODE", "1(x2)"),
    ];
    let mut run = Run::new(&["true"]);
    for (k, v) in vars {
        run = run.env(k, v);
    }
    let out = run.run();
    out.assert_code(255);
    let err = out.stderr_str();
    assert!(
        err.starts_with(
            "rlaunch: cannot find the address that reaches rl-nosuchnode1 to listen on for its \
             proxy ("
        ) && err.ends_with("); give --bind-address\n")
            && err.lines().count() == 1,
        "{out}"
    );
    // --rmk none: the allocation is not used, and the job runs here.
    let mut run = Run::new(&["--rmk", "none", "true"]);
    for (k, v) in vars {
        run = run.env(k, v);
    }
    run.run().assert_code(0);
}

/// rlaunch with no host or launcher options, in an environment holding `vars`, with the
/// fake `qrsh` and `blaunch` first on PATH; returns the placement and the launcher calls.
fn detected(vars: &[(&str, &str)]) -> (Vec<String>, Vec<String>) {
    let dir = tempdir();
    let log = dir.path().join("launches");
    let path = format!("{}:{}", fake_scheduler_launchers(), std::env::var("PATH").unwrap());
    let mut run =
        Run::new(&["-l", &rankprog_str(), "env"]).env("PATH", path).env("FAKE_LAUNCH_LOG", &log);
    for (k, v) in vars {
        run = run.env(k, v);
    }
    let out = run.run();
    let calls = std::fs::read_to_string(&log).unwrap_or_default();
    (placement(&out), sorted(calls.lines().map(String::from)))
}

#[test]
fn grid_engine_and_lsf_jobs_start_their_proxies_with_qrsh_and_blaunch() {
    let dir = tempdir();
    let pe = dir.path().join("pe_hostfile");
    std::fs::write(&pe, "n1 2 all.q@n1 UNDEFINED\nn2 1 all.q@n2 UNDEFINED\n").unwrap();
    let (hosts, calls) = detected(&[("JOB_ID", "11"), ("PE_HOSTFILE", pe.to_str().unwrap())]);
    assert_eq!(hosts, ["n1", "n1", "n2"]);
    assert_eq!(calls, ["qrsh -inherit n1", "qrsh -inherit n2"]);

    let (hosts, calls) = detected(&[("LSB_JOBID", "12"), ("LSB_MCPU_HOSTS", "h1 1 h2 2")]);
    assert_eq!(hosts, ["h1", "h2", "h2"]);
    assert_eq!(calls, ["blaunch h1", "blaunch h2"]);
}

#[test]
fn a_pbs_job_starts_its_proxies_over_ssh() {
    // pbsdsh passes no stdin to its tasks, so PBS keeps ssh (here tests/scripts/fakessh,
    // first on PATH as `ssh`).
    let dir = tempdir();
    let nodes = dir.path().join("nodefile");
    std::fs::write(&nodes, "p1\np1\np2\n").unwrap();
    let (hosts, calls) =
        detected(&[("PBS_JOBID", "13"), ("PBS_NODEFILE", nodes.to_str().unwrap())]);
    assert_eq!(hosts, ["p1", "p1", "p2"]);
    assert!(calls.is_empty(), "neither qrsh nor blaunch: {calls:?}");
}

#[test]
fn qrsh_is_found_where_grid_engine_says_its_binaries_are() {
    // A standard Grid Engine install keeps qrsh in $SGE_ROOT/bin/<arch>, off the job's PATH;
    // jobs get SGE_BINARY_PATH. Here PATH has only a shell (Debian's /usr/bin has a qrsh).
    let dir = tempdir();
    let bin = dir.path().join("bin");
    std::fs::create_dir(&bin).unwrap();
    std::os::unix::fs::symlink("/bin/sh", bin.join("sh")).unwrap();
    let pe = dir.path().join("pe_hostfile");
    std::fs::write(&pe, "n1 1 all.q@n1 UNDEFINED\n").unwrap();
    let log = dir.path().join("launches");
    let job = |sge_bin: Option<String>| {
        let mut run = Run::new(&["-l", &rankprog_str(), "env"])
            .env("PATH", &bin)
            .env("FAKE_LAUNCH_LOG", &log)
            .env("JOB_ID", "11")
            .env("PE_HOSTFILE", &pe)
            .env_remove("SGE_BINARY_PATH");
        if let Some(dir) = sge_bin {
            run = run.env("SGE_BINARY_PATH", dir);
        }
        run.run()
    };
    let out = job(Some(fake_scheduler_launchers()));
    assert_eq!(placement(&out), ["n1"]);
    assert_eq!(std::fs::read_to_string(&log).unwrap(), "qrsh -inherit n1\n");
    // Nowhere to be found: the line names the program.
    let out = job(None);
    out.assert_code(255);
    assert_eq!(
        rlaunch_lines(&out.stderr_str()),
        ["rlaunch: lost proxy on n1 (cannot start its launcher: qrsh: No such file or \
             directory (os error 2))"],
        "{out}"
    );
}
