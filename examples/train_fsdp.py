#!/usr/bin/env python3
"""train_fsdp: a small decoder-only language model whose state is sharded
across ranks (PyTorch's FSDP2, `fully_shard` per block), checkpointed with
gpulaunch's Checkpointer through torch.distributed.checkpoint, and resumed on
any number of ranks.

    gpulaunch --standalone --nproc-per-node 3 train_fsdp.py --steps 40 \\
        --checkpoint-dir ckpt --checkpoint-every 10
    gpulaunch --standalone --nproc-per-node 2 train_fsdp.py --steps 60 \\
        --checkpoint-dir ckpt      # resumes step 40's checkpoint on 2 ranks

--mode fsdp (default) shards parameters, gradients and AdamW's state over
every rank; --mode hsdp shards them inside a group of --shard ranks (default:
the ranks of a node, LOCAL_WORLD_SIZE) and replicates across the groups
(a 2-D device mesh "replicate" x "shard"), as an LLM on several 8-GPU nodes is
trained. Gloo on the CPU, NCCL when CUDA is available.

The data position is global: step s trains on samples [s x G, (s + 1) x G)
of a synthetic token stream (G: --global-batch, default 12, a multiple of the
world size), rank r of W taking its G / W of them; a sample's tokens depend
on its index alone. A job resumed on fewer or more ranks therefore trains on
exactly the samples an unchanged run would have, and the loss is the mean
over the global batch whatever W is.

The checkpoint (--checkpoint-dir, every --checkpoint-every steps and on
preemption) holds the model's and the optimizer's sharded
state (get_state_dict: DTensors) saved with CheckpointWriter.save_sharded,
each rank writing its own shards, and the sample count in rank 0's
`train.state` (save_state, no pickle). Restore reads it into this world's
layout with CheckpointReader.load_sharded, whatever the saving world was.
--checkpoint-durable adds the durable tier (a shared directory or
s3://bucket/prefix) the checkpoints drain to.

For comparisons: --dcp-save DIR also saves the final state with DCP's own
FileSystemWriter, and --dcp-load DIR starts from such a checkpoint (read by
DCP's FileSystemReader) instead of gpulaunch's. Every rank prints
`params_sha256` of the full parameters (gathered) after loading and at the
end, and rank 0 the samples each step trains on with --print-samples."""

from __future__ import annotations

import argparse
import hashlib
import math
import os
import sys
import time
from typing import Any, NamedTuple, Optional

# deterministic cuBLAS (use_deterministic_algorithms needs it on CUDA), before torch loads it
os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
import torch.nn as nn  # noqa: E402
import torch.nn.functional as F  # noqa: E402

try:
    from torch.distributed.fsdp import fully_shard  # torch >= 2.6
except ImportError:  # pragma: no cover - 2.4 and 2.5
    from torch.distributed._composable.fsdp import fully_shard  # type: ignore[no-redef]
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict
from torch.distributed.device_mesh import init_device_mesh

import gpulaunch as gl

STATE_FILE = "train.state"  # rank 0's: the sample count (no pickle)
SHARDED = "train"  # every rank's shards, and rank 0's train.metadata


class Size(NamedTuple):
    vocab: int
    seq: int
    dim: int
    heads: int
    layers: int


SIZES = {
    "tiny": Size(vocab=64, seq=16, dim=32, heads=2, layers=2),
    "small": Size(vocab=256, seq=32, dim=64, heads=4, layers=4),
    "medium": Size(vocab=2048, seq=64, dim=512, heads=8, layers=8),
    "large": Size(vocab=4096, seq=16, dim=1024, heads=16, layers=8),  # 105M parameters: 1.26 GB with AdamW
}


class Block(nn.Module):
    def __init__(self, s: Size) -> None:
        super().__init__()
        self.heads = s.heads
        self.ln1 = nn.LayerNorm(s.dim)
        self.qkv = nn.Linear(s.dim, 3 * s.dim)
        self.proj = nn.Linear(s.dim, s.dim)
        self.ln2 = nn.LayerNorm(s.dim)
        self.fc = nn.Linear(s.dim, 4 * s.dim)
        self.out = nn.Linear(4 * s.dim, s.dim)
        self.register_buffer("causal", torch.empty(s.seq, s.seq), persistent=False)
        self.init_buffers()

    def init_buffers(self) -> None:
        with torch.no_grad():
            self.causal.copy_(torch.full(self.causal.shape, float("-inf"), device=self.causal.device).triu(1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape
        hd = d // self.heads
        q, k, v = self.qkv(self.ln1(x)).split(d, dim=2)
        q, k, v = (z.view(b, t, self.heads, hd).transpose(1, 2) for z in (q, k, v))
        att = ((q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(hd)) + self.causal[:t, :t]).softmax(dim=-1)
        x = x + self.proj((att @ v).transpose(1, 2).reshape(b, t, d))
        return x + self.out(F.gelu(self.fc(self.ln2(x))))


class TinyGPT(nn.Module):
    def __init__(self, s: Size, init: bool = True) -> None:
        super().__init__()
        self.tok = nn.Embedding(s.vocab, s.dim)
        self.pos = nn.Embedding(s.seq, s.dim)
        self.blocks = nn.ModuleList(Block(s) for _ in range(s.layers))
        self.ln = nn.LayerNorm(s.dim)
        self.head = nn.Linear(s.dim, s.vocab, bias=False)
        self.head.weight = self.tok.weight  # tied: both in the root's shard group
        if not init:  # on the meta device: filled from elsewhere
            return
        g = torch.Generator().manual_seed(1234)
        for name, p in self.named_parameters():
            if name.endswith("weight") and p.dim() == 2:
                with torch.no_grad():
                    p.copy_(torch.randn(p.shape, generator=g) * 0.02)

    def init_buffers(self) -> None:
        """The blocks' causal masks (buffers: not in the state dict; after
        to_empty() they hold whatever the memory held)."""
        for blk in self.blocks:
            blk.init_buffers()  # type: ignore[operator]

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        x = self.tok(idx) + self.pos(torch.arange(idx.shape[1], device=idx.device))
        for blk in self.blocks:
            x = blk(x)
        return self.head(self.ln(x))


def sample_tokens(seed: int, index: int, s: Size) -> torch.Tensor:
    """Sample `index` of the stream: seq + 1 tokens, a fixed successor table
    with 10 % noise (so the loss goes down), a function of (seed, index)."""
    succ = torch.randperm(s.vocab, generator=torch.Generator().manual_seed(seed))
    g = torch.Generator().manual_seed(seed * 1_000_003 + index + 1)
    noise = torch.randint(s.vocab, (s.seq + 1,), generator=g)
    keep = torch.rand(s.seq + 1, generator=g) >= 0.1
    x = noise.clone()
    for t in range(1, s.seq + 1):
        x[t] = succ[x[t - 1]] if keep[t] else noise[t]
    return x


def full_params_sha256(model: nn.Module) -> str:
    """SHA-256 of the full parameters in name order (a collective: every rank
    gathers each sharded one)."""
    h = hashlib.sha256()
    for name, p in model.named_parameters():
        full = p.full_tensor() if hasattr(p, "full_tensor") else p
        h.update(name.encode())
        h.update(full.detach().to("cpu", torch.float32).contiguous().numpy().tobytes())
    return h.hexdigest()


def parse_args(argv: list[str]) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    ap.add_argument("--steps", type=int, default=40, help="steps in all (default 40)")
    ap.add_argument("--mode", choices=("fsdp", "hsdp"), default="fsdp")
    ap.add_argument("--shard", type=int, default=0,
                    help="hsdp: ranks a shard group spans (default LOCAL_WORLD_SIZE)")
    ap.add_argument("--model", choices=sorted(SIZES), default="tiny")
    ap.add_argument("--global-batch", type=int, default=12, help="sequences a step, all ranks (default 12)")
    ap.add_argument("--lr", type=float, default=3e-3)
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--checkpoint-dir", default=None)
    ap.add_argument("--checkpoint-every", type=int, default=0)
    ap.add_argument("--checkpoint-durable", default=None)
    ap.add_argument("--mirror-every", type=int, default=0,
                    help="with --reform: every K steps (and at each checkpoint) copy each rank's shards to a "
                         "rank on the next node in the background; a lost node then costs <= K steps, "
                         "no storage read (0: off)")
    ap.add_argument("--sync-checkpoint", action="store_true",
                    help="step_end waits until the checkpoint is written (default: asynchronous)")
    ap.add_argument("--step-sleep-ms", type=float, default=0.0)
    ap.add_argument("--print-every", type=int, default=10)
    ap.add_argument("--print-samples", action="store_true")
    ap.add_argument("--reform", action="store_true",
                    help="a lost or added node re-forms the survivors in place (gpulaunch.ShardedElastic)")
    ap.add_argument("--hold", action="append", default=[], metavar="R:S",
                    help="tests: rank R waits before step S until its round is over (once)")
    ap.add_argument("--hold-copy", default=None, metavar="W:R",
                    help="tests: in a re-formation into a world of W, rank R waits as its shards are about "
                         "to move, until that round is over (once)")
    ap.add_argument("--hold-copied", default=None, metavar="W:R",
                    help="tests: in a re-formation into a world of W, rank R waits once its copy ended, "
                         "before the ranks confirm that all of theirs did, until that round is over (once)")
    ap.add_argument("--dcp-save", default=None, help="also save the final state with DCP's FileSystemWriter")
    ap.add_argument("--dcp-load", default=None, help="start from DCP's FileSystemReader checkpoint instead")
    a = ap.parse_args(argv)
    if a.steps < 0 or a.global_batch < 1 or a.checkpoint_every < 0:
        ap.error("--steps and --checkpoint-every must be >= 0, --global-batch >= 1")
    try:
        a.hold = {(int(h.split(":")[0]), int(h.split(":")[1])) for h in a.hold}
        a.hold_copy = tuple(int(x) for x in a.hold_copy.split(":")) if a.hold_copy else None
        a.hold_copied = tuple(int(x) for x in a.hold_copied.split(":")) if a.hold_copied else None
        if any(h is not None and len(h) != 2 for h in (a.hold_copy, a.hold_copied)):
            raise ValueError(a.hold_copy)
    except (ValueError, IndexError):
        ap.error("--hold takes RANK:STEP, --hold-copy and --hold-copied WORLD:RANK")
    if a.reform and (a.dcp_load or a.dcp_save):
        ap.error("--reform does not go with --dcp-load or --dcp-save")
    return a


def main(argv: list[str]) -> int:
    a = parse_args(argv)
    torch.use_deterministic_algorithms(True)
    torch.set_num_threads(1)
    cuda = torch.cuda.is_available()
    if cuda:
        torch.cuda.set_device(0 if torch.cuda.device_count() == 1 else int(os.environ.get("LOCAL_RANK", "0")))
    os.environ.setdefault("RANK", "0")
    os.environ.setdefault("WORLD_SIZE", "1")
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", "29500")
    backend = "nccl" if cuda else "gloo"
    dev = "cuda" if cuda else "cpu"
    device = torch.device("cuda", torch.cuda.current_device()) if cuda else torch.device("cpu")
    s = SIZES[a.model]

    def build(fill: bool = False) -> tuple[nn.Module, torch.optim.Optimizer]:
        """The model sharded over this process group's ranks, and AdamW. fill:
        its parameters are filled from memory right after (ShardedElastic):
        made on the meta device and only allocated, not initialized."""
        world = dist.get_world_size()
        if a.mode == "hsdp":
            shard = a.shard or int(os.environ.get("LOCAL_WORLD_SIZE", str(world)))
            if shard < 1 or world % shard:
                raise SystemExit(f"train_fsdp: --mode hsdp: {world} ranks do not split into groups of "
                                 f"{shard} (--shard)")
            mesh = init_device_mesh(dev, (world // shard, shard), mesh_dim_names=("replicate", "shard"))
        else:
            mesh = init_device_mesh(dev, (world,), mesh_dim_names=("shard",))
        if fill:
            with torch.device("meta"):
                m = TinyGPT(s, init=False)
        else:
            torch.manual_seed(a.seed)  # the biases' initial values: the same on every rank and run
            m = TinyGPT(s).to(device)
        for blk in m.blocks:
            fully_shard(blk, mesh=mesh)
        fully_shard(m, mesh=mesh)
        if fill:
            m.to_empty(device=device)  # this rank's shards only, uninitialized
            m.init_buffers()
        return m, torch.optim.AdamW(m.parameters(), lr=a.lr, weight_decay=0.01)

    samples = 0  # global: samples trained on by every rank together
    el: Any = None
    model: Any = None
    optim: Any = None

    def state() -> dict[str, Any]:
        msd, osd = get_state_dict(model, optim)
        return {"model": msd, "optim": osd}

    def apply(st: dict[str, Any]) -> None:
        set_state_dict(model, optim, model_state_dict=st["model"], optim_state_dict=st["optim"])

    def save(w: gl.CheckpointWriter) -> None:
        w.save_sharded(SHARDED, state())
        if w.rank == 0:
            w.save_state(STATE_FILE, {"samples": samples, "world": dist.get_world_size(), "mode": a.mode})

    def load(r: gl.CheckpointReader) -> None:
        nonlocal samples
        st = state()
        r.load_sharded(SHARDED, st)
        apply(st)
        samples = int(r.load_state(STATE_FILE)["samples"])
        if dist.get_rank() == 0:
            print(f"train_fsdp: step {r.step}'s checkpoint of {r.saved_world} ranks loaded into "
                  f"{dist.get_world_size()} ({a.mode}), at sample {samples}", flush=True)

    ckpt: Optional[gl.Checkpointer] = None
    if a.checkpoint_dir:
        ckpt = gl.Checkpointer(a.checkpoint_dir, every_steps=a.checkpoint_every,
                               durable=a.checkpoint_durable, async_save=not a.sync_checkpoint)

    def restore() -> Optional[int]:
        got = ckpt.restore(load) if ckpt is not None else None
        if got is not None and samples != got * a.global_batch:
            raise SystemExit(f"train_fsdp: the checkpoint of step {got} is at sample {samples}, not "
                             f"{got * a.global_batch}: saved with another --global-batch?")
        return got

    start = 0
    if a.reform:
        def get_extra() -> Any:
            return {"samples": samples}

        def set_extra(extra: Any) -> None:
            nonlocal samples
            samples = int(extra["samples"])

        def built(fill: bool) -> tuple[nn.Module, torch.optim.Optimizer]:
            nonlocal model, optim
            model, optim = build(fill)  # load() and save() reach the current ones
            return model, optim

        held: set[str] = set()

        def hold(what: str, at: Optional[tuple[int, ...]]) -> None:
            if at == (el.world_size, el.rank) and what not in held:
                held.add(what)
                print(f"rank {el.rank} holding {what}", flush=True)
                while not el.round_over:
                    time.sleep(0.01)

        def on_copy(step: int) -> None:
            print(f"rank {el.rank}: moving step {step}'s shards into a world of {el.world_size}", flush=True)
            hold("in the copy", a.hold_copy)

        def on_copied(step: int) -> None:
            print(f"rank {el.rank}: step {step}'s shards moved into a world of {el.world_size}", flush=True)
            hold("after its copy", a.hold_copied)

        el = gl.ShardedElastic(built, backend=backend, checkpointer=ckpt, get_extra=get_extra,
                               set_extra=set_extra, mirror_every=a.mirror_every, on_copy=on_copy,
                               on_copied=on_copied)
        if not el.enabled and el.rank == 0:
            print("train_fsdp: --reform: not under a gpulaunch that hands rounds over: a lost node "
                  "restarts the workers", file=sys.stderr)
        print(f"rank {el.rank} pid {os.getpid()} round {el.round}", flush=True)
        start = el.start(restore)
        model, optim = el.model, el.optimizer
        j = el.last
        if j is not None and j.copied and j.mine:
            print(f"rank {el.rank}: joined round {j.round}: step {j.step}'s shards taken from the "
                  f"memory of {j.survivors} ranks in {1000.0 * j.copy_s:.1f} ms, nothing read from storage",
                  flush=True)
    else:
        dist.init_process_group(backend=backend, init_method="env://")
        model, optim = build()
        if a.dcp_load:
            st = state()
            dcp.load(st, checkpoint_id=a.dcp_load)
            apply(st)
            extra = torch.zeros(1, dtype=torch.int64)
            if dist.get_rank() == 0:
                with open(os.path.join(a.dcp_load, "samples")) as f:
                    extra[0] = int(f.read())
            dist.broadcast(extra, 0)
            samples = int(extra[0])
            start = samples // a.global_batch
        else:
            start = restore() or 0
    rank, world = dist.get_rank(), dist.get_world_size()
    if rank == 0 and start == 0:
        n = sum(p.numel() for p in model.parameters())
        print(f"train_fsdp: {n} parameters, {n * 12 / 1e6:.0f} MB of parameters and AdamW state in all "
              f"({a.mode} over {world} ranks)", flush=True)
    if a.global_batch % world:
        print(f"train_fsdp: --global-batch {a.global_batch} is not a multiple of the world size {world}",
              file=sys.stderr)
        return 2
    if el is None:  # a collective: with --reform, a joining node's ranks would gather alone
        print(f"rank {rank} loaded params_sha256 {full_params_sha256(model)}", flush=True)

    preempted = False
    round_errors: tuple[type[BaseException], ...] = el.round_errors if el is not None else ()
    done = start
    first = True
    held: set[tuple[int, int]] = set()
    reached: set[int] = set()
    hold_steps = {st for _, st in a.hold}
    t0 = time.monotonic()
    while True:
        try:
            while done < a.steps:
                step = done
                if step in hold_steps and step not in reached:
                    reached.add(step)  # this rank's steps before it are done (tests wait for it)
                    print(f"rank {rank} reached step {step}", flush=True)
                if (rank, step) in a.hold and (rank, step) not in held:
                    held.add((rank, step))
                    if el is not None:
                        el.mirror_wait()  # what is held is what its buddy has
                    print(f"rank {rank} holding before step {step}", flush=True)
                    while el is None or not el.round_over:
                        time.sleep(0.01)
                per_rank = a.global_batch // world
                first_sample = samples + rank * per_rank
                x = torch.stack([sample_tokens(a.seed, i, s)
                                 for i in range(first_sample, first_sample + per_rank)]).to(device)
                if a.print_samples and rank == 0:
                    print(f"step {step} samples {samples}..{samples + a.global_batch - 1}", flush=True)
                logits = model(x[:, :-1])
                # the mean over the global batch: FSDP averages gradients over the
                # ranks, so each rank's sum is scaled by W / G
                loss = F.cross_entropy(logits.reshape(-1, s.vocab), x[:, 1:].reshape(-1), reduction="sum")
                (loss * (world / (a.global_batch * s.seq))).backward()
                optim.step()
                optim.zero_grad(set_to_none=True)
                samples += a.global_batch
                done = step + 1
                if first and rank == 0:
                    print(f"first step in a world of {world}: step {step}", flush=True)
                first = False
                if a.step_sleep_ms > 0:
                    time.sleep(a.step_sleep_ms / 1000.0)
                if a.print_every and done % a.print_every == 0:
                    total = loss.detach().clone()
                    dist.all_reduce(total)
                    if rank == 0:
                        print(f"step {done} loss {total.item() / (a.global_batch * s.seq):.6f}", flush=True)
                if el is not None:
                    el.mirror(done, force=bool(a.checkpoint_every) and done % a.checkpoint_every == 0)
                if ckpt is not None and ckpt.step_end(done, save):
                    preempted = True
                    break
            if el is not None and not preempted:
                dist.barrier()  # every rank is at the end: none waits for a round
            break
        except round_errors:
            was = rank
            done = el.reform(done)
            r = el.last
            model, optim = el.model, el.optimizer
            rank, world = el.rank, el.world_size
            if a.global_batch % world:
                print(f"train_fsdp: --global-batch {a.global_batch} is not a multiple of the new world size "
                      f"{world}", file=sys.stderr)
                return 2
            src = "the copies in peers' memory" if el.from_copies else f"the memory of {r.survivors} ranks"
            print(f"rank {rank} (was {was}): round {r.round} re-formed in place, world {world}, going on "
                  f"after step {r.step} ({r.lost} lost), shards from {src} in "
                  f"{1000.0 * r.seconds:.1f} ms (the copy {1000.0 * r.copy_s:.1f} ms, the build "
                  f"{1000.0 * el.build_s:.1f} ms)", flush=True)
            first = True
    took = time.monotonic() - t0
    if ckpt is not None and not preempted:
        ckpt.wait()
    if a.dcp_save:
        dcp.save(state(), checkpoint_id=a.dcp_save)
        rank = dist.get_rank()
        if rank == 0:
            with open(os.path.join(a.dcp_save, "samples"), "w") as f:
                f.write(str(samples))
    print(f"rank {rank} params_sha256 {full_params_sha256(model)}", flush=True)
    ms = el.mirror_status() if el is not None else None
    if ms is not None:
        el.mirror_wait()
        ms = el.mirror_status()
        assert ms is not None
        print(f"rank {rank} mirror: {el.mirror_pushes} pushes to rank {ms.buddy}, the last stalled the loop "
              f"{1000.0 * el.mirror_stall_s:.1f} ms and took {ms.last_push_s:.3f} s to its buddy "
              f"({ms.last_rate_mbs:.0f} MB/s); snapshot {ms.bytes / 1e6:.1f} MB, copies held "
              f"{ms.held_bytes / 1e6:.1f} MB", flush=True)
    if rank == 0:
        n = max(a.steps - start, 0)
        print(f"train_fsdp: {n} steps in {took:.3f} s on {world} ranks ({a.mode}), sample {samples}", flush=True)
    if ckpt is not None:
        ckpt.close()
    if el is not None:
        el.close()
    else:
        dist.destroy_process_group()
    return gl.EXIT_PREEMPTED if preempted else 0


if __name__ == "__main__":
    code = main(sys.argv[1:])
    # Everything is said and written: leave without the interpreter's
    # finalization, where Gloo's C++ threads still holding tensors can abort
    # the process ("terminate called without an active exception", SIGABRT)
    # after a run that succeeded (pytorch/pytorch#179291).
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
