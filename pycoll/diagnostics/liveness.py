"""Peer liveness: a peer that is stopped, gone or silent fails the outstanding work within about a
second, whatever the operation's timeout.

A rank stopped by SIGSTOP (or frozen under a debugger) never reaches the collective, and without
this the others would wait for the whole timeout T (30 s by default). The watchdog's liveness
thread (``pycoll-watchdog-liveness``) watches the peers of every communicator that has work
outstanding:

* **Same host** (equal boot id and pid namespace): the peer's process state, read from
  ``/proc/<pid>/stat`` every ``PYCOLL_WATCHDOG_LIVENESS_INTERVAL`` seconds. A process that exited
  (gone, a zombie, or its pid reused by another process), is stopped (``T``) or stopped under a
  tracer (``t``) fails the work when seen so on two rounds in a row (one interval apart) while the
  same operation is still pending: an operation the peer had finished its part of before it went
  completes, and a SIGSTOP followed at once by SIGCONT is not a failure.
* **Other hosts**: the peer's heartbeat, the progress record its watchdog publishes every
  ``PYCOLL_WATCHDOG_PUBLISH_INTERVAL`` seconds. Read from the store only while an operation has been
  outstanding for longer than the peer's period, at most once per period; a record that has not
  changed for ``PYCOLL_WATCHDOG_HEARTBEAT_TIMEOUT`` seconds (at least three periods), measured on
  this host's clock, fails the work -- unless this rank's own heartbeat has not changed there either: then the
  store takes no writes (a process stopped holding a FileStore's lock), and silence proves nothing.

A rank that is alive but slow (computing, sleeping in Python, blocked in another call) is running
or sleeping and keeps its heartbeat, so it gets its full timeout. The failure is a
:class:`~pycoll.PeerFailure` naming the rank, its pid and why; the communicator's policy acts as for
any failure (the elastic layer's revoke and reshape), and the watchdog reports and dumps it (the report keeps
that rank, pid and why as a field of their own, ``unable``, which ``pycoll-fr`` names as the cause).

Every rank's watchdog publishes where its process runs (:class:`~.records.ProcRecord`, one store
write per communicator, made as the communicator is created, before its init returns to the caller);
peers read those records once, when their first operation is outstanding. A communicator without a
store, or a peer without a watchdog, is not watched.
``PYCOLL_WATCHDOG_LIVENESS=0`` turns the watching off.
"""

from __future__ import annotations

import contextlib
import logging
import os
import socket
import threading
import time
from typing import Dict, List, Optional, Sequence, Set, Tuple

from .. import failpoints as _fp
from .._procs import boot_id, exiting, stat_fields
from .._settings import requests_until
from ..errors import PeerFailure, StoreError
from ..hooks import CommView, WorkView, op_text
from .records import ProcRecord, ProgressRecord, proc_prefix, progress_prefix, read_records

__all__ = ["Liveness", "round_all", "process_state", "this_process", "simulate_remote", "FP_LIVENESS_CHECK",
           "FP_LIVENESS_FOUND"]

_log = logging.getLogger("pycoll.watchdog")

FP_LIVENESS_CHECK = _fp.declare("watchdog.liveness.check", "the liveness thread checks a communicator's peers")
FP_LIVENESS_FOUND = _fp.declare("watchdog.liveness.found", "a peer was found stopped, gone or silent, before "
                                "the communicator is failed")

_all_remote = False  # a test hook: treat every peer as one on another host (heartbeats only)


def simulate_remote(on: bool = True) -> None:
    """For tests: treat every peer as a process on another host, watched through its heartbeat only."""
    global _all_remote
    _all_remote = bool(on)


def _stat(pid: int) -> Optional[Tuple[str, int]]:
    """(state letter, start time in clock ticks) of a process of this pid namespace; None: no such process.
    A process that has begun to exit (its memory is still being torn down) counts as ``X``."""
    fields = stat_fields(pid)
    try:
        return ("X" if exiting(fields) else fields[0], int(fields[19])) if fields else None
    except (IndexError, ValueError):
        return None


def this_process(period: float) -> ProcRecord:
    """This process, as its peers watch it (``period``: its heartbeat period, seconds)."""
    pid = os.getpid()
    st = _stat(pid)
    try:
        pidns = os.readlink("/proc/self/ns/pid")
    except OSError:
        pidns = ""
    return ProcRecord(socket.gethostname(), boot_id(), pidns, pid,
                      st[1] if st else 0, period)


_STATES = {"T": "stopped (SIGSTOP)", "t": "stopped by a tracer", "Z": "exited (a zombie)", "X": "exited"}


def process_state(pid: int, start: int) -> Optional[str]:
    """Why the process ``pid`` (started at ``start`` clock ticks; 0: unknown) cannot take part any more,
    or None while it runs or sleeps. Same host only."""
    st = _stat(pid)
    if st is None:
        return "gone (exited)"
    if start and st[1] != start:
        return "gone (exited; its pid now belongs to another process)"
    return _STATES.get(st[0])


class _Peers:
    """What is known of one communicator's peers."""

    __slots__ = ("procs", "complete", "next_fetch", "beats", "next_beat", "remote", "published", "publishing",
                 "suspect", "suspect_at")

    def __init__(self) -> None:
        self.procs: Dict[int, ProcRecord] = {}
        self.complete = False
        self.next_fetch = 0.0
        self.beats: Dict[int, Tuple[Tuple[int, int], float]] = {}  # rank -> (heartbeat, local time it changed)
        self.next_beat = 0.0
        # the last heartbeat read's verdict, which stands until the next read (once a period): a round between
        # two reads that said "nothing found" cleared the suspicion every time, and a silent peer on another host
        # was never failed where the period is longer than the rounds' interval (the defaults: 1 s and 0.2 s)
        self.remote: List[Tuple[int, ProcRecord, str]] = []  # the silent peers at the last heartbeat read
        self.published = False
        # held by the thread writing this process's record: the creating thread (Liveness.announce, as the
        # communicator is made) and the liveness thread's first round both saw ``published`` False and both wrote
        # it; the second write came after a peer stopped holding a FileStore's lock file, waited for it for the
        # store's whole timeout, and the liveness thread checked no peer meanwhile (the stopped one was found at
        # the operation's timeout only)
        self.publishing = threading.Lock()
        self.suspect: Optional[int] = None  # op_id of the oldest work pending when a peer was found unable
        self.suspect_at = 0.0  # when (a round woken early, e.g. by a new communicator, is no round later)


class Liveness:
    """The checks behind the watchdog's liveness thread (see the module documentation).

    Settings (seconds), kept current by the watchdog: ``interval`` (same-host checks),
    ``heartbeat_timeout`` (other hosts), ``period`` (this process's heartbeat period).
    """

    def __init__(self, interval: float, heartbeat_timeout: float, period: float) -> None:
        self.interval = interval
        self.heartbeat_timeout = heartbeat_timeout
        self.period = period
        self._peers: Dict[str, _Peers] = {}
        self._me: Optional[ProcRecord] = None

    def forget(self, live_uids: Sequence[str]) -> None:
        """Drop what is known of communicators that are gone."""
        for uid in [u for u in self._peers if u not in live_uids]:
            del self._peers[uid]

    def announce(self, c: CommView, wait: bool = True) -> Optional[_Peers]:
        """Publish this process for ``c`` unless done already; what is known of ``c``'s peers (None: ``c``
        is not watched). The watchdog also calls it as ``c`` is made, in the thread that makes it: a
        rank stopped or killed right after ``c``'s init returned, before this thread's next round, is
        then still known to its peers, which find it at their first outstanding operation.

        One thread writes the record at a time, once. ``wait``: where another thread is writing it now, wait for
        that write (the creating thread: the record is in the store when its init returns), and write it where
        that one failed. Without ``wait`` (the liveness thread's rounds, the waits of ``unable_peer``, which must go
        on to their checks) a write in progress elsewhere is left to finish, and a write of this thread's own (a
        retry, the creating thread's having failed) gives up after ``interval`` (at least 1 s: the requests'
        least bound): the next round tries again. A write that waited for the store (a FileStore's lock file held
        by a stopped peer) for the store's own timeout otherwise kept this thread from checking any peer."""
        if c.store is None or c.size < 2:
            return None
        p = self._peers.get(c.uid)
        if p is None:
            p = self._peers.setdefault(c.uid, _Peers())
        if not p.published:
            self._publish(c, p, wait)
        return p

    def round(self, c: CommView, now: float, check: bool = True) -> None:
        """One round for communicator ``c``: publish this process once (also with ``check`` off: the
        peers may watch it), then check its peers while work is outstanding; fail ``c`` when one
        cannot take part any more."""
        p = self.announce(c, wait=False)
        if p is None:
            return
        outstanding = c.outstanding() if check else ()
        if not outstanding:
            p.suspect, p.remote = None, []
            return
        _fp.hit(FP_LIVENESS_CHECK)
        if not p.complete and now >= p.next_fetch:
            self._fetch(c, p, now)
        # sends, receives and one-sided operations wait for their peers only: a third rank stopped or gone is no
        # failure of theirs (NCCL's transfer between two live ranks goes on); a collective waits for every rank
        peers = {p for w in outstanding if w.is_p2p and w.peer is not None for p in (w.peers or (w.peer,))}
        only = peers if len(peers) and all(w.is_p2p and w.peer is not None for w in outstanding) else None
        found = self._unable(c, p, outstanding[0], now, only)
        if found is not None and only is not None:
            # a peer that left once this rank's part with it was done is no failure, though a group's operations
            # with it still look outstanding (they share their completion with the group's others)
            done = _peers_done(c, outstanding)
            if found[0] in done:
                only -= done
                found = self._unable(c, p, outstanding[0], now, only) if only else None
        if found is None:
            p.suspect = None
            return
        # an operation the peer had finished its part of may still complete here: fail only work that
        # was outstanding when the peer was first found unable to take part, one round ago, and still is
        for w in outstanding:
            c.try_refresh(w)
        pending = [w for w in c.outstanding() if w.last_state != "completed" and w.error is None]
        if not pending:
            p.suspect = None
            return
        # the operation named: one waiting for the rank found, where there is one
        work = next((w for w in pending if w.is_p2p and found[0] in (w.peers or (w.peer,))), pending[0])
        if p.suspect is None or p.suspect not in {w.op_id for w in pending}:
            p.suspect, p.suspect_at = work.op_id, now
            return
        if now - p.suspect_at < 0.5 * self.interval:
            return  # woken early: the peer's part may still be on its way
        self._fail(c, work, now, *found)

    def _unable(self, c: CommView, p: _Peers, oldest: WorkView, now: float, only: Optional[Set[int]]
                ) -> Optional[Tuple[int, ProcRecord, str]]:
        return self._check_local(c, p, only=only) or self._check_remote(c, p, oldest, now, only)

    def _publish(self, c: CommView, p: _Peers, wait: bool) -> None:
        me = self._me  # known before any write: a round that leaves the write to another thread checks with it
        if me is None or me.pid != os.getpid() or me.period != self.period:
            me = self._me = this_process(self.period)
        if not p.publishing.acquire(blocking=wait):
            return  # another thread is writing it (see announce)
        try:
            if p.published:  # written while this thread waited for the lock, or since it looked
                return
            # on its way when this returns (in the kernel's buffers, also if this process stops or dies
            # next), without a round trip on the creating thread
            put = getattr(c.store, "set_nowait", None) or c.store.set
            with contextlib.nullcontext() if wait else requests_until(time.monotonic() + self.interval):
                put(f"{proc_prefix(c.uid)}{c.rank}", me.encode())
            p.published = True
        except Exception as e:  # the next round tries again
            _log.debug("watchdog: could not publish this process for %r: %s", c.name, e)
        finally:
            p.publishing.release()

    def _fetch(self, c: CommView, p: _Peers, now: float) -> None:
        try:
            p.procs = read_records(c.store, proc_prefix(c.uid), c.size, ProcRecord.decode, c.rank)
        except Exception as e:
            _log.debug("watchdog: could not read the peers' processes of %r: %s", c.name, e)
        p.complete = len(p.procs) == c.size - 1
        p.next_fetch = now + max(self.period, self.interval)  # peers without a watchdog never publish one
        if not p.complete:
            self._from_library(c, p)

    def _from_library(self, c: CommView, p: _Peers) -> None:
        """The peers that have not published their record (yet: a process stopped right after the library made the
        communicator, before its watchdog wrote it, never does), as the library knows their processes -- pycoll's
        host library, whose ranks share this host and pid namespace -- watched as this host's records until theirs
        come. None of them where the library cannot say."""
        me = self._me
        if me is None:
            return
        for rank in range(c.size):
            if rank == c.rank or rank in p.procs:
                continue
            proc = c.peer_process(rank)
            if proc is None:
                return
            pid, start, pidns = proc
            if pid > 0 and me.pidns == f"pid:[{pidns}]":
                p.procs[rank] = ProcRecord(me.host, me.boot, me.pidns, pid, start, me.period)

    def _local(self, rec: ProcRecord) -> bool:
        me = self._me
        return (not _all_remote and me is not None and bool(rec.boot) and rec.boot == me.boot
                and rec.pidns == me.pidns)

    def unable_peer(self, c: CommView, now: float, skip: Sequence[int] = ()) -> Optional[Tuple[int, ProcRecord, str]]:
        """A peer of ``c`` on this host, other than the ranks in ``skip``, that cannot take part any more (stopped,
        exited): ``(rank, its record, why)``, else None. For a thread that waits on ``c`` outside any operation (a
        shrink, grow, split or finalize: ``Communicator._poll``), which no round watches. The peers' records are
        read from the store as a round reads them (until every peer's is known, at most once a period)."""
        p = self.announce(c, wait=False)
        if p is None:
            return None
        if not p.complete and now >= p.next_fetch:
            self._fetch(c, p, now)
        return self._check_local(c, p, skip)

    def _check_local(self, c: CommView, p: _Peers, skip: Sequence[int] = (), only: Optional[Set[int]] = None
                     ) -> Optional[Tuple[int, ProcRecord, str]]:
        for rank, rec in p.procs.items():
            if rank in skip or (only is not None and rank not in only) or not self._local(rec):
                continue
            why = process_state(rec.pid, rec.start)
            if why is not None:
                return rank, rec, why
        return None

    def _check_remote(self, c: CommView, p: _Peers, oldest: WorkView, now: float, only: Optional[Set[int]] = None
                      ) -> Optional[Tuple[int, ProcRecord, str]]:
        remote = {r: rec for r, rec in p.procs.items() if not self._local(rec) and (only is None or r in only)}
        if not remote:
            return None
        period = max(rec.period for rec in remote.values())
        if now - oldest.t0 < period:
            return None
        if now < p.next_beat:
            return _first(p.remote, only)
        gap = now - p.next_beat > 2 * period  # not read for a while: every heartbeat starts afresh
        p.next_beat = now + period
        p.remote = self._read_heartbeats(c, p, remote, now, gap, period)
        return _first(p.remote, only)

    def _read_heartbeats(self, c: CommView, p: _Peers, remote: Dict[int, ProcRecord], now: float, gap: bool,
                         period: float) -> List[Tuple[int, ProcRecord, str]]:
        """Read the peers' heartbeats: the peers whose heartbeat has not changed for the heartbeat timeout, in rank
        order (all of them: a round that leaves some out -- their part done -- asks again between reads)."""
        ranks = sorted(remote)
        read = (*ranks, c.rank)  # this rank's own heartbeat too: it tells whether the store takes writes
        try:
            raws = c.store.multi_get([f"{progress_prefix(c.uid)}{r}" for r in read], timeout=min(1.0, period))
        except (StoreError, OSError) as e:  # no verdict on a store that does not answer
            _log.debug("watchdog: could not read the heartbeats of %r: %s", c.name, e)
            return []
        silent: Dict[int, float] = {}
        for rank, raw in zip(read, raws, strict=True):
            rec = ProgressRecord.decode(raw)
            beat = (rec.time_ns, rec.beats) if rec is not None else (0, 0)
            last = p.beats.get(rank)
            if last is None or gap or last[0] != beat:
                p.beats[rank] = (beat, now)
            else:
                silent[rank] = now - last[1]
        if silent.get(c.rank, 0.0) >= max(self.heartbeat_timeout, 3 * self.period):
            # this rank's own heartbeat has not reached the store either: the store takes no writes (a process
            # stopped holding a FileStore's lock), which says nothing of the peers
            _log.debug("watchdog: %r: this rank's own heartbeat is %.1f s old in the store: no verdict on the "
                       "peers' silence", c.name, silent[c.rank])
            return []
        return [(rank, remote[rank], f"silent: no heartbeat for {silent[rank]:.1f} s") for rank in ranks
                if silent.get(rank, 0.0) >= max(self.heartbeat_timeout, 3 * remote[rank].period)]

    def _fail(self, c: CommView, work: WorkView, now: float, rank: int, rec: ProcRecord, why: str) -> None:
        _fp.hit(FP_LIVENESS_FOUND)
        where = "" if self._local(rec) else f" on {rec.host}"
        global_rank = c.global_ranks[rank] if c.global_ranks is not None else rank
        who = f"rank {rank} (pid {rec.pid}{where})" + (f", global rank {global_rank}," if global_rank != rank else "")
        exc = PeerFailure(f"communicator {c.name!r} rank {c.rank}: {who} is {why}; {op_text(work)} failed "
                          f"after {now - work.t0:.2f} s of its {work.timeout:g} s timeout", rank, rec.pid, why)
        c.fail(exc, work)


# the operations the library counts with their one peer (CommView.open_with); a wait_signal waits for several
_COUNTED = frozenset({"send", "recv", "sendrecv", "put_signal", "signal"})


def _peers_done(c: CommView, works: Sequence[WorkView]) -> Set[int]:
    """The peers of ``works`` (outstanding) with which the library has finished every operation of this rank (sends,
    receives, puts and signals only: no other work waits for them); empty where it cannot say."""
    peers = {w.peer for w in works if w.op in _COUNTED and w.peer is not None}
    peers -= {r for w in works if w.op not in _COUNTED for r in (w.peers or (w.peer,))}
    return {r for r in peers if c.open_with(r) == 0}


def _first(found: List[Tuple[int, ProcRecord, str]], only: Optional[Set[int]]
           ) -> Optional[Tuple[int, ProcRecord, str]]:
    """The first of ``found`` whose rank is in ``only`` (None: any), else None."""
    return next((f for f in found if only is None or f[0] in only), None)


def round_all(liveness: Liveness, comms: List[CommView], now: float, check: bool = True) -> None:
    """One round over ``comms`` (errors are logged, never raised: the thread goes on)."""
    for c in comms:
        if c.state != "active" or c.failure is not None:
            continue
        try:
            liveness.round(c, now, check)
        except Exception:
            _log.exception("watchdog: the liveness check of %r failed", c.name)
    liveness.forget([c.uid for c in comms])
