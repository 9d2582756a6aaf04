//! A real Grid Engine cluster (tests/cluster/sge.sh: sge_qmaster and one sge_execd per fake
//! node n1..n3, each in its own network and UTS namespaces; a parallel environment `rl` with
//! `control_slaves TRUE`) and rlaunch inside its jobs: found by PE_HOSTFILE alone, its proxies
//! started with `qrsh -inherit` as the job's own tasks, so that qdel ends all of it. Needs root.
//!
//! One test function brings the cluster up once, runs every scenario in turn, and takes it
//! down again on every path out (the cluster's Drop), passing or failing; on success it also
//! checks that nothing of the cluster is left.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use rlaunch_tests::mpi::{parse_hello, CProgram, HelloLine};
use rlaunch_tests::output::sorted;
use rlaunch_tests::sge::SgeCluster;
use rlaunch_tests::TAG_VAR;

const NODES: usize = 3;
/// Each Grid Engine command's bound; a parallel job takes ~5 s here (`qsub -sync y` learns
/// of its end ~3 s after its script ends), the rest well under one.
const WAIT: Duration = Duration::from_secs(30);

/// A scenario run on the shared cluster, and its name for the timing lines.
type Step = (&'static str, fn(&SgeCluster));

#[test]
fn grid_engine_runs_rlaunch_over_qrsh_inherit_and_qdel_leaves_nothing() {
    let started = Instant::now();
    let cluster = SgeCluster::up(NODES);
    eprintln!("sge cluster up in {:?}", started.elapsed());
    assert_eq!(cluster.running_daemons().len(), 1 + NODES, "sge_qmaster, a sge_execd a node");
    let steps: [Step; 6] = [
        ("qsub", a_parallel_job_reaches_its_nodes_with_qrsh_inherit),
        ("qrsh", qrsh_from_the_head_runs_on_a_node),
        ("rlaunch-qsub", rlaunch_in_a_parallel_job_needs_no_host_options),
        ("rlaunch-torch", torch_in_a_parallel_job_needs_no_host_options),
        ("rlaunch-qdel", qdel_of_an_rlaunch_job_leaves_nothing_on_any_node),
        ("rlaunch-exit", a_failing_rank_is_the_exit_code_of_the_job),
    ];
    for (name, step) in steps {
        let step_started = Instant::now();
        cluster.wait_idle(WAIT).unwrap_or_else(|left| panic!("before {name}: {left}"));
        step(&cluster);
        eprintln!("sge {name}: {:?}", step_started.elapsed());
    }
    let stopping = Instant::now();
    cluster.down();
    eprintln!("sge cluster down in {:?}", stopping.elapsed());
}

/// Writes `body` as the job script `name.sh` in the cluster's directory; returns it and the
/// path of the job's output (stdout and stderr joined).
fn job_script(cluster: &SgeCluster, name: &str, body: &str) -> (PathBuf, PathBuf) {
    let script = cluster.dir().join(format!("{name}.sh"));
    let output = cluster.dir().join(format!("{name}.out"));
    std::fs::write(&script, format!("#!/bin/sh\n{body}")).unwrap();
    (script, output)
}

/// `qsub -sync y -pe rl SLOTS` of `script`: the run's tag goes into the job's environment,
/// and qsub exits with the job's exit code. Returns what qsub said and the job's output.
fn qsub_sync(
    cluster: &SgeCluster,
    slots: u32,
    (script, output): (PathBuf, PathBuf),
) -> (rlaunch_tests::Outcome, String) {
    let slots = slots.to_string();
    let wd = cluster.dir().to_str().unwrap().to_string();
    let args = ["-sync", "y", "-pe", "rl", &slots, "-wd", &wd, "-j", "y", "-v", TAG_VAR];
    let args = [&args[..], &["-o", output.to_str().unwrap(), script.to_str().unwrap()]].concat();
    let out = cluster.run("qsub", &args).timeout(WAIT).run();
    let text = std::fs::read_to_string(&output).unwrap_or_else(|e| panic!("{e}: {out}"));
    (out, text)
}

fn a_parallel_job_reaches_its_nodes_with_qrsh_inherit(cluster: &SgeCluster) {
    let body = "echo \"batch on $(hostname) slots $NSLOTS\"\n\
                awk '{print \"slots\", $1, $2}' \"$PE_HOSTFILE\" | sort\n\
                for h in $(awk '{print $1}' \"$PE_HOSTFILE\"); do\n\
                \x20   qrsh -inherit \"$h\" 'echo task on $(hostname)'\n\
                done | sort\n";
    let (out, text) = qsub_sync(cluster, 6, job_script(cluster, "sanity", body));
    out.assert_code(0);
    assert!(out.stdout_str().contains("exited with exit code 0."), "{out}");
    let lines: Vec<&str> = text.lines().collect();
    let (first, rest) = lines.split_first().unwrap_or_else(|| panic!("no output: {text:?}"));
    let master = first.strip_prefix("batch on ").and_then(|l| l.strip_suffix(" slots 6"));
    assert!(master.is_some_and(|m| cluster.nodes().iter().any(|n| n == m)), "{text}");
    // Two slots on each node (fill_up), and a task on each by qrsh -inherit.
    let want: Vec<String> = ["slots n1 2", "slots n2 2", "slots n3 2"]
        .into_iter()
        .chain(["task on n1", "task on n2", "task on n3"])
        .map(String::from)
        .collect();
    assert_eq!(rest, want, "{text}");
}

fn qrsh_from_the_head_runs_on_a_node(cluster: &SgeCluster) {
    let out = cluster.run("qrsh", &["-now", "y", "hostname"]).timeout(WAIT).run();
    out.assert_code(0);
    let lines = out.lines();
    assert!(lines.len() == 1 && cluster.nodes().contains(&lines[0]), "{out}");
}

/// The ranks' hello lines of a job's output, by rank.
fn hello_lines(text: &str) -> Vec<HelloLine> {
    let mut ranks: Vec<HelloLine> = text.lines().filter_map(parse_hello).collect();
    ranks.sort_by_key(|h| h.rank);
    ranks
}

/// Prints `lineage HOST COMM...`: the command names of a rank's ancestors, from its parent up
/// to the node's sge_execd (at most five).
const LINEAGE: &str = "pid=$$; chain=; for i in 1 2 3 4 5; do \
                       pid=$(cut -d' ' -f4 /proc/$pid/stat); c=$(cat /proc/$pid/comm); \
                       chain=\"$chain $c\"; [ \"$c\" = sge_execd ] && break; done; \
                       echo \"lineage $(hostname)$chain\"";

fn rlaunch_in_a_parallel_job_needs_no_host_options(cluster: &SgeCluster) {
    // No host option, no launcher: PE_HOSTFILE says where, qrsh -inherit starts the proxies.
    let hello = CProgram::Hello.path_str();
    let rlaunch = rlaunch_tests::rlaunch().to_string_lossy().into_owned();
    let body = format!(
        "echo \"master $(hostname)\"\n\
         HWLOC_COMPONENTS=-pci,-linuxio {rlaunch} {hello} 6 || exit\n\
         exec {rlaunch} sh -c '{}'\n",
        LINEAGE.replace('\'', "'\\''")
    );
    let (out, text) = qsub_sync(cluster, 6, job_script(cluster, "rlaunch-hello", &body));
    out.assert_code(0);
    assert!(!text.contains("rlaunch:"), "rlaunch had something to say: {text}");
    let master = text
        .lines()
        .find_map(|l| l.strip_prefix("master "))
        .unwrap_or_else(|| panic!("no master line: {text}"));

    // One world of 6 (not 6 singletons), 2 ranks a node, in the order of PE_HOSTFILE: the
    // job's master node first.
    let ranks = hello_lines(&text);
    assert_eq!(ranks.len(), 6, "{text}");
    for (rank, hello) in ranks.iter().enumerate() {
        assert_eq!((hello.rank, hello.size, hello.sum), (rank as u32, 6, 15), "{text}");
        assert_eq!(hello.name, ranks[rank / 2 * 2].name, "ranks 2k and 2k+1 share a node: {text}");
    }
    assert_eq!(ranks[0].name, master, "{text}");
    let nodes = sorted(ranks.iter().step_by(2).map(|h| h.name.clone()));
    assert_eq!(nodes, cluster.nodes(), "{text}");

    // Every proxy, the master node's too, is a task of the job: qrsh -inherit's
    // qrsh_starter, under the node's sge_shepherd and sge_execd.
    let lineage = sorted(text.lines().filter(|l| l.starts_with("lineage ")));
    let want: Vec<String> = cluster
        .nodes()
        .iter()
        .flat_map(|n| {
            let line = format!("lineage {n} rlaunch-proxy qrsh_starter sge_shepherd sge_execd");
            [line.clone(), line]
        })
        .collect();
    assert_eq!(lineage, want, "{text}");
}

/// A PyTorch job in a parallel job's script, with no host options and no wrapper: gloo's
/// all_reduce spans the three nodes, each rank placed as PE_HOSTFILE says.
fn torch_in_a_parallel_job_needs_no_host_options(cluster: &SgeCluster) {
    let rlaunch = rlaunch_tests::rlaunch().to_string_lossy().into_owned();
    let body =
        format!("exec {rlaunch} /usr/bin/python3 {} allreduce\n", rlaunch_tests::torch_job());
    let (out, text) = qsub_sync(cluster, 6, job_script(cluster, "rlaunch-torch", &body));
    out.assert_code(0);
    assert!(!text.contains("rlaunch:"), "rlaunch had something to say: {text}");
    let torch = sorted(text.lines().filter(|l| l.starts_with("rank ")).map(String::from));
    let want: Vec<String> = (0..6)
        .map(|r| format!("rank {r} of 6 local {} of 2 group {} of 3 sum 15", r % 2, r / 2))
        .collect();
    assert_eq!(torch, want, "{text}");
}

fn qdel_of_an_rlaunch_job_leaves_nothing_on_any_node(cluster: &SgeCluster) {
    // qrsh from the head: the job's output comes back live, so the test can wait for the
    // ranks to be ready.
    let name = format!("rlg-qdel-{}", std::process::id());
    let rlaunch = rlaunch_tests::rlaunch().to_string_lossy().into_owned();
    let rankprog = rlaunch_tests::rankprog_str();
    let args = ["-now", "y", "-N", &name, "-v", TAG_VAR, "-pe", "rl", "6", &rlaunch];
    let args = [&args[..], &[rankprog.as_str(), "ready", "sleep", "600"]].concat();
    let mut job = cluster.run("qrsh", &args).timeout(WAIT).spawn();
    let ready = job.wait_for_ready(6, WAIT);
    assert_eq!(ready.len(), 6);
    let mut on_nodes: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for p in cluster.job_processes() {
        on_nodes.entry(p.node).or_default().push(p.comm);
    }
    for node in cluster.nodes() {
        let comms = on_nodes.get(&node).cloned().unwrap_or_default();
        for comm in ["sge_shepherd", "qrsh_starter", "rlaunch-proxy", "rankprog"] {
            assert!(comms.iter().any(|c| c == comm), "no {comm} on {node}: {on_nodes:?}");
        }
    }

    let deleted = Instant::now();
    cluster.run("qdel", &[&name]).timeout(WAIT).run().assert_code(0);
    let out = job.wait(WAIT);
    assert_ne!(out.code, Some(0), "qrsh of a deleted job: {out}");
    out.tag.wait_until_none(Duration::from_secs(10)).unwrap_or_else(|left| {
        panic!("ranks or rlaunch left {:?} after qdel: {left:?}", deleted.elapsed())
    });
    cluster.wait_idle(Duration::from_secs(10)).unwrap_or_else(|left| {
        panic!("left on the nodes {:?} after qdel: {left}", deleted.elapsed())
    });
}

fn a_failing_rank_is_the_exit_code_of_the_job(cluster: &SgeCluster) {
    // Rank 3 (on the second node) exits with 7: rlaunch ends the others and exits with 7,
    // which qsub -sync y reports as the job's.
    let rlaunch = rlaunch_tests::rlaunch().to_string_lossy().into_owned();
    let rankprog = rlaunch_tests::rankprog_str();
    let body = format!("exec {rlaunch} {rankprog} @3 exit 7 @0,1,2,4,5 sleep 600\n");
    let (out, text) = qsub_sync(cluster, 6, job_script(cluster, "rlaunch-exit", &body));
    out.assert_code(7);
    // (qsub says so on stderr, where it says "exit code 0" on stdout.)
    assert!(out.stderr_str().contains("exited with exit code 7."), "{out}\n{text}");
    let said = text.lines().find(|l| l.starts_with("rlaunch: rank 3 ("));
    assert!(said.is_some_and(|l| l.ends_with(") exited with code 7")), "{text}");
}
