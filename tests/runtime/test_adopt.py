"""Communicator.from_handle (raw communicators made with the bindings, wrapped without owning
them), Communicator.properties, init_all (one process driving several ranks) and group_simulate,
on the host backend."""

from __future__ import annotations

import contextlib
import dataclasses
import threading
import time

import numpy as np
import pytest
from helpers.mp import run_ranks

import pycoll
from pycoll import _bindings as B

pytestmark = pytest.mark.timeout(120)


@contextlib.contextmanager
def _ranks(*args, **kwargs):
    """``pycoll.init_all(*args, **kwargs)``'s communicators, every one aborted at the end (one that failed too)."""
    comms = pycoll.init_all(*args, **kwargs)
    try:
        yield comms
    finally:
        for c in comms:
            c.abort()


def _uid() -> bytes:
    return bytes(B.load("host").get_unique_id())


def _adopted(rank, n, uid):
    lib = B.load("host")
    raw = lib.comm_init_rank(n, B.UniqueId(uid), rank)
    out = {}
    comm = pycoll.from_handle(raw, library=lib, timeout=20)
    out["rank_size"] = (comm.rank, comm.size, comm.owns_handle)
    x = np.full(4, rank + 1.0, np.float32)
    comm.all_reduce(x)
    out["sum"] = x.tolist()
    out["hash"] = comm.properties.comm_hash
    out["uid"] = comm.uid
    with pytest.raises(ValueError, match="already wrapped"):
        pycoll.Communicator.from_handle(raw, library=lib)
    # the watchdog enforces deadlines on a wrapped communicator: rank 1 is late
    if rank == 1:
        time.sleep(2.5)
    try:
        comm.all_reduce(np.ones(2, np.float32), timeout=0.5)
        out["timeout"] = None
    except pycoll.CommFailure as e:  # rank 1, late, meets rank 0's abort (it took no part of rank 0's)
        out["timeout"] = type(e).__name__
    return out


def test_from_handle_runs_collectives_and_the_watchdog_times_out():
    res = run_ranks(_adopted, 2, _uid(), timeout=90)
    assert [r["rank_size"] for r in res] == [(0, 2, False), (1, 2, False)]
    assert all(r["sum"] == [3.0] * 4 for r in res)
    assert res[0]["hash"] == res[1]["hash"] and res[0]["uid"] == res[1]["uid"]
    assert res[0]["timeout"] == "CommTimeout" and res[1]["timeout"] == "RemoteError", res


def _detach(rank, n, uid):
    lib = B.load("host")
    raw = lib.comm_init_rank(n, B.UniqueId(uid), rank)
    comm = pycoll.Communicator.from_handle(raw, library=lib, timeout=20)
    x = np.full(3, float(rank), np.float32)
    comm.all_reduce(x)
    comm.destroy()
    assert comm.state == "destroyed" and comm.closed
    # the raw communicator still works, and can be wrapped again
    assert lib.comm_count(raw) == n and lib.comm_user_rank(raw) == rank
    again = pycoll.Communicator.from_handle(raw, library=lib, owned=True, timeout=20)
    y = np.full(3, 10.0 * (rank + 1), np.float32)
    again.all_reduce(y)
    again.destroy()  # owned: frees the handle
    try:
        lib.comm_count(raw)
        freed = False
    except pycoll.InvalidArgument:
        freed = True
    return x.tolist(), y.tolist(), freed


def test_destroy_detaches_a_non_owned_handle_and_frees_an_owned_one():
    for x, y, freed in run_ranks(_detach, 2, _uid(), timeout=90):
        assert x == [1.0] * 3 and y == [30.0] * 3 and freed


def test_bad_handles_are_refused():
    lib = B.load("host")
    with pytest.raises(ValueError, match="NULL"):
        pycoll.Communicator.from_handle(0, library=lib)
    with pytest.raises(TypeError, match="int"):
        pycoll.Communicator.from_handle("0x1234", library=lib)
    with pytest.raises(TypeError, match="int"):
        pycoll.Communicator.from_handle(True, library=lib)
    with pytest.raises(ValueError, match="not a live communicator"):
        pycoll.Communicator.from_handle(0xDEAD0000, library=lib)  # made up: the registry refuses it
    (c,) = lib.comm_init_all(1)
    lib.comm_destroy(c)
    with pytest.raises(ValueError, match="not a live communicator"):
        pycoll.Communicator.from_handle(c, library=lib)  # destroyed
    with pytest.raises(TypeError, match="library"):
        pycoll.Communicator.from_handle(c, library=3.5)
    # refused as init refuses them, before the handle is touched (-1 timed the first operation out at once, and its
    # abort killed the maker's handle; "5" broke the watchdog and destroy)
    (live,) = lib.comm_init_all(1)
    for kw, exc, text in (({"timeout": -1}, ValueError, "timeout must be > 0"),
                          ({"timeout": float("nan")}, ValueError, "timeout"),
                          ({"timeout": "5"}, TypeError, "timeout"), ({"name": 5}, TypeError, "name must be"),
                          ({"uid": ""}, ValueError, "uid must be")):
        with pytest.raises(exc, match=text):
            pycoll.Communicator.from_handle(live, library=lib, **kw)
    assert lib.comm_count(live) == 1  # untouched
    lib.comm_destroy(live)


class _Nccl4pyLike:
    """The duck type of nccl4py 0.6's Communicator: the ncclComm_t address is ``ptr``."""

    def __init__(self, ptr):
        self.ptr = ptr


def test_interoperates_with_nccl4py_style_objects_both_ways():
    with _ranks(2, backend="host", timeout=20) as comms:
        other = _Nccl4pyLike(comms[0].handle)  # pycoll -> nccl4py: the handle is the int ncclComm_t
        with pytest.raises(ValueError, match="already wrapped"):
            pycoll.Communicator.from_handle(other, library=comms[0].library)
        lib = comms[0].library
        raw = lib.comm_init_all(1)[0]
        wrapped = pycoll.Communicator.from_handle(_Nccl4pyLike(raw), library=lib)  # nccl4py -> pycoll
        assert wrapped.handle == raw and wrapped.size == 1
        wrapped.destroy()
        assert lib.comm_count(raw) == 1
        lib.comm_destroy(raw)


def test_abort_of_a_non_owned_handle_frees_it():
    lib = B.load("host")
    (raw,) = lib.comm_init_all(1)
    comm = pycoll.Communicator.from_handle(raw, library=lib)
    comm.abort()
    assert comm.state == "aborted"
    with pytest.raises(pycoll.InvalidArgument):
        lib.comm_count(raw)


def test_group_simulate_on_a_library_without_it_leaves_no_group_open():
    """NCCL < 2.22 has no ncclGroupSimulateEnd: NotSupported before the group opens -- the group was left open, and
    every later blocking operation "completed" without running (a split returned None, destroy timed out)."""
    from pycoll import group as _group

    c = pycoll.init(0, 1, backend="host")
    real = c.library

    class Old:  # the loaded library as NCCL 2.21 has it
        path = "libnccl-2.21.so"

        def has(self, name):
            return name != "ncclGroupSimulateEnd" and real.has(name)

        def group_simulate_end(self):
            raise pycoll.NotSupported("ncclGroupSimulateEnd", "2.22", self.path)

        def __getattr__(self, name):
            return getattr(real, name)

    class Comm:
        library = Old()

    try:
        with pytest.raises(pycoll.NotSupported, match="ncclGroupSimulateEnd is not available in libnccl-2.21.so; "
                                                      "it was introduced in NCCL 2.22"), _group.simulate(Comm()):
            pass
        x, out = np.full(3, 2.0, np.float32), np.zeros(3, np.float32)
        c.all_reduce(x, output=out)
        assert out.tolist() == [2.0] * 3
    finally:
        c.abort()


def _all_reduce_each(comms, count):
    """An all_reduce of ``count`` elements on every one of ``comms`` (one process's ranks: init_all's), in one group
    this thread drives; rank i contributes i + 1. Returns each rank's array."""
    xs = [np.full(count, float(i + 1), np.float32) for i in range(len(comms))]
    with comms[0].group():
        works = [c.all_reduce(x, async_op=True) for c, x in zip(comms, xs, strict=True)]
    for w in works:
        w.wait()
    return xs


def test_init_all_one_thread_drives_every_rank():
    with _ranks([0, 1, 2], backend="host", timeout=20) as comms:
        assert [c.rank for c in comms] == [0, 1, 2] and all(c.owns_handle for c in comms)
        assert [c.properties.cuda_dev for c in comms] == [0, 1, 2]
        xs = _all_reduce_each(comms, 5)
        assert all(x.tolist() == [6.0] * 5 for x in xs)
        with comms[0].group_simulate() as sim:
            assert sim.estimated_time is None
            sims = [c.all_reduce(x, async_op=True) for c, x in zip(comms, xs, strict=True)]
        assert sim.estimated_time is not None and sim.estimated_time > 0
        assert all(x.tolist() == [6.0] * 5 for x in xs)  # nothing ran
        for w in sims:
            with pytest.raises(pycoll.CommStateError, match="only simulated"):
                w.wait()
        assert all(not c.outstanding() for c in comms)
        with pytest.raises(RuntimeError, match="boom"), comms[0].group_simulate() as sim:  # no estimate: it said one
            comms[0].all_reduce(xs[0], async_op=True)
            raise RuntimeError("boom")
        assert sim.estimated_time is None and all(not c.outstanding() for c in comms)
        assert pycoll.group.open_group() is None
    with pytest.raises(ValueError, match=">= 1"):
        pycoll.init_all(0, backend="host")
    with pytest.raises(ValueError, match="ordinals"):
        pycoll.init_all([0, -1], backend="host")


@pytest.mark.timeout(60, method="thread")
def test_init_all_windows_registered_from_a_thread_each_then_one_thread_issues_the_group():
    # a registration is collective and blocking here: one thread per communicator; it refuses where another thread
    # has the communicator, but takes none (it did, and the main thread's group was refused)
    with _ranks(2, backend="host", timeout=10) as comms:
        pools = [None, None]

        def register(i):
            pools[i] = pycoll.SymmetricPool(comms[i], 1 << 16)

        threads = [threading.Thread(target=register, args=(i,)) for i in range(2)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(30)
        xs = [p.empty(4) for p in pools]
        for x in xs:
            x[:] = 1
        with comms[0].group():
            for c, x in zip(comms, xs, strict=True):
                c.all_reduce(x)
        assert [x.tolist() for x in xs] == [[2.0] * 4] * 2
        for p in pools:
            p.close()


def test_properties_of_a_pycoll_communicator():
    with _ranks(2, backend="host") as comms:
        p = comms[1].properties
        assert isinstance(p, pycoll.CommProperties)
        assert (p.rank, p.n_ranks, p.device_api_support, p.gin_type_name) == (1, 2, False, "none")
        with pytest.raises(dataclasses.FrozenInstanceError):
            p.rank = 3  # type: ignore[misc]
    with pytest.raises(pycoll.CommAborted):
        _ = comms[0].properties


def test_real_libnccl_refuses_what_is_not_a_communicator():
    try:
        lib = B.load("nccl")
    except pycoll.LibraryError:
        pytest.skip("no libnccl (the nvidia-nccl wheel) to ask")
    import ctypes

    with pytest.raises(ValueError, match="readable memory"):
        pycoll.Communicator.from_handle(0xDEAD0000, library=lib)  # unmapped: never handed to NCCL
    zeros = ctypes.create_string_buffer(4096)
    with pytest.raises(ValueError, match="not a live communicator"):
        pycoll.Communicator.from_handle(ctypes.addressof(zeros), library=lib)  # mapped, NCCL's magic check fails
    host = B.load("host")
    (raw,) = host.comm_init_all(1)
    try:
        with pytest.raises(ValueError, match="not a live communicator"):
            pycoll.Communicator.from_handle(raw, library=lib)  # another library's communicator
    finally:
        host.comm_destroy(raw)


def test_a_handle_its_maker_aborted_fails_the_communicator_once(monkeypatch, tmp_path):
    # the watchdog logged a traceback every round and every operation raised the library's InvalidArgument, the
    # communicator staying "active": now its first check fails it, with the reason
    monkeypatch.setenv("PYCOLL_FR_DUMP_DIR", str(tmp_path))
    lib = B.load("host")
    (raw,) = lib.comm_init_all(1)
    c = pycoll.from_handle(raw, library=lib, timeout=5)
    c.all_reduce(np.ones(2, np.float32))
    lib.comm_abort(raw)  # the maker's own abort, behind the wrapper's back
    c.check()
    assert isinstance(c.failure, pycoll.AsyncCommError) and c.state == "aborted"
    assert "its handle is no live communicator of the library any more" in str(c.failure)
    with pytest.raises(pycoll.CommAborted, match="no live communicator"):
        c.all_reduce(np.ones(2, np.float32))
    c.destroy()


def test_init_all_waits_for_the_communicators_nccl_comm_blocking_0_makes_nonblocking(monkeypatch):
    # NCCL's InitAll then answers ncclInProgress with the handles still initialising: init_all raised that
    # InProgressError and left them to nobody
    monkeypatch.setenv("NCCL_COMM_BLOCKING", "0")
    with _ranks(2, backend="host", timeout=20) as comms:
        assert [c.rank for c in comms] == [0, 1] and all(c.owns_handle for c in comms)
        xs = _all_reduce_each(comms, 3)
        assert all(x.tolist() == [3.0] * 3 for x in xs)


def test_a_blocking_communicators_destroy_is_bounded_by_its_timeout():
    # init_all's communicators are blocking, as NCCL makes them: ncclCommFinalize returns only once every rank
    # finalized. destroy(timeout) from the one thread waited inside it for ever (Ctrl-C did not end it either)
    with _ranks(2, backend="host", timeout=20) as comms:
        t0 = time.monotonic()
        with pytest.raises(pycoll.CommTimeout, match=r"ncclCommFinalize on communicator .* rank 0 did not complete "
                                                     r"within 0.5 s \(a blocking communicator"):
            comms[0].destroy(timeout=0.5)
        assert time.monotonic() - t0 < 3.0
        assert comms[0].state == "aborted"
    # one thread per communicator: both finalize, and the blocking call returns
    comms = pycoll.init_all(2, backend="host", timeout=20)
    comms[1].hand_off()
    errors = []
    t = threading.Thread(target=lambda: errors.extend(_destroyed(comms[1])))
    t.start()
    errors.extend(_destroyed(comms[0]))
    t.join(20)
    assert not errors and [c.state for c in comms] == ["destroyed", "destroyed"]


@pytest.mark.timeout(60, method="thread")  # a regression blocks in the library call, which no signal ends
@pytest.mark.parametrize("call", ["shrink", "split", "grow", "register_window"])
def test_a_blocking_communicators_reshape_is_bounded_by_its_timeout(call):
    # "timeout bounds the shrink itself", a window registration "polled within timeout": on a blocking communicator
    # the library call returned only once every rank made it, and a rank that never came kept the caller there for ever
    what, why = (("WindowRegister", "register their windows") if call == "register_window" else
                 (call.title(), f"call {call}"))
    with _ranks(3, backend="host", timeout=20) as comms:
        t0 = time.monotonic()
        with pytest.raises(pycoll.CommTimeout, match=rf"ncclComm{what} on communicator .* rank 0 did not complete "
                                                     rf"within 0.5 s \(a blocking communicator: the other ranks did "
                                                     rf"not {why}\)"):
            if call == "shrink":
                comms[0].shrink([2], timeout=0.5)
            elif call == "grow":
                comms[0].grow(4, comms[0].get_unique_id(), timeout=0.5)
            elif call == "register_window":
                comms[0].register_window(comms[0].mem_alloc(64), timeout=0.5)
            else:  # past the exchange of the members (a store's), in the library call
                comms[0]._split_members = lambda *a: (0,)
                comms[0].split(0, timeout=0.5)
        assert time.monotonic() - t0 < 3.0
        assert comms[0].state == "aborted"


@pytest.mark.timeout(60, method="thread")
def test_another_thread_s_abort_ends_a_blocking_registration_with_comm_aborted():
    # it raised the library's InvalidUsage ("invalid usage"), where every other call another thread's abort ends
    # raises CommAborted
    with _ranks(2, backend="host", timeout=20) as comms:
        threading.Timer(0.3, comms[0].abort).start()
        with pytest.raises(pycoll.CommAborted, match="ncclCommWindowRegister on communicator .* did not complete: the "
                                                     "communicator was aborted"):
            comms[0].register_window(comms[0].mem_alloc(64), timeout=10)


@pytest.mark.timeout(60, method="thread")
def test_ctrl_c_in_a_blocking_communicators_reshape_aborts_it():
    # the call's thread looked ended after an interrupted join (CPython 3.10-3.12), so nothing was aborted: the
    # communicator stayed active, its peers were not told, and the library call went on in its thread
    import signal

    with _ranks(3, backend="host", timeout=20) as comms:
        timer = threading.Timer(0.3, lambda: signal.pthread_kill(threading.main_thread().ident, signal.SIGINT))
        timer.start()
        with pytest.raises(KeyboardInterrupt):
            comms[0].shrink([2], timeout=10)
        assert comms[0].state == "aborted"
        deadline = time.monotonic() + 5
        while any(t.name.startswith("pycoll-shrink") for t in threading.enumerate()) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not [t.name for t in threading.enumerate() if t.name.startswith("pycoll-shrink")]


def test_destroy_after_the_thread_that_had_the_communicator_ended_though_a_new_one_has_its_ident():
    comm = pycoll.init(0, 1, unique_id=pycoll.get_unique_id(backend="host"), backend="host")
    t = threading.Thread(target=lambda: comm.all_reduce(np.ones(2, np.float32)), name="trainer")
    t.start()
    t.join()
    gate = threading.Event()
    other = threading.Thread(target=gate.wait, name="writer")  # CPython gives it the ended trainer's ident, mostly
    other.start()
    try:
        comm.destroy()  # refused as the 'trainer''s, still there by its ident
        assert comm.state == "destroyed"
    finally:
        gate.set()
        other.join()


def _destroyed(comm):
    try:
        comm.destroy(timeout=10)
    except Exception as e:
        comm.abort()
        return [e]
    return []
