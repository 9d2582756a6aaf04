#!/usr/bin/env bash
# The whole test suite, as the README says: installs what the tests need (Debian packages, as
# root), builds everything, runs the unit and integration tests and a bounded fuzz run.
# Fails loudly if anything it needs cannot be installed.
set -euo pipefail
cd "$(dirname "$0")"

need_pkgs=()
command -v mpicc.mpich >/dev/null || need_pkgs+=(mpich libmpich-dev)
[ -e /usr/include/slurm/pmi2.h ] || need_pkgs+=(libpmi2-0-dev)
command -v ip >/dev/null || need_pkgs+=(iproute2)
command -v sshd >/dev/null || [ -x /usr/sbin/sshd ] || need_pkgs+=(openssh-server)
command -v ssh >/dev/null || need_pkgs+=(openssh-client)
command -v strace >/dev/null || need_pkgs+=(strace)
if [ ${#need_pkgs[@]} -gt 0 ]; then
    if [ "$(id -u)" != 0 ]; then
        echo "test.sh: need Debian packages ${need_pkgs[*]} and am not root to install them" >&2
        exit 1
    fi
    echo "test.sh: installing ${need_pkgs[*]}" >&2
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    apt-get install -y -qq --no-install-recommends "${need_pkgs[@]}" >/dev/null
fi

cargo build --workspace --all-targets
cargo test --workspace -- --test-threads="${RLAUNCH_TEST_THREADS:-4}"
