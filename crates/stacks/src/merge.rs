//! Merging a symbolized native stack with the Python stack of the same thread, the way
//! `py-spy dump --native` does: inside the interpreter binary / libpython each
//! `_PyEval_EvalFrameDefault` frame is replaced by the Python frames it executes (in 3.11+ one C
//! frame runs several Python frames, up to and including the one marked `is_entry`); other
//! interpreter-internal frames are hidden, except a whitelist (time.sleep, locks, ...).
//! Frames of other modules (C extensions, libc, MPI) are kept.

use crate::python::{is_python_module, PyFrame};
use crate::symbolize::SymFrame;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FrameKind {
    Native,
    Inlined,
    Python,
}

#[derive(Clone, Debug)]
pub struct Frame {
    pub kind: FrameKind,
    pub function: String,
    pub file: Option<String>,
    pub line: Option<u32>,
    pub module: Option<String>,
    pub addr: Option<u64>,
}

impl Frame {
    pub fn native(addr: u64, s: &SymFrame) -> Frame {
        Frame {
            kind: if s.inlined { FrameKind::Inlined } else { FrameKind::Native },
            function: s.function.clone().unwrap_or_else(|| format!("0x{addr:x}")),
            file: s.file.clone(),
            line: s.line,
            module: s.module.clone(),
            addr: Some(addr),
        }
    }
    fn python(p: &PyFrame) -> Frame {
        Frame {
            kind: FrameKind::Python,
            function: p.function.clone(),
            file: Some(p.file.clone()),
            line: (p.line > 0).then_some(p.line as u32),
            module: None,
            addr: None,
        }
    }
}

enum Strategy {
    Keep,
    Drop,
    Python,
}

fn strategy(s: &SymFrame) -> Strategy {
    let in_python = s.module.as_deref().is_some_and(is_python_module);
    if !in_python {
        return Strategy::Keep;
    }
    let Some(func) = s.function.as_deref() else { return Strategy::Drop };
    // Same rule as py-spy: split on '_' and '.' (handles "_PyEval_EvalFrameDefault.cold").
    let mut tok = func.split(['_', '.']).filter(|t| !t.is_empty());
    match tok.next() {
        Some("PyEval") => match tok.next() {
            Some("EvalFrameDefault" | "EvalFrameEx") => Strategy::Python,
            _ => Strategy::Drop,
        },
        Some("time" | "sys" | "gc" | "os" | "unicode" | "thread" | "stringio" | "sre" | "PyGilState"
            | "PyThread" | "lock") => Strategy::Keep,
        _ => Strategy::Drop,
    }
}

/// `native`: per unwound address (innermost first), the lookup address and its symbolized frames
/// (innermost inlined first).  `python`: the thread's Python frames, innermost first.
/// Returns the merged stack and, if the two did not line up, a note.
pub fn merge(native: &[(u64, Vec<SymFrame>)], python: Option<&[PyFrame]>) -> (Vec<Frame>, Option<String>) {
    let Some(py) = python else {
        let frames = native.iter().flat_map(|(a, syms)| syms.iter().map(|s| Frame::native(*a, s))).collect();
        return (frames, None);
    };
    let mut out = Vec::new();
    let mut pi = 0;
    for (addr, syms) in native {
        for s in syms {
            match strategy(s) {
                Strategy::Keep => out.push(Frame::native(*addr, s)),
                Strategy::Drop => {}
                Strategy::Python => {
                    while pi < py.len() {
                        out.push(Frame::python(&py[pi]));
                        if py[pi].is_entry {
                            break;
                        }
                        pi += 1;
                    }
                    pi += 1;
                }
            }
        }
    }
    let note = if pi == py.len() || pi == py.len() + 1 {
        None // +1: eval loop still on the C stack after the Python frame was popped
    } else if pi == 0 {
        // Native unwind did not reach the eval loop (e.g. truncated): append Python frames.
        out.extend(py.iter().map(Frame::python));
        Some("native stack has no eval-loop frame; Python frames appended".into())
    } else {
        Some(format!("merge mismatch: {pi} eval-loop frames vs {} Python frames", py.len()))
    };
    (out, note)
}
