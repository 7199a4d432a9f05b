"""Groups: operations issued together between ``ncclGroupStart`` and ``ncclGroupEnd``.

A group is per thread and may hold operations of several communicators of one library. The Works
enqueued inside it get their completion events when the outermost group closes.
"""

from __future__ import annotations

import contextlib
import dataclasses
from typing import TYPE_CHECKING, Any, Iterator, List, Optional

from . import _bindings as B, _core
from .errors import CommStateError, NotSupported

if TYPE_CHECKING:  # pragma: no cover
    from .work import Work

__all__ = ["open_group", "group", "simulate", "SimulatedGroup"]


def open_group() -> Optional[List[Work]]:
    """The Works of this thread's open group, or None outside a group."""
    return _core.open_group()


def group(comm: Any) -> _core.GroupScope:
    """What :meth:`pycoll.Communicator.group` returns (see there): ``comm``'s group scope, compiled with
    the per-call path (``pycoll._core.GroupScope``)."""
    return comm.group()


@dataclasses.dataclass
class SimulatedGroup:
    """What :func:`simulate` yields: ``estimated_time`` (the library's estimate in microseconds,
    NCCL's unit) once the block has ended; None inside it or when the block raised."""

    estimated_time: Optional[float] = None


@contextlib.contextmanager
def simulate(comm: Any) -> Iterator[SimulatedGroup]:
    """The body of :meth:`pycoll.Communicator.group_simulate`: a group closed with ncclGroupSimulateEnd."""
    lib = comm.library
    if open_group() is not None:
        raise CommStateError("group_simulate() cannot be nested in an open group")
    if not lib.has("ncclGroupSimulateEnd"):  # before the group opens: nothing could close it but a real end
        raise NotSupported("ncclGroupSimulateEnd", B.FUNCTIONS.get("ncclGroupSimulateEnd", ""), lib.path)
    result = SimulatedGroup()
    lib.group_start()
    _core.set_group([], lib)
    ended = False
    try:
        yield result
        ended = True
    finally:
        works: List[Work] = _core.open_group() or []
        _core.set_group(None, None)
        try:
            estimate = lib.group_simulate_end()  # the group is closed either way
            if ended:  # a block that raised simulated only part of what it meant to: no estimate
                result.estimated_time = estimate
        finally:
            never = CommStateError("the operation was only simulated (group_simulate): it never ran")
            for w in works:
                w.comm.group_failed(w, never)
