"""Live re-formation for sharded state (FSDP2's fully_shard, HSDP): when a
node is lost or one is added, the survivors keep their processes and the
shards in their memory, re-make the process group, build the model and its
optimizer again on the new world's mesh (the program's build()) and fill
them from memory: every piece of every parameter and optimizer state comes
from a rank that held it, resharded into the new layout. Nothing is read
from storage.

    def build():                                   # on this round's process group
        mesh = init_device_mesh("cpu", (world // 2, 2), mesh_dim_names=("replicate", "shard"))
        model = Model(); [fully_shard(b, mesh=mesh) for b in model.blocks]; fully_shard(model, mesh=mesh)
        return model, torch.optim.AdamW(model.parameters())

    el = gpulaunch.ShardedElastic(build, checkpointer=ck)
    step = el.start(lambda: ck.restore(load))      # load() fills el.model, el.optimizer
    while True:
        try:
            ... train with el.model, el.optimizer ...
        except el.round_errors:
            step = el.reform(step)                 # el.model, el.optimizer: new objects

The state survives a loss when, for every shard of the sharded dimension,
some survivor holds it at the agreed step: under HSDP a node that is one
replica group can go (another group holds its shards); FSDP over every rank
has no second copy, so a lost node's shards are gone: reform() raises Error
(GPL_ERR_STATE) naming them, the worker exits, and the launcher restarts
the workers, which restore the newest checkpoint resharded (start()'s load).

FSDP over every rank keeps a second copy when asked: mirror_every=K (and
el.mirror(done) after every step, force=True at a checkpoint's step) copies
each rank's shards every K steps into a host snapshot, which libgpulaunch
pushes in the background to a rank on the next node (gpl_mirror). When
the survivors lack shards they go back to the newest step every lost rank's
buddy holds (steps lost <= K), each rank's rows taken from the snapshots
and copies in memory, resharded into the new world; when no step is whole
(a rank and its buddy both lost, a node lost during a push) reform() raises
Error (GPL_ERR_STATE) and the launcher restarts from the checkpoint. Host
memory: the snapshot, and the two newest copies of the buddy's (three
times a rank's shards and optimizer state).

How pieces move: the survivors agree (one all_gather of the states each
rank holds: steps and place in the old world) on the step and layout (the
newest step whose shards one layout holds whole; a rank at another step is
refilled) and, for each old shard index, the ranks holding it. Then, for every tensor (parameters in name order, then each
one's optimizer state), each rank takes the rows it owns in the new layout:
each overlap with an old shard from itself when it holds that shard (its
own optimizer rows, unchanged, are taken over without a copy), else from a
holder, by point-to-point transfers of the overlaps alone, every one of
them posted at once. Tensors that are not sharded (an optimizer's step
counters) come from the lowest holder in one broadcast, with the
optimizer's hyperparameters and get_extra()'s value (a data position). A
re-formation cut off during the copy goes on from the state held before
it: the state held before it is kept until every rank's copy ended (one
all-reduce after the copy says so), and a rank whose copy ended while a
peer's was cut keeps both: the next agreement takes the newest step that
one layout holds whole among the survivors."""

from __future__ import annotations

import dataclasses
import importlib
import inspect
import math
import sys
import time
from typing import Any, Callable, Optional

from . import _fsdpfree
from . import _mirror
from . import _native as N
from . import _snapshot
from . import _procfs
from ._native import Error
from .elastic import Elastic



@dataclasses.dataclass(frozen=True)
class _Held:
    """A filled state this rank holds: the steps it is after, where it was
    built ((world, rank, shards)), its sharded parameters by name, its
    optimizer and the data position (get_extra()'s value) that goes with it."""
    step: int
    place: Optional[tuple[int, int, int]]
    params: dict[str, Any]
    optimizer: Any
    extra: Any


_NOTHING = _Held(-1, None, {}, None, None)


def _choose(stated: list[tuple[int, int, tuple[int, int, int]]]) -> Optional[tuple[int, int, dict[int, list[int]]]]:
    """Of the states the ranks hold ((rank, step, (world, old rank, shards))),
    the step and layout the job goes on from: the newest step whose shards
    (rows chunk j of s for every j < s; a rank's index is its old rank mod
    s) some ranks hold at that step in one layout, the one held by the most
    ranks among equals (the fewest bytes move), then the finer one; with its
    holders (shard index -> ranks, ascending). None when no layout is whole.
    A rank counts once for a step and layout, by its first state there (the
    one it keeps as the copy's source: two of its states with one layout may
    hold different shard indexes)."""
    cands: dict[tuple[int, int], dict[int, list[int]]] = {}
    seen: set[tuple[int, int, int]] = set()
    for r, step, (_, old_rank, s) in stated:
        if (r, step, s) not in seen:
            seen.add((r, step, s))
            cands.setdefault((step, s), {}).setdefault(old_rank % s, []).append(r)
    whole = [(step, s, h) for (step, s), h in cands.items() if all(j in h for j in range(s))]
    if not whole:
        return None
    step, s, holders = max(whole, key=lambda c: (c[0], len({r for v in c[2].values() for r in v}), c[1]))
    return step, s, {j: sorted(v) for j, v in sorted(holders.items())}


@dataclasses.dataclass(frozen=True)
class _Plan:
    step: int
    shards: int  # the old world's size along the sharded dimension
    holders: dict[int, list[int]]  # old shard index -> the ranks (this round) holding it
    root: int  # the lowest holder: what is not sharded comes from it


def _chunk_rows(n: int, parts: int, j: int) -> tuple[int, int]:
    """Rows [a, b) of torch.chunk(x, parts)[j] for x of n rows (empty at the end)."""
    c = math.ceil(n / parts) if n else 0
    a = min(j * c, n)
    return a, min(a + c, n)


def _reshard(model: Any) -> None:
    """The model's sharded parameters back in place of the full ones a step cut
    short had gathered (FSDP2 puts the gathered ones on the module during
    forward and backward); no communication."""
    fsdp = importlib.import_module("torch.distributed.fsdp")
    for m in model.modules():
        if isinstance(m, fsdp.FSDPModule):
            m.reshard()


class ShardedElastic(Elastic):
    """Elastic for a model sharded by FSDP2 (or HSDP). build(): makes the
    model (fully_shard on a mesh of the current process group) and its
    optimizer, returns (model, optimizer); called in start() and after every
    re-formation. A build that takes one argument is told whether the
    parameters are filled from memory right after (True: it may make the
    model on the meta device and allocate it with to_empty() instead of
    initializing it, most of a large model's re-formation otherwise; its
    buffers it must still set). el.model and el.optimizer are the current ones.
    on_copy(step): called on every rank of a re-formation once the step is
    agreed and the new model built, as the shards are about to move (a
    program's progress line); on_copied(step): on every rank whose copy
    ended, before the ranks confirm that all of theirs did. set_extra is
    handed the agreed step's get_extra() value on every rank after a copy
    (a global data position, as train_fsdp.py's sample count). Other
    arguments: Elastic's (no ddp_kwargs or comm_hook: FSDP2 does the
    collectives)."""

    _cut_copy_keeps_state = True  # the copy fills a new model; the last filled one is kept

    def __init__(self, build: Callable[..., tuple[Any, Any]], mirror_every: int = 0,
                 on_copy: Optional[Callable[[int], None]] = None,
                 on_copied: Optional[Callable[[int], None]] = None, **kw: Any) -> None:
        super().__init__(None, None, **kw)
        self._on_copy = on_copy  # told the agreed step as the shards are about to move
        self._on_copied = on_copied  # told it once this rank's copy ended
        if mirror_every < 0:
            raise ValueError("mirror_every must be >= 0 (0: no copies in peers' memory)")
        self._build = build
        # build(fill): told whether its parameters are filled from memory right after
        self._build_fill = any(p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)
                               for p in inspect.signature(build).parameters.values())
        self._mirror_every = mirror_every
        self._mirror: Optional[_mirror.Mirror] = None  # this round's snapshot and its copies at the buddy
        self._mirror_head = 0  # bytes of the snapshot's description area
        self._mirror_due = True  # push at the next mirror() call: a round began
        self._source: Any = None  # where _copy takes the old shards from
        self.mirror_stall_s = 0.0  # the last mirror()'s time in the training loop
        self.mirror_pushes = 0
        self.from_copies = False  # the last agreement went back to the copies in peers' memory
        self.build_s = 0.0  # the last build()'s time
        self._plan: Optional[_Plan] = None
        self._place: Optional[tuple[int, int, int]] = None  # (world, rank, shards) the state was built in
        # None: the current model is the state (at the steps done). Within a re-formation
        # (until every rank's copy ended): the state kept from before it (_NOTHING: none),
        # and _filled, the new model once this rank's copy into it ended
        self._old: Optional[_Held] = None
        self._filled: Optional[_Held] = None
        self._sharded: dict[str, Any] = {}  # this round's sharded parameters by name
        self._freed = False  # FSDP2's collectives wait through the round guard

    # ---- Elastic's steps, for sharded state ----

    def _teardown(self) -> None:
        with self._lock:
            self._forming = False
            self._owned = None
        self.ddp = None
        if self.model is not None:
            _reshard(self.model)
            for p in self.model.parameters():
                p.grad = None
        self._destroy_group()
        with self._lock:
            self._handled = True

    def _make_ddp(self, sync: bool) -> None:
        self._old = self._filled = None  # the new model is the state: the old shards can go
        self._drop_mirror()  # and the last world's copies
        self._mirror_due = True

    def _drop_mirror(self) -> None:
        if self._source is not None and hasattr(self._source, "close"):
            self._source.close()
        self._source = None
        if self._mirror is not None:
            self._mirror.close()
            self._mirror = None

    # ---- copies in a peer's memory ----

    def mirror(self, done: int, force: bool = False) -> None:
        """Call after every step with the steps done (the optimizer stepped).
        With mirror_every=K: every K steps, at the first call of a round and
        when force (a checkpoint's step), copies this rank's shards and
        optimizer state into its host snapshot (the time this takes in the
        loop: mirror_stall_s) and libgpulaunch pushes it to a rank on the next
        node in the background. Every rank calls it at the same steps."""
        if self._mirror_every <= 0 or not self.enabled or self.model is None or done <= 0:
            return
        if not (force or self._mirror_due or done % self._mirror_every == 0):
            return
        t0 = time.monotonic()
        t = self._torch
        extra = self._get_extra() if self._get_extra is not None else None
        tensors, text, nbytes = _snapshot.encode(t, self._sharded, self.optimizer,
                                                 {"v": 1, "step": done, "rank": self.rank,
                                                  "world": self.world_size, "extra": extra})
        if self._mirror is None:
            h = self._native.handle(self.rank, self.world_size, self.round)
            if h is None:
                sys.stderr.write(f"gpulaunch: rank {self.rank}: no libgpulaunch communicator: no copies "
                                 f"in peers' memory (mirror_every ignored)\n")
                self._mirror_every = 0
                return
            self._mirror_head = _snapshot.base_for(text)
            cuda = any(x.is_cuda for _, _, x in tensors)
            self._mirror = _mirror.Mirror(h, t, self._mirror_head + nbytes, pin=cuda)
        m = self._mirror
        base = self._mirror_head
        if len(text) + 16 > base or m.snapshot.numel() != base + nbytes:
            raise Error(N.GPL_ERR_STATE, f"gpulaunch: rank {self.rank}: ShardedElastic.mirror: the state's "
                        f"layout changed within round {self.round} ({base + nbytes} bytes, the snapshot "
                        f"holds {m.snapshot.numel()})", "GPL_ERR_STATE")
        m.stage()
        _snapshot.write(t, m.snapshot, base, tensors, text)
        m.push(done)
        self._mirror_due = False
        self.mirror_pushes += 1
        self.mirror_stall_s = time.monotonic() - t0

    def mirror_wait(self) -> Optional[str]:
        """Waits for the push in flight: None once the buddy holds it checked,
        else why not (the buddy gone, the copy damaged, a timeout)."""
        return self._mirror.wait() if self._mirror is not None else None

    def mirror_status(self) -> Optional[N.MirrorStatus]:
        """The snapshot's and its copy's state (gpl_mirror_status); None without one."""
        return self._mirror.status() if self._mirror is not None else None

    def _held(self, done: int) -> list[_Held]:
        """The filled states this rank holds: the current model's at the steps
        done; within a re-formation cut off, the one kept from before it and
        the new model when this rank's copy into it ended."""
        if self._old is None:
            if self.model is None or done < 0 or self._place is None:
                return []
            extra = self._get_extra() if self._get_extra is not None else None
            return [_Held(done, self._place, self._sharded, self.optimizer, extra)]
        return [h for h in (self._old, self._filled) if h is not None and h.step >= 0]

    def _new_model(self, keep: Optional[_Held], fill: bool = False) -> None:
        """The program's model and optimizer on this round's group (fill: its
        parameters are filled from memory right after, for a build(fill)
        that can skip their initialization), keeping the state `keep` (None:
        none) until every rank's copy ends; every other model goes before
        the new one is built. The mesh's own connections count as the
        group's (the watcher shuts them down too when the round ends)."""
        self._old, self._filled = (keep if keep is not None else _NOTHING), None
        self.model = self.optimizer = None
        self._sharded = {}
        t0 = time.monotonic()
        self.model, self.optimizer = self._build(fill) if self._build_fill else self._build()
        self.build_s = time.monotonic() - t0
        # the sharded parameters by name, as they are now: FSDP2 puts the
        # gathered ones on the module during forward and backward, and a step
        # cut short may leave them there (these stay what the optimizer steps)
        self._sharded = dict(self.model.named_parameters())
        shards = self._shard_count(self.model)
        self._place = (self.world_size, self.rank, shards)
        if self.enabled and self.world_size == 1:
            self.model.register_forward_pre_hook(self._alone_check)
        if self.enabled:
            with self._lock:
                self._owned = _procfs.new_tcp(self._before, self._store_port)
            if self.backend == "gloo":  # FSDP2's waits end with the round (_fsdpfree.py)
                self._freed = _fsdpfree.install(self._guard)

    def _alone_check(self, module: Any, args: Any) -> None:
        """A world of one has no peer whose loss fails a collective (FSDP2's
        are no-ops there): the round's end is looked for before each forward
        (DDP's bucket hook does it for Elastic)."""
        self._raise_if_round_over()

    def _shard_count(self, model: Any) -> int:
        """How many ways the model's parameters are split (the mesh's size
        along the dimension a Shard placement names)."""
        tensor_mod = importlib.import_module("torch.distributed.tensor")
        DTensor, Shard = tensor_mod.DTensor, tensor_mod.Shard
        for p in model.parameters():
            if isinstance(p, DTensor):
                for dim, pl in enumerate(p.placements):
                    if isinstance(pl, Shard):
                        if pl.dim != 0:
                            raise Error(N.GPL_ERR_UNSUPPORTED, f"gpulaunch: ShardedElastic: a parameter is "
                                        f"sharded along dimension {pl.dim}; FSDP2's Shard(0) only",
                                        "GPL_ERR_UNSUPPORTED")
                        return int(p.device_mesh.size(dim))
        return 1

    def _agree(self, done: int) -> tuple[int, int, int, bool, bool]:
        dist = self._dist
        if self._source is not None and hasattr(self._source, "close"):
            self._source.close()  # an agreement cut off by a round's end: made again
        self._source = None
        held = self._held(done)
        infos: list[Any] = [None] * self.world_size
        dist.all_gather_object(infos, [(h.step, h.place) for h in held])
        stated = [(r, h, place) for r, got in enumerate(infos) for h, place in got]
        pick = _choose(stated)
        # the state kept through the copy: this rank's first of the chosen step and layout (the
        # one _choose counted), else (told that its state is replaced) its newest, should the
        # copy be cut off
        keep = next((h for h in held if pick is not None and h.place is not None
                     and (h.step, h.place[2]) == pick[:2]), None)
        replaced = keep is None
        if keep is None and held:
            keep = max(held, key=lambda h: h.step)
        del held  # the states not kept go before the next model is built
        self._new_model(keep, fill=bool(stated))
        if not stated:
            self._plan = None
            return -1, -1, 0, False, False
        if pick is not None:
            step, s, holders = pick
            root = min(min(h) for h in holders.values())
            self._plan = _Plan(step, s, holders, root)
            self.from_copies = False
            return step, root, len({r for v in holders.values() for r in v}), True, replaced
        # no layout whole: the copies in peers' memory, else which shards are gone (of each
        # rank's newest state)
        newest = [(r, got[-1][0], got[-1][1]) for r, got in enumerate(infos) if got]
        step = min(h for _, h, _ in newest)
        at = [place for _, h, place in newest if h == step]
        shards = sorted({place[2] for place in at})
        s = shards[-1]
        missing = [j for j in range(s) if not any(place[2] == s and place[1] % s == j for place in at)]
        if self._mirror_every > 0:
            return self._agree_mirror(stated, missing)
        if len(shards) != 1:
            raise Error(N.GPL_ERR_STATE, f"gpulaunch: rank {self.rank}: the ranks holding step {step} were "
                        f"sharded {shards} ways: not one job's state", "GPL_ERR_STATE")
        raise Error(
            N.GPL_ERR_STATE,
            f"gpulaunch: rank {self.rank}: shards {missing} of the state ({s}-way sharded) were held "
            f"only by ranks that are gone (no replica holds them: FSDP over every rank without "
            f"mirror_every, or a whole replica group's shard lost); the launcher restarts the workers, "
            f"which restore the newest checkpoint resharded",
            "GPL_ERR_STATE",
        )

    def _agree_mirror(self, stated: list[Any], missing: list[int]) -> tuple[int, int, int, bool, bool]:
        """The survivors lack shards: the newest step whose copies in peers'
        memory (gpl_mirror) cover every old rank; every rank goes back to it."""
        h = self._native.handle(self.rank, self.world_size, self.round)
        try:
            if h is None:
                raise Error(N.GPL_ERR_UNSUPPORTED, "no libgpulaunch communicator in this round",
                            "GPL_ERR_UNSUPPORTED")
            plan = _mirror.Plan(h, self._mirror)
        except Error as e:
            raise Error(N.GPL_ERR_STATE, f"gpulaunch: rank {self.rank}: shards {missing} of the state were "
                        f"held only by ranks that are gone, and the copies in peers' memory do not cover "
                        f"them ({e}); the launcher restarts the workers, which restore the newest "
                        f"checkpoint resharded", "GPL_ERR_STATE") from e
        shards = {place[2] for _, _, place in stated if place[0] == plan.old_world}
        if len(shards) != 1:
            plan.close()
            raise Error(N.GPL_ERR_STATE, f"gpulaunch: rank {self.rank}: the copies in peers' memory are of a "
                        f"world of {plan.old_world}, which no survivor's model was sharded in",
                        "GPL_ERR_STATE")
        s = shards.pop()
        holders: dict[int, list[int]] = {}
        held: dict[int, int] = {}
        for r, hr in enumerate(plan.holders):
            holders.setdefault(r % s, [])
            if hr not in holders[r % s]:
                holders[r % s].append(hr)
            if hr == self.rank:
                held.setdefault(r % s, r)
        for v in holders.values():
            v.sort()
        root = min(min(v) for v in holders.values())
        self._plan = _Plan(plan.step, s, holders, root)
        self._source = _snapshot.MirrorSource(self._torch, plan, held)
        self.from_copies = True
        return plan.step, root, len({r for r, _, _ in stated}), True, True

    def _copy(self, root: int, mine: bool) -> None:
        got_plan = self._plan
        assert got_plan is not None and self.model is not None
        plan: _Plan = got_plan
        t, dist = self._torch, self._dist
        tensor_mod = importlib.import_module("torch.distributed.tensor")
        DTensor, Shard = tensor_mod.DTensor, tensor_mod.Shard

        self._via = self.backend
        if self._on_copy is not None:
            self._on_copy(plan.step)
        source: Any = self._source
        if source is None:  # the kept state's shards in this process (a replica's, or its own)
            kept = self._old if self._old is not None else _NOTHING
            source = _snapshot.LiveSource(t, kept.params, kept.optimizer, kept.extra)
        # the last round's optimizer state, dropped after the copy, can become the new one's
        # where this rank keeps its rows; a copy in peers' memory (MirrorSource) is not ours
        reuse = isinstance(source, _snapshot.LiveSource)
        # the structure (every rank builds the same model; the optimizer's state and
        # hyperparameters are the holders')
        head: list[Any] = [None]
        if self.rank == plan.root:
            head[0] = source.head()
        dist.broadcast_object_list(head, src=plan.root, device=self._device() if self.backend == "nccl" else None)
        got = head[0]
        dev = self._device()

        def old_rows(name: str, key: Optional[str], j: int, lo: int, hi: int) -> Any:
            """Rows [lo, hi) of old shard j (its own row numbers), on this rank's device:
            only those rows are moved there (a snapshot in host memory under NCCL)."""
            return source.local(name, key, j)[lo:hi].to(dev)

        ops: list[Any] = []  # every transfer of the copy, posted together (no order to deadlock on)
        later: list[tuple[Any, Any]] = []  # (to, from): copies once the transfers are done
        seq = [0]  # the tensor being planned: its transfers' tags

        def move(name: str, key: Optional[str], shape: tuple[int, ...], dtype: Any, like: Any,
                 dst: Any = None) -> Any:
            """This rank's rows of the new layout of one tensor (like: the new
            parameter, whose mesh and placements it takes): each row range
            from a rank that holds it at the agreed step, itself when it
            does, by point-to-point transfers of the overlaps only (added to
            ops; the rows are there once they are done). dst: where they go
            (the new parameter's local rows), else a new tensor, or, when
            this rank's rows are the whole of an old shard it holds in its
            own last round's tensors (reuse), that tensor itself: the
            optimizer's state moves without a copy."""
            n = shape[0]
            shard_dim = next((d for d, pl in enumerate(like.placements) if isinstance(pl, Shard)), None)
            mesh = like.device_mesh
            if shard_dim is None:
                parts, coord = 1, {r: 0 for r in range(self.world_size)}
            else:
                parts = int(mesh.size(shard_dim))
                layout = mesh.mesh
                coord = {int(r): int((layout == r).nonzero()[0][shard_dim]) for r in layout.flatten()}
            need = {r: _chunk_rows(n, parts, coord[r]) for r in coord}
            ma, mb = need[self.rank]
            rows = (mb - ma, *shape[1:])
            out, kept = None, -1
            if reuse and dst is None and mb > ma:
                kept = next((j for j in range(plan.shards) if _chunk_rows(n, plan.shards, j) == (ma, mb)
                             and self.rank in plan.holders[j]), -1)
                if kept >= 0:
                    x = source.local(name, key, kept)
                    if x.device == dev and x.dtype == dtype and tuple(x.shape) == rows and x.is_contiguous():
                        out = x
                    else:
                        kept = -1
            if out is None:
                ok = (dst is not None and dst.device == dev and dst.is_contiguous() and tuple(dst.shape) == rows
                      and dst.dtype == dtype)
                out = dst if ok else t.empty(rows, dtype=dtype, device=dev)
                if dst is not None and not ok:
                    later.append((dst, out))
            base = seq[0] * plan.shards
            seq[0] += 1
            for j in range(plan.shards):
                a, b = _chunk_rows(n, plan.shards, j)
                holders = plan.holders[j]
                for r, (ra, rb) in need.items():
                    lo, hi = max(a, ra), min(b, rb)
                    if lo >= hi:
                        continue
                    sender = r if r in holders else holders[r % len(holders)]
                    if sender == self.rank and r == self.rank:
                        if j != kept:
                            out[lo - ma:hi - ma].copy_(source.local(name, key, j)[lo - a:hi - a])
                    elif sender == self.rank:
                        ops.append(dist.P2POp(dist.isend, old_rows(name, key, j, lo - a, hi - a).contiguous(), r,
                                              tag=base + j))
                    elif r == self.rank:
                        ops.append(dist.P2POp(dist.irecv, out[lo - ma:hi - ma], sender, tag=base + j))
            return out

        params = self._sharded
        with t.no_grad():
            for name in sorted(params):
                p = params[name]
                move(name, None, tuple(p.shape), p.dtype, p,
                     dst=(p.to_local() if isinstance(p, DTensor) else p).detach())
            states: dict[str, dict[str, Any]] = {}
            scalars: list[tuple[str, str, tuple[int, ...], Any]] = []  # from the root, in one broadcast a dtype
            for name in sorted(got["state"]):
                p = params[name]
                st = states.setdefault(name, {})
                for k, v in got["state"][name].items():
                    if not (isinstance(v, tuple) and len(v) == 3 and isinstance(v[2], t.dtype)):
                        st[k] = v
                    elif v[0]:
                        local = move(name, k, v[1], v[2], p)
                        st[k] = DTensor.from_local(local, p.device_mesh, p.placements, run_check=False,
                                                   shape=p.shape, stride=p.stride())
                    else:
                        st[k] = None  # its place among the keys kept; filled from the broadcast below
                        scalars.append((name, k, v[1], v[2]))
            if ops:
                for w in dist.batch_isend_irecv(ops):
                    w.wait()
            ops.clear()
            for to, frm in later:
                to.copy_(frm)
            for dtype in sorted({x[3] for x in scalars}, key=str):
                of = [x for x in scalars if x[3] == dtype]
                if self.rank == plan.root:
                    flat = t.cat([source.scalar(name, k).to(dev).reshape(-1).to(dtype) for name, k, _, _ in of])
                else:
                    flat = t.empty(sum(math.prod(shape) for _, _, shape, _ in of), dtype=dtype, device=dev)
                dist.broadcast(flat, plan.root)
                at = 0
                for name, k, shape, _ in of:
                    size = math.prod(shape)
                    buf = flat[at:at + size].reshape(shape).clone()
                    at += size
                    states[name][k] = buf.to(params[name].to_local().device if k != "step" else "cpu")
            for name in sorted(got["state"]):
                self.optimizer.state[params[name]] = states[name]
            for g, want in zip(self.optimizer.param_groups, got["groups"]):
                g.update(want)
        # the step's data position, on every rank: one that kept its own state may have been
        # handed another step's by a copy cut off before (it is a global position)
        if self._set_extra is not None:
            self._set_extra(got["extra"])
        # NCCL's waits are the stream's, not the host's: the rows are here once the stream is
        # done, and only if the round did not end (its group aborted) before
        self._settled(dev, "the copy")
        self._filled = _Held(plan.step, self._place, self._sharded, self.optimizer, got["extra"])
        if self._on_copied is not None:
            self._on_copied(plan.step)
        # every rank's copy ended (each adds its one once its own did; read on the host): only
        # then does the state kept from before go. Cut off here, this rank holds both, and the
        # next agreement takes the layout the survivors hold whole
        ended = t.ones(1, dtype=t.int32, device=dev)
        dist.all_reduce(ended)
        self._settled(dev, "the confirmation that every rank's copy ended")
        n = int(ended.item())
        if n != self.world_size:
            raise RuntimeError(f"gpulaunch: rank {self.rank}: {n} of {self.world_size} ranks confirmed the end "
                               f"of the copy in round {self.round}")
        self._old = self._filled = None

    def _settled(self, dev: Any, what: str) -> None:
        """On a GPU: waits for the stream's work so far and raises (a round
        error) when the round ended meanwhile, its group aborted under it."""
        if dev.type == "cuda":
            self._torch.cuda.current_stream(dev).synchronize()
            if self.round_over:
                raise RuntimeError(f"gpulaunch: rank {self.rank}: round {self.round} ended during {what}")

    def close(self) -> None:
        """Elastic's close, and the snapshot and copies (a push in flight is cut off)."""
        if self._freed:
            self._freed = not _fsdpfree.install(None)
        self._drop_mirror()
        super().close()
