//! What the dynamic loader needs of an ELF object, read from its dynamic section: the
//! libraries it asks for, where it says to look for them, and (for a program) the symbols it
//! imports. Bounded: a crafted file cannot make the launcher read for long.

use std::fs::File;
use std::os::unix::fs::FileExt;

/// Sections larger than this are not read (no real dynamic table comes close), and no more
/// than this is read in all: a crafted file cannot make the launcher read for long.
const MAX_SECTION: u64 = 64 << 20;

/// What the loader needs of an object: the libraries it asks for, where it says to look for
/// them, and (for the program) the symbols it imports.
#[derive(Debug, Default)]
pub(super) struct Dynamic {
    /// `DT_NEEDED`, in order.
    pub(super) needed: Vec<Vec<u8>>,
    /// Read for the program only.
    pub(super) imports: Vec<Vec<u8>>,
    /// Go's toolchain built it (a `.note.go.buildid` section): Go starts programs with raw
    /// system calls, so no import shows it.
    pub(super) go: bool,
    /// `DT_RPATH`, unless there is a `DT_RUNPATH` (the loader then ignores it).
    pub(super) rpath: Option<Vec<u8>>,
    pub(super) runpath: Option<Vec<u8>>,
    /// `e_machine`: the loader passes over a library built for another.
    pub(super) machine: u16,
}

impl Dynamic {
    /// The dynamic section of a 64-bit little-endian ELF file, from its section headers; a
    /// static executable has none, and an empty one. `None` if it is not such a file.
    /// `imports`: read the dynamic symbols too.
    pub(super) fn read(file: &File, imports: bool) -> Option<Dynamic> {
        let mut header = [0u8; 64];
        file.read_exact_at(&mut header, 0).ok()?;
        // Magic, 64-bit, little-endian.
        if header[..4] != *b"\x7fELF" || header[4] != 2 || header[5] != 1 {
            return None;
        }
        let shoff = u64_at(&header, 0x28);
        let shentsize = u16_at(&header, 0x3a) as u64;
        let shnum = u16_at(&header, 0x3c) as u64;
        let shstrndx = u16_at(&header, 0x3e) as usize;
        if shentsize != 64 || shnum == 0 || shnum > 4096 {
            return None;
        }
        let mut table = vec![0u8; (shentsize * shnum) as usize];
        file.read_exact_at(&mut table, shoff).ok()?;
        let sections: Vec<Section> =
            table.chunks_exact(shentsize as usize).map(Section::parse).collect();
        let mut budget = MAX_SECTION;
        let mut dynamic = Dynamic { machine: u16_at(&header, 0x12), ..Dynamic::default() };
        if imports {
            let names = sections.get(shstrndx).and_then(|s| s.read(file, &mut budget));
            dynamic.go = names.as_ref().is_some_and(|names| {
                sections.iter().any(|s| {
                    let name = c_str(names, s.name as u64).unwrap_or_default();
                    name == b".note.go.buildid" || name == b".go.buildinfo"
                })
            });
        }
        for section in &sections {
            let strings =
                |budget: &mut u64| sections.get(section.link as usize)?.read(file, budget);
            match section.kind {
                // SHT_DYNAMIC: (tag, value) pairs: DT_NEEDED (1) names a library, DT_RPATH
                // (15) and DT_RUNPATH (29) say where to look.
                // Its few strings are read one by one: a library's whole string table
                // (32 KiB for libc) is most of the time a closure takes.
                6 => {
                    let body = section.read(file, &mut budget)?;
                    let strings = sections.get(section.link as usize)?;
                    for entry in body.chunks_exact(16) {
                        let value = || strings.string(file, u64_at(entry, 8));
                        match u64_at(entry, 0) {
                            1 => dynamic.needed.push(value()?),
                            15 => dynamic.rpath = Some(value()?),
                            29 => dynamic.runpath = Some(value()?),
                            _ => {}
                        }
                    }
                }
                // SHT_DYNSYM: undefined symbols (section index 0) are imports.
                11 if imports => {
                    let body = section.read(file, &mut budget)?;
                    let strings = strings(&mut budget)?;
                    for symbol in body.chunks_exact(24).skip(1) {
                        if u16_at(symbol, 6) == 0 {
                            dynamic.imports.push(c_str(&strings, u32_at(symbol, 0) as u64)?);
                        }
                    }
                }
                _ => {}
            }
        }
        if dynamic.runpath.is_some() {
            dynamic.rpath = None;
        }
        Some(dynamic)
    }
}

struct Section {
    /// Offset of its name in the section-name table.
    name: u32,
    kind: u32,
    offset: u64,
    size: u64,
    link: u32,
}

impl Section {
    fn parse(h: &[u8]) -> Section {
        Section {
            name: u32_at(h, 0),
            kind: u32_at(h, 4),
            offset: u64_at(h, 0x18),
            size: u64_at(h, 0x20),
            link: u32_at(h, 0x28),
        }
    }

    /// The string at `at` of this string table, read alone.
    fn string(&self, file: &File, at: u64) -> Option<Vec<u8>> {
        const MAX_NAME: u64 = 4096;
        let len = self.size.checked_sub(at)?.min(MAX_NAME);
        let mut bytes = vec![0u8; len as usize];
        file.read_exact_at(&mut bytes, self.offset.checked_add(at)?).ok()?;
        c_str(&bytes, 0)
    }

    /// Its bytes, taken from `budget`; `None` past it.
    fn read(&self, file: &File, budget: &mut u64) -> Option<Vec<u8>> {
        *budget = budget.checked_sub(self.size)?;
        let mut body = vec![0u8; self.size as usize];
        file.read_exact_at(&mut body, self.offset).ok()?;
        Some(body)
    }
}

fn c_str(strings: &[u8], at: u64) -> Option<Vec<u8>> {
    let rest = strings.get(usize::try_from(at).ok()?..)?;
    Some(rest.split(|&b| b == 0).next()?.to_vec())
}

fn u16_at(b: &[u8], at: usize) -> u16 {
    u16::from_le_bytes([b[at], b[at + 1]])
}

fn u32_at(b: &[u8], at: usize) -> u32 {
    u32::from_le_bytes(b[at..at + 4].try_into().expect("4 bytes"))
}

fn u64_at(b: &[u8], at: usize) -> u64 {
    u64::from_le_bytes(b[at..at + 8].try_into().expect("8 bytes"))
}
