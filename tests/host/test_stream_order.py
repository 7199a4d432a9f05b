"""A communicator's operations on several streams run in the order they were issued, as NCCL's do.

NCCL makes each kernel of a communicator wait for the communicator's kernel before it, whatever the user's
streams, so the ranks' operations meet in issue order. A host stream runs its own queue: without ordering, an
operation issued on a second stream could start before the first stream's operation and meet a peer's other
operation (a mismatch error, or a hang where a send/recv waits behind a collective). An operation submitted to
another stream than its communicator's last unfinished one now waits for that one on its stream (the NULL
stream: in the calling thread). A rank killed, stopped or failed where an operation is made to wait so (failpoint
``host.stream.order``) fails its peer's operations instead of hanging them.
"""

from __future__ import annotations

import os
import random
import time

import numpy as np
import pytest
import torch
from helpers.mp import Died, error_and_time, run_ranks
from helpers.programs import drive, value

import pycoll
from pycoll import _bindings as B

pytestmark = pytest.mark.timeout(120)

BIG = 1 << 20  # float32 elements: an all_reduce of 4 MiB, long enough for the next stream to start first unordered


def _uid() -> bytes:
    return bytes(B.load("host").get_unique_id())


def _two_streams(rank, n, uid):
    """A large all_reduce on one stream, then a small one and a broadcast on another, asynchronously, eight times."""
    comm = pycoll.init(rank, n, unique_id=uid, backend="host", timeout=30)
    s1, s2 = comm.device.new_stream(), comm.device.new_stream()
    wrong = []
    for i in range(8):
        big, small = np.full(BIG, rank + 1.0, np.float32), np.full(3, float(rank + i), np.float64)
        x = np.full(5, float(rank), np.int32)
        works = [comm.all_reduce(big, stream=s1, async_op=True), comm.all_reduce(small, stream=s2, async_op=True),
                 comm.broadcast(x, root=i % n, stream=s2 if i % 2 else s1, async_op=True)]
        for w in works:
            w.wait()
        total = n * (n + 1) / 2
        if not (big == total).all() or not (small == sum(r + i for r in range(n))).all() or not (x == i % n).all():
            wrong.append(i)
    comm.destroy()
    return wrong


@pytest.mark.parametrize("n", [2, 3])
def test_operations_on_two_streams_meet_in_issue_order(n):
    assert run_ranks(_two_streams, n, _uid(), timeout=90) == [[]] * n


def _null_stream_after_a_stream(rank, n, uid):
    """Through the bindings: a large all_reduce on a host stream, then a small one on the NULL stream (which runs in
    the calling thread), then one more on a second stream."""
    lib = B.load("host")
    comm = lib.comm_init_rank(n, B.UniqueId(uid), rank)
    s1, s2 = lib.host_stream_create(), lib.host_stream_create()
    big, small, last = (np.full(k, rank + 1.0, np.float32) for k in (BIG, 2, 7))
    outs = [np.zeros_like(a) for a in (big, small, last)]
    f32, total = B.DataType.Float32, n * (n + 1) / 2
    try:
        lib.all_reduce(big.ctypes.data, outs[0].ctypes.data, BIG, f32, B.RedOp.Sum, comm, s1)
        lib.all_reduce(small.ctypes.data, outs[1].ctypes.data, 2, f32, B.RedOp.Sum, comm, 0)
        small_done_with_big = bool((outs[0] == total).all())  # the NULL stream's call returned after the big one
        lib.all_reduce(last.ctypes.data, outs[2].ctypes.data, 7, f32, B.RedOp.Sum, comm, s2)
        lib.host_stream_synchronize(s2)
        lib.host_stream_synchronize(s1)
        return small_done_with_big, [bool((o == total).all()) for o in outs]
    finally:
        lib.host_stream_destroy(s1)
        lib.host_stream_destroy(s2)
        lib.comm_destroy(comm)


def test_a_null_stream_operation_waits_for_the_communicators_operation_on_a_stream():
    assert run_ranks(_null_stream_after_a_stream, 2, _uid(), timeout=60) == [(True, [True] * 3)] * 2


KINDS = ("all_reduce", "all_reduce_in_place", "broadcast", "all_gather", "reduce_scatter", "ring")


def _program(rank, n, uid, seed, length):
    """``length`` operations drawn the same on every rank -- kinds, sizes, dtypes, numpy or torch, the
    communicator's stream or one of two others -- issued one by one (blocking or not) or in groups of up to five,
    the outstanding ones waited for in a random order now and then; every result checked. Returns the wrong ones."""
    comm = pycoll.init(rank, n, unique_id=uid, backend="host", timeout=30)
    rng = random.Random(seed)
    streams = [None, comm.device.new_stream(), comm.device.new_stream()]
    wrong = []

    def issue(i, async_op):
        kind, count = rng.choice(KINDS), rng.choice([1, 7, 64, 4096, 70000])
        dtype, stream, root = rng.choice([np.float32, np.float64, np.int32]), rng.choice(streams), rng.randrange(n)
        wrap = torch.from_numpy if rng.random() < 0.3 else (lambda a: a)
        mine = value(rank, i, count, dtype)
        out = np.zeros(count * (n if kind == "all_gather" else 1), dtype)
        kw = dict(stream=stream, async_op=async_op)
        if kind == "all_reduce":
            w, want = comm.all_reduce(wrap(mine), wrap(out), **kw), sum(value(k, i, count, dtype) for k in range(n))
        elif kind == "all_reduce_in_place":
            out = mine
            w, want = comm.all_reduce(wrap(mine), **kw), sum(value(k, i, count, dtype) for k in range(n))
        elif kind == "broadcast":
            out = mine
            w, want = comm.broadcast(wrap(mine), root=root, **kw), value(root, i, count, dtype)
        elif kind == "all_gather":
            w = comm.all_gather(wrap(mine), wrap(out), **kw)
            want = np.concatenate([value(k, i, count, dtype) for k in range(n)])
        elif kind == "reduce_scatter":
            whole = [value(k, i, count * n, dtype) for k in range(n)]
            w = comm.reduce_scatter(wrap(whole[rank]), wrap(out), **kw)
            want = sum(whole)[rank * count:(rank + 1) * count]
        else:  # a send to the next rank and a receive from the one before, in a group of their own or the caller's
            with comm.group():
                comm.send(wrap(mine), (rank + 1) % n, **kw)
                w = comm.recv(wrap(out), (rank - 1) % n, **kw)
            want = value((rank - 1) % n, i, count, dtype)
        return w, (kind, i, out, want.astype(dtype))

    def check(w, item):
        w.wait()
        kind, i, out, want = item
        if not np.array_equal(out, want):
            wrong.append((kind, i))

    drive(comm, rng, length, issue, check)
    comm.destroy()
    return wrong


@pytest.mark.parametrize("n,seed", [(2, 1), (2, 2), (3, 3)])
def test_random_programs_over_three_streams_give_every_result(n, seed):
    assert run_ranks(_program, n, _uid(), seed, 120, timeout=100) == [[]] * n


def _ordered_failpoint(rank, n, uid, spec):
    """A large all_reduce on one stream, then a small one on another (made to wait for the first: there the
    failpoint acts on rank 1). Returns this rank's error and time over both. Rank 0 issues its first 0.3 s late,
    so rank 1's first is surely unfinished when rank 1 issues the second (else the second has nothing to wait
    for: on a loaded machine rank 1's thread was once held off the CPU while both ranks' first ones ran)."""
    if rank == 1:
        os.environ["PYCOLL_FAILPOINTS"] = spec
    comm = pycoll.init(rank, n, unique_id=uid, backend="host", timeout=4)
    s1, s2 = comm.device.new_stream(), comm.device.new_stream()

    def both():
        if rank == 0:
            time.sleep(0.3)
        first = comm.all_reduce(np.ones(BIG, np.float32), stream=s1, async_op=True)
        second = comm.all_reduce(np.ones(4, np.float32), stream=s2, async_op=True)
        first.wait()
        second.wait()

    out = error_and_time(both)
    comm.abort()
    return out


# a stopped rank costs its peer's deadline (4 s)
@pytest.mark.parametrize("action", ["kill", "stop"])
def test_a_rank_killed_or_stopped_where_an_operation_waits_for_another_stream_fails_its_peer(action):
    res = run_ranks(_ordered_failpoint, 2, _uid(), f"host.stream.order={action}", may_die=[1], timeout=60)
    assert isinstance(res[1], Died), res
    name, took = res[0]
    assert name == ("RemoteError" if action == "kill" else "CommTimeout"), res
    assert took < 20, res


def test_an_operation_refused_where_it_would_wait_fails_on_its_rank_and_its_peer():
    res = run_ranks(_ordered_failpoint, 2, _uid(), "host.stream.order=raise", timeout=60)
    for rank, (name, took) in enumerate(res):
        assert name != "no error" and took < 20, (rank, res)
