#!/usr/bin/env python3
"""How fast a failed job runs again: from a rank's death to every rank of the restarted job
running, against a cold launch of the same job, and against torchrun's restart of the same
worker group.

    python3 bench/restart.py [--rounds 5] [--ranks 64] [--fake-nodes 16]

The job (bash, timestamps from $EPOCHREALTIME, no process of its own): every rank prints
`start ATTEMPT RANK TIME`; in the first attempt rank 1 waits 1 s, prints `death TIME` and
exits 1, the others wait to be torn down; in the second every rank exits 0. Per run:

- cold launch: the last rank's start in the first attempt, from just before the launcher is
  started;
- restart: the last rank's start in the second attempt, from rank 1's death.

Cases, interleaved round by round:

- rlaunch --max-restarts 1, N ranks on this machine (one proxy), and over K fake nodes
  (`--launcher fork`, N/K ranks each: a tree of K proxies, all new for the new attempt);
- torchrun --no_python --nproc_per_node N --max_restarts 1 --standalone, as users run it
  --redirects 1 --tee 1 (without which Debian 12's crashes on Python 3.11), as users run it
  (its agent looks at its workers every --monitor_interval, 5 s by default), and with
  --monitor_interval 0.1, its best.

Quoted as medians (min-max) and as ratios of medians. Results go to
bench/results/<date>-<commit>-restart.txt.
"""

import argparse
import ctypes
import datetime
import os
import shutil
import statistics
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from procs import Stdin, built_dir, log, sweep_leftovers  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RESULTS = os.path.join(ROOT, "bench", "results")
RLAUNCH = os.path.join(built_dir(ROOT, "dist"), "rlaunch")
JOB = (
    'echo start $TORCHELASTIC_RESTART_COUNT $RANK $EPOCHREALTIME; '
    'if [ $TORCHELASTIC_RESTART_COUNT = 0 ]; then '
    '  if [ $RANK = 1 ]; then sleep 1; echo death $EPOCHREALTIME; exit 1; fi; '
    '  exec sleep 60; '
    'fi'
)


def once(argv, ranks):
    """Runs argv once; returns (cold launch s, restart s)."""
    began = time.time()
    p = subprocess.run(argv, stdin=Stdin.read_fd, capture_output=True, timeout=300)
    sweep_leftovers()
    out = p.stdout.decode(errors="replace").splitlines()
    starts = {0: [], 1: []}
    death = None
    for line in out:
        # torchrun's --tee prefixes each line with `[default3]:`.
        if line.startswith("[default") and "]:" in line:
            line = line.split("]:", 1)[1]
        words = line.split()
        if words[:1] == ["start"] and len(words) == 4:
            starts[int(words[1])].append(float(words[3]))
        elif words[:1] == ["death"]:
            death = float(words[1])
    if p.returncode != 0 or death is None or any(len(s) != ranks for s in starts.values()):
        err = p.stderr.decode(errors="replace")
        sys.exit(f"restart.py: {argv[0]} exited {p.returncode}, starts "
                 f"{[len(s) for s in starts.values()]} of {ranks}:\n{err[-2000:]}")
    return max(starts[0]) - began, max(starts[1]) - death


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--ranks", type=int, default=64)
    ap.add_argument("--fake-nodes", type=int, default=16)
    args = ap.parse_args()
    ctypes.CDLL(None).prctl(36, 1)  # PR_SET_CHILD_SUBREAPER: leftovers are swept
    Stdin.open()
    subprocess.run(["cargo", "build", "-q", "--profile", "dist", "-p", "rlaunch", "-p", "rlaunch-proxy"],
                   cwd=ROOT, check=True)
    if not shutil.which("torchrun"):
        sys.exit("restart.py: torchrun is missing (apt-get install python3-torch)")
    n, k = args.ranks, args.fake_nodes
    job = ["bash", "-c", JOB]
    hosts = ",".join(f"n{i + 1}:{n // k}" for i in range(k))
    # --redirects 1 --tee 1: Debian 12's torchrun crashes on its Python 3.11 without (bench.py).
    torchrun = ["torchrun", "--redirects", "1", "--tee", "1", "--no_python", "--standalone",
                "--nproc_per_node", str(n), "--max_restarts", "1"]
    cases = [
        ("rlaunch, 1 node", [RLAUNCH, "-n", str(n), "--max-restarts", "1"] + job),
        (f"rlaunch, {k} fake nodes", [RLAUNCH, "--launcher", "fork", "--hosts", hosts, "-n", str(n),
                                      "--max-restarts", "1"] + job),
        ("torchrun", torchrun + job),
        ("torchrun --monitor_interval 0.1", torchrun[:1] + ["--monitor_interval", "0.1"] + torchrun[1:] + job),
    ]
    cold = {label: [] for label, _ in cases}
    again = {label: [] for label, _ in cases}
    for r in range(args.rounds + 1):
        for label, argv in cases:
            c, a = once(argv, n)
            if r == 0:
                continue  # the warm-up
            cold[label].append(c)
            again[label].append(a)
            log(f"round {r} {label}: cold {c * 1e3:.0f} ms, restart {a * 1e3:.0f} ms")

    def quote(xs):
        return f"{statistics.median(xs) * 1e3:.0f} ms ({min(xs) * 1e3:.0f}-{max(xs) * 1e3:.0f})"

    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True,
                            text=True).stdout.strip()
    lines = [f"restart.py --rounds {args.rounds} --ranks {n} --fake-nodes {k} at {commit}, "
             f"{datetime.date.today()}, {os.cpu_count()} CPUs",
             f"{'case':36} {'cold launch':>22} {'death to all running':>22} {'restart/cold':>12}"]
    for label, _ in cases:
        ratio = statistics.median(again[label]) / statistics.median(cold[label])
        lines.append(f"{label:36} {quote(cold[label]):>22} {quote(again[label]):>22} {ratio:>12.2f}")
    base = statistics.median(again[f"rlaunch, {k} fake nodes"])
    for label in ("torchrun", "torchrun --monitor_interval 0.1"):
        lines.append(f"rlaunch over {k} fake nodes / {label}, restart: "
                     f"{base / statistics.median(again[label]):.3f}")
    text = "\n".join(lines) + "\n"
    print(text, end="")
    os.makedirs(RESULTS, exist_ok=True)
    path = os.path.join(RESULTS, f"{datetime.date.today()}-{commit}-restart.txt")
    with open(path, "w") as f:
        f.write(text)
    log(f"written {path}")


if __name__ == "__main__":
    main()
