#!/usr/bin/env python3
"""step_end_bench: what the checkpoint agreement costs per training step when
nothing is due, beside the way Megatron-LM and NeMo agree on a flag (a small
int32 tensor all-reduced with MAX through torch.distributed on Gloo).

As a worker (under gpulaunch, which gives it RANK, MASTER_ADDR, ...) it times,
in the same processes, interleaved in rounds, each call of
  step_end   Checkpointer.step_end(step, save_fn) with no checkpoint due
  allreduce  Comm.allreduce of 2 int32s with op "max" (the agreement's collective)
  gloo       torch.tensor([flag, due], dtype=int32) then
             torch.distributed.all_reduce(t, op=MAX) on a Gloo process group
and rank 0 prints, per kind, the median, p90 and p99 over the calls of the
slowest rank's time for that call (max over ranks, call by call), and the
median of the ranks' own medians; then one JSON line for the driver.

As the driver (--launch) it starts the worker with the gpulaunch of a build
tree, on one node of 4 ranks and on 2 loopback nodes of 2 ranks each, and
prints one table:

  python3 test/bench/step_end_bench.py --launch --build build [--repeat 3]

Needs torch (the worker). The Python package comes from <repo>/python and the
library from <build>/runtime/libgpulaunch.so.0 (PYTHONPATH, GPULAUNCH_LIBRARY).
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import time
from typing import Any, Callable

KINDS = ("step_end", "allreduce", "gloo")
RESULT_TAG = "STEP_END_BENCH_RESULT "


def percentile(sorted_us: list[float], p: float) -> float:
    """Nearest-rank percentile of an ascending list."""
    k = max(0, min(len(sorted_us) - 1, int(round(p / 100.0 * len(sorted_us) + 0.5)) - 1))
    return sorted_us[k]


def summarize(per_rank_ns: list[list[int]]) -> dict[str, float]:
    """per_rank_ns[r][i]: rank r's time of call i. The slowest rank's time,
    call by call, then its median, p90 and p99; and the median of the ranks'
    medians."""
    calls = len(per_rank_ns[0])
    worst = sorted(max(r[i] for r in per_rank_ns) / 1e3 for i in range(calls))
    return {
        "median": statistics.median(worst),
        "p90": percentile(worst, 90),
        "p99": percentile(worst, 99),
        "rank_median": statistics.median(statistics.median(r) / 1e3 for r in per_rank_ns),
    }


def worker(a: argparse.Namespace) -> int:
    import array
    import shutil
    import tempfile

    import torch
    import torch.distributed as dist

    import gpulaunch

    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    comm = gpulaunch.Comm(backend="cpu")
    if comm.rank != rank or comm.world_size != world:
        raise SystemExit(f"rank {rank}: gpulaunch says rank {comm.rank} of {comm.world_size}")
    # every rank must name the same checkpoint directory; nothing is written to it
    where = [tempfile.mkdtemp(prefix="step-end-bench-") if rank == 0 else ""]
    dist.broadcast_object_list(where, src=0)
    ckpt = gpulaunch.Checkpointer(where[0], every_steps=0, comm=comm)

    def never(w: Any) -> None:
        raise SystemExit(f"rank {rank}: a checkpoint was due at step {w.step}; nothing should be")

    step = 0

    def step_end() -> None:
        nonlocal step
        step += 1
        if ckpt.step_end(step, never):
            raise SystemExit(f"rank {rank}: step_end said preempted at step {step}")

    flags = array.array("i", [0, 0])

    def allreduce() -> None:
        flags[0] = 0
        flags[1] = 0
        comm.allreduce(flags, op="max")

    def gloo() -> None:
        # as Megatron/NeMo do it: a fresh tensor of the local flags, all-reduced
        t = torch.tensor([0, 0], dtype=torch.int32)
        dist.all_reduce(t, op=dist.ReduceOp.MAX)

    calls: dict[str, Callable[[], None]] = {"step_end": step_end, "allreduce": allreduce, "gloo": gloo}
    times: dict[str, list[int]] = {k: [] for k in KINDS}
    clock = time.perf_counter_ns
    for k in KINDS:
        for _ in range(a.warmup):
            calls[k]()
    per_round = max(1, a.iters // a.rounds)
    for _ in range(a.rounds):
        for k in KINDS:
            f, out = calls[k], times[k]
            comm.barrier()
            for _ in range(per_round):
                t0 = clock()
                f()
                out.append(clock() - t0)

    results: dict[str, dict[str, float]] = {}
    for k in KINDS:
        mine = torch.tensor(times[k], dtype=torch.int64)
        every = [torch.empty_like(mine) for _ in range(world)]
        dist.all_gather(every, mine)
        results[k] = summarize([e.tolist() for e in every])
    if rank == 0:
        print(
            f"# step_end_bench: {world} ranks on {comm.world_size // comm.local_world_size} "
            f"node(s), {per_round * a.rounds} calls of each kind ({a.rounds} rounds, "
            f"{a.warmup} warm-up), {os.cpu_count()} cores, torch {torch.__version__}"
        )
        print("# times in µs; median/p90/p99 of the slowest rank per call; rank_median: median of the ranks' medians")
        print(f"{'kind':<10} {'median':>9} {'p90':>9} {'p99':>9} {'rank_median':>12}")
        for k in KINDS:
            r = results[k]
            print(f"{k:<10} {r['median']:>9.1f} {r['p90']:>9.1f} {r['p99']:>9.1f} {r['rank_median']:>12.1f}")
        print(RESULT_TAG + json.dumps({"world": world, "nodes": comm.world_size // comm.local_world_size, "results": results}), flush=True)
    ckpt.close()
    comm.close()
    dist.barrier()
    dist.destroy_process_group()
    if rank == 0:
        shutil.rmtree(where[0], ignore_errors=True)
    return 0


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def launch_one(a: argparse.Namespace, nodes: int, per_node: int) -> dict[str, Any]:
    """Runs the worker on `nodes` loopback nodes of `per_node` ranks; rank 0's result."""
    repo = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    build = os.path.abspath(a.build)
    env = dict(os.environ)
    env["PYTHONPATH"] = os.path.join(repo, "python") + (
        os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else ""
    )
    env["GPULAUNCH_LIBRARY"] = os.path.join(build, "runtime", "libgpulaunch.so.0")
    launcher = os.path.join(build, "launcher", "gpulaunch")
    prog = [
        "--preemption-source", "none", "--no-python", a.python, os.path.abspath(__file__),
        "-n", str(a.iters), "-w", str(a.warmup), "--rounds", str(a.rounds),
    ]
    if nodes == 1:
        cmds = [[launcher, "--standalone", "--nproc-per-node", str(per_node)] + prog]
    else:
        port = free_port()
        cmds = [
            [launcher, "--nnodes", str(nodes), "--node-rank", str(n), "--nproc-per-node", str(per_node),
             "--master-addr", "127.0.0.1", "--master-port", str(port)] + prog
            for n in range(nodes)
        ]
    procs = [subprocess.Popen(c, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) for c in cmds]
    outs = []
    for p in procs:
        try:
            out, _ = p.communicate(timeout=a.timeout)
        except subprocess.TimeoutExpired:
            for q in procs:
                q.kill()
            raise SystemExit(f"step_end_bench: {nodes} node(s) x {per_node} did not finish in {a.timeout} s")
        outs.append(out)
    for p, out in zip(procs, outs):
        if p.returncode != 0:
            sys.stderr.write(out)
            raise SystemExit(f"step_end_bench: a launcher of {nodes} node(s) x {per_node} exited {p.returncode}")
    for line in outs[0].splitlines():
        i = line.find(RESULT_TAG)
        if i >= 0:
            return json.loads(line[i + len(RESULT_TAG):])
    sys.stderr.write(outs[0])
    raise SystemExit("step_end_bench: rank 0 printed no result")


def driver(a: argparse.Namespace) -> int:
    configs = [(1, 4), (2, 2)]
    print(
        f"# step_end_bench: {a.iters} calls of each kind after {a.warmup} warm-up, {a.rounds} rounds, "
        f"{os.cpu_count()} cores; µs: median / p90 / p99 of the slowest rank per call "
        "(rank_median: median of the ranks' medians)"
    )
    print(f"{'run':>3} {'layout':<14} {'kind':<10} {'median':>8} {'p90':>8} {'p99':>8} {'rank_median':>12}")
    for run in range(1, a.repeat + 1):
        for nodes, per_node in configs:
            res = launch_one(a, nodes, per_node)
            layout = f"{nodes} node{'s' if nodes > 1 else ''} x {per_node}"
            for k in KINDS:
                r = res["results"][k]
                print(
                    f"{run:>3} {layout:<14} {k:<10} {r['median']:>8.1f} {r['p90']:>8.1f} "
                    f"{r['p99']:>8.1f} {r['rank_median']:>12.1f}",
                    flush=True,
                )
    return 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--launch", action="store_true", help="start both layouts with gpulaunch and print one table")
    ap.add_argument("--build", default="build", help="the build tree (launcher/gpulaunch, runtime/libgpulaunch.so.0)")
    ap.add_argument("--python", default=sys.executable, help="the interpreter the workers run (needs torch)")
    ap.add_argument("--repeat", type=int, default=1, help="runs of both layouts (--launch)")
    ap.add_argument("--timeout", type=float, default=300.0, help="seconds a layout may take (--launch)")
    ap.add_argument("-n", "--iters", type=int, default=2000, help="timed calls of each kind")
    ap.add_argument("-w", "--warmup", type=int, default=200, help="untimed calls of each kind first")
    ap.add_argument("--rounds", type=int, default=5, help="the timed calls come in this many interleaved rounds")
    a = ap.parse_args()
    if a.iters < 1 or a.warmup < 0 or a.rounds < 1 or a.repeat < 1:
        ap.error("-n, --rounds and --repeat must be at least 1, -w at least 0")
    return driver(a) if a.launch else worker(a)


if __name__ == "__main__":
    sys.exit(main())
