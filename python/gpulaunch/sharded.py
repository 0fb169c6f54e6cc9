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

How pieces move: the survivors agree (one all_gather of each rank's steps
and place in the old world) on the step (the smallest any rank holds; a
rank ahead of it is refilled) and, for each old shard index, the ranks
holding it. Then, tensor by tensor (parameters in name order, then each
one's optimizer state), each rank takes the rows it owns in the new layout:
each overlap with an old shard from itself when it holds that shard, else
from a holder, by point-to-point transfers of the overlaps alone. Tensors
that are not sharded (an optimizer's step counter) are broadcast from the
lowest holder, with the optimizer's hyperparameters and get_extra()'s
value (a data position)."""

from __future__ import annotations

import dataclasses
import importlib
import math
from typing import Any, Callable, Optional

from . import _native as N
from . import _procfs
from ._native import Error
from .elastic import Elastic


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
    re-formation. el.model and el.optimizer are the current ones. Other
    arguments: Elastic's (no ddp_kwargs or comm_hook: FSDP2 does the
    collectives)."""

    def __init__(self, build: Callable[[], tuple[Any, Any]], **kw: Any) -> None:
        super().__init__(None, None, **kw)
        self._build = build
        self._plan: Optional[_Plan] = None
        self._place: Optional[tuple[int, int, int]] = None  # (world, rank, shards) the state was built in
        self._old: Optional[tuple[dict[str, Any], Any]] = None  # the last round's parameters and optimizer
        self._sharded: dict[str, Any] = {}  # this round's sharded parameters by name

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
        self._old = None  # the new model is filled: the old shards can go

    def _new_model(self) -> None:
        """The program's model and optimizer on this round's group; the
        mesh's own connections count as the group's (the watcher shuts them
        down too when the round ends)."""
        if self.model is not None:
            self._old = (self._sharded, self.optimizer)
        self.model, self.optimizer = self._build()
        # the sharded parameters by name, as they are now: FSDP2 puts the
        # gathered ones on the module during forward and backward, and a step
        # cut short may leave them there (these stay what the optimizer steps)
        self._sharded = dict(self.model.named_parameters())
        shards = self._shard_count(self.model)
        self._place = (self.world_size, self.rank, shards)
        if self.enabled:
            with self._lock:
                self._owned = _procfs.new_tcp(self._before, self._store_port)

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
        held = self._place if done >= 0 and self.model is not None else None
        mine = (done if held is not None else -1, held)
        infos: list[Any] = [None] * self.world_size
        dist.all_gather_object(infos, mine)
        self._new_model()
        stated = [(r, h, place) for r, (h, place) in enumerate(infos) if h >= 0 and place is not None]
        if not stated:
            self._plan = None
            return -1, -1, 0, False, False
        step = min(h for _, h, _ in stated)
        at = [(r, place) for r, h, place in stated if h == step]
        shards = {place[2] for _, place in at}
        if len(shards) != 1:
            raise Error(N.GPL_ERR_STATE, f"gpulaunch: rank {self.rank}: the ranks holding step {step} were "
                        f"sharded {sorted(shards)} ways: not one job's state", "GPL_ERR_STATE")
        s = shards.pop()
        holders: dict[int, list[int]] = {}
        for r, (_, old_rank, _) in at:
            holders.setdefault(old_rank % s, []).append(r)
        missing = [j for j in range(s) if j not in holders]
        if missing:
            raise Error(
                N.GPL_ERR_STATE,
                f"gpulaunch: rank {self.rank}: shards {missing} of the state ({s}-way sharded) were held "
                f"only by ranks that are gone (no replica holds them: FSDP over every rank, or a whole "
                f"replica group's shard lost); the launcher restarts the workers, which restore the "
                f"newest checkpoint resharded",
                "GPL_ERR_STATE",
            )
        root = min(min(h) for h in holders.values())
        self._plan = _Plan(step, s, holders, root)
        replaced = held is None or done != step
        return step, root, len(at), True, replaced

    def _copy(self, root: int, mine: bool) -> None:
        got_plan = self._plan
        assert got_plan is not None and self.model is not None
        plan: _Plan = got_plan
        t, dist = self._torch, self._dist
        tensor_mod = importlib.import_module("torch.distributed.tensor")
        DTensor, Shard = tensor_mod.DTensor, tensor_mod.Shard

        self._via = self.backend
        old_params, old_opt = self._old if self._old is not None else ({}, None)
        # the structure (every rank builds the same model; the optimizer's state and
        # hyperparameters are the holders')
        head: list[Any] = [None]
        if self.rank == plan.root:
            assert old_opt is not None
            ids = {id(p): n for n, p in old_params.items()}
            state = {ids[id(p)]: {k: (isinstance(v, DTensor), tuple(v.shape), v.dtype) if t.is_tensor(v) else v
                                  for k, v in st.items()}
                     for p, st in old_opt.state.items() if id(p) in ids}
            groups = [{k: v for k, v in g.items() if k != "params"} for g in old_opt.param_groups]
            head[0] = {"state": state, "groups": groups,
                       "extra": self._get_extra() if self._get_extra is not None else None}
        dist.broadcast_object_list(head, src=plan.root, device=self._device() if self.backend == "nccl" else None)
        got = head[0]
        dev = self._device()

        def old_local(name: str, key: Optional[str]) -> Any:
            x = old_params[name]
            if key is not None:
                assert old_opt is not None
                x = old_opt.state[x][key]
            return (x.to_local() if isinstance(x, DTensor) else x).detach().to(dev)

        def move(name: str, key: Optional[str], shape: tuple[int, ...], dtype: Any, like: Any) -> Any:
            """This rank's rows of the new layout of one tensor (like: the new
            parameter, whose mesh and placements it takes): each row range
            from a rank that holds it at the agreed step, itself when it
            does, by point-to-point transfers of the overlaps only."""
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
            out = t.empty((mb - ma, *shape[1:]), dtype=dtype, device=dev)
            ops = []
            for j in range(plan.shards):
                a, b = _chunk_rows(n, plan.shards, j)
                holders = plan.holders[j]
                for r, (ra, rb) in need.items():
                    lo, hi = max(a, ra), min(b, rb)
                    if lo >= hi:
                        continue
                    sender = r if r in holders else holders[r % len(holders)]
                    if sender == self.rank and r == self.rank:
                        out[lo - ma:hi - ma].copy_(old_local(name, key)[lo - a:hi - a])
                    elif sender == self.rank:
                        ops.append(dist.P2POp(dist.isend, old_local(name, key)[lo - a:hi - a].contiguous(), r, tag=j))
                    elif r == self.rank:
                        ops.append(dist.P2POp(dist.irecv, out[lo - ma:hi - ma], sender, tag=j))
            if ops:
                for w in dist.batch_isend_irecv(ops):
                    w.wait()
            return out

        params = self._sharded
        with t.no_grad():
            for name in sorted(params):
                p = params[name]
                local = move(name, None, tuple(p.shape), p.dtype, p)
                (p.to_local() if isinstance(p, DTensor) else p).copy_(local)
                del local
            for name in sorted(got["state"]):
                p = params[name]
                st: dict[str, Any] = {}
                for k, v in got["state"][name].items():
                    if not (isinstance(v, tuple) and len(v) == 3 and isinstance(v[2], t.dtype)):
                        st[k] = v
                        continue
                    sharded, shape, dtype = v
                    if sharded:
                        local = move(name, k, shape, dtype, p)
                        st[k] = DTensor.from_local(local, p.device_mesh, p.placements, run_check=False,
                                                   shape=p.shape, stride=p.stride())
                    else:
                        if self.rank == plan.root:
                            assert old_opt is not None
                            buf = old_opt.state[old_params[name]][k].detach().to(dev).clone()
                        else:
                            buf = t.empty(shape, dtype=dtype, device=dev)
                        dist.broadcast(buf, plan.root)
                        st[k] = buf.to(p.to_local().device if k != "step" else "cpu")
                self.optimizer.state[p] = st
            for g, want in zip(self.optimizer.param_groups, got["groups"]):
                g.update(want)
        if mine and self._set_extra is not None:
            self._set_extra(got["extra"])
        self._old = None
