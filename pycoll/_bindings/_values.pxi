# The value types: UniqueId, Config, CollConfig and CommSlot (included by _nccl.pyx).

cdef class UniqueId:
    """A 128-byte ncclUniqueId: a value type (bytes, equality, hash, pickle).

    ``UniqueId()`` is all zeros; ``UniqueId(data)`` takes exactly 128 bytes (any bytes-like
    object), else ValueError.
    """

    def __init__(self, data=None):
        if data is None:
            memset(&self.c, 0, sizeof(ncclUniqueId))
            return
        if isinstance(data, str):
            raise TypeError("UniqueId data must be bytes-like, not str")
        cdef const unsigned char[::1] view
        try:
            m = memoryview(data)
        except TypeError:
            raise TypeError(f"UniqueId data must be bytes-like, not {type(data).__name__}") from None
        view = (m if m.c_contiguous else memoryview(m.tobytes())).cast("B")  # a strided view: its bytes in order
        if view.shape[0] != sizeof(ncclUniqueId):
            raise ValueError(f"a UniqueId is {sizeof(ncclUniqueId)} bytes, got {view.shape[0]}")
        memcpy(&self.c, &view[0], sizeof(ncclUniqueId))

    @classmethod
    def from_bytes(cls, data):
        """Build a UniqueId from exactly 128 bytes."""
        return cls(data)

    def __bytes__(self):
        return PyBytes_FromStringAndSize(self.c.internal, sizeof(ncclUniqueId))

    def hex(self):
        """The 128 bytes as hex."""
        return bytes(self).hex()

    def __eq__(self, other):
        if not isinstance(other, UniqueId):
            return NotImplemented
        return bytes(self) == bytes(other)

    def __ne__(self, other):
        if not isinstance(other, UniqueId):
            return NotImplemented
        return bytes(self) != bytes(other)

    def __hash__(self):
        return hash(bytes(self))

    def __reduce__(self):
        return (UniqueId, (bytes(self),))

    def __repr__(self):
        head = bytes(self)[:16].hex()
        return f"UniqueId({head}...)"


cdef int _int_field(object value, str name) except? -1:
    return _cint(value, f"Config.{name}")


cdef class Config:
    """An ncclConfig_t (2.32.3 layout), initialised exactly as NCCL_CONFIG_INITIALIZER.

    Field names are NCCL's. ``size`` = sizeof(ncclConfig_t), ``magic`` = 0xcafebeef, ``version``
    = HEADER_VERSION (the layout filled in, not the library's version); every int field starts
    at CONFIG_UNDEF_INT (NCCL picks its default) and both string fields at None (NULL). Ints must
    fit a C int; strings are kept alive by this object. ``Config(blocking=0, commName="x")`` sets
    fields by keyword. NCCL reads only the prefix it knows and resets fields newer than
    ``version``, so this layout works with older and newer libraries alike.
    """

    FIELDS = (
        "size", "magic", "version", "blocking", "cgaClusterSize", "minCTAs", "maxCTAs", "netName",
        "splitShare", "trafficClass", "commName", "collnetEnable", "CTAPolicy", "shrinkShare",
        "nvlsCTAs", "nChannelsPerNetPeer", "nvlinkCentricSched", "graphUsageMode", "numRmaCtx",
        "maxP2pPeers", "graphStreamOrdering", "launchOrderImplicit", "numRmaSig", "rmaEagerInit",
        "hostCftMode", "nvlsHostMode",
    )

    def __cinit__(self):
        self.c.size = sizeof(ncclConfig_t)
        self.c.magic = NCCL_API_MAGIC
        self.c.version = NCCL_VERSION_CODE
        self.c.blocking = INT_MIN
        self.c.cgaClusterSize = INT_MIN
        self.c.minCTAs = INT_MIN
        self.c.maxCTAs = INT_MIN
        self.c.netName = NULL
        self.c.splitShare = INT_MIN
        self.c.trafficClass = INT_MIN
        self.c.commName = NULL
        self.c.collnetEnable = INT_MIN
        self.c.CTAPolicy = INT_MIN
        self.c.shrinkShare = INT_MIN
        self.c.nvlsCTAs = INT_MIN
        self.c.nChannelsPerNetPeer = INT_MIN
        self.c.nvlinkCentricSched = INT_MIN
        self.c.graphUsageMode = INT_MIN
        self.c.numRmaCtx = INT_MIN
        self.c.maxP2pPeers = INT_MIN
        self.c.graphStreamOrdering = INT_MIN
        self.c.launchOrderImplicit = INT_MIN
        self.c.numRmaSig = INT_MIN
        self.c.rmaEagerInit = INT_MIN
        self.c.hostCftMode = INT_MIN
        self.c.nvlsHostMode = INT_MIN

    def __init__(self, **fields):
        for name, value in fields.items():
            if name not in Config.FIELDS:
                raise TypeError(f"ncclConfig_t has no field {name!r}; fields: {', '.join(Config.FIELDS)}")
            setattr(self, name, value)

    def copy(self):
        """An independent copy (strings are shared immutable bytes)."""
        cdef Config other = Config.__new__(Config)
        other.c = self.c
        other._net_name = self._net_name
        other._comm_name = self._comm_name
        return other

    def to_dict(self):
        """Every field by name, in struct order."""
        return {name: getattr(self, name) for name in Config.FIELDS}

    @property
    def address(self):
        """Address of the underlying ncclConfig_t (valid while this object lives)."""
        return <uintptr_t>&self.c

    def __reduce__(self):
        return (_config_from_dict, (self.to_dict(),))

    def __eq__(self, other):
        if not isinstance(other, Config):
            return NotImplemented
        return self.to_dict() == other.to_dict()

    def __repr__(self):
        fresh = Config()
        changed = [f"{k}={v!r}" for k, v in self.to_dict().items() if getattr(fresh, k) != v]
        return f"Config({', '.join(changed)})"

    # header fields ("attributes that users should never touch": exposed for tests and tools)
    @property
    def size(self):
        return self.c.size

    @size.setter
    def size(self, value):
        self.c.size = _count(value, "Config.size")

    @property
    def magic(self):
        return self.c.magic

    @magic.setter
    def magic(self, value):
        self.c.magic = <unsigned int>_unsigned(value, "Config.magic")

    @property
    def version(self):
        return self.c.version

    @version.setter
    def version(self, value):
        self.c.version = <unsigned int>_unsigned(value, "Config.version")

    # string fields
    @property
    def netName(self):
        return None if self.c.netName == NULL else _decode(self.c.netName)

    @netName.setter
    def netName(self, value):
        data = _c_string(value, "Config.netName")
        self._net_name = data
        self.c.netName = NULL if data is None else PyBytes_AS_STRING(data)

    @property
    def commName(self):
        return None if self.c.commName == NULL else _decode(self.c.commName)

    @commName.setter
    def commName(self, value):
        data = _c_string(value, "Config.commName")
        self._comm_name = data
        self.c.commName = NULL if data is None else PyBytes_AS_STRING(data)

    # int fields
    @property
    def blocking(self):
        return self.c.blocking

    @blocking.setter
    def blocking(self, value):
        self.c.blocking = _int_field(value, "blocking")

    @property
    def cgaClusterSize(self):
        return self.c.cgaClusterSize

    @cgaClusterSize.setter
    def cgaClusterSize(self, value):
        self.c.cgaClusterSize = _int_field(value, "cgaClusterSize")

    @property
    def minCTAs(self):
        return self.c.minCTAs

    @minCTAs.setter
    def minCTAs(self, value):
        self.c.minCTAs = _int_field(value, "minCTAs")

    @property
    def maxCTAs(self):
        return self.c.maxCTAs

    @maxCTAs.setter
    def maxCTAs(self, value):
        self.c.maxCTAs = _int_field(value, "maxCTAs")

    @property
    def splitShare(self):
        return self.c.splitShare

    @splitShare.setter
    def splitShare(self, value):
        self.c.splitShare = _int_field(value, "splitShare")

    @property
    def trafficClass(self):
        return self.c.trafficClass

    @trafficClass.setter
    def trafficClass(self, value):
        self.c.trafficClass = _int_field(value, "trafficClass")

    @property
    def collnetEnable(self):
        return self.c.collnetEnable

    @collnetEnable.setter
    def collnetEnable(self, value):
        self.c.collnetEnable = _int_field(value, "collnetEnable")

    @property
    def CTAPolicy(self):
        return self.c.CTAPolicy

    @CTAPolicy.setter
    def CTAPolicy(self, value):
        self.c.CTAPolicy = _int_field(value, "CTAPolicy")

    @property
    def shrinkShare(self):
        return self.c.shrinkShare

    @shrinkShare.setter
    def shrinkShare(self, value):
        self.c.shrinkShare = _int_field(value, "shrinkShare")

    @property
    def nvlsCTAs(self):
        return self.c.nvlsCTAs

    @nvlsCTAs.setter
    def nvlsCTAs(self, value):
        self.c.nvlsCTAs = _int_field(value, "nvlsCTAs")

    @property
    def nChannelsPerNetPeer(self):
        return self.c.nChannelsPerNetPeer

    @nChannelsPerNetPeer.setter
    def nChannelsPerNetPeer(self, value):
        self.c.nChannelsPerNetPeer = _int_field(value, "nChannelsPerNetPeer")

    @property
    def nvlinkCentricSched(self):
        return self.c.nvlinkCentricSched

    @nvlinkCentricSched.setter
    def nvlinkCentricSched(self, value):
        self.c.nvlinkCentricSched = _int_field(value, "nvlinkCentricSched")

    @property
    def graphUsageMode(self):
        return self.c.graphUsageMode

    @graphUsageMode.setter
    def graphUsageMode(self, value):
        self.c.graphUsageMode = _int_field(value, "graphUsageMode")

    @property
    def numRmaCtx(self):
        return self.c.numRmaCtx

    @numRmaCtx.setter
    def numRmaCtx(self, value):
        self.c.numRmaCtx = _int_field(value, "numRmaCtx")

    @property
    def maxP2pPeers(self):
        return self.c.maxP2pPeers

    @maxP2pPeers.setter
    def maxP2pPeers(self, value):
        self.c.maxP2pPeers = _int_field(value, "maxP2pPeers")

    @property
    def graphStreamOrdering(self):
        return self.c.graphStreamOrdering

    @graphStreamOrdering.setter
    def graphStreamOrdering(self, value):
        self.c.graphStreamOrdering = _int_field(value, "graphStreamOrdering")

    @property
    def launchOrderImplicit(self):
        return self.c.launchOrderImplicit

    @launchOrderImplicit.setter
    def launchOrderImplicit(self, value):
        self.c.launchOrderImplicit = _int_field(value, "launchOrderImplicit")

    @property
    def numRmaSig(self):
        return self.c.numRmaSig

    @numRmaSig.setter
    def numRmaSig(self, value):
        self.c.numRmaSig = _int_field(value, "numRmaSig")

    @property
    def rmaEagerInit(self):
        return self.c.rmaEagerInit

    @rmaEagerInit.setter
    def rmaEagerInit(self, value):
        self.c.rmaEagerInit = _int_field(value, "rmaEagerInit")

    @property
    def hostCftMode(self):
        return self.c.hostCftMode

    @hostCftMode.setter
    def hostCftMode(self, value):
        self.c.hostCftMode = _int_field(value, "hostCftMode")

    @property
    def nvlsHostMode(self):
        return self.c.nvlsHostMode

    @nvlsHostMode.setter
    def nvlsHostMode(self, value):
        self.c.nvlsHostMode = _int_field(value, "nvlsHostMode")


cdef class CollConfig:
    """An ncclCollConfig_t (2.32 layout), initialised exactly as NCCL_COLLCONFIG_INITIALIZER.

    A per-call configuration for the collectives' ``config=`` argument (which calls the
    ``nccl*Config`` variants, NCCL 2.31+); set it identically on every rank. Int fields start at
    CONFIG_UNDEF_INT (NCCL decides), ``forceAlgSelection`` at 1, ``userProfilerTag`` at 0,
    ``algSelection`` at None and the pointer fields (``ext``, ``launchCompletionEvent``: raw
    addresses) at 0.
    """

    FIELDS = (
        "size", "magic", "version", "ext", "minCTAs", "maxCTAs", "nvlsCTAs", "cgaClusterSize",
        "algSelection", "forceAlgSelection", "CTAPolicy", "userProfilerTag", "launchCompletionEvent",
    )

    def __cinit__(self):
        self.c.size = sizeof(ncclCollConfig_t)
        self.c.magic = NCCL_API_MAGIC
        self.c.version = NCCL_VERSION_CODE
        self.c.ext = NULL
        self.c.minCTAs = INT_MIN
        self.c.maxCTAs = INT_MIN
        self.c.nvlsCTAs = INT_MIN
        self.c.cgaClusterSize = INT_MIN
        self.c.algSelection = NULL
        self.c.forceAlgSelection = 1
        self.c.CTAPolicy = INT_MIN
        self.c.userProfilerTag = 0
        self.c.launchCompletionEvent = NULL

    def __init__(self, **fields):
        for name, value in fields.items():
            if name not in CollConfig.FIELDS:
                raise TypeError(f"ncclCollConfig_t has no field {name!r}; fields: {', '.join(CollConfig.FIELDS)}")
            setattr(self, name, value)

    def to_dict(self):
        """Every field by name, in struct order."""
        return {name: getattr(self, name) for name in CollConfig.FIELDS}

    def __eq__(self, other):
        if not isinstance(other, CollConfig):
            return NotImplemented
        return self.to_dict() == other.to_dict()

    def __repr__(self):
        fresh = CollConfig()
        changed = [f"{k}={v!r}" for k, v in self.to_dict().items() if getattr(fresh, k) != v]
        return f"CollConfig({', '.join(changed)})"

    @property
    def address(self):
        """Address of the underlying ncclCollConfig_t (valid while this object lives)."""
        return <uintptr_t>&self.c

    @property
    def size(self):
        return self.c.size

    @size.setter
    def size(self, value):
        self.c.size = _count(value, "CollConfig.size")

    @property
    def magic(self):
        return self.c.magic

    @magic.setter
    def magic(self, value):
        self.c.magic = <unsigned int>_unsigned(value, "CollConfig.magic")

    @property
    def version(self):
        return self.c.version

    @version.setter
    def version(self, value):
        self.c.version = <unsigned int>_unsigned(value, "CollConfig.version")

    @property
    def ext(self):
        return <uintptr_t>self.c.ext

    @ext.setter
    def ext(self, value):
        self.c.ext = <ncclConfigExt_t*>_addr(value, "CollConfig.ext")

    @property
    def minCTAs(self):
        return self.c.minCTAs

    @minCTAs.setter
    def minCTAs(self, value):
        self.c.minCTAs = _cint(value, "CollConfig.minCTAs")

    @property
    def maxCTAs(self):
        return self.c.maxCTAs

    @maxCTAs.setter
    def maxCTAs(self, value):
        self.c.maxCTAs = _cint(value, "CollConfig.maxCTAs")

    @property
    def nvlsCTAs(self):
        return self.c.nvlsCTAs

    @nvlsCTAs.setter
    def nvlsCTAs(self, value):
        self.c.nvlsCTAs = _cint(value, "CollConfig.nvlsCTAs")

    @property
    def cgaClusterSize(self):
        return self.c.cgaClusterSize

    @cgaClusterSize.setter
    def cgaClusterSize(self, value):
        self.c.cgaClusterSize = _cint(value, "CollConfig.cgaClusterSize")

    @property
    def algSelection(self):
        return None if self.c.algSelection == NULL else _decode(self.c.algSelection)

    @algSelection.setter
    def algSelection(self, value):
        data = _c_string(value, "CollConfig.algSelection")
        self._alg_selection = data
        self.c.algSelection = NULL if data is None else PyBytes_AS_STRING(data)

    @property
    def forceAlgSelection(self):
        return self.c.forceAlgSelection

    @forceAlgSelection.setter
    def forceAlgSelection(self, value):
        self.c.forceAlgSelection = _cint(value, "CollConfig.forceAlgSelection")

    @property
    def CTAPolicy(self):
        return self.c.CTAPolicy

    @CTAPolicy.setter
    def CTAPolicy(self, value):
        self.c.CTAPolicy = _cint(value, "CollConfig.CTAPolicy")

    @property
    def userProfilerTag(self):
        return self.c.userProfilerTag

    @userProfilerTag.setter
    def userProfilerTag(self, value):
        v = _index(value, "CollConfig.userProfilerTag")
        if v < 0 or v >= (<object>1 << 64):
            raise ValueError(f"CollConfig.userProfilerTag must be in [0, 2**64), got {v}")
        self.c.userProfilerTag = <uint64_t>v

    @property
    def launchCompletionEvent(self):
        return <uintptr_t>self.c.launchCompletionEvent

    @launchCompletionEvent.setter
    def launchCompletionEvent(self, value):
        self.c.launchCompletionEvent = <void*>_addr(value, "CollConfig.launchCompletionEvent")




def _config_from_dict(fields):
    return Config(**fields)


cdef class CommSlot:
    """Heap storage for the ncclComm_t written by a (possibly nonblocking) split/shrink/grow.

    ``value`` is 0 until the library has written the new communicator (and stays 0 for
    NOCOLOR or a failed init). The slot, and the copies of the arguments NCCL may still read in
    the background (shrink's exclude list, grow's unique id), stay valid as long as this object
    lives; when the call returned IN_PROGRESS the Library also keeps the slot alive until
    ``value`` has been read non-zero, so dropping it early never frees memory NCCL may write.
    """

    def __cinit__(self):
        self.ptr = <ncclComm_t*>calloc(1, sizeof(ncclComm_t))
        if self.ptr == NULL:
            raise MemoryError()

    def __init__(self):
        raise TypeError("CommSlot objects are returned by comm_split/comm_shrink/comm_grow")

    @property
    def value(self):
        """The new communicator handle, or 0 while it is not (yet) written."""
        cdef uintptr_t v = <uintptr_t>pycoll_load_ptr(<void**>self.ptr)
        if v != 0 and self._pending:
            self._pending = False
            if self.lib is not None:
                self.lib._pending_slots.discard(self)
        return v

    @property
    def pending(self):
        """True while the call returned IN_PROGRESS and no communicator has been seen yet; a slot that stays
        empty (SPLIT_NOCOLOR, a failed split or shrink) is pending until ``comm_get_async_error(parent)`` has
        returned something other than IN_PROGRESS."""
        return self.value == 0 and self._pending

    def __repr__(self):
        return f"<CommSlot value={self.value:#x}{' pending' if self.pending else ''}>"

    def __dealloc__(self):
        if self._pending and pycoll_load_ptr(<void**>self.ptr) == NULL:
            return  # the library may still write the slot or read the arguments: leak them
        free(self.ptr)
        free(self.exclude)
        if not self.keep_uid:
            free(self.uid)


cdef CommSlot _new_slot(Library lib, object config):
    cdef CommSlot slot = CommSlot.__new__(CommSlot)
    slot.lib = lib
    slot.config = config
    return slot
