# cython: language_level=3, boundscheck=False, wraparound=False, embedsignature=True, binding=True
"""The per-call path of pycoll's core, compiled: :class:`Work`, and how one operation is checked,
described, launched, refreshed from its events and retired.

:class:`CommCore` is the base of ``Communicator``: the fields every operation reads, as C struct members, and
its three locks (:class:`Lock`, :class:`RLock`: threading's interface, taken here without a method call).
The functions below are the bodies of ``Communicator._begin``, ``_buf``, ``_launch``, ``refresh``, ``_retire``,
``all_reduce``, ``broadcast``, ``reduce``, ``all_gather``, ``reduce_scatter``, ``all_to_all``, ``gather``,
``scatter``, ``send``, ``recv`` and ``sendrecv`` (the Communicator binds these functions as its methods), and
:class:`GroupScope` the body of ``Communicator.group``: one path on every backend. An operation's start event
is recorded on its stream, the Work becomes outstanding (the watchdog watches it from then on), the library call (:func:`library_call`: the C function
pointer, GIL released) enqueues it, its end event is recorded after it; completion is read from the
events. On pycoll's host library the event and async-error calls go straight to the C functions, on a
CUDA device with a driver table (``CudaDevice.driver``) to the CUDA driver's; every other device is
called through its Python methods. Nothing here decides policy: failures go
to ``Communicator.fail`` and ``handle_call_error``, which stay Python.

Also here: this thread's open group (:func:`open_group`), the observers' compiled hooks (:class:`Hook`), and
:data:`DLPACK_CAPSULE_DESTRUCTOR`, a C destructor for DLPack capsules made in Python.
"""

cimport cython
from cpython.buffer cimport PyBuffer_IsContiguous
from cpython.contextvars cimport PyContext_CopyCurrent
from cpython.number cimport PyIndex_Check, PyNumber_Index
from cpython.exc cimport PyErr_CheckSignals, PyErr_Clear, PyErr_Fetch, PyErr_Restore
from cpython.memoryview cimport PyMemoryView_FromObject, PyMemoryView_GET_BUFFER
from cpython.object cimport PyTypeObject
from cpython.pycapsule cimport PyCapsule_GetPointer, PyCapsule_IsValid
from cpython.pythread cimport PyThread_get_thread_ident
from cpython.ref cimport Py_INCREF, Py_XDECREF, Py_XINCREF, PyObject
from libc.stdint cimport uint64_t, uintptr_t
from libc.math cimport INFINITY
from libc.string cimport strncpy
from posix.time cimport CLOCK_MONOTONIC, CLOCK_REALTIME, clock_gettime, timespec

from pycoll._bindings._nccl cimport CudaDriver, Library
from pycoll._bindings.libnccl cimport (
    cudaStream_t, ncclComm_t, ncclDataType_t, ncclRedOp_t, ncclResult_t, pycollEvent_t, pycollStream_t,
)

import logging
import sys
import threading
import time

import numpy as np

from . import _bindings as B, _dtypes, _settings, buffers as _buffers, hooks
from .buffers import Buffer, as_buffer, check_count, check_device, check_overlap, check_same_dtype
from .collconfig import prepare as _prepare_config
from .devices import FIRST_SLEEP_S, HostDevice
from .errors import (AsyncCommError, CaptureError, CommAborted, CommFailure, CommStateError, NCCLError, NotSupported,
                     WaitTimeout,
                     error_class)

__all__ = ["CommCore", "Hook", "Lock", "RLock", "Work", "launch", "refresh", "retire_clean", "retire", "events_back", "begin",
           "buf", "all_reduce", "broadcast", "reduce", "all_gather", "reduce_scatter", "all_to_all", "gather", "scatter", "send",
           "recv", "sendrecv", "GroupScope", "library_call", "open_group", "group_library", "set_group", "DLPACK_CAPSULE_DESTRUCTOR", "STAGES", "stage_clock", "torch_dlpack_view",
           "gpu_driver_calls"]

_log = logging.getLogger("pycoll.comm")

cdef int _IN_PROGRESS = B.IN_PROGRESS
cdef double _SLICE_S = 5e-3  # longest a wait blocks on an event before it looks at the communicator again
cdef object _COMPLETED = "completed"
cdef object _CAPTURED = "captured"
cdef object _SCHEDULED = "scheduled"
cdef object _STARTED = "started"
cdef object _HostDevice = HostDevice


cdef inline long long _mono_ns() noexcept nogil:
    cdef timespec ts
    clock_gettime(CLOCK_MONOTONIC, &ts)
    return <long long>ts.tv_sec * 1000000000 + ts.tv_nsec


cdef inline double _monotonic() noexcept nogil:
    """CLOCK_MONOTONIC in seconds (``time.monotonic()``), as a Work's ``t0`` holds it."""
    return _mono_ns() * 1e-9


cdef inline long long _time_ns() noexcept nogil:
    cdef timespec ts
    clock_gettime(CLOCK_REALTIME, &ts)
    return <long long>ts.tv_sec * 1000000000 + ts.tv_nsec


cdef long long _wall_offset = 0  # CLOCK_REALTIME - CLOCK_MONOTONIC, ns, as last measured
cdef long long _wall_measured = -(1LL << 62)  # when (CLOCK_MONOTONIC, ns)


cdef inline long long _wall_ns(long long mono) noexcept nogil:
    """The wall clock (CLOCK_REALTIME, ns) at the monotonic time ``mono`` (ns): an operation's times come from
    one clock read. The offset between the two clocks changes only when the wall clock is stepped: it is
    measured again once a second."""
    global _wall_offset, _wall_measured
    if mono - _wall_measured >= 1000000000:
        _wall_offset = _time_ns() - _mono_ns()
        _wall_measured = mono
    return mono + _wall_offset


cdef inline bint _is_state(object state, object const, str name):
    """``state`` is the state ``const`` (whose name is ``name``). The path's states are these objects; a state
    string made elsewhere is compared by value, and none of the path's own pays a string comparison."""
    if state is const:
        return True
    if state is _SCHEDULED or state is _STARTED or state is _COMPLETED or state is _CAPTURED:
        return False
    return state == name


cdef inline bint _final(object state):
    return _is_state(state, _COMPLETED, "completed") or _is_state(state, _CAPTURED, "captured")


# -- the stage clock (benchmarks/overhead.py --breakdown): where the time of one operation goes --------

cdef enum:
    _ST_BEGIN, _ST_DESCRIBE, _ST_ARGS, _ST_WORK, _ST_ENQUEUED, _ST_START, _ST_CALL, _ST_END, _ST_COMPLETE, _ST_DONE, _ST_N

#: the stages, in the order of the path (``stage_clock``'s keys)
STAGES = ("state check + stream", "buffer description", "argument checks + library call object",
          "Work", "observers at enqueue (recorder, watchdog)", "start event + outstanding", "library call",
          "end event", "completion (events, async error, retire)", "observers at completion")
cdef bint _clocking = False
cdef bint _clock_armed = False  # an all_reduce of the clock's thread is under way: one load per stage while not
cdef unsigned long _clock_thread = 0
cdef long long _clock_ns[_ST_N]
cdef long long _clock_last = 0, _clock_ops = 0


cdef inline void _stage(int stage) noexcept:
    """The stage that just ended, counted while an all_reduce of the clock's thread is under way."""
    global _clock_last
    cdef long long t
    if _clock_armed and PyThread_get_thread_ident() == _clock_thread:
        t = _mono_ns()
        _clock_ns[stage] += t - _clock_last
        _clock_last = t


def stage_clock(on=None):
    """Start (``on=True``: the counts cleared) or stop (``False``) the stage clock, and return what it counted:
    ``{"operations": n, stage: ns, ...}`` over :data:`STAGES` (each stage's ns include one clock read). It follows
    the blocking ``all_reduce`` calls made outside a group by the thread that started it; other operations, other
    threads and what a failing call did after its failure are not counted. For ``benchmarks/overhead.py
    --breakdown``."""
    global _clocking, _clock_armed, _clock_thread, _clock_ops
    cdef int i
    if on is not None:
        if on:
            for i in range(_ST_N):
                _clock_ns[i] = 0
            _clock_ops = 0
            _clock_thread = PyThread_get_thread_ident()
        _clocking, _clock_armed = bool(on), False
    out = {"operations": _clock_ops}
    for i in range(_ST_N):
        out[STAGES[i]] = _clock_ns[i]
    return out


# -- this thread's open group (ncclGroupStart .. ncclGroupEnd): read on every operation --------------

cdef extern from *:
    """
    /* The Works of this thread's open group (a list; NULL outside one) and its library: owned references */
    static _Thread_local PyObject* pycoll_group_works = NULL;
    static _Thread_local PyObject* pycoll_group_lib = NULL;
    /* a nested group's body raised: the outermost one drops what it holds */
    static _Thread_local int pycoll_group_raised = 0;
    /* the contextvars context that opened the group (an owned reference; made for a thread that had none): each
     * asyncio task runs in its own, and a task made in the group's block in a copy -- and the scopes open */
    static _Thread_local PyObject* pycoll_group_owner = NULL;
    static _Thread_local int pycoll_group_depth = 0;
    /* the first Work that joined the open group, captured or not (a captured one is in no list): owned, or NULL */
    static _Thread_local PyObject* pycoll_group_first = NULL;
    static inline PyObject* pycoll_context(void) { return PyThreadState_Get()->context; }
    /* the thread's state's id: never another thread's, unlike its ident (reused once the thread is gone) */
    static inline unsigned long long pycoll_thread_id(void) { return PyThreadState_GetID(PyThreadState_Get()); }
    """
    PyObject* pycoll_group_works
    PyObject* pycoll_group_lib
    int pycoll_group_raised
    PyObject* pycoll_group_owner
    int pycoll_group_depth
    PyObject* pycoll_group_first
    PyObject* pycoll_context()
    unsigned long long pycoll_thread_id()


cdef inline object _open_works():
    return <object>pycoll_group_works if pycoll_group_works != NULL else None


def open_group():
    """The Works of this thread's open group (a list), or None outside a group."""
    return _open_works()


def group_library():
    """The library of this thread's open group, or None outside a group."""
    return <object>pycoll_group_lib if pycoll_group_lib != NULL else None


def set_group(list works, library):
    """Open this thread's group (``works``: the list its Works go to, ``library``: the library it is on) or, with
    ``works=None``, close it (``pycoll.group`` does both)."""
    _set_group(works, library)


cdef int _set_group(list works, object library) except -1:
    global pycoll_group_works, pycoll_group_lib, pycoll_group_owner, pycoll_group_depth, pycoll_group_first
    cdef PyObject* old_works = pycoll_group_works
    cdef PyObject* old_lib = pycoll_group_lib
    cdef PyObject* old_owner = pycoll_group_owner
    cdef PyObject* old_first = pycoll_group_first
    pycoll_group_first = NULL
    if works is None:
        pycoll_group_works = pycoll_group_lib = pycoll_group_owner = NULL
        pycoll_group_depth = 0
    else:
        pycoll_group_depth = 1  # the scope (or group_simulate) that opens it
        Py_INCREF(works)
        Py_INCREF(library)
        if pycoll_context() == NULL:  # a thread that has used no contextvars yet: made now, as a first ContextVar use
            PyContext_CopyCurrent()  # in the group's block would make it (and refuse what follows)
        Py_XINCREF(pycoll_context())  # held: its address is not another context's while the group is open
        pycoll_group_works, pycoll_group_lib, pycoll_group_owner = <PyObject*>works, <PyObject*>library, pycoll_context()
    Py_XDECREF(old_works)
    Py_XDECREF(old_lib)
    Py_XDECREF(old_owner)
    Py_XDECREF(old_first)
    return 0


#: a group's operations are checked against each other as they join it up to this many; a bigger group is checked
#: once more, whole, as it ends (sorted by address: no time quadratic in its size)
DEF _GROUP_PAIRWISE = 16


# groups whose block ended in another thread than the one that opened it (a generator suspended in the block and
# closed there): opening thread's id (pycoll_thread_id) -> what happened; that thread's next operation or group
# drops the group
cdef dict _orphaned = {}
cdef int _n_orphaned = 0


cdef int _orphan_check(object op) except -1:
    """This thread's open group was left by its block (ended in another thread): drop it (none of its operations
    runs) and raise, naming ``op``, the call that found it."""
    global _n_orphaned
    why = _orphaned.pop(pycoll_thread_id(), None)
    _n_orphaned = len(_orphaned)
    if why is None or pycoll_group_works == NULL:
        return 0
    works = _open_works()
    lib = <object>pycoll_group_lib
    _set_group(None, None)
    if _drop_group(lib, works, None, why):
        raise CommStateError(f"{op}: this thread's open group() was dropped, none of its {len(works)} operations ran "
                             f"(nor does this call): {why}")
    lib.group_end()  # NCCL < 2.22 cannot drop a group: it runs, as a raised block's group does there
    raise CommStateError(f"{op}: this thread's open group() was ended here, its {len(works)} operations issued (this "
                         f"library cannot drop a group; this call was not issued): {why}")


cdef inline bint _group_mine():
    """Whether this context is the one that opened this thread's group (an asyncio task, a trio task or a greenlet
    with contextvars runs in its own; a task made inside the group's block in a copy)."""
    return pycoll_context() == pycoll_group_owner


cdef list _written(object op, object root, object rank, list inputs, list outputs):
    """What of ``outputs`` an operation writes on this rank: nothing on the root of a broadcast in place (it only reads
    its buffer; out of place it copies it into its output) nor on a reduce's other ranks (their output is not looked
    at)."""
    if root is not None:
        if op == "reduce" and root != rank:
            return []
        if op == "broadcast" and root == rank and (outputs is inputs or not outputs or not inputs or
                                                   (<tuple>outputs[0])[0] == (<tuple>inputs[0])[0]):
            return []
    return outputs


cdef inline bint _exempt(bint p2p, object comm, Work w):
    """Collectives of one communicator run in their order: they may share memory within a group."""
    return not p2p and not w.is_p2p and w.comm is comm


cdef int _group_check(CommCore comm, object op, list inputs, list written, bint p2p) except -1:
    """An operation about to join this thread's open group: refused where another context (an asyncio task) opened
    the group -- it would run at that group's end, its blocking call returning at once -- and where its memory meets
    another operation's of the group, one of them writing it (``written``: what it writes), but for two collectives of
    one communicator: a group's operations run together, unordered (a receive into what was being sent got either's
    data, by size). Past _GROUP_PAIRWISE operations, GroupScope.__exit__ checks the whole group (_group_sweep)."""
    cdef Work w
    if _n_orphaned:
        _orphan_check(op)
    if not _group_mine():
        raise CommStateError(
            f"{op}: this thread's open group() was opened by another asyncio task (or context), and {op} would join "
            "it: it would run when that group ends, a blocking call returning before. Keep a group's block free of "
            "awaits, or issue the operations of concurrent tasks from threads of their own")
    works = <list>pycoll_group_works
    if len(works) >= _GROUP_PAIRWISE:
        return 0
    for w in works:
        if _exempt(p2p, comm, w):
            continue
        theirs = _written(w.op, w.root, w.comm._rank, w.inputs, w.outputs)
        for b in written:
            for o in w.inputs:
                if _share_memory(b, o):
                    _group_overlap(op, "output", w, "input", comm)
            for o in theirs:
                if _share_memory(b, o):
                    _group_overlap(op, "output", w, "output", comm)
        for b in inputs:
            for o in theirs:
                if _share_memory(b, o):
                    _group_overlap(op, "input", w, "output", comm)
    return 0


cdef int _group_first(Work w) except -1:
    global pycoll_group_first
    Py_INCREF(w)
    pycoll_group_first = <PyObject*>w
    return 0


cdef int _group_capture_check(object op, object capture, object stream, Work first) except -1:
    """An operation joining this thread's open group: refused where its stream's graph capture (None: not capturing)
    is not the group's first operation's, as NCCL refuses such a group (ncclInvalidUsage): the group runs as one, so
    an operation not captured would run at the graph's replays, or a captured one at once."""
    if first.capture_id == capture:
        return 0
    raise CaptureError(
        f"{op}: the streams of one group() must all be uncaptured or all captured by the same graph, as NCCL "
        f"requires: this operation's is {_capture_text(capture, stream)}, the group's first operation's ({first.op}, "
        f"seq {first.seq}) {_capture_text(first.capture_id, first.stream)}", stream or 0, capture)


cdef str _capture_text(object capture, object stream):
    return (f"not captured" if capture is None else f"captured by graph capture {capture}") + \
        f" (stream 0x{stream or 0:x})"


cdef bint _failure_handled(object comm):
    """Whether ``comm``'s failure, where one is recorded, has been handled (observers told, the policy acted), is
    being handled in this thread (which must not wait for itself), or has been for longer than
    ``CommCore.await_failure_handled`` waits (twice PYCOLL_ABORT_TIMEOUT)."""
    failure_handled = comm._failure_handled
    if comm._failure is None or failure_handled.is_set() or comm._failing_thread == PyThread_get_thread_ident():
        return True
    since = comm.failed_at
    return since is not None and time.time() - since > 2 * _settings.get("PYCOLL_ABORT_TIMEOUT")


cdef int _group_overlap(object op, str mine, Work w, str theirs, object comm) except -1:
    """The ValueError for ``op`` (of ``comm``) whose buffer overlaps one of ``w``'s in a group that one of them writes;
    each named with its communicator where they differ (their numbers are their communicators')."""
    other = hooks.op_text(w)
    if w.comm is not comm:
        op, other = f"{op} on {comm.name!r}", f"{other} on {w.comm.name!r}"
    raise ValueError(
        f"{op}: its {mine} overlaps in memory with the {theirs} of {other} in the same group, and one of "
        "them writes it: a group's operations run together, unordered, so the result would be either's data. Use "
        "separate buffers (sendrecv needs two), or two groups")


cdef int _group_sweep(list works) except -1:
    """:func:`_group_check`'s test over a whole group, in time n log n: every buffer as (start, end, writes, work),
    sorted by start; each one meets the earlier ones that end past its start -- only those (a writer among them, or any
    where it writes) are looked at one by one."""
    cdef list spans = []
    cdef Work w, v
    cdef Py_ssize_t i, j, k, n
    cdef uintptr_t lo, hi, end_any = 0, end_written = 0
    for i in range(len(works)):
        w = works[i]
        written = _written(w.op, w.root, w.comm._rank, w.inputs, w.outputs)
        for b in w.inputs:
            if (<tuple>b)[1]:
                spans.append(((<tuple>b)[0], (<tuple>b)[0] + (<tuple>b)[1], False, i))
        for b in written:
            if (<tuple>b)[1]:
                spans.append(((<tuple>b)[0], (<tuple>b)[0] + (<tuple>b)[1], True, i))
    spans.sort()
    n = len(spans)
    for k in range(n):
        lo, hi, writes, i = spans[k]
        if lo < (end_any if writes else end_written):  # it may meet an earlier one: which, and does it count?
            w = works[i]
            for j in range(k):
                other = spans[j]
                v = works[<Py_ssize_t>other[3]]
                if <uintptr_t>other[1] > lo and other[3] != i and (writes or other[2]) and \
                        not _exempt(w.is_p2p, w.comm, v):
                    # in issue order (their op ids are their communicators' own)
                    first, second = (v, w) if <Py_ssize_t>other[3] < i else (w, v)
                    mine = "output" if (writes if second is w else other[2]) else "input"
                    theirs = "output" if (other[2] if second is w else writes) else "input"
                    _group_overlap(hooks.op_text(second), mine, first, theirs, second.comm)
        if hi > end_any:
            end_any = hi
        if writes and hi > end_written:
            end_written = hi
    return 0


cdef extern from "<semaphore.h>" nogil:
    int sem_init(sem_t*, int, unsigned int)
    int sem_destroy(sem_t*)
    int sem_trywait(sem_t*)
    int sem_post(sem_t*)
    int sem_timedwait(sem_t*, const timespec*)


cdef class Lock:
    """A lock with ``threading.Lock``'s interface (``acquire(blocking, timeout)``, ``release``,
    ``locked``, ``with``) that the per-call path takes and releases without a Python method call.

    It is a POSIX semaphore, as CPython's locks are on Linux, without their clock read on every
    acquire: an uncontended acquire and release are two atomic operations. Any thread may release it,
    as ``threading.Lock``. A blocked ``acquire`` releases the GIL, and runs signal handlers every
    50 ms (Ctrl-C interrupts it, as it does ``threading.Lock``'s)."""

    def __cinit__(self):
        if sem_init(&self._sem, 0, 1) != 0:
            raise MemoryError("cannot make a lock")

    def __dealloc__(self):
        sem_destroy(&self._sem)

    cdef bint take(self, double timeout) except -1:
        """Acquire; ``timeout`` < 0: wait as long as it takes, 0: do not wait. True once acquired."""
        cdef bint got = sem_trywait(&self._sem) == 0
        cdef double end = 0, left
        cdef timespec until
        if not got and self._no_self_wait and self._held and timeout < 0 and \
                self._holder == PyThread_get_thread_ident():
            # this thread holds it and would wait for itself for ever: code that ran while pycoll held it -- a
            # finalizer or __del__ of an array let go, a gc callback, a signal handler -- called pycoll back
            raise CommStateError(
                "pycoll was called back from code that ran while it held a communicator's lock in this thread (a "
                "finalizer or __del__ of an array it let go, a gc.callbacks function, a signal handler): calling "
                "it there would wait for itself for ever; call it outside such code (e.g. set a flag there)")
        if not got and timeout > 0:
            end = _monotonic() + timeout  # read the clock only when the lock is contended
        while not got:
            if timeout == 0:
                return False
            left = 0.05 if timeout < 0 else min(0.05, end - _monotonic())
            if left <= 0:
                return False
            clock_gettime(CLOCK_REALTIME, &until)  # sem_timedwait's clock; a slice is at most 50 ms
            until.tv_nsec += <long>(left * 1e9)
            until.tv_sec += until.tv_nsec // 1000000000
            until.tv_nsec %= 1000000000
            with nogil:
                got = sem_timedwait(&self._sem, &until) == 0
            if not got:
                PyErr_CheckSignals()
        self._held = True
        if self._no_self_wait:  # only then is the holder looked at
            self._holder = PyThread_get_thread_ident()
        return True

    cdef int give(self) except -1:
        if not self._held:
            raise RuntimeError("release unlocked lock")
        self._held = False
        self._holder = 0
        sem_post(&self._sem)
        return 0

    def acquire(self, blocking=True, timeout=-1):
        """Acquire the lock, as ``threading.Lock.acquire`` (an RLock: again by the thread that holds it);
        True if it was acquired."""
        if not blocking and timeout != -1:
            raise ValueError("can't specify a timeout for a non-blocking call")
        if not timeout >= 0 and timeout != -1:  # NaN too
            raise ValueError("timeout value must be a non-negative number")
        return self.take(0.0 if not blocking else (-1.0 if timeout == -1 else timeout))

    def release(self):
        """Release the lock (``RuntimeError`` if it is not held; an RLock: one level, by the thread that
        holds it)."""
        self.give()

    def locked(self):
        """True while some thread holds the lock."""
        return self._held

    def __enter__(self):
        self.take(-1.0)
        return True

    def __exit__(self, *exc):
        self.give()


cdef class RLock(Lock):
    """A reentrant lock with ``threading.RLock``'s interface, taken by the per-call path without a
    Python method call: the thread that holds it may acquire it again, and must release it as
    often."""

    cdef bint take(self, double timeout) except -1:
        cdef long me = PyThread_get_thread_ident()
        if self._count and self._owner == me:
            self._count += 1
            return True
        if not Lock.take(self, timeout):
            return False
        self._owner, self._count = me, 1
        return True

    cdef int give(self) except -1:
        if self._count == 0 or self._owner != PyThread_get_thread_ident():
            raise RuntimeError("cannot release un-acquired lock")
        self._count -= 1
        if self._count == 0:
            self._owner = 0
            Lock.give(self)
        return 0


cdef class CommCore:
    """The base of :class:`pycoll.Communicator`: the fields every operation reads, as C struct members
    (the per-call path below reads them without an attribute lookup), and the communicator's three
    locks. Lock order: ``_lock``, then ``_plock``, then ``_hlock``; never the other way round.
    ``Communicator.__init__`` sets the other fields; everything else about a communicator lives in
    its instance dict."""

    def __cinit__(self, *args, **kwargs):
        self._lock = RLock()  # serialises library calls on the handle (not aborts nor async-error reads)
        self._plock = Lock()  # guards _pending, work states and _failure
        self._hlock = Lock()  # held while the handle is read for an async-error query, and while it is freed
        self._plock._no_self_wait = self._hlock._no_self_wait = True  # only their holder ever releases them

    def group(self):
        """Group the operations issued in the block (``ncclGroupStart``/``ncclGroupEnd``): ``with comm.group():``.

        Operations of several communicators of the same library may be grouped. They are issued
        together when the outermost group closes; blocking ones are then waited for, ``async_op``
        ones return their :class:`Work` at once. Sends and receives to several peers must be
        grouped. Nothing in the block can use a result of the group: waiting for one of its Works raises
        :class:`pycoll.CommStateError`, and so do the calls that need their result at their return
        (``split``, ``shrink``, ``grow``, ``broadcast_bytes``, ``register_window``, ``finalize``, ``destroy``).
        A block that raises (or holds a nested group whose block raised) drops the group: none of its operations
        runs, their Works fail with :class:`pycoll.CommStateError` (see :class:`GroupScope`).

        The group's operations run together, unordered (the collectives of one communicator in their order): an
        operation whose memory meets another one's of the group, where one of them writes it, raises ValueError
        (two collectives of one communicator excepted). The open group belongs to the thread and the context (an asyncio task) that opened it: an
        operation or group of another task on the thread raises :class:`pycoll.CommStateError` (keep a group's
        block free of awaits); nested blocks must end in reverse order. A generator that yields inside the block (a
        ``@contextmanager`` helper does) leaves the group open to what its caller issues meanwhile, as intended for
        such a helper; a block ended in another thread (a suspended generator closed there) raises there, and the
        opening thread's next operation drops the group with a CommStateError.
        """
        cdef GroupScope g = GroupScope.__new__(GroupScope)
        g.comm = self
        return g


cdef class Hook:
    """The base of an observer whose per-operation hooks are compiled (the flight recorder's and the
    watchdog's base classes): every operation calls :meth:`enqueued` and :meth:`completed` through C,
    with no Python call in between. :mod:`pycoll.hooks` keeps such observers apart
    (``compiled_observers``); their Python-level methods (``work_enqueued``, ``work_completed``) stay
    what other callers use."""

    cdef int enqueued(self, Work w) except -1:
        return 0

    cdef int completed(self, Work w) except -1:
        return 0

    @property
    def compiled_hooks(self):
        """True when :mod:`pycoll.hooks` may call this observer's per-operation hooks through C (a subclass
        that overrides one of them in Python says False: its hooks are then called as Python methods)."""
        return True


cdef double _MAX_S = _settings.MAX_SECONDS  # the longest duration (_settings.seconds says so past it)


cdef object _seconds(object value, bint positive):
    """A ``timeout=`` argument as seconds (a float): a finite float or an int in range at once, anything else by
    ``_settings.seconds``, which converts it or says what is wrong (the same result either way)."""
    cdef double v
    tp = type(value)
    if tp is float:
        v = value
        if (v > 0 if positive else v >= 0) and v <= _MAX_S:  # NaN passes neither comparison
            return value
    elif tp is int and (0 < value if positive else 0 <= value) and value <= _MAX_S:  # a float exactly
        return float(value)
    return _settings.seconds(value, "timeout", positive=positive)


@cython.freelist(16)
@cython.trashcan(True)  # a Work holds the next outstanding one (Outstanding): a long chain is freed without recursion
cdef class Work:
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
    ``peer`` (``peers``: all of them, where a one-sided wait waits for several), ``root`` (a broadcast's, reduce's,
    gather's or scatter's root; None for the others), ``timeout`` (seconds), ``time_created_ns``,
    ``inputs``/``outputs`` (the :class:`pycoll.buffers.Buffer` arguments).
    """

    # the fields are declared in _core.pxd (the compiled observer hooks read them)

    def __init__(self, comm, op, seq, p2p_seq, op_id, is_p2p, peer, timeout, stream, inputs, outputs,
                 async_op=False, capture_id=None):
        _setup(self, comm, op, seq, p2p_seq, op_id, is_p2p, peer, timeout, stream,
               inputs if type(inputs) is list else list(inputs), outputs if type(outputs) is list else list(outputs),
               async_op, capture_id)

    @property
    def state(self):
        """``"scheduled"``, ``"started"``, ``"completed"`` or ``"captured"`` (a failed operation stays
        where it stopped)."""
        if not _final(self._state) and self._exc is None:
            self.comm.refresh(self)
        return self._state

    @property
    def last_state(self):
        """The state as last observed, without querying events (what observers read)."""
        return self._state

    @property
    def error(self):
        """The failure recorded for this operation so far, without querying anything."""
        return self._exc

    @property
    def deadline(self):
        """``time.monotonic()`` value after which the operation has timed out."""
        return self.t0 + self.timeout

    def release_arrays(self):
        """Drop the references to the operation's arrays (an abandoned operation need not keep them), and to their
        torch storages where it held them."""
        self.inputs = self.outputs = []
        self._kept = None

    def completes_with(self, Work other not None):
        """Whether ``other`` completes with this operation: both of one group, on one communicator and stream,
        share their events (which of them the group waits for, its completion cannot say)."""
        return self._share is not None and self._share is other._share

    def is_completed(self):
        """True once the operation has finished, successfully or not (see :meth:`exception`). Never blocks. A failed
        one is finished once its communicator's policy has acted (as :meth:`wait` raises then): the communicator's
        state is the policy's. One past its deadline has failed (``CommTimeout``), with or without a watchdog."""
        if _final(self._state):
            return True
        if self._exc is None:
            if (<CommCore>self.comm)._state == "inherited":  # a forked child: the parent's operation is not its own
                self.comm._check_alive()
            self.comm.refresh(self)
            if _final(self._state):
                return True
            if self._exc is None and not self.grouped and _monotonic() - self.t0 > self.timeout:
                self.comm.check()  # past its deadline: failed here too, where no watchdog looks (PYCOLL_WATCHDOG=0)
            if self._exc is None:
                return False
        return _failure_handled(self.comm)

    def exception(self):
        """The failure of this operation (or of its communicator) once it has finished (:meth:`is_completed`),
        else None; for an operation whose torch tensor's memory was freed or replaced while it ran, the
        ``BufferError`` :meth:`wait` raises."""
        if not self.is_completed():
            return None
        if self._exc is None and self._moved is not None:
            return BufferError(self._moved)
        return self._exc

    def wait(self, timeout=None):
        """Block until the operation has completed.

        Raises the operation's failure (:class:`pycoll.CommFailure` subclasses: a timeout detected
        against the operation's own deadline, a remote error, an abort), and a ``BufferError`` where the memory of one
        of its torch tensors was freed (a ``resize_``) or replaced (``set_``, ``.data =``) while it ran. ``timeout``
        (seconds) only bounds this wait: if the operation is still running then, :class:`pycoll.WaitTimeout` (a
        ``TimeoutError``) is raised and the operation and its communicator are left untouched. Poll with
        ``except pycoll.WaitTimeout``, not ``except TimeoutError``: the operation's own timeout, a failure, is a
        ``CommTimeout``, also a ``TimeoutError``, raised again by every later wait.
        Without ``timeout`` the wait ends at the latest when the operation's own deadline
        (``Work.timeout``) makes the communicator fail. An operation of this thread's open group has not
        started (it starts at the group's end): waiting for it there raises :class:`pycoll.CommStateError`.
        """
        cdef double start, now, left, deadline = 0.0
        cdef CommCore comm
        cdef Library lib
        if timeout is not None:
            timeout = _seconds(timeout, False)
        comm = self.comm
        if comm._state == "inherited" and self._exc is None and not _final(self._state):
            comm._check_alive()  # a forked child: the parent's operation, unfinished at the fork, is not its own
        if self._end is None and self._exc is None and not _final(self._state):
            group = _open_works()
            if group is not None and any(w is self for w in <list>group):
                raise CommStateError(
                    f"{self.op} ({_seq_text(self)}) on {comm.name} belongs to this thread's open group: it starts when "
                    "the group ends (at the end of the `with comm.group()` block); wait for it after the group")
        start = _monotonic()
        bounded = timeout is not None
        if bounded:
            deadline = start + timeout
        waited = False
        while True:
            PyErr_CheckSignals()  # compiled: no eval loop runs the signal handlers (Ctrl-C raises here)
            if self._exc is not None:
                comm.await_failure_handled()
                raise self._exc
            if _final(self._state):
                if self._moved is not None:
                    raise BufferError(self._moved)
                return
            dev = comm.device
            lib = _comm_lib(comm)
            _refresh(comm, self, dev, lib)
            if _final(self._state) or self._exc is not None:
                continue
            now = _monotonic()
            if waited:  # the first wait comes first: an operation about to complete needs no check
                comm.check(now)
                if self._exc is not None:
                    continue
            waited = True
            if bounded and now >= deadline:
                raise WaitTimeout(
                    f"{self.op} ({_seq_text(self)}) on {comm.name} still running after {timeout:.3g} s "
                    f"(its own deadline is {self.timeout:.3g} s after it was issued)"
                )
            # block on the end event (the host library waits in C); wake for the own deadline and,
            # at least every _SLICE_S, to look at the communicator's asynchronous error
            left = min(_SLICE_S, max(0.0, self.t0 + self.timeout - now) + 1e-3)
            if bounded:
                left = min(left, deadline - now)
            end = self._end
            if end is None:
                time.sleep(min(left, FIRST_SLEEP_S))  # inside an open group, or just being enqueued
                continue
            try:
                # the host library's wait may run the operation here (the stream's thread had not begun it),
                # no longer than ``left``: no thread handoff
                _wait_event(dev, lib, _comm_driver(comm), end, left)
            except Exception:  # released meanwhile (abort, destroy): the next round sees why
                pass

    @property
    def time_started_ns(self):
        """When it was found started (wall clock, ns), or None."""
        return self._t_started or None

    @time_started_ns.setter
    def time_started_ns(self, ns):
        self._t_started = 0 if ns is None else ns

    @property
    def time_completed_ns(self):
        """When it was found complete (wall clock, ns), or None."""
        return self._t_completed or None

    @time_completed_ns.setter
    def time_completed_ns(self, ns):
        self._t_completed = 0 if ns is None else ns

    @property
    def duration_ms(self):
        """The time between its events (ms; where the events measure time), or None."""
        return self._ms if self._has_ms else None

    @duration_ms.setter
    def duration_ms(self, ms):
        self._has_ms = ms is not None
        self._ms = ms if self._has_ms else 0.0

    def __reduce__(self):
        raise TypeError(f"{self.op} ({_seq_text(self)}): a Work cannot be pickled (sent to another process): it is an "
                        "operation of this process's communicator; wait for it here, send its result")

    def __repr__(self):
        try:
            state = self.state  # as its events say now, not as last looked at
        except Exception:
            state = self._state
        seq = f"p2p_seq={self.p2p_seq}" if self.is_p2p else f"seq={self.seq}"
        return f"<Work {self.op} {seq} {state}{' failed' if self._exc else ''} on {self.comm.name}>"


cdef str _seq_text(Work w):
    """The number the watchdog's and the flight recorder's reports give it: a send's, receive's or one-sided
    operation's is its point-to-point one."""
    return f"p2p seq {w.p2p_seq}" if w.is_p2p else f"seq {w.seq}"


def seq_text(Work w not None):
    """``'seq 3'``, or ``'p2p seq 5'`` for a send, receive or one-sided operation: the number the watchdog's and the
    flight recorder's reports give it."""
    return _seq_text(w)


@cython.final
@cython.no_gc_clear  # the collector leaves the chain to __dealloc__, which unlinks it one Work at a time
cdef class Outstanding:
    """A communicator's outstanding operations, oldest first (``Communicator._pending``, guarded by its ``_plock``).

    A list through the Works themselves: an operation goes in and out with a few pointer writes, where a dict hashed
    it, grew its table and rebuilt it (about 450 instructions an operation). Iterating gives a snapshot: the list may
    change meanwhile. A Work is in one list at most."""

    def __len__(self):
        return self.n

    def __bool__(self):
        return self.n > 0

    def __iter__(self):
        return iter(self.snapshot())

    def __contains__(self, w):
        return isinstance(w, Work) and (<Work>w)._listed == <PyObject*>self

    def __repr__(self):
        return f"<Outstanding {self.n} operations>"

    def snapshot(self):
        """The operations as a list, oldest first."""
        out = []
        w = self.head
        while w is not None:
            out.append(w)
            w = w._next
        return out

    def append(self, Work w not None):
        """Put ``w`` in, the newest; RuntimeError where it is in a list already."""
        self.add(w)

    def pop(self, Work w not None, default=None):
        """Take ``w`` out; None (or ``default`` where it was not in): a dict's ``pop`` of a key whose value is None."""
        return None if self.discard(w) else default

    def clear(self):
        """Take every operation out (one at a time: a long chain is not freed recursively)."""
        cdef Work w = self.head, nxt
        self.head, self.tail, self.n = None, NULL, 0
        while w is not None:
            nxt, w._next = w._next, None
            w._prev = w._listed = NULL
            w = nxt

    def __dealloc__(self):
        self.clear()

    cdef int add(self, Work w) except -1:
        if w._listed != NULL:
            raise RuntimeError(f"{w.op} ({_seq_text(w)}) is outstanding already")
        w._prev, w._listed = self.tail, <PyObject*>self
        if self.tail == NULL:
            self.head = w
        else:
            (<Work>self.tail)._next = w
        self.tail = <PyObject*>w
        self.n += 1
        return 0

    cdef bint discard(self, Work w) noexcept:
        """Take ``w`` out; False where it was not in (the caller holds a reference to it)."""
        if w._listed != <PyObject*>self:
            return False
        cdef Work nxt = w._next
        if nxt is None:
            self.tail = w._prev
        else:
            nxt._prev = w._prev
        if w._prev == NULL:
            self.head = nxt
        else:
            (<Work>w._prev)._next = nxt
        w._next, w._prev, w._listed = None, NULL, NULL
        self.n -= 1
        return True


cdef inline int _setup(Work w, object comm, object op, long long seq, long long p2p_seq, long long op_id, object is_p2p,
                        object peer, object timeout, object stream, list inputs, list outputs, object async_op,
                        object capture_id) except -1:
    """A new Work's fields (``Work.__init__``; the path makes its Works with ``Work.__new__`` and this).
    The fields not set here start as None: the times of start and completion, the event handles
    (``_start``, ``_end``: returned to the communicator's pool at retirement), the failure, the entry."""
    w.comm = comm
    w.op = op
    w.seq = seq
    w.p2p_seq = p2p_seq
    w.async_op = async_op
    w.op_id = op_id
    w.is_p2p = is_p2p
    w.peer = peer
    w.timeout = timeout
    w.stream = stream
    w.inputs = inputs
    w.outputs = outputs
    cdef long long mono = _mono_ns()
    w.time_created_ns = _wall_ns(mono)
    w.t0 = mono * 1e-9
    w._state = _SCHEDULED
    w.capture_id = capture_id  # the graph capture it was recorded into (state "captured")
    w.fr_pos = -1
    return 0


# -- events: straight to the host library's C functions, else the device's methods ----------------

cdef inline Library _host_lib(object dev):
    """The host library behind ``dev`` when it is a HostDevice, else None."""
    if type(dev) is _HostDevice:
        return <Library?>dev.library
    return None


cdef inline Library _comm_lib(CommCore comm):
    """The host library behind ``comm``'s device (None for another device), read once per device."""
    dev = comm.device
    if dev is not comm._dev_seen:
        _see_device(comm, dev)
    return comm._hostlib


cdef int _see_device(CommCore comm, object dev) except -1:
    cdef int handle = -1
    comm._hostlib = _host_lib(dev)
    comm._depth = 0
    if comm._hostlib is not None and comm._hostlib.fn.pycollStreamWaitRoom != NULL:
        comm._depth = _settings.get("PYCOLL_HOST_STREAM_DEPTH")  # what the library read as it was loaded
    comm._timed = bool(dev.events_timed)
    driver = getattr(dev, "driver", None)
    comm._driver = None
    if isinstance(driver, CudaDriver) and (<CudaDriver>driver).device_get(&handle, <int>dev.device_id) == 0:
        comm._driver, comm._cudev = driver, handle
    comm._dev_seen = dev
    return 0


cdef bint _driver_on = True  # gpu_driver_calls()


def gpu_driver_calls(on=None):
    """Whether the operation path calls a CUDA device's driver table (``CudaDevice.driver``) rather than the
    device's methods through the runtime module, where the device has one. ``on``: switch it (for comparisons);
    returns the setting."""
    global _driver_on
    if on is not None:
        _driver_on = bool(on)
    return _driver_on


cdef inline CudaDriver _comm_driver(CommCore comm):
    """``comm``'s CUDA driver table while the calls are on (after :func:`_comm_lib` read the device), else None."""
    return comm._driver if _driver_on else None


cdef enum:
    _CU_NOT_READY = 600  # CUDA_ERROR_NOT_READY
    _CU_STREAM_LEGACY = 1  # CU_STREAM_LEGACY: what the runtime module's calls name stream 0 (CudaDevice)


cdef inline void* _cu_stream(object stream) except? NULL:
    return <void*><uintptr_t>(stream if stream else _CU_STREAM_LEGACY)


cdef object _capture_id(object dev, CudaDriver drv, object stream):
    """``dev.capture_id(stream)``: None at once where the driver says the stream captures nothing."""
    cdef int status = -1
    if drv is not None and drv.stream_is_capturing(_cu_stream(stream), &status) == 0 and status == 0:
        return None
    return dev.capture_id(stream)  # the capture's id, or the error (the driver's call failed: the runtime's says why)


cdef object _swap_current(CommCore comm, object dev, CudaDriver drv):
    """``dev.swap_current()``: None at once where the driver says the calling thread's context is the device's."""
    cdef int current = -1
    if drv is not None and drv.ctx_get_device(&current) == 0 and current == comm._cudev:
        return None
    return dev.swap_current()


cdef extern from *:
    """
    /* The last item of a non-empty list, taken out without giving back the list's spare room (list.pop shrinks
     * the storage of a list that falls below half of it, and the appends that follow grow it again). */
    static inline PyObject* pycoll_list_take_last(PyObject* list) {
        Py_ssize_t n = PyList_GET_SIZE(list) - 1;
        PyObject* item = PyList_GET_ITEM(list, n);
        Py_SET_SIZE(list, n);
        return item;  /* the list's reference, now the caller's */
    }
    """
    object pycoll_list_take_last(list events)


cdef object _new_event(CommCore comm, object dev):
    """An event from the communicator's pool. An empty pool gets four. An operation takes two and gives them
    back at retirement, a group of them as many pairs: the pool's list swings between full and empty and keeps its
    storage meanwhile (no reallocation per operation)."""
    cdef list events = comm._events
    if not events:
        for _ in range(4):
            events.append(dev.create_event())
    ev = pycoll_list_take_last(events)
    if len(events) < comm._pool_low:
        comm._pool_low = len(events)
    return ev


cdef void _record(object dev, Library lib, CudaDriver drv, object event, object stream) except *:
    cdef int r
    if lib is not None and lib.fn.pycollEventRecord != NULL:
        r = lib.fn.pycollEventRecord(<pycollEvent_t><uintptr_t>event, <pycollStream_t><uintptr_t>stream)
        if r == 0:
            return
    elif drv is not None and drv.event_record(<void*><uintptr_t>event, _cu_stream(stream)) == 0:
        return
    dev.record_event(event, stream)  # raises the error (or records it after all)


cdef bint _query(object dev, Library lib, CudaDriver drv, object event) except *:
    cdef int r
    if lib is not None and lib.fn.pycollEventQuery != NULL:
        r = lib.fn.pycollEventQuery(<pycollEvent_t><uintptr_t>event)
        if r == 0:
            return True
        if r == _IN_PROGRESS:
            return False
    elif drv is not None:
        r = drv.event_query(<void*><uintptr_t>event)
        if r == 0:
            return True
        if r == _CU_NOT_READY:
            return False
    return bool(dev.query_event(event))


cdef double _GPU_SPIN_S = 100e-6  # how long a wait polls a GPU event before it sleeps between polls


cdef void _wait_event(object dev, Library lib, CudaDriver drv, object event, double timeout) except *:
    """Block until ``event`` completes or ``timeout`` seconds pass; the waiting thread may run the work queued before
    it that the stream's thread has not begun (``Device.wait_event(.., run=True)``). With a CUDA driver table the
    event is polled for up to ``_GPU_SPIN_S`` first, GIL released (a short collective is done by then, and the
    device's back-off would first sleep longer than it takes); then the device's wait."""
    cdef int r = -1
    cdef uint64_t ns = <uint64_t>(timeout * 1e9) if timeout > 0 else 0
    cdef long long t0, until
    cdef pycollEvent_t ev
    cdef void* cu_ev
    if lib is not None and lib.fn.pycollEventWaitRun != NULL:
        ev = <pycollEvent_t><uintptr_t>event
        with nogil:
            r = lib.fn.pycollEventWaitRun(ev, ns)
        if r == 0 or r == _IN_PROGRESS:
            return
    elif drv is not None:
        cu_ev = <void*><uintptr_t>event
        t0 = _mono_ns()
        until = t0 + <long long>(min(timeout, _GPU_SPIN_S) * 1e9)
        with nogil:
            r = drv.event_query(cu_ev)
            while r == _CU_NOT_READY and _mono_ns() < until:
                r = drv.event_query(cu_ev)
        if r == 0:
            return
        if r == _CU_NOT_READY:
            timeout -= (_mono_ns() - t0) * 1e-9
            if timeout <= 0:
                return
    dev.wait_event(event, timeout, True)  # raises the error (or waits after all)


cdef object _elapsed_ms(object dev, Library lib, object start, object end):
    cdef float ms = 0
    if lib is not None and lib.fn.pycollEventElapsedTime != NULL:
        if lib.fn.pycollEventElapsedTime(&ms, <pycollEvent_t><uintptr_t>start, <pycollEvent_t><uintptr_t>end) == 0:
            return ms
    return dev.elapsed_ms(start, end)


cdef int _async_code(CommCore comm, Library lib) except? -1:
    """The communicator's asynchronous result; the handle is held against being freed meanwhile."""
    cdef ncclResult_t state = <ncclResult_t>0
    cdef int r
    comm._hlock.take(-1)
    try:
        h = comm._handle
        if h is None:
            return 0
        if lib is None and isinstance(comm.library, Library):  # a GPU's NCCL: its events are the device's
            lib = comm.library
        if lib is not None and lib.fn.ncclCommGetAsyncError != NULL:
            r = lib.fn.ncclCommGetAsyncError(<ncclComm_t><uintptr_t>h, &state)
            if r == 0:
                return <int>state
        return comm.library.comm_get_async_error(h)
    finally:
        comm._hlock.give()


cdef bint _clean(CommCore comm, Library lib, object start, object end) except -1:
    """Whether the operation between ``start`` and ``end`` (its events, found complete) completed without failing
    although the communicator has an asynchronous error: the host library tells (NCCL does not: False; an event
    completes after a failed kernel too); its results stand. The handle is held against being freed meanwhile."""
    cdef int clean = 0
    if lib is None or lib.fn.pycollCommEventsClean == NULL:
        return False
    comm._hlock.take(-1)
    try:
        h = comm._handle
        return h is not None and lib.fn.pycollCommEventsClean(
            <ncclComm_t><uintptr_t>h, <pycollEvent_t><uintptr_t>start, <pycollEvent_t><uintptr_t>end, &clean) == 0 \
            and clean != 0
    finally:
        comm._hlock.give()


cdef int _retire_clean(CommCore comm, object dev, Library lib) except -1:
    """The communicator has an asynchronous error: its outstanding operations that completed without failing (the
    host library tells; NCCL cannot: nothing here) retire as completed, before the failure fails the others -- an
    operation nobody had waited for yet is not failed with a later one's error."""
    if lib is None or lib.fn.pycollCommEventsClean == NULL:
        return 0
    for w in comm._pending.snapshot():
        _refresh(comm, <Work>w, dev, lib, True)
    return 0


def retire_clean(CommCore comm):
    """:func:`_retire_clean`, for ``Communicator._fail_at_error`` before it fails the communicator with the error (the
    watchdog's check, a refresh or wait that found it, a call the library refused for it)."""
    _retire_clean(comm, comm.device, _comm_lib(comm))


# -- the path of one operation -----------------------------------------------------------------------

cdef void _run_hooks(tuple calls, Work w) except *:
    """Call the observers' Python hooks on ``w``; an error is logged (a compiled path has no frame of its own,
    so the recorder's stack starts at the caller's)."""
    leave = None
    for hook in calls:
        try:
            hook(w)
        except Exception:  # an observer must never break a collective
            _log.exception("observer hook %r failed", hook)
        except BaseException as e:  # SystemExit, KeyboardInterrupt: in the main thread only, after the others
            leave = leave or hooks.held_exit(e, f"observer hook {hook!r}")
    if leave is not None:
        raise leave


# pycoll.hooks' tuples of observers and hooks, copied here whenever they change (a module attribute costs a
# lookup in the module's dict on every operation)
cdef tuple _compiled_observers = (), _enqueue_hooks = (), _completion_hooks = ()


def _observers_changed():
    global _compiled_observers, _enqueue_hooks, _completion_hooks
    # _notify calls the compiled observers through C without a type test per operation: an observer that says it
    # has compiled hooks but is no Hook is called through its Python methods instead
    compiled = tuple(o for o in hooks.compiled_observers if isinstance(o, Hook))
    others = [o for o in hooks.compiled_observers if not isinstance(o, Hook)]
    _compiled_observers = compiled
    _enqueue_hooks = tuple(hooks.enqueue_hooks) + tuple(o.work_enqueued for o in others)
    _completion_hooks = tuple(hooks.completion_hooks) + tuple(o.work_completed for o in others)


hooks.on_change(_observers_changed)


cdef void _notify(Work w, bint completed) except *:
    """Every observer hears of ``w`` (before its library call; ``completed``: once it completed): the compiled
    ones through C, then the others."""
    cdef tuple observers = _compiled_observers
    cdef Py_ssize_t i
    cdef Hook o
    for i in range(len(observers)):
        o = <Hook>observers[i]  # Hooks only (_observers_changed)
        try:
            if completed:
                o.completed(w)
            else:
                o.enqueued(w)
        except Exception:  # an observer must never break a collective
            _log.exception("observer %r failed in %s", o, "work_completed" if completed else "work_enqueued")
    calls = _completion_hooks if completed else _enqueue_hooks
    if calls:
        _run_hooks(calls, w)


def launch(CommCore comm, op, call, stream, inputs, outputs, async_op, timeout, peer=None, peers=None):
    """Enqueue one operation: the same path on every backend (``Communicator._launch``).

    Its start event is recorded, the Work becomes outstanding (the watchdog watches it from
    here on, also while an idle host stream runs it in this thread), the library call enqueues
    it, and its end event is recorded after it (at ``ncclGroupEnd`` inside a group). On a
    stream that is capturing a graph the operation is only recorded into the graph.
    ``call(handle, stream)`` makes the library call (:func:`library_call` makes one that calls
    the C function directly). ``peers``: every peer of a point-to-point or one-sided operation that waits for
    several (``peer`` is the first, as the flight recorder keeps it); the liveness checks watch them all.
    """
    return _launch(comm, op, call, stream, inputs if type(inputs) is list else list(inputs),
                   outputs if type(outputs) is list else list(outputs), async_op, timeout, peer, peers)


cdef inline bint _rooted(int kind) noexcept:
    return kind == _BROADCAST or kind == _REDUCE or kind == _GATHER or kind == _SCATTER


cdef object _launch(CommCore comm, object op, object call, object stream, list inputs, list outputs, bint async_op,
                    object timeout, object peer, object peers=None):
    cdef Work w
    cdef int status = 0
    timeout = comm.timeout if timeout is None else _seconds(timeout, True)
    dev = comm.device
    cdef Library lib = _comm_lib(comm)
    cdef CudaDriver drv = _comm_driver(comm)
    capture = None if lib is not None else _capture_id(dev, drv, stream)
    cdef unsigned long me = PyThread_get_thread_ident()
    if comm._owner != me:  # refused (another thread has it, until hand_off) before it takes a number: the peers'
        comm._take_over(me, op)  # reports and the flight recorder count only what ran
    root = (<_Call>call).root if type(call) is _Call and _rooted((<_Call>call).kind) else None
    written = outputs if root is None else _written(op, root, comm._rank, inputs, outputs)
    if pycoll_group_works != NULL:
        _group_check(comm, op, inputs, written, peer is not None)
        if pycoll_group_first != NULL and (<Work>pycoll_group_first).capture_id is not capture:  # None: both
            _group_capture_check(op, capture, stream, <Work>pycoll_group_first)
    for b in written:  # a torch tensor that requires grad: autograd is told, now that nothing refused the call
        if (<tuple>b)[10] is _TORCH_SOURCE and (<tuple>b)[9].requires_grad:
            _written_in_place((<tuple>b)[9])
    if peer is None:
        comm._coll_seq += 1
    else:
        comm._p2p_seq += 1
    comm._last_op_id += 1
    w = Work.__new__(Work)
    _setup(w, comm, op, comm._coll_seq, comm._p2p_seq, comm._last_op_id, peer is not None, peer, timeout, stream,
           inputs, outputs, async_op, capture)
    if type(call) is _Call and _rooted((<_Call>call).kind):  # the flight recorder keeps it: a root mismatch is seen
        w.root = (<_Call>call).root                         # in the entries, also where no rank's library found it
    if peers is not None:
        w.peers = peers
    if async_op or pycoll_group_works != NULL:  # it may run after this call returns (a group's, at its end)
        w._kept = _torch_storages(inputs, outputs, written)
    _stage(_ST_WORK)
    try:
        _notify(w, False)
    except KeyboardInterrupt:  # in an observer's hook: the operation has its number, the peers may wait for it
        comm._interrupted(w, f"{op} ({_seq_text(w)})")
        raise
    _stage(_ST_ENQUEUED)
    h = comm._handle
    if h is None:  # another thread aborted or destroyed it since this operation's state check
        comm._check_usable(op)
        raise CommStateError(f"{op}: communicator {comm.name!r} has no handle (state {comm._state})")
    group = _open_works()
    cdef unsigned long user = comm._user
    comm._user = me
    try:
        if capture is not None:
            comm._captured(w, call, h, stream, group)
            if group is not None and pycoll_group_first == NULL:  # joined it (a captured one in no list)
                _group_first(w)
            return w
        if comm._depth and group is None and stream and comm._pending.n >= comm._depth:
            _wait_room(comm, w, lib, stream)  # its stream may be full: wait here, not in the library call
        previous = _swap_current(comm, dev, drv) if comm._guard_device else None
        try:
            comm._lock.take(-1)
            try:
                if not (group and _joined(<list>group, w, comm, stream)):
                    try:
                        w._start = ev = _new_event(comm, dev)
                        _record(dev, lib, drv, ev, stream)
                    except Exception as e:  # refused before anything was enqueued (a stream of another device): its
                        w._exc = e          # entry says so, not "completed" (it is in no outstanding list)
                        comm._withdraw(w)
                        raise
                comm._plock.take(-1)
                comm._pending.add(w)
                comm._plock.give()
            finally:
                comm._lock.give()
            _stage(_ST_START)
            try:
                if type(call) is _Call:
                    status = (<_Call>call).invoke(h, stream)
                else:
                    status = _IN_PROGRESS if call(h, stream) == _IN_PROGRESS else 0
            except NCCLError as e:
                comm._withdraw(w)
                comm.handle_call_error(e, w)
            except Exception:  # refused before the library ran (a function it lacks, a bad argument)
                comm._withdraw(w)
                raise
            if status == _IN_PROGRESS:
                comm.await_ready(w)  # nothing is on the stream until the communicator is ready
            _stage(_ST_CALL)
            if group is None:
                _group_closed(comm, w, dev, lib)
                _stage(_ST_END)
        finally:
            if previous is not None:
                dev.restore_current(previous)
        if group is not None:
            w.grouped = True  # issued at the group's end (GroupScope.__exit__): no deadline nor start before
            group.append(w)
            if pycoll_group_first == NULL:
                _group_first(w)
        elif not async_op:
            _complete(comm, w, dev, lib)
        return w
    except KeyboardInterrupt:
        comm._interrupted(w, f"{op} ({_seq_text(w)})")  # fail the communicator; its policy has acted on return
        raise
    except Exception as e:
        if not isinstance(e, CommFailure):  # not the failure itself: another thread's abort freed what this used
            _raise_if_closed(comm)
        raise
    finally:
        comm._user = user  # 0, or this thread's own (a nested launch)


cdef int _wait_room(CommCore comm, Work w, Library lib, object stream) except -1:
    """Wait until the host stream ``stream`` has room for ``w`` (fewer than ``PYCOLL_HOST_STREAM_DEPTH`` operations
    queued and not begun), as a GPU launch waits on a full queue, but in slices of ``_SLICE_S``, as a Work's wait:
    in between, the signals' handlers run (Ctrl-C raises), the oldest outstanding operations are retired, the
    oldest one's deadline is looked at (past it, :meth:`Communicator.check` records the timeout and its policy acts,
    ``"report"`` too) and the communicator's failure, abort or revoke is raised. Only where the communicator has at
    least that many operations outstanding (its stream cannot be full otherwise): one comparison per operation."""
    cdef pycollStream_t s = <pycollStream_t><uintptr_t>stream
    cdef uint64_t ns = <uint64_t>(_SLICE_S * 1e9)
    cdef int r
    cdef char text[1024]
    cdef ncclComm_t c
    while True:
        with nogil:
            r = lib.fn.pycollStreamWaitRoom(s, ns)
        if r == 0:  # room -- or the stream going, as an abort or a destroy from another thread frees it: raised below
            if comm._failure is None and comm._state == "active":
                return 0
        elif r != _IN_PROGRESS:  # refused (failpoint host.stream.full): raised as the library call's error would be
            text[0] = 0
            c = <ncclComm_t><uintptr_t>(comm._handle or 0)
            _last_error(lib, c, text, sizeof(text))
            comm.handle_call_error(_library_error(lib, r, "pycollStreamWaitRoom", text), w)
        PyErr_CheckSignals()
        if comm._failure is None and comm._state == "active":
            _retire_completed(comm)
            oldest = comm._pending.head
            if oldest is not None and _monotonic() - (<Work>oldest).t0 > (<Work>oldest).timeout:
                comm.check(_monotonic())
        if comm._failure is not None:
            comm.await_failure_handled()
            raise comm._failure
        if comm._state != "active":
            comm._check_usable(w.op)


cdef int _complete(CommCore comm, Work w, object dev, Library lib) except -1:
    """A blocking operation, issued: an idle host stream ran it in this thread (usually complete now),
    else wait for it."""
    _refresh(comm, w, dev, lib)
    if not (w._state is _COMPLETED and w._exc is None):
        w.wait()
    elif w._moved is not None:  # a group's: its torch tensor's memory changed before the group ended
        raise BufferError(w._moved)
    return 0


cdef _group_closed(CommCore comm, Work w, object dev, Library lib):
    if _is_state(w._state, _CAPTURED, "captured"):
        return
    cdef _Shared s = w._share
    comm._lock.take(-1)
    try:
        if comm._handle is not None and w._exc is None and w._start is not None:
            if s is not None and s.end is not None:
                w._end = s.end  # recorded for the operation before it, right after the same ncclGroupEnd
            else:
                # recorded before it is set: a pooled event still holds its last use's completed record, and
                # another thread's refresh of ``w`` (the watchdog's) that read it meanwhile found ``w`` complete,
                # retired it and let its arrays go before it ran (a record that runs Python code -- a device's
                # Python path, the emulated GPU's driver -- lets other threads run in between)
                end = _new_event(comm, dev)
                try:
                    _record(dev, lib, _comm_driver(comm), end, w.stream)
                except BaseException:
                    comm._events.append(end)  # not recorded: back to the pool, as the operation's own are
                    raise
                w._end = end
                if s is not None:
                    s.end = end
    finally:
        comm._lock.give()


@cython.freelist(8)
cdef class _Shared:
    """The events of consecutive operations of one group on one communicator and stream, recorded once.

    Nothing of a group reaches its streams before ``ncclGroupEnd``: every start event recorded inside it marks the
    same point of its stream, and every end event recorded right after it the same later point (on a GPU too: the
    kernels are launched at the group's end). So the first operation of such a run records the start event and the
    first one closed records the end event; the others take them (a group of four all_reduce records two events,
    not eight), and the first found complete tells the others (one query of the events and of the asynchronous
    error for them all). ``users``: the operations holding them; the last to give them back returns them to the pool
    (:func:`_events_back`)."""
    # the fields (_core.pxd): ``start``, ``end``; ``users``; ``done``: the end event found complete (and no
    # asynchronous error then), the others need not ask again; ``timed``, ``ms``: as _refresh's (``timed`` 0
    # where ``ms`` holds the host library's elapsed time of the two events)


cdef int _joined(list group, Work w, CommCore comm, object stream) except -1:
    """In an open group (``group``: its operations so far, at least one): ``w``, of ``comm`` on ``stream``, takes the
    start event of the operation enqueued right before it where that one is of the same communicator and stream, has
    its events (none when the library refused it or a graph captured it) and has not been closed. 1 when it did."""
    cdef Work prev = <Work>group[len(group) - 1]
    if prev.comm is not comm or prev._start is None or prev._end is not None or prev.stream != stream:
        return 0
    cdef _Shared s = prev._share
    if s is None:
        s = _Shared.__new__(_Shared)
        s.start = prev._start
        s.users = 1
        prev._share = s
    s.users += 1
    w._share = s
    w._start = s.start
    return 1


cdef inline int _events_back(list pool, Work w) except -1:
    """``w``'s events back to ``pool``: its own, or the ones it shares in a group once the last operation
    sharing them gives them back. ``w`` holds none afterwards."""
    cdef _Shared s = w._share
    if s is None:
        if w._start is not None:
            pool.append(w._start)
        if w._end is not None:
            pool.append(w._end)
    else:
        w._share = None
        s.users -= 1
        if s.users == 0:
            if s.start is not None:
                pool.append(s.start)
            if s.end is not None:
                pool.append(s.end)
            s.start = s.end = None
    w._start = w._end = None
    return 0


def events_back(list pool not None, Work w not None):
    """Give ``w``'s events back to ``pool`` (a list): its own, or the ones it shares with its neighbours in a group
    once none of them holds them any more (``Communicator._withdraw`` and ``_release_device_later``; call with the
    communicator's ``_plock`` held)."""
    _events_back(pool, w)


def refresh(CommCore comm, Work w not None):
    """Update ``w``'s state from its events (and retire it once complete). Never waits for a
    library call in progress; a device error from an event query fails the communicator."""
    if w.comm is not comm:
        raise ValueError(f"{w!r} is an operation of another communicator than {comm.name!r}")
    dev = comm.device
    _refresh(comm, w, dev, _comm_lib(comm))


cdef _refresh(CommCore comm, Work w, object dev, Library lib, bint clean_only=False):
    """``clean_only``: complete ``w`` if it has, nothing else (no state change, no failure: :func:`_retire_clean`)."""
    cdef CudaDriver drv = _comm_driver(comm)
    start, end = w._start, w._end
    if w._state is _COMPLETED or w._exc is not None or start is None or w.grouped:
        return  # a grouped one: its start event may complete before the group's end issues it
    cdef bint done, started
    cdef float ms = 0
    cdef int timed = -1  # the host library's elapsed time of the two events: 0 (both complete, ms set) or why not
    cdef _Shared s = w._share
    cdef int code = 0
    cdef long long now = 0  # one clock read for a start and a completion found together
    if s is not None and s.done and end is not None:
        done = started = True  # an operation sharing its events (its group's neighbour) found them complete
        timed, ms = s.timed, s.ms
    else:
        try:
            if comm._timed and end is not None and lib is not None and lib.fn.pycollEventElapsedTime != NULL:
                timed = lib.fn.pycollEventElapsedTime(&ms, <pycollEvent_t><uintptr_t>start,
                                                      <pycollEvent_t><uintptr_t>end)
            if timed == 0 or timed == _IN_PROGRESS:  # one call says whether the end event completed, and the duration
                done = timed == 0
            else:
                done = end is not None and _query(dev, lib, drv, end)
            started = done or not _is_state(w._state, _SCHEDULED, "scheduled") or _query(dev, lib, drv, start)
        except Exception as exc:  # a destroyed event (released meanwhile) or a sticky device error
            if w._start is start and w._exc is None:
                comm.fail(exc if isinstance(exc, CommFailure) else
                          AsyncCommError(f"communicator {comm.name!r} rank {comm._rank}: querying the events of "
                                         f"{w.op} ({_seq_text(w)}) failed: {exc}", getattr(exc, "code", -1)), w)
            return
        if clean_only and not done:
            return
        if done:
            code = _async_code(comm, lib)  # read before _plock: lock order
            if code != 0 and code != _IN_PROGRESS and _clean(comm, lib, start, end):
                code = 0  # it completed, not failed (the host library tells): its results stand
            if clean_only and code != 0 and code != _IN_PROGRESS:
                return
            if s is not None and (code == 0 or code == _IN_PROGRESS):
                s.timed, s.ms = timed, ms
                s.done = True
    failure = None
    comm._plock.take(-1)
    try:
        if _is_state(w._state, _COMPLETED, "completed") or w._exc is not None or w._start is not start:
            return
        if started and _is_state(w._state, _SCHEDULED, "scheduled"):
            w._state = _STARTED
            w._t_started = now = _wall_ns(_mono_ns())
        if not done:
            return
        if code != 0 and code != _IN_PROGRESS:
            failure = comm._async_exc(code)
        else:
            w._state = _COMPLETED
            w._t_completed = now if now else _wall_ns(_mono_ns())
            if not w._t_started:
                w._t_started = w._t_completed
            w._has_ms = False
            if timed == 0:
                w._ms, w._has_ms = ms, True
            elif comm._timed and end is not None:  # end is set: done
                try:
                    w._ms = _elapsed_ms(dev, lib, start, end)
                    w._has_ms = True
                except Exception:
                    pass
            held_in, held_out = w.inputs, w.outputs
            _retire(comm, w)
    finally:
        comm._plock.give()
    held_in = held_out = None  # the arrays go here, outside the lock
    if failure is not None:
        # the operations before it that completed are not failed with it, and the failure is the oldest outstanding
        # one's (the one the error ended, where the library tells), not that of ``w``, which may merely be waited for
        comm._fail_at_error(failure, w)
    else:
        _stage(_ST_COMPLETE)
        _notify(w, True)
        _stage(_ST_DONE)


cdef enum:
    _EVENTS_KEPT = 64  # the events a communicator's pool keeps whatever happens (two per operation)
    _TRIM_EVERY = 256  # its pool is looked at every this many operations retired

cdef double _trim_after = 1.0  # seconds: events no operation took for that long are surplus (pool_trim_after)


def pool_trim_after(seconds=None):
    """How long the events of a communicator's pool must have stayed unused before they are given back (1 s);
    ``seconds``: change it (tests: 0 gives them back at the next look); returns the setting."""
    global _trim_after
    if seconds is not None:
        _trim_after = _seconds(seconds, False)
    return _trim_after


cdef int _retire(CommCore comm, Work w) except -1:
    """Out of the outstanding list, its events back to the pool, its arrays let go: a caller that holds ``_plock``
    keeps them until it has given it back (the last reference to an array may run its finalizer: user code, which may
    call pycoll)."""
    if w._kept is not None:
        _check_kept(w)
    comm._pending.discard(w)
    cdef list events = comm._events
    _events_back(events, w)
    w.inputs = w.outputs = []
    comm._pool_retired += 1
    if comm._pool_retired >= _TRIM_EVERY:
        _trim_pool(comm, events)
    return 0


cdef int _trim_pool(CommCore comm, list events) except -1:
    """Every ``_TRIM_EVERY`` retirements: destroy the events of ``comm``'s pool that no operation took for
    ``pool_trim_after()`` seconds or more (its fewest events in that time), beyond ``_EVENTS_KEPT``. A burst of
    outstanding operations, whose events all came back to the pool, does not keep that peak for the communicator's
    life; a loop that keeps drawing on the pool (operations issued faster than they complete, groups of many waited
    for together) destroys none and makes none again."""
    comm._pool_retired = 0
    cdef double now = _monotonic()
    cdef Py_ssize_t keep
    if now - comm._pool_since < _trim_after:
        return 0
    keep = _EVENTS_KEPT + len(events) - min(comm._pool_low, len(events))
    if len(events) > keep:
        extra = events[keep:]
        del events[keep:]
        dev = comm.device
        for ev in extra:
            try:
                dev.destroy_event(ev)
            except Exception:  # a device that fails here loses an event's memory, never an operation
                _log.exception("destroying an event of the pool of %r", comm.name)
                break
    comm._pool_low, comm._pool_since = len(events), now
    return 0


def retire(CommCore comm, Work w not None):
    """Forget a completed operation: out of the outstanding list, its events back to the pool."""
    _retire(comm, w)


# -- the arguments of an operation -------------------------------------------------------------------

cdef object _ndarray = np.ndarray
cdef enum:
    _MAX_CODE = 32
    _NP_CACHE = 16
# ncclDataType_t -> its name and item size, as C arrays (the names' references held by _NAME_LIST)
cdef list _NAME_LIST = [_buffers.DATATYPE_NAMES.get(c) for c in range(_MAX_CODE)]
cdef PyObject* _NAMES[_MAX_CODE]
cdef Py_ssize_t _ITEMSIZES[_MAX_CODE]
for _c in range(_MAX_CODE):
    _NAMES[_c] = <PyObject*>_NAME_LIST[_c]
    _ITEMSIZES[_c] = _buffers.DATATYPE_ITEMSIZES.get(_c, 0)
if max(_buffers.DATATYPE_NAMES) >= _MAX_CODE:
    raise ImportError(f"pycoll._core knows ncclDataType_t values below {_MAX_CODE} only")

# numpy dtype objects -> ncclDataType_t (-1: the general path decides), found by identity (a dtype's hash
# is computed from its fields on every call); the cache holds a reference to each dtype it keeps
cdef PyObject* _np_descrs[_NP_CACHE]
cdef int _np_codes[_NP_CACHE]
cdef int _np_cached = 0


cdef int _np_code(object dt) except -2:
    global _np_cached
    cdef int i, code
    for i in range(_np_cached):
        if _np_descrs[i] == <PyObject*>dt:
            return _np_codes[i]
    found = _buffers._NP_TYPES.get(type(dt)) if dt.isnative else None
    code = -1 if found is None else found
    if _np_cached < _NP_CACHE:  # full (16 dtypes seen): the rest are looked up each time
        Py_INCREF(dt)
        _np_descrs[_np_cached], _np_codes[_np_cached] = <PyObject*>dt, code
        _np_cached += 1
    return code
cdef frozenset _HOST_MEMORY = _buffers.BACKEND_DEVICE_TYPES["host"]
cdef dict _BACKEND_MEMORY = _buffers.BACKEND_DEVICE_TYPES
cdef object _CPU = _buffers._CPU
cdef object _Buffer = Buffer

cdef extern from "Python.h":
    Py_ssize_t PY_SSIZE_T_MAX


cdef extern from *:
    """
    /* numpy's array object (PyArrayObject_fields): its public, stable ABI since numpy 1.7 */
    typedef struct { PyObject_HEAD char* data; int nd; Py_ssize_t* dimensions; Py_ssize_t* strides;
                     PyObject* base; PyObject* descr; int flags; } pycoll_np_array;
    """
    ctypedef struct pycoll_np_array:
        char* data
        int nd
        Py_ssize_t* dimensions
        PyObject* descr
        int flags

cdef extern from *:
    """
    /* A Buffer (a NamedTuple: a tuple subclass) made from its 13 fields without the argument tuple
     * that tuple.__new__(Buffer, (...)) builds and drops: allocated as tuple_subtype_new allocates it. */
    static PyObject* pycoll_buffer(PyObject* type, PyObject* ptr, PyObject* nbytes, PyObject* count,
                                   PyObject* datatype, PyObject* dtype_name, PyObject* shape, PyObject* device_type,
                                   PyObject* device_id, PyObject* readonly, PyObject* owner, PyObject* source,
                                   PyObject* sync_stream, PyObject* name) {
        PyObject* items[13] = {ptr, nbytes, count, datatype, dtype_name, shape, device_type, device_id, readonly,
                               owner, source, sync_stream, name};
        PyTypeObject* tp = (PyTypeObject*)type;
        PyObject* b = tp->tp_alloc(tp, 13);
        if (b == NULL) return NULL;
        for (int i = 0; i < 13; i++) {
            Py_INCREF(items[i]);
            PyTuple_SET_ITEM(b, i, items[i]);
        }
        return b;
    }

    /* The tuple of `n` dimensions (a numpy array's shape, without the attribute lookup). The last one made
     * is kept and given again for the same dimensions (a tuple of ints is immutable): a loop over arrays of
     * one shape makes no new object. Called with the GIL held, as all of this module. */
    static PyObject* pycoll_last_shape = NULL;
    static PyObject* pycoll_shape(int n, Py_ssize_t* dims) {
        PyObject* last = pycoll_last_shape;
        if (last != NULL && PyTuple_GET_SIZE(last) == n) {
            int same = 1;
            for (int i = 0; same && i < n; i++) same = PyLong_AsSsize_t(PyTuple_GET_ITEM(last, i)) == dims[i];
            if (same) {
                Py_INCREF(last);
                return last;
            }
        }
        PyObject* shape = PyTuple_New(n);
        for (int i = 0; shape != NULL && i < n; i++) {
            PyObject* d = PyLong_FromSsize_t(dims[i]);
            if (d == NULL) Py_CLEAR(shape);
            else PyTuple_SET_ITEM(shape, i, d);
        }
        if (shape != NULL && n <= 8) {
            Py_INCREF(shape);
            pycoll_last_shape = shape;
            Py_XDECREF(last);
        }
        return shape;
    }
    """
    object pycoll_shape(int n, Py_ssize_t* dims)
    object pycoll_buffer(object type, object ptr, object nbytes, object count, object datatype, object dtype_name,
                         object shape, object device_type, object device_id, object readonly, object owner,
                         object source, object sync_stream, object name)

cdef int _NP_C_CONTIGUOUS = 0x1
cdef int _NP_WRITEABLE = 0x400


cdef object _numpy_buffer(object arr, bint writable, object name):
    """A C-contiguous numpy array (exactly ``numpy.ndarray``) of a native NCCL dtype as a Buffer (the same
    fields as ``buffers.as_buffer``), read from the array object itself; or None: the general path
    decides (and raises what it must)."""
    cdef pycoll_np_array* a = <pycoll_np_array*><PyObject*>arr
    cdef int flags = a.flags
    cdef Py_ssize_t count = 1
    cdef int i
    if not flags & _NP_C_CONTIGUOUS or (writable and not flags & _NP_WRITEABLE):
        return None
    cdef int code = _np_code(<object>a.descr)
    if code == -1:
        return None
    for i in range(a.nd):
        count *= a.dimensions[i]
    return pycoll_buffer(Buffer, <uintptr_t>a.data, count * _ITEMSIZES[code], count, code, <object>_NAMES[code],
                         pycoll_shape(a.nd, a.dimensions), _CPU, 0, not flags & _NP_WRITEABLE, arr, "numpy", None, name)


cdef extern from *:
    """
    /* An attribute of `obj` through its descriptor `d`, found once on the type (no lookup per call); a
     * method descriptor `d` called on `obj` with no arguments. */
    static inline PyObject* pycoll_descr_get(PyObject* d, PyObject* obj) {
        return Py_TYPE(d)->tp_descr_get(d, obj, (PyObject*)Py_TYPE(obj));
    }
    static inline PyObject* pycoll_descr_call(PyObject* d, PyObject* obj) {
        PyObject* args[1] = {obj};
        return PyObject_Vectorcall(d, args, 1, NULL);
    }
    """
    object pycoll_descr_get(object d, object obj)
    object pycoll_descr_call(object d, object obj)

cdef extern from *:
    """
    /* DLPack's C exchange API (dlpack.h 1.2 and later: DLPackExchangeAPI, a capsule named "dlpack_exchange_api" that
     * a tensor type offers as __dlpack_c_exchange_api__): the DLTensor its producer fills for one of its objects,
     * without allocating; the fields are valid while the object lives and is not resized. */
    typedef struct { int32_t device_type; int32_t device_id; } pycoll_dl_device;
    typedef struct { uint8_t code; uint8_t bits; uint16_t lanes; } pycoll_dl_dtype;
    typedef struct { void* data; pycoll_dl_device device; int32_t ndim; pycoll_dl_dtype dtype; int64_t* shape;
                     int64_t* strides; uint64_t byte_offset; } pycoll_dl_tensor;
    typedef int (*pycoll_dl_view_fn)(void* py_object, pycoll_dl_tensor* out);
    typedef struct { uint32_t major; uint32_t minor; } pycoll_dl_api_version;
    typedef struct { pycoll_dl_api_version version; void* prev_api; void* managed_tensor_allocator;
                     void* managed_tensor_from_py_object_no_sync; void* managed_tensor_to_py_object_no_sync;
                     pycoll_dl_view_fn dltensor_from_py_object_no_sync; void* current_work_stream; } pycoll_dl_api;
    _Static_assert(sizeof(Py_ssize_t) == sizeof(int64_t), "a DLTensor's int64_t dimensions are read as Py_ssize_t");
    static int pycoll_dl_view(pycoll_dl_view_fn fn, PyObject* obj, pycoll_dl_tensor* out) { return fn(obj, out); }
    """
    ctypedef struct pycoll_dl_device:
        int device_type
        int device_id
    ctypedef struct pycoll_dl_dtype:
        unsigned char code
        unsigned char bits
        unsigned short lanes
    ctypedef struct pycoll_dl_tensor:
        void* data
        pycoll_dl_device device
        int ndim
        pycoll_dl_dtype dtype
        Py_ssize_t* shape
        Py_ssize_t* strides
        unsigned long long byte_offset
    ctypedef int (*pycoll_dl_view_fn)(void* py_object, pycoll_dl_tensor* out)
    ctypedef struct pycoll_dl_api_version:
        unsigned int major
        unsigned int minor
    ctypedef struct pycoll_dl_api:
        pycoll_dl_api_version version
        pycoll_dl_view_fn dltensor_from_py_object_no_sync
    int pycoll_dl_view(pycoll_dl_view_fn fn, object obj, pycoll_dl_tensor* out)

cdef object _torch_tensor = None  # torch.Tensor, once torch is imported
cdef object _torch_parameter = None  # torch.nn.Parameter: a plain holder of a tensor (no torch function of its own)
cdef dict _TORCH_CODES = None  # torch dtype -> ncclDataType_t
cdef object _torch_strided = None
# torch.Tensor's attributes the description reads, as the descriptors its C base class defines them with: read
# through them, an exact torch.Tensor's attribute costs no lookup in its type's MRO (and nothing else changes)
cdef object _T_DTYPE, _T_LAYOUT, _T_IS_CPU, _T_SHAPE, _T_IS_CONTIGUOUS, _T_IS_NEG, _T_DATA_PTR
# torch's DLPackDLTensorFromPyObjectNoSync (torch 2.10 and later), while the view is on; its capsule
cdef pycoll_dl_view_fn _torch_view = NULL
cdef pycoll_dl_view_fn _torch_view_found = NULL
cdef object _torch_api_capsule = None
cdef object _torch_raw_stream = None  # torch._C._cuda_getCurrentRawStream: a GPU's current stream, one C call
cdef enum:
    _DL_CPU = 1  # kDLCPU
    _DL_CUDA = 2  # kDLCUDA
    _DL_ROCM = 10  # kDLROCM
cdef signed char _DL_CODES[16][9]  # [DLPack type code][bits / 8] -> ncclDataType_t, -1: none (buffers._DLPACK_TYPES)
for _c in range(16):
    for _s in range(9):
        _DL_CODES[_c][_s] = -1
for (_c, _s), _n in _buffers._DLPACK_TYPES.items():
    _DL_CODES[_c][_s // 8] = _n


cdef int _dl_layout(pycoll_dl_tensor* d, Py_ssize_t* count) noexcept:
    """The ncclDataType_t of the DLTensor ``d``, and its element count in ``count``, when it is one lane of a dtype
    NCCL has, C-contiguous (in elements; a dimension of one, and an empty tensor, may have any strides) and of a sane
    shape; else -1: the general path says what is wrong."""
    cdef Py_ssize_t n = 1, expected = 1
    cdef int i, code
    if d.dtype.lanes != 1 or d.dtype.code >= 16 or d.dtype.bits > 64 or d.dtype.bits % 8 != 0:
        return -1
    code = _DL_CODES[d.dtype.code][d.dtype.bits // 8]
    if code < 0 or d.ndim < 0 or d.ndim > 1024 or (d.ndim > 0 and d.shape == NULL):
        return -1
    for i in range(d.ndim):
        if d.shape[i] < 0 or (d.shape[i] > 0 and n > PY_SSIZE_T_MAX // 64 // d.shape[i]):
            return -1  # negative, or a byte count near overflow
        n *= d.shape[i]
    if n != 0 and d.strides != NULL:
        for i in range(d.ndim - 1, -1, -1):
            if d.shape[i] != 1 and d.strides[i] != expected:
                return -1
            expected *= d.shape[i]
    count[0] = n
    return code


cdef int _torch_init(object torch) except -1:
    global _TORCH_CODES, _torch_strided, _T_DTYPE, _T_LAYOUT, _T_IS_CPU, _T_SHAPE, _T_IS_CONTIGUOUS, _T_IS_NEG
    global _T_DATA_PTR, _torch_view, _torch_view_found, _torch_api_capsule, _torch_raw_stream
    cdef pycoll_dl_api* api

    def descriptor(name):
        for klass in torch.Tensor.__mro__:
            if name in klass.__dict__:
                return klass.__dict__[name]
        raise AttributeError(name)

    _T_DTYPE, _T_LAYOUT, _T_IS_CPU, _T_SHAPE = [descriptor(n) for n in ("dtype", "layout", "is_cpu", "shape")]
    _T_IS_CONTIGUOUS, _T_IS_NEG, _T_DATA_PTR = [descriptor(n) for n in ("is_contiguous", "is_neg", "data_ptr")]
    _torch_strided = torch.strided
    _torch_raw_stream = getattr(torch._C, "_cuda_getCurrentRawStream", None)  # what devices.torch_current_stream calls
    _TORCH_CODES = _buffers._TORCH_TYPES if _buffers._TORCH_TYPES is not None else _buffers._torch_table(torch)
    capsule = getattr(torch.Tensor, "__dlpack_c_exchange_api__", None)
    if capsule is not None and PyCapsule_IsValid(capsule, b"dlpack_exchange_api"):
        api = <pycoll_dl_api*>PyCapsule_GetPointer(capsule, b"dlpack_exchange_api")
        if api.version.major == 1 and api.version.minor >= 2:  # the table's layout since DLPack 1.2
            _torch_api_capsule = capsule
            _torch_view = _torch_view_found = api.dltensor_from_py_object_no_sync
    return 0


def torch_dlpack_view(on=None):
    """Whether torch tensors are described through torch's DLPack C exchange API (``__dlpack_c_exchange_api__``,
    torch 2.10 and later: one C call fills the data pointer, dtype, device, shape and strides) in compiled code: a
    CPU tensor rather than through its attributes (seven calls into torch), a GPU tensor (where torch has its raw
    current-stream call) rather than by the general path, which also chooses its stream; the same Buffer and stream.
    ``on``: switch it (it can only be on where torch offers the API; for comparisons); returns the setting."""
    global _torch_view
    torch = sys.modules.get("torch")
    if _TORCH_CODES is None and torch is not None and _buffers._torch_tensor_type(torch) != ():
        _torch_init(torch)
    if on is not None:
        _torch_view = _torch_view_found if on else NULL
    return _torch_view != NULL


cdef object _torch_viewed_buffer(object t, object stream, object name):
    """An exact ``torch.Tensor`` or ``nn.Parameter`` described from the DLTensor torch fills for it (``_torch_view``):
    a Buffer when it is on the CPU or a GPU, dense, C-contiguous, of an NCCL dtype and without torch's negative bit
    (which a DLTensor does not carry); else None: the general path decides (and raises what it must). A GPU
    tensor's Buffer names torch's current stream of its device as the one to wait for when that is not ``stream``
    (None: no wait asked), as ``buffers.as_buffer`` does."""
    cdef pycoll_dl_tensor d
    cdef Py_ssize_t count = 0
    cdef int code
    if pycoll_dl_view(_torch_view, t, &d) != 0:
        PyErr_Clear()  # torch has no DLTensor for it (sparse, meta, quantized, ...): the general path says why
        return None
    cdef int kind = d.device.device_type
    if kind != _DL_CPU and ((kind != _DL_CUDA and kind != _DL_ROCM) or _torch_raw_stream is None):
        return None
    code = _dl_layout(&d, &count)  # C order as torch's is_contiguous() reads it
    if code < 0:
        return None
    if count == 0:  # the DLTensor of an empty tensor need not point where its data_ptr() does
        return _torch_attr_buffer(t, name)
    if pycoll_descr_call(_T_IS_NEG, t) or <uintptr_t>d.data + d.byte_offset == 0:  # (no memory: the general path)
        return None
    cdef int device_id = 0 if kind == _DL_CPU else d.device.device_id
    sync = None
    if kind != _DL_CPU and stream is not None:  # the kernels that wrote t run on torch's current stream of its GPU
        current = _torch_raw_stream(device_id)
        if current != stream and not (current == 0 and stream == 1):
            sync = current
    return pycoll_buffer(Buffer, <uintptr_t>d.data + d.byte_offset, count * _ITEMSIZES[code], count, code,
                         <object>_NAMES[code], pycoll_shape(d.ndim, d.shape), kind, device_id, False, t, "torch", sync,
                         name)


cdef object _torch_buffer(object t, object stream, object name):
    """A dense, C-contiguous torch tensor (exactly ``torch.Tensor`` or ``nn.Parameter``; on a GPU only through the
    DLPack view) of an NCCL dtype as a Buffer (the fields ``buffers.as_buffer`` gives it), or None: the general path
    decides (and raises what it must)."""
    if _TORCH_CODES is None:
        _torch_init(sys.modules["torch"])
    if _torch_view != NULL:
        return _torch_viewed_buffer(t, stream, name)
    return _torch_attr_buffer(t, name)


cdef object _torch_attr_buffer(object t, object name):
    """``_torch_buffer`` of a CPU tensor, read from its attributes."""
    cdef Py_ssize_t count = 1
    code = _TORCH_CODES.get(pycoll_descr_get(_T_DTYPE, t))
    if (code is None or pycoll_descr_get(_T_LAYOUT, t) is not _torch_strided or not pycoll_descr_get(_T_IS_CPU, t)
            or not pycoll_descr_call(_T_IS_CONTIGUOUS, t) or pycoll_descr_call(_T_IS_NEG, t)):
        return None
    try:
        shape = pycoll_descr_get(_T_SHAPE, t)  # a torch.Size: a tuple of ints (the element count is their product)
    except RuntimeError:  # a nested tensor (strided, contiguous) has none
        return None
    for d in <tuple>shape:
        count *= <Py_ssize_t>d
    cdef int c = code
    ptr = pycoll_descr_call(_T_DATA_PTR, t)
    if count and not ptr:  # no memory (a ZeroTensor): the general path says so
        return None
    return pycoll_buffer(Buffer, ptr, count * _ITEMSIZES[c], count, code,
                         <object>_NAMES[c], shape, _CPU, 0, False, t, "torch", None, name)


cdef extern from *:
    """
    /* DLPack's managed tensors, as a producer's capsule holds them ("dltensor": DLManagedTensor, the legacy ABI;
     * "dltensor_versioned": DLManagedTensorVersioned, DLPack 1.0 and later) */
    typedef struct { uint32_t major; uint32_t minor; } pycoll_dlpack_version;
    typedef struct { pycoll_dl_tensor dl_tensor; void* manager_ctx; void (*deleter)(void*); } pycoll_dl_managed;
    typedef struct { pycoll_dlpack_version version; void* manager_ctx; void (*deleter)(void*); uint64_t flags;
                     pycoll_dl_tensor dl_tensor; } pycoll_dl_managed_versioned;
    """
    ctypedef struct pycoll_dlpack_version:
        unsigned int major
    ctypedef struct pycoll_dl_managed:
        pycoll_dl_tensor dl_tensor
    ctypedef struct pycoll_dl_managed_versioned:
        pycoll_dlpack_version version
        unsigned long long flags
        pycoll_dl_tensor dl_tensor

cdef enum:
    _DLPACK_READ_ONLY = 1
    _DLPACK_IS_COPIED = 2


cdef tuple _DLPACK_V1 = (1, 0)


cdef object _dlpack_capsule(object obj, object stream, object name):
    """The capsule a DLPack 1.0 producer's ``__dlpack__`` gives, asked as ``buffers._call_dlpack`` asks it first; its
    error named where it refused; else (its device unknown, a keyword it does not take) that asks it."""
    dev = getattr(obj, "__dlpack_device__", None)
    try:
        arg = _buffers._dlpack_stream_arg(int(dev()[0]) if dev is not None else _DL_CPU, stream)
    except Exception:
        return _buffers._call_dlpack(obj, stream, name)  # says what is wrong
    try:
        return obj.__dlpack__(stream=arg, max_version=_DLPACK_V1, copy=False)
    except TypeError:
        return _buffers._call_dlpack(obj, stream, name, True)  # an older producer, asked its ways
    except Exception as exc:
        raise _buffers._refused(obj, exc, name) from exc


cdef object _dlpack_buffer(object obj, object stream, bint writable, object name):
    """A DLPack producer's array (not a numpy array nor a torch tensor: they have their own paths) read in C from the
    capsule its ``__dlpack__`` gives; what this does not take, the general path reads from the same capsule (and says
    what is wrong)."""
    cdef pycoll_dl_tensor* d
    cdef pycoll_dl_managed_versioned* mv
    cdef bint readonly = False
    cdef Py_ssize_t count = 0
    cdef int code = -1
    if writable:
        _buffers.check_mutable(obj, name)
    capsule = _dlpack_capsule(obj, stream, name)
    if PyCapsule_IsValid(capsule, b"dltensor_versioned"):
        mv = <pycoll_dl_managed_versioned*>PyCapsule_GetPointer(capsule, b"dltensor_versioned")
        readonly = (mv.flags & _DLPACK_READ_ONLY) != 0
        d = &mv.dl_tensor
        if mv.version.major == 1 and not (writable and mv.flags & (_DLPACK_READ_ONLY | _DLPACK_IS_COPIED)):
            code = _dl_layout(d, &count)
    elif PyCapsule_IsValid(capsule, b"dltensor"):
        d = &(<pycoll_dl_managed*>PyCapsule_GetPointer(capsule, b"dltensor")).dl_tensor
        code = _dl_layout(d, &count)
    if code < 0:
        return _buffers._capsule_buffer(obj, capsule, writable, name)
    return pycoll_buffer(Buffer, <uintptr_t>d.data + d.byte_offset, count * _ITEMSIZES[code], count, code,
                         <object>_NAMES[code], pycoll_shape(d.ndim, d.shape), d.device.device_type, d.device.device_id,
                         readonly, capsule, "dlpack", None, name)


cdef dict _FORMAT_CODES = {}  # (struct format, item size) -> ncclDataType_t, as buffers._format_datatype reads them
cdef signed char _FORMAT1_CODE[128]  # the same for a format of one character (the usual case), 0: not known yet
cdef Py_ssize_t _FORMAT1_SIZE[128]  # ... and its item size (a code is known for this size only)

cdef extern from "Python.h":
    PyObject* _PyType_Lookup(PyTypeObject* tp, object name)  # borrowed, NULL when absent, no exception: the type's MRO


cdef int _format_code(const char* fmt, Py_ssize_t itemsize, object name) except -2:
    """``buffers._format_datatype`` of a buffer's format and item size, remembered; -1 where it raises."""
    cdef unsigned char c = <unsigned char>fmt[0]
    cdef bint one = c != 0 and c < 128 and fmt[1] == 0
    if one and _FORMAT1_SIZE[c] == itemsize and _FORMAT1_CODE[c] != 0:
        return _FORMAT1_CODE[c] - 1
    key = (<bytes>fmt, itemsize)
    code = _FORMAT_CODES.get(key)
    if code is None:
        try:
            code = _buffers._format_datatype((<bytes>fmt).decode("ascii"), itemsize, name)
        except (TypeError, ValueError, UnicodeDecodeError):
            return -1
        _FORMAT_CODES[key] = code
    if one:
        _FORMAT1_CODE[c], _FORMAT1_SIZE[c] = <int>code + 1, itemsize
    return code


cdef object _protocol_buffer(object obj, bint writable, object name):
    """An object of the buffer protocol (bytearray, array.array, memoryview, mmap, ctypes arrays...) read in C from a
    memoryview of it (which holds the export: the Buffer's owner); None where the general path must say what is
    wrong."""
    cdef Py_buffer* pb
    try:
        view = PyMemoryView_FromObject(obj)
    except (TypeError, ValueError):  # not a buffer, or one released: the general path says what it takes, or names it
        return None
    pb = PyMemoryView_GET_BUFFER(view)
    if (writable and pb.readonly) or not PyBuffer_IsContiguous(pb, b"C") or pb.itemsize <= 0:
        return None
    cdef int c = _format_code(pb.format if pb.format != NULL else <const char*>"B", pb.itemsize, name)
    if c < 0:
        return None
    return pycoll_buffer(Buffer, <uintptr_t>pb.buf, pb.len, pb.len // pb.itemsize, c, <object>_NAMES[c],
                         pycoll_shape(pb.ndim, pb.shape), _CPU, 0, pb.readonly != 0, view, "buffer", None, name)


cdef dict _TYPESTR_CODES = {}  # __cuda_array_interface__ typestr -> ncclDataType_t, as buffers._typestr_datatype reads it
cdef object _CUDA = _buffers._CUDA
cdef object _MISSING = object()


cdef object _cai_buffer(object obj, object cai, object stream, bint writable, object name):
    """An object of the CUDA array interface (Numba's and CuPy's arrays; ``cai``: its ``__cuda_array_interface__``)
    read in compiled code when that dict is of the usual form (a tuple of int dimensions, an int or None address,
    C-contiguous strides or None, no mask, an int producer stream or None); else None: the general path reads it again
    and says what is wrong."""
    cdef Py_ssize_t count = 1, expected, i
    cdef int code
    if type(cai) is not dict or (<dict>cai).get("mask") is not None:
        return None
    shape, data, typestr = (<dict>cai).get("shape"), (<dict>cai).get("data"), (<dict>cai).get("typestr")
    if type(shape) is not tuple or type(data) is not tuple or len(<tuple>data) != 2 or type(typestr) is not str:
        return None
    ptr, readonly = data
    c = _TYPESTR_CODES.get(typestr)
    if c is None:
        try:
            c = _TYPESTR_CODES[typestr] = _buffers._typestr_datatype(typestr, name)
        except (TypeError, ValueError):
            return None
    code = c
    for n in <tuple>shape:
        if type(n) is not int or n < 0 or (n > 0 and count > PY_SSIZE_T_MAX // 64 // n):
            return None
        count *= <Py_ssize_t>n
    strides = (<dict>cai).get("strides")
    if strides is not None and count:
        if type(strides) is not tuple or len(<tuple>strides) != len(<tuple>shape):
            return None
        expected = _ITEMSIZES[code]
        for i in range(len(<tuple>shape) - 1, -1, -1):
            s, n = (<tuple>strides)[i], (<tuple>shape)[i]
            if type(s) is not int or (n != 1 and s != expected):
                return None
            expected *= <Py_ssize_t>n
    if (ptr is not None and type(ptr) is not int) or (writable and readonly):
        return None
    producer = (<dict>cai).get("stream")
    if producer is not None:
        if type(producer) is not int or producer == 0:
            return None
        if stream is not None and (producer == stream or (producer == 1 and stream == 0)):
            producer = None  # already the consumer's stream
    return pycoll_buffer(Buffer, ptr or 0, count * _ITEMSIZES[code], count, code, <object>_NAMES[code], shape, _CUDA,
                         -1, bool(readonly), obj, "cai", producer, name)


cdef object _torch_storages(list inputs, list outputs, list written):
    """The torch tensors of an asynchronous operation (or one in a group, which runs at the group's end), as
    ``[(Buffer, storage, written, the tensor's data pointer)]`` (None: none): the Work holds their storages until it
    retires. The tensor itself is held anyway (its Buffer's owner), its memory is not: a ``set_`` or an assignment to
    ``.data`` while the operation runs would free it under the operation (a crash, or a write into memory reused
    meanwhile); held, the operation uses the memory it was given, as NCCL's semantics are. A resize (of the tensor
    or its storage) frees it all the same: :func:`_check_kept` finds that."""
    kept = None
    for b in inputs:
        if (<tuple>b)[10] is _TORCH_SOURCE and (<tuple>b)[1]:
            kept = _keep(kept, b, written)
    if outputs is not inputs:
        for b in outputs:
            if (<tuple>b)[10] is _TORCH_SOURCE and (<tuple>b)[1]:
                kept = _keep(kept, b, written)
    return kept


cdef list _keep(list kept, object b, list written):
    """``kept`` (a new list where None) with torch Buffer ``b``'s entry (:func:`_torch_storages`) added."""
    if kept is None:
        kept = []
        if _TORCH_CODES is None:  # described by the general path (the process's first tensor)
            _torch_init(sys.modules["torch"])
    t = (<tuple>b)[9]  # the tensor: an in-place form's block of it starts further on (_rank_block)
    kept.append((b, t.untyped_storage(), any(x is b for x in written), _data_ptr(t)))
    return kept


cdef object _data_ptr(object t):
    """A torch tensor's data pointer, read by torch's own method: a subclass's ``__torch_function__`` (user code)
    does not run (the caller may hold ``_plock``)."""
    if type(t) is _torch_tensor or type(t) is _torch_parameter:
        return pycoll_descr_call(_T_DATA_PTR, t)
    with sys.modules["torch"]._C.DisableTorchFunctionSubclass():
        return pycoll_descr_call(_T_DATA_PTR, t)


cdef int _check_kept(Work w) except -1:
    """At ``w``'s retirement: whether the memory of each of its torch tensors (:func:`_torch_storages`) stayed theirs
    while it ran; what did not becomes ``w._moved``, which :meth:`Work.wait` raises (a ``BufferError``). Reads the
    storages and the tensors' data pointers by torch's C methods: no user code runs (a caller may hold ``_plock``)."""
    kept, w._kept = w._kept, None
    found = None
    try:
        for b, st, writes, issued in <list>kept:
            ptr, nbytes, t = (<tuple>b)[0], (<tuple>b)[1], (<tuple>b)[9]
            base = st.data_ptr()
            what = "wrote into" if writes else "read"
            if not base <= ptr or ptr + nbytes > base + st.nbytes():
                found = (f"the memory of its {(<tuple>b)[12]} (a torch tensor) was freed while the operation ran (a "
                         f"resize_ or share_memory_ of the tensor or of its storage): the operation {what} freed "
                         "memory, and this process's memory may be corrupted")
                break
            if _data_ptr(t) != issued:
                found = (f"its {(<tuple>b)[12]} (a torch tensor) was given other memory while the operation ran "
                         f"(set_, or an assignment to .data): the operation {what} the memory the tensor had when it "
                         "was issued (kept alive until it completed), not its new memory")
    except Exception:  # a storage torch cannot read any more: nothing to say
        return 0
    if found is not None:
        w._moved = (f"{w.op} ({_seq_text(w)}) on {w.comm.name}: {found}; leave an operation's tensors as they are "
                    "until it has completed (wait(), or the end of its group)")
    return 0


cdef object _describe(CommCore comm, object obj, object stream, bint writable, object name):
    global _torch_tensor, _torch_parameter
    cdef bint tensor_or_importing = False  # a torch tensor of a subclass, or torch half imported: the general path
    tp = type(obj)
    if tp is _ndarray:
        b = _numpy_buffer(obj, writable, name)
    elif tp is _torch_tensor or tp is _torch_parameter:
        b = _torch_buffer(obj, stream, name)
    else:
        b = None
        if _torch_tensor is None:  # torch's modules are looked up until it is imported (then once only)
            torch = sys.modules.get("torch")
            if torch is not None:
                if _buffers._torch_tensor_type(torch) != ():  # (): importing
                    _torch_tensor = torch.Tensor
                    _torch_parameter = getattr(getattr(torch, "nn", None), "Parameter", None)
                else:
                    tensor_or_importing = True
        if _torch_tensor is not None and isinstance(obj, _torch_tensor):
            tensor_or_importing = True
        # as as_buffer tries them: arrays and tensors of subclasses and Buffers (by the general path), then DLPack, the
        # CUDA array interface, the buffer protocol
        if tp is not _Buffer and not isinstance(obj, _ndarray) and not tensor_or_importing:
            # hasattr(tp, ...) without the AttributeError made when not
            if _PyType_Lookup(<PyTypeObject*>tp, "__dlpack__") != NULL:
                b = _dlpack_buffer(obj, stream, writable, name)
            else:
                cai = getattr(obj, "__cuda_array_interface__", _MISSING)  # a property may make its dict: read once
                if cai is _MISSING:
                    b = _protocol_buffer(obj, writable, name)
                else:
                    b = _cai_buffer(obj, cai, stream, writable, name)
    if b is None:
        b = as_buffer(obj, writable=writable, stream=stream, name=name)
    backend = comm.backend
    if backend == "host":
        if (<tuple>b)[6] is not _CPU and (<tuple>b)[6] not in _HOST_MEMORY:  # numpy's and torch's CPU: no hashing
            check_device(b, backend, None)
    else:  # check_device's test, made here; it runs where that may raise (and says why)
        device_id = comm.device.device_id
        allowed = _BACKEND_MEMORY.get(backend)
        bid = (<tuple>b)[7]
        if allowed is None or (<tuple>b)[6] not in allowed or (device_id is not None and bid >= 0 and bid != device_id):
            check_device(b, backend, device_id)
    sync = (<tuple>b)[11]
    if sync is not None:
        comm.device.wait_stream(stream, sync)
    return b


cdef object _increment_version = None
cdef object _TORCH_SOURCE = "torch"  # a Buffer's source for a torch tensor (an interned str: compared by identity)


cdef int _written_in_place(object tensor) except -1:
    """Tell autograd that the operation writes ``tensor`` (one that requires grad) in place, as torch's own in-place
    operations do: a backward that saved it then raises (\"modified by an inplace operation\") instead of computing
    wrong gradients silently. (A tensor that does not require grad is not told: its check would cost every call.)"""
    global _increment_version
    if _increment_version is None:
        from torch.autograd.graph import increment_version
        _increment_version = increment_version
    _increment_version(tensor)
    return 0


def buf(CommCore comm, obj, stream, *, writable, name):
    """``obj`` described as a :class:`pycoll.buffers.Buffer` for an operation on ``stream`` of ``comm``:
    on the communicator's device, and ordered after the producer stream it names
    (``Communicator._buf``)."""
    return _describe(comm, obj, stream, writable, name)


cdef object _own_stream(CommCore comm, bint blocking):
    """The communicator's own stream (created on first use).

    An idle host stream may run a blocking operation in the caller's thread -- the same stream order
    and events, without a thread switch -- but never an asynchronous one (its call must return at
    once: the host library gives a small one only a pass that does not wait, ``PYCOLL_HOST_EAGER``); a wait
    for an asynchronous one may run it (when the stream's thread has not begun it). The
    host library hands an operation that a caller's thread has run for ``PYCOLL_HOST_INLINE_NS``
    (10 ms) back to the stream, so the caller's wait keeps its deadline under every policy; that wait
    takes it up again (the stream's thread what nobody comes back for: ``PYCOLL_HOST_DEFER_NS``). Inside
    a group nothing reaches the stream before the group ends: :class:`GroupScope` decides for the
    whole group then. An operation that may find ``PYCOLL_HOST_STREAM_DEPTH`` operations queued on it and not
    begun waits for room first (:func:`_wait_room`: in slices, with the deadlines, the failure and the signals
    looked at in between); a group's end waits in its library call, until one is taken, the communicator fails, is
    aborted or revoked (the call raises that), or a signal comes.
    """
    s = comm._stream
    if s is None:
        s = _new_own_stream(comm)
    if pycoll_group_works == NULL:
        _stream_mode(comm, s, blocking)
    return s


cdef object _new_own_stream(CommCore comm):
    """The own stream, made now: not once another thread's abort or destroy has begun (it takes the stream under the
    same lock, after the state changed), which would leave this one behind."""
    comm._plock.take(-1)
    try:
        if comm._state != "active":
            comm._check_usable("an operation")
        s = comm._stream
        if s is None:
            s = comm._stream = comm.device.create_stream()
        return s
    finally:
        comm._plock.give()


cdef int _raise_if_closed(CommCore comm) except -1:
    """Another thread aborted or destroyed ``comm`` while this one was in an operation of it (an abort may come from
    any thread at any time): what then failed here is that, raised as it is for an operation issued after it."""
    if comm._state == "aborted" or comm._state == "destroyed":
        comm._check_alive()
    return 0


cdef int _stream_mode(CommCore comm, object s, bint inline) except -1:
    cdef int mode = 1 if inline else 0
    if comm._stream_mode != mode:
        comm.device.allow_inline(s, inline, True)
        comm._stream_mode = mode
    return 0


cdef enum:
    _RETIRE_EVERY = 8  # an issuing thread retires the oldest completed operations at every 8th operation it issues


cdef int _retire_completed(CommCore comm) except -1:
    """Refresh the oldest outstanding operations while they turn out complete (retired: out of the outstanding list,
    their events back to the pool, their arrays released, the observers told): completed operations nobody waits
    for (issued with ``async_op=True`` and dropped, or waited for only later) do not pile up between the watchdog's
    rounds, nor for good without a watchdog. Each is refreshed once in all (the work the watchdog's round would do);
    the first incomplete one stops it (one refresh, never a wait); a failure a refresh finds is recorded (and raised
    by the state check after it)."""
    cdef Outstanding pending = comm._pending
    cdef Library lib = _comm_lib(comm)
    cdef Work w
    dev = comm.device
    while pending.head is not None:  # oldest first
        w = pending.head  # a reference of our own: the refresh may let other threads run
        _refresh(comm, w, dev, lib)
        if w._listed == <PyObject*>pending or comm._failure is not None:  # not retired: incomplete, failed, or
            return 0                                                      # left to its owner
    return 0


cdef object _begin(CommCore comm, object what, object stream, object async_op, object a, object b):
    """The state checked and the stream resolved for an operation on arrays ``a`` and ``b`` (None: absent);
    the compiled operations' form of :func:`begin`, which makes no tuple on the host's path. At every 8th operation,
    where operations are outstanding, the oldest completed ones are retired first (``_retire_completed``: a look at
    an incomplete one costs its event queries, once per 8 operations); a failure found there is raised here."""
    if async_op is not False and async_op is not True:  # "no" was true
        _settings.flag(async_op, "async_op")
    if comm._state != "active" or comm._failure is not None:
        comm._check_usable(what)
    if comm._last_op_id % _RETIRE_EVERY == 0 and comm._pending.n:
        _retire_completed(comm)
        if comm._failure is not None:
            comm._check_usable(what)
    if stream is None and not comm._guard_device:  # the host: no framework streams, the own stream
        try:
            return _own_stream(comm, not async_op)
        except Exception as e:
            if not isinstance(e, CommFailure):  # another thread's abort freed the stream
                _raise_if_closed(comm)
            raise
    if stream is None and _torch_view != NULL and _torch_raw_stream is not None:
        tp = type(a)
        if (tp is _torch_tensor or tp is _torch_parameter) and (b is None or type(b) is _torch_tensor
                                                                or type(b) is _torch_parameter):
            d = a.get_device()  # -1 on the CPU
            if d >= 0:  # torch's current stream of a GPU tensor's device (Device.resolve_stream's choice)
                return _torch_raw_stream(d)
    return comm.device.resolve_stream(stream, [x for x in (a, b) if x is not None],
                                      default=_own_stream(comm, not async_op))


cdef int _prepare_group_end(list works) except -1:
    """Before the ``ncclGroupEnd`` of an outermost group: when all its operations are blocking, of one
    communicator and on its own stream, that idle host stream may run them in this thread, as it runs a
    blocking operation outside a group; else the own streams of the group's communicators may not."""
    cdef Work w
    cdef CommCore c, first = (<Work>works[0]).comm
    cdef bint inline = not first._guard_device
    for w in works:
        c = w.comm
        if w.async_op or c is not first or c._stream is None or w.stream != c._stream:
            inline = False
    for w in works:
        c = w.comm
        if c._stream is not None and not c._guard_device:
            _stream_mode(c, c._stream, inline)
    return 0


@cython.freelist(4)
cdef class GroupScope:
    """The body of ``with comm.group():`` (what :meth:`CommCore.group` returns), compiled as the operations it holds.

    The outermost group of this thread collects the Works enqueued in it; at its end ``ncclGroupEnd``
    issues them, their completion events are recorded, and the blocking ones are waited for. A group
    the library refuses fails its Works (nothing of it runs) and raises the library's error, unless
    the block itself raised. A group whose block raised (its own or a nested group's, even one it caught) is
    dropped: ``ncclGroupSimulateEnd`` closes it, so none of its operations runs (a peer's matching ones wait for
    them, as for any operation a rank never issued), and its Works fail with a :class:`~pycoll.CommStateError`;
    the block's exception goes on (a note says what was dropped), or where the outermost block ended normally, a
    CommStateError says so. A library without ``ncclGroupSimulateEnd`` (NCCL < 2.22) runs them, as it would.
    """
    cdef CommCore comm
    cdef object lib
    cdef bint outer
    cdef bint entered
    cdef int depth  # how many scopes of this thread's group were open once this one was
    cdef unsigned long long thread  # the thread that entered it (pycoll_thread_id): the group is that thread's

    def __init__(self, CommCore comm):
        self.comm = comm

    def __enter__(self):
        global pycoll_group_raised, pycoll_group_depth
        if self.entered:  # its one record of the open group would be overwritten: every later call in a "group"
            raise CommStateError("this group() is already open: a nested group needs its own comm.group()")
        if _n_orphaned:
            _orphan_check("group()")
        lib = self.comm.library
        self.outer = pycoll_group_works == NULL
        if not self.outer and <object>pycoll_group_lib is not lib:
            raise CommStateError("a group can only hold communicators of one library")
        if not self.outer and not _group_mine():
            raise CommStateError(  # two asyncio tasks' groups on one thread: whichever block ends first ends neither
                "group(): this thread's open group() was opened by another asyncio task (or context); one task's "
                "group may not hold another's. Keep a group's block free of awaits, or issue the operations of "
                "concurrent tasks from threads of their own")
        if self.outer:
            pycoll_group_raised = 0
        if isinstance(lib, Library):  # the C call, as _Call makes the operations' calls
            (<Library>lib)._group_start()
        else:
            lib.group_start()
        self.lib = lib
        if self.outer:
            _set_group([], lib)  # depth 1
        else:
            pycoll_group_depth += 1
        self.depth = pycoll_group_depth
        self.thread = pycoll_thread_id()
        self.entered = True
        return None

    def __exit__(self, typ, value, tb):
        cdef Work w
        cdef CommCore c
        global pycoll_group_raised, pycoll_group_depth
        cdef bint body_ok = typ is None
        cdef bint nested_raised = False
        cdef bint in_order = self.depth == pycoll_group_depth
        cdef list works = []
        overlap = None  # a whole group's overlap (_group_sweep)
        global _n_orphaned
        if not self.entered:
            raise CommStateError("group() exited without being entered")
        self.entered = False
        if self.thread != pycoll_thread_id():  # the group is the opening thread's: it cannot end it here
            why = (f"its block ended in another thread ({threading.current_thread().name!r}) than the one that "
                   "opened it (a generator suspended inside `with comm.group()`, closed there?)")
            _orphaned[self.thread] = why
            _n_orphaned = len(_orphaned)
            raise CommStateError(f"group(): {why}; the opening thread's next operation drops it, none of its "
                                 "operations runs")
        lib = self.lib
        if pycoll_group_depth > 1:  # an inner scope's end, or one that ends before a later one (out of order)
            pycoll_group_depth -= 1
            if not (body_ok and in_order):
                pycoll_group_raised = 1  # the whole group is dropped where it ends
        else:
            works = _open_works()
            _set_group(None, None)
            _issued(works)
            for w in works:
                if w.comm is not (<Work>works[0]).comm:  # the library ends it as one: reports name the others
                    hooks.note_cross_group(works)
                    break
            nested_raised, pycoll_group_raised = pycoll_group_raised, 0
            if body_ok and len(works) > _GROUP_PAIRWISE:  # checked whole now (its first ones as they joined)
                try:
                    _group_sweep(works)
                except ValueError as e:
                    overlap = e
            if works and (nested_raised or not body_ok or overlap is not None) and \
                    _drop_group(lib, works, value if overlap is None else overlap, None if overlap is None else
                                f"the group was dropped at its end (ncclGroupSimulateEnd), none of its operations ran: "
                                f"{overlap}"):
                if overlap is not None:
                    raise overlap
                if body_ok:
                    raise CommStateError(f"a nested group's block raised (and this one's went on): the group was "
                                         f"dropped, none of its {len(works)} operations ran")
                return False
            if works:
                _prepare_group_end(works)
        status = 0
        try:
            status = (<Library>lib)._group_end() if isinstance(lib, Library) else lib.group_end()
        except NCCLError as e:
            for w in works:
                w.comm.group_failed(w, e)  # nothing of the group runs: no phantom outstanding work
            if body_ok:
                for c in {w.comm for w in works} or {self.comm}:
                    try:
                        c.handle_call_error(e, None)
                    except (CommFailure, NCCLError):
                        pass
                raise
            works = []
        if status == _IN_PROGRESS:  # nonblocking communicators still issuing: nothing is on the streams yet
            for w in works:
                w.comm.await_ready(w)
        for w in works:
            c = w.comm
            _group_closed(c, w, c.device, _comm_lib(c))
        if overlap is not None:  # the library could not drop the group (NCCL < 2.22): it ran; said all the same
            raise overlap
        if not in_order and body_ok:
            raise CommStateError("group(): the blocks of one group ended out of order (this one, opened first, "
                                 "ends while a later one is open), so none of them can wait for its operations: the "
                                 "group is dropped where its last block ends")
        if body_ok:
            for w in works:
                if not w.async_op:
                    _complete_in_group(w)
        return False


cdef int _issued(list works) except -1:
    """The Works of an outermost group that ends now (or is dropped): no longer waiting in it; their deadlines
    count from now, when ``ncclGroupEnd`` issues them, not from their enqueue."""
    cdef Work w
    cdef double now = _mono_ns() * 1e-9
    for w in works:
        w.grouped = False
        w.t0 = now
    return 0


cdef bint _drop_group(object lib, list works, object raised, object dropped_why=None) except -1:
    """Close the outermost group holding ``works`` with ``ncclGroupSimulateEnd``: none of them runs; they fail with
    a CommStateError saying ``dropped_why`` (None: its block raised), and ``raised`` (the block's exception, or None)
    gets a note saying so. False where the library has no ncclGroupSimulateEnd: the group is still open then, for the
    caller to end."""
    try:
        lib.group_simulate_end()
        why = dropped_why or "its block raised: the group was dropped (ncclGroupSimulateEnd), none of its operations ran"
    except NotSupported:
        return False
    except NCCLError as e:  # the library refused the group (what the block raised, most often): nothing ran either
        why = f"the library refused the group: {e}"
    for w in works:
        w.comm.group_failed(w, CommStateError(f"{w.op} ({_seq_text(w)}) never ran: {why}"))
    if isinstance(raised, BaseException) and hasattr(raised, "add_note"):  # Python >= 3.11
        raised.add_note(f"pycoll: none of the {len(works)} operations of the group() it left ran (dropped)")
    return True


cdef int _complete_in_group(Work w) except -1:
    """Wait for a blocking operation of a group that ended, as a blocking operation outside a group: this thread
    is inside an operation of its communicator meanwhile (the watchdog's SIGINT handling looks for that), and
    Ctrl-C fails the communicator (its policy acts, the peers are told) before the KeyboardInterrupt goes on."""
    cdef CommCore c = w.comm
    cdef unsigned long user = c._user
    c._user = PyThread_get_thread_ident()
    try:
        _complete(c, w, c.device, _comm_lib(c))
    except KeyboardInterrupt:
        c._interrupted(w, f"{w.op} ({_seq_text(w)}) of a group")
        raise
    finally:
        c._user = user
    return 0


def begin(CommCore comm, what, stream, async_op, arrays):
    """Check the state and resolve the stream the operation runs on (``Communicator._begin``); ``arrays``: the
    operation's arrays, at most two (its input and its output), None where absent."""
    arrays = tuple(arrays)
    if len(arrays) > 2:
        raise ValueError(f"begin takes at most two arrays (an input and an output), got {len(arrays)}")
    return _begin(comm, what, stream, async_op, arrays[0] if arrays else None, arrays[1] if len(arrays) > 1 else None)


# -- a library call made in C ---------------------------------------------------------------------

cdef enum _Kind:
    _ALL_REDUCE, _BROADCAST, _REDUCE, _ALL_GATHER, _REDUCE_SCATTER, _SEND, _RECV, _ALL_TO_ALL, _GATHER, _SCATTER,
    _SENDRECV

cdef dict _KINDS = {"all_reduce": _ALL_REDUCE, "broadcast": _BROADCAST, "reduce": _REDUCE, "all_gather": _ALL_GATHER,
                    "reduce_scatter": _REDUCE_SCATTER, "send": _SEND, "recv": _RECV, "all_to_all": _ALL_TO_ALL,
                    "gather": _GATHER, "scatter": _SCATTER}
cdef tuple _FUNCTIONS = ("ncclAllReduce", "ncclBroadcast", "ncclReduce", "ncclAllGather", "ncclReduceScatter",
                         "ncclSend", "ncclRecv", "ncclAlltoAll", "ncclGather", "ncclScatter")
cdef tuple _SENDRECV_STEPS = ("ncclGroupStart", "ncclSend", "ncclRecv", "ncclGroupEnd")  # a sendrecv's four calls


cdef void* _function(Library lib, int kind) noexcept:
    if kind == _ALL_REDUCE:
        return <void*>lib.fn.ncclAllReduce
    if kind == _BROADCAST:
        return <void*>lib.fn.ncclBroadcast
    if kind == _REDUCE:
        return <void*>lib.fn.ncclReduce
    if kind == _ALL_GATHER:
        return <void*>lib.fn.ncclAllGather
    if kind == _REDUCE_SCATTER:
        return <void*>lib.fn.ncclReduceScatter
    if kind == _SEND:
        return <void*>lib.fn.ncclSend
    if kind == _ALL_TO_ALL:
        return <void*>lib.fn.ncclAlltoAll
    if kind == _GATHER:
        return <void*>lib.fn.ncclGather
    if kind == _SCATTER:
        return <void*>lib.fn.ncclScatter
    if kind == _SENDRECV:  # ncclGroupStart, ncclSend, ncclRecv, ncclGroupEnd: all four or the binding's methods
        if lib.fn.ncclGroupStart == NULL or lib.fn.ncclGroupEnd == NULL or lib.fn.ncclRecv == NULL:
            return NULL
        return <void*>lib.fn.ncclSend
    return <void*>lib.fn.ncclRecv


@cython.freelist(8)
@cython.no_gc  # it refers to its library and CollConfig arguments only: no cycle runs through it
cdef class _Call:
    """One operation's library call with its arguments resolved: ``call(comm_handle, stream)``.

    On a compiled :class:`pycoll.bindings.Library` it calls the C function with no Python in
    between (the GIL released, the library's last error read right after a failure, as the bindings
    do); with a ``CollConfig`` (the ``*Config`` variants), a missing function or any other library
    object it calls the library's method of the same name, which is the binding's own path.
    """
    cdef object library
    cdef int kind
    cdef uintptr_t send, recv
    cdef size_t count, rcount  # rcount, rdatatype: a sendrecv's receive (count, datatype: its send)
    cdef int datatype, op, root, rdatatype
    cdef object cc  # the collconfig.Prepared arguments: they hold the memory the config points into

    def __call__(self, h, stream):
        return self.invoke(h, stream)

    cdef int invoke(self, object h, object stream) except -1:
        """The call: ncclSuccess (0) or ncclInProgress; raises the library's error."""
        cdef ncclComm_t c = <ncclComm_t><uintptr_t>h
        cdef cudaStream_t st = <cudaStream_t><uintptr_t>stream
        cdef Library lib = self.library if isinstance(self.library, Library) and not self.cc else None
        cdef void* fp = NULL
        cdef int r = 0, r_end, step = 0
        cdef char text[1024]
        cdef const void* sb = <const void*>self.send
        cdef void* rb = <void*>self.recv
        cdef ncclDataType_t dt = <ncclDataType_t>self.datatype
        if lib is not None:
            fp = _function(lib, self.kind)
        if fp == NULL:
            return _IN_PROGRESS if self._by_method(h, stream) == _IN_PROGRESS else 0
        text[0] = 0
        with nogil:
            if self.kind == _ALL_REDUCE:
                r = lib.fn.ncclAllReduce(sb, rb, self.count, dt, <ncclRedOp_t>self.op, c, st)
            elif self.kind == _BROADCAST:
                r = lib.fn.ncclBroadcast(sb, rb, self.count, dt, self.root, c, st)
            elif self.kind == _REDUCE:
                r = lib.fn.ncclReduce(sb, rb, self.count, dt, <ncclRedOp_t>self.op, self.root, c, st)
            elif self.kind == _ALL_GATHER:
                r = lib.fn.ncclAllGather(sb, rb, self.count, dt, c, st)
            elif self.kind == _REDUCE_SCATTER:
                r = lib.fn.ncclReduceScatter(sb, rb, self.count, dt, <ncclRedOp_t>self.op, c, st)
            elif self.kind == _SEND:
                r = lib.fn.ncclSend(sb, self.count, dt, self.root, c, st)
            elif self.kind == _RECV:
                r = lib.fn.ncclRecv(rb, self.count, dt, self.root, c, st)
            elif self.kind == _ALL_TO_ALL:
                r = lib.fn.ncclAlltoAll(sb, rb, self.count, dt, c, st)
            elif self.kind == _GATHER:
                r = lib.fn.ncclGather(sb, rb, self.count, dt, self.root, c, st)
            elif self.kind == _SCATTER:
                r = lib.fn.ncclScatter(sb, rb, self.count, dt, self.root, c, st)
            else:  # _SENDRECV: one group of a send and a receive with the same peer; the group always closed
                r = lib.fn.ncclGroupStart()
                if r == 0:
                    step = 1
                    r = lib.fn.ncclSend(sb, self.count, dt, self.root, c, st)
                    if r == 0:
                        step = 2
                        r = lib.fn.ncclRecv(rb, self.rcount, <ncclDataType_t>self.rdatatype, self.root, c, st)
                    if r != 0:
                        _last_error(lib, c, text, sizeof(text))  # before the group's end replaces it
                    r_end = lib.fn.ncclGroupEnd()
                    if r == 0:
                        step = 3
                        r = r_end
            if r != 0 and r != _IN_PROGRESS and text[0] == 0:
                _last_error(lib, c, text, sizeof(text))
        PyErr_CheckSignals()  # a signal that came while the call ran: its handler runs now, as after a Python call
        if r == 0 or r == _IN_PROGRESS:
            return r
        raise _library_error(lib, r, _SENDRECV_STEPS[step] if self.kind == _SENDRECV else _FUNCTIONS[self.kind], text)

    cdef _by_method(self, h, stream):
        lib, cc, k = self.library, self.cc, self.kind
        if k == _ALL_REDUCE:
            return lib.all_reduce(self.send, self.recv, self.count, self.datatype, self.op, h, stream, *cc)
        if k == _BROADCAST:
            return lib.broadcast(self.send, self.recv, self.count, self.datatype, self.root, h, stream, *cc)
        if k == _REDUCE:
            return lib.reduce(self.send, self.recv, self.count, self.datatype, self.op, self.root, h, stream, *cc)
        if k == _ALL_GATHER:
            return lib.all_gather(self.send, self.recv, self.count, self.datatype, h, stream, *cc)
        if k == _REDUCE_SCATTER:
            return lib.reduce_scatter(self.send, self.recv, self.count, self.datatype, self.op, h, stream, *cc)
        if k == _SEND:
            return lib.send(self.send, self.count, self.datatype, self.root, h, stream)
        if k == _ALL_TO_ALL:
            return lib.all_to_all(self.send, self.recv, self.count, self.datatype, h, stream, *cc)
        if k == _GATHER:
            return lib.gather(self.send, self.recv, self.count, self.datatype, self.root, h, stream, *cc)
        if k == _SCATTER:
            return lib.scatter(self.send, self.recv, self.count, self.datatype, self.root, h, stream, *cc)
        if k == _SENDRECV:
            lib.group_start()
            try:
                lib.send(self.send, self.count, self.datatype, self.root, h, stream)
                lib.recv(self.recv, self.rcount, self.rdatatype, self.root, h, stream)
            except BaseException:
                try:
                    lib.group_end()  # the group closed; the call's own error is the one to raise
                except Exception:
                    pass
                raise
            return lib.group_end()
        return lib.recv(self.recv, self.count, self.datatype, self.root, h, stream)


cdef object _library_error(Library lib, int r, object function, const char* text):
    """The error ``r`` of the library's ``function`` as the bindings raise it, with the library's last error
    ``text``."""
    return error_class(r)(r, function, lib.get_error_string(r), text.decode("utf-8", "replace"), lib.path)


cdef void _last_error(Library lib, ncclComm_t c, char* text, size_t size) noexcept nogil:
    """The library's last error text for ``c`` into ``text`` (left as it is where the library has none)."""
    cdef const char* last
    if lib.fn.ncclGetLastError != NULL:
        last = lib.fn.ncclGetLastError(c)
        if last != NULL:
            strncpy(text, last, size - 1)
            text[size - 1] = 0


cdef _Call _new_call(object library, int kind, object cc, uintptr_t send, uintptr_t recv, size_t count, int datatype,
                     int op, int root):
    cdef _Call call = _Call.__new__(_Call)
    call.library, call.kind, call.cc = library, kind, cc
    call.send, call.recv, call.count, call.datatype, call.op, call.root = send, recv, count, datatype, op, root
    return call


def library_call(library, what, cc, send, recv, count, datatype, op=0, root=0):
    """The call of operation ``what`` (``"all_reduce"``, ``"broadcast"``, ``"reduce"``, ``"all_gather"``,
    ``"reduce_scatter"``, ``"all_to_all"``, ``"gather"``, ``"scatter"``, ``"send"``, ``"recv"``) on ``library``,
    for :func:`launch`: ``call(handle, stream)``. ``cc``: the prepared CollConfig arguments
    (``collconfig.prepare``); ``root`` is the peer of a send or receive, whose buffer is ``send`` / ``recv``."""
    return _new_call(library, _KINDS[what], cc, send, recv, count, datatype, op, root)


cdef dict _REDUCE_OPS = _dtypes.REDUCE_OPS
cdef int _NUM_OPS = len(_dtypes.REDUCE_OPS)  # ncclNumOps: the built-in operators are 0 .. _NUM_OPS - 1


cdef object _redop(CommCore comm, object op, object datatype):
    """``op`` as an ``ncclRedOp_t``: a built-in operator's name or number in C, the rest (another spelling, a
    ``RedOp``, a ``PreMulSum``, a wrong value) by ``Communicator._redop``, which says what is wrong."""
    if op is "sum":
        return 0
    tp = type(op)
    if tp is str:
        code = _REDUCE_OPS.get(op)
        if code is not None:
            return code
    elif isinstance(op, int) and tp is not bool and 0 <= op < _NUM_OPS:  # a number, or a RedOp (an IntEnum)
        return int(op)
    return comm._redop(op, datatype)


cdef inline object _holding(CommCore comm, object w, object op, object redop):
    """``w``, which keeps the scalar of the PreMulSum ``op`` (``redop``: its operator) alive while it lives: NCCL reads
    an array scalar when the operation runs, and the operator may be destroyed (and the PreMulSum, holding the scalar,
    dropped) as soon as the call returned."""
    if <int>redop >= _NUM_OPS:
        comm._scalar_holds[w] = op._scalar
    return w


cdef inline bint _share_memory(object a, object b):
    """Whether two Buffers' byte ranges meet: check_overlap's own range test in C, so that the common separate
    buffers make no Python call (check_overlap decides the rest)."""
    cdef uintptr_t a0 = (<tuple>a)[0], b0 = (<tuple>b)[0]
    return a0 < b0 + <size_t>(<tuple>b)[1] and b0 < a0 + <size_t>(<tuple>a)[1]


cdef object _output_fits(object inp, object out, str op):
    """``inp``'s count, once ``out`` has its dtype and room for it and overlaps it only in place (the same
    start) (``buffers.check_*`` raise otherwise); both are Buffers (tuples)."""
    if (<tuple>inp)[3] != (<tuple>out)[3]:
        check_same_dtype(inp, out, op=op)
    count = (<tuple>inp)[2]
    if (<tuple>out)[2] < count:
        check_count(out, count, op=op)
    if (<tuple>inp)[0] != (<tuple>out)[0] and _share_memory(inp, out):  # the same start: in place
        check_overlap(inp, out, op=op, in_place_form="output=None")
    return count


cdef inline list _outputs_of(list inputs, object out):
    """An operation's outputs list: its inputs list itself when it runs in place (one Buffer, one list: the Work
    holds both, and nothing changes either in place -- its retirement replaces both with one empty list)."""
    return inputs if out is inputs[0] else [out]


def all_reduce(CommCore comm, tensor, output=None, op="sum", *, stream=None, async_op=False, timeout=None, config=None):
    """Reduce ``tensor`` across ranks into ``output`` (in place when ``output`` is None)."""
    global _clock_armed, _clock_last, _clock_ops
    if not _clocking:
        return _all_reduce(comm, tensor, output, op, stream, async_op, timeout, config)
    if PyThread_get_thread_ident() == _clock_thread and not async_op and pycoll_group_works == NULL:
        _clock_ops += 1
        _clock_armed = True
        _clock_last = _mono_ns()
    try:
        return _all_reduce(comm, tensor, output, op, stream, async_op, timeout, config)
    finally:
        _clock_armed = False


cdef object _all_reduce(CommCore comm, object tensor, object output, object op, object stream, object async_op,
                        object timeout, object config):
    cc = () if config is None else _prepare_config(config)
    st = _begin(comm, "all_reduce", stream, async_op, tensor, output)
    _stage(_ST_BEGIN)
    inp = _describe(comm, tensor, st, output is None, "tensor")
    out = inp if output is None else _describe(comm, output, st, True, "output")
    _stage(_ST_DESCRIBE)
    count = _output_fits(inp, out, "all_reduce")
    redop = _redop(comm, op, (<tuple>inp)[3])
    call = _new_call(comm.library, _ALL_REDUCE, cc, (<tuple>inp)[0], (<tuple>out)[0], count, (<tuple>inp)[3], redop, 0)
    _stage(_ST_ARGS)
    ins = [inp]
    w = _launch(comm, "all_reduce", call, st, ins, _outputs_of(ins, out), async_op, timeout, None)
    return _holding(comm, w, op, redop)


cdef object _rank_arg(CommCore comm, object root, object what):
    """A root or peer argument as an int rank of ``comm``: an int, or another integer (numpy's, an int subclass, a 0-d
    integer tensor: what ``operator.index`` takes, never a bool), in range; ``comm._root`` says what is wrong."""
    tp = type(root)
    if tp is int:
        if 0 <= root < comm._size:
            return root
    elif tp is not bool and PyIndex_Check(root):
        try:
            value = PyNumber_Index(root)
        except TypeError:  # an __index__ that refuses (numpy's bool): comm._root names it
            value = None
        if value is not None and 0 <= value < comm._size:
            return value
    return comm._root(root, what)


def broadcast(CommCore comm, tensor, root=0, output=None, *, stream=None, async_op=False, timeout=None, config=None):
    """Copy ``tensor`` of rank ``root`` to every rank's ``output`` (``tensor`` itself when None)."""
    cc = () if config is None else _prepare_config(config)
    root = _rank_arg(comm, root, "root")
    st = _begin(comm, "broadcast", stream, async_op, tensor, output)
    # the root only reads its tensor (in place too): a read-only array is fine there
    inp = _describe(comm, tensor, st, output is None and comm._rank != root, "tensor")
    out = inp if output is None else _describe(comm, output, st, True, "output")
    count = _output_fits(inp, out, "broadcast")
    call = _new_call(comm.library, _BROADCAST, cc, (<tuple>inp)[0], (<tuple>out)[0], count, (<tuple>inp)[3], 0, root)
    ins = [inp]
    return _launch(comm, "broadcast", call, st, ins, _outputs_of(ins, out), async_op, timeout, None)


def reduce(CommCore comm, tensor, root=0, output=None, op="sum", *, stream=None, async_op=False, timeout=None,
           config=None):
    """Reduce ``tensor`` across ranks into ``output`` on rank ``root`` (in place when None); elsewhere ``output`` is
    not written (it may be read-only)."""
    cc = () if config is None else _prepare_config(config)
    root = _rank_arg(comm, root, "root")
    st = _begin(comm, "reduce", stream, async_op, tensor, output)
    inp = _describe(comm, tensor, st, output is None and comm._rank == root, "tensor")
    # written on the root only: elsewhere a read-only output is fine (as a broadcast's input)
    out = inp if output is None else _describe(comm, output, st, comm._rank == root, "output")
    # off the root the output is not looked at (NCCL ignores recvbuff there): one too small is taken
    count = (_output_fits(inp, out, "reduce") if comm._rank == root or (<tuple>out)[2] >= (<tuple>inp)[2]
             else (<tuple>inp)[2])
    redop = _redop(comm, op, (<tuple>inp)[3])
    call = _new_call(comm.library, _REDUCE, cc, (<tuple>inp)[0], (<tuple>out)[0], count, (<tuple>inp)[3], redop, root)
    ins = [inp]
    w = _launch(comm, "reduce", call, st, ins, _outputs_of(ins, out), async_op, timeout, None)
    return _holding(comm, w, op, redop)


cdef object _rank_block(CommCore comm, object whole, Py_ssize_t count, object name):
    """This rank's block of ``count`` elements of the Buffer ``whole`` (an in-place form's other buffer): a Buffer of
    the whole's array and fields but its address, size, shape and ``name``; ``whole`` holds ``size`` such blocks."""
    cdef int code = (<tuple>whole)[3]
    cdef Py_ssize_t nbytes = count * (_ITEMSIZES[code] if 0 <= code < _MAX_CODE else _buffers.DATATYPE_ITEMSIZES[code])
    cdef Py_ssize_t rank = comm._rank
    cdef tuple w = <tuple>whole
    return pycoll_buffer(Buffer, <uintptr_t>w[0] + rank * nbytes, nbytes, count, w[3], w[4], (count,), w[6],
                         w[7], w[8], w[9], w[10], w[11], name)


cdef object _block(CommCore comm, object whole, object block, object st, bint gather, str op):
    """The per-rank block of an all_gather or a gather (``gather``: its input) or of a reduce_scatter or a scatter (its
    output) next to ``whole``, its ``size`` blocks: ``block`` described, with the same dtype, exactly ``size`` of it in
    ``whole`` (a bigger whole's rest was ignored, or its blocks taken where the caller's were not: a reduce_scatter's
    rank got a block straddling two) and no overlap but the in-place one (``buffers.check_*`` raise otherwise);
    ``block`` None: this rank's block of ``whole``."""
    cdef Py_ssize_t size = comm._size, n = (<tuple>whole)[2], count, nbytes, rank = comm._rank
    name = "input" if gather else "output"
    if block is None:
        if n % size:
            raise ValueError(f"{op}: {'in place, ' if gather else ''}{(<tuple>whole)[12]} has {n} elements, "
                             f"not a multiple of {size} ranks")
        return _rank_block(comm, whole, n // size, name)
    b = _describe(comm, block, st, not gather, name)
    count, nbytes = (<tuple>b)[2], (<tuple>b)[1]
    inp, out = (b, whole) if gather else (whole, b)
    if (<tuple>inp)[3] != (<tuple>out)[3]:
        check_same_dtype(inp, out, op=op)
    if n != count * size:
        check_count(whole, count * size, exact=True, op=op, why=f"{count} elements x {size} ranks")
    # in place: the block at its rank's offset of the whole (what check_overlap allows without a look)
    if _share_memory(inp, out) and <uintptr_t>(<tuple>b)[0] != <uintptr_t>(<tuple>whole)[0] + rank * nbytes:
        if gather:
            check_overlap(inp, out, op=op, in_place=rank * nbytes, in_place_form="input=None")
        else:
            check_overlap(inp, out, op=op, in_place=-rank * nbytes, in_place_form="output=None")
    return b


def all_gather(CommCore comm, input, output, *, stream=None, async_op=False, timeout=None, config=None):
    """Gather every rank's ``input`` into ``output`` (``size`` x input elements, rank order).

    ``input=None`` is in place: each rank's contribution is already at its slot of ``output``.
    """
    cc = () if config is None else _prepare_config(config)
    st = _begin(comm, "all_gather", stream, async_op, input, output)
    out = _describe(comm, output, st, True, "output")
    inp = _block(comm, out, input, st, True, "all_gather")
    call = _new_call(comm.library, _ALL_GATHER, cc, (<tuple>inp)[0], (<tuple>out)[0], (<tuple>inp)[2],
                     (<tuple>inp)[3], 0, 0)
    ins = [inp]
    return _launch(comm, "all_gather", call, st, ins, _outputs_of(ins, out), async_op, timeout, None)


def reduce_scatter(CommCore comm, input, output=None, op="sum", *, stream=None, async_op=False, timeout=None,
                   config=None):
    """Reduce ``input`` (``size`` blocks) across ranks; rank r receives block r in ``output``.

    ``output=None`` is in place: the result lands in this rank's block of ``input``.
    """
    cc = () if config is None else _prepare_config(config)
    st = _begin(comm, "reduce_scatter", stream, async_op, input, output)
    inp = _describe(comm, input, st, output is None, "input")
    out = _block(comm, inp, output, st, False, "reduce_scatter")
    redop = _redop(comm, op, (<tuple>inp)[3])
    call = _new_call(comm.library, _REDUCE_SCATTER, cc, (<tuple>inp)[0], (<tuple>out)[0], (<tuple>out)[2],
                     (<tuple>inp)[3], redop, 0)
    ins = [inp]
    w = _launch(comm, "reduce_scatter", call, st, ins, _outputs_of(ins, out), async_op, timeout, None)
    return _holding(comm, w, op, redop)


def all_to_all(CommCore comm, input, output=None, *, stream=None, async_op=False, timeout=None, config=None):
    """Send block j of ``input`` to rank j; receive rank j's block r into block j of ``output``.

    ``input`` and ``output`` hold ``size`` equal blocks; ``output=None`` is in place.
    """
    cdef Py_ssize_t n, size = comm._size
    cc = () if config is None else _prepare_config(config)
    st = _begin(comm, "all_to_all", stream, async_op, input, output)
    inp = _describe(comm, input, st, output is None, "input")
    out = inp if output is None else _describe(comm, output, st, True, "output")
    if (<tuple>inp)[3] != (<tuple>out)[3]:
        check_same_dtype(inp, out, op="all_to_all")
    n = (<tuple>inp)[2]
    if n % size:
        raise ValueError(f"all_to_all: input has {n} elements, not a multiple of {size} ranks")
    if (<tuple>out)[2] != n:  # its blocks are input's: a bigger output's would not be where they land
        check_count(out, n, exact=True, op="all_to_all", why=f"{size} blocks of {n // size}, as input's")
    if (<tuple>inp)[0] != (<tuple>out)[0] and _share_memory(inp, out):  # the same start: in place
        check_overlap(inp, out, op="all_to_all", in_place_form="output=None")
    call = _new_call(comm.library, _ALL_TO_ALL, cc, (<tuple>inp)[0], (<tuple>out)[0], n // size, (<tuple>inp)[3], 0, 0)
    ins = [inp]
    return _launch(comm, "all_to_all", call, st, ins, _outputs_of(ins, out), async_op, timeout, None)


def gather(CommCore comm, input, output=None, root=0, *, stream=None, async_op=False, timeout=None, config=None):
    """Gather every rank's ``input`` into ``output`` on rank ``root`` (``size`` x input elements).

    ``output`` is needed on the root only (elsewhere it is not looked at). On the root, ``input=None`` is in place
    (its contribution already sits at its slot of ``output``).
    """
    cdef Py_ssize_t n, size = comm._size
    cc = () if config is None else _prepare_config(config)
    root = _rank_arg(comm, root, "root")
    st = _begin(comm, "gather", stream, async_op, input, output)
    out = None
    if comm._rank == root:
        if output is None:
            raise ValueError("gather: the root needs an output buffer")
        out = _describe(comm, output, st, True, "output")
    if input is None:
        if out is None:
            raise ValueError("gather: input=None (in place) is only valid on the root")
        n = (<tuple>out)[2]
        if n % size:
            raise ValueError(f"gather: output has {n} elements, not a multiple of {size} ranks")
        inp = _rank_block(comm, out, n // size, "input")
    elif out is None:
        inp = _describe(comm, input, st, False, "input")
    else:
        inp = _block(comm, out, input, st, True, "gather")
    call = _new_call(comm.library, _GATHER, cc, (<tuple>inp)[0], 0 if out is None else (<tuple>out)[0],
                     (<tuple>inp)[2], (<tuple>inp)[3], 0, root)
    return _launch(comm, "gather", call, st, [inp], [] if out is None else [out], async_op, timeout, None)


def scatter(CommCore comm, input, output=None, root=0, *, stream=None, async_op=False, timeout=None, config=None):
    """Send block j of ``input`` on rank ``root`` to rank j's ``output``.

    ``input`` (``size`` blocks) is needed on the root only (elsewhere it is not looked at). On the root,
    ``output=None`` is in place (its block stays in ``input``).
    """
    cdef Py_ssize_t n, size = comm._size
    cc = () if config is None else _prepare_config(config)
    root = _rank_arg(comm, root, "root")
    st = _begin(comm, "scatter", stream, async_op, input, output)
    inp = None
    if comm._rank == root:
        if input is None:
            raise ValueError("scatter: the root needs an input buffer")
        inp = _describe(comm, input, st, output is None, "input")
        n = (<tuple>inp)[2]
        if n % size:
            raise ValueError(f"scatter: input has {n} elements, not a multiple of {size} ranks")
    if output is None:
        if inp is None:
            raise ValueError("scatter: output=None (in place) is only valid on the root")
        out = _rank_block(comm, inp, n // size, "output")
    elif inp is None:
        out = _describe(comm, output, st, True, "output")
    else:
        out = _block(comm, inp, output, st, False, "scatter")
    call = _new_call(comm.library, _SCATTER, cc, 0 if inp is None else (<tuple>inp)[0], (<tuple>out)[0],
                     (<tuple>out)[2], (<tuple>out)[3], 0, root)
    return _launch(comm, "scatter", call, st, [] if inp is None else [inp], [out], async_op, timeout, None)


def send(CommCore comm, tensor, peer, *, stream=None, async_op=False, timeout=None):
    """Send ``tensor`` to rank ``peer`` (which must post a matching :meth:`recv`).

    Sends and receives between several peers must be issued inside :meth:`group` so that the
    library can progress them together.
    """
    peer = _rank_arg(comm, peer, "peer")
    st = _begin(comm, "send", stream, async_op, tensor, None)
    b = _describe(comm, tensor, st, False, "tensor")
    call = _new_call(comm.library, _SEND, (), (<tuple>b)[0], 0, (<tuple>b)[2], (<tuple>b)[3], 0, peer)
    return _launch(comm, "send", call, st, [b], [], async_op, timeout, peer)


def recv(CommCore comm, tensor, peer, *, stream=None, async_op=False, timeout=None):
    """Receive into ``tensor`` from rank ``peer`` (which must post a matching :meth:`send`)."""
    peer = _rank_arg(comm, peer, "peer")
    st = _begin(comm, "recv", stream, async_op, tensor, None)
    b = _describe(comm, tensor, st, True, "tensor")
    call = _new_call(comm.library, _RECV, (), 0, (<tuple>b)[0], (<tuple>b)[2], (<tuple>b)[3], 0, peer)
    return _launch(comm, "recv", call, st, [], [b], async_op, timeout, peer)


def sendrecv(CommCore comm, tensor, output, peer, *, stream=None, async_op=False, timeout=None):
    """Send ``tensor`` to rank ``peer`` and receive ``output`` from it, as one operation.

    The two transfers go in one group (``ncclGroupStart``, ``ncclSend``, ``ncclRecv``, ``ncclGroupEnd``),
    so neither waits for the other; the peer posts the matching pair (its own ``sendrecv``, or a send
    and a receive in a group). One :class:`Work`, one flight-recorder entry (``sendrecv a<->b``) and
    one point-to-point sequence number for both. ``tensor`` and ``output`` may differ in size and
    dtype (each must match what the peer receives and sends) but may not overlap in memory. Inside a
    :meth:`group` the pair joins that group. To send to one rank and receive from another, put a
    :meth:`send` and a :meth:`recv` in a group.
    """
    peer = _rank_arg(comm, peer, "peer")
    st = _begin(comm, "sendrecv", stream, async_op, tensor, output)
    sb = _describe(comm, tensor, st, False, "tensor")
    rb = _describe(comm, output, st, True, "output")
    if _share_memory(sb, rb):  # a receive may not overwrite what is being sent
        check_overlap(sb, rb, op="sendrecv", in_place=None)
    call = _new_call(comm.library, _SENDRECV, (), (<tuple>sb)[0], (<tuple>rb)[0], (<tuple>sb)[2], (<tuple>sb)[3], 0,
                     peer)
    call.rcount, call.rdatatype = (<tuple>rb)[2], (<tuple>rb)[3]
    return _launch(comm, "sendrecv", call, st, [sb], [rb], async_op, timeout, peer)


# -- a DLPack capsule destructor for producers written in Python -----------------------------------

ctypedef void (*_dl_deleter)(void*) noexcept


cdef void _dlpack_capsule_destructor(object capsule) noexcept:
    """Run an unconsumed capsule's deleter (DLPack: ``deleter`` follows the 8-byte version and the
    manager context in a versioned ``DLManagedTensorVersioned``, the 48-byte ``DLTensor`` and the manager
    context in a ``DLManagedTensor``), with any exception being raised set aside meanwhile.

    A capsule may die while an exception propagates (the last reference to an array dropped as a
    frame unwinds); a deleter written in Python (a ctypes callback) must not run with that
    exception set, or the exception is lost.
    """
    cdef PyObject* t
    cdef PyObject* v
    cdef PyObject* tb
    cdef void* p
    PyErr_Fetch(&t, &v, &tb)
    if PyCapsule_IsValid(capsule, b"dltensor_versioned"):
        p = PyCapsule_GetPointer(capsule, b"dltensor_versioned")
        if p != NULL and (<_dl_deleter*>(<char*>p + 16))[0] != NULL:
            (<_dl_deleter*>(<char*>p + 16))[0](p)
    elif PyCapsule_IsValid(capsule, b"dltensor"):
        p = PyCapsule_GetPointer(capsule, b"dltensor")
        if p != NULL and (<_dl_deleter*>(<char*>p + 56))[0] != NULL:
            (<_dl_deleter*>(<char*>p + 56))[0](p)
    PyErr_Restore(t, v, tb)


#: the address of a ``PyCapsule_Destructor`` for DLPack capsules made in Python (``pycoll.emulated``):
#: it calls the managed tensor's deleter unless a consumer renamed the capsule, and keeps an exception
#: that is propagating while the capsule dies
DLPACK_CAPSULE_DESTRUCTOR = <uintptr_t>&_dlpack_capsule_destructor
