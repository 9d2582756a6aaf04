#!/usr/bin/env python3
"""The hang report's stacks against Open MPI's: how long a timed-out job takes to say where
every rank is and end, and how much it prints.

    python3 bench/stacks.py [--rounds 5] [--ranks 64] [--timeout 10] [--fake-nodes K]
                            [--mpi ompi|mpich] [--no-mpirun]

The job: bench/build/hang-ompi (tests/c/hang.c built with Open MPI and -g; `--mpi mpich`:
with MPICH, and no mpirun), N ranks on this
machine, the last spinning in spin_for_ever, the others in MPI_Barrier (which MPICH and Open
MPI poll: every rank runs), until the timeout; with `--late`, the last never calls MPI_Init
and the others wait for it asleep in MPI_Init's fence.
Commands, interleaved round by round:

- rlaunch --timeout T (its default hang report: fences, process states, stacks merged)
- rlaunch --timeout T --hang-report none (killed at once: the cost of ending the job)
- mpirun.openmpi --timeout T --get-stack-traces (gstack, that is gdb, on every rank, one after
  another; Debian has no gstack, so bench/build/gstack is Fedora's: gdb -batch "thread apply
  all bt" on the pid)
- with --fake-nodes K: rlaunch over K fake nodes (fork), N/K ranks each (mpirun cannot)

With `--bytes`, one more run of rlaunch's last case under `RLAUNCH_LOG=debug`
counts the stacks' bytes sent up the tree: each proxy's merged answer (what is sent) against
the sum of every rank's stack encoded alone, times the hops from its proxy to rlaunch (what
one stack a rank, unmerged, would send).

Each run's time is its wall time less T: what the report and the teardown take. Quoted as
median (min-max) with the lines printed (stderr and stdout, the ranks' `pid` lines left out).
Results go to bench/results/<date>-<commit>-stacks.txt.
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
BUILD = os.path.join(ROOT, "bench", "build")
RESULTS = os.path.join(ROOT, "bench", "results")
RLAUNCH = os.path.join(built_dir(ROOT, "dist"), "rlaunch")
GSTACK = """#!/bin/sh
# Fedora's gstack: every thread's backtrace of a live process, by gdb.
exec gdb --quiet -nx --readnever -p "$1" -batch -ex "thread apply all bt" 2>/dev/null
"""


def build(mpi):
    subprocess.run(["cargo", "build", "-q", "--profile", "dist", "-p", "rlaunch", "-p", "rlaunch-proxy"],
                   cwd=ROOT, check=True)
    os.makedirs(BUILD, exist_ok=True)
    hang = os.path.join(BUILD, f"hang-{mpi}")
    compiler = {"ompi": "mpicc.openmpi", "mpich": "mpicc.mpich"}[mpi]
    subprocess.run([compiler, "-g", "-O1", "-o", hang, os.path.join(ROOT, "tests", "c", "hang.c")], check=True)
    gstack = os.path.join(BUILD, "gstack")
    with open(gstack, "w") as f:
        f.write(GSTACK)
    os.chmod(gstack, 0o755)
    for tool in ["mpirun.openmpi", "gdb"]:
        if not shutil.which(tool):
            sys.exit(f"stacks.py: {tool} is missing (apt-get install openmpi-bin gdb)")
    return hang


def once(argv, timeout, env):
    """Runs argv; returns (seconds past the timeout, lines printed, exit code)."""
    start = time.perf_counter()
    p = subprocess.run(argv, stdin=Stdin.read_fd, capture_output=True, env=env, timeout=timeout + 600)
    seconds = time.perf_counter() - start - timeout
    out = (p.stdout + p.stderr).decode(errors="replace").splitlines()
    lines = [l for l in out if not l.startswith("pid ")]
    sweep_leftovers()
    return seconds, lines, p.returncode


def stack_bytes(argv, timeout, env):
    """Runs argv once with the proxies' debug log; returns (bytes of stacks sent up, merged in
    the tree; bytes one stack a rank would have sent up the same hops)."""
    env = dict(env, RLAUNCH_LOG="debug")
    _, lines, _ = once(argv, timeout, env)
    field = lambda line, name: int(line.split(name + "=")[1].split()[0])
    sent = [field(l, "stack_bytes") for l in lines if "survey answered up" in l]
    alone = [field(l, "one_per_rank_bytes") for l in lines if "merged the ranks' stacks" in l]
    if not sent or not alone:
        sys.exit("stacks.py: the proxies' debug log has no stack sizes:\n" + "\n".join(lines[-20:]))
    # Over fork and within one tree width every proxy is rlaunch's child: one hop each.
    return sum(sent), sum(alone)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--ranks", type=int, default=64)
    ap.add_argument("--timeout", type=int, default=10)
    ap.add_argument("--fake-nodes", type=int, default=0)
    ap.add_argument("--no-mpirun", action="store_true")
    ap.add_argument("--late", action="store_true",
                    help="the last rank never calls MPI_Init: the others wait, asleep, in its fence")
    ap.add_argument("--bytes", action="store_true",
                    help="one more run that counts the stacks' bytes up the tree, merged and not")
    ap.add_argument("--mpi", choices=["ompi", "mpich"], default="ompi",
                    help="the MPI the job is built with (mpirun needs Open MPI's)")
    args = ap.parse_args()
    # Whatever a run leaves behind is reparented here, and swept.
    ctypes.CDLL(None).prctl(36, 1)  # PR_SET_CHILD_SUBREAPER
    Stdin.open()
    hang = build(args.mpi)
    n, t = str(args.ranks), str(args.timeout)
    last = str(args.ranks - 1)
    job = [hang, last, "-1"] if args.late else [hang, "-1", last]
    env = dict(os.environ, PATH=BUILD + ":" + os.environ["PATH"])
    cases = [
        ("rlaunch (stacks)", [RLAUNCH, "--timeout", t, "-n", n] + job, 124),
        ("rlaunch --hang-report none", [RLAUNCH, "--timeout", t, "--hang-report", "none", "-n", n] + job, 124),
    ]
    if args.fake_nodes:
        per = args.ranks // args.fake_nodes
        hosts = ",".join(f"n{i + 1}:{per}" for i in range(args.fake_nodes))
        fake = [RLAUNCH, "--launcher", "fork", "--hosts", hosts, "--timeout", t, "-n", n] + job
        cases.append((f"rlaunch (stacks), {args.fake_nodes} fake nodes", fake, 124))
    if not args.no_mpirun and args.mpi == "ompi":
        mpirun = ["mpirun.openmpi", "--allow-run-as-root", "--oversubscribe", "--timeout", t,
                  "--get-stack-traces", "-n", n] + job
        cases.append(("mpirun.openmpi --get-stack-traces", mpirun, None))
    times = {label: [] for label, _, _ in cases}
    lines = {}
    for r in range(args.rounds + 1):
        for label, argv, code in cases:
            seconds, said, rc = once(argv, args.timeout, env)
            if code is not None and rc != code:
                sys.exit(f"stacks.py: {label} exited {rc}, not {code}:\n" + "\n".join(said[-20:]))
            if r == 0:
                continue  # the warm-up
            times[label].append(seconds)
            lines[label] = len(said)
            log(f"round {r}: {label}: {seconds:.2f} s past the timeout, {len(said)} lines")
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True,
                            text=True).stdout.strip()
    head = [f"# bench/stacks.py {' '.join(sys.argv[1:])}",
            f"# {datetime.datetime.now().isoformat(timespec='seconds')} commit {commit}, "
            f"{os.cpu_count()} CPUs, {args.ranks} ranks, timeout {args.timeout} s, {args.rounds} rounds",
            "| command | past the timeout, median (min-max) | lines printed |", "|---|---|---|"]
    rows = []
    for label, _, _ in cases:
        s = times[label]
        rows.append(f"| {label} | {statistics.median(s):.2f} s ({min(s):.2f}-{max(s):.2f}) | {lines[label]} |")
    if args.bytes:
        label, argv, _ = [c for c in cases if c[0].startswith("rlaunch (stacks)")][-1]
        merged, alone = stack_bytes(argv, args.timeout, env)
        rows += ["", f"Stacks' bytes up the tree ({label}): merged in the tree {merged}, "
                     f"one stack a rank {alone} ({alone / max(merged, 1):.1f}x)"]
    text = "\n".join(head + rows) + "\n"
    print(text)
    os.makedirs(RESULTS, exist_ok=True)
    day = datetime.date.today().isoformat()
    name = f"{day}-{commit}-stacks-{args.ranks}-{args.mpi}" + (f"-{args.fake_nodes}nodes" if args.fake_nodes else "")
    name += "-late" if args.late else ""
    with open(os.path.join(RESULTS, name + ".txt"), "w") as f:
        f.write(text)


if __name__ == "__main__":
    main()
