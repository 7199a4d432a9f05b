"""The Communicator on the host backend: every collective, Work semantics, bad input, failures."""

from __future__ import annotations

import gc
import os
import re
import signal
import socket
import threading
import time

import numpy as np
import pytest
from helpers import REPO
from helpers.mp import Died, run_ranks

import pycoll
from pycoll import _bindings as B


def _uid() -> bytes:
    return bytes(B.load("host").get_unique_id())


def _comm(rank, n, uid, **kw):
    return pycoll.init(rank, n, unique_id=uid, backend="host", **kw)


# -- every collective -------------------------------------------------------------------------------


def _all_collectives(rank, n, uid, use_torch):
    if use_torch:
        import torch

        def arr(values, dtype="float32"):
            return torch.tensor(np.asarray(values, dtype=dtype))

        def empty(k, dtype="float32"):
            return torch.empty(k, dtype=getattr(torch, dtype))

        def val(x):
            return x.numpy().tolist()
    else:
        def arr(values, dtype="float32"):
            return np.asarray(values, dtype=dtype)

        def empty(k, dtype="float32"):
            return np.empty(k, dtype=dtype)

        def val(x):
            return x.tolist()

    c = _comm(rank, n, uid)
    everyone = np.arange(n, dtype=np.float64)
    k = 3
    out = {}
    # all_reduce, in place and out of place, every op
    x = arr(np.full(k, rank + 1.0))
    c.all_reduce(x)
    out["all_reduce"] = val(x) == [n * (n + 1) / 2] * k
    y = empty(k)
    c.all_reduce(arr(np.full(k, rank + 1.0)), y, op="max")
    out["all_reduce_max"] = val(y) == [float(n)] * k
    c.all_reduce(arr(np.full(k, rank + 1.0)), y, op="min")
    out["all_reduce_min"] = val(y) == [1.0] * k
    c.all_reduce(arr(np.full(k, 2.0)), y, op="prod")
    out["all_reduce_prod"] = val(y) == [2.0**n] * k
    c.all_reduce(arr(np.full(k, rank * 2.0)), y, op="avg")
    out["all_reduce_avg"] = np.allclose(val(y), everyone.mean() * 2)
    xi = arr(np.full(k, rank + 1), "int64")
    c.all_reduce(xi)
    out["all_reduce_int64"] = val(xi) == [n * (n + 1) // 2] * k
    # broadcast
    b = arr(np.arange(k) + 10.0 * rank)
    c.broadcast(b, root=n - 1)
    out["broadcast"] = val(b) == list(np.arange(k) + 10.0 * (n - 1))
    bo = empty(k)
    c.broadcast(arr(np.full(k, float(rank))), root=0, output=bo)
    out["broadcast_oop"] = val(bo) == [0.0] * k
    if use_torch:  # a model's weights, as a trainer sends them to its inference ranks (nn.Parameter, grad on)
        import torch

        weight = torch.nn.Parameter(torch.full((k,), float(rank)))
        c.broadcast(weight, root=n - 1)
        c.all_reduce(weight, op="max")
        out["broadcast_parameter"] = weight.detach().numpy().tolist() == [float(n - 1)] * k
    # reduce
    r = arr(np.full(k, rank + 1.0))
    c.reduce(r, root=0)
    if rank == 0:
        out["reduce"] = val(r) == [n * (n + 1) / 2] * k
    ro = empty(k)
    c.reduce(arr(np.full(k, rank + 1.0)), root=n - 1, output=ro, op="max")
    if rank == n - 1:
        out["reduce_oop"] = val(ro) == [float(n)] * k
    # all_gather, out of place and in place
    g = empty(k * n)
    c.all_gather(arr(np.full(k, float(rank))), g)
    out["all_gather"] = val(g) == list(np.repeat(everyone, k))
    gi = arr(np.where(np.arange(k * n) // k == rank, float(rank), -1.0))
    c.all_gather(None, gi)
    out["all_gather_inplace"] = val(gi) == list(np.repeat(everyone, k))
    # reduce_scatter, out of place and in place
    rs = empty(k)
    c.reduce_scatter(arr(np.arange(k * n, dtype=np.float64) + rank), rs)
    expect = (np.arange(k * n) * n + everyone.sum())[rank * k:(rank + 1) * k]
    out["reduce_scatter"] = val(rs) == list(expect)
    rsi = arr(np.arange(k * n, dtype=np.float64) + rank)
    c.reduce_scatter(rsi)
    out["reduce_scatter_inplace"] = val(rsi)[rank * k:(rank + 1) * k] == list(expect)
    # all_to_all
    a = arr(np.arange(n, dtype=np.float64) + 100 * rank)
    ao = empty(n)
    c.all_to_all(a, ao)
    out["all_to_all"] = val(ao) == [100.0 * j + rank for j in range(n)]
    # gather / scatter
    go = empty(k * n) if rank == 0 else None
    c.gather(arr(np.full(k, float(rank))), go, root=0)
    if rank == 0:
        out["gather"] = val(go) == list(np.repeat(everyone, k))
    so = empty(k)
    c.scatter(arr(np.repeat(everyone, k) * 3) if rank == n - 1 else None, so, root=n - 1)
    out["scatter"] = val(so) == [3.0 * rank] * k
    # grouped send/recv around a ring, issued in either order
    s = arr(np.full(k, float(rank)))
    rv = empty(k)
    with c.group():
        if rank % 2:
            c.recv(rv, (rank - 1) % n)
            c.send(s, (rank + 1) % n)
        else:
            c.send(s, (rank + 1) % n)
            c.recv(rv, (rank - 1) % n)
    out["send_recv"] = val(rv) == [float((rank - 1) % n)] * k
    c.barrier()
    c.destroy()
    return out


@pytest.mark.timeout(90)
@pytest.mark.parametrize("n", [1, 2, 3, 4])
def test_every_collective_numpy(n):
    for res in run_ranks(_all_collectives, n, _uid(), False, timeout=60):
        assert all(res.values()), {k: v for k, v in res.items() if not v}


@pytest.mark.timeout(120)
@pytest.mark.parametrize("n", [1, 2, 3, 4])
def test_every_collective_torch(n):
    for res in run_ranks(_all_collectives, n, _uid(), True, timeout=90):
        assert all(res.values()), {k: v for k, v in res.items() if not v}


# -- Work ----------------------------------------------------------------------------------------


def _work_semantics(rank, n, uid):
    c = _comm(rank, n, uid)
    x = np.ones(4, np.float32)
    out = {}
    if rank == 1:
        time.sleep(0.6)
    w = c.all_reduce(x, async_op=True)
    if rank == 0:
        out["pending_at_first"] = not w.is_completed()
        try:
            w.wait(timeout=0.05)
            out["wait_timeout_raised"] = False
        except pycoll.WaitTimeout as e:  # a TimeoutError, and no failure (a CommTimeout is both)
            out["wait_timeout_raised"] = isinstance(e, TimeoutError) and not isinstance(e, pycoll.CommFailure)
    w.wait()
    out["completed"] = w.is_completed() and w.exception() is None and w.state == "completed"
    out["value"] = x.tolist() == [2.0] * 4
    # its duration: from when its stream began it to when it completed (rank 0 waited for rank 1)
    out["duration"] = w.duration_ms is not None and (w.duration_ms >= 400 if rank == 0 else w.duration_ms >= 0)
    if rank == 1:
        time.sleep(0.3)
    b = c.all_reduce(np.ones(2, np.float32))  # blocking: run in the caller's thread, timed the same way
    out["blocking_duration"] = b.duration_ms is not None and (b.duration_ms >= 200 if rank == 0 else b.duration_ms >= 0)
    # several async ops on the comm's stream complete in order
    ws = [c.all_reduce(np.full(2, float(i), np.float32), async_op=True) for i in range(5)]
    ws[-1].wait()
    out["in_order"] = all(w.is_completed() for w in ws)
    # a blocking op after async ones runs after them
    y = np.full(3, 1.0, np.float64)
    c.all_reduce(y)
    out["after_async"] = y.tolist() == [2.0] * 3
    c.destroy()
    return out


@pytest.mark.timeout(60)
def test_work_semantics():
    for res in run_ranks(_work_semantics, 2, _uid(), timeout=40):
        assert all(res.values()), res


def _group_semantics(rank, n, uid):
    c = _comm(rank, n, uid)
    out = {}
    xs = [np.full(2, float(i + rank), np.float32) for i in range(4)]
    if rank == 1:
        time.sleep(0.6)
    # a group of asynchronous operations returns at once, even where the idle stream could run it here
    t0 = time.monotonic()
    with c.group():
        ws = [c.all_reduce(x, async_op=True) for x in xs]
    if rank == 0:
        out["async_group_returned_at_once"] = time.monotonic() - t0 < 0.3 and not ws[-1].is_completed()
    for w in ws:
        w.wait()
    out["async_values"] = [x.tolist() for x in xs] == [[2.0 * i + 1] * 2 for i in range(4)]
    # blocking groups (run in this thread while the watchdog watches), mixed ones, several in a row
    for round_ in range(3):
        ys = [np.full(3, float(round_ + rank), np.float64) for _ in range(3)]
        with c.group():
            bs = [c.all_reduce(y) for y in ys[:2]]
            a = c.all_reduce(ys[2], async_op=round_ == 1)
        out[f"blocking_done_{round_}"] = all(w.state == "completed" for w in bs)
        a.wait()
        out[f"values_{round_}"] = all(y.tolist() == [2.0 * round_ + 1] * 3 for y in ys)
    # a send/recv pair with the partner, then a blocking op outside a group
    s, r = np.full(2, float(rank), np.float32), np.zeros(2, np.float32)
    with c.group():
        c.send(s, 1 - rank)
        c.recv(r, 1 - rank)
    z = np.ones(2, np.float32)
    c.all_reduce(z)
    out["pair"] = r.tolist() == [float(1 - rank)] * 2 and z.tolist() == [2.0] * 2
    # waiting inside the group for one of its own operations: refused at once (it starts at the group's end); the
    # group, whose block raised, is dropped
    q = np.full(2, float(rank), np.float32)
    t0 = time.monotonic()
    try:
        with c.group():
            w = c.all_reduce(q, async_op=True)
            w.wait()
        out["wait_in_group"] = "no exception"
    except pycoll.CommStateError as e:
        out["wait_in_group"] = "open group" in str(e) and time.monotonic() - t0 < 1.0
    try:
        w.wait()
        out["group_after_refused_wait"] = "ran"
    except pycoll.CommStateError as e:
        out["group_after_refused_wait"] = "never ran" in str(e) and q.tolist() == [rank] * 2 and c.failure is None
    # what needs its result at its return is refused inside a group (split's new communicator, broadcast_bytes'
    # bytes: the group's operations start at its end), at once, and the communicator stays usable
    for name, call in [("split", lambda: c.split(0)), ("shrink", lambda: c.shrink([1 - rank])),
                       ("grow", lambda: c.grow(n + 1)), ("broadcast_bytes", lambda: c.broadcast_bytes(b"ab", 2)),
                       ("finalize", c.finalize), ("destroy", c.destroy)]:
        try:
            with c.group():
                call()
            out[f"{name}_in_group"] = "no exception"
        except pycoll.CommStateError as e:
            out[f"{name}_in_group"] = f"{name} cannot be called inside a group" in str(e)
    # one group() entered twice (its one record of the open group) is refused, the outer group is dropped (its block
    # raised), and the next call outside runs (it ran as "in a group" for good before); exiting one never entered is
    # refused
    g, u = c.group(), np.full(2, float(rank), np.float32)
    try:
        with g:
            c.all_reduce(u)
            with g:
                pass
        out["group_reentered"] = "no exception"
    except pycoll.CommStateError as e:
        out["group_reentered"] = "already open" in str(e)
    t = np.full(2, float(rank), np.float32)
    w = c.all_reduce(t)
    out["after_reentered"] = u.tolist() == [rank] * 2 and t.tolist() == [1.0] * 2 and w.state == "completed"
    try:
        c.group().__exit__(None, None, None)
        out["group_exit_unentered"] = "no exception"
    except pycoll.CommStateError as e:
        out["group_exit_unentered"] = "without being entered" in str(e)
    sub = c.split(0)  # after the group: as usual
    v = np.ones(2, np.float32)
    sub.all_reduce(v)
    out["split_after_group"] = v.tolist() == [2.0] * 2 and sub.size == n
    sub.destroy()
    c.destroy()
    return out


@pytest.mark.timeout(60)
def test_group_semantics():
    for res in run_ranks(_group_semantics, 2, _uid(), timeout=40):
        assert all(res.values()), res


def _group_that_raised(rank, n, uid):
    """A group whose block raised (each rank's, after queueing a send and a recv; then a nested one's, caught in the
    outer block) is dropped: the next exchange gets this one's data, not the dropped one's."""
    c = _comm(rank, n, uid, timeout=10.0)
    out = {}
    peer = (rank + 1) % n
    prev = (rank - 1) % n

    def exchange(tag, value):
        a, b = np.full(4, value + rank, np.float32), np.zeros(4, np.float32)
        with c.group():
            c.send(a, peer)
            c.recv(b, prev)
        out[tag] = b.tolist() == [value + prev] * 4 or b.tolist()

    stale = np.full(4, 100.0 + rank, np.float32)
    try:
        with c.group():
            w = c.send(stale, peer, async_op=True)
            c.recv(np.zeros(4, np.float32), prev)
            c.all_reduce(stale, stream=0xDEAD0)  # refused by pycoll's own check
    except ValueError as e:
        out["note"] = any("none of the 2 operations of the group() it left ran" in x
                          for x in getattr(e, "__notes__", []))
    try:
        w.wait(timeout=1.0)
        out["work"] = "completed"
    except pycoll.CommStateError as e:
        out["work"] = "never ran" in str(e) or str(e)
    out["outstanding"] = c.outstanding() == [] or repr(c.outstanding())
    exchange("first", 200.0)
    try:
        with c.group():
            c.send(stale, peer)
            try:
                with c.group():
                    c.recv(np.zeros(4, np.float32), prev)
                    raise KeyError("inner")
            except KeyError:
                pass
        out["nested"] = "no exception"
    except pycoll.CommStateError as e:
        out["nested"] = "a nested group's block raised" in str(e) or str(e)
    exchange("second", 300.0)
    out["state"] = c.state == "active" or c.state
    c.destroy()
    return out


@pytest.mark.timeout(60)
def test_a_group_whose_block_raised_runs_none_of_its_operations():
    for res in run_ranks(_group_that_raised, 2, _uid(), timeout=40):
        assert all(v is True for v in res.values()), res


def _group_held_past_its_timeout(rank, n, uid):
    # both ranks hold an operation in a group() for longer than its timeout: its deadline counts from the group's
    # end, where it is issued (the watchdog aborted the communicator on every rank before anything was issued), and
    # it is scheduled meanwhile (it read "started")
    c = _comm(rank, n, uid, timeout=0.5)
    x = np.full(4, rank + 1.0, np.float32)
    out = {}
    with c.group():
        w = c.all_reduce(x, async_op=True)
        time.sleep(1.0)
        out["scheduled"] = w.state == "scheduled" or w.state
        out["not_issued"] = c.progress().coll_enqueued == 0 or c.progress()
    w.wait()
    out["sum"] = x.tolist() == [3.0] * 4 or x.tolist()
    out["state"] = c.state == "active" or c.state
    c.destroy()
    return out


@pytest.mark.timeout(60)
def test_an_operation_held_in_a_group_counts_its_deadline_from_the_group_end():
    for res in run_ranks(_group_held_past_its_timeout, 2, _uid(), timeout=40):
        assert all(v is True for v in res.values()), res


# -- bad input ------------------------------------------------------------------------------------


def _bad_inputs(rank, n, uid):
    from helpers.dlpack_fake import KDL_CUDA, FakeDLPack

    c = _comm(rank, n, uid)
    x = np.ones(8, np.float32)
    cases = {
        "non_contiguous": (ValueError, lambda: c.all_reduce(x[::2])),
        "wrong_device": (
            ValueError,
            lambda: c.all_reduce(FakeDLPack(0x7F0000000000, (4,), dtype=(2, 32, 1), device=(KDL_CUDA, 0))),
        ),
        "unsupported_dtype": (TypeError, lambda: c.all_reduce(np.ones(4, bool))),
        "output_too_small": (ValueError, lambda: c.all_gather(x, np.empty(8, np.float32))),
        # exactly size blocks: a bigger whole's blocks were taken where the caller's were not (a reduce_scatter's
        # rank 1 got elements 3-5 of 8, straddling two), or its rest silently ignored
        "reduce_scatter_bigger_input": (ValueError, lambda: c.reduce_scatter(np.ones(3 * n + 2, np.float32),
                                                                             np.empty(3, np.float32))),
        "all_gather_bigger_output": (ValueError, lambda: c.all_gather(x, np.empty(8 * n + 2, np.float32))),
        "dtype_mismatch": (ValueError, lambda: c.all_reduce(x, np.empty(8, np.float64))),
        "root_out_of_range": (ValueError, lambda: c.broadcast(x, root=n)),
        "negative_root": (ValueError, lambda: c.reduce(x, root=-1)),
        "peer_out_of_range": (ValueError, lambda: c.send(x, peer=n + 3)),
        "unknown_op": (ValueError, lambda: c.all_reduce(x, op="median")),
        "readonly_output": (ValueError, lambda: c.all_reduce(np.frombuffer(b"\0" * 16, np.float32))),
        "gpu_stream_on_host": (TypeError, lambda: c.all_reduce(x, stream=_CudaStreamLike())),
        "dead_stream_handle": (ValueError, lambda: c.all_reduce(x, stream=0xDEAD000)),
        "bad_timeout": (ValueError, lambda: c.all_reduce(x, timeout=-1)),
        "not_an_array": (TypeError, lambda: c.all_reduce(object())),
        "scatter_sizes": (ValueError, lambda: c.scatter(np.ones(7, np.float32), np.empty(2, np.float32), root=rank)),
        "float_root": (TypeError, lambda: c.broadcast(x, root=0.0)),
        "bool_root": (TypeError, lambda: c.reduce(x, root=np.True_)),
        "float_peer": (TypeError, lambda: c.sendrecv(x, np.empty(8, np.float32), peer=1.0)),
        "float_excluded_rank": (TypeError, lambda: c.shrink([1.0 - rank])),  # not rounded to a rank
        "float_color": (TypeError, lambda: c.split(0.5)),
        "float_nbytes": (TypeError, lambda: c.broadcast_bytes(b"abc" if rank == 0 else None, 3.0)),
        # every rank its own root: each refuses locally. 5 float64 are 40 bytes, not 5; a str has no bytes
        "item_count_for_bytes": (ValueError, lambda: c.broadcast_bytes(np.zeros(5), 5, root=rank)),
        "str_for_bytes": (TypeError, lambda: c.broadcast_bytes("abcde", 5, root=rank)),
        "premul_scalar_overflows": (ValueError, lambda: c.pre_mul_sum(1e6, np.float16)),  # inf in float16
        "float_grow_size": (TypeError, lambda: c.grow(3.0)),
    }
    out = {}
    for name, (exc, fn) in cases.items():
        try:
            fn()
            out[name] = "no exception"
        except exc as e:
            out[name] = str(e) != ""
        except Exception as e:  # the wrong kind
            out[name] = f"{type(e).__name__}: {e}"
    # in place, a whole that is no multiple of the ranks (compiled whole: the messages as before)
    for name, call, text in (
            ("gather_in_place", lambda: c.all_gather(None, np.zeros(2 * n + 1, np.float32)),
             f"all_gather: in place, output has {2 * n + 1} elements, not a multiple of {n} ranks"),
            ("scatter_in_place", lambda: c.reduce_scatter(np.zeros(2 * n + 1, np.float32)),
             f"reduce_scatter: input has {2 * n + 1} elements, not a multiple of {n} ranks")):
        try:
            call()
            out[name] = "no exception"
        except ValueError as e:
            out[name] = str(e) == text or str(e)
    # all_to_all, gather and scatter (compiled whole): what each rank checks, root or not, named as before
    f32, m = np.float32, 2 * n
    for name, call, text in (
            ("all_to_all_multiple", lambda: c.all_to_all(np.zeros(m + 1, f32)),
             f"all_to_all: input has {m + 1} elements, not a multiple of {n} ranks"),
            ("all_to_all_dtype", lambda: c.all_to_all(np.zeros(m, f32), np.zeros(m, np.float64)),
             "all_to_all: input is Float but output is Double; they must have the same dtype"),
            ("all_to_all_small", lambda: c.all_to_all(np.zeros(m, f32), np.zeros(m - 1, f32)),
             f"all_to_all: output has {m - 1} elements but needs exactly {m} ({n} blocks of 2, as input's)"),
            # a bigger output: its blocks are not where input's land (a padded buffer got rank 1's at offset 2, not 3)
            ("all_to_all_big", lambda: c.all_to_all(np.zeros(m, f32), np.zeros(m + n, f32)),
             f"all_to_all: output has {m + n} elements but needs exactly {m} ({n} blocks of 2, as input's)"),
            ("gather_root_output", lambda: c.gather(np.zeros(2, f32), None, root=rank),
             "gather: the root needs an output buffer"),
            ("gather_in_place_off_root", lambda: c.gather(None, np.zeros(m, f32), root=1 - rank),
             "gather: input=None (in place) is only valid on the root"),
            ("gather_in_place_multiple", lambda: c.gather(None, np.zeros(m + 1, f32), root=rank),
             f"gather: output has {m + 1} elements, not a multiple of {n} ranks"),
            ("gather_count", lambda: c.gather(np.zeros(2, f32), np.zeros(m - 1, f32), root=rank),
             f"gather: output has {m - 1} elements but needs exactly {m} (2 elements x {n} ranks)"),
            ("scatter_root_input", lambda: c.scatter(None, np.zeros(2, f32), root=rank),
             "scatter: the root needs an input buffer"),
            ("scatter_in_place_off_root", lambda: c.scatter(np.zeros(m, f32), None, root=1 - rank),
             "scatter: output=None (in place) is only valid on the root"),
            ("scatter_exact", lambda: c.scatter(np.zeros(4 * n, f32), np.zeros(3, f32), root=rank),
             f"scatter: input has {4 * n} elements but needs exactly {3 * n} (3 elements x {n} ranks)"),
            ("scatter_dtype", lambda: c.scatter(np.zeros(m, f32), np.zeros(2, np.int32), root=rank),
             "scatter: input is Float but output is Int; they must have the same dtype")):
        try:
            call()
            out[name] = "no exception"
        except ValueError as e:
            out[name] = str(e) == text or str(e)
    # off the root, gather's output and scatter's input are not looked at
    g = np.zeros(m, f32)
    c.gather(np.full(2, rank + 1.0, f32), g if rank == 0 else "not an array", root=0)
    s = np.zeros(2, f32)
    c.scatter(np.arange(m, dtype=f32) if rank == 1 else [None], s, root=1)
    out["off_root_ignored"] = (rank != 0 or g.tolist() == [1.0, 1.0, 2.0, 2.0]) and s.tolist() == [2.0 * rank,
                                                                                                 2.0 * rank + 1]
    # numpy's integers (and 0-d integer tensors) are ranks, colors and keys like ints
    import torch

    z = np.full(4, rank + 1.0, np.float32)
    c.broadcast(z, root=np.int64(1))
    w = np.empty(4, np.float32)
    c.sendrecv(z, w, peer=torch.tensor(1 - rank))
    out["numpy_root_and_tensor_peer"] = z.tolist() == [2.0] * 4 and w.tolist() == [2.0] * 4
    sub = c.split(np.uint8(0), key=np.int32(-rank))
    out["numpy_color_and_key"] = sub.rank == 1 - rank
    sub.destroy()
    out["numpy_nbytes"] = c.broadcast_bytes(b"xyz" if rank == 0 else None, np.int64(3)) == b"xyz"
    # and init's rank and world_size
    uid2 = c.broadcast_bytes(bytes(c.library.get_unique_id()) if rank == 0 else None, 128)
    other = pycoll.init(np.int64(rank), np.int32(n), unique_id=uid2, backend="host")
    out["numpy_init"] = (other.rank, other.size) == (rank, n)
    other.destroy()
    # the communicator is still usable
    y = np.full(4, rank + 1.0, np.float32)
    c.all_reduce(y)
    out["still_usable"] = y.tolist() == [3.0] * 4
    c.destroy()
    try:
        c.all_reduce(y)
        out["after_destroy"] = "no exception"
    except pycoll.CommStateError as e:
        out["after_destroy"] = "destroyed" in str(e)
    c.destroy()  # idempotent
    return out


class _CudaStreamLike:
    def __cuda_stream__(self):
        return (0, 0x1234)


@pytest.mark.timeout(60)
def test_bad_input_leaves_communicator_usable():
    for res in run_ranks(_bad_inputs, 2, _uid(), timeout=40):
        bad = {k: v for k, v in res.items() if v is not True}
        assert not bad, bad


def _overlaps(rank, n, uid):
    """Each collective with an output that overlaps its input other than in place: refused on every rank, the
    communicator usable after; the explicit in-place layouts: right results."""
    c = _comm(rank, n, uid)
    out = {}

    def refused(name, call, op):
        try:
            call()
            out[name] = "accepted"
        except ValueError as e:
            out[name] = f"{op}: " in str(e) and "overlap in memory" in str(e)
        x = np.ones(2, np.float32)
        c.all_reduce(x)
        out[name + " then"] = bool((x == n).all())

    big = np.zeros((1 << 16) + 8, np.float32)
    refused("all_reduce", lambda: c.all_reduce(big[:1 << 16], big[8:]), "all_reduce")
    refused("broadcast", lambda: c.broadcast(big[:1 << 16], 0, big[8:]), "broadcast")
    refused("reduce", lambda: c.reduce(big[:1 << 16], 0, big[8:]), "reduce")
    g = np.zeros(4 * n + 1, np.float32)
    whole = g[:4 * n]  # exactly n blocks of 4, as the block g[1:5] needs
    refused("all_gather", lambda: c.all_gather(g[1:5], whole), "all_gather")
    refused("reduce_scatter", lambda: c.reduce_scatter(whole, g[1:5]), "reduce_scatter")
    refused("all_to_all", lambda: c.all_to_all(g[:2 * n], g[1:2 * n + 1]), "all_to_all")
    if n == 1:  # the root's output (gather) or input (scatter) alone can overlap: refused there, not elsewhere
        refused("gather", lambda: c.gather(g[1:5], whole, root=0), "gather")
        refused("scatter", lambda: c.scatter(big[:4], big[2:6], root=0), "scatter")
    refused("sendrecv", lambda: c.sendrecv(g[:4], g[2:6], rank ^ 1 if n > 1 else 0), "sendrecv")

    # the in-place layouts, passed explicitly
    x = np.full(6, rank + 1, np.float32)
    c.all_reduce(x[:4], x)  # same start, a larger output
    out["all_reduce in place"] = x[:4].tolist() == [n * (n + 1) / 2] * 4 and x[4:].tolist() == [rank + 1] * 2
    a = np.zeros(4 * n, np.float32)
    a[4 * rank:4 * rank + 4] = rank + 1
    c.all_gather(a[4 * rank:4 * rank + 4], a)
    out["all_gather in place"] = a.tolist() == [float(r + 1) for r in range(n) for _ in range(4)]
    b = np.arange(4 * n, dtype=np.float32)
    c.reduce_scatter(b, b[4 * rank:4 * rank + 4])
    mine = range(4 * rank, 4 * rank + 4)
    out["reduce_scatter in place"] = b[4 * rank:4 * rank + 4].tolist() == [n * float(v) for v in mine]
    t = np.full(2 * n, 10 * rank, np.float32) + np.repeat(np.arange(n, dtype=np.float32), 2)
    c.all_to_all(t, t)
    out["all_to_all in place"] = t.tolist() == [float(10 * j + rank) for j in range(n) for _ in range(2)]
    gth = np.zeros(2 * n, np.float32)
    gth[2 * rank:2 * rank + 2] = rank + 1
    c.gather(gth[2 * rank:2 * rank + 2], gth if rank == 0 else None, root=0)
    out["gather in place"] = rank != 0 or gth.tolist() == [float(r + 1) for r in range(n) for _ in range(2)]
    sc = np.repeat(np.arange(1, n + 1, dtype=np.float32), 2) if rank == 0 else None
    dst = sc[:2] if rank == 0 else np.zeros(2, np.float32)
    c.scatter(sc, dst, root=0)
    out["scatter in place"] = dst.tolist() == [float(rank + 1)] * 2
    c.destroy()
    return out


def test_reduce_all_gather_and_reduce_scatter_check_their_arguments():
    """Compiled whole (as all_reduce): each argument error named as before, the communicator usable after it, the
    results and the flight recorder's entries as for any operation."""
    c = pycoll.init(0, 1, unique_id=pycoll.get_unique_id(backend="host"), backend="host", name="checks")
    try:
        x, d = np.arange(4, dtype=np.float32), np.zeros(8, np.float64)
        bad = [
            (lambda: c.all_gather(x, d), ValueError, "all_gather: input is Float but output is Double; they must"),
            (lambda: c.all_gather(x, np.zeros(3, np.float32)), ValueError,
             r"all_gather: output has 3 elements but needs exactly 4 \(4 elements x 1 ranks\)"),
            (lambda: c.reduce_scatter(np.zeros(3, np.float32), np.zeros(4, np.float32)), ValueError,
             r"reduce_scatter: input has 3 elements but needs exactly 4 \(4 elements x 1 ranks\)"),
            (lambda: c.reduce_scatter(x, d[:4]), ValueError, "reduce_scatter: input is Float but output is Double"),
            (lambda: c.reduce_scatter(x, op="median"), ValueError, "unknown reduction op 'median'"),
            (lambda: c.reduce(x, 1), ValueError, "root 1 is out of range for a communicator of 1 ranks"),
            (lambda: c.reduce(x, 0, np.zeros(2, np.float32)), ValueError, "reduce: output has 2 elements"),
            (lambda: c.reduce(x, 0.0), TypeError, "root must be an int rank"),
            (lambda: c.all_gather(x, np.frombuffer(b"\0" * 16, np.float32)), ValueError,
             "output: the array is read-only"),
            (lambda: c.all_gather(x, [1, 2]), TypeError, "output: cannot use an object of type list"),
        ]
        for call, exc, text in bad:
            with pytest.raises(exc, match=text):
                call()
        y = np.zeros(4, np.float32)
        c.reduce(x, 0, y, op="max")
        g = np.zeros(4, np.float32)
        c.all_gather(x, g)
        r = np.zeros(4, np.float32)
        c.reduce_scatter(x, r)
        inplace = x.copy()
        c.all_gather(None, inplace)
        w = c.reduce_scatter(x.copy(), async_op=True)
        w.wait()
        assert y.tolist() == g.tolist() == r.tolist() == inplace.tolist() == x.tolist()
        rec = pycoll.flight_recorder.get_recorder()
        ops = [e["profiling_name"] for e in rec.as_dict(0)["entries"] if e["process_group"][0] == c.uid][-5:]
        assert ops == ["nccl:reduce", "nccl:all_gather", "nccl:reduce_scatter", "nccl:all_gather",
                       "nccl:reduce_scatter"], ops
        assert c.state == "active" and not c.outstanding()
    finally:
        c.destroy()


def test_all_to_all_gather_and_scatter_compiled_whole():
    """Compiled whole (as all_reduce): the results, in place and async, the library's calls and the flight
    recorder's entries as for any operation, the communicator usable after a refused call."""
    c = pycoll.init(0, 1, unique_id=pycoll.get_unique_id(backend="host"), backend="host", name="checks3")
    try:
        x = np.arange(4, dtype=np.float32)
        a, g, s = np.zeros(4, np.float32), np.zeros(4, np.float32), np.zeros(4, np.float32)
        c.all_to_all(x, a)
        c.gather(x, g, root=0)
        w = c.scatter(x, s, async_op=True)
        w.wait()
        with pytest.raises(ValueError, match="all_to_all: input is Float but output is Double"):
            c.all_to_all(x, np.zeros(4, np.float64))
        inplace = x.copy()
        c.all_to_all(inplace)
        c.gather(None, inplace)
        c.scatter(inplace)
        assert a.tolist() == g.tolist() == s.tolist() == inplace.tolist() == x.tolist()
        rec = pycoll.flight_recorder.get_recorder()
        ops = [e["profiling_name"] for e in rec.as_dict(0)["entries"] if e["process_group"][0] == c.uid][-6:]
        assert ops == ["nccl:all_to_all", "nccl:gather", "nccl:scatter", "nccl:all_to_all", "nccl:gather",
                       "nccl:scatter"], ops
        assert c.state == "active" and not c.outstanding() and c.ops_issued == 6
    finally:
        c.destroy()


@pytest.mark.timeout(60)
@pytest.mark.parametrize("n", [1, 2])
def test_overlapping_output_is_refused_and_in_place_layouts_work(n):
    for res in run_ranks(_overlaps, n, _uid(), timeout=40):
        bad = {k: v for k, v in res.items() if v is not True}
        assert not bad, bad


def test_bad_config_values():
    with pytest.raises(ValueError, match="blocking"):
        pycoll.CommConfig(blocking=3)
    with pytest.raises(ValueError, match="min_ctas"):
        pycoll.CommConfig(min_ctas=8, max_ctas=2)
    with pytest.raises(TypeError, match="comm_name"):
        pycoll.CommConfig(comm_name=5)
    with pytest.raises(ValueError, match="nvls_host_mode"):
        pycoll.CommConfig(nvls_host_mode=7)
    # NCCL's ranges (the host library's too): refused at init before, where the ranks had met
    for field, bad in (("graph_usage_mode", 3), ("graph_stream_ordering", 2), ("n_channels_per_net_peer", 65)):
        with pytest.raises(ValueError, match=rf"CommConfig.{field} must be in"):
            pycoll.CommConfig(**{field: bad})
    # alone, NCCL compares it with max_ctas unset (INT_MIN) and refuses the init, naming neither field
    with pytest.raises(ValueError, match=r"CommConfig.min_ctas \(2\) needs max_ctas too"):
        pycoll.CommConfig(min_ctas=2)
    assert pycoll.CommConfig(blocking=np.True_).blocking is True  # a numpy bool, as the other flags take it
    cfg = pycoll.CommConfig(min_ctas=2, max_ctas=4)
    cfg.min_ctas = -7  # set after it was checked: checked again as it is used
    with pytest.raises(ValueError, match="CommConfig.min_ctas must be in"):
        cfg.to_nccl(B.load("host"))


def test_config_field_too_new_for_library():
    class Old:
        version = 21805
        path = "libold.so"

    with pytest.raises(pycoll.NotSupported, match="2.27"):
        pycoll.CommConfig(comm_name="x").to_nccl(Old())
    cfg = pycoll.CommConfig(split_share=True, comm_name="trainer").to_nccl(B.load("host"))
    assert cfg.blocking == 0 and cfg.splitShare == 1 and cfg.commName == "trainer"


def _blocking_init(rank, n, uid):
    c = pycoll.init(rank, n, unique_id=uid, backend="host", config=pycoll.CommConfig(blocking=True), init_timeout=20)
    x = np.ones(4, np.float32)
    c.all_reduce(x)
    c.destroy()
    return x.tolist()


@pytest.mark.timeout(60)
def test_a_blocking_communicators_init_where_every_rank_comes():
    assert run_ranks(_blocking_init, 2, _uid(), timeout=40) == [[2.0] * 4] * 2


@pytest.mark.timeout(60, method="thread")  # a regression blocks in the library's init, which no signal ends
@pytest.mark.parametrize("how", ["init_timeout", "ctrl-c", "give_up"])
def test_a_blocking_communicators_init_keeps_init_timeout_and_ends_at_ctrl_c(monkeypatch, how):
    # CommConfig(blocking=True): the library's init returns only once every rank came, and init() waited in it until
    # the host library's own rendezvous timeout (300 s), deaf to init_timeout and to Ctrl-C
    import threading

    monkeypatch.setenv("PYCOLL_HOST_INIT_TIMEOUT", "4")  # the abandoned call's own end, within the test
    if how == "ctrl-c":
        threading.Timer(0.5, lambda: signal.pthread_kill(threading.main_thread().ident, signal.SIGINT)).start()
    timed_out = r"init of communicator 'world' \(2 ranks\) did not complete within 1 s \(a blocking communicator"
    raised, text = {"ctrl-c": (KeyboardInterrupt, None), "give_up": (RuntimeError, "the job is over"),
                    "init_timeout": (pycoll.CommTimeout, timed_out)}[how]
    t0 = time.monotonic()
    with pytest.raises(raised, match=text):  # give_up: as a nonblocking init's (it was not asked)
        pycoll.init(0, 2, unique_id=pycoll.get_unique_id(backend="host"), backend="host",
                    config=pycoll.CommConfig(blocking=True), init_timeout=1 if how == "init_timeout" else 30,
                    give_up=lambda waited: RuntimeError("the job is over") if how == "give_up" and waited > 0.5
                    else None)
    assert time.monotonic() - t0 < 3.0
    deadline = time.monotonic() + 15  # the library's call ends at its own timeout, its rendezvous removed
    while any(t.name == "pycoll-init" for t in threading.enumerate()) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not [t for t in threading.enumerate() if t.name == "pycoll-init"]


def test_the_host_librarys_own_init_deadline_is_a_comm_timeout(monkeypatch):
    # PYCOLL_HOST_INIT_TIMEOUT passing raised RemoteError ("remote process exited or there was a network error"),
    # where code catching CommTimeout for an init's timeout missed it
    monkeypatch.setenv("PYCOLL_HOST_INIT_TIMEOUT", "0.5")
    t0 = time.monotonic()
    with pytest.raises(pycoll.CommTimeout, match=r"init of communicator 'world' \(2 ranks\) did not complete: the "
                                                 r"library gave it up at its own deadline -- .*timed out after 0.5 s "
                                                 r"waiting for ranks 1 to join \(PYCOLL_HOST_INIT_TIMEOUT\)") as ei:
        pycoll.init(0, 2, unique_id=pycoll.get_unique_id(backend="host"), backend="host", init_timeout=20)
    assert time.monotonic() - t0 < 5.0 and isinstance(ei.value.__cause__, pycoll.errors.NCCLTimeoutError)
    assert ei.value.timeout == 0.5


def test_init_arguments():
    with pytest.raises(ValueError, match="rank 2 is out of range"):
        pycoll.init(2, 2, unique_id=_uid(), backend="host")
    with pytest.raises(ValueError, match="both"):
        pycoll.init(0, backend="host")
    with pytest.raises(ValueError, match="unknown backend"):
        pycoll.init(0, 1, backend="mpi")
    with pytest.raises(ValueError, match="unique_id or a store"):
        pycoll.init(0, 2, backend="host")


def test_single_rank_lifecycle_and_gc_warning():
    c = pycoll.init(0, 1, backend="host")
    x = np.arange(5, dtype=np.float32)
    c.all_reduce(x)
    assert x.tolist() == list(range(5))
    with pycoll.init(0, 1, backend="host", name="ctx") as d:
        d.barrier()
    assert d.state == "destroyed"
    with pytest.warns(ResourceWarning, match="garbage-collected"):
        del c
        gc.collect()


def test_operation_arguments_of_the_observer_methods_are_checked():
    # comm.refresh(None) read fields of None in compiled code (a segfault); another communicator's Work was taken
    a = pycoll.init(0, 1, backend="host", name="a")
    b = pycoll.init(0, 1, backend="host", name="b")
    try:
        w = b.all_reduce(np.ones(2, np.float32), async_op=True)
        w.wait()
        for method in (a.refresh, a.try_refresh, a.await_ready, a._retire):
            with pytest.raises(TypeError):
                method(None)
        for method in (a.refresh, a.try_refresh, a.await_ready):
            with pytest.raises(ValueError, match="another communicator than 'a'"):
                method(w)
        with pytest.raises(TypeError):
            w.completes_with(None)
        with pytest.raises(TypeError):
            a._pending.append(None)
        x = np.ones(2, np.float32)
        a.all_reduce(x)  # still usable
        assert x.tolist() == [1.0, 1.0]
    finally:
        a.destroy()
        b.destroy()


def test_abort_then_any_call_raises():
    c = pycoll.init(0, 1, backend="host")
    c.abort()
    with pytest.raises(pycoll.CommAborted, match="aborted"):
        c.all_reduce(np.ones(2, np.float32))
    with pytest.raises(pycoll.CommAborted):
        c.split(0)
    c.abort()
    c.destroy()  # both no-ops after an abort


# -- failures -------------------------------------------------------------------------------------


def _stopped_peer(rank, n, uid):
    c = _comm(rank, n, uid)
    c.barrier()
    if rank == n - 1:
        os.kill(os.getpid(), signal.SIGSTOP)
        return None
    t0 = time.monotonic()
    try:
        c.all_reduce(np.ones(4, np.float32), timeout=1.0)
        return "no exception"
    except pycoll.CommTimeout:
        how = "timeout"
    except pycoll.RemoteError:  # the other waiting rank's deadline came first: its abort reached this rank
        how = "remote"
    elapsed = time.monotonic() - t0
    try:
        c.all_reduce(np.ones(4, np.float32))
        later = "no exception"
    except pycoll.CommAborted:
        later = "aborted"
    return how, elapsed, later, c.state


@pytest.mark.timeout(60)
def test_stopped_peer_times_out_and_aborts():
    res = run_ranks(_stopped_peer, 3, _uid(), timeout=30, may_die=[2])
    for rank in (0, 1):
        how, elapsed, later, state = res[rank]
        # both wait for the stopped rank 2 from about the same moment; where one rank was descheduled, the other's
        # timeout (and abort) may reach it just before its own deadline
        assert 1.0 <= elapsed < 2.5 if how == "timeout" else 0.5 <= elapsed < 2.5, res
        assert later == "aborted" and state == "aborted"
    assert "timeout" in (res[0][0], res[1][0]), res


@pytest.mark.timeout(30)
@pytest.mark.parametrize("leave", [SystemExit, KeyboardInterrupt])
@pytest.mark.parametrize("where", ["callback", "observer"])
def test_user_code_that_exits_keeps_the_policy_and_the_thread(where, leave, caplog):
    # sys.exit() in a failure callback, or in an observer's comm_failed, ended the watchdog thread running it,
    # silently, before the policy acted: the communicator stayed active and no later hang was seen. Off the main
    # thread it is logged and ignored now; in the main thread it goes on once the policy has acted
    import threading

    from pycoll import hooks

    def exits(*args):
        raise leave()

    class Exits(hooks.CommObserver):
        comm_failed = staticmethod(exits)

    obs = Exits()
    if where == "observer":
        hooks.add_observer(obs)
    try:
        c = pycoll.init(0, 1, backend="host", name=f"exits-{where}")
        d = pycoll.init(0, 1, backend="host", name=f"exits-{where}-main")
        if where == "callback":
            c.failure_callbacks.append(exits)
            d.failure_callbacks.append(exits)
        survived = []
        t = threading.Thread(target=lambda: (c.fail(pycoll.CommFailure("made up")), survived.append(True)), name="w")
        t.start()
        t.join(10)
        assert survived == [True] and c.state == "aborted"
        assert f"raised {leave.__name__} in thread 'w', where it cannot end the process" in caplog.text
        with pytest.raises(leave):
            d.fail(pycoll.CommFailure("made up"))
        assert d.state == "aborted"
    finally:
        hooks.remove_observer(obs)


def test_ctrl_c_in_an_observers_enqueue_hook_fails_the_communicator():
    # the operation had its number (peers wait for it) and was left neither outstanding nor failed: the recorder
    # said completed, and the peers' reports "every rank issued" it
    from pycoll import hooks

    class Interrupted(hooks.CommObserver):
        def work_enqueued(self, work):
            raise KeyboardInterrupt

    c = pycoll.init(0, 1, backend="host", name="hook-interrupted")
    obs = Interrupted()
    hooks.add_observer(obs)
    try:
        with pytest.raises(KeyboardInterrupt):
            c.all_reduce(np.ones(2, np.float32))
    finally:
        hooks.remove_observer(obs)
    assert isinstance(c.failure, pycoll.CommAborted) and "interrupted" in str(c.failure) and c.state == "aborted"


def _revoked_after_a_death(rank, n, uid):
    c = _comm(rank, n, uid, on_failure="revoke")
    c.barrier()
    if rank == 2:
        os.kill(os.getpid(), signal.SIGKILL)
    if rank == 1:
        time.sleep(1.0)  # rank 0 has met rank 2's death and revoked by now
    try:  # rank 0 waits for the dead rank 2, rank 1 for rank 0 only
        c.recv(np.ones(4, np.float32), peer=2 if rank == 0 else 0)
        return "no exception"
    except pycoll.CommFailure as e:
        return str(e)


@pytest.mark.timeout(60)
def test_a_rank_that_revoked_after_a_death_names_the_dead_rank():
    # rank 1 was told only "rank 0 revoked the communicator": its recovery would exclude the wrong rank
    res = run_ranks(_revoked_after_a_death, 3, _uid(), timeout=30, may_die=[2])
    assert "rank 2" in res[0] and "exited" in res[0], res[0]
    assert "rank 0 revoked the communicator after it failed: " in res[1] and "rank 2 (pid" in res[1], res[1]


def test_the_default_timeout_is_checked_as_it_is_set_and_inherited_by_a_split():
    # comm.timeout = "5" (or -1) was taken, and broke the watchdog and every deadline
    c = pycoll.init(0, 1, backend="host", timeout=7)
    try:
        for bad, exc in (("5", TypeError), (-1, ValueError), (float("inf"), ValueError)):
            with pytest.raises(exc, match="timeout"):
                c.timeout = bad
        c.timeout = 3
        w = c.all_reduce(np.ones(2, np.float32))
        assert c.timeout == 3.0 and w.timeout == 3.0
        child = c.split(0, timeout=60)  # bounds the split; the child's operations take the parent's default
        assert child.timeout == 3.0
        child.destroy()
    finally:
        c.destroy()


def _torch_reduce_ops(rank, n, uid):
    import torch
    import torch.distributed as dist

    c = _comm(rank, n, uid)
    out = {}
    for op in (dist.ReduceOp.SUM, dist.ReduceOp.AVG, dist.ReduceOp.PRODUCT, dist.ReduceOp.MIN, dist.ReduceOp.MAX,
               dist.ReduceOp(dist.ReduceOp.MAX)):
        x = torch.tensor([2.0 + rank])
        c.all_reduce(x, op=op)
        y = torch.zeros(1)
        c.reduce_scatter(torch.tensor([2.0 + rank, 2.0 + rank]), y, op=op)
        out[str(getattr(op, "op", op))] = (x.item(), y.item())
    for bad in (dist.ReduceOp.BAND, dist.ReduceOp.PREMUL_SUM):
        try:
            c.all_reduce(torch.ones(1), op=bad)
            out[str(bad)] = "no exception"
        except ValueError as e:
            out[str(bad)] = "has no pycoll counterpart" in str(e) or str(e)
    c.destroy()
    return out


@pytest.mark.timeout(60)
def test_torch_reduce_ops_mean_what_they_mean_in_torch():
    # torch numbers its ReduceOp otherwise than NCCL (AVG 1, PRODUCT 2, MAX 4) and gives it __index__: AVG ran as
    # a product, PRODUCT as max, MAX as an average, silently
    pytest.importorskip("torch.distributed")
    for res in run_ranks(_torch_reduce_ops, 2, _uid(), timeout=40):
        assert res == {"RedOpType.SUM": (5.0, 5.0), "RedOpType.AVG": (2.5, 2.5), "RedOpType.PRODUCT": (6.0, 6.0),
                       "RedOpType.MIN": (2.0, 2.0), "RedOpType.MAX": (3.0, 3.0), "RedOpType.BAND": True,
                       "RedOpType.PREMUL_SUM": True}, res


def test_a_library_error_gives_the_job_wide_rank_of_the_peer_it_names():
    # after a reshape the communicator's ranks are not the launcher's: "rank 2 (pid ...) exited" named a live
    # process (the replacement in slot 2) where slot 3 had died
    c = pycoll.init(0, 1, backend="host", global_ranks=[5])
    try:
        assert c._job_ranks("AllReduce : rank 0 (pid 17) exited; rank 0 revoked the communicator") == \
            "AllReduce : rank 0 (global 5) (pid 17) exited; rank 0 (global 5) revoked the communicator"
        assert c._job_ranks("count mismatch at collective #2") == "count mismatch at collective #2"
        assert c._job_ranks("rank 0 called AllReduce(count=5) but rank 0 called") == \
            "rank 0 (global 5) called AllReduce(count=5) but rank 0 (global 5) called"
        # an error a call returned (a finalize's, say) too, not only an asynchronous one
        e = pycoll.RemoteError(6, "ncclCommFinalize", "remote process exited", "rank 0 (pid 17) exited", "lib")
        with pytest.raises(pycoll.RemoteError, match=r"rank 0 \(global 5\) \(pid 17\) exited"):
            c.handle_call_error(e, None)
    finally:
        c.abort()


def _dead_peer(rank, n, uid):
    c = _comm(rank, n, uid)
    seen = []
    c.failure_callbacks.append(lambda comm, exc: seen.append((comm is c, type(exc).__name__, comm.state)))
    c.barrier()
    if rank == 1:
        os.kill(os.getpid(), signal.SIGKILL)
    t0 = time.monotonic()
    try:
        for _ in range(1000):
            c.all_reduce(np.ones(4, np.float32))
        return "no exception"
    except pycoll.RemoteError as e:
        return isinstance(e, pycoll.CommFailure), time.monotonic() - t0, seen, c.state


@pytest.mark.timeout(60)
def test_dead_peer_is_a_remote_error():
    res = run_ranks(_dead_peer, 3, _uid(), timeout=30, may_die=[1])
    assert isinstance(res[1], Died)
    for rank in (0, 2):
        is_failure, elapsed, seen, state = res[rank]
        assert is_failure and elapsed < 2.0
        # the failure callback ran once, before the policy (abort) acted
        assert seen == [(True, "RemoteError", "active")] and state == "aborted"


# -- init through a store -------------------------------------------------------------------------


def _init_store(rank, n, path, size):
    from pycoll.store import FileStore

    store = FileStore(path)
    try:
        c = pycoll.init(rank, size, store=store, backend="host", init_timeout=2.0)
    except (pycoll.CommTimeout, pycoll.RemoteError) as e:
        return f"{type(e).__name__}: {e}"
    x = np.full(2, 1.0, np.float32)
    c.all_reduce(x)
    c.destroy()
    return x.tolist()


@pytest.mark.timeout(60)
def test_init_through_a_store(tmp_path):
    res = run_ranks(_init_store, 3, str(tmp_path / "store"), 3, timeout=30)
    assert res == [[3.0, 3.0]] * 3
    # the meeting's keys (the arrivals) are gone once the communicator is up -- the unique id's holds the few bytes
    # of the mark that it was used -- and the watchdog's records of each rank (its process, its progress) once it
    # is destroyed: a store that makes communicators over and over (a weight sync's) does not fill up
    store = pycoll.FileStore(str(tmp_path / "store"))
    (key,) = store.list_keys("pycoll/init/")  # pycoll/init/world/<this process's count>/unique_id
    assert key.endswith("/unique_id") and store.get(key).startswith(b"pycoll-init-made a communicator was made")
    assert [k for k in store.list_keys("pycoll/fr/") if k.startswith(("pycoll/fr/proc", "pycoll/fr/progress"))] == []


def _init_two_groups_one_name(rank, n, path):
    from pycoll.store import FileStore

    members = (0, 1) if rank < 2 else (2, 3)
    if rank in (1, 2):
        time.sleep(0.5)  # rank 3 asks first: rank 0's unique id was there, another group's
    c = pycoll.init(members.index(rank), 2, store=FileStore(path), backend="host", name="tp", global_ranks=members,
                    init_timeout=20)
    x = np.full(2, float(rank), np.float32)
    c.all_reduce(x)
    out = (x.tolist(), c.global_ranks)
    c.destroy()
    return out


@pytest.mark.timeout(60)
def test_groups_sharing_a_store_and_a_name_meet_apart_by_their_members(tmp_path):
    # two groups of two, both init(name="tp"), each process at its init #1 of that name: they met at one key, and a
    # rank took whichever group's unique id it found -- communicators of ranks {0, 3} and {1, 2}, with no error
    res = run_ranks(_init_two_groups_one_name, 4, str(tmp_path / "store"), timeout=40)
    assert res == [([1.0, 1.0], (0, 1))] * 2 + [([5.0, 5.0], (2, 3))] * 2


def test_a_group_of_another_size_than_the_launchers_job_has_unknown_job_ranks(monkeypatch):
    # init(0, 1) in rank 3 of a launched job of 4: its job rank is 3, not 0 (dumps named rank 0 overwrote rank 0's)
    monkeypatch.setenv("PYCOLL_RANK", "3")
    monkeypatch.setenv("PYCOLL_WORLD_SIZE", "4")
    c = pycoll.init(0, 1, backend="host", name="alone")
    try:
        assert c.global_ranks is None and c.global_rank == 0
    finally:
        c.destroy()
    # rank and world_size given where the launcher's environment would give them (and its store): said so
    with pytest.raises(ValueError, match="there is one: call pycoll.init.. without rank and world_size"):
        pycoll.init(3, 4, backend="host", name="given")
    monkeypatch.setenv("PYCOLL_RANK", "0")
    monkeypatch.setenv("PYCOLL_WORLD_SIZE", "1")
    c = pycoll.init(0, 1, backend="host", name="alone")
    try:
        assert c.global_ranks == (0,)
    finally:
        c.destroy()


@pytest.mark.timeout(30)
def test_init_keys_go_also_where_the_unique_id_is_given():
    """The arrival keys of an init through a store go once it is up also where the unique id was given (the elastic
    layer's inits give it) and at one rank: a store shared by communicators made over and over keeps none of them."""
    store = pycoll.MemoryStore()
    uid = pycoll.get_unique_id(backend="host")
    for kwargs in ({"unique_id": uid}, {}):
        for _ in range(3):
            pycoll.init(0, 1, store=store, backend="host", name="keys", **kwargs).destroy()
    assert store.list_keys("pycoll/init/") == []


def test_a_second_rank_0_at_the_same_keys_is_refused():
    # two groups under one name on one store (or a restarted process whose count started again): the second rank 0
    # must not replace the first one's unique id, which split their ranks between two ids with no error
    store = pycoll.MemoryStore()
    store.set("pycoll/init/clash-test/1/unique_id", bytes(pycoll.get_unique_id(backend="host")))
    with pytest.raises(pycoll.StoreError, match=r"init of 'clash-test' \(this process's init #1 with that name\): "
                                                r"another rank 0 already published its unique id .*own name="):
        pycoll.init(0, 2, store=store, name="clash-test", backend="host", init_timeout=5)


def _two_rank_0s(rank, n, path):
    from pycoll.store import FileStore

    if rank == 1:
        time.sleep(0.5)  # the second process that thinks it is rank 0
    t0 = time.monotonic()
    try:
        pycoll.init(0, 2, store=FileStore(path), backend="host", name="twice", init_timeout=20)
        return "no exception"
    except (pycoll.StoreError, pycoll.CommAborted) as e:
        return type(e).__name__, time.monotonic() - t0, str(e)


@pytest.mark.timeout(60)
def test_a_second_rank_0_ends_the_first_ones_init_too(tmp_path):
    # the second rank 0 was refused at once, and the first one waited its whole init_timeout (120 s by default) for a
    # rank 1 that never came, then said only "ranks that never arrived: [1]"
    first, second = run_ranks(_two_rank_0s, 2, str(tmp_path / "store"), timeout=40)
    assert second[0] == "StoreError" and "another rank 0 already published" in second[2], second
    # ... naming it as what it is: the first rank 0 read "rank 0 gave the init up", as if it had itself
    assert first[0] == "CommAborted" and first[1] < 5.0, first
    assert re.search(r"a second rank 0 \(pid \d+ on .*\) came, was refused and ended it: a rank number given twice "
                     r"leaves another missing \(StoreError", first[2]), first


def _init_at(rank, n, path, group):
    from pycoll.store import FileStore

    try:
        c = pycoll.init(rank, 2, store=FileStore(path), backend="host", name="used-keys", init_timeout=5)
    except pycoll.StoreError as e:
        return type(e).__name__, str(e)
    x = np.full(1, 10.0 ** group, np.float32)
    c.all_reduce(x)
    c.destroy()
    return float(x[0])


@pytest.mark.timeout(60)
def test_ranks_that_come_to_the_keys_of_a_communicator_made_already_are_refused(tmp_path):
    # a second group (or a job started again) under one name at one store came to the keys once the first group's
    # communicator was made and the unique id deleted: its rank 0 published a fresh one, and a rank 1 of either group
    # still waiting joined it -- the groups mixed, every sum wrong (1 + 10 for 2 and 20), no error
    path = str(tmp_path / "store")
    assert run_ranks(_init_at, 2, path, 0, timeout=30) == [2.0, 2.0]
    for rank, (kind, text) in enumerate(run_ranks(_init_at, 2, path, 1, timeout=30)):
        assert kind == "StoreError", (kind, text)
        assert re.search(rf"init of 'used-keys' \(this process's init #1 with that name\): a communicator was made at "
                         rf"these keys \(its rank 0: pid \d+ on .*\), so this rank \(rank {rank}\) comes after its "
                         rf"group: .* own name=", text), text


def _killed_before_marking(rank, n, path, trace):
    from pycoll.store import FileStore

    if rank == 0:
        pycoll.failpoints.configure(f"init.made.before_mark=kill;trace={trace}")
    c = pycoll.init(rank, 2, store=FileStore(path), backend="host", name="marked", init_timeout=10)
    return c.rank  # (left for the exit: its peer is gone)


@pytest.mark.timeout(60)
def test_a_rank_0_killed_before_it_marks_the_keys_used_leaves_its_peers_init_made(tmp_path):
    """Failpoint init.made.before_mark: the communicator is made on every rank before rank 0 marks the keys."""
    trace = str(tmp_path / "fired")
    res = run_ranks(_killed_before_marking, 2, str(tmp_path / "store"), trace, timeout=40, may_die=[0])
    with open(trace) as f:
        assert f.read().startswith("init.made.before_mark kill")
    assert res[1] == 1 and res[0].exitcode in (None, -signal.SIGKILL), res


def _one_rank_cannot_start(rank, n, path, how, late):
    from pycoll.store import FileStore

    if rank == 1:
        if how in ("setting", "init timeout"):  # a stale environment on one node
            os.environ["PYCOLL_TIMEOUT" if how == "setting" else "PYCOLL_INIT_TIMEOUT"] = "abc"
        if late:
            time.sleep(0.5)  # after rank 0 published the unique id and waits in the library
    t0 = time.monotonic()
    try:
        pycoll.init(rank, n, store=FileStore(path), backend="host", name="half",
                    init_timeout=None if how == "init timeout" and rank else 20,
                    library=str(os.path.join(path + ".none", "libnccl.so.2")) if how == "library" and rank else None)
        return "no exception"
    except Exception as e:
        return type(e).__name__, round(time.monotonic() - t0, 1), str(e)


@pytest.mark.timeout(60)
@pytest.mark.parametrize("how", ["setting", "library", "init timeout"])
@pytest.mark.parametrize("late", [False, True])
def test_a_rank_that_cannot_start_its_init_ends_the_others(tmp_path, how, late):
    # a bad PYCOLL_* value, a library (or GPU) one rank lacks: raised before the init's give-up was armed, so rank 0
    # waited its whole init_timeout (120 s by default) and blamed "ranks that never arrived: [1]"
    r0, r1 = run_ranks(_one_rank_cannot_start, 2, str(tmp_path / "store"), how, late, timeout=40)
    assert r1[0] == ("LibraryError" if how == "library" else "ValueError"), r1
    assert r0[0] == "CommAborted" and r0[1] < 5.0 and f"rank 1 gave the init up ({r1[0]}" in r0[2], r0


def test_a_rank_whose_rank_0_never_publishes_is_told_why():
    with pytest.raises(pycoll.StoreTimeout, match=r"rank 0 published no unique id at 'pycoll/init/lonely-test/1/"
                                                  r"unique_id' within .* it has not reached its init #1 .*unique_id="):
        pycoll.init(1, 2, store=pycoll.MemoryStore(), name="lonely-test", backend="host", init_timeout=0.3)


def _init_given_up_early(rank, n, path, case):
    from pycoll.store import FileStore

    class Refusing(FileStore):
        def set(self, key, value):
            if "/arrived/" in key:
                raise pycoll.StoreError("refused here")
            return super().set(key, value)

    store = Refusing(path) if case == "failed-0" and rank == 0 else FileStore(path)
    late = 0 if case == "late-0" else 1
    if rank == late:
        time.sleep(1.0)
    t0 = time.monotonic()
    try:
        pycoll.init(rank, 2, store=store, backend="host", init_timeout=0.3 if rank != late else 5.0)
    except Exception as e:
        return type(e).__name__, time.monotonic() - t0, str(e)
    return None


@pytest.mark.timeout(60)
def test_an_init_given_up_before_the_communicator_was_made_is_said_at_the_store(tmp_path):
    # late-0: rank 1 timed out waiting for the unique id; rank 0, arriving later, fails at once (it published and
    # waited out its own init_timeout for a rank that had left). failed-0: rank 0 failed after it published the
    # unique id, before its communicator was made (as on an error the library raises at once); rank 1, arriving
    # later, fails at once (it waited out its init_timeout, told "every rank arrived")
    r0, r1 = run_ranks(_init_given_up_early, 2, str(tmp_path / "a"), "late-0", timeout=30)
    assert r1[0] == "StoreTimeout" and r0[0] == "CommAborted" and r0[1] < 1.0, (r0, r1)
    assert re.search(r"rank 1 gave the init up \(StoreTimeout: .*\) before this rank \(rank 0\) arrived", r0[2]), r0
    r0, r1 = run_ranks(_init_given_up_early, 2, str(tmp_path / "b"), "failed-0", timeout=30)
    assert r0[0] == "StoreError" and r1[0] == "CommAborted" and r1[1] < 1.0, (r0, r1)
    assert "rank 0 gave the init up (StoreError: refused here) before this rank (rank 1) arrived" in r1[2], r1


_INIT_TO_BE_TERMINATED = """
import sys, pycoll
from pycoll.store import FileStore
print("waiting", flush=True)
pycoll.init(0, 2, store=FileStore(sys.argv[1]), backend="host", init_timeout=30, name=sys.argv[2])
"""


@pytest.mark.timeout(60)
@pytest.mark.parametrize("note", ["said", "store hangs"])
def test_a_rank_ended_by_sigterm_in_its_init_says_so_at_the_store(tmp_path, note):
    # a pre-empted rank (SIGTERM while it waited for its peers) aborted its init and ended without the note every
    # other failure leaves at the store: a rank arriving later waited its whole init_timeout, told "every rank
    # arrived at the store and called the library's init". A note the store does not take holds the process no
    # longer than hooks.INIT_NOTE_S (failpoint init.given_up.before_publish asleep for 20 s)
    import subprocess
    import sys

    from pycoll import hooks
    from pycoll.store import FileStore

    path = str(tmp_path / "store")
    env = dict(os.environ, PYTHONPATH=REPO)
    if note == "store hangs":
        env["PYCOLL_FAILPOINTS"] = "init.given_up.before_publish=sleep(20000)"
    name = f"terminated-{note}"  # this process's first init of that name, as the child's
    p = subprocess.Popen([sys.executable, "-c", _INIT_TO_BE_TERMINATED, path, name], stdout=subprocess.PIPE,
                         text=True, env=env)
    try:
        assert p.stdout.readline() == "waiting\n"
        time.sleep(1.0)  # in its init: the unique id published, waiting in the library for rank 1
        t0 = time.monotonic()
        p.send_signal(signal.SIGTERM)
        assert p.wait(20) == -signal.SIGTERM
        assert time.monotonic() - t0 < hooks.INIT_NOTE_S + 3.0
    finally:
        p.kill()
        p.wait()
        p.stdout.close()
    t0 = time.monotonic()
    if note == "store hangs":  # nothing said: the init waits for rank 0 (whose id is there) until its timeout
        with pytest.raises(pycoll.CommTimeout):
            pycoll.init(1, 2, store=FileStore(path), backend="host", init_timeout=1, name=name)
        return
    with pytest.raises(pycoll.CommAborted, match=r"rank 0 gave the init up \(CommAborted: its process was ended by "
                                                 r"SIGTERM\) before this rank \(rank 1\) arrived"):
        pycoll.init(1, 2, store=FileStore(path), backend="host", init_timeout=10, name=name)
    assert time.monotonic() - t0 < 3.0


_INIT_TO_BE_KILLED = """
import sys, pycoll
print("waiting", flush=True)
pycoll.init(0, 2, unique_id=pycoll.UniqueId.from_bytes(bytes.fromhex(sys.argv[1])), backend="host", init_timeout=30)
"""


@pytest.mark.timeout(60)
def test_a_rank_that_arrives_after_the_first_rank_died_in_the_rendezvous_fails_at_once():
    # rank 0, SIGKILLed (the OOM killer) as it waited for rank 1 in the library's rendezvous: rank 1, arriving later,
    # swept its segment away, waited in a new one for its whole init_timeout and was told "every rank arrived"
    import subprocess
    import sys

    uid = pycoll.get_unique_id(backend="host")
    p = subprocess.Popen([sys.executable, "-c", _INIT_TO_BE_KILLED, bytes(uid).hex()], stdout=subprocess.PIPE,
                         text=True, env=dict(os.environ, PYTHONPATH=REPO))
    try:
        assert p.stdout.readline() == "waiting\n"
        time.sleep(1.0)  # in the library's rendezvous, its segment made
        p.kill()
        assert p.wait(20) == -signal.SIGKILL
    finally:
        p.kill()
        p.wait()
        p.stdout.close()
    t0 = time.monotonic()
    with pytest.raises(pycoll.RemoteError, match=r"the process \(pid \d+\) that began this communicator's rendezvous "
                                                 r"exited before the communicator was initialized"):
        pycoll.init(1, 2, unique_id=uid, backend="host", init_timeout=10)
    assert time.monotonic() - t0 < 3.0


@pytest.mark.timeout(60)
def test_a_note_of_an_earlier_attempt_says_so(tmp_path):
    # a job started again at a store that kept its first attempt's note (rank 0 alone, timed out): the second
    # attempt's rank 0 read "rank 0 gave the init up ... before this rank (rank 0) arrived", which contradicts itself
    import subprocess
    import sys

    from pycoll.store import FileStore

    path = str(tmp_path / "store")
    first = ("import sys, pycoll\nfrom pycoll.store import FileStore\ntry:\n    pycoll.init(0, 2, store=FileStore("
             "sys.argv[1]), backend='host', init_timeout=0.5, name='attempts')\nexcept pycoll.CommTimeout:\n    pass\n")
    subprocess.run([sys.executable, "-c", first, path], env=dict(os.environ, PYTHONPATH=REPO), timeout=30, check=True)
    with pytest.raises(pycoll.CommAborted, match=r"rank 0 gave the init up \(CommTimeout: .*\) before this rank "
                                                 r"\(rank 0\) arrived -- a rank of this number: an earlier attempt's "
                                                 r"note, the job started again at this store; .* own name="):
        pycoll.init(0, 2, store=FileStore(path), backend="host", init_timeout=5, name="attempts")


@pytest.mark.timeout(60)
def test_init_timeout_names_missing_ranks(tmp_path):
    res = run_ranks(_init_store, 2, str(tmp_path / "store"), 3, timeout=30)
    # the first rank to time out names the missing rank and aborts; the other one either times out
    # too or learns of that abort as a remote error -- never a hang
    timeouts = [m for m in res if m.startswith("CommTimeout")]
    assert timeouts, res
    for msg in timeouts:
        assert "did not complete within 2 s" in msg and "never arrived: [2]" in msg, msg
    for msg in res:
        assert msg.startswith("CommTimeout") or "aborted" in msg, msg
        assert "never arrived: [2]" in msg, msg  # the abort a timeout made elsewhere names the missing rank too
    # rank 2 comes late: the first rank to give up said so at the store, so it fails at once (it waited out its own
    # init_timeout alone before, for ranks that had left)
    (kind, took, msg), = run_ranks(_late_rank_2, 1, str(tmp_path / "store"), timeout=30)
    assert kind == "CommAborted" and took < 1.0, (kind, took, msg)
    assert re.match(r"init of 'world' \(this process's init #1 with that name\): rank [01] gave the init up "
                    r"\((CommTimeout|RemoteError): .*\) before this rank \(rank 2\) arrived", msg), msg


def _init_losing_the_store(rank, n, port):
    import threading

    t0 = time.monotonic()
    if rank == 0:  # hosts the store, and stops it 1 s in, while the ranks wait for rank 2
        store = pycoll.TCPStore.hosting("127.0.0.1", port, token="t")
        threading.Timer(1.0, store.server.close).start()
    else:
        store = pycoll.TCPStore("127.0.0.1", port, "t")
    try:
        pycoll.init(rank, 3, store=store, backend="host", init_timeout=2.0 if rank == 0 else 8.0)
    except Exception as e:
        return type(e).__name__, time.monotonic() - t0, str(e)
    return "no error", time.monotonic() - t0, ""


@pytest.mark.timeout(60)
def test_an_init_whose_store_is_gone_raises_its_own_error_in_time():
    # who is missing is read from the store as the error is raised: a store that went (its server in rank 0) must
    # neither replace the error (StoreLost) nor hold it back for the store client's connect_timeout (60 s)
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    (k0, t0, m0), (k1, t1, m1) = run_ranks(_init_losing_the_store, 2, port, timeout=45)
    assert k0 == "CommTimeout" and t0 < 6, (k0, t0, m0)
    assert "did not complete within 2 s; who is missing is unknown (StoreLost: " in m0, m0
    assert k1 == "RemoteError" and t1 < 8, (k1, t1, m1)
    assert "rank 0 aborted while the other ranks were joining; who is missing is unknown (StoreLost: " in m1, m1


def _late_rank_2(_, n, path):
    t0 = time.monotonic()
    try:
        pycoll.init(2, 3, store=pycoll.FileStore(path), backend="host", init_timeout=5.0)
    except Exception as e:
        return type(e).__name__, time.monotonic() - t0, str(e)
    return None


def _init_given_up_killed(rank, n, path, trace):
    if rank == 0:
        pycoll.failpoints.configure(f"init.given_up.before_publish=kill;trace={trace}")
    try:
        pycoll.init(rank, 3, store=pycoll.FileStore(path), backend="host", init_timeout=1.0)
    except (pycoll.CommTimeout, pycoll.RemoteError) as e:
        time.sleep(0.3)  # rank 0 reaches its failpoint meanwhile, if it gave up after this rank
        return type(e).__name__
    return None


@pytest.mark.timeout(60)
def test_a_rank_killed_as_it_gives_an_init_up_leaves_it_given_up_by_the_others(tmp_path):
    """Failpoint init.given_up.before_publish: rank 0, killed before it says at the store that it gave the init up,
    leaves that to rank 1; rank 2, late, still fails at once, naming rank 1."""
    path, trace = str(tmp_path / "store"), str(tmp_path / "fired")
    res = run_ranks(_init_given_up_killed, 2, path, trace, timeout=30, may_die=[0])
    with open(trace) as f:
        assert f.read().startswith("init.given_up.before_publish kill")
    assert res[0] == Died(0, -signal.SIGKILL) and res[1] in ("CommTimeout", "RemoteError"), res
    (kind, took, msg), = run_ranks(_late_rank_2, 1, path, timeout=30)
    assert kind == "CommAborted" and took < 1.0 and "rank 1 gave the init up" in msg, (kind, took, msg)


# -- reshape through the Communicator -------------------------------------------------------------


def _reshape(rank, n, uid, path):
    from pycoll.store import FileStore

    store = FileStore(path)
    out = {}
    if rank == n - 1:  # the newcomer of the grow
        uid_grow = store.get("grow_uid", timeout=30)
        c = pycoll.join(n, rank, uid_grow, backend="host")
        x = np.full(2, rank + 1.0, np.float32)
        c.all_reduce(x)
        out["grow"] = x.tolist() == [n * (n + 1) / 2] * 2
        c.destroy()
        return out
    c = _comm(rank, n - 1, uid)
    # split by parity
    sub = c.split(rank % 2)
    x = np.full(2, rank + 1.0, np.float32)
    sub.all_reduce(x)
    out["split"] = x.tolist() == [float(sum(r + 1 for r in range(n - 1) if r % 2 == rank % 2))] * 2
    out["split_global_ranks"] = sub.global_ranks == tuple(r for r in range(n - 1) if r % 2 == rank % 2)
    sub.destroy()
    none = c.split(None if rank == 0 else 1)
    out["nocolor"] = (none is None) if rank == 0 else (none.size == n - 2)
    if none is not None:
        none.destroy()
    # shrink away rank 0 (it does not call shrink)
    if rank != 0:
        small = c.shrink([0])
        y = np.full(2, 1.0, np.float32)
        small.all_reduce(y)
        out["shrink"] = y.tolist() == [float(n - 2)] * 2 and small.rank == rank - 1
        out["shrink_global_ranks"] = small.global_ranks == tuple(range(1, n - 1))
        small.destroy()
    # grow back with a new process; every existing rank passes the id (rank 0 did not take part in
    # the shrink, so the ranks disagree on how many reshapes this communicator has seen)
    if rank == 0:
        store.set("grow_uid", bytes(c.get_unique_id()))
    big = c.grow(n, store.get("grow_uid", timeout=30))
    x = np.full(2, rank + 1.0, np.float32)
    big.all_reduce(x)
    out["grow"] = x.tolist() == [n * (n + 1) / 2] * 2 and big.rank == rank
    big.destroy()
    c.destroy()
    return out


@pytest.mark.timeout(90)
def test_split_shrink_grow(tmp_path):
    for res in run_ranks(_reshape, 4, _uid(), str(tmp_path / "store"), timeout=60):
        assert all(res.values()), res


def _premul(rank, n, uid):
    c = _comm(rank, n, uid)
    with c.pre_mul_sum(0.5, np.float32) as op:
        x = np.full(3, rank + 1.0, np.float32)
        c.all_reduce(x, op=op)
    ok = x.tolist() == [0.5 * n * (n + 1) / 2] * 3
    try:
        c.all_reduce(np.ones(2, np.float64), op=c.pre_mul_sum(2.0, np.float32))
        wrong = False
    except ValueError:
        wrong = True
    # an array scalar, read when the operation runs: the operator destroyed and its PreMulSum dropped while the
    # operation waits for a late peer (it read freed memory: 1000003 instead of 6)
    a, y = np.ones(1 << 18, np.float32), np.ones(1 << 18, np.float32)
    if rank == 1:
        time.sleep(0.5)
    w0 = c.all_reduce(a, async_op=True)
    with c.pre_mul_sum(np.array([3.0], np.float32), np.float32) as op:
        w = c.all_reduce(y, op=op, async_op=True)
    del op
    gc.collect()
    junk = [np.full(1, 1e6, np.float32) for _ in range(2000)]
    w0.wait()
    w.wait()
    held = y[:3].tolist() == [3.0 * n] * 3 or y[:3].tolist()
    del junk
    c.destroy()
    return ok, wrong, held


def _reduce_nonroot_output(rank, n, uid):
    c = _comm(rank, n, uid)
    x = np.full(4, rank + 1.0, np.float32)
    out = np.zeros(4, np.float32) if rank == 0 else np.empty(0, np.float32)  # not looked at off the root
    c.reduce(x, root=0, output=out)
    c.destroy()
    return out.tolist()


@pytest.mark.timeout(60)
def test_reduce_takes_any_output_off_the_root():
    # refused there as too small ("output has 0 elements but needs at least 4"), and the root then failed
    assert run_ranks(_reduce_nonroot_output, 2, _uid(), timeout=30) == [[3.0] * 4, []]


@pytest.mark.timeout(60)
def test_pre_mul_sum():
    assert run_ranks(_premul, 2, _uid(), timeout=30) == [(True, True, True)] * 2


_SCRIPT = """
import numpy as np, pycoll
comm = pycoll.init()  # rank, size and store from pycoll-run's environment
x = np.full(3, comm.rank + 1.0)
comm.all_reduce(x)
print("rank", comm.rank, "of", comm.size, "sum", x.tolist(), "global", comm.global_rank, flush=True)
comm.destroy()
"""


@pytest.mark.timeout(90)
def test_init_from_the_launchers_environment(tmp_path):
    import subprocess
    import sys

    script = tmp_path / "job.py"
    script.write_text(_SCRIPT)
    env = dict(os.environ, PYTHONPATH=REPO, PYCOLL_BACKEND="host", PYCOLL_FR_DUMP_DIR=str(tmp_path / "fr"))
    p = subprocess.run([sys.executable, "-m", "pycoll.run", "-n", "3", "--timeout", "60", str(script)],
                       capture_output=True, text=True, timeout=80, env=env)
    assert p.returncode == 0, p.stdout + p.stderr
    for r in range(3):
        assert f"[rank{r}]: rank {r} of 3 sum [6.0, 6.0, 6.0] global {r}" in p.stdout, p.stdout


def test_ctrl_c_in_a_nonblocking_wait_gives_it_up_as_its_deadline_does():
    # Ctrl-C in shrink() or grow() left the new communicator made on the other ranks, and the parent with a reshape
    # in progress ("Attempt to use communicator before the previous operation returned ncclSuccess"): the wait now
    # gives up as at its deadline (init's and join's did: they abort the new communicator)
    from pycoll.comm import poll_ready

    class Waiting:
        looks = 0

        def has(self, name):
            return False

        def comm_get_async_error(self, handle):
            self.looks += 1
            if self.looks == 3:
                raise KeyboardInterrupt  # as the signal handler raises it between two looks
            return B.IN_PROGRESS

    given_up = []
    with pytest.raises(KeyboardInterrupt):
        poll_ready(Waiting(), 1, "ncclCommShrink", 10.0, on_timeout=lambda: given_up.append(1))
    assert given_up == [1]
    given_up.clear()
    with pytest.raises(pycoll.CommTimeout):  # at the deadline: once, as before
        poll_ready(Waiting(), 1, "ncclCommShrink", 0.0, on_timeout=lambda: given_up.append(1))
    assert given_up == [1]


def _split_alone(rank, n, uid):
    c = _comm(rank, n, uid)
    if rank == 1:
        time.sleep(2.0)
        c.abort()
        return None
    try:
        c.split(0, timeout=0.5)
        return "no exception"
    except pycoll.CommTimeout as e:
        notes = getattr(e, "__notes__", [])
        c.abort()
        return str(e), notes


@pytest.mark.timeout(60)
def test_a_split_that_times_out_says_so():
    # a rank that never called split(): the caller got "all_gather (seq 1) did not complete", naming no split
    text, notes = run_ranks(_split_alone, 2, _uid(), timeout=30)[0]
    note = ("pycoll: in split() of communicator 'world': the exchange of the new communicators' members (every rank "
            "of this one takes part)")
    assert "all_gather" in text and notes == [note], (text, notes)


def _split_refused_by_the_library(rank, n, uid):
    if rank == 0:  # the split's rendezvous (the second on this rank) fails: what a /dev/shm without room does
        os.environ["PYCOLL_FAILPOINTS"] = "host.init.begin=raise@2"
    c = _comm(rank, n, uid, timeout=10)
    try:
        c.split(0)
        out = ("no exception", c.state)
    except pycoll.PycollError as e:
        out = (type(e).__name__, c.state)
    c.abort()
    return out


@pytest.mark.timeout(60)
def test_a_split_the_library_failed_leaves_its_parent_failed_as_its_state_says():
    # the library keeps a failed split's error as the parent's asynchronous error: the parent said "active" while
    # every later operation raised the split's error (and the watchdog then failed it in an operation that did nothing
    # wrong)
    res = run_ranks(_split_refused_by_the_library, 2, _uid(), timeout=40)
    assert res[0][0] == "NCCLSystemError" and res[0][1] == "aborted", res


def _stopped_in_a_reshape(rank, n, uid, mode, action, path):
    """Rank 0 waits in the library's split (or shrink of rank 1), rank 2 never calls it; 0.5 s in, another thread of
    rank 0 aborts the communicator, or fails it with a CommRevoked as the elastic layer's watcher does."""
    import threading

    from pycoll.errors import CommRevoked
    c = _comm(rank, n, uid, timeout=10, on_failure="revoke",
              store=pycoll.FileStore(path) if mode == "split of a revoked one" else None)
    if mode == "split of a revoked one":  # its members are exchanged through the store: rank 2 never comes
        c.revoke()
        mode = "split"
        if rank > 0:
            time.sleep(1.0)
            c.abort()
            return None
    if rank == 2:
        if mode == "split":
            c._split_members(0, rank, 10)  # the members' exchange every rank makes first
        time.sleep(1.5)
        c.abort()
        return None
    if rank == 1 and mode == "shrink":
        return None  # the excluded rank
    if rank == 0:
        stop = (c.abort if action == "abort" else
                lambda: c.fail(CommRevoked("generation 0 is being reshaped by another member")))
        threading.Timer(0.5, stop).start()
    t0 = time.monotonic()
    try:
        c.split(0, timeout=8) if mode == "split" else c.shrink([1], timeout=8)
        out = ("no exception",)
    except pycoll.PycollError as e:
        out = (type(e).__name__, isinstance(e, pycoll.CommFailure), str(e), round(time.monotonic() - t0, 1))
    c.abort()
    return out


@pytest.mark.timeout(60)
@pytest.mark.parametrize("mode,action", [("split", "abort"), ("split", "revoke"), ("shrink", "abort"),
                                         ("split of a revoked one", "abort")])
def test_a_reshape_stopped_by_another_thread_raises_a_comm_failure(mode, action, tmp_path):
    # abort() from another thread: the wait went on reading the freed handle (InvalidArgument "is not a valid
    # communicator"; on NCCL a use after free); the elastic watcher's revoke: InvalidUsage, no CommFailure, so the
    # README's loop died of it
    # a split of a revoked communicator exchanges its members through the store: the abort ended nothing there (a
    # StoreTimeout at the split's timeout)
    res = run_ranks(_stopped_in_a_reshape, 3, _uid(), mode, action, str(tmp_path / "store"), timeout=40)[0]
    assert res[1] is True and res[3] < 1.2, res  # at the other thread's abort (0.5 s), not at rank 2's (1.5 s)
    if action == "abort":
        assert res[0] == "CommAborted" and "the communicator was aborted (abort() in thread" in res[2], res
    else:
        # revoked; or aborted, where the revoke met the split first (the policy then aborts): either names the cause
        assert res[0] in ("CommRevoked", "CommAborted") and "generation 0 is being reshaped" in res[2], res


def _barrier_against_a_counter(rank, n, uid):
    c = _comm(rank, n, uid, timeout=10)
    counter = np.array([10 * (rank + 1)], np.int32)
    try:
        if rank == 0:
            c.barrier()  # rank 1 skipped its barrier (an if-branch)
        c.all_reduce(counter)
        out = ("no exception", counter.tolist())
    except pycoll.CommFailure as e:
        out = (type(e).__name__, "mismatch" in str(e))
    c.abort()
    return out


@pytest.mark.timeout(60)
def test_a_barrier_does_not_silently_match_a_programs_one_int32_all_reduce():
    # the barrier was an all_reduce of one int32 summed: rank 0's barrier met rank 1's counter, which came out 20
    # where 30, with no error
    for res in run_ranks(_barrier_against_a_counter, 2, _uid(), timeout=40):
        assert res[0] != "no exception" and res[1] is True, res


def _mismatch_behind_a_completed_op(rank, n, uid, how):
    from pycoll import hooks

    blamed = []

    class Blamed(hooks.CommObserver):
        def comm_failed(self, comm, exc, work):
            blamed.append(work.seq if work is not None else None)

    obs = Blamed()
    hooks.add_observer(obs)
    c = _comm(rank, n, uid, timeout=10)
    # "two streams": the operations alternate between two host streams (the first stream's end event of #1 completed
    # after the second stream's #2 had failed: it counted as failed too)
    streams = [c.device.new_stream(), c.device.new_stream()] if how == "two streams" else [None, None]
    a, b, d = np.ones(4, np.float32), np.ones(4 + rank, np.float32), np.ones(4, np.float32)
    w1 = c.all_reduce(a, async_op=True, stream=streams[0])
    if how == "pause":
        time.sleep(0.3)  # w1 done, nobody waited for it
    w2 = c.all_reduce(b, async_op=True, stream=streams[1])  # count 4 against 5: the library fails it
    try:
        w3 = c.all_reduce(d, async_op=True, stream=streams[0])
    except pycoll.CommFailure:  # refused: the comm had failed already (the refusal's failure names w2 too)
        w3 = None
    deadline = time.monotonic() + 10
    waited = w3 if how == "wait on #3" and w3 is not None else w2  # a wait on #3 blamed #3 (which never ran)
    while not waited.is_completed() and time.monotonic() < deadline:  # failed: once the policy has acted
        time.sleep(0.01)
    states = [(w.state, type(w.exception()).__name__) for w in (w1, w2, w3) if w is not None]
    hooks.remove_observer(obs)
    c.abort()
    return blamed, states, a.tolist()


@pytest.mark.timeout(60)
@pytest.mark.parametrize("how", ["at once", "pause", "two streams", "wait on #3"])
def test_an_asynchronous_error_is_blamed_on_its_operation_not_on_a_completed_one(how):
    # three async all_reduce, the second mismatched: the watchdog's line, the dump's reason and the failure named
    # all_reduce #1 (state scheduled), whose result was written on every rank, and failed it too -- the oldest
    # outstanding operation, which nobody had waited for
    for blamed, states, a in run_ranks(_mismatch_behind_a_completed_op, 2, _uid(), how, timeout=40):
        assert blamed == [2] and a == [2.0] * 4, (blamed, states, a)
        assert states[0] == ("completed", "NoneType") and states[1][1] == "AsyncCommError", states


def test_a_communicator_or_work_cannot_be_pickled_and_says_so():
    # (a spawned Process given one: "no default __reduce__ due to non-trivial __cinit__", Cython's words)
    import pickle

    c = pycoll.init(0, 1, backend="host", name="tp")
    try:
        w = c.all_reduce(np.ones(2), async_op=True)
        with pytest.raises(TypeError, match="communicator 'tp' cannot be pickled .sent to another process."):
            pickle.dumps(c)
        with pytest.raises(TypeError, match=r"all_reduce \(seq 1\): a Work cannot be pickled"):
            pickle.dumps(w)
        w.wait()
    finally:
        c.abort()


def test_destroy_and_abort_work_where_no_thread_can_be_started(monkeypatch):
    """At a pids limit destroy() raised "can't start new thread" and its abort too, after the state said aborted:
    the handle was never freed, and abort() or destroy() again did nothing."""
    import threading

    start = threading.Thread.start

    def refuse(self):
        if self.name.startswith(("pycoll-abort", "pycoll-finalize")):
            raise RuntimeError("can't start new thread")
        return start(self)

    lib = B.load("host")
    for end in ("destroy", "abort"):
        c = pycoll.init(0, 1, backend="host")
        h = c.handle
        monkeypatch.setattr(threading.Thread, "start", refuse)
        try:
            getattr(c, end)()
        finally:
            monkeypatch.setattr(threading.Thread, "start", start)
        assert c.state == ("destroyed" if end == "destroy" else "aborted")
        with pytest.raises(pycoll.NCCLError, match="not a valid communicator"):
            lib.comm_count(h)  # freed


def _polled_until_failed(rank, n, uid):
    c = _comm(rank, n, uid, timeout=0.5)
    if rank == 1:
        time.sleep(3.0)
        c.abort()
        return None
    w = c.all_reduce(np.ones(2), async_op=True)
    while not w.is_completed():
        time.sleep(0.001)
    out = (type(w.exception()).__name__, c.state)
    try:
        c.all_reduce(np.ones(2))
    except pycoll.CommFailure as e:
        out += (type(e).__name__, c.state)
    c.abort()
    return out


@pytest.mark.timeout(60)
@pytest.mark.parametrize("watchdog", ["1", "0"])
def test_a_polled_failure_is_seen_with_the_communicator_as_its_policy_left_it(watchdog):
    # is_completed()/exception() and the next call saw the CommTimeout while the communicator still said "active",
    # about 0.5 s before the policy aborted it (what Work.wait() and the README promise); without a watchdog
    # (PYCOLL_WATCHDOG=0) a loop polling is_completed() never saw the deadline at all
    res = run_ranks(_polled_until_failed, 2, _uid(), timeout=30, env={"PYCOLL_WATCHDOG": watchdog})[0]
    assert res == ("CommTimeout", "aborted", "CommAborted", "aborted"), res


def test_a_communicator_made_while_its_parent_expects_a_revoke_expects_it_too():
    # a split returning after a requested reshape's flag was seen: its peer's revoke was a failure (reported, dumped)
    c = pycoll.init(0, 1, backend="host")
    try:
        c.expect_revoke()
        d = c.split(0)
        assert d._revoke_expected
        d.abort()
    finally:
        c.abort()



def _expected_revoke_found_late(rank, n, uid, trace):
    from pycoll import failpoints

    # the first check() that reads an error waits there (the watchdog's, between its read and its fail())
    failpoints.configure(f"comm.check.found_error=sleep(700);rank=1;trace={trace}", rank=rank)
    failures = []

    class Failures(pycoll.hooks.CommObserver):
        def comm_failed(self, comm, exc, work):  # what the watchdog reports and dumps
            failures.append(f"{type(exc).__name__}: {exc}")

    pycoll.comm.add_observer(Failures())
    c = _comm(rank, n, uid, on_failure="revoke")
    if rank == 1:
        c.expect_revoke()  # the elastic watcher saw a requested reshape's flag
    c.all_reduce(np.ones(2))
    if rank == 0:  # the requester, once every member voted
        c.revoke()
        time.sleep(3.0)  # revoked, not gone, while rank 1 looks
        c.abort()
        return None
    w = c.all_reduce(np.ones(2), async_op=True)

    def watchdog():  # a check() that found the communicator active, then reads the peer's revoke
        while not os.path.exists(trace) and time.monotonic() < deadline:
            c.check()
            time.sleep(0.005)

    deadline = time.monotonic() + 10
    t = threading.Thread(target=watchdog)
    t.start()
    while not os.path.exists(trace) and time.monotonic() < deadline:
        time.sleep(0.005)
    try:  # meanwhile this thread meets the revoke too, and revokes quietly
        w.wait()
        out = ("completed",)
    except pycoll.CommFailure as e:
        out = (type(e).__name__,)
    t.join()
    out += (c.state, c.failure, failures, os.path.exists(trace))
    c.abort()
    return out


@pytest.mark.timeout(60)
def test_a_revoke_expected_and_done_is_no_failure_when_another_thread_finds_it_late(tmp_path):
    # a requested reshape: the member's main thread revoked its communicator quietly while its watchdog, which had
    # read the peer's revoke (the asynchronous error) while it was still active, went on to fail() it: recorded as
    # a RemoteError (reported, and every generation dumped on every rank), one requested reshape in a few hundred
    res = run_ranks(_expected_revoke_found_late, 2, _uid(), str(tmp_path / "trace"), timeout=30,
                    env={"PYCOLL_WATCHDOG": "0"})[1]
    assert res == ("CommRevoked", "revoked", None, [], True), res
