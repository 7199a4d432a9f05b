"""Exceptions raised by pycoll.

Everything pycoll raises on its own behalf derives from :class:`PycollError`.

* :class:`NCCLError` and one subclass per ``ncclResult_t`` value: a call into the loaded NCCL-ABI
  library returned an error. Each carries the numeric ``code``, NCCL's ``error_string`` for it and
  the text of ``ncclGetLastError`` captured right after the failing call (``last_error``).
  Where a builtin exception fits, the class also derives from it (``InvalidArgument`` is a
  ``ValueError``, ``RemoteError`` a ``ConnectionError``, ...), so generic handlers keep working.
* :class:`CommFailure`: the communicator can no longer run collectives (a peer died, an operation
  timed out, the communicator was aborted or revoked). Fault-tolerant loops catch this one and
  reshape.
* :class:`NotSupported`: the loaded library does not export the function that was called.
* :class:`LibraryError`: a shared object could not be found or is not an NCCL-ABI library.
"""

from __future__ import annotations

from typing import Any, Dict, List, Optional, Tuple, Type

__all__ = [
    "PycollError",
    "RankDiscoveryError",
    "LibraryError",
    "NotSupported",
    "NCCLError",
    "UnhandledCudaError",
    "NCCLSystemError",
    "InternalError",
    "InvalidArgument",
    "InvalidUsage",
    "RemoteError",
    "InProgressError",
    "NCCLTimeoutError",
    "CommFailure",
    "CommTimeout",
    "CommAborted",
    "CommRevoked",
    "PeerFailure",
    "AsyncCommError",
    "CommStateError",
    "WaitTimeout",
    "CaptureError",
    "StoreError",
    "StoreTimeout",
    "StoreAuthError",
    "StoreLost",
    "error_class",
    "RESULT_NAMES",
]

#: ncclResult_t value -> its C name.
RESULT_NAMES: Dict[int, str] = {
    0: "ncclSuccess",
    1: "ncclUnhandledCudaError",
    2: "ncclSystemError",
    3: "ncclInternalError",
    4: "ncclInvalidArgument",
    5: "ncclInvalidUsage",
    6: "ncclRemoteError",
    7: "ncclInProgress",
    8: "ncclTimeout",
}


def _state(exc: BaseException) -> Optional[Dict[str, Any]]:
    """What a pickled error of pycoll's carries besides its constructor's arguments: every attribute set on it (an
    init error's ``comm``/``comms``, the handle its caller must abort; the notes pycoll or the program added), so that
    a supervisor in another process sees what the program would have."""
    return dict(exc.__dict__) or None


class PycollError(Exception):
    """Base class of every exception pycoll raises on its own behalf."""


class LibraryError(PycollError, OSError):
    """A shared object could not be loaded, or it does not export the NCCL C ABI."""

    def __init__(self, message: str, path: Optional[str] = None) -> None:
        super().__init__(message)
        self.path = path

    def __str__(self) -> str:
        return str(self.args[0]) if self.args else ""

    def __reduce__(self) -> Any:
        return (type(self), (str(self), self.path), _state(self))


class NotSupported(PycollError, NotImplementedError):
    """The loaded library lacks a function (``function``), introduced in NCCL ``introduced``."""

    def __init__(self, function: str, introduced: str = "", library: str = "", detail: str = "") -> None:
        self.function = function
        self.introduced = introduced
        self.library = library
        self.detail = detail
        msg = f"{function} is not available"
        if library:
            msg += f" in {library}"
        if introduced:
            msg += f"; it was introduced in NCCL {introduced}"
        if detail:
            msg += f" ({detail})"
        super().__init__(msg)

    def __reduce__(self) -> Any:
        return (type(self), (self.function, self.introduced, self.library, self.detail), _state(self))


class CommFailure(PycollError):
    """The communicator failed and can no longer run collectives.

    Raised for a peer that died (:class:`RemoteError`), an operation that timed out
    (:class:`CommTimeout`), a communicator that was aborted (:class:`CommAborted`) or revoked
    (:class:`CommRevoked`), and any other asynchronous error (:class:`AsyncCommError`). The usual
    response is to reshape: ``except pycoll.CommFailure: comm = elastic.reshape()``.
    """


class NCCLError(PycollError):
    """A call into the NCCL-ABI library returned an error.

    Attributes:
        code: the ``ncclResult_t`` value.
        function: the C function that failed, e.g. ``"ncclCommInitRank"`` (may be empty).
        error_string: ``ncclGetErrorString(code)``.
        last_error: ``ncclGetLastError`` captured right after the failing call (may be empty).
        library: path of the library the call went to (may be empty).
    """

    code: int = -1

    def __init__(
        self,
        code: Optional[int] = None,
        function: str = "",
        error_string: str = "",
        last_error: str = "",
        library: str = "",
    ) -> None:
        if code is not None:
            self.code = int(code)
        self.function = function
        self.error_string = error_string
        self.last_error = last_error
        self.library = library
        super().__init__(self._format())

    @property
    def name(self) -> str:
        """The C name of the result code, e.g. ``"ncclRemoteError"``."""
        return RESULT_NAMES.get(self.code, f"ncclResult({self.code})")

    def _format(self) -> str:
        head = f"{self.function} failed: " if self.function else ""
        msg = f"{head}{self.name} ({self.code})"
        if self.error_string:
            msg += f": {self.error_string}"
        if self.last_error:
            msg += f" -- {self.last_error}"
        return msg

    def __str__(self) -> str:
        return self._format()

    def __reduce__(self) -> Any:
        return (type(self), (self.code, self.function, self.error_string, self.last_error, self.library), _state(self))


class UnhandledCudaError(NCCLError):
    """ncclUnhandledCudaError (1): a CUDA call failed (no GPU or driver, for example)."""

    code = 1


class NCCLSystemError(NCCLError, OSError):
    """ncclSystemError (2): a system call failed."""

    code = 2


class InternalError(NCCLError):
    """ncclInternalError (3): an internal error of the library."""

    code = 3


class InvalidArgument(NCCLError, ValueError):
    """ncclInvalidArgument (4): a bad argument; the communicator stays usable."""

    code = 4


class InvalidUsage(NCCLError, RuntimeError):
    """ncclInvalidUsage (5): the call is not allowed in the communicator's current state."""

    code = 5


class RemoteError(NCCLError, CommFailure, ConnectionError):
    """ncclRemoteError (6): a peer process exited or the network failed."""

    code = 6


class InProgressError(NCCLError):
    """ncclInProgress (7) where completion was required.

    Bindings return ``IN_PROGRESS`` as a status instead of raising; this class exists for code
    paths that need a finished operation and got an unfinished one.
    """

    code = 7


class NCCLTimeoutError(NCCLError, TimeoutError):
    """ncclTimeout (8): a timeout inside the library (device-API barriers; the host library's rendezvous, where
    ranks are still missing after ``PYCOLL_HOST_INIT_TIMEOUT``: :func:`pycoll.init` raises it as a ``CommTimeout``)."""

    code = 8


_BY_CODE: Dict[int, Type[NCCLError]] = {
    cls.code: cls
    for cls in (
        UnhandledCudaError,
        NCCLSystemError,
        InternalError,
        InvalidArgument,
        InvalidUsage,
        RemoteError,
        InProgressError,
        NCCLTimeoutError,
    )
}


def error_class(code: int) -> Type[NCCLError]:
    """Return the :class:`NCCLError` subclass for an ``ncclResult_t`` value (the base for unknown codes)."""
    return _BY_CODE.get(int(code), NCCLError)


class CommTimeout(CommFailure, TimeoutError):
    """An operation on a communicator did not complete within its timeout.

    Attributes name what timed out: ``comm_name``, ``op``, ``seq`` (its sequence id: the collective one, or
    for a send or receive, ``peer`` set, the point-to-point one, as the flight recorder numbers them),
    ``elapsed`` and ``timeout`` in seconds. ``behind``: the ranks of the communicator that the watchdog found
    had not issued the operation (by their answers, or stopped reporting), as its line names them; the
    message then ends with that verdict on the other ranks (a finalize's, ``destroy()``'s: the ranks whose last
    progress record says they had not begun theirs). None where no watchdog looked (``watchdog=False``,
    no store), ``()`` where it found no rank behind.
    """

    def __init__(
        self,
        message: str,
        comm_name: str = "",
        op: str = "",
        seq: int = -1,
        elapsed: float = 0.0,
        timeout: float = 0.0,
        peer: Optional[int] = None,
        behind: Optional[Tuple[int, ...]] = None,
    ) -> None:
        super().__init__(message)
        self.comm_name = comm_name
        self.op = op
        self.seq = seq
        self.elapsed = elapsed
        self.timeout = timeout
        self.peer = peer
        self.behind = behind

    def __str__(self) -> str:
        return str(self.args[0]) if self.args else ""

    def __reduce__(self) -> Any:
        return (type(self), (str(self), self.comm_name, self.op, self.seq, self.elapsed, self.timeout, self.peer,
                             self.behind), _state(self))


class CommAborted(CommFailure):
    """The communicator was aborted (by the user or by the watchdog); it cannot be used any more."""


class CommRevoked(CommFailure):
    """The communicator was revoked: collectives are refused, but split and shrink still work."""


class PeerFailure(CommFailure):
    """A peer of the communicator is stopped, gone or silent: the watchdog failed the outstanding work
    before its timeout. ``rank`` (in the communicator), ``pid`` (0: unknown) and ``reason`` say which and why."""

    def __init__(self, message: str, rank: int = -1, pid: int = 0, reason: str = "") -> None:
        super().__init__(message)
        self.rank = rank
        self.pid = pid
        self.reason = reason

    def __reduce__(self) -> Any:
        return (type(self), (str(self.args[0]) if self.args else "", self.rank, self.pid, self.reason), _state(self))


class AsyncCommError(CommFailure):
    """The library reported an asynchronous error on the communicator (``code`` holds it)."""

    def __init__(self, message: str, code: int = -1) -> None:
        super().__init__(message)
        self.code = code

    def __reduce__(self) -> Any:
        return (type(self), (str(self.args[0]) if self.args else "", self.code), _state(self))


class WaitTimeout(PycollError, TimeoutError):
    """``Work.wait(timeout=)`` returned before the operation completed: only that wait is over; the operation
    and its communicator are untouched (no failure). A :class:`CommTimeout` is a ``TimeoutError`` too, but a
    failure: a loop that polls with ``wait(timeout=)`` catches this class, not ``TimeoutError``, so as not to
    poll a failed operation for ever."""


class CommStateError(PycollError, RuntimeError):
    """The call is not valid in the communicator's state (used after destroy, finalize twice, ...)."""


class CaptureError(CommStateError):
    """An operation was issued on a stream whose CUDA/HIP graph capture cannot take it.

    Attributes: ``stream`` (the raw handle), ``capture_id`` (the capture's id, or None) and
    ``status`` (the ``cudaStreamCaptureStatus``: 2 = invalidated).
    """

    def __init__(self, message: str, stream: int = 0, capture_id: Optional[int] = None, status: int = 0) -> None:
        super().__init__(message)
        self.stream = stream
        self.capture_id = capture_id
        self.status = status

    def __reduce__(self) -> Any:
        return (type(self), (str(self), self.stream, self.capture_id, self.status), _state(self))


class StoreError(PycollError):
    """A key-value store operation failed."""


class StoreTimeout(StoreError, TimeoutError):
    """A store operation did not complete within its timeout.

    ``keys``: the keys waited for, ``missing``: those still missing (both empty where it was no wait for keys: a
    connection, a handshake, a reply, a lock), ``timeout``: the timeout in seconds (None where not known)."""

    keys: List[str]
    missing: List[str]
    timeout: Optional[float]

    def __init__(self, *args: Any, keys: Optional[List[str]] = None, missing: Optional[List[str]] = None,
                 timeout: Optional[float] = None) -> None:
        super().__init__(*args)
        self.keys = list(keys or [])
        self.missing = list(missing or [])
        self.timeout = timeout


class StoreAuthError(StoreError, PermissionError):
    """The store refused the client's token."""


class StoreLost(StoreError, ConnectionError):
    """The connection to the store failed: its server is gone (the process or host that served it died) or
    unreachable. :class:`pycoll.ElasticGroup` raises it from a reshape or a grow, which need the store: without
    it the members cannot agree on a membership, so it is no :class:`CommFailure` -- a recovery loop must let
    it end the process. ``group``: the name of the elastic group that raised it (None: the store's client)."""

    group: Optional[str] = None


class RankDiscoveryError(PycollError, ValueError):
    """The launcher's environment variables are missing, partial or inconsistent."""
