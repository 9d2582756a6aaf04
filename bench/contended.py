#!/usr/bin/env python3
"""MPI applications on a busy machine: rlaunch against mpirun and Hydra, beside the same load.

    python3 bench/contended.py [--rounds 7] [--hogs 2] [--only CASE...] [--rlaunch PATH]
                               [--before PATH] [--autogroup on|off]

Users share nodes: another job's busy loops compete with the ranks for the CPUs. Busy-polling
MPI ranks suffer most when two of them, or a rank and a busy loop, share a CPU while the
other CPUs run something else: a rank that waits for a neighbour that is not running waits
for the scheduler. This starts --hogs busy loops at normal priority (its own children, killed
by pid when it ends), then runs each case's commands in interleaved rounds (A B C, C A B, ...
after one warm-up each) and prints each command's median wall time (min-max) and the ratio of
medians against rlaunch. Every run's output is checked: the same answer from every launcher.

Cases, 2 ranks each (this machine has 2 CPUs):
  halo-ompi     bench/halo.c (an FDTD-like solver: a stencil and a halo swap every step)
                built with mpicc.openmpi: rlaunch, rlaunch --bind-to none, mpirun.openmpi
  lu-ompi       Debian's ScaLAPACK LU tester (xdlu, Open MPI), twenty 800 x 800 matrices on
                a 1 x 2 grid: rlaunch, rlaunch --bind-to none, mpirun.openmpi
  halo-mpich    bench/halo.c built with mpicc.mpich: rlaunch, rlaunch --bind-to none,
                mpiexec.hydra
and the same rlaunch command with no load beside it (`quiet`), for what the load costs.

The busy loops run in a session of their own, as another user's job does. Where the kernel's
autogroup is on (Debian's and Ubuntu's default), the CPU is shared among sessions before
processes: ranks that are session leaders (Hydra's, rlaunch's) get a share each, ranks in
the launcher's session (mpirun's) one share among them. `--autogroup off` switches it off
for the run (root), which leaves binding as the only difference. `--before PATH` runs another
rlaunch build's plain command in the same rounds (an A/B against an earlier commit).

No environment of the ranks is set by this script (no OMPI_MCA_mpi_yield_when_idle): each
launcher's defaults are what is compared. The table goes to stdout and to
bench/results/<date>-<commit>-contended.txt. Builds the dist binaries unless --rlaunch names
one.
"""

import argparse
import datetime
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "bench"))
import procs  # noqa: E402

BUILD = os.path.join(ROOT, "bench", "build")
MPIRUN = "/usr/bin/mpirun.openmpi"
HYDRA = "/usr/bin/mpiexec.hydra"
XDLU = "/usr/lib/x86_64-linux-gnu/scalapack/openmpi-tests/xdlu"
# Twenty 800 x 800 LUs (block 16) on a 1 x 2 process grid, in the tester's input format
# (its workspace is too small for 1000 x 1000 with the condition tests on: "skipped").
LU_DAT = """'SCALAPACK, LU factorization input file'
'contended.py'
'LU.out'    output file name
6           device out
20          number of problems sizes
%s values of M
%s values of N
1           number of NB's
16          values of NB
1           number of NRHS's
1           values of NRHS
1           number of NBRHS's
1           values of NBRHS
1           number of process grids (ordered pairs of P & Q)
1           values of P
2           values of Q
1.0         threshold
F           (T or F) Test Cond. Est. and Iter. Ref. Routines
""" % (" ".join(["800"] * 20), " ".join(["800"] * 20))

def build_halo(compiler, name):
    out = os.path.join(BUILD, name)
    src = os.path.join(ROOT, "bench", "halo.c")
    os.makedirs(BUILD, exist_ok=True)
    subprocess.run([compiler, "-O2", "-o", out, src, "-lm"], check=True)
    return out


def hog():
    """A busy loop at normal priority, in a session of its own as another user's job would
    be (under the kernel's autogroup the CPU is shared among sessions first): its pid."""
    return subprocess.Popen(["/bin/sh", "-c", "while :; do :; done"], start_new_session=True).pid


def cases(rlaunch, only, before):
    """Each case: its key, its title, what its answer looks like, and its commands, the
    same 2-rank program under rlaunch, rlaunch --bind-to none, and its own MPI's launcher."""
    halo_args = ["20000", "40000"]
    table = [
        ("halo-ompi", "Open MPI FDTD-like halo, 2 ranks", None,
         lambda: [build_halo("mpicc.openmpi", "halo-ompi")] + halo_args,
         ("mpirun", [MPIRUN, "--allow-run-as-root"])),
        ("lu-ompi", "ScaLAPACK xdlu, 20 LUs of 800^2 on 1x2, Open MPI", "lu",
         lambda: [XDLU],
         ("mpirun", [MPIRUN, "--allow-run-as-root"])),
        ("halo-mpich", "MPICH FDTD-like halo, 2 ranks", None,
         lambda: [build_halo("mpicc.mpich", "halo-mpich")] + halo_args,
         ("hydra", [HYDRA])),
    ]
    found = []
    for key, title, kind, program, (theirs, launcher) in table:
        if only and key not in only:
            continue
        prog = ["-n", "2"] + program()
        commands = [
            ("rlaunch", [rlaunch] + prog),
            ("rlaunch --bind-to none", [rlaunch, "--bind-to", "none"] + prog),
            (theirs, launcher + prog),
        ]
        found.append((key, title, kind, commands))
    if before:
        # Another build's plain command beside this one's, in the same rounds (an A/B).
        for _, _, _, commands in found:
            argv = commands[0][1]
            commands.insert(1, ("rlaunch (--before)", [before] + argv[1:]))
    return found


def answer(output, kind):
    """What a run computed: halo's energy line; xdlu's pass/fail summary."""
    lines = output.decode(errors="replace").splitlines()
    if kind == "lu":
        return tuple(l.strip() for l in lines if l.strip().split(" ")[1:2] == ["tests"])
    return tuple(l for l in lines if l.startswith("energy "))


def once(argv, cwd, timeout):
    start = time.perf_counter()
    done = subprocess.run(
        argv, cwd=cwd, stdin=procs.Stdin.read_fd, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        timeout=timeout,
    )
    took = time.perf_counter() - start
    if done.returncode != 0:
        sys.exit(f"contended.py: {argv[:3]} exited {done.returncode}: {done.stderr[-300:]!r}")
    return took, done.stdout


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--hogs", type=int, default=2, help="busy loops beside the jobs")
    ap.add_argument("--only", nargs="+", metavar="CASE", help="halo-ompi lu-ompi halo-mpich")
    ap.add_argument("--rlaunch", help="an rlaunch binary (default: build and use the dist one)")
    ap.add_argument("--before", metavar="PATH",
                    help="another rlaunch binary to run beside this one (an earlier commit's)")
    ap.add_argument("--autogroup", choices=["on", "off"],
                    help="switch the kernel's autogroup for the run (root; restored after)")
    ap.add_argument("--timeout", type=float, default=300.0, help="seconds a run may take")
    args = ap.parse_args()
    for tool in ("mpicc.openmpi", "mpicc.mpich", MPIRUN, HYDRA, XDLU):
        if not shutil.which(tool) and not os.access(tool, os.X_OK):
            sys.exit(f"contended.py: {tool} is missing (./test.sh installs it)")
    rlaunch = args.rlaunch and os.path.abspath(args.rlaunch)
    if not rlaunch:
        subprocess.run(["cargo", "build", "--profile", "dist", "-p", "rlaunch", "-p", "rlaunch-proxy"],
                       cwd=ROOT, check=True)
        rlaunch = os.path.join(procs.built_dir(ROOT, "dist"), "rlaunch")
    procs.Stdin.open()
    knob = "/proc/sys/kernel/sched_autogroup_enabled"
    with open(knob) as f:
        autogroup = f.read().strip()
    if args.autogroup:
        with open(knob, "w") as f:
            f.write("1" if args.autogroup == "on" else "0")
    scratch = tempfile.mkdtemp(prefix="contended-")
    with open(os.path.join(scratch, "LU.dat"), "w") as f:
        f.write(LU_DAT)
    commit = subprocess.run(["git", "rev-parse", "--short=12", "HEAD"], cwd=ROOT,
                            capture_output=True, text=True).stdout.strip()
    lines = [
        f"# contended.py {datetime.datetime.now():%Y-%m-%d %H:%M} commit {commit}, "
        f"{os.cpu_count()} CPUs, {args.hogs} busy loops, {args.rounds} rounds, "
        f"autogroup {args.autogroup or ('on' if autogroup == '1' else 'off')}",
        f"# {os.uname().release}; rlaunch {rlaunch}",
    ]
    for line in lines:
        print(line, flush=True)
    hogs = []
    try:
        for key, title, kind, commands in cases(rlaunch, args.only, args.before and os.path.abspath(args.before)):
            # Without load first: what the job takes on a quiet machine.
            quiet = [once(commands[0][1], scratch, args.timeout)[0] for _ in range(3)]
            hogs = [hog() for _ in range(args.hogs)]
            time.sleep(0.5)
            times = {name: [] for name, _ in commands}
            answers = set()
            for name, argv in commands:
                answers.add(answer(once(argv, scratch, args.timeout)[1], kind))
            for i in range(args.rounds):
                k = i % len(commands)
                for name, argv in commands[k:] + commands[:k]:
                    took, out = once(argv, scratch, args.timeout)
                    times[name].append(took)
                    answers.add(answer(out, kind))
                    procs.log(f"{key} round {i + 1}: {name} {took:.2f} s")
            for pid in hogs:
                os.kill(pid, signal.SIGKILL)
                os.waitpid(pid, 0)
            hogs = []
            if len(answers) != 1 or answers == {()}:
                sys.exit(f"contended.py: {key}: the launchers' answers differ or are missing: {answers}")
            ours = statistics.median(times["rlaunch"])
            rows = [f"{title} (answer: {' / '.join(next(iter(answers)))})"]
            for name, _ in commands:
                t = times[name]
                med = statistics.median(t)
                rows.append(f"  {name:<24} {med:7.2f} s ({min(t):.2f}-{max(t):.2f})  rlaunch/this {ours / med:.2f}")
            rows.append(f"  {'rlaunch, no load':<24} {statistics.median(quiet):7.2f} s "
                        f"({min(quiet):.2f}-{max(quiet):.2f})")
            for row in rows:
                print(row, flush=True)
            lines += rows
    finally:
        for pid in hogs:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
        shutil.rmtree(scratch, ignore_errors=True)
        if args.autogroup:
            with open(knob, "w") as f:
                f.write(autogroup)
    os.makedirs(os.path.join(ROOT, "bench", "results"), exist_ok=True)
    suffix = f"-autogroup-{args.autogroup}" if args.autogroup else ""
    name = f"{datetime.date.today()}-{commit}-contended{suffix}.txt"
    with open(os.path.join(ROOT, "bench", "results", name), "w") as f:
        f.write("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
