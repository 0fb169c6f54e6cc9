"""The frameworks people train with, under gpulaunch on 2 launchers x 2
workers (static ranks on this host): PyTorch Lightning and Hugging Face
Accelerate see the launcher's world and end with equal parameters on every
rank; a program using torch.distributed.elastic's @record has its failure
reported with the worker's own message and traceback. They skip visibly where
the interpreter lacks the framework (Debian's; scripts/torch2.sh's has them)."""

from __future__ import annotations

import importlib.util
import os
import re
import socket
import subprocess
import sys
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
BUILD = Path(os.environ.get("GPULAUNCH_BUILD_DIR", REPO / "build" / "test"))
LAUNCHER = BUILD / "launcher" / "gpulaunch"


def need(module: str) -> None:
    if importlib.util.find_spec(module) is None:
        pytest.skip(f"{module} is not installed for {sys.executable} (scripts/torch2.sh installs it)")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def env() -> dict[str, str]:
    e = {k: v for k, v in os.environ.items() if not k.startswith(("GPULAUNCH_", "PET_"))}
    e.update(PYTHON_EXEC=sys.executable, PET_SHM_MIN="16m", PET_PREEMPTION_SOURCE="none",
             PET_SLURM="off", PYTHONUNBUFFERED="1", OMP_NUM_THREADS="1")
    return e


def two_nodes(script: str, *args: str, timeout: float = 240) -> list[subprocess.CompletedProcess[str]]:
    """Both launchers of a 2-node job, each with 2 workers; their results."""
    port = str(free_port())
    procs = [subprocess.Popen([str(LAUNCHER), "--nnodes", "2", "--node-rank", str(n),
                               "--nproc-per-node", "2", "--master-addr", "127.0.0.1",
                               "--master-port", port, str(HERE / script), *args],
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env())
             for n in (0, 1)]
    out = []
    for p in procs:
        try:
            so, _ = p.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            p.kill()
            so, _ = p.communicate()
        out.append(subprocess.CompletedProcess(p.args, p.returncode, so, ""))
    return out


def ranks_agree(out: list[subprocess.CompletedProcess[str]], pattern: str) -> list[re.Match[str]]:
    for p in out:
        assert p.returncode == 0, p.stdout
    seen = [m for p in out for m in re.finditer(pattern, p.stdout)]
    assert sorted(int(m["rank"]) for m in seen) == [0, 1, 2, 3], "\n".join(p.stdout for p in out)
    assert len({m["sha"] for m in seen}) == 1, "parameters differ:\n" + "\n".join(p.stdout for p in out)
    return seen


def test_lightning_ddp_on_two_nodes() -> None:
    need("lightning")
    out = two_nodes("fw_lightning.py", "2")
    seen = ranks_agree(out, r"rank (?P<rank>\d) of (?P<world>\d+) node (?P<node>\d) env (?P<env>\w+) "
                            r"params_sha256 (?P<sha>[0-9a-f]{64})")
    for m in seen:
        assert m["world"] == "4" and m["env"] == "TorchElasticEnvironment", m.group(0)
        assert int(m["node"]) == int(m["rank"]) // 2, m.group(0)


def test_accelerate_on_two_nodes() -> None:
    need("accelerate")
    out = two_nodes("fw_accelerate.py")
    seen = ranks_agree(out, r"rank (?P<rank>\d) of (?P<world>\d+) local (?P<local>\d) type (?P<type>\w+) "
                            r"params_sha256 (?P<sha>[0-9a-f]{64})")
    for m in seen:
        assert m["world"] == "4" and m["type"] == "MULTI_CPU", m.group(0)
        assert int(m["local"]) == int(m["rank"]) % 2, m.group(0)


def test_record_failure_is_reported_with_its_message_and_traceback() -> None:
    need("torch")
    out = two_nodes("fw_record.py", timeout=120)
    failed = [p for p in out if "rank       : 1 (local rank 1)" in p.stdout]
    assert len(failed) == 1, "\n".join(p.stdout for p in out)
    report = failed[0].stdout
    assert failed[0].returncode == 1, report
    # the message on one line, the traceback as lines, not the file's escaped JSON
    assert "error      : FileNotFoundError: rank 1: shard-00001.bin is missing from the data set" in report, report
    assert re.search(r"\n +Traceback \(most recent call last\):\n", report), report
    assert re.search(r"\n +File \".*fw_record.py\", line \d+, in load_shard\n", report), report
    assert "\\n" not in report.split("error file :")[1].split("last stderr lines")[0], report
    assert re.search(r"error file : \S+error-1\.json\n", report), report
