#!/usr/bin/env python3
"""Two builds of rlaunch, side by side: did a change make it slower?

    python3 bench/ab.py BEFORE AFTER [--rounds-scale X] [--only CASE...]

BEFORE and AFTER are rlaunch binaries, each with its rlaunch-proxy beside it (a dist build of
two commits: `git worktree add /tmp/before COMMIT` and `cargo build --profile dist --workspace`
there; or two profiles of one commit).
The rank program is AFTER's `rankprog` for both. Every case runs one warm-up of each, then
rounds of BEFORE AFTER, AFTER BEFORE, ... alternately, and prints each one's median wall time
and the median (and quartiles) of the per-round ratios AFTER/BEFORE: absolute times drift
between minutes on a shared 2-core machine, the ratio of neighbouring runs does not. A ratio
whose quartiles straddle 1.00 is noise.

Cases: launch (`-n 1`, `-n 256`, 1024 fake nodes of `/bin/true`) and stdio (output through a
pipe into `cat`: 2 ranks x 256 MiB, the spliced path; 16 ranks x 16 MiB; 8 ranks x 16 MiB with
`-l`, the copying path). `--only memory` (not among the defaults) samples peak RSS instead:
rlaunch's and the median proxy's, 256 fake nodes whose ranks wait on a FIFO, 5 runs of each
build, medians. Standard library only.
"""

import argparse
import os
import shlex
import statistics
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import procs  # noqa: E402

q = shlex.quote


def cases(rankprog):
    hosts = ",".join(f"h{i}" for i in range(1, 1025))

    def piped(args):
        # pipefail: a failing rlaunch fails the case, not only a failing cat.
        return lambda exe: ["/bin/bash", "-o", "pipefail", "-c", f"{q(exe)} {args} | cat > /dev/null"]

    return [
        ("n1", "-n 1 /bin/true", lambda exe: [exe, "-n", "1", "/bin/true"], 200),
        ("n256", "-n 256 /bin/true", lambda exe: [exe, "-n", "256", "/bin/true"], 40),
        (
            "fake1024",
            "1024 fake nodes",
            lambda exe: [exe, "--launcher", "fork", "--hosts", hosts, "-n", "1024", "/bin/true"],
            12,
        ),
        ("splice", "2 x 256 MiB | cat", piped(f"-n 2 {q(rankprog)} flood {256 << 20}"), 15),
        ("many", "16 x 16 MiB | cat", piped(f"-n 16 {q(rankprog)} flood {16 << 20}"), 15),
        ("prefix", "-l 8 x 16 MiB | cat", piped(f"-l -n 8 {q(rankprog)} flood {16 << 20}"), 15),
    ]


def once(command):
    start = time.perf_counter()
    done = subprocess.run(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    if done.returncode != 0:
        sys.exit(f"ab.py: {command[:4]} exited {done.returncode}: {done.stderr[-300:]!r}")
    return time.perf_counter() - start


def memory(before, after, rounds=5):
    """Peak RSS (KiB) of rlaunch and of its median proxy, 256 fake nodes, each build."""
    hosts = ",".join(f"h{i}" for i in range(1, 257))
    blocker = ["/bin/sh", "-c", 'exec 3<"$0"; echo ready; exec cat <&3', "{FIFO}"]
    procs.Stdin.open()
    with tempfile.TemporaryDirectory() as scratch:
        peaks = {before: ([], []), after: ([], [])}
        for i in range(rounds):
            for exe in (before, after) if i % 2 == 0 else (after, before):
                argv = [exe, "--launcher", "fork", "--hosts", hosts, "-n", "256"] + blocker
                got = procs.footprint(argv, 256, ("rlaunch-proxy",), scratch)
                if got.failure:
                    sys.exit(f"ab.py: memory: {exe}: {got.failure}")
                peaks[exe][0].append(got.launcher)
                peaks[exe][1].append(statistics.median(got.proxies))
    for what, i in (("rlaunch", 0), ("proxy (median)", 1)):
        b, a = (statistics.median(peaks[exe][i]) for exe in (before, after))
        print(f"peak RSS {what:<15} before {b / 1024:6.2f} MiB  after {a / 1024:6.2f} MiB  "
              f"after/before {a / b:.3f} (256 fake nodes, medians of {rounds})", flush=True)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("before")
    ap.add_argument("after")
    ap.add_argument("--rounds-scale", type=float, default=1.0, help="multiply every case's rounds")
    ap.add_argument("--only", nargs="+", metavar="CASE", help="n1 n256 fake1024 splice many prefix memory")
    args = ap.parse_args()
    before, after = os.path.abspath(args.before), os.path.abspath(args.after)
    for exe in (before, after):
        proxy = os.path.join(os.path.dirname(exe), "rlaunch-proxy")
        if not (os.access(exe, os.X_OK) and os.access(proxy, os.X_OK)):
            sys.exit(f"ab.py: {exe} and an rlaunch-proxy beside it must be executables")
    rankprog = os.path.join(os.path.dirname(after), "rankprog")
    if not os.access(rankprog, os.X_OK):
        sys.exit(f"ab.py: no {rankprog}: build rlaunch-tests too (cargo build --profile dist --workspace)")
    known = [key for key, *_ in cases(rankprog)] + ["memory"]
    unknown = [key for key in args.only or [] if key not in known]
    if unknown:
        sys.exit(f"ab.py: --only {' '.join(unknown)}: the cases are {' '.join(known)}")
    for key, name, command, rounds in cases(rankprog):
        if args.only and key not in args.only:
            continue
        rounds = max(4, round(rounds * args.rounds_scale))
        once(command(before))
        once(command(after))
        times = {before: [], after: []}
        ratios = []
        for i in range(rounds):
            for exe in (before, after) if i % 2 == 0 else (after, before):
                times[exe].append(once(command(exe)))
            ratios.append(times[after][-1] / times[before][-1])
        low, _, high = statistics.quantiles(ratios, n=4)
        b, a = (statistics.median(times[exe]) * 1e3 for exe in (before, after))
        print(
            f"{name:<20} before {b:8.1f} ms  after {a:8.1f} ms  after/before "
            f"{statistics.median(ratios):.3f} (quartiles {low:.2f}/{high:.2f}, {rounds} rounds)",
            flush=True,
        )
    if args.only and "memory" in args.only:
        memory(before, after)


if __name__ == "__main__":
    main()
