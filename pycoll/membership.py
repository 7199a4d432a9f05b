"""The elastic layer's membership protocol over a store: the agreement of the survivors and the
admission of joiners, with no communicator involved.

:class:`pycoll.ElasticGroup` runs these functions; ``benchmarks/agreement_scale.py`` runs the same
ones with up to thousands of members that are plain store clients. What a member needs to take part
is a store, its slot, and a liveness rule ``gone(slot) -> bool`` (True when that member's process is
known to have exited or stopped; ElasticGroup reads ``/proc`` for same-host processes).

**Agreement** under the key prefix ``base`` (one per generation and attempt)::

    vouch(store, base, slot, step)                 # "I take part; the last step I completed"
    members, committed = agree(store, base, slot, members, step, gone, window=..., timeout=...)

Every caller gets the same answer: the members that vouched (or, within ``window`` seconds, every
member not known to be gone) and the least step they vouched with (-1: none).

**Admission** of a joiner: the joiner calls :func:`request_join` then :func:`await_admission`; the
members' rank 0 calls :func:`admit` at a step boundary. :func:`wait_key` is the members' wait for a
key that one member writes, watching that member's liveness.
"""

from __future__ import annotations

import time
from typing import Any, Callable, List, Optional, Sequence, Tuple

from . import failpoints as _fp
from .errors import CommFailure, StoreTimeout

__all__ = ["vouch", "agree", "request_join", "await_admission", "admit", "parse_admission", "pending_joiners",
           "grow_decision", "wait_key", "members_str", "parse_members", "parse_decision"]

FP_AGREE_WAIT = _fp.declare("elastic.agree.wait", "the agreement, waiting for the others' vouchers")
FP_AGREE_BEFORE_DECISION = _fp.declare("elastic.agree.before_decision", "before proposing the decision")
FP_AGREE_AFTER_DECISION = _fp.declare("elastic.agree.after_decision", "the decision is adopted")

Gone = Callable[[int], bool]


def members_str(members: Sequence[int]) -> str:
    return ",".join(str(m) for m in members)


def parse_members(text: bytes) -> Tuple[int, ...]:
    s = text.decode()
    return tuple(int(x) for x in s.split(",")) if s else ()


def parse_decision(text: bytes) -> Tuple[Tuple[int, ...], Optional[int]]:
    """``"<members>[|<step>]"``: the survivors and the last step they all completed (None: not tracked)."""
    members, _, step = text.decode().partition("|")
    return parse_members(members.encode()), (int(step) if step else None)


# -- agreement ------------------------------------------------------------------------------------


def vouch(store: Any, base: str, slot: int, step: int) -> None:
    """Tell the other members that ``slot`` takes part in the agreement under ``base``; ``step``: the
    last step it completed (-1: none)."""
    store.set(f"{base}alive/{slot}", str(step))


def agree(store: Any, base: str, slot: int, members: Sequence[int], step: int, gone: Gone, *,
          window: float, timeout: float) -> Tuple[Tuple[int, ...], Optional[int]]:
    """The survivors of ``members`` and the least step they completed; the same answer on every caller.

    The caller has vouched (:func:`vouch`) under ``base``. Waits for the others' vouchers (the store
    answers when they are all there), then compare-and-sets the decision: three store round trips
    when every member is either alive or provably gone (four when steps are committed).
    """
    decision_key = f"{base}decision"
    deadline = time.monotonic() + window
    while True:
        waiting = [m for m in members if m != slot and not gone(m)]
        left = deadline - time.monotonic()
        if not waiting:
            break
        if left > 0:
            _fp.hit(FP_AGREE_WAIT)
            try:  # in slices, so that a member dying meanwhile is noticed
                store.wait([f"{base}alive/{m}" for m in waiting], timeout=min(left, 0.05))
                break  # every member not known to be gone vouched
            except StoreTimeout:
                if not store.check([decision_key]):
                    continue
        # the window is over, or another member decided: keep those that vouched
        keys = set(store.list_keys(base))
        waiting = [m for m in waiting if f"{base}alive/{m}" in keys]
        break
    alive = [m for m in members if m == slot or m in waiting]
    # the last step every survivor completed: the least one they vouched with (-1: none)
    steps = [step]
    others = [m for m in alive if m != slot]
    if others:
        values = store.multi_get([f"{base}alive/{m}" for m in others], timeout=timeout)
        steps += [int(v) if v.lstrip(b"-").isdigit() else -1 for v in values]
    proposal = f"{members_str(alive)}|{min(steps)}"
    _fp.hit(FP_AGREE_BEFORE_DECISION)
    # the first proposal wins; every member adopts it (compare_set returns the stored value)
    decision = parse_decision(store.compare_set(decision_key, b"", proposal))
    _fp.hit(FP_AGREE_AFTER_DECISION)
    return decision


# -- admission ------------------------------------------------------------------------------------


def request_join(store: Any, ns: str, slot: int) -> str:
    """Ask to join the group under ``ns``; returns the key the admission will be written to."""
    incarnation = store.add(f"{ns}/incarnation/{slot}", 1)
    store.set(f"{ns}/join/{slot}", str(incarnation))
    return f"{ns}/admitted/{slot}/{incarnation}"


def await_admission(store: Any, ns: str, slot: int, admitted: str, deadline: float, join_timeout: float) -> bytes:
    """The admission record (:func:`parse_admission`) once the members' rank 0 wrote it; ``b""`` when
    the group finished first. :class:`StoreTimeout` at ``deadline`` (monotonic)."""
    while not store.check([admitted]):
        if store.check([f"{ns}/closed"]):
            return b""
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
                  timeout: float) -> List[int]:
    """The joiners admitted at this step boundary, through the store: ``writer`` (rank 0) passes its
    ``joiners`` and writes them under ``key``; every other member passes None and waits for them."""
    if joiners is not None:
        store.set(key, members_str(joiners))
        return list(joiners)
    return list(parse_members(wait_key(store, key, writer, "the grow decision", gone, timeout)))


def wait_key(store: Any, key: str, writer: int, what: str, gone: Gone, timeout: float) -> bytes:
    """The value of ``key``, which only slot ``writer`` writes. CommFailure (a member failure) as soon
    as ``gone(writer)``, or when the key has not come within ``timeout``."""
    deadline = time.monotonic() + timeout
    while True:
        left = deadline - time.monotonic()
        try:
            value: bytes = store.get(key, timeout=max(0.001, min(0.05, left)))
            return value
        except StoreTimeout:
            pass
        if gone(writer):
            raise CommFailure(f"slot {writer} is gone before it wrote {what}")
        if left <= 0:
            raise CommFailure(f"slot {writer} did not write {what} within {timeout:g} s")
