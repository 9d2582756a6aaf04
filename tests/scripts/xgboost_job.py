"""An XGBoost job as users write it for a rabit tracker, each worker training `hist` trees
on its share of the rows. XGBoost 1.7 joins with `xgboost.collective.init()`, reading
DMLC_TRACKER_URI, DMLC_TRACKER_PORT and DMLC_TASK_ID itself; XGBoost from 2.1 reads no
variables, and is given them as arguments (the two lines docs/frameworks.md shows).

Usage: xgboost_job.py train        every worker prints `model R SHA256` and `rmse R VALUE`
                                   (the model's error on the whole data set)
       xgboost_job.py alone        the same training in one process over every row
       xgboost_job.py garbage      as train, but rank 0 first sends the tracker garbage
       xgboost_job.py die          as train, but rank 1 kills itself after joining
       xgboost_job.py restart      as die in the job's first attempt (TORCHELASTIC_RESTART_COUNT
                                   0, `--max-restarts`), as train in the next
       xgboost_job.py error        rank 1 reports an error to the tracker (XGBoost 2.1+)
       xgboost_job.py skip         rank 1 exits with 0 before it joins
       xgboost_job.py late         rank 1 prints `late 1 PID` and sleeps before it joins; the
                                   others print `joining R` and wait for it (hang reports)
"""
import hashlib
import os
import signal
import socket
import sys

import numpy as np
import xgboost as xgb

ROWS = 2000
PARAMS = {"tree_method": "hist", "objective": "reg:squarederror", "max_depth": 4, "eta": 0.3,
          "seed": 0, "nthread": 1}


def data():
    rng = np.random.default_rng(5)
    x = rng.normal(size=(ROWS, 6))
    y = 2.0 * x[:, 0] - x[:, 1] ** 2 + np.sin(x[:, 2]) + 0.1 * rng.normal(size=ROWS)
    return x, y


def rmse(booster, x, y):
    pred = booster.predict(xgb.DMatrix(x))
    return float(np.sqrt(np.mean((pred - y) ** 2)))


what = sys.argv[1]
x, y = data()
if what == "alone":
    booster = xgb.train(PARAMS, xgb.DMatrix(x, label=y), num_boost_round=20)
    print(f"rmse alone {rmse(booster, x, y):.6f}", flush=True)
    sys.exit(0)

# The rank rlaunch gave (a hand-started tracker hands out its own: bench/xgb_tracker.py).
rank = int(os.environ.get("DMLC_TASK_ID") or os.environ["RANK"])
if what == "garbage" and rank == 0:
    # A stranger on the tracker's port: it must not disturb the job.
    with socket.create_connection((os.environ["DMLC_TRACKER_URI"],
                                   int(os.environ["DMLC_TRACKER_PORT"]))) as s:
        s.sendall(b"GET / HTTP/1.0\r\n\r\n")
if what == "skip" and rank == 1:
    sys.exit(0)
if what == "late" and rank == 1:
    import time

    print(f"late 1 {os.getpid()}", flush=True)
    while True:
        time.sleep(100)
if what == "late":
    print(f"joining {rank}", flush=True)
DMLC = ("DMLC_TRACKER_URI", "DMLC_TRACKER_PORT", "DMLC_TASK_ID")
if tuple(int(v) for v in xgb.__version__.split(".")[:2]) >= (2, 1):
    args = {k.lower(): int(v) if k.endswith("PORT") else v for k, v in os.environ.items() if k in DMLC}
    xgb.collective.init(**args)
else:
    xgb.collective.init()
if what == "error" and rank == 1:
    xgb.collective.signal_error()
    sys.exit(3)
size = xgb.collective.get_world_size()
if "DMLC_TASK_ID" in os.environ:
    assert xgb.collective.get_rank() == rank, (xgb.collective.get_rank(), rank)
rank = xgb.collective.get_rank()
first_attempt = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0") == "0"
if rank == 1 and (what == "die" or (what == "restart" and first_attempt)):
    os.kill(os.getpid(), signal.SIGKILL)
share = slice(rank * ROWS // size, (rank + 1) * ROWS // size)
booster = xgb.train(PARAMS, xgb.DMatrix(x[share], label=y[share]), num_boost_round=20)
model = hashlib.sha256(booster.save_raw()).hexdigest()
xgb.collective.communicator_print(f"worker {rank} of {size} trained\n")
print(f"model {rank} {model}", flush=True)
print(f"rmse {rank} {rmse(booster, x, y):.6f}", flush=True)
xgb.collective.finalize()
