"""FSDP over every rank kept in place through a lost node by copies of each
rank's shards in a peer's memory (ShardedElastic(mirror_every=K), gpl_mirror):
examples/train_fsdp.py --reform --mirror-every 4 under a gpulaunch-rdzv server
and three launchers of two workers each (--nnodes 2:3). Needs torch >= 2.6
(fully_shard)."""

from __future__ import annotations

import os
import signal
from pathlib import Path

import pytest
from test_elastic import Job, first_step_after, job, pids, shas  # noqa: F401
from test_fsdp import NO_FSDP2, TRAIN_FSDP, train
from test_fsdp_live import kill_the_held_node

pytestmark = pytest.mark.skipif(bool(NO_FSDP2), reason=NO_FSDP2)


@pytest.mark.parametrize("fault", ["killed", "vanished"])
def test_fsdp_node_lost_goes_back_to_the_copies_in_peers_memory_as_a_restart_would(
        job: Job, tmp_path: Path, fault: str) -> None:
    """FSDP over every rank with --mirror-every 4: each rank's shards are
    copied to the same local rank on the next node every 4 steps. A node
    killed (or vanished: its launcher and workers stopped, nothing closed,
    found by the heartbeat timeout) while the job waits for its rank 4
    before step 14: the survivors
    keep their processes, go back to step 12 (2 steps lost) from their own
    snapshots and the killed ranks' copies at their buddies, reshard 6 ways
    into 4 in memory (nothing read from storage) and end bitwise equal to a
    restart from step 12's checkpoint into 4 ranks."""
    ck, ck_copy = tmp_path / "ck", tmp_path / "ck-at-fault"
    at = 14
    args = ("--mode", "fsdp", "--steps", "20", "--print-every", "5", "--mirror-every", "4")
    ckargs = ("--checkpoint-dir", str(ck), "--checkpoint-every", "4")
    nodes = [job.node(f"node{i}", "--hold", f"4:{at}", *args, *ckargs, program=TRAIN_FSDP) for i in range(3)]
    survivors, before, t_kill = kill_the_held_node(job, nodes, at, ck, ck_copy, ck_step=12,
                                                   vanish=fault == "vanished")
    held = next(p for p in nodes if p not in survivors)
    for p in survivors:
        assert p.wait(180) == 0, job.dump()
    if fault == "vanished":
        for pid in pids(held):
            os.kill(pid, signal.SIGKILL)
        held.signal(signal.SIGKILL)
        held.wait(10)
    took = first_step_after(job, survivors, 4, t_kill)
    for p in survivors:
        assert pids(p) == before[p.name] and len(before[p.name]) == 2, f"{p.name} restarted a worker:\n{job.dump()}"
    pat = (r"^rank (\d+) \(was \d+\): round \d+ re-formed in place, world 4, going on after step (\d+) "
           r"\((\d+) lost\), shards from the copies in peers' memory in ([\d.]+) ms \(the copy ([\d.]+) ms, the build [\d.]+ ms\)$")
    got = [m for p in survivors for _, m in p.find(pat)]
    assert len(got) == 4 and {(m[2], m[3]) for m in got} == {("12", "2")}, job.dump()
    assert not any(p.find("loaded into") for p in survivors), f"a checkpoint was read:\n{job.dump()}"
    sha = shas(survivors)
    assert sorted(sha) == [0, 1, 2, 3] and len(set(sha.values())) == 1, job.dump()

    four = train(4, *args[:2], "--steps", "20", "--checkpoint-dir", str(ck_copy))
    assert four.has(r"train_fsdp: step 12's checkpoint of 6 ranks loaded into 4 \(fsdp\), at sample 144"), str(four)
    assert four.sha() == set(sha.values()).pop(), f"live (copies) and restart differ:\n{job.dump()}\n{four}"
    print(f"test_fsdp: FSDP node {fault}, copies in peers' memory: first step in the 4-rank world {took:.2f} s "
          f"after the fault; re-formation {', '.join(m[4] for m in got)} ms (copies {', '.join(m[5] for m in got)} ms)")
