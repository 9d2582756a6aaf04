"""dask-mpi's batch example, as its documentation runs it (`mpirun -np 4 python script.py`):
rank 0 the scheduler, rank 1 this client, the others workers. Prints `sum S workers W`.
"""
from dask_mpi import initialize

initialize()

import dask.array as da  # noqa: E402
from dask.distributed import Client  # noqa: E402

client = Client()
total = int(da.arange(1000, chunks=100).sum().compute())
print("sum", total, "workers", len(client.scheduler_info()["workers"]), flush=True)
