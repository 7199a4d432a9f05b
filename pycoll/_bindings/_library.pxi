# Library: one loaded NCCL-ABI object and a wrapper per NCCL function (included by _nccl.pyx).

cdef class _GroupState:
    """A thread's group on one library: how deep, and the communicator slots made in it (None: none yet)."""


cdef class Library:
    """One loaded NCCL-ABI shared object and its symbol table (resolved with dlsym).

    Obtain one with :func:`load`. Every method releases the GIL around its C call (except the
    host library's non-blocking event record/query and async-error read); a method
    whose function the library lacks raises NotSupported; an ncclResult_t other than success or
    in-progress raises the matching pycoll.errors.NCCLError subclass with ncclGetLastError text.
    """

    def __init__(self, *args, **kwargs):
        raise TypeError("use pycoll._bindings.load() to get a Library")

    def __reduce__(self):
        return (load, (self.path,))

    def __repr__(self):
        major, minor, patch = version_tuple(self.version)
        return f"<Library {self.kind} {major}.{minor}.{patch} {self.path}>"

    def __getattr__(self, name):
        # only for names the class lacks: HostLibrary's host_* check their arguments, then raise NotSupported
        method = _HOST_METHODS.get(name)
        if method is None:
            raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")
        return method.__get__(self, type(self))

    cdef void* _sym(self, str name):
        cdef bytes bname = name.encode()
        cdef void* p = dlsym(self.handle, bname)
        dlerror()
        self._exported[name] = p != NULL
        return p

    # --- introspection ---------------------------------------------------------------------
    def has(self, function):
        """Whether the library exports ``function`` (any symbol name, e.g. "ncclCommShrink")."""
        if not isinstance(function, str):
            raise TypeError(f"function must be a str, not {type(function).__name__}")
        known = self._exported.get(function)
        if known is not None:
            return known
        return self._sym(function) != NULL

    @property
    def missing(self):
        """The declared NCCL functions (FUNCTIONS) this library does not export, sorted."""
        return sorted(name for name in FUNCTIONS if not self._exported.get(name, False))

    @property
    def version_tuple(self):
        """(major, minor, patch) of ``version``."""
        return version_tuple(self.version)

    @property
    def pending_slots(self):
        """CommSlots of nonblocking split/shrink/grow calls whose communicator was not seen yet, and those of
        communicators made in a group that ended IN_PROGRESS until their state is final (``comm_get_async_error``
        returned SUCCESS) or they were destroyed or aborted."""
        return list(self._pending_slots)

    @property
    def symbols(self):
        """name -> exported, for every function looked up so far."""
        return dict(self._exported)

    # --- errors and versions ---------------------------------------------------------------
    def get_version(self):
        """ncclGetVersion(): the library's version code (e.g. 23203 for 2.32.3)."""
        cdef int v = 0
        cdef _Call cr
        _need(self, <void*>self.fn.ncclGetVersion, "ncclGetVersion")
        with nogil: _cap(&self.fn, NULL, &cr, self.fn.ncclGetVersion(&v))
        _done(self, &cr, "ncclGetVersion")
        return v

    def get_error_string(self, result):
        """ncclGetErrorString(result)."""
        cdef int code = _cint(result, "result")
        _need(self, <void*>self.fn.ncclGetErrorString, "ncclGetErrorString")
        return _error_string(self, code)

    def get_last_error(self, comm=0):
        """ncclGetLastError(comm): the last error text (comm 0 = the process-wide one)."""
        cdef ncclComm_t c = _comm(comm)
        cdef const char* s
        _need(self, <void*>self.fn.ncclGetLastError, "ncclGetLastError")
        with nogil: s = self.fn.ncclGetLastError(c)
        return _decode(s)

    def comm_get_async_error(self, comm):
        """ncclCommGetAsyncError: the communicator's asynchronous result (SUCCESS, IN_PROGRESS or
        an error code), returned, not raised. Safe to call from a watchdog thread."""
        cdef ncclComm_t c = _comm(comm)
        cdef ncclResult_t state = ncclSuccess
        cdef _Call cr
        _need(self, <void*>self.fn.ncclCommGetAsyncError, "ncclCommGetAsyncError")
        if self.fn.pycollEventQuery != NULL:
            # pycoll's host library: a short, non-blocking read; keeping the GIL spares a thread
            # handoff on every completion (NCCL's may complete a group job: the GIL is released)
            _cap(&self.fn, c, &cr, self.fn.ncclCommGetAsyncError(c, &state))
        else:
            with nogil: _cap(&self.fn, c, &cr, self.fn.ncclCommGetAsyncError(c, &state))
        _done(self, &cr, "ncclCommGetAsyncError")
        if state != ncclInProgress and self._pending_slots:
            self._settle_slots(<uintptr_t>c, state)
        return <int>state

    cdef _settle_slots(self, uintptr_t comm, int state):
        """``comm``'s asynchronous state is final (``state``; ncclSuccess also where it was destroyed or aborted):
        the slots its split or shrink left empty (SPLIT_NOCOLOR, a failed call) stay empty, and a grouped init's
        slot holding ``comm`` itself -- the library writes NULL there only when its init fails -- is written for
        good once it succeeded; neither is pending any longer."""
        cdef CommSlot slot
        cdef uintptr_t v
        for slot in list(self._pending_slots):
            v = <uintptr_t>pycoll_load_ptr(<void**>slot.ptr)
            if (slot.parent == comm and v == 0) or (v == comm and state == ncclSuccess):
                slot._pending = False
                self._pending_slots.discard(slot)

    # --- unique ids and communicator creation ----------------------------------------------
    def get_unique_id(self):
        """ncclGetUniqueId (NCCL starts a bootstrap listener; set NCCL_SOCKET_IFNAME to choose
        its interface)."""
        cdef UniqueId uid = UniqueId()
        cdef _Call cr
        _need(self, <void*>self.fn.ncclGetUniqueId, "ncclGetUniqueId")
        with nogil: _cap(&self.fn, NULL, &cr, self.fn.ncclGetUniqueId(&uid.c))
        _done(self, &cr, "ncclGetUniqueId")
        return uid

    def comm_get_unique_id(self, comm):
        """ncclCommGetUniqueId: the id new ranks pass to comm_grow (one coordinator calls it)."""
        cdef ncclComm_t c = _comm(comm)
        cdef UniqueId uid = UniqueId()
        cdef _Call cr
        _need(self, <void*>self.fn.ncclCommGetUniqueId, "ncclCommGetUniqueId")
        with nogil: _cap(&self.fn, c, &cr, self.fn.ncclCommGetUniqueId(c, &uid.c))
        _done(self, &cr, "ncclCommGetUniqueId")
        return uid

    def comm_init_rank(self, nranks, unique_id, rank):
        """ncclCommInitRank (blocking): the new communicator handle.

        Should the library answer ncclInProgress (NCCL_COMM_BLOCKING=0 in the environment),
        InProgressError is raised with the still-initialising handle in its ``comm`` attribute:
        poll comm_get_async_error(e.comm) or comm_abort it. Use comm_init_rank_config for
        nonblocking init. Every error raised here carries ``comm`` (0 when none was created).
        """
        cdef int n = _cint(nranks, "nranks", 1)
        cdef int rk = _cint(rank, "rank", 0)
        cdef ncclUniqueId* uid = _uid_ptr(unique_id, "unique_id")
        cdef ncclComm_t c = NULL
        cdef ncclComm_t* out = &c
        cdef _Call cr
        if rk >= n:
            raise ValueError(f"rank must be < nranks ({n}), got {rk}")
        _need(self, <void*>self.fn.ncclCommInitRank, "ncclCommInitRank")
        if self._in_group():
            out = self._init_slot().ptr
        with nogil: _cap(&self.fn, NULL, &cr, self.fn.ncclCommInitRank(out, n, uid[0], rk))
        c = out[0]
        _check_new(self, &cr, "ncclCommInitRank", <uintptr_t>c, True)
        return <uintptr_t>c

    def comm_init_rank_config(self, nranks, unique_id, rank, config=None):
        """ncclCommInitRankConfig: ``(comm, status)``.

        With ``config.blocking = 0`` the status may be IN_PROGRESS: the handle is already valid;
        poll comm_get_async_error(comm) until it is no longer IN_PROGRESS before using it. An
        error raised here carries ``comm``: non-zero when NCCL left a (nonblocking) communicator
        behind, which the caller should comm_abort.
        """
        cdef int n = _cint(nranks, "nranks", 1)
        cdef int rk = _cint(rank, "rank", 0)
        cdef ncclUniqueId* uid = _uid_ptr(unique_id, "unique_id")
        cdef ncclConfig_t* cfg = _config_ptr(config)
        cdef ncclComm_t c = NULL
        cdef ncclComm_t* out = &c
        cdef _Call cr
        if rk >= n:
            raise ValueError(f"rank must be < nranks ({n}), got {rk}")
        _need(self, <void*>self.fn.ncclCommInitRankConfig, "ncclCommInitRankConfig")
        if self._in_group():
            out = self._init_slot().ptr
        with nogil: _cap(&self.fn, NULL, &cr, self.fn.ncclCommInitRankConfig(out, n, uid[0], rk, cfg))
        c = out[0]
        status = _check_new(self, &cr, "ncclCommInitRankConfig", <uintptr_t>c, False)
        return (<uintptr_t>c, status)

    def comm_init_rank_scalable(self, nranks, rank, unique_ids, config=None):
        """ncclCommInitRankScalable with one or more unique ids: ``(comm, status)``."""
        cdef int n = _cint(nranks, "nranks", 1)
        cdef int rk = _cint(rank, "rank", 0)
        cdef ncclConfig_t* cfg = _config_ptr(config)
        cdef ncclComm_t c = NULL
        cdef ncclComm_t* out = &c
        cdef ncclUniqueId* ids
        cdef int nid
        cdef _Call cr
        if rk >= n:
            raise ValueError(f"rank must be < nranks ({n}), got {rk}")
        ids_list = _unique_id_list(unique_ids, n)
        _need(self, <void*>self.fn.ncclCommInitRankScalable, "ncclCommInitRankScalable")
        nid = len(ids_list)
        if self._in_group():
            out = self._init_slot().ptr
        ids = _unique_id_array(ids_list)
        try:
            with nogil: _cap(&self.fn, NULL, &cr, self.fn.ncclCommInitRankScalable(out, n, rk, nid, ids, cfg))
        finally:
            free(ids)  # NCCL copies the ids before it returns
        c = out[0]
        status = _check_new(self, &cr, "ncclCommInitRankScalable", <uintptr_t>c, False)
        return (<uintptr_t>c, status)

    def comm_init_all(self, ndev, devlist=None):
        """ncclCommInitAll: one communicator per device of this process (devlist None = 0..ndev-1).

        Blocking, unless NCCL_COMM_BLOCKING=0 in the environment makes them nonblocking: the library
        then answers ncclInProgress with every handle valid, and InProgressError is raised with them
        in its ``comms`` attribute: poll comm_get_async_error on each, or comm_abort them all.
        """
        cdef int n = _cint(ndev, "ndev", 1)
        cdef ncclComm_t* comms
        cdef int* devs = NULL
        cdef int i
        cdef _Call cr
        devs_list = None if devlist is None else _devlist(devlist, n)
        _need(self, <void*>self.fn.ncclCommInitAll, "ncclCommInitAll")
        comms = <ncclComm_t*>calloc(n, sizeof(ncclComm_t))
        if comms == NULL:
            raise MemoryError()
        try:
            if devs_list is not None:
                devs = _int_array(devs_list)
            with nogil: _cap(&self.fn, NULL, &cr, self.fn.ncclCommInitAll(comms, n, devs))
            result = [<uintptr_t>comms[i] for i in range(n)]
        finally:
            free(comms)
            free(devs)
        try:
            _done(self, &cr, "ncclCommInitAll")
        except _errors.NCCLError as exc:
            exc.comms = result
            raise
        return result

    def comm_split(self, comm, color, key, config=None):
        """ncclCommSplit (every rank of ``comm`` calls it): ``(slot, status)``.

        ``color`` is >= 0, or SPLIT_NOCOLOR for a rank that joins no new communicator (its slot
        stays 0). On a nonblocking parent the status may be IN_PROGRESS: poll
        comm_get_async_error(parent) and read ``slot.value`` when it is done.
        """
        cdef ncclComm_t c = _comm(comm)
        cdef int col = _cint(color, "color")
        cdef int ky = _cint(key, "key")
        cdef ncclConfig_t* cfg = _config_ptr(config)
        cdef CommSlot slot
        cdef _Call cr
        if col < 0 and col != NCCL_SPLIT_NOCOLOR:
            raise ValueError(f"color must be >= 0 or SPLIT_NOCOLOR (-1), got {col}")
        _need(self, <void*>self.fn.ncclCommSplit, "ncclCommSplit")
        slot = _new_slot(self, config)
        slot.parent = <uintptr_t>c
        with nogil: _cap(&self.fn, c, &cr, self.fn.ncclCommSplit(c, col, ky, slot.ptr, cfg))
        self._track(slot, cr.r)
        return (slot, _check(self, &cr, "ncclCommSplit"))

    def comm_shrink(self, comm, exclude_ranks, config=None, flags=0):
        """ncclCommShrink: ``(slot, status)``. Only the surviving ranks call it, all with the same
        ``exclude_ranks`` (at least one rank). ``flags``: SHRINK_DEFAULT, or SHRINK_ABORT to
        abort the parent's outstanding operations first (use it after an error)."""
        cdef ncclComm_t c = _comm(comm)
        cdef ncclConfig_t* cfg = _config_ptr(config)
        cdef int fl = _cint(flags, "flags", 0)
        cdef CommSlot slot
        cdef int n
        cdef _Call cr
        ranks = _exclude_ranks(exclude_ranks)
        _need(self, <void*>self.fn.ncclCommShrink, "ncclCommShrink")
        n = len(ranks)
        slot = _new_slot(self, config)
        slot.exclude = _int_array(ranks)  # NCCL sorts it in place, maybe in the background
        slot.parent = <uintptr_t>c
        with nogil: _cap(&self.fn, c, &cr, self.fn.ncclCommShrink(c, slot.exclude, n, slot.ptr, cfg, fl))
        self._track(slot, cr.r)
        return (slot, _check(self, &cr, "ncclCommShrink"))

    def comm_grow(self, comm, nranks, unique_id, rank, config=None):
        """ncclCommGrow: ``(slot, status)``.

        Existing ranks: ``comm`` = the parent, ``rank`` = -1, ``unique_id`` = the id from
        comm_get_unique_id on the coordinator, None elsewhere. New ranks: ``comm`` = 0 (or None),
        ``rank`` = their new rank (>= the parent's size), ``unique_id`` = the coordinator's id.
        On a nonblocking communicator ``slot.value`` is set at once and the new communicator is
        polled with comm_get_async_error.
        """
        cdef ncclComm_t c = NULL if comm is None else _comm(comm)
        cdef int n = _cint(nranks, "nranks", 1)
        cdef int rk = _cint(rank, "rank", -1)
        cdef ncclConfig_t* cfg = _config_ptr(config)
        cdef ncclUniqueId* src = NULL if unique_id is None else _uid_ptr(unique_id, "unique_id")
        cdef CommSlot slot
        cdef _Call cr
        if rk >= n:
            raise ValueError(f"rank must be < nranks ({n}), got {rk}")
        if c == NULL and (rk < 0 or src == NULL):
            raise ValueError("a new rank (comm 0) needs rank >= 0 and the coordinator's unique_id")
        if c != NULL and rk != -1:
            raise ValueError(f"an existing rank (comm given) passes rank -1, got {rk}")
        _need(self, <void*>self.fn.ncclCommGrow, "ncclCommGrow")
        slot = _new_slot(self, config)
        if src != NULL:
            slot.uid = _uid_copy(src)
        with nogil: _cap(&self.fn, c, &cr, self.fn.ncclCommGrow(c, n, slot.uid, rk, slot.ptr, cfg))
        if cr.r == ncclInProgress:
            slot.keep_uid = True  # NCCL may read it until the new communicator is ready
        self._track(slot, cr.r)
        return (slot, _check(self, &cr, "ncclCommGrow"))

    cdef _track(self, CommSlot slot, int r):
        if self._in_group():  # the library writes the slot at ncclGroupEnd: kept until the group has ended
            self._group_slot(slot)
        elif r == ncclInProgress:
            slot._pending = True
            self._pending_slots.add(slot)

    cdef bint _in_group(self):
        """A group (group_start) is open on this thread."""
        return self._group_state().depth > 0

    cdef _group_slot(self, CommSlot slot):
        """Keep ``slot`` until this thread's open group has ended."""
        cdef _GroupState g = self._group_state()
        if g.slots is None:
            g.slots = []
        g.slots.append(slot)

    cdef CommSlot _init_slot(self):
        """Where a communicator init inside an open group writes its handle: heap memory the Library keeps until
        the group has ended (the library may write it then: NULL after a failed init), not the caller's stack."""
        cdef CommSlot slot = _new_slot(self, None)
        self._group_slot(slot)
        return slot

    # --- teardown and state ----------------------------------------------------------------
    def comm_finalize(self, comm):
        """ncclCommFinalize: flush outstanding work (collective in effect); status."""
        cdef ncclComm_t c = _comm(comm)
        cdef _Call cr
        _need(self, <void*>self.fn.ncclCommFinalize, "ncclCommFinalize")
        with nogil: _cap(&self.fn, c, &cr, self.fn.ncclCommFinalize(c))
        return _check(self, &cr, "ncclCommFinalize")

    def comm_destroy(self, comm):
        """ncclCommDestroy: free the communicator (an intra-node collective if not finalized);
        never use the handle afterwards."""
        cdef ncclComm_t c = _comm(comm)
        cdef _Call cr
        _need(self, <void*>self.fn.ncclCommDestroy, "ncclCommDestroy")
        with nogil: _cap(&self.fn, NULL, &cr, self.fn.ncclCommDestroy(c))
        # freed: a grouped init's slot holding it is never written again (refused: a split or shrink of it still
        # in progress may still write its slot, which must stay alive)
        if self._pending_slots and c != NULL and cr.r == ncclSuccess:
            self._settle_slots(<uintptr_t>c, ncclSuccess)
        return _check(self, &cr, "ncclCommDestroy")

    def comm_abort(self, comm):
        """ncclCommAbort: stop outstanding work and free the communicator. May be called from
        another thread while one is inside a call on the same communicator (NCCL >= 2.19)."""
        cdef ncclComm_t c = _comm(comm)
        cdef _Call cr
        _need(self, <void*>self.fn.ncclCommAbort, "ncclCommAbort")
        with nogil: _cap(&self.fn, NULL, &cr, self.fn.ncclCommAbort(c))
        # freed: a grouped init's slot holding it is never written again (refused: a split or shrink of it still
        # in progress may still write its slot, which must stay alive)
        if self._pending_slots and c != NULL and cr.r == ncclSuccess:
            self._settle_slots(<uintptr_t>c, ncclSuccess)
        return _check(self, &cr, "ncclCommAbort")

    def comm_revoke(self, comm, flags=0):
        """ncclCommRevoke: stop in-flight work without destroying (local); ``flags`` must be
        REVOKE_DEFAULT. Status; IN_PROGRESS until quiescent (poll comm_get_async_error)."""
        cdef ncclComm_t c = _comm(comm)
        cdef int fl = _cint(flags, "flags", 0)
        cdef _Call cr
        _need(self, <void*>self.fn.ncclCommRevoke, "ncclCommRevoke")
        with nogil: _cap(&self.fn, c, &cr, self.fn.ncclCommRevoke(c, fl))
        return _check(self, &cr, "ncclCommRevoke")

    def comm_suspend(self, comm, flags=SUSPEND_MEM):
        """ncclCommSuspend (default flags: SUSPEND_MEM); status."""
        cdef ncclComm_t c = _comm(comm)
        cdef int fl = _cint(flags, "flags", 0)
        cdef _Call cr
        _need(self, <void*>self.fn.ncclCommSuspend, "ncclCommSuspend")
        with nogil: _cap(&self.fn, c, &cr, self.fn.ncclCommSuspend(c, fl))
        return _check(self, &cr, "ncclCommSuspend")

    def comm_resume(self, comm):
        """ncclCommResume; status."""
        cdef ncclComm_t c = _comm(comm)
        cdef _Call cr
        _need(self, <void*>self.fn.ncclCommResume, "ncclCommResume")
        with nogil: _cap(&self.fn, c, &cr, self.fn.ncclCommResume(c))
        return _check(self, &cr, "ncclCommResume")

    def comm_mem_stats(self, comm, stat):
        """ncclCommMemStats: the value of one CommMemStat (bytes, or 0/1 for GpuMemSuspended)."""
        cdef ncclComm_t c = _comm(comm)
        cdef int s = _cint(stat, "stat", 0, 3)
        cdef uint64_t value = 0
        cdef _Call cr
        _need(self, <void*>self.fn.ncclCommMemStats, "ncclCommMemStats")
        with nogil: _cap(&self.fn, c, &cr, self.fn.ncclCommMemStats(c, <ncclCommMemStat_t>s, &value))
        _done(self, &cr, "ncclCommMemStats")
        return value

    # --- queries ---------------------------------------------------------------------------
    def comm_count(self, comm):
        """ncclCommCount: the number of ranks."""
        cdef ncclComm_t c = _comm(comm)
        cdef int v = 0
        cdef _Call cr
        _need(self, <void*>self.fn.ncclCommCount, "ncclCommCount")
        with nogil: _cap(&self.fn, c, &cr, self.fn.ncclCommCount(c, &v))
        _done(self, &cr, "ncclCommCount")
        return v

    def comm_cu_device(self, comm):
        """ncclCommCuDevice: the device the communicator runs on."""
        cdef ncclComm_t c = _comm(comm)
        cdef int v = 0
        cdef _Call cr
        _need(self, <void*>self.fn.ncclCommCuDevice, "ncclCommCuDevice")
        with nogil: _cap(&self.fn, c, &cr, self.fn.ncclCommCuDevice(c, &v))
        _done(self, &cr, "ncclCommCuDevice")
        return v

    def comm_user_rank(self, comm):
        """ncclCommUserRank: this process's rank."""
        cdef ncclComm_t c = _comm(comm)
        cdef int v = 0
        cdef _Call cr
        _need(self, <void*>self.fn.ncclCommUserRank, "ncclCommUserRank")
        with nogil: _cap(&self.fn, c, &cr, self.fn.ncclCommUserRank(c, &v))
        _done(self, &cr, "ncclCommUserRank")
        return v

    # --- memory, registration, windows -----------------------------------------------------
    def mem_alloc(self, size):
        """ncclMemAlloc: ``size`` bytes of device memory suited to NCCL; the address."""
        cdef size_t n = _count(size, "size")
        cdef void* p = NULL
        cdef _Call cr
        _need(self, <void*>self.fn.ncclMemAlloc, "ncclMemAlloc")
        with nogil: _cap(&self.fn, NULL, &cr, self.fn.ncclMemAlloc(&p, n))
        _done(self, &cr, "ncclMemAlloc")
        return <uintptr_t>p

    def mem_free(self, ptr):
        """ncclMemFree(ptr)."""
        cdef void* p = _ptr(ptr, "ptr")
        cdef _Call cr
        _need(self, <void*>self.fn.ncclMemFree, "ncclMemFree")
        with nogil: _cap(&self.fn, NULL, &cr, self.fn.ncclMemFree(p))
        _done(self, &cr, "ncclMemFree")

    def comm_register(self, comm, buff, size):
        """ncclCommRegister: register ``size`` bytes at ``buff``; the registration handle."""
        cdef ncclComm_t c = _comm(comm)
        cdef void* b = _ptr(buff, "buff")
        cdef size_t n = _count(size, "size")
        cdef void* handle = NULL
        cdef _Call cr
        _need(self, <void*>self.fn.ncclCommRegister, "ncclCommRegister")
        with nogil: _cap(&self.fn, c, &cr, self.fn.ncclCommRegister(c, b, n, &handle))
        _done(self, &cr, "ncclCommRegister")
        return <uintptr_t>handle

    def comm_deregister(self, comm, handle):
        """ncclCommDeregister; status."""
        cdef ncclComm_t c = _comm(comm)
        cdef void* h = _ptr(handle, "handle")
        cdef _Call cr
        _need(self, <void*>self.fn.ncclCommDeregister, "ncclCommDeregister")
        with nogil: _cap(&self.fn, c, &cr, self.fn.ncclCommDeregister(c, h))
        return _check(self, &cr, "ncclCommDeregister")

    def comm_window_register(self, comm, buff, size, flags=0):
        """ncclCommWindowRegister (collective): ``(window, status)``; ``flags`` are WIN_*."""
        cdef ncclComm_t c = _comm(comm)
        cdef void* b = _ptr(buff, "buff")
        cdef size_t n = _count(size, "size")
        cdef int fl = _cint(flags, "flags", 0)
        cdef ncclWindow_t win = NULL
        cdef _Call cr
        _need(self, <void*>self.fn.ncclCommWindowRegister, "ncclCommWindowRegister")
        with nogil: _cap(&self.fn, c, &cr, self.fn.ncclCommWindowRegister(c, b, n, &win, fl))
        status = _check(self, &cr, "ncclCommWindowRegister")
        return (<uintptr_t>win, status)

    def comm_window_deregister(self, comm, window):
        """ncclCommWindowDeregister; status."""
        cdef ncclComm_t c = _comm(comm)
        cdef ncclWindow_t w = <ncclWindow_t>_addr(window, "window")
        cdef _Call cr
        _need(self, <void*>self.fn.ncclCommWindowDeregister, "ncclCommWindowDeregister")
        with nogil: _cap(&self.fn, c, &cr, self.fn.ncclCommWindowDeregister(c, w))
        return _check(self, &cr, "ncclCommWindowDeregister")

    def win_get_user_ptr(self, comm, window):
        """ncclWinGetUserPtr: the user address a window was registered with."""
        cdef ncclComm_t c = _comm(comm)
        cdef ncclWindow_t w = <ncclWindow_t>_addr(window, "window")
        cdef void* p = NULL
        cdef _Call cr
        _need(self, <void*>self.fn.ncclWinGetUserPtr, "ncclWinGetUserPtr")
        with nogil: _cap(&self.fn, c, &cr, self.fn.ncclWinGetUserPtr(c, w, &p))
        _done(self, &cr, "ncclWinGetUserPtr")
        return <uintptr_t>p

    # --- reduction operators -----------------------------------------------------------------
    def red_op_create_pre_mul_sum(self, scalar, datatype, residence, comm):
        """ncclRedOpCreatePreMulSum: a dynamic op id (>= 5) for ``comm``.

        ``scalar`` is the address of one element of ``datatype``: host memory read at once for
        ScalarResidence.HostImmediate, device memory read at each collective for Device.
        """
        cdef void* s = _ptr(scalar, "scalar")
        cdef ncclDataType_t dt = <ncclDataType_t>_dtype(datatype)
        cdef int res = _cint(residence, "residence", 0, 1)
        cdef ncclComm_t c = _comm(comm)
        cdef ncclRedOp_t op = ncclSum
        cdef _Call cr
        if s == NULL:
            raise ValueError("scalar must be the address of the scalar, not 0")
        _need(self, <void*>self.fn.ncclRedOpCreatePreMulSum, "ncclRedOpCreatePreMulSum")
        with nogil: _cap(&self.fn, c, &cr, self.fn.ncclRedOpCreatePreMulSum(&op, s, dt, <ncclScalarResidence_t>res, c))
        _done(self, &cr, "ncclRedOpCreatePreMulSum")
        return <int>op

    def red_op_destroy(self, op, comm):
        """ncclRedOpDestroy; status."""
        cdef ncclRedOp_t o = <ncclRedOp_t>_op(op)
        cdef ncclComm_t c = _comm(comm)
        cdef _Call cr
        _need(self, <void*>self.fn.ncclRedOpDestroy, "ncclRedOpDestroy")
        with nogil: _cap(&self.fn, c, &cr, self.fn.ncclRedOpDestroy(o, c))
        return _check(self, &cr, "ncclRedOpDestroy")

    # --- collectives (buffers are addresses, stream a raw handle; each returns the status) ----
    def all_reduce(self, sendbuff, recvbuff, count, datatype, op, comm, stream=0, config=None):
        """ncclAllReduce of ``count`` elements; status.
        A CollConfig ``config`` calls ncclAllReduceConfig (NCCL 2.31+) instead."""
        cdef const void* sb = _ptr(sendbuff, "sendbuff")
        cdef void* rb = _ptr(recvbuff, "recvbuff")
        cdef size_t n = _count(count, "count")
        cdef ncclDataType_t dt = <ncclDataType_t>_dtype(datatype)
        cdef ncclRedOp_t o = <ncclRedOp_t>_op(op)
        cdef ncclComm_t c = _comm(comm)
        cdef cudaStream_t st = _ptr(stream, "stream")
        cdef const ncclCollConfig_t* cc = _coll_config_ptr(config)
        cdef _Call cr
        if cc == NULL:
            _need(self, <void*>self.fn.ncclAllReduce, "ncclAllReduce")
            with nogil: _cap(&self.fn, c, &cr, self.fn.ncclAllReduce(sb, rb, n, dt, o, c, st))
            return _check(self, &cr, "ncclAllReduce")
        _need(self, <void*>self.fn.ncclAllReduceConfig, "ncclAllReduceConfig")
        with nogil: _cap(&self.fn, c, &cr, self.fn.ncclAllReduceConfig(sb, rb, n, dt, o, c, st, cc))
        return _check(self, &cr, "ncclAllReduceConfig")

    def broadcast(self, sendbuff, recvbuff, count, datatype, root, comm, stream=0, config=None):
        """ncclBroadcast of ``count`` elements from ``root``; status.
        A CollConfig ``config`` calls ncclBroadcastConfig (NCCL 2.31+) instead."""
        cdef const void* sb = _ptr(sendbuff, "sendbuff")
        cdef void* rb = _ptr(recvbuff, "recvbuff")
        cdef size_t n = _count(count, "count")
        cdef ncclDataType_t dt = <ncclDataType_t>_dtype(datatype)
        cdef int rt = _cint(root, "root", 0)
        cdef ncclComm_t c = _comm(comm)
        cdef cudaStream_t st = _ptr(stream, "stream")
        cdef const ncclCollConfig_t* cc = _coll_config_ptr(config)
        cdef _Call cr
        if cc == NULL:
            _need(self, <void*>self.fn.ncclBroadcast, "ncclBroadcast")
            with nogil: _cap(&self.fn, c, &cr, self.fn.ncclBroadcast(sb, rb, n, dt, rt, c, st))
            return _check(self, &cr, "ncclBroadcast")
        _need(self, <void*>self.fn.ncclBroadcastConfig, "ncclBroadcastConfig")
        with nogil: _cap(&self.fn, c, &cr, self.fn.ncclBroadcastConfig(sb, rb, n, dt, rt, c, st, cc))
        return _check(self, &cr, "ncclBroadcastConfig")

    def bcast(self, buff, count, datatype, root, comm, stream=0):
        """ncclBcast (in place, deprecated by NCCL in favour of broadcast); status."""
        cdef void* b = _ptr(buff, "buff")
        cdef size_t n = _count(count, "count")
        cdef ncclDataType_t dt = <ncclDataType_t>_dtype(datatype)
        cdef int rt = _cint(root, "root", 0)
        cdef ncclComm_t c = _comm(comm)
        cdef cudaStream_t st = _ptr(stream, "stream")
        cdef _Call cr
        _need(self, <void*>self.fn.ncclBcast, "ncclBcast")
        with nogil: _cap(&self.fn, c, &cr, self.fn.ncclBcast(b, n, dt, rt, c, st))
        return _check(self, &cr, "ncclBcast")

    def reduce(self, sendbuff, recvbuff, count, datatype, op, root, comm, stream=0, config=None):
        """ncclReduce of ``count`` elements to ``root``; status.
        A CollConfig ``config`` calls ncclReduceConfig (NCCL 2.31+) instead."""
        cdef const void* sb = _ptr(sendbuff, "sendbuff")
        cdef void* rb = _ptr(recvbuff, "recvbuff")
        cdef size_t n = _count(count, "count")
        cdef ncclDataType_t dt = <ncclDataType_t>_dtype(datatype)
        cdef ncclRedOp_t o = <ncclRedOp_t>_op(op)
        cdef int rt = _cint(root, "root", 0)
        cdef ncclComm_t c = _comm(comm)
        cdef cudaStream_t st = _ptr(stream, "stream")
        cdef const ncclCollConfig_t* cc = _coll_config_ptr(config)
        cdef _Call cr
        if cc == NULL:
            _need(self, <void*>self.fn.ncclReduce, "ncclReduce")
            with nogil: _cap(&self.fn, c, &cr, self.fn.ncclReduce(sb, rb, n, dt, o, rt, c, st))
            return _check(self, &cr, "ncclReduce")
        _need(self, <void*>self.fn.ncclReduceConfig, "ncclReduceConfig")
        with nogil: _cap(&self.fn, c, &cr, self.fn.ncclReduceConfig(sb, rb, n, dt, o, rt, c, st, cc))
        return _check(self, &cr, "ncclReduceConfig")

    def all_gather(self, sendbuff, recvbuff, sendcount, datatype, comm, stream=0, config=None):
        """ncclAllGather: ``sendcount`` elements from each rank; status.
        A CollConfig ``config`` calls ncclAllGatherConfig (NCCL 2.31+) instead."""
        cdef const void* sb = _ptr(sendbuff, "sendbuff")
        cdef void* rb = _ptr(recvbuff, "recvbuff")
        cdef size_t n = _count(sendcount, "sendcount")
        cdef ncclDataType_t dt = <ncclDataType_t>_dtype(datatype)
        cdef ncclComm_t c = _comm(comm)
        cdef cudaStream_t st = _ptr(stream, "stream")
        cdef const ncclCollConfig_t* cc = _coll_config_ptr(config)
        cdef _Call cr
        if cc == NULL:
            _need(self, <void*>self.fn.ncclAllGather, "ncclAllGather")
            with nogil: _cap(&self.fn, c, &cr, self.fn.ncclAllGather(sb, rb, n, dt, c, st))
            return _check(self, &cr, "ncclAllGather")
        _need(self, <void*>self.fn.ncclAllGatherConfig, "ncclAllGatherConfig")
        with nogil: _cap(&self.fn, c, &cr, self.fn.ncclAllGatherConfig(sb, rb, n, dt, c, st, cc))
        return _check(self, &cr, "ncclAllGatherConfig")

    def reduce_scatter(self, sendbuff, recvbuff, recvcount, datatype, op, comm, stream=0, config=None):
        """ncclReduceScatter: ``recvcount`` elements to each rank; status.
        A CollConfig ``config`` calls ncclReduceScatterConfig (NCCL 2.31+) instead."""
        cdef const void* sb = _ptr(sendbuff, "sendbuff")
        cdef void* rb = _ptr(recvbuff, "recvbuff")
        cdef size_t n = _count(recvcount, "recvcount")
        cdef ncclDataType_t dt = <ncclDataType_t>_dtype(datatype)
        cdef ncclRedOp_t o = <ncclRedOp_t>_op(op)
        cdef ncclComm_t c = _comm(comm)
        cdef cudaStream_t st = _ptr(stream, "stream")
        cdef const ncclCollConfig_t* cc = _coll_config_ptr(config)
        cdef _Call cr
        if cc == NULL:
            _need(self, <void*>self.fn.ncclReduceScatter, "ncclReduceScatter")
            with nogil: _cap(&self.fn, c, &cr, self.fn.ncclReduceScatter(sb, rb, n, dt, o, c, st))
            return _check(self, &cr, "ncclReduceScatter")
        _need(self, <void*>self.fn.ncclReduceScatterConfig, "ncclReduceScatterConfig")
        with nogil: _cap(&self.fn, c, &cr, self.fn.ncclReduceScatterConfig(sb, rb, n, dt, o, c, st, cc))
        return _check(self, &cr, "ncclReduceScatterConfig")

    def all_to_all(self, sendbuff, recvbuff, count, datatype, comm, stream=0, config=None):
        """ncclAlltoAll: ``count`` elements to and from each rank; status.
        A CollConfig ``config`` calls ncclAlltoAllConfig (NCCL 2.31+) instead."""
        cdef const void* sb = _ptr(sendbuff, "sendbuff")
        cdef void* rb = _ptr(recvbuff, "recvbuff")
        cdef size_t n = _count(count, "count")
        cdef ncclDataType_t dt = <ncclDataType_t>_dtype(datatype)
        cdef ncclComm_t c = _comm(comm)
        cdef cudaStream_t st = _ptr(stream, "stream")
        cdef const ncclCollConfig_t* cc = _coll_config_ptr(config)
        cdef _Call cr
        if cc == NULL:
            _need(self, <void*>self.fn.ncclAlltoAll, "ncclAlltoAll")
            with nogil: _cap(&self.fn, c, &cr, self.fn.ncclAlltoAll(sb, rb, n, dt, c, st))
            return _check(self, &cr, "ncclAlltoAll")
        _need(self, <void*>self.fn.ncclAlltoAllConfig, "ncclAlltoAllConfig")
        with nogil: _cap(&self.fn, c, &cr, self.fn.ncclAlltoAllConfig(sb, rb, n, dt, c, st, cc))
        return _check(self, &cr, "ncclAlltoAllConfig")

    def gather(self, sendbuff, recvbuff, count, datatype, root, comm, stream=0, config=None):
        """ncclGather: ``count`` elements from each rank to ``root``; status.
        A CollConfig ``config`` calls ncclGatherConfig (NCCL 2.31+) instead."""
        cdef const void* sb = _ptr(sendbuff, "sendbuff")
        cdef void* rb = _ptr(recvbuff, "recvbuff")
        cdef size_t n = _count(count, "count")
        cdef ncclDataType_t dt = <ncclDataType_t>_dtype(datatype)
        cdef int rt = _cint(root, "root", 0)
        cdef ncclComm_t c = _comm(comm)
        cdef cudaStream_t st = _ptr(stream, "stream")
        cdef const ncclCollConfig_t* cc = _coll_config_ptr(config)
        cdef _Call cr
        if cc == NULL:
            _need(self, <void*>self.fn.ncclGather, "ncclGather")
            with nogil: _cap(&self.fn, c, &cr, self.fn.ncclGather(sb, rb, n, dt, rt, c, st))
            return _check(self, &cr, "ncclGather")
        _need(self, <void*>self.fn.ncclGatherConfig, "ncclGatherConfig")
        with nogil: _cap(&self.fn, c, &cr, self.fn.ncclGatherConfig(sb, rb, n, dt, rt, c, st, cc))
        return _check(self, &cr, "ncclGatherConfig")

    def scatter(self, sendbuff, recvbuff, count, datatype, root, comm, stream=0, config=None):
        """ncclScatter: ``count`` elements from ``root`` to each rank; status.
        A CollConfig ``config`` calls ncclScatterConfig (NCCL 2.31+) instead."""
        cdef const void* sb = _ptr(sendbuff, "sendbuff")
        cdef void* rb = _ptr(recvbuff, "recvbuff")
        cdef size_t n = _count(count, "count")
        cdef ncclDataType_t dt = <ncclDataType_t>_dtype(datatype)
        cdef int rt = _cint(root, "root", 0)
        cdef ncclComm_t c = _comm(comm)
        cdef cudaStream_t st = _ptr(stream, "stream")
        cdef const ncclCollConfig_t* cc = _coll_config_ptr(config)
        cdef _Call cr
        if cc == NULL:
            _need(self, <void*>self.fn.ncclScatter, "ncclScatter")
            with nogil: _cap(&self.fn, c, &cr, self.fn.ncclScatter(sb, rb, n, dt, rt, c, st))
            return _check(self, &cr, "ncclScatter")
        _need(self, <void*>self.fn.ncclScatterConfig, "ncclScatterConfig")
        with nogil: _cap(&self.fn, c, &cr, self.fn.ncclScatterConfig(sb, rb, n, dt, rt, c, st, cc))
        return _check(self, &cr, "ncclScatterConfig")

    def send(self, sendbuff, count, datatype, peer, comm, stream=0):
        """ncclSend of ``count`` elements to ``peer``; status."""
        cdef const void* sb = _ptr(sendbuff, "sendbuff")
        cdef size_t n = _count(count, "count")
        cdef ncclDataType_t dt = <ncclDataType_t>_dtype(datatype)
        cdef int p = _cint(peer, "peer", 0)
        cdef ncclComm_t c = _comm(comm)
        cdef cudaStream_t st = _ptr(stream, "stream")
        cdef _Call cr
        _need(self, <void*>self.fn.ncclSend, "ncclSend")
        with nogil: _cap(&self.fn, c, &cr, self.fn.ncclSend(sb, n, dt, p, c, st))
        return _check(self, &cr, "ncclSend")

    def recv(self, recvbuff, count, datatype, peer, comm, stream=0):
        """ncclRecv of ``count`` elements from ``peer``; status."""
        cdef void* rb = _ptr(recvbuff, "recvbuff")
        cdef size_t n = _count(count, "count")
        cdef ncclDataType_t dt = <ncclDataType_t>_dtype(datatype)
        cdef int p = _cint(peer, "peer", 0)
        cdef ncclComm_t c = _comm(comm)
        cdef cudaStream_t st = _ptr(stream, "stream")
        cdef _Call cr
        _need(self, <void*>self.fn.ncclRecv, "ncclRecv")
        with nogil: _cap(&self.fn, c, &cr, self.fn.ncclRecv(rb, n, dt, p, c, st))
        return _check(self, &cr, "ncclRecv")

    # --- one-sided (windows) ---------------------------------------------------------------
    def put_signal(self, localbuff, count, datatype, peer, window, offset, sig_idx, ctx, flags, comm, stream=0):
        """ncclPutSignal: write ``count`` elements into ``peer``'s ``window`` at byte ``offset``
        and signal it; status."""
        cdef const void* lb = _ptr(localbuff, "localbuff")
        cdef size_t n = _count(count, "count")
        cdef ncclDataType_t dt = <ncclDataType_t>_dtype(datatype)
        cdef int p = _cint(peer, "peer", 0)
        cdef ncclWindow_t w = <ncclWindow_t>_addr(window, "window")
        cdef size_t off = _count(offset, "offset")
        cdef int si = _cint(sig_idx, "sig_idx", 0)
        cdef int cx = _cint(ctx, "ctx", 0)
        cdef unsigned int fl = <unsigned int>_unsigned(flags, "flags")
        cdef ncclComm_t c = _comm(comm)
        cdef cudaStream_t st = _ptr(stream, "stream")
        cdef _Call cr
        _need(self, <void*>self.fn.ncclPutSignal, "ncclPutSignal")
        with nogil: _cap(&self.fn, c, &cr, self.fn.ncclPutSignal(lb, n, dt, p, w, off, si, cx, fl, c, st))
        return _check(self, &cr, "ncclPutSignal")

    def signal(self, peer, sig_idx, ctx, flags, comm, stream=0):
        """ncclSignal: signal ``peer`` without data; status."""
        cdef int p = _cint(peer, "peer", 0)
        cdef int si = _cint(sig_idx, "sig_idx", 0)
        cdef int cx = _cint(ctx, "ctx", 0)
        cdef unsigned int fl = <unsigned int>_unsigned(flags, "flags")
        cdef ncclComm_t c = _comm(comm)
        cdef cudaStream_t st = _ptr(stream, "stream")
        cdef _Call cr
        _need(self, <void*>self.fn.ncclSignal, "ncclSignal")
        with nogil: _cap(&self.fn, c, &cr, self.fn.ncclSignal(p, si, cx, fl, c, st))
        return _check(self, &cr, "ncclSignal")

    def wait_signal(self, descs, comm, stream=0):
        """ncclWaitSignal: ``descs`` is a sequence of (op_count, peer, sig_idx, ctx); status."""
        cdef ncclComm_t c = _comm(comm)
        cdef cudaStream_t st = _ptr(stream, "stream")
        cdef ncclWaitSignalDesc_t* d
        cdef int n
        cdef _Call cr
        rows = _signal_rows(descs)
        _need(self, <void*>self.fn.ncclWaitSignal, "ncclWaitSignal")
        n = len(rows)
        d = _signal_descs(rows)
        try:
            with nogil: _cap(&self.fn, c, &cr, self.fn.ncclWaitSignal(n, d, c, st))
        finally:
            free(d)
        return _check(self, &cr, "ncclWaitSignal")

    # --- groups ----------------------------------------------------------------------------
    def group_start(self):
        """ncclGroupStart; status."""
        return self._group_start()

    def group_end(self):
        """ncclGroupEnd; status (IN_PROGRESS when a nonblocking communicator is still issuing).

        The communicator slots of split/shrink/grow/init calls made in the group stay valid until the group has
        ended (the library writes them at ncclGroupEnd), and while a nonblocking group is still issuing, until
        their communicator is written."""
        return self._group_end()

    cdef int _group_start(self) except -1:
        """ncclGroupStart (``group_start``, and the Communicator's group, without a Python call)."""
        cdef _Call cr
        cdef _GroupState g = self._group_state()
        _need(self, <void*>self.fn.ncclGroupStart, "ncclGroupStart")
        _cap(&self.fn, NULL, &cr, self.fn.ncclGroupStart())  # a counter in NCCL: the GIL is kept
        status = _check(self, &cr, "ncclGroupStart")
        g.depth += 1
        if g.depth == 1:
            g.slots = None
        return status

    cdef int _group_end(self) except -1:
        """ncclGroupEnd (``group_end``, and the Communicator's group, without a Python call)."""
        cdef _Call cr
        _need(self, <void*>self.fn.ncclGroupEnd, "ncclGroupEnd")
        with nogil: _cap(&self.fn, NULL, &cr, self.fn.ncclGroupEnd())
        self._group_closed(cr.r)
        return _check(self, &cr, "ncclGroupEnd")

    cdef _group_closed(self, int r):
        """This thread's ncclGroupEnd or ncclGroupSimulateEnd returned ``r``: the group is one level less deep (also
        where it failed: the library closes it anyway); the outermost's slots are kept while it is still issuing
        (the library writes them later)."""
        cdef CommSlot slot
        cdef _GroupState g = self._group_state()
        cdef int depth = g.depth
        g.depth = max(0, depth - 1)
        if depth == 1:
            if r == ncclInProgress and g.slots is not None:
                for slot in g.slots:
                    self._track(slot, ncclInProgress)
            g.slots = None

    cdef _GroupState _group_state(self):
        """This thread's group on this library (a thread-local: gone with the thread). The last thread's is kept
        beside it under the id of that thread's state, which the interpreter never gives another thread: a group's
        start and end on one thread read no thread-local."""
        cdef unsigned long long tid = PyThreadState_GetID(PyThreadState_Get())
        if tid == self._gs_thread and self._gs_last is not None:
            return self._gs_last
        state = getattr(self._groups, "state", None)
        if state is None:
            state = self._groups.state = _GroupState()
        self._gs_thread, self._gs_last = tid, <_GroupState>state
        return <_GroupState>state

    def group_simulate_end(self):
        """ncclGroupSimulateEnd: the estimated time of the group (NCCL's unit, microseconds)."""
        cdef ncclSimInfo_t info = _sim_info()
        cdef _Call cr
        _need(self, <void*>self.fn.ncclGroupSimulateEnd, "ncclGroupSimulateEnd")
        with nogil: _cap(&self.fn, NULL, &cr, self.fn.ncclGroupSimulateEnd(&info))
        self._group_closed(cr.r)  # it ends the group as ncclGroupEnd does
        _done(self, &cr, "ncclGroupSimulateEnd")
        return info.estimatedTime

    def set_encryption(self, mode, psk=None):
        """ncclSetEncryption (NCCL 2.31+): mode 0 = none, 1 = pre-shared key ``psk``; status.
        Call it before creating communicators."""
        cdef ncclEncryptionConfig_t cfg
        cdef int m = _cint(mode, "mode", 0, 1)
        cdef bytes key = _c_string(psk, "psk")
        cdef _Call cr
        if m == 1 and not key:
            raise ValueError("mode 1 (PSK) needs a non-empty psk")
        cfg = _encryption_config(m, key)  # cfg.psk points into key, which outlives the call
        _need(self, <void*>self.fn.ncclSetEncryption, "ncclSetEncryption")
        with nogil: _cap(&self.fn, NULL, &cr, self.fn.ncclSetEncryption(&cfg))
        return _check(self, &cr, "ncclSetEncryption")

    # --- parameters --------------------------------------------------------------------------
    def param_get(self, key):
        """ncclParamGetParameter(key): the parameter's value as a string, or None if unknown."""
        cdef bytes k = _param_key(key)
        cdef const char* ck = k
        cdef const char* value = NULL
        cdef int length = 0
        cdef _Call cr
        _need(self, <void*>self.fn.ncclParamGetParameter, "ncclParamGetParameter")
        with nogil: _cap(&self.fn, NULL, &cr, self.fn.ncclParamGetParameter(ck, &value, &length))
        if cr.r == ncclInvalidArgument:
            return None
        _done(self, &cr, "ncclParamGetParameter")
        if value == NULL:
            return None
        return value[:length].decode("utf-8", "replace") if length > 0 else _decode(value)

    def param_keys(self):
        """ncclParamGetAllParameterKeys: the names of the parameters registered so far."""
        cdef const char** table = NULL
        cdef int n = 0
        cdef _Call cr
        _need(self, <void*>self.fn.ncclParamGetAllParameterKeys, "ncclParamGetAllParameterKeys")
        with nogil: _cap(&self.fn, NULL, &cr, self.fn.ncclParamGetAllParameterKeys(&table, &n))
        _done(self, &cr, "ncclParamGetAllParameterKeys")
        if table == NULL:
            return []
        return [_decode(table[i]) for i in range(n)]

    # --- device-API host functions, debug reset, typed parameters: the bodies are in _device.pxi ---
    def comm_query_properties(self, comm):
        """ncclCommQueryProperties (_device.pxi)."""
        return _comm_query_properties(self, comm)

    def dev_comm_create(self, comm, requirements=None):
        """ncclDevCommCreate (collective over ``comm``) (_device.pxi)."""
        return _dev_comm_create(self, comm, requirements)

    def dev_comm_destroy(self, comm, dev_comm):
        """ncclDevCommDestroy of a  (_device.pxi)."""
        return _dev_comm_destroy(self, comm, dev_comm)

    def get_lsa_multimem_device_pointer(self, window, offset):
        """ncclGetLsaMultimemDevicePointer (_device.pxi)."""
        return _get_lsa_multimem_device_pointer(self, window, offset)

    def get_multimem_device_pointer(self, window, offset, multimem):
        """ncclGetMultimemDevicePointer with a multimem handle (its ``mcBasePtr`` address). (_device.pxi)."""
        return _get_multimem_device_pointer(self, window, offset, multimem)

    def get_lsa_device_pointer(self, window, offset, lsa_rank):
        """ncclGetLsaDevicePointer (_device.pxi)."""
        return _get_lsa_device_pointer(self, window, offset, lsa_rank)

    def get_peer_device_pointer(self, window, offset, peer):
        """ncclGetPeerDevicePointer (_device.pxi)."""
        return _get_peer_device_pointer(self, window, offset, peer)

    def get_multimem_device_le_info(self, window, offset):
        """ncclGetMultimemDeviceLeInfo (_device.pxi)."""
        return _get_multimem_device_le_info(self, window, offset)

    def get_cft_device_le_info(self, window, offset, peer_cft, cft_team):
        """ncclGetCftDeviceLeInfo (_device.pxi)."""
        return _get_cft_device_le_info(self, window, offset, peer_cft, cft_team)

    def get_peer_device_le_info(self, window, offset, peer_world):
        """ncclGetPeerDeviceLeInfo (_device.pxi)."""
        return _get_peer_device_le_info(self, window, offset, peer_world)

    def team_world(self, comm):
        """ncclTeamWorld (_device.pxi)."""
        return _team_world(self, comm)

    def team_lsa(self, comm):
        """ncclTeamLsa (_device.pxi)."""
        return _team_lsa(self, comm)

    def team_cft(self, comm, mode=0):
        """ncclTeamCft(comm, mode) (_device.pxi)."""
        return _team_cft(self, comm, mode)

    def team_cft_multimem(self, comm):
        """ncclTeamCftMultimem (_device.pxi)."""
        return _team_cft_multimem(self, comm)

    def team_rail(self, comm):
        """ncclTeamRail (_device.pxi)."""
        return _team_rail(self, comm)

    def team_rank_to_world(self, comm, team, rank):
        """ncclTeamRankToWorld (_device.pxi)."""
        return _team_rank_to_world(self, comm, team, rank)

    def team_rank_to_lsa(self, comm, team, rank):
        """ncclTeamRankToLsa (_device.pxi)."""
        return _team_rank_to_lsa(self, comm, team, rank)

    def lsa_barrier_create_requirement(self, team, n_barriers):
        """ncclLsaBarrierCreateRequirement (_device.pxi)."""
        return _lsa_barrier_create_requirement(self, team, n_barriers)

    def gin_barrier_create_requirement(self, comm, team, n_barriers):
        """ncclGinBarrierCreateRequirement (_device.pxi)."""
        return _gin_barrier_create_requirement(self, comm, team, n_barriers)

    def lla2a_calc_slots(self, max_elts, max_elt_size):
        """ncclLLA2ACalcSlots (_device.pxi)."""
        return _lla2a_calc_slots(self, max_elts, max_elt_size)

    def lla2a_create_requirement(self, n_blocks, n_slots):
        """ncclLLA2ACreateRequirement (_device.pxi)."""
        return _lla2a_create_requirement(self, n_blocks, n_slots)

    def gin_outbox_create_requirement(self, n_blocks, size_log2):
        """ncclGinOutboxCreateRequirement (_device.pxi)."""
        return _gin_outbox_create_requirement(self, n_blocks, size_log2)

    def gin_inbox_a2a_create_requirement(self, peers, n_blocks, size_log2):
        """ncclGinInboxA2ACreateRequirement for the team ``peers`` (_device.pxi)."""
        return _gin_inbox_a2a_create_requirement(self, peers, n_blocks, size_log2)

    def reset_debug_init(self, internal=False):
        """ncclResetDebugInit (deprecated by NCCL), or with ``internal=True`` ncclResetDebugInitInternal (_device.pxi)."""
        return _reset_debug_init(self, internal)

    def param_bind(self, key):
        """ncclParamBind(key) (_device.pxi)."""
        return _param_bind(self, key)

    def param_read(self, handle, kind="i64", max_len=4096):
        """Read a bound parameter (_device.pxi)."""
        return _param_read(self, handle, kind, max_len)

    def param_dump_all(self):
        """ncclParamDumpAll (_device.pxi)."""
        return _param_dump_all(self)

