//! What rlaunch says about a job once it is over: `--report FILE` (JSON, schema in
//! docs/report.md) and, when ranks failed, the short table at the end of stderr.
//!
//! Every time in the report is on rlaunch's clock, in microseconds since the Unix epoch: a
//! node's times are moved by its clock's offset (the sum of the offsets measured by each
//! parent down its path, see `rlaunch_protocol::record`).

use rlaunch_protocol::ids::{Gid, NodeId};
use std::collections::{BTreeMap, HashMap};
use std::fs::File;
use std::io::{self, Write};
use std::path::PathBuf;

use rlaunch_protocol::ids::ExitOutcome;
use rlaunch_protocol::record::{GpuUse, Micros, NodeRecord, OwnUsage, RankRecord};
use rlaunch_protocol::survey::ProcessNow;
use serde::Serialize;

use super::roll::Roll;

/// The version of the report's schema, bumped when a field changes meaning or goes.
const SCHEMA: u32 = 1;
/// Rows of the failure table before "and N more".
const TABLE_ROWS: usize = 10;

/// A file written when the job is over (`--report`, `--timeline`), opened (created,
/// emptied) before the job starts, so that a path that cannot be written fails the launch
/// rather than the end.
pub struct OutFile {
    pub path: PathBuf,
    pub file: File,
}

impl OutFile {
    pub fn create(path: PathBuf) -> io::Result<OutFile> {
        let file = File::create(&path)?;
        Ok(OutFile { path, file })
    }

    /// Writes `value` as JSON, on one line (`jq .` makes it pretty).
    pub(crate) fn write_json(&mut self, value: &impl Serialize) -> io::Result<()> {
        let mut w = io::BufWriter::with_capacity(256 << 10, &mut self.file);
        serde_json::to_writer(&mut w, value)?;
        w.write_all(b"\n")?;
        w.flush()
    }
}

/// A node's record with where its clock stands: its offset from rlaunch's clock and the
/// round trips that measured it (see [`path_round_trip`]).
pub(crate) struct Placed<'a> {
    pub record: &'a NodeRecord,
    pub offset: i64,
    pub round_trip: u64,
}

impl Placed<'_> {
    /// A time of this node's, on rlaunch's clock.
    pub(crate) fn ours(&self, at: Micros) -> Micros {
        at.saturating_add_signed(-self.offset)
    }
}

/// Every node's record, each with its clock's offset from rlaunch's (the offsets measured by
/// each parent down its path, summed), in node order.
pub(crate) fn placed(records: &[NodeRecord]) -> Vec<Placed<'_>> {
    let mut nodes = Vec::new();
    for top in records {
        for (record, below) in top.walk() {
            let (offset, round_trip) = (top.offset_us + below, path_round_trip(top, record));
            nodes.push(Placed { record, offset, round_trip });
        }
    }
    nodes.sort_by_key(|p| p.record.node);
    nodes
}

/// What the job was and how it went, besides the ranks.
pub(crate) struct JobFacts<'a> {
    pub command: &'a [String],
    pub jobid: &'a str,
    pub started: Micros,
    pub ended: Micros,
    pub exit_code: i32,
    /// The first culprit line, as printed.
    pub cause: Option<String>,
    /// The launched job's fences that completed (PMI-1/2 and PMIx).
    pub fences: u64,
    /// `--tracker rabit`: its rendezvous, from the first worker's connection to every
    /// worker's links assigned; `None` if it never had them all.
    pub tracker: Option<(Micros, Micros)>,
    /// The hang report made at the timeout.
    pub hang: Option<&'a super::hang::HangFacts>,
    /// The attempts before the last (`--max-restarts`), in order.
    pub attempts: &'a [AttemptFacts],
    /// What rlaunch itself used.
    pub usage: OwnUsage,
}

/// An attempt of the job that ended in a restart.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct AttemptFacts {
    #[serde(rename = "start_us")]
    pub started: Micros,
    #[serde(rename = "end_us")]
    pub ended: Micros,
    /// The status its cause would have given the job.
    pub exit_code: i32,
    /// Its cause's line, as printed.
    pub cause: String,
}

#[derive(Serialize)]
struct Report<'a> {
    schema: u32,
    rlaunch: &'static str,
    job: Job<'a>,
    ranks: Vec<Rank<'a>>,
    nodes: Vec<Node<'a>>,
}

#[derive(Serialize)]
struct Job<'a> {
    command: &'a [String],
    jobid: &'a str,
    start_us: Micros,
    end_us: Micros,
    wall_s: f64,
    exit_code: i32,
    cause: Option<String>,
    fences: u64,
    tracker: Option<Span>,
    /// The hang report made at `--timeout`, before the job was killed.
    hang: Option<Hang<'a>>,
    /// `--max-restarts`: every attempt before the last, which the rest of the report is of.
    #[serde(skip_serializing_if = "<[_]>::is_empty")]
    restarts: &'a [AttemptFacts],
    rlaunch_usage: Usage,
}

/// What a process of the tree itself used: rlaunch (`job.rlaunch_usage`) or a node's proxy
/// (`nodes[].proxy_usage`).
#[derive(Serialize)]
struct Usage {
    user_s: f64,
    system_s: f64,
    maxrss_kib: u64,
    /// Open descriptors once every rank below it had started; `null` if they never all did.
    fds_running: Option<u32>,
}

impl From<OwnUsage> for Usage {
    fn from(u: OwnUsage) -> Usage {
        Usage {
            user_s: u.user_us as f64 / 1e6,
            system_s: u.system_us as f64 / 1e6,
            maxrss_kib: u.maxrss_kib,
            fds_running: (u.fds_running != 0).then_some(u.fds_running),
        }
    }
}

#[derive(Serialize)]
struct Hang<'a> {
    at_us: Micros,
    /// Its lines, as printed.
    lines: &'a [String],
    /// Proxies that did not answer in time, by host.
    unanswered: &'a [String],
}

/// A rank as the hang report found it.
#[derive(Serialize)]
struct AtHang {
    /// proc(5)'s state letter, or `ended`, `never started`.
    state: String,
    cpu_s: Option<f64>,
    rss_kib: Option<u64>,
    /// Where it was in its job's fences, as `rlaunch ps` words it.
    pmi: String,
    /// Its threads' stacks (those on one path once), each outermost call first, as the
    /// report prints frames; none unless the stacks were read.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    stacks: Vec<Vec<String>>,
}

/// A stretch of the job on rlaunch's clock.
#[derive(Serialize)]
struct Span {
    start_us: Micros,
    end_us: Micros,
    wall_s: f64,
}

#[derive(Serialize)]
struct Rank<'a> {
    /// Its id in the run: the rank for the launched job, then spawned jobs' processes.
    id: Gid,
    /// 0 for the launched job, then one per MPI_Comm_spawn.
    job: u32,
    rank: u32,
    segment: u32,
    host: &'a str,
    node: NodeId,
    pid: Option<u32>,
    start_us: Option<Micros>,
    end_us: Option<Micros>,
    wall_s: Option<f64>,
    exit_code: Option<i32>,
    signal: Option<i32>,
    /// Why it never ran (`SpawnFailed`, `NoWorkdir`), as the culprit line words it.
    failed_to_start: Option<String>,
    /// Why it failed, as it wrote it in its error file (`TORCHELASTIC_ERROR_FILE`), and the
    /// traceback it gave.
    error: Option<&'a str>,
    traceback: Option<&'a str>,
    user_s: f64,
    system_s: f64,
    maxrss_kib: u64,
    stdout_bytes: Option<u64>,
    stderr_bytes: Option<u64>,
    /// When it initialised PMI, and when its first output was read.
    pmi_init_us: Option<Micros>,
    first_output_us: Option<Micros>,
    /// The variables rlaunch set for it (its place, the frameworks' contract), by name;
    /// `null` if its node's report never came.
    vars: Option<BTreeMap<&'a str, &'a str>>,
    /// The CPUs it was bound to, a cpulist; `null`: not bound (or no node report).
    cpus: Option<&'a str>,
    /// The GPUs it was given; `null`: its job asked for none (or no node report).
    gpus: Option<&'a [GpuUse]>,
    /// Where it was when the job timed out; `null` without a hang report (or an answer
    /// from its node).
    at_hang: Option<AtHang>,
}

#[derive(Serialize)]
struct Node<'a> {
    node: NodeId,
    host: &'a str,
    proxy_pid: u32,
    /// Its clock minus rlaunch's, and the round trips that measured it, summed down its path.
    clock_offset_us: i64,
    round_trip_us: u64,
    /// Phase name to the time it was reached.
    phases: BTreeMap<&'static str, Micros>,
    proxy_usage: Usage,
}

/// Writes the report of a job that is over.
pub(crate) fn write(
    out: &mut OutFile,
    facts: &JobFacts,
    roll: &Roll,
    records: &[NodeRecord],
) -> io::Result<()> {
    out.write_json(&build(facts, roll, &placed(records)))
}

/// What each node saw of each rank, with the node's clock offset, by rank id.
pub(crate) fn seen_ranks<'a>(nodes: &[Placed<'a>]) -> HashMap<Gid, (&'a RankRecord, i64)> {
    let mut seen = HashMap::new();
    for node in nodes {
        for rank in &node.record.ranks {
            seen.insert(rank.rank, (rank, node.offset));
        }
    }
    seen
}

fn build<'a>(facts: &'a JobFacts, roll: &'a Roll, placed: &[Placed<'a>]) -> Report<'a> {
    let seen = seen_ranks(placed);
    let hang_ranks = facts.hang.map(|h| {
        let waited = super::hang::waited_fences(&h.survey.ranks);
        let ranks = h.survey.ranks.iter().map(|r| {
            let (state, cpu_s, rss_kib) = match r.process {
                ProcessNow::Live { state, cpu_ms, rss_kib } => {
                    (state.to_string(), Some(cpu_ms as f64 / 1000.0), Some(rss_kib))
                }
                ProcessNow::Ended(_) => ("ended".to_string(), None, None),
                ProcessNow::NeverStarted => ("never started".to_string(), None, None),
            };
            let pmi = super::hang::pmi_words(r, &waited);
            let stacks = super::stacks::paths_of(&h.survey.stacks, r.rank);
            (r.rank, AtHang { state, cpu_s, rss_kib, pmi, stacks })
        });
        ranks.collect::<HashMap<Gid, AtHang>>()
    });
    let mut hang_ranks = hang_ranks.unwrap_or_default();
    let nodes = placed
        .iter()
        .map(|p| Node {
            node: p.record.node,
            host: &p.record.host,
            proxy_pid: p.record.pid,
            clock_offset_us: p.offset,
            round_trip_us: p.round_trip,
            phases: p.record.phases.iter().map(|&(ph, at)| (ph.name(), p.ours(at))).collect(),
            proxy_usage: p.record.usage.into(),
        })
        .collect();
    let ranks = roll
        .entries()
        .map(|e| {
            let (rank_seen, offset) = match seen.get(&e.gid) {
                Some(&(r, offset)) => (Some(r), offset),
                None => (None, 0),
            };
            let ours = |at: Micros| (at != 0).then(|| at.saturating_add_signed(-offset));
            let (start, end) = (ours(e.usage.started), ours(e.usage.ended));
            let (mut exit_code, mut signal, mut failed_to_start) = (None, None, None);
            match e.outcome {
                Some((_, ExitOutcome::Exited(code))) => exit_code = Some(code),
                Some((_, ExitOutcome::Signaled(sig))) => signal = Some(sig),
                Some((pid, outcome)) => failed_to_start = Some(roll.describe(e.gid, pid, outcome)),
                None => {}
            }
            Rank {
                id: e.gid,
                job: e.job,
                rank: e.rank,
                segment: e.segment,
                host: e.host,
                node: e.node,
                pid: e.outcome.map(|(pid, _)| pid).filter(|&pid| pid != 0),
                start_us: start,
                end_us: end,
                wall_s: start.zip(end).map(|(s, e)| e.saturating_sub(s) as f64 / 1e6),
                exit_code,
                signal,
                failed_to_start,
                error: e.error.map(|e| e.message.as_str()),
                traceback: e.error.and_then(|e| e.traceback.as_deref()),
                user_s: e.usage.user_us as f64 / 1e6,
                system_s: e.usage.system_us as f64 / 1e6,
                maxrss_kib: e.usage.maxrss_kib,
                stdout_bytes: rank_seen.map(|r| r.stdout_bytes),
                stderr_bytes: rank_seen.map(|r| r.stderr_bytes),
                pmi_init_us: rank_seen.and_then(|r| r.pmi_init).and_then(ours),
                first_output_us: rank_seen.and_then(|r| r.first_output).and_then(ours),
                vars: rank_seen.map(|r| {
                    r.vars.iter().map(|(name, value)| (name.as_str(), value.as_str())).collect()
                }),
                cpus: rank_seen.and_then(|r| r.cpus.as_deref()),
                gpus: rank_seen.and_then(|r| r.gpus.as_deref()),
                at_hang: hang_ranks.remove(&e.gid),
            }
        })
        .collect();
    Report {
        schema: SCHEMA,
        rlaunch: env!("CARGO_PKG_VERSION"),
        job: Job {
            command: facts.command,
            jobid: facts.jobid,
            start_us: facts.started,
            end_us: facts.ended,
            wall_s: facts.ended.saturating_sub(facts.started) as f64 / 1e6,
            exit_code: facts.exit_code,
            cause: facts.cause.clone(),
            fences: facts.fences,
            tracker: facts.tracker.map(|(start_us, end_us)| Span {
                start_us,
                end_us,
                wall_s: end_us.saturating_sub(start_us) as f64 / 1e6,
            }),
            hang: facts.hang.map(|h| Hang {
                at_us: h.at,
                lines: &h.lines,
                unanswered: &h.survey.unanswered,
            }),
            restarts: facts.attempts,
            rlaunch_usage: facts.usage.into(),
        },
        ranks,
        nodes,
    }
}

/// The round trips summed from `top` down to `record`: how far off its offset may be, twice.
fn path_round_trip(top: &NodeRecord, record: &NodeRecord) -> u64 {
    fn down(at: &NodeRecord, node: NodeId) -> Option<u64> {
        if at.node == node {
            return Some(at.round_trip_us);
        }
        at.children.iter().find_map(|c| down(c, node)).map(|below| below + at.round_trip_us)
    }
    down(top, record.node).unwrap_or(0)
}

/// The table of the ranks that ended badly on their own, for the end of stderr: nothing
/// unless there are two or more (one is the culprit line already). At most [`TABLE_ROWS`]
/// rows, in rank order, then how many more, and how many ranks the teardown ended.
pub(crate) fn failure_table(roll: &Roll) -> Vec<String> {
    let (failed, torn_down) = roll.failures();
    if failed.len() < 2 {
        return Vec::new();
    }
    let mut rows = vec![["rank".to_string(), "host".into(), "pid".into(), "how it ended".into()]];
    for &gid in failed.iter().take(TABLE_ROWS) {
        let Some((pid, outcome)) = roll.outcome(gid) else { continue };
        let pid = if pid == 0 { "-".to_string() } else { pid.to_string() };
        rows.push([roll.short_name(gid), roll.host(gid).to_string(), pid, outcome.to_string()]);
    }
    let width = |col: usize| rows.iter().map(|r| r[col].chars().count()).max().unwrap_or(0);
    let widths = [width(0), width(1), width(2)];
    let mut lines = vec![format!("{} ranks failed:", failed.len())];
    for [rank, host, pid, how] in &rows {
        let [w0, w1, w2] = widths;
        lines.push(format!("  {rank:<w0$}  {host:<w1$}  {pid:>w2$}  {how}"));
    }
    if failed.len() > TABLE_ROWS {
        lines.push(format!("  and {} more", failed.len() - TABLE_ROWS));
    }
    if torn_down > 0 {
        let ranks = if torn_down == 1 { "rank was" } else { "ranks were" };
        lines.push(format!("  ({torn_down} more {ranks} ended by the teardown)"));
    }
    lines
}
