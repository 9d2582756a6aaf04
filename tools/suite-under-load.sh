#!/usr/bin/env bash
# The whole suite on a busy machine, as users run jobs on shared nodes: busy loops at normal
# priority (two by default, one a core on this 2-core machine) run beside ./test.sh, which
# runs ROUNDS times in a row (default 2) and must pass every time. The loops are this
# script's own children, killed by their pids when it ends, however it ends. Results:
# docs/reliability.md "The suite under load".
#
#   tools/suite-under-load.sh [ROUNDS]          HOGS=N for another number of busy loops
#
# Prints one line a round (passed or failed, its wall time), and the CPU seconds the loops
# took, which says that they did compete. Exit status: 0 if every round passed, else 1.
set -euo pipefail
cd "$(dirname "$0")/.."
rounds=${1:-2}
hogs=()
stop() {
    local pid
    for pid in "${hogs[@]}"; do kill "$pid" 2>/dev/null || true; done
    for pid in "${hogs[@]}"; do wait "$pid" 2>/dev/null || true; done
}
trap stop EXIT
for _ in $(seq 1 "${HOGS:-2}"); do
    bash -c 'while :; do :; done' &
    hogs+=("$!")
done
# utime + stime of a process, in seconds (fields 14 and 15 of /proc/PID/stat, in clock ticks;
# the command name in field 2 has no spaces here).
cpu_seconds() {
    awk -v hz="$(getconf CLK_TCK)" '{ printf "%.0f", ($14 + $15) / hz }' "/proc/$1/stat"
}
status=0
for round in $(seq 1 "$rounds"); do
    start=$(date +%s)
    if ./test.sh; then
        echo "suite-under-load: round $round of $rounds passed in $(($(date +%s) - start)) s" >&2
    else
        echo "suite-under-load: round $round of $rounds FAILED after $(($(date +%s) - start)) s" >&2
        status=1
        break
    fi
done
used=()
for pid in "${hogs[@]}"; do used+=("$(cpu_seconds "$pid") s"); done
echo "suite-under-load: ${#hogs[@]} busy loops beside it used ${used[*]} of CPU" >&2
exit "$status"
