//! The chaos runner's bounded run: randomized faults against real jobs on this machine, on
//! seven fake nodes in a tree, on seven ssh hosts in network namespaces, and inside an
//! allocation of the tests' real Slurm (needs root).
//! Every column of failures must be zero. The long run (1000 trials) and its figures are in
//! docs/reliability.md; a failing trial prints the command that replays it alone.

use std::time::Duration;

use rlaunch_tests::cluster::Cluster;
use rlaunch_tests::slurm::SlurmCluster;
use rlaunch_tests::Run;

/// Trials in the bounded run: about a minute and a half on two cores.
const TRIALS: &str = "40";

/// The table's last row (`all`): no orphan, hang, wrong exit, wrong culprit or lost output.
fn assert_every_column_zero(text: &str) {
    let all = text.lines().find(|l| l.starts_with("all ")).expect("the table's last row");
    let failures: Vec<&str> =
        all.split('|').nth(1).expect("failure columns").split_whitespace().collect();
    assert_eq!(failures, ["0", "0", "0", "0", "0", "0"], "{text}");
}

/// The runner's `LABEL: N of M` line: (N, M).
fn counted(text: &str, label: &str) -> (u32, u32) {
    let line = text.lines().find_map(|l| l.strip_prefix(label));
    let line = line.unwrap_or_else(|| panic!("no line {label:?}: {text}"));
    let (n, m) = line.split_once(" of ").unwrap_or_else(|| panic!("{line:?}: {text}"));
    (n.parse().expect("a count"), m.parse().expect("a count"))
}

#[test]
fn forty_random_faults_leave_no_orphan_no_hang_and_the_right_culprit() {
    assert!(
        nix::unistd::geteuid().is_root(),
        "the chaos run needs root for its ssh hosts in network namespaces"
    );
    // The cluster is the test's: taken down even if the runner is killed on a timeout.
    let cluster = Cluster::up(7);
    let dir = cluster.dir().to_str().expect("a UTF-8 temporary directory").to_owned();
    let out = Run::program(rlaunch_tests::chaos(), &["--trials", TRIALS, "--cluster", &dir])
        .timeout(Duration::from_secs(600))
        .run();
    println!("{}", out.stdout_str());
    out.assert_code(0);
    let text = out.stdout_str();
    assert_every_column_zero(&text);
    assert!(text.contains(&format!("{TRIALS} trials (")), "{text}");
    // A fault that finds the job already gone proves nothing: they must stay few (a broken
    // injector would miss them all, and pass).
    let missed: u32 = text
        .split(" faults missed their target")
        .next()
        .and_then(|head| head.rsplit(' ').next())
        .and_then(|n| n.parse().ok())
        .expect("the count of missed faults");
    let trials: u32 = TRIALS.parse().unwrap();
    assert!(missed * 3 <= trials, "{missed} of {trials} faults missed: {text}");
}

/// The slurm topology's bounded run, under the continue policy (a lost node's proxies below
/// it dial rlaunch to be adopted, as a scheduler's proxies dialed it at the start): seven
/// nodes of a real Slurm, inside one allocation of eight (the runner's), every column zero and
/// every survivor told. The cluster is the test's, taken down even if the runner is killed.
#[test]
fn random_faults_inside_a_slurm_allocation_tell_the_survivors() {
    assert!(nix::unistd::geteuid().is_root(), "the Slurm cluster needs root");
    let cluster = SlurmCluster::up(8);
    let dir = cluster.dir().to_str().expect("a UTF-8 temporary directory").to_owned();
    let options = ["--trials", "16", "--seed", "20261231", "--policy", "continue"];
    let options = [&options[..], &["--topologies", "slurm", "--slurm-cluster", &dir]].concat();
    // 52 s alone here; the other chaos tests run beside it.
    let text = judged_run(&options, Duration::from_secs(400), TOLD);
    assert!(text.contains("16 trials (slurm 16)"), "{text}");
    cluster.down();
}

/// The restart policy's bounded run (`--policy restart`: every job with `--max-restarts 1`),
/// on this machine and seven fake nodes: every column zero, and every restart the faults
/// called for happened (about a minute on two cores: a stopped rlaunch alone takes 13 s).
#[test]
fn twenty_random_faults_under_restarts_end_in_completed_jobs() {
    let options = ["--trials", "20", "--policy", "restart"];
    policy_run(&options, "restarts that should have happened and did: ");
}

/// The continue policy's bounded run (`--policy continue`: every job with `--on-failure
/// continue`), on this machine and seven fake nodes: every column zero, and in the trials
/// whose rank failed in an endless phase every other rank was told which (a fixed seed whose
/// 20 trials have such failures; the 1000-trial runs in docs/reliability.md draw afresh).
#[test]
fn twenty_random_faults_under_continue_tell_the_survivors() {
    let options = ["--trials", "20", "--seed", "20261207", "--policy", "continue"];
    policy_run(&options, TOLD);
}

/// The spare policy's bounded run (`--policy spare`: `--max-restarts 1 --spare-hosts n8`), on
/// seven fake nodes: every column zero, and every lost node's ranks restarted on n8 (a fixed
/// seed whose 25 trials lose nodes twice; the 1000-trial runs in docs/reliability.md draw
/// afresh, over the ssh hosts too).
#[test]
fn random_faults_with_a_spare_restart_lost_nodes_there() {
    let options = ["--trials", "25", "--seed", "5", "--policy", "spare"];
    policy_run(&options, "lost nodes whose ranks restarted on n8: ");
}

/// PMIx ranks (`--ranks pmix`: tests/c/chaospmix.c, libpmix clients of each node's PMIx
/// server) under the default policy, on this machine and seven fake nodes: every column zero.
#[test]
fn twenty_random_faults_on_pmix_ranks_leave_no_orphan_no_hang_and_the_right_culprit() {
    let options = ["--trials", "20", "--ranks", "pmix", "--topologies", "local,lone,tree"];
    let out =
        Run::program(rlaunch_tests::chaos(), &options).timeout(Duration::from_secs(300)).run();
    println!("{}", out.stdout_str());
    out.assert_code(0);
    assert_every_column_zero(&out.stdout_str());
}

/// PMIx ranks under the continue policy: survivors told through the dead ranks' file, PMIx
/// fences completing without the failed (libpmix's PARTIAL SUCCESS), and the nodes below a
/// lost one adopted with their PMIx fence data sent again. The seed's first 16 trials of a
/// clean 200 (docs/reliability.md).
#[test]
fn random_faults_on_pmix_ranks_under_continue_tell_the_survivors() {
    let options = ["--trials", "16", "--seed", "20261234", "--ranks", "pmix", "--policy"];
    policy_run(&[&options[..], &["continue"]].concat(), TOLD);
}

/// Runs the chaos runner with `options` on this machine and the fake nodes; see
/// [`judged_run`].
fn policy_run(options: &[&str], label: &str) {
    let options = [options, &["--topologies", "local,lone,tree"]].concat();
    judged_run(&options, Duration::from_secs(300), label);
}

/// The survivors' count under the continue policy.
const TOLD: &str = "failures every survivor was told of: ";

/// Runs the chaos runner with `options` for at most `timeout`: every column must be zero, and
/// the count its line `label` gives must be all that was due, and some. Its output.
fn judged_run(options: &[&str], timeout: Duration, label: &str) -> String {
    let out = Run::program(rlaunch_tests::chaos(), options).timeout(timeout).run();
    println!("{}", out.stdout_str());
    out.assert_code(0);
    let text = out.stdout_str();
    assert_every_column_zero(&text);
    let (done, due) = counted(&text, label);
    assert_eq!(done, due, "{text}");
    assert!(due > 0, "nothing was due ({label}): {text}");
    text
}
