"""The emulated CUDA runtime itself (one process, no communicator): the legacy stream and its
implicit synchronisation, per-thread default streams, events and timing flags, the current device,
capture errors, DLPack / CUDA-array-interface exports and framework streams."""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest

import pycoll.emulated as emu
from pycoll import buffers, devices

pytestmark = [pytest.mark.emulated_gpu, pytest.mark.timeout(30)]


@pytest.fixture
def rt():
    r = emu.EmulatedCudaRuntime(2)
    yield r
    r.close()


def _ok(res):
    assert int(res[0]) == 0, res
    return res[1] if len(res) > 1 else None


def test_legacy_stream_synchronises_with_blocking_streams_only(rt):
    blocking = _ok(rt.cudaStreamCreateWithFlags(0))
    nonblocking = _ok(rt.cudaStreamCreateWithFlags(rt.cudaStreamNonBlocking))
    gate = rt.hang(0)
    ev_b, ev_n = _ok(rt.cudaEventCreateWithFlags(0)), _ok(rt.cudaEventCreateWithFlags(0))
    rt.cudaEventRecord(ev_b, blocking)
    rt.cudaEventRecord(ev_n, nonblocking)
    time.sleep(0.05)
    assert int(rt.cudaEventQuery(ev_b)[0]) == 600, "a blocking stream must wait for the legacy stream"
    assert int(rt.cudaEventQuery(ev_n)[0]) == 0, "a non-blocking stream must not"
    assert int(rt.cudaStreamQuery(1)[0]) == 600  # cudaStreamLegacy is stream 0
    gate.release()
    assert int(rt.cudaEventSynchronize(ev_b)[0]) == 0
    # and the other way: the legacy stream waits for a blocking stream's work
    gate = rt.hang(blocking)
    ev0 = _ok(rt.cudaEventCreateWithFlags(0))
    rt.cudaEventRecord(ev0, 0)
    time.sleep(0.05)
    assert int(rt.cudaEventQuery(ev0)[0]) == 600
    gate.release()
    assert int(rt.cudaEventSynchronize(ev0)[0]) == 0


def test_per_thread_default_streams_are_per_thread(rt):
    mine = rt.host_stream(2)
    other = []
    t = threading.Thread(target=lambda: other.append(rt.host_stream(2)))
    t.start()
    t.join()
    assert mine != other[0] and mine != rt.host_stream(0) and rt.host_stream(0) == rt.host_stream(1)
    gate = rt.hang(2)
    assert int(rt.cudaStreamQuery(2)[0]) == 600
    gate.release()
    assert int(rt.cudaStreamSynchronize(2)[0]) == 0


def test_event_elapsed_time_needs_timing_events(rt):
    s = _ok(rt.cudaStreamCreateWithFlags(rt.cudaStreamNonBlocking))
    a, b = _ok(rt.cudaEventCreateWithFlags(0)), _ok(rt.cudaEventCreateWithFlags(0))
    rt.cudaEventRecord(a, s)
    rt.sleep(s, 0.05)
    rt.cudaEventRecord(b, s)
    assert int(rt.cudaEventElapsedTime(a, b)[0]) == 600
    rt.cudaEventSynchronize(b)
    err, ms = rt.cudaEventElapsedTime(a, b)
    assert int(err) == 0 and ms >= 40
    untimed = _ok(rt.cudaEventCreateWithFlags(rt.cudaEventDisableTiming))
    rt.cudaEventRecord(untimed, s)
    rt.cudaStreamSynchronize(s)
    assert int(rt.cudaEventElapsedTime(a, untimed)[0]) == 400
    dev = devices.CudaDevice(0, runtime=rt)
    with pytest.raises(devices.DeviceError, match="timing=True"):
        dev.elapsed_ms(a, untimed)


def test_current_device_is_per_thread_and_streams_belong_to_it(rt):
    rt.cudaSetDevice(1)
    seen = []
    t = threading.Thread(target=lambda: seen.append(rt.cudaGetDevice()[1]))
    t.start()
    t.join()
    assert rt.cudaGetDevice()[1] == 1 and seen == [0]
    assert int(rt.cudaSetDevice(2)[0]) == 101
    ev1 = _ok(rt.cudaEventCreateWithFlags(0))  # on device 1
    rt.cudaSetDevice(0)
    assert int(rt.cudaEventRecord(ev1, 0)[0]) == 400, "stream 0 is the current device's legacy stream"
    dev1 = devices.CudaDevice(1, runtime=rt)
    s = dev1.create_stream()  # made on device 1, the caller's device restored
    assert rt.cudaGetDevice()[1] == 0 and int(rt.cudaEventRecord(ev1, s)[0]) == 0


def test_capture_status_id_captured_event_and_implicit_legacy_use(rt):
    s = _ok(rt.cudaStreamCreateWithFlags(rt.cudaStreamNonBlocking))
    dev = devices.CudaDevice(0, runtime=rt)
    assert dev.capture_id(s) is None
    assert int(rt.cudaStreamBeginCapture(0, 0)[0]) == 900  # the legacy stream cannot capture
    rt.cudaStreamBeginCapture(s, 0)
    cid = dev.capture_id(s)
    assert cid is not None and cid >= 1 and dev.capture_status(s) == devices.CaptureStatus.ACTIVE
    ev = _ok(rt.cudaEventCreateWithFlags(0))
    rt.cudaEventRecord(ev, s)
    assert int(rt.cudaEventQuery(ev)[0]) == 907
    assert dev.capture_status(0) == devices.CaptureStatus.NONE  # s is non-blocking: no business of the legacy one
    assert int(rt.cudaStreamEndCapture(s)[0]) == 0
    b = _ok(rt.cudaStreamCreateWithFlags(0))  # a blocking stream synchronises with the legacy one
    rt.cudaStreamBeginCapture(b, 0)
    with pytest.raises(devices.DeviceError, match="legacy default stream"):
        dev.capture_status(0)
    assert int(rt.cudaStreamEndCapture(b)[0]) == 0  # CUDA: the query leaves the capture valid
    rt.cudaStreamBeginCapture(b, 2)  # relaxed mode: the legacy stream may be used
    assert dev.capture_status(0) == devices.CaptureStatus.NONE
    assert int(rt.cudaStreamEndCapture(b)[0]) == 0


def test_sticky_error_injection_and_failing_kernel(rt):
    dev = devices.CudaDevice(0, runtime=rt)
    ev = dev.create_event()
    dev.record_event(ev, 0)
    rt.inject_error(700)
    with pytest.raises(devices.DeviceError, match="700"):
        dev.query_event(ev)
    rt.clear_error()
    assert dev.query_event(ev)
    rt.launch(0, lambda: 1 / 0)
    rt.cudaStreamSynchronize(0)
    assert int(rt.cudaEventQuery(ev)[0]) == 719  # a faulting kernel is a sticky launch failure
    assert [c.name for c in rt.calls("cudaEventQuery")]


def test_dlpack_export_is_cuda_memory_and_orders_the_consumer_stream(rt):
    producer = _ok(rt.cudaStreamCreateWithFlags(rt.cudaStreamNonBlocking))
    consumer = _ok(rt.cudaStreamCreateWithFlags(rt.cudaStreamNonBlocking))
    x = emu.TorchLikeTensor(rt, np.zeros(3, np.float32), device=1)
    assert x.__dlpack_device__() == (emu.KDL_CUDA, 1)
    x.fill(4.0, stream=producer, delay=0.1)
    buf = buffers.as_buffer(x, stream=consumer)
    assert buf.device_type == emu.KDL_CUDA and buf.device_id == 1 and buf.ptr == x.host.ctypes.data
    assert x.dlpack_calls == [consumer]
    ev = _ok(rt.cudaEventCreateWithFlags(0))
    rt.cudaEventRecord(ev, consumer)
    assert int(rt.cudaEventQuery(ev)[0]) == 600, "the consumer must wait for the producer's write"
    rt.cudaEventSynchronize(ev)
    assert x.host.tolist() == [4.0] * 3
    buffers.check_device(buf, "nccl", 1)
    with pytest.raises(ValueError):
        buffers.check_device(buf, "nccl", 0)


def test_cai_export_names_its_stream(rt):
    y = emu.CupyLikeArray(rt, np.ones(2, np.float32))
    assert y.__cuda_array_interface__["stream"] == 1  # the legacy stream, spelled as the interface wants
    s = _ok(rt.cudaStreamCreateWithFlags(rt.cudaStreamNonBlocking))
    with rt.cupy.stream(s):
        assert y.__cuda_array_interface__["stream"] == s
        assert buffers.as_buffer(y, stream=s).sync_stream is None
    assert buffers.as_buffer(y, stream=s).sync_stream == 1


def test_framework_current_streams_resolve(rt):
    dev = devices.CudaDevice(0, runtime=rt)
    s = dev.create_stream()
    t, c = emu.TorchLikeTensor(rt, np.ones(2, np.float32)), emu.CupyLikeArray(rt, np.ones(2, np.float32))
    assert dev.resolve_stream(None, [t], default=s) == 0  # torch's default stream is the legacy stream
    rt.torch.set_stream(s)
    assert dev.resolve_stream(None, [t]) == s
    with rt.cupy.stream(2), pytest.raises(ValueError, match="emulated CuPy current stream is cudaStreamPerThread"):
        dev.resolve_stream(None, [c])  # refused as stream=2 is: it names another stream in NCCL's own thread
    with pytest.raises(ValueError, match="both emulated CuPy and emulated torch"):
        dev.resolve_stream(None, [t, c])


def test_one_runtime_per_process(rt):
    with pytest.raises(RuntimeError, match="already open"):
        emu.EmulatedCudaRuntime(1)


@pytest.mark.parametrize("versioned", [False, True])
def test_an_unconsumed_dlpack_capsule_frees_its_array_and_keeps_a_propagating_exception(rt, versioned):
    from pycoll.emulated import arrays

    x = emu.TorchLikeTensor(rt, np.zeros(4, np.float32))
    live = len(arrays._LIVE)
    kwargs = {"max_version": (1, 0)} if versioned else {}

    def drop_while_raising(holder):
        # the last reference goes while the ValueError propagates (a compiled caller frees its locals then)
        try:
            raise ValueError("kept")
        finally:
            holder.clear()

    holder = [x.__dlpack__(**kwargs)]
    assert len(arrays._LIVE) == live + 1
    with pytest.raises(ValueError, match="kept"):
        drop_while_raising(holder)
    assert len(arrays._LIVE) == live  # the deleter ran


def test_the_call_log_stays_bounded(rt):
    # every call was kept for ever: 12 KB per blocking all_reduce, 41 -> 160 MB over 10k of them
    rt.LOG_LIMIT = 100
    for _ in range(1000):
        rt.cudaGetDevice()
    assert 50 <= len(rt.log) <= 100 and rt.log[-1].name == "cudaGetDevice"
