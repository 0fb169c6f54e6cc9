"""libgpulaunch through ctypes: finding and loading the library, the C
declarations the package uses, and the one exception type, Error."""

from __future__ import annotations

import ctypes
import ctypes.util
import glob
import importlib
import importlib.util
import os
import sys
import threading
from typing import Any, Callable, Optional

GPL_OK = 0
GPL_ERR_INVALID_ARG = 1
GPL_ERR_SYSTEM = 3
GPL_ERR_TIMEOUT = 4
GPL_ERR_STATE = 11
GPL_ERR_PEER_FAILED = 12
GPL_ERR_ROUND_OVER = 13
GPL_ERR_UNSUPPORTED = 14
GPL_ERR_PREEMPTED = 18

GPL_EXIT_PREEMPTED = 143

BACKENDS = {"auto": 0, "cpu": 1, "nccl": 2}
BACKEND_NAMES = {0: "auto", 1: "cpu", 2: "nccl", 3: "external"}

# gpl_dtype_t and gpl_op_t
FLOAT32, FLOAT64, FLOAT16, BFLOAT16, INT32, INT64 = range(6)
DTYPE_NAMES = {
    FLOAT32: "float32",
    FLOAT64: "float64",
    FLOAT16: "float16",
    BFLOAT16: "bfloat16",
    INT32: "int32",
    INT64: "int64",
}
DTYPE_SIZES = {FLOAT32: 4, FLOAT64: 8, FLOAT16: 2, BFLOAT16: 2, INT32: 4, INT64: 8}
OPS = {"sum": 0, "prod": 1, "min": 2, "max": 3, "avg": 4}

CKPT_PATH_MAX = 4096

# gpl_round_state: the launcher's view of a worker's round (gpl_round_wait)
ROUND_RUNNING, ROUND_OVER, ROUND_NEW, ROUND_RESTART = range(4)
ROUND_ADDR_MAX = 256
ROUND_WHY_MAX = 256

c_result = ctypes.c_int


class Error(RuntimeError):
    """Every failure of libgpulaunch: code is the gpl_result_t value, name its
    symbol ("GPL_ERR_TIMEOUT"), str(e) the library's message (what, where,
    what to do)."""

    def __init__(self, code: int, message: str, name: Optional[str] = None) -> None:
        super().__init__(message)
        self.code = code
        self.name = name if name is not None else result_name(code)

    def __reduce__(self) -> tuple[Any, ...]:  # picklable (multiprocessing) despite its signature
        return (type(self), (self.code, str(self), self.name))


class Options(ctypes.Structure):
    _fields_ = [
        ("size", ctypes.c_size_t),
        ("version", ctypes.c_uint32),
        ("backend", ctypes.c_int),
        ("timeout_ms", ctypes.c_uint32),
        ("rank", ctypes.c_int),
        ("world_size", ctypes.c_int),
        ("local_rank", ctypes.c_int),
        ("local_world_size", ctypes.c_int),
        ("rdzv_endpoint", ctypes.c_char_p),
        ("run_id", ctypes.c_char_p),
        ("token", ctypes.c_char_p),
        ("round", ctypes.c_int),
        ("small_bytes", ctypes.c_size_t),
        ("device", ctypes.c_int),
    ]

    @classmethod
    def init(cls, backend: int) -> "Options":
        """GPL_OPTIONS_INIT with the backend set."""
        return cls(ctypes.sizeof(cls), 1, backend, 0, -1, -1, -1, -1, None, None, None, -1, 0, -1)


EXT_ALLREDUCE_FN = ctypes.CFUNCTYPE(
    ctypes.c_int, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_void_p
)
EXT_BROADCAST_FN = ctypes.CFUNCTYPE(
    ctypes.c_int, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_void_p
)
EXT_BARRIER_FN = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p)


class ExternalOps(ctypes.Structure):
    _fields_ = [
        ("size", ctypes.c_size_t),
        ("version", ctypes.c_uint32),
        ("allreduce", EXT_ALLREDUCE_FN),
        ("broadcast", EXT_BROADCAST_FN),
        ("barrier", EXT_BARRIER_FN),
        ("user", ctypes.c_void_p),
    ]


CKPT_OPTIONS_VERSION = 2
CKPT_STATUS_VERSION = 1


class CkptOptions(ctypes.Structure):
    """gpl_ckpt_options, version 2 (durable, keep_durable, async_save added to
    version 1: a library that knows only version 1 is handed the first
    CKPT_OPTIONS_V1_SIZE bytes)."""

    _fields_ = [
        ("size", ctypes.c_size_t),
        ("version", ctypes.c_uint32),
        ("dir", ctypes.c_char_p),
        ("keep", ctypes.c_int),
        ("every_steps", ctypes.c_int64),
        ("every_seconds", ctypes.c_double),
        ("handle_sigterm", ctypes.c_int),
        # version 2
        ("durable", ctypes.c_char_p),
        ("keep_durable", ctypes.c_int),
        ("async_save", ctypes.c_int),
    ]


CKPT_OPTIONS_V1_SIZE = CkptOptions.durable.offset


class CkptStatus(ctypes.Structure):
    """gpl_ckpt_status, version 1: what this rank's checkpoints are doing
    (steps -1: none)."""

    _fields_ = [
        ("size", ctypes.c_size_t),
        ("version", ctypes.c_uint32),
        ("local_step", ctypes.c_int64),
        ("durable_step", ctypes.c_int64),
        ("complete_step", ctypes.c_int64),
        ("durable_complete_step", ctypes.c_int64),
        ("last_stall_s", ctypes.c_double),
        ("last_wait_s", ctypes.c_double),
        ("drain_bytes", ctypes.c_uint64),
        ("drain_total", ctypes.c_uint64),
        ("drain_rate", ctypes.c_double),
    ]

    @classmethod
    def init(cls) -> "CkptStatus":
        """GPL_CKPT_STATUS_INIT."""
        return cls(ctypes.sizeof(cls), CKPT_STATUS_VERSION, -1, -1, -1, -1, 0.0, 0.0, 0, 0, 0.0)


class RoundInfo(ctypes.Structure):
    """gpl_round_info: the round block the launcher writes for workers that
    re-form in place."""

    _fields_ = [
        ("seq", ctypes.c_uint32),
        ("state", ctypes.c_int),  # gpl_round_state, an enum
        ("round", ctypes.c_int),
        ("node_rank", ctypes.c_int),
        ("nnodes", ctypes.c_int),
        ("base_rank", ctypes.c_int),
        ("world_size", ctypes.c_int),
        ("master_port", ctypes.c_int),
        ("restarts", ctypes.c_int),
        ("master_addr", ctypes.c_char * ROUND_ADDR_MAX),
        ("why", ctypes.c_char * ROUND_WHY_MAX),
    ]


class ReformInfo(ctypes.Structure):
    """gpl_reform_info: where the job goes on from (gpl_reform_agree), what
    gpl_copy_state takes."""

    _fields_ = [
        ("step", ctypes.c_int64),
        ("root", ctypes.c_int),
        ("survivors", ctypes.c_int),
        ("copy", ctypes.c_int),
        ("mine", ctypes.c_int),
    ]


SAVE_FN = ctypes.CFUNCTYPE(c_result, ctypes.c_void_p, ctypes.c_int64, ctypes.c_double, ctypes.c_void_p)
LOAD_FN = ctypes.CFUNCTYPE(c_result, ctypes.c_void_p, ctypes.c_int64, ctypes.c_void_p)


class MirrorStatus(ctypes.Structure):
    """gpl_mirror_status."""

    _fields_ = [
        ("rank", ctypes.c_int),
        ("world", ctypes.c_int),
        ("round", ctypes.c_int),
        ("buddy", ctypes.c_int),
        ("buddy_same_node", ctypes.c_int),
        ("own_step", ctypes.c_int64),
        ("sent_step", ctypes.c_int64),
        ("in_flight", ctypes.c_int),
        ("bytes", ctypes.c_size_t),
        ("held_bytes", ctypes.c_size_t),
        ("held_ranks", ctypes.c_int),
        ("last_push_s", ctypes.c_double),
        ("last_rate_mbs", ctypes.c_double),
        ("last_wait_s", ctypes.c_double),
    ]

_P = ctypes.c_void_p
_SIGNATURES: dict[str, tuple[Any, list[Any]]] = {
    "gpl_version": (ctypes.c_int, []),
    "gpl_result_name": (ctypes.c_char_p, [c_result]),
    "gpl_strerror": (ctypes.c_char_p, [c_result]),
    "gpl_init": (c_result, [ctypes.POINTER(Options), ctypes.POINTER(_P)]),
    "gpl_init_external": (
        c_result,
        [ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.POINTER(ExternalOps), ctypes.POINTER(_P)],
    ),
    "gpl_finalize": (None, [_P]),
    "gpl_rank": (ctypes.c_int, [_P]),
    "gpl_world_size": (ctypes.c_int, [_P]),
    "gpl_local_rank": (ctypes.c_int, [_P]),
    "gpl_local_world_size": (ctypes.c_int, [_P]),
    "gpl_backend": (ctypes.c_int, [_P]),
    "gpl_last_error": (ctypes.c_char_p, [_P]),
    "gpl_allreduce": (c_result, [_P, _P, _P, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, _P]),
    "gpl_broadcast": (c_result, [_P, _P, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, _P]),
    "gpl_barrier": (c_result, [_P]),
    "gpl_ckpt_setup": (c_result, [_P, ctypes.POINTER(CkptOptions), SAVE_FN, LOAD_FN, _P]),
    "gpl_ckpt_restore": (c_result, [_P, ctypes.POINTER(ctypes.c_int64)]),
    "gpl_step_end": (c_result, [_P, ctypes.c_int64]),
    "gpl_ckpt_write": (c_result, [_P, ctypes.c_char_p, _P, ctypes.c_size_t]),
    "gpl_ckpt_read": (c_result, [_P, ctypes.c_char_p, _P, ctypes.c_size_t]),
    "gpl_ckpt_temp_path": (c_result, [_P, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_size_t]),
    "gpl_ckpt_commit": (c_result, [_P, ctypes.c_char_p]),
    "gpl_ckpt_path": (c_result, [_P, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_size_t]),
    "gpl_ckpt_rank_path": (c_result, [_P, ctypes.c_int, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_size_t]),
    "gpl_ckpt_saved_world": (ctypes.c_int, [_P]),
    "gpl_ckpt_stage": (c_result, [_P, ctypes.c_char_p, ctypes.c_size_t, ctypes.POINTER(_P)]),
    "gpl_ckpt_wait": (c_result, [_P]),
    "gpl_ckpt_status_get": (c_result, [_P, ctypes.POINTER(CkptStatus)]),
    "gpl_progress": (None, [ctypes.c_int64]),
    "gpl_progress_stack_signal": (None, [ctypes.c_int]),
    "gpl_progress_wait_begin": (None, []),
    "gpl_progress_wait_end": (None, []),
    "gpl_reform_enable": (c_result, []),
    "gpl_round_wait": (c_result, [ctypes.c_uint32, ctypes.c_uint32, ctypes.POINTER(RoundInfo)]),
    "gpl_round_ack": (None, [ctypes.c_int]),
    "gpl_await_round": (c_result, [ctypes.c_uint32, ctypes.POINTER(RoundInfo)]),
    "gpl_reform": (c_result, [_P, ctypes.c_uint32]),
    "gpl_round": (ctypes.c_int, [_P]),
    "gpl_reform_agree": (c_result, [_P, ctypes.c_int64, ctypes.POINTER(ReformInfo)]),
    "gpl_copy_state": (
        c_result,
        [_P, ctypes.POINTER(_P), ctypes.POINTER(ctypes.c_size_t), ctypes.c_int, ctypes.POINTER(ReformInfo)],
    ),
    "gpl_mirror_create": (c_result, [_P, _P, ctypes.POINTER(_P)]),
    "gpl_mirror_register": (c_result, [_P, _P, ctypes.c_size_t]),
    "gpl_mirror_stage": (c_result, [_P]),
    "gpl_mirror_push": (c_result, [_P, ctypes.c_int64]),
    "gpl_mirror_wait": (c_result, [_P]),
    "gpl_mirror_status_get": (c_result, [_P, ctypes.POINTER(MirrorStatus)]),
    "gpl_mirror_last_error": (ctypes.c_char_p, [_P]),
    "gpl_mirror_destroy": (None, [_P]),
    "gpl_mirror_agree": (c_result, [_P, _P, ctypes.POINTER(_P)]),
    "gpl_mirror_plan_info": (
        None, [_P, ctypes.POINTER(ctypes.c_int64), ctypes.POINTER(ctypes.c_int), ctypes.POINTER(ctypes.c_int)]),
    "gpl_mirror_holder": (ctypes.c_int, [_P, ctypes.c_int]),
    "gpl_mirror_view": (c_result, [_P, ctypes.c_int, ctypes.c_int, ctypes.POINTER(_P), ctypes.POINTER(ctypes.c_size_t)]),
    "gpl_mirror_plan_free": (None, [_P]),
}

_lock = threading.Lock()
_lib: Optional[ctypes.CDLL] = None
_on_load: list[Callable[[ctypes.CDLL], Any]] = []


def on_load(f: Callable[[ctypes.CDLL], Any]) -> None:
    """Runs f(lib) once the library is loaded (now, if it is)."""
    with _lock:
        loaded = _lib
        if loaded is None:
            _on_load.append(f)
    if loaded is not None:
        f(loaded)


def _candidates() -> list[str]:
    env = os.environ.get("GPULAUNCH_LIBRARY")
    if env:
        return [env]  # an explicit choice is never silently replaced
    here = os.path.dirname(os.path.abspath(__file__))
    found = sorted(glob.glob(os.path.join(here, "libgpulaunch.so*")))
    system = ctypes.util.find_library("gpulaunch")
    return found + ([system] if system else []) + ["libgpulaunch.so.0"]


def _torch_first() -> None:
    """Imports torch before libgpulaunch when it is installed. A libgpulaunch
    built with CUDA needs libnccl.so.2 and libcudart by soname, and so does
    torch: whichever loads first is the process's, and PyPI's torch refuses an
    older system NCCL ("libtorch_cuda.so: undefined symbol: ncclCommResume")
    while libgpulaunch works with torch's newer one."""
    if "torch" in sys.modules or importlib.util.find_spec("torch") is None:
        return
    try:
        importlib.import_module("torch")
    except Exception:  # a broken torch is the program's to meet, not ours
        pass


def lib() -> ctypes.CDLL:
    """The loaded library, with argument and result types declared."""
    global _lib
    with _lock:
        if _lib is not None:
            return _lib
        _torch_first()
        tried: list[str] = []
        for name in _candidates():
            try:
                handle = ctypes.CDLL(name)
            except OSError as e:
                tried.append(f"{name} ({e})")
                continue
            for fn, (res, args) in _SIGNATURES.items():
                f = getattr(handle, fn, None)  # newer entry points may be absent
                if f is not None:
                    f.restype, f.argtypes = res, args
            _lib = handle
            for f in _on_load:
                f(handle)
            _on_load.clear()
            return handle
        raise Error(
            GPL_ERR_SYSTEM,
            "gpulaunch: cannot load libgpulaunch; tried "
            + "; ".join(tried)
            + ". Install the gpulaunch package with its library, or set GPULAUNCH_LIBRARY "
            "to the path of libgpulaunch.so.0",
            "GPL_ERR_SYSTEM",
        )


def fn(name: str) -> Any:
    """A library function; Error when this build of the library lacks it."""
    f = getattr(lib(), name, None)
    if f is None:
        raise Error(
            GPL_ERR_UNSUPPORTED,
            f"gpulaunch: the loaded libgpulaunch has no {name}: it is older than this "
            "Python package; install a matching library (or point GPULAUNCH_LIBRARY at one)",
            "GPL_ERR_UNSUPPORTED",
        )
    return f


def result_name(code: int) -> str:
    try:
        name = fn("gpl_result_name")(code)
    except Error:
        return f"GPL_ERR_{code}"
    return str(name.decode()) if name else f"GPL_ERR_{code}"


def strerror(code: int) -> str:
    msg = fn("gpl_strerror")(code)
    return str(msg.decode(errors="replace")) if msg else f"error {code}"


def last_error(handle: Optional[int], code: int) -> str:
    """The communicator's last-error message, or the code's general one."""
    if handle:
        msg = fn("gpl_last_error")(handle)
        if msg:
            text = str(msg.decode(errors="replace"))
            if text:
                return text
    return strerror(code)
