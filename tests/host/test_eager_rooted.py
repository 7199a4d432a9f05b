"""Small rooted collectives over the host library's eager lane (pycoll/_host/coll.c): a Broadcast's or Scatter's
root (a Gather's or Reduce's other ranks) writes its block and is done, up to EAGER_SLOTS operations ahead of a
receiver; receivers read in order; arguments that differ are still a mismatch error, and a dead or stopped sender
still fails its receivers promptly."""

from __future__ import annotations

import os
import time

import numpy as np
import pytest
from helpers.host_util import init, lib, ptr, uid, wait_until
from helpers.mp import Died, run_ranks

import pycoll
from pycoll import errors
from pycoll._bindings import DataType, RedOp

pytestmark = pytest.mark.timeout(60)

F32 = int(DataType.Float32)
SUM = int(RedOp.Sum)
SLOTS = 16  # EAGER_SLOTS
EAGER_F32 = 240  # EAGER_PAYLOAD (960 bytes) of float32


def _run_ahead(rank, n, idb, marker):
    l = lib()
    comm = init(n, rank, idb)
    x = np.zeros(4, np.float32)
    l.all_reduce(ptr(x), ptr(x), 4, F32, SUM, comm)  # everyone initialised
    if rank == 0:
        for i in range(SLOTS):  # no receiver reads yet: all done at once
            x[:] = i
            l.broadcast(ptr(x), ptr(x), 4, F32, 0, comm)
        with open(marker, "w"):
            pass
        x[:] = SLOTS
        t0 = time.monotonic()
        l.broadcast(ptr(x), ptr(x), 4, F32, 0, comm)  # the ring to rank 1 is full: waits until it reads
        took = time.monotonic() - t0
        l.comm_destroy(comm)
        return took
    wait_until(lambda: os.path.exists(marker), 20, "the root's run ahead")
    time.sleep(0.3)
    got = []
    for _ in range(SLOTS + 1):
        l.broadcast(0, ptr(x), 4, F32, 0, comm)
        got.append(float(x[0]))
    l.comm_destroy(comm)
    return got


def test_a_root_runs_ahead_of_its_receivers_by_the_lane_and_no_further(tmp_path):
    took, got = run_ranks(_run_ahead, 2, uid(), str(tmp_path / "ahead"), timeout=40)
    assert got == [float(i) for i in range(SLOTS + 1)]
    assert took >= 0.2, took  # the 17th waited for the receiver


def _with_p2p(rank, n, idb):
    """Broadcasts, a Gather and sends between the same two ranks, in an order where a shared ring would mix them."""
    l = lib()
    comm = init(n, rank, idb)
    a, b = np.full(3, 10.0 + rank, np.float32), np.zeros(3, np.float32)
    g = np.zeros(3 * n, np.float32)
    out = []
    for i in range(3):
        a[:] = 10.0 * i + rank
        l.broadcast(ptr(a), ptr(b), 3, F32, 0, comm)
        out.append(float(b[0]))
        l.group_start()
        if rank == 0:
            l.send(ptr(a), 3, F32, 1, comm)
        else:
            l.recv(ptr(b), 3, F32, 0, comm)
        l.group_end()
        out.append(float(b[0]) if rank == 1 else None)
        l.gather(ptr(a), ptr(g), 3, F32, 1, comm)
        out.append(g[::3].tolist() if rank == 1 else None)
    l.comm_destroy(comm)
    return out


def test_the_lane_and_sends_between_the_same_ranks_never_meet():
    r0, r1 = run_ranks(_with_p2p, 2, uid(), timeout=30)
    assert r0 == [0.0, None, None, 10.0, None, None, 20.0, None, None]
    assert r1 == [0.0, 0.0, [0.0, 1.0], 10.0, 10.0, [10.0, 11.0], 20.0, 20.0, [20.0, 21.0]]


def _paths_differ(rank, n, idb, big_rank, folder):
    """Rank `big_rank` broadcasts more than the lane takes (the step path), the other a small count (the lane). The
    ranks abort once both are through (files in `folder`): a rank's abort fails its peer (a RemoteError) when that
    peer has not looked yet -- on one busy CPU, before it entered its broadcast."""
    l = lib()
    comm = init(n, rank, idb)
    x = np.ones(4 * EAGER_F32, np.float32)
    l.all_reduce(ptr(x), ptr(x), 4, F32, SUM, comm)
    count = 4 * EAGER_F32 if rank == big_rank else 4
    try:
        l.broadcast(ptr(x), ptr(x), count, F32, 0, comm)
    except errors.InvalidUsage as e:
        text = e.last_error
    else:  # a root that ran ahead: its next wait for the other rank fails
        with pytest.raises(errors.NCCLError):
            l.all_reduce(ptr(x), ptr(x), 4, F32, SUM, comm)
        text = None
    open(os.path.join(folder, f"through_{rank}"), "w").close()
    deadline = time.monotonic() + 20
    while not os.path.exists(os.path.join(folder, f"through_{1 - rank}")) and time.monotonic() < deadline:
        time.sleep(0.01)
    l.comm_abort(comm)
    return text


@pytest.mark.parametrize("big_rank", [0, 1], ids=["root-on-the-steps", "receiver-on-the-steps"])
def test_arguments_that_take_different_paths_are_a_mismatch_not_a_hang(big_rank, tmp_path):
    t0 = time.monotonic()
    texts = run_ranks(_paths_differ, 2, uid(), big_rank, str(tmp_path), timeout=30)
    assert time.monotonic() - t0 < 20
    assert texts[1] is not None  # the receiver always finds it
    for text in filter(None, texts):
        assert "mismatch" in text and "count=4," in text and (
            f"count={4 * EAGER_F32}" in text or "went past" in text), texts


def _late_and_dead_senders(rank, n, idb):
    """A Reduce's root waits for the messages of rank 1 (alive, 2 s late) and rank 2 (killed 0.3 s in)."""
    l = lib()
    comm = init(n, rank, idb)
    x = np.ones(4, np.float32)
    l.all_reduce(ptr(x), ptr(x), 4, F32, SUM, comm)
    if rank == 2:
        time.sleep(0.3)
        os.kill(os.getpid(), 9)
    if rank == 1:
        time.sleep(2.0)
    t0 = time.monotonic()
    try:
        l.reduce(ptr(x), ptr(x), 4, F32, SUM, 0, comm)
    except errors.RemoteError as e:
        assert rank == 0 and "rank 2" in e.last_error, e.last_error
    took = time.monotonic() - t0
    l.comm_abort(comm)
    return took


def test_a_receiver_fails_as_any_sender_it_waits_for_dies_not_only_the_first():
    out = run_ranks(_late_and_dead_senders, 3, uid(), timeout=40, may_die=[2])
    assert isinstance(out[2], Died)
    assert 0.2 < out[0] < 1.5, out


def _sent_then_left(rank, n, idb, failpoint, delays):
    """A Reduce's root is held 0.4 s at ``failpoint`` the first time it passes it; each rank starts the reduce
    ``delays[rank]`` seconds in: one sender 0.1 s (it then destroys its communicator at once, done with its program),
    the other 1 s. The root's first look at the early sender comes before it sent; by the time the root asks whether
    it failed or left, it has sent and gone."""
    if rank == 0:
        os.environ["PYCOLL_FAILPOINTS"] = f"{failpoint}=sleep(400)@1"
    l = lib()
    comm = init(n, rank, idb)
    x = np.full(4, rank + 1, np.float32)
    time.sleep(delays[rank])
    l.reduce(ptr(x), ptr(x), 4, F32, SUM, 0, comm)
    l.comm_destroy(comm)
    return float(x[0])


def test_a_sender_that_sent_and_left_is_no_failure_of_its_receiver():
    """A sender that did its part right before it left is no failure of the receiver still waiting for another
    sender: the receiver looks at its part again once it sees it gone. Here rank 2, which the root checks besides
    rank 1 (the one it waits for), at failpoint host.coll.check_waited. Without that second look the root failed with
    "rank 2 has destroyed the communicator while rank 0 waits for it"."""
    out = run_ranks(_sent_then_left, 3, uid(), "host.coll.check_waited", (0.0, 1.0, 0.1), timeout=40)
    assert out[0] == 6.0, out


def test_the_sender_waited_for_that_sent_and_left_is_no_failure_of_its_receiver():
    """The same for the sender the receiver waits for (rank 1, at failpoint host.wait.check_peer): found gone, its
    part is there, and the receiver goes on to wait for rank 2. Before, the receiver's second look found rank 1's part
    but reported no progress (it moved on to rank 2 without taking anything yet), and the root failed with "rank 1
    has destroyed the communicator while rank 0 waits for it" (CI: a Gather's root of test_group_batch.py, "rank 1
    has finalized the communicator while rank 3 waits for it")."""
    out = run_ranks(_sent_then_left, 3, uid(), "host.wait.check_peer", (0.0, 0.1, 1.0), timeout=40)
    assert out[0] == 6.0, out


def _killed_or_stopped_root(rank, n, folder, action):
    if rank == 0:
        os.environ["PYCOLL_FAILPOINTS"] = f"host.coll.eager={action}@3"
    # a store: the watchdog's liveness checks find a stopped peer through the process record it publishes there
    comm = pycoll.init(rank, n, store=pycoll.FileStore(os.path.join(folder, "store")), backend="host", timeout=20)
    x = np.ones(4, np.float32)
    comm.all_reduce(x)
    t0 = time.monotonic()
    out = "no error", 0.0, ""
    try:
        for _ in range(4):
            comm.broadcast(x, root=0)  # the root dies (stops) sending its second, to rank 1 (before rank 2)
    except pycoll.CommFailure as e:
        out = type(e).__name__, time.monotonic() - t0, str(e)
    # both receivers stay until both failed: one that left first would be what the other's liveness check finds
    open(os.path.join(folder, f"failed{rank}"), "w").close()
    wait_until(lambda: all(os.path.exists(os.path.join(folder, f"failed{r}")) for r in (1, 2)), 20, "both failures")
    return out


@pytest.mark.parametrize("action", ["kill", "stop"])
def test_a_root_killed_or_stopped_sending_fails_its_receivers(action, tmp_path):
    out = run_ranks(_killed_or_stopped_root, 3, str(tmp_path), action, timeout=40, may_die=[0])
    assert isinstance(out[0], Died)
    for name, took, text in out[1:]:
        assert name != "no error" and took < 8, out
        assert "rank 0" in text, text
