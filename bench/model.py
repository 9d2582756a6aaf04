#!/usr/bin/env python3
"""rlaunch's launch model: launch time, CPU, memory and descriptors from measured costs.

    python3 bench/model.py [--costs FILE.json] [--ssh FILE.json] [--plot docs/scale.svg]

What it is (docs/scale.md, *The model*): a discrete-event simulation of one launch of
`-n N /bin/true`-like jobs through rlaunch's tree, process by process, with every process's
CPU work run on its machine's CPUs under processor sharing (Linux's fair scheduler, to first
order) and every message delayed by its link's latency. The same simulation covers the two
regimes that matter:

- *this machine*: every fake node's proxy and ranks share its 2 CPUs, so a launch of 1024
  fake nodes is bound by the whole tree's CPU time, and the tree's shape only moves that;
- *a cluster*: each node has its own cores, so a launch is bound by the tree's critical
  path: the depth times a hop (a child's start, its hello and launch), the width times
  what a parent spends on each child, and what rlaunch spends on each node.

Every cost is measured here (bench/costs.py writes the raw figures: each process's own CPU,
memory and descriptors from `--report`, and the phases of each node's launch), fitted by
least squares on small runs only (at most 64 nodes; the grid of 16 to 1024 nodes checks the
model, see `validate`). Nothing in the model is guessed except what it says it assumes for
machines this one cannot show (cores per node, link latency), which are arguments.

Subcommands (default: all of them):
  costs     the fitted costs, with how well each fit explains its runs
  validate  the model beside every measured grid point, and the error
  predict   10,000 and 100,000 nodes x 64 ranks, ssh and srun trees, rlaunch's tree at each
            width against Hydra's star, and what breaks first
Standard library only.
"""

import argparse
import glob
import heapq
import json
import math
import os
import statistics
import sys

BENCH = os.path.dirname(os.path.abspath(__file__))
RESULTS = os.path.join(BENCH, "results")
sys.path.insert(0, BENCH)
from costs import slope  # noqa: E402


# ---------------------------------------------------------------------------------------------
# The tree, as plan::build_tree lays it out: breadth-first, node i at heap position i + 1,
# position p's children at p*k+1 ..= p*k+k; position 0 is rlaunch.


def children_of(i, n, width):
    first = (i + 1) * width
    return list(range(first, min(first + width, n)))


def top_nodes(n, width):
    return list(range(min(width, n)))


def tree_shape(n, width):
    """For each node: (children, descendants), and the tree's depth."""
    kids = [children_of(i, n, width) for i in range(n)]
    desc = [0] * n
    for i in range(n - 1, -1, -1):
        desc[i] = sum(1 + desc[c] for c in kids[i])
    depth = 0
    level = top_nodes(n, width)
    while level:
        depth += 1
        level = [c for i in level for c in kids[i]]
    return kids, desc, depth


# ---------------------------------------------------------------------------------------------
# Least squares, small and dense: the normal equations by Gaussian elimination, and
# non-negative by dropping a negative coefficient and fitting again (a cost is never < 0).


def solve(a, b):
    n = len(b)
    m = [row[:] + [b[i]] for i, row in enumerate(a)]
    for col in range(n):
        piv = max(range(col, n), key=lambda r: abs(m[r][col]))
        if abs(m[piv][col]) < 1e-12:
            raise ValueError("the runs do not tell these costs apart")
        m[col], m[piv] = m[piv], m[col]
        for r in range(n):
            if r != col:
                f = m[r][col] / m[col][col]
                m[r] = [x - f * y for x, y in zip(m[r], m[col])]
    return [m[i][n] / m[i][i] for i in range(n)]


def fit(rows, names, relative=False):
    """rows: [(x vector, y)]. Non-negative least squares by elimination; `relative`: each row
    weighted by 1/y, so that the fit's relative errors are what is least, and a launch of 4
    nodes counts as much as one of 64. Returns ({name: coefficient}, R^2)."""
    if relative:
        scaled = fit([([v / y for v in x], 1.0) for x, y in rows if y > 0], names)[0]
        return scaled, r_squared(rows, names, scaled)
    active = list(range(len(names)))
    while True:
        ata = [[sum(x[i] * x[j] for x, _ in rows) for j in active] for i in active]
        aty = [sum(x[i] * y for x, y in rows) for i in active]
        coef = solve(ata, aty)
        worst = min(range(len(coef)), key=lambda k: coef[k])
        if coef[worst] >= 0:
            break
        del active[worst]
    out = {name: 0.0 for name in names}
    for k, i in enumerate(active):
        out[names[i]] = coef[k]
    return out, r_squared(rows, names, out)


def r_squared(rows, names, out):
    ys = [y for _, y in rows]
    mean = sum(ys) / len(ys)
    pred = [sum(out[names[i]] * x[i] for i in range(len(names))) for x, _ in rows]
    ss_res = sum((y - p) ** 2 for y, p in zip(ys, pred))
    ss_tot = sum((y - mean) ** 2 for y in ys) or 1.0
    return 1 - ss_res / ss_tot


# ---------------------------------------------------------------------------------------------
# The costs, fitted from bench/costs.py's raw figures.


def median_runs(runs):
    """One run per shape, each figure the median of its rounds' (node by node)."""
    shapes = {}
    for r in runs:
        shapes.setdefault((r["kind"], r["nodes"], r["width"], r["ranks"]), []).append(r)
    med = statistics.median
    out = []
    for rounds in shapes.values():
        first = rounds[0]
        nodes = []
        for k, nd in enumerate(first["nodes_seen"]):
            same = [r["nodes_seen"][k] for r in rounds]
            nodes.append({
                "node": nd["node"], "cpu_ms": med(x["cpu_ms"] for x in same),
                "maxrss_kib": med(x["maxrss_kib"] for x in same), "fds": med(x["fds"] for x in same),
                "phases_ms": {p: med(x["phases_ms"][p] for x in same) for p in nd["phases_ms"]},
            })
        out.append({
            **{k: first[k] for k in ("kind", "nodes", "width", "ranks")},
            **{k: med(r[k] for r in rounds) for k in ("wall_ms", "cpu_ms", "report_ms", "machine_cpu_ms")
               if k in first},
            "rlaunch": {k: med(r["rlaunch"][k] for r in rounds) for k in ("cpu_ms", "maxrss_kib", "fds")},
            "nodes_seen": nodes,
        })
    return out


# The fake-node launches the costs are fitted to (the grid checks them).
FAKE_CALIBRATION = ("chain", "star", "ranks", "tree")
CALIBRATION_NODES = 128


class Costs:
    """Milliseconds of CPU (or of wall time where said), kibibytes, descriptors."""

    def __init__(self, data):
        runs = data["runs"]
        self.cpus = int(next(l.split()[1] for l in data["header"] if l.startswith("nproc:")))
        calib = [r for r in runs if r["kind"] in FAKE_CALIBRATION and r["nodes"] <= CALIBRATION_NODES]
        self.calibration_runs = len(calib)
        # Each shape's rounds give one point, their median (per node for the proxies):
        # a round slowed by something else on the machine weighs nothing.
        calib = median_runs(calib)
        root_rows, proxy_rows, rest_rows, fds_rows, rss_rows, pfd_rows, prss_rows = ([] for _ in range(7))
        heads, forks, tails, execs = [], [], [], []
        for r in calib:
            n, w, ranks = r["nodes"], r["width"], r["ranks"]
            kids, desc, _ = tree_shape(n, w)
            top = len(top_nodes(n, w))
            per_node = [ranks // n + (1 if i < ranks % n else 0) for i in range(n)]
            root_rows.append(([1, top, n, ranks], r["rlaunch"]["cpu_ms"]))
            fds_rows.append(([1, top], r["rlaunch"]["fds"]))
            rss_rows.append(([1, n, ranks], r["rlaunch"]["maxrss_kib"]))
            proxies = 0.0
            for nd in r["nodes_seen"]:
                i = nd["node"]
                x = [1, len(kids[i]), desc[i], 1 if kids[i] else 0, per_node[i]]
                proxy_rows.append((x, nd["cpu_ms"]))
                pfd_rows.append(([1, len(kids[i]), per_node[i]], nd["fds"]))
                prss_rows.append(([1, len(kids[i]), per_node[i]], nd["maxrss_kib"]))
                proxies += nd["cpu_ms"]
            rest_rows.append(([1, ranks, n], r["cpu_ms"] - r["rlaunch"]["cpu_ms"] - proxies))
            phases = {nd["node"]: nd["phases_ms"] for nd in r["nodes_seen"]}
            heads.append(phases[0]["launched"])
            tails.append(r["report_ms"] - max(p["done"] for p in phases.values()))
            execs.append(r["wall_ms"] - r["report_ms"])
            if r["kind"] == "star" and n >= 8:
                forks.append(slope([(i, phases[i]["launched"]) for i in range(n)]))
        self.root, self.root_r2 = fit(root_rows, ["base", "per_top_child", "per_node", "per_rank"], True)
        self.proxy, self.proxy_r2 = fit(
            proxy_rows, ["base", "per_child", "per_descendant", "interior", "per_rank"], True)
        self.rest, self.rest_r2 = fit(rest_rows, ["base", "per_rank", "per_node"], True)
        self.root_fds, self.root_fds_r2 = fit(fds_rows, ["base", "per_top_child"])
        # Memory grows too little below 128 nodes to show: rlaunch's is fitted on every
        # fake-node launch, the grid's 1024 nodes included (memory is not what the grid checks).
        rss_rows = []
        for r in median_runs([r for r in runs if r["kind"] in FAKE_CALIBRATION + ("grid",)]):
            rss_rows.append(([1, r["nodes"], r["ranks"]], r["rlaunch"]["maxrss_kib"]))
        self.root_rss, self.root_rss_r2 = fit(rss_rows, ["base", "per_node", "per_rank"])
        self.proxy_fds, self.proxy_fds_r2 = fit(pfd_rows, ["base", "per_child", "per_rank"])
        self.proxy_rss, self.proxy_rss_r2 = fit(prss_rows, ["base", "per_child", "per_rank"])
        # Wall-time pieces, from the phases: rlaunch's start to its first child running;
        # the last node done to the report; rlaunch's exec and exit outside its clock; what
        # a parent spends on each child before the next one runs.
        self.head = statistics.median(heads)
        self.tail = statistics.median(tails)
        self.exec = statistics.median(execs)
        self.fork = statistics.median(forks)

    def describe(self):
        f = lambda d: ", ".join(f"{k} {v:.3f}" for k, v in d.items())  # noqa: E731
        return [
            f"fitted on {self.calibration_runs} launches of at most {CALIBRATION_NODES} fake nodes (medians of each shape's"
            f" rounds); {self.cpus} CPUs",
            f"rlaunch CPU ms:   {f(self.root)}   (R^2 {self.root_r2:.3f})",
            f"proxy CPU ms:     {f(self.proxy)}   (R^2 {self.proxy_r2:.3f})",
            f"ranks+exits ms:   {f(self.rest)}   (R^2 {self.rest_r2:.3f})",
            f"wall ms:          head {self.head:.3f}, tail {self.tail:.3f}, exec+exit {self.exec:.3f}, "
            f"fork a child {self.fork:.3f}",
            f"rlaunch fds:      {f(self.root_fds)}   (R^2 {self.root_fds_r2:.3f})",
            f"proxy fds:        {f(self.proxy_fds)}   (R^2 {self.proxy_fds_r2:.3f})",
            f"rlaunch RSS KiB:  {f(self.root_rss)}   (R^2 {self.root_rss_r2:.3f})",
            f"proxy RSS KiB:    {f(self.proxy_rss)}   (R^2 {self.proxy_rss_r2:.3f})",
        ]


# ---------------------------------------------------------------------------------------------
# The simulation: processes are generators that yield what they do next.
#   ("cpu", ms)          run on the process's machine, processor-shared
#   ("recv",)            the next message to this process (waits for one)
#   ("send", pid, msg, delay_ms)
#   ("spawn", gen, machine) -> the new process's id
#   ("sleep", ms)


class Machine:
    """A pool of CPUs shared by the tasks on it, each getting min(1, cpus/tasks) of a CPU.
    Virtual time: all tasks progress alike, so a task ends when the machine's virtual time
    passes its start's plus its work."""

    def __init__(self, cpus):
        self.cpus = cpus
        self.vtime = 0.0
        self.at = 0.0  # the real time vtime was last brought up to
        self.tasks = []  # heap of (vtime at end, seq, pid)
        self.version = 0

    def rate(self):
        return min(1.0, self.cpus / len(self.tasks)) if self.tasks else 1.0

    def advance(self, now):
        self.vtime += (now - self.at) * self.rate()
        self.at = now

    def next_end(self):
        if not self.tasks:
            return None
        return self.at + (self.tasks[0][0] - self.vtime) / self.rate()


class Sim:
    def __init__(self):
        self.now = 0.0
        self.events = []  # (time, seq, kind, payload)
        self.seq = 0
        self.procs = {}  # pid -> [generator, machine, mailbox, waiting]
        self.cpu_ms = 0.0
        self.root_cpu_ms = 0.0  # pid 0's: rlaunch's

    def push(self, at, kind, payload):
        self.seq += 1
        heapq.heappush(self.events, (at, self.seq, kind, payload))

    def spawn(self, gen, machine):
        pid = len(self.procs)
        self.procs[pid] = [gen, machine, [], False]
        self.push(self.now, "resume", (pid, None))
        return pid

    def schedule_machine(self, m):
        m.version += 1
        end = m.next_end()
        if end is not None:
            self.push(end, "cpu_end", (m, m.version))

    def step(self, pid, value):
        proc = self.procs[pid]
        gen, machine = proc[0], proc[1]
        while True:
            try:
                cmd = gen.send(value)
            except StopIteration:
                return
            value = None
            op = cmd[0]
            if op == "cpu":
                ms = cmd[1]
                if ms <= 0:
                    continue
                self.cpu_ms += ms
                if pid == 0:
                    self.root_cpu_ms += ms
                machine.advance(self.now)
                self.seq += 1
                heapq.heappush(machine.tasks, (machine.vtime + ms, self.seq, pid))
                self.schedule_machine(machine)
                return
            if op == "sleep":
                self.push(self.now + cmd[1], "resume", (pid, None))
                return
            if op == "send":
                _, dst, msg, delay = cmd
                self.push(self.now + delay, "deliver", (dst, msg))
                continue
            if op == "spawn":
                value = self.spawn(cmd[1], cmd[2])
                continue
            if op == "recv":
                if proc[2]:
                    value = proc[2].pop(0)
                    continue
                proc[3] = True
                return
            raise ValueError(op)

    def run(self):
        while self.events:
            at, _, kind, payload = heapq.heappop(self.events)
            self.now = at
            if kind == "resume":
                self.step(*payload)
            elif kind == "deliver":
                dst, msg = payload
                proc = self.procs[dst]
                if proc[3]:
                    proc[3] = False
                    self.step(dst, msg)
                else:
                    proc[2].append(msg)
            elif kind == "cpu_end":
                m, version = payload
                if version != m.version:
                    continue
                m.advance(self.now)
                done = []
                while m.tasks and m.tasks[0][0] <= m.vtime + 1e-9:
                    done.append(heapq.heappop(m.tasks)[2])
                self.schedule_machine(m)
                for pid in done:
                    self.push(self.now, "resume", (pid, None))
        return self.now


# ---------------------------------------------------------------------------------------------
# One launch. `start` says how a parent starts a child and what the child does before it can
# start its own: "fork" (this machine's fake nodes: forked, holding its launch), or a remote
# start priced by `Remote` (ssh: the parent's CPU, the child's, and round trips; srun: every
# proxy started by one srun and dialing rlaunch, which redirects it to its parent).


def placement(costs, cores):
    """machine(i), the CPUs node i's processes run on ("root": rlaunch's), and the one
    machine of them all when they share this machine's CPUs (cores None), else None."""
    shared = Machine(costs.cpus) if cores is None else None
    machines = {}

    def machine(i):
        if shared is not None:
            return shared
        if i not in machines:
            machines[i] = Machine(cores)
        return machines[i]

    return machine, shared


class Remote:
    """A remote start (ssh) of one child: parent_ms of the parent's own CPU (its fork and exec
    of ssh), client_ms of the ssh client's CPU on the parent's machine, server_ms of sshd's
    (and the login's) on the child's, wait_ms a lone connection spends waiting rather than
    computing, round_trips of the link it waits for, then the exec'd proxy's own start
    (proxy_ms) and its hello up and launch down (one more round trip). root_per_child: what
    rlaunch spends on each child it started so."""

    def __init__(self, parent_ms, client_ms, server_ms, wait_ms, round_trips, proxy_ms, root_per_child):
        self.parent_ms = parent_ms
        self.client_ms = client_ms
        self.server_ms = server_ms
        self.wait_ms = wait_ms
        self.round_trips = round_trips
        self.proxy_ms = proxy_ms
        self.root_per_child = root_per_child

    @classmethod
    def ssh(cls, costs, data):
        """From bench/costs.py --ssh: a lone `ssh HOST true` at no delay and at a long one, and
        a star of 4 exec'd proxies. None without them."""
        med = statistics.median
        alone = [r for r in data["runs"] if r["kind"] == "ssh-true"]
        star = median_runs([r for r in data["runs"] if r["kind"] == "ssh-star"])
        if not alone or not star:
            return None
        plain = [r for r in alone if r["one_way_us"] == 0]
        probe = [r for r in alone if r["one_way_us"] > 0]
        rtt_probe = 2 * probe[0]["one_way_us"] / 1000
        wall0 = med(r["wall_ms"] for r in plain)
        round_trips = (med(r["wall_ms"] for r in probe) - wall0) / rtt_probe
        client = med(r["client_cpu_ms"] for r in plain)
        total = med(r["machine_cpu_ms"] for r in plain)
        star = star[0]
        proxy = statistics.median(nd["cpu_ms"] for nd in star["nodes_seen"])
        root_per_child = max(0.0, (star["rlaunch"]["cpu_ms"] - costs.root["base"]) / star["nodes"])
        remote = cls(costs.fork, client, max(0.0, total - client), max(0.0, wall0 - total), round_trips, proxy,
                     root_per_child)
        remote.alone = (wall0, total)
        return remote

    def describe(self):
        return [f"ssh: a lone `ssh HOST true` {self.alone[0]:.1f} ms, {self.alone[1]:.1f} ms of CPU "
                f"(client {self.client_ms:.1f}, far side {self.server_ms:.1f}), waiting {self.wait_ms:.1f} ms, "
                f"{self.round_trips:.1f} round trips; an exec'd proxy's own CPU {self.proxy_ms:.2f} ms; "
                f"rlaunch per ssh child {self.root_per_child:.2f} ms"]


def simulate(costs, n, width, ranks_per_node, cores=None, rtt_ms=0.0, remote=None, star=False):
    """The Launch of n nodes at `width`: its wall time and CPU (ms). cores=None: every
    process on this machine's costs.cpus CPUs; otherwise each node (and rlaunch's) has its own
    `cores`. remote: how a parent starts a child (None: fork, on one machine). star: Hydra's
    shape, every proxy started by the front end (width = n)."""
    c = costs
    sim = Sim()
    machine, shared = placement(c, cores)

    if star:
        width = n
    kids, desc, _ = tree_shape(n, width)
    one_way = rtt_ms / 2
    root_pid = [None]
    pids = {}
    r = ranks_per_node

    def start_child(j, parent_pid, where):
        """What the parent spends to start child j, then the child."""
        if remote is None:
            yield ("cpu", c.fork)
            pids[j] = yield ("spawn", proxy(j, parent_pid), machine(j))
        else:
            yield ("cpu", remote.parent_ms)
            yield ("spawn", connect(j, parent_pid), machine(where))

    def connect(j, parent_pid):
        """The ssh client, on the parent's machine."""
        yield ("cpu", remote.client_ms)
        pids[j] = yield ("spawn", proxy(j, parent_pid), machine(j))

    def rank_life():
        yield ("cpu", c.rest["per_rank"])

    def proxy(i, parent):
        if remote is not None:
            # sshd and the login on the far side, the handshake's round trips, the proxy's
            # exec and start, its hello up and its launch down.
            yield ("cpu", remote.server_ms)
            yield ("sleep", remote.wait_ms + remote.round_trips * rtt_ms)
            yield ("cpu", remote.proxy_ms)
            yield ("sleep", rtt_ms)
        for j in kids[i]:
            yield from start_child(j, pids[i], i)
        yield ("cpu", c.proxy["base"] if remote is None else 0.0)
        if r <= 8 or shared is not None:
            for _ in range(r):
                yield ("cpu", c.proxy["per_rank"])
                yield ("spawn", tell_when_done(rank_life(), pids[i]), machine(i))
            waiting = r + len(kids[i])
        else:
            # Many ranks on a node of many cores: spawned one after another, each running on
            # a core of its own; the last one's end is what the node waits for.
            yield ("cpu", c.proxy["per_rank"] * r)
            yield ("spawn", tell_when_done(rank_life(), pids[i]), machine(i))
            waiting = 1 + len(kids[i])
        for _ in range(waiting):
            msg = yield ("recv",)
            if msg[0] == "done":
                yield ("cpu", max(0.0, c.proxy["per_child"] - (c.fork if remote is None else 0.0))
                       + c.proxy["per_descendant"] * (1 + desc[msg[1]]))
        if kids[i]:
            yield ("cpu", c.proxy["interior"])
        yield ("send", parent, ("done", i), one_way)
        yield ("cpu", c.rest["per_node"])

    def tell_when_done(gen, to):
        yield from gen
        yield ("send", to, ("rank",), 0.0)

    def root():
        yield ("cpu", c.head)
        top = top_nodes(n, width)
        for j in top:
            yield from start_child(j, root_pid[0], "root")
        per_child = (c.root["per_top_child"] - c.fork) if remote is None else remote.root_per_child
        for _ in top:
            msg = yield ("recv",)
            j = msg[1]
            yield ("cpu", max(0.0, per_child) + (c.root["per_node"] + c.root["per_rank"] * r) * (1 + desc[j]))
        yield ("cpu", c.tail)

    root_pid[0] = sim.spawn(root(), machine("root"))
    end = sim.run()
    # rlaunch's CPU outside its clock's window (its exec, its plan before start_us, its exit
    # after the report) is in the measured exec+exit, whose wall time is added as it is.
    outside = max(0.0, c.root["base"] - c.head - c.tail)
    return Launch(end + c.exec, sim.cpu_ms + c.rest["base"] + outside, sim.root_cpu_ms + outside)


class Srun:
    """Proxies started by one srun (Slurm), each dialing rlaunch, which keeps its top children
    and redirects every other proxy to its parent's listener (docs/architecture.md, *Inside
    Slurm*). From bench/costs.py --slurm, 4 to 16 nodes of the tests' Slurm: `fixed_ms` of
    srun and slurmctld before any node starts, `node_ms` of a node's own CPU to start its step
    (slurmd, slurmstepd), `proxy_ms` of an exec'd proxy's own CPU, `dial_ms` of rlaunch's CPU
    per proxy that dials it. Slurm forwards its launch through a tree of its own, TreeWidth
    50 (its default): a node `levels` deep waits that many of its round trips more (assumed:
    the 16 nodes here are all one level)."""

    FANOUT = 50

    def __init__(self, data, costs):
        med = statistics.median
        alone = [r for r in data["runs"] if r["kind"] == "srun-true"]
        launches = median_runs([r for r in data["runs"] if r["kind"] == "srun"])
        if not alone or not launches:
            raise LookupError
        by_n = {}
        for r in alone:
            by_n.setdefault(r["nodes"], []).append(r)
        walls = [(n, med(x["wall_ms"] for x in v)) for n, v in by_n.items()]
        cpus = [(n, med(x["machine_cpu_ms"] for x in v)) for n, v in by_n.items()]
        self.node_ms = slope(cpus)
        # What a step of n nodes takes beyond its nodes' CPU shared by this machine's CPUs.
        self.fixed_ms = med(w - n * self.node_ms / costs.cpus for n, w in walls)
        self.proxy_ms = med(nd["cpu_ms"] for r in launches for nd in r["nodes_seen"])
        self.dial_ms = max(0.0, slope([(r["nodes"], r["rlaunch"]["cpu_ms"]) for r in launches]))
        self.launches = launches

    def describe(self):
        return [f"srun: a step's fixed start {self.fixed_ms:.1f} ms, a node's start {self.node_ms:.1f} ms of CPU, "
                f"an exec'd proxy's own CPU {self.proxy_ms:.2f} ms, rlaunch per proxy dialing in {self.dial_ms:.2f} ms"]


def simulate_srun(costs, srun, n, width, ranks_per_node, cores=None, rtt_ms=0.0):
    """A launch whose proxies one srun started (see Srun)."""
    c = costs
    sim = Sim()
    machine, shared = placement(c, cores)

    kids, desc, _ = tree_shape(n, width)
    parent_of = {j: i for i in range(n) for j in kids[i]}
    one_way = rtt_ms / 2
    pids = {}
    r = ranks_per_node

    def rank_life():
        yield ("cpu", c.rest["per_rank"])

    def tell_when_done(gen, to):
        yield from gen
        yield ("send", to, ("rank",), 0.0)

    def step(i):
        """Slurm starts node i's step: its forwarding, slurmd and slurmstepd, then the proxy."""
        levels = max(1, math.ceil(math.log(i + 2, Srun.FANOUT)))
        yield ("sleep", levels * rtt_ms)
        yield ("cpu", srun.node_ms)
        pids[i] = yield ("spawn", proxy(i), machine(i))

    def proxy(i):
        yield ("cpu", srun.proxy_ms)
        yield ("send", 0, ("dial", i), one_way)
        answer = yield ("recv",)  # rlaunch keeps it (and launches it), or redirects it
        if answer[0] == "redirect":
            yield ("send", pids[parent_of[i]], ("dial", i), one_way)
            yield ("recv",)  # its parent's launch
        if kids[i]:
            yield ("send", 0, ("listening", i), one_way)
        for _ in range(r):
            yield ("cpu", c.proxy["per_rank"])
        yield ("spawn", tell_when_done(rank_life(), pids[i]), machine(i))
        waiting = 1 + len(kids[i])
        while waiting:
            msg = yield ("recv",)
            if msg[0] == "dial":
                yield ("cpu", c.proxy["per_child"])
                yield ("send", pids[msg[1]], ("launch",), one_way)
                continue
            waiting -= 1
            if msg[0] == "done":
                yield ("cpu", c.proxy["per_descendant"] * (1 + desc[msg[1]]))
        if kids[i]:
            yield ("cpu", c.proxy["interior"])
        parent = pids[parent_of[i]] if i in parent_of else 0
        yield ("send", parent, ("done", i), one_way)
        yield ("cpu", c.rest["per_node"])

    def root():
        yield ("cpu", c.head)
        yield ("cpu", srun.fixed_ms)  # srun and slurmctld, before any node (as one piece)
        for i in range(n):
            yield ("spawn", step(i), machine(i))
        top = set(top_nodes(n, width))
        listening, pending = set(), {}
        done = 0
        while done < len(top):
            msg = yield ("recv",)
            kind, j = msg
            if kind == "dial":
                yield ("cpu", srun.dial_ms)
                if j in top:
                    yield ("send", pids[j], ("kept",), one_way)
                elif parent_of[j] in listening:
                    yield ("send", pids[j], ("redirect",), one_way)
                else:
                    pending.setdefault(parent_of[j], []).append(j)
            elif kind == "listening":
                listening.add(j)
                for k in pending.pop(j, []):
                    yield ("send", pids[k], ("redirect",), one_way)
            else:
                done += 1
                yield ("cpu", c.root["per_node"] * (1 + desc[j]) + c.root["per_rank"] * r * (1 + desc[j]))
        yield ("cpu", c.tail)

    sim.spawn(root(), machine("root"))
    end = sim.run()
    outside = max(0.0, c.root["base"] - c.head - c.tail)
    return Launch(end + c.exec, sim.cpu_ms + c.rest["base"] + outside, sim.root_cpu_ms + outside)


class Launch:
    """One simulated launch: its wall time, every process's CPU, and rlaunch's own."""

    def __init__(self, wall_ms, cpu_ms, root_cpu_ms):
        self.wall_ms, self.cpu_ms, self.root_cpu_ms = wall_ms, cpu_ms, root_cpu_ms


def footprint(costs, n, width, ranks_per_node):
    """rlaunch's and the busiest interior proxy's descriptors and peak memory (KiB), while the
    ranks run."""
    top = min(width, n)
    kids = min(width, max(0, n - top))  # an interior proxy's children, at most width
    root_fds = costs.root_fds["base"] + costs.root_fds["per_top_child"] * top
    root_rss = costs.root_rss["base"] + costs.root_rss["per_node"] * n + costs.root_rss["per_rank"] * n * ranks_per_node
    p = costs.proxy_fds
    proxy_fds = p["base"] + p["per_child"] * kids + p["per_rank"] * ranks_per_node
    q = costs.proxy_rss
    proxy_rss = q["base"] + q["per_child"] * kids + q["per_rank"] * ranks_per_node
    return root_fds, root_rss, proxy_fds, proxy_rss


def latest(pattern):
    found = sorted(glob.glob(os.path.join(RESULTS, pattern)), key=os.path.getmtime)
    if not found:
        sys.exit(f"model: no {pattern} in {RESULTS}: run python3 bench/costs.py --grid first")
    return found[-1]


def grid_points(data):
    by = {}
    for r in data["runs"]:
        if r["kind"] == "grid":
            by.setdefault((r["nodes"], r["width"]), []).append(r)
    return {k: (statistics.median(x["wall_ms"] for x in v), statistics.median(x["cpu_ms"] for x in v),
                min(x["wall_ms"] for x in v), max(x["wall_ms"] for x in v)) for k, v in sorted(by.items())}


def beside(header, rows):
    """Each measured launch beside the model's, with the errors: rows of (label, measured wall,
    its min and max, measured CPU, the model's Launch)."""
    lines, errors = [header], []
    for label, wall, lo, hi, cpu, launch in rows:
        e_wall, e_cpu = launch.wall_ms / wall - 1, launch.cpu_ms / cpu - 1
        errors.append((abs(e_wall), abs(e_cpu)))
        spread = f" ({lo:.1f}-{hi:.1f})" if lo is not None else ""
        lines.append(f"{label} | {wall:9.1f}{spread} {launch.wall_ms:9.1f} {e_wall:+7.1%} |"
                     f" {cpu:9.1f} {launch.cpu_ms:9.1f} {e_cpu:+7.1%}")
    if errors:
        lines.append(f"largest error: wall {max(e for e, _ in errors):.1%}, CPU {max(e for _, e in errors):.1%}")
    return lines


def validate(costs, data):
    rows = [(f"{n:>5} {w:>5}", wall, lo, hi, cpu, simulate(costs, n, w, 1))
            for (n, w), (wall, cpu, lo, hi) in grid_points(data).items()]
    return beside("nodes width | wall ms: measured (min-max)  model  error | CPU ms: measured  model  error", rows)


def validate_ssh(costs, remote, data):
    shapes = {}
    for r in data["runs"]:
        if r["kind"] == "ssh":
            shapes.setdefault((r["width"], r["one_way_us"]), []).append(r)
    rows = []
    for (w, us), rounds in sorted(shapes.items(), key=lambda kv: (kv[0][1], kv[0][0])):
        walls = [r["wall_ms"] for r in rounds]
        cpu = statistics.median(r["machine_cpu_ms"] for r in rounds)
        launch = simulate(costs, rounds[0]["nodes"], w, 1, rtt_ms=2 * us / 1000, remote=remote)
        rows.append((f"width {w:>3}, +{2 * us / 1000:.1f} ms", statistics.median(walls), min(walls), max(walls),
                     cpu, launch))
    return beside("16 ssh hosts: width, round trip added | wall ms: measured (min-max)  model  error |"
                  " CPU ms (all processes): measured  model  error", rows)


def validate_srun(costs, srun):
    rows = [(f"{r['nodes']:>5} {r['width']:>5}", r["wall_ms"], None, None, r["machine_cpu_ms"],
             simulate_srun(costs, srun, r["nodes"], r["width"], 1))
            for r in sorted(srun.launches, key=lambda r: (r["nodes"], r["width"]))]
    return beside("Slurm nodes, width | wall ms: measured  model  error | CPU ms (all processes): measured  model"
                  "  error", rows)


SIZES = (16, 64, 256, 1024, 10000, 100000)
WIDTHS = (8, 16, 32, 64, 128)
# What one MPICH rank puts in its first fence here (its business card), measured with
# RLAUNCH_LOG=debug ("fence complete ... bytes"): 7174 bytes for 16 ranks of bench/mpi_hello.
CARD_BYTES = 448


def folded(costs):
    """The same costs with rlaunch doing nothing per rank (the ranks' exits folded into one
    word per node at the proxies): what the model says to change first."""
    import copy

    c = copy.copy(costs)
    c.root = dict(costs.root, per_rank=0.0)
    return c


def predict(costs, remote, srun, args):
    """Launch time on a cluster: ssh trees and srun-started trees at each width, Hydra's ssh
    star from the same costs, and rlaunch with the ranks' exits folded."""
    lines = []
    best = {}
    for rtt in args.rtt:
        sizes = [n for n in args.sizes if rtt == args.rtt[0] or n <= 10000]
        for method in ("ssh", "srun"):
            if method == "srun" and not srun:
                continue
            lines += ["", f"{method}: {args.ranks} ranks a node, {args.cores} cores a node, round trip {rtt} ms; "
                      "wall s at each --tree-width, the best, Hydra's star (ssh), rlaunch's CPU at the best, "
                      "and the best with the ranks' exits folded",
                      f"{'nodes':>7} " + " ".join(f"{'w' + str(w):>7}" for w in WIDTHS)
                      + f" {'best':>5} {'Hydra':>8} {'root CPU':>8} {'folded':>7}"]
            for n in sizes:
                def one(c, w, star=False):
                    if method == "ssh":
                        return simulate(c, n, w, args.ranks, cores=args.cores, rtt_ms=rtt, remote=remote, star=star)
                    return simulate_srun(c, srun, n, w, args.ranks, cores=args.cores, rtt_ms=rtt)

                tree = {w: one(costs, w) for w in WIDTHS if w < n}
                if not tree:
                    tree = {WIDTHS[0]: one(costs, WIDTHS[0])}
                w_best = min(tree, key=lambda w: tree[w].wall_ms)
                best[(method, rtt, n)] = (w_best, {w: t.wall_ms for w, t in tree.items()})
                hydra = one(costs, n, star=True).wall_ms / 1000 if method == "ssh" else None
                fold = one(folded(costs), w_best).wall_ms / 1000
                cells = " ".join(f"{tree[w].wall_ms / 1000:7.2f}" if w in tree else f"{'-':>7}" for w in WIDTHS)
                hydra_cell = f"{hydra:8.2f}" if hydra is not None else f"{'-':>8}"
                lines.append(f"{n:>7} {cells} {w_best:>5} {hydra_cell} {tree[w_best].root_cpu_ms / 1000:8.2f}"
                             f" {fold:7.2f}")
                print(f"model: {method} {n} nodes, {rtt} ms", file=sys.stderr, flush=True)
    return lines, best


def limits(costs, args):
    """Where rlaunch's design runs out first, at 10,000 and 100,000 nodes."""
    lines = ["", f"What rlaunch and one interior proxy hold at --tree-width 32, {args.ranks} ranks a node:",
             f"{'nodes':>7} {'rlaunch fds':>11} {'rlaunch RSS MiB':>15} {'proxy fds':>9} {'proxy RSS MiB':>13}"
             f" {'fence bytes (MPICH cards)':>25} {'Hydra fds (3 a proxy)':>21}"]
    for n in (1024, 10000, 100000):
        rfd, rrss, pfd, prss = footprint(costs, n, 32, args.ranks)
        fence = n * args.ranks * CARD_BYTES
        lines.append(f"{n:>7} {rfd:11.0f} {rrss / 1024:15.0f} {pfd:9.0f} {prss / 1024:13.1f}"
                     f" {fence / 2**20:21.0f} MiB {3 * n:21d}")
    return lines


PLOT_SIZES = (16, 64, 256, 1024, 4096, 16384, 100000)
PUBLISHED = [
    # (label, nodes, seconds, colour): MVAPICH2's MPI_Init of 229,376 processes on 3,584 nodes
    # in under 22 s; Flux's `flux exec` over 5,000 broker ranks in under 1 s (docs/scale.md).
    ("published: MVAPICH2 MPI_Init, 3,584 nodes", 3584, 22.0, "#CC79A7"),
    ("published: flux exec, 5,000 ranks", 5000, 1.0, "#56B4E9"),
]


def plot(costs, remote, srun, data, args, path):
    import svgplot

    grid = grid_points(data)
    series = [
        {"label": "here, measured: fake nodes, w32", "style": "points", "color": "#0072B2",
         "points": [(n, grid[(n, 32)][0] / 1000) for n in (16, 64, 256, 1024) if (n, 32) in grid]},
        {"label": "here, model: fake nodes, w32", "style": "line", "dash": True, "color": "#0072B2",
         "points": [(n, simulate(costs, n, 32, 1).wall_ms / 1000) for n in (16, 64, 256, 1024, 2048)]},
    ]
    ssh = [r for r in data["runs"] if r["kind"] == "ssh" and r["one_way_us"] == 0 and r["width"] == 16]
    if ssh:
        series.append({"label": "here, measured: 16 ssh hosts", "style": "points", "color": "#D55E00",
                       "points": [(16, statistics.median(r["wall_ms"] for r in ssh) / 1000)]})
    if srun:
        series.append({"label": "here, measured: Slurm (srun)", "style": "points", "color": "#009E73",
                       "points": [(r["nodes"], r["wall_ms"] / 1000) for r in srun.launches if r["width"] == 16]})
    rtt = args.rtt[0]
    series.append({"label": "cluster, model: ssh tree, w32", "style": "line", "color": "#D55E00",
                   "points": [(n, simulate(costs, n, 32, args.ranks, cores=args.cores, rtt_ms=rtt,
                                           remote=remote).wall_ms / 1000) for n in PLOT_SIZES]})
    series.append({"label": "cluster, model: ssh tree, exits folded", "style": "line", "dash": True, "color": "#E69F00",
                   "points": [(n, simulate(folded(costs), n, 32, args.ranks, cores=args.cores, rtt_ms=rtt,
                                           remote=remote).wall_ms / 1000) for n in PLOT_SIZES]})
    if srun:
        series.append({"label": "cluster, model: srun tree, w32", "style": "line", "color": "#009E73",
                       "points": [(n, simulate_srun(costs, srun, n, 32, args.ranks, cores=args.cores,
                                                    rtt_ms=rtt).wall_ms / 1000) for n in PLOT_SIZES]})
    series.append({"label": "cluster, model: Hydra's ssh star", "style": "line", "dash": True, "color": "#000000",
                   "points": [(n, simulate(costs, n, n, args.ranks, cores=args.cores, rtt_ms=rtt, remote=remote,
                                           star=True).wall_ms / 1000) for n in PLOT_SIZES]})
    for label, n, secs, color in PUBLISHED:
        series.append({"label": label, "style": "points", "points": [(n, secs)], "color": color})
    svgplot.plot(path, "Launch of /bin/true: measured here, and the model", "nodes", "launch time (s)", series,
                 height=600,
                 notes=["python3 bench/costs.py --grid --ssh --slurm; python3 bench/model.py --plot " + path,
                        "here: 1 rank a node on a 2-CPU VM. cluster: the costs measured here (ssh, srun, proxies, "
                        f"rlaunch), each node its own {args.cores} cores, {args.ranks} ranks a node, round trip {rtt} ms."])
    return path


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("what", nargs="*", default=["costs", "validate"], help="costs, validate, predict")
    ap.add_argument("--costs", nargs="+", help="bench/costs.py's .json files, their launches together "
                    "(default: the newest in bench/results with the grid)")
    ap.add_argument("--ranks", type=int, default=64, help="ranks a node, for predict (64)")
    ap.add_argument("--cores", type=int, default=64, help="cores a node, for predict (64)")
    ap.add_argument("--rtt", type=float, nargs="+", default=[0.1, 1.0], help="round trips, ms, for predict")
    ap.add_argument("--sizes", type=int, nargs="+", default=[1024, 10000, 100000], help="nodes, for predict")
    ap.add_argument("--plot", help="also write the plot (SVG) there")
    args = ap.parse_args()
    paths = args.costs or [latest("*-costs-grid*.json")]
    data = {"runs": []}
    for path in paths:
        with open(path) as f:
            one = json.load(f)
        data.setdefault("header", one["header"])
        data["runs"] += one["runs"]
    costs = Costs(data)
    out = ["costs: " + ", ".join(os.path.relpath(p, os.path.dirname(BENCH)) for p in paths)]
    if "costs" in args.what:
        out += ["", "== the costs"] + costs.describe()
    remote = Remote.ssh(costs, data)
    if "costs" in args.what and remote:
        out += remote.describe()
    try:
        srun = Srun(data, costs)
    except LookupError:
        srun = None
    if "costs" in args.what and srun:
        out += srun.describe()
    if "validate" in args.what:
        out += ["", "== the model against the fake-node grid (medians)"] + validate(costs, data)
        if srun:
            out += ["", "== the model against the tests' Slurm (medians)"] + validate_srun(costs, srun)
        if remote:
            out += ["", "== the model against the ssh hosts (medians)"] + validate_ssh(costs, remote, data)
    if "predict" in args.what:
        if not remote:
            sys.exit("model: predict needs the ssh costs: python3 bench/costs.py --grid --ssh --slurm")
        table, best = predict(costs, remote, srun, args)
        out += ["", "== predictions"] + table + limits(costs, args)
    if args.plot:
        out += ["", f"plot: {plot(costs, remote, srun, data, args, args.plot)}"]
    print("\n".join(out))


if __name__ == "__main__":
    main()
