"""Adopting a communicator made elsewhere: the body of :meth:`pycoll.Communicator.from_handle`.

The handle may come from the user's C code (an int), from nccl4py (its ``Communicator.ptr``), from
torch's ProcessGroupNCCL (``_comm_ptr()``) or from another pycoll Communicator (``handle``). The
library is asked who the communicator is (ncclCommUserRank, ncclCommCount, ncclCommCuDevice,
and ncclCommQueryProperties for a rank-independent id), so a null, destroyed or foreign handle
is refused with a clear error before anything is built on it.
"""

from __future__ import annotations

import os
from typing import Any, Optional

from . import _bindings as B, _settings, hooks
from ._settings import Seconds
from .devices import Device, open_device
from .errors import NCCLError, NotSupported

__all__ = ["handle_of", "from_handle"]


def handle_of(obj: Any) -> int:
    """The ``ncclComm_t`` address behind ``obj``: an int, an object with an int ``ptr`` (nccl4py's
    Communicator) or ``handle`` (pycoll's), or with ``_comm_ptr()`` (torch's ProcessGroupNCCL)."""
    value = obj
    if not isinstance(obj, int):
        if callable(getattr(obj, "_comm_ptr", None)):
            value = obj._comm_ptr()
        elif hasattr(obj, "ptr"):
            value = obj.ptr
        elif hasattr(obj, "handle"):
            value = obj.handle
        else:
            raise TypeError(f"handle must be an int ncclComm_t address or an object with .ptr, .handle or "
                            f"._comm_ptr(), not {type(obj).__name__}")
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"the communicator handle must be an int, got {type(value).__name__}")
    if value == 0:
        raise ValueError("the communicator handle is NULL (0)")
    if value < 0 or value >= 1 << 64:
        raise ValueError(f"the communicator handle {value} is not an address")
    return value


def _readable(address: int, length: int = 64) -> bool:
    """Whether ``[address, address + length)`` lies in one readable mapping of this process
    (/proc/self/maps; True where that file cannot be read)."""
    try:
        with open("/proc/self/maps") as f:
            for line in f:
                span, perms = line.split(None, 2)[:2]
                lo, hi = (int(x, 16) for x in span.split("-"))
                if lo <= address and address + length <= hi:
                    return perms.startswith("r")
    except OSError:
        return True
    return False


def _library(library: Any) -> Any:
    if library is None:
        return B.load(None)
    if isinstance(library, B.Library):
        return library
    if isinstance(library, str):
        return B.load(library)
    raise TypeError(f"library must be a pycoll Library, a load() spec or None, not {type(library).__name__}")


def from_handle(cls: Any, handle: Any, *, owned: bool = False, library: Any = None, device: Optional[Device] = None,
                name: Optional[str] = None, uid: Optional[str] = None, timeout: Seconds,
                on_failure: str = "abort", store: Any = None) -> Any:
    """Build a ``cls`` (Communicator) on an existing handle; see Communicator.from_handle."""
    _settings.check_all()  # as init: a bad value read only later (an abort's bound) is named now
    h = handle_of(handle)
    if not isinstance(owned, bool):
        raise TypeError(f"owned must be a bool, not {type(owned).__name__}")
    # as init does: a bad timeout made the first operation time out at once and abort the maker's handle
    timeout = _settings.seconds(timeout, "timeout")
    for what, value in (("name", name), ("uid", uid)):
        _settings.text(value, what, none_ok=True)
    lib = _library(library)
    if lib.kind != "host" and not _readable(h):
        # NCCL reads the communicator's magic words to check a handle: never let it touch unmapped memory
        raise ValueError(f"handle {h:#x} does not point into readable memory: not a communicator")
    try:
        rank = lib.comm_user_rank(h)
        size = lib.comm_count(h)
        dev_id = lib.comm_cu_device(h)
    except NCCLError as e:
        raise ValueError(f"handle {h:#x} is not a live communicator of {lib.path} (destroyed, aborted, still "
                         f"initialising, or made by another library): {e}") from e
    for other in hooks.live_communicators():
        if other.library is lib and not other.closed and other.handle == h:
            raise ValueError(f"handle {h:#x} is already wrapped by communicator {other.name!r}; use that one")
    comm_hash = None
    try:
        comm_hash = lib.comm_query_properties(h)["commHash"]
    except (NotSupported, NCCLError):
        pass  # before NCCL 2.29: the caller's uid (or the name) identifies it across ranks
    tag = f"{comm_hash:016x}" if comm_hash is not None else f"{h:x}-{os.getpid()}"
    owns_device = device is None
    if device is None:
        backend = lib.kind if lib.kind in ("host", "nccl", "rccl") else "nccl"
        device = open_device(backend, library=lib) if backend == "host" else open_device(backend, device_id=dev_id)
    elif not isinstance(device, Device):
        raise TypeError(f"device must be a pycoll Device or None, not {type(device).__name__}")
    return cls(h, library=lib, device=device, rank=rank, size=size, name=name or f"adopted-{tag}",
               uid=uid or f"adopted-{tag}", global_ranks=None,
               timeout=timeout, on_failure=on_failure, store=store,
               owns_device=owns_device, owns_handle=owned)
