"""A training loop with gpulaunch.Checkpointer, for the tests: each rank's
state says its rank and step, rank 0 also writes a replicated file. One line
per event on stdout: "rank R restored S|none", "rank R preempted at S",
"rank R error NAME: MESSAGE", "rank R done S"."""

from __future__ import annotations

import argparse
import hashlib
import os
import sys
import time
from typing import Any

import gpulaunch


def state_bytes(rank: int, step: int) -> bytes:
    return f"rank {rank} step {step}\n".encode() + bytes((rank * 31 + step + i) % 256 for i in range(4093))


def shared_bytes(step: int) -> bytes:
    return hashlib.sha256(f"shared {step}".encode()).digest() * 100


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--dir", required=True)
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--every", type=int, default=0)
    ap.add_argument("--keep", type=int, default=3)
    ap.add_argument("--sleep", type=float, default=0.0)
    ap.add_argument("--die-rank", type=int, default=-1)
    ap.add_argument("--die-step", type=int, default=-1)
    ap.add_argument("--torch-elems", type=int, default=0, help="write model.pt/rank.pt with torch.save")
    ap.add_argument("--ready-step", type=int, default=-1, help="touch DIR/../ready-R after this step")
    a = ap.parse_args()

    torch: Any = None
    if a.torch_elems:
        import torch as _torch

        torch = _torch

    ck = gpulaunch.Checkpointer(a.dir, every_steps=a.every, keep=a.keep)
    r = ck.comm.rank

    def save(w: gpulaunch.CheckpointWriter) -> None:
        assert w.rank == r
        if torch is not None:
            if r == 0:
                torch.save({"w": torch.arange(a.torch_elems, dtype=torch.float32) * w.step}, w.path("model.pt"))
            torch.save({"rank": r, "step": w.step}, w.path("rank.pt"))
            return
        w.write("state", state_bytes(r, w.step))
        if r == 0:
            w.write("shared", bytearray(shared_bytes(w.step)))
        if w.preempting:
            print(f"rank {r} preempting with {w.seconds_left:.0f} s left", flush=True)

    def load(rd: gpulaunch.CheckpointReader) -> None:
        if torch is not None:
            m = torch.load(rd.path("model.pt"))
            assert torch.equal(m["w"], torch.arange(a.torch_elems, dtype=torch.float32) * rd.step)
            own = torch.load(rd.path("rank.pt"))
            assert own["step"] == rd.step
            print(f"rank {r} loaded model.pt of {a.torch_elems} and rank.pt of rank {own['rank']}", flush=True)
            return
        got = rd.read("state")
        head = got.split(b"\n", 1)[0].decode()
        assert got == state_bytes(int(head.split()[1]), rd.step), f"rank {r}: state of step {rd.step} differs"
        assert rd.read("shared") == shared_bytes(rd.step)
        print(f"rank {r} loaded '{head}'", flush=True)

    start = ck.restore(load)
    print(f"rank {r} restored {start if start is not None else 'none'}", flush=True)
    step = start or 0
    try:
        while step < a.steps:
            step += 1
            if a.sleep:
                time.sleep(a.sleep)
            if step == a.die_step and r == a.die_rank:
                os._exit(3)
            if ck.step_end(step, save):
                print(f"rank {r} preempted at {step}", flush=True)
                return gpulaunch.EXIT_PREEMPTED
            if step == a.ready_step:
                open(os.path.join(os.path.dirname(os.path.abspath(a.dir)), f"ready-{r}"), "w").close()
    except gpulaunch.Error as e:
        print(f"rank {r} error {e.name}: {e}", flush=True)
        return 1
    ck.wait()  # the last checkpoint is COMPLETE once every rank's writes are done
    print(f"rank {r} done {step}", flush=True)
    ck.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
