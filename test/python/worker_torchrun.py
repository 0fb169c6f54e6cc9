"""A rank under torchrun (gloo): the Checkpointer is made before the process
group exists, so its first use must say to create one; then it agrees over
torch.distributed. Writes PIDDIR/pid-R once running, loops until preempted."""

from __future__ import annotations

import os
import sys
import time

import torch
import torch.distributed as dist

import gpulaunch


def main() -> int:
    ckdir, piddir = sys.argv[1], sys.argv[2]
    ck = gpulaunch.Checkpointer(ckdir)
    r = int(os.environ["RANK"])
    state = {"step": 0}

    def save(w: gpulaunch.CheckpointWriter) -> None:
        torch.save({"rank": r, "step": w.step}, w.path("state.pt"))

    try:
        ck.step_end(1, save)
    except gpulaunch.Error as e:
        print(f"rank {r} before init_process_group: {e.name}: {e}", flush=True)
    dist.init_process_group("gloo")
    print(f"rank {r} comm backend {ck.comm.backend} world {ck.comm.world_size}", flush=True)
    start = ck.restore(lambda rd: state.update(torch.load(rd.path("state.pt"))))
    print(f"rank {r} restored {start if start is not None else 'none'}", flush=True)
    step = start or 0
    while step < 600:  # 30 s: the test preempts long before
        step += 1
        time.sleep(0.05)
        if ck.step_end(step, save):
            print(f"rank {r} preempted at {step}", flush=True)
            return gpulaunch.EXIT_PREEMPTED
        if step == 2:
            with open(os.path.join(piddir, f"pid-{r}"), "w") as f:
                f.write(str(os.getpid()))
    print(f"rank {r} never preempted", flush=True)
    return 1


if __name__ == "__main__":
    sys.exit(main())
