"""Small collectives of one group published together in one step on the host backend (PYCOLL_HOST_GROUP_BATCH).

A group's small all_reduce, reduce, broadcast, all_gather and gather on one communicator are published in one
step of the segment when every rank has the same ones in its group; otherwise they run one by one. Whether a
group took one step is seen through the failpoint ``host.coll.after_arrive`` (passed once per step): armed
with ``raise@2`` on every rank, a group of four batched operations passes it once and succeeds, the same
operations one by one fail at the second. Results are checked against a simulation of every rank's buffers
in program order (exact: unsigned integers wrap the same in numpy and C, max/min of floats are exact), with
each rank choosing its own group boundaries.
"""

from __future__ import annotations

import os
import random
import time

import numpy as np
import pytest
from helpers.mp import Died, run_ranks

import pycoll
from pycoll import _bindings as B

pytestmark = pytest.mark.timeout(120)

BUFFERS = 6  # per rank, each room for `size` x the largest count
MAX_COUNT = 64
KINDS = ["all_reduce", "reduce", "broadcast", "all_gather", "gather", "reduce_scatter", "large_all_reduce"]
TYPES = [("uint32", ["sum", "prod", "max", "min"]), ("float32", ["max", "min"]), ("uint8", ["sum", "max"])]


def _uid() -> bytes:
    return bytes(B.load("host").get_unique_id())


def _program(n, seed, length):
    """The operations every rank issues, in order: (kind, src, dst, count, dtype, op, root)."""
    rng = random.Random(seed)
    prog = []
    for _ in range(length):
        kind = rng.choice(KINDS)
        dtype, ops = rng.choice(TYPES)
        count = 12000 if kind == "large_all_reduce" else rng.randint(1, MAX_COUNT)  # 48 KB: past ONESHOT_MAX
        src = rng.randrange(BUFFERS)
        in_place = kind in ("all_reduce", "reduce", "broadcast") and rng.random() < 0.3
        dst = src if in_place else rng.choice([b for b in range(BUFFERS) if b != src])
        prog.append((kind, src, dst, count, dtype, rng.choice(ops), rng.randrange(n)))
    return prog


def _initial(n, seed):
    """Every rank's buffers, by dtype: [rank][buffer] arrays of n * 12000 elements."""
    out = {}
    for dtype, _ in TYPES:
        rng = np.random.default_rng(seed)
        hi = 4 if dtype == "uint8" else 1000
        out[dtype] = [[rng.integers(0, hi, n * 12000).astype(dtype) for _ in range(BUFFERS)] for _ in range(n)]
    return out


_NP = {"sum": np.add, "prod": np.multiply, "max": np.maximum, "min": np.minimum}


def _simulate(n, prog, bufs):
    """The program applied to every rank's buffers (NCCL's semantics, in rank order)."""
    for kind, src, dst, count, dtype, op, root in prog:
        b = bufs[dtype]
        ins = [b[r][src][:count * (n if kind == "reduce_scatter" else 1)].copy() for r in range(n)]
        if kind in ("all_reduce", "large_all_reduce", "reduce", "reduce_scatter"):
            acc = ins[0]
            for r in range(1, n):
                acc = _NP[op](acc, ins[r]).astype(dtype)
            for r in range(n):
                if kind == "reduce_scatter":
                    b[r][dst][:count] = acc[r * count:(r + 1) * count]
                elif kind != "reduce" or r == root:
                    b[r][dst][:count] = acc
        elif kind == "broadcast":
            for r in range(n):
                b[r][dst][:count] = ins[root]
        else:  # all_gather, gather
            cat = np.concatenate(ins)
            for r in range(n):
                if kind == "all_gather" or r == root:
                    b[r][dst][:n * count] = cat


def _issue(comm, kind, src, dst, count, op, root, bufs):
    n = comm.size
    s = bufs[src][:count * (n if kind == "reduce_scatter" else 1)]
    if kind in ("all_reduce", "large_all_reduce"):
        comm.all_reduce(s, None if dst == src else bufs[dst][:count], op=op)
    elif kind == "reduce":
        comm.reduce(s, root=root, output=None if dst == src else bufs[dst][:count], op=op)
    elif kind == "broadcast":
        comm.broadcast(s, root=root, output=None if dst == src else bufs[dst][:count])
    elif kind == "all_gather":
        comm.all_gather(s, bufs[dst][:n * count])
    elif kind == "gather":
        comm.gather(s, bufs[dst][:n * count] if comm.rank == root else None, root=root)
    else:
        comm.reduce_scatter(s, bufs[dst][:count], op=op)


def _run_program(rank, n, uid, seed, length, same_groups):
    """Issue the program in groups (each rank its own boundaries unless ``same_groups``); compare every buffer
    with the simulation; return the mismatches found (empty: right)."""
    comm = pycoll.init(rank, n, unique_id=uid, backend="host", timeout=60)
    prog = _program(n, seed, length)
    bufs = _initial(n, seed)
    mine = {dtype: [a.copy() for a in per_rank[rank]] for dtype, per_rank in bufs.items()}
    rng = random.Random(seed * 7 + (0 if same_groups else rank + 1))
    i = 0
    while i < len(prog):
        size = rng.choice([1, 2, 3, 4, 6, 9])
        with comm.group():
            for kind, src, dst, count, dtype, op, root in prog[i:i + size]:
                _issue(comm, kind, src, dst, count, op, root, mine[dtype])
        i += size
    _simulate(n, prog, bufs)
    bad = [f"{dtype} buffer {k}" for dtype in mine for k in range(BUFFERS)
           if not np.array_equal(mine[dtype][k], bufs[dtype][rank][k])]
    comm.destroy()
    return bad


@pytest.mark.parametrize("n,seed,same_groups", [(2, 1, True), (2, 2, False), (3, 3, False), (4, 4, True),
                                                 (4, 5, False)])
def test_grouped_small_collectives_match_the_simulation(n, seed, same_groups):
    """Random programs of small collectives (and ones a batch cannot take: a reduce_scatter, an all_reduce
    past PYCOLL_HOST_ONESHOT_MAX) over six shared buffers per rank -- in place, outputs read by later
    operations of the same group, outputs written twice -- in groups of 1 to 9, the same on every rank or
    each rank's own."""
    results = run_ranks(_run_program, n, _uid(), seed, 60, same_groups, timeout=90)
    assert results == [[]] * n


def _four_in_a_group(rank, n, uid, env, split):
    """Four 8-byte all_reduce in one group (``split``: rank 1 issues the first alone, then the other three in a
    group); the failpoint ``host.coll.after_arrive=raise@2`` on every rank."""
    os.environ.update(env)
    os.environ["PYCOLL_FAILPOINTS"] = "host.coll.after_arrive=raise@2"
    lib = B.load("host")
    comm = lib.comm_init_rank(n, B.UniqueId(uid), rank)
    xs = [np.full(2, rank + j, np.float32) for j in range(4)]
    ys = [np.zeros(2, np.float32) for _ in range(4)]
    try:
        if split and rank == 1:
            lib.all_reduce(xs[0].ctypes.data, ys[0].ctypes.data, 2, B.DataType.Float32, B.RedOp.Sum, comm, 0)
        lib.group_start()
        for j in range(1 if split and rank == 1 else 0, 4):
            lib.all_reduce(xs[j].ctypes.data, ys[j].ctypes.data, 2, B.DataType.Float32, B.RedOp.Sum, comm, 0)
        lib.group_end()
    except pycoll.PycollError as e:
        return f"error: {e}"
    finally:
        lib.comm_abort(comm)
    want = [sum(r + j for r in range(n)) for j in range(4)]
    return "one step" if [float(y[0]) for y in ys] == want else f"wrong: {[list(y) for y in ys]}"


@pytest.mark.parametrize("env,split,expected", [
    ({}, False, "one step"),
    ({"PYCOLL_HOST_GROUP_BATCH": "0"}, False, "error"),
    ({}, True, "error"),  # grouped differently: one by one
])
def test_a_group_takes_one_step_only_when_every_rank_batches_it(env, split, expected):
    results = run_ranks(_four_in_a_group, 2, _uid(), env, split, timeout=60)
    for r in results:
        assert r.startswith(expected), results
        if expected == "error":
            assert "after_arrive" in r


def _mismatch(rank, n, uid):
    comm = pycoll.init(rank, n, unique_id=uid, backend="host", timeout=30)
    x = [np.ones(2, np.float32), np.ones(2 + rank, np.float32)]
    try:
        with comm.group():
            comm.all_reduce(x[0])
            comm.all_reduce(x[1])
    except pycoll.PycollError as e:
        return f"{type(e).__name__}: {e}"
    return "no error"


def test_groups_that_differ_fail_with_a_mismatch_not_a_hang():
    t0 = time.monotonic()
    results = run_ranks(_mismatch, 2, _uid(), timeout=60)
    assert time.monotonic() - t0 < 20
    for r in results:
        assert "mismatch" in r and "count=2" in r and "count=3" in r, results


def _killed_in_batch(rank, n, uid):
    if rank == 1:
        os.environ["PYCOLL_FAILPOINTS"] = "host.coll.before_fill=kill@3"
    comm = pycoll.init(rank, n, unique_id=uid, backend="host", timeout=30)
    xs = [np.ones(2, np.float32) for _ in range(4)]
    comm.all_reduce(xs[0])
    comm.all_reduce(xs[1])
    t0 = time.monotonic()
    try:
        with comm.group():  # rank 1 dies as it publishes the batch
            for x in xs:
                comm.all_reduce(x)
    except pycoll.PycollError as e:
        return type(e).__name__, time.monotonic() - t0
    return "no error", time.monotonic() - t0


def test_a_rank_killed_publishing_a_batch_fails_its_peers_fast():
    results = run_ranks(_killed_in_batch, 3, _uid(), may_die=[1], timeout=60)
    assert isinstance(results[1], Died)
    for r in (results[0], results[2]):
        what, took = r
        assert what not in ("no error", "CommTimeout") and took < 5, results


def _two_comms(rank, n, uid):
    """One group over two communicators of the same ranks, their small all_reduce interleaved: each
    communicator's run of them is batched on its own, and every result is right."""
    comm = pycoll.init(rank, n, unique_id=uid, backend="host", timeout=30)
    other = comm.split(0, rank)
    xs = [np.full(3, (rank + 1) * (j + 1), np.uint32) for j in range(8)]
    with comm.group():
        for j, x in enumerate(xs):
            (comm if j % 2 == 0 else other).all_reduce(x, op="sum" if j % 3 else "max")
    want = [sum((r + 1) * (j + 1) for r in range(n)) if j % 3 else n * (j + 1) for j in range(8)]
    got = [int(x[0]) for x in xs]
    other.destroy()
    comm.destroy()
    return got == want or got


def test_a_group_over_two_communicators():
    assert run_ranks(_two_comms, 3, _uid(), timeout=60) == [True] * 3
