//! Frameworks under rlaunch with no wrapper: Debian's PyTorch (`python3-torch`, CPU, gloo)
//! runs `init_process_group("gloo")` with the default `env://` from the variables every rank
//! gets (torchrun's contract), computing something checked: an all_reduce of the ranks' ids,
//! and a DDP training whose parameters equal a one-process run's. A rank that raises under
//! torch's `@record` is named with its exception. Debian's XGBoost 1.7 (`python3-xgboost`)
//! trains `hist` trees over 2 and 4 workers with rlaunch as its rabit tracker
//! (`--tracker rabit`): every worker ends with the same model, as good as one process's.

use std::collections::BTreeMap;
use std::time::Duration;

use rlaunch_tests::mpi::fake_nodes;
use rlaunch_tests::output::{envs_by_rank, rlaunch_lines, sorted};
use rlaunch_tests::{jax_job, rankprog_str, torch_job, venv_python, xgboost_job, Run};

/// Debian's interpreter: its `python3-torch` is not on every other Python's path.
const PYTHON: &str = "/usr/bin/python3";
const LIMIT: Duration = Duration::from_secs(120);

fn torch(options: &[String], n: u32, what: &str) -> Run {
    let n = n.to_string();
    Run::new(&[]).args(options).args(["-n", &n, PYTHON, &torch_job(), what]).timeout(LIMIT)
}

#[test]
fn all_reduce_over_gloo_on_one_machine_and_fake_nodes() {
    // (nodes, ranks): on this machine alone, then 2 and 4 fake nodes.
    for (nodes, n) in [(1, 2), (1, 4), (2, 4), (4, 4)] {
        let options = if nodes == 1 { Vec::new() } else { fake_nodes(nodes as usize, n / nodes) };
        let out = torch(&options, n, "allreduce").run();
        out.assert_code(0);
        assert_eq!(rlaunch_lines(&out.stderr_str()), Vec::<&str>::new(), "{out}");
        let per = n / nodes;
        let want: Vec<String> = (0..n)
            .map(|r| {
                let (local, group) = (r % per, r / per);
                let sum = n * (n - 1) / 2;
                format!("rank {r} of {n} local {local} of {per} group {group} of {nodes} sum {sum}")
            })
            .collect();
        assert_eq!(sorted(out.lines()), sorted(want), "{nodes} nodes: {out}");
    }
}

#[test]
fn ddp_training_over_four_fake_nodes_ends_with_the_one_process_parameters() {
    let reference = Run::program(PYTHON, &[&torch_job(), "reference"]).timeout(LIMIT).run();
    reference.assert_code(0);
    let want = reference.lines().into_iter().find(|l| l.starts_with("params ")).unwrap();
    let out = torch(&fake_nodes(4, 1), 4, "train").run();
    out.assert_code(0);
    let lines = out.lines();
    let params = lines.iter().find(|l| l.starts_with("params ")).expect("rank 0's parameters");
    // Shard gradients averaged by DDP are the whole batch's: equal to 1e-6 (printed to 1e-12).
    let values = |line: &str| -> Vec<f64> {
        line.split_whitespace().skip(1).map(|v| v.parse().unwrap()).collect()
    };
    for (got, want) in values(params).iter().zip(values(&want)) {
        assert!((got - want).abs() < 1e-6, "{params} against {want}");
    }
    // Every rank ends with the same parameters, bit for bit.
    let digests: BTreeMap<&str, &str> = lines
        .iter()
        .filter_map(|l| l.strip_prefix("digest "))
        .map(|l| l.split_once(' ').unwrap())
        .collect();
    assert_eq!(digests.len(), 4, "{out}");
    assert_eq!(digests.values().collect::<std::collections::BTreeSet<_>>().len(), 1, "{out}");
}

#[test]
fn a_rank_that_raises_under_record_is_named_with_its_exception() {
    let dir = rlaunch_tests::tempdir();
    let report = dir.path().join("report.json");
    let options = ["--report".to_string(), report.to_str().unwrap().to_string()];
    let out = torch(&options, 2, "raise").run();
    out.assert_code(1);
    let pid = out.stderr_str().lines().find_map(|l| {
        let rest = l.strip_prefix("rlaunch: rank 1 (pid ")?;
        Some(rest.split_whitespace().next()?.to_string())
    });
    let pid = pid.unwrap_or_else(|| panic!("no culprit line: {out}"));
    let host = rlaunch_tests::hosts::hostname();
    let want = format!(
        "rlaunch: rank 1 (pid {pid} on {host}) exited with code 1: ValueError: rank one cannot go on"
    );
    assert_eq!(rlaunch_lines(&out.stderr_str()), [want.as_str()], "{out}");
    let text = std::fs::read_to_string(&report).unwrap();
    let json: serde_json::Value = serde_json::from_str(&text).unwrap();
    let rank1 = &json["ranks"][1];
    assert_eq!(rank1["error"], "ValueError: rank one cannot go on", "{text}");
    let traceback = rank1["traceback"].as_str().unwrap();
    assert!(traceback.starts_with("Traceback (most recent call last)"), "{traceback}");
    assert!(traceback.contains("raise ValueError(\"rank one cannot go on\")"), "{traceback}");
    assert_eq!(json["ranks"][0]["error"], serde_json::Value::Null, "{text}");
}

#[test]
fn ctrl_c_reaches_every_torch_rank_as_keyboard_interrupt() {
    // A grace longer than a loaded machine takes to run both handlers: the test is about the
    // signal reaching every rank, not about how fast a starved one handles it.
    let mut options = fake_nodes(2, 1);
    options.extend(["--kill-grace".to_string(), "60".to_string()]);
    let mut job = torch(&options, 2, "wait").spawn();
    job.wait_for_line(|l| l.starts_with("ready "), LIMIT);
    job.wait_for_line(|l| l.starts_with("ready "), LIMIT);
    job.signal(nix::sys::signal::Signal::SIGINT);
    let out = job.wait(LIMIT);
    out.assert_code(130);
    let cleanups: Vec<String> =
        out.lines().into_iter().filter(|l| l.starts_with("cleanup ")).collect();
    assert_eq!(sorted(cleanups), ["cleanup 0", "cleanup 1"], "{out}");
    assert_eq!(rlaunch_lines(&out.stderr_str()), ["rlaunch: interrupted by SIGINT"], "{out}");
}

#[test]
fn every_rank_gets_torchruns_variables_and_a_rendezvous_of_its_own() {
    // Three ranks on two fake nodes (2 + 1): the values follow the placement, and the
    // rendezvous is this machine's loopback (the fake nodes' names resolve nowhere).
    let options = ["--launcher", "fork", "--hosts", "n1:2,n2:1", "-l", "-n", "3"];
    // Two jobs at once: each its own port.
    let env_of = || Run::new(&options).args([&rankprog_str(), "env"]).spawn();
    let (first, second) = (env_of(), env_of());
    let (first, second) = (first.wait(LIMIT), second.wait(LIMIT));
    first.assert_code(0);
    second.assert_code(0);
    let envs = envs_by_rank(&first.lines());
    let var = |rank: u32, name: &str| envs[&rank].get(name).cloned().unwrap_or_default();
    for (rank, local, local_size, group) in [(0, 0, 2, 0), (1, 1, 2, 0), (2, 0, 1, 1)] {
        let want = [
            ("RANK", rank.to_string()),
            ("WORLD_SIZE", "3".into()),
            ("LOCAL_RANK", local.to_string()),
            ("LOCAL_WORLD_SIZE", local_size.to_string()),
            ("GROUP_RANK", group.to_string()),
            ("GROUP_WORLD_SIZE", "2".into()),
            ("ROLE_RANK", rank.to_string()),
            ("ROLE_WORLD_SIZE", "3".into()),
            ("TORCHELASTIC_RESTART_COUNT", "0".into()),
            ("TORCHELASTIC_MAX_RESTARTS", "0".into()),
            ("MASTER_ADDR", "127.0.0.1".into()),
        ];
        for (name, value) in want {
            assert_eq!(var(rank, name), value, "rank {rank} {name}");
        }
        assert_eq!(var(rank, "MASTER_PORT"), var(0, "MASTER_PORT"));
        assert_eq!(var(rank, "TORCHELASTIC_RUN_ID"), var(0, "TORCHELASTIC_RUN_ID"));
        let jax =
            format!("127.0.0.1:{}", var(0, "JAX_COORDINATOR_ADDRESS").rsplit(':').next().unwrap());
        assert_eq!(var(rank, "JAX_COORDINATOR_ADDRESS"), jax);
        // The user's kept directory, a file per job and rank.
        let error_file = var(rank, "TORCHELASTIC_ERROR_FILE");
        let run_id = var(0, "TORCHELASTIC_RUN_ID");
        assert!(error_file.ends_with(&format!("/{run_id}.{rank}.json")), "{error_file}");
        assert!(error_file.contains("/rlaunch-errors."), "{error_file}");
    }
    // Variables rlaunch sets only when it serves them reach the ranks from the user's
    // environment otherwise: a tracker started beside rlaunch, a step's variables.
    let inherited = Run::new(&["-l", "-n", "2", &rankprog_str(), "env"])
        .env("DMLC_TRACKER_URI", "10.9.8.7")
        .env("DMLC_TASK_ID", "mine")
        .env("SLURM_PROCID", "5")
        .run();
    inherited.assert_code(0);
    let seen = envs_by_rank(&inherited.lines());
    for rank in 0..2 {
        assert_eq!(seen[&rank]["DMLC_TRACKER_URI"], "10.9.8.7", "{inherited}");
        assert_eq!(seen[&rank]["DMLC_TASK_ID"], "mine", "{inherited}");
        assert_eq!(seen[&rank]["SLURM_PROCID"], "5", "{inherited}");
    }
    let port: u16 = var(0, "MASTER_PORT").parse().unwrap();
    assert_ne!(port, 29500, "not torchrun's fixed port");
    let other = envs_by_rank(&second.lines());
    assert_ne!(other[&0]["MASTER_PORT"], var(0, "MASTER_PORT"), "two jobs, two ports");
}

/// Debian's XGBoost 1.7 (classic rabit), and PyPI's 3.2 (XGBoost 2.1's tracker protocol) in
/// the venv test.sh makes.
fn xgboosts() -> [(&'static str, String); 2] {
    [("1.7", PYTHON.to_string()), ("3.2", venv_python("xgboost3"))]
}

fn xgboost(python: &str, options: &[String], n: u32, what: &str) -> Run {
    let n = n.to_string();
    Run::new(&["--tracker", "rabit"])
        .args(options)
        .args(["-n", &n, python, &xgboost_job(), what])
        .timeout(LIMIT)
}

/// The tracker's rendezvous is in the report (`job.tracker`) and on the timeline (a span of
/// rlaunch's track), the same stretch of the job in both.
fn tracker_span_is_reported(report: &std::path::Path, timeline: &std::path::Path) {
    let read = |path: &std::path::Path| -> serde_json::Value {
        serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap()
    };
    let (report, timeline) = (read(report), read(timeline));
    let job = &report["job"];
    let span = &job["tracker"];
    let (start, end) = (span["start_us"].as_u64().unwrap(), span["end_us"].as_u64().unwrap());
    assert!(job["start_us"].as_u64().unwrap() <= start && start <= end, "{job}");
    assert!(end <= job["end_us"].as_u64().unwrap(), "{job}");
    assert_eq!(span["wall_s"].as_f64().unwrap(), (end - start) as f64 / 1e6, "{job}");
    let events = timeline["traceEvents"].as_array().unwrap();
    let spans: Vec<&serde_json::Value> = events.iter().filter(|e| e["cat"] == "tracker").collect();
    assert_eq!(spans.len(), 1, "{timeline}");
    let s = spans[0];
    assert_eq!(
        (&s["name"], &s["pid"], &s["tid"]),
        (&"rabit rendezvous".into(), &0.into(), &1.into())
    );
    let ts = (start - job["start_us"].as_u64().unwrap()) as f64;
    assert_eq!((s["ts"].as_f64(), s["dur"].as_f64()), (Some(ts), Some((end - start) as f64)));
}

/// Each worker's (model digest, error on the whole data set), from `model R H` and
/// `rmse R E` lines.
fn trained(lines: &[String]) -> BTreeMap<u32, (String, f64)> {
    let mut out: BTreeMap<u32, (String, f64)> = BTreeMap::new();
    for line in lines {
        let mut words = line.split_whitespace();
        let (Some(kind), Some(rank), Some(value)) = (words.next(), words.next(), words.next())
        else {
            continue;
        };
        let Ok(rank) = rank.parse() else { continue };
        let entry = out.entry(rank).or_default();
        match kind {
            "model" => entry.0 = value.to_string(),
            "rmse" => entry.1 = value.parse().unwrap(),
            _ => {}
        }
    }
    out
}

#[test]
fn xgboost_trains_over_workers_with_rlaunch_as_its_rabit_tracker() {
    for (version, python) in xgboosts() {
        let alone = Run::program(&python, &[&xgboost_job(), "alone"]).timeout(LIMIT).run();
        alone.assert_code(0);
        let alone: f64 = alone.stdout_str().trim().rsplit(' ').next().unwrap().parse().unwrap();
        // Two workers on this machine; four on four fake nodes, rank 0 first sending the
        // tracker's port garbage, which is dropped with a warning.
        for (options, n, what) in [(vec![], 2, "train"), (fake_nodes(4, 1), 4, "garbage")] {
            let dir = rlaunch_tests::tempdir();
            let (report, timeline) = (dir.path().join("r.json"), dir.path().join("t.json"));
            let mut options = options;
            for (option, path) in [("--report", &report), ("--timeline", &timeline)] {
                options.extend([option.to_string(), path.display().to_string()]);
            }
            let out = xgboost(&python, &options, n, what).env("RLAUNCH_LOG", "debug").run();
            out.assert_code(0);
            tracker_span_is_reported(&report, &timeline);
            let workers = trained(&out.lines());
            assert_eq!(workers.len(), n as usize, "{version}: {out}");
            let models: std::collections::BTreeSet<_> = workers.values().map(|(m, _)| m).collect();
            assert_eq!(models.len(), 1, "{version}: one model, byte for byte: {out}");
            for (rank, (_, rmse)) in &workers {
                let close = (rmse - alone).abs() < 0.05 * alone;
                assert!(close, "{version} worker {rank}: {rmse} against {alone}");
            }
            let stderr = out.stderr_str();
            // The workers' prints come through the tracker, on rlaunch's stderr.
            for rank in 0..n {
                let line = format!("worker {rank} of {n} trained");
                assert!(stderr.lines().any(|l| l == line), "{version}: {line}: {out}");
            }
            let all = format!("rabit tracker: every worker's links assigned workers={n}");
            assert!(stderr.contains(&all), "{version}: {out}");
            let warnings: Vec<&str> = rlaunch_lines(&stderr);
            let want: Vec<&str> = match what {
                "garbage" => vec![
                    "rlaunch: warning: dropped a connection to the rabit tracker from 127.0.0.1: \
                     it is no rabit worker (it began with 0x20544547)",
                ],
                _ => vec![],
            };
            assert_eq!(warnings, want, "{version}: {out}");
        }
    }
}

#[test]
fn a_worker_killed_mid_training_or_reporting_an_error_ends_the_job_naming_it() {
    for (version, python) in xgboosts() {
        let out = xgboost(&python, &[], 3, "die").run();
        out.assert_code(137);
        let stderr = out.stderr_str();
        let lines = rlaunch_lines(&stderr);
        assert_eq!(lines.len(), 1, "{version}: {out}");
        assert!(lines[0].starts_with("rlaunch: rank 1 (pid "), "{version}: {out}");
        assert!(lines[0].ends_with(" was killed by signal 9 (SIGKILL)"), "{version}: {out}");
        out.tag.wait_until_none(Duration::from_secs(5)).unwrap();
    }
    // A worker that ends (with 0) before it joins: the others would wait for ever.
    let host = rlaunch_tests::hosts::hostname();
    for (version, python) in xgboosts() {
        let out = xgboost(&python, &[], 3, "skip").run();
        out.assert_code(255);
        let stderr = out.stderr_str();
        let lines = rlaunch_lines(&stderr);
        let (head, tail) = (
            "rlaunch: rank 1 (pid ",
            format!(
                " on {host}) exited with code 0 before it connected to the rabit tracker: the \
                 workers that did would wait for it for ever"
            ),
        );
        assert_eq!(lines.len(), 1, "{version}: {out}");
        assert!(lines[0].starts_with(head) && lines[0].ends_with(&tail), "{version}: {out}");
        out.tag.wait_until_none(Duration::from_secs(5)).unwrap();
    }
    // XGBoost 2.1's workers report errors to the tracker (collective.signal_error).
    let [_, (_, python)] = xgboosts();
    let out = xgboost(&python, &[], 3, "error").run();
    out.assert_code(255);
    let want = format!("rlaunch: rank 1 on {host} reported an error to the rabit tracker");
    assert_eq!(rlaunch_lines(&out.stderr_str()), [want.as_str()], "{out}");
    out.tag.wait_until_none(Duration::from_secs(5)).unwrap();
}

#[test]
fn jax_processes_find_each_other_from_the_coordinator_rlaunch_chooses() {
    // PyPI's jax[cpu] in the venv test.sh makes; `initialize(num_processes=WORLD_SIZE,
    // process_id=RANK)` as docs/frameworks.md says, the coordinator from JAX_COORDINATOR_ADDRESS.
    let python = venv_python("jax");
    for (nodes, n) in [(1, 2), (1, 4), (2, 4)] {
        let options = if nodes == 1 { Vec::new() } else { fake_nodes(nodes, n / nodes as u32) };
        let count = n.to_string();
        let out = Run::new(&[])
            .args(options)
            .args(["-n", &count, &python, &jax_job(), "explicit"])
            .timeout(LIMIT)
            .run();
        out.assert_code(0);
        assert_eq!(rlaunch_lines(&out.stderr_str()), Vec::<&str>::new(), "{out}");
        // Gloo prints its own connection lines on stdout.
        let lines: Vec<String> =
            out.lines().into_iter().filter(|l| l.starts_with("process ")).collect();
        let coordinator = lines
            .iter()
            .find_map(|l| l.split(" coordinator ").nth(1))
            .unwrap_or_else(|| panic!("no process line: {out}"))
            .to_string();
        assert!(coordinator.starts_with("127.0.0.1:"), "{out}");
        let sum = n * (n + 1) / 2;
        let gathered: Vec<String> = (0..n).map(|r| r.to_string()).collect();
        let gathered = gathered.join(",");
        let want: Vec<String> = (0..n)
            .map(|r| {
                format!(
                    "process {r} of {n} sum {sum} gathered {gathered} coordinator {coordinator}"
                )
            })
            .collect();
        assert_eq!(sorted(lines), sorted(want), "{nodes} nodes: {out}");
    }
}

#[test]
fn the_report_shows_the_variables_each_rank_was_started_with() {
    let dir = rlaunch_tests::tempdir();
    let report = dir.path().join("report.json");
    let options = ["--tracker", "rabit", "--launcher", "fork", "--hosts", "n1:2,n2:1", "-l"];
    let out = Run::new(&options)
        .args(["-n", "3", "--report"])
        .arg(&report)
        .args([&rankprog_str(), "env"])
        .timeout(LIMIT)
        .run();
    out.assert_code(0);
    let envs = envs_by_rank(&out.lines());
    let names = [
        "PMI_RANK",
        "PMI_SIZE",
        "MPI_LOCALRANKID",
        "MPI_LOCALNRANKS",
        "PMI_LOCAL_RANK",
        "PMI_LOCAL_SIZE",
        "OMPI_COMM_WORLD_LOCAL_RANK",
        "OMPI_COMM_WORLD_LOCAL_SIZE",
        "MPIR_CVAR_CH3_INTERFACE_HOSTNAME",
        "GFORTRAN_UNBUFFERED_PRECONNECTED",
        "RANK",
        "WORLD_SIZE",
        "LOCAL_RANK",
        "LOCAL_WORLD_SIZE",
        "GROUP_RANK",
        "GROUP_WORLD_SIZE",
        "ROLE_RANK",
        "ROLE_WORLD_SIZE",
        "ROLE_NAME",
        "TORCHELASTIC_RUN_ID",
        "TORCHELASTIC_RESTART_COUNT",
        "TORCHELASTIC_MAX_RESTARTS",
        "TORCHELASTIC_ERROR_FILE",
        "RLAUNCH_RESTART_COUNT",
        "MASTER_ADDR",
        "MASTER_PORT",
        "JAX_COORDINATOR_ADDRESS",
        "DMLC_TRACKER_URI",
        "DMLC_TRACKER_PORT",
        "DMLC_TASK_ID",
        "DMLC_NUM_WORKER",
        "DMLC_ROLE",
        "DMLC_NUM_SERVER",
    ];
    let reported = rlaunch_tests::output::report_vars(&report, 0);
    assert_eq!(reported.len(), 3, "{out}");
    for (rank, vars) in reported.iter().enumerate() {
        // Exactly these names, each with the value the rank saw.
        assert_eq!(sorted(vars.keys().map(String::as_str)), sorted(names), "rank {rank}");
        for (name, value) in vars {
            assert_eq!(Some(value), envs[&(rank as u32)].get(name), "rank {rank} {name}");
        }
    }
}

#[test]
fn an_mpmd_jobs_ranks_count_across_its_segments() {
    // Two programs, 2 + 1 ranks on one node: RANK and WORLD_SIZE are the whole job's, as
    // PMI_RANK is; LOCAL_RANK counts the node's ranks whatever their program.
    let prog = rankprog_str();
    let out = Run::new(&["-l", "-n", "2", &prog, "env", ":", "-n", "1", &prog, "env"]).run();
    out.assert_code(0);
    let envs = envs_by_rank(&out.lines());
    for rank in 0..3u32 {
        let var = |name: &str| envs[&rank].get(name).cloned().unwrap_or_default();
        let want = [("RANK", rank), ("WORLD_SIZE", 3), ("LOCAL_RANK", rank), ("PMI_RANK", rank)];
        for (name, value) in want {
            assert_eq!(var(name), value.to_string(), "rank {rank} {name}: {out}");
        }
    }
}
