"""Misuse of a communicator on the host backend (findings 3-7 and 12 of the adversarial review).

Each test runs real ranks (helpers.mp) under a hard timeout; a rank's result is what it returns.
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading
import time

import numpy as np
import pytest
from helpers.mp import run_ranks

import pycoll
from pycoll import _bindings as B

pytestmark = pytest.mark.timeout(90)


def _uid() -> bytes:
    return bytes(B.load("host").get_unique_id())


def _comm(rank, n, uid, **kw):
    return pycoll.init(rank, n, unique_id=uid, backend="host", **kw)


# -- finding 3: one lock order ------------------------------------------------------------------------


def _three_threads(rank, n, uid):
    c = _comm(rank, n, uid, timeout=20.0)
    stop = threading.Event()
    works = [c.all_reduce(np.ones(4, np.float32), async_op=True) for _ in range(4)]

    def poll():
        while not stop.is_set():
            for w in works:
                w.is_completed()
            c.check()

    pollers = [threading.Thread(target=poll, daemon=True) for _ in range(2)]
    for p in pollers:
        p.start()
    for _ in range(200):
        c.all_reduce(np.ones(4, np.float32))
    for w in works:
        w.wait()
    stop.set()
    stuck = False
    for p in pollers:
        p.join(5.0)
        stuck |= p.is_alive()
    c.destroy()
    return stuck


def test_lock_order_under_three_threads():
    assert run_ranks(_three_threads, 2, _uid(), timeout=80) == [False, False]


# -- finding 4: concurrent use and fork ---------------------------------------------------------------


def _two_threads(rank, n, uid):
    c = _comm(rank, n, uid, timeout=10.0)
    errors = []
    barrier = threading.Barrier(2)

    def run(value):
        x, out = np.full(4, value, np.float32), np.zeros(4, np.float32)
        barrier.wait()
        try:
            for _ in range(200):
                c.all_reduce(x, out)
        except pycoll.CommStateError as e:
            errors.append(str(e))

    ts = [threading.Thread(target=run, args=(v,), name=f"user-{v}") for v in (1.0, 2.0)]
    for t in ts:
        t.start()
    for t in ts:
        t.join(30)
    if not c.closed:
        c.abort()  # the ranks refused different calls: no collective destroy
    return errors


def test_two_threads_on_one_communicator_get_a_clear_error():
    """Today two threads get each other's sums silently; NCCL forbids it, pycoll must say so."""
    for errors in run_ranks(_two_threads, 2, _uid(), timeout=80):
        assert errors, "the second thread was not refused"
        assert "'user-1.0'" in errors[0] and "'user-2.0'" in errors[0] and "one thread at a time" in errors[0]


def _in_thread(fn, name):
    out = []

    def run():
        try:
            out.append(fn())
        except pycoll.CommStateError as e:
            out.append(str(e))

    t = threading.Thread(target=run, name=name)
    t.start()
    t.join(30)
    return out[0]


def _handed_off(rank, n, uid):
    c = _comm(rank, n, uid, timeout=10.0)
    seen = []

    def total():
        x = np.full(2, rank + 1.0, np.float32)
        c.all_reduce(x)
        return x.tolist()

    seen.append(total())
    refused = _in_thread(total, "intruder")  # refused on both ranks alike: nothing was issued
    seen.append("'intruder'" in refused and "'MainThread'" in refused and "hand_off" in refused)
    seen.append(total())  # the communicator is unharmed
    refused = _in_thread(lambda: c.split(0), "splitter")  # named as itself (was: "entered all_gather")
    seen.append("'splitter' entered split while thread 'MainThread'" in refused)
    c.hand_off()
    seen.append(_in_thread(total, "successor"))
    try:
        total()  # "successor" has ended without handing it back
        seen.append("used")
    except pycoll.CommStateError as e:
        seen.append("'successor'" in str(e) and "'MainThread'" in str(e))
    c.hand_off()  # another thread may pass it on as well, where the program orders them
    seen.append(total())
    c.destroy()
    return seen


def test_a_communicator_passes_to_another_thread_only_when_handed_off():
    """A second thread is refused while the first has the communicator, and after it ended too (on
    another rank the two threads' calls may have run in the other order); hand_off() passes it on."""
    assert run_ranks(_handed_off, 2, _uid(), timeout=60) == [[[3.0, 3.0], True, [3.0, 3.0], True, [3.0, 3.0], True,
                                                              [3.0, 3.0]]] * 2


def _outcome(call, seen):
    """``call()``, and what came of it appended to ``seen``: "ran", or the CommStateError's text."""
    try:
        call()
        seen.append("ran")
    except pycoll.CommStateError as e:
        seen.append(str(e))


def test_a_thread_given_the_ended_owner_s_ident_is_refused_as_any_other():
    # CPython gives a thread started after another ended that thread's ident, which the operations compared: such a
    # thread passed as the owner where any other thread is refused
    comm = _comm(0, 1, _uid())
    try:
        owner = threading.Thread(target=comm.all_reduce, args=(np.ones(2, np.float32),), name="trainer")
        owner.start()
        owner.join()
        seen: list = []

        def use():
            seen.append(threading.get_ident() == owner.ident)
            _outcome(lambda: comm.all_reduce(np.ones(2, np.float32)), seen)

        # mostly the first one; in a process whose other threads (a previous test's, ending) start and end meanwhile,
        # one of them may take the ended thread's stack first (once in this stop's five full runs): tries are cheap
        for _ in range(200):
            later = threading.Thread(target=use, name="writer")
            later.start()
            later.join()
            if seen[-2]:
                break
        assert seen[-2], "no thread was given the ended thread's ident"
        assert ("thread 'writer' entered all_reduce while thread 'trainer' issued its operations so far and has not "
                "handed it off (it has ended)") in seen[-1], seen
        comm.hand_off()
        comm.all_reduce(np.ones(2, np.float32))
    finally:
        comm.destroy()


def test_destroy_after_a_foreign_thread_that_had_the_communicator_ended():
    # a thread _thread started is a _DummyThread to threading, alive for ever: destroy() stayed refused, saying the
    # thread had ended
    import _thread

    comm = _comm(0, 1, _uid())
    done = threading.Event()

    def work():
        comm.all_reduce(np.ones(2, np.float32))
        done.set()

    _thread.start_new_thread(work, ())
    assert done.wait(10)
    deadline = time.monotonic() + 5
    while comm._owner != pycoll.comm._ENDED_OWNER and time.monotonic() < deadline:  # its locals go as it ends
        time.sleep(0.01)
    try:
        comm.destroy()
        assert comm.state == "destroyed"
    finally:
        comm.abort()


def test_two_threads_after_a_hand_off_one_has_it(monkeypatch):
    # the owner was read, then written, unlocked: two threads that came together after a hand_off() both passed (a
    # slow thread switch between the two, here made certain by a slow current_thread())
    comm = _comm(0, 1, _uid())
    real = threading.current_thread

    def slow():
        t = real()
        if t.name.startswith("taker"):
            time.sleep(0.2)
        return t

    try:
        comm.all_reduce(np.ones(2, np.float32))
        comm.hand_off()
        monkeypatch.setattr(threading, "current_thread", slow)
        seen: list = []
        takers = [threading.Thread(target=_outcome, args=(lambda: comm.all_reduce(np.ones(2, np.float32)), seen),
                                   name=f"taker{i}") for i in range(2)]
        for t in takers:
            t.start()
        for t in takers:
            t.join(10)
        monkeypatch.undo()
        assert len(seen) == 2 and seen.count("ran") == 1, seen
        assert "has not handed it off" in next(x for x in seen if x != "ran"), seen
    finally:
        monkeypatch.undo()
        comm.abort()


def test_finalize_and_register_window_from_a_thread_that_has_not_the_communicator_are_refused():
    # they are collective and ordered with the operations, as destroy() (refused): they went to the library, which
    # met them with another rank's all_reduce and failed both communicators (a shrink, a grow too)
    comm = _comm(0, 1, _uid())
    try:
        comm.all_reduce(np.ones(2, np.float32))
        seen: list = []
        for what, call in (("register_window", lambda: comm.register_window(comm.mem_alloc(64))),
                           ("shrink", lambda: comm.shrink([0])), ("grow", lambda: comm.grow(2)),
                           ("finalize", comm.finalize)):
            t = threading.Thread(target=_outcome, args=(call, seen), name="other")
            t.start()
            t.join(10)
            assert f"thread 'other' entered {what} while thread 'MainThread'" in seen[-1], seen
        comm.all_reduce(np.ones(2, np.float32))
        comm.register_window(comm.mem_alloc(64)).close()
    finally:
        comm.destroy()


def _hand_off_mid_operation(rank, n, uid):
    c = _comm(rank, n, uid, timeout=20.0)
    if rank == 1:
        time.sleep(1.0)
        c.all_reduce(np.ones(2, np.float32))
        c.destroy()
        return None
    t = threading.Thread(target=c.all_reduce, args=(np.ones(2, np.float32),), name="worker")
    t.start()
    while c.busy_thread is None and t.is_alive():
        time.sleep(0.01)
    try:
        c.hand_off()
        seen = "handed off"
    except pycoll.CommStateError as e:
        seen = str(e)
    t.join(15)
    c.hand_off()  # "worker" ended: the main thread may take it over now
    c.destroy()
    return "'worker'" in seen and "inside an operation" in seen


def test_hand_off_is_refused_while_another_thread_is_inside_an_operation():
    assert run_ranks(_hand_off_mid_operation, 2, _uid(), timeout=60)[0] is True


def _hand_off_in_group(rank, n, uid):
    c = _comm(rank, n, uid, timeout=10.0)
    x = np.ones(2, np.float32)
    refused = []
    with c.group():
        c.all_reduce(x)  # issued as the group ends: another thread's operations would overtake it on some ranks
        for hand_off in (c.hand_off, lambda: _in_thread(c.hand_off, "helper")):
            try:
                refused.append(hand_off() or "handed off")
            except pycoll.CommStateError as e:
                refused.append(str(e))
    c.hand_off()  # the group has ended: its operation was issued
    done = _in_thread(lambda: c.all_reduce(x).state, "successor")
    c.hand_off()
    c.destroy()
    return [("waits in a group()" in r and "'MainThread'" in r) for r in refused], done, x.tolist()


def test_hand_off_is_refused_while_operations_of_the_communicator_wait_in_an_open_group():
    assert run_ranks(_hand_off_in_group, 1, _uid(), timeout=60) == [([True, True], "completed", [1.0, 1.0])]


def _in_forked_child(*calls):
    """Each call made in a forked child, as 'returned', 'refused' (a CommStateError naming the fork) or 'other'."""
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        try:
            seen = []
            for call in calls:
                try:
                    call()
                    seen.append("returned")
                except pycoll.CommStateError as e:
                    seen.append("refused" if "fork" in str(e) else "other")
            os.write(w, " ".join(seen).encode())
        finally:
            os._exit(0)
    os.close(w)
    seen = os.read(r, 64).decode()
    os.waitpid(pid, 0)
    os.close(r)
    return seen


def _forked(rank, n, uid):
    c = _comm(rank, n, uid, timeout=10.0)
    seen = _in_forked_child(lambda: c.all_reduce(np.ones(2, np.float32)))
    x = np.ones(2, np.float32)
    c.all_reduce(x)  # the parent's communicator is unharmed
    c.destroy()
    return seen, x.tolist()


def test_a_forked_child_cannot_use_the_parents_communicator():
    assert run_ranks(_forked, 2, _uid(), timeout=60) == [("refused", [2.0, 2.0])] * 2


def _abort_race(rank, n, uid):
    """A worker thread issues operations back to back; another thread aborts the communicator at a random moment."""
    import random

    seen = {}
    for _ in range(80):
        c = _comm(rank, n, uid=pycoll.get_unique_id(backend="host"))
        c.all_reduce(np.ones(1, np.float32))
        c.hand_off()

        def work(c=c):
            x = np.ones(64, np.float32)
            try:
                while True:
                    ws = [c.all_reduce(x, async_op=True) for _ in range(4)]
                    c.all_reduce(x)
                    for w in ws:
                        w.wait()
            except Exception as e:  # what the worker got is the result
                seen[type(e).__name__] = seen.get(type(e).__name__, 0) + 1

        t = threading.Thread(target=work)
        t.start()
        time.sleep(random.uniform(0.0005, 0.01))
        c.abort()
        t.join(20)
        assert not t.is_alive()
    return seen


@pytest.mark.timeout(120)
def test_an_abort_from_another_thread_fails_the_operations_with_comm_aborted():
    # the worker got AssertionError (no handle) or InvalidArgument (a stream the abort had freed) in 1 of 10
    assert run_ranks(_abort_race, 1, _uid(), timeout=100) == [{"CommAborted": 80}]


def _destroy_from_another_thread(rank, n, uid):
    c = _comm(rank, n, uid)
    x = np.ones(2, np.float32)
    c.all_reduce(x)  # the main thread has it
    out = []

    def destroy():
        try:
            c.destroy()
            out.append("destroyed")
        except pycoll.CommStateError as e:
            out.append("refused" if "abort() may be called from any thread" in str(e) else str(e))

    for _ in range(2):
        t = threading.Thread(target=destroy)
        t.start()
        t.join(20)
        if out[-1] != "refused":
            break
        c.all_reduce(x)  # still the main thread's, and usable
        c.hand_off()  # now the next thread may destroy it
    return out, c.state


def test_destroy_from_a_thread_that_has_not_the_communicator_is_refused():
    # a collective ordered with the operations: another thread's destroy ran while the main thread was inside one
    # (its operation then hung past its deadline on freed resources)
    assert run_ranks(_destroy_from_another_thread, 1, _uid(), timeout=60) == [(["refused", "destroyed"], "destroyed")]


def _forked_wait(rank, n, uid):
    c = _comm(rank, n, uid, timeout=10.0)
    x = np.ones(2, np.float32)
    if rank == 1:
        time.sleep(1.0)  # rank 0's operation is outstanding across its fork
        c.all_reduce(x)
        c.destroy()
        return x.tolist()
    w = c.all_reduce(x, async_op=True)
    seen = _in_forked_child(w.is_completed, w.wait)  # the parent's operation: not the child's to wait for
    w.wait()  # the parent's is unharmed
    c.destroy()
    return seen, x.tolist()


@pytest.mark.timeout(60)
def test_a_forked_child_cannot_wait_for_the_parents_operation():
    # it hung past the operation's deadline (wait) or reported it completed (wait(timeout), is_completed)
    assert run_ranks(_forked_wait, 2, _uid(), timeout=60) == [("refused refused", [2.0, 2.0]), [2.0, 2.0]]


# -- finding 5: no interval delays a timeout ----------------------------------------------------------


def _slow_interval(rank, n, uid):
    pycoll.watchdog.configure(interval=5.0)
    c = _comm(rank, n, uid, timeout=1.0)
    if rank == 1:
        time.sleep(4.0)  # never joins the all_reduce in time
        c.abort()
        return None
    t0 = time.monotonic()
    try:
        c.all_reduce(np.ones(2, np.float32))
    except pycoll.CommTimeout:
        return time.monotonic() - t0
    return -1.0


def test_a_long_watchdog_interval_does_not_delay_a_timeout():
    took = run_ranks(_slow_interval, 2, _uid(), timeout=60)[0]
    assert 0.9 < took < 2.5, took


def test_infinite_settings_are_refused_with_their_name(monkeypatch):
    for name in ("PYCOLL_WATCHDOG_INTERVAL", "PYCOLL_TIMEOUT", "PYCOLL_INIT_TIMEOUT"):
        monkeypatch.setenv(name, "inf")
        with pytest.raises(ValueError, match=rf"\${name} must be a finite number of seconds"):
            pycoll._settings.get(name)
        monkeypatch.delenv(name)
    with pytest.raises(ValueError, match="finite"):
        pycoll.init(0, 1, backend="host", timeout=float("inf"))


# -- finding 6: Ctrl-C inside a blocking collective ---------------------------------------------------


def _interrupted(rank, n, uid, policy):
    c = _comm(rank, n, uid, timeout=20.0, on_failure=policy)
    if rank == 1:
        time.sleep(3.0)  # rank 0 waits in its all_reduce meanwhile
        failed = c.failure is not None
        c.abort()
        return failed
    threading.Timer(0.5, os.kill, (os.getpid(), signal.SIGINT)).start()
    t0 = time.monotonic()
    try:
        c.all_reduce(np.ones(2, np.float32))
    except KeyboardInterrupt:
        took = time.monotonic() - t0 - 0.5
        return took, c.failure is not None
    return None


@pytest.mark.parametrize("policy", [pytest.param("abort", marks=pytest.mark.slow), "report"])
def test_ctrl_c_raises_within_100_ms_and_fails_the_communicator(policy):
    """Also under "report", where no abort releases a thread inside the library: the host library hands an
    operation a caller's thread has run for PYCOLL_HOST_INLINE_NS (10 ms) to the stream's thread."""
    res = run_ranks(_interrupted, 2, _uid(), policy, timeout=60)
    took, failed = res[0]
    assert took < 0.1 + 0.05 and failed, res  # 50 ms of slack for a loaded machine


def _interrupted_at_once(rank, n, uid, where):
    from pycoll.diagnostics.recorder import get_recorder

    c = _comm(rank, n, uid, timeout=20.0)
    if rank == 1:
        time.sleep(0.6)  # rank 0 waits for its all_reduce meanwhile
        c.abort()
        return None
    threading.Timer(0.3, os.kill, (os.getpid(), signal.SIGINT)).start()
    t0 = time.monotonic()
    try:
        if where == "group":
            with c.group():
                c.all_reduce(np.ones(2, np.float32))  # blocking: waited for as the group ends
        else:
            c.all_reduce(np.ones(2, np.float32))
    except KeyboardInterrupt:
        # read at once: the failure's handling (the watchdog's thread may do it: SIGINT wakes it) is over
        return (time.monotonic() - t0 - 0.3, c.state, repr(c.failure), [repr(w) for w in c.outstanding()],
                get_recorder().unfinished())
    return None


@pytest.mark.parametrize("where", ["group", "blocking"])
def test_ctrl_c_raises_with_the_communicator_aborted_and_closed(where):
    """KeyboardInterrupt comes once the policy has acted, as any failed operation's error: the communicator aborted
    and closed, nothing outstanding (an exit then writes no dump over the failure's; a destroy() right after
    returned while the watchdog's thread was still aborting it). The blocking operations of a group are waited for
    as the group ends: Ctrl-C there is Ctrl-C inside a blocking operation too (it left the communicator active, the
    operation outstanding and the peers waiting until their timeout)."""
    took, state, failure, outstanding, unfinished = run_ranks(_interrupted_at_once, 2, _uid(), where, timeout=60)[0]
    assert took < 0.1 + 0.05 and state == "aborted" and "interrupted (SIGINT)" in failure, (took, state, failure)
    assert outstanding == [] and unfinished == []


def _killed_while_interrupted(rank, n, uid, trace):
    if rank == 0:
        pycoll.failpoints.configure(f"comm.interrupted.before_wait=kill;trace={trace}")
        threading.Timer(0.3, os.kill, (os.getpid(), signal.SIGINT)).start()
    c = _comm(rank, n, uid, timeout=20.0)
    t0 = time.monotonic()
    try:
        c.recv(np.ones(2, np.float32), 1 - rank)  # neither sends: both wait, rank 1 until rank 0 fails or is gone
    except pycoll.CommFailure as e:
        took = time.monotonic() - t0
        # rank 0 reaches its failpoint right after the failure is recorded, which may be after this rank heard of it:
        # alive until it has (a rank still running when this one returns is killed by run_ranks, no SIGKILL of its own)
        deadline = time.monotonic() + 10.0
        while not os.path.exists(trace) and time.monotonic() < deadline:
            time.sleep(0.01)
        time.sleep(0.3)
        return type(e).__name__, took
    return None


def test_a_rank_killed_while_its_ctrl_c_is_handled_fails_the_peers_operation_at_once(tmp_path):
    """The wait for the policy to act after Ctrl-C (failpoint comm.interrupted.before_wait): a rank that dies there
    leaves its peer's operation failing at once, not at its 20 s timeout."""
    trace = str(tmp_path / "fired")
    res = run_ranks(_killed_while_interrupted, 2, _uid(), trace, timeout=60, may_die=[0])
    with open(trace) as f:
        assert f.read().startswith("comm.interrupted.before_wait kill")
    # killed there (the trace says so); its exit code None where run_ranks still saw it running as rank 1 returned:
    # a SIGKILLed process's threads take a while to end, and it is reaped only then (even once it shows as a zombie)
    assert res[0].exitcode in (None, -signal.SIGKILL), res
    kind, took = res[1]
    assert kind in ("RemoteError", "PeerFailure") and took < 2.0, res


# -- finding 7: abort or revoke from another thread ---------------------------------------------------


def _with_an_idle_peer(rank, n, uid):
    """A communicator ("report" policy) for rank 0; rank 1 never joins rank 0's operation: it waits 2 s, aborts its
    communicator and gets None."""
    c = _comm(rank, n, uid, timeout=20.0, on_failure="report")
    if rank == 1:
        time.sleep(2.0)
        c.abort()
        return None
    return c


def _aborted_meanwhile(rank, n, uid, how, failpoint=None):
    """Rank 0's blocking all_reduce waits for rank 1 (which never calls it) while another thread aborts or
    revokes; returns what the all_reduce did and what the other thread's call did."""
    c = _with_an_idle_peer(rank, n, uid)
    if c is None:
        return None
    if failpoint:
        pycoll.failpoints.configure(failpoint, rank=0)
    other: dict = {}

    def act():
        try:
            getattr(c, how)()
            other["result"] = "returned"
        except BaseException as e:  # whatever it was, for the assertion
            other["result"] = repr(e)

    t = threading.Timer(0.3, act)
    t.start()
    try:
        c.all_reduce(np.ones(2, np.float32))
    except pycoll.CommFailure as e:
        result = type(e).__name__
    else:
        result = "completed"
    c.abort()  # with the failpoint: while the other thread sleeps there
    t.join(10)
    return result, other.get("result")


@pytest.mark.parametrize("how,expected", [("abort", "CommAborted"), ("revoke", "CommRevoked")])
def test_abort_or_revoke_from_another_thread_is_a_comm_failure(how, expected):
    assert run_ranks(_aborted_meanwhile, 2, _uid(), how, timeout=60)[0] == (expected, "returned")


def test_a_revoke_racing_a_blocking_call_fails_it_and_an_abort_meanwhile_ends_the_revoke():
    """The operation a revoke cut off never reports success (the library's asynchronous error is ncclSuccess again
    once the revoke has finished, so the works must be failed before the library is told), and a revoke whose
    communicator another thread aborts meanwhile (while it stops at comm.revoke.revoked, after the library
    revoked, before its wait) returns instead of asserting on the freed handle."""
    res = run_ranks(_aborted_meanwhile, 2, _uid(), "revoke", "comm.revoke.revoked=sleep(700)", timeout=60)
    assert res[0] == ("CommRevoked", "returned")


def _shrunk_with_abort_ops(rank, n, uid):
    c = _with_an_idle_peer(rank, n, uid)
    if c is None:
        return None
    w = c.all_reduce(np.ones(2, np.float32), async_op=True)
    time.sleep(0.3)
    child = c.shrink([1], abort_ops=True)
    try:
        w.wait(5.0)
        result = "completed"
    except pycoll.CommFailure as e:
        result = f"{type(e).__name__}: {e}"
    child.destroy()
    c.abort()
    return result


def test_an_operation_an_abortive_shrink_stopped_fails():
    """Without the parent's works failed first, the stopped all_reduce was reported completed (its output never
    reduced): the library's end event is complete and its asynchronous error ncclSuccess once it stopped it."""
    res = run_ranks(_shrunk_with_abort_ops, 2, _uid(), timeout=60)[0]
    assert res.startswith("CommAborted") and "stopped by shrink(abort_ops=True)" in res, res


# -- finding 12 (communicator items) ------------------------------------------------------------------


def _broadcast_readonly(rank, n, uid):
    c = _comm(rank, n, uid)
    x = np.arange(4, dtype=np.float32) if rank == 0 else np.zeros(4, np.float32)
    if rank == 0:
        x.setflags(write=False)  # the root only reads
    c.broadcast(x, root=0)
    c.destroy()
    return x.tolist()


def test_broadcast_root_may_pass_a_read_only_array():
    assert run_ranks(_broadcast_readonly, 2, _uid(), timeout=60) == [[0.0, 1.0, 2.0, 3.0]] * 2


def _reduce_readonly(rank, n, uid):
    c = _comm(rank, n, uid)
    x = np.full(4, float(rank + 1), np.float32)
    out = np.zeros(4, np.float32)
    if rank == 1:
        out.setflags(write=False)  # not the root: its output is never written
    c.reduce(x, root=0, output=out)
    try:
        if rank == 0:
            out.setflags(write=False)
            c.reduce(x, root=0, output=out)  # the root's is
    except ValueError as e:
        return out.tolist(), str(e)
    finally:
        c.destroy()
    return out.tolist(), ""


def test_reduce_takes_a_read_only_output_where_it_writes_none():
    (out0, err0), (out1, err1) = run_ranks(_reduce_readonly, 2, _uid(), timeout=60)
    assert out0 == [3.0] * 4 and out1 == [0.0] * 4 and err1 == ""
    assert "output: the array is read-only but the operation writes into it" in err0, err0


def _p2p_dtype(rank, n, uid):
    c = _comm(rank, n, uid, timeout=5.0)
    try:
        if rank == 0:
            c.send(np.ones(4, np.float32), 1)
        else:
            c.recv(np.zeros(4, np.int32), 0)  # the same bytes, another datatype
    except pycoll.CommFailure as e:
        return str(e)
    finally:
        c.abort()
    return "ok"


def test_point_to_point_datatype_mismatch_is_refused():
    res = run_ranks(_p2p_dtype, 2, _uid(), timeout=60)
    assert "datatype mismatch" in res[1], res


def test_premulsum_scalar_the_datatype_cannot_hold_is_refused():
    c = pycoll.init(0, 1, backend="host")
    try:
        with pytest.raises(ValueError, match="not an integer"):
            c.pre_mul_sum(2.5, "int32")
        with pytest.raises(ValueError, match="out of range"):
            c.pre_mul_sum(300, "uint8")
        c.pre_mul_sum(2, "int32").destroy()
        with pytest.raises(ValueError, match=r"the scalar \(an integer of 1329 bits\) is too large"):
            c.pre_mul_sum(10 ** 400, "float32")  # a bare OverflowError
        with pytest.raises(ValueError, match=r"the scalar \(an integer of 16610 bits\) is too large"):
            c.pre_mul_sum(10 ** 5000, "float32")  # past the digits CPython converts to text
        for text in (np.str_("2.5"), np.bytes_(b"3")):  # numpy's strings are no numbers (a str is refused too)
            with pytest.raises(TypeError):
                c.pre_mul_sum(text, "float32")
        for bad in (True, np.bool_(True), 1j, np.complex64(1)):
            with pytest.raises(TypeError, match="the scalar must be a real number"):
                c.pre_mul_sum(bad, "float32")
    finally:
        c.destroy()


def test_a_numpy_or_ml_dtypes_scalar_is_a_premulsum_number():
    # numpy's scalars were taken for device arrays, which must be of the operation's dtype (np.float32(0.5) for a
    # float64 sum was refused as "the scalar array"), ml_dtypes' refused as no array at all
    ml_dtypes = pytest.importorskip("ml_dtypes")
    c = pycoll.init(0, 1, backend="host")
    try:
        for scalar, dtype in ((np.float32(0.5), np.float64), (np.int64(3), np.int32), (np.uint8(3), np.int64),
                              (ml_dtypes.bfloat16(0.5), ml_dtypes.bfloat16), (np.float16(0.5), np.float32)):
            x = np.full(3, 4, dtype)
            c.all_reduce(x, op=c.pre_mul_sum(scalar, dtype))
            assert x.astype(np.float64).tolist() == [4.0 * float(scalar)] * 3, (scalar, dtype, x)
        with pytest.raises(ValueError, match="not an integer"):
            c.pre_mul_sum(np.float32(0.5), "int32")
    finally:
        c.destroy()


@pytest.mark.parametrize("bad, exc, text", [
    (-1.0, ValueError, ">= 0 seconds"), (float("nan"), ValueError, "a finite number of seconds"),
    (-float("inf"), ValueError, "a finite number of seconds"), (float("inf"), ValueError, "a finite number of seconds"),
    ("1", TypeError, "a number of seconds, got str"), (True, TypeError, "a number of seconds, got bool")],
    ids=["negative", "nan", "-inf", "inf", "str", "bool"])
def test_a_wait_with_a_bad_timeout_is_refused_and_the_operation_stays_waitable(bad, exc, text):
    c = pycoll.init(0, 1, backend="host")
    try:
        x = np.ones(4, np.float32)
        w = c.all_reduce(x, async_op=True)
        with pytest.raises(exc, match=f"timeout must be {text}"):
            w.wait(timeout=bad)
        w.wait(timeout=np.float32(10))  # any real number
        assert w.is_completed() and x.tolist() == [1.0] * 4
    finally:
        c.destroy()


def _destroy_fails(rank, n, uid):
    c = _comm(rank, n, uid, timeout=2.0)
    if rank == 1:
        os._exit(0)  # gone before the collective destroy
    time.sleep(0.5)
    try:
        c.destroy()
    except pycoll.CommFailure:
        pass
    return c.state, c.closed


def test_a_failed_destroy_still_releases_the_communicator():
    res = run_ranks(_destroy_fails, 2, _uid(), timeout=60, may_die=[1])
    assert res[0] == ("aborted", True), res


def _destroy_with_a_late_peer(rank, n, uid):
    c = _comm(rank, n, uid, timeout=30.0)
    if rank == 1:  # joins the three operations 0.6 s apart, then leaves without destroying
        with contextlib.suppress(pycoll.CommFailure):  # rank 0 gives up before the second
            for _ in range(3):
                time.sleep(0.6)
                c.all_reduce(np.ones(1))
        return None
    works = [c.all_reduce(np.ones(1), async_op=True) for _ in range(3)]
    t0 = time.monotonic()
    try:
        c.destroy(timeout=1.0)
    except pycoll.CommTimeout as e:
        return "CommTimeout", str(e), time.monotonic() - t0, c.state, works[0].is_completed()
    return "returned", "", time.monotonic() - t0, c.state, None


def test_destroy_times_out_as_a_comm_timeout_within_its_own_timeout():
    """destroy(timeout) with operations the peer joins late: one CommTimeout, after about the timeout of the whole
    call (not the timeout per operation, then again for the finalize), the communicator aborted."""
    kind, msg, took, state, first_done = run_ranks(_destroy_with_a_late_peer, 2, _uid(), timeout=60)[0]
    assert kind == "CommTimeout" and state == "aborted", (kind, msg, state)
    assert "destroy timed out after 1 s waiting for its outstanding operations" in msg and "aborted" in msg, msg
    assert 0.9 <= took < 1.6, took
    assert first_done  # the first operation completed within the call's second


def test_a_huge_flight_recorder_buffer_is_a_clear_error():
    from pycoll.diagnostics.recorder import FlightRecorder

    with pytest.raises(ValueError, match=r"buffer_size must be an int in \[0, "):
        FlightRecorder(10**12)
