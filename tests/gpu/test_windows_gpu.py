"""Issue 13 on a real NVIDIA GPU: registration, windows over ``mem_alloc(like="torch")`` memory,
put/wait-signal between two ranks on one GPU (NCCL >= 2.30, NCCL_MULTI_RANK_GPU_ENABLE=1),
properties, ``from_handle`` (a raw bindings communicator; torch's ProcessGroupNCCL where it exposes
``_comm_ptr()``), ``ncclDevCommCreate`` with requirements and a per-call CollConfig. Skipped
(module-level) without a CUDA GPU; the multi-rank test's name has ``two_ranks`` so that
benchmarks/gpu_check.sh runs it in its multi-rank step."""

from __future__ import annotations

import os

import pytest
from helpers.mp import run_ranks

import pycoll
import pycoll.bindings
from pycoll.devices import cuda_device_count

pytestmark = [pytest.mark.gpu, pytest.mark.timeout(120)]

if cuda_device_count() == 0:
    pytest.skip("no CUDA GPU (pycoll.devices.cuda_device_count() is 0)", allow_module_level=True)

os.environ.setdefault("NCCL_SOCKET_IFNAME", "lo")

from test_gpu import MULTI_RANK_ENV, _multi_rank_comm, _nccl, _one_rank, _torch  # noqa: E402


def test_register_and_refusals_on_cuda():
    _nccl()
    torch = _torch()
    comm = _one_rank(blocking=True)
    try:
        x = torch.ones(1024, device="cuda:0")
        with comm.register(x) as reg:
            assert reg.ptr == x.data_ptr() and reg.nbytes == 4096 and not reg.closed
        assert reg.closed
        with pytest.raises(ValueError, match="cpu"):
            comm.register(torch.ones(8))
        with pytest.raises(ValueError, match="contiguous"):
            comm.register(torch.ones(8, 8, device="cuda:0").t())
        kept = comm.register(x)
    finally:
        comm.destroy()
    assert kept.closed
    with pytest.raises(pycoll.CommStateError):
        _ = kept.handle


def test_window_over_mem_alloc_torch_and_properties():
    lib = _nccl()
    torch = _torch()
    v = tuple(lib.version_tuple)
    comm = _one_rank(blocking=True)
    try:
        if v >= (2, 29, 0):
            p = comm.properties
            assert (p.rank, p.n_ranks, p.cuda_dev) == (0, 1, 0)
        else:
            with pytest.raises(pycoll.NotSupported, match=r"ncclCommQueryProperties.*2\.29"):
                _ = comm.properties
        a = comm.mem_alloc((256,), "float32", like="torch")
        assert isinstance(a, torch.Tensor) and a.is_cuda and a.shape == (256,)
        a.fill_(3.0)
        try:
            win = comm.register_window(a)
        except pycoll.NCCLError as e:  # symmetric windows need a capable GPU/driver
            pytest.skip(f"ncclCommWindowRegister refused here: {e}")
        with win:
            if v >= (2, 29, 0):
                assert win.user_ptr == a.data_ptr()
                assert win.peer_pointer(0) != 0
            else:  # the device API's pointer queries came with 2.29
                with pytest.raises(pycoll.NotSupported, match=r"ncclGetPeerDevicePointer.*2\.29"):
                    win.peer_pointer(0)
            if v >= (2, 29, 7):
                stats = comm.memory_stats()
                assert stats.total >= stats.persistent >= 0
            else:
                with pytest.raises(pycoll.NotSupported, match=r"ncclCommMemStats.*2\.29\.7"):
                    comm.memory_stats()
        assert win.closed and float(a[0]) == 3.0
    finally:
        comm.destroy()


def test_dev_comm_create_with_requirements_succeeds_or_fails_typed():
    lib = _nccl()
    comm = _one_rank(blocking=True)
    try:
        req = pycoll.bindings.DevCommRequirements(lsaBarrierCount=1)
        try:
            dc = lib.dev_comm_create(comm.handle, req)
        except (pycoll.NCCLError, pycoll.NotSupported) as e:  # NotSupported: NCCL < 2.29 (another layout)
            assert "ncclDevCommCreate" in str(e), e
            assert isinstance(e, pycoll.NotSupported) == (tuple(lib.version_tuple) < (2, 29, 0)), e
            return
        lib.dev_comm_destroy(comm.handle, dc)
    finally:
        comm.destroy()


def test_collconfig_on_all_reduce():
    lib = _nccl()
    torch = _torch()
    comm = _one_rank(blocking=True)
    try:
        x = torch.full((4096,), 2.0, device="cuda:0")
        cfg = pycoll.CollConfig(min_ctas=1, max_ctas=2)
        try:
            comm.all_reduce(x, config=cfg)
        except pycoll.NotSupported as e:
            assert tuple(lib.version_tuple) < (2, 31, 0), e
            pytest.skip(f"no ncclCollConfig in NCCL {lib.version_tuple}: {e}")
        torch.cuda.synchronize()
        assert float(x[0]) == 2.0 and float(x[-1]) == 2.0
    finally:
        comm.destroy()


def test_from_handle_of_a_raw_bindings_communicator():
    lib = _nccl()
    torch = _torch()
    raw = lib.comm_init_rank(1, lib.get_unique_id(), 0)
    try:
        comm = pycoll.Communicator.from_handle(raw, library=lib, timeout=30)
        assert (comm.rank, comm.size, comm.owns_handle, comm.device.device_id) == (0, 1, False, 0)
        x = torch.full((16,), 5.0, device="cuda:0")
        comm.all_reduce(x)
        assert float(x[0]) == 5.0
        comm.destroy()
        assert lib.comm_user_rank(raw) == 0  # not destroyed: its maker owns it
    finally:
        lib.comm_destroy(raw)
    with pytest.raises(ValueError, match="not a live communicator"):
        pycoll.Communicator.from_handle(raw, library=lib)


def test_from_handle_of_torch_process_group_nccl(tmp_path):
    lib = _nccl()
    torch = _torch()
    import torch.distributed as dist

    if not dist.is_nccl_available():
        pytest.skip("torch has no NCCL backend")
    store = dist.FileStore(str(tmp_path / "store"), 1)
    dist.init_process_group("nccl", store=store, rank=0, world_size=1, device_id=torch.device("cuda", 0))
    try:
        pg = dist.distributed_c10d._get_default_group()._get_backend(torch.device("cuda", 0))
        x = torch.ones(4, device="cuda:0")
        dist.all_reduce(x)  # makes the NCCL communicator
        if not callable(getattr(pg, "_comm_ptr", None)):
            pytest.skip("this torch's ProcessGroupNCCL has no _comm_ptr()")
        try:
            comm = pycoll.Communicator.from_handle(pg, library=lib, timeout=30)
        except ValueError as e:  # torch linked its own libnccl: the handle is not of pycoll's library
            pytest.skip(f"torch's communicator is not of {lib.path}: {e}")
        x.fill_(7.0)
        comm.all_reduce(x)
        assert float(x[0]) == 7.0 and not comm.owns_handle
        comm.destroy()
    finally:
        dist.destroy_process_group()


def _rank_put_signal(rank, n, tmp):
    lib, comm, skip = _multi_rank_comm(rank, n, tmp)
    if skip:
        return {"skip": skip}
    import torch

    out = {}
    try:
        p = comm.properties
        out["props"] = (p.rank, p.n_ranks, p.cuda_dev)
        mem = comm.mem_alloc(64, "float32", like="torch")
        mem.zero_()
        torch.cuda.synchronize()
        try:
            win = comm.register_window(mem, flags=pycoll.bindings.WIN_COLL_SYMMETRIC)
        except pycoll.NCCLError as e:
            comm.abort()
            return {"skip": f"ncclCommWindowRegister refused: {e}"}
        peer = 1 - rank
        src = torch.arange(8, device="cuda:0", dtype=torch.float32) + 100.0 * (rank + 1)
        side = torch.cuda.Stream()
        for stream in (None, side.cuda_stream):  # torch's current stream, then a side stream
            try:
                comm.put_signal(win, 32 * rank, src, peer, stream=stream)
                comm.wait_signal(peer, stream=stream)
            except pycoll.NotSupported as e:
                comm.abort()
                return {"skip": f"no one-sided operations: {e}"}
            torch.cuda.synchronize()
            out.setdefault("data", []).append(mem[8 * peer:8 * peer + 8].cpu().tolist())
        comm.barrier()
        win.close()
    except BaseException:
        comm.abort()
        raise
    comm.destroy()
    return out


@pytest.mark.timeout(150)
def test_put_signal_wait_signal_two_ranks_on_one_gpu(tmp_path):
    res = run_ranks(_rank_put_signal, 2, str(tmp_path), timeout=100, env=MULTI_RANK_ENV)
    if "skip" in res[0] or "skip" in res[1]:
        pytest.skip(res[0].get("skip") or res[1].get("skip"))
    for rank, r in enumerate(res):
        peer = 1 - rank
        want = [100.0 * (peer + 1) + i for i in range(8)]
        assert r["props"] == (rank, 2, 0) and r["data"] == [want, want], (rank, r)
