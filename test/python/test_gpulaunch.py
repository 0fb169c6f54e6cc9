"""Tests of the gpulaunch Python package: real jobs under the gpulaunch
launcher (and torchrun), real checkpoint directories, the C runtime's own
checkpoints. The build directory comes from GPULAUNCH_BUILD_DIR (default
build/test); the library from GPULAUNCH_LIBRARY (default the build's)."""

from __future__ import annotations

import datetime
import hashlib
import importlib.util
import os
import re
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
DP_TRAIN = BUILD / "examples" / "dp_train"
PY = sys.executable

os.environ["GPULAUNCH_LIBRARY"] = LIB
sys.path.insert(0, str(REPO / "python"))
import gpulaunch  # noqa: E402

try:
    HAVE_TORCH = importlib.util.find_spec("torch") is not None
except ImportError:
    HAVE_TORCH = False


# The same tests run on Debian's torch and on today's (GPULAUNCH_TEST_SECOND_TORCH
# set): a test whose workers take no torch path runs on the first alone. The
# second still loads torch before libgpulaunch in every worker (_native's
# _torch_first), so its torch tests cover that load order.
ONCE = pytest.mark.skipif(bool(os.environ.get("GPULAUNCH_TEST_SECOND_TORCH")),
                          reason="no torch path: run on the first torch's interpreter")


def need_torch() -> None:
    if not HAVE_TORCH:
        pytest.skip(f"torch is not installed for {PY}: the torch paths are untested")


def child_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("GPULAUNCH_", "PET_"))}
    for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"):
        env.pop(k, None)
    env.update(
        PYTHONPATH=os.pathsep.join([str(REPO / "python")] + ([os.environ["PYTHONPATH"]] if os.environ.get("PYTHONPATH") else [])),
        GPULAUNCH_LIBRARY=LIB,
        PET_SHM_MIN="16m",
        PET_PREEMPTION_SOURCE="none",
        PYTHONUNBUFFERED="1",
    )
    env.update(extra)
    return env


def launch_cmd(nproc: int, script: str, *args: str, launcher_args: tuple[str, ...] = ()) -> list[str]:
    return [str(LAUNCHER), "--standalone", "--nproc-per-node", str(nproc), *launcher_args,
            "--no-python", PY, str(HERE / script), *args]


def run(cmd: list[str], timeout: float = 60, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(cmd, env=child_env(**env), capture_output=True, text=True, timeout=timeout)


def lines(out: str) -> list[str]:
    """Worker lines without the launcher's [role<local rank>]: prefix."""
    return [re.sub(r"^\[\w+?\d+\]:", "", ln) for ln in out.splitlines()]


def matches(out: str, pattern: str) -> list[re.Match[str]]:
    return [m for m in (re.fullmatch(pattern, ln) for ln in lines(out)) if m]


def describe(p: subprocess.CompletedProcess[str]) -> str:
    return f"exit {p.returncode}\n--- stdout\n{p.stdout}\n--- stderr\n{p.stderr}"


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for piece in iter(lambda: f.read(1 << 20), b""):
            h.update(piece)
    return h.hexdigest()


def check_layout(stepdir: Path, step: int, world: int) -> dict[str, tuple[int, str]]:
    """What the C runtime checks before it restores a step: the COMPLETE marker,
    one manifest per rank, every listed file of that size and SHA-256."""
    assert (stepdir / "COMPLETE").read_text() == f"gpulaunch-checkpoint 1\nstep {step}\nworld {world}\n"
    listed: dict[str, tuple[int, str]] = {}
    for r in range(world):
        for ln in (stepdir / f"rank-{r}.manifest").read_text().splitlines():
            name, size, digest = ln.split(" ")
            assert name.startswith(f"r{r}-"), f"{stepdir}: rank {r}'s manifest lists {name}"
            assert (stepdir / name).stat().st_size == int(size), name
            assert sha256_file(stepdir / name) == digest, f"{name}: SHA-256 differs from its manifest"
            listed[name] = (int(size), digest)
    on_disk = {p.name for p in stepdir.iterdir()} - {"COMPLETE"} - {f"rank-{r}.manifest" for r in range(world)}
    assert on_disk == set(listed), f"{stepdir}: files not in a manifest: {on_disk - set(listed)}"
    return listed


def steps_in(d: Path) -> list[int]:
    return sorted(int(p.name[5:]) for p in d.glob("step-*"))


@pytest.fixture(scope="module", autouse=True)
def built() -> None:
    for p in (LAUNCHER, Path(LIB)):
        if not p.exists():
            pytest.fail(f"{p} is missing: build the project first (cmake --build {BUILD})")


# ---- collectives ----


def test_collectives_on_four_ranks() -> None:
    """sum/prod/min/max/avg on array.array, numpy and torch tensors of every
    dtype with exact values, odd-sized broadcasts, the barrier, bad arguments."""
    args = ("--torch",) if HAVE_TORCH else ()
    p = run(launch_cmd(4, "worker_collectives.py", *args), timeout=90)
    assert p.returncode == 0, describe(p)
    want = "PASS collectives" + (" torch" if HAVE_TORCH else "")
    assert sorted(int(m[1]) for m in matches(p.stdout, rf"rank (\d) {want}")) == [0, 1, 2, 3], describe(p)
    need_torch()


@ONCE
def test_state_source_is_one_line_the_launcher_reads(monkeypatch: pytest.MonkeyPatch) -> None:
    """state_source() writes the progress pipe's "state" line (launcher/gl_progress.c parses it);
    outside gpulaunch, or with an unknown source, it writes nothing and raises nothing."""
    import gpulaunch
    r, w = os.pipe()
    try:
        monkeypatch.setenv("GPULAUNCH_PROGRESS_FD", str(w))
        gpulaunch.state_source("peer", 106, 2308, 0.0136, 0)
        gpulaunch.state_source("checkpoint", 200, 1 << 30, 1.5)
        gpulaunch.state_source("disk", 1, 1, 1.0)  # not a source: nothing
        os.close(w)
        w = -1
        got = os.read(r, 4096).decode()
        assert got == "state peer 106 2308 14 0\nstate checkpoint 200 1073741824 1500 -1\n"
        monkeypatch.delenv("GPULAUNCH_PROGRESS_FD")
        gpulaunch.state_source("peer", 1, 1, 1.0)  # outside gpulaunch: nothing, no error
        monkeypatch.setenv("GPULAUNCH_PROGRESS_FD", "not-a-number")
        gpulaunch.state_source("peer", 1, 1, 1.0)
    finally:
        os.close(r)
        if w >= 0:
            os.close(w)


def test_master_port_is_below_the_ephemeral_range() -> None:
    """The round's MASTER_PORT is chosen below the kernel's ephemeral range,
    so no socket made before the workers bind it can be given it."""
    with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
        lo = int(f.read().split()[0])
    ports = set()
    for _ in range(3):
        p = subprocess.run([str(LAUNCHER), "--standalone", "--nproc-per-node", "1", "--no-python", "sh", "-c",
                            "echo port=$MASTER_PORT"], env=child_env(), capture_output=True, text=True, timeout=60)
        m = re.search(r"port=(\d+)", p.stdout)
        assert p.returncode == 0 and m, describe(p)
        ports.add(int(m[1]))
    assert all(10000 <= port < lo for port in ports), f"{ports} (ephemeral range from {lo})"


def test_launchers_started_together_draw_different_master_ports() -> None:
    """Eight standalone launchers started at once draw their MASTER_PORTs from the kernel's
    random pool: two launchers whose seeds came from pid ^ milliseconds drew the same port
    (EADDRINUSE in one job's store). One chance repeat in 22,000 ports is allowed."""
    procs = [subprocess.Popen([str(LAUNCHER), "--standalone", "--nproc-per-node", "1", "--no-python", "sh", "-c",
                               "echo port=$MASTER_PORT"], env=child_env(), stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True) for _ in range(8)]
    ports = []
    for p in procs:
        out, _ = p.communicate(timeout=60)
        m = re.search(r"port=(\d+)", out)
        assert p.returncode == 0 and m, out
        ports.append(int(m[1]))
    assert len(set(ports)) >= 7, f"launchers started together drew {sorted(ports)}"


@ONCE
def test_world_of_one_and_argument_errors() -> None:
    with gpulaunch.Comm("cpu") as c:
        assert (c.rank, c.world_size, c.backend) == (0, 1, "cpu")
        buf = bytearray(b"abc")
        c.broadcast(buf)
        assert buf == b"abc"
        with pytest.raises(gpulaunch.Error) as e:
            c.broadcast(buf, root=1)
        assert e.value.code == 1 and e.value.name == "GPL_ERR_INVALID_ARG"
        assert "root 1 is not a rank (0..0)" in str(e.value)
        with pytest.raises(TypeError, match="root must be an int"):
            c.broadcast(buf, root="0")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="not one of auto, cpu, nccl"):
        gpulaunch.Comm("gpu")
    assert gpulaunch.EXIT_PREEMPTED == 143 and gpulaunch.__version__


@ONCE
def test_missing_library_says_what_to_do() -> None:
    p = subprocess.run([PY, "-c", "import gpulaunch; gpulaunch.Comm()"], capture_output=True, text=True,
                       env=child_env(GPULAUNCH_LIBRARY="/nonexistent/libgpulaunch.so.0"), timeout=30)
    assert p.returncode != 0
    assert "gpulaunch.Error" in p.stderr or "Error:" in p.stderr
    assert "/nonexistent/libgpulaunch.so.0" in p.stderr and "GPULAUNCH_LIBRARY" in p.stderr, p.stderr


# ---- checkpoints, one process ----


def test_checkpointer_errors_in_process(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="keep"):
        gpulaunch.Checkpointer(tmp_path / "a", keep=0, handle_sigterm=False)
    with pytest.raises(ValueError, match="every_steps"):
        gpulaunch.Checkpointer(tmp_path / "a", every_steps=-1, handle_sigterm=False)
    ck = gpulaunch.Checkpointer(tmp_path / "ck", every_steps=1, handle_sigterm=False)
    try:
        with pytest.raises(ValueError, match="step must be an int >= 0"):
            ck.step_end(-1, lambda w: None)

        class Boom(Exception):
            pass

        def bad_save(w: gpulaunch.CheckpointWriter) -> None:
            w.write("x", b"partial")
            raise Boom("disk on fire")

        with pytest.raises(Boom, match="disk on fire") as e:
            ck.step_end(1, bad_save)
        assert isinstance(e.value.__cause__, gpulaunch.Error), "the library's error is chained"
        assert "save callback failed at step 1" in str(e.value.__cause__)
        assert not (tmp_path / "ck" / "step-000000000001" / "COMPLETE").exists()

        kept: list[gpulaunch.CheckpointWriter] = []

        def good_save(w: gpulaunch.CheckpointWriter) -> None:
            kept.append(w)
            assert w.step == 2 and w.rank == 0 and not w.preempting and w.seconds_left == float("inf")
            w.write("a", b"alpha")
            w.write("b", bytearray(b"beta"))
            w.write("empty", b"")
            with open(w.path("c"), "wb") as f:
                f.write(b"gamma" * 1000)
            with pytest.raises(gpulaunch.Error, match="file name of 1 to 128"):
                w.write("bad/name", b"")

        assert ck.step_end(2, good_save) is False
        ck.wait()  # written in the background: COMPLETE once waited for
        check_layout(tmp_path / "ck" / "step-000000000002", 2, 1)
        with pytest.raises(gpulaunch.Error, match="after the callback returned"):
            kept[0].write("late", b"")

        seen: dict[str, bytes] = {}

        def load(rd: gpulaunch.CheckpointReader) -> None:
            seen.update(a=rd.read("a"), b=rd.read("b"), c=rd.read("c"), empty=rd.read("empty"))
            with pytest.raises(gpulaunch.Error) as nf:
                rd.path("nope")
            assert nf.value.name == "GPL_ERR_NOT_FOUND"

        assert ck.restore(load) == 2
        assert seen == {"a": b"alpha", "b": b"beta", "c": b"gamma" * 1000, "empty": b""}

        def bad_load(rd: gpulaunch.CheckpointReader) -> None:
            rd.read("nope")

        with pytest.raises(gpulaunch.Error) as e2:
            ck.restore(bad_load)
        assert e2.value.name == "GPL_ERR_NOT_FOUND" and "nope" in str(e2.value)
        assert isinstance(e2.value.__cause__, gpulaunch.Error)
    finally:
        ck.close()
    with pytest.raises(gpulaunch.Error, match="closed"):
        ck.step_end(3, lambda w: None)
    empty = gpulaunch.Checkpointer(tmp_path / "none", handle_sigterm=False)
    assert empty.restore(lambda rd: None) is None
    empty.close()


SELF_SIGTERM = r"""
import os, signal, sys, time, gpulaunch
ck = gpulaunch.Checkpointer(sys.argv[1])
saved = []
def save(w):
    saved.append((w.step, w.preempting, round(w.seconds_left)))
    w.write("s", b"x")
print("step 1", ck.step_end(1, save), flush=True)
os.kill(os.getpid(), signal.SIGTERM)
time.sleep(0.2)
print("step 2", ck.step_end(2, save), saved, flush=True)
signal.signal(signal.SIGTERM, lambda *a: None)
ck.step_end(3, save)
ck.close()
"""


@ONCE
def test_sigterm_in_a_python_process(tmp_path: Path) -> None:
    """The C handler stays installed in Python: SIGTERM asks for a checkpoint
    instead of killing; a handler installed later by Python is reported."""
    p = subprocess.run([PY, "-c", SELF_SIGTERM, str(tmp_path / "ck")], capture_output=True, text=True,
                       env=child_env(GPULAUNCH_GRACE_S="7"), timeout=30)
    assert p.returncode == 0, describe(p)
    assert "step 1 False" in p.stdout and "step 2 True [(2, True, 7)]" in p.stdout, describe(p)
    assert "a SIGTERM handler was installed after the Checkpointer" in p.stderr, describe(p)
    check_layout(tmp_path / "ck" / "step-000000000002", 2, 1)


# ---- checkpoints, 4-rank jobs ----


@ONCE
def test_periodic_checkpoints_keep_and_layout(tmp_path: Path) -> None:
    d = tmp_path / "ck"
    p = run(launch_cmd(4, "worker_ckpt.py", "--dir", str(d), "--steps", "10", "--every", "2", "--keep", "2"))
    assert p.returncode == 0, describe(p)
    assert len(matches(p.stdout, r"rank \d restored none")) == 4 and len(matches(p.stdout, r"rank \d done 10")) == 4
    assert steps_in(d) == [8, 10], describe(p)
    for s in (8, 10):
        listed = check_layout(d / f"step-{s:012d}", s, 4)
        assert set(listed) == {"r0-state", "r0-shared", "r1-state", "r2-state", "r3-state"}
    # the C runtime accepts the Python-written step 10 (its loader then wants
    # its own file, 'params', which is not there)
    if DP_TRAIN.exists():
        c = run([str(DP_TRAIN), "--steps", "1", "--checkpoint-dir", str(d)], timeout=30)
        assert c.returncode != 0 and "skipping checkpoint" not in c.stderr, describe(c)
        assert "'params'" in c.stderr + c.stdout and "step-000000000010" in c.stderr + c.stdout, describe(c)


@ONCE
def test_restore_skips_torn_and_partial(tmp_path: Path) -> None:
    d = tmp_path / "ck"
    p = run(launch_cmd(4, "worker_ckpt.py", "--dir", str(d), "--steps", "6", "--every", "2"))
    assert p.returncode == 0 and steps_in(d) == [2, 4, 6], describe(p)
    torn = d / "step-000000000006" / "r1-state"
    data = bytearray(torn.read_bytes())
    data[100] ^= 0x40  # same size: only the hash can tell
    torn.write_bytes(bytes(data))
    partial = d / "step-000000000008"
    partial.mkdir()
    (partial / "r0-state").write_bytes(b"half")
    p = run(launch_cmd(4, "worker_ckpt.py", "--dir", str(d), "--steps", "0"))
    assert p.returncode == 0, describe(p)
    assert len(matches(p.stdout, r"rank \d restored 4")) == 4, describe(p)
    for r in range(4):
        assert f"rank {r} loaded 'rank {r} step 4'" in lines(p.stdout), describe(p)
    assert re.search(r"skipping checkpoint \S*step-000000000008: no COMPLETE", p.stderr), describe(p)
    assert re.search(r"skipping checkpoint \S*step-000000000006: r1-state fails its SHA-256", p.stderr), describe(p)


def test_c_checkpoint_read_by_python(tmp_path: Path) -> None:
    if not DP_TRAIN.exists():
        pytest.fail(f"{DP_TRAIN} is missing: build the dp_train target")
    d = tmp_path / "ck"
    p = run([str(LAUNCHER), "--standalone", "--nproc-per-node", "2", str(DP_TRAIN), "--steps", "10",
             "--checkpoint-dir", str(d), "--checkpoint-every", "5"])
    assert p.returncode == 0 and steps_in(d) == [5, 10], describe(p)
    listed = check_layout(d / "step-000000000010", 10, 2)
    got: dict[str, bytes] = {}
    ck = gpulaunch.Checkpointer(d, handle_sigterm=False)
    try:
        assert ck.restore(lambda rd: got.update(params=rd.read("params"), path=rd.path("params").encode())) == 10
    finally:
        ck.close()
    size, digest = listed["r0-params"]
    assert len(got["params"]) == size and hashlib.sha256(got["params"]).hexdigest() == digest
    assert got["path"].decode() == str(d / "step-000000000010" / "r0-params")


@ONCE
def test_sigterm_to_the_launcher_stops_every_rank_at_one_step(tmp_path: Path) -> None:
    d = tmp_path / "ck"
    proc = subprocess.Popen(
        launch_cmd(4, "worker_ckpt.py", "--dir", str(d), "--steps", "100000", "--sleep", "0.02",
                   "--ready-step", "3"),
        env=child_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )
    try:
        deadline = time.monotonic() + 30
        while not all((tmp_path / f"ready-{r}").exists() for r in range(4)):
            assert proc.poll() is None and time.monotonic() < deadline, "workers never got to step 3"
            time.sleep(0.05)
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    p = subprocess.CompletedProcess(proc.args, proc.returncode, out, err)
    assert proc.returncode == 143, describe(p)
    at = {int(m[1]): int(m[2]) for m in matches(out, r"rank (\d) preempted at (\d+)")}
    assert sorted(at) == [0, 1, 2, 3] and len(set(at.values())) == 1, describe(p)
    step = at[0]
    assert step > 3 and len(matches(out, r"rank \d preempting with \d+ s left")) == 4, describe(p)
    assert steps_in(d) == [step]
    check_layout(d / f"step-{step:012d}", step, 4)


def since_logged(stderr: str, pattern: str, end: float) -> float:
    """Seconds from the launcher's log line matching pattern (its UTC
    timestamp) to `end` (time.time()): what a check of how fast something
    ended measures, whatever the machine's load made the start-up take."""
    m = re.search(r"^(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d+)Z .*" + pattern, stderr, re.M)
    assert m, f"no log line {pattern!r}:\n{stderr}"
    at = datetime.datetime.fromisoformat(m[1]).replace(tzinfo=datetime.timezone.utc).timestamp()
    return end - at


@ONCE
def test_rank_dying_in_the_agreement_is_named(tmp_path: Path) -> None:
    p = run(launch_cmd(4, "worker_ckpt.py", "--dir", str(tmp_path / "ck"), "--steps", "10",
                       "--die-rank", "2", "--die-step", "3", launcher_args=("--shutdown-timeout", "20")),
            timeout=60, GPULAUNCH_TIMEOUT_MS="3000")
    took = since_logged(p.stderr, r"rank 2 \(local rank 2\) exited", time.time())
    errs = {int(m[1]): m[2] for m in matches(p.stdout, r"rank (\d) error (GPL_ERR_\w+: .*)")}
    assert sorted(errs) == [0, 1, 3], describe(p)
    for r, msg in errs.items():
        assert re.search(r"\brank 2\b|\branks? [\d, ]*2\b", msg), f"rank {r}: {msg}"
    # the collective timeout is 3 s: the other ranks fail well before 20 s (the shutdown timeout)
    assert took < 10, f"the job ended {took:.1f} s after rank 2 died\n{describe(p)}"
    assert p.returncode != 0


STUCK_PEER = r"""
import os, sys, time, gpulaunch
ck = gpulaunch.Checkpointer(sys.argv[1])
ck.step_end(1, lambda w: None)
if os.environ["RANK"] == "1":
    sys.exit(3)
print("rank 0 stuck", flush=True)
time.sleep(60)  # as in a framework's collective whose peer is gone
"""


@ONCE
def test_worker_of_a_failed_round_is_not_held_by_its_checkpoint_handler(tmp_path: Path) -> None:
    """SIGTERM asks a Checkpointer for a checkpoint; but when the launcher stops
    a round that is over (a peer failed), the worker ends at once instead of
    waiting for --shutdown-timeout (30 s here) in a step it will never finish."""
    script = tmp_path / "stuck.py"
    script.write_text(STUCK_PEER)
    p = subprocess.run([str(LAUNCHER), "--standalone", "--nproc-per-node", "2", "--shutdown-timeout", "30",
                        "--no-python", PY, str(script), str(tmp_path / "ck")],
                       env=child_env(), capture_output=True, text=True, timeout=60)
    took = since_logged(p.stderr, r"rank 1 \(local rank 1\) exited with code 3", time.time())
    assert "rank 0 stuck" in p.stdout and "exited with code 3" in p.stderr, describe(p)
    assert p.returncode != 0 and "still running" not in p.stderr, describe(p)
    assert took < 10, f"the launcher took {took:.1f} s: the stuck worker waited for SIGKILL\n{describe(p)}"


# ---- torch ----


def test_torch_save_and_restore_at_another_world_size(tmp_path: Path) -> None:
    """torch.save through writer.path (16 MB, hashed in pieces), restored by 2
    ranks from a 4-rank checkpoint: model.pt is rank 0's, replicated."""
    need_torch()
    d = tmp_path / "ck"
    elems = str(4 << 20)
    p = run(launch_cmd(4, "worker_ckpt.py", "--dir", str(d), "--steps", "2", "--every", "2",
                       "--torch-elems", elems), timeout=90)
    assert p.returncode == 0, describe(p)
    listed = check_layout(d / "step-000000000002", 2, 4)
    assert set(listed) == {"r0-model.pt", "r0-rank.pt", "r1-rank.pt", "r2-rank.pt", "r3-rank.pt"}
    assert listed["r0-model.pt"][0] > 16 << 20
    p = run(launch_cmd(2, "worker_ckpt.py", "--dir", str(d), "--steps", "0", "--torch-elems", elems), timeout=90)
    assert p.returncode == 0, describe(p)
    for r in range(2):
        assert f"rank {r} loaded model.pt of {elems} and rank.pt of rank {r}" in lines(p.stdout), describe(p)
    assert len(matches(p.stdout, r"rank \d restored 2")) == 2


def test_torchrun_agreement_over_torch_distributed(tmp_path: Path) -> None:
    need_torch()
    d, pids = tmp_path / "ck", tmp_path / "pids"
    pids.mkdir()
    # --redirects/--tee 1: torch 1.13's default "0" maps to None under Python 3.11
    # (IntFlag iteration skips zero), and torchrun fails before starting a worker
    cmd = [PY, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
           "--redirects", "1", "--tee", "1", "--log_dir", str(tmp_path / "logs"),
           str(HERE / "worker_torchrun.py"), str(d), str(pids)]
    proc = subprocess.Popen(cmd, env=child_env(GPULAUNCH_GRACE_S="5"), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 60
        while not all((pids / f"pid-{r}").exists() for r in range(2)):
            assert proc.poll() is None and time.monotonic() < deadline, "workers never got to step 2"
            time.sleep(0.05)
        time.sleep(0.05)  # the pid file may be empty for an instant
        os.kill(int((pids / "pid-1").read_text()), signal.SIGTERM)  # one worker only
        out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    p = subprocess.CompletedProcess(cmd, proc.returncode, out, err)
    before = matches(out, r"rank (\d) before init_process_group: GPL_ERR_STATE: (.*)")
    assert len(before) == 2 and all("init_process_group()" in m[2] for m in before), describe(p)
    assert len(matches(out, r"rank \d comm backend external world 2")) == 2, describe(p)
    at = {int(m[1]): int(m[2]) for m in matches(out, r"rank (\d) preempted at (\d+)")}
    assert sorted(at) == [0, 1] and at[0] == at[1], describe(p)
    check_layout(d / f"step-{at[0]:012d}", at[0], 2)
    assert err.count("cloud preemption notices and checkpoint requests from other nodes") == 2, describe(p)


def test_without_torch_under_torchrun_env_says_what_to_do(tmp_path: Path) -> None:
    """Under another launcher with no process group: a clear Error, not a hang."""
    code = (
        "import sys, gpulaunch\n"
        "ck = gpulaunch.Checkpointer(sys.argv[1], handle_sigterm=False)\n"
        "try:\n    ck.restore(lambda r: None)\n"
        "except gpulaunch.Error as e:\n    print('ERR', e.name, e)\n"
    )
    p = subprocess.run([PY, "-c", code, str(tmp_path / "ck")], capture_output=True, text=True, timeout=60,
                       env=child_env(RANK="1", WORLD_SIZE="2", LOCAL_RANK="1", LOCAL_WORLD_SIZE="2"))
    assert p.returncode == 0, describe(p)
    assert "ERR GPL_ERR_STATE" in p.stdout, describe(p)
    assert ("init_process_group()" in p.stdout) == HAVE_TORCH and ("torch is not installed" in p.stdout) != HAVE_TORCH
    assert p.stderr.count("cloud preemption notices") == 1, describe(p)



def test_progress_outside_gpulaunch_is_a_noop() -> None:
    assert "GPULAUNCH_PROGRESS_SHM" not in os.environ
    gpulaunch.progress(3)  # no launcher: nothing to report to, no error


def test_progress_and_the_ddp_hook_reach_the_slot() -> None:
    """Under the launcher: steps and DDP's all-reduces land in each rank's slot,
    and the hook's gradients equal DDP's own."""
    need_torch()
    got = {}
    for hook in ("0", "1"):
        p = run(launch_cmd(2, "worker_ddp_hook.py"), timeout=120, HOOK=hook)
        assert p.returncode == 0, describe(p)
        found = matches(p.stdout, r"rank (\d) sumsq (\S+) step (\d+) steps (\d+) colls (\d+)")
        assert len(found) == 2, describe(p)
        for m in found:
            assert (m[3], m[4]) == ("5", "5"), describe(p)
            # with the hook every bucket's all-reduce is counted; without it none
            assert (int(m[5]) > 0) == (hook == "1"), describe(p)
        got[hook] = sorted(float(m[2]) for m in found)
    assert got["0"] == pytest.approx(got["1"], rel=1e-9)


def test_hung_python_rank_prints_its_stack(tmp_path: Path) -> None:
    prog = tmp_path / "stuck.py"
    prog.write_text(
        "import os, time\nimport gpulaunch\n"
        "def waiting_for_godot():\n    time.sleep(600)\n"
        "for step in range(1, 11):\n    gpulaunch.progress(step)\n    time.sleep(0.02)\n"
        "if os.environ['RANK'] == '1':\n    waiting_for_godot()\n"
        # rank 0 goes on (an interpreter that imported torch 2.x can take over
        # the 1 s timeout to exit on loaded cores, and would be silent too)
        "while True:\n    step += 1\n    gpulaunch.progress(step)\n    time.sleep(0.02)\n"
    )
    cmd = [str(LAUNCHER), "--standalone", "--nproc-per-node", "2", "--progress-timeout", "1",
           "--no-python", PY, str(prog)]
    p = run(cmd, timeout=60)
    assert p.returncode == 201, describe(p)
    assert "rank 1 (node" in p.stderr and "last step 10" in p.stderr, describe(p)
    assert "in waiting_for_godot" in p.stdout + p.stderr, describe(p)
