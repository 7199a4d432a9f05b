# The compiled Work, for the compiled observer hooks (pycoll/diagnostics/_hooks.pyx) that read its fields.

cdef class Work:
    cdef public object comm, op, seq, p2p_seq, op_id, async_op, is_p2p, peer, timeout, stream
    cdef public object inputs, outputs, time_created_ns, t0, time_started_ns, time_completed_ns, duration_ms
    cdef public object _start, _end, _state, _exc, capture_id, fr_entry
    cdef object __weakref__
