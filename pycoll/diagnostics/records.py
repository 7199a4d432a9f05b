"""What ranks tell each other through the store: progress and failure records, in one codec.

Every record is a small JSON object with a version field (``"v"``). Keys, under ``pycoll/fr/``:

* ``progress/<uid>/<rank>``: a :class:`ProgressRecord`, published by each rank's watchdog about
  once a second (its heartbeat), and at once when another rank asks for dumps (the record then
  names the request it answers: a failing rank waits briefly for these fresh answers);
* ``failure/<uid>/<rank>``: a :class:`FailureRecord`, written by a rank when its communicator
  fails;
* ``proc/<uid>/<rank>``: a :class:`ProcRecord`, written once by each rank's watchdog: where its
  process runs (host, boot id, pid namespace, pid, start time) and its heartbeat period;
* ``dump_signal`` (a counter) and ``dump_signal/<n>``: requests to dump (free text: who asks, why).
"""

from __future__ import annotations

import json
import os
import socket
from dataclasses import asdict, dataclass
from typing import Any, Callable, Dict, Optional, TypeVar

from ..hooks import Progress

__all__ = [
    "FR_KEY_PREFIX",
    "SIGNAL_COUNTER",
    "ProgressRecord",
    "FailureRecord",
    "ProcRecord",
    "progress_prefix",
    "proc_prefix",
    "failure_prefix",
    "origin",
    "read_records",
]

FR_KEY_PREFIX = "pycoll/fr/"
SIGNAL_COUNTER = FR_KEY_PREFIX + "dump_signal"
_VERSION = 2


def progress_prefix(uid: str) -> str:
    return f"{FR_KEY_PREFIX}progress/{uid}/"


def failure_prefix(uid: str) -> str:
    return f"{FR_KEY_PREFIX}failure/{uid}/"


def proc_prefix(uid: str) -> str:
    return f"{FR_KEY_PREFIX}proc/{uid}/"


def origin() -> str:
    """This process, as named in store values (the pid is read each time: processes fork)."""
    return f"{socket.gethostname()}:{os.getpid()}"


def _load(raw: Any) -> Optional[Dict[str, Any]]:
    try:
        text = raw.decode("utf-8") if isinstance(raw, (bytes, bytearray)) else str(raw)
        data = json.loads(text)
    except (UnicodeDecodeError, ValueError):
        return None
    if not isinstance(data, dict) or data.get("v") != _VERSION:
        return None
    return data


#: a communicator's states in a ProgressRecord after which nothing answers for it (its rank closed it)
CLOSED_STATES = ("aborted", "destroyed")


@dataclass(frozen=True)
class ProgressRecord:
    """A rank's progress on one communicator, its state, and when it said so (its heartbeat)."""

    progress: Progress
    state: str
    time_ns: int
    beats: int
    origin: str
    request: int = -1  # the latest dump request (signal counter) seen when published; -1: none
    dump_signal: int = 0  # the installed dump signal (a same-host peer may send it), 0: none

    def encode(self) -> bytes:
        return json.dumps({"v": _VERSION, "progress": list(self.progress), "state": self.state,
                           "time_ns": self.time_ns, "beats": self.beats, "origin": self.origin,
                           "request": self.request, "dump_signal": self.dump_signal}).encode()

    @classmethod
    def decode(cls, raw: Any) -> Optional[ProgressRecord]:
        """The record, or None for anything that is not one (another version, garbage)."""
        d = _load(raw)
        try:
            return cls(Progress(*(int(x) for x in d["progress"])), str(d["state"]), int(d["time_ns"]),
                       int(d["beats"]), str(d["origin"]), int(d.get("request", -1)),
                       int(d.get("dump_signal", 0))) if d is not None else None
        except (KeyError, TypeError, ValueError):
            return None

    def as_dict(self) -> Dict[str, Any]:
        """Flat form kept in failure reports and dumps."""
        return {**self.progress.as_dict(), "state": self.state, "time_ns": self.time_ns, "beats": self.beats,
                "origin": self.origin, "request": self.request, "dump_signal": self.dump_signal}


@dataclass(frozen=True)
class FailureRecord:
    """How a rank's communicator failed: the error, and the operation it failed in (if any)."""

    error_type: str
    message: str
    op: Optional[str] = None
    seq: Optional[int] = None
    is_p2p: bool = False
    peer: Optional[int] = None
    elapsed: Optional[float] = None
    time: float = 0.0

    def encode(self) -> bytes:
        return json.dumps({"v": _VERSION, **asdict(self), "message": self.message[:2000]}).encode()

    @classmethod
    def decode(cls, raw: Any) -> Optional[FailureRecord]:
        d = _load(raw)
        if d is None:
            return None
        try:
            return cls(str(d["error_type"]), str(d["message"]), d.get("op"),
                       None if d.get("seq") is None else int(d["seq"]), bool(d.get("is_p2p")),
                       None if d.get("peer") is None else int(d["peer"]),
                       None if d.get("elapsed") is None else float(d["elapsed"]), float(d.get("time") or 0.0))
        except (KeyError, TypeError, ValueError):
            return None

    def failed_in(self, op: Optional[str], seq: Optional[int], is_p2p: bool) -> bool:
        """True when this failure happened in that very operation."""
        return self.op is not None and (self.op, self.seq, self.is_p2p) == (op, seq, is_p2p)

    def brief(self) -> str:
        """One line: the error and where."""
        if self.op is None:
            return f"{self.error_type}: {self.message}"[:300]
        elapsed = f" after {self.elapsed:.2f} s" if self.elapsed is not None else ""
        return f"{self.error_type} in {self.op} #{self.seq}{elapsed}"


@dataclass(frozen=True)
class ProcRecord:
    """Where a rank's process runs, so that its peers can watch it: same host (boot id and pid
    namespace equal) through its process state, other hosts through its heartbeat (``period``: how
    often it publishes its progress record, seconds)."""

    host: str
    boot: str
    pidns: str
    pid: int
    start: int  # the process's start time (clock ticks since boot, /proc/<pid>/stat field 22): pids are reused
    period: float

    def encode(self) -> bytes:
        return json.dumps({"v": _VERSION, **asdict(self)}).encode()

    @classmethod
    def decode(cls, raw: Any) -> Optional[ProcRecord]:
        d = _load(raw)
        try:
            return cls(str(d["host"]), str(d["boot"]), str(d["pidns"]), int(d["pid"]), int(d["start"]),
                       float(d["period"])) if d is not None else None
        except (KeyError, TypeError, ValueError):
            return None


R = TypeVar("R")


def read_records(store: Any, prefix: str, size: int, decode: Callable[[Any], Optional[R]],
                 skip: Optional[int] = None) -> Dict[int, R]:
    """rank -> record for the ranks below ``size`` (except ``skip``) that wrote one under ``prefix``."""
    keys = list(store.list_keys(prefix))
    out: Dict[int, R] = {}
    if not keys:
        return out
    for key, raw in zip(keys, store.multi_get(keys, timeout=1.0), strict=False):
        tail = key[len(prefix):] if key.startswith(prefix) else key.rsplit("/", 1)[-1]
        if tail.isdigit() and int(tail) < size and int(tail) != skip:
            rec = decode(raw)
            if rec is not None:
                out[int(tail)] = rec
    return out
