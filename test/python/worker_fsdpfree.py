"""A worker of test_fsdp_live's freed-step test: three ranks train an FSDP2
model on Gloo; then rank 2 stays connected but takes no part, so ranks 0 and
1 wait in one of FSDP2's collectives for ever, as behind a Gloo transfer cut
mid-way. With `guard`, FSDP2's collectives wait through a RoundGuard (as
ShardedElastic sets it up) that is failed 1 s later, as Elastic's watcher
fails it after a round ended: the step raises, the group with the work
still running is parked, and ranks 0 and 1 go on in a new group of 2. With
`plain`, torch's own wait holds the step (the test's control).

usage: worker_fsdpfree.py RANK PORT PORT2 guard|plain"""

from __future__ import annotations

import os
import sys
import threading
import time
from pathlib import Path

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "python"))
from gpulaunch import _fsdpfree  # noqa: E402
from gpulaunch._gloofree import Parked, RoundGuard  # noqa: E402


def model(world: int) -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    torch.manual_seed(0)
    m = torch.nn.Sequential(*(torch.nn.Linear(256, 256) for _ in range(3)))
    mesh = init_device_mesh("cpu", (world,))
    for layer in m:
        fully_shard(layer, mesh=mesh)
    fully_shard(m, mesh=mesh)
    return m, torch.optim.AdamW(m.parameters(), lr=1e-3)


def step(m: torch.nn.Module, opt: torch.optim.Optimizer) -> None:
    m(torch.ones(8, 256)).square().mean().backward()
    opt.step()
    opt.zero_grad()


def main() -> None:
    rank, port, port2, mode = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
    dist.init_process_group("gloo", store=dist.TCPStore("127.0.0.1", port, 3, rank == 0), rank=rank,
                           world_size=3)
    m, opt = model(3)
    step(m, opt)
    print(f"rank {rank}: a step of 3 ranks", flush=True)
    dist.barrier()
    if rank == 2:
        time.sleep(60)  # connected, silent: killed by the test
        os._exit(0)
    guard = RoundGuard(torch)
    if mode == "guard":
        assert _fsdpfree.install(guard), "this torch's FSDP2 has no collectives module"
    threading.Timer(1.0, guard.fail, args=("round 1 ended",)).start()
    t0 = time.monotonic()
    try:
        step(m, opt)
        print(f"rank {rank}: the step ended without rank 2", flush=True)
        os._exit(1)
    except RuntimeError as e:
        print(f"rank {rank}: the step was freed after {time.monotonic() - t0:.3f} s: {e}", flush=True)
    t0 = time.monotonic()
    try:  # no new collective starts on the ended round's group
        step(m, opt)
        os._exit(1)
    except RuntimeError as e:
        print(f"rank {rank}: the next step failed at once ({time.monotonic() - t0:.3f} s): {e}", flush=True)
    parked = Parked()
    busy = guard.busy_groups()
    for group, works in busy:
        parked.park(group, works)
    print(f"rank {rank}: {len(guard.unfinished())} work(s) still running in {len(busy)} group(s)", flush=True)
    t0 = time.monotonic()
    dist.destroy_process_group()
    print(f"rank {rank}: the group destroyed in {time.monotonic() - t0:.3f} s", flush=True)
    guard.reset()
    dist.init_process_group("gloo", store=dist.TCPStore("127.0.0.1", port2, 2, rank == 0), rank=rank,
                           world_size=2)
    m, opt = model(2)
    for _ in range(3):
        step(m, opt)
    print(f"rank {rank}: 3 steps of 2 ranks in a new group", flush=True)
    sys.stdout.flush()
    parked.close()
    os._exit(0)


if __name__ == "__main__":
    main()
