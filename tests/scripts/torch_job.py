"""A torch.distributed job as users write it for torchrun: init_process_group("gloo") with the
default env://, and nothing of rlaunch's.

Usage: torch_job.py allreduce        each rank prints `rank R of N local L of M group G of K
                                     sum S` (S: the all_reduce of the ranks' ids)
       torch_job.py train            DDP over the ranks' shards of one batch; rank 0 prints
                                     `params ...`, every rank `digest R HEX` of its parameters
       torch_job.py reference        the same training in one process over the whole batch
       torch_job.py raise            rank 1 raises under torch's @record
       torch_job.py wait             prints `ready R`, waits; Ctrl-C: `cleanup R`, re-raised
       torch_job.py hang             rank 1 sleeps in late_rank(); the others print `waiting R`
                                     and wait for it in all_reduce (the hang report's stacks)
       torch_job.py resume DIR       `train` with a checkpoint in DIR after every step, started
                                     from it if it is there; in the first attempt
                                     (TORCHELASTIC_RESTART_COUNT 0) rank 1 dies at step 5. Each
                                     rank prints `attempt A rank R from step S`, rank 0 `params`
"""
import hashlib
import os
import sys

import torch
import torch.distributed as dist

STEPS = 20
SAMPLES = 48


def batch():
    gen = torch.Generator().manual_seed(7)
    x = torch.randn(SAMPLES, 4, generator=gen, dtype=torch.float64)
    y = x @ torch.tensor([[1.5], [-2.0], [0.5], [3.0]], dtype=torch.float64) + 0.25
    return x, y


def model():
    torch.manual_seed(11)
    return torch.nn.Linear(4, 1).double()


def train(net, x, y):
    opt = torch.optim.SGD(net.parameters(), lr=0.05)
    for _ in range(STEPS):
        opt.zero_grad()
        loss = torch.nn.functional.mse_loss(net(x), y)
        loss.backward()
        opt.step()
    return [p.detach() for p in net.parameters()]


def show(params):
    return " ".join(f"{v:.12f}" for p in params for v in p.flatten().tolist())


what = sys.argv[1]
if what == "reference":
    x, y = batch()
    print("params", show(train(model(), x, y)))
    sys.exit(0)

if what == "raise":
    from torch.distributed.elastic.multiprocessing.errors import record

    @record
    def main():
        if int(os.environ["RANK"]) == 1:
            raise ValueError("rank one cannot go on")

    main()
    sys.exit(0)

dist.init_process_group("gloo")
rank, size = dist.get_rank(), dist.get_world_size()
if what == "allreduce":
    t = torch.tensor([rank], dtype=torch.int64)
    dist.all_reduce(t)
    env = os.environ
    print(
        f"rank {rank} of {size} local {env['LOCAL_RANK']} of {env['LOCAL_WORLD_SIZE']} "
        f"group {env['GROUP_RANK']} of {env['GROUP_WORLD_SIZE']} sum {t.item()}",
        flush=True,
    )
elif what == "wait":
    import time

    # Ready only once inside the try: a Ctrl-C right after the line is still caught.
    try:
        print(f"ready {rank}", flush=True)
        time.sleep(60)
    except KeyboardInterrupt:
        print(f"cleanup {rank}", flush=True)
        raise
elif what == "hang":
    import time

    def late_rank():
        while True:
            time.sleep(100)

    if rank == 1:
        late_rank()
    print(f"waiting {rank}", flush=True)
    dist.all_reduce(torch.tensor([rank], dtype=torch.int64))
elif what == "resume":
    ckpt = os.path.join(sys.argv[2], "ckpt.pt")
    x, y = batch()
    shard = SAMPLES // size
    xs, ys = x[rank * shard:(rank + 1) * shard], y[rank * shard:(rank + 1) * shard]
    net, start = model(), 0
    if os.path.exists(ckpt):
        state = torch.load(ckpt)
        net.load_state_dict(state["model"])
        start = state["step"]
    attempt = os.environ["TORCHELASTIC_RESTART_COUNT"]
    print(f"attempt {attempt} rank {rank} from step {start}", flush=True)
    ddp = torch.nn.parallel.DistributedDataParallel(net)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.05)
    for step in range(start, STEPS):
        if step == 5 and rank == 1 and attempt == "0":
            os._exit(1)
        opt.zero_grad()
        torch.nn.functional.mse_loss(ddp(xs), ys).backward()
        opt.step()
        if rank == 0:
            torch.save({"model": net.state_dict(), "step": step + 1}, ckpt + ".tmp")
            os.replace(ckpt + ".tmp", ckpt)
        # No rank starts the next step before this one's checkpoint is whole.
        dist.barrier()
    if rank == 0:
        print("params", show([p.detach() for p in net.parameters()]), flush=True)
elif what == "train":
    x, y = batch()
    shard = SAMPLES // size
    net = torch.nn.parallel.DistributedDataParallel(model())
    params = train(net, x[rank * shard:(rank + 1) * shard], y[rank * shard:(rank + 1) * shard])
    digest = hashlib.sha256(b"".join(p.numpy().tobytes() for p in params)).hexdigest()
    print(f"digest {rank} {digest}", flush=True)
    if rank == 0:
        print("params", show(params), flush=True)
dist.destroy_process_group()
