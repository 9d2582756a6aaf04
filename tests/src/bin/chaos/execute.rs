//! Running one trial: start the job, reach the phase, strike, wait, and judge what rlaunch
//! did against what it promises.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;
use rlaunch_tests::cluster::Cluster;
use rlaunch_tests::{procfs, FloodReport};

use crate::job::{describe, poll, processes_in_netns, ssh_client_of, Job, RankFiles, STDIN_RANK};
use crate::trial::{Fault, Phase, Topology, Trial};

/// The liveness settings every trial runs with: a lost proxy is found within 5 s. Beside
/// two busy loops, a proxy under sshd (a session, and so a scheduler group, of its own) was
/// seen runnable and not run for up to 2.9 s (its /proc schedstat's wait; docs/reliability.md,
/// *The suite under load*): 5 s is that with a margin of 1.7.
const HEARTBEAT: &str = "0.25";
const SILENCE: &str = "5";
const KILL_GRACE: Duration = Duration::from_secs(1);
/// After the fault, how long rlaunch may take to end: silence (5 s), kill grace (1 s), the
/// time output written before the end may take to come out before what is left is dropped
/// (4 s; over ssh on a busy machine draining tens of MiB takes seconds), and a margin.
const END_BOUND: Duration = Duration::from_secs(14);
/// A link down is noticed by silence, and the ssh client on the dead link is killed only
/// after the child proxies' grace.
const LINK_DOWN_BOUND: Duration = Duration::from_secs(16);
/// How long a parent waits for a child proxy's hello (`rlaunch_tree::link::HELLO_WAIT`).
const HELLO_WAIT: Duration = Duration::from_secs(30);
/// After rlaunch ends, how long the job's processes may take to go.
const ORPHAN_GRACE: Duration = Duration::from_secs(3);
/// How long a rlaunch stopped with SIGSTOP stays stopped: its proxies must notice its
/// silence (5 s) and take their nodes down (kill grace 1 s, child proxies 3 s) meanwhile,
/// and a margin of 4 s for proxies not run while runnable (up to 2.9 s seen beside two busy
/// loops): with 1 s, two leaf proxies under interior ones were still there after 10 s once.
const RLAUNCH_STOPPED: Duration = Duration::from_millis(13000);
/// With the restart policy: the second attempt's launch and its init, fence and finalize,
/// on top of the first's end (measured: 0.1 s over 7 fake nodes, idle), with a margin for
/// a loaded machine.
const RESTART_BOUND: Duration = Duration::from_secs(5);

pub struct Context {
    pub rlaunch: PathBuf,
    pub chaosrank: PathBuf,
    pub hostname: String,
    pub work: PathBuf,
    pub cluster: Option<Cluster>,
    /// The ssh hosts' network namespaces.
    pub netns: Vec<u64>,
    /// The slurm topology's allocation.
    pub slurm: Option<crate::slurm::Allocation>,
    pub policy: Policy,
}

/// What every job of the run is asked to do when a rank or node fails (`--policy`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Policy {
    /// rlaunch's default: the job ends.
    End,
    /// `--max-restarts 1`.
    Restart,
    /// `--on-failure continue`.
    Continue,
    /// `--max-restarts 1 --spare-hosts n8`: a lost node's ranks restart on n8.
    Spare,
}

/// The host `--policy spare` gives its jobs.
pub const SPARE: &str = "n8";

impl Policy {
    /// Jobs restart once.
    pub fn restarts(self) -> bool {
        matches!(self, Policy::Restart | Policy::Spare)
    }
}

/// What went wrong in a trial; all empty is a pass.
#[derive(Default, Debug)]
pub struct Verdict {
    /// The fault found its target (a fault that finds the job gone changes nothing).
    pub landed: bool,
    pub hang: Option<String>,
    pub orphans: Option<String>,
    pub wrong_exit: Option<String>,
    pub wrong_culprit: Option<String>,
    pub lost_output: Option<String>,
    /// With the continue policy: a survivor not told of the failed rank.
    pub untold: Option<String>,
    /// With the continue policy: the survivors had to be told of a failed rank.
    pub told_due: bool,
    /// With the spare policy: a lost node whose ranks had to restart on the spare, and why
    /// they did not.
    pub spare_due: bool,
    pub unspared: Option<String>,
    pub seconds: f64,
    pub stderr: String,
    /// With the restart policy: the fault called for a restart, and one happened.
    pub restart_due: bool,
    pub restarted: bool,
}

impl Verdict {
    pub fn failed(&self) -> bool {
        self.hang.is_some()
            || self.orphans.is_some()
            || self.wrong_exit.is_some()
            || self.wrong_culprit.is_some()
            || self.lost_output.is_some()
            || self.untold.is_some()
            || self.unspared.is_some()
    }
}

impl Context {
    fn hosts(&self, topology: Topology) -> Vec<String> {
        match topology {
            Topology::Local | Topology::Lone => vec![self.hostname.clone()],
            Topology::Tree | Topology::Ssh | Topology::Slurm => {
                (1..=topology.nodes()).map(|i| format!("n{i}")).collect()
            }
        }
    }

    fn args(&self, trial: &Trial, dir: &std::path::Path) -> Vec<String> {
        let t = trial.topology;
        let mut args: Vec<String> = [
            "--heartbeat",
            HEARTBEAT,
            "--silence-timeout",
            SILENCE,
            "--kill-grace",
            &KILL_GRACE.as_secs().to_string(),
            "--timeout",
            &self.timeout(t).as_secs().to_string(),
        ]
        .map(String::from)
        .to_vec();
        match self.policy {
            Policy::End => {}
            Policy::Restart => args.extend(["--max-restarts", "1"].map(String::from)),
            Policy::Continue => args.extend(["--on-failure", "continue"].map(String::from)),
            Policy::Spare => {
                args.extend(["--max-restarts", "1", "--spare-hosts", SPARE].map(String::from))
            }
        }
        let slots: Vec<String> = self.hosts(t).iter().map(|h| format!("{h}:2")).collect();
        match t {
            // The allocation is the host list: n1..n7 hold the job's ranks, two each (n8 is
            // left over: the spare policy's spare).
            Topology::Local | Topology::Lone | Topology::Slurm => {}
            Topology::Tree => args.extend(["--launcher", "fork"].map(String::from)),
            Topology::Ssh => {
                let cluster = self.cluster.as_ref().expect("the ssh topology has its cluster");
                args.extend([
                    "--launcher".into(),
                    "ssh".into(),
                    "--launcher-exec".into(),
                    cluster.ssh(),
                ]);
            }
        }
        if t.nodes() > 1 && t != Topology::Slurm {
            args.extend(["--hosts".into(), slots.join(",")]);
        }
        if t.nodes() > 1 {
            args.extend(["--tree-width".into(), "2".into()]);
        }
        args.extend(["-n".into(), t.ranks().to_string()]);
        args.extend([self.chaosrank.display().to_string(), dir.display().to_string()]);
        args.push(trial.phase.name().into());
        if let Some(word) = trial.fault.rank_word() {
            let when = if trial.strikes_at_start() { "start" } else { "usr1" };
            args.extend([trial.rank.to_string(), word.into(), when.into()]);
        }
        args
    }

    /// The job's `--timeout`: with the restart policy, room for the second attempt too.
    fn timeout(&self, t: Topology) -> Duration {
        t.timeout() + if self.policy.restarts() { RESTART_BOUND } else { Duration::ZERO }
    }

    /// The time rlaunch may take after the fault's end of the attempt: the restart's too.
    fn end_bound(&self, bound: Duration) -> Duration {
        bound + if self.policy.restarts() { RESTART_BOUND } else { Duration::ZERO }
    }

    /// Every live process of the job: tagged ones here, and anything on the ssh hosts.
    fn job_processes(&self, job: &Job) -> Vec<i32> {
        let mut pids: Vec<i32> = job
            .tag
            .processes()
            .into_iter()
            .map(|p| p.pid.as_raw())
            .filter(|&p| p != job.pid().as_raw())
            .collect();
        pids.extend(processes_in_netns(&self.netns));
        pids.sort_unstable();
        pids.dedup();
        pids
    }

    /// Waits until the job has no process left; returns those still there at `deadline`.
    fn wait_gone(&self, job: &Job, deadline: Instant) -> Vec<i32> {
        let timeout = deadline.saturating_duration_since(Instant::now());
        rlaunch_tests::wait_until_empty(timeout, || self.job_processes(job))
            .err()
            .unwrap_or_default()
    }

    pub fn run(&self, trial: &Trial) -> Verdict {
        let dir = self.work.join(format!("trial-{}", trial.index));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).expect("chaos: cannot create a trial directory");
        let verdict = self.run_in(trial, &dir);
        let _ = std::fs::remove_dir_all(&dir);
        verdict
    }

    fn run_in(&self, trial: &Trial, dir: &std::path::Path) -> Verdict {
        let t = trial.topology;
        let hosts = self.hosts(t);
        let files = RankFiles::new(dir.to_path_buf());
        // Under continue, the proxies below a lost node are adopted by rlaunch (and so may be
        // the node itself, if only its ssh client was lost), and what their ranks wrote may
        // lose a piece on its way through the lost one (README, *Survivors*).
        let adopted = |r: &u32| t.under(t.node_of(*r), trial.node);
        let lenient = match self.policy == Policy::Continue && trial.fault.aims_at_node() {
            true => (0..t.ranks()).filter(adopted).collect(),
            false => Vec::new(),
        };
        let stdin = trial.phase == Phase::Stdin;
        let env = match (t, &self.slurm) {
            (Topology::Slurm, Some(allocation)) => allocation.env(),
            _ => &[],
        };
        let mut job = Job::start(&self.rlaunch, &self.args(trial, dir), env, stdin, lenient);
        let mut verdict = Verdict::default();
        let limit = job.started + Duration::from_secs(30);

        if trial.phase != Phase::Launch {
            let ranks = t.ranks();
            let ready = poll(limit, || {
                if (0..ranks).all(|r| files.ready(r)) {
                    Some(true)
                } else {
                    job.status().map(|_| false)
                }
            });
            if ready != Some(true) {
                let status = job.status().map_or("still running".into(), |s| s.to_string());
                let (_, err) = job.output(Duration::from_secs(3));
                verdict.wrong_exit = Some(format!("the ranks never got ready ({status})"));
                verdict.stderr = String::from_utf8_lossy(&err).into_owned();
                return verdict;
            }
            std::thread::sleep(trial.delay);
        }

        let mut fault_at = job.started;
        let mut link_down = false;
        let sig_of = |fault: Fault| match fault {
            Fault::StopRank | Fault::StopProxy | Fault::StopRlaunch => Signal::SIGSTOP,
            _ => Signal::SIGKILL,
        };
        let strike = |pid: Option<i32>, sig: Signal| match pid {
            Some(pid) => kill(Pid::from_raw(pid), sig).is_ok(),
            None => false,
        };
        let in_launch = trial.phase == Phase::Launch;
        let after_found = |found: Option<i32>| {
            if in_launch && found.is_some() {
                std::thread::sleep(trial.delay);
            }
            found
        };
        verdict.landed = match trial.fault {
            Fault::RankExit | Fault::RankSignal | Fault::RankAbort | Fault::RankPmiClose => {
                if in_launch {
                    true
                } else {
                    strike(files.pid(trial.rank), Signal::SIGUSR1)
                }
            }
            Fault::KillRank | Fault::StopRank => {
                let pid = after_found(poll(limit, || {
                    files.pid(trial.rank).or_else(|| job_done(&mut job))
                }));
                strike(pid.filter(|&p| p > 0), sig_of(trial.fault))
            }
            Fault::KillLeafProxy | Fault::KillInteriorProxy | Fault::StopProxy => {
                let first = t.first_rank(trial.node);
                let rank = poll(limit, || files.pid(first).or_else(|| job_done(&mut job)));
                let proxy = after_found(
                    rank.filter(|&p| p > 0).and_then(|p| procfs::stat(p).map(|s| s.ppid)),
                );
                strike(proxy.filter(|&p| p > 1), sig_of(trial.fault))
            }
            Fault::KillRlaunch | Fault::StopRlaunch => {
                if in_launch {
                    std::thread::sleep(trial.delay);
                }
                strike(job.status().is_none().then(|| job.pid().as_raw()), sig_of(trial.fault))
            }
            Fault::KillSsh => {
                let tag = job.tag.as_str().to_owned();
                let ssh = poll(limit, || {
                    ssh_client_of(&hosts[trial.node], &tag, &self.netns)
                        .or_else(|| job_done(&mut job))
                });
                strike(after_found(ssh.filter(|&p| p > 0)), Signal::SIGKILL)
            }
            Fault::LinkDown => {
                if in_launch {
                    std::thread::sleep(trial.delay * 5);
                }
                let cluster = self.cluster.as_ref().expect("the ssh topology has its cluster");
                cluster.ctl("link-down", trial.node + 1);
                link_down = true;
                job.status().is_none()
            }
        };
        if !trial.strikes_at_start() {
            fault_at = Instant::now();
        }

        if trial.fault == Fault::StopRlaunch && verdict.landed {
            // Stopped, rlaunch sends no heartbeat: every proxy must take its node down.
            std::thread::sleep(RLAUNCH_STOPPED);
            // rlaunch's own ssh clients (and srun) wait for it to read what they carry: they
            // are the wire, not the job, and go when it resumes.
            let rlaunch = job.pid().as_raw();
            let wire = |comm: &str| comm == "ssh" || comm == "srun";
            let left: Vec<i32> = self
                .job_processes(&job)
                .into_iter()
                .filter(|&p| {
                    procfs::stat(p).is_some_and(|s| {
                        s.comm != "rlaunch" && !(wire(&s.comm) && s.ppid == rlaunch)
                    })
                })
                .collect();
            if !left.is_empty() {
                let left: Vec<String> = left.iter().map(|&p| describe(p)).collect();
                verdict.orphans = Some(format!(
                    "{:.1} s after rlaunch was stopped, still running: {}",
                    RLAUNCH_STOPPED.as_secs_f64(),
                    left.join(", ")
                ));
            }
            let _ = kill(job.pid(), Signal::SIGCONT);
            fault_at = Instant::now();
        }

        let deadline = match trial.fault {
            // A missed fault or a stopped rank: the job ends by itself, or at its timeout; so
            // may one whose node's transport was mended (see `healable`).
            _ if !verdict.landed || trial.fault == Fault::StopRank || self.healable(trial) => {
                job.started + self.timeout(t) + KILL_GRACE + END_BOUND
            }
            // Cut before its proxy said hello, a node is given up only after the hello wait
            // (an ssh session on a dead link hangs; 30 s allow for slow logins).
            Fault::LinkDown if in_launch => fault_at + HELLO_WAIT + END_BOUND,
            Fault::LinkDown => fault_at + self.end_bound(LINK_DOWN_BOUND),
            _ => fault_at + self.end_bound(END_BOUND),
        };
        let status = match job.wait_until(deadline) {
            Some(status) => status,
            None => {
                let running: Vec<String> =
                    self.job_processes(&job).iter().map(|&p| describe(p)).collect();
                verdict.hang = Some(format!(
                    "rlaunch still running {:.1} s after the fault; the job's processes: {}",
                    fault_at.elapsed().as_secs_f64(),
                    running.join(", ")
                ));
                job.kill()
            }
        };
        let ended = Instant::now();
        verdict.seconds = ended.duration_since(job.started).as_secs_f64();
        let (report, stderr) = job.output(ORPHAN_GRACE);
        verdict.stderr = String::from_utf8_lossy(&stderr).into_owned();

        let left = self.wait_gone(&job, ended + ORPHAN_GRACE);
        if !left.is_empty() && verdict.orphans.is_none() {
            let left: Vec<String> = left.iter().map(|&p| describe(p)).collect();
            verdict.orphans =
                Some(format!("3 s after rlaunch ended, still running: {}", left.join(", ")));
        }
        for pid in self.job_processes(&job) {
            let _ = kill(Pid::from_raw(pid), Signal::SIGCONT);
            let _ = kill(Pid::from_raw(pid), Signal::SIGKILL);
        }
        if link_down {
            let cluster = self.cluster.as_ref().expect("the ssh topology has its cluster");
            cluster.ctl("link-up", trial.node + 1);
        }
        if verdict.hang.is_none() {
            self.judge(trial, &hosts, &files, status, report, &mut verdict);
        }
        verdict
    }

    /// Under continue, a proxy below the top whose ssh client is killed sees its link close
    /// and dials rlaunch to be adopted (README, *Survivors*): if that call comes before its
    /// parent's report of the loss, the node lives on and nothing failed (its parent's
    /// report of the old link is no news); the job then runs as if the fault had missed.
    fn healable(&self, trial: &Trial) -> bool {
        let below_top = trial.topology.parent(trial.node).is_some();
        self.policy == Policy::Continue && trial.fault == Fault::KillSsh && below_top
    }

    /// Exit status, culprit line and output against what the fault calls for.
    fn judge(
        &self,
        trial: &Trial,
        hosts: &[String],
        files: &RankFiles,
        status: std::process::ExitStatus,
        report: Result<FloodReport, String>,
        verdict: &mut Verdict,
    ) {
        use std::os::unix::process::ExitStatusExt;
        let t = trial.topology;
        let in_launch = trial.phase == Phase::Launch;
        let rank_host = &hosts[t.node_of(trial.rank)];
        let node_host = &hosts[trial.node];
        let rank_said = |what: &str| {
            let pid = files.pid(trial.rank).unwrap_or(0);
            format!("rlaunch: rank {} (pid {pid} on {rank_host}) {what}", trial.rank)
        };
        let lost = format!("rlaunch: lost proxy on {node_host} (");
        let timed_out = format!(
            "rlaunch: the job timed out after {} s and was killed",
            self.timeout(t).as_secs()
        );
        let healed = self.healable(trial) && !verdict.stderr.contains(&lost);
        let (code, culprit): (Option<i32>, Option<String>) = match trial.fault {
            _ if healed => (Some(124), Some(timed_out.clone())),
            Fault::KillRank => (Some(137), Some(rank_said("was killed by signal 9 (SIGKILL)"))),
            Fault::StopRank => (Some(124), Some(timed_out)),
            Fault::RankExit => (Some(3), Some(rank_said("exited with code 3"))),
            Fault::RankSignal => (Some(139), Some(rank_said("was killed by signal 11 (SIGSEGV)"))),
            Fault::RankAbort => (Some(7), Some(rank_said("aborted the job with exit code 7"))),
            Fault::RankPmiClose => {
                (Some(255), Some(rank_said("closed its PMI connection before calling finalize")))
            }
            Fault::LinkDown if in_launch && status.code() == Some(124) => {
                (Some(124), Some(timed_out))
            }
            Fault::KillLeafProxy | Fault::KillInteriorProxy | Fault::KillSsh | Fault::LinkDown => {
                (Some(255), Some(lost))
            }
            Fault::StopProxy => (
                Some(255),
                Some(format!(
                    "rlaunch: lost proxy on {node_host} (no word from it for {SILENCE} s)"
                )),
            ),
            Fault::KillRlaunch => (None, None),
            // Stopped past the job's timeout, rlaunch may see that first when it resumes; a
            // link cut before the node's hello is given up after the hello wait, which the
            // job's timeout may end first.
            Fault::StopRlaunch if status.code() == Some(124) => (Some(124), Some(timed_out)),
            Fault::StopRlaunch => (Some(255), Some("rlaunch: lost proxy on ".into())),
        };
        // A job that ends by itself may beat the fault, unless the fault is a rank's own at its
        // start.
        let may_succeed = !verdict.landed
            || healed
            || (trial.phase.ends_by_itself() && !trial.strikes_at_start());
        // With the restart policy, a fault the second attempt does not meet ends in a job
        // that completes, its first line the restart's, which names the culprit as the end
        // would. rlaunch stopped may find its proxies gone when it resumes, and restart.
        let restartable =
            matches!(
                trial.fault,
                Fault::KillRank
                    | Fault::RankExit
                    | Fault::RankSignal
                    | Fault::RankAbort
                    | Fault::RankPmiClose
                    | Fault::KillLeafProxy
                    | Fault::KillInteriorProxy
                    | Fault::StopProxy
                    | Fault::KillSsh
            ) || (self.policy == Policy::Spare && trial.fault == Fault::LinkDown && !in_launch);
        // Over ssh, a node struck during the launch may not have come up yet (its proxy's
        // hello not read): that is a host the job could not start on, not retried (README).
        let before_up = in_launch && t == Topology::Ssh && trial.fault.aims_at_node();
        let restartable = restartable && !before_up;
        let restart = self.policy.restarts();
        verdict.restarted = verdict.stderr.contains("; restarting the job")
            && verdict.stderr.contains(" (restart 1 of 1)");
        // With a spare, a lost node's ranks go there.
        verdict.spare_due = self.policy == Policy::Spare
            && restartable
            && trial.fault.aims_at_node()
            && !may_succeed;
        if verdict.spare_due {
            let moved =
                format!("; restarting the job with {SPARE} for {node_host} (restart 1 of 1)");
            if !verdict.stderr.contains(&moved) {
                verdict.unspared = Some(format!("no line saying {moved:?}"));
            }
        }
        let restarted_rlaunch =
            trial.fault == Fault::StopRlaunch && restart && status.code() == Some(0);
        let (code, culprit) = match code {
            Some(_) if restart && (restartable || restarted_rlaunch) => (Some(0), culprit),
            code => (code, culprit),
        };
        verdict.restart_due = restart && restartable && !may_succeed;
        // A job that timed out says where it was first (its hang report), then why it ended.
        let hang_report =
            |l: &str| l.starts_with("rlaunch:   ") || l.starts_with("rlaunch: where the job was");
        let first_said = verdict
            .stderr
            .lines()
            .find(|l| l.starts_with("rlaunch: ") && !hang_report(l))
            .map(str::to_owned);
        match (trial.fault, status.code(), status.signal()) {
            (Fault::KillRlaunch, _, Some(9)) => {}
            (Fault::KillRlaunch, _, _) if may_succeed && status.code() == Some(0) => {}
            (Fault::KillRlaunch, _, _) => {
                verdict.wrong_exit = Some(format!("rlaunch {status}, not killed by SIGKILL"));
            }
            (_, Some(0), _) if may_succeed => {}
            (_, Some(got), _) if Some(got) == code => {
                let want = culprit.expect("every code has its line");
                if !first_said.as_deref().is_some_and(|l| l.starts_with(&want)) {
                    verdict.wrong_culprit = Some(format!(
                        "first line {:?}, expected one starting {want:?}",
                        first_said.unwrap_or_default()
                    ));
                }
            }
            _ => {
                verdict.wrong_exit = Some(format!(
                    "rlaunch {status}, expected exit code {}{}",
                    code.map_or("-".into(), |c| c.to_string()),
                    if may_succeed { " or 0" } else { "" }
                ));
            }
        }

        // With the continue policy, a rank's own failure, or a lost node's (its own ranks:
        // the proxies below it are adopted by rlaunch), in an endless phase is told to every
        // other rank, which then ends by itself.
        let failed: Vec<u32> = match trial.fault {
            Fault::KillRank | Fault::RankExit | Fault::RankSignal | Fault::RankPmiClose => {
                vec![trial.rank]
            }
            f if f.aims_at_node() => {
                (0..t.ranks()).filter(|&r| t.node_of(r) == trial.node).collect()
            }
            _ => Vec::new(),
        };
        let endless = matches!(trial.phase, Phase::Fence | Phase::Output | Phase::Stdin);
        verdict.told_due =
            self.policy == Policy::Continue && !failed.is_empty() && endless && !may_succeed;
        if verdict.told_due {
            use rlaunch_protocol::{ids::Gid, stacks::RankSet};
            let mut want = RankSet::default();
            for &r in &failed {
                want.add(&RankSet::of(Gid(r)));
            }
            let want = want.to_string();
            let untold = (0..t.ranks())
                .filter(|r| !failed.contains(r))
                .find(|&r| files.told(r).as_deref() != Some(want.as_str()));
            if let Some(r) = untold {
                verdict.untold = Some(format!(
                    "rank {r} was told {:?}, not ranks {want}",
                    files.told(r).unwrap_or_default()
                ));
            }
        }
        if trial.fault == Fault::KillRlaunch && verdict.landed {
            return;
        }
        let report = match report {
            Ok(report) => report,
            Err(e) => {
                verdict.lost_output = Some(e);
                return;
            }
        };
        // Ranks cut off with the node (or rlaunch) struck may lose what they wrote last;
        // every other rank's lines must all be there.
        let cut = |rank: u32| match trial.fault {
            Fault::StopRlaunch => true,
            f if f.aims_at_node() => verdict.landed && t.under(t.node_of(rank), trial.node),
            _ => false,
        };
        for rank in 0..t.ranks() {
            if cut(rank) {
                continue;
            }
            let written = files.lines(rank);
            let shown = if trial.phase == Phase::Stdin { STDIN_RANK } else { rank };
            let arrived = report.lines.get(&shown).copied().unwrap_or(0);
            if arrived < written {
                verdict.lost_output =
                    Some(format!("rank {rank} wrote {written} lines, {arrived} arrived"));
                return;
            }
        }
    }
}

/// For polls: a sign (pid 0) that the job ended while the target was awaited.
fn job_done(job: &mut Job) -> Option<i32> {
    job.status().map(|_| 0)
}
