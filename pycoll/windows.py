"""Buffer registrations, windows and one-sided operations of a :class:`~pycoll.Communicator`.

``comm.register(array)`` (``ncclCommRegister``) and ``comm.register_window(array)``
(``ncclCommWindowRegister``, collective) return objects whose lifetime the communicator tracks:
released by ``close()`` (a second ``close()`` is a no-op), by leaving their ``with`` block, or when
the communicator is destroyed or aborted. A released object refuses every use with
:class:`pycoll.errors.CommStateError`. Each keeps its array alive while registered.

``comm.put_signal``, ``comm.signal`` and ``comm.wait_signal`` (``ncclPutSignal``, ``ncclSignal``,
``ncclWaitSignal``) are stream operations issued through the communicator's one launch path: each
returns a :class:`~pycoll.Work` with a deadline, is watched by the watchdog and recorded by the
flight recorder like a collective.

On the host backend a window must lie in memory from ``ncclMemAlloc`` (``comm.mem_alloc`` or a
:class:`pycoll.SymmetricPool`), which is shared memory the peers map; every rank must register
the same size. Deregistration is local there (the peers' mappings keep the memory alive on their
side).
"""

from __future__ import annotations

import logging
import time
import weakref
from typing import Any, List, Optional, Sequence, SupportsIndex, Tuple, Union

from . import _bindings as B, _core, _settings
from ._settings import Seconds
from .buffers import Buffer, as_buffer, check_device, integer
from .errors import CommStateError, InvalidArgument, NCCLError, NotSupported

__all__ = ["Registration", "Window", "SignalWait"]

_log = logging.getLogger("pycoll.windows")

SignalWait = Tuple[int, int, int, int]  # (peer, count, sig_idx, ctx)


def _resources(comm: Any) -> List[Any]:
    return comm._resources


def _local_buffer(comm: Any, array: Any, what: str, writable: bool = True) -> Buffer:
    buf = as_buffer(array, writable=writable, name=what)
    check_device(buf, comm.backend, None if comm.backend == "host" else comm.device.device_id)
    if buf.nbytes == 0:
        raise ValueError(f"{what}: cannot register an empty array")
    return buf


class _Tracked:
    """A library object of one communicator: released once, by close() or by the communicator."""

    kind = "resource"

    def __init__(self, comm: Any, handle: int, buf: Buffer, array: Any) -> None:
        self.comm = comm
        self._handle: Optional[int] = handle
        self._why = ""
        self.ptr = buf.ptr
        self.nbytes = buf.nbytes
        self._array = array  # kept alive while registered

    @property
    def closed(self) -> bool:
        """True once released."""
        return self._handle is None

    @property
    def handle(self) -> int:
        """The library handle (raises :class:`CommStateError` once released)."""
        if self._handle is None:
            raise CommStateError(f"this {self.kind} of communicator {self.comm.name!r} was released{self._why}; "
                                 f"register the buffer again")
        return self._handle

    def close(self) -> None:
        """Release it (local). A second call is a no-op."""
        if self._handle is None:
            return
        busy = self._busy()
        if busy is not None:  # its memory would be unmapped under the copy: a crash, not an error
            raise CommStateError(
                f"this {self.kind} of communicator {self.comm.name!r} is still used by {busy.op} "
                f"({_core.seq_text(busy)}, {busy.last_state}): " + (
                    "wait for it before closing the " + self.kind if busy.error is None else
                    "it failed, but the communicator (on_failure='report') still has it queued: abort or destroy the "
                    "communicator to release the " + self.kind))
        h, self._handle = self._handle, None
        self._why = " (close())"
        if self in _resources(self.comm):
            _resources(self.comm).remove(self)
        self._array = None
        if self.comm._handle is not None:
            with self.comm._lock:
                self._free(self.comm._handle, h)

    def _free(self, comm_handle: int, h: int) -> None:
        raise NotImplementedError

    def _busy(self) -> Optional[Any]:
        """An operation that still uses it (close() refuses then), or None."""
        return None

    def _forget(self, why: str) -> None:
        """The communicator released it (destroy: freed by the library already or now; abort: gone)."""
        h, self._handle = self._handle, None
        self._why = why
        self._array = None
        if h is not None and self.comm._handle is not None and why == " (communicator destroyed)":
            try:
                self._free(self.comm._handle, h)
            except NCCLError:
                _log.debug("releasing %r at destroy", self, exc_info=True)

    def __enter__(self) -> Any:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def __repr__(self) -> str:
        state = "released" if self._handle is None else "live"
        return f"<{type(self).__name__} {self.nbytes} bytes at {self.ptr:#x} of {self.comm.name!r} {state}>"


class Registration(_Tracked):
    """A buffer registered with ``ncclCommRegister`` for zero-copy operations (local)."""

    kind = "registration"

    def _free(self, comm_handle: int, h: int) -> None:
        self.comm.library.comm_deregister(comm_handle, h)


def register(comm: Any, array: Any) -> Registration:
    """``ncclCommRegister`` of ``array`` (contiguous, on the communicator's device)."""
    comm._check_usable("register")
    buf = _local_buffer(comm, array, "register", writable=False)  # a registration writes nothing: a send buffer
    with comm._lock:
        h = comm.library.comm_register(comm.handle, buf.ptr, buf.nbytes)
    reg = Registration(comm, h, buf, array)
    _resources(comm).append(reg)
    return reg


class Window(_Tracked):
    """A window registered with ``ncclCommWindowRegister`` (collective): the target of one-sided
    :meth:`~pycoll.Communicator.put_signal`. ``flags`` are ``pycoll.bindings.WIN_*``."""

    kind = "window"

    def __init__(self, comm: Any, handle: int, buf: Buffer, array: Any, flags: int) -> None:
        super().__init__(comm, handle, buf, array)
        self._puts: weakref.WeakSet[Any] = weakref.WeakSet()  # its put_signal operations not known complete
        self.flags = flags

    def _busy(self) -> Optional[Any]:
        for w in list(self._puts):
            # done: completed, or failed with its communicator stopped; one that failed under on_failure="report"
            # stays queued in the library, and runs if its wait ever ends
            if w.is_completed() and (w.error is None or self.comm.state != "active"):
                self._puts.discard(w)
            else:
                return w
        return None

    def _free(self, comm_handle: int, h: int) -> None:
        self.comm.library.comm_window_deregister(comm_handle, h)

    @property
    def user_ptr(self) -> int:
        """The address this rank registered (``ncclWinGetUserPtr``)."""
        with self.comm._lock:
            h = self.handle  # a released window says so first, as its other methods do (not the comm's abort)
            return int(self.comm.library.win_get_user_ptr(self.comm.handle, h))

    def peer_pointer(self, peer: int, offset: int = 0) -> int:
        """The address of ``peer``'s window (plus ``offset`` bytes) as this process reaches it
        (``ncclGetPeerDevicePointer``; on the host backend a mapping of the peer's shared memory)."""
        peer = self.comm._root(peer, "peer")
        return int(self.comm.library.get_peer_device_pointer(self.handle, offset, peer))

    def lsa_pointer(self, lsa_rank: int, offset: int = 0) -> int:
        """The address of LSA rank ``lsa_rank``'s window (``ncclGetLsaDevicePointer``)."""
        return int(self.comm.library.get_lsa_device_pointer(self.handle, offset, lsa_rank))

    def multimem_pointer(self, offset: int = 0) -> int:
        """The multicast address of the window over the LSA team (``ncclGetLsaMultimemDevicePointer``;
        NVLS GPUs only: the host library refuses with InvalidUsage)."""
        return int(self.comm.library.get_lsa_multimem_device_pointer(self.handle, offset))

    def le_info(self, peer: Optional[int] = None, offset: int = 0) -> Any:
        """The load/store-engine info of the window at ``offset`` (``ncclGetMultimemDeviceLeInfo``,
        or ``ncclGetPeerDeviceLeInfo`` for world rank ``peer``; CFT hardware only: the host library
        refuses with InvalidUsage)."""
        lib = self.comm.library
        if peer is None:
            return lib.get_multimem_device_le_info(self.handle, offset)
        return lib.get_peer_device_le_info(self.handle, offset, self.comm._root(peer, "peer"))

    def check_span(self, offset: Any, nbytes: int) -> int:
        """``offset`` as an int (:func:`~pycoll.buffers.integer`); ValueError unless ``nbytes`` at it fit in the
        window."""
        offset = integer(offset, "offset", "an int >= 0", 0)
        if offset + nbytes > self.nbytes:
            raise ValueError(f"{nbytes} bytes at offset {offset} do not fit in the {self.nbytes}-byte window")
        return offset


def register_window(comm: Any, array: Any, flags: int = 0, timeout: Optional[Seconds] = None) -> Window:
    """``ncclCommWindowRegister`` (collective: every rank, the same size), polled within ``timeout``."""
    comm._check_usable("register_window")
    # collective, ordered with the operations: refused where another thread has the communicator, but it takes none
    # (init_all's blocking communicators register from one thread each, then one thread issues their group)
    comm.check_thread("register_window")
    if isinstance(flags, bool) or not isinstance(flags, int) or flags < 0:
        raise ValueError(f"flags must be a combination of pycoll.bindings.WIN_* flags, got {flags!r}")
    timeout = comm.timeout if timeout is None else _settings.seconds(timeout, "register_window: timeout")
    buf = _local_buffer(comm, array, "register_window")
    lib, h = comm.library, comm.handle
    previous = comm.device.swap_current() if comm._guard_device else None
    try:
        with comm._lock:  # bounded by timeout on a blocking communicator too (its call returns once every rank came)
            win, status = comm._bounded(lambda: lib.comm_window_register(h, buf.ptr, buf.nbytes, flags),
                                        "ncclCommWindowRegister", "register_window", time.monotonic() + timeout,
                                        timeout, "the other ranks did not register their windows")
        if status == B.IN_PROGRESS:
            comm._poll(comm.handle, "ncclCommWindowRegister", timeout, comm._abort)
    finally:
        if previous is not None:
            comm.device.restore_current(previous)
    if not win:
        raise NotSupported("ncclCommWindowRegister", "2.27", lib.path,
                           "the library filled the window handle after the call returned (nonblocking); "
                           "pycoll cannot read it yet")
    try:
        if lib.has("ncclWinGetUserPtr"):  # NCCL 2.29+; older libraries report a refusal from the register itself
            with comm._lock:
                lib.win_get_user_ptr(comm.handle, win)  # the exchange's verdict (the same on every rank)
    except InvalidArgument as e:
        with comm._lock:
            lib.comm_window_deregister(comm.handle, win)
        hint = (" -- on the host backend a window must lie in comm.mem_alloc()/pycoll.SymmetricPool memory"
                if "ncclMemAlloc" in str(e) else "")
        raise InvalidArgument(e.code, "ncclCommWindowRegister", e.error_string, f"{e.last_error}{hint}",
                              lib.path) from None
    w = Window(comm, win, buf, array, flags)
    _resources(comm).append(w)
    return w


def release_all(comm: Any, why: str) -> None:
    """Release every registration and window of ``comm`` (its destroy or abort)."""
    items, comm._resources = list(comm._resources), []
    for r in reversed(items):
        r._forget(why)


# -- one-sided operations ----------------------------------------------------------------------


def _window(comm: Any, window: Any) -> Window:
    if not isinstance(window, Window):
        raise TypeError(f"window must be a pycoll Window (comm.register_window), got {type(window).__name__}")
    if window.comm is not comm:
        raise ValueError(f"this window belongs to communicator {window.comm.name!r}, not {comm.name!r}")
    _ = window.handle  # raises once released
    return window


_INT_MAX = 2**31 - 1  # the C int the library takes


def _sig(value: Any, what: str) -> int:
    """An int in [0, 2**31 - 1] (any integer :func:`~pycoll.buffers.integer` takes): TypeError for another type,
    ValueError out of that range."""
    v = integer(value, what, "an int >= 0", 0)
    if v > _INT_MAX:
        raise ValueError(f"{what} must be at most {_INT_MAX} (a C int), got {v}")
    return v


def put_signal(comm: Any, window: Window, offset: SupportsIndex, src: Any, peer: SupportsIndex, *, sig_idx: int = 0,
               ctx: int = 0,
               stream: Any = None, async_op: bool = False, timeout: Optional[Seconds] = None) -> Any:
    """Copy ``src`` into ``peer``'s part of ``window`` at byte ``offset``, then signal ``peer``
    on (``sig_idx``, ``ctx``) (``ncclPutSignal``). The peer sees the data once its
    :func:`wait_signal` for this signal returns."""
    win = _window(comm, window)
    peer = comm._root(peer, "peer")
    si, cx = _sig(sig_idx, "sig_idx"), _sig(ctx, "ctx")
    st = comm._begin("put_signal", stream, async_op, (src,))
    buf = comm._buf(src, st, writable=False, name="src")
    offset = win.check_span(offset, buf.nbytes)
    lib, h_win = comm.library, win.handle
    w = comm._launch("put_signal", lambda h, s: lib.put_signal(buf.ptr, buf.count, buf.datatype, peer, h_win,
                                                               offset, si, cx, 0, h, s),
                     st, [buf], [], async_op, timeout, peer=peer)
    if w.last_state != "completed":  # the window may not be closed under it (as last seen: no event queried here)
        win._puts.add(w)
    return w


def signal(comm: Any, peer: int, *, sig_idx: int = 0, ctx: int = 0, stream: Any = None, async_op: bool = False,
           timeout: Optional[Seconds] = None) -> Any:
    """Signal ``peer`` on (``sig_idx``, ``ctx``) without data (``ncclSignal``)."""
    peer = comm._root(peer, "peer")
    si, cx = _sig(sig_idx, "sig_idx"), _sig(ctx, "ctx")
    st = comm._begin("signal", stream, async_op, ())
    lib = comm.library
    return comm._launch("signal", lambda h, s: lib.signal(peer, si, cx, 0, h, s), st, [], [], async_op, timeout,
                        peer=peer)


def wait_signal(comm: Any, peer: Union[int, Sequence[SignalWait]], count: int = 1, *, sig_idx: int = 0,
                ctx: int = 0, stream: Any = None, async_op: bool = False, timeout: Optional[Seconds] = None) -> Any:
    """Wait until ``peer`` has sent ``count`` more signals on (``sig_idx``, ``ctx``) (``ncclWaitSignal``).

    ``peer`` may instead be a sequence of ``(peer, count, sig_idx, ctx)`` to wait for several at
    once. Signals are counted: each wait consumes the ones it waited for. The deadline is the
    operation's ``timeout``, enforced by the watchdog like any collective's.
    """
    one: Any = peer
    # one peer: an int, numpy's, a 0-d tensor (a bool is refused below); an array of rows has __index__ too
    if hasattr(type(one), "__index__") and not getattr(one, "ndim", 0):
        rows: List[SignalWait] = [(one, count, sig_idx, ctx)]
    elif (count, sig_idx, ctx) != (1, 0, 0):
        raise ValueError("wait_signal: count, sig_idx and ctx are given in each (peer, count, sig_idx, ctx) row of a "
                         "sequence, not as keywords beside it")
    else:
        try:
            rows = [(a, b, c, d) for a, b, c, d in one]
        except (TypeError, ValueError):
            rows = []
        if not rows:
            raise ValueError("wait_signal: pass a peer, or a non-empty sequence of (peer, count, sig_idx, ctx)")
    descs = [(_sig(n, "count"), comm._root(p, "peer"), _sig(s, "sig_idx"), _sig(c, "ctx")) for p, n, s, c in rows]
    st = comm._begin("wait_signal", stream, async_op, ())
    lib = comm.library
    peers = tuple(sorted({d[1] for d in descs}))
    return comm._launch("wait_signal", lambda h, s: lib.wait_signal(descs, h, s), st, [], [], async_op, timeout,
                        peer=descs[0][1], peers=peers if len(peers) > 1 else None)
