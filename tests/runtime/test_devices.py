"""pycoll.devices without a GPU: the host device on a scripted host library, the CUDA and HIP
devices on a scripted runtime module, stream resolution and GPU discovery."""

from __future__ import annotations

import gc
import subprocess
import sys
import types

import numpy as np
import pytest
import torch
from helpers.fake_gpu import FakeGpuRuntime

from pycoll import devices
from pycoll.devices import (
    CaptureStatus,
    CudaDevice,
    CudaStream,
    DeviceError,
    Event,
    HipDevice,
    HostDevice,
    auto_backend,
    cuda_device_count,
    open_device,
    rocm_device_count,
)
from pycoll.errors import InvalidArgument, NotSupported

# --- a scripted host library (the Library host_* methods) -------------------------------------


class FakeHostLibrary:
    """Host streams as lists of pending work items; tests complete them with ``run_one``."""

    path = "fake-host"

    def __init__(self, host_api=True):
        self.host_api = host_api
        self.streams = {}
        self.events = {}
        self.next = 0x1000
        self.calls = []

    def has(self, name):
        return self.host_api

    def _new(self):
        self.next += 0x10
        return self.next

    def _stream(self, s):
        if s not in self.streams:
            raise InvalidArgument(4, "pycollStream*", "invalid argument", "bad stream")
        return self.streams[s]

    def enqueue(self, stream, label):
        self._stream(stream).append(("work", label))

    def run_one(self, stream):
        kind, item = self.streams[stream].pop(0)
        if kind == "event" and item in self.events:  # destroying a recorded event is allowed
            self.events[item]["done"] = True
        return item

    def host_stream_create(self, flags=0):
        s = self._new()
        self.streams[s] = []
        return s

    def host_stream_destroy(self, s):
        self.calls.append(("stream_destroy", s))
        self._stream(s)
        del self.streams[s]

    def host_stream_synchronize(self, s):
        while self._stream(s):
            self.run_one(s)

    def host_stream_query(self, s):
        return not self._stream(s)

    def host_stream_wait_event(self, s, e):
        self.calls.append(("wait", s, e))

    def host_event_create(self):
        e = self._new()
        self.events[e] = {"done": True, "t": 0.0}
        return e

    def host_event_destroy(self, e):
        self.calls.append(("event_destroy", e))
        del self.events[e]

    def host_event_record(self, e, s):
        self.calls.append(("record", e, s))
        if s == 0:
            self.events[e]["done"] = True
            return
        self.events[e]["done"] = False
        self._stream(s).append(("event", e))

    def host_event_query(self, e):
        return self.events[e]["done"]

    def host_event_synchronize(self, e):
        for s, items in self.streams.items():
            while ("event", e) in items:
                self.run_one(s)

    def host_event_wait(self, e, timeout):
        return self.events[e]["done"]

    def host_stream_set_flags(self, s, flags):
        self._stream(s)
        self.calls.append(("stream_flags", s, flags))

    def host_event_elapsed_ms(self, a, b):
        return 1.5


@pytest.fixture
def host():
    lib = FakeHostLibrary()
    dev = HostDevice(lib)
    yield dev
    dev.close()


def test_host_device_needs_the_host_library():
    with pytest.raises(NotSupported, match="pycollStreamCreate is not available in fake-host.*host library"):
        HostDevice(FakeHostLibrary(host_api=False))
    with pytest.raises(ValueError, match="needs the loaded host library"):
        open_device("host")
    assert isinstance(open_device("host", library=FakeHostLibrary()), HostDevice)
    with pytest.raises(ValueError, match="unknown backend 'mpi'"):
        open_device("mpi")


def test_host_streams_and_events_in_order(host):
    lib = host.library
    s = host.create_stream()
    e1, e2 = host.create_event(), host.create_event(timing=True)
    lib.enqueue(s, "op1")
    host.record_event(e1, s)
    lib.enqueue(s, "op2")
    host.record_event(e2, s)
    assert not host.query_event(e1) and not host.query_event(e2) and not host.query_stream(s)
    assert lib.run_one(s) == "op1" and lib.run_one(s) == e1
    assert host.query_event(e1) and not host.query_event(e2)
    host.synchronize_event(e2)
    assert host.query_event(e2) and host.query_stream(s)
    assert host.elapsed_ms(e1, e2) == 1.5
    assert host.capture_status(s) == CaptureStatus.NONE and not host.is_capturing(s)
    host.destroy_event(e1)
    host.destroy_event(e2)
    host.destroy_stream(s)
    with pytest.raises(ValueError, match="is not a live host stream"):
        host.destroy_stream(s)


def test_host_default_stream_is_owned_and_lazy(host):
    lib = host.library
    assert lib.streams == {}
    d = host.default_stream
    assert host.default_stream == d and list(lib.streams) == [d]
    assert host.resolve_stream(None) == d
    assert host.resolve_stream(None, [torch.zeros(2), np.zeros(2)]) == d  # CPU arrays: no framework stream
    host.close()
    assert lib.streams == {}
    host.close()  # idempotent


def test_host_resolve_stream(host):
    st = host.new_stream()
    assert host.resolve_stream(st) == st.handle
    assert host.resolve_stream(st.handle) == st.handle
    assert host.resolve_stream(np.int64(st.handle)) == st.handle
    assert host.resolve_stream(0) == 0  # NULL: run in the calling thread
    assert host.resolve_stream(None, default=st) == st.handle
    assert host.resolve_stream(None, default=st.handle) == st.handle
    with pytest.raises(ValueError, match="0x1234 is not a live host stream.*a CUDA stream handle cannot"):
        host.resolve_stream(0x1234)
    with pytest.raises(ValueError, match="^-5 is not a live host stream"):
        host.resolve_stream(-5)
    with pytest.raises(TypeError, match="not a bool"):
        host.resolve_stream(True)
    with pytest.raises(
        TypeError, match="stream must be an int handle, a pycoll Stream or a host stream object, not str"
    ):
        host.resolve_stream("s0")
    st.close()
    with pytest.raises(ValueError, match="the stream is closed"):
        host.resolve_stream(st)
    with pytest.raises(ValueError, match="is not a live host stream"):
        host.resolve_stream(st._handle or 0x1010)
    # one the library's own call made (README: "its streams are host threads (host_stream_create)"): live, and
    # taken (it was refused as "not a live host stream"); once destroyed, refused
    made = host.library.host_stream_create(0)
    assert host.resolve_stream(made) == made
    host.library.host_stream_destroy(made)
    with pytest.raises(ValueError, match="is not a live host stream"):
        host.resolve_stream(made)


class CudaStreamProto:
    def __init__(self, handle, version=0):
        self.handle, self.version = handle, version

    def __cuda_stream__(self):
        return (self.version, self.handle)


class TorchLikeStream:
    cuda_stream = 0xBEEF0


def cupy_like_stream(ptr):
    cls = type("Stream", (), {"__module__": "cupy.cuda.stream"})
    obj = cls()
    obj.ptr = ptr
    return obj


@pytest.mark.parametrize(
    "obj",
    [CudaStreamProto(0xAB0), TorchLikeStream(), cupy_like_stream(0xCD0)],
    ids=["__cuda_stream__", "torch", "cupy"],
)
def test_host_rejects_gpu_streams(host, obj):
    with pytest.raises(TypeError, match="GPU stream .* cannot be used with the host backend"):
        host.resolve_stream(obj)


def test_host_rejects_streams_of_other_devices_and_libraries(host):
    gpu = CudaDevice(0, runtime=FakeGpuRuntime("cuda"))
    with pytest.raises(TypeError, match="a cuda stream cannot be used on <HostDevice"):
        host.resolve_stream(gpu.new_stream())
    other = HostDevice(FakeHostLibrary())
    foreign = other.create_stream()
    with pytest.raises(ValueError, match="belongs to another host library"):
        host.resolve_stream(foreign)
    other.destroy_stream(foreign)


def test_host_stream_and_event_objects(host):
    lib = host.library
    with host.new_stream() as st:
        lib.enqueue(st.handle, "op")
        ev = st.record()
        assert isinstance(ev, Event) and not ev.query() and not st.query()
        st.synchronize()
        assert ev.query() and st.query()
        ev2 = host.new_event(timing=True)
        ev2.record(st)
        assert ev.elapsed_ms(ev2) == 1.5
        ev.synchronize()
        st.wait_event(ev2)
        assert ("wait", st.handle, ev2.handle) in lib.calls
        handle = ev2.handle
        ev2.close()
        ev2.close()
        assert ("event_destroy", handle) in lib.calls
        with pytest.raises(ValueError, match="the event is closed"):
            ev2.query()
        assert "Stream 0x" in repr(st) and "HostDevice" in repr(st)
    assert st.closed and "closed" in repr(st)


def test_host_busy_stream_is_leaked_not_blocked_on_by_the_collector(host):
    lib = host.library
    st = host.new_stream()
    handle = st.handle
    lib.enqueue(handle, "hung op")
    with pytest.warns(ResourceWarning, match="leaking busy host stream"):
        del st
        gc.collect()
    assert handle in lib.streams  # not destroyed
    lib.run_one(handle)
    idle = host.new_stream()
    idle_handle = idle.handle
    del idle
    gc.collect()
    assert idle_handle not in lib.streams
    host.destroy_stream(handle)


def test_host_event_collected(host):
    ev = host.new_event()
    handle = ev.handle
    del ev
    gc.collect()
    assert handle not in host.library.events


def test_wait_stream_orders_one_stream_after_another(host):
    lib = host.library
    a, b = host.create_stream(), host.create_stream()
    lib.calls.clear()
    host.wait_stream(a, b)
    kinds = [c[0] for c in lib.calls]
    assert kinds == ["record", "wait"]  # the event is kept for the next wait_stream (no create/destroy per call)
    assert lib.calls[0][2] == b and lib.calls[1][1] == a and lib.calls[1][2] == lib.calls[0][1]
    event = lib.calls[0][1]
    lib.calls.clear()
    host.wait_stream(a, a)
    assert lib.calls == []
    host.wait_stream(b, a)
    assert [c[0] for c in lib.calls] == ["record", "wait"] and lib.calls[0][1] == event
    lib.host_stream_synchronize(b)
    host.destroy_stream(a)
    host.destroy_stream(b)


# --- a scripted CUDA / HIP runtime module ------------------------------------------------------


GPU_KINDS = [(CudaDevice, "cuda", "nccl"), (HipDevice, "hip", "rccl")]


@pytest.fixture(params=GPU_KINDS, ids=["cuda", "hip"])
def gpu(request):
    cls, prefix, backend = request.param
    rt = FakeGpuRuntime(prefix)
    dev = cls(1, runtime=rt)
    assert (dev.kind, dev.backend, dev.device_id) == (prefix, backend, 1)
    return dev


def test_gpu_device_construction_errors():
    for cls, prefix, _ in GPU_KINDS:
        with pytest.raises(ValueError, match=f"{prefix} device 2 does not exist: 2 device"):
            cls(2, runtime=FakeGpuRuntime(prefix))
        with pytest.raises(ValueError, match="does not exist"):
            cls(-1, runtime=FakeGpuRuntime(prefix))
        with pytest.raises(
            DeviceError, match=f"{prefix}GetDeviceCount failed: {prefix}ErrorInsufficientDriver \\(35\\): text of 35"
        ) as info:
            cls(0, runtime=FakeGpuRuntime(prefix, count_error=35))
        assert info.value.code == 35 and info.value.function == f"{prefix}GetDeviceCount"


def test_gpu_streams_created_on_the_device_and_non_blocking(gpu):
    rt = gpu.runtime
    rt.current = 0
    s = gpu.create_stream()
    assert isinstance(s, int) and rt.streams[s]["device"] == 1 and rt.streams[s]["flags"] == 1
    assert rt.current == 0 and rt.log == [("set", 1), ("set", 0)]  # the caller's device is restored
    rt.log.clear()
    rt.current = 1
    e = gpu.create_event()
    assert rt.log == [] and rt.events[e]["device"] == 1
    assert rt.events[e]["flags"] == 2  # DisableTiming unless timing is asked for
    assert rt.events[gpu.create_event(timing=True)]["flags"] == 0


def test_gpu_events_complete_in_order(gpu):
    rt = gpu.runtime
    s = gpu.create_stream()
    e1, e2 = gpu.create_event(), gpu.create_event()
    rt.launch(s, "k1")
    gpu.record_event(e1, s)
    rt.launch(s, "k2")
    gpu.record_event(e2, s)
    assert not gpu.query_event(e1) and not gpu.query_event(e2) and not gpu.query_stream(s)
    rt.finish(s)
    assert gpu.query_event(e1) and not gpu.query_event(e2)
    gpu.synchronize_event(e2)
    assert gpu.query_event(e2)
    rt.launch(s, "k3")
    gpu.synchronize_stream(s)
    assert gpu.query_stream(s)
    gpu.stream_wait_event(s, e1)
    assert rt.log[-1] == ("wait", s, e1, 0)
    gpu.destroy_event(e1)
    with pytest.raises(DeviceError, match=r"EventQuery failed: \w+ErrorInvalidResourceHandle \(400\)"):
        gpu.query_event(e1)
    gpu.destroy_stream(s)
    with pytest.raises(DeviceError, match="StreamQuery failed"):
        gpu.query_stream(s)


def test_gpu_elapsed_time_needs_timing_events(gpu):
    t0, t1 = gpu.create_event(timing=True), gpu.create_event(timing=True)
    assert gpu.elapsed_ms(t0, t1) == 2.25
    untimed = gpu.create_event()
    with pytest.raises(DeviceError, match="both events must be created with timing=True"):
        gpu.elapsed_ms(t0, untimed)
    a, b = gpu.new_event(timing=True), gpu.new_event(timing=True)
    assert a.elapsed_ms(b) == 2.25


def test_gpu_capture_status(gpu):
    rt = gpu.runtime
    s = gpu.create_stream()
    assert gpu.capture_status(s) == CaptureStatus.NONE and not gpu.is_capturing(s)
    rt.streams[s]["capture"] = CaptureStatus.ACTIVE
    assert gpu.is_capturing(s)
    with pytest.raises(DeviceError, match="legacy default stream .* while another stream is capturing"):
        gpu.is_capturing(0)
    rt.streams[s]["capture"] = CaptureStatus.INVALIDATED
    assert gpu.capture_status(s) == CaptureStatus.INVALIDATED and gpu.is_capturing(s)


def test_gpu_resolve_explicit_streams(gpu):
    assert gpu.resolve_stream(0) == 0
    assert gpu.resolve_stream(0x5000) == 0x5000
    assert gpu.resolve_stream(CudaStreamProto(0xAB0)) == 0xAB0
    assert gpu.resolve_stream(TorchLikeStream()) == 0xBEEF0
    assert gpu.resolve_stream(cupy_like_stream(0xCD0)) == 0xCD0
    own = gpu.new_stream()
    assert gpu.resolve_stream(own) == own.handle
    with pytest.raises(ValueError, match="unsupported __cuda_stream__ protocol version 1"):
        gpu.resolve_stream(CudaStreamProto(0xAB0, version=1))
    with pytest.raises(ValueError, match="stream handle must be >= 0"):
        gpu.resolve_stream(-3)
    host = HostDevice(FakeHostLibrary())
    host_stream = host.new_stream()
    with pytest.raises(TypeError, match=f"a host stream cannot be used on <{type(gpu).__name__} {gpu.kind}:1>"):
        gpu.resolve_stream(host_stream)
    with pytest.raises(TypeError, match="is a host stream of pycoll's host library; it cannot be used on"):
        gpu.resolve_stream(host_stream.handle)
    host_stream.close()
    other = type(gpu)(0, runtime=gpu.runtime)
    with pytest.raises(ValueError, match="the stream belongs to"):
        gpu.resolve_stream(other.new_stream())
    with pytest.raises(TypeError, match="not object"):
        gpu.resolve_stream(object())


def test_cuda_stream_object_speaks_the_protocol():
    dev = CudaDevice(0, runtime=FakeGpuRuntime("cuda"))
    st = dev.new_stream()
    assert isinstance(st, CudaStream) and st.__cuda_stream__() == (0, st.handle)
    assert dev.resolve_stream(CudaStreamProto(st.handle)) == st.handle
    assert int(st) == st.handle
    handle = st.handle
    del st
    gc.collect()  # CUDA stream destruction never blocks: the collector destroys it
    assert handle not in dev.runtime.streams
    hip = HipDevice(0, runtime=FakeGpuRuntime("hip"))
    assert not hasattr(hip.new_stream(), "__cuda_stream__")


def test_gpu_default_streams(gpu):
    d = gpu.resolve_stream(None)
    assert d == gpu.default_stream and gpu.runtime.streams[d]["flags"] == 1
    assert gpu.resolve_stream(None, [np.zeros(2)]) == d
    assert gpu.resolve_stream(None, default=0x4440) == 0x4440
    assert gpu.resolve_stream(None, default=CudaStreamProto(0x4450)) == 0x4450
    gpu.close()
    assert d not in gpu.runtime.streams


def test_gpu_none_uses_torch_current_stream(gpu, monkeypatch):
    class FakeCudaTensor(torch.Tensor):
        is_cuda = True

    seen = []

    def current_stream(device=None):
        seen.append(device)
        return types.SimpleNamespace(cuda_stream=0x7777)

    monkeypatch.setattr(torch.cuda, "current_stream", current_stream)
    t = torch.zeros(3).as_subclass(FakeCudaTensor)
    assert gpu.resolve_stream(None, [np.zeros(1), t]) == 0x7777
    assert seen == [t.device]
    monkeypatch.setattr(torch.cuda, "current_stream", lambda device=None: types.SimpleNamespace(cuda_stream=0))
    assert gpu.resolve_stream(None, [t]) == 0  # torch's default stream is the legacy one: use it
    assert gpu.resolve_stream(None, [torch.zeros(2)], default=0x4440) == 0x4440  # CPU tensors


def test_gpu_none_uses_torch_raw_current_stream_where_torch_has_it(gpu, monkeypatch):
    """A CUDA build of torch answers in one C call (its compiled code's); the Python API is not asked."""
    class FakeCudaTensor(torch.Tensor):
        is_cuda = True

        def get_device(self):
            return 3

    seen = []
    monkeypatch.setattr(torch._C, "_cuda_getCurrentRawStream", lambda index: seen.append(index) or 0x5555,
                        raising=False)
    monkeypatch.setattr(torch.cuda, "current_stream", lambda device=None: pytest.fail("the Python API was asked"))
    t = torch.zeros(3).as_subclass(FakeCudaTensor)
    assert gpu.resolve_stream(None, [t]) == 0x5555 and seen == [3]


def test_gpu_none_uses_cupy_current_stream(gpu, monkeypatch):
    ndarray = type("ndarray", (), {})
    fake_cupy = types.ModuleType("cupy")
    fake_cupy.ndarray = ndarray
    fake_cupy.cuda = types.SimpleNamespace(get_current_stream=lambda: types.SimpleNamespace(ptr=0x8888))
    monkeypatch.setitem(sys.modules, "cupy", fake_cupy)
    assert gpu.resolve_stream(None, [ndarray()]) == 0x8888

    class FakeCudaTensor(torch.Tensor):
        is_cuda = True

    monkeypatch.setattr(torch.cuda, "current_stream", lambda device=None: types.SimpleNamespace(cuda_stream=1))
    with pytest.raises(ValueError, match="both torch and CuPy"):
        gpu.resolve_stream(None, [ndarray(), torch.zeros(1).as_subclass(FakeCudaTensor)])


def test_gpu_wait_stream(gpu):
    rt = gpu.runtime
    a, b = gpu.create_stream(), gpu.create_stream()
    before = set(rt.events)
    gpu.wait_stream(a, b)
    waits = [entry for entry in rt.log if entry[0] == "wait"]
    assert len(waits) == 1 and waits[0][1] == a
    assert len(set(rt.events) - before) == 1  # one helper event, kept for the next wait_stream
    gpu.wait_stream(b, a)
    assert len(set(rt.events) - before) == 1
    gpu.close()
    assert set(rt.events) <= before  # and released with the device


def test_missing_gpu_python_packages(monkeypatch):
    monkeypatch.setattr(CudaDevice, "_import_name", "pycoll_test_no_such_pkg.runtime")
    with pytest.raises(
        ImportError, match=r"CudaDevice needs pycoll_test_no_such_pkg.runtime: .*pip install 'pycoll-nccl\[cuda\]'"
    ):
        CudaDevice(0)
    monkeypatch.setattr(HipDevice, "_import_name", "pycoll_test_no_such_pkg.hip")
    with pytest.raises(ImportError, match=r"pip install 'pycoll-nccl\[rocm\]'"):
        HipDevice(0)


def test_real_gpu_packages_absent_here():
    if devices._has_module("cuda.bindings"):
        pytest.skip("cuda-bindings is installed: the missing-package path cannot be observed")
    with pytest.raises(ImportError, match=r"cuda\.bindings\.runtime.*pycoll-nccl\[cuda\]"):
        CudaDevice(0)
    with pytest.raises(ImportError, match="nccl"):
        open_device("nccl")


# --- discovery ---------------------------------------------------------------------------------


def test_discovery_finds_no_gpu_here_without_side_effects():
    code = (
        "import sys, pycoll.devices as d\n"
        "print(d.cuda_device_count(), d.rocm_device_count(), d.auto_backend(), 'torch' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    if cuda_device_count() or rocm_device_count():
        pytest.skip("this machine has a GPU")
    assert out.stdout.split() == ["0", "0", "host", "False"]


def test_discovery_through_cuda_bindings(monkeypatch):
    rt = types.SimpleNamespace(cudaGetDeviceCount=lambda: (0, 4))
    monkeypatch.setattr(devices, "_has_module", lambda name: name == "cuda.bindings")
    monkeypatch.setitem(sys.modules, "cuda.bindings", types.SimpleNamespace(runtime=rt))
    monkeypatch.setitem(sys.modules, "cuda.bindings.runtime", rt)
    assert cuda_device_count() == 4
    assert auto_backend() == "nccl"
    rt.cudaGetDeviceCount = lambda: (35, None)  # no driver
    assert cuda_device_count() == 0

    def boom():
        raise RuntimeError("broken install")

    rt.cudaGetDeviceCount = boom
    assert cuda_device_count() == 0


def test_discovery_through_torch(monkeypatch):
    monkeypatch.setattr(devices, "_has_module", lambda name: False)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 3)
    assert cuda_device_count() == 3 and rocm_device_count() == 0
    monkeypatch.setattr(torch.version, "hip", "6.2.0")
    assert cuda_device_count() == 0 and rocm_device_count() == 3
    assert auto_backend() == "rccl"


def test_discovery_through_hip_python(monkeypatch):
    hip_mod = types.SimpleNamespace(hipGetDeviceCount=lambda: (0, 2))
    monkeypatch.setattr(devices, "_has_module", lambda name: name == "hip")
    monkeypatch.setitem(sys.modules, "hip", types.SimpleNamespace(hip=hip_mod))
    monkeypatch.setitem(sys.modules, "hip.hip", hip_mod)
    assert rocm_device_count() == 2

    def no_runtime():
        raise RuntimeError("failed to dlopen libamdhip64.so")

    hip_mod.hipGetDeviceCount = no_runtime
    monkeypatch.delitem(sys.modules, "torch")
    assert rocm_device_count() == 0


@pytest.mark.timeout(60)
def test_a_host_stream_made_before_a_fork_is_refused_in_the_child():
    """Its thread stayed with the parent: an operation queued on it in the child never ran (a CommTimeout blamed the
    1-rank communicator) and Stream.synchronize() waited for ever."""
    import numpy as np
    from helpers.mp import in_a_fork

    import pycoll

    c = pycoll.init(0, 1, backend="host")
    s = c.device.new_stream()

    def child():
        k = pycoll.init(0, 1, backend="host", timeout=3, name="kid")
        out = []
        for call in (lambda: k.all_reduce(np.ones(4), stream=s), s.synchronize, s.query):
            try:
                call()
                out.append("ran")
            except pycoll.NCCLError as e:
                out.append("parent made it" in str(e))
        x = np.ones(4)
        k.all_reduce(x, stream=k.device.new_stream())
        k.destroy()
        return out, x.tolist()

    try:
        assert in_a_fork(child) == "ok ([True, True, True], [1.0, 1.0, 1.0, 1.0])"
        c.all_reduce(np.ones(4), stream=s)  # the parent's own
        s.synchronize()
    finally:
        c.destroy()
