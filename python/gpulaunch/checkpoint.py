"""Checkpoints agreed by every rank (gpl_ckpt_*): the save and load callbacks
are Python functions handed a CheckpointWriter or CheckpointReader."""

from __future__ import annotations

import ctypes
import math
import os
import signal
import sys
from typing import Any, Callable, Optional, Union

from . import _native as N
from ._native import Error
from .comm import Comm

_LARGE_LEFT = 1e8  # the library gives 1e9 s for a periodic checkpoint


class _Files:
    """What the writer and the reader share: the checkpoint handle, valid only
    during the callback."""

    def __init__(self, comm: Comm, ck: int, step: int) -> None:
        self._comm = comm
        self._ck: Optional[int] = ck
        self.step = step
        self.rank = comm.rank

    def _live(self, what: str, name: str) -> tuple[int, bytes]:
        if self._ck is None:
            raise Error(
                N.GPL_ERR_STATE,
                f"gpulaunch: {what}({name!r}) after the callback returned; use it inside "
                "save_fn/load_fn only",
                "GPL_ERR_STATE",
            )
        if not isinstance(name, str):
            raise TypeError(f"{what}: the file name must be a str, not {type(name).__name__}")
        return self._ck, name.encode()

    def _path_call(self, func: str, name: str) -> str:
        ck, raw = self._live(func, name)
        out = ctypes.create_string_buffer(N.CKPT_PATH_MAX)
        rc = N.fn(func)(ck, raw, out, N.CKPT_PATH_MAX)
        if rc != N.GPL_OK:
            raise self._comm._error(rc)
        return os.fsdecode(out.value)


class CheckpointWriter(_Files):
    """Handed to save_fn: writes this rank's files of the checkpoint of step."""

    def __init__(self, comm: Comm, ck: int, step: int, seconds_left: float) -> None:
        super().__init__(comm, ck, step)
        self.preempting = seconds_left < _LARGE_LEFT
        self.seconds_left = seconds_left if self.preempting else math.inf
        self._names: list[str] = []

    def path(self, name: str) -> str:
        """A temporary path to write file `name` to (torch.save(state, w.path("model.pt")));
        it is fsync'd, hashed, renamed and listed in the manifest after save_fn returns."""
        p = self._path_call("gpl_ckpt_temp_path", name)
        if name not in self._names:
            self._names.append(name)
        return p

    def write(self, name: str, data: Any) -> None:
        """Writes the bytes-like data as file `name` at once."""
        ck, raw = self._live("write", name)
        mv = memoryview(data)
        if not mv.c_contiguous:
            raise ValueError(f"write({name!r}): the data is not C-contiguous")
        n = mv.nbytes
        if n == 0:
            ptr: Any = None
        elif mv.readonly:
            ptr = bytes(mv) if not isinstance(data, bytes) else data
        else:
            ptr = (ctypes.c_char * n).from_buffer(mv.cast("B"))
        rc = N.lib().gpl_ckpt_write(ck, raw, ptr, n)
        if rc != N.GPL_OK:
            raise self._comm._error(rc)

    def _commit(self) -> None:
        ck = self._ck
        for name in self._names:
            rc = N.fn("gpl_ckpt_commit")(ck, name.encode())
            if rc != N.GPL_OK:
                raise self._comm._error(rc)


class CheckpointReader(_Files):
    """Handed to load_fn: this rank's files of the checkpoint of step, or
    rank 0's when this rank has none of that name (replicated state)."""

    def path(self, name: str) -> str:
        """The path of file `name` (Error GPL_ERR_NOT_FOUND when there is none)."""
        return self._path_call("gpl_ckpt_path", name)

    def read(self, name: str) -> bytes:
        """The contents of file `name`."""
        with open(self.path(name), "rb") as f:
            return f.read()


SaveFn = Callable[[CheckpointWriter], None]
LoadFn = Callable[[CheckpointReader], None]


class Checkpointer:
    """Checkpoints in directory, agreed by every rank at the step boundary:
    periodic (every_steps, every_seconds on rank 0's clock) and on preemption
    (SIGTERM to any rank, or a notice on any node). keep: complete checkpoints
    kept. Without comm it makes one: gpulaunch's, or under torchrun one over
    torch.distributed's default process group (created by then or later)."""

    comm: Comm

    def __init__(
        self,
        directory: Union[str, "os.PathLike[str]"],
        every_steps: int = 0,
        every_seconds: float = 0.0,
        keep: int = 3,
        comm: Optional[Comm] = None,
        handle_sigterm: bool = True,
    ) -> None:
        if not isinstance(every_steps, int) or every_steps < 0:
            raise ValueError(f"Checkpointer: every_steps must be an int >= 0, not {every_steps!r}")
        if not every_seconds >= 0:
            raise ValueError(f"Checkpointer: every_seconds must be >= 0, not {every_seconds!r}")
        if not isinstance(keep, int) or keep < 1:
            raise ValueError(f"Checkpointer: keep must be an int >= 1, not {keep!r}")
        self._dir = os.path.abspath(os.fspath(directory))
        os.makedirs(self._dir, exist_ok=True)
        self._own = comm is None
        if comm is None:
            from . import _torchdist

            comm = _torchdist.make_comm() if _torchdist.under_other_launcher() else Comm()
        self.comm = comm
        self._save_fn: Optional[SaveFn] = None
        self._load_fn: Optional[LoadFn] = None
        self._save_c = N.SAVE_FN(self._on_save)
        self._load_c = N.LOAD_FN(self._on_load)
        opts = N.CkptOptions(
            ctypes.sizeof(N.CkptOptions), 1, os.fsencode(self._dir), keep, every_steps,
            float(every_seconds), 1 if handle_sigterm else 0,
        )
        self._sigterm = handle_sigterm
        self._py_sigterm = signal.getsignal(signal.SIGTERM)  # what Python believes is installed
        self._told_sigterm = False
        rc = N.lib().gpl_ckpt_setup(comm._handle(), ctypes.byref(opts), self._save_c, self._load_c, None)
        try:
            comm._check(rc)
        except BaseException:
            if self._own:  # made here: not left open
                comm.close()
            raise
        comm._keep += [self._save_c, self._load_c]  # the library calls them as long as comm lives
        self._closed = False

    def _on_save(self, ck: Optional[int], step: int, left: float, user: Optional[int]) -> int:
        try:
            assert ck is not None and self._save_fn is not None
            w = CheckpointWriter(self.comm, ck, step, left)
            try:
                self._save_fn(w)
                w._commit()
            finally:
                w._ck = None
            return N.GPL_OK
        except BaseException as e:  # noqa: B902 - nothing may unwind through C frames
            self.comm._pending = e
            return N.GPL_ERR_SYSTEM

    def _on_load(self, ck: Optional[int], step: int, user: Optional[int]) -> int:
        try:
            assert ck is not None and self._load_fn is not None
            r = CheckpointReader(self.comm, ck, step)
            try:
                self._load_fn(r)
            finally:
                r._ck = None
            return N.GPL_OK
        except BaseException as e:  # noqa: B902
            self.comm._pending = e
            return N.GPL_ERR_SYSTEM

    def _start(self) -> int:
        if self._closed:
            raise Error(N.GPL_ERR_STATE, "gpulaunch: the Checkpointer is closed", "GPL_ERR_STATE")
        if self._sigterm and not self._told_sigterm and signal.getsignal(signal.SIGTERM) != self._py_sigterm:
            self._told_sigterm = True
            sys.stderr.write(
                "gpulaunch: a SIGTERM handler was installed after the Checkpointer; SIGTERM no "
                "longer asks for a checkpoint (pass handle_sigterm=False to keep your own)\n"
            )
        return self.comm._start()

    def restore(self, load_fn: LoadFn) -> Optional[int]:
        """Loads the newest complete checkpoint whose files check out through
        load_fn on every rank and returns its step; None when there is none."""
        h = self._start()
        step = ctypes.c_int64(-1)
        self._load_fn = load_fn
        try:
            rc = N.lib().gpl_ckpt_restore(h, ctypes.byref(step))
        finally:
            self._load_fn = None
        self.comm._check(rc)
        return step.value if step.value >= 0 else None

    def step_end(self, step: int, save_fn: SaveFn) -> bool:
        """Call once per step after the update (step: steps completed). True
        on every rank at the same step when the job is being preempted: the
        checkpoint of step is written; exit with gpulaunch.EXIT_PREEMPTED."""
        if not isinstance(step, int) or isinstance(step, bool) or step < 0:
            raise ValueError(f"step_end: step must be an int >= 0 (steps completed), not {step!r}")
        h = self._start()
        self._save_fn = save_fn
        try:
            rc = N.lib().gpl_step_end(h, step)
        finally:
            self._save_fn = None
        self.comm._check(rc, ok=(N.GPL_OK, N.GPL_ERR_PREEMPTED))
        return bool(rc == N.GPL_ERR_PREEMPTED)

    def close(self) -> None:
        """Ends checkpointing; SIGTERM gets back the action Python had for it.
        A communicator the Checkpointer made is closed too."""
        if self._closed:
            return
        self._closed = True
        if self._sigterm:
            try:
                signal.signal(signal.SIGTERM, self._py_sigterm)
            except (ValueError, TypeError):  # not the main thread, or a handler from C
                pass
        if self._own:
            self.comm.close()

    def __enter__(self) -> "Checkpointer":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
