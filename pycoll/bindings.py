"""The low layer, public: thin GIL-free bindings to the NCCL C API (the same objects as
``pycoll._bindings``; the contract is ``pycoll/_bindings/_nccl.pyi``)."""

from ._bindings import *  # noqa: F403 -- the old module path re-exports every binding
from ._bindings._nccl import __all__  # noqa: F401
