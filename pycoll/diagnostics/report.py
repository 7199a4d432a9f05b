"""A failure report: what a failing rank knows, what it learns from the others, the one log line.

The watchdog builds a :class:`FailureReport` when a communicator fails (before its policy acts),
fills in the other ranks' published progress and failure records from the store, and turns it into
the single log line and the record kept in every later flight-recorder dump.
"""

from __future__ import annotations

import threading
import time
from typing import Any, Callable, Dict, List, Optional, Set, Tuple, Union

from ..devices import stream_text
from ..errors import CommTimeout, PeerFailure
from ..hooks import CommView, Progress, WorkView, cross_group, group_mates, op_text
from .records import CLOSED_STATES, FailureRecord

__all__ = ["FailureReport"]


def _fmt_ranks(ranks: List[int]) -> str:
    return ", ".join(str(r) for r in sorted(ranks))


class FailureReport:
    """What a failing rank knows and learns from the store; becomes the log line and the dump's record.

    ``site`` and ``sizes`` (where the operation was issued, its buffers) come from the flight
    recorder's entry: pass ``issued_at=(site, sizes)``, or a function that returns them (called
    once, when the line or the record is written: formatting a stack is not for the failing thread).
    """

    def __init__(self, comm: CommView, exc: BaseException, work: Optional[WorkView],
                 issued_at: Union[Tuple[str, str], Callable[[], Tuple[str, str]]] = ("", "")) -> None:
        self.time = time.time()
        self.monotonic = time.monotonic()
        self.comm_name = comm.name
        self.uid = comm.uid
        self.rank = comm.rank
        self.size = comm.size
        self.global_rank = comm.global_rank
        self.global_ranks = tuple(comm.global_ranks) if comm.global_ranks is not None else None
        self.generation = int(comm.generation)
        self.policy = comm.on_failure
        self.error_type = type(exc).__name__
        self.message = str(exc)
        self.is_timeout = isinstance(exc, CommTimeout)
        self.op: Optional[str] = None
        self.seq: Optional[int] = None
        self.elapsed: Optional[float] = None
        self.timeout: Optional[float] = None
        self.state: Optional[str] = None
        self.is_p2p = False
        self.peer: Optional[int] = None
        self.stream = ""
        self.group = ""
        self.peers_of_group: Set[int] = set()
        self.others: Tuple[str, ...] = ()  # other communicators' operations of its group (hooks.cross_group)
        self._issued_at: Union[Tuple[str, str], Callable[[], Tuple[str, str]]] = ("", "")
        if work is not None:
            self.op = work.op
            self.is_p2p = bool(work.is_p2p)
            self.seq = work.p2p_seq if work.is_p2p else work.seq
            self.peer = work.peer
            self.elapsed = time.monotonic() - work.t0
            # a group's timeout: the deadline that passed may be another operation's of the group (CommTimeout says)
            expired = getattr(exc, "timeout", None) if self.is_timeout else None
            self.timeout = work.timeout if expired is None else expired
            self.state = work.last_state
            self.stream = stream_text(work.stream, comm.device)
            self._issued_at = issued_at
            try:
                mates = group_mates(comm.outstanding(), work)
            except Exception:
                mates = [work]
            if len(mates) > 1:  # which of them its group waits for is unknown: every peer of its transfers is looked at
                self.group = f" (it completes with its group: {', '.join(op_text(x) for x in mates)})"
                self.peers_of_group = {x.peer for x in mates if x.is_p2p and x.peer is not None}
            self.others = cross_group(work)
            if self.others:  # the group also held other communicators' operations, which it may wait for
                self.group += (f" (its group held operations of other communicators too, which the library ends with "
                               f"it: {', '.join(self.others)})")
        try:  # this rank's own progress, before the policy releases the outstanding operations
            self.progress: Optional[Progress] = comm.progress()
        except Exception:
            self.progress = None
        self.request: Optional[int] = None  # the dump request this report made (peers' answers name it)
        self.answer_wait = 0.0  # how long it waited for the peers' answers
        self.gone: Dict[int, int] = {}  # rank -> pid: same-host peers whose process no longer exists
        # rank -> (pid, why): the peer the liveness check found unable to take part (stopped, exited, silent), the
        # cause of a PeerFailure -- kept as a fact of its own (the dump's ``unable``), not only in the message
        self.unable: Dict[int, Tuple[int, str]] = (
            {exc.rank: (exc.pid if isinstance(exc.pid, int) else 0, str(exc.reason))}
            if isinstance(exc, PeerFailure) and isinstance(exc.rank, int) and exc.rank >= 0 else {})
        self.signalled: Dict[int, Tuple[int, str]] = {}  # rank -> (pid, signal): same-host peers sent the dump signal
        self.peers: Optional[Dict[int, Dict[str, Any]]] = None  # rank -> progress (None: not read)
        self.peer_failures: Dict[int, FailureRecord] = {}
        self.store_error = ""
        self.exchanged = threading.Event()  # the store exchange is over
        self.reported = threading.Event()  # the line is logged and the dump queued
        self.maker: Optional[int] = None  # the thread making the report (its ident)

    def _site_sizes(self) -> Tuple[str, str]:
        if callable(self._issued_at):
            self._issued_at = self._issued_at()
        return self._issued_at

    @property
    def site(self) -> str:
        """``'file:line in function'`` where the failed operation was issued ('' when unknown)."""
        return self._site_sizes()[0]

    @property
    def sizes(self) -> str:
        """The failed operation's buffers, as ``'Float(2,)'`` ('' when unknown)."""
        return self._site_sizes()[1]

    def record(self) -> FailureRecord:
        """What the other ranks read in the store."""
        return FailureRecord(self.error_type, self.message, self.op, self.seq, self.is_p2p, self.peer, self.elapsed,
                             self.time)

    def brief(self) -> str:
        return self.record().brief()

    def answered(self, p: Dict[str, Any]) -> bool:
        """True when the progress record ``p`` answers this report's own request (it is fresh)."""
        return self.request is not None and int(p.get("request", -1)) >= self.request

    def analysis(self, stale_after: float) -> Dict[str, Any]:
        """Classify the other ranks from their published progress (empty when it could not be read).

        Only what is known: a rank is ``behind`` when its answer to this report's dump request (a
        fresh record) says it had not issued this operation, or when its last report is older than
        ``stale_after`` (it stopped reporting: stopped, hung or dead) and says so; a rank whose last
        report predates the request and is not that old is ``unconfirmed`` (that report, with its
        age, is all there is). Values: rank -> (last issued sequence id, age of the report in
        seconds at the failure; negative: made after it). ``in_op``: ranks known to have issued it
        and not completed it; ``silent``: rank -> age, for reports older than ``stale_after``;
        ``unknown``: ranks that never reported (and did not report a failure); ``answered``: ranks
        whose record answers the request.
        """
        behind: Dict[int, Tuple[int, float]] = {}
        unconfirmed: Dict[int, Tuple[int, float]] = {}
        same: List[int] = []
        silent: Dict[int, float] = {}
        unknown: List[int] = []
        answered: List[int] = []
        out: Dict[str, Any] = {"behind": behind, "unconfirmed": unconfirmed, "in_op": same, "silent": silent,
                               "unknown": unknown, "answered": answered}
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
            fresh = self.answered(p)
            if fresh:
                answered.append(r)
            age = max(0.0, (now_ns - p["time_ns"]) / 1e9)  # a report published after now was read: "-0.0 s old"
            if not fresh and age > stale_after and r not in self.peer_failures:
                silent[r] = age
            if self.seq is None:
                continue
            # a rank that reported its own failure in this very operation issued it, whatever its
            # last progress report says
            theirs = self.peer_failures.get(r)
            failed_here = theirs is not None and theirs.failed_in(self.op, self.seq, self.is_p2p)
            known = fresh or r in silent
            if theirs is not None and not failed_here and theirs.seq is not None and theirs.is_p2p == self.is_p2p:
                known = True  # its own record says where it failed
            if self.is_p2p:
                if r == self.peer or r in self.peers_of_group:
                    (behind if known else unconfirmed)[r] = (p["p2p_enqueued"], age)
                continue
            issued = p["coll_enqueued"]
            if theirs is not None and not failed_here and theirs.seq is not None and not theirs.is_p2p:
                issued = max(issued, theirs.seq)
            if issued < self.seq and not failed_here:
                (behind if known else unconfirmed)[r] = (issued, age)
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
            what = f"{self.op} #{self.seq}"
            if self.is_p2p and self.peer is not None:
                what += f" with peer {self.peer}{self._global(self.peer)}"
            if self.sizes:
                what += f" [{self.sizes}]"
            if self.is_timeout:
                never = ": it never started on its stream" if self.state == "scheduled" else ""
                parts.append(f"{what}{self.stream}{self.group} not completed after {self.elapsed:.2f} s (timeout "
                             f"{self.timeout:g} s, state {self.state}{never})")
            else:
                parts.append(f"{self.message}; in flight: {what} for {self.elapsed:.2f} s (state {self.state})")
            if self.site:
                parts.append(f"issued at {self.site}")
        else:
            parts.append(self.message)
        parts.extend(self._peer_parts(self.analysis(stale_after)))
        if self.signalled:
            parts.append("sent the dump signal (no answer; stacks from faulthandler): " + "; ".join(
                f"{self._who(r)} (pid {pid}, {name})" for r, (pid, name) in sorted(self.signalled.items())))
        if self.peer_failures:
            parts.append("failed too: " + "; ".join(f"{self._who(r)}: {rec.brief()}"
                                                   for r, rec in sorted(self.peer_failures.items())))
        parts.append(f"policy: {self.policy}")
        return "; ".join(parts)

    def tell(self, exc: BaseException, stale_after: float) -> None:
        """Give the timeout ``exc`` that the caller sees what the other ranks' progress says: its text gets
        the line's verdict on them (who is behind, silent or unconfirmed), ``exc.behind`` the ranks found behind."""
        if not isinstance(exc, CommTimeout) or self.peers is None:
            return
        a = self.analysis(stale_after)
        exc.behind = tuple(sorted(a["behind"]))
        parts = self._peer_parts(a)
        if parts:
            exc.args = (f"{exc}; " + "; ".join(parts), *exc.args[1:])

    def _peer_parts(self, a: Dict[str, Any]) -> List[str]:
        """What the line says of the other ranks, from :meth:`analysis`'s classification ``a``."""
        parts: List[str] = []
        if self.peers is None:
            parts.append(f"other ranks' progress unknown ({self.store_error or 'no store'})")
        else:
            kind = "p2p " if self.is_p2p else ""
            items = []
            for r, (last, age) in sorted(a["behind"].items()):
                who = self._who(r)
                if r in a["silent"]:
                    items.append(f"{who} (last reported {kind}#{last} {age:.1f} s ago: stopped, hung or dead)")
                elif r in self.peer_failures:  # where it failed, by its own record (maybe a collective where this
                    # is a send, or the other way round), and how far it got in this operation's numbering
                    rec = self.peer_failures[r]
                    where = f"in {rec.op} #{rec.seq}; " if rec.op is not None else ""
                    items.append(f"{who} (failed {where}last issued {kind}#{last})")
                else:
                    items.append(f"{who} (alive, answered: last issued {kind}#{last})")
            if items:
                parts.append(("peer: " if self.is_p2p and len(items) == 1 else "peers: " if self.is_p2p
                              else "behind: ") + "; ".join(items))
            # a peer that issued as many sends and receives (or failed in one of its own): it waits in its own
            waiting_too = [r for r, (last, _) in sorted(a["behind"].items())
                           if self.is_p2p and self.seq is not None and last >= self.seq and r not in a["silent"]
                           and (self.peer_failures[r].is_p2p if r in self.peer_failures
                                else self.peers[r].get("p2p_completed", last) < last)]
            if waiting_too:
                who = ", ".join(self._who(r) for r in waiting_too)
                theirs = {self.peer_failures[r].op for r in waiting_too if r in self.peer_failures}
                if self.op == "wait_signal" or theirs == {"wait_signal"}:  # a one-sided wait: no send to group
                    parts.append(f"{who} waits for a signal of its own (wait_signal): ranks that each wait for the "
                                 "other's signal before sending theirs wait for ever -- check that every wait_signal "
                                 "has its signal (signal or put_signal) sent, by a rank that does not wait first")
                else:
                    parts.append(f"{who} waits in a send or receive of its own: two ranks that each post a send (or a "
                                 "receive) to the other first wait for ever -- put a rank's send and receive in one "
                                 "comm.group() (or use sendrecv), and check that every receive has its send")
            if a["unconfirmed"]:
                parts.append("not confirmed: " + "; ".join(
                    f"{self._who(r)} (last report {age:.1f} s old said {kind}#{last}; "
                    + (f"its process (pid {self.gone[r]}, this host) is gone)" if r in self.gone
                       else f"it {self._closed(r)} the communicator since)" if self._closed(r)
                       else f"no answer within {self.answer_wait:.1f} s)")
                    for r, (last, age) in sorted(a["unconfirmed"].items())))
            if not items and not a["unconfirmed"] and not a["unknown"] and self.op is not None and not self.is_p2p:
                parts.append(f"no rank is behind: every rank issued #{self.seq}" + (
                    " (the group waits for the other communicators' operations too: see their reports)"
                    if self.others else ""))
            if a["in_op"]:
                parts.append(f"also in #{self.seq}: ranks {self._ranks(a['in_op'])}")
            others = {r: age for r, age in a["silent"].items() if r not in a["behind"]}
            if others:
                parts.append("silent: " + "; ".join(f"{self._who(r)} (no report for {age:.1f} s)"
                                                     for r, age in sorted(others.items())))
            if a["unknown"]:
                parts.append(f"never reported: ranks {self._ranks(a['unknown'])}")
        return parts

    def _closed(self, r: int) -> str:
        """``"aborted"`` or ``"destroyed"`` where rank ``r``'s last record says it closed the communicator, else ''."""
        state = str(((self.peers or {}).get(r) or {}).get("state", ""))
        return state if state in CLOSED_STATES else ""

    def _who(self, r: int) -> str:
        return f"rank {r}{self._global(r)}"

    def _global(self, r: int) -> str:
        """`` (global G)`` where this communicator's rank ``r`` is another rank of the job, else ''."""
        g = self.global_ranks
        return f" (global {g[r]})" if g and 0 <= r < len(g) and g[r] != r else ""

    def _ranks(self, ranks: List[int]) -> str:
        """Several ranks of this communicator, each with its job-wide rank where that differs."""
        if not any(self._global(r) for r in ranks):
            return _fmt_ranks(ranks)
        return ", ".join(f"{r}{self._global(r)}" for r in sorted(ranks))

    def as_dict(self, stale_after: float) -> Dict[str, Any]:
        a = self.analysis(stale_after)
        return {
            "time": self.time, "comm": self.comm_name, "uid": self.uid, "rank": self.rank, "size": self.size,
            "global_rank": self.global_rank, "generation": self.generation, "error_type": self.error_type,
            "message": self.message, "op": self.op, "seq": self.seq, "is_p2p": self.is_p2p, "peer": self.peer,
            "elapsed_s": self.elapsed, "timeout_s": self.timeout, "state": self.state, "site": self.site,
            "policy": self.policy, "peers": {str(r): p for r, p in (self.peers or {}).items()},
            "peers_known": self.peers is not None,
            "peer_failures": {str(r): rec.brief() for r, rec in self.peer_failures.items()},
            # a report made after the failure (an answer to its request) is 0 s old at the failure, not less
            "behind": {str(r): {"last_issued": last, "report_age_s": max(0.0, age), "answered": r in a["answered"]}
                       for r, (last, age) in a["behind"].items()},
            "unconfirmed": {str(r): {"last_issued": last, "report_age_s": max(0.0, age)}
                            for r, (last, age) in a["unconfirmed"].items()},
            "answered": a["answered"], "request": self.request, "answer_wait_s": self.answer_wait,
            "gone": {str(r): pid for r, pid in self.gone.items()},
            "unable": {str(r): {"pid": pid, "why": why} for r, (pid, why) in self.unable.items()},
            "signalled": {str(r): {"pid": pid, "signal": name} for r, (pid, name) in self.signalled.items()},
            "own_progress": self.progress.as_dict() if self.progress is not None else None,
            "in_op": a["in_op"],
            "silent": {str(r): age for r, age in a["silent"].items()}, "unknown": a["unknown"],
            "store_error": self.store_error,
        }
