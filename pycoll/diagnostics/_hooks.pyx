# cython: language_level=3, boundscheck=False, wraparound=False, embedsignature=True, binding=True
"""The per-operation hooks of the flight recorder and the watchdog, compiled.

They run on every operation, so they are compiled observer hooks (:class:`pycoll._core.Hook`): the
path calls them through C. Their Python faces, ``FlightRecorder.work_enqueued`` / ``work_completed``
and ``Watchdog.work_enqueued``, are the functions below bound as methods. What they
do is plain bookkeeping: the recorder writes what never changes about an operation into its ring
entry, an :class:`Entry` that is reused in place when the ring wraps (no allocation per operation),
with the top frames' code objects and offsets (formatted only at dump time); the watchdog wakes its
polling thread when an operation is due before its next round. What they read of the recorder and
the watchdog lives in their compiled base classes, :class:`RecorderCore` and :class:`WatchdogCore`,
as C struct members.
"""

cimport cython
from cpython.mem cimport PyMem_Free, PyMem_Realloc
from cpython.pythread cimport PyThread_get_thread_ident
from cpython.ref cimport PyObject, Py_XDECREF

from pycoll._core cimport Hook, Work

import threading

from ..buffers import Buffer
from ..hooks import CommObserver

#: the operations torch's analyzer models (the others are kept apart in a dump: pycoll.diagnostics.recorder)
TORCH_COLLECTIVES = frozenset({"all_reduce", "broadcast", "reduce", "all_gather", "reduce_scatter", "all_to_all",
                               "gather", "scatter", "barrier"})

__all__ = ["TORCH_COLLECTIVES", "Entry", "RecordIds", "RecorderCore", "WatchdogCore", "recorder_work_enqueued",
           "recorder_work_completed", "watchdog_work_enqueued"]

cdef extern from "../_bindings/frames.h":
    int pycoll_frames(PyObject** codes, int* lastis, int skip, int depth)

cdef extern from "Python.h":
    ctypedef struct PyThreadState:
        pass
    PyThreadState* PyThreadState_Get()
    unsigned long long PyThreadState_GetID(PyThreadState* tstate)  # never the same for two threads (Python 3.9+)

cdef Py_ssize_t _SHAPE = Buffer._fields.index("shape")
cdef Py_ssize_t _DTYPE = Buffer._fields.index("dtype_name")
cdef tuple _CAPTURED = ("captured", None, None, None, None)


cdef struct _Frames:
    PyObject** codes  # owned references
    int* lastis
    int n  # frames held; -1: no stack was captured
    int cap


cdef int _reserve(_Frames* f, int cap) except -1:
    cdef PyObject** codes
    cdef int* lastis
    if f.cap >= cap:
        return 0
    codes = <PyObject**>PyMem_Realloc(f.codes, cap * sizeof(PyObject*))
    if codes == NULL:
        raise MemoryError()
    f.codes = codes
    lastis = <int*>PyMem_Realloc(f.lastis, cap * sizeof(int))
    if lastis == NULL:
        raise MemoryError()
    f.lastis = lastis
    f.cap = cap
    return 0


cdef void _release(_Frames* f) noexcept:
    cdef int i
    for i in range(f.n):
        Py_XDECREF(f.codes[i])
    f.n = -1


cdef void _free(_Frames* f) noexcept:
    _release(f)
    PyMem_Free(f.codes)
    PyMem_Free(f.lastis)
    f.codes, f.lastis, f.cap = NULL, NULL, 0


@cython.final
cdef class RecordIds:
    """The record ids of a generation's operations, 0, 1, 2, ... (``itertools.count()``'s role: ``next(ids)``); the
    compiled hook takes the next without a call or an int object. ``left_out``: how many of them were given to
    operations torch's analyzer does not read (sends, receives, one-sided operations, watched streams)."""
    cdef public long long next_id, left_out

    def __iter__(self):
        return self

    def __next__(self):
        self.next_id += 1
        return self.next_id - 1


# Entries are not tracked by the cyclic garbage collector: the ring keeps thousands of them, and a
# collection would walk each one over and over. No cycle can run through an entry: it holds ints,
# strings, shape tuples, code objects and its communicator's _CommInfo, which refers to no entry
# (its communicator only by weak reference).
@cython.no_gc
@cython.final
cdef class Entry:
    """One recorded operation, as the flight recorder's ring keeps it.

    An entry is written in place, whole, while the writer holds the GIL and allocates nothing, and is
    reused when the ring wraps: ``pos`` says which operation it holds now (``Work.fr_pos`` which
    operation a Work's entry was written for). Readers take a :meth:`snapshot`.
    """
    cdef readonly long long pos, rid
    cdef readonly long long kept  # rid counting only what torch's analyzer reads (-1: one it does not read)
    cdef readonly object info, isz, idt, osz, odt, op, peer, root, timeout
    cdef readonly long long seq, p2p_seq, op_id, created
    cdef readonly object capture
    cdef object _frozen  # set by freeze() (or "captured")
    cdef bint _completed  # completed, at these times (set without making the state's tuple)
    cdef long long _t_started, _t_completed  # its Work's, as C values
    cdef double _ms
    cdef bint _has_ms
    cdef unsigned long _tid
    cdef object _tname  # the issuing thread's name when it issued the operation (its ident may be reused since)
    cdef _Frames _frames

    def __cinit__(self):
        self.pos = -1
        self._frames.n = -1

    def __dealloc__(self):
        _free(&self._frames)

    @property
    def tid(self):
        """The identifier of the thread that issued the operation."""
        return self._tid

    @property
    def thread_name(self):
        """The name the issuing thread had when it first issued an operation recorded here."""
        return self._tname

    @property
    def frozen(self):
        """The operation's final state, ``(state, started ns, completed ns, duration ms, error)``, or None while
        its Work has it."""
        if self._frozen is None and self._completed:
            return ("completed", self._t_started or None, self._t_completed or None,
                    self._ms if self._has_ms else None, None)
        return self._frozen

    @property
    def stack(self):
        """``[code, f_lasti, ...]`` of the frames recorded, innermost first; None without a stack."""
        cdef int i
        if self._frames.n < 0:
            return None
        out = []
        for i in range(self._frames.n):
            out.append(<object>self._frames.codes[i])
            out.append(self._frames.lastis[i])
        return out

    def snapshot(self):
        """The entry as a list (``pycoll.diagnostics.recorder``'s layout, ``_POS`` .. ``_ROOT``), or None
        when it holds no operation. Consistent: an entry rewritten while it was being copied is copied again."""
        cdef long long pos
        while True:
            pos = self.pos
            if pos < 0:
                return None
            out = [pos, self.rid, self.info, self.isz, self.idt, self.osz, self.odt, self._tid, self.stack, self.op,
                   self.seq, self.p2p_seq, self.op_id, self.peer, self.timeout, self.created, self.frozen, self.capture,
                   self.root, self.kept, self._tname]
            if self.pos == pos:
                return out

    def freeze(self, state):
        """Keep ``state``, ``(state, started ns, completed ns, duration ms, error)``, as the operation's
        final state (its Work may go away)."""
        self._frozen = state


cdef bint _faces_are(object obj, tuple faces) except -1:
    """True when ``type(obj)``'s methods named in ``faces`` ``((name, function), ...)`` are those functions:
    no subclass replaced one of the compiled hooks' Python faces."""
    tp = type(obj)
    for name, function in faces:
        if getattr(tp, name, None) is not function:
            return False
    return True


cdef class RecorderCore(Hook):
    """The base of :class:`~pycoll.diagnostics.FlightRecorder`: what its per-operation hook reads, as C
    struct members (``FlightRecorder.__init__`` and ``configure`` set them)."""
    cdef public list _ring
    cdef public dict _infos
    cdef public long long _next_pos
    cdef public bint stacks
    cdef public int stack_depth
    cdef _Frames _scratch  # where a stack is captured before it is swapped into its entry
    cdef object _last_comm_info  # the _infos entry of the communicator recorded last (None: look it up)
    cdef RecordIds _last_rid  # its record ids (set with the entry: no attribute lookup per operation)
    cdef size_t _last_comm  # that communicator's address (its id)
    cdef dict _threads  # thread state id (never reused, unlike a thread's ident) -> (ident, name) at its first record
    cdef unsigned long long _last_ts  # the thread that recorded last: its state's id (0: none yet), ident and name
    cdef unsigned long _last_tid
    cdef object _last_tname

    def __cinit__(self, *args, **kwargs):
        self._ring = []
        self._infos = {}
        self._threads = {}
        self._scratch.n = -1

    def _infos_changed(self):
        """``_infos`` changed (a communicator mapped or forgotten): the next operation looks its communicator up."""
        self._last_comm_info = self._last_rid = None
        self._last_comm = 0

    def __dealloc__(self):
        _free(&self._scratch)

    @property
    def compiled_hooks(self):
        """True unless a subclass replaced ``work_enqueued`` or ``work_completed``."""
        return _faces_are(self, (("work_enqueued", recorder_work_enqueued), ("work_completed", recorder_work_completed)))

    cdef int enqueued(self, Work w) except -1:
        """Record one operation (called for every enqueued :class:`~pycoll.Work`)."""
        cdef list ring = self._ring
        cdef Py_ssize_t n = len(ring)
        cdef Entry e
        cdef _Frames old
        cdef long long pos, rid, kept
        cdef unsigned long long ts
        cdef unsigned long tid
        if n == 0:
            return 0
        comm = w.comm
        # comm_created maps every communicator when it is made, so an id found here is that of this
        # communicator (a reused id is remapped by the new communicator's comm_created)
        if self._last_comm == <size_t><PyObject*>comm:  # 0 (never an address) while the info is unset
            info = self._last_comm_info
        else:
            info = self._infos.get(id(comm))
            if info is None:
                info = self._info(comm)
            self._last_comm_info, self._last_comm, self._last_rid = info, <size_t><PyObject*>comm, info.rid
        pos = self._next_pos
        self._next_pos = pos + 1
        slot = ring[pos % n]
        if slot is None:
            slot = ring[pos % n] = Entry()
        e = <Entry>slot
        rid = self._last_rid.next_id
        self._last_rid.next_id = rid + 1
        if w.peer is None and w.op in TORCH_COLLECTIVES:  # counted as it is recorded: known also after a wrap
            kept = rid - self._last_rid.left_out
        else:
            self._last_rid.left_out += 1
            kept = -1
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
        capture = w.capture_id
        frozen = None if capture is None else _CAPTURED
        # the stack_depth innermost Python frames, as the dump shows them: from the caller of a compiled public
        # call (all_reduce, ...) on, or from the public call's own frame where it is written in Python (barrier).
        # Capturing may create frame objects, hence run the collector: done before the entry is touched
        ts = PyThreadState_GetID(PyThreadState_Get())
        if ts == self._last_ts:
            tid, tname = self._last_tid, self._last_tname
        else:
            tid, tname = self._thread_changed(ts)
        if self.stacks:
            _reserve(&self._scratch, self.stack_depth)
            self._scratch.n = pycoll_frames(self._scratch.codes, self._scratch.lastis, 0, self.stack_depth)
        # the entry, written whole without allocating: a reader (a dump, in another thread) needs the GIL
        e.pos = pos
        e.rid = rid
        e.kept = kept
        e.info = info
        e.isz, e.idt, e.osz, e.odt = isz, idt, osz, odt
        e._tid, e._tname = tid, tname
        e.op, e.seq, e.p2p_seq, e.op_id, e.peer, e.root = w.op, w.seq, w.p2p_seq, w.op_id, w.peer, w.root
        e.timeout, e.created, e._frozen, e.capture = w.timeout, w.time_created_ns, frozen, capture
        e._completed, e._t_started, e._t_completed, e._has_ms = False, 0, 0, False
        old = e._frames
        e._frames = self._scratch
        self._scratch = old
        _release(&self._scratch)  # the stack the entry held before
        w.fr_entry = e
        w.fr_pos = pos
        return 0

    cdef tuple _thread_changed(self, unsigned long long ts):
        """Another thread than the last records: its ``(ident, name)``, looked up at its first record (a name read
        at dump time named whichever thread had the ident then, or nobody once the thread had ended)."""
        known = self._threads.get(ts)
        if known is None:
            if len(self._threads) >= 4096:  # a program of many short-lived threads: the ended ones' go
                self._threads.clear()
            known = self._threads[ts] = (PyThread_get_thread_ident(), threading.current_thread().name)
        self._last_tid, self._last_tname = known
        self._last_ts = ts
        return known

    cdef int completed(self, Work w) except -1:
        """Freeze a completed operation's times into its entry (the communicator calls it when one completes)."""
        cdef Entry e
        if w.fr_entry is not None:
            e = <Entry>w.fr_entry
            if e.pos == w.fr_pos:
                e._completed, e._t_started, e._t_completed = True, w._t_started, w._t_completed
                e._ms, e._has_ms = w._ms, w._has_ms
        return 0


cdef class WatchdogCore(Hook):
    """The base of :class:`~pycoll.diagnostics.Watchdog`: what its per-operation hooks read, as C struct
    members (``Watchdog.__init__`` and its polling thread set them)."""
    cdef public double _next_due, _wake_at
    cdef public object _poll_wake

    @property
    def compiled_hooks(self):
        """True unless a subclass replaced ``work_enqueued`` or ``work_completed`` (which the watchdog leaves
        to :class:`pycoll.hooks.CommObserver`)."""
        return _faces_are(self, (("work_enqueued", watchdog_work_enqueued),
                                 ("work_completed", CommObserver.work_completed)))

    cdef int enqueued(self, Work w) except -1:
        """An operation due before the sleeping polling thread's planned wake-up wakes it: no interval delays a
        timeout. While the thread scans (``_wake_at`` 0) the operation's deadline only lowers ``_next_due``, which the
        thread reads again after it has published its next wake-up and before it sleeps: woken by every
        operation issued during a scan, it would scan again at once, and under a steady stream of operations
        never sleep. Without a polling thread (``_wake_at`` < 0: stopped, disabled) there is nothing to wake."""
        cdef double due = w.t0 + <double>w.timeout
        if due < self._next_due:
            self._next_due = due
        cdef double wake_at = self._wake_at
        if wake_at > 0 and due < wake_at:
            self._poll_wake.set()
        return 0


# The parameters are named as CommObserver's (``work``): these are its methods, callable by keyword too.
def recorder_work_enqueued(RecorderCore self, Work work):
    """Record one operation (``FlightRecorder.work_enqueued``)."""
    self.enqueued(work)


def recorder_work_completed(RecorderCore self, Work work):
    """Freeze a completed operation's times into its entry (``FlightRecorder.work_completed``)."""
    self.completed(work)


def watchdog_work_enqueued(WatchdogCore self, Work work):
    """Wake the polling thread if ``work`` is due before its next round (``Watchdog.work_enqueued``)."""
    self.enqueued(work)
