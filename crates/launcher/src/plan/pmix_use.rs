//! Whether a program can be a PMIx client, read from the ELF dynamic sections (`super::elf`)
//! of the program and of every library the dynamic loader would map for it (`super::ldso`), so that jobs
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
use std::path::Path;

use super::elf::Dynamic;
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
