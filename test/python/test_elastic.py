"""Live re-formation of a PyTorch DDP job (gpulaunch.Elastic, train_ddp.py
--reform): a gpulaunch-rdzv server and three launchers of two workers each
(--nnodes 2:3) on this host. A node is lost (SIGKILL) or vanishes (SIGSTOP:
its sockets stay open) while rank 4 holds before step 10, so that the step
the survivors go on from is known; the survivors keep their processes, lose
no step and end with equal parameters, equal to those of a run restarted from
the checkpoint of that step into the same world. A late node, started while
rank 0 holds before step 20, has its ranks copy the state from the
survivors; a rank that cannot re-form is restarted by its launcher and the
job still finishes. A node that does not finish has every worker print its
stacks before it is killed."""

from __future__ import annotations

import importlib.util
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Iterator, Optional

import pytest

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
BUILD = Path(os.environ.get("GPULAUNCH_BUILD_DIR", REPO / "build" / "test"))
LIB = os.environ.get("GPULAUNCH_LIBRARY") or str(BUILD / "runtime" / "libgpulaunch.so.0")
LAUNCHER = BUILD / "launcher" / "gpulaunch"
RDZV = BUILD / "rendezvous" / "gpulaunch-rdzv"
TRAIN = REPO / "examples" / "train_ddp.py"
PY = sys.executable
sys.path.insert(0, str(HERE))
import jobpage  # noqa: E402

HOLD = 10  # rank 4 holds before this step: the fault comes there

pytestmark = pytest.mark.skipif(importlib.util.find_spec("torch") is None,
                                reason=f"torch is not installed for {PY}")


# With a second interpreter (today's torch) in the suite, it runs every case;
# the first (Debian's torch) runs the node-killed one and the torch-independent
# ones, so that the suite's two runs of the same minutes do not double its time.
ON_TODAYS_TORCH_TOO = bool(os.environ.get("GPULAUNCH_TEST_TORCH2_RUNS_ELASTIC"))
once = pytest.mark.skipif(ON_TODAYS_TORCH_TOO, reason="run under today's torch only (python_elastic_torch2); "
                          "this interpreter runs the node-killed case")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def child_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("GPULAUNCH_", "PET_", "TORCH"))}
    for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"):
        env.pop(k, None)
    env.update(PYTHONPATH=os.pathsep.join(filter(None, [str(REPO / "python"), os.environ.get("PYTHONPATH")])),
               GPULAUNCH_LIBRARY=LIB, PET_SHM_MIN="16m", PET_PREEMPTION_SOURCE="none", PET_SLURM="off",
               PYTHONUNBUFFERED="1", OMP_NUM_THREADS="1")
    return env


class Proc:
    """A process in its own session (a node: its launcher and workers, killed
    or stopped together) whose output lines are kept with their arrival time."""

    def __init__(self, job: "Job", name: str, cmd: list[str]) -> None:
        self.job = job
        self.name = name
        self.lines: list[tuple[float, str]] = []
        self._cv = threading.Condition()
        self.p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                  env=child_env(), start_new_session=True)
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.p.stdout is not None
        for ln in self.p.stdout:
            with self._cv:
                self.lines.append((time.monotonic(), re.sub(r"^\[\w+?\d+\]:", "", ln.rstrip("\n"))))
                self._cv.notify_all()
        with self._cv:
            self._cv.notify_all()

    def find(self, pattern: str) -> list[tuple[float, re.Match[str]]]:
        with self._cv:
            return [(t, m) for t, ln in self.lines for m in [re.search(pattern, ln)] if m]

    def text(self) -> str:
        with self._cv:
            return "\n".join(ln for _, ln in self.lines)

    def signal(self, sig: int) -> None:
        try:
            os.killpg(self.p.pid, sig)
        except ProcessLookupError:
            pass

    def wait(self, timeout: float) -> int:
        try:
            rc = self.p.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.job.stacks()
            self.signal(signal.SIGKILL)
            self.p.wait()
            raise AssertionError(f"{self.name} still ran after {timeout:.0f} s:\n{self.job.dump()}") from None
        self._reader.join(timeout=10)
        return rc


class Job:
    """A rendezvous server and the launchers of one job."""

    def __init__(self, tmp: Path) -> None:
        self.tmp = tmp
        self.port, self.http = free_port(), free_port()
        self.procs: list[Proc] = []
        self.rdzv = self.start("rdzv", [str(RDZV), "--listen", f"127.0.0.1:{self.port}",
                                        "--http", f"127.0.0.1:{self.http}"])
        until = time.monotonic() + 10
        while True:  # listening?
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=1).close()
                break
            except OSError:
                if time.monotonic() > until:
                    raise
                time.sleep(0.05)

    def start(self, name: str, cmd: list[str]) -> Proc:
        p = Proc(self, name, cmd)
        self.procs.append(p)
        return p

    def node(self, name: str, *args: str, program: Path = TRAIN, nnodes: str = "2:3", nproc: int = 2) -> Proc:
        return self.start(name, [
            str(LAUNCHER), "--nnodes", nnodes, "--nproc-per-node", str(nproc), "--rdzv-backend", "gpulaunch",
            "--rdzv-endpoint", f"127.0.0.1:{self.port}", "--rdzv-id", "elastic",
            "--rdzv-conf", "last_call_timeout=1,heartbeat_timeout=3", "--max-restarts", "3",
            "--no-python", PY, str(program), "--reform", *args])

    def close(self) -> None:
        for p in self.procs:
            if p.p.poll() is None:
                p.signal(signal.SIGKILL)
                p.p.wait()

    def stacks(self) -> None:
        """Every worker still there prints its threads' stacks (the signal the
        launcher gives faulthandler), to be seen in the dump."""
        for p in self.procs:
            for pid in pids(p):
                try:
                    os.kill(pid, signal.SIGRTMIN + 3)
                except ProcessLookupError:
                    pass
        time.sleep(1.0)

    def dump(self) -> str:
        return "\n".join(f"--- {p.name} (exit {p.p.poll()})\n{p.text()}" for p in self.procs)


@pytest.fixture
def job(tmp_path: Path) -> Iterator[Job]:
    for p in (LAUNCHER, RDZV, Path(LIB)):
        if not p.exists():
            pytest.fail(f"{p} is missing: build the project first (cmake --build {BUILD})")
    j = Job(tmp_path)
    try:
        yield j
    finally:
        j.close()


def checkpoint_whole(job: Job, ck: Path, step: int, copy_to: Optional[Path] = None) -> None:
    """Waits (30 s at most) until step's checkpoint in ck is whole (COMPLETE,
    written last); then copies ck to copy_to when given (a restart replay's
    start)."""
    until = time.monotonic() + 30
    while not (ck / f"step-{step:012d}" / "COMPLETE").exists():
        assert time.monotonic() < until, f"step {step}'s checkpoint not whole in 30 s:\n{job.dump()}"
        time.sleep(0.05)
    if copy_to is not None:
        shutil.copytree(ck, copy_to)


def wait_for(job: Job, nodes: list[Proc], pattern: str, count: int, timeout: float) -> list[tuple[float, Proc]]:
    """(arrival time, node) of the first `count` lines matching pattern."""
    until = time.monotonic() + timeout
    while True:
        seen = sorted((t, p) for p in nodes for t, _ in p.find(pattern))  # type: ignore[misc]
        if len(seen) >= count:
            return seen[:count]
        if time.monotonic() > until or all(p.p.poll() is not None for p in nodes):
            raise AssertionError(f"{count} x {pattern!r} not seen within {timeout:.0f} s:\n{job.dump()}")
        time.sleep(0.05)


def three_nodes(job: Job, *args: str) -> tuple[list[Proc], Proc]:
    """Three nodes started; the one whose rank 4 holds before step HOLD. Every
    rank's steps before HOLD are done (a rank can still be finishing the
    all-reduce of step HOLD - 1 when rank 4 holds: a fault then cuts it)."""
    nodes = [job.node(f"node{i}", "--hold", f"4:{HOLD}", *args) for i in range(3)]
    (_, held), = wait_for(job, nodes, rf"^rank 4 holding before step {HOLD}$", 1, 120)
    wait_for(job, nodes, rf"^rank \d+ reached step {HOLD}$", 6, 60)
    return nodes, held


def kill_held(job: Job, nodes: list[Proc], held: Proc) -> tuple[list[Proc], float]:
    """The held node SIGKILLed; the survivors run to their end without
    restarting a worker. Returns them and the seconds from the kill to the
    first step in the 4-rank world."""
    survivors = [p for p in nodes if p is not held]
    before = {p.name: pids(p) for p in survivors}
    t_kill = time.monotonic()
    held.signal(signal.SIGKILL)
    for p in survivors:
        assert p.wait(120) == 0, job.dump()
    held.wait(10)
    took = first_step_after(job, survivors, 4, t_kill)
    for p in survivors:
        assert pids(p) == before[p.name] and len(before[p.name]) == 2, f"{p.name} restarted a worker:\n{job.dump()}"
    return survivors, took


def pids(p: Proc) -> set[int]:
    return {int(m[1]) for _, m in p.find(r"^rank \d+ pid (\d+) round \d+$")}


def shas(nodes: list[Proc]) -> dict[int, str]:
    out = {int(m[1]): m[2] for p in nodes for _, m in p.find(r"^rank (\d+) params_sha256 ([0-9a-f]{64})$")}
    return out


def reformed(nodes: list[Proc]) -> list[re.Match[str]]:
    pat = (r"^rank (?P<rank>\d+) \(was (?P<was>\d+)\): round (?P<round>\d+) re-formed in place, world "
           r"(?P<world>\d+), going on after step (?P<step>\d+) \((?P<lost>\d+) lost\)"
           r"(?:, state copied from rank (?P<root>\d+))? in (?P<ms>[\d.]+) ms$")
    return [m for p in nodes for _, m in p.find(pat)]


def first_step_after(job: Job, nodes: list[Proc], world: int, t0: float) -> float:
    """Seconds from t0 to rank 0's first step in a world of `world` after it."""
    pattern = rf"^first step in a world of {world}: step \d+$"
    until = time.monotonic() + 60
    while True:
        ts = [t for p in nodes for t, _ in p.find(pattern) if t > t0]
        if ts:
            return min(ts) - t0
        if time.monotonic() > until or all(p.p.poll() is not None for p in nodes):
            raise AssertionError(f"no first step in a world of {world}:\n{job.dump()}")
        time.sleep(0.05)


def report(what: str) -> None:
    print(f"test_elastic ({PY}): {what}")


def test_node_killed_survivors_go_on_as_a_restart_would(job: Job, tmp_path: Path) -> None:
    """(a) a node's launcher and workers SIGKILLed while the job waits for its
    rank 4; (d) the survivors' parameters equal those of 4 new ranks resumed
    from the checkpoint of the same step."""
    ck, ck_copy = tmp_path / "ck", tmp_path / "ck-at-fault"
    args = ("--steps", "30", "--checkpoint-dir", str(ck), "--checkpoint-every", str(HOLD), "--print-every", "5")
    nodes, held = three_nodes(job, *args)
    checkpoint_whole(job, ck, HOLD, ck_copy)
    survivors, took = kill_held(job, nodes, held)
    got = reformed(survivors)
    assert len(got) == 4, job.dump()
    for m in got:
        assert (m["world"], m["step"], m["lost"], m["root"]) == ("4", str(HOLD), "0", None), m.group(0)
    sha = shas(survivors)
    assert sorted(sha) == [0, 1, 2, 3] and len(set(sha.values())) == 1, job.dump()
    written = sorted(int(p.name[5:]) for p in ck.glob("step-*"))
    assert written == [HOLD, 2 * HOLD, 3 * HOLD], f"checkpoints after the re-formation: {written}"

    # the same world restarted from the checkpoint of the fault's step
    restart = job.start("restart", [
        str(LAUNCHER), "--standalone", "--nproc-per-node", "4", "--no-python", PY, str(TRAIN), *args[:2],
        "--checkpoint-dir", str(ck_copy), "--checkpoint-every", str(HOLD), "--print-every", "5"])
    assert restart.wait(120) == 0, job.dump()
    assert restart.find(rf"^resumed from the checkpoint of step {HOLD}$"), restart.text()
    again = shas([restart])
    assert sorted(again) == [0, 1, 2, 3] and set(again.values()) == set(sha.values()), \
        f"live re-formation and restart differ:\n{job.dump()}"
    report(f"node killed: first step in the 4-rank world {took:.2f} s after SIGKILL; re-formation "
           f"{', '.join(m['ms'] for m in got)} ms")


@once
def test_node_vanishes_then_a_new_node_copies_the_state(job: Job) -> None:
    """(b) a node SIGSTOPped (its sockets stay open): the survivors blocked in
    DDP's all-reduce are freed when their launchers hear of it, within 0.5 s,
    and re-form; (c) a new node joins while rank 0 holds before step 2 x HOLD:
    its ranks copy the state from the survivors, nothing read from a
    checkpoint."""
    args = ("--steps", "40", "--print-every", "20")
    nodes, held = three_nodes(job, "--hold", f"0:{2 * HOLD}", *args)
    survivors = [p for p in nodes if p is not held]
    before = {p.name: pids(p) for p in survivors}
    t_stop = time.monotonic()
    held.signal(signal.SIGSTOP)
    wait_for(job, survivors, r"re-formed in place, world 4", 4, 60)
    took = first_step_after(job, survivors, 4, t_stop)
    wait_for(job, survivors, rf"^rank 0 holding before step {2 * HOLD}$", 1, 60)
    held.signal(signal.SIGKILL)
    held.wait(10)
    freed = [float(m[1]) for p in survivors for _, m in p.find(r"^rank \d+: freed (\d+) ms after")]
    # a rank whose collective raised before the watcher shut the sockets (it was
    # between collectives) says nothing: every one that was blocked was freed
    assert freed and max(freed) < 500, job.dump()
    late = job.node("late", *args)
    t_late = time.monotonic()
    for p in survivors + [late]:
        assert p.wait(120) == 0, job.dump()
    for p in survivors:
        assert pids(p) == before[p.name] and len(before[p.name]) == 2, f"{p.name} restarted a worker:\n{job.dump()}"
    got = reformed(survivors)
    assert sorted(m["world"] for m in got) == ["4"] * 4 + ["6"] * 4, job.dump()
    for m in got:
        if m["world"] == "4":
            assert (m["step"], m["lost"], m["root"]) == (str(HOLD), "0", None), m.group(0)
        else:
            assert (m["step"], m["lost"]) == (str(2 * HOLD), "0") and m["root"] is not None, m.group(0)
    joined = late.find(rf"^rank (\d+): joined round \d+ with 4 ranks that kept their state: step {2 * HOLD} "
                       r"copied from rank (\d+), nothing read from the checkpoint$")
    assert len(joined) == 2, job.dump()
    # the host tensors went through libgpulaunch's copy (its own communicator: no Checkpointer here)
    assert len(late.find(r"^rank \d+: joined in [\d.]+ ms, \d+ bytes of state copied \(via gpulaunch; the copy [\d.]+ ms\)$")) == 2, \
        job.dump()
    sha = shas(survivors + [late])
    assert sorted(sha) == list(range(6)) and len(set(sha.values())) == 1, job.dump()
    samples = {m[1] for p in survivors + [late] for _, m in p.find(r"^rank \d+ samples_seen (\d+)$")}
    assert len(samples) == 1, f"the copied extra state differs: {samples}\n{job.dump()}"
    grown = first_step_after(job, survivors + [late], 6, t_late)
    # a warm join: the new node started its workers before the round took it
    # in, so the survivors stopped only to re-form and copy, not for its start
    assert late.find(r"starting the 2 workers before this node joins"), job.dump()
    (t_ready, _), = late.find(r"the 2 workers started in \d+ ms and wait for their first round")
    t_over = min(t for p in survivors for t, _ in p.find(r"round \d+ is over: node .* started its workers"))
    # (both are the times this test read the lines, from two pipes: a reader
    # thread scheduled late shifts one by milliseconds; a cold join's workers
    # need seconds to wait)
    assert t_over >= t_ready - 0.2, f"the survivors stopped before the new workers waited:\n{job.dump()}"
    paused = first_step_after(job, survivors + [late], 6, t_over)
    assert "restarting workers" not in late.text(), job.dump()
    report(f"node vanished: freed {max(freed):.0f} ms after the launchers heard of it, first step in "
           f"the 4-rank world {took:.2f} s after SIGSTOP (heartbeat timeout 3 s); new node: first step "
           f"in the 6-rank world {grown:.2f} s after its launcher started, {paused:.2f} s after the "
           f"survivors' round ended (its workers started {t_ready - t_late:.2f} s before)")


@once
def test_rank_that_cannot_reform_is_restarted(job: Job, tmp_path: Path) -> None:
    """(e) rank 0 exits instead of re-forming: its launcher falls back to a
    restart of its workers, the other surviving node's workers go on in place
    (they were making the next round's group with rank 0: freed, they join
    the round after), and the restarted ones copy the state from them. The
    job tells it (rank 0 holds before step 3 x HOLD meanwhile): the
    launcher's line, /status, /metrics and the job page in Chromium say one
    node restarted because re-forming in place failed, the other re-formed
    in place, the state came from peers, and the page fits 1280 px."""
    release = tmp_path / "release"
    nodes, held = three_nodes(job, "--steps", "40", "--reform-fail-rank", "0", "--hold", f"0:{3 * HOLD}",
                              "--release-file", str(release))
    survivors = [p for p in nodes if p is not held]
    failing: Optional[Proc] = next((p for p in survivors if p.find(r"^rank 0 pid \d+ round")), None)
    assert failing is not None, job.dump()
    other = next(p for p in survivors if p is not failing)
    before = pids(other)
    held.signal(signal.SIGKILL)
    wait_for(job, survivors, rf"^rank 0 holding before step {3 * HOLD}$", 1, 120)
    try:
        job_tells_a_fallback(job, tmp_path, failing, other)
    finally:
        release.touch()
    for p in survivors:
        assert p.wait(120) == 0, job.dump()
    held.wait(10)
    out = failing.text()
    assert "re-forming in place failed" in out and "exiting instead of re-forming" in out, job.dump()
    assert "restarting workers (1/3)" in out, job.dump()
    assert pids(other) == before, f"the node that could re-form restarted a worker:\n{job.dump()}"
    joined = failing.find(r"^rank (\d+): joined round \d+ with 2 ranks that kept their state: "
                          rf"step {HOLD} copied from rank \d+, nothing read from the checkpoint$")
    assert len(joined) == 2, job.dump()
    sha = shas(survivors)
    assert sorted(sha) == [0, 1, 2, 3] and len(set(sha.values())) == 1, job.dump()


def job_tells_a_fallback(job: Job, tmp: Path, failing: Proc, other: Proc) -> None:
    """The story of test_rank_that_cannot_reform_is_restarted while it holds."""
    hits = failing.find(r"round \d+ began: restarted the workers \((re-forming in place failed: [^)]*)")
    assert len(hits) == 1, job.dump()
    m = hits[0][1]
    assert other.find(r"round \d+ began: re-formed in place \(the workers kept\); paused [\d.]+ s"), job.dump()
    time.sleep(0.3)  # the last STORY on its way
    st = jobpage.status(job.http, "elastic")
    cost = st["membership_cost"]
    assert cost["restart"] == 1 and cost["restart_reasons"] == {"reform_failed": 1}, cost
    assert cost["in_place"] >= 1 and cost["bytes_from_peers"] > 0, cost
    told = [n for r in st["rounds"] for n in r.get("story", {}).get("nodes", [])]
    restarted = [n for n in told if n["kind"] == "restart"]
    assert len(restarted) == 1 and restarted[0]["reason"] == "reform_failed", told
    assert restarted[0]["state"] == "peer" and restarted[0]["state_bytes"] > 0 and \
        restarted[0]["state_root"] >= 0 and restarted[0]["ranks"] == 2, told
    assert any(n["kind"] == "in_place" and "state" not in n for n in told), told
    began = [e["text"] for e in st["events"] if e["kind"] == "began"]
    assert any("1 restarted (1 reform_failed)" in t for t in began), st["events"]
    text = jobpage.get(job.http, "/metrics")
    assert jobpage.metric(text, 'gpulaunch_job_restarts_total{job="elastic",reason="reform_failed"}') == 1
    assert jobpage.metric(text, 'gpulaunch_job_restarts_total{job="elastic",reason="worker_failed"}') == 0
    assert jobpage.metric(text, 'gpulaunch_job_node_rounds_total{job="elastic",kind="restart"}') == 1
    if jobpage.chromium() is None:
        report("chromium is not installed (scripts/deps.sh): the job page is not checked")
        return
    dom = jobpage.dom(tmp, job.http, "elastic")
    assert '<b id="cost-restart">1</b>' in dom and "1 × re-forming in place failed" in dom, dom
    assert re.search(r"<td>restart(, in place)? \([^<]*re-forming in place failed", dom), dom  # the rounds table
    assert "<td>peers (" in dom, dom
    assert "<td>restart (re-forming in place failed)</td>" in dom and " from rank " in dom, dom
    sw, cw, drawn = jobpage.width_1280(tmp, job.http, "elastic", "cost-restart")
    assert cw > 1200 and sw <= cw and drawn, f"the page scrolls sideways at 1280 px ({sw} px in {cw}, drawn {drawn})"
    report(f"a fallback told: {m[1][:120]}; on the page and /metrics as reform_failed")


@once
def test_an_all_reduce_that_never_returns_is_freed_by_the_rounds_end(job: Job) -> None:
    """A Gloo all-reduce can outlive the shutdown of its connections (one cut
    off mid-way: a peer's data for a buffer already freed stops that
    connection's reading for good). Rank 2's all-reduce of step HOLD never
    returns; the node holding rank 4 is killed: DDP's step on rank 2 is freed
    when the round ends all the same, and every survivor re-forms in place
    (before, rank 2 stayed blocked, exited after 5 s and its node restarted)."""
    nodes, held = three_nodes(job, "--steps", "30", "--print-every", "10", "--stall", f"2:{HOLD}")
    wait_for(job, nodes, rf"^rank 2 stalling an all-reduce of step {HOLD}$", 1, 60)
    survivors, took = kill_held(job, nodes, held)
    for p in survivors:
        assert not p.find(r"still blocked"), job.dump()
    got = reformed(survivors)
    assert sorted(int(m["rank"]) for m in got) == [0, 1, 2, 3], job.dump()
    for m in got:
        assert (m["world"], m["step"], m["lost"], m["root"]) == ("4", str(HOLD), "0", None), m.group(0)
    freed = [p for p in survivors if p.find(r"^gpulaunch: rank 2: 1 collective\(s\) had not ended 2 s after "
                                            r"round 1 ended")]
    assert len(freed) == 1, job.dump()
    sha = shas(survivors)
    assert sorted(sha) == [0, 1, 2, 3] and len(set(sha.values())) == 1, job.dump()
    report(f"an all-reduce that never returns: first step in the 4-rank world {took:.2f} s after SIGKILL")


def test_without_round_handover_it_trains_as_without(job: Job) -> None:
    """A launcher whose progress channel is off cannot hand rounds over:
    --reform says so and the job trains as it would without (same parameters)."""
    off = ("--progress-timeout", "0", "--stats-interval", "0")
    runs = [job.start(name, [str(LAUNCHER), "--standalone", "--nproc-per-node", "2", *off, "--no-python", PY,
                             str(TRAIN), "--steps", "10", *extra])
            for name, extra in (("reform", ("--reform",)), ("plain", ()))]
    for p in runs:
        assert p.wait(120) == 0, job.dump()
    assert runs[0].find(r"--reform: not under a gpulaunch that hands rounds over"), job.dump()
    got = [shas([p]) for p in runs]
    assert sorted(got[0]) == [0, 1] and got[0] == got[1], job.dump()


@once
def test_preemption_saves_the_same_step_and_the_survivors_go_on(job: Job, tmp_path: Path) -> None:
    """(f) SIGTERM to one node's launcher (a pod deleted, a spot notice): every
    rank saves the same step, that node's workers stop (exit 143), and the
    survivors go on: same processes, re-formed in place once it has left, no
    step lost."""
    ck = tmp_path / "ck"
    args = ("--steps", "80", "--step-sleep-ms", "40", "--print-every", "20",
            "--checkpoint-dir", str(ck), "--checkpoint-every", "100000")
    nodes = [job.node(f"node{i}", *args) for i in range(3)]
    wait_for(job, nodes, r"^first step in a world of 6: step \d+$", 1, 120)
    gone = next(p for p in nodes if not p.find(r"^rank 0 pid \d+ round"))
    survivors = [p for p in nodes if p is not gone]
    before = {p.name: pids(p) for p in survivors}
    time.sleep(0.5)
    t_term = time.monotonic()
    os.kill(gone.p.pid, signal.SIGTERM)  # the launcher alone, as Kubernetes does
    assert gone.wait(60) == 143, job.dump()
    for p in survivors:
        assert p.wait(120) == 0, job.dump()
    took = first_step_after(job, survivors, 4, t_term)
    for p in survivors:
        assert pids(p) == before[p.name] and len(before[p.name]) == 2, f"{p.name} restarted a worker:\n{job.dump()}"
        assert p.find(r"preemption of another node"), job.dump()
    kept = [int(m[1]) for p in survivors for _, m in p.find(
        r"checkpoint of step (\d+) written in [\d.]+ s for a preemption .*; going on")]
    stopped = [int(m[1]) for _, m in gone.find(r"^rank \d+ preempted after step (\d+)$")]
    assert len(kept) == 4 and len(stopped) == 2 and len(set(kept + stopped)) == 1, job.dump()
    step = kept[0]
    assert "world 6" in (ck / f"step-{step:012d}" / "COMPLETE").read_text()
    got = reformed(survivors)
    assert len(got) == 4, job.dump()
    for m in got:
        assert m["world"] == "4" and int(m["step"]) >= step and m["lost"] == "0", m.group(0)
    sha = shas(survivors)
    assert sorted(sha) == [0, 1, 2, 3] and len(set(sha.values())) == 1, job.dump()
    report(f"preemption: every rank saved step {step}; the survivors' first step in the 4-rank world "
           f"{took:.2f} s after the SIGTERM")


@pytest.mark.parametrize("program", ["dp_train", "train_ddp.py"])
def test_a_rank_alone_re_forms_when_a_node_comes_and_goes(job: Job, program: str) -> None:
    """(g) a world of one (one node, one worker) has no peer whose loss fails a
    collective: the launcher's word alone ends its round. A node joins with a
    worker that never makes the group (sleep), so the lone rank re-forms into
    a world of 2 that cannot form; that node is killed, and the rank gives up
    the group being made and re-forms alone, in place, losing no step."""
    if program == "dp_train" and os.environ.get("GPULAUNCH_TEST_SECOND_TORCH"):
        pytest.skip("torch-independent (dp_train): run under the first interpreter only")
    prog = ([str(BUILD / "examples" / "dp_train"), "--steps", "2000", "--step-sleep-ms", "5"]
            if program == "dp_train" else [PY, str(TRAIN), "--steps", "300", "--step-sleep-ms", "20"])
    common = [str(LAUNCHER), "--nnodes", "1:2", "--nproc-per-node", "1", "--rdzv-backend", "gpulaunch",
              "--rdzv-endpoint", f"127.0.0.1:{job.port}", "--rdzv-id", "alone",
              "--rdzv-conf", "last_call_timeout=1,heartbeat_timeout=3", "--max-restarts", "0"]
    alone = job.start("alone", [*common, "--no-python", *prog, "--reform"])
    wait_for(job, [alone], r"^first step in a world of 1: step \d+$", 1, 120)
    pid = pids(alone)
    # without the progress channel the node joins cold (no warm join: its
    # round starts before its worker would say it waits)
    other = job.start("other", [*common, "--progress-timeout", "0", "--stats-interval", "0", "--no-python",
                                "sleep", "600"])
    wait_for(job, [alone], r"round 2: node rank \d of 2", 1, 30)
    time.sleep(1.0)
    other.signal(signal.SIGKILL)
    assert alone.wait(120) == 0, job.dump()
    out = alone.text()
    assert "round 2 is over" in out and "restarting workers" not in out, job.dump()
    got = alone.find(r"^rank 0 \(was 0\): round (\d+) re-formed in place, world (\d+), going on after step "
                     r"\d+ \((\d+) lost")
    assert [m.groups() for _, m in got] == [("3", "1", "0")], job.dump()
    if program != "dp_train":  # it prints no pid
        assert pid and pids(alone) == pid, job.dump()


@pytest.mark.skipif(bool(os.environ.get("GPULAUNCH_TEST_SECOND_TORCH")),
                    reason="torch-independent (dp_train): run under the first interpreter only")
@pytest.mark.parametrize("how", ["exit", "never_wait"])
def test_a_new_node_whose_workers_cannot_wait_for_a_round_joins_as_before(job: Job, how: str) -> None:
    """(h) a warm join given up: the new node's workers, started before
    their round, exit (a program that cannot wait for it) or never say they
    wait (past --warm-start-timeout, here 2 s); its launcher stops them, is
    taken in as a new node and starts them in their round (no restart
    counted); the running rank re-forms in place and the new one copies its
    state."""
    dp = str(BUILD / "examples" / "dp_train")
    common = [str(LAUNCHER), "--nnodes", "1:2", "--nproc-per-node", "1", "--rdzv-backend", "gpulaunch",
              "--rdzv-endpoint", f"127.0.0.1:{job.port}", "--rdzv-id", "cold",
              "--rdzv-conf", "last_call_timeout=1,heartbeat_timeout=3", "--max-restarts", "0",
              "--warm-start-timeout", "2"]
    prog = [dp, "--reform", "--steps", "1500", "--step-sleep-ms", "5"]
    first = job.start("first", [*common, *prog])
    wait_for(job, [first], r"^first step in a world of 1: step \d+$", 1, 120)
    time.sleep(1.0)  # its launcher says LIVE within 20 ms of the worker; slack for a loaded machine
    early = ('echo "cannot wait for a round"; exit 3' if how == "exit"
             else 'echo "started early, never waits"; exec sleep 600')
    cant = f'[ -z "$GPULAUNCH_ROUND_PENDING" ] || {{ {early}; }}; exec "$@"'
    new = job.start("new", [*common, "--no-python", "sh", "-c", cant, "sh", *prog])
    for p in (first, new):
        assert p.wait(120) == 0, job.dump()
    out = new.text()
    assert "starting the 1 workers before this node joins" in out, job.dump()
    why = ("local rank 0 failed before it had a round" if how == "exit"
           else "not every one said within 2 s that it re-forms in place (--warm-start-timeout)")
    assert f"are given up ({why}" in out, job.dump()
    assert "restarting workers" not in out and "restarting workers" not in first.text(), job.dump()
    assert new.find(r"^rank 1: joined round \d+ with 1 ranks that kept their state: parameters of step \d+ "
                    r"copied from rank 0"), job.dump()
    assert first.find(r"^rank 0 \(was 0\): round 2 re-formed in place, world 2"), job.dump()
    sha = shas([first, new])
    assert sorted(sha) == [0, 1] and len(set(sha.values())) == 1, job.dump()


def test_round_guard_fails_what_is_in_flight_and_keeps_nothing_else() -> None:
    """The hook Elastic puts around DDP's all-reduce on Gloo: an all-reduce
    that ends hands its value on and is forgotten (a round of many steps keeps
    nothing); fail() fails the one in flight, whose work is then unfinished,
    and every later call fails at once without starting one."""
    import torch

    from gpulaunch._gloofree import RoundGuard

    class Bucket:
        def buffer(self) -> torch.Tensor:
            return torch.ones(4)

    started: list[torch.futures.Future] = []

    def inner(state: object, bucket: Bucket) -> torch.futures.Future:
        f: torch.futures.Future = torch.futures.Future()
        started.append(f)
        return f

    g = RoundGuard(torch)
    hook = g.wrap(inner)
    for _ in range(1000):
        out = hook(None, Bucket())
        started[-1].set_result(bucket_value := torch.full((4,), 2.0))
        assert out.wait() is bucket_value
    assert not g._pending and not g._abandoned and not g.unfinished()
    stuck = hook(None, Bucket())
    assert g.fail("round 1 ended") == 1
    with pytest.raises(RuntimeError, match="round 1 ended"):
        stuck.wait()
    assert g.unfinished() == [started[-1]]
    n = len(started)
    with pytest.raises(RuntimeError, match="round 1 ended"):
        hook(None, Bucket()).wait()
    assert len(started) == n
    started[-1].set_result(torch.zeros(4))  # the stuck work ends after all
    assert not g.unfinished()
    g.reset()
    assert hook(None, Bucket()) is not None and len(started) == n + 1
