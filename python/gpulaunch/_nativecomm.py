"""The libgpulaunch communicator that Elastic copies host tensors with
(gpl_copy_state) and re-forms with every round (gpl_reform): a
Checkpointer's, or else one made for the purpose (CPU backend)."""

from __future__ import annotations

import sys
import time
from typing import Any, Optional

from . import _native as N
from ._native import Error


class NativeComm:
    def __init__(self, checkpointer: Any) -> None:
        self._ckpt = checkpointer
        self._own: Any = None  # a gpulaunch.Comm made here when no Checkpointer brings one

    def comm(self) -> Any:
        """The Checkpointer's communicator, else the one made here (None: neither)."""
        comm = getattr(self._ckpt, "comm", None)
        return comm if comm is not None else self._own

    def make(self, rank: int) -> None:
        """Makes one when no Checkpointer brings one (under gpulaunch with
        re-formation). A failure leaves none: the agreement then says to copy
        by the process group."""
        if self.comm() is not None:
            return
        from .comm import Comm

        try:
            self._own = Comm("cpu")
        except Error as e:
            sys.stderr.write(f"gpulaunch: rank {rank}: no libgpulaunch communicator for the state "
                             f"copy ({e}); it goes by the process group\n")

    def handle(self, rank: int, world: int, round_: Optional[int]) -> Optional[int]:
        """The handle when it can copy host tensors for this group:
        libgpulaunch's own transport (not a framework's), in round_ (None:
        any), with this rank and world."""
        h = getattr(self.comm(), "_h", None)
        if not h:
            return None
        L = N.lib()
        if getattr(L, "gpl_copy_state", None) is None or L.gpl_backend(h) not in (1, 2):
            return None
        if L.gpl_rank(h) != rank or L.gpl_world_size(h) != world:
            return None
        if round_ is not None and N.fn("gpl_round")(h) != round_:
            return None
        return int(h)

    def reform(self, round_: int, deadline: float) -> int:
        """Into round_ in place (gpl_reform), unless it is there already;
        returns the round it is in then (-1: none). gpl_reform goes on by
        itself to a round that follows while round_ is being made: the
        caller's round is over then."""
        comm = self.comm()
        h = getattr(comm, "_h", None)
        if comm is None or not h:
            return -1
        if N.fn("gpl_round")(h) < round_:
            ms = max(1, int((deadline - time.monotonic()) * 1000))
            rc = N.fn("gpl_reform")(h, ms)
            if rc != N.GPL_OK:
                raise Error(rc, N.last_error(h, rc))
            L = N.lib()
            comm.rank, comm.world_size = L.gpl_rank(h), L.gpl_world_size(h)
        return int(N.fn("gpl_round")(h))

    def close(self) -> None:
        """Closes the one made here (a Checkpointer's is its own)."""
        if self._own is not None:
            self._own.close()
            self._own = None
