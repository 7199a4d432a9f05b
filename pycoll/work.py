"""Work: the handle of one enqueued collective or point-to-point operation."""

from __future__ import annotations

import time
from time import monotonic as _monotonic, time_ns as _time_ns
from typing import TYPE_CHECKING, Any, List, Optional, Sequence

from .devices import FIRST_SLEEP_S

if TYPE_CHECKING:  # pragma: no cover
    from .comm import Communicator

__all__ = ["Work"]

_SLICE_S = 5e-3  # longest a wait blocks on an event before it looks at the communicator again
_FINAL = ("completed", "captured")


class Work:
    """One operation on a :class:`~pycoll.Communicator`.

    Completion is read from events recorded on the operation's stream, on every backend. An
    operation enqueued while its stream captures a CUDA graph is ``"captured"``: it runs when the
    graph is replayed (see :meth:`pycoll.Communicator.watch_stream` for a deadline on a replay). The watchdog checks
    outstanding work; a failure it detects reaches the user at :meth:`wait` or at the next call on
    the communicator.

    Work is its communicator's record of the operation: only :mod:`pycoll.comm` sets its
    underscore fields; observers read it through :class:`pycoll.hooks.WorkView` (``last_state``,
    ``error``, ``deadline`` and the attributes below), which never calls into the library.

    Attributes for diagnostics (the flight recorder reads them): ``op`` (e.g. ``"all_reduce"``),
    ``seq`` (the communicator's collective sequence id: incremented by collectives, kept by
    point-to-point operations), ``p2p_seq`` (incremented by sends and receives), ``is_p2p``,
    ``peer``, ``timeout`` (seconds),
    ``time_created_ns``, ``inputs``/``outputs`` (the :class:`pycoll.buffers.Buffer` arguments).
    """

    __slots__ = (
        "comm", "op", "seq", "p2p_seq", "op_id", "async_op", "is_p2p", "peer", "timeout", "stream", "inputs", "outputs",
        "time_created_ns", "t0", "time_started_ns", "time_completed_ns", "duration_ms",
        "_start", "_end", "_state", "_exc", "capture_id", "fr_entry", "__weakref__",
    )

    def __init__(
        self,
        comm: Communicator,
        op: str,
        seq: int,
        p2p_seq: int,
        op_id: int,
        is_p2p: bool,
        peer: Optional[int],
        timeout: float,
        stream: int,
        inputs: Sequence[Any],
        outputs: Sequence[Any],
        async_op: bool = False,
        capture_id: Optional[int] = None,
    ) -> None:
        self.comm = comm
        self.op = op
        self.seq = seq
        self.p2p_seq = p2p_seq
        self.async_op = async_op
        self.op_id = op_id
        self.is_p2p = is_p2p
        self.peer = peer
        self.timeout = timeout
        self.stream = stream
        self.inputs: List[Any] = inputs if type(inputs) is list else list(inputs)
        self.outputs: List[Any] = outputs if type(outputs) is list else list(outputs)
        self.time_created_ns = _time_ns()
        self.t0 = _monotonic()
        self.time_started_ns: Optional[int] = None
        self.time_completed_ns: Optional[int] = None
        self.duration_ms: Optional[float] = None
        self._start: Optional[int] = None  # event handles, returned to the comm's pool at retirement
        self._end: Optional[int] = None
        self._state = "scheduled"
        self._exc: Optional[BaseException] = None
        self.capture_id = capture_id  # the graph capture it was recorded into (state "captured")
        self.fr_entry: Any = None

    # -- public ---------------------------------------------------------------------------------

    @property
    def state(self) -> str:
        """``"scheduled"``, ``"started"``, ``"completed"`` or ``"captured"`` (a failed operation stays
        where it stopped)."""
        if self._state not in _FINAL and self._exc is None:
            self.comm.refresh(self)
        return self._state

    @property
    def last_state(self) -> str:
        """The state as last observed, without querying events (what observers read)."""
        return self._state

    @property
    def error(self) -> Optional[BaseException]:
        """The failure recorded for this operation so far, without querying anything."""
        return self._exc

    @property
    def deadline(self) -> float:
        """``time.monotonic()`` value after which the operation has timed out."""
        return self.t0 + self.timeout

    def release_arrays(self) -> None:
        """Drop the references to the operation's arrays (an abandoned operation need not keep them)."""
        self.inputs = self.outputs = []

    def is_completed(self) -> bool:
        """True once the operation has finished, successfully or not (see :meth:`exception`). Never blocks."""
        if self._exc is not None or self._state in _FINAL:
            return True
        self.comm.refresh(self)
        return self._state in _FINAL or self._exc is not None

    def exception(self) -> Optional[BaseException]:
        """The failure of this operation (or of its communicator), or None."""
        self.is_completed()
        return self._exc

    def wait(self, timeout: Optional[float] = None) -> None:
        """Block until the operation has completed.

        Raises the operation's failure (:class:`pycoll.CommFailure` subclasses: a timeout detected
        against the operation's own deadline, a remote error, an abort). ``timeout`` (seconds)
        only bounds this wait: if the operation is still running then, the builtin
        ``TimeoutError`` is raised and the operation and its communicator are left untouched.
        Without ``timeout`` the wait ends at the latest when the operation's own deadline
        (``Work.timeout``) makes the communicator fail.
        """
        if timeout is not None and timeout < 0:
            raise ValueError(f"timeout must be >= 0 seconds, got {timeout}")
        comm = self.comm
        start = time.monotonic()
        deadline = None if timeout is None else start + timeout
        while True:
            if self._exc is not None:
                raise self._exc
            if self._state in _FINAL:
                return
            comm.refresh(self)
            if self._state in _FINAL or self._exc is not None:
                continue
            now = time.monotonic()
            comm.check(now)
            if self._exc is not None:
                continue
            if deadline is not None and now >= deadline:
                raise TimeoutError(
                    f"{self.op} (seq {self.seq}) on {comm.name} still running after {timeout:.3g} s "
                    f"(its own deadline is {self.timeout:.3g} s after it was issued)"
                )
            # block on the end event (the host library waits in C); wake for the own deadline and,
            # at least every _SLICE_S, to look at the communicator's asynchronous error
            left = min(_SLICE_S, max(0.0, self.t0 + self.timeout - now) + 1e-3)
            if deadline is not None:
                left = min(left, deadline - now)
            end = self._end
            if end is None:
                time.sleep(min(left, FIRST_SLEEP_S))  # inside an open group, or just being enqueued
                continue
            try:
                comm.device.wait_event(end, left)
            except Exception:  # released meanwhile (abort, destroy): the next round sees why
                pass

    def __repr__(self) -> str:
        return f"<Work {self.op} seq={self.seq} {self._state}{' failed' if self._exc else ''} on {self.comm.name}>"
