"""Under another launcher (torchrun): a communicator whose collectives are
torch.distributed's, over its default process group, so that the checkpoint
agreement works there too. torch is imported only here, and only when used."""

from __future__ import annotations

import ctypes
import os
import sys
from typing import Any, Callable

from . import _native as N
from ._native import Error
from .comm import Comm

_told = False

LOST = (
    "gpulaunch: this job was not started by gpulaunch (torchrun?): checkpoints agree over "
    "torch.distributed's process group; cloud preemption notices and checkpoint requests from "
    "other nodes do not reach it (SIGTERM still checkpoints every rank at the same step). "
    "Start it with gpulaunch to have them.\n"
)


def under_other_launcher() -> bool:
    """A multi-rank job whose launcher is not gpulaunch."""
    if os.environ.get("GPULAUNCH_RDZV_ENDPOINT"):
        return False
    try:
        return int(os.environ.get("WORLD_SIZE", "1")) > 1
    except ValueError:
        return False


def _env_int(name: str, default: int) -> int:
    v = os.environ.get(name)
    if v is None:
        return default
    try:
        return int(v)
    except ValueError:
        raise Error(N.GPL_ERR_INVALID_ARG, f"gpulaunch: {name}={v!r} is not an integer", "GPL_ERR_INVALID_ARG") from None


def _dist() -> Any:
    import torch.distributed as dist

    return dist


def _require_group(rank: int, world: int) -> None:
    try:
        dist = _dist()
    except ImportError:
        raise Error(
            N.GPL_ERR_STATE,
            "gpulaunch: under another launcher (WORLD_SIZE > 1 without gpulaunch's environment) "
            "checkpoints agree over torch.distributed, and torch is not installed; start the job "
            "with gpulaunch or install torch",
            "GPL_ERR_STATE",
        ) from None
    if not dist.is_available() or not dist.is_initialized():
        raise Error(
            N.GPL_ERR_STATE,
            "gpulaunch: under torchrun the Checkpointer agrees over torch.distributed's default "
            "process group, and there is none: call torch.distributed.init_process_group() "
            "before the first restore() or step_end()",
            "GPL_ERR_STATE",
        )
    if dist.get_rank() != rank or dist.get_world_size() != world:
        raise Error(
            N.GPL_ERR_STATE,
            f"gpulaunch: the default process group is rank {dist.get_rank()} of "
            f"{dist.get_world_size()}, the environment says RANK={rank} WORLD_SIZE={world}; "
            "the Checkpointer needs the job-wide group",
            "GPL_ERR_STATE",
        )


def _tensor(addr: int, count: int, dtype: int) -> Any:
    import torch

    types = {
        N.FLOAT32: torch.float32,
        N.FLOAT64: torch.float64,
        N.FLOAT16: torch.float16,
        N.BFLOAT16: torch.bfloat16,
        N.INT32: torch.int32,
        N.INT64: torch.int64,
    }
    raw = (ctypes.c_char * (count * N.DTYPE_SIZES[dtype])).from_address(addr)
    return torch.frombuffer(raw, dtype=types[dtype])


def _run(addr: int, count: int, dtype: int, collective: Callable[[Any], object]) -> None:
    """Runs collective on a tensor over the host buffer; a NCCL group gets a
    copy on the current CUDA device, copied back."""
    t = _tensor(addr, count, dtype)
    if _dist().get_backend() == "nccl":
        import torch

        d = t.to(torch.device("cuda", torch.cuda.current_device()))
        collective(d)
        t.copy_(d.cpu())
    else:
        collective(t)


def _allreduce(addr: int, count: int, dtype: int, op: int) -> None:
    dist = _dist()
    ops = {0: dist.ReduceOp.SUM, 1: dist.ReduceOp.PRODUCT, 2: dist.ReduceOp.MIN, 3: dist.ReduceOp.MAX}
    if op not in ops:  # the library turns avg into a sum
        raise Error(N.GPL_ERR_INVALID_ARG, f"gpulaunch: reduction op {op} not available over torch.distributed")
    _run(addr, count, dtype, lambda t: dist.all_reduce(t, op=ops[op]))


def _broadcast(addr: int, count: int, dtype: int, root: int) -> None:
    dist = _dist()
    _run(addr, count, dtype, lambda t: dist.broadcast(t, src=root))


def _barrier() -> None:
    _dist().barrier()


def make_comm() -> Comm:
    """The communicator over torch.distributed for this rank (RANK, WORLD_SIZE,
    LOCAL_RANK, LOCAL_WORLD_SIZE from the launcher). The process group is
    looked up at each collective, so it may be created after this."""
    global _told
    rank = _env_int("RANK", 0)
    world = _env_int("WORLD_SIZE", 1)
    local_rank = _env_int("LOCAL_RANK", rank)
    local_world = _env_int("LOCAL_WORLD_SIZE", world)
    comm = Comm._external(
        rank, world, local_rank, local_world, _allreduce, _broadcast, _barrier,
        before=lambda: _require_group(rank, world),
    )
    if not _told:
        _told = True
        sys.stderr.write(LOST)
        sys.stderr.flush()
    return comm
