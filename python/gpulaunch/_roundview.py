"""The launcher's round block as Elastic's watcher and training thread see
it: a round read from it (gpl_round_wait), whether the launcher said
something since a round was formed, and the error of a round that ended
while it was being joined."""

from __future__ import annotations

import dataclasses
import time

from . import _native as N


@dataclasses.dataclass(frozen=True)
class _Round:
    seq: int
    state: int
    round: int
    node_rank: int
    nnodes: int
    base_rank: int
    world_size: int
    master_port: int
    restarts: int
    master_addr: str
    why: str
    seen: float  # time.monotonic() when the watcher read it

    @classmethod
    def of(cls, c: N.RoundInfo) -> "_Round":
        return cls(
            c.seq, c.state, c.round, c.node_rank, c.nnodes, c.base_rank, c.world_size, c.master_port,
            c.restarts, c.master_addr.decode(errors="replace"), c.why.decode(errors="replace"),
            time.monotonic(),
        )


def _moved(r: _Round, formed_seq: int) -> bool:
    """The launcher said something since the round block's seq was formed_seq
    (a round's end, the next round, or a restart)."""
    return r.seq != formed_seq and r.state != N.ROUND_RUNNING


class _RoundMoved(RuntimeError):
    """The round being formed ended meanwhile."""

    def __init__(self, round_: int) -> None:
        super().__init__(f"gpulaunch: round {round_} ended while it was being joined")
