#!/usr/bin/env python3
"""Benchmark harness: rlaunch against mpiexec.hydra and against the physical floor.

    python3 bench/bench.py [--quick] [--only SECTION...] [--pairs K]

Sections (see bench/README.md): launch, mpi, openmpi, stdio, fakehosts, memory, slurm, record,
frameworks.

Every timed case runs one warm-up of each command, then K rounds (A B [C] A B [C] ...). Each
command's wall time is quoted as median (min-max); rlaunch against each other command as the
median (min-max) of the per-round ratios rlaunch/other, since absolute times drift by tens of
percent between minutes on a shared machine while ratios of neighbouring runs do not.

Every command gets the same stdin: the read end of a pipe whose write end this harness holds
open until it exits (Hydra dies of SIGPIPE with a stdin at EOF). MPIR_CVAR_NOLOCAL=1 and
HWLOC_COMPONENTS=-pci,-linuxio are set for every command alike.

The harness makes itself a child subreaper: whatever a run leaves behind is reparented here,
reported as a leftover, and killed, and nothing it started outlives it (procs.py).
"""

import argparse
import contextlib
import ctypes
import datetime
import json
import os
import platform
import shlex
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field

from procs import (
    Command,
    Stdin,
    Watch,
    footprint,
    kill_all_descendants,
    log,
    reap_orphans,
    built_dir,
    run,
)

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BENCH = os.path.join(ROOT, "bench")
BUILD = os.path.join(BENCH, "build")
RESULTS = os.path.join(BENCH, "results")


# The packaging build, as `make install` installs it.
BUILT = built_dir(ROOT, "dist")
RLAUNCH = os.path.join(BUILT, "rlaunch")
RLAUNCH_PROXY = os.path.join(BUILT, "rlaunch-proxy")
HYDRA = "mpiexec.hydra"
FLOOR = os.path.join(BUILD, "floor")
LINES = os.path.join(BUILD, "lines")
RELAY = os.path.join(BUILD, "relay")
MPI_HELLO = os.path.join(BUILD, "mpi_hello")
OMPI_HELLO = os.path.join(BUILD, "ompi_hello")
ALLGATHER = os.path.join(BUILD, "allgather")

SECTIONS = ["launch", "mpi", "openmpi", "stdio", "fakehosts", "memory", "slurm", "record", "frameworks"]
MPIRUN = "mpirun.openmpi"
TOOLS = ["cargo", "cc", "mpicc.mpich", HYDRA, "hydra_pmi_proxy", "mpicc.openmpi", MPIRUN, "wc", "sh", "cat", "git"]
# OMPI_MCA_odls_base_max_threads=0: Open MPI 4.1's mpirun hangs after 32+ local ranks exit
# without it (notes/bench.md); it changes nothing else, and nothing for rlaunch.
MPI_ENV = {
    "MPIR_CVAR_NOLOCAL": "1",
    "HWLOC_COMPONENTS": "-pci,-linuxio",
    "OMPI_MCA_odls_base_max_threads": "0",
}
PR_SET_CHILD_SUBREAPER = 36
MIB = 1 << 20
GIB = 1 << 30


def fail(msg):
    print(f"bench: error: {msg}", file=sys.stderr)
    sys.exit(1)


# ---------------------------------------------------------------------------------------------
# Timed cases.


@dataclass
class Case:
    """A piece of work done by rlaunch (commands[0]) and by one or more other commands.

    `targets` maps another command's label to the largest acceptable median ratio rlaunch/it.
    `fastest` maps a label of its own to the labels of several ways to do the same work: its
    time in each round is the fastest of theirs in that round (a floor that no one way is
    always the fastest at, from one machine to another).
    """

    section: str
    name: str
    commands: list
    targets: dict = field(default_factory=dict)
    fastest: dict = field(default_factory=dict)
    # Also compare the CPU time of everything each command started (`cpu` rows): targets for
    # rlaunch's CPU / the other's, by label (empty: shown, no target).
    cpu_targets: dict = None


@dataclass
class Measured:
    """A case's results: per command label, its times (None for a failed round) and failures;
    how many processes outlived their run; warnings about interference while it ran."""

    case: Case
    times: dict
    failures: dict
    leftovers: int = 0
    notes: list = field(default_factory=list)
    cpu: dict = field(default_factory=dict)


def measure(case, pairs, scratch):
    log(f"{case.section}: {case.name}")
    times = {c.label: [] for c in case.commands}
    cpu = {c.label: [] for c in case.commands}
    failures = {c.label: [] for c in case.commands}
    leftovers = 0
    active = []
    watch = Watch([RLAUNCH, RLAUNCH_PROXY])
    for cmd in case.commands:  # warm-up; a command that cannot run at all is dropped
        r = run(cmd, scratch)
        leftovers += r.leftovers
        if r.failure:
            log(f"  {cmd.label}: warm-up failed: {r.failure}")
            failures[cmd.label].append(r.failure)
        else:
            active.append(cmd)
    for i in range(pairs if case.commands[0] in active else 0):
        round_times = []
        for cmd in active:
            r = run(cmd, scratch)
            leftovers += r.leftovers
            if r.failure:
                failures[cmd.label].append(r.failure)
            times[cmd.label].append(r.seconds)
            cpu[cmd.label].append(r.cpu)
            round_times.append(f"{cmd.label} {fmt_ms(r.seconds)}")
        log(f"  round {i + 1}/{pairs}: " + ", ".join(round_times))
    notes = watch.notes()
    for note in notes:
        log(f"  warning: {note}")
    for label, ways in case.fastest.items():
        rounds = zip(*(times[way] for way in ways if times[way]))
        times[label] = [min((t for t in r if t is not None), default=None) for r in rounds]
        failures[label] = []
    return Measured(case, times, failures, leftovers, notes, cpu)


def fmt_ms(seconds):
    if seconds is None:
        return "failed"
    ms = seconds * 1000
    return f"{ms:.0f}" if ms >= 100 else f"{ms:.1f}" if ms >= 10 else f"{ms:.2f}"


def spread(values, fmt):
    values = [v for v in values if v is not None]
    if not values:
        return "-"
    return f"{fmt(statistics.median(values))} ({fmt(min(values))}-{fmt(max(values))})"


def fmt_ratio(r):
    return f"{r:.2f}"


TIME_HEADER = (
    f"{'case':<34} {'rlaunch ms':<22} {'vs':<14} {'other ms':<22} {'rlaunch/other':<20} target"
)


def ratio_row(name, mine, other, theirs, target, show_mine=True):
    """One row: what rlaunch took (`mine`; shown unless the row follows its case's first),
    what `other` took, the median of the per-round ratios and its verdict against `target`
    (None: no target)."""
    pairs = [a / b for a, b in zip(mine, theirs) if a and b]
    verdict = ""
    if target is not None:
        verdict = f"<={target:.2f} " + ("ok" if pairs and statistics.median(pairs) <= target else "MISS")
    return (
        f"{name:<34} {spread(mine, fmt_ms) if show_mine else '':<22} "
        f"{other:<14} {spread(theirs, fmt_ms):<22} {spread(pairs, fmt_ratio):<20} {verdict}".rstrip()
    )


def time_rows(m):
    """Table rows for a measured case: one per command rlaunch is compared with, and their
    CPU times where the case asks."""
    main = m.case.commands[0]
    others = [c.label for c in m.case.commands[1:]] + list(m.case.fastest)
    rows = []
    for i, other in enumerate(others):
        name = m.case.name if i == 0 else ""
        target = m.case.targets.get(other)
        rows.append(ratio_row(name, m.times[main.label], other, m.times[other], target, i == 0))
    if m.case.cpu_targets is not None:
        for other in [c.label for c in m.case.commands[1:]]:
            target = m.case.cpu_targets.get(other)
            rows.append(ratio_row("  CPU time (all processes)", m.cpu[main.label], other, m.cpu[other], target))
    for cmd in m.case.commands:
        fails = m.failures[cmd.label]
        if fails:
            rows.append(f"{'':<34} ! {cmd.label}: {len(fails)} failed run(s): {fails[0]}")
    if m.leftovers:
        rows.append(f"{'':<34} ! {m.leftovers} process(es) outlived their run and were killed")
    for note in m.notes:
        rows.append(f"{'':<34} ! {note}")
    return rows


# ---------------------------------------------------------------------------------------------
# Sections.


def hosts(p):
    return ",".join(f"h{i}" for i in range(1, p + 1))


def launch_cases():
    cases = []
    for n in (1, 8, 64, 256):
        targets = {"floor": 1.5} if n == 1 else {"floor": 1.10} if n >= 64 else {}
        cases.append(
            Case(
                "launch",
                f"-n {n} /bin/true",
                [
                    Command("rlaunch", [[RLAUNCH, "-n", str(n), "/bin/true"]]),
                    Command("hydra", [[HYDRA, "-n", str(n), "/bin/true"]]),
                    Command("floor", [[FLOOR, str(n), "/bin/true"]]),
                ],
                targets,
            )
        )
    return cases


def wrapper_cases():
    """Rank programs that may start an Open MPI program but do not (a shell, Python): rlaunch
    starts a node's PMIx server only when a rank connects, so these must cost what they cost
    with `--pmi simple` (no PMIx at all). On one node, and on 8 fake nodes of 2 ranks."""
    cases = []
    python = "/usr/bin/python3"
    for what, program in (("sh -c true", ["sh", "-c", "true"]), ("python3 -c pass", [python, "-c", "pass"])):
        for nodes, n in ((None, 4), (8, 16)):
            two_each = None if nodes is None else ",".join(f"h{i}:2" for i in range(1, nodes + 1))
            fake = [] if nodes is None else ["--launcher", "fork", "--hosts", two_each]
            hydra_fake = [] if nodes is None else ["-launcher", "fork", "-hosts", two_each]
            where = "" if nodes is None else f" on {nodes} nodes"
            cases.append(
                Case(
                    "launch",
                    f"-n {n} {what}{where}",
                    [
                        Command("rlaunch", [[RLAUNCH, *fake, "-n", str(n), *program]]),
                        Command("simple", [[RLAUNCH, "--pmi", "simple", *fake, "-n", str(n), *program]]),
                        Command("hydra", [[HYDRA, *hydra_fake, "-n", str(n), *program]]),
                    ],
                    {"simple": 1.10},
                )
            )
    return cases


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


XGB_WORKERS, XGB_NODES = 64, 16


def xgb_commands(n, nodes):
    """XGBoost 1.7 training over `n` workers: rlaunch as its tracker on `nodes` fake nodes;
    Debian's tracker beside rlaunch; that tracker with the workers started directly."""
    python = "/usr/bin/python3"
    job = [python, os.path.join(ROOT, "tests", "scripts", "xgboost_job.py"), "train"]
    xgb_tracker = os.path.join(BENCH, "xgb_tracker.py")
    hosts = ",".join(f"h{i}:{n // nodes}" for i in range(1, nodes + 1))
    return {
        "rlaunch": [RLAUNCH, "--tracker", "rabit", "--launcher", "fork", "--hosts", hosts, "-n", str(n), *job],
        "beside": [python, xgb_tracker, "rlaunch", RLAUNCH, str(n), *job],
        "floor": [python, xgb_tracker, "direct", RLAUNCH, str(n), *job],
    }


def framework_cases():
    """PyTorch and XGBoost jobs from the command to their end (each rank's first all_reduce,
    or the whole training). torch: rlaunch against Debian's own torchrun (with `--redirects 1
    --tee 1`, without which Debian 12's torchrun crashes on its Python 3.11:
    ../shared/notes/frameworks.md): `--standalone` on one machine, and `--nnodes` (one agent
    per fake node, all started at once, meeting at a c10d rendezvous) on fake nodes; and
    against the floor, the ranks started straight from a script with the variables set
    (bench/direct.py). XGBoost 1.7: rlaunch as the tracker against Debian's Python tracker
    started by hand beside rlaunch, and against that tracker with the workers started
    straight from its script (bench/xgb_tracker.py)."""
    python = "/usr/bin/python3"
    torch_job = os.path.join(ROOT, "tests", "scripts", "torch_job.py")
    direct = os.path.join(BENCH, "direct.py")
    torchrun = [python, "-m", "torch.distributed.run", "--redirects", "1", "--tee", "1"]
    cases = []
    for n, nodes in ((4, None), (16, 4)):
        job = [torch_job, "allreduce"]
        if nodes is None:
            fake, where = [], ""
            theirs = [[*torchrun, "--standalone", "--nproc_per_node", str(n), *job]]
        else:
            fake = ["--launcher", "fork", "--hosts", ",".join(f"h{i}:{n // nodes}" for i in range(1, nodes + 1))]
            where = f" on {nodes} fake nodes"
            rdzv = ["--rdzv_backend", "c10d", "--rdzv_endpoint", f"127.0.0.1:{free_port()}", "--rdzv_id", "bench"]
            agent = [*torchrun, "--nnodes", str(nodes), "--nproc_per_node", str(n // nodes), *rdzv, "--max_restarts", "0", *job]
            theirs = [agent] * nodes
        cases.append(
            Case(
                "frameworks",
                f"torch all_reduce, {n} ranks{where}",
                [
                    Command("rlaunch", [[RLAUNCH, *fake, "-n", str(n), python, *job]], timeout=300),
                    Command("torchrun", theirs, timeout=300),
                    Command("floor", [[python, direct, str(n), python, *job]], timeout=300),
                ],
                {"torchrun": 0.5},
            )
        )
    n, nodes = XGB_WORKERS, XGB_NODES
    cases.append(
        Case(
            "frameworks",
            f"XGBoost 1.7 hist, {n} workers on {nodes} fake nodes",
            [Command(label, [argv], timeout=300) for label, argv in xgb_commands(n, nodes).items()],
            {"beside": 1.0},
        )
    )
    return cases


def tracker_rows(scratch, rounds=5):
    """The trackers' own work in the XGBoost case, from each one's first worker connection
    to every worker's links assigned: rlaunch's from its --report (job.tracker), Debian's
    Python tracker's as bench/xgb_tracker.py notes it. Medians of `rounds` untimed runs."""
    commands = xgb_commands(XGB_WORKERS, XGB_NODES)
    report = os.path.join(scratch, "tracker-report.json")
    spans = os.path.join(scratch, "tracker-spans.txt")
    ours, theirs = [], []
    for _ in range(rounds):
        rlaunch = commands["rlaunch"]
        r = run(Command("rlaunch", [[rlaunch[0], "--report", report, *rlaunch[1:]]], timeout=300), scratch)
        if r.failure:
            return [f"tracker's own work: rlaunch failed: {r.failure}"]
        with open(report) as f:
            ours.append(json.load(f)["job"]["tracker"]["wall_s"])
        os.environ["XGB_TRACKER_SPAN"] = spans
        try:
            r = run(Command("beside", [commands["beside"]], timeout=300), scratch)
        finally:
            del os.environ["XGB_TRACKER_SPAN"]
        if r.failure:
            return [f"tracker's own work: Debian's tracker failed: {r.failure}"]
    with open(spans) as f:
        theirs = [float(line) for line in f if line.strip()]
    ratio = statistics.median(ours) / statistics.median(theirs)
    return [
        f"tracker's own work, {XGB_WORKERS} workers (first connection -> every worker's links assigned), "
        f"median of {rounds}: rlaunch {fmt_ms(statistics.median(ours))}, "
        f"Debian's Python tracker {fmt_ms(statistics.median(theirs))} ({fmt_ratio(ratio)}x)"
    ]


def record_cases():
    """What --report and --timeline cost: the same job with and without them."""
    out = os.path.join(tempfile.gettempdir(), f"rlaunch-bench-{os.getpid()}")
    files = ["--report", out + ".report.json", "--timeline", out + ".trace.json"]
    fork16 = ["--launcher", "fork", "--hosts", hosts(16)]
    cases = []
    for name, options in [("-n 256 /bin/true", []), ("16 fake nodes, -n 256 /bin/true", fork16)]:
        job = options + ["-n", "256", "/bin/true"]
        cases.append(
            Case(
                "record",
                name,
                [
                    Command("recorded", [[RLAUNCH] + files + job]),
                    Command("plain", [[RLAUNCH] + job]),
                ],
                {"plain": 1.03},
            )
        )
    return cases


def mpi_cases():
    cases = []
    for n in (8, 32, 64):
        cases.append(
            Case(
                "mpi",
                f"hello -n {n}",
                [
                    Command("rlaunch", [[RLAUNCH, "-n", str(n), MPI_HELLO]]),
                    Command("hydra", [[HYDRA, "-n", str(n), MPI_HELLO]]),
                    # No launcher and no wire-up: what MPI_Init alone costs N ranks here.
                    Command("singletons", [[FLOOR, str(n), MPI_HELLO]]),
                ],
                {"hydra": 0.6} if n == 64 else {},
            )
        )
    cases.append(
        Case(
            "mpi",
            "allgather 64 B/rank -n 64",
            [
                Command("rlaunch", [[RLAUNCH, "-n", "64", ALLGATHER]]),
                Command("hydra", [[HYDRA, "-n", "64", ALLGATHER]]),
            ],
        )
    )
    return cases


def openmpi_cases():
    """Open MPI's hello (bench/mpi_hello.c built with mpicc.openmpi): rlaunch, whose proxy
    starts a PMIx server for it, against Open MPI's own mpirun, oversubscribed as rlaunch
    places ranks."""
    mpirun = [MPIRUN, "--allow-run-as-root", "--oversubscribe"]
    return [
        Case(
            "openmpi",
            f"ompi hello -n {n}",
            [
                Command("rlaunch", [[RLAUNCH, "-n", str(n), OMPI_HELLO]]),
                Command("mpirun", [mpirun + ["-n", str(n), OMPI_HELLO]]),
            ],
            {"mpirun": 0.5} if n == 64 else {},
        )
        for n in (8, 64)
    ]


# The test suite's local Slurm cluster: munged, slurmctld and a slurmd per network-namespace
# node n1..n3, on the bridge rlsbr0 whose head address is SLURM_HEAD.
SLURM_CLUSTER = os.path.join(ROOT, "tests", "cluster", "slurm.sh")
SLURM_HEAD = "10.214.0.1"


class SlurmCluster:
    """Brings the cluster up for the section and down again, whatever happens."""

    def __init__(self, nodes=3):
        self.nodes = nodes

    def __enter__(self):
        for tool in ("salloc", "srun"):
            if shutil.which(tool) is None:
                fail(f"{tool} not found (install slurm-client; ./test.sh installs it)")
        self.dir = tempfile.mkdtemp(prefix="slurm-", dir=BUILD)
        os.chmod(self.dir, 0o755)  # munged wants its socket's directory searchable by all
        # The daemons are orphaned when slurm.sh returns: they must go to init, not to this
        # harness, which would take them for leftovers of a run and kill them.
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(PR_SET_CHILD_SUBREAPER, 0, 0, 0, 0)
        try:
            up = subprocess.run(
                ["bash", SLURM_CLUSTER, "up", self.dir, str(self.nodes)], capture_output=True, text=True
            )
        finally:
            libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)
        if up.returncode != 0:
            shutil.rmtree(self.dir, ignore_errors=True)
            fail("the Slurm cluster did not come up:\n" + up.stderr)
        os.environ["SLURM_CONF"] = os.path.join(self.dir, "slurm.conf")
        return self

    def __exit__(self, *exc):
        subprocess.run(["bash", SLURM_CLUSTER, "down", self.dir], capture_output=True)
        os.environ.pop("SLURM_CONF", None)
        shutil.rmtree(self.dir, ignore_errors=True)


def slurm_cases():
    """MPICH's hello, 6 ranks in one allocation of 3 nodes (2 a node): rlaunch (one srun for
    its proxies, which dial back), srun with Slurm's own PMI-2, and Hydra (which also starts
    its proxies with srun; -iface because the nodes do not resolve the head's name)."""
    alloc = ["salloc", "-Q", "-N3", "-n6"]
    return [
        Case(
            "slurm",
            "hello -n 6 on 3 nodes",
            [
                Command("rlaunch", [alloc + [RLAUNCH, "--bind-address", SLURM_HEAD, MPI_HELLO]]),
                Command("srun", [alloc + ["srun", "--mpi=pmi2", MPI_HELLO]]),
                Command("hydra", [alloc + [HYDRA, "-iface", "rlsbr0", MPI_HELLO]]),
            ],
            {"hydra": 1.0},
        )
    ]


def stdio_shapes(quick):
    """(ranks, bytes per rank): 1 GiB in all, from 1, 4 and 64 ranks."""
    scale = 8 if quick else 1
    return [(1, GIB // scale), (4, 256 * MIB // scale), (64, 16 * MIB // scale)]


def size_name(nbytes):
    return f"{nbytes // GIB} GiB" if nbytes % GIB == 0 else f"{nbytes // MIB} MiB"


def stdio_cases(quick):
    """The floor is the fastest honest direct pipe: the same block writers (64 KiB writes)
    straight into `wc -c`, through a 1 MiB pipe (`pipe 1M`) or the default 64 KiB one (`pipe
    64K`), whichever is faster in each round: on one VM here the 64 KiB pipe made writer and
    reader take turns (2x slower), on another it was as fast as the 1 MiB one. Targets: at
    most 1.3x the floor for 1 and 4 ranks, and faster than Hydra everywhere."""
    cases = []
    for ranks, per_rank in stdio_shapes(quick):
        total = str(ranks * per_rank)
        writer = [LINES, "write", str(per_rank)]
        direct = [writer + [str(r)] for r in range(ranks)]
        targets = {"hydra": 1.0}
        if ranks <= 4:
            targets["floor"] = 1.3
        cases.append(
            Case(
                "stdio",
                f"{ranks} x {size_name(per_rank)} | wc -c",
                [
                    Command("rlaunch", [[RLAUNCH, "-n", str(ranks)] + writer], ["wc", "-c"], total, 300),
                    Command("hydra", [[HYDRA, "-n", str(ranks)] + writer], ["wc", "-c"], total, 300),
                    Command("pipe 1M", direct, ["wc", "-c"], total, 300, pipe_size=MIB),
                    Command("pipe 64K", direct, ["wc", "-c"], total, 300),
                    # The launcher's path without the launcher: the writers' pipe, two hops
                    # that read and write (proxy, launcher), then wc; and two that splice,
                    # the path's physical floor.
                    Command("3 hops", [["sh", "-c", three_hops(direct)]], ["wc", "-c"], total, 300, pipe_size=MIB),
                    Command("3 hops spliced", [["sh", "-c", three_hops(direct, splice=True)]], ["wc", "-c"], total, 300, pipe_size=MIB),
                ],
                targets,
                fastest={"floor": ["pipe 1M", "pipe 64K"]},
            )
        )
    # With a prefix on every line, nothing can be spliced past rlaunch: the copying path.
    ranks, per_rank = stdio_shapes(quick)[1]
    writer = [LINES, "write", str(per_rank)]
    total = str(ranks * per_rank + ranks * (per_rank // 64) * 4)
    cases.append(
        Case(
            "stdio",
            f"{ranks} x {size_name(per_rank)} -l | wc -c",
            [
                Command("rlaunch", [[RLAUNCH, "-l", "-n", str(ranks)] + writer], ["wc", "-c"], total, 300),
                Command("hydra", [[HYDRA, "-l", "-n", str(ranks)] + writer], ["wc", "-c"], total, 300),
            ],
            {"hydra": 1.0},
        )
    )
    return cases


def three_hops(writers, splice=False):
    """A shell line: `writers` (run together) piped through two relays (that splice)."""
    quoted = [" ".join(shlex.quote(w) for w in argv) for argv in writers]
    relay = shlex.quote(RELAY) + (" splice" if splice else "")
    return "{ " + " & ".join(quoted) + " & wait; } | " + f"{relay} | {relay}"


def stdio_checks(quick, scratch):
    """One run per launcher and shape through `lines check` instead of `wc -c`."""
    rows = []
    for ranks, per_rank in stdio_shapes(quick):
        writer = [LINES, "write", str(per_rank)]
        check = [LINES, "check", str(ranks), str(per_rank // 64)]
        verdicts = []
        for label, launcher in (("rlaunch", [RLAUNCH]), ("hydra", [HYDRA])):
            log(f"stdio check: {label} {ranks} x {size_name(per_rank)}")
            r = run(Command(label, [launcher + ["-n", str(ranks)] + writer], check, None, 300), scratch)
            # The checker exits 1 when it found bad lines: its summary is the result either way.
            summary = r.output or r.failure
            if r.failure and "lines=" not in (r.output or ""):
                summary = f"failed: {r.failure}"
            verdicts.append(f"{label} {summary}")
        rows.append(f"{f'{ranks} x {size_name(per_rank)} line check':<34} " + "; ".join(verdicts))
    return rows


def fakehost_cases(quick):
    cases = []
    hostfile = os.path.join(BUILD, "hosts-1024")
    with open(hostfile, "w") as f:
        f.write("".join(f"h{i}\n" for i in range(1, 1025)))
    for p in (16, 64, 256, 1024):
        hydra_timeout = 60 if p >= 1024 else 120
        commands = [
            Command("rlaunch", [[RLAUNCH, "--launcher", "fork", "--hosts", hosts(p), "-n", str(p), "/bin/true"]]),
            Command(
                "hydra",
                [[HYDRA, "-launcher", "fork", "-hosts", hosts(p), "-n", str(p), "/bin/true"]],
                timeout=hydra_timeout,
            ),
        ]
        if p == 1024:
            # Hydra refuses more than ~1000 names after -hosts; a host file gets it running.
            commands.append(
                Command(
                    "hydra -f",
                    [[HYDRA, "-launcher", "fork", "-f", hostfile, "-n", str(p), "/bin/true"]],
                    timeout=hydra_timeout,
                )
            )
        cases.append(
            Case(
                "fakehosts",
                f"{p} nodes /bin/true",
                commands,
                {"hydra": 1.0} if p == 256 else {"hydra -f": 0.5} if p == 1024 else {},
                cpu_targets={"hydra -f": 1.0} if p == 1024 else {},
            )
        )
    for p in (16, 64):
        cases.append(
            Case(
                "fakehosts",
                f"{p} nodes hello",
                [
                    Command("rlaunch", [[RLAUNCH, "--launcher", "fork", "--hosts", hosts(p), "-n", str(p), MPI_HELLO]]),
                    Command("hydra", [[HYDRA, "-launcher", "fork", "-hosts", hosts(p), "-n", str(p), MPI_HELLO]]),
                ],
            )
        )
    return cases


# ---------------------------------------------------------------------------------------------
# Memory.


def memory_rows(quick, scratch):
    blocker = ["/bin/sh", "-c", 'exec 3<"$0"; echo ready; exec cat <&3', "{FIFO}"]
    shapes = [
        ("-n 256 sh+cat", 256, [RLAUNCH, "-n", "256"], [HYDRA, "-n", "256"], blocker),
        (
            "256 nodes sh+cat",
            256,
            [RLAUNCH, "--launcher", "fork", "--hosts", hosts(256), "-n", "256"],
            [HYDRA, "-launcher", "fork", "-hosts", hosts(256), "-n", "256"],
            blocker,
        ),
        ("-n 64 MPI hello", 64, [RLAUNCH, "-n", "64"], [HYDRA, "-n", "64"], [MPI_HELLO, "{FIFO}"]),
    ]
    mpirun = [MPIRUN, "--allow-run-as-root", "--oversubscribe", "-n", "64"]
    # Open MPI: rlaunch's node = its proxy and the PMIx server it starts (rlaunch-pmix);
    # mpirun is its own node's daemon and PMIx server.
    openmpi = ("-n 64 Open MPI hello", 64, [RLAUNCH, "-n", "64"], mpirun, [OMPI_HELLO, "{FIFO}"])
    repeats = 1 if quick else 3
    rows = []
    others = [(s, "hydra", "hydra_pmi_proxy") for s in shapes] + [(openmpi, "mpirun", "orted")]
    for (name, ranks, rl, hy, prog), other, other_comm in others:
        cells = []
        ours = ("rlaunch-proxy", "rlaunch-pmix")
        for label, launcher, proxy_comm in (("rlaunch", rl, ours), (other, hy, other_comm)):
            log(f"memory: {name}: {label}")
            runs = [footprint(launcher + prog, ranks, proxy_comm, scratch) for _ in range(repeats)]
            good = [r for r in runs if not r.failure]
            failed = [r.failure for r in runs if r.failure]
            if not good:
                cells.append(f"failed: {failed[0]}")
                continue
            top = max(good, key=lambda r: r.launcher)
            peak_proxy = max((max(r.proxies) for r in good if r.proxies), default=None)
            proxy_sum = max(sum(r.proxies) for r in good)
            count = len(top.proxies)
            cell = f"{max(r.launcher for r in good) / 1024:.1f}"
            cell += f" + {count} x <={peak_proxy / 1024:.1f}" if peak_proxy else " + no proxies found"
            if count > 1:
                cell += f" (sum {proxy_sum / 1024:.0f})"
            spliced = sum(r.spliced for r in good)
            if spliced:
                cell += f" [lines spliced in {spliced}/{len(good)} runs]"
            if failed:
                cell += f" [{len(failed)} failed: {failed[0]}]"
            cells.append(cell)
        rows.append(f"{name:<22} {cells[0]:<38} {other} {cells[1]}")
    return rows


MEMORY_HEADER = (
    f"{'case':<22} {'rlaunch MiB: launcher + proxies':<38} other MiB: launcher + proxies"
)


# ---------------------------------------------------------------------------------------------
# Build, header, main.


def check_tools():
    missing = [t for t in TOOLS if shutil.which(t) is None]
    if missing:
        fail(
            "missing tool(s): "
            + ", ".join(missing)
            + " (cargo: rustup; cc: build-essential; mpicc.mpich, mpiexec.hydra: libmpich-dev mpich;"
            + " mpicc.openmpi, mpirun.openmpi: openmpi-bin libopenmpi-dev)"
        )


def build():
    log("building: cargo build --profile dist --workspace")
    if subprocess.run(["cargo", "build", "--profile", "dist", "--workspace"], cwd=ROOT).returncode != 0:
        fail("cargo build --profile dist --workspace failed")
    os.makedirs(BUILD, exist_ok=True)
    steps = [
        (["cc", "-O2", "-Wall", "-o", FLOOR, os.path.join(BENCH, "floor.c")]),
        (["cc", "-O2", "-Wall", "-o", LINES, os.path.join(BENCH, "lines.c")]),
        (["cc", "-O2", "-Wall", "-o", RELAY, os.path.join(BENCH, "relay.c")]),
        (["mpicc.mpich", "-O2", "-Wall", "-o", MPI_HELLO, os.path.join(BENCH, "mpi_hello.c")]),
        (["mpicc.mpich", "-O2", "-Wall", "-o", ALLGATHER, os.path.join(BENCH, "allgather.c")]),
        (["mpicc.openmpi", "-O2", "-Wall", "-o", OMPI_HELLO, os.path.join(BENCH, "mpi_hello.c")]),
    ]
    for argv in steps:
        log("building: " + " ".join(os.path.relpath(a, ROOT) if a.startswith(ROOT) else a for a in argv))
        if subprocess.run(argv).returncode != 0:
            fail(f"{argv[0]} failed for {argv[-1]}")
    for path in (RLAUNCH, RLAUNCH_PROXY, FLOOR, LINES, RELAY, MPI_HELLO, ALLGATHER, OMPI_HELLO):
        if not os.access(path, os.X_OK):
            fail(f"build did not produce {path}")


def git(*args):
    r = subprocess.run(["git", "--no-optional-locks", *args], cwd=ROOT, capture_output=True, text=True)
    return r.stdout.strip() if r.returncode == 0 else ""


def cpu_model():
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


@dataclass
class Source:
    """The commit the binaries were built from, read once before building: HEAD may move while
    the benchmark runs, and the header and the file name must name the same commit."""

    commit: str
    short: str
    dirty: bool

    @classmethod
    def read(cls):
        return cls(
            git("rev-parse", "HEAD") or "unknown",
            git("rev-parse", "--short", "HEAD") or "unknown",
            bool(git("status", "--porcelain", "--untracked-files=no")),
        )


def machine_header(started, source):
    """The header's first lines, shared with the other harnesses: when, which commit, which
    machine."""
    uname = subprocess.run(["uname", "-a"], capture_output=True, text=True).stdout.strip()
    return [
        f"date:    {started:%Y-%m-%d %H:%M:%S %z}",
        f"commit:  {source.commit}" + (" (work tree had uncommitted changes)" if source.dirty else ""),
        f"uname:   {uname or ' '.join(platform.uname())}",
        f"nproc:   {len(os.sched_getaffinity(0))}",
        f"cpu:     {cpu_model()}",
    ]


def header(args, started, source):
    return machine_header(started, source) + [
        f"hydra:   {first_hydra_version()}",
        f"mode:    {'quick' if args.quick else 'full'}, {args.pairs} pairs after 1 warm-up, "
        f"sections {' '.join(args.only)}",
        "env:     " + " ".join(f"{k}={v}" for k, v in MPI_ENV.items()) + " for every command",
        load_line("before:  "),
    ]


def cpu_busy(seconds=1.0):
    """Fraction of all CPUs busy over the next `seconds`: what else is running on the machine."""

    def sample():
        with open("/proc/stat") as f:
            values = [int(v) for v in f.readline().split()[1:]]
        return sum(values), values[3] + values[4]  # total, idle + iowait

    total0, idle0 = sample()
    time.sleep(seconds)
    total1, idle1 = sample()
    return 1 - (idle1 - idle0) / max(1, total1 - total0)


def load_line(when):
    # Not the load average: in this VM it can stay frozen for minutes on an idle machine.
    return f"{when}CPU {cpu_busy():.0%} busy over 1 s with nothing of ours running"


def first_hydra_version():
    r = subprocess.run([HYDRA, "-info"], stdin=Stdin.read_fd, capture_output=True, text=True)
    for line in r.stdout.splitlines():
        if "Version:" in line:
            return "MPICH " + line.split(":", 1)[1].strip()
    return "unknown"


def parse_args():
    ap = argparse.ArgumentParser(description="Benchmark rlaunch against mpiexec.hydra and the floor.")
    ap.add_argument("--quick", action="store_true", help="5 pairs, 1/8 of the stdio sizes, 1 memory run")
    ap.add_argument("--only", nargs="+", choices=SECTIONS, metavar="SECTION", help=f"any of {' '.join(SECTIONS)}")
    ap.add_argument("--pairs", type=int, help="measured rounds per case (default 11, --quick 5)")
    args = ap.parse_args()
    if args.pairs is None:
        args.pairs = 5 if args.quick else 11
    if args.pairs < 1:
        ap.error("--pairs must be at least 1")
    args.only = [s for s in SECTIONS if s in (args.only or SECTIONS)]
    return args


def results_path(args, started, source):
    name = f"{started:%Y-%m-%d}-{source.short}"
    if args.quick:
        name += "-quick"
    if args.only != SECTIONS:
        name += "-" + "-".join(args.only)
    return os.path.join(RESULTS, name + ".txt")


def run_sections(args, scratch, emit):
    timed = {
        "launch": lambda: launch_cases() + wrapper_cases(),
        "mpi": mpi_cases,
        "openmpi": openmpi_cases,
        "stdio": lambda: stdio_cases(args.quick),
        "fakehosts": lambda: fakehost_cases(args.quick),
        "slurm": slurm_cases,
        "record": record_cases,
        "frameworks": framework_cases,
    }
    for section in args.only:
        emit("")
        emit(f"== {section}")
        if section == "memory":
            emit("peak RSS (VmHWM), largest of the runs; proxies: count x largest (sum)")
            emit(MEMORY_HEADER)
            for row in memory_rows(args.quick, scratch):
                emit(row)
            continue
        emit(TIME_HEADER)
        cluster = SlurmCluster() if section == "slurm" else contextlib.nullcontext()
        with cluster:
            for case in timed[section]():
                for row in time_rows(measure(case, args.pairs, scratch)):
                    emit(row)
        if section == "stdio":
            for row in stdio_checks(args.quick, scratch):
                emit(row)
        if section == "frameworks":
            for row in tracker_rows(scratch):
                emit(row)


def main():
    args = parse_args()
    check_tools()
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) != 0:
        fail("prctl(PR_SET_CHILD_SUBREAPER) failed: " + os.strerror(ctypes.get_errno()))
    os.environ.update(MPI_ENV)
    source = Source.read()
    build()
    Stdin.open()
    started = datetime.datetime.now().astimezone()
    t0 = time.monotonic()
    lines = header(args, started, source)
    for line in lines:
        print(line, flush=True)

    def emit(line):
        lines.append(line)
        print(line, flush=True)

    scratch = tempfile.mkdtemp(prefix="run-", dir=BUILD)
    try:
        run_sections(args, scratch, emit)
    finally:
        kill_all_descendants()
        reap_orphans()
        Stdin.close()
        shutil.rmtree(scratch, ignore_errors=True)
    emit("")
    emit(f"elapsed: {time.monotonic() - t0:.0f} s")
    emit(load_line("after:   "))
    os.makedirs(RESULTS, exist_ok=True)
    path = results_path(args, started, source)
    with open(path + ".tmp", "w") as f:
        f.write("\n".join(lines) + "\n")
    os.rename(path + ".tmp", path)
    log(f"results written to {os.path.relpath(path, ROOT)}")


if __name__ == "__main__":
    main()
