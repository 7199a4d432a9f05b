"""pycoll.devices and pycoll.buffers on a real GPU (skipped without one).

Needs an NVIDIA GPU with cuda-bindings installed (``pycoll-nccl[cuda]``) for the CudaDevice
tests, and a CUDA build of torch for the tensor tests; the HIP tests need hip-python and a ROCm GPU.
"""

from __future__ import annotations

import pytest

from pycoll.buffers import DeviceType, as_buffer, check_device
from pycoll.devices import CaptureStatus, CudaDevice, HipDevice, auto_backend, cuda_device_count, rocm_device_count

N_CUDA = cuda_device_count()
N_ROCM = rocm_device_count()

pytestmark = pytest.mark.gpu

cuda_only = pytest.mark.skipif(N_CUDA == 0, reason="no CUDA GPU")
rocm_only = pytest.mark.skipif(N_ROCM == 0, reason="no ROCm GPU")


def _torch_cuda():
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("torch has no GPU support here")
    return torch


def _sleep_kernel(torch, ms=200):
    """Queue a kernel that spins for about ``ms`` milliseconds on the current stream."""
    torch.cuda._sleep(int(ms * 2_000_000))


class _DLPackOnly:
    def __init__(self, inner):
        self.inner = inner
        self.streams = []

    def __dlpack__(self, **kwargs):
        self.streams.append(kwargs.get("stream"))
        return self.inner.__dlpack__(**kwargs)

    def __dlpack_device__(self):
        return self.inner.__dlpack_device__()


class _CAIOnly:
    def __init__(self, inner):
        self.__cuda_array_interface__ = inner.__cuda_array_interface__


@cuda_only
def test_discovery_sees_the_gpu():
    assert N_CUDA >= 1
    assert auto_backend() == "nccl"


@cuda_only
def test_cuda_streams_and_timed_events():
    pytest.importorskip("cuda.bindings.runtime")
    dev = CudaDevice(0)
    s = dev.create_stream()
    start, end = dev.create_event(timing=True), dev.create_event(timing=True)
    dev.record_event(start, s)
    dev.record_event(end, s)
    dev.synchronize_event(end)
    assert dev.query_event(start) and dev.query_event(end) and dev.query_stream(s)
    assert dev.elapsed_ms(start, end) >= 0.0
    assert dev.capture_status(s) == CaptureStatus.NONE
    for e in (start, end):
        dev.destroy_event(e)
    dev.destroy_stream(s)
    dev.close()


@cuda_only
def test_cuda_events_follow_real_work_and_wait_stream():
    torch = _torch_cuda()
    pytest.importorskip("cuda.bindings.runtime")
    dev = CudaDevice(0)
    busy = torch.cuda.Stream()
    mine = dev.create_stream()
    with torch.cuda.stream(busy):
        _sleep_kernel(torch)
    ev_busy = dev.create_event()
    dev.record_event(ev_busy, busy.cuda_stream)
    dev.wait_stream(mine, busy.cuda_stream)
    ev_mine = dev.create_event()
    dev.record_event(ev_mine, mine)
    assert not dev.query_event(ev_busy)
    assert not dev.query_event(ev_mine), "the waiting stream ran ahead of the busy one"
    dev.synchronize_event(ev_mine)
    assert dev.query_event(ev_busy) and dev.query_event(ev_mine)
    for e in (ev_busy, ev_mine):
        dev.destroy_event(e)
    dev.destroy_stream(mine)


@cuda_only
def test_resolve_stream_follows_torch():
    torch = _torch_cuda()
    pytest.importorskip("cuda.bindings.runtime")
    dev = CudaDevice(0)
    t = torch.zeros(8, device="cuda")
    assert dev.resolve_stream(None, [t]) == torch.cuda.current_stream().cuda_stream
    side = torch.cuda.Stream()
    with torch.cuda.stream(side):
        assert dev.resolve_stream(None, [t]) == side.cuda_stream
    assert dev.resolve_stream(side) == side.cuda_stream
    own = dev.new_stream()
    assert torch.cuda.ExternalStream(own.handle).cuda_stream == own.handle
    own.close()
    dev.close()


@cuda_only
def test_capture_status_during_torch_graph_capture():
    torch = _torch_cuda()
    pytest.importorskip("cuda.bindings.runtime")
    dev = CudaDevice(0)
    x = torch.zeros(16, device="cuda")
    s = torch.cuda.Stream()
    graph = torch.cuda.CUDAGraph()
    torch.cuda.synchronize()
    with torch.cuda.graph(graph, stream=s):
        x.add_(1)
        inside = dev.is_capturing(s.cuda_stream)
    assert inside
    assert not dev.is_capturing(s.cuda_stream)
    graph.replay()
    torch.cuda.synchronize()
    assert float(x[0]) == 1.0


@cuda_only
def test_torch_cuda_tensors_as_buffers():
    torch = _torch_cuda()
    gpu_type = DeviceType.ROCM if torch.version.hip else DeviceType.CUDA
    t = torch.arange(64, device="cuda", dtype=torch.bfloat16).reshape(8, 8)
    b = as_buffer(t[2:4], writable=True)
    assert (b.ptr, b.count, b.dtype_name) == (t.data_ptr() + 32, 16, "BFloat16")
    assert (b.device_type, b.device_id) == (gpu_type, 0)
    check_device(b, "rccl" if torch.version.hip else "nccl", 0)
    with pytest.raises(ValueError, match="not C-contiguous"):
        as_buffer(t.T)
    # DLPack from a real GPU producer, with our stream passed to it
    stream = torch.cuda.current_stream().cuda_stream
    wrapped = _DLPackOnly(t)
    bd = as_buffer(wrapped, stream=stream)
    assert bd.ptr == t.data_ptr() and bd.device_type == gpu_type and bd.device_id == 0
    assert wrapped.streams == [1 if stream == 0 and not torch.version.hip else stream]
    # the CUDA array interface of a torch tensor (float32: torch has no CAI typestr for bf16)
    f = torch.ones(10, device="cuda")
    bc = as_buffer(_CAIOnly(f), stream=stream)
    assert bc.ptr == f.data_ptr() and bc.count == 10 and bc.source == "cai"
    assert bc.sync_stream is None or bc.sync_stream != 0


@rocm_only
def test_hip_streams_and_events():
    pytest.importorskip("hip")
    dev = HipDevice(0)
    s = dev.create_stream()
    e = dev.create_event(timing=True)
    dev.record_event(e, s)
    dev.synchronize_event(e)
    assert dev.query_event(e) and dev.query_stream(s)
    assert dev.capture_status(s) == CaptureStatus.NONE
    dev.destroy_event(e)
    dev.destroy_stream(s)
