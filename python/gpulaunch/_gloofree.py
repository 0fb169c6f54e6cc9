"""What frees a DDP step from a Gloo group whose round ended, when shutting
its connections down is not enough.

A Gloo collective cut off mid-way can leave a connection that never fails:
a peer's data for a receive whose buffer was already freed (the collective
failed on another connection) stops that connection's reading for good, and
the next collective on it waits for the group's timeout (30 minutes by
default) however its socket is shut down. So:

- RoundGuard wraps DDP's communication hook: the step waits on a future of
  its own, which the watcher fails shortly after the round ended (Elastic's
  _FREE_AFTER_S), whatever the Gloo work under it does; once failed, no new
  all-reduce is started on the group.
- Parked keeps a group whose works did not finish: dropping it would join
  Gloo's threads, which wait for those works (the caller would block for the
  group's timeout). It is let go once they end; a group still busy when the
  process closes is never let go (the process exits without waiting).
"""

from __future__ import annotations

import ctypes
import threading
from typing import Any, Callable, Optional


class RoundGuard:
    """The futures DDP waits on in this round's group."""

    def __init__(self, torch: Any) -> None:
        self._torch = torch
        self._lock = threading.Lock()
        self._why: Optional[str] = None  # the round ended: why
        self._pending: dict[int, tuple[Any, Any]] = {}  # id -> (outer, inner): in flight
        self._abandoned: list[Any] = []  # inner futures whose outer fail() failed

    def reset(self) -> None:
        """A new group: nothing failed, nothing pending."""
        with self._lock:
            self._why = None
            self._pending = {}
            self._abandoned = []

    def unfinished(self) -> list[Any]:
        """This round's Gloo works that have not ended."""
        with self._lock:
            inner = self._abandoned + [f for _, f in self._pending.values()]
        return [f for f in inner if not f.done()]

    def fail(self, why: str) -> int:
        """Fails every future DDP waits on, and any started from now on;
        returns how many were waited on."""
        with self._lock:
            if self._why is None:
                self._why = why
            outers = [o for o, _ in self._pending.values()]
            self._abandoned += [f for _, f in self._pending.values()]
            self._pending = {}
        for o in outers:
            o.set_exception(RuntimeError(why))
        return len(outers)

    def wrap(self, inner: Optional[Callable[..., Any]]) -> Callable[..., Any]:
        """A DDP communication hook around inner (DDP's all-reduce when None)."""
        call: Callable[..., Any]
        if inner is None:
            from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

            call = default_hooks.allreduce_hook
        else:
            call = inner
        futures = self._torch.futures

        def hook(state: Any, bucket: Any) -> Any:
            outer = futures.Future()
            with self._lock:
                why = self._why
            if why is not None:
                outer.set_exception(RuntimeError(why))
                return outer
            fut = call(state, bucket)
            key = id(outer)
            with self._lock:
                if self._why is not None:
                    why = self._why
                else:
                    self._pending[key] = (outer, fut)
            if why is not None:
                outer.set_exception(RuntimeError(why))
                return outer

            def done(f: Any) -> None:
                with self._lock:
                    mine = self._pending.pop(key, None) is not None
                if not mine:
                    return  # failed by the watcher already
                try:
                    value = f.value()
                except Exception as e:  # noqa: BLE001 - handed to DDP as is
                    outer.set_exception(e)
                    return
                outer.set_result(value)

            fut.add_done_callback(done)
            return outer

        hook.__annotations__ = {}  # DDP checks a hook's annotations against torch's own types
        return hook


class Parked:
    """Process groups kept until their unfinished works end."""

    def __init__(self) -> None:
        self._groups: list[tuple[Any, list[Any]]] = []

    def park(self, group: Any, works: list[Any]) -> None:
        self._groups.append((group, works))

    def release(self) -> int:
        """Lets go of the groups whose works ended; returns how many stay."""
        self._groups = [(g, w) for g, w in self._groups if not all(f.done() for f in w)]
        return len(self._groups)

    def close(self) -> None:
        """The groups still busy are never destroyed: a reference is left
        behind for each, so that neither this object's end nor the
        interpreter's waits for their works."""
        if self.release():
            for g, _ in self._groups:
                ctypes.pythonapi.Py_IncRef(ctypes.py_object(g))
        self._groups = []
