"""The bindings against the real libnccl on a GPU: a one-rank nonblocking communicator.

Skipped without an NVIDIA GPU. Run on a GPU machine with ``python -m pytest -q -m gpu tests/``.
"""

from __future__ import annotations

import os
import time

import pytest

import pycoll
from pycoll._bindings import _nccl

pytestmark = [pytest.mark.gpu, pytest.mark.timeout(120)]

if not (os.path.exists("/dev/nvidia0") or os.path.exists("/dev/nvidiactl")):
    pytest.skip("no NVIDIA GPU on this machine", allow_module_level=True)


def _wait(lib, comm, timeout=60.0):
    deadline = time.monotonic() + timeout
    while True:
        state = lib.comm_get_async_error(comm)
        if state != _nccl.IN_PROGRESS:
            return state
        if time.monotonic() > deadline:
            lib.comm_abort(comm)
            pytest.fail(f"communicator still in progress after {timeout} s")
        time.sleep(0.001)


@pytest.fixture
def comm():
    os.environ.setdefault("NCCL_SOCKET_IFNAME", "lo")
    try:
        lib = _nccl.load("nccl")
    except pycoll.LibraryError as exc:
        pytest.skip(f"no libnccl: {exc}")
    comm, status = lib.comm_init_rank_config(1, lib.get_unique_id(), 0, _nccl.Config(blocking=0, commName="gpu-test"))
    assert comm != 0 and status in (_nccl.SUCCESS, _nccl.IN_PROGRESS)
    assert _wait(lib, comm) == _nccl.SUCCESS
    yield lib, comm
    lib.comm_abort(comm)


def test_queries(comm):
    lib, c = comm
    assert lib.comm_count(c) == 1
    assert lib.comm_user_rank(c) == 0
    assert lib.comm_cu_device(c) >= 0


def test_all_reduce_on_nccl_memory_then_finalize(comm):
    lib, c = comm
    ptr = lib.mem_alloc(1 << 20)
    assert ptr != 0
    try:
        status = lib.all_reduce(ptr, ptr, (1 << 20) // 4, _nccl.DataType.Float32, _nccl.RedOp.Sum, c, 0)
        assert status in (_nccl.SUCCESS, _nccl.IN_PROGRESS)
        assert _wait(lib, c) == _nccl.SUCCESS
        assert lib.comm_finalize(c) in (_nccl.SUCCESS, _nccl.IN_PROGRESS)
        assert _wait(lib, c) == _nccl.SUCCESS
    finally:
        lib.mem_free(ptr)


def test_all_reduce_values_with_torch(comm):
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("torch without CUDA")
    lib, c = comm
    x = torch.arange(1024, dtype=torch.float32, device=f"cuda:{lib.comm_cu_device(c)}")
    stream = torch.cuda.current_stream(x.device)
    lib.all_reduce(x.data_ptr(), x.data_ptr(), x.numel(), _nccl.DataType.Float32, _nccl.RedOp.Sum, c,
                   stream.cuda_stream)
    assert _wait(lib, c) == _nccl.SUCCESS
    stream.synchronize()
    assert torch.equal(x.cpu(), torch.arange(1024, dtype=torch.float32))


def test_nonblocking_split(comm):
    lib, c = comm
    slot, status = lib.comm_split(c, 0, 0)
    assert _wait(lib, c) == _nccl.SUCCESS
    child = slot.value
    assert child != 0 and not slot.pending
    assert _wait(lib, child) == _nccl.SUCCESS
    assert lib.comm_count(child) == 1
    lib.comm_abort(child)
