"""Watchdog: every hang or communicator error becomes a diagnosis within seconds.

One watchdog per process starts with the first :class:`~pycoll.Communicator` (``PYCOLL_WATCHDOG=0``
keeps it off). It runs four daemon threads:

* ``pycoll-watchdog`` polls every live communicator (``Communicator.check``: event queries and
  ``ncclCommGetAsyncError``, nothing else) every ``interval`` seconds, and wakes exactly at the
  earliest deadline of the outstanding operations, so a timeout is seen within milliseconds of it.
* ``pycoll-watchdog-monitor`` writes the flight-recorder dumps (so file I/O never delays the
  polling), reports a stalled polling thread with its stack, and serves the dump signal (SIGUSR1
  when enabled: the handler only wakes this thread).
* ``pycoll-watchdog-store`` publishes, for every communicator with a store, this rank's progress
  (last enqueued / started / completed sequence ids) and a heartbeat every ``publish_interval``,
  and watches for dump requests from other ranks. Store calls live only here and in the report
  thread, so a slow or dead store never blocks the polling.
* ``pycoll-watchdog-report`` makes the reports of asynchronous and remote errors (below).
* ``pycoll-watchdog-liveness`` watches the peers of outstanding work (:mod:`.liveness`): a peer that
  is stopped, gone or silent fails the work with :class:`~pycoll.PeerFailure` within about a second,
  whatever the timeout (``PYCOLL_WATCHDOG_LIVENESS=0`` turns it off).

When an operation times out (whichever thread sees it: the watchdog, or the user's thread in
``wait()``), before the communicator's policy acts (abort, revoke or report; see
:class:`~pycoll.Communicator`):

1. the failure is announced in the store (with this rank's progress at the failure) and every other
   rank is asked to dump (they dump although they are not hung); each answers at once from its store
   thread, whatever its user code is doing, with a fresh progress record naming the request, and the
   failing rank waits up to ``abort_grace`` for those answers (not for ranks already silent); ranks
   stuck in the same operation are given ``abort_grace`` seconds to reach their own verdict, so that
   every rank reports the root cause rather than "rank k aborted". Only answers (and ranks silent for
   longer than 1.5 publish intervals) make a rank "behind"; an older report is given with its age.
   Same-host peers that did not answer and published a dump signal are sent it (see
   :mod:`.signals`: their faulthandler writes their stacks from C);
2. ONE line is logged (logger ``pycoll.watchdog``): communicator, operation, sequence id, elapsed
   time, the ranks behind (never issued it, or silent), where the operation was issued;
3. the local flight-recorder dump is queued: the monitor thread writes it while
4. the policy acts at once; the user's thread gets the typed exception at its next call or ``wait()``.

An asynchronous or remote error (a dead peer) is final and needs no grace: the policy acts at once
and steps 1-3 follow in a report thread, so a recovery starts while the report is being made (the
elastic layer holds the report until the recovery is over: :meth:`Watchdog.add_dump_gate`).

The dump holds the same facts as one written before the policy acts (the recorder freezes the
state of every outstanding operation and the communicator's progress when the failure is recorded),
but recovery never waits for it. The elastic layer goes further and holds failure dumps back while
it rebuilds the communicator (:meth:`Watchdog.add_dump_gate`, at most ``dump_hold`` seconds), so
that three survivors formatting 2000 entries each on a small machine do not slow the reshape. A
process that exits waits up to ``dump_timeout`` for dumps still queued or being written
(:meth:`Watchdog.wait_for_dumps`). The store exchange is bounded by ``report_timeout``: no store can
hold the abort back for longer.

Configuration: the arguments of :class:`Watchdog` / :func:`configure`, else the
``PYCOLL_WATCHDOG*`` and ``PYCOLL_FR_DUMP_*`` settings (:mod:`pycoll._settings` holds their defaults
and meaning; README lists them).

Store keys and records: :mod:`pycoll.diagnostics.records`. The pieces: :mod:`.report` (the failure
report and its line), :mod:`.dumps` (the dump queue and its gates), :mod:`.signals` (the dump signal).
"""

from __future__ import annotations

import atexit
import logging
import math
import os
import queue
import select
import signal
import socket
import sys
import threading
import time
import traceback
from collections import deque
from typing import Any, Callable, Deque, Dict, Iterable, List, Optional, Sequence, Set, Tuple, Union

from .. import _settings, failpoints as _fp, hooks
from .._settings import Seconds
from ..errors import CommAborted, StoreTimeout
from ..hooks import CommObserver, CommView, WorkView
from ..store import torch as torch_store
from . import _hooks, answers, exits, recorder as _recorder_module
from .dumps import GATE_POLL, DumpJob, DumpQueue
from .files import default_dump_dir, remove_unfinished
from .liveness import Liveness, round_all
from .recorder import FlightRecorder, format_issue, get_recorder, issue_record
from .records import (
    FR_KEY_PREFIX,
    SIGNAL_COUNTER,
    FailureRecord,
    ProgressRecord,
    failure_prefix,
    origin,
    proc_prefix,
    progress_prefix,
    read_records,
)
from .report import FailureReport
from .signals import STACKS_DIR, DumpSignal, register_exit, signal_number

# how long a new communicator's first records may take to write, in the thread that made it (Watchdog.comm_created)
_CREATED_WRITES_S = 5.0
# the kinds of dump request in the store (_signal_store)
_FAILURE, _REQUEST = "failure", "request"
# requests posted just before a rank first read a store's counter that it still serves when they name one of its
# communicators (its store thread's first look may come after its communicator took part in operations)
_LOOK_BACK = 8
FP_REPORT = _fp.declare("watchdog.report.begin", "a failure being reported, before its store exchange and line")
FP_FIRST_LOOK = _fp.declare("watchdog.request.first_look", "the store thread's first look at a store's dump requests, "
                            "before it reads their counter")
FP_CREATED = _fp.declare("watchdog.progress.created", "a communicator just made, before this rank's first progress "
                         "record for it is written (in the thread that made it)")
FP_ANSWER = _fp.declare("watchdog.request.answer", "a dump request from another rank, before answering it")
FP_FORGET = _fp.declare("watchdog.records.forget", "the records of a communicator that failed or was aborted, kept for "
                        "its peers, before this rank deletes them from the store")
FP_PEER_STATES = _fp.declare("watchdog.peer_states.read", "a finalize or destroy that timed out, before it reads the "
                             "other ranks' last records from the store (to name those that had not begun theirs)")

__all__ = ["Watchdog", "get_watchdog", "configure", "install", "enable_dump_signal", "dump_flight_recorder",
           "FR_KEY_PREFIX", "KEY_PREFIX"]

_log = logging.getLogger("pycoll.watchdog")

KEY_PREFIX = FR_KEY_PREFIX  # the old name


def _seconds(value: Optional[float], env: str, what: str, positive: bool) -> float:
    return float(_settings.get(env)) if value is None else _settings.seconds(value, what, positive=positive)


class _StoreState:
    __slots__ = ("store", "last_seen", "first_seen", "answered")

    def __init__(self, store: Any) -> None:
        self.store = store
        self.last_seen: Optional[int] = None
        self.first_seen = 0  # the counter at the first look: earlier requests are served only for our communicators
        self.answered = -1  # the latest dump request answered: every later progress record names it


def _decode(raw: Any) -> str:
    return raw.decode("utf-8", "replace") if isinstance(raw, (bytes, bytearray)) else str(raw)


class Watchdog(_hooks.WatchdogCore, CommObserver):
    """The process's watchdog (see the module documentation). Use :func:`get_watchdog`.

    Args (None: the environment variable, else the default; seconds):
        recorder: the flight recorder to dump (default: the process's).
        enabled: start threads with the first communicator (``PYCOLL_WATCHDOG``).
        interval: polling period.
        publish_interval: progress/heartbeat publication and dump-request polling period.
        stall_timeout: a polling thread that has not completed a round for this long past its ``interval`` is reported.
        report_timeout: longest wait for the store while reporting a failure.
        abort_grace: longest wait for ranks stuck in the same operation to reach their verdict.
        dump_timeout: longest wait at exit (and in :meth:`dump`) for a dump being written.
        dump_hold: longest time a dump gate (:meth:`add_dump_gate`) may hold a failure dump back.
        liveness: watch the peers of outstanding work (``PYCOLL_WATCHDOG_LIVENESS``).
        liveness_interval: period of the same-host peers' process-state checks.
        heartbeat_timeout: a peer on another host silent this long fails the outstanding work.
        records_keep: how long this rank's records in the store of a communicator that failed or was aborted stay
            for its peers before this rank deletes them (``PYCOLL_WATCHDOG_RECORDS_KEEP``; set with :meth:`configure`).
        dump_on_failure: dump when a communicator fails, this process's or (asked through the store) another rank's.
        dump_signal: a signal (``"SIGUSR1"``, True for SIGUSR1) whose delivery dumps; off by default.
        communicators: what is watched (default: every live communicator of the process).
    """

    reports_failures = True  # the communicator does not log the failure itself
    # set by configure(), seconds
    interval: float
    publish_interval: float
    stall_timeout: float
    report_timeout: float
    abort_grace: float
    dump_timeout: float
    dump_hold: float
    liveness: bool
    liveness_interval: float
    heartbeat_timeout: float
    records_keep: float

    def __init__(
        self,
        recorder: Optional[FlightRecorder] = None,
        *,
        enabled: Optional[bool] = None,
        interval: Optional[Seconds] = None,
        publish_interval: Optional[Seconds] = None,
        stall_timeout: Optional[Seconds] = None,
        report_timeout: Optional[Seconds] = None,
        abort_grace: Optional[Seconds] = None,
        dump_timeout: Optional[Seconds] = None,
        dump_hold: Optional[float] = None,
        dump_on_failure: Optional[bool] = None,
        dump_signal: Any = None,
        communicators: Callable[[], Iterable[CommView]] = hooks.live_communicators,
        liveness: Optional[bool] = None,
        liveness_interval: Optional[Seconds] = None,
        heartbeat_timeout: Optional[Seconds] = None,
    ) -> None:
        self.recorder = recorder or get_recorder()
        # the monitor thread's rounds, begun and done: a dump signal read in one is queued by its end
        self._rounds_begun = self._rounds_done = 0
        self._lock = threading.Lock()
        self._threads: List[threading.Thread] = []
        self.start_error: Optional[BaseException] = None  # why the threads could not start (start()), else None
        self._stop = threading.Event()
        self._poll_wake = threading.Event()
        self._wake_at = -1.0  # when the polling thread wakes next (0: it is awake; -1: none runs)
        # the earliest deadline announced by work_enqueued: the hook runs before the operation is
        # outstanding, so a round it wakes may not find the operation yet, and waits for this instead
        self._next_due = math.inf
        self._store_wake = threading.Event()
        self._dumps = DumpQueue(lambda: self.dump_hold)
        self._reports: Set[FailureReport] = set()  # failure reports being made, not done yet
        self._report_q: queue.SimpleQueue[Optional[Tuple[Any, FailureReport]]] = queue.SimpleQueue()
        self._wake_r: Optional[socket.socket] = None
        self._wake_w: Optional[socket.socket] = None
        self._signal = DumpSignal(self._poke)
        self._signal.stacks_target = self._stacks_target
        self._stores: Dict[int, _StoreState] = {}
        self._snapshots: Dict[str, Any] = {}  # communicator uid -> its Progress when it failed
        # the records of closed communicators kept for their peers: (when they go, the store, the keys), by time
        self._stale: Deque[Tuple[float, Any, Tuple[str, ...]]] = deque()
        # SIGTERM seen by the monitor thread (the main thread may be blocked inside a call): set by
        # pycoll.diagnostics.exits, called with in_monitor=True
        self.on_terminate: Optional[Callable[[bool], None]] = None
        self.beats = 0
        self._beat_t = time.monotonic()
        self._monitor_t = self._beat_t  # the stall monitor's last look
        self._doing: Optional[str] = None
        self._stalled = False
        self._count_lock = threading.Lock()
        self._failing = 0  # failures being reported now (their dump serves remote requests too)
        self._pid = os.getpid()
        self._comms = communicators
        self.enabled = True
        self._liveness = Liveness(0.2, 5.0, 1.0)
        self._liveness_wake = threading.Event()
        self.configure(enabled=enabled, interval=interval, publish_interval=publish_interval,
                       stall_timeout=stall_timeout, report_timeout=report_timeout, abort_grace=abort_grace,
                       dump_timeout=dump_timeout, dump_hold=dump_hold, dump_on_failure=dump_on_failure,
                       dump_signal=dump_signal, liveness=liveness, liveness_interval=liveness_interval,
                       heartbeat_timeout=heartbeat_timeout, _initial=True)

    def configure(
        self,
        *,
        enabled: Optional[bool] = None,
        interval: Optional[Seconds] = None,
        publish_interval: Optional[Seconds] = None,
        stall_timeout: Optional[Seconds] = None,
        report_timeout: Optional[Seconds] = None,
        abort_grace: Optional[Seconds] = None,
        dump_timeout: Optional[Seconds] = None,
        dump_hold: Optional[float] = None,
        dump_on_failure: Optional[bool] = None,
        dump_signal: Any = None,
        liveness: Optional[bool] = None,
        liveness_interval: Optional[Seconds] = None,
        heartbeat_timeout: Optional[Seconds] = None,
        records_keep: Optional[float] = None,
        _initial: bool = False,
    ) -> None:
        """Change settings (None keeps the current value; at construction, the environment's)."""
        def pick(value: Any, attr: str, env: str, positive: bool = True) -> None:
            if value is not None or _initial:
                setattr(self, attr, _seconds(value, env, attr, positive))

        if enabled is not None or _initial:
            self.enabled = (_settings.flag(enabled, "enabled") if enabled is not None
                            else _settings.get("PYCOLL_WATCHDOG"))
        pick(interval, "interval", "PYCOLL_WATCHDOG_INTERVAL")
        pick(publish_interval, "publish_interval", "PYCOLL_WATCHDOG_PUBLISH_INTERVAL")
        pick(stall_timeout, "stall_timeout", "PYCOLL_WATCHDOG_STALL_TIMEOUT")
        pick(report_timeout, "report_timeout", "PYCOLL_WATCHDOG_REPORT_TIMEOUT", False)
        pick(abort_grace, "abort_grace", "PYCOLL_WATCHDOG_ABORT_GRACE", False)
        pick(dump_timeout, "dump_timeout", "PYCOLL_FR_DUMP_TIMEOUT", False)
        pick(dump_hold, "dump_hold", "PYCOLL_FR_DUMP_HOLD", False)
        pick(liveness_interval, "liveness_interval", "PYCOLL_WATCHDOG_LIVENESS_INTERVAL")
        pick(heartbeat_timeout, "heartbeat_timeout", "PYCOLL_WATCHDOG_HEARTBEAT_TIMEOUT")
        pick(records_keep, "records_keep", "PYCOLL_WATCHDOG_RECORDS_KEEP", False)
        if liveness is not None or _initial:
            self.liveness = (_settings.flag(liveness, "liveness") if liveness is not None
                             else _settings.get("PYCOLL_WATCHDOG_LIVENESS"))
        lv = self._liveness
        lv.interval, lv.heartbeat_timeout, lv.period = self.liveness_interval, self.heartbeat_timeout, \
            self.publish_interval
        self._liveness_wake.set()
        if dump_on_failure is not None or _initial:
            self.dump_on_failure = (_settings.flag(dump_on_failure, "dump_on_failure") if dump_on_failure is not None
                                    else _settings.get("PYCOLL_FR_DUMP_ON_FAILURE"))
        if dump_signal is not None or _initial:
            self._signal.wanted = signal_number(dump_signal if dump_signal is not None
                                                else _settings.get("PYCOLL_FR_DUMP_SIGNAL"))
            if self._signal.wanted is None and self._signal.signum is not None:  # turned off
                if threading.current_thread() is threading.main_thread():
                    self._signal.ignore()  # not its default action: peers may have read it
                else:
                    _log.warning("watchdog: the dump signal can only be turned off from the main thread; %s still "
                                 "dumps", signal.Signals(self._signal.signum).name)
            elif self.running and self._signal.wanted is not None:
                self._signal.install(self._wake_w)
        self._poll_wake.set()

    # -- lifecycle -------------------------------------------------------------------------------

    @property
    def running(self) -> bool:
        """True while the watchdog threads run in this process."""
        return bool(self._threads) and self._pid == os.getpid() and all(t.is_alive() for t in self._threads)

    def start(self) -> None:
        """Start the threads (idempotent; done automatically with the first communicator)."""
        with self._lock:
            if self._pid != os.getpid():
                self.after_fork()
            if self.running:
                return
            try:
                self._start()
            except BaseException as e:  # no fd (RLIMIT_NOFILE) or thread (a pids limit) left: what did start stops
                self.start_error = e
                self._threads = []
                self._end_threads()
                raise
            self.start_error = None
        _log.debug("watchdog started (interval %.3g s, publish %.3g s, stall %.3g s)", self.interval,
                   self.publish_interval, self.stall_timeout)

    def _start(self) -> None:
        self._stop = threading.Event()
        if self._wake_w is None:  # else kept by a stop() off the main thread (still the signals' wake-up fd)
            self._wake_r, self._wake_w = socket.socketpair()
            self._wake_r.setblocking(False)
            self._wake_w.setblocking(False)
        self._beat_t = self._monitor_t = time.monotonic()
        self._stalled = False
        self._report_q = queue.SimpleQueue()
        self._wake_at = 0.0
        self._threads = [
            threading.Thread(target=self._poll_loop, args=(self._stop,), name="pycoll-watchdog", daemon=True),
            threading.Thread(target=self._monitor_loop, args=(self._stop,), name="pycoll-watchdog-monitor",
                             daemon=True),
            threading.Thread(target=self._store_loop, args=(self._stop,), name="pycoll-watchdog-store",
                             daemon=True),
            threading.Thread(target=self._report_loop, args=(self._stop, self._report_q),
                             name="pycoll-watchdog-report", daemon=True),
            threading.Thread(target=self._liveness_loop, args=(self._stop,), name="pycoll-watchdog-liveness",
                             daemon=True),
        ]
        # the dump signal first: the first progress record says whether this process has it
        self._signal.watch_interrupts(self._wake_w)
        if self._signal.wanted is not None:
            self._signal.install(self._wake_w)
        for t in self._threads:
            t.start()

    def _end_threads(self) -> None:
        """Tell the threads to end (they look at ``_stop`` as they wake)."""
        self._stop.set()
        self._poll_wake.set()
        self._store_wake.set()
        self._liveness_wake.set()
        self._report_q.put(None)
        self._poke()

    def stop(self, timeout: Seconds = 5.0) -> None:
        """Stop the threads (they restart with the next communicator if ``enabled``)."""
        timeout = _settings.seconds(timeout, "timeout", positive=False)  # before anything is stopped
        with self._lock:
            threads, self._threads = self._threads, []
            self._end_threads()
        for t in threads:
            if t is not threading.current_thread():
                t.join(timeout)
        self._wake_at = -1.0  # nothing to wake: an operation's hook costs nothing more
        if not self._signal.uninstall(self._wake_w):
            return  # stopped off the main thread: the wake-up socket stays (a restart reuses it)
        for s in (self._wake_r, self._wake_w):
            if s is not None:
                s.close()
        self._wake_r = self._wake_w = None

    @property
    def dump_signal(self) -> Optional[int]:
        """The signal that dumps the flight recorder (``enable_signal``), None while none is installed."""
        return self._signal.signum

    @property
    def owned_by_this_process(self) -> bool:
        """False in a forked child that has not used the watchdog yet (it inherited the parent's state)."""
        return self._pid == os.getpid()

    def after_fork(self) -> None:
        """In a forked child: no thread was inherited (and maybe a lock one of them held); start afresh.

        The child's first communicator starts its own threads. The parent's wake-up socket is closed here, and
        released as the signals' wake-up fd first (its number goes to the next file the child opens)."""
        self._lock = threading.Lock()
        self._count_lock = threading.Lock()
        self._failing = 0
        self._threads = []
        self._stop = threading.Event()
        self._poll_wake = threading.Event()
        self._store_wake = threading.Event()
        self._liveness_wake = threading.Event()
        self._wake_at = -1.0
        self._next_due = math.inf
        self._dumps.reset()
        self._reports = set()
        self._report_q = queue.SimpleQueue()
        self._stores = {}
        self._snapshots = {}
        self._stale = deque()  # the parent's to delete
        self._liveness = Liveness(self.liveness_interval, self.heartbeat_timeout, self.publish_interval)
        self._signal.after_fork(self._wake_w.fileno() if self._wake_w is not None else -1)
        for s in (self._wake_r, self._wake_w):
            if s is not None:
                s.close()
        self._wake_r = self._wake_w = None
        self._stalled = False
        self._doing = None
        self._pid = os.getpid()

    def status(self) -> Dict[str, Any]:
        """Running state and settings (for logs and tests)."""
        return {
            "running": self.running, "enabled": self.enabled, "beats": self.beats,
            "since_last_round_s": time.monotonic() - self._beat_t, "doing": self._doing, "stalled": self._stalled,
            "interval": self.interval, "publish_interval": self.publish_interval,
            "stall_timeout": self.stall_timeout, "dump_signal": self._signal.signum,
            "liveness": self.liveness, "liveness_interval": self.liveness_interval,
            "heartbeat_timeout": self.heartbeat_timeout,
        }

    def arm_dump_signal(self) -> None:
        """Where a dump signal is configured and the watchdog enabled, start the watchdog (and so the signal) now, in
        the main thread, not with the first communicator: :func:`pycoll.init` and :func:`pycoll.join` call it before
        they wait for their peers, so the signal sent to a rank waiting in its init dumps, its stacks saying where it
        waits, instead of ending it (the signal's default action)."""
        if (self.enabled and self._signal.wanted is not None and self._signal.signum is None
                and threading.current_thread() is threading.main_thread()):
            self.enable_signal(self._signal.wanted)  # also where a communicator made in another thread started it

    def enable_signal(self, signum: Any = "SIGUSR1") -> None:
        """Make ``signum`` dump (see :func:`enable_dump_signal`); starts the threads. Main thread only: ValueError
        elsewhere (it returned, the signal left to its default action: the first one killed the process)."""
        if threading.current_thread() is not threading.main_thread():
            raise ValueError("enable_dump_signal() must be called from the main thread: Python runs signal handlers "
                             "there only (or set PYCOLL_FR_DUMP_SIGNAL and make the first communicator in the main "
                             "thread)")
        self._signal.wanted = signal_number(signum)
        if not self.running:
            self.start()
        self._signal.install(self._wake_w)

    # -- observer interface (registered by install()) -------------------------------------------

    work_enqueued = _hooks.watchdog_work_enqueued  # compiled (pycoll/diagnostics/_hooks.pyx)

    def comm_created(self, comm: CommView) -> None:
        exits.arm_sigterm()
        if self.enabled and not self.running:
            self.start()
        self._signal.retitle()  # the rank its stacks file named before may not be this one
        self._store_wake.set()  # the store thread looks at the new communicator's store at once
        if self.enabled:
            # both writes within _CREATED_WRITES_S, whatever the store's own timeout: a peer stopped holding a
            # FileStore's lock file held this init for twice that timeout; the threads' rounds write what is left
            with _settings.requests_until(time.monotonic() + _CREATED_WRITES_S):
                try:  # where this process runs, before the caller goes on (see Liveness.announce)
                    self._liveness.announce(comm)
                except Exception as e:  # the liveness thread's next round tries again
                    _log.debug("watchdog: could not publish this process for %r: %s", comm.name, e)
                if comm.store is not None:
                    # and its progress, in this thread too: a rank killed or stopped before the store thread's first
                    # round is then known to the peers' failure reports as one not seen entering their operation
                    _fp.hit(FP_CREATED)
                    self._publish(comm)

    def comm_closed(self, comm: CommView) -> None:
        """A communicator destroyed without a failure: this rank's records in its store (the process for the peers'
        liveness checks, the progress for their failure reports) have served their purpose and go, so that a store
        through which communicators are made over and over (a weight sync's) does not fill up. A failed or aborted
        communicator's (its failure record too) stay ``records_keep`` seconds, while the peers' reports and liveness
        checks may still read them, and then go (the store thread deletes them): a store shared by a loop of
        failures and recoveries does not fill up either. Those of a process that exits or dies before stay."""
        store = comm.store
        if store is None:
            return
        keys: Tuple[str, ...] = (f"{proc_prefix(comm.uid)}{comm.rank}", f"{progress_prefix(comm.uid)}{comm.rank}")
        if (comm.failure is not None or comm.state != "destroyed") and self.running:  # else no thread would delete them
            with self._lock:
                self._stale.append((time.monotonic() + self.records_keep, store,
                                    (*keys, f"{failure_prefix(comm.uid)}{comm.rank}")))
            # its last state ("aborted"): a peer's failure report does not wait for answers it can no longer give
            self._publish(comm)
            # kept for that one late call, the store must not hold its connections meanwhile: a loop of inits (each
            # with a client of its own) and aborts ran out of descriptors, in the ranks and in the launcher's server
            close_idle = getattr(store, "close_idle", None)
            if close_idle is not None:
                try:
                    close_idle()
                except Exception as e:  # best effort
                    _log.debug("watchdog: could not close the idle connections of %r's store: %s", comm.name, e)
            return
        self._delete(store, keys)

    @staticmethod
    def _delete(store: Any, keys: Sequence[str]) -> None:
        for key in keys:
            try:
                store.delete(key)
            except Exception as e:  # best effort: the store may be going too
                _log.debug("watchdog: could not delete %r: %s", key, e)

    def _forget_stale(self, now: float) -> None:
        """Delete the kept records of closed communicators whose time is up (the store thread)."""
        due = []
        with self._lock:
            while self._stale and self._stale[0][0] <= now:
                due.append(self._stale.popleft())
        for _, store, keys in due:
            _fp.hit(FP_FORGET)
            self._delete(store, keys)

    def comm_failed(self, comm: CommView, exc: BaseException, work: Optional[WorkView]) -> None:
        try:
            self._handle_failure(comm, exc, work)
        except Exception:
            _log.exception("watchdog: reporting the failure of %r failed", comm.name)

    # -- failure handling ------------------------------------------------------------------------

    @property
    def _stale_after(self) -> float:
        return 1.5 * self.publish_interval + 0.25

    def _handle_failure(self, comm: CommView, exc: BaseException, work: Optional[WorkView]) -> None:
        # the facts, read before the policy acts (the issuing stack is formatted later, off this thread)
        issue = issue_record(work) if work is not None else None
        report = FailureReport(comm, exc, work, lambda: format_issue(issue))
        if report.progress is not None:
            self._snapshots[report.uid] = report.progress
            while len(self._snapshots) > 64:
                self._snapshots.pop(next(iter(self._snapshots)))
        with self._count_lock:
            self._failing += 1
        self._reports.add(report)  # wait_for_dumps() waits for it (another thread may see the failure first)
        if report.is_timeout or comm.store is None:
            self._finish_report(comm.store, report)
            report.tell(exc, self._stale_after)  # before the caller sees it
            return
        # an asynchronous or remote error is final: the policy acts at once, and the report (store
        # exchange, the line, the dump) follows in the report thread
        if self.running:
            self._report_q.put((comm.store, report))
        else:
            threading.Thread(target=self._finish_report, args=(comm.store, report, True),
                             name="pycoll-watchdog-report", daemon=True).start()

    def _report_loop(self, stop: threading.Event, q: queue.SimpleQueue[Optional[Tuple[Any, FailureReport]]]) -> None:
        while not stop.is_set():
            item = q.get()
            if item is None:
                return
            self._finish_report(*item, after_gates=True)

    def _finish_report(self, store: Any, report: FailureReport, after_gates: bool = False) -> None:
        report.maker = threading.get_ident()
        with exits.holding_sigterm():  # the main thread's report: a SIGTERM meanwhile waits for it
            self._report(store, report, after_gates)

    def _report(self, store: Any, report: FailureReport, after_gates: bool) -> None:
        try:
            _fp.hit(FP_REPORT)
            if after_gates:  # a recovery in progress goes first (see add_dump_gate)
                deadline = time.monotonic() + self.dump_hold
                while not self._dumps.flushing and not self._dumps.gates_open() and time.monotonic() < deadline:
                    time.sleep(GATE_POLL)
            if store is not None:
                t = threading.Thread(target=self._exchange, args=(store, report), name="pycoll-watchdog-exchange",
                                     daemon=True)
                t.start()
                if not report.exchanged.wait(0 if self.in_monitor_thread() else self.report_timeout):
                    report.store_error = (report.store_error
                                          or f"the store did not answer within {self.report_timeout:g} s")
            _log.error("%s", report.line(self._stale_after))
            self.recorder.add_failure(report.generation, report.as_dict(self._stale_after))
            if self.dump_on_failure:
                # held (at most dump_hold) from the failure on, however long the report itself was held
                self._dump(f"{report.brief()} on {report.comm_name!r}", "failure", 0, created=report.monotonic,
                           generation=report.generation)
        except Exception:
            _log.exception("watchdog: reporting the failure of %r failed", report.comm_name)
        finally:
            with self._count_lock:
                self._failing -= 1
            report.reported.set()
            self._reports.discard(report)

    def _exchange(self, store: Any, report: FailureReport) -> None:
        """Announce the failure, ask every rank to dump, read the others' progress (report thread)."""
        fbase = failure_prefix(report.uid)
        pbase = progress_prefix(report.uid)
        try:
            t0 = time.monotonic()
            if report.progress is not None:  # this rank's own progress at the failure, for the others
                store.set(f"{pbase}{report.rank}", ProgressRecord(report.progress, "failing", time.time_ns(),
                                                                  self.beats, origin()).encode())
            store.set(f"{fbase}{report.rank}", report.record().encode())
            report.request = self._signal_store(store, f"rank {report.global_rank}: {report.brief()} on "
                                                       f"{report.comm_name!r}", _FAILURE, [report.uid])
            answers.await_answers(store, report, t0 + self.abort_grace, self._stale_after, self._stop)
            answers.signal_unanswered(report, self._stale_after)
            if report.is_timeout and report.seq is not None and self.abort_grace > 0:
                waiting = [r for r in report.analysis(self._stale_after)["in_op"] if r not in report.peer_failures]
                if waiting:
                    try:
                        store.wait([f"{fbase}{r}" for r in waiting], timeout=self.abort_grace)
                    except StoreTimeout:
                        pass
                    report.peer_failures = read_records(store, fbase, report.size, FailureRecord.decode, report.rank)
        except Exception as e:  # a store problem must not hide the failure itself
            report.store_error = f"store error: {type(e).__name__}: {e}"
        finally:
            report.exchanged.set()

    def _stacks_target(self) -> Tuple[str, str]:
        folder = os.path.join(self.recorder.dump_dir or default_dump_dir(), STACKS_DIR)
        return folder, f"pycoll rank {self.recorder.global_rank()} pid {os.getpid()} host {socket.gethostname()}"

    # -- dumps -----------------------------------------------------------------------------------

    def dump(self, reason: str = "manual", *, trigger: str = "manual", wait: Optional[Seconds] = None,
             extra: Optional[Dict[str, Any]] = None) -> List[str]:
        """Dump the flight recorder from the monitor thread; wait up to ``wait`` s (None: dump_timeout).

        Without running threads the dump is written in the calling thread. Returns the paths
        written (empty when the wait ended first: the dump still happens). ``extra``: facts added
        to the dump's ``pycoll`` section.
        """
        return self._dump(reason, trigger, None if wait is None else _settings.seconds(wait, "wait", positive=False),
                          extra=extra)

    def _dump(self, reason: str, trigger: str, wait: Optional[float], created: Optional[float] = None,
              extra: Optional[Dict[str, Any]] = None, generation: Optional[int] = None) -> List[str]:
        if not self.running or (trigger == "exit" and self.in_monitor_thread()):  # the monitor cannot wait for itself
            self._dumps.last_start = time.monotonic()
            return self.recorder.dump(reason, trigger=trigger, changed_only=trigger in ("remote", "stall"),
                                      extra=extra, also=() if generation is None else (generation,))
        job = self._queue(DumpJob(reason, trigger, extra, created=created, generation=generation))
        if trigger == "failure":
            self._dumps.last_start = time.monotonic()  # dump requests from the other ranks are served by it
        job.done.wait(self.dump_timeout if wait is None else wait)
        return list(job.paths)

    def _queue(self, job: DumpJob) -> DumpJob:
        self._dumps.submit(job)
        self._poke()
        return job

    def wait_for_dumps(self, timeout: Optional[Seconds] = None) -> bool:
        """Write the reports and dumps queued or held so far, waiting up to ``timeout`` s (None:
        ``dump_timeout``); True when all were written.

        Runs at interpreter exit, so that a failure dump being written when the user's code ends
        is not lost with the daemon threads.
        """
        deadline = time.monotonic() + (self.dump_timeout if timeout is None else
                                       _settings.seconds(timeout, "timeout", positive=False))
        self._dumps.flushing = True  # held reports and dumps go ahead now
        begun = self._rounds_begun
        self._poke()
        try:
            self.wait_for_reports(deadline)  # failure reports still being made queue their dump next
            # a dump signal delivered before now (its byte on the wake-up socket, or pending) is queued by the end of
            # the monitor's first round begun after the poke (the round under way may have missed it; the poke's byte
            # starts the next one at once)
            while (self._rounds_done < begun + 1 and self.running and not self.in_monitor_thread()
                   and time.monotonic() < deadline):
                time.sleep(0.002)
            return self._dumps.wait(deadline)
        finally:
            self._dumps.flushing = False

    def wait_for_reports(self, deadline: float, ending: bool = False) -> None:
        """Wait, until ``time.monotonic()`` reaches ``deadline`` at the latest, for the failure reports other threads
        are making (their line logged, the failure recorded, the dump queued). ``ending``: the process ends (SIGTERM):
        reports a recovery holds back (add_dump_gate) go ahead now, as at exit."""
        if ending:
            self._dumps.flushing = True
        me = threading.get_ident()
        for report in list(self._reports):
            if report.maker != me:  # a report under this very thread (a signal's handler) cannot finish first
                report.reported.wait(max(0.0, deadline - time.monotonic()))

    def signal_all(self, reason: str = "requested") -> int:
        """Ask every process sharing a store with this one's communicators to dump; returns stores told."""
        told = 0
        for store in self._live_stores().values():
            try:
                self._signal_store(store, f"rank {self._my_rank()}: {reason}", _REQUEST, self._uids_on(store))
                told += 1
            except Exception as e:
                _log.warning("watchdog: could not post a dump request to %r: %s", store, e)
        return told

    @staticmethod
    def _signal_store(store: Any, text: str, kind: str, uids: Sequence[str]) -> int:
        """Post a dump request (``kind``: ``_FAILURE``, made by a failure's report, or ``_REQUEST``, asked for by a
        user) about the communicators ``uids``; returns its number."""
        n = int(store.add(SIGNAL_COUNTER, 1))
        store.set(f"{SIGNAL_COUNTER}/{n}", f"{origin()} {kind}@{','.join(uids)} {text}".encode())
        return n

    def _my_rank(self) -> int:
        for c in self._comms():
            return c.global_rank
        return -1

    def _poke(self, byte: int = 0) -> None:
        w = self._wake_w
        if w is not None:
            try:
                w.send(bytes([byte]))
            except OSError:
                pass  # full: the monitor is awake anyway

    def in_monitor_thread(self) -> bool:
        """True in the thread that writes the dumps (which must never wait for another thread's dump)."""
        return threading.current_thread().name == "pycoll-watchdog-monitor"

    # -- threads ---------------------------------------------------------------------------------

    def _poll_loop(self, stop: threading.Event) -> None:
        wake = self._poll_wake
        while not stop.is_set():
            now = time.monotonic()
            self.beats += 1
            self._beat_t = now
            next_t = now + self.interval
            due = self._next_due
            if due <= now:
                self._next_due = math.inf  # past: the scan below finds that operation outstanding
            elif due + 1e-3 < next_t:
                next_t = due + 1e-3
            c: Optional[CommView]
            for c in self._comms():
                if c.state != "active" or c.failure is not None:
                    continue
                self._doing = f"checking communicator {c.name!r}"
                try:
                    c.check()
                except Exception:
                    _log.exception("watchdog: checking %r failed", c.name)
                deadline = c.next_deadline()
                if deadline is not None and deadline + 1e-3 < next_t:
                    next_t = deadline + 1e-3
            c = None  # keep no communicator alive while waiting
            self._doing = None
            self._wake_at = next_t  # from here on an operation due earlier wakes this thread (WatchdogCore)
            due = self._next_due  # ... and one issued during the scan left its deadline here
            if due + 1e-3 < next_t:
                next_t = self._wake_at = due + 1e-3
            wake.wait(max(1e-3, next_t - time.monotonic()))
            wake.clear()
            self._wake_at = 0.0

    def peer_unable(self, comm: CommView, skip: Sequence[int] = ()) -> Optional[Tuple[int, int, str]]:
        """A same-host peer of ``comm`` (not in ``skip``) that is stopped or gone, as ``(rank, pid, why)``, for a
        wait outside any operation (:meth:`.liveness.Liveness.unable_peer`); None when there is none or liveness
        checks are off (``PYCOLL_WATCHDOG_LIVENESS=0``)."""
        if not self.liveness:
            return None
        found = self._liveness.unable_peer(comm, time.monotonic(), skip)
        return None if found is None else (found[0], found[1].pid, found[2])

    def peer_states(self, comm: CommView) -> Optional[Dict[int, Tuple[str, float]]]:
        """The other ranks' states as their last progress records in ``comm``'s store say (a second at most: a
        store that does not answer says nothing); None without a store, or where the records cannot be read."""
        store = comm.store
        if store is None or comm.size < 2:
            return None
        _fp.hit(FP_PEER_STATES)
        try:
            with _settings.requests_until(time.monotonic() + 1.0):
                recs = read_records(store, progress_prefix(comm.uid), comm.size, ProgressRecord.decode, skip=comm.rank)
        except Exception as e:  # best effort: the caller raises its timeout anyway
            _log.debug("watchdog: could not read the peers' records of %r: %s", comm.name, e)
            return None
        now = time.time_ns()
        return {r: (rec.state, max(0.0, (now - rec.time_ns) / 1e9)) for r, rec in recs.items()}

    def _liveness_loop(self, stop: threading.Event) -> None:
        """Watch the peers of outstanding work (:mod:`.liveness`); store calls only once per
        communicator, or for peers on other hosts while an operation is outstanding long."""
        wake = self._liveness_wake
        while not stop.is_set():
            round_all(self._liveness, list(self._comms()), time.monotonic(), self.liveness)
            wake.wait(self.liveness_interval)
            wake.clear()

    def _monitor_loop(self, stop: threading.Event) -> None:
        r = self._wake_r
        assert r is not None
        period = min(1.0, self.stall_timeout / 4)
        sig = self._signal
        while not stop.is_set():
            try:
                ready, _, _ = select.select([r], [], [], GATE_POLL if self._dumps.holding else period)
            except (OSError, ValueError):
                return  # closed by stop()
            self._rounds_begun += 1
            signalled = False
            if ready:
                try:
                    data = r.recv(4096)
                except (BlockingIOError, InterruptedError):
                    data = b""
                except OSError:
                    return
                signalled = sig.signum is not None and sig.signum in data and sig.still_ours()
                if signal.SIGINT in data:
                    self._interrupted()
                hook = self.on_terminate
                if hook is not None and signal.SIGTERM in data:
                    hook(True)
            if stop.is_set():
                return
            if sig.pending:
                sig.pending = False
                signalled = True
            if signalled:  # submitted, so that exit waits for it (wait_for_dumps)
                self._dumps.submit(DumpJob(f"signal {signal.Signals(sig.signum).name if sig.signum else '?'}",
                                           "signal"))
            jobs = self._dumps.take()
            if jobs:
                self._dumps.run(jobs, self.recorder.dump)
            self._check_stall()
            self._rounds_done += 1

    def _interrupted(self) -> None:
        """SIGINT arrived: fail the communicators the main thread is blocked in (the main thread
        raises KeyboardInterrupt as soon as the call returns; failing unblocks it and tells the peers).
        Only under Python's own handler: a program's handler (a "stop after this step" flag) decides itself, and
        runs when the wait looks at signals; the operation goes on."""
        if signal.getsignal(signal.SIGINT) is not signal.default_int_handler:
            return
        main = threading.main_thread().ident
        for c in self._comms():
            if c.busy_thread == main and c.state == "active":
                outstanding = c.outstanding()
                c.fail(CommAborted(f"communicator {c.name!r} rank {c.rank}: the main thread was interrupted "
                                   "(SIGINT) inside an operation"), outstanding[-1] if outstanding else None)

    # -- dump gates: recovery first, then the failure dumps ---------------------------------------

    def add_dump_gate(self, gate: Callable[[], bool]) -> int:
        """Hold this process's failure reports and dumps (and dumps asked for by other ranks) while
        ``gate()`` is False.

        The elastic layer holds them while it rebuilds a failed communicator, so that the report's
        store traffic and the dump's formatting never slow the recovery down; what they say is
        fixed when the failure is recorded. A timeout's report is made before its policy acts and is
        never held; its dump is. A report or dump waits at most ``dump_hold`` seconds from the
        failure, and never at exit. Returns a token for :meth:`remove_dump_gate`.
        """
        return self._dumps.add_gate(gate)

    def remove_dump_gate(self, token: int) -> None:
        """Forget a gate (the dumps it held are written now)."""
        self._dumps.remove_gate(token)
        self._poke()

    def release_dumps(self) -> None:
        """Tell the monitor thread to look at the gates again now (e.g. after a recovery)."""
        self._poke()

    def _check_stall(self) -> None:
        if not self.running:
            return
        now = time.monotonic()
        # this thread looks every stall_timeout / 4 at most: held up past half of it, it was kept from running as
        # the polling thread was -- the process was (the main thread holding the GIL in a C call, a SIGSTOP), not
        # the polling thread: look again once both have had their turn (an idle job's GIL hold was reported as the
        # watchdog's own stall, with its stack, and dumped)
        held, self._monitor_t = now - self._monitor_t > self.stall_timeout / 2, now
        silent = now - self._beat_t
        limit = self.stall_timeout + self.interval  # an idle polling thread sleeps up to its interval between rounds
        if held and not self._stalled:
            return
        if silent > limit and not self._stalled:
            self._stalled = True
            ident = self._threads[0].ident if self._threads else None
            frame = sys._current_frames().get(ident) if ident is not None else None
            stack = "".join(traceback.format_stack(frame)).rstrip() if frame is not None else "(no stack)"
            _log.error("pycoll watchdog: the polling thread has not completed a round for %.1f s (%s); timeouts "
                       "are not being detected. Its stack:\n%s", silent, self._doing or "idle", stack)
            self._dumps.run([DumpJob(f"watchdog stalled for {silent:.1f} s ({self._doing or 'idle'})", "stall")],
                            self.recorder.dump)
        elif self._stalled and silent < limit:
            self._stalled = False
            _log.warning("pycoll watchdog: the polling thread is running again")

    # -- the store channel: progress, heartbeats, dump requests -----------------------------------

    def _live_stores(self) -> Dict[int, Any]:
        return {id(c.store): c.store for c in self._comms() if c.store is not None}

    def _uids_on(self, store: Any) -> List[str]:
        """The uids of this process's communicators on ``store`` (the ones its dump requests are about)."""
        return [c.uid for c in self._comms() if c.store is store]

    def _store_loop(self, stop: threading.Event) -> None:
        while not stop.is_set():
            t0 = time.monotonic()
            self._forget_stale(t0)
            comms = [c for c in self._comms() if c.store is not None]
            c: Optional[CommView]
            for c in comms:
                self._publish(c)
            stores = {id(c.store): c.store for c in comms}
            for key in list(self._stores):
                if key not in stores:
                    del self._stores[key]
            comms = []
            c = None  # keep no communicator alive while waiting
            first = True
            for key, store in stores.items():
                st = self._stores.get(key)
                if st is None or st.store is not store:
                    st = self._stores[key] = _StoreState(store)
                remaining = self.publish_interval - (time.monotonic() - t0)
                self._watch_signal(st, remaining if first else 0.0)
                first = False
                if stop.is_set():
                    return
            if not stores:
                self._store_wake.wait(self.publish_interval)
                self._store_wake.clear()

    def _publish(self, c: CommView, request: Optional[int] = None) -> None:
        if request is None:
            st = self._stores.get(id(c.store))
            request = st.answered if st is not None and st.store is c.store else -1
        try:
            # a failed communicator's progress is the one frozen at its failure (its policy released
            # the outstanding operations since)
            progress = self._snapshots.get(c.uid) if c.failure is not None else None
            rec = ProgressRecord(progress or c.progress(), c.state, time.time_ns(), self.beats, origin(), request,
                                 self._signal.signum or 0)
            key = f"{progress_prefix(c.uid)}{c.rank}"
            c.store.set(key, rec.encode())
            if c.state == "destroyed" and c.failure is None:  # destroyed meanwhile: comm_closed's delete came first
                c.store.delete(key)
        except Exception as e:
            _log.debug("watchdog: could not publish the progress of %r: %s", c.name, e)

    def _watch_signal(self, st: _StoreState, wait: float) -> None:
        store = st.store
        try:
            if st.last_seen is None:
                _fp.hit(FP_FIRST_LOOK)
                st.first_seen = int(store.add(SIGNAL_COUNTER, 0))
                st.last_seen = max(0, st.first_seen - _LOOK_BACK)
            nxt = f"{SIGNAL_COUNTER}/{st.last_seen + 1}"
            if wait > 0:
                try:
                    store.wait([nxt], timeout=wait)
                except StoreTimeout:
                    return
            elif not store.check([nxt]):
                return
            n = int(store.add(SIGNAL_COUNTER, 0))
            keys = [f"{SIGNAL_COUNTER}/{i}" for i in range(st.last_seen + 1, n + 1)]
            st.last_seen = n
            texts = [_decode(v) for v in store.multi_get(keys, timeout=1.0)] if keys else []
        except Exception as e:
            _log.debug("watchdog: watching dump requests on %r failed: %s", store, e)
            if wait > 0:
                self._stop.wait(min(wait, self.publish_interval))
            return
        me = origin() + " "
        mine = set(self._uids_on(store))
        foreign = []  # (kind, text, uids) each
        for i, t in zip(range(n - len(texts) + 1, n + 1), texts, strict=True):
            parts = t.split(" ", 2)  # origin, kind@uids, text
            kind, _, uids = parts[1].partition("@") if len(parts) == 3 else ("", "", "")
            if kind and not t.startswith(me) and (i > st.first_seen or mine & set(uids.split(","))):
                foreign.append((kind, parts[2], uids.split(",")))
        if not foreign:
            return
        # answer at once with this rank's progress (the asking rank waits briefly for it), whatever
        # the other threads of this process are doing
        _fp.hit(FP_ANSWER)
        st.answered = n
        for c in self._comms():
            if c.store is store:
                self._publish(c, n)
        # a request that another rank's failure made is served as this rank's own failure would be: not with
        # PYCOLL_FR_DUMP_ON_FAILURE=0 here (its progress is answered all the same); one a user asked for always
        asked = [f[1] for f in foreign if self.dump_on_failure or f[0] != _FAILURE]
        if not asked:
            _log.debug("watchdog: no dump for the failure elsewhere (%s): dumps on failure are off", foreign[0][1])
            return
        if self._failing or time.monotonic() - self._dumps.last_start < self.publish_interval:
            _log.debug("watchdog: dump request (%s) served by the dump made just now", asked[0])
            return
        # the communicators whose failure asked for it (where no user asked too): pycoll-fr reads this rank's other
        # communicators as bystanders, dumped while they ran, not as diverged
        failed = [] if any(f[0] != _FAILURE for f in foreign) else sorted({u for f in foreign for u in f[2] if u})
        self._queue(DumpJob("requested by " + "; ".join(dict.fromkeys(asked)), "remote",
                            {"failed_uids": failed} if failed else None))


# -- the process's watchdog ---------------------------------------------------------------------------

_watchdog: Optional[Watchdog] = None
_wd_lock = threading.Lock()
_installed = False


def get_watchdog() -> Watchdog:
    """The process-wide watchdog (created from the environment on first use)."""
    global _watchdog
    if _watchdog is None:
        with _wd_lock:
            if _watchdog is None:
                _watchdog = Watchdog()
    return _watchdog


def configure(**settings: Any) -> Watchdog:
    """Change the process-wide watchdog's settings (see :class:`Watchdog`); returns it."""
    wd = get_watchdog()
    wd.configure(**settings)
    if wd.enabled and not wd.running and hooks.live_communicators():
        wd.start()
    elif not wd.enabled and wd.running:
        wd.stop()
    return wd


def enable_dump_signal(signum: Any = "SIGUSR1") -> None:
    """Make ``signum`` dump the flight recorder without stopping anything. Call from the main thread (ValueError
    elsewhere).

    The handler only wakes the watchdog's monitor thread, which dumps, even while the main thread is
    blocked inside a collective.
    """
    get_watchdog().enable_signal(signum)


def dump_flight_recorder(
    reason: str = "manual",
    *,
    dump_dir: Optional[Union[str, os.PathLike]] = None,
    all_ranks: bool = False,
    stacks: bool = True,
    write_json: Optional[bool] = None,
) -> List[str]:
    """Dump this process's flight recorder now; return the files written. Stops nothing.

    With ``all_ranks=True`` every other process sharing a store with this one's communicators is
    asked to dump too (through the store; their watchdogs act on it within about a second), each into its own dump
    folder (its ``PYCOLL_FR_DUMP_DIR``, else the default), not ``dump_dir``: give every rank the same
    ``PYCOLL_FR_DUMP_DIR`` to find them all in one folder. Every dump logs where it went.
    """
    paths = get_recorder().dump(reason, trigger="manual", dump_dir=dump_dir, stacks=stacks, write_json=write_json)
    if all_ranks:
        get_watchdog().signal_all(reason)
    return paths


def install(rank: Optional[int] = None, global_ranks: Any = None) -> None:
    """Register the flight recorder and the watchdog with every communicator (idempotent).

    :func:`pycoll.init` and :func:`pycoll.join` call it before they build a communicator; importing
    pycoll has no side effect. The recorder is registered first: it freezes a failed operation's
    state before the watchdog reports it. Each call also installs a configured dump signal not installed yet
    (:meth:`Watchdog.arm_dump_signal`); ``rank`` and ``global_ranks``: those of the init about to wait for its
    peers, which name this process's dumps and stacks until its communicator exists.
    """
    global _installed
    with _wd_lock:
        first, _installed = not _installed, True
    if first:
        register_exit()  # its exit handler runs after the three below: the dump signal is ignored from then on
        hooks.add_observer(get_recorder())
        hooks.add_observer(get_watchdog())
        torch_store.register_exit_gate()  # its exit handler runs after the two below: reports may use the store
        atexit.register(_wait_for_dumps_at_exit)
        exits.install(get_watchdog())  # its exit handler runs before the one above
    if rank is not None:
        get_recorder().note_init_rank(rank, global_ranks)
    get_watchdog().arm_dump_signal()


def _wait_for_dumps_at_exit() -> None:
    wd = _watchdog
    try:
        if wd is not None and wd.owned_by_this_process and not wd.wait_for_dumps():
            _log.warning("watchdog: a flight-recorder dump was still being written at exit (dump_timeout %.3g s); "
                         "its unfinished file is removed", wd.dump_timeout)
            remove_unfinished()
    except KeyboardInterrupt:  # a second Ctrl-C as the process ends: said so, not a traceback of this wait
        _log.warning("watchdog: interrupted (SIGINT) while waiting at exit for the failure reports and dumps; "
                     "they may be incomplete")


_forking = threading.local()  # the forking thread's signal mask before fork() (see _fork_begins)


def _fork_begins() -> None:
    """Before ``fork()``: block, in the forking thread, the signals pycoll handles, until the child has reset them
    (``_reinit_after_fork``) and the parent goes on. A signal the child got in between was lost to its Python-level
    handler (CPython forgets the signals that came before its own after-fork setup: ``Pool.terminate()`` then waited
    for ever for a worker that its SIGTERM never ended), or woke the parent through the wake-up socket both share
    until then (the parent ended by its child's SIGTERM). Blocked, it waits in the kernel and comes once reset."""
    signals = {signal.SIGTERM, signal.SIGINT}
    wanted = _watchdog.dump_signal if _watchdog is not None else None
    if wanted is not None:
        signals.add(signal.Signals(wanted))
    try:
        _forking.mask = signal.pthread_sigmask(signal.SIG_BLOCK, signals)
    except (OSError, ValueError):
        _forking.mask = None


def _fork_ends() -> None:
    """After ``fork()``, in the parent and (last) in the child: the forking thread's mask as it was."""
    mask, _forking.mask = getattr(_forking, "mask", None), None
    if mask is not None:
        try:
            signal.pthread_sigmask(signal.SIG_SETMASK, mask)
        except (OSError, ValueError):
            pass


def _reinit_after_fork() -> None:
    try:
        if _watchdog is not None:
            _watchdog.after_fork()
        _recorder_module.after_fork()
        exits.after_fork()
    finally:
        _fork_ends()  # what came meanwhile is delivered now


if hasattr(os, "register_at_fork"):
    os.register_at_fork(before=_fork_begins, after_in_parent=_fork_ends, after_in_child=_reinit_after_fork)
