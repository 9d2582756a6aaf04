#!/usr/bin/env python3
"""Files through the tree: one file to every node before a job starts.

    python3 bench/bcast.py [--rounds K] [--only ssh|slurm|fake ...] [--size MiB] [--nodes N]
                           [--fake-nodes K] [--bcast auto|yes|no] [--rlaunch PATH]

Compares, in interleaved rounds (one warm-up of each command, then K rounds of A B C ...):

- `rlaunch --bcast FILE ... CMD`: rlaunch copies FILE to every node through its proxy tree
  before the ranks start, into a node-local directory the ranks find in RLAUNCH_BCAST_DIR,
  removed when the job ends;
- `rlaunch CMD`: the same job without the copy (the launch alone): the copy's own cost is the
  difference, round by round;
- what people do today, then the same `rlaunch CMD`:
  ssh:   16 network-namespace hosts with sshd (tests/cluster/cluster.sh): one `scp` a node, all
         started together (`scp+rlaunch`);
  slurm: the tests' real Slurm (tests/cluster/slurm.sh), all inside one allocation of the
         nodes: `sbcast FILE DEST` (`sbcast+rlaunch`, and `sbcast` alone);
  fake:  K fake nodes on this machine (`--launcher fork --hosts h1,...,hK`): the physical floor
         of K node-local copies, `cp` to K per-node paths, as K processes or one process copying
         K times, whichever is faster in each round (`floor`).

Every rank (one a node) prints `HOST PATH SIZE` for its copy (`stat`); every run is checked
(one line a node, the right size, one copy a node), and the copies are removed after each run,
outside the timed part. Results: a table on stdout and in bench/results/<date>-<commit>-bcast.txt.
The timing, the never-closing stdin, the leftover sweep and the interference notes are
bench.py's and procs.py's (bench/README.md, "How it measures").
"""

import argparse
import ctypes
import dataclasses
import datetime
import json
import os
import shlex
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter
from dataclasses import dataclass, field

try:
    import bench  # finds the build directory with `rustc -vV`
except FileNotFoundError as e:
    sys.exit(f"bcast: error: {e.filename} not found (bench.py asks `rustc -vV` where cargo puts the binaries)")
from bench import BUILD, MIB, MPI_ENV, PR_SET_CHILD_SUBREAPER, RESULTS, ROOT, Case, Measured
from bench import SlurmCluster, Source, fmt_ms, fmt_ratio, hosts, load_line, machine_header
from bench import measure, spread, time_rows
from procs import Command, Stdin, describe_status, kill_all_descendants, log, reap_orphans

SECTIONS = ["ssh", "slurm", "fake"]
CLUSTER = os.path.join(ROOT, "tests", "cluster", "cluster.sh")
GIB = 1 << 30
MARGIN = 2 * GIB  # free space left on /tmp's file system beyond the largest set of copies
TIMEOUT = 300.0
HOST_FILE = "/proc/sys/kernel/hostname"
BCAST = "rlaunch --bcast"
PLAIN = "rlaunch"


def die(msg):
    print(f"bcast: error: {msg}", file=sys.stderr)
    sys.exit(1)


# ---------------------------------------------------------------------------------------------
# What one section measures, in one object that also travels into the Slurm allocation (JSON).


@dataclass
class Plan:
    section: str
    rounds: int
    nodes: int
    size: int  # bytes
    file: str  # the file to broadcast (made once in bench/build)
    rlaunch: str
    bcast: bool  # measure `rlaunch --bcast` too
    root: str  # /tmp/bcast-bench-XXXX: the per-node copies of the other tools
    scratch: str  # stderr of the runs, the ranks' output
    cluster: str = ""  # ssh: the cluster's DIR
    scp: list = field(default_factory=list)  # ssh: scp's command line before FILE DEST

    @property
    def name(self):
        return os.path.basename(self.file)

    def title(self):
        where = {"ssh": "ssh nodes", "slurm": "Slurm nodes", "fake": "fake nodes"}[self.section]
        return f"{self.nodes} {where}, {self.size // MIB} MiB"


def job(path_expr):
    """The ranks' job: print `HOST PATH SIZE` for the file at `path_expr` (a shell word expanded
    on the node), or exit 9 when it is not there. `read` is a builtin: one fork a rank (stat)."""
    script = (
        f"read h <{HOST_FILE}; f={path_expr}; "
        's=$(stat -c %s -- "$f") || exit 9; echo "$h $f $s"'
    )
    return ["sh", "-c", script]


def bcast_job(plan):
    return job('"$RLAUNCH_BCAST_DIR"/' + shlex.quote(plan.name))


def plain_job(plan, path=None):
    return job(shlex.quote(path or plan.file))


def per_host_job(plan, root):
    """The job reading the copy at ROOT/<its host name>/NAME."""
    return job(shlex.quote(root) + '/"$h"/' + shlex.quote(plan.name))


# ---------------------------------------------------------------------------------------------
# Checks, run after each run outside the timed part (procs.Command.after).


class Tally:
    """Findings about a command's runs that do not fail them, counted over its runs."""

    def __init__(self):
        self.runs = Counter()
        self.found = Counter()

    def notes(self):
        return [f"{label}: {what} ({n} of {self.runs[label]} runs)" for (label, what), n in self.found.items()]


def output_file(plan, label):
    return os.path.join(plan.scratch, "out-" + label.replace(" ", "_").replace("+", "_").replace("-", ""))


def reader(path):
    """Where a launcher's stdout goes: a file, read after the run."""
    return ["sh", "-c", 'exec cat >"$0"', path]


def read_lines(path):
    try:
        with open(path) as f:
            lines = [line.split() for line in f if line.strip()]
        os.unlink(path)
    except OSError:
        return []
    return lines


def check_lines(lines, plan, distinct_hosts):
    """One `HOST PATH SIZE` line a node, every size right; a failure string or None."""
    if len(lines) != plan.nodes or any(len(l) != 3 for l in lines):
        return f"{len(lines)} lines from the ranks, expected {plan.nodes} `HOST PATH SIZE` lines"
    wrong = [l for l in lines if l[2] != str(plan.size)]
    if wrong:
        return f"{len(wrong)} rank(s) saw a wrong size, e.g. {' '.join(wrong[0])} (expected {plan.size})"
    if distinct_hosts and len({l[0] for l in lines}) != plan.nodes:
        return f"the ranks ran on {len({l[0] for l in lines})} distinct hosts, expected {plan.nodes}"
    return None


def check_copies(paths, plan, ok):
    """Every path holds a copy of the right size (when the run succeeded); all are removed."""
    why = None
    for path in paths:
        try:
            size = os.stat(path).st_size
            os.unlink(path)
        except FileNotFoundError:
            size = None
        if ok and why is None and size != plan.size:
            why = f"{path}: " + ("missing" if size is None else f"{size} bytes, expected {plan.size}")
    return why


def after_launch(plan, label, out, tally, distinct_hosts, copies=(), bcast=False):
    """The after-hook of a command that runs the job (with or without --bcast)."""

    def after(ok):
        tally.runs[label] += 1
        lines = read_lines(out)
        why = check_lines(lines, plan, distinct_hosts) if ok else None
        why = check_copies(copies, plan, ok) or why
        if bcast:
            dirs = {os.path.dirname(l[1]) for l in lines if len(l) == 3}
            if ok and len(dirs) < plan.nodes:
                tally.found[(label, f"{plan.nodes} nodes saw {len(dirs)} distinct RLAUNCH_BCAST_DIR(s)")] += 1
            bcast_dirs_gone(dirs, plan, label, tally)
        return why

    return after


def bcast_dirs_gone(dirs, plan, label, tally):
    """rlaunch removes each node's directory when the job ends: by the time it exits, or
    within 2 s (noted), or it is noted as left behind and removed here."""
    t0 = time.monotonic()
    left = [d for d in dirs if os.path.lexists(d)]
    while left and time.monotonic() < t0 + 2:
        time.sleep(0.01)
        left = [d for d in left if os.path.lexists(d)]
    if left:
        tally.found[(label, f"{len(left)} RLAUNCH_BCAST_DIR(s) still there 2 s after rlaunch exited (removed here)")] += 1
        for d in left:
            # Only what this job put there: the file, then the directory if that empties it.
            try:
                os.unlink(os.path.join(d, plan.name))
            except OSError:
                pass
            try:
                os.rmdir(d)
            except OSError as e:
                tally.found[(label, f"cannot remove {d}: {e.strerror}")] += 1
    elif dirs and time.monotonic() - t0 > 0.05:
        tally.found[(label, "RLAUNCH_BCAST_DIRs removed only after rlaunch exited (within 2 s)")] += 1


def after_copies(plan, label, paths, tally):
    """The after-hook of a command that only copies."""

    def after(ok):
        tally.runs[label] += 1
        return check_copies(paths, plan, ok)

    return after


# ---------------------------------------------------------------------------------------------
# Cases.


@dataclass
class BcastCase(Case):
    """A Case whose rows also show each copy's own cost: `copy` maps a label to (A, B), the
    copy's time in a round being A - B in that round (B None: A itself)."""

    copy: dict = field(default_factory=dict)
    tally: Tally = field(default_factory=Tally)
    plan: Plan = None


def launch_commands(plan, rl, tally, distinct_hosts):
    """`rlaunch --bcast` (if measured) and `rlaunch`, both running the job."""
    commands = []
    if plan.bcast:
        out = output_file(plan, BCAST)
        argv = rl + ["--bcast", plan.file] + bcast_job(plan)
        after = after_launch(plan, BCAST, out, tally, distinct_hosts, bcast=True)
        commands.append(Command(BCAST, [argv], reader(out), timeout=TIMEOUT, after=after))
    out = output_file(plan, PLAIN)
    after = after_launch(plan, PLAIN, out, tally, distinct_hosts)
    commands.append(Command(PLAIN, [rl + plain_job(plan)], reader(out), timeout=TIMEOUT, after=after))
    return commands


def copy_map(plan, theirs):
    copy = {BCAST: (BCAST, PLAIN)} if plan.bcast else {}
    copy.update(theirs)
    return copy


def node_dirs(root, names):
    for n in names:
        os.makedirs(os.path.join(root, n), exist_ok=True)
    return [os.path.join(root, n) for n in names]


def ssh_case(plan):
    names = [f"n{i}" for i in range(1, plan.nodes + 1)]
    tally = Tally()
    ssh = f"ssh -F {os.path.join(plan.cluster, 'ssh_config')}"
    rl = [plan.rlaunch, "--launcher", "ssh", "--launcher-exec", ssh, "--hosts", ",".join(names), "-n", str(plan.nodes)]
    commands = launch_commands(plan, rl, tally, distinct_hosts=True)
    root = os.path.join(plan.root, "scp")
    copies = [os.path.join(d, plan.name) for d in node_dirs(root, names)]
    # One scp a node, all started together; every one must succeed; then the same job.
    scp = " ".join(shlex.quote(a) for a in plan.scp)
    script = (
        "pids=; for h in " + " ".join(names) + "; do "
        f"{scp} {shlex.quote(plan.file)} \"$h:\"{shlex.quote(root)}/\"$h\"/{shlex.quote(plan.name)} & "
        'pids="$pids $!"; done; rc=0; for p in $pids; do wait "$p" || rc=1; done; '
        '[ "$rc" = 0 ] || { echo "an scp failed" >&2; exit 1; }; exec "$@"'
    )
    out = output_file(plan, "scp+rlaunch")
    after = after_launch(plan, "scp+rlaunch", out, tally, True, copies=copies)
    argv = ["sh", "-c", script, "sh"] + rl + per_host_job(plan, root)
    commands.append(Command("scp+rlaunch", [argv], reader(out), timeout=TIMEOUT, after=after))
    return BcastCase(
        "ssh", plan.title(), commands, copy=copy_map(plan, {"scp": ("scp+rlaunch", PLAIN)}), tally=tally, plan=plan
    )


def slurm_paths(plan):
    """sbcast writes the same path on every node, and the nodes share /tmp: each node's slurmd
    gets ROOT/slurm/nI bind-mounted over ROOT/sbcast in its own mount namespace."""
    names = [f"n{i}" for i in range(1, plan.nodes + 1)]
    return os.path.join(plan.root, "sbcast"), [os.path.join(plan.root, "slurm", n) for n in names]


def slurm_case(plan):
    tally = Tally()
    rl = [plan.rlaunch, "--bind-address", bench.SLURM_HEAD, "--ppn", "1", "-n", str(plan.nodes)]
    commands = launch_commands(plan, rl, tally, distinct_hosts=True)
    dest, per_node = slurm_paths(plan)
    target = os.path.join(dest, plan.name)
    copies = [os.path.join(d, plan.name) for d in per_node]
    sbcast = ["sbcast", plan.file, target]
    script = " ".join(shlex.quote(a) for a in sbcast) + ' && exec "$@"'
    out = output_file(plan, "sbcast+rlaunch")
    after = after_launch(plan, "sbcast+rlaunch", out, tally, True, copies=copies)
    argv = ["sh", "-c", script, "sh"] + rl + plain_job(plan, target)
    commands.append(Command("sbcast+rlaunch", [argv], reader(out), timeout=TIMEOUT, after=after))
    commands.append(Command("sbcast", [sbcast], timeout=TIMEOUT, after=after_copies(plan, "sbcast", copies, tally)))
    return BcastCase(
        "slurm",
        plan.title(),
        commands,
        copy=copy_map(plan, {"sbcast": ("sbcast", None)}),
        tally=tally,
        plan=plan,
    )


def fake_case(plan):
    tally = Tally()
    rl = [plan.rlaunch, "--launcher", "fork", "--hosts", hosts(plan.nodes), "-n", str(plan.nodes)]
    commands = launch_commands(plan, rl, tally, distinct_hosts=False)
    names = [f"h{i}" for i in range(1, plan.nodes + 1)]
    copies = [os.path.join(d, plan.name) for d in node_dirs(os.path.join(plan.root, "cp"), names)]
    procs = ["sh", "-c", 'src=$1; shift; for d do cp -- "$src" "$d" & done; wait', "sh", plan.file] + copies
    one = [sys.executable, "-c", "import shutil, sys\nfor d in sys.argv[2:]: shutil.copyfile(sys.argv[1], d)"]
    commands += [
        Command("cp K procs", [procs], timeout=TIMEOUT, after=after_copies(plan, "cp K procs", copies, tally)),
        Command("cp 1 proc", [one + [plan.file] + copies], timeout=TIMEOUT, after=after_copies(plan, "cp 1 proc", copies, tally)),
    ]
    return BcastCase(
        "fake",
        plan.title(),
        commands,
        fastest={"floor": ["cp K procs", "cp 1 proc"]},
        copy=copy_map(plan, {"floor": ("floor", None)}),
        tally=tally,
        plan=plan,
    )


# ---------------------------------------------------------------------------------------------
# The table.


def header_row(main):
    return f"{'case':<34} {main + ' ms':<22} {'vs':<14} {'other ms':<22} ratio (per round)"


def per_round(times, pair):
    a, b = pair
    if b is None:
        return list(times.get(a, []))
    return [x - y if x is not None and y is not None else None for x, y in zip(times.get(a, []), times.get(b, []))]


def fmt_signed(seconds):
    """A difference of two times may come out negative in a noisy round."""
    return "-" + fmt_ms(-seconds) if seconds is not None and seconds < 0 else fmt_ms(seconds)


def copy_rows(m):
    """The copies' own cost: ours (rlaunch --bcast less rlaunch, round by round) against each
    other way's, as medians (min-max) and the median of the per-round ratios."""
    case = m.case
    ours = per_round(m.times, case.copy[BCAST]) if BCAST in case.copy else []
    rows = []
    nbytes = case.plan.nodes * case.plan.size
    rates = []
    for label, pair in case.copy.items():
        if label == BCAST:
            continue
        theirs = per_round(m.times, pair)
        # Rounds where either copy came out at or below zero (noise) give no ratio.
        ratios = [a / b for a, b in zip(ours, theirs) if a is not None and b is not None and a > 0 and b > 0]
        rows.append(
            f"{'  the copy alone' if not rows else '':<34} {spread(ours, fmt_signed) if not rows else '':<22} "
            f"{label:<14} {spread(theirs, fmt_signed):<22} {spread(ratios, fmt_ratio)}".rstrip()
        )
        rates.append((label, theirs))
    if ours:
        rates.insert(0, ("--bcast", ours))
    cells = []
    for label, values in rates:
        values = [v for v in values if v is not None and v > 0]
        if values:
            cells.append(f"{label} {nbytes / MIB / statistics.median(values):.0f} MiB/s")
    if cells:
        rows.append(f"{'':<34} {case.plan.nodes} x {case.plan.size // MIB} MiB in all: " + ", ".join(cells))
    return rows


def measured_rows(m):
    main = m.case.commands[0].label
    rows = [header_row(main)]
    rows += time_rows(m)
    rows += copy_rows(m)
    return rows


# ---------------------------------------------------------------------------------------------
# Clusters.


def no_subreaper():
    """Daemons that a cluster script leaves running must go to init, not to this harness,
    which would take them for leftovers of a run and kill them (as bench.SlurmCluster does)."""
    libc = ctypes.CDLL(None, use_errno=True)

    class Off:
        def __enter__(self):
            libc.prctl(PR_SET_CHILD_SUBREAPER, 0, 0, 0, 0)

        def __exit__(self, *exc):
            libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)

    return Off()


class SshCluster:
    """tests/cluster/cluster.sh's nodes n1..nN, up for the section and down whatever happens."""

    def __init__(self, nodes):
        self.nodes = nodes
        self.dir = None

    def __enter__(self):
        self.dir = tempfile.mkdtemp(prefix="ssh-", dir=BUILD)
        try:
            with no_subreaper():
                up = subprocess.run(["bash", CLUSTER, "up", self.dir, str(self.nodes)], capture_output=True, text=True)
            if up.returncode != 0:
                raise RuntimeError("the ssh cluster did not come up:\n" + up.stderr)
        except BaseException:
            self.__exit__()
            raise
        return self

    def __exit__(self, *exc):
        down = subprocess.run(["bash", CLUSTER, "down", self.dir], capture_output=True, text=True)
        if down.returncode != 0:
            log(f"warning: cluster.sh down {self.dir} failed: {down.stderr.strip()}")
        shutil.rmtree(self.dir, ignore_errors=True)


def scp_command(plan, cluster_dir):
    """scp as people run it (no -C: the file is random bytes). OpenSSH 9 speaks SFTP by
    default; the test nodes' sshd has no sftp subsystem, so fall back to the classic protocol
    (-O) when a first copy says so."""
    base = ["scp", "-q", "-F", os.path.join(cluster_dir, "ssh_config")]
    probe = os.path.join(plan.root, "probe")
    with open(probe, "w") as f:
        f.write("probe\n")
    try:
        for argv in (base, base[:1] + ["-O"] + base[1:]):
            r = subprocess.run(argv + [probe, f"n1:{probe}.copy"], stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=60)
            if r.returncode == 0:
                return argv
            why = " / ".join(r.stderr.split("\n")[:2]).strip(" /") or f"exit {r.returncode}"
            log(f"ssh: {' '.join(argv)} to n1 failed ({why})" + ("; trying scp -O" if "-O" not in argv else ""))
        die(f"scp to n1 failed both ways: {why}")
    finally:
        for p in (probe, probe + ".copy"):
            if os.path.exists(p):
                os.unlink(p)


class Binds:
    """The per-node sbcast destinations: ROOT/slurm/nI over ROOT/sbcast in node I's slurmd's
    own mount namespace (`ip netns exec` gave it one; nothing shows outside it)."""

    def __init__(self, cluster_dir, plan):
        self.pids = {}
        with open(os.path.join(cluster_dir, "pids")) as f:
            for line in f:
                pid, name = line.split()[:2]
                if name.startswith("slurmd-"):
                    self.pids[name[len("slurmd-"):]] = int(pid)
        self.dest, self.per_node = slurm_paths(plan)
        self.done = []

    def __enter__(self):
        os.makedirs(self.dest, exist_ok=True)
        try:
            for d in self.per_node:
                os.makedirs(d, exist_ok=True)
                node = os.path.basename(d)
                pid = self.pids.get(node)
                if pid is None:
                    die(f"no slurmd of {node} in the cluster's pids file")
                r = subprocess.run(["nsenter", "-t", str(pid), "-m", "mount", "--bind", d, self.dest], capture_output=True, text=True)
                if r.returncode != 0:
                    die(f"cannot bind-mount {d} in {node}'s slurmd's mount namespace: {r.stderr.strip()}")
                self.done.append(pid)
        except BaseException:
            self.__exit__()
            raise
        return self

    def __exit__(self, *exc):
        for pid in self.done:
            subprocess.run(["nsenter", "-t", str(pid), "-m", "umount", self.dest], capture_output=True)
        self.done = []


def run_slurm(plan, emit):
    """Brings the Slurm cluster up, and runs the section inside one allocation of its nodes
    (this script again, `--inside-slurm`), which writes the Measured as JSON."""
    for tool in ("sbcast", "salloc", "srun", "sinfo", "nsenter", "mount"):
        if shutil.which(tool) is None:
            die(f"{tool} not found (slurm-client: sbcast, salloc, srun, sinfo; util-linux: nsenter, mount)")
    with SlurmCluster(plan.nodes) as cluster, Binds(cluster.dir, plan):
        spec = os.path.join(plan.scratch, "slurm-plan.json")
        result = os.path.join(plan.scratch, "slurm-result.json")
        with open(spec, "w") as f:
            json.dump({"plan": dataclasses.asdict(plan), "result": result}, f)
        alloc = ["salloc", "-Q", f"-N{plan.nodes}", f"-n{plan.nodes}"]
        inner = alloc + [sys.executable, os.path.abspath(__file__), "--inside-slurm", spec]
        limit = 120 + (plan.rounds + 1) * 4 * TIMEOUT
        try:
            r = subprocess.run(inner, stdin=Stdin.read_fd, timeout=limit)
        except subprocess.TimeoutExpired:
            die(f"the allocation's run did not end within {limit:.0f} s")
        if r.returncode != 0 or not os.path.exists(result):
            die(f"the run inside the allocation failed (salloc: {describe_status(r.returncode)})")
        with open(result) as f:
            got = json.load(f)
        os.unlink(result)
    case = slurm_case(plan)  # the same case the allocation ran, for its labels
    m = Measured(case, got["times"], got["failures"], got["leftovers"], got["notes"])
    for row in measured_rows(m):
        emit(row)


def inside_slurm(spec_path):
    """In the allocation: run the Slurm case, write what was measured as JSON."""
    with open(spec_path) as f:
        spec = json.load(f)
    plan = Plan(**spec["plan"])
    become_subreaper()
    os.environ.update(MPI_ENV)
    point_bench_at(plan.rlaunch)
    Stdin.open()
    case = slurm_case(plan)
    try:
        m = measure(case, plan.rounds, plan.scratch)
    finally:
        kill_all_descendants()
        reap_orphans()
        Stdin.close()
    with open(spec["result"] + ".tmp", "w") as f:
        json.dump(
            {"times": m.times, "failures": m.failures, "leftovers": m.leftovers, "notes": m.notes + case.tally.notes()}, f
        )
    os.rename(spec["result"] + ".tmp", spec["result"])


# ---------------------------------------------------------------------------------------------
# Main.


def become_subreaper():
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) != 0:
        die("prctl(PR_SET_CHILD_SUBREAPER) failed: " + os.strerror(ctypes.get_errno()))


def point_bench_at(rlaunch):
    """bench.measure watches these binaries for replacement mid-case."""
    bench.RLAUNCH = rlaunch
    bench.RLAUNCH_PROXY = os.path.join(os.path.dirname(rlaunch), "rlaunch-proxy")


def has_bcast(rlaunch):
    r = subprocess.run([rlaunch, "--help-all"], stdin=subprocess.DEVNULL, capture_output=True, text=True)
    return "--bcast" in r.stdout + r.stderr


def source_file(size):
    """bench/build/bcast-<size>M.bin: random bytes, made once (git ignores bench/build)."""
    path = os.path.join(BUILD, f"bcast-{size // MIB}M.bin")
    try:
        if os.stat(path).st_size == size:
            return path
    except FileNotFoundError:
        pass
    log(f"making {os.path.relpath(path, ROOT)} ({size // MIB} MiB of random bytes)")
    with open(path + ".tmp", "wb") as f:
        for _ in range(size // MIB):
            f.write(os.urandom(MIB))
    os.rename(path + ".tmp", path)
    return path


def check_space(plans, sources):
    """Refuses to start when the largest set of copies (one command's, removed after each
    run) and the source files yet to be made would leave less than MARGIN free on /tmp."""
    st = os.statvfs(tempfile.gettempdir())
    free = st.f_bavail * st.f_frsize
    to_make = sum(size for path, size in sources if not os.path.exists(path))
    for plan in plans:
        need = plan.nodes * plan.size + to_make + MARGIN
        if need > free:
            die(
                f"refusing the {plan.section} section: {plan.nodes} x {plan.size // MIB} MiB = "
                f"{plan.nodes * plan.size / GIB:.1f} GiB of copies (+ {to_make / GIB:.1f} GiB of source files "
                f"to make, + {MARGIN // GIB} GiB margin) would not fit the {free / GIB:.1f} GiB free on "
                f"{tempfile.gettempdir()}'s file system: lower --size or --fake-nodes"
            )


def check_tools(sections):
    need = {"sh": "dash", "cat": "coreutils", "stat": "coreutils", "cp": "coreutils", "git": "git"}
    if "ssh" in sections:
        need.update({"scp": "openssh-client", "ssh": "openssh-client", "ip": "iproute2"})
    if "slurm" in sections:
        need.update({t: "slurm-client" for t in ("sbcast", "salloc", "srun", "sinfo")})
        need.update({"nsenter": "util-linux", "mount": "mount"})
    missing = [f"{t} ({pkg})" for t, pkg in need.items() if shutil.which(t) is None]
    if missing:
        die("missing tool(s): " + ", ".join(missing))
    if ("ssh" in sections or "slurm" in sections) and os.geteuid() != 0:
        die("the ssh and slurm sections bring up network-namespace clusters: run as root (or --only fake)")


def parse_args():
    ap = argparse.ArgumentParser(description="Broadcast one file to every node: rlaunch --bcast against scp, sbcast and cp.")
    ap.add_argument("--rounds", type=int, default=5, help="measured rounds per case, after 1 warm-up (default 5)")
    ap.add_argument("--only", action="append", choices=SECTIONS, help="a section (repeatable): ssh, slurm, fake")
    ap.add_argument("--size", type=int, metavar="MiB", help="the file's size (default 100 for ssh and slurm, 16 for fake)")
    ap.add_argument("--nodes", type=int, default=16, help="ssh and Slurm nodes (default 16)")
    ap.add_argument("--fake-nodes", type=int, default=256, metavar="K", help="fake nodes (default 256)")
    ap.add_argument(
        "--bcast",
        choices=["auto", "yes", "no"],
        default="auto",
        help="measure `rlaunch --bcast`: auto (if `rlaunch --help-all` lists it), yes, no",
    )
    ap.add_argument("--rlaunch", default=bench.RLAUNCH, help="the rlaunch to measure (default: the dist build)")
    ap.add_argument("--inside-slurm", metavar="PLAN", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.rounds < 1:
        ap.error("--rounds must be at least 1")
    if args.size is not None and args.size < 1:
        ap.error("--size must be at least 1 (MiB)")
    if not 1 <= args.nodes <= 16:
        ap.error("--nodes must be 1..16 (ssh fan-out beyond 16 on 2 cores measures the ssh handshakes)")
    if args.fake_nodes < 1:
        ap.error("--fake-nodes must be at least 1")
    args.only = [s for s in SECTIONS if s in (args.only or SECTIONS)]
    args.rlaunch = os.path.abspath(args.rlaunch)
    return args


def main():
    args = parse_args()
    if args.inside_slurm:
        inside_slurm(args.inside_slurm)
        return
    check_tools(args.only)
    if not os.access(args.rlaunch, os.X_OK):
        die(f"{args.rlaunch} not found: build it first (cargo build --profile dist --workspace); bcast.py builds nothing")
    bcast = {"yes": True, "no": False, "auto": None}[args.bcast]
    if bcast is None:
        bcast = has_bcast(args.rlaunch)
        if not bcast:
            log(f"note: {args.rlaunch} has no --bcast: measuring the other ways and rlaunch without it")
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # run the finally blocks
    become_subreaper()
    os.environ.update(MPI_ENV)
    point_bench_at(args.rlaunch)
    os.makedirs(BUILD, exist_ok=True)
    source = Source.read()

    sizes = {s: (args.size or (16 if s == "fake" else 100)) * MIB for s in args.only}
    nodes = {s: args.fake_nodes if s == "fake" else args.nodes for s in args.only}
    sources = {(os.path.join(BUILD, f"bcast-{sz // MIB}M.bin"), sz) for sz in sizes.values()}
    probe = [Plan(s, args.rounds, nodes[s], sizes[s], "", args.rlaunch, bcast, "", "") for s in args.only]
    check_space(probe, sources)
    files = {sz: source_file(sz) for sz in sorted(set(sizes.values()))}

    Stdin.open()
    started = datetime.datetime.now().astimezone()
    t0 = time.monotonic()
    lines = machine_header(started, source) + [
        f"rlaunch: {args.rlaunch}" + ("" if bcast else " (--bcast not measured: " + ("not in --help-all)" if args.bcast == "auto" else "--bcast no)")),
        f"mode:    {args.rounds} rounds after 1 warm-up, sections {' '.join(args.only)}; "
        + "; ".join(f"{s}: {nodes[s]} nodes x {sizes[s] // MIB} MiB" for s in args.only),
        "env:     " + " ".join(f"{k}={v}" for k, v in MPI_ENV.items()) + " for every command",
        load_line("before:  "),
    ]
    for line in lines:
        print(line, flush=True)

    def emit(line):
        lines.append(line)
        print(line, flush=True)

    root = tempfile.mkdtemp(prefix="bcast-bench-", dir=tempfile.gettempdir())
    os.chmod(root, 0o755)
    scratch = tempfile.mkdtemp(prefix="bcast-run-", dir=BUILD)
    try:
        for section in args.only:
            plan = Plan(section, args.rounds, nodes[section], sizes[section], files[sizes[section]], args.rlaunch, bcast, root, scratch)
            emit("")
            emit(f"== {section}")
            if section == "ssh":
                ssh_section(plan, emit)
            elif section == "slurm":
                emit(
                    f"inside one allocation (salloc -N{plan.nodes} -n{plan.nodes}) of tests/cluster/slurm.sh's nodes; "
                    f"rlaunch --bind-address {bench.SLURM_HEAD} --ppn 1 -n {plan.nodes}; sbcast to one path, "
                    "a per-node directory bind-mounted there in each slurmd's mount namespace"
                )
                emit("(slurmd, slurmstepd and the proxies under them are not this harness's descendants: 'other processes' counts them)")
                run_slurm(plan, emit)
            else:
                emit(f"rlaunch --launcher fork --hosts h1,...,h{plan.nodes} -n {plan.nodes}; floor: cp to {plan.nodes} per-node paths, K processes or 1 process, the faster each round")
                m = measure(fake_case(plan), plan.rounds, scratch)
                m.notes += m.case.tally.notes()
                for row in measured_rows(m):
                    emit(row)
    finally:
        kill_all_descendants()
        reap_orphans()
        Stdin.close()
        shutil.rmtree(root, ignore_errors=True)
        shutil.rmtree(scratch, ignore_errors=True)
    emit("")
    emit(f"elapsed: {time.monotonic() - t0:.0f} s")
    emit(load_line("after:   "))
    os.makedirs(RESULTS, exist_ok=True)
    name = f"{started:%Y-%m-%d}-{source.short}-bcast"
    if args.only != SECTIONS:
        name += "-" + "-".join(args.only)
    path = os.path.join(RESULTS, name + ".txt")
    with open(path + ".tmp", "w") as f:
        f.write("\n".join(lines) + "\n")
    os.rename(path + ".tmp", path)
    log(f"results written to {os.path.relpath(path, ROOT)}")


def ssh_section(plan, emit):
    with SshCluster(plan.nodes) as cluster:
        plan.cluster = cluster.dir
        os.makedirs(plan.root, exist_ok=True)
        plan.scp = scp_command(plan, cluster.dir)
        version = subprocess.run(["ssh", "-V"], capture_output=True, text=True).stderr.strip()
        emit(
            f"tests/cluster/cluster.sh nodes n1..n{plan.nodes}; rlaunch --launcher ssh --launcher-exec 'ssh -F DIR/ssh_config' "
            f"--hosts n1,...,n{plan.nodes} -n {plan.nodes}; {' '.join(plan.scp[:1] + [a for a in plan.scp[1:] if a.startswith('-') and a != '-F'])} "
            f"to every node at once ({version})"
        )
        emit("(the nodes' sshd sessions, and the proxies and ranks under them, are not this harness's descendants: 'other processes' counts them)")
        m = measure(ssh_case(plan), plan.rounds, plan.scratch)
        m.notes += m.case.tally.notes()
        for row in measured_rows(m):
            emit(row)


if __name__ == "__main__":
    main()
