"""Communicator: collectives over any array and stream, with deadlines on every blocking call.

Communicators are nonblocking underneath (``ncclConfig_t.blocking = 0``): initialisation, split,
shrink, grow, finalize and destroy are polled with ``ncclCommGetAsyncError`` against a deadline;
collectives are enqueued on a stream and their completion is read from events. The watchdog
(:mod:`pycoll.diagnostics.watchdog`, an observer registered through :mod:`pycoll.hooks`) and every
waiting call check outstanding operations against their timeouts, so no Python call blocks forever.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import operator
import os
import re
import threading
import time
import warnings
import weakref
from typing import (
    Any,
    Callable,
    ContextManager,
    Dict,
    Iterable,
    Iterator,
    List,
    Optional,
    Sequence,
    SupportsIndex,
    Tuple,
    Union,
    cast,
)

import numpy as np

from . import (
    _bindings as B,
    _core,
    _dtypes,
    _settings,
    adopt as _adopt,
    failpoints as _fp,
    hooks,
    memory as _memory,
    windows as _windows,
)
from ._settings import Seconds, requests_until
from .buffers import integer as _integer
from .config import CommConfig
from .devices import Device, backoff, stream_text
from .errors import (
    AsyncCommError,
    CommAborted,
    CommFailure,
    CommRevoked,
    CommStateError,
    CommTimeout,
    InvalidArgument,
    NCCLError,
    PeerFailure,
    RemoteError,
    StoreError,
    StoreTimeout,
    error_class,
)
from .group import SimulatedGroup, simulate as _group_simulate
from .hooks import CommObserver, Progress, add_observer, group_mates, live_communicators, op_text, remove_observer
from .premul import PreMulSum, datatype_of, scalar_argument
from .properties import CommProperties, query_properties
from .work import Work

_IN_PROGRESS = B.IN_PROGRESS

__all__ = ["Communicator", "CommObserver", "PreMulSum", "REDUCE_OPS", "abort_all", "default_timeout", "poll_ready",
           "add_observer", "remove_observer", "live_communicators"]

_log = logging.getLogger("pycoll.comm")

#: Reduction operator names accepted by the collectives.
REDUCE_OPS: Dict[str, int] = _dtypes.REDUCE_OPS
FP_BYTES_COPIED = _fp.declare("comm.broadcast_bytes.copied", "broadcast_bytes on a device, the root's bytes copied in")
FP_INTERRUPTED = _fp.declare("comm.interrupted.before_wait", "Ctrl-C inside a blocking operation: the communicator's "
                             "failure recorded, before the wait for its policy to act")
FP_REVOKED = _fp.declare("comm.revoke.revoked", "revoke: the library revoked the communicator, before the wait for it")
FP_GIVE_UP = _fp.declare("comm.poll.give_up", "a finalize, shrink, grow, split or init found a participant stopped "
                                              "or gone (or its communicator failed), before it gives up (aborts)")
FP_CHECK_FOUND = _fp.declare("comm.check.found_error", "check (the watchdog's): the asynchronous error read was an "
                                                       "error, before fail() records it")
_FAILURE_POLICIES = ("abort", "revoke", "report")


#: how often a poll-until-ready loop asks whether to give up (a participant stopped or gone), seconds
_GIVE_UP_EVERY = 0.1
_CLOSE_STORE_S = 2.0  # the most a communicator's closing waits for its observers' store requests (best effort)


_ENDED_OWNER = 1  # Communicator._owner once the thread that had it ended without hand_off(): no thread's ident


class _OwnerEnd:
    """Kept in a thread-local of each thread that had a communicator (:meth:`Communicator._take_over`): as the thread
    ends, its locals go, and the communicators it still has are marked ended (``_owner = _ENDED_OWNER``). CPython
    gives a thread started later the ended one's ident, which the operations compare: it passed as the owner."""

    __slots__ = ("ident", "comms")

    def __init__(self, ident: int) -> None:
        self.ident = ident
        self.comms: weakref.WeakSet[Communicator] = weakref.WeakSet()

    def __del__(self) -> None:
        for comm in list(self.comms):
            if comm._owner == self.ident:
                comm._owner = _ENDED_OWNER


_owner_ends = threading.local()
_take_over_lock = threading.Lock()


def default_timeout() -> float:
    """The default per-operation timeout in seconds: ``$PYCOLL_TIMEOUT`` or 30."""
    return float(_settings.get("PYCOLL_TIMEOUT"))


def _check_timeout(timeout: Optional[Seconds], default: float, what: str = "timeout") -> float:
    return default if timeout is None else _settings.seconds(timeout, what)


def _missing(describe_missing: Callable[[], str]) -> str:
    """``describe_missing()``'s words for an error being raised, or why there are none: its failure (a store that
    went with a peer) must not take the error's place."""
    try:
        return describe_missing()
    except Exception as exc:
        return f"; who is missing is unknown ({type(exc).__name__}: {exc})"


def _library_code(failure: Optional[BaseException]) -> int:
    """The library's error code that ``failure`` carries (an asynchronous error the watchdog read, a library call's
    error), else -1."""
    return getattr(failure, "code", -1) if isinstance(failure, (AsyncCommError, NCCLError)) else -1


class _HandleGone(Exception):
    """Raised by a ``poll_ready`` reader whose handle another thread freed (an abort): ``failure`` is raised."""

    def __init__(self, failure: BaseException) -> None:
        super().__init__(str(failure))
        self.failure = failure


def poll_ready(library: Any, handle: int, what: str, timeout: float, *, on_error: Callable[[], None] = lambda: None,
               on_timeout: Callable[[], None] = lambda: None, describe_missing: Optional[Callable[[], str]] = None,
               comm_name: Optional[str] = None, reported_timeout: Optional[float] = None,
               give_up: Optional[Callable[[float], Optional[BaseException]]] = None,
               read: Optional[Callable[[], int]] = None, rank: Optional[int] = None) -> None:
    """Poll ``ncclCommGetAsyncError(handle)`` until it leaves ncclInProgress, within ``timeout`` seconds.

    The one poll-until-ready loop of pycoll (nonblocking init, join, split, shrink, grow, finalize,
    revoke). An error code raises its typed exception after ``on_error()``; the deadline raises
    :class:`pycoll.CommTimeout` after ``on_timeout()`` (``describe_missing()`` may add who is missing, to an error
    code's exception too).
    ``give_up(seconds waited)``, asked every 0.1 s, may end the wait before the deadline: the exception it
    returns is raised after ``on_timeout()`` (a participant found stopped or gone: ``Communicator._poll``).
    Between two looks it sleeps with a back-off, or, on the host library, waits for the state to
    change (``pycollCommWaitReady``): it then returns as the operation ends, not up to 1 ms later.
    A KeyboardInterrupt (Ctrl-C) or SystemExit meanwhile is raised after ``on_timeout()``, as at the deadline.
    ``read()``: the asynchronous error, read where another thread may free the handle (a communicator's own: under
    its handle lock); it raises :class:`_HandleGone` once the handle is freed, whose failure is raised after
    ``on_timeout()``. ``rank``: this rank in ``comm_name``, named in the timeout's text.
    """
    start = time.monotonic()
    deadline = start + timeout
    next_ask = start + _GIVE_UP_EVERY
    sleep = 0.0
    wait = library.comm_wait_ready if library.has("pycollCommWaitReady") else None
    acted = False  # on_timeout() called
    if read is None:
        def read() -> int:
            return library.comm_get_async_error(handle)
    try:
        while True:
            try:
                code = read()
            except _HandleGone as gone:
                acted = True
                on_timeout()
                raise gone.failure from None
            if code == 0:
                return
            if code != B.IN_PROGRESS:
                last = library.get_last_error(handle)
                if describe_missing is not None:  # e.g. a peer's abort of an init that timed out there: who is missing
                    last = f"{last}{_missing(describe_missing)}"
                on_error()
                raise error_class(code)(code, what, library.get_error_string(code), last, library.path)
            now = time.monotonic()
            if give_up is not None and now >= next_ask:
                next_ask = now + _GIVE_UP_EVERY
                exc = give_up(now - start)
                if exc is not None:
                    _fp.hit(FP_GIVE_UP)
                    acted = True
                    on_timeout()
                    raise exc
            if now >= deadline:
                detail = _missing(describe_missing) if describe_missing is not None else ""
                acted = True
                on_timeout()
                where = (f" on communicator {comm_name!r}" if comm_name else "") + (
                    f" rank {rank}" if rank is not None else "")
                nominal = timeout if reported_timeout is None else reported_timeout  # e.g. init's whole deadline
                raise CommTimeout(f"{what}{where} did not complete within {nominal:.3g} s{detail}",
                                  comm_name=comm_name or "", op=what, timeout=nominal)
            if wait is not None:
                wait(handle, min(max(0.0, deadline - time.monotonic()), _GIVE_UP_EVERY))
            else:
                sleep = backoff(sleep)
    except (KeyboardInterrupt, SystemExit):  # Ctrl-C mid-wait: given up as at the deadline (the peers are told)
        if not acted:
            on_timeout()
        raise


def _child_name(name: Any, what: str) -> None:
    _settings.text(name, f"{what}: name", none_ok=True)


def unique_id_argument(value: Any, what: str = "unique_id") -> Any:
    """A ``UniqueId`` from one, or from its 128 bytes (bytes, or anything ``bytes()`` takes but a number or a
    str: an array of uint8, say); else a clear error."""
    if isinstance(value, B.UniqueId):
        return value
    if not isinstance(value, (int, float, str)):
        try:
            data = bytes(value)
        except (TypeError, ValueError):
            pass
        else:
            return B.UniqueId.from_bytes(data)
    raise TypeError(f"{what} must be a pycoll UniqueId or its 128 bytes (bytes(uid)), got {type(value).__name__}")


def _own_work(comm: Communicator, w: Any) -> None:
    """Refuse an argument that is not one of ``comm``'s operations (a Work of another communicator, or no Work)."""
    if not isinstance(w, Work):
        raise TypeError(f"expected a pycoll Work of communicator {comm.name!r}, got {type(w).__name__}")
    if w.comm is not comm:
        raise ValueError(f"{w!r} is an operation of another communicator than {comm.name!r}")


def abort_all(comms: Sequence[Communicator], timeout: Optional[Seconds] = None) -> None:
    """Abort several communicators together (local; idempotent for each).

    The communicators of one library are aborted inside one ``ncclGroupStart``/``ncclGroupEnd``:
    NCCL needs that when communicators of one process share a GPU (aborting them one by one can
    hang, NVIDIA/nccl#1013). The aborts run in a thread of their own, bounded by ``timeout``
    (``$PYCOLL_ABORT_TIMEOUT``, 10 s): an abort that does not return by then is left behind, logged,
    and the communicators are released on the Python side all the same. That is the last resort
    short of ending the process: an NCCL that cannot abort within the deadline is wedged, and
    ``os._exit`` is then the only way out that does not wait for it.
    """
    limit = _settings.get("PYCOLL_ABORT_TIMEOUT") if timeout is None else _settings.seconds(timeout, "timeout")
    comms = list(comms)
    bad = [(i, c) for i, c in enumerate(comms) if not isinstance(c, Communicator)]
    if bad:  # refused before any is touched: the ones before it were marked aborted, never aborted
        raise TypeError(f"abort_all: element {bad[0][0]} is not a Communicator: {bad[0][1]!r}")
    by_library: Dict[int, Tuple[Any, List[Tuple[Communicator, int]]]] = {}
    begun: List[Communicator] = []
    for c in comms:
        began, h = c._begin_abort()
        if h is not None:
            by_library.setdefault(id(c.library), (c.library, []))[1].append((c, h))
        if began:  # an abort before this one (or a destroy) released and closed it: observers hear of it once
            begun.append(c)
    for lib, items in by_library.values():
        names = ", ".join(repr(c.name) for c, _ in items)
        done = threading.Event()
        errors: List[BaseException] = []
        late: List[Callable[[], None]] = []  # device releases the abort thread runs once its abort returns
        handover = threading.Lock()

        def run(lib: Any = lib, items: List[Tuple[Communicator, int]] = items, done: threading.Event = done,
                errors: List[BaseException] = errors, late: List[Callable[[], None]] = late,
                handover: threading.Lock = handover) -> None:
            # no per-communicator lock: aborting is how a thread blocked inside a call is released
            try:
                items[0][0].device.enter_own_thread()  # this thread's own: never a context on another GPU
                if len(items) == 1 or lib.kind == "host":  # the host library's aborts are independent
                    for _, h in items:
                        lib.comm_abort(h)
                else:
                    lib.group_start()
                    try:
                        for _, h in items:
                            lib.comm_abort(h)
                    finally:
                        lib.group_end()
            except BaseException as e:  # reported below
                errors.append(e)
            finally:
                with handover:
                    done.set()
                for release in late:
                    release()

        try:
            threading.Thread(target=run, name=f"pycoll-abort-{items[0][0].name}", daemon=True).start()
        except RuntimeError:  # no thread left to start (a pids limit): aborted here, unbounded -- else never
            _log.warning("abort of %s: no thread could be started; aborting in this thread", names)
            run()
        if not done.wait(limit):
            with handover:
                behind = not done.is_set()
                if behind:
                    # the library may hold the device (a real ncclCommAbort waits for kernels it cannot
                    # stop): destroying streams and events now would block this thread with it
                    late.extend(c._release_device_later() for c, _ in items)
            if behind:
                _log.error("ncclCommAbort of %s did not return within %.3g s; leaving it behind (if the library "
                           "is wedged, ending the process with os._exit is the last resort); its streams and "
                           "events are released when it returns", names, limit)
        elif errors:
            _log.error("ncclCommAbort of %s failed: %s", names, errors[0])
    for c in begun:
        c._end_abort()
    me = threading.get_ident()
    for c in comms:  # one another thread is aborting: returns once it is done, as an abort that does it itself (one
        if c not in begun and c._state == "aborted" and c._aborter != me:  # this thread began finishes after this)
            c._released.wait(limit)


def check_arguments(size: int, global_ranks: Optional[Sequence[int]], on_failure: str, generation: int,
                    failure_callbacks: Sequence[Callable[..., Any]]) -> Optional[Tuple[int, ...]]:
    """ValueError/TypeError naming what is wrong with the arguments a communicator of ``size`` ranks keeps (checked
    by :func:`pycoll.init` before the collective init, so a rank never leaves a made communicator on them);
    ``global_ranks`` as a tuple."""
    ranks = None
    if global_ranks is not None:
        if isinstance(global_ranks, (str, bytes)):
            raise TypeError(f"global_ranks must be a sequence of ints, not {type(global_ranks).__name__}")
        ranks = tuple(global_ranks)
        if len(ranks) != size:
            raise ValueError(f"global_ranks has {len(ranks)} entries for a communicator of {size} ranks")
        if any(isinstance(r, bool) or not isinstance(r, int) or r < 0 for r in ranks) or len(set(ranks)) != size:
            raise ValueError(f"global_ranks must be distinct ints >= 0, got {list(ranks)}")
    if on_failure not in _FAILURE_POLICIES:
        raise ValueError(f"on_failure must be one of {_FAILURE_POLICIES}, got {on_failure!r}")
    if isinstance(generation, bool) or not isinstance(generation, int) or generation < 0:
        raise ValueError(f"generation must be an int >= 0, got {generation!r}")
    if callable(failure_callbacks) or isinstance(failure_callbacks, (str, bytes, Iterator)) or not isinstance(
            failure_callbacks, Iterable):  # an iterator: read here, and empty for the communicator
        raise TypeError("failure_callbacks must be a sequence (a list or tuple) of callables, got "
                        f"{failure_callbacks!r}" + (" (one: [...])" if callable(failure_callbacks) else ""))
    for cb in failure_callbacks:
        if not callable(cb):
            raise TypeError(f"failure_callbacks must be callables, got {cb!r}")
    return ranks


_CORE_TIMEOUT: Any = vars(_core.CommCore)["timeout"]  # the compiled field, under Communicator.timeout's check


#: a peer as the host library's error texts name it ("rank 2 (pid 123) exited", "rank 0 aborted the ...")
_PEER_RANK = re.compile(r"\brank (\d+)(?= \(pid | aborted | revoked | failed| has | exited| called\b)")

#: torch.distributed.ReduceOp's names -> pycoll's (torch numbers them otherwise: its AVG is 1, NCCL's prod)
_TORCH_REDUCE_OPS = {"SUM": "sum", "AVG": "avg", "PRODUCT": "prod", "MIN": "min", "MAX": "max"}


def _is_torch_reduce_op(op: Any) -> bool:
    """Whether ``op`` is one of torch.distributed's ``ReduceOp`` values (a ``RedOpType``, or a ``ReduceOp``)."""
    tp = type(op)
    return tp.__module__.startswith("torch") and tp.__name__ in ("RedOpType", "ReduceOp")


class Communicator(_core.CommCore):
    """A communicator of ``size`` ranks; this process is ``rank``.

    Create one with :func:`pycoll.init` (or :meth:`split`, :meth:`shrink`, :meth:`grow`,
    :func:`pycoll.join`). Collectives take any array with ``__dlpack__``,
    ``__cuda_array_interface__`` or the buffer protocol (torch, numpy, cupy, jax), without copies,
    on the device the backend uses. Each returns a :class:`~pycoll.Work`; by default the call
    waits for completion, with ``async_op=True`` it returns at once. Every collective takes
    ``config=`` a :class:`pycoll.CollConfig` (NCCL 2.31+'s per-call ``ncclCollConfig_t``).

    Failure policy (``on_failure``): when an operation times out or the library reports an
    asynchronous error, the communicator is aborted (``"abort"``, default), revoked
    (``"revoke"``: collectives are refused but split/shrink still work, as reshape needs), or left
    alone (``"report"``); the failure is raised at the next wait or call, once the policy has acted.
    On the host backend a blocking operation may run in the calling thread, for at most
    ``PYCOLL_HOST_INLINE_NS`` (10 ms) at a time: then the call waits for it with its deadline, under
    every policy, and that wait runs the rest (the stream's thread only what it does not come back for
    within ``PYCOLL_HOST_DEFER_NS``).

    Not thread-safe for concurrent operations on one communicator (as NCCL); the watchdog thread
    only queries events and asynchronous errors, and aborts or revokes.
    """

    def __init__(
        self,
        handle: int,
        *,
        library: Any,
        device: Device,
        rank: int,
        size: int,
        name: str,
        uid: str,
        global_ranks: Optional[Sequence[int]],
        timeout: Seconds,
        on_failure: str = "abort",
        store: Any = None,
        generation: int = 0,
        owns_device: bool = False,
        failure_callbacks: Sequence[Callable[[Communicator, BaseException], None]] = (),
        owns_handle: bool = True,
    ) -> None:
        self._handle = handle
        self._owns_handle = owns_handle  # False (from_handle): destroy() detaches, never frees the handle
        self.library = library
        self.device = device
        self._rank = rank
        self._size = size
        self.name = name
        self.uid = uid
        self._global_ranks = check_arguments(size, global_ranks, on_failure, generation, failure_callbacks)
        self.timeout = timeout
        self._on_failure = on_failure
        self._store = store
        self._generation = generation
        self._owns_device = owns_device
        self.backend = device.backend
        self._stream_mode = -1  # how the own stream may run work in other threads (_core._own_stream)
        self._guard_device = device.kind != "host"  # launches run with the communicator's GPU current
        # _lock, _plock and _hlock: made by CommCore (their order is there)
        self._pending = _core.Outstanding()  # the outstanding Works, in issue order
        self._failure = None
        self._failure_handled = threading.Event()  # fail() is done: observers told, the policy has acted
        self._released = threading.Event()  # an abort or destroy has released what pycoll held
        self._aborter: Optional[int] = None  # the thread that began its abort
        self._failing_thread = 0  # the thread running fail()
        self._revoke_expected = False  # expect_revoke(): a failure found from then on revokes instead
        self._superseded: Optional[str] = None  # superseded(): what replaced it, said by every later refusal
        self._owner_thread: Optional[threading.Thread] = None  # the thread that has it (_take_over), where known
        self.failed_at: Optional[float] = None  # wall-clock time of the failure
        #: called as ``callback(comm, exc)`` in the thread that records a failure, after the
        #: observers and before the policy acts; must return quickly (the elastic layer starts its
        #: agreement here)
        self.failure_callbacks: List[Callable[[Communicator, BaseException], None]] = list(failure_callbacks)
        self._state = "active"  # active | revoked | finalized | aborted | destroyed
        self._aborted_why = ""  # what the abort's CommAborted says of it
        self._coll_seq = 0
        self._p2p_seq = 0
        self._last_op_id = 0  # op_id of the last operation issued (Work.op_id: 1, 2, ...)
        self._reshapes = 0  # split/shrink/grow calls so far: names children identically on every rank
        self._children: weakref.WeakSet[Communicator] = weakref.WeakSet()  # made from it (split, shrink, grow)
        self._abort_only = False  # after an abortive shrink: released with abort, never destroy
        self._user = 0  # the ident of the thread inside an operation now (one at a time; 0: none)
        self._owner_name = ""  # the name of the thread that has it (_owner: its ident; 0: none)
        self._pid = os.getpid()
        self._stream = None
        self._events = []
        self._scratch: Optional[int] = None
        self._bytes_scratch: Tuple[int, int] = (0, 0)  # broadcast_bytes' device buffer: (pointer, size)
        self._premul: weakref.WeakSet[PreMulSum] = weakref.WeakSet()
        # Work -> the scalar of the PreMulSum it was given, kept while the Work lives (_core._holding)
        self._scalar_holds: weakref.WeakKeyDictionary[Work, Any] = weakref.WeakKeyDictionary()
        self._resources: List[Any] = []  # registrations and windows (pycoll.windows), released with the comm
        self.created_at = time.time()
        hooks.register_live(self)
        hooks.notify_created(self)

    # -- properties -----------------------------------------------------------------------------

    @property
    def timeout(self) -> float:
        """The operations' default deadline in seconds (``timeout=`` of a call overrides it); settable, checked as
        ``init`` checks it (the compiled path reads the field itself)."""
        return cast(float, _CORE_TIMEOUT.__get__(self))

    @timeout.setter
    def timeout(self, value: Seconds) -> None:
        _CORE_TIMEOUT.__set__(self, _settings.seconds(value, "timeout"))

    @property
    def rank(self) -> int:
        """This process's rank in the communicator."""
        return self._rank

    @property
    def size(self) -> int:
        """Number of ranks."""
        return self._size

    @property
    def handle(self) -> int:
        """The raw ``ncclComm_t`` (raises once the communicator is destroyed or aborted)."""
        self._check_alive()
        assert self._handle is not None
        return self._handle

    @property
    def owns_handle(self) -> bool:
        """Whether :meth:`destroy` frees the handle (False for :meth:`from_handle` without ``owned=True``)."""
        return self._owns_handle

    @property
    def properties(self) -> CommProperties:
        """The library's ncclCommQueryProperties for this communicator (NCCL 2.29+; see CommProperties)."""
        with self._lock:
            return query_properties(self.library, self.handle)

    @classmethod
    def from_handle(cls, handle: Any, *, owned: bool = False, library: Any = None, device: Optional[Device] = None,
                    name: Optional[str] = None, uid: Optional[str] = None, timeout: Optional[Seconds] = None,
                    on_failure: str = "abort", store: Any = None) -> Communicator:
        """Wrap an ``ncclComm_t`` made elsewhere, so pycoll's operations, deadlines, watchdog and
        flight recorder work on it.

        ``handle``: an int address, nccl4py's ``Communicator`` (its ``ptr``), torch's
        ProcessGroupNCCL (its ``_comm_ptr()``) or any object with an int ``handle``. ``library``:
        the Library that made it (a Library, a :func:`pycoll.bindings.load` spec, or None for the
        default NCCL). The library is asked for the rank, size and device, so a null, destroyed or
        foreign handle raises ValueError. ``owned=False`` (default): :meth:`destroy` waits for
        pycoll's outstanding operations and detaches, leaving the handle to its maker, who must
        keep it alive while this object is used; ``owned=True``: :meth:`destroy` finalizes and
        frees it as for a communicator pycoll made. :meth:`abort` (and the ``"abort"`` failure
        policy) always calls ncclCommAbort, owned or not: aborting is the only way to stop hung
        work, and the handle is dead afterwards for its maker too. ``uid`` identifies the
        communicator across ranks in store keys and dumps (default: from NCCL's commHash).
        """
        return _adopt.from_handle(cls, handle, owned=owned, library=library, device=device, name=name, uid=uid,
                                  timeout=default_timeout() if timeout is None else timeout, on_failure=on_failure,
                                  store=store)

    @property
    def state(self) -> str:
        """``"active"``, ``"revoked"``, ``"finalized"``, ``"aborted"``, ``"destroyed"`` or
        ``"inherited"`` (in a forked child: the parent's, unusable here)."""
        return self._state

    @property
    def failure(self) -> Optional[BaseException]:
        """The failure that ended this communicator, if any."""
        return self._failure

    @property
    def global_rank(self) -> int:
        """This process's rank in the job (its rank in ``global_ranks``), or ``rank`` when unknown."""
        return self._global_ranks[self._rank] if self._global_ranks is not None else self._rank

    @property
    def global_ranks(self) -> Optional[Tuple[int, ...]]:
        """Every member's job-wide rank, in this communicator's rank order (None when unknown)."""
        return self._global_ranks

    @property
    def generation(self) -> int:
        """The membership generation this communicator belongs to (flight-recorder dumps are per generation)."""
        return self._generation

    @property
    def store(self) -> Any:
        """The job's store (progress, failure reports, dump requests go through it), or None."""
        return self._store

    @property
    def on_failure(self) -> str:
        """The failure policy: ``"abort"``, ``"revoke"`` or ``"report"``."""
        return self._on_failure

    @property
    def closed(self) -> bool:
        """True once the communicator was destroyed or aborted (its handle is gone)."""
        return self._handle is None

    @property
    def ops_issued(self) -> int:
        """Operations (collective and point-to-point) issued on this communicator so far."""
        return self._coll_seq + self._p2p_seq

    def __reduce__(self) -> Any:
        raise TypeError(f"communicator {self.name!r} cannot be pickled (sent to another process): it is this "
                        "process's; every process makes its own (pycoll.init with the job's store or unique id)")

    def __repr__(self) -> str:
        return f"<Communicator {self.name!r} rank {self._rank}/{self._size} {self.backend} {self._state}>"

    # -- context manager and garbage collection -------------------------------------------------

    def __enter__(self) -> Communicator:
        return self

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        """Destroy on a normal exit (collective); abort (local) when an exception is leaving."""
        if self._handle is None:
            return
        if exc_type is None:
            self.destroy()
        else:
            self.abort()

    def __del__(self) -> None:
        if getattr(self, "_handle", None) is not None and getattr(self, "_pid", None) == os.getpid():
            # destroy is collective: running it from the garbage collector could hang the process
            warnings.warn(
                f"communicator {self.name!r} (rank {self._rank}/{self._size}) was garbage-collected "
                "without destroy() or abort(); its resources are leaked",
                ResourceWarning,
                stacklevel=2,
            )

    # -- state checks ---------------------------------------------------------------------------

    def _outside_group(self, what: str) -> None:
        """Refuse ``what`` inside this thread's open group: it needs its result (or the communicator's state)
        at its return, and the group's operations only start when the group ends."""
        if _core.open_group() is not None:
            raise CommStateError(f"communicator {self.name!r}: {what} cannot be called inside a group (`with "
                                 "comm.group()`): it needs its result at its return, and the group's operations "
                                 "start only when the group ends; call it after the group")

    def _check_alive(self) -> None:
        if self._state == "inherited":
            raise CommStateError(
                f"communicator {self.name!r} was created by process {self._pid}; this process (pid "
                f"{os.getpid()}) is a fork of it and cannot use it: create a new communicator here"
            )
        if self._state == "aborted":
            msg = f"communicator {self.name!r} was aborted"
            if self._failure is not None:
                msg += f" after: {self._failure}"
            raise CommAborted(msg) from self._failure
        if self._state == "destroyed":
            raise CommStateError(f"communicator {self.name!r} was destroyed; create a new one")

    def _check_usable(self, what: str) -> None:
        if self._superseded is not None and (self._state != "active" or self._failure is not None):
            raise CommStateError(f"{what}: {self._superseded} (it is {self._state}" + (
                f"; it failed: {self._failure})" if self._failure is not None else ")")) from self._failure
        self._check_alive()
        if self._failure is not None:
            self.await_failure_handled()  # raised with the communicator as its policy leaves it, as Work.wait does
            raise self._failure
        if self._state == "revoked":
            raise CommRevoked(f"{what}: communicator {self.name!r} was revoked; "
                              "only split, shrink, destroy and abort remain")
        if self._state == "finalized":
            raise CommStateError(f"{what}: communicator {self.name!r} was finalized; only destroy remains")

    def superseded(self, why: str) -> None:
        """Record that another communicator replaced this one (``why``: what replaced it; the elastic layer's
        reshape says its generation and group). Once it failed or was closed, an operation on it raises a
        :class:`CommStateError` saying ``why`` (with its failure), not that failure again: a program holding on to
        a replaced communicator learns why, instead of recovering from the same failure at every step."""
        self._superseded = why

    # -- progress and failure -------------------------------------------------------------------

    def _async_code(self) -> int:
        # no per-communicator lock: ncclCommGetAsyncError may run while another thread is inside a
        # call on the communicator (that is how a watchdog sees a blocked call); _hlock only keeps
        # the handle from being freed meanwhile
        with self._hlock:
            h = self._handle
            return 0 if h is None else self.library.comm_get_async_error(h)

    def open_with(self, peer: int) -> Optional[int]:
        """How many of this rank's sends, receives, puts and signals with rank ``peer`` the library has not finished
        (an open group's too): 0 once this rank's part with ``peer`` is done, whatever else it still waits for. None
        where the library cannot say (only pycoll's host library counts them; NCCL does not), the communicator has
        no handle any more or the library refused. The liveness check asks it before it takes a peer that left for
        the failure of a group whose operations with that peer share their completion with others."""
        count = self._ask_library("pycollCommPeerOpen", "comm_peer_open", peer)
        return None if count is None else int(count)

    def peer_process(self, peer: int) -> Optional[Tuple[int, int, int]]:
        """Rank ``peer``'s process as the library knows it from the communicator's making: ``(pid, start time in
        clock ticks since boot, pid namespace inode)``; None where the library cannot say (only pycoll's host
        library, whose ranks share this host, knows them), or the communicator has no handle any more. The liveness
        check watches a peer by it until the peer has published its own record (a process stopped right after the
        library made the communicator never does)."""
        proc = self._ask_library("pycollCommPeerProcess", "comm_peer_process", peer)
        return None if proc is None else (int(proc[0]), int(proc[1]), int(proc[2]))

    def _ask_library(self, function: str, method: str, peer: int) -> Any:
        """``library.<method>(handle, peer)`` for the observers (the liveness check) where the library has
        ``function``, the handle held against being freed meanwhile; None where it has not, there is no handle any
        more or the library refused."""
        if not self.library.has(function):
            return None
        with self._hlock:
            h = self._handle
            if h is None:
                return None
            try:
                return getattr(self.library, method)(h, peer)
            except Exception:
                _log.debug("%s(%r, rank %s) failed", function, self.name, peer, exc_info=True)
                return None

    def _async_exc(self, code: int) -> CommFailure:
        try:
            last = self._job_ranks(self.library.get_last_error(self._handle or 0))
        except Exception:
            last = ""
        text = self.library.get_error_string(code)
        if code == RemoteError.code:
            where = f"asynchronous error of communicator {self.name!r} rank {self._rank}"
            return RemoteError(code, "", text, f"{where}: {last}" if last else where, self.library.path)
        return AsyncCommError(
            f"communicator {self.name!r} rank {self._rank}: asynchronous error "
            f"{error_class(code).__name__} ({code}): {text}{' -- ' + last if last else ''}",
            code,
        )

    def _job_ranks(self, text: str) -> str:
        """The library's error text with each rank it names as a peer followed by its job-wide rank where that
        differs ("rank 2 (global 3) (pid 123) exited"): after a reshape the communicator's numbers are not the
        launcher's, and the text named a live process."""
        g = self._global_ranks
        if not g or not text:
            return text

        def add(m: re.Match[str]) -> str:
            r = int(m.group(1))
            return m.group(0) + (f" (global {g[r]})" if 0 <= r < len(g) and g[r] != r else "")

        return _PEER_RANK.sub(add, text)

    # the per-call path, compiled (pycoll/_core.pyx): launch one operation, read its completion from its
    # events, retire it, record its end event when its call (or ncclGroupEnd) issued it
    _begin = _core.begin  # check the state, resolve the stream
    _buf = _core.buf  # describe an array for a call on a stream
    _launch = _core.launch
    refresh = _core.refresh
    _retire = _core.retire

    def try_refresh(self, w: Work) -> None:
        """Like :meth:`refresh`, for observers: never raises for the communicator's state (skipped once it failed);
        ``w`` must be one of its operations."""
        _own_work(self, w)
        if w._state == "completed" or w._exc is not None or self._failure is not None:
            return
        if self._state != "active" or self._handle is None:
            return
        try:
            self.refresh(w)
        except Exception:
            _log.debug("could not refresh the state of %r", w, exc_info=True)

    def check(self, now: Optional[float] = None) -> None:
        """Check the asynchronous error and every outstanding operation's deadline (the watchdog and
        waits call it); a failure found is recorded and its policy applied, nothing is raised."""
        if self._failure is not None or self._handle is None:
            return
        self.device.enter_own_thread()
        try:
            code = self._async_code()
        except NCCLError as e:  # the handle is no communicator any more: an adopted one its maker destroyed or
            # aborted (the watchdog logged this traceback every round, and every operation raised it)
            if self._handle is not None and self._failure is None:
                self.fail(AsyncCommError(f"communicator {self.name!r} rank {self._rank}: its handle is no live "
                                         f"communicator of the library any more (destroyed or aborted by its maker, "
                                         f"if adopted with from_handle?): {e}", getattr(e, "code", -1)),
                          next(iter(self._pending), None))
            return
        if code not in (0, B.IN_PROGRESS):
            _fp.hit(FP_CHECK_FOUND)
            self._fail_at_error(self._async_exc(code), None)
            return
        now = time.monotonic() if now is None else now
        pending = self._pending.snapshot()
        for w in pending:
            if w.grouped:  # not issued yet: its group() has not ended (its deadline counts from that end)
                continue
            self.refresh(w)
            if w._state != "completed" and w._exc is None and now - w.t0 > w.timeout:
                # the operations of its group that complete with it: which one the group waits for is not known;
                # the last collective is the one a rank that issued fewer did not enter (the report looks at every
                # peer of the group's sends and receives)
                mates: List[Any] = group_mates(pending, w)
                expired, w = w, next((x for x in reversed(mates) if not x.is_p2p), w)
                elapsed = now - expired.t0
                # the deadline that passed is the expired one's, which may be another operation of the group
                whose = "" if expired is w else f", the timeout of {op_text(expired)} of its group"
                group = (f"; it completes with its group: {', '.join(op_text(x) for x in mates)}"
                         if len(mates) > 1 else "")
                self.fail(
                    CommTimeout(
                        f"communicator {self.name!r} rank {self._rank}/{self._size}: {w.op} "
                        f"({f'p2p seq {w.p2p_seq} with peer {w.peer}' if w.is_p2p else f'seq {w.seq}'}) did not "
                        f"complete within {expired.timeout:.3g} s{whose} (issued {elapsed:.3g} s ago"
                        f"{stream_text(w.stream, self.device)}, state {w._state}"
                        f"{': it never started on its stream' if w._state == 'scheduled' else ''}){group}",
                        comm_name=self.name, op=w.op, seq=w.p2p_seq if w.is_p2p else w.seq, elapsed=elapsed,
                        timeout=expired.timeout, peer=w.peer if w.is_p2p else None,
                    ),
                    w,
                )
                return

    def outstanding(self) -> List[Work]:
        """Operations enqueued and not yet retired (oldest first)."""
        with self._plock:
            return self._pending.snapshot()

    def next_deadline(self) -> Optional[float]:
        """The earliest ``time.monotonic()`` deadline of the outstanding operations (None: nothing to watch)."""
        if self._failure is not None:
            return None
        return min((w.t0 + w.timeout for w in self._pending.snapshot() if not w.grouped), default=None)

    def progress(self) -> Progress:
        """The last sequence ids enqueued, started and completed, collectives and point-to-point apart."""
        return Progress.of(self._coll_seq, self._p2p_seq, self._pending.snapshot())

    def fail(self, exc: BaseException, work: Optional[Work] = None) -> None:
        """Record ``exc`` as this communicator's failure, tell the observers, then act by ``on_failure``.

        The first failure wins (later calls are no-ops). Every outstanding operation fails with it.
        The elastic layer calls it to stop a communicator whose generation is being reshaped. After
        :meth:`expect_revoke` it revokes instead (where the library can), recording no failure.
        """
        if self._revoke_expected and self._failure is None and self._state in ("active", "revoked"):
            try:
                # revoked already: by another thread that found the same peer's revoke (this one read it before that
                # revoke, e.g. the watchdog's check()) -- no failure either
                self._revoke()  # the outstanding operations fail with CommRevoked
                return
            except Exception as rexc:  # no revoke here: a failure after all
                _log.debug("revoke of %r failed (%s); recording the failure", self.name, rexc)
        with self._plock:
            if self._failure is not None or self._state in ("aborted", "destroyed"):
                return
            self._failure = exc
            self._failing_thread = threading.get_ident()
            self.failed_at = time.time()
            self._fail_outstanding(exc)
        try:
            self._handle_failure(exc, work)
        finally:
            self._failure_handled.set()

    def _fail_outstanding(self, exc: BaseException) -> List[Work]:
        """Every outstanding operation not failed yet fails with ``exc`` (the caller holds ``_plock``); returns them."""
        failed = [w for w in self._pending if w._exc is None]
        for w in failed:
            w._exc = exc
        return failed

    def _handle_failure(self, exc: BaseException, work: Optional[Work]) -> None:
        if not hooks.failures_reported():
            _log.error("%s", exc)  # else the watchdog logs it, with what the other ranks were doing
        leave: Optional[BaseException] = None  # an observer's or callback's SystemExit or KeyboardInterrupt, raised
        try:                                   # once the policy has acted (hooks.held_exit)
            hooks.notify_failed(self, exc, work)
        except BaseException as e:  # what hooks._each raises: only that, in the main thread
            leave = e
        for callback in list(self.failure_callbacks):
            try:
                callback(self, exc)
            except Exception:
                _log.exception("failure callback %r of %r failed", callback, self.name)
            except BaseException as e:
                leave = leave or hooks.held_exit(e, f"failure callback {callback!r} of {self.name!r}")
        self._act_on_failure()
        if leave is not None:
            raise leave

    def _act_on_failure(self) -> None:
        if self._on_failure in ("abort", "revoke"):
            self._note_failure_for_peers()
        if self._on_failure == "abort":
            self._abort()
        elif self._on_failure == "revoke":
            try:
                self._revoke()
            except Exception as rexc:  # a library without revoke: abort instead
                _log.warning("revoke of %r failed (%s); aborting instead", self.name, rexc)
                self._abort()

    def _note_failure_for_peers(self) -> None:
        """Before the policy aborts or revokes: tell the host library why (pycollCommNoteFailure), so that a peer
        that meets the aborted communicator is told which failure this rank found -- a stopped peer, a timeout --
        and not only that this rank aborted it (which named the rank that found the fault, not the one at fault).
        The library's own failure, if it had one, is what the peers read already. NCCL has no such call."""
        exc, lib = self._failure, self.library
        if exc is None or isinstance(exc, NCCLError) or not lib.has("pycollCommNoteFailure"):
            return
        with self._hlock:
            handle = self._handle
            if handle is None:
                return
            try:
                lib.comm_note_failure(handle, f"{type(exc).__name__}: {exc}")
            except Exception as e:  # only a better text for the peers
                _log.debug("pycollCommNoteFailure on %r failed: %s", self.name, e)

    def _interrupted(self, w: Work, what: str) -> None:
        """Ctrl-C (KeyboardInterrupt) came while this thread waited inside the blocking operation ``w`` (``what``
        names it): the operation cannot complete consistently with the other ranks any more. Fail the communicator
        (its policy acts, the peers are told) and return once the policy has acted, whichever thread acts (the
        watchdog's, which SIGINT wakes, may have failed it first): the caller re-raises the KeyboardInterrupt with
        the communicator in its policy's state, as any failed operation's error."""
        self.fail(CommAborted(f"communicator {self.name!r} rank {self._rank}: {what} was interrupted (SIGINT): "
                              "KeyboardInterrupt in the calling thread"), w)
        _fp.hit(FP_INTERRUPTED)
        self.await_failure_handled()

    def await_failure_handled(self) -> None:
        """When another thread is handling this communicator's failure (the observers' report and dump, then
        the policy's abort or revoke), wait until it is done: an operation's error is raised with the
        communicator in the state its policy gives it. Bounded by twice ``PYCOLL_ABORT_TIMEOUT``."""
        if (self._failure is not None and not self._failure_handled.is_set()
                and self._failing_thread != threading.get_ident()):
            self._failure_handled.wait(2 * _settings.get("PYCOLL_ABORT_TIMEOUT"))

    def handle_call_error(self, e: NCCLError, w: Optional[Work]) -> None:
        """Turn an error a library call on this communicator returned into the exception the user
        sees, and raise it (recording a communicator failure where the error is one)."""
        if self._failure is not None:
            self.await_failure_handled()
            raise self._failure from e
        # aborted or revoked by another thread while this call ran (a revoke fails the outstanding operations, this
        # one too, before its state says so: the call may return first, e.g. from a wait for room on a full stream)
        if self._state in ("aborted", "revoked") or (w is not None and w._exc is not None):
            mine = w._exc if w is not None else None
            if mine is None:
                mine = (CommAborted if self._state == "aborted" else CommRevoked)(
                    f"communicator {self.name!r} was {self._state} while {w.op if w else 'a call'} ran")
            raise mine from e
        if isinstance(e, InvalidArgument):
            raise e  # no side effect: the communicator stays usable
        code = self._async_code() if self._handle is not None else 0
        if code not in (0, B.IN_PROGRESS):
            failure: BaseException = self._async_exc(code)
        elif isinstance(e, RemoteError):
            last = self._job_ranks(e.last_error)  # the peers it names by their job-wide ranks too
            failure = e if last == e.last_error else type(e)(e.code, e.function, e.error_string, last, e.library)
        else:
            raise e
        if w is not None:
            w._exc = failure
        if code not in (0, B.IN_PROGRESS):
            self._fail_at_error(failure, w)  # refused for an earlier operation's failure: that one is blamed
        else:
            self.fail(failure, w)
        raise failure from e

    def _fail_at_error(self, failure: BaseException, fallback: Optional[Work]) -> None:
        """Fail with ``failure``, the library's asynchronous error (found by the watchdog's check, a refresh or a
        wait, or a call it refused), blaming the oldest outstanding operation (``fallback`` when there is none) --
        once those that completed without failing have retired, where the library tells them apart (the host
        library): their results stand, nobody may have waited for them yet."""
        _core.retire_clean(self)
        self.fail(failure, next(iter(self._pending), fallback))

    # -- launching operations -------------------------------------------------------------------

    def _take_over(self, me: int, op: str, hint: str = "", unless_ended: bool = False) -> None:
        """``me`` issues ``op`` but is not this communicator's thread: it becomes it if no thread has
        the communicator (none issued an operation yet, or the last one called :meth:`hand_off`; ``unless_ended``:
        or the one that has it has ended). ``hint``: added to the refusal."""
        with _take_over_lock:  # two threads after a hand_off(): one has it, the other is refused
            user, owner = self._user, self._owner
            if user and user != me:
                raise self._refusal(op, "is inside an operation of it", hint)
            # ended: marked so as it ended (a thread _thread started is a _DummyThread, alive for ever), or its Thread
            # says so -- not its ident, which a thread started since may have been given
            ended = owner == _ENDED_OWNER or (self._owner_thread is not None and not self._owner_thread.is_alive())
            if owner and owner != me and not (unless_ended and ended):
                why = " (it has ended)" if owner == _ENDED_OWNER else ""
                raise self._refusal(op, f"issued its operations so far and has not handed it off{why}", hint)
            self._owner, self._owner_name = me, threading.current_thread().name
            self._owner_thread = threading.current_thread()
        end = getattr(_owner_ends, "end", None)
        if end is None:
            end = _owner_ends.end = _OwnerEnd(me)
        end.comms.add(self)

    def claim(self, op: str, *, closing: bool = False) -> None:
        """Refuse, as an operation ``op`` of this thread would be refused, where another thread has this communicator
        (:meth:`hand_off`); else this thread has it from now on. For a call made of several operations (the elastic
        layer's), checked before it changes anything, with its own name. ``closing``: ``op`` ends with this
        communicator's destroy, which is also allowed once the thread that had it has ended, and never inside a
        ``group()``."""
        if closing:
            self._outside_group(op)
        if self._owner != threading.get_ident():
            self._take_over(threading.get_ident(), op, unless_ended=closing)

    def check_thread(self, op: str) -> None:
        """Refuse ``op`` as :meth:`claim` does where another thread has this communicator, without making this thread
        the one that has it where none does (a call that may come from one thread per communicator, as
        ``init_all``'s window registrations)."""
        if self._owner not in (0, threading.get_ident()):
            self._take_over(threading.get_ident(), op)

    def _refusal(self, op: str, doing: str, hint: str = "") -> CommStateError:
        return CommStateError(
            f"communicator {self.name!r}: thread {threading.current_thread().name!r} entered {op} while thread "
            f"{self._owner_name!r} {doing}; a communicator serves one thread at a time (NCCL's rule: calls from "
            "two threads interleave differently on different ranks and mix up their data): give each thread its "
            "own communicator (split), or pass it on where the program orders the two threads' operations the "
            f"same way on every rank (comm.hand_off(), then the other thread's operations){hint}"
        )

    def hand_off(self) -> None:
        """Let another thread issue this communicator's next operation.

        A communicator serves one thread at a time. The first thread to issue an operation has it, and
        an operation from any other thread raises :class:`CommStateError` (calls from two threads would
        be ordered differently on different ranks and mix up their data), even after the first thread
        has ended, until ``hand_off()`` is called; the next thread to issue an operation then has it.
        Call it where the program orders the threads' operations the same way on every rank: after the
        last operation of one thread and before the first of the next (from either thread).
        Outstanding operations stay valid and may be waited on from any thread. Refused
        (:class:`CommStateError`) while a thread is inside an operation of it, or while its operations wait in a
        ``group()`` that has not ended: they are issued as the group ends, which would come before the next
        thread's operations on some ranks and after them on others.
        """
        user = self._user
        if user and user != threading.get_ident():
            raise CommStateError(f"communicator {self.name!r}: hand_off() from thread "
                                 f"{threading.current_thread().name!r} while thread {self._owner_name!r} is "
                                 "inside an operation of it")
        with self._plock:  # enqueued in a group, not issued yet
            grouped = [w for w in self._pending if w.grouped]
        if grouped:
            raise CommStateError(f"communicator {self.name!r}: hand_off() from thread "
                                 f"{threading.current_thread().name!r} while {grouped[0].op} "
                                 f"({_core.seq_text(grouped[0])}) of it waits in a group() of thread "
                                 f"{self._owner_name!r} that has not ended: the "
                                 "group issues it as it ends, after another thread's operations on some ranks and "
                                 "before them on others; hand the communicator off once the group has ended")
        self._owner = 0

    @property
    def busy_thread(self) -> Optional[int]:
        """The ident of the thread inside an operation of this communicator now, or None."""
        return self._user or None

    def mark_inherited(self) -> None:
        """In a forked child: this communicator belongs to the parent; refuse every use, free nothing."""
        self._state = "inherited"
        self._handle = None
        self._pending = _core.Outstanding()
        self._stream = None
        self._events = []
        self._scratch = None
        self._bytes_scratch = (0, 0)

    def _captured(self, w: Work, call: Callable[[int, int], Any], h: int, stream: int,
                  group: Optional[List[Work]]) -> Work:
        """An operation enqueued while ``stream`` captures a graph: it runs when the graph is replayed.

        It gets no events and no deadline (querying an event of a capturing stream would break the
        capture); the flight recorder keeps it as ``captured`` with the capture's id. Put a deadline
        on a replay with :meth:`watch_stream`.
        """
        w._state = "captured"
        try:
            call(h, stream)
        except NCCLError as e:
            self.handle_call_error(e, w)
        w.inputs = w.outputs = []
        w._kept = None
        return w

    def _withdraw(self, w: Work) -> None:
        """Forget an operation the library refused (nothing was enqueued); the observers hear that it failed, where
        it did (the flight recorder took an operation no longer outstanding for completed)."""
        with self._plock:
            self._pending.pop(w, None)
            _core.events_back(self._events, w)
        w._kept = None  # nothing runs: the torch storages it held go
        if w._exc is not None:
            hooks.notify_withdrawn(w)

    def await_ready(self, w: Work) -> None:
        """After ncclInProgress: poll until the communicator is ready, within the operation's deadline."""
        _own_work(self, w)
        h = self._handle
        if h is None:
            return
        try:
            poll_ready(self.library, h, f"{w.op} ({_core.seq_text(w)})", max(1e-3, w.t0 + w.timeout - time.monotonic()),
                       comm_name=self.name)
        except CommTimeout as e:
            self.fail(e, w)
            raise w._exc or e from None
        except NCCLError as e:
            self.handle_call_error(e, w)

    def watch_stream(self, stream: Any, *, timeout: Optional[Seconds] = None, what: str = "graph_replay") -> Work:
        """Put a deadline on work this communicator does not launch itself -- e.g. a CUDA graph replay
        holding its collectives: events are recorded on ``stream`` around whatever is queued there
        now and later, and the returned Work is watched like any operation (``wait()``, the
        watchdog's timeout and failure policy, a flight-recorder entry named ``what``).

        Call it right after ``graph.replay()`` on the replay's stream: the Work completes when
        everything queued on ``stream`` so far has run. It takes the communicator's next collective sequence
        number, as a collective does: call it on every rank at the same point (each rank replays the graph), or
        the ranks' numbers, which the watchdog's reports and the flight recorder's dumps compare, part ways.
        """
        _settings.text(what, "watch_stream: what", hint=" (the operation's name)")
        st = self._begin(what, stream, True, ())
        return self._launch(what, lambda h, s: 0, st, [], [], True, timeout)

    def _redop(self, op: Any, datatype: int) -> int:
        if isinstance(op, PreMulSum):
            if op.comm is not self:
                raise ValueError("this PreMulSum operator belongs to another communicator")
            if op.op < 0:
                raise ValueError("this PreMulSum operator was destroyed")
            if op.datatype != datatype:
                raise ValueError(f"this PreMulSum operator was created for "
                                 f"{_dtypes.BY_CODE[op.datatype].array_name}, the buffers are "
                                 f"{_dtypes.BY_CODE[datatype].array_name}")
            return op.op
        if isinstance(op, str):
            try:
                return REDUCE_OPS[op.lower()]
            except KeyError:
                raise ValueError(f"unknown reduction op {op!r}; expected one of {sorted(REDUCE_OPS)} "
                                 "or a PreMulSum") from None
        if _is_torch_reduce_op(op):  # torch.distributed.ReduceOp.X: its own numbering differs from NCCL's
            torch_name = _TORCH_REDUCE_OPS.get(str(getattr(getattr(op, "op", op), "name", "")))  # ReduceOp(x) holds x
            if torch_name is not None:
                return REDUCE_OPS[torch_name]
            raise ValueError(f"torch's reduction op {op!r} has no pycoll counterpart here; pycoll takes torch's "
                             f"{', '.join(f'ReduceOp.{k}' for k in _TORCH_REDUCE_OPS)} or a PreMulSum "
                             "(Communicator.pre_mul_sum) for PREMUL_SUM")
        # an NCCL op number: an int, a pycoll.bindings.RedOp or a numpy integer (never a bool). Not just any object
        # with __index__: torch's ReduceOp has one, numbered otherwise (its AVG is NCCL's prod)
        if isinstance(op, (int, np.integer)) and not isinstance(op, (bool, np.bool_)):
            code = operator.index(op)
            if 0 <= code < len(REDUCE_OPS):
                return code
        raise ValueError(f"unknown reduction op {op!r}; expected one of {sorted(REDUCE_OPS)}, its number, "
                         "a pycoll.bindings.RedOp, a torch.distributed.ReduceOp or a PreMulSum")

    def _root(self, root: Any, what: str = "root") -> int:
        """``root`` as a rank of this communicator (:func:`_integer`); ValueError when out of range."""
        root = _integer(root, what, "an int rank")
        if not 0 <= root < self._size:
            raise ValueError(f"{what} {root} is out of range for a communicator of {self._size} ranks")
        return root

    # -- collectives ----------------------------------------------------------------------------

    all_reduce = _core.all_reduce  # the most common calls, compiled whole (pycoll/_core.pyx)

    broadcast = _core.broadcast  # compiled whole, as all_reduce

    reduce = _core.reduce  # compiled whole, as all_reduce

    all_gather = _core.all_gather  # compiled whole, as all_reduce

    reduce_scatter = _core.reduce_scatter  # compiled whole, as all_reduce

    all_to_all = _core.all_to_all  # compiled whole, as all_reduce

    gather = _core.gather  # compiled whole, as all_reduce

    scatter = _core.scatter  # compiled whole, as all_reduce

    send = _core.send  # compiled whole, as all_reduce: sends and receives between several peers go in a group()
    recv = _core.recv
    sendrecv = _core.sendrecv  # a send and a receive with one peer, as one operation (one group, one Work)

    def barrier(self, *, stream: Any = None, async_op: bool = False, timeout: Optional[Seconds] = None) -> Work:
        """Wait until every rank has reached the barrier.

        It is an ``all_reduce`` of three uint8 with ``max`` (NCCL has no barrier): an odd signature on purpose, which a
        program's own small all_reduce (one int32 summed: a counter) does not have. A rank that calls ``barrier()``
        where another calls that all_reduce is then a mismatch the library reports, not a silent match (one int32 was
        the barrier's, and a counter summed on one rank met the barrier of another, with no error)."""
        st = self._begin("barrier", stream, async_op, ())
        if self._scratch is None:
            previous = self.device.swap_current()  # ncclMemAlloc allocates on the current device
            try:
                self._scratch = self.library.mem_alloc(4)
            finally:
                self.device.restore_current(previous)
        ptr = self._scratch
        call = _core.library_call(self.library, "all_reduce", (), ptr, ptr, 3, _dtypes.UINT8,
                                  _dtypes.REDUCE_OPS["max"])
        return self._launch("barrier", call, st, [], [], async_op, timeout)

    def broadcast_bytes(self, data: Optional[Union[bytes, bytearray, memoryview]], nbytes: SupportsIndex,
                        root: SupportsIndex = 0, *,
                        timeout: Optional[Seconds] = None) -> bytes:
        """Rank ``root``'s ``data`` (``nbytes`` bytes; the others pass None) on every rank, as host bytes.

        One broadcast on the communicator (deadline, flight recorder and watchdog as any). On a device
        the bytes go through a buffer of this communicator's (allocated once, freed with it): the root
        copies them in and every rank copies them out, both ordered on the communicator's stream.
        """
        self._outside_group("broadcast_bytes")
        root = self._root(root)
        nbytes = _integer(nbytes, "broadcast_bytes: nbytes", "an int > 0", 1)
        if self._rank == root:
            if data is None:
                raise ValueError(f"broadcast_bytes: the root must pass {nbytes} bytes, got None")
            try:
                view = memoryview(data)
            except TypeError:
                raise TypeError(f"broadcast_bytes: the root's data must be bytes or another object with the buffer "
                                f"protocol, got {type(data).__name__}") from None
            if not view.c_contiguous:
                raise ValueError("broadcast_bytes: the root's data must be contiguous")
            data = view.cast("B").tobytes()  # its bytes, whatever its items (an array of floats too)
            if len(data) != nbytes:
                raise ValueError(f"broadcast_bytes: the root must pass {nbytes} bytes, got {len(data)}")
        dev = self.device
        if dev.kind == "host":
            try:
                arr = bytearray(data if self._rank == root and data is not None else nbytes)
            except (MemoryError, OverflowError):
                raise MemoryError(f"broadcast_bytes: cannot hold nbytes={nbytes} bytes in this process") from None
            self.broadcast(arr, root=root, timeout=timeout)
            return bytes(arr)
        st = self._begin("broadcast", None, False, ())
        ptr, size = self._bytes_scratch
        if size < nbytes:
            previous = dev.swap_current()  # ncclMemAlloc allocates on the current device
            try:
                if ptr:
                    self._bytes_scratch = (0, 0)
                    self.library.mem_free(ptr)
                size = max(64, nbytes)
                ptr = self.library.mem_alloc(size)
                self._bytes_scratch = (ptr, size)
            finally:
                dev.restore_current(previous)
        if self._rank == root and data is not None:
            dev.copy_to_device(ptr, data, st)
        _fp.hit(FP_BYTES_COPIED)
        lib = self.library
        self._launch("broadcast", lambda h, s: lib.broadcast(ptr, ptr, nbytes, _dtypes.UINT8, root, h, s),
                     st, [], [], False, timeout)
        return dev.copy_to_host(ptr, nbytes, st)

    def group_simulate(self) -> ContextManager[SimulatedGroup]:
        """Like :meth:`group`, but closed with ncclGroupSimulateEnd: nothing runs; the yielded
        object's ``estimated_time`` (microseconds, the library's model) is set when the block ends,
        and the operations' Works fail with CommStateError if waited for."""
        return _group_simulate(self)

    def group_failed(self, w: Work, exc: BaseException) -> None:
        """``ncclGroupEnd`` refused the group holding ``w``: nothing of it runs (called by :mod:`pycoll.group`)."""
        if w._exc is None and w._state != "captured":
            w._exc = exc
        self._withdraw(w)

    def pre_mul_sum(self, scalar: Any, dtype: Any) -> PreMulSum:
        """A reduction operator computing ``sum(scalar * x_r)`` for arrays of ``dtype``.

        ``scalar``: a Python number or a numpy (or ml_dtypes) scalar (stored in ``dtype``, which must represent it
        exactly for integer types; NCCL reads it now), or a one-element array on the communicator's device
        (read when the operation runs: each operation given the operator keeps it alive while its Work lives, so
        the operator may be destroyed as soon as the call returned). ``dtype``: a numpy or torch dtype or a name such as
        ``"float32"``.
        """
        self._check_usable("pre_mul_sum")
        datatype = datatype_of(dtype)
        holder, ptr, residence = scalar_argument(scalar, datatype, self.backend,
                                                 None if self.backend == "host" else self.device.device_id)
        with self._lock:
            op = self.library.red_op_create_pre_mul_sum(ptr, datatype, residence, self.handle)
        pms = PreMulSum(self, op, datatype, holder)
        self._premul.add(pms)
        return pms

    def release_red_op(self, pms: PreMulSum, op: int) -> None:
        """Destroy a PreMulSum's library operator (called by :meth:`PreMulSum.destroy`)."""
        self._premul.discard(pms)
        if self._handle is not None:
            with self._lock:
                self.library.red_op_destroy(op, self._handle)

    # -- registration, windows, symmetric memory, one-sided (pycoll.windows, pycoll.memory) ------

    def register(self, array: Any) -> _windows.Registration:
        """Register ``array`` for zero-copy operations (``ncclCommRegister``, local); see :mod:`pycoll.windows`."""
        return _windows.register(self, array)

    def register_window(self, array: Any, flags: int = 0, *, timeout: Optional[Seconds] = None) -> _windows.Window:
        """Register ``array`` as a window (``ncclCommWindowRegister``): collective, the same size on
        every rank; on the host backend it must come from :meth:`mem_alloc` or a SymmetricPool."""
        self._outside_group("register_window")
        return _windows.register_window(self, array, flags, timeout)

    def mem_alloc(self, shape: Any, dtype: Any = "float32", like: Optional[str] = None) -> Any:
        """An array over its own ``ncclMemAlloc`` block (``like``: numpy, torch, cupy); see :mod:`pycoll.memory`."""
        return _memory.mem_alloc(self, shape, dtype, like)

    def put_signal(self, window: _windows.Window, offset: SupportsIndex, src: Any, peer: SupportsIndex, *,
                   sig_idx: int = 0,
                   ctx: int = 0, stream: Any = None, async_op: bool = False, timeout: Optional[Seconds] = None) -> Work:
        """Write ``src`` into ``peer``'s ``window`` at byte ``offset`` and signal it (``ncclPutSignal``)."""
        return _windows.put_signal(self, window, offset, src, peer, sig_idx=sig_idx, ctx=ctx, stream=stream,
                                   async_op=async_op, timeout=timeout)

    def signal(self, peer: int, *, sig_idx: int = 0, ctx: int = 0, stream: Any = None, async_op: bool = False,
               timeout: Optional[Seconds] = None) -> Work:
        """Signal ``peer`` without data (``ncclSignal``)."""
        return _windows.signal(self, peer, sig_idx=sig_idx, ctx=ctx, stream=stream, async_op=async_op,
                               timeout=timeout)

    def wait_signal(self, peer: Any, count: int = 1, *, sig_idx: int = 0, ctx: int = 0, stream: Any = None,
                    async_op: bool = False, timeout: Optional[Seconds] = None) -> Work:
        """Wait for ``count`` signals from ``peer``, or for ``(peer, count, sig_idx, ctx)`` rows (ncclWaitSignal)."""
        return _windows.wait_signal(self, peer, count, sig_idx=sig_idx, ctx=ctx, stream=stream, async_op=async_op,
                                    timeout=timeout)

    def suspend(self, flags: int = B.SUSPEND_MEM) -> None:
        """``ncclCommSuspend``: release suspendable memory; operations are refused until :meth:`resume`."""
        _memory.suspend(self, flags)

    def resume(self) -> None:
        """``ncclCommResume``."""
        _memory.resume(self)

    def memory_stats(self) -> _memory.MemoryStats:
        """``ncclCommMemStats``, all four statistics."""
        return _memory.memory_stats(self)

    # -- lifecycle ------------------------------------------------------------------------------

    def _poll(self, handle: int, what: str, timeout: float, on_timeout: Callable[[], None],
              peers: Optional[Sequence[int]] = (), watch_failure: bool = False,
              reported_timeout: Optional[float] = None) -> None:
        """Wait for ``handle``'s nonblocking call ``what`` (``on_timeout``: the clean-up when it is given up). A
        collective call (``peers``: the ranks that do not take part, e.g. a shrink's excluded ones; None: a local
        call) is given up as soon as a participant is known stopped or gone (seen so twice, at least 0.15 s
        apart: a SIGSTOP at once followed by SIGCONT is no failure), with a
        :class:`~pycoll.PeerFailure`, instead of at its timeout: nobody watches such a wait otherwise.
        ``watch_failure``: also given up, with a :class:`~pycoll.CommFailure` naming it, as soon as this
        communicator fails (another thread's ``fail()``: a grow's new ranks are no peers of this communicator,
        and whoever watches them -- the elastic layer -- fails it when one is gone). ``reported_timeout``: the
        timeout a :class:`~pycoll.CommTimeout` names, where ``timeout`` is what is left of it."""
        give_up = None
        # the timeout given, not what is left of it, and the seconds of it spent before this wait (a finalize's drain)
        shown = timeout if reported_timeout is None else reported_timeout
        spent = max(0.0, shown - timeout)
        if peers is not None and (self._size > 1 or watch_failure):
            skip = tuple(peers)
            seen: List[Any] = []  # the rank first found unable, and how long the wait had lasted then
            before = self._failure

            def give_up(waited: float) -> Optional[BaseException]:
                failure = self._failure
                if watch_failure and failure is not None and failure is not before:
                    return CommFailure(f"{what} on communicator {self.name!r} rank {self._rank}: given up after "
                                       f"{waited + spent:.2f} s of its {shown:g} s timeout, the communicator failed: "
                                       f"{failure}")
                if self._size < 2:
                    return None
                found = hooks.peer_unable(self, skip)
                if found is None:
                    seen.clear()
                    return None
                if not seen or seen[0] != found[0]:
                    seen[:] = [found[0], waited]
                    return None
                if waited - seen[1] < _GIVE_UP_EVERY * 1.5:
                    return None
                rank, pid, why = found
                gr = self._global_ranks[rank] if self._global_ranks is not None else rank
                who = f"rank {rank} (pid {pid}" + (f", global rank {gr})" if gr != rank else ")")
                return PeerFailure(f"{what} on communicator {self.name!r} rank {self._rank}: {who} is {why}; given up "
                                   f"after {waited + spent:.2f} s of its {shown:g} s timeout", rank, pid, why)

        read = None
        if handle == self._handle:  # this communicator's: another thread's abort() may free it meanwhile
            lib = self.library

            def read() -> int:
                with self._hlock:
                    if self._handle != handle:
                        raise _HandleGone(self._gone_during(what))
                    return lib.comm_get_async_error(handle)

        poll_ready(self.library, handle, what, timeout, on_timeout=on_timeout, comm_name=self.name, give_up=give_up,
                   reported_timeout=reported_timeout, read=read, rank=self._rank)

    def _drain(self, deadline: float, timeout: float, what: str, then: str = "") -> None:
        """Wait for outstanding operations (finalize/destroy flush them anyway): one still running at ``deadline``
        (``timeout`` after the call began) is a :class:`CommTimeout` of ``what`` (``then``: what follows, as the
        message says)."""
        for w in self._pending.snapshot():
            try:
                w.wait(max(1e-3, deadline - time.monotonic()))
            except CommFailure:
                raise
            except TimeoutError as e:
                raise CommTimeout(f"communicator {self.name!r}: {what} timed out after {timeout:g} s waiting for "
                                  f"its outstanding operations: {e}{then}", self.name, w.op, w.seq, timeout,
                                  timeout) from None

    def finalize(self, timeout: Optional[Seconds] = None) -> None:
        """Flush outstanding operations and synchronise with the other ranks (collective).

        After it only :meth:`destroy` (then local and quick) or :meth:`abort` remain. Not done within
        ``timeout`` (the whole call's): :class:`pycoll.CommTimeout`; an operation still running then leaves the
        communicator as it was, a finalize that the other ranks do not join aborts it.
        """
        self.claim("finalize", closing=True)  # collective, ordered with the operations: from their thread
        self._check_usable("finalize")
        timeout = _check_timeout(timeout, self.timeout)
        self._finalize(time.monotonic() + timeout, timeout, "finalize")

    def _finalize(self, deadline: float, timeout: float, what: str, then: str = "") -> None:
        self._drain(deadline, timeout, what, then)
        try:
            with self._lock:
                err = self._finalize_call(deadline, timeout)
            if err is not None:
                self.handle_call_error(err, None)  # outside the lock: lock order
            with self._plock:
                if self._state in ("active", "revoked"):  # not over an abort made meanwhile (the policy: a peer gone)
                    self._state = "finalized"
            # aborted meanwhile: handle raises its CommAborted (an AssertionError escaped from it while "finalized"
            # could overwrite "aborted")
            self._poll(self.handle, "ncclCommFinalize", max(1e-3, deadline - time.monotonic()), self._abort,
                       reported_timeout=timeout)
        except CommTimeout as e:
            self._name_late(e)
            raise

    def _name_late(self, e: CommTimeout) -> None:
        """A finalize that timed out (``e``, raised once the communicator is aborted): the ranks whose last progress
        record says they had not begun theirs (``active``), named in its message and ``behind`` (as an operation's
        timeout names the ranks that had not issued it). Says nothing where no record says so (no store, no
        watchdog, records not read within a second)."""
        states = hooks.peer_states(self)
        late = {r: age for r, (state, age) in sorted((states or {}).items()) if state == "active"}
        if not late:
            return
        ages = sorted(late.values())
        span = f"{ages[0]:.1f}" if ages[-1] - ages[0] < 0.05 else f"{ages[0]:.1f}-{ages[-1]:.1f}"
        who, said = ((f"rank {next(iter(late))}", "its last record says") if len(late) == 1 else
                     (f"ranks {', '.join(map(str, late))}", "their last records say"))
        e.args = (f"{e}; {who} had not begun to finalize (destroy() or finalize()), as {said} ({span} s old: active)",
                  *e.args[1:])
        e.behind = tuple(late)

    def _finalize_call(self, deadline: float, timeout: float) -> Optional[NCCLError]:
        """``ncclCommFinalize`` within ``deadline`` (:meth:`_bounded`); the library's error returned, not raised."""
        h, lib = self.handle, self.library
        try:
            self._bounded(lambda: lib.comm_finalize(h), "ncclCommFinalize", "finalize", deadline, timeout,
                          "the other ranks did not finalize")
        except NCCLError as e:
            return e
        return None

    def _bounded(self, call: Callable[[], Any], what: str, op: str, deadline: float, timeout: float, why: str,
                 on_give_up: Callable[[], None] = lambda: None) -> Any:
        """``call()``, a collective library call of this communicator (``what``), in a thread of its own: a
        nonblocking communicator's returns at once (in progress, polled by the caller), a blocking one's (adopted,
        ``init_all``'s, ``CommConfig(blocking=True)``) only once every rank made it. That wait is bounded here by
        ``deadline``: then, or at Ctrl-C, the communicator is aborted, which ends the call, ``on_give_up()`` is called
        (to abort what the call was making), and :class:`pycoll.CommTimeout` (``why``: what the other ranks did
        not do) or the KeyboardInterrupt raised. Returns what ``call()`` returned, or raises what it raised."""
        dev = self.device
        out: List[Any] = []
        raised: List[BaseException] = []
        done = threading.Event()  # not the thread's is_alive(): a join that Ctrl-C interrupted marks it ended (3.10-12)

        def run() -> None:
            try:
                dev.enter_own_thread()
                out.append(call())
            except BaseException as e:  # the caller takes it
                raised.append(e)
            finally:
                done.set()

        t = threading.Thread(target=run, name=f"pycoll-{op}-{self.name}", daemon=True)
        try:
            t.start()
        except RuntimeError:  # no thread left to start (a pids limit): called here (a nonblocking one returns at once)
            run()
        gave_up = False
        try:
            while not done.is_set() and time.monotonic() < deadline:
                done.wait(min(0.1, max(1e-3, deadline - time.monotonic())))  # Ctrl-C raises between the slices
        finally:
            if not done.is_set():  # given up (the deadline, an interrupt): the abort ends the library's wait
                gave_up = True
                self._abort()
                done.wait(1.0)
                on_give_up()
        if gave_up:
            raise CommTimeout(f"{what} on communicator {self.name!r} rank {self._rank} did not complete within "
                              f"{timeout:g} s (a blocking communicator: {why}); the communicator is aborted",
                              self.name, op, -1, timeout, timeout)
        if raised:
            if isinstance(raised[0], NCCLError) and self._state == "aborted":  # another thread's abort ended it
                raise self._aborted_during(what) from raised[0]
            raise raised[0]
        return out[0]

    def _reshape_call(self, call: Callable[[], Any], what: str, op: str, timeout: float) -> Any:
        """A split's, shrink's or grow's library call (returning ``(slot, status)``), bounded by ``timeout`` on a
        blocking communicator too (:meth:`_bounded`): a child the call was making when it was given up is
        aborted."""
        made: List[Any] = []

        def run() -> Any:
            made.append(call())
            return made[-1]

        def abort_child() -> None:
            child = made[0][0].value if made else 0
            if child:
                with contextlib.suppress(NCCLError):
                    self.library.comm_abort(child)

        return self._bounded(run, what, op, time.monotonic() + timeout, timeout,
                             f"the other ranks did not call {op}", abort_child)

    def destroy(self, timeout: Optional[Seconds] = None) -> None:
        """Release the communicator: finalize (collective: every rank must call it), then free.

        From the thread that has the communicator (see :meth:`hand_off`; or any thread once that one has ended):
        from another one it raises :class:`pycoll.CommStateError`, as an operation does. :meth:`abort` may be called
        from any thread.

        If its outstanding operations have not completed and the other ranks have not arrived within
        ``timeout`` (the whole call's) the communicator is aborted and :class:`pycoll.CommTimeout` raised. After
        an abort this is a no-op. A communicator that failed, was revoked or was the parent of an abortive
        :meth:`shrink` is aborted instead (NCCL's destroy would wait for the ranks that are gone); a failing
        finalize aborts too.
        """
        if self._state in ("aborted", "destroyed", "inherited"):
            return
        self._outside_group("destroy")
        me = threading.get_ident()
        if self._owner != me:  # collective, and ordered with the operations: from their thread (abort: from any)
            self._take_over(me, "destroy", "; abort() may be called from any thread", unless_ended=True)
        timeout = _check_timeout(timeout, self.timeout)
        if not self._owns_handle and self._failure is None:
            self._detach(timeout)
            return
        if self._failure is not None or self._state == "revoked" or self._abort_only:
            self._abort()
            return
        if self._state == "active":
            try:
                self._check_usable("destroy")
                self._finalize(time.monotonic() + timeout, timeout, "destroy", "; the communicator is aborted")
            except BaseException:
                self._abort()  # never leave a live handle behind a failed destroy
                raise
        self._release()
        with self._lock:
            with self._hlock:
                h, self._handle = self._handle, None
            self._state = "destroyed"
            if h is not None:
                self.library.comm_destroy(h)
        self._closed()

    def _detach(self, timeout: float) -> None:
        """destroy() of a handle pycoll does not own: wait for its operations, then let go of it."""
        self._drain(time.monotonic() + timeout, timeout, "destroy")
        self._release()
        with self._lock:
            with self._hlock:
                self._handle = None
            self._state = "destroyed"
        self._closed()

    def abort(self) -> None:
        """Abort: stop every outstanding operation and free the communicator (local, idempotent).

        Operations still running fail with :class:`pycoll.CommAborted`. Several communicators of
        one process that share a GPU must be aborted together: :func:`abort_all`.
        """
        abort_all([self])

    _abort = abort  # the failure policy's and the timeouts' name for it

    def _begin_abort(self) -> Tuple[bool, Optional[int]]:
        """Mark the communicator aborted: whether this call did (False: aborted, destroyed or inherited already),
        and the handle to free (None: none)."""
        with self._plock:
            if self._state in ("aborted", "destroyed", "inherited"):
                return False, None
            self._state = "aborted"
            self._aborter = threading.get_ident()
            self._aborted_why = (f" after: {self._failure}" if self._failure is not None
                                 else f" (abort() in thread {threading.current_thread().name!r})")
            for w in self._pending:  # each is told which operation the abort stopped
                if w._exc is None:
                    w._exc = self._aborted_during(hooks.op_text(w))
        with self._hlock:  # async-error readers stop using the handle before it is freed
            h, self._handle = self._handle, None
        return True, h

    def _end_abort(self) -> None:
        """After the abort: release what pycoll holds (on the device, what the abort thread did not take:
        see :meth:`_release_device_later`) and close."""
        self._release()
        self._closed()

    def _release_device_later(self) -> Callable[[], None]:
        """Take this communicator's stream, events and scratch memory now; free them when the returned
        function runs (the abort thread, once a left-behind abort returns)."""
        with self._plock:  # an operation of another thread makes no new stream once the state is not active
            stream, self._stream = self._stream, None
            events, self._events = self._events, []
            for w in self._pending:
                _core.events_back(events, w)
        scratch = [p for p in (self._scratch, self._bytes_scratch[0]) if p]
        self._scratch, self._bytes_scratch = None, (0, 0)
        return lambda: self._free_device(stream, events, scratch)

    def _free_device(self, stream: Any, events: List[Any], scratch: List[int], later: bool = True) -> None:
        if later and stream is not None and self.device._stream_destroy_blocks and \
                not self.device.query_stream(stream):
            # an abort failed this communicator's operations, but its stream still runs a group's list that holds
            # operations of other communicators (a group of several runs as one list on its first operation's
            # stream), which may wait for their peers up to their own deadlines: the host library's destroy waits
            # for them, so it is done in a thread of its own, once they ended (CUDA's destroy returns at once)
            threading.Thread(target=self._free_device, args=(stream, events, scratch, False), daemon=True,
                             name=f"pycoll-release-{self.name}").start()
            return
        try:
            if stream is not None:
                self.device.destroy_stream(stream)
            for ev in events:
                self.device.destroy_event(ev)
            for ptr in scratch:
                self.library.mem_free(ptr)
        except Exception:
            _log.exception("releasing resources of %r", self.name)

    def _release(self) -> None:
        """Free pycoll-side resources: windows and registrations, premul ops (freed by the library),
        and the stream, events and scratch memory the abort thread did not take."""
        _windows.release_all(self, " (communicator destroyed)" if self._handle is not None
                             else f" (communicator {self._state})")
        for p in list(self._premul):
            p.op = -1
        self._premul.clear()
        self._release_device_later()()  # nothing left when the abort thread took them

    def _closed(self) -> None:
        with self._plock:  # once: a destroy that finished as another thread's abort did calls it too
            if self._released.is_set():
                return
            self._released.set()
        hooks.discard_live(self)
        # the operations an abort stopped still listed: the recorder keeps how they ended; the watchdog's deletes of
        # this communicator's store records are best effort: a store that stopped answering held a destroy(timeout=5)
        # 60 s (a destroy's own bound is earlier, where it has one)
        with requests_until(time.monotonic() + _CLOSE_STORE_S):
            hooks.notify_closed(self)
        with self._plock:
            works = self._pending.snapshot()
            self._pending.clear()
        del works  # their arrays go outside the lock (an array's finalizer may call pycoll)
        if self._owns_device:
            self.device.close()

    def expect_revoke(self) -> None:
        """Say that this communicator is being revoked on purpose on every rank, nothing having failed (the
        elastic layer's requested reshape): from now on a failure found on it -- an operation that meets a peer
        which revoked first -- revokes it instead (:meth:`fail`). No failure is recorded: the observers (the
        watchdog's report, the flight recorder's dump) hear of none, and the operations raise
        :class:`~pycoll.CommRevoked`. Local; a peer that dies meanwhile is found by whoever reshapes."""
        self._revoke_expected = True

    def revoke(self) -> None:
        """Revoke (``ncclCommRevoke``): stop outstanding operations and refuse new collectives.

        The outstanding operations fail (with the communicator's failure, else :class:`pycoll.CommRevoked`).

        Local (other ranks are not told). Split, shrink, destroy and abort remain possible.
        Needs NCCL 2.28.7.
        """
        self._check_alive()
        if self._state == "revoked":
            raise CommStateError(f"communicator {self.name!r} is already revoked")
        self._revoke()

    @contextlib.contextmanager
    def _stopping_outstanding(self, exc: BaseException) -> Iterator[None]:
        """Around a library call that stops the outstanding operations (revoke, an abortive shrink; under
        ``_lock``): they fail with ``exc`` first. Once the library has stopped them their end events are
        complete and its asynchronous error is ncclSuccess, so a refresh after the call (the caller of a
        blocking operation, the watchdog) would find them completed. Undone if the call raises."""
        with self._plock:
            failed = self._fail_outstanding(exc)
        try:
            yield
        except BaseException:
            with self._plock:
                for w in failed:
                    if w._exc is exc:
                        w._exc = None
            raise

    def _revoke(self) -> None:
        with self._lock:
            if self._state in ("revoked", "aborted", "destroyed"):
                return  # a late policy action (another thread revoked, shrank or aborted first)
            h = self.handle
            with self._stopping_outstanding(self._failure or CommRevoked(f"communicator {self.name!r} was revoked")):
                self.library.comm_revoke(h, 0)
            self._state = "revoked"
        _fp.hit(FP_REVOKED)
        if self._handle == h:  # else another thread aborted it meanwhile: nothing left to wait for
            self._poll(h, "ncclCommRevoke", self.timeout, lambda: None, peers=None)

    # -- reshape --------------------------------------------------------------------------------

    def _child_uid(self, tag: str) -> str:
        self._reshapes += 1
        return hashlib.sha1(f"{self.uid}/{self._reshapes}/{tag}".encode()).hexdigest()[:16]

    def _child(self, slot: Any, status: int, *, what: str, uid: str, name: str, global_ranks: Optional[Sequence[int]],
               timeout: float, poll_parent: bool, generation: Optional[int],
               failure_callbacks: Sequence[Callable[[Communicator, BaseException], None]],
               leaving: Sequence[int] = ()) -> Optional[Communicator]:
        def on_timeout() -> None:
            child = slot.value
            self._abort()
            if child:
                with contextlib.suppress(NCCLError):
                    self.library.comm_abort(child)

        def abort_child() -> None:  # SIGTERM ends the process: the child's rendezvous segment goes with it
            child = slot.value
            if child and once.acquire(blocking=False):
                self.library.comm_abort(child)

        once = threading.Lock()
        if status == B.IN_PROGRESS:
            # a grow (which polls the child) also ends when this communicator fails meanwhile: its joiners are
            # no peers of this one, only the caller (the elastic layer) can tell that one of them is gone
            with hooks.initializing(abort_child, any_thread=self.library.kind == "host"):
                try:
                    self._poll(self.handle if poll_parent else slot.value, what, timeout, on_timeout, peers=leaving,
                               watch_failure=not poll_parent)
                except NCCLError as e:
                    failure = self._failure
                    if poll_parent and failure is None and self._state == "active":
                        # the error is this communicator's asynchronous error now: it is failed, as its state says
                        # (it read "active" while every operation raised the split's error)
                        self.fail(self._async_exc(e.code), None)
                    if failure is not None and not isinstance(e, CommFailure) and _library_code(failure) != e.code:
                        # the communicator failed meanwhile (another thread's fail(): a reshape elsewhere revoked
                        # it), which stopped this call: what the caller's recovery catches, naming both. Not where
                        # that failure is this call's own error, which the watchdog read first
                        cls = CommRevoked if isinstance(failure, CommRevoked) else CommFailure
                        raise cls(f"{what} on communicator {self.name!r} rank {self._rank} did not complete: the "
                                  f"communicator failed meanwhile ({failure}); the library said: {e}") from e
                    raise
        h = slot.value
        if not h:
            return None
        lib = self.library
        child = Communicator(
            h, library=lib, device=self.device, rank=lib.comm_user_rank(h), size=lib.comm_count(h), name=name,
            uid=uid, global_ranks=global_ranks, timeout=self.timeout, on_failure=self._on_failure,
            store=self._store, generation=self._generation if generation is None else generation,
            failure_callbacks=failure_callbacks,
        )
        if self._revoke_expected:  # made while a requested reshape revokes its parent's generation: so is it
            child.expect_revoke()
        self._children.add(child)
        return child

    def descendants(self, closed: bool = False) -> List[Communicator]:
        """The communicators made from this one (``split``, ``shrink``, ``grow``) and from those, that are still
        open (not destroyed, not aborted; ``closed=True``: those too, while something holds them)."""
        out: List[Communicator] = []
        for child in list(self._children):
            if closed or not child.closed:
                out.append(child)
            out.extend(child.descendants(closed))
        return out

    def _reshape_config(self, config: Optional[CommConfig]) -> Any:
        if config is None:
            return None  # inherit the parent's (nonblocking) configuration
        if not isinstance(config, CommConfig):
            raise TypeError(f"config must be a pycoll.CommConfig or None, not {type(config).__name__}")
        return config.to_nccl(self.library, blocking_default=False)

    def split(self, color: Optional[int], key: Optional[int] = None, *, config: Optional[CommConfig] = None,
              name: Optional[str] = None, timeout: Optional[Seconds] = None, generation: Optional[int] = None,
              failure_callbacks: Sequence[Callable[[Communicator, BaseException], None]] = (),
              ) -> Optional[Communicator]:
        """Split into sub-communicators by ``color`` (collective over every rank of this one).

        Ranks passing the same color form a new communicator, ordered by ``key`` (default: this
        rank) then by rank. ``color=None`` (or NCCL's ``NCCL_SPLIT_NOCOLOR``, -1) takes part without joining
        any: it returns None. ``color`` and ``key`` must fit NCCL's int. The child inherits the failure policy,
        the store, the operations' default timeout (``comm.timeout``; set the child's own after) and (unless
        ``generation`` is given) the generation; ``failure_callbacks`` are its own. ``timeout`` bounds the split
        itself (default this communicator's). Its members' job-wide ranks are exchanged first (over this
        communicator on the host backend, else through the store; unknown without one): on the host backend that
        exchange is an ``all_gather`` of this communicator (the flight recorder shows it), so a rank that does not
        call ``split`` makes it time out as any collective does, and this communicator fails by its policy. A split
        the library fails (no room for the new communicator's shared memory, say) fails this communicator too: the
        library keeps the error as its asynchronous error.
        """
        self._outside_group("split")
        self._check_alive()
        if self._failure is not None and self._state != "revoked":
            raise self._failure
        timeout = _check_timeout(timeout, self.timeout)
        if type(color) is int and color == B.SPLIT_NOCOLOR:  # NCCL's spelling of None
            color = None
        if color is not None:
            color = _integer(color, "color", "a non-negative int below 2**31, or None (NCCL_SPLIT_NOCOLOR)", 0)
            if color >= 1 << 31:
                raise ValueError(f"color must be below 2**31 (NCCL's int), got {color}")
        key = self._rank if key is None else _integer(key, "key", "an int")
        if not -(1 << 31) <= key < 1 << 31:  # refused here, before the other ranks meet it in the exchange below
            raise ValueError(f"key must fit NCCL's int (-2**31 .. 2**31-1), got {key}")
        cfg = self._reshape_config(config)
        _child_name(name, "split")
        uid = self._child_uid(f"split:{color}")
        try:
            members = self._split_members(-1 if color is None else color, key, timeout)
        except (CommFailure, StoreError) as e:
            note = getattr(e, "add_note", None)  # Python >= 3.11
            if note is not None:
                note(f"pycoll: in split() of communicator {self.name!r}: the exchange of the new communicators' "
                     "members (every rank of this one takes part)")
            raise
        h = self.handle
        with self._lock:
            slot, status = self._reshape_call(
                lambda: self.library.comm_split(h, B.SPLIT_NOCOLOR if color is None else color, key, cfg),
                "ncclCommSplit", "split", timeout)
        return self._child(slot, status, what="ncclCommSplit", uid=uid,
                           name=name or f"{self.name}.split{self._reshapes}",
                           global_ranks=members, timeout=timeout, poll_parent=True, generation=generation,
                           failure_callbacks=failure_callbacks)

    def _gone_during(self, what: str) -> BaseException:
        """The error of a poll for ``what`` whose handle another thread freed: the library's asynchronous error the poll
        would have read, where the watchdog found it first and its policy aborted the communicator (a split the
        library refused for want of shared memory raised NCCLSystemError, or CommAborted when the watchdog was
        quicker); else :meth:`_aborted_during`."""
        f = self._failure
        code = _library_code(f)
        if isinstance(code, int) and code > 0 and code != B.IN_PROGRESS:
            return error_class(code)(code, what, self.library.get_error_string(code), str(f), self.library.path)
        return self._aborted_during(what)

    def _aborted_during(self, what: str) -> CommAborted:
        """The error of a wait for ``what`` that another thread's abort of this communicator ended."""
        return CommAborted(f"{what} on communicator {self.name!r} did not complete: the communicator was "
                           f"aborted{self._aborted_why}")

    def _store_get(self, key: str, timeout: float, what: str) -> bytes:
        """``store.get(key)`` within ``timeout``, in slices: another thread's abort of this communicator ends it
        (CommAborted naming it, as a library wait's), not the store's timeout."""
        deadline = time.monotonic() + timeout
        while True:
            left = deadline - time.monotonic()
            try:
                return bytes(self._store.get(key, timeout=max(1e-3, min(0.1, left))))
            except StoreTimeout:
                if self._state == "aborted":
                    raise self._aborted_during(what) from None
                if left <= 0.1:
                    raise StoreTimeout(f"{what} on communicator {self.name!r}: timed out after {timeout:g} s waiting "
                                       f"for key {key!r} of the store (a rank that has not called {what})") from None

    def _split_members(self, color: int, key: int, timeout: float) -> Optional[Tuple[int, ...]]:
        """The job-wide ranks of this rank's split child, in the child's rank order (NCCL orders the
        ranks of a color by key, then by rank), from every rank's (color, key, global rank)."""
        mine = (color, key, self.global_rank)
        if self._state == "active" and self.backend == "host":
            import numpy as np

            self.claim("split")  # refused as itself, not as the all_gather below
            everyone = np.empty(3 * self._size, dtype=np.int64)
            self.all_gather(np.array(mine, dtype=np.int64), everyone, timeout=timeout)
            rows = [tuple(int(v) for v in everyone[3 * r:3 * r + 3]) for r in range(self._size)]
        elif self._store is not None:
            base = f"pycoll/split/{self.uid}/{self._reshapes}"
            self._store.set(f"{base}/{self._rank}", " ".join(map(str, mine)))
            rows = [tuple(int(v) for v in self._store_get(f"{base}/{r}", timeout, "split").split())
                    for r in range(self._size)]
        else:
            return None
        if color < 0:
            return None
        same = sorted((k, r) for r, (c, k, _) in enumerate(rows) if c == color)
        return tuple(rows[r][2] for _, r in same)

    def shrink(self, exclude: Sequence[int], *, abort_ops: bool = False, config: Optional[CommConfig] = None,
               name: Optional[str] = None, timeout: Optional[Seconds] = None, generation: Optional[int] = None,
               failure_callbacks: Sequence[Callable[[Communicator, BaseException], None]] = (),
               ) -> Communicator:
        """A new communicator without the ranks in ``exclude`` (``ncclCommShrink``; NCCL 2.27).

        Only the survivors call it, all with the same ``exclude``; they are renumbered in rank
        order. ``abort_ops=True`` (NCCL_SHRINK_ABORT) first stops this communicator's outstanding
        operations (they fail: with its failure, else :class:`pycoll.CommAborted`) -- use it after a
        failure. This communicator stays valid and must still be
        released; after an abortive shrink release it with :meth:`abort`. The child inherits the
        failure policy, the store, the operations' default timeout, the survivors' job-wide ranks and (unless
        ``generation`` is given) the generation; ``failure_callbacks`` are its own. ``timeout`` bounds the shrink
        itself (default this communicator's). A rank left out while alive keeps this communicator, but on the host
        library it cannot take part in a later split, shrink or grow of it with the others: the ranks number the
        reshapes they made and its number is one behind (they fail with a mismatch naming the two calls).
        """
        self._outside_group("shrink")
        if not abort_ops:  # collective, ordered with the operations (an abortive one stops them: from any thread)
            self.check_thread("shrink")
        self._check_alive()
        if self._failure is not None and not abort_ops and self._state != "revoked":
            raise self._failure
        timeout = _check_timeout(timeout, self.timeout)
        if isinstance(exclude, (str, bytes)) or not isinstance(exclude, Iterable):
            raise TypeError(f"shrink: exclude must be a sequence of ranks, got {exclude!r}"
                            + (f" (one rank: [{exclude}])" if isinstance(exclude, int) else ""))
        excl = sorted({self._root(r, "excluded rank") for r in exclude})
        if not excl:
            raise ValueError("shrink needs at least one rank to exclude")
        if self._rank in excl:
            raise ValueError(f"rank {self._rank} is in the exclude list: excluded ranks must not call shrink")
        cfg = self._reshape_config(config)
        _child_name(name, "shrink")
        uid = self._child_uid("shrink:" + ",".join(map(str, excl)))
        gr = None
        if self._global_ranks is not None:
            gr = [g for r, g in enumerate(self._global_ranks) if r not in excl]
        stop: ContextManager[None] = contextlib.nullcontext()
        if abort_ops:
            stop = self._stopping_outstanding(self._failure or CommAborted(
                f"communicator {self.name!r}: the operation was stopped by shrink(abort_ops=True)"))
        h = self.handle
        with self._lock, stop:
            slot, status = self._reshape_call(
                lambda: self.library.comm_shrink(h, excl, cfg, B.SHRINK_ABORT if abort_ops else B.SHRINK_DEFAULT),
                "ncclCommShrink", "shrink", timeout)
        self._abort_only |= abort_ops
        child = self._child(slot, status, what="ncclCommShrink", uid=uid,
                            name=name or f"{self.name}.shrink{self._reshapes}",
                            global_ranks=gr, timeout=timeout, poll_parent=True, generation=generation,
                            failure_callbacks=failure_callbacks, leaving=excl)
        assert child is not None
        return child

    def get_unique_id(self) -> Any:
        """A unique id for :meth:`grow` (``ncclCommGetUniqueId``, NCCL 2.29); each id is used once."""
        self._check_alive()
        with self._lock:
            return self.library.comm_get_unique_id(self.handle)

    def grow(self, size: int, unique_id: Any = None, *, config: Optional[CommConfig] = None,
             name: Optional[str] = None, timeout: Optional[Seconds] = None,
             global_ranks: Optional[Sequence[int]] = None, generation: Optional[int] = None,
             failure_callbacks: Sequence[Callable[[Communicator, BaseException], None]] = (),
             ) -> Communicator:
        """A bigger communicator: this one's ranks keep their numbers, new ranks join at the end.

        Every existing rank calls it with the id the coordinator (the rank that called
        :meth:`get_unique_id`) made; new processes call :func:`pycoll.join` with the same id and
        ``size``. The id names the new communicator alike on every rank (its ``uid``, in dumps)
        and tells the library which grow it is (the host library aligns its reshape count by it).
        A rank that passes None still joins, but its dumps name the new communicator differently
        from the coordinator's and the joiners'.
        This communicator must be idle and should be destroyed afterwards (NCCL 2.29).
        ``global_ranks``: every member's job-wide rank (unknown otherwise); the rest as for
        :meth:`shrink`.
        """
        self._outside_group("grow")
        self.check_thread("grow")  # collective, ordered with the operations
        self._check_usable("grow")
        timeout = _check_timeout(timeout, self.timeout)
        size = _integer(size, "grow: size", f"an int larger than the current {self._size}", self._size + 1)
        if unique_id is not None:
            unique_id = unique_id_argument(unique_id, "grow: unique_id")
        cfg = self._reshape_config(config)
        _child_name(name, "grow")
        uid = (hashlib.sha1(bytes(unique_id)).hexdigest()[:16] if unique_id is not None
               else self._child_uid(f"grow:{size}"))
        h = self.handle
        with self._lock:
            slot, status = self._reshape_call(lambda: self.library.comm_grow(h, size, unique_id, -1, cfg),
                                              "ncclCommGrow", "grow", timeout)
        self._reshapes += 1
        child = self._child(slot, status, what="ncclCommGrow", uid=uid,
                            name=name or f"{self.name}.grow{self._reshapes}",
                            global_ranks=global_ranks, timeout=timeout, poll_parent=False, generation=generation,
                            failure_callbacks=failure_callbacks)
        assert child is not None
        return child
