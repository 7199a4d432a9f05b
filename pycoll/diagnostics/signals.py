"""The dump signal: a signal (SIGUSR1 or SIGUSR2) whose delivery makes the watchdog dump.

The handler only wakes the watchdog's monitor thread (through ``signal.set_wakeup_fd`` when the
wake-up fd is free, so it works even while the main thread is blocked inside a collective).

The last resort, for a process whose threads cannot run because one holds the GIL inside a C call:
:mod:`faulthandler` is registered for the same signal (chained to the handler above), so the signal
also writes every thread's Python stack from C, without the GIL, to
``<dump dir>/stacks/pycoll_stacks_<host>_<pid>.txt`` (its first line names the rank). A failing
rank sends the dump signal to the peers on its host that did not answer its dump request and
publish that they have it (see :class:`~pycoll.diagnostics.records.ProgressRecord`).
"""

from __future__ import annotations

import atexit
import faulthandler
import logging
import os
import signal
import socket
import threading
import weakref
from typing import IO, Any, Callable, Optional, Tuple

from ..store import _safefiles

__all__ = ["signal_number", "DumpSignal", "stacks_file_name", "register_exit", "STACKS_DIR"]

STACKS_DIR = "stacks"


def stacks_file_name(host: str, pid: int) -> str:
    """The file faulthandler writes a process's stacks to, inside ``<dump dir>/stacks``."""
    safe = "".join(c if c.isalnum() or c in "-_." else "_" for c in host)
    return f"pycoll_stacks_{safe}_{pid}.txt"

_log = logging.getLogger("pycoll.watchdog")


_ALLOWED = (int(signal.SIGUSR1), int(signal.SIGUSR2))

_installed: weakref.WeakSet[DumpSignal] = weakref.WeakSet()  # the DumpSignals that installed a handler
_exit_lock = threading.Lock()
_exit_registered = False


def _ignore_at_exit() -> None:
    if threading.current_thread() is threading.main_thread():
        for d in list(_installed):
            d.ignore()


def register_exit() -> None:
    """Make every installed dump signal ignored once the exit handlers registered after this call have run (once per
    process; :func:`pycoll.diagnostics.install` calls it first, so pycoll's own run before). The interpreter's end
    gives a Python-level handler back its default action, ending the process, and leaves faulthandler's chained to
    a handler whose interpreter is gone (SIGSEGV); a peer that read this rank's published dump signal may still
    send it then."""
    global _exit_registered
    with _exit_lock:
        if not _exit_registered:
            _exit_registered = True
            atexit.register(_ignore_at_exit)


def signal_number(spec: Any) -> Optional[int]:
    """None (off) or SIGUSR1/SIGUSR2's number, from True/False/int/'SIGUSR1'/'USR2'/'1'/'0'.

    ValueError for any other signal: only these two may interrupt a program just to make it dump
    (SIGTERM, SIGINT ... mean something else, and SIGSEGV, SIGKILL ... cannot be handled usefully).
    """
    if spec is None or spec is False:
        return None
    if spec is True:
        return int(signal.SIGUSR1)
    number: Optional[int] = None
    if isinstance(spec, signal.Signals):  # a signal, whatever its number (signal.SIGHUP is 1)
        number = int(spec)
    elif isinstance(spec, int):  # as its text: 0 off, 1 SIGUSR1 (not SIGHUP), else a signal's number
        if spec == 0:
            return None
        if spec == 1:
            return int(signal.SIGUSR1)
        if spec < 0:
            raise ValueError(f"the dump signal (dump_signal= or $PYCOLL_FR_DUMP_SIGNAL) must be SIGUSR1 or SIGUSR2 "
                             f"(or 0/False: off), got {spec!r}")
        number = int(spec)
    else:
        text = str(spec).strip().upper()
        if text in ("", "0", "OFF", "FALSE", "NO"):
            return None
        if text in ("1", "ON", "TRUE", "YES"):
            return int(signal.SIGUSR1)
        if text.isascii() and text.isdigit():  # ASCII digits (str.isdigit takes other scripts' too)
            number = int(text)
        else:
            name = text if text.startswith("SIG") else "SIG" + text
            value = getattr(signal, name, None)
            if not isinstance(value, signal.Signals):
                raise ValueError(f"unknown signal {spec!r} (use SIGUSR1 or SIGUSR2)")
            number = int(value)
    if number not in _ALLOWED:
        raise ValueError(f"the dump signal (dump_signal= or $PYCOLL_FR_DUMP_SIGNAL) must be SIGUSR1 or SIGUSR2, "
                         f"got {spec!r}")
    return number


def _give_back(fd: int) -> bool:
    """Make ``fd``, someone else's wake-up fd (asyncio's) that set_wakeup_fd just replaced, the wake-up fd again;
    False where it no longer can be (closed, or its number reused by a blocking file): nobody's, it stays replaced."""
    try:
        signal.set_wakeup_fd(fd)
    except (ValueError, OSError) as e:
        _log.debug("watchdog: the previous wake-up fd %d is stale (%s); taking its place", fd, e)
        return False
    return True


class DumpSignal:
    """The installed dump signal of one watchdog: ``wanted`` (a number or None), ``signum`` (installed)."""

    def __init__(self, poke: Callable[[], None]) -> None:
        self.wanted: Optional[int] = None
        self.signum: Optional[int] = None
        self.pending = False  # delivered while the wake-up fd was not ours: the monitor must look
        self._poke = poke
        self._wake_fd = -1
        # where faulthandler writes the stacks, and what heads the file: set by the watchdog
        self.stacks_target: Optional[Callable[[], Optional[Tuple[str, str]]]] = None
        self.stacks_path: Optional[str] = None
        self._stacks_file: Optional[IO[str]] = None
        self._header = ""
        self._refused: Optional[Tuple[int, Any]] = None  # (signal, the program's handler) warned of

    def watch_interrupts(self, wake_w: Optional[socket.socket]) -> bool:
        """Let the C-level signal handler write to ``wake_w`` (when nobody else uses the wake-up fd):
        a SIGINT then wakes the watchdog even while the main thread is blocked inside a call."""
        if wake_w is None or threading.current_thread() is not threading.main_thread():
            return False
        try:
            old = signal.set_wakeup_fd(wake_w.fileno(), warn_on_full_buffer=False)
        except (ValueError, OSError):
            return False
        if old not in (-1, wake_w.fileno()) and _give_back(old):
            return False
        self._wake_fd = wake_w.fileno()
        return True

    def after_fork(self, wake_fd: int = -1) -> None:
        """In a forked child: nothing is installed for it (and the parent's stacks file is not its own).

        ``wake_fd``: the parent's watchdog's wake-up socket as the child inherited it (-1: none). Where it is
        the wake-up fd, it is released: the watchdog closes that socket, and the next file the child opens
        would take its number, and the signals' bytes."""
        if wake_fd >= 0:
            try:
                fd = signal.set_wakeup_fd(-1)
                if fd not in (-1, wake_fd):
                    _give_back(fd)
            except (ValueError, OSError):
                pass
        if self._stacks_file is not None and self.signum is not None:
            try:
                faulthandler.unregister(self.signum)
            except (ValueError, RuntimeError):
                pass
        self._stacks_file = None
        self.stacks_path = None
        self.signum = None

    def install(self, wake_w: Optional[socket.socket]) -> None:
        signum = self.wanted
        if signum is None or self.signum == signum:
            return
        if threading.current_thread() is not threading.main_thread():
            _log.warning("watchdog: the dump signal can only be installed from the main thread; call "
                         "pycoll.watchdog.enable_dump_signal() there")
            return
        current = signal.getsignal(signum)
        # SIG_IGN is no handler: pycoll's own stop or exit leaves it, and a child process inherits it across exec
        if (current not in (signal.SIG_DFL, signal.SIG_IGN, None)
                and getattr(current, "__self__", None) is not self):
            if self._refused != (signum, current):  # once for that handler (install runs at every start)
                _log.warning("watchdog: %s already has a handler (%r); not installing the dump signal",
                             signal.Signals(signum).name, current)
            self._refused = (signum, current)
            return
        if self.signum is not None:  # another one before: ignored from now on (peers may have read it)
            self.ignore()
        register_exit()
        signal.signal(signum, self._on_signal)
        _installed.add(self)
        self.signum = signum
        self._wake_fd = wake_w.fileno() if wake_w is not None else -1
        # the C-level handler writes the signal number to this socket at once, even while the main
        # thread is blocked inside a collective; the monitor thread wakes and dumps
        try:
            if wake_w is not None:
                old = signal.set_wakeup_fd(wake_w.fileno(), warn_on_full_buffer=False)
                if old not in (-1, wake_w.fileno()):
                    _give_back(old)  # someone else's (asyncio): leave it, use the handler only
        except (ValueError, OSError) as e:
            _log.debug("watchdog: set_wakeup_fd failed (%s); the dump signal waits for the main thread", e)
        self._register_stacks(signum)
        _log.info("watchdog: %s dumps the flight recorder (pid %d)", signal.Signals(signum).name, os.getpid())

    def _register_stacks(self, signum: int) -> None:
        """faulthandler on the same signal, chained to the handler just installed (see the module doc)."""
        target = self.stacks_target() if self.stacks_target is not None else None
        if target is None:
            return
        folder, header = target
        self._header = header
        path = os.path.join(folder, stacks_file_name(socket.gethostname(), os.getpid()))
        try:
            _safefiles.private_dirs(folder)
            fd = _safefiles.open_nofollow(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND)
            f = os.fdopen(fd, "w", buffering=1)
            f.write(header + "\n")
            faulthandler.register(signum, file=f, all_threads=True, chain=True)
        except (OSError, ValueError, RuntimeError) as e:
            _log.debug("watchdog: no faulthandler stacks for the dump signal (%s)", e)
            return
        self._stacks_file, self.stacks_path = f, path

    def retitle(self) -> None:
        """A new first line for the stacks written from now on where ``stacks_target`` names the process otherwise now
        (the rank became known: a signal enabled before the first communicator named rank 0); ``pycoll-fr`` reads
        the file's last one."""
        f = self._stacks_file
        if f is None or self.stacks_target is None:
            return
        target = self.stacks_target()
        if target is None or target[1] == self._header:
            return
        header = target[1]
        try:
            f.write(header + "\n")
        except (OSError, ValueError):
            return
        self._header = header

    def uninstall(self, wake_w: Optional[socket.socket]) -> bool:
        """Remove the dump signal's handler (the signal is ignored then), and ``wake_w`` as the signals' wake-up fd
        (set by :meth:`watch_interrupts` whether or not a dump signal is installed). False where the wake-up fd stays
        ``wake_w``'s (only the main thread may change it): the caller must then keep that socket open, since
        the next file opened would take its number, and every signal's byte."""
        if threading.current_thread() is not threading.main_thread():
            self.signum = None
            return self._wake_fd == -1
        self.ignore()
        try:
            fd = signal.set_wakeup_fd(-1)
            if wake_w is None or fd != wake_w.fileno():
                signal.set_wakeup_fd(fd)
        except (ValueError, OSError):
            pass
        self._wake_fd = -1
        return True

    def ignore(self) -> None:
        """Main thread only: the installed dump signal is ignored from now on, not given its default action (ending
        the process): a peer that read this rank's published dump signal may still send it -- a rank ending
        normally was killed by it (exit 138). At exit the handler may be one a stop off the main thread left."""
        signum = self.signum if self.signum is not None else self.wanted
        self.signum = None
        if signum is None:
            return
        if self._stacks_file is not None:
            try:
                faulthandler.unregister(signum)
                self._stacks_file.close()
            except (OSError, ValueError, RuntimeError):
                pass
            self._stacks_file = self.stacks_path = None
        try:
            if signal.getsignal(signum) == self._on_signal:
                signal.signal(signum, signal.SIG_IGN)
        except (ValueError, OSError):
            pass

    def still_ours(self) -> bool:
        """False (and the signal no longer counted as installed, nor published) where the program has since given it
        a handler of its own: its deliveries are the program's, not requests to dump."""
        signum = self.signum
        if signum is None:
            return False
        if signal.getsignal(signum) == self._on_signal:
            return True
        self.signum = None
        _log.warning("watchdog: %s has another handler now (%r); it no longer dumps the flight recorder",
                     signal.Signals(signum).name, signal.getsignal(signum))
        return False

    def _on_signal(self, signum: int, frame: Any) -> None:
        # runs in the main thread once it is back in Python; when the wakeup fd is ours the monitor
        # was already woken by the C-level handler
        try:
            fd = signal.set_wakeup_fd(-1)
            signal.set_wakeup_fd(fd, warn_on_full_buffer=False)
        except (ValueError, OSError):
            fd = -1
        if self._wake_fd == -1 or fd != self._wake_fd:
            self.pending = True
            self._poke()
