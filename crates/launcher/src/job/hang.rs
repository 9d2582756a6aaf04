//! The hang report: where the ranks of a job that timed out were, said before it is killed.
//! rlaunch asks every proxy (`Down::Survey`); each answers for its own ranks and its
//! children's, merged ([`Gather`]), within [`SURVEY_WAIT`] in all. The report names the
//! ranks missing from each fence some ranks are waiting in, and every rank's process state.
//!
//! What a proxy knows of a fence depends on the PMI: a PMI-1 or PMI-2 rank asks its proxy
//! for each fence itself, so the ranks inside are known one by one. A PMIx client asks its
//! node's PMIx server, which tells the proxy only once every client of the node is in: the
//! ranks of a node whose server is in are known to wait, and a client that never connected
//! is known to be missing; of the others nothing is known.

use std::collections::BTreeMap;
use std::time::Duration;

use rlaunch_protocol::ids::Gid;
use rlaunch_protocol::survey::{PmiNow, ProcessNow, RankNow, Survey};
use rlaunch_tree::survey::Gather;

use super::cause::Cause;
use super::stacks::stack_lines;
use super::Root;
use crate::ctl::{Ask, Asked};
use crate::options::HangReport;

/// How long rlaunch waits for the proxies' answers before it kills the job all the same.
pub(super) const SURVEY_WAIT: Duration = Duration::from_secs(2);
/// The same with the ranks' stacks, which take each proxy some tens of milliseconds a rank
/// (docs/hangs.md): a bound, not what it takes.
pub(super) const STACKS_WAIT: Duration = Duration::from_secs(10);

/// The hang report of a job that timed out, for `--report` and the timeline.
pub(crate) struct HangFacts {
    /// When it was made, on rlaunch's clock.
    pub at: rlaunch_protocol::record::Micros,
    pub survey: Survey,
    /// Its lines, as printed.
    pub lines: Vec<String>,
}

/// `--stall-report`: what the job had done at the last look, and when to look again.
pub(super) struct StallWatch {
    every: Duration,
    /// When to look next; `None` while a look is on its way, and once the report is made.
    pub next: Option<tokio::time::Instant>,
    /// The activity of every node and the CPU time of every live rank, at the last look.
    last: Option<(u64, BTreeMap<Gid, u64>)>,
}

impl StallWatch {
    pub(super) fn new(every: Duration) -> StallWatch {
        StallWatch { every, next: Some(tokio::time::Instant::now() + every), last: None }
    }
}

/// Who waits for a survey's answers.
pub(super) enum Wanted {
    /// `--timeout`: the report on stderr, then the job is killed.
    Timeout,
    /// `rlaunch ps` or `rlaunch stacks` from another terminal: the answer goes back to it.
    Asked(Asked),
    /// `--stall-report`: has the job done anything since the last look?
    Stall,
    /// `--stall-report` found the job still: the report on stderr, and the job runs on.
    StallReport,
}

impl Root {
    /// `--timeout` came: the proxies are asked where every rank is, and the job is killed
    /// once they have answered (or [`SURVEY_WAIT`] is over).
    pub(super) fn timed_out(&mut self) {
        self.timeout_at = None;
        if self.plan.hang_report == HangReport::None || self.teardown.started() {
            return self.fail(Cause::TimedOut(self.plan.timeout.unwrap_or_default()));
        }
        self.survey_for(Wanted::Timeout);
    }

    /// Another terminal asks where the ranks are (`rlaunch ps`, `rlaunch stacks`).
    pub(super) fn asked(&mut self, asked: Asked) {
        if self.teardown.started() {
            let _ = asked.reply.send("the job is ending\n".to_string());
            return;
        }
        self.survey_for(Wanted::Asked(asked));
    }

    /// `--stall-report`: time to look again.
    pub(super) fn stall_check(&mut self) {
        if let Some(watch) = self.stall.as_mut() {
            watch.next = None;
        }
        if self.teardown.started() {
            return;
        }
        self.survey_for(Wanted::Stall);
    }

    /// A look for `--stall-report` came back: the report, once, if nothing moved since the
    /// last look, a whole interval ago; else the next look.
    fn stall_looked(&mut self, survey: &Survey) {
        let Some(watch) = self.stall.as_mut() else { return };
        let cpu: BTreeMap<Gid, u64> = survey
            .ranks
            .iter()
            .filter_map(|r| match r.process {
                ProcessNow::Live { cpu_ms, .. } => Some((r.rank, cpu_ms)),
                _ => None,
            })
            .collect();
        let now = (survey.activity, cpu);
        let still = !now.1.is_empty() && watch.last.as_ref() == Some(&now);
        if !still {
            watch.last = Some(now);
            watch.next = Some(tokio::time::Instant::now() + watch.every);
            return;
        }
        self.stall = None;
        match self.plan.hang_report {
            HangReport::Stacks => self.survey_for(Wanted::StallReport),
            _ => self.stall_report(survey),
        }
    }

    /// The `--stall-report` report, once.
    fn stall_report(&mut self, survey: &Survey) {
        let every = self.plan.stall_report.unwrap_or_default().as_secs_f64();
        let lines = self.report_lines(survey);
        let head = format!(
            "no rank has written output, spoken PMI or used CPU for {every} s; where the job is:"
        );
        self.say_report(&head, &lines);
    }

    /// The report's lines: the fences' (the rabit tracker's rendezvous among them) and the
    /// ranks' ([`report_lines`]), then the stacks.
    fn report_lines(&self, survey: &Survey) -> Vec<String> {
        let hosts = &self.plan.node_hosts;
        let mut lines = report_lines(survey, hosts, self.plan.job.size);
        let waiting = self.turnout.as_ref().and_then(|t| t.waiting());
        if let Some(line) = waiting.map(|(started, missing)| {
            tracker_line(survey, hosts, self.plan.job.size, started, &missing)
        }) {
            let at = lines.iter().position(|l| l.starts_with("ranks: ")).unwrap_or(lines.len());
            lines.insert(at, line);
        }
        lines.extend(stack_lines(&survey.stacks));
        lines
    }

    /// Whether what `wanted` waits for has the ranks' stacks.
    fn wants_stacks(&self, wanted: &Wanted) -> bool {
        match wanted {
            Wanted::Timeout | Wanted::StallReport => self.plan.hang_report == HangReport::Stacks,
            Wanted::Asked(Asked { ask, .. }) => *ask == Ask::Stacks,
            Wanted::Stall => false,
        }
    }

    /// A report on stderr: `head`, then its lines indented under it; nothing without lines.
    fn say_report(&mut self, head: &str, lines: &[String]) {
        if lines.is_empty() {
            return;
        }
        if let Some(progress) = self.progress.as_mut() {
            progress.clear();
        }
        eprintln!("rlaunch: {head}");
        for line in lines {
            eprintln!("rlaunch:   {line}");
        }
    }

    /// Asks the proxies where every rank is, unless a survey is on its way already: its
    /// answers serve `wanted` too.
    fn survey_for(&mut self, wanted: Wanted) {
        let stacks = self.wants_stacks(&wanted);
        match &self.survey {
            Some(gather) if stacks && !gather.stacks => return self.survey_next.push(wanted),
            Some(_) => self.surveyed_for.push(wanted),
            None => {
                self.surveyed_for.push(wanted);
                self.surveys += 1;
                let wait = if stacks { STACKS_WAIT } else { SURVEY_WAIT };
                let own = Survey::default();
                let gather = Gather::start(self.surveys, wait, stacks, own, &self.children);
                self.survey = Some(gather);
            }
        }
        self.survey_step();
    }

    /// A top proxy's answer.
    pub(super) fn survey_answered(&mut self, child: usize, id: u32, survey: Survey) {
        let taken = self.survey.as_mut().is_some_and(|g| g.answered(child, id, survey));
        match taken {
            true => self.survey_step(),
            false => tracing::debug!(child, id, "a survey answer nobody waits for"),
        }
    }

    /// The answers are used once no more can come.
    pub(super) fn survey_step(&mut self) {
        if self.survey.as_mut().is_some_and(|g| g.settled(&self.children)) {
            self.survey_done();
        }
    }

    /// Every answer is in, or its time is up: each who asked gets what it asked for.
    pub(super) fn survey_done(&mut self) {
        let Some(gather) = self.survey.take() else { return };
        let survey = gather.finish();
        let mut timed_out = false;
        let mut stall = false;
        for wanted in std::mem::take(&mut self.surveyed_for) {
            match wanted {
                Wanted::Timeout => timed_out = true,
                Wanted::Stall => stall = true,
                Wanted::StallReport => self.stall_report(&survey),
                Wanted::Asked(Asked { ask: Ask::Ps, reply }) => {
                    let _ =
                        reply.send(ps_table(&survey, &self.plan.node_hosts, self.plan.job.size));
                }
                Wanted::Asked(Asked { ask: Ask::Stacks, reply }) => {
                    let mut text = String::new();
                    for line in self.report_lines(&survey) {
                        text += &format!("{line}\n");
                    }
                    if text.is_empty() {
                        text = "no rank is running\n".to_string();
                    }
                    let _ = reply.send(text);
                }
            }
        }
        if stall && !timed_out {
            self.stall_looked(&survey);
        }
        if !timed_out {
            // Those who want the stacks, which this survey did not have, get the next.
            for wanted in std::mem::take(&mut self.survey_next) {
                self.survey_for(wanted);
            }
            return;
        }
        for wanted in std::mem::take(&mut self.survey_next) {
            if let Wanted::Asked(asked) = wanted {
                let _ = asked.reply.send("the job is ending\n".to_string());
            }
        }
        let after = self.plan.timeout.unwrap_or_default();
        let lines = self.report_lines(&survey);
        let head = format!("where the job was at its timeout ({} s):", after.as_secs_f64());
        self.say_report(&head, &lines);
        let at = rlaunch_protocol::record::now_us();
        self.hang = Some(HangFacts { at, survey, lines });
        self.fail(Cause::TimedOut(after));
    }
}

/// `rlaunch ps`: a line a rank, under a header.
pub(super) fn ps_table(survey: &Survey, hosts: &[String], size: u32) -> String {
    let mut ranks: Vec<&RankNow> = survey.ranks.iter().collect();
    ranks.sort_by_key(|r| (r.job, r.rank));
    let waited = waited_fences(&survey.ranks);
    let mut rows = vec![
        ["RANK", "JOB", "HOST", "PID", "STATE", "CPU(s)", "RSS(MiB)", "PMI"].map(String::from)
    ];
    for r in &ranks {
        let host = hosts.get(r.node.0 as usize).map_or("?", String::as_str);
        let (state, cpu, rss) = match r.process {
            ProcessNow::Live { state, cpu_ms, rss_kib } => (
                state.to_string(),
                format!("{:.2}", cpu_ms as f64 / 1000.0),
                format!("{:.1}", rss_kib as f64 / 1024.0),
            ),
            ProcessNow::Ended(Some(outcome)) => {
                (format!("ended: {outcome}"), "-".into(), "-".into())
            }
            ProcessNow::Ended(None) => ("ended".into(), "-".into(), "-".into()),
            ProcessNow::NeverStarted => ("never started".into(), "-".into(), "-".into()),
        };
        let pmi = pmi_words(r, &waited);
        let pid = if r.pid == 0 { "-".to_string() } else { r.pid.to_string() };
        rows.push([
            r.rank.0.to_string(),
            r.job.to_string(),
            host.to_string(),
            pid,
            state,
            cpu,
            rss,
            pmi,
        ]);
    }
    let widths: Vec<usize> =
        (0..8).map(|c| rows.iter().map(|row| row[c].chars().count()).max().unwrap_or(0)).collect();
    let mut text = String::new();
    for row in &rows {
        let cells: Vec<String> =
            row.iter().zip(&widths).map(|(cell, w)| format!("{cell:<w$}")).collect();
        text += cells.join("  ").trim_end();
        text += "\n";
    }
    let seen = ranks.iter().filter(|r| r.job == 0).count();
    if seen < size as usize {
        text += &format!("({} of the job's {size} ranks not seen)\n", size as usize - seen);
    }
    for host in &survey.unanswered {
        text += &format!("(no answer from the proxy on {host} in {} s)\n", SURVEY_WAIT.as_secs());
    }
    text
}

/// The PMI-1/PMI-2 fence each job's ranks are waiting in, if any, by job.
pub(crate) fn waited_fences(ranks: &[RankNow]) -> BTreeMap<u32, u64> {
    let mut waited: BTreeMap<u32, u64> = BTreeMap::new();
    for r in ranks {
        if let PmiNow::Pmi { epoch, inside: true } = r.pmi {
            let e = waited.entry(r.job).or_insert(epoch);
            *e = (*e).max(epoch);
        }
    }
    waited
}

/// Where rank `r` is in its job's fences, in words (`waited`: [`waited_fences`]).
pub(crate) fn pmi_words(r: &RankNow, waited: &BTreeMap<u32, u64>) -> String {
    match r.pmi {
        PmiNow::Silent => match waited.get(&r.job) {
            Some(&epoch) => format!("missing from fence {} (no PMI yet)", epoch + 1),
            None => "-".to_string(),
        },
        PmiNow::Finalized => "finalized".to_string(),
        PmiNow::Pmi { epoch, inside: true } => format!("in fence {} (PMI)", epoch + 1),
        PmiNow::Pmi { .. } => match waited.get(&r.job) {
            Some(&epoch) => format!("missing from fence {} (PMI)", epoch + 1),
            None => "between fences (PMI)".to_string(),
        },
        PmiNow::Pmix { epoch, inside: true } => format!("in fence {} (PMIx)", epoch + 1),
        PmiNow::Pmix { .. } => "connected (PMIx)".to_string(),
    }
}

/// The report's lines, without rlaunch's prefix. `hosts`: each node's; `size`: the
/// launched job's ranks.
pub(super) fn report_lines(survey: &Survey, hosts: &[String], size: u32) -> Vec<String> {
    let mut ranks: Vec<&RankNow> = survey.ranks.iter().collect();
    ranks.sort_by_key(|r| r.rank);
    let mut lines = Vec::new();
    let mut jobs: BTreeMap<u32, Vec<&RankNow>> = BTreeMap::new();
    for r in &ranks {
        jobs.entry(r.job).or_default().push(r);
    }
    for (&job, ranks) in &jobs {
        let total = if job == 0 { size as usize } else { ranks.len() };
        let of_job = if job == 0 { String::new() } else { format!(" of spawned job {job}") };
        lines.extend(pmi_fence(ranks, total, &of_job, hosts));
        lines.extend(pmix_fence(ranks, total, &of_job, hosts));
    }
    lines.extend(states(&ranks));
    if !survey.unanswered.is_empty() {
        let mut silent = survey.unanswered.clone();
        silent.sort();
        silent.dedup();
        let n = silent.len();
        let whom = if n == 1 { "the proxy on" } else { "the proxies on" };
        let theirs = if n == 1 { "its" } else { "their" };
        lines.push(format!(
            "no answer from {whom} {} in {} s: {theirs} ranks are not in this report",
            silent.join(", "),
            SURVEY_WAIT.as_secs()
        ));
    }
    lines
}

fn live(r: &RankNow) -> bool {
    matches!(r.process, ProcessNow::Live { .. })
}

/// `--tracker rabit`: some workers started with the tracker and wait for the others, which
/// have not (`missing`, ranks of the launched job).
fn tracker_line(
    survey: &Survey,
    hosts: &[String],
    size: u32,
    started: u32,
    missing: &[u32],
) -> String {
    let of = |r: &&RankNow| r.job == 0 && missing.contains(&r.rank.0);
    let absent: Vec<&RankNow> = survey.ranks.iter().filter(of).collect();
    let (alive, ended): (Vec<&RankNow>, Vec<&RankNow>) = absent.into_iter().partition(|r| live(r));
    let mut line = format!(
        "rabit tracker: {started} of {size} workers started; missing: {}",
        listing(&alive, hosts)
    );
    if !ended.is_empty() {
        line += &format!("; ended: {}", listing(&ended, hosts));
    }
    line
}

/// A PMI-1/PMI-2 fence that some ranks of a job are in: who is missing.
fn pmi_fence(ranks: &[&RankNow], total: usize, of_job: &str, hosts: &[String]) -> Option<String> {
    let inside = |r: &RankNow| matches!(r.pmi, PmiNow::Pmi { inside: true, .. });
    let epoch = ranks.iter().filter_map(|r| match r.pmi {
        PmiNow::Pmi { epoch, inside: true } => Some(epoch),
        _ => None,
    });
    let epoch = epoch.max()?;
    let waiting = ranks.iter().filter(|r| r.pmi == PmiNow::Pmi { epoch, inside: true }).count();
    let missing: Vec<&RankNow> = ranks.iter().copied().filter(|r| !inside(r) && live(r)).collect();
    let ended: Vec<&RankNow> = ranks.iter().copied().filter(|r| !live(r)).collect();
    let mut line = format!(
        "fence {} (PMI){of_job}: {waiting} of {total} ranks waiting; missing: {}",
        epoch + 1,
        listing(&missing, hosts)
    );
    if !ended.is_empty() {
        line += &format!("; ended: {}", listing(&ended, hosts));
    }
    Some(line)
}

/// A job's PMIx clients: a fence some nodes' servers are in, or clients that never
/// connected while others did.
fn pmix_fence(ranks: &[&RankNow], total: usize, of_job: &str, hosts: &[String]) -> Option<String> {
    let pmix = |r: &&RankNow| matches!(r.pmi, PmiNow::Pmix { .. } | PmiNow::Finalized);
    if !ranks.iter().any(|r| matches!(r.pmi, PmiNow::Pmix { .. })) {
        return None;
    }
    let silent: Vec<&RankNow> =
        ranks.iter().copied().filter(|r| matches!(r.pmi, PmiNow::Silent) && live(r)).collect();
    let ended: Vec<&RankNow> = ranks.iter().copied().filter(|r| !pmix(r) && !live(r)).collect();
    let in_fence = |r: &RankNow| match r.pmi {
        PmiNow::Pmix { epoch, inside: true } => Some(epoch),
        _ => None,
    };
    let mut line = match ranks.iter().filter_map(|r| in_fence(r)).max() {
        Some(epoch) => {
            let waiting = ranks.iter().filter(|r| in_fence(r) == Some(epoch)).count();
            let unknown: Vec<&RankNow> = ranks
                .iter()
                .copied()
                .filter(|r| matches!(r.pmi, PmiNow::Pmix { inside: false, .. }) && live(r))
                .collect();
            let mut line =
                format!("fence {} (PMIx){of_job}: {waiting} of {total} ranks waiting", epoch + 1);
            if !silent.is_empty() {
                line +=
                    &format!("; missing (never connected to PMIx): {}", listing(&silent, hosts));
            }
            if !unknown.is_empty() {
                line += &format!(
                    "; on nodes whose PMIx server is not in (not every client there is): {}",
                    listing(&unknown, hosts)
                );
            }
            line
        }
        None if !silent.is_empty() => {
            let connected = ranks.iter().filter(|r| pmix(r)).count();
            format!(
                "PMIx{of_job}: {connected} of {total} ranks connected; not connected: {}",
                listing(&silent, hosts)
            )
        }
        None => return None,
    };
    if !ended.is_empty() {
        line += &format!("; ended: {}", listing(&ended, hosts));
    }
    Some(line)
}

/// The live ranks by process state, and the ranks that ended or never started.
fn states(ranks: &[&RankNow]) -> Option<String> {
    let mut by_state: BTreeMap<&str, Vec<Gid>> = BTreeMap::new();
    for r in ranks {
        let state = match r.process {
            ProcessNow::Live { state, .. } => state_name(state),
            ProcessNow::Ended(_) => "ended",
            ProcessNow::NeverStarted => "never started",
        };
        by_state.entry(state).or_default().push(r.rank);
    }
    if by_state.is_empty() {
        return None;
    }
    let parts: Vec<String> =
        by_state.into_iter().map(|(state, gids)| format!("{} {state}", ranges(&gids))).collect();
    let cpu: Vec<(Gid, u64)> = ranks
        .iter()
        .filter_map(|r| match r.process {
            ProcessNow::Live { cpu_ms, .. } => Some((r.rank, cpu_ms)),
            _ => None,
        })
        .collect();
    let mut line = format!("ranks: {}", parts.join("; "));
    // A tenth of a second is what a rank spends starting: less says nothing.
    if let Some(&(rank, most)) = cpu.iter().max_by_key(|(_, ms)| *ms).filter(|(_, ms)| *ms >= 100) {
        line += &format!(" (most CPU: rank {} with {:.1} s)", rank.0, most as f64 / 1000.0);
    }
    Some(line)
}

/// What proc(5) calls each state letter.
fn state_name(state: char) -> &'static str {
    match state {
        'R' => "running",
        'S' => "sleeping",
        'D' => "in uninterruptible wait (D)",
        'T' => "stopped",
        't' => "stopped by a tracer",
        'Z' => "zombie",
        'I' => "idle",
        _ => "in another state",
    }
}

/// Ranks named one by one with pid and host when few, else as ranges per host.
fn listing(ranks: &[&RankNow], hosts: &[String]) -> String {
    let host = |r: &RankNow| hosts.get(r.node.0 as usize).map_or("?", String::as_str);
    const ONE_BY_ONE: usize = 8;
    if ranks.is_empty() {
        return "none".to_string();
    }
    if ranks.len() <= ONE_BY_ONE {
        let each = ranks.iter().map(|r| match r.pid {
            0 => format!("rank {} (on {})", r.rank.0, host(r)),
            pid => format!("rank {} (pid {pid} on {})", r.rank.0, host(r)),
        });
        return each.collect::<Vec<_>>().join(", ");
    }
    let mut by_host: BTreeMap<&str, Vec<Gid>> = BTreeMap::new();
    for r in ranks {
        by_host.entry(host(r)).or_default().push(r.rank);
    }
    let mut groups: Vec<(Gid, String)> = by_host
        .into_iter()
        .map(|(host, gids)| (gids[0], format!("{} ({host})", ranges(&gids))))
        .collect();
    groups.sort();
    let word = "ranks";
    format!("{word} {}", groups.into_iter().map(|(_, g)| g).collect::<Vec<_>>().join(", "))
}

/// Sorted ids as compact ranges: `0-3,5,7-9`.
pub(crate) fn ranges(gids: &[Gid]) -> String {
    let mut ids: Vec<u32> = gids.iter().map(|g| g.0).collect();
    ids.sort_unstable();
    ids.dedup();
    let mut out: Vec<String> = Vec::new();
    let mut i = 0;
    while i < ids.len() {
        let start = ids[i];
        while i + 1 < ids.len() && ids[i + 1] == ids[i] + 1 {
            i += 1;
        }
        out.push(match ids[i] {
            end if end == start => start.to_string(),
            end => format!("{start}-{end}"),
        });
        i += 1;
    }
    out.join(",")
}

#[cfg(test)]
mod tests {
    use super::*;
    use rlaunch_protocol::ids::NodeId;

    fn rank(rank: u32, node: u32, state: char, pmi: PmiNow) -> RankNow {
        let process = ProcessNow::Live { state, cpu_ms: rank as u64 * 100, rss_kib: 1000 };
        RankNow { rank: Gid(rank), job: 0, node: NodeId(node), pid: 4000 + rank, process, pmi }
    }

    fn hosts() -> Vec<String> {
        vec!["n1".into(), "n2".into()]
    }

    #[test]
    fn ranges_are_compact() {
        let gids: Vec<Gid> = [0, 1, 2, 3, 5, 7, 8, 9, 12].map(Gid).to_vec();
        assert_eq!(ranges(&gids), "0-3,5,7-9,12");
        assert_eq!(ranges(&[Gid(4)]), "4");
    }

    #[test]
    fn a_pmi_fence_names_the_missing_rank_with_its_pid_and_host() {
        let inside = PmiNow::Pmi { epoch: 0, inside: true };
        let mut ranks: Vec<RankNow> = (0..3).map(|r| rank(r, 0, 'S', inside)).collect();
        ranks.push(rank(3, 1, 'S', PmiNow::Silent));
        let survey = Survey { ranks, ..Default::default() };
        let lines = report_lines(&survey, &hosts(), 4);
        assert_eq!(
            lines,
            [
                "fence 1 (PMI): 3 of 4 ranks waiting; missing: rank 3 (pid 4003 on n2)",
                "ranks: 0-3 sleeping (most CPU: rank 3 with 0.3 s)",
            ]
        );
    }

    #[test]
    fn many_missing_ranks_go_as_ranges_per_host_and_ended_ones_are_said() {
        let inside = PmiNow::Pmi { epoch: 2, inside: true };
        let outside = PmiNow::Pmi { epoch: 2, inside: false };
        let mut ranks: Vec<RankNow> = (0..4).map(|r| rank(r, 0, 'S', inside)).collect();
        ranks.extend((4..20).map(|r| rank(r, (r >= 12) as u32, 'R', outside)));
        let mut gone = rank(20, 1, 'S', outside);
        gone.process = ProcessNow::Ended(None);
        ranks.push(gone);
        let survey =
            Survey { ranks, unanswered: vec!["n3".into()], activity: 0, ..Default::default() };
        let lines = report_lines(&survey, &hosts(), 21);
        assert_eq!(
            lines,
            [
                "fence 3 (PMI): 4 of 21 ranks waiting; missing: ranks 4-11 (n1), 12-19 (n2); \
                 ended: rank 20 (pid 4020 on n2)",
                "ranks: 20 ended; 4-19 running; 0-3 sleeping (most CPU: rank 19 with 1.9 s)",
                "no answer from the proxy on n3 in 2 s: its ranks are not in this report",
            ]
        );
    }

    #[test]
    fn pmix_names_clients_that_never_connected() {
        let connected = PmiNow::Pmix { epoch: 0, inside: false };
        let mut ranks: Vec<RankNow> = (0..3).map(|r| rank(r, 0, 'S', connected)).collect();
        ranks.push(rank(3, 0, 'S', PmiNow::Silent));
        let lines = report_lines(&Survey { ranks, ..Default::default() }, &hosts(), 4);
        assert_eq!(
            lines[0],
            "PMIx: 3 of 4 ranks connected; not connected: rank 3 (pid 4003 on n1)"
        );
    }

    #[test]
    fn a_pmix_fence_some_servers_are_in_says_where_it_waits() {
        let inside = PmiNow::Pmix { epoch: 1, inside: true };
        let not_in = PmiNow::Pmix { epoch: 1, inside: false };
        let mut ranks: Vec<RankNow> = (0..2).map(|r| rank(r, 0, 'S', not_in)).collect();
        ranks.extend((2..4).map(|r| rank(r, 1, 'S', inside)));
        let lines = report_lines(&Survey { ranks, ..Default::default() }, &hosts(), 4);
        assert_eq!(
            lines[0],
            "fence 2 (PMIx): 2 of 4 ranks waiting; on nodes whose PMIx server is not in (not \
             every client there is): rank 0 (pid 4000 on n1), rank 1 (pid 4001 on n1)"
        );
    }
}
