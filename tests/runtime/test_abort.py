"""Aborts that cannot hang the process: several communicators at once, a deadline, a thread inside a call."""

from __future__ import annotations

import os
import signal
import threading
import time

import numpy as np
import pytest
from helpers.fake_gpu import FakeGpuRuntime
from helpers.fake_nccl import Fake
from helpers.mp import run_ranks

import pycoll
from pycoll import _bindings as B
from pycoll.comm import Communicator
from pycoll.devices import CudaDevice
from pycoll.diagnostics.records import proc_prefix

pytestmark = pytest.mark.timeout(90)


def _two_hung_comms(rank, n, uid_a, uid_b):
    a = pycoll.init(rank, n, unique_id=uid_a, backend="host", name="a", timeout=30.0, on_failure="report")
    b = pycoll.init(rank, n, unique_id=uid_b, backend="host", name="b", timeout=30.0, on_failure="report")
    if rank == 1:
        time.sleep(2.0)  # never joins: rank 0's operations on both hang
        pycoll.abort_all([a, b])
        return None
    wa = a.all_reduce(np.ones(2, np.float32), async_op=True)
    wb = b.all_reduce(np.ones(2, np.float32), async_op=True)
    t0 = time.monotonic()
    pycoll.abort_all([a, b, a])  # one group abort; a communicator named twice is fine
    took = time.monotonic() - t0
    failures = []
    for w in (wa, wb):
        try:
            w.wait(timeout=5.0)
        except pycoll.CommAborted:
            failures.append("aborted")
    return took, failures, a.state, b.state


def test_abort_all_aborts_several_communicators_together():
    lib = B.load("host")
    res = run_ranks(_two_hung_comms, 2, bytes(lib.get_unique_id()), bytes(lib.get_unique_id()), timeout=60)
    took, failures, sa, sb = res[0]
    assert took < 2.0 and failures == ["aborted", "aborted"] and sa == sb == "aborted"


def test_abort_all_refuses_what_is_no_communicator_before_it_touches_any():
    # the ones before the bad element were marked aborted without being aborted (their library handles lived on,
    # their peers waited out their timeouts), and a second abort did nothing
    comms = pycoll.init_all(2, backend="host")
    lib, handles = comms[0].library, [c.handle for c in comms]
    with pytest.raises(TypeError, match="abort_all: element 2 is not a Communicator: None"):
        pycoll.abort_all([*comms, None])
    assert [c.state for c in comms] == ["active", "active"]
    pycoll.abort_all(comms)
    assert [c.state for c in comms] == ["aborted", "aborted"]
    for h in handles:  # freed by the library: its handle is refused
        with pytest.raises(pycoll.NCCLError):
            lib.comm_count(h)


def test_abort_has_a_deadline_and_leaves_a_wedged_library_behind(fakes, caplog):
    f = Fake(fakes["nccl"])
    c = Communicator(0x1000, library=f.lib, device=CudaDevice(0, runtime=FakeGpuRuntime("cuda")), rank=0, size=2,
                     name="wedged", uid="feedbeef00000002", global_ranks=None, timeout=5.0)
    wedged = threading.Event()

    def stuck_abort(handle):
        wedged.wait(10.0)  # an NCCL that cannot abort
        return 0

    c.library = _Wedged(f.lib, stuck_abort)
    try:
        t0 = time.monotonic()
        pycoll.abort_all([c], timeout=0.3)
        assert time.monotonic() - t0 < 1.0 and c.state == "aborted" and c.closed
        assert any("did not return within 0.3 s" in r.getMessage() for r in caplog.records)
    finally:
        wedged.set()


class _Wedged:
    """A library whose ncclCommAbort never returns (until released); everything else is the fake's."""

    def __init__(self, lib, abort):
        self._lib, self.comm_abort = lib, abort

    def __getattr__(self, name):
        return getattr(self._lib, name)


def test_abort_while_another_thread_is_inside_an_enqueue(fakes):
    f = Fake(fakes["nccl"])
    c = Communicator(0x1000, library=f.lib, device=CudaDevice(0, runtime=FakeGpuRuntime("cuda")), rank=0, size=2,
                     name="busy", uid="feedbeef00000003", global_ranks=None, timeout=10.0)
    f.ctl.fakeSetDelayMs(1000)  # the enqueue takes a second
    from helpers.dlpack_fake import cai

    errors = []

    def enqueue():
        try:
            c.all_reduce(cai(shape=(4,), typestr="<f4", data=(0x7F0000001000, False)), async_op=True).wait()
        except pycoll.CommFailure as e:
            errors.append(type(e).__name__)

    t = threading.Thread(target=enqueue, daemon=True)
    t.start()
    time.sleep(0.2)
    t0 = time.monotonic()
    c.abort()  # must not wait for the enqueue: no per-communicator lock is taken
    took = time.monotonic() - t0
    f.ctl.fakeSetDelayMs(0)
    t.join(5.0)
    assert took < 3.0 and errors == ["CommAborted"], (took, errors)


def _stopped_peer(rank, n, uid, policy, async_op):
    import os
    import signal

    c = pycoll.init(rank, n, unique_id=uid, backend="host", timeout=3.0, on_failure=policy)
    # the thread that sees the deadline first (the watchdog's, usually) takes a while before its policy acts
    c.failure_callbacks.append(lambda comm, exc: time.sleep(0.3))
    x = np.ones(4, np.float32)
    c.all_reduce(x)
    if rank == 1:
        os.kill(os.getpid(), signal.SIGSTOP)  # stopped for good: rank 0's next operation waits for it
    t0 = time.monotonic()
    try:
        w = c.all_reduce(x, async_op=async_op)
        w.wait()
        out = "no error"
    except pycoll.PycollError as e:
        out = type(e).__name__
    took = time.monotonic() - t0
    state = c.state
    c.abort()
    return out, took, state


# every policy and both forms of the call in CI; the other three pairings under --runslow (3.4 s each)
@pytest.mark.parametrize("async_op,policy", [
    pytest.param(a, p, id=f"{'async' if a else 'blocking'}-{p}", marks=() if (a, p) in (
        (False, "abort"), (True, "revoke"), (False, "report")) else pytest.mark.slow)
    for a in (False, True) for p in ("abort", "revoke", "report")])
def test_an_operation_whose_peer_stopped_raises_at_its_deadline_under_every_policy(policy, async_op):
    """The deadline of a call holds whatever the policy (under "report" nothing aborts the communicator: the host
    library's caller's thread must come back by itself), and the error is raised once the policy has acted, also
    when another thread saw the deadline first."""
    uid = bytes(B.load("host").get_unique_id())
    res = run_ranks(_stopped_peer, 2, uid, policy, async_op, may_die=[1], timeout=60)
    out, took, state = res[0]
    assert out == "CommTimeout" and 2.5 < took < 20, res
    assert state == {"abort": "aborted", "revoke": "revoked", "report": "active"}[policy], res


def _aborted_in_a_collective(rank, n, uid):
    comm = pycoll.init(rank, n, backend="host", unique_id=uid, timeout=20.0)
    comm.all_reduce(np.ones(4))
    if rank == 1:
        aborter = threading.Timer(0.3, comm.abort)
        aborter.start()
        try:
            comm.all_reduce(np.ones(4))
        except pycoll.CommAborted:
            pass
        aborter.join(10)  # the abort has released the communicator: a dump after it
        e = [e for e in pycoll.flight_recorder.get_recorder().as_dict(0)["entries"]
             if e["process_group"][0] == comm.uid][-1]
        return e["collective_seq_id"], e["state"], e.get("pycoll_error", "")
    time.sleep(1.0)  # never calls the second
    comm.abort()
    return None


def test_an_operation_an_abort_stopped_is_recorded_as_failed_not_completed():
    # the flight recorder said 'completed' (no error, no completion time) of an all_reduce that an abort() from
    # another thread had stopped: its timeline drew a completed operation of 0 ms, pycoll-fr said it completed
    _, (seq, state, error) = run_ranks(_aborted_in_a_collective, 2, bytes(pycoll.get_unique_id(backend="host")))
    assert seq == 2 and state != "completed" and error.startswith("CommAborted: all_reduce #2"), (seq, state, error)


def test_an_abort_after_an_abort_or_a_destroy_tells_the_observers_nothing_again():
    # every abort() released the communicator again and told the observers comm_closed again (a cleanup path and an
    # atexit handler each aborting; the policy's abort, then the user's)
    from pycoll import hooks

    class Closed(hooks.CommObserver):
        def __init__(self):
            self.closed = []

        def comm_closed(self, comm):
            self.closed.append(comm.name)

    obs = Closed()
    hooks.add_observer(obs)
    try:
        for first in ("abort", "destroy"):
            c = pycoll.init(0, 1, backend="host", unique_id=pycoll.get_unique_id(backend="host"), name=first)
            getattr(c, first)()
            c.abort()
            pycoll.abort_all([c, c])
            assert obs.closed.count(first) == 1, obs.closed
    finally:
        hooks.remove_observer(obs)


@pytest.mark.timeout(30)
def test_an_abort_inside_an_abort_of_the_same_thread_does_not_wait_for_itself():
    # an observer closing a child when its parent closed, during abort_all([parent, child]): the child's abort waited
    # PYCOLL_ABORT_TIMEOUT (10 s) for the abort its own thread was in
    from pycoll import hooks

    parent = pycoll.init(0, 1, backend="host", unique_id=pycoll.get_unique_id(backend="host"), name="parent")
    child = parent.split(0, name="child")

    class CloseChild(hooks.CommObserver):
        def comm_closed(self, comm):
            if comm is parent:
                child.abort()

    obs = CloseChild()
    hooks.add_observer(obs)
    try:
        t0 = time.monotonic()
        pycoll.abort_all([parent, child])
        assert time.monotonic() - t0 < 5 and child.closed
    finally:
        hooks.remove_observer(obs)


def _aborted_in_an_open_group(rank, n, uid, aborted_first):
    comm = pycoll.init(rank, n, unique_id=uid, backend="host", name="world", timeout=5.0)
    a, b = comm.split(0, name="a"), comm.split(0, name="b")
    with a.group():  # one group over both communicators: the library runs it on its first operation's stream
        if aborted_first:
            wa = a.all_reduce(np.ones(4), async_op=True)
            wb = b.all_reduce(np.ones(4), async_op=True)
        else:
            wb = b.all_reduce(np.ones(4), async_op=True)
            wa = a.all_reduce(np.ones(4), async_op=True)
        t = threading.Thread(target=a.abort)  # another thread (a health check...) gives up on a while the group is open
        t.start()
        t.join()
    out = {}
    try:
        wa.wait(timeout=5.0)
        out["a"] = "completed"
    except Exception as e:
        out["a"] = type(e).__name__
    try:
        wb.wait(timeout=5.0)
        out["b"] = "completed"
    except Exception as e:
        out["b"] = type(e).__name__
    t = threading.Thread(target=b.abort, daemon=True)
    t0 = time.monotonic()
    t.start()
    t.join(10.0)
    out["b.abort"] = "stuck" if t.is_alive() else "returned"
    out["took"] = time.monotonic() - t0
    if not t.is_alive():
        x = np.ones(2)
        comm.all_reduce(x)
        out["world"] = float(x[0])
        comm.destroy()
    return out


@pytest.mark.timeout(60, method="thread")
@pytest.mark.parametrize("aborted_first", [True, False])
def test_an_abort_from_another_thread_while_a_group_of_two_communicators_is_open(aborted_first):
    # a group of a's and b's operations runs as one list on its first operation's stream: a's, which a.abort()
    # destroyed before the group ended. b's operation never ran, and b.abort() then waited for ever in the destroy of
    # b's stream (joined after a's); with the watchdog, its thread too
    uid = bytes(B.load("host").get_unique_id())
    res = run_ranks(_aborted_in_an_open_group, 2, uid, aborted_first, timeout=30, hard_exit=True)
    for out in res:
        assert out["a"] in ("CommAborted", "RemoteError") and out["b"] == "completed", out
        assert out["b.abort"] == "returned" and out["took"] < 5, out
        assert out["world"] == 2.0, out


def _one_of_a_groups_communicators_given_up(rank, n, uid, how):
    """A blocking group over ``weights`` and ``ctrl``; rank 1 arrives 6 s late (alive). On rank 0 ``weights`` is
    given up 1 s in: aborted from another thread, or its operation's own 1 s timeout (the policy aborts)."""
    comm = pycoll.init(rank, n, unique_id=uid, backend="host", name="world", timeout=30.0)
    weights, ctrl = comm.split(0, name="weights"), comm.split(0, name="ctrl")
    x, y = np.ones(4, np.float32), np.ones(4, np.float32)
    out = {}
    if rank == 1:
        time.sleep(6.0)
    aborter = None
    if rank == 0 and how == "abort":
        def abort():
            time.sleep(1.0)
            t = time.monotonic()
            weights.abort()
            out["abort took"] = time.monotonic() - t

        aborter = threading.Thread(target=abort)
        aborter.start()
    t0 = time.monotonic()
    try:
        with weights.group():
            weights.all_reduce(x, timeout=1.0 if rank == 0 and how == "timeout" else None)
            ctrl.all_reduce(y)
        out["group"] = "completed"
    except pycoll.CommFailure as e:
        out["group"] = type(e).__name__
    out["group took"] = time.monotonic() - t0
    if aborter is not None:
        aborter.join()
    z = np.ones(2)
    ctrl.all_reduce(z)  # ctrl's operation of the group ran on (its peer came late): ctrl is as good as ever
    out["y"], out["z"] = y.tolist(), z.tolist()
    ctrl.destroy()
    comm.destroy()
    return out


@pytest.mark.parametrize("how", ["abort", "timeout"])
def test_one_communicator_of_a_group_given_up_does_not_wait_for_the_others_operation(how):
    # the group's list held weights entered (and its stream busy) until ctrl's operation, which waits for a peer
    # that is only late, was done: weights.abort() from another thread took 24 s (past PYCOLL_ABORT_TIMEOUT), and a
    # 1 s timeout raised at 11 s (the abort given up at its 10 s bound), or when the late peer came
    uid = bytes(B.load("host").get_unique_id())
    res = run_ranks(_one_of_a_groups_communicators_given_up, 2, uid, how, timeout=60)
    out = res[0]
    if how == "abort":
        assert out["group"] == "CommAborted" and out["abort took"] < 3, out
    else:
        assert out["group"] == "CommTimeout", out
    assert out["group took"] < 4, out
    assert res[1]["group"] in ("RemoteError", "CommAborted"), res[1]  # weights: its peer had aborted it
    for r in (0, 1):
        assert res[r]["y"] == [2.0] * 4 and res[r]["z"] == [2.0] * 2, res[r]


def _root_stopped_holding_the_store_lock(rank, n, folder):
    store = pycoll.FileStore(os.path.join(folder, "store"), timeout=60)
    comm = pycoll.init(rank, n, store=store, backend="host", timeout=20)
    x = np.ones(4, np.float32)
    comm.all_reduce(x)  # both initialised
    # both processes' records published (by their watchdog's thread: on a busy machine after this all_reduce) -- a
    # rank stopped before its record is there is found at the timeout only (README)
    store.wait([f"{proc_prefix(comm.uid)}{r}" for r in range(n)], timeout=20)
    if rank == 0:
        # stopped in the middle of a write of its own watchdog's store thread, as a SIGSTOP may catch it
        store._plock.acquire(5, "test")
        os.kill(os.getpid(), signal.SIGSTOP)
        os._exit(0)
    t0 = time.monotonic()
    try:
        comm.broadcast(x, root=0)  # the root never sends: the liveness check finds it stopped, the policy aborts
        out = "no error"
    except pycoll.CommFailure as e:
        out = type(e).__name__
    return out, time.monotonic() - t0, comm.state


def test_a_failure_is_raised_promptly_while_a_stopped_peer_holds_the_file_stores_lock(tmp_path):
    # the policy's abort closes the communicator, whose closing lets the watchdog publish its last state in the store
    # (best effort, bounded by requests_until): a FileStore's write waited for its lock file, which the stopped root
    # held, for the store's own timeout -- the failure was not handled meanwhile, and the waiting broadcast raised
    # only when await_failure_handled gave up, 2 * PYCOLL_ABORT_TIMEOUT (20 s) later. And in about 1 run in 5 on a
    # busy machine the liveness thread's first round wrote this process's record a second time (the creating thread
    # had written it), waited for the held lock file for the store's timeout, and checked no peer meanwhile: a
    # CommTimeout at 20 s (test_liveness.py has that case alone)
    res = run_ranks(_root_stopped_holding_the_store_lock, 2, str(tmp_path), may_die=[0], timeout=60)
    out, took, state = res[1]
    assert out == "PeerFailure" and took < 8 and state == "aborted", res
