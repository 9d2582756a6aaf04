"""A multi-process JAX job on CPU as users write it, with nothing of rlaunch's.

Usage: jax_job.py explicit   jax.distributed.initialize(num_processes=WORLD_SIZE,
                             process_id=RANK), the coordinator from JAX_COORDINATOR_ADDRESS
       jax_job.py auto       jax.distributed.initialize() with no arguments (inside Slurm:
                             JAX's own Slurm detection)

Each process prints `process I of N sum S gathered G coordinator A`: I and N from JAX,
S the sum of every process's I+1 computed by a jitted reduction over a global array sharded
one element per process, G the processes' ids gathered by multihost_utils.
"""
import os
import sys

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import multihost_utils
from jax.sharding import Mesh, NamedSharding, PartitionSpec

if sys.argv[1] == "explicit":
    jax.distributed.initialize(num_processes=int(os.environ["WORLD_SIZE"]),
                               process_id=int(os.environ["RANK"]))
else:
    jax.distributed.initialize()

me, count = jax.process_index(), jax.process_count()
mesh = Mesh(np.array(jax.devices()), ("p",))
mine = np.full(len(jax.local_devices()), me + 1.0)
spread = jax.make_array_from_process_local_data(NamedSharding(mesh, PartitionSpec("p")), mine)
total = jax.jit(jnp.sum, out_shardings=NamedSharding(mesh, PartitionSpec()))(spread)
gathered = multihost_utils.process_allgather(jnp.array([me]))
print(f"process {me} of {count} sum {float(total.addressable_data(0)):g} "
      f"gathered {','.join(str(int(v)) for v in np.ravel(gathered))} "
      f"coordinator {os.environ.get('JAX_COORDINATOR_ADDRESS', '-')}", flush=True)
jax.distributed.shutdown()
