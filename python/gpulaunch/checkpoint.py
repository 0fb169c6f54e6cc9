"""Checkpoints agreed by every rank (gpl_ckpt_*): the save and load callbacks
are Python functions handed a CheckpointWriter or CheckpointReader. Saves are
asynchronous: what save_fn hands over is copied into the runtime's staging
buffer, and a background thread writes, hashes and drains it (wait())."""

from __future__ import annotations

import ctypes
import dataclasses
import math
import os
import signal
import sys
import time
from typing import Any, Callable, Optional, Union

from . import _native as N
from . import _statefile, progress
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

    def __init__(
        self, comm: Comm, ck: int, step: int, seconds_left: float,
        pins: Optional[_statefile.StagePins] = None,
    ) -> None:
        super().__init__(comm, ck, step)
        self.preempting = seconds_left < _LARGE_LEFT
        self.seconds_left = seconds_left if self.preempting else math.inf
        self._names: list[str] = []
        self._pins = pins

    def path(self, name: str) -> str:
        """A temporary path to write file `name` to (torch.save(state, w.path("model.pt")))
        during save_fn; it is fsync'd, hashed, renamed and listed in the manifest in the
        background after save_fn returns."""
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

    def save_state(self, name: str, state: Any) -> None:
        """Saves state as file `name`: nested dicts (str or int keys), lists,
        tuples, None, bool, int, float, str and torch tensors (CPU or CUDA;
        a model's and an optimizer's state_dict), in one file without pickle
        (load_state runs no code from it). Its bytes go straight into the
        staging buffer (CUDA tensors by an asynchronous copy into pinned
        memory, waited for here); the program may change the tensors once
        save_fn returns. TypeError names the first value of another type."""
        self._live("save_state", name)
        import torch

        plan = _statefile.Plan(torch, state, name)
        ptr = self._stage(name, plan.size)
        plan.fill(ptr, self._pins)

    def save_sharded(self, name: str, state_dict: dict[str, Any]) -> None:
        """Saves a state sharded across ranks (FSDP2 or HSDP: DTensors, as
        torch.distributed.checkpoint.state_dict.get_state_dict returns them,
        optimizer included) through torch.distributed.checkpoint: a
        collective, every rank writes its own shards (a replicated tensor
        once, by one rank) as its file `name`, into the staging buffer, and
        the plan as rank 0's `name`.metadata. Loaded by
        CheckpointReader.load_sharded into a world of any size."""
        self._live("save_sharded", name)
        from . import _dcp

        _dcp.save(self, name, state_dict)

    def _stage(self, name: str, size: int) -> int:
        """size bytes of the staging buffer that become file `name`
        (gpl_ckpt_stage); the address is valid until save_fn returns."""
        ck, raw = self._live("stage", name)
        p = ctypes.c_void_p()
        rc = N.fn("gpl_ckpt_stage")(ck, raw, size, ctypes.byref(p))
        if rc != N.GPL_OK:
            raise self._comm._error(rc)
        if not p.value:
            raise Error(N.GPL_ERR_SYSTEM, f"gpulaunch: gpl_ckpt_stage({name!r}) gave no buffer", "GPL_ERR_SYSTEM")
        return p.value

    def _commit(self) -> None:
        ck = self._ck
        for name in self._names:
            rc = N.fn("gpl_ckpt_commit")(ck, name.encode())
            if rc != N.GPL_OK:
                raise self._comm._error(rc)


class CheckpointReader(_Files):
    """Handed to load_fn: this rank's files of the checkpoint of step, or
    rank 0's when this rank has none of that name (replicated state)."""

    def __init__(self, comm: Comm, ck: int, step: int) -> None:
        super().__init__(comm, ck, step)
        self._opened: set[str] = set()
        self.bytes_read = 0
        """Bytes of the checkpoint this rank read: the files handed out by
        path() and rank_path(), once each, and the pieces load_sharded took."""

    def _count_file(self, p: str) -> str:
        if p not in self._opened:
            self._opened.add(p)
            try:
                self.bytes_read += os.path.getsize(p)
            except OSError:
                pass  # the program's own open() says what is wrong
        return p

    def path(self, name: str) -> str:
        """The path of file `name` (Error GPL_ERR_NOT_FOUND when there is none)."""
        return self._count_file(self._path_call("gpl_ckpt_path", name))

    @property
    def saved_world(self) -> int:
        """How many ranks saved this checkpoint (this job may have another world size)."""
        ck, _ = self._live("saved_world", "-")
        return int(N.fn("gpl_ckpt_saved_world")(ck))

    def rank_path(self, rank: int, name: str) -> str:
        """The path of file `name` as rank `rank` of the saving world saved it
        (sharded state read into another world), checked against that rank's
        manifest (size, SHA-256) and fetched from the durable tier when this
        node's disk lacks it."""
        return self._count_file(self._rank_path(rank, name))

    def _rank_path(self, rank: int, name: str) -> str:
        ck, raw = self._live("rank_path", name)
        out = ctypes.create_string_buffer(N.CKPT_PATH_MAX)
        rc = N.fn("gpl_ckpt_rank_path")(ck, int(rank), raw, out, N.CKPT_PATH_MAX)
        if rc != N.GPL_OK:
            raise self._comm._error(rc)
        return os.fsdecode(out.value)

    def load_sharded(self, name: str, state_dict: dict[str, Any]) -> None:
        """Loads what save_sharded saved as `name` into state_dict in place
        (torch.distributed.checkpoint's load: DTensor shards of FSDP2 or HSDP
        state are read from whichever saving rank holds them, into this
        world's layout, whatever its size)."""
        self._live("load_sharded", name)
        from . import _dcp

        _dcp.load(self, name, state_dict)

    def read(self, name: str) -> bytes:
        """The contents of file `name`."""
        with open(self.path(name), "rb") as f:
            return f.read()

    def load_state(self, name: str, map_location: Any = None) -> Any:
        """The state save_state saved as file `name`: containers and values as
        they were (tuples, int keys, an OrderedDict's _metadata), each tensor
        read straight into a new CPU tensor, moved to map_location (a device)
        when given. No code of the file's runs (no pickle)."""
        import torch

        return _statefile.load(torch, self.path(name), map_location)


SaveFn = Callable[[CheckpointWriter], None]
LoadFn = Callable[[CheckpointReader], None]


def _step(v: int) -> Optional[int]:
    return None if v < 0 else int(v)


@dataclasses.dataclass(frozen=True)
class CheckpointStatus:
    """What this rank's checkpoints are doing (Checkpointer.status()). Steps
    are None when there is none yet.

    local_step: the newest step whose files this rank has written (the first
    tier: directory); durable_step: the newest this rank has drained to the
    durable tier; complete_step: the newest every rank wrote (marked
    COMPLETE); durable_complete_step: the newest every rank drained;
    last_stall_s: how long the last save stopped training (the copy into the
    staging buffer, or the whole write when synchronous); last_wait_s: of
    that, the wait for the previous save to be written; drain_bytes,
    drain_total: the drain in flight (0, 0: none); drain_rate: bytes/s of the
    last drain."""

    local_step: Optional[int]
    durable_step: Optional[int]
    complete_step: Optional[int]
    durable_complete_step: Optional[int]
    last_stall_s: float
    last_wait_s: float
    drain_bytes: int
    drain_total: int
    drain_rate: float

    @classmethod
    def _of(cls, s: N.CkptStatus) -> "CheckpointStatus":
        return cls(
            _step(s.local_step), _step(s.durable_step), _step(s.complete_step),
            _step(s.durable_complete_step), float(s.last_stall_s), float(s.last_wait_s),
            int(s.drain_bytes), int(s.drain_total), float(s.drain_rate),
        )


class Checkpointer:
    """Checkpoints in directory, agreed by every rank at the step boundary:
    periodic (every_steps, every_seconds on rank 0's clock) and on preemption
    (SIGTERM to any rank, or a notice on any node). keep: complete checkpoints
    kept. Without comm it makes one: gpulaunch's, or under torchrun one over
    torch.distributed's default process group (created by then or later).

    durable: a second tier the checkpoints drain to in the background, a
    shared directory or "s3://bucket/prefix" (keep_durable: complete
    checkpoints kept there, 0: keep's value); restore() takes the newest step
    every rank can load from either. async_save (default): step_end stops
    training only for the copy of the state into a staging buffer, and the
    files are written in the background; False: step_end returns once this
    rank's files are written. Call wait() once after the training loop (the
    with statement does): the last checkpoint is COMPLETE only then."""

    comm: Comm

    def __init__(
        self,
        directory: Union[str, "os.PathLike[str]", None],
        every_steps: int = 0,
        every_seconds: float = 0.0,
        keep: int = 3,
        comm: Optional[Comm] = None,
        handle_sigterm: bool = True,
        durable: Union[str, "os.PathLike[str]", None] = None,
        keep_durable: int = 0,
        async_save: bool = True,
    ) -> None:
        if not isinstance(every_steps, int) or every_steps < 0:
            raise ValueError(f"Checkpointer: every_steps must be an int >= 0, not {every_steps!r}")
        if not every_seconds >= 0:
            raise ValueError(f"Checkpointer: every_seconds must be >= 0, not {every_seconds!r}")
        if not isinstance(keep, int) or keep < 1:
            raise ValueError(f"Checkpointer: keep must be an int >= 1, not {keep!r}")
        if not isinstance(keep_durable, int) or keep_durable < 0:
            raise ValueError(f"Checkpointer: keep_durable must be an int >= 0 (0: keep's), not {keep_durable!r}")
        self._durable: Optional[str] = None
        if durable is not None:
            d = os.fspath(durable)
            if not d.startswith("s3://"):
                d = os.path.abspath(d)
                os.makedirs(d, exist_ok=True)
            self._durable = d
        if directory is None:
            if self._durable is None or self._durable.startswith("s3://"):
                raise ValueError("Checkpointer: directory is needed (a durable tier in S3 drains from it)")
            self._dir: Optional[str] = None
        else:
            self._dir = os.path.abspath(os.fspath(directory))
            os.makedirs(self._dir, exist_ok=True)
        L = N.lib()
        v2 = getattr(L, "gpl_ckpt_wait", None) is not None  # else a library of version 1 options
        if not v2 and (self._durable is not None or directory is None):
            raise Error(
                N.GPL_ERR_UNSUPPORTED,
                "gpulaunch: the loaded libgpulaunch has no durable checkpoint tier: it is older than "
                "this Python package; install a matching library (or point GPULAUNCH_LIBRARY at one)",
                "GPL_ERR_UNSUPPORTED",
            )
        self._v2 = v2
        self._own = comm is None
        if comm is None:
            from . import _torchdist

            comm = _torchdist.make_comm() if _torchdist.under_other_launcher() else Comm()
        self.comm = comm
        self._save_fn: Optional[SaveFn] = None
        self._load_fn: Optional[LoadFn] = None
        self._read_bytes = 0  # what the load callbacks of the restore under way read
        self._save_c = N.SAVE_FN(self._on_save)
        self._load_c = N.LOAD_FN(self._on_load)
        self._pins = _statefile.StagePins()
        opts = N.CkptOptions(
            ctypes.sizeof(N.CkptOptions), N.CKPT_OPTIONS_VERSION,
            os.fsencode(self._dir) if self._dir is not None else None, keep, every_steps,
            float(every_seconds), 1 if handle_sigterm else 0,
            os.fsencode(self._durable) if self._durable is not None else None, keep_durable,
            1 if async_save else 0,
        )
        if not v2:
            opts.size, opts.version = N.CKPT_OPTIONS_V1_SIZE, 1
        self._sigterm = handle_sigterm
        self._py_sigterm = signal.getsignal(signal.SIGTERM)  # what Python believes is installed
        self._told_sigterm = False
        rc = L.gpl_ckpt_setup(comm._handle(), ctypes.byref(opts), self._save_c, self._load_c, None)
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
            w = CheckpointWriter(self.comm, ck, step, left, self._pins)
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
                self._read_bytes += r.bytes_read
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
        self._read_bytes = 0
        t0 = time.monotonic()
        try:
            rc = N.lib().gpl_ckpt_restore(h, ctypes.byref(step))
        finally:
            self._load_fn = None
        self.comm._check(rc)
        if step.value < 0:
            return None
        # the launcher's line for the round and the job page say where the state came from
        progress.state_source("checkpoint", step.value, self._read_bytes, time.monotonic() - t0)
        return step.value

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

    def wait(self) -> None:
        """A collective: every rank calls it, once after the training loop
        (the with statement calls it when the block ends without an
        exception). Waits until this rank's saves are written and drained to
        the durable tier, agrees with every rank and marks the newest step
        every rank wrote COMPLETE in each tier; until then the last
        checkpoint is not one restore() takes. Not after step_end returned
        True: a preemption's checkpoint is complete already."""
        h = self._start()
        if not self._v2:
            return  # an older library saves synchronously
        self.comm._check(N.fn("gpl_ckpt_wait")(h))

    def status(self) -> CheckpointStatus:
        """What this rank's checkpoints are doing (no collective)."""
        if self._closed:
            raise Error(N.GPL_ERR_STATE, "gpulaunch: the Checkpointer is closed", "GPL_ERR_STATE")
        s = N.CkptStatus.init()
        rc = N.fn("gpl_ckpt_status_get")(self.comm._handle(), ctypes.byref(s))
        if rc != N.GPL_OK:
            raise self.comm._error(rc)
        return CheckpointStatus._of(s)

    def close(self) -> None:
        """Ends checkpointing; SIGTERM gets back the action Python had for it.
        A communicator the Checkpointer made is closed too (the saves still
        in flight are written first, but not marked COMPLETE: close() is no
        collective, so that it may run on an error path; call wait() before
        it, or use the with statement)."""
        if self._closed:
            return
        self._closed = True
        self._pins.release()
        if self._sigterm:
            try:
                signal.signal(signal.SIGTERM, self._py_sigterm)
            except (ValueError, TypeError):  # not the main thread, or a handler from C
                pass
        if self._own:
            self.comm.close()

    def __enter__(self) -> "Checkpointer":
        return self

    def __exit__(self, exc_type: Optional[type], exc: Optional[BaseException], tb: object) -> None:
        """wait(), then close(); only close() when an exception is in flight
        (a collective there could wait for ranks that never come)."""
        try:
            if exc_type is None and not self._closed:
                self.wait()
        finally:
            self.close()
