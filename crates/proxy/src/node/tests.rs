//! The Node driven without processes: a Node built for a small launch, ranks entered in its
//! table as if started (no process behind them), PMI calls and its parent's frames fed in,
//! and what it sends up and answers checked; and a whole Node run through its loop in a world
//! whose ranks the test plays (their pipes and PMI sockets real, their pids no process has,
//! their ends sent by the test).

use rlaunch_protocol::control::{Job, Launch, NodePlan, RankPlan, Segment};
use rlaunch_protocol::ids::Gid;

use rlaunch_protocol::ids::ExitOutcome;
use rlaunch_tree::credit::Queued;

use super::start::Parts;
use super::*;
use crate::pmi::{answer_channel, AnswerRx, PmiAnswer};
use crate::ranks::PmiState;
use crate::spawn::Spawner;

/// A Node holding ranks 0 and 1 of a 2-rank job, none started, and what it sends its parent.
fn node() -> (Node, mpsc::UnboundedReceiver<Up>) {
    let (node, ends) = node_in(Box::new(NoRanks));
    (node, ends.up)
}

/// A world in which no rank starts.
struct NoRanks;

impl Spawner for NoRanks {
    fn start_all(&mut self, batch: Vec<crate::spawn::Spawn>) -> Vec<Result<i32, ExitOutcome>> {
        batch.iter().map(|_| Err(ExitOutcome::SpawnFailed { errno: nix::libc::EPERM })).collect()
    }
}

/// The other ends of a Node's channels, as its parent, its runtime and its world hold them.
struct Ends {
    up: mpsc::UnboundedReceiver<Up>,
    data: mpsc::UnboundedReceiver<Queued>,
    events: mpsc::UnboundedSender<Event>,
    events_rx: mpsc::UnboundedReceiver<Event>,
    pmi_rx: mpsc::UnboundedReceiver<(PmiPeer, PmiCall)>,
    probes: tokio::sync::watch::Sender<u32>,
}

/// [`node`], its ranks started by `spawner`, and every other end of its channels.
fn node_in(spawner: Box<dyn Spawner>) -> (Node, Ends) {
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
    let launch = Launch { job, node: plan, late: false, top: true };
    let (control, up) = mpsc::unbounded_channel();
    let (data_tx, data) = mpsc::unbounded_channel();
    let (abandon, _) = tokio::sync::watch::channel(false);
    let (shed_output, _) = tokio::sync::watch::channel(false);
    let (events, events_rx) = mpsc::unbounded_channel();
    let closed = events.clone();
    let outputs = Outputs::start(data_tx.clone(), None, None, move |end| {
        let _ = closed.send(Event::OutputClosed(end));
    })
    .expect("an epoll set");
    let (pmi_calls, pmi_rx) = mpsc::unbounded_channel();
    let (probes_tx, probes) = tokio::sync::watch::channel(0);
    let up_channels = Upstream { control, data: data_tx, abandon, shed_output, rehome: None };
    let parts = Parts {
        up: up_channels,
        outputs,
        events: events.clone(),
        pmi_calls,
        probes,
        spawner,
        sweeps: false,
    };
    let node = Node::new(launch, 0, "rlaunch-proxy".into(), None, parts);
    (node, Ends { up, data, events, events_rx, pmi_rx, probes: probes_tx })
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

/// A rank the test plays: its ends of what the Node made for it (its output pipes' write
/// ends, its end of the PMI socket), its pid (one no process has) and its environment.
struct Played {
    pid: i32,
    env: Vec<(&'static str, String)>,
    stdout: std::fs::File,
    stderr: std::fs::File,
    pmi: tokio::io::BufReader<tokio::net::UnixStream>,
}

/// A world whose ranks are played by the test: each started rank is handed over on `started`.
struct Players {
    next_pid: i32,
    started: mpsc::UnboundedSender<Played>,
}

impl Spawner for Players {
    fn start_all(&mut self, batch: Vec<crate::spawn::Spawn>) -> Vec<Result<i32, ExitOutcome>> {
        use std::os::fd::BorrowedFd;
        // SAFETY: each descriptor is the prepared rank's own, open until this returns.
        let dup = |fd| unsafe { BorrowedFd::borrow_raw(fd) }.try_clone_to_owned().expect("dup");
        batch
            .into_iter()
            .map(|spawn| {
                let pid = self.next_pid;
                self.next_pid -= 1;
                let pmi = std::os::unix::net::UnixStream::from(dup(spawn.keep.expect("PMI_FD")));
                pmi.set_nonblocking(true).expect("non-blocking");
                let pmi = tokio::net::UnixStream::from_std(pmi).expect("registered");
                let played = Played {
                    pid,
                    env: spawn.env.clone(),
                    stdout: dup(spawn.stdout).into(),
                    stderr: dup(spawn.stderr).into(),
                    pmi: tokio::io::BufReader::new(pmi),
                };
                self.started.send(played).expect("the test plays it");
                Ok(pid)
            })
            .collect()
    }
}

impl Played {
    /// Sends a PMI-1 command and reads the answer's line.
    async fn pmi(&mut self, command: &str) -> String {
        use tokio::io::{AsyncBufReadExt, AsyncWriteExt};
        self.pmi.get_mut().write_all(format!("{command}\n").as_bytes()).await.expect("sent");
        let mut line = String::new();
        self.pmi.read_line(&mut line).await.expect("an answer");
        line
    }

    fn var(&self, name: &str) -> Option<&str> {
        self.env.iter().find(|(n, _)| *n == name).map(|(_, v)| v.as_str())
    }
}

#[tokio::test(flavor = "current_thread")]
async fn a_whole_node_runs_its_ranks_played_by_the_test_to_its_record() {
    let (started_tx, mut started) = mpsc::unbounded_channel();
    let players = Players { next_pid: i32::MAX - 10, started: started_tx };
    let (mut node, ends) = node_in(Box::new(players));
    // rlaunch gave the frameworks' rendezvous: rank 0's proxy chooses none.
    let rendezvous = rlaunch_protocol::control::Rendezvous {
        addr: "127.0.0.1".into(),
        port: 29500,
        jax_port: 29501,
    };
    Arc::make_mut(&mut node.job).rendezvous = Some(rendezvous);
    let Ends { mut up, mut data, events, events_rx, pmi_rx, probes } = ends;
    let (ended_tx, ended) = mpsc::unbounded_channel();
    let (_told, told_to_go) = mpsc::unbounded_channel();
    let outside = world::Outside { ended: procs::Reaper::Sent(ended), told_to_go };
    // The parent measured this node's clock: its record goes up as soon as it is done.
    probes.send(rlaunch_tree::children::CLOCK_PROBES).expect("probes watched");
    let script = async move {
        let mut ranks = vec![started.recv().await.expect("rank 0"), started.recv().await.unwrap()];
        for (i, rank) in ranks.iter().enumerate() {
            assert_eq!(
                (rank.var("PMI_RANK"), rank.var("PMI_SIZE")),
                (Some(&*i.to_string()), Some("2"))
            );
        }
        let started = up.recv().await;
        let this = rlaunch_protocol::ids::NodeId(0);
        assert!(matches!(started, Some(Up::Started { node }) if node == this), "{started:?}");
        for rank in &mut ranks {
            let init = rank.pmi("cmd=init pmi_version=1 pmi_subversion=1").await;
            assert_eq!(init, "cmd=response_to_init pmi_version=1 pmi_subversion=1 rc=0\n");
        }
        use std::io::Write;
        ranks[0].stdout.write_all(b"hello from 0\n").expect("written");
        ranks[1].stderr.write_all(b"warning from 1\n").expect("written");
        // Both in the fence: the node's part goes up; the job's pairs come down to both.
        let (zero, one) = ranks.split_at_mut(1);
        let (barrier_0, barrier_1) = (zero[0].pmi("cmd=barrier_in"), one[0].pmi("cmd=barrier_in"));
        let parent = async {
            match up.recv().await {
                Some(Up::FenceIn { epoch: 0, pairs }) => assert!(pairs.is_empty()),
                other => panic!("expected the node's FenceIn, got {other:?}"),
            }
            let pairs = vec![("card".to_string(), "v9".to_string())];
            events.send(Event::Down(Down::FenceOut { epoch: 0, pairs })).expect("the node runs");
        };
        let (out_0, out_1, ()) = tokio::join!(barrier_0, barrier_1, parent);
        assert_eq!((out_0.as_str(), out_1.as_str()), ("cmd=barrier_out\n", "cmd=barrier_out\n"));
        let got = ranks[1].pmi("cmd=get kvsname=j key=card").await;
        assert_eq!(got, "cmd=get_result rc=0 msg=success value=v9\n");
        for rank in &mut ranks {
            assert_eq!(rank.pmi("cmd=finalize").await, "cmd=finalize_ack\n");
        }
        // The ranks exit: their descriptors close, and the world says how they ended.
        let outcomes = [ExitOutcome::Exited(0), ExitOutcome::Exited(3)];
        for (rank, outcome) in ranks.into_iter().zip(outcomes) {
            let end =
                procs::Ended { pid: rank.pid, outcome, user_us: 7, system_us: 0, maxrss_kib: 0 };
            drop(rank);
            ended_tx.send(end).expect("the node runs");
        }
        let mut verdicts = Vec::new();
        while verdicts.len() < 2 {
            let up = up.recv().await.expect("the node's verdicts");
            if let Up::RankExited { rank, pid, outcome, usage, .. } = up {
                verdicts.push((rank, pid as i32, outcome, usage.user_us));
            }
        }
        verdicts.sort_by_key(|v| v.0);
        let pid = |n: i32| i32::MAX - 10 - n;
        let want = [(Gid(0), pid(0), outcomes[0], 7), (Gid(1), pid(1), outcomes[1], 7)];
        assert_eq!(verdicts, want);
        // The output, the ranks' starts ahead of it, and the node's record last.
        let mut seen = Vec::new();
        let record = loop {
            match data.recv().await.expect("the record comes").up {
                Up::NodeDone { node, record } => break (node, record),
                Up::RankStarted { rank, pid, .. } => seen.push(format!("{rank} started {pid}")),
                Up::Output { rank, stream, data } => {
                    seen.push(format!("{rank} {stream:?} {}", String::from_utf8_lossy(&data)))
                }
                _ => {}
            }
        };
        seen.sort();
        let want = [
            "0 Stdout hello from 0\n".to_string(),
            format!("0 started {}", pid(0)),
            "1 Stderr warning from 1\n".to_string(),
            format!("1 started {}", pid(1)),
        ];
        assert_eq!(seen, want);
        let (node, record) = record;
        assert_eq!(
            (node, record.host.as_str(), record.fences.len()),
            (rlaunch_protocol::ids::NodeId(0), "n0", 1)
        );
        assert!(record.ranks.iter().all(|r| r.pmi_init.is_some()), "{:?}", record.ranks);
    };
    let run = async { tokio::join!(node.run(events_rx, pmi_rx, outside), script) };
    let limit = Duration::from_secs(60);
    let (code, ()) = tokio::time::timeout(limit, run).await.expect("the node ends within 60 s");
    assert_eq!(code, 0);
}

#[tokio::test(flavor = "current_thread")]
async fn a_verdict_the_pmix_server_held_is_given_when_the_server_is_lost() {
    let (mut node, mut ends) = node_in(Box::new(NoRanks));
    let (service, mut commands) = pmix::PmixService::detached("j", 2);
    node.pmix = service;
    let pid = i32::MAX - 20;
    let local = node.ranks.add_running(Gid(0), 0, pid, PmiState::Unclaimed);
    let proc = crate::pmix::wire::Proc { nspace: "j".into(), rank: 0 };
    let connected = crate::pmix::Event::Connected { proc };
    node.handle(Event::Pmix(crate::pmix::HostNews::Event(connected)));
    // It exits 0 without having been heard to finalize: the server is asked to catch up first.
    let exited = ExitOutcome::Exited(0);
    let end = procs::Ended { pid, outcome: exited, user_us: 0, system_us: 0, maxrss_kib: 0 };
    node.process_ended(end);
    assert!(matches!(commands.try_recv(), Ok(crate::pmix::Command::Sync { .. })));
    assert_eq!(node.ranks.get(local).state, crate::ranks::RankState::Running, "held");
    // The server dies before it answers: the rank is judged all the same, and not as one
    // that left without finalizing (the server can no longer say).
    node.handle(Event::Pmix(crate::pmix::HostNews::Gone("killed".into())));
    let mut verdicts = Vec::new();
    while let Ok(up) = ends.up.try_recv() {
        match up {
            Up::RankExited { rank, outcome, unfinalized, .. } => {
                verdicts.push((rank, outcome, unfinalized))
            }
            Up::Notice { text, .. } => assert!(text.contains("killed"), "{text}"),
            other => panic!("unexpected {other:?}"),
        }
    }
    assert_eq!(verdicts, [(Gid(0), exited, false)]);
    assert!(!node.pmix.serving() && node.swept, "the node swept once its last rank was judged");
}

#[tokio::test(flavor = "current_thread")]
async fn a_failure_waits_for_the_verdict_the_pmix_server_holds_of_an_earlier_end() {
    let (mut node, mut ends) = node_in(Box::new(NoRanks));
    let (service, mut commands) = pmix::PmixService::detached("j", 2);
    node.pmix = service;
    // Pids no process has: both ranks' processes are gone (reaped).
    let (left, failed) = (i32::MAX - 21, i32::MAX - 22);
    node.ranks.add_running(Gid(0), 0, failed, PmiState::Unclaimed);
    node.ranks.add_running(Gid(1), 0, left, PmiState::Unclaimed);
    let proc = crate::pmix::wire::Proc { nspace: "j".into(), rank: 1 };
    let connected = crate::pmix::Event::Connected { proc };
    node.handle(Event::Pmix(crate::pmix::HostNews::Event(connected)));
    let ended =
        |pid, outcome| procs::Ended { pid, outcome, user_us: 0, system_us: 0, maxrss_kib: 0 };
    // Rank 1 left PMIx without finalizing and exited 0: the server is asked to catch up.
    node.process_ended(ended(left, ExitOutcome::Exited(0)));
    let Ok(crate::pmix::Command::Sync { id }) = commands.try_recv() else {
        panic!("the server is asked to catch up")
    };
    // Rank 0's fence failed for it (libpmix: PARTIAL SUCCESS), and it exited 1: its failure
    // is not the first, so it waits.
    node.process_ended(ended(failed, ExitOutcome::Exited(1)));
    let Ok(crate::pmix::Command::Sync { id: deferral }) = commands.try_recv() else {
        panic!("the failure waits for the server to catch up")
    };
    let synced = |id| Event::Pmix(crate::pmix::HostNews::Event(crate::pmix::Event::Synced { id }));
    node.handle(synced(deferral));
    assert!(ends.up.try_recv().is_err(), "nothing is judged while the server holds a verdict");
    node.handle(synced(id));
    let mut verdicts = Vec::new();
    while let Ok(up) = ends.up.try_recv() {
        if let Up::RankExited { rank, outcome, unfinalized, .. } = up {
            verdicts.push((rank, outcome, unfinalized));
        }
    }
    let first = (Gid(1), ExitOutcome::Exited(0), true);
    assert_eq!(verdicts, [first, (Gid(0), ExitOutcome::Exited(1), false)]);
}

#[tokio::test(flavor = "current_thread")]
async fn failures_are_judged_in_the_order_the_pmix_server_lost_their_connections() {
    let (mut node, mut ends) = node_in(Box::new(NoRanks));
    let (service, mut commands) = pmix::PmixService::detached("j", 2);
    node.pmix = service;
    let pids = [i32::MAX - 23, i32::MAX - 24];
    for (rank, pid) in pids.into_iter().enumerate() {
        node.ranks.add_running(Gid(rank as u32), 0, pid, PmiState::Unclaimed);
    }
    let news = |event| Event::Pmix(crate::pmix::HostNews::Event(event));
    let proc = |rank| crate::pmix::wire::Proc { nspace: "j".into(), rank };
    let ended = |pid| procs::Ended {
        pid,
        outcome: ExitOutcome::Exited(1),
        user_us: 0,
        system_us: 0,
        maxrss_kib: 0,
    };
    // Reaped rank 0 first (fork order), though rank 1 went first: libpmix lost its
    // connection first, and rank 0's fence failed for it.
    node.process_ended(ended(pids[0]));
    node.process_ended(ended(pids[1]));
    let Ok(crate::pmix::Command::Sync { id }) = commands.try_recv() else {
        panic!("the failures wait for the server to catch up")
    };
    assert!(commands.try_recv().is_err(), "one Sync for all the failures waiting");
    node.handle(news(crate::pmix::Event::Lost { proc: proc(1) }));
    node.handle(news(crate::pmix::Event::Lost { proc: proc(0) }));
    assert!(ends.up.try_recv().is_err(), "nothing is judged before the server caught up");
    node.handle(news(crate::pmix::Event::Synced { id }));
    let mut verdicts = Vec::new();
    while let Ok(up) = ends.up.try_recv() {
        if let Up::RankExited { rank, .. } = up {
            verdicts.push(rank);
        }
    }
    assert_eq!(verdicts, [Gid(1), Gid(0)]);
}

#[test]
fn a_rank_that_does_not_catch_a_terminal_stop_is_sent_sigstop() {
    use nix::sys::signal::Signal;
    // A shell that traps SIGTSTP catches it; `sleep` does not.
    let mut trapping = std::process::Command::new("/bin/sh")
        .args(["-c", "trap 'echo' TSTP; echo ready; read line"])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut ready = String::new();
    std::io::BufRead::read_line(
        &mut std::io::BufReader::new(trapping.stdout.as_mut().unwrap()),
        &mut ready,
    )
    .unwrap();
    let mut plain = std::process::Command::new("sleep").arg("30").spawn().unwrap();
    let (trapping_pid, plain_pid) = (trapping.id() as i32, plain.id() as i32);
    assert_eq!(super::stop_as(trapping_pid, Signal::SIGTSTP), Signal::SIGTSTP);
    assert_eq!(super::stop_as(plain_pid, Signal::SIGTSTP), Signal::SIGSTOP);
    assert_eq!(super::stop_as(plain_pid, Signal::SIGTERM), Signal::SIGTERM);
    for child in [&mut trapping, &mut plain] {
        child.kill().unwrap();
        child.wait().unwrap();
    }
}
