//! Real MPI and PMI-2 programs for the tests: the C sources in `tests/c/`, compiled once per
//! test process, and the checks of what they print.
//!
//! ```text
//!   tests/c/hello.c ──mpicc.mpich──► target/<profile>/c-programs/hello ──► rlaunch -n N ...
//!   tests/c/pmi2.c  ──cc -lpmi2────► target/<profile>/c-programs/pmi2
//! ```
//!
//! A misconfigured PMI makes MPICH start N singletons that all exit 0, so tests never trust an
//! exit status alone: [`check_hello`] checks every rank's size, sum and host.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

use crate::hosts::hostname;
use crate::Outcome;

/// A C program of `tests/c/`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CProgram {
    /// `hello N`: checks the size is N and the `MPI_Allreduce` sum of ranks, prints
    /// `rank R size N sum S name H`.
    Hello,
    /// A token passed around all ranks with `MPI_Send`/`MPI_Recv`.
    Ring,
    /// Rank 1 calls `MPI_Abort(MPI_COMM_WORLD, 42)` while the others block.
    Abort,
    /// `publish SERVICE PORT`: `MPI_Publish_name` on rank 0, `MPI_Lookup_name` on rank 1.
    Publish,
    /// A client of Slurm's `libpmi2`: KVS, node and job attributes.
    Pmi2,
    /// `appnum ROLE`: prints `rank R size N count N appnum A role ROLE` (one MPMD segment).
    Appnum,
}

enum Compiler {
    /// Debian's MPICH wrapper.
    Mpicc,
    /// The system C compiler, linking Slurm's `libpmi2`.
    CcPmi2,
}

impl CProgram {
    const COUNT: usize = 6;

    fn name(self) -> &'static str {
        match self {
            CProgram::Hello => "hello",
            CProgram::Ring => "ring",
            CProgram::Abort => "abort",
            CProgram::Publish => "publish",
            CProgram::Pmi2 => "pmi2",
            CProgram::Appnum => "appnum",
        }
    }

    fn compiler(self) -> Compiler {
        match self {
            CProgram::Pmi2 => Compiler::CcPmi2,
            _ => Compiler::Mpicc,
        }
    }

    /// The executable, compiled on first use in this process; panics if it cannot be built.
    pub fn path(self) -> &'static Path {
        // One cell per program: tests run on parallel threads, and each program is compiled
        // once per test process, whichever test needs it first.
        static BUILT: [OnceLock<PathBuf>; CProgram::COUNT] =
            [const { OnceLock::new() }; CProgram::COUNT];
        BUILT[self as usize].get_or_init(|| compile(self))
    }

    /// [`CProgram::path`] as a string, for argument lists.
    pub fn path_str(self) -> String {
        self.path().to_str().expect("the target directory is UTF-8").to_owned()
    }
}

/// Where the compiled programs go: `target/<profile>/c-programs/`, next to the binaries.
fn output_dir() -> PathBuf {
    crate::programs::target_dir().join("c-programs")
}

fn compile(program: CProgram) -> PathBuf {
    let source =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("c").join(format!("{}.c", program.name()));
    assert!(source.is_file(), "error: the C source {} is missing", source.display());
    let dir = output_dir();
    std::fs::create_dir_all(&dir)
        .unwrap_or_else(|e| panic!("error: cannot create {}: {e}", dir.display()));
    let out = dir.join(program.name());
    // Another test process may be compiling or running the same program: build under a name
    // of our own, then rename, which replaces the file atomically.
    let partial = dir.join(format!("{}.{}.partial", program.name(), std::process::id()));
    let (compiler, packages, mut command) = match program.compiler() {
        Compiler::Mpicc => ("mpicc.mpich", "mpich libmpich-dev", Command::new("mpicc.mpich")),
        Compiler::CcPmi2 => {
            let header = Path::new("/usr/include/slurm/pmi2.h");
            assert!(
                header.is_file(),
                "error: {} is missing: install Debian's libpmi2-0-dev (./test.sh does)",
                header.display()
            );
            ("cc", "gcc libpmi2-0-dev", Command::new("cc"))
        }
    };
    command.args(["-Wall", "-O1", "-o"]).arg(&partial).arg(&source);
    if let Compiler::CcPmi2 = program.compiler() {
        command.arg("-lpmi2");
    }
    let output = command.output().unwrap_or_else(|e| {
        panic!("error: cannot run {compiler}: {e}; install Debian's {packages} (./test.sh does)")
    });
    assert!(
        output.status.success(),
        "error: {compiler} failed on {} ({}):\n{}{}",
        source.display(),
        output.status,
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    std::fs::rename(&partial, &out)
        .unwrap_or_else(|e| panic!("error: cannot move {} into place: {e}", partial.display()));
    out
}

/// One rank's line from [`CProgram::Hello`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HelloLine {
    pub rank: u32,
    pub size: u32,
    pub sum: u64,
    pub name: String,
}

/// Parses `rank R size N sum S name H`.
pub fn parse_hello(line: &str) -> Option<HelloLine> {
    let words: Vec<&str> = line.split(' ').collect();
    match words.as_slice() {
        ["rank", rank, "size", size, "sum", sum, "name", name] => Some(HelloLine {
            rank: rank.parse().ok()?,
            size: size.parse().ok()?,
            sum: sum.parse().ok()?,
            name: (*name).to_owned(),
        }),
        _ => None,
    }
}

/// Checks a run of `hello n`: exit 0, and exactly one correct line from each rank 0..n, with
/// this machine's host name (fake nodes are this machine too).
pub fn check_hello(out: &Outcome, n: u32) {
    out.assert_code(0);
    let host = hostname();
    let mut by_rank: BTreeMap<u32, HelloLine> = BTreeMap::new();
    for line in out.lines() {
        let hello = parse_hello(&line).unwrap_or_else(|| panic!("unexpected line {line:?}: {out}"));
        let rank = hello.rank;
        assert!(by_rank.insert(rank, hello).is_none(), "rank {rank} printed twice: {out}");
    }
    assert_eq!(by_rank.keys().copied().collect::<Vec<_>>(), (0..n).collect::<Vec<_>>(), "{out}");
    let sum = u64::from(n) * u64::from(n - 1) / 2;
    for hello in by_rank.values() {
        let want = HelloLine { rank: hello.rank, size: n, sum, name: host.clone() };
        assert_eq!(*hello, want, "{out}");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hello_lines_parse() {
        let line = parse_hello("rank 3 size 4 sum 6 name vm").unwrap();
        assert_eq!(line, HelloLine { rank: 3, size: 4, sum: 6, name: "vm".into() });
        assert_eq!(parse_hello("rank 3 size 4 sum 6"), None);
        assert_eq!(parse_hello("rank x size 4 sum 6 name vm"), None);
    }
}
