#!/usr/bin/env bash
# What a full build of rlaunch needs besides Rust, installed where it can be (`make` runs this
# first: the README's first command): a C compiler and the static C library (the binaries are
# static, .cargo/config.toml), and OpenPMIx's development files with pkg-config, which the
# proxy's build finds to embed a PMIx server (without them Open MPI programs cannot run).
#
# As root on Debian or Ubuntu, what is missing is installed with apt-get, saying so in one
# line. Elsewhere nothing is installed: a missing compiler is an error (exit 1); missing PMIx
# files are one line on stderr, and the build goes on without PMIx. RLAUNCH_NO_PMIX=1 builds
# without PMIx on purpose and skips its check.
set -euo pipefail

missing=() # Debian's names of the packages that would provide what is missing
if ! command -v cc >/dev/null; then
    missing+=(gcc)
elif [[ "$(cc -print-file-name=libc.a)" != /* ]]; then
    missing+=(libc6-dev)
fi
if [ -z "${RLAUNCH_NO_PMIX:-}" ]; then
    command -v pkg-config >/dev/null || missing+=(pkgconf)
    pkg-config --exists pmix 2>/dev/null || missing+=(libpmix-dev)
fi
[ ${#missing[@]} -eq 0 ] && exit 0

# Once: a second look after installing says what apt-get did not provide.
if [ -z "${RLAUNCH_DEPS_INSTALLED:-}" ] && [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
    echo "build-deps: installing ${missing[*]} (apt-get), which the build needs" >&2
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
    RLAUNCH_DEPS_INSTALLED=1 exec bash "$0"
fi

still=" ${missing[*]} "
if [[ "$still" == *" gcc "* || "$still" == *" libc6-dev "* ]]; then
    echo "build-deps: cannot build rlaunch: it needs a C compiler and the static C library" \
        "(Debian and Ubuntu: gcc libc6-dev; RHEL: gcc glibc-static)" >&2
    exit 1
fi
# Only PMIx is missing: one line, and the build goes on.
echo "build-deps: building rlaunch without PMIx, so Open MPI programs cannot run under it:" \
    "install ${missing[*]} (RHEL: pmix-devel) and run make again" >&2
