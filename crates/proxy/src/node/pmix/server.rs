//! What the node keeps of its PMIx server's clients and open requests, and how it answers
//! what the server says: [`State::on_event`] is a function of (state, event) → actions,
//! driven without a server or a process by unit tests. The reactions of a topic sit in its
//! file, beside the Node's side of it (`names`, `dmodex`, `fence`); the rest (environments,
//! clients, held verdicts, abort, spawn) here. The Node carries the actions out: it owns the
//! host process, the upstream, the rank table and the launched ranks' gate.
//!
//! ```text
//!   host ──Event──► State::on_event(here) ──[Act]──► Node::pmix_act
//!                                                     Host(cmd) ──► host
//!                                                     Up(msg)   ──► root
//!                                                     the rest  ──► ranks, gate, fences
//! ```

use std::collections::{HashMap, HashSet};

use rlaunch_protocol::control::Up;
use rlaunch_protocol::ids::{ExitOutcome, Gid, NodeId};
use tokio::time::Instant;

use super::pending::{Asks, Registered, Spawning};
use crate::pmix::wire::{self, Proc, Status};
use crate::pmix::{Command, Event};
use crate::ranks::Local;

/// A PMIx namespace: a job the node's server knows.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Nspace {
    /// The job's index (the launched job is 0).
    pub(super) job: u32,
    /// The global id of its rank 0: its rank r is `first + r` in every frame.
    pub(super) first: u32,
    pub(super) size: u32,
}

/// What the node knows of its server's clients, and the requests the server waits on.
pub(super) struct State {
    /// The namespaces the server knows (the launched job's, and each spawned job's).
    pub(super) nspaces: HashMap<String, Nspace>,
    /// Fences over other processes than the whole launched job (global ids, sorted) this
    /// node entered: the host's id, answered when the root says the fence is complete.
    pub(super) groups: HashMap<Vec<Gid>, u32>,
    /// Environments of local ranks, by job and rank, until their ranks start.
    pub(super) envs: HashMap<(u32, u32), Vec<Vec<u8>>>,
    /// The host's id of the launched job's fence this node entered, answered when the fence
    /// completes (the fold is the node's, `super::fence`: it outlives the server).
    pub(super) entered: Option<u32>,
    /// The completion of that fence gathered so far, from the parts that came before it.
    pub(super) fence_out: Vec<u8>,
    /// Name-service requests at the root, by the host's id: the key a lookup asked for.
    pub(super) lookups: HashMap<u32, String>,
    /// Jobs spawned here whose ranks wait for their environments, by job index.
    pub(super) spawning: HashMap<u32, Spawning>,
    /// Local clients (global ids) that connected to the server: only they can have
    /// committed data for a direct modex request.
    pub(super) connected: HashSet<Gid>,
    /// Local clients (global ids) that called PMIx_Finalize.
    pub(super) finalized: HashSet<Gid>,
    /// Ranks that exited 0 after connecting, not (yet) known to have finalized: judged once
    /// the host answers the `Sync` of this id (a finalize comes ahead of it on the link).
    pub(super) syncs: HashMap<u32, (Local, ExitOutcome)>,
    pub(super) next_sync: u32,
    /// The `Sync` the failures waiting for their order wait on (see `reap.rs`).
    pub(super) deferral_sync: Option<u32>,
    /// Clients whose connection libpmix lost without a finalize, numbered in the order it
    /// lost them (`Event::Lost`).
    pub(super) lost: HashMap<Gid, u64>,
    /// When the host last said anything. It answers a `Sync` every heartbeat: one silent
    /// for the job's silence timeout is wedged (stopped, or stuck before it is ready), and
    /// is given up as if it had died.
    pub(super) heard: Instant,
    /// Direct modex requests of other nodes that the server is answering.
    pub(super) asks: Asks,
    /// Ranks of the launched job the clients were told failed (`--on-failure continue`).
    pub(super) told_dead: Vec<u32>,
}

/// What of the node the reactions depend on.
pub(super) struct Here<'a> {
    pub(super) node: NodeId,
    /// The launched job's namespace.
    pub(super) jobid: &'a str,
    /// The launched job's ranks here still wait for their environments.
    pub(super) launched_wait: bool,
    /// How many of the launched job's ranks this node runs.
    pub(super) launched_local: usize,
}

/// What the Node does about what the server said.
pub(super) enum Act {
    /// Tell the server.
    Host(Command),
    /// Tell the root.
    Up(Up),
    /// Tell the user, naming this node.
    Notice(String),
    /// The server cannot go on: it is lost, as one that died is.
    Lose(String),
    /// Every environment of the launched job's ranks here is in.
    EnvironmentsIn,
    /// Every environment of a spawned job's ranks here is in: they start.
    Spawned(Spawning),
    /// The server could not take a spawned job.
    SpawnFailed(Spawning, Status),
    /// Every local client entered the launched job's fence; this node's data.
    FenceEntered(Vec<u8>),
    /// A client called PMIx_Abort (the Node knows its pid).
    Abort { rank: Gid, code: i32, msg: String },
    /// A local client connected: it initialised PMI.
    Connected(Gid),
    /// A rank's verdict, held until the server caught up (`State::holds_verdict`).
    Judge(Local, ExitOutcome),
    /// The server caught up with the failures waiting for their order.
    JudgeDeferred,
}

impl State {
    /// A server that knows the launched job (`jobid`, of `size` ranks) only.
    pub(super) fn new(jobid: &str, size: u32, now: Instant) -> State {
        State {
            nspaces: HashMap::from([(jobid.to_string(), Nspace { job: 0, first: 0, size })]),
            groups: HashMap::new(),
            envs: HashMap::new(),
            entered: None,
            fence_out: Vec::new(),
            lookups: HashMap::new(),
            spawning: HashMap::new(),
            connected: HashSet::new(),
            finalized: HashSet::new(),
            syncs: HashMap::new(),
            next_sync: 0,
            deferral_sync: None,
            lost: HashMap::new(),
            heard: now,
            asks: Asks::default(),
            told_dead: Vec::new(),
        }
    }

    /// The global id of a process of a namespace this server knows.
    pub(super) fn gid(&self, proc: &Proc) -> Option<Gid> {
        self.nspaces.get(&proc.nspace).map(|n| Gid(n.first + proc.rank))
    }

    /// The local rank with this global id connected to the server.
    pub(super) fn connected(&self, gid: Gid) -> bool {
        self.connected.contains(&gid)
    }

    /// Whether rank `gid` connected to the server and left without finalizing.
    pub(super) fn left_unfinalized(&self, gid: Gid) -> bool {
        self.connected.contains(&gid) && !self.finalized.contains(&gid)
    }

    /// When the server will have been silent for `silence`.
    pub(super) fn silent_at(&self, silence: std::time::Duration) -> Instant {
        self.heard + silence
    }

    /// The job goes on after a stop: the server's silence while stopped means nothing.
    pub(super) fn resumed(&mut self, now: Instant) {
        self.heard = now;
    }

    /// A sign of life to ask for: the server answers `Synced` from its main thread.
    pub(super) fn sync(&mut self) -> Command {
        let id = self.next_sync;
        self.next_sync = self.next_sync.wrapping_add(1);
        Command::Sync { id }
    }

    /// A `Sync` whose answer judges `verdict`.
    fn sync_for(&mut self, verdict: (Local, ExitOutcome)) -> Command {
        self.syncs.insert(self.next_sync, verdict);
        self.sync()
    }

    /// Rank `gid` (local `local`) was reaped with `outcome`: the `Sync` to send if the server
    /// holds its verdict. One that exited 0 and was not heard to finalize waits for the
    /// server to catch up (`Act::Judge`): its finalize may still be on the link, and so may
    /// its connect. A client's `PMIx_Init` returns only once the server has sent the connect
    /// up, but the node may reap the client before it reads it (chaos: a rank that left PMIx
    /// 12 ms after its start was judged as one that never connected, so clean, and the
    /// others waited for it until the timeout).
    pub(super) fn holds_verdict(
        &mut self,
        gid: Gid,
        local: Local,
        outcome: ExitOutcome,
    ) -> Option<Command> {
        if !outcome.is_success() || self.finalized.contains(&gid) {
            return None;
        }
        Some(self.sync_for((local, outcome)))
    }

    /// A `Sync` for the failures waiting for their order, unless one is on its way: every
    /// lost connection the server reported before its answer is known then.
    pub(super) fn sync_deferral(&mut self) -> Option<Command> {
        if self.deferral_sync.is_some() {
            return None;
        }
        self.deferral_sync = Some(self.next_sync);
        Some(self.sync())
    }

    /// The verdicts the server held: due now, for it goes.
    pub(super) fn take_held(&mut self) -> Vec<(Local, ExitOutcome)> {
        self.syncs.drain().map(|(_, held)| held).collect()
    }

    /// How many environments of job `index` are in.
    fn envs_of(&self, index: u32) -> usize {
        self.envs.keys().filter(|(job, _)| *job == index).count()
    }

    /// What the node does about `event`, heard from the server at `now`.
    pub(super) fn on_event(&mut self, event: Event, here: &Here, now: Instant) -> Vec<Act> {
        self.heard = now;
        match event {
            Event::Ready { version } => {
                tracing::debug!(%version, "PMIx server ready");
                vec![]
            }
            Event::SetupDone { nspace, status } => {
                let spawning = self.spawning.values_mut().find(|s| s.nspace == nspace);
                match (status, spawning) {
                    (wire::SUCCESS, _) => {
                        tracing::debug!(%nspace, "PMIx namespace registered");
                        vec![]
                    }
                    // Its spawner hears, once every rank's environment is in.
                    (_, Some(spawning)) => {
                        spawning.registration.namespace(status);
                        vec![]
                    }
                    _ => vec![Act::Notice(format!(
                        "cannot register {nspace} with PMIx (status {status})"
                    ))],
                }
            }
            Event::Failed { why } => vec![Act::Lose(why)],
            Event::Env { nspace, rank, status, vars } => self.env(here, nspace, rank, status, vars),
            Event::Fence { id, collect: _, procs, data } => {
                let whole = matches!(&procs[..],
                    [p] if p.nspace == here.jobid && p.rank == wire::RANK_WILDCARD);
                match whole {
                    true => self.fence_entered(id, data),
                    false => self.group_fence(here.node, id, &procs, data),
                }
            }
            Event::Dmodex { id, proc } => self.dmodex_request(here.node, id, proc),
            Event::DmodexData { id, status, data } => self.dmodex_data(id, status, data),
            Event::Abort { id, proc, status, mut msg } => {
                // Open MPI 4.1's MPI_Abort always says "N/A": nothing to print.
                if msg == "N/A" {
                    msg.clear();
                }
                let rank = self.gid(&proc).unwrap_or(Gid(proc.rank));
                let done = Command::OpDone { id, status: wire::SUCCESS };
                vec![Act::Abort { rank, code: status, msg }, Act::Host(done)]
            }
            Event::Publish { id, proc, once, pairs } => self.publish(id, proc, once, pairs),
            Event::Unpublish { id, proc, keys } => self.unpublish(id, proc, keys),
            Event::Lookup { id, proc, wait, keys } => self.lookup(id, proc, wait, keys),
            Event::Spawn { id, proc, apps } => self.spawn_request(id, proc, apps),
            Event::Connected { proc } => {
                tracing::debug!(nspace = proc.nspace, rank = proc.rank, "PMIx client connected");
                let Some(gid) = self.gid(&proc) else { return vec![] };
                self.connected.insert(gid);
                vec![Act::Connected(gid)]
            }
            Event::Finalized { proc } => {
                tracing::debug!(nspace = proc.nspace, rank = proc.rank, "PMIx client finalized");
                if let Some(gid) = self.gid(&proc) {
                    self.finalized.insert(gid);
                }
                vec![]
            }
            Event::Synced { id } if self.deferral_sync == Some(id) => {
                self.deferral_sync = None;
                vec![Act::JudgeDeferred]
            }
            Event::Synced { id } => match self.syncs.remove(&id) {
                Some((local, outcome)) => vec![Act::Judge(local, outcome)],
                None => vec![],
            },
            Event::Lost { proc } => {
                tracing::debug!(nspace = proc.nspace, rank = proc.rank, "PMIx client lost");
                if let Some(gid) = self.gid(&proc) {
                    let next = self.lost.len() as u64;
                    self.lost.entry(gid).or_insert(next);
                }
                vec![]
            }
            Event::Notice { text } => {
                tracing::warn!("PMIx server: {text}");
                vec![]
            }
        }
    }

    /// A rank's environment is in (or the status that kept the server from it).
    fn env(
        &mut self,
        here: &Here,
        nspace: String,
        rank: u32,
        status: Status,
        vars: Vec<Vec<u8>>,
    ) -> Vec<Act> {
        if status != wire::SUCCESS {
            tracing::warn!(%nspace, rank, status, "no PMIx environment for a rank");
        }
        let Some(&Nspace { job: index, .. }) = self.nspaces.get(&nspace) else {
            tracing::warn!(%nspace, "a PMIx environment for an unknown namespace");
            return vec![];
        };
        if index == 0 && !here.launched_wait {
            // A late server's (the rank runs already, with what `Late` gave it), or after a
            // teardown gave up on the ranks.
            return vec![];
        }
        self.envs.insert((index, rank), vars);
        if index == 0 {
            let all = self.envs_of(0) == here.launched_local;
            return if all { vec![Act::EnvironmentsIn] } else { vec![] };
        }
        let Some(spawning) = self.spawning.get_mut(&index) else { return vec![] };
        match spawning.registration.env(status) {
            Registered::Waiting => vec![],
            Registered::Ready => {
                vec![Act::Spawned(self.spawning.remove(&index).expect("just seen"))]
            }
            Registered::Failed(status) => {
                let spawning = self.spawning.remove(&index).expect("just seen");
                vec![Act::SpawnFailed(spawning, status)]
            }
        }
    }
}

#[cfg(test)]
pub(super) mod tests {
    use super::*;
    use std::time::Duration;

    pub(in crate::node::pmix) const JOB: &str = "kvs_1_0";

    pub(in crate::node::pmix) fn proc(nspace: &str, rank: u32) -> Proc {
        Proc { nspace: nspace.into(), rank }
    }

    pub(in crate::node::pmix) fn here(launched_wait: bool) -> Here<'static> {
        Here { node: NodeId(3), jobid: JOB, launched_wait, launched_local: 2 }
    }

    pub(in crate::node::pmix) fn env(rank: u32) -> Event {
        Event::Env { nspace: JOB.into(), rank, status: wire::SUCCESS, vars: vec![b"A=1".to_vec()] }
    }

    pub(in crate::node::pmix) fn one(mut acts: Vec<Act>) -> Act {
        assert_eq!(acts.len(), 1, "one action");
        acts.remove(0)
    }

    pub(in crate::node::pmix) fn host(act: Act) -> Command {
        match act {
            Act::Host(command) => command,
            _ => panic!("not a command to the server"),
        }
    }

    pub(in crate::node::pmix) fn up(act: Act) -> Up {
        match act {
            Act::Up(up) => up,
            _ => panic!("not a message to the root"),
        }
    }

    #[test]
    fn the_launched_ranks_start_once_the_last_of_their_environments_is_in_and_only_then() {
        let now = Instant::now();
        let mut state = State::new(JOB, 4, now);
        assert!(state.on_event(env(0), &here(true), now).is_empty());
        assert!(matches!(one(state.on_event(env(1), &here(true), now)), Act::EnvironmentsIn));
        assert_eq!(state.envs.get(&(0, 1)), Some(&vec![b"A=1".to_vec()]));
        // After a teardown gave up on the ranks, or from a late server: not kept.
        let mut state = State::new(JOB, 4, now);
        assert!(state.on_event(env(0), &here(false), now).is_empty());
        assert!(state.envs.is_empty());
        let other = Event::Env { nspace: "other".into(), rank: 0, status: 0, vars: vec![] };
        assert!(state.on_event(other, &here(true), now).is_empty());
        assert!(state.envs.is_empty());
    }

    #[test]
    fn a_rank_that_exits_0_connected_and_unfinalized_is_judged_once_the_server_caught_up() {
        let now = Instant::now();
        let mut state = State::new(JOB, 4, now);
        let ok = ExitOutcome::Exited(0);
        let connect = |rank| Event::Connected { proc: proc(JOB, rank) };
        assert!(matches!(
            one(state.on_event(connect(1), &here(true), now)),
            Act::Connected(Gid(1))
        ));
        assert!(matches!(
            one(state.on_event(connect(2), &here(true), now)),
            Act::Connected(Gid(2))
        ));
        let finalized = Event::Finalized { proc: proc(JOB, 2) };
        assert!(state.on_event(finalized, &here(true), now).is_empty());
        // Finalized, or failed: judged at once.
        assert_eq!(state.holds_verdict(Gid(2), 2, ok), None);
        assert_eq!(state.holds_verdict(Gid(1), 1, ExitOutcome::Exited(3)), None);
        assert!(state.left_unfinalized(Gid(1)) && !state.left_unfinalized(Gid(2)));
        // Not heard to connect: its connect may still be on the link.
        let Some(Command::Sync { id }) = state.holds_verdict(Gid(0), 0, ok) else {
            panic!("held for a sync")
        };
        assert!(matches!(
            one(state.on_event(Event::Synced { id }, &here(true), now)),
            Act::Judge(0, _)
        ));
        let Some(Command::Sync { id }) = state.holds_verdict(Gid(1), 1, ok) else {
            panic!("held for a sync")
        };
        assert!(state.on_event(Event::Synced { id: id + 1 }, &here(true), now).is_empty());
        match one(state.on_event(Event::Synced { id }, &here(true), now)) {
            Act::Judge(local, outcome) => assert_eq!((local, outcome), (1, ok)),
            _ => panic!("not judged"),
        }
        // A server that goes gives what it held.
        let Some(Command::Sync { .. }) = state.holds_verdict(Gid(1), 1, ok) else {
            panic!("held again")
        };
        assert_eq!(state.take_held(), vec![(1, ok)]);
        assert!(state.take_held().is_empty());
    }

    #[test]
    fn an_abort_goes_up_before_its_answer_and_open_mpis_placeholder_is_dropped() {
        let now = Instant::now();
        let mut state = State::new(JOB, 4, now);
        let abort =
            |msg: &str| Event::Abort { id: 4, proc: proc(JOB, 1), status: 9, msg: msg.into() };
        let acts = state.on_event(abort("N/A"), &here(true), now);
        assert!(matches!(&acts[0], Act::Abort { rank: Gid(1), code: 9, msg } if msg.is_empty()));
        assert!(matches!(&acts[1], Act::Host(Command::OpDone { id: 4, status: wire::SUCCESS })));
        let acts = state.on_event(abort("bad input"), &here(true), now);
        assert!(matches!(&acts[0], Act::Abort { msg, .. } if msg == "bad input"));
    }

    #[test]
    fn the_server_is_silent_from_the_last_thing_it_said() {
        let start = Instant::now();
        let mut state = State::new(JOB, 4, start);
        let silence = Duration::from_secs(5);
        assert_eq!(state.silent_at(silence), start + silence);
        let later = start + Duration::from_secs(2);
        let notice = Event::Notice { text: "hello".into() };
        assert!(state.on_event(notice, &here(true), later).is_empty());
        assert_eq!(state.silent_at(silence), later + silence);
        let resumed = start + Duration::from_secs(9);
        state.resumed(resumed);
        assert_eq!(state.silent_at(silence), resumed + silence);
    }
}
