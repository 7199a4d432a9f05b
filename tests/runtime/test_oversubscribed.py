"""Ranks that outnumber the CPUs: the Communicator's operations on the host backend.

There a stream's thread is not woken at once for work that a waiter may run itself (PYCOLL_HOST_DEFER_NS):
these tests pin both ranks of a communicator to one CPU and check that such work still runs when nobody waits
for it, and that a rank killed, stopped or failed where its work is deferred (failpoint host.stream.defer)
fails its peer's operation instead of hanging it. A small collective gets one pass in the caller's thread first
(PYCOLL_HOST_EAGER): what it cannot finish there is handed to the stream's thread, deferred alike. A blocking
call whose peer comes late waits through every phase of the host library's backoff there and keeps its deadline.
"""

from __future__ import annotations

import os
import signal
import time

import numpy as np
import pytest
from helpers.mp import Died, error_and_time, run_ranks

import pycoll
from pycoll import _bindings as B

pytestmark = [pytest.mark.timeout(120),
              pytest.mark.skipif(not hasattr(os, "sched_setaffinity"), reason="no sched_setaffinity here")]


def _uid() -> bytes:
    return bytes(B.load("host").get_unique_id())


def _pinned_comm(rank, n, uid, **kw):
    os.sched_setaffinity(0, {min(os.sched_getaffinity(0))})  # every rank on one CPU
    c = pycoll.init(rank, n, unique_id=uid, backend="host", **kw)
    x = np.ones(4, np.float32)
    c.all_reduce(x)  # the own stream exists (this blocking one ran in this thread)
    time.sleep(0.05)  # and its thread sleeps
    return c


def _unwaited(rank, n, uid):
    c = _pinned_comm(rank, n, uid, timeout=30)
    send, out = np.full(8, rank + 1, np.float32), np.zeros((3, 8), np.float32)
    t0 = time.monotonic()
    works = [c.all_reduce(send, out[i], async_op=True) for i in range(3)]
    while not all(w.is_completed() for w in works) and time.monotonic() - t0 < 20:
        time.sleep(0.002)
    took = time.monotonic() - t0
    done = [w.is_completed() for w in works]
    c.destroy()
    return done, took, out.tolist()


def test_asynchronous_operations_nobody_waits_for_complete():
    env = {"PYCOLL_HOST_DEFER_NS": "200000000"}  # 0.2 s
    for rank, (done, took, out) in enumerate(run_ranks(_unwaited, 2, _uid(), env=env)):
        assert done == [True] * 3, f"rank {rank}: {done} after {took:.2f} s"
        assert took < 15
        assert out == [[3.0] * 8] * 3


def _deferred_failpoint(rank, n, uid, spec, policy="abort"):
    """An all_reduce too large for the caller's pass (64 KiB) queued, deferred, on rank 1's stream."""
    if rank == 1:
        os.environ["PYCOLL_FAILPOINTS"] = spec
    c = _pinned_comm(rank, n, uid, timeout=4, on_failure=policy)
    out = error_and_time(lambda: c.all_reduce(np.ones(16384, np.float32), async_op=True).wait())
    c.abort()
    return out


def _handed_back_failpoint(rank, n, uid, spec, policy="abort"):
    """A small all_reduce: rank 1's own pass publishes its share, rank 0 comes 0.3 s later, so rank 1 hands the rest
    to its stream's thread, deferred: there the failpoint acts. Rank 0 then has everything its operation needs;
    its next one meets the failure. Returns rank 0's error and time over both (rank 1's on its first)."""
    if rank == 1:
        os.environ["PYCOLL_FAILPOINTS"] = spec
    c = _pinned_comm(rank, n, uid, timeout=4, on_failure=policy)
    if rank == 0:
        time.sleep(0.3)

    def both():
        c.all_reduce(np.ones(4, np.float32), async_op=True).wait()
        c.all_reduce(np.ones(4, np.float32))

    out = error_and_time(both)
    c.abort()
    return out


# where the work is deferred: queued whole, or handed back after the caller's pass
WHERE = {"queued": _deferred_failpoint, "handed back": _handed_back_failpoint}


# a stopped rank costs its peer's deadline (4 s a case): in CI stopped where the work is queued and handed back
# under one policy, killed under every one; the other stops under --runslow
@pytest.mark.parametrize("action,where,policy", [
    pytest.param(a, w, p, id=f"{a}-{w}-{p}", marks=pytest.mark.slow if a == "stop" and p != "abort" else ())
    for a in ("kill", "stop") for w, p in (("queued", "abort"), ("queued", "revoke"), ("queued", "report"),
                                           ("handed back", "abort"))])
def test_a_rank_killed_or_stopped_where_its_work_is_deferred_fails_its_peer(action, where, policy):
    res = run_ranks(WHERE[where], 2, _uid(), f"host.stream.defer={action}", policy, may_die=[1], timeout=60)
    assert isinstance(res[1], Died), res
    name, took = res[0]
    assert name == ("RemoteError" if action == "kill" else "CommTimeout"), res
    assert took < 20, res


def _left_after_a_wait(rank, n, uid, action):
    """Two all_reduce too large for the caller's pass, queued deferred; each rank's wait for the first runs it and
    leaves the second deferred (stream.c: stream_help); rank 1 is then killed or stopped. Returns rank 0's error and
    time."""
    c = _pinned_comm(rank, n, uid, timeout=4)

    def both():
        first, second = (c.all_reduce(np.ones(16384, np.float32), async_op=True) for _ in range(2))
        first.wait()
        if rank == 1:
            os.kill(os.getpid(), signal.SIGKILL if action == "kill" else signal.SIGSTOP)
        second.wait()

    out = error_and_time(both)
    c.abort()
    return out


# a stopped rank costs its peer's deadline (4 s): under --runslow
@pytest.mark.parametrize("action", [pytest.param("kill"), pytest.param("stop", marks=pytest.mark.slow)])
def test_a_rank_killed_or_stopped_with_work_left_deferred_after_its_wait_fails_its_peer(action):
    res = run_ranks(_left_after_a_wait, 2, _uid(), action, may_die=[1], timeout=60)
    assert isinstance(res[1], Died), res
    name, took = res[0]
    assert name == ("RemoteError" if action == "kill" else "CommTimeout"), res
    assert took < 20, res


@pytest.mark.parametrize("where", list(WHERE))
def test_deferred_work_refused_fails_the_operation_on_its_rank_and_its_peer(where):
    res = run_ranks(WHERE[where], 2, _uid(), "host.stream.defer=raise", timeout=60)
    for rank, (name, took) in enumerate(res):
        assert name != "no error" and took < 20, (rank, res)


def _late_peer(rank, n, uid, late_s, timeout):
    """Rank 1 calls its all_reduce ``late_s`` after rank 0, whose blocking one waits in the host library through
    every phase of its backoff (the short spins, the yields, the sleeps). Each rank returns the name of its error
    ("no error" when none), the seconds its call took and its array after it."""
    c = _pinned_comm(rank, n, uid, timeout=30, on_failure="report")
    x = np.full(4, rank + 1, np.float32)
    if rank == 1:
        time.sleep(late_s)
    name, took = error_and_time(lambda: c.all_reduce(x, timeout=timeout))
    c.abort()
    return name, took, x.tolist()


def test_a_blocking_call_waiting_for_a_late_peer_completes():
    res = run_ranks(_late_peer, 2, _uid(), 0.3, 10.0, timeout=60)
    name, took, x = res[0]
    assert (name, x) == ("no error", [3.0] * 4), res
    assert 0.25 < took < 5, res


def test_a_blocking_call_waiting_for_a_late_peer_keeps_its_deadline():
    # the waiter's look at its deadline rides on its backoff's clock reads (one per round, none in the first short
    # spins): it still returns to the Communicator's wait at every slice and the deadline ends it in time
    res = run_ranks(_late_peer, 2, _uid(), 2.0, 0.4, timeout=60)
    name, took, _ = res[0]
    assert name == "CommTimeout", res
    assert 0.35 < took < 1.5, res
