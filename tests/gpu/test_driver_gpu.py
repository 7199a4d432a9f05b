"""The compiled operation path on a real GPU: the CUDA driver table it calls (``CudaDevice.driver``, from
libcuda.so.1) and torch GPU tensors described from torch's DLPack view; each against what the runtime module and
the general description give. One rank. Skipped without a CUDA GPU."""

from __future__ import annotations

import numpy as np
import pytest

import pycoll
from pycoll.devices import cuda_device_count

pytestmark = [pytest.mark.gpu, pytest.mark.timeout(120)]

if cuda_device_count() == 0:
    pytest.skip("no CUDA GPU (pycoll.devices.cuda_device_count() is 0)", allow_module_level=True)


def _torch():
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("torch has no CUDA support here")
    return torch


@pytest.fixture
def comm():
    _torch()
    c = pycoll.init(0, 1, backend="nccl", device=0, timeout=60, init_timeout=60, name="driver")
    yield c
    c.destroy()


def test_the_cuda_device_has_the_drivers_table_and_it_agrees_with_the_runtime():
    from pycoll.devices import CudaDevice

    dev = CudaDevice(0)
    drv = dev.driver
    assert drv is not None and drv.source == "libcuda.so.1", drv
    dev.make_current()
    err, handle = drv.device_handle(0)
    assert err == 0 and drv.current_device() == (0, handle)
    s, ev = dev.create_stream(), dev.create_event()
    try:
        assert drv.record(ev, s) == 0
        dev.synchronize_event(ev)
        assert drv.query(ev) == 0 and dev.query_event(ev)
        assert drv.record(ev, 0) == 0 and drv.record(ev, 1) == 0  # the legacy stream, both spellings
        dev.synchronize_event(ev)
        assert drv.capture_status(s) == (0, 0) and dev.capture_status(s) == 0
        rt = dev.runtime
        mode = rt.cudaStreamCaptureMode.cudaStreamCaptureModeThreadLocal
        assert int(rt.cudaStreamBeginCapture(s, mode)[0]) == 0
        try:
            assert drv.capture_status(s) == (0, 1) and dev.capture_status(s) == 1
        finally:
            err, graph = rt.cudaStreamEndCapture(s)
            assert int(err) == 0
            rt.cudaGraphDestroy(graph)
    finally:
        dev.destroy_event(ev)
        dev.destroy_stream(s)


def test_results_are_the_same_with_the_driver_calls_and_without(comm):
    from pycoll import _core

    torch = _torch()
    assert comm.device.driver is not None
    try:
        for on in (True, False):
            _core.gpu_driver_calls(on)
            x = torch.arange(1, 9, dtype=torch.float32, device="cuda")
            comm.all_reduce(x)
            comm.all_reduce(x, async_op=True).wait(timeout=30)
            side = torch.cuda.Stream()
            with torch.cuda.stream(side):
                y = torch.full((4,), 3.0, device="cuda")
                comm.broadcast(y, root=0)
            torch.cuda.synchronize()
            np.testing.assert_array_equal(x.cpu().numpy(), np.arange(1, 9, dtype=np.float32))
            np.testing.assert_array_equal(y.cpu().numpy(), np.full(4, 3.0, np.float32))
            assert comm.outstanding() == []
    finally:
        _core.gpu_driver_calls(True)


def test_torch_gpu_tensors_are_described_in_compiled_code_as_the_general_path_describes_them(comm):
    from pycoll import _core
    from pycoll.buffers import as_buffer

    torch = _torch()
    if not _core.torch_dlpack_view():
        pytest.skip(f"torch {torch.__version__} has no DLPack C exchange API (torch 2.10 and later)")
    dev = torch.device("cuda", 0)
    current = torch.cuda.current_stream(dev).cuda_stream
    side = torch.cuda.Stream(dev)
    cases = [
        torch.ones(8, device=dev),
        torch.zeros(3, 4, dtype=torch.bfloat16, device=dev),
        torch.arange(10, dtype=torch.int64, device=dev)[2:],  # a view with an offset
        torch.ones(1, 5, device=dev).t(),  # dimensions of one: contiguous whatever their strides
        torch.nn.Parameter(torch.ones(4, device=dev)),
        torch.empty(0, device=dev),
    ]
    for t in cases:
        for stream in (current, side.cuda_stream, None):
            got = _core.buf(comm, t, stream, writable=True, name="x")
            want = as_buffer(t, writable=True, stream=stream, name="x")
            assert tuple(got) == tuple(want), (t.shape, stream)
        with torch.cuda.stream(side):  # produced on the side stream: a collective on the current one waits for it
            got = _core.buf(comm, t, current, writable=True, name="x")
            want = as_buffer(t, writable=True, stream=current, name="x")
            assert tuple(got) == tuple(want) and got.sync_stream == side.cuda_stream
        # the stream an operation on it runs on without stream=: torch's current one
        assert _core.begin(comm, "all_reduce", None, False, (t, t)) == current
        with torch.cuda.stream(side):
            assert _core.begin(comm, "all_reduce", None, False, (t, None)) == side.cuda_stream
    for bad, why in ((torch.ones(4, 4, device=dev).t(), "contiguous"),
                     (torch.ones(4, device=dev)._neg_view(), "negative bit"),
                     (torch.ones(4, dtype=torch.complex64, device=dev), "dtype")):
        with pytest.raises((TypeError, ValueError), match=why):
            _core.buf(comm, bad, current, writable=True, name="x")
    torch.cuda.synchronize()
