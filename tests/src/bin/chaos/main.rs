//! `chaos`: randomized fault injection against real rlaunch jobs, counted in one table.
//!
//! ```text
//! chaos [--trials N] [--seed S] [--topologies local,lone,tree,ssh,slurm] [--trial K]
//!       [--cluster DIR] [--slurm-cluster DIR] [--policy end|restart|continue|spare]
//!       [--ranks pmi|pmix] [-v]
//! ```
//!
//! Each trial starts a job of `chaosrank` ranks on one topology (this machine; one rank on
//! this machine, whose proxy writes rlaunch's stdout itself; seven fake nodes in a tree of
//! width 2; seven ssh hosts in network namespaces, the same tree; seven nodes of a real Slurm
//! cluster inside one allocation, whose proxies one srun starts and which dial back into the
//! same tree; every topology but Slurm's unless `--topologies` names it), waits
//! for one phase (launch, PMI fences, heavy output, stdin forwarding, exit), strikes one
//! fault (kill -9 or -STOP of a rank, a leaf or interior proxy, rlaunch; an ssh client killed;
//! a node's link down; a rank that exits 3, dies by SIGSEGV, aborts through PMI or closes its
//! PMI socket), and checks, from the process table of every node:
//!
//! * **hangs**: rlaunch ended within its bound after the fault (kill grace, silence timeout,
//!   the child proxies' grace and a margin);
//! * **orphans**: no process of the job left 3 s after rlaunch ended (and, when rlaunch
//!   itself was stopped, none left once its proxies had time to notice);
//! * **wrong exit**: the documented exit code for the fault;
//! * **wrong culprit**: rlaunch's first line names the rank (pid, host, signal or code) or
//!   the node the fault struck;
//! * **lost output**: every line intact and in order, and every line written by a rank that
//!   was not cut off with its node arrived.
//!
//! With `--policy restart` every job runs with `--max-restarts 1`: a fault that a new
//! attempt does not meet (a rank's failure, a proxy or ssh client killed or stopped) must end
//! in a job that completes (exit 0), its first line the restart's, naming the culprit as the
//! end would; the rest is judged as without it. `chaosrank` does nothing in a later attempt
//! but init, fence and finalize. The ssh topology is left out (a cut link's host stays down,
//! and the cluster has no spare host).
//!
//! With `--policy continue` every job runs with `--on-failure continue`: a rank's own failure
//! (killed, exit 3, SIGSEGV, PMI closed) ends that rank alone, a lost node (its proxy killed
//! or stopped, its ssh client killed, its link cut) its own ranks (rlaunch adopts the proxies
//! below it), and the others, told, end the job by themselves with the failure's code and
//! culprit line,
//! as the end policy's job would (`chaosrank` stops its endless phases once told); the last
//! column counts survivors of an endless phase (fence, output, stdin) that were not told
//! exactly which ranks failed (their `told.R`). A proxy below the top whose ssh client is
//! killed may call rlaunch before its parent reports it lost, and be kept: then nothing
//! failed, and the job runs on to its timeout, as after a missed fault. Abort, a stopped rank
//! and rlaunch's own faults are judged as without it.
//!
//! With `--policy spare` (tree, ssh and slurm only) every job runs with `--max-restarts 1
//! --spare-hosts n8` (the ssh topology's cluster and the Slurm allocation have an eighth host
//! for it): as the restart
//! policy, and a lost node (a cut link too, once the node was up) must restart on n8, its
//! restart line saying `with n8 for HOST`.
//!
//! With `--ranks pmix` the ranks are `chaospmix` (tests/c/chaospmix.c), libpmix clients of
//! each node's PMIx server doing what `chaosrank` does with PMI-1 (abort is `PMIx_Abort`,
//! closing PMI an exit without `PMIx_Finalize`), and the same checks apply.
//!
//! The ssh topology brings up its own cluster of 7 nodes (tests/cluster/cluster.sh), or uses
//! the one in `--cluster DIR` (brought up by the caller, who takes it down: a runner killed
//! by a harness's timeout leaves nothing then). The slurm topology likewise brings up its
//! Slurm (tests/cluster/slurm.sh, 8 nodes) or uses `--slurm-cluster DIR`'s, and holds one
//! allocation of 8 nodes for the run (`salloc --no-shell`, cancelled at the end); a node
//! fault there is a proxy's (no ssh client, no link cut).
//!
//! Trials are drawn from the seed (printed first): `--seed S --trial K` replays trial K.
//! With `-v`, passing trials are listed and a failing one shows all of rlaunch's stderr
//! (`RLAUNCH_LOG=debug` reaches rlaunch). Needs root for the ssh topology. Exits 1 if any column of failures is not zero.
//! Build first: `cargo build --workspace --all-targets`.

mod execute;
mod job;
mod slurm;
mod trial;

use std::collections::BTreeMap;
use std::time::{Instant, SystemTime, UNIX_EPOCH};

use execute::{Context, Policy, Verdict, SPARE};
use trial::{Fault, Phase, Topology, Trial, TREE_NODES};

struct Options {
    /// A cluster brought up by the caller, for the ssh topology.
    cluster: Option<std::path::PathBuf>,
    /// A Slurm cluster brought up by the caller, for the slurm topology.
    slurm_cluster: Option<std::path::PathBuf>,
    trials: u32,
    seed: u64,
    topologies: Vec<Topology>,
    only: Option<u32>,
    verbose: bool,
    policy: Policy,
    /// `--ranks pmix`: the ranks are `chaospmix`, libpmix clients, not `chaosrank` (PMI-1).
    pmix: bool,
}

fn usage(what: &str) -> ! {
    eprintln!(
        "chaos: {what}\nusage: chaos [--trials N] [--seed S] [--topologies \
         local,lone,tree,ssh,slurm] [--trial K] [--cluster DIR] [--slurm-cluster DIR] \
         [--policy end|restart|continue|spare] [--ranks pmi|pmix] [-v]"
    );
    std::process::exit(2);
}

fn options() -> Options {
    let mut o = Options {
        cluster: None,
        slurm_cluster: None,
        trials: 1000,
        seed: SystemTime::now().duration_since(UNIX_EPOCH).map_or(1, |d| d.as_nanos() as u64),
        topologies: Topology::DEFAULT.to_vec(),
        only: None,
        verbose: false,
        policy: Policy::End,
        pmix: false,
    };
    let mut args = std::env::args().skip(1);
    while let Some(arg) = args.next() {
        let mut value =
            |name: &str| args.next().unwrap_or_else(|| usage(&format!("{name} needs a value")));
        match arg.as_str() {
            "--trials" => {
                o.trials = value("--trials").parse().unwrap_or_else(|_| usage("bad --trials"))
            }
            "--seed" => o.seed = value("--seed").parse().unwrap_or_else(|_| usage("bad --seed")),
            "--trial" => {
                o.only = Some(value("--trial").parse().unwrap_or_else(|_| usage("bad --trial")))
            }
            "--topologies" => {
                o.topologies = value("--topologies")
                    .split(',')
                    .map(|w| {
                        Topology::parse(w)
                            .unwrap_or_else(|| usage(&format!("unknown topology {w:?}")))
                    })
                    .collect();
            }
            "--cluster" => o.cluster = Some(value("--cluster").into()),
            "--slurm-cluster" => o.slurm_cluster = Some(value("--slurm-cluster").into()),
            "--policy" => {
                o.policy = match value("--policy").as_str() {
                    "end" => Policy::End,
                    "restart" => Policy::Restart,
                    "continue" => Policy::Continue,
                    "spare" => Policy::Spare,
                    other => usage(&format!(
                        "unknown policy {other:?} (end, restart, continue or spare)"
                    )),
                }
            }
            "--ranks" => {
                o.pmix = match value("--ranks").as_str() {
                    "pmi" => false,
                    "pmix" => true,
                    other => usage(&format!("unknown ranks {other:?} (pmi or pmix)")),
                }
            }
            "-v" => o.verbose = true,
            other => usage(&format!("unknown argument {other:?}")),
        }
    }
    if o.policy == Policy::Restart {
        o.topologies.retain(|&t| t != Topology::Ssh);
        if o.topologies.is_empty() {
            usage("the restart policy runs on local, lone and tree");
        }
    }
    if o.policy == Policy::Spare {
        o.topologies.retain(|&t| matches!(t, Topology::Tree | Topology::Ssh | Topology::Slurm));
        if o.topologies.is_empty() {
            usage("the spare policy runs on tree, ssh and slurm");
        }
    }
    o
}

/// Failures by kind, for one row of the table.
#[derive(Default, Clone, Copy)]
struct Failures {
    orphans: u32,
    hangs: u32,
    wrong_exit: u32,
    wrong_culprit: u32,
    lost_output: u32,
    untold: u32,
}

impl Failures {
    fn add(&mut self, v: &Verdict) {
        self.orphans += u32::from(v.orphans.is_some());
        self.hangs += u32::from(v.hang.is_some());
        self.wrong_exit += u32::from(v.wrong_exit.is_some());
        self.wrong_culprit += u32::from(v.wrong_culprit.is_some());
        self.lost_output += u32::from(v.lost_output.is_some());
        self.untold += u32::from(v.untold.is_some());
    }

    fn sum(&self) -> u32 {
        self.orphans
            + self.hangs
            + self.wrong_exit
            + self.wrong_culprit
            + self.lost_output
            + self.untold
    }
}

fn main() {
    let o = options();
    let work = rlaunch_tests::tempdir();
    let bin = std::env::current_exe().expect("chaos: cannot find its own executable");
    let bin_dir = bin.parent().expect("chaos lives in a directory").to_path_buf();
    let built = |name: &str| {
        let path = bin_dir.join(name);
        if !path.is_file() {
            usage(&format!(
                "{} is not built; run `cargo build --workspace --all-targets`",
                path.display()
            ));
        }
        path
    };
    let rlaunch = built("rlaunch");
    let chaosrank = match o.pmix {
        true => rlaunch_tests::mpi::CProgram::ChaosPmix.path().to_path_buf(),
        false => built("chaosrank"),
    };
    // The spare policy's spare is one more host of the cluster.
    let hosts = TREE_NODES + usize::from(o.policy == Policy::Spare);
    let (netns, cluster) = if o.topologies.contains(&Topology::Ssh) {
        let cluster = match &o.cluster {
            Some(dir) => rlaunch_tests::cluster::Cluster::attach(dir),
            None => rlaunch_tests::cluster::Cluster::up(hosts),
        };
        let netns = (1..=hosts)
            .map(|i| job::netns_inode(&format!("rl-n{i}")).expect("the cluster's namespaces exist"))
            .collect();
        (netns, Some(cluster))
    } else {
        (Vec::new(), None)
    };
    let slurm = o
        .topologies
        .contains(&Topology::Slurm)
        .then(|| slurm::Allocation::new(o.slurm_cluster.as_deref(), TREE_NODES + 1));
    let context = Context {
        rlaunch,
        chaosrank,
        hostname: rlaunch_tests::hosts::hostname(),
        work: work.path().to_path_buf(),
        cluster,
        netns,
        slurm,
        policy: o.policy,
    };
    let names: Vec<&str> = o.topologies.iter().map(|t| t.name()).collect();
    let count = o.only.map_or(o.trials, |_| 1);
    let policy = match o.policy {
        Policy::End => "end",
        Policy::Restart => "restart (--max-restarts 1)",
        Policy::Continue => "continue (--on-failure continue)",
        Policy::Spare => "spare (--max-restarts 1 --spare-hosts n8)",
    };
    let ranks = if o.pmix { "chaospmix (PMIx)" } else { "chaosrank (PMI-1)" };
    println!(
        "chaos: seed {}, {count} trials over {}, policy {policy}, ranks {ranks}",
        o.seed,
        names.join(",")
    );

    let started = Instant::now();
    let mut counts: BTreeMap<(Fault, Phase), u32> = BTreeMap::new();
    let mut failures: BTreeMap<Fault, Failures> = BTreeMap::new();
    let mut by_topology: BTreeMap<&str, u32> = BTreeMap::new();
    let (mut ran, mut missed) = (0, 0);
    let (mut restarts_due, mut restarted) = (0, 0);
    let (mut told_due, mut told) = (0, 0);
    let (mut spares_due, mut spared) = (0, 0);
    let indices: Vec<u32> = match o.only {
        Some(k) => vec![k],
        None => (0..o.trials).collect(),
    };
    for index in indices {
        let trial = Trial::draw(o.seed, index, &o.topologies);
        let verdict = context.run(&trial);
        ran += 1;
        missed += u32::from(!verdict.landed);
        restarts_due += u32::from(verdict.restart_due);
        restarted += u32::from(verdict.restart_due && verdict.restarted);
        told_due += u32::from(verdict.told_due);
        told += u32::from(verdict.told_due && verdict.untold.is_none());
        spares_due += u32::from(verdict.spare_due);
        spared += u32::from(verdict.spare_due && verdict.unspared.is_none());
        *counts.entry((trial.fault, trial.phase)).or_default() += 1;
        *by_topology.entry(trial.topology.name()).or_default() += 1;
        failures.entry(trial.fault).or_default().add(&verdict);
        if verdict.failed() {
            report_failure(&trial, &verdict, o.seed, o.verbose);
        } else if o.verbose {
            println!(
                "ok   {trial} ({:.1} s{})",
                verdict.seconds,
                if verdict.landed { "" } else { ", missed" }
            );
        }
    }
    drop(context);

    let total = print_table(&counts, &failures);
    let topo: Vec<String> = by_topology.iter().map(|(t, n)| format!("{t} {n}")).collect();
    println!(
        "{ran} trials ({}), {missed} faults missed their target (the job had ended), {:.0} s",
        topo.join(", "),
        started.elapsed().as_secs_f64()
    );
    if o.policy.restarts() {
        println!("restarts that should have happened and did: {restarted} of {restarts_due}");
    }
    if o.policy == Policy::Continue {
        println!("failures every survivor was told of: {told} of {told_due}");
    }
    if o.policy == Policy::Spare {
        println!("lost nodes whose ranks restarted on {SPARE}: {spared} of {spares_due}");
    }
    if total.sum() > 0 || restarted < restarts_due || spared < spares_due {
        println!("chaos: {} trials failed a check (seed {})", total.sum(), o.seed);
        // exit() runs no destructor: the work directory goes first.
        drop(work);
        std::process::exit(1);
    }
}

fn report_failure(trial: &Trial, verdict: &Verdict, seed: u64, verbose: bool) {
    println!("FAIL {trial} (replay: chaos --seed {seed} --trial {})", trial.index);
    let checks = [
        ("hang", &verdict.hang),
        ("orphans", &verdict.orphans),
        ("wrong exit", &verdict.wrong_exit),
        ("wrong culprit", &verdict.wrong_culprit),
        ("lost output", &verdict.lost_output),
        ("survivors not told", &verdict.untold),
        ("not on the spare", &verdict.unspared),
    ];
    for (name, what) in checks {
        if let Some(what) = what {
            println!("     {name}: {what}");
        }
    }
    let lines = if verbose { usize::MAX } else { 8 };
    for line in verdict.stderr.lines().take(lines) {
        println!("     | {}", line.chars().take(200).collect::<String>());
    }
}

fn print_table(
    counts: &BTreeMap<(Fault, Phase), u32>,
    failures: &BTreeMap<Fault, Failures>,
) -> Failures {
    print!("{:<24}", "fault");
    for phase in Phase::ALL {
        print!("{:>7}", phase.name());
    }
    println!(" | orphans  hangs  wrong-exit  wrong-culprit  lost-output  untold");
    let mut total = Failures::default();
    let mut phase_totals = [0u32; 5];
    for fault in Fault::ALL {
        let row: Vec<u32> =
            Phase::ALL.iter().map(|&p| counts.get(&(fault, p)).copied().unwrap_or(0)).collect();
        if row.iter().sum::<u32>() == 0 {
            continue;
        }
        let f = failures.get(&fault).copied().unwrap_or_default();
        print!("{:<24}", fault.name());
        for (i, n) in row.iter().enumerate() {
            phase_totals[i] += n;
            print!("{n:>7}");
        }
        println!(" | {}", columns(&f));
        total.orphans += f.orphans;
        total.hangs += f.hangs;
        total.wrong_exit += f.wrong_exit;
        total.wrong_culprit += f.wrong_culprit;
        total.lost_output += f.lost_output;
        total.untold += f.untold;
    }
    print!("{:<24}", "all");
    for n in phase_totals {
        print!("{n:>7}");
    }
    println!(" | {}", columns(&total));
    total
}

fn columns(f: &Failures) -> String {
    format!(
        "{:>7}  {:>5}  {:>10}  {:>13}  {:>11}  {:>6}",
        f.orphans, f.hangs, f.wrong_exit, f.wrong_culprit, f.lost_output, f.untold
    )
}
