//! Where the programs the tests run are: the built binaries (`rlaunch`, `rlaunch-proxy`, and
//! this package's `rankprog` and `pmiprog`) and the scripts of `tests/scripts/`.
//!
//! ```text
//!   target/<profile>/deps/<test>-<hash>   the running test (unit tests of this crate too)
//!   target/<profile>/rlaunch, rankprog... the binaries: one directory up
//!   tests/scripts/fakessh, ...            the scripts: in the package's sources
//! ```
//!
//! `cargo test -p rlaunch-tests` builds `rankprog` and `pmiprog` but not `rlaunch`: each lookup
//! that finds nothing panics with the command to run.

use std::path::{Path, PathBuf};

/// The `rlaunch` executable.
pub fn rlaunch() -> PathBuf {
    built_binary("rlaunch", "cargo build --workspace")
}

/// `rlaunch` built without PMIx (`RLAUNCH_NO_PMIX=1`), as on a machine without OpenPMIx's
/// development files: `target/no-pmix/<triple>/<profile>/`, which ./test.sh builds.
pub fn rlaunch_without_pmix() -> PathBuf {
    let dir = target_dir();
    let (profile, triple) = (dir.file_name(), dir.parent().and_then(Path::file_name));
    let target = dir.parent().and_then(Path::parent).expect("target/<triple>/<profile>");
    let exe =
        target.join("no-pmix").join(triple.expect("a triple")).join(profile.expect("a profile"));
    let exe = exe.join(format!("rlaunch{}", std::env::consts::EXE_SUFFIX));
    assert!(
        exe.is_file(),
        "error: {} does not exist; build it with `RLAUNCH_NO_PMIX=1 cargo build -p rlaunch \
         -p rlaunch-proxy --target-dir target/no-pmix` (./test.sh does)",
        exe.display()
    );
    exe
}

/// The `rlaunch-proxy` executable.
pub fn proxy() -> PathBuf {
    built_binary("rlaunch-proxy", "cargo build --workspace")
}

/// The `rankprog` helper (this package's binary).
pub fn rankprog() -> PathBuf {
    built_binary("rankprog", "cargo build -p rlaunch-tests")
}

/// The `pmiprog` helper (this package's binary): a PMI client driven by a script.
pub fn pmiprog() -> PathBuf {
    built_binary("pmiprog", "cargo build -p rlaunch-tests")
}

/// The chaos runner (this package's binary `chaos`, see `src/bin/chaos/main.rs`).
pub fn chaos() -> PathBuf {
    built_binary("chaos", "cargo build -p rlaunch-tests")
}

/// The chaos runner's rank program (`src/bin/chaosrank.rs`): a PMI-1 rank that does one
/// phase's work for ever, and under `--on-failure continue` stops once told of a failure.
pub fn chaosrank() -> PathBuf {
    built_binary("chaosrank", "cargo build -p rlaunch-tests")
}

/// [`proxy`] as a string, for argument lists.
pub fn proxy_str() -> String {
    path_str(proxy())
}

/// [`rankprog`] as a string, for argument lists.
pub fn rankprog_str() -> String {
    path_str(rankprog())
}

/// [`pmiprog`] as a string, for argument lists.
pub fn pmiprog_str() -> String {
    path_str(pmiprog())
}

/// `tests/scripts/fakessh`: an `ssh` that runs the remote command here; hosts named
/// `unreachable*` fail as a name ssh cannot resolve does.
pub fn fakessh() -> String {
    path_str(script("fakessh"))
}

/// `tests/scripts/spawn_client.py`: a raw PMI client that spawns a job (`python3 ... 1|2`).
pub fn spawn_client() -> String {
    path_str(script("spawn_client.py"))
}

/// `tests/scripts/python_hang.py`: a Python job whose ranks sleep or spin in functions of
/// their own, for the hang report's Python frames.
pub fn python_hang() -> String {
    path_str(script("python_hang.py"))
}

/// `tests/scripts/mpi4py_hang.py`: an mpi4py job whose rank 1 never reaches MPI_Barrier.
pub fn mpi4py_hang() -> String {
    path_str(script("mpi4py_hang.py"))
}

/// `tests/scripts/torch_job.py`: a torch.distributed job as users write it for torchrun.
pub fn torch_job() -> String {
    path_str(script("torch_job.py"))
}

/// `tests/scripts/xgboost_job.py`: an XGBoost job as users write it for a rabit tracker.
pub fn xgboost_job() -> String {
    path_str(script("xgboost_job.py"))
}

/// `tests/scripts/jax_job.py`: a multi-process JAX job on CPU as users write it.
pub fn jax_job() -> String {
    path_str(script("jax_job.py"))
}

/// The interpreter of the venv `target/venvs/NAME` that test.sh makes for a framework not in
/// Debian (`jax`, `xgboost3`, `dask-mpi`); fails loudly when it is missing.
pub fn venv_python(name: &str) -> String {
    let repo = Path::new(env!("CARGO_MANIFEST_DIR")).parent().expect("the repository");
    let python = repo.join("target/venvs").join(name).join("bin/python");
    assert!(python.exists(), "{} is missing: run test.sh, which makes it", python.display());
    path_str(python)
}

/// The directory of the running profile's binaries, `target/<profile>/`.
pub(crate) fn target_dir() -> PathBuf {
    let exe = std::env::current_exe()
        .unwrap_or_else(|e| panic!("cannot locate the test executable: {e}"));
    let mut dir = exe
        .parent()
        .unwrap_or_else(|| panic!("the test executable {} has no directory", exe.display()))
        .to_path_buf();
    if dir.ends_with("deps") {
        dir.pop();
    }
    dir
}

fn built_binary(name: &str, build: &str) -> PathBuf {
    let path = target_dir().join(format!("{name}{}", std::env::consts::EXE_SUFFIX));
    assert!(
        path.is_file(),
        "error: {name} is not built: {} does not exist; run `{build}` before the tests",
        path.display()
    );
    path
}

/// `tests/scripts/schedulers/`: fake `qrsh` and `blaunch` that run the proxy here and log
/// each call to `$FAKE_LAUNCH_LOG`, and `ssh` (fakessh); put the directory first on PATH.
pub fn fake_scheduler_launchers() -> String {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("scripts").join("schedulers");
    assert!(dir.join("qrsh").is_file(), "error: {} is missing", dir.display());
    path_str(dir)
}

fn script(name: &str) -> PathBuf {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("scripts").join(name);
    assert!(path.is_file(), "error: the script {} is missing", path.display());
    path
}

fn path_str(path: PathBuf) -> String {
    path.into_os_string()
        .into_string()
        .unwrap_or_else(|p| panic!("the target directory is not UTF-8: {p:?}"))
}
