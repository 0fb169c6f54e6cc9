"""gpulaunch as the entrypoint (PID 1) of a real container: the image of
examples/container/Containerfile built by podman (scripts/container_image.sh),
the training program mounted in. Run by scripts/test.sh after the wheel is
built, as root; GPULAUNCH_TEST_IMAGE names the image. A machine where the
engine cannot run fails here with the reason (it does not skip)."""

from __future__ import annotations

import os
import re
import subprocess
import time
import uuid
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
JOB = HERE
IMAGE = os.environ.get("GPULAUNCH_TEST_IMAGE", "")
ENGINE = ["podman"]
RUN_OPTS = ["--runtime", "runc", "--network", "none", "--ulimit", "nofile=4096:4096",
            "--ulimit", "nproc=4096:4096"]


@pytest.fixture(autouse=True)
def need_image() -> None:
    if not IMAGE:
        pytest.fail("GPULAUNCH_TEST_IMAGE is not set: scripts/test.sh builds the image with "
                    "scripts/container_image.sh")


def podman(*args: str, timeout: float = 120, check: bool = False) -> subprocess.CompletedProcess[str]:
    p = subprocess.run(ENGINE + list(args), capture_output=True, text=True, timeout=timeout)
    if check:
        assert p.returncode == 0, f"podman {' '.join(args)}: {p.stdout}{p.stderr}"
    return p


def run_args(ck: Path, name: str, shm: str | None, *job: str) -> list[str]:
    a = ["--name", name, *RUN_OPTS, "-v", f"{JOB}:/job:ro", "-v", f"{ck}:/ck"]
    if shm:
        a += ["--shm-size", shm]
    return [*a, IMAGE, "--standalone", "--nproc-per-node", "2", *job]


def shas(out: str) -> set[str]:
    found = dict(re.findall(r"rank (\d) params_sha256 ([0-9a-f]{64})", out))
    assert sorted(found) == ["0", "1"], out
    return set(found.values())


def test_default_dev_shm_is_refused_with_the_fix(tmp_path: Path) -> None:
    name = f"gpl-{uuid.uuid4().hex[:8]}"
    p = podman("run", "--rm", *run_args(tmp_path, name, None, "/job/train_job.py", "5", "/ck"))
    out = p.stdout + p.stderr
    assert p.returncode == 3, out
    assert re.search(r"FAIL /dev/shm is 6\d MiB, under --shm-min", out) and "--shm-size" in out, out
    assert "nothing was started" in out, out


def test_stop_checkpoints_every_rank_and_restart_resumes_bitwise(tmp_path: Path) -> None:
    ck, ref = tmp_path / "ck", tmp_path / "ref"
    ck.mkdir()
    ref.mkdir()
    name = f"gpl-{uuid.uuid4().hex[:8]}"
    podman("run", "-d", *run_args(ck, name, "1100m", "/job/train_job.py", "400", "/ck", "0.02"),
           check=True)
    try:
        deadline = time.time() + 60
        while "step" not in "".join(p.name for p in ck.iterdir()) and time.time() < deadline:
            time.sleep(0.2)  # the first periodic checkpoint: training runs
        t0 = time.time()
        podman("stop", "-t", "30", name, check=True)
        took = time.time() - t0
        code = podman("inspect", name, "--format", "{{.State.ExitCode}}", check=True).stdout.strip()
        logs = podman("logs", name).stdout + podman("logs", name).stderr
        assert code == "143", logs
        assert took < 5, f"podman stop took {took:.1f} s (grace 30 s)"
        steps = set(re.findall(r"rank \d preempted after step (\d+)", logs))
        assert len(steps) == 1 and len(re.findall(r"preempted after step", logs)) == 2, logs
        step = steps.pop()
        assert (ck / f"step-{int(step):012d}" / "COMPLETE").exists(), logs
        again = podman("start", "-a", name, timeout=180)
        assert again.returncode == 0, again.stdout + again.stderr
        assert f"resumed from the checkpoint of step {step}" in again.stdout + again.stderr
        got = shas(again.stdout + again.stderr)
    finally:
        podman("rm", "-f", name)
    want = podman("run", "--rm", *run_args(ref, name + "r", "1100m", "/job/train_job.py", "400",
                                           "/ck", "0"), timeout=180)
    assert want.returncode == 0, want.stdout + want.stderr
    assert got == shas(want.stdout + want.stderr) and len(got) == 1
    print(f"podman stop -t 30: exit 143 after {took:.2f} s, every rank saved step {step}; "
          "the restarted container resumed there and ended bitwise equal")


def test_pid_1_reaps_orphans_and_its_exit_code_is_the_containers(tmp_path: Path) -> None:
    """A worker that leaves a child behind is killed: the child, now PID 1's,
    is reaped when it ends; with no restarts left the container exits 137."""
    name = f"gpl-{uuid.uuid4().hex[:8]}"
    prog = "sleep 2 & echo worker $$ up; exec sleep 300"
    podman("run", "-d", "--name", name, *RUN_OPTS, "--shm-size", "1100m", IMAGE, "--standalone",
           "--nproc-per-node", "1", "--max-restarts", "1", "--no-python", "/bin/sh", "-c", prog,
           check=True)
    try:
        def worker_pid() -> int:
            for _ in range(100):
                m = re.findall(r"worker (\d+) up", podman("logs", name).stdout + podman("logs", name).stderr)
                if m:
                    return int(m[-1])
                time.sleep(0.1)
            raise AssertionError("the worker did not start")

        first = worker_pid()
        podman("exec", name, "sh", "-c", f"kill -9 {first}", check=True)  # its `sleep 2` is orphaned
        time.sleep(3.5)  # the orphan has ended; the launcher restarted the worker
        states = podman("exec", name, "sh", "-c",
                        "for s in /proc/[0-9]*/stat; do cut -d' ' -f1-4 $s; done", check=True).stdout
        # PID 1's zombies only: the restarted worker's own `sleep 2` may have
        # ended by now too, a zombie of its parent (`sleep 300` never waits)
        zombies = [l for l in states.splitlines() if l.split()[2:4] == ["Z", "1"]]
        assert not zombies, states
        assert "1 (gpulaunch)" in states, states
        second = worker_pid()
        assert second != first
        podman("exec", name, "sh", "-c", f"kill -9 {second}", check=True)  # no restarts left
        code = podman("wait", name, timeout=60).stdout.strip()
        assert code == "137", podman("logs", name).stderr
    finally:
        podman("rm", "-f", name)
