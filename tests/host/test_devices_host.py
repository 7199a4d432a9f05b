"""pycoll.devices.HostDevice on the real host library (libpycoll_host.so) and the real libnccl."""

from __future__ import annotations

import os
import time

import numpy as np
import pytest
from helpers.mp import run_ranks

from pycoll.devices import HostDevice, Stream
from pycoll.errors import LibraryError, NCCLError, NotSupported

nccl = pytest.importorskip("pycoll._bindings._nccl", reason="bindings not built")


def _host_library():
    try:
        lib = nccl.load("host")
    except LibraryError as exc:
        pytest.skip(f"host library not built yet: {exc}")
    if not lib.has("pycollStreamCreate"):
        pytest.skip("host library has no streams yet")
    return lib


def test_host_device_refuses_libnccl():
    try:
        lib = nccl.load("nccl")
    except LibraryError as exc:
        pytest.skip(f"libnccl not installed: {exc}")
    with pytest.raises(NotSupported, match="pycollStreamCreate is not available in .*libnccl"):
        HostDevice(lib)


def test_real_host_streams_and_events():
    dev = HostDevice(_host_library())
    s = dev.create_stream()
    start, end = dev.create_event(), dev.create_event(timing=True)
    dev.record_event(start, s)
    dev.record_event(end, s)
    dev.synchronize_event(end)
    assert dev.query_event(start) and dev.query_event(end)
    dev.synchronize_stream(s)
    assert dev.query_stream(s)
    assert dev.elapsed_ms(start, end) >= 0.0
    never = dev.create_event()
    assert dev.query_event(never)  # never recorded: complete
    dev.stream_wait_event(s, never)
    dev.record_event(never, 0)  # the NULL stream completes it at once
    assert dev.query_event(never)
    for e in (start, end, never):
        dev.destroy_event(e)
    dev.destroy_stream(s)
    with pytest.raises(ValueError, match="not a live host stream"):
        dev.resolve_stream(s)
    st = dev.new_stream()
    assert isinstance(st, Stream) and dev.resolve_stream(st) == st.handle
    st.close()
    dev.close()


def test_a_rerecorded_event_takes_the_new_time():
    """A record that completes at once (idle stream, NULL stream) reuses the event's completed marker in place
    when nobody else holds it: the event must say the new time, and a recording queued behind work must still
    wait for that work."""
    dev = HostDevice(_host_library())
    s = dev.create_stream()
    a, b = dev.create_event(timing=True), dev.create_event(timing=True)
    for stream in (s, 0):
        dev.record_event(a, stream)
        time.sleep(0.02)
        dev.record_event(b, stream)
        first = dev.elapsed_ms(a, b)
        assert 15.0 <= first < 1000.0
        time.sleep(0.02)
        dev.record_event(a, stream)  # a again, after b: now later than b
        assert dev.query_event(a)
        assert -1000.0 < dev.elapsed_ms(a, b) <= -15.0
        assert dev.elapsed_ms(b, a) >= 15.0
    # a record behind queued work does not complete before it (no reuse of a completed marker there)
    lib = dev.library
    gate = dev.create_event()
    lib.host_event_arm(gate)
    dev.stream_wait_event(s, gate)
    dev.record_event(a, s)
    time.sleep(0.01)
    assert not dev.query_event(a), "a record behind blocked work completed at once"
    lib.host_event_fire(gate)
    assert dev.wait_event(a, 10.0)
    dev.destroy_event(gate)
    for e in (a, b):
        dev.destroy_event(e)
    dev.destroy_stream(s)
    dev.close()


def test_real_host_library_rejects_bad_handles():
    lib = _host_library()
    dev = HostDevice(lib)
    with pytest.raises((ValueError, NCCLError)):
        dev.query_event(0)
    with pytest.raises((ValueError, NCCLError)):
        dev.record_event(0, 0)


def _events_complete_in_order(rank, nranks, uid_bytes):
    lib = nccl.load("host")
    dev = HostDevice(lib)
    comm = lib.comm_init_rank(nranks, nccl.UniqueId(uid_bytes), rank)
    stream = dev.create_stream()
    events = [dev.create_event() for _ in range(4)]
    send = np.full(256, rank + 1, np.float32)
    recv = np.zeros((len(events), 256), np.float32)
    if rank == 1:
        time.sleep(0.5)  # rank 0's collectives cannot finish before rank 1 joins
    for i, e in enumerate(events):
        lib.all_reduce(send.ctypes.data, recv[i].ctypes.data, 256, nccl.DataType.Float32, nccl.RedOp.Sum, comm, stream)
        dev.record_event(e, stream)
    # a second stream ordered after the first one: its event is recorded after the wait
    follower = dev.create_stream()
    dev.wait_stream(follower, stream)
    after = dev.create_event()
    dev.record_event(after, follower)
    events.append(after)
    states = []
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        done = [dev.query_event(e) for e in events]
        states.append(done)
        if all(done):
            break
        time.sleep(0.001)
    dev.synchronize_stream(stream)
    dev.synchronize_stream(follower)
    for e in events:
        dev.destroy_event(e)
    dev.destroy_stream(stream)
    dev.destroy_stream(follower)
    lib.comm_destroy(comm)
    return states, float(recv.min()), float(recv.max())


@pytest.mark.timeout(60)
def test_real_host_events_complete_in_order_on_a_stream():
    lib = _host_library()
    uid = bytes(lib.get_unique_id())
    results = run_ranks(_events_complete_in_order, 2, uid, timeout=45)
    for rank, (states, lo, hi) in enumerate(results):
        assert states[-1] == [True] * 5, f"rank {rank}: not all events completed"
        for done in states:
            # completion is a prefix: an event never completes before the one recorded earlier,
            # and the follower stream's event (last) never before the first stream's work
            assert done == sorted(done, reverse=True), f"rank {rank}: out-of-order completion {done}"
        assert lo == hi == 3.0
    assert results[0][0][0] == [False] * 5, "rank 0's events completed before rank 1 had joined"


def _waiters_help(rank, nranks, uid_bytes):
    import threading

    lib = nccl.load("host")
    dev = HostDevice(lib)
    comm = lib.comm_init_rank(nranks, nccl.UniqueId(uid_bytes), rank)
    stream = dev.create_stream()
    dev.allow_inline(stream, False, True)  # PYCOLL_STREAM_HELP: a waiter runs what the stream has not begun
    n = 120
    events = [dev.create_event() for _ in range(n)]
    send = np.full(64, rank + 1, np.float32)
    recv = np.zeros((n, 64), np.float32)
    other_done = []

    def other_waiter():  # a second thread helping on the same stream: one of them runs each item, in order
        for i in range(0, n, 7):
            while not dev.wait_event(events[i], 0.05, True):
                pass
        other_done.append(True)

    for i, e in enumerate(events):
        lib.all_reduce(send.ctypes.data, recv[i].ctypes.data, 64, nccl.DataType.Float32, nccl.RedOp.Sum, comm, stream)
        dev.record_event(e, stream)
        if i == 0:
            t = threading.Thread(target=other_waiter)
            t.start()
        if i % 3 == 0:
            assert dev.wait_event(e, 20.0, True)
            assert all(dev.query_event(x) for x in events[: i + 1])  # everything before it ran first
    assert dev.wait_event(events[-1], 20.0, True)
    t.join(20)
    dev.synchronize_stream(stream)
    states = [dev.query_event(e) for e in events]
    for e in events:
        dev.destroy_event(e)
    dev.destroy_stream(stream)
    lib.comm_destroy(comm)
    return all(states), bool(other_done), float(recv.min()), float(recv.max())


@pytest.mark.timeout(60)
def test_waiters_run_the_work_a_helping_stream_has_not_begun():
    lib = _host_library()
    uid = bytes(lib.get_unique_id())
    for rank, res in enumerate(run_ranks(_waiters_help, 2, uid, timeout=45)):
        assert res == (True, True, 3.0, 3.0), (rank, res)


def _event_wait_cpu(rank, nranks, uid_bytes, pin):
    import threading

    if pin:  # both ranks on one CPU: the communicator finds its ranks outnumber this process's CPUs
        os.sched_setaffinity(0, {min(os.sched_getaffinity(0))})
    lib = nccl.load("host")
    dev = HostDevice(lib)
    comm = lib.comm_init_rank(nranks, nccl.UniqueId(uid_bytes), rank)
    spent = []
    for _ in range(3):
        ev = dev.create_event()
        lib.host_event_arm(ev)
        firer = threading.Timer(0.05, lib.host_event_fire, (ev,))
        firer.start()
        t0 = time.thread_time()
        assert dev.wait_event(ev, 10.0)
        spent.append(time.thread_time() - t0)
        firer.join()
        dev.destroy_event(ev)
    lib.comm_destroy(comm)
    return min(spent)


@pytest.mark.timeout(60)
@pytest.mark.serial  # its control measures the CPU a waiter spends yielding, which another worker's load takes
def test_an_oversubscribed_event_waiter_sleeps_instead_of_yielding():
    """Where a communicator's ranks outnumber the CPUs, a thread waiting for an event (whose firing thread needs
    the CPU) sleeps after its short spin instead of yielding for PYCOLL_HOST_YIELD_NS (0.3 ms) first."""
    lib = _host_library()
    if not hasattr(os, "sched_setaffinity"):
        pytest.skip("no sched_setaffinity here")
    env = {"PYCOLL_HOST_YIELD_NS": "20000000"}  # 20 ms of yielding, unless the waiter skips that round
    pinned = run_ranks(_event_wait_cpu, 2, bytes(lib.get_unique_id()), True, timeout=45, env=env)
    free = run_ranks(_event_wait_cpu, 2, bytes(lib.get_unique_id()), False, timeout=45, env=env)
    assert max(pinned) < 0.003, f"oversubscribed waiters used {pinned} s of CPU waiting 50 ms"
    if len(os.sched_getaffinity(0)) >= 2:  # the control: with a CPU each they yield (and spend CPU) first
        assert max(free) > 0.005, f"waiters with a CPU each spent only {free} s of CPU (the policy changed?)"


def _deferred_work(rank, nranks, uid_bytes, pin):
    """Two operations queued at once on a helping stream, each followed by its event: the first waited for (with
    running allowed) after 0.15 s, the second never waited for, only queried -- 0.15 s after that wait, and until it
    completes. Returns whether each was complete 0.15 s after it was queued, whether the second was 0.15 s after the
    wait for the first, and when each completed. The operations (64 KiB) are too large for the caller's own pass
    (PYCOLL_HOST_EAGER), which would finish the second rank's at once."""
    if pin:  # both ranks on one CPU: the ranks outnumber this process's CPUs
        os.sched_setaffinity(0, {min(os.sched_getaffinity(0))})
    lib = nccl.load("host")
    dev = HostDevice(lib)
    comm = lib.comm_init_rank(nranks, nccl.UniqueId(uid_bytes), rank)
    stream = dev.create_stream()
    dev.allow_inline(stream, False, True)
    time.sleep(0.05)  # the new stream's thread asleep (awake, it takes what is queued)
    send, recv = np.full(16384, rank + 1, np.float32), np.zeros((2, 16384), np.float32)
    events = [dev.create_event() for _ in range(2)]
    t0 = time.monotonic()
    for i, ev in enumerate(events):
        lib.all_reduce(send.ctypes.data, recv[i].ctypes.data, 16384, nccl.DataType.Float32, nccl.RedOp.Sum, comm,
                       stream)
        dev.record_event(ev, stream)
    time.sleep(0.15)
    early = [dev.query_event(ev) for ev in events]
    assert dev.wait_event(events[0], 20.0, True)
    took = [time.monotonic() - t0]
    time.sleep(0.15)
    after_wait = dev.query_event(events[1])
    while not dev.query_event(events[1]) and time.monotonic() - t0 < 20:
        time.sleep(0.005)
    took.append(time.monotonic() - t0)
    for ev in events:
        dev.destroy_event(ev)
    dev.synchronize_stream(stream)
    dev.destroy_stream(stream)
    lib.comm_destroy(comm)
    return early, after_wait, took, float(recv.min()), float(recv.max())


@pytest.mark.timeout(90)
def test_an_oversubscribed_helping_stream_leaves_its_work_to_a_waiter_for_a_bounded_time():
    """Where the ranks outnumber the CPUs, work queued on a helping stream does not wake the stream's thread at
    once: a thread that waits for it runs it (no wake-up, no thread switches), and work nobody waits for still
    runs, at most PYCOLL_HOST_DEFER_NS after it was queued. The waiter's run ends at what it waits for; what was
    queued after it stays deferred too (woken at once there, the stream's thread would take the waiter's CPU and
    leave the thread that queued it, which is likely to wait for it next, asleep). With a CPU per rank the thread
    takes the work at once."""
    lib = _host_library()
    if not hasattr(os, "sched_setaffinity"):
        pytest.skip("no sched_setaffinity here")
    env = {"PYCOLL_HOST_DEFER_NS": "600000000"}  # 0.6 s
    for rank, (early, after_wait, took, lo, hi) in enumerate(
            run_ranks(_deferred_work, 2, bytes(lib.get_unique_id()), True, timeout=60, env=env)):
        assert early == [False, False], f"rank {rank}: the stream's thread ran deferred work at once"
        assert took[0] < 0.5, f"rank {rank}: the waiter did not run the work itself ({took[0]:.3f} s)"
        assert not after_wait, f"rank {rank}: the stream's thread took the work left after the waiter's at once"
        assert took[1] < 15, f"rank {rank}: work nobody waited for completed after {took[1]:.3f} s"
        assert lo == hi == 3.0
    if len(os.sched_getaffinity(0)) >= 2:  # the control: with a CPU per rank nothing is deferred
        for rank, (early, _after, _took, lo, hi) in enumerate(
                run_ranks(_deferred_work, 2, bytes(lib.get_unique_id()), False, timeout=60, env=env)):
            assert early == [True, True], f"rank {rank}: work waited although the ranks have a CPU each"
            assert lo == hi == 3.0


def _late_peer(rank, nranks, uid_bytes, help_):
    """Rank 1 joins an all_reduce 0.6 s late. Rank 0 runs it in its own thread: inline (an idle stream allowed to),
    or as a waiter helping in a wait of 0.2 s. Returns how long rank 0's call (or wait) kept its thread, whether the
    operation was complete then, when it completed, and the result."""
    lib = nccl.load("host")
    dev = HostDevice(lib)
    comm = lib.comm_init_rank(nranks, nccl.UniqueId(uid_bytes), rank)
    stream = dev.create_stream()
    dev.allow_inline(stream, not help_, True)
    send, recv = np.full(64, rank + 1, np.float32), np.zeros(64, np.float32)
    ev = dev.create_event()
    lib.all_reduce(send.ctypes.data, recv.ctypes.data, 64, nccl.DataType.Float32, nccl.RedOp.Sum, comm, 0)  # met
    if rank == 1:
        time.sleep(0.6)
    t0 = time.monotonic()
    lib.all_reduce(send.ctypes.data, recv.ctypes.data, 64, nccl.DataType.Float32, nccl.RedOp.Sum, comm, stream)
    dev.record_event(ev, stream)
    if help_:
        dev.wait_event(ev, 0.2, True)
    held = time.monotonic() - t0
    done_then = dev.query_event(ev)
    dev.synchronize_event(ev)
    took = time.monotonic() - t0
    dev.destroy_event(ev)
    dev.destroy_stream(stream)
    lib.comm_destroy(comm)
    return held, done_then, took, float(recv.min()), float(recv.max())


@pytest.mark.timeout(90)
@pytest.mark.parametrize("help_", [False, True], ids=["inline", "waiter-helping"])
def test_work_run_in_a_callers_thread_goes_to_the_streams_thread_after_the_inline_bound(help_):
    """A thread that is not the stream's own runs the stream's work for at most PYCOLL_HOST_INLINE_NS at a time
    (here 50 ms), and a waiter no longer than its wait: an operation whose peer is late then goes to the stream's
    thread, which finishes it, and the caller's thread is back with its caller (which may have a deadline to keep)
    long before the peer comes."""
    lib = _host_library()
    env = {"PYCOLL_HOST_INLINE_NS": "50000000"}
    res = run_ranks(_late_peer, 2, bytes(lib.get_unique_id()), help_, timeout=60, env=env)
    held, done_then, took, lo, hi = res[0]
    assert held < 0.4, f"rank 0's thread ran the late operation for {held:.3f} s"
    assert not done_then
    assert took >= 0.5, res
    for _held, _done, _took, lo, hi in res:
        assert lo == hi == 3.0, res


def _eager_pass(rank, nranks, uid_bytes, op, count):
    """Rank 1 queues an all_reduce of ``count`` floats -- or, ``op`` "send/recv", a receive of them from rank 0, which
    sends them -- on an idle helping stream (not inline) 0.2 s after rank 0, records an event after it and queries it
    at once. Returns whether it was complete then and the result.
    Rank 1 runs on one CPU (its ranks then outnumber its CPUs): work queued for its stream's thread wakes the
    thread only after PYCOLL_HOST_DEFER_NS, so an operation complete at the query is one its caller's thread
    ran, never one the stream's thread, woken at once on an idle CPU, finished in the microseconds before it."""
    if rank == 1:
        os.sched_setaffinity(0, {min(os.sched_getaffinity(0))})
    lib = nccl.load("host")
    dev = HostDevice(lib)
    comm = lib.comm_init_rank(nranks, nccl.UniqueId(uid_bytes), rank)
    stream = dev.create_stream()
    dev.allow_inline(stream, False, True)
    time.sleep(0.05 + 0.2 * rank)  # the stream's thread asleep; rank 0's share published first
    send, recv = np.full(count, rank + 1, np.float32), np.zeros(count, np.float32)
    ev = dev.create_event()
    if op == "all_reduce":
        lib.all_reduce(send.ctypes.data, recv.ctypes.data, count, nccl.DataType.Float32, nccl.RedOp.Sum, comm, stream)
    elif rank == 0:
        lib.send(send.ctypes.data, count, nccl.DataType.Float32, 1, comm, stream)
        recv[:] = 1.0
    else:
        lib.recv(recv.ctypes.data, count, nccl.DataType.Float32, 0, comm, stream)
    dev.record_event(ev, stream)
    done = dev.query_event(ev)
    dev.synchronize_stream(stream)
    dev.destroy_event(ev)
    dev.destroy_stream(stream)
    lib.comm_destroy(comm)
    return done, float(recv.min()), float(recv.max())


@pytest.mark.timeout(60)
@pytest.mark.parametrize("op,count,eager", [("all_reduce", 16, "1"), ("all_reduce", 16, "0"),
                                            ("all_reduce", 16384, "1"), ("send/recv", 16, "1"),
                                            ("send/recv", 16384, "1")])
def test_a_small_operation_on_a_helping_stream_gets_a_pass_in_the_callers_thread(op, count, eager):
    """PYCOLL_HOST_EAGER: a small collective, send or receive queued on an idle helping stream first runs as far as it
    can in the caller's thread: rank 1, whose peer's share or message is there already, finishes it before the call
    returns (no thread of the stream woken); a larger one (above 32 KiB for a receive), or with the pass off, is the
    stream thread's, which has to wake for it."""
    lib = _host_library()
    res = run_ranks(_eager_pass, 2, bytes(lib.get_unique_id()), op, count, timeout=45,
                    env={"PYCOLL_HOST_EAGER": eager, "PYCOLL_HOST_DEFER_NS": "50000000"})
    value = 3.0 if op == "all_reduce" else 1.0
    assert [r[1:] for r in res] == [(value, value)] * 2
    assert res[1][0] is (count == 16 and eager == "1"), res


def _busy_comm(rank, nranks, uid_bytes):
    """Rank 0's stream A runs an all_reduce rank 1 joins 1 s late (its thread holds the communicator meanwhile);
    rank 0 then queues a small all_reduce on an idle helping stream B. Returns how long that call took (rank 0) and
    both results."""
    lib = nccl.load("host")
    dev = HostDevice(lib)
    comm = lib.comm_init_rank(nranks, nccl.UniqueId(uid_bytes), rank)
    a, b = dev.create_stream(), dev.create_stream()
    dev.allow_inline(b, False, True)
    x, y = np.full(4, rank + 1, np.float32), np.full(4, 10 * (rank + 1), np.float32)
    if rank == 1:
        time.sleep(1.0)
    lib.all_reduce(x.ctypes.data, x.ctypes.data, 4, nccl.DataType.Float32, nccl.RedOp.Sum, comm, a)
    time.sleep(0.1)  # stream A's thread has taken it
    t0 = time.monotonic()
    lib.all_reduce(y.ctypes.data, y.ctypes.data, 4, nccl.DataType.Float32, nccl.RedOp.Sum, comm, b)
    took = time.monotonic() - t0
    dev.synchronize_stream(a)
    dev.synchronize_stream(b)
    for s in (a, b):
        dev.destroy_stream(s)
    lib.comm_destroy(comm)
    return took, float(x[0]), float(y[0])


@pytest.mark.timeout(60)
def test_the_callers_pass_does_not_wait_for_another_thread_running_the_communicator():
    """The pass a small collective gets in its caller's thread never waits: not even for the communicator while
    another stream's thread runs its work (waiting for a late peer); the operation goes to its stream's thread."""
    lib = _host_library()
    res = run_ranks(_busy_comm, 2, bytes(lib.get_unique_id()), timeout=45)
    assert res[0][0] < 0.3, res
    assert [r[1:] for r in res] == [(3.0, 30.0)] * 2
