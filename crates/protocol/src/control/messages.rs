//! The messages of the control protocol, in its two layers: the job's ([`Up`], [`Down`]),
//! routed through the tree and read by its dispatchers, and the link's own ([`LinkUp`],
//! [`LinkDown`]), consumed by the two ends of one link. How they travel in frames is the
//! parent module's.

use serde::{Deserialize, Serialize};

use super::{
    DmodexAnswer, DmodexAsk, Launch, NameAnswer, NameOp, Rendezvous, SpawnJob, SpawnOutcome,
    SpawnRequest,
};
use crate::ids::{ExitOutcome, Gid, NodeId, Stream};
use crate::record::{GpuUse, Micros, NodeRecord, RankUsage};
use crate::survey::Survey;

/// Parent to child: the job's messages.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum Down {
    /// Everything the proxy needs: the job and its own subtree. Sent once, right after hello.
    Launch(Box<Launch>),
    /// A chunk of the launcher's stdin for the ranks named by [`Job::stdin`]. Each receiving
    /// rank's proxy answers [`Up::StdinAck`] with the same `seq` once the chunk is written, so
    /// that the launcher keeps only a bounded number of chunks in flight. A chunk sent again
    /// (to a proxy rlaunch adopted) with a `seq` not above the last one a node took is
    /// dropped there.
    Stdin { seq: u64, data: Vec<u8> },
    /// The launcher's stdin reached end of file.
    StdinEof,
    /// Forward this signal to every rank (its process group).
    Signal { signo: i32 },
    /// Abort: SIGTERM every rank's group, wait `grace_ms`, then SIGKILL what is left.
    Terminate { grace_ms: u64 },
    /// A PMI fence is complete: every pair put during `epoch`, job-wide. Each proxy adds them
    /// to its cache and releases its ranks.
    FenceOut { epoch: u64, pairs: Vec<(String, String)> },
    /// A PMIx fence is complete: every node's contribution to `epoch`, one after another,
    /// for each node's PMIx server to hand back to its ranks whole. `data` is the end of it,
    /// after the [`Down::PmixFencePart`]s sent before.
    PmixFenceOut { epoch: u64, data: Vec<u8> },
    /// Part of the data of PMIx fence `epoch` (at most [`PMIX_FENCE_PART`] bytes), ahead of
    /// its [`Down::PmixFenceOut`]; each proxy passes it on and keeps it for its server.
    PmixFencePart { epoch: u64, data: Vec<u8> },
    /// The root's answer to a rank's name-service request.
    NameReply { rank: Gid, tag: Option<String>, answer: NameAnswer },
    /// A job spawned by a rank (MPI_Comm_spawn), sent to every node: those it places ranks
    /// on start them and answer [`Up::SpawnStarted`]; the others' PMIx servers register its
    /// namespace, for their ranks that are its parents too (a spawn collective over ranks of
    /// several nodes).
    Spawn(Box<SpawnJob>),
    /// How the spawn of rank `rank` (a global id) went, once every node of the new job
    /// started its ranks or the root refused it: routed down to that rank's node.
    SpawnAnswer { rank: Gid, tag: Option<String>, outcome: SpawnOutcome },
    /// A fence of spawned job `job`, whose ranks are on several nodes, is complete: every
    /// pair its ranks put during `epoch`. Sent to every node; those with ranks of the job
    /// release them.
    JobFenceOut { job: u32, epoch: u64, pairs: Vec<(String, String)> },
    /// A PMIx fence over `members` (global ids; not the whole launched job) is complete: every
    /// participating node's data, routed down to each of those nodes (`node`).
    PmixGroupFenceOut { node: NodeId, members: Vec<Gid>, data: Vec<u8> },
    /// A direct modex request, routed down to the node of the rank it names.
    DmodexAsk(DmodexAsk),
    /// The answer to a direct modex request, routed down to the node that asked.
    DmodexAnswer(DmodexAnswer),
    /// Where rank 0 serves the frameworks' rendezvous, as its proxy chose it: every node
    /// starts its ranks with it (each node waits for it when the launch had none).
    Rendezvous(Rendezvous),
    /// The job is ending and its output will not be written (a slow reader, or rlaunch was
    /// interrupted): relay no more of it; close the ranks' pipes with what they hold.
    DropOutput,
    /// Where is every rank? Each proxy answers `Up::Survey` with its own ranks and its
    /// children's, merged, within `within_ms` of hearing it; a child silent for longer is
    /// named as such. `stacks`: with every live rank's stacks, merged.
    Survey { id: u32, within_ms: u64, stacks: bool },
    /// These ranks (global ids, every one so far) failed and the job goes on without them
    /// (`--on-failure continue`): fences no longer wait for them, and every node tells its
    /// ranks (the `PMI_dead_processes` key, the file of `RLAUNCH_DEAD_RANKS_FILE`).
    Dead { ranks: crate::stacks::RankSet },
    /// Every rank of the job has ended, which went on after failures: a node that waited to
    /// be told (a party of the survivors' fences) finishes once its own work is done, as
    /// after any job. Not a teardown: nothing is killed.
    Over,
    /// A proxy above lost its parent and rlaunch adopted it: what was on its way up through
    /// the lost parent may be lost, so every node below sends its ranks' ends again (rlaunch
    /// keeps the first of each).
    Resend,
    /// Every node has the broadcast files, whole and checked: the ranks may start. Sent by
    /// rlaunch once every top proxy's subtree acknowledged all of them; each proxy passes it
    /// on. No rank starts before every node has its copies, as none would after `sbcast`.
    BcastDone,
    /// Bytes of the files broadcast to every node ([`super::Bcast`]), at `offset` in their
    /// stream (the files one after another). Each node takes them in order (one sent again,
    /// below what it wrote, is dropped), writes them, and feeds its children from what it
    /// wrote; it answers [`Up::BcastAck`]. Travels in a bulk frame of its own (tag 4); the
    /// data is shared, not copied, by the siblings it goes to. Last of the kinds: serde numbers the
    /// kinds it decodes without the ones it skips.
    #[serde(skip)]
    BcastData { offset: u64, data: std::sync::Arc<[u8]> },
}

/// The link's own business, parent to child: consumed by the link's far end, never routed.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum LinkDown {
    /// Heartbeat: a link that stays silent for long is a lost one (a dropped network link
    /// closes nothing).
    Ping,
    /// The parent took on this many bytes of the child's output: it may send that much more.
    /// The first, right after the launch, opens the child's window (see rlaunch-tree's
    /// `credit` module).
    Credit { bytes: u64 },
    /// What time is it on your clock? Sent once after the hello, at `sent` on the parent's
    /// clock; answered at once with [`LinkUp::ClockEcho`], so that the parent can tell how
    /// far the child's clock is from its own (`record::clock_offset`).
    ClockProbe { sent: Micros },
    /// To a proxy that dialed the wrong parent (every proxy started by a scheduler's launcher
    /// dials rlaunch first): dial this address, its parent's, instead. Sent in place of the
    /// launch, on the encrypted link.
    Redirect { to: String },
}

/// The link's own business, child to parent: consumed by the parent's end of the link, never
/// relayed further up.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum LinkUp {
    /// Who is on the other end; the first frame after the hello.
    Greeting { host: String, pid: u32 },
    /// Heartbeat, as [`LinkDown::Ping`].
    Ping,
    /// The answer to [`LinkDown::ClockProbe`]: the probe's `sent`, and this proxy's clock
    /// when it read the probe.
    ClockEcho { sent: Micros, at: Micros },
}

/// What a link carries from parent to child: the link's own business, or the job's (which
/// the child's dispatcher reads and routes on down).
#[derive(Debug, Clone, PartialEq)]
pub enum DownFrame {
    Link(LinkDown),
    Job(Down),
}

/// What a link carries from child to parent: the link's own business, or the job's (which
/// the parent relays on up, or reads, at the root).
#[derive(Debug, Clone, PartialEq)]
pub enum UpFrame {
    Link(LinkUp),
    Job(Up),
}

/// Child to parent: the job's messages. Proxies relay their children's frames unchanged.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum Up {
    /// All of this node's ranks have been started (or failed to start).
    Started { node: NodeId },
    /// A rank is running. Travels on the output path, ahead of the rank's first output, so
    /// that the launcher knows the pid (and the CPUs it is bound to) before any of its lines.
    /// `cpus`: the CPUs it is bound to; `gpus`: the GPUs it was given, if its job asks.
    RankStarted { rank: Gid, pid: u32, cpus: Option<String>, gpus: Option<Vec<GpuUse>> },
    /// Bytes a rank wrote.
    Output { rank: Gid, stream: Stream, data: Vec<u8> },
    /// A rank's stream reached end of file.
    OutputEnd { rank: Gid, stream: Stream },
    /// A rank ended: its one verdict, sent once it is reaped and its PMI connection (if it
    /// had one) has closed. `unfinalized`: the connection closed before PMI finalize, which
    /// fails the rank even if it exited with 0 (docs/pmi.md, *Who answers what*). `pid` is 0 for a rank that never
    /// started. `usage`: its times and resource use, for `--report`.
    RankExited { rank: Gid, pid: u32, outcome: ExitOutcome, unfinalized: bool, usage: RankUsage },
    /// A stdin chunk has been written to one rank of node `node` (or dropped, the rank
    /// having closed its stdin or ended).
    StdinAck { seq: u64, node: NodeId },
    /// What a rank that failed wrote in its `TORCHELASTIC_ERROR_FILE` (torch's `@record`:
    /// JSON with the exception and its traceback), at most [`MAX_ERROR_REPORT`] bytes; sent
    /// ahead of its `RankExited`.
    RankError { rank: Gid, report: Vec<u8> },
    /// A proxy below lost one of its children.
    ProxyLost { host: String, reason: String, came_up: bool },
    /// Every rank of this node has ended and its output has been sent. `record`: what the
    /// node saw (its launch, its ranks' output and PMI), its children's nested in it.
    NodeDone { node: NodeId, record: Box<NodeRecord> },
    /// For rlaunch's progress line (`Job::progress`): node `node`'s proxy is up (sent once it
    /// has its launch, with 0), and `pmi_inited` of its ranks have initialised PMI so far.
    Progress { node: NodeId, pmi_inited: u32 },
    /// Every rank of this subtree has entered fence `epoch`; the pairs they put since the
    /// last fence come along.
    FenceIn { epoch: u64, pairs: Vec<(String, String)> },
    /// Every node of this subtree has entered PMIx fence `epoch`, and sent its server's data
    /// ahead in [`Up::PmixFencePart`]s. `served`: some node entered with its PMIx server (a
    /// fence its ranks asked for), not only for lack of one (a node whose ranks all ended
    /// enters each next epoch at once, so that the others' fences complete).
    PmixFenceIn { epoch: u64, served: bool },
    /// Part of node `node`'s server's data for PMIx fence `epoch` (opaque to rlaunch): a
    /// node's data goes up in order, in parts of at most [`PMIX_FENCE_PART`] bytes, ahead of
    /// its subtree's [`Up::PmixFenceIn`]. Interior proxies pass parts on as they come; the
    /// root puts each node's together, so that every node's data stays whole.
    PmixFencePart { epoch: u64, node: NodeId, data: Vec<u8> },
    /// Node `node`'s data for PMIx fence `epoch` comes again, from its first part: what came
    /// of it before is dropped (sent by a proxy rlaunch adopted, whose lost parent may have
    /// passed some of it on, or none).
    PmixFenceAgain { epoch: u64, node: NodeId },
    /// A rank's publish, unpublish or lookup, for the job's name table at the root.
    Name { rank: Gid, tag: Option<String>, op: NameOp },
    /// A rank called PMI abort (MPI_Abort).
    Abort { rank: Gid, pid: u32, code: i32, msg: String },
    /// A rank broke the PMI protocol; `what` says how, quoting what it sent.
    PmiFault { rank: Gid, pid: u32, what: String },
    /// A rank asks to spawn a new job (MPI_Comm_spawn); the root assigns its ids and places
    /// its ranks.
    Spawn { rank: Gid, tag: Option<String>, request: SpawnRequest },
    /// Node `node` started its ranks of spawned job `job` (`refused`: could not, and why).
    SpawnStarted { job: u32, node: NodeId, refused: Option<String> },
    /// Every local rank of spawned job `job` (whose ranks are on several nodes) entered fence
    /// `epoch`, with the pairs they put since the last; relayed up unchanged, the root folds
    /// the nodes of the job.
    JobFenceIn { job: u32, epoch: u64, pairs: Vec<(String, String)> },
    /// Every local process of node `node` entered a PMIx fence over `members` (global ids,
    /// sorted; not the whole launched job, e.g. Open MPI's disconnect of parents and spawned
    /// children); the root folds it with the other nodes that host members.
    PmixGroupFenceIn { node: NodeId, members: Vec<Gid>, data: Vec<u8> },
    /// A node's PMIx server wants a rank's data from the node that owns it (direct modex);
    /// the root sends it down toward that rank.
    DmodexAsk(DmodexAsk),
    /// The owning node's answer to a [`DmodexAsk`]; the root sends it down toward the asker.
    DmodexAnswer(DmodexAnswer),
    /// Something the user should know that does not fail the job (bindings wrap around);
    /// the launcher prints it as one line.
    Notice { host: String, text: String },
    /// The node's ranks do not fit on it as asked (`why`: more ranks than GPUs, than
    /// `ppr:N:socket` places): they do not start, and the job ends.
    Unplaceable { host: String, why: String },
    /// This child's whole subtree has written this many bytes of the broadcast files
    /// ([`Down::BcastData`]): its parent may send it more (all of them: the subtree is
    /// ready, its directories made, every file checked). Not relayed: each parent folds its
    /// children's into its own.
    BcastAck { bytes: u64 },
    /// Node `host` could not write the broadcast files (`why`: which file, and the system's
    /// error): its ranks do not start, and the job ends.
    BcastFailed { host: String, why: String },
    /// Rank 0's proxy chose where rank 0 serves the frameworks' rendezvous (the launch had
    /// none: rank 0 runs on another machine than rlaunch).
    Rendezvous(Rendezvous),
    /// The proxy of `node` listens at `address` for its children to dial in; relayed up to
    /// rlaunch, which sends them there.
    Listening { node: NodeId, address: String },
    /// The reader of rlaunch's stdout closed it, found by a proxy that writes a lone rank's
    /// output there itself (a proxy forked from rlaunch: see `rlaunch_proxy::outputs`);
    /// rlaunch ends the job as when it finds that itself.
    StdoutClosed,
    /// A rank served no PMIx started Open MPI's singleton machinery (it forked `orted`): it
    /// would compute alone, as a world of one.
    Singleton { rank: Gid, pid: u32 },
    /// The answer to `Down::Survey` `id`: the subtree's ranks, merged by its proxy.
    Survey { id: u32, survey: Box<Survey> },
}
