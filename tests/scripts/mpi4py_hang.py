"""An mpi4py job that hangs (tests/tests/hangs.rs): every rank prints `ready R`; rank 1
then sleeps in late_rank() while the others wait for it in MPI_Barrier, inside mpi4py's C
extension and Open MPI."""
import time

from mpi4py import MPI


def late_rank():
    while True:
        time.sleep(100)


comm = MPI.COMM_WORLD
print(f"ready {comm.Get_rank()}", flush=True)
if comm.Get_rank() == 1:
    late_rank()
comm.Barrier()
