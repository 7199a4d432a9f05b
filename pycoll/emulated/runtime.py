"""An emulated CUDA runtime: the call shapes of ``cuda.bindings.runtime``, on pycoll's host streams.

Every ``cuda*`` function returns a tuple whose first item is a :class:`cudaError_t`, as cuda-bindings
does. Streams and events are the host library's (``pycoll_host.h``): a created stream's handle *is*
a host stream, so the host library's collectives run on it in stream order. The runtime configures
the host library so that handle 0 and ``cudaStreamLegacy`` (1) mean one legacy default stream,
``cudaStreamPerThread`` (2) the calling thread's own default stream, and blocking streams (created
without ``cudaStreamNonBlocking``) synchronise implicitly with the legacy stream. One runtime may be
open per process (the legacy stream is the host library's, process-wide; its devices share it).

Test controls: :meth:`EmulatedCudaRuntime.launch` (a Python "kernel" run in stream order),
:meth:`~EmulatedCudaRuntime.hang` (a kernel that runs until its :class:`Gate` is released),
:meth:`~EmulatedCudaRuntime.inject_error` (a sticky device error, e.g. 700) and the call log
(:attr:`~EmulatedCudaRuntime.log`, :meth:`~EmulatedCudaRuntime.calls`).
"""

from __future__ import annotations

import contextlib
import ctypes
import enum
import itertools
import threading
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, ClassVar, Dict, Iterator, List, Optional, Tuple

from .. import _bindings

__all__ = ["EmulatedCudaRuntime", "EmulatedFramework", "cudaError_t", "Gate", "Call"]


class cudaError_t(enum.IntEnum):
    """The CUDA error codes the emulator returns (CUDA's values)."""

    cudaSuccess = 0
    cudaErrorInvalidValue = 1
    cudaErrorInvalidMemcpyDirection = 21
    cudaErrorInvalidDevice = 101
    cudaErrorInvalidResourceHandle = 400
    cudaErrorIllegalState = 401
    cudaErrorNotReady = 600
    cudaErrorIllegalAddress = 700
    cudaErrorLaunchFailure = 719
    cudaErrorStreamCaptureUnsupported = 900
    cudaErrorStreamCaptureInvalidated = 901
    cudaErrorStreamCaptureUnmatched = 903
    cudaErrorStreamCaptureImplicit = 906
    cudaErrorCapturedEvent = 907
    cudaErrorUnknown = 999


class cudaStreamCaptureStatus(enum.IntEnum):
    cudaStreamCaptureStatusNone = 0
    cudaStreamCaptureStatusActive = 1
    cudaStreamCaptureStatusInvalidated = 2


class cudaMemcpyKind(enum.IntEnum):
    cudaMemcpyHostToHost = 0
    cudaMemcpyHostToDevice = 1
    cudaMemcpyDeviceToHost = 2
    cudaMemcpyDeviceToDevice = 3
    cudaMemcpyDefault = 4


class cudaStreamCaptureMode(enum.IntEnum):
    cudaStreamCaptureModeGlobal = 0
    cudaStreamCaptureModeThreadLocal = 1
    cudaStreamCaptureModeRelaxed = 2


_ERR = cudaError_t
_OK = (_ERR.cudaSuccess,)
_STATUS = cudaStreamCaptureStatus
_QUERIES = frozenset({"cudaEventQuery", "cudaStreamQuery", "cudaEventSynchronize", "cudaStreamSynchronize",
                      "cudaDeviceSynchronize", "cudaEventElapsedTime"})
_NO_CONTEXT = frozenset({"cudaGetDevice", "cudaSetDevice", "cudaGetDeviceCount", "cudaGetErrorString",
                         "cudaGetErrorName"})
_open_runtime: Optional[EmulatedCudaRuntime] = None
_open_lock = threading.Lock()


@dataclass(frozen=True)
class Call:
    """One logged runtime call: its name, arguments, the calling thread and its current device."""

    name: str
    args: Tuple[Any, ...]
    thread: int
    thread_name: str
    device: int


class Gate:
    """Holds a hung kernel (:meth:`EmulatedCudaRuntime.hang`) until :meth:`release`."""

    def __init__(self) -> None:
        self._event = threading.Event()
        self.started = threading.Event()  # set when the stream reached the kernel

    def release(self) -> None:
        self._event.set()

    @property
    def released(self) -> bool:
        return self._event.is_set()

    def wait(self, timeout: Optional[float] = None) -> bool:
        return self._event.wait(timeout)


class EmulatedFramework:
    """A framework's per-thread, per-device current stream (torch's and CuPy's model); 0 by default."""

    def __init__(self, rt: EmulatedCudaRuntime, name: str) -> None:
        self.rt = rt
        self.name = name
        self._local = threading.local()

    def current_stream(self, device: int = 0) -> int:
        return getattr(self._local, "streams", {}).get(device, 0)

    def set_stream(self, stream: int, device: int = 0) -> None:
        streams = getattr(self._local, "streams", None)
        if streams is None:
            streams = self._local.streams = {}
        streams[device] = int(stream)

    @contextlib.contextmanager
    def stream(self, stream: int, device: int = 0) -> Iterator[None]:
        """Make ``stream`` the current one inside the block (``with torch.cuda.stream(s):``)."""
        old = self.current_stream(device)
        self.set_stream(stream, device)
        try:
            yield
        finally:
            self.set_stream(old, device)


class _Stream:
    __slots__ = ("handle", "device", "flags", "capture", "builtin")

    def __init__(self, handle: int, device: int, flags: int, builtin: bool = False) -> None:
        self.handle, self.device, self.flags, self.builtin = handle, device, flags, builtin
        self.capture: Optional[_Capture] = None


class _Capture:
    __slots__ = ("id", "mode", "status", "thread")

    def __init__(self, cid: int, mode: int, thread: int) -> None:
        self.id, self.mode, self.thread = cid, mode, thread
        self.status = _STATUS.cudaStreamCaptureStatusActive


class _Event:
    __slots__ = ("handle", "device", "flags", "captured", "recorded")

    def __init__(self, handle: int, device: int, flags: int) -> None:
        self.handle, self.device, self.flags = handle, device, flags
        self.captured = False
        self.recorded = False


class EmulatedCudaRuntime:
    """A CUDA runtime for ``pycoll.devices.CudaDevice(device_id, runtime=rt)``, on the host library.

    Args:
        ndev: how many emulated GPUs (ordinals 0..ndev-1; each thread's current device starts at 0).
        library: a loaded host library (default ``pycoll._bindings.load("host")``).
        log_calls: keep :attr:`log` (the calls, with their thread and current device; at most ``LOG_LIMIT``, the
            oldest half dropped when it is reached: a long run does not grow without bound).

    Close it with :meth:`close` (or use it as a context manager): it releases hung kernels, turns
    the host library's legacy stream off and destroys the streams it created.
    """

    cudaSuccess = _ERR.cudaSuccess
    cudaStreamDefault = 0
    cudaStreamNonBlocking = 0x1
    cudaStreamLegacy = 1
    cudaStreamPerThread = 2
    cudaEventDefault = 0
    cudaEventBlockingSync = 0x1
    cudaEventDisableTiming = 0x2
    cudaError_t = cudaError_t
    cudaStreamCaptureStatus = cudaStreamCaptureStatus
    cudaStreamCaptureMode = cudaStreamCaptureMode
    cudaMemcpyKind = cudaMemcpyKind

    array_types: ClassVar[Dict[str, Any]] = {}  # like= -> array class (filled by .arrays)
    LOG_LIMIT: ClassVar[int] = 50_000

    def __init__(self, ndev: int = 2, *, library: Any = None, log_calls: bool = True) -> None:
        global _open_runtime
        if library is None:
            library = _bindings.load("host")
        self.lib = library
        self._set_host_device = ctypes.CDLL(library.path).pycollSetDevice  # cudaDev of comms made afterwards
        self._set_host_device.argtypes, self._set_host_device.restype = [ctypes.c_int], None
        self.ndev = int(ndev)
        self.log_calls = log_calls
        self.log: List[Call] = []
        self.contexts: Dict[int, set] = {d: set() for d in range(self.ndev)}  # device -> thread ids
        self._lock = threading.RLock()
        self._local = threading.local()
        self._streams: Dict[int, _Stream] = {}
        self._events: Dict[int, _Event] = {}
        self._graphs: Dict[int, int] = {}  # graph handle -> host graph
        self._execs: Dict[int, int] = {}  # graph exec handle -> graph handle
        self._ids = itertools.count(1)
        self._capture_ids = itertools.count(1)
        self._sticky: Optional[int] = None
        self._driver: Any = None
        self._gates: List[Gate] = []
        self._kernels: List[threading.Thread] = []
        self.closed = False
        #: the current streams of the emulated frameworks (TorchLikeTensor, CupyLikeArray)
        self.torch = EmulatedFramework(self, "torch")
        self.cupy = EmulatedFramework(self, "cupy")
        with _open_lock:
            if _open_runtime is not None and not _open_runtime.closed:
                raise RuntimeError("an EmulatedCudaRuntime is already open in this process; close() it first")
            self._legacy = library.host_stream_create()
            library.host_stream_set_legacy(self._legacy)
            _open_runtime = self
        for name in dir(self):
            if name.startswith("_cuda"):
                setattr(self, name[1:], self._wrap(name[1:], getattr(self, name)))

    if TYPE_CHECKING:
        def __getattr__(self, name: str) -> Callable[..., Tuple[Any, ...]]: ...  # the cuda* functions

    # -- bookkeeping ----------------------------------------------------------------------------

    def _wrap(self, name: str, fn: Callable[..., Tuple[Any, ...]]) -> Callable[..., Tuple[Any, ...]]:
        def call(*args: Any) -> Tuple[Any, ...]:
            dev = self._current()
            if self.log_calls:
                t = threading.current_thread()
                log = self.log
                log.append(Call(name, args, t.ident or 0, t.name, dev))
                if len(log) > self.LOG_LIMIT:
                    with self._lock:
                        del log[:len(log) - self.LOG_LIMIT // 2]
            if name not in _NO_CONTEXT:
                self.contexts[dev].add(threading.get_ident())
            if self._sticky is not None and name in _QUERIES:
                return (_ERR(self._sticky),)
            return fn(*args)

        call.__name__ = name
        return call

    def calls(self, name: Optional[str] = None) -> List[Call]:
        """The logged calls, all or those of one function."""
        return [c for c in list(self.log) if name is None or c.name == name]

    def _current(self) -> int:
        return getattr(self._local, "device", 0)

    def host_stream(self, stream: int) -> int:
        """The host stream a CUDA stream handle means in the calling thread (0, 1, 2 resolved)."""
        stream = int(stream)
        if stream in (0, 1, 2):
            return self.lib.host_stream_resolve(stream)
        return stream

    def _stream(self, stream: Any) -> Optional[_Stream]:
        stream = int(stream)
        h = self.host_stream(stream)
        with self._lock:
            st = self._streams.get(h)
            if st is None and stream in (0, 1, 2):
                st = self._streams[h] = _Stream(h, self._current(), 0, builtin=True)
            if st is not None and st.builtin:
                st.device = self._current()  # 0/1/2: the current device's default streams
            return st

    def _capturing(self, device: int) -> List[_Stream]:
        with self._lock:
            return [s for s in self._streams.values() if s.capture is not None and s.device == device]

    def _invalidate(self, st: _Stream) -> None:
        if st.capture is not None:
            st.capture.status = _STATUS.cudaStreamCaptureStatusInvalidated

    # -- test controls --------------------------------------------------------------------------

    def launch(self, stream: Any, fn: Callable[[], Any], *, gate: Optional[Gate] = None) -> None:
        """Run ``fn()`` as a kernel on ``stream``: after the work queued there before, before the work after.

        An exception in ``fn`` becomes a sticky ``cudaErrorLaunchFailure`` (719), as a faulting kernel.
        A kernel on a capturing stream is not capturable here: it invalidates the capture.
        """
        st = self._stream(stream)
        if st is None:
            raise ValueError(f"0x{int(stream):x} is not a stream of this runtime")
        if st.capture is not None:
            self._invalidate(st)
            return
        lib = self.lib
        reached, done = lib.host_event_create(), lib.host_event_create()
        lib.host_event_record(reached, st.handle)
        lib.host_event_arm(done)
        lib.host_stream_wait_event(st.handle, done)

        def body() -> None:
            try:
                lib.host_event_wait(reached, 1e12)
                if gate is not None:
                    gate.started.set()
                try:
                    fn()
                except BaseException:
                    self._sticky = self._sticky or int(_ERR.cudaErrorLaunchFailure)
            finally:
                lib.host_event_fire(done)
                lib.host_event_destroy(reached)
                lib.host_event_destroy(done)

        t = threading.Thread(target=body, name="emulated-kernel", daemon=True)
        with self._lock:
            self._kernels = [k for k in self._kernels if k.is_alive()] + [t]
        t.start()

    def hang(self, stream: Any) -> Gate:
        """A kernel on ``stream`` that runs until the returned gate is released (or the runtime closes)."""
        gate = Gate()
        with self._lock:
            self._gates.append(gate)
        self.launch(stream, gate.wait, gate=gate)
        return gate

    def sleep(self, stream: Any, seconds: float) -> None:
        """A kernel that takes ``seconds`` (torch.cuda._sleep's role)."""
        ev = threading.Event()
        self.launch(stream, lambda: ev.wait(seconds))

    def device_array(self, owner: Any, ptr: int, shape: Tuple[int, ...], dtype: Any, like: str, device: int) -> Any:
        """An emulated CUDA array over ``ptr`` (what ``comm.mem_alloc``/``SymmetricPool`` hand out on this
        runtime): ``like="torch"`` a :class:`TorchLikeTensor`, ``"cupy"`` a :class:`CupyLikeArray`."""
        kinds = EmulatedCudaRuntime.array_types
        if like not in kinds:
            raise ValueError(f"like must be 'torch' or 'cupy' on the emulated GPU (device memory), got {like!r}")
        return kinds[like].over(self, owner, ptr, tuple(shape), dtype, device=device)

    def driver(self) -> Any:
        """A :class:`pycoll._bindings.CudaDriver` whose functions are this runtime's, through ctypes
        callbacks: what :func:`pycoll.emulated.device` gives its ``CudaDevice``, so that the compiled
        operation path calls the emulated GPU as it calls ``libcuda.so.1`` (the calls are logged as the
        runtime calls they stand for). ``cuCtxGetDevice`` answers ``CUDA_ERROR_INVALID_CONTEXT`` (201) in a
        thread that has no context on its current device, as the driver does. Made once per runtime."""
        if self._driver is None:
            self._driver = _driver_table(self)
        return self._driver

    def inject_error(self, code: int = int(_ERR.cudaErrorIllegalAddress)) -> None:
        """A sticky device error: every query and synchronisation returns ``code`` from now on."""
        self._sticky = int(code)

    def clear_error(self) -> None:
        self._sticky = None

    def close(self) -> None:
        """Release hung kernels, turn the legacy stream off, destroy what this runtime created."""
        global _open_runtime
        if self.closed:
            return
        self.closed = True
        for g in list(self._gates):
            g.release()
        for k in list(self._kernels):
            k.join(5.0)
        self._sticky = None
        with _open_lock:
            self.lib.host_stream_set_legacy(0)
            if _open_runtime is self:
                _open_runtime = None
        for host_graph in list(self._graphs.values()):
            try:
                self.lib.host_graph_destroy(host_graph)
            except Exception:
                pass
        self._graphs.clear()
        try:
            self.lib.host_stream_destroy(self._legacy)
        except Exception:
            pass

    def __enter__(self) -> EmulatedCudaRuntime:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    # -- devices --------------------------------------------------------------------------------

    def _cudaGetDeviceCount(self) -> Tuple[Any, ...]:
        return (_ERR.cudaSuccess, self.ndev)

    def _cudaGetDevice(self) -> Tuple[Any, ...]:
        return (_ERR.cudaSuccess, self._current())

    def _cudaSetDevice(self, device: int) -> Tuple[Any, ...]:
        device = int(device)
        if not 0 <= device < self.ndev:
            return (_ERR.cudaErrorInvalidDevice,)
        self._local.device = device
        self.contexts[device].add(threading.get_ident())
        self._set_host_device(device)
        return _OK

    def _cudaDeviceSynchronize(self) -> Tuple[Any, ...]:
        with self._lock:
            handles = [s.handle for s in self._streams.values()]
        for h in [*handles, self._legacy]:
            try:
                self.lib.host_stream_synchronize(h)
            except Exception:
                pass
        return _OK

    def _cudaGetErrorString(self, err: Any) -> Tuple[Any, ...]:
        try:
            name = _ERR(int(err)).name
        except ValueError:
            name = f"cudaError {int(err)}"
        return (_ERR.cudaSuccess, f"{name} (emulated)".encode())

    def _cudaGetErrorName(self, err: Any) -> Tuple[Any, ...]:
        try:
            return (_ERR.cudaSuccess, _ERR(int(err)).name.encode())
        except ValueError:
            return (_ERR.cudaErrorInvalidValue, b"")

    # -- streams --------------------------------------------------------------------------------

    def _cudaStreamCreateWithFlags(self, flags: int) -> Tuple[Any, ...]:
        flags = int(flags)
        blocking = not (flags & self.cudaStreamNonBlocking)
        h = self.lib.host_stream_create(0x2 if blocking else 0)  # HOST_STREAM_BLOCKING
        with self._lock:
            self._streams[h] = _Stream(h, self._current(), flags)
        return (_ERR.cudaSuccess, h)

    def _cudaStreamCreate(self) -> Tuple[Any, ...]:
        return self._cudaStreamCreateWithFlags(0)

    def _cudaStreamDestroy(self, stream: Any) -> Tuple[Any, ...]:
        h = int(stream)
        with self._lock:
            st = self._streams.get(h)
            if st is None or st.builtin:
                return (_ERR.cudaErrorInvalidResourceHandle,)
            del self._streams[h]
        threading.Thread(target=self.lib.host_stream_destroy, args=(h,), daemon=True,
                         name="emulated-stream-destroy").start()  # CUDA defers the release
        return _OK

    def _outside_capture(self, stream: Any) -> Tuple[Any, Tuple[Any, ...]]:
        """(the stream, _OK) for a call that no capture can hold, or (None, the error): an unknown
        stream, or a capturing one (whose capture the call invalidates, as CUDA does)."""
        st = self._stream(stream)
        if st is None:
            return None, (_ERR.cudaErrorInvalidResourceHandle,)
        if st.capture is not None:
            self._invalidate(st)
            return None, (_ERR.cudaErrorStreamCaptureUnsupported,)
        return st, _OK

    def _cudaStreamQuery(self, stream: Any) -> Tuple[Any, ...]:
        st, err = self._outside_capture(stream)
        if st is None:
            return err
        return _OK if self.lib.host_stream_query(st.handle) else (_ERR.cudaErrorNotReady,)

    def _cudaStreamSynchronize(self, stream: Any) -> Tuple[Any, ...]:
        st, err = self._outside_capture(stream)
        if st is None:
            return err
        self.lib.host_stream_synchronize(st.handle)
        return (_ERR(self._sticky),) if self._sticky is not None else _OK

    def _cudaStreamWaitEvent(self, stream: Any, event: Any, flags: int = 0) -> Tuple[Any, ...]:
        st, ev = self._stream(stream), self._events.get(int(event))
        if st is None or ev is None:
            return (_ERR.cudaErrorInvalidResourceHandle,)
        if st.capture is None and not ev.captured:
            self.lib.host_stream_wait_event(st.handle, ev.handle)
        return _OK

    def _cudaStreamIsCapturing(self, stream: Any) -> Tuple[Any, ...]:
        st = self._stream(stream)
        if st is None:
            return (_ERR.cudaErrorInvalidResourceHandle, _STATUS.cudaStreamCaptureStatusNone)
        if int(stream) in (0, 1):
            # CUDA: the legacy stream while a blocking stream (one that synchronises with it) captures; the query
            # leaves that capture valid. A non-blocking stream's capture is none of the legacy stream's business
            for other in self._capturing(st.device):
                relaxed = cudaStreamCaptureMode.cudaStreamCaptureModeRelaxed
                if (other.capture is not None and other.capture.mode != relaxed
                        and not other.flags & self.cudaStreamNonBlocking):
                    return (_ERR.cudaErrorStreamCaptureImplicit, _STATUS.cudaStreamCaptureStatusNone)
        cap = st.capture
        return (_ERR.cudaSuccess, _STATUS.cudaStreamCaptureStatusNone if cap is None else cap.status)

    def _cudaStreamGetCaptureInfo(self, stream: Any) -> Tuple[Any, ...]:
        err, status = self._cudaStreamIsCapturing(stream)
        if int(err) != 0:
            return (err, status, 0, None, [], 0)
        st = self._stream(stream)
        cid = st.capture.id if st is not None and st.capture is not None else 0
        return (_ERR.cudaSuccess, status, cid, None, [], 0)

    def _cudaStreamBeginCapture(self, stream: Any, mode: int = 0) -> Tuple[Any, ...]:
        if int(stream) in (0, 1):
            return (_ERR.cudaErrorStreamCaptureUnsupported,)
        st = self._stream(stream)
        if st is None:
            return (_ERR.cudaErrorInvalidResourceHandle,)
        if st.capture is not None:
            return (_ERR.cudaErrorIllegalState,)
        self.lib.host_stream_begin_capture(st.handle)
        st.capture = _Capture(next(self._capture_ids), int(mode), threading.get_ident())
        return _OK

    def _cudaStreamEndCapture(self, stream: Any) -> Tuple[Any, ...]:
        st = self._stream(stream)
        if st is None:
            return (_ERR.cudaErrorInvalidResourceHandle, None)
        cap = st.capture
        if cap is None:
            return (_ERR.cudaErrorIllegalState, None)
        st.capture = None
        host_graph = self.lib.host_stream_end_capture(st.handle)
        if cap.status == _STATUS.cudaStreamCaptureStatusInvalidated:
            self.lib.host_graph_destroy(host_graph)
            return (_ERR.cudaErrorStreamCaptureInvalidated, None)
        g = next(self._ids)
        with self._lock:
            self._graphs[g] = host_graph
        return (_ERR.cudaSuccess, g)

    # -- memory ---------------------------------------------------------------------------------

    def _cudaMemcpyAsync(self, dst: Any, src: Any, count: int, kind: Any, stream: Any = 0) -> Tuple[Any, ...]:
        """A copy queued on ``stream`` as a kernel (device memory is host memory): it runs after the work
        queued there before and before the work queued after, as a real one."""
        try:
            kind = cudaMemcpyKind(int(kind))
        except ValueError:
            return (_ERR.cudaErrorInvalidMemcpyDirection,)
        if isinstance(dst, bool) or isinstance(src, bool) or not isinstance(dst, int) or not isinstance(src, int):
            return (_ERR.cudaErrorInvalidValue,)
        count = int(count)
        if count < 0 or (count and (dst <= 0 or src <= 0)):
            return (_ERR.cudaErrorInvalidValue,)
        st, err = self._outside_capture(stream)
        if st is None:
            return err
        if count:
            self.launch(stream, lambda: ctypes.memmove(dst, src, count))
        return _OK

    # -- graphs ---------------------------------------------------------------------------------

    def _cudaGraphInstantiate(self, graph: Any, flags: int = 0) -> Tuple[Any, ...]:
        if int(graph) not in self._graphs:
            return (_ERR.cudaErrorInvalidResourceHandle, None)
        e = next(self._ids)
        self._execs[e] = int(graph)
        return (_ERR.cudaSuccess, e)

    def _cudaGraphLaunch(self, graph_exec: Any, stream: Any) -> Tuple[Any, ...]:
        g = self._execs.get(int(graph_exec))
        st = self._stream(stream)
        if g is None or st is None or g not in self._graphs:
            return (_ERR.cudaErrorInvalidResourceHandle,)
        self.lib.host_graph_launch(self._graphs[g], st.handle)
        return _OK

    def _cudaGraphExecDestroy(self, graph_exec: Any) -> Tuple[Any, ...]:
        return _OK if self._execs.pop(int(graph_exec), None) is not None else (_ERR.cudaErrorInvalidResourceHandle,)

    def _cudaGraphDestroy(self, graph: Any) -> Tuple[Any, ...]:
        with self._lock:
            g = self._graphs.pop(int(graph), None)
        if g is None:
            return (_ERR.cudaErrorInvalidResourceHandle,)
        self.lib.host_graph_destroy(g)
        return _OK

    # -- events ---------------------------------------------------------------------------------

    def _cudaEventCreateWithFlags(self, flags: int) -> Tuple[Any, ...]:
        h = self.lib.host_event_create()
        with self._lock:
            self._events[h] = _Event(h, self._current(), int(flags))
        return (_ERR.cudaSuccess, h)

    def _cudaEventCreate(self) -> Tuple[Any, ...]:
        return self._cudaEventCreateWithFlags(0)

    def _cudaEventDestroy(self, event: Any) -> Tuple[Any, ...]:
        with self._lock:
            ev = self._events.pop(int(event), None)
        if ev is None:
            return (_ERR.cudaErrorInvalidResourceHandle,)
        self.lib.host_event_destroy(ev.handle)
        return _OK

    def _cudaEventRecord(self, event: Any, stream: Any = 0) -> Tuple[Any, ...]:
        ev, st = self._events.get(int(event)), self._stream(stream)
        if ev is None or st is None or ev.device != st.device:
            return (_ERR.cudaErrorInvalidResourceHandle,)
        ev.recorded = True
        if st.capture is not None:
            ev.captured = True  # a node of the graph: querying it is an error until re-recorded
            return _OK
        ev.captured = False
        self.lib.host_event_record(ev.handle, st.handle)
        return _OK

    def _cudaEventQuery(self, event: Any) -> Tuple[Any, ...]:
        ev = self._events.get(int(event))
        if ev is None:
            return (_ERR.cudaErrorInvalidResourceHandle,)
        if ev.captured:
            return (_ERR.cudaErrorCapturedEvent,)
        return _OK if self.lib.host_event_query(ev.handle) else (_ERR.cudaErrorNotReady,)

    def _cudaEventSynchronize(self, event: Any) -> Tuple[Any, ...]:
        ev = self._events.get(int(event))
        if ev is None:
            return (_ERR.cudaErrorInvalidResourceHandle,)
        if ev.captured:
            return (_ERR.cudaErrorCapturedEvent,)
        self.lib.host_event_synchronize(ev.handle)
        return (_ERR(self._sticky),) if self._sticky is not None else _OK

    def _cudaEventElapsedTime(self, start: Any, end: Any) -> Tuple[Any, ...]:
        a, b = self._events.get(int(start)), self._events.get(int(end))
        if a is None or b is None or (a.flags | b.flags) & self.cudaEventDisableTiming:
            return (_ERR.cudaErrorInvalidResourceHandle, 0.0)
        if not (a.recorded and b.recorded) or a.captured or b.captured:
            return (_ERR.cudaErrorInvalidResourceHandle, 0.0)
        if not (self.lib.host_event_query(a.handle) and self.lib.host_event_query(b.handle)):
            return (_ERR.cudaErrorNotReady, 0.0)
        return (_ERR.cudaSuccess, self.lib.host_event_elapsed_ms(a.handle, b.handle))


_CU_ERROR_INVALID_CONTEXT = 201
_CU_ERROR_UNKNOWN = 999
_RECORD = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p)
_QUERY = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p)
_CAPTURING = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p, ctypes.POINTER(ctypes.c_int))
_CTX_DEVICE = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.POINTER(ctypes.c_int))
_DEVICE_GET = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.POINTER(ctypes.c_int), ctypes.c_int)


def _driver_table(rt: EmulatedCudaRuntime) -> Any:
    """The driver functions of ``rt`` as a CudaDriver (see :meth:`EmulatedCudaRuntime.driver`)."""

    def guarded(fn: Callable[..., int]) -> Callable[..., int]:
        def call(*args: Any) -> int:
            try:
                return int(fn(*args))
            except Exception:  # an exception cannot cross the C call: an error code, and the runtime's path says why
                return _CU_ERROR_UNKNOWN
        return call

    def record(event: Optional[int], stream: Optional[int]) -> int:
        return int(rt.cudaEventRecord(event or 0, stream or 0)[0])

    def query(event: Optional[int]) -> int:
        return int(rt.cudaEventQuery(event or 0)[0])

    def capturing(stream: Optional[int], status: Any) -> int:
        res = rt.cudaStreamIsCapturing(stream or 0)
        if int(res[0]) == 0:
            status[0] = int(res[1])
        return int(res[0])

    def ctx_device(device: Any) -> int:
        current = rt._current()
        if threading.get_ident() not in rt.contexts[current]:
            return _CU_ERROR_INVALID_CONTEXT
        device[0] = current
        return 0

    def device_get(device: Any, ordinal: int) -> int:
        if not 0 <= ordinal < rt.ndev:
            return int(_ERR.cudaErrorInvalidDevice)
        device[0] = ordinal
        return 0

    fns = (_RECORD(guarded(record)), _QUERY(guarded(query)), _CAPTURING(guarded(capturing)),
           _CTX_DEVICE(guarded(ctx_device)), _DEVICE_GET(guarded(device_get)))
    return _bindings.CudaDriver.from_addresses(*(ctypes.cast(f, ctypes.c_void_p).value or 0 for f in fns), keep=fns,
                                               source="the emulated CUDA runtime")
