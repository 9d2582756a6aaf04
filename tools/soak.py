#!/usr/bin/env python3
"""Soak: run rlaunch jobs many times in a row and count what went wrong.

    python3 tools/soak.py [--true N] [--hello N] [--timeout SECONDS]

Two shapes, one after the other (defaults are issue 15's figures):
  * `rlaunch -n 1 /bin/true`, N times (default 20000): exit 0, no output.
  * `rlaunch --launcher fork --hosts a,b,c -n 6 hello 6` (MPICH, tests/c/hello.c), N times
    (default 2000): exit 0 and every rank's line right (size 6, sum 15).
Each run is bounded (--timeout, default 20 s): past it, it is a hang, and everything it
started is killed. This process is a child subreaper, so anything a run leaves behind
becomes its child: after each run, a child still alive 3 s later is a leftover.
Prints one table; exits 1 if any column is not zero. Builds the release binaries first.
"""

import argparse
import ctypes
import os
import signal
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# The benchmarks' process helpers: the process table, reaping orphans.
sys.path.insert(0, os.path.join(ROOT, "bench"))
import procs  # noqa: E402
PR_SET_CHILD_SUBREAPER = 36


def build():
    subprocess.run(["cargo", "build", "--release", "--workspace"], cwd=ROOT, check=True)
    hello = os.path.join(ROOT, "target", "soak-hello")
    src = os.path.join(ROOT, "tests", "c", "hello.c")
    subprocess.run(["mpicc.mpich", "-O2", "-o", hello, src], check=True)
    return os.path.join(procs.built_dir(ROOT), "rlaunch"), hello


def children():
    """Live pids whose parent is this process (orphans re-parented here included)."""
    me = os.getpid()
    table = procs.process_table()
    return [pid for pid, (ppid, _) in table.items() if ppid == me and not procs.is_zombie(pid)]


def hello_ok(out):
    lines = sorted(out.decode(errors="replace").splitlines())
    want = sorted(f"rank {r} size 6 sum 15 name" for r in range(6))
    return len(lines) == 6 and all(l.startswith(w) for l, w in zip(lines, want))


def soak(name, argv, runs, timeout, check, env):
    tally = {"runs": 0, "hangs": 0, "wrong exit": 0, "bad output": 0, "leftovers": 0}
    started = time.monotonic()
    for i in range(runs):
        tally["runs"] += 1
        p = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, env=env, start_new_session=True)
        try:
            out, err = p.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            tally["hangs"] += 1
            print(f"{name}: run {i + 1} hung (> {timeout} s)", file=sys.stderr)
            os.killpg(p.pid, signal.SIGKILL)
            out, err = p.communicate()
        else:
            if p.returncode != 0:
                tally["wrong exit"] += 1
                print(f"{name}: run {i + 1} exited {p.returncode}: {err[:300]!r}", file=sys.stderr)
            elif not check(out):
                tally["bad output"] += 1
                print(f"{name}: run {i + 1} printed {out[:300]!r}", file=sys.stderr)
        procs.reap_orphans()
        left = children()
        if left:
            deadline = time.monotonic() + 3
            while left and time.monotonic() < deadline:
                time.sleep(0.05)
                procs.reap_orphans()
                left = children()
            if left:
                tally["leftovers"] += 1
                print(f"{name}: run {i + 1} left {left}", file=sys.stderr)
                for pid in left:
                    os.kill(pid, signal.SIGKILL)
        if (i + 1) % 1000 == 0:
            print(f"{name}: {i + 1}/{runs}", file=sys.stderr)
    tally["seconds"] = round(time.monotonic() - started)
    return tally


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--true", type=int, default=20000, metavar="N")
    ap.add_argument("--hello", type=int, default=2000, metavar="N")
    ap.add_argument("--timeout", type=float, default=20.0)
    args = ap.parse_args()
    ctypes.CDLL(None).prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)
    rlaunch, hello = build()
    env = dict(os.environ, HWLOC_COMPONENTS="-pci,-linuxio")
    shapes = [
        ("-n 1 /bin/true", [rlaunch, "-n", "1", "/bin/true"], args.true, lambda out: out == b""),
        ("3 fake hosts, MPICH hello -n 6",
         [rlaunch, "--launcher", "fork", "--hosts", "a,b,c", "-n", "6", hello, "6"],
         args.hello, hello_ok),
    ]
    rows = [(name, soak(name, argv, n, args.timeout, check, env)) for name, argv, n, check in shapes if n]
    cols = ["runs", "hangs", "wrong exit", "bad output", "leftovers", "seconds"]
    print(f"{'shape':<32}" + "".join(f"{c:>12}" for c in cols))
    for name, t in rows:
        print(f"{name:<32}" + "".join(f"{t[c]:>12}" for c in cols))
    bad = any(t[c] for _, t in rows for c in ("hangs", "wrong exit", "bad output", "leftovers"))
    sys.exit(1 if bad else 0)


if __name__ == "__main__":
    main()
