"""A worker started before its node had a round (a warm join): gpulaunch
starts a new node's workers before the job's round takes the node in when
every node of the job re-forms in place, so that the others stop only for the
re-formation and the state copy, not for this worker's start (importing
torch, setting up CUDA). Such a worker has GPULAUNCH_ROUND_PENDING=1 and no
RANK, WORLD_SIZE, MASTER_ADDR, ... until it takes its first round.

    import gpulaunch
    gpulaunch.await_round()          # before anything reads RANK & co.
    rank = int(os.environ["RANK"])

await_round() is a no-op for every other worker and outside gpulaunch;
gpulaunch.Elastic and gpulaunch.Comm call it themselves.
"""

from __future__ import annotations

import ctypes
import os
from typing import Optional

from . import _native as N
from ._native import Error


def await_round(timeout_s: float = 0.0) -> Optional[int]:
    """Waits for this worker's first round when it was started before it (at
    most timeout_s; 0: as long as the launcher takes) and puts the round's
    RANK, WORLD_SIZE, GROUP_RANK, MASTER_ADDR, MASTER_PORT & co. into
    os.environ; returns the round, or None for a worker started in its round.
    Raises gpulaunch.Error when the launcher gives the worker up (it is
    started again once its node has a round): let it end the process."""
    if os.environ.get("GPULAUNCH_ROUND_PENDING") != "1":
        return None
    info = N.RoundInfo()
    ms = 0 if timeout_s <= 0 else max(1, int(timeout_s * 1000))
    rc = N.fn("gpl_await_round")(ms, ctypes.byref(info))
    if rc != N.GPL_OK:
        name = N.result_name(rc)
        raise Error(rc, f"gpulaunch: local rank {os.environ.get('LOCAL_RANK', '?')} got no first round "
                    f"({name}; the reason is above); it is started again once its node has a round", name)
    # the library set them in the C environment; os.environ is Python's copy
    env = os.environ
    rank = info.base_rank + int(env.get("GPULAUNCH_LOCAL_RANK", env.get("LOCAL_RANK", "0")))
    env["RANK"] = env["ROLE_RANK"] = str(rank)
    env["GROUP_RANK"] = env["GPULAUNCH_NODE_RANK"] = str(info.node_rank)
    env["WORLD_SIZE"] = env["ROLE_WORLD_SIZE"] = str(info.world_size)
    env["GROUP_WORLD_SIZE"] = str(info.nnodes)
    env["MASTER_ADDR"] = info.master_addr.decode(errors="replace")
    env["MASTER_PORT"] = str(info.master_port)
    env["GPULAUNCH_ROUND"] = str(info.round)
    env["TORCHELASTIC_RESTART_COUNT"] = str(info.restarts)
    # the interface the launcher pinned NCCL to for the round (the library
    # set it in the C environment when the round block names one)
    ifname = ctypes.CDLL(None).getenv
    ifname.restype = ctypes.c_char_p
    got = ifname(b"NCCL_SOCKET_IFNAME")
    if got and "NCCL_SOCKET_IFNAME" not in env:
        env["NCCL_SOCKET_IFNAME"] = got.decode(errors="replace")
    env.pop("GPULAUNCH_ROUND_PENDING", None)
    return int(info.round)
