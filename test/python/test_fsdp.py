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

def _fsdp2() -> str:
    """Why FSDP2 cannot run under this interpreter ("": it can)."""
    try:
        import torch
    except ImportError:
        return f"torch is not installed for {PY}"
    try:
        from torch.distributed.fsdp import fully_shard  # noqa: F401
    except Exception:  # ImportError; ValueError from torch 1.13's dataclasses under Python 3.11
        return f"torch {torch.__version__} has no torch.distributed.fsdp.fully_shard (FSDP2: torch >= 2.6)"
    return ""


NO_FSDP2 = _fsdp2()
# collected and skipped (a module skipped whole leaves pytest nothing to run: exit 5)
pytestmark = pytest.mark.skipif(bool(NO_FSDP2), reason=NO_FSDP2)

sys.path.insert(0, str(REPO / "python"))
os.environ["GPULAUNCH_LIBRARY"] = LIB

from test_elastic import child_env  # noqa: E402


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
