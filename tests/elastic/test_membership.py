"""The agreement protocol (pycoll.membership, what ElasticGroup runs) with 64 members as threads of one
process, each with its own store connection; members killed or stopped at its failpoints.

A killed member stops answering and the liveness rule knows it is gone (as ``/proc`` tells ElasticGroup
about a same-host process that exited); a stopped one stops answering and nothing says it is gone (a
process on another host), so the others wait for it up to the window.
"""

from __future__ import annotations

import threading
import time

import pytest

from pycoll import failpoints, membership
from pycoll.errors import StoreError
from pycoll.failpoints import FailpointError
from pycoll.store import TCPStore, TCPStoreServer

N = 64
WINDOW = 0.8
BASE = "pycoll/elastic/m/g0/a0/"


@pytest.fixture
def server():
    srv = TCPStoreServer(token="m", max_unauthenticated=256).start()
    yield srv
    srv.close()
    failpoints.reset()


def _steps(n):
    return {s: 10 + s % 7 for s in range(n)}


def _run(server, n=N, spec="", model="kill", window=WINDOW, absent=(), with_wait=False, decide=None):
    """Every member votes and agrees (``absent`` ones never start); returns (results, dead, seconds).
    ``with_wait``: each member's vote goes with its first request of the agreement (``votes=``).
    ``decide``: a dict; each member votes with :func:`membership.vouch_and_decide` (the last voter
    proposes) and records there whether it proposed."""
    failpoints.configure(spec, rank=-1)
    members = tuple(range(n))
    steps = _steps(n)
    dead = set(absent)
    released = threading.Event()
    results = {}
    start = threading.Barrier(n - len(absent))

    def member(slot):
        store = TCPStore(server.host, server.port, "m", timeout=10)
        try:
            start.wait(30)  # connected: they begin together, as a reshape flag wakes them
            if decide is not None:
                voted, decision = membership.vouch_and_decide(store, BASE, slot, members, steps[slot],
                                                              dead.__contains__)
                assert slot in voted
                decide[slot] = decision is not None
                if decision is not None:  # the proposal that won: what agree() gives every member
                    assert decision == store.get(f"{BASE}decision", timeout=0)
            elif not with_wait:
                membership.vouch(store, BASE, slot, steps[slot])
            results[slot] = membership.agree(store, BASE, slot, members, steps[slot], dead.__contains__,
                                             window=window, timeout=10,
                                             votes={slot: steps[slot]} if with_wait else None)
        except FailpointError:
            results[slot] = "victim"
            if model == "kill":
                dead.add(slot)
            else:
                released.wait(30)
        except StoreError as exc:
            results[slot] = exc
        finally:
            store.close()

    threads = [threading.Thread(target=member, args=(s,), daemon=True) for s in members if s not in absent]
    t0 = time.monotonic()
    for t in threads:
        t.start()
    deadline = t0 + window + 20
    while len(results) < len(threads) and time.monotonic() < deadline:
        time.sleep(0.005)
    elapsed = time.monotonic() - t0
    released.set()
    for t in threads:
        t.join(10)
    assert not any(t.is_alive() for t in threads), "a member hangs"
    failpoints.reset()
    return results, dead, elapsed


def _in_threads(fn, args, timeout):
    """``fn(a)`` for each of ``args``, each in a thread of its own, all at once; waits up to ``timeout``
    seconds for each."""
    threads = [threading.Thread(target=fn, args=(a,), daemon=True) for a in args]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout)


def _check(results, dead, n=N, excluded=(), maybe=()):
    """Every survivor holds the same decision, which keeps every survivor, leaves out ``excluded`` and
    the members killed before they voted, and names the least step of the members it keeps."""
    steps = _steps(n)
    survivors = {s: v for s, v in results.items() if v != "victim"}
    decisions = set(survivors.values())
    assert len(decisions) == 1, decisions
    got, step = decisions.pop()
    assert all(s in got for s in survivors), got
    for s in excluded:
        assert s not in got, (s, got)
    for s in range(n):
        if s not in survivors and s not in excluded and s not in maybe:
            assert s not in got, (s, got)
    assert step == min(steps[m] for m in got)
    return got


@pytest.mark.timeout(60)
def test_no_failure_two_requests_per_member(server):
    before = server.stats()
    results, dead, elapsed = _run(server)
    after = server.stats()
    got = _check(results, dead)
    assert got == tuple(range(N))
    requests = after["requests"] - before["requests"]
    # a vote and a wait per member, a few for the coordinator, and the waits of slow starters that
    # expired (50 ms slices) and were made again
    assert 2 * N <= requests <= 3 * N, requests
    assert after["arguments"] - before["arguments"] <= 4 * N + 20  # linear: no request names every member


@pytest.mark.timeout(60)
def test_votes_sent_with_the_wait_one_request_per_member(server):
    before = server.stats()
    results, dead, elapsed = _run(server, with_wait=True)
    after = server.stats()
    assert _check(results, dead) == tuple(range(N))
    requests = after["requests"] - before["requests"]
    # the vote and the wait in one request (the coordinator: its vote, its waits, its decision)
    assert N <= requests <= 2 * N, requests
    assert after["append_get"] - before["append_get"] >= N - 1


@pytest.mark.timeout(60)
def test_the_last_voter_decides(server):
    """With vouch_and_decide (what ElasticGroup's vote does) the member whose vote completes the set
    proposes the decision at once; the coordinator's agree() then finds it made."""
    decided = {}
    results, dead, elapsed = _run(server, decide=decided, absent=(7, 40))
    got = _check(results, dead, excluded=(7, 40))
    assert got == tuple(m for m in range(N) if m not in (7, 40))
    assert 1 <= sum(decided.values()) < N - 2, decided  # the last voters, not the early ones


@pytest.mark.timeout(60)
@pytest.mark.parametrize("model", ["kill", "stop"])
@pytest.mark.parametrize("point", ["elastic.agree.vote", "elastic.agree.before_decision"])
def test_the_deciding_voter_fails(server, point, model):
    """Members 0-2 vote, then member 3, whose vote would complete the set, fails before its vote lands
    or before it proposes: killed (known gone) or stopped (nothing says it is gone). The others agree
    through the coordinator: without 3 unless its vote landed and it is not known to be gone."""
    members, steps = (0, 1, 2, 3), {0: 5, 1: 6, 2: 7, 3: 4}
    dead = set()
    stores = [TCPStore(server.host, server.port, "m", timeout=10) for _ in members]
    try:
        for m in (0, 1, 2):
            voted, decision = membership.vouch_and_decide(stores[m], BASE, m, members, steps[m], dead.__contains__)
            assert decision is None and set(voted) == set(range(m + 1))
        failpoints.configure(f"{point}=raise;rank=3", rank=-1)
        with pytest.raises(FailpointError):
            membership.vouch_and_decide(stores[3], BASE, 3, members, steps[3], dead.__contains__)
        failpoints.reset()
        if model == "kill":
            dead.add(3)
        results = {}

        def agree(m):
            results[m] = membership.agree(stores[m], BASE, m, members, steps[m], dead.__contains__,
                                          window=0.5, timeout=10)

        _in_threads(agree, (0, 1, 2), 20)
        assert len(set(results.values())) == 1 and len(results) == 3, results
        kept, least = results[0]
        if model == "stop" and point == "elastic.agree.before_decision":
            assert kept == members and least == 4  # its vote landed: a live member that voted stays
        else:
            assert kept == (0, 1, 2) and least == 5
    finally:
        for st in stores:
            st.close()


@pytest.mark.timeout(90)
@pytest.mark.parametrize("victim", [0, 5])
@pytest.mark.parametrize("point", ["elastic.agree.vote", "elastic.agree.wait", "elastic.agree.after_decision"])
def test_member_fails_at_a_failpoint_with_its_vote_in_the_wait(server, point, victim):
    results, dead, elapsed = _run(server, spec=f"{point}=raise;rank={victim}", with_wait=True)
    fired = results.get(victim) == "victim"
    assert fired or (point == "elastic.agree.wait" and victim == 0), results.get(victim)  # 0 coordinates
    got = _check(results, dead, maybe=(victim,))
    if point == "elastic.agree.vote" and fired:
        assert victim not in got  # killed before its vote went out


@pytest.mark.timeout(60)
def test_absent_members_are_left_out_at_once_when_known_gone(server):
    results, dead, elapsed = _run(server, absent=(0, 9, 33))
    assert _check(results, dead, excluded=(0, 9, 33)) == tuple(m for m in range(N) if m not in (0, 9, 33))
    assert elapsed < WINDOW, elapsed  # provably gone: nobody waits for the window


@pytest.mark.timeout(60)
def test_stopped_member_is_waited_for_up_to_the_window(server):
    results, _, elapsed = _run(server, spec="elastic.agree.vote=raise;rank=17", model="stop")
    _check(results, set(), excluded=(17,))
    assert elapsed >= WINDOW * 0.9, elapsed


POINTS = ["elastic.agree.vote", "elastic.agree.wait", "elastic.agree.before_decision",
          "elastic.agree.after_decision"]


@pytest.mark.timeout(90)
@pytest.mark.parametrize("model", ["kill", "stop"])
@pytest.mark.parametrize("victim", [0, 5])  # the coordinator, another member
@pytest.mark.parametrize("point", POINTS)
def test_member_fails_at_a_failpoint(server, point, victim, model):
    results, dead, elapsed = _run(server, spec=f"{point}=raise;rank={victim}", model=model)
    fired = results.get(victim) == "victim"
    if point in ("elastic.agree.before_decision",) and victim != 0:
        assert not fired  # only the coordinator decides
    if point == "elastic.agree.vote":
        assert fired
        _check(results, dead, excluded=(victim,))
    elif point == "elastic.agree.after_decision":
        # it failed after the decision was made: the decision may keep it (the next collective finds out)
        _check(results, dead, maybe=(victim,))
    else:
        # it voted, then failed: kept if it was not known gone when the decision was made
        got = _check(results, dead, maybe=(victim,))
        if model == "kill" and fired and victim == 0 and point == "elastic.agree.before_decision":
            assert victim not in got  # the coordinator died before deciding: its successor saw it gone
    if model == "kill":
        assert elapsed < WINDOW + 1.0, elapsed


@pytest.mark.timeout(60)
def test_coordinators_killed_one_after_another(server):
    """Slot 0 dies about to decide (the others wait for its decision); slot 1 takes over and dies
    there too; slot 2 decides."""
    spec = "elastic.agree.before_decision=raise;rank=0,elastic.agree.takeover=raise;rank=1"
    results, dead, elapsed = _run(server, spec=spec)
    assert results[0] == results[1] == "victim"
    got = _check(results, dead, excluded=(0, 1))
    assert got == tuple(range(2, N))
    assert elapsed < WINDOW + 1.0


@pytest.mark.timeout(60)
def test_store_server_dies_during_the_agreement(server):
    """A store that goes away mid-agreement is a StoreError on every member, never a hang."""
    failpoints.configure("", rank=-1)
    members = tuple(range(8))
    errors = {}

    def member(slot):
        store = TCPStore(server.host, server.port, "m", timeout=10)
        try:
            if slot != 3:  # slot 3 never votes: the others wait for it (it is not known gone)
                membership.vouch(store, BASE, slot, 1)
                membership.agree(store, BASE, slot, members, 1, lambda m: False, window=30, timeout=10)
        except StoreError as exc:
            errors[slot] = exc
        finally:
            store.close()

    threads = [threading.Thread(target=member, args=(s,), daemon=True) for s in members if s != 3]
    for t in threads:
        t.start()
    time.sleep(0.5)
    t0 = time.monotonic()
    server.close()
    for t in threads:
        t.join(15)
    assert not any(t.is_alive() for t in threads)
    assert sorted(errors) == [0, 1, 2, 4, 5, 6, 7], errors
    assert all("lost the connection" in str(e) or "could not connect" in str(e) for e in errors.values()), errors
    assert time.monotonic() - t0 < 10


@pytest.mark.timeout(60)
def test_aggregators_speak_for_their_nodes(server):
    """8 aggregators vote for 8 members each (one request each); a dead member's aggregator leaves it out."""
    failpoints.configure("", rank=-1)
    members = tuple(range(N))
    steps = _steps(N)
    dead = {13}
    results = {}
    before = server.stats()

    def aggregator(node):
        store = TCPStore(server.host, server.port, "m", timeout=10)
        try:
            mine = [m for m in range(node * 8, node * 8 + 8) if m not in dead]
            membership.vouch_many(store, BASE, {m: steps[m] for m in mine}, mine[0])
            results[node] = membership.agree(store, BASE, mine[0], members, steps[mine[0]], dead.__contains__,
                                             window=5, timeout=10, speaks_for=mine[1:])
        finally:
            store.close()

    _in_threads(aggregator, range(8), 20)
    assert len(set(results.values())) == 1 and len(results) == 8, results
    got, step = results[0]
    assert got == tuple(m for m in members if m != 13)
    assert step == min(steps[m] for m in got)
    assert server.stats()["requests"] - before["requests"] <= 3 * 8
    with pytest.raises(ValueError, match="at least one vote"):
        membership.vouch_many(server.client(), BASE, {}, 0)


class _FrozenFor:
    """A member's store while the store server is stopped (the launcher serving it was SIGSTOPped)
    from ``since`` to ``until``: a request made meanwhile is answered at ``until``, the coordinator's
    first, the others' a little later (queued behind), as a server catching up answers them."""

    def __init__(self, store, slot, since, until):
        self._store, self._slot, self._since, self._until = store, slot, since, until

    def __getattr__(self, name):
        real = getattr(self._store, name)

        def call(*args, **kwargs):
            now = time.monotonic()
            if self._since <= now < self._until:
                time.sleep(self._until - now + (0.0 if self._slot == 0 else 0.15))
            return real(*args, **kwargs)

        return call


@pytest.mark.timeout(60)
def test_time_the_store_did_not_answer_is_not_counted_against_the_window(server):
    n, window = 8, 0.4
    members, steps = tuple(range(n)), _steps(n)
    since = time.monotonic() + 0.1
    until = since + 1.0  # longer than the window: the coordinator has voted, the others' votes are held
    results = {}

    def member(slot):
        store = _FrozenFor(TCPStore(server.host, server.port, "m", timeout=10), slot, since, until)
        if slot:
            time.sleep(0.15)
        membership.vouch(store, BASE, slot, steps[slot])
        results[slot] = membership.agree(store, BASE, slot, members, steps[slot], lambda m: False, window=window,
                                         timeout=10)

    _in_threads(member, range(n), 30)
    assert _check(results, set(), n=n) == members  # nobody was late: the store was
