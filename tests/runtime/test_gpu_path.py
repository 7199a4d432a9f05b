"""The GPU code path on CPU: a Communicator on a fake NCCL (tests/bindings/fake_nccl.c) and a fake CUDA
runtime (helpers/fake_gpu.py). Each test names the finding of the GPU-path review it guards.

The fake collective enqueues nothing real: a test queues "work" on a stream of the fake runtime to
stand for a kernel still running, and finishes it to let the events recorded after it complete.
"""

from __future__ import annotations

import os
import signal
import threading
import time

import pytest
from helpers.dlpack_fake import cai
from helpers.fake_gpu import FakeGpuRuntime
from helpers.fake_nccl import Fake

import pycoll
import pycoll.diagnostics
from pycoll.comm import Communicator
from pycoll.devices import CudaDevice

pytestmark = pytest.mark.timeout(60)

IN_PROGRESS, REMOTE = 7, 6
HANDLE = 0x1000  # what the fake's ncclCommInitRank hands out


@pytest.fixture
def fake(fakes):
    f = Fake(fakes["nccl"])
    yield f
    for call in (f.ctl.fakeSetNextResult, f.ctl.fakeSetAsyncState, f.ctl.fakeSetDelayMs):
        call(0)


@pytest.fixture
def rt():
    return FakeGpuRuntime("cuda")


def _comm(fake, rt, *, timeout=1.0, on_failure="abort", device=0):
    pycoll.diagnostics.install()  # the recorder and the watchdog watch it, as in production
    return Communicator(HANDLE, library=fake.lib, device=CudaDevice(device, runtime=rt), rank=0, size=2,
                        name="gpu", uid="feedbeef00000001", global_ranks=None, timeout=timeout,
                        on_failure=on_failure)


def _x():
    return cai(shape=(4,), typestr="<f4", data=(0x7F0000001000, False), stream=None)


def _until(cond, timeout=5.0):
    deadline = time.monotonic() + timeout
    while not cond() and time.monotonic() < deadline:
        time.sleep(0.01)
    return cond()


def _close(c):
    if not c.closed:
        c.abort()


def test_default_stream_op_is_outstanding_and_times_out(fake, rt):
    """Known issue: on stream 0 an operation behind a running kernel is not completed at enqueue."""
    c = _comm(fake, rt, timeout=0.5)
    try:
        rt.launch(0, "kernel")  # the legacy default stream is busy
        w = c.all_reduce(_x(), stream=0, async_op=True)
        assert not w.is_completed() and c.outstanding() == [w] and w.state in ("scheduled", "started")
        t0 = time.monotonic()
        with pytest.raises(pycoll.CommTimeout):
            w.wait()
        assert time.monotonic() - t0 < 2.0
        assert _until(lambda: c.state == "aborted")  # the failure is raised before its policy has acted
        records = [e for e in rt.log if e[0] == "record"]
        assert records and all(s == 1 for _, _, s in records)  # runtime calls name cudaStreamLegacy
    finally:
        _close(c)


@pytest.mark.parametrize("abort_s, limit_s", [(0.8, 10.0), (3.0, 0.6)])
def test_blocking_op_failure_is_raised_once_the_abort_returned_or_was_left_behind(fake, rt, monkeypatch,
                                                                                  abort_s, limit_s):
    """On a GPU ncclCommAbort returns only once the device can free the communicator: after a kernel
    queued ahead of NCCL's (which its abort flag cannot stop) ends. A blocking operation's CommTimeout
    comes with the policy applied: after the abort, or after PYCOLL_ABORT_TIMEOUT leaves it behind."""
    monkeypatch.setenv("PYCOLL_ABORT_TIMEOUT", str(limit_s))
    fake.ctl.fakeSetAbortDelayMs(int(abort_s * 1000))
    c = _comm(fake, rt, timeout=0.3)
    try:
        rt.launch(0, "kernel")  # the stream stays busy: the operation can never complete
        t0 = time.monotonic()
        with pytest.raises(pycoll.CommTimeout):
            c.all_reduce(_x(), stream=0)
        took = time.monotonic() - t0
        assert 0.3 + min(abort_s, limit_s) - 0.1 < took < 0.3 + min(abort_s, limit_s) + 1.5, took
        assert c.state == "aborted"
    finally:
        rt.finish(0)
        _close(c)


def test_a_left_behind_abort_frees_the_streams_and_events_when_it_returns(fake, rt, monkeypatch):
    """Seen on an H200: once ncclCommAbort was left behind, destroying the communicator's stream in the
    failing thread blocked until the device was idle (seconds past the deadline). The abort thread
    frees them once its abort returns; until then they stay valid."""
    monkeypatch.setenv("PYCOLL_ABORT_TIMEOUT", "0.3")
    fake.ctl.fakeSetAbortDelayMs(1500)
    c = _comm(fake, rt, timeout=0.3)
    try:
        before = set(rt.events)
        rt.launch(0, "kernel")
        t0 = time.monotonic()
        with pytest.raises(pycoll.CommTimeout):
            c.all_reduce(_x(), stream=0)
        assert time.monotonic() - t0 < 1.2 and c.state == "aborted"
        kept = set(rt.events) - before
        assert kept  # the operation's events: not destroyed while the library is still aborting
        assert _until(lambda: not (set(rt.events) & kept), timeout=5.0)  # freed once the abort returned
    finally:
        rt.finish(0)
        _close(c)


def test_a_call_the_library_cannot_make_leaves_no_work_behind(fake, rt):
    """A per-call CollConfig on a library without ncclAllReduceConfig (NCCL < 2.31) is refused with
    NotSupported; nothing was enqueued, so nothing stays outstanding and the communicator goes on."""
    c = _comm(fake, rt)
    try:
        with pytest.raises(pycoll.NotSupported, match="ncclAllReduceConfig"):
            c.all_reduce(_x(), config=pycoll.CollConfig(min_ctas=1), async_op=True)
        assert c.outstanding() == [] and c.state == "active"
        w = c.all_reduce(_x(), async_op=True)
        assert c.outstanding() == [w]
        w.wait(timeout=2.0)
        assert c.outstanding() == [] and w.state == "completed"
    finally:
        _close(c)


def test_default_stream_op_completes_when_the_stream_gets_there(fake, rt):
    c = _comm(fake, rt)
    try:
        rt.launch(0, "kernel")
        w = c.all_reduce(_x(), stream=0, async_op=True)
        time.sleep(0.05)
        assert not w.is_completed()
        rt.finish(0)
        w.wait(timeout=2.0)
        assert w.state == "completed" and c.outstanding() == []
    finally:
        _close(c)


def test_in_progress_collective_is_not_completed_before_the_communicator_is_ready(fake, rt):
    """F1: ncclInProgress from a collective means nothing is on the stream yet."""
    c = _comm(fake, rt, timeout=5.0)
    try:
        fake.ctl.fakeSetNextResult(IN_PROGRESS)
        fake.ctl.fakeSetAsyncState(IN_PROGRESS)
        threading.Timer(0.3, fake.ctl.fakeSetAsyncState, (0,)).start()
        t0 = time.monotonic()
        w = c.all_reduce(_x(), async_op=True)
        assert time.monotonic() - t0 >= 0.25  # the end event was recorded only once the comm was ready
        fake.ctl.fakeSetNextResult(0)
        w.wait(timeout=2.0)
        assert w.state == "completed"
    finally:
        _close(c)


def test_in_progress_that_never_ends_times_out_within_the_deadline(fake, rt):
    c = _comm(fake, rt, timeout=0.4)
    try:
        fake.ctl.fakeSetNextResult(IN_PROGRESS)
        fake.ctl.fakeSetAsyncState(IN_PROGRESS)
        t0 = time.monotonic()
        with pytest.raises(pycoll.CommTimeout):
            c.all_reduce(_x(), async_op=True)
        assert time.monotonic() - t0 < 2.0
    finally:
        _close(c)


def test_sticky_device_error_fails_the_communicator(fake, rt):
    """F4: an error from an event query (a sticky CUDA error) fails the communicator."""
    c = _comm(fake, rt, timeout=30.0)
    try:
        rt.launch(0, "kernel")
        w = c.all_reduce(_x(), stream=0, async_op=True)
        rt.sticky = 700  # cudaErrorIllegalAddress
        with pytest.raises(pycoll.CommFailure, match="querying the events"):
            w.wait(timeout=5.0)
        assert c.failure is not None and _until(lambda: c.state == "aborted")
    finally:
        rt.sticky = 0
        _close(c)


def test_refused_group_leaves_no_phantom_work(fake, rt):
    """F8: after ncclGroupEnd refuses a group nothing of it is outstanding, and no timeout follows."""
    c = _comm(fake, rt, timeout=0.3)
    try:
        with pytest.raises(pycoll.InvalidArgument), c.group():
            c.all_reduce(_x(), async_op=True)
            fake.ctl.fakeSetNextResult(4)  # ncclGroupEnd -> InvalidArgument
        fake.ctl.fakeSetNextResult(0)
        assert c.outstanding() == []
        time.sleep(0.6)
        assert c.state == "active" and c.failure is None
    finally:
        _close(c)


def test_group_end_in_progress_records_ends_when_ready(fake, rt):
    c = _comm(fake, rt, timeout=5.0)
    try:
        with c.group():
            w = c.all_reduce(_x(), async_op=True)
            fake.ctl.fakeSetNextResult(IN_PROGRESS)
            fake.ctl.fakeSetAsyncState(IN_PROGRESS)
            threading.Timer(0.3, fake.ctl.fakeSetAsyncState, (0,)).start()
        fake.ctl.fakeSetNextResult(0)
        w.wait(timeout=2.0)
        assert w.state == "completed"
    finally:
        _close(c)


def test_destroy_after_an_abortive_shrink_aborts(fake, rt):
    """F7: the parent of an abortive shrink is released with abort, never destroy."""
    c = _comm(fake, rt)
    child = None
    try:
        child = c.shrink([1], abort_ops=True)
        c.destroy()
        assert c.state == "aborted"
    finally:
        _close(c)
        if child is not None:
            _close(child)


def test_destroy_of_a_failed_communicator_aborts(fake, rt):
    c = _comm(fake, rt, on_failure="report")
    try:
        c.fail(pycoll.CommFailure("gone"))
        c.destroy()
        assert c.state == "aborted"
    finally:
        _close(c)


def test_a_blocked_call_does_not_freeze_the_watchdog(fake, rt):
    """F6: one communicator inside a slow library call; another one's timeout still fires on time."""
    a = _comm(fake, rt, timeout=30.0)
    b = _comm(fake, FakeGpuRuntime("cuda"), timeout=0.5)
    try:
        fake.ctl.fakeSetDelayMs(3000)
        t = threading.Thread(target=lambda: a.all_reduce(_x(), async_op=True), daemon=True)
        t.start()
        time.sleep(0.2)
        fake.ctl.fakeSetDelayMs(0)
        b.device.runtime.launch(0, "kernel")
        w = b.all_reduce(_x(), stream=0, async_op=True)
        t0 = time.monotonic()
        while b.failure is None and time.monotonic() - t0 < 2.5:
            time.sleep(0.02)  # the watchdog, not this thread, must find it
        assert isinstance(b.failure, pycoll.CommTimeout) and time.monotonic() - t0 < 2.0
        while not w.is_completed() and time.monotonic() - t0 < 5.0:
            time.sleep(0.01)  # finished once the policy has acted (its abort)
        assert w.exception() is not None and b.state == "aborted"
        t.join(5.0)
    finally:
        _close(a)
        _close(b)


def test_per_thread_default_stream_is_refused(fake, rt):
    """F12: cudaStreamPerThread (2) names another stream in NCCL's own thread."""
    c = _comm(fake, rt)
    try:
        with pytest.raises(ValueError, match="StreamPerThread"):
            c.all_reduce(_x(), stream=2)
        assert c.state == "active"
    finally:
        _close(c)


def test_launch_runs_with_the_communicators_device_current(fake, rt):
    """Stream 0 is the current device's: a launch makes the communicator's device current, then restores."""
    c = _comm(fake, rt, device=1)
    try:
        rt.current = 0
        rt.log.clear()
        c.all_reduce(_x(), stream=0, async_op=True).wait(timeout=2.0)
        sets = [e[1] for e in rt.log if e[0] == "set"]
        assert sets[:2] == [1, 0] and rt.current == 0
    finally:
        _close(c)


def test_two_threads_on_one_communicator_is_refused(fake, rt):
    """Concurrent use interleaves differently on different ranks: the second thread gets a clear error."""
    c = _comm(fake, rt, timeout=5.0)
    try:
        rt.launch(0, "kernel")
        errors = []
        first = threading.Thread(target=lambda: c.all_reduce(_x(), stream=0), name="first", daemon=True)
        first.start()
        time.sleep(0.2)  # "first" is inside its blocking all_reduce

        def second():
            try:
                c.all_reduce(_x(), stream=0, async_op=True)
            except pycoll.CommStateError as e:
                errors.append(str(e))

        recorded = pycoll.flight_recorder.get_recorder().recorded
        t = threading.Thread(target=second, name="second", daemon=True)
        t.start()
        t.join(5.0)
        assert errors and "'second'" in errors[0] and "'first'" in errors[0]
        # the refused call took no number (it took #2: the peers' reports said this rank had issued what never ran,
        # and the flight recorder recorded it as completed)
        assert c.progress().coll_enqueued == 1
        assert pycoll.flight_recorder.get_recorder().recorded == recorded
        rt.finish(0)
        first.join(5.0)
        assert c.state == "active" and not first.is_alive()
    finally:
        _close(c)


def test_abort_from_another_thread_surfaces_as_comm_aborted(fake, rt):
    c = _comm(fake, rt, timeout=10.0)
    try:
        rt.launch(0, "kernel")
        t = threading.Timer(0.2, c.abort)
        t.name = "aborter"
        t.start()
        # it names the operation the abort stopped and where the abort came from
        with pytest.raises(pycoll.CommAborted, match=r"all_reduce #1 on communicator .* did not complete: the "
                           r"communicator was aborted \(abort\(\) in thread 'aborter'\)"):
            c.all_reduce(_x(), stream=0)
    finally:
        _close(c)


def test_ctrl_c_inside_a_blocking_operation(fake, rt):
    """SIGINT raises KeyboardInterrupt promptly and leaves the communicator failed."""
    if threading.current_thread() is not threading.main_thread():
        pytest.skip("signals are delivered to the main thread")
    c = _comm(fake, rt, timeout=20.0)
    try:
        rt.launch(0, "kernel")
        threading.Timer(0.2, os.kill, (os.getpid(), signal.SIGINT)).start()
        t0 = time.monotonic()
        with pytest.raises(KeyboardInterrupt):
            c.all_reduce(_x(), stream=0)
        assert time.monotonic() - t0 < 0.2 + 0.1 + 0.2
        assert isinstance(c.failure, pycoll.CommAborted) and "interrupted" in str(c.failure)
    finally:
        _close(c)


def test_a_programs_own_sigint_handler_lets_the_operation_go_on(fake, rt):
    """Under a handler of the program's own ("stop after this step"), Ctrl-C is the program's: the watchdog failed the
    communicator all the same (CommAborted in place of the handler's own exception, the peers told)."""
    if threading.current_thread() is not threading.main_thread():
        pytest.skip("signals are delivered to the main thread")
    c = _comm(fake, rt, timeout=20.0)
    stop = []
    previous = signal.signal(signal.SIGINT, lambda s, f: stop.append(s))
    try:
        rt.launch(0, "kernel")
        threading.Timer(0.2, os.kill, (os.getpid(), signal.SIGINT)).start()
        threading.Timer(0.8, rt.finish, (0,)).start()
        c.all_reduce(_x(), stream=0)
        assert stop == [signal.SIGINT] and c.state == "active" and c.failure is None
    finally:
        signal.signal(signal.SIGINT, previous)
        _close(c)


def test_forked_child_cannot_use_the_parents_communicator(fake, rt):
    c = _comm(fake, rt)
    try:
        r, w = os.pipe()
        pid = os.fork()
        if pid == 0:  # the child: report and leave at once, without running the parent's cleanup
            try:
                try:
                    c.all_reduce(_x(), stream=0, async_op=True)
                    msg = b"used"
                except pycoll.CommStateError as e:
                    msg = b"refused" if b"fork" in str(e).encode() else b"other"
                c.destroy()  # frees nothing of the parent's
                os.write(w, msg)
            finally:
                os._exit(0)
        os.close(w)
        out = os.read(r, 100)
        os.waitpid(pid, 0)
        os.close(r)
        assert out == b"refused"
        c.all_reduce(_x(), stream=0, async_op=True).wait(timeout=2.0)  # still the parent's, and usable
    finally:
        _close(c)


def test_lock_order_hammer(fake, rt):
    """One lock order: an enqueue failing with a remote error while other threads refresh and check."""
    for _ in range(20):
        c = _comm(fake, FakeGpuRuntime("cuda"), timeout=5.0)
        try:
            works = [c.all_reduce(_x(), async_op=True) for _ in range(3)]
            stop = threading.Event()

            def poll():
                while not stop.is_set():
                    for w in works:
                        w.is_completed()
                    c.check()

            pollers = [threading.Thread(target=poll, daemon=True) for _ in range(2)]
            for p in pollers:
                p.start()
            fake.ctl.fakeSetNextResult(REMOTE)
            fake.ctl.fakeSetAsyncState(REMOTE)
            with pytest.raises(pycoll.CommFailure):
                c.all_reduce(_x(), async_op=True)
            stop.set()
            for p in pollers:
                p.join(2.0)
                assert not p.is_alive(), "a poller is stuck: lock-order inversion"
        finally:
            fake.ctl.fakeSetNextResult(0)
            fake.ctl.fakeSetAsyncState(0)
            _close(c)


class _NotADict:
    __cuda_array_interface__ = ("shape", (4,))


class _CountedCAI:
    """Its interface made by a property at each read, as Numba and CuPy make it."""

    def __init__(self):
        self.reads = 0

    @property
    def __cuda_array_interface__(self):
        self.reads += 1
        return {"shape": (4,), "typestr": "<f4", "data": (0x7F0000001000, False), "version": 3}


def test_the_compiled_path_describes_gpu_arrays_as_as_buffer_does(fake, rt, monkeypatch):
    """CUDA array interface objects and GPU DLPack producers: the Communicator reads the usual forms in compiled code
    (the same Buffer as as_buffer and the nccl backend's device check give, the producer stream included) and leaves
    the others to as_buffer, which reads them or says what is wrong."""
    import numpy as np
    from helpers.dlpack_fake import KDL_CUDA, FakeDLPack

    from pycoll import _core, buffers
    from pycoll.buffers import as_buffer, check_device

    general = []
    real = buffers._from_cai
    monkeypatch.setattr(buffers, "_from_cai", lambda *a: general.append(a) or real(*a))
    p = 0x7F0000001000
    usual = [cai(), cai(shape=(2, 3), typestr="<f2"), cai(shape=(), typestr="|u1"), cai(shape=(0, 4), typestr="<i8"),
             cai(shape=(2, 4), strides=(16, 4)), cai(shape=(1, 4), strides=(999, 4)), cai(shape=(0, 3), strides=(1, 1)),
             cai(data=(p, True)), cai(data=(None, False), shape=(0,)), cai(stream=1), cai(stream=0x5000),
             cai(stream=0x7777), cai(version=2), cai(typestr="<u8", shape=(3,), stream=None, mask=None)]
    unusual = [cai(shape=[2, 3]), cai(shape=(np.int64(4),)), cai(data=[p, False]), cai(data=(np.uint64(p), 0)),
               cai(strides=[4])]
    bad = [cai(mask=object()), cai(shape=(2, -1)), cai(shape=(2, 4), strides=(4, 8)), cai(typestr="<c8"),
           cai(typestr=">f4"), cai(typestr="f4"), cai(stream=0), cai(shape=(2, 4), strides=(16,)), _NotADict(),
           cai(data=(p,)), FakeDLPack(p, (4,), device=(KDL_CUDA, 1))]
    dlpack = [FakeDLPack(p, (2, 3), device=(KDL_CUDA, 0)), FakeDLPack(p, (4,), device=(KDL_CUDA, 0), versioned="v0")]
    c = _comm(fake, rt)
    try:
        for stream in (0, 0x5000):
            for x in usual + unusual + dlpack + bad:
                for writable in (False, True):
                    del general[:]
                    got = want = None
                    try:
                        got = _core.buf(c, x, stream, writable=writable, name="t")
                    except Exception as exc:  # compared below
                        got = exc
                    in_c = not general
                    try:
                        want = as_buffer(x, writable=writable, stream=stream, name="t")
                        check_device(want, "nccl", 0)
                    except Exception as exc:  # compared below
                        want = exc
                    if isinstance(want, Exception):
                        assert type(got) is type(want) and str(got) == str(want), (x, got, want)
                        continue
                    assert tuple(got)[:9] + tuple(got)[10:] == tuple(want)[:9] + tuple(want)[10:], (x, got, want)
                    assert (got.owner is x) == (got.source == "cai"), got
                    if any(x is u for u in usual):
                        assert in_c, x.__cuda_array_interface__
        counted = _CountedCAI()
        assert _core.buf(c, counted, 0, writable=True, name="t").count == 4 and counted.reads == 1  # read once
        assert c.state == "active"
    finally:
        _close(c)


def test_a_group_shares_its_events_and_gives_them_back_once(fake, rt):
    """Operations of one group on one stream share a start and an end event (nothing of the group reaches the
    stream before ncclGroupEnd). One the library refuses inside the group, and a group the library refuses as a
    whole, give the events back only once no operation holds them any more: the pool never holds an event twice,
    and never one that an outstanding operation still has."""
    c = _comm(fake, rt, timeout=5.0)
    try:
        c.all_reduce(_x())  # the pool has its events
        del rt.log[:]
        with c.group():
            w1 = c.all_reduce(_x(), async_op=True)
            fake.ctl.fakeSetNextResult(4)  # the second one: InvalidArgument (the fake's result stays until reset)
            with pytest.raises(pycoll.InvalidArgument):
                c.all_reduce(_x(), async_op=True)
            fake.ctl.fakeSetNextResult(0)
            w3 = c.all_reduce(_x(), async_op=True)
            assert w3._start is w1._start
            assert w1._start not in c._events
        assert [e[0] for e in rt.log].count("record") == 2  # one start, one end: not one pair per operation
        assert w3._end is w1._end and not {w1._start, w1._end} & set(c._events)
        w1.wait()
        assert not {w3._start, w3._end} & set(c._events)  # w3 still holds them
        w3.wait()
        pool = list(c._events)
        assert len(set(pool)) == len(pool)
        with pytest.raises(pycoll.InvalidArgument), c.group():  # refused as a whole: all three withdrawn
            ws = [c.all_reduce(_x(), async_op=True) for _ in range(3)]
            fake.ctl.fakeSetNextResult(4)  # ncclGroupEnd
        fake.ctl.fakeSetNextResult(0)
        assert all(w._start is None for w in ws) and c.outstanding() == []
        assert sorted(c._events) == sorted(pool)  # each event back once
        c.all_reduce(_x())
        assert c.state == "active" and c.failure is None
    finally:
        _close(c)


def test_an_abort_with_a_group_outstanding_destroys_its_shared_events_once(fake, rt, caplog):
    """A group's operations still running when the communicator is aborted: the events they share are destroyed
    once with the rest of the communicator's events (a second destroy of one would fail and leave the others)."""
    c = _comm(fake, rt, timeout=30.0)
    try:
        c.all_reduce(_x(), stream=0)  # the pool has its events
        rt.launch(0, "kernel")  # the group's operations stay outstanding behind it
        with c.group():
            ws = [c.all_reduce(_x(), stream=0, async_op=True) for _ in range(3)]
        assert not any(w.is_completed() for w in ws) and len({(w._start, w._end) for w in ws}) == 1
        c.abort()
        assert _until(lambda: c.closed)
        assert rt.events == {}, "events left behind: one of them was destroyed twice, or not at all"
        assert not [r for r in caplog.records if "releasing resources" in r.getMessage()]
    finally:
        rt.finish(0)
        _close(c)
