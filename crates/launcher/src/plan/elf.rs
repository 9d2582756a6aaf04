//! Whether a program can be a PMIx client, read from the ELF dynamic sections of the program
//! and of every library the dynamic loader would map for it (`super::ldso`), so that jobs
//! that cannot use PMIx do not pay for a PMIx server. Conservative: anything not shown unable
//! to reach libpmix needs it.
//!
//! ```text
//!   program or any library it loads needs libpmix /
//!   Open MPI (libmpi.so.40 ...)                  ──► PMIx
//!   needs MPICH's libmpi.so.12 / libmpich         ──► PMI-1/2 only
//!   a library that cannot be found               ──► PMIx (it may be the one)
//!   can load or start another program (dlopen, exec*, posix_spawn, system, popen),
//!   is static (no dynamic section to tell), is Go (execs by raw system calls),
//!   is not ELF, or cannot be read                 ──► PMIx
//!   anything else (/bin/true, hostname, sleep)    ──► PMI-1/2 only
//! ```
//!
//! The whole closure matters: ScaLAPACK's testers need only `libscalapack-openmpi.so`, and
//! only that library needs `libmpi.so.40`; read alone, they looked like plain tools and ran
//! as one singleton per rank.

use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::Path;

use super::ldso::{Closure, Loader, Search};

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

/// Reads `path`'s dynamic section and those of the libraries the loader would map for it
/// under `search`; any doubt is [`PmixUse::Maybe`]. `loader` keeps what it read for the
/// job's other programs.
pub(crate) fn pmix_use(path: &Path, search: &Search, loader: &mut Loader) -> PmixUse {
    let Ok(file) = File::open(path) else { return PmixUse::Maybe };
    let Some(program) = Dynamic::read(&file, true).map(std::rc::Rc::new) else {
        return PmixUse::Maybe;
    };
    let closure = loader.closure(path, &program, search);
    verdict(&program, &closure)
}

/// Open MPI's libraries and libpmix, by the names objects ask for.
fn open_mpi(name: &[u8]) -> bool {
    name.starts_with(b"libpmix.so")
        || name == b"libmpi.so.40"
        || name.starts_with(b"libmpi_")
        || name.starts_with(b"libopen-pal.so")
        || name.starts_with(b"libopen-rte.so")
}

fn mpich(name: &[u8]) -> bool {
    name.starts_with(b"libmpich") || name == b"libmpi.so.12"
}

fn verdict(program: &Dynamic, closure: &Closure) -> PmixUse {
    // Static (and static-pie, whose dynamic section needs nothing): exec or dlopen would
    // not show among imports.
    if program.needed.is_empty() || program.go {
        return PmixUse::Maybe;
    }
    if closure.needed.iter().any(|n| open_mpi(n)) {
        return PmixUse::Needs;
    }
    // What a library that is not there here would bring cannot be told.
    if let Some(missing) = &closure.missing {
        tracing::debug!(library = %String::from_utf8_lossy(missing), "not found here");
        return PmixUse::Maybe;
    }
    if closure.needed.iter().any(|n| mpich(n)) {
        return PmixUse::Never;
    }
    if program.imports.iter().any(|i| GATEWAYS.contains(&i.as_slice())) {
        return PmixUse::Maybe;
    }
    PmixUse::Never
}

/// What the loader needs of an object: the libraries it asks for, where it says to look for
/// them, and (for the program) the symbols it imports.
#[derive(Debug, Default)]
pub(super) struct Dynamic {
    /// `DT_NEEDED`, in order.
    pub(super) needed: Vec<Vec<u8>>,
    /// Read for the program only.
    imports: Vec<Vec<u8>>,
    /// Go's toolchain built it (a `.note.go.buildid` section): Go starts programs with raw
    /// system calls, so no import shows it.
    go: bool,
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

#[cfg(test)]
mod tests {
    use super::*;

    fn dynamic(needed: &[&str], imports: &[&str]) -> Dynamic {
        Dynamic {
            needed: needed.iter().map(|n| n.as_bytes().to_vec()).collect(),
            imports: imports.iter().map(|i| i.as_bytes().to_vec()).collect(),
            ..Dynamic::default()
        }
    }

    /// The verdict on a program whose closure is its own needs, all found.
    fn alone(d: &Dynamic) -> PmixUse {
        verdict(d, &Closure { needed: d.needed.clone(), missing: None })
    }

    fn real(path: &str) -> PmixUse {
        pmix_use(Path::new(path), &Search::default(), &mut Loader::default())
    }

    #[test]
    fn static_and_go_programs_may_use_pmix() {
        let mut d = dynamic(&["libc.so.6"], &["write"]);
        d.go = true;
        assert_eq!(alone(&d), PmixUse::Maybe);
        assert_eq!(alone(&dynamic(&[], &[])), PmixUse::Maybe, "static needs nothing");
    }

    #[test]
    fn open_mpi_and_gateways_need_pmix_mpich_and_plain_tools_do_not() {
        assert_eq!(alone(&dynamic(&["libmpi.so.40", "libc.so.6"], &[])), PmixUse::Needs);
        assert_eq!(alone(&dynamic(&["libpmix.so.2"], &[])), PmixUse::Needs);
        assert_eq!(alone(&dynamic(&["libmpich.so.12"], &["dlopen"])), PmixUse::Never);
        assert_eq!(alone(&dynamic(&["libc.so.6"], &["execve"])), PmixUse::Maybe);
        assert_eq!(alone(&dynamic(&["libc.so.6"], &["write", "exit"])), PmixUse::Never);
    }

    #[test]
    fn real_executables_read_as_expected() {
        // Debian's coreutils start nothing; its shell does.
        assert_eq!(real("/bin/true"), PmixUse::Never);
        assert_eq!(real("/bin/sh"), PmixUse::Maybe);
        assert_eq!(real("/nonexistent/program"), PmixUse::Maybe);
        // Not ELF: a script could run anything.
        let script = std::env::temp_dir().join(format!("rlaunch-elf-{}", std::process::id()));
        std::fs::write(&script, "#!/bin/sh\nexec ./app\n").unwrap();
        assert_eq!(real(script.to_str().unwrap()), PmixUse::Maybe);
        std::fs::remove_file(&script).unwrap();
    }
}
