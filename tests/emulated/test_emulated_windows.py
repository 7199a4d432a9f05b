"""Issue 13 on the emulated GPU (two ranks in real processes, rank r on emulated device r): buffer
registration of CUDA-like arrays, symmetric memory from ``comm.mem_alloc``/``SymmetricPool`` as
CUDA-like arrays, windows with put/signal/wait-signal on the device's streams, a hung wait-signal
timed out, properties, ``from_handle`` and the getters only a GPU implements."""

from __future__ import annotations

import ctypes
import os
import time

import emu_helpers as H
import numpy as np
import pytest

pytestmark = pytest.mark.emulated_gpu


def _setup(rank, n, uid, **kw):
    return H.setup(rank, n, uid, device=rank, **kw)


class _Strided:
    """A CUDA array (``__cuda_array_interface__``) viewing every other float32 of ``base``."""

    def __init__(self, base):
        self.base = base
        self.__cuda_array_interface__ = {"shape": (base.host.size // 2,), "typestr": "<f4", "version": 3,
                                         "data": (base.host.ctypes.data, False), "strides": (8,), "stream": 1}


# -- registration ------------------------------------------------------------------------------------


def _register(rank, n, uid):
    import pycoll
    import pycoll.emulated as emu

    comm, rt = _setup(rank, n, uid)
    out = {}
    t = emu.TorchLikeTensor(rt, np.ones(8, np.float32), device=rank)
    c = emu.CupyLikeArray(rt, np.ones(8, np.float32), device=rank)
    with comm.register(t) as reg:
        out["torch"] = (reg.ptr == t.data_ptr(), reg.nbytes, reg.closed)
    reg2 = comm.register(c)
    out["cupy"] = (reg2.ptr == c.__cuda_array_interface__["data"][0], reg2.nbytes)
    out["closed_after_with"] = reg.closed
    for name, bad in (("numpy", np.ones(8, np.float32)),
                      ("other_device", emu.TorchLikeTensor(rt, np.ones(8, np.float32), device=1 - rank)),
                      ("strided", _Strided(c))):
        try:
            comm.register(bad)
            out[name] = None
        except ValueError as e:
            out[name] = str(e)
    comm.destroy()
    out["released_at_destroy"] = reg2.closed
    try:
        _ = reg2.handle
        out["use_after"] = None
    except pycoll.CommStateError as e:
        out["use_after"] = str(e)
    return out


@pytest.mark.timeout(60)
def test_register_cuda_like_arrays_and_refuse_host_foreign_device_and_strided_ones():
    for rank, r in enumerate(H.run_ranks(_register, 2, H.uid())):
        assert r["torch"] == (True, 32, False) and r["cupy"] == (True, 32) and r["closed_after_with"]
        assert "cpu" in r["numpy"] and "CUDA device memory" in r["numpy"]
        assert f"cuda:{1 - rank}" in r["other_device"] and f"uses device {rank}" in r["other_device"]
        assert "contiguous" in r["strided"]
        assert r["released_at_destroy"] and "communicator destroyed" in r["use_after"]


# -- symmetric memory --------------------------------------------------------------------------------


def _mem_alloc(rank, n, uid):
    import pycoll
    import pycoll.emulated as emu

    comm, rt = _setup(rank, n, uid)
    out = {}
    a = comm.mem_alloc((2, 4), "float32", like="cupy")
    b = comm.mem_alloc(4, "int64", like="torch")
    d = comm.mem_alloc(4)
    out["types"] = [type(x).__name__ for x in (a, b, d)]
    out["devices"] = [x.device for x in (a, b, d)]
    out["shapes"] = [x.shape for x in (a, b, d)]
    out["zero"] = bool(not a.numpy().any() and not b.numpy().any())
    try:
        comm.mem_alloc(4, like="numpy")
        out["numpy"] = None
    except ValueError as e:
        out["numpy"] = str(e)
    a.fill(rank + 1.0)  # a kernel on cupy's current stream writes this rank's part
    a.numpy()
    win = comm.register_window(a)
    out["user_ptr"] = win.user_ptr == a.__cuda_array_interface__["data"][0]
    comm.barrier()
    peer = 1 - rank
    seen = np.ctypeslib.as_array((ctypes.c_float * 8).from_address(win.peer_pointer(peer)))
    out["peer_view"] = seen.tolist()
    comm.barrier()
    # a pool: one window, many arrays, offsets the same on every rank
    pool = pycoll.SymmetricPool(comm, 4096)
    x = pool.empty(16, "float32")
    y = pool.empty((2, 2), "float32", like="cupy")
    out["pool"] = (type(x).__name__, type(y).__name__, pool.offset_of(x), pool.offset_of(y), pool.window.nbytes)
    pool.close()
    win.close()
    comm.destroy()
    out["alive_after_destroy"] = a.numpy().tolist()[0]
    assert isinstance(a, emu.CupyLikeArray)
    return out


@pytest.mark.timeout(60)
def test_mem_alloc_gives_cuda_like_arrays_that_make_windows_and_pools():
    for rank, r in enumerate(H.run_ranks(_mem_alloc, 2, H.uid())):
        assert r["types"] == ["CupyLikeArray", "TorchLikeTensor", "TorchLikeTensor"]
        assert r["devices"] == [rank] * 3 and r["shapes"] == [(2, 4), (4,), (4,)] and r["zero"]
        assert "'torch' or 'cupy'" in r["numpy"]
        assert r["user_ptr"] and r["peer_view"] == [2.0 - rank] * 8
        assert r["pool"] == ("TorchLikeTensor", "CupyLikeArray", 0, 256, 4096)
        assert r["alive_after_destroy"] == [rank + 1.0] * 4


def _mem_alloc_dtypes(rank, n, uid):
    import ml_dtypes
    import torch

    import pycoll

    comm, rt = _setup(rank, n, uid)
    out = {}
    for dt in (torch.float32, torch.bfloat16, torch.float8_e4m3fn, torch.float8_e5m2, "bfloat16", "float",
               "half", np.float16, np.dtype(ml_dtypes.bfloat16)):
        a = comm.mem_alloc(4, dt, like="torch")
        out[repr(dt)] = (type(a).__name__, str(a.host.dtype), a.host.nbytes)
    pool = pycoll.SymmetricPool(comm, 4096)
    p = pool.empty((2, 2), torch.bfloat16, like="torch")
    out["pool"] = (str(p.host.dtype), p.shape)
    for dt in (torch.bfloat16, torch.float8_e5m2):  # DLPack's codes for them: the collective reads the right type
        a = comm.mem_alloc(4, dt, like="torch")
        a.host[...] = rank + 1
        comm.all_reduce(a)
        out[f"sum {dt}"] = a.numpy().astype(np.float32).tolist()
    for dt in (torch.bits8, "bits16", torch.float4_e2m1fn_x2):  # no numpy type: named in a clear error
        try:
            comm.mem_alloc(4, dt, like="torch")
            out[f"bad {dt}"] = None
        except (TypeError, ValueError) as e:
            out[f"bad {dt}"] = f"{type(e).__name__}: {e}"
    for dt in ("bfloat16", torch.bfloat16, "float8_e4m3fn"):  # CuPy has none: refused as allocated, not at a call
        try:
            comm.mem_alloc(4, dt, like="cupy")
            out[f"cupy {dt}"] = None
        except TypeError as e:
            out[f"cupy {dt}"] = str(e)
    pool.close()
    comm.destroy()
    return out


@pytest.mark.timeout(60)
def test_mem_alloc_takes_the_torch_dtypes_and_names_the_gpu_path_takes():
    # the emulated arrays read ``dtype`` with numpy: torch.float32 and "bfloat16" were numpy TypeErrors there, while
    # the host backend and the GPU path take them
    pytest.importorskip("torch")
    pytest.importorskip("ml_dtypes")
    for r in H.run_ranks(_mem_alloc_dtypes, 2, H.uid()):
        assert r["torch.float32"] == r["'float'"] == ("TorchLikeTensor", "float32", 16)  # torch's "float": float32
        assert r["torch.bfloat16"] == r["'bfloat16'"] == r["dtype(bfloat16)"] == ("TorchLikeTensor", "bfloat16", 8)
        assert r["torch.float8_e4m3fn"] == ("TorchLikeTensor", "float8_e4m3fn", 4)
        assert r["torch.float8_e5m2"] == ("TorchLikeTensor", "float8_e5m2", 4)
        assert r["'half'"] == r["<class 'numpy.float16'>"] == ("TorchLikeTensor", "float16", 8)
        assert r["pool"] == ("bfloat16", (2, 2))
        assert r["sum torch.bfloat16"] == r["sum torch.float8_e5m2"] == [3.0] * 4
        for dt in ("torch.bits8", "bits16", "torch.float4_e2m1fn_x2"):
            assert r[f"bad {dt}"] is not None and dt in r[f"bad {dt}"], r[f"bad {dt}"]
        for dt in ("bfloat16", "torch.bfloat16", "float8_e4m3fn"):
            assert "CuPy has no" in (r[f"cupy {dt}"] or ""), r[f"cupy {dt}"]


# -- one-sided operations on the emulated device's streams ---------------------------------------------


def _put_signal(rank, n, uid, kind):
    import pycoll.emulated as emu

    comm, rt = _setup(rank, n, uid)
    st = H.Streams(kind, comm, rt)
    win_mem = comm.mem_alloc(32, "float32", like="torch")
    win = comm.register_window(win_mem)
    peer = 1 - rank
    src = emu.TorchLikeTensor(rt, np.arange(4, dtype=np.float32) + 100.0 * (rank + 1), device=rank)
    src.fill(src.host + 0.5, stream=st.handle if st.handle else 0, delay=0.1)  # a slow producer kernel
    put = comm.put_signal(win, 16 * rank, src, peer, stream=st.arg, async_op=True)
    got = comm.wait_signal(peer, stream=st.arg, async_op=True)
    got.wait()
    put.wait()
    first = win_mem.numpy().tolist()
    # a signal without data, then one wait for several rows at once
    comm.signal(peer, sig_idx=0, stream=st.arg)
    comm.signal(peer, sig_idx=0, stream=st.arg)
    comm.wait_signal([(peer, 2, 0, 0)], stream=st.arg)
    ops = [e["profiling_name"] for e in _fr_entries()]
    win.close()
    comm.destroy()
    return {"data": first, "stream": put.stream == (st.handle or 0), "ops": ops}


def _fr_entries():
    import pycoll

    return pycoll.flight_recorder.get_recorder().as_dict()["entries"]


@pytest.mark.timeout(60)
@pytest.mark.parametrize("kind", ["default_stream", "side_stream"])
def test_put_signal_and_wait_signal_carry_exact_data_on_emulated_streams(kind):
    for rank, r in enumerate(H.run_ranks(_put_signal, 2, H.uid(), kind)):
        peer = 1 - rank
        want = [0.0] * 32
        want[4 * peer:4 * peer + 4] = [100.0 * (peer + 1) + i + 0.5 for i in range(4)]
        assert r["data"] == want and r["stream"]
        assert r["ops"] == [f"nccl:put_signal {rank}->{peer}", f"nccl:wait_signal {rank}<-{peer}",
                            f"nccl:signal {rank}->{peer}", f"nccl:signal {rank}->{peer}",
                            f"nccl:wait_signal {rank}<-{peer}"]


def _hung_wait(rank, n, uid, flag, kind):
    import pycoll

    comm, rt = _setup(rank, n, uid, timeout=0.5)
    if rank == 0:  # stays alive (sends nothing) until rank 1 has timed out
        deadline = time.monotonic() + 20
        while not os.path.exists(flag) and time.monotonic() < deadline:
            time.sleep(0.02)
        return {"rank0": os.path.exists(flag)}
    stream = 0 if kind == "default_stream" else comm.device.create_stream()
    t0 = time.monotonic()
    try:
        comm.wait_signal(0, stream=stream)
        out = None
    except pycoll.CommTimeout as e:
        out = (type(e).__name__, time.monotonic() - t0, "wait_signal" in str(e))
    open(flag, "w").close()
    return {"timeout": out, "state": comm.state}


@pytest.mark.timeout(60)
@pytest.mark.parametrize("kind", ["default_stream", "side_stream"])
def test_a_hung_wait_signal_becomes_comm_timeout_within_its_deadline(tmp_path, kind):
    r0, r1 = H.run_ranks(_hung_wait, 2, H.uid(), str(tmp_path / "timed_out"), kind)
    assert r0 == {"rank0": True}
    name, elapsed, named = r1["timeout"]
    assert name == "CommTimeout" and 0.4 < elapsed < 3.0 and named


# -- properties, from_handle, device-only getters ---------------------------------------------------


def _props_and_adopt(rank, n, uid, uid2):
    import pycoll
    import pycoll.emulated as emu
    from pycoll import _bindings as B

    comm, rt = _setup(rank, n, uid)
    p = comm.properties
    out = {"props": (p.rank, p.n_ranks, p.cuda_dev, comm.device.device_id, p.device_api_support,
                     p.multimem_support)}
    try:
        pycoll.Communicator.from_handle(comm.handle, library=comm.library, device=comm.device)
        out["twice"] = None
    except ValueError as e:
        out["twice"] = str(e)
    lib = comm.library
    raw = lib.comm_init_rank(n, B.UniqueId(uid2), rank)  # made by "someone else" on the current device
    adopted = pycoll.Communicator.from_handle(raw, library=lib, device=emu.device(rank, rt), timeout=10)
    side = adopted.device.create_stream()
    x = emu.TorchLikeTensor(rt, np.full(4, rank + 1.0, np.float32), device=rank)
    adopted.all_reduce(x, stream=side)
    out["adopted"] = (adopted.rank, adopted.size, adopted.properties.cuda_dev, x.numpy().tolist(),
                      adopted.owns_handle)
    adopted.destroy()
    out["raw_alive"] = lib.comm_user_rank(raw) == rank
    lib.comm_destroy(raw)
    try:
        pycoll.Communicator.from_handle(raw, library=lib, device=emu.device(rank, rt))
        out["destroyed"] = None
    except ValueError as e:
        out["destroyed"] = str(e)
    comm.destroy()
    return out


@pytest.mark.timeout(60)
def test_properties_and_from_handle_on_the_emulated_device():
    for rank, r in enumerate(H.run_ranks(_props_and_adopt, 2, H.uid(), H.uid())):
        assert r["props"] == (rank, 2, rank, rank, False, False)
        assert "already wrapped" in r["twice"]
        assert r["adopted"] == (rank, 2, rank, [3.0] * 4, False) and r["raw_alive"]
        assert "not a live communicator" in r["destroyed"]


def _device_only(rank, n, uid):
    import pycoll

    comm, rt = _setup(rank, n, uid)
    win = comm.register_window(comm.mem_alloc(64, "float32"))
    out = {}
    calls = {
        "ncclGetLsaMultimemDevicePointer": lambda: win.multimem_pointer(),
        "ncclGetMultimemDeviceLeInfo": lambda: win.le_info(),
        "ncclGetPeerDeviceLeInfo": lambda: win.le_info(peer=1 - rank),
        "ncclDevCommCreate": lambda: comm.library.dev_comm_create(comm.handle),
    }
    for fn, call in calls.items():
        try:
            call()
            out[fn] = None
        except pycoll.NCCLError as e:
            out[fn] = (type(e).__name__, fn in str(e), "not supported" in str(e))
    out["peer_ok"] = win.peer_pointer(1 - rank) != 0 and win.lsa_pointer(rank) == win.user_ptr
    win.close()
    comm.destroy()
    return out


@pytest.mark.timeout(60)
def test_device_only_getters_refuse_with_ncclInvalidUsage_naming_the_function():
    for r in H.run_ranks(_device_only, 2, H.uid()):
        assert r.pop("peer_ok")
        for fn, got in r.items():
            assert got == ("InvalidUsage", True, True), fn
