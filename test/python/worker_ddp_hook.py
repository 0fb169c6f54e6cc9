"""A worker for test_gpulaunch.py: a few DDP steps on Gloo, with
gpulaunch.allreduce_hook when HOOK=1; prints the parameters' sum of squares
and how long the hook's all-reduces were in flight (from the progress slot)."""

from __future__ import annotations

import mmap
import os
import struct
import sys
from typing import Any

import torch
import torch.distributed as dist

import gpulaunch


def main() -> None:
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(3)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4))
    ddp: Any = torch.nn.parallel.DistributedDataParallel(model)
    if os.environ.get("HOOK") == "1":
        ddp.register_comm_hook(None, gpulaunch.allreduce_hook)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.1)
    g = torch.Generator().manual_seed(100 + rank)
    for step in range(1, 6):
        x = torch.randn(8, 16, generator=g)
        loss = ddp(x).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        gpulaunch.progress(step)
    total = sum(float(p.detach().double().pow(2).sum()) for p in model.parameters())
    fd, slot = (int(v) for v in os.environ["GPULAUNCH_PROGRESS_SHM"].split(":"))
    m = mmap.mmap(fd, 128 * (2 + slot), prot=mmap.PROT_READ)
    # the slot's words: joined, beat, step_ns, step, steps, coll_ns, coll_since, colls
    words = struct.unpack_from("<QQQqQQQQ", m, 128 * (1 + slot))
    print(f"rank {rank} sumsq {total:.12e} step {words[3]} steps {words[4]} colls {words[7]}", flush=True)
    # Teardown as train_ddp.py's: DDP (and the hook's futures it holds) first,
    # then the process group, while every tensor handed to Gloo is still
    # referenced here (a tensor freed on Gloo's thread needs the GIL, which
    # this thread holds while it joins that thread).
    dist.barrier()
    ddp = None
    dist.destroy_process_group()
    del model
    # torch 2.15 aborts now and then at the interpreter's exit even so
    # ("terminate called without an active exception", Gloo's threads): the
    # result is out, so leave without the exit's teardown
    sys.stdout.flush()
    os._exit(0)


if __name__ == "__main__":
    main()
