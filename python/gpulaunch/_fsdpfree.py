"""FSDP2's collectives on Gloo, waited for through a RoundGuard, so that a
round's end frees a sharded step as it frees a DDP one (_gloofree.py).

FSDP2 waits on its all-gathers, reduce-scatters and HSDP's all-reduce in the
training thread, in Gloo's own wait, which a transfer cut mid-way holds until
the group's timeout. While a guard is installed, those three calls of FSDP2's
collectives module start their work asynchronously and wait through the
guard: fail() ends the wait at once, and no new one starts on the ended
round's group. Without a guard they are torch's own calls. A torch whose
FSDP2 lacks the module is left alone (a stuck step then exits, and the
launcher restarts the node's workers).
"""

from __future__ import annotations

import importlib
from typing import Any, Optional

from ._gloofree import RoundGuard

_MODULE = "torch.distributed.fsdp._fully_shard._fsdp_collectives"

_guard: Optional[RoundGuard] = None  # read once a call (one reference: no lock needed)


class _Dist:
    """torch.distributed as FSDP2's collectives module sees it: its
    collectives (all_gather_into_tensor and reduce_scatter_tensor in older
    torch) go through the installed guard; everything else is torch's."""

    def __init__(self, dist: Any) -> None:
        self._dist = dist
        work = dist.distributed_c10d.Work

        class Waited(work):  # type: ignore[misc, valid-type]
            """An asynchronous work whose wait() is the guard's."""

            def __init__(self, inner: Any, group: Any, guard: RoundGuard) -> None:
                super().__init__()
                self._inner, self._group, self._g = inner, group, guard

            def wait(self, timeout: Any = None) -> bool:
                self._g.wait(self._inner, self._group)
                return True

            def is_completed(self) -> bool:
                return bool(self._inner.is_completed())

            def get_future(self) -> Any:
                return self._inner.get_future()

        self._waited = Waited

    def __getattr__(self, name: str) -> Any:
        return getattr(self._dist, name)

    def _call(self, name: str, args: tuple[Any, ...], kw: dict[str, Any]) -> Any:
        g = _guard
        fn = getattr(self._dist, name)
        if g is None:
            return fn(*args, **kw)
        g.check()
        wanted = bool(kw.pop("async_op", False))
        group = kw.get("group")
        work = fn(*args, async_op=True, **kw)
        if wanted:
            return self._waited(work, group, g)
        g.wait(work, group)
        return None

    def all_gather_single(self, *args: Any, **kw: Any) -> Any:
        return self._call("all_gather_single", args, kw)

    def reduce_scatter_single(self, *args: Any, **kw: Any) -> Any:
        return self._call("reduce_scatter_single", args, kw)

    def all_gather_into_tensor(self, *args: Any, **kw: Any) -> Any:
        return self._call("all_gather_into_tensor", args, kw)

    def reduce_scatter_tensor(self, *args: Any, **kw: Any) -> Any:
        return self._call("reduce_scatter_tensor", args, kw)

    def all_reduce(self, *args: Any, **kw: Any) -> Any:
        return self._call("all_reduce", args, kw)


def install(guard: Optional[RoundGuard]) -> bool:
    """Routes FSDP2's collectives through guard (None: torch's own again);
    False where this torch's FSDP2 has no such module."""
    global _guard
    try:
        mod = importlib.import_module(_MODULE)
    except ImportError:
        return False
    dist = getattr(mod, "dist", None)
    if dist is None:
        return False
    if not isinstance(dist, _Dist):
        if not hasattr(dist, "all_reduce"):
            return False
        mod.dist = _Dist(dist)  # type: ignore[attr-defined]
    _guard = guard
    return True
