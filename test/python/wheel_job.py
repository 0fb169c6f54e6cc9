"""The job scripts/wheel_check.sh runs with the installed wheel, on 2 workers
under `gpulaunch --standalone`: the Python API end to end, with nothing but
the wheel and Debian's python3.

    wheel_job.py save DIR     all-reduce, barrier, 4 steps checkpointed every 2
    wheel_job.py restore DIR  restores the newest checkpoint (step 4) and checks it

Each rank prints one line starting with "wheel job ok:" when every check held;
anything else exits non-zero with what differed.
"""

from __future__ import annotations

import array
import sys
from typing import List

import gpulaunch

STEPS = 4
EVERY = 2


def fail(rank: int, what: str) -> int:
    print(f"wheel job FAILED: rank {rank}: {what}", file=sys.stderr, flush=True)
    return 1


def state(step: int, rank: int) -> bytes:
    return f"step {step} rank {rank}".encode()


def collectives(comm: gpulaunch.Comm) -> str:
    """All-reduces whose results are exact; returns what differed, or ""."""
    world, rank = comm.world_size, comm.rank
    f = array.array("d", [float(rank + 1), 0.25 * rank])
    comm.allreduce(f)
    want_f = [world * (world + 1) / 2, 0.25 * world * (world - 1) / 2]
    if list(f) != want_f:
        return f"float64 sum gave {list(f)}, expected {want_f}"
    i = array.array("q", [2**40 + rank])
    comm.allreduce(i, op="max")
    if i[0] != 2**40 + world - 1:
        return f"int64 max gave {i[0]}, expected {2**40 + world - 1}"
    b = bytearray(b"from rank 0" if rank == 0 else bytes(11))
    comm.broadcast(b, root=0)
    if bytes(b) != b"from rank 0":
        return f"broadcast gave {bytes(b)!r}"
    comm.barrier()
    return ""


def save_run(ck: gpulaunch.Checkpointer, rank: int) -> str:
    if ck.restore(lambda r: None) is not None:
        return "a fresh directory had a checkpoint to restore"
    saved: List[int] = []
    for step in range(1, STEPS + 1):

        def save(w: gpulaunch.CheckpointWriter, step: int = step) -> None:
            w.write("state", state(step, rank))
            saved.append(w.step)

        if ck.step_end(step, save):
            return f"preempted at step {step} (nothing should preempt this job)"
    ck.wait()  # the saves are asynchronous: the last one is COMPLETE after this
    if saved != list(range(EVERY, STEPS + 1, EVERY)):
        return f"saved at steps {saved}, expected every {EVERY} of {STEPS}"
    return ""


def restore_run(ck: gpulaunch.Checkpointer, rank: int) -> str:
    got: List[bytes] = []
    step = ck.restore(lambda r: got.append(r.read("state")))
    if step != STEPS:
        return f"restored step {step}, expected {STEPS}"
    if got != [state(STEPS, rank)]:
        return f"restored {got!r}, expected {[state(STEPS, rank)]!r}"
    return ""


def main(argv: List[str]) -> int:
    if len(argv) != 3 or argv[1] not in ("save", "restore"):
        print(f"usage: {argv[0]} save|restore DIR", file=sys.stderr)
        return 2
    phase, directory = argv[1], argv[2]
    with gpulaunch.Comm(backend="cpu") as comm:
        rank, world = comm.rank, comm.world_size
        if world != 2:
            return fail(rank, f"world size {world}, expected 2")
        why = collectives(comm)
        if why:
            return fail(rank, why)
        ck = gpulaunch.Checkpointer(directory, every_steps=EVERY, comm=comm, handle_sigterm=False)
        try:
            why = save_run(ck, rank) if phase == "save" else restore_run(ck, rank)
        finally:
            ck.close()
        if why:
            return fail(rank, why)
    print(f"wheel job ok: rank {rank} of {world}, {phase}, gpulaunch {gpulaunch.__version__}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
