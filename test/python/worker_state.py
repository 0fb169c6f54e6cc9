"""A training loop saving with CheckpointWriter.save_state, for
test_checkpoint_async.py: each rank's state is a function of its rank and
step (tensors of several dtypes, tuples, int keys); rank 0 also saves a
replicated one. One line per event on stdout: "rank R restored S|none",
"rank R loaded step S sha HEX", "rank R preempted at S", "rank R status
FIELD=VALUE ...", "rank R done S"."""

from __future__ import annotations

import argparse
import hashlib
import os
import sys
import time
from typing import Any

import torch

import gpulaunch


def state_of(rank: int, step: int, mib: int) -> dict[str, Any]:
    n = max(1, (mib << 20) // 4)
    g = torch.Generator().manual_seed(rank * 100003 + step)
    return {
        "rank": rank,
        "step": step,
        "big": torch.rand(n, generator=g),
        "bf16": (torch.arange(64, dtype=torch.float32) * step).to(torch.bfloat16).view(8, 8).t(),
        "ids": torch.arange(10, dtype=torch.int64) + 1000 * rank,
        "mask": torch.arange(7) % (step % 3 + 1) == 0,
        "by_int": {step: (step, float(step) / 3), -1: torch.tensor(step, dtype=torch.int32)},
    }


def shared_of(step: int) -> dict[str, Any]:
    return {"w": torch.linspace(0, 1, 4096, dtype=torch.float64) * step, "betas": (0.9, 0.999)}


def sha_of(x: Any) -> str:
    h = hashlib.sha256()

    def walk(v: Any) -> None:
        if isinstance(v, torch.Tensor):
            h.update(f"T{v.dtype}{tuple(v.shape)}".encode())
            h.update(v.detach().cpu().contiguous().reshape(-1).view(torch.uint8).numpy().tobytes())
        elif isinstance(v, dict):
            for k, w in v.items():
                h.update(f"K{type(k).__name__}{k!r}".encode())
                walk(w)
        elif isinstance(v, (list, tuple)):
            h.update(f"L{type(v).__name__}{len(v)}".encode())
            for w in v:
                walk(w)
        else:
            h.update(f"V{type(v).__name__}{v!r}".encode())

    walk(x)
    return h.hexdigest()


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--dir", required=True)
    ap.add_argument("--durable", default=None)
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--every", type=int, default=0)
    ap.add_argument("--keep", type=int, default=3)
    ap.add_argument("--keep-durable", type=int, default=0)
    ap.add_argument("--mib", type=int, default=1, help="MiB of the big tensor of each rank")
    ap.add_argument("--sleep", type=float, default=0.0)
    ap.add_argument("--ready-step", type=int, default=-1, help="write pid-R beside --dir after this step")
    a = ap.parse_args()

    ck = gpulaunch.Checkpointer(a.dir, every_steps=a.every, keep=a.keep, durable=a.durable,
                                keep_durable=a.keep_durable)
    r = ck.comm.rank

    def save(w: gpulaunch.CheckpointWriter) -> None:
        w.save_state("state", state_of(r, w.step, a.mib))
        if r == 0:
            w.save_state("shared", shared_of(w.step))
        if w.preempting:
            print(f"rank {r} preempting at {w.step}", flush=True)

    def load(rd: gpulaunch.CheckpointReader) -> None:
        got = rd.load_state("state")
        want = state_of(r, rd.step, a.mib)
        assert sha_of(got) == sha_of(want), f"rank {r}: the state of step {rd.step} differs"
        assert sha_of(rd.load_state("shared")) == sha_of(shared_of(rd.step))
        print(f"rank {r} loaded step {rd.step} sha {sha_of(got)}", flush=True)

    start = ck.restore(load)
    print(f"rank {r} restored {start if start is not None else 'none'}", flush=True)
    step = start or 0
    while step < a.steps:
        step += 1
        if a.sleep:
            time.sleep(a.sleep)
        if ck.step_end(step, save):
            print(f"rank {r} preempted at {step}", flush=True)
            return gpulaunch.EXIT_PREEMPTED
        if step == a.ready_step:
            pid = os.path.join(os.path.dirname(os.path.abspath(a.dir)), f"pid-{r}")
            with open(pid + ".tmp", "w") as f:
                f.write(str(os.getpid()))
            os.replace(pid + ".tmp", pid)  # whole when it appears
    ck.wait()
    s = ck.status()
    print(f"rank {r} status local={s.local_step} durable={s.durable_step} complete={s.complete_step} "
          f"durable_complete={s.durable_complete_step} stall={s.last_stall_s:.6f}", flush=True)
    print(f"rank {r} done {step}", flush=True)
    ck.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
