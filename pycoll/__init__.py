"""pycoll: NCCL/RCCL bindings and a fault-tolerant collective runtime, with a host backend."""

from .errors import *  # noqa: F401,F403
from .errors import __all__ as _errors_all

__version__ = "0.1.0"

__all__ = ["__version__"] + list(_errors_all)
