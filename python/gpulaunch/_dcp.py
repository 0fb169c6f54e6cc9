"""Sharded state (FSDP2, HSDP) through torch.distributed.checkpoint (DCP),
stored as gpulaunch checkpoint files: a StorageWriter that puts every rank's
shards into its staging buffer (one file a rank, written, hashed and drained
in the background like every other checkpoint file) and a StorageReader that
reads, in a world of any size, the shards each rank now owns from whichever
saving rank wrote them (CheckpointReader.rank_path: checked against that
rank's manifest, fetched from the durable tier when this node lacks it).

Layout of a state saved as `name`: each rank's file r<rank>-<name> holds its
items back to back (tensors as their raw bytes, C order, 64-byte aligned;
DCP's byte items as they are; CUDA shards copied into the pinned staging
buffer on a side stream, as save_state does), and rank 0's r0-<name>.metadata holds DCP's
plan (Metadata) with, for each item, the rank, offset, length, dtype and
shape that find it. The metadata is a pickle, as DCP's own; it is read only
after its SHA-256 matched the manifest, and through an unpickler that builds
DCP's metadata classes, torch's dtypes and sizes and plain containers only."""

from __future__ import annotations

import ctypes
import dataclasses
import importlib
import io
import mmap
import os
import pickle
from typing import TYPE_CHECKING, Any, Optional

from . import _statefile

if TYPE_CHECKING:
    from .checkpoint import CheckpointReader, CheckpointWriter

ALIGN = 64  # bytes: where each item starts in a rank's file
METADATA = ".metadata"  # suffix of the plan's file (rank 0's)


@dataclasses.dataclass(frozen=True)
class Location:
    """Where one saved item is: rank's file, bytes [offset, offset + length);
    dtype ("" for a byte item) and shape make a tensor of them again."""

    rank: int
    offset: int
    length: int
    dtype: str
    shape: tuple[int, ...]


def _torch() -> Any:
    try:
        import torch

        importlib.import_module("torch.distributed.checkpoint")
    except Exception as e:  # noqa: BLE001 - ImportError, or torch 1.13's failing under Python 3.11
        raise RuntimeError(f"gpulaunch: sharded checkpoints need torch.distributed.checkpoint: {e}") from e
    if not hasattr(torch.distributed.checkpoint, "StorageWriter"):
        raise RuntimeError(
            f"gpulaunch: sharded checkpoints need torch >= 2.2's torch.distributed.checkpoint "
            f"(this is torch {torch.__version__}); save replicated state with save_state instead"
        )
    return torch


def _enum_member(cls: Any, name: str) -> Any:
    """The getattr a pickled Enum member is rebuilt with, for Enum members only."""
    import enum

    if not (isinstance(cls, type) and issubclass(cls, enum.Enum) and name in cls.__members__):
        raise pickle.UnpicklingError(f"gpulaunch: the sharded checkpoint's metadata asks for {cls!r}.{name}")
    return cls[name]


class _MetadataUnpickler(pickle.Unpickler):
    """DCP's Metadata and what it holds, nothing else: a checkpoint's plan
    runs no code of its own when it is read (no function but Enum lookups and
    torch's layout by name; classes of DCP's metadata module and ours)."""

    def find_class(self, module: str, name: str) -> Any:
        torch = _torch()
        if module == "builtins" and name == "getattr":
            return _enum_member
        if module in ("builtins", "collections") and name in ("dict", "list", "tuple", "set", "frozenset",
                                                              "OrderedDict"):
            return super().find_class(module, name)
        if module == "torch" and (name == "Size" or isinstance(getattr(torch, name, None), torch.dtype)):
            return super().find_class(module, name)
        if module == "torch.serialization" and name == "_get_layout":
            return super().find_class(module, name)
        if module in ("torch.distributed.checkpoint.metadata", __name__) and not name.startswith("__"):
            found = super().find_class(module, name)
            if isinstance(found, type):
                return found
        raise pickle.UnpicklingError(
            f"gpulaunch: the sharded checkpoint's metadata asks for {module}.{name}, which a DCP "
            "plan does not hold: the file was not written by gpulaunch's save_sharded"
        )


def _mod(name: str) -> Any:
    return importlib.import_module(name)


def _future(value: Any) -> Any:
    torch = _torch()
    fut: Any = torch.futures.Future()
    fut.set_result(value)
    return fut


class _AsIs:
    """What gpulaunch's writer and reader leave as DCP plans it: the plans,
    and no checkpoint id (the Checkpointer names the step)."""

    def reset(self, checkpoint_id: Any = None) -> None:
        pass

    @classmethod
    def validate_checkpoint_id(cls, checkpoint_id: Any) -> bool:
        return True

    def prepare_local_plan(self, plan: Any) -> Any:
        return plan

    def prepare_global_plan(self, plans: list[Any]) -> list[Any]:
        return plans


def _writer_class() -> Any:
    torch = _torch()
    StorageWriter = _mod("torch.distributed.checkpoint").StorageWriter
    WriteItemType = _mod("torch.distributed.checkpoint.planner").WriteItemType
    WriteResult = _mod("torch.distributed.checkpoint.storage").WriteResult

    class Writer(_AsIs, StorageWriter):  # type: ignore[misc,valid-type]
        def __init__(self, w: "CheckpointWriter", name: str) -> None:
            super().__init__()
            self.w, self.name = w, name

        def set_up_storage_writer(self, is_coordinator: bool, *args: Any, **kwargs: Any) -> None:
            self.coordinator = is_coordinator

        def write_data(self, plan: Any, planner: Any) -> Any:
            # every item's place first (the file's size), then one stage and the copies:
            # host tensors by memcpy, CUDA ones on a side stream into the pinned buffer
            placed: list[tuple[Any, Any, int, int]] = []
            size = 0
            for item in plan.items:
                data = planner.resolve_data(item)
                if item.type == WriteItemType.BYTE_IO:
                    data = bytes(data.getbuffer())
                    n = len(data)
                else:
                    data = data.detach()
                    n = data.numel() * data.element_size()
                placed.append((item, data, size, n))
                size += (n + ALIGN - 1) // ALIGN * ALIGN
            base = self.w._stage(self.name, size)
            tensors = [(off, n, data) for _, data, off, n in placed if not isinstance(data, bytes)]
            _statefile.stage_tensors(torch, base, size, tensors, self.w._pins)
            results = []
            for item, data, off, n in placed:
                pad = (n + ALIGN - 1) // ALIGN * ALIGN - n
                if pad:  # the same state makes the same file
                    ctypes.memset(base + off + n, 0, pad)
                if isinstance(data, bytes):
                    ctypes.memmove(base + off, data, n)
                    where = Location(self.w.rank, off, n, "", ())
                else:
                    where = Location(self.w.rank, off, n, str(data.dtype).removeprefix("torch."), tuple(data.shape))
                results.append(WriteResult(index=item.index, size_in_bytes=n, storage_data=where))
            return _future(results)

        def finish(self, metadata: Any, results: list[list[Any]]) -> None:
            metadata.storage_data = {r.index: r.storage_data for rs in results for r in rs}
            self.w.write(self.name + METADATA, pickle.dumps(metadata, protocol=pickle.HIGHEST_PROTOCOL))

        def storage_meta(self) -> Optional[Any]:
            return None

    return Writer


def _reader_class() -> Any:
    torch = _torch()
    StorageReader = _mod("torch.distributed.checkpoint").StorageReader
    LoadItemType = _mod("torch.distributed.checkpoint.planner").LoadItemType

    narrow_tensor_by_index = _mod("torch.distributed.checkpoint.filesystem").narrow_tensor_by_index

    class Reader(_AsIs, StorageReader):  # type: ignore[misc,valid-type]
        def __init__(self, r: "CheckpointReader", name: str) -> None:
            super().__init__()
            self.r, self.name = r, name
            self.paths: dict[int, str] = {}

        def path(self, rank: int) -> str:
            if rank not in self.paths:  # checked (SHA-256) once, fetched when missing
                self.paths[rank] = self.r._rank_path(rank, self.name)
            return self.paths[rank]

        def read_metadata(self, *args: Any, **kwargs: Any) -> Any:
            with open(self.r._rank_path(0, self.name + METADATA), "rb") as f:
                self.r.bytes_read += os.fstat(f.fileno()).st_size
                return _MetadataUnpickler(f).load()

        def set_up_storage_reader(self, metadata: Any, is_coordinator: bool, *args: Any, **kwargs: Any) -> None:
            self.metadata = metadata

        def read_data(self, plan: Any, planner: Any) -> Any:
            maps: dict[int, mmap.mmap] = {}
            try:
                for item in plan.items:
                    loc: Location = self.metadata.storage_data[item.storage_index]
                    if loc.rank not in maps:
                        with open(self.path(loc.rank), "rb") as f:
                            size = os.fstat(f.fileno()).st_size
                            # private and writable, so torch.frombuffer takes it without a copy
                            maps[loc.rank] = mmap.mmap(f.fileno(), size, access=mmap.ACCESS_COPY) if size else None  # type: ignore[assignment]
                    m = maps[loc.rank]
                    self.r.bytes_read += loc.length  # the piece this rank takes, not the whole file
                    if loc.offset + loc.length > (len(m) if m is not None else 0):
                        raise RuntimeError(
                            f"gpulaunch: {self.name}: rank {loc.rank}'s file is shorter than its plan says "
                            f"({loc.offset + loc.length} bytes needed): not the file this plan was saved with"
                        )
                    if item.type == LoadItemType.BYTE_IO:
                        planner.load_bytes(item, io.BytesIO(m[loc.offset:loc.offset + loc.length]))
                        continue
                    dtype = getattr(torch, loc.dtype)
                    count = loc.length // torch.empty((), dtype=dtype).element_size()
                    src = (torch.frombuffer(m, dtype=dtype, count=count, offset=loc.offset).reshape(loc.shape)
                           if count else torch.empty(loc.shape, dtype=dtype))
                    src = narrow_tensor_by_index(src, item.storage_offsets, item.lengths)
                    target = planner.resolve_tensor(item).detach()
                    if target.size() != src.size():
                        raise RuntimeError(
                            f"gpulaunch: {self.name}: {item.storage_index.fqn}: the saved piece is "
                            f"{tuple(src.size())}, the state wants {tuple(target.size())}"
                        )
                    target.copy_(src)
                    del src
                    planner.commit_tensor(item, target)
            finally:
                for m in maps.values():
                    if m is not None:
                        m.close()
            return _future(None)

    return Reader


def save(w: "CheckpointWriter", name: str, state_dict: dict[str, Any]) -> None:
    _torch()
    _mod("torch.distributed.checkpoint").save(state_dict, storage_writer=_writer_class()(w, name))


def load(r: "CheckpointReader", name: str, state_dict: dict[str, Any]) -> None:
    _torch()
    _mod("torch.distributed.checkpoint").load(state_dict, storage_reader=_reader_class()(r, name))
