"""Live re-formation for PyTorch DDP programs: when a node is lost or one is
added, the survivors keep their processes and memory, re-make the process
group and DDP for the next round, and a rank without the state (a new node's,
or one restarted) copies it from a survivor instead of reading a checkpoint.

    el = gpulaunch.Elastic(model, opt, checkpointer=ck)   # before the process group
    step = el.start(lambda: ck.restore(load))  # steps done: copied, restored or 0
    while True:
        try:
            while step < steps:
                train_step(el.ddp, step)                  # el.ddp: this round's DDP
                step += 1                                 # once opt.step() is done
                if ck.step_end(step, save):
                    sys.exit(gpulaunch.EXIT_PREEMPTED)
            torch.distributed.barrier()                   # every rank is at the end
            break
        except el.round_errors:
            step = el.reform(step)                        # the next round; steps to go on after

start() makes the process group from the launcher's environment, then every
rank says how many steps its state holds (-1: none). When some rank has state
and another's differs, every rank takes the state of the lowest rank with the
fewest steps (the agreed step: a rank whose last collective completed where
another's failed is set back to it); else, when no rank has state, load() runs
(a checkpoint restore; it returns the step or None for 0). DDP is made last.

reform(step) is called when a collective failed: it waits for the round's end
(re-raising the error when the round did not end: the error was something
else), then for the launcher's next round, re-forms the Checkpointer's
communicator, makes a new process group (RANK, WORLD_SIZE, MASTER_ADDR,
MASTER_PORT, GROUP_RANK, GROUP_WORLD_SIZE, GPULAUNCH_ROUND and
TORCHELASTIC_RESTART_COUNT in os.environ are the new round's), agrees and
copies as start() does and makes a new DDP. el.last says what happened
(a Reformed). What is copied from the agreed rank: parameters and buffers
(in place), the optimizer's state_dict (every tensor, step counters included;
a newcomer's empty optimizer is filled), the RNG states (torch, CUDA, random,
NumPy when imported) and get_extra()'s picklable value (a data position),
handed to set_extra on the ranks whose state is replaced. CPU tensors go by
libgpulaunch's gpl_copy_state (a TCP chain of the root and the ranks that
need them) when every rank has a libgpulaunch communicator in this round:
the Checkpointer's, else one made here under gpulaunch; CUDA tensors, and
all of them without one, go along a chain of the process group.

A blocked collective is freed when the round ends: a watcher thread waits on
the launcher's round block (gpl_round_wait) and, the moment the launcher says
the round is over, shuts down the process group's TCP connections (Gloo has
no abort; they are the sockets that appeared while the group was made, the
Gloo full mesh and the store), or aborts a NCCL group (and shuts down its
store connections). The collective then raises in the training thread, also
when the peer vanished without closing its sockets. A Gloo collective cut
off mid-way can outlive that (_gloofree.py): DDP's all-reduces go through a
hook whose futures the watcher fails 2 s after the round's end. A training
thread that has not run for stuck_exit_s after the break is taken to be
stuck in another collective, and the worker exits (its launcher restarts
it). The program reaches the model through el.ddp, which is a new DDP after
every reform(); el.round_over says whether the launcher ended this rank's
round.

Outside gpulaunch, or under a launcher that does not hand rounds over,
round_errors is () and reform() re-raises: the program runs as it would
without. A re-formation that cannot finish (the launcher says RESTART, or no
next round within reform_timeout_s) raises Error: the worker exits and the
launcher restarts it, as without re-formation.
"""

from __future__ import annotations

import ctypes
import dataclasses
import datetime
import inspect
import os
import socket
import sys
import threading
import time
import traceback
from typing import Any, Callable, Optional

from . import _native as N
from . import _procfs
from . import _statecopy as _sc
from ._firstround import await_round
from ._gloofree import Parked, RoundGuard
from ._nativecomm import NativeComm
from ._roundview import _moved, _Round, _RoundMoved
from ._native import Error
from .progress import _wait_fns, progress

# after a break, how long DDP's all-reduces on the broken Gloo group have to
# end by themselves before they are failed (_gloofree.py)
_FREE_AFTER_S = 2.0

# a store client's connection attempt: short, so that a round that ends while
# its master is not there yet is seen between attempts
_STORE_TRY_S = 2.0


@dataclasses.dataclass(frozen=True)
class Reformed:
    """What start() or reform() did on this rank."""

    round: int  # the round this rank runs in now
    rank: int
    was: int  # this rank's rank in the round before; -1 from start()
    world_size: int
    step: int  # the steps the job goes on after (the next step to run)
    lost: int  # steps this rank had done beyond that: redone
    root: int  # the rank whose state was copied; -1: none
    survivors: int  # ranks that came with state
    copied: bool  # some rank's state was replaced by root's
    mine: bool  # this rank's state was
    seconds: float  # from the call to its return
    freed_s: float  # from the launcher's word that the round ended to reform(); 0 if none
    why: str  # why the round before ended
    via: str = ""  # how the host tensors were copied: "gpulaunch" (gpl_copy_state), "gloo" or "nccl"; "": none
    copy_s: float = 0.0  # the copy alone (from the agreement's end to the copy's return); 0: none


def _env_int(name: str, default: int) -> int:
    try:
        return int(os.environ.get(name, ""))
    except ValueError:
        return default


class Elastic:
    """A DDP model and its optimizer that go on in the next round in place.

    model: the torch.nn.Module (on its device); optimizer: its optimizer (or
    None); backend: "gloo", "nccl" (default: nccl when CUDA is there);
    timeout: the process group's timeout (datetime.timedelta; default
    torch's); ddp_kwargs: for DistributedDataParallel (device_ids, ...);
    comm_hook: registered on every DDP made (with the default group as
    state), e.g. gpulaunch.allreduce_hook; checkpointer: a gpulaunch
    Checkpointer made before this, whose communicator is re-formed too;
    get_extra/set_extra: a picklable value copied with the state (a data
    position); reform_timeout_s: how long reform() waits for the next round;
    round_end_wait_s: how long reform() waits for the word that the round
    ended before it takes the error for another one; stuck_exit_s: how long
    the training thread may stay blocked after a break before the worker
    exits to be restarted (None: never)."""

    # a copy cut off leaves this rank's state as it was: False here (the copy writes into
    # the model itself), True for ShardedElastic (it fills a new model, the old one kept)
    _cut_copy_keeps_state = False

    def __init__(
        self,
        model: Any,
        optimizer: Any = None,
        *,
        backend: Optional[str] = None,
        timeout: Optional[datetime.timedelta] = None,
        ddp_kwargs: Optional[dict[str, Any]] = None,
        comm_hook: Optional[Callable[..., Any]] = None,
        checkpointer: Any = None,
        get_extra: Optional[Callable[[], Any]] = None,
        set_extra: Optional[Callable[[Any], None]] = None,
        reform_timeout_s: float = 600.0,
        round_end_wait_s: float = 10.0,
        stuck_exit_s: Optional[float] = 5.0,
    ) -> None:
        import torch
        import torch.distributed as dist

        self._torch: Any = torch
        self._dist: Any = dist
        self.model = model
        self.optimizer = optimizer
        if backend is None:
            backend = "nccl" if torch.cuda.is_available() else "gloo"
        if backend not in ("gloo", "nccl"):
            raise ValueError(f"Elastic: backend {backend!r} is not gloo or nccl")
        self.backend = backend
        self._timeout = timeout
        self._ddp_kwargs = dict(ddp_kwargs or {})
        self._comm_hook = comm_hook
        self._get_extra = get_extra
        self._set_extra = set_extra
        self._reform_timeout_s = reform_timeout_s
        self._round_end_wait_s = round_end_wait_s
        self._stuck_exit_s = stuck_exit_s
        self.ddp: Any = None
        await_round()  # a worker started before its round (a warm join) takes it first
        self.rank = _env_int("RANK", 0)
        self.world_size = _env_int("WORLD_SIZE", 1)
        self.local_rank = _env_int("GPULAUNCH_LOCAL_RANK", _env_int("LOCAL_RANK", 0))
        self.round = _env_int("GPULAUNCH_ROUND", 0)
        self.last: Optional[Reformed] = None
        self._own_group = False
        # the watcher and the training thread share what follows
        self._lock = threading.Lock()
        self._changed = threading.Condition(self._lock)
        self._latest: Optional[_Round] = None
        self._formed_seq = 0  # the round block's seq this group was made from
        self._forming = False  # a group is being made or is there: the watcher may break it
        self._before: dict[int, int] = {}  # sockets before the group was made
        self._owned: Optional[dict[int, int]] = None  # the group's TCP sockets, once made
        self._store_port = 0  # NCCL: only the store's sockets are shut down (NCCL's are its own)
        self._agreement: Optional[_sc.Agreement] = None  # the last agreement (its copy's chain, ...)
        self._native = NativeComm(checkpointer)  # the communicator host tensors are copied by
        self._guard = RoundGuard(torch)  # DDP's futures and FSDP's waits, failed at the round's end (Gloo)
        self._parked = Parked()  # groups whose Gloo works did not end
        self._via = ""  # how the last copy moved the host tensors
        self._copy_s = 0.0  # how long the last copy took
        self._broken_at = 0.0  # when the watcher broke this group (0: not)
        self._handled = True  # the training thread has left the broken group behind
        self._still_since = 0.0  # since when the training thread has not run
        self._trainer = threading.get_native_id()
        self._trainer_ident = threading.get_ident()
        self._stop = threading.Event()
        self._watcher: Optional[threading.Thread] = None
        self.enabled = self._enable()
        # what a collective of an ended round raises (torch's DistBackendError
        # and store errors are RuntimeErrors, as gpulaunch.Error is)
        self.round_errors: tuple[type[BaseException], ...] = (
            (RuntimeError, ConnectionError, TimeoutError) if self.enabled else ()
        )

    # ---- the round block ----

    def _enable(self) -> bool:
        if not os.environ.get("GPULAUNCH_PROGRESS_SHM"):
            return False
        try:
            rc = N.fn("gpl_reform_enable")()
            wait = N.fn("gpl_round_wait")
            N.fn("gpl_round_ack")
        except Error:
            return False  # a library older than this package
        if rc != N.GPL_OK:
            sys.stderr.write(
                f"gpulaunch: rank {self.rank}: this launcher does not hand rounds over (an older "
                "one, or its progress channel is off): a lost node restarts the workers\n"
            )
            return False
        info = N.RoundInfo()
        now = None
        for seq in (0xFFFFFFFF, 0):  # the block as it is: its seq differs from one of them
            if wait(seq, 0, ctypes.byref(info)) == N.GPL_OK:
                now = _Round.of(info)
                break
        if now is None:
            return False
        self._latest = now
        self._formed_seq = now.seq
        if self.backend == "gloo" and os.environ.get("TORCH_GLOO_LAZY_INIT", "0") not in ("", "0"):
            # connections made at the first collective would not be known as the group's
            os.environ.pop("TORCH_GLOO_LAZY_INIT")
        self._watcher = threading.Thread(target=self._watch, name="gpulaunch-round-watcher", daemon=True)
        self._watcher.start()
        return True

    def _watch(self) -> None:
        wait = N.fn("gpl_round_wait")
        info = N.RoundInfo()
        with self._lock:
            seq = self._latest.seq if self._latest else 0
        while not self._stop.is_set():
            # the GIL is released meanwhile; after a break, the trainer is looked at often
            rc = wait(seq, 1000 if self._handled else 100, ctypes.byref(info))
            if rc == N.GPL_ERR_TIMEOUT:
                self._fail_futures()
                self._check_stuck()
                continue
            if rc != N.GPL_OK:
                return
            r = _Round.of(info)
            seq = r.seq
            with self._lock:
                self._latest = r
                if self._forming and self._moved_locked():
                    self._break_locked()
                self._changed.notify_all()
            self._fail_futures()
            self._check_stuck()

    def _fail_futures(self) -> None:
        """_FREE_AFTER_S after a break, the DDP all-reduces and FSDP waits
        still pending on the broken Gloo group fail (not at once: one that had what it needs
        when the connections were shut down completes; its callbacks may be
        waiting for the interpreter's lock)."""
        with self._lock:
            at = self._broken_at
            if self._handled or not at or time.monotonic() - at < _FREE_AFTER_S:
                return
        n = self._guard.fail(f"gpulaunch: rank {self.rank}: round {self.round} ended")
        if n:
            sys.stderr.write(f"gpulaunch: rank {self.rank}: {n} collective(s) had not ended "
                             f"{_FREE_AFTER_S:.0f} s after round {self.round} ended (a Gloo transfer "
                             "cut mid-way): failed, so that the step re-forms\n")

    def _check_stuck(self) -> None:
        """Gloo does not fail a transfer that the shutdown cut mid-way (a send
        still queued, a receive half done): its collective waits for the
        group's timeout. A training thread that has not run since the break
        for stuck_exit_s is taken to be in one: the process exits, and its
        launcher restarts this node's workers (today's restart)."""
        if self._stuck_exit_s is None:
            return
        with self._lock:
            if self._handled or not self._broken_at:
                return
            now = time.monotonic()
            if _procfs.thread_state(self._trainer) in ("R", ""):
                self._still_since = now
                return
            if now - self._still_since < self._stuck_exit_s:
                return
            blocked = now - self._broken_at
        sys.stderr.write(
            f"gpulaunch: rank {self.rank}: still blocked {blocked:.1f} s after round {self.round} "
            "ended (Gloo fails a transfer cut mid-way only at the group's timeout); exiting so "
            f"that the launcher restarts this node's workers; it waits in the kernel at "
            f"{_procfs.thread_wchan(self._trainer) or '?'}, in Python at:\n{self._trainer_stack()}"
        )
        sys.stderr.flush()
        os._exit(1)

    def _trainer_stack(self) -> str:
        frame = sys._current_frames().get(self._trainer_ident)
        if frame is None:
            return "  (not found)\n"
        return "".join(traceback.format_stack(frame)[-8:])

    def _moved_locked(self) -> bool:
        """The round block moved on from the round the group was made for."""
        return self._latest is not None and _moved(self._latest, self._formed_seq)

    def _break_locked(self) -> None:
        """Frees whatever waits on this round's group (the lock is held)."""
        if self._broken_at == 0.0:
            self._broken_at = self._latest.seen if self._latest is not None else time.monotonic()
            self._still_since = time.monotonic()
            self._handled = False
        if self.backend == "nccl":
            self._abort_nccl()
        owned = self._owned
        if owned is None:  # still being made: whatever appeared since
            owned = _procfs.new_tcp(self._before, self._store_port)
        for fd, ino in owned.items():
            _procfs.shut(fd, ino)

    def _abort_nccl(self) -> None:
        abort = getattr(self._dist.distributed_c10d, "_abort_process_group", None)
        if abort is None or not self._dist.is_initialized():
            return  # an older torch: the collective fails at its timeout
        try:
            abort()
        except Exception as e:  # noqa: BLE001 - best effort from the watcher thread
            sys.stderr.write(f"gpulaunch: rank {self.rank}: aborting the NCCL group failed: {e}\n")

    def _wait_round(self, pred: Callable[[_Round], bool], timeout_s: float) -> Optional[_Round]:
        deadline = time.monotonic() + timeout_s
        with self._lock:
            while True:
                r = self._latest
                if r is not None and pred(r):
                    return r
                left = deadline - time.monotonic()
                if left <= 0:
                    return None
                self._changed.wait(left)

    def _next_round(self, deadline: float) -> _Round:
        """The launcher's next round; Error when it restarts this worker instead."""
        r = self._wait_round(
            lambda r: r.state == N.ROUND_RESTART or (r.state == N.ROUND_NEW and r.round > self.round),
            deadline - time.monotonic(),
        )
        if r is None:
            raise Error(
                N.GPL_ERR_TIMEOUT,
                f"gpulaunch: rank {self.rank}: no next round within {self._reform_timeout_s:.0f} s "
                f"of round {self.round}'s end; the launcher restarts the workers",
                "GPL_ERR_TIMEOUT",
            )
        if r.state == N.ROUND_RESTART:
            raise Error(
                N.GPL_ERR_ROUND_OVER,
                f"gpulaunch: rank {self.rank}: the launcher restarts this worker instead of "
                f"re-forming round {self.round} in place: {r.why}",
                "GPL_ERR_ROUND_OVER",
            )
        return r

    # ---- the process group ----

    def _adopt_env(self, r: _Round) -> None:
        self.rank = r.base_rank + self.local_rank
        self.world_size = r.world_size
        env = os.environ
        env["RANK"] = env["ROLE_RANK"] = str(self.rank)
        env["WORLD_SIZE"] = env["ROLE_WORLD_SIZE"] = str(r.world_size)
        env["GROUP_RANK"] = env["GPULAUNCH_NODE_RANK"] = str(r.node_rank)
        env["GROUP_WORLD_SIZE"] = str(r.nnodes)
        env["MASTER_ADDR"] = r.master_addr
        env["MASTER_PORT"] = str(r.master_port)
        env["GPULAUNCH_ROUND"] = str(r.round)
        env["TORCHELASTIC_RESTART_COUNT"] = str(r.restarts)

    def _make_group(self, addr: str, port: int) -> None:
        dist = self._dist
        with self._lock:
            if self._moved_locked():
                raise _RoundMoved(self.round)
            self._before = _procfs.sockets()
            self._owned = None
            self._store_port = port if self.backend == "nccl" else 0
            self._broken_at = 0.0
            self._guard.reset()
            self._forming = True
        timeout = self._timeout or datetime.timedelta(minutes=30)
        give_up = time.monotonic() + timeout.total_seconds()
        store = None
        while store is None:
            if self.rank != 0:
                self._await_master(addr, port, give_up)
            try:
                store = dist.TCPStore(addr, port, self.world_size, self.rank == 0,
                                      timeout=datetime.timedelta(seconds=_STORE_TRY_S),
                                      wait_for_workers=False)
            except (RuntimeError, OSError):
                with self._lock:
                    if self._moved_locked():
                        raise _RoundMoved(self.round) from None
                if self.rank == 0 or time.monotonic() > give_up:
                    raise
        store.set_timeout(timeout)
        # torch names the group (its keys in the store) by a count that a
        # creation cut short leaves raised: every rank must start from 0
        if not dist.is_initialized() and hasattr(dist.distributed_c10d, "_group_count"):
            dist.distributed_c10d._group_count = 0
        dist.init_process_group(self.backend, store=store, rank=self.rank, world_size=self.world_size,
                                timeout=timeout)
        self._own_group = True
        with self._lock:
            self._owned = _procfs.new_tcp(self._before, self._store_port)
            if self._moved_locked():
                self._break_locked()
                raise _RoundMoved(self.round)

    def _await_master(self, addr: str, port: int, give_up: float) -> None:
        """Until the store's master listens: torch's client waits a second
        after a refused connection."""
        while True:
            try:
                socket.create_connection((addr, port), timeout=_STORE_TRY_S).close()
                return
            except OSError:
                pass
            with self._lock:
                if self._moved_locked():
                    raise _RoundMoved(self.round)
            if time.monotonic() > give_up:
                return  # the store says what is wrong
            time.sleep(0.01)

    def _teardown(self) -> None:
        """The last round's DDP and process group, gone."""
        with self._lock:
            self._forming = False  # the watcher leaves these sockets alone from now on
            self._owned = None
        self.ddp = None
        self._destroy_group()
        for p in self.model.parameters():
            p.grad = None  # a failed step's partial gradients
        with self._lock:
            self._handled = True

    def _destroy_group(self) -> None:
        """The process group made here, gone; parked while Gloo works of it
        have not ended (destroying it would wait for them)."""
        if self._own_group and self._dist.is_initialized():
            busy = self._guard.unfinished()
            if busy:
                self._parked.park(self._dist.distributed_c10d._get_default_group(), busy)
            for group, works in self._guard.busy_groups():  # an FSDP mesh's groups
                if group is not None:
                    self._parked.park(group, works)
            try:
                self._dist.destroy_process_group()
            except Exception:  # noqa: BLE001 - a broken group may fail to say goodbye
                pass
        self._own_group = False
        self._parked.release()

    def _make_ddp(self, sync: bool) -> None:
        from torch.nn.parallel import DistributedDataParallel as DDP

        kw = dict(self._ddp_kwargs)
        if self.backend == "nccl" and "device_ids" not in kw:
            kw["device_ids"] = [self._torch.cuda.current_device()]
        if sync or "init_sync" in inspect.signature(DDP.__init__).parameters:
            if not sync:
                kw["init_sync"] = False  # the state was agreed and copied already
            self.ddp = DDP(self.model, **kw)
        else:
            # a torch without init_sync (1.x) broadcasts every parameter and
            # buffer from rank 0 to every rank when DDP is made: the state was
            # agreed and copied already, so that broadcast is left out
            import torch.nn.parallel.distributed as ddp_module

            sync_states = getattr(ddp_module, "_sync_module_states", None)
            if sync_states is not None:
                setattr(ddp_module, "_sync_module_states", lambda **_: None)
            try:
                self.ddp = DDP(self.model, **kw)
            finally:
                if sync_states is not None:
                    setattr(ddp_module, "_sync_module_states", sync_states)
        hook = self._comm_hook
        if self.enabled and self.world_size == 1:
            hook = self._alone_hook(hook)
        host = all(p.device.type == "cpu" for p in self.model.parameters())
        if self.enabled and self.backend == "gloo" and host:
            hook = self._guard.wrap(hook)  # (the futures it makes hold host tensors)
        if hook is not None:
            self.ddp.register_comm_hook(None, hook)

    def _raise_if_round_over(self) -> None:
        """Raises what a collective of an ended round would (a RuntimeError,
        one of round_errors) once the launcher says this rank's round ended."""
        if self.round_over:
            raise RuntimeError(f"gpulaunch: rank {self.rank}: the launcher says round {self.round} ended")

    def _alone_hook(self, inner: Optional[Callable[..., Any]]) -> Callable[..., Any]:
        """A world of one has no peer whose loss fails its all-reduce: the
        round's end is looked for in each bucket's hook, before the optimizer
        steps, and raised as a collective of an ended round would."""
        from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

        def hook(state: Any, bucket: Any) -> Any:
            self._raise_if_round_over()
            return inner(state, bucket) if inner is not None else default_hooks.allreduce_hook(state, bucket)

        hook.__annotations__ = {}  # DDP checks a hook's annotations against torch's own types
        return hook

    # ---- the agreement and the copy ----

    def _device(self) -> Any:
        t = self._torch
        return t.device("cuda", t.cuda.current_device()) if self.backend == "nccl" else t.device("cpu")

    def _handle(self) -> Optional[int]:
        """The libgpulaunch communicator's handle when it can copy this group's host tensors."""
        return self._native.handle(self.rank, self.world_size, self.round if self.enabled else None)

    def _agree(self, done: int) -> tuple[int, int, int, bool, bool]:
        """(step, root, survivors, copy, mine) as gpl_reform_agree decides."""
        a = _sc.agree(self._torch, self._dist, self.rank, self.world_size, done, self._device(),
                      self._handle() is not None)
        self._agreement = a
        return a.step, a.root, a.survivors, a.copy, a.mine

    def _broadcast(self, tensors: list[Any], root: int) -> None:
        """Root's tensors into every rank's, in place: host tensors by
        libgpulaunch's gpl_copy_state when every rank has its communicator,
        the rest (CUDA tensors; all of them without it) along a chain of the
        process group's send/recv."""
        a = self._agreement
        assert a is not None
        h = self._handle() if a.native else None
        if a.native and h is None:
            raise ConnectionError(f"gpulaunch: rank {self.rank}: the libgpulaunch communicator left "
                                  f"round {self.round} during the copy")
        host = [x for x in tensors if h is not None and x.device.type == "cpu"]
        rest = [x for x in tensors if h is None or x.device.type != "cpu"]
        if rest:
            _sc.send_tensors(self._torch, self._dist, self.rank, a.chain, root, rest, self._device())
        if h is not None:
            _sc.copy_native(self._torch, h, self.rank, a, host)
        if host:
            self._via = "gpulaunch"
        elif rest and not self._via:
            self._via = self.backend

    def _copy(self, root: int, mine: bool) -> None:
        """Root's state to every rank: the optimizer's structure, RNG and
        extra first (one object broadcast), then parameters, buffers and the
        optimizer's tensors in one copy (in place where this rank has the
        same ones, else into new tensors its optimizer loads), RNG and extra
        set on the ranks whose state is replaced."""
        t, dist = self._torch, self._dist
        self._via = ""
        model_tensors = [p.data for p in self.model.parameters()] + list(self.model.buffers())
        me = self.rank == root
        skel: Any = None
        mine_tensors: list[Any] = []
        if self.optimizer is not None:
            skel, mine_tensors = _sc.split(self.optimizer.state_dict())
        head = [
            {"optimizer": skel, "rng": _sc.rng_state(self._torch),
             "extra": self._get_extra() if self._get_extra is not None else None}
            if me else None
        ]
        dist.broadcast_object_list(head, src=root, device=self._device() if self.backend == "nccl" else None)
        got = head[0]
        assert isinstance(got, dict)
        into: list[Any] = []
        load = False
        if got["optimizer"] is not None and self.optimizer is not None:
            same = not mine and skel == got["optimizer"]
            if me or same:
                into = mine_tensors
            else:
                into = [t.empty(s.shape, dtype=s.dtype, device=self._device() if s.cuda else "cpu")
                        for s in _sc.slots(got["optimizer"])]
                load = True
        self._broadcast(model_tensors + into, root)
        if load:
            self.optimizer.load_state_dict(_sc.join(got["optimizer"], into))
        if mine:
            _sc.set_rng_state(self._torch, got["rng"])
            if self._set_extra is not None:
                self._set_extra(got["extra"])

    # ---- the API ----

    def start(self, load: Optional[Callable[[], Optional[int]]] = None) -> int:
        """Makes the process group, agrees with the other ranks and makes DDP;
        returns the steps done (the next step to run): a survivor's state's,
        copied, when other ranks kept theirs; else load()'s (a checkpoint's
        step, None for none) or 0. A round that ends meanwhile is waited
        for and joined as in reform()."""
        t0 = time.monotonic()
        self._trainer, self._trainer_ident = threading.get_native_id(), threading.get_ident()
        dist = self._dist
        done = -1
        loaded = False
        r: Optional[_Round] = None
        deadline = t0 + self._reform_timeout_s
        while True:
            try:
                if r is None and not self.enabled:
                    if not dist.is_initialized():
                        kw = {"timeout": self._timeout} if self._timeout is not None else {}
                        dist.init_process_group(self.backend, init_method="env://", **kw)
                        self._own_group = True
                    self.rank, self.world_size = dist.get_rank(), dist.get_world_size()
                elif r is None:
                    if dist.is_initialized():
                        raise Error(N.GPL_ERR_STATE, "gpulaunch: Elastic makes the process group itself "
                                    "(it must know its connections): create none before start()",
                                    "GPL_ERR_STATE")
                    self._native.make(self.rank)
                    self._make_group(os.environ.get("MASTER_ADDR", "127.0.0.1"), _env_int("MASTER_PORT", 29500))
                else:
                    self._join(r, deadline)
                step, root, survivors, copy, mine = self._agree(done)
                if copy:
                    if mine:
                        done = -1  # replaced: none, should the copy be cut off
                    self._copy_bracketed(root, mine)
                    done = step
                elif not loaded and done < 0:
                    got = load() if load is not None else None
                    loaded = True
                    done = got if got is not None else 0
                self._make_ddp(sync=not copy)
                self.last = Reformed(self.round, self.rank, -1, self.world_size, done, 0, root if copy else -1,
                                     survivors, copy, mine, time.monotonic() - t0, 0.0, "",
                                     self._via if copy else "", self._copy_s if copy else 0.0)
                if self.enabled:
                    progress(done)
                return done
            except self.round_errors:
                if not self._round_ended(time.monotonic() + self._round_end_wait_s):
                    raise
                r = self._after_end(deadline)

    def reform(self, step: int) -> int:
        """Call from the handler of a round_errors exception with the steps
        this rank completed (its optimizer stepped): waits for the next round,
        re-makes the process group and DDP, agrees and copies; returns the
        steps the job goes on after (the next step to run). Re-raises the
        error when the round did not end within round_end_wait_s."""
        t0 = time.monotonic()
        self._trainer, self._trainer_ident = threading.get_native_id(), threading.get_ident()
        err = sys.exc_info()[1]
        if not self.enabled:
            if err is not None:
                raise err
            raise Error(N.GPL_ERR_UNSUPPORTED, "gpulaunch: reform() without re-formation (not under "
                        "gpulaunch, or its launcher does not hand rounds over)", "GPL_ERR_UNSUPPORTED")
        deadline = t0 + self._reform_timeout_s
        if not self._round_ended(t0 + self._round_end_wait_s):
            if err is not None:
                raise err
            raise Error(N.GPL_ERR_STATE, f"gpulaunch: rank {self.rank}: reform() while round {self.round} "
                        "goes on", "GPL_ERR_STATE")
        with self._lock:
            over = self._latest
            broken = self._broken_at
        freed = max(0.0, t0 - broken) if broken else 0.0
        was = self.rank
        why = over.why if over is not None else ""
        r = self._after_end(deadline)
        have = step  # the steps this rank's state holds (-1: none)
        while True:
            try:
                self._join(r, deadline)
                agreed, root, survivors, copy, mine = self._agree(have)
                if copy:
                    if mine and not self._cut_copy_keeps_state:
                        have = -1  # replaced: none, should the copy be cut off
                    self._copy_bracketed(root, mine)
                if agreed < 0:
                    raise Error(N.GPL_ERR_STATE, f"gpulaunch: rank {self.rank}: no rank of round {self.round} "
                                "has the state (a copy was cut off); the launcher restarts the workers",
                                "GPL_ERR_STATE")
                have = agreed
                self._make_ddp(sync=False)
                self.last = Reformed(self.round, self.rank, was, self.world_size, agreed, max(0, step - agreed),
                                     root if copy else -1, survivors, copy, mine, time.monotonic() - t0,
                                     freed, why, self._via if copy else "", self._copy_s if copy else 0.0)
                progress(agreed)
                return agreed
            except self.round_errors as e:
                if isinstance(e, Error) and e.code in (N.GPL_ERR_ROUND_OVER, N.GPL_ERR_STATE):
                    raise  # a restart, or no state to go on from
                if not self._round_ended(time.monotonic() + self._round_end_wait_s):
                    raise
                r = self._after_end(deadline)

    @property
    def round_over(self) -> bool:
        """The launcher said that the round this rank runs in ended (the next
        collective raises one of round_errors; reform() is due)."""
        with self._lock:
            return self.enabled and self._moved_locked()

    def _round_ended(self, until: float) -> bool:
        """Whether the round block moved on from this group's round (waits
        until `until` for it)."""
        return self._wait_round(lambda r: _moved(r, self._formed_seq), until - time.monotonic()) is not None

    def _after_end(self, deadline: float) -> _Round:
        """The old group gone, the next round from the launcher."""
        self._teardown()
        return self._next_round(deadline)

    def _join(self, r: _Round, deadline: float) -> None:
        with self._lock:
            self._formed_seq = r.seq
        self.round = r.round
        self._adopt_env(r)
        if self._native.reform(r.round, deadline) > r.round:
            # round r ended while the communicator was made for it, which went
            # on to the next one: this group's round is over before it is made
            raise _RoundMoved(r.round)
        self._native.make(self.rank)
        self._make_group(r.master_addr, r.master_port)
        _beat()  # the watchdog judges this worker again once every local one took the round
        N.fn("gpl_round_ack")(r.round)

    def _copy_bracketed(self, root: int, mine: bool) -> None:
        begin, end = _wait_fns()  # a collective for the watchdog: waiting on peers
        begin()
        t0 = time.monotonic()
        try:
            self._copy(root, mine)
        finally:
            self._copy_s = time.monotonic() - t0
            end()

    def close(self) -> None:
        """Stops the watcher; the DDP and a process group made here are gone."""
        self._stop.set()
        if self._watcher is not None:
            self._watcher.join(timeout=2.0)
            self._watcher = None
        with self._lock:
            self._forming = False
            self._owned = None
        self.ddp = None
        self._destroy_group()
        self._parked.close()
        self._native.close()

    def __enter__(self) -> "Elastic":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _beat() -> None:
    """A sign of life for the launcher's watchdog without a new step."""
    begin, end = _wait_fns()
    begin()
    end()
