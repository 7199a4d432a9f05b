"""The communicator's locks (pycoll._core.Lock / RLock): threading's interface, taken by compiled code."""

import threading
import time

import numpy as np
import pytest

import pycoll
from pycoll._core import CommCore, Lock, RLock


@pytest.mark.timeout(30)
@pytest.mark.parametrize("cls", [Lock, RLock])
def test_acquire_release_with_and_timeouts(cls):
    lk = cls()
    assert lk.acquire() is True
    got = []
    t = threading.Thread(target=lambda: got.append((lk.acquire(blocking=False), lk.acquire(timeout=0.05))))
    t0 = time.monotonic()
    t.start()
    t.join(5)
    assert got == [(False, False)] and time.monotonic() - t0 >= 0.05
    lk.release()
    with lk:
        t = threading.Thread(target=lambda: got.append(lk.acquire(timeout=0.01)))
        t.start()
        t.join(5)
    assert got[-1] is False
    # free again: another thread takes it at once
    t = threading.Thread(target=lambda: (got.append(lk.acquire(timeout=1)), lk.release()))
    t.start()
    t.join(5)
    assert got[-1] is True


@pytest.mark.parametrize("cls", [Lock, RLock])
def test_bad_arguments_and_releasing_an_unheld_lock_raise(cls):
    lk = cls()
    with pytest.raises(RuntimeError):
        lk.release()
    with pytest.raises(ValueError, match="non-blocking"):
        lk.acquire(blocking=False, timeout=1)
    with pytest.raises(ValueError, match="non-negative"):
        lk.acquire(timeout=-2)
    with pytest.raises(ValueError, match="non-negative"):
        lk.acquire(timeout=float("nan"))
    assert lk.acquire(timeout=0.01)  # still usable
    lk.release()


def test_rlock_is_reentrant_and_owned_by_its_thread():
    lk = RLock()
    with lk, lk:
        errors = []

        def other():
            try:
                lk.release()
            except RuntimeError as exc:
                errors.append(exc)
            errors.append(lk.acquire(blocking=False))

        t = threading.Thread(target=other)
        t.start()
        t.join(5)
        assert isinstance(errors[0], RuntimeError) and errors[1] is False
    assert lk.acquire(blocking=False) is True  # released as often as acquired
    lk.release()


def test_lock_is_not_reentrant_but_may_be_released_by_another_thread():
    lk = Lock()
    lk.acquire()
    assert lk.acquire(blocking=False) is False
    assert lk.locked()
    t = threading.Thread(target=lk.release)
    t.start()
    t.join(5)
    assert not lk.locked() and lk.acquire(blocking=False)


@pytest.mark.timeout(30)
def test_a_blocked_acquire_runs_signal_handlers():
    import signal

    lk = Lock()
    lk.acquire()
    seen = []
    old = signal.signal(signal.SIGALRM, lambda *a: seen.append(1))
    try:
        signal.setitimer(signal.ITIMER_REAL, 0.05)
        assert lk.acquire(timeout=0.3) is False
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)
    assert seen == [1]


@pytest.mark.timeout(60)
def test_mutual_exclusion_under_contention():
    for cls in (Lock, RLock):
        lk, box = cls(), [0]

        def bump():
            for _ in range(20000):
                with lk:
                    v = box[0]
                    box[0] = v + 1

        ts = [threading.Thread(target=bump) for _ in range(4)]
        for t in ts:
            t.start()
        for t in ts:
            t.join(30)
        assert box[0] == 80000


def test_every_communicator_core_has_its_own_locks():
    a, b = CommCore(), CommCore()
    assert isinstance(a._lock, RLock) and isinstance(a._plock, Lock) and isinstance(a._hlock, Lock)
    assert a._lock is not b._lock and a._plock is not a._hlock
    with pytest.raises(AttributeError):
        a._plock = Lock()  # the per-call path relies on them: never replaced


@pytest.mark.timeout(30)
def test_an_arrays_finalizer_may_call_pycoll_when_its_operation_completes():
    # retiring an operation let its arrays go under the communicator's lock: a weakref.finalize or __del__ that
    # called comm.outstanding() or abort() then waited for that lock in the same thread, for ever (in the watchdog's
    # thread: no timeout was detected any more)
    import weakref

    comm = pycoll.init(0, 1, backend="host", unique_id=pycoll.get_unique_id(backend="host"))
    seen = []
    try:
        x = np.ones(4)
        w = comm.all_reduce(x, async_op=True)
        weakref.finalize(x, lambda: seen.append(len(comm.outstanding())))
        del x
        w.wait()
        assert seen == [0]
    finally:
        comm.destroy()


@pytest.mark.timeout(30)
def test_a_call_back_into_pycoll_under_its_own_lock_raises_instead_of_waiting_for_ever():
    comm = pycoll.init(0, 1, backend="host", unique_id=pycoll.get_unique_id(backend="host"))
    try:
        # as a gc callback or signal handler run while pycoll holds it
        with comm._plock, pytest.raises(pycoll.CommStateError, match="called back from code that ran while it held"):
            comm.outstanding()
        assert comm.outstanding() == []
    finally:
        comm.destroy()


def test_a_lock_another_thread_releases_may_be_waited_for_by_its_holder():
    # as threading.Lock: only a communicator's own locks, which no other thread releases, refuse that wait
    lock = Lock()
    assert lock.acquire()
    threading.Timer(0.2, lock.release).start()
    t0 = time.monotonic()
    assert lock.acquire(timeout=10) and time.monotonic() - t0 >= 0.15
    lock.release()
