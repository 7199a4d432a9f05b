"""Registrations, windows, symmetric memory and one-sided signals on the host backend, multi-rank."""

from __future__ import annotations

import gc
import os
import signal
import time

import numpy as np
import pytest
from helpers.mp import Died, run_ranks, shm_entries

import pycoll
from pycoll import _bindings as B
from pycoll.errors import CommStateError, CommTimeout, InvalidArgument, InvalidUsage, RemoteError

pytestmark = pytest.mark.timeout(120)


def _uid() -> bytes:
    return bytes(B.load("host").get_unique_id())


def _comm(rank, n, uid, **kw):
    return pycoll.init(rank, n, unique_id=uid, backend="host", **kw)


# -- put_signal / signal / wait_signal ---------------------------------------------------------------


def _ring_put(rank, n, uid, like):
    c = _comm(rank, n, uid)
    k = 1000
    buf = c.mem_alloc(k * n, "float32", like=like)
    win = c.register_window(buf)
    right, left = (rank + 1) % n, (rank - 1) % n
    src = np.arange(k, dtype=np.float32) + 1000 * rank
    if like == "torch":
        import torch

        src = torch.from_numpy(src)
    # every rank puts its block into slot `rank` of its right neighbour's window, then waits for its left
    w = c.put_signal(win, rank * k * 4, src, right, async_op=True)
    c.wait_signal(left)
    w.wait()
    got = np.asarray(buf[left * k:(left + 1) * k]).copy()
    ok = bool((got == np.arange(k, dtype=np.float32) + 1000 * left).all())
    # a signal without data, twice, consumed by one wait of count 2 on another index
    c.signal(right, sig_idx=3)
    c.signal(right, sig_idx=3)
    c.wait_signal([(left, 2, 3, 0)])
    win.close()
    c.destroy()
    return ok, win.closed


@pytest.mark.parametrize("n", [2, 4])
def test_put_signal_ring_exact_data(n):
    assert run_ranks(_ring_put, n, _uid(), "numpy") == [(True, True)] * n


def test_put_signal_torch():
    pytest.importorskip("torch")
    assert run_ranks(_ring_put, 2, _uid(), "torch") == [(True, True)] * 2


def _pool(rank, n, uid, like):
    c = _comm(rank, n, uid)
    pool = pycoll.SymmetricPool(c, 1 << 16)
    a = pool.empty(16, "float32", like=like)
    b = pool.empty((4, 4), "int64", like=like)
    offs = (pool.offset_of(a), pool.offset_of(b))
    before = pool.free_bytes
    tmp = pool.empty(100, "uint8", like=like)
    del tmp
    gc.collect()
    freed = pool.free_bytes == before
    peer = (rank + 1) % n
    src = np.full(16, rank + 1, np.float32)
    c.put_signal(pool.window, offs[0], src, peer)
    c.wait_signal((rank - 1) % n)
    got = float(np.asarray(a)[0])
    b[:] = 7  # the arrays are ordinary writable arrays
    # "float" read as the array library reads it: float32 for torch, float64 for numpy (the block's size too)
    sizes = [int(np.asarray(x).nbytes) for x in (pool.empty(4, "float", like=like), c.mem_alloc(4, "float", like=like))]
    pool.close()
    c.destroy()
    return offs, freed, got, int(np.asarray(b).sum()), sizes


@pytest.mark.parametrize("like", ["numpy", "torch"])
def test_symmetric_pool(like):
    if like == "torch":
        pytest.importorskip("torch")
    res = run_ranks(_pool, 2, _uid(), like)
    assert res[0][0] == res[1][0] == (0, 256)  # symmetric offsets
    assert [r[1] for r in res] == [True, True]
    assert [r[2] for r in res] == [2.0, 1.0]
    assert [r[3] for r in res] == [112, 112]
    assert [r[4] for r in res] == [[16, 16] if like == "torch" else [32, 32]] * 2


def _wait_times_out(rank, n, uid):
    c = _comm(rank, n, uid)
    if rank == 1:
        t0 = time.monotonic()
        try:
            c.wait_signal(0, timeout=1.0)
        except CommTimeout as e:
            return "timeout", time.monotonic() - t0, "wait_signal" in str(e), c.state
        return "no error", 0.0, False, c.state
    time.sleep(3.0)  # never signals
    c.abort()
    return "root", 0.0, True, c.state


def test_wait_signal_timeout_is_a_comm_timeout_within_its_deadline():
    res = run_ranks(_wait_times_out, 2, _uid())
    kind, elapsed, named, state = res[1]
    assert kind == "timeout" and named and state == "aborted", res
    assert 0.9 <= elapsed < 6.0


def _wait_on_dead(rank, n, uid):
    c = _comm(rank, n, uid, timeout=60)
    c.barrier()
    if rank == 2:
        os.kill(os.getpid(), signal.SIGKILL)
    t0 = time.monotonic()
    try:
        c.wait_signal(2)
    except (RemoteError, pycoll.CommFailure) as e:
        return type(e).__name__, time.monotonic() - t0
    return "no error", 0.0


def test_rank_killed_while_others_wait_signal():
    res = run_ranks(_wait_on_dead, 3, _uid(), may_die=[2])
    assert isinstance(res[2], Died)
    for name, elapsed in res[:2]:
        assert name != "no error" and elapsed < 10


# -- lifetimes ---------------------------------------------------------------------------------------


def _lifetimes(rank, n, uid, end):
    c = _comm(rank, n, uid)
    x = np.zeros(64, np.float32)
    reg = c.register(x)
    with c.register(np.zeros(8, np.float32)) as r2:
        assert not r2.closed
    out = {"ctx_closed": r2.closed}
    buf = c.mem_alloc(256, "uint8")
    win = c.register_window(buf)
    out["user_ptr"] = win.user_ptr == buf.ctypes.data
    out["peer_ptr"] = _peer_pointer(win, (rank + 1) % n)
    if end == "destroy":
        c.destroy()
    else:
        c.abort()
    out["released"] = reg.closed and win.closed
    for obj in (reg, win):
        try:
            _ = obj.handle
        except CommStateError as e:
            out.setdefault("errors", []).append(end in str(e))
    reg.close()  # a second release is a no-op
    win.close()
    buf[:] = 5  # the allocation outlives the communicator
    out["buf"] = int(buf.sum())
    return out


def _peer_pointer(win, peer):
    """Write through the successor's window as this process maps it; read what the predecessor wrote."""
    import ctypes

    c, rank, n = win.comm, win.comm.rank, win.comm.size
    ptr = win.peer_pointer(peer, 8)
    ctypes.c_uint8.from_address(ptr).value = rank + 1
    assert win.lsa_pointer(peer, 8) == ptr  # the host's LSA team is the whole communicator
    c.barrier()
    mine = ctypes.c_uint8.from_address(win.user_ptr + 8).value
    c.barrier()
    try:
        win.multimem_pointer()
        bad = False
    except InvalidUsage as e:
        bad = "ncclGetLsaMultimemDevicePointer" in str(e)
    return mine == (rank - 1) % n + 1 and bad


@pytest.mark.parametrize("end", ["destroy", "abort"])
def test_release_on_destroy_and_abort(end):
    before = shm_entries()
    for out in run_ranks(_lifetimes, 2, _uid(), end):
        assert out == {"ctx_closed": True, "user_ptr": True, "peer_ptr": True, "released": True,
                       "errors": [True, True], "buf": 256 * 5}
    assert shm_entries() <= before


# -- bad input ---------------------------------------------------------------------------------------


def _bad_input(rank, n, uid):
    c = _comm(rank, n, uid)
    errs = {}

    def catch(name, fn, exc):
        try:
            fn()
        except exc as e:
            errs[name] = str(e)
        else:
            errs[name] = None

    catch("noncontig", lambda: c.register(np.zeros((4, 4), np.float32)[:, 1]), ValueError)
    catch("window_noncontig", lambda: c.register_window(np.zeros((4, 4), np.float32)[:, 1]), ValueError)
    # a window of the wrong size on one rank: every rank gets the same clear error
    buf = c.mem_alloc(8192 if rank == 1 else 4096, "uint8")
    catch("size", lambda: c.register_window(buf), InvalidArgument)
    # private memory is refused on every rank, pointing at mem_alloc
    catch("private", lambda: c.register_window(np.zeros(1024, np.uint8)), InvalidArgument)
    # a bad timeout is refused before anything is registered, and the communicator stays usable
    for bad in (-1, 0, float("nan"), float("inf"), "x"):
        catch(f"window_timeout_{bad}", lambda: c.register_window(c.mem_alloc(4096, "uint8"), timeout=bad),
              (TypeError, ValueError))
        catch(f"pool_timeout_{bad}", lambda: pycoll.SymmetricPool(c, 4096, timeout=bad), (TypeError, ValueError))
    good = c.mem_alloc(4096, "uint8")
    win = c.register_window(good)
    src = np.zeros(16, np.uint8)
    catch("peer", lambda: c.put_signal(win, 0, src, n), ValueError)
    catch("signal_peer", lambda: c.signal(-1), ValueError)
    catch("wait_peer", lambda: c.wait_signal([(0, 1, 0, 0), (n + 3, 1, 0, 0)]), ValueError)
    catch("span", lambda: c.put_signal(win, 4090, src, 0), ValueError)
    catch("sig_idx", lambda: c.signal(0, sig_idx=99), InvalidArgument)
    catch("count_big", lambda: c.wait_signal(0, count=2**40), ValueError)
    catch("not_window", lambda: c.put_signal(object(), 0, src, 0), TypeError)
    c.barrier()
    win.close()
    catch("released", lambda: c.put_signal(win, 0, src, 0), CommStateError)
    win.close()  # no-op
    c.barrier()
    c.destroy()
    return errs


def test_bad_input():
    for errs in run_ranks(_bad_input, 2, _uid()):
        assert "contiguous" in errs["noncontig"] and "contiguous" in errs["window_noncontig"]
        assert "window sizes differ: rank 0 registers 4096 bytes, rank 1 registers 8192" in errs["size"]
        assert "ncclMemAlloc" in errs["private"] and "mem_alloc" in errs["private"]
        assert "out of range" in errs["peer"] and "out of range" in errs["signal_peer"]
        assert "out of range" in errs["wait_peer"]
        assert "do not fit in the 4096-byte window" in errs["span"]
        assert "sigIdx 99" in errs["sig_idx"]
        assert errs["count_big"] == f"count must be at most {2**31 - 1} (a C int), got {2**40}", errs["count_big"]
        assert "Window" in errs["not_window"]
        assert "released" in errs["released"]
        for bad in (-1, 0, float("nan"), float("inf"), "x"):
            assert "register_window: timeout must be" in errs[f"window_timeout_{bad}"], errs
            assert "SymmetricPool: timeout must be" in errs[f"pool_timeout_{bad}"], errs


# -- suspend / resume / statistics -------------------------------------------------------------------


def _suspend(rank, n, uid):
    c = _comm(rank, n, uid)
    before = c.memory_stats()
    c.suspend()
    during = c.memory_stats()
    try:
        c.all_reduce(np.ones(4, np.float32))
        refused = ""
    except InvalidUsage as e:
        refused = str(e)
    c.resume()
    x = np.ones(4, np.float32)
    c.all_reduce(x)
    c.destroy()
    return before.suspended, during.suspended, "suspended" in refused, float(x[0]), before.total


def test_suspend_resume_and_memory_stats():
    assert run_ranks(_suspend, 2, _uid()) == [(False, True, True, 2.0, 0)] * 2


# -- failpoints --------------------------------------------------------------------------------------


def _window_failpoint(rank, n, uid, spec):
    if rank == 1:
        os.environ["PYCOLL_FAILPOINTS"] = spec
    c = _comm(rank, n, uid, timeout=20, on_failure="report")
    buf = c.mem_alloc(4096, "uint8")
    t0 = time.monotonic()
    try:
        c.register_window(buf)
    except pycoll.errors.PycollError as e:
        out = (type(e).__name__, "failpoint" in str(e) or "exited" in str(e), time.monotonic() - t0 < 10)
    else:
        out = ("no error", False, True)
    c.abort()
    return out


def test_rank_killed_in_the_window_exchange():
    res = run_ranks(_window_failpoint, 3, _uid(), "host.window.exchange=kill", may_die=[1])
    assert isinstance(res[1], Died)
    for name, named, quick in (res[0], res[2]):
        assert name == "RemoteError" and named and quick


def test_window_exchange_refused_on_one_rank_fails_every_rank():
    res = run_ranks(_window_failpoint, 2, _uid(), "host.window.exchange=raise")
    assert res == [("SystemError", True, True)] * 2 or all(r[0] != "no error" and r[1] for r in res)


def _signal_failpoint(rank, n, uid):
    if rank == 1:
        os.environ["PYCOLL_FAILPOINTS"] = "host.signal.wait=raise"
    c = _comm(rank, n, uid, timeout=20, on_failure="report")
    if rank == 0:
        c.signal(1)
        c.abort()
        return "signalled"
    try:
        c.wait_signal(0)
    except pycoll.CommFailure as e:
        out = "failpoint host.signal.wait" in str(e) or "WaitSignal" in str(e)
    else:
        out = False
    c.abort()
    return out


def test_wait_signal_failpoint_fails_the_waiter():
    assert run_ranks(_signal_failpoint, 2, _uid()) == ["signalled", True]


# -- integers of any kind ----------------------------------------------------------------------------


def _numpy_integers(rank, n, uid):
    """Offsets, peers, counts, signal indices, shapes and sizes accept numpy's integers (and 0-d integer
    tensors), like ranks do everywhere; floats and bools are refused with the argument named, never rounded."""
    c = _comm(rank, n, uid)
    pool = pycoll.SymmetricPool(c, np.int64(1 << 16))
    dst = pool.empty(np.int64(4))
    dst[:] = 0
    c.barrier()  # zeroed before the left neighbour puts
    right, left = np.int64((rank + 1) % n), np.int32((rank - 1) % n)
    c.put_signal(pool.window, np.uint16(0), np.full(4, rank + 1, np.float32), right, sig_idx=np.int8(2))
    c.wait_signal(left, np.int64(1), sig_idx=np.int8(2))
    got = float(dst[0])
    refused = {}
    for name, call in (("offset", lambda: c.put_signal(pool.window, 4.0, np.ones(1, np.float32), right)),
                       ("sig_idx", lambda: c.signal(right, sig_idx=1.0)),
                       ("peer", lambda: c.wait_signal(True)),
                       ("count", lambda: c.wait_signal(left, 1.5)),
                       ("shape", lambda: pool.empty(2.0)),
                       ("shape item", lambda: pool.empty((2, 1.5))),
                       ("nbytes", lambda: pycoll.SymmetricPool(c, 4096.0))):
        try:
            call()
        except TypeError as e:
            refused[name] = str(e)
    c.barrier()
    shapes = (pool.empty((np.int64(2), 3)).shape, c.mem_alloc(np.int32(5)).shape)
    pool.close()
    c.destroy()
    return got, refused, shapes


def test_numpy_integers_are_taken_and_floats_refused():
    for rank, (got, refused, shapes) in enumerate(run_ranks(_numpy_integers, 2, _uid())):
        assert got == 2 - rank  # the left neighbour's value
        assert set(refused) == {"offset", "sig_idx", "peer", "count", "shape", "shape item", "nbytes"}, refused
        for name, text in refused.items():
            assert name.split()[0] in text, (name, text)
        assert shapes == ((2, 3), (5,))


@pytest.mark.timeout(60)
def test_symmetric_pool_lifetimes_and_misuse():

    c = _comm(0, 1, _uid(), name="pool-life")
    try:
        pool = pycoll.SymmetricPool(c, 1 << 20)
        # a dead array's block, freed by the cyclic collector inside empty() (an allocation there starts it): its
        # give-back took the pool's lock again and the thread deadlocked (within 20,000 of these, every time)
        for _ in range(40000):
            layer = {"weight": pool.empty(16, "float32")}
            layer["parent"] = layer
        del layer
        gc.collect()
        assert pool.free_bytes == pool.nbytes
        # an array of no element: torch's says its address is 0 (offset_of said "does not lie in the pool")
        torch = pytest.importorskip("torch")
        assert pool.offset_of(pool.empty((0, 4), torch.float32, like="torch")) == 0
        with pytest.raises(ValueError, match="does not lie in the pool"):
            pool.offset_of(torch.ones(4))
        # a collective registration inside a group is refused before anything starts, as register_window is
        with pytest.raises(CommStateError, match="SymmetricPool cannot be called inside a group"), c.group():
            pycoll.SymmetricPool(c, 4096)
        # the pool object does not keep its block once the window is released and the last array is gone
        a = pool.empty(4, "float32")
        alloc = pool._alloc  # a weak reference
        pool.close()
        assert alloc() is not None  # the array holds it
        del a
        gc.collect()
        assert alloc() is None, "the block outlived close() and its last array"
        # a pool sized for an array holds it (its block was rounded up to the alignment: "no free block of 1024 bytes
        # in 1000"); the pool's last bytes take an array of exactly their size, and come back whole
        with pycoll.SymmetricPool(c, 1000) as exact:
            first = exact.empty(100, "uint8")  # a block of 256
            last = exact.empty(744, "uint8")
            assert exact.offset_of(last) == 256 and exact.free_bytes == 0
            with pytest.raises(MemoryError, match="no free block of 1 bytes in 1000"):
                exact.empty(1, "uint8")
            del first, last
            gc.collect()
            assert exact.free_bytes == 1000 and exact.offset_of(exact.empty(250, "float32")) == 0
        # a registration writes nothing: a read-only send buffer is registered
        ro = np.ones(16, np.float32)
        ro.flags.writeable = False
        c.register(ro).close()
        # suspend's flags: NCCL's one flag; anything else (0: nothing suspended) refused
        for bad in (0, 12345, True, "1"):
            with pytest.raises((ValueError, TypeError), match="suspend: flags"):
                c.suspend(flags=bad)
        x = np.ones(2, np.float32)
        c.all_reduce(x)
        assert x.tolist() == [1.0, 1.0]
    finally:
        c.destroy()


def test_allocations_take_torch_dtypes_on_the_host_and_refuse_object_dtypes():
    # pool.empty(4, torch.float32) on the host (numpy arrays) failed in numpy ("Cannot interpret 'torch.float32'"),
    # where mem_alloc's docstring takes a torch dtype; mem_alloc(4, object) failed in numpy's view
    torch = pytest.importorskip("torch")
    c = _comm(0, 1, _uid(), name="alloc-dtypes")
    try:
        with pycoll.SymmetricPool(c, 4096) as pool:
            a = pool.empty(4, torch.float32)
            assert a.dtype == np.float32 and a.shape == (4,)
        assert c.mem_alloc(3, torch.int64).dtype == np.int64
        with pytest.raises(TypeError, match="holds Python objects"):
            c.mem_alloc(4, object)
    finally:
        c.destroy()


def _closed_under_a_put(rank, n, uid):
    """Rank 0's stream is held by a wait for rank 1's signal (sent 1 s later); a put into its own window waits behind
    it. Closing the window then unmapped the memory the put copies into: SIGSEGV. Now the close is refused until the
    put is done."""
    comm = _comm(rank, n, uid, timeout=20.0)
    buf = comm.mem_alloc(1 << 16, "uint8")
    w = comm.register_window(buf)
    out = {}
    if rank == 0:
        wt = comm.wait_signal(1, async_op=True)
        pw = comm.put_signal(w, 0, np.full(1 << 16, 7, np.uint8), 0, async_op=True)
        try:
            w.close()
            out["close"] = "closed"
        except CommStateError as e:
            out["close"] = str(e)
        out["before"] = pw.is_completed()
        wt.wait()
        pw.wait()
        w.close()
        out.update(data=int(buf[0]), closed=w.closed)
    else:
        time.sleep(1.0)
        comm.signal(0)
    try:  # and rows with keywords beside them: refused, not the keywords dropped
        comm.wait_signal([(rank, 1, 0, 0)], count=3)
    except ValueError as e:
        out["rows"] = str(e)
    comm.destroy()
    return out


@pytest.mark.timeout(60)
def test_a_window_is_not_closed_under_a_put_into_it():
    res = run_ranks(_closed_under_a_put, 2, _uid(), timeout=50)
    assert "is still used by put_signal (p2p seq" in res[0]["close"] and "wait for it before closing" in \
        res[0]["close"], res
    assert res[0]["before"] is False and res[0]["data"] == 7 and res[0]["closed"] is True, res
    assert all("given in each (peer, count, sig_idx, ctx) row" in r["rows"] for r in res), res


def test_a_one_sided_operation_is_named_by_its_point_to_point_number():
    # repr and WaitTimeout said "seq 2" (the collectives' count) where the watchdog and the dumps say p2p seq 1
    comm = pycoll.init(0, 1, unique_id=_uid(), backend="host", timeout=10.0)
    try:
        comm.all_reduce(np.ones(2))
        comm.all_reduce(np.ones(2))
        w = comm.wait_signal(0, async_op=True)  # never signalled
        assert "wait_signal p2p_seq=1 " in repr(w), repr(w)
        with pytest.raises(pycoll.WaitTimeout, match=r"wait_signal \(p2p seq 1\) on"):
            w.wait(timeout=0.1)
    finally:
        comm.abort()


def _registration_against_an_all_gather(rank, n, uid):
    comm = _comm(rank, n, uid, timeout=10.0)
    out = np.full(2 * 128, 255, np.uint8)
    try:
        if rank == 0:
            comm.register_window(comm.mem_alloc(64), timeout=5)
        else:  # the size of the registration's exchange: it was taken for this one, and its data delivered here
            comm.all_gather(np.zeros(128, np.uint8), out, timeout=5)
        return "completed", out[:8].tolist()
    except Exception as e:
        return str(e), out[:8].tolist()
    finally:
        comm.abort()


def test_a_window_registration_meeting_an_all_gather_is_a_mismatch_on_both_ranks():
    res = run_ranks(_registration_against_an_all_gather, 2, _uid(), timeout=40)
    for text, _ in res:
        assert "collective mismatch" in text and "ncclCommWindowRegister (its exchange of the windows)" in text, res
    assert res[1][1] == [255] * 8, res  # nothing of rank 0's window descriptor


def test_a_released_windows_user_ptr_and_a_wait_on_an_array_of_rows():
    # user_ptr of a window whose communicator was aborted raised CommAborted (a CommFailure: an elastic loop reshapes
    # on it), where every other use of a released window raises CommStateError; an array of (peer, count, sig_idx,
    # ctx) rows, which has __index__, was read as one peer ("peer must be an int rank, got ndarray")
    c = _comm(0, 1, _uid(), name="released-window")
    try:
        pool = pycoll.SymmetricPool(c, 4096)
        c.signal(0)
        c.signal(0, sig_idx=1)
        c.wait_signal(np.array([[0, 1, 0, 0], [0, 1, 1, 0]]))
        with pytest.raises(ValueError, match="non-empty sequence of"):
            c.wait_signal(np.array([0]))
        c.abort()
        with pytest.raises(CommStateError, match="was released"):
            _ = pool.window.user_ptr
    finally:
        c.destroy()
