//! Native unwinding with framehop: modules from /proc/PID/maps, unwind sections (.eh_frame,
//! .eh_frame_hdr, .debug_frame) from the mapped ELF files (parsed with `object`), stack memory
//! from /proc/PID/mem. Gives the addresses to look up; their names are [`crate::symbols`]'.

use std::collections::{HashMap, HashSet};
use std::ops::Range;
use std::sync::Arc;

use framehop::x86_64::{CacheX86_64, UnwindRegsX86_64, UnwinderX86_64};
use framehop::{ExplicitModuleSectionInfo, Unwinder as _};
use object::{Object, ObjectSection, ObjectSegment};

use crate::procmem::ProcMem;
use crate::ptrace::Regs;

#[derive(Clone, Debug)]
pub(crate) struct MapEntry {
    pub start: u64,
    pub end: u64,
    pub perms: String,
    pub offset: u64,
    pub inode: u64,
    pub path: String,
}

pub(crate) fn read_maps(pid: i32) -> std::io::Result<Vec<MapEntry>> {
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

/// A file as the unwinder needs it, read once for every process that maps it.
#[derive(Debug)]
pub(crate) struct File {
    /// Its loadable segments: (file offset, size in the file, stated address).
    segments: Vec<(u64, u64, u64)>,
    text: Option<Range<u64>>,
    got: Option<Range<u64>>,
    eh_frame: Option<(Range<u64>, Arc<[u8]>)>,
    eh_frame_hdr: Option<(Range<u64>, Arc<[u8]>)>,
    debug_frame: Option<Arc<[u8]>>,
}

/// The files read so far, by (path, inode); `None` for one that could not be read.
#[derive(Default)]
pub(crate) struct Files(HashMap<(String, u64), Option<Arc<File>>>);

/// A module of one process: a file mapped at an address.
#[derive(Clone, Debug)]
pub(crate) struct Module {
    /// Its path in the process.
    pub path: String,
    /// Where this process can open it (for its symbols); `None` for the vDSO.
    pub open: Option<String>,
    /// The traced process's root as this process sees it (`/proc/PID/root`), for its
    /// separate debug files.
    pub root: String,
    pub inode: u64,
    pub avma: Range<u64>,
    /// What to take from an address to get the file's stated address.
    pub bias: u64,
    /// Its unwind sections, which also say where each function starts.
    file: Option<Arc<File>>,
}

impl Module {
    /// Where the function holding `svma` (a stated address of the file) starts, from the
    /// unwind entry that covers it: what names a function of a file without symbols, so
    /// that two addresses in one function are one frame, as a name would make them.
    pub fn function_start(&self, svma: u64) -> Option<u64> {
        use addr2line::gimli::{BaseAddresses, EhFrame, EhFrameHdr, LittleEndian, UnwindSection};
        let file = self.file.as_ref()?;
        let (eh_svma, eh) = file.eh_frame.as_ref()?;
        let (hdr_svma, hdr) = file.eh_frame_hdr.as_ref()?;
        let mut bases =
            BaseAddresses::default().set_eh_frame_hdr(hdr_svma.start).set_eh_frame(eh_svma.start);
        if let Some(text) = &file.text {
            bases = bases.set_text(text.start);
        }
        if let Some(got) = &file.got {
            bases = bases.set_got(got.start);
        }
        let parsed = EhFrameHdr::new(hdr, LittleEndian).parse(&bases, 8).ok()?;
        let eh_frame = EhFrame::new(eh, LittleEndian);
        let fde =
            parsed.table()?.fde_for_address(&eh_frame, &bases, svma, EhFrame::cie_from_offset);
        Some(fde.ok()?.initial_address())
    }
}

/// One thread's walk: the addresses to look up (a return address less one, so that it falls
/// in the call), innermost first, and why it ended early, if it did.
pub(crate) struct Walk {
    pub addresses: Vec<u64>,
    pub ended: Option<String>,
}

/// A process's modules, and the unwinder made of them.
pub(crate) struct Native {
    unwinder: UnwinderX86_64<Arc<[u8]>>,
    cache: CacheX86_64,
    loaded: HashSet<(String, u64)>,
    modules: Vec<Module>,
}

impl Default for Native {
    fn default() -> Self {
        Native {
            unwinder: UnwinderX86_64::new(),
            cache: CacheX86_64::new(),
            loaded: HashSet::new(),
            modules: Vec::new(),
        }
    }
}

/// The most frames a thread's walk takes: a runaway recursion is cut there.
const MAX_FRAMES: usize = 256;

impl Native {
    /// Adds every file-backed executable mapping (and the vDSO) of `pid` not known yet.
    /// Cheap to call again once the process is stopped, for libraries loaded meanwhile.
    pub fn add_modules(&mut self, pid: i32, maps: &[MapEntry], mem: &ProcMem, files: &mut Files) {
        for m in maps.iter().filter(|m| m.perms.as_bytes().get(2) == Some(&b'x')) {
            let is_vdso = m.path == "[vdso]";
            if !(m.path.starts_with('/') || is_vdso)
                || !self.loaded.insert((m.path.clone(), m.start))
            {
                continue;
            }
            // The mappings of the same file that touch this executable one make the module.
            let same: Vec<&MapEntry> =
                maps.iter().filter(|o| o.path == m.path && o.inode == m.inode).collect();
            let (lo, hi) = contiguous_group(&same, m);
            let (file, open) = if is_vdso {
                let mut image = vec![0u8; (m.end - m.start) as usize];
                if !mem.read_exact(m.start, &mut image) {
                    continue;
                }
                (parse(&image).map(Arc::new), None)
            } else {
                let Some(open) = openable(pid, lo, m) else { continue };
                let key = (m.path.clone(), m.inode);
                let file = files.0.entry(key).or_insert_with(|| read_file(&open)).clone();
                (file, Some(open))
            };
            let Some(file) = file else { continue };
            let bias = bias_of(&file, lo);
            let avma = lo.start..hi.end;
            let section = |s: &Option<(Range<u64>, Arc<[u8]>)>| {
                s.as_ref().map(|(r, d)| (r.clone(), d.clone()))
            };
            let (eh_frame_svma, eh_frame) = section(&file.eh_frame).unzip();
            let (eh_frame_hdr_svma, eh_frame_hdr) = section(&file.eh_frame_hdr).unzip();
            let info = ExplicitModuleSectionInfo {
                base_svma: 0,
                text_svma: file.text.clone(),
                got_svma: file.got.clone(),
                eh_frame_svma,
                eh_frame,
                eh_frame_hdr_svma,
                eh_frame_hdr,
                debug_frame: file.debug_frame.clone(),
                ..Default::default()
            };
            self.unwinder.add_module(framehop::Module::new(
                m.path.clone(),
                avma.clone(),
                bias,
                info,
            ));
            let root = format!("/proc/{pid}/root");
            self.modules.push(Module {
                path: m.path.clone(),
                open,
                root,
                inode: m.inode,
                avma,
                bias,
                file: Some(file),
            });
        }
    }

    pub fn module_for(&self, addr: u64) -> Option<&Module> {
        self.modules.iter().find(|m| m.avma.contains(&addr))
    }

    /// Walks one stopped thread's stack from its registers.
    pub fn walk(&mut self, regs: &Regs, mem: &mut ProcMem) -> Walk {
        let mut read_stack = |addr: u64| mem.read_u64(addr).ok_or(());
        let mut frames = self.unwinder.iter_frames(
            regs.ip,
            UnwindRegsX86_64::new(regs.ip, regs.sp, regs.bp),
            &mut self.cache,
            &mut read_stack,
        );
        let mut addresses = Vec::new();
        loop {
            match frames.next() {
                Ok(Some(_)) if addresses.len() == MAX_FRAMES => {
                    let ended = Some(format!("cut at {MAX_FRAMES} frames"));
                    return Walk { addresses, ended };
                }
                Ok(Some(frame)) => addresses.push(frame.address_for_lookup()),
                Ok(None) => return Walk { addresses, ended: None },
                Err(e) => {
                    return Walk { addresses, ended: Some(format!("the unwinder stopped: {e}")) }
                }
            }
        }
    }
}

/// The load bias: the first mapping maps file offset `first.offset` at `first.start`; the
/// loadable segment holding that offset says which address the file states for it.
fn bias_of(file: &File, first: &MapEntry) -> u64 {
    file.segments
        .iter()
        .find_map(|&(foff, fsize, addr)| {
            (foff & !0xfff <= first.offset && first.offset < foff + fsize.max(1))
                .then(|| first.start.wrapping_sub(addr - foff + first.offset))
        })
        .unwrap_or(first.start - first.offset)
}

fn contiguous_group<'a>(same: &[&'a MapEntry], m: &'a MapEntry) -> (&'a MapEntry, &'a MapEntry) {
    // `same` is in address order (as maps is): walk outwards from m while mappings touch.
    let i = same.iter().position(|o| std::ptr::eq(*o, m)).unwrap_or(0);
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

/// Where this process can open a mapped file: map_files works for deleted files and across
/// mount namespaces but needs CAP_SYS_ADMIN (or CAP_CHECKPOINT_RESTORE); otherwise the path
/// as the process sees it, through its root.
fn openable(pid: i32, first: &MapEntry, exec: &MapEntry) -> Option<String> {
    let path = exec.path.trim_end_matches(" (deleted)");
    [
        format!("/proc/{pid}/map_files/{:x}-{:x}", first.start, first.end),
        format!("/proc/{pid}/root{path}"),
    ]
    .into_iter()
    .find(|p| std::fs::File::open(p).is_ok())
}

fn read_file(path: &str) -> Option<Arc<File>> {
    let file = std::fs::File::open(path).ok()?;
    // SAFETY: a read-only private mapping; a library truncated while loaded would crash the
    // process that runs it first.
    let data = unsafe { memmap2::Mmap::map(&file) }.ok()?;
    parse(&data).map(Arc::new)
}

fn parse(data: &[u8]) -> Option<File> {
    let obj = object::File::parse(data).ok()?;
    let range = |name: &str| obj.section_by_name(name).map(|s| s.address()..s.address() + s.size());
    let bytes = |name: &str| {
        obj.section_by_name(name)
            .and_then(|s| s.uncompressed_data().ok())
            .filter(|d| !d.is_empty())
            .map(|d| Arc::<[u8]>::from(d.as_ref()))
    };
    let with_range = |name: &str| range(name).zip(bytes(name));
    Some(File {
        segments: obj
            .segments()
            .map(|seg| {
                let (foff, fsize) = seg.file_range();
                (foff, fsize, seg.address())
            })
            .collect(),
        text: range(".text"),
        got: range(".got"),
        eh_frame: with_range(".eh_frame"),
        eh_frame_hdr: with_range(".eh_frame_hdr"),
        debug_frame: bytes(".debug_frame"),
    })
}
