"""Collectives over windows on the host backend: an all_reduce past PYCOLL_HOST_ONESHOT_MAX, and a broadcast,
all_gather, reduce_scatter or all_to_all of more than one step of the segment (1 MiB per rank and step up to 8
ranks; an all_to_all's blocks 1/N of that),
whose buffers lie in windows (SymmetricPool, register_window) on every rank go straight between the ranks'
windows.

Whether an operation took that path is seen through its failpoint, ``host.coll.window`` (passed only
there): armed with ``raise`` on every rank, an operation over windows fails naming it and any other
does not. Results are compared element by element (bit for bit: both paths reduce in rank order) with
the same operation on private arrays, which always goes through the segment.
"""

from __future__ import annotations

import os
import time

import numpy as np
import pytest
from helpers.mp import Died, run_ranks

import pycoll
from pycoll import _bindings as B

pytestmark = pytest.mark.timeout(120)

COUNT = 50_001  # float32: 200 KB, past the one-phase limit (32 KiB); odd, so slices end off cache lines


def _uid() -> bytes:
    return bytes(B.load("host").get_unique_id())


def _comm(rank, n, uid, **kw):
    return pycoll.init(rank, n, unique_id=uid, backend="host", **kw)


def _inputs(rank, count, dtype, seed):
    rng = np.random.default_rng(seed * 100 + rank)
    if np.dtype(dtype).kind == "f":
        return rng.uniform(-4, 4, count).astype(dtype)
    info = np.iinfo(dtype)
    return rng.integers(max(info.min, -1000), min(info.max, 1000), count, endpoint=True).astype(dtype)


CASES = [("float32", "sum"), ("float64", "prod"), ("int32", "max"), ("uint8", "min"), ("float16", "sum"),
         ("int64", "avg"), ("float32", "avg")]


def _compare(rank, n, uid, layout, misalign):
    c = _comm(rank, n, uid)
    pool = pycoll.SymmetricPool(c, 4 * COUNT * 8 + 4096, alignment=4)
    if misalign and rank == 1:
        pool.empty(3, "uint8")  # rank 1's blocks sit 4 bytes further on: the ranks' alignments differ
    other = c.mem_alloc(COUNT * 8, "uint8")
    win = c.register_window(other) if layout == "two windows" else None
    wrong = []
    for seed, (dt, op) in enumerate(CASES):
        mine = _inputs(rank, COUNT, dt, seed)
        want = np.empty_like(mine)
        c.all_reduce(mine.copy(), want, op=op)  # private buffers: the segment's pipeline
        send = pool.empty(COUNT, dt)
        send[:] = mine
        if layout == "in place":
            c.all_reduce(send, op=op)
            got = send
        else:
            recv = other.view(dt)[:COUNT] if layout == "two windows" else pool.empty(COUNT, dt)
            c.all_reduce(send, recv, op=op)
            got = recv
        if not np.array_equal(got, want, equal_nan=True):
            wrong.append((dt, op, int(np.count_nonzero(got != want))))
        del send, got
    if win is not None:
        win.close()
    pool.close()
    c.destroy()
    return wrong


@pytest.mark.parametrize("n,layout,misalign", [
    (2, "one pool", False), (3, "one pool", True), (4, "in place", False), (3, "two windows", False),
    (2, "in place", True),
])
def test_results_equal_the_pipelines(n, layout, misalign):
    assert run_ranks(_compare, n, _uid(), layout, misalign) == [[]] * n


def test_results_with_streaming_stores():
    """Streaming stores from 64 KiB on: the aligned and unaligned starts of every rank's outputs."""
    env = {"PYCOLL_HOST_STREAM_MIN": "65536"}
    assert run_ranks(_compare, 3, _uid(), "one pool", True, env=env) == [[]] * 3
    assert run_ranks(_compare, 2, _uid(), "in place", False, env=env) == [[]] * 2


def _which_path(rank, n, uid, case):
    """Runs one all_reduce of `case` with host.coll.window=raise armed on every rank: "windows" where it failed
    naming the failpoint, "segment" where it succeeded with the right result."""
    if case == "rank 1 opts out" and rank == 1:
        os.environ["PYCOLL_HOST_WINDOW_ALLREDUCE"] = "0"
    os.environ["PYCOLL_FAILPOINTS"] = "host.coll.window=raise"
    c = _comm(rank, n, uid, timeout=30, on_failure="report")
    pool = pycoll.SymmetricPool(c, 4 * COUNT * 4 + 4096)
    count = 1000 if case == "small" else COUNT
    send, recv = pool.empty(count), pool.empty(count)
    op = "sum"
    if case == "rank 1 private" and rank == 1:
        send, recv = np.empty(count, np.float32), np.empty(count, np.float32)
    if case == "premul":
        op = c.pre_mul_sum(2.0, "float32")
    if case == "window closed on rank 1" and rank == 1:
        pool.close()
    send[:] = rank + 1
    try:
        c.all_reduce(send, recv, op=op)
    except pycoll.PycollError as e:
        out = "windows" if "failpoint host.coll.window" in str(e) else f"error: {e}"
    else:
        want = n * (n + 1) / 2 * (2 if case == "premul" else 1)
        out = "segment" if (np.asarray(recv) == want).all() else "WRONG"
    c.abort()
    return out


@pytest.mark.parametrize("case,path", [
    ("windows", "windows"), ("small", "segment"), ("rank 1 private", "segment"), ("rank 1 opts out", "segment"),
    ("premul", "segment"), ("window closed on rank 1", "segment"),
])
def test_the_path_taken(case, path):
    res = run_ranks(_which_path, 2, _uid(), case)
    if path == "windows":  # rank 1 may instead see rank 0's failure first
        assert res[0] == "windows" and all(r == "windows" or r.startswith("error") for r in res), res
    else:
        assert res == [path] * 2, res


def _victim(rank, n, uid, action):
    if rank == 1:
        os.environ["PYCOLL_FAILPOINTS"] = f"host.coll.window={action}"
    c = _comm(rank, n, uid, timeout=8, on_failure="report")
    pool = pycoll.SymmetricPool(c, 2 * COUNT * 4 + 1024)
    send, recv = pool.empty(COUNT), pool.empty(COUNT)
    send[:] = 1
    t0 = time.monotonic()
    try:
        c.all_reduce(send, recv)
    except pycoll.PycollError as e:
        out = (type(e).__name__, time.monotonic() - t0, str(e)[:300])
    else:
        out = ("no error", time.monotonic() - t0, "")
    c.abort()
    return out


@pytest.mark.parametrize("action", ["kill", "stop", "raise"])
def test_a_rank_lost_at_the_window_reduction_fails_its_peers(action):
    """Rank 1 killed, stopped or failed after writing its slice into every rank's window, before the last
    arrival: the others do not hang -- a death or failure is reported at once, a stopped rank when the
    watchdog's timeout (8 s) runs out."""
    res = run_ranks(_victim, 3, _uid(), action, may_die=[1] if action != "raise" else [], timeout=60)
    if action != "raise":
        assert isinstance(res[1], Died), res
    for name, elapsed, text in (res[0], res[2]):
        assert name != "no error", res
        if action == "stop":
            assert name == "CommTimeout" and 7 < elapsed < 20, res
        else:
            assert elapsed < 5, res
            assert "failpoint host.coll.window" in text or "exited" in text or "rank 1" in text, res


def _large(rank, n, uid):
    """12 MB: each rank's slice takes several pieces (4 MiB each), resumed between them; blocking and on the
    communicator's stream (async_op)."""
    c = _comm(rank, n, uid)
    count = 3 << 20
    pool = pycoll.SymmetricPool(c, 2 * count * 4 + 1024)
    send, recv = pool.empty(count), pool.empty(count)
    send[:] = np.arange(count, dtype=np.float32) % 1000 + rank
    want = n * (np.arange(count, dtype=np.float32) % 1000) + n * (n - 1) / 2
    c.all_reduce(send, recv)
    ok = [bool(np.array_equal(recv, want))]
    recv[:] = 0
    c.all_reduce(send, recv, async_op=True).wait()
    ok.append(bool(np.array_equal(recv, want)))
    c.all_reduce(send, async_op=True).wait()
    ok.append(bool(np.array_equal(send, want)))
    pool.close()
    c.destroy()
    return ok


def test_large_operations_in_pieces():
    assert run_ranks(_large, 2, _uid()) == [[True] * 3] * 2


def _freed_under_window(rank, n, uid):
    """Rank 0 frees its window's memory (ncclMemFree, the window still registered) and maps private memory at
    the same address: its all_reduce there must not go through the window (the peers would write into the
    freed pages, not into the new memory) but through the segment, with the right result."""
    import ctypes

    os.environ["PYCOLL_FAILPOINTS"] = "host.coll.window=raise"
    lib = B.load("host")
    comm = lib.comm_init_rank(n, B.UniqueId(uid), rank)
    size = 1 << 20
    ptr = lib.mem_alloc(size)
    win, _ = lib.comm_window_register(comm, ptr, size)
    if rank == 0:
        lib.mem_free(ptr)
        libc = ctypes.CDLL(None, use_errno=True)
        libc.mmap.restype = ctypes.c_void_p
        libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int,
                              ctypes.c_long]
        MAP_FIXED_NOREPLACE = 0x100000
        got = libc.mmap(ptr, size, 3, 0x02 | 0x20 | MAP_FIXED_NOREPLACE, -1, 0)  # RW, private, anonymous
        if got != ptr:
            return "could not map at the same address"
    count = size // 8
    arr = (ctypes.c_float * (2 * count)).from_address(ptr)
    x = np.frombuffer(arr, np.float32)
    x[:count] = rank + 1
    x[count:] = 0
    try:
        lib.all_reduce(ptr, ptr + size // 2, count, B.DataType.Float32, B.RedOp.Sum, comm, 0)
    except pycoll.PycollError as e:
        return f"error: {e}"
    ok = bool((x[count:] == n * (n + 1) / 2).all())
    lib.comm_window_deregister(comm, win)
    lib.comm_destroy(comm)
    return "segment" if ok else "WRONG"


def test_a_window_over_freed_memory_is_not_used():
    assert run_ranks(_freed_under_window, 2, _uid()) == ["segment"] * 2


def _step_counts(rank, n, uid):
    """Operations of 1 to 4 pipeline chunks (2 to 5 steps: the skipped steps end on either parity), back to back
    and between operations through the segment, which must find the step numbering and descriptors as the
    pipeline leaves them."""
    c = _comm(rank, n, uid)
    chunk = (512 << 10) // 4  # float32 elements of one pipeline chunk
    counts = [chunk - 3, 2 * chunk - 7, 3 * chunk - 5, 4 * chunk + 1, 2 * chunk - 7, chunk - 3]
    pool = pycoll.SymmetricPool(c, 2 * max(counts) * 4 + 4096)
    wrong = []
    for i, count in enumerate(counts):
        send, recv = pool.empty(count), pool.empty(count)
        send[:] = np.arange(count, dtype=np.float32) % 97 + rank + i
        want = n * (np.arange(count, dtype=np.float32) % 97) + n * i + n * (n - 1) / 2
        c.all_reduce(send, recv)
        private = np.full(1000 + i, rank + 1.0, np.float32)
        c.all_reduce(private)  # through the segment, between two operations over windows
        if not (np.array_equal(recv, want) and (private == n * (n + 1) / 2).all()):
            wrong.append(count)
        del send, recv
    pool.close()
    c.destroy()
    return wrong


@pytest.mark.parametrize("n", [2, 3])
def test_operations_of_every_step_count(n):
    assert run_ranks(_step_counts, n, _uid()) == [[]] * n


# ---- Broadcast, AllGather, ReduceScatter, AlltoAll -------------------------------------------------------

BIG = (1 << 20) // 4 + 1001  # float32: just past one step of the segment (1 MiB)


def _collectives(rank, n, uid, layout, misalign):
    """Every root of a broadcast, an all_gather, a reduce_scatter (every op) and an all_to_all of several dtypes,
    over windows and, for the expected values, on private arrays (an all_to_all in place: through the segment,
    checked all the same)."""
    c = _comm(rank, n, uid)
    pool = pycoll.SymmetricPool(c, (3 * n + 2) * BIG * 8 + 4096, alignment=4)
    if misalign and rank == 1:
        pool.empty(3, "uint8")
    other = c.mem_alloc(n * BIG * 8, "uint8")
    win = c.register_window(other) if layout == "two windows" else None
    wrong = []

    def output(count, dt):
        return other.view(dt)[:count] if layout == "two windows" else pool.empty(count, dt)

    def check(what, got, want):
        if not np.array_equal(got, want, equal_nan=True):
            wrong.append((what, int(np.count_nonzero(got != want))))

    for seed, (dt, op) in enumerate(CASES):
        mine = _inputs(rank, n * BIG, dt, seed)
        for root in range(n):
            want = mine[:BIG].copy()
            c.broadcast(want, root=root)
            send = pool.empty(BIG, dt)
            send[:] = mine[:BIG]
            if layout == "in place":
                c.broadcast(send, root=root)
                check(("broadcast", dt, root), send, want)
            else:
                recv = output(BIG, dt)
                c.broadcast(send, root=root, output=recv)
                check(("broadcast", dt, root), recv, want)
                del recv
            del send
        want = np.empty(n * BIG, dt)
        c.all_gather(mine[:BIG].copy(), want)
        if layout == "in place":
            recv = pool.empty(n * BIG, dt)
            recv[rank * BIG:(rank + 1) * BIG] = mine[:BIG]
            c.all_gather(recv[rank * BIG:(rank + 1) * BIG], recv)
        else:
            send = pool.empty(BIG, dt)
            send[:] = mine[:BIG]
            recv = output(n * BIG, dt)
            c.all_gather(send, recv)
            del send
        check(("all_gather", dt), recv, want)
        del recv
        want = np.empty(BIG, dt)
        c.reduce_scatter(mine.copy(), want, op=op)
        send = pool.empty(n * BIG, dt)
        send[:] = mine
        if layout == "in place":
            c.reduce_scatter(send, send[rank * BIG:(rank + 1) * BIG], op=op)
            check(("reduce_scatter", dt, op), send[rank * BIG:(rank + 1) * BIG], want)
        else:
            recv = output(BIG, dt)
            c.reduce_scatter(send, recv, op=op)
            check(("reduce_scatter", dt, op), recv, want)
            del recv
        del send
        want = np.empty(n * BIG, dt)
        c.all_to_all(mine.copy(), want)
        send = pool.empty(n * BIG, dt)
        send[:] = mine
        if layout == "in place":
            c.all_to_all(send)
            check(("all_to_all", dt), send, want)
        else:
            recv = output(n * BIG, dt)
            c.all_to_all(send, recv)
            check(("all_to_all", dt), recv, want)
            del recv
        del send
    if win is not None:
        win.close()
    pool.close()
    c.destroy()
    return wrong


@pytest.mark.parametrize("n,layout,misalign,stores", [
    (2, "one pool", False, None), (3, "one pool", True, "65536"), (4, "in place", False, None),
    (3, "two windows", False, "0"), (2, "in place", True, "65536"),
])
def test_collectives_over_windows_equal_the_segments(n, layout, misalign, stores):
    """Streaming stores from 64 KiB on ("65536"), never ("0"), or as the process measures (None: the outputs here
    are below its 8 MiB)."""
    env = {"PYCOLL_HOST_STREAM_MIN": stores} if stores is not None else None
    assert run_ranks(_collectives, n, _uid(), layout, misalign, env=env, timeout=240) == [[]] * n


def _which_collective_path(rank, n, uid, kind, case):
    if case == "rank 1 opts out" and rank == 1:
        os.environ["PYCOLL_HOST_WINDOW_COLLECTIVES"] = "0"
    if case == "all_reduce opted out":
        os.environ["PYCOLL_HOST_WINDOW_ALLREDUCE"] = "0"  # the other three are not
    os.environ["PYCOLL_FAILPOINTS"] = "host.coll.window=raise"
    c = _comm(rank, n, uid, timeout=30, on_failure="report")
    count = 1000 if case == "one step" else BIG
    pool = pycoll.SymmetricPool(c, 2 * (n + 1) * count * 4 + 4096)
    big, small = pool.empty(n * count), pool.empty(count)
    if case == "rank 1 private" and rank == 1:
        big, small = np.empty(n * count, np.float32), np.empty(count, np.float32)
    big[:] = rank + 1
    small[:] = rank + 1
    op = c.pre_mul_sum(2.0, "float32") if case == "premul" else "sum"
    try:
        if kind == "broadcast":
            c.broadcast(small, root=n - 1)
            ok = (np.asarray(small) == n).all()
        elif kind == "all_gather":
            c.all_gather(small, big)
            ok = np.array_equal(np.asarray(big), np.repeat(np.arange(1, n + 1, dtype=np.float32), count))
        elif kind == "reduce_scatter":
            c.reduce_scatter(big, small, op=op)
            ok = (np.asarray(small) == n * (n + 1) / 2 * (2 if case == "premul" else 1)).all()
        else:
            out_ = pool.empty(n * count) if case != "in place" else None
            if case == "rank 1 private" and rank == 1:
                out_ = np.empty(n * count, np.float32)
            big[:] = np.repeat(np.arange(n, dtype=np.float32), count) + 10 * rank  # block k: k + 10 * rank
            c.all_to_all(big, out_)
            got = np.asarray(big if out_ is None else out_)
            ok = np.array_equal(got, np.repeat(10 * np.arange(n, dtype=np.float32), count) + rank)
    except pycoll.PycollError as e:
        out = "windows" if "failpoint host.coll.window" in str(e) else f"error: {e}"
    else:
        out = "segment" if ok else "WRONG"
    c.abort()
    return out


@pytest.mark.parametrize("kind", ["broadcast", "all_gather", "reduce_scatter", "all_to_all"])
@pytest.mark.parametrize("case,path", [
    ("windows", "windows"), ("all_reduce opted out", "windows"), ("one step", "segment"),
    ("rank 1 private", "segment"), ("rank 1 opts out", "segment"), ("premul", None), ("in place", None),
])
def test_the_collectives_path_taken(kind, case, path):
    if case == "premul":  # PreMulSum's per-rank scalars: only reduce_scatter has them, and it takes the segment
        path = "segment" if kind == "reduce_scatter" else "windows"
    if case == "in place":  # only an all_to_all in place cannot go over windows (the others run out of place here)
        path = "segment" if kind == "all_to_all" else "windows"
    res = run_ranks(_which_collective_path, 2, _uid(), kind, case)
    if path == "windows":  # a rank may instead see the other's failure first
        assert "windows" in res and all(r == "windows" or r.startswith("error") for r in res), res
    else:
        assert res == [path] * 2, res


def _collective_victim(rank, n, uid, kind, action):
    if rank == 1:
        os.environ["PYCOLL_FAILPOINTS"] = f"host.coll.window={action}"
    c = _comm(rank, n, uid, timeout=8, on_failure="report")
    pool = pycoll.SymmetricPool(c, 2 * (2 * n + 1) * BIG * 4 + 4096)
    big, small = pool.empty(n * BIG), pool.empty(BIG)
    big[:] = small[:] = 1
    t0 = time.monotonic()
    try:
        if kind == "broadcast":
            c.broadcast(small, root=1)  # the root stops or dies while the others read its buffer
        elif kind == "all_gather":
            c.all_gather(small, big)
        elif kind == "reduce_scatter":
            c.reduce_scatter(big, small)
        else:
            c.all_to_all(big, pool.empty(n * BIG))
    except pycoll.PycollError as e:
        out = (type(e).__name__, time.monotonic() - t0, str(e)[:300])
    else:
        out = ("no error", time.monotonic() - t0, "")
    c.abort()
    return out


@pytest.mark.parametrize("kind,action", [("broadcast", "kill"), ("all_gather", "kill"), ("reduce_scatter", "kill"),
                                         ("all_to_all", "kill"), ("broadcast", "stop")])
def test_a_rank_lost_over_windows_fails_its_peers(kind, action):
    """Rank 1 killed or stopped after its share (the broadcast's root: with the others' copies of its buffer
    under way), before the last arrival: a death is reported at once, a stopped rank at the timeout (8 s; the
    wait is the one every operation over windows ends with, so one kind is stopped)."""
    res = run_ranks(_collective_victim, 3, _uid(), kind, action, may_die=[1], timeout=60)
    assert isinstance(res[1], Died), res
    for name, elapsed, text in (res[0], res[2]):
        if action == "stop":
            assert name == "CommTimeout" and 7 < elapsed < 20, res
        else:
            assert name != "no error" and elapsed < 5, res
            assert "exited" in text or "rank 1" in text, res


def _large_collectives(rank, n, uid):
    """12 MB outputs: several pieces (4 MiB each), resumed between them; blocking and async_op."""
    c = _comm(rank, n, uid)
    count = 3 << 20
    pool = pycoll.SymmetricPool(c, (3 * n + 1) * count * 4 + 4096)
    x = np.arange(count, dtype=np.float32) % 1000
    big, small, other = pool.empty(n * count), pool.empty(count), pool.empty(n * count)
    ok = []
    for async_op in (False, True):
        small[:] = x + rank
        w = c.broadcast(small, root=0, async_op=async_op)
        w.wait() if async_op else None
        ok.append(bool(np.array_equal(small, x)))
        small[:] = x + rank
        w = c.all_gather(small, big, async_op=async_op)
        w.wait() if async_op else None
        ok.append(bool(np.array_equal(big, np.concatenate([x + k for k in range(n)]))))
        big[:] = np.tile(x, n) + rank
        w = c.reduce_scatter(big, small, async_op=async_op)
        w.wait() if async_op else None
        ok.append(bool(np.array_equal(small, n * x + n * (n - 1) / 2)))
        big[:] = np.tile(x, n) + rank
        w = c.all_to_all(big, other, async_op=async_op)
        w.wait() if async_op else None
        ok.append(bool(np.array_equal(other, np.concatenate([x + k for k in range(n)]))))
    del big, small, other
    pool.close()
    c.destroy()
    return ok


def test_large_collectives_in_pieces():
    assert run_ranks(_large_collectives, 2, _uid()) == [[True] * 8] * 2


def _collective_steps(rank, n, uid):
    """Broadcasts of 2 to 5 steps, and all_gathers, between operations through the segment."""
    c = _comm(rank, n, uid)
    step = (1 << 20) // 4
    counts = [step + 1, 2 * step - 7, 3 * step + 5, 4 * step + 1, 2 * step - 7]
    pool = pycoll.SymmetricPool(c, (n + 1) * max(counts) * 4 + 4096)
    wrong = []
    for i, count in enumerate(counts):
        x = np.arange(count, dtype=np.float32) % 89 + i
        buf, gathered = pool.empty(count), pool.empty(n * count)
        buf[:] = x + rank
        c.broadcast(buf, root=i % n)
        private = np.full(1000 + i, rank + 1.0, np.float32)
        c.all_reduce(private)  # through the segment, between two operations over windows
        c.all_gather(buf, gathered)
        if not (np.array_equal(buf, x + i % n) and np.array_equal(gathered, np.tile(x + i % n, n))
                and (private == n * (n + 1) / 2).all()):
            wrong.append(count)
        del buf, gathered
    pool.close()
    c.destroy()
    return wrong


@pytest.mark.parametrize("n", [2, 3])
def test_collectives_of_every_step_count(n):
    assert run_ranks(_collective_steps, n, _uid()) == [[]] * n
