"""Flight recorder: a per-process ring buffer of every collective and point-to-point operation.

Every operation enqueued on any :class:`~pycoll.Communicator` of the process is recorded (the
recorder is a :class:`pycoll.hooks.CommObserver`; :func:`pycoll.diagnostics.install` registers it
with the first communicator). A dump writes one file per global rank in the pickle format of PyTorch's flight
recorder (schema ``"2.10"``), so torch's analyzer (``torchfrtrace`` /
``python -m torch.distributed.flight_recorder.fr_trace``) reads pycoll dumps as they are (their collectives,
below), and a JSON file with the same fields. pycoll's own analyzer (``pycoll-fr``, :mod:`pycoll.analyze`)
reads both without torch.

What torch's analyzer reads: a dump file's ``entries`` hold only the collectives whose type it knows
(:data:`TORCH_COLLECTIVES`: all_reduce, broadcast, reduce, all_gather, reduce_scatter, all_to_all, gather,
scatter, barrier); every other entry -- sends, receives and ``sendrecv``, the one-sided ``put_signal``,
``signal`` and ``wait_signal``, and :meth:`~pycoll.Communicator.watch_stream`'s (``graph_replay`` or the name
given) -- is kept, in the same form, under ``pycoll.other_entries``, which torch ignores and ``pycoll-fr`` merges
back in record-id order. Torch's analyzer cannot model them: it stops (AssertionError) at a type it does not know;
it matches every entry, a point-to-point one too, against all members of its group by ``collective_seq_id``, so a
transfer between two ranks of three reads as the third never joining it (a false culprit); a send whose
``p2p_seq_id`` equals the preceding collective's ``collective_seq_id`` reads as a coalesced group, on which it
stops too (``can't get dst of non-p2p op``): it pairs sends and receives only in torch's own coalesced batches,
which pycoll does not record. One-sided operations do not pair one to one (a wait counts signals), and a watched
stream is no collective: written under names torch knows, they would make it report what did not happen. Left
out, they leave gaps in the collectives' numbers, which torch does not mind (it matches equal numbers): it still
names a rank that never entered a collective, or a mismatched one. A kept entry's ``record_id`` counts only the
kept entries (each left-out one before it lowers it by one; its own is ``pycoll_record_id``): torch aligns the
ranks at the latest of their first record ids, and a rank's sends before its first collective would otherwise
hide another rank's first collectives from it (they are counted as they are recorded: also those a wrapped ring
lost). In memory, :meth:`FlightRecorder.as_dict` gives
every entry under ``entries`` unless asked for the file's form (``for_file``). Besides torch's fields an entry may
carry pycoll's: ``pycoll_error`` (a failed operation's error), ``pycoll_capture_id`` (captured in a CUDA graph),
``pycoll_root`` (a broadcast's, reduce's, gather's or scatter's root, a rank of its communicator: pycoll-fr
compares them across ranks, which also finds a root mismatch that no rank's library saw -- NCCL's, or the host
library's eager lane, where a sender completes before its receivers compare anything) and ``pycoll_record_id``.

A rank's dump of a generation replaces its earlier one (one file per rank, as torch's analyzer reads them): a slow
rank asked to dump by a peer's timeout, which then enters the collective on the aborted communicator and fails,
writes its failure dump over the one that said where it was. What the replaced dumps said of the process --
when, why, and where its main thread was -- goes on under ``pycoll.earlier_dumps`` (the last
:data:`EARLIER_DUMPS_KEPT`, oldest first), which ``pycoll-fr`` reads.

Layout of a dump (``dump_dir`` defaults to ``$PYCOLL_FR_DUMP_DIR``, else
``$XDG_CACHE_HOME/pycoll/fr/<run id>`` where the run id comes from the launcher)::

    <dump_dir>/generation_<g>/<prefix><global rank>          pickle (torchfrtrace reads this folder)
    <dump_dir>/json/generation_<g>/<prefix><global rank>.json

One folder per reshape generation (:attr:`Communicator.generation`): record ids and sequence ids
restart with each generation's communicators, and torch's analyzer aligns ranks by record id, so
generations must not be mixed. Files are written atomically (temporary file, then rename).

What an entry keeps: the operation's fixed facts (name, sequence ids, timeout, creation time), the
input/output shapes and dtypes, the thread id, and -- unless stacks are off -- the Python stack as
code objects and instruction offsets, formatted only when dumping. Its state, completion time and
duration are read at dump time from the outstanding :class:`~pycoll.Work` (found through its
communicator's ``outstanding()``), and frozen into the entry when it completes or its communicator
fails or closes. The ring keeps no array alive, and a communicator only while an operation of it is
outstanding (the recorder holds its outstanding Works: one its user dropped is still watched, and an exit's
dump names its operation). Recording costs about 0.1 us per operation (75-112 ns measured), its Python stack
of 17 frames 0.07 us more since stacks are read in place (0.13-0.17 us before); on an 8-byte all_reduce at 2 ranks,
recording with stacks adds 0.35-0.6 us per call (``benchmarks/fr_overhead.py``; benchmarks/README.md,
"Flight recorder and watchdog overhead" and "Stacks read in place").

Configuration: the arguments of :class:`FlightRecorder` / :func:`configure`, else the
``PYCOLL_FR_*`` settings (:mod:`pycoll._settings` holds their defaults and meaning; README lists them).
"""

from __future__ import annotations

import collections
import itertools
import json
import logging
import os
import pickle
import socket
import sys
import threading
import time
import weakref
from typing import TYPE_CHECKING, Any, Callable, Deque, Dict, Iterable, List, Optional, Sequence, Tuple, Union

from .. import _settings
from ..buffers import Buffer
from ..hooks import CommObserver, CommView, WorkView
from . import _hooks
from ._hooks import RecordIds
from .files import default_dump_dir, generation_dir, json_form, write_atomic
from .stacks import format_stack, is_runtime_frame

if TYPE_CHECKING:
    pass


def _check_prefix(prefix: object, what: str) -> None:
    """ValueError unless ``prefix`` can start a dump's file name (its rank follows it)."""
    if not isinstance(prefix, str) or not prefix or os.sep in prefix or prefix[-1].isdigit():
        raise ValueError(f"{what} must be a non-empty file name not ending in a digit (the rank follows it), "
                         f"got {prefix!r}")


_settings.register_check("PYCOLL_FR_FILE_PREFIX", lambda raw: _check_prefix(raw, "$PYCOLL_FR_FILE_PREFIX"))


def _check_dump_dir(raw: str, what: str = "$PYCOLL_FR_DUMP_DIR") -> None:
    """ValueError where no dump could be written in the dump folder (every dump would fail, with a log line only):
    it, or the nearest of its parents that exists, is something else than a folder this process can write to."""
    path = os.path.abspath(os.path.expanduser(raw))
    if os.path.exists(path) and not os.path.isdir(path):
        raise ValueError(f"{what} names {raw!r}, which is not a folder: no dump could be written there")
    there = path
    while not os.path.exists(there):
        there = os.path.dirname(there)
    if not os.path.isdir(there):
        raise ValueError(f"{what} names {raw!r}, under {there!r}, which is not a folder: no dump could "
                         f"be written there")
    if not os.access(there, os.W_OK | os.X_OK):
        raise ValueError(f"{what} names {raw!r}: {there!r} is a folder this process cannot write to, "
                         f"so no dump could be written there")


def _dump_dir_arg(value: Any, what: str) -> str:
    """A ``dump_dir`` argument as a path, checked as ``$PYCOLL_FR_DUMP_DIR`` is (:func:`_check_dump_dir`)."""
    path = os.fspath(value) if isinstance(value, (str, os.PathLike)) else None
    if not isinstance(path, str) or not path:
        raise TypeError(f"{what} must be a folder's path (a str or os.PathLike), got {value!r}")
    _check_dump_dir(path, what)
    return os.path.expanduser(path)  # as the check read it (and as $PYCOLL_FR_DUMP_DIR is): not a folder named '~'


_settings.register_check("PYCOLL_FR_DUMP_DIR", _check_dump_dir)

__all__ = [
    "FlightRecorder",
    "SCHEMA_VERSION",
    "TORCH_COLLECTIVES",
    "DEFAULT_BUFFER_SIZE",
    "DEFAULT_FILE_PREFIX",
    "get_recorder",
    "configure",
    "default_dump_dir",
    "generation_dir",
    "is_runtime_frame",
]

_log = logging.getLogger("pycoll.flight_recorder")

#: The ``version`` field of PyTorch's flight-recorder dumps that pycoll writes.
SCHEMA_VERSION = "2.10"
#: The operations pycoll records that torch's analyzer models (its ``COLLECTIVES``): a dump file's ``entries`` hold
#: only these; the others are under ``pycoll.other_entries`` (see the module's docstring).
TORCH_COLLECTIVES = _hooks.TORCH_COLLECTIVES
DEFAULT_BUFFER_SIZE: int = _settings.SETTINGS["PYCOLL_FR_BUFFER_SIZE"].default
DEFAULT_FILE_PREFIX: str = _settings.SETTINGS["PYCOLL_FR_FILE_PREFIX"].default
DEFAULT_STACK_DEPTH: int = _settings.SETTINGS["PYCOLL_FR_STACK_DEPTH"].default
_MAX_BUFFER_SIZE = int(_settings.SETTINGS["PYCOLL_FR_BUFFER_SIZE"].maximum or 0)
_FAILED_CLOSED_KEPT = 16  # closed communicators that had failed, kept for the dumps (see _failed_closed)
EARLIER_DUMPS_KEPT = 4  # a rank's replaced dumps of a generation whose facts its next dump carries (the module)

# Entry layout: the ring holds compiled entries (_hooks.Entry), written in place and reused when the ring
# wraps; readers work on snapshots, lists in this layout. The entry does not refer to its Work (a Work
# holds its communicator, and the ring must not keep communicators alive): what never changes is copied
# at record time; what does (state, start, completion, duration) is read at dump time from the Work
# while it is outstanding (the communicators' outstanding lists, each Work pointing to its entry and
# the position it was written for), or frozen into _FROZEN when it completes (work_completed) or its
# communicator fails or closes. An entry whose Work is no longer outstanding and was not frozen completed.
(_POS, _RID, _INFO, _ISZ, _IDT, _OSZ, _ODT, _TID, _STACK, _OP, _SEQ, _P2P_SEQ, _OP_ID, _PEER, _TIMEOUT,
 _CREATED, _FROZEN, _CAPTURE, _ROOT, _KEPT, _TNAME) = range(21)
# an operation recorded into a CUDA graph: it runs at replay, this entry keeps the capture's id
_CAPTURED = ("captured", None, None, None, None)
_SHAPE = Buffer._fields.index("shape")
_DTYPE = Buffer._fields.index("dtype_name")
_getframe = sys._getframe
_get_ident = threading.get_ident


class _CommInfo:
    """What the recorder keeps about one communicator (it outlives the communicator)."""

    __slots__ = ("ref", "uid", "name", "rank", "size", "global_ranks", "generation", "backend", "lib_prefix",
                 "pg_id", "rid", "lib_version", "state", "failure", "closed_at", "progress", "pending")

    def __init__(self, comm: CommView, pg_id: int, rid: RecordIds) -> None:
        self.ref = weakref.ref(comm)
        self.uid = str(comm.uid)
        self.name = str(comm.name)
        self.rank = int(comm.rank)
        self.size = int(comm.size)
        self.global_ranks: Optional[Tuple[int, ...]] = comm.global_ranks
        self.generation = int(comm.generation)
        self.backend = str(comm.backend)
        # torch's analyzer accepts only known library prefixes; the host library speaks NCCL's ABI
        self.lib_prefix = "rccl" if self.backend == "rccl" else "nccl"
        self.pg_id = pg_id
        self.rid = rid
        try:
            self.lib_version = ".".join(str(v) for v in comm.library.version_tuple)
        except Exception:
            self.lib_version = ""
        self.state = "active"
        self.failure: Optional[str] = None
        self.closed_at: Optional[float] = None
        self.progress: Optional[Dict[str, int]] = None  # frozen when the communicator fails
        # the communicator's own list of outstanding Works, held: a Work holds its communicator, which so stays
        # alive -- watched, and named by an exit's dump -- while an operation is outstanding, also once its user
        # dropped it (a process that exits right after an asynchronous operation); empty once they retired
        self.pending: Any = getattr(comm, "_pending", None)

    def refresh(self) -> Optional[Any]:
        """Copy the live communicator's mutable facts; return it (None once it is gone)."""
        comm = self.ref()
        if comm is not None:
            self.state = comm.state
            if comm.failure is not None:
                self.failure = f"{type(comm.failure).__name__}: {comm.failure}"
        return comm

    def members(self) -> List[int]:
        return list(self.global_ranks) if self.global_ranks is not None else list(range(self.size))

    def global_rank(self) -> int:
        return self.global_ranks[self.rank] if self.global_ranks is not None else self.rank


def _sizes(shapes: Any) -> List[List[int]]:
    """Recorded shapes (one shape tuple, or a list of them) as torch's list of lists."""
    if isinstance(shapes, tuple):
        return [list(shapes)]
    return [list(s) for s in shapes]


def _dtypes(names: Any) -> List[str]:
    return [names] if isinstance(names, str) else list(names)


class FlightRecorder(_hooks.RecorderCore, CommObserver):
    """The process's record of collective and point-to-point operations.

    Args:
        buffer_size: entries kept, oldest dropped first (``$PYCOLL_FR_BUFFER_SIZE``, 2000);
            0 records nothing (dumps then hold no entries).
        stacks: capture the Python stack of each operation (``$PYCOLL_FR_STACKS``, on).
        stack_depth: frames kept per stack, innermost first (``$PYCOLL_FR_STACK_DEPTH``, 16): a dump shows at
            most this many (a public call written in Python, such as ``barrier``, counts its own frame).
        dump_dir: where dumps go (see :func:`default_dump_dir`).
        file_prefix: dump file prefix; the global rank follows (``$PYCOLL_FR_FILE_PREFIX``).
        write_json: also write the JSON form (``$PYCOLL_FR_DUMP_JSON``, on).

    Thread-safe: operations may be recorded from any thread while another dumps.

    One recorder per process: an operation keeps its entry (``Work.fr_entry``) from the last recorder registered
    (:func:`pycoll.hooks.add_observer`), and another one's entries are not kept up to date with it (a failed
    operation would read as completed there); registering a second one warns. Configure the process's own
    (:func:`get_recorder`, :func:`pycoll.flight_recorder.configure`) instead.
    """

    keeps_work_entries = True

    def __init__(
        self,
        buffer_size: Optional[int] = None,
        *,
        stacks: Optional[bool] = None,
        stack_depth: Optional[int] = None,
        dump_dir: Optional[Union[str, os.PathLike]] = None,
        file_prefix: Optional[str] = None,
        write_json: Optional[bool] = None,
    ) -> None:
        # reentrant: a signal handler (or gc callback) that dumps may run in a thread inside a dump or inside these
        self._lock = threading.RLock()  # guards _infos/_gen_counters and dump bookkeeping
        self._dump_lock = threading.RLock()  # one dump at a time (a handler's nested dump runs whole inside it)
        self._infos = {}  # id(comm) -> _CommInfo
        self._gen_counters: Dict[int, RecordIds] = {}
        self._init_rank: Optional[Tuple[int, Optional[int]]] = None  # see note_init_rank
        self._pg_ids = itertools.count()
        self._next_pos = 0
        self._ring = []
        self._capacity = 0
        self.stacks = True
        self.stack_depth = DEFAULT_STACK_DEPTH
        self.dump_dir: Optional[str] = None
        self.file_prefix = DEFAULT_FILE_PREFIX
        self.write_json = True
        self._dumped_gen: Dict[int, int] = {}  # generation -> number of comm closes seen at its last dump
        self._closes: Dict[int, int] = {}
        # closed communicators that had failed: in a dump of their generation though no entry refers to them
        # (recording off, or a ring that wrapped), as the communicators those dumps explain. They do not make their
        # generation one to dump (generations()): a later dump, at exit, would write an old generation again from
        # what is left of it, over the dump its failure wrote. Where nothing else is there to dump, the latest one's
        # generation is dumped (dump())
        self._failed_closed: Deque[_CommInfo] = collections.deque(maxlen=_FAILED_CLOSED_KEPT)
        self._failures: Dict[int, List[Dict[str, Any]]] = {}  # generation -> failure reports
        self._transitions: List[Dict[str, Any]] = []  # the elastic layer's membership changes, every dump
        # (folder, generation) -> what the dumps its next dump replaces said (the module's docstring)
        self._earlier: Dict[Tuple[str, int], List[Dict[str, Any]]] = {}
        self.last_dump: Optional[Dict[str, Any]] = None
        self.dump_count = 0

        def env(value: Any, name: str) -> Any:
            return _settings.get(name) if value is None else value

        self.configure(buffer_size=env(buffer_size, "PYCOLL_FR_BUFFER_SIZE"), stacks=env(stacks, "PYCOLL_FR_STACKS"),
                       stack_depth=env(stack_depth, "PYCOLL_FR_STACK_DEPTH"), dump_dir=dump_dir,
                       file_prefix=env(file_prefix, "PYCOLL_FR_FILE_PREFIX"),
                       write_json=env(write_json, "PYCOLL_FR_DUMP_JSON"))

    # -- configuration ---------------------------------------------------------------------------

    def configure(
        self,
        *,
        buffer_size: Optional[int] = None,
        stacks: Optional[bool] = None,
        stack_depth: Optional[int] = None,
        dump_dir: Optional[Union[str, os.PathLike]] = None,
        file_prefix: Optional[str] = None,
        write_json: Optional[bool] = None,
    ) -> None:
        """Change settings; a new ``buffer_size`` drops what was recorded so far."""
        if buffer_size is not None:
            limit = _MAX_BUFFER_SIZE
            if isinstance(buffer_size, bool) or not isinstance(buffer_size, int) or not 0 <= buffer_size <= limit:
                raise ValueError(f"buffer_size must be an int in [0, {limit:g}], got {buffer_size!r}")
            if buffer_size != self._capacity:
                self._ring = [None] * buffer_size
                self._capacity = buffer_size
                self._next_pos = 0
        if stacks is not None:
            self.stacks = _settings.flag(stacks, "stacks")
        if stack_depth is not None:
            most = int(_settings.SETTINGS["PYCOLL_FR_STACK_DEPTH"].maximum or 1000)  # every entry keeps that many
            if isinstance(stack_depth, bool) or not isinstance(stack_depth, int) or not 1 <= stack_depth <= most:
                raise ValueError(f"stack_depth must be an int in [1, {most}], got {stack_depth!r}")
            self.stack_depth = stack_depth
        if dump_dir is not None:
            self.dump_dir = _dump_dir_arg(dump_dir, "dump_dir")
        if file_prefix is not None:
            _check_prefix(file_prefix, "file_prefix")
            self.file_prefix = file_prefix
        if write_json is not None:
            self.write_json = _settings.flag(write_json, "write_json")

    def after_fork(self) -> None:
        """In a forked child: locks another thread of the parent may have held are made afresh, and what the
        parent recorded is forgotten (its communicators refuse every use in the child): the child's dumps hold
        its own communicators, under its own rank, and it has none to dump until it makes one."""
        self._lock = threading.RLock()
        self._dump_lock = threading.RLock()
        self._infos = {}
        self._infos_changed()
        self._gen_counters = {}
        self._init_rank = None
        self._pg_ids = itertools.count()
        self.clear()
        self._dumped_gen = {}
        self._closes = {}
        self._failed_closed.clear()
        self._failures = {}
        self._transitions = []
        self._earlier = {}
        self.last_dump = None
        self.dump_count = 0

    @property
    def buffer_size(self) -> int:
        """Entries kept (0: recording is off)."""
        return self._capacity

    @property
    def enabled(self) -> bool:
        """True while recording is on (a buffer of at least one entry)."""
        return self._capacity > 0

    def clear(self) -> None:
        """Drop every recorded entry."""
        self._ring = [None] * self._capacity
        self._next_pos = 0

    # -- recording (observer interface) -----------------------------------------------------------

    def _info(self, comm: CommView) -> _CommInfo:
        with self._lock:
            info = self._infos.get(id(comm))
            if info is None or info.ref() is not comm:
                info = self._infos[id(comm)] = _CommInfo(comm, next(self._pg_ids), self._counter(comm.generation))
                self._infos_changed()
            return info

    def _counter(self, generation: int) -> RecordIds:
        rid = self._gen_counters.get(generation)
        if rid is None:
            rid = self._gen_counters[generation] = RecordIds()
        return rid

    def comm_created(self, comm: CommView) -> None:
        self._info(comm)

    def comm_closed(self, comm: CommView) -> None:
        info = self._infos.get(id(comm))
        if info is not None and info.ref() is comm:
            info.refresh()
            info.closed_at = time.time()
            self._freeze(comm)
            with self._lock:
                self._closes[info.generation] = self._closes.get(info.generation, 0) + 1
                if info.failure is not None:
                    self._failed_closed.append(info)
                # keep the info while entries refer to it; forget the id (it may be reused)
                del self._infos[id(comm)]
                self._infos_changed()

    def comm_failed(self, comm: CommView, exc: BaseException, work: Optional[WorkView]) -> None:
        info = self._infos.get(id(comm))
        if info is not None:
            info.failure = f"{type(exc).__name__}: {exc}"
            self._freeze(comm, work)  # before the policy releases the outstanding Works
            try:
                info.progress = comm.progress().as_dict()
            except Exception:
                _log.debug("could not read the progress of %r", comm, exc_info=True)

    @staticmethod
    def _freeze(comm: CommView, work: Optional[WorkView] = None) -> None:
        """Copy the state of ``comm``'s outstanding Works (and of ``work``, the failed one, which may
        have left the list already) into their entries: the Works may go away next."""
        works = list(comm.outstanding())
        if work is not None and work not in works:
            works.append(work)
        for w in works:
            e = _entry_of(w)
            if e is None or e.frozen is not None:
                continue
            e.freeze(_state_of(w))
            # an abandoned operation need not keep its arrays; under on_failure="report" the communicator goes on,
            # and so may the operation: the library still reads them (freed, a SIGSEGV when it ran)
            if w.last_state != "completed" and getattr(comm, "on_failure", "abort") != "report":
                w.release_arrays()

    def work_withdrawn(self, work: WorkView) -> None:
        e = _entry_of(work)
        if e is not None and e.frozen is None:  # never ran: its entry keeps its state and why, not "completed"
            e.freeze(_state_of(work))
            work.release_arrays()

    # the per-operation hooks, compiled (pycoll/diagnostics/_hooks.pyx)
    work_completed = _hooks.recorder_work_completed
    work_enqueued = _hooks.recorder_work_enqueued

    def issued_at(self, w: WorkView) -> Tuple[str, str]:
        """(``'file:line in function'`` of the innermost user frame that issued ``w``, its sizes as
        ``'Float(2,)'``), from its entry; empty strings when it was not recorded."""
        return format_issue(issue_record(w))

    def add_failure(self, generation: int, report: Dict[str, Any]) -> None:
        """Keep a failure report; every later dump of ``generation`` carries it (``pycoll.failures``)."""
        with self._lock:
            reports = self._failures.setdefault(int(generation), [])
            reports.append(report)
            del reports[:-64]

    def add_transition(self, record: Dict[str, Any]) -> None:
        """Keep a membership change of the elastic layer (plain data); every later dump carries it
        (``pycoll.transitions``, the last 64), whatever its generation."""
        with self._lock:
            self._transitions.append(dict(record))
            del self._transitions[:-64]

    # -- reading ---------------------------------------------------------------------------------

    def unfinished(self, limit: int = 4) -> List[str]:
        """The operations not completed on communicators still open (neither destroyed nor aborted) that have not
        failed, newest last, as ``"all_reduce #7 on 'world' (started)"`` (at most ``limit``; a last item counts the
        rest)."""
        with self._lock:
            live = {i.uid for i in self._infos.values() if i.ref() is not None}
        return self._not_completed(self.entries(), lambda i: i.closed_at is None and i.failure is None
                                   and i.uid in live, limit, withdrawn=False)

    def failed(self, limit: int = 4) -> List[str]:
        """The operations a failure or an abort ended on a communicator that failed (its policy revoked it or left it
        open: ``"revoke"``, as an ElasticGroup's, or ``"report"``) or was closed since (its policy's abort, the user's
        abort or destroy) and has no successor of its name, as :meth:`unfinished` gives them: what this process was
        doing when, say, Ctrl-C inside a collective failed the communicator, or another thread's ``abort()`` stopped
        it. They are not outstanding."""
        entries = self.entries()
        with self._lock:
            alive = [i for i in self._infos.values() if i.ref() is not None]
        newest: Dict[str, int] = {}  # name -> the latest communicator of that name (pg_id: in creation order)
        for i in [*alive, *(e[_INFO] for e in entries)]:
            newest[i.name] = max(newest.get(i.name, -1), i.pg_id)
        return self._not_completed(entries, lambda i: (i.closed_at is not None or i.failure is not None)
                                   and i.pg_id == newest[i.name], limit, stopped_only=True)

    def _not_completed(self, entries: List[Any], on: Callable[[_CommInfo], bool], limit: int,
                       withdrawn: bool = True, stopped_only: bool = False) -> List[str]:
        """``withdrawn=False``: leave out the operations that failed and left the outstanding list (a dropped group's:
        they never ran, and nothing waits for them); ``stopped_only``: on a communicator without a recorded failure,
        only those that ended with an error (an abort stopped them)."""
        raw = [e for e in entries if on(e[_INFO])]
        infos: Dict[str, _CommInfo] = {e[_INFO].uid: e[_INFO] for e in raw}
        comms = [c for c in (i.ref() for i in infos.values()) if c is not None]
        outstanding = _outstanding(comms)
        for w in outstanding.values():  # the state now, as the dump that follows gives it (as_dict)
            w.comm.try_refresh(w)
        listed = set() if withdrawn else {w.fr_pos for c in comms for w in c.outstanding()}  # frozen ones too
        out = []
        for e in raw:
            state, _, _, _, error = _dynamic(e, outstanding)
            if state == "completed" or (not withdrawn and error is not None and e[_POS] not in listed):
                continue
            if stopped_only and error is None and e[_INFO].failure is None:
                continue
            what = (f"{e[_OP]} #{e[_P2P_SEQ]} with peer {e[_PEER]}" if e[_PEER] is not None
                    else f"{e[_OP]} #{e[_SEQ]}")
            out.append(f"{what} on {e[_INFO].name!r} ({state})")
        if len(out) > limit:
            return [*out[-limit:], f"{len(out) - limit} more"]
        return out

    def global_rank(self) -> int:
        """This process's job-wide rank, as its dumps are named (see :meth:`as_dict`): from its open communicators,
        else from those it recorded operations of (destroyed or aborted since)."""
        with self._lock:
            infos = [i for i in self._infos.values() if i.ref() is not None]
        if not infos:
            infos = list({id(e[_INFO]): e[_INFO] for e in self.entries()}.values())
        return self._global_rank(infos)

    def note_init_rank(self, rank: int, global_ranks: Any = None) -> None:
        """The rank an init in progress gives this process (``global_ranks[rank]`` where given): its dumps and stacks
        are named by it until a communicator exists -- a rank stuck in its init dumped as rank 0, two into one file."""
        if isinstance(rank, bool) or not isinstance(rank, int):  # init refuses it
            return
        job_rank: Optional[int] = None
        if global_ranks is not None:
            try:
                job_rank = int(global_ranks[rank])
            except (TypeError, ValueError, IndexError, KeyError):  # init refuses them (check_arguments)
                pass
        self._init_rank = (rank, job_rank)

    @property
    def has_communicators(self) -> bool:
        """True once a communicator was recorded (there is something to dump)."""
        with self._lock:
            return bool(self._infos) or bool(self._gen_counters)

    def entries(self) -> List[List[Any]]:
        """The recorded entries, oldest first, as snapshots (internal lists; see :meth:`as_dict`)."""
        out = [s for s in (e.snapshot() for e in list(self._ring) if e is not None) if s is not None]
        out.sort(key=lambda e: e[_POS])
        return out

    @property
    def recorded(self) -> int:
        """Operations recorded since the buffer was last (re)sized or cleared."""
        return self._next_pos

    def generations(self) -> List[int]:
        """Generations with live communicators or recorded entries."""
        gens = {e[_INFO].generation for e in self.entries()}
        with self._lock:
            gens |= {i.generation for i in self._infos.values() if i.ref() is not None}
        return sorted(gens)

    def as_dict(
        self,
        generation: int = 0,
        *,
        stacks: bool = True,
        json_form: bool = False,
        extra: Optional[Dict[str, Any]] = None,
        refresh: bool = True,
        for_file: bool = False,
    ) -> Dict[str, Any]:
        """The dump of one generation, as PyTorch's flight recorder writes it (schema ``"2.10"``).

        ``json_form`` gives the JSON variant (``process_group`` as a list, unset timestamps as 0,
        ``pg_status`` values as strings). pycoll's own facts (ranks, communicator states,
        failure reports) are under the extra top-level key ``"pycoll"``, which torch ignores.
        ``entries`` holds every entry, unless ``for_file``: then, as a dump file holds them, only those torch's
        analyzer models (:data:`TORCH_COLLECTIVES`, each with its ``record_id`` counting only these and its own
        as ``pycoll_record_id``), the others under ``pycoll.other_entries`` (the module's docstring says why).
        """
        raw = [e for e in self.entries() if e[_INFO].generation == generation]
        with self._lock:
            live = [i for i in self._infos.values() if i.generation == generation and i.ref() is not None]
            live += [i for i in self._failed_closed if i.generation == generation]
        infos: Dict[str, _CommInfo] = {}
        for info in live + [e[_INFO] for e in raw]:
            infos.setdefault(info.uid, info)
        comms = {uid: info.refresh() for uid, info in infos.items()}
        outstanding = _outstanding(c for c in comms.values() if c is not None)
        if refresh:
            for w in outstanding.values():
                w.comm.try_refresh(w)
        cache: Dict[Tuple[Any, int], int] = {}
        # a loop issues its collectives from a few call sites: format each distinct stack once and
        # share the list (pickle stores it once, too)
        formatted: Dict[Tuple[Any, ...], List[Dict[str, Any]]] = {}
        entries = []
        other: List[Dict[str, Any]] = []  # for_file: the entries torch's analyzer does not read
        for e in raw:
            info = e[_INFO]
            state, started, completed, duration, error = _dynamic(e, outstanding)
            done = state == "completed"
            op, peer = e[_OP], e[_PEER]
            is_p2p = peer is not None
            if is_p2p:
                me = info.rank
                # one-sided operations keep their own names: pycoll-fr pairs only sends with recvs (a sendrecv
                # is both)
                arrow = "<->" if op == "sendrecv" else "<-" if op in ("recv", "wait_signal") else "->"
                name = f"{info.lib_prefix}:{op} {me}{arrow}{peer}"
            else:
                name = f"{info.lib_prefix}:{op}"
            entry: Dict[str, Any] = {
                "record_id": e[_RID],
                "pg_id": info.pg_id,
                "process_group": [info.uid, info.name] if json_form else (info.uid, info.name),
                "collective_seq_id": e[_SEQ],
                "p2p_seq_id": e[_P2P_SEQ],
                "op_id": e[_OP_ID],
                "profiling_name": name,
                "time_created_ns": e[_CREATED],
                "input_sizes": _sizes(e[_ISZ]),
                "input_dtypes": _dtypes(e[_IDT]),
                "output_sizes": _sizes(e[_OSZ]),
                "output_dtypes": _dtypes(e[_ODT]),
                "state": state,
                "time_discovered_started_ns": (started or 0) if json_form else started,
                "time_discovered_completed_ns": (completed or 0) if json_form else completed,
                "retired": done or error is not None,
                "timeout_ms": round(e[_TIMEOUT] * 1000),
                "is_p2p": is_p2p,
                "thread_id": str(e[_TID]),
                "thread_name": e[_TNAME],
            }
            if done and duration is not None:
                entry["duration_ms"] = float(duration)
            if error is not None:
                entry["pycoll_error"] = error
            if e[_CAPTURE] is not None:
                entry["pycoll_capture_id"] = e[_CAPTURE]
            if e[_ROOT] is not None:  # a rooted collective's root (the communicator's rank), for pycoll-fr
                entry["pycoll_root"] = e[_ROOT]
            if stacks and e[_STACK] is not None:
                key = tuple(e[_STACK])
                frames = formatted.get(key)
                if frames is None:
                    frames = formatted[key] = format_stack(e[_STACK], cache)
                entry["frames"] = frames
            if not for_file:
                entries.append(entry)
            elif is_p2p or op not in TORCH_COLLECTIVES:
                other.append(entry)
            else:
                # torch aligns ranks by their first record ids: count only what it reads (counted as recorded, so
                # also the left-out entries a wrapped ring lost)
                entry["record_id"], entry["pycoll_record_id"] = e[_KEPT], e[_RID]
                entries.append(entry)

        pg_config: Dict[str, Dict[str, str]] = {}
        pg_status: Dict[str, Dict[str, Any]] = {}
        comm_facts: Dict[str, Dict[str, Any]] = {}
        for uid, info in infos.items():
            members = info.members()
            pg_config[uid] = {"name": uid, "desc": info.name, "ranks": "[" + ", ".join(str(r) for r in members) + "]"}
            progress = info.progress
            live_comm = comms[uid]
            if progress is None and live_comm is not None:
                progress = live_comm.progress().as_dict()
            if progress is None:
                progress = _progress_from_entries(uid, raw, outstanding)
            status = {
                "last_enqueued_collective": progress["coll_enqueued"] or -1,
                "last_started_collective": progress["coll_started"] or -1,
                "last_completed_collective": progress["coll_completed"] or -1,
            }
            pg_status[str(info.pg_id)] = {k: str(v) for k, v in status.items()} if json_form else status
            comm_facts[uid] = {
                "name": info.name, "pg_id": info.pg_id, "rank": info.rank, "size": info.size,
                "global_ranks": members, "global_ranks_known": info.global_ranks is not None,
                "generation": info.generation, "backend": info.backend, "state": info.state,
                "failure": info.failure, "progress": progress,
            }
        rank = self._global_rank(list(infos.values()))
        lib_versions = sorted({i.lib_version for i in infos.values() if i.lib_version})
        pyc: Dict[str, Any] = {
            "format": 1,
            "rank": rank,
            "generation": generation,
            "pid": os.getpid(),
            "hostname": socket.gethostname(),
            "time_ns": time.time_ns(),
            "buffer_size": self._capacity,
            "recorded": self.recorded,
            "stacks": self.stacks and stacks,
            "comms": comm_facts,
            "failures": list(self._failures.get(generation, ())),
            "transitions": list(self._transitions),
        }
        if for_file:
            pyc["other_entries"] = other
        if stacks and self.stacks:
            pyc["main_thread"] = _main_stack()
        if extra:
            pyc.update(extra)
        return {
            "version": SCHEMA_VERSION,
            "comm_lib_version": lib_versions[0] if len(lib_versions) == 1 else ",".join(lib_versions),
            "pg_config": pg_config,
            "pg_status": pg_status,
            "entries": entries,
            "pycoll": pyc,
        }

    def _global_rank(self, infos: Sequence[_CommInfo]) -> int:
        """This process's job-wide rank: from a communicator that knows it, else the environment; without a
        communicator, from the init in progress (:meth:`note_init_rank`)."""
        for info in sorted(infos, key=lambda i: i.pg_id):
            if info.global_ranks is not None:
                return info.global_rank()
        init = self._init_rank if not infos else None
        if init is not None and init[1] is not None:
            return init[1]
        for var in ("PYCOLL_RANK", "RANK", "SLURM_PROCID", "OMPI_COMM_WORLD_RANK"):
            value = os.environ.get(var, "").strip()
            if value.isdigit():
                return int(value)
        return infos[0].rank if infos else init[0] if init is not None else 0

    # -- dumping ---------------------------------------------------------------------------------

    def dump(
        self,
        reason: str = "manual",
        *,
        trigger: str = "manual",
        dump_dir: Optional[Union[str, os.PathLike]] = None,
        generations: Optional[Iterable[int]] = None,
        stacks: bool = True,
        write_json: Optional[bool] = None,
        extra: Optional[Dict[str, Any]] = None,
        changed_only: bool = False,
        also: Iterable[int] = (),
    ) -> List[str]:
        """Write this process's dump of each generation; return the paths written.

        ``generations`` defaults to every generation with live communicators or entries (with
        ``changed_only``, generations whose communicators are all closed and were dumped since
        are skipped); ``also``: generations dumped besides (a failure's, whose communicators may all be closed by
        the time its dump is written, with no entry left to make it one to dump). Never raises for I/O problems:
        they are logged and the path is left out (a ``dump_dir`` given where no dump could be written is refused:
        ValueError). Safe from any thread; concurrent dumps run one after the other.
        """
        base = _dump_dir_arg(dump_dir, "dump_dir") if dump_dir is not None else (self.dump_dir or default_dump_dir())
        folder = os.path.realpath(base)  # the folder however it is spelled (a dump replaces the one there)
        write_json = self.write_json if write_json is None else write_json
        written: List[str] = []
        with self._dump_lock:
            gens = sorted(set(generations if generations is not None else self.generations()) | set(also))
            if not gens:  # nothing live or recorded: the latest failed communicator's generation (0 where none)
                with self._lock:
                    gens = [max((i.generation for i in self._failed_closed), default=0)]
            for gen in gens:
                with self._lock:
                    closes = self._closes.get(gen, 0)
                    live = any(i.generation == gen and i.ref() is not None for i in self._infos.values())
                if changed_only and not live and self._dumped_gen.get(gen) == closes:
                    continue
                t0 = time.monotonic()
                info: Dict[str, Any] = {"reason": reason, "trigger": trigger}
                if extra:
                    info.update(extra)
                if self._earlier.get((folder, gen)):
                    info["earlier_dumps"] = list(self._earlier[folder, gen])
                try:
                    data = self.as_dict(gen, stacks=stacks, extra=info, for_file=True)
                except Exception:
                    _log.exception("flight recorder: could not assemble the dump of generation %d", gen)
                    continue
                rank = data["pycoll"]["rank"]
                name = f"{self.file_prefix}{rank}"
                path = os.path.join(generation_dir(base, gen), name)
                try:
                    write_atomic(path, pickle.dumps(data, protocol=2))
                except Exception as exc:
                    _log.error("flight recorder: could not write %s: %s", path, exc)
                    continue
                written.append(path)
                jpath = None
                if write_json:
                    jpath = os.path.join(generation_dir(base, gen, json_form=True), name + ".json")
                    try:
                        write_atomic(jpath, json.dumps(json_form(data), default=str).encode())
                        written.append(jpath)
                    except Exception as exc:
                        _log.error("flight recorder: could not write %s: %s", jpath, exc)
                        jpath = None
                self._dumped_gen[gen] = closes
                kept = self._earlier.setdefault((folder, gen), [])
                kept.append({k: data["pycoll"].get(k) for k in ("time_ns", "trigger", "reason", "main_thread")})
                del kept[:-EARLIER_DUMPS_KEPT]
                self.dump_count += 1
                count = len(data["entries"]) + len(data["pycoll"]["other_entries"])
                self.last_dump = {"path": path, "json": jpath, "generation": gen, "reason": reason,
                                  "trigger": trigger, "time": time.time(), "entries": count}
                _log.warning(
                    "pycoll flight recorder: rank %s dumped %d entries of generation %d to %s%s in %.0f ms (%s: %s)",
                    rank, count, gen, path, f" (+ {jpath})" if jpath else "",
                    (time.monotonic() - t0) * 1e3, trigger, reason,
                )
        return written


def _main_stack(limit: int = 32) -> List[Dict[str, Any]]:
    """Where the main thread is now, innermost frame first (a rank asked to dump while its user code
    is busy shows where); empty when the dump runs in the main thread itself."""
    main = threading.main_thread()
    if main is threading.current_thread() or main.ident is None:
        return []
    frame = sys._current_frames().get(main.ident)
    frames: List[Dict[str, Any]] = []
    while frame is not None and len(frames) < limit:
        code = frame.f_code
        frames.append({"name": code.co_name, "filename": code.co_filename, "line": frame.f_lineno})
        frame = frame.f_back
    return frames


def issue_record(w: WorkView) -> Optional[Tuple[Any, Any, Any]]:
    """``w``'s recorded stack, shapes and dtypes (references, nothing formatted: cheap on a failing
    thread), for :func:`format_issue` later; None when it was not recorded."""
    e = _entry_of(w)
    return None if e is None else (e.stack, e.isz, e.idt)


def format_issue(record: Optional[Tuple[Any, Any, Any]]) -> Tuple[str, str]:
    """(``'file:line in function'`` of the innermost user frame, sizes as ``'Float(2,)'``) of an
    :func:`issue_record`; empty strings for None."""
    if record is None:
        return "", ""
    stack, isz, idt = record
    sizes = ", ".join(f"{dt}{tuple(s)}" for s, dt in zip(_sizes(isz), _dtypes(idt), strict=False))
    for fr in format_stack(stack, {}) if stack else []:
        if not is_runtime_frame(fr["filename"]):
            return f"{fr['filename']}:{fr['line']} in {fr['name']}", sizes
    return "", sizes


def _entry_of(w: WorkView) -> Optional[_hooks.Entry]:
    """``w``'s entry, unless the ring wrapped and the entry holds a later operation now."""
    e = w.fr_entry
    return e if e is not None and e.pos == w.fr_pos else None


def _outstanding(comms: Iterable[CommView]) -> Dict[int, WorkView]:
    """Entry position -> Work, for the outstanding operations of ``comms`` whose entries are not frozen."""
    out: Dict[int, WorkView] = {}
    for comm in comms:
        for w in comm.outstanding():
            e = _entry_of(w)
            if e is not None and e.frozen is None:
                out[w.fr_pos] = w
    return out


def _dynamic(e: List[Any], outstanding: Dict[int, Any],
             ) -> Tuple[str, Optional[int], Optional[int], Optional[float], Optional[str]]:
    """(state, started ns, completed ns, duration ms, error) of an entry (a snapshot): frozen, or from its
    outstanding Work."""
    if e[_FROZEN] is not None:
        return e[_FROZEN]
    w = outstanding.get(e[_POS])
    if w is None:
        return ("completed", None, None, None, None)  # not outstanding, not frozen: it completed
    return _state_of(w)


def _state_of(w: WorkView) -> Tuple[str, Optional[int], Optional[int], Optional[float], Optional[str]]:
    """(state, started ns, completed ns, duration ms, error) of a Work, as an entry keeps them."""
    exc = w.error
    return (w.last_state, w.time_started_ns, w.time_completed_ns, w.duration_ms,
            f"{type(exc).__name__}: {exc}" if exc is not None else None)


def _progress_from_entries(uid: str, raw: Sequence[List[Any]], outstanding: Dict[int, Any]) -> Dict[str, int]:
    out = {f"{k}_{s}": 0 for k in ("coll", "p2p") for s in ("enqueued", "started", "completed")}
    for e in raw:
        if e[_INFO].uid != uid:
            continue
        state = _dynamic(e, outstanding)[0]
        kind, seq = ("p2p", e[_P2P_SEQ]) if e[_PEER] is not None else ("coll", e[_SEQ])
        out[f"{kind}_enqueued"] = max(out[f"{kind}_enqueued"], seq)
        if state in ("started", "completed"):
            out[f"{kind}_started"] = max(out[f"{kind}_started"], seq)
        if state == "completed":
            out[f"{kind}_completed"] = max(out[f"{kind}_completed"], seq)
    return out


# -- the process's recorder --------------------------------------------------------------------------

_recorder: Optional[FlightRecorder] = None
_recorder_lock = threading.Lock()


def get_recorder() -> FlightRecorder:
    """The process-wide recorder (created from the environment on first use)."""
    global _recorder
    if _recorder is None:
        with _recorder_lock:
            if _recorder is None:
                _recorder = FlightRecorder()
    return _recorder


def after_fork() -> None:
    """In a forked child: the process's recorder makes its locks afresh (a parent's thread may have held them)."""
    if _recorder is not None:
        _recorder.after_fork()


def configure(**settings: Any) -> FlightRecorder:
    """Change the process-wide recorder's settings (see :class:`FlightRecorder`); returns it."""
    rec = get_recorder()
    rec.configure(**settings)
    return rec
