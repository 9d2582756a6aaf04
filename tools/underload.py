#!/usr/bin/env python3
"""Under load: every rank floods its stdout into a slow reader, then a Ctrl-C.

    python3 tools/underload.py [--ranks 1024] [--nodes 64] [--seconds 60] [--rate MIB_PER_S]

Runs `rlaunch --launcher fork --hosts n1:S,...,nN:S -n R --pmi simple rankprog flood-for ...`
(N fake nodes: a proxy each on this machine), every rank writing 64-byte flood lines as fast
as it can. rlaunch's stdout is a pipe into a reader in this script that reads at a fixed rate
(--rate, default 4 MiB/s) and checks every line as it comes: exactly 64 bytes in rankprog's
format, each rank's sequence numbers contiguous from 0 (nothing lost, repeated, torn or
spliced). Every --sample seconds (0.5) it reads VmRSS and VmHWM of rlaunch and of every
rlaunch-proxy. After --seconds of flooding it sends SIGINT to rlaunch's process group, as a
terminal's Ctrl-C does (the proxies and ranks have groups of their own), and times how long
rlaunch and every process of the job take to be gone.

Checks (exit 1 if any fails): no bad line and no line cut short at the end; rlaunch exits 130 saying only `rlaunch: interrupted by SIGINT`; everything
is gone within the kill grace (--kill-grace, default rlaunch's own: 1 s) plus --margin
(1 s); nothing is left 3 s later (this script is a child subreaper, so orphans are seen);
rlaunch and each proxy stay under --max-rlaunch-mib and --max-proxy-mib of peak RSS.
Prints one table. Builds the release binaries first (--no-build skips that).
"""

import argparse
import ctypes
import os
import resource
import select
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# The benchmarks' process helpers: the process table, reaping orphans.
sys.path.insert(0, os.path.join(ROOT, "bench"))
import procs  # noqa: E402

PR_SET_CHILD_SUBREAPER = 36
LINE = 64
HEAD = 21
MIB = 1 << 20
# rlaunch's documented default (`rlaunch --help`: --kill-grace).
DEFAULT_KILL_GRACE = 1.0
# After SIGINT, how long before the run counts as hung and everything is killed.
HANG = 60.0
# How long after the end a process still alive is a leftover.
LEFTOVER_WAIT = 3.0
# The padding of a flood line depends on (rank + seq) % 26 only.
PADS = [bytes(ord("a") + (k + i) % 26 for i in range(LINE - HEAD - 1)) for k in range(26)]


def build(skip):
    if not skip:
        subprocess.run(["cargo", "build", "--release", "--workspace"], cwd=ROOT, check=True)
    bin_dir = procs.built_dir(ROOT)
    return os.path.join(bin_dir, "rlaunch"), os.path.join(bin_dir, "rankprog")


# ---------------------------------------------------------------------------------------------
# The slow reader and its line checker.


class FloodChecker:
    """Checks `rankprog flood` output as it streams in (the same rules as
    rlaunch_tests::scan_flood): whole 64-byte lines, each rank's from 0 with no gap."""

    def __init__(self):
        self.rest = b""
        self.lines = 0
        self.bad = 0
        self.next_seq = {}
        self.examples = []

    def feed(self, data):
        buf = self.rest + data
        end = buf.rfind(b"\n") + 1
        self.rest = buf[end:]
        start = 0
        while start < end:
            nl = buf.index(b"\n", start)
            self.check(buf[start : nl + 1])
            start = nl + 1

    def finish(self):
        """At end of file: what is left is a line cut short."""
        if self.rest:
            self.fail(self.rest, "the output ends inside a line")
            self.rest = b""

    def check(self, line):
        self.lines += 1
        if len(line) != LINE or line[0] != ord("r") or line[7] != 32 or line[20] != 32:
            return self.fail(line, "not a flood line")
        try:
            rank, seq = int(line[1:7]), int(line[8:20])
        except ValueError:
            return self.fail(line, "not a flood line")
        if line[HEAD : LINE - 1] != PADS[(rank + seq) % 26]:
            return self.fail(line, "damaged line")
        due = self.next_seq.get(rank, 0)
        if seq != due:
            return self.fail(line, f"rank {rank} line {seq} where line {due} was due")
        self.next_seq[rank] = seq + 1

    def fail(self, line, why):
        self.bad += 1
        if len(self.examples) < 5:
            self.examples.append(f"line {self.lines}: {why}: {line[:100]!r}")


class SlowReader(threading.Thread):
    """Reads a pipe to its end at no more than `rate` bytes a second, checking every line."""

    def __init__(self, fd, rate):
        super().__init__(daemon=True)
        self.fd, self.rate = fd, rate
        self.checker = FloodChecker()
        self.bytes = 0

    def run(self):
        start = time.monotonic()
        # Small reads: the rate holds within a few milliseconds.
        chunk = max(4096, min(64 << 10, self.rate // 50))
        while True:
            ahead = self.bytes / self.rate - (time.monotonic() - start)
            if ahead > 0:
                time.sleep(ahead)
            data = os.read(self.fd, chunk)
            if not data:
                break
            self.bytes += len(data)
            self.checker.feed(data)
        self.checker.finish()
        os.close(self.fd)


class LineCollector(threading.Thread):
    """Collects a pipe's lines (rlaunch's stderr)."""

    def __init__(self, pipe):
        super().__init__(daemon=True)
        self.pipe = pipe
        self.lines = []

    def run(self):
        for line in self.pipe:
            self.lines.append(line.decode(errors="replace").rstrip("\n"))


# ---------------------------------------------------------------------------------------------
# Memory.


@dataclass
class Memory:
    """What the sampler saw, in KiB: peaks per process, and the proxies' sum over time."""

    rlaunch_rss: int = 0
    rlaunch_hwm: int = 0
    proxy_rss: dict = field(default_factory=dict)
    proxy_hwm: dict = field(default_factory=dict)
    proxies_sum: int = 0
    # (seconds since start, rlaunch RSS, sum of the proxies' RSS), every sample.
    series: list = field(default_factory=list)


class Sampler(threading.Thread):
    """Every `period` s: VmRSS and VmHWM of rlaunch and of each `rlaunch-proxy` below it."""

    def __init__(self, rlaunch_pid, period, start):
        super().__init__(daemon=True)
        self.pid, self.period, self.start_time = rlaunch_pid, period, start
        self.memory = Memory()
        self.stop = threading.Event()
        self.named = set()

    def sample(self):
        m = self.memory
        table = procs.process_table()
        named = {p for p in procs.descendants(self.pid, table) if table[p][1] == "rlaunch-proxy"}
        # A rank is named after its proxy between its clone and its exec (it shares the
        # proxy's memory then): a proxy is a process with that name in two samples running.
        proxies, self.named = named & self.named, named
        own = procs.vm_kib(self.pid)
        if own:
            m.rlaunch_rss, m.rlaunch_hwm = max(m.rlaunch_rss, own[0]), max(m.rlaunch_hwm, own[1])
        total = 0
        for pid in proxies:
            values = procs.vm_kib(pid)
            if values:
                total += values[0]
                m.proxy_rss[pid] = max(m.proxy_rss.get(pid, 0), values[0])
                m.proxy_hwm[pid] = max(m.proxy_hwm.get(pid, 0), values[1])
        m.proxies_sum = max(m.proxies_sum, total)
        m.series.append((time.monotonic() - self.start_time, own[0] if own else 0, total))

    def run(self):
        while not self.stop.is_set():
            self.sample()
            self.stop.wait(self.period)


# ---------------------------------------------------------------------------------------------
# The run.


def live_job_processes():
    """Every live (not zombie) descendant of this script: rlaunch and everything below it."""
    table = procs.process_table()
    return [p for p in procs.descendants(os.getpid(), table) if not procs.is_zombie(p)]


def wait_all_gone(pids, deadline):
    """Waits until every pid has exited (a pidfd becomes readable at exit, zombie or not);
    returns when the last one went, or None if some were still there at the deadline."""
    poller = select.poll()
    fds = {}
    for pid in pids:
        try:
            fd = os.pidfd_open(pid)
        except ProcessLookupError:
            continue
        fds[fd] = pid
        poller.register(fd, select.POLLIN)
    last = time.monotonic()
    try:
        while fds:
            left = deadline - time.monotonic()
            if left <= 0:
                return None
            for fd, _ in poller.poll(left * 1000):
                last = time.monotonic()
                poller.unregister(fd)
                os.close(fd)
                del fds[fd]
        return last
    finally:
        for fd in fds:
            os.close(fd)


def spread(lines_by_rank, ranks):
    counts = sorted(lines_by_rank.get(r, 0) for r in range(ranks))
    return f"{counts[0]:,} / {counts[len(counts) // 2]:,} / {counts[-1]:,}"


def kib(n):
    return f"{n / 1024:.1f} MiB"


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ranks", type=int, default=1024)
    ap.add_argument("--nodes", type=int, default=64)
    ap.add_argument("--seconds", type=float, default=60.0, help="of flooding before the SIGINT")
    ap.add_argument("--rate", type=float, default=4.0, help="the reader's MiB per second")
    ap.add_argument("--kill-grace", type=float, help="passed to rlaunch (default: its own, 1 s)")
    ap.add_argument("--margin", type=float, default=1.0, help="allowed past the kill grace")
    ap.add_argument("--sample", type=float, default=0.5, help="seconds between RSS samples")
    ap.add_argument("--max-rlaunch-mib", type=float, default=64.0)
    ap.add_argument("--max-proxy-mib", type=float, default=32.0)
    ap.add_argument("--no-build", action="store_true", help="use the release binaries as they are")
    args = ap.parse_args()
    if args.ranks % args.nodes:
        ap.error("--ranks must be a multiple of --nodes")

    ctypes.CDLL(None).prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    # A pidfd per process of the job.
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, min(hard, 4 * args.ranks + 256)), hard))
    rlaunch, rankprog = build(args.no_build)
    grace = DEFAULT_KILL_GRACE if args.kill_grace is None else args.kill_grace

    slots = args.ranks // args.nodes
    hosts = ",".join(f"n{i}:{slots}" for i in range(1, args.nodes + 1))
    argv = [rlaunch, "--launcher", "fork", "--hosts", hosts, "-n", str(args.ranks), "--pmi", "simple"]
    if args.kill_grace is not None:
        argv += ["--kill-grace", str(args.kill_grace)]
    # The ranks flood until the SIGINT ends them.
    argv += [rankprog, "flood-for", str(args.seconds + 3600)]

    rd, wr = os.pipe()
    start = time.monotonic()
    p = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=wr, stderr=subprocess.PIPE,
                         start_new_session=True)
    os.close(wr)
    reader = SlowReader(rd, int(args.rate * MIB))
    stderr = LineCollector(p.stderr)
    sampler = Sampler(p.pid, args.sample, start)
    for thread in (reader, stderr, sampler):
        thread.start()
    print(f"{args.ranks} ranks on {args.nodes} fake nodes, flooding for {args.seconds:g} s "
          f"into a reader of {args.rate:g} MiB/s", file=sys.stderr)

    failures = []
    ended_early = procs.wait_for_exits([p], start + args.seconds)
    took = None
    if ended_early:
        failures.append(f"rlaunch ended before the SIGINT, after {time.monotonic() - start:.1f} s")
    else:
        flooded = time.monotonic() - start
        job = live_job_processes()
        sampler.stop.set()
        sampler.join()
        sampler.sample()  # the last look before the end
        sent = time.monotonic()
        os.killpg(p.pid, signal.SIGINT)
        gone = wait_all_gone(job, sent + HANG)
        if gone is None:
            failures.append(f"still running {HANG:g} s after the SIGINT")
            procs.kill_all_descendants()
        else:
            took = gone - sent
    sampler.stop.set()
    sampler.join()
    code = p.wait()
    # Whatever outlived rlaunch is an orphan of this script by now.
    deadline = time.monotonic() + LEFTOVER_WAIT
    left = live_job_processes()
    while left and time.monotonic() < deadline:
        time.sleep(0.05)
        procs.reap_orphans()
        left = live_job_processes()
    if left:
        table = procs.process_table()
        names = sorted({table.get(q, (0, "?"))[1] for q in left})
        failures.append(f"{len(left)} process(es) left {LEFTOVER_WAIT:g} s after the end: {', '.join(names)}")
        procs.kill_all_descendants()
    procs.reap_orphans()
    reader.join(HANG)
    stderr.join(HANG)
    if reader.is_alive():
        failures.append("rlaunch's stdout never reached end of file")

    c, m = reader.checker, sampler.memory
    heard = len(c.next_seq)
    largest = max(m.proxy_hwm.values(), default=0)
    if c.bad:
        failures.append(f"{c.bad} bad line(s): " + "; ".join(c.examples))
    if code != 130:
        failures.append(f"rlaunch {procs.describe_status(code)}, not exit 130")
    if stderr.lines != ["rlaunch: interrupted by SIGINT"]:
        failures.append(f"rlaunch's stderr: {stderr.lines[:5]}")
    if took is not None and took > grace + args.margin:
        failures.append(f"the end took {took:.2f} s after the SIGINT, past {grace:g} s + {args.margin:g} s")
    if m.rlaunch_hwm > args.max_rlaunch_mib * 1024:
        failures.append(f"rlaunch's peak RSS {kib(m.rlaunch_hwm)} is past {args.max_rlaunch_mib:g} MiB")
    if largest > args.max_proxy_mib * 1024:
        failures.append(f"a proxy's peak RSS {kib(largest)} is past {args.max_proxy_mib:g} MiB")

    rows = [
        ("ranks", args.ranks),
        ("nodes", args.nodes),
        ("seconds of flooding", "-" if ended_early else f"{flooded:.1f}"),
        ("reader rate", f"{args.rate:g} MiB/s"),
        ("bytes read", f"{reader.bytes:,}"),
        ("lines read", f"{c.lines:,}"),
        ("ranks heard from", heard),
        # rlaunch fills n1's slots first, then n2's, ...
        ("nodes heard from", len({r // slots for r in c.next_seq})),
        ("lines per rank, min / median / max", spread(c.next_seq, args.ranks)),
        ("lines checked bad", c.bad),
        ("rlaunch peak RSS (VmHWM)", kib(m.rlaunch_hwm)),
        ("rlaunch largest sampled VmRSS", kib(m.rlaunch_rss)),
        ("largest proxy peak RSS (VmHWM)", kib(largest)),
        ("proxies sampled", len(m.proxy_hwm)),
        ("sum of proxies' VmRSS, largest sample", kib(m.proxies_sum)),
        ("SIGINT to the end of everything", "-" if took is None else f"{took:.2f} s"),
        ("kill grace", f"{grace:g} s"),
        ("rlaunch's exit", procs.describe_status(code)),
        ("rlaunch's stderr lines", len(stderr.lines)),
        ("leftovers", len(left)),
    ]
    width = max(len(name) for name, _ in rows)
    for name, value in rows:
        print(f"{name:<{width}}  {value}")
    series = m.series
    if len(series) >= 4:
        # Bounded, not just small: the second half of the run against the first.
        half = len(series) // 2
        first = max(s[1] for s in series[:half]), max(s[2] for s in series[:half])
        second = max(s[1] for s in series[half:]), max(s[2] for s in series[half:])
        print(f"{'rlaunch VmRSS, 1st / 2nd half':<{width}}  {kib(first[0])} / {kib(second[0])}")
        print(f"{'proxies sum, 1st / 2nd half':<{width}}  {kib(first[1])} / {kib(second[1])}")
    for failure in failures:
        print(f"FAIL: {failure}", file=sys.stderr)
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main()
