//! Names for the addresses of a walk: the function, file:line and the calls inlined at the
//! address from DWARF where the file has it, else the nearest symbol of .symtab or .dynsym,
//! else the module and the offset in it (as gdb shows a library without debug info). One
//! addr2line loader a file, kept for every process that maps it.

use std::collections::HashMap;

use addr2line::Loader;

use crate::merge::{Frame, FrameKind};
use crate::unwind::Module;

/// The files' loaders so far, by (path, inode); `None` for one that could not be read.
#[derive(Default)]
pub(crate) struct Symbols(HashMap<(String, u64), Option<Loader>>);

/// The longest name kept: C++ templates can run to kilobytes.
const NAME_MAX: usize = 240;

impl Symbols {
    /// The frames address `at` stands for, innermost (most deeply inlined) first.
    pub fn frames(&mut self, at: u64, module: Option<&Module>) -> Vec<Frame> {
        let Some(module) = module else {
            return vec![Frame::native(format!("0x{at:x}"), None, None)];
        };
        let svma = at.wrapping_sub(module.bias);
        let short = module.path.rsplit('/').next().unwrap_or(&module.path).to_string();
        let unknown =
            || vec![Frame::native(format!("{short}+0x{svma:x}"), None, Some(module.path.clone()))];
        let Some(open) = &module.open else { return unknown() };
        let loader = self
            .0
            .entry((module.path.clone(), module.inode))
            .or_insert_with(|| Loader::new(open).ok())
            .as_ref();
        let Some(loader) = loader else { return unknown() };
        let mut frames = Vec::new();
        if let Ok(mut found) = loader.find_frames(svma) {
            while let Ok(Some(frame)) = found.next() {
                let Some(name) = frame.function.as_ref().and_then(|f| f.demangle().ok()) else {
                    continue;
                };
                let (file, line) = frame
                    .location
                    .map(|l| (l.file.map(str::to_string), l.line))
                    .unwrap_or_default();
                frames.push(Frame {
                    kind: FrameKind::Inlined,
                    function: cut(&name),
                    file,
                    line,
                    module: Some(module.path.clone()),
                });
            }
        }
        match frames.last_mut() {
            Some(outermost) => outermost.kind = FrameKind::Native,
            None => match loader.find_symbol(svma) {
                Some(name) => {
                    let name = addr2line::demangle_auto(name.into(), None);
                    frames.push(Frame::native(cut(&name), None, Some(module.path.clone())));
                }
                None => return unknown(),
            },
        }
        frames
    }
}

fn cut(name: &str) -> String {
    match name.char_indices().nth(NAME_MAX) {
        Some((at, _)) => format!("{}…", &name[..at]),
        None => name.to_string(),
    }
}
