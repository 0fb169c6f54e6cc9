"""The training program of the container tests (test/python/test_container.py),
with nothing but the wheel's package: a model of floats whose gradients are
averaged with gpulaunch.Comm and checkpointed with gpulaunch.Checkpointer (a
SIGTERM saves the same step on every rank).

    train_job.py STEPS CKPT_DIR [SECONDS_PER_STEP]"""

from __future__ import annotations

import array
import hashlib
import sys
import time

import gpulaunch

N = 4096


def main() -> int:
    steps, ckdir = int(sys.argv[1]), sys.argv[2]
    sleep_s = float(sys.argv[3]) if len(sys.argv) > 3 else 0.01
    with gpulaunch.Comm(backend="cpu") as comm:
        rank, world = comm.rank, comm.world_size
        w = array.array("d", [0.0] * N)
        ck = gpulaunch.Checkpointer(ckdir, every_steps=50, comm=comm)

        def save(wr: gpulaunch.CheckpointWriter) -> None:
            if rank == 0:
                wr.write("w", w.tobytes())

        def load(r: gpulaunch.CheckpointReader) -> None:
            w[:] = array.array("d", r.read("w"))

        start = ck.restore(load) or 0
        if start and rank == 0:
            print(f"resumed from the checkpoint of step {start}", flush=True)
        for step in range(start, steps):
            g = array.array("d", [((i * 7 + step * 13 + rank) % 101) / 101.0 for i in range(N)])
            comm.allreduce(g)
            for i in range(N):
                w[i] -= 0.01 * g[i] / world
            time.sleep(sleep_s)
            if ck.step_end(step + 1, save):
                print(f"rank {rank} preempted after step {step + 1}", flush=True)
                ck.close()
                return gpulaunch.EXIT_PREEMPTED
        ck.close()
        print(f"rank {rank} params_sha256 {hashlib.sha256(w.tobytes()).hexdigest()}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
