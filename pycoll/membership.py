"""The elastic layer's membership protocol over a store: the agreement of the survivors and the
admission of joiners, with no communicator involved.

:class:`pycoll.ElasticGroup` runs these functions; ``benchmarks/agreement_scale.py`` runs the same
ones with up to thousands of members that are plain store clients. What a member needs to take part
is a store, its slot, and a liveness rule ``gone(slot) -> bool`` (True when that member's process is
known to have exited or stopped; ElasticGroup reads ``/proc`` for same-host processes).

**Agreement** under the key prefix ``base`` (one per generation and attempt)::

    vouch(store, base, slot, step)                 # "I take part; the last step I completed"
    members, committed = agree(store, base, slot, members, step, gone, window=..., timeout=...)

Every caller gets the same answer: the members that vouched (waiting up to ``window`` seconds for
every member not known to be gone) and the least step they vouched with (-1: none). The votes go
to one key (``append``), the first live member waits for them with one request (``wait_size``) and
proposes; the others wait for the decision with one request: the store work per failure grows
linearly with the members (see ``benchmarks/agreement_scale.py``). A caller that has not vouched
yet passes its votes to ``agree(..., votes={slot: step})`` instead: they then go with its wait for
the decision, one request (``append_get``), which is what a node hub does for its host's members.

**Admission** of a joiner: the joiner calls :func:`request_join` then :func:`await_admission`; the
members' rank 0 calls :func:`admit` at a step boundary. :func:`wait_key` is the members' wait for a
key that one member writes, watching that member's liveness.
"""

from __future__ import annotations

import itertools
import struct
import time
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence, Set, Tuple

from . import failpoints as _fp
from .errors import CommFailure, StoreTimeout

__all__ = ["vouch", "vouch_many", "agree", "request_join", "await_admission", "admit", "parse_admission",
           "pending_joiners", "grow_decision", "wait_key", "members_str", "parse_members", "parse_decision",
           "wait_slice"]

FP_VOTE = _fp.declare("elastic.agree.vote", "a member's vote, before it is appended")
FP_AGREE_WAIT = _fp.declare("elastic.agree.wait", "the agreement, waiting for the others' vouchers")
FP_AGREE_BEFORE_DECISION = _fp.declare("elastic.agree.before_decision", "before proposing the decision")
FP_AGREE_AFTER_DECISION = _fp.declare("elastic.agree.after_decision", "the decision is adopted")
FP_AGREE_TAKEOVER = _fp.declare("elastic.agree.takeover", "the first member is gone or the window is over: "
                                "this member decides in its place")

Gone = Callable[[int], bool]


def members_str(members: Sequence[int]) -> str:
    return ",".join(str(m) for m in members)


def parse_members(text: bytes) -> Tuple[int, ...]:
    s = text.decode()
    return tuple(int(x) for x in s.split(",")) if s else ()


def parse_decision(text: bytes, members: Sequence[int] = ()) -> Tuple[Tuple[int, ...], Optional[int]]:
    """The survivors and the last step they all completed (None: not tracked) from a decision:
    ``"x:<left out>|<step>"`` (relative to ``members``, the membership agreed on) or
    ``"<survivors>[|<step>]"``."""
    head, _, step = text.decode().partition("|")
    if head.startswith("x:"):
        out = set(parse_members(head[2:].encode()))
        # a C loop: every member of a large group parses the decision
        return tuple(itertools.filterfalse(out.__contains__, members)), (int(step) if step else None)
    return parse_members(head.encode()), (int(step) if step else None)


# -- agreement ------------------------------------------------------------------------------------

#: one vote: the member's slot and the last step it completed (-1: none); the votes of an agreement
#: are appended to one key, so that one request reads them all and one request waits for them all
_VOTE = struct.Struct("!Iq")


def vouch(store: Any, base: str, slot: int, step: int) -> None:
    """Tell the other members that ``slot`` takes part in the agreement under ``base``; ``step``: the
    last step it completed (-1: none). One store request (an append); voting twice is harmless."""
    vouch_many(store, base, {slot: step}, slot)


def vouch_many(store: Any, base: str, votes: Mapping[int, int], voter: int) -> None:
    """The votes of several members in one store request (``{slot: step}``): what an aggregator --
    a process that speaks for the members of its node -- sends; ``voter``: the slot it acts as (for
    the failpoints)."""
    if not votes:
        raise ValueError("vouch_many() needs at least one vote")
    _fp.hit(FP_VOTE, rank=voter)
    store.append(f"{base}votes", _pack_votes(votes))


def vouch_and_decide(store: Any, base: str, slot: int, members: Sequence[int], step: int,
                     gone: Gone) -> Tuple[Dict[int, int], Optional[bytes]]:
    """:func:`vouch`, in one request that also returns every vote so far (:meth:`Store.append_get` on
    the votes key itself); when this vote completes the set -- every member of ``members`` not known
    to be gone has voted -- propose the decision at once, as the coordinator of :func:`agree` would
    once it saw the same votes. The last member to vote then decides, instead of waking the
    coordinator to do it: one cross-process wake-up less between the last vote and the decision.

    Returns the votes so far (``{slot: step}``, this one's included) and the decision when this member
    proposed (the first proposal wins and comes back: the same answer :func:`agree` gives every
    member), else None."""
    _fp.hit(FP_VOTE, rank=slot)
    key = f"{base}votes"
    raw = store.append_get(key, _pack_votes({slot: step}), key, timeout=1.0)  # the key exists: no wait
    voted = _parse_votes(raw)
    if any(m not in voted and not gone(m) for m in members if m != slot):
        return voted, None
    return voted, _propose(store, base, slot, {slot}, tuple(members), voted, step, gone)


def _pack_votes(votes: Mapping[int, int]) -> bytes:
    return b"".join(_VOTE.pack(s, st) for s, st in votes.items())


def _parse_votes(raw: bytes) -> Dict[int, int]:
    """slot -> the least step it voted with."""
    out: Dict[int, int] = {}
    for slot, step in _VOTE.iter_unpack(raw[:len(raw) - len(raw) % _VOTE.size]):
        out[slot] = min(step, out.get(slot, step))
    return out


_STALL_S = 0.25  # a store request this much over its own timeout: the store did not answer meanwhile


def _slice(n: int) -> float:
    """How long one wait for the decision lasts before a member looks at the coordinator's liveness
    again: 50 ms up to 64 members, longer beyond (so that the waits' expiries cost the store little)."""
    return min(0.5, 0.05 * max(1.0, n / 64))


def _stalled(started: float, asked: float) -> float:
    """Seconds a store request that began at ``started`` and could take ``asked`` seconds overran them
    (a store that did not answer, e.g. its server stopped for a while); 0 for a usual answer."""
    over = time.monotonic() - started - asked
    return over if over > _STALL_S else 0.0


#: how long one wait for a decision lasts with ``n`` members (for the node hubs' members, :mod:`pycoll.nodeagg`)
wait_slice = _slice


def agree(store: Any, base: str, slot: int, members: Sequence[int], step: int, gone: Gone, *,
          window: float, timeout: float, speaks_for: Sequence[int] = (),
          votes: Optional[Mapping[int, int]] = None) -> Tuple[Tuple[int, ...], Optional[int]]:
    """The survivors of ``members`` and the least step they completed; the same answer on every caller.

    The caller has vouched (:func:`vouch`) under ``base``, or passes its votes (``votes``). The
    *coordinator* -- the first of ``members`` not known to be gone -- waits until every member not known
    to be gone has voted (one ``wait_size`` request), at most ``window`` seconds, and compare-and-sets
    the decision; the others wait for the decision (one ``get``, answered by the store when it is set).
    A member that finds the coordinator gone takes over, and so does every member once ``window`` is
    over (time the store did not answer does not count: members whose votes it holds unanswered are not
    late). The decision keeps the members that voted and are not known to be gone by then; it names the
    members left out, so its size does not grow with the group. Two store requests per member when every
    member is either alive or provably gone (the vote and the wait).

    ``speaks_for``: further slots whose votes this caller sent (:func:`vouch_many`); it waits for no
    one of them and they are never left out. ``timeout`` bounds nothing here (the window does): it
    is kept for the callers' symmetry with the other waits.

    ``votes``: ``{slot: step}`` not sent yet (this caller's own, and those of ``speaks_for``): they
    go with its first request, the wait for the decision itself (:meth:`Store.append_get`) unless
    it coordinates -- one store request per member, not two.
    """
    members = tuple(members)
    mine = {slot, *speaks_for}
    deadline = time.monotonic() + window
    unsent = dict(votes) if votes else None
    while True:
        left = deadline - time.monotonic()
        coordinator = next((m for m in members if m in mine or not gone(m)), slot)
        if coordinator in mine or left <= 0:
            if unsent:
                vouch_many(store, base, unsent, slot)
            if members and members[0] not in mine:  # in the first member's place (gone, or the window over)
                _fp.hit(FP_AGREE_TAKEOVER, rank=slot)
            raw = _coordinate(store, base, slot, mine, members, step, gone, deadline)
            break
        _fp.hit(FP_AGREE_WAIT, rank=slot)
        asked, t = min(left, _slice(len(members))), time.monotonic()
        try:
            if unsent:
                _fp.hit(FP_VOTE, rank=slot)
                raw = store.append_get(f"{base}votes", _pack_votes(unsent), f"{base}decision", timeout=asked)
            else:
                raw = store.get(f"{base}decision", timeout=asked)
            break
        except StoreTimeout:
            unsent = None  # the votes landed before the wait began
            deadline += _stalled(t, asked)
            continue
    decision = parse_decision(raw, members)
    _fp.hit(FP_AGREE_AFTER_DECISION, rank=slot)
    return decision


def _coordinate(store: Any, base: str, slot: int, mine: Set[int], members: Tuple[int, ...], step: int,
                gone: Gone, deadline: float) -> bytes:
    """Wait for the votes of every member not known to be gone (until ``deadline``), then propose;
    returns the decision (this proposal, or the one that came first)."""
    votes_key, decision_key = f"{base}votes", f"{base}decision"
    raw, read = b"", False
    while True:
        voted = _parse_votes(raw)
        missing = [m for m in members if m not in mine and m not in voted and not gone(m)]
        if not missing and (read or len(mine) == 1):  # the steps of those it speaks for are in the votes
            break
        left = deadline - time.monotonic()
        if left <= 0:
            # one last look at the votes there are: those that came after the last wait returned
            # count too (a node's hub sends its members' votes late when one of them is slow)
            voted = _parse_votes(_get_or_empty(store, votes_key))
            break
        _fp.hit(FP_AGREE_WAIT, rank=slot)
        count = len(raw) // _VOTE.size
        asked, t = min(left, 0.05), time.monotonic()
        try:
            raw = store.wait_size(votes_key, _VOTE.size * (count + len(missing)), timeout=asked)
            read = True
        except StoreTimeout:
            if store.check([decision_key]):
                break  # another member decided (its window was over): adopt that
        stalled = _stalled(t, asked)
        if stalled:  # the store held the votes sent meanwhile unanswered: they are not late
            deadline += stalled
            read = False
    return _propose(store, base, slot, mine, members, voted, step, gone)


def _propose(store: Any, base: str, slot: int, mine: Set[int], members: Tuple[int, ...], voted: Mapping[int, int],
             step: int, gone: Gone) -> bytes:
    """Propose the decision these votes lead to; returns the decision (this one, or the one that came first)."""
    # a member that voted and is gone since is left out too (the new communicator would fail on it)
    alive = {m for m in members if m in mine or (m in voted and not gone(m))}
    least = min([voted.get(m, step) for m in alive] + [step])
    out = [m for m in members if m not in alive]
    _fp.hit(FP_AGREE_BEFORE_DECISION, rank=slot)
    # the first proposal wins; every member adopts it (compare_set returns the stored value)
    decision: bytes = store.compare_set(f"{base}decision", b"", f"x:{members_str(out)}|{least}")
    return decision


def _get_or_empty(store: Any, key: str) -> bytes:
    try:
        value: bytes = store.get(key, timeout=0)
        return value
    except StoreTimeout:
        return b""


# -- admission ------------------------------------------------------------------------------------


def request_join(store: Any, ns: str, slot: int) -> str:
    """Ask to join the group under ``ns``; returns the key the admission will be written to."""
    incarnation = store.add(f"{ns}/incarnation/{slot}", 1)
    store.set(f"{ns}/join/{slot}", str(incarnation))
    return f"{ns}/admitted/{slot}/{incarnation}"


def await_admission(store: Any, ns: str, slot: int, admitted: str, deadline: float, join_timeout: float,
                    nobody_left: Callable[[], Optional[str]] = lambda: None) -> bytes:
    """The admission record (:func:`parse_admission`) once the members' rank 0 wrote it; ``b""`` when
    the group finished first. :class:`StoreTimeout` at ``deadline`` (monotonic); ``nobody_left()``, asked about
    every 0.5 s, may end the wait sooner: the text it returns (why no member is left to admit this slot) is raised
    as a ``LookupError``."""
    while not store.check([admitted]):
        if store.check([f"{ns}/closed"]):
            return b""
        why = nobody_left()
        if why is not None and not store.check([admitted]):
            raise LookupError(why)
        left = deadline - time.monotonic()
        if left <= 0:
            raise StoreTimeout(f"slot {slot} was not admitted within {join_timeout:g} s (the members admit "
                               f"joiners in maybe_grow())")
        try:
            store.wait([admitted], timeout=min(0.5, left))
        except StoreTimeout:
            pass
    raw: bytes = store.get(admitted, timeout=join_timeout)
    return raw


def parse_admission(raw: bytes) -> Tuple[int, int, Tuple[int, ...], str, Optional[int]]:
    """(generation, rank, members, kind, committed step or None) from an admission record."""
    gen_s, rank_s, members_s, kind, *rest = raw.decode().split("|")
    committed = int(rest[0]) if rest and rest[0] else None
    return int(gen_s), int(rank_s), parse_members(members_s.encode()), kind, committed


def pending_joiners(store: Any, ns: str, members: Sequence[int]) -> List[int]:
    """Slots of processes waiting to join the group under ``ns`` (one store round trip)."""
    prefix = f"{ns}/join/"
    return sorted(s for s in (int(k[len(prefix):]) for k in store.list_keys(prefix)) if s not in members)


def admit(store: Any, ns: str, joiners: Sequence[int], generation: int, members: Sequence[int], kind: str,
          step: int, timeout: float) -> None:
    """Rank 0: admit ``joiners`` into generation ``generation`` whose members are ``members`` (joiners
    included); ``step``: the last committed step (-1: none). Three round trips per joiner."""
    for slot in joiners:
        inc = store.get(f"{ns}/join/{slot}", timeout=timeout).decode()
        store.set(f"{ns}/admitted/{slot}/{inc}",
                  f"{generation}|{list(members).index(slot)}|{members_str(members)}|{kind}|{step}")
        store.delete(f"{ns}/join/{slot}")


def grow_decision(store: Any, key: str, joiners: Optional[Sequence[int]], writer: int, gone: Gone,
                  timeout: float, size: int = 1) -> List[int]:
    """The joiners admitted at this step boundary, through the store: ``writer`` (rank 0) passes its
    ``joiners`` and writes them under ``key``; every other member passes None and waits for them.
    ``size``: the number of members (the waits look at the writer's liveness less often in a large group)."""
    if joiners is not None:
        store.set(key, members_str(joiners))
        return list(joiners)
    return list(parse_members(wait_key(store, key, writer, "the grow decision", gone, timeout, _slice(size))))


def wait_key(store: Any, key: str, writer: int, what: str, gone: Gone, timeout: float,
             every: float = 0.05) -> bytes:
    """The value of ``key``, which only slot ``writer`` writes. CommFailure (a member failure) as soon
    as ``gone(writer)`` (looked at ``every`` seconds), or when the key has not come within ``timeout``."""
    deadline = time.monotonic() + timeout
    while True:
        left = deadline - time.monotonic()
        try:
            value: bytes = store.get(key, timeout=max(0.001, min(every, left)))
            return value
        except StoreTimeout:
            pass
        if gone(writer):
            raise CommFailure(f"slot {writer} is gone before it wrote {what}")
        if left <= 0:
            raise CommFailure(f"slot {writer} did not write {what} within {timeout:g} s")
