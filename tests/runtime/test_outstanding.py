"""Operations nobody waits for: every eighth operation issued retires the oldest outstanding ones while they are
complete (``pycoll._core._retire_completed``), so that they do not pile up between the watchdog's rounds, nor for good
without a watchdog; an incomplete oldest one stops it (never a wait), and a failure it meets is raised by the
operation being issued."""

from __future__ import annotations

import gc
import os
import subprocess
import sys
import time
import weakref

import numpy as np
import pytest
from helpers.mp import run_ranks

import pycoll
from pycoll import hooks

EVERY = 8  # pycoll._core._RETIRE_EVERY

pytestmark = pytest.mark.timeout(120)


def _uid() -> bytes:
    return bytes(pycoll.get_unique_id(backend="host"))


def _fire_and_forget(rank, n, uid):
    c = pycoll.init(rank, n, unique_id=uid, backend="host", name="fire and forget")
    completed = []

    class Completions(hooks.CommObserver):
        def work_completed(self, work):
            completed.append(work.seq)

    observer = Completions()
    hooks.add_observer(observer)
    try:
        most, arrays = 0, []
        for i in range(2000):
            x = np.full(4, float(rank + i), np.float32)
            arrays.append(weakref.ref(x))
            c.all_reduce(x, async_op=True)  # the Work dropped at once
            most = max(most, len(c.outstanding()))
        del x
        last = np.ones(4, np.float32)
        c.all_reduce(last, async_op=True).wait()  # every operation before it is complete now (one stream)
        for _ in range(EVERY):  # one of their issues retires them
            c.all_reduce(np.ones(1, np.float32))
        gc.collect()
        result = {"most outstanding": most, "outstanding": len(c.outstanding()),
                  "arrays alive": sum(r() is not None for r in arrays), "completed": len(completed),
                  "distinct": len(set(completed)), "last": last.tolist()}
    finally:
        hooks.remove_observer(observer)
        c.destroy()
    return result


@pytest.mark.parametrize("n", [1, 2])
@pytest.mark.parametrize("watchdog", ["1", "0"])
def test_dropped_async_operations_do_not_pile_up(n, watchdog):
    """2,000 async all_reduce whose Works are dropped, then one waited for and eight blocking ones: once they are
    complete one of those issues retires them (without a watchdog nothing else would): none outstanding, every array
    released, every operation completed once for the observers, the results right. At 1 rank, where each completes
    as it is issued, at most 8 are ever outstanding (the watchdog's round is 100 ms or more)."""
    for res in run_ranks(_fire_and_forget, n, _uid(), env={"PYCOLL_WATCHDOG": watchdog}, timeout=100):
        assert res["outstanding"] == 0 and res["arrays alive"] == 0, res
        assert res["completed"] == res["distinct"] == 2009, res
        assert res["last"] == [float(n)] * 4, res
        if n == 1:
            assert res["most outstanding"] <= EVERY, res


def _late_peer(rank, n, uid):
    c = pycoll.init(rank, n, unique_id=uid, backend="host", name="late peer", timeout=30)
    try:
        if rank == 1:
            time.sleep(1.0)
        xs = [np.full(2, float(rank + i), np.float32) for i in range(3 * EVERY)]
        t0 = time.monotonic()
        works = [c.all_reduce(x, async_op=True) for x in xs]
        issued = time.monotonic() - t0
        outstanding = len(c.outstanding())
        for w in works:
            w.wait()
        return {"issued s": issued, "outstanding after issue": outstanding,
                "right": all(x.tolist() == [1.0 + 2 * i] * 2 for i, x in enumerate(xs)),
                "left": len(c.outstanding())}
    finally:
        c.destroy()


def test_an_incomplete_oldest_operation_stops_the_retiring_without_a_wait():
    """Rank 0 issues 24 async all_reduce while rank 1 sleeps 1 s: none can complete, and issuing them waits for
    none (the oldest is refreshed, found incomplete, left, three times); once rank 1 comes every result is right."""
    res = run_ranks(_late_peer, 2, _uid(), timeout=100)
    assert res[0]["issued s"] < 0.5 and res[0]["outstanding after issue"] >= 3 * EVERY - 2, res
    assert all(r["right"] and r["left"] == 0 for r in res), res


def _peer_dies(rank, n, uid):
    c = pycoll.init(rank, n, unique_id=uid, backend="host", name="peer dies", timeout=20)
    x = np.ones(2, np.float32)
    c.all_reduce(x)
    if rank == 1:
        for _ in range(3):
            c.all_reduce(x, async_op=True)
        time.sleep(0.2)
        os._exit(0)  # gone with operations of rank 0 still to come
    t0 = time.monotonic()
    try:
        for _ in range(200):  # dropped: only the issuing path and the watchdog look at them
            c.all_reduce(np.ones(2, np.float32), async_op=True)
            time.sleep(0.01)
        raised = None
    except pycoll.CommFailure as e:
        raised = type(e).__name__
    return {"raised": raised, "after s": time.monotonic() - t0, "state": c.state}


def test_a_dead_peer_is_raised_by_the_next_issue():
    """Rank 1 exits with rank 0's dropped operations outstanding: rank 0's issuing, which refreshes the oldest of
    them, raises a CommFailure within the 2 s the loop takes at most (no hang, no silent pile-up)."""
    res = run_ranks(_peer_dies, 2, _uid(), may_die=[1], timeout=100)
    r = res[0]
    assert r["raised"] is not None and r["after s"] < 10, r


def _a_few_dropped(rank, n, uid):
    c = pycoll.init(rank, n, unique_id=uid, backend="host", name="a few")
    try:
        for _ in range(3):
            c.all_reduce(np.ones(2, np.float32), async_op=True)
        before = len(c.outstanding())
        for _ in range(EVERY):
            c.all_reduce(np.ones(2, np.float32))
        return before, len(c.outstanding())
    finally:
        c.destroy()


def test_a_few_dropped_operations_are_retired_too():
    """Without a watchdog, three dropped async operations (complete at once at 1 rank) are retired within the next
    eight issues: however few there are, none stays."""
    (res,) = run_ranks(_a_few_dropped, 1, _uid(), env={"PYCOLL_WATCHDOG": "0"}, timeout=60)
    assert res == (3, 0), res


# -- the list itself (pycoll._core.Outstanding: a list through the Works, a communicator's ``_pending``) -------------


def _works(k):
    from pycoll import _core

    return [_core.Work.__new__(_core.Work) for _ in range(k)]


def test_the_outstanding_list_keeps_issue_order_through_removals():
    from pycoll import _core

    out, other = _core.Outstanding(), _core.Outstanding()
    a, b, c, d = _works(4)
    assert not out and len(out) == 0 and list(out) == []
    for w in (a, b, c):
        out.append(w)
    assert len(out) == 3 and out and list(out) == [a, b, c] and b in out and d not in out and "b" not in out
    assert out.pop(b) is None and list(out) == [a, c] and b not in out
    assert out.pop(b, "absent") == "absent"  # a dict's pop of a missing key
    out.append(d)
    out.append(b)  # taken out, it may come back: the newest
    assert list(out) == [a, c, d, b]
    assert out.pop(a) is None and out.pop(b) is None and list(out) == [c, d]  # the oldest and the newest
    with pytest.raises(RuntimeError, match="outstanding already"):
        out.append(c)
    with pytest.raises(RuntimeError, match="outstanding already"):
        other.append(c)  # one list at most
    assert other.pop(c, "absent") == "absent" and list(out) == [c, d]  # another list's pop leaves it
    snapshot = iter(out)
    out.pop(c)
    assert list(snapshot) == [c, d]  # iterating gives the list as it was
    out.clear()
    assert list(out) == [] and not out and d not in out
    other.append(d)  # out of the cleared list, free for another
    assert list(other) == [d]


def test_a_long_outstanding_list_goes_without_recursion():
    """Each Work holds the next: dropping or clearing a list of 200,000 unlinks them one at a time (a recursive
    release would overflow the C stack), and its Works are free for another list."""
    from pycoll import _core

    works = _works(200_000)
    for drop in (True, False):
        out = _core.Outstanding()
        for w in works:
            out.append(w)
        assert len(out) == len(works)
        if drop:
            del out
            gc.collect()
        else:
            out.clear()
        again = _core.Outstanding()
        again.append(works[0])
        again.append(works[-1])
        assert list(again) == [works[0], works[-1]]
        again.clear()
    head = _core.Outstanding()
    for w in _works(200_000):  # the list holds the only references
        head.append(w)
    del head
    gc.collect()


def test_a_works_times_read_none_until_set_and_a_zero_duration_stays_zero():
    """time_started_ns, time_completed_ns and duration_ms are C values behind properties: None until set (or set to
    None), what was set after; a duration of 0.0 ms is a duration, not None."""
    (w,) = _works(1)
    assert (w.time_started_ns, w.time_completed_ns, w.duration_ms) == (None, None, None)
    w.time_started_ns, w.time_completed_ns, w.duration_ms = 1_700_000_000_000_000_000, 1_700_000_000_000_001_000, 0.0
    assert (w.time_started_ns, w.time_completed_ns, w.duration_ms) == (
        1_700_000_000_000_000_000, 1_700_000_000_000_001_000, 0.0)
    w.time_started_ns = w.time_completed_ns = w.duration_ms = None
    assert (w.time_started_ns, w.time_completed_ns, w.duration_ms) == (None, None, None)


_CYCLE = """
import gc
from pycoll import _core
works = [_core.Work.__new__(_core.Work) for _ in range(200_000)]
out = _core.Outstanding()
for w in works:
    out.append(w)
works[-1].comm = out  # a cycle through the chain: out -> the first Work -> ... -> the last -> out
del works, w, out
gc.collect()
print("ok")
"""


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs a child with its own stack limit")
def test_a_cycle_through_a_long_outstanding_list_is_collected_without_recursion():
    """The collector breaks a cycle through the chain at whichever object it clears first, a Work among them (each
    holds the next): in a process with a 2 MiB stack, 200,000 Works in a cycle go without a recursion that would
    overflow it (a Work's release is iterative: Python's trashcan)."""
    import resource

    def small_stack():
        resource.setrlimit(resource.RLIMIT_STACK, (2 << 20, 2 << 20))

    res = subprocess.run([sys.executable, "-c", _CYCLE], preexec_fn=small_stack, capture_output=True, text=True,
                         timeout=100)
    assert (res.returncode, res.stdout.strip()) == (0, "ok"), res.stderr[-2000:]
