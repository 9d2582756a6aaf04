//! The stacks of this node's ranks, for rlaunch's hang report: read on a thread of their own
//! (the reader is a tracer for the while, and blocks; a thread it could not stop in time is
//! let go when that thread ends), all together with one [`Reader`] (held stopped together, a
//! snapshot; the ranks mostly run one program: its files are read once), and merged into one
//! [`StackTree`].

use std::time::Instant;

use rlaunch_protocol::control::wire_len;
use rlaunch_protocol::ids::Gid;
use rlaunch_protocol::stacks::{FrameKind, StackFrame, StackTree};
use rlaunch_stacks::{Frame, Process, Reader};

/// The longest text a frame keeps of a function or a place (C++ templates run to
/// kilobytes): cut here, where the frames leave for the tree.
const TEXT_MAX: usize = 240;

/// Reads the stacks of `ranks` (rank, pid) on a new thread and calls `done` with their tree
/// there. Ranks not reached by `until` are named as such.
pub(crate) fn read_on_a_thread(
    ranks: Vec<(Gid, i32)>,
    until: Instant,
    done: impl FnOnce(StackTree) + Send + 'static,
) {
    let reading = std::thread::Builder::new()
        .name("rlaunch-stacks".into())
        .spawn(move || done(read(&ranks, until)));
    if let Err(e) = reading {
        tracing::warn!("cannot start a thread to read the ranks' stacks: {e}");
    }
}

/// The ranks' stacks, merged.
fn read(ranks: &[(Gid, i32)], until: Instant) -> StackTree {
    let began = Instant::now();
    let pids: Vec<i32> = ranks.iter().map(|&(_, pid)| pid).collect();
    let processes = Reader::new().read_all(&pids, Some(until));
    let held = processes.iter().map(|p| p.stopped_for).max().unwrap_or_default();
    tracing::debug!(
        ranks = ranks.len(),
        held_us = held.as_micros() as u64,
        took_us = began.elapsed().as_micros() as u64,
        "read the ranks' stacks"
    );
    let mut tree = StackTree::default();
    let mut one_per_rank = 0;
    for (&(rank, _), process) in ranks.iter().zip(processes) {
        if tracing::enabled!(tracing::Level::DEBUG) {
            // What this rank's stack alone would take on the wire: the unmerged alternative.
            let mut alone = StackTree::default();
            put(&mut alone, rank, process.clone());
            one_per_rank += wire_len(&alone);
        }
        put(&mut tree, rank, process);
    }
    tracing::debug!(
        merged_bytes = wire_len(&tree),
        one_per_rank_bytes = one_per_rank,
        "merged the ranks' stacks"
    );
    tree
}

/// Puts one rank's threads in the tree, each path outermost first, with what could not be
/// read as notes.
fn put(tree: &mut StackTree, rank: Gid, process: Process) {
    if let Some(why) = process.unreadable {
        return tree.insert(rank, [StackFrame::note(format!("stack not read: {why}"))]);
    }
    if let Some(why) = process.python_missing {
        tree.insert(rank, [StackFrame::note(format!("Python frames not read: {}", cut(&why)))]);
    }
    for thread in process.threads {
        let frames = thread.frames.iter().rev().map(frame);
        let note = thread.note.map(|why| StackFrame::note(cut(&why)));
        tree.insert(rank, frames.chain(note));
    }
}

fn frame(f: &Frame) -> StackFrame {
    let kind = match f.kind {
        rlaunch_stacks::FrameKind::Native => FrameKind::Native,
        rlaunch_stacks::FrameKind::Inlined => FrameKind::Inlined,
        rlaunch_stacks::FrameKind::Python => FrameKind::Python,
    };
    let module = f.module.as_deref().map(|m| m.rsplit('/').next().unwrap_or(m));
    // `lib.so@0xSTART` and `lib.so+0xOFFSET` name their module already.
    let unnamed =
        |m: &str| ["@0x", "+0x"].iter().any(|s| f.function.starts_with(&format!("{m}{s}")));
    let module = module.filter(|m| !unnamed(m));
    let place = match (&f.file, f.line, module) {
        (Some(file), Some(line), _) => Some(format!("{}:{line}", cut(file))),
        (Some(file), None, _) => Some(cut(file)),
        (None, _, Some(module)) => Some(cut(module)),
        (None, _, None) => None,
    };
    StackFrame { kind, function: cut(&f.function), place }
}

fn cut(text: &str) -> String {
    match text.char_indices().nth(TEXT_MAX) {
        Some((at, _)) => format!("{}…", &text[..at]),
        None => text.to_string(),
    }
}
