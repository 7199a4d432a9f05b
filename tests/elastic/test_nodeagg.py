"""The agreement through node hubs (pycoll.nodeagg): 64 members as threads in nodes of 8, one hub per
node; hubs and members failing at the hubs' failpoints; then real processes (ElasticGroup on one host).

A hub that *fails* (its thread raises) closes its socket: its members see end-of-file and use the store
themselves. A hub whose process is *stopped* keeps its socket open but the liveness rule says it is
gone (/proc tells a same-host member): its members stop waiting for it at their next look. A member
that is *killed* closes its link (the hub stops waiting for its vote) and is known gone; a *stopped*
one stays connected and is waited for up to the hub's collect time and the window.
"""

from __future__ import annotations

import os
import signal
import socket
import threading
import time

import numpy as np
import pytest
from helpers.mp import run_ranks

import pycoll
from pycoll import failpoints, membership, nodeagg
from pycoll.elastic import ElasticGroup, Excluded
from pycoll.failpoints import FailpointError
from pycoll.store import MemoryStore, TCPStore, TCPStoreServer

N, K = 64, 8
WINDOW = 0.8
BASE = "pycoll/elastic/n/g0/a0/"
FLAG = "pycoll/elastic/n/g0/reshape"


@pytest.fixture
def server():
    srv = TCPStoreServer(token="n", max_unauthenticated=256).start()
    yield srv
    srv.close()
    failpoints.reset()


class _StoppableHub(nodeagg.NodeHub):
    """A hub whose failure stops it (as SIGSTOP would its process) instead of closing it."""

    stop_model = False
    released: threading.Event
    dead: set

    def _crash(self, where, exc):
        if not self.stop_model:
            return super()._crash(where, exc)
        self.dead.add(self.slot)  # the liveness rule now says its process is stopped
        self.released.wait(30)
        return None


def _run(server, spec="", model="kill", hub_model="fail"):
    """Every member waits for the flag through its hub, then agrees through it; returns (results,
    dead, seconds, requests)."""
    failpoints.configure(spec, rank=-1)
    members = tuple(range(N))
    dead: set = set()
    released = threading.Event()
    results: dict = {}
    hub_store = TCPStore(server.host, server.port, "n", timeout=10)
    hubs = []
    for first in range(0, N, K):
        h = _StoppableHub(hub_store, f"pycoll-test-{os.getpid()}-{first}", first, dead.__contains__)
        h.stop_model, h.released, h.dead = hub_model == "stop", released, dead
        hubs.append(h)
    start = threading.Barrier(N + 1)

    def member(slot):
        store = TCPStore(server.host, server.port, "n", timeout=10)
        hub = hubs[slot // K]
        link = nodeagg.NodeLink(hub.address, slot, lambda: hub.slot in dead)
        try:
            start.wait(30)
            nodeagg.watch_key(link, store, FLAG, 10)
            results[slot] = nodeagg.agree(link, store, BASE, slot, members, 10 + slot % 7, dead.__contains__,
                                          window=WINDOW, timeout=10)
        except FailpointError:
            results[slot] = "victim"
            if model == "kill":
                dead.add(slot)
                link.close()
            else:
                released.wait(30)
        finally:
            link.close()
            store.close()

    threads = [threading.Thread(target=member, args=(s,), daemon=True) for s in members]
    for t in threads:
        t.start()
    start.wait(30)
    time.sleep(0.2)  # every member asked its hub for the flag
    before = server.stats()["requests"]
    t0 = time.monotonic()
    hub_store.set(FLAG, b"1")
    deadline = t0 + WINDOW + 20
    while len(results) < N and time.monotonic() < deadline:
        time.sleep(0.005)
    elapsed = time.monotonic() - t0
    requests = server.stats()["requests"] - before
    released.set()
    for t in threads:
        t.join(10)
    for h in hubs:
        h.close()
    hub_store.close()
    assert not any(t.is_alive() for t in threads), "a member hangs"
    failpoints.reset()
    return results, dead, elapsed, requests


def _check(results, dead, excluded=(), maybe=()):
    """Every member that finished holds the same decision: every member but the excluded, the
    ``maybe`` ones in or out; returns it."""
    got = {v for s, v in results.items() if v != "victim" and s not in excluded}
    assert len(got) == 1, got
    (decision,) = got
    survivors, step = decision
    expect = [m for m in range(N) if m not in excluded]
    assert [m for m in survivors if m not in maybe] == [m for m in expect if m not in maybe], decision
    assert step == min(10 + s % 7 for s in survivors)
    return survivors


@pytest.mark.timeout(60)
def test_one_request_per_node_and_the_same_decision(server):
    results, _, elapsed, requests = _run(server)
    assert _check(results, set()) == tuple(range(N))
    # per node: the flag's wait (re-armed each 0.5 s at most), the votes with the wait for the decision
    # (one request), a few more for the coordinating node
    assert requests <= 2 * (N // K) + 4, requests
    assert elapsed < WINDOW


HUB_POINTS = ["elastic.node.watch", "elastic.node.collect", "elastic.node.forward", "elastic.node.fanout"]


@pytest.mark.timeout(60)
@pytest.mark.parametrize("hub_model", ["fail", "stop"])
# the hub speaking for the coordinator, another one (--runslow)
@pytest.mark.parametrize("victim", [0, pytest.param(24, marks=pytest.mark.slow)])
@pytest.mark.parametrize("point", HUB_POINTS)
def test_hub_fails_at_a_failpoint(server, point, victim, hub_model, tmp_path):
    trace = tmp_path / "trace"
    results, dead, elapsed, _ = _run(server, spec=f"{point}=raise;rank={victim};trace={trace}", hub_model=hub_model)
    assert trace.read_text().startswith(point), "the failpoint was not reached"
    if hub_model == "fail":  # the hub's thread failed, its process lives: every member stays
        assert _check(results, dead) == tuple(range(N))
    else:  # its process is stopped: its host slot may be left out (it was known gone), nobody else
        _check(results, dead, maybe=(victim,))
    assert elapsed < 2 * WINDOW + 1.5, elapsed


@pytest.mark.timeout(60)
@pytest.mark.parametrize("model", ["kill", "stop"])
@pytest.mark.parametrize("victim", [13, pytest.param(0, marks=pytest.mark.slow)])
@pytest.mark.parametrize("point", ["elastic.node.vote", "elastic.node.wait"])
def test_member_fails_at_a_failpoint(server, point, victim, model):
    results, dead, elapsed, _ = _run(server, spec=f"{point}=raise;rank={victim}", model=model)
    assert results[victim] == "victim"
    # it never voted (its first wait is the flag's): left out, at once when killed, at the window when stopped
    _check(results, dead, excluded=(victim,))
    assert elapsed < (1.0 if model == "kill" else 2 * WINDOW + 1.0), elapsed


@pytest.mark.timeout(30)
def test_a_lost_hub_means_the_store_path(server, tmp_path):
    """The hub of node 1 fails before it forwards: its members vote and agree through the store
    (``elastic.node.fallback`` fires for each of them) and end with everyone else's decision."""
    trace = tmp_path / "trace"
    spec = f"elastic.node.forward=raise;rank=8,elastic.node.fallback=note;trace={trace}"
    results, dead, _, _ = _run(server, spec=spec)
    assert _check(results, dead) == tuple(range(N))
    lines = trace.read_text().splitlines()
    fired = {int(line.split()[2]) for line in lines if line.startswith("elastic.node.fallback")}
    assert fired == set(range(8, 16)), fired


def _frozen_hub(tag):
    """What a stopped hub process looks like from a member: its socket takes connections and votes
    into the kernel's queue, and nothing ever reads them."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    address = f"pycoll-test-frozen-{os.getpid()}-{tag}"
    sock.bind("\0" + address)
    sock.listen(16)
    return sock, address


@pytest.mark.timeout(30)
@pytest.mark.parametrize("hub_voted", [True, False])
def test_a_vote_left_at_a_frozen_hub_reaches_the_store(hub_voted):
    """Slot 1 voted to its hub, whose process then froze before forwarding; its agreement goes through
    the store itself (its link was renewed meanwhile: None). With ``hub_voted`` it sends its vote
    there first and stays in; without, the others wait out the window and leave the live member out."""
    store = MemoryStore()
    sock, address = _frozen_hub("vote")
    base, members = "pycoll/elastic/f/g3/a0/", (0, 1, 2)
    link = nodeagg.NodeLink(address, 1)
    try:
        link.vote(base, 1, 7, members, 0.5)  # accepted by the socket, read by no one
        results = {}

        def member(slot):
            if slot != 1:
                membership.vouch(store, base, slot, 7)
            else:
                time.sleep(0.2)  # the others' windows end first
            results[slot] = nodeagg.agree(None, store, base, slot, members, 7, lambda s: False, window=0.5,
                                          timeout=5.0, hub_voted=hub_voted and slot == 1)

        threads = [threading.Thread(target=member, args=(s,)) for s in members]
        for t in threads:
            t.start()
        for t in threads:
            t.join(20)
    finally:
        link.close()
        sock.close()
    assert len(set(results.values())) == 1, results
    assert results[0] == (((0, 1, 2), 7) if hub_voted else ((0, 2), 7)), results


@pytest.mark.timeout(30)
def test_no_message_goes_to_a_hub_known_gone():
    """A link whose hub is known gone (stopped: /proc says so) refuses to send, so the vote goes to the
    store (:class:`ElasticGroup` falls back at once); NodeAggregation does not connect to it again."""
    sock, address = _frozen_hub("gone")
    stopped = set()
    link = nodeagg.NodeLink(address, 2, lambda: 0 in stopped)
    try:
        link.vote("b/", 2, 1, (0, 2), 1.0)  # the hub is alive: the vote is sent
        stopped.add(0)
        with pytest.raises(nodeagg.HubLost):
            link.vote("b/", 2, 1, (0, 2), 1.0)
        assert link.broken
        with pytest.raises(nodeagg.HubLost):
            link.watch("k", 0.1)
    finally:
        link.close()
        sock.close()
    boot = "b" * 32
    agg = nodeagg.NodeAggregation(MemoryStore(), "ns", 2, boot, stopped.__contains__)
    try:
        assert agg.link((0, 2), {0: (boot, 1), 2: (boot, 2)}) is None
        assert not agg.pending  # not a hub that is starting: the store, until it is back or the hub changes
    finally:
        agg.close()


@pytest.mark.timeout(30)
def test_a_watch_through_a_hub_that_stops_ends_at_once():
    """A member waits for the reshape flag through its hub; the hub's process stops: the member sees
    it within a liveness look (50 ms) and takes the flag from the store. With one look per 0.5 s wait,
    ElasticGroup's watcher stayed that long with a stopped hub, and a new rank 0 looked for waiting
    joiners that much later (the failpoint case host.coll.after_arrive-stop-r0: a joiner admitted at
    the last step)."""
    store = MemoryStore()
    sock, address = _frozen_hub("watch")
    stopped = set()
    link = nodeagg.NodeLink(address, 1, lambda: 0 in stopped)
    got = {}

    def watcher():
        got["value"] = nodeagg.watch_key(link, store, "flag", 5.0)
        got["at"] = time.monotonic()

    t = threading.Thread(target=watcher)
    try:
        t.start()
        time.sleep(0.1)  # the watch waits in the hub
        stopped.add(0)
        store.set("flag", b"1")
        t0 = time.monotonic()
        t.join(10)
    finally:
        link.close()
        sock.close()
    assert got["value"] == b"1"
    assert got["at"] - t0 < 0.3, got["at"] - t0


class _Link:
    def __init__(self, address):
        self.address, self.votes = address, []

    def vote(self, base, slot, step, members, window):
        self.votes.append(base)


@pytest.mark.timeout(30)
def test_elastic_group_votes_through_the_hub_of_its_generation_only():
    """ElasticGroup's vote goes to the hub of the generation voted for: right after a membership change
    the watcher's link still leads to the last generation's hub, which serves after a grow (the same
    hub) and not after a shrink that left its host out; an agreement that then goes through the store
    sends the vote there too."""
    boot, pid = "b" * 32, os.getpid()
    procs = dict.fromkeys((0, 1, 2), (boot, pid))
    group = ElasticGroup.__new__(ElasticGroup)
    store = MemoryStore()
    group.store, group.slot, group.window, group.timeout = store, 1, 1.0, 5.0
    group._ns, group._committed, group._boot, group._proc_cache = "pycoll/elastic/u", 4, boot, procs
    group._vouched, group._hub_voted, group._vote_lock = (-1, -1), (-1, -1), threading.Lock()
    group._node = nodeagg.NodeAggregation(store, group._ns, 1, boot, lambda s: False)
    old = _Link(nodeagg.hub_address(group._ns, boot, 0, pid))  # slot 0 hosted generation 3's hub
    group._link_of = (3, old)
    group.members, group.generation = (0, 1, 2, 5), 4  # grown: the same hub
    group._vouch(4, 0)
    assert old.votes == ["pycoll/elastic/u/g4/a0/"] and not store.check(["pycoll/elastic/u/g4/a0/votes"])
    group.members, group.generation = (1, 2), 5  # slot 0 left out: slot 1 hosts the next hub
    group._vouch(5, 0)
    assert len(old.votes) == 1 and store.check(["pycoll/elastic/u/g5/a0/votes"])
    group._vouch(3, 0)  # a late vote for generation 3 goes to its hub
    assert old.votes[-1] == "pycoll/elastic/u/g3/a0/"
    group.members, group.generation = (1,), 3
    group._link_of = (3, None)  # the watcher renewed the link: none yet
    assert group._agree_at("pycoll/elastic/u/g3/a0/", (1,), 3) == ((1,), 4)
    assert membership._parse_votes(membership._get_or_empty(store, "pycoll/elastic/u/g3/a0/votes")) == {1: 4}


def test_bad_link():
    with pytest.raises(nodeagg.HubLost, match="no node hub"):
        nodeagg.NodeLink(f"pycoll-test-nobody-{os.getpid()}", 3)


# -- real processes: ElasticGroup, every member on this host, slot 0's process hosts the hub ---------


def _elastic(rank, n, addr, spec, die_at_step):
    failpoints.configure(spec, rank=rank)
    store = pycoll.TCPStore(addr[0], addr[1], "nodeagg-test", timeout=30.0)
    group = ElasticGroup(store, rank, n, backend="host", timeout=10.0, name="na", node_hub=True)
    time.sleep(0.3)  # every member has reached the hub (a reshape before that goes through the store)
    step = 0
    try:
        while step < 6:
            if rank == n - 1 and step == die_at_step:
                os.kill(os.getpid(), signal.SIGKILL)
            grad = np.full(4, step + 1.0)
            try:
                group.comm.all_reduce(grad)
            except pycoll.CommFailure:
                group.reshape()  # go on after the last step every survivor completed (one outcome per step)
                step = 0 if group.last_committed is None else group.last_committed + 1
                continue
            group.commit(step)
            step += 1
    except Excluded:
        return "excluded"
    out = (group.generation, group.members)
    group.close()
    return out


@pytest.mark.timeout(90)
@pytest.mark.parametrize("spec, survivors", [
    ("", (0, 1, 2)),                                 # the last slot dies: the hub (slot 0) serves the others
    ("elastic.node.fanout=kill;rank=0", (1, 2)),     # then the hub's process dies handing out the flag
    ("elastic.node.forward=kill;rank=0", (1, 2)),    # ... or about to send the votes
    ("elastic.node.vote=kill;rank=2", (0, 1)),       # a plain member dies voting through the hub
])
def test_elastic_group_through_the_hub(spec, survivors, tmp_path):
    srv = pycoll.TCPStoreServer(token="nodeagg-test").start()
    trace = tmp_path / "trace"
    try:
        full = f"{spec};trace={trace},elastic.node.forward=note;trace={trace}" if spec else \
            f"elastic.node.forward=note;trace={trace}"
        res = run_ranks(_elastic, 4, srv.address, full, 2, timeout=60, may_die=[0, 1, 2, 3])
    finally:
        srv.close()
    got = {r for r in res if isinstance(r, tuple)}
    assert got == {(1, survivors)}, res
    assert all(isinstance(res[s], tuple) for s in survivors), res
    assert "elastic.node." in trace.read_text(), "the hub was not used"


def test_a_small_membership_agrees_without_a_hub():
    """Below min_members no hub is hosted or reached (the store directly); from it on, the lowest local
    slot hosts one. ElasticGroup's default (node_hub=None) sets it to NODE_HUB_MIN_MEMBERS."""
    from pycoll.elastic import NODE_HUB_MIN_MEMBERS

    boot = "c" * 32
    small = tuple(range(4))
    procs = {m: (boot, os.getpid()) for m in range(NODE_HUB_MIN_MEMBERS)}
    agg = nodeagg.NodeAggregation(MemoryStore(), f"ns{os.getpid()}", 0, boot, lambda s: False,
                                  min_members=NODE_HUB_MIN_MEMBERS)
    try:
        assert agg.link(small, procs) is None and agg.hub is None and agg.address(small, procs) == ""
        big = tuple(range(NODE_HUB_MIN_MEMBERS))
        link = agg.link(big, procs)
        assert link is not None and agg.hub is not None and agg.hub.alive
        assert agg.address(big, procs) == link.address
        assert agg.link(small, procs) is None and agg.hub is None  # shrunk below it: the hub is closed
    finally:
        agg.close()
    for node_hub, expected in ((None, NODE_HUB_MIN_MEMBERS), (True, 1)):
        group = pycoll.ElasticGroup(MemoryStore(), 0, 1, backend="host", name=f"hubs{node_hub}", node_hub=node_hub)
        try:
            assert group._node is not None and group._node.min_members == expected
        finally:
            group.close()


def test_a_torch_store_reaches_the_hub_wrapped():
    """ElasticGroup wraps a torch store (c10d's, not a pycoll one: its get takes no timeout, it has no append_get);
    its node hub must get the wrapped one too, or every wait and agreement through the hub fails."""
    dist = pytest.importorskip("torch.distributed")
    boot = "d" * 32
    group = pycoll.ElasticGroup(dist.HashStore(), 0, 1, backend="host", name="torchhub", node_hub=True)
    agg = group._node
    assert agg is not None
    try:
        # the group's watcher links its own members, (0,) alone, and so closes any hub: stopped first
        group._stop.set()
        group._watcher.join(5.0)
        agg.boot = boot  # slot 1 on this host too: slot 0 hosts the hub of (0, 1)
        link = agg.link((0, 1), {0: (boot, os.getpid()), 1: (boot, os.getpid())})
        assert link is not None and agg.hub is not None
        group.store.set("torchhub/key", b"v")
        assert nodeagg.watch_key(link, group.store, "torchhub/key", 5.0) == b"v"
        assert agg.hub.alive and not link.broken  # the hub got it from the store: it did not fail
    finally:
        group.close()
