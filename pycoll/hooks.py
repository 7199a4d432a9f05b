"""The seam between the core and what observes it: views, observers, the live registry.

The core (:class:`~pycoll.Communicator`, :class:`~pycoll.Work`) publishes what the diagnostics
(flight recorder, watchdog) and the elastic layer may see of it through the read-only views
:class:`CommView` and :class:`WorkView`, plus a few public actions (``check``, ``try_refresh``,
``fail``, ``revoke``, ``abort``). Observers register here and hear every communicator's events. The
initialisations being waited for register here too, so that SIGTERM's handler (the diagnostics) can abort them.
This module is a leaf: it imports nothing of pycoll, so every layer may depend on it.
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import os
import threading
import warnings
import weakref
from typing import TYPE_CHECKING, Any, Callable, Dict, Iterator, List, NamedTuple, Optional, Protocol, Sequence, Tuple

if TYPE_CHECKING:  # pragma: no cover
    from .comm import Communicator

__all__ = [
    "Progress",
    "WorkView",
    "op_text",
    "group_mates",
    "CommView",
    "CommObserver",
    "add_observer",
    "remove_observer",
    "observers",
    "live_communicators",
]

_log = logging.getLogger("pycoll.hooks")


class Progress(NamedTuple):
    """A communicator's progress: the last sequence id enqueued, started and completed (0: none yet).

    Collectives and point-to-point operations count separately, as PyTorch's flight recorder does.
    """

    coll_enqueued: int = 0
    coll_started: int = 0
    coll_completed: int = 0
    p2p_enqueued: int = 0
    p2p_started: int = 0
    p2p_completed: int = 0

    def as_dict(self) -> Dict[str, int]:
        """The fields as a plain dict (the form dumps and store records hold)."""
        return dict(self._asdict())

    @classmethod
    def of(cls, coll_enqueued: int, p2p_enqueued: int, outstanding: Sequence[WorkView]) -> Progress:
        """The progress of a communicator that issued that many operations and has ``outstanding`` ones. Those
        waiting in a ``group()`` that has not ended are not enqueued yet: the group issues them as it ends."""
        vals: List[int] = []
        for last, p2p in ((coll_enqueued, False), (p2p_enqueued, True)):
            held = [w.p2p_seq if p2p else w.seq for w in outstanding if w.is_p2p == p2p and w.grouped]
            if held:
                last = min(last, min(held) - 1)
            mine = [(w.p2p_seq if p2p else w.seq, w.last_state) for w in outstanding
                    if w.is_p2p == p2p and w.last_state != "completed" and not w.grouped]
            completed = min(seq for seq, _ in mine) - 1 if mine else last
            started = max((seq for seq, st in mine if st == "started"), default=completed)
            vals += [last, started, completed]
        return cls(*vals)


class WorkView(Protocol):
    """What observers may read of one operation (:class:`pycoll.Work` implements it).

    Reading never calls into the library: ``last_state`` is the state as last observed.
    """

    op: str
    seq: int
    p2p_seq: int
    op_id: int
    is_p2p: bool
    peer: Optional[int]
    peers: Optional[Tuple[int, ...]]  # every peer of a one-sided wait for several (wait_signal's rows); else None
    timeout: float
    async_op: bool
    stream: Any  # the stream it runs on (a raw handle)
    t0: float  # time.monotonic() at its issue: its enqueue, or the end of the group() that held it
    grouped: bool  # it waits in a group() that has not ended (not issued yet)
    time_created_ns: int
    time_started_ns: Optional[int]
    time_completed_ns: Optional[int]
    duration_ms: Optional[float]
    inputs: List[Any]
    outputs: List[Any]
    fr_entry: Any  # the flight recorder's entry (owned by the recorder; reused once its ring wraps)
    fr_pos: int  # the position the entry was written for (-1: none)
    capture_id: Optional[int]  # the CUDA graph capture it was recorded into (then it runs at replay)

    @property
    def comm(self) -> CommView: ...

    @property
    def last_state(self) -> str: ...

    @property
    def error(self) -> Optional[BaseException]: ...

    @property
    def deadline(self) -> float: ...

    def release_arrays(self) -> None: ...


def op_text(w: WorkView) -> str:
    """An operation as reports name it: ``all_reduce #3``, ``send #2 with peer 1``, ``wait_signal #4 with peers 1,
    2``."""
    if w.is_p2p:
        if w.peers:
            return f"{w.op} #{w.p2p_seq} with peers {', '.join(map(str, w.peers))}"
        return f"{w.op} #{w.p2p_seq}" + (f" with peer {w.peer}" if w.peer is not None else "")
    return f"{w.op} #{w.seq}"


def group_mates(outstanding: Sequence[WorkView], w: WorkView) -> List[WorkView]:
    """The operations of ``outstanding`` that complete with ``w`` (of one group, sharing its events: which of them
    the group waits for, its completion cannot say), ``w`` among them, in issue order."""
    same = getattr(w, "completes_with", None)
    return [x for x in outstanding if x is w or (same is not None and same(x))] or [w]


#: Work -> the operations of other communicators in its group (see note_cross_group)
_cross_groups: weakref.WeakKeyDictionary[Any, Tuple[str, ...]] = weakref.WeakKeyDictionary()


def note_cross_group(works: Sequence[WorkView]) -> None:
    """A group that ends now holds operations of several communicators (``works``): the library ends it as one, so
    an operation of it may wait for another communicator's (a report of its timeout names them: its own peers may
    all be there). Called where the group ends; keeps only text, so nothing of the group stays alive."""
    for w in works:
        _cross_groups[w] = tuple(f"{op_text(x)} on {getattr(x.comm, 'name', '?')!r}" for x in works
                                 if x.comm is not w.comm)


def cross_group(w: WorkView) -> Tuple[str, ...]:
    """The operations of other communicators ``w``'s group held (``note_cross_group``), or ()."""
    try:
        return _cross_groups.get(w, ())
    except TypeError:  # not weak-referenceable: no Work
        return ()


class CommView(Protocol):
    """What observers may read of a communicator, and the actions they may take on it.

    :class:`pycoll.Communicator` implements it; test fakes implement the same.
    """

    name: str
    uid: str
    backend: str
    library: Any
    device: Any  # its pycoll.devices.Device (the watchdog makes it current in its own thread)

    @property
    def timeout(self) -> float: ...

    @property
    def rank(self) -> int: ...

    @property
    def size(self) -> int: ...

    @property
    def global_rank(self) -> int: ...

    @property
    def global_ranks(self) -> Optional[Tuple[int, ...]]: ...

    @property
    def generation(self) -> int: ...

    @property
    def store(self) -> Any: ...

    @property
    def on_failure(self) -> str: ...

    @property
    def state(self) -> str: ...

    @property
    def failure(self) -> Optional[BaseException]: ...

    @property
    def ops_issued(self) -> int: ...

    @property
    def busy_thread(self) -> Optional[int]: ...

    def progress(self) -> Progress: ...

    def outstanding(self) -> Sequence[WorkView]: ...

    def next_deadline(self) -> Optional[float]: ...

    def check(self, now: Optional[float] = None) -> None: ...

    def try_refresh(self, w: Any, /) -> None: ...

    def open_with(self, peer: int, /) -> Optional[int]: ...

    def peer_process(self, peer: int, /) -> Optional[Tuple[int, int, int]]: ...

    def fail(self, exc: BaseException, work: Any = None) -> None: ...

    def revoke(self) -> None: ...

    def abort(self) -> None: ...


class CommObserver:
    """Base class of what hears every communicator's events (the flight recorder, the watchdog).

    Every method is called in the thread that caused the event and must return quickly; an
    exception is logged and never breaks the operation. ``work_enqueued`` and ``work_completed``
    sit on every operation's path.
    """

    #: True when this observer logs a communicator's failure itself (the communicator then does not)
    reports_failures: bool = False
    #: True for an observer that keeps its entry in each operation (``Work.fr_entry``): one per process
    keeps_work_entries: bool = False

    def comm_created(self, comm: CommView) -> None:
        """A communicator was built (complete: generation, members and store are final)."""

    def work_enqueued(self, work: WorkView) -> None:
        """An operation is about to be handed to the library (called before the library call)."""

    def work_completed(self, work: WorkView) -> None:
        """An operation completed successfully (its times are final)."""

    def work_withdrawn(self, work: WorkView) -> None:
        """An operation enqueued but never run: its group was dropped or refused by the library (``work.error``
        says why); the communicator goes on."""

    def comm_failed(self, comm: CommView, exc: BaseException, work: Optional[WorkView]) -> None:
        """The communicator failed (``work``: the operation it failed in); called before the policy acts."""

    def comm_closed(self, comm: CommView) -> None:
        """The communicator was destroyed or aborted."""

    def peer_unable(self, comm: CommView, skip: Sequence[int]) -> Optional[Tuple[int, int, str]]:
        """A peer of ``comm`` (a rank not in ``skip``) known to be unable to take part any more (stopped, exited),
        as ``(rank, pid, why)``; None when none is known. Asked by a thread that waits on ``comm`` outside any
        operation (a shrink, grow, split or finalize), about every 0.1 s: it must return quickly."""
        return None

    def peer_states(self, comm: CommView) -> Optional[Dict[int, Tuple[str, float]]]:
        """What the other ranks of ``comm`` last said of it: ``{rank: (its state, the age of what it said in
        seconds)}`` (``"active"``, ``"finalized"``, ...: :attr:`CommView.state`), for the ranks that said anything;
        None where this observer does not know. Asked once, by a finalize or destroy that timed out, to name the
        ranks that had not begun theirs (it may take up to a second)."""
        return None


_observers: List[CommObserver] = []

#: Observers whose per-operation hooks are compiled (subclasses of ``pycoll._core.Hook``, which says
#: so with ``compiled_hooks``): the path calls them through C, before the hooks below (one that says so without
#: being a ``Hook`` through its Python methods, after them).
compiled_observers: Tuple[CommObserver, ...] = ()
#: The other observers' ``work_enqueued`` / ``work_completed``, as tuples: read on every operation's path.
enqueue_hooks: Tuple[Callable[[WorkView], None], ...] = ()
completion_hooks: Tuple[Callable[[WorkView], None], ...] = ()


#: Called after every change of the observers: the compiled path keeps its own copy of the tuples above.
_listeners: List[Callable[[], None]] = []


def on_change(listener: Callable[[], None]) -> None:
    """Call ``listener()`` now and after every change of the registered observers."""
    _listeners.append(listener)
    listener()


def _rebuild() -> None:
    global compiled_observers, enqueue_hooks, completion_hooks

    def overrides(o: CommObserver, name: str) -> bool:
        return getattr(type(o), name, None) is not getattr(CommObserver, name)

    compiled_observers = tuple(o for o in _observers if getattr(o, "compiled_hooks", False) is True)
    python = [o for o in _observers if o not in compiled_observers]
    enqueue_hooks = tuple(o.work_enqueued for o in python if overrides(o, "work_enqueued"))
    completion_hooks = tuple(o.work_completed for o in python if overrides(o, "work_completed"))
    for listener in _listeners:
        listener()


def add_observer(observer: CommObserver) -> None:
    """Register an observer for every communicator of this process (idempotent; called in order)."""
    if not isinstance(observer, CommObserver):
        raise TypeError(f"an observer must be a pycoll.hooks.CommObserver, got {type(observer).__name__}")
    if observer not in _observers:
        if observer.keeps_work_entries and any(o.keeps_work_entries for o in _observers):
            warnings.warn(f"a second flight recorder ({observer!r}) registered: each operation keeps the entry of the "
                          "last one registered, and the other one's entries are not kept up to date (a failed "
                          "operation may read as completed there); configure the process's recorder instead",
                          RuntimeWarning, stacklevel=2)
        _observers.append(observer)
        _rebuild()


def remove_observer(observer: CommObserver) -> None:
    """Unregister an observer (no-op when it is not registered)."""
    if observer in _observers:
        _observers.remove(observer)
        _rebuild()


def observers() -> Tuple[CommObserver, ...]:
    """The registered observers, in the order they are called."""
    return tuple(_observers)


def failures_reported() -> bool:
    """True when some observer logs failures itself."""
    return any(o.reports_failures for o in _observers)


def held_exit(e: BaseException, what: str) -> Optional[BaseException]:
    """A ``SystemExit`` or ``KeyboardInterrupt`` that user code pycoll runs (an observer, a failure callback) raised:
    returned, for the caller to raise once it has done its part, in the main thread; logged and dropped elsewhere,
    where it would end the thread -- the watchdog's: every later hang unseen --, not the process."""
    if threading.current_thread() is threading.main_thread():
        return e
    _log.error("%s raised %s in thread %r, where it cannot end the process: ignored (os._exit() ends the process "
               "from any thread)", what, type(e).__name__, threading.current_thread().name)
    return None


def _each(call: Callable[[CommObserver], None], what: str) -> None:
    leave: Optional[BaseException] = None
    for o in list(_observers):
        try:
            call(o)
        except Exception:  # an observer must never break a communicator
            _log.exception("observer %r failed in %s", o, what)
        except BaseException as e:
            leave = leave or held_exit(e, f"observer {o!r} in {what}")
    if leave is not None:
        raise leave


def notify_created(comm: CommView) -> None:
    _each(lambda o: o.comm_created(comm), "comm_created")


def notify_failed(comm: CommView, exc: BaseException, work: Optional[WorkView]) -> None:
    _each(lambda o: o.comm_failed(comm, exc, work), "comm_failed")


def notify_withdrawn(work: WorkView) -> None:
    _each(lambda o: o.work_withdrawn(work), "work_withdrawn")


def notify_closed(comm: CommView) -> None:
    _each(lambda o: o.comm_closed(comm), "comm_closed")


def _first_answer(ask: Callable[[CommObserver], Any], what: str) -> Any:
    """The first observer's answer that is not None to ``ask(observer)`` (None: none answered); an observer that
    raises is logged and passed over (an observer must never break a communicator)."""
    for o in list(_observers):
        try:
            found = ask(o)
        except Exception:
            _log.exception("observer %r failed in %s", o, what)
            continue
        if found is not None:
            return found
    return None


def peer_unable(comm: CommView, skip: Sequence[int] = ()) -> Optional[Tuple[int, int, str]]:
    """The first observer's answer to :meth:`CommObserver.peer_unable` (None: no observer knows of one)."""
    found: Optional[Tuple[int, int, str]] = _first_answer(lambda o: o.peer_unable(comm, skip), "peer_unable")
    return found


def peer_states(comm: CommView) -> Optional[Dict[int, Tuple[str, float]]]:
    """The first observer's answer to :meth:`CommObserver.peer_states` (None: no observer knows)."""
    found: Optional[Dict[int, Tuple[str, float]]] = _first_answer(lambda o: o.peer_states(comm), "peer_states")
    return found


# -- the live registry: every communicator of this process that is neither destroyed nor aborted ------

_live: weakref.WeakSet[Communicator] = weakref.WeakSet()


def register_live(comm: Communicator) -> None:
    _live.add(comm)


def discard_live(comm: Communicator) -> None:
    _live.discard(comm)


def live_communicators() -> List[Communicator]:
    """The communicators of this process that are neither destroyed nor aborted."""
    return [c for c in list(_live) if c.state not in ("aborted", "destroyed", "inherited")]


# communicators whose initialisation is being waited for: a process that SIGTERM is about to end aborts them
# (abort, the waiting thread's ident, whether another thread may call abort)
_initializing: Dict[int, Tuple[Callable[[], None], int, bool]] = {}
_init_tokens = itertools.count()


@contextlib.contextmanager
def initializing(abort: Callable[[], None], any_thread: bool) -> Iterator[None]:
    """While the block waits for a new communicator's initialisation (init, or a split, shrink or grow's child),
    :func:`abort_initializing` may call ``abort``: from any thread where ``any_thread`` (a library that checks every
    handle it is given, as the host library does), else only from the waiting thread itself (a signal's handler
    running in it)."""
    token = next(_init_tokens)
    _initializing[token] = (abort, threading.get_ident(), any_thread)
    try:
        yield
    finally:
        _initializing.pop(token, None)


#: what the inits meeting through a store under way say there as SIGTERM ends the process (:func:`init_note`)
_init_notes: Dict[int, Callable[[], None]] = {}
#: how long the process waits for those notes as SIGTERM ends it (a store that does not answer holds it no longer)
INIT_NOTE_S = 2.0


@contextlib.contextmanager
def init_note(note: Callable[[], None]) -> Iterator[None]:
    """While the block runs an init that meets its peers through a store, :func:`abort_initializing` also calls
    ``note``, which tells the store that this rank gave the init up: a rank arriving later fails at once, not at its
    init_timeout (the init's own error path, which says so on every other failure, never runs: SIGTERM ends the
    process)."""
    token = next(_init_tokens)
    _init_notes[token] = note
    try:
        yield
    finally:
        _init_notes.pop(token, None)


def abort_initializing() -> None:
    """Abort the communicators this process is initialising (see :func:`initializing`) -- the process is about to
    end by SIGTERM: the host library then removes the rendezvous segment of a rank still waiting for the others
    (which a later init would otherwise sweep away only) -- and say so at the stores they meet through
    (:func:`init_note`), waiting at most ``INIT_NOTE_S`` for that: in a thread of its own, as the thread running
    this may have interrupted a call of the same store client. Errors are logged and ignored."""
    me = threading.get_ident()
    for abort, thread, any_thread in list(_initializing.values()):
        if any_thread or thread == me:
            try:
                abort()
            except Exception as e:
                _log.debug("aborting a communicator being initialised failed: %s", e)
    notes = list(_init_notes.values())
    if not notes:
        return

    def say() -> None:
        for note in notes:
            try:
                note()
            except Exception as e:
                _log.debug("telling the store that an init was given up failed: %s", e)

    t = threading.Thread(target=say, name="pycoll-init-note", daemon=True)
    try:
        t.start()
    except RuntimeError:  # no thread at interpreter shutdown: nothing said
        return
    t.join(INIT_NOTE_S)


#: whether this process is a fork of one that held communicators (a rank's data-loader or pool worker)
_forked_from_a_rank = False


def forked_from_a_rank() -> bool:
    """Whether this process is a fork of one that held communicators: its own are apart from its parent's."""
    return _forked_from_a_rank


def _after_fork_in_child() -> None:
    # a forked child inherits the parent's communicators: they are the parent's, never the child's
    global _forked_from_a_rank
    _forked_from_a_rank = _forked_from_a_rank or bool(_live)
    for c in list(_live):
        c.mark_inherited()
    _live.clear()
    _initializing.clear()
    _init_notes.clear()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)
