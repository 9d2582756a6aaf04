//! The Root driven without processes. A Root built for a small plan is fed the events its
//! loop would take (ranks' ends, the tracker's news, signals, deadlines) and checked by the
//! causes it records and the exit status they give; and whole jobs run through its loop
//! (`run_in`) in a world of in-memory links, with proxies the tests script, checked by what
//! the proxies are sent, the output files, the report and the exit status.

use rlaunch_protocol::ids::Gid;
use std::time::Duration;

use nix::sys::signal::Signal;
use rlaunch_protocol::control::{RankPlan, Segment};
use rlaunch_protocol::ids::ExitOutcome;

use super::*;

mod fake;
mod whole;

/// A job of `size` ranks, all on one forked node, nothing started.
fn plan(size: u32) -> Plan {
    plan_of(&[size])
}

/// A job with `ranks[i]` ranks on node `i` (host `n{i}`), ranks numbered node by node.
fn plan_of(ranks: &[u32]) -> Plan {
    let segment = Segment {
        exe: b"./a".to_vec(),
        args: vec![],
        inherit_env: true,
        env: vec![],
        wdir: b"/w".to_vec(),
    };
    let size = ranks.iter().sum();
    let job = Job::simple("j", size, vec![segment]);
    let (mut roots, mut rank_node, mut first) = (Vec::new(), Vec::new(), 0);
    for (index, &count) in ranks.iter().enumerate() {
        let ranks = (first..first + count).map(|rank| RankPlan { rank, segment: 0 }).collect();
        roots.push(NodePlan {
            index: rlaunch_protocol::ids::NodeId(index as u32),
            host: format!("n{index}"),
            fork: true,
            ranks,
            children: vec![],
        });
        rank_node.resize(rank_node.len() + count as usize, index as u32);
        first += count;
    }
    Plan {
        job,
        node_hosts: roots.iter().map(|r| r.host.clone()).collect(),
        roots,
        rank_node,
        proxy_exe: "rlaunch-proxy".into(),
        output: OutputSpec::default(),
        print_all_exit_codes: false,
        report_bindings: false,
        timeout: None,
        hang_report: crate::options::HangReport::Fences,
        stall_report: None,
        forked: Vec::new(),
        dial: None,
        notices: Vec::new(),
        report: None,
        timeline: None,
        command: vec!["rlaunch".into()],
        started_us: 0,
        universe: crate::place::Universe::new(&[], false, size),
        own_host: "n0".into(),
        forced_remote: false,
        tracker: None,
        restart_backoff: Duration::ZERO,
        spares: Vec::new(),
        orphan_listener: None,
        bcast_files: Vec::new(),
    }
}

fn root(plan: Plan) -> Root {
    let (drop_output, _) = watch::channel(false);
    let (spawned_jobs, _) = std::sync::mpsc::channel();
    Root::new(plan, None, drop_output, spawned_jobs)
}

fn ended(rank: u32, outcome: ExitOutcome) -> Up {
    let usage = Default::default();
    Up::RankExited { rank: Gid(rank), pid: 100 + rank, outcome, unfinalized: false, usage }
}

/// The exit status the Root's first cause gives (0 without one).
fn status(root: &Root) -> i32 {
    root.policy.first().map_or(0, Cause::exit_code)
}

#[tokio::test(flavor = "current_thread")]
async fn the_first_failing_rank_decides_and_a_clean_job_exits_0() {
    let mut clean = root(plan(2));
    clean.handle_up(ended(0, ExitOutcome::Exited(0)));
    clean.handle_up(ended(1, ExitOutcome::Exited(0)));
    assert!(clean.roll.all_ended() && clean.policy.first().is_none());
    assert_eq!(status(&clean), 0);

    let mut failing = root(plan(3));
    failing.handle_up(ended(1, ExitOutcome::Exited(3)));
    failing.handle_up(ended(2, ExitOutcome::Signaled(9)));
    assert!(matches!(failing.policy.causes()[0], Cause::RankFailed { rank: Gid(1), pid: 101, .. }));
    assert_eq!(status(&failing), 3);
    assert!(failing.teardown.started(), "the first failure starts the teardown");
}

#[tokio::test(flavor = "current_thread")]
async fn a_rank_gone_before_it_joined_the_tracker_strands_the_workers_that_did() {
    let mut root = root(plan(3));
    root.turnout = Some(crate::tracker::rabit::Turnout::new(3));
    root.tracker_news(crate::tracker::News::Started { rank: 0 });
    root.handle_up(ended(1, ExitOutcome::Exited(0)));
    assert!(
        matches!(root.policy.causes()[0], Cause::TrackerAbsent { rank: Gid(1) }),
        "{:?}",
        root.policy.causes()
    );
    assert_eq!(status(&root), 255);
}

#[tokio::test(flavor = "current_thread")]
async fn ends_of_a_forwarded_sigint_within_its_grace_are_its_doing() {
    let mut root = root(plan(2));
    root.decide(policy::Event::Signal(Signal::SIGINT));
    // Python's KeyboardInterrupt ends each rank by the signal itself: held, not a failure.
    root.handle_up(ended(0, ExitOutcome::Signaled(Signal::SIGINT as i32)));
    assert!(root.policy.causes().is_empty(), "{:?}", root.policy.causes());
    // Every rank ended of it: the job ends now, interrupted.
    root.handle_up(ended(1, ExitOutcome::Signaled(Signal::SIGINT as i32)));
    assert!(
        matches!(root.policy.causes()[0], Cause::Forwarded(Signal::SIGINT)),
        "{:?}",
        root.policy.causes()
    );
    assert_eq!(status(&root), 130);
}

#[tokio::test(flavor = "current_thread")]
async fn the_earliest_deadline_is_next_and_the_timeout_ends_the_job() {
    let mut plan = plan(1);
    plan.timeout = Some(Duration::from_secs(5));
    let mut root = root(plan);
    let (at, which) = root.next_deadline().expect("the timeout");
    assert_eq!(which, deadline::Deadline::Timeout);
    let left = at.saturating_duration_since(Instant::now());
    assert!(left > Duration::from_secs(4) && left <= Duration::from_secs(5), "{left:?}");
    root.on_deadline(which, false);
    assert!(matches!(root.policy.causes()[0], Cause::TimedOut(t) if t == Duration::from_secs(5)));
    assert_eq!(status(&root), 124);
    // The teardown's own deadlines come next; the timeout is spent.
    assert!(root.next_deadline().is_none_or(|(_, next)| next != deadline::Deadline::Timeout));
}

/// Under continue, a lost interior node fails its own ranks only: the node under it is due
/// (fences wait for it), and once it has not called within the wait it is a lost proxy too.
#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn a_lost_nodes_child_is_due_and_given_up_if_it_never_calls() {
    // n0 (ranks 0, 1) has n1 (rank 2) under it, which has n2 (rank 3).
    let mut plan = plan_of(&[2, 1, 1]);
    let n2 = plan.roots.pop().expect("n2");
    let mut n1 = plan.roots.pop().expect("n1");
    n1.children.push(n2);
    plan.roots[0].children.push(n1);
    plan.job.goes_on = true;
    let mut root = root(plan);
    let (orphans, _calls) = mpsc::unbounded_channel();
    root.orphans = Some(orphans);
    root.listen_for_orphans();
    let adoption = root.plan.job.adoption.clone().expect("rlaunch listens for orphans");
    assert!(adoption.address.starts_with("127.0.0.1:"), "{adoption:?}");

    let (reason, came_up) = ("its proxy was killed by signal 9 (SIGKILL)".into(), true);
    root.handle_up(Up::ProxyLost { host: "n1".into(), reason, came_up });
    assert_eq!(root.dead.to_string(), "2", "n1's own rank");
    assert!(root.orphans_pending(), "n2 may call");
    let (at, which) = root.next_deadline().expect("the wait for n2");
    assert_eq!(which, deadline::Deadline::Orphans);
    // Two heartbeats, the orphan's 3 s of dialing, 2 s.
    let wait =
        rlaunch_protocol::control::Liveness::default().heartbeat() * 2 + Duration::from_secs(5);
    assert_eq!(at.saturating_duration_since(Instant::now()), wait);

    tokio::time::advance(wait).await;
    root.on_deadline(which, false);
    assert_eq!(root.dead.to_string(), "2-3", "n2 did not call");
    assert!(!root.orphans_pending());
    let lost: Vec<_> = (root.policy.causes().iter())
        .filter_map(|c| match c {
            Cause::LostProxy { host, reason, .. } => Some(format!("{host}: {reason}")),
            _ => None,
        })
        .collect();
    let late =
        format!("n2: a proxy above it was lost, and it did not call within {} s", wait.as_secs());
    assert_eq!(lost, ["n1: its proxy was killed by signal 9 (SIGKILL)".to_string(), late]);
}
