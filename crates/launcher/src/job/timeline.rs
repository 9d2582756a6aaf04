//! `--timeline FILE`: the job's launch as a Chrome trace (the JSON trace-event format that
//! Perfetto and chrome://tracing open), from the same records as the report.
//!
//! Each node is a process track (`pid` = node index + 1; rlaunch's own track is pid 0), its
//! proxy a thread (`tid` 0) and each of its ranks a thread (`tid` = rank id + 1). Spans (`ph`
//! `X`): the node's bootstrap (started by its parent → its hello), its launch (launch
//! received → ranks started), each fence epoch (entered → completed), each rank's run
//! (started → reaped). Instants (`ph` `i`): each rank's PMI init and first output. Times are
//! microseconds since the job started, on rlaunch's clock.

use std::io;

use rlaunch_protocol::ids::ExitOutcome;
use rlaunch_protocol::record::{Micros, NodeRecord, Phase};
use serde::Serialize;
use serde_json::{json, Value};

use super::report::{placed, seen_ranks, JobFacts, OutFile};
use super::roll::Roll;

/// One trace event.
#[derive(Serialize)]
struct Event {
    name: String,
    cat: &'static str,
    ph: &'static str,
    ts: f64,
    #[serde(skip_serializing_if = "Option::is_none")]
    dur: Option<f64>,
    pid: u32,
    tid: u32,
    /// Instants: scoped to their thread.
    #[serde(skip_serializing_if = "Option::is_none")]
    s: Option<&'static str>,
    #[serde(skip_serializing_if = "Value::is_null")]
    args: Value,
}

/// A track's or row's name and place (`ph` `M`).
#[derive(Serialize)]
struct Meta {
    name: &'static str,
    ph: &'static str,
    pid: u32,
    tid: u32,
    args: MetaArgs,
}

#[derive(Serialize)]
struct MetaArgs {
    #[serde(skip_serializing_if = "Option::is_none")]
    name: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    sort_index: Option<u32>,
}

#[derive(Serialize)]
#[serde(untagged)]
enum Item {
    Meta(Meta),
    Event(Event),
}

#[derive(Serialize)]
struct Trace {
    #[serde(rename = "displayTimeUnit")]
    display_time_unit: &'static str,
    #[serde(rename = "otherData")]
    other_data: Value,
    #[serde(rename = "traceEvents")]
    trace_events: Vec<Item>,
}

/// Writes the timeline of a job that is over.
pub(crate) fn write(
    out: &mut OutFile,
    facts: &JobFacts,
    roll: &Roll,
    records: &[NodeRecord],
) -> io::Result<()> {
    out.write_json(&build(facts, roll, records))
}

fn build(facts: &JobFacts, roll: &Roll, records: &[NodeRecord]) -> Trace {
    let start = facts.started;
    let rel = |at: Micros| at.saturating_sub(start) as f64;
    let mut events = Vec::new();
    let mut meta = |pid: u32, tid: Option<u32>, name: String, sort: u32| {
        let (what, sort_what) = match tid {
            None => ("process_name", "process_sort_index"),
            Some(_) => ("thread_name", "thread_sort_index"),
        };
        let tid = tid.unwrap_or(0);
        let args = MetaArgs { name: Some(name), sort_index: None };
        events.push(Item::Meta(Meta { name: what, ph: "M", pid, tid, args }));
        let args = MetaArgs { name: None, sort_index: Some(sort) };
        events.push(Item::Meta(Meta { name: sort_what, ph: "M", pid, tid, args }));
    };
    meta(0, None, "rlaunch".into(), 0);
    if facts.tracker.is_some() {
        meta(0, Some(1), "rabit tracker".into(), 1);
    }
    let placed = placed(records);
    for p in &placed {
        let pid = p.record.node.0 + 1;
        meta(pid, None, format!("node {}: {}", p.record.node, p.record.host), pid);
        meta(pid, Some(0), "proxy".into(), 0);
    }
    for e in roll.entries().filter(|e| placed.iter().any(|p| p.record.node == e.node)) {
        meta(e.node.0 + 1, Some(e.gid.0 + 1), roll.name(e.gid), e.gid.0 + 1);
    }
    let mut spans = Vec::new();
    let mut span = |name: String, cat, pid, tid, from: Micros, to: Micros, args: Value| {
        let (ts, dur) = (rel(from), to.saturating_sub(from) as f64);
        spans.push(Event { name, cat, ph: "X", ts, dur: Some(dur), pid, tid, s: None, args });
    };
    span(
        "job".into(),
        "job",
        0,
        0,
        facts.started,
        facts.ended,
        json!({ "exit_code": facts.exit_code }),
    );
    if let Some((from, to)) = facts.tracker {
        span("rabit rendezvous".into(), "tracker", 0, 1, from, to, Value::Null);
    }
    for p in &placed {
        let pid = p.record.node.0 + 1;
        let at = |phase| p.record.phase(phase).map(|t| p.ours(t));
        if let (Some(from), Some(to)) = (at(Phase::Bootstrap), at(Phase::Hello)) {
            span("bootstrap".into(), "launch", pid, 0, from, to, Value::Null);
        }
        if let (Some(from), Some(to)) = (at(Phase::Launched), at(Phase::RanksStarted)) {
            span("spawn ranks".into(), "launch", pid, 0, from, to, Value::Null);
        }
        for f in &p.record.fences {
            let (from, to) = (p.ours(f.entered), p.ours(f.completed));
            span(
                format!("fence {}", f.epoch),
                "fence",
                pid,
                0,
                from,
                to,
                json!({ "epoch": f.epoch }),
            );
        }
    }
    let seen = seen_ranks(&placed);
    let mut instants = Vec::new();
    for e in roll.entries() {
        let (pid, tid) = (e.node.0 + 1, e.gid.0 + 1);
        let offset = seen.get(&e.gid).map_or(0, |&(_, offset)| offset);
        let ours = |at: Micros| at.saturating_add_signed(-offset);
        if e.usage.started != 0 && e.usage.ended != 0 {
            let ended = match e.outcome {
                Some((_, ExitOutcome::Exited(code))) => json!({ "exit_code": code }),
                Some((_, ExitOutcome::Signaled(sig))) => json!({ "signal": sig }),
                _ => Value::Null,
            };
            let (from, to) = (ours(e.usage.started), ours(e.usage.ended));
            span(roll.name(e.gid), "rank", pid, tid, from, to, ended);
        }
        let Some(&(rank, _)) = seen.get(&e.gid) else { continue };
        for (name, at) in [("PMI init", rank.pmi_init), ("first output", rank.first_output)] {
            if let Some(at) = at {
                let (ts, s) = (rel(ours(at)), Some("t"));
                let cat = "rank";
                instants.push(Event {
                    name: name.into(),
                    cat,
                    ph: "i",
                    ts,
                    dur: None,
                    pid,
                    tid,
                    s,
                    args: Value::Null,
                });
            }
        }
    }
    // Each attempt that ended in a restart (`--max-restarts`): a mark across the whole
    // trace, with its cause; the ranks and nodes drawn are the last attempt's.
    for (n, attempt) in facts.attempts.iter().enumerate() {
        instants.push(Event {
            name: format!("restart {}", n + 1),
            cat: "job",
            ph: "i",
            ts: rel(attempt.ended),
            dur: None,
            pid: 0,
            tid: 0,
            s: Some("g"),
            args: json!({ "cause": attempt.cause, "exit_code": attempt.exit_code }),
        });
    }
    // The hang report made at the timeout: a mark across the whole trace.
    if let Some(hang) = facts.hang {
        instants.push(Event {
            name: "hang report".into(),
            cat: "job",
            ph: "i",
            ts: rel(hang.at),
            dur: None,
            pid: 0,
            tid: 0,
            s: Some("g"),
            args: json!({ "lines": hang.lines }),
        });
    }
    events.extend(spans.into_iter().chain(instants).map(Item::Event));
    Trace {
        display_time_unit: "ms",
        other_data: json!({
            "rlaunch": env!("CARGO_PKG_VERSION"),
            "jobid": facts.jobid,
            "command": facts.command,
            "start_us": facts.started,
            "exit_code": facts.exit_code,
            "fences": facts.fences,
        }),
        trace_events: events,
    }
}
