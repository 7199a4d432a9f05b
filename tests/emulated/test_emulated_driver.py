"""The operation path's CUDA driver calls (``CudaDevice.driver``: event record and query, capture status, the
current context's device, made from compiled code) on the emulated GPU, whose runtime offers them as ctypes
callbacks: the path calls them instead of the device's methods, falls back to the methods where a call fails or
the thread's context is another device's, and a blocking wait polls only briefly before it sleeps."""

from __future__ import annotations

import ctypes
import time

import emu_helpers as H
import numpy as np
import pytest

pytestmark = [pytest.mark.emulated_gpu, pytest.mark.timeout(60)]

METHODS = ("record_event", "query_event", "capture_id", "swap_current", "restore_current")


def _count_methods(dev):
    """Count the device's method calls of the operation path (instance attributes wrapping the methods). The queries
    that the device's own wait makes (a wait that outlasts the driver's first 100 us goes on in ``wait_event``) are
    counted apart, under ``query_event in wait_event``."""
    counts = dict.fromkeys(METHODS, 0)
    waiting = []
    for name in METHODS:
        method = getattr(dev, name)

        def counted(*args, _name=name, _method=method):
            key = f"{_name} in wait_event" if waiting else _name
            counts[key] = counts.get(key, 0) + 1
            return _method(*args)

        setattr(dev, name, counted)
    wait = dev.wait_event

    def wait_event(*args):
        waiting.append(True)
        try:
            return wait(*args)
        finally:
            waiting.pop()

    dev.wait_event = wait_event
    return counts


def _path_calls(rank, n, uid, device, current):
    import pycoll.emulated as emu
    from pycoll import _core

    comm, rt = H.setup(rank, n, uid, device=device)
    x = emu.TorchLikeTensor(rt, np.ones(4, np.float32), device=device)
    side = comm.device.create_stream()
    comm.all_reduce(x, stream=side)  # the event pool filled, the stream known
    rt.cudaSetDevice(current)  # the calling thread's device from here on
    counts = _count_methods(comm.device)
    out = {"driver": repr(comm.device.driver)}
    for on in (True, False):
        _core.gpu_driver_calls(on)
        for k in list(counts):
            counts[k] = 0
        for _ in range(10):
            comm.all_reduce(x, stream=side)
        out[on] = {k: counts.get(k, 0) for k in METHODS}  # the path's own calls, not the device wait's
    _core.gpu_driver_calls(True)
    out["value"] = x.numpy().tolist()
    out["current"] = rt.cudaGetDevice()[1]
    comm.destroy()
    return out


def test_the_path_calls_the_driver_not_the_device_methods():
    (r,) = H.run_ranks(_path_calls, 1, H.uid(), 0, 0)
    assert r["driver"] == "<CudaDriver from the emulated CUDA runtime>"
    # through the runtime module: two records, a capture check, the device switch and the queries per operation
    assert r[False]["record_event"] == 20 and r[False]["capture_id"] == 10 and r[False]["swap_current"] == 10, r
    assert r[False]["query_event"] >= 10, r
    assert r[True] == dict.fromkeys(METHODS, 0), r  # all of it through the driver's functions
    assert r["value"] == [1.0] * 4  # one rank: the sum is the value itself


def test_a_thread_on_another_device_is_switched_by_the_device_and_back():
    (r,) = H.run_ranks(_path_calls, 1, H.uid(), 1, 0)
    # the driver says the thread's context is device 0's: the device's own switch makes device 1 current and back
    assert r[True]["swap_current"] == 10 and r[True]["restore_current"] == 10, r
    assert r[True]["record_event"] == 0 and r[True]["capture_id"] == 0, r
    assert r["current"] == 0


_FAIL2 = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p)
_FAIL1 = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p)
_FAIL_DEV = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p, ctypes.c_int)


def _failing_driver(rank, n, uid):
    import pycoll.emulated as emu
    from pycoll import _bindings
    from pycoll.devices import CudaDevice

    rt = emu.runtime()
    calls = []

    def fail(*args):
        calls.append(args)
        return 999  # CUDA_ERROR_UNKNOWN

    def device_get(out, ordinal):  # the table is taken (cuDeviceGet succeeds); every other call fails
        ctypes.cast(out, ctypes.POINTER(ctypes.c_int))[0] = ordinal
        return 0

    fns = (_FAIL2(fail), _FAIL1(fail), _FAIL2(fail), _FAIL1(fail), _FAIL_DEV(device_get))
    drv = _bindings.CudaDriver.from_addresses(*(ctypes.cast(f, ctypes.c_void_p).value for f in fns), keep=fns)
    dev = CudaDevice(0, runtime=rt, driver=drv)
    comm, _ = H.setup(rank, n, uid, device=dev)
    counts = _count_methods(dev)
    x = emu.TorchLikeTensor(rt, np.full(4, rank + 1.0, np.float32))
    comm.all_reduce(x)
    comm.all_reduce(x, async_op=True).wait()
    out = {"value": x.numpy().tolist(), "driver_calls": len(calls), "methods": dict(counts)}
    comm.destroy()
    return out


def test_a_failing_driver_call_falls_back_to_the_runtime():
    for r in H.run_ranks(_failing_driver, 2, H.uid()):
        assert r["value"] == [6.0] * 4, r  # (1 + 2), then (3 + 3)
        assert r["driver_calls"] > 0
        # each failed call was made again through the device's methods (which succeeded)
        assert r["methods"]["record_event"] == 4 and r["methods"]["capture_id"] == 2, r
        assert r["methods"]["swap_current"] == 2 and r["methods"]["query_event"] >= 2, r


def _wait_behind_kernel(rank, n, uid):
    import pycoll.emulated as emu

    comm, rt = H.setup(rank, n, uid)
    x = emu.TorchLikeTensor(rt, np.ones(4, np.float32))
    side = comm.device.create_stream()
    comm.all_reduce(x, stream=side)
    rt.sleep(side, 0.4)  # a kernel before the operation on its stream
    t0, c0 = time.monotonic(), time.thread_time()
    comm.all_reduce(x, stream=side)
    out = {"elapsed": time.monotonic() - t0, "cpu": time.thread_time() - c0, "value": x.numpy().tolist()}
    comm.destroy()
    return out


def test_a_blocking_wait_polls_briefly_then_sleeps():
    (r,) = H.run_ranks(_wait_behind_kernel, 1, H.uid())
    assert r["value"] == [1.0] * 4 and r["elapsed"] >= 0.35, r
    # the driver is polled for 100 us, then the device's back-off sleeps: far less CPU than the 0.4 s waited
    assert r["cpu"] < 0.15, r


def _dropped_async(rank, n, uid):
    import gc
    import weakref

    import pycoll.emulated as emu

    comm, rt = H.setup(rank, n, uid)
    side = comm.device.create_stream()
    arrays = []
    for i in range(300):
        x = emu.TorchLikeTensor(rt, np.full(4, float(i), np.float32))
        arrays.append(weakref.ref(x))
        comm.all_reduce(x, stream=side, async_op=True)  # the Work dropped at once
    del x
    rt.sleep(side, 0.3)  # a kernel ahead of the next operations: the oldest of them stays incomplete
    t0 = time.monotonic()
    held = [emu.TorchLikeTensor(rt, np.ones(4, np.float32)) for _ in range(20)]
    for y in held:
        comm.all_reduce(y, stream=side, async_op=True)
    issued = time.monotonic() - t0
    behind = len(comm.outstanding())
    last = emu.TorchLikeTensor(rt, np.ones(4, np.float32))
    comm.all_reduce(last, stream=side, async_op=True).wait()
    for _ in range(8):
        comm.all_reduce(emu.TorchLikeTensor(rt, np.ones(1, np.float32)), stream=side)
    gc.collect()
    out = {"issued s": issued, "behind": behind, "left": len(comm.outstanding()),
           "alive": sum(r() is not None for r in arrays), "last": last.numpy().tolist()}
    comm.destroy()
    return out


def test_dropped_async_operations_are_retired_by_the_issuing_thread_on_a_gpu():
    """On the emulated GPU with the driver table (the path's event queries in C), without a watchdog: 300 async
    all_reduce on a side stream whose Works are dropped; 20 more behind a 0.3 s kernel are issued without a wait
    and stay outstanding until it ends; then later issues retire everything and the arrays are released."""
    (r,) = H.run_ranks(_dropped_async, 1, H.uid(), env={"PYCOLL_WATCHDOG": "0"})
    assert r["issued s"] < 0.2 and r["behind"] >= 20, r
    assert r["left"] < 8 and r["alive"] == 0 and r["last"] == [1.0] * 4, r
