# cython: language_level=3, boundscheck=False, wraparound=False, embedsignature=True, binding=True
"""The per-operation hooks of the flight recorder and the watchdog, compiled.

They run on every operation (``Communicator._launch`` calls them), so they are the bodies of
``FlightRecorder.work_enqueued`` / ``work_completed`` and ``Watchdog.work_enqueued``, which bind
these functions as their methods. What they do is plain bookkeeping: the recorder copies what never
changes about an operation into a ring entry (and the top frames' code objects and offsets, formatted
only at dump time); the watchdog wakes its polling thread when an operation is due before its next
round. What they read of the recorder and the watchdog lives in their compiled base classes,
:class:`RecorderCore` and :class:`WatchdogCore`, as C struct members.
"""

from pycoll._core cimport Work

import sys
from threading import get_ident as _get_ident

from .._bindings import capture_stack as _capture_stack
from ..buffers import Buffer

__all__ = ["RecorderCore", "WatchdogCore", "recorder_work_enqueued", "recorder_work_completed",
           "watchdog_work_enqueued", "watchdog_watching"]

# Entry layout: see pycoll.diagnostics.recorder (_POS .. _CAPTURE)
cdef Py_ssize_t _SHAPE = Buffer._fields.index("shape")
cdef Py_ssize_t _DTYPE = Buffer._fields.index("dtype_name")
cdef Py_ssize_t _FROZEN = 16
cdef tuple _CAPTURED = ("captured", None, None, None, None)

cdef extern from "Python.h":
    void PyObject_GC_UnTrack(void*)

# Ring entries are not tracked by the cyclic garbage collector: the ring keeps thousands of them alive,
# and a collection would walk each one (with its stack) over and over. No cycle can run through an entry:
# it holds ints, strings, shape tuples, the stack (code objects and ints) and its communicator's
# _CommInfo, which refers to no entry (its communicator only by weak reference).


cdef class RecorderCore:
    """The base of :class:`~pycoll.diagnostics.FlightRecorder`: what its per-operation hook reads, as C
    struct members (``FlightRecorder.__init__`` and ``configure`` set them)."""
    cdef public list _ring
    cdef public dict _infos
    cdef public object _pos
    cdef public bint stacks
    cdef public int stack_depth

    def __cinit__(self, *args, **kwargs):
        self._ring = []
        self._infos = {}


cdef class WatchdogCore:
    """The base of :class:`~pycoll.diagnostics.Watchdog`: what its per-operation hooks read, as C struct
    members (``Watchdog.__init__`` and its polling thread set them)."""
    cdef public double _next_due, _wake_at
    cdef public object _poll_wake
    cdef public bint _active


def recorder_work_enqueued(RecorderCore self, Work w):
    """Record one operation (called for every enqueued :class:`~pycoll.Work`)."""
    cdef list ring = self._ring
    cdef Py_ssize_t n = len(ring)
    if n == 0:
        return
    comm = w.comm
    # comm_created maps every communicator when it is made, so an id found here is that of this
    # communicator (a reused id is remapped by the new communicator's comm_created)
    info = self._infos.get(id(comm))
    if info is None:
        info = self._info(comm)
    # one buffer (the usual case): its shape tuple and dtype name as they are, no new objects; several: lists
    cdef list ins = w.inputs
    cdef list outs = w.outputs
    if len(ins) == 1:
        isz = (<tuple>ins[0])[_SHAPE]
        idt = (<tuple>ins[0])[_DTYPE]
    else:
        isz = [(<tuple>b)[_SHAPE] for b in ins]
        idt = [(<tuple>b)[_DTYPE] for b in ins]
    if len(outs) == 1:
        osz = (<tuple>outs[0])[_SHAPE]
        odt = (<tuple>outs[0])[_DTYPE]
    else:
        osz = [(<tuple>b)[_SHAPE] for b in outs]
        odt = [(<tuple>b)[_DTYPE] for b in outs]
    # from _launch on (+ 1: the public call, e.g. all_reduce, stays; a compiled one has no frame of its own)
    stack = None
    if self.stacks:
        stack = _capture_stack(0, self.stack_depth + 1)
        if stack is None:  # before Python 3.11
            stack = _frames(self.stack_depth + 1)
    pos = next(self._pos)
    capture = w.capture_id
    entry = [pos, next(info.rid), info, isz, idt, osz, odt, _get_ident(), stack,
             w.op, w.seq, w.p2p_seq, w.op_id, w.peer, w.timeout, w.time_created_ns,
             None if capture is None else _CAPTURED, capture]
    PyObject_GC_UnTrack(<void*>entry)  # a ring of them must not make every collection walk it: see below
    ring[pos % n] = entry
    w.fr_entry = entry


cdef list _frames(int depth):
    cdef list stack = []
    f = sys._getframe(0)
    for _ in range(depth):
        if f is None:
            break
        stack.append(f.f_code)
        stack.append(f.f_lasti)
        f = f.f_back
    return stack


def recorder_work_completed(RecorderCore self, Work w):
    """Freeze a completed operation's times into its entry (the communicator calls it when one completes)."""
    e = w.fr_entry
    if e is not None:
        (<list>e)[_FROZEN] = ("completed", w.time_started_ns, w.time_completed_ns, w.duration_ms, None)


def watchdog_work_enqueued(WatchdogCore self, Work w):
    """An operation due before the polling thread's next round wakes it (also while it is scanning:
    it may have passed this communicator already): no interval delays a timeout."""
    cdef double due = w.t0 + w.timeout
    if due < self._next_due:
        self._next_due = due
    cdef double wake_at = self._wake_at
    if wake_at == 0 or due < wake_at:
        self._poll_wake.set()


def watchdog_watching(WatchdogCore self):
    """True while the polling thread enforces deadlines (then blocking host operations run inline)."""
    return self._active
