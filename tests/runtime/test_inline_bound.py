"""A blocking operation that the host library runs in the caller's thread (an idle own stream) is handed back to the
stream after PYCOLL_HOST_INLINE_NS: the caller is back in the Communicator's wait, which keeps the
operation's deadline and handles signals (tests/adversarial/test_comm_misuse.py: Ctrl-C) under every failure
policy, and a rank killed or stopped at that hand-back (failpoint host.stream.handback) fails its peer instead
of hanging it. The work handed back is left to the thread that will wait for it for PYCOLL_HOST_DEFER_NS: that wait
takes it up again, so a long operation stays in the caller's thread; the stream's thread takes over only work nobody
came back for (failpoint host.stream.takeover)."""

from __future__ import annotations

import os
import time

import numpy as np
import pytest
from helpers.mp import Died, error_and_time, run_ranks

import pycoll
from pycoll import _bindings as B
from pycoll._procs import task_files

pytestmark = pytest.mark.timeout(90)
INLINE = {"PYCOLL_HOST_INLINE_NS": "20000000"}  # 20 ms


def _uid() -> bytes:
    return bytes(B.load("host").get_unique_id())


def _late(rank, n, uid, policy, late_s):
    """Rank 1 comes ``late_s`` late to a blocking all_reduce; returns rank 0's result and time."""
    c = pycoll.init(rank, n, unique_id=uid, backend="host", timeout=20, on_failure=policy)
    x = np.full(4, rank + 1, np.float32)
    c.all_reduce(x.copy())  # the own stream exists and is idle
    if rank == 1:
        time.sleep(late_s)
    t0 = time.monotonic()
    c.all_reduce(x)
    took = time.monotonic() - t0
    c.destroy()
    return x.tolist(), took


@pytest.mark.parametrize("policy", ["abort", "revoke", "report"])
def test_an_operation_handed_to_the_streams_thread_completes_with_the_right_result(policy):
    res = run_ranks(_late, 2, _uid(), policy, 0.3, env=INLINE, timeout=60)
    for x, _took in res:
        assert x == [3.0] * 4, res
    assert res[0][1] >= 0.25, res


def _handback_failpoint(rank, n, uid, spec):
    if rank == 1:
        os.environ["PYCOLL_FAILPOINTS"] = spec
    c = pycoll.init(rank, n, unique_id=uid, backend="host", timeout=3)
    c.all_reduce(np.ones(4, np.float32))
    if rank == 0:
        time.sleep(0.3)  # rank 1 runs its operation in its own thread until the bound, then hands it back

    def two():  # rank 1 may have given its share of the first before it stopped: the second needs it
        for _ in range(2):
            c.all_reduce(np.ones(4, np.float32))

    out = error_and_time(two)
    c.abort()
    return out


@pytest.mark.parametrize("action", ["kill", "stop"])
def test_a_rank_killed_or_stopped_where_it_hands_work_back_fails_its_peer(action):
    res = run_ranks(_handback_failpoint, 2, _uid(), f"host.stream.handback={action}", may_die=[1], env=INLINE,
                    timeout=60)
    assert isinstance(res[1], Died), res
    name, took = res[0]
    assert name == ("RemoteError" if action == "kill" else "CommTimeout"), res
    assert took < 10, res


def test_a_hand_back_refused_fails_the_operation_on_its_rank_and_its_peer():
    """"raise" fails the operation on the rank instead of handing it back; its peer fails too (at the latest in the
    next operation: the rank's share of the first may have been given)."""
    res = run_ranks(_handback_failpoint, 2, _uid(), "host.stream.handback=raise", env=INLINE, timeout=60)
    for rank, (name, took) in enumerate(res):
        assert name != "no error" and took < 10, (rank, res)


def _large(rank, n, uid):
    c = pycoll.init(rank, n, unique_id=uid, backend="host", timeout=60)
    count = 4 << 20  # 16 MiB of float32: several ms of copying, handed over part way through
    x = np.arange(count, dtype=np.float32) * (rank + 1)
    outs = []
    for _ in range(3):
        y = np.empty_like(x)
        c.all_reduce(x, y)
        outs.append(bool(np.array_equal(y, np.arange(count, dtype=np.float32) * 3)))
    c.destroy()
    return outs


def test_an_operation_handed_over_part_way_through_gives_the_right_result():
    """An operation still moving data when the bound passes goes to the stream's thread in the middle (here after
    0.1 ms), and the waiter may take it back: its resumable state carries over every time."""
    res = run_ranks(_large, 2, _uid(), env={"PYCOLL_HOST_INLINE_NS": "100000"}, timeout=60)
    assert res == [[True] * 3, [True] * 3], res


def _own_stream_waiter(rank, n, uid, spec):
    if rank == 0:
        os.environ["PYCOLL_FAILPOINTS"] = spec
    # both ranks on one CPU: the stream's thread is not woken at once for work a waiter may run (a helping
    # stream's deferred wake, PYCOLL_HOST_DEFER_NS), so the waiter, not that thread, runs it
    os.sched_setaffinity(0, {min(os.sched_getaffinity(0))})
    c = pycoll.init(rank, n, unique_id=uid, backend="host", timeout=20)
    s = c.device.new_stream()  # a host stream of the caller's (not the communicator's own)
    x = np.full(4, rank + 1, np.float32)
    c.all_reduce(x.copy(), stream=s)
    if rank == 1:
        time.sleep(0.3)
    try:
        c.all_reduce(x, stream=s)  # rank 0's wait runs it (the stream's thread had not begun it), until the bound
        out = x.tolist()
    except pycoll.PycollError as e:
        out = type(e).__name__
    c.abort()
    s.close()
    return out


def test_a_waiter_runs_an_operation_on_a_host_stream_of_the_callers():
    """Host streams that HostDevice makes let a thread waiting for their events run the work queued before them
    (PYCOLL_STREAM_HELP): the Communicator's wait for an operation on such a stream runs it, one thread handoff
    fewer, and hands it back at the end of its wait's slice (seen through the hand-back's failpoint)."""
    if not hasattr(os, "sched_setaffinity"):
        pytest.skip("no sched_setaffinity here")
    env = {**INLINE, "PYCOLL_HOST_DEFER_NS": "500000000"}
    res = run_ranks(_own_stream_waiter, 2, _uid(), "", env=env, timeout=60)
    assert res == [[3.0] * 4, [3.0] * 4], res
    res = run_ranks(_own_stream_waiter, 2, _uid(), "host.stream.handback=raise", env=env, timeout=60)
    assert res[0] != [3.0] * 4, res  # rank 0's waiter was running it when its slice ended


def _thread_cpu_s() -> tuple:
    """This process's CPU seconds: its main thread's and all its other threads' together (their /proc stat files,
    read by pycoll._procs.task_files; the fields after the command name, as stat_fields gives them)."""
    tick = os.sysconf("SC_CLK_TCK")
    main = others = 0.0
    for tid, text in task_files("self", "stat").items():
        fields = text.rpartition(b")")[2].split()
        cpu = (int(fields[11]) + int(fields[12])) / tick  # utime, stime
        if tid == os.getpid():
            main += cpu
        else:
            others += cpu
    return main, others


def _long_ops(rank, n, uid):
    c = pycoll.init(rank, n, unique_id=uid, backend="host", timeout=60)
    count = 4 << 20  # 16 MiB of float32: milliseconds of copying each, far beyond the bound of 0.1 ms
    x = np.arange(count, dtype=np.float32) * (rank + 1)
    y = np.empty_like(x)
    c.all_reduce(x, y)  # the own stream and its thread exist
    main0, others0 = _thread_cpu_s()
    right = True
    for _ in range(40):
        c.all_reduce(x, y)
        right = right and bool(np.array_equal(y, np.arange(count, dtype=np.float32) * 3))
    main1, others1 = _thread_cpu_s()
    c.destroy()
    return right, main1 - main0, others1 - others0


def test_a_long_operation_stays_in_the_callers_thread():
    """Handed back at the bound, every 0.1 ms here, a blocking operation is taken up again by its caller's wait
    (which looks at its deadline and signals in between) rather than finished by the stream's thread: no thread
    switch in the middle of it. Here the other threads used no CPU tick (0.0 s against the caller's 0.5-0.9 s); with
    the stream's thread woken at once for what is handed back (the build before) they used 7-25% of the caller's."""
    if not os.path.isdir("/proc/self/task"):
        pytest.skip("no /proc/self/task here")
    env = {"PYCOLL_HOST_INLINE_NS": "100000", "PYCOLL_HOST_DEFER_NS": "50000000"}
    res = run_ranks(_long_ops, 2, _uid(), env=env, timeout=90)
    for right, main, others in res:
        assert right, res
        assert main >= 0.05, res  # the copying was done, and in this thread
        assert others <= 0.02 + 0.04 * main, res  # CPU ticks of 10 ms; the watchdog's thread uses nearly none


def _left_to_nobody(rank, n, uid, spec):
    """Rank 0 issues a blocking all_reduce on an inline, helping stream of its own through the bindings; rank 1 comes
    0.1 s late, so the call hands the operation back at the bound (20 ms) and returns. Rank 0 then only queries the
    event after it (which neither runs the work nor hurries the stream's thread): returns when it completed, in
    seconds after the call, then two more all_reduce (their error's name and time)."""
    if rank == 0:
        os.environ["PYCOLL_FAILPOINTS"] = spec
    c = pycoll.init(rank, n, unique_id=uid, backend="host", timeout=3)
    x = np.full(4, rank + 1, np.float32)
    c.all_reduce(x.copy())
    done = None
    if rank == 0:
        dev = c.device
        s = dev.create_stream()
        dev.allow_inline(s, True, True)
        ev = dev.create_event()
        t0 = time.monotonic()
        c.library.all_reduce(x.ctypes.data, x.ctypes.data, 4, 7, 0, c.handle, s)  # float32, sum
        dev.record_event(ev, s)
        while not dev.query_event(ev) and time.monotonic() - t0 < 20:
            time.sleep(0.002)
        done = time.monotonic() - t0
        dev.destroy_event(ev)
        dev.destroy_stream(s)
    else:
        time.sleep(0.1)
        c.all_reduce(x)

    def two():
        for _ in range(2):
            c.all_reduce(np.ones(4, np.float32))

    out = error_and_time(two)
    c.abort()
    return done, x.tolist(), out


def test_work_nobody_comes_back_for_goes_to_the_streams_thread_after_the_defer_time():
    env = {**INLINE, "PYCOLL_HOST_DEFER_NS": "300000000"}  # 0.3 s
    res = run_ranks(_left_to_nobody, 2, _uid(), "", env=env, timeout=60)
    done, x, out = res[0]
    assert x == [3.0] * 4 and res[1][1] == [3.0] * 4, res
    assert 0.3 <= done < 10, res  # handed back at 20 ms, left to the caller until 0.32 s: then the stream's thread
    assert out[0] == "no error" and res[1][2][0] == "no error", res


@pytest.mark.parametrize("action", ["kill", "stop"])
def test_a_rank_killed_or_stopped_where_its_streams_thread_takes_over_fails_its_peer(action):
    env = {**INLINE, "PYCOLL_HOST_DEFER_NS": "300000000"}
    res = run_ranks(_left_to_nobody, 2, _uid(), f"host.stream.takeover={action}", may_die=[0], env=env, timeout=60)
    assert isinstance(res[0], Died), res
    name, took = res[1][2]
    assert name == ("RemoteError" if action == "kill" else "CommTimeout"), res
    assert took < 10, res


def test_a_takeover_refused_fails_the_operation_on_its_rank_and_its_peer():
    env = {**INLINE, "PYCOLL_HOST_DEFER_NS": "300000000"}
    res = run_ranks(_left_to_nobody, 2, _uid(), "host.stream.takeover=raise", env=env, timeout=60)
    for rank, (_done, _x, (name, took)) in enumerate(res):
        assert name != "no error" and took < 10, (rank, res)
