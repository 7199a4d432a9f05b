from cpython.ref cimport PyObject


# The compiled Work, for the compiled observer hooks (pycoll/diagnostics/_hooks.pyx) that read its fields.

cdef class _Shared:  # the events of consecutive operations of one group (_core.pyx)
    cdef object start, end
    cdef int users
    cdef bint done
    cdef int timed
    cdef float ms


cdef class Work:
    cdef public object comm, op, async_op, is_p2p, peer, root, timeout, stream
    cdef public object peers  # every peer of a one-sided wait for several (wait_signal's rows); None: ``peer`` alone
    cdef public long long seq, p2p_seq, op_id, time_created_ns  # C: no int object made per operation
    cdef public double t0  # its deadline counts from here: its issue (enqueue; the end of the group that held it)
    cdef public bint grouped  # it waits in an open group(): not issued yet (no events looked at, no deadline)
    cdef public object inputs, outputs
    # an asynchronous operation's torch tensors: (Buffer, its storage, written, the tensor's data pointer) held from
    # its issue until it retires; what the retirement found their memory became (a message), else None
    cdef public object _kept, _moved
    # time_started_ns, time_completed_ns, duration_ms (properties: None where unset) as C values: no objects made
    cdef long long _t_started, _t_completed  # wall-clock ns; 0: not yet
    cdef double _ms  # the events' elapsed time, where _has_ms
    cdef bint _has_ms
    cdef public object _start, _end, _state, _exc, capture_id, fr_entry
    cdef public long long fr_pos  # the position its flight-recorder entry was written for (entries are reused)
    cdef _Shared _share  # the events it shares with its neighbours in a group, or None
    # its place among its communicator's outstanding operations (Outstanding): the next one (held), the one before
    # (borrowed: the chain holds it) and the list holding it (only compared), NULL when none
    cdef Work _next
    cdef PyObject* _prev
    cdef PyObject* _listed
    cdef object __weakref__


# A communicator's outstanding operations, oldest first: a list through the Works (no hashing, no allocation).

cdef class Outstanding:
    cdef Work head
    cdef PyObject* tail
    cdef readonly Py_ssize_t n
    cdef int add(self, Work w) except -1
    cdef bint discard(self, Work w) noexcept


# An observer whose per-operation hooks are compiled: the path calls them without a Python call.

cdef class Hook:
    cdef int enqueued(self, Work w) except -1
    cdef int completed(self, Work w) except -1


# The fields of a Communicator that every operation reads: C struct members, not instance-dict entries.

from pycoll._bindings._nccl cimport CudaDriver, Library


cdef extern from "<semaphore.h>" nogil:
    ctypedef struct sem_t:
        pass


cdef class Lock:
    cdef sem_t _sem
    cdef bint _held
    cdef unsigned long _holder  # the thread that took it (0: none)
    cdef bint _no_self_wait  # a communicator's: its holder waiting for it again raises (nobody else releases it)
    cdef bint take(self, double timeout) except -1
    cdef int give(self) except -1


cdef class RLock(Lock):
    cdef long _owner
    cdef long _count
    cdef bint take(self, double timeout) except -1
    cdef int give(self) except -1


cdef class CommCore:
    cdef readonly RLock _lock
    cdef readonly Lock _plock, _hlock
    cdef public object _handle, library, device, name, timeout, backend, _rank, _size
    cdef public Outstanding _pending  # its outstanding operations, oldest first
    cdef public object _events, _failure, _state, _stream
    cdef public unsigned long _user  # the ident of the thread inside an operation of it now (0: none)
    cdef public long long _coll_seq, _p2p_seq, _last_op_id
    cdef public unsigned long _owner  # the ident of the thread that has it (0: none yet, or handed off)
    cdef public int _stream_mode
    cdef public bint _guard_device
    cdef object _dev_seen  # the device the two facts below were read from
    cdef Library _hostlib  # its host library (None: another kind of device)
    cdef CudaDriver _driver  # its CUDA device's driver table (None: another kind of device, or none)
    cdef int _cudev  # the driver's handle of its CUDA device
    cdef bint _timed  # its events measure time
    cdef Py_ssize_t _depth  # its host library's PYCOLL_HOST_STREAM_DEPTH (0: no bound, or not a host device)
    cdef Py_ssize_t _pool_low  # the fewest events its pool held since its last look at the pool (_trim_pool)
    cdef Py_ssize_t _pool_retired  # operations retired since the last _TRIM_EVERY-th
    cdef double _pool_since  # when that look was (monotonic s)
