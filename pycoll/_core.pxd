# The compiled Work, for the compiled observer hooks (pycoll/diagnostics/_hooks.pyx) that read its fields.

cdef class Work:
    cdef public object comm, op, seq, p2p_seq, op_id, async_op, is_p2p, peer, timeout, stream
    cdef public object inputs, outputs, time_created_ns, t0, time_started_ns, time_completed_ns, duration_ms
    cdef public object _start, _end, _state, _exc, capture_id, fr_entry
    cdef object __weakref__


# The fields of a Communicator that every operation reads: C struct members, not instance-dict entries.

from cpython.pythread cimport PyThread_type_lock


cdef class Lock:
    cdef PyThread_type_lock _lk
    cdef bint _held
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
    cdef public object _pending, _events, _failure, _state, _stream, _user, _op_ids
    cdef public long long _coll_seq, _p2p_seq
    cdef public int _stream_mode
    cdef public bint _guard_device
