#!/usr/bin/env python3
"""The floor of a framework job: N processes started straight from here with torchrun's
variables (RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, MASTER_PORT on a free loopback port),
and waited for; no launcher. Exits with the first failure's status.

    direct.py N PROGRAM [ARGS...]
"""
import os
import socket
import subprocess
import sys

n, argv = int(sys.argv[1]), sys.argv[2:]
with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
procs = []
for rank in range(n):
    env = dict(os.environ, RANK=str(rank), WORLD_SIZE=str(n), LOCAL_RANK=str(rank),
               LOCAL_WORLD_SIZE=str(n), GROUP_RANK="0", GROUP_WORLD_SIZE="1",
               MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    procs.append(subprocess.Popen(argv, env=env, stdout=subprocess.DEVNULL))
codes = [p.wait() for p in procs]
sys.exit(next((c for c in codes if c), 0))
