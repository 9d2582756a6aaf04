#!/usr/bin/env bash
# The real-GPU check of docs/topology.md: run once, on a machine with NVIDIA GPU(s),
# from the repository root, after `cargo build --release`:
#
#   bash bench/gpu/check.sh        # RLAUNCH=/path/to/rlaunch to use another binary
#
# It checks that `--gpus-per-rank 1` gives each of K ranks one GPU, a different
# one each; that asking for K+1 ranks fails cleanly (exit 255, one rlaunch: line);
# and shows what --report-bindings prints. Exits non-zero if any check failed.
set -euo pipefail

rl=${RLAUNCH:-target/x86_64-unknown-linux-gnu/release/rlaunch}
[[ $rl == */* ]] || rl=$(command -v "$rl" || echo "$rl") # a bare name: look in PATH
[[ -x $rl ]] || { echo "no rlaunch binary at $rl (cargo build --release?)" >&2; exit 1; }

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
cc -O2 -o "$tmp/cuda_devices" bench/gpu/cuda_devices.c -ldl
prog=$tmp/cuda_devices

# How many GPUs: nvidia-smi if there is one (its "GPU n: ..." lines, not the
# indented "MIG ..." lines under them), else the PCI display controllers (class
# 0x03xxxx) whose vendor is NVIDIA (0x10de).
if command -v nvidia-smi >/dev/null; then
    gpus=$(nvidia-smi -L | grep -c '^GPU ' || true)
else
    gpus=0
    for dev in /sys/bus/pci/devices/*; do
        [[ -r $dev/vendor && -r $dev/class ]] || continue
        if [[ $(<"$dev/vendor") == 0x10de && $(<"$dev/class") == 0x03* ]]; then
            gpus=$((gpus + 1))
        fi
    done
fi

echo "== date:   $(date -u)"
echo "== kernel: $(uname -r)"
echo "== nproc:  $(nproc)"
echo "== gpus:   $gpus"
if command -v nvidia-smi >/dev/null; then nvidia-smi -L || true; fi
(( gpus > 0 )) || { echo "FAIL no NVIDIA GPU found"; exit 1; }

failed=0
check() { # check DESCRIPTION COMMAND...: PASS or FAIL, by the command's status
    local what=$1; shift
    if "$@"; then echo "PASS $what"; else echo "FAIL $what"; failed=1; fi
}
run() { # run N [FLAGS...]: rlaunch with a GPU per rank, a time limit, stderr to $tmp/err
    local n=$1; shift
    rc=0
    timeout 300 "$rl" --gpus-per-rank 1 "$@" -n "$n" "$prog" >"$tmp/out" 2>"$tmp/err" || rc=$?
}

echo; echo "== rlaunch --gpus-per-rank 1 -n $gpus"
run "$gpus"
sort "$tmp/out"; cat "$tmp/err"; echo "exit $rc"
# Each line is "rank R local L count N devices BUSIDS cvd=V"; field 6 is N, 8 the ids.
lines=$(wc -l <"$tmp/out")
ones=$(awk '$5 == "count" && $6 == "1"' "$tmp/out" | wc -l)
ids=$(awk '$5 == "count" && $6 == "1" { print $8 }' "$tmp/out" | sort -u | wc -l)
check "exit status 0" test "$rc" -eq 0
check "$gpus lines, one per rank (got $lines)" test "$lines" -eq "$gpus"
check "every rank sees exactly one GPU ($ones of $gpus)" test "$ones" -eq "$gpus"
check "the ranks' bus ids are all different ($ids distinct)" test "$ids" -eq "$gpus"

echo; echo "== rlaunch --gpus-per-rank 1 -n $((gpus + 1))  (one rank more than GPUs)"
run "$((gpus + 1))"
echo "exit $rc"; echo "stderr:"; cat "$tmp/err"
err_lines=$(wc -l <"$tmp/err")
err_rl=$(grep -c '^rlaunch:' "$tmp/err" || true)
check "exit status 255" test "$rc" -eq 255
check "stderr is one line (got $err_lines)" test "$err_lines" -eq 1
check "that line starts with rlaunch: ($err_rl such lines)" test "$err_rl" -eq 1

echo; echo "== rlaunch --gpus-per-rank 1 --report-bindings -n $gpus"
run "$gpus" --report-bindings
echo "exit $rc"; echo "stderr:"; cat "$tmp/err"

echo
if (( failed )); then echo "== FAIL"; exit 1; fi
echo "== PASS"
