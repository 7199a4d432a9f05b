"""Every ``PYCOLL_*`` setting: its name, kind, default and meaning, read and validated in one place.

Explicit arguments win; these environment variables are the fallbacks. :func:`get` reads one
(an unset or empty variable gives the default); a bad value raises ``ValueError`` naming the
variable. :func:`seconds` validates a duration given as an argument the same way. README's
environment table is checked against :data:`SETTINGS` by the tests. The variables ``pycoll-run``
sets for each rank (``PYCOLL_RANK`` ...) are the launcher's contract with rank discovery and live
there (:mod:`pycoll.launch.discovery`).

A leaf module: it imports nothing of pycoll.
"""

from __future__ import annotations

import datetime
import math
import numbers
import os
import re
import signal
import sys
import threading
from dataclasses import dataclass
from typing import Any, Callable, Dict, Mapping, Optional, Tuple, Union

__all__ = ["Setting", "SETTINGS", "HOST_LIBRARY_SETTINGS", "MAX_SECONDS", "get", "explicit", "seconds",
           "register_check", "check_host_library", "check_all"]

_TRUE = ("1", "true", "yes", "on")
_FALSE = ("0", "false", "no", "off")
# the spellings of a dump signal (upper case): off, SIGUSR1 or SIGUSR2
_DUMP_SIGNALS = frozenset(
    [w.upper() for w in _TRUE + _FALSE]
    + ["USR1", "SIGUSR1", "USR2", "SIGUSR2", str(int(signal.SIGUSR1)), str(int(signal.SIGUSR2))]
)


#: the longest duration pycoll takes (about 31 years): beyond it the waits of the threading module, sockets and
#: the clocks overflow (an OverflowError in some thread instead of a wait)
MAX_SECONDS = 1e9


#: a duration as pycoll's calls take it: seconds, or a datetime.timedelta (torch.distributed's timeouts are)
Seconds = Union[float, datetime.timedelta]


def seconds(value: Any, what: str, *, positive: bool = True) -> float:
    """``value`` as a finite duration in seconds (> 0, or >= 0 with ``positive=False``; at most
    :data:`MAX_SECONDS`).

    A ``datetime.timedelta`` (torch.distributed's form) is taken as its seconds. TypeError for a non-number (bools
    included), ValueError naming ``what`` for a value out of range or not finite (an infinite deadline is no
    deadline: pass a large number instead).
    """
    if isinstance(value, datetime.timedelta):
        value = value.total_seconds()
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(f"{what} must be a number of seconds, got {type(value).__name__} (a datetime.timedelta is "
                        "taken too)")
    value = float(value)
    if not math.isfinite(value):
        raise ValueError(f"{what} must be a finite number of seconds, got {value}")
    if not (value > 0 if positive else value >= 0):
        raise ValueError(f"{what} must be {'> 0' if positive else '>= 0'} seconds, got {value:g}")
    if value > MAX_SECONDS:  # the value as given: :g rounded 1000000001 to the limit itself
        raise ValueError(f"{what} must be at most {MAX_SECONDS:g} seconds (about 31 years), got {value!r}")
    return value


def _exact(bound: float) -> str:
    """A bound as the README gives it: every digit (``:g`` printed 16777216 as 1.67772e+07, 1e7 s as 1e+07)."""
    return str(int(bound)) if float(bound).is_integer() else repr(float(bound))


def flag(value: Any, what: str) -> bool:
    """``value`` as a bool: True, False, 0, 1 or a numpy bool; TypeError naming ``what`` for anything else (a str's
    truth is not what it says: ``"no"`` would mean True)."""
    numpy_bool = type(value).__module__ == "numpy" and type(value).__name__ in ("bool", "bool_")
    if isinstance(value, bool) or (type(value) is int and value in (0, 1)) or numpy_bool:
        return bool(value)
    raise TypeError(f"{what} must be True or False, got {type(value).__name__} {value!r}")


def text(value: Any, what: str, *, none_ok: bool = False, hint: str = "") -> None:
    """Check that ``value`` is a non-empty str (or None, with ``none_ok``): TypeError naming ``what`` for another
    type, ValueError for the empty str (a str of the wrong value, as the other arguments' values)."""
    if (value is None and none_ok) or (isinstance(value, str) and value):
        return
    raise (ValueError if isinstance(value, str) else TypeError)(
        f"{what} must be a non-empty str{' or None' if none_ok else ''}{hint}, got {value!r}")


@dataclass(frozen=True)
class Setting:
    """One ``PYCOLL_*`` variable.

    ``kind``: ``"seconds"`` (finite, > 0; ``minimum=0`` allows 0; at most ``maximum``), ``"int"`` (decimal,
    within ``minimum``/``maximum``), ``"bool"`` (1/true/yes/on, 0/false/no/off), ``"choice"`` (one of
    ``choices``), ``"signal"`` (off, 1, SIGUSR1 or SIGUSR2; the text is returned) or ``"text"`` (checked by the
    function the module that reads it registered, :func:`register_check`).
    ``default`` is the value when unset; ``doc`` what it means.
    """

    name: str
    kind: str
    default: Any
    doc: str
    minimum: Optional[float] = None
    maximum: Optional[float] = None
    choices: Tuple[str, ...] = ()

    def raw(self, environ: Optional[Mapping[str, str]] = None) -> str:
        """The variable's text in ``environ`` (default ``os.environ``) without the blanks around it: for a host
        library variable only those its C parsers skip (spaces and tabs before, and newlines after), so that every
        value accepted here is one the library accepts too."""
        value = (os.environ if environ is None else environ).get(self.name, "")
        return value.lstrip(" \t").rstrip(" \t\n") if self.name.startswith("PYCOLL_HOST_") else value.strip()

    def read(self, environ: Optional[Mapping[str, str]] = None) -> Any:
        """The value from ``environ`` (default ``os.environ``), validated; the default when unset or empty."""
        raw = self.raw(environ)
        if not raw:
            return self.default
        return self.parse(raw)

    def parse(self, raw: str) -> Any:
        name = f"${self.name}"
        if self.kind == "seconds":
            # a decimal number in ASCII, as C's strtod reads it (float() takes '1_0' and other scripts' digits too),
            # and no underflow (strtod's ERANGE)
            if not re.fullmatch(r"[+-]?([0-9]+\.?[0-9]*|\.[0-9]+)([eE][+-]?[0-9]+)?", raw):
                infinite = raw.lower().lstrip("+-") in ("inf", "infinity", "nan")
                raise ValueError(f"{name} must be a {'finite ' if infinite else ''}number of seconds, got {raw!r}")
            value = float(raw)
            # strtod's ERANGE: below the smallest normal double, and (read as 0.0) below the smallest one at all
            if (value != 0 and abs(value) < sys.float_info.min) or \
                    (value == 0 and re.search(r"[1-9]", re.split(r"[eE]", raw)[0])):
                raise ValueError(f"{name} must be a number of seconds, got {raw!r} (too small to represent)")
            value = seconds(value, name, positive=self.minimum != 0)
            if self.maximum is not None and value > self.maximum:
                raise ValueError(f"{name} must be <= {_exact(self.maximum)} seconds, got {raw}")
            return value
        if self.kind == "int":
            # as strictly as the host library's C parser: ASCII digits, no sign (not even '-0'; none is < 0)
            if not re.fullmatch(r"[0-9]+", raw):
                raise ValueError(f"{name} must be a whole number >= 0 written in digits only, got {raw!r}")
            value = int(raw)
            if self.minimum is not None and value < self.minimum:
                raise ValueError(f"{name} must be >= {_exact(self.minimum)}, got {value}")
            if self.maximum is not None and value > self.maximum:
                raise ValueError(f"{name} must be <= {_exact(self.maximum)}, got {value}")
            return value
        if self.kind == "bool":
            low = raw.lower()
            if low in _TRUE:
                return True
            if low in _FALSE:
                return False
            raise ValueError(f"{name} must be 0 or 1, got {raw!r}")
        if self.kind == "signal":
            if raw.upper() not in _DUMP_SIGNALS:
                raise ValueError(f"{name} must be SIGUSR1 or SIGUSR2 (or 1 for SIGUSR1, 0 for off), got {raw!r}")
            return raw
        if self.kind == "choice":
            if raw not in self.choices:
                raise ValueError(f"{name} must be one of {', '.join(self.choices)}, got {raw!r}")
            return raw
        check = _CHECKS.get(self.name)
        if check is not None:
            check(raw)  # raises the ValueError that names what is wrong
        return raw


_ALL = (
    # -- libraries and communicators
    Setting("PYCOLL_NCCL_LIBRARY", "text", "nccl",
            "the library of `load()` without a spec and of `init()` without `library=`: a path or "
            "`nccl`/`rccl`/`host` (`init`'s backend is its kind; another backend asked for is refused)"),
    Setting("PYCOLL_BACKEND", "choice", None, "backend of `init(backend=\"auto\")` (default: by the GPUs present)",
            choices=("host", "nccl", "rccl")),
    Setting("PYCOLL_TIMEOUT", "seconds", 30.0, "per-operation timeout, seconds"),
    Setting("PYCOLL_INIT_TIMEOUT", "seconds", 120.0, "initialisation deadline, seconds"),
    Setting("PYCOLL_ON_FAILURE", "choice", "abort", "what a failed communicator does",
            choices=("abort", "revoke", "report")),
    Setting("PYCOLL_ABORT_TIMEOUT", "seconds", 10.0, "how long an abort may take before it is left behind, seconds"),
    # -- the watchdog
    Setting("PYCOLL_WATCHDOG", "bool", True, "`0` disables the watchdog"),
    Setting("PYCOLL_WATCHDOG_INTERVAL", "seconds", 0.1, "watchdog poll interval, seconds"),
    Setting("PYCOLL_WATCHDOG_PUBLISH_INTERVAL", "seconds", 1.0,
            "how often progress and heartbeat go to the store, seconds"),
    Setting("PYCOLL_WATCHDOG_REPORT_TIMEOUT", "seconds", 2.0,
            "bound on the store exchange of a failure report, seconds", minimum=0),
    Setting("PYCOLL_WATCHDOG_ABORT_GRACE", "seconds", 0.5,
            "after a timeout, how long to wait for peers' own verdicts, seconds", minimum=0),
    Setting("PYCOLL_WATCHDOG_LIVENESS", "bool", True,
            "`0`: the watchdog does not watch the peers of outstanding work (a stopped peer then costs the timeout)"),
    Setting("PYCOLL_WATCHDOG_LIVENESS_INTERVAL", "seconds", 0.2,
            "how often a same-host peer's process state is read while work is outstanding, seconds"),
    Setting("PYCOLL_WATCHDOG_HEARTBEAT_TIMEOUT", "seconds", 5.0,
            "a peer on another host whose heartbeat stopped this long (at least 3 publish intervals) fails "
            "the outstanding work, seconds"),
    Setting("PYCOLL_WATCHDOG_STALL_TIMEOUT", "seconds", 15.0,
            "a stalled watchdog is reported after this, seconds, past the poll interval"),
    Setting("PYCOLL_WATCHDOG_RECORDS_KEEP", "seconds", 120.0,
            "how long a rank's records in the store of a communicator that failed or was aborted stay for its peers "
            "before the rank deletes them, seconds", minimum=0),
    # -- the flight recorder and its dumps
    Setting("PYCOLL_FR_BUFFER_SIZE", "int", 2000, "flight-recorder entries (0 turns recording off)",
            minimum=0, maximum=10_000_000),
    Setting("PYCOLL_FR_STACKS", "bool", True, "record Python stacks"),
    Setting("PYCOLL_FR_STACK_DEPTH", "int", 16, "frames per stack", minimum=1, maximum=1000),
    Setting("PYCOLL_FR_DUMP_DIR", "text", None, "dump folder (default `~/.cache/pycoll/fr/<run id>`)"),
    Setting("PYCOLL_FR_FILE_PREFIX", "text", "pycoll_trace_rank_", "dump file prefix"),
    Setting("PYCOLL_FR_DUMP_ON_FAILURE", "bool", True,
            "dump when a communicator fails (this rank's, or another's that asks every rank to dump)"),
    Setting("PYCOLL_FR_DUMP_JSON", "bool", True, "also write dumps as JSON"),
    Setting("PYCOLL_FR_DUMP_TIMEOUT", "seconds", 5.0, "how long exit waits for dumps being written, seconds",
            minimum=0),
    Setting("PYCOLL_FR_DUMP_HOLD", "seconds", 10.0,
            "longest an elastic recovery holds a failure's report and dump back, seconds", minimum=0),
    Setting("PYCOLL_FR_DUMP_SIGNAL", "signal", None, "`1`/`SIGUSR1`/`SIGUSR2`: that signal dumps without stopping "
            "anything (off)"),
    # -- the host library (read by its C code: pycoll/_host/env.h has the same bounds)
    Setting("PYCOLL_HOST_INIT_TIMEOUT", "seconds", 300.0,
            "seconds a host rendezvous waits for missing ranks (0: forever)", minimum=0, maximum=1e7),
    Setting("PYCOLL_HOST_SPIN_NS", "int", 50000, "ns a host waiter spins before yielding", minimum=0, maximum=1e10),
    Setting("PYCOLL_HOST_YIELD_NS", "int", 300000, "ns it then yields before sleeping", minimum=0, maximum=1e10),
    Setting("PYCOLL_HOST_YIELD_ADAPT", "int", 1, "`1`: where most of a communicator's waits for its peers that "
            "yielded PYCOLL_HOST_YIELD_NS slept anyway of late, they yield 25 us before sleeping (every 32nd the "
            "whole budget, to see the load go); `0`: always the whole budget", minimum=0, maximum=1),
    Setting("PYCOLL_HOST_DEFER_NS", "int", 1000000,
            "ranks outnumbering CPUs: ns queued work waits for a waiter to run it before its stream's thread is woken; "
            "any rank count: ns work handed back is left to the thread that waits for it next",
            minimum=0, maximum=1e9),
    Setting("PYCOLL_HOST_INLINE_NS", "int", 10000000, "ns an idle host stream's caller runs its work at a time "
            "before it hands what is unfinished back to the stream (its wait takes it up again)",
            minimum=100000, maximum=1e10),
    Setting("PYCOLL_HOST_STREAM_DEPTH", "int", 1024, "the most operations a host stream holds queued and not begun "
            "(a GPU's launch queue holds about 1024): queuing one more waits until one is taken (the Communicator as a "
            "Work's wait does: deadlines, failure, abort, revoke, Ctrl-C), the communicator fails or is aborted or "
            "revoked, or a signal comes; 0: no bound", minimum=0, maximum=1 << 24),
    Setting("PYCOLL_HOST_PEER_CHECK_NS", "int", 1000000, "ns between a host waiter's looks at its peers' "
            "processes, and its longest sleep (a peer on this host that exits wakes it at once anyway)",
            minimum=100000, maximum=1e10),
    Setting("PYCOLL_HOST_ONESHOT_MAX", "int", 32768, "host AllReduce/Reduce up to this many bytes use one phase",
            minimum=0, maximum=1 << 30),
    Setting("PYCOLL_HOST_CHUNK_BYTES", "int", 524288, "pipeline chunk of larger host AllReduce/Reduce, bytes",
            minimum=64, maximum=1 << 30),
    Setting("PYCOLL_HOST_STREAM_MIN", "int", 8 << 20, "host AllReduce/Reduce outputs, and outputs of operations "
            "over windows, of at least this many bytes are written with streaming (non-temporal) stores (0: never); "
            "unset, outputs of 8 MiB and more use, per size class (8-16 MiB, 16-32 MiB, ...) and apart for each "
            "operation over windows, whichever stores the process's first six such operations measured faster",
            minimum=0, maximum=1 << 62),
    Setting("PYCOLL_HOST_WINDOW_ALLREDUCE", "choice", "1", "`1`: a host AllReduce of more than "
            "PYCOLL_HOST_ONESHOT_MAX bytes whose buffers lie in windows on every rank reduces straight between "
            "the ranks' windows; `0`: through the segment like any other", choices=("0", "1")),
    Setting("PYCOLL_HOST_WINDOW_COLLECTIVES", "choice", "1", "`1`: a host Reduce of more than "
            "PYCOLL_HOST_ONESHOT_MAX bytes, and a Broadcast, AllGather, ReduceScatter, AlltoAll, Gather or Scatter of "
            "more than one step of the segment (1 MiB per rank up to 8 ranks) whose buffers lie in windows on every "
            "rank copies or reduces straight between the ranks' windows; `0`: through the segment like any other",
            choices=("0", "1")),
    Setting("PYCOLL_HOST_EAGER", "choice", "1", "`1`: a small host collective (one step of the segment, a few KiB) "
            "queued on an idle helping stream (the Communicator's asynchronous operations) first runs as far as it "
            "can without waiting in the caller's thread, to its end where the peers' shares are there; `0`: all of "
            "it on the stream's thread", choices=("0", "1")),
    Setting("PYCOLL_HOST_EAGER_ROOTED", "choice", "1", "`1`: a host Broadcast or Scatter of blocks of at most 960 "
            "bytes, and a Gather or Reduce of such blocks, go over the eager lane (a sender writes and is done, up to "
            "16 operations ahead of a receiver); `0`: through the segment's steps. The same on every rank",
            choices=("0", "1")),
    Setting("PYCOLL_HOST_GROUP_BATCH", "choice", "1", "`1`: a host group's small collectives on one communicator "
            "(AllReduce and Reduce of at most PYCOLL_HOST_ONESHOT_MAX bytes, Broadcast, AllGather and Gather of one "
            "step) are published in one step of the segment when every rank has the same ones in its group; `0`: "
            "one step each", choices=("0", "1")),
    Setting("PYCOLL_HOST_BIND", "choice", "0", "`1` binds the thread initialising host rank r to a CPU",
            choices=("0", "1")),
    Setting("PYCOLL_HOST_IDLE_DEAD", "int", 1, "`1` puts the remaining threads of a peer process found dead on "
            "`SCHED_IDLE`; `0` leaves them alone", minimum=0, maximum=1),
    Setting("PYCOLL_HOST_SPREAD", "int", 1, "`1`: a waiter that finds the peer it waits for on its own CPU moves "
            "to another CPU of its mask (where the ranks do not outnumber the CPUs), and one on a CPU holding two of "
            "its communicator's ranks more than another CPU of its mask moves there (where they do); `0`: never",
            minimum=0, maximum=1),
    Setting("PYCOLL_HOST_SHM_TAG", "text", None, "names the host library's `/dev/shm` segments `pycoll_<tag>-...` "
            "instead of `pycoll-...` (1 to 15 of A-Z a-z 0-9 _): processes of different tags, which cannot share a "
            "communicator, neither see nor sweep each other's segments (jobs, containers or test workers sharing one "
            "`/dev/shm`); unset: none"),
    # -- testing
    Setting("PYCOLL_FAILPOINTS", "text", None, "failpoints to arm, for tests: `NAME=ACTION[@N][;rank=R]` "
            "(action `kill`, `stop`, `raise` or `sleep(MS)`), comma-separated (see `pycoll/failpoints.py`; none)"),
)

#: name -> :class:`Setting`, for every ``PYCOLL_*`` variable pycoll's Python code reads
SETTINGS: Dict[str, Setting] = {s.name: s for s in _ALL}

#: the variables the host library reads in C (validated by :func:`check_host_library` before it is used)
HOST_LIBRARY_SETTINGS: Tuple[str, ...] = tuple(s.name for s in _ALL if s.name.startswith("PYCOLL_HOST_"))

#: name -> the check of a text setting's value, registered by the module that reads it (a leaf module like this one
#: cannot import it): PYCOLL_FAILPOINTS's grammar is pycoll.failpoints.parse
_CHECKS: Dict[str, Callable[[str], Any]] = {}


def _check_shm_tag(raw: str) -> None:
    if not re.fullmatch(r"[A-Za-z0-9_]{1,15}", raw):
        raise ValueError(f"$PYCOLL_HOST_SHM_TAG must be 1 to 15 of A-Z, a-z, 0-9 and _, got {raw!r}")


_CHECKS["PYCOLL_HOST_SHM_TAG"] = _check_shm_tag


def register_check(name: str, check: Callable[[str], Any]) -> None:
    """Make ``check(raw)`` (raising ValueError naming what is wrong) part of reading the text setting ``name``."""
    if SETTINGS[name].kind != "text":
        raise ValueError(f"{name} is not a text setting")
    _CHECKS[name] = check


def check_host_library(environ: Optional[Mapping[str, str]] = None) -> None:
    """ValueError naming the variable when a host-library variable is invalid (the library would warn and
    fall back to its default, or fail its next init)."""
    for name in HOST_LIBRARY_SETTINGS:
        get(name, environ)


def check_all(environ: Optional[Mapping[str, str]] = None) -> None:
    """ValueError naming the first invalid variable of pycoll's Python code: made as a communicator is created, so
    that a bad value read only later (an abort's bound, read when a failure comes) is reported before anything
    runs. The host library's variables are checked as it is loaded (:func:`check_host_library`)."""
    for name in SETTINGS:
        if name not in HOST_LIBRARY_SETTINGS:
            get(name, environ)


def get(name: str, environ: Optional[Mapping[str, str]] = None) -> Any:
    """The value of setting ``name`` (validated; its default when unset)."""
    return SETTINGS[name].read(environ)


def explicit(name: str, environ: Optional[Mapping[str, str]] = None) -> Any:
    """The value of setting ``name`` when it is set (validated), else None (for reports of what is set)."""
    s = SETTINGS[name]
    raw = s.raw(environ)
    return s.parse(raw) if raw else None


# -- a thread's bound on its store requests ------------------------------------------------------------

_bound = threading.local()  # this thread's requests_until() deadline (time.monotonic()), where one is set


class requests_until:
    """``with requests_until(deadline):`` -- this thread's requests to a :class:`pycoll.store.TCPStore` or a
    :class:`pycoll.store.FileStore` give up by ``deadline`` (``time.monotonic()``; at least 1 s each, as always),
    whatever the store's own timeout: a caller bounded as a whole (``pycoll.init``'s ``init_timeout``, the store
    connect included; a communicator's closing) is not held by a store that stopped answering -- a TCP server, or a
    process stopped holding a FileStore's lock file -- for the store's timeout (300 s by default) per request.
    Nested bounds keep the earliest."""

    def __init__(self, deadline: float) -> None:
        self.deadline = deadline

    def __enter__(self) -> None:
        self._prev = getattr(_bound, "deadline", None)
        _bound.deadline = self.deadline if self._prev is None else min(self._prev, self.deadline)

    def __exit__(self, *exc: Any) -> None:
        _bound.deadline = self._prev


def request_deadline() -> Optional[float]:
    """This thread's :class:`requests_until` deadline, or None."""
    return getattr(_bound, "deadline", None)

