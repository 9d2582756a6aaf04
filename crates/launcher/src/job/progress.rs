//! The live progress line of a launch, on a terminal: one line on stderr, redrawn in place,
//! saying how many nodes' proxies are up, how many ranks started and initialised PMI, and
//! how long it has taken:
//!
//! ```text
//! rlaunch: 12/64 nodes up, 192/1024 ranks started, 100 in PMI, 3s
//! ```
//!
//! It shows only when stderr is a terminal and the job spans more than [`FEW_NODES`] nodes
//! (and `RLAUNCH_PROGRESS` is not `0`): batch logs stay clean, and a small job starts before
//! a line would be worth reading. It goes away, leaving nothing behind, when the launch is
//! complete, when the job's first output is written (the writer thread clears it first), or
//! when the job ends.
//!
//! The launch is complete when every rank has started and, if any initialised PMI, all have;
//! a job whose ranks have not initialised PMI [`PMI_WAIT`] after they all started is taken
//! for one that does not use it.

use rlaunch_protocol::ids::NodeId;
use std::collections::HashMap;
use std::io::IsTerminal;
use std::time::Duration;

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use rlaunch_protocol::control::NodePlan;
use tokio::time::Instant;

/// A launch over at most this many nodes shows no progress line.
pub const FEW_NODES: usize = 3;
/// After every rank started, how long to wait for a first PMI init before calling the launch
/// complete.
const PMI_WAIT: Duration = Duration::from_secs(2);

/// Whether a job over `nodes` nodes shows a progress line, with `getenv` the environment.
pub fn wanted(nodes: usize, getenv: impl Fn(&str) -> Option<String>) -> bool {
    nodes > FEW_NODES
        && std::io::stderr().is_terminal()
        && getenv("RLAUNCH_PROGRESS").is_none_or(|v| v != "0")
}

pub(crate) struct Progress {
    bar: ProgressBar,
    ranks: usize,
    /// Ranks planned on each node.
    planned: HashMap<NodeId, usize>,
    /// Nodes whose proxy is up, and ranks initialised in PMI, by node.
    pmi: HashMap<NodeId, u32>,
    started_nodes: usize,
    started_ranks: usize,
    /// When the last rank started.
    all_started: Option<Instant>,
}

impl Progress {
    /// The line, drawn now, for the job laid out in `roots`.
    pub(crate) fn start(roots: &[NodePlan]) -> Progress {
        let mut planned = HashMap::new();
        for node in roots.iter().flat_map(|r| r.walk()) {
            planned.insert(node.index, node.ranks.len());
        }
        let ranks = planned.values().sum();
        let bar = ProgressBar::with_draw_target(None, ProgressDrawTarget::stderr());
        bar.set_style(
            ProgressStyle::with_template("rlaunch: {msg}, {elapsed}").expect("a valid template"),
        );
        bar.enable_steady_tick(Duration::from_millis(100));
        let mut progress = Progress {
            bar,
            ranks,
            planned,
            pmi: HashMap::new(),
            started_nodes: 0,
            started_ranks: 0,
            all_started: None,
        };
        progress.draw();
        progress
    }

    /// A handle for the writer thread, which clears the line before the first output.
    pub(crate) fn handle(&self) -> ProgressBar {
        self.bar.clone()
    }

    /// Node `node`'s proxy is up, with `pmi_inited` of its ranks initialised in PMI.
    pub(crate) fn node_progress(&mut self, node: NodeId, pmi_inited: u32) {
        self.pmi.insert(node, pmi_inited);
        self.draw();
    }

    /// Node `node` started its ranks.
    pub(crate) fn node_started(&mut self, node: NodeId) {
        self.started_nodes += 1;
        self.started_ranks += self.planned.get(&node).copied().unwrap_or(0);
        if self.started_nodes == self.planned.len() {
            self.all_started = Some(Instant::now());
        }
        self.draw();
    }

    /// When to look again whether the launch is complete (a job that does not use PMI).
    pub(crate) fn deadline(&self) -> Option<Instant> {
        let waiting = !self.bar.is_finished() && self.inited() == 0;
        self.all_started.filter(|_| waiting).map(|at| at + PMI_WAIT)
    }

    /// The line goes, for good.
    pub(crate) fn clear(&mut self) {
        if !self.bar.is_finished() {
            self.bar.finish_and_clear();
        }
    }

    fn inited(&self) -> usize {
        self.pmi.values().map(|&n| n as usize).sum()
    }

    /// Redraws the line, or clears it once the launch is complete.
    pub(crate) fn draw(&mut self) {
        if self.bar.is_finished() {
            return;
        }
        let inited = self.inited();
        let all_started = self.all_started.is_some();
        let quiet = self.all_started.is_some_and(|at| inited == 0 && at.elapsed() >= PMI_WAIT);
        if all_started && (inited >= self.ranks || quiet) {
            return self.clear();
        }
        let up = self.pmi.len().max(self.started_nodes);
        self.bar.set_message(format!(
            "{up}/{} nodes up, {}/{} ranks started, {inited} in PMI",
            self.planned.len(),
            self.started_ranks,
            self.ranks
        ));
    }
}

impl Drop for Progress {
    fn drop(&mut self) {
        self.clear();
    }
}
