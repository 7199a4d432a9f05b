# Result codes -> exceptions (included by _nccl.pyx).
#
# Every wrapper calls its function the same three-line way:
#
#     _need(self, <void*>self.fn.ncclCommCount, "ncclCommCount")    # NotSupported if not exported
#     with nogil: _cap(&self.fn, c, &cr, self.fn.ncclCommCount(c, &v))  # the call, then its error text
#     _done(self, &cr, "ncclCommCount")    # or _check, which lets IN_PROGRESS through

cdef struct _Call:
    int r              # the ncclResult_t the call returned
    char text[1024]    # ncclGetLastError, copied right after a failed call


cdef int _missing(Library lib, str name) except -1:
    if name.startswith("pycoll"):
        raise NotSupported(name, "", lib.path, "a pycoll host library function")
    raise NotSupported(name, FUNCTIONS.get(name, ""), lib.path)


cdef inline int _need(Library lib, void* fp, str name) except -1:
    """Raise NotSupported (naming the NCCL release that added ``name``) when ``fp`` is NULL."""
    if fp == NULL:
        _missing(lib, name)
    return 0


cdef inline void _cap(const pycoll_nccl_table* t, ncclComm_t comm, _Call* cr, int r) noexcept nogil:
    """Keep ``r`` and, for a failure, ncclGetLastError (before another call can overwrite it)."""
    cdef const char* s
    cr.r = r
    cr.text[0] = 0
    if r == ncclSuccess or r == ncclInProgress or t.ncclGetLastError == NULL:
        return
    s = t.ncclGetLastError(comm)
    if s != NULL:
        strncpy(cr.text, s, sizeof(cr.text) - 1)
        cr.text[sizeof(cr.text) - 1] = 0


cdef int _check(Library lib, _Call* cr, str function) except -1:
    """Return SUCCESS or IN_PROGRESS; raise the NCCLError subclass of any other result."""
    cdef int r = cr.r
    if r == ncclSuccess or r == ncclInProgress:
        return r
    raise _errors.error_class(r)(r, function, _error_string(lib, r), _decode(cr.text), lib.path)


cdef int _done(Library lib, _Call* cr, str function) except -1:
    """Like _check, for calls whose output is only valid on success: IN_PROGRESS raises."""
    cdef int r = _check(lib, cr, function)
    if r == ncclInProgress:
        raise _errors.InProgressError(
            r, function, _error_string(lib, r),
            # a host stream's or event's (CUDA's cudaErrorNotReady) has no communicator to poll
            "the events have not completed yet: host_event_synchronize (or poll host_event_query) and retry"
            if function.startswith("pycollEvent") else
            "the call returned ncclInProgress, so its output is not available yet; poll "
            "comm_get_async_error and retry", lib.path)
    return r


cdef int _check_new(Library lib, _Call* cr, str function, uintptr_t comm, bint done) except -1:
    """_done (or _check) for a call creating a communicator: the error raised carries ``comm``,
    non-zero when NCCL left one behind (the caller aborts it)."""
    try:
        return _done(lib, cr, function) if done else _check(lib, cr, function)
    except _errors.NCCLError as exc:
        exc.comm = comm
        raise


cdef str _error_string(Library lib, int r):
    cdef const char* s
    if lib.fn.ncclGetErrorString == NULL:
        return ""
    with nogil:
        s = lib.fn.ncclGetErrorString(<ncclResult_t>r)
    return _decode(s)
