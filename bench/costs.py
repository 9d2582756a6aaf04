#!/usr/bin/env python3
"""What one hop, one child and one rank of a launch cost, from rlaunch's own report.

    python3 bench/costs.py [--rounds K] [--rlaunch PATH] [--grid] [--ssh] [--slurm]

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
model). `--ssh` brings up 16 network-namespace hosts with sshd (tests/cluster/cluster.sh)
and measures one ssh alone, an exec'd proxy (a star of 4), and launches of the 16 hosts at
widths 2, 4, 16 with every link's round trip lengthened by 0, 0.1 and 1 ms (bench/latency.py:
this kernel has no netem). `--slurm` brings up the tests' Slurm with 16 nodes
(tests/cluster/slurm.sh) and, inside one allocation of them all (`salloc -N16`), measures
`srun true` alone on 4, 8 and 16 nodes and rlaunch's srun-started trees of those nodes at
widths 2 and 16, with the machine's CPU (slurmd's and slurmstepd's, which start the proxies).
Each round runs every shape once. Medians of K rounds. The table goes to stdout and to
bench/results/<date>-<commit>-costs.txt; every launch's raw figures (wall, CPU, and each
process's own CPU, memory, descriptors and phases from the report) to the same name with
.json, which bench/model.py fits its costs to and checks its predictions against. Standard
library only; the dist build by default.
"""

import argparse
import ctypes
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
from bench import BUILT, RESULTS, SLURM_HEAD, Source, SlurmCluster, machine_header  # noqa: E402


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


def usage_ms(used):
    return (used["user_s"] + used["system_s"]) * 1000


def raw(kind, n, width, ranks, wall, cpu, report):
    """What bench/model.py fits and checks: one launch's figures, each process's own."""
    job = report["job"]
    start = job["start_us"]
    return {
        "kind": kind, "nodes": n, "width": width, "ranks": ranks,
        "wall_ms": wall * 1000, "cpu_ms": cpu * 1000, "report_ms": (job["end_us"] - start) / 1000,
        "rlaunch": {"cpu_ms": usage_ms(job["rlaunch_usage"]), "maxrss_kib": job["rlaunch_usage"]["maxrss_kib"],
                    "fds": job["rlaunch_usage"]["fds_running"]},
        "nodes_seen": [
            {"node": nd["node"], "cpu_ms": usage_ms(nd["proxy_usage"]), "maxrss_kib": nd["proxy_usage"]["maxrss_kib"],
             "fds": nd["proxy_usage"]["fds_running"],
             "phases_ms": {k: (v - start) / 1000 for k, v in nd["phases"].items()}}
            for nd in report["nodes"]
        ],
    }


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


CLUSTER_SH = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "tests", "cluster",
                          "cluster.sh")
SSH_HOSTS = 16
SSH_DELAYS = (0, 50, 500)  # one way, microseconds: round trips of +0, +0.1 and +1 ms
SSH_WIDTHS = (2, 4, 16)
SSH_RTT_PROBE = 20000  # one way: a delay far above the noise, to count an ssh's round trips


def machine_cpu_ms():
    """Busy time of all CPUs so far (/proc/stat, ticks of 10 ms): the sshds' too."""
    with open("/proc/stat") as f:
        fields = [int(x) for x in f.readline().split()[1:]]
    user, nice, system, _idle, _iowait, irq, softirq = fields[:7]
    return (user + nice + system + irq + softirq) * 1000 / os.sysconf("SC_CLK_TCK")


def ssh_section(args, scratch, runs):
    """The 16 netns ssh hosts: one ssh alone (its wall, its client's and the machine's CPU, at
    no delay and at a long one to count its round trips), a star of 4 to price an exec'd
    proxy, then the validation launches: widths 2, 4, 16 at one-way delays of 0, 50, 500 us."""
    import latency

    cluster = os.path.join(scratch, "cluster")
    subprocess.run(["bash", CLUSTER_SH, "up", cluster, str(SSH_HOSTS)], check=True,
                   stdout=subprocess.DEVNULL)
    try:
        latency.build_delay()
        configs = {us: latency.delayed_ssh_config(cluster, us) for us in SSH_DELAYS + (SSH_RTT_PROBE,)}
        hosts = os.path.join(scratch, "ssh-hosts")
        with open(hosts, "w") as f:
            f.write("".join(f"n{i}\n" for i in range(1, SSH_HOSTS + 1)))
        report = os.path.join(scratch, "ssh-report.json")
        for _ in range(args.rounds):
            for us in (0, SSH_RTT_PROBE):
                argv = latency.launcher_exec(configs[us]).split() + ["n1", "true"]
                before, machine, start = resource.getrusage(resource.RUSAGE_CHILDREN), machine_cpu_ms(), time.perf_counter()
                subprocess.run(argv, check=True, stdin=subprocess.DEVNULL)
                wall = time.perf_counter() - start
                after = resource.getrusage(resource.RUSAGE_CHILDREN)
                client = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
                runs.append({"kind": "ssh-true", "one_way_us": us, "wall_ms": wall * 1000,
                             "client_cpu_ms": client * 1000, "machine_cpu_ms": machine_cpu_ms() - machine})
            shapes = [("ssh-star", 4, 4, 0)] + [("ssh", SSH_HOSTS, w, us) for us in SSH_DELAYS for w in SSH_WIDTHS]
            for kind, n, w, us in shapes:
                machine = machine_cpu_ms()
                argv = ["--launcher", "ssh", "--launcher-exec", latency.launcher_exec(configs[us]),
                        "--hostfile", hosts, "--tree-width", str(w), "-n", str(n), "/bin/true"]
                wall, cpu, r = run(args.rlaunch, argv, report)
                runs.append({**raw(kind, n, w, n, wall, cpu, r), "one_way_us": us,
                             "machine_cpu_ms": machine_cpu_ms() - machine})
                print(f"{kind} {n} width {w} delay {us} us: {wall * 1000:.0f} ms", file=sys.stderr, flush=True)
    finally:
        subprocess.run(["bash", CLUSTER_SH, "down", cluster], stdout=subprocess.DEVNULL)


SLURM_NODES = 16
SLURM_SIZES = (4, 8, 16)
SLURM_WIDTHS = (2, 16)
PR_SET_CHILD_SUBREAPER, PR_GET_CHILD_SUBREAPER = 36, 37


def slurm_section(args, scratch, runs):
    """The tests' Slurm with 16 nodes, measured from inside one allocation of them all (this
    script again, `--inside-slurm`): srun and rlaunch need the allocation's environment, and
    one allocation keeps slurmctld's job start out of every launch."""
    libc = ctypes.CDLL(None, use_errno=True)
    was = ctypes.c_int(0)
    libc.prctl(PR_GET_CHILD_SUBREAPER, ctypes.byref(was), 0, 0, 0)
    spec = os.path.join(scratch, "slurm-spec.json")
    result = os.path.join(scratch, "slurm-runs.json")
    with open(spec, "w") as f:
        json.dump({"rlaunch": args.rlaunch, "rounds": args.rounds, "result": result}, f)
    with SlurmCluster(SLURM_NODES):
        # SlurmCluster leaves this process a subreaper (bench.py's harness is one); costs.py
        # was not, and should not collect the orphans of whatever it runs next.
        libc.prctl(PR_SET_CHILD_SUBREAPER, was.value, 0, 0, 0)
        inner = ["salloc", "-Q", f"-N{SLURM_NODES}", f"-n{SLURM_NODES}",
                 sys.executable, os.path.abspath(__file__), "--inside-slurm", spec]
        limit = 120 + args.rounds * 120
        try:
            done = subprocess.run(inner, stdin=subprocess.DEVNULL, timeout=limit)
        except subprocess.TimeoutExpired:
            sys.exit(f"costs: the allocation's run did not end within {limit} s")
        if done.returncode != 0 or not os.path.exists(result):
            sys.exit(f"costs: the run inside the allocation failed (salloc exited {done.returncode})")
    with open(result) as f:
        runs.extend(json.load(f))


def inside_slurm(spec_path):
    """In the allocation: srun alone, then rlaunch (whose one srun starts every proxy), on the
    allocation's first N nodes; every launch's figures as JSON to the spec's result."""
    with open(spec_path) as f:
        spec = json.load(f)
    rlaunch, runs = spec["rlaunch"], []
    report = os.path.join(os.path.dirname(spec_path), "slurm-report.json")
    for _ in range(spec["rounds"]):
        for n in SLURM_SIZES:
            # The step shape rlaunch asks srun for (job/dial.rs), with nothing to run.
            argv = ["srun", "-N", str(n), "-n", str(n), "--ntasks-per-node=1", "--kill-on-bad-exit=0",
                    "--input=none", "--mpi=none", "--cpu-bind=none", "true"]
            before, machine, start = resource.getrusage(resource.RUSAGE_CHILDREN), machine_cpu_ms(), time.perf_counter()
            done = subprocess.run(argv, stdin=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
            wall = time.perf_counter() - start
            after = resource.getrusage(resource.RUSAGE_CHILDREN)
            if done.returncode != 0:
                sys.exit(f"costs: {' '.join(argv)} failed: {done.stderr.strip()[:200]}")
            client = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
            runs.append({"kind": "srun-true", "nodes": n, "wall_ms": wall * 1000,
                         "client_cpu_ms": client * 1000, "machine_cpu_ms": machine_cpu_ms() - machine})
            print(f"srun-true {n}: {wall * 1000:.0f} ms", file=sys.stderr, flush=True)
            for w in SLURM_WIDTHS:
                machine = machine_cpu_ms()
                argv = ["--bind-address", SLURM_HEAD, "--ppn", "1", "-n", str(n), "--tree-width", str(w), "/bin/true"]
                wall, cpu, r = run(rlaunch, argv, report)
                runs.append({**raw("srun", n, w, n, wall, cpu, r), "machine_cpu_ms": machine_cpu_ms() - machine})
                print(f"srun {n} width {w}: {wall * 1000:.0f} ms", file=sys.stderr, flush=True)
    with open(spec["result"] + ".tmp", "w") as f:
        json.dump(runs, f)
    os.rename(spec["result"] + ".tmp", spec["result"])


def slurm_rows(runs):
    """Medians of the Slurm launches: wall, the machine's CPU (slurmd's and slurmstepd's
    too), rlaunch's own, and each node's hello - bootstrap: from srun's start for rlaunch's
    own children (the first W nodes), from its parent's redirect for the others."""
    rows = ["", "== inside Slurm: /bin/true on N of 16 nodes, one allocation (medians)",
            f"{'what':<10} {'nodes':>6} {'width':>6} {'wall ms':>10} {'machine CPU':>12} {'rlaunch CPU':>12} "
            f"{'hello ms':>9} {'top hello':>10}"]
    for n in SLURM_SIZES:
        mine = [x for x in runs if x["kind"] == "srun-true" and x["nodes"] == n]
        rows.append(f"{'srun true':<10} {n:>6} {'':>6} {statistics.median(x['wall_ms'] for x in mine):>10.1f} "
                    f"{statistics.median(x['machine_cpu_ms'] for x in mine):>12.0f}")
        for w in SLURM_WIDTHS:
            mine = [x for x in runs if x["kind"] == "srun" and x["nodes"] == n and x["width"] == w]
            hello = [(nd["node"] < w, nd["phases_ms"]["hello"] - nd["phases_ms"]["bootstrap"])
                     for x in mine for nd in x["nodes_seen"]]
            rows.append(f"{'rlaunch':<10} {n:>6} {w:>6} {statistics.median(x['wall_ms'] for x in mine):>10.1f} "
                        f"{statistics.median(x['machine_cpu_ms'] for x in mine):>12.0f} "
                        f"{statistics.median(x['rlaunch']['cpu_ms'] for x in mine):>12.1f} "
                        f"{statistics.median(h for _, h in hello):>9.1f} "
                        f"{statistics.median(h for top, h in hello if top):>10.1f}")
    rows.append("hello ms: each node's hello - bootstrap; top hello: only rlaunch's own children's (srun to hello)")
    return rows


CALIBRATION = [("star", n, n, n) for n in (1, 2, 4, 8)] + [("tree", 32, w, 32) for w in (2, 4)] + [
    ("tree", 64, 8, 64), ("tree", 128, 4, 128), ("star", 128, 128, 128), ("ranks", 1, 1, 16)]
GRID = [(n, w) for n in (16, 64, 256, 1024) for w in (2, 8, 32, 128)]


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--rlaunch", default=os.path.join(BUILT, "rlaunch"))
    ap.add_argument("--grid", action="store_true", help="also the fake-node grid of sizes and widths")
    ap.add_argument("--ssh", action="store_true", help="also 16 netns ssh hosts (root; tests/cluster/cluster.sh)")
    ap.add_argument("--slurm", action="store_true", help="also 16 nodes of the tests' Slurm (root; tests/cluster/slurm.sh)")
    ap.add_argument("--inside-slurm", metavar="SPEC", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.inside_slurm:
        inside_slurm(args.inside_slurm)
        return
    if not os.access(args.rlaunch, os.X_OK):
        sys.exit(f"costs: no rlaunch at {args.rlaunch}: cargo build --profile dist --workspace")
    started = datetime.datetime.now(datetime.timezone.utc)
    source = Source.read()
    lines = machine_header(started, source) + [f"rlaunch: {args.rlaunch}", f"rounds:  {args.rounds}", ""]
    runs = []  # every launch's raw figures, for bench/model.py

    with tempfile.TemporaryDirectory(prefix="rlaunch-costs-") as scratch:
        report = os.path.join(scratch, "report.json")

        def launch(kind, n, width, ranks):
            wall, cpu, r = run(args.rlaunch, fake(scratch, n, width, ranks), report)
            runs.append(raw(kind, n, width, ranks, wall, cpu, r))
            return r

        # Rounds outermost: each round runs every shape once, so that a slow spell of the
        # machine spreads over the shapes instead of spoiling one shape's every round.
        hops, kids, each = {}, {}, {}
        grid = {}
        for _ in range(args.rounds):
            for n in (8, 16, 32):
                r = launch("chain", n, 1, n)
                # Width 1: node i is i + 1 levels below rlaunch.
                hops.setdefault(n, []).append(
                    slope([(nd["node"] + 1, phase_ms(r, nd, "launched")) for nd in r["nodes"]]))
            for n in (16, 32, 64):
                r = launch("star", n, n, n)
                kids.setdefault(n, []).append(
                    slope([(nd["node"], phase_ms(r, nd, "launched")) for nd in r["nodes"]]))
            for ranks in (64, 256):
                r = launch("ranks", 1, 1, ranks)
                nd = r["nodes"][0]
                each.setdefault(ranks, []).append(
                    (phase_ms(r, nd, "ranks_started") - phase_ms(r, nd, "launched")) / ranks)
            # More small shapes for the model's fit: stars, trees with interior proxies, ranks.
            for kind, n, width, ranks in CALIBRATION:
                launch(kind, n, width, ranks)
            if args.grid:
                for n, w in GRID:
                    launch("grid", n, w, n)
                    grid.setdefault((n, w), []).append((runs[-1]["wall_ms"], runs[-1]["cpu_ms"]))
        if args.ssh:
            ssh_section(args, scratch, runs)
        if args.slurm:
            slurm_section(args, scratch, runs)
        rows = [f"per hop, a chain of {n:<4}            {median_fmt(v)}" for n, v in hops.items()]
        rows += [f"per child, a star of {n:<4}           {median_fmt(v)}" for n, v in kids.items()]
        rows += [f"per rank, {n:<4} ranks on one node   {median_fmt(v)}" for n, v in each.items()]
        lines += ["== costs (medians, min-max)"] + rows
        if args.grid:
            lines += ["", "== the grid: /bin/true on N fake nodes at width W (medians)",
                      f"{'nodes':>6} {'width':>6} {'wall ms':>10} {'CPU ms':>10}"]
            for (n, w), v in grid.items():
                walls, cpus = [x for x, _ in v], [y for _, y in v]
                lines.append(f"{n:>6} {w:>6} {statistics.median(walls):>10.1f} {statistics.median(cpus):>10.1f}")
        if args.slurm:
            lines += slurm_rows(runs)
    text = "\n".join(lines) + "\n"
    sys.stdout.write(text)
    os.makedirs(RESULTS, exist_ok=True)
    flags = "".join(f"-{f}" for f in ("grid", "ssh", "slurm") if getattr(args, f))
    name = f"{started:%Y-%m-%d}-{source.short}-costs{flags}"
    with open(os.path.join(RESULTS, name + ".txt"), "w") as f:
        f.write(text)
    # The raw figures bench/model.py reads (--costs).
    with open(os.path.join(RESULTS, name + ".json"), "w") as f:
        json.dump({"header": lines[:6], "rounds": args.rounds, "runs": runs}, f, separators=(",", ":"))
        f.write("\n")


if __name__ == "__main__":
    main()
