#!/usr/bin/env python3
"""train_ddp: data-parallel training of a small decoder-only language model with
PyTorch's DistributedDataParallel, checkpointed and preemptible through gpulaunch.

    gpulaunch --standalone --nproc-per-node 2 train_ddp.py --steps 100 \\
        --checkpoint-dir ckpt --checkpoint-every 20
    torchrun --standalone --nproc_per_node 2 train_ddp.py --steps 100

(gpulaunch runs a .py program with the python3 of the environment it was
installed into with pip, else the python3 on PATH; where that one has no torch,
name the interpreter: --no-python /usr/bin/python3 train_ddp.py ...)

The process group comes from the launcher's environment (MASTER_ADDR,
MASTER_PORT, RANK, WORLD_SIZE): Gloo on the CPU, NCCL when CUDA is available
(device LOCAL_RANK, or device 0 when the launcher left one visible device).

The model is a GPT-style decoder (token and position embeddings, pre-LayerNorm
blocks of causal self-attention and an MLP, a head tied to the token
embedding, no dropout), sized by --model (SIZES below):

    tiny (default)  vocab 64, context 16, width 32, 2 heads, 2 blocks,
                    4 sequences per rank: 28k parameters, a few ms a step
    small           vocab 256, context 32, width 64, 4 heads, 2 blocks,
                    8 sequences per rank: 121k parameters

Other model names, such as a command line written for a large model
(--model=llama-7b), are accepted and train the tiny size; a note on stderr
says so. The other flags of such a command line are accepted too:
--batch-size (sequences per rank and step), --output DIR (rank 0 writes the
final model.pt there), --dataset (ignored, with a note: the tokens are
synthetic), --epochs E (E x --steps-per-epoch steps, unless --steps is given;
the default is 100 steps). The tokens come from a generator seeded by
(--seed, step, rank), so the data of a step depends on nothing else and a
resumed run sees the batches an uninterrupted one saw; they follow a fixed
random successor table with 10 % noise, so the loss goes down.

Runs are deterministic (deterministic algorithms, one thread, fixed seeds), so
a run resumed from a checkpoint ends with parameters bitwise equal to those
of an uninterrupted run with the same world size, under either launcher
(gpulaunch and torchrun end with the same parameters). Before the first step
every run does one backward pass of a zero loss: it makes DDP settle its gradient
buckets, so every counted step reduces the same bucket layout whether or not
the run was resumed (the layout decides the order in which more than two
ranks' gradients are summed).

--slow-rank R makes rank R a straggler, as a throttled GPU would: from step
--slow-from-step on, its compute part of each step (forward and backward, taken
as 3 x the forward's time, plus --step-sleep-ms) takes --slow-factor times as
long (default 1.5), plus --slow-ms; the extra sleep comes after the forward and
before backward(), so before DDP's gradient all-reduce, where the other ranks
wait for it.

With --checkpoint-dir, a gpulaunch.Checkpointer saves rank 0's model and
AdamW state (the data-parallel state is replicated; only rank 0 writes it)
every --checkpoint-every steps and when the job is preempted, and every rank
restores the newest complete checkpoint at start (the directory is read by
every rank: on several nodes it must be shared, or give each node its own
and a shared --checkpoint-durable). The state is one file, `train.state`,
written with CheckpointWriter.save_state (no pickle) and read with
load_state. Saves are asynchronous (training stops only while the state is
copied into the runtime's staging buffer; --checkpoint-sync: until the file
is written); --checkpoint-durable DIR|s3://bucket/prefix drains every
checkpoint to a second tier in the background, and restore takes the newest
step from either. After the last step every rank waits for the last save
(Checkpointer.wait()), which makes it complete. Without --checkpoint-dir the
program needs torch alone.

Output (stdout): on rank 0 `resumed from the checkpoint of step N` and
`step N loss X` (N counted from 0; every --print-every steps and the last
step; X is the loss averaged over the ranks) and, at the first step this
process completes, `first step in a world of W: step N` (W ranks; a
launcher's new round starts new processes, so each round prints one: the
healing time after a fault is measured to it); on every rank at the end
`rank R params_sha256 HEX`, the SHA-256 of the parameters' bytes (named
parameters in order, float32, contiguous, on the CPU). When preempted every
rank prints `rank R preempted after step N` (N steps done, the checkpoint's
step) and the process exits with gpulaunch.EXIT_PREEMPTED (143). Rank 0 ends
with a timing line on stderr. --step-sleep-ms sleeps after every step (room
for a preemption notice to arrive mid-run). --pg-timeout-s sets the process
group's timeout (how long a collective waits for a peer before it fails;
default torch's, 30 minutes).

--state-mib N adds N MiB of state beside the model (default 0: none), the
stand-in for a large model's: a persistent byte buffer of the model
(`ballast`) that the checkpoint saves and restores and that Elastic copies to
a new rank with the parameters; DDP does not broadcast it when it is made
(every rank has it already). Every rank that restores a checkpoint prints
`rank R: read N bytes from the checkpoint` (the size of the file it read).

--reform (under gpulaunch): when a node is lost or added, the survivors are
not restarted: gpulaunch.Elastic waits for the launcher's next round, makes
the process group and DDP again, and the step whose collective failed is run
again in the new world (docs/pytorch.md, live re-formation). A rank started
into a round whose other ranks kept their state (a new node's, or one
restarted) copies model, optimizer, RNG and the sample count from them
instead of reading the checkpoint. Extra output: every rank prints
`rank R pid P round N` when it starts; after a re-formation `rank R (was Q):
round N re-formed in place, world W, going on after step S (L lost)[, state
copied from rank K] in X ms` and, after a collective the watcher freed,
`rank R: freed F ms after the launcher said round N ended`; a rank that copied
the state at its start `rank R: joined round N with K ranks that kept their
state: step S copied from rank Q, nothing read from the checkpoint`; at the
end `rank R samples_seen N` (sequences of every rank, the extra state copied).
A rank that copied the state at its start also prints `rank R: joined in X
ms, N bytes of state copied (via V; the copy C ms)` (X: from Elastic.start()
to its return, making the process group included; N: the parameters',
buffers' and optimizer's bytes; V: gpulaunch when libgpulaunch's copy moved
the host tensors, else the process group's backend; C: the copy alone, from
the agreement's end).
TRAIN_DDP_TRACE=FILE: rank 0 appends `step N world W loss L params H` to FILE
after every step (N steps done, H the first 16 hex digits of the parameters'
SHA-256), as dp_train's DP_TRAIN_TRACE does: which world each step ran in.
Rank 0 prints `first step in a world of W: step N` after every re-formation
too. For the tests: --hold R:S (repeatable) stops rank R before step S, once
per process, saying `rank R holding before step S` (every rank says `rank R
reached step S` when its steps before S are done), until it is killed, its
round ends or the file --release-file names exists (the other ranks wait for
it in the step's all-reduce, so a fault injected then comes at a known step);
--reform-fail-rank R makes rank R exit (code 3) instead of re-forming the
first time, so that its launcher falls back to a restart; --stall R:S makes rank R's first all-reduce of step S one that
never returns, once per process, saying `rank R stalling an all-reduce of step
S` (as a Gloo one cut off mid-way can: gpulaunch.Elastic frees the step when
the round ends).
"""

from __future__ import annotations

import argparse
import datetime
import hashlib
import inspect
import math
import os
import sys
import time
from typing import Any, Callable, NamedTuple, Optional

# cuBLAS is deterministic only with a fixed workspace; it reads this at its
# first use, so it is set before torch is imported.
os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")

_T0 = time.monotonic()

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
import torch.nn as nn  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from torch.nn.parallel import DistributedDataParallel as DDP  # noqa: E402

_T_IMPORT = time.monotonic() - _T0

class Size(NamedTuple):
    vocab: int
    seq: int
    dim: int
    heads: int
    layers: int
    batch: int  # sequences per rank and step


SIZES: dict[str, Size] = {
    "tiny": Size(vocab=64, seq=16, dim=32, heads=2, layers=2, batch=4),
    "small": Size(vocab=256, seq=32, dim=64, heads=4, layers=2, batch=8),
}


# --state-mib's bound: 8 GiB of extra state per rank
MAX_STATE_MIB = 8192

# the checkpoint's file (CheckpointWriter.save_state: no pickle)
STATE_FILE = "train.state"


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
        # additive: 0 on and below the diagonal, -inf above (float, as Gloo
        # broadcasts no bool buffer when DDP syncs the module)
        causal = torch.full((s.seq, s.seq), float("-inf")).triu(1)
        self.register_buffer("causal", causal, persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape
        hd = d // self.heads
        q, k, v = self.qkv(self.ln1(x)).split(d, dim=2)
        q = q.view(b, t, self.heads, hd).transpose(1, 2)
        k = k.view(b, t, self.heads, hd).transpose(1, 2)
        v = v.view(b, t, self.heads, hd).transpose(1, 2)
        att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(hd))
        att = (att + self.causal[:t, :t]).softmax(dim=-1)
        y = (att @ v).transpose(1, 2).reshape(b, t, d)
        x = x + self.proj(y)
        return x + self.out(F.gelu(self.fc(self.ln2(x))))


class TinyGPT(nn.Module):
    def __init__(self, s: Size) -> None:
        super().__init__()
        self.tok = nn.Embedding(s.vocab, s.dim)
        self.pos = nn.Embedding(s.seq, s.dim)
        self.blocks = nn.ModuleList(Block(s) for _ in range(s.layers))
        self.ln = nn.LayerNorm(s.dim)
        self.head = nn.Linear(s.dim, s.vocab, bias=False)
        self.head.weight = self.tok.weight  # tied
        for name, p in self.named_parameters():
            if name.endswith("weight") and p.dim() == 2:
                nn.init.normal_(p, mean=0.0, std=0.02)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        t = idx.shape[1]
        pos = torch.arange(t, device=idx.device)
        x = self.tok(idx) + self.pos(pos)
        for blk in self.blocks:
            x = blk(x)
        return self.head(self.ln(x))


def _seed_of(*parts: int) -> int:
    text = "train_ddp:" + ":".join(str(p) for p in parts)
    return int.from_bytes(hashlib.sha256(text.encode()).digest()[:8], "little") >> 1


def successor_table(seed: int, vocab: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(_seed_of(seed, -1))
    return torch.randperm(vocab, generator=g)


def batch_of(seed: int, step: int, rank: int, s: Size, batch: int,
             succ: torch.Tensor) -> torch.Tensor:
    """The tokens of (step, rank): batch x (seq + 1), on the CPU."""
    g = torch.Generator().manual_seed(_seed_of(seed, step, rank))
    noise = torch.randint(s.vocab, (batch, s.seq + 1), generator=g)
    keep = torch.rand((batch, s.seq + 1), generator=g) >= 0.1
    x = noise.clone()
    for t in range(1, s.seq + 1):
        x[:, t] = torch.where(keep[:, t], succ[x[:, t - 1]], noise[:, t])
    return x


def params_sha256(model: nn.Module) -> str:
    h = hashlib.sha256()
    for _, p in model.named_parameters():
        h.update(p.detach().to("cpu", torch.float32).contiguous().numpy().tobytes())
    return h.hexdigest()


def slow_down(forward_s: float, a: argparse.Namespace) -> None:
    """--slow-rank: the rest of this step's compute, factor times as long."""
    compute_s = 3.0 * forward_s + a.step_sleep_ms / 1000.0
    extra = (a.slow_factor - 1.0) * compute_s + a.slow_ms / 1000.0
    if extra > 0:
        time.sleep(extra)


def parse_args(argv: list[str]) -> argparse.Namespace:
    ap = argparse.ArgumentParser(
        description="Data-parallel training of a small GPT on synthetic tokens (DDP).")
    ap.add_argument("--steps", type=int, default=None,
                    help="optimizer steps in all (default 100, or --epochs x --steps-per-epoch)")
    ap.add_argument("--epochs", type=int, default=None, help="epochs of --steps-per-epoch steps")
    ap.add_argument("--steps-per-epoch", type=int, default=10)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--model", default="tiny",
                    help="tiny | small; other names (e.g. llama-7b) train the tiny size")
    ap.add_argument("--batch-size", type=int, default=None,
                    help="sequences per rank and step (default: the model size's)")
    ap.add_argument("--lr", type=float, default=3e-3)
    ap.add_argument("--dataset", default=None, help="ignored: the tokens are synthetic")
    ap.add_argument("--output", default=None, help="directory for rank 0's final model.pt")
    ap.add_argument("--checkpoint-dir", default=None)
    ap.add_argument("--checkpoint-every", type=int, default=0,
                    help="checkpoint every K steps (0: only when preempted)")
    ap.add_argument("--checkpoint-durable", default=None, metavar="DIR|s3://BUCKET/PREFIX",
                    help="a durable tier the checkpoints drain to in the background")
    ap.add_argument("--checkpoint-sync", action="store_true",
                    help="step_end waits until the checkpoint is written (default: asynchronous)")
    ap.add_argument("--step-sleep-ms", type=int, default=0, help="sleep after each step")
    ap.add_argument("--print-every", type=int, default=10)
    ap.add_argument("--slow-rank", type=int, default=None,
                    help="this rank's compute takes --slow-factor times as long (a straggler)")
    ap.add_argument("--slow-factor", type=float, default=1.5)
    ap.add_argument("--slow-ms", type=int, default=0, help="extra compute per step on --slow-rank")
    ap.add_argument("--slow-from-step", type=int, default=0)
    ap.add_argument("--pg-timeout-s", type=float, default=None,
                    help="the process group's timeout in seconds (default torch's)")
    ap.add_argument("--state-mib", type=int, default=0,
                    help="MiB of extra state per rank, checkpointed and copied with the model")
    ap.add_argument("--backend", choices=("auto", "gloo", "nccl"), default="auto")
    ap.add_argument("--reform", action="store_true",
                    help="survive a lost or added node in place (gpulaunch.Elastic)")
    ap.add_argument("--hold", action="append", default=[], metavar="R:S", help=argparse.SUPPRESS)
    ap.add_argument("--reform-fail-rank", type=int, default=None, help=argparse.SUPPRESS)
    ap.add_argument("--release-file", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--stall", default=None, metavar="R:S", help=argparse.SUPPRESS)
    ap.add_argument("--local-rank", "--local_rank", type=int, default=None,
                    help=argparse.SUPPRESS)  # torch.distributed.launch passes it
    a = ap.parse_args(argv)
    if a.steps is None:
        a.steps = a.epochs * a.steps_per_epoch if a.epochs is not None else 100
    for flag, value, least in (("--steps", a.steps, 0), ("--steps-per-epoch", a.steps_per_epoch, 1),
                               ("--print-every", a.print_every, 1),
                               ("--checkpoint-every", a.checkpoint_every, 0),
                               ("--step-sleep-ms", a.step_sleep_ms, 0),
                               ("--slow-ms", a.slow_ms, 0),
                               ("--slow-from-step", a.slow_from_step, 0),
                               ("--state-mib", a.state_mib, 0),
                               ("--batch-size", a.batch_size or 1, 1)):
        if value < least:
            ap.error(f"{flag} must be at least {least}, not {value}")
    if a.state_mib > MAX_STATE_MIB:
        ap.error(f"--state-mib takes at most {MAX_STATE_MIB}, not {a.state_mib}")
    if not 1.0 <= a.slow_factor <= 100.0:
        ap.error(f"--slow-factor must be from 1 to 100, not {a.slow_factor}")
    if a.pg_timeout_s is not None and a.pg_timeout_s <= 0:
        ap.error(f"--pg-timeout-s must be above 0, not {a.pg_timeout_s}")
    a.hold = {rank_step(ap, "--hold", h) for h in a.hold}
    a.stall = rank_step(ap, "--stall", a.stall) if a.stall is not None else None
    return a


def rank_step(ap: argparse.ArgumentParser, flag: str, text: str) -> tuple[int, int]:
    """RANK:STEP of --hold and --stall."""
    rank, sep, step = text.partition(":")
    try:
        if sep:
            return int(rank), int(step)
    except ValueError:
        pass
    ap.error(f"{flag} takes RANK:STEP, not {text!r}")


def stalling(inner: Any, at: tuple[int, int], now: Callable[[], tuple[int, int]]) -> Any:
    """--stall: a DDP hook around inner (DDP's all-reduce when None) whose
    first call at (rank, step) `at` returns a future that never completes."""
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

    call = inner if inner is not None else default_hooks.allreduce_hook
    stalled = False

    def hook(state: Any, bucket: Any) -> Any:
        nonlocal stalled
        if now() == at and not stalled:
            stalled = True
            print(f"rank {at[0]} stalling an all-reduce of step {at[1]}", flush=True)
            return torch.futures.Future()
        return call(state, bucket)

    hook.__annotations__ = {}  # DDP checks a hook's annotations against torch's own types
    return hook


def main(argv: list[str]) -> int:
    a = parse_args(argv)
    t_start = time.monotonic()
    torch.use_deterministic_algorithms(True)
    torch.set_num_threads(1)

    # started before this node had a round (a warm join): RANK, WORLD_SIZE &
    # co. come once torch is imported and the model made (below)
    pending = a.reform and os.environ.get("GPULAUNCH_ROUND_PENDING") == "1"
    rank = int(os.environ.get("RANK", "0")) if not pending else -1
    world = int(os.environ.get("WORLD_SIZE", "1"))
    local_rank = int(os.environ.get("LOCAL_RANK", str(a.local_rank or 0)))
    backend = a.backend
    if backend == "auto":
        backend = "nccl" if torch.cuda.is_available() else "gloo"
    if backend == "nccl":
        if not torch.cuda.is_available():
            print("train_ddp: --backend nccl needs CUDA, which torch does not see here",
                  file=sys.stderr)
            return 2
        # one visible device: the launcher bound this worker to it
        dev_index = 0 if torch.cuda.device_count() == 1 else local_rank
        torch.cuda.set_device(dev_index)
        device = torch.device("cuda", dev_index)
    else:
        device = torch.device("cpu")
    if not pending:
        os.environ.setdefault("RANK", str(rank))
        os.environ.setdefault("WORLD_SIZE", str(world))
        os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
        os.environ.setdefault("MASTER_PORT", "29500")
    pg_kwargs: dict[str, Any] = {}
    if a.pg_timeout_s is not None:
        pg_kwargs["timeout"] = datetime.timedelta(seconds=a.pg_timeout_s)
    if not a.reform:  # else gpulaunch.Elastic makes it (below)
        dist.init_process_group(backend=backend, init_method="env://", **pg_kwargs)
        rank, world = dist.get_rank(), dist.get_world_size()

    size = SIZES.get(a.model)
    if size is None:
        size = SIZES["tiny"]
        if rank == 0:
            print(f"train_ddp: model '{a.model}' is trained at the tiny size here "
                  f"(sizes: {', '.join(SIZES)})", file=sys.stderr)
    if a.dataset is not None and rank == 0:
        print(f"train_ddp: --dataset {a.dataset} ignored: the tokens are synthetic",
              file=sys.stderr)
    batch = a.batch_size or size.batch

    torch.manual_seed(a.seed)
    model = TinyGPT(size).to(device)
    if a.state_mib:
        # empty: filled below when nothing was restored or copied into it (a
        # restore replaces it, so its pages are never touched then)
        model.register_buffer("ballast", torch.empty(a.state_mib << 20, dtype=torch.uint8, device=device))
        # every rank has it: DDP need not broadcast it each time it is made
        DDP._set_params_and_buffers_to_ignore_for_model(model, ["ballast"])
    opt = torch.optim.AdamW(model.parameters(), lr=a.lr, weight_decay=0.01)
    succ = successor_table(a.seed, size.vocab)
    if pending:
        import gpulaunch as glr

        if a.state_mib:  # its pages, as a real model's initialised state has them
            model.ballast.zero_()
        glr.await_round()
        rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])

    # What a checkpoint must match to be resumed from (the world size may
    # change: the state is replicated, only the batches then differ).
    config: dict[str, Any] = {"model": size._asdict(), "seed": a.seed}
    if a.state_mib:
        config["state_mib"] = a.state_mib

    def load(r: Any) -> None:
        nonlocal samples
        state = r.load_state(STATE_FILE, map_location=device)
        print(f"rank {r.rank}: read {os.path.getsize(r.path(STATE_FILE))} bytes from the checkpoint",
              flush=True)
        if state.get("config") != config:
            raise RuntimeError(f"the checkpoint of step {r.step} in {a.checkpoint_dir} was "
                               f"written by another configuration ({state.get('config')}; "
                               f"this run: {config}); use another --checkpoint-dir")
        if a.state_mib:  # the loaded tensor becomes the buffer: no second copy in memory
            model.ballast = state["model"]["ballast"]
        model.load_state_dict(state["model"])
        opt.load_state_dict(state["optimizer"])
        samples = int(state.get("samples", 0))
        if r.rank == 0 and state.get("world_size") != world:
            print(f"train_ddp: the checkpoint was written by {state.get('world_size')} ranks, "
                  f"this run has {world}: not bitwise the run it continues", file=sys.stderr)

    def save(w: Any) -> None:
        if w.rank == 0:  # replicated state: rank 0's copy is the checkpoint
            w.save_state(STATE_FILE, {"step": w.step, "config": config, "world_size": world,
                                      "samples": samples, "model": model.state_dict(),
                                      "optimizer": opt.state_dict()})

    ckpt: Any = None
    gl: Any = None
    start = 0

    def restore() -> Optional[int]:
        got: Optional[int] = ckpt.restore(load) if ckpt is not None else None
        if got is not None and rank == 0:
            print(f"resumed from the checkpoint of step {got}", flush=True)
        return got

    if a.checkpoint_dir:
        import gpulaunch as gl  # only needed for checkpoints

        ckpt = gl.Checkpointer(a.checkpoint_dir, every_steps=a.checkpoint_every,
                               durable=a.checkpoint_durable, async_save=not a.checkpoint_sync)
        if not a.reform:
            start = restore() or 0

    # The one buffer (the causal mask) is the same on every rank: it need not
    # be synced before each forward. torch 2.15 renamed the switch.
    no_sync: dict[str, bool] = (
        {"forward_sync_buffers": False}
        if "forward_sync_buffers" in inspect.signature(DDP.__init__).parameters
        else {"broadcast_buffers": False}
    )
    ddp_kwargs: dict[str, Any] = dict(device_ids=[device.index] if device.type == "cuda" else None,
                                      **no_sync)

    # Under gpulaunch: steps and the time DDP's all-reduces wait reach the
    # launcher's hang watchdog and the rendezvous' straggler detection
    # (docs/health.md); the hook is DDP's default all-reduce, timed.
    progress: Any = None
    hook: Any = None
    if os.environ.get("GPULAUNCH_PROGRESS_SHM"):
        import gpulaunch as glp

        hook = glp.allreduce_hook
        progress = glp.progress

    done = 0  # steps completed: this rank's optimizer stepped
    if a.stall is not None:
        hook = stalling(hook, a.stall, lambda: (rank, done))

    # --reform: the sequences every rank trained on so far, the extra state
    # a new rank copies with the model (a stand-in for a data loader's place)
    samples = 0
    el: Any = None
    ddp: Optional[DDP] = None
    if a.reform:
        import gpulaunch as gle

        def get_extra() -> Any:
            return {"samples": samples}

        def set_extra(extra: Any) -> None:
            nonlocal samples
            samples = int(extra["samples"])

        el = gle.Elastic(model, opt, backend=backend, timeout=pg_kwargs.get("timeout"),
                         ddp_kwargs=ddp_kwargs, comm_hook=hook, checkpointer=ckpt,
                         get_extra=get_extra, set_extra=set_extra)
        if not el.enabled and rank == 0:
            print("train_ddp: --reform: not under a gpulaunch that hands rounds over: a lost "
                  "node restarts the workers", file=sys.stderr)
        print(f"rank {rank} pid {os.getpid()} round {el.round}", flush=True)
        start = el.start(restore)
        rank, world, ddp = el.rank, el.world_size, el.ddp
        j = el.last
        if j is not None and j.copied and j.mine:
            print(f"rank {rank}: joined round {j.round} with {j.survivors} ranks that kept their "
                  f"state: step {j.step} copied from rank {j.root}, nothing read from the checkpoint",
                  flush=True)
            nbytes = sum(x.numel() * x.element_size() for x in [*model.parameters(), *model.buffers()])
            nbytes += sum(x.numel() * x.element_size() for st in opt.state.values()
                          for x in st.values() if torch.is_tensor(x))
            gle.state_source("peer", j.step, nbytes, j.copy_s or j.seconds, j.root)
            print(f"rank {rank}: joined in {1000.0 * j.seconds:.1f} ms, {nbytes} bytes of state copied "
                  f"(via {j.via}; the copy {1000.0 * j.copy_s:.1f} ms)", flush=True)
    else:
        ddp = DDP(model, **ddp_kwargs)
        if hook is not None:
            ddp.register_comm_hook(None, hook)
    if a.state_mib and start == 0:
        with torch.no_grad():  # a fresh run's state: every rank's the same
            model.ballast.fill_(a.seed & 0xFF)

    def loss_of(x: torch.Tensor) -> torch.Tensor:
        assert ddp is not None
        logits = ddp(x[:, :-1])
        return F.cross_entropy(logits.reshape(-1, size.vocab), x[:, 1:].reshape(-1))

    def settle() -> None:
        """DDP's buckets (see the docstring); the zero gradients are dropped."""
        (loss_of(batch_of(a.seed, -1, rank, size, batch, succ).to(device)) * 0.0).backward()
        opt.zero_grad(set_to_none=True)

    # The loss is reduced in place in this tensor, which outlives the process
    # group (see the teardown below).
    loss_sum = torch.zeros((), device=device)
    preempted_at: Optional[int] = None
    round_errors: tuple[type[BaseException], ...] = el.round_errors if el is not None else ()
    held: set[tuple[int, int]] = set()
    hold_steps = {s for _, s in a.hold}
    reached: set[int] = set()
    failed_once = False
    done = start  # steps completed: this rank's optimizer stepped
    trace = os.environ.get("TRAIN_DDP_TRACE")
    first = True  # the first step in this world is still to come
    t_train = time.monotonic()
    while True:
        try:
            if first:
                settle()
            while done < a.steps:
                step = done
                if step in hold_steps and step not in reached:
                    reached.add(step)  # this rank's steps before it are done (tests wait for it)
                    print(f"rank {rank} reached step {step}", flush=True)
                if (rank, step) in a.hold and (rank, step) not in held:
                    held.add((rank, step))
                    print(f"rank {rank} holding before step {step}", flush=True)
                    while (el is None or not el.round_over) and not (
                            a.release_file and os.path.exists(a.release_file)):
                        time.sleep(0.01)
                t_step = time.monotonic()
                x = batch_of(a.seed, step, rank, size, batch, succ).to(device)
                loss = loss_of(x)
                if rank == a.slow_rank and step >= a.slow_from_step:
                    slow_down(time.monotonic() - t_step, a)
                opt.zero_grad(set_to_none=True)
                loss.backward()
                opt.step()
                done = step + 1
                samples += world * batch
                if trace and rank == 0:
                    with open(trace, "a") as f:
                        f.write(f"step {done} world {world} loss {loss.item():.9g} "
                                f"params {params_sha256(model)[:16]}\n")
                if first and rank == 0:
                    print(f"first step in a world of {world}: step {step}", flush=True)
                first = False
                if step % a.print_every == 0 or step == a.steps - 1:
                    loss_sum.copy_(loss.detach())
                    dist.all_reduce(loss_sum)
                    if rank == 0:
                        print(f"step {step} loss {loss_sum.item() / world:.6f}", flush=True)
                if a.step_sleep_ms:
                    time.sleep(a.step_sleep_ms / 1000.0)
                if ckpt is not None and ckpt.step_end(step + 1, save):
                    preempted_at = step + 1
                    break
                if ckpt is None and progress is not None:
                    progress(step + 1)
            if el is not None and preempted_at is None:
                dist.barrier()  # every rank is at the end: none waits for a round
            break
        except round_errors:
            if rank == a.reform_fail_rank and not failed_once:
                print(f"rank {rank}: --reform-fail-rank: exiting instead of re-forming", flush=True)
                os._exit(3)
            failed_once = True
            was = rank
            done = el.reform(done)
            r = el.last
            rank, world, ddp = el.rank, el.world_size, el.ddp
            copied = f", state copied from rank {r.root}" if r.copied else ""
            print(f"rank {rank} (was {was}): round {r.round} re-formed in place, world {world}, going "
                  f"on after step {r.step} ({r.lost} lost){copied} in {1000.0 * r.seconds:.1f} ms",
                  flush=True)
            if r.freed_s > 0:
                print(f"rank {rank}: freed {1000.0 * r.freed_s:.0f} ms after the launcher said "
                      f"round {r.round - 1} ended", flush=True)
            first = True
    t_end = time.monotonic()
    if ckpt is not None and preempted_at is None:
        ckpt.wait()  # every rank: the last checkpoint written (and drained), marked COMPLETE

    if preempted_at is not None:
        print(f"rank {rank} preempted after step {preempted_at}", flush=True)
    else:
        print(f"rank {rank} params_sha256 {params_sha256(model)}", flush=True)
        if el is not None:
            print(f"rank {rank} samples_seen {samples}", flush=True)
        if a.output and rank == 0:
            os.makedirs(a.output, exist_ok=True)
            torch.save(model.state_dict(), os.path.join(a.output, "model.pt"))
    if ckpt is not None:
        ckpt.close()
    # Teardown: DDP first, then the process group, while every tensor handed
    # to Gloo is still referenced here. Gloo's worker thread may still be
    # dropping its last finished work; had that work held the last reference
    # to a Python tensor, the thread would need the GIL, which this thread
    # holds while it joins the worker in the process group's destructor (a
    # deadlock seen with 4 ranks on 2 cores when the tensor died first).
    ddp = None
    if el is not None:
        el.close()
    else:
        dist.destroy_process_group()
    if preempted_at is not None:
        return int(gl.EXIT_PREEMPTED)
    if rank == 0:
        n = a.steps - start
        print(f"train_ddp: {n} steps in {t_end - t_train:.3f} s "
              f"({1000.0 * (t_end - t_train) / max(n, 1):.2f} ms/step); "
              f"import {_T_IMPORT:.2f} s, setup {t_train - t_start:.2f} s", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
