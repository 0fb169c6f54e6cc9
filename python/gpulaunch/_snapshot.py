"""The snapshot a rank pushes to its buddy (ShardedElastic.mirror) and the
two places resharding reads old shards from, in one module: the encoder and
the decoder of the snapshot's layout stay side by side.

A snapshot: [0, 8) the description's length, [8, 16) where the tensors begin
(the base), then the description (JSON: the step, the optimizer's settings
and unsharded state, get_extra()'s value, and one entry per tensor: name,
optimizer key or None, offset from the base, bytes, local shape, dtype),
then each parameter's local shard (by name) and each sharded optimizer
state's (by name and key), each at a multiple of ALIGN bytes."""

from __future__ import annotations

import importlib
import json
from typing import Any, Optional

from . import _mirror
from . import _native as N
from ._native import Error

ALIGN = 64  # bytes: where each tensor of a snapshot starts
HEAD_MIN = 1 << 16  # bytes reserved at a snapshot's start for its description
Tensors = list[tuple[str, Optional[str], Any]]


def _dtype(t: Any, name: str) -> Any:
    return getattr(t, name.rsplit(".", 1)[-1])


def _aligned(nbytes: int) -> int:
    """The bytes a tensor of nbytes takes in a snapshot: the next one starts at ALIGN."""
    return -(-nbytes // ALIGN) * ALIGN


def encode(t: Any, params: dict[str, Any], optimizer: Any, head: dict[str, Any]) -> tuple[Tensors, bytes, int]:
    """What a snapshot holds: the tensors (views of the live shards), the
    description (head, completed) as JSON, and the bytes the tensors take
    after the base."""
    DTensor = importlib.import_module("torch.distributed.tensor").DTensor

    def local(x: Any) -> Any:
        return (x.to_local() if isinstance(x, DTensor) else x).detach()

    tensors: Tensors = [(n, None, local(params[n])) for n in sorted(params)]
    ids = {id(p): n for n, p in params.items()}
    state: dict[str, dict[str, Any]] = {}
    opt_tensors: Tensors = []
    for p, st in optimizer.state.items():
        name = ids.get(id(p))
        if name is None:
            continue
        d: dict[str, Any] = {}
        for k, v in st.items():
            if isinstance(v, DTensor):
                d[k] = ["t", list(v.shape), str(v.dtype)]
                opt_tensors.append((name, k, local(v)))
            elif t.is_tensor(v):
                d[k] = ["s", v.detach().cpu().reshape(-1).tolist(), list(v.shape), str(v.dtype)]
            else:
                d[k] = ["v", v]
        state[name] = d
    tensors += sorted(opt_tensors, key=lambda e: (e[0], str(e[1])))
    entries: list[list[Any]] = []
    off = 0
    for name, key, x in tensors:
        nb = x.numel() * x.element_size()
        entries.append([name, key, off, nb, list(x.shape), str(x.dtype)])
        off += _aligned(nb)
    head = {**head, "groups": [{k: v for k, v in g.items() if k != "params"} for g in optimizer.param_groups],
            "state": state, "entries": entries}
    try:
        text = json.dumps(head).encode()
    except (TypeError, ValueError) as e:
        raise Error(N.GPL_ERR_UNSUPPORTED, f"gpulaunch: ShardedElastic.mirror: the optimizer's settings or "
                    f"get_extra()'s value are not JSON ({e})", "GPL_ERR_UNSUPPORTED") from e
    return tensors, text, off


def base_for(text: bytes) -> int:
    """Where the tensors begin: room for four times this description."""
    return max(HEAD_MIN, -(-4 * (len(text) + 16) // 4096) * 4096)


def write(t: Any, snap: Any, base: int, tensors: Tensors, text: bytes) -> None:
    """The description and the tensors into the snapshot (CUDA tensors by
    copies into its pinned memory, waited for)."""
    lengths = len(text).to_bytes(8, "little") + base.to_bytes(8, "little")
    snap[:16].copy_(t.tensor(list(lengths), dtype=t.uint8))
    snap[16:16 + len(text)].copy_(t.frombuffer(bytearray(text), dtype=t.uint8))
    at = base
    for _, _, x in tensors:
        nb = x.numel() * x.element_size()
        if nb:
            snap[at:at + nb].view(x.dtype).view(x.shape).copy_(x, non_blocking=True)
        at += _aligned(nb)
    if any(x.is_cuda for _, _, x in tensors):
        t.cuda.synchronize()


class LiveSource:
    """The last round's shards where they are: its parameters and optimizer."""

    def __init__(self, t: Any, params: dict[str, Any], opt: Any, extra: Any) -> None:
        self._t, self._params, self._opt, self._extra = t, params, opt, extra

    def head(self) -> dict[str, Any]:
        t = self._t
        DTensor = importlib.import_module("torch.distributed.tensor").DTensor
        ids = {id(p): n for n, p in self._params.items()}
        state = {ids[id(p)]: {k: (isinstance(v, DTensor), tuple(v.shape), v.dtype) if t.is_tensor(v) else v
                              for k, v in st.items()}
                 for p, st in self._opt.state.items() if id(p) in ids}
        groups = [{k: v for k, v in g.items() if k != "params"} for g in self._opt.param_groups]
        return {"state": state, "groups": groups, "extra": self._extra}

    def local(self, name: str, key: Optional[str], j: int) -> Any:
        DTensor = importlib.import_module("torch.distributed.tensor").DTensor
        x = self._params[name]
        if key is not None:
            x = self._opt.state[x][key]
        return (x.to_local() if isinstance(x, DTensor) else x).detach()

    def scalar(self, name: str, key: str) -> Any:
        return self._opt.state[self._params[name]][key].detach()


class MirrorSource:
    """The old world's shards at the agreed step from the snapshots and
    copies this rank holds (views of gpl_mirror's memory, no copy)."""

    def __init__(self, t: Any, plan: _mirror.Plan, held: dict[int, int]) -> None:
        self._t = t
        self._plan = plan
        self._held = held  # old shard index -> the old rank whose copy this rank holds
        self._views: dict[int, Any] = {}
        self._heads: dict[int, dict[str, Any]] = {}
        self._base: dict[int, int] = {}
        for r in sorted(set(held.values())):
            v = plan.view(t, r)
            n = int.from_bytes(bytes(v[:8].tolist()), "little")
            self._base[r] = int.from_bytes(bytes(v[8:16].tolist()), "little")
            self._heads[r] = json.loads(bytes(v[16:16 + n].tolist()).decode())
            self._views[r] = v
        self._entries = {r: {(e[0], e[1]): e for e in h["entries"]} for r, h in self._heads.items()}

    def head(self) -> dict[str, Any]:
        t = self._t
        h = self._heads[min(self._heads)]
        state: dict[str, dict[str, Any]] = {}
        for name, st in h["state"].items():
            d: dict[str, Any] = {}
            for k, v in st.items():
                if v[0] == "t":
                    d[k] = (True, tuple(v[1]), _dtype(t, v[2]))
                elif v[0] == "s":
                    d[k] = (False, tuple(v[2]), _dtype(t, v[3]))
                else:
                    d[k] = v[1]
            state[name] = d
        groups = [{k: tuple(v) if isinstance(v, list) else v for k, v in g.items()} for g in h["groups"]]
        return {"state": state, "groups": groups, "extra": h["extra"]}

    def local(self, name: str, key: Optional[str], j: int) -> Any:
        r = self._held[j]
        _, _, off, nb, shape, dtype = self._entries[r][(name, key)]
        off += self._base[r]
        return self._views[r][off:off + nb].view(_dtype(self._t, dtype)).view(shape)

    def scalar(self, name: str, key: str) -> Any:
        h = self._heads[min(self._heads)]
        _, values, shape, dtype = h["state"][name][key]
        return self._t.tensor(values, dtype=_dtype(self._t, dtype)).reshape(shape)

    def close(self) -> None:
        self._views.clear()
        self._plan.close()


