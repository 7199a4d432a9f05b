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

    def host_stream_create(self, flags=0):
        """pycollStreamCreateWithFlags: a new host stream handle (an ordered queue with its own thread).

        ``flags``: ``HOST_STREAM_INLINE`` lets work submitted while the stream is idle run in the
        caller's thread (in stream order).
        """
        cdef pycollStream_t s = NULL
        cdef _Call cr
        cdef int f = _cint(flags, "flags", 0)
        if f == 0:
            _need(self, <void*>self.fn.pycollStreamCreate, "pycollStreamCreate")
            with nogil: _cap(&self.fn, NULL, &cr, self.fn.pycollStreamCreate(&s))
            _done(self, &cr, "pycollStreamCreate")
            return <uintptr_t>s
        _need(self, <void*>self.fn.pycollStreamCreateWithFlags, "pycollStreamCreateWithFlags")
        with nogil: _cap(&self.fn, NULL, &cr, self.fn.pycollStreamCreateWithFlags(&s, f))
        _done(self, &cr, "pycollStreamCreateWithFlags")
        return <uintptr_t>s

    def host_stream_set_flags(self, stream, flags):
        """pycollStreamSetFlags: change a stream's flags (``HOST_STREAM_INLINE``, ``HOST_STREAM_HELP``, or 0)."""
        cdef pycollStream_t s = <pycollStream_t>_handle(stream, "stream")
        cdef int f = _cint(flags, "flags", 0)
        cdef _Call cr
        _need(self, <void*>self.fn.pycollStreamSetFlags, "pycollStreamSetFlags")
        with nogil: _cap(&self.fn, NULL, &cr, self.fn.pycollStreamSetFlags(s, f))
        _done(self, &cr, "pycollStreamSetFlags")

    def host_event_wait(self, event, timeout, bint run=False):
        """pycollEventWait: block (GIL released) until ``event`` completes or ``timeout`` seconds
        pass; True when it completed. ``run``: pycollEventWaitRun -- on a stream flagged
        ``HOST_STREAM_HELP`` this thread first runs the work queued before the event that the stream's
        thread has not begun, within ``timeout`` (what is unfinished then goes back to the stream, left
        to the next such wait for ``PYCOLL_HOST_DEFER_NS`` before the stream's thread takes it)."""
        cdef pycollEvent_t ev = <pycollEvent_t>_handle(event, "event")
        cdef uint64_t ns
        cdef _Call cr
        ns = _timeout_ns(timeout)
        if run:
            _need(self, <void*>self.fn.pycollEventWaitRun, "pycollEventWaitRun")
            with nogil: _cap(&self.fn, NULL, &cr, self.fn.pycollEventWaitRun(ev, ns))
            return _check(self, &cr, "pycollEventWaitRun") == ncclSuccess
        _need(self, <void*>self.fn.pycollEventWait, "pycollEventWait")
        with nogil: _cap(&self.fn, NULL, &cr, self.fn.pycollEventWait(ev, ns))
        return _check(self, &cr, "pycollEventWait") == ncclSuccess

    def comm_wait_ready(self, comm, timeout):
        """pycollCommWaitReady: block (GIL released) until ``comm``'s asynchronous state
        (:meth:`comm_get_async_error`) is no longer ncclInProgress -- a nonblocking init, split,
        shrink, grow, finalize or revoke has ended -- or ``timeout`` seconds pass; True when it
        ended. The state itself is then read with :meth:`comm_get_async_error`."""
        cdef ncclComm_t c = _comm(comm)
        cdef uint64_t ns
        cdef _Call cr
        ns = _timeout_ns(timeout)
        _need(self, <void*>self.fn.pycollCommWaitReady, "pycollCommWaitReady")
        with nogil: _cap(&self.fn, NULL, &cr, self.fn.pycollCommWaitReady(c, ns))
        return _check(self, &cr, "pycollCommWaitReady") == ncclSuccess

    def comm_peer_open(self, comm, int peer):
        """pycollCommPeerOpen: how many sends, receives, puts and signals with rank ``peer`` this rank enqueued on
        ``comm`` (in an open group too) have not finished; 0 once its part with that peer is done, whatever else
        still runs. A wait_signal (it waits for several peers) is not counted."""
        cdef ncclComm_t c = _comm(comm)
        cdef int count = 0
        cdef _Call cr
        _need(self, <void*>self.fn.pycollCommPeerOpen, "pycollCommPeerOpen")
        with nogil: _cap(&self.fn, NULL, &cr, self.fn.pycollCommPeerOpen(c, peer, &count))
        _check(self, &cr, "pycollCommPeerOpen")
        return count

    def comm_peer_process(self, comm, int peer):
        """pycollCommPeerProcess: rank ``peer``'s process as it joined ``comm``: ``(pid, start, pidns)`` -- its start
        time in clock ticks since boot (/proc/<pid>/stat's field 22) and its pid namespace's inode."""
        cdef ncclComm_t c = _comm(comm)
        cdef int pid = 0
        cdef uint64_t start = 0, pidns = 0
        cdef _Call cr
        _need(self, <void*>self.fn.pycollCommPeerProcess, "pycollCommPeerProcess")
        with nogil: _cap(&self.fn, NULL, &cr, self.fn.pycollCommPeerProcess(c, peer, &pid, &start, &pidns))
        _check(self, &cr, "pycollCommPeerProcess")
        return pid, start, pidns

    def comm_events_clean(self, comm, start, end):
        """pycollCommEventsClean: whether the operation of ``comm`` between the events ``start`` and ``end`` has
        completed without failing -- ``end`` completed before ``comm``'s asynchronous state became an error (always,
        where it is none), or, both recorded on one stream, no operation of that stream ended failed between them."""
        cdef ncclComm_t c = _comm(comm)
        cdef pycollEvent_t a = <pycollEvent_t>_handle(start, "start")
        cdef pycollEvent_t b = <pycollEvent_t>_handle(end, "end")
        cdef int clean = 0
        cdef _Call cr
        _need(self, <void*>self.fn.pycollCommEventsClean, "pycollCommEventsClean")
        with nogil: _cap(&self.fn, NULL, &cr, self.fn.pycollCommEventsClean(c, a, b, &clean))
        _check(self, &cr, "pycollCommEventsClean")
        return bool(clean)

    def comm_note_failure(self, comm, str text not None):
        """pycollCommNoteFailure: why this rank is about to abort or revoke ``comm`` (a failure found outside the
        library): its peers' errors then name it (the first 195 bytes of ``text``, UTF-8)."""
        cdef ncclComm_t c = _comm(comm)
        cdef bytes raw = text.encode("utf-8", "replace").replace(b"\0", b" ")
        cdef const char* p = raw
        cdef _Call cr
        _need(self, <void*>self.fn.pycollCommNoteFailure, "pycollCommNoteFailure")
        with nogil: _cap(&self.fn, NULL, &cr, self.fn.pycollCommNoteFailure(c, p))
        _check(self, &cr, "pycollCommNoteFailure")

    def host_event_arm(self, event):
        """pycollEventArm: make ``event`` incomplete until :meth:`host_event_fire` (streams waiting on it stop)."""
        cdef pycollEvent_t ev = <pycollEvent_t>_handle(event, "event")
        cdef _Call cr
        _need(self, <void*>self.fn.pycollEventArm, "pycollEventArm")
        with nogil: _cap(&self.fn, NULL, &cr, self.fn.pycollEventArm(ev))
        _done(self, &cr, "pycollEventArm")

    def host_event_fire(self, event):
        """pycollEventFire: complete an armed event, from any thread."""
        cdef pycollEvent_t ev = <pycollEvent_t>_handle(event, "event")
        cdef _Call cr
        _need(self, <void*>self.fn.pycollEventFire, "pycollEventFire")
        with nogil: _cap(&self.fn, NULL, &cr, self.fn.pycollEventFire(ev))
        _done(self, &cr, "pycollEventFire")

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

    def host_stream_wait_room(self, stream, timeout):
        """pycollStreamWaitRoom: block (GIL released) until ``stream`` holds fewer than ``PYCOLL_HOST_STREAM_DEPTH``
        operations not begun, or ``timeout`` seconds pass; True when it has room (a call queuing one more would not
        wait for it)."""
        cdef pycollStream_t s = <pycollStream_t>_handle(stream, "stream")
        cdef uint64_t ns
        cdef _Call cr
        ns = _timeout_ns(timeout)
        _need(self, <void*>self.fn.pycollStreamWaitRoom, "pycollStreamWaitRoom")
        with nogil: _cap(&self.fn, NULL, &cr, self.fn.pycollStreamWaitRoom(s, ns))
        return _check(self, &cr, "pycollStreamWaitRoom") == ncclSuccess

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
        _cap(&self.fn, NULL, &cr, self.fn.pycollEventRecord(ev, s))  # never blocks: the GIL stays
        _done(self, &cr, "pycollEventRecord")

    def host_event_query(self, event):
        """pycollEventQuery: True when complete (or never recorded)."""
        cdef pycollEvent_t ev = <pycollEvent_t>_handle(event, "event")
        cdef _Call cr
        _need(self, <void*>self.fn.pycollEventQuery, "pycollEventQuery")
        _cap(&self.fn, NULL, &cr, self.fn.pycollEventQuery(ev))  # never blocks: the GIL stays
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

    def host_stream_set_legacy(self, stream):
        """pycollStreamSetLegacy: stream handles 0 and 1 mean ``stream`` from now on, 2 the calling thread's
        own blocking stream, and blocking streams synchronise with it (the emulated GPU); 0 restores the host
        backend's meaning."""
        cdef pycollStream_t s = <pycollStream_t>_addr(stream, "stream")
        cdef _Call cr
        _need(self, <void*>self.fn.pycollStreamSetLegacy, "pycollStreamSetLegacy")
        with nogil: _cap(&self.fn, NULL, &cr, self.fn.pycollStreamSetLegacy(s))
        _done(self, &cr, "pycollStreamSetLegacy")

    def host_stream_resolve(self, stream):
        """pycollStreamResolve: the stream a handle (0, 1, 2 or a stream) means in the calling thread."""
        cdef pycollStream_t s = <pycollStream_t>_addr(stream, "stream")
        cdef pycollStream_t out = NULL
        cdef _Call cr
        _need(self, <void*>self.fn.pycollStreamResolve, "pycollStreamResolve")
        with nogil: _cap(&self.fn, NULL, &cr, self.fn.pycollStreamResolve(s, &out))
        _done(self, &cr, "pycollStreamResolve")
        return <uintptr_t>out

    def host_stream_begin_capture(self, stream):
        """pycollStreamBeginCapture: operations submitted to ``stream`` are recorded into a graph, not run."""
        cdef pycollStream_t s = <pycollStream_t>_handle(stream, "stream")
        cdef _Call cr
        _need(self, <void*>self.fn.pycollStreamBeginCapture, "pycollStreamBeginCapture")
        with nogil: _cap(&self.fn, NULL, &cr, self.fn.pycollStreamBeginCapture(s))
        _done(self, &cr, "pycollStreamBeginCapture")

    def host_stream_end_capture(self, stream):
        """pycollStreamEndCapture: end the capture; returns the graph handle."""
        cdef pycollStream_t s = <pycollStream_t>_handle(stream, "stream")
        cdef pycollGraph_t g = NULL
        cdef _Call cr
        _need(self, <void*>self.fn.pycollStreamEndCapture, "pycollStreamEndCapture")
        with nogil: _cap(&self.fn, NULL, &cr, self.fn.pycollStreamEndCapture(s, &g))
        _done(self, &cr, "pycollStreamEndCapture")
        return <uintptr_t>g

    def host_graph_launch(self, graph, stream):
        """pycollGraphLaunch: submit the graph's operations again, in order, to ``stream``."""
        cdef pycollGraph_t g = <pycollGraph_t>_handle(graph, "graph")
        cdef pycollStream_t s = <pycollStream_t>_handle(stream, "stream")
        cdef _Call cr
        _need(self, <void*>self.fn.pycollGraphLaunch, "pycollGraphLaunch")
        with nogil: _cap(&self.fn, NULL, &cr, self.fn.pycollGraphLaunch(g, s))
        _done(self, &cr, "pycollGraphLaunch")

    def host_graph_destroy(self, graph):
        """pycollGraphDestroy."""
        cdef pycollGraph_t g = <pycollGraph_t>_handle(graph, "graph")
        cdef _Call cr
        _need(self, <void*>self.fn.pycollGraphDestroy, "pycollGraphDestroy")
        with nogil: _cap(&self.fn, NULL, &cr, self.fn.pycollGraphDestroy(g))
        _done(self, &cr, "pycollGraphDestroy")


#: host_* name -> HostLibrary function, which Library.__getattr__ binds to any other library.
_HOST_METHODS = {name: value for name, value in vars(HostLibrary).items() if name.startswith("host_")}
