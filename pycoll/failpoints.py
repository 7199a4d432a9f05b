"""Failpoints: named places in pycoll where a test makes this process die, stop or raise.

Switched on by ``PYCOLL_FAILPOINTS`` (read when this module is imported; a value that does not parse arms nothing
and is reported where the settings are checked: when a communicator is created, which also warns about an entry that
names no declared failpoint, and by ``pycoll-run``) or by :func:`configure`.
The grammar is a comma-separated list of entries::

    NAME=ACTION[@N][;rank=R][;replacement=K|any][;trace=PATH]

* ``NAME``: a failpoint (``elastic.agree.before_vote``, ``host.coll.after_arrive``, ...); ``*`` at the
  end matches every name with that prefix.
* ``ACTION``: ``kill`` (SIGKILL this process), ``stop`` (SIGSTOP it), ``raise`` (raise
  :class:`FailpointError` here; in the host library the call returns ``ncclSystemError``),
  ``sleep(MS)`` (the calling thread sleeps MS milliseconds, then goes on: a slow rank, so that the
  others reach a window first) or ``off``.
* ``@N``: fire at the N-th pass through the point (counted per process, from 1; default 1);
  ``@N+``: at the N-th pass and every later one.
* ``rank=R``: only in the process whose rank is R (``PYCOLL_RANK``, or what :func:`configure` was
  given; a call site may name the rank it acts for, as the launcher does for the rank it spawns).
* ``trace=PATH``: append ``NAME ACTION RANK PID PASS`` to the file PATH each time the entry fires,
  before it acts (a test learns that its failpoint was reached); action ``note`` only does that.
* ``replacement=K``: only in the K-th replacement of that slot (``PYCOLL_REPLACEMENT``); default 0,
  the original process, so that a replacement does not die at the same place; ``any``: every one.

Example: ``PYCOLL_FAILPOINTS="elastic.grow.before_decision=kill@3;rank=0"`` kills rank 0 the third
time it reaches that point. The host library (``pycoll/_host/failpoint.c``) reads the same variable
(its ``host.*`` entries) once, at its first failpoint.

Off, a failpoint costs one module-level bool test (:func:`hit` returns at once). A leaf module: it
imports nothing of pycoll but the settings table.
"""

from __future__ import annotations

import os
import re
import signal
import sys
import threading
import time
import types
from dataclasses import dataclass
from typing import Dict, List, Optional, Tuple

from . import _settings

__all__ = ["FailpointError", "Failpoint", "configure", "reset", "hit", "declare", "declared", "parse", "unknown",
           "HOST_POINTS"]

ACTIONS = ("kill", "stop", "raise", "note", "sleep(MS)", "off")


class FailpointError(RuntimeError):
    """Raised at a failpoint whose action is ``raise``."""


@dataclass(frozen=True)
class Failpoint:
    """One parsed entry of ``PYCOLL_FAILPOINTS``."""

    name: str
    action: str
    nth: int = 1
    repeat: bool = False  # also every pass after the n-th
    rank: Optional[int] = None
    replacement: Optional[int] = 0  # None: any
    trace: Optional[str] = None  # a file to which each firing is appended
    ms: int = 0  # the action sleep(MS): milliseconds

    def matches(self, name: str) -> bool:
        if self.name.endswith("*"):
            return name.startswith(self.name[:-1])
        return name == self.name


_HOST_MAX = 32  # the host failpoints the host library keeps (failpoint.c's FP_MAX)

#: the blanks the host library's parser strips (C's isspace); str.strip() also strips Unicode's, which it keeps
_BLANKS = " \t\n\r\f\v"


def _host_side(name: str) -> bool:
    """Whether the host library reads the entry of failpoint ``name`` too (a ``host.`` name, or a prefix of one)."""
    return name.startswith("host.") or (name.endswith("*") and "host.".startswith(name[:-1]))


def _whole(text: str) -> int:
    """An integer as the host library's parser reads it (C's strtol, whole): ``int()`` also took '1_0' and other
    scripts' digits, which the host library then dropped without a word."""
    text = text.strip(_BLANKS)
    if not re.fullmatch(r"[+-]?[0-9]+", text) or len(text) > 24 or not -(1 << 63) <= int(text) < 1 << 63:
        raise ValueError(text)  # past 24 characters or a C long, the host library's parser drops it too
    return int(text)


def parse(spec: str) -> List[Failpoint]:
    """The entries of a ``PYCOLL_FAILPOINTS`` value; ``ValueError`` naming the bad part."""
    out: List[Failpoint] = []
    for entry in spec.replace("\n", ",").split(","):
        entry = entry.strip(_BLANKS)
        if not entry:
            continue
        head, *filters = [p.strip(_BLANKS) for p in entry.split(";")]
        if "=" not in head:
            raise ValueError(f"$PYCOLL_FAILPOINTS: {entry!r} is not NAME=ACTION[@N][;rank=R]")
        name, action = (p.strip(_BLANKS) for p in head.split("=", 1))
        nth, repeat = 1, False
        if "@" in action:
            action, count = (p.strip(_BLANKS) for p in action.split("@", 1))
            repeat = count.endswith("+")
            try:
                nth = _whole(count[:-1] if repeat else count)  # one '+', as the host library reads it
            except ValueError:
                raise ValueError(f"$PYCOLL_FAILPOINTS: {entry!r}: the pass must be an integer >= 1") from None
            if nth < 1:
                raise ValueError(f"$PYCOLL_FAILPOINTS: {entry!r}: the pass must be >= 1")
        ms = 0
        sleep = re.fullmatch(r"sleep\(([0-9]+)\)", action)  # ASCII digits only, as the host library reads it
        if sleep:
            action, ms = "sleep", int(sleep.group(1))
        elif action not in ACTIONS or action == "sleep(MS)":
            raise ValueError(f"$PYCOLL_FAILPOINTS: {entry!r}: the action must be one of {', '.join(ACTIONS)}")
        if not name:
            raise ValueError(f"$PYCOLL_FAILPOINTS: {entry!r} names no failpoint")
        rank: Optional[int] = None
        replacement: Optional[int] = 0
        trace: Optional[str] = None
        for f in filters:
            key, _, value = (p.strip(_BLANKS) for p in f.partition("="))
            try:
                if key == "rank":
                    rank = _whole(value)
                elif key == "replacement":
                    replacement = None if value == "any" else _whole(value)
                elif key == "trace" and value and (len(value.encode()) < 256 or not _host_side(name)):
                    trace = value  # the host library keeps a path of at most 255 bytes
                else:
                    raise ValueError(key)
            except ValueError:
                raise ValueError(f"$PYCOLL_FAILPOINTS: {entry!r}: bad filter {f!r} (rank=R or "
                                 f"replacement=K|any or trace=PATH)") from None
        out.append(Failpoint(name, action, nth, repeat, rank, replacement, trace, ms))
    if sum(_host_side(f.name) for f in out) > _HOST_MAX:
        raise ValueError(f"$PYCOLL_FAILPOINTS: more than {_HOST_MAX} host failpoints (host.*): the host library keeps "
                         f"the first {_HOST_MAX} only")
    return out


_lock = threading.Lock()
_active = False
_points: List[Failpoint] = []
_passes: Dict[Tuple[str, Optional[int]], int] = {}
_rank: Optional[int] = None
_replacement = 0
_declared: Dict[str, str] = {}


def _env_int(name: str) -> Optional[int]:
    raw = os.environ.get(name, "").strip()  # the launcher's per-rank contract, not a setting
    try:
        return int(raw) if raw else None
    except ValueError:
        return None


def configure(spec: Optional[str], rank: Optional[int] = None, replacement: Optional[int] = None) -> None:
    """Arm the failpoints of ``spec`` (the grammar above; None or "" disarms them) in this process.

    ``rank``/``replacement``: this process's identity for the filters (default ``PYCOLL_RANK`` and
    ``PYCOLL_REPLACEMENT``). Pass counts start again from zero.
    """
    global _active, _points, _rank, _replacement
    points = parse(spec or "")
    with _lock:
        _points = [p for p in points if p.action != "off"]
        _passes.clear()
        _rank = _env_int("PYCOLL_RANK") if rank is None else int(rank)
        _replacement = (_env_int("PYCOLL_REPLACEMENT") or 0) if replacement is None else int(replacement)
        _active = bool(_points)


def reset() -> None:
    """Disarm every failpoint."""
    configure(None)


def declare(name: str, doc: str = "") -> str:
    """Register a failpoint name (for :func:`declared`, which the failpoint tests enumerate); returns it."""
    _declared[name] = doc
    return name


def declared(prefix: str = "") -> List[str]:
    """The failpoint names declared so far (by the modules imported) that start with ``prefix``."""
    return sorted(n for n in _declared if n.startswith(prefix))


def hit(name: str, rank: Optional[int] = None) -> None:
    """Pass through failpoint ``name``; ``rank``: the rank this call acts for (default this process's).

    Does nothing unless a failpoint armed for this name, rank and pass says otherwise.
    """
    if not _active:
        return
    _fire(name, rank)


def _fire(name: str, rank: Optional[int]) -> None:
    who = _rank if rank is None else rank
    action = None
    trace: Optional[str] = None
    n = ms = 0
    with _lock:
        for p in _points:
            if not p.matches(name) or (p.rank is not None and p.rank != who):
                continue
            if p.replacement is not None and p.replacement != _replacement:
                continue
            key = (p.name + "\0" + name, who)
            n = _passes.get(key, 0) + 1
            _passes[key] = n
            if n == p.nth or (p.repeat and n > p.nth):
                action, trace, ms = p.action, p.trace, p.ms
                break
    if trace is not None:
        try:
            with open(trace, "a") as f:
                f.write(f"{name} {action} {who} {os.getpid()} {n}\n")
        except OSError:
            pass
    if action == "kill":
        os.kill(os.getpid(), signal.SIGKILL)
    elif action == "stop":
        os.kill(os.getpid(), signal.SIGSTOP)
    elif action == "raise":
        raise FailpointError(f"failpoint {name} (rank {who})")
    elif action == "sleep":
        time.sleep(ms / 1e3)


#: the host library's failpoints (pycoll/_host/failpoint.h lists the same; a test checks both)
HOST_POINTS = tuple(declare(n, "host library") for n in (
    "host.init.begin", "host.init.end",
    "host.coll.before_fill", "host.coll.after_arrive", "host.coll.after_consume", "host.coll.done", "host.coll.window",
    "host.coll.eager", "host.coll.check_waited", "host.wait.check_peer", "host.wait.brief",
    "host.shrink.begin", "host.shrink.end", "host.grow.begin", "host.grow.end",
    "host.window.exchange", "host.signal.wait", "host.stream.defer", "host.stream.handback",
    "host.stream.takeover", "host.stream.full", "host.stream.order",
))

#: the modules that declare pycoll's failpoints (each imports the ones that it builds on); a test checks the list
DECLARING_MODULES = ("pycoll.comm", "pycoll.elastic", "pycoll.launch.launcher")
_unknown_checked: Dict[str, List[str]] = {}


def unknown(points: List[Failpoint]) -> List[str]:
    """The names (or ``prefix*`` patterns) among ``points`` that match no failpoint of pycoll's or of a module
    that declared its own (:func:`declare`) so far: typically a typo, which would arm nothing."""
    import importlib

    for module in DECLARING_MODULES:  # imported here, not above: this module is a leaf
        importlib.import_module(module)
    names = list(_declared)
    return [p.name for p in points if not any(p.matches(n) for n in names)]


#: whether the setting's check warns about names nobody declared: not in a process that runs no program of the
#: user's (the launcher), where the names a program declares for itself (:func:`declare`) are not known
WARN_UNKNOWN = True


def _check(raw: str) -> None:
    """The setting's check: :func:`parse`'s ValueError, and once per value a warning naming an entry that matches
    no declared failpoint, with the nearest declared names."""
    points = parse(raw)
    if raw in _unknown_checked or not WARN_UNKNOWN:
        return
    _unknown_checked[raw] = bad = unknown(points)
    if bad:
        import difflib
        import warnings

        hints = []
        for name in bad:
            near = difflib.get_close_matches(name.rstrip("*"), list(_declared), n=2, cutoff=0.6)
            hints.append(f"{name!r}" + (f" (did you mean {' or '.join(map(repr, near))}?)" if near else ""))
        level, here = 2, os.path.dirname(os.path.abspath(__file__))
        frame: Optional[types.FrameType] = sys._getframe(1)
        while frame is not None and os.path.abspath(frame.f_code.co_filename).startswith(here):
            frame, level = frame.f_back, level + 1  # the warning names the program's line, not pycoll's
        warnings.warn(f"$PYCOLL_FAILPOINTS: no failpoint is named {', '.join(hints)}: such an entry arms nothing "
                      f"(pycoll.failpoints.declared() lists the names)", stacklevel=level)


try:
    configure(_settings.get("PYCOLL_FAILPOINTS"))
except ValueError:
    pass  # nothing armed; importing pycoll does not fail on it: a communicator's creation (settings.check_all) and
    # pycoll-run name the bad entry
_settings.register_check("PYCOLL_FAILPOINTS", _check)  # after the read above: the check imports the declaring modules
