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
    /// [`CProgram::Hello`] built with Open MPI (a PMIx client).
    OmpiHello,
    /// [`CProgram::Ring`] built with Open MPI.
    OmpiRing,
    /// [`CProgram::Abort`] built with Open MPI.
    OmpiAbort,
    /// [`CProgram::Publish`] built with Open MPI.
    OmpiPublish,
    /// Open MPI: `rank R size N shared S host H`, where S is the size of the rank's
    /// shared-memory communicator and H its PMIx server's node name.
    OmpiNodes,
    /// A client of libpmix that prints the process sets its server defines.
    Psets,
    /// A client of libpmix: each rank commits a value and gets rank (R+1)%size's with no
    /// fence to bring it (`rank R got from P`, or `rank R cannot get P: STATUS` and exit 3).
    Dmodex,
    /// Open MPI: `die VICTIM [exit]`: after a barrier (`ready R` before it), rank VICTIM
    /// kills itself with SIGKILL (or exits 0 without MPI_Finalize) while the others wait in
    /// MPI_Finalize's fence.
    OmpiDie,
    /// Open MPI: `spawn SPAWNER`: rank SPAWNER spawns 2 children with `MPI_Comm_spawn` over
    /// MPI_COMM_SELF (`spawn world`: every rank, over MPI_COMM_WORLD) and parents and children
    /// exchange a message over the intercommunicator (`parent R spawned 2`, `child C of 2 got
    /// 10P from P`, `parent R heard C: N`; ranks that spawn nothing print `rank R idle`).
    OmpiSpawn,
    /// Open MPI: `connect SERVICE`: rank 0 publishes a port and accepts, rank 1 looks it up
    /// and connects; they exchange a message (`accepted 42`, `connected 43`).
    OmpiConnect,
    /// A client of libpmix: rank 1 leaves a waiting lookup of `rlaunch.once` behind
    /// (`rank 1 leaves`); rank 0 reads a line, publishes it for one read and looks it up
    /// (`rank 0 found v1`, or `rank 0 cannot find it: STATUS` and exit 3).
    Names,
    /// A client of libpmix: `fence BYTES ABSENT [wait]`: each rank puts BYTES bytes, prints
    /// `ready R` (then reads a line with `wait`), fences collecting data, and checks the blob
    /// of every other rank but those of ABSENT (`0,4`, or `-`) from what the fence brought
    /// (`rank R has N blobs`, or a complaint and exit 3).
    Fence,
    /// `hang LATE SPIN`: every rank prints `pid R P` first; rank LATE never calls MPI_Init,
    /// rank SPIN loops in `spin_for_ever` after it while the others wait in MPI_Barrier (-1:
    /// none).
    Hang,
    /// [`CProgram::Hang`] built with Open MPI.
    OmpiHang,
    /// [`CProgram::Hang`] without debug info (`-g`), as most programs are: symbols only.
    HangNoDebug,
    /// [`CProgram::Hang`] with its debug info apart, as distributions ship it: `-g`, then
    /// `objcopy --only-keep-debug` into `hang-split.debug` beside it, found through the
    /// program's `.gnu_debuglink`.
    HangSplit,
    /// `unreadable vfork|nodump`: rank 0 in D state (waiting for its vfork child) or made
    /// non-dumpable; every rank prints `ready R` and then waits in `wait_readably`. No MPI.
    Unreadable,
    /// A client of libpmix: every rank but 1 registers a handler for `PMIX_ERR_PROC_ABORTED`,
    /// all fence, rank 1 exits 3, and the others, once told, fence again over the whole job
    /// and print `rank R told rank F failed` (or `rank R not told` and exit 3 after 10 s),
    /// then finalize.
    Dead,
    /// Open MPI, with OpenPMIx's client too: every rank registers a handler for
    /// `PMIX_ERR_PROC_ABORTED`; after a barrier rank 1 exits 3 and the others, once told,
    /// sum their ranks over a communicator of the survivors, print `rank R told rank F
    /// failed, survivors' sum S`, finalize and print `rank R finalized`.
    OmpiSurvive,
    /// The chaos runner's rank program for PMIx (`chaos --ranks pmix`): `chaosrank`'s
    /// phases, faults and side files, as a libpmix client.
    ChaosPmix,
    /// A libpmix client whose rank 1 dies by SIGALRM inside a fence that collects data; a
    /// rank that comes out of it prints `rank R has every key` or `rank R lacks P's key: S`
    /// (and exits 4).
    DieFence,
}

enum Compiler {
    /// Debian's MPICH wrapper.
    Mpicc,
    /// Debian's Open MPI wrapper.
    MpiccOpenmpi,
    /// The system C compiler, linking Slurm's `libpmi2`.
    CcPmi2,
    /// The system C compiler, linking OpenPMIx's `libpmix`.
    CcPmix,
}

impl CProgram {
    const COUNT: usize = 27;

    /// The executable's name.
    fn name(self) -> &'static str {
        match self {
            CProgram::Hello => "hello",
            CProgram::Ring => "ring",
            CProgram::Abort => "abort",
            CProgram::Publish => "publish",
            CProgram::Pmi2 => "pmi2",
            CProgram::Appnum => "appnum",
            CProgram::OmpiHello => "ompi-hello",
            CProgram::OmpiRing => "ompi-ring",
            CProgram::OmpiAbort => "ompi-abort",
            CProgram::OmpiPublish => "ompi-publish",
            CProgram::OmpiNodes => "ompi-nodes",
            CProgram::Psets => "psets",
            CProgram::Dmodex => "dmodex",
            CProgram::OmpiDie => "ompi-die",
            CProgram::OmpiSpawn => "ompi-spawn",
            CProgram::OmpiConnect => "ompi-connect",
            CProgram::Names => "names",
            CProgram::Fence => "fence",
            CProgram::Hang => "hang",
            CProgram::OmpiHang => "ompi-hang",
            CProgram::HangNoDebug => "hang-nodebug",
            CProgram::Unreadable => "unreadable",
            CProgram::HangSplit => "hang-split",
            CProgram::Dead => "dead",
            CProgram::OmpiSurvive => "ompi-survive",
            CProgram::ChaosPmix => "chaospmix",
            CProgram::DieFence => "diefence",
        }
    }

    /// Its source in `tests/c/`, without `.c`.
    fn source(self) -> &'static str {
        let name = self.name().strip_prefix("ompi-").unwrap_or(self.name());
        ["-nodebug", "-split"].iter().fold(name, |n, s| n.strip_suffix(s).unwrap_or(n))
    }

    fn compiler(self) -> Compiler {
        match self {
            CProgram::Pmi2 => Compiler::CcPmi2,
            CProgram::Psets
            | CProgram::Dmodex
            | CProgram::Names
            | CProgram::Fence
            | CProgram::Dead
            | CProgram::ChaosPmix
            | CProgram::DieFence => Compiler::CcPmix,
            CProgram::OmpiHello
            | CProgram::OmpiRing
            | CProgram::OmpiAbort
            | CProgram::OmpiPublish
            | CProgram::OmpiNodes
            | CProgram::OmpiDie
            | CProgram::OmpiSpawn
            | CProgram::OmpiConnect
            | CProgram::OmpiHang
            | CProgram::OmpiSurvive => Compiler::MpiccOpenmpi,
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
        Path::new(env!("CARGO_MANIFEST_DIR")).join("c").join(format!("{}.c", program.source()));
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
        Compiler::MpiccOpenmpi => {
            ("mpicc.openmpi", "openmpi-bin libopenmpi-dev", Command::new("mpicc.openmpi"))
        }
        Compiler::CcPmix => ("cc", "gcc libpmix-dev", Command::new("cc")),
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
    if let CProgram::Hang | CProgram::OmpiHang | CProgram::HangSplit = program {
        // The hang report's stacks name its lines.
        command.arg("-g");
    }
    if let Compiler::CcPmi2 = program.compiler() {
        command.arg("-lpmi2");
    }
    if matches!(program.compiler(), Compiler::CcPmix) || program == CProgram::OmpiSurvive {
        // Debian keeps libpmix out of the default search paths: pkg-config knows where.
        let flags = Command::new("pkg-config").args(["--cflags", "--libs", "pmix"]).output();
        let flags = flags.ok().filter(|o| o.status.success()).unwrap_or_else(|| {
            panic!("error: pkg-config pmix failed: install Debian's libpmix-dev (./test.sh does)")
        });
        command.args(String::from_utf8_lossy(&flags.stdout).split_whitespace());
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
    if program == CProgram::HangSplit {
        split_debug_info(&partial, &dir, program.name());
    }
    std::fs::rename(&partial, &out)
        .unwrap_or_else(|e| panic!("error: cannot move {} into place: {e}", partial.display()));
    out
}

/// Moves `program`'s debug info to `NAME.debug` in `dir`, which its `.gnu_debuglink` then
/// names. Made in a directory of this process's and moved into place, as the program is.
fn split_debug_info(program: &Path, dir: &Path, name: &str) {
    let own = dir.join(format!("{name}.{}.d", std::process::id()));
    std::fs::create_dir_all(&own).unwrap();
    let debug = own.join(format!("{name}.debug"));
    let objcopy = |args: &[&std::ffi::OsStr]| {
        let done = Command::new("objcopy").args(args).status();
        let done = done.unwrap_or_else(|e| panic!("error: cannot run objcopy: {e} (binutils)"));
        assert!(done.success(), "error: objcopy {args:?} failed: {done}");
    };
    let (program, debug_arg) = (program.as_os_str(), debug.as_os_str());
    objcopy(&["--only-keep-debug".as_ref(), program, debug_arg]);
    objcopy(&["--strip-debug".as_ref(), program]);
    let link = format!("--add-gnu-debuglink={}", debug.display());
    objcopy(&[link.as_ref(), program]);
    std::fs::rename(&debug, dir.join(format!("{name}.debug"))).unwrap();
    let _ = std::fs::remove_dir(&own);
}

/// How [`via_library`]'s program finds its library.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LibraryPath {
    /// A `DT_RUNPATH` of `$ORIGIN/lib` in the program.
    OriginRunpath,
    /// Nothing in the program: the job's `LD_LIBRARY_PATH` must name `lib/`.
    Environment,
    /// The program links `lib/libloader.so` (`tests/c/loader.c`, by a `$ORIGIN/lib`
    /// RUNPATH), which loads the library the rank's `MPI_HELLO_LIBRARY` names with
    /// `dlopen`: no ELF file shows Open MPI.
    Dlopen,
}

/// `tests/c/via_library.c`, a plain C program linked only to `lib/libmpihello.so`, which is
/// [`CProgram::Hello`] built with Open MPI as a shared library: the program reaches libmpi
/// through another library, as ScaLAPACK's testers and PETSc programs do (or, with
/// [`LibraryPath::Dlopen`], through a library that loads it by a name read at run time).
/// Returns the program; its libraries are in `lib/` beside it. Built on first use in this
/// process.
pub fn via_library(path: LibraryPath) -> &'static Path {
    static BUILT: [OnceLock<PathBuf>; 3] = [const { OnceLock::new() }; 3];
    BUILT[path as usize].get_or_init(|| {
        let name = match path {
            LibraryPath::OriginRunpath => "via-runpath",
            LibraryPath::Environment => "via-environment",
            LibraryPath::Dlopen => "via-dlopen",
        };
        // Built under a name of this process, then renamed into place whole: another test
        // process may be using the same directory.
        let dir = output_dir().join(name);
        let partial = output_dir().join(format!("{name}.{}.partial", std::process::id()));
        let _ = std::fs::remove_dir_all(&partial);
        let lib = partial.join("lib");
        std::fs::create_dir_all(&lib)
            .unwrap_or_else(|e| panic!("error: cannot create {}: {e}", lib.display()));
        let c = Path::new(env!("CARGO_MANIFEST_DIR")).join("c");
        let library = lib.join("libmpihello.so");
        let mut command = Command::new("mpicc.openmpi");
        command.args(["-Wall", "-O1", "-shared", "-fPIC", "-Dmain=mpi_hello_main", "-o"]);
        run_compiler(command.arg(&library).arg(c.join("hello.c")), "mpicc.openmpi");
        let (source, linked) = match path {
            LibraryPath::Dlopen => {
                let mut command = Command::new("cc");
                command.args(["-Wall", "-O1", "-shared", "-fPIC", "-o"]);
                command.arg(lib.join("libloader.so")).arg(c.join("loader.c")).arg("-ldl");
                run_compiler(&mut command, "cc");
                ("via_loader.c", "-lloader")
            }
            _ => ("via_library.c", "-lmpihello"),
        };
        let mut command = Command::new("cc");
        command.args(["-Wall", "-O1", "-o"]).arg(partial.join("via-library"));
        command.arg(c.join(source)).arg("-L").arg(&lib).arg(linked);
        if path != LibraryPath::Environment {
            command.args(["-Wl,--enable-new-dtags", "-Wl,-rpath,$ORIGIN/lib"]);
        }
        run_compiler(&mut command, "cc");
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::rename(&partial, &dir)
            .unwrap_or_else(|e| panic!("error: cannot move {} into place: {e}", dir.display()));
        dir.join("via-library")
    })
}

/// Runs a compiler; panics with what it said if it fails.
fn run_compiler(command: &mut Command, compiler: &str) {
    let output = command.output().unwrap_or_else(|e| {
        panic!("error: cannot run {compiler}: {e}; install it (./test.sh does)")
    });
    assert!(
        output.status.success(),
        "error: {compiler} failed ({}):\n{}{}",
        output.status,
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
}

/// Each MPI run's bound in the tests; they take well under two seconds here.
pub const MPI_LIMIT: std::time::Duration = std::time::Duration::from_secs(60);

/// `--launcher fork --hosts n1:per,...,n<nodes>:per`: fake nodes, each its own proxy.
pub fn fake_nodes(nodes: usize, per: u32) -> Vec<String> {
    let hosts = crate::hosts::node_list_with_slots(nodes, per);
    vec!["--launcher".into(), "fork".into(), "--hosts".into(), hosts]
}

/// rlaunch running `program args` on `n` ranks, after `options`.
pub fn mpi_run(options: &[String], n: u32, program: CProgram, args: &[&str]) -> crate::Run {
    crate::Run::new(&[])
        .args(options)
        .args(["-n".to_string(), n.to_string(), program.path_str()])
        .args(args)
        .timeout(MPI_LIMIT)
}

/// Checks a run of [`CProgram::Abort`] (or its Open MPI build) on 4 ranks: exit 42, one line
/// from rlaunch naming rank 1 on `host`, every rank got as far as blocking and none past it,
/// and nothing of the job is left.
pub fn check_abort(out: &Outcome, host: &str) {
    out.assert_code(42);
    let err = out.stderr_str();
    let ours = crate::output::rlaunch_lines(&err);
    assert_eq!(ours.len(), 1, "one line from rlaunch, naming the aborting rank only: {out}");
    let rest = ours[0].strip_prefix("rlaunch: rank 1 (pid ").unwrap_or_else(|| panic!("{out}"));
    let (pid, rest) = rest.split_once(' ').unwrap_or_else(|| panic!("{out}"));
    assert!(pid.parse::<u32>().is_ok_and(|p| p > 0), "pid {pid:?}: {out}");
    assert_eq!(rest, format!("on {host}) aborted the job with exit code 42"), "{out}");
    let lines = crate::output::sorted(out.lines());
    assert_eq!(lines, ["blocking 0", "blocking 1", "blocking 2", "blocking 3"], "{out}");
    out.tag.wait_until_none(std::time::Duration::from_secs(5)).unwrap_or_else(|left| {
        panic!("left running after MPI_Abort: {left:?}");
    });
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
