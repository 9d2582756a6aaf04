//! Whether a program can be a PMIx client, read from its ELF dynamic section, so that jobs
//! that cannot use PMIx do not pay for a PMIx server (8 ms a node here, against 3 ms for a
//! whole `-n 1 /bin/true`). Conservative: anything not shown unable to reach libpmix needs it.
//!
//! ```text
//!   needs libpmix / Open MPI (libmpi.so.40 ...)   ──► PMIx
//!   needs MPICH's libmpi.so.12 / libmpich         ──► PMI-1/2 only
//!   can load or start another program (dlopen, exec*, posix_spawn, system, popen),
//!   is static (no dynamic section to tell), is Go (execs by raw system calls),
//!   is not ELF, or cannot be read                 ──► PMIx
//!   anything else (/bin/true, hostname, sleep)    ──► PMI-1/2 only
//! ```

use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::Path;

/// Imports through which a program may load or start an MPI program of another kind.
const GATEWAYS: &[&[u8]] = &[
    b"dlopen",
    b"dlmopen",
    b"execve",
    b"execv",
    b"execvp",
    b"execvpe",
    b"execl",
    b"execlp",
    b"execle",
    b"fexecve",
    b"posix_spawn",
    b"posix_spawnp",
    b"system",
    b"popen",
];

/// Sections larger than this are not read (no real dynamic table comes close), and no more
/// than this is read in all: a crafted file cannot make the launcher read for long.
const MAX_SECTION: u64 = 64 << 20;

/// What the program's dynamic section says about PMIx.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) enum PmixUse {
    /// It links Open MPI or libpmix: without PMIx it would run as a singleton.
    Needs,
    /// It may load or start something that links them.
    Maybe,
    /// It cannot reach libpmix.
    Never,
}

/// Reads `path`'s dynamic section; any doubt is [`PmixUse::Maybe`].
pub(crate) fn pmix_use(path: &Path) -> PmixUse {
    let Ok(file) = File::open(path) else { return PmixUse::Maybe };
    match Dynamic::read(&file) {
        Some(dynamic) => dynamic.pmix_use(),
        None => PmixUse::Maybe,
    }
}

/// The libraries a program needs and the symbols it imports.
#[derive(Debug, Default)]
struct Dynamic {
    needed: Vec<Vec<u8>>,
    imports: Vec<Vec<u8>>,
    /// Go's toolchain built it (a `.note.go.buildid` section): Go starts programs with raw
    /// system calls, so no import shows it.
    go: bool,
}

impl Dynamic {
    fn pmix_use(&self) -> PmixUse {
        // Static (and static-pie, whose dynamic section needs nothing): exec or dlopen would
        // not show among imports.
        if self.needed.is_empty() || self.go {
            return PmixUse::Maybe;
        }
        let needs = |f: &dyn Fn(&[u8]) -> bool| self.needed.iter().any(|n| f(n));
        let open_mpi = |n: &[u8]| {
            n.starts_with(b"libpmix.so")
                || n == b"libmpi.so.40"
                || n.starts_with(b"libmpi_")
                || n.starts_with(b"libopen-pal.so")
                || n.starts_with(b"libopen-rte.so")
        };
        if needs(&open_mpi) {
            return PmixUse::Needs;
        }
        if needs(&|n| n.starts_with(b"libmpich") || n == b"libmpi.so.12") {
            return PmixUse::Never;
        }
        if self.imports.iter().any(|i| GATEWAYS.contains(&i.as_slice())) {
            return PmixUse::Maybe;
        }
        PmixUse::Never
    }

    /// The dynamic section of a 64-bit little-endian ELF file, from its section headers; a
    /// static executable has none, and an empty one. `None` if it is not such a file.
    fn read(file: &File) -> Option<Dynamic> {
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
        let mut dynamic = Dynamic::default();
        let names = sections.get(shstrndx).and_then(|s| s.read(file, &mut budget));
        dynamic.go = names.as_ref().is_some_and(|names| {
            sections.iter().any(|s| {
                let name = c_str(names, s.name as u64).unwrap_or_default();
                name == b".note.go.buildid" || name == b".go.buildinfo"
            })
        });
        for section in &sections {
            let strings =
                |budget: &mut u64| sections.get(section.link as usize)?.read(file, budget);
            match section.kind {
                // SHT_DYNAMIC: (tag, value) pairs; DT_NEEDED (1) names a library.
                6 => {
                    let body = section.read(file, &mut budget)?;
                    let strings = strings(&mut budget)?;
                    for entry in body.chunks_exact(16) {
                        if u64_at(entry, 0) == 1 {
                            dynamic.needed.push(c_str(&strings, u64_at(entry, 8))?);
                        }
                    }
                }
                // SHT_DYNSYM: undefined symbols (section index 0) are imports.
                11 => {
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

#[cfg(test)]
mod tests {
    use super::*;

    fn dynamic(needed: &[&str], imports: &[&str]) -> Dynamic {
        Dynamic {
            needed: needed.iter().map(|n| n.as_bytes().to_vec()).collect(),
            imports: imports.iter().map(|i| i.as_bytes().to_vec()).collect(),
            go: false,
        }
    }

    #[test]
    fn static_and_go_programs_may_use_pmix() {
        let mut d = dynamic(&["libc.so.6"], &["write"]);
        d.go = true;
        assert_eq!(d.pmix_use(), PmixUse::Maybe);
        assert_eq!(dynamic(&[], &[]).pmix_use(), PmixUse::Maybe, "static needs nothing");
    }

    #[test]
    fn open_mpi_and_gateways_need_pmix_mpich_and_plain_tools_do_not() {
        assert_eq!(dynamic(&["libmpi.so.40", "libc.so.6"], &[]).pmix_use(), PmixUse::Needs);
        assert_eq!(dynamic(&["libpmix.so.2"], &[]).pmix_use(), PmixUse::Needs);
        assert_eq!(dynamic(&["libmpich.so.12"], &["dlopen"]).pmix_use(), PmixUse::Never);
        assert_eq!(dynamic(&["libc.so.6"], &["execve"]).pmix_use(), PmixUse::Maybe);
        assert_eq!(dynamic(&["libc.so.6"], &["write", "exit"]).pmix_use(), PmixUse::Never);
    }

    #[test]
    fn real_executables_read_as_expected() {
        // Debian's coreutils start nothing; its shell does.
        assert_eq!(pmix_use(Path::new("/bin/true")), PmixUse::Never);
        assert_eq!(pmix_use(Path::new("/bin/sh")), PmixUse::Maybe);
        assert_eq!(pmix_use(Path::new("/nonexistent/program")), PmixUse::Maybe);
        // Not ELF: a script could run anything.
        let script = std::env::temp_dir().join(format!("rlaunch-elf-{}", std::process::id()));
        std::fs::write(&script, "#!/bin/sh\nexec ./app\n").unwrap();
        assert_eq!(pmix_use(&script), PmixUse::Maybe);
        std::fs::remove_file(&script).unwrap();
    }
}
