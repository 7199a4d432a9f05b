"""pycoll on a real NVIDIA GPU with NCCL: communicators, every collective, abort, CUDA graphs,
two ranks on one GPU and shrink. Skipped (module-level) without a CUDA GPU.

Run on a GPU machine with ``python -m pytest -q tests/gpu/test_gpu.py`` (benchmarks/gpu_check.sh does,
with timeouts). What needs which NCCL:

* everything single-rank: any NCCL pycoll supports;
* two ranks on one GPU (``NCCL_MULTI_RANK_GPU_ENABLE=1``, ``NCCL_MAX_CTAS`` limited): NCCL >= 2.30;
  older libraries refuse a duplicated GPU, so those tests skip with the version found;
* shrink: NCCL >= 2.27 (and the two ranks above).

torch is imported inside the tests, never at module level, so that the rank processes load
pycoll's NCCL (``$PYCOLL_NCCL_LIBRARY`` or the nvidia-nccl wheel) before torch binds its own.
"""

from __future__ import annotations

import os
import time

import numpy as np
import pytest
from helpers.mp import run_ranks

import pycoll
from pycoll.devices import cuda_device_count

pytestmark = [pytest.mark.gpu, pytest.mark.timeout(120)]

if cuda_device_count() == 0:
    pytest.skip("no CUDA GPU (pycoll.devices.cuda_device_count() is 0)", allow_module_level=True)

os.environ.setdefault("NCCL_SOCKET_IFNAME", "lo")

MULTI_RANK_ENV = {
    "NCCL_MULTI_RANK_GPU_ENABLE": "1",  # NCCL >= 2.30: several ranks of one communicator on one GPU
    "NCCL_MAX_CTAS": "2",  # each rank allocates its own channels; fewer keep two ranks from starving
    "NCCL_SOCKET_IFNAME": "lo",
    "NCCL_DEBUG": "WARN",
}


# -- helpers ------------------------------------------------------------------------------------------


def _nccl():
    try:
        return pycoll._bindings.load()
    except pycoll.LibraryError as exc:
        pytest.skip(f"no libnccl: {exc}")


def _torch():
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("torch has no CUDA support here")
    return torch


def _cupy():
    cupy = pytest.importorskip("cupy")
    try:
        if cupy.cuda.runtime.getDeviceCount() < 1:
            pytest.skip("cupy sees no GPU")
    except Exception as exc:  # cupy built for another CUDA, no driver, ...
        pytest.skip(f"cupy cannot use the GPU: {exc}")
    return cupy


def _one_rank(blocking=False, **kw):
    return pycoll.init(0, 1, backend="nccl", device=0, config=pycoll.CommConfig(blocking=blocking),
                       timeout=60, init_timeout=60, **kw)


def _version(lib):
    return tuple(lib.version_tuple)


def _same(got, want, what):
    got, want = np.asarray(got), np.asarray(want)
    assert got.shape == want.shape and np.array_equal(got, want), (
        f"{what}: got {got.ravel()[:8]}... (shape {got.shape}), expected {want.ravel()[:8]}... (shape {want.shape})")


# -- one rank -----------------------------------------------------------------------------------------


@pytest.mark.parametrize("blocking", [True, False], ids=["blocking", "nonblocking"])
def test_one_rank_init(blocking):
    lib = _nccl()
    comm = _one_rank(blocking)
    try:
        assert (comm.rank, comm.size, comm.backend, comm.state) == (0, 1, "nccl", "active")
        assert comm.library.kind in ("nccl", "rccl"), comm.library.path
        assert lib.comm_count(comm.handle) == 1 and lib.comm_user_rank(comm.handle) == 0
        assert lib.comm_cu_device(comm.handle) == 0
        assert lib.comm_get_async_error(comm.handle) == 0
    finally:
        comm.destroy()
    assert comm.state == "destroyed"


def _torch_collectives(comm, torch, dtype):
    """Every collective on one rank, on torch's current stream; returns the checks run."""
    dev = torch.device("cuda", 0)
    n = 64
    x = torch.arange(n, device=dev).to(dtype)
    want = x.cpu()
    checks = []

    def out():
        return torch.full((n,), -1, device=dev).to(dtype)

    y = x.clone()
    comm.all_reduce(y)
    checks.append(("all_reduce in place", y, want))
    o = out()
    comm.all_reduce(x, o, op="max")
    checks.append(("all_reduce max", o, want))
    o = out()
    comm.broadcast(x, 0, o)
    checks.append(("broadcast", o, want))
    o = out()
    comm.reduce(x, 0, o)
    checks.append(("reduce", o, want))
    o = out()
    comm.all_gather(x, o)
    checks.append(("all_gather", o, want))
    o = out()
    comm.reduce_scatter(x, o)
    checks.append(("reduce_scatter", o, want))
    o = out()
    comm.all_to_all(x, o)
    checks.append(("all_to_all", o, want))
    o = out()
    comm.gather(x, o, 0)
    checks.append(("gather", o, want))
    o = out()
    comm.scatter(x, o, 0)
    checks.append(("scatter", o, want))
    o = out()
    with comm.group():
        comm.send(x, 0)
        comm.recv(o, 0)
    checks.append(("send/recv to self", o, want))
    o = out()
    comm.sendrecv(x, o, 0)
    checks.append(("sendrecv with self", o, want))
    o = out()
    work = comm.all_reduce(x, o, async_op=True)
    work.wait(timeout=60)
    assert work.is_completed() and work.exception() is None
    checks.append(("all_reduce async_op", o, want))
    comm.barrier()
    for name, got, expect in checks:
        _same(got.float().cpu().numpy(), expect.float().numpy(), f"{name} ({dtype})")
    return [c[0] for c in checks]


def test_every_collective_on_torch_tensors_on_the_current_stream():
    torch = _torch()
    comm = _one_rank()
    try:
        side = torch.cuda.Stream()
        with torch.cuda.stream(side):  # a non-default current stream: pycoll must run on it
            for dtype in (torch.float32, torch.bfloat16, torch.int8):
                done = _torch_collectives(comm, torch, dtype)
        torch.cuda.synchronize()
        assert len(done) == 12
    finally:
        comm.destroy()


def test_every_collective_on_cupy_arrays_on_the_current_stream():
    cupy = _cupy()
    comm = _one_rank()
    try:
        with cupy.cuda.Stream(non_blocking=True):
            x = cupy.arange(48, dtype=cupy.float32)
            results = {}
            for name, fn in {
                "all_reduce": lambda o: comm.all_reduce(x, o),
                "broadcast": lambda o: comm.broadcast(x, 0, o),
                "reduce": lambda o: comm.reduce(x, 0, o),
                "all_gather": lambda o: comm.all_gather(x, o),
                "reduce_scatter": lambda o: comm.reduce_scatter(x, o),
                "all_to_all": lambda o: comm.all_to_all(x, o),
                "gather": lambda o: comm.gather(x, o, 0),
                "scatter": lambda o: comm.scatter(x, o, 0),
            }.items():
                o = cupy.full(48, -1, dtype=cupy.float32)
                fn(o)
                results[name] = o
            y = cupy.full(48, -1, dtype=cupy.float32)
            with comm.group():
                comm.send(x, 0)
                comm.recv(y, 0)
            results["send/recv"] = y
            want = cupy.asnumpy(x)
            for name, o in results.items():
                _same(cupy.asnumpy(o), want, f"{name} (cupy)")
    finally:
        comm.destroy()


def test_abort_of_a_nonblocking_communicator():
    torch = _torch()
    comm = _one_rank(blocking=False)
    x = torch.ones(1 << 20, device="cuda:0")
    work = comm.all_reduce(x, async_op=True)
    t0 = time.monotonic()
    comm.abort()
    assert time.monotonic() - t0 < 30, "ncclCommAbort took longer than 30 s"
    assert comm.state == "aborted"
    try:
        work.wait(timeout=10)  # finished before the abort, or failed by it
    except pycoll.CommAborted:
        pass
    with pytest.raises(pycoll.CommAborted):
        comm.all_reduce(x)
    comm.abort()  # idempotent
    torch.cuda.synchronize()  # the device is still usable
    again = _one_rank()
    try:
        y = torch.ones(8, device="cuda:0")
        again.all_reduce(y)
        _same(y.cpu().numpy(), np.ones(8, np.float32), "all_reduce on a new communicator after an abort")
    finally:
        again.destroy()


def test_cuda_graph_capture_and_replay_of_an_allreduce():
    """Captured through the bindings on torch's capture stream; each replay doubles x (PreMulSum 2)."""
    torch = _torch()
    comm = _one_rank()
    lib, h = comm.library, comm.handle
    try:
        op = comm.pre_mul_sum(2.0, torch.float32)
        x = torch.ones(1024, device="cuda:0")
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):  # one eager run first: NCCL sets up lazily, never during capture
            lib.all_reduce(x.data_ptr(), x.data_ptr(), x.numel(), 7, op.op, h, side.cuda_stream)
        side.synchronize()
        _same(x.cpu().numpy(), np.full(1024, 2, np.float32), "eager PreMulSum(2) all_reduce")
        x.fill_(1)
        torch.cuda.synchronize()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, stream=side):
            status = lib.all_reduce(x.data_ptr(), x.data_ptr(), x.numel(), 7, op.op, h,
                                    torch.cuda.current_stream().cuda_stream)
        assert status in (0, 7), f"ncclAllReduce under capture returned {status}"
        torch.cuda.synchronize()
        _same(x.cpu().numpy(), np.ones(1024, np.float32), "x after capture (nothing may run yet)")
        for _ in range(3):
            graph.replay()
        torch.cuda.synchronize()
        _same(x.cpu().numpy(), np.full(1024, 8, np.float32), "x after 3 replays")
        op.destroy()
    finally:
        comm.destroy()


def test_cuda_graph_capture_through_the_communicator():
    """A collective enqueued while its stream captures: recorded as captured, no events, no deadline."""
    torch = _torch()
    comm = _one_rank()
    try:
        op = comm.pre_mul_sum(2.0, torch.float32)
        x = torch.ones(256, device="cuda:0")
        side = torch.cuda.Stream()
        with torch.cuda.stream(side):
            comm.all_reduce(x, op=op)  # eager first: NCCL sets up lazily, never during capture
        x.fill_(1)
        torch.cuda.synchronize()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, stream=side):
            w = comm.all_reduce(x, op=op, async_op=True)
        assert w.state == "captured" and w.capture_id is not None and comm.outstanding() == []
        graph.replay()
        replay = comm.watch_stream(side)  # a deadline on the replay
        graph.replay()
        replay.wait(timeout=30)
        torch.cuda.synchronize()
        _same(x.cpu().numpy(), np.full(256, 4, np.float32), "x after 2 replays")
        op.destroy()
    finally:
        comm.abort()


def _sleep_kernel(torch, stream, seconds=0.5):
    """Keep ``stream`` busy (torch.cuda._sleep spins ~cycles; calibrated roughly for a modern GPU)."""
    with torch.cuda.stream(stream):
        torch.cuda._sleep(int(seconds * 2e9))


@pytest.mark.parametrize("where", ["default_stream", "current_stream", "side_stream"])
def test_collective_is_outstanding_until_its_stream_gets_there(where):
    """The known issue: on torch's default stream an op was marked completed at enqueue."""
    torch = _torch()
    comm = _one_rank()
    try:
        x = torch.ones(1 << 16, device="cuda:0")
        side = torch.cuda.Stream()
        if where == "default_stream":
            stream, kwargs = torch.cuda.default_stream(), {}
        elif where == "current_stream":
            stream, kwargs = side, {}
        else:
            stream, kwargs = side, {"stream": side}
        ctx = torch.cuda.stream(side) if where == "current_stream" else torch.cuda.stream(torch.cuda.current_stream())
        with ctx:
            _sleep_kernel(torch, stream)
            w = comm.all_reduce(x, async_op=True, **kwargs)
            assert not w.is_completed() and comm.outstanding() == [w], where
            w.wait(timeout=60)
        assert w.state == "completed"
        torch.cuda.synchronize()
    finally:
        comm.destroy()


def test_hung_default_stream_op_times_out_and_abort_unblocks_it(monkeypatch):
    """The CommTimeout comes with the policy applied: once ncclCommAbort returned, or once
    PYCOLL_ABORT_TIMEOUT left it behind. Here it cannot return before the sleep ends (5 s: NCCL frees
    the communicator's memory, which waits for the device), so the limit (1.5 s) decides."""
    monkeypatch.setenv("PYCOLL_ABORT_TIMEOUT", "1.5")
    torch = _torch()
    comm = pycoll.init(0, 1, backend="nccl", device=0, timeout=1.0, init_timeout=60)
    try:
        x = torch.ones(1 << 16, device="cuda:0")
        comm.all_reduce(x)  # NCCL's lazy setup of the first collective, out of the way
        torch.cuda.synchronize()
        _sleep_kernel(torch, torch.cuda.default_stream(), seconds=5.0)  # longer than the op's deadline
        t0 = time.monotonic()
        with pytest.raises(pycoll.CommTimeout):
            comm.all_reduce(x)  # blocking, on the default stream
        took = time.monotonic() - t0
        assert 1.0 <= took < 4.0, took
        assert comm.state == "aborted"
    finally:
        comm.abort()
        torch.cuda.synchronize()


def test_explicit_stream_is_ordered_after_the_tensors_producer():
    """F9: a torch tensor written on the current stream, reduced on another stream given as stream=."""
    torch = _torch()
    comm = _one_rank()
    try:
        x = torch.zeros(1 << 16, device="cuda:0")
        out = torch.zeros_like(x)
        side = torch.cuda.Stream()
        _sleep_kernel(torch, torch.cuda.current_stream(), seconds=0.3)
        x.fill_(7)  # on the current stream, after the sleep
        comm.all_reduce(x, out, stream=side)
        torch.cuda.synchronize()
        _same(out.cpu().numpy(), np.full(1 << 16, 7, np.float32), "out")
    finally:
        comm.destroy()


# -- two ranks on one GPU -----------------------------------------------------------------------------


def _share_uid(rank, lib, path, timeout=60.0):
    """Rank 0 writes a fresh unique id to ``path``; the others read it (the bootstrap root lives in rank 0)."""
    if rank == 0:
        uid = lib.get_unique_id()
        with open(path + ".tmp", "wb") as f:
            f.write(bytes(uid))
        os.replace(path + ".tmp", path)
        return uid
    deadline = time.monotonic() + timeout
    while not os.path.exists(path):
        if time.monotonic() > deadline:
            raise TimeoutError(f"rank {rank}: no unique id from rank 0 in {path} after {timeout} s")
        time.sleep(0.01)
    with open(path, "rb") as f:
        return pycoll.UniqueId.from_bytes(f.read())


def _wait_file(path, timeout=80.0):
    deadline = time.monotonic() + timeout
    while not os.path.exists(path):
        if time.monotonic() > deadline:
            raise TimeoutError(f"{path} did not appear within {timeout} s")
        time.sleep(0.01)


def _multi_rank_comm(rank, n, tmp):
    """Load NCCL before torch, check its version, create the 2-rank communicator on GPU 0."""
    lib = pycoll._bindings.load()
    if _version(lib) < (2, 30, 0):
        return lib, None, (f"NCCL {'.'.join(map(str, lib.version_tuple))} at {lib.path} "
                           "has no multi-rank GPU support (2.30+)")
    uid = _share_uid(rank, lib, os.path.join(tmp, "uid"))
    comm = pycoll.init(rank, n, unique_id=uid, library=lib, device=0, timeout=60, init_timeout=60)
    return lib, comm, None


def _rank_collectives(rank, n, tmp):
    lib, comm, skip = _multi_rank_comm(rank, n, tmp)
    if skip:
        return {"skip": skip}
    import torch

    dev = torch.device("cuda", 0)
    out = {"version": list(lib.version_tuple), "path": lib.path}
    try:
        x = torch.full((1000,), float(rank + 1), device=dev)
        comm.all_reduce(x)
        out["all_reduce"] = x[:4].cpu().tolist()
        g = torch.empty(2 * 1000, device=dev)
        comm.all_gather(torch.full((1000,), float(10 + rank), device=dev), g)
        out["all_gather"] = [float(g[0]), float(g[-1])]
        r = torch.empty(500, device=dev)
        comm.reduce_scatter(torch.arange(1000, device=dev, dtype=torch.float32), r)
        out["reduce_scatter"] = [float(r[0]), float(r[-1])]
        b = torch.full((100,), float(rank), device=dev)
        comm.broadcast(b, 1)
        out["broadcast"] = float(b[0])
        recv = torch.zeros(100, device=dev)
        with comm.group():
            comm.send(torch.full((100,), float(rank + 100), device=dev), 1 - rank)
            comm.recv(recv, 1 - rank)
        out["recv"] = float(recv[0])
        comm.barrier()
    except BaseException:
        comm.abort()
        raise
    comm.destroy()
    return out


@pytest.mark.timeout(150)
def test_two_ranks_on_one_gpu(tmp_path):
    res = run_ranks(_rank_collectives, 2, str(tmp_path), timeout=100, env=MULTI_RANK_ENV)
    if "skip" in res[0]:
        pytest.skip(res[0]["skip"])
    for rank, r in enumerate(res):
        assert r["all_reduce"] == [3.0] * 4, (rank, r)
        assert r["all_gather"] == [10.0, 11.0], (rank, r)
        # sum over 2 ranks of arange(1000), block `rank` of 500
        assert r["reduce_scatter"] == [2.0 * 500 * rank, 2.0 * (500 * rank + 499)], (rank, r)
        assert r["broadcast"] == 1.0 and r["recv"] == 100.0 + (1 - rank), (rank, r)


def _rank_shrink(rank, n, tmp):
    lib, comm, skip = _multi_rank_comm(rank, n, tmp)
    if skip:
        return {"skip": skip}
    import torch

    done = os.path.join(tmp, "shrunk")
    x = torch.ones(64, device="cuda:0")
    comm.all_reduce(x)
    out = {"before": float(x[0])}
    if rank == 0:
        child = comm.shrink([1], timeout=60)
        try:
            out["child"] = (child.rank, child.size)
            y = torch.full((64,), 5.0, device="cuda:0")
            child.all_reduce(y)
            out["child_all_reduce"] = float(y[0])
        finally:
            child.destroy()
        open(done, "w").close()
    else:
        _wait_file(done)  # the excluded rank does not call shrink; it keeps its parent until the survivor is done
    comm.abort()
    return out


@pytest.mark.timeout(150)
def test_shrink_from_two_ranks_to_one(tmp_path):
    res = run_ranks(_rank_shrink, 2, str(tmp_path), timeout=100, env=MULTI_RANK_ENV)
    if "skip" in res[0]:
        pytest.skip(res[0]["skip"])
    assert res[0]["before"] == 2.0 and res[1]["before"] == 2.0
    assert res[0]["child"] == (0, 1)
    assert res[0]["child_all_reduce"] == 5.0


def _rank_abort_hung(rank, n, tmp):
    lib, comm, skip = _multi_rank_comm(rank, n, tmp)
    if skip:
        return {"skip": skip}
    import torch

    aborted = os.path.join(tmp, "aborted")
    x = torch.ones(1 << 16, device="cuda:0")
    comm.all_reduce(x)  # connected and working
    if rank == 1:  # never joins the second all_reduce
        _wait_file(aborted)
        comm.abort()
        return {}
    work = comm.all_reduce(x, async_op=True)
    time.sleep(1.0)
    hung = not work.is_completed()
    t0 = time.monotonic()
    comm.abort()
    took = time.monotonic() - t0
    open(aborted, "w").close()
    try:
        work.wait(timeout=10)
        failed = None
    except pycoll.CommAborted as exc:
        failed = type(exc).__name__
    return {"hung": hung, "abort_s": took, "failed": failed}


@pytest.mark.timeout(150)
def test_abort_unblocks_a_hung_collective(tmp_path):
    res = run_ranks(_rank_abort_hung, 2, str(tmp_path), timeout=100, env=MULTI_RANK_ENV)
    if "skip" in res[0]:
        pytest.skip(res[0]["skip"])
    r = res[0]
    assert r["hung"], "the all_reduce completed although rank 1 never joined it"
    assert r["abort_s"] < 30, f"ncclCommAbort took {r['abort_s']:.1f} s"
    assert r["failed"] == "CommAborted", r
