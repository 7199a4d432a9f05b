# cython: language_level=3
"""Thin, GIL-free bindings to the NCCL C API, loaded at run time (the contract is _nccl.pyi).

One :class:`Library` per loaded shared object (libnccl, librccl, pycoll's host library, or any
object exporting the NCCL C ABI); several can be loaded in one process at once. Nothing is linked:
symbols are resolved with ``dlopen(RTLD_NOW | RTLD_LOCAL)`` / ``dlsym`` into a table, and a
function the library lacks raises :class:`pycoll.errors.NotSupported` when called.
"""

import logging
import os
import sys
import threading
from enum import IntEnum

from cpython.bytes cimport PyBytes_AS_STRING, PyBytes_FromStringAndSize
from cpython.long cimport PyLong_AsLongLongAndOverflow
from cpython.number cimport PyNumber_Index
from libc.limits cimport INT_MAX, INT_MIN, UINT_MAX
from libc.stdint cimport uint64_t, uintptr_t
from libc.stdlib cimport calloc, free
from libc.string cimport memcpy, memset, strlen, strncpy
from posix.dlfcn cimport RTLD_LOCAL, RTLD_NOW, dlclose, dlerror, dlopen, dlsym

from pycoll._bindings.nccl cimport *

from pycoll import errors as _errors
from pycoll.errors import LibraryError, NotSupported

cdef extern from "<link.h>":
    struct link_map:
        char* l_name
    struct dl_phdr_info:
        const char* dlpi_name
    ctypedef int (*_phdr_callback)(dl_phdr_info* info, size_t size, void* data) noexcept
    int dl_iterate_phdr(_phdr_callback callback, void* data)

cdef extern from "<dlfcn.h>":
    int dlinfo(void* handle, int request, void* info) nogil
    int RTLD_DI_LINKMAP

cdef extern from *:
    """
    static inline void* pycoll_load_ptr(void** slot) { return __atomic_load_n(slot, __ATOMIC_ACQUIRE); }
    """
    void* pycoll_load_ptr(void** slot) noexcept nogil

_log = logging.getLogger("pycoll.bindings")

__all__ = [
    "SUCCESS", "IN_PROGRESS", "UNIQUE_ID_BYTES", "SPLIT_NOCOLOR", "SHRINK_DEFAULT", "SHRINK_ABORT",
    "REVOKE_DEFAULT", "SUSPEND_MEM", "CONFIG_UNDEF_INT", "API_MAGIC", "HEADER_VERSION",
    "CONFIG_SIZE", "WIN_DEFAULT", "WIN_COLL_SYMMETRIC", "WIN_STRICT_ORDERING", "WIN_GIN_ONLY",
    "WIN_CFT_COUNTED", "WIN_REQUIRED_ALIGNMENT", "CTA_POLICY_DEFAULT", "CTA_POLICY_EFFICIENCY",
    "CTA_POLICY_ZERO", "Result", "DataType", "RedOp", "ScalarResidence", "CommMemStat",
    "FUNCTIONS", "RCCL_FUNCTIONS", "HOST_FUNCTIONS", "version_tuple", "UniqueId", "Config",
    "CollConfig", "CommSlot", "Library", "load", "loaded",
]

# --- constants -------------------------------------------------------------------------------
SUCCESS = 0
IN_PROGRESS = 7
UNIQUE_ID_BYTES = 128
SPLIT_NOCOLOR = -1
SHRINK_DEFAULT = 0
SHRINK_ABORT = 1
REVOKE_DEFAULT = 0
SUSPEND_MEM = 1
CONFIG_UNDEF_INT = INT_MIN
API_MAGIC = 0xcafebeef
HEADER_VERSION = NCCL_VERSION_CODE
CONFIG_SIZE = sizeof(ncclConfig_t)
WIN_DEFAULT = 0x00
WIN_COLL_SYMMETRIC = 0x01
WIN_STRICT_ORDERING = 0x02
WIN_GIN_ONLY = 0x04
WIN_CFT_COUNTED = 0x08
WIN_REQUIRED_ALIGNMENT = 4096
CTA_POLICY_DEFAULT = 0x00
CTA_POLICY_EFFICIENCY = 0x01
CTA_POLICY_ZERO = 0x02


class Result(IntEnum):
    """ncclResult_t."""
    Success = 0
    UnhandledCudaError = 1
    SystemError = 2
    InternalError = 3
    InvalidArgument = 4
    InvalidUsage = 5
    RemoteError = 6
    InProgress = 7
    Timeout = 8


class DataType(IntEnum):
    """ncclDataType_t (ncclChar/ncclInt/ncclHalf/ncclFloat/ncclDouble are aliases)."""
    Int8 = 0
    Uint8 = 1
    Int32 = 2
    Uint32 = 3
    Int64 = 4
    Uint64 = 5
    Float16 = 6
    Float32 = 7
    Float64 = 8
    Bfloat16 = 9
    Float8e4m3 = 10
    Float8e5m2 = 11


class RedOp(IntEnum):
    """The built-in ncclRedOp_t values; ids >= 5 are created by ncclRedOpCreatePreMulSum."""
    Sum = 0
    Prod = 1
    Max = 2
    Min = 3
    Avg = 4


class ScalarResidence(IntEnum):
    """ncclScalarResidence_t."""
    Device = 0
    HostImmediate = 1


class CommMemStat(IntEnum):
    """ncclCommMemStat_t."""
    GpuMemSuspend = 0
    GpuMemSuspended = 1
    GpuMemPersist = 2
    GpuMemTotal = 3


#: Every NCCL host function pycoll declares -> the NCCL release that introduced it.
#: "2.3" marks functions already present in the oldest release checked (2.3.5); "2.31" marks the
#: functions absent from 2.30.7 and present in 2.32.3.
FUNCTIONS = {
    "ncclGetVersion": "2.3",
    "ncclGetErrorString": "2.3",
    "ncclGetLastError": "2.13",
    "ncclCommGetAsyncError": "2.4",
    "ncclResetDebugInit": "2.24",  # inferred from a third-party version guard, not from NCCL's tags
    "ncclGetUniqueId": "2.3",
    "ncclCommGetUniqueId": "2.29",
    "ncclCommInitRank": "2.3",
    "ncclCommInitAll": "2.3",
    "ncclCommInitRankConfig": "2.14",
    "ncclCommInitRankScalable": "2.23",
    "ncclCommSplit": "2.18",
    "ncclCommShrink": "2.27",
    "ncclCommGrow": "2.29",
    "ncclCommFinalize": "2.14",
    "ncclCommDestroy": "2.3",
    "ncclCommAbort": "2.4",
    "ncclCommRevoke": "2.28.7",
    "ncclCommSuspend": "2.29.7",
    "ncclCommResume": "2.29.7",
    "ncclCommMemStats": "2.29.7",
    "ncclCommCount": "2.3",
    "ncclCommCuDevice": "2.3",
    "ncclCommUserRank": "2.3",
    "ncclMemAlloc": "2.19",
    "ncclMemFree": "2.19",
    "ncclCommRegister": "2.19",
    "ncclCommDeregister": "2.19",
    "ncclCommWindowRegister": "2.27",
    "ncclCommWindowDeregister": "2.27",
    "ncclWinGetUserPtr": "2.29",
    "ncclRedOpCreatePreMulSum": "2.11",
    "ncclRedOpDestroy": "2.11",
    "ncclReduce": "2.3",
    "ncclBcast": "2.3",
    "ncclBroadcast": "2.3",
    "ncclAllReduce": "2.3",
    "ncclReduceScatter": "2.3",
    "ncclAllGather": "2.3",
    "ncclAlltoAll": "2.28",
    "ncclGather": "2.28",
    "ncclScatter": "2.28",
    "ncclAllReduceConfig": "2.31",
    "ncclBroadcastConfig": "2.31",
    "ncclReduceConfig": "2.31",
    "ncclAllGatherConfig": "2.31",
    "ncclReduceScatterConfig": "2.31",
    "ncclAlltoAllConfig": "2.31",
    "ncclGatherConfig": "2.31",
    "ncclScatterConfig": "2.31",
    "ncclSend": "2.7",
    "ncclRecv": "2.7",
    "ncclPutSignal": "2.29",
    "ncclSignal": "2.29",
    "ncclWaitSignal": "2.29",
    "ncclGroupStart": "2.3",
    "ncclGroupEnd": "2.3",
    "ncclGroupSimulateEnd": "2.22",
    "ncclParamBind": "2.30.4",
    "ncclParamGetI8": "2.30.4",
    "ncclParamGetI16": "2.30.4",
    "ncclParamGetI32": "2.30.4",
    "ncclParamGetI64": "2.30.4",
    "ncclParamGetU8": "2.30.4",
    "ncclParamGetU16": "2.30.4",
    "ncclParamGetU32": "2.30.4",
    "ncclParamGetU64": "2.30.4",
    "ncclParamGetStr": "2.30.4",
    "ncclParamGet": "2.30.4",
    "ncclParamGetParameter": "2.30.4",
    "ncclParamGetAllParameterKeys": "2.30.4",
    "ncclParamDumpAll": "2.30.4",
    "ncclSetEncryption": "2.31",
}

#: Functions only RCCL exports; their presence makes a library's ``kind`` "rccl".
RCCL_FUNCTIONS = ("ncclAllToAllv", "ncclAllReduceWithBias")

#: The pycoll host library's extra functions (pycoll_host.h); pycollHostGetVersion marks kind "host".
HOST_FUNCTIONS = (
    "pycollHostGetVersion",
    "pycollStreamCreate",
    "pycollStreamDestroy",
    "pycollStreamSynchronize",
    "pycollStreamQuery",
    "pycollStreamWaitEvent",
    "pycollEventCreate",
    "pycollEventDestroy",
    "pycollEventRecord",
    "pycollEventQuery",
    "pycollEventSynchronize",
    "pycollEventElapsedTime",
)


def version_tuple(code):
    """Decode an NCCL version code: X*1000+Y*100+Z up to 2.8, X*10000+Y*100+Z after."""
    code = int(code)
    if code < 0:
        raise ValueError(f"an NCCL version code is >= 0, got {code}")
    if code < 10000:
        return (code // 1000, (code % 1000) // 100, code % 100)
    return (code // 10000, (code % 10000) // 100, code % 100)


# --- argument conversion (every check runs before any C call) ----------------------------------
cdef object _UINTPTR_MAX = (<object>1 << (8 * sizeof(uintptr_t))) - 1
cdef object _SIZE_MAX = (<object>1 << (8 * sizeof(size_t))) - 1

cdef object _index(object value, str what):
    if value is None:
        raise TypeError(f"{what} must be an int, not None")
    try:
        return PyNumber_Index(value)
    except TypeError:
        raise TypeError(f"{what} must be an int, not {type(value).__name__}") from None


cdef long long _ll(object v, int* overflow) except? -1:
    """An exact int (from _index) as a C long long; *overflow is -1/+1 when it does not fit."""
    return PyLong_AsLongLongAndOverflow(v, overflow)


cdef uintptr_t _addr(object value, str what) except? 0:
    """A handle or address: an int in [0, UINTPTR_MAX]; 0 is NULL."""
    cdef int overflow = 0
    cdef long long x
    if value is None:
        raise TypeError(f"{what} must be an int handle or address (0 for NULL), not None")
    v = _index(value, what)
    x = _ll(v, &overflow)
    if overflow == 0 and x >= 0:
        return <uintptr_t>x
    if overflow > 0 and v <= _UINTPTR_MAX:
        return <uintptr_t>v
    raise ValueError(f"{what} must be an address in [0, 2**{8 * sizeof(uintptr_t)}), got {v}")


cdef size_t _count(object value, str what) except? 0:
    cdef int overflow = 0
    cdef long long x
    v = _index(value, what)
    x = _ll(v, &overflow)
    if overflow == 0 and x >= 0:
        return <size_t>x
    if overflow < 0 or (overflow == 0 and x < 0):
        raise ValueError(f"{what} must be >= 0, got {v}")
    if v > _SIZE_MAX:
        raise ValueError(f"{what} is too large for size_t: {v}")
    return <size_t>v


cdef int _cint(object value, str what, long long lo=INT_MIN, long long hi=INT_MAX) except? -1:
    cdef int overflow = 0
    cdef long long x
    v = _index(value, what)
    x = _ll(v, &overflow)
    if overflow == 0 and lo <= x <= hi:
        return <int>x
    if lo == 0 and (overflow < 0 or (overflow == 0 and x < 0)):
        raise ValueError(f"{what} must be >= 0, got {v}")
    raise ValueError(f"{what} must be in [{lo}, {hi}], got {v}")


cdef int _dtype(object value) except -1:
    cdef int overflow = 0
    cdef long long x
    v = _index(value, "datatype")
    x = _ll(v, &overflow)
    if overflow == 0 and 0 <= x < <int>ncclNumTypes:
        return <int>x
    raise ValueError(f"unknown datatype {v}: an ncclDataType_t is 0..{<int>ncclNumTypes - 1} (see DataType)")


cdef int _op(object value) except -1:
    cdef int overflow = 0
    cdef long long x
    v = _index(value, "op")
    x = _ll(v, &overflow)
    if overflow == 0 and 0 <= x <= INT_MAX:
        return <int>x
    raise ValueError(f"unknown op {v}: an ncclRedOp_t is 0..4 (see RedOp) or a dynamic op id >= 5 "
                     "from red_op_create_pre_mul_sum")


cdef ncclComm_t _comm(object value) except? NULL:
    return <ncclComm_t>_addr(value, "comm")


cdef void* _ptr(object value, str what) except? NULL:
    return <void*>_addr(value, what)


cdef str _decode(const char* s):
    if s == NULL:
        return ""
    return s[:strlen(s)].decode("utf-8", "replace")


cdef ncclUniqueId* _uid_ptr(object uid, str what) except NULL:
    if isinstance(uid, UniqueId):
        return &(<UniqueId>uid).c
    raise TypeError(f"{what} must be a UniqueId, not {type(uid).__name__}")


cdef ncclConfig_t* _config_ptr(object config) except? NULL:
    if config is None:
        return NULL
    if isinstance(config, Config):
        return &(<Config>config).c
    raise TypeError(f"config must be a Config or None, not {type(config).__name__}")


# --- value types -----------------------------------------------------------------------------
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
            view = memoryview(data).cast("B")
        except TypeError:
            raise TypeError(f"UniqueId data must be bytes-like, not {type(data).__name__}") from None
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


cdef const ncclCollConfig_t* _coll_config_ptr(object config) except? NULL:
    if config is None:
        return NULL
    if isinstance(config, CollConfig):
        return &(<CollConfig>config).c
    raise TypeError(f"config must be a CollConfig or None, not {type(config).__name__}")


cdef bytes _c_string(object value, str what):
    """str/bytes/None -> NUL-free bytes or None."""
    if value is None:
        return None
    if isinstance(value, str):
        data = (<str>value).encode("utf-8")
    elif isinstance(value, bytes):
        data = value
    else:
        raise TypeError(f"{what} must be str, bytes or None, not {type(value).__name__}")
    if b"\0" in data:
        raise ValueError(f"{what} must not contain NUL characters")
    return data


cdef unsigned long long _unsigned(object value, str what) except? 0:
    v = _index(value, what)
    if v < 0 or v > UINT_MAX:
        raise ValueError(f"{what} must be in [0, {UINT_MAX}], got {v}")
    return <unsigned long long>v


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
        """True while the call returned IN_PROGRESS and no communicator has been seen yet."""
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


# --- errors ----------------------------------------------------------------------------------
cdef inline void _capture(const pycoll_nccl_table* t, int r, ncclComm_t comm, _LastError* e) noexcept nogil:
    """Copy ncclGetLastError right after a failed call (before another call can overwrite it)."""
    cdef const char* s
    e.text[0] = 0
    if r == ncclSuccess or r == ncclInProgress or t.ncclGetLastError == NULL:
        return
    s = t.ncclGetLastError(comm)
    if s != NULL:
        strncpy(e.text, s, sizeof(e.text) - 1)
        e.text[sizeof(e.text) - 1] = 0


# --- the library ---------------------------------------------------------------------------------
cdef class Library:
    """One loaded NCCL-ABI shared object and its symbol table (resolved with dlsym).

    Obtain one with :func:`load`. Every method releases the GIL around its C call; a method
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

    cdef void* _sym(self, str name):
        cdef bytes bname = name.encode()
        cdef void* p = dlsym(self.handle, bname)
        dlerror()
        self._exported[name] = p != NULL
        return p

    cdef _resolve(self):
        cdef pycoll_nccl_table* t = &self.fn
        t.ncclGetVersion = <ncclGetVersion_fn>self._sym("ncclGetVersion")
        t.ncclGetErrorString = <ncclGetErrorString_fn>self._sym("ncclGetErrorString")
        t.ncclGetLastError = <ncclGetLastError_fn>self._sym("ncclGetLastError")
        t.ncclCommGetAsyncError = <ncclCommGetAsyncError_fn>self._sym("ncclCommGetAsyncError")
        t.ncclResetDebugInit = <ncclResetDebugInit_fn>self._sym("ncclResetDebugInit")
        t.ncclGetUniqueId = <ncclGetUniqueId_fn>self._sym("ncclGetUniqueId")
        t.ncclCommGetUniqueId = <ncclCommGetUniqueId_fn>self._sym("ncclCommGetUniqueId")
        t.ncclCommInitRank = <ncclCommInitRank_fn>self._sym("ncclCommInitRank")
        t.ncclCommInitAll = <ncclCommInitAll_fn>self._sym("ncclCommInitAll")
        t.ncclCommInitRankConfig = <ncclCommInitRankConfig_fn>self._sym("ncclCommInitRankConfig")
        t.ncclCommInitRankScalable = <ncclCommInitRankScalable_fn>self._sym("ncclCommInitRankScalable")
        t.ncclCommSplit = <ncclCommSplit_fn>self._sym("ncclCommSplit")
        t.ncclCommShrink = <ncclCommShrink_fn>self._sym("ncclCommShrink")
        t.ncclCommGrow = <ncclCommGrow_fn>self._sym("ncclCommGrow")
        t.ncclCommFinalize = <ncclCommFinalize_fn>self._sym("ncclCommFinalize")
        t.ncclCommDestroy = <ncclCommDestroy_fn>self._sym("ncclCommDestroy")
        t.ncclCommAbort = <ncclCommAbort_fn>self._sym("ncclCommAbort")
        t.ncclCommRevoke = <ncclCommRevoke_fn>self._sym("ncclCommRevoke")
        t.ncclCommSuspend = <ncclCommSuspend_fn>self._sym("ncclCommSuspend")
        t.ncclCommResume = <ncclCommResume_fn>self._sym("ncclCommResume")
        t.ncclCommMemStats = <ncclCommMemStats_fn>self._sym("ncclCommMemStats")
        t.ncclCommCount = <ncclCommCount_fn>self._sym("ncclCommCount")
        t.ncclCommCuDevice = <ncclCommCuDevice_fn>self._sym("ncclCommCuDevice")
        t.ncclCommUserRank = <ncclCommUserRank_fn>self._sym("ncclCommUserRank")
        t.ncclMemAlloc = <ncclMemAlloc_fn>self._sym("ncclMemAlloc")
        t.ncclMemFree = <ncclMemFree_fn>self._sym("ncclMemFree")
        t.ncclCommRegister = <ncclCommRegister_fn>self._sym("ncclCommRegister")
        t.ncclCommDeregister = <ncclCommDeregister_fn>self._sym("ncclCommDeregister")
        t.ncclCommWindowRegister = <ncclCommWindowRegister_fn>self._sym("ncclCommWindowRegister")
        t.ncclCommWindowDeregister = <ncclCommWindowDeregister_fn>self._sym("ncclCommWindowDeregister")
        t.ncclWinGetUserPtr = <ncclWinGetUserPtr_fn>self._sym("ncclWinGetUserPtr")
        t.ncclRedOpCreatePreMulSum = <ncclRedOpCreatePreMulSum_fn>self._sym("ncclRedOpCreatePreMulSum")
        t.ncclRedOpDestroy = <ncclRedOpDestroy_fn>self._sym("ncclRedOpDestroy")
        t.ncclReduce = <ncclReduce_fn>self._sym("ncclReduce")
        t.ncclBcast = <ncclBcast_fn>self._sym("ncclBcast")
        t.ncclBroadcast = <ncclBroadcast_fn>self._sym("ncclBroadcast")
        t.ncclAllReduce = <ncclAllReduce_fn>self._sym("ncclAllReduce")
        t.ncclReduceScatter = <ncclReduceScatter_fn>self._sym("ncclReduceScatter")
        t.ncclAllGather = <ncclAllGather_fn>self._sym("ncclAllGather")
        t.ncclAlltoAll = <ncclAlltoAll_fn>self._sym("ncclAlltoAll")
        t.ncclGather = <ncclGather_fn>self._sym("ncclGather")
        t.ncclScatter = <ncclScatter_fn>self._sym("ncclScatter")
        t.ncclAllReduceConfig = <ncclAllReduceConfig_fn>self._sym("ncclAllReduceConfig")
        t.ncclBroadcastConfig = <ncclBroadcastConfig_fn>self._sym("ncclBroadcastConfig")
        t.ncclReduceConfig = <ncclReduceConfig_fn>self._sym("ncclReduceConfig")
        t.ncclAllGatherConfig = <ncclAllGatherConfig_fn>self._sym("ncclAllGatherConfig")
        t.ncclReduceScatterConfig = <ncclReduceScatterConfig_fn>self._sym("ncclReduceScatterConfig")
        t.ncclAlltoAllConfig = <ncclAlltoAllConfig_fn>self._sym("ncclAlltoAllConfig")
        t.ncclGatherConfig = <ncclGatherConfig_fn>self._sym("ncclGatherConfig")
        t.ncclScatterConfig = <ncclScatterConfig_fn>self._sym("ncclScatterConfig")
        t.ncclSend = <ncclSend_fn>self._sym("ncclSend")
        t.ncclRecv = <ncclRecv_fn>self._sym("ncclRecv")
        t.ncclPutSignal = <ncclPutSignal_fn>self._sym("ncclPutSignal")
        t.ncclSignal = <ncclSignal_fn>self._sym("ncclSignal")
        t.ncclWaitSignal = <ncclWaitSignal_fn>self._sym("ncclWaitSignal")
        t.ncclGroupStart = <ncclGroupStart_fn>self._sym("ncclGroupStart")
        t.ncclGroupEnd = <ncclGroupEnd_fn>self._sym("ncclGroupEnd")
        t.ncclGroupSimulateEnd = <ncclGroupSimulateEnd_fn>self._sym("ncclGroupSimulateEnd")
        t.ncclParamBind = <ncclParamBind_fn>self._sym("ncclParamBind")
        t.ncclParamGetI8 = <ncclParamGetI8_fn>self._sym("ncclParamGetI8")
        t.ncclParamGetI16 = <ncclParamGetI16_fn>self._sym("ncclParamGetI16")
        t.ncclParamGetI32 = <ncclParamGetI32_fn>self._sym("ncclParamGetI32")
        t.ncclParamGetI64 = <ncclParamGetI64_fn>self._sym("ncclParamGetI64")
        t.ncclParamGetU8 = <ncclParamGetU8_fn>self._sym("ncclParamGetU8")
        t.ncclParamGetU16 = <ncclParamGetU16_fn>self._sym("ncclParamGetU16")
        t.ncclParamGetU32 = <ncclParamGetU32_fn>self._sym("ncclParamGetU32")
        t.ncclParamGetU64 = <ncclParamGetU64_fn>self._sym("ncclParamGetU64")
        t.ncclParamGetStr = <ncclParamGetStr_fn>self._sym("ncclParamGetStr")
        t.ncclParamGet = <ncclParamGet_fn>self._sym("ncclParamGet")
        t.ncclParamGetParameter = <ncclParamGetParameter_fn>self._sym("ncclParamGetParameter")
        t.ncclParamGetAllParameterKeys = <ncclParamGetAllParameterKeys_fn>self._sym("ncclParamGetAllParameterKeys")
        t.ncclParamDumpAll = <ncclParamDumpAll_fn>self._sym("ncclParamDumpAll")
        t.ncclSetEncryption = <ncclSetEncryption_fn>self._sym("ncclSetEncryption")
        t.pycollHostGetVersion = <pycollHostGetVersion_fn>self._sym("pycollHostGetVersion")
        t.pycollStreamCreate = <pycollStreamCreate_fn>self._sym("pycollStreamCreate")
        t.pycollStreamDestroy = <pycollStreamDestroy_fn>self._sym("pycollStreamDestroy")
        t.pycollStreamSynchronize = <pycollStreamSynchronize_fn>self._sym("pycollStreamSynchronize")
        t.pycollStreamQuery = <pycollStreamQuery_fn>self._sym("pycollStreamQuery")
        t.pycollStreamWaitEvent = <pycollStreamWaitEvent_fn>self._sym("pycollStreamWaitEvent")
        t.pycollEventCreate = <pycollEventCreate_fn>self._sym("pycollEventCreate")
        t.pycollEventDestroy = <pycollEventDestroy_fn>self._sym("pycollEventDestroy")
        t.pycollEventRecord = <pycollEventRecord_fn>self._sym("pycollEventRecord")
        t.pycollEventQuery = <pycollEventQuery_fn>self._sym("pycollEventQuery")
        t.pycollEventSynchronize = <pycollEventSynchronize_fn>self._sym("pycollEventSynchronize")
        t.pycollEventElapsedTime = <pycollEventElapsedTime_fn>self._sym("pycollEventElapsedTime")
        for name in RCCL_FUNCTIONS:
            self._sym(name)

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
        """CommSlots of nonblocking split/shrink/grow calls whose communicator was not seen yet."""
        return list(self._pending_slots)

    @property
    def symbols(self):
        """name -> exported, for every function looked up so far."""
        return dict(self._exported)

    cdef int _missing(self, str name) except -1:
        if name.startswith("pycoll"):
            raise NotSupported(name, "", self.path, "a pycoll host library function")
        raise NotSupported(name, FUNCTIONS.get(name, ""), self.path)

    cdef int _check(self, int r, str function, _LastError* e) except -1:
        """Return SUCCESS or IN_PROGRESS; raise the NCCLError subclass of any other result."""
        if r == ncclSuccess or r == ncclInProgress:
            return r
        raise _errors.error_class(r)(r, function, self._error_string(r), _decode(e.text), self.path)

    cdef int _done(self, int r, str function, _LastError* e) except -1:
        """Like _check, for calls whose output is only valid on success: IN_PROGRESS raises."""
        self._check(r, function, e)
        if r == ncclInProgress:
            raise _errors.InProgressError(
                r, function, self._error_string(r),
                "the call returned ncclInProgress, so its output is not available yet; poll "
                "comm_get_async_error and retry", self.path)
        return r

    cdef str _error_string(self, int r):
        cdef const char* s
        if self.fn.ncclGetErrorString == NULL:
            return ""
        with nogil:
            s = self.fn.ncclGetErrorString(<ncclResult_t>r)
        return _decode(s)

    # --- errors and versions ---------------------------------------------------------------
    def get_version(self):
        """ncclGetVersion(): the library's version code (e.g. 23203 for 2.32.3)."""
        cdef int v = 0
        cdef int r
        cdef _LastError e
        if self.fn.ncclGetVersion == NULL:
            self._missing("ncclGetVersion")
        with nogil:
            r = self.fn.ncclGetVersion(&v)
            _capture(&self.fn, r, NULL, &e)
        self._done(r, "ncclGetVersion", &e)
        return v

    def get_error_string(self, result):
        """ncclGetErrorString(result)."""
        cdef int code = _cint(result, "result")
        if self.fn.ncclGetErrorString == NULL:
            self._missing("ncclGetErrorString")
        return self._error_string(code)

    def get_last_error(self, comm=0):
        """ncclGetLastError(comm): the last error text (comm 0 = the process-wide one)."""
        cdef ncclComm_t c = _comm(comm)
        cdef const char* s
        if self.fn.ncclGetLastError == NULL:
            self._missing("ncclGetLastError")
        with nogil:
            s = self.fn.ncclGetLastError(c)
        return _decode(s)

    def comm_get_async_error(self, comm):
        """ncclCommGetAsyncError: the communicator's asynchronous result (SUCCESS, IN_PROGRESS or
        an error code), returned, not raised. Safe to call from a watchdog thread."""
        cdef ncclComm_t c = _comm(comm)
        cdef ncclResult_t state = ncclSuccess
        cdef int r
        cdef _LastError e
        if self.fn.ncclCommGetAsyncError == NULL:
            self._missing("ncclCommGetAsyncError")
        with nogil:
            r = self.fn.ncclCommGetAsyncError(c, &state)
            _capture(&self.fn, r, c, &e)
        self._done(r, "ncclCommGetAsyncError", &e)
        return <int>state

    # --- unique ids and communicator creation ----------------------------------------------
    def get_unique_id(self):
        """ncclGetUniqueId (NCCL starts a bootstrap listener; set NCCL_SOCKET_IFNAME to choose
        its interface)."""
        cdef UniqueId uid = UniqueId()
        cdef int r
        cdef _LastError e
        if self.fn.ncclGetUniqueId == NULL:
            self._missing("ncclGetUniqueId")
        with nogil:
            r = self.fn.ncclGetUniqueId(&uid.c)
            _capture(&self.fn, r, NULL, &e)
        self._done(r, "ncclGetUniqueId", &e)
        return uid

    def comm_get_unique_id(self, comm):
        """ncclCommGetUniqueId: the id new ranks pass to comm_grow (one coordinator calls it)."""
        cdef ncclComm_t c = _comm(comm)
        cdef UniqueId uid = UniqueId()
        cdef int r
        cdef _LastError e
        if self.fn.ncclCommGetUniqueId == NULL:
            self._missing("ncclCommGetUniqueId")
        with nogil:
            r = self.fn.ncclCommGetUniqueId(c, &uid.c)
            _capture(&self.fn, r, c, &e)
        self._done(r, "ncclCommGetUniqueId", &e)
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
        cdef int r
        cdef _LastError e
        if rk >= n:
            raise ValueError(f"rank must be < nranks ({n}), got {rk}")
        if self.fn.ncclCommInitRank == NULL:
            self._missing("ncclCommInitRank")
        with nogil:
            r = self.fn.ncclCommInitRank(&c, n, uid[0], rk)
            _capture(&self.fn, r, NULL, &e)
        try:
            self._done(r, "ncclCommInitRank", &e)
        except _errors.NCCLError as exc:
            exc.comm = <uintptr_t>c
            raise
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
        cdef int r
        cdef _LastError e
        if rk >= n:
            raise ValueError(f"rank must be < nranks ({n}), got {rk}")
        if self.fn.ncclCommInitRankConfig == NULL:
            self._missing("ncclCommInitRankConfig")
        with nogil:
            r = self.fn.ncclCommInitRankConfig(&c, n, uid[0], rk, cfg)
            _capture(&self.fn, r, NULL, &e)
        try:
            status = self._check(r, "ncclCommInitRankConfig", &e)
        except _errors.NCCLError as exc:
            exc.comm = <uintptr_t>c  # non-zero: a nonblocking comm NCCL left behind; abort it
            raise
        return (<uintptr_t>c, status)

    def comm_init_rank_scalable(self, nranks, rank, unique_ids, config=None):
        """ncclCommInitRankScalable with one or more unique ids: ``(comm, status)``."""
        cdef int n = _cint(nranks, "nranks", 1)
        cdef int rk = _cint(rank, "rank", 0)
        cdef ncclConfig_t* cfg = _config_ptr(config)
        cdef ncclComm_t c = NULL
        cdef ncclUniqueId* ids
        cdef int nid, i, r
        cdef _LastError e
        if rk >= n:
            raise ValueError(f"rank must be < nranks ({n}), got {rk}")
        if isinstance(unique_ids, UniqueId):
            unique_ids = [unique_ids]
        ids_list = list(unique_ids)
        if not ids_list:
            raise ValueError("unique_ids must hold at least one UniqueId")
        if len(ids_list) > n:
            raise ValueError(f"unique_ids holds {len(ids_list)} ids, more than nranks ({n})")
        for i, uid in enumerate(ids_list):
            _uid_ptr(uid, f"unique_ids[{i}]")
        if self.fn.ncclCommInitRankScalable == NULL:
            self._missing("ncclCommInitRankScalable")
        nid = len(ids_list)
        ids = <ncclUniqueId*>calloc(nid, sizeof(ncclUniqueId))
        if ids == NULL:
            raise MemoryError()
        try:
            for i in range(nid):
                ids[i] = (<UniqueId>ids_list[i]).c
            with nogil:
                r = self.fn.ncclCommInitRankScalable(&c, n, rk, nid, ids, cfg)
                _capture(&self.fn, r, NULL, &e)
        finally:
            free(ids)  # NCCL copies the ids before it returns
        try:
            status = self._check(r, "ncclCommInitRankScalable", &e)
        except _errors.NCCLError as exc:
            exc.comm = <uintptr_t>c
            raise
        return (<uintptr_t>c, status)

    def comm_init_all(self, ndev, devlist=None):
        """ncclCommInitAll: one communicator per device of this process (devlist None = 0..ndev-1)."""
        cdef int n = _cint(ndev, "ndev", 1)
        cdef ncclComm_t* comms
        cdef int* devs = NULL
        cdef int i, r
        cdef _LastError e
        if devlist is not None:
            devs_list = [_cint(d, f"devlist[{j}]", 0) for j, d in enumerate(devlist)]
            if len(devs_list) != n:
                raise ValueError(f"devlist holds {len(devs_list)} devices, ndev is {n}")
        if self.fn.ncclCommInitAll == NULL:
            self._missing("ncclCommInitAll")
        comms = <ncclComm_t*>calloc(n, sizeof(ncclComm_t))
        if comms == NULL:
            raise MemoryError()
        try:
            if devlist is not None:
                devs = <int*>calloc(n, sizeof(int))
                if devs == NULL:
                    raise MemoryError()
                for i in range(n):
                    devs[i] = devs_list[i]
            with nogil:
                r = self.fn.ncclCommInitAll(comms, n, devs)
                _capture(&self.fn, r, NULL, &e)
            result = [<uintptr_t>comms[i] for i in range(n)]
        finally:
            free(comms)
            free(devs)
        try:
            self._done(r, "ncclCommInitAll", &e)
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
        cdef int k = _cint(key, "key")
        cdef ncclConfig_t* cfg = _config_ptr(config)
        cdef CommSlot slot
        cdef int r
        cdef _LastError e
        if col < 0 and col != NCCL_SPLIT_NOCOLOR:
            raise ValueError(f"color must be >= 0 or SPLIT_NOCOLOR (-1), got {col}")
        if self.fn.ncclCommSplit == NULL:
            self._missing("ncclCommSplit")
        slot = _new_slot(self, config)
        with nogil:
            r = self.fn.ncclCommSplit(c, col, k, slot.ptr, cfg)
            _capture(&self.fn, r, c, &e)
        self._track(slot, r)
        return (slot, self._check(r, "ncclCommSplit", &e))

    def comm_shrink(self, comm, exclude_ranks, config=None, flags=0):
        """ncclCommShrink: ``(slot, status)``. Only the surviving ranks call it, all with the same
        ``exclude_ranks`` (at least one rank). ``flags``: SHRINK_DEFAULT, or SHRINK_ABORT to
        abort the parent's outstanding operations first (use it after an error)."""
        cdef ncclComm_t c = _comm(comm)
        cdef ncclConfig_t* cfg = _config_ptr(config)
        cdef int fl = _cint(flags, "flags", 0)
        cdef CommSlot slot
        cdef int n, i, r
        cdef _LastError e
        if isinstance(exclude_ranks, (str, bytes)):
            raise TypeError("exclude_ranks must be a sequence of ints")
        try:
            ranks = [_cint(x, "exclude_ranks[...]", 0) for x in exclude_ranks]
        except TypeError as exc:
            raise TypeError(f"exclude_ranks must be a sequence of ints: {exc}") from None
        if not ranks:
            raise ValueError("exclude_ranks must name at least one rank (NCCL requires excludeRanksCount > 0)")
        if len(set(ranks)) != len(ranks):
            raise ValueError(f"exclude_ranks holds duplicates: {ranks}")
        if self.fn.ncclCommShrink == NULL:
            self._missing("ncclCommShrink")
        n = len(ranks)
        slot = _new_slot(self, config)
        slot.exclude = <int*>calloc(n, sizeof(int))  # NCCL sorts it in place, maybe in the background
        if slot.exclude == NULL:
            raise MemoryError()
        for i in range(n):
            slot.exclude[i] = ranks[i]
        with nogil:
            r = self.fn.ncclCommShrink(c, slot.exclude, n, slot.ptr, cfg, fl)
            _capture(&self.fn, r, c, &e)
        self._track(slot, r)
        return (slot, self._check(r, "ncclCommShrink", &e))

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
        cdef int r
        cdef _LastError e
        if rk >= n:
            raise ValueError(f"rank must be < nranks ({n}), got {rk}")
        if c == NULL and (rk < 0 or src == NULL):
            raise ValueError("a new rank (comm 0) needs rank >= 0 and the coordinator's unique_id")
        if c != NULL and rk != -1:
            raise ValueError(f"an existing rank (comm given) passes rank -1, got {rk}")
        if self.fn.ncclCommGrow == NULL:
            self._missing("ncclCommGrow")
        slot = _new_slot(self, config)
        if src != NULL:
            slot.uid = <ncclUniqueId*>calloc(1, sizeof(ncclUniqueId))
            if slot.uid == NULL:
                raise MemoryError()
            slot.uid[0] = src[0]
        with nogil:
            r = self.fn.ncclCommGrow(c, n, slot.uid, rk, slot.ptr, cfg)
            _capture(&self.fn, r, c, &e)
        if r == ncclInProgress:
            slot.keep_uid = True  # NCCL may read it until the new communicator is ready
        self._track(slot, r)
        return (slot, self._check(r, "ncclCommGrow", &e))

    cdef _track(self, CommSlot slot, int r):
        if r == ncclInProgress:
            slot._pending = True
            self._pending_slots.add(slot)

    # --- teardown and state ----------------------------------------------------------------
    def comm_finalize(self, comm):
        """ncclCommFinalize: flush outstanding work (collective in effect); status."""
        cdef ncclComm_t c = _comm(comm)
        cdef int r
        cdef _LastError e
        if self.fn.ncclCommFinalize == NULL:
            self._missing("ncclCommFinalize")
        with nogil:
            r = self.fn.ncclCommFinalize(c)
            _capture(&self.fn, r, c, &e)
        return self._check(r, "ncclCommFinalize", &e)

    def comm_destroy(self, comm):
        """ncclCommDestroy: free the communicator (an intra-node collective if not finalized);
        never use the handle afterwards."""
        cdef ncclComm_t c = _comm(comm)
        cdef int r
        cdef _LastError e
        if self.fn.ncclCommDestroy == NULL:
            self._missing("ncclCommDestroy")
        with nogil:
            r = self.fn.ncclCommDestroy(c)
            _capture(&self.fn, r, NULL, &e)
        return self._check(r, "ncclCommDestroy", &e)

    def comm_abort(self, comm):
        """ncclCommAbort: stop outstanding work and free the communicator. May be called from
        another thread while one is inside a call on the same communicator (NCCL >= 2.19)."""
        cdef ncclComm_t c = _comm(comm)
        cdef int r
        cdef _LastError e
        if self.fn.ncclCommAbort == NULL:
            self._missing("ncclCommAbort")
        with nogil:
            r = self.fn.ncclCommAbort(c)
            _capture(&self.fn, r, NULL, &e)
        return self._check(r, "ncclCommAbort", &e)

    def comm_revoke(self, comm, flags=0):
        """ncclCommRevoke: stop in-flight work without destroying (local); ``flags`` must be
        REVOKE_DEFAULT. Status; IN_PROGRESS until quiescent (poll comm_get_async_error)."""
        cdef ncclComm_t c = _comm(comm)
        cdef int fl = _cint(flags, "flags", 0)
        cdef int r
        cdef _LastError e
        if self.fn.ncclCommRevoke == NULL:
            self._missing("ncclCommRevoke")
        with nogil:
            r = self.fn.ncclCommRevoke(c, fl)
            _capture(&self.fn, r, c, &e)
        return self._check(r, "ncclCommRevoke", &e)

    def comm_suspend(self, comm, flags=SUSPEND_MEM):
        """ncclCommSuspend (default flags: SUSPEND_MEM); status."""
        cdef ncclComm_t c = _comm(comm)
        cdef int fl = _cint(flags, "flags", 0)
        cdef int r
        cdef _LastError e
        if self.fn.ncclCommSuspend == NULL:
            self._missing("ncclCommSuspend")
        with nogil:
            r = self.fn.ncclCommSuspend(c, fl)
            _capture(&self.fn, r, c, &e)
        return self._check(r, "ncclCommSuspend", &e)

    def comm_resume(self, comm):
        """ncclCommResume; status."""
        cdef ncclComm_t c = _comm(comm)
        cdef int r
        cdef _LastError e
        if self.fn.ncclCommResume == NULL:
            self._missing("ncclCommResume")
        with nogil:
            r = self.fn.ncclCommResume(c)
            _capture(&self.fn, r, c, &e)
        return self._check(r, "ncclCommResume", &e)

    def comm_mem_stats(self, comm, stat):
        """ncclCommMemStats: the value of one CommMemStat (bytes, or 0/1 for GpuMemSuspended)."""
        cdef ncclComm_t c = _comm(comm)
        cdef int s = _cint(stat, "stat", 0, 3)
        cdef uint64_t value = 0
        cdef int r
        cdef _LastError e
        if self.fn.ncclCommMemStats == NULL:
            self._missing("ncclCommMemStats")
        with nogil:
            r = self.fn.ncclCommMemStats(c, <ncclCommMemStat_t>s, &value)
            _capture(&self.fn, r, c, &e)
        self._done(r, "ncclCommMemStats", &e)
        return value

    # --- queries ---------------------------------------------------------------------------
    def comm_count(self, comm):
        """ncclCommCount: the number of ranks."""
        cdef ncclComm_t c = _comm(comm)
        cdef int v = 0
        cdef int r
        cdef _LastError e
        if self.fn.ncclCommCount == NULL:
            self._missing("ncclCommCount")
        with nogil:
            r = self.fn.ncclCommCount(c, &v)
            _capture(&self.fn, r, c, &e)
        self._done(r, "ncclCommCount", &e)
        return v

    def comm_cu_device(self, comm):
        """ncclCommCuDevice: the device the communicator runs on."""
        cdef ncclComm_t c = _comm(comm)
        cdef int v = 0
        cdef int r
        cdef _LastError e
        if self.fn.ncclCommCuDevice == NULL:
            self._missing("ncclCommCuDevice")
        with nogil:
            r = self.fn.ncclCommCuDevice(c, &v)
            _capture(&self.fn, r, c, &e)
        self._done(r, "ncclCommCuDevice", &e)
        return v

    def comm_user_rank(self, comm):
        """ncclCommUserRank: this process's rank."""
        cdef ncclComm_t c = _comm(comm)
        cdef int v = 0
        cdef int r
        cdef _LastError e
        if self.fn.ncclCommUserRank == NULL:
            self._missing("ncclCommUserRank")
        with nogil:
            r = self.fn.ncclCommUserRank(c, &v)
            _capture(&self.fn, r, c, &e)
        self._done(r, "ncclCommUserRank", &e)
        return v

    # --- memory, registration, windows -----------------------------------------------------
    def mem_alloc(self, size):
        """ncclMemAlloc: ``size`` bytes of device memory suited to NCCL; the address."""
        cdef size_t n = _count(size, "size")
        cdef void* p = NULL
        cdef int r
        cdef _LastError e
        if self.fn.ncclMemAlloc == NULL:
            self._missing("ncclMemAlloc")
        with nogil:
            r = self.fn.ncclMemAlloc(&p, n)
            _capture(&self.fn, r, NULL, &e)
        self._done(r, "ncclMemAlloc", &e)
        return <uintptr_t>p

    def mem_free(self, ptr):
        """ncclMemFree(ptr)."""
        cdef void* p = _ptr(ptr, "ptr")
        cdef int r
        cdef _LastError e
        if self.fn.ncclMemFree == NULL:
            self._missing("ncclMemFree")
        with nogil:
            r = self.fn.ncclMemFree(p)
            _capture(&self.fn, r, NULL, &e)
        self._done(r, "ncclMemFree", &e)

    def comm_register(self, comm, buff, size):
        """ncclCommRegister: register ``size`` bytes at ``buff``; the registration handle."""
        cdef ncclComm_t c = _comm(comm)
        cdef void* b = _ptr(buff, "buff")
        cdef size_t n = _count(size, "size")
        cdef void* handle = NULL
        cdef int r
        cdef _LastError e
        if self.fn.ncclCommRegister == NULL:
            self._missing("ncclCommRegister")
        with nogil:
            r = self.fn.ncclCommRegister(c, b, n, &handle)
            _capture(&self.fn, r, c, &e)
        self._done(r, "ncclCommRegister", &e)
        return <uintptr_t>handle

    def comm_deregister(self, comm, handle):
        """ncclCommDeregister; status."""
        cdef ncclComm_t c = _comm(comm)
        cdef void* h = _ptr(handle, "handle")
        cdef int r
        cdef _LastError e
        if self.fn.ncclCommDeregister == NULL:
            self._missing("ncclCommDeregister")
        with nogil:
            r = self.fn.ncclCommDeregister(c, h)
            _capture(&self.fn, r, c, &e)
        return self._check(r, "ncclCommDeregister", &e)

    def comm_window_register(self, comm, buff, size, flags=0):
        """ncclCommWindowRegister (collective): ``(window, status)``; ``flags`` are WIN_*."""
        cdef ncclComm_t c = _comm(comm)
        cdef void* b = _ptr(buff, "buff")
        cdef size_t n = _count(size, "size")
        cdef int fl = _cint(flags, "flags", 0)
        cdef ncclWindow_t win = NULL
        cdef int r
        cdef _LastError e
        if self.fn.ncclCommWindowRegister == NULL:
            self._missing("ncclCommWindowRegister")
        with nogil:
            r = self.fn.ncclCommWindowRegister(c, b, n, &win, fl)
            _capture(&self.fn, r, c, &e)
        status = self._check(r, "ncclCommWindowRegister", &e)
        return (<uintptr_t>win, status)

    def comm_window_deregister(self, comm, window):
        """ncclCommWindowDeregister; status."""
        cdef ncclComm_t c = _comm(comm)
        cdef ncclWindow_t w = <ncclWindow_t>_addr(window, "window")
        cdef int r
        cdef _LastError e
        if self.fn.ncclCommWindowDeregister == NULL:
            self._missing("ncclCommWindowDeregister")
        with nogil:
            r = self.fn.ncclCommWindowDeregister(c, w)
            _capture(&self.fn, r, c, &e)
        return self._check(r, "ncclCommWindowDeregister", &e)

    def win_get_user_ptr(self, comm, window):
        """ncclWinGetUserPtr: the user address a window was registered with."""
        cdef ncclComm_t c = _comm(comm)
        cdef ncclWindow_t w = <ncclWindow_t>_addr(window, "window")
        cdef void* p = NULL
        cdef int r
        cdef _LastError e
        if self.fn.ncclWinGetUserPtr == NULL:
            self._missing("ncclWinGetUserPtr")
        with nogil:
            r = self.fn.ncclWinGetUserPtr(c, w, &p)
            _capture(&self.fn, r, c, &e)
        self._done(r, "ncclWinGetUserPtr", &e)
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
        cdef int r
        cdef _LastError e
        if s == NULL:
            raise ValueError("scalar must be the address of the scalar, not 0")
        if self.fn.ncclRedOpCreatePreMulSum == NULL:
            self._missing("ncclRedOpCreatePreMulSum")
        with nogil:
            r = self.fn.ncclRedOpCreatePreMulSum(&op, s, dt, <ncclScalarResidence_t>res, c)
            _capture(&self.fn, r, c, &e)
        self._done(r, "ncclRedOpCreatePreMulSum", &e)
        return <int>op

    def red_op_destroy(self, op, comm):
        """ncclRedOpDestroy; status."""
        cdef ncclRedOp_t o = <ncclRedOp_t>_op(op)
        cdef ncclComm_t c = _comm(comm)
        cdef int r
        cdef _LastError e
        if self.fn.ncclRedOpDestroy == NULL:
            self._missing("ncclRedOpDestroy")
        with nogil:
            r = self.fn.ncclRedOpDestroy(o, c)
            _capture(&self.fn, r, c, &e)
        return self._check(r, "ncclRedOpDestroy", &e)

    # --- collectives (buffers are addresses, stream a raw handle; each returns the status) ----
    def all_reduce(self, sendbuff, recvbuff, count, datatype, op, comm, stream=0, config=None):
        """ncclAllReduce of ``count`` elements; status.

        ``config`` (a CollConfig) calls ncclAllReduceConfig (NCCL 2.31+) instead."""
        cdef const void* sb = _ptr(sendbuff, "sendbuff")
        cdef void* rb = _ptr(recvbuff, "recvbuff")
        cdef size_t n = _count(count, "count")
        cdef ncclDataType_t dt = <ncclDataType_t>_dtype(datatype)
        cdef ncclRedOp_t o = <ncclRedOp_t>_op(op)
        cdef ncclComm_t c = _comm(comm)
        cdef cudaStream_t st = _ptr(stream, "stream")
        cdef const ncclCollConfig_t* cc = _coll_config_ptr(config)
        cdef int r
        cdef _LastError e
        if cc == NULL:
            if self.fn.ncclAllReduce == NULL:
                self._missing("ncclAllReduce")
            with nogil:
                r = self.fn.ncclAllReduce(sb, rb, n, dt, o, c, st)
                _capture(&self.fn, r, c, &e)
            return self._check(r, "ncclAllReduce", &e)
        if self.fn.ncclAllReduceConfig == NULL:
            self._missing("ncclAllReduceConfig")
        with nogil:
            r = self.fn.ncclAllReduceConfig(sb, rb, n, dt, o, c, st, cc)
            _capture(&self.fn, r, c, &e)
        return self._check(r, "ncclAllReduceConfig", &e)

    def broadcast(self, sendbuff, recvbuff, count, datatype, root, comm, stream=0, config=None):
        """ncclBroadcast of ``count`` elements from ``root``; status.

        ``config`` (a CollConfig) calls ncclBroadcastConfig (NCCL 2.31+) instead."""
        cdef const void* sb = _ptr(sendbuff, "sendbuff")
        cdef void* rb = _ptr(recvbuff, "recvbuff")
        cdef size_t n = _count(count, "count")
        cdef ncclDataType_t dt = <ncclDataType_t>_dtype(datatype)
        cdef int rt = _cint(root, "root", 0)
        cdef ncclComm_t c = _comm(comm)
        cdef cudaStream_t st = _ptr(stream, "stream")
        cdef const ncclCollConfig_t* cc = _coll_config_ptr(config)
        cdef int r
        cdef _LastError e
        if cc == NULL:
            if self.fn.ncclBroadcast == NULL:
                self._missing("ncclBroadcast")
            with nogil:
                r = self.fn.ncclBroadcast(sb, rb, n, dt, rt, c, st)
                _capture(&self.fn, r, c, &e)
            return self._check(r, "ncclBroadcast", &e)
        if self.fn.ncclBroadcastConfig == NULL:
            self._missing("ncclBroadcastConfig")
        with nogil:
            r = self.fn.ncclBroadcastConfig(sb, rb, n, dt, rt, c, st, cc)
            _capture(&self.fn, r, c, &e)
        return self._check(r, "ncclBroadcastConfig", &e)

    def bcast(self, buff, count, datatype, root, comm, stream=0):
        """ncclBcast (in place, deprecated by NCCL in favour of broadcast); status."""
        cdef void* b = _ptr(buff, "buff")
        cdef size_t n = _count(count, "count")
        cdef ncclDataType_t dt = <ncclDataType_t>_dtype(datatype)
        cdef int rt = _cint(root, "root", 0)
        cdef ncclComm_t c = _comm(comm)
        cdef cudaStream_t st = _ptr(stream, "stream")
        cdef int r
        cdef _LastError e
        if self.fn.ncclBcast == NULL:
            self._missing("ncclBcast")
        with nogil:
            r = self.fn.ncclBcast(b, n, dt, rt, c, st)
            _capture(&self.fn, r, c, &e)
        return self._check(r, "ncclBcast", &e)

    def reduce(self, sendbuff, recvbuff, count, datatype, op, root, comm, stream=0, config=None):
        """ncclReduce of ``count`` elements to ``root``; status.

        ``config`` (a CollConfig) calls ncclReduceConfig (NCCL 2.31+) instead."""
        cdef const void* sb = _ptr(sendbuff, "sendbuff")
        cdef void* rb = _ptr(recvbuff, "recvbuff")
        cdef size_t n = _count(count, "count")
        cdef ncclDataType_t dt = <ncclDataType_t>_dtype(datatype)
        cdef ncclRedOp_t o = <ncclRedOp_t>_op(op)
        cdef int rt = _cint(root, "root", 0)
        cdef ncclComm_t c = _comm(comm)
        cdef cudaStream_t st = _ptr(stream, "stream")
        cdef const ncclCollConfig_t* cc = _coll_config_ptr(config)
        cdef int r
        cdef _LastError e
        if cc == NULL:
            if self.fn.ncclReduce == NULL:
                self._missing("ncclReduce")
            with nogil:
                r = self.fn.ncclReduce(sb, rb, n, dt, o, rt, c, st)
                _capture(&self.fn, r, c, &e)
            return self._check(r, "ncclReduce", &e)
        if self.fn.ncclReduceConfig == NULL:
            self._missing("ncclReduceConfig")
        with nogil:
            r = self.fn.ncclReduceConfig(sb, rb, n, dt, o, rt, c, st, cc)
            _capture(&self.fn, r, c, &e)
        return self._check(r, "ncclReduceConfig", &e)

    def all_gather(self, sendbuff, recvbuff, sendcount, datatype, comm, stream=0, config=None):
        """ncclAllGather: ``sendcount`` elements from each rank; status.

        ``config`` (a CollConfig) calls ncclAllGatherConfig (NCCL 2.31+) instead."""
        cdef const void* sb = _ptr(sendbuff, "sendbuff")
        cdef void* rb = _ptr(recvbuff, "recvbuff")
        cdef size_t n = _count(sendcount, "sendcount")
        cdef ncclDataType_t dt = <ncclDataType_t>_dtype(datatype)
        cdef ncclComm_t c = _comm(comm)
        cdef cudaStream_t st = _ptr(stream, "stream")
        cdef const ncclCollConfig_t* cc = _coll_config_ptr(config)
        cdef int r
        cdef _LastError e
        if cc == NULL:
            if self.fn.ncclAllGather == NULL:
                self._missing("ncclAllGather")
            with nogil:
                r = self.fn.ncclAllGather(sb, rb, n, dt, c, st)
                _capture(&self.fn, r, c, &e)
            return self._check(r, "ncclAllGather", &e)
        if self.fn.ncclAllGatherConfig == NULL:
            self._missing("ncclAllGatherConfig")
        with nogil:
            r = self.fn.ncclAllGatherConfig(sb, rb, n, dt, c, st, cc)
            _capture(&self.fn, r, c, &e)
        return self._check(r, "ncclAllGatherConfig", &e)

    def reduce_scatter(self, sendbuff, recvbuff, recvcount, datatype, op, comm, stream=0, config=None):
        """ncclReduceScatter: ``recvcount`` elements to each rank; status.

        ``config`` (a CollConfig) calls ncclReduceScatterConfig (NCCL 2.31+) instead."""
        cdef const void* sb = _ptr(sendbuff, "sendbuff")
        cdef void* rb = _ptr(recvbuff, "recvbuff")
        cdef size_t n = _count(recvcount, "recvcount")
        cdef ncclDataType_t dt = <ncclDataType_t>_dtype(datatype)
        cdef ncclRedOp_t o = <ncclRedOp_t>_op(op)
        cdef ncclComm_t c = _comm(comm)
        cdef cudaStream_t st = _ptr(stream, "stream")
        cdef const ncclCollConfig_t* cc = _coll_config_ptr(config)
        cdef int r
        cdef _LastError e
        if cc == NULL:
            if self.fn.ncclReduceScatter == NULL:
                self._missing("ncclReduceScatter")
            with nogil:
                r = self.fn.ncclReduceScatter(sb, rb, n, dt, o, c, st)
                _capture(&self.fn, r, c, &e)
            return self._check(r, "ncclReduceScatter", &e)
        if self.fn.ncclReduceScatterConfig == NULL:
            self._missing("ncclReduceScatterConfig")
        with nogil:
            r = self.fn.ncclReduceScatterConfig(sb, rb, n, dt, o, c, st, cc)
            _capture(&self.fn, r, c, &e)
        return self._check(r, "ncclReduceScatterConfig", &e)

    def all_to_all(self, sendbuff, recvbuff, count, datatype, comm, stream=0, config=None):
        """ncclAlltoAll: ``count`` elements to and from each rank; status.

        ``config`` (a CollConfig) calls ncclAlltoAllConfig (NCCL 2.31+) instead."""
        cdef const void* sb = _ptr(sendbuff, "sendbuff")
        cdef void* rb = _ptr(recvbuff, "recvbuff")
        cdef size_t n = _count(count, "count")
        cdef ncclDataType_t dt = <ncclDataType_t>_dtype(datatype)
        cdef ncclComm_t c = _comm(comm)
        cdef cudaStream_t st = _ptr(stream, "stream")
        cdef const ncclCollConfig_t* cc = _coll_config_ptr(config)
        cdef int r
        cdef _LastError e
        if cc == NULL:
            if self.fn.ncclAlltoAll == NULL:
                self._missing("ncclAlltoAll")
            with nogil:
                r = self.fn.ncclAlltoAll(sb, rb, n, dt, c, st)
                _capture(&self.fn, r, c, &e)
            return self._check(r, "ncclAlltoAll", &e)
        if self.fn.ncclAlltoAllConfig == NULL:
            self._missing("ncclAlltoAllConfig")
        with nogil:
            r = self.fn.ncclAlltoAllConfig(sb, rb, n, dt, c, st, cc)
            _capture(&self.fn, r, c, &e)
        return self._check(r, "ncclAlltoAllConfig", &e)

    def gather(self, sendbuff, recvbuff, count, datatype, root, comm, stream=0, config=None):
        """ncclGather: ``count`` elements from each rank to ``root``; status.

        ``config`` (a CollConfig) calls ncclGatherConfig (NCCL 2.31+) instead."""
        cdef const void* sb = _ptr(sendbuff, "sendbuff")
        cdef void* rb = _ptr(recvbuff, "recvbuff")
        cdef size_t n = _count(count, "count")
        cdef ncclDataType_t dt = <ncclDataType_t>_dtype(datatype)
        cdef int rt = _cint(root, "root", 0)
        cdef ncclComm_t c = _comm(comm)
        cdef cudaStream_t st = _ptr(stream, "stream")
        cdef const ncclCollConfig_t* cc = _coll_config_ptr(config)
        cdef int r
        cdef _LastError e
        if cc == NULL:
            if self.fn.ncclGather == NULL:
                self._missing("ncclGather")
            with nogil:
                r = self.fn.ncclGather(sb, rb, n, dt, rt, c, st)
                _capture(&self.fn, r, c, &e)
            return self._check(r, "ncclGather", &e)
        if self.fn.ncclGatherConfig == NULL:
            self._missing("ncclGatherConfig")
        with nogil:
            r = self.fn.ncclGatherConfig(sb, rb, n, dt, rt, c, st, cc)
            _capture(&self.fn, r, c, &e)
        return self._check(r, "ncclGatherConfig", &e)

    def scatter(self, sendbuff, recvbuff, count, datatype, root, comm, stream=0, config=None):
        """ncclScatter: ``count`` elements from ``root`` to each rank; status.

        ``config`` (a CollConfig) calls ncclScatterConfig (NCCL 2.31+) instead."""
        cdef const void* sb = _ptr(sendbuff, "sendbuff")
        cdef void* rb = _ptr(recvbuff, "recvbuff")
        cdef size_t n = _count(count, "count")
        cdef ncclDataType_t dt = <ncclDataType_t>_dtype(datatype)
        cdef int rt = _cint(root, "root", 0)
        cdef ncclComm_t c = _comm(comm)
        cdef cudaStream_t st = _ptr(stream, "stream")
        cdef const ncclCollConfig_t* cc = _coll_config_ptr(config)
        cdef int r
        cdef _LastError e
        if cc == NULL:
            if self.fn.ncclScatter == NULL:
                self._missing("ncclScatter")
            with nogil:
                r = self.fn.ncclScatter(sb, rb, n, dt, rt, c, st)
                _capture(&self.fn, r, c, &e)
            return self._check(r, "ncclScatter", &e)
        if self.fn.ncclScatterConfig == NULL:
            self._missing("ncclScatterConfig")
        with nogil:
            r = self.fn.ncclScatterConfig(sb, rb, n, dt, rt, c, st, cc)
            _capture(&self.fn, r, c, &e)
        return self._check(r, "ncclScatterConfig", &e)

    def send(self, sendbuff, count, datatype, peer, comm, stream=0):
        """ncclSend of ``count`` elements to ``peer``; status."""
        cdef const void* sb = _ptr(sendbuff, "sendbuff")
        cdef size_t n = _count(count, "count")
        cdef ncclDataType_t dt = <ncclDataType_t>_dtype(datatype)
        cdef int p = _cint(peer, "peer", 0)
        cdef ncclComm_t c = _comm(comm)
        cdef cudaStream_t st = _ptr(stream, "stream")
        cdef int r
        cdef _LastError e
        if self.fn.ncclSend == NULL:
            self._missing("ncclSend")
        with nogil:
            r = self.fn.ncclSend(sb, n, dt, p, c, st)
            _capture(&self.fn, r, c, &e)
        return self._check(r, "ncclSend", &e)

    def recv(self, recvbuff, count, datatype, peer, comm, stream=0):
        """ncclRecv of ``count`` elements from ``peer``; status."""
        cdef void* rb = _ptr(recvbuff, "recvbuff")
        cdef size_t n = _count(count, "count")
        cdef ncclDataType_t dt = <ncclDataType_t>_dtype(datatype)
        cdef int p = _cint(peer, "peer", 0)
        cdef ncclComm_t c = _comm(comm)
        cdef cudaStream_t st = _ptr(stream, "stream")
        cdef int r
        cdef _LastError e
        if self.fn.ncclRecv == NULL:
            self._missing("ncclRecv")
        with nogil:
            r = self.fn.ncclRecv(rb, n, dt, p, c, st)
            _capture(&self.fn, r, c, &e)
        return self._check(r, "ncclRecv", &e)

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
        cdef int r
        cdef _LastError e
        if self.fn.ncclPutSignal == NULL:
            self._missing("ncclPutSignal")
        with nogil:
            r = self.fn.ncclPutSignal(lb, n, dt, p, w, off, si, cx, fl, c, st)
            _capture(&self.fn, r, c, &e)
        return self._check(r, "ncclPutSignal", &e)

    def signal(self, peer, sig_idx, ctx, flags, comm, stream=0):
        """ncclSignal: signal ``peer`` without data; status."""
        cdef int p = _cint(peer, "peer", 0)
        cdef int si = _cint(sig_idx, "sig_idx", 0)
        cdef int cx = _cint(ctx, "ctx", 0)
        cdef unsigned int fl = <unsigned int>_unsigned(flags, "flags")
        cdef ncclComm_t c = _comm(comm)
        cdef cudaStream_t st = _ptr(stream, "stream")
        cdef int r
        cdef _LastError e
        if self.fn.ncclSignal == NULL:
            self._missing("ncclSignal")
        with nogil:
            r = self.fn.ncclSignal(p, si, cx, fl, c, st)
            _capture(&self.fn, r, c, &e)
        return self._check(r, "ncclSignal", &e)

    def wait_signal(self, descs, comm, stream=0):
        """ncclWaitSignal: ``descs`` is a sequence of (op_count, peer, sig_idx, ctx); status."""
        cdef ncclComm_t c = _comm(comm)
        cdef cudaStream_t st = _ptr(stream, "stream")
        cdef ncclWaitSignalDesc_t* d
        cdef int n, i, r
        cdef _LastError e
        rows = []
        for i, desc in enumerate(descs):
            try:
                op_cnt, peer, sig_idx, ctx = desc
            except (TypeError, ValueError):
                raise TypeError(f"descs[{i}] must be (op_count, peer, sig_idx, ctx)") from None
            rows.append((_cint(op_cnt, "op_count", 0), _cint(peer, "peer", 0),
                         _cint(sig_idx, "sig_idx", 0), _cint(ctx, "ctx", 0)))
        if not rows:
            raise ValueError("descs must hold at least one (op_count, peer, sig_idx, ctx)")
        if self.fn.ncclWaitSignal == NULL:
            self._missing("ncclWaitSignal")
        n = len(rows)
        d = <ncclWaitSignalDesc_t*>calloc(n, sizeof(ncclWaitSignalDesc_t))
        if d == NULL:
            raise MemoryError()
        try:
            for i in range(n):
                d[i].opCnt = rows[i][0]
                d[i].peer = rows[i][1]
                d[i].sigIdx = rows[i][2]
                d[i].ctx = rows[i][3]
            with nogil:
                r = self.fn.ncclWaitSignal(n, d, c, st)
                _capture(&self.fn, r, c, &e)
        finally:
            free(d)
        return self._check(r, "ncclWaitSignal", &e)

    # --- groups ----------------------------------------------------------------------------
    def group_start(self):
        """ncclGroupStart; status."""
        cdef int r
        cdef _LastError e
        if self.fn.ncclGroupStart == NULL:
            self._missing("ncclGroupStart")
        with nogil:
            r = self.fn.ncclGroupStart()
            _capture(&self.fn, r, NULL, &e)
        return self._check(r, "ncclGroupStart", &e)

    def group_end(self):
        """ncclGroupEnd; status (IN_PROGRESS when a nonblocking communicator is still issuing)."""
        cdef int r
        cdef _LastError e
        if self.fn.ncclGroupEnd == NULL:
            self._missing("ncclGroupEnd")
        with nogil:
            r = self.fn.ncclGroupEnd()
            _capture(&self.fn, r, NULL, &e)
        return self._check(r, "ncclGroupEnd", &e)

    def group_simulate_end(self):
        """ncclGroupSimulateEnd: the estimated time of the group (NCCL's unit, microseconds)."""
        cdef ncclSimInfo_t info
        cdef int r
        cdef _LastError e
        info.size = sizeof(ncclSimInfo_t)
        info.magic = PYCOLL_NCCL_SIM_INFO_MAGIC
        info.version = NCCL_VERSION_CODE
        info.estimatedTime = -1.0
        if self.fn.ncclGroupSimulateEnd == NULL:
            self._missing("ncclGroupSimulateEnd")
        with nogil:
            r = self.fn.ncclGroupSimulateEnd(&info)
            _capture(&self.fn, r, NULL, &e)
        self._done(r, "ncclGroupSimulateEnd", &e)
        return info.estimatedTime

    def set_encryption(self, mode, psk=None):
        """ncclSetEncryption (NCCL 2.31+): mode 0 = none, 1 = pre-shared key ``psk``; status.
        Call it before creating communicators."""
        cdef ncclEncryptionConfig_t cfg
        cdef int m = _cint(mode, "mode", 0, 1)
        cdef bytes key = _c_string(psk, "psk")
        cdef int r
        cdef _LastError e
        if m == 1 and not key:
            raise ValueError("mode 1 (PSK) needs a non-empty psk")
        cfg.size = sizeof(ncclEncryptionConfig_t)
        cfg.magic = NCCL_API_MAGIC
        cfg.version = NCCL_VERSION_CODE
        cfg.mode = m
        cfg.psk = NULL if key is None else PyBytes_AS_STRING(key)
        if self.fn.ncclSetEncryption == NULL:
            self._missing("ncclSetEncryption")
        with nogil:
            r = self.fn.ncclSetEncryption(&cfg)
            _capture(&self.fn, r, NULL, &e)
        return self._check(r, "ncclSetEncryption", &e)

    # --- parameters --------------------------------------------------------------------------
    def param_get(self, key):
        """ncclParamGetParameter(key): the parameter's value as a string, or None if unknown."""
        cdef bytes k = _param_key(key)
        cdef const char* ck = k
        cdef const char* value = NULL
        cdef int length = 0
        cdef int r
        cdef _LastError e
        if self.fn.ncclParamGetParameter == NULL:
            self._missing("ncclParamGetParameter")
        with nogil:
            r = self.fn.ncclParamGetParameter(ck, &value, &length)
            _capture(&self.fn, r, NULL, &e)
        if r == ncclInvalidArgument:
            return None
        self._done(r, "ncclParamGetParameter", &e)
        if value == NULL:
            return None
        return value[:length].decode("utf-8", "replace") if length > 0 else _decode(value)

    def param_keys(self):
        """ncclParamGetAllParameterKeys: the names of the parameters registered so far."""
        cdef const char** table = NULL
        cdef int n = 0
        cdef int r
        cdef _LastError e
        if self.fn.ncclParamGetAllParameterKeys == NULL:
            self._missing("ncclParamGetAllParameterKeys")
        with nogil:
            r = self.fn.ncclParamGetAllParameterKeys(&table, &n)
            _capture(&self.fn, r, NULL, &e)
        self._done(r, "ncclParamGetAllParameterKeys", &e)
        if table == NULL:
            return []
        return [_decode(table[i]) for i in range(n)]

    # --- pycoll host library only: version, host streams and events ---------------------------
    def host_version(self):
        """pycollHostGetVersion: the host library's own version (major*10000+minor*100+patch)."""
        cdef int v = 0
        cdef int r
        cdef _LastError e
        if self.fn.pycollHostGetVersion == NULL:
            self._missing("pycollHostGetVersion")
        with nogil:
            r = self.fn.pycollHostGetVersion(&v)
            _capture(&self.fn, r, NULL, &e)
        self._done(r, "pycollHostGetVersion", &e)
        return v

    def host_stream_create(self):
        """pycollStreamCreate: a new host stream handle (an ordered queue with its own thread)."""
        cdef pycollStream_t s = NULL
        cdef int r
        cdef _LastError e
        if self.fn.pycollStreamCreate == NULL:
            self._missing("pycollStreamCreate")
        with nogil:
            r = self.fn.pycollStreamCreate(&s)
            _capture(&self.fn, r, NULL, &e)
        self._done(r, "pycollStreamCreate", &e)
        return <uintptr_t>s

    def host_stream_destroy(self, stream):
        """pycollStreamDestroy: wait for the enqueued work, then free the stream."""
        cdef pycollStream_t s = <pycollStream_t>_handle(stream, "stream")
        cdef int r
        cdef _LastError e
        if self.fn.pycollStreamDestroy == NULL:
            self._missing("pycollStreamDestroy")
        with nogil:
            r = self.fn.pycollStreamDestroy(s)
            _capture(&self.fn, r, NULL, &e)
        self._done(r, "pycollStreamDestroy", &e)

    def host_stream_synchronize(self, stream):
        """pycollStreamSynchronize: block (GIL released) until the stream's work has run."""
        cdef pycollStream_t s = <pycollStream_t>_handle(stream, "stream")
        cdef int r
        cdef _LastError e
        if self.fn.pycollStreamSynchronize == NULL:
            self._missing("pycollStreamSynchronize")
        with nogil:
            r = self.fn.pycollStreamSynchronize(s)
            _capture(&self.fn, r, NULL, &e)
        self._done(r, "pycollStreamSynchronize", &e)

    def host_stream_query(self, stream):
        """pycollStreamQuery: True when everything enqueued has run."""
        cdef pycollStream_t s = <pycollStream_t>_handle(stream, "stream")
        cdef int r
        cdef _LastError e
        if self.fn.pycollStreamQuery == NULL:
            self._missing("pycollStreamQuery")
        with nogil:
            r = self.fn.pycollStreamQuery(s)
            _capture(&self.fn, r, NULL, &e)
        return self._check(r, "pycollStreamQuery", &e) == ncclSuccess

    def host_stream_wait_event(self, stream, event):
        """pycollStreamWaitEvent: later work on ``stream`` waits for ``event``."""
        cdef pycollStream_t s = <pycollStream_t>_handle(stream, "stream")
        cdef pycollEvent_t ev = <pycollEvent_t>_handle(event, "event")
        cdef int r
        cdef _LastError e
        if self.fn.pycollStreamWaitEvent == NULL:
            self._missing("pycollStreamWaitEvent")
        with nogil:
            r = self.fn.pycollStreamWaitEvent(s, ev)
            _capture(&self.fn, r, NULL, &e)
        self._done(r, "pycollStreamWaitEvent", &e)

    def host_event_create(self):
        """pycollEventCreate: a new host event handle."""
        cdef pycollEvent_t ev = NULL
        cdef int r
        cdef _LastError e
        if self.fn.pycollEventCreate == NULL:
            self._missing("pycollEventCreate")
        with nogil:
            r = self.fn.pycollEventCreate(&ev)
            _capture(&self.fn, r, NULL, &e)
        self._done(r, "pycollEventCreate", &e)
        return <uintptr_t>ev

    def host_event_destroy(self, event):
        """pycollEventDestroy."""
        cdef pycollEvent_t ev = <pycollEvent_t>_handle(event, "event")
        cdef int r
        cdef _LastError e
        if self.fn.pycollEventDestroy == NULL:
            self._missing("pycollEventDestroy")
        with nogil:
            r = self.fn.pycollEventDestroy(ev)
            _capture(&self.fn, r, NULL, &e)
        self._done(r, "pycollEventDestroy", &e)

    def host_event_record(self, event, stream):
        """pycollEventRecord: the event completes when the stream's earlier work has run
        (stream 0: at once)."""
        cdef pycollEvent_t ev = <pycollEvent_t>_handle(event, "event")
        cdef pycollStream_t s = <pycollStream_t>_addr(stream, "stream")
        cdef int r
        cdef _LastError e
        if self.fn.pycollEventRecord == NULL:
            self._missing("pycollEventRecord")
        with nogil:
            r = self.fn.pycollEventRecord(ev, s)
            _capture(&self.fn, r, NULL, &e)
        self._done(r, "pycollEventRecord", &e)

    def host_event_query(self, event):
        """pycollEventQuery: True when complete (or never recorded)."""
        cdef pycollEvent_t ev = <pycollEvent_t>_handle(event, "event")
        cdef int r
        cdef _LastError e
        if self.fn.pycollEventQuery == NULL:
            self._missing("pycollEventQuery")
        with nogil:
            r = self.fn.pycollEventQuery(ev)
            _capture(&self.fn, r, NULL, &e)
        return self._check(r, "pycollEventQuery", &e) == ncclSuccess

    def host_event_synchronize(self, event):
        """pycollEventSynchronize: block (GIL released) until the event completes."""
        cdef pycollEvent_t ev = <pycollEvent_t>_handle(event, "event")
        cdef int r
        cdef _LastError e
        if self.fn.pycollEventSynchronize == NULL:
            self._missing("pycollEventSynchronize")
        with nogil:
            r = self.fn.pycollEventSynchronize(ev)
            _capture(&self.fn, r, NULL, &e)
        self._done(r, "pycollEventSynchronize", &e)

    def host_event_elapsed_ms(self, start, end):
        """pycollEventElapsedTime: milliseconds between two completed events."""
        cdef pycollEvent_t a = <pycollEvent_t>_handle(start, "start")
        cdef pycollEvent_t b = <pycollEvent_t>_handle(end, "end")
        cdef float ms = 0
        cdef int r
        cdef _LastError e
        if self.fn.pycollEventElapsedTime == NULL:
            self._missing("pycollEventElapsedTime")
        with nogil:
            r = self.fn.pycollEventElapsedTime(&ms, a, b)
            _capture(&self.fn, r, NULL, &e)
        self._done(r, "pycollEventElapsedTime", &e)
        return ms


cdef void* _handle(object value, str what) except NULL:
    """A handle that must not be NULL."""
    cdef uintptr_t v = _addr(value, what)
    if v == 0:
        raise ValueError(f"{what} must be a valid handle, not 0 (NULL)")
    return <void*>v


cdef bytes _param_key(object key):
    if not isinstance(key, str):
        raise TypeError(f"key must be a str, not {type(key).__name__}")
    data = (<str>key).encode("utf-8")
    if b"\0" in data:
        raise ValueError("key must not contain NUL characters")
    return data


# --- loading ---------------------------------------------------------------------------------------
_lock = threading.RLock()
_by_path = {}  # resolved path -> Library
_by_spec = {}  # spec as given -> Library


cdef int _collect_object(dl_phdr_info* info, size_t size, void* data) noexcept:
    if info.dlpi_name != NULL and info.dlpi_name[0] != 0:
        (<list>data).append(<bytes>info.dlpi_name)
    return 0


def _loaded_objects():
    """Paths of every shared object loaded in this process (dl_iterate_phdr)."""
    cdef list names = []
    dl_iterate_phdr(_collect_object, <void*>names)
    return [os.fsdecode(n) for n in names]


def _already_loaded(prefix):
    return [p for p in _loaded_objects() if os.path.basename(p).startswith(prefix)]


cdef Library _open(str target):
    """dlopen ``target`` (a path, or a name for the dynamic linker's search) and wrap it."""
    cdef bytes btarget = os.fsencode(target)
    cdef const char* ctarget = btarget
    cdef void* h
    cdef link_map* lm = NULL
    cdef Library lib
    if "/" in target and not os.path.exists(target):
        raise LibraryError(f"{target}: no such file", target)
    with nogil:
        h = dlopen(ctarget, RTLD_NOW | RTLD_LOCAL)
    if h == NULL:
        message = _decode(dlerror()) or "dlopen failed"
        if not message.startswith(target):
            message = f"{target}: {message}"
        raise LibraryError(message, target)
    path = target
    if dlinfo(h, RTLD_DI_LINKMAP, &lm) == 0 and lm != NULL and lm.l_name != NULL and lm.l_name[0] != 0:
        path = os.fsdecode(<bytes>lm.l_name)
    path = os.path.realpath(path) if "/" in path else path
    if dlsym(h, "ncclGetVersion") == NULL:
        dlerror()
        dlclose(h)
        raise LibraryError(f"{path} does not export ncclGetVersion: not an NCCL-ABI library", path)
    existing = _by_path.get(path)
    if existing is not None:
        dlclose(h)  # drops the extra reference; the object stays loaded
        return existing
    lib = Library.__new__(Library)
    lib.handle = h
    lib.path = path
    lib._exported = {}
    lib._pending_slots = set()
    lib._resolve()
    lib.version = lib.get_version()
    if lib._exported.get("pycollHostGetVersion"):
        lib.kind = "host"
    elif any(lib._exported.get(name) for name in RCCL_FUNCTIONS):
        lib.kind = "rccl"
    else:
        lib.kind = "nccl"
    _by_path[path] = lib
    _log.debug("loaded %s (kind %s, version %d, %d declared functions missing)",
               path, lib.kind, lib.version, len(lib.missing))
    return lib


def _pathfinder_nccl():
    try:
        from cuda.pathfinder import load_nvidia_dynamic_lib
    except ImportError:
        raise LibraryError("cuda.pathfinder is not installed") from None
    try:
        return load_nvidia_dynamic_lib("nccl").abs_path
    except Exception as exc:  # its own DynamicLibNotFoundError, or anything else it raises
        raise LibraryError(f"cuda.pathfinder: {type(exc).__name__}: {exc}") from None


def _wheel_nccl_paths():
    dirs = []
    try:
        import importlib.util
        spec = importlib.util.find_spec("nvidia.nccl")
        if spec is not None and spec.submodule_search_locations:
            dirs.extend(spec.submodule_search_locations)
    except (ImportError, ValueError):
        pass
    dirs.extend(os.path.join(p, "nvidia", "nccl") for p in sys.path if p)
    seen = []
    for d in dirs:
        candidate = os.path.join(d, "lib", "libnccl.so.2")
        if candidate not in seen and os.path.exists(candidate):
            seen.append(candidate)
    return seen


class _Nothing(str):
    """A candidate that is not there: the str says why (e.g. "not installed")."""


def _candidates(spec):
    """(label, target) pairs to try in order; target is a path or name, a callable returning one,
    or a _Nothing saying why there is nothing to try."""
    if spec == "nccl":
        loaded = _already_loaded("libnccl.so")
        yield from (("already loaded", p) for p in loaded) if loaded else [("already loaded", _Nothing("none"))]
        yield ("cuda.pathfinder", _pathfinder_nccl)
        wheel = _wheel_nccl_paths()
        yield from ((("nvidia-nccl wheel", p) for p in wheel) if wheel
                    else [("nvidia-nccl wheel", _Nothing("not installed"))])
        yield ("system", "libnccl.so.2")
    elif spec == "rccl":
        loaded = _already_loaded("librccl.so")
        yield from (("already loaded", p) for p in loaded) if loaded else [("already loaded", _Nothing("none"))]
        yield ("system", "librccl.so.1")
        roots = [os.environ.get("ROCM_PATH"), "/opt/rocm"]
        for root in dict.fromkeys(r for r in roots if r):
            yield (f"{root}/lib", os.path.join(root, "lib", "librccl.so.1"))
    elif spec == "host":
        yield ("pycoll", os.path.join(os.path.dirname(os.path.abspath(__file__)), "libpycoll_host.so"))


def load(spec=None):
    """Load (once per resolved path) and return a library.

    ``spec``: a path (anything containing "/"); a file name for the dynamic linker's search
    (e.g. "libnccl.so.2"); ``"nccl"`` (a libnccl already loaded in the process, e.g. torch's,
    then the nvidia-nccl wheel via cuda.pathfinder or its package directory, then the system's
    libnccl.so.2); ``"rccl"`` (an already loaded librccl, then librccl.so.1, then
    $ROCM_PATH/lib and /opt/rocm/lib); ``"host"`` (pycoll's libpycoll_host.so next to this
    module); None -> ``$PYCOLL_NCCL_LIBRARY`` if set, else ``"nccl"``.

    Raises LibraryError naming everything tried when nothing suitable is found, or when the
    object does not export ``ncclGetVersion``. Missing optional functions never fail loading.
    """
    if spec is None:
        spec = os.environ.get("PYCOLL_NCCL_LIBRARY") or "nccl"
    if isinstance(spec, os.PathLike):
        spec = os.fspath(spec)
    if isinstance(spec, bytes):
        spec = os.fsdecode(spec)
    if not isinstance(spec, str):
        raise TypeError(f"spec must be a str or path, not {type(spec).__name__}")
    if not spec:
        raise ValueError("spec must not be empty")
    lib = _by_spec.get(spec)
    if lib is not None:
        return lib
    with _lock:
        lib = _by_spec.get(spec)
        if lib is not None:
            return lib
        if spec not in ("nccl", "rccl", "host"):
            lib = _open(spec)  # its LibraryError says what happened to this one path or name
            _by_spec[spec] = lib
            return lib
        tried = []
        for label, target in _candidates(spec):
            if isinstance(target, _Nothing):
                tried.append(f"{label}: {target}")
                continue
            try:
                if callable(target):
                    target = target()
                lib = _open(target)
            except LibraryError as exc:
                tried.append(f"{label}: {exc}")
                _log.debug("load(%r): %s: %s", spec, label, exc)
                continue
            _by_spec[spec] = lib
            return lib
        raise LibraryError(f"could not load the {spec} library; tried: " + "; ".join(tried))


def loaded():
    """Libraries loaded so far in this process, in load order."""
    with _lock:
        return list(_by_path.values())
