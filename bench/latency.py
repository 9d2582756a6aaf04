#!/usr/bin/env python3
"""Link latency for the fake ssh cluster (tests/cluster/cluster.sh), without netem.

This kernel has no netem (CONFIG_NET_SCH_NETEM is not set), so the latency goes into ssh
instead: bench/delay.c is a TCP relay that holds every chunk, each way, for a fixed time, and
an ssh config that names it as `ProxyCommand` sends every connection through it. The relay
runs where the ssh client runs: on the head for rlaunch's own ssh, inside node nI's network
namespace for the ssh an interior proxy of a tree runs (the nodes share this filesystem, so
the same binary and config serve both). Every control link of an ssh tree then has a round
trip 2 x ONE_WAY_USEC longer.

    python3 bench/latency.py config DIR ONE_WAY_USEC    # prints DIR/ssh_config-delay-USEC
    python3 bench/latency.py exec DIR ONE_WAY_USEC      # prints env SHELL=/bin/sh ssh -F ...
    python3 bench/latency.py rtt CONFIG [HOST] [-n 200] # median round trip of 1 byte over ssh

    rlaunch --launcher ssh --launcher-exec "$(python3 bench/latency.py exec DIR 50)" \\
        --hosts n1,n2,n3,n4 --tree-width 1 -n 4 hostname        # 0.1 ms more per link

Use `env SHELL=/bin/sh ssh -F CONFIG` (launcher_exec()), not plain `ssh -F CONFIG`: ssh runs
a ProxyCommand with `$SHELL -c`, and inside a node that is bash with SSH_CLIENT set and
SHLVL=0 (the proxy's environment), so bash reads root's ~/.bashrc first (pyenv init here:
~60 ms a hop, more than the latency itself). /bin/sh reads nothing. SHELL is not sent to the
remote side: the ranks still see the login shell.

Compare delayed runs with ONE_WAY_USEC=0, not with DIR/ssh_config: the relay's own hop costs
a little, and its socket has TCP_NODELAY, which spares ssh's handshake the Nagle/delayed-ACK
stalls of a direct connection (~40 ms a connection here; `--nagle` keeps them).

From Python: build_delay(), delayed_ssh_config(cluster_dir, one_way_usec),
launcher_exec(config), echo_rtts(config). Standard library only.
"""

import argparse
import os
import shlex
import statistics
import subprocess
import sys
import time

BENCH = os.path.dirname(os.path.abspath(__file__))
BUILD = os.path.join(BENCH, "build")
DELAY_SRC = os.path.join(BENCH, "delay.c")
DELAY = os.path.join(BUILD, "delay")


def build_delay():
    """bench/build/delay, compiled from bench/delay.c when missing or older than it."""
    if os.path.exists(DELAY) and os.path.getmtime(DELAY) >= os.path.getmtime(DELAY_SRC):
        return DELAY
    os.makedirs(BUILD, exist_ok=True)
    tmp = f"{DELAY}.{os.getpid()}.tmp"
    argv = ["cc", "-std=c11", "-O2", "-Wall", "-Wextra", "-o", tmp, DELAY_SRC]
    if subprocess.run(argv).returncode != 0:
        raise RuntimeError("building bench/build/delay failed: " + " ".join(argv))
    os.replace(tmp, DELAY)  # atomic: a relay already running keeps its old binary
    return DELAY


def delayed_ssh_config(cluster_dir, one_way_usec, nagle=False):
    """DIR/ssh_config-delay-USEC: DIR/ssh_config (cluster.sh's) with every connection sent
    through bench/build/delay USEC, everything else as it was. Returns its absolute path.

    The relay's socket has TCP_NODELAY, as the relays of `ssh -W` have: the handshake then
    skips the Nagle/delayed-ACK stalls (~40 ms a connection here) that ssh's own socket has
    until its session starts, so even USEC=0 is faster than DIR/ssh_config: compare delayed
    runs with USEC=0, not with the plain config. nagle=True (DIR/ssh_config-delay-USEC-nagle)
    leaves Nagle on, as ssh's own socket has it in the handshake (and ssh turns it off after)."""
    usec = int(one_way_usec)
    if usec < 0:
        raise ValueError(f"one-way delay must be >= 0 us, got {usec}")
    cluster_dir = os.path.abspath(cluster_dir)
    with open(os.path.join(cluster_dir, "ssh_config")) as f:
        base = f.read()
    delay = build_delay()
    if "%" in delay:
        raise ValueError(f"{delay}: a '%' would be taken for one of ssh's tokens")
    # ssh takes the first value it finds for each option, whichever block gives it: a
    # `Host *` block in front sets ProxyCommand for every host, and the host entries below it
    # still give HostName (which %h is) and the rest.
    text = (
        f"# {os.path.join(cluster_dir, 'ssh_config')} with {usec} us more each way on every\n"
        f"# connection (written by bench/latency.py; bench/delay.c)\n"
        f"Host *\n"
        f"    ProxyCommand {'env DELAY_NAGLE=1 ' if nagle else ''}{shlex.quote(delay)} {usec} %h %p\n\n"
        + base
    )
    path = os.path.join(cluster_dir, f"ssh_config-delay-{usec}" + ("-nagle" if nagle else ""))
    tmp = f"{path}.{os.getpid()}.tmp"
    with open(tmp, "w") as f:
        f.write(text)
    os.replace(tmp, path)
    return path


def launcher_exec(config):
    """The --launcher-exec for CONFIG: ssh with its ProxyCommand run by /bin/sh (see above)."""
    return f"env SHELL=/bin/sh ssh -F {shlex.quote(config)}"


def echo_rtts(config, host="n1", n=200, warmup=20):
    """Round trips of 1 byte through `ssh -F CONFIG HOST cat`, one ssh session, one byte at a
    time: n times in microseconds, after `warmup` unmeasured ones."""
    p = subprocess.Popen(["ssh", "-F", config, host, "cat"], stdin=subprocess.PIPE, stdout=subprocess.PIPE, bufsize=0)
    try:
        fin, fout = p.stdin.fileno(), p.stdout.fileno()
        times = []
        for i in range(warmup + n):
            t0 = time.perf_counter_ns()
            os.write(fin, b"x")
            if os.read(fout, 1) != b"x":
                raise RuntimeError(f"ssh {host} cat: echo lost (exit {p.poll()})")
            if i >= warmup:
                times.append((time.perf_counter_ns() - t0) / 1000)
        p.stdin.close()
        if p.wait(timeout=10) != 0:
            raise RuntimeError(f"ssh {host} cat: exit {p.returncode}")
        return times
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    c = sub.add_parser("config", help="write DIR/ssh_config-delay-USEC and print its path")
    c.add_argument("dir")
    c.add_argument("one_way_usec", type=int)
    c.add_argument("--nagle", action="store_true", help="leave Nagle on in the relay's socket")
    e = sub.add_parser("exec", help="write the config and print the --launcher-exec that uses it")
    e.add_argument("dir")
    e.add_argument("one_way_usec", type=int)
    e.add_argument("--nagle", action="store_true", help="leave Nagle on in the relay's socket")
    r = sub.add_parser("rtt", help="median round trip of 1 byte through ssh -F CONFIG HOST cat")
    r.add_argument("config")
    r.add_argument("host", nargs="?", default="n1")
    r.add_argument("-n", type=int, default=200)
    args = ap.parse_args()
    if args.cmd == "config":
        print(delayed_ssh_config(args.dir, args.one_way_usec, args.nagle))
    elif args.cmd == "exec":
        print(launcher_exec(delayed_ssh_config(args.dir, args.one_way_usec, args.nagle)))
    else:
        t = sorted(echo_rtts(args.config, args.host, args.n))
        q = lambda f: t[min(len(t) - 1, int(f * len(t)))]  # noqa: E731
        print(f"{args.config} {args.host}: median {statistics.median(t):.0f} us "
              f"(p10 {q(0.1):.0f}, p90 {q(0.9):.0f}, n={len(t)})")


if __name__ == "__main__":
    sys.exit(main())
