"""A Python job that hangs, for the hang report's Python frames (tests/tests/hangs.rs).

Every rank starts a thread `helper` that sleeps in waits_for_ever(), prints `ready R`, then
rank 1 spins in spins() and the others sleep in waits_for_ever(). Lines matter: the test
finds them by their text.
"""
import os
import threading
import time


def waits_for_ever():
    while True:
        time.sleep(100)


def spins():
    n = 0
    while True:
        n += 1


rank = int(os.environ["PMI_RANK"])
threading.Thread(target=waits_for_ever, name="helper", daemon=True).start()
print(f"ready {rank}", flush=True)
if rank == 1:
    spins()
else:
    waits_for_ever()
