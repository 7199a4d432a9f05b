# HostLibrary: pycoll's host library, a Library plus its own streams and events (pycoll_host.h;
# included by _nccl.pyx).

cdef class HostLibrary(Library):
    """The pycoll host library (``load("host")``, or any library exporting pycollHostGetVersion).

    A :class:`Library` whose ``host_*`` methods drive the host library's streams and events
    (ordered queues with their own threads, the CPU stand-in for CUDA streams and events). On
    any other Library the same ``host_*`` names check their arguments and then raise NotSupported.
    """

    def host_version(self):
        """pycollHostGetVersion: the host library's own version (major*10000+minor*100+patch)."""
        cdef int v = 0
        cdef _Call cr
        _need(self, <void*>self.fn.pycollHostGetVersion, "pycollHostGetVersion")
        with nogil: _cap(&self.fn, NULL, &cr, self.fn.pycollHostGetVersion(&v))
        _done(self, &cr, "pycollHostGetVersion")
        return v

    def host_stream_create(self):
        """pycollStreamCreate: a new host stream handle (an ordered queue with its own thread)."""
        cdef pycollStream_t s = NULL
        cdef _Call cr
        _need(self, <void*>self.fn.pycollStreamCreate, "pycollStreamCreate")
        with nogil: _cap(&self.fn, NULL, &cr, self.fn.pycollStreamCreate(&s))
        _done(self, &cr, "pycollStreamCreate")
        return <uintptr_t>s

    def host_stream_destroy(self, stream):
        """pycollStreamDestroy: wait for the enqueued work, then free the stream."""
        cdef pycollStream_t s = <pycollStream_t>_handle(stream, "stream")
        cdef _Call cr
        _need(self, <void*>self.fn.pycollStreamDestroy, "pycollStreamDestroy")
        with nogil: _cap(&self.fn, NULL, &cr, self.fn.pycollStreamDestroy(s))
        _done(self, &cr, "pycollStreamDestroy")

    def host_stream_synchronize(self, stream):
        """pycollStreamSynchronize: block (GIL released) until the stream's work has run."""
        cdef pycollStream_t s = <pycollStream_t>_handle(stream, "stream")
        cdef _Call cr
        _need(self, <void*>self.fn.pycollStreamSynchronize, "pycollStreamSynchronize")
        with nogil: _cap(&self.fn, NULL, &cr, self.fn.pycollStreamSynchronize(s))
        _done(self, &cr, "pycollStreamSynchronize")

    def host_stream_query(self, stream):
        """pycollStreamQuery: True when everything enqueued has run."""
        cdef pycollStream_t s = <pycollStream_t>_handle(stream, "stream")
        cdef _Call cr
        _need(self, <void*>self.fn.pycollStreamQuery, "pycollStreamQuery")
        with nogil: _cap(&self.fn, NULL, &cr, self.fn.pycollStreamQuery(s))
        return _check(self, &cr, "pycollStreamQuery") == ncclSuccess

    def host_stream_wait_event(self, stream, event):
        """pycollStreamWaitEvent: later work on ``stream`` waits for ``event``."""
        cdef pycollStream_t s = <pycollStream_t>_handle(stream, "stream")
        cdef pycollEvent_t ev = <pycollEvent_t>_handle(event, "event")
        cdef _Call cr
        _need(self, <void*>self.fn.pycollStreamWaitEvent, "pycollStreamWaitEvent")
        with nogil: _cap(&self.fn, NULL, &cr, self.fn.pycollStreamWaitEvent(s, ev))
        _done(self, &cr, "pycollStreamWaitEvent")

    def host_event_create(self):
        """pycollEventCreate: a new host event handle."""
        cdef pycollEvent_t ev = NULL
        cdef _Call cr
        _need(self, <void*>self.fn.pycollEventCreate, "pycollEventCreate")
        with nogil: _cap(&self.fn, NULL, &cr, self.fn.pycollEventCreate(&ev))
        _done(self, &cr, "pycollEventCreate")
        return <uintptr_t>ev

    def host_event_destroy(self, event):
        """pycollEventDestroy."""
        cdef pycollEvent_t ev = <pycollEvent_t>_handle(event, "event")
        cdef _Call cr
        _need(self, <void*>self.fn.pycollEventDestroy, "pycollEventDestroy")
        with nogil: _cap(&self.fn, NULL, &cr, self.fn.pycollEventDestroy(ev))
        _done(self, &cr, "pycollEventDestroy")

    def host_event_record(self, event, stream):
        """pycollEventRecord: the event completes when the stream's earlier work has run
        (stream 0: at once)."""
        cdef pycollEvent_t ev = <pycollEvent_t>_handle(event, "event")
        cdef pycollStream_t s = <pycollStream_t>_addr(stream, "stream")
        cdef _Call cr
        _need(self, <void*>self.fn.pycollEventRecord, "pycollEventRecord")
        with nogil: _cap(&self.fn, NULL, &cr, self.fn.pycollEventRecord(ev, s))
        _done(self, &cr, "pycollEventRecord")

    def host_event_query(self, event):
        """pycollEventQuery: True when complete (or never recorded)."""
        cdef pycollEvent_t ev = <pycollEvent_t>_handle(event, "event")
        cdef _Call cr
        _need(self, <void*>self.fn.pycollEventQuery, "pycollEventQuery")
        with nogil: _cap(&self.fn, NULL, &cr, self.fn.pycollEventQuery(ev))
        return _check(self, &cr, "pycollEventQuery") == ncclSuccess

    def host_event_synchronize(self, event):
        """pycollEventSynchronize: block (GIL released) until the event completes."""
        cdef pycollEvent_t ev = <pycollEvent_t>_handle(event, "event")
        cdef _Call cr
        _need(self, <void*>self.fn.pycollEventSynchronize, "pycollEventSynchronize")
        with nogil: _cap(&self.fn, NULL, &cr, self.fn.pycollEventSynchronize(ev))
        _done(self, &cr, "pycollEventSynchronize")

    def host_event_elapsed_ms(self, start, end):
        """pycollEventElapsedTime: milliseconds between two completed events."""
        cdef pycollEvent_t a = <pycollEvent_t>_handle(start, "start")
        cdef pycollEvent_t b = <pycollEvent_t>_handle(end, "end")
        cdef float ms = 0
        cdef _Call cr
        _need(self, <void*>self.fn.pycollEventElapsedTime, "pycollEventElapsedTime")
        with nogil: _cap(&self.fn, NULL, &cr, self.fn.pycollEventElapsedTime(&ms, a, b))
        _done(self, &cr, "pycollEventElapsedTime")
        return ms


#: host_* name -> HostLibrary function, which Library.__getattr__ binds to any other library.
_HOST_METHODS = {name: value for name, value in vars(HostLibrary).items() if name.startswith("host_")}
