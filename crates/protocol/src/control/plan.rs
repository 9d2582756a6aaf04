//! What a proxy is told to run: its node's part of the job and the nodes below it, how it
//! was started, and how its links tell a live peer from a lost one.

use serde::{Deserialize, Serialize};

use crate::ids::NodeId;

/// What one proxy is told to do.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Launch {
    pub job: Job,
    /// This proxy's node and, below it, the nodes it must start itself.
    pub node: NodePlan,
    /// Started during the run for the ranks of a spawn placed on a host with no proxy left
    /// (MPI_Comm_spawn): it runs none of the launched job's ranks, takes no part in its
    /// fences, and waits for its first [`super::Down::Spawn`].
    pub late: bool,
    /// Started by rlaunch itself: a top proxy, whose parent is rlaunch. Only a proxy below
    /// the top seeks adoption ([`Job::adoption`]) when its parent is lost.
    pub top: bool,
}

/// The parts of a job that every proxy needs.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Job {
    /// Unique per launcher run; also the PMI kvsname.
    pub jobid: String,
    /// Number of ranks in the job.
    pub size: u32,
    /// One per MPMD segment; [`RankPlan::segment`] indexes here.
    pub segments: Vec<Segment>,
    /// The environment every rank starts from (the launcher's, by default).
    pub env: Vec<(Vec<u8>, Vec<u8>)>,
    /// Which ranks read the launcher's stdin; the others read /dev/null.
    pub stdin: StdinTarget,
    /// Between SIGTERM and SIGKILL when the job is torn down.
    pub kill_grace_ms: u64,
    /// How a proxy starts its child proxies.
    pub bootstrap: Bootstrap,
    /// `PMI_process_mapping`, or `None` when the placement does not fit in a PMI value.
    pub process_mapping: Option<String>,
    /// Serve PMI on a loopback TCP port (`PMI_PORT`/`PMI_ID`) instead of a socketpair.
    pub pmi_port: bool,
    /// Where on its node each local rank goes (`--map-by core`, `socket`, `ppr:2:numa`,
    /// ...); `None` places by slot: local rank i after local rank i-1.
    pub mapping: Option<Mapping>,
    /// How ranks are pinned to CPUs; `None` leaves them where the proxy runs, unless
    /// `spread`.
    pub binding: Option<Binding>,
    /// The user asked for no binding, mapping or `:PE` and did not refuse one (`--bind-to
    /// none`): a node whose ranks are no more than its cores binds each to its share of them
    /// (local rank i of n to the i-th n-th: rlaunch-topology's `Request::spread`), so that no
    /// two of the job's busy-polling ranks share a core when other work crowds the machine.
    pub spread: bool,
    /// Each rank its GPUs (`--gpus-per-rank`), through the vendors' visibility variables;
    /// `None` sets none of them.
    pub gpus: Option<Gpus>,
    /// Heartbeat and silence timeout of every link of the tree.
    pub liveness: Liveness,
    /// Serve PMIx too: what each node's PMIx server must know of the whole job.
    pub pmix: Option<PmixJob>,
    /// rlaunch shows a progress line: each proxy says when it is up and as its ranks
    /// initialise PMI ([`super::Up::Progress`]).
    pub progress: bool,
    /// The ranks of every node started by fork ([`NodePlan::fork`]), together: those nodes
    /// are all rlaunch's machine (fake nodes, `--launcher fork`) and share its CPUs, which a
    /// node's own count does not show.
    pub forked_ranks: u32,
    /// How many nodes run the job's ranks (its node indexes count them from 0, rank 0's
    /// first).
    pub nodes: u32,
    /// Where rank 0 serves the frameworks' rendezvous (`MASTER_ADDR`/`MASTER_PORT`, JAX's
    /// coordinator): chosen by rlaunch when rank 0 runs on its machine; `None`, by rank 0's
    /// proxy, which sends it up ([`super::Up::Rendezvous`]) for every node to start its
    /// ranks with ([`super::Down::Rendezvous`]).
    pub rendezvous: Option<Rendezvous>,
    /// rlaunch is the job's rabit tracker (`--tracker rabit`), listening here: every rank
    /// gets the `DMLC_*` variables.
    pub tracker: Option<(String, u16)>,
    /// Inside a Slurm allocation: the job's nodes, as a Slurm step's node list. Every rank
    /// gets the step variables of its place (`SLURM_PROCID`, `SLURM_LOCALID`, ...), as if
    /// srun had started it, for Slurm-aware programs (JAX's and Lightning's detectors).
    pub slurm_nodes: Option<String>,
    /// rlaunch writes a report (`--report`): each rank's record carries the variables rlaunch
    /// set for it ([`crate::record::RankRecord::vars`]).
    pub report_vars: bool,
    /// Which attempt of the job this is (0 for the first; `--max-restarts`), and how many
    /// restarts it may have: `TORCHELASTIC_RESTART_COUNT`, `TORCHELASTIC_MAX_RESTARTS`.
    pub restart: u32,
    pub max_restarts: u32,
    /// A failed rank ends alone and the others run on (`--on-failure continue`): they are
    /// told through [`super::Down::Dead`].
    pub goes_on: bool,
    /// Where a proxy below the top whose parent is lost dials rlaunch to be adopted, while
    /// the job goes on (`goes_on`, with interior proxies); `None`: its subtree goes with it.
    pub adoption: Option<Adoption>,
    /// Files every node gets before its ranks start (`--bcast`), and where they go.
    pub bcast: Option<Bcast>,
}

/// How long a proxy whose parent is lost tries to reach rlaunch to be adopted: one cut off
/// from the network with its parent must not outlive the job by much (rlaunch ends it soon
/// after it finds the node lost).
pub const ADOPTION_DIAL: std::time::Duration = std::time::Duration::from_secs(3);

/// rlaunch's listener for orphaned proxies, and the job's secret they prove. Travels only in
/// the `Launch`, over the tree's own links; never printed.
#[derive(Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Adoption {
    pub address: String,
    pub secret: [u8; 32],
}

impl std::fmt::Debug for Adoption {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Adoption").field("address", &self.address).finish_non_exhaustive()
    }
}

impl Job {
    /// Job `jobid` of `size` ranks running `segments`, every other setting at its simplest:
    /// on this machine (fork), no stdin, no PMIx, no binding, no services for frameworks,
    /// one node. What a test starts from; rlaunch's plan sets every field itself.
    pub fn simple(jobid: &str, size: u32, segments: Vec<Segment>) -> Job {
        Job {
            jobid: jobid.into(),
            size,
            segments,
            env: Vec::new(),
            stdin: StdinTarget::None,
            kill_grace_ms: 1000,
            bootstrap: Bootstrap::Fork,
            process_mapping: None,
            pmi_port: false,
            mapping: None,
            binding: None,
            spread: false,
            gpus: None,
            liveness: Liveness::default(),
            pmix: None,
            progress: false,
            forked_ranks: size,
            nodes: 1,
            rendezvous: None,
            tracker: None,
            slurm_nodes: None,
            report_vars: false,
            restart: 0,
            max_restarts: 0,
            goes_on: false,
            adoption: None,
            bcast: None,
        }
    }
}

/// Files broadcast through the tree (`--bcast`): each node writes them, in order, into a
/// directory of its own, and its ranks start once every one is there and checked. Their
/// bytes follow the launch as one stream ([`super::Down::BcastData`]), the files one after
/// another.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Bcast {
    pub files: Vec<BcastFile>,
    /// Where each node makes its directory (`--bcast-dir`; `%h` stands for the node's
    /// host name); `None`: the node's temporary directory (`TMPDIR`, or /tmp).
    pub base: Option<String>,
}

impl Bcast {
    /// The length of the stream: every file's bytes.
    pub fn total(&self) -> u64 {
        self.files.iter().map(|f| f.size).sum()
    }
}

/// One file of [`Bcast`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct BcastFile {
    /// Its name in the node's directory: a relative path, checked by rlaunch (no `..`).
    pub dest: String,
    pub size: u64,
    /// Its permission bits.
    pub mode: u32,
    /// The CRC-32 (IEEE, as zip and gzip use) of its bytes, checked by every node.
    pub crc: u32,
    /// The MPMD segments whose program this file is: their ranks run the node's copy.
    pub programs: Vec<u32>,
}

/// An address of rank 0's node that every node reaches (an IP, not a name), and ports that
/// were free there at launch.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Rendezvous {
    pub addr: String,
    /// `MASTER_PORT` (torch.distributed's TCPStore).
    pub port: u16,
    /// The port of `JAX_COORDINATOR_ADDRESS`.
    pub jax_port: u16,
}

/// The job as PMIx describes it to its clients: where every rank is, which application it
/// belongs to, and the process sets rlaunch defines.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PmixJob {
    /// Host name of each node, by node index.
    pub hosts: Vec<String>,
    /// Node index of each rank.
    pub rank_node: Vec<u32>,
    /// Application (MPMD segment) of each rank.
    pub rank_app: Vec<u32>,
    /// Process sets: name and member ranks.
    pub psets: Vec<(String, Vec<u32>)>,
    /// A node that cannot serve PMIx fails the job instead of starting its ranks without it
    /// (they would run as singletons): `--pmi pmix`, or a program linking Open MPI.
    pub required: bool,
    /// The ranks start at once, and each node's server only when one of its ranks first
    /// connects: for programs that may never use PMIx (a shell, python), which then cost
    /// what a job without PMIx costs. A server started so is needed as if `required`.
    pub late: bool,
}

/// `--bind-to`: each rank gets `count` objects of kind `unit`, in local-rank order, from the
/// CPUs the proxy may use; past the last object it wraps around.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Binding {
    pub unit: CpuUnit,
    pub count: u32,
}

/// A level of the CPU topology, as the kernel shows it under /sys.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum CpuUnit {
    Hwthread,
    Core,
    /// The CPUs that share an L3 cache (an AMD CCD, an Intel socket).
    L3,
    Numa,
    Socket,
}

/// `--map-by UNIT` within a node: local rank i goes to object i of `unit`, round-robin
/// (Open MPI's `--map-by socket`), or with `per`, to object i / per (`ppr:N:socket`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Mapping {
    pub unit: CpuUnit,
    pub per: Option<u32>,
}

/// `--gpus-per-rank` and its companions.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Gpus {
    /// How many GPUs each rank of each segment gets (0: an explicit empty set).
    pub per_rank: Vec<u32>,
    pub bind: GpuBind,
    /// More ranks than GPUs share them (`--gpu-share`) instead of failing the job.
    pub share: bool,
}

/// How a rank's GPUs are chosen.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum GpuBind {
    /// The free GPUs nearest the CPUs the rank is bound to (or would sit on).
    Closest,
    /// Local rank i gets GPU `list[i % len]` of the node's (`--gpu-bind map:3,2,1,0`).
    Map(Vec<u32>),
}

/// One executable of an MPMD command line.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Segment {
    pub exe: Vec<u8>,
    pub args: Vec<Vec<u8>>,
    /// Whether this segment's ranks start from [`Job::env`] (`false`: `-envnone`, from nothing).
    pub inherit_env: bool,
    /// Set on top of the inherited environment for this segment's ranks, in order.
    pub env: Vec<(Vec<u8>, Vec<u8>)>,
    /// Working directory of the ranks.
    pub wdir: Vec<u8>,
}

/// A node of the control tree.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct NodePlan {
    /// Index in the launcher's host list; also the node id in `PMI_process_mapping`.
    pub index: NodeId,
    pub host: String,
    /// Started by fork on the parent's machine (a name of the launcher's own machine, or
    /// `--launcher fork`); otherwise by the job's remote bootstrap.
    pub fork: bool,
    pub ranks: Vec<RankPlan>,
    /// Nodes this node's proxy starts and relays for.
    pub children: Vec<NodePlan>,
}

impl NodePlan {
    /// Every node in this subtree, this one first.
    pub fn walk(&self) -> Vec<&NodePlan> {
        let mut out = vec![self];
        let mut i = 0;
        while i < out.len() {
            out.extend(out[i].children.iter());
            i += 1;
        }
        out
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct RankPlan {
    pub rank: u32,
    pub segment: u32,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum StdinTarget {
    None,
    All,
    Rank(u32),
}

impl StdinTarget {
    pub fn includes(self, rank: u32) -> bool {
        match self {
            StdinTarget::None => false,
            StdinTarget::All => true,
            StdinTarget::Rank(r) => r == rank,
        }
    }
}

/// How a proxy starts the proxies below it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum Bootstrap {
    /// On this machine, whatever the host name says.
    Fork,
    /// `argv... HOST PROXY_PATH` with the channel on the remote command's stdin/stdout.
    Remote { argv: Vec<String>, proxy_path: String },
    /// Started by a scheduler's launcher all at once (srun); each dials its parent.
    Dial,
}

/// How a link tells a live peer from a lost one: a dropped network link closes nothing, so
/// each side sends a heartbeat every `heartbeat_ms` and takes `silence_ms` without a word for
/// a lost peer.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Liveness {
    pub heartbeat_ms: u64,
    pub silence_ms: u64,
}

impl Liveness {
    pub fn heartbeat(self) -> std::time::Duration {
        std::time::Duration::from_millis(self.heartbeat_ms)
    }

    pub fn silence(self) -> std::time::Duration {
        std::time::Duration::from_millis(self.silence_ms)
    }
}

impl Default for Liveness {
    /// A heartbeat every 2 s; 10 s of silence is a lost peer.
    fn default() -> Liveness {
        Liveness { heartbeat_ms: 2000, silence_ms: 10_000 }
    }
}
