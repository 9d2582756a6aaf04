//! Merging a symbolized native stack with the Python stack of the same thread, the way
//! `py-spy dump --native` does: inside the interpreter binary / libpython each
//! `_PyEval_EvalFrameDefault` frame is replaced by the Python frames it executes (in 3.11+ one C
//! frame runs several Python frames, up to and including the one marked `is_entry`); other
//! interpreter-internal frames are hidden, except a whitelist (time.sleep, locks, ...).
//! Frames of other modules (C extensions, libc, MPI) are kept.

use crate::python::{is_python_module, PyFrame};

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FrameKind {
    /// A function's frame on the machine stack.
    Native,
    /// A call inlined into the frame below it: the same machine frame.
    Inlined,
    /// A Python function's frame.
    Python,
}

/// One frame of a stack.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Frame {
    pub kind: FrameKind,
    /// The function, demangled; where no symbol names it, `lib.so@0xSTART` (where the file's
    /// unwind entries say the function starts) or else `lib.so+0xOFFSET`.
    pub function: String,
    /// Its source file and line, where debug info (or Python) says.
    pub file: Option<String>,
    pub line: Option<u32>,
    /// The file the code is in, for a native frame.
    pub module: Option<String>,
}

impl Frame {
    pub(crate) fn native(function: String, file: Option<String>, module: Option<String>) -> Frame {
        Frame { kind: FrameKind::Native, function, file, line: None, module }
    }

    fn python(p: &PyFrame) -> Frame {
        Frame {
            kind: FrameKind::Python,
            function: p.function.clone(),
            file: Some(p.file.clone()),
            line: (p.line > 0).then_some(p.line as u32),
            module: None,
        }
    }
}

enum Strategy {
    Keep,
    Drop,
    Python,
}

fn strategy(s: &Frame) -> Strategy {
    let in_python = s.module.as_deref().is_some_and(is_python_module);
    if !in_python {
        return Strategy::Keep;
    }
    let func = s.function.as_str();
    // Same rule as py-spy: split on '_' and '.' (handles "_PyEval_EvalFrameDefault.cold").
    let mut tok = func.split(['_', '.']).filter(|t| !t.is_empty());
    match tok.next() {
        Some("PyEval") => match tok.next() {
            Some("EvalFrameDefault" | "EvalFrameEx") => Strategy::Python,
            _ => Strategy::Drop,
        },
        Some(
            "time" | "sys" | "gc" | "os" | "unicode" | "thread" | "stringio" | "sre" | "PyGilState"
            | "PyThread" | "lock",
        ) => Strategy::Keep,
        _ => Strategy::Drop,
    }
}

/// `native`: per unwound address (innermost first), the address and its frames (innermost
/// inlined call first). `python`: the thread's Python frames, innermost first. Returns the
/// merged stack and, if the two did not line up, a note.
pub(crate) fn merge(
    native: &[(u64, Vec<Frame>)],
    python: Option<&[PyFrame]>,
) -> (Vec<Frame>, Option<String>) {
    let Some(py) = python else {
        return (native.iter().flat_map(|(_, frames)| frames.iter().cloned()).collect(), None);
    };
    let mut out = Vec::new();
    let mut pi = 0;
    for (_, frames) in native {
        for s in frames {
            match strategy(s) {
                Strategy::Keep => out.push(s.clone()),
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
        Some("no eval loop found on the native stack: its Python frames are put on top".into())
    } else {
        Some(format!(
            "{pi} eval loop frames for {} Python frames: the two may not line up",
            py.len()
        ))
    };
    (out, note)
}
