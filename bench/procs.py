"""Running commands for the benchmark harness: timing, leftovers, and memory sampling.

Each run starts its processes with the harness's never-closing stdin, waits for them under a
timeout, and then sweeps: the harness is a child subreaper, so anything the run left behind has
been reparented to it and is found, reported and killed before the next run starts.
"""

import fcntl
import os
import resource
import select
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field


F_SETPIPE_SZ = getattr(fcntl, "F_SETPIPE_SZ", 1031)


def log(msg):
    print(msg, file=sys.stderr, flush=True)


def built_dir(root, profile="release"):
    """Where cargo puts a profile's binaries: target/<host triple>/<profile> (.cargo/config.toml
    names the target, so that the binaries link statically)."""
    out = subprocess.run(["rustc", "-vV"], capture_output=True, text=True, check=True).stdout
    triple = next(l.split(":", 1)[1].strip() for l in out.splitlines() if l.startswith("host:"))
    return os.path.join(root, "target", triple, profile)

# ---------------------------------------------------------------------------------------------
# Processes: the never-closing stdin, descendants, leftovers.


class Stdin:
    """The stdin every command gets: a pipe nobody writes to and whose writer stays open."""

    read_fd = -1
    write_fd = -1

    @classmethod
    def open(cls):
        cls.read_fd, cls.write_fd = os.pipe()

    @classmethod
    def close(cls):
        for fd in (cls.read_fd, cls.write_fd):
            if fd >= 0:
                os.close(fd)
        cls.read_fd = cls.write_fd = -1


def process_table():
    """Maps pid -> (ppid, comm) for every process now visible in /proc."""
    table = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as f:
                stat = f.read()
        except OSError:
            continue
        # comm may contain spaces and parentheses: it ends at the last ')'.
        lpar, rpar = stat.index(b"("), stat.rindex(b")")
        fields = stat[rpar + 2 :].split()
        table[int(entry)] = (int(fields[1]), stat[lpar + 1 : rpar].decode(errors="replace"))
    return table


def descendants(root, table=None):
    """Pids of every live descendant of root, parents before children."""
    table = process_table() if table is None else table
    children = {}
    for pid, (ppid, _) in table.items():
        children.setdefault(ppid, []).append(pid)
    found, queue = [], [root]
    while queue:
        for child in children.get(queue.pop(0), []):
            found.append(child)
            queue.append(child)
    return found


def reap_orphans():
    """Reaps every exited child. Only call when no Popen of ours is still unwaited."""
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return


def is_zombie(pid):
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            return f.read().rsplit(b")", 1)[1].split()[0] == b"Z"
    except OSError:
        return True


def kill_all_descendants():
    """SIGKILLs everything this harness started, until nothing is left."""
    for _ in range(50):
        pids = [p for p in descendants(os.getpid()) if not is_zombie(p)]
        if not pids:
            return
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        time.sleep(0.02)


def sweep_leftovers(grace=2.0):
    """After a run: waits up to `grace` s for stray processes to end, then kills them.

    Returns how many had to be killed. Call only when every Popen of the run has been waited.
    """
    deadline = time.monotonic() + grace
    while True:
        reap_orphans()
        live = [p for p in descendants(os.getpid()) if not is_zombie(p)]
        if not live:
            return 0
        if time.monotonic() > deadline:
            table = process_table()
            names = sorted({table.get(p, (0, "?"))[1] for p in live})
            log(f"  warning: {len(live)} process(es) outlived the run ({', '.join(names)}); killing them")
            kill_all_descendants()
            reap_orphans()
            return len(live)
        time.sleep(0.01)


# ---------------------------------------------------------------------------------------------
# One run of one command.


@dataclass
class Command:
    """One way of doing a case's work.

    `procs` start together and share one stdout; with `reader`, that stdout is a pipe into the
    reader (e.g. `wc -c`), whose stdout must equal `expect` (stripped) when it is set.
    """

    label: str
    procs: list
    reader: list = None
    expect: str = None
    timeout: float = 120.0
    pipe_size: int = 0  # with a reader: F_SETPIPE_SZ for the pipe into it (0: the default 64 KiB)
    # Called as after(succeeded) once every run is over and swept, outside the timed part: to
    # check what the run left (files it copied) and remove it. A string it returns fails a run
    # that had succeeded.
    after: object = None


@dataclass
class RunResult:
    """How one run ended: `seconds` when it succeeded, else `failure` says why."""

    seconds: float = None
    failure: str = None
    output: str = ""
    leftovers: int = 0
    # CPU time (user + system) of everything the run started: every descendant is reaped by
    # its parent or, reparented, by this subreaper, so RUSAGE_CHILDREN grows by all of it.
    cpu: float = None


def describe_status(code):
    if code < 0:
        try:
            return f"killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"killed by signal {-code}"
    return f"exit {code}"


def first_line(path):
    try:
        with open(path, errors="replace") as f:
            for line in f:
                if line.strip():
                    return line.strip()[:110]
    except OSError:
        pass
    return ""


def wait_for_exits(procs, deadline):
    """Blocks until every process has exited (not reaped); False if the deadline came first.

    Not Popen.wait(timeout=...): that polls with sleeps doubling from 0.5 ms up to 50 ms, which
    would quantize every measured time to 0.5, 1.5, 3.5, 7.5, ..., 63.5, 113.5, 163.5 ms.
    A pidfd becomes readable the moment its process exits.
    """
    poller = select.poll()
    pidfds = [os.pidfd_open(p.pid) for p in procs]
    try:
        for fd in pidfds:
            poller.register(fd, select.POLLIN)
        pending = set(pidfds)
        while pending:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return False
            for fd, _ in poller.poll(remaining * 1000):
                pending.discard(fd)
                poller.unregister(fd)
        return True
    finally:
        for fd in pidfds:
            os.close(fd)


def run(cmd, scratch):
    """Runs cmd once, timing it from the first spawn to the last exit; then its `after`."""
    r = run_timed(cmd, scratch)
    if cmd.after is not None:
        why = cmd.after(r.failure is None)
        if why and r.failure is None:
            return RunResult(failure=why, output=r.output, leftovers=r.leftovers)
    return r


def children_cpu():
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def run_timed(cmd, scratch):
    err_path = os.path.join(scratch, "stderr")
    procs = []
    timed_out = False
    cpu_before = children_cpu()
    with open(err_path, "wb") as err:
        start = time.perf_counter()
        try:
            if cmd.reader:
                rd, wr = os.pipe()
                if cmd.pipe_size:
                    fcntl.fcntl(wr, F_SETPIPE_SZ, cmd.pipe_size)
                for argv in cmd.procs:
                    procs.append(subprocess.Popen(argv, stdin=Stdin.read_fd, stdout=wr, stderr=err))
                os.close(wr)
                reader = subprocess.Popen(cmd.reader, stdin=rd, stdout=subprocess.PIPE, stderr=err)
                os.close(rd)
                procs.append(reader)
            else:
                for argv in cmd.procs:
                    procs.append(
                        subprocess.Popen(argv, stdin=Stdin.read_fd, stdout=subprocess.DEVNULL, stderr=err)
                    )
            timed_out = not wait_for_exits(procs, time.monotonic() + cmd.timeout)
            seconds = time.perf_counter() - start
            if timed_out:
                kill_all_descendants()
            for p in procs:
                p.wait()
        except OSError as e:
            kill_all_descendants()
            for p in procs:
                p.wait()
            return RunResult(failure=f"cannot start {cmd.procs[0][0]}: {e.strerror}")
    output = procs[-1].stdout.read().decode(errors="replace").strip() if cmd.reader else ""
    if cmd.reader:
        procs[-1].stdout.close()
    leftovers = sweep_leftovers()
    if timed_out:
        return RunResult(failure=f"timed out after {cmd.timeout:g} s", leftovers=leftovers)
    for p in procs:
        if p.returncode != 0:
            why = first_line(err_path)
            return RunResult(
                failure=describe_status(p.returncode) + (f": {why}" if why else ""), leftovers=leftovers
            )
    if cmd.expect is not None and output != cmd.expect:
        return RunResult(failure=f"output {output!r}, expected {cmd.expect!r}", leftovers=leftovers)
    cpu = children_cpu() - cpu_before
    return RunResult(seconds=seconds, output=output, leftovers=leftovers, cpu=cpu)


# ---------------------------------------------------------------------------------------------
# Memory: VmHWM of the launcher and its proxies while every rank is alive, then to their end.


def vm_kib(pid):
    """(VmRSS, VmHWM) of the process in KiB, or None once it is gone or a zombie."""
    found = {}
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith(("VmRSS:", "VmHWM:")):
                    found[line[:5]] = int(line.split()[1])
    except OSError:
        return None
    if len(found) < 2:
        return None
    return found["VmRSS"], found["VmHWM"]


def vm_hwm_kib(pid):
    """The process's peak RSS in KiB, or None once it is gone or a zombie."""
    sizes = vm_kib(pid)
    return sizes and sizes[1]


@dataclass
class Footprint:
    """Peak RSS (KiB) of a launcher process and of each of its proxies, or why it failed;
    `spliced` when the ranks' "ready" lines did not come out as whole lines."""

    launcher: int = None
    proxies: list = field(default_factory=list)
    failure: str = None
    spliced: bool = False


READY = b"ready\n"


def footprint(argv, ranks, proxy_comm, scratch, timeout=120.0):
    """Runs argv, whose ranks block on a FIFO after printing "ready", and samples VmHWM.

    The harness holds the FIFO open read-write, so a rank's open() succeeds at once and its
    read() blocks until the harness closes it. Once all `ranks` "ready" lines have come through
    the launcher (counted in bytes), the launcher and its proxies (descendants named `proxy_comm`) are found and
    sampled, the FIFO is closed, and sampling goes on every 5 ms until each process is gone,
    keeping its last value: VmHWM only grows, so that is its peak over its whole life.
    """
    fifo = os.path.join(scratch, "release")
    if os.path.exists(fifo):
        os.unlink(fifo)
    os.mkfifo(fifo)
    argv = [a.replace("{FIFO}", fifo) for a in argv]
    hold = os.open(fifo, os.O_RDWR)
    err_path = os.path.join(scratch, "stderr")
    with open(err_path, "wb") as err:
        p = subprocess.Popen(argv, stdin=Stdin.read_fd, stdout=subprocess.PIPE, stderr=err)
    out = p.stdout.fileno()
    deadline = time.monotonic() + timeout
    # Count bytes, not lines: a launcher may splice one rank's line into another's.
    expected = ranks * len(READY)
    output, eof = b"", False
    while len(output) < expected and not eof and time.monotonic() < deadline:
        readable, _, _ = select.select([out], [], [], 0.1)
        if readable:
            chunk = os.read(out, 65536)
            eof = not chunk
            output += chunk
    if len(output) < expected:
        os.close(hold)
        kill_all_descendants()
        p.wait()
        p.stdout.close()
        sweep_leftovers()
        why = "timed out" if not eof else describe_status(p.returncode) + ": " + first_line(err_path)
        return Footprint(failure=f"{len(output) // len(READY)}/{ranks} ranks ready; {why}")
    spliced = output != READY * ranks
    table = process_table()
    names = (proxy_comm,) if isinstance(proxy_comm, str) else tuple(proxy_comm)
    proxies = [q for q in descendants(p.pid, table) if table[q][1] in names]
    tracked = [p.pid] + proxies
    last = {pid: vm_hwm_kib(pid) for pid in tracked}
    os.close(hold)  # every rank's read() now sees EOF
    alive = set(tracked)
    while alive and time.monotonic() < deadline:
        for pid in list(alive):
            value = vm_hwm_kib(pid)
            if value is None:
                alive.discard(pid)
            else:
                last[pid] = value
        if not eof:  # keep the launcher's stdout drained so it is never blocked on it
            readable, _, _ = select.select([out], [], [], 0.005)
            if readable:
                eof = not os.read(out, 65536)
        else:
            time.sleep(0.005)
    if alive:
        kill_all_descendants()
    p.wait()
    p.stdout.close()
    sweep_leftovers()
    if alive:
        return Footprint(failure="timed out after release")
    if p.returncode != 0:
        return Footprint(failure=describe_status(p.returncode) + ": " + first_line(err_path))
    return Footprint(
        launcher=last[p.pid], proxies=[last[q] for q in proxies if last[q] is not None], spliced=spliced
    )


# ---------------------------------------------------------------------------------------------
# Interference: what else happened on the machine while a case ran.


class Watch:
    """Notices CPU used by processes that are not ours, CPU stolen by the hypervisor, and the
    binaries under test being replaced (another build finishing mid-run) while a case runs.

    Our CPU is this process's plus every descendant's: everything we start is reaped by its
    parent or, orphaned, by us (we are a subreaper), so it all lands in os.times()'s children.
    """

    def __init__(self, binaries, threshold=0.05):
        self.binaries = binaries
        self.threshold = threshold
        self.start = self._sample()

    def _sample(self):
        with open("/proc/stat") as f:
            v = [int(x) for x in f.readline().split()[1:]]
        hz = os.sysconf("SC_CLK_TCK")
        busy = (v[0] + v[1] + v[2] + v[5] + v[6]) / hz  # user nice system irq softirq
        steal = (v[7] if len(v) > 7 else 0) / hz
        t = os.times()
        ours = t.user + t.system + t.children_user + t.children_system
        stamps = {}
        for path in self.binaries:
            try:
                st = os.stat(path)
                stamps[path] = (st.st_mtime_ns, st.st_size)
            except OSError:
                stamps[path] = None
        return time.monotonic(), busy, steal, ours, stamps

    def notes(self):
        """Warnings for the table, empty when the case ran undisturbed."""
        (w0, busy0, steal0, ours0, stamps0), (w1, busy1, steal1, ours1, stamps1) = self.start, self._sample()
        capacity = max(1e-9, (w1 - w0) * (os.cpu_count() or 1))
        notes = []
        foreign = ((busy1 - busy0) - (ours1 - ours0)) / capacity
        if foreign > self.threshold:
            notes.append(f"other processes used {foreign:.0%} of the CPUs during this case")
        steal = (steal1 - steal0) / capacity
        if steal > self.threshold:
            notes.append(f"the hypervisor stole {steal:.0%} of the CPUs during this case")
        changed = [os.path.basename(p) for p in self.binaries if stamps0[p] != stamps1[p]]
        if changed:
            notes.append(f"{', '.join(changed)} replaced during this case (rebuilt by someone else?)")
        return notes
