# cython: language_level=3
"""Thin, GIL-free bindings to the NCCL C API, loaded at run time (the contract is _nccl.pyi).

One :class:`Library` per loaded shared object (libnccl, librccl, pycoll's host library, or any
object exporting the NCCL C ABI); several can be loaded in one process at once. Nothing is linked:
symbols are resolved with ``dlopen(RTLD_NOW | RTLD_LOCAL)`` / ``dlsym`` into a table, and a
function the library lacks raises :class:`pycoll.errors.NotSupported` when called.

This file is the one extension module; each concept is one included .pxi: _constants (constants,
enums, the declared functions), _convert (argument checks), _values (UniqueId, Config, CollConfig,
CommSlot), _errors (result codes -> exceptions), _library (Library), _host (HostLibrary), _device (the
device-API host functions, bound as Library methods), _load (dlopen, the dlsym table, load()) and _cuda (the
CUDA driver functions of an operation's path, CudaDriver). Where load() looks is the pure-Python _locate.py.
"""

import logging
import os
import struct
import sys
import threading
from enum import IntEnum

from cpython.bytes cimport PyBytes_AS_STRING, PyBytes_FromStringAndSize
from cpython.long cimport PyLong_AsLongLongAndOverflow
from cpython.number cimport PyNumber_Index
from cpython.pystate cimport PyThreadState, PyThreadState_Get
from libc.limits cimport INT_MAX, INT_MIN, UINT_MAX
from libc.stdint cimport uint64_t, uintptr_t
from libc.stdlib cimport calloc, free
from libc.string cimport memcpy, memset, strlen, strncpy
from posix.dlfcn cimport RTLD_LOCAL, RTLD_NOW, dlclose, dlerror, dlopen, dlsym

from pycoll._bindings.libnccl cimport *

from pycoll import _settings
from pycoll import errors as _errors
from pycoll._bindings import _locate
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

cdef extern from "Python.h":
    unsigned long long PyThreadState_GetID(PyThreadState* tstate)  # never the same for two threads (Python 3.9+)

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
    "CollConfig", "CommSlot", "Library", "HostLibrary", "load", "loaded", "capture_stack", "WRAPPERS", "Team", "DevRequirement",
    "DevCommRequirements", "DevComm", "GIN_TYPE_NONE", "GIN_TYPE_PROXY", "GIN_TYPE_GDAKI", "GIN_TYPE_GPI",
    "GIN_TYPE_EFA_GDA", "GIN_MAX_TYPES", "GIN_CONNECTION_NONE", "GIN_CONNECTION_FULL", "GIN_CONNECTION_RAIL",
    "GIN_CONNECTION_CUSTOM_STRIDE", "CFT_TEAM_FLAT", "CFT_TEAM_HIER_MULTIMEM", "CFT_TEAM_HIER_LSA",
    "COMM_PROPERTIES_SIZE", "DEV_COMM_REQUIREMENTS_SIZE", "CudaDriver", "cuda_driver", "HOST_STREAM_INLINE",
    "HOST_STREAM_BLOCKING", "HOST_STREAM_HELP",
]

include "_constants.pxi"
include "_convert.pxi"
include "_values.pxi"
include "_errors.pxi"
include "_library.pxi"
include "_host.pxi"
include "_device.pxi"
include "_load.pxi"
include "_cuda.pxi"
include "_frames.pxi"
