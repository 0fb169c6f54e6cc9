#!/usr/bin/env python3
"""gloo_allreduce_bench: PyTorch's Gloo all-reduce measured the way
allreduce_bench measures ours (float32 sum, in place, nccl-tests columns), so
both can run in the same session. Needs torch; run it under gpulaunch:

  gpulaunch --standalone --nproc-per-node 2 test/bench/gloo_allreduce_bench.py -b 4K -e 256M -f 4 -n 10 -w 3
"""
import argparse
import time

import torch
import torch.distributed as dist


def size(s):
    m = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    return int(float(s[:-1]) * m[s[-1].upper()]) if s[-1].upper() in m else int(s)


ap = argparse.ArgumentParser()
ap.add_argument("-b", type=size, default=4096)
ap.add_argument("-e", type=size, default=256 << 20)
ap.add_argument("-f", type=int, default=4)
ap.add_argument("-n", type=int, default=10)
ap.add_argument("-w", type=int, default=3)
a = ap.parse_args()
dist.init_process_group("gloo")
rank, n = dist.get_rank(), dist.get_world_size()
buf = torch.ones(a.e // 4, dtype=torch.float32)
if rank == 0:
    print(f"# gloo_allreduce_bench: {n} ranks, torch {torch.__version__}, float sum, in place")
    print(f"{'size_bytes':>12} {'count':>12} {'dtype':>8} {'time_us':>12} {'algbw_gbs':>10} {'busbw_gbs':>10}")
b = a.b
while b <= a.e:
    t = buf[: b // 4]
    for _ in range(a.w):
        dist.all_reduce(t)
    dist.barrier()
    t0 = time.perf_counter()
    for _ in range(a.n):
        dist.all_reduce(t)
    us = (time.perf_counter() - t0) / a.n * 1e6
    alg = b / us / 1e3
    if rank == 0:
        print(f"{b:>12} {b // 4:>12} {'float':>8} {us:>12.1f} {alg:>10.3f} {alg * 2 * (n - 1) / n:>10.3f}", flush=True)
    b *= a.f
dist.destroy_process_group()
