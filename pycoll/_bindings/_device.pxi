# The device-API host functions of nccl_device/host.h: communicator properties, device
# communicators, teams, window device pointers and LE info, resource requirements (included by
# _nccl.pyx). Library's methods of the same names (the end of _library.pxi) call these.

import collections

#: ncclTeam_t: a team of ``n_ranks`` ranks, this rank's index ``rank`` in it, and the world-rank
#: distance ``stride`` between consecutive members.
Team = collections.namedtuple("Team", ("n_ranks", "rank", "stride"))

GIN_TYPE_NONE = 0
GIN_TYPE_PROXY = 2
GIN_TYPE_GDAKI = 3
GIN_TYPE_GPI = 4
GIN_TYPE_EFA_GDA = 5
GIN_MAX_TYPES = 6
GIN_CONNECTION_NONE = 0
GIN_CONNECTION_FULL = 1
GIN_CONNECTION_RAIL = 2
GIN_CONNECTION_CUSTOM_STRIDE = 3
CFT_TEAM_FLAT = 0
CFT_TEAM_HIER_MULTIMEM = 1
CFT_TEAM_HIER_LSA = 2
COMM_PROPERTIES_SIZE = sizeof(ncclCommProperties_t)
DEV_COMM_REQUIREMENTS_SIZE = sizeof(ncclDevCommRequirements_t)

#: The minimum buffer pycoll hands ncclDevCommCreate when the library reports no runtime size.
cdef size_t _DEV_COMM_MIN_BYTES = 4096
cdef int _DEV_COMM_REQS_VERSIONED = 22900  # ncclDevCommRequirements starts with size/magic/version since 2.29


cdef ncclTeam_t _team(object team) except *:
    cdef ncclTeam_t t
    try:
        n, r, s = team
    except (TypeError, ValueError):
        raise TypeError(f"team must be a Team (n_ranks, rank, stride), not {type(team).__name__}") from None
    t.nRanks = _cint(n, "team.n_ranks", 0)
    t.rank = _cint(r, "team.rank", 0)
    t.stride = _cint(s, "team.stride")
    if t.nRanks > 0 and t.rank >= t.nRanks:
        raise ValueError(f"team.rank must be < team.n_ranks ({t.nRanks}), got {t.rank}")
    return t


cdef ncclComm_t _live_comm(object comm) except NULL:
    """A communicator handle that must not be NULL (NCCL dereferences it in the team functions)."""
    return <ncclComm_t>_handle(comm, "comm")


cdef object _team_result(Library lib, ncclTeam_t t, str function):
    if t.nRanks <= 0:
        text = ""
        if lib.fn.ncclGetLastError != NULL:
            with nogil:
                s = lib.fn.ncclGetLastError(NULL)
            text = _decode(s)
        raise _errors.error_class(ncclInvalidUsage)(
            ncclInvalidUsage, function, _error_string(lib, ncclInvalidUsage),
            text or f"{function} returned an empty team", lib.path)
    return Team(t.nRanks, t.rank, t.stride)


cdef class DevRequirement:
    """An ncclDevResourceRequirements_t and the handle NCCL fills in (a *_create_requirement result).

    ``kind`` names the function that made it; ``handle`` is the handle's fields. Chain it into a
    :class:`DevCommRequirements` (``resources=[...]``): ncclDevCommCreate writes the handle's
    resource fields through the requirement, so this object stays alive as long as the DevComm.
    """
    cdef ncclDevResourceRequirements_t req
    cdef unsigned char handle_bytes[32]
    cdef readonly str kind

    def __init__(self):
        raise TypeError("DevRequirement objects are returned by the *_create_requirement methods")

    @property
    def buffer_size(self):
        return self.req.bufferSize

    @property
    def buffer_align(self):
        return self.req.bufferAlign

    @property
    def gin_signal_count(self):
        return self.req.ginSignalCount

    @property
    def gin_counter_count(self):
        return self.req.ginCounterCount

    @property
    def address(self):
        """Address of the ncclDevResourceRequirements_t (valid while this object lives)."""
        return <uintptr_t>&self.req

    @property
    def handle_address(self):
        return <uintptr_t>&self.handle_bytes[0]

    @property
    def handle(self):
        """The handle's fields by NCCL's names."""
        cdef uint32_t* u = <uint32_t*>&self.handle_bytes[0]
        if self.kind == "lsa_barrier":
            return {"bufHandle": u[0], "nBarriers": (<int*>u)[1]}
        if self.kind == "gin_barrier":
            return {"signal0": u[0], "unused": u[1]}
        if self.kind == "lla2a":
            return {"bufHandle": u[0], "nSlots": u[1]}
        if self.kind == "gin_outbox":
            return {"bufHandle": u[0], "size_log2": u[1]}
        return {"bufHandle": u[0], "signals": u[1], "size_log2": u[2], "nPeers_rcp32": u[3]}

    def __repr__(self):
        return f"<DevRequirement {self.kind} bufferSize={self.buffer_size} handle={self.handle}>"


cdef DevRequirement _new_requirement(str kind):
    cdef DevRequirement r = DevRequirement.__new__(DevRequirement)
    r.kind = kind
    memset(&r.req, 0, sizeof(r.req))
    memset(r.handle_bytes, 0, sizeof(r.handle_bytes))
    return r


cdef class DevCommRequirements:
    """An ncclDevCommRequirements_t, initialised exactly as NCCL_DEV_COMM_REQUIREMENTS_INITIALIZER.

    Fields by NCCL's names as keywords (ints; the bool fields take bools); ``resources`` is a
    sequence of :class:`DevRequirement` chained into ``resourceRequirementsList`` when the device
    communicator is created. Team requirements (``teamRequirementsList``) are not offered.
    """
    cdef ncclDevCommRequirements_t c
    cdef readonly tuple resources

    FIELDS = (
        "lsaMultimem", "barrierCount", "lsaBarrierCount", "railGinBarrierCount", "lsaLLA2ABlockCount",
        "lsaLLA2ASlotCount", "ginForceEnable", "ginContextCount", "ginSignalCount", "ginCounterCount",
        "ginConnectionType", "ginExclusiveContexts", "ginQueueDepth", "ginTrafficClass", "worldGinBarrierCount",
        "ginStrongSignalsRequired", "ginVaSignalsRequired", "ginCustomStride", "ginType", "useRuntimeVersion",
        "cftCaps", "cftBarrierCount",
    )

    def __cinit__(self):
        memset(&self.c, 0, sizeof(self.c))
        self.c.size = sizeof(ncclDevCommRequirements_t)
        self.c.magic = NCCL_API_MAGIC
        self.c.version = NCCL_VERSION_CODE
        self.c.ginContextCount = 4
        self.c.ginTrafficClass = INT_MIN
        self.c.ginStrongSignalsRequired = True
        self.c.ginVaSignalsRequired = True
        self.c.ginCustomStride = 1
        self.resources = ()

    def __init__(self, resources=(), **fields):
        for name, value in fields.items():
            if name not in DevCommRequirements.FIELDS:
                raise TypeError(f"ncclDevCommRequirements_t has no field {name!r}; fields: "
                                + ", ".join(DevCommRequirements.FIELDS))
            _devreq_set(&self.c, name, value)
        items = tuple(resources)
        for i, r in enumerate(items):
            if not isinstance(r, DevRequirement):
                raise TypeError(f"resources[{i}] must be a DevRequirement, not {type(r).__name__}")
        self.resources = items

    def to_dict(self):
        """Every user field by name, in struct order."""
        return {name: _devreq_get(&self.c, name) for name in DevCommRequirements.FIELDS}

    def __getattr__(self, name):
        if name in DevCommRequirements.FIELDS:
            return _devreq_get(&self.c, name)
        raise AttributeError(f"'DevCommRequirements' object has no attribute {name!r}")

    def __repr__(self):
        fresh = DevCommRequirements()
        changed = [f"{k}={v!r}" for k, v in self.to_dict().items() if getattr(fresh, k) != v]
        return f"DevCommRequirements({', '.join(changed)})"


cdef int _devreq_set(ncclDevCommRequirements_t* c, str name, object value) except -1:
    if name in ("lsaMultimem", "ginForceEnable", "ginExclusiveContexts", "ginStrongSignalsRequired",
                "ginVaSignalsRequired", "useRuntimeVersion"):
        if not isinstance(value, bool):
            raise TypeError(f"DevCommRequirements.{name} must be a bool, not {type(value).__name__}")
        flag = <bint>value
        if name == "lsaMultimem": c.lsaMultimem = flag
        elif name == "ginForceEnable": c.ginForceEnable = flag
        elif name == "ginExclusiveContexts": c.ginExclusiveContexts = flag
        elif name == "ginStrongSignalsRequired": c.ginStrongSignalsRequired = flag
        elif name == "ginVaSignalsRequired": c.ginVaSignalsRequired = flag
        else: c.useRuntimeVersion = flag
        return 0
    cdef int v = _cint(value, f"DevCommRequirements.{name}")
    if name == "barrierCount": c.barrierCount = v
    elif name == "lsaBarrierCount": c.lsaBarrierCount = v
    elif name == "railGinBarrierCount": c.railGinBarrierCount = v
    elif name == "lsaLLA2ABlockCount": c.lsaLLA2ABlockCount = v
    elif name == "lsaLLA2ASlotCount": c.lsaLLA2ASlotCount = v
    elif name == "ginContextCount": c.ginContextCount = v
    elif name == "ginSignalCount": c.ginSignalCount = v
    elif name == "ginCounterCount": c.ginCounterCount = v
    elif name == "ginConnectionType": c.ginConnectionType = v
    elif name == "ginQueueDepth": c.ginQueueDepth = v
    elif name == "ginTrafficClass": c.ginTrafficClass = v
    elif name == "worldGinBarrierCount": c.worldGinBarrierCount = v
    elif name == "ginCustomStride": c.ginCustomStride = v
    elif name == "ginType": c.ginType = v
    elif name == "cftCaps": c.cftCaps = v
    else: c.cftBarrierCount = v
    return 0


cdef object _devreq_get(ncclDevCommRequirements_t* c, str name):
    values = {
        "lsaMultimem": bool(c.lsaMultimem), "barrierCount": c.barrierCount, "lsaBarrierCount": c.lsaBarrierCount,
        "railGinBarrierCount": c.railGinBarrierCount, "lsaLLA2ABlockCount": c.lsaLLA2ABlockCount,
        "lsaLLA2ASlotCount": c.lsaLLA2ASlotCount, "ginForceEnable": bool(c.ginForceEnable),
        "ginContextCount": c.ginContextCount, "ginSignalCount": c.ginSignalCount,
        "ginCounterCount": c.ginCounterCount, "ginConnectionType": <int>c.ginConnectionType,
        "ginExclusiveContexts": bool(c.ginExclusiveContexts), "ginQueueDepth": c.ginQueueDepth,
        "ginTrafficClass": c.ginTrafficClass, "worldGinBarrierCount": c.worldGinBarrierCount,
        "ginStrongSignalsRequired": bool(c.ginStrongSignalsRequired),
        "ginVaSignalsRequired": bool(c.ginVaSignalsRequired), "ginCustomStride": c.ginCustomStride,
        "ginType": <int>c.ginType, "useRuntimeVersion": bool(c.useRuntimeVersion), "cftCaps": c.cftCaps,
        "cftBarrierCount": c.cftBarrierCount,
    }
    return values[name]


cdef class DevComm:
    """A device communicator (ncclDevComm_t) made by :meth:`Library.dev_comm_create`.

    ``address`` is the host copy NCCL filled in (pass it by value to kernels); ``destroy()`` calls
    ncclDevCommDestroy once (later calls do nothing). The requirements stay referenced here.
    """
    cdef void* buf
    cdef readonly size_t size
    cdef readonly object comm
    cdef Library lib
    cdef object requirements
    cdef readonly bint destroyed

    def __init__(self):
        raise TypeError("DevComm objects are returned by Library.dev_comm_create")

    @property
    def address(self):
        return <uintptr_t>self.buf

    def destroy(self):
        """ncclDevCommDestroy; status (0 when already destroyed)."""
        cdef ncclComm_t c
        cdef _Call cr
        if self.destroyed:
            return SUCCESS
        c = _comm(self.comm)
        _need(self.lib, <void*>self.lib.fn.ncclDevCommDestroy, "ncclDevCommDestroy")
        with nogil: _cap(&self.lib.fn, c, &cr, self.lib.fn.ncclDevCommDestroy(c, <ncclDevComm_t*>self.buf))
        self.destroyed = True
        return _check(self.lib, &cr, "ncclDevCommDestroy")

    def __dealloc__(self):
        if self.destroyed:
            free(self.buf)  # otherwise NCCL may still reference it: leak rather than free under it

    def __repr__(self):
        return f"<DevComm comm={self.comm:#x} size={self.size}{' destroyed' if self.destroyed else ''}>"


# --- the wrappers (bound as Library methods) ------------------------------------------------------

def _comm_query_properties(Library self, comm):
    """ncclCommQueryProperties: the communicator's properties as a dict of NCCL's field names
    (``ginSupport`` is the list of supported GIN type values)."""
    cdef ncclComm_t c = _comm(comm)
    cdef ncclCommProperties_t p
    cdef _Call cr
    memset(&p, 0, sizeof(p))
    p.size = sizeof(ncclCommProperties_t)
    p.magic = NCCL_API_MAGIC
    p.version = NCCL_VERSION_CODE
    _need(self, <void*>self.fn.ncclCommQueryProperties, "ncclCommQueryProperties")
    with nogil: _cap(&self.fn, c, &cr, self.fn.ncclCommQueryProperties(c, &p))
    _done(self, &cr, "ncclCommQueryProperties")
    return {
        "size": p.size, "magic": p.magic, "version": p.version, "rank": p.rank, "nRanks": p.nRanks,
        "cudaDev": p.cudaDev, "nvmlDev": p.nvmlDev, "deviceApiSupport": bool(p.deviceApiSupport),
        "multimemSupport": bool(p.multimemSupport), "ginType": <int>p.ginType, "nLsaTeams": p.nLsaTeams,
        "hostRmaSupport": bool(p.hostRmaSupport), "railedGinType": <int>p.railedGinType,
        "commHash": p.commHash, "ginMinStride": p.ginMinStride, "ginConnectionType": <int>p.ginConnectionType,
        "ginSupport": [i for i in range(64) if p.ginSupport[i]],
        "devCommRuntimeVersionSize": p.devCommRuntimeVersionSize, "cftSupport": bool(p.cftSupport),
        "cftMulticastSupport": bool(p.cftMulticastSupport), "cftCountedSupport": bool(p.cftCountedSupport),
    }


def _dev_comm_create(Library self, comm, requirements=None):
    """ncclDevCommCreate (collective over ``comm``): a :class:`DevComm`. ``requirements``: a
    DevCommRequirements (None: NCCL's initializer)."""
    cdef ncclComm_t c = _live_comm(comm)
    cdef DevCommRequirements reqs
    cdef DevRequirement r
    cdef DevComm dc
    cdef ncclDevResourceRequirements_t* head = NULL
    cdef _Call cr
    cdef size_t n
    if requirements is None:
        requirements = DevCommRequirements()
    if not isinstance(requirements, DevCommRequirements):
        raise TypeError(f"requirements must be a DevCommRequirements or None, not {type(requirements).__name__}")
    reqs = requirements
    _need(self, <void*>self.fn.ncclDevCommCreate, "ncclDevCommCreate")
    if self.version < _DEV_COMM_REQS_VERSIONED:
        raise NotSupported("ncclDevCommCreate", "2.29", self.path,
                           f"NCCL {'.'.join(map(str, version_tuple(self.version)))} reads ncclDevCommRequirements "
                           "without the size/magic/version header that 2.29 added and pycoll fills")
    n = _DEV_COMM_MIN_BYTES
    if self.fn.ncclCommQueryProperties != NULL:
        n = max(n, <size_t>_comm_query_properties(self, comm)["devCommRuntimeVersionSize"])
    for r in reversed(reqs.resources):
        r.req.next = head
        head = &r.req
    reqs.c.resourceRequirementsList = head
    dc = DevComm.__new__(DevComm)
    dc.buf = calloc(1, n)
    if dc.buf == NULL:
        raise MemoryError()
    dc.size = n
    dc.comm = _addr(comm, "comm")
    dc.lib = self
    dc.requirements = reqs
    with nogil: _cap(&self.fn, c, &cr, self.fn.ncclDevCommCreate(c, &reqs.c, <ncclDevComm_t*>dc.buf))
    if cr.r != ncclSuccess and cr.r != ncclInProgress:
        dc.destroyed = True  # nothing to destroy: the buffer is freed with the object
    _done(self, &cr, "ncclDevCommCreate")
    return dc


def _dev_comm_destroy(Library self, comm, dev_comm):
    """ncclDevCommDestroy of a :class:`DevComm` made on ``comm``; status."""
    if not isinstance(dev_comm, DevComm):
        raise TypeError(f"dev_comm must be a DevComm, not {type(dev_comm).__name__}")
    if _addr(comm, "comm") != (<DevComm>dev_comm).comm:
        raise ValueError("dev_comm was created on another communicator")
    return dev_comm.destroy()


cdef object _win_ptr(Library self, int which, object window, object offset, object arg):
    cdef ncclWindow_t w = <ncclWindow_t>_handle(window, "window")
    cdef size_t off = _count(offset, "offset")
    cdef int rk = 0
    cdef ncclMultimemHandle_t mm
    cdef void* out = NULL
    cdef _Call cr
    if which == 0:
        _need(self, <void*>self.fn.ncclGetLsaMultimemDevicePointer, "ncclGetLsaMultimemDevicePointer")
        with nogil: _cap(&self.fn, NULL, &cr, self.fn.ncclGetLsaMultimemDevicePointer(w, off, &out))
        name = "ncclGetLsaMultimemDevicePointer"
    elif which == 1:
        mm.mcBasePtr = <void*>_addr(arg, "multimem")
        _need(self, <void*>self.fn.ncclGetMultimemDevicePointer, "ncclGetMultimemDevicePointer")
        with nogil: _cap(&self.fn, NULL, &cr, self.fn.ncclGetMultimemDevicePointer(w, off, mm, &out))
        name = "ncclGetMultimemDevicePointer"
    elif which == 2:
        rk = _cint(arg, "lsa_rank", 0)
        _need(self, <void*>self.fn.ncclGetLsaDevicePointer, "ncclGetLsaDevicePointer")
        with nogil: _cap(&self.fn, NULL, &cr, self.fn.ncclGetLsaDevicePointer(w, off, rk, &out))
        name = "ncclGetLsaDevicePointer"
    else:
        rk = _cint(arg, "peer", 0)
        _need(self, <void*>self.fn.ncclGetPeerDevicePointer, "ncclGetPeerDevicePointer")
        with nogil: _cap(&self.fn, NULL, &cr, self.fn.ncclGetPeerDevicePointer(w, off, rk, &out))
        name = "ncclGetPeerDevicePointer"
    _done(self, &cr, name)
    return <uintptr_t>out


def _get_lsa_multimem_device_pointer(Library self, window, offset):
    """ncclGetLsaMultimemDevicePointer: the LSA team's multimem address of ``window`` + ``offset``."""
    return _win_ptr(self, 0, window, offset, None)


def _get_multimem_device_pointer(Library self, window, offset, multimem):
    """ncclGetMultimemDevicePointer with a multimem handle (its ``mcBasePtr`` address)."""
    return _win_ptr(self, 1, window, offset, multimem)


def _get_lsa_device_pointer(Library self, window, offset, lsa_rank):
    """ncclGetLsaDevicePointer: LSA peer ``lsa_rank``'s address of ``window`` + ``offset``."""
    return _win_ptr(self, 2, window, offset, lsa_rank)


def _get_peer_device_pointer(Library self, window, offset, peer):
    """ncclGetPeerDevicePointer: world peer ``peer``'s address of ``window`` + ``offset``."""
    return _win_ptr(self, 3, window, offset, peer)


def _get_multimem_device_le_info(Library self, window, offset):
    """ncclGetMultimemDeviceLeInfo: ``(le_id, le_offset)``."""
    cdef ncclWindow_t w = <ncclWindow_t>_handle(window, "window")
    cdef size_t off = _count(offset, "offset")
    cdef ncclCftLeId le = 0
    cdef size_t le_off = 0
    cdef _Call cr
    _need(self, <void*>self.fn.ncclGetMultimemDeviceLeInfo, "ncclGetMultimemDeviceLeInfo")
    with nogil: _cap(&self.fn, NULL, &cr, self.fn.ncclGetMultimemDeviceLeInfo(w, off, &le, &le_off))
    _done(self, &cr, "ncclGetMultimemDeviceLeInfo")
    return (le, le_off)


def _get_cft_device_le_info(Library self, window, offset, peer_cft, cft_team):
    """ncclGetCftDeviceLeInfo: ``(le_id, le_offset)`` of CFT peer ``peer_cft`` in ``cft_team``."""
    cdef ncclWindow_t w = <ncclWindow_t>_handle(window, "window")
    cdef size_t off = _count(offset, "offset")
    cdef int pc = _cint(peer_cft, "peer_cft", 0)
    cdef ncclTeam_t t = _team(cft_team)
    cdef ncclCftLeId le = 0
    cdef size_t le_off = 0
    cdef _Call cr
    _need(self, <void*>self.fn.ncclGetCftDeviceLeInfo, "ncclGetCftDeviceLeInfo")
    with nogil: _cap(&self.fn, NULL, &cr, self.fn.ncclGetCftDeviceLeInfo(w, off, pc, t, &le, &le_off))
    _done(self, &cr, "ncclGetCftDeviceLeInfo")
    return (le, le_off)


def _get_peer_device_le_info(Library self, window, offset, peer_world):
    """ncclGetPeerDeviceLeInfo: ``(le_id, le_offset)`` of world peer ``peer_world``."""
    cdef ncclWindow_t w = <ncclWindow_t>_handle(window, "window")
    cdef size_t off = _count(offset, "offset")
    cdef int pw = _cint(peer_world, "peer_world", 0)
    cdef ncclCftLeId le = 0
    cdef size_t le_off = 0
    cdef _Call cr
    _need(self, <void*>self.fn.ncclGetPeerDeviceLeInfo, "ncclGetPeerDeviceLeInfo")
    with nogil: _cap(&self.fn, NULL, &cr, self.fn.ncclGetPeerDeviceLeInfo(w, off, pw, &le, &le_off))
    _done(self, &cr, "ncclGetPeerDeviceLeInfo")
    return (le, le_off)


cdef object _team_of(Library self, int which, object comm, int mode):
    cdef ncclComm_t c = _live_comm(comm)
    cdef ncclTeam_t t
    t.nRanks = 0
    if which == 0:
        _need(self, <void*>self.fn.ncclTeamWorld, "ncclTeamWorld")
        with nogil: t = self.fn.ncclTeamWorld(c)
        return _team_result(self, t, "ncclTeamWorld")
    if which == 1:
        _need(self, <void*>self.fn.ncclTeamLsa, "ncclTeamLsa")
        with nogil: t = self.fn.ncclTeamLsa(c)
        return _team_result(self, t, "ncclTeamLsa")
    if which == 2:
        _need(self, <void*>self.fn.ncclTeamCft, "ncclTeamCft")
        with nogil: t = self.fn.ncclTeamCft(c, <ncclCftTeamMode_t>mode)
        return _team_result(self, t, "ncclTeamCft")
    if which == 3:
        _need(self, <void*>self.fn.ncclTeamCftMultimem, "ncclTeamCftMultimem")
        with nogil: t = self.fn.ncclTeamCftMultimem(c)
        return _team_result(self, t, "ncclTeamCftMultimem")
    _need(self, <void*>self.fn.ncclTeamRail, "ncclTeamRail")
    with nogil: t = self.fn.ncclTeamRail(c)
    return _team_result(self, t, "ncclTeamRail")


def _team_world(Library self, comm):
    """ncclTeamWorld: every rank of ``comm`` (a Team)."""
    return _team_of(self, 0, comm, 0)


def _team_lsa(Library self, comm):
    """ncclTeamLsa: the ranks this rank reaches by load/store (a Team)."""
    return _team_of(self, 1, comm, 0)


def _team_cft(Library self, comm, mode=CFT_TEAM_FLAT):
    """ncclTeamCft(comm, mode): the CFT team (``mode``: CFT_TEAM_FLAT/HIER_MULTIMEM/HIER_LSA)."""
    return _team_of(self, 2, comm, _cint(mode, "mode", 0, 2))


def _team_cft_multimem(Library self, comm):
    """ncclTeamCftMultimem: the CFT multimem team."""
    return _team_of(self, 3, comm, 0)


def _team_rail(Library self, comm):
    """ncclTeamRail: the ranks with this rank's LSA index in every LSA team (a Team)."""
    return _team_of(self, 4, comm, 0)


cdef object _team_rank(Library self, bint world, object comm, object team, object rank):
    cdef ncclComm_t c = _live_comm(comm)
    cdef ncclTeam_t t = _team(team)
    cdef int r = _cint(rank, "rank", 0)
    cdef int out
    name = "ncclTeamRankToWorld" if world else "ncclTeamRankToLsa"
    if r >= t.nRanks:
        raise ValueError(f"rank must be < team.n_ranks ({t.nRanks}), got {r}")
    if world:
        _need(self, <void*>self.fn.ncclTeamRankToWorld, name)
        with nogil: out = self.fn.ncclTeamRankToWorld(c, t, r)
    else:
        _need(self, <void*>self.fn.ncclTeamRankToLsa, name)
        with nogil: out = self.fn.ncclTeamRankToLsa(c, t, r)
    if out < 0:
        raise ValueError(f"{name}: rank {r} of team {tuple(team)} is not a rank of this communicator "
                         f"({self.get_last_error(0) or 'no text'})")
    return out


def _team_rank_to_world(Library self, comm, team, rank):
    """ncclTeamRankToWorld: the world rank of member ``rank`` of ``team``."""
    return _team_rank(self, True, comm, team, rank)


def _team_rank_to_lsa(Library self, comm, team, rank):
    """ncclTeamRankToLsa: the LSA rank of member ``rank`` of ``team``."""
    return _team_rank(self, False, comm, team, rank)


def _lsa_barrier_create_requirement(Library self, team, n_barriers):
    """ncclLsaBarrierCreateRequirement: a DevRequirement (kind "lsa_barrier")."""
    cdef ncclTeam_t t = _team(team)
    cdef int n = _cint(n_barriers, "n_barriers", 0)
    cdef DevRequirement r = _new_requirement("lsa_barrier")
    cdef _Call cr
    _need(self, <void*>self.fn.ncclLsaBarrierCreateRequirement, "ncclLsaBarrierCreateRequirement")
    with nogil: _cap(&self.fn, NULL, &cr, self.fn.ncclLsaBarrierCreateRequirement(
        t, n, <ncclLsaBarrierHandle_t*>r.handle_bytes, &r.req))
    _done(self, &cr, "ncclLsaBarrierCreateRequirement")
    return r


def _gin_barrier_create_requirement(Library self, comm, team, n_barriers):
    """ncclGinBarrierCreateRequirement: a DevRequirement (kind "gin_barrier")."""
    cdef ncclComm_t c = _live_comm(comm)
    cdef ncclTeam_t t = _team(team)
    cdef int n = _cint(n_barriers, "n_barriers", 0)
    cdef DevRequirement r = _new_requirement("gin_barrier")
    cdef _Call cr
    _need(self, <void*>self.fn.ncclGinBarrierCreateRequirement, "ncclGinBarrierCreateRequirement")
    with nogil: _cap(&self.fn, c, &cr, self.fn.ncclGinBarrierCreateRequirement(
        c, t, n, <ncclGinBarrierHandle_t*>r.handle_bytes, &r.req))
    _done(self, &cr, "ncclGinBarrierCreateRequirement")
    return r


def _lla2a_calc_slots(Library self, max_elts, max_elt_size):
    """ncclLLA2ACalcSlots: the slots an LL all-to-all needs for ``max_elts`` elements of at most
    ``max_elt_size`` bytes."""
    cdef int n = _cint(max_elts, "max_elts", 0)
    cdef int s = _cint(max_elt_size, "max_elt_size", 1)
    cdef int out
    _need(self, <void*>self.fn.ncclLLA2ACalcSlots, "ncclLLA2ACalcSlots")
    with nogil: out = self.fn.ncclLLA2ACalcSlots(n, s)
    if out < 0:
        raise ValueError(f"ncclLLA2ACalcSlots({n}, {s}) overflows an int")
    return out


def _lla2a_create_requirement(Library self, n_blocks, n_slots):
    """ncclLLA2ACreateRequirement: a DevRequirement (kind "lla2a")."""
    cdef int b = _cint(n_blocks, "n_blocks", 0)
    cdef int s = _cint(n_slots, "n_slots", 0)
    cdef DevRequirement r = _new_requirement("lla2a")
    cdef _Call cr
    _need(self, <void*>self.fn.ncclLLA2ACreateRequirement, "ncclLLA2ACreateRequirement")
    with nogil: _cap(&self.fn, NULL, &cr, self.fn.ncclLLA2ACreateRequirement(
        b, s, <ncclLLA2AHandle_t*>r.handle_bytes, &r.req))
    _done(self, &cr, "ncclLLA2ACreateRequirement")
    return r


def _gin_outbox_create_requirement(Library self, n_blocks, size_log2):
    """ncclGinOutboxCreateRequirement: a DevRequirement (kind "gin_outbox")."""
    cdef int b = _cint(n_blocks, "n_blocks", 0)
    cdef int sl = _cint(size_log2, "size_log2", 0, 62)
    cdef DevRequirement r = _new_requirement("gin_outbox")
    cdef _Call cr
    _need(self, <void*>self.fn.ncclGinOutboxCreateRequirement, "ncclGinOutboxCreateRequirement")
    with nogil: _cap(&self.fn, NULL, &cr, self.fn.ncclGinOutboxCreateRequirement(
        b, sl, <ncclGinOutboxHandle_t*>r.handle_bytes, &r.req))
    _done(self, &cr, "ncclGinOutboxCreateRequirement")
    return r


def _gin_inbox_a2a_create_requirement(Library self, peers, n_blocks, size_log2):
    """ncclGinInboxA2ACreateRequirement for the team ``peers``: a DevRequirement (kind "gin_inbox_a2a")."""
    cdef ncclTeam_t t = _team(peers)
    cdef int b = _cint(n_blocks, "n_blocks", 0)
    cdef int sl = _cint(size_log2, "size_log2", 0, 62)
    cdef DevRequirement r = _new_requirement("gin_inbox_a2a")
    cdef _Call cr
    _need(self, <void*>self.fn.ncclGinInboxA2ACreateRequirement, "ncclGinInboxA2ACreateRequirement")
    with nogil: _cap(&self.fn, NULL, &cr, self.fn.ncclGinInboxA2ACreateRequirement(
        t, b, sl, <ncclGinInboxA2AHandle_t*>r.handle_bytes, &r.req))
    _done(self, &cr, "ncclGinInboxA2ACreateRequirement")
    return r


def _reset_debug_init(Library self, internal=False):
    """ncclResetDebugInit (deprecated by NCCL), or with ``internal=True`` ncclResetDebugInitInternal:
    re-read NCCL_DEBUG and the related variables on the next log line."""
    if internal:
        _need(self, <void*>self.fn.ncclResetDebugInitInternal, "ncclResetDebugInitInternal")
        with nogil: self.fn.ncclResetDebugInitInternal()
        return
    _need(self, <void*>self.fn.ncclResetDebugInit, "ncclResetDebugInit")
    with nogil: self.fn.ncclResetDebugInit()


def _param_bind(Library self, key):
    """ncclParamBind(key): a parameter handle (an int) for param_read."""
    cdef bytes k = _param_key(key)
    cdef const char* ck = k
    cdef ncclParamHandle_t h = NULL
    cdef _Call cr
    _need(self, <void*>self.fn.ncclParamBind, "ncclParamBind")
    with nogil: _cap(&self.fn, NULL, &cr, self.fn.ncclParamBind(&h, ck))
    _done(self, &cr, "ncclParamBind")
    return <uintptr_t>h


_PARAM_KINDS = ("i8", "i16", "i32", "i64", "u8", "u16", "u32", "u64", "str", "raw")


def _param_read(Library self, handle, kind="i64", max_len=4096):
    """Read a bound parameter: ``kind`` "i8".."u64" (ncclParamGetI8..U64), "str" (ncclParamGetStr)
    or "raw" (ncclParamGet, up to ``max_len`` bytes, returned as bytes)."""
    cdef ncclParamHandle_t h = <ncclParamHandle_t>_handle(handle, "handle")
    cdef int8_t i8 = 0
    cdef int16_t i16 = 0
    cdef int32_t i32 = 0
    cdef int64_t i64 = 0
    cdef uint8_t u8 = 0
    cdef uint16_t u16 = 0
    cdef uint32_t u32 = 0
    cdef uint64_t u64 = 0
    cdef const char* s = NULL
    cdef int n = _cint(max_len, "max_len", 1)
    cdef int got = 0
    cdef char* raw
    cdef _Call cr
    if kind not in _PARAM_KINDS:
        raise ValueError(f"kind must be one of {', '.join(_PARAM_KINDS)}, got {kind!r}")
    name = {"str": "ncclParamGetStr", "raw": "ncclParamGet"}.get(kind, "ncclParamGet" + kind.upper())
    if kind == "i8":
        _need(self, <void*>self.fn.ncclParamGetI8, name)
        with nogil: _cap(&self.fn, NULL, &cr, self.fn.ncclParamGetI8(h, &i8))
        value = i8
    elif kind == "i16":
        _need(self, <void*>self.fn.ncclParamGetI16, name)
        with nogil: _cap(&self.fn, NULL, &cr, self.fn.ncclParamGetI16(h, &i16))
        value = i16
    elif kind == "i32":
        _need(self, <void*>self.fn.ncclParamGetI32, name)
        with nogil: _cap(&self.fn, NULL, &cr, self.fn.ncclParamGetI32(h, &i32))
        value = i32
    elif kind == "i64":
        _need(self, <void*>self.fn.ncclParamGetI64, name)
        with nogil: _cap(&self.fn, NULL, &cr, self.fn.ncclParamGetI64(h, &i64))
        value = i64
    elif kind == "u8":
        _need(self, <void*>self.fn.ncclParamGetU8, name)
        with nogil: _cap(&self.fn, NULL, &cr, self.fn.ncclParamGetU8(h, &u8))
        value = u8
    elif kind == "u16":
        _need(self, <void*>self.fn.ncclParamGetU16, name)
        with nogil: _cap(&self.fn, NULL, &cr, self.fn.ncclParamGetU16(h, &u16))
        value = u16
    elif kind == "u32":
        _need(self, <void*>self.fn.ncclParamGetU32, name)
        with nogil: _cap(&self.fn, NULL, &cr, self.fn.ncclParamGetU32(h, &u32))
        value = u32
    elif kind == "u64":
        _need(self, <void*>self.fn.ncclParamGetU64, name)
        with nogil: _cap(&self.fn, NULL, &cr, self.fn.ncclParamGetU64(h, &u64))
        value = u64
    elif kind == "str":
        _need(self, <void*>self.fn.ncclParamGetStr, name)
        with nogil: _cap(&self.fn, NULL, &cr, self.fn.ncclParamGetStr(h, &s))
        value = None if s == NULL else _decode(s)
    else:
        _need(self, <void*>self.fn.ncclParamGet, name)
        raw = <char*>calloc(n, 1)
        if raw == NULL:
            raise MemoryError()
        try:
            with nogil: _cap(&self.fn, NULL, &cr, self.fn.ncclParamGet(h, raw, n, &got))
            value = raw[:max(0, min(got, n))]
        finally:
            free(raw)
    _done(self, &cr, name)
    return value


def _param_dump_all(Library self):
    """ncclParamDumpAll: NCCL prints every parameter to its log."""
    _need(self, <void*>self.fn.ncclParamDumpAll, "ncclParamDumpAll")
    with nogil: self.fn.ncclParamDumpAll()
