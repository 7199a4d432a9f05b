# Constants, enums and the tables of declared functions (included by _nccl.pyx).

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
    "ncclResetDebugInitInternal": "2.24",  # undocumented (no header declares it); same caveat as above
    # the device-API host functions of nccl_device/host.h: "2.28" is the release that introduced the
    # device API (read in the release notes, not per function); "2.31" as above (absent from 2.30.7)
    "ncclCommQueryProperties": "2.29",
    "ncclDevCommCreate": "2.28",
    "ncclDevCommDestroy": "2.28",
    "ncclGetLsaMultimemDevicePointer": "2.29",
    "ncclGetMultimemDevicePointer": "2.29",
    "ncclGetLsaDevicePointer": "2.29",
    "ncclGetPeerDevicePointer": "2.29",
    "ncclGetMultimemDeviceLeInfo": "2.31",
    "ncclGetCftDeviceLeInfo": "2.31",
    "ncclGetPeerDeviceLeInfo": "2.31",
    "ncclTeamWorld": "2.28",
    "ncclTeamLsa": "2.28",
    "ncclTeamCft": "2.31",
    "ncclTeamCftMultimem": "2.31",
    "ncclTeamRankToWorld": "2.28",
    "ncclTeamRankToLsa": "2.28",
    "ncclTeamRail": "2.28",
    "ncclLsaBarrierCreateRequirement": "2.28",
    "ncclGinBarrierCreateRequirement": "2.28",
    "ncclLLA2ACalcSlots": "2.28",
    "ncclLLA2ACreateRequirement": "2.28",
    "ncclGinOutboxCreateRequirement": "2.31",
    "ncclGinInboxA2ACreateRequirement": "2.31",
}

#: Every declared NCCL function -> the Library method that calls it (tests check both directions).
WRAPPERS = {
    "ncclGetVersion": "get_version", "ncclGetErrorString": "get_error_string", "ncclGetLastError": "get_last_error",
    "ncclCommGetAsyncError": "comm_get_async_error", "ncclResetDebugInit": "reset_debug_init",
    "ncclResetDebugInitInternal": "reset_debug_init", "ncclGetUniqueId": "get_unique_id",
    "ncclCommGetUniqueId": "comm_get_unique_id", "ncclCommInitRank": "comm_init_rank",
    "ncclCommInitAll": "comm_init_all", "ncclCommInitRankConfig": "comm_init_rank_config",
    "ncclCommInitRankScalable": "comm_init_rank_scalable", "ncclCommSplit": "comm_split",
    "ncclCommShrink": "comm_shrink", "ncclCommGrow": "comm_grow", "ncclCommFinalize": "comm_finalize",
    "ncclCommDestroy": "comm_destroy", "ncclCommAbort": "comm_abort", "ncclCommRevoke": "comm_revoke",
    "ncclCommSuspend": "comm_suspend", "ncclCommResume": "comm_resume", "ncclCommMemStats": "comm_mem_stats",
    "ncclCommCount": "comm_count", "ncclCommCuDevice": "comm_cu_device", "ncclCommUserRank": "comm_user_rank",
    "ncclMemAlloc": "mem_alloc", "ncclMemFree": "mem_free", "ncclCommRegister": "comm_register",
    "ncclCommDeregister": "comm_deregister", "ncclCommWindowRegister": "comm_window_register",
    "ncclCommWindowDeregister": "comm_window_deregister", "ncclWinGetUserPtr": "win_get_user_ptr",
    "ncclRedOpCreatePreMulSum": "red_op_create_pre_mul_sum", "ncclRedOpDestroy": "red_op_destroy",
    "ncclReduce": "reduce", "ncclBcast": "bcast", "ncclBroadcast": "broadcast", "ncclAllReduce": "all_reduce",
    "ncclReduceScatter": "reduce_scatter", "ncclAllGather": "all_gather", "ncclAlltoAll": "all_to_all",
    "ncclGather": "gather", "ncclScatter": "scatter", "ncclAllReduceConfig": "all_reduce",
    "ncclBroadcastConfig": "broadcast", "ncclReduceConfig": "reduce", "ncclAllGatherConfig": "all_gather",
    "ncclReduceScatterConfig": "reduce_scatter", "ncclAlltoAllConfig": "all_to_all", "ncclGatherConfig": "gather",
    "ncclScatterConfig": "scatter", "ncclSend": "send", "ncclRecv": "recv", "ncclPutSignal": "put_signal",
    "ncclSignal": "signal", "ncclWaitSignal": "wait_signal", "ncclGroupStart": "group_start",
    "ncclGroupEnd": "group_end", "ncclGroupSimulateEnd": "group_simulate_end", "ncclParamBind": "param_bind",
    "ncclParamGetI8": "param_read", "ncclParamGetI16": "param_read", "ncclParamGetI32": "param_read",
    "ncclParamGetI64": "param_read", "ncclParamGetU8": "param_read", "ncclParamGetU16": "param_read",
    "ncclParamGetU32": "param_read", "ncclParamGetU64": "param_read", "ncclParamGetStr": "param_read",
    "ncclParamGet": "param_read", "ncclParamGetParameter": "param_get",
    "ncclParamGetAllParameterKeys": "param_keys", "ncclParamDumpAll": "param_dump_all",
    "ncclSetEncryption": "set_encryption", "ncclCommQueryProperties": "comm_query_properties",
    "ncclDevCommCreate": "dev_comm_create", "ncclDevCommDestroy": "dev_comm_destroy",
    "ncclGetLsaMultimemDevicePointer": "get_lsa_multimem_device_pointer",
    "ncclGetMultimemDevicePointer": "get_multimem_device_pointer",
    "ncclGetLsaDevicePointer": "get_lsa_device_pointer", "ncclGetPeerDevicePointer": "get_peer_device_pointer",
    "ncclGetMultimemDeviceLeInfo": "get_multimem_device_le_info",
    "ncclGetCftDeviceLeInfo": "get_cft_device_le_info", "ncclGetPeerDeviceLeInfo": "get_peer_device_le_info",
    "ncclTeamWorld": "team_world", "ncclTeamLsa": "team_lsa", "ncclTeamCft": "team_cft",
    "ncclTeamCftMultimem": "team_cft_multimem", "ncclTeamRankToWorld": "team_rank_to_world",
    "ncclTeamRankToLsa": "team_rank_to_lsa", "ncclTeamRail": "team_rail",
    "ncclLsaBarrierCreateRequirement": "lsa_barrier_create_requirement",
    "ncclGinBarrierCreateRequirement": "gin_barrier_create_requirement", "ncclLLA2ACalcSlots": "lla2a_calc_slots",
    "ncclLLA2ACreateRequirement": "lla2a_create_requirement",
    "ncclGinOutboxCreateRequirement": "gin_outbox_create_requirement",
    "ncclGinInboxA2ACreateRequirement": "gin_inbox_a2a_create_requirement",
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
    "pycollStreamWaitRoom",
    "pycollStreamWaitEvent",
    "pycollEventCreate",
    "pycollEventDestroy",
    "pycollEventRecord",
    "pycollEventQuery",
    "pycollEventSynchronize",
    "pycollEventElapsedTime",
    "pycollStreamCreateWithFlags",
    "pycollStreamSetFlags",
    "pycollEventWait",
    "pycollEventWaitRun",
    "pycollEventArm",
    "pycollEventFire",
    "pycollStreamSetLegacy",
    "pycollStreamResolve",
    "pycollStreamBeginCapture",
    "pycollStreamEndCapture",
    "pycollGraphLaunch",
    "pycollGraphDestroy",
    "pycollCommWaitReady",
    "pycollCommPeerOpen",
    "pycollCommPeerProcess",
    "pycollCommEventsClean",
    "pycollCommNoteFailure",
)

#: pycollStreamCreateWithFlags: work submitted while the stream is idle runs in the caller's thread.
HOST_STREAM_INLINE = 0x1
#: pycollStreamCreateWithFlags: synchronised with the legacy stream (pycollStreamSetLegacy), as a blocking CUDA stream.
HOST_STREAM_BLOCKING = 0x2
#: pycollStreamSetFlags: a pycollEventWaitRun on the stream's events runs the work its thread has not begun.
HOST_STREAM_HELP = 0x4


def version_tuple(code):
    """Decode an NCCL version code: X*1000+Y*100+Z up to 2.8, X*10000+Y*100+Z after."""
    code = int(code)
    if code < 0:
        raise ValueError(f"an NCCL version code is >= 0, got {code}")
    if code < 10000:
        return (code // 1000, (code % 1000) // 100, code % 100)
    return (code // 10000, (code % 10000) // 100, code % 100)
