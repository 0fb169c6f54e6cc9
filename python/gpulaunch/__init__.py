"""gpulaunch: the Python side of libgpulaunch. Comm is this process's
communicator (from gpulaunch's environment); Checkpointer makes checkpoints
that every rank agrees on, periodic and on preemption.

    ck = gpulaunch.Checkpointer("ckpt", every_steps=100)
    start = ck.restore(lambda r: model.load_state_dict(torch.load(r.path("model.pt")))) or 0
    for step in range(start + 1, steps + 1):
        train_one_step()
        if ck.step_end(step, lambda w: torch.save(model.state_dict(), w.path("model.pt"))):
            sys.exit(gpulaunch.EXIT_PREEMPTED)

progress(step) reports a step to the launcher's hang watchdog without
checkpoints; allreduce_hook is a DDP communication hook that tells it who
waits for whom (stragglers). Elastic keeps a DDP program's processes when a
node is lost or added: it re-makes the process group and DDP for the next
round and copies the state to the ranks without it (gpulaunch.elastic);
await_round() is where a worker started before its node had a round (a
warm join) waits for it: Elastic and Comm call it. ShardedElastic does the
same for a model sharded by FSDP2 or HSDP: the model is built again on the
new world's mesh and filled from the survivors' memory (gpulaunch.sharded).
"""

from ._firstround import await_round
from ._native import GPL_EXIT_PREEMPTED as EXIT_PREEMPTED
from ._native import Error
from .checkpoint import Checkpointer, CheckpointReader, CheckpointStatus, CheckpointWriter
from .comm import Comm
from .elastic import Elastic, Reformed
from .progress import _register_stack_dump, allreduce_hook, progress, state_source
from .sharded import ShardedElastic

__version__ = "0.1.0"

_register_stack_dump()

__all__ = [
    "EXIT_PREEMPTED",
    "Error",
    "Comm",
    "Elastic",
    "ShardedElastic",
    "Reformed",
    "Checkpointer",
    "CheckpointWriter",
    "CheckpointReader",
    "CheckpointStatus",
    "progress",
    "state_source",
    "allreduce_hook",
    "await_round",
    "__version__",
]
