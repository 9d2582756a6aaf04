#!/usr/bin/env python3
"""XGBoost 1.7's own tracker (Debian's python3-xgboost), started by hand beside the workers,
as users do without rlaunch: the tracker in this process, then N workers with its
worker_envs() (the tracker hands out the ranks), either under rlaunch (`rlaunch`) or started straight from
here (`direct`, the floor), then the tracker joined.

    xgb_tracker.py rlaunch|direct RLAUNCH N PROGRAM [ARGS...]

With XGB_TRACKER_SPAN=FILE, appends to FILE the tracker's own work in seconds: from its first
worker's connection to every worker's links assigned (its "All of N nodes getting started"),
what rlaunch's --report calls job.tracker.
"""
import logging
import os
import subprocess
import sys
import time

from xgboost.tracker import RabitTracker


class Timed:
    """The tracker's listening socket, noting when it first accepted."""

    def __init__(self, sock):
        self.sock, self.first = sock, None

    def accept(self):
        pair = self.sock.accept()
        if self.first is None:
            self.first = time.monotonic()
        return pair

    def __getattr__(self, name):
        return getattr(self.sock, name)


class AllStarted(logging.Handler):
    """Notes when the tracker logs that every worker has its links."""

    at = None

    def emit(self, record):
        if "getting started" in record.getMessage():
            self.at = time.monotonic()


how, rlaunch, n, argv = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4:]
tracker = RabitTracker(host_ip="127.0.0.1", n_workers=n)
tracker.sock = Timed(tracker.sock)
started = AllStarted()
logging.getLogger().addHandler(started)
logging.getLogger().setLevel(logging.INFO)
tracker.start(n)
# What dmlc-submit's launchers add: without the worker count, 1.7 runs each worker alone.
envs = {k: str(v) for k, v in tracker.worker_envs().items()}
envs.update(DMLC_NUM_WORKER=str(n), DMLC_ROLE="worker")
if how == "rlaunch":
    # rlaunch's ranks take their task id from their rank: the same DMLC_TASK_ID either way.
    env = dict(os.environ, **envs)
    code = subprocess.call([rlaunch, "-n", str(n), *argv], env=env, stdout=subprocess.DEVNULL)
else:
    procs = [subprocess.Popen(argv, env=dict(os.environ, **envs, RANK=str(r)),
                              stdout=subprocess.DEVNULL) for r in range(n)]
    code = next((c for c in (p.wait() for p in procs) if c), 0)
tracker.join()
if os.environ.get("XGB_TRACKER_SPAN") and tracker.sock.first and started.at:
    with open(os.environ["XGB_TRACKER_SPAN"], "a") as f:
        f.write(f"{started.at - tracker.sock.first:.6f}\n")
sys.exit(code)
