#!/usr/bin/env python3
"""ckpt_bench_torch: what one checkpoint stalls a PyTorch job for, side by side
in one run (docs/performance.md). Run under gpulaunch with a torch 2.x:

    gpulaunch --standalone --nproc-per-node 2 python ckpt_bench_torch.py --dir /nvme/ck

Each rank holds a model of --layers Linear(4096, 4096) with Adam's state
(about 1 GiB with 5 layers) and saves all of it, every method in turn, --saves
times, with a step (--step-ms of sleep, the GPU's share, then an in-place
update of every parameter) before each save:
  memcpy          the state copied into preallocated host tensors: the floor
  torch.save      each rank's state_dict into its own file (no fsync)
  dcp.save        torch.distributed.checkpoint.save (synchronous)
  dcp.async_save  thread and process modes: the time until the call returns
Every save starts after the previous one finished writing (waited for outside
the stall: a job checkpoints minutes apart, not back to back).
  gpulaunch-sync  Checkpointer(async_save=False): until written and hashed
  gpulaunch-async Checkpointer: until the copy into the staging buffer is done
Then the steps per second of --steps steps with a gpulaunch checkpoint every
--every steps against none. Rank 0 prints one line per method: the median
stall of the saves after the first (and the first), the worst rank's."""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import time
from typing import Any, Callable, Dict, List

import torch
import torch.distributed as dist

import gpulaunch


def make_state(layers: int) -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    torch.manual_seed(0)
    model = torch.nn.Sequential(*[torch.nn.Linear(4096, 4096) for _ in range(layers)])
    opt = torch.optim.Adam(model.parameters(), lr=1e-4)
    for p in model.parameters():  # Adam's moments exist from the first step on
        p.grad = torch.zeros_like(p)
    opt.step()
    return model, opt


def state_of(model: torch.nn.Module, opt: torch.optim.Optimizer) -> Dict[str, Any]:
    return {"model": model.state_dict(), "opt": opt.state_dict()}


def step(model: torch.nn.Module, step_ms: float) -> None:
    time.sleep(step_ms / 1000)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(1e-6)


def worst(x: float) -> float:
    t = torch.tensor([x], dtype=torch.float64)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return float(t.item())


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--dir", required=True)
    ap.add_argument("--layers", type=int, default=5)
    ap.add_argument("--saves", type=int, default=3)
    ap.add_argument("--step-ms", type=float, default=100)
    ap.add_argument("--steps", type=int, default=60)
    ap.add_argument("--every", type=int, default=20)
    ap.add_argument("--methods", default="memcpy,torch.save,dcp.save,dcp.async_save.thread,"
                    "dcp.async_save.process,gpulaunch-sync,gpulaunch-async")
    a = ap.parse_args()
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    import torch.distributed.checkpoint as dcp

    model, opt = make_state(a.layers)
    nbytes = sum(t.numel() * t.element_size() for t in model.state_dict().values())
    nbytes += sum(v.numel() * v.element_size() for s in opt.state.values()
                  for v in s.values() if torch.is_tensor(v))
    if rank == 0:
        print(f"ckpt_bench_torch: torch {torch.__version__}, {dist.get_world_size()} ranks, "
              f"{nbytes / 2**30:.2f} GiB of model and optimizer state a rank", flush=True)
    base = os.path.join(a.dir, f"bench-{os.getpid()}")
    if rank == 0:
        shutil.rmtree(a.dir, ignore_errors=True)
    dist.barrier()

    floor: List[torch.Tensor] = []

    def memcpy() -> Callable[[], None]:
        def run() -> None:
            st = state_of(model, opt)
            flat = list(st["model"].values()) + [v for s in st["opt"]["state"].values()
                                                 for v in s.values() if torch.is_tensor(v)]
            if not floor:
                floor.extend(torch.empty_like(t) for t in flat)
                for d, t in zip(floor, flat):
                    d.copy_(t)  # pages in
            for d, t in zip(floor, flat):
                d.copy_(t)
        return run

    def tsave() -> Callable[[], None]:
        def run() -> None:
            os.makedirs(a.dir, exist_ok=True)
            torch.save(state_of(model, opt), f"{a.dir}/torch-r{rank}.pt")
        return run

    n = [0]

    def dsave() -> Callable[[], None]:
        def run() -> None:
            n[0] += 1
            dcp.save(state_of(model, opt), checkpoint_id=f"{a.dir}/dcp-{n[0]}")
        return run

    pending: List[Any] = []

    def dasync(kind: str) -> Callable[[], None]:
        from torch.distributed.checkpoint.state_dict_saver import AsyncCheckpointerType
        t = AsyncCheckpointerType.PROCESS if kind == "process" else AsyncCheckpointerType.THREAD

        def run() -> None:
            n[0] += 1
            f = dcp.async_save(state_of(model, opt), checkpoint_id=f"{a.dir}/dcpa-{n[0]}",
                               async_checkpointer_type=t)
            pending.append(getattr(f, "upload_completion", f))
        return run

    results: Dict[str, tuple[float, float]] = {}

    def timed(name: str, run: Callable[[], None]) -> None:
        stalls = []
        for _ in range(a.saves):
            step(model, a.step_ms)
            for f in pending:  # the previous save finished, outside the stall: checkpoints
                f.result()     # come minutes apart, not back to back
            pending.clear()
            dist.barrier()
            t0 = time.perf_counter()
            run()
            stalls.append(time.perf_counter() - t0)
        for f in pending:
            f.result()
        pending.clear()
        later = stalls[1:] or stalls
        results[name] = (worst(statistics.median(later)), worst(stalls[0]))

    def gl(async_save: bool) -> None:
        name = "gpulaunch-async" if async_save else "gpulaunch-sync"
        stalls: List[float] = []
        with gpulaunch.Checkpointer(f"{base}-{name}", every_steps=1, keep=2,
                                    async_save=async_save) as ck:
            def save(w: Any) -> None:
                w.save_state("state", state_of(model, opt))
            for s in range(a.saves):
                step(model, a.step_ms)
                ck.wait()  # the previous save written, outside the stall (as for DCP)
                t0 = time.perf_counter()
                ck.step_end(s + 1, save)
                stalls.append(time.perf_counter() - t0)
        later = stalls[1:] or stalls
        results[name] = (worst(statistics.median(later)), worst(stalls[0]))

    for m in a.methods.split(","):
        if m == "memcpy":
            timed(m, memcpy())
        elif m == "torch.save":
            timed(m, tsave())
        elif m == "dcp.save":
            timed(m, dsave())
        elif m.startswith("dcp.async_save."):
            try:
                timed(m, dasync(m.rsplit(".", 1)[1]))
            except Exception as e:  # an older torch without the mode
                if rank == 0:
                    print(f"ckpt_bench_torch: {m}: {type(e).__name__}: {e}", flush=True)
        elif m == "gpulaunch-sync":
            gl(False)
        elif m == "gpulaunch-async":
            gl(True)
        shutil.rmtree(a.dir, ignore_errors=True) if rank == 0 else None
        dist.barrier()

    floor_s = results.get("memcpy", (0.0, 0.0))[0]
    if rank == 0:
        for name, (med, first) in results.items():
            ratio = f" {med / floor_s:.2f}x memcpy" if floor_s else ""
            print(f"ckpt_bench_torch {name:24s} stall_s={med:.3f} first_s={first:.3f}{ratio}",
                  flush=True)

    # throughput: a gpulaunch checkpoint every --every steps against none
    rates = {}
    for label, every in (("none", 0), (f"every {a.every} steps", a.every)):
        with gpulaunch.Checkpointer(f"{base}-rate-{every}", every_steps=every, keep=2) as ck:
            def save2(w: Any) -> None:
                w.save_state("state", state_of(model, opt))
            dist.barrier()
            t0 = time.perf_counter()
            for s in range(a.steps):
                step(model, a.step_ms)
                ck.step_end(s + 1, save2)
            rates[label] = a.steps / worst(time.perf_counter() - t0)
    if rank == 0:
        none = rates["none"]
        for label, r in rates.items():
            print(f"ckpt_bench_torch throughput {label:18s} {r:.3f} steps/s "
                  f"({(r / none - 1) * 100:+.1f} %)", flush=True)
        shutil.rmtree(a.dir, ignore_errors=True)
    dist.barrier()
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
