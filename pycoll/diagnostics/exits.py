"""The going rank's own dump: an uncaught exception, an exit or SIGTERM still leaves a flight-recorder dump.

:func:`pycoll.diagnostics.install` (the first communicator) chains, when ``PYCOLL_FR_DUMP_ON_FAILURE``
is on:

* ``sys.excepthook`` and ``threading.excepthook``: an uncaught exception (KeyboardInterrupt too; not the
  ``SystemExit`` of a ``sys.exit()`` in another thread, which ends that thread quietly, as in Python) dumps,
  with a reason such as ``"uncaught ValueError in rank 1 while all_reduce #7 on 'world' (started)
  outstanding"``, then the previous hook runs as before. Outstanding are the operations of communicators still
  open that have not failed; where there are none, the reason names those a failure ended, on a communicator
  revoked or closed since (``"uncaught
  KeyboardInterrupt in rank 1 after all_reduce #7 on 'world' (started) failed"``: Ctrl-C inside it failed it);
* an exit handler: a process that exits (end of the main module, ``sys.exit``) while an operation is
  outstanding on a communicator still open dumps. After a failure whose communicator was aborted or destroyed
  nothing is outstanding: the exit writes no dump, and the failure's dump, in the same file, stays;
* a SIGTERM handler, only where SIGTERM had the default action or a Python handler (never over
  ``SIG_IGN``), installed from the main thread as the first communicator is made, once the store is open
  (before, there is nothing to dump, and a main thread blocked in C -- connecting to a store -- could not run it): it
  dumps, then calls the handler it replaced, or -- for the default action -- ends the process by SIGTERM
  as it would have ended without pycoll. While the main thread is blocked inside a call, the watchdog's
  monitor thread sees the signal through the wake-up fd and dumps (and, for the default action, ends the
  process) itself. A SIGTERM that comes while the process is already ending -- the main thread in the
  exception hook or the exit handler above, as when ``pycoll-run`` stops the other ranks of a job one of
  whose ranks died -- acts once that end's dump is written and the previous hook has run (the traceback
  printed): the dump and the traceback are not lost, and the process still ends by SIGTERM. So does a
  SIGTERM that comes while the main thread reports a failure (a timeout it found: the watchdog's line,
  the store exchange, the failure dump; bounded by ``PYCOLL_WATCHDOG_REPORT_TIMEOUT``); the monitor
  thread, dumping for a SIGTERM, first lets the failure reports of the other threads finish, so that the
  dump holds their failures.

At most one such dump per process (the first of these events; an uncaught exception in another thread
may add one), each bounded by ``dump_timeout`` (reports and dumps under way are let finish first,
within the same bound, so that the process's own dump is the last one written).
Impossible: ``os._exit`` and SIGKILL run no code, and a signal's default action (SIGQUIT, SIGSEGV,
...) other than SIGTERM is left alone; the peers' dumps and their store reports stand in for such a rank.
"""

from __future__ import annotations

import atexit
import contextlib
import ctypes
import logging
import os
import signal
import sys
import threading
import time
import warnings
from types import TracebackType
from typing import TYPE_CHECKING, Any, ContextManager, Dict, Iterator, List, Optional, Tuple, Type

from .. import _settings, failpoints as _fp, hooks

if TYPE_CHECKING:
    from .watchdog import Watchdog

__all__ = ["ExitDumps", "install", "get_exit_dumps", "after_fork", "arm_sigterm", "holding_sigterm"]

_log = logging.getLogger("pycoll.watchdog")

FP_EXIT_DUMP = _fp.declare("watchdog.exit.before_dump", "the process is going (exception, exit, SIGTERM), "
                                                        "before its own dump")
FP_TERMINATE = _fp.declare("watchdog.exit.terminate", "SIGTERM: dumped, before ending the process")
FP_TERM_DEFERRED = _fp.declare("watchdog.exit.deferred_sigterm", "a SIGTERM that came while the process was "
                                                                 "ending: that end done, before the SIGTERM acts")


def _frames(tb: Optional[TracebackType], limit: int = 32) -> List[Dict[str, Any]]:
    """A traceback's frames, innermost first (as the dumps hold stacks)."""
    frames = []
    while tb is not None:
        code = tb.tb_frame.f_code
        frames.append({"name": code.co_name, "filename": code.co_filename, "line": tb.tb_lineno})
        tb = tb.tb_next
    return frames[::-1][:limit]


class ExitDumps:
    """The hooks of one process (see the module documentation). Use :func:`install`."""

    def __init__(self, watchdog: Watchdog) -> None:
        self._wd = watchdog
        # how deep the main thread is in work whose output a SIGTERM must not cut off (ending the process through
        # the exception hook or the exit handler, reporting a failure: holding_sigterm); _term_deferred (below):
        # whether a SIGTERM came meanwhile: it acts when that work is done
        self._holding = 0
        self._prev_excepthook: Any = None
        self._prev_thread_hook: Any = None
        self._prev_term: Any = None  # what SIGTERM did before ours (SIG_DFL or the user's handler)
        self._sigterm_tried = False  # arm_sigterm() installed (or tried to install) the SIGTERM handler
        self.after_fork()

    def after_fork(self) -> None:
        """This process's own state (``__init__``; again in a forked child, once the process's recorder has
        forgotten the parent's communicators): the child's own communicators dump in its name; what the parent's
        threads were dumping or doing is not the child's. A forked child (a multiprocessing worker) inherits the
        hooks, not the rank: it dumps only once this ran."""
        if getattr(self, "_pid", None) not in (None, os.getpid()):
            self._forget_sigterm()
            self._holding = 0  # the parent's main thread's, not this one's
        self._pid = os.getpid()
        self._lock = threading.RLock()  # reentrant: SIGTERM's handler may run in the main thread while it holds it
        # "process" (its end) and "thread" (an uncaught exception in one) -> (the dumping thread, set when done)
        self._dumped: Dict[str, Tuple[int, threading.Event]] = {}
        self._terminating = False
        self._sigterm_warned = False
        self._term_deferred = False
        self._term_done = threading.Event()
        self.reason: Optional[str] = None  # the reason of the dump made, once made
        self.paths: List[str] = []

    # -- installing --------------------------------------------------------------------------------

    def install(self, sigterm: bool = True) -> None:
        self._prev_excepthook = sys.excepthook
        sys.excepthook = self._excepthook
        self._prev_thread_hook = threading.excepthook
        threading.excepthook = self._thread_excepthook
        atexit.register(self._at_exit)
        if sigterm:
            self.install_sigterm()

    def arm_sigterm(self) -> None:
        """A communicator is being made (once the job's store is open: :func:`pycoll.init`, :func:`pycoll.join`) or
        exists (the watchdog's ``comm_created``): SIGTERM dumps from now on, installed once from the main thread (a
        later communicator does not chain it again over a handler the user set since)."""
        if not self._sigterm_tried and threading.current_thread() is threading.main_thread():
            self._sigterm_tried = True
            self.install_sigterm()
        elif not self._sigterm_tried and not self._sigterm_warned:  # once, until the main thread makes one
            self._sigterm_warned = True
            warnings.warn("pycoll: a communicator is made outside the main thread, where Python cannot install a "
                          "SIGTERM handler, and none is installed yet: a SIGTERM ends this process without a "
                          "flight-recorder dump, and an init under way is neither aborted nor said given up at its "
                          "store (make the first communicator in the main thread to have them)", RuntimeWarning,
                          stacklevel=2)

    def install_sigterm(self) -> bool:
        """Chain SIGTERM (main thread only; never over SIG_IGN or a handler set outside Python)."""
        if threading.current_thread() is not threading.main_thread():
            _log.debug("watchdog: SIGTERM dumps need the main thread; not installed")
            return False
        prev = signal.getsignal(signal.SIGTERM)
        if prev == self._on_sigterm:
            return True
        if prev is signal.SIG_IGN or prev is None:
            return False
        self._prev_term = prev
        signal.signal(signal.SIGTERM, self._on_sigterm)
        self._wd.on_terminate = self._terminate
        return True

    def _forget_sigterm(self) -> None:
        """In a forked child: SIGTERM does what it did before ours until the child's own first communicator arms
        it again (``arm_sigterm``); there is nothing of the child's to dump before. A Python-level handler lost a
        SIGTERM now and then in a child just forked (CPython drops what comes before its after-fork setup):
        ``Pool.terminate()`` then waited for ever for that worker."""
        self._sigterm_tried = False
        try:
            if signal.getsignal(signal.SIGTERM) == self._on_sigterm:
                signal.signal(signal.SIGTERM, self._prev_term if self._prev_term is not None else signal.SIG_DFL)
        except (ValueError, OSError, TypeError):
            pass

    @property
    def sigterm_installed(self) -> bool:
        """True while SIGTERM runs this object's handler."""
        try:
            return bool(signal.getsignal(signal.SIGTERM) == self._on_sigterm)
        except (ValueError, OSError):
            return False

    # -- the dump ------------------------------------------------------------------------------------

    def dump(self, what: str, *, extra: Optional[Dict[str, Any]] = None, kind: str = "process",
             flush: bool = True) -> List[str]:
        """Dump once per ``kind`` for this process: ``what`` (e.g. ``"uncaught ValueError"``) names the
        event; the reason adds the rank and the operations outstanding. Waits at most ``dump_timeout``.

        ``kind`` is ``"process"`` for the events that end it and ``"thread"`` for an uncaught exception
        in another thread (which does not use up the process's own dump). ``flush``: a process's end
        first lets the failure reports and dumps under way finish (within the same bound), so that
        its own dump is the last word."""
        rec = self._wd.recorder
        if os.getpid() != self._pid:
            return []  # a forked child's dump would hold its parent's communicators (same rank, same file)
        with self._lock:
            made = self._dumped.get(kind)
            if made is None and not rec.has_communicators:
                return []
            if made is None:
                done = threading.Event()
                self._dumped[kind] = (threading.get_ident(), done)
        if made is not None:
            # made or being made by another thread (the monitor thread, for SIGTERM): the process may end
            # once this returns, so wait for that dump rather than lose it with the daemon thread -- except
            # in the monitor thread, which writes the dump the other thread waits for
            if made[0] != threading.get_ident() and not self._wd.in_monitor_thread():
                made[1].wait(self._wd.dump_timeout + 1.0)
            return []
        try:
            unfinished = rec.unfinished()
            failed = [] if unfinished else rec.failed()
            reason = f"{what} in rank {rec.global_rank()} " + (
                f"while {', '.join(unfinished)} outstanding" if unfinished
                else f"after {', '.join(failed)} failed" if failed
                else "with no operation outstanding" if rec.enabled
                else "(its operations unknown: recording is off, PYCOLL_FR_BUFFER_SIZE=0)")
            self.reason = reason
            _fp.hit(FP_EXIT_DUMP)
            info = {"exit": {"event": what, "pid": os.getpid(), "unfinished": unfinished, **(extra or {})}}
            if failed:
                info["exit"]["failed"] = failed
            bound = self._wd.dump_timeout
            deadline = time.monotonic() + bound
            if flush and kind == "process" and self._wd.running:
                self._wd.wait_for_dumps(max(0.0, bound - 1.0))
            elif kind == "process":  # the monitor thread: the failures being reported get into its dump
                self._wd.wait_for_reports(time.monotonic() + max(0.0, bound - 1.0), ending=True)
            self.paths = self._wd.dump(reason, trigger="exit", wait=max(1.0, deadline - time.monotonic()), extra=info)
            if not self.paths and time.monotonic() < deadline:  # it failed (the error is logged above)
                _log.warning("pycoll watchdog: the dump for %s was not written (see the error above)", what)
            elif not self.paths:
                _log.warning("pycoll watchdog: the dump for %s was not written within %.3g s", what, bound)
            return self.paths
        except Exception:
            _log.exception("watchdog: the exit dump failed")
            return []
        finally:
            done.set()

    # -- the events ----------------------------------------------------------------------------------

    @contextlib.contextmanager
    def holding_sigterm(self) -> Iterator[None]:
        """The main thread does bounded work whose output a SIGTERM must not cut off: it ends the process (an
        uncaught exception, its exit) or reports a failure (the watchdog's line and the failure in the dump).
        SIGTERM's handler would run inside that work and end the process there, the monitor thread under it: a
        SIGTERM meanwhile waits for the block to finish, then acts as it would have (``_terminate``). Other
        threads: nothing (SIGTERM's handler never runs inside them)."""
        if threading.current_thread() is not threading.main_thread():
            yield
            return
        with self._lock:
            self._holding += 1
        try:
            yield
        finally:
            with self._lock:
                self._holding -= 1
                deferred = self._term_deferred and self._holding == 0
                if deferred:
                    self._term_deferred = False
            if deferred:
                _fp.hit(FP_TERM_DEFERRED)
                self._terminate(False)

    def _excepthook(self, typ: Type[BaseException], exc: BaseException, tb: Optional[TracebackType]) -> None:
        with self.holding_sigterm():
            try:
                self.dump(f"uncaught {typ.__name__}", extra={"exception": {
                    "type": typ.__name__, "message": str(exc)[:2000], "frames": _frames(tb)}})
            finally:
                prev = self._prev_excepthook or sys.__excepthook__
                prev(typ, exc, tb)

    def _thread_excepthook(self, args: Any) -> None:
        if issubclass(args.exc_type, SystemExit):  # sys.exit() in a thread ends that thread quietly, as Python's
            prev = self._prev_thread_hook or threading.__excepthook__  # own hook has it: no dump, no line
            prev(args)
            return
        try:
            name = args.thread.name if args.thread is not None else "?"
            self.dump(f"uncaught {args.exc_type.__name__} in thread {name!r}", extra={"exception": {
                "type": args.exc_type.__name__, "message": str(args.exc_value)[:2000], "thread": name,
                "frames": _frames(args.exc_traceback)}}, kind="thread")
        finally:
            prev = self._prev_thread_hook or threading.__excepthook__
            prev(args)

    def _at_exit(self) -> None:
        with self.holding_sigterm():
            if self._wd.recorder.has_communicators and self._wd.recorder.unfinished():
                self.dump("exit")

    def _on_sigterm(self, signum: int, frame: Any) -> None:
        self._terminate(False, frame)

    def _terminate(self, in_monitor: bool, frame: Any = None) -> None:
        """SIGTERM: dump (once), then what SIGTERM did before: the user's handler (in the main thread,
        as always) or the default action (the process ends by SIGTERM)."""
        if in_monitor and not self.sigterm_installed:
            return  # someone else's handler now: not ours to act on
        with self._lock:
            if self._holding and not self._terminating:
                # the main thread is ending the process or reporting a failure: interrupting it (this handler
                # runs inside it, or the monitor thread would end the process under it) would lose that dump,
                # the traceback or the failure's line; it acts on this SIGTERM when done
                self._term_deferred = True
                return
            first = not self._terminating
            self._terminating = True
        if first or not in_monitor:
            # the monitor thread cannot wait for the dumps it writes itself, only for the failure reports other
            # threads are making; the main thread, second, waits for its dump
            self.dump("SIGTERM", flush=not in_monitor)
        prev = self._prev_term
        if callable(prev):
            if not in_monitor:
                prev(signum_of(), frame)
            return
        if not first:
            if in_monitor:
                return
            self._term_done.wait(self._wd.dump_timeout + 1.0)  # the monitor thread is dumping, then ends it
        _fp.hit(FP_TERMINATE)
        hooks.abort_initializing()  # a rendezvous segment this rank created goes with it
        self._term_done.set()
        _die_by_sigterm()


def signum_of() -> int:
    return int(signal.SIGTERM)


def _die_by_sigterm() -> None:
    """End the process as SIGTERM's default action does (any thread: the C library resets the action)."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.signal.restype = ctypes.c_void_p
        libc.signal.argtypes = [ctypes.c_int, ctypes.c_void_p]
        libc.signal(int(signal.SIGTERM), None)  # SIG_DFL is the null handler
        signal.pthread_sigmask(signal.SIG_UNBLOCK, [signal.SIGTERM])
        os.kill(os.getpid(), signal.SIGTERM)
    except Exception:
        _log.debug("watchdog: could not restore SIGTERM's default action", exc_info=True)
    os._exit(128 + int(signal.SIGTERM))


_exit_dumps: Optional[ExitDumps] = None


def install(watchdog: Watchdog) -> Optional[ExitDumps]:
    """Install the hooks once per process (when ``PYCOLL_FR_DUMP_ON_FAILURE`` is on); returns them."""
    global _exit_dumps
    if _exit_dumps is None and _settings.get("PYCOLL_FR_DUMP_ON_FAILURE"):
        _exit_dumps = ExitDumps(watchdog)
        # SIGTERM's handler comes with the first communicator, once the job's store is open (arm_sigterm): until
        # then a SIGTERM has nothing to dump or abort and ends the process at once, also while the main thread is
        # blocked in C (connecting to a torch store that is not there), where a Python handler could not run
        _exit_dumps.install(sigterm=False)
    return _exit_dumps


def after_fork() -> None:
    """In a forked child (after the process's recorder's own ``after_fork``): see :meth:`ExitDumps.after_fork`."""
    if _exit_dumps is not None:
        _exit_dumps.after_fork()


def arm_sigterm() -> None:
    """:meth:`ExitDumps.arm_sigterm` of the installed hooks (nothing with dumps on failure off)."""
    if _exit_dumps is not None:
        _exit_dumps.arm_sigterm()


def holding_sigterm() -> ContextManager[None]:
    """:meth:`ExitDumps.holding_sigterm` of the installed hooks (no holding with dumps on failure off)."""
    return _exit_dumps.holding_sigterm() if _exit_dumps is not None else contextlib.nullcontext()


def get_exit_dumps() -> Optional[ExitDumps]:
    """The installed hooks (None before the first communicator, or with dumps on failure off)."""
    return _exit_dumps
