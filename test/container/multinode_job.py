"""The training program of the multi-container tests (test_multinode.py): a
model of floats whose gradients are averaged with gpulaunch.Comm over every
rank of every container, checkpointed into a directory that each container
mounts (a shared volume, as a PyTorchJob's pods share one), with a line per
step so that a test sees which world trained when.

    multinode_job.py STEPS CKPT_DIR [SECONDS_PER_STEP [CHECKPOINT_EVERY]]

Lines (stdout, one write each):
    start rank R world W node HOST env RANK=.. GROUP_RANK=.. WORLD_SIZE=.. from S
    step S rank R world W t UNIX_TIME
    done rank R world W params_sha256 HEX"""

from __future__ import annotations

import array
import hashlib
import os
import socket
import sys
import time

N = 1024


def grad(step: int, rank: int, world: int) -> array.array[float]:
    """This rank's share of the step's global batch: the same sum over the
    ranks, bit for bit, at any world size (each element comes from one rank)."""
    g = array.array("d", [0.0] * N)
    for i in range(rank, N, world):
        g[i] = ((i * 7 + step * 13) % 101) / 101.0
    return g


def update(w: array.array[float], g: array.array[float]) -> None:
    for i in range(N):
        w[i] -= 0.01 * g[i]


def reference(steps: int) -> str:
    """The parameters' hash after STEPS steps on one rank, no checkpoint."""
    w = array.array("d", [0.0] * N)
    for step in range(steps):
        update(w, grad(step, 0, 1))
    return hashlib.sha256(w.tobytes()).hexdigest()


def main() -> int:
    import gpulaunch  # the image's; reference() runs without it

    steps, ckdir = int(sys.argv[1]), sys.argv[2]
    sleep_s = float(sys.argv[3]) if len(sys.argv) > 3 else 0.02
    every = int(sys.argv[4]) if len(sys.argv) > 4 else 10
    with gpulaunch.Comm(backend="cpu") as comm:
        rank, world = comm.rank, comm.world_size
        w = array.array("d", [0.0] * N)
        ck = gpulaunch.Checkpointer(ckdir, every_steps=every, comm=comm)

        def save(wr: "gpulaunch.CheckpointWriter") -> None:
            if rank == 0:
                wr.write("w", w.tobytes())

        def load(r: "gpulaunch.CheckpointReader") -> None:
            w[:] = array.array("d", r.read("w"))

        start = ck.restore(load) or 0
        env = " ".join(f"{k}={os.environ.get(k, '-')}" for k in ("RANK", "GROUP_RANK", "WORLD_SIZE"))
        print(f"start rank {rank} world {world} node {socket.gethostname()} env {env} from {start}",
              flush=True)
        for step in range(start, steps):
            g = grad(step, rank, world)
            comm.allreduce(g)
            update(w, g)
            time.sleep(sleep_s)
            print(f"step {step + 1} rank {rank} world {world} t {time.time():.3f}", flush=True)
            if ck.step_end(step + 1, save):
                ck.close()
                return int(gpulaunch.EXIT_PREEMPTED)
        ck.close()
        print(f"done rank {rank} world {world} params_sha256 {hashlib.sha256(w.tobytes()).hexdigest()}",
              flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
