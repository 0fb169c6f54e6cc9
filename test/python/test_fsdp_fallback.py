"""When the survivors of a sharded job do not hold every shard, the job
restarts from the checkpoint, resharded: HSDP over 4 nodes x 2 ranks with
replica groups of 4 ranks (two nodes each), and the two nodes that hold shards
2 and 3 of both groups killed together. Needs torch >= 2.6 (fully_shard)."""

from __future__ import annotations

import signal
from pathlib import Path

import pytest
from test_elastic import HOLD, Job, checkpoint_whole, job, shas, wait_for  # noqa: F401
from test_fsdp import NO_FSDP2, TRAIN_FSDP, train

pytestmark = pytest.mark.skipif(bool(NO_FSDP2), reason=NO_FSDP2)


def test_hsdp_both_holders_of_a_shard_lost_restart_from_the_checkpoint_resharded(job: Job, tmp_path: Path) -> None:
    """Ranks r and r + 4 hold shard r % 4; the nodes of ranks 2-3 and 6-7
    (shards 2 and 3 in each group) are killed together while the job waits for them
    before step 10. The survivors say which shards are gone, their launchers
    restart the workers, which restore step 10's checkpoint of 8 ranks into 4
    (HSDP 1 x 4); the result is bitwise equal to a restart replay from a copy
    of that checkpoint."""
    ck, ck_copy = tmp_path / "ck", tmp_path / "ck-at-fault"
    args = ("--mode", "hsdp", "--shard", "4", "--global-batch", "24", "--steps", "20", "--print-every", "5")
    ckargs = ("--checkpoint-dir", str(ck), "--checkpoint-every", str(HOLD))
    # rank 6 (a rank of the 8-rank world only: the restarted workers do not hold) stops
    # everyone before step HOLD; the node of ranks 2-3 is found by its round line
    nodes = [job.node(f"node{i}", "--hold", f"6:{HOLD}", *args, *ckargs, program=TRAIN_FSDP, nnodes="2:4")
             for i in range(4)]
    (_, six), = wait_for(job, nodes, rf"^rank 6 holding before step {HOLD}$", 1, 240)
    two = [p for p in nodes if p.find(r"ranks 2-3 of 8")]
    held = {six, *two}
    assert len(held) == 2, job.dump()
    wait_for(job, nodes, rf"^rank \d+ reached step {HOLD}$", 8, 60)
    checkpoint_whole(job, ck, HOLD, ck_copy)
    # "together" as the rendezvous sees it: stopped while both nodes die, it reads both
    # connections' ends in one pass, so the survivors re-form once, into 4 ranks. Killed
    # one after the other (tens of ms apart on a loaded machine), the survivors would
    # first re-form into 6 ranks, which HSDP's groups of 4 cannot use.
    job.rdzv.signal(signal.SIGSTOP)
    try:
        for p in held:
            p.signal(signal.SIGKILL)
        for p in held:
            p.p.wait(timeout=30)
    finally:
        job.rdzv.signal(signal.SIGCONT)
    survivors = [p for p in nodes if p not in held]
    for p in survivors:
        assert p.wait(240) == 0, job.dump()
    text = "\n".join(p.text() for p in survivors)
    assert "shards [2, 3] of the state (4-way sharded) were held only by ranks that are gone" in text, job.dump()
    assert f"train_fsdp: step {HOLD}'s checkpoint of 8 ranks loaded into 4 (hsdp)" in text, job.dump()
    sha = shas(survivors)
    assert sorted(sha) == [0, 1, 2, 3] and len(set(sha.values())) == 1, job.dump()
    four = train(4, *args[:6], "--steps", "20", "--checkpoint-dir", str(ck_copy))
    assert four.sha() == set(sha.values()).pop(), f"the fallback and a restart differ:\n{job.dump()}\n{four}"
