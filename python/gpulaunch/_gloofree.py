"""What frees a training step from a Gloo group whose round ended, when
shutting its connections down is not enough.

A Gloo collective cut off mid-way can leave a connection that never fails:
a peer's data for a receive whose buffer was already freed (the collective
failed on another connection) stops that connection's reading for good, and
the next collective on it waits for the group's timeout (30 minutes by
default) however its socket is shut down. So:

- RoundGuard wraps DDP's communication hook: the step waits on a future of
  its own, which the watcher fails shortly after the round ended (Elastic's
  _FREE_AFTER_S), whatever the Gloo work under it does; once failed, no new
  all-reduce is started on the group. FSDP2's collectives wait through
  RoundGuard.wait (_fsdpfree.py), which the same fail() ends.
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
        self._waits: dict[int, tuple[threading.Event, Any, Any]] = {}  # wait(): (woken, _Ended, group)
        self._left: list[tuple[Any, Any]] = []  # (_Ended, group) of the waits fail() ended

    def reset(self) -> None:
        """A new group: nothing failed, nothing pending."""
        with self._lock:
            self._why = None
            self._pending = {}
            self._abandoned = []
            self._waits = {}
            self._left = []

    def unfinished(self) -> list[Any]:
        """This round's Gloo works that have not ended."""
        with self._lock:
            inner = self._abandoned + [f for _, f in self._pending.values()]
            inner += [f for f, _ in self._left] + [f for _, f, _ in self._waits.values()]
        return [f for f in inner if not f.done()]

    def busy_groups(self) -> list[tuple[Any, list[Any]]]:
        """The groups (an FSDP mesh's own too) with works that wait() gave up
        on and that have not ended, each with those works."""
        with self._lock:
            left = self._left + [(f, g) for _, f, g in self._waits.values()]
        by: dict[int, tuple[Any, list[Any]]] = {}
        for f, g in left:
            if not f.done():
                by.setdefault(id(g), (g, []))[1].append(f)
        return list(by.values())

    def check(self) -> None:
        """Raises once the round's waits were failed: no collective is
        started on a group whose round ended."""
        with self._lock:
            why = self._why
        if why is not None:
            raise RuntimeError(why)

    def wait(self, work: Any, group: Any) -> None:
        """work.wait() for a Gloo work on group, which fail() ends: raises
        RuntimeError(why) then, and the work is left to end on its own (a
        thread of its own waits in Gloo: not every Gloo work has a future)."""
        woken = threading.Event()
        ended = _Ended(work)
        key = id(woken)
        with self._lock:
            why = self._why
            if why is None:
                self._waits[key] = (woken, ended, group)
            else:
                self._left.append((ended, group))
        if why is not None:
            raise RuntimeError(why)
        threading.Thread(target=_await, args=(work, woken), name="gpulaunch-gloo-wait", daemon=True).start()
        woken.wait()
        with self._lock:
            mine = self._waits.pop(key, None) is not None
            why = self._why
        if not mine:  # fail() took it: ended or not, the round is over
            raise RuntimeError(why)
        work.wait()  # it ended: returns, or raises its error

    def fail(self, why: str) -> int:
        """Fails every future DDP waits on and every wait(), and any started
        from now on; returns how many were waited on."""
        with self._lock:
            if self._why is None:
                self._why = why
            outers = [o for o, _ in self._pending.values()]
            self._abandoned += [f for _, f in self._pending.values()]
            self._pending = {}
            waits = list(self._waits.values())
            self._left += [(f, g) for _, f, g in waits]
            self._waits = {}
        for o in outers:
            o.set_exception(RuntimeError(why))
        for woken, _, _ in waits:
            woken.set()
        return len(outers) + len(waits)

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


class _Ended:
    """A Gloo work as Parked looks at it: done() once it ended."""

    def __init__(self, work: Any) -> None:
        self._work = work

    def done(self) -> bool:
        return bool(self._work.is_completed())


def _await(work: Any, woken: threading.Event) -> None:
    try:
        work.wait()
    except Exception:  # noqa: BLE001 - the caller's work.wait() raises it
        pass
    finally:
        woken.set()


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
