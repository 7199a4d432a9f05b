"""Groups: operations issued together between ``ncclGroupStart`` and ``ncclGroupEnd``.

A group is per thread and may hold operations of several communicators of one library. The Works
enqueued inside it get their completion events when the outermost group closes.
"""

from __future__ import annotations

import contextlib
import dataclasses
from typing import TYPE_CHECKING, Any, Iterator, List, Optional

from . import _core
from ._bindings import IN_PROGRESS
from .errors import CommFailure, CommStateError, NCCLError

if TYPE_CHECKING:  # pragma: no cover
    from .work import Work

__all__ = ["open_group", "group", "simulate", "SimulatedGroup"]


def open_group() -> Optional[List[Work]]:
    """The Works of this thread's open group, or None outside a group."""
    return _core.open_group()


@contextlib.contextmanager
def group(comm: Any) -> Iterator[None]:
    """The body of :meth:`pycoll.Communicator.group` (see there)."""
    lib = comm.library
    outer = open_group()
    if outer is not None and _core.group_library() is not lib:
        raise CommStateError("a group can only hold communicators of one library")
    lib.group_start()
    if outer is None:
        _core.set_group([], lib)
    body_exc: Optional[BaseException] = None
    try:
        yield
    except BaseException as exc:
        body_exc = exc
        raise
    finally:
        works: List[Work] = []
        if outer is None:
            works = _core.open_group() or []
            _core.set_group(None, None)
            if works and body_exc is None:
                works[0].comm.prepare_group_end(works)
        status = 0
        try:
            status = lib.group_end()
        except NCCLError as e:
            for w in works:
                w.comm.group_failed(w, e)  # nothing of the group runs: no phantom outstanding work
            if body_exc is None:
                for c in {w.comm for w in works} or {comm}:
                    with contextlib.suppress(CommFailure, NCCLError):
                        c.handle_call_error(e, None)
                raise
            works = []
        if status == IN_PROGRESS:  # nonblocking communicators still issuing: nothing is on the streams yet
            for w in works:
                w.comm.await_ready(w)
        for w in works:
            w.comm.group_closed(w)
        if body_exc is None:
            for w in works:
                if not w.async_op:
                    w.wait()


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
    result = SimulatedGroup()
    lib.group_start()
    _core.set_group([], lib)
    try:
        yield result
    finally:
        works: List[Work] = _core.open_group() or []
        _core.set_group(None, None)
        try:
            result.estimated_time = lib.group_simulate_end()
        finally:
            never = CommStateError("the operation was only simulated (group_simulate): it never ran")
            for w in works:
                w.comm.group_failed(w, never)
