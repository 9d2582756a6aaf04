//! Whole jobs through the Root's loop (`run_in`) in a world of in-memory links: what the
//! proxies are sent, the output files, the report and the exit status.

use rlaunch_protocol::ids::Gid;

use nix::sys::signal::Signal;
use rlaunch_protocol::control::{DownFrame, LinkDown, SpawnCmd, SpawnOutcome, SpawnRequest};
use rlaunch_protocol::ids::{ExitOutcome, Stream};

use super::fake::*;
use super::{ended, plan_of};
use crate::job::*;

#[tokio::test(flavor = "current_thread")]
async fn a_whole_job_runs_over_in_memory_links() {
    let dir = Scratch::new("whole");
    let plan = two_nodes_to_files(dir.path());
    let (world, fakes, _outside) = world(&["n0", "n1"]);
    let proxies = fakes.into_iter().enumerate().map(|(i, mut proxy)| async move {
        let rank = Gid(i as u32);
        let node = proxy.launched(&format!("n{i}")).await;
        proxy.send(Up::RankStarted { rank, pid: 100 + rank.0, cpus: None, gpus: None });
        let line = format!("hello from {i}\n").into_bytes();
        proxy.send(Up::Output { rank, stream: Stream::Stdout, data: line });
        proxy.send(Up::OutputEnd { rank, stream: Stream::Stdout });
        // The fence completes once both top proxies are in, with every pair.
        let pairs = vec![(format!("k{i}"), format!("v{i}"))];
        proxy.send(Up::FenceIn { epoch: 0, pairs });
        match proxy.next().await {
            Down::FenceOut { epoch: 0, mut pairs } => {
                pairs.sort();
                let want = [("k0", "v0"), ("k1", "v1")].map(|(k, v)| (k.into(), v.into()));
                assert_eq!(pairs, want, "node {i}");
            }
            other => panic!("expected the fence's end, got {other:?}"),
        }
        proxy.send(ended(rank.0, ExitOutcome::Exited(0)));
        proxy.done(node);
    });
    let (code, _) =
        within(async { tokio::join!(run_in(plan, world), futures_join(proxies)) }).await;
    assert_eq!(code, 0);
    for i in 0..2 {
        let out = std::fs::read_to_string(dir.path().join(format!("rank.{i}/stdout")));
        assert_eq!(out.expect("rank's output file"), format!("hello from {i}\n"));
    }
    let report = read_report(dir.path());
    assert_eq!(report["job"]["exit_code"], 0);
    assert_eq!(report["job"]["fences"], 1);
    let pids: Vec<_> =
        report["ranks"].as_array().expect("ranks").iter().map(|r| &r["pid"]).collect();
    assert_eq!(pids, [100, 101]);
}

#[tokio::test(flavor = "current_thread")]
async fn a_proxy_whose_link_ends_before_it_is_done_is_lost_and_the_rest_torn_down() {
    let dir = Scratch::new("lost");
    let plan = two_nodes_to_files(dir.path());
    let grace = plan.job.kill_grace_ms;
    let (world, mut fakes, _outside) = world(&["n0", "n1"]);
    let (mut lasting, mut lost) = (fakes.remove(0), fakes.remove(0));
    let script = async move {
        let node = lasting.launched("n0").await;
        lost.launched("n1").await;
        drop(lost);
        match lasting.next().await {
            Down::Terminate { grace_ms } => assert_eq!(grace_ms, grace),
            other => panic!("expected the teardown, got {other:?}"),
        }
        lasting.send(ended(0, ExitOutcome::Signaled(15)));
        lasting.done(node);
    };
    let (code, _) = within(async { tokio::join!(run_in(plan, world), script) }).await;
    assert_eq!(code, 255);
    let report = read_report(dir.path());
    assert_eq!(report["job"]["cause"], "lost proxy on n1 (its connection closed)");
}

#[tokio::test(flavor = "current_thread")]
async fn signals_go_down_to_every_proxy_and_stdin_to_the_rank_that_reads_it() {
    let mut plan = plan_of(&[1, 1]);
    plan.job.stdin = StdinTarget::Rank(1);
    let (world, fakes, outside) = world(&["n0", "n1"]);
    let proxies = fakes.into_iter().enumerate().map(|(i, mut proxy)| {
        let (signals, stdin) = (outside.signals.clone(), outside.stdin.clone());
        async move {
            let node = proxy.launched(&format!("n{i}")).await;
            if i == 1 {
                // Only rank 1 reads stdin: its proxy alone gets it.
                stdin.send(Some(b"abc".to_vec())).await.expect("stdin");
                match proxy.next().await {
                    Down::Stdin { seq, data } => {
                        assert_eq!(data, b"abc");
                        proxy.send(Up::StdinAck { seq, node: NodeId(1) });
                    }
                    other => panic!("expected stdin, got {other:?}"),
                }
                stdin.send(None).await.expect("stdin's end");
            }
            // Its end goes to every proxy (a rank that reads none has its stdin closed).
            assert!(matches!(proxy.next().await, Down::StdinEof));
            if i == 1 {
                signals.send(Signal::SIGTERM).expect("signal");
            }
            match proxy.next().await {
                Down::Signal { signo } => assert_eq!(signo, Signal::SIGTERM as i32),
                other => panic!("expected the signal, got {other:?}"),
            }
            proxy.send(ended(i as u32, ExitOutcome::Signaled(Signal::SIGTERM as i32)));
            proxy.done(node);
        }
    });
    let (code, _) =
        within(async { tokio::join!(run_in(plan, world), futures_join(proxies)) }).await;
    // Every rank ended of the signal rlaunch forwarded: 128 + 15.
    assert_eq!(code, 143);
}

#[tokio::test(flavor = "current_thread")]
async fn proxies_that_dial_in_go_where_the_tree_puts_them_and_the_job_waits_for_the_launcher() {
    // n1 is n0's child: it dials rlaunch first, and is sent on once n0 listens.
    let mut plan = plan_of(&[1, 1]);
    plan.job.stdin = StdinTarget::None;
    let n1 = plan.roots.pop().expect("two roots");
    plan.roots[0].children.push(n1);
    dialing(&mut plan);
    let (world, mut fakes, outside) = dialing_world(&["n1", "n0"]);
    let (mut n1, mut n0) = (fakes.remove(0), fakes.remove(0));
    let script = async move {
        let node = n0.launched("n0").await;
        n0.send(Up::Listening { node, address: "127.0.0.1:7001".into() });
        match n1.frame().await {
            DownFrame::Link(LinkDown::Redirect { to }) => assert_eq!(to, "127.0.0.1:7001"),
            other => panic!("expected n1 sent on to n0, got {other:?}"),
        }
        // n0's subtree (n1 with it) runs both ranks; rlaunch hears of them through n0.
        n0.send(ended(1, ExitOutcome::Exited(0)));
        n0.send(ended(0, ExitOutcome::Exited(0)));
        n0.done(node);
        outside.ended.send(launcher_ended(ExitOutcome::Exited(0))).expect("the Root runs");
    };
    let (code, _) = within(async { tokio::join!(run_in(plan, world), script) }).await;
    assert_eq!(code, 0);
}

#[tokio::test(flavor = "current_thread")]
async fn a_launcher_that_ends_before_a_proxy_called_back_loses_that_proxy_and_ends_the_job() {
    let dir = Scratch::new("dial-lost");
    let mut plan = two_nodes_to_files(dir.path());
    dialing(&mut plan);
    // Only n0's proxy calls back.
    let (world, mut fakes, outside) = dialing_world(&["n0"]);
    let mut n0 = fakes.remove(0);
    let script = async move {
        let node = n0.launched("n0").await;
        outside.ended.send(launcher_ended(ExitOutcome::Exited(1))).expect("the Root runs");
        assert!(matches!(n0.next().await, Down::Terminate { .. }));
        n0.send(ended(0, ExitOutcome::Signaled(15)));
        n0.done(node);
    };
    let (code, _) = within(async { tokio::join!(run_in(plan, world), script) }).await;
    assert_eq!(code, 255);
    let report = read_report(dir.path());
    let cause = "lost proxy on n1 (srun exited with code 1 before its proxy called back)";
    assert_eq!(report["job"]["cause"], cause);
}

/// A spawn of one rank onto `n9`, a host the job had no proxy on, as rank 0 asks with `tag`.
fn spawn_onto_n9(tag: Option<&str>) -> Up {
    let cmd = SpawnCmd {
        exe: "./child".into(),
        args: vec![],
        nprocs: 1,
        info: vec![("add-host".into(), "n9".into())],
        env: vec![],
    };
    let request = SpawnRequest { cmds: vec![cmd], preput: vec![] };
    Up::Spawn { rank: Gid(0), tag: tag.map(String::from), request }
}

/// Inside an allocation, a spawn onto a host with no proxy starts one there with a launcher
/// (srun) of its own: it dials in as the first proxies did, finds its late launch waiting,
/// and the job waits for both launchers.
#[tokio::test(flavor = "current_thread")]
async fn a_spawn_in_a_dialing_launch_starts_its_late_proxy_through_the_launcher() {
    let mut plan = plan_of(&[1]);
    plan.job.stdin = StdinTarget::None;
    dialing(&mut plan);
    let (world, mut fakes, mut late, outside) = dialing_world_with(&["n0"], &["n9"]);
    let (mut parent, mut child) = (fakes.remove(0), late.remove(0));
    let script = async move {
        let node = parent.launched("n0").await;
        parent.send(spawn_onto_n9(None));
        let late_node = child.launched("n9").await;
        assert!(matches!(child.next().await, Down::Spawn(_)));
        child.send(Up::SpawnStarted { job: 1, node: late_node, refused: None });
        assert!(matches!(parent.next().await, Down::Spawn(_)));
        assert!(matches!(
            parent.next().await,
            Down::SpawnAnswer { outcome: SpawnOutcome::Started { .. }, .. }
        ));
        child.send(ended(1, ExitOutcome::Exited(0)));
        child.done(late_node);
        parent.send(ended(0, ExitOutcome::Exited(0)));
        parent.done(node);
        outside.ended.send(launcher_ended(ExitOutcome::Exited(0))).expect("the Root runs");
        let late_ended = process_ended(LATE_LAUNCHER_PID, ExitOutcome::Exited(0));
        outside.ended.send(late_ended).expect("the Root runs");
    };
    let (code, _) = within(async { tokio::join!(run_in(plan, world), script) }).await;
    assert_eq!(code, 0);
}

/// The launcher of a proxy started during the run ends before its proxy called back: the
/// spawn that wanted it fails, saying why, and the job goes on.
#[tokio::test(flavor = "current_thread")]
async fn a_late_launcher_that_ends_before_its_proxy_called_back_fails_the_spawn() {
    let mut plan = plan_of(&[1]);
    plan.job.stdin = StdinTarget::None;
    dialing(&mut plan);
    let (world, mut fakes, outside) = dialing_world(&["n0"]);
    let mut parent = fakes.remove(0);
    let script = async move {
        let node = parent.launched("n0").await;
        parent.send(spawn_onto_n9(None));
        assert!(matches!(parent.next().await, Down::Spawn(_)));
        let late_ended = process_ended(LATE_LAUNCHER_PID, ExitOutcome::Exited(1));
        outside.ended.send(late_ended).expect("the Root runs");
        match parent.next().await {
            Down::SpawnAnswer {
                rank: Gid(0), outcome: SpawnOutcome::Refused { reason }, ..
            } => {
                let why = "cannot start a proxy on n9: srun exited with code 1 before its proxy \
                           called back";
                assert_eq!(reason, why);
            }
            other => panic!("expected the spawn refused, got {other:?}"),
        }
        parent.send(ended(0, ExitOutcome::Exited(0)));
        parent.done(node);
        outside.ended.send(launcher_ended(ExitOutcome::Exited(0))).expect("the Root runs");
    };
    let (code, _) = within(async { tokio::join!(run_in(plan, world), script) }).await;
    assert_eq!(code, 0);
}

/// rlaunch reads at most [`crate::job::stdin_flow::WINDOW`] chunks of its stdin ahead of the ranks: the next is
/// read, and sent, only once an earlier one was written into every rank that reads it.
#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn stdin_goes_down_in_a_window_that_acknowledgements_reopen() {
    let mut plan = plan_of(&[1]);
    plan.job.stdin = StdinTarget::Rank(0);
    let (world, mut fakes, outside) = world(&["n0"]);
    let mut proxy = fakes.remove(0);
    let window = crate::job::stdin_flow::WINDOW as u64;
    let feeder = async move {
        for i in 0..=window {
            outside.stdin.send(Some(vec![i as u8])).await.expect("stdin is read");
        }
        outside.stdin.send(None).await.expect("stdin's end is read");
    };
    let script = async move {
        let node = proxy.launched("n0").await;
        for seq in 1..=window {
            match proxy.next().await {
                Down::Stdin { seq: got, data } => {
                    assert_eq!((got, data), (seq, vec![seq as u8 - 1]))
                }
                other => panic!("expected stdin, got {other:?}"),
            }
        }
        // The window is full: the next chunk waits, however long the rank takes (the clock
        // is paused: a second passes only once everything is idle).
        let more = tokio::time::timeout(Duration::from_secs(1), proxy.next()).await;
        assert!(more.is_err(), "a chunk past the window: {more:?}");
        proxy.send(Up::StdinAck { seq: 1, node: NodeId(0) });
        match proxy.next().await {
            Down::Stdin { seq, data } => assert_eq!((seq, data), (window + 1, vec![window as u8])),
            other => panic!("expected the chunk the acknowledgement let through, got {other:?}"),
        }
        // Full again: even stdin's end waits for room.
        let more = tokio::time::timeout(Duration::from_secs(1), proxy.next()).await;
        assert!(more.is_err(), "stdin's end past the window: {more:?}");
        proxy.send(Up::StdinAck { seq: 2, node: NodeId(0) });
        assert!(matches!(proxy.next().await, Down::StdinEof));
        proxy.send(ended(0, ExitOutcome::Exited(0)));
        proxy.done(node);
    };
    let (code, _, _) = tokio::join!(run_in(plan, world), feeder, script);
    assert_eq!(code, 0);
}

/// MPI_Comm_spawn onto a host the job had no proxy on (`add-host`): the Root starts one there
/// through its world, launched late for the spawned job alone; the parent hears its children
/// started, and their ends and the parent's end the job.
#[tokio::test(flavor = "current_thread")]
async fn a_spawn_onto_a_new_host_starts_a_late_proxy_there() {
    let mut plan = plan_of(&[1]);
    plan.job.stdin = StdinTarget::None;
    let (world, mut fakes, mut late, _outside) = world_with(&["n0"], &["n9"]);
    let (mut parent, mut child) = (fakes.remove(0), late.remove(0));
    let script = async move {
        let node = parent.launched("n0").await;
        parent.send(spawn_onto_n9(Some("t")));
        let late_node = match child.next().await {
            Down::Launch(launch) => {
                assert!(launch.late && launch.node.ranks.is_empty(), "{launch:?}");
                assert_eq!(launch.node.host, "n9");
                launch.node.index
            }
            other => panic!("expected the late proxy's launch, got {other:?}"),
        };
        let spawned = match child.next().await {
            Down::Spawn(spawned) => spawned,
            other => panic!("expected the spawn, got {other:?}"),
        };
        assert_eq!((spawned.job, spawned.first, spawned.size()), (1, 1, 1));
        assert_eq!(spawned.nodes, [(late_node, "n9".to_string())]);
        child.send(Up::SpawnStarted { job: 1, node: late_node, refused: None });
        // Every node hears of the spawn; the parent's then has its answer.
        assert!(matches!(parent.next().await, Down::Spawn(_)));
        match parent.next().await {
            Down::SpawnAnswer { rank: Gid(0), tag, outcome: SpawnOutcome::Started { kvsname } } => {
                assert_eq!((tag.as_deref(), kvsname), (Some("t"), spawned.kvsname.clone()))
            }
            other => panic!("expected the spawn's answer, got {other:?}"),
        }
        child.send(ended(1, ExitOutcome::Exited(0)));
        child.done(late_node);
        parent.send(ended(0, ExitOutcome::Exited(0)));
        parent.done(node);
    };
    let (code, _) = within(async { tokio::join!(run_in(plan, world), script) }).await;
    assert_eq!(code, 0);
}
