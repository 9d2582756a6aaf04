#!/usr/bin/env python3
"""What one hop, one child and one rank of a launch cost, from rlaunch's own report.

    python3 bench/costs.py [--rounds K] [--rlaunch PATH] [--grid]

The first costs issue 43's launch model is built from, measured on fake nodes (`--launcher
fork`), each from the phases every node's record holds on rlaunch's clock (`--report`,
docs/report.md: when each proxy had its launch, when its ranks had started):

- per hop: a chain (`--tree-width 1`) of N nodes, the slope of a node's launch time over its
  depth (least squares): what each level of a tree adds before the next can start;
- per child: a star (`--tree-width` N) of N nodes, the slope of a node's launch time over its
  place among its parent's children: what a parent spends on each child it starts;
- per rank: one node of R ranks of /bin/true, (last rank started - launched) / R.

`--grid` also runs the launch of /bin/true on 16, 64, 256 and 1024 fake nodes at tree widths
2, 8, 32 and 128, wall time and the CPU time of every process (the validation grid for the
model). Medians of K rounds. The table goes to stdout and to
bench/results/<date>-<commit>-costs.txt. Standard library only; the dist build by default.
"""

import argparse
import datetime
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench import BUILT, RESULTS, Source, machine_header  # noqa: E402


def run(rlaunch, args, report):
    """One launch: (wall seconds, CPU seconds of every process, the report)."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    done = subprocess.run([rlaunch, "--report", report, *args], stdin=subprocess.DEVNULL,
                          stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if done.returncode != 0:
        sys.exit(f"costs: {' '.join(args[:6])} ... failed: {done.stderr.strip()[:200]}")
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    with open(report) as f:
        return wall, cpu, json.load(f)


def hosts_file(scratch, n):
    path = os.path.join(scratch, f"hosts-{n}")
    with open(path, "w") as f:
        f.write("".join(f"h{i}\n" for i in range(1, n + 1)))
    return path


def fake(scratch, n, width, ranks=None):
    return ["--launcher", "fork", "--hostfile", hosts_file(scratch, n), "--tree-width", str(width),
            "-n", str(ranks or n), "/bin/true"]


def phase_ms(report, node, phase):
    return (node["phases"][phase] - report["job"]["start_us"]) / 1000


def slope(points):
    """Least-squares slope of (x, y) points."""
    n = len(points)
    mx = sum(x for x, _ in points) / n
    my = sum(y for _, y in points) / n
    sxx = sum((x - mx) ** 2 for x, _ in points)
    return sum((x - mx) * (y - my) for x, y in points) / sxx


def median_fmt(values, unit="ms"):
    return f"{statistics.median(values):.3f} {unit} ({min(values):.3f}-{max(values):.3f})"


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--rlaunch", default=os.path.join(BUILT, "rlaunch"))
    ap.add_argument("--grid", action="store_true", help="also the fake-node grid of sizes and widths")
    args = ap.parse_args()
    if not os.access(args.rlaunch, os.X_OK):
        sys.exit(f"costs: no rlaunch at {args.rlaunch}: cargo build --profile dist --workspace")
    started = datetime.datetime.now(datetime.timezone.utc)
    source = Source.read()
    lines = machine_header(started, source) + [f"rlaunch: {args.rlaunch}", f"rounds:  {args.rounds}", ""]
    with tempfile.TemporaryDirectory(prefix="rlaunch-costs-") as scratch:
        report = os.path.join(scratch, "report.json")
        rows = []
        for n in (8, 16, 32):
            hops = []
            for _ in range(args.rounds):
                _, _, r = run(args.rlaunch, fake(scratch, n, 1), report)
                # Width 1: node i is i + 1 levels below rlaunch.
                hops.append(slope([(nd["node"] + 1, phase_ms(r, nd, "launched")) for nd in r["nodes"]]))
            rows.append(f"per hop, a chain of {n:<4}            {median_fmt(hops)}")
        for n in (16, 32, 64):
            kids = []
            for _ in range(args.rounds):
                _, _, r = run(args.rlaunch, fake(scratch, n, n), report)
                kids.append(slope([(nd["node"], phase_ms(r, nd, "launched")) for nd in r["nodes"]]))
            rows.append(f"per child, a star of {n:<4}           {median_fmt(kids)}")
        for ranks in (64, 256):
            each = []
            for _ in range(args.rounds):
                _, _, r = run(args.rlaunch, fake(scratch, 1, 1, ranks), report)
                nd = r["nodes"][0]
                each.append((phase_ms(r, nd, "ranks_started") - phase_ms(r, nd, "launched")) / ranks)
            rows.append(f"per rank, {ranks:<4} ranks on one node   {median_fmt(each)}")
        lines += ["== costs (medians, min-max)"] + rows
        if args.grid:
            lines += ["", "== the grid: /bin/true on N fake nodes at width W (medians)",
                      f"{'nodes':>6} {'width':>6} {'wall ms':>10} {'CPU ms':>10}"]
            for n in (16, 64, 256, 1024):
                for w in (2, 8, 32, 128):
                    walls, cpus = [], []
                    for _ in range(args.rounds):
                        wall, cpu, _ = run(args.rlaunch, fake(scratch, n, w), report)
                        walls.append(wall * 1000)
                        cpus.append(cpu * 1000)
                    lines.append(f"{n:>6} {w:>6} {statistics.median(walls):>10.1f} {statistics.median(cpus):>10.1f}")
                    print(lines[-1], file=sys.stderr, flush=True)
    text = "\n".join(lines) + "\n"
    sys.stdout.write(text)
    os.makedirs(RESULTS, exist_ok=True)
    name = f"{started:%Y-%m-%d}-{source.short}-costs{'-grid' if args.grid else ''}.txt"
    with open(os.path.join(RESULTS, name), "w") as f:
        f.write(text)


if __name__ == "__main__":
    main()
