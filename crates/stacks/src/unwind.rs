//! Native unwinding with framehop: modules from /proc/PID/maps, unwind sections (.eh_frame,
//! .eh_frame_hdr, .debug_frame) from the mapped ELF files (parsed with `object`), stack memory
//! from /proc/PID/mem.  Produces return addresses only; symbolization is elsewhere.

use std::collections::HashSet;
use std::ops::Range;

use framehop::x86_64::{CacheX86_64, UnwindRegsX86_64, UnwinderX86_64};
use framehop::{ExplicitModuleSectionInfo, FrameAddress, Module, Unwinder as _};
use object::{Object, ObjectSection, ObjectSegment};

use crate::procmem::ProcMem;
use crate::ptrace::Regs;

#[derive(Clone, Debug)]
pub struct MapEntry {
    pub start: u64,
    pub end: u64,
    pub perms: String,
    pub offset: u64,
    pub inode: u64,
    pub path: String,
}

pub fn read_maps(pid: i32) -> std::io::Result<Vec<MapEntry>> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/maps"))?;
    let mut out = Vec::new();
    for line in text.lines() {
        // start-end perms offset dev inode path (path may contain spaces)
        let mut it = line.splitn(6, ' ');
        let (Some(range), Some(perms), Some(off), Some(_dev), Some(inode)) =
            (it.next(), it.next(), it.next(), it.next(), it.next())
        else {
            continue;
        };
        let path = it.next().unwrap_or("").trim_start().to_string();
        let Some((s, e)) = range.split_once('-') else { continue };
        out.push(MapEntry {
            start: u64::from_str_radix(s, 16).unwrap_or(0),
            end: u64::from_str_radix(e, 16).unwrap_or(0),
            perms: perms.to_string(),
            offset: u64::from_str_radix(off, 16).unwrap_or(0),
            inode: inode.parse().unwrap_or(0),
            path,
        });
    }
    Ok(out)
}

/// A loaded module as seen by the unwinder.
#[derive(Clone, Debug)]
pub struct ModuleInfo {
    pub path: String,
    pub avma: Range<u64>,
    pub bias: u64,
    pub has_unwind_info: bool,
}

pub struct NativeUnwinder {
    unwinder: UnwinderX86_64<Vec<u8>>,
    cache: CacheX86_64,
    loaded: HashSet<(String, u64)>,
    pub modules: Vec<ModuleInfo>,
    pub max_frames: usize,
}

impl Default for NativeUnwinder {
    fn default() -> Self {
        Self::new()
    }
}

impl NativeUnwinder {
    pub fn new() -> Self {
        NativeUnwinder {
            unwinder: UnwinderX86_64::new(),
            cache: CacheX86_64::new(),
            loaded: HashSet::new(),
            modules: Vec::new(),
            max_frames: 256,
        }
    }

    /// Adds every file-backed executable module (and the vDSO) of `pid` not yet known.
    /// Cheap to call again after the process was stopped to catch late dlopen()s.
    pub fn load_modules(&mut self, pid: i32, maps: &[MapEntry], mem: &ProcMem) {
        for m in maps.iter().filter(|m| m.perms.as_bytes().get(2) == Some(&b'x')) {
            let is_vdso = m.path == "[vdso]";
            if !(m.path.starts_with('/') || is_vdso) {
                continue;
            }
            let key = (m.path.clone(), m.start);
            if self.loaded.contains(&key) {
                continue;
            }
            self.loaded.insert(key);
            // All mappings of the same file instance (same path+inode) that are contiguous with
            // this executable mapping form the module.
            let same: Vec<&MapEntry> = maps
                .iter()
                .filter(|o| o.path == m.path && o.inode == m.inode)
                .collect();
            let (lo, hi) = contiguous_group(&same, m);
            let data: Box<dyn std::ops::Deref<Target = [u8]>> = if is_vdso {
                let mut buf = vec![0u8; (m.end - m.start) as usize];
                if !mem.read_exact(m.start, &mut buf) {
                    continue;
                }
                Box::new(buf)
            } else {
                match read_module_file(pid, lo, m) {
                    Some(d) => d,
                    None => continue,
                }
            };
            if let Some(info) = self.add_elf(&m.path, &data, lo.start..hi.end, lo) {
                self.modules.push(info);
            }
        }
    }

    fn add_elf(&mut self, path: &str, data: &[u8], avma: Range<u64>, first: &MapEntry) -> Option<ModuleInfo> {
        let obj = object::File::parse(data).ok()?;
        // Load bias: the first mapping maps file offset `first.offset` at `first.start`; find the
        // PT_LOAD segment that contains that file offset to get its stated address.
        let bias = obj
            .segments()
            .find_map(|seg| {
                let (foff, fsize) = seg.file_range();
                (foff & !0xfff <= first.offset && first.offset < foff + fsize.max(1))
                    .then(|| first.start.wrapping_sub(seg.address() - foff + first.offset))
            })
            .unwrap_or(first.start - first.offset);
        let range = |name: &str| obj.section_by_name(name).map(|s| s.address()..s.address() + s.size());
        let bytes = |name: &str| {
            obj.section_by_name(name)
                .and_then(|s| s.uncompressed_data().ok())
                .map(|d| d.into_owned())
                .filter(|d| !d.is_empty())
        };
        let info = ExplicitModuleSectionInfo {
            base_svma: 0,
            text_svma: range(".text"),
            text: None,
            got_svma: range(".got"),
            eh_frame_svma: range(".eh_frame"),
            eh_frame: bytes(".eh_frame"),
            eh_frame_hdr_svma: range(".eh_frame_hdr"),
            eh_frame_hdr: bytes(".eh_frame_hdr"),
            debug_frame: bytes(".debug_frame"),
            ..Default::default()
        };
        let has_unwind_info = info.eh_frame.is_some() || info.debug_frame.is_some();
        self.unwinder.add_module(Module::new(path.to_string(), avma.clone(), bias, info));
        Some(ModuleInfo { path: path.to_string(), avma, bias, has_unwind_info })
    }

    pub fn module_for(&self, addr: u64) -> Option<&ModuleInfo> {
        self.modules.iter().find(|m| m.avma.contains(&addr))
    }

    /// Unwinds one stopped thread.  Returns the frames (innermost first) and, if the walk did not
    /// end cleanly, why it stopped.
    pub fn unwind(&mut self, regs: &Regs, mem: &mut ProcMem) -> (Vec<FrameAddress>, Option<String>) {
        let mut read_stack = |addr: u64| mem.read_u64(addr).ok_or(());
        let mut iter = self.unwinder.iter_frames(
            regs.ip,
            UnwindRegsX86_64::new(regs.ip, regs.sp, regs.bp),
            &mut self.cache,
            &mut read_stack,
        );
        let mut frames = Vec::new();
        loop {
            match iter.next() {
                Ok(Some(f)) => {
                    frames.push(f);
                    if frames.len() >= self.max_frames {
                        return (frames, Some("frame limit reached".into()));
                    }
                }
                Ok(None) => return (frames, None),
                Err(e) => return (frames, Some(format!("unwind stopped: {e}"))),
            }
        }
    }
}

fn contiguous_group<'a>(same: &[&'a MapEntry], m: &'a MapEntry) -> (&'a MapEntry, &'a MapEntry) {
    // `same` is sorted by address (maps order).  Walk outwards from m while mappings touch.
    let i = same.iter().position(|o| std::ptr::eq(*o, m)).unwrap();
    let mut lo = i;
    while lo > 0 && same[lo - 1].end == same[lo].start {
        lo -= 1;
    }
    let mut hi = i;
    while hi + 1 < same.len() && same[hi].end == same[hi + 1].start {
        hi += 1;
    }
    (same[lo], same[hi])
}

fn read_module_file(pid: i32, first: &MapEntry, exec: &MapEntry) -> Option<Box<dyn std::ops::Deref<Target = [u8]>>> {
    // map_files works for deleted files and across mount namespaces (needs CAP_SYS_ADMIN or
    // CAP_CHECKPOINT_RESTORE); fall back to the path seen from the process's root.
    let path = exec.path.trim_end_matches(" (deleted)");
    for p in [
        format!("/proc/{pid}/map_files/{:x}-{:x}", first.start, first.end),
        format!("/proc/{pid}/root{path}"),
    ] {
        if let Ok(f) = std::fs::File::open(&p) {
            // SAFETY: read-only private mapping; a concurrent truncation of a loaded library
            // would already crash the target itself.
            if let Ok(m) = unsafe { memmap2::Mmap::map(&f) } {
                return Some(Box::new(m));
            }
        }
    }
    None
}
