"""Streams and events of the device a communicator runs on, with one interface for every backend.

A :class:`Device` creates, records, queries and destroys streams and events by raw handle (plain
ints, exactly what the NCCL ABI takes), so the watchdog polls completion with the same code on
CPU and GPU:

* :class:`HostDevice` -- the host library's streams (ordered queues run by a thread of their own)
  and events, through the ``host_*`` methods of a loaded :class:`pycoll._bindings.Library`;
* :class:`CudaDevice` -- CUDA streams and events through cuda-bindings (``cuda.bindings.runtime``,
  the ``pycoll-nccl[cuda]`` extra);
* :class:`HipDevice` -- HIP streams and events through hip-python (``hip.hip``, the
  ``pycoll-nccl[rocm]`` extra).

:meth:`Device.resolve_stream` turns whatever a user passes as ``stream=`` into a raw handle and
refuses streams of the wrong kind. :func:`cuda_device_count`, :func:`rocm_device_count` and
:func:`auto_backend` discover GPUs without failing (or importing torch) on machines that have none.

:class:`Stream` and :class:`Event` are small owning wrappers for user code; a host stream for
``stream=`` arguments on the host backend comes from :meth:`Device.new_stream`.
"""

from __future__ import annotations

import ctypes
import importlib
import importlib.util
import logging
import operator
import sys
import threading
import time
import warnings
from typing import TYPE_CHECKING, Any, Callable, Dict, Iterable, List, Optional, Tuple

from .errors import CaptureError, NCCLError, NotSupported, PycollError

if TYPE_CHECKING:
    from ._bindings import Library

__all__ = [
    "Device",
    "HostDevice",
    "CudaDevice",
    "HipDevice",
    "Stream",
    "Event",
    "DeviceError",
    "CaptureStatus",
    "open_device",
    "cuda_device_count",
    "rocm_device_count",
    "auto_backend",
    "register_framework_stream",
]

_log = logging.getLogger("pycoll.devices")


FIRST_SLEEP_S = 20e-6
_MAX_SLEEP_S = 1e-3


def backoff(last: float, limit: float = _MAX_SLEEP_S) -> float:
    """Sleep between two polls: 20 us, doubling up to 1 ms (and at most ``limit``); returns the time
    slept (pass it back next time).

    The one back-off of pycoll's polling waits (events, operations, nonblocking init and reshape):
    the cap bounds how late a completion is noticed.
    """
    sleep = min(_MAX_SLEEP_S, last * 2 if last else FIRST_SLEEP_S)
    time.sleep(min(sleep, limit))
    return sleep


def stream_text(stream: Any, device: Any) -> str:
    """How an operation's stream on ``device`` is named in reports: `` on stream 0x...`` (the legacy default stream
    by name) on a GPU, where a user's several streams may hold the work it waits for; '' on the host."""
    if getattr(device, "kind", "host") == "host" or isinstance(stream, bool) or not isinstance(stream, int):
        return ""
    return " on the legacy default stream" if stream in (0, 1) else f" on stream {stream:#x}"


class DeviceError(PycollError, RuntimeError):
    """A CUDA or HIP runtime call failed.

    Attributes: ``function`` (e.g. ``"cudaStreamCreateWithFlags"``), ``code`` (the runtime's
    error number), ``error_name`` (e.g. ``"cudaErrorInsufficientDriver"``) and ``error_string``.
    """

    def __init__(self, function: str, code: int, error_name: str = "", error_string: str = "", hint: str = ""):
        self.function = function
        self.code = code
        self.error_name = error_name
        self.error_string = error_string
        self.hint = hint
        msg = f"{function} failed: {error_name or 'error'} ({code})"
        if error_string:
            msg += f": {error_string}"
        if hint:
            msg += f" -- {hint}"
        super().__init__(msg)

    def __reduce__(self) -> Any:
        return (type(self), (self.function, self.code, self.error_name, self.error_string, self.hint))


class CaptureStatus:
    """Values of ``cudaStreamCaptureStatus`` / ``hipStreamCaptureStatus``."""

    NONE = 0
    ACTIVE = 1
    INVALIDATED = 2


# --- owning wrappers ---------------------------------------------------------------------------


class Stream:
    """A stream created by a :class:`Device`, destroyed by :meth:`close` (or by the collector).

    Pass it (or ``int(stream)``) as ``stream=`` to pycoll calls on the same device. Destroying a
    host stream waits for its queued work, so the collector destroys an unclosed host stream only
    when it is idle; a busy one is leaked with a ``ResourceWarning``.
    """

    __slots__ = ("device", "_handle", "__weakref__")

    def __init__(self, device: Device, handle: int) -> None:
        self.device = device
        self._handle: Optional[int] = handle

    @property
    def handle(self) -> int:
        """The raw stream handle; ``ValueError`` once closed."""
        if self._handle is None:
            raise ValueError("the stream is closed")
        return self._handle

    @property
    def closed(self) -> bool:
        return self._handle is None

    def __int__(self) -> int:
        return self.handle

    def synchronize(self) -> None:
        """Block until everything queued on the stream has run."""
        self.device.synchronize_stream(self.handle)

    def query(self) -> bool:
        """True when everything queued on the stream has run (never blocks)."""
        return self.device.query_stream(self.handle)

    def wait_event(self, event: Event) -> None:
        """Work queued on this stream from now on waits until ``event`` has completed."""
        self.device.stream_wait_event(self.handle, event.handle)

    def record(self, event: Optional[Event] = None) -> Event:
        """Record ``event`` (a new one if None) on this stream and return it."""
        event = event if event is not None else self.device.new_event()
        event.record(self)
        return event

    def close(self) -> None:
        """Destroy the stream (host: after its queued work has run). Idempotent."""
        handle, self._handle = self._handle, None
        if handle is not None:
            self.device.destroy_stream(handle)

    def __enter__(self) -> Stream:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def __del__(self) -> None:
        handle = getattr(self, "_handle", None)
        if handle is None:
            return
        try:
            if self.device._stream_destroy_blocks and not self.device.query_stream(handle):
                warnings.warn(
                    f"leaking busy {self.device.kind} stream 0x{handle:x}: close() it after its work is done",
                    ResourceWarning,
                    stacklevel=2,
                )
                return
            self.device.destroy_stream(handle)
        except Exception:  # never raise from the collector (interpreter shutdown, library gone)
            pass

    def __repr__(self) -> str:
        state = "closed" if self._handle is None else f"0x{self._handle:x}"
        return f"<{type(self).__name__} {state} on {self.device!r}>"


class CudaStream(Stream):
    """A CUDA stream; also usable wherever the ``__cuda_stream__`` protocol is accepted."""

    __slots__ = ()

    def __cuda_stream__(self) -> Tuple[int, int]:
        return (0, self.handle)


class Event:
    """An event created by a :class:`Device`; destroyed by :meth:`close` or by the collector."""

    __slots__ = ("device", "_handle", "timing", "__weakref__")

    def __init__(self, device: Device, handle: int, timing: bool) -> None:
        self.device = device
        self._handle: Optional[int] = handle
        self.timing = timing

    @property
    def handle(self) -> int:
        if self._handle is None:
            raise ValueError("the event is closed")
        return self._handle

    def record(self, stream: Any = None) -> None:
        """Record on ``stream`` (anything :meth:`Device.resolve_stream` takes; None: the default)."""
        self.device.record_event(self.handle, self.device.resolve_stream(stream))

    def query(self) -> bool:
        """True when the recorded work has completed (or the event was never recorded)."""
        return self.device.query_event(self.handle)

    def synchronize(self) -> None:
        """Block until the recorded work has completed."""
        self.device.synchronize_event(self.handle)

    def elapsed_ms(self, end: Event) -> float:
        """Milliseconds from this event to ``end``; both completed (GPU: both created with timing)."""
        return self.device.elapsed_ms(self.handle, end.handle)

    def close(self) -> None:
        handle, self._handle = self._handle, None
        if handle is not None:
            self.device.destroy_event(handle)

    def __del__(self) -> None:
        handle = getattr(self, "_handle", None)
        if handle is not None:
            try:
                self.device.destroy_event(handle)
            except Exception:
                pass

    def __repr__(self) -> str:
        state = "closed" if self._handle is None else f"0x{self._handle:x}"
        return f"<Event {state} on {self.device!r}>"


# --- the interface -----------------------------------------------------------------------------


class Device:
    """Streams and events of one device. Handles are plain ints; 0 is the NULL/default stream.

    Attributes:
        kind: ``"host"``, ``"cuda"`` or ``"hip"``.
        backend: the :func:`pycoll.buffers.check_device` backend name: ``"host"``, ``"nccl"``,
            ``"rccl"``.
        device_id: the GPU ordinal (0 for the host).

    Every method may be called from any thread. Failures raise :class:`DeviceError` (GPU) or
    the :class:`pycoll.errors.NCCLError` subclass the host library returned.
    """

    kind = "abstract"
    backend = ""
    device_id = 0
    #: events measure time (``elapsed_ms`` works on any two completed events)
    events_timed = False
    _stream_class = Stream
    _stream_destroy_blocks = False

    def __init__(self) -> None:
        self._default_stream: Optional[int] = None
        self._lock = threading.Lock()
        self._sync_events: List[int] = []  # wait_stream's events, reused

    # streams
    def create_stream(self) -> int:
        """A new stream (GPU: non-blocking with respect to the legacy default stream)."""
        raise NotImplementedError

    def destroy_stream(self, stream: int) -> None:
        """Destroy a stream created by :meth:`create_stream` (host: waits for its queued work)."""
        raise NotImplementedError

    def synchronize_stream(self, stream: int) -> None:
        """Block until everything queued on ``stream`` has run."""
        raise NotImplementedError

    def query_stream(self, stream: int) -> bool:
        """True when everything queued on ``stream`` has run; never blocks."""
        raise NotImplementedError

    def stream_wait_event(self, stream: int, event: int) -> None:
        """Work queued on ``stream`` after this call waits until ``event`` completes."""
        raise NotImplementedError

    # events
    def create_event(self, timing: bool = False) -> int:
        """A new event. ``timing``: GPU events measure time only when created with it."""
        raise NotImplementedError

    def destroy_event(self, event: int) -> None:
        raise NotImplementedError

    def record_event(self, event: int, stream: int) -> None:
        """``event`` completes when everything queued on ``stream`` before it has run."""
        raise NotImplementedError

    def query_event(self, event: int) -> bool:
        """True when ``event`` has completed (or was never recorded); never blocks."""
        raise NotImplementedError

    def synchronize_event(self, event: int) -> None:
        """Block until ``event`` completes."""
        raise NotImplementedError

    def wait_event(self, event: int, timeout: float, run: bool = False) -> bool:
        """Block until ``event`` completes or ``timeout`` seconds pass; True when it completed.

        ``run``: the waiting thread may run the work queued before ``event`` that the stream's thread
        has not begun (the host library, on a stream allowed to with :meth:`allow_inline`), within
        ``timeout``; what is unfinished then goes back to the stream, left to this thread's next wait
        for ``PYCOLL_HOST_DEFER_NS`` before the stream's thread takes it over.

        The base polls (:func:`backoff`); the host library waits in C, GIL released.
        """
        deadline = time.monotonic() + timeout
        sleep = 0.0
        while not self.query_event(event):
            left = deadline - time.monotonic()
            if left <= 0:
                return False
            sleep = backoff(sleep, left)
        return True

    def allow_inline(self, stream: int, allowed: bool, waiters_run: bool = False) -> None:
        """Whether work submitted to ``stream`` while it is idle may run in the submitting thread
        (``allowed``), and whether a thread waiting for an event of ``stream`` may run the work queued
        before it that the stream's thread has not begun (``waiters_run``).

        Only the host library does either (a GPU stream always runs on the device): stream order
        and the event contract stay the same, and the thread is back with its caller after
        ``PYCOLL_HOST_INLINE_NS`` at the latest (what is left goes back to the stream: a wait takes it up
        again, else the stream's thread).
        """

    def elapsed_ms(self, start: int, end: int) -> float:
        """Milliseconds between two completed events."""
        raise NotImplementedError

    # graphs
    def capture_status(self, stream: int) -> int:
        """The stream's :class:`CaptureStatus` (always NONE on the host)."""
        return CaptureStatus.NONE

    def is_capturing(self, stream: int) -> bool:
        """True while ``stream`` is part of a CUDA/HIP graph capture (active or invalidated)."""
        return self.capture_status(stream) != CaptureStatus.NONE

    def capture_id(self, stream: int) -> Optional[int]:
        """The id of the graph capture ``stream`` is part of, or None when it captures nothing.

        Raises :class:`pycoll.CaptureError` for an invalidated capture (CUDA refuses to add to it)
        and for the legacy default stream while another stream captures in global mode.
        """
        try:
            status = self.capture_status(stream)
        except DeviceError as e:
            if e.code != _CAPTURE_IMPLICIT:  # no capture involved: a stream destroyed, say (the error says so)
                raise
            raise CaptureError(f"cannot tell whether stream 0x{stream:x} is capturing a graph: {e}",
                               stream, None, CaptureStatus.NONE) from e
        if status == CaptureStatus.NONE:
            return None
        cid = self._capture_sequence_id(stream)
        if status == CaptureStatus.INVALIDATED:
            raise CaptureError(f"the graph capture {cid} of stream 0x{stream:x} was invalidated (an operation that "
                               "is not capturable ran on a capturing stream); end the capture and capture again",
                               stream, cid, status)
        return cid

    def _capture_sequence_id(self, stream: int) -> int:
        return 0

    def enter_own_thread(self) -> None:
        """Called by pycoll's own threads (``pycoll-*``: the watchdog, the abort thread) before they use
        this device. On a GPU it makes the device current there once, so that those threads never create
        a context on GPU 0 for a communicator on another GPU; any other thread is left alone."""

    def make_current(self) -> None:
        """Make this device the calling thread's current device (GPU; nothing on the host).

        NCCL creates a communicator on the current device, so this runs before initialisation.
        """

    def swap_current(self) -> Optional[int]:
        """Make this device current for a launch; returns the device to restore (None: nothing to do).

        Stream 0 is the legacy stream of the calling thread's current device, and an event can
        only be recorded on a stream of its own device: a launch runs with the communicator's
        device current, as torch's device guard does.
        """
        return None

    def restore_current(self, previous: Optional[int]) -> None:
        """Undo :meth:`swap_current`."""

    # copies between host bytes and device memory
    def copy_to_device(self, dst_ptr: int, src: bytes, stream: int) -> None:
        """Copy ``src`` into device memory at ``dst_ptr``, in the order of ``stream``: after the work queued
        there before, before the work queued after. Returns once the copy has run (``src`` may be reused)."""
        raise NotImplementedError

    def copy_to_host(self, src_ptr: int, nbytes: int, stream: int) -> bytes:
        """The ``nbytes`` bytes of device memory at ``src_ptr``, read in the order of ``stream`` (after the
        work queued there before); returns once the copy has run."""
        raise NotImplementedError

    # composites
    def wait_stream(self, stream: int, other: int) -> None:
        """Make later work on ``stream`` wait for the work already queued on ``other``.

        Used for a ``__cuda_array_interface__`` producer stream (``Buffer.sync_stream``) and for
        handing results back to a user's stream. Nothing happens when they are the same stream.
        """
        if stream == other:
            return
        with self._lock:
            event = self._sync_events.pop() if self._sync_events else None
        if event is None:
            event = self.create_event()
        try:
            self.record_event(event, other)
            self.stream_wait_event(stream, event)
        except BaseException:
            self.destroy_event(event)
            raise
        with self._lock:  # an event may be re-recorded once a wait on it is enqueued
            self._sync_events.append(event)

    @property
    def default_stream(self) -> int:
        """A stream owned by this device object, created on first use, destroyed by :meth:`close`.

        It is what :meth:`resolve_stream` returns when no stream is given and no framework's
        current stream applies. A communicator usually passes its own stream as ``default``.
        """
        with self._lock:
            if self._default_stream is None:
                self._default_stream = self.create_stream()
            return self._default_stream

    def new_stream(self) -> Stream:
        """A new owning :class:`Stream` object."""
        return self._stream_class(self, self.create_stream())

    def new_event(self, timing: bool = False) -> Event:
        """A new owning :class:`Event` object."""
        return Event(self, self.create_event(timing), timing)

    def close(self) -> None:
        """Destroy :attr:`default_stream` if it was created (host: after its queued work)."""
        with self._lock:
            stream, self._default_stream = self._default_stream, None
            events, self._sync_events = self._sync_events, []
        if stream is not None:
            self.destroy_stream(stream)
        for ev in events:
            self.destroy_event(ev)

    def __enter__(self) -> Device:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    # stream arguments
    def resolve_stream(self, stream: Any = None, arrays: Iterable[Any] = (), *, default: Any = None) -> int:
        """The raw handle for a user's ``stream=`` argument.

        Accepted: an int handle; a :class:`Stream` of this kind of device; on GPUs also objects
        with ``__cuda_stream__`` (returning ``(0, handle)``), ``torch.cuda.Stream``
        (``.cuda_stream``) and CuPy streams (``.ptr``). Streams of the wrong kind -- a CUDA stream
        on the host backend, a host stream on a GPU -- raise ``TypeError``.

        With ``stream=None``: on GPUs, the current torch stream when ``arrays`` holds torch GPU
        tensors, the current CuPy stream for CuPy arrays (the framework's default stream is the
        legacy stream, handle 0, which is then the right one: it is where that framework's work
        runs); otherwise ``default`` (resolved the same way) when given, else
        :attr:`default_stream`.
        """
        if stream is None:
            if arrays:
                current = self._framework_stream(arrays)
                if current is not None:
                    return current
            if default is not None:
                return self.resolve_stream(default)
            return self.default_stream
        if isinstance(stream, Stream):
            return self._own_stream(stream)
        if isinstance(stream, bool):
            raise TypeError("stream must be a stream object or an int handle, not a bool")
        if isinstance(stream, int) or hasattr(type(stream), "__index__"):
            return self._int_stream(operator.index(stream))
        gpu = _gpu_stream_handle(stream)
        if gpu is not None:
            return self._foreign_gpu_stream(stream, gpu)
        raise TypeError(
            f"stream must be an int handle, a pycoll Stream or a {self.kind} stream object, "
            f"not {type(stream).__qualname__}"
        )

    def _own_stream(self, stream: Stream) -> int:
        if stream.device.kind != self.kind:
            raise TypeError(
                f"a {stream.device.kind} stream cannot be used on {self!r}; use a stream of the {self.kind} device"
            )
        if stream.device.device_id != self.device_id:
            raise ValueError(f"the stream belongs to {stream.device!r}, not to {self!r}")
        return stream.handle

    def _int_stream(self, handle: int) -> int:
        if handle < 0:
            raise ValueError(f"stream handle must be >= 0, got {handle}")
        return handle

    def _foreign_gpu_stream(self, stream: Any, handle: int) -> int:
        raise NotImplementedError

    def _framework_stream(self, arrays: Iterable[Any]) -> Optional[int]:
        return None

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.kind}:{self.device_id}>"


def _gpu_stream_handle(obj: Any) -> Optional[int]:
    """The handle of a GPU stream object of a known framework, else None."""
    proto = getattr(obj, "__cuda_stream__", None)
    if proto is not None:
        try:
            version, handle = proto() if callable(proto) else proto
        except (TypeError, ValueError):
            raise TypeError(f"{type(obj).__qualname__}.__cuda_stream__ did not return (version, handle)") from None
        if version != 0:
            raise ValueError(f"unsupported __cuda_stream__ protocol version {version} (pycoll reads version 0)")
        return int(handle)
    handle = getattr(obj, "cuda_stream", None)  # torch.cuda.Stream (CUDA and ROCm builds)
    if isinstance(handle, int):
        return handle
    if type(obj).__module__.split(".")[0] == "cupy":
        handle = getattr(obj, "ptr", None)
        if isinstance(handle, int):
            return handle
    return None


def _check_copy(ptr: int, nbytes: int) -> int:
    if isinstance(ptr, bool) or not isinstance(ptr, int) or ptr <= 0:
        raise ValueError(f"a copy needs a device pointer (an int > 0), got {ptr!r}")
    if isinstance(nbytes, bool) or not isinstance(nbytes, int) or nbytes < 0:
        raise ValueError(f"a copy's size must be an int >= 0, got {nbytes!r}")
    return nbytes


# --- host --------------------------------------------------------------------------------------

# live host stream handle -> the library that created it; an int is only accepted as a host
# stream when it is in here, so a CUDA stream handle can never reach the host library
def _handle_text(handle: int) -> str:
    """A stream handle as an error names it: hexadecimal, as an address (a negative one as it was given)."""
    return f"0x{handle:x}" if handle >= 0 else str(handle)


_HOST_STREAMS: Dict[int, Any] = {}
_HOST_STREAMS_LOCK = threading.Lock()


class HostDevice(Device):
    """Streams and events of pycoll's host library (``pycoll_host.h``).

    ``library``: a loaded host library (``pycoll._bindings.load("host")``). Stream 0 runs an
    operation synchronously in the calling thread. Host events always measure time (``timing``
    is accepted and ignored). Integer stream handles are accepted only for live streams created
    through a :class:`HostDevice` of the same library.
    """

    kind = "host"
    backend = "host"
    events_timed = True
    _stream_destroy_blocks = True

    def __init__(self, library: Any) -> None:
        super().__init__()
        has = getattr(library, "has", None)
        if has is not None and not has("pycollStreamCreate"):
            raise NotSupported(
                "pycollStreamCreate",
                library=getattr(library, "path", ""),
                detail="HostDevice needs pycoll's host library (load('host'))",
            )
        self.library: Library = library
        lib = library
        # the library's C functions, bound over the methods once
        self.query_event = lib.host_event_query  # type: ignore[method-assign]
        self.record_event = lib.host_event_record  # type: ignore[method-assign]
        self.query_stream = lib.host_stream_query  # type: ignore[method-assign]
        self.synchronize_stream = lib.host_stream_synchronize  # type: ignore[method-assign]
        self.synchronize_event = lib.host_event_synchronize  # type: ignore[method-assign]
        self.stream_wait_event = lib.host_stream_wait_event  # type: ignore[method-assign]
        self.destroy_event = lib.host_event_destroy  # type: ignore[method-assign]
        self.elapsed_ms = lib.host_event_elapsed_ms  # type: ignore[method-assign]
        self._flags = has is None or has("pycollStreamSetFlags")
        if has is None or has("pycollEventWait"):  # in C, GIL released (an older host library: the base polls)
            self.wait_event = lib.host_event_wait  # type: ignore[method-assign]

    def create_stream(self) -> int:
        # a thread waiting for one of its events may run the work queued before it that the stream's thread has
        # not begun (within its wait): one thread handoff fewer
        handle = self.library.host_stream_create(_HOST_STREAM_HELP if self._flags else 0)
        with _HOST_STREAMS_LOCK:
            _HOST_STREAMS[handle] = self.library
        return handle

    def destroy_stream(self, stream: int) -> None:
        with _HOST_STREAMS_LOCK:
            if _HOST_STREAMS.get(stream) is not self.library:
                raise ValueError(f"{_handle_text(stream)} is not a live host stream of {self.library!r}")
            del _HOST_STREAMS[stream]
        self.library.host_stream_destroy(stream)

    def create_event(self, timing: bool = False) -> int:
        return self.library.host_event_create()

    def copy_to_device(self, dst_ptr: int, src: bytes, stream: int) -> None:
        data = _check_copy(dst_ptr, len(src))
        self.synchronize_stream(stream)  # host memory: ordered by waiting for the stream's earlier work
        ctypes.memmove(dst_ptr, bytes(src), data)

    def copy_to_host(self, src_ptr: int, nbytes: int, stream: int) -> bytes:
        _check_copy(src_ptr, nbytes)
        self.synchronize_stream(stream)
        return ctypes.string_at(src_ptr, nbytes)

    def capture_id(self, stream: int) -> Optional[int]:
        return None  # host streams never capture a graph (the emulated GPU's runtime does, on a CudaDevice)

    def allow_inline(self, stream: int, allowed: bool, waiters_run: bool = False) -> None:
        if self._flags:
            flags = (_HOST_STREAM_INLINE if allowed else 0) | (_HOST_STREAM_HELP if waiters_run else 0)
            self.library.host_stream_set_flags(stream, flags)

    def _int_stream(self, handle: int) -> int:
        if handle == 0:
            return 0
        owner = _HOST_STREAMS.get(handle)
        if owner is self.library:
            return handle
        if owner is None:
            try:  # one made with the library's own call (host_stream_create): the library knows its live handles
                self.library.host_stream_query(handle)
                return handle
            except (NCCLError, ValueError, TypeError, OverflowError):
                pass
            raise ValueError(
                f"{_handle_text(handle)} is not a live host stream of {self.library!r}: pass a Stream from "
                "HostDevice.new_stream(), a handle from HostDevice.create_stream() or from the library's "
                "host_stream_create() (a CUDA stream handle cannot be used with the host backend)"
            )
        raise ValueError(f"host stream {_handle_text(handle)} belongs to another host library than {self.library!r}")

    def _foreign_gpu_stream(self, stream: Any, handle: int) -> int:
        raise TypeError(
            f"a GPU stream ({type(stream).__qualname__}) cannot be used with the host backend: "
            "host collectives run on host streams (HostDevice.new_stream()) or stream=None"
        )

    def __repr__(self) -> str:
        return f"<HostDevice {getattr(self.library, 'path', self.library)!r}>"


# array type -> (framework name, function giving the framework's current stream for an array)
_FRAMEWORK_STREAMS: Dict[type, Tuple[str, Callable[[Any], int]]] = {}


def register_framework_stream(array_type: type, name: str, current_stream: Callable[[Any], int]) -> None:
    """Teach :meth:`Device.resolve_stream` the current stream of another array framework.

    With ``stream=None``, arrays of ``array_type`` (or a subclass) run on ``current_stream(array)``
    on GPU devices, as torch tensors run on torch's current stream. The emulated GPU registers its
    torch-like and CuPy-like arrays; torch and CuPy themselves need no registration.
    """
    _FRAMEWORK_STREAMS[array_type] = (name, current_stream)


def torch_current_stream(torch: Any, tensor: Any) -> int:
    """torch's current stream on ``tensor``'s GPU, as a handle. One call into torch's C core where it
    has one (``torch._C._cuda_getCurrentRawStream``, what its compiled code uses), else
    ``torch.cuda.current_stream(device).cuda_stream`` (microseconds of Python per call)."""
    raw = getattr(torch._C, "_cuda_getCurrentRawStream", None)
    if raw is not None:
        return int(raw(tensor.get_device()))
    return int(torch.cuda.current_stream(tensor.device).cuda_stream)


def _registered_framework(array: Any) -> Optional[Tuple[str, Callable[[Any], int]]]:
    for klass in type(array).__mro__:
        entry = _FRAMEWORK_STREAMS.get(klass)
        if entry is not None:
            return entry
    return None


# --- CUDA and HIP ------------------------------------------------------------------------------

_NOT_READY = 600  # cudaErrorNotReady == hipErrorNotReady
_STREAM_NON_BLOCKING = 0x1  # cudaStreamNonBlocking == hipStreamNonBlocking
_EVENT_DISABLE_TIMING = 0x2  # cudaEventDisableTiming == hipEventDisableTiming
_CAPTURE_IMPLICIT = 906  # cudaErrorStreamCaptureImplicit == hipErrorStreamCaptureImplicit
_INVALID_RESOURCE_HANDLE = (400,)  # cuda/hipErrorInvalidResourceHandle: elapsed time of untimed events
_HOST_STREAM_INLINE = 0x1  # pycoll_host.h PYCOLL_STREAM_INLINE
_HOST_STREAM_HELP = 0x4  # pycoll_host.h PYCOLL_STREAM_HELP
_STREAM_LEGACY = 1  # cudaStreamLegacy
_STREAM_PER_THREAD = 2  # cudaStreamPerThread / hipStreamPerThread
_INVALID_HANDLE = 400  # cudaErrorInvalidResourceHandle / hipErrorInvalidHandle
_MEMCPY_H2D, _MEMCPY_D2H = 1, 2  # cuda/hipMemcpyHostToDevice, cuda/hipMemcpyDeviceToHost


_OWN_THREAD = threading.local()  # the device a pycoll thread made current (enter_own_thread)


class _GpuDevice(Device):
    """CUDA and HIP share everything but the module and the function prefix."""

    _prefix = ""
    _extra = ""
    _import_name = ""

    def __init__(self, device_id: int = 0, runtime: Any = None) -> None:
        super().__init__()
        if runtime is None:
            runtime = self._import_runtime()
        self.runtime = runtime
        p = self._prefix
        fn = lambda name: getattr(runtime, p + name)  # noqa: E731
        self._get_device, self._set_device = fn("GetDevice"), fn("SetDevice")
        self._stream_create, self._stream_destroy = fn("StreamCreateWithFlags"), fn("StreamDestroy")
        self._stream_sync, self._stream_query = fn("StreamSynchronize"), fn("StreamQuery")
        self._stream_wait, self._is_capturing = fn("StreamWaitEvent"), fn("StreamIsCapturing")
        self._event_create, self._event_destroy = fn("EventCreateWithFlags"), fn("EventDestroy")
        self._event_record, self._event_query = fn("EventRecord"), fn("EventQuery")
        self._event_sync, self._event_elapsed = fn("EventSynchronize"), fn("EventElapsedTime")
        self._memcpy = getattr(runtime, p + "MemcpyAsync", None)
        kinds = getattr(runtime, p + "MemcpyKind", None)
        self._h2d = getattr(kinds, p + "MemcpyHostToDevice", _MEMCPY_H2D) if kinds is not None else _MEMCPY_H2D
        self._d2h = getattr(kinds, p + "MemcpyDeviceToHost", _MEMCPY_D2H) if kinds is not None else _MEMCPY_D2H
        count = self._call(fn("GetDeviceCount"), p + "GetDeviceCount")
        device_id = operator.index(device_id)
        if not 0 <= device_id < count:
            raise ValueError(f"{self.kind} device {device_id} does not exist: {count} device(s) visible")
        self.device_id = device_id

    @classmethod
    def _import_runtime(cls) -> Any:
        try:
            return importlib.import_module(cls._import_name)
        except ImportError as exc:
            raise ImportError(
                f"{cls.__name__} needs {cls._import_name}: install it with "
                f"pip install 'pycoll-nccl[{cls._extra}]' ({exc})"
            ) from exc

    def _error(self, function: str, err: Any, hint: str = "") -> DeviceError:
        code = int(err)
        name = getattr(err, "name", "") or f"{self._prefix}Error({code})"
        text = ""
        try:
            res = getattr(self.runtime, self._prefix + "GetErrorString")(err)
            text = res[-1] if isinstance(res, tuple) else res
            text = text.decode() if isinstance(text, bytes) else str(text)
        except Exception:
            pass
        return DeviceError(function, code, name, text, hint)

    def _call(self, fn: Callable[..., Any], name: str, *args: Any) -> Any:
        res = fn(*args)
        err = res[0] if isinstance(res, tuple) else res
        if int(err) != 0:
            raise self._error(name, err)
        return res[1] if isinstance(res, tuple) and len(res) > 1 else None

    def _ready(self, fn: Callable[..., Any], name: str, handle: int) -> bool:
        res = fn(handle)
        err = int(res[0] if isinstance(res, tuple) else res)
        if err == 0:
            return True
        if err == _NOT_READY:
            return False
        raise self._error(name, res[0] if isinstance(res, tuple) else res)

    def _on_device(self, create: Callable[..., Any], name: str, *args: Any) -> int:
        """Run a creating call with this device current, restoring the caller's device."""
        p = self._prefix
        current = self._call(self._get_device, p + "GetDevice")
        if current != self.device_id:
            self._call(self._set_device, p + "SetDevice", self.device_id)
        try:
            return int(self._call(create, name, *args))
        finally:
            if current != self.device_id:
                self._call(self._set_device, p + "SetDevice", current)

    def make_current(self) -> None:
        self._call(self._set_device, self._prefix + "SetDevice", self.device_id)

    def swap_current(self) -> Optional[int]:
        current = self._call(self._get_device, self._prefix + "GetDevice")
        if current == self.device_id:
            return None
        self._call(self._set_device, self._prefix + "SetDevice", self.device_id)
        return int(current)

    def restore_current(self, previous: Optional[int]) -> None:
        if previous is not None:
            self._call(self._set_device, self._prefix + "SetDevice", previous)

    def enter_own_thread(self) -> None:
        if getattr(_OWN_THREAD, "device", None) == (self.kind, self.device_id):
            return
        if threading.current_thread().name.startswith("pycoll-"):
            self.make_current()
            _OWN_THREAD.device = (self.kind, self.device_id)

    def create_stream(self) -> int:
        return self._on_device(self._stream_create, self._prefix + "StreamCreateWithFlags", _STREAM_NON_BLOCKING)

    def destroy_stream(self, stream: int) -> None:
        self._call(self._stream_destroy, self._prefix + "StreamDestroy", stream)

    def synchronize_stream(self, stream: int) -> None:
        self._call(self._stream_sync, self._prefix + "StreamSynchronize", stream)

    def query_stream(self, stream: int) -> bool:
        return self._ready(self._stream_query, self._prefix + "StreamQuery", stream)

    def stream_wait_event(self, stream: int, event: int) -> None:
        self._call(self._stream_wait, self._prefix + "StreamWaitEvent", stream, event, 0)

    def create_event(self, timing: bool = False) -> int:
        flags = 0 if timing else _EVENT_DISABLE_TIMING
        return self._on_device(self._event_create, self._prefix + "EventCreateWithFlags", flags)

    def destroy_event(self, event: int) -> None:
        self._call(self._event_destroy, self._prefix + "EventDestroy", event)

    def record_event(self, event: int, stream: int) -> None:
        res = self._event_record(event, stream)
        err = res[0] if isinstance(res, tuple) else res
        if int(err) == _INVALID_HANDLE:  # the event is this device's, which leaves the stream
            raise self._error(self._prefix + "EventRecord", err, self._dead_stream(stream))
        if int(err) != 0:
            raise self._error(self._prefix + "EventRecord", err)

    def query_event(self, event: int) -> bool:
        return self._ready(self._event_query, self._prefix + "EventQuery", event)

    def synchronize_event(self, event: int) -> None:
        self._call(self._event_sync, self._prefix + "EventSynchronize", event)

    def elapsed_ms(self, start: int, end: int) -> float:
        res = self._event_elapsed(start, end)
        err = res[0]
        if int(err) != 0:
            hint = "both events must be created with timing=True" if int(err) in _INVALID_RESOURCE_HANDLE else ""
            raise self._error(self._prefix + "EventElapsedTime", err, hint)
        return float(res[1])

    def _rt_stream(self, stream: int) -> int:
        """The handle a runtime call takes for ``stream`` (CUDA: 0 is spelled cudaStreamLegacy)."""
        return stream

    def _copy(self, dst: int, src: int, nbytes: int, kind: Any, stream: int) -> None:
        """One ``MemcpyAsync`` on ``stream``, then a wait for it (an event recorded after it)."""
        name = self._prefix + "MemcpyAsync"
        if self._memcpy is None:
            raise NotSupported(name, detail=f"the {self.kind} runtime module has no {name}")
        previous = self.swap_current()
        try:
            self._call(self._memcpy, name, dst, src, nbytes, kind, self._rt_stream(stream))
            event = self.create_event()
            try:
                self.record_event(event, stream)
                self.synchronize_event(event)
            finally:
                self.destroy_event(event)
        finally:
            self.restore_current(previous)

    def copy_to_device(self, dst_ptr: int, src: bytes, stream: int) -> None:
        n = _check_copy(dst_ptr, len(src))
        if n:
            staging = (ctypes.c_char * n).from_buffer_copy(src)  # alive until the copy has run
            self._copy(dst_ptr, ctypes.addressof(staging), n, self._h2d, stream)

    def copy_to_host(self, src_ptr: int, nbytes: int, stream: int) -> bytes:
        n = _check_copy(src_ptr, nbytes)
        if not n:
            return b""
        out = (ctypes.c_char * n)()
        self._copy(ctypes.addressof(out), src_ptr, n, self._d2h, stream)
        return out.raw

    def _dead_stream(self, stream: int) -> str:
        return (f"stream 0x{stream:x} is no live stream of device {self.device_id}, this communicator's (a stream of "
                "another device, or one destroyed)")

    def capture_status(self, stream: int) -> int:
        res = self._is_capturing(stream)
        err = int(res[0])
        if err == _INVALID_HANDLE:
            raise self._error(self._prefix + "StreamIsCapturing", res[0], self._dead_stream(stream))
        if err == _CAPTURE_IMPLICIT:
            raise self._error(
                self._prefix + "StreamIsCapturing",
                res[0],
                "the legacy default stream (0) cannot be used while another stream is capturing a graph; "
                "pass the capturing stream",
            )
        if err != 0:
            raise self._error(self._prefix + "StreamIsCapturing", res[0])
        return int(res[1])

    def _capture_sequence_id(self, stream: int) -> int:
        info = getattr(self.runtime, self._prefix + "StreamGetCaptureInfo", None)
        if info is None:
            return 0
        try:
            res = info(stream)
        except Exception:
            return 0
        if not isinstance(res, tuple) or int(res[0]) != 0 or len(res) < 3:
            return 0
        return int(res[2])

    def _int_stream(self, handle: int) -> int:
        if handle in _HOST_STREAMS:
            raise TypeError(f"0x{handle:x} is a host stream of pycoll's host library; it cannot be used on {self!r}")
        if handle == _STREAM_PER_THREAD:
            raise ValueError(
                f"stream {handle} ({self._prefix}StreamPerThread) names the calling thread's default stream; "
                "NCCL may launch from a thread of its own, where it names another one: pass a created stream, "
                "0 (the legacy default stream) or the framework's current stream"
            )
        return super()._int_stream(handle)

    def _foreign_gpu_stream(self, stream: Any, handle: int) -> int:
        return self._int_stream(handle)

    def _framework_stream(self, arrays: Iterable[Any]) -> Optional[int]:
        torch: Any = sys.modules.get("torch")
        cupy: Any = sys.modules.get("cupy")
        current: Dict[str, int] = {}  # framework -> its current stream
        for a in arrays:
            other: Optional[Callable[[Any], int]] = None
            if torch is not None and isinstance(a, torch.Tensor) and a.is_cuda:
                kind = "torch"
            elif cupy is not None and isinstance(a, cupy.ndarray):
                kind = "CuPy"
            elif _FRAMEWORK_STREAMS and (entry := _registered_framework(a)) is not None:
                kind, other = entry
            else:
                continue
            if kind not in current:
                if other is not None:
                    current[kind] = int(other(a))
                elif kind == "torch":
                    current[kind] = torch_current_stream(torch, a)
                else:
                    current[kind] = int(cupy.cuda.get_current_stream().ptr)
        if len(set(current.values())) > 1:
            first, second = sorted(current, key=lambda k: (k != "torch", k != "CuPy", k))[:2]
            raise ValueError(f"the arrays come from both {first} and {second}, whose current streams differ "
                             f"({current[first]:#x} and {current[second]:#x}): pass stream=")
        found = next(iter(current), None)
        handle = current[found] if found is not None else None
        if handle == _STREAM_PER_THREAD:  # as refused when passed: it means another stream in another thread
            raise ValueError(
                f"the {found} current stream is {self._prefix}StreamPerThread ({handle}), the calling thread's "
                "default stream; NCCL may launch from a thread of its own, where it names another one: pass "
                "stream= a created stream or 0 (the legacy default stream)"
            )
        return handle


class CudaDevice(_GpuDevice):
    """CUDA streams and events of GPU ``device_id`` through cuda-bindings (``cuda.bindings.runtime``).

    Raises ``ImportError`` naming the ``pycoll-nccl[cuda]`` extra when cuda-bindings is missing,
    :class:`DeviceError` when there is no usable driver, ``ValueError`` for a device that does
    not exist. ``runtime`` replaces the module (for tests); ``driver`` is then the
    :attr:`driver` table that goes with it (default: none).
    """

    kind = "cuda"
    backend = "nccl"
    _prefix = "cuda"
    _extra = "cuda"
    _import_name = "cuda.bindings.runtime"
    _stream_class = CudaStream

    def __init__(self, device_id: int = 0, runtime: Any = None, driver: Any = None) -> None:
        real = runtime is None
        super().__init__(device_id, runtime)
        if driver is None and real:
            from ._bindings import cuda_driver

            driver = cuda_driver()
        #: the CUDA driver's per-operation functions (a ``pycoll._bindings.CudaDriver``) that the compiled
        #: operation path calls instead of this object's methods (event record and query, capture status,
        #: the current device): the process's ``libcuda.so.1`` with the real runtime, ``driver`` for another
        #: runtime (the emulated GPU's); None: every call goes through the runtime module
        self.driver = driver

    # Runtime calls name the legacy default stream cudaStreamLegacy (1): through cuda-bindings, 0
    # means the per-thread stream when CUDA_PYTHON_CUDA_PER_THREAD_DEFAULT_STREAM=1, while NCCL
    # (its own static runtime) always reads 0 as the legacy stream. NCCL calls keep 0.

    def record_event(self, event: int, stream: int) -> None:
        super().record_event(event, stream or _STREAM_LEGACY)

    def stream_wait_event(self, stream: int, event: int) -> None:
        super().stream_wait_event(stream or _STREAM_LEGACY, event)

    def query_stream(self, stream: int) -> bool:
        return super().query_stream(stream or _STREAM_LEGACY)

    def synchronize_stream(self, stream: int) -> None:
        super().synchronize_stream(stream or _STREAM_LEGACY)

    def _rt_stream(self, stream: int) -> int:
        return stream or _STREAM_LEGACY


class HipDevice(_GpuDevice):
    """HIP streams and events of GPU ``device_id`` through hip-python (``hip.hip``).

    Raises ``ImportError`` naming the ``pycoll-nccl[rocm]`` extra when hip-python is missing,
    :class:`DeviceError` when there is no usable runtime, ``ValueError`` for a device that does
    not exist. ``runtime`` replaces the module (for tests).
    """

    kind = "hip"
    backend = "rccl"
    _prefix = "hip"
    _extra = "rocm"
    _import_name = "hip.hip"


def open_device(backend: str, *, library: Any = None, device_id: int = 0) -> Device:
    """The :class:`Device` for a backend: ``"host"`` (needs ``library``), ``"nccl"``, ``"rccl"``."""
    if backend == "host":
        if library is None:
            raise ValueError("the host backend needs the loaded host library: open_device('host', library=...)")
        return HostDevice(library)
    if backend == "nccl":
        return CudaDevice(device_id)
    if backend == "rccl":
        return HipDevice(device_id)
    raise ValueError(f"unknown backend {backend!r}; expected 'host', 'nccl' or 'rccl'")


# --- discovery ---------------------------------------------------------------------------------


def _has_module(name: str) -> bool:
    try:
        return importlib.util.find_spec(name) is not None
    except (ImportError, ValueError):
        return False


def _ctypes_count(libnames: Tuple[str, ...], init: Optional[str], count: str) -> int:
    import ctypes

    for libname in libnames:
        try:
            lib = ctypes.CDLL(libname)
        except OSError:
            continue
        if init is not None and getattr(lib, init)(0) != 0:
            return 0
        n = ctypes.c_int(0)
        return n.value if getattr(lib, count)(ctypes.byref(n)) == 0 else 0
    return 0


def cuda_device_count() -> int:
    """How many CUDA GPUs this process can use; 0 without a driver or GPU, never an exception.

    Asks cuda-bindings when it is installed, else torch when it is already imported (torch is
    never imported here), else the driver library (libcuda.so.1) directly.
    """
    try:
        if _has_module("cuda.bindings"):
            from cuda.bindings import runtime

            err, n = runtime.cudaGetDeviceCount()
            return int(n) if int(err) == 0 else 0
        torch = sys.modules.get("torch")
        if torch is not None and getattr(torch, "cuda", None) is not None:
            return int(torch.cuda.device_count()) if not getattr(torch.version, "hip", None) else 0
        return _ctypes_count(("libcuda.so.1",), "cuInit", "cuDeviceGetCount")
    except Exception as exc:  # a broken install must not break backend selection
        _log.debug("cuda_device_count: %r", exc)
        return 0


def rocm_device_count() -> int:
    """How many ROCm GPUs this process can use; 0 without a runtime or GPU, never an exception.

    Asks hip-python when it is installed, else torch (ROCm build) when already imported, else
    the HIP runtime library (libamdhip64.so) directly.
    """
    try:
        if _has_module("hip"):
            try:
                from hip import hip

                res = hip.hipGetDeviceCount()
                err, n = res if isinstance(res, tuple) else (0, res)
                return int(n) if int(err) == 0 else 0
            except (ImportError, RuntimeError, OSError) as exc:  # hip-python without the runtime
                _log.debug("rocm_device_count: hip-python: %r", exc)
        torch = sys.modules.get("torch")
        if torch is not None and getattr(torch, "cuda", None) is not None:
            return int(torch.cuda.device_count()) if getattr(torch.version, "hip", None) else 0
        return _ctypes_count(("libamdhip64.so", "libamdhip64.so.7", "libamdhip64.so.6"), None, "hipGetDeviceCount")
    except Exception as exc:
        _log.debug("rocm_device_count: %r", exc)
        return 0


def auto_backend() -> str:
    """``"nccl"`` when a CUDA GPU is visible, else ``"rccl"`` when a ROCm GPU is, else ``"host"``."""
    if cuda_device_count() > 0:
        return "nccl"
    if rocm_device_count() > 0:
        return "rccl"
    return "host"
