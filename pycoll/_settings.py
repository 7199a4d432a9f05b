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

import math
import os
from dataclasses import dataclass
from typing import Any, Dict, Mapping, Optional, Tuple

__all__ = ["Setting", "SETTINGS", "get", "explicit", "seconds"]

_TRUE = ("1", "true", "yes", "on")
_FALSE = ("0", "false", "no", "off")


def seconds(value: Any, what: str, *, positive: bool = True) -> float:
    """``value`` as a finite duration in seconds (> 0, or >= 0 with ``positive=False``).

    TypeError for a non-number (bools included), ValueError naming ``what`` for a value out of range
    or not finite (an infinite deadline is no deadline: pass a large number instead).
    """
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"{what} must be a number of seconds, got {type(value).__name__}")
    value = float(value)
    if not math.isfinite(value):
        raise ValueError(f"{what} must be a finite number of seconds, got {value}")
    if not (value > 0 if positive else value >= 0):
        raise ValueError(f"{what} must be {'> 0' if positive else '>= 0'} seconds, got {value:g}")
    return value


@dataclass(frozen=True)
class Setting:
    """One ``PYCOLL_*`` variable.

    ``kind``: ``"seconds"`` (finite, > 0; ``minimum=0`` allows 0), ``"int"`` (within
    ``minimum``/``maximum``), ``"bool"`` (1/true/yes/on, 0/false/no/off), ``"choice"`` (one of
    ``choices``) or ``"text"``. ``default`` is the value when unset; ``doc`` what it means.
    """

    name: str
    kind: str
    default: Any
    doc: str
    minimum: Optional[float] = None
    maximum: Optional[float] = None
    choices: Tuple[str, ...] = ()

    def read(self, environ: Optional[Mapping[str, str]] = None) -> Any:
        """The value from ``environ`` (default ``os.environ``), validated; the default when unset or empty."""
        raw = (os.environ if environ is None else environ).get(self.name, "").strip()
        if not raw:
            return self.default
        return self.parse(raw)

    def parse(self, raw: str) -> Any:
        name = f"${self.name}"
        if self.kind == "seconds":
            try:
                value = float(raw)
            except ValueError:
                raise ValueError(f"{name} must be a number of seconds, got {raw!r}") from None
            return seconds(value, name, positive=not self.minimum == 0)
        if self.kind == "int":
            try:
                value = int(raw)
            except ValueError:
                raise ValueError(f"{name} must be an integer, got {raw!r}") from None
            if self.minimum is not None and value < self.minimum:
                raise ValueError(f"{name} must be >= {self.minimum:g}, got {value}")
            if self.maximum is not None and value > self.maximum:
                raise ValueError(f"{name} must be <= {self.maximum:g}, got {value}")
            return value
        if self.kind == "bool":
            low = raw.lower()
            if low in _TRUE:
                return True
            if low in _FALSE:
                return False
            raise ValueError(f"{name} must be 0 or 1, got {raw!r}")
        if self.kind == "choice":
            if raw not in self.choices:
                raise ValueError(f"{name} must be one of {', '.join(self.choices)}, got {raw!r}")
            return raw
        return raw


_ALL = (
    # -- libraries and communicators
    Setting("PYCOLL_NCCL_LIBRARY", "text", "nccl",
            "library for `load()` without a spec: a path or `nccl`/`rccl`/`host`"),
    Setting("PYCOLL_BACKEND", "choice", None, "backend of `init(backend=\"auto\")` (default: by the GPUs present)",
            choices=("host", "nccl", "rccl")),
    Setting("PYCOLL_TIMEOUT", "seconds", 30.0, "per-operation timeout, seconds"),
    Setting("PYCOLL_INIT_TIMEOUT", "seconds", 120.0, "initialisation deadline, seconds"),
    Setting("PYCOLL_ON_FAILURE", "choice", "abort", "what a failed communicator does",
            choices=("abort", "revoke", "report")),
    Setting("PYCOLL_ABORT_TIMEOUT", "seconds", 10.0, "how long an abort may take before it is left behind, seconds"),
    # -- the watchdog
    Setting("PYCOLL_WATCHDOG", "bool", True, "`0` disables the watchdog (then blocking host operations use a stream)"),
    Setting("PYCOLL_WATCHDOG_INTERVAL", "seconds", 0.1, "watchdog poll interval, seconds"),
    Setting("PYCOLL_WATCHDOG_PUBLISH_INTERVAL", "seconds", 1.0,
            "how often progress and heartbeat go to the store, seconds"),
    Setting("PYCOLL_WATCHDOG_REPORT_TIMEOUT", "seconds", 2.0, "bound on the store exchange of a failure report, seconds",
            minimum=0),
    Setting("PYCOLL_WATCHDOG_ABORT_GRACE", "seconds", 0.5,
            "after a timeout, how long to wait for peers' own verdicts, seconds", minimum=0),
    Setting("PYCOLL_WATCHDOG_STALL_TIMEOUT", "seconds", 15.0, "a stalled watchdog is reported after this, seconds"),
    # -- the flight recorder and its dumps
    Setting("PYCOLL_FR_BUFFER_SIZE", "int", 2000, "flight-recorder entries (0 turns recording off)",
            minimum=0, maximum=10_000_000),
    Setting("PYCOLL_FR_STACKS", "bool", True, "record Python stacks"),
    Setting("PYCOLL_FR_STACK_DEPTH", "int", 16, "frames per stack", minimum=1, maximum=1000),
    Setting("PYCOLL_FR_DUMP_DIR", "text", None, "dump folder (default `~/.cache/pycoll/fr/<run id>`)"),
    Setting("PYCOLL_FR_FILE_PREFIX", "text", "pycoll_trace_rank_", "dump file prefix"),
    Setting("PYCOLL_FR_DUMP_ON_FAILURE", "bool", True, "dump when a communicator fails"),
    Setting("PYCOLL_FR_DUMP_JSON", "bool", True, "also write dumps as JSON"),
    Setting("PYCOLL_FR_DUMP_TIMEOUT", "seconds", 5.0, "how long exit waits for dumps being written, seconds",
            minimum=0),
    Setting("PYCOLL_FR_DUMP_HOLD", "seconds", 10.0,
            "longest an elastic recovery holds a failure's report and dump back, seconds", minimum=0),
    Setting("PYCOLL_FR_DUMP_SIGNAL", "text", None, "`1`/`SIGUSR1`/`SIGUSR2`: that signal dumps without stopping "
            "anything (off)"),
    # -- testing
    Setting("PYCOLL_FAILPOINTS", "text", None, "failpoints to arm, for tests: `NAME=ACTION[@N][;rank=R]` "
            "(action `kill`, `stop` or `raise`), comma-separated (see `pycoll/failpoints.py`; none)"),
)

#: name -> :class:`Setting`, for every ``PYCOLL_*`` variable pycoll's Python code reads
SETTINGS: Dict[str, Setting] = {s.name: s for s in _ALL}


def get(name: str, environ: Optional[Mapping[str, str]] = None) -> Any:
    """The value of setting ``name`` (validated; its default when unset)."""
    return SETTINGS[name].read(environ)


def explicit(name: str, environ: Optional[Mapping[str, str]] = None) -> Any:
    """The value of setting ``name`` when it is set (validated), else None (for reports of what is set)."""
    s = SETTINGS[name]
    raw = (os.environ if environ is None else environ).get(name, "").strip()
    return s.parse(raw) if raw else None
