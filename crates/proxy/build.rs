//! Builds the PMIx host (`pmix/host.c`) when OpenPMIx's development files are installed, for
//! the proxy to embed; without them the proxy serves PMI-1 and PMI-2 only.
//!
//! Why a separate C program and not libpmix linked into the proxy: the proxy is a static
//! executable (one less dynamic load per node and job: docs/measurements.md, *Static proxy,
//! separate PMIx host*), and Debian ships no static libpmix, so whatever holds libpmix is dynamically
//! linked. Cargo builds every binary of a target with the same flags, so the dynamic part is
//! built here, by the C compiler, against the installed headers: the structures and macros
//! of `pmix.h` (`pmix_info_t`, `PMIX_INFO_LOAD`, the server module) come from the library's
//! own headers rather than hand-copied declarations, and only jobs that serve PMIx pay for
//! loading it.

use std::path::PathBuf;
use std::process::Command;

fn main() {
    println!("cargo::rustc-check-cfg=cfg(rlaunch_pmix)");
    println!("cargo::rerun-if-changed=pmix/host.c");
    println!("cargo::rerun-if-env-changed=PKG_CONFIG_PATH");
    println!("cargo::rerun-if-env-changed=RLAUNCH_NO_PMIX");
    if std::env::var_os("RLAUNCH_NO_PMIX").is_some() {
        return;
    }
    let Some(flags) = pkg_config(&["--cflags", "--libs", "pmix"]) else {
        // Installed later, the files land in one of pkg-config's directories: the next build
        // sees them, instead of keeping this build without PMIx.
        let searched = std::env::var("PKG_CONFIG_PATH").unwrap_or_default()
            + ":"
            + &pkg_config(&["--variable", "pc_path", "pkg-config"]).unwrap_or_default();
        for dir in searched.split(':') {
            if !dir.is_empty() && std::path::Path::new(dir).is_dir() {
                println!("cargo::rerun-if-changed={dir}");
            }
        }
        println!(
            "cargo::warning=built without PMIx: OpenPMIx's development files (pkg-config pmix) \
             are not installed, so Open MPI programs cannot run under this rlaunch (MPICH's \
             can). Install them and rebuild: Debian and Ubuntu: libpmix-dev; RHEL and its \
             rebuilds: pmix-devel"
        );
        return;
    };
    let version = pkg_config(&["--modversion", "pmix"]).unwrap_or_default();
    let out = PathBuf::from(std::env::var_os("OUT_DIR").expect("cargo sets OUT_DIR"));
    let host = out.join("rlaunch-pmix-host");
    let cc = std::env::var("CC").unwrap_or_else(|_| "cc".into());
    let status = Command::new(&cc)
        .args(["-std=gnu11", "-O2", "-g", "-Wall", "-Wextra", "-o"])
        .arg(&host)
        .arg("pmix/host.c")
        .args(flags.split_whitespace())
        .arg("-lpthread")
        .status();
    match status {
        Ok(s) if s.success() => {}
        Ok(s) => panic!("{cc} failed ({s}) building pmix/host.c against OpenPMIx {version}"),
        Err(e) => panic!("cannot run the C compiler {cc} to build pmix/host.c: {e}"),
    }
    println!("cargo::rustc-cfg=rlaunch_pmix");
    println!("cargo::rustc-env=RLAUNCH_PMIX_HOST={}", host.display());
    println!("cargo::rustc-env=RLAUNCH_PMIX_VERSION={}", version.trim());
}

/// `pkg-config ARGS`' output, or `None` if pkg-config or the package is missing.
fn pkg_config(args: &[&str]) -> Option<String> {
    let out = Command::new("pkg-config").args(args).output().ok()?;
    out.status.success().then(|| String::from_utf8_lossy(&out.stdout).trim().to_string())
}
