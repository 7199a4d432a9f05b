# The classes of pycoll._bindings._nccl, for Cython users who call the resolved function pointers
# directly:
#
#     from pycoll._bindings._nccl cimport Library
#     from pycoll._bindings.libnccl cimport ncclComm_t, ncclResult_t
#     cdef Library lib = pycoll._bindings.load("nccl")
#     if lib.fn.ncclCommRevoke == NULL: ...          # NULL: the library lacks the function
#     with nogil:
#         res = lib.fn.ncclCommRevoke(comm, 0)
#
# A Library is never unloaded once loaded, so the pointers stay valid for the life of the process.

from libc.stdint cimport uintptr_t

from pycoll._bindings.libnccl cimport ncclCollConfig_t, ncclComm_t, ncclConfig_t, ncclUniqueId, pycoll_nccl_table


cdef class UniqueId:
    cdef ncclUniqueId c


cdef class Config:
    cdef ncclConfig_t c
    cdef bytes _net_name
    cdef bytes _comm_name


cdef class CollConfig:
    cdef ncclCollConfig_t c
    cdef bytes _alg_selection


cdef class CommSlot:
    cdef ncclComm_t* ptr           # heap slot the library writes the new communicator into
    cdef int* exclude              # shrink's exclude list (NCCL sorts it in place)
    cdef ncclUniqueId* uid         # grow's unique id
    cdef bint _pending             # the call returned IN_PROGRESS and no value was seen yet
    cdef bint keep_uid
    cdef Library lib
    cdef object config
    cdef uintptr_t parent          # the communicator split or shrunk (0: none)


cdef class _GroupState:
    cdef int depth
    cdef list slots


cdef class Library:
    cdef void* handle
    cdef pycoll_nccl_table fn
    cdef readonly str path
    cdef readonly str kind
    cdef readonly int version
    cdef dict _exported
    cdef set _pending_slots
    cdef object _groups  # threading.local: this thread's _GroupState (group depth, the slots made in its open group)
    cdef unsigned long long _gs_thread  # the thread (its PyThreadState's unique id) whose _GroupState is _gs_last
    cdef _GroupState _gs_last
    cdef object __weakref__

    cdef void* _sym(self, str name)
    cdef _track(self, CommSlot slot, int r)
    cdef _settle_slots(self, uintptr_t comm, int state)
    cdef bint _in_group(self)
    cdef CommSlot _init_slot(self)
    cdef _group_slot(self, CommSlot slot)
    cdef int _group_start(self) except -1
    cdef int _group_end(self) except -1
    cdef _group_closed(self, int r)
    cdef _GroupState _group_state(self)


cdef class HostLibrary(Library):
    pass


# The CUDA driver's per-operation functions (_cuda.pxi): _core calls them directly.

ctypedef int (*cu_event_record_fn)(void* event, void* stream) noexcept nogil
ctypedef int (*cu_event_query_fn)(void* event) noexcept nogil
ctypedef int (*cu_stream_is_capturing_fn)(void* stream, int* status) noexcept nogil
ctypedef int (*cu_ctx_get_device_fn)(int* device) noexcept nogil
ctypedef int (*cu_device_get_fn)(int* device, int ordinal) noexcept nogil


cdef class CudaDriver:
    cdef cu_event_record_fn event_record
    cdef cu_event_query_fn event_query
    cdef cu_stream_is_capturing_fn stream_is_capturing
    cdef cu_ctx_get_device_fn ctx_get_device
    cdef cu_device_get_fn device_get
    cdef readonly str source
    cdef object _keep
