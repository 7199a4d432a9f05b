# The NCCL 2.32 host API (and the pycoll host library's extras), declared for Cython without any
# NCCL, RCCL or CUDA header.
#
# Nothing here is linked: every function is declared as a function-pointer type (``<name>_fn``)
# and resolved at run time with dlsym into a ``pycoll_nccl_table`` (see ``_nccl.pxd``, class
# ``Library``). The C block repeats pycoll/_host/nccl_types.h on purpose: Cython users compile against
# this file alone, with no C include path to the host library's headers. Usage from Cython:
#
#     from pycoll._bindings.libnccl cimport *   (pycoll._bindings.nccl is the same, the older name)
#     from pycoll._bindings._nccl cimport Library
#     cdef Library lib = pycoll._bindings.load("nccl")
#     cdef int v
#     if lib.fn.ncclGetVersion != NULL:
#         lib.fn.ncclGetVersion(&v)
#
# Enum values, struct layouts and prototypes follow nccl.h of NCCL 2.32.3 (NVIDIA, Apache-2.0); the
# C definitions below step aside when the real nccl.h was included first (NCCL_H_ guard).

from libc.stdint cimport int8_t, int16_t, int32_t, int64_t, uint8_t, uint16_t, uint32_t, uint64_t

cdef extern from *:
    """
    #include <limits.h>
    #include <stddef.h>
    #include <stdint.h>
    #ifndef PYCOLL_NCCL_DECLS
    #define PYCOLL_NCCL_DECLS
    #ifndef NCCL_H_
    typedef struct ncclComm* ncclComm_t;
    typedef struct ncclWindow_vidmem* ncclWindow_t;
    typedef struct { char internal[128]; } ncclUniqueId;
    typedef enum { ncclSuccess = 0, ncclUnhandledCudaError = 1, ncclSystemError = 2,
                   ncclInternalError = 3, ncclInvalidArgument = 4, ncclInvalidUsage = 5,
                   ncclRemoteError = 6, ncclInProgress = 7, ncclTimeout = 8,
                   ncclNumResults = 9 } ncclResult_t;
    typedef enum { ncclHostCftDefault = INT_MIN, ncclHostCftEnable = 1, ncclHostCftDisable = 2,
                   ncclHostCftFallback = 3 } ncclHostCftMode_t;
    typedef enum { ncclNvlsHostModeDefault = INT_MIN, ncclNvlsHostModeEnable = 0,
                   ncclNvlsHostModeDisableTransport = 1, ncclNvlsHostModeDisableSymmetricMultimem = 2,
                   ncclNvlsHostModeDisable = INT_MAX } ncclNvlsHostMode_t;
    typedef struct ncclConfig_v23100 {
      size_t size; unsigned int magic; unsigned int version;
      int blocking; int cgaClusterSize; int minCTAs; int maxCTAs; const char* netName;
      int splitShare; int trafficClass; const char* commName; int collnetEnable; int CTAPolicy;
      int shrinkShare; int nvlsCTAs; int nChannelsPerNetPeer; int nvlinkCentricSched;
      int graphUsageMode; int numRmaCtx; int maxP2pPeers; int graphStreamOrdering;
      int launchOrderImplicit; int numRmaSig; int rmaEagerInit; int hostCftMode; int nvlsHostMode;
    } ncclConfig_t;
    typedef struct ncclConfigExt {
      struct ncclConfigExt* next;
      struct { int vendorId; int optionId; } key;
      union { int i; const char* s; void* raw; } val;
    } ncclConfigExt_t;
    typedef struct ncclCollConfig_v23200 {
      size_t size; unsigned int magic; unsigned int version; ncclConfigExt_t* ext;
      int minCTAs; int maxCTAs; int nvlsCTAs; int cgaClusterSize;
      const char* algSelection; int forceAlgSelection; int CTAPolicy;
      uint64_t userProfilerTag; void* launchCompletionEvent;
    } ncclCollConfig_t;
    typedef struct ncclSimInfo_v22200 {
      size_t size; unsigned int magic; unsigned int version; float estimatedTime;
    } ncclSimInfo_t;
    typedef enum { NCCL_ENCRYPTION_MODE_NONE = 0, NCCL_ENCRYPTION_MODE_PSK = 1 } ncclEncryptionMode_t;
    typedef struct ncclEncryptionConfig_v23200 {
      size_t size; unsigned int magic; unsigned int version; int mode; const char* psk;
    } ncclEncryptionConfig_t;
    typedef enum { ncclSum = 0, ncclProd = 1, ncclMax = 2, ncclMin = 3, ncclAvg = 4,
                   ncclNumOps = 5, ncclMaxRedOp = 0x7fffffff } ncclRedOp_t;
    typedef enum { ncclInt8 = 0, ncclChar = 0, ncclUint8 = 1, ncclInt32 = 2, ncclInt = 2,
                   ncclUint32 = 3, ncclInt64 = 4, ncclUint64 = 5, ncclFloat16 = 6, ncclHalf = 6,
                   ncclFloat32 = 7, ncclFloat = 7, ncclFloat64 = 8, ncclDouble = 8,
                   ncclBfloat16 = 9, ncclFloat8e4m3 = 10, ncclFloat8e5m2 = 11,
                   ncclNumTypes = 12 } ncclDataType_t;
    typedef enum { ncclScalarDevice = 0, ncclScalarHostImmediate = 1 } ncclScalarResidence_t;
    typedef enum { ncclStatGpuMemSuspend = 0, ncclStatGpuMemSuspended = 1,
                   ncclStatGpuMemPersist = 2, ncclStatGpuMemTotal = 3 } ncclCommMemStat_t;
    typedef struct { int opCnt; int peer; int sigIdx; int ctx; } ncclWaitSignalDesc_t;
    typedef struct ncclParamHandle* ncclParamHandle_t;
    #define NCCL_MAJOR 2
    #define NCCL_MINOR 32
    #define NCCL_PATCH 3
    #define NCCL_VERSION_CODE 23203
    #define NCCL_UNIQUE_ID_BYTES 128
    #define NCCL_CONFIG_UNDEF_INT INT_MIN
    #define NCCL_SPLIT_NOCOLOR -1
    #define NCCL_API_MAGIC 0xcafebeef
    #define NCCL_WIN_DEFAULT 0x00
    #define NCCL_WIN_COLL_SYMMETRIC 0x01
    #define NCCL_WIN_STRICT_ORDERING 0x02
    #define NCCL_WIN_GIN_ONLY 0x04
    #define NCCL_WIN_CFT_COUNTED 0x08
    #define NCCL_WIN_REQUIRED_ALIGNMENT 4096
    #define NCCL_CTA_POLICY_DEFAULT 0x00
    #define NCCL_CTA_POLICY_EFFICIENCY 0x01
    #define NCCL_CTA_POLICY_ZERO 0x02
    #define NCCL_SHRINK_DEFAULT 0x00
    #define NCCL_SHRINK_ABORT 0x01
    #define NCCL_REVOKE_DEFAULT 0x00
    #define NCCL_SUSPEND_MEM 0x01
    #endif /* NCCL_H_ */
    #ifndef PYCOLL_HOST_H
    typedef struct pycollStream* pycollStream_t;
    typedef struct pycollEvent* pycollEvent_t;
    typedef struct pycollGraph* pycollGraph_t;
    #endif
    /* the magic of NCCL_SIM_INFO_INITIALIZER, which nccl.h spells as a literal */
    #define PYCOLL_NCCL_SIM_INFO_MAGIC 0x74685283u
    #endif /* PYCOLL_NCCL_DECLS */
    """

    # --- opaque handles ------------------------------------------------------------------------
    cdef struct ncclComm
    ctypedef ncclComm* ncclComm_t
    cdef struct ncclWindow_vidmem
    ctypedef ncclWindow_vidmem* ncclWindow_t
    cdef struct ncclParamHandle
    ctypedef ncclParamHandle* ncclParamHandle_t
    cdef struct pycollStream
    ctypedef pycollStream* pycollStream_t
    cdef struct pycollEvent
    ctypedef pycollEvent* pycollEvent_t
    cdef struct pycollGraph
    ctypedef pycollGraph* pycollGraph_t

    ctypedef struct ncclUniqueId:
        char internal[128]

    # --- enums ---------------------------------------------------------------------------------
    ctypedef enum ncclResult_t:
        ncclSuccess
        ncclUnhandledCudaError
        ncclSystemError
        ncclInternalError
        ncclInvalidArgument
        ncclInvalidUsage
        ncclRemoteError
        ncclInProgress
        ncclTimeout
        ncclNumResults

    ctypedef enum ncclRedOp_t:
        ncclSum
        ncclProd
        ncclMax
        ncclMin
        ncclAvg
        ncclNumOps
        ncclMaxRedOp

    ctypedef enum ncclDataType_t:
        ncclInt8
        ncclChar
        ncclUint8
        ncclInt32
        ncclInt
        ncclUint32
        ncclInt64
        ncclUint64
        ncclFloat16
        ncclHalf
        ncclFloat32
        ncclFloat
        ncclFloat64
        ncclDouble
        ncclBfloat16
        ncclFloat8e4m3
        ncclFloat8e5m2
        ncclNumTypes

    ctypedef enum ncclScalarResidence_t:
        ncclScalarDevice
        ncclScalarHostImmediate

    ctypedef enum ncclCommMemStat_t:
        ncclStatGpuMemSuspend
        ncclStatGpuMemSuspended
        ncclStatGpuMemPersist
        ncclStatGpuMemTotal

    ctypedef enum ncclHostCftMode_t:
        ncclHostCftDefault
        ncclHostCftEnable
        ncclHostCftDisable
        ncclHostCftFallback

    ctypedef enum ncclNvlsHostMode_t:
        ncclNvlsHostModeDefault
        ncclNvlsHostModeEnable
        ncclNvlsHostModeDisableTransport
        ncclNvlsHostModeDisableSymmetricMultimem
        ncclNvlsHostModeDisable

    ctypedef enum ncclEncryptionMode_t:
        NCCL_ENCRYPTION_MODE_NONE
        NCCL_ENCRYPTION_MODE_PSK

    # --- structs -------------------------------------------------------------------------------
    ctypedef struct ncclConfig_t:
        size_t size
        unsigned int magic
        unsigned int version
        int blocking
        int cgaClusterSize
        int minCTAs
        int maxCTAs
        const char* netName
        int splitShare
        int trafficClass
        const char* commName
        int collnetEnable
        int CTAPolicy
        int shrinkShare
        int nvlsCTAs
        int nChannelsPerNetPeer
        int nvlinkCentricSched
        int graphUsageMode
        int numRmaCtx
        int maxP2pPeers
        int graphStreamOrdering
        int launchOrderImplicit
        int numRmaSig
        int rmaEagerInit
        int hostCftMode
        int nvlsHostMode

    ctypedef struct _ncclConfigExtKey "struct { int vendorId; int optionId; }":
        int vendorId
        int optionId

    ctypedef union _ncclConfigExtVal "union { int i; const char* s; void* raw; }":
        int i
        const char* s
        void* raw

    ctypedef struct ncclConfigExt_t:
        ncclConfigExt_t* next
        _ncclConfigExtKey key
        _ncclConfigExtVal val

    ctypedef struct ncclCollConfig_t:
        size_t size
        unsigned int magic
        unsigned int version
        ncclConfigExt_t* ext
        int minCTAs
        int maxCTAs
        int nvlsCTAs
        int cgaClusterSize
        const char* algSelection
        int forceAlgSelection
        int CTAPolicy
        uint64_t userProfilerTag
        void* launchCompletionEvent

    ctypedef struct ncclSimInfo_t:
        size_t size
        unsigned int magic
        unsigned int version
        float estimatedTime

    ctypedef struct ncclEncryptionConfig_t:
        size_t size
        unsigned int magic
        unsigned int version
        int mode
        const char* psk

    ctypedef struct ncclWaitSignalDesc_t:
        int opCnt
        int peer
        int sigIdx
        int ctx

    unsigned int PYCOLL_NCCL_SIM_INFO_MAGIC

    # --- constants (nccl.h macros) ------------------------------------------------------------
    enum:
        NCCL_MAJOR
        NCCL_MINOR
        NCCL_PATCH
        NCCL_VERSION_CODE
        NCCL_UNIQUE_ID_BYTES
        NCCL_CONFIG_UNDEF_INT
        NCCL_SPLIT_NOCOLOR
        NCCL_WIN_DEFAULT
        NCCL_WIN_COLL_SYMMETRIC
        NCCL_WIN_STRICT_ORDERING
        NCCL_WIN_GIN_ONLY
        NCCL_WIN_CFT_COUNTED
        NCCL_WIN_REQUIRED_ALIGNMENT
        NCCL_CTA_POLICY_DEFAULT
        NCCL_CTA_POLICY_EFFICIENCY
        NCCL_CTA_POLICY_ZERO
        NCCL_SHRINK_DEFAULT
        NCCL_SHRINK_ABORT
        NCCL_REVOKE_DEFAULT
        NCCL_SUSPEND_MEM
    unsigned int NCCL_API_MAGIC

# --- the device-API host types of nccl_device/host.h and core.h (2.32.3) ------------------------
cdef extern from *:
    """
    #include <stdbool.h>
    #ifndef PYCOLL_NCCL_DEVICE_DECLS
    #define PYCOLL_NCCL_DEVICE_DECLS
    #ifndef _NCCL_DEVICE_HOST_H_
    typedef struct ncclTeam { int nRanks, rank, stride; } ncclTeam_t;
    typedef uint32_t ncclDevResourceHandle_t;
    typedef uint32_t ncclGinSignal_t;
    typedef uint32_t ncclGinCounter_t;
    typedef uint32_t ncclCftLeId;
    typedef enum { NCCL_GIN_CONNECTION_NONE = 0, NCCL_GIN_CONNECTION_FULL = 1, NCCL_GIN_CONNECTION_RAIL = 2,
                   NCCL_GIN_CONNECTION_CUSTOM_STRIDE = 3 } ncclGinConnectionType_t;
    typedef enum { NCCL_GIN_TYPE_NONE = 0, NCCL_GIN_TYPE_PROXY = 2, NCCL_GIN_TYPE_GDAKI = 3, NCCL_GIN_TYPE_GPI = 4,
                   NCCL_GIN_TYPE_EFA_GDA = 5, NCCL_GIN_MAX_TYPES = 6 } ncclGinType_t;
    typedef enum { NCCL_CFT_TEAM_FLAT = 0, NCCL_CFT_TEAM_HIER_MULTIMEM = 1,
                   NCCL_CFT_TEAM_HIER_LSA = 2 } ncclCftTeamMode_t;
    typedef struct ncclMultimemHandle { void* mcBasePtr; } ncclMultimemHandle_t;
    typedef struct ncclLsaBarrierHandle { ncclDevResourceHandle_t bufHandle; int nBarriers; } ncclLsaBarrierHandle_t;
    typedef struct ncclGinBarrierHandle { ncclGinSignal_t signal0; ncclDevResourceHandle_t unused; }
        ncclGinBarrierHandle_t;
    typedef struct ncclLLA2AHandle { ncclDevResourceHandle_t bufHandle; uint32_t nSlots; } ncclLLA2AHandle_t;
    typedef struct ncclGinOutboxHandle { ncclDevResourceHandle_t bufHandle; uint32_t size_log2; }
        ncclGinOutboxHandle_t;
    typedef struct ncclGinInboxA2AHandle { ncclDevResourceHandle_t bufHandle; ncclGinSignal_t signals;
                                           uint32_t size_log2; uint32_t nPeers_rcp32; } ncclGinInboxA2AHandle_t;
    typedef struct ncclDevComm ncclDevComm_t;
    typedef struct ncclDevResourceRequirements {
      struct ncclDevResourceRequirements* next; size_t bufferSize, bufferAlign;
      ncclDevResourceHandle_t* outBufferHandle; int ginSignalCount; int ginCounterCount;
      ncclGinSignal_t* outGinSignalStart; ncclGinCounter_t* outGinCounterStart;
    } ncclDevResourceRequirements_t;
    typedef struct ncclTeamRequirements {
      struct ncclTeamRequirements* next; ncclTeam_t team; bool multimem; ncclMultimemHandle_t* outMultimemHandle;
    } ncclTeamRequirements_t;
    typedef struct ncclDevCommRequirements {
      size_t size; unsigned int magic; unsigned int version;
      ncclDevResourceRequirements_t* resourceRequirementsList; ncclTeamRequirements_t* teamRequirementsList;
      bool lsaMultimem; int barrierCount; int lsaBarrierCount; int railGinBarrierCount;
      int lsaLLA2ABlockCount, lsaLLA2ASlotCount; bool ginForceEnable; int ginContextCount; int ginSignalCount;
      int ginCounterCount; ncclGinConnectionType_t ginConnectionType; bool ginExclusiveContexts;
      int ginQueueDepth; int ginTrafficClass; int worldGinBarrierCount; bool ginStrongSignalsRequired;
      bool ginVaSignalsRequired; int ginCustomStride; ncclGinType_t ginType; bool useRuntimeVersion;
      int cftCaps; int cftBarrierCount;
    } ncclDevCommRequirements_t;
    typedef struct ncclCommProperties {
      size_t size; unsigned int magic; unsigned int version;
      int rank; int nRanks; int cudaDev; int nvmlDev; bool deviceApiSupport; bool multimemSupport;
      ncclGinType_t ginType; int nLsaTeams; bool hostRmaSupport; ncclGinType_t railedGinType; uint64_t commHash;
      int ginMinStride; ncclGinConnectionType_t ginConnectionType; bool ginSupport[64];
      size_t devCommRuntimeVersionSize; bool cftSupport; bool cftMulticastSupport; bool cftCountedSupport;
    } ncclCommProperties_t;
    #else
    typedef struct ncclGinOutboxHandle ncclGinOutboxHandle_t;
    typedef struct ncclGinInboxA2AHandle ncclGinInboxA2AHandle_t;
    #endif /* _NCCL_DEVICE_HOST_H_ */
    #endif /* PYCOLL_NCCL_DEVICE_DECLS */
    """

    ctypedef struct ncclTeam_t:
        int nRanks
        int rank
        int stride

    ctypedef uint32_t ncclDevResourceHandle_t
    ctypedef uint32_t ncclGinSignal_t
    ctypedef uint32_t ncclGinCounter_t
    ctypedef uint32_t ncclCftLeId
    ctypedef int ncclGinConnectionType_t
    ctypedef int ncclGinType_t
    ctypedef int ncclCftTeamMode_t

    ctypedef struct ncclMultimemHandle_t:
        void* mcBasePtr

    ctypedef struct ncclLsaBarrierHandle_t:
        ncclDevResourceHandle_t bufHandle
        int nBarriers

    ctypedef struct ncclGinBarrierHandle_t:
        ncclGinSignal_t signal0
        ncclDevResourceHandle_t unused

    ctypedef struct ncclLLA2AHandle_t:
        ncclDevResourceHandle_t bufHandle
        uint32_t nSlots

    ctypedef struct ncclGinOutboxHandle_t:
        ncclDevResourceHandle_t bufHandle
        uint32_t size_log2

    ctypedef struct ncclGinInboxA2AHandle_t:
        ncclDevResourceHandle_t bufHandle
        ncclGinSignal_t signals
        uint32_t size_log2
        uint32_t nPeers_rcp32

    cdef struct ncclDevComm   # opaque: NCCL fills it; its size is devCommRuntimeVersionSize
    ctypedef ncclDevComm ncclDevComm_t

    ctypedef struct ncclDevResourceRequirements_t:
        ncclDevResourceRequirements_t* next
        size_t bufferSize
        size_t bufferAlign
        ncclDevResourceHandle_t* outBufferHandle
        int ginSignalCount
        int ginCounterCount
        ncclGinSignal_t* outGinSignalStart
        ncclGinCounter_t* outGinCounterStart

    ctypedef struct ncclTeamRequirements_t:
        ncclTeamRequirements_t* next
        ncclTeam_t team
        bint multimem
        ncclMultimemHandle_t* outMultimemHandle

    ctypedef struct ncclDevCommRequirements_t:
        size_t size
        unsigned int magic
        unsigned int version
        ncclDevResourceRequirements_t* resourceRequirementsList
        ncclTeamRequirements_t* teamRequirementsList
        bint lsaMultimem
        int barrierCount
        int lsaBarrierCount
        int railGinBarrierCount
        int lsaLLA2ABlockCount
        int lsaLLA2ASlotCount
        bint ginForceEnable
        int ginContextCount
        int ginSignalCount
        int ginCounterCount
        ncclGinConnectionType_t ginConnectionType
        bint ginExclusiveContexts
        int ginQueueDepth
        int ginTrafficClass
        int worldGinBarrierCount
        bint ginStrongSignalsRequired
        bint ginVaSignalsRequired
        int ginCustomStride
        ncclGinType_t ginType
        bint useRuntimeVersion
        int cftCaps
        int cftBarrierCount

    ctypedef struct ncclCommProperties_t:
        size_t size
        unsigned int magic
        unsigned int version
        int rank
        int nRanks
        int cudaDev
        int nvmlDev
        bint deviceApiSupport
        bint multimemSupport
        ncclGinType_t ginType
        int nLsaTeams
        bint hostRmaSupport
        ncclGinType_t railedGinType
        uint64_t commHash
        int ginMinStride
        ncclGinConnectionType_t ginConnectionType
        bint ginSupport[64]
        size_t devCommRuntimeVersionSize
        bint cftSupport
        bint cftMulticastSupport
        bint cftCountedSupport

ctypedef void* cudaStream_t   # also hipStream_t and pycollStream_t: an opaque pointer
ctypedef void* cudaEvent_t

# --- every public host function of nccl.h 2.32.3, as a function-pointer type -------------------
# version and errors
ctypedef ncclResult_t (*ncclGetVersion_fn)(int* version) noexcept nogil
ctypedef const char* (*ncclGetErrorString_fn)(ncclResult_t result) noexcept nogil
ctypedef const char* (*ncclGetLastError_fn)(ncclComm_t comm) noexcept nogil
ctypedef ncclResult_t (*ncclCommGetAsyncError_fn)(ncclComm_t comm, ncclResult_t* asyncError) noexcept nogil
ctypedef void (*ncclResetDebugInit_fn)() noexcept nogil

# unique ids and communicator creation
ctypedef ncclResult_t (*ncclGetUniqueId_fn)(ncclUniqueId* uniqueId) noexcept nogil
ctypedef ncclResult_t (*ncclCommGetUniqueId_fn)(ncclComm_t comm, ncclUniqueId* uniqueId) noexcept nogil
ctypedef ncclResult_t (*ncclCommInitRank_fn)(ncclComm_t* comm, int nranks, ncclUniqueId commId, int rank) noexcept nogil
ctypedef ncclResult_t (*ncclCommInitAll_fn)(ncclComm_t* comm, int ndev, const int* devlist) noexcept nogil
ctypedef ncclResult_t (*ncclCommInitRankConfig_fn)(ncclComm_t* comm, int nranks, ncclUniqueId commId, int rank,
                                                   ncclConfig_t* config) noexcept nogil
ctypedef ncclResult_t (*ncclCommInitRankScalable_fn)(ncclComm_t* newcomm, int nranks, int myrank, int nId,
                                                     ncclUniqueId* commIds, ncclConfig_t* config) noexcept nogil
ctypedef ncclResult_t (*ncclCommSplit_fn)(ncclComm_t comm, int color, int key, ncclComm_t* newcomm,
                                          ncclConfig_t* config) noexcept nogil
ctypedef ncclResult_t (*ncclCommShrink_fn)(ncclComm_t comm, int* excludeRanksList, int excludeRanksCount,
                                           ncclComm_t* newcomm, ncclConfig_t* config, int shrinkFlags) noexcept nogil
ctypedef ncclResult_t (*ncclCommGrow_fn)(ncclComm_t comm, int nRanks, const ncclUniqueId* uniqueId, int rank,
                                         ncclComm_t* newcomm, ncclConfig_t* config) noexcept nogil

# teardown and state
ctypedef ncclResult_t (*ncclCommFinalize_fn)(ncclComm_t comm) noexcept nogil
ctypedef ncclResult_t (*ncclCommDestroy_fn)(ncclComm_t comm) noexcept nogil
ctypedef ncclResult_t (*ncclCommAbort_fn)(ncclComm_t comm) noexcept nogil
ctypedef ncclResult_t (*ncclCommRevoke_fn)(ncclComm_t comm, int revokeFlags) noexcept nogil
ctypedef ncclResult_t (*ncclCommSuspend_fn)(ncclComm_t comm, int flags) noexcept nogil
ctypedef ncclResult_t (*ncclCommResume_fn)(ncclComm_t comm) noexcept nogil
ctypedef ncclResult_t (*ncclCommMemStats_fn)(ncclComm_t comm, ncclCommMemStat_t stat, uint64_t* value) noexcept nogil

# queries
ctypedef ncclResult_t (*ncclCommCount_fn)(const ncclComm_t comm, int* count) noexcept nogil
ctypedef ncclResult_t (*ncclCommCuDevice_fn)(const ncclComm_t comm, int* device) noexcept nogil
ctypedef ncclResult_t (*ncclCommUserRank_fn)(const ncclComm_t comm, int* rank) noexcept nogil

# memory, registration, windows
ctypedef ncclResult_t (*ncclMemAlloc_fn)(void** ptr, size_t size) noexcept nogil
ctypedef ncclResult_t (*ncclMemFree_fn)(void* ptr) noexcept nogil
ctypedef ncclResult_t (*ncclCommRegister_fn)(const ncclComm_t comm, void* buff, size_t size, void** handle) noexcept nogil
ctypedef ncclResult_t (*ncclCommDeregister_fn)(const ncclComm_t comm, void* handle) noexcept nogil
ctypedef ncclResult_t (*ncclCommWindowRegister_fn)(ncclComm_t comm, void* buff, size_t size, ncclWindow_t* win,
                                                   int winFlags) noexcept nogil
ctypedef ncclResult_t (*ncclCommWindowDeregister_fn)(ncclComm_t comm, ncclWindow_t win) noexcept nogil
ctypedef ncclResult_t (*ncclWinGetUserPtr_fn)(ncclComm_t comm, ncclWindow_t win, void** outUserPtr) noexcept nogil

# reduction operators
ctypedef ncclResult_t (*ncclRedOpCreatePreMulSum_fn)(ncclRedOp_t* op, void* scalar, ncclDataType_t datatype,
                                                     ncclScalarResidence_t residence, ncclComm_t comm) noexcept nogil
ctypedef ncclResult_t (*ncclRedOpDestroy_fn)(ncclRedOp_t op, ncclComm_t comm) noexcept nogil

# collectives
ctypedef ncclResult_t (*ncclReduce_fn)(const void* sendbuff, void* recvbuff, size_t count, ncclDataType_t datatype,
                                       ncclRedOp_t op, int root, ncclComm_t comm, cudaStream_t stream) noexcept nogil
ctypedef ncclResult_t (*ncclBcast_fn)(void* buff, size_t count, ncclDataType_t datatype, int root, ncclComm_t comm,
                                      cudaStream_t stream) noexcept nogil
ctypedef ncclResult_t (*ncclBroadcast_fn)(const void* sendbuff, void* recvbuff, size_t count, ncclDataType_t datatype,
                                          int root, ncclComm_t comm, cudaStream_t stream) noexcept nogil
ctypedef ncclResult_t (*ncclAllReduce_fn)(const void* sendbuff, void* recvbuff, size_t count, ncclDataType_t datatype,
                                          ncclRedOp_t op, ncclComm_t comm, cudaStream_t stream) noexcept nogil
ctypedef ncclResult_t (*ncclReduceScatter_fn)(const void* sendbuff, void* recvbuff, size_t recvcount,
                                              ncclDataType_t datatype, ncclRedOp_t op, ncclComm_t comm,
                                              cudaStream_t stream) noexcept nogil
ctypedef ncclResult_t (*ncclAllGather_fn)(const void* sendbuff, void* recvbuff, size_t sendcount,
                                          ncclDataType_t datatype, ncclComm_t comm, cudaStream_t stream) noexcept nogil
ctypedef ncclResult_t (*ncclAlltoAll_fn)(const void* sendbuff, void* recvbuff, size_t count, ncclDataType_t datatype,
                                         ncclComm_t comm, cudaStream_t stream) noexcept nogil
ctypedef ncclResult_t (*ncclGather_fn)(const void* sendbuff, void* recvbuff, size_t count, ncclDataType_t datatype,
                                       int root, ncclComm_t comm, cudaStream_t stream) noexcept nogil
ctypedef ncclResult_t (*ncclScatter_fn)(const void* sendbuff, void* recvbuff, size_t count, ncclDataType_t datatype,
                                        int root, ncclComm_t comm, cudaStream_t stream) noexcept nogil

# collectives with a per-call config (2.31+)
ctypedef ncclResult_t (*ncclAllReduceConfig_fn)(const void* sendbuff, void* recvbuff, size_t count,
                                                ncclDataType_t datatype, ncclRedOp_t op, ncclComm_t comm,
                                                cudaStream_t stream, const ncclCollConfig_t* config) noexcept nogil
ctypedef ncclResult_t (*ncclBroadcastConfig_fn)(const void* sendbuff, void* recvbuff, size_t count,
                                                ncclDataType_t datatype, int root, ncclComm_t comm,
                                                cudaStream_t stream, const ncclCollConfig_t* config) noexcept nogil
ctypedef ncclResult_t (*ncclReduceConfig_fn)(const void* sendbuff, void* recvbuff, size_t count,
                                             ncclDataType_t datatype, ncclRedOp_t op, int root, ncclComm_t comm,
                                             cudaStream_t stream, const ncclCollConfig_t* config) noexcept nogil
ctypedef ncclResult_t (*ncclAllGatherConfig_fn)(const void* sendbuff, void* recvbuff, size_t sendcount,
                                                ncclDataType_t datatype, ncclComm_t comm, cudaStream_t stream,
                                                const ncclCollConfig_t* config) noexcept nogil
ctypedef ncclResult_t (*ncclReduceScatterConfig_fn)(const void* sendbuff, void* recvbuff, size_t recvcount,
                                                    ncclDataType_t datatype, ncclRedOp_t op, ncclComm_t comm,
                                                    cudaStream_t stream, const ncclCollConfig_t* config) noexcept nogil
ctypedef ncclResult_t (*ncclAlltoAllConfig_fn)(const void* sendbuff, void* recvbuff, size_t count,
                                               ncclDataType_t datatype, ncclComm_t comm, cudaStream_t stream,
                                               const ncclCollConfig_t* config) noexcept nogil
ctypedef ncclResult_t (*ncclGatherConfig_fn)(const void* sendbuff, void* recvbuff, size_t count,
                                             ncclDataType_t datatype, int root, ncclComm_t comm,
                                             cudaStream_t stream, const ncclCollConfig_t* config) noexcept nogil
ctypedef ncclResult_t (*ncclScatterConfig_fn)(const void* sendbuff, void* recvbuff, size_t count,
                                              ncclDataType_t datatype, int root, ncclComm_t comm,
                                              cudaStream_t stream, const ncclCollConfig_t* config) noexcept nogil

# point-to-point and one-sided
ctypedef ncclResult_t (*ncclSend_fn)(const void* sendbuff, size_t count, ncclDataType_t datatype, int peer,
                                     ncclComm_t comm, cudaStream_t stream) noexcept nogil
ctypedef ncclResult_t (*ncclRecv_fn)(void* recvbuff, size_t count, ncclDataType_t datatype, int peer,
                                     ncclComm_t comm, cudaStream_t stream) noexcept nogil
ctypedef ncclResult_t (*ncclPutSignal_fn)(const void* localbuff, size_t count, ncclDataType_t datatype, int peer,
                                          ncclWindow_t peerWin, size_t peerWinOffset, int sigIdx, int ctx,
                                          unsigned int flags, ncclComm_t comm, cudaStream_t stream) noexcept nogil
ctypedef ncclResult_t (*ncclSignal_fn)(int peer, int sigIdx, int ctx, unsigned int flags, ncclComm_t comm,
                                       cudaStream_t stream) noexcept nogil
ctypedef ncclResult_t (*ncclWaitSignal_fn)(int nDesc, ncclWaitSignalDesc_t* signalDescs, ncclComm_t comm,
                                           cudaStream_t stream) noexcept nogil

# groups
ctypedef ncclResult_t (*ncclGroupStart_fn)() noexcept nogil
ctypedef ncclResult_t (*ncclGroupEnd_fn)() noexcept nogil
ctypedef ncclResult_t (*ncclGroupSimulateEnd_fn)(ncclSimInfo_t* simInfo) noexcept nogil

# parameters (2.30.4) and encryption (2.31+)
ctypedef ncclResult_t (*ncclParamBind_fn)(ncclParamHandle_t* out, const char* key) noexcept nogil
ctypedef ncclResult_t (*ncclParamGetI8_fn)(ncclParamHandle_t h, int8_t* out) noexcept nogil
ctypedef ncclResult_t (*ncclParamGetI16_fn)(ncclParamHandle_t h, int16_t* out) noexcept nogil
ctypedef ncclResult_t (*ncclParamGetI32_fn)(ncclParamHandle_t h, int32_t* out) noexcept nogil
ctypedef ncclResult_t (*ncclParamGetI64_fn)(ncclParamHandle_t h, int64_t* out) noexcept nogil
ctypedef ncclResult_t (*ncclParamGetU8_fn)(ncclParamHandle_t h, uint8_t* out) noexcept nogil
ctypedef ncclResult_t (*ncclParamGetU16_fn)(ncclParamHandle_t h, uint16_t* out) noexcept nogil
ctypedef ncclResult_t (*ncclParamGetU32_fn)(ncclParamHandle_t h, uint32_t* out) noexcept nogil
ctypedef ncclResult_t (*ncclParamGetU64_fn)(ncclParamHandle_t h, uint64_t* out) noexcept nogil
ctypedef ncclResult_t (*ncclParamGetStr_fn)(ncclParamHandle_t h, const char** out) noexcept nogil
ctypedef ncclResult_t (*ncclParamGet_fn)(ncclParamHandle_t h, void* out, int maxLen, int* len) noexcept nogil
ctypedef ncclResult_t (*ncclParamGetParameter_fn)(const char* key, const char** value, int* valueLen) noexcept nogil
ctypedef ncclResult_t (*ncclParamGetAllParameterKeys_fn)(const char*** table, int* tableLen) noexcept nogil
ctypedef void (*ncclParamDumpAll_fn)() noexcept nogil
ctypedef ncclResult_t (*ncclSetEncryption_fn)(const ncclEncryptionConfig_t* config) noexcept nogil

# device API host functions (nccl_device/host.h, 2.28+; the two GIN scratch ones are Linux exports the
# header declares only for Windows) and the undocumented debug reset
ctypedef void (*ncclResetDebugInitInternal_fn)() noexcept nogil
ctypedef ncclResult_t (*ncclCommQueryProperties_fn)(ncclComm_t comm, ncclCommProperties_t* props) noexcept nogil
ctypedef ncclResult_t (*ncclDevCommCreate_fn)(ncclComm_t comm, const ncclDevCommRequirements_t* reqs,
                                              ncclDevComm_t* outDevComm) noexcept nogil
ctypedef ncclResult_t (*ncclDevCommDestroy_fn)(ncclComm_t comm, const ncclDevComm_t* devComm) noexcept nogil
ctypedef ncclResult_t (*ncclGetLsaMultimemDevicePointer_fn)(ncclWindow_t window, size_t offset,
                                                            void** outPtr) noexcept nogil
ctypedef ncclResult_t (*ncclGetMultimemDevicePointer_fn)(ncclWindow_t window, size_t offset,
                                                         ncclMultimemHandle_t multimem, void** outPtr) noexcept nogil
ctypedef ncclResult_t (*ncclGetLsaDevicePointer_fn)(ncclWindow_t window, size_t offset, int lsaRank,
                                                    void** outPtr) noexcept nogil
ctypedef ncclResult_t (*ncclGetPeerDevicePointer_fn)(ncclWindow_t window, size_t offset, int peer,
                                                     void** outPtr) noexcept nogil
ctypedef ncclResult_t (*ncclGetMultimemDeviceLeInfo_fn)(ncclWindow_t window, size_t offset, ncclCftLeId* leId,
                                                        size_t* leOffset) noexcept nogil
ctypedef ncclResult_t (*ncclGetCftDeviceLeInfo_fn)(ncclWindow_t window, size_t offset, int peerCft,
                                                   ncclTeam_t cftTeam, ncclCftLeId* leId,
                                                   size_t* leOffset) noexcept nogil
ctypedef ncclResult_t (*ncclGetPeerDeviceLeInfo_fn)(ncclWindow_t window, size_t offset, int peerWorld,
                                                    ncclCftLeId* leId, size_t* leOffset) noexcept nogil
ctypedef ncclTeam_t (*ncclTeamWorld_fn)(ncclComm_t comm) noexcept nogil
ctypedef ncclTeam_t (*ncclTeamLsa_fn)(ncclComm_t comm) noexcept nogil
ctypedef ncclTeam_t (*ncclTeamCft_fn)(ncclComm_t comm, ncclCftTeamMode_t mode) noexcept nogil
ctypedef ncclTeam_t (*ncclTeamCftMultimem_fn)(ncclComm_t comm) noexcept nogil
ctypedef int (*ncclTeamRankToWorld_fn)(ncclComm_t comm, ncclTeam_t team, int rank) noexcept nogil
ctypedef int (*ncclTeamRankToLsa_fn)(ncclComm_t comm, ncclTeam_t team, int rank) noexcept nogil
ctypedef ncclTeam_t (*ncclTeamRail_fn)(ncclComm_t comm) noexcept nogil
ctypedef ncclResult_t (*ncclLsaBarrierCreateRequirement_fn)(ncclTeam_t team, int nBarriers,
                                                            ncclLsaBarrierHandle_t* outHandle,
                                                            ncclDevResourceRequirements_t* outReq) noexcept nogil
ctypedef ncclResult_t (*ncclGinBarrierCreateRequirement_fn)(ncclComm_t comm, ncclTeam_t team, int nBarriers,
                                                            ncclGinBarrierHandle_t* outHandle,
                                                            ncclDevResourceRequirements_t* outReq) noexcept nogil
ctypedef int (*ncclLLA2ACalcSlots_fn)(int maxElts, int maxEltSize) noexcept nogil
ctypedef ncclResult_t (*ncclLLA2ACreateRequirement_fn)(int nBlocks, int nSlots, ncclLLA2AHandle_t* outHandle,
                                                       ncclDevResourceRequirements_t* outReq) noexcept nogil
ctypedef ncclResult_t (*ncclGinOutboxCreateRequirement_fn)(int nBlocks, int size_log2, ncclGinOutboxHandle_t* outHandle,
                                                           ncclDevResourceRequirements_t* outReq) noexcept nogil
ctypedef ncclResult_t (*ncclGinInboxA2ACreateRequirement_fn)(ncclTeam_t peers, int nBlocks, int size_log2,
                                                             ncclGinInboxA2AHandle_t* outHandle,
                                                             ncclDevResourceRequirements_t* outReq) noexcept nogil

# --- the pycoll host library's extras (pycoll_host.h); each returns an ncclResult_t value --------
ctypedef int (*pycollHostGetVersion_fn)(int* version) noexcept nogil
ctypedef int (*pycollStreamCreate_fn)(pycollStream_t* stream) noexcept nogil
ctypedef int (*pycollStreamDestroy_fn)(pycollStream_t stream) noexcept nogil
ctypedef int (*pycollStreamSynchronize_fn)(pycollStream_t stream) noexcept nogil
ctypedef int (*pycollStreamQuery_fn)(pycollStream_t stream) noexcept nogil
ctypedef int (*pycollStreamWaitRoom_fn)(pycollStream_t stream, uint64_t timeout_ns) noexcept nogil
ctypedef int (*pycollStreamWaitEvent_fn)(pycollStream_t stream, pycollEvent_t event) noexcept nogil
ctypedef int (*pycollEventCreate_fn)(pycollEvent_t* event) noexcept nogil
ctypedef int (*pycollEventDestroy_fn)(pycollEvent_t event) noexcept nogil
ctypedef int (*pycollEventRecord_fn)(pycollEvent_t event, pycollStream_t stream) noexcept nogil
ctypedef int (*pycollEventQuery_fn)(pycollEvent_t event) noexcept nogil
ctypedef int (*pycollEventSynchronize_fn)(pycollEvent_t event) noexcept nogil
ctypedef int (*pycollEventElapsedTime_fn)(float* ms, pycollEvent_t start, pycollEvent_t end) noexcept nogil
ctypedef int (*pycollStreamCreateWithFlags_fn)(pycollStream_t* stream, int flags) noexcept nogil
ctypedef int (*pycollStreamSetFlags_fn)(pycollStream_t stream, int flags) noexcept nogil
ctypedef int (*pycollEventWait_fn)(pycollEvent_t event, uint64_t timeout_ns) noexcept nogil
ctypedef int (*pycollEventArm_fn)(pycollEvent_t event) noexcept nogil
ctypedef int (*pycollEventFire_fn)(pycollEvent_t event) noexcept nogil
ctypedef int (*pycollStreamSetLegacy_fn)(pycollStream_t legacy) noexcept nogil
ctypedef int (*pycollStreamResolve_fn)(pycollStream_t stream, pycollStream_t* out) noexcept nogil
ctypedef int (*pycollStreamBeginCapture_fn)(pycollStream_t stream) noexcept nogil
ctypedef int (*pycollStreamEndCapture_fn)(pycollStream_t stream, pycollGraph_t* graph) noexcept nogil
ctypedef int (*pycollGraphLaunch_fn)(pycollGraph_t graph, pycollStream_t stream) noexcept nogil
ctypedef int (*pycollGraphDestroy_fn)(pycollGraph_t graph) noexcept nogil
ctypedef int (*pycollCommWaitReady_fn)(ncclComm_t comm, uint64_t timeout_ns) noexcept nogil
ctypedef int (*pycollCommPeerOpen_fn)(ncclComm_t comm, int peer, int* count) noexcept nogil
ctypedef int (*pycollCommPeerProcess_fn)(ncclComm_t comm, int peer, int* pid, uint64_t* start, uint64_t* pidns) noexcept nogil
ctypedef int (*pycollCommEventsClean_fn)(ncclComm_t comm, pycollEvent_t start, pycollEvent_t end, int* clean) noexcept nogil
ctypedef int (*pycollCommNoteFailure_fn)(ncclComm_t comm, const char* text) noexcept nogil


# --- the symbol table of one loaded library: NULL where the library lacks the function ----------
ctypedef struct pycoll_nccl_table:
    ncclGetVersion_fn ncclGetVersion
    ncclGetErrorString_fn ncclGetErrorString
    ncclGetLastError_fn ncclGetLastError
    ncclCommGetAsyncError_fn ncclCommGetAsyncError
    ncclResetDebugInit_fn ncclResetDebugInit
    ncclGetUniqueId_fn ncclGetUniqueId
    ncclCommGetUniqueId_fn ncclCommGetUniqueId
    ncclCommInitRank_fn ncclCommInitRank
    ncclCommInitAll_fn ncclCommInitAll
    ncclCommInitRankConfig_fn ncclCommInitRankConfig
    ncclCommInitRankScalable_fn ncclCommInitRankScalable
    ncclCommSplit_fn ncclCommSplit
    ncclCommShrink_fn ncclCommShrink
    ncclCommGrow_fn ncclCommGrow
    ncclCommFinalize_fn ncclCommFinalize
    ncclCommDestroy_fn ncclCommDestroy
    ncclCommAbort_fn ncclCommAbort
    ncclCommRevoke_fn ncclCommRevoke
    ncclCommSuspend_fn ncclCommSuspend
    ncclCommResume_fn ncclCommResume
    ncclCommMemStats_fn ncclCommMemStats
    ncclCommCount_fn ncclCommCount
    ncclCommCuDevice_fn ncclCommCuDevice
    ncclCommUserRank_fn ncclCommUserRank
    ncclMemAlloc_fn ncclMemAlloc
    ncclMemFree_fn ncclMemFree
    ncclCommRegister_fn ncclCommRegister
    ncclCommDeregister_fn ncclCommDeregister
    ncclCommWindowRegister_fn ncclCommWindowRegister
    ncclCommWindowDeregister_fn ncclCommWindowDeregister
    ncclWinGetUserPtr_fn ncclWinGetUserPtr
    ncclRedOpCreatePreMulSum_fn ncclRedOpCreatePreMulSum
    ncclRedOpDestroy_fn ncclRedOpDestroy
    ncclReduce_fn ncclReduce
    ncclBcast_fn ncclBcast
    ncclBroadcast_fn ncclBroadcast
    ncclAllReduce_fn ncclAllReduce
    ncclReduceScatter_fn ncclReduceScatter
    ncclAllGather_fn ncclAllGather
    ncclAlltoAll_fn ncclAlltoAll
    ncclGather_fn ncclGather
    ncclScatter_fn ncclScatter
    ncclAllReduceConfig_fn ncclAllReduceConfig
    ncclBroadcastConfig_fn ncclBroadcastConfig
    ncclReduceConfig_fn ncclReduceConfig
    ncclAllGatherConfig_fn ncclAllGatherConfig
    ncclReduceScatterConfig_fn ncclReduceScatterConfig
    ncclAlltoAllConfig_fn ncclAlltoAllConfig
    ncclGatherConfig_fn ncclGatherConfig
    ncclScatterConfig_fn ncclScatterConfig
    ncclSend_fn ncclSend
    ncclRecv_fn ncclRecv
    ncclPutSignal_fn ncclPutSignal
    ncclSignal_fn ncclSignal
    ncclWaitSignal_fn ncclWaitSignal
    ncclGroupStart_fn ncclGroupStart
    ncclGroupEnd_fn ncclGroupEnd
    ncclGroupSimulateEnd_fn ncclGroupSimulateEnd
    ncclParamBind_fn ncclParamBind
    ncclParamGetI8_fn ncclParamGetI8
    ncclParamGetI16_fn ncclParamGetI16
    ncclParamGetI32_fn ncclParamGetI32
    ncclParamGetI64_fn ncclParamGetI64
    ncclParamGetU8_fn ncclParamGetU8
    ncclParamGetU16_fn ncclParamGetU16
    ncclParamGetU32_fn ncclParamGetU32
    ncclParamGetU64_fn ncclParamGetU64
    ncclParamGetStr_fn ncclParamGetStr
    ncclParamGet_fn ncclParamGet
    ncclParamGetParameter_fn ncclParamGetParameter
    ncclParamGetAllParameterKeys_fn ncclParamGetAllParameterKeys
    ncclParamDumpAll_fn ncclParamDumpAll
    ncclSetEncryption_fn ncclSetEncryption
    ncclResetDebugInitInternal_fn ncclResetDebugInitInternal
    ncclCommQueryProperties_fn ncclCommQueryProperties
    ncclDevCommCreate_fn ncclDevCommCreate
    ncclDevCommDestroy_fn ncclDevCommDestroy
    ncclGetLsaMultimemDevicePointer_fn ncclGetLsaMultimemDevicePointer
    ncclGetMultimemDevicePointer_fn ncclGetMultimemDevicePointer
    ncclGetLsaDevicePointer_fn ncclGetLsaDevicePointer
    ncclGetPeerDevicePointer_fn ncclGetPeerDevicePointer
    ncclGetMultimemDeviceLeInfo_fn ncclGetMultimemDeviceLeInfo
    ncclGetCftDeviceLeInfo_fn ncclGetCftDeviceLeInfo
    ncclGetPeerDeviceLeInfo_fn ncclGetPeerDeviceLeInfo
    ncclTeamWorld_fn ncclTeamWorld
    ncclTeamLsa_fn ncclTeamLsa
    ncclTeamCft_fn ncclTeamCft
    ncclTeamCftMultimem_fn ncclTeamCftMultimem
    ncclTeamRankToWorld_fn ncclTeamRankToWorld
    ncclTeamRankToLsa_fn ncclTeamRankToLsa
    ncclTeamRail_fn ncclTeamRail
    ncclLsaBarrierCreateRequirement_fn ncclLsaBarrierCreateRequirement
    ncclGinBarrierCreateRequirement_fn ncclGinBarrierCreateRequirement
    ncclLLA2ACalcSlots_fn ncclLLA2ACalcSlots
    ncclLLA2ACreateRequirement_fn ncclLLA2ACreateRequirement
    ncclGinOutboxCreateRequirement_fn ncclGinOutboxCreateRequirement
    ncclGinInboxA2ACreateRequirement_fn ncclGinInboxA2ACreateRequirement
    # pycoll host library only
    pycollHostGetVersion_fn pycollHostGetVersion
    pycollStreamCreate_fn pycollStreamCreate
    pycollStreamDestroy_fn pycollStreamDestroy
    pycollStreamSynchronize_fn pycollStreamSynchronize
    pycollStreamQuery_fn pycollStreamQuery
    pycollStreamWaitRoom_fn pycollStreamWaitRoom
    pycollStreamWaitEvent_fn pycollStreamWaitEvent
    pycollEventCreate_fn pycollEventCreate
    pycollEventDestroy_fn pycollEventDestroy
    pycollEventRecord_fn pycollEventRecord
    pycollEventQuery_fn pycollEventQuery
    pycollEventSynchronize_fn pycollEventSynchronize
    pycollEventElapsedTime_fn pycollEventElapsedTime
    pycollStreamCreateWithFlags_fn pycollStreamCreateWithFlags
    pycollStreamSetFlags_fn pycollStreamSetFlags
    pycollEventWait_fn pycollEventWait
    pycollEventWait_fn pycollEventWaitRun
    pycollEventArm_fn pycollEventArm
    pycollEventFire_fn pycollEventFire
    pycollStreamSetLegacy_fn pycollStreamSetLegacy
    pycollStreamResolve_fn pycollStreamResolve
    pycollStreamBeginCapture_fn pycollStreamBeginCapture
    pycollStreamEndCapture_fn pycollStreamEndCapture
    pycollGraphLaunch_fn pycollGraphLaunch
    pycollGraphDestroy_fn pycollGraphDestroy
    pycollCommWaitReady_fn pycollCommWaitReady
    pycollCommPeerOpen_fn pycollCommPeerOpen
    pycollCommPeerProcess_fn pycollCommPeerProcess
    pycollCommEventsClean_fn pycollCommEventsClean
    pycollCommNoteFailure_fn pycollCommNoteFailure
