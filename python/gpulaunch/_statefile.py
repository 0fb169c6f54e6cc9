"""The file of CheckpointWriter.save_state / CheckpointReader.load_state: a
nested state (dicts with str or int keys, lists, tuples, None, bool, int,
float, str, torch tensors) in one file, without pickle, so loading it runs no
code of the file's.

    bytes 0-7    b"GPLSTATE"
    bytes 8-15   H, the header's length (little-endian uint64)
    16 .. 16+H   the header, JSON (UTF-8):
                   {"format": "gpulaunch-state", "version": 1,
                    "tensors": [{"dtype": "float32", "shape": [4, 3], "offset": 0,
                                 "nbytes": 48, "device": "cuda:0"}, ...],
                    "state": SKELETON}
    then         the tensors' bytes (C order, the machine's byte order), each at
                 D + offset, D = 16 + H rounded up to 64 (every offset is a
                 multiple of 64; the padding is zeros)

SKELETON is the state with JSON's null, true/false, numbers, strings and
arrays for None, bool, int and float, str and list; everything else is an
object whose "$" says what it is: {"$": "tensor", "i": index into tensors},
{"$": "tuple", "v": [...]}, {"$": "dict", "v": [[key, value], ...]} (keys
str or int, in order), {"$": "odict", "v": [...], "meta": ...} (an
OrderedDict, with the _metadata a torch state_dict carries), {"$": "size",
"v": [...]} (torch.Size). A tensor met twice (the same view of the same
memory: tied weights) is stored once and loads as one tensor."""

from __future__ import annotations

import collections
import ctypes
import json
import mmap
import os
import struct
import sys
from typing import Any, Callable, Optional

MAGIC = b"GPLSTATE"
FORMAT = "gpulaunch-state"
VERSION = 1
ALIGN = 64
_PREFIX = struct.Struct("<8sQ")

# dtype names as torch spells them (torch.float32 -> "float32"); those this
# torch lacks are left out
_DTYPE_NAMES = (
    "float64", "float32", "float16", "bfloat16", "complex128", "complex64", "complex32",
    "int64", "int32", "int16", "int8", "uint8", "uint16", "uint32", "uint64", "bool",
    "float8_e4m3fn", "float8_e5m2", "float8_e4m3fnuz", "float8_e5m2fnuz",
)
_SCALARS = (type(None), bool, int, float, str)


def _align(n: int) -> int:
    return (n + ALIGN - 1) // ALIGN * ALIGN


def dtypes(torch: Any) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for name in _DTYPE_NAMES:
        d = getattr(torch, name, None)
        if isinstance(d, torch.dtype):
            out[name] = d
    return out


def _key_text(k: Any) -> str:
    return f"[{k!r}]"


class Plan:
    """A state walked: its skeleton, its distinct tensors and where each one's
    bytes go; size is the file's."""

    def __init__(self, torch: Any, state: Any, name: str) -> None:
        self._torch = torch
        self._name = name
        self._dtypes = {v: k for k, v in dtypes(torch).items()}
        self._seen: dict[tuple[Any, ...], int] = {}
        self._path_ids: set[int] = set()
        self.sources: list[Any] = []  # detached tensors, in table order
        self.table: list[dict[str, Any]] = []
        skeleton = self._enc(state, "state")
        at = 0
        for entry in self.table:
            at = _align(at)
            entry["offset"] = at
            at += entry["nbytes"]
        head = {"format": FORMAT, "version": VERSION, "tensors": self.table, "state": skeleton}
        text = json.dumps(head, separators=(",", ":"), ensure_ascii=True, allow_nan=True).encode()
        self.header = _PREFIX.pack(MAGIC, len(text)) + text
        self.data_start = _align(len(self.header))
        self.size = self.data_start + at

    def _fail(self, path: str, why: str) -> TypeError:
        return TypeError(f"save_state({self._name!r}): {path} {why}")

    def _enc(self, x: Any, path: str) -> Any:
        t = type(x)
        if t in _SCALARS:
            return x
        torch = self._torch
        if isinstance(x, torch.Tensor):
            return {"$": "tensor", "i": self._tensor(x, path)}
        if t is torch.Size:
            return {"$": "size", "v": [int(v) for v in x]}
        if t not in (list, tuple, dict, collections.OrderedDict):
            what = f"{t.__module__}.{t.__qualname__}" if t.__module__ != "builtins" else t.__qualname__
            raise self._fail(
                path,
                f"is a {what}: a state holds dict (str or int keys), list, tuple, None, bool, int, "
                "float, str and torch.Tensor (convert it, e.g. tuple(x), float(x), x.tolist())",
            )
        if id(x) in self._path_ids:
            raise self._fail(path, "contains itself")
        self._path_ids.add(id(x))
        try:
            if t is list:
                return [self._enc(v, f"{path}[{i}]") for i, v in enumerate(x)]
            if t is tuple:
                return {"$": "tuple", "v": [self._enc(v, f"{path}[{i}]") for i, v in enumerate(x)]}
            pairs = []
            for k, v in x.items():
                if type(k) not in (str, int, bool):
                    raise self._fail(path, f"has the key {k!r} ({type(k).__name__}): keys are str or int")
                pairs.append([k, self._enc(v, path + _key_text(k))])
            out: dict[str, Any] = {"$": "dict", "v": pairs}
            if t is collections.OrderedDict:
                out["$"] = "odict"
                meta = getattr(x, "_metadata", None)
                if meta is not None:
                    out["meta"] = self._enc(meta, path + "._metadata")
            return out
        finally:
            self._path_ids.discard(id(x))

    def _tensor(self, x: Any, path: str) -> int:
        torch = self._torch
        if x.layout != torch.strided:
            raise self._fail(path, f"is a {x.layout} tensor: only dense (strided) tensors are saved; use .to_dense()")
        if x.device.type not in ("cpu", "cuda"):
            raise self._fail(path, f"is on {x.device}: tensors on the CPU or CUDA devices are saved")
        dname = self._dtypes.get(x.dtype)
        if dname is None:
            raise self._fail(path, f"has the dtype {x.dtype}, which save_state does not save")
        key: Optional[tuple[Any, ...]] = None
        if x.numel() > 0:
            key = (str(x.device), x.data_ptr(), x.dtype, tuple(x.shape), tuple(x.stride()))
            if key in self._seen:
                return self._seen[key]
        src = x.detach()
        if src.is_conj():
            src = src.resolve_conj()
        if src.is_neg():
            src = src.resolve_neg()
        i = len(self.table)
        self.table.append({
            "dtype": dname,
            "shape": [int(s) for s in src.shape],
            "offset": 0,
            "nbytes": int(src.numel()) * int(src.element_size()),
            "device": str(src.device),
        })
        self.sources.append(src)
        if key is not None:
            self._seen[key] = i
        return i

    def fill(self, ptr: int, pins: "Optional[StagePins]") -> None:
        """Writes the file into the size bytes at ptr (the staging buffer):
        the header, zeros between, each tensor's bytes; CUDA tensors copied
        on a side stream into pinned memory, waited for before returning."""
        torch = self._torch
        ctypes.memmove(ptr, self.header, len(self.header))
        at = len(self.header)
        for entry in self.table:
            start = self.data_start + entry["offset"]
            if start > at:
                ctypes.memset(ptr + at, 0, start - at)
            at = start + entry["nbytes"]
        if self.size > at:
            ctypes.memset(ptr + at, 0, self.size - at)
        stage_tensors(torch, ptr, self.size,
                      [(self.data_start + e["offset"], e["nbytes"], s) for e, s in zip(self.table, self.sources)],
                      pins)


def stage_tensors(torch: Any, ptr: int, size: int, items: "list[tuple[int, int, Any]]",
                  pins: "Optional[StagePins]") -> None:
    """Copies each (offset, nbytes, tensor) into the size bytes at ptr (the
    staging buffer), in C order: CUDA tensors first, on a side stream into
    the pinned range of the buffer (a plain copy where pinning fails), then
    the host ones while the GPUs copy; returns once every copy is done."""
    staged = torch.frombuffer((ctypes.c_uint8 * size).from_address(ptr), dtype=torch.uint8)
    cuda = [(a, n, s) for a, n, s in items if s.is_cuda and n]
    streams: list[Any] = []
    try:
        if cuda:
            lo = min(a for a, _, _ in cuda)
            hi = max(a + n for a, n, _ in cuda)
            pinned = pins is not None and pins.ensure(ptr + lo, ptr + hi)
            for a, n, s in cuda:
                if not pinned:  # a plain copy, done when copy_ returns
                    staged[a:a + n].copy_(_bytes_of(torch, s))
                    continue
                assert pins is not None
                stream = pins.stream(torch, s.device)
                if stream not in streams:  # after what the program's stream does to the tensors
                    stream.wait_stream(torch.cuda.current_stream(s.device))
                    streams.append(stream)
                with torch.cuda.stream(stream):
                    staged[a:a + n].copy_(_bytes_of(torch, s), non_blocking=True)
        for a, n, s in items:
            if n and not s.is_cuda:
                _copy_host(torch, staged[a:a + n], s)
    finally:
        for stream in streams:  # the staging buffer is the writer's once save_fn returns
            stream.synchronize()
    del staged


def _bytes_of(torch: Any, t: Any) -> Any:
    """t's elements as a flat uint8 tensor (a contiguous copy when t is not)."""
    return t.contiguous().reshape(-1).view(torch.uint8)


def _copy_host(torch: Any, dst: Any, src: Any) -> None:
    """A host tensor's bytes into dst (uint8, 64-byte aligned), in C order. A
    non-contiguous one is copied element by element into dst viewed as its
    dtype and shape: no contiguous copy of it is made on the way (memory
    stays flat from save to save); where torch cannot view or copy that
    dtype so, through a contiguous copy."""
    if not src.is_contiguous():
        try:
            dst.view(src.dtype).view(src.shape).copy_(src)
            return
        except RuntimeError:
            pass
    dst.copy_(_bytes_of(torch, src))


# ---- CUDA: the staging buffer pinned ----

_CUDA_HOST_REGISTER_PORTABLE = 1


def _clear_cuda_error() -> None:
    """A failed runtime call leaves its error to the next cudaGetLastError,
    which torch's next kernel launch check would report as its own: read it
    here (from the libcudart this process loaded)."""
    try:
        with open("/proc/self/maps") as f:
            paths = {ln.split()[-1] for ln in f if "libcudart" in ln and "/" in ln}
        for p in sorted(paths):
            ctypes.CDLL(p).cudaGetLastError()
    except (OSError, AttributeError):
        pass


def _cuda_register(ptr: int, size: int) -> bool:
    import torch

    rt = torch.cuda.cudart()
    rc = rt.cudaHostRegister(ptr, size, _CUDA_HOST_REGISTER_PORTABLE)
    if int(rc) == 0:
        return True
    _clear_cuda_error()
    try:
        why = str(rt.cudaGetErrorString(rc))
    except Exception:  # noqa: BLE001 - only the message
        why = f"error {int(rc)}"
    sys.stderr.write(
        f"gpulaunch: cannot pin the checkpoint staging buffer for CUDA copies (cudaHostRegister of "
        f"{size >> 20} MiB: {why}); CUDA tensors are copied to it without pinning (slower)\n"
    )
    return False


def _cuda_unregister(ptr: int) -> None:
    import torch

    if int(torch.cuda.cudart().cudaHostUnregister(ptr)) != 0:
        _clear_cuda_error()


class StagePins:
    """The ranges of the staging buffer registered with CUDA (cudaHostRegister),
    page-aligned and disjoint, kept from save to save: the buffer never moves
    and is reused, so the same range is registered once. A range that grows
    replaces those it overlaps; after a failure nothing more is registered."""

    def __init__(
        self,
        register: Callable[[int, int], bool] = _cuda_register,
        unregister: Callable[[int], None] = _cuda_unregister,
    ) -> None:
        self._register = register
        self._unregister = unregister
        self.ranges: list[tuple[int, int]] = []  # [start, end)
        self.failed = False
        self._streams: dict[Any, Any] = {}

    def ensure(self, start: int, end: int) -> bool:
        """True when [start, end) is pinned (now, or before)."""
        page = mmap.PAGESIZE
        s, e = start // page * page, -(-end // page) * page
        if any(a <= s and e <= b for a, b in self.ranges):
            return True
        if self.failed:
            return False
        over = [(a, b) for a, b in self.ranges if a < e and s < b]
        for a, b in over:
            self._unregister(a)
            self.ranges.remove((a, b))
        s, e = min([s] + [a for a, _ in over]), max([e] + [b for _, b in over])
        if self._register(s, e - s):
            self.ranges.append((s, e))
            return True
        self.failed = True
        return False

    def stream(self, torch: Any, device: Any) -> Any:
        """The side stream of device the copies go on (made once)."""
        key = str(device)
        if key not in self._streams:
            self._streams[key] = torch.cuda.Stream(device)
        return self._streams[key]

    def release(self) -> None:
        """Unregisters every range (before the staging buffer goes)."""
        ranges, self.ranges = self.ranges, []
        for a, _ in ranges:
            try:
                self._unregister(a)
            except Exception:  # noqa: BLE001 - a closing path: CUDA may be gone
                pass
        self._streams.clear()


# ---- loading ----


def _corrupt(path: str, why: str) -> ValueError:
    return ValueError(f"load_state: {path} {why}")


def load(torch: Any, path: str, map_location: Any = None) -> Any:
    """The state in the file at path; tensors on the CPU, or moved to
    map_location."""
    table = dtypes(torch)
    with open(path, "rb", buffering=0) as f:
        size = os.fstat(f.fileno()).st_size
        pre = _read_exact(f, _PREFIX.size)
        if len(pre) < _PREFIX.size or pre[:8] != MAGIC:
            raise _corrupt(path, "is not a file of save_state (no GPLSTATE at its start)")
        _, hlen = _PREFIX.unpack(pre)
        if _PREFIX.size + hlen > size:
            raise _corrupt(path, f"is cut short: its header says {hlen} bytes, the file has {size}")
        try:
            head = json.loads(_read_exact(f, hlen).decode())
        except ValueError as why:
            raise _corrupt(path, f"has a header that is not JSON ({why})") from None
        if not isinstance(head, dict) or head.get("format") != FORMAT:
            raise _corrupt(path, "has no gpulaunch-state header")
        if head.get("version") != VERSION:
            raise _corrupt(path, f"is version {head.get('version')!r} of the format; this gpulaunch reads {VERSION}")
        data_start = _align(_PREFIX.size + hlen)
        tensors: list[Any] = []
        entries = head.get("tensors")
        if not isinstance(entries, list):
            raise _corrupt(path, "has no tensor table")
        for i, entry in enumerate(entries):
            tensors.append(_load_tensor(torch, f, path, i, entry, table, data_start, size, map_location))
        return _Decoder(path, tensors).dec(head.get("state"))


def _read_exact(f: Any, n: int) -> bytes:
    parts = []
    while n > 0:
        b = f.read(n)
        if not b:
            break
        parts.append(b)
        n -= len(b)
    return b"".join(parts)


def _load_tensor(
    torch: Any, f: Any, path: str, i: int, e: Any, table: dict[str, Any], data_start: int, size: int,
    map_location: Any,
) -> Any:
    ok = isinstance(e, dict) and isinstance(e.get("shape"), list) and all(
        type(s) is int and s >= 0 for s in e["shape"]) and type(e.get("offset")) is int and type(
        e.get("nbytes")) is int and e["offset"] >= 0
    if not ok:
        raise _corrupt(path, f"has a malformed entry {i} in its tensor table")
    dtype = table.get(e.get("dtype"))
    if dtype is None:
        raise _corrupt(path, f"has tensor {i} of dtype {e.get('dtype')!r}, which this torch lacks")
    t = torch.empty(e["shape"], dtype=dtype)
    n = int(t.numel()) * int(t.element_size())
    at = data_start + e["offset"]
    if n != e["nbytes"] or at + n > size:
        raise _corrupt(path, f"is cut short or damaged: tensor {i} ({n} bytes at {at}) does not fit its {size} bytes")
    if n:
        f.seek(at)
        view = memoryview((ctypes.c_char * n).from_address(t.data_ptr())).cast("B")
        got = 0
        while got < n:
            k = f.readinto(view[got:])
            if not k:
                raise _corrupt(path, f"ended inside tensor {i}")
            got += k
        del view
    if map_location is not None:
        t = t.to(map_location)
    return t


class _Decoder:
    def __init__(self, path: str, tensors: list[Any]) -> None:
        self._path = path
        self._tensors = tensors

    def _bad(self, x: Any) -> ValueError:
        return _corrupt(self._path, f"has an unknown value in its state: {str(x)[:80]}")

    def dec(self, x: Any) -> Any:
        if type(x) in _SCALARS:
            return x
        if type(x) is list:
            return [self.dec(v) for v in x]
        if type(x) is not dict:
            raise self._bad(x)
        kind, v = x.get("$"), x.get("v")
        if kind == "tensor":
            i = x.get("i")
            if type(i) is not int or not 0 <= i < len(self._tensors):
                raise self._bad(x)
            return self._tensors[i]
        if kind in ("tuple", "size") and type(v) is list:
            items = [self.dec(w) for w in v]
            if kind == "tuple":
                return tuple(items)
            import torch

            return torch.Size(items)
        if kind in ("dict", "odict") and type(v) is list:
            out: Any = {} if kind == "dict" else collections.OrderedDict()
            for pair in v:
                if type(pair) is not list or len(pair) != 2 or type(pair[0]) not in (str, int, bool):
                    raise self._bad(pair)
                out[pair[0]] = self.dec(pair[1])
            if kind == "odict" and "meta" in x:
                out._metadata = self.dec(x["meta"])
            return out
        raise self._bad(x)
