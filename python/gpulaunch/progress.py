"""Progress reports to the launcher's hang watchdog and straggler detection
(gpulaunch --progress-timeout; docs/health.md).

    for step in range(steps):
        train_one_step()
        gpulaunch.progress(step)        # Checkpointer.step_end reports too

    ddp.register_comm_hook(None, gpulaunch.allreduce_hook)  # who waits for whom

Outside gpulaunch every call is a no-op. Under gpulaunch, importing the
package registers Python's faulthandler on the launcher's stack signal: a rank
the watchdog finds hung prints every thread's stack to its stderr first.
"""

from __future__ import annotations

import faulthandler
import importlib
import os
import sys
from typing import Any, Callable, Optional

from . import _native as N

_report: Optional[Callable[[int], Any]] = None
_stack_signal = 0


def _register_stack_dump() -> None:
    """Called at import: cheap, and needs no library."""
    global _stack_signal
    if not os.environ.get("GPULAUNCH_PROGRESS_SHM"):
        return
    try:
        sig = int(os.environ.get("GPULAUNCH_STACK_SIGNAL", "0"))
    except ValueError:
        return
    if sig <= 0:
        return
    try:
        faulthandler.register(sig, file=sys.stderr, all_threads=True, chain=False)
    except (ValueError, RuntimeError, OSError, AttributeError):
        return  # stderr without a descriptor, or not the main interpreter
    _stack_signal = sig
    N.on_load(_tell_launcher)


def _tell_launcher(lib: Any) -> None:
    f = getattr(lib, "gpl_progress_stack_signal", None)
    if f is not None and _stack_signal:
        f(_stack_signal)


def progress(step: int) -> None:
    """This process finished `step` (one call per step; well under 2 us)."""
    global _report
    if _report is None:
        if not os.environ.get("GPULAUNCH_PROGRESS_SHM"):
            _report = _noop
        else:
            try:
                _report = N.fn("gpl_progress")
            except N.Error as e:  # an older library: say it once, then report nothing
                print(f"gpulaunch: progress is not reported: {e}", file=sys.stderr)
                _report = _noop
    _report(step)


def state_source(source: str, step: int, nbytes: int, seconds: float, root: int = -1) -> None:
    """Tells the launcher where this rank's state came from after a round change: "peer" (copied
    from rank `root`) or "checkpoint" (read), of which step, how many bytes, in how long. The
    launcher says it in the round's line of its log, and the rendezvous on its job page and
    /metrics (docs/health.md). Nothing outside gpulaunch."""
    fd = os.environ.get("GPULAUNCH_PROGRESS_FD", "")
    if not fd or source not in ("peer", "checkpoint"):
        return
    line = f"state {source} {int(step)} {max(0, int(nbytes))} {max(0, round(seconds * 1000))} {int(root)}\n"
    try:
        os.write(int(fd), line.encode())
    except (OSError, ValueError):
        pass  # no launcher reading (or a malformed variable): nothing to tell


def _noop(step: int) -> None:
    return None


def allreduce_hook(state: Any, bucket: Any) -> Any:
    """A PyTorch DDP communication hook: the default all-reduce (averaged over
    the process group `state`, or the default group when None) whose time in
    flight is reported, so that the launcher names the rank the others wait for
    (the straggler). Register with ddp_model.register_comm_hook(None, hook)."""
    dist: Any = importlib.import_module("torch.distributed")
    begin, end = _wait_fns()
    group = state if state is not None else dist.group.WORLD
    tensor = bucket.buffer()
    tensor.div_(dist.get_world_size(group))
    begin()
    try:
        fut = dist.all_reduce(tensor, group=group, async_op=True).get_future()
    except BaseException:
        end()
        raise

    def done(f: Any) -> Any:
        end()
        return f.value()[0]

    return fut.then(done)


# DDP refuses a hook whose annotations are not torch's own types, and the
# package imports no torch at import time: the hook shows none at run time.
allreduce_hook.__annotations__ = {}


_wait: Optional[tuple[Callable[[], Any], Callable[[], Any]]] = None


def _wait_fns() -> tuple[Callable[[], Any], Callable[[], Any]]:
    global _wait
    if _wait is None:
        if os.environ.get("GPULAUNCH_PROGRESS_SHM"):
            try:
                _wait = (N.fn("gpl_progress_wait_begin"), N.fn("gpl_progress_wait_end"))
            except N.Error:
                _wait = (_nothing, _nothing)
        else:
            _wait = (_nothing, _nothing)
    return _wait


def _nothing() -> None:
    return None
