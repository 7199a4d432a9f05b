"""Watchdog: every hang or communicator error becomes a diagnosis within seconds.

One watchdog per process starts with the first :class:`~pycoll.Communicator` (``PYCOLL_WATCHDOG=0``
keeps it off). It runs four daemon threads:

* ``pycoll-watchdog`` polls every live communicator (``Communicator._check``: event queries and
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

When an operation times out (whichever thread sees it: the watchdog, or the user's thread in
``wait()``), before the communicator's policy acts (abort, revoke or report; see
:class:`~pycoll.Communicator`):

1. the failure is announced in the store and every other rank is asked to dump (they dump although
   they are not hung); the other ranks' progress and heartbeats are read, and ranks stuck in the
   same operation are given ``abort_grace`` seconds to reach their own verdict, so that every rank
   reports the root cause rather than "rank k aborted";
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

Configuration (arguments of :class:`Watchdog` / :func:`configure`, else environment; seconds):

===================================  =======  ===================================================
``PYCOLL_WATCHDOG``                  1        0: no watchdog threads
``PYCOLL_WATCHDOG_INTERVAL``         0.1      polling period (<= 0.1 is advised)
``PYCOLL_WATCHDOG_PUBLISH_INTERVAL`` 1        progress/heartbeat publication and dump-request polling
``PYCOLL_WATCHDOG_STALL_TIMEOUT``    15       a polling thread silent this long is reported (and dumped)
``PYCOLL_WATCHDOG_REPORT_TIMEOUT``   2        longest wait for the store when reporting a failure
``PYCOLL_WATCHDOG_ABORT_GRACE``      0.5      longest wait for ranks stuck in the same operation
``PYCOLL_FR_DUMP_TIMEOUT``           5        longest wait at exit for a dump still being written
``PYCOLL_FR_DUMP_HOLD``              10       longest a recovery may hold a failure dump back
``PYCOLL_FR_DUMP_ON_FAILURE``        1        dump when a communicator fails
``PYCOLL_FR_DUMP_SIGNAL``            off      ``1``/``SIGUSR1``/``SIGUSR2``: dump on that signal
===================================  =======  ===================================================

Store keys (under ``pycoll/fr/``): ``progress/<uid>/<rank>``, ``failure/<uid>/<rank>``,
``dump_signal`` (a counter) and ``dump_signal/<n>``.
"""

from __future__ import annotations

import atexit
import collections
import itertools
import logging
import os
import queue
import select
import signal
import socket
import sys
import threading
import time
import traceback
from typing import Any, Callable, Deque, Dict, List, Optional, Set, Tuple

from . import comm as _comm
from .errors import CommTimeout, StoreTimeout
from ._settings import env_bool, env_seconds
from .flight_recorder import FlightRecorder, _progress, get_recorder

__all__ = ["Watchdog", "get_watchdog", "configure", "install", "enable_dump_signal", "KEY_PREFIX"]

_log = logging.getLogger("pycoll.watchdog")

KEY_PREFIX = "pycoll/fr/"
_SIGNAL_COUNTER = KEY_PREFIX + "dump_signal"


_HOLDABLE = ("failure", "remote")  # dump triggers a gate may hold back
_GATE_POLL = 0.02  # how often held dumps look at the gates


def _origin() -> str:
    """This process, as named in store values (the pid is read each time: processes fork)."""
    return f"{socket.gethostname()}:{os.getpid()}"


def _seconds(value: Optional[float], env: str, default: float, what: str, *, positive: bool = True) -> float:
    if value is None:
        value = env_seconds(env, default, positive=False)
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"{what} must be a number of seconds, got {type(value).__name__}")
    if (positive and not value > 0) or value < 0:
        raise ValueError(f"{what} must be {'> 0' if positive else '>= 0'} seconds, got {value}")
    return float(value)


def _signal_number(spec: Any) -> Optional[int]:
    """None (off) or a signal number, from True/False/int/'SIGUSR1'/'USR2'/'1'/'0'."""
    if spec is None or spec is False:
        return None
    if spec is True:
        return int(signal.SIGUSR1)
    if isinstance(spec, int):
        return int(spec) if spec > 0 else None
    text = str(spec).strip().upper()
    if text in ("", "0", "OFF", "FALSE", "NO"):
        return None
    if text in ("1", "ON", "TRUE", "YES"):
        return int(signal.SIGUSR1)
    name = text if text.startswith("SIG") else "SIG" + text
    try:
        return int(getattr(signal, name))
    except AttributeError:
        raise ValueError(f"unknown signal {spec!r} (use SIGUSR1 or SIGUSR2)") from None


def _fmt_ranks(ranks: List[int]) -> str:
    return ", ".join(str(r) for r in sorted(ranks))


class _DumpJob:
    __slots__ = ("reason", "trigger", "done", "paths", "extra", "created")

    def __init__(self, reason: str, trigger: str, extra: Optional[Dict[str, Any]] = None,
                 created: Optional[float] = None) -> None:
        self.created = time.monotonic() if created is None else created  # a gate holds it dump_hold from here
        self.reason = reason
        self.trigger = trigger
        self.extra = extra
        self.done = threading.Event()
        self.paths: List[str] = []


class _StoreState:
    __slots__ = ("store", "last_seen")

    def __init__(self, store: Any) -> None:
        self.store = store
        self.last_seen: Optional[int] = None


def _decode(raw: Any) -> str:
    return raw.decode("utf-8", "replace") if isinstance(raw, (bytes, bytearray)) else str(raw)


def _parse_progress(text: str) -> Optional[Dict[str, Any]]:
    # "v1 coll_enq coll_started coll_done p2p_enq p2p_done state time_ns beats origin"
    parts = text.split(" ")
    if len(parts) < 10 or parts[0] != "v1":
        return None
    try:
        return {
            "coll_enqueued": int(parts[1]), "coll_started": int(parts[2]), "coll_completed": int(parts[3]),
            "p2p_enqueued": int(parts[4]), "p2p_completed": int(parts[5]), "state": parts[6],
            "time_ns": int(parts[7]), "beats": int(parts[8]), "origin": parts[9],
        }
    except ValueError:
        return None


class _FailureReport:
    """What a failing rank knows and learns from the store; becomes the log line and the dump's record."""

    def __init__(self, comm: Any, exc: BaseException, work: Any) -> None:
        self.time = time.time()
        self.monotonic = time.monotonic()
        self.comm_name = comm.name
        self.uid = comm.uid
        self.rank = comm.rank
        self.size = comm.size
        self.global_rank = comm.global_rank
        self.global_ranks = tuple(comm.global_ranks) if comm.global_ranks is not None else None
        self.generation = int(getattr(comm, "generation", 0) or 0)
        self.policy = comm.on_failure
        self.error_type = type(exc).__name__
        self.message = str(exc)
        self.is_timeout = isinstance(exc, CommTimeout)
        self.op = self.seq = self.elapsed = self.timeout = self.state = None
        self.is_p2p = False
        self.peer: Optional[int] = None
        self.site = ""
        self.sizes = ""
        if work is not None:
            self.op = work.op
            self.is_p2p = bool(work.is_p2p)
            self.seq = work.p2p_seq if work.is_p2p else work.seq
            self.peer = work.peer
            self.elapsed = time.monotonic() - work.t0
            self.timeout = work.timeout
            self.state = work._state
            self.site, self.sizes = _site_of(work)
        self.peers: Optional[Dict[int, Dict[str, Any]]] = None  # rank -> progress (None: not read)
        self.peer_failures: Dict[int, str] = {}
        self.store_error = ""
        self.done = threading.Event()  # the store exchange is over
        self.finished = threading.Event()  # the line is logged and the dump queued

    def analysis(self, stale_after: float) -> Dict[str, Any]:
        """Classify the other ranks from their published progress (empty when it could not be read).

        ``behind``: rank -> (last issued sequence id, seconds since its last report) for ranks that
        had not issued this operation; ``in_op``: ranks that issued it and had not completed it;
        ``silent``: rank -> seconds since the last report, for reports older than ``stale_after``;
        ``unknown``: ranks that never reported (and did not report a failure).
        """
        behind: Dict[int, Tuple[int, float]] = {}
        same: List[int] = []
        silent: Dict[int, float] = {}
        unknown: List[int] = []
        out = {"behind": behind, "in_op": same, "silent": silent, "unknown": unknown}
        if self.peers is None:
            return out
        now_ns = int(self.time * 1e9)  # ages at the failure, also when the report is made later
        for r in range(self.size):
            if r == self.rank:
                continue
            p = self.peers.get(r)
            if p is None:
                if r not in self.peer_failures:
                    unknown.append(r)
                continue
            age = max(0.0, (now_ns - p["time_ns"]) / 1e9)
            if age > stale_after and r not in self.peer_failures:
                silent[r] = age
            if self.seq is None:
                continue
            # a rank that reported its own failure in this very operation issued it, whatever its
            # last progress report (published every publish_interval) says
            failed_here = f" in {self.op} #{self.seq} " in f" {self.peer_failures.get(r, '')}"
            if self.is_p2p:
                if r == self.peer:
                    behind[r] = (p["p2p_enqueued"], age)
            elif p["coll_enqueued"] < self.seq and not failed_here:
                behind[r] = (p["coll_enqueued"], age)
            elif p["coll_completed"] < self.seq:
                same.append(r)
        return out

    def line(self, stale_after: float) -> str:
        head = (f"pycoll watchdog: {self.error_type} on communicator {self.comm_name!r} (uid {self.uid}, "
                f"generation {self.generation}) rank {self.rank}/{self.size}")
        if self.global_rank != self.rank:
            head += f" (global {self.global_rank})"
        parts = [head]
        if self.op is not None:
            what = f"{self.op} #{self.seq}" + (f" with peer {self.peer}" if self.is_p2p else "")
            if self.sizes:
                what += f" [{self.sizes}]"
            if self.is_timeout:
                parts.append(f"{what} not completed after {self.elapsed:.2f} s (timeout {self.timeout:g} s, "
                             f"state {self.state})")
            else:
                parts.append(f"{self.message}; in flight: {what} for {self.elapsed:.2f} s (state {self.state})")
            if self.site:
                parts.append(f"issued at {self.site}")
        else:
            parts.append(self.message)
        a = self.analysis(stale_after)
        if self.peers is None:
            parts.append(f"other ranks' progress unknown ({self.store_error or 'no store'})")
        else:
            items = []
            for r, (last, age) in sorted(a["behind"].items()):
                kind = "p2p " if self.is_p2p else ""
                who = f"rank {r}" + (f" (global {self.global_ranks[r]})" if self.global_ranks and
                                     self.global_ranks[r] != r else "")
                if r in a["silent"]:
                    items.append(f"{who} (last reported {kind}#{last} {age:.1f} s ago: stopped, hung or dead)")
                elif r in self.peer_failures:
                    items.append(f"{who} (failed at {kind}#{last})")
                else:
                    items.append(f"{who} (alive, last issued {kind}#{last})")
            if items:
                parts.append(("peer: " if self.is_p2p else "behind: ") + "; ".join(items))
            elif self.op is not None and not self.is_p2p:
                parts.append(f"no rank is behind: every rank issued #{self.seq}")
            if a["in_op"]:
                parts.append(f"also in #{self.seq}: ranks {_fmt_ranks(a['in_op'])}")
            others = {r: age for r, age in a["silent"].items() if r not in a["behind"]}
            if others:
                parts.append("silent: " + "; ".join(f"rank {r} (no report for {age:.1f} s)"
                                                     for r, age in sorted(others.items())))
            if a["unknown"]:
                parts.append(f"never reported: ranks {_fmt_ranks(a['unknown'])}")
        if self.peer_failures:
            parts.append("failed too: " + "; ".join(f"rank {r}: {txt}" for r, txt in sorted(self.peer_failures.items())))
        parts.append(f"policy: {self.policy}")
        return "; ".join(parts)

    def as_dict(self, stale_after: float) -> Dict[str, Any]:
        a = self.analysis(stale_after)
        return {
            "time": self.time, "comm": self.comm_name, "uid": self.uid, "rank": self.rank, "size": self.size,
            "global_rank": self.global_rank, "generation": self.generation, "error_type": self.error_type,
            "message": self.message, "op": self.op, "seq": self.seq, "is_p2p": self.is_p2p, "peer": self.peer,
            "elapsed_s": self.elapsed, "timeout_s": self.timeout, "state": self.state, "site": self.site,
            "policy": self.policy, "peers": {str(r): p for r, p in (self.peers or {}).items()},
            "peers_known": self.peers is not None, "peer_failures": {str(r): t for r, t in self.peer_failures.items()},
            "behind": {str(r): {"last_issued": last, "report_age_s": age} for r, (last, age) in a["behind"].items()},
            "in_op": a["in_op"],
            "silent": {str(r): age for r, age in a["silent"].items()}, "unknown": a["unknown"],
            "store_error": self.store_error,
        }

    def brief(self) -> str:
        """What the other ranks read in the store."""
        if self.op is None:
            return f"{self.error_type}: {self.message}"[:300]
        return f"{self.error_type} in {self.op} #{self.seq} after {self.elapsed:.2f} s"


def _site_of(work: Any) -> Tuple[str, str]:
    """('file:line in function' of the innermost user frame, 'Float(2,)') from the flight-recorder entry."""
    from .flight_recorder import _IDT, _ISZ, _STACK, _dtypes, _format_stack, _sizes, is_runtime_frame

    entry = work.fr_entry
    if entry is None:
        return "", ""
    sizes = ", ".join(f"{dt}{tuple(s)}" for s, dt in zip(_sizes(entry[_ISZ]), _dtypes(entry[_IDT])))
    site = ""
    frames = _format_stack(entry[_STACK], {}) if entry[_STACK] else []
    for fr in frames:
        if not is_runtime_frame(fr["filename"]):
            site = f"{fr['filename']}:{fr['line']} in {fr['name']}"
            break
    return site, sizes


class Watchdog:
    """The process's watchdog (see the module documentation). Use :func:`get_watchdog`.

    Args (None: the environment variable, else the default; seconds):
        recorder: the flight recorder to dump (default: the process's).
        enabled: start threads with the first communicator (``PYCOLL_WATCHDOG``).
        interval: polling period.
        publish_interval: progress/heartbeat publication and dump-request polling period.
        stall_timeout: a polling thread that has not completed a round for this long is reported.
        report_timeout: longest wait for the store while reporting a failure.
        abort_grace: longest wait for ranks stuck in the same operation to reach their verdict.
        dump_timeout: longest wait at exit (and in :meth:`dump`) for a dump being written.
        dump_hold: longest time a dump gate (:meth:`add_dump_gate`) may hold a failure dump back.
        dump_on_failure: dump when a communicator fails.
        dump_signal: a signal (``"SIGUSR1"``, True for SIGUSR1) whose delivery dumps; off by default.
    """

    reports_failures = True  # tells the communicator not to log the failure itself

    def __init__(
        self,
        recorder: Optional[FlightRecorder] = None,
        *,
        enabled: Optional[bool] = None,
        interval: Optional[float] = None,
        publish_interval: Optional[float] = None,
        stall_timeout: Optional[float] = None,
        report_timeout: Optional[float] = None,
        abort_grace: Optional[float] = None,
        dump_timeout: Optional[float] = None,
        dump_hold: Optional[float] = None,
        dump_on_failure: Optional[bool] = None,
        dump_signal: Any = None,
    ) -> None:
        self.recorder = recorder or get_recorder()
        # the recorder's hot path is called directly by the communicator's observer dispatch
        self.work_enqueued = self.recorder.work_enqueued
        self._lock = threading.Lock()
        self._threads: List[threading.Thread] = []
        self._stop = threading.Event()
        self._poll_wake = threading.Event()
        self._store_wake = threading.Event()
        self._jobs: Deque[_DumpJob] = collections.deque()
        self._unfinished: Set[_DumpJob] = set()  # queued or being written
        self._reports: Set[_FailureReport] = set()  # failure reports made by the report thread, not done yet
        self._report_q: "queue.SimpleQueue[Optional[Tuple[Any, _FailureReport]]]" = queue.SimpleQueue()
        self._held: List[_DumpJob] = []  # failure/remote dumps waiting for the gates (monitor thread only)
        self._gates: Dict[int, Callable[[], bool]] = {}
        self._gate_ids = itertools.count(1)
        self._flushing = False
        self._wake_r: Optional[socket.socket] = None
        self._wake_w: Optional[socket.socket] = None
        self._signum: Optional[int] = None
        self._signal_pending = False
        self._stores: Dict[int, _StoreState] = {}
        self.beats = 0
        self._beat_t = time.monotonic()
        self._doing: Optional[str] = None
        self._stalled = False
        self._last_dump_start = -1e9
        self._count_lock = threading.Lock()
        self._failing = 0  # failures being reported now (their dump serves remote requests too)
        self._pid = os.getpid()
        self._active = False  # cheap form of `running`, read before every blocking host operation
        self._comms = _comm.live_communicators  # what is watched (tests substitute their own)
        self.enabled = True
        self.configure(enabled=enabled, interval=interval, publish_interval=publish_interval,
                       stall_timeout=stall_timeout, report_timeout=report_timeout, abort_grace=abort_grace,
                       dump_timeout=dump_timeout, dump_hold=dump_hold, dump_on_failure=dump_on_failure,
                       dump_signal=dump_signal, _initial=True)

    def configure(
        self,
        *,
        enabled: Optional[bool] = None,
        interval: Optional[float] = None,
        publish_interval: Optional[float] = None,
        stall_timeout: Optional[float] = None,
        report_timeout: Optional[float] = None,
        abort_grace: Optional[float] = None,
        dump_timeout: Optional[float] = None,
        dump_hold: Optional[float] = None,
        dump_on_failure: Optional[bool] = None,
        dump_signal: Any = None,
        _initial: bool = False,
    ) -> None:
        """Change settings (None keeps the current value; at construction, the environment's)."""
        def pick(value: Any, attr: str, env: str, default: float, what: str, positive: bool = True) -> None:
            if value is not None or _initial:
                setattr(self, attr, _seconds(value, env, default, what, positive=positive))

        if enabled is not None or _initial:
            self.enabled = bool(enabled) if enabled is not None else env_bool("PYCOLL_WATCHDOG", True)
        pick(interval, "interval", "PYCOLL_WATCHDOG_INTERVAL", 0.1, "interval")
        pick(publish_interval, "publish_interval", "PYCOLL_WATCHDOG_PUBLISH_INTERVAL", 1.0, "publish_interval")
        pick(stall_timeout, "stall_timeout", "PYCOLL_WATCHDOG_STALL_TIMEOUT", 15.0, "stall_timeout")
        pick(report_timeout, "report_timeout", "PYCOLL_WATCHDOG_REPORT_TIMEOUT", 2.0, "report_timeout", False)
        pick(abort_grace, "abort_grace", "PYCOLL_WATCHDOG_ABORT_GRACE", 0.5, "abort_grace", False)
        pick(dump_timeout, "dump_timeout", "PYCOLL_FR_DUMP_TIMEOUT", 5.0, "dump_timeout", False)
        pick(dump_hold, "dump_hold", "PYCOLL_FR_DUMP_HOLD", 10.0, "dump_hold", False)
        if dump_on_failure is not None or _initial:
            self.dump_on_failure = (bool(dump_on_failure) if dump_on_failure is not None
                                    else env_bool("PYCOLL_FR_DUMP_ON_FAILURE", True))
        if dump_signal is not None or _initial:
            self._want_signal = _signal_number(dump_signal if dump_signal is not None
                                               else os.environ.get("PYCOLL_FR_DUMP_SIGNAL"))
            if self.running and self._want_signal is not None:
                self._install_signal()
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
                self._after_fork()
            if self.running:
                return
            self._stop = threading.Event()
            self._wake_r, self._wake_w = socket.socketpair()
            self._wake_r.setblocking(False)
            self._wake_w.setblocking(False)
            self._beat_t = time.monotonic()
            self._stalled = False
            self._report_q = queue.SimpleQueue()
            self._threads = [
                threading.Thread(target=self._poll_loop, args=(self._stop,), name="pycoll-watchdog", daemon=True),
                threading.Thread(target=self._monitor_loop, args=(self._stop,), name="pycoll-watchdog-monitor",
                                 daemon=True),
                threading.Thread(target=self._store_loop, args=(self._stop,), name="pycoll-watchdog-store",
                                 daemon=True),
                threading.Thread(target=self._report_loop, args=(self._stop, self._report_q),
                                 name="pycoll-watchdog-report", daemon=True),
            ]
            for t in self._threads:
                t.start()
            self._active = True
        if self._want_signal is not None:
            self._install_signal()
        _log.debug("watchdog started (interval %.3g s, publish %.3g s, stall %.3g s)", self.interval,
                   self.publish_interval, self.stall_timeout)

    def stop(self, timeout: float = 5.0) -> None:
        """Stop the threads (they restart with the next communicator if ``enabled``)."""
        with self._lock:
            self._active = False
            threads, self._threads = self._threads, []
            self._stop.set()
            self._poll_wake.set()
            self._store_wake.set()
            self._report_q.put(None)
            self._poke()
        for t in threads:
            if t is not threading.current_thread():
                t.join(timeout)
        self._uninstall_signal()
        for s in (self._wake_r, self._wake_w):
            if s is not None:
                s.close()
        self._wake_r = self._wake_w = None

    def _after_fork(self) -> None:
        # a forked child inherits none of the threads (and maybe a lock one of them held): start afresh
        self._active = False
        self._lock = threading.Lock()
        self._count_lock = threading.Lock()
        self._failing = 0
        self._threads = []
        self._jobs.clear()
        self._unfinished = set()
        self._reports = set()
        self._report_q = queue.SimpleQueue()
        self._held = []
        self._gates = {}
        self._flushing = False
        self._stores = {}
        self._wake_r = self._wake_w = None
        self._signum = None
        self._pid = os.getpid()

    def status(self) -> Dict[str, Any]:
        """Running state and settings (for logs and tests)."""
        return {
            "running": self.running, "enabled": self.enabled, "beats": self.beats,
            "since_last_round_s": time.monotonic() - self._beat_t, "doing": self._doing, "stalled": self._stalled,
            "interval": self.interval, "publish_interval": self.publish_interval,
            "stall_timeout": self.stall_timeout, "dump_signal": self._signum,
        }

    # -- observer interface (registered by install()) -------------------------------------------

    def comm_created(self, comm: Any) -> None:
        self.recorder.comm_created(comm)
        if self.enabled and not self.running:
            self.start()
        self._store_wake.set()  # publish the new communicator's progress at once

    def comm_closed(self, comm: Any) -> None:
        self.recorder.comm_closed(comm)

    def comm_failed(self, comm: Any, exc: BaseException, work: Any) -> None:
        self.recorder.comm_failed(comm, exc, work)
        try:
            self._handle_failure(comm, exc, work)
        except Exception:
            _log.exception("watchdog: reporting the failure of %r failed", comm.name)

    # -- failure handling ------------------------------------------------------------------------

    @property
    def _stale_after(self) -> float:
        return 1.5 * self.publish_interval + 0.25

    def _handle_failure(self, comm: Any, exc: BaseException, work: Any) -> None:
        report = _FailureReport(comm, exc, work)  # the facts, read before the policy acts
        with self._count_lock:
            self._failing += 1
        if report.is_timeout or comm.store is None:
            self._finish_report(comm.store, report)
            return
        # an asynchronous or remote error is final: the policy acts at once, and the report (store
        # exchange, the line, the dump) follows in the report thread
        self._reports.add(report)
        if self.running:
            self._report_q.put((comm.store, report))
        else:
            threading.Thread(target=self._finish_report, args=(comm.store, report, True),
                             name="pycoll-watchdog-report", daemon=True).start()

    def _report_loop(self, stop: threading.Event, q: "queue.SimpleQueue[Any]") -> None:
        while not stop.is_set():
            item = q.get()
            if item is None:
                return
            self._finish_report(*item, after_gates=True)

    def _finish_report(self, store: Any, report: _FailureReport, after_gates: bool = False) -> None:
        try:
            if after_gates:  # a recovery in progress goes first (see add_dump_gate)
                deadline = time.monotonic() + self.dump_hold
                while not self._flushing and not self._gates_open() and time.monotonic() < deadline:
                    time.sleep(_GATE_POLL)
            if store is not None:
                t = threading.Thread(target=self._exchange, args=(store, report), name="pycoll-watchdog-exchange",
                                     daemon=True)
                t.start()
                if not report.done.wait(0 if self._in_monitor() else self.report_timeout):
                    report.store_error = report.store_error or f"the store did not answer within {self.report_timeout:g} s"
            _log.error("%s", report.line(self._stale_after))
            self.recorder.add_failure(report.generation, report.as_dict(self._stale_after))
            if self.dump_on_failure:
                # held (at most dump_hold) from the failure on, however long the report itself was held
                self._dump(f"{report.brief()} on {report.comm_name!r}", "failure", 0, created=report.monotonic)
        except Exception:
            _log.exception("watchdog: reporting the failure of %r failed", report.comm_name)
        finally:
            with self._count_lock:
                self._failing -= 1
            report.finished.set()
            self._reports.discard(report)

    def _exchange(self, store: Any, report: _FailureReport) -> None:
        """Announce the failure, ask every rank to dump, read the others' progress (report thread)."""
        base = f"{KEY_PREFIX}progress/{report.uid}/"
        fbase = f"{KEY_PREFIX}failure/{report.uid}/"
        try:
            store.set(f"{fbase}{report.rank}", f"{report.brief()}".encode())
            self._signal_store(store, f"rank {report.global_rank}: {report.brief()} on {report.comm_name!r}")
            report.peers = self._read_progress(store, base, report.size)
            report.peer_failures = self._read_failures(store, fbase, report.size, report.rank)
            if report.is_timeout and report.seq is not None and self.abort_grace > 0:
                waiting = [r for r in report.analysis(self._stale_after)["in_op"] if r not in report.peer_failures]
                if waiting:
                    try:
                        store.wait([f"{fbase}{r}" for r in waiting], timeout=self.abort_grace)
                    except StoreTimeout:
                        pass
                    report.peer_failures = self._read_failures(store, fbase, report.size, report.rank)
        except Exception as e:  # a store problem must not hide the failure itself
            report.store_error = f"store error: {type(e).__name__}: {e}"
        finally:
            report.done.set()

    @staticmethod
    def _read_progress(store: Any, base: str, size: int) -> Dict[int, Dict[str, Any]]:
        keys = [k for k in store.list_keys(base)]
        out: Dict[int, Dict[str, Any]] = {}
        if not keys:
            return out
        values = store.multi_get(keys, timeout=1.0)
        for key, raw in zip(keys, values):
            tail = key[len(base):] if key.startswith(base) else key.rsplit("/", 1)[-1]
            if tail.isdigit() and int(tail) < size:
                p = _parse_progress(_decode(raw))
                if p is not None:
                    out[int(tail)] = p
        return out

    @staticmethod
    def _read_failures(store: Any, base: str, size: int, me: int) -> Dict[int, str]:
        keys = [k for k in store.list_keys(base)]
        out: Dict[int, str] = {}
        if not keys:
            return out
        for key, raw in zip(keys, store.multi_get(keys, timeout=1.0)):
            tail = key[len(base):] if key.startswith(base) else key.rsplit("/", 1)[-1]
            if tail.isdigit() and int(tail) != me and int(tail) < size:
                out[int(tail)] = _decode(raw)
        return out

    # -- dumps -----------------------------------------------------------------------------------

    def dump(self, reason: str = "manual", *, trigger: str = "manual", wait: Optional[float] = None) -> List[str]:
        """Dump the flight recorder from the monitor thread; wait up to ``wait`` s (None: dump_timeout).

        Without running threads the dump is written in the calling thread. Returns the paths
        written (empty when the wait ended first: the dump still happens).
        """
        return self._dump(reason, trigger, wait)

    def _dump(self, reason: str, trigger: str, wait: Optional[float], created: Optional[float] = None) -> List[str]:
        if not self.running:
            self._last_dump_start = time.monotonic()
            return self.recorder.dump(reason, trigger=trigger, changed_only=trigger in ("remote", "stall"))
        job = self._queue(_DumpJob(reason, trigger, created=created))
        if trigger == "failure":
            self._last_dump_start = time.monotonic()  # dump requests from the other ranks are served by it
        job.done.wait(self.dump_timeout if wait is None else wait)
        return list(job.paths)

    def _queue(self, job: _DumpJob) -> _DumpJob:
        self._unfinished.add(job)
        self._jobs.append(job)
        self._poke()
        return job

    def wait_for_dumps(self, timeout: Optional[float] = None) -> bool:
        """Write the reports and dumps queued or held so far, waiting up to ``timeout`` s (None:
        ``dump_timeout``); True when all were written.

        Runs at interpreter exit, so that a failure dump being written when the user's code ends
        is not lost with the daemon threads.
        """
        deadline = time.monotonic() + (self.dump_timeout if timeout is None else timeout)
        self._flushing = True  # held reports and dumps go ahead now
        self._poke()
        try:
            for report in list(self._reports):  # failure reports still being made queue their dump next
                report.finished.wait(max(0.0, deadline - time.monotonic()))
            for job in list(self._unfinished):
                if not job.done.wait(max(0.0, deadline - time.monotonic())):
                    return False
            return True
        finally:
            self._flushing = False

    def signal_all(self, reason: str = "requested") -> int:
        """Ask every process sharing a store with this one's communicators to dump; returns stores told."""
        stores = self._live_stores()
        told = 0
        for store in stores.values():
            try:
                self._signal_store(store, f"rank {self._my_rank()}: {reason}")
                told += 1
            except Exception as e:
                _log.warning("watchdog: could not post a dump request to %r: %s", store, e)
        return told

    @staticmethod
    def _signal_store(store: Any, text: str) -> None:
        n = int(store.add(_SIGNAL_COUNTER, 1))
        store.set(f"{_SIGNAL_COUNTER}/{n}", f"{_origin()} {text}".encode())

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

    def _in_monitor(self) -> bool:
        return threading.current_thread().name == "pycoll-watchdog-monitor"

    # -- threads ---------------------------------------------------------------------------------

    def _poll_loop(self, stop: threading.Event) -> None:
        wake = self._poll_wake
        while not stop.is_set():
            now = time.monotonic()
            self.beats += 1
            self._beat_t = now
            next_t = now + self.interval
            for c in self._comms():
                if c._state != "active" or c._failure is not None:
                    continue
                self._doing = f"checking communicator {c.name!r}"
                try:
                    c._check()
                except Exception:
                    _log.exception("watchdog: checking %r failed", c.name)
                if c._failure is None:
                    for w in list(c._pending):
                        deadline = w.t0 + w.timeout + 1e-3
                        if deadline < next_t:
                            next_t = deadline
            c = None
            self._doing = None
            wake.wait(max(1e-3, next_t - time.monotonic()))
            wake.clear()

    def _monitor_loop(self, stop: threading.Event) -> None:
        r = self._wake_r
        assert r is not None
        period = min(1.0, self.stall_timeout / 4)
        while not stop.is_set():
            try:
                ready, _, _ = select.select([r], [], [], _GATE_POLL if self._held else period)
            except (OSError, ValueError):
                return  # closed by stop()
            signalled = False
            if ready:
                try:
                    data = r.recv(4096)
                except (BlockingIOError, InterruptedError):
                    data = b""
                except OSError:
                    return
                signalled = self._signum is not None and self._signum in data
            if stop.is_set():
                return
            if self._signal_pending:
                self._signal_pending = False
                signalled = True
            jobs = []
            while self._jobs:
                job = self._jobs.popleft()
                (self._held if job.trigger in _HOLDABLE else jobs).append(job)
            if signalled:
                jobs.append(_DumpJob(f"signal {signal.Signals(self._signum).name if self._signum else '?'}", "signal"))
            if self._held and self._may_dump():
                jobs, self._held = self._held + jobs, []
            if jobs:
                self._run_dump(jobs)
            self._check_stall()

    # -- dump gates: recovery first, then the failure dumps ---------------------------------------

    def add_dump_gate(self, gate: Callable[[], bool]) -> int:
        """Hold this process's failure reports and dumps (and dumps asked for by other ranks) while ``gate()`` is False.

        The elastic layer holds them while it rebuilds a failed communicator, so that the report's
        store traffic and the dump's formatting never slow the recovery down; what they say is
        fixed when the failure is recorded. A timeout's report is made before its policy acts and is
        never held; its dump is. A report or dump waits at most ``dump_hold`` seconds from the
        failure, and never at exit. Returns a token for :meth:`remove_dump_gate`.
        """
        token = next(self._gate_ids)
        self._gates[token] = gate
        return token

    def remove_dump_gate(self, token: int) -> None:
        """Forget a gate (the dumps it held are written now)."""
        self._gates.pop(token, None)
        self._poke()

    def release_dumps(self) -> None:
        """Tell the monitor thread to look at the gates again now (e.g. after a recovery)."""
        self._poke()

    def _may_dump(self) -> bool:
        return self._flushing or time.monotonic() - self._held[0].created >= self.dump_hold or self._gates_open()

    def _gates_open(self) -> bool:
        for gate in list(self._gates.values()):
            try:
                if not gate():
                    return False
            except Exception:
                _log.debug("watchdog: dump gate %r failed", gate, exc_info=True)
        return True

    def _run_dump(self, jobs: List[_DumpJob]) -> None:
        """One dump serves every job waiting (their reasons are merged)."""
        first = jobs[0]
        reason = first.reason if len(jobs) == 1 else "; ".join(dict.fromkeys(j.reason for j in jobs))
        trigger = first.trigger if len({j.trigger for j in jobs}) == 1 else "+".join(dict.fromkeys(j.trigger for j in jobs))
        self._last_dump_start = time.monotonic()
        paths: List[str] = []
        try:
            paths = self.recorder.dump(reason, trigger=trigger,
                                       changed_only=all(j.trigger in ("remote", "stall") for j in jobs))
        except Exception:
            _log.exception("watchdog: dump failed")
        finally:
            for j in jobs:
                j.paths = paths
                j.done.set()
                self._unfinished.discard(j)

    def _check_stall(self) -> None:
        if not self.running:
            return
        silent = time.monotonic() - self._beat_t
        if silent > self.stall_timeout and not self._stalled:
            self._stalled = True
            frame = sys._current_frames().get(self._threads[0].ident) if self._threads else None
            stack = "".join(traceback.format_stack(frame)).rstrip() if frame is not None else "(no stack)"
            _log.error("pycoll watchdog: the polling thread has not completed a round for %.1f s (%s); timeouts "
                       "are not being detected. Its stack:\n%s", silent, self._doing or "idle", stack)
            self._run_dump([_DumpJob(f"watchdog stalled for {silent:.1f} s ({self._doing or 'idle'})", "stall")])
        elif self._stalled and silent < self.stall_timeout:
            self._stalled = False
            _log.warning("pycoll watchdog: the polling thread is running again")

    def _live_stores(self) -> Dict[int, Any]:
        return {id(c.store): c.store for c in self._comms() if c.store is not None}

    def _store_loop(self, stop: threading.Event) -> None:
        while not stop.is_set():
            t0 = time.monotonic()
            comms = [c for c in self._comms() if c.store is not None]
            for c in comms:
                self._publish(c)
            stores = {id(c.store): c.store for c in comms}
            for key in list(self._stores):
                if key not in stores:
                    del self._stores[key]
            comms = []
            c = None
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

    def _publish(self, c: Any) -> None:
        try:
            p = _progress(c)
            value = (f"v1 {p['coll_enqueued']} {p['coll_started']} {p['coll_completed']} {p['p2p_enqueued']} "
                     f"{p['p2p_completed']} {c.state} {time.time_ns()} {self.beats} {_origin()}")
            c.store.set(f"{KEY_PREFIX}progress/{c.uid}/{c.rank}", value.encode())
        except Exception as e:
            _log.debug("watchdog: could not publish the progress of %r: %s", c.name, e)

    def _watch_signal(self, st: _StoreState, wait: float) -> None:
        store = st.store
        try:
            if st.last_seen is None:
                st.last_seen = int(store.add(_SIGNAL_COUNTER, 0))
            nxt = f"{_SIGNAL_COUNTER}/{st.last_seen + 1}"
            if wait > 0:
                try:
                    store.wait([nxt], timeout=wait)
                except StoreTimeout:
                    return
            elif not store.check([nxt]):
                return
            n = int(store.add(_SIGNAL_COUNTER, 0))
            keys = [f"{_SIGNAL_COUNTER}/{i}" for i in range(st.last_seen + 1, n + 1)]
            st.last_seen = n
            texts = [_decode(v) for v in store.multi_get(keys, timeout=1.0)] if keys else []
        except Exception as e:
            _log.debug("watchdog: watching dump requests on %r failed: %s", store, e)
            if wait > 0:
                self._stop.wait(min(wait, self.publish_interval))
            return
        foreign = [t.split(" ", 1)[1] if " " in t else t for t in texts if not t.startswith(_origin() + " ")]
        if not foreign:
            return
        if self._failing or time.monotonic() - self._last_dump_start < self.publish_interval:
            _log.debug("watchdog: dump request (%s) served by the dump made just now", foreign[0])
            return
        self._queue(_DumpJob("requested by " + "; ".join(dict.fromkeys(foreign)), "remote"))

    # -- dump signal -----------------------------------------------------------------------------

    def _install_signal(self) -> None:
        signum = self._want_signal
        if signum is None or self._signum == signum:
            return
        if threading.current_thread() is not threading.main_thread():
            _log.warning("watchdog: the dump signal can only be installed from the main thread; call "
                         "pycoll.watchdog.enable_dump_signal() there")
            return
        current = signal.getsignal(signum)
        if current not in (signal.SIG_DFL, None) and getattr(current, "__self__", None) is not self:
            _log.warning("watchdog: %s already has a handler (%r); not installing the dump signal",
                         signal.Signals(signum).name, current)
            return
        signal.signal(signum, self._on_signal)
        self._signum = signum
        # the C-level handler writes the signal number to this socket at once, even while the main
        # thread is blocked inside a collective; the monitor thread wakes and dumps
        try:
            if self._wake_w is not None:
                old = signal.set_wakeup_fd(self._wake_w.fileno(), warn_on_full_buffer=False)
                if old not in (-1, self._wake_w.fileno()):
                    signal.set_wakeup_fd(old)  # someone else's (asyncio): leave it, use the handler only
        except (ValueError, OSError) as e:
            _log.debug("watchdog: set_wakeup_fd failed (%s); the dump signal waits for the main thread", e)
        _log.info("watchdog: %s dumps the flight recorder (pid %d)", signal.Signals(signum).name, os.getpid())

    def _uninstall_signal(self) -> None:
        signum, self._signum = self._signum, None
        if signum is None or threading.current_thread() is not threading.main_thread():
            return
        try:
            if signal.getsignal(signum) == self._on_signal:
                signal.signal(signum, signal.SIG_DFL)
            fd = signal.set_wakeup_fd(-1)
            if self._wake_w is None or fd != self._wake_w.fileno():
                signal.set_wakeup_fd(fd)
        except (ValueError, OSError):
            pass

    def _on_signal(self, signum: int, frame: Any) -> None:
        # runs in the main thread once it is back in Python; when the wakeup fd is ours the monitor
        # was already woken by the C-level handler
        try:
            fd = signal.set_wakeup_fd(-1)
            signal.set_wakeup_fd(fd, warn_on_full_buffer=False)
        except (ValueError, OSError):
            fd = -1
        if self._wake_w is None or fd != self._wake_w.fileno():
            self._signal_pending = True
            self._poke()


# -- the process's watchdog ---------------------------------------------------------------------------

_watchdog: Optional[Watchdog] = None
_wd_lock = threading.Lock()


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
    if wd.enabled and not wd.running and _comm.live_communicators():
        wd.start()
    elif not wd.enabled and wd.running:
        wd.stop()
    return wd


def enable_dump_signal(signum: Any = "SIGUSR1") -> None:
    """Make ``signum`` dump the flight recorder without stopping anything. Call from the main thread.

    The handler only wakes the watchdog's monitor thread, which dumps, even while the main thread is
    blocked inside a collective.
    """
    wd = get_watchdog()
    wd._want_signal = _signal_number(signum)
    if not wd.running:
        wd.start()
    wd._install_signal()


def _polling() -> bool:
    wd = _watchdog
    return wd is not None and wd._active


def install() -> None:
    """Register the flight recorder and the watchdog with every communicator (done by ``import pycoll``).

    Also tells the communicators whether a watchdog polls them: only then does a blocking host
    operation run inline in the caller's thread (the watchdog enforces its deadline).
    """
    _comm.add_observer(get_watchdog())
    _comm.watchdog_running = _polling
    atexit.register(_wait_for_dumps_at_exit)


def _wait_for_dumps_at_exit() -> None:
    wd = _watchdog
    if wd is not None and wd._pid == os.getpid() and not wd.wait_for_dumps():
        _log.warning("watchdog: a flight-recorder dump was still being written at exit (dump_timeout %.3g s)",
                     wd.dump_timeout)


def _reinit_after_fork() -> None:
    if _watchdog is not None:
        _watchdog._after_fork()
    from . import flight_recorder

    if flight_recorder._recorder is not None:
        flight_recorder._recorder._after_fork()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_reinit_after_fork)
