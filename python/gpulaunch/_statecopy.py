"""Live re-formation's state copy (gpulaunch.Elastic): the agreement on the
step the job goes on after and the rank that has it (as gpl_reform_agree
decides), the tensors sent from that rank along a chain of only the ranks
that need them, the RNG states, and an optimizer state_dict split into its
structure and its tensors."""

from __future__ import annotations

import ctypes
import dataclasses
import random
import sys
from typing import Any, Optional

from . import _native as N
from ._native import Error

# tensors of at most this many bytes travel together in one flat buffer
_BUCKET_BYTES = 32 << 20
# a copy's pieces along the chain: each rank passes one on while the next comes
_CHAIN_PIECE_BYTES = 4 << 20


@dataclasses.dataclass(frozen=True)
class Agreement:
    """Where the job goes on from: the step (-1: no rank has state), the
    lowest rank at it, how many ranks have state, whether some rank's state
    must be replaced, whether this one's is, the copy's chain (the root,
    then the ranks that need the state, in rank order; empty without a copy)
    and whether every rank has a libgpulaunch communicator of this world to
    copy host tensors with (native)."""

    step: int
    root: int
    survivors: int
    copy: bool
    mine: bool
    chain: list[int]
    native: bool = False

    def info(self) -> N.ReformInfo:
        """As gpl_reform_agree would have said it (gpl_copy_state's argument)."""
        return N.ReformInfo(self.step, self.root, self.survivors, int(self.copy), int(self.mine))


def agree(t: Any, dist: Any, rank: int, world: int, done: int, device: Any, native: bool = False) -> Agreement:
    """Every rank says the steps its state holds (done; -1: none) and whether
    it has a libgpulaunch communicator (native): one allgather."""
    mine_step = done if done >= 0 else -1
    if world == 1:
        return Agreement(mine_step, 0 if mine_step >= 0 else -1, int(mine_step >= 0), False, False, [], native)
    parts = [t.zeros(2, dtype=t.int64, device=device) for _ in range(world)]
    dist.all_gather(parts, t.tensor([mine_step, int(native)], dtype=t.int64, device=device))
    said = [p.tolist() for p in parts]
    steps = [int(p[0]) for p in said]
    have = [s for s in steps if s >= 0]
    step = min(have) if have else -1
    root = steps.index(step) if have else -1
    copy = step >= 0 and any(s != step for s in steps)
    chain = [root] + [r for r, s in enumerate(steps) if s != step] if copy else []
    return Agreement(step, root, len(have), copy, copy and mine_step != step, chain,
                     all(int(p[1]) for p in said))


def copy_native(t: Any, h: int, rank: int, a: Agreement, tensors: list[Any]) -> int:
    """The root's host tensors into those of the ranks that need them, in
    place, by libgpulaunch's gpl_copy_state on communicator h (a chain of TCP
    links root -> needers; the other ranks take part in one small allgather).
    Every rank passes tensors of the same sizes in the same order; a
    non-contiguous one travels through a contiguous copy. Returns the bytes
    copied; raises ConnectionError (the round ended or a peer of the chain
    failed: its cause is the library's Error) or Error."""
    me = rank == a.root
    bufs: list[Any] = []  # what the C side reads or writes: kept alive until it returns
    back: list[tuple[Any, Any]] = []  # (tensor, staging) to copy into after the copy
    for x in tensors:
        if x.numel() == 0:
            continue
        if x.is_contiguous():
            bufs.append(x.detach())
            continue
        stage = x.detach().contiguous() if me else t.empty(x.shape, dtype=x.dtype)
        bufs.append(stage)
        if a.mine:
            back.append((x, stage))
    n = len(bufs)
    ptrs = (ctypes.c_void_p * max(1, n))(*[b.data_ptr() for b in bufs])
    sizes = (ctypes.c_size_t * max(1, n))(*[b.numel() * b.element_size() for b in bufs])
    info = a.info()
    rc = N.fn("gpl_copy_state")(h, ptrs, sizes, n, ctypes.byref(info))
    if rc != N.GPL_OK:
        err = Error(rc, N.last_error(h, rc))
        if rc in (N.GPL_ERR_ROUND_OVER, N.GPL_ERR_PEER_FAILED, N.GPL_ERR_TIMEOUT, N.GPL_ERR_SYSTEM):
            raise ConnectionError(str(err)) from err
        raise err
    with t.no_grad():
        for x, stage in back:
            x.copy_(stage)
    return sum(sizes[i] for i in range(n)) if n else 0


def pass_on(t: Any, dist: Any, rank: int, chain: list[int], flat: Any) -> None:
    """flat from the chain's root along it, in pieces: a rank sends a piece on
    while it receives the next, so every link carries the state once, at the
    same time. Ranks outside the chain take no part."""
    i = chain.index(rank)
    src: Optional[int] = chain[i - 1] if i > 0 else None
    dst: Optional[int] = chain[i + 1] if i + 1 < len(chain) else None
    raw = flat.reshape(-1).view(t.uint8)
    sends: list[Any] = []
    for piece in raw.split(_CHAIN_PIECE_BYTES):
        if src is not None:
            dist.recv(piece, src=src)
        if dst is not None:
            sends.append(dist.isend(piece, dst=dst))
    for w in sends:
        w.wait()


def send_tensors(t: Any, dist: Any, rank: int, chain: list[int], root: int, tensors: list[Any],
                 wire: Any) -> None:
    """The root's tensors into those of the chain's other ranks, in place:
    large ones alone, the rest in flat buffers of at most _BUCKET_BYTES per
    dtype (wire: the device they travel on)."""
    if rank not in chain:
        return
    me = rank == root

    def send(flat: Any) -> None:
        pass_on(t, dist, rank, chain, flat)

    small: dict[Any, list[Any]] = {}
    for x in tensors:
        if x.numel() == 0:
            continue
        if x.numel() * x.element_size() < _BUCKET_BYTES:
            small.setdefault(x.dtype, []).append(x)
            continue
        # alone, in place where it can be (the choice depends on shapes only: every rank makes it)
        wdtype = t.uint8 if x.dtype == t.bool else x.dtype
        direct = x.is_contiguous() and x.device == wire and x.dtype == wdtype
        buf = x if direct else (x.detach().contiguous().to(wire, wdtype) if me
                                else t.empty(x.shape, dtype=wdtype, device=wire))
        send(buf)
        if not direct and not me:
            with t.no_grad():
                x.copy_(buf)
    for dtype, xs in small.items():
        wdtype = t.uint8 if dtype == t.bool else dtype
        i = 0
        while i < len(xs):
            group: list[Any] = []
            nbytes = 0
            while i < len(xs) and (not group or nbytes + xs[i].numel() * xs[i].element_size() <= _BUCKET_BYTES):
                group.append(xs[i])
                nbytes += xs[i].numel() * xs[i].element_size()
                i += 1
            numels = [x.numel() for x in group]
            if me:
                flat = t.cat([x.detach().reshape(-1).to(wire, wdtype) for x in group])
            else:
                flat = t.empty(sum(numels), dtype=wdtype, device=wire)
            send(flat)
            if not me:
                with t.no_grad():
                    for x, piece in zip(group, flat.split(numels)):
                        x.copy_(piece.view(x.shape))


def rng_state(t: Any) -> dict[str, Any]:
    """The RNG states a rank carries: torch, CUDA, random, NumPy when imported."""
    out: dict[str, Any] = {"torch": t.get_rng_state(), "python": random.getstate()}
    if t.cuda.is_available() and t.cuda.is_initialized():
        out["cuda"] = t.cuda.get_rng_state_all()
    np = sys.modules.get("numpy")
    if np is not None:
        out["numpy"] = np.random.get_state()
    return out


def set_rng_state(t: Any, s: dict[str, Any]) -> None:
    t.set_rng_state(s["torch"])
    random.setstate(s["python"])
    if "cuda" in s and t.cuda.is_available() and len(s["cuda"]) == t.cuda.device_count():
        t.cuda.set_rng_state_all(s["cuda"])
    np = sys.modules.get("numpy")
    if np is not None and "numpy" in s:
        np.random.set_state(s["numpy"])


@dataclasses.dataclass(frozen=True)
class Slot:
    """A tensor's place in a skeleton: what a receiver allocates."""

    index: int
    shape: tuple[int, ...]
    dtype: Any
    cuda: bool


def split(obj: Any) -> tuple[Any, list[Any]]:
    """obj with each tensor replaced by a Slot, and the tensors in order."""
    import torch

    tensors: list[Any] = []

    def walk(o: Any) -> Any:
        if isinstance(o, torch.Tensor):
            tensors.append(o)
            return Slot(len(tensors) - 1, tuple(o.shape), o.dtype, o.is_cuda)
        if isinstance(o, dict):
            return {k: walk(v) for k, v in o.items()}
        if isinstance(o, list):
            return [walk(v) for v in o]
        if isinstance(o, tuple):
            return tuple(walk(v) for v in o)
        return o

    return walk(obj), tensors


def slots(skel: Any) -> list[Slot]:
    out: list[Slot] = []

    def walk(o: Any) -> None:
        if isinstance(o, Slot):
            out.append(o)
        elif isinstance(o, dict):
            for v in o.values():
                walk(v)
        elif isinstance(o, (list, tuple)):
            for v in o:
                walk(v)

    walk(skel)
    out.sort(key=lambda s: s.index)
    return out


def join(skel: Any, tensors: list[Any]) -> Any:
    if isinstance(skel, Slot):
        return tensors[skel.index]
    if isinstance(skel, dict):
        return {k: join(v, tensors) for k, v in skel.items()}
    if isinstance(skel, list):
        return [join(v, tensors) for v in skel]
    if isinstance(skel, tuple):
        return tuple(join(v, tensors) for v in skel)
    return skel
