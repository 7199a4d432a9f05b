"""Device.copy_to_device / copy_to_host through the real CUDA runtime, and Communicator.broadcast_bytes
(what ElasticGroup.maybe_grow sends its decision with) on a one-rank NCCL communicator. Skipped without
a CUDA GPU and cuda-bindings."""

from __future__ import annotations

import pytest

from pycoll.devices import CudaDevice, cuda_device_count

pytestmark = [pytest.mark.gpu, pytest.mark.timeout(120)]

if cuda_device_count() == 0:
    pytest.skip("no CUDA GPU (pycoll.devices.cuda_device_count() is 0)", allow_module_level=True)


@pytest.fixture
def cuda():
    pytest.importorskip("cuda.bindings.runtime")
    dev = CudaDevice(0)
    rt = dev.runtime
    err, ptr = rt.cudaMalloc(4096)
    assert int(err) == 0
    yield dev, int(ptr)
    rt.cudaFree(ptr)
    dev.close()


@pytest.mark.parametrize("own_stream", [True, False], ids=["created", "legacy"])
def test_round_trip(cuda, own_stream):
    dev, ptr = cuda
    stream = dev.create_stream() if own_stream else 0
    try:
        data = bytes(range(256)) * 16
        dev.copy_to_device(ptr, data, stream)
        assert dev.copy_to_host(ptr, len(data), stream) == data
        dev.copy_to_device(ptr + 8, b"\x07" * 8, stream)
        assert dev.copy_to_host(ptr, 24, stream) == data[:8] + b"\x07" * 8 + data[16:24]
        assert dev.copy_to_host(ptr, 0, stream) == b""
    finally:
        if own_stream:
            dev.destroy_stream(stream)


def test_copy_waits_for_earlier_work_on_the_stream(cuda):
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("torch has no GPU support here")
    dev, _ = cuda
    s = torch.cuda.Stream(device=0)
    x = torch.zeros(8, dtype=torch.uint8, device="cuda:0")
    with torch.cuda.stream(s):
        torch.cuda._sleep(200 * 2_000_000)  # about 200 ms
        x.fill_(9)  # queued after the sleep on s
    assert dev.copy_to_host(x.data_ptr(), 8, s.cuda_stream) == b"\x09" * 8


def test_bad_arguments(cuda):
    dev, ptr = cuda
    with pytest.raises(ValueError, match="device pointer"):
        dev.copy_to_device(0, b"x", 0)
    with pytest.raises(ValueError, match="size"):
        dev.copy_to_host(ptr, -1, 0)


def test_broadcast_bytes_on_nccl():
    import pycoll

    comm = pycoll.init(0, 1, backend="nccl", device=0, timeout=60, init_timeout=60)
    try:
        assert comm.broadcast_bytes(b"decision", 8) == b"decision"
        assert comm.broadcast_bytes(bytes(range(200)), 200) == bytes(range(200))  # the buffer grows
        with pytest.raises(ValueError, match="nbytes"):
            comm.broadcast_bytes(b"", 0)
        with pytest.raises(ValueError, match="root must pass"):
            comm.broadcast_bytes(b"abc", 8)
    finally:
        comm.destroy()
