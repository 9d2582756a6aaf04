//! From [`Options`] to the [`job::Plan`] that [`job::run`] carries out: the hosts each
//! segment's ranks go to, the tree of proxies over those hosts, how each proxy is started, and
//! the job description every proxy receives.
//!
//! ```text
//!   Options ──host_lists──► lists, ranks per segment ──place──► host of each rank
//!           ──bootstrap, stdin_target, segments──┐                     │
//!                                                ▼                     ▼
//!                              job::Plan ◄──tree: nodes, proxy tree, process mapping
//! ```
//!
//! `place` and `tree` are pure; this file reads the hostfiles and finds the proxy.

mod bcast;
mod elf;
mod layout;
mod ldso;
mod pmix_use;
mod tree;

use std::ffi::OsString;
use std::os::unix::ffi::{OsStrExt, OsStringExt};
use std::time::{SystemTime, UNIX_EPOCH};

use rlaunch_protocol::control::{Bootstrap, Job, PmixJob, Segment, StdinTarget};

use crate::allocation::{self, Allocation, Scheduler};
use crate::error::{SetupError, UsageError};
use crate::hosts::{self, Host, HostsError};
use crate::job::{self, report::OutFile};
use crate::options::{HostSource, LauncherKind, MapBy, Options, PmiKinds, Rmk};
use crate::place;

/// Linux runs at most this many processes (`PID_MAX_LIMIT`, the ceiling of
/// `kernel.pid_max`): no host takes more ranks.
const MAX_RANKS_PER_HOST: u64 = 1 << 22;

/// Why there is no plan.
#[derive(Debug, thiserror::Error)]
pub enum PlanError {
    /// The command line asks for a job rlaunch cannot lay out.
    #[error(transparent)]
    Usage(#[from] UsageError),
    /// rlaunch itself cannot run the job.
    #[error(transparent)]
    Setup(#[from] SetupError),
}

/// Lays out the job `o` describes. `env` is rlaunch's environment, which the ranks start from.
pub fn build(o: &Options, env: &[(OsString, OsString)]) -> Result<job::Plan, PlanError> {
    let started_us = rlaunch_protocol::record::now_us();
    let own_host = own_host();
    let getenv = |name: &str| {
        env.iter().find(|(k, _)| k == name).map(|(_, v)| v.to_string_lossy().into_owned())
    };
    let needs_hosts = o.segments.iter().any(|s| s.hosts.is_none());
    let scheduler = match o.rmk {
        Rmk::Use(scheduler) => Some(scheduler),
        Rmk::Detect if needs_hosts => allocation::detect(getenv),
        Rmk::Detect | Rmk::Off => None,
    };
    let allocation = scheduler.map(|s| read_allocation(s, getenv)).transpose()?;
    let slurm = allocation.as_ref().is_some_and(|a| a.scheduler == Scheduler::Slurm);
    // Inside an allocation, the scheduler's own launcher starts the proxies unless told
    // otherwise (PBS's pbsdsh carries no stdin, so PBS keeps ssh).
    let launcher = o.launcher.or_else(|| match allocation.as_ref()?.scheduler {
        Scheduler::Slurm => Some(LauncherKind::Slurm),
        Scheduler::GridEngine => Some(LauncherKind::Sge),
        Scheduler::Lsf => Some(LauncherKind::Lsf),
        Scheduler::Pbs => None,
    });
    let mut notices = Vec::new();
    let layout = layout::layout(o, |unit| {
        let machine = rlaunch_topology::Machine::of_this_process(false)?;
        Ok(machine.objects(unit).len())
    })?;
    let lists = host_lists(o, layout.ppn, &own_host, allocation.as_ref(), &mut notices)?;
    let size = lists.size()?;
    lists.fit_hosts()?;
    let by_node = o.map_by == MapBy::Node;
    let rank_hosts = place::place_segments(&lists.hosts, &lists.segments, by_node);
    let universe = place::Universe::new(&lists.hosts, by_node, size);
    let proxy_exe = proxy_exe()?;
    let bootstrap = bootstrap(o, launcher, &proxy_exe, getenv("SGE_BINARY_PATH"));
    let stdin = stdin_target(&o.stdin, size)?;

    // With srun, every node's proxy is srun's, this machine's too: Slurm then sees and
    // accounts for every rank. Each dials its parent in the tree.
    let dialing = launcher == Some(LauncherKind::Slurm);
    let bootstrap = if dialing { Bootstrap::Dial } else { bootstrap };
    let forced_remote = launcher.is_some_and(|l| l != LauncherKind::Fork);
    let fork_host = |name: &str| {
        bootstrap == Bootstrap::Fork || (!forced_remote && hosts::is_local(name, &own_host))
    };
    let tree::Nodes { nodes, hosts: node_hosts, rank_node } =
        tree::group_nodes(&rank_hosts, lists.rank_segments(), fork_host);
    let forked_ranks = nodes.iter().filter(|n| n.fork).map(|n| n.ranks.len() as u32).sum();
    let rendezvous = rendezvous(&nodes, &rank_node);
    // The rabit tracker listens where every node reaches this machine.
    let tracker = match o.rabit {
        true => {
            let addr = reached_here(&nodes).unwrap_or_else(rlaunch_proxy::rendezvous::own_address);
            let listener = crate::tracker::listen(addr)
                .map_err(|error| SetupError::Tracker { addr, error })?;
            Some(listener)
        }
        false => None,
    };
    let roots = tree::build_tree(nodes, o.tree_width);
    tracing::debug!(nodes = node_hosts.len(), depth = tree::depth(&roots), "plan ready");
    let dial = if dialing {
        let bind = match o.bind_address {
            Some(ip) => ip,
            None => job::reaching(&node_hosts)
                .map_err(|(node, cause)| SetupError::NoRoute { node, cause })?,
        };
        Some(job::DialPlan {
            launcher: o.launcher_exec.clone().unwrap_or_else(|| vec!["srun".into()]),
            proxy_path: o.proxy_path.clone().unwrap_or_else(|| proxy_exe.to_string_lossy().into()),
            bind,
            // Inside a step, whatever said where the hosts are.
            overlap: getenv("SLURM_STEP_ID").is_some(),
            silence: std::time::Duration::from_millis(o.liveness.silence_ms),
        })
    } else {
        None
    };

    let segments = segments(o, env);
    let job_env = job_env(o, env);
    let bcast = bcast::bcast(&o.bcast, o.bcast_dir.as_ref(), &segments, &job_env)?;
    let (bcast, bcast_files) = bcast.unzip();
    // Built (and `--pset` checked) whether or not PMIx is served.
    let pmix = pmix_job(o, &node_hosts, &rank_node, lists.rank_segments().collect(), size)?;
    let built_in = rlaunch_proxy::pmix::version().is_some();
    let pmix = match serves_pmix(o.pmi, &segments, &job_env) {
        // This rlaunch forks its machine's proxies from itself: said once for the job, here,
        // not by each node's proxy.
        Serve::Yes { required: true, .. } if !built_in => {
            let asks = match o.pmi {
                PmiKinds::Pmix => "--pmi pmix asks for PMIx",
                _ => "the program needs PMIx (it links Open MPI or libpmix)",
            };
            return Err(SetupError::NoPmix { asks }.into());
        }
        Serve::Yes { required: false, late: false } if !built_in => {
            let get = rlaunch_proxy::pmix::GET_PMIX;
            notices.push(format!("PMIx is not served: this rlaunch was built without it; {get}"));
            None
        }
        Serve::No => None,
        Serve::Yes { required, late } => Some(PmixJob { required, late, ..pmix }),
    };
    // Created now, so that a path that cannot be written stops the launch, not the end.
    let out_file = |what, path: &Option<std::path::PathBuf>| {
        let create = |path: &std::path::PathBuf| {
            let error = |error| SetupError::EndFile { what, path: path.clone(), error };
            OutFile::create(path.clone()).map_err(error)
        };
        path.as_ref().map(create).transpose()
    };
    let report = out_file("report", &o.report)?;
    let timeline = out_file("timeline", &o.timeline)?;
    let job = Job {
        jobid: job_id(),
        size,
        segments,
        env: job_env,
        stdin,
        kill_grace_ms: o.kill_grace.as_millis() as u64,
        bootstrap,
        process_mapping: place::process_mapping(&rank_node),
        pmi_port: o.pmi_port,
        mapping: layout.mapping,
        binding: layout.binding,
        spread: layout.spread,
        gpus: layout.gpus,
        liveness: o.liveness,
        pmix,
        progress: job::progress::wanted(node_hosts.len(), getenv),
        forked_ranks,
        nodes: node_hosts.len() as u32,
        rendezvous,
        tracker: tracker.as_ref().map(|t| (t.addr.to_string(), t.port)),
        slurm_nodes: slurm.then(|| node_hosts.join(",")),
        report_vars: report.is_some(),
        restart: 0,
        max_restarts: o.max_restarts,
        goes_on: o.goes_on,
        adoption: None,
        bcast,
    };
    let spares = spares(&o.spare_hosts, &lists.hosts, &node_hosts);
    Ok(job::Plan {
        job,
        roots,
        node_hosts,
        rank_node,
        proxy_exe,
        output: o.output.clone(),
        print_all_exit_codes: o.print_all_exit_codes,
        timeout: o.timeout,
        hang_report: o.hang_report,
        stall_report: o.stall_report,
        report_bindings: o.report_bindings,
        forked: Vec::new(),
        dial,
        notices,
        report,
        timeline,
        command: o.command.clone(),
        started_us,
        universe,
        own_host,
        forced_remote,
        tracker,
        restart_backoff: o.restart_backoff,
        spares,
        orphan_listener: None,
        bcast_files: bcast_files.unwrap_or_default(),
    })
}

/// Where rank 0 serves the frameworks' rendezvous, if rank 0 runs on this machine (see
/// [`reached_here`]). `None` leaves the choice to rank 0's proxy (it runs elsewhere, or no
/// address was found here).
fn rendezvous(
    nodes: &[rlaunch_protocol::control::NodePlan],
    rank_node: &[u32],
) -> Option<rlaunch_protocol::control::Rendezvous> {
    let first = &nodes[*rank_node.first()? as usize];
    if !first.fork {
        return None;
    }
    let addr = reached_here(nodes)?;
    rlaunch_proxy::rendezvous::pick(addr).inspect_err(|e| tracing::debug!("no free port: {e}")).ok()
}

/// An address of this machine that every node reaches: loopback when every node is this
/// machine (fake nodes of `--launcher fork` included), else the local end of the route to
/// the others (`job::reaching`); `None` if there is none.
fn reached_here(nodes: &[rlaunch_protocol::control::NodePlan]) -> Option<std::net::IpAddr> {
    if nodes.iter().all(|n| n.fork) {
        return Some(std::net::IpAddr::V4(std::net::Ipv4Addr::LOCALHOST));
    }
    let others: Vec<String> = nodes.iter().filter(|n| !n.fork).map(|n| n.host.clone()).collect();
    job::reaching(&others)
        .inspect_err(
            |(node, e)| tracing::debug!(%node, "no address of this machine reaches it: {e}"),
        )
        .ok()
}

/// Whether the job's nodes start a PMIx server, and must.
enum Serve {
    No,
    /// `required`: a node that cannot serve PMIx fails the job rather than start ranks
    /// that would run as singletons (`--pmi pmix`, or a program linking Open MPI). `late`:
    /// each node's server starts when a rank first connects (see `PmixJob::late`).
    Yes {
        required: bool,
        late: bool,
    },
}

/// Whether the job's nodes start a PMIx server: `--pmi`, or (by default) whether any of its
/// programs, found as the ranks will find them and with the libraries the loader would map
/// for them, can be a PMIx client.
fn serves_pmix(kinds: PmiKinds, segments: &[Segment], job_env: &[(Vec<u8>, Vec<u8>)]) -> Serve {
    let mut uses = std::collections::HashSet::new();
    if kinds != PmiKinds::Simple {
        let mut loader = ldso::Loader::default();
        // Segments of one program and environment are judged once.
        let mut judged = std::collections::HashMap::new();
        for segment in segments {
            let var = |name: &[u8]| segment_var(segment, job_env, name);
            let path = var(b"PATH").unwrap_or(b"/bin:/usr/bin");
            let found = find_program(&segment.exe, path, &segment.wdir);
            let wdir = std::path::Path::new(std::ffi::OsStr::from_bytes(&segment.wdir));
            let search = ldso::Search::new(var(b"LD_LIBRARY_PATH"), var(b"LD_PRELOAD"), wdir);
            let uses_pmix =
                *judged.entry((found.clone(), search)).or_insert_with_key(|(found, search)| {
                    match found {
                        Some(found) => pmix_use::pmix_use(found, search, &mut loader),
                        None => pmix_use::PmixUse::Maybe,
                    }
                });
            tracing::debug!(program = ?found, ?uses_pmix, "does the program use PMIx?");
            uses.insert(uses_pmix);
        }
    }
    let needed = uses.contains(&pmix_use::PmixUse::Needs);
    match kinds {
        PmiKinds::Simple => Serve::No,
        PmiKinds::Pmix => Serve::Yes { required: true, late: false },
        PmiKinds::All => Serve::Yes { required: needed, late: false },
        // Programs that only may use PMIx (a shell, python) get a server when a rank asks.
        PmiKinds::Auto if needed => Serve::Yes { required: true, late: false },
        PmiKinds::Auto if uses.contains(&pmix_use::PmixUse::Maybe) => {
            Serve::Yes { required: false, late: true }
        }
        PmiKinds::Auto => Serve::No,
    }
}

/// A variable as a segment's ranks will have it: its own `-env` pairs (the last one wins),
/// else the job's, unless the segment starts from an environment of its own.
fn segment_var<'a>(
    segment: &'a Segment,
    job_env: &'a [(Vec<u8>, Vec<u8>)],
    name: &[u8],
) -> Option<&'a [u8]> {
    let own = segment.env.iter().rev().find(|(k, _)| k == name);
    let inherited =
        || job_env.iter().rev().find(|(k, _)| k == name).filter(|_| segment.inherit_env);
    own.or_else(inherited).map(|(_, v)| v.as_slice())
}

/// `exe` as the ranks' execvp finds it: a name with a slash from the working directory,
/// else on `path`.
fn find_program(exe: &[u8], path: &[u8], wdir: &[u8]) -> Option<std::path::PathBuf> {
    let exe = std::path::Path::new(std::ffi::OsStr::from_bytes(exe));
    let wdir = std::path::Path::new(std::ffi::OsStr::from_bytes(wdir));
    if exe.as_os_str().as_bytes().contains(&b'/') {
        return Some(wdir.join(exe));
    }
    path.split(|&b| b == b':')
        .map(|dir| {
            let dir = std::path::Path::new(std::ffi::OsStr::from_bytes(if dir.is_empty() {
                b"."
            } else {
                dir
            }));
            wdir.join(dir).join(exe)
        })
        .find(|candidate| candidate.is_file())
}

/// What each node's PMIx server must know of the job, with its process sets: one per
/// application (`rlaunch://app/N`), one per node (`rlaunch://node/HOST`), and `--pset`'s.
fn pmix_job(
    o: &Options,
    hosts: &[String],
    rank_node: &[u32],
    rank_app: Vec<u32>,
    size: u32,
) -> Result<PmixJob, PlanError> {
    let members = |of: &[u32], which: u32| {
        of.iter().enumerate().filter(|(_, &x)| x == which).map(|(r, _)| r as u32).collect()
    };
    let mut psets: Vec<(String, Vec<u32>)> = (0..o.segments.len() as u32)
        .map(|app| (format!("rlaunch://app/{app}"), members(&rank_app, app)))
        .collect();
    psets.extend(
        hosts
            .iter()
            .enumerate()
            .map(|(n, h)| (format!("rlaunch://node/{h}"), members(rank_node, n as u32))),
    );
    for (name, ranges) in &o.psets {
        if psets.iter().any(|(n, _)| n == name) {
            return Err(UsageError::PsetTwice { name: name.clone() }.into());
        }
        let mut ranks = Vec::new();
        for &(first, last) in ranges {
            if last >= size {
                let (name, rank) = (name.clone(), last);
                return Err(UsageError::PsetBeyondJob { name, rank, size }.into());
            }
            ranks.extend(first..=last);
        }
        ranks.sort_unstable();
        ranks.dedup();
        psets.push((name.clone(), ranks));
    }
    let (hosts, rank_node) = (hosts.to_vec(), rank_node.to_vec());
    Ok(PmixJob { hosts, rank_node, rank_app, psets, required: false, late: false })
}

/// The hosts that may take a lost node's ranks on a restart: `--spare-hosts`, then the hosts
/// of the job's lists that no rank was placed on, each once, none that runs ranks.
fn spares(asked: &[String], lists: &[Vec<Host>], used: &[String]) -> Vec<String> {
    let listed = lists.iter().flatten().map(|h| &h.name);
    // Sets: a hostfile of 12,000 hosts and `-n 1` has 11,999 spares.
    let mut seen: std::collections::HashSet<&String> = used.iter().collect();
    asked.iter().chain(listed).filter(|host| seen.insert(host)).cloned().collect()
}

/// The host lists the segments draw on, and how many ranks each segment takes from which.
struct HostLists {
    /// Each distinct source once, however many segments use it.
    hosts: Vec<Vec<Host>>,
    /// Per segment: (index into `hosts`, rank count).
    segments: Vec<(usize, u32)>,
}

impl HostLists {
    /// The ranks of the whole job.
    fn size(&self) -> Result<u32, PlanError> {
        let size = self.segments.iter().try_fold(0u32, |sum, (_, n)| sum.checked_add(*n));
        size.ok_or(PlanError::Usage(UsageError::TooManyRanks))
    }

    /// Refuses more ranks than their hosts could run before anything is laid out per rank:
    /// `-n 4000000000` (or a hostfile's `n1:4294967295`) would otherwise fill all memory.
    fn fit_hosts(&self) -> Result<(), PlanError> {
        for (list, hosts) in self.hosts.iter().enumerate() {
            let ranks: u64 =
                self.segments.iter().filter(|(l, _)| *l == list).map(|(_, n)| u64::from(*n)).sum();
            if ranks > hosts.len() as u64 * MAX_RANKS_PER_HOST {
                let hosts = hosts.len();
                return Err(UsageError::RanksBeyondHosts { ranks, hosts }.into());
            }
        }
        Ok(())
    }

    /// The segment of each rank, ranks numbered across segments.
    fn rank_segments(&self) -> impl Iterator<Item = u32> + '_ {
        let segments = self.segments.iter().enumerate();
        segments.flat_map(|(s, (_, n))| (0..*n).map(move |_| s as u32))
    }
}

/// The allocation of `scheduler`, read from rlaunch's environment.
fn read_allocation(
    scheduler: Scheduler,
    getenv: impl Fn(&str) -> Option<String>,
) -> Result<Allocation, PlanError> {
    let found = allocation::read(scheduler, getenv).map_err(UsageError::from)?;
    tracing::info!(
        hosts = found.hosts.len(),
        slots = found.slots(),
        "hosts from the {} allocation",
        scheduler.name()
    );
    Ok(found)
}

/// Reads each segment's hosts (`--ppn` overrides their slots); a segment without `-n` gets
/// as many ranks as its hosts have slots. Segments without hosts of their own take the
/// `allocation`'s, if there is one; past its slots, placement wraps around (Hydra's rule)
/// and `notices` says so.
fn host_lists(
    o: &Options,
    ppn: Option<u32>,
    own_host: &str,
    allocation: Option<&Allocation>,
    notices: &mut Vec<String>,
) -> Result<HostLists, PlanError> {
    let mut sources = Vec::new();
    let mut lists = HostLists { hosts: Vec::new(), segments: Vec::new() };
    for seg in &o.segments {
        let list = match sources.iter().position(|s| *s == seg.hosts.as_ref()) {
            Some(i) => i,
            None => {
                let mut hosts = match (seg.hosts.as_ref(), allocation) {
                    (None, Some(allocation)) => allocation.hosts.clone(),
                    (source, _) => read_hosts(source, own_host).map_err(UsageError::from)?,
                };
                if let Some(ppn) = ppn {
                    hosts.iter_mut().for_each(|h| h.slots = ppn);
                }
                sources.push(seg.hosts.as_ref());
                lists.hosts.push(hosts);
                lists.hosts.len() - 1
            }
        };
        let slots = lists.hosts[list].iter().fold(0u32, |sum, h| sum.saturating_add(h.slots));
        lists.segments.push((list, seg.np.unwrap_or(slots)));
    }
    if let Some(allocation) = allocation {
        let slots = allocation.slots();
        let ranks: u32 = o
            .segments
            .iter()
            .zip(&lists.segments)
            .filter(|(seg, _)| seg.hosts.is_none())
            .map(|(_, (_, n))| *n)
            .sum();
        if ranks > slots && ppn.is_none() {
            notices.push(format!(
                "note: {ranks} ranks on the {slots} slots of the {} allocation: placement \
                 wraps around",
                allocation.scheduler.name()
            ));
        }
    }
    Ok(lists)
}

/// A segment's hosts: its own source, or this machine with one slot.
fn read_hosts(source: Option<&HostSource>, own_host: &str) -> Result<Vec<Host>, HostsError> {
    match source {
        Some(HostSource::List(list)) => hosts::parse_host_list(list),
        Some(HostSource::File(path)) => hosts::read_hostfile(path),
        None => Ok(vec![Host { name: own_host.to_string(), slots: 1 }]),
    }
}

/// How proxies on other machines are started: by fork everywhere (`--launcher fork`), or
/// over the remote shell, which runs `proxy_path` there. `sge_bin` is Grid Engine's
/// `SGE_BINARY_PATH`, where its `qrsh` is when the job's PATH does not have it (a standard
/// install keeps it in `$SGE_ROOT/bin/<arch>`, which jobs do not get on their PATH).
fn bootstrap(
    o: &Options,
    launcher: Option<LauncherKind>,
    proxy_exe: &OsString,
    sge_bin: Option<String>,
) -> Bootstrap {
    if launcher == Some(LauncherKind::Fork) {
        return Bootstrap::Fork;
    }
    let argv = match &o.launcher_exec {
        Some(argv) => argv.clone(),
        None => match launcher {
            Some(LauncherKind::Rsh) => vec!["rsh".to_string()],
            // Inside the job: the proxies are the scheduler's tasks, in its accounting.
            Some(LauncherKind::Sge) => {
                let on_path = std::env::var_os("PATH").is_some_and(|path| {
                    std::env::split_paths(&path).any(|dir| dir.join("qrsh").is_file())
                });
                let qrsh = match sge_bin {
                    Some(dir) if !on_path => format!("{}/qrsh", dir.trim_end_matches('/')),
                    _ => "qrsh".into(),
                };
                vec![qrsh, "-inherit".into()]
            }
            Some(LauncherKind::Lsf) => vec!["blaunch".into()],
            _ => vec!["ssh".into(), "-x".into(), "-oBatchMode=yes".into()],
        },
    };
    let proxy_path = match &o.proxy_path {
        Some(p) => p.clone(),
        None => proxy_exe.to_string_lossy().into_owned(),
    };
    Bootstrap::Remote { argv, proxy_path }
}

/// `--stdin`: a rank of the job, `all` or `none`.
fn stdin_target(word: &str, size: u32) -> Result<StdinTarget, PlanError> {
    match word {
        "all" => Ok(StdinTarget::All),
        "none" => Ok(StdinTarget::None),
        r => match r.parse::<u32>() {
            Ok(rank) if rank < size => Ok(StdinTarget::Rank(rank)),
            Ok(rank) => Err(UsageError::StdinBeyondJob { rank, size }.into()),
            Err(_) => Err(UsageError::StdinTarget(r.to_string()).into()),
        },
    }
}

/// The job-wide environment: rlaunch's, as `-genvnone`/`-genvlist` filter it, then `-genv`
/// and `-x` in order.
fn job_env(o: &Options, env: &[(OsString, OsString)]) -> Vec<(Vec<u8>, Vec<u8>)> {
    let mut vars = o.env_base.filter(env);
    vars.extend(o.genv.iter().cloned());
    vars
}

/// Each segment's program, arguments, directory and environment. A segment that filters
/// rlaunch's environment itself (`-envnone` ...) carries its whole environment; the others
/// add their `-env` pairs to the job's.
fn segments(o: &Options, env: &[(OsString, OsString)]) -> Vec<Segment> {
    o.segments
        .iter()
        .map(|seg| {
            let (exe, args) = seg.command.split_first().expect("every segment has a program");
            let (inherit_env, mut vars) = match &seg.env_base {
                None => (true, Vec::new()),
                Some(base) => {
                    let mut vars = base.filter(env);
                    vars.extend(o.genv.iter().cloned());
                    (false, vars)
                }
            };
            vars.extend(seg.env.iter().cloned());
            Segment {
                exe: exe.as_bytes().to_vec(),
                args: args.iter().map(|a| a.as_bytes().to_vec()).collect(),
                inherit_env,
                env: vars,
                wdir: seg.wdir.clone().into_os_string().into_vec(),
            }
        })
        .collect()
}

/// This machine's name, for telling which hosts are local.
fn own_host() -> String {
    hostname::get().map(|h| h.to_string_lossy().into_owned()).unwrap_or_else(|_| "localhost".into())
}

/// The `rlaunch-proxy` installed next to this `rlaunch`.
pub(crate) fn proxy_exe() -> Result<OsString, SetupError> {
    let me = std::env::current_exe().map_err(SetupError::OwnExecutable)?;
    let proxy = me.with_file_name("rlaunch-proxy");
    if !proxy.is_file() {
        return Err(SetupError::NoProxy(proxy));
    }
    Ok(proxy.into_os_string())
}

/// Unique per run: also the PMI kvsname, so short and free of spaces.
fn job_id() -> String {
    let nanos = SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.subsec_nanos()).unwrap_or(0);
    format!("rlaunch_{}_{:08x}", std::process::id(), nanos)
}
