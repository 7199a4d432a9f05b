# The CUDA driver functions an operation's path calls per operation (included by _nccl.pyx): event record and
# query, a stream's capture status, the device of the current context. pycoll's CUDA device speaks to the runtime
# through cuda-bindings, whose Python layer costs about a microsecond a call; these are the same calls on the same
# handles (a cudaEvent_t is a CUevent, a cudaStream_t a CUstream), made from compiled code.

cdef int _CUDA_SUCCESS = 0

_cuda_lock = threading.Lock()
_cuda_driver = None  # the process's CudaDriver, once looked for (False: not available)


cdef class CudaDriver:
    """The CUDA driver's per-operation functions, as C function pointers (``_core`` calls them directly).

    :func:`cuda_driver` gives the process's table from ``libcuda.so.1``; :meth:`from_addresses`
    makes one from other functions of the same signatures (tests: the emulated GPU's runtime behind
    ctypes callbacks). The methods call the functions as the driver takes them and return its
    ``CUresult`` (0: success; ``CUDA_ERROR_NOT_READY``, 600, from :meth:`query` for an event not yet
    reached): stream 0 is the legacy default stream, ``CU_STREAM_LEGACY`` (1) too.
    """

    def __init__(self):
        raise TypeError("CudaDriver tables come from pycoll._bindings.cuda_driver() or CudaDriver.from_addresses()")

    @staticmethod
    def from_addresses(event_record, event_query, stream_is_capturing, ctx_get_device, device_get, *, keep=None,
                       str source="addresses"):
        """A table of the functions at these addresses (ints), with the signatures of ``cuEventRecord``,
        ``cuEventQuery``, ``cuStreamIsCapturing``, ``cuCtxGetDevice`` and ``cuDeviceGet``. ``keep``: an object
        the table holds while it lives (the functions' owner: ctypes callbacks must outlive it)."""
        cdef CudaDriver d = CudaDriver.__new__(CudaDriver)
        addresses = (event_record, event_query, stream_is_capturing, ctx_get_device, device_get)
        cdef uintptr_t a[5]
        for i, (name, address) in enumerate(zip(("event_record", "event_query", "stream_is_capturing",
                                                  "ctx_get_device", "device_get"), addresses)):
            a[i] = _addr(address, name)
            if a[i] == 0:
                raise ValueError(f"CudaDriver.from_addresses: {name} is NULL")
        d.event_record = <cu_event_record_fn>a[0]
        d.event_query = <cu_event_query_fn>a[1]
        d.stream_is_capturing = <cu_stream_is_capturing_fn>a[2]
        d.ctx_get_device = <cu_ctx_get_device_fn>a[3]
        d.device_get = <cu_device_get_fn>a[4]
        d.source = source
        d._keep = keep
        return d

    def record(self, event, stream):
        """``cuEventRecord(event, stream)``; its CUresult."""
        cdef void* e = <void*><uintptr_t>_addr(event, "event")
        cdef void* s = <void*><uintptr_t>_addr(stream, "stream")
        with nogil:
            r = self.event_record(e, s)
        return r

    def query(self, event):
        """``cuEventQuery(event)``; its CUresult (600 while the event is not reached)."""
        cdef void* e = <void*><uintptr_t>_addr(event, "event")
        with nogil:
            r = self.event_query(e)
        return r

    def capture_status(self, stream):
        """``cuStreamIsCapturing(stream)``: ``(CUresult, status)``, status 0 none, 1 active, 2 invalidated."""
        cdef void* s = <void*><uintptr_t>_addr(stream, "stream")
        cdef int status = 0
        with nogil:
            r = self.stream_is_capturing(s, &status)
        return r, status

    def current_device(self):
        """``cuCtxGetDevice``: ``(CUresult, device)``, the device of the calling thread's current context
        (``CUDA_ERROR_INVALID_CONTEXT``, 201, when it has none)."""
        cdef int device = -1
        with nogil:
            r = self.ctx_get_device(&device)
        return r, device

    def device_handle(self, int ordinal):
        """``cuDeviceGet(ordinal)``: ``(CUresult, device)``."""
        cdef int device = -1
        with nogil:
            r = self.device_get(&device, ordinal)
        return r, device

    def __repr__(self):
        return f"<CudaDriver from {self.source}>"


ctypedef int (*_cu_init_fn)(unsigned int flags) noexcept nogil


def cuda_driver():
    """This process's :class:`CudaDriver` from the CUDA driver library (``libcuda.so.1``, which the
    runtime, NCCL and the frameworks load too), or None where it cannot be loaded, lacks one of the
    functions or ``cuInit`` fails (no driver, no GPU). Looked for once; never raises."""
    global _cuda_driver
    cdef void* h
    cdef void* fns[6]
    with _cuda_lock:
        if _cuda_driver is None:
            _cuda_driver = False
            with nogil:
                h = dlopen(b"libcuda.so.1", RTLD_NOW | RTLD_LOCAL)
            if h == NULL:
                _log.debug("cuda_driver: %s", _decode(dlerror()))
                return None
            names = (b"cuInit", b"cuEventRecord", b"cuEventQuery", b"cuStreamIsCapturing", b"cuCtxGetDevice",
                     b"cuDeviceGet")
            for i, name in enumerate(names):
                fns[i] = dlsym(h, <const char*>name)
                if fns[i] == NULL:
                    dlerror()
                    _log.debug("cuda_driver: libcuda.so.1 has no %s", name.decode())
                    return None
            with nogil:
                r = (<_cu_init_fn>fns[0])(0)
            if r != _CUDA_SUCCESS:
                _log.debug("cuda_driver: cuInit failed (%d)", r)
                return None
            # the library stays loaded (its handle is never closed)
            _cuda_driver = CudaDriver.from_addresses(<uintptr_t>fns[1], <uintptr_t>fns[2], <uintptr_t>fns[3],
                                                     <uintptr_t>fns[4], <uintptr_t>fns[5], source="libcuda.so.1")
        return _cuda_driver or None
