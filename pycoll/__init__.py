"""pycoll: NCCL/RCCL bindings and a fault-tolerant collective runtime, with a host backend.

The public surface is what ``__all__`` lists; everything else may change. The layers, and where
each lives: ARCHITECTURE.md.
"""

from . import bindings, flight_recorder, watchdog  # noqa: F401  (pycoll.bindings; the old module paths)
from ._bindings import UniqueId
from .collconfig import CollConfig, VendorOption
from .comm import REDUCE_OPS, Communicator, PreMulSum, abort_all
from .config import CommConfig
from .create import BACKENDS, from_handle, get_unique_id, init, init_all, join
from .devices import DeviceError
from .diagnostics import FlightRecorder, Watchdog, dump_flight_recorder, enable_dump_signal
from .elastic import ElasticGroup, Excluded, Transition
from .errors import (
    RESULT_NAMES,
    AsyncCommError,
    CaptureError,
    CommAborted,
    CommFailure,
    CommRevoked,
    CommStateError,
    CommTimeout,
    InProgressError,
    InternalError,
    InvalidArgument,
    InvalidUsage,
    LibraryError,
    NCCLError,
    NCCLSystemError,
    NCCLTimeoutError,
    NotSupported,
    PeerFailure,
    PycollError,
    RankDiscoveryError,
    RemoteError,
    StoreAuthError,
    StoreError,
    StoreLost,
    StoreTimeout,
    UnhandledCudaError,
    WaitTimeout,
    error_class,
)
from .group import SimulatedGroup
from .memory import MemoryStats, SymmetricPool
from .properties import CommProperties
from .store import FileStore, MemoryStore, PrefixStore, Store, TCPStore, TCPStoreServer
from .windows import Registration, Window
from .work import Work

# Importing pycoll has no side effect: the flight recorder and the watchdog are registered with the
# first communicator that pycoll.init() or pycoll.join() builds (pycoll.diagnostics.install).

__version__ = "0.1.0"

__all__ = [
    "__version__",
    "init",
    "join",
    "init_all",
    "from_handle",
    "CommProperties",
    "CollConfig",
    "VendorOption",
    "SimulatedGroup",
    "get_unique_id",
    "BACKENDS",
    "Communicator",
    "DeviceError",
    "abort_all",
    "Work",
    "CommConfig",
    "PreMulSum",
    "Registration",
    "Window",
    "SymmetricPool",
    "MemoryStats",
    "REDUCE_OPS",
    "UniqueId",
    "Store",
    "TCPStore",
    "TCPStoreServer",
    "FileStore",
    "MemoryStore",
    "PrefixStore",
    "FlightRecorder",
    "Watchdog",
    "dump_flight_recorder",
    "enable_dump_signal",
    "ElasticGroup",
    "Excluded",
    "Transition",
    "PycollError",
    "RankDiscoveryError",
    "LibraryError",
    "NotSupported",
    "NCCLError",
    "UnhandledCudaError",
    "NCCLSystemError",
    "InternalError",
    "InvalidArgument",
    "InvalidUsage",
    "RemoteError",
    "InProgressError",
    "NCCLTimeoutError",
    "CommFailure",
    "CommTimeout",
    "CommAborted",
    "CommRevoked",
    "PeerFailure",
    "AsyncCommError",
    "CommStateError",
    "WaitTimeout",
    "CaptureError",
    "StoreError",
    "StoreTimeout",
    "StoreAuthError",
    "StoreLost",
    "error_class",
    "RESULT_NAMES",
]
