"""Live re-formation of sharded state (gpulaunch.ShardedElastic) with
examples/train_fsdp.py --reform under a gpulaunch-rdzv server and three
launchers of two workers each (--nnodes 2:3): HSDP survivors of a killed node
and a joining node take their shards from memory, an FSDP job resharded 4
ways into 6 from memory when a node joins, and FSDP without a replica falls
back to a restart from the checkpoint; live results are bitwise equal to a
restart replay of the same sequence. Needs torch >= 2.6 (fully_shard)."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from test_elastic import HOLD, Job, checkpoint_whole, first_step_after, free_port, job, pids, shas, wait_for  # noqa: F401
from test_fsdp import NO_FSDP2, TRAIN_FSDP, train

from gpulaunch.sharded import _choose

pytestmark = pytest.mark.skipif(bool(NO_FSDP2), reason=NO_FSDP2)


def test_the_agreement_takes_the_newest_step_one_layout_holds_whole() -> None:
    """ShardedElastic's choice among the states the ranks hold ((rank, step,
    (world, rank then, shards))), alone: a layout counts only when every
    shard index is held at one step; the newest such step wins, then the
    layout most ranks hold."""
    fsdp4 = [(r, 10, (4, r, 4)) for r in range(4)]
    assert _choose(fsdp4) == (10, 4, {0: [0], 1: [1], 2: [2], 3: [3]})
    # a reshard 4 -> 6 cut after the survivors' copies ended (the new ranks 4, 5 lost): each
    # survivor holds its 4-way shard and its new 6-way one; only the 4-way layout is whole
    cut = fsdp4 + [(r, 10, (6, r, 6)) for r in range(4)]
    assert _choose(cut) == (10, 4, {0: [0], 1: [1], 2: [2], 3: [3]})
    # ranks 0, 1 ended their copy, 2, 3 were cut: both layouts partial in the new one
    assert _choose(fsdp4 + [(0, 10, (6, 0, 6)), (1, 10, (6, 1, 6))])[:2] == (10, 4)
    # HSDP (2 shards a group): places of two worlds agree on the shard index (rank mod 2)
    hsdp = [(0, 10, (6, 0, 2)), (1, 10, (6, 1, 2)), (2, 10, (4, 2, 2)), (3, 10, (4, 1, 2))]
    assert _choose(hsdp) == (10, 2, {0: [0, 2], 1: [1, 3]})
    # a rank holding two states of one layout (a copy cut after it ended) counts by its first,
    # the one it keeps as the source: here old rank 1's shard, not its new index 0
    assert _choose([(0, 10, (6, 1, 2)), (0, 10, (4, 0, 2)), (1, 10, (6, 2, 2))]) == (10, 2, {0: [1], 1: [0]})
    # a step one group finished (11) is taken when it is whole; ranks behind are refilled
    ahead = [(0, 11, (6, 0, 2)), (1, 11, (6, 1, 2)), (2, 10, (6, 2, 2)), (3, 10, (6, 3, 2))]
    assert _choose(ahead) == (11, 2, {0: [0], 1: [1]})
    assert _choose(ahead[1:]) == (10, 2, {0: [2], 1: [3]})
    # two whole layouts at one step: the one most ranks hold
    assert _choose(fsdp4 + [(0, 10, (2, 0, 2)), (1, 10, (2, 1, 2))])[:2] == (10, 4)
    # nothing whole: a shard lost (FSDP without copies), or shards held at different steps
    assert _choose(fsdp4[:3]) is None
    assert _choose([(0, 10, (2, 0, 2)), (1, 11, (2, 1, 2))]) is None
    assert _choose([]) is None

def kill_the_held_node(job: Job, nodes: list, at: int, ck: Path, ck_copy: Path, ck_step: int = 0,
                       vanish: bool = False) -> tuple:
    """Once rank 4 holds before step `at`, every rank reached it and the
    checkpoint of step ck_step (0: `at`) in ck is whole: copies ck (the restart replay's
    start), SIGKILLs rank 4's node (vanish: SIGSTOPs its launcher and
    workers instead: nothing closes, its heartbeats stop; the caller kills
    it at the end); returns (survivors, their workers' pids, the fault's
    time)."""
    (_, held), = wait_for(job, nodes, rf"^rank 4 holding before step {at}$", 1, 180)
    wait_for(job, nodes, rf"^rank \d+ reached step {at}$", 6, 60)
    checkpoint_whole(job, ck, ck_step or at, ck_copy)
    survivors = [p for p in nodes if p is not held]
    before = {p.name: pids(p) for p in survivors}
    t_kill = time.monotonic()
    if vanish:
        for pid in pids(held):
            os.kill(pid, signal.SIGSTOP)
        held.signal(signal.SIGSTOP)
        return survivors, before, t_kill
    held.signal(signal.SIGKILL)
    held.wait(10)
    return survivors, before, t_kill


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
    survivors, before, t_kill = kill_the_held_node(job, nodes, HOLD, ck, ck_copy)
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
           r"\((\d+) lost\), shards from the memory of (\d+) ranks in ([\d.]+) ms \(the copy ([\d.]+) ms, the build [\d.]+ ms\)$")
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


def test_hsdp_a_node_lost_during_the_shard_copy_re_forms_again_from_memory(job: Job, tmp_path: Path) -> None:
    """A failure during the shard copy. HSDP over 3 nodes x 2 ranks (a node
    is one replica group, --nnodes 1:3): rank 4's node SIGKILLed while the
    job waits for it before step 10; as the survivors' shards are about to
    move into the 4-rank world, rank 2 of that world holds and its node is
    SIGKILLed, the other node's ranks being in the copy. Their copy cut off,
    they re-form again into 2 ranks from what they held before it (step 10:
    no restart, nothing read, 0 lost), and end bitwise equal to a restart
    replay of step 10's checkpoint on 2 ranks."""
    ck, ck_copy = tmp_path / "ck", tmp_path / "ck-at-fault"
    args = ("--mode", "hsdp", "--shard", "2", "--steps", "20", "--print-every", "5")
    ckargs = ("--checkpoint-dir", str(ck), "--checkpoint-every", str(HOLD))
    nodes = [job.node(f"node{i}", "--hold", f"4:{HOLD}", "--hold-copy", "4:2", *args, *ckargs,
                      program=TRAIN_FSDP, nnodes="1:3") for i in range(3)]
    survivors, before, _ = kill_the_held_node(job, nodes, HOLD, ck, ck_copy)
    (_, second), = wait_for(job, survivors, r"^rank 2 holding in the copy$", 1, 120)
    # every rank of the 4-rank world is in the copy: the others wait there for rank 2
    wait_for(job, survivors, rf"^rank \d: moving step {HOLD}'s shards into a world of 4$", 4, 60)
    time.sleep(0.3)
    second.signal(signal.SIGKILL)
    second.wait(10)
    last, = [p for p in survivors if p is not second]
    assert last.wait(180) == 0, job.dump()
    assert pids(last) == before[last.name] and len(before[last.name]) == 2, f"a worker restarted:\n{job.dump()}"
    pat = (r"^rank (\d) \(was \d\): round \d+ re-formed in place, world (\d), going on after step (\d+) "
           r"\((\d+) lost\), shards from the memory of (\d+) ranks")
    got = [m for _, m in last.find(pat)]
    assert sorted((m[1], m[2], m[3], m[4], m[5]) for m in got) == \
        [("0", "2", str(HOLD), "0", "2"), ("1", "2", str(HOLD), "0", "2")], job.dump()
    assert not last.find("loaded into"), f"a checkpoint was read:\n{job.dump()}"
    sha = shas([last])
    assert sorted(sha) == [0, 1] and len(set(sha.values())) == 1, job.dump()
    two = train(2, *args[:4], "--steps", "20", "--checkpoint-dir", str(ck_copy))
    assert two.has(rf"train_fsdp: step {HOLD}'s checkpoint of 6 ranks loaded into 2 \(hsdp\), at sample "
                   rf"{12 * HOLD}"), str(two)
    assert two.sha() == set(sha.values()).pop(), f"the re-formation after a cut copy and a restart differ:\n" \
        f"{job.dump()}\n{two}"


def lose_the_joining_node(job: Job, tmp_path: Path, hold: tuple[str, str], held: str, moving: str) -> None:
    """FSDP over every rank, 2 nodes x 2; a third node joins while rank 0
    holds before step 10 (its checkpoint copied for the replay), started with
    `hold` (a train_fsdp.py option holding the 6-rank world's rank 4 in the
    copy); once rank 4 says `held` and every survivor `moving`, the new node
    is SIGKILLed. The survivors must re-form again into 4 ranks from the
    4-way shards they held, in place (their workers kept), 0 lost, nothing
    read, and end bitwise equal to a restart replay of step 10's checkpoint
    on 4 ranks."""
    ck, ck_copy = tmp_path / "ck", tmp_path / "ck-at-fault"
    args = ("--mode", "fsdp", "--steps", "20", "--print-every", "5")
    ckargs = ("--checkpoint-dir", str(ck), "--checkpoint-every", str(HOLD))
    nodes = [job.node(f"node{i}", "--hold", f"0:{HOLD}", *args, *ckargs, program=TRAIN_FSDP) for i in range(2)]
    wait_for(job, nodes, rf"^rank 0 holding before step {HOLD}$", 1, 180)
    checkpoint_whole(job, ck, HOLD, ck_copy)
    before = {p.name: pids(p) for p in nodes}
    late = job.node("node2", *hold, *args, *ckargs, program=TRAIN_FSDP)
    wait_for(job, [late], rf"^rank 4 holding {held}$", 1, 120)
    wait_for(job, nodes, moving, 4, 60)
    time.sleep(0.3)
    late.signal(signal.SIGKILL)
    late.wait(10)
    for p in nodes:
        assert p.wait(180) == 0, job.dump()
        assert pids(p) == before[p.name] and len(before[p.name]) == 2, f"{p.name} restarted a worker:\n{job.dump()}"
    pat = (r"^rank (\d) \(was \d\): round \d+ re-formed in place, world (\d), going on after step (\d+) "
           r"\((\d+) lost\), shards from the memory of (\d+) ranks")
    got = sorted(m.groups() for p in nodes for _, m in p.find(pat))
    assert got == [(str(r), "4", str(HOLD), "0", "4") for r in range(4)], job.dump()
    assert not any(p.find("loaded into") for p in nodes), f"a checkpoint was read:\n{job.dump()}"
    sha = shas(nodes)
    assert sorted(sha) == [0, 1, 2, 3] and len(set(sha.values())) == 1, job.dump()
    four = train(4, *args[:2], "--steps", "20", "--checkpoint-dir", str(ck_copy))
    assert four.has(rf"train_fsdp: step {HOLD}'s checkpoint of 4 ranks loaded into 4 \(fsdp\), at sample "
                    rf"{12 * HOLD}"), str(four)
    assert four.sha() == set(sha.values()).pop(), f"the re-formation after the new node's loss and a restart " \
        f"differ:\n{job.dump()}\n{four}"


def test_fsdp_a_joining_node_lost_during_the_reshard_re_forms_again_from_memory(job: Job, tmp_path: Path) -> None:
    """A failure during a copy with transfers in flight: the new node's
    rank 4 holds as its shards are about to move, while the survivors, their
    4-way shards being cut into 6-way ones (rows sent to each other and to
    the new ranks), wait for it; its node SIGKILLed, the survivors' copy is
    cut off and they go on from the shards they held before it."""
    lose_the_joining_node(job, tmp_path, ("--hold-copy", "6:4"), "in the copy",
                          rf"^rank \d: moving step {HOLD}'s shards into a world of 6$")


def test_fsdp_a_joining_node_lost_as_its_reshard_ends_re_forms_again_from_memory(job: Job, tmp_path: Path) -> None:
    """A node lost after every survivor's copy ended, before the ranks
    confirmed it: the new node's rank 4 holds once its copy ended. Every
    survivor's 6-way shard is filled, but ranks 4 and 5 held the rest of the
    6-way layout; the survivors keep their 4-way shards until the
    confirmation and go on from those (a survivor that had dropped them
    would hold a layout with shards gone, and the job would restart from the
    checkpoint)."""
    lose_the_joining_node(job, tmp_path, ("--hold-copied", "6:4"), "after its copy",
                          rf"^rank \d: step {HOLD}'s shards moved into a world of 6$")


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
    checkpoint_whole(job, ck, HOLD)
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


def test_fsdp_alone_on_one_rank_re_forms_when_a_node_joins(job: Job, tmp_path: Path) -> None:
    """A world of one (one node, one worker: a job down to its last GPU) has
    no collective that a round's end would fail, FSDP2's being no-ops there.
    A second node of one worker joins while rank 0 holds before step 10: the
    lone rank sees the round's end before its next step, re-forms in place
    and halves its shard for the newcomer from memory, and the job ends
    bitwise equal to a restart replay (1 rank to step 10, then 2 from its
    checkpoint). Before, it trained on alone to the end, never re-forming,
    and its launcher, waiting for it to, restarted it."""
    ck, ck_copy = tmp_path / "ck", tmp_path / "ck-replay"
    args = ("--mode", "fsdp", "--steps", "20", "--print-every", "5")
    ckargs = ("--checkpoint-dir", str(ck), "--checkpoint-every", str(HOLD))
    alone = job.node("node0", "--hold", f"0:{HOLD}", *args, *ckargs, program=TRAIN_FSDP, nnodes="1:2", nproc=1)
    wait_for(job, [alone], rf"^rank 0 holding before step {HOLD}$", 1, 180)
    before = pids(alone)
    late = job.node("node1", *args, *ckargs, program=TRAIN_FSDP, nnodes="1:2", nproc=1)
    for p in (alone, late):
        assert p.wait(180) == 0, job.dump()
    assert pids(alone) == before or not pids(alone), job.dump()
    assert not alone.find("restarting"), f"the lone worker was restarted:\n{job.dump()}"
    got = [m.groups() for _, m in alone.find(r"^rank 0 \(was 0\): round \d+ re-formed in place, world (\d), going on "
                                             r"after step (\d+) \((\d+) lost\)")]
    assert got == [("2", str(HOLD), "0")], job.dump()
    assert late.find(rf"^rank 1: joined round \d+: step {HOLD}'s shards taken from the memory of 1 ranks"), job.dump()
    assert not any(p.find("loaded into") for p in (alone, late)), f"a checkpoint was read:\n{job.dump()}"
    sha = shas([alone, late])
    assert sorted(sha) == [0, 1] and len(set(sha.values())) == 1, job.dump()
    train(1, *args[:2], "--steps", str(HOLD), "--checkpoint-dir", str(ck_copy), "--checkpoint-every", str(HOLD))
    two = train(2, *args[:2], "--steps", "20", "--checkpoint-dir", str(ck_copy))
    assert two.has(rf"train_fsdp: step {HOLD}'s checkpoint of 1 ranks loaded into 2 \(fsdp\), at sample "
                   rf"{12 * HOLD}"), str(two)
    assert two.sha() == set(sha.values()).pop(), f"live resharding and restart differ:\n{job.dump()}\n{two}"


def test_a_step_stuck_in_an_fsdp_collective_is_freed_without_a_restart(tmp_path: Path) -> None:
    """FSDP2 on Gloo waits for its collectives in the training thread, where
    a transfer cut mid-way holds it until the group's timeout (a survivor of
    a lost node, seen restarted after 5 s). ShardedElastic routes them
    through its round guard: three real ranks train, then rank 2 stays
    connected and silent; the guard failed 1 s later frees ranks 0 and 1 from
    the step at once, the group with the work still running is parked, not
    joined, and they train on in a new group. Without the guard (the
    control), the step is still held 4 s after that."""
    worker = Path(__file__).resolve().parent / "worker_fsdpfree.py"
    for mode in ("guard", "plain"):
        ports = [str(free_port()), str(free_port())]
        logs = [tmp_path / f"{mode}-{r}.log" for r in range(3)]
        procs = [subprocess.Popen([sys.executable, str(worker), str(r), *ports, mode], stdout=log.open("w"),
                                  stderr=subprocess.STDOUT) for r, log in enumerate(logs)]
        try:
            if mode == "guard":
                for p in procs[:2]:
                    p.wait(90)
                for r, (p, log) in enumerate(zip(procs, logs)):
                    if r == 2:
                        continue
                    out = log.read_text()
                    assert p.returncode == 0, out
                    freed = re.search(rf"^rank {r}: the step was freed after ([\d.]+) s: round 1 ended$", out, re.M)
                    assert freed and 0.9 <= float(freed.group(1)) < 2.0, out
                    again = re.search(rf"^rank {r}: the next step failed at once \(([\d.]+) s\): round 1 ended$",
                                      out, re.M)
                    assert again and float(again.group(1)) < 0.5, out
                    assert re.search(rf"^rank {r}: [1-9]\d* work\(s\) still running in [1-9] group", out, re.M), out
                    gone = re.search(rf"^rank {r}: the group destroyed in ([\d.]+) s$", out, re.M)
                    assert gone and float(gone.group(1)) < 2.0, out
                    assert f"rank {r}: 3 steps of 2 ranks in a new group" in out, out
            else:
                until = time.monotonic() + 90
                while not all(f"rank {r}: a step of 3 ranks" in logs[r].read_text() for r in range(2)):
                    assert time.monotonic() < until and all(p.poll() is None for p in procs), \
                        [log.read_text() for log in logs]
                    time.sleep(0.1)
                time.sleep(1.0 + 4.0)  # the guard's fail (not installed) and 4 s more
                for p, log in zip(procs[:2], logs):
                    assert p.poll() is None and "freed" not in log.read_text(), log.read_text()
        finally:
            for p in procs:
                p.kill()
                p.wait()
