#!/usr/bin/env bash
# The whole test suite, as the README says: installs what the tests need (Debian packages, as
# root), builds everything, runs the unit and integration tests (which replay every fuzzing
# corpus and crash; the fuzzers themselves run by hand, README "Reliability in figures").
# Fails loudly if anything it needs cannot be installed.
set -euo pipefail
cd "$(dirname "$0")"

# The README's first command as a newcomer runs it: in CI, on a fresh machine, before anything
# below is installed. It must install what the build needs, build rlaunch with PMIx, and run
# a 4-rank job.
first=$(sed -n '/^# 1\. /{n;p;q}' README.md)
echo "test.sh: the README's first command: $first" >&2
said=$(bash -c "$first") || { echo "test.sh: the README's first command failed" >&2; exit 1; }
want=$(for r in 0 1 2 3; do echo "hello from rank $r of 4 on $(hostname)"; done)
[ "$(grep '^hello from' <<<"$said" | sed 's/ (local rank.*//' | sort)" = "$want" ] \
    || { echo "test.sh: the README's first command printed this, not 4 ranks' hellos:" >&2; echo "$said" >&2; exit 1; }
version=$(target/*/release/rlaunch --version)
[[ "$version" == *"PMIx: OpenPMIx "* ]] \
    || { echo "test.sh: the README's first command built an rlaunch without PMIx: $version" >&2; exit 1; }

# Each file the tests use, and the Debian package that has it: a file, not a stand-in (mpich's
# compiler wrapper is there without libmpich-dev's headers).
multiarch=$(gcc -print-multiarch 2>/dev/null || echo x86_64-linux-gnu)
need_pkgs=()
need_files=()
need() {
    need_files+=("$1")
    [ -e "$1" ] || need_pkgs+=("$2")
}
need /usr/bin/gcc gcc
need /usr/bin/mpicc.mpich mpich
need /usr/bin/mpiexec.hydra mpich
need "/usr/include/$multiarch/mpich/mpi.h" libmpich-dev
need "/usr/lib/$multiarch/libmpich.so" libmpich-dev
need /usr/include/slurm/pmi2.h libpmi2-0-dev
need "/usr/lib/$multiarch/libpmi2.so" libpmi2-0-dev
# Open MPI programs and the PMIx server the proxy embeds (its build finds libpmix through
# pkg-config).
need /usr/bin/mpicc.openmpi openmpi-bin
need "/usr/lib/$multiarch/openmpi/include/mpi.h" libopenmpi-dev
need "/usr/lib/$multiarch/openmpi/lib/libmpi.so" libopenmpi-dev
need "/usr/lib/$multiarch/pmix2/include/pmix_server.h" libpmix-dev
need "/usr/lib/$multiarch/pkgconfig/pmix.pc" libpmix-dev
need /usr/bin/pkg-config pkgconf
# Real applications that reach Open MPI through another library: ScaLAPACK's testers.
need "/usr/lib/$multiarch/scalapack/openmpi-tests/xdlu" scalapack-mpi-test
need "/usr/lib/$multiarch/scalapack/openmpi-tests/xdqr" scalapack-mpi-test
need /usr/bin/python3 python3
need /usr/sbin/ip iproute2
need /usr/sbin/sshd openssh-server
need /usr/bin/ssh openssh-client
need /usr/bin/ssh-keygen openssh-client
need /usr/bin/strace strace
# The hang report's stacks (tests/tests/hangs.rs): a program's debug info moved apart with
# objcopy, and the C library's separate debug info, found by its build id.
need /usr/bin/objcopy binutils
libc_id=$(readelf -n "/lib/$multiarch/libc.so.6" | sed -n 's/.*Build ID: //p')
need "/usr/lib/debug/.build-id/${libc_id:0:2}/${libc_id:2}.debug" libc6-dbg
need /usr/bin/flock util-linux
# `make install` and its manual page, completions and mpi4py under the installed mpiexec
# (tests/tests/cli.rs).
need /usr/bin/make make
need /usr/bin/man man-db
need /usr/bin/zsh zsh
need /usr/bin/fish fish
need /usr/lib/python3/dist-packages/mpi4py/__init__.py python3-mpi4py
# PyTorch jobs with no wrapper (tests/tests/frameworks.rs): Debian's CPU build, gloo.
need /usr/lib/python3/dist-packages/torch/distributed/__init__.py python3-torch
# dask-mpi's example under the installed mpirun (tests/tests/cli.rs): Debian's dask and
# distributed, and a venv for PyPI's dask-mpi (below).
need /usr/lib/python3/dist-packages/distributed/__init__.py python3-distributed
need /usr/lib/python3.11/ensurepip/__init__.py python3.11-venv
# XGBoost 1.7 with rlaunch as its rabit tracker (tests/tests/frameworks.rs).
need /usr/lib/python3/dist-packages/xgboost/collective.py python3-xgboost
# A real browser draws the page of `rlaunch timeline` in tests/tests/timeline.rs.
need /usr/bin/chromium chromium
need /usr/bin/unshare util-linux
# The Slurm cluster of tests/cluster/slurm.sh (Debian installs the daemons as *-wlm and links
# the plain names through update-alternatives).
need /usr/sbin/munged munge
need /usr/sbin/slurmctld-wlm slurmctld
need /usr/sbin/slurmd-wlm slurmd
need /usr/sbin/slurmstepd-wlm slurmd
need /usr/bin/srun slurm-client
need /usr/bin/salloc slurm-client
need /usr/bin/sbatch slurm-client
need /usr/bin/scancel slurm-client
need /usr/bin/sinfo slurm-client
need /usr/bin/squeue slurm-client
# The Grid Engine cluster of tests/cluster/sge.sh (Debian keeps the binaries in
# /usr/lib/gridengine; /usr/bin has wrappers that read SGE_ROOT).
need /usr/lib/gridengine/sge_qmaster gridengine-master
need /usr/lib/gridengine/sge_execd gridengine-exec
need /usr/lib/gridengine/sge_shepherd gridengine-exec
need /usr/lib/gridengine/qrsh_starter gridengine-client
need /usr/lib/gridengine/spoolinit gridengine-client
need /usr/lib/gridengine/spooldefaults gridengine-client
need /usr/share/gridengine/default-configuration gridengine-common
need /usr/share/gridengine/util/install_modules/inst_schedd_normal.conf gridengine-common
need /usr/lib/gridengine/qconf gridengine-client
need /usr/bin/qsub gridengine-client
need /usr/bin/qrsh gridengine-client
need /usr/bin/qstat gridengine-client
need /usr/bin/qdel gridengine-client
if [ ${#need_pkgs[@]} -gt 0 ]; then
    # Once each: one package may provide several of the files.
    mapfile -t need_pkgs < <(printf '%s\n' "${need_pkgs[@]}" | sort -u)
    if [ "$(id -u)" != 0 ]; then
        echo "test.sh: need Debian packages ${need_pkgs[*]} and am not root to install them" >&2
        exit 1
    fi
    echo "test.sh: installing ${need_pkgs[*]}" >&2
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    # --reinstall: a package may be installed and still miss its file.
    apt-get install -y -qq --reinstall --no-install-recommends "${need_pkgs[@]}" >/dev/null
fi
for f in "${need_files[@]}"; do
    [ -e "$f" ] || { echo "test.sh: $f is still missing after installing its package" >&2; exit 1; }
done

# dask-mpi is not in Debian: PyPI's, in a venv that sees Debian's dask, distributed and
# mpi4py. 2022.4.0 is the release of Debian's distributed (2022.12); kept between runs.
venv=target/venvs/dask-mpi
if [ ! -x "$venv/bin/dask-mpi" ]; then
    rm -rf "$venv"
    /usr/bin/python3 -m venv --system-site-packages "$venv"
    "$venv/bin/pip" install -q --no-deps dask-mpi==2022.4.0
fi
[ -x "$venv/bin/dask-mpi" ] || { echo "test.sh: $venv/bin/dask-mpi is missing after pip install" >&2; exit 1; }
# Current XGBoost (its tracker protocol from 2.1) over Debian's numpy and scipy.
venv=target/venvs/xgboost3
if ! "$venv/bin/python" -c 'import xgboost' 2>/dev/null; then
    rm -rf "$venv"
    /usr/bin/python3 -m venv --system-site-packages "$venv"
    "$venv/bin/pip" install -q --no-deps xgboost-cpu==3.2.0
fi
"$venv/bin/python" -c 'import xgboost; assert xgboost.__version__ == "3.2.0"' \
    || { echo "test.sh: $venv has no xgboost 3.2.0 after pip install" >&2; exit 1; }
# JAX on CPU is not in Debian: PyPI's, in a venv of its own (it needs a newer numpy than
# Debian's).
venv=target/venvs/jax
if ! "$venv/bin/python" -c 'import jax' 2>/dev/null; then
    rm -rf "$venv"
    /usr/bin/python3 -m venv "$venv"
    "$venv/bin/pip" install -q 'jax[cpu]==0.10.2'
fi
"$venv/bin/python" -c 'import jax; assert jax.__version__ == "0.10.2"' \
    || { echo "test.sh: $venv has no jax 0.10.2 after pip install" >&2; exit 1; }

cargo build --workspace --all-targets
# rlaunch as it builds where OpenPMIx's development files are missing: quiet where a job needs
# no PMIx, one line naming what to install where it does (tests/tests/openmpi.rs).
RLAUNCH_NO_PMIX=1 cargo build -p rlaunch -p rlaunch-proxy --target-dir target/no-pmix
cargo test --workspace -- --test-threads="${RLAUNCH_TEST_THREADS:-4}"
