"""Type stubs for pycoll._bindings._nccl: thin, GIL-free bindings to the NCCL C API.

Conventions (they hold for every method of :class:`Library`):

* Handles are plain ints: a communicator (``ncclComm_t``), a stream (``cudaStream_t`` /
  ``hipStream_t`` / a host stream), a buffer address, a registration handle, a window. ``0`` is
  NULL.
* Every C call releases the GIL.
* A call whose ``ncclResult_t`` is neither ``ncclSuccess`` nor ``ncclInProgress`` raises the
  :class:`pycoll.errors.NCCLError` subclass for that code, carrying ``ncclGetLastError`` text.
* ``ncclInProgress`` is never success: calls that may legitimately return it (anything on a
  nonblocking communicator) return the status (``SUCCESS`` or ``IN_PROGRESS``) and the caller
  polls ``comm_get_async_error``. A call that returns a value (a count, a handle, an id) and
  whose output is therefore not valid yet raises :class:`pycoll.errors.InProgressError` instead.
* A function the loaded library does not export raises :class:`pycoll.errors.NotSupported`
  naming the function and the NCCL release that introduced it.
* Bad Python-side arguments (negative counts or ranks, unknown datatypes, an op outside the C int range,
  ``None`` where a handle is required) raise ``ValueError``/``TypeError`` before any C call. An op number
  in range that the communicator does not know (values from ``ncclNumOps`` up are PreMulSum handles) is the
  library's to judge: :class:`pycoll.errors.InvalidArgument` with its text.
"""

from enum import IntEnum
from typing import Any, Dict, List, NamedTuple, Optional, Sequence, Tuple, Union

__all__ = [
    "SUCCESS", "IN_PROGRESS", "UNIQUE_ID_BYTES", "SPLIT_NOCOLOR", "SHRINK_DEFAULT", "SHRINK_ABORT",
    "REVOKE_DEFAULT", "SUSPEND_MEM", "CONFIG_UNDEF_INT", "API_MAGIC", "HEADER_VERSION", "CONFIG_SIZE",
    "WIN_DEFAULT", "WIN_COLL_SYMMETRIC", "WIN_STRICT_ORDERING", "WIN_GIN_ONLY", "WIN_CFT_COUNTED",
    "WIN_REQUIRED_ALIGNMENT", "CTA_POLICY_DEFAULT", "CTA_POLICY_EFFICIENCY", "CTA_POLICY_ZERO", "Result",
    "DataType", "RedOp", "ScalarResidence", "CommMemStat", "FUNCTIONS", "RCCL_FUNCTIONS", "HOST_FUNCTIONS",
    "version_tuple", "UniqueId", "Config", "CollConfig", "CommSlot", "Library", "HostLibrary", "load",
    "loaded", "capture_stack", "WRAPPERS", "Team", "DevRequirement", "DevCommRequirements", "DevComm", "GIN_TYPE_NONE",
    "GIN_TYPE_PROXY", "GIN_TYPE_GDAKI", "GIN_TYPE_GPI", "GIN_TYPE_EFA_GDA", "GIN_MAX_TYPES", "GIN_CONNECTION_NONE",
    "GIN_CONNECTION_FULL", "GIN_CONNECTION_RAIL", "GIN_CONNECTION_CUSTOM_STRIDE", "CFT_TEAM_FLAT",
    "CFT_TEAM_HIER_MULTIMEM", "CFT_TEAM_HIER_LSA", "COMM_PROPERTIES_SIZE", "DEV_COMM_REQUIREMENTS_SIZE",
    "CudaDriver", "cuda_driver", "HOST_STREAM_INLINE", "HOST_STREAM_BLOCKING", "HOST_STREAM_HELP",
]

# --- constants -------------------------------------------------------------------------------
SUCCESS: int  # 0
IN_PROGRESS: int  # 7
UNIQUE_ID_BYTES: int  # 128
SPLIT_NOCOLOR: int  # -1
SHRINK_DEFAULT: int  # 0
SHRINK_ABORT: int  # 1
REVOKE_DEFAULT: int  # 0
SUSPEND_MEM: int  # 1
CONFIG_UNDEF_INT: int  # INT_MIN
API_MAGIC: int  # 0xcafebeef
HEADER_VERSION: int  # NCCL_VERSION_CODE of the declared API: 23203 (2.32.3)
CONFIG_SIZE: int  # sizeof(ncclConfig_t) of the declared layout (120 on x86_64)
WIN_DEFAULT: int
WIN_COLL_SYMMETRIC: int
WIN_STRICT_ORDERING: int
WIN_GIN_ONLY: int
WIN_CFT_COUNTED: int
WIN_REQUIRED_ALIGNMENT: int
CTA_POLICY_DEFAULT: int
CTA_POLICY_EFFICIENCY: int
CTA_POLICY_ZERO: int

class Result(IntEnum):
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
    Sum = 0
    Prod = 1
    Max = 2
    Min = 3
    Avg = 4

class ScalarResidence(IntEnum):
    Device = 0
    HostImmediate = 1

class CommMemStat(IntEnum):
    GpuMemSuspend = 0
    GpuMemSuspended = 1
    GpuMemPersist = 2
    GpuMemTotal = 3

#: Every NCCL host function pycoll declares -> the NCCL release that introduced it ("2.27", ...).
#: "2.3" means present in the oldest release checked (2.3.5); "2.31" absent in 2.30.7, present in 2.32.3.
FUNCTIONS: Dict[str, str]
#: Every FUNCTIONS entry -> the Library method that calls it.
WRAPPERS: Dict[str, str]
#: Functions only RCCL exports (ncclAllToAllv, ncclAllReduceWithBias): they make ``kind`` "rccl".
RCCL_FUNCTIONS: Tuple[str, ...]
#: The pycoll host library's extra functions (pycoll_host.h); pycollHostGetVersion makes ``kind`` "host".
HOST_FUNCTIONS: Tuple[str, ...]
HOST_STREAM_INLINE: int
HOST_STREAM_BLOCKING: int
HOST_STREAM_HELP: int

def version_tuple(code: int) -> Tuple[int, int, int]:
    """Decode an NCCL version code (both the <=2.8 and the later encodings)."""

class UniqueId:
    """A 128-byte ncclUniqueId: a value type (bytes, equality, hash, pickle)."""

    # data: None gives zeros; any bytes-like of exactly 128 bytes, else ValueError
    def __init__(self, data: Optional[Union[bytes, bytearray, memoryview]] = None) -> None: ...
    @classmethod
    def from_bytes(cls, data: bytes) -> UniqueId: ...
    def __bytes__(self) -> bytes: ...
    def hex(self) -> str: ...
    def __eq__(self, other: object, /) -> bool: ...
    def __hash__(self) -> int: ...
    def __reduce__(self) -> tuple: ...

class Config:
    """An ncclConfig_t, initialised exactly as NCCL_CONFIG_INITIALIZER; every field exposed.

    Field names are NCCL's. Int fields default to CONFIG_UNDEF_INT, string fields to None.
    """

    size: int
    magic: int
    version: int
    blocking: int
    cgaClusterSize: int
    minCTAs: int
    maxCTAs: int
    netName: Optional[str]
    splitShare: int
    trafficClass: int
    commName: Optional[str]
    collnetEnable: int
    CTAPolicy: int
    shrinkShare: int
    nvlsCTAs: int
    nChannelsPerNetPeer: int
    nvlinkCentricSched: int
    graphUsageMode: int
    numRmaCtx: int
    maxP2pPeers: int
    graphStreamOrdering: int
    launchOrderImplicit: int
    numRmaSig: int
    rmaEagerInit: int
    hostCftMode: int
    nvlsHostMode: int
    FIELDS: Tuple[str, ...]  # every field name, in struct order
    def __init__(self, **fields: object) -> None: ...
    def copy(self) -> Config: ...
    def to_dict(self) -> Dict[str, object]: ...
    def __eq__(self, other: object, /) -> bool: ...  # field-wise; Config objects are not hashable
    def __reduce__(self) -> tuple: ...
    @property
    def address(self) -> int: ...  # address of the underlying ncclConfig_t

class CollConfig:
    """An ncclCollConfig_t (NCCL 2.32 layout), initialised as NCCL_COLLCONFIG_INITIALIZER.

    Passed as ``config=`` to a collective it selects the ``nccl*Config`` variant (NCCL 2.31+;
    NotSupported on older libraries). Int fields default to CONFIG_UNDEF_INT,
    ``forceAlgSelection`` to 1, ``userProfilerTag`` to 0, ``algSelection`` to None, the pointer
    fields (raw addresses) to 0.
    """

    size: int
    magic: int
    version: int
    ext: int
    minCTAs: int
    maxCTAs: int
    nvlsCTAs: int
    cgaClusterSize: int
    algSelection: Optional[str]
    forceAlgSelection: int
    CTAPolicy: int
    userProfilerTag: int
    launchCompletionEvent: int
    FIELDS: Tuple[str, ...]
    def __init__(self, **fields: object) -> None: ...
    def to_dict(self) -> Dict[str, object]: ...
    @property
    def address(self) -> int: ...

class CommSlot:
    """Heap storage for the ncclComm_t written by a (possibly nonblocking) split/shrink/grow.

    ``value`` is 0 until the library has written the new communicator (or for NOCOLOR / excluded).
    The slot stays valid as long as this object lives; when the call returned IN_PROGRESS the
    Library keeps the slot (and shrink's exclude list / grow's id copy) alive until ``value`` has
    been read non-zero, so dropping it early is safe.
    """

    @property
    def value(self) -> int: ...
    @property
    def pending(self) -> bool: ...  # IN_PROGRESS, value 0: an empty slot until the parent is no longer IN_PROGRESS

class Library:
    """One loaded NCCL-ABI shared object and its symbol table (resolved with dlsym)."""

    @property
    def path(self) -> str: ...  # resolved (realpath) path of the loaded object
    @property
    def kind(self) -> str: ...  # "nccl", "rccl" or "host"
    def has(self, function: str) -> bool: ...  # e.g. lib.has("ncclCommShrink"); any symbol name
    @property
    def missing(self) -> List[str]: ...  # declared functions (FUNCTIONS) this library does not export, sorted
    @property
    def version(self) -> int: ...  # ncclGetVersion() at load time
    @property
    def version_tuple(self) -> Tuple[int, int, int]: ...
    @property
    def symbols(self) -> Dict[str, bool]: ...  # every function looked up -> exported
    @property
    def pending_slots(self) -> List[CommSlot]: ...  # IN_PROGRESS split/shrink/grow; grouped inits not yet final
    def __reduce__(self) -> tuple: ...  # pickles as load(path)

    # errors and versions
    def get_version(self) -> int: ...
    def get_error_string(self, result: int) -> str: ...
    def get_last_error(self, comm: int = 0) -> str: ...
    def comm_get_async_error(self, comm: int) -> int: ...  # returns the async result code

    # unique ids and communicator creation
    def get_unique_id(self) -> UniqueId: ...
    def comm_get_unique_id(self, comm: int) -> UniqueId: ...
    def comm_init_rank(self, nranks: int, unique_id: UniqueId, rank: int) -> int: ...
    # ^ blocking; if the library still answers IN_PROGRESS (NCCL_COMM_BLOCKING=0), InProgressError
    #   is raised with the initialising handle in its ``comm`` attribute (``comms`` for comm_init_all).
    #   Every error raised by the comm_init_* methods carries ``comm`` (``comms``): non-zero when
    #   NCCL left a communicator behind, which the caller should comm_abort.
    def comm_init_rank_config(
        self, nranks: int, unique_id: UniqueId, rank: int, config: Optional[Config] = None
    ) -> Tuple[int, int]: ...  # (comm, status)
    def comm_init_rank_scalable(
        self, nranks: int, rank: int, unique_ids: Sequence[UniqueId], config: Optional[Config] = None
    ) -> Tuple[int, int]: ...
    def comm_init_all(self, ndev: int, devlist: Optional[Sequence[int]] = None) -> List[int]: ...
    def comm_split(
        self, comm: int, color: int, key: int, config: Optional[Config] = None
    ) -> Tuple[CommSlot, int]: ...
    def comm_shrink(
        self, comm: int, exclude_ranks: Sequence[int], config: Optional[Config] = None, flags: int = 0
    ) -> Tuple[CommSlot, int]: ...
    def comm_grow(
        self,
        comm: Optional[int],  # the parent on existing ranks (rank=-1); 0 or None on new ranks
        nranks: int,
        unique_id: Optional[UniqueId],
        rank: int,
        config: Optional[Config] = None,
    ) -> Tuple[CommSlot, int]: ...

    # teardown and state
    def comm_finalize(self, comm: int) -> int: ...
    def comm_destroy(self, comm: int) -> int: ...
    def comm_abort(self, comm: int) -> int: ...
    def comm_revoke(self, comm: int, flags: int = 0) -> int: ...
    def comm_suspend(self, comm: int, flags: int = ...) -> int: ...
    def comm_resume(self, comm: int) -> int: ...
    def comm_mem_stats(self, comm: int, stat: int) -> int: ...

    # queries
    def comm_count(self, comm: int) -> int: ...
    def comm_cu_device(self, comm: int) -> int: ...
    def comm_user_rank(self, comm: int) -> int: ...

    # memory, registration, windows
    def mem_alloc(self, size: int) -> int: ...
    def mem_free(self, ptr: int) -> None: ...
    def comm_register(self, comm: int, buff: int, size: int) -> int: ...
    def comm_deregister(self, comm: int, handle: int) -> int: ...
    def comm_window_register(self, comm: int, buff: int, size: int, flags: int = 0) -> Tuple[int, int]: ...
    def comm_window_deregister(self, comm: int, window: int) -> int: ...
    def win_get_user_ptr(self, comm: int, window: int) -> int: ...

    # reduction operators
    def red_op_create_pre_mul_sum(self, scalar: int, datatype: int, residence: int, comm: int) -> int: ...
    def red_op_destroy(self, op: int, comm: int) -> int: ...

    # collectives (buffers are addresses, stream a raw handle; each returns the status).
    # ``config`` (a CollConfig, on every collective but bcast) calls the nccl*Config variant (NCCL 2.31+).
    def all_reduce(self, sendbuff: int, recvbuff: int, count: int, datatype: int, op: int, comm: int,
        stream: int = 0, config: Optional[CollConfig] = None) -> int: ...
    def broadcast(self, sendbuff: int, recvbuff: int, count: int, datatype: int, root: int, comm: int,
        stream: int = 0, config: Optional[CollConfig] = None) -> int: ...
    def bcast(self, buff: int, count: int, datatype: int, root: int, comm: int, stream: int = 0) -> int: ...
    def reduce(self, sendbuff: int, recvbuff: int, count: int, datatype: int, op: int, root: int, comm: int,
        stream: int = 0, config: Optional[CollConfig] = None) -> int: ...
    def all_gather(self, sendbuff: int, recvbuff: int, sendcount: int, datatype: int, comm: int,
        stream: int = 0, config: Optional[CollConfig] = None) -> int: ...
    def reduce_scatter(self, sendbuff: int, recvbuff: int, recvcount: int, datatype: int, op: int, comm: int,
        stream: int = 0, config: Optional[CollConfig] = None) -> int: ...
    def all_to_all(self, sendbuff: int, recvbuff: int, count: int, datatype: int, comm: int,
        stream: int = 0, config: Optional[CollConfig] = None) -> int: ...
    def gather(self, sendbuff: int, recvbuff: int, count: int, datatype: int, root: int, comm: int,
        stream: int = 0, config: Optional[CollConfig] = None) -> int: ...
    def scatter(self, sendbuff: int, recvbuff: int, count: int, datatype: int, root: int, comm: int,
        stream: int = 0, config: Optional[CollConfig] = None) -> int: ...
    def send(self, sendbuff: int, count: int, datatype: int, peer: int, comm: int, stream: int = 0) -> int: ...
    def recv(self, recvbuff: int, count: int, datatype: int, peer: int, comm: int, stream: int = 0) -> int: ...

    # one-sided (windows, NCCL 2.29+)
    def put_signal(
        self, localbuff: int, count: int, datatype: int, peer: int, window: int, offset: int,
        sig_idx: int, ctx: int, flags: int, comm: int, stream: int = 0,
    ) -> int: ...
    def signal(self, peer: int, sig_idx: int, ctx: int, flags: int, comm: int, stream: int = 0) -> int: ...
    def wait_signal(self, descs: Sequence[Tuple[int, int, int, int]], comm: int, stream: int = 0) -> int: ...
    # ^ descs: (op_count, peer, sig_idx, ctx) each

    # encryption (NCCL 2.31+): mode 0 none, 1 pre-shared key
    def set_encryption(self, mode: int, psk: Optional[str] = None) -> int: ...

    # parameters (NCCL 2.30.4+)
    def param_get(self, key: str) -> Optional[str]: ...  # ncclParamGetParameter; None when unknown
    def param_keys(self) -> List[str]: ...  # ncclParamGetAllParameterKeys

    # groups
    def group_start(self) -> int: ...
    def group_end(self) -> int: ...
    def group_simulate_end(self) -> float: ...  # estimated time

    # debug and typed parameters
    def reset_debug_init(self, internal: bool = False) -> None: ...  # ncclResetDebugInit[Internal]
    def param_bind(self, key: str) -> int: ...  # ncclParamBind: a handle for param_read
    def param_read(self, handle: int, kind: str = "i64", max_len: int = 4096) -> Any: ...
    # ^ kind: i8 i16 i32 i64 u8 u16 u32 u64 (int), str (Optional[str]), raw (bytes)
    def param_dump_all(self) -> None: ...  # ncclParamDumpAll

    # device API host functions (nccl_device/host.h; _device.pxi)
    def comm_query_properties(self, comm: int) -> Dict[str, Any]: ...  # ncclCommQueryProperties
    def dev_comm_create(self, comm: int, requirements: Optional[DevCommRequirements] = None) -> DevComm: ...
    def dev_comm_destroy(self, comm: int, dev_comm: DevComm) -> int: ...
    def get_lsa_multimem_device_pointer(self, window: int, offset: int) -> int: ...
    def get_multimem_device_pointer(self, window: int, offset: int, multimem: int) -> int: ...
    def get_lsa_device_pointer(self, window: int, offset: int, lsa_rank: int) -> int: ...
    def get_peer_device_pointer(self, window: int, offset: int, peer: int) -> int: ...
    def get_multimem_device_le_info(self, window: int, offset: int) -> Tuple[int, int]: ...
    def get_cft_device_le_info(self, window: int, offset: int, peer_cft: int,
                               cft_team: Tuple[int, int, int]) -> Tuple[int, int]: ...
    def get_peer_device_le_info(self, window: int, offset: int, peer_world: int) -> Tuple[int, int]: ...
    def team_world(self, comm: int) -> Team: ...
    def team_lsa(self, comm: int) -> Team: ...
    def team_cft(self, comm: int, mode: int = 0) -> Team: ...
    def team_cft_multimem(self, comm: int) -> Team: ...
    def team_rail(self, comm: int) -> Team: ...
    def team_rank_to_world(self, comm: int, team: Tuple[int, int, int], rank: int) -> int: ...
    def team_rank_to_lsa(self, comm: int, team: Tuple[int, int, int], rank: int) -> int: ...
    def lsa_barrier_create_requirement(self, team: Tuple[int, int, int], n_barriers: int) -> DevRequirement: ...
    def gin_barrier_create_requirement(self, comm: int, team: Tuple[int, int, int],
                                       n_barriers: int) -> DevRequirement: ...
    def lla2a_calc_slots(self, max_elts: int, max_elt_size: int) -> int: ...
    def lla2a_create_requirement(self, n_blocks: int, n_slots: int) -> DevRequirement: ...
    def gin_outbox_create_requirement(self, n_blocks: int, size_log2: int) -> DevRequirement: ...
    def gin_inbox_a2a_create_requirement(self, peers: Tuple[int, int, int], n_blocks: int,
                                         size_log2: int) -> DevRequirement: ...

    # HostLibrary's host_* methods are served on any other Library too: they check their
    # arguments, then raise NotSupported.
    def __getattr__(self, name: str) -> Any: ...

class HostLibrary(Library):
    """pycoll's host library (``load("host")``, or any library exporting pycollHostGetVersion)."""
    def host_version(self) -> int: ...
    def host_stream_create(self, flags: int = 0) -> int: ...
    def host_stream_set_flags(self, stream: int, flags: int) -> None: ...
    def host_event_wait(self, event: int, timeout: float, run: bool = ...) -> bool: ...
    def host_event_arm(self, event: int) -> None: ...
    def comm_wait_ready(self, comm: int, timeout: float) -> bool: ...
    def comm_peer_open(self, comm: int, peer: int) -> int: ...
    def comm_peer_process(self, comm: int, peer: int) -> Tuple[int, int, int]: ...  # pid, start, pidns
    def comm_events_clean(self, comm: int, start: int, end: int) -> bool: ...
    def comm_note_failure(self, comm: int, text: str) -> None: ...
    def host_event_fire(self, event: int) -> None: ...
    def host_stream_destroy(self, stream: int) -> None: ...
    def host_stream_synchronize(self, stream: int) -> None: ...
    def host_stream_query(self, stream: int) -> bool: ...  # True when idle
    def host_stream_wait_event(self, stream: int, event: int) -> None: ...
    def host_stream_wait_room(self, stream: int, timeout: float) -> bool: ...
    def host_event_create(self) -> int: ...
    def host_event_destroy(self, event: int) -> None: ...
    def host_event_record(self, event: int, stream: int) -> None: ...
    def host_event_query(self, event: int) -> bool: ...  # True when complete
    def host_event_synchronize(self, event: int) -> None: ...
    def host_event_elapsed_ms(self, start: int, end: int) -> float: ...
    def host_stream_set_legacy(self, stream: int) -> None: ...
    def host_stream_resolve(self, stream: int) -> int: ...
    def host_stream_begin_capture(self, stream: int) -> None: ...
    def host_stream_end_capture(self, stream: int) -> int: ...
    def host_graph_launch(self, graph: int, stream: int) -> None: ...
    def host_graph_destroy(self, graph: int) -> None: ...

# --- device API (_device.pxi) --------------------------------------------------------------------
GIN_TYPE_NONE: int
GIN_TYPE_PROXY: int
GIN_TYPE_GDAKI: int
GIN_TYPE_GPI: int
GIN_TYPE_EFA_GDA: int
GIN_MAX_TYPES: int
GIN_CONNECTION_NONE: int
GIN_CONNECTION_FULL: int
GIN_CONNECTION_RAIL: int
GIN_CONNECTION_CUSTOM_STRIDE: int
CFT_TEAM_FLAT: int
CFT_TEAM_HIER_MULTIMEM: int
CFT_TEAM_HIER_LSA: int
COMM_PROPERTIES_SIZE: int  # sizeof(ncclCommProperties_t): 152 on x86_64
DEV_COMM_REQUIREMENTS_SIZE: int  # sizeof(ncclDevCommRequirements_t): 120 on x86_64

class Team(NamedTuple):
    """ncclTeam_t."""
    n_ranks: int
    rank: int
    stride: int

class DevRequirement:
    """An ncclDevResourceRequirements_t and its handle (from a *_create_requirement method)."""
    @property
    def kind(self) -> str: ...  # lsa_barrier, gin_barrier, lla2a, gin_outbox, gin_inbox_a2a
    @property
    def buffer_size(self) -> int: ...
    @property
    def buffer_align(self) -> int: ...
    @property
    def gin_signal_count(self) -> int: ...
    @property
    def gin_counter_count(self) -> int: ...
    @property
    def address(self) -> int: ...
    @property
    def handle_address(self) -> int: ...
    @property
    def handle(self) -> Dict[str, int]: ...

class DevCommRequirements:
    """An ncclDevCommRequirements_t initialised as NCCL_DEV_COMM_REQUIREMENTS_INITIALIZER."""
    FIELDS: Tuple[str, ...]
    resources: Tuple[DevRequirement, ...]
    def __init__(self, resources: Sequence[DevRequirement] = (), **fields: Any) -> None: ...
    def to_dict(self) -> Dict[str, Any]: ...
    def __getattr__(self, name: str) -> Any: ...

class DevComm:
    """A device communicator (ncclDevComm_t) from Library.dev_comm_create."""
    @property
    def address(self) -> int: ...
    @property
    def size(self) -> int: ...
    @property
    def comm(self) -> int: ...
    @property
    def destroyed(self) -> bool: ...
    def destroy(self) -> int: ...

def load(spec: Optional[str] = None) -> Library:
    """Load (once per resolved path) and return a library.

    ``spec``: a path (anything containing "/"); a bare file name for the dynamic linker's search
    ("libnccl.so.2"); ``"nccl"`` (an already loaded libnccl, e.g. torch's; then the nvidia-nccl
    wheel via cuda.pathfinder or its package directory; then the system's libnccl.so.2);
    ``"rccl"`` (an already loaded librccl; then librccl.so.1; then $ROCM_PATH/lib, /opt/rocm/lib);
    ``"host"`` (libpycoll_host.so next to the module, returned as a HostLibrary); None ->
    ``$PYCOLL_NCCL_LIBRARY`` (any of the above) if set, else ``"nccl"``. Raises
    :class:`pycoll.errors.LibraryError` with the places searched when nothing suitable is found,
    or when the object does not export ``ncclGetVersion``; missing optional functions never fail
    loading (see ``missing``).
    """

def loaded() -> List[Library]:
    """Libraries loaded so far in this process."""

def capture_stack(skip: int, depth: int) -> List[Any]:
    """``[code, f_lasti, ...]`` of up to ``depth`` frames from ``skip`` frames above the calling
    Python frame, innermost first (what a loop over ``sys._getframe`` collecting ``f_code`` and
    ``f_lasti`` gives), read in C; the list is not tracked by the cyclic garbage collector."""

class CudaDriver:
    """The CUDA driver's per-operation functions (event record and query, a stream's capture status, the
    current context's device) as C function pointers, which pycoll's compiled operation path calls
    directly. Each method returns the driver's ``CUresult`` (0: success; 600 from :meth:`query` for an
    event not reached yet); stream 0 is the legacy default stream."""

    @property
    def source(self) -> str: ...
    @staticmethod
    def from_addresses(event_record: int, event_query: int, stream_is_capturing: int, ctx_get_device: int,
                       device_get: int, *, keep: Any = None, source: str = "addresses") -> CudaDriver:
        """A table of the functions at these addresses, of the signatures of ``cuEventRecord``,
        ``cuEventQuery``, ``cuStreamIsCapturing``, ``cuCtxGetDevice`` and ``cuDeviceGet``; ``keep`` is
        held while the table lives. ``ValueError`` for a NULL address."""
    def record(self, event: int, stream: int) -> int: ...
    def query(self, event: int) -> int: ...
    def capture_status(self, stream: int) -> Tuple[int, int]:
        """``(CUresult, status)``: status 0 none, 1 active, 2 invalidated."""
    def current_device(self) -> Tuple[int, int]:
        """``(CUresult, device)`` of the calling thread's current context (201 when it has none)."""
    def device_handle(self, ordinal: int) -> Tuple[int, int]: ...

def cuda_driver() -> Optional[CudaDriver]:
    """This process's :class:`CudaDriver` from ``libcuda.so.1``; None where it cannot be loaded, lacks a
    function or ``cuInit`` fails. Looked for once; never raises."""
