#!/usr/bin/env python3
"""fsdp_bench: what losing a node costs a sharded (HSDP) job, side by side in
one run: 3 nodes x 2 workers of examples/train_fsdp.py on this host
(--nnodes 2:3, HSDP: a node is one replica group, --model large: about
1.2 GB of parameters and AdamW state in all), one node killed (SIGKILL of its
launcher and workers) while the job waits for its rank 4 before step --at.
For each way of going on it prints the time from the kill to the survivors'
first step in the 4-rank world, the steps lost, and the bytes read from
storage:

  live      gpulaunch, train_fsdp.py --reform (ShardedElastic): the survivors
            keep their processes and take their shards from memory
  copies    FSDP over every rank (no replica) with --reform --mirror-every
            --at: the survivors go back to the copies in peers' memory
            (gpl_mirror) of step --at and reshard them in memory
  restart   gpulaunch without --reform: the launchers restart the workers,
            which restore the newest checkpoint (DCP, resharded)
  torchrun  torchrun --nnodes 2:3 (c10d rendezvous): its agents restart the
            workers, which restore the same way

    python3 test/bench/fsdp_bench.py --build build [--python PY] [--model large]
        [--at 4] [--steps 6] [--ways live,copies,restart,torchrun]
    python3 test/bench/fsdp_bench.py --build build --overhead K [--steps 8]

--overhead K: no kill; the same FSDP job for --steps steps with copies every
K steps and without, side by side: the training time each took, the extra
time per push, and what that is at K = 50 (the loop's stall and the push's
time and rate to its buddy, from train_fsdp's summary).

PY is an interpreter with torch >= 2.6 (FSDP2); torchrun is PY -m
torch.distributed.run. A checkpoint is written every --at steps, so the
restarts lose no step either: what they pay is the restart and the read.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Optional

REPO = Path(__file__).resolve().parents[2]
TRAIN = REPO / "examples" / "train_fsdp.py"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Node:
    """A process in its own session, its output lines kept with their time."""

    def __init__(self, name: str, cmd: list[str], env: dict[str, str]) -> None:
        self.name = name
        self.lines: list[tuple[float, str]] = []
        self.lock = threading.Lock()
        self.p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env,
                                  start_new_session=True)
        self.t = threading.Thread(target=self._read, daemon=True)
        self.t.start()

    def _read(self) -> None:
        assert self.p.stdout is not None
        for ln in self.p.stdout:
            with self.lock:
                self.lines.append((time.monotonic(), re.sub(r"^\[\w+?\d+\]:", "", ln.rstrip("\n"))))

    def find(self, pattern: str) -> list[tuple[float, re.Match[str]]]:
        with self.lock:
            return [(t, m) for t, ln in self.lines for m in [re.search(pattern, ln)] if m]

    def kill(self, sig: int = signal.SIGKILL) -> None:
        try:
            os.killpg(self.p.pid, sig)
        except ProcessLookupError:
            pass


def wait_for(nodes: list[Node], pattern: str, count: int, timeout: float) -> list[tuple[float, re.Match[str]]]:
    until = time.monotonic() + timeout
    while True:
        got = [x for n in nodes for x in n.find(pattern)]
        if len(got) >= count:
            return got
        if time.monotonic() > until:
            dump = "\n".join(f"--- {n.name}\n" + "\n".join(ln for _, ln in n.lines[-30:]) for n in nodes)
            raise SystemExit(f"fsdp_bench: {count} x {pattern!r} not seen within {timeout:.0f} s\n{dump}")
        time.sleep(0.05)


def dir_bytes(d: Path) -> int:
    return sum(f.stat().st_size for f in d.rglob("*") if f.is_file())


def run_way(way: str, a: argparse.Namespace, env: dict[str, str]) -> dict[str, object]:
    tmp = Path(tempfile.mkdtemp(prefix="fsdp-bench-"))
    ck = tmp / "ck"
    port = free_port()
    mode = ["--mode", "fsdp", "--mirror-every", str(a.at)] if way == "copies" else ["--mode", "hsdp", "--shard", "2"]
    prog = [*mode, "--model", a.model, "--global-batch", "12",
            "--steps", str(a.steps), "--print-every", "1", "--checkpoint-dir", str(ck),
            "--checkpoint-every", str(a.at), "--hold", f"4:{a.at}"]
    procs: list[Node] = []
    rdzv: Optional[Node] = None
    try:
        if way == "torchrun":
            cmds = [[a.python, "-m", "torch.distributed.run", "--nnodes", "2:3", "--nproc-per-node", "2",
                     "--rdzv-backend", "c10d", "--rdzv-endpoint", f"127.0.0.1:{port}", "--rdzv-id", "bench",
                     "--max-restarts", "3", str(TRAIN), *prog] for _ in range(3)]
        else:
            rdzv = Node("rdzv", [str(a.build / "rendezvous" / "gpulaunch-rdzv"), "--listen", f"127.0.0.1:{port}"],
                        env)
            time.sleep(0.5)
            extra = ["--reform"] if way in ("live", "copies") else []
            cmds = [[str(a.build / "launcher" / "gpulaunch"), "--nnodes", "2:3", "--nproc-per-node", "2",
                     "--rdzv-backend", "gpulaunch", "--rdzv-endpoint", f"127.0.0.1:{port}", "--rdzv-id", "bench",
                     "--rdzv-conf", "last_call_timeout=1,heartbeat_timeout=3", "--max-restarts", "3",
                     "--no-python", a.python, str(TRAIN), *prog, *extra] for _ in range(3)]
        for i, c in enumerate(cmds):
            procs.append(Node(f"node{i}", c, env))
            if way == "torchrun" and i == 0:
                time.sleep(2.0)  # the first agent hosts the c10d store
        t_start = time.monotonic()
        wait_for(procs, rf"^rank 4 holding before step {a.at}$", 1, a.timeout)
        held = next(n for n in procs if n.find(rf"^rank 4 holding before step {a.at}$"))
        if way == "torchrun" and held is procs[0]:
            raise SystemExit("fsdp_bench: rank 4 landed on the node hosting torchrun's store; run again")
        until = time.monotonic() + 120
        while not list(ck.glob(f"step-{a.at:012d}/COMPLETE")):
            if time.monotonic() > until:
                raise SystemExit(f"fsdp_bench: {way}: the checkpoint of step {a.at} did not complete")
            time.sleep(0.05)
        ck_bytes = dir_bytes(ck / f"step-{a.at:012d}")
        state = [m[1] for n in procs for _, m in n.find(r"^train_fsdp: (\d+ parameters, .*)$")]
        t_kill = time.monotonic()
        held.kill()
        survivors = [n for n in procs if n is not held]
        first = wait_for(survivors, r"^first step in a world of 4: step (\d+)$", 1, a.timeout)
        t_first, fm = min(first, key=lambda x: x[0])
        for n in survivors:
            try:
                n.p.wait(timeout=a.timeout)
            except subprocess.TimeoutExpired:
                n.kill()
        # one step's time in the new world: between rank 0's prints of its 2nd and 3rd steps there
        done_at = sorted(t for n in survivors for t, m in n.find(r"^step (\d+) loss ") if t > t_first)
        step_s = done_at[1] - done_at[0] if len(done_at) >= 2 else float("nan")
        loaded = any(n.find("loaded into") for n in survivors)
        reform = [f"{float(m[1]):.0f} (copy {float(m[2]):.0f}, build {float(m[3]):.0f})" for n in survivors
                  for _, m in n.find(r"re-formed in place, .* in ([\d.]+) ms \(the copy ([\d.]+) ms, the build "
                                     r"([\d.]+) ms\)")]
        return {"way": way, "told_to_first_s": t_first - t_kill, "first_step": int(fm[1]),
                "lost": a.at - int(fm[1]), "read": ck_bytes if loaded else 0, "reform_ms": reform,
                "startup_s": t_kill - t_start, "step_s": step_s, "state": state[0] if state else "?"}
    finally:
        for n in procs:
            n.kill()
        if rdzv is not None:
            rdzv.kill()
        if a.logs:  # every process's output, for a run that went wrong
            a.logs.mkdir(parents=True, exist_ok=True)
            for n in [*procs, *([rdzv] if rdzv else [])]:
                with n.lock:
                    text = "".join(f"{t:.3f} {line.rstrip()}\n" for t, line in n.lines)
                (a.logs / f"{way}-{n.name}.log").write_text(text)
        for n in [*procs, *([rdzv] if rdzv else [])]:
            try:
                n.p.wait(timeout=10)
            except subprocess.TimeoutExpired:
                pass
        shutil.rmtree(tmp, ignore_errors=True)


def run_steady(a: argparse.Namespace, env: dict[str, str], every: int) -> tuple[float, list[str]]:
    """The FSDP job without a fault, copies every `every` steps (0: none): its
    training time (rank 0's "N steps in T s") and the mirror summaries."""
    port = free_port()
    rdzv = Node("rdzv", [str(a.build / "rendezvous" / "gpulaunch-rdzv"), "--listen", f"127.0.0.1:{port}"], env)
    time.sleep(0.5)
    prog = ["--mode", "fsdp", "--model", a.model, "--global-batch", "12", "--steps", str(a.steps),
            "--reform", "--mirror-every", str(every)]
    procs = [Node(f"node{i}", [str(a.build / "launcher" / "gpulaunch"), "--nnodes", "3", "--nproc-per-node", "2",
                               "--rdzv-backend", "gpulaunch", "--rdzv-endpoint", f"127.0.0.1:{port}",
                               "--rdzv-id", "bench", "--no-python", a.python, str(TRAIN), *prog], env)
             for i in range(3)]
    try:
        for n in procs:
            n.p.wait(timeout=a.timeout)
        took = [float(m[1]) for n in procs for _, m in n.find(r"^train_fsdp: \d+ steps in ([\d.]+) s")]
        summary = [m[0] for n in procs for _, m in n.find(r"^rank \d+ mirror: .*$")]
        return (took[0] if took else float("nan")), summary
    finally:
        for n in [*procs, rdzv]:
            n.kill()
            try:
                n.p.wait(timeout=10)
            except subprocess.TimeoutExpired:
                pass


def loopback_mbs(nbytes: int) -> float:
    """One TCP stream of nbytes over loopback, MB/s: what a push's socket
    could move on this machine (the push also hashes on both ends)."""
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(1)
    got = [0]

    def sink() -> None:
        c, _ = srv.accept()
        while True:
            b = c.recv(1 << 20)
            if not b:
                break
            got[0] += len(b)
        c.close()

    th = threading.Thread(target=sink)
    th.start()
    buf = b"\0" * (4 << 20)
    t0 = time.monotonic()
    with socket.create_connection(srv.getsockname()) as c:
        left = nbytes
        while left > 0:
            k = min(left, len(buf))
            c.sendall(buf[:k])
            left -= k
    th.join()
    took = time.monotonic() - t0
    srv.close()
    return got[0] / 1e6 / took


def overhead(a: argparse.Namespace, env: dict[str, str]) -> int:
    base, _ = run_steady(a, env, 0)
    withc, summary = run_steady(a, env, a.overhead)
    pushes = a.steps // a.overhead + 1  # every K steps, and the first call of the round
    per_push = (withc - base) / pushes
    step = base / a.steps
    for line in sorted(summary):
        print(f"fsdp_bench: {line}")
    sizes = [float(m[1]) for line in summary for m in [re.search(r"snapshot ([\d.]+) MB", line)] if m]
    if sizes:
        print(f"fsdp_bench: one loopback TCP stream of {max(sizes):.0f} MB in the same run: "
              f"{loopback_mbs(int(max(sizes) * 1e6)):.0f} MB/s")
    print(f"fsdp_bench: {a.steps} steps: {base:.2f} s without copies, {withc:.2f} s with copies every "
          f"{a.overhead} ({pushes} pushes): {per_push:+.3f} s a push against a step of {step:.2f} s; "
          f"at K = 50: {100.0 * per_push / (50 * step):+.2f} % of the training time")
    return 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    ap.add_argument("--build", type=Path, required=True)
    ap.add_argument("--python", default=sys.executable)
    ap.add_argument("--model", default="large")
    ap.add_argument("--at", type=int, default=4, help="the step the node is killed before (default 4)")
    ap.add_argument("--steps", type=int, default=7)
    ap.add_argument("--ways", default="live,restart,torchrun")
    ap.add_argument("--timeout", type=float, default=600.0)
    ap.add_argument("--overhead", type=int, default=0, help="copies every K steps against none, no kill")
    ap.add_argument("--logs", type=Path, default=None, help="write each process's output here")
    a = ap.parse_args()
    a.build = a.build.resolve()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("GPULAUNCH_", "PET_", "TORCH"))}
    env.update(PYTHONPATH=str(REPO / "python"), GPULAUNCH_LIBRARY=str(a.build / "runtime" / "libgpulaunch.so.0"),
               PET_SHM_MIN="16m", PET_PREEMPTION_SOURCE="none", PET_SLURM="off", PYTHONUNBUFFERED="1",
               OMP_NUM_THREADS="1")
    if a.overhead > 0:
        return overhead(a, env)
    rows = []
    for way in a.ways.split(","):
        r = run_way(way, a, env)
        rows.append(r)
        print(f"fsdp_bench: {way}: {r['state']}; started in {r['startup_s']:.1f} s", flush=True)
        print(f"fsdp_bench: {way}: first step in the 4-rank world {r['told_to_first_s']:.2f} s after the kill "
              f"(a step takes {r['step_s']:.2f} s there), "
              f"{r['lost']} steps lost, {int(r['read']) / 1e6:.0f} MB read from storage"
              + (f", re-formation {'; '.join(r['reform_ms'])} ms"  # type: ignore[arg-type]
                 if r["reform_ms"] else ""), flush=True)
    print(f"\n{'way':10} {'kill -> first step (s)':>24} {'of which the step (s)':>22} {'steps lost':>11} "
          f"{'read (MB)':>10}")
    for r in rows:
        print(f"{r['way']:10} {r['told_to_first_s']:>24.2f} {r['step_s']:>22.2f} {r['lost']:>11} "  # type: ignore[call-overload]
              f"{int(r['read']) / 1e6:>10.0f}")  # type: ignore[call-overload]
    return 0


if __name__ == "__main__":
    sys.exit(main())
