//! What the node keeps of its PMIx server's clients and open requests, and how it answers
//! what the server says: [`State::on_event`] is a function of (state, event) → actions,
//! driven without a server or a process by the tests below. The Node carries the actions
//! out: it owns the host process, the upstream, the rank table and the launched ranks' gate.
//!
//! ```text
//!   host ──Event──► State::on_event(here) ──[Act]──► Node::pmix_act
//!                                                     Host(cmd) ──► host
//!                                                     Up(msg)   ──► root
//!                                                     the rest  ──► ranks, gate, fences
//! ```

use std::collections::{HashMap, HashSet};

use rlaunch_protocol::control::{
    DmodexAnswer, DmodexAsk, DmodexData, NameAnswer, NameOp, NameValue, SpawnCmd, SpawnRequest, Up,
};
use rlaunch_protocol::ids::{ExitOutcome, Gid, NodeId};
use tokio::time::Instant;

use super::dmodex::{status_of, Asks};
use super::spawn::{Registered, Spawning};
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

/// Marks a name-service request as PMIx's: the tag its answer comes back with.
const TAG_PREFIX: &str = "\0pmix:";

fn name_tag(id: u32) -> Option<String> {
    Some(format!("{TAG_PREFIX}{id}"))
}

/// The host's id in a PMIx name-service answer's tag.
pub(in crate::node) fn pmix_id(tag: &Option<String>) -> Option<u32> {
    tag.as_deref()?.strip_prefix(TAG_PREFIX)?.parse().ok()
}

/// What the node knows of its server's clients, and the requests the server waits on.
pub(super) struct State {
    /// The namespaces the server knows (the launched job's, and each spawned job's).
    pub(super) nspaces: HashMap<String, Nspace>,
    /// Fences over other processes than the whole launched job (global ids, sorted) this
    /// node entered: the host's id, answered when the root says the fence is complete.
    groups: HashMap<Vec<Gid>, u32>,
    /// Environments of local ranks, by job and rank, until their ranks start.
    pub(super) envs: HashMap<(u32, u32), Vec<Vec<u8>>>,
    /// The host's id of the launched job's fence this node entered, answered when the fence
    /// completes (the fold is the node's, `super::fence`: it outlives the server).
    entered: Option<u32>,
    /// The completion of that fence gathered so far, from the parts that came before it.
    fence_out: Vec<u8>,
    /// Name-service requests at the root, by the host's id: the key a lookup asked for.
    lookups: HashMap<u32, String>,
    /// Jobs spawned here whose ranks wait for their environments, by job index.
    pub(super) spawning: HashMap<u32, Spawning>,
    /// Local clients (global ids) that connected to the server: only they can have
    /// committed data for a direct modex request.
    connected: HashSet<Gid>,
    /// Local clients (global ids) that called PMIx_Finalize.
    finalized: HashSet<Gid>,
    /// Ranks that exited 0 after connecting, not (yet) known to have finalized: judged once
    /// the host answers the `Sync` of this id (a finalize comes ahead of it on the link).
    syncs: HashMap<u32, (Local, ExitOutcome)>,
    next_sync: u32,
    /// When the host last said anything. It answers a `Sync` every heartbeat: one silent
    /// for the job's silence timeout is wedged (stopped, or stuck before it is ready), and
    /// is given up as if it had died.
    heard: Instant,
    /// Direct modex requests of other nodes that the server is answering.
    asks: Asks,
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
            heard: now,
            asks: Asks::default(),
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

    /// Rank `gid` (local `local`) was reaped with `outcome`: the `Sync` to send if the server
    /// holds its verdict. One that exited 0 after connecting and was not heard to finalize
    /// waits for the server to catch up (its finalize may still be on the link): then
    /// `Act::Judge`.
    pub(super) fn holds_verdict(
        &mut self,
        gid: Gid,
        local: Local,
        outcome: ExitOutcome,
    ) -> Option<Command> {
        if !(outcome.is_success() && self.left_unfinalized(gid)) {
            return None;
        }
        let sync = self.sync();
        let Command::Sync { id } = sync else { unreachable!("a sync") };
        self.syncs.insert(id, (local, outcome));
        Some(sync)
    }

    /// The verdicts the server held: due now, for it goes.
    pub(super) fn take_held(&mut self) -> Vec<(Local, ExitOutcome)> {
        self.syncs.drain().map(|(_, held)| held).collect()
    }

    /// The server is gone: what it did not answer of other nodes' requests, it never will.
    pub(super) fn unanswered(&mut self) -> Vec<Up> {
        std::mem::take(&mut self.asks).into_open().map(missing).collect()
    }

    /// How many environments of job `index` are in.
    fn envs_of(&self, index: u32) -> usize {
        self.envs.keys().filter(|(job, _)| *job == index).count()
    }

    /// The root's answer to a PMIx name-service request of a local rank.
    pub(super) fn name_answer(&mut self, id: u32, answer: NameAnswer) -> Command {
        match answer {
            NameAnswer::Published(ok) => {
                let status = if ok { wire::SUCCESS } else { wire::ERR_DUPLICATE_KEY };
                Command::OpDone { id, status }
            }
            NameAnswer::Unpublished(ok) => {
                let status = if ok { wire::SUCCESS } else { wire::ERR_NOT_FOUND };
                Command::OpDone { id, status }
            }
            NameAnswer::Lookup(value) => {
                let key = self.lookups.remove(&id).unwrap_or_default();
                // The publisher is not recorded: PMIX_RANK_UNDEF.
                match value {
                    Some(value) => Command::LookupDone {
                        id,
                        status: wire::SUCCESS,
                        found: vec![(key, value, u32::MAX)],
                    },
                    None => Command::LookupDone { id, status: wire::ERR_NOT_FOUND, found: vec![] },
                }
            }
        }
    }

    /// Another node asks for local rank `ask.rank`'s data; `ended`: the rank is no longer
    /// running. One that ended without connecting committed nothing: missing at once.
    pub(super) fn dmodex_ask(&mut self, ask: DmodexAsk, ended: bool) -> Act {
        if ended && !self.connected(ask.rank) {
            return Act::Up(missing(ask));
        }
        let (nspace, rank) = (ask.nspace.clone(), ask.nspace_rank);
        let id = self.asks.add(ask);
        Act::Host(Command::DmodexAsk { id, nspace, rank })
    }

    /// A local rank ended: if it never connected, it committed nothing, and the requests
    /// for its data will never be answered by the server.
    pub(super) fn dmodex_rank_ended(&mut self, rank: Gid) -> Vec<Up> {
        if self.connected(rank) {
            return Vec::new();
        }
        self.asks.take_for(rank).into_iter().map(missing).collect()
    }

    /// Part of the data of the launched job's PMIx fence, before its completion.
    pub(super) fn fence_part(&mut self, data: &[u8]) {
        if self.entered.is_some() {
            self.fence_out.extend_from_slice(data);
        }
    }

    /// The launched job's PMIx fence is complete, `data` the end of its data: the answer to
    /// the server's fence, if it entered.
    pub(super) fn fence_out(&mut self, data: &[u8]) -> Option<Command> {
        let mut all = std::mem::take(&mut self.fence_out);
        all.extend_from_slice(data);
        let id = self.entered.take()?;
        Some(Command::ModexDone { id, status: wire::SUCCESS, data: all })
    }

    /// A fence over `members` this node entered is complete, with every node's data.
    pub(super) fn group_fence_out(&mut self, members: &[Gid], data: Vec<u8>) -> Option<Command> {
        let Some(id) = self.groups.remove(members) else {
            tracing::warn!(?members, "completion of a PMIx fence this node is not in");
            return None;
        };
        Some(Command::ModexDone { id, status: wire::SUCCESS, data })
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
                if whole {
                    if let Some(old) = self.entered.replace(id) {
                        tracing::warn!(old, id, "a PMIx fence entered twice");
                    }
                    return vec![Act::FenceEntered(data)];
                }
                self.group_fence(here.node, id, &procs, data)
            }
            Event::Dmodex { id, proc } => {
                let Some(rank) = self.gid(&proc) else {
                    let (status, data) = status_of(DmodexData::Missing);
                    return vec![Act::Host(Command::ModexDone { id, status, data })];
                };
                tracing::debug!(nspace = %proc.nspace, rank = proc.rank, "direct modex request");
                let (nspace, nspace_rank) = (proc.nspace, proc.rank);
                vec![Act::Up(Up::DmodexAsk(DmodexAsk {
                    asker: here.node,
                    id,
                    rank,
                    nspace,
                    nspace_rank,
                }))]
            }
            Event::DmodexData { id, status, data } => {
                let Some(ask) = self.asks.take(id) else {
                    tracing::warn!(id, "a direct modex answer to no request");
                    return vec![];
                };
                let data = match status {
                    wire::SUCCESS => DmodexData::Found(data),
                    status => DmodexData::Refused(status),
                };
                vec![Act::Up(Up::DmodexAnswer(DmodexAnswer { asker: ask.asker, id: ask.id, data }))]
            }
            Event::Abort { id, proc, status, mut msg } => {
                // Open MPI 4.1's MPI_Abort always says "N/A": nothing to print.
                if msg == "N/A" {
                    msg.clear();
                }
                let rank = self.gid(&proc).unwrap_or(Gid(proc.rank));
                let done = Command::OpDone { id, status: wire::SUCCESS };
                vec![Act::Abort { rank, code: status, msg }, Act::Host(done)]
            }
            Event::Publish { id, proc, once, mut pairs } => match pairs.len() {
                1 => {
                    let rank = self.gid(&proc).unwrap_or(Gid(proc.rank));
                    let (service, value) = pairs.remove(0);
                    let packed = matches!(value, NameValue::Packed(_));
                    tracing::debug!(%service, once, packed, "PMIx publish");
                    let op = NameOp::Publish { service, value, once };
                    vec![Act::Up(Up::Name { rank, tag: name_tag(id), op })]
                }
                n => {
                    let status = if n == 0 { wire::SUCCESS } else { wire::ERR_NOT_SUPPORTED };
                    vec![Act::Host(Command::OpDone { id, status })]
                }
            },
            Event::Unpublish { id, proc, mut keys } => match keys.len() {
                1 => {
                    let rank = self.gid(&proc).unwrap_or(Gid(proc.rank));
                    let op = NameOp::Unpublish { service: keys.remove(0) };
                    vec![Act::Up(Up::Name { rank, tag: name_tag(id), op })]
                }
                _ => vec![Act::Host(Command::OpDone { id, status: wire::ERR_NOT_SUPPORTED })],
            },
            Event::Lookup { id, proc, wait, mut keys } => match keys.len() {
                1 => {
                    let rank = self.gid(&proc).unwrap_or(Gid(proc.rank));
                    let service = keys.remove(0);
                    tracing::debug!(%service, ?wait, "PMIx lookup");
                    self.lookups.insert(id, service.clone());
                    let op = NameOp::Lookup { service, wait };
                    vec![Act::Up(Up::Name { rank, tag: name_tag(id), op })]
                }
                _ => {
                    let (status, found) = (wire::ERR_NOT_SUPPORTED, Vec::new());
                    vec![Act::Host(Command::LookupDone { id, status, found })]
                }
            },
            Event::Spawn { id, proc, apps } => {
                let cmds: Vec<SpawnCmd> = apps.into_iter().map(super::spawn::spawn_cmd).collect();
                match self.gid(&proc) {
                    Some(rank) if cmds.iter().any(|c| c.nprocs > 0) => {
                        let request = SpawnRequest { cmds, preput: Vec::new() };
                        vec![Act::Up(Up::Spawn { rank, tag: name_tag(id), request })]
                    }
                    _ => {
                        let (status, nspace) = (wire::ERR_BAD_PARAM, String::new());
                        vec![Act::Host(Command::SpawnDone { id, status, nspace })]
                    }
                }
            }
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
            Event::Synced { id } => match self.syncs.remove(&id) {
                Some((local, outcome)) => vec![Act::Judge(local, outcome)],
                None => vec![],
            },
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

    /// Every local process of a fence over `procs` (not the whole launched job) entered it:
    /// the root folds it with the other nodes that host its processes.
    fn group_fence(&mut self, node: NodeId, id: u32, procs: &[Proc], data: Vec<u8>) -> Vec<Act> {
        let mut members = Vec::new();
        for proc in procs {
            let Some(&Nspace { first, size, .. }) = self.nspaces.get(&proc.nspace) else {
                let text = format!("a fence with {}, a job this node does not know", proc.nspace);
                let (status, data) = (wire::ERR_NOT_SUPPORTED, Vec::new());
                return vec![Act::Notice(text), Act::Host(Command::ModexDone { id, status, data })];
            };
            match proc.rank {
                wire::RANK_WILDCARD => members.extend((first..first + size).map(Gid)),
                rank => members.push(Gid(first + rank)),
            }
        }
        members.sort_unstable();
        members.dedup();
        if let Some(old) = self.groups.insert(members.clone(), id) {
            tracing::warn!(old, id, "a PMIx fence over the same processes entered twice");
        }
        vec![Act::Up(Up::PmixGroupFenceIn { node, members, data })]
    }
}

/// The answer to a request for data that will never come.
pub(super) fn missing(ask: DmodexAsk) -> Up {
    Up::DmodexAnswer(DmodexAnswer { asker: ask.asker, id: ask.id, data: DmodexData::Missing })
}

#[cfg(test)]
mod tests {
    use super::*;
    use rlaunch_protocol::control::LookupWait;
    use std::time::Duration;

    const JOB: &str = "kvs_1_0";

    fn proc(nspace: &str, rank: u32) -> Proc {
        Proc { nspace: nspace.into(), rank }
    }

    fn here(launched_wait: bool) -> Here<'static> {
        Here { node: NodeId(3), jobid: JOB, launched_wait, launched_local: 2 }
    }

    fn env(rank: u32) -> Event {
        Event::Env { nspace: JOB.into(), rank, status: wire::SUCCESS, vars: vec![b"A=1".to_vec()] }
    }

    fn one(mut acts: Vec<Act>) -> Act {
        assert_eq!(acts.len(), 1, "one action");
        acts.remove(0)
    }

    fn host(act: Act) -> Command {
        match act {
            Act::Host(command) => command,
            _ => panic!("not a command to the server"),
        }
    }

    fn up(act: Act) -> Up {
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
    fn the_whole_jobs_fence_is_answered_with_every_part_and_a_group_fence_goes_to_the_root() {
        let now = Instant::now();
        let mut state = State::new(JOB, 4, now);
        // A part before this node entered is not this node's to keep.
        state.fence_part(b"early");
        let whole = Event::Fence {
            id: 7,
            collect: true,
            procs: vec![proc(JOB, wire::RANK_WILDCARD)],
            data: b"mine".to_vec(),
        };
        match one(state.on_event(whole, &here(true), now)) {
            Act::FenceEntered(data) => assert_eq!(data, b"mine"),
            _ => panic!("not entered"),
        }
        state.fence_part(b"ab");
        let done = state.fence_out(b"cd");
        let data = b"abcd".to_vec();
        assert_eq!(done, Some(Command::ModexDone { id: 7, status: wire::SUCCESS, data }));
        assert_eq!(state.fence_out(b""), None, "answered once");

        let group = Event::Fence {
            id: 8,
            collect: true,
            procs: vec![proc(JOB, 2), proc(JOB, 0), proc(JOB, 2)],
            data: b"g".to_vec(),
        };
        let members = vec![Gid(0), Gid(2)];
        let fence_in = Up::PmixGroupFenceIn { node: NodeId(3), members, data: b"g".to_vec() };
        assert_eq!(up(one(state.on_event(group, &here(true), now))), fence_in);
        let done = state.group_fence_out(&[Gid(0), Gid(2)], b"all".to_vec());
        let data = b"all".to_vec();
        assert_eq!(done, Some(Command::ModexDone { id: 8, status: wire::SUCCESS, data }));
        assert_eq!(state.group_fence_out(&[Gid(0), Gid(2)], vec![]), None);

        let stranger =
            Event::Fence { id: 9, collect: true, procs: vec![proc("nobody", 0)], data: vec![] };
        let acts = state.on_event(stranger, &here(true), now);
        assert!(matches!(&acts[0], Act::Notice(text) if text.contains("nobody")));
        let refused = Command::ModexDone { id: 9, status: wire::ERR_NOT_SUPPORTED, data: vec![] };
        assert_eq!(acts.len(), 2);
        assert_eq!(host(acts.into_iter().nth(1).expect("two")), refused);
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
        // Never connected, finalized, or failed: judged at once.
        assert_eq!(state.holds_verdict(Gid(0), 0, ok), None);
        assert_eq!(state.holds_verdict(Gid(2), 2, ok), None);
        assert_eq!(state.holds_verdict(Gid(1), 1, ExitOutcome::Exited(3)), None);
        assert!(state.left_unfinalized(Gid(1)) && !state.left_unfinalized(Gid(2)));
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
    fn name_service_requests_go_up_tagged_and_a_lookup_is_answered_with_its_key() {
        let now = Instant::now();
        let mut state = State::new(JOB, 4, now);
        let lookup = Event::Lookup {
            id: 5,
            proc: proc(JOB, 3),
            wait: LookupWait::No,
            keys: vec!["svc".into()],
        };
        let Up::Name { rank, tag, op } = up(one(state.on_event(lookup, &here(true), now))) else {
            panic!("not a name request")
        };
        assert_eq!((rank, pmix_id(&tag)), (Gid(3), Some(5)));
        assert_eq!(op, NameOp::Lookup { service: "svc".into(), wait: LookupWait::No });
        let value = NameValue::Text("port".into());
        let found = vec![("svc".to_string(), value.clone(), u32::MAX)];
        let answer = state.name_answer(5, NameAnswer::Lookup(Some(value)));
        assert_eq!(answer, Command::LookupDone { id: 5, status: wire::SUCCESS, found });
        let taken = state.name_answer(6, NameAnswer::Published(false));
        assert_eq!(taken, Command::OpDone { id: 6, status: wire::ERR_DUPLICATE_KEY });
        assert_eq!(pmix_id(&Some("5".into())), None, "a PMI request's tag is not PMIx's");

        let pairs = |n| (0..n).map(|i| (format!("k{i}"), NameValue::Text("v".into()))).collect();
        let publish =
            |n| Event::Publish { id: 1, proc: proc(JOB, 0), once: false, pairs: pairs(n) };
        let none = host(one(state.on_event(publish(0), &here(true), now)));
        assert_eq!(none, Command::OpDone { id: 1, status: wire::SUCCESS });
        let two = host(one(state.on_event(publish(2), &here(true), now)));
        assert_eq!(two, Command::OpDone { id: 1, status: wire::ERR_NOT_SUPPORTED });
        assert!(matches!(up(one(state.on_event(publish(1), &here(true), now))), Up::Name { .. }));
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
    fn direct_modex_asks_go_up_and_what_the_server_cannot_answer_is_missing() {
        let now = Instant::now();
        let mut state = State::new(JOB, 4, now);
        let unknown = Event::Dmodex { id: 1, proc: proc("nobody", 0) };
        let not_found = Command::ModexDone { id: 1, status: wire::ERR_NOT_FOUND, data: vec![] };
        assert_eq!(host(one(state.on_event(unknown, &here(true), now))), not_found);
        let known = Event::Dmodex { id: 2, proc: proc(JOB, 3) };
        let Up::DmodexAsk(ask) = up(one(state.on_event(known, &here(true), now))) else {
            panic!("not asked")
        };
        assert_eq!((ask.asker, ask.id, ask.rank, ask.nspace_rank), (NodeId(3), 2, Gid(3), 3));

        // Another node's request for local rank 1: the server is asked, and its answer goes up.
        let ask = |rank, id| DmodexAsk {
            asker: NodeId(0),
            id,
            rank: Gid(rank),
            nspace: JOB.into(),
            nspace_rank: rank,
        };
        let Command::DmodexAsk { id, nspace, rank } = host(state.dmodex_ask(ask(1, 10), false))
        else {
            panic!("the server is not asked")
        };
        assert_eq!((nspace.as_str(), rank), (JOB, 1));
        let data = Event::DmodexData { id, status: wire::SUCCESS, data: b"d".to_vec() };
        let answer =
            DmodexAnswer { asker: NodeId(0), id: 10, data: DmodexData::Found(b"d".into()) };
        assert_eq!(up(one(state.on_event(data, &here(true), now))), Up::DmodexAnswer(answer));
        let again = Event::DmodexData { id, status: wire::SUCCESS, data: vec![] };
        assert!(state.on_event(again, &here(true), now).is_empty(), "answered once");

        // A rank that ended without connecting committed nothing; nor will a server that went.
        let missing =
            |id| Up::DmodexAnswer(DmodexAnswer { asker: NodeId(0), id, data: DmodexData::Missing });
        assert_eq!(up(state.dmodex_ask(ask(2, 11), true)), missing(11));
        assert!(matches!(state.dmodex_ask(ask(2, 12), false), Act::Host(_)));
        assert!(matches!(state.dmodex_ask(ask(0, 13), false), Act::Host(_)));
        assert_eq!(state.dmodex_rank_ended(Gid(2)), vec![missing(12)]);
        assert_eq!(state.unanswered(), vec![missing(13)]);
        assert!(state.unanswered().is_empty());
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
