"""A rank of a 4-rank job under gpulaunch: every collective of gpulaunch.Comm
on every kind of buffer, checked against exact expected values. Prints
"rank R PASS collectives" at the end; any mismatch raises (exit 1)."""

from __future__ import annotations

import array
import sys
import time
from typing import Any, Callable

import numpy as np

import gpulaunch

WORLD = 4


def expect_error(kind: type[BaseException], words: str, call: Callable[[], None]) -> None:
    try:
        call()
    except kind as e:
        assert words in str(e), f"{kind.__name__} without {words!r}: {e}"
        return
    raise AssertionError(f"no {kind.__name__} ({words!r})")


def check_numpy(comm: gpulaunch.Comm, r: int) -> None:
    for dt in (np.float32, np.float64, np.float16, np.int32, np.int64):
        a = np.array([r + 1, 10 * (r + 1), -(r + 1), 4 * (r + 1)], dtype=dt)
        comm.allreduce(a, "sum")
        assert a.tolist() == [10, 100, -10, 40], (dt, a)
        a = np.array([r, -r, 7, 1], dtype=dt)
        comm.allreduce(a, "max")
        assert a.tolist() == [3, 0, 7, 1], (dt, a)
        a = np.array([r, -r, 7, r + 1], dtype=dt)
        comm.allreduce(a, "min")
        assert a.tolist() == [0, -3, 7, 1], (dt, a)
        a = np.array([r + 1, 2], dtype=dt)
        comm.allreduce(a, "prod")
        assert a.tolist() == [24, 16], (dt, a)
        a = np.array([4 * (r + 1), -8 * (r + 1)], dtype=dt)
        comm.allreduce(a, "avg")
        assert a.tolist() == [10, -20], (dt, a)
        if np.issubdtype(dt, np.floating):
            a = np.array([r + 1, 0.5 * (r + 1)], dtype=dt)
            comm.allreduce(a, "avg")
            assert a.tolist() == [2.5, 1.25], (dt, a)
    # large enough for the bandwidth path; integers stay exact in any order
    n = 300_001
    a = np.arange(n, dtype=np.float32) + r
    comm.allreduce(a)
    assert np.array_equal(a, 4 * np.arange(n, dtype=np.float32) + 6), "large float32 sum"
    b = np.arange(n, dtype=np.int64) * (r + 1) - (1 << 40)
    comm.allreduce(b, "sum")
    assert np.array_equal(b, np.arange(n, dtype=np.int64) * 10 - 4 * (1 << 40)), "large int64 sum"
    m = np.full((3, 5), float(r), dtype=np.float64)  # 2-D, C-contiguous
    comm.allreduce(m, "max")
    assert (m == 3.0).all()
    expect_error(TypeError, "read-only", lambda: comm.allreduce(_ro()))
    expect_error(ValueError, "not C-contiguous", lambda: comm.allreduce(np.zeros((4, 4), np.float32)[:, 1]))
    expect_error(TypeError, "float32, float64", lambda: comm.allreduce(np.zeros(4, np.uint32)))


def _ro() -> Any:
    a = np.zeros(2, np.float32)
    a.setflags(write=False)
    return a


def check_stdlib(comm: gpulaunch.Comm, r: int) -> None:
    for code, vals in (("f", [r + 0.5, -r]), ("d", [r + 0.25, 2.0**1000]), ("i", [r, -r]), ("q", [r << 40, 1])):
        a = array.array(code, vals)
        comm.allreduce(a, "sum")
        want = {"f": [8.0, -6.0], "d": [7.0, 2.0**1002], "i": [6, -6], "q": [6 << 40, 4]}[code]
        assert a.tolist() == want, (code, a)
    # an array.array whose memory is a bytearray's (through a memoryview cast)
    raw = bytearray(array.array("i", [r, 2 * r, 3]).tobytes())
    mv = memoryview(raw).cast("i")
    comm.allreduce(mv, "max")
    del mv
    assert array.array("i", bytes(raw)).tolist() == [3, 6, 3]
    expect_error(TypeError, "read-only", lambda: comm.allreduce(b"\0\0\0\0"))
    expect_error(TypeError, "no reduction dtype", lambda: comm.allreduce(bytearray(8)))
    expect_error(ValueError, "not one of sum, prod, min, max, avg", lambda: comm.allreduce(array.array("f", [1.0]), "mean"))
    expect_error(TypeError, "not a buffer", lambda: comm.allreduce([1.0, 2.0]))
    # odd sizes through the 4-byte words and the tail
    for n in (0, 1, 3, 7, 1001, 1_000_003):
        root = n % WORLD
        b = bytearray((i * 7 + root) % 251 for i in range(n)) if r == root else bytearray(n)
        comm.broadcast(b, root=root)
        assert b == bytearray((i * 7 + root) % 251 for i in range(n)), f"broadcast of {n} bytes"
    f = np.full(5, float(r))
    comm.broadcast(f, root=3)
    assert (f == 3.0).all()
    try:
        comm.broadcast(bytearray(4), root=WORLD)
    except gpulaunch.Error as e:
        assert e.name == "GPL_ERR_INVALID_ARG" and "root 4 is not a rank (0..3)" in str(e), e
    else:
        raise AssertionError("broadcast to root 4 of 4 ranks did not fail")
    # the barrier holds everyone until the last rank arrives
    t0 = time.monotonic()
    if r == 3:
        time.sleep(0.4)
    comm.barrier()
    waited = time.monotonic() - t0
    assert waited >= 0.35, f"rank {r} left the barrier after {waited:.3f} s"


def check_torch(comm: gpulaunch.Comm, r: int) -> None:
    import torch

    for dt in (torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.int32, torch.int64):
        t = torch.tensor([r + 1, 10 * (r + 1), -(r + 1)], dtype=dt)
        comm.allreduce(t, "sum")
        assert t.tolist() == [10, 100, -10], (dt, t)
        t = torch.tensor([r, -r, 5], dtype=dt)
        comm.allreduce(t, "max")
        assert t.tolist() == [3, 0, 5], (dt, t)
        t = torch.tensor([4 * (r + 1)], dtype=dt)
        comm.allreduce(t, "avg")
        assert t.tolist() == [10], (dt, t)
        if dt.is_floating_point:
            t = torch.tensor([0.5 * (r + 1)], dtype=dt)
            comm.allreduce(t, "avg")
            assert t.tolist() == [1.25], (dt, t)
    big = torch.arange(200_000, dtype=torch.float32) * (r + 1)
    comm.allreduce(big)
    assert torch.equal(big, torch.arange(200_000, dtype=torch.float32) * 10)
    s = torch.full((2, 3), float(r))[:, 1:]  # a view that starts at an offset, contiguous rows only
    expect_error(ValueError, "not contiguous", lambda: comm.allreduce(s))
    expect_error(ValueError, "not contiguous", lambda: comm.allreduce(torch.zeros(4, 4).t()))
    expect_error(TypeError, "no reduction dtype", lambda: comm.allreduce(torch.zeros(4, dtype=torch.uint8)))
    row = torch.zeros(3, 4)[1]  # contiguous, at an offset: data_ptr() is where it starts
    row += r
    comm.allreduce(row)
    assert row.tolist() == [6.0] * 4
    u = torch.arange(5, dtype=torch.uint8) + (10 if r == 1 else 0)  # no reduction dtype: moved as bytes
    comm.broadcast(u, root=1)
    assert u.tolist() == [10, 11, 12, 13, 14]


def main() -> int:
    use_torch = "--torch" in sys.argv
    with gpulaunch.Comm("cpu") as comm:
        r = comm.rank
        assert comm.world_size == WORLD and comm.local_world_size == WORLD and comm.local_rank == r
        assert comm.backend == "cpu"
        check_numpy(comm, r)
        check_stdlib(comm, r)
        if use_torch:
            check_torch(comm, r)
    expect_error(gpulaunch.Error, "closed", lambda: comm.barrier())
    # communicators made after one was closed, and two alive at once: each
    # has its own shared memory (never the closed one's name)
    for i in range(3):
        with gpulaunch.Comm("cpu") as c2, gpulaunch.Comm("cpu") as c3:
            a = array.array("d", [r + 1.0 + i])
            c2.allreduce(a, "sum")
            b = array.array("d", [2.0 * r])
            c3.allreduce(b, "sum")
            assert (a[0], b[0]) == (10.0 + 4 * i, 12.0), (i, a[0], b[0])
    print(f"rank {r} PASS collectives{' torch' if use_torch else ''}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
