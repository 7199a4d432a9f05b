"""pycoll: NCCL/RCCL bindings and a fault-tolerant collective runtime, with a host backend.

The public surface is what ``__all__`` lists; everything else may change.
"""

from ._bindings import UniqueId
from .comm import Communicator, PreMulSum, REDUCE_OPS
from .config import CommConfig
from .create import BACKENDS, get_unique_id, init, join
from .errors import *  # noqa: F401,F403
from .errors import __all__ as _errors_all
from .store import FileStore, MemoryStore, PrefixStore, Store, TCPStore, TCPStoreServer
from .work import Work
from .elastic import ElasticGroup, Excluded, Transition
from .flight_recorder import FlightRecorder, dump_flight_recorder
from .watchdog import Watchdog, enable_dump_signal
from . import watchdog as _watchdog

_watchdog.install()  # every communicator is recorded and watched

__version__ = "0.1.0"

__all__ = [
    "__version__",
    "init",
    "join",
    "get_unique_id",
    "BACKENDS",
    "Communicator",
    "Work",
    "CommConfig",
    "PreMulSum",
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
] + list(_errors_all)
