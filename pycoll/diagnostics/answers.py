"""A failure report's facts about the other ranks: their answers to its dump request, and the last resorts.

When a rank's communicator fails, its watchdog asks every rank to dump (the store's dump signal).
Each rank's store thread answers at once, whatever its user code is doing, by publishing its
progress with the number of the request it saw (:class:`~pycoll.diagnostics.records.ProgressRecord`).
:func:`await_answers` waits, within a bound, for those answers from every rank that still reports;
a same-host rank whose process is gone is not waited for. :func:`signal_unanswered` sends the dump
signal to same-host ranks that did not answer and published that they have one: their faulthandler
writes their Python stacks from C, even while one of their threads holds the GIL.
"""

from __future__ import annotations

import os
import signal
import socket
import threading
import time
from typing import Any, Dict, Optional

from .. import failpoints as _fp
from .._procs import stat_fields
from .records import CLOSED_STATES, FailureRecord, ProgressRecord, failure_prefix, progress_prefix, read_records
from .report import FailureReport
from .signals import signal_number

__all__ = ["await_answers", "signal_unanswered", "gone", "started_before", "ANSWER_POLL"]

FP_SIGNAL_PEER = _fp.declare("watchdog.report.signal_peer", "a failure report, before it signals a silent peer")
FP_AWAIT_ANSWERS = _fp.declare("watchdog.report.await_answers", "a failure report, waiting for the peers' answers")
ANSWER_POLL = 0.02  # how often a failure report looks for the peers' answers


def await_answers(store: Any, report: FailureReport, deadline: float, stale_after: float,
                  stop: Optional[threading.Event] = None) -> None:
    """Read the others' progress and failures into ``report``, waiting until ``deadline`` (monotonic)
    for every rank that still reports (not silent, not gone, its communicator not closed) to answer the report's
    dump request."""
    t0 = time.monotonic()
    fbase = failure_prefix(report.uid)
    while True:
        _fp.hit(FP_AWAIT_ANSWERS)
        progress = read_records(store, progress_prefix(report.uid), report.size, ProgressRecord.decode)
        report.peers = {r: rec.as_dict() for r, rec in progress.items()}
        report.peer_failures = read_records(store, fbase, report.size, FailureRecord.decode, report.rank)
        report.answer_wait = time.monotonic() - t0
        a = report.analysis(stale_after)
        # a peer that closed the communicator (aborted it: its last record says so) answers no more: each report
        # waited out the whole bound for it (reports are made one at a time: 16 failed communicators, 5 s)
        waiting = [r for r in range(report.size) if r != report.rank and r not in a["answered"]
                   and r not in a["silent"] and r not in a["unknown"]
                   and (report.peers.get(r) or {}).get("state") not in CLOSED_STATES]
        for r in waiting:  # a peer on this host whose process is gone will not answer
            if r not in report.gone and gone(report.peers.get(r)):
                report.gone[r] = int(str(report.peers[r]["origin"]).rpartition(":")[2])
        waiting = [r for r in waiting if r not in report.gone]
        if not waiting or time.monotonic() >= deadline or (stop is not None and stop.is_set()):
            return
        time.sleep(min(ANSWER_POLL, max(0.0, deadline - time.monotonic())))


def signal_unanswered(report: FailureReport, stale_after: float) -> None:
    """The last resort for peers that did not answer: those on this host that publish a dump signal
    get it (recorded in ``report.signalled``). A peer that closed the communicator is not stuck in it and may be
    ending: it is left alone."""
    answered = set(report.analysis(stale_after)["answered"])
    host = socket.gethostname()
    for r, p in sorted((report.peers or {}).items()):
        signum = int(p.get("dump_signal") or 0)
        peer_host, _, pid = str(p.get("origin", "")).rpartition(":")
        if (r == report.rank or r in answered or p.get("state") in CLOSED_STATES
                or signal_number(signum or None) is None or peer_host != host
                or not pid.isdigit() or not started_before(int(pid), int(p["time_ns"]))):
            continue
        _fp.hit(FP_SIGNAL_PEER)
        try:
            os.kill(int(pid), signum)
        except OSError:
            continue
        report.signalled[r] = (int(pid), signal.Signals(signum).name)


def gone(p: Optional[Dict[str, Any]]) -> bool:
    """True when the process that published progress record ``p`` ran on this host and is gone."""
    if not p:
        return False
    host, _, pid = str(p.get("origin", "")).rpartition(":")
    return (host == socket.gethostname() and pid.isdigit() and os.path.isdir("/proc/self")
            and not started_before(int(pid), int(p["time_ns"])))


def started_before(pid: int, time_ns: int) -> bool:
    """True when process ``pid`` exists and started before ``time_ns`` (wall clock): the process that
    published a record then, not another one that reuses its pid. False where /proc cannot say."""
    fields = stat_fields(pid)
    if not fields:
        return False
    try:
        ticks = int(fields[19])
        with open("/proc/stat") as f:
            btime = next(int(line.split()[1]) for line in f if line.startswith("btime "))
        return btime + ticks / os.sysconf("SC_CLK_TCK") <= time_ns / 1e9 + 1.0
    except (OSError, ValueError, IndexError, StopIteration):
        return False
