"""A host stream holds at most PYCOLL_HOST_STREAM_DEPTH operations queued and not begun, as a GPU's launch queue holds
about 1024 kernels: a rank that issues ``async_op=True`` operations and drops their Works waits for room once its
stream is full instead of running thousands of operations ahead of a slow peer (their Works, arrays and events all
kept meanwhile), and the Communicator's event pool gives back what a burst left beyond its bound. The wait for room
ends when the communicator is aborted, revoked or fails (a peer gone), and on a signal (Ctrl-C raises at once); a
process killed, stopped or failed where it begins that wait (failpoint host.stream.full) fails its peer, no hang."""

from __future__ import annotations

import os
import signal
import threading
import time

import numpy as np
import pytest
from helpers.host_util import wait_until
from helpers.mp import Died, error_and_time, run_ranks

import pycoll
from pycoll import _bindings as B
from pycoll._core import pool_trim_after

pytestmark = pytest.mark.timeout(60)

DEPTH = 48  # PYCOLL_HOST_STREAM_DEPTH in these tests
ENV = {"PYCOLL_HOST_STREAM_DEPTH": str(DEPTH)}
EVERY = 8  # pycoll._core._RETIRE_EVERY
KEPT = 64  # pycoll._core._EVENTS_KEPT
TRIM_EVERY = 256  # pycoll._core._TRIM_EVERY


def _uid() -> bytes:
    return bytes(B.load("host").get_unique_id())


def _traced(path: str) -> bool:
    return os.path.exists(path) and os.path.getsize(path) > 0


def _ahead(rank, n, uid, trace):
    """Rank 1 stops itself; rank 0 issues 400 operations (every fourth a group of two) and drops their Works. The
    parent continues rank 1 once rank 0 waits for room (the failpoint's note)."""
    if rank == 0:
        os.environ["PYCOLL_FAILPOINTS"] = f"host.stream.full=note;trace={trace}"
    pool_trim_after(0)  # the pool's surplus goes at its next look (1 s unused by default)
    c = pycoll.init(rank, n, unique_id=uid, backend="host", name="ahead", timeout=30)
    try:
        c.all_reduce(np.ones(1, np.float32))
        if rank == 1:
            os.kill(os.getpid(), signal.SIGSTOP)
        xs, most = [], 0
        for i in range(400):
            x = np.full(2, float(rank + i), np.float32)
            xs.append(x)
            if i % 4 == 3:
                y = np.full(2, float(rank - i), np.float32)
                xs.append(y)
                with c.group():
                    c.all_reduce(x, async_op=True)
                    c.all_reduce(y, async_op=True)
            else:
                c.all_reduce(x, async_op=True)
            most = max(most, len(c.outstanding()))
        c.all_reduce(np.ones(1, np.float32), async_op=True).wait()  # everything before it is complete
        for _ in range(EVERY):  # one of these retires them
            c.all_reduce(np.ones(1, np.float32))
        want = []
        for i in range(400):
            want.append([1.0 + 2 * i] * 2)
            if i % 4 == 3:
                want.append([1.0 - 2 * i] * 2)
        pooled = len(c._events)  # the burst's events, back
        for _ in range(2 * TRIM_EVERY):  # each takes two events and gives them back; the pool is looked at twice in
            c.all_reduce(np.ones(1, np.float32))  # these: the first look starts a window, the second trims
        return {"most": most, "right": [x.tolist() for x in xs] == want, "outstanding": len(c.outstanding()),
                "pooled after the burst": pooled, "pooled": len(c._events)}
    finally:
        c.destroy()


def _continue_when(trace):
    """on_start: SIGCONT rank 1 once it has stopped and rank 0 waits for room."""

    def on_start(procs):
        def go():
            pid = procs[1].pid

            def stopped():
                with open(f"/proc/{pid}/stat") as f:
                    return f.read().rsplit(")", 1)[1].split()[0] == "T"

            wait_until(lambda: stopped() and _traced(trace), 30, "rank 1 stopped and rank 0 waiting for room")
            os.kill(pid, signal.SIGCONT)

        threading.Thread(target=go, daemon=True).start()

    return on_start


def test_a_rank_ahead_of_a_stopped_peer_stays_within_the_depth_and_its_pool_shrinks(tmp_path):
    """At most DEPTH task lists queued (a group's two operations are one), plus the one running and those completed
    since the last retiring look: about 70 outstanding operations, not the 500 issued; every result right once rank 1
    comes back, groups too; none left outstanding. The event pool, which the outstanding operations' events refilled
    past its bound, gives back what no operation took between two of its looks (here, with the trim window at 0):
    KEPT events and the two a blocking operation takes are left."""
    trace = str(tmp_path / "full")
    res = run_ranks(_ahead, 2, _uid(), trace, env=ENV, on_start=_continue_when(trace), timeout=50)
    assert _traced(trace)
    for r in res:
        assert r["right"] and r["outstanding"] == 0, res
        assert r["pooled"] <= KEPT + 2, res
    assert DEPTH <= res[0]["most"] < 2 * DEPTH, res
    assert res[0]["pooled after the burst"] > KEPT + 2, res  # 2 events for each of the ~70 operations came back


def _issuer_waits(rank, n, uid, trace, done, what):
    """Rank 0 issues until it waits for room on its full stream (rank 1 issues nothing until then); then ``what``:
    rank 1 kills or stops itself, or a thread of rank 0 aborts or revokes its communicator or sends it SIGINT
    ("sigint" and "stop, report" under on_failure="report").
    Returns what rank 0's loop raised and how long after the wait began."""
    if rank == 0:
        os.environ["PYCOLL_FAILPOINTS"] = f"host.stream.full=note;trace={trace}"
    c = pycoll.init(rank, n, unique_id=uid, backend="host", name="waits", timeout=1.0,
                    on_failure="report" if what in ("sigint", "stop, report") else "abort")
    c.all_reduce(np.ones(1, np.float32))
    if rank == 1:
        wait_until(lambda: _traced(trace), 30, "rank 0 waiting for room")
        if what in ("kill", "stop", "stop, report"):
            os.kill(os.getpid(), signal.SIGKILL if what == "kill" else signal.SIGSTOP)
        wait_until(lambda: os.path.exists(done), 30, "rank 0 done")
        c.abort()
        return None
    began = []

    def act():
        wait_until(lambda: _traced(trace), 30, "the wait for room")
        began.append(time.monotonic())
        if what == "sigint":
            os.kill(os.getpid(), signal.SIGINT)
        elif what in ("abort", "revoke"):
            getattr(c, what)()

    threading.Thread(target=act, daemon=True).start()

    def loop():
        for i in range(10 * DEPTH):
            c.all_reduce(np.full(2, float(i), np.float32), async_op=True)

    try:
        name, _ = error_and_time(loop)
    except KeyboardInterrupt:
        name = "KeyboardInterrupt"
    took = time.monotonic() - began[0] if began else None
    open(done, "w").close()
    c.abort()
    return name, took


@pytest.mark.parametrize("what,raised,within", [
    ("kill", ("RemoteError", "PeerFailure"), 1.0),  # the peer's death fails the stream's work, then the wait
    # the watchdog's abort at the operations' 1 s deadline (1.7 s; what many tests check of the watchdog): --runslow
    pytest.param("stop", ("CommTimeout",), 4.0, marks=pytest.mark.slow),
    ("stop, report", ("CommTimeout",), 2.0),  # no watchdog, no abort: the wait looks at the oldest one's deadline
    ("abort", ("CommAborted",), 1.0),
    ("revoke", ("CommRevoked",), 1.0),
    ("sigint", ("KeyboardInterrupt",), 0.15),  # under "report", where nothing else releases it
])
def test_the_wait_for_room_ends_when_the_peer_dies_or_the_communicator_is_stopped(tmp_path, what, raised, within):
    """The Communicator waits for room in slices (``_core._wait_room``), as a Work's wait: a peer's death fails the
    operations queued before (and the wait with them); a stopped peer's operations time out at their deadline, which
    the watchdog's round or, without one, the wait itself finds (under "report" too); an abort or revoke from another
    thread and Ctrl-C raise at once."""
    env = {**ENV, "PYCOLL_WATCHDOG": "0"} if what == "stop, report" else ENV
    res = run_ranks(_issuer_waits, 2, _uid(), str(tmp_path / "full"), str(tmp_path / "done"), what, env=env,
                    may_die=[1] if what.startswith(("kill", "stop")) else [], timeout=50)
    name, took = res[0]
    assert name in raised and took is not None and took < within, res
    if what == "kill":
        assert isinstance(res[1], Died), res


def _killed_at_the_wait(rank, n, uid, trace, done, action):
    """Rank 1 issues until its stream is full, where the failpoint acts; rank 0 issues nothing until then, then
    blocking operations."""
    if rank == 1:
        os.environ["PYCOLL_FAILPOINTS"] = f"host.stream.full={action};trace={trace}"
    c = pycoll.init(rank, n, unique_id=uid, backend="host", name="at the wait", timeout=1.0)
    c.all_reduce(np.ones(1, np.float32))
    if rank == 1:
        try:
            for i in range(10 * DEPTH):
                c.all_reduce(np.full(2, float(i), np.float32), async_op=True)
            out = "no error"
        except pycoll.PycollError as e:
            out = f"{type(e).__name__}: {e}"
        open(done, "w").close()
        c.abort()
        return out
    wait_until(lambda: _traced(trace), 30, "rank 1 at the failpoint")
    if action == "raise":
        wait_until(lambda: os.path.exists(done), 30, "rank 1 done")
        c.abort()
        return None

    def blocking():
        for _ in range(2 * DEPTH):
            c.all_reduce(np.ones(2, np.float32))

    out = error_and_time(blocking)
    c.abort()
    return out


@pytest.mark.parametrize("action", ["kill", "stop"])
def test_a_rank_killed_or_stopped_where_it_waits_for_room_fails_its_peer(tmp_path, action):
    res = run_ranks(_killed_at_the_wait, 2, _uid(), str(tmp_path / "fp"), str(tmp_path / "done"), action, env=ENV,
                    may_die=[1], timeout=50)
    assert isinstance(res[1], Died), res
    name, took = res[0]
    assert name == ("RemoteError" if action == "kill" else "CommTimeout") and took < 4, res


def test_a_wait_for_room_refused_fails_the_call_naming_the_failpoint(tmp_path):
    res = run_ranks(_killed_at_the_wait, 2, _uid(), str(tmp_path / "fp"), str(tmp_path / "done"), "raise", env=ENV,
                    timeout=50)
    assert "host.stream.full" in res[1], res


def _bursts(rank, n, uid):
    """Ten rounds of 100 async all_reduce waited for together, the pool trimmed at every look (window 0): each round
    draws on the events the one before gave back."""
    pool_trim_after(0)
    c = pycoll.init(rank, n, unique_id=uid, backend="host", name="bursts")
    made = []
    create = c.device.create_event
    c.device.create_event = lambda *a: made.append(1) or create(*a)
    try:
        for _ in range(10):
            works = [c.all_reduce(np.ones(2, np.float32), async_op=True) for _ in range(100)]
            for w in works:
                w.wait()
        return len(made)
    finally:
        c.destroy()


def test_a_loop_of_bursts_makes_its_events_once():
    """Events the next round takes again are no surplus: about 200 events made in all (two per operation of one
    round), not 200 a round (2,000). On a loaded machine some of a round's operations retire while the round is still
    issuing, and the pool's trim at those retirements can take events the same round then makes again (CI once
    counted 224): fewer than two rounds' worth proves the reuse."""
    for made in run_ranks(_bursts, 2, _uid(), timeout=50):
        assert made < 2 * 2 * 100, made
