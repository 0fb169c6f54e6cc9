"""libgpulaunch's copies of sharded state in a peer's host memory
(gpl_mirror, gpulaunch.h) for ShardedElastic: one host buffer a rank (its
snapshot), pushed to its buddy on the next node in the background, and the
agreement after a loss (which rank holds which old rank's copy, at which
step) with read-only views of the copies held here."""

from __future__ import annotations

import ctypes
from typing import Any, Optional

from . import _native as N
from ._native import Error


def _check(rc: int, msg: str) -> None:
    if rc != N.GPL_OK:
        raise Error(rc, msg, str(N.fn("gpl_result_name")(rc).decode()))


class Mirror:
    """A rank's snapshot (a uint8 host tensor of `nbytes`) and its copies at
    its buddy. Collective to make (every rank of comm's world)."""

    def __init__(self, comm: int, torch: Any, nbytes: int, pin: bool) -> None:
        self._h = ctypes.c_void_p()
        rc = N.fn("gpl_mirror_create")(comm, None, ctypes.byref(self._h))
        _check(rc, N.last_error(comm, rc))
        self.snapshot = torch.empty(nbytes, dtype=torch.uint8, pin_memory=pin)
        rc = N.fn("gpl_mirror_register")(self._h, self.snapshot.data_ptr(), nbytes)
        _check(rc, self._error(rc))

    def _error(self, rc: int) -> str:
        msg = N.fn("gpl_mirror_last_error")(self._h) if self._h else None
        return str(msg.decode(errors="replace")) if msg else N.strerror(rc)

    @property
    def handle(self) -> Optional[int]:
        return self._h.value

    def stage(self) -> None:
        """Waits for the push in flight; the snapshot is the caller's to fill."""
        rc = N.fn("gpl_mirror_stage")(self._h)
        _check(rc, self._error(rc))

    def push(self, step: int) -> None:
        rc = N.fn("gpl_mirror_push")(self._h, step)
        _check(rc, self._error(rc))

    def wait(self) -> Optional[str]:
        """Waits for the push in flight; its failure's message (None: held)."""
        rc = N.fn("gpl_mirror_wait")(self._h)
        return None if rc == N.GPL_OK else self._error(rc)

    def status(self) -> N.MirrorStatus:
        st = N.MirrorStatus()
        N.fn("gpl_mirror_status_get")(self._h, ctypes.byref(st))
        return st

    def close(self) -> None:
        if self._h:
            N.fn("gpl_mirror_destroy")(self._h)
            self._h = ctypes.c_void_p()


class Plan:
    """gpl_mirror_agree's answer: the step every old rank has a copy of, and
    who holds each. Collective to make; Error (GPL_ERR_STATE) when no step is
    whole."""

    def __init__(self, comm: int, mirror: Optional[Mirror]) -> None:
        self._h = ctypes.c_void_p()
        rc = N.fn("gpl_mirror_agree")(comm, mirror.handle if mirror is not None else None, ctypes.byref(self._h))
        _check(rc, N.last_error(comm, rc))
        self._comm = comm
        step, world, round_ = ctypes.c_int64(), ctypes.c_int(), ctypes.c_int()
        N.fn("gpl_mirror_plan_info")(self._h, ctypes.byref(step), ctypes.byref(world), ctypes.byref(round_))
        self.step, self.old_world, self.old_round = step.value, world.value, round_.value
        self.holders = [int(N.fn("gpl_mirror_holder")(self._h, r)) for r in range(self.old_world)]

    def view(self, torch: Any, old_rank: int) -> Any:
        """Old rank's snapshot as a read-only uint8 tensor over the memory
        holding it here (no copy)."""
        p, n = ctypes.c_void_p(), ctypes.c_size_t()
        rc = N.fn("gpl_mirror_view")(self._h, old_rank, 0, ctypes.byref(p), ctypes.byref(n))
        _check(rc, N.last_error(self._comm, rc))
        if n.value == 0:
            return torch.empty(0, dtype=torch.uint8)
        raw = (ctypes.c_uint8 * n.value).from_address(int(p.value or 0))
        return torch.frombuffer(raw, dtype=torch.uint8)

    def close(self) -> None:
        if self._h:
            N.fn("gpl_mirror_plan_free")(self._h)
            self._h = ctypes.c_void_p()
