"""Sharded state (FSDP2, HSDP) checkpointed through gpulaunch's DCP storage
writer and reader (CheckpointWriter.save_sharded, CheckpointReader.load_sharded)
with examples/train_fsdp.py under real launchers: every rank writes its own
shards, restore reads them into a world of another size as DCP's own
FileSystemReader does, from the durable tier when the local disk is gone,
with the data position kept as a global count; a preemption saves the same
step on every rank. Needs torch >= 2.6 (fully_shard); skipped visibly else."""

from __future__ import annotations

import os
import pickle
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
BUILD = Path(os.environ.get("GPULAUNCH_BUILD_DIR", REPO / "build" / "test"))
LIB = os.environ.get("GPULAUNCH_LIBRARY") or str(BUILD / "runtime" / "libgpulaunch.so.0")
LAUNCHER = BUILD / "launcher" / "gpulaunch"
TRAIN = TRAIN_FSDP = REPO / "examples" / "train_fsdp.py"
PY = sys.executable

torch = pytest.importorskip("torch", reason=f"torch is not installed for {PY}")
try:
    from torch.distributed.fsdp import fully_shard  # noqa: F401
except Exception:  # ImportError; ValueError from torch 1.13's dataclasses under Python 3.11
    pytest.skip(f"torch {torch.__version__} has no torch.distributed.fsdp.fully_shard (FSDP2: torch >= 2.6)",
                allow_module_level=True)

sys.path.insert(0, str(REPO / "python"))
os.environ["GPULAUNCH_LIBRARY"] = LIB


def child_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("GPULAUNCH_", "PET_", "TORCH"))}
    for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"):
        env.pop(k, None)
    env.update(PYTHONPATH=os.pathsep.join(filter(None, [str(REPO / "python"), os.environ.get("PYTHONPATH")])),
               GPULAUNCH_LIBRARY=LIB, PET_SHM_MIN="16m", PET_PREEMPTION_SOURCE="none", PET_SLURM="off",
               PYTHONUNBUFFERED="1", OMP_NUM_THREADS="1")
    return env


def cmd(nproc: int, *args: str) -> list[str]:
    return [str(LAUNCHER), "--standalone", "--nproc-per-node", str(nproc), "--no-python", PY, str(TRAIN), *args]


class Run:
    def __init__(self, p: subprocess.CompletedProcess[str]) -> None:
        self.rc, self.out, self.err = p.returncode, p.stdout, p.stderr
        self.lines = [re.sub(r"^\[\w+?\d+\]:", "", ln) for ln in p.stdout.splitlines()]

    def __str__(self) -> str:
        return f"exit {self.rc}\n--- stdout\n{self.out}\n--- stderr\n{self.err}"

    def shas(self, what: str) -> set[str]:
        pat = re.compile(rf"rank \d+ {what}params_sha256 ([0-9a-f]{{64}})")
        return {m.group(1) for m in map(pat.fullmatch, self.lines) if m}

    def sha(self, what: str = "") -> str:
        got = self.shas(what)
        assert len(got) == 1, f"ranks disagree or said nothing ({what or 'final'}): {got}\n{self}"
        return got.pop()

    def has(self, pattern: str) -> bool:
        return any(re.fullmatch(pattern, ln) for ln in self.lines)


def train(nproc: int, *args: str, ok: int = 0, timeout: float = 240) -> Run:
    r = Run(subprocess.run(cmd(nproc, *args), env=child_env(), capture_output=True, text=True, timeout=timeout))
    assert r.rc == ok, str(r)
    return r


@pytest.fixture(scope="module", autouse=True)
def built() -> None:
    if not LAUNCHER.exists():
        pytest.fail(f"{LAUNCHER} is not built (GPULAUNCH_BUILD_DIR={BUILD})")


def test_saved_on_3_ranks_loads_on_2_and_4_as_dcp_itself_reads_it(tmp_path: Path) -> None:
    """FSDP2 over 3 ranks saves steps 4 and 8 (each rank its own shards, rank
    0 the plan); 2 and 4 ranks restore step 8 (full parameters equal to the
    saved ones, samples from 96 on) and train 2 more steps, ending equal, bit
    for bit, to the same world started from DCP's own FileSystemWriter copy of
    that state read by its FileSystemReader."""
    ck, ref = tmp_path / "ck", tmp_path / "ref"
    saved = train(3, "--steps", "8", "--checkpoint-dir", str(ck), "--checkpoint-every", "4",
                  "--dcp-save", str(ref))
    step = ck / "step-000000000008"
    names = sorted(p.name for p in step.iterdir())
    assert names == ["COMPLETE", "r0-train", "r0-train.metadata", "r0-train.state", "r1-train", "r2-train",
                     "rank-0.manifest", "rank-1.manifest", "rank-2.manifest"], names
    assert "world 3" in (step / "COMPLETE").read_text()
    for n in (2, 4):
        got = train(n, "--steps", "10", "--checkpoint-dir", str(ck), "--print-samples")
        assert got.has(rf"train_fsdp: step 8's checkpoint of 3 ranks loaded into {n} \(fsdp\), at sample 96"), str(got)
        assert got.sha("loaded ") == saved.sha(), f"{n} ranks loaded other parameters than 3 saved\n{got}"
        assert got.has(r"step 8 samples 96\.\.107") and got.has(r"step 9 samples 108\.\.119"), str(got)
        want = train(n, "--steps", "10", "--dcp-load", str(ref))
        assert want.sha("loaded ") == saved.sha()
        assert got.sha() == want.sha(), f"{n} ranks: gpulaunch's restore and DCP's differ after 2 steps"
        print(f"test_fsdp: 3 -> {n} ranks: loaded {got.sha('loaded ')[:12]}, after 2 steps {got.sha()[:12]} "
              f"(DCP's own: {want.sha()[:12]})")


def test_hsdp_in_two_groups_loads_into_three_groups_and_into_fsdp(tmp_path: Path) -> None:
    """HSDP, 2 replica groups of 2 (a node's ranks shard, the nodes
    replicate): one copy of each shard is written (DCP keeps one of equal
    replicas); 3 groups of 2 and plain FSDP over 2 ranks load the same full
    parameters."""
    ck = tmp_path / "ck"
    saved = train(4, "--mode", "hsdp", "--shard", "2", "--steps", "6", "--checkpoint-dir", str(ck),
                  "--checkpoint-every", "3")
    for n, mode in ((6, ("--mode", "hsdp", "--shard", "2")), (2, ("--mode", "fsdp"))):
        got = train(n, *mode, "--steps", "6", "--checkpoint-dir", str(ck))
        assert got.has(rf"train_fsdp: step 6's checkpoint of 4 ranks loaded into {n} \({mode[1]}\), at sample 72")
        assert got.sha("loaded ") == saved.sha(), str(got)


def test_a_lost_local_disk_restores_every_shard_from_the_durable_tier(tmp_path: Path) -> None:
    """Local disk plus a durable directory: the local one gone, 2 ranks read
    the 3 saving ranks' shards from the durable tier, each checked."""
    local, durable = tmp_path / "nvme", tmp_path / "pvc"
    saved = train(3, "--steps", "4", "--checkpoint-dir", str(local), "--checkpoint-every", "2",
                  "--checkpoint-durable", str(durable))
    assert (durable / "step-000000000004" / "COMPLETE").exists()
    shutil.rmtree(local)
    got = train(2, "--steps", "4", "--checkpoint-dir", str(local), "--checkpoint-durable", str(durable))
    assert got.sha("loaded ") == saved.sha(), str(got)
    fetched = set(re.findall(r"r(\d)-train fetched from", got.err))
    assert fetched >= {"2"}, f"rank 2's shards were not fetched from the durable tier:\n{got}"


def test_a_preemption_saves_the_same_sharded_step_and_resumes_on_fewer_ranks(tmp_path: Path) -> None:
    """SIGTERM to the launcher mid-run: every rank saves the same step
    (DCP's collectives inside the agreed save) and exits 143; 2 ranks resume
    there at the matching sample."""
    ck = tmp_path / "ck"
    p = subprocess.Popen(cmd(3, "--steps", "500", "--step-sleep-ms", "50", "--print-every", "5",
                             "--checkpoint-dir", str(ck)),
                         env=child_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert p.stdout is not None
        seen = []
        for ln in p.stdout:
            seen.append(ln)
            if re.search(r"step 10 loss", ln):
                break
        else:
            pytest.fail("no step 10:\n" + "".join(seen))
        p.send_signal(signal.SIGTERM)
        out, err = p.communicate(timeout=120)
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()
    assert p.returncode == 143, f"exit {p.returncode}\n{''.join(seen)}{out}\n{err}"
    steps = sorted(int(d.name[5:]) for d in ck.iterdir() if (d / "COMPLETE").exists())
    assert steps, err
    step = steps[-1]
    assert step >= 10
    got = train(2, "--steps", str(step), "--checkpoint-dir", str(ck))
    assert got.has(rf"train_fsdp: step {step}'s checkpoint of 3 ranks loaded into 2 \(fsdp\), at sample {12 * step}"), \
        str(got)


def test_the_plan_file_runs_no_code_of_its_own() -> None:
    """The metadata is read by an unpickler that builds DCP's classes only."""
    from gpulaunch import _dcp

    class Evil:
        def __reduce__(self) -> tuple[object, tuple[str]]:
            return (os.system, ("echo owned",))

    for payload in (pickle.dumps(Evil()), pickle.dumps({"x": time.sleep})):
        with pytest.raises(pickle.UnpicklingError, match="not written by gpulaunch's save_sharded"):
            _dcp._MetadataUnpickler(__import__("io").BytesIO(payload)).load()
    import enum

    class Color(enum.Enum):
        RED = 1

    with pytest.raises(pickle.UnpicklingError):
        _dcp._enum_member(Color, "__class__")
    assert _dcp._enum_member(Color, "RED") is Color.RED


# ---- live re-formation of sharded state (gpulaunch.ShardedElastic) ----

from test_elastic import HOLD, Job, first_step_after, job, pids, shas, wait_for  # noqa: E402,F401


def test_hsdp_node_killed_then_one_joins_all_from_memory_as_a_restart_would(job: Job, tmp_path: Path) -> None:
    """HSDP over 3 nodes x 2 ranks (a node is one replica group). A node's
    launcher and workers SIGKILLed while the job waits for its rank 4 before
    step 10: the survivors keep their processes, take the shards they now own
    from the memory of the other group (nothing read from storage) and lose
    no step. A new node joins while rank 0 holds before step 20: its ranks
    take their shards from the survivors' memory. The job ends with full
    parameters equal, bit for bit, to a restart replay of the same sequence
    (4 ranks from the checkpoint of step 10, then 6 from that of step 20)."""
    ck, ck_copy = tmp_path / "ck", tmp_path / "ck-at-fault"
    args = ("--mode", "hsdp", "--shard", "2", "--steps", "30", "--print-every", "5")
    ckargs = ("--checkpoint-dir", str(ck), "--checkpoint-every", str(HOLD))
    nodes = [job.node(f"node{i}", "--hold", f"4:{HOLD}", "--hold", f"0:{2 * HOLD}", *args, *ckargs,
                      program=TRAIN_FSDP) for i in range(3)]
    (_, held), = wait_for(job, nodes, rf"^rank 4 holding before step {HOLD}$", 1, 180)
    wait_for(job, nodes, rf"^rank \d+ reached step {HOLD}$", 6, 60)
    until = time.monotonic() + 30
    while not list(ck.glob("*/COMPLETE")):  # the checkpoint of step HOLD is whole
        assert time.monotonic() < until, job.dump()
        time.sleep(0.05)
    shutil.copytree(ck, ck_copy)
    survivors = [p for p in nodes if p is not held]
    before = {p.name: pids(p) for p in survivors}
    t_kill = time.monotonic()
    held.signal(signal.SIGKILL)
    held.wait(10)
    wait_for(job, survivors, rf"^rank 0 holding before step {2 * HOLD}$", 1, 120)
    took = first_step_after(job, survivors, 4, t_kill)
    t_join = time.monotonic()
    late = job.node("node3", *args, *ckargs, program=TRAIN_FSDP)
    everyone = [*survivors, late]
    for p in everyone:
        assert p.wait(180) == 0, job.dump()
    joined = first_step_after(job, everyone, 6, t_join)
    for p in survivors:
        assert pids(p) == before[p.name] and len(before[p.name]) == 2, f"{p.name} restarted a worker:\n{job.dump()}"
    pat = (r"^rank (\d+) \(was \d+\): round \d+ re-formed in place, world (\d), going on after step (\d+) "
           r"\((\d+) lost\), shards from the memory of (\d+) ranks in ([\d.]+) ms \(the copy ([\d.]+) ms\)$")
    got = [m for p in survivors for _, m in p.find(pat)]
    after_kill = [m for m in got if m[2] == "4"]
    after_join = [m for m in got if m[2] == "6"]
    assert len(after_kill) == 4 and len(after_join) == 4, job.dump()
    assert {(m[3], m[4]) for m in after_kill} == {(str(HOLD), "0")}, job.dump()
    assert {(m[3], m[4]) for m in after_join} == {(str(2 * HOLD), "0")}, job.dump()
    new = late.find(rf"^rank \d: joined round \d+: step {2 * HOLD}'s shards taken from the memory of 4 ranks")
    assert len(new) == 2, job.dump()
    assert not any(p.find("loaded into") for p in everyone), f"a checkpoint was read:\n{job.dump()}"
    sha = shas(everyone)
    assert sorted(sha) == list(range(6)) and len(set(sha.values())) == 1, job.dump()

    # the restart replay: 4 ranks from step 10's checkpoint to step 20, then 6 ranks to the end
    four = train(4, *args[:4], "--steps", str(2 * HOLD), "--checkpoint-dir", str(ck_copy),
                 "--checkpoint-every", str(HOLD))
    assert four.has(rf"train_fsdp: step {HOLD}'s checkpoint of 6 ranks loaded into 4 \(hsdp\), at sample "
                    rf"{12 * HOLD}"), str(four)
    six = train(6, *args[:4], "--steps", "30", "--checkpoint-dir", str(ck_copy))
    assert six.has(rf"train_fsdp: step {2 * HOLD}'s checkpoint of 4 ranks loaded into 6 \(hsdp\), at sample "
                   rf"{24 * HOLD}"), str(six)
    assert six.sha() == set(sha.values()).pop(), f"live re-formation and restart differ:\n{job.dump()}\n{six}"
    print(f"test_fsdp: HSDP node killed: first step in the 4-rank world {took:.2f} s after SIGKILL; "
          f"re-formation {', '.join(m[6] for m in after_kill)} ms (copies {', '.join(m[7] for m in after_kill)} "
          f"ms); a node joined: first step in the 6-rank world {joined:.2f} s after it started")


def test_fsdp_node_killed_without_a_replica_restarts_from_the_checkpoint(job: Job, tmp_path: Path) -> None:
    """FSDP over every rank: the killed node's shards exist nowhere else; the
    survivors say which shards are gone and their launchers restart the
    workers, which restore the checkpoint resharded into 4 ranks."""
    ck = tmp_path / "ck"
    args = ("--mode", "fsdp", "--steps", "20", "--print-every", "5", "--checkpoint-dir", str(ck),
            "--checkpoint-every", str(HOLD))
    nodes = [job.node(f"node{i}", "--hold", f"4:{HOLD}", *args, program=TRAIN_FSDP) for i in range(3)]
    (_, held), = wait_for(job, nodes, rf"^rank 4 holding before step {HOLD}$", 1, 180)
    wait_for(job, nodes, rf"^rank \d+ reached step {HOLD}$", 6, 60)
    until = time.monotonic() + 30
    while not list(ck.glob("*/COMPLETE")):
        assert time.monotonic() < until, job.dump()
        time.sleep(0.05)
    held.signal(signal.SIGKILL)
    survivors = [p for p in nodes if p is not held]
    for p in survivors:
        assert p.wait(180) == 0, job.dump()
    held.wait(10)
    text = "\n".join(p.text() for p in survivors)
    assert re.search(r"shards \[[\d, ]+\] of the state \(6-way sharded\) were held only by ranks that are gone",
                     text), job.dump()
    assert re.search(rf"train_fsdp: step {HOLD}'s checkpoint of 6 ranks loaded into 4 \(fsdp\)", text), job.dump()
    sha = shas(survivors)
    assert sorted(sha) == [0, 1, 2, 3] and len(set(sha.values())) == 1, job.dump()


def test_fsdp_node_joining_reshards_4_ways_into_6_from_memory_as_a_restart_would(job: Job, tmp_path: Path) -> None:
    """FSDP over every rank, 2 nodes x 2: a third node joins while rank 0
    holds before step 10; every rank keeps or takes the rows of its new
    6-way shard from the 4-way shards in the survivors' memory (no
    storage), and the job ends bitwise equal to a restart replay (4 ranks to
    step 10, then 6 from its checkpoint)."""
    ck, ck_copy = tmp_path / "ck", tmp_path / "ck-replay"
    args = ("--mode", "fsdp", "--steps", "20", "--print-every", "5")
    ckargs = ("--checkpoint-dir", str(ck), "--checkpoint-every", str(HOLD))
    nodes = [job.node(f"node{i}", "--hold", f"0:{HOLD}", *args, *ckargs, program=TRAIN_FSDP) for i in range(2)]
    wait_for(job, nodes, rf"^rank 0 holding before step {HOLD}$", 1, 180)
    t_join = time.monotonic()
    late = job.node("node2", *args, *ckargs, program=TRAIN_FSDP)
    everyone = [*nodes, late]
    for p in everyone:
        assert p.wait(180) == 0, job.dump()
    joined = first_step_after(job, everyone, 6, t_join)
    pat = r"^rank \d \(was \d\): round \d+ re-formed in place, world 6, going on after step (\d+) \((\d+) lost\)"
    got = [m for p in nodes for _, m in p.find(pat)]
    assert len(got) == 4 and {(m[1], m[2]) for m in got} == {(str(HOLD), "0")}, job.dump()
    assert len(late.find(rf"^rank \d: joined round \d+: step {HOLD}'s shards taken from the memory of 4 ranks")) == 2, \
        job.dump()
    assert not any(p.find("loaded into") for p in everyone), f"a checkpoint was read:\n{job.dump()}"
    sha = shas(everyone)
    assert sorted(sha) == list(range(6)) and len(set(sha.values())) == 1, job.dump()

    train(4, *args[:2], "--steps", str(HOLD), "--checkpoint-dir", str(ck_copy), "--checkpoint-every", str(HOLD))
    six = train(6, *args[:2], "--steps", "20", "--checkpoint-dir", str(ck_copy))
    assert six.has(rf"train_fsdp: step {HOLD}'s checkpoint of 4 ranks loaded into 6 \(fsdp\), at sample "
                   rf"{12 * HOLD}"), str(six)
    assert six.sha() == set(sha.values()).pop(), f"live resharding and restart differ:\n{job.dump()}\n{six}"
    print(f"test_fsdp: FSDP 4 -> 6 ranks from memory: first step in the 6-rank world {joined:.2f} s after the "
          f"node started")
