"""The dump queue: dump requests, the gates that hold failure dumps back during a recovery, one dump for all.

Dumps are written by the watchdog's monitor thread, never by the thread that detected a failure.
A failure's (or another rank's) dump request may be held while any gate says no -- the elastic
layer holds them while it rebuilds a communicator -- for at most ``hold`` seconds from the
failure, and never while the process is flushing at exit.
"""

from __future__ import annotations

import collections
import itertools
import logging
import threading
import time
from typing import Any, Callable, Deque, Dict, List, Optional, Set

from .. import failpoints as _fp

__all__ = ["DumpJob", "DumpQueue", "HOLDABLE"]

_log = logging.getLogger("pycoll.watchdog")

HOLDABLE = ("failure", "remote")  # dump triggers a gate may hold back
GATE_POLL = 0.02  # how often held dumps look at the gates
FP_DUMP_WRITE = _fp.declare("watchdog.dump.write", "the monitor thread is about to write a dump")


class DumpJob:
    """One request to dump: why, what triggered it; ``done`` is set once written (``paths``). ``generation``: the
    generation it is about (a failure's), dumped even where none of its communicators is left by the time the dump is
    written (held through a reshape, with recording off)."""

    __slots__ = ("reason", "trigger", "done", "paths", "extra", "created", "generation")

    def __init__(self, reason: str, trigger: str, extra: Optional[Dict[str, Any]] = None,
                 created: Optional[float] = None, generation: Optional[int] = None) -> None:
        self.generation = generation
        self.created = time.monotonic() if created is None else created  # a gate holds it `hold` from here
        self.reason = reason
        self.trigger = trigger
        self.extra = extra
        self.done = threading.Event()
        self.paths: List[str] = []


class DumpQueue:
    """Jobs waiting for the monitor thread, the ones held by gates, and the gates."""

    def __init__(self, hold: Callable[[], float]) -> None:
        self._hold = hold
        self._jobs: Deque[DumpJob] = collections.deque()
        self._held: List[DumpJob] = []  # monitor thread only
        self._unfinished: Set[DumpJob] = set()  # queued, held or being written
        self._gates: Dict[int, Callable[[], bool]] = {}
        self._gate_ids = itertools.count(1)
        self.flushing = False  # held dumps go ahead (exit)
        self.last_start = -1e9  # time.monotonic() of the last dump started

    def reset(self) -> None:
        """Forget everything (a forked child)."""
        self._jobs.clear()
        self._held = []
        self._unfinished = set()
        self._gates = {}
        self.flushing = False

    def submit(self, job: DumpJob) -> DumpJob:
        self._unfinished.add(job)
        self._jobs.append(job)
        return job

    @property
    def holding(self) -> bool:
        return bool(self._held)

    def add_gate(self, gate: Callable[[], bool]) -> int:
        token = next(self._gate_ids)
        self._gates[token] = gate
        return token

    def remove_gate(self, token: int) -> None:
        self._gates.pop(token, None)

    def gates_open(self) -> bool:
        for gate in list(self._gates.values()):
            try:
                if not gate():
                    return False
            except Exception:
                _log.debug("watchdog: dump gate %r failed", gate, exc_info=True)
        return True

    def may_release(self) -> bool:
        """True when held dumps may be written now."""
        return (self.flushing or not self._held or time.monotonic() - self._held[0].created >= self._hold()
                or self.gates_open())

    def take(self) -> List[DumpJob]:
        """The jobs to write now (monitor thread): new ones not holdable, plus the held ones once released."""
        jobs: List[DumpJob] = []
        while self._jobs:
            job = self._jobs.popleft()
            (self._held if job.trigger in HOLDABLE else jobs).append(job)
        if self._held and self.may_release():
            jobs, self._held = self._held + jobs, []
        return jobs

    def run(self, jobs: List[DumpJob], dump: Callable[..., List[str]]) -> None:
        """One dump serves every job given (their reasons are merged)."""
        first = jobs[0]
        reason = first.reason if len(jobs) == 1 else "; ".join(dict.fromkeys(j.reason for j in jobs))
        triggers = list(dict.fromkeys(j.trigger for j in jobs))
        self.last_start = time.monotonic()
        paths: List[str] = []
        extra: Dict[str, Any] = {}
        for j in jobs:
            extra.update(j.extra or {})
        about = sorted({j.generation for j in jobs if j.generation is not None})
        try:
            _fp.hit(FP_DUMP_WRITE)
            paths = dump(reason, trigger="+".join(triggers),
                         changed_only=all(j.trigger in ("remote", "stall") for j in jobs), extra=extra or None,
                         **({"also": about} if about else {}))
        except Exception:
            _log.exception("watchdog: dump failed")
        finally:
            for j in jobs:
                j.paths = paths
                j.done.set()
                self._unfinished.discard(j)

    def wait(self, deadline: float) -> bool:
        """Wait until every job submitted so far is written, or ``deadline`` (monotonic); True when all were."""
        return all(job.done.wait(max(0.0, deadline - time.monotonic())) for job in list(self._unfinished))
