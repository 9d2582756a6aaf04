//! The ranks' stacks in the hang report: the tree the proxies merged ([`StackTree`]), printed
//! as LLNL's STAT draws it but in text. Each branch is headed by its ranks; a frame every rank
//! of the branch shares is printed once, under the one before it; where the ranks part, each
//! part is a branch of its own, indented:
//!
//! ```text
//! stacks, outermost call first:
//!   ranks 0-3:
//!     _start
//!     main (hang.c:41)
//!     + ranks 0-2:
//!         PMPI_Barrier (libmpich.so.12)
//!     + rank 3:
//!         nanosleep (libc.so.6)
//! ```

use rlaunch_protocol::ids::Gid;
use rlaunch_protocol::stacks::{FrameKind, RankSet, StackFrame, StackNode, StackTree};

/// The report's lines for the stacks: none if no stack was read.
pub(super) fn stack_lines(tree: &StackTree) -> Vec<String> {
    if tree.is_empty() {
        return Vec::new();
    }
    let mut lines = vec!["stacks, outermost call first:".to_string()];
    let mut roots: Vec<&StackNode> = tree.roots.iter().collect();
    sort(&mut roots);
    for root in roots {
        lines.push(format!("  {}", head(&root.ranks)));
        branch(root, 4, &mut lines);
    }
    lines
}

/// One frame as a line says it.
pub(super) fn frame_text(frame: &StackFrame) -> String {
    let place = frame.place.as_ref().map(|p| format!(" ({p})")).unwrap_or_default();
    match frame.kind {
        FrameKind::Native | FrameKind::Python => format!("{}{place}", frame.function),
        FrameKind::Inlined => format!("{}{place} [inlined]", frame.function),
        FrameKind::Note => format!("[{}]", frame.function),
    }
}

/// One rank's stacks, outermost call first, for `--report`.
pub(super) fn paths_of(tree: &StackTree, rank: Gid) -> Vec<Vec<String>> {
    let paths = tree.paths_of(rank);
    paths.into_iter().map(|path| path.into_iter().map(frame_text).collect()).collect()
}

fn head(ranks: &RankSet) -> String {
    match ranks.len() {
        1 => format!("rank {ranks}:"),
        _ => format!("ranks {ranks}:"),
    }
}

/// `node`'s frame, then the frames below it that all of its ranks share, at `indent`; then,
/// where its ranks part, each part as a branch.
fn branch(node: &StackNode, indent: usize, lines: &mut Vec<String>) {
    let pad = " ".repeat(indent);
    let mut at = node;
    loop {
        lines.push(format!("{pad}{}", frame_text(&at.frame)));
        match at.callees.as_slice() {
            [only] if only.ranks == at.ranks => at = only,
            _ => break,
        }
    }
    let mut parts: Vec<&StackNode> = at.callees.iter().collect();
    sort(&mut parts);
    for part in parts {
        lines.push(format!("{pad}+ {}", head(&part.ranks)));
        branch(part, indent + 4, lines);
    }
}

/// The most ranks first, then by first rank: the common path before the odd one out; then
/// by frame, so that a report reads the same each time (`_start` before `clone3`: the main
/// threads before the others).
fn sort(nodes: &mut [&StackNode]) {
    nodes.sort_by(|a, b| {
        let key = |n: &StackNode| (std::cmp::Reverse(n.ranks.len()), n.ranks.first());
        key(a).cmp(&key(b)).then_with(|| a.frame.function.cmp(&b.frame.function))
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    fn f(name: &str, place: &str) -> StackFrame {
        StackFrame { kind: FrameKind::Native, function: name.into(), place: Some(place.into()) }
    }

    #[test]
    fn shared_frames_once_and_parted_ranks_as_branches() {
        let mut tree = StackTree::default();
        for r in 0..4 {
            let mut path = vec![f("_start", "hang"), f("main", "hang.c:41")];
            path.push(match r {
                3 => f("nanosleep", "libc.so.6"),
                _ => f("PMPI_Barrier", "libmpich.so.12"),
            });
            tree.insert(Gid(r), path);
        }
        tree.insert(Gid(2), [StackFrame::note("stack not read: it ended")]);
        assert_eq!(
            stack_lines(&tree),
            [
                "stacks, outermost call first:",
                "  ranks 0-3:",
                "    _start (hang)",
                "    main (hang.c:41)",
                "    + ranks 0-2:",
                "        PMPI_Barrier (libmpich.so.12)",
                "    + rank 3:",
                "        nanosleep (libc.so.6)",
                "  rank 2:",
                "    [stack not read: it ended]",
            ]
        );
        assert_eq!(
            paths_of(&tree, Gid(3)),
            [vec!["_start (hang)", "main (hang.c:41)", "nanosleep (libc.so.6)"]]
        );
    }
}
