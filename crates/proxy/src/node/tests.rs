//! The Node driven without processes: a Node built for a small launch, ranks entered in its
//! table as if started (no process behind them), PMI calls and its parent's frames fed in,
//! and what it sends up and answers checked.

use rlaunch_protocol::control::{Job, Launch, NodePlan, RankPlan, Segment};
use rlaunch_protocol::ids::Gid;

use super::start::Parts;
use super::*;
use crate::pmi::{answer_channel, AnswerRx, PmiAnswer};
use crate::ranks::PmiState;

/// A Node holding ranks 0 and 1 of a 2-rank job, none started, and what it sends its parent.
fn node() -> (Node, mpsc::UnboundedReceiver<Up>) {
    let segment = Segment {
        exe: b"/bin/true".to_vec(),
        args: vec![],
        inherit_env: true,
        env: vec![],
        wdir: b"/".to_vec(),
    };
    let job = Job::simple("j", 2, vec![segment]);
    let ranks = vec![RankPlan { rank: 0, segment: 0 }, RankPlan { rank: 1, segment: 0 }];
    let plan = NodePlan {
        index: rlaunch_protocol::ids::NodeId(0),
        host: "n0".into(),
        fork: true,
        ranks,
        children: vec![],
    };
    let launch = Launch { job, node: plan, late: false };
    let (control, up) = mpsc::unbounded_channel();
    let (data, _) = mpsc::unbounded_channel();
    let (abandon, _) = tokio::sync::watch::channel(false);
    let (shed_output, _) = tokio::sync::watch::channel(false);
    let outputs = Outputs::start(data.clone(), None, None, |_| {}).expect("an epoll set");
    let (events, _) = mpsc::unbounded_channel();
    let (pmi_calls, _) = mpsc::unbounded_channel();
    let (_, probes) = tokio::sync::watch::channel(0);
    let up_channels = Upstream { control, data, abandon, shed_output };
    let parts = Parts { up: up_channels, outputs, events, pmi_calls, probes };
    (Node::new(launch, 0, "rlaunch-proxy".into(), None, parts), up)
}

/// Rank `rank` in the node's table as if started and connected, and its answers' mailbox.
/// Its pid is one no process has (the kernel's pids stop short of it).
fn connected(node: &mut Node, rank: u32) -> (PmiPeer, AnswerRx) {
    let local = node.ranks.add_running(Gid(rank), 0, i32::MAX - rank as i32, PmiState::Open);
    let (answers, rx) = answer_channel();
    node.ranks.get_mut(local).answers = Some(answers);
    (PmiPeer { local, job: 0, rank, appnum: 0 }, rx)
}

/// The next answer a rank's connection would write, if one is there.
async fn answer(rx: &mut AnswerRx) -> Option<PmiAnswer> {
    let next = tokio::time::timeout(Duration::from_secs(1), rx.recv()).await;
    next.ok().flatten().map(|a| *a)
}

#[tokio::test(flavor = "current_thread")]
async fn a_fence_goes_up_once_every_local_rank_is_in_and_its_pairs_come_down_to_all() {
    let (mut node, mut up) = node();
    let (zero, mut zero_answers) = connected(&mut node, 0);
    let (one, mut one_answers) = connected(&mut node, 1);
    let put = |key: &str, value: &str| PmiCall::Put { key: key.into(), value: value.into() };
    node.pmi_call(zero, put("card-0", "a"));
    node.pmi_call(zero, PmiCall::Fence { tag: None });
    assert!(up.try_recv().is_err(), "rank 1 is not in yet");
    node.pmi_call(one, put("card-1", "b"));
    node.pmi_call(one, PmiCall::Fence { tag: Some("t1".into()) });
    match up.try_recv() {
        Ok(Up::FenceIn { epoch: 0, mut pairs }) => {
            pairs.sort();
            assert_eq!(pairs, [("card-0".into(), "a".into()), ("card-1".into(), "b".into())]);
        }
        other => panic!("expected the node's FenceIn, got {other:?}"),
    }
    // The whole job's pairs come down; every rank's fence is answered, with its own tag.
    let pairs = vec![("card-0".into(), "a".into()), ("card-9".into(), "z".into())];
    node.handle(Event::Down(Down::FenceOut { epoch: 0, pairs }));
    assert!(matches!(answer(&mut zero_answers).await, Some(PmiAnswer::Fence { tag: None })));
    assert!(
        matches!(answer(&mut one_answers).await, Some(PmiAnswer::Fence { tag: Some(t) }) if t == "t1")
    );
    // A pair another node put is a local hit now.
    node.pmi_call(zero, PmiCall::Get { key: "card-9".into(), tag: None });
    match answer(&mut zero_answers).await {
        Some(PmiAnswer::Get { key, value, .. }) => {
            assert_eq!((key.as_str(), value), ("card-9", Some("z".into())))
        }
        other => panic!("expected the get's answer, got {other:?}"),
    }
    assert!(up.try_recv().is_err(), "a hit goes nowhere");
}

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn a_parent_silent_past_the_liveness_is_lost_and_the_node_tears_down() {
    let (mut node, _up) = node();
    let silence = node.job.liveness.silence();
    let (at, which) = node.next_deadline().expect("the parent's silence is watched");
    assert_eq!(which, deadline::Deadline::ParentSilent);
    assert_eq!(at, Instant::now() + silence);
    // Stopped (SIGTSTP), the launcher may be stopped too: its silence means nothing.
    node.parent.set_stopped(true);
    assert!(node.next_deadline().is_none(), "nothing else is due");
    node.parent.set_stopped(false);

    // Heard from just before the silence would have run out: the deadline moves, and the
    // one the loop was waiting on finds nothing to do.
    tokio::time::advance(silence - Duration::from_secs(1)).await;
    node.handle(Event::Heard);
    tokio::time::advance(Duration::from_secs(2)).await;
    node.on_deadline(deadline::Deadline::ParentSilent);
    assert!(!node.parent.orphaned() && !node.kill.started());
    let heard = Instant::now() - Duration::from_secs(2);
    assert_eq!(node.next_deadline().map(|(at, _)| at), Some(heard + silence));

    // Then nothing for the whole silence: the parent is lost.
    tokio::time::advance(silence).await;
    node.on_deadline(deadline::Deadline::ParentSilent);
    assert!(node.parent.orphaned(), "the parent is gone");
    assert!(*node.up.abandon.borrow(), "nothing more is written to it");
    // The teardown's own deadline is next; the parent is watched no more.
    let (_, next) = node.next_deadline().expect("the teardown's next step");
    assert_eq!(next, deadline::Deadline::Kill);
}
