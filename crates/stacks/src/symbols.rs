//! Names for the addresses of a walk: the function, file:line and the calls inlined at the
//! address from DWARF where the file has it, else the nearest symbol of .symtab or .dynsym,
//! else the module and the offset in it (as gdb shows a library without debug info). One
//! addr2line loader a file, kept for every process that maps it.
//!
//! A file without DWARF of its own may have it apart, found where gdb looks: by its build id
//! under `/usr/lib/debug/.build-id/` (Debian's `-dbg` and `-dbgsym` packages), or by its
//! `.gnu_debuglink` name next to it, in `.debug/` beside it, or under `/usr/lib/debug` (its
//! checksum checked); with the `.dwz` file such a debug file names for what it shares.

use std::collections::HashMap;

use std::path::{Path, PathBuf};

use addr2line::Loader;
use object::Object;

use crate::merge::{Frame, FrameKind};
use crate::unwind::Module;

/// The files' loaders so far, by (path, inode); `None` for one that could not be read.
#[derive(Default)]
pub(crate) struct Symbols(HashMap<(String, u64), Option<Loader>>);

impl Symbols {
    /// The frames address `at` stands for, innermost (most deeply inlined) first.
    pub fn frames(&mut self, at: u64, module: Option<&Module>) -> Vec<Frame> {
        let Some(module) = module else {
            return vec![Frame::native(format!("0x{at:x}"), None, None)];
        };
        let svma = at.wrapping_sub(module.bias);
        let short = module.path.rsplit('/').next().unwrap_or(&module.path).to_string();
        // No name: the function's start where the unwind entries say it, else the address.
        let unknown = || {
            let named = match module.function_start(svma) {
                Some(start) => format!("{short}@0x{start:x}"),
                None => format!("{short}+0x{svma:x}"),
            };
            vec![Frame::native(named, None, Some(module.path.clone()))]
        };
        let Some(open) = &module.open else { return unknown() };
        let loader = self
            .0
            .entry((module.path.clone(), module.inode))
            .or_insert_with(|| load(open, &module.path, &module.root))
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
                    function: name.into_owned(),
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
                    frames.push(Frame::native(name.into_owned(), None, Some(module.path.clone())));
                }
                None => return unknown(),
            },
        }
        frames
    }
}

/// Where gdb looks for separate debug files.
const DEBUG_DIR: &str = "/usr/lib/debug";

/// The loader for a file: of its separate debug file where it has no DWARF of its own and
/// one is found, else of the file itself. `open`: where this process can open it; `path`:
/// its path in the traced process; `root`: that process's root (`/proc/PID/root`).
fn load(open: &str, path: &str, root: &str) -> Option<Loader> {
    let file = std::fs::File::open(open).ok()?;
    // SAFETY: a read-only private mapping; a file truncated while mapped would crash the
    // process that runs it first.
    let data = unsafe { memmap2::Mmap::map(&file) }.ok()?;
    let obj = object::File::parse(&*data).ok()?;
    if obj.section_by_name(".debug_info").is_none() {
        if let Some(apart) = debug_file(&obj, path, root) {
            let sup = supplementary(&apart, root);
            match Loader::new_with_sup(&apart, sup.as_ref()) {
                Ok(loader) => return Some(loader),
                Err(e) => tracing::debug!(file = %apart.display(), "debug file unread: {e}"),
            }
        }
    }
    Loader::new(open).ok()
}

/// The separate debug file of `obj` (mapped at `path` in a process whose root is `root`).
fn debug_file(obj: &object::File, path: &str, root: &str) -> Option<PathBuf> {
    if let Ok(Some(id)) = obj.build_id() {
        let hex: String = id.iter().map(|b| format!("{b:02x}")).collect();
        if hex.len() > 2 {
            let found = format!("{root}{DEBUG_DIR}/.build-id/{}/{}.debug", &hex[..2], &hex[2..]);
            if Path::new(&found).is_file() {
                return Some(found.into());
            }
        }
    }
    let (name, crc) = obj.gnu_debuglink().ok()??;
    let name = std::str::from_utf8(name).ok()?;
    let dir = Path::new(path).parent()?.to_str()?;
    [
        format!("{root}{dir}/{name}"),
        format!("{root}{dir}/.debug/{name}"),
        format!("{root}{DEBUG_DIR}{dir}/{name}"),
    ]
    .into_iter()
    .map(PathBuf::from)
    .find(|candidate| candidate.is_file() && checksum(candidate) == Some(crc))
}

/// The `.dwz` file a debug file shares its common DWARF with, if it names one.
fn supplementary(debug: &Path, root: &str) -> Option<PathBuf> {
    let file = std::fs::File::open(debug).ok()?;
    // SAFETY: as in `load`.
    let data = unsafe { memmap2::Mmap::map(&file) }.ok()?;
    let obj = object::File::parse(&*data).ok()?;
    let (name, _) = obj.gnu_debugaltlink().ok()??;
    let name = std::str::from_utf8(name).ok()?;
    let found = match name.starts_with('/') {
        true => PathBuf::from(format!("{root}{name}")),
        false => debug.parent()?.join(name),
    };
    found.is_file().then_some(found)
}

/// The CRC-32 a `.gnu_debuglink` holds of its file.
fn checksum(path: &Path) -> Option<u32> {
    let file = std::fs::File::open(path).ok()?;
    // SAFETY: as in `load`.
    let data = unsafe { memmap2::Mmap::map(&file) }.ok()?;
    Some(crc32fast::hash(&data))
}
