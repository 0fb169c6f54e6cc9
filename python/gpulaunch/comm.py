"""The communicator of this process (gpl_comm_t) and the buffers its
collectives take: anything with the buffer protocol, or a torch tensor."""

from __future__ import annotations

import ctypes
import sys
from typing import Any, Callable, Optional

from . import _native as N
from ._firstround import await_round
from ._native import Error

# memoryview formats (byte order '@', '=' or '<' stripped) to reduction dtypes
_SIGNED_INT = "bhilqn"
_FLOAT_FORMATS = {("f", 4): N.FLOAT32, ("d", 8): N.FLOAT64, ("e", 2): N.FLOAT16}
_TORCH_DTYPES = {
    "torch.float32": N.FLOAT32,
    "torch.float64": N.FLOAT64,
    "torch.float16": N.FLOAT16,
    "torch.bfloat16": N.BFLOAT16,
    "torch.int32": N.INT32,
    "torch.int64": N.INT64,
}
_DTYPES_TEXT = (
    "float32, float64, float16, int32 and int64 (any buffer), bfloat16 (torch tensors)"
)

# an external communicator's collectives: (address, count, dtype[, op or root])
ExtAllreduce = Callable[[int, int, int, int], None]
ExtBroadcast = Callable[[int, int, int, int], None]
ExtBarrier = Callable[[], None]


class _Buf:
    """A buffer's address, element count and dtype (None: no reduction dtype),
    with the objects that keep the memory exported until the call is over."""

    def __init__(
        self, addr: Optional[int], nbytes: int, dtype: Optional[int], keep: Any, cuda: bool, desc: str
    ) -> None:
        self.addr = addr
        self.nbytes = nbytes
        self.dtype = dtype
        self.keep = keep
        self.cuda = cuda
        self.desc = desc

    @property
    def count(self) -> int:
        return self.nbytes // N.DTYPE_SIZES[self.dtype] if self.dtype is not None else self.nbytes


def _torch_buf(t: Any, what: str) -> _Buf:
    if not t.is_contiguous():
        raise ValueError(
            f"{what}: the tensor is not contiguous (shape {tuple(t.shape)}, strides {t.stride()}); "
            "the collective works in place: pass a contiguous tensor (t.contiguous(), then copy "
            "the result back)"
        )
    if t.device.type not in ("cpu", "cuda"):
        raise ValueError(f"{what}: a tensor on {t.device} is not supported; use a CPU tensor")
    dtype = _TORCH_DTYPES.get(str(t.dtype))
    nbytes = t.numel() * t.element_size()
    addr = t.data_ptr() if nbytes else None
    return _Buf(addr, nbytes, dtype, t, t.device.type == "cuda", f"a {t.dtype} tensor")


def _buffer(buf: Any, what: str) -> _Buf:
    torch = sys.modules.get("torch")  # a tensor means torch is imported already
    if torch is not None and isinstance(buf, torch.Tensor):
        return _torch_buf(buf, what)
    try:
        mv = memoryview(buf)
    except TypeError:
        raise TypeError(
            f"{what}: {type(buf).__name__} is not a buffer; pass a bytearray, array.array, "
            "memoryview, numpy array or torch tensor"
        ) from None
    if mv.readonly:
        raise TypeError(
            f"{what}: the {type(buf).__name__} buffer is read-only, and the collective writes "
            "its result in place; pass a writable one (a bytearray rather than bytes, a "
            "writeable numpy array)"
        )
    if not mv.c_contiguous:
        raise ValueError(
            f"{what}: the buffer is not C-contiguous; pass a contiguous one (numpy: "
            "np.ascontiguousarray, then copy the result back)"
        )
    fmt = mv.format.lstrip("@=<")
    dtype = _FLOAT_FORMATS.get((fmt, mv.itemsize))
    if dtype is None and fmt in _SIGNED_INT and mv.itemsize in (4, 8):
        dtype = N.INT32 if mv.itemsize == 4 else N.INT64
    desc = f"a {type(buf).__name__} of format {mv.format!r} (item size {mv.itemsize})"
    if mv.nbytes == 0:
        return _Buf(None, 0, dtype, mv, False, desc)
    arr = (ctypes.c_char * mv.nbytes).from_buffer(mv.cast("B"))
    return _Buf(ctypes.addressof(arr), mv.nbytes, dtype, arr, False, desc)


class Comm:
    """The communicator of this process, made from the launcher's environment
    (gpl_init). backend: "auto" (NCCL when built with it and a GPU is there),
    "cpu" or "nccl". Collectives work in place and must be called by every rank
    in the same order with buffers of the same size."""

    rank: int
    world_size: int
    local_rank: int
    local_world_size: int
    backend: str

    def __init__(self, backend: str = "auto") -> None:
        if backend not in N.BACKENDS:
            raise ValueError(f"Comm: backend {backend!r} is not one of auto, cpu, nccl")
        await_round()  # a worker started before its round: RANK & co. in os.environ first
        self._prepare()
        opts = N.Options.init(N.BACKENDS[backend])
        h = ctypes.c_void_p()
        rc = N.fn("gpl_init")(ctypes.byref(opts), ctypes.byref(h))
        self._adopt(rc, h)

    @classmethod
    def _external(
        cls,
        rank: int,
        world_size: int,
        local_rank: int,
        local_world_size: int,
        allreduce: ExtAllreduce,
        broadcast: ExtBroadcast,
        barrier: ExtBarrier,
        before: Optional[Callable[[], None]] = None,
    ) -> "Comm":
        """A communicator over another framework's collectives (gpl_init_external).
        The callables raise on failure; before() runs ahead of every collective."""
        self = cls.__new__(cls)
        self._prepare()
        self._before = before

        def ar(buf: Optional[int], count: int, dtype: int, op: int, user: Optional[int]) -> int:
            return self._guard(lambda: allreduce(buf or 0, count, dtype, op))

        def bc(buf: Optional[int], count: int, dtype: int, root: int, user: Optional[int]) -> int:
            return self._guard(lambda: broadcast(buf or 0, count, dtype, root))

        def br(user: Optional[int]) -> int:
            return self._guard(barrier)

        ops = N.ExternalOps(
            ctypes.sizeof(N.ExternalOps), 1, N.EXT_ALLREDUCE_FN(ar), N.EXT_BROADCAST_FN(bc),
            N.EXT_BARRIER_FN(br), None,
        )
        self._keep.append(ops)  # the C side keeps the function pointers
        h = ctypes.c_void_p()
        rc = N.fn("gpl_init_external")(
            rank, world_size, local_rank, local_world_size, ctypes.byref(ops), ctypes.byref(h)
        )
        self._adopt(rc, h)
        return self

    def _prepare(self) -> None:
        self._h: Optional[int] = None
        self._keep: list[Any] = []  # ctypes callbacks the library holds on to
        self._pending: Optional[BaseException] = None
        self._before: Optional[Callable[[], None]] = None

    def _adopt(self, rc: int, h: ctypes.c_void_p) -> None:
        if rc != N.GPL_OK:
            err = Error(rc, N.last_error(h.value, rc))
            if h.value:
                N.fn("gpl_finalize")(h)
            raise err
        self._h = h.value
        L = N.lib()
        self.rank = L.gpl_rank(self._h)
        self.world_size = L.gpl_world_size(self._h)
        self.local_rank = L.gpl_local_rank(self._h)
        self.local_world_size = L.gpl_local_world_size(self._h)
        self.backend = N.BACKEND_NAMES.get(L.gpl_backend(self._h), "unknown")

    def _guard(self, call: Callable[[], None]) -> int:
        """Runs a Python callback for C: an exception stays on this side, kept
        to be raised when the C call returns."""
        try:
            call()
            return 0
        except BaseException as e:  # noqa: B902 - nothing may unwind through C frames
            if self._pending is None:
                self._pending = e
            return 1

    def _handle(self) -> int:
        if self._h is None:
            raise Error(N.GPL_ERR_STATE, "gpulaunch: the communicator is closed", "GPL_ERR_STATE")
        return self._h

    def _error(self, rc: int) -> Error:
        return Error(rc, N.last_error(self._h, rc))

    def _check(self, rc: int, ok: tuple[int, ...] = (N.GPL_OK,)) -> None:
        """Raises for a failed call: a Python callback's own exception first
        (chained to the library's error), else Error."""
        pending, self._pending = self._pending, None
        if pending is not None:
            if rc in ok:
                raise pending
            err = self._error(rc)
            if pending.__cause__ is None and pending is not err:
                raise pending from err
            raise pending
        if rc not in ok:
            raise self._error(rc)

    def _start(self) -> int:
        h = self._handle()
        self._pending = None
        if self._before is not None:
            self._before()
        return h

    def _stream(self, b: _Buf, what: str) -> Optional[int]:
        if not b.cuda:
            return None
        if self.backend != "nccl":
            raise ValueError(
                f"{what}: a CUDA tensor needs the nccl backend (this communicator's is "
                f"{self.backend}); pass a CPU tensor or make the Comm with backend='nccl'"
            )
        import torch

        return int(torch.cuda.current_stream(b.keep.device).cuda_stream)

    def allreduce(self, buf: Any, op: str = "sum") -> None:
        """Reduces buf over every rank, in place. op: sum, prod, min, max, avg."""
        code = N.OPS.get(op) if isinstance(op, str) else None
        if code is None:
            raise ValueError(f"allreduce: op {op!r} is not one of {', '.join(N.OPS)}")
        b = _buffer(buf, "allreduce")
        if b.dtype is None:
            raise TypeError(f"allreduce: {b.desc} has no reduction dtype; reductions take {_DTYPES_TEXT}")
        stream = self._stream(b, "allreduce")
        h = self._start()
        rc = N.lib().gpl_allreduce(h, b.addr, b.addr, b.count, b.dtype, code, stream)
        del b
        self._check(rc)

    def broadcast(self, buf: Any, root: int = 0) -> None:
        """Copies root's buf to every rank's, in place; any buffer (bytes move)."""
        if not isinstance(root, int) or isinstance(root, bool):
            raise TypeError(f"broadcast: root must be an int, not {type(root).__name__}")
        b = _buffer(buf, "broadcast")
        stream = self._stream(b, "broadcast")
        h = self._start()
        L = N.lib()
        if b.dtype is not None:
            self._check(L.gpl_broadcast(h, b.addr, b.count, b.dtype, root, stream))
            return
        # no dtype of the library's: whole 4-byte words in place, then the tail
        words, tail = divmod(b.nbytes, 4)
        if tail and b.cuda:
            raise ValueError(f"broadcast: {b.desc} of {b.nbytes} bytes is not whole 4-byte words")
        self._check(L.gpl_broadcast(h, b.addr, words, N.INT32, root, stream))
        if tail:
            last = (ctypes.c_char * 4)()
            assert b.addr is not None
            ctypes.memmove(last, b.addr + 4 * words, tail)
            self._check(L.gpl_broadcast(h, last, 1, N.INT32, root, None))
            ctypes.memmove(b.addr + 4 * words, last, tail)

    def barrier(self) -> None:
        """Returns when every rank has called it."""
        h = self._start()
        self._check(N.lib().gpl_barrier(h))

    def close(self) -> None:
        """Frees the communicator (gpl_finalize); later calls raise Error."""
        if self._h is not None:
            N.fn("gpl_finalize")(self._h)
            self._h = None
            self._keep.clear()

    def __enter__(self) -> "Comm":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        state = "closed" if self._h is None else self.backend
        return f"<gpulaunch.Comm rank {getattr(self, 'rank', '?')} of {getattr(self, 'world_size', '?')}, {state}>"
