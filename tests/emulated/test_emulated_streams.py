"""pycoll's GPU code path on the emulated GPU, two ranks in real processes, on each kind of stream:
the legacy default stream (0), a framework's current stream (torch-like, CuPy-like), a side stream
(an int handle) and a stream object. Every collective gives the right result and stays outstanding
until its stream reaches it; a hang becomes a CommTimeout on every rank with dumps torch's analyzer
reads; the watchdog's abort unblocks the stream."""

from __future__ import annotations

import pickle
import time

import emu_helpers as H
import numpy as np
import pytest

pytestmark = pytest.mark.emulated_gpu

# the legacy default stream (the path a review found the watchdog blind on) and a framework's current stream run in
# CI; the other kinds go through the same resolution and completion code, with --runslow
KIND_PARAMS = [pytest.param(k, marks=() if k in ("default_stream", "torch_current") else pytest.mark.slow)
               for k in H.KINDS]


def _behind_hung_kernel(rank, n, uid, kind):
    comm, rt = H.setup(rank, n, uid)
    st = H.Streams(kind, comm, rt)
    works, results = H.all_collectives(comm, st, async_op=False)  # blocking: done on return
    first = results()
    gate = rt.hang(st.handle)
    works, results = H.all_collectives(comm, st, async_op=True)
    time.sleep(0.2)
    pending = [w.is_completed() for w in works]
    outstanding = comm.outstanding() == works
    streams = {w.stream for w in works}
    gate.release()
    for w in works:
        w.wait()
    out = {"first": first, "pending": pending, "outstanding": outstanding, "streams": sorted(streams),
           "handle": int(st.handle), "after": results(), "left": len(comm.outstanding())}
    comm.destroy()
    return out


@pytest.mark.timeout(60)
@pytest.mark.parametrize("kind", KIND_PARAMS)
def test_every_collective_waits_for_its_stream(kind):
    res = H.run_ranks(_behind_hung_kernel, 2, H.uid(), kind)
    for rank, r in enumerate(res):
        want = H.expected(rank)
        assert r["first"] == want
        assert r["after"]["all_reduce"] == want["all_reduce"]
        assert r["pending"] == [False] * 11, "an operation completed before its stream reached it"
        assert r["outstanding"]
        assert r["streams"] == [r["handle"]]
        assert r["left"] == 0


def _hang_times_out(rank, n, uid, kind, dump_dir):
    import pycoll

    comm, rt = H.setup(rank, n, uid, timeout=1.0, dump_dir=dump_dir)
    st = H.Streams(kind, comm, rt)
    x = st.array(np.ones(4))
    comm.all_reduce(x, stream=st.arg)
    gate = rt.hang(st.handle)
    t0 = time.monotonic()
    try:
        comm.all_reduce(x, stream=st.arg)
        error = None
    except pycoll.CommFailure as e:
        error = e
    elapsed = time.monotonic() - t0
    pycoll.watchdog.get_watchdog().wait_for_dumps()
    deadline = time.monotonic() + 3.0
    while comm.state != "aborted" and time.monotonic() < deadline:  # the policy's abort runs in its own thread
        time.sleep(0.01)
    state = comm.state
    gate.release()
    return {"error": type(error).__name__, "elapsed": elapsed, "state": state}


@pytest.mark.timeout(60)
@pytest.mark.parametrize("kind", KIND_PARAMS)
def test_hang_becomes_comm_timeout_on_every_rank(kind, tmp_path):
    d = str(tmp_path)
    res = H.run_ranks(_hang_times_out, 2, H.uid(), kind, d)
    for r in res:
        assert r["error"] == "CommTimeout"
        assert 0.9 < r["elapsed"] < 4.0
        assert r["state"] == "aborted"
    assert H.dumped_ranks(d) == {0, 1}
    with open(f"{d}/generation_0/{H.PREFIX}0", "rb") as f:
        dump = pickle.load(f)
    assert [e["profiling_name"].split(":")[-1] for e in dump["entries"]][-1] == "all_reduce"
    assert dump["entries"][-1]["state"] == "scheduled"  # behind the hung kernel: never started
    report = H.torch_fr_trace(d)
    assert "Traceback" not in report


def _peer_missing(rank, n, uid, kind):
    import pycoll

    comm, rt = H.setup(rank, n, uid, timeout=0.5)
    st = H.Streams(kind, comm, rt)
    x = st.array(np.ones(4))
    comm.all_reduce(x, stream=st.arg)
    if rank == 1:
        time.sleep(2.0)  # never joins the second collective
        return {}
    w = comm.all_reduce(x, stream=st.arg, async_op=True)
    try:
        w.wait()
        error = None
    except pycoll.CommFailure as e:
        error = type(e).__name__
    deadline = time.monotonic() + 3.0
    while comm.state != "aborted" and time.monotonic() < deadline:
        time.sleep(0.01)
    # the aborted collective left the stream: work queued after it runs
    after = rt.cudaEventCreateWithFlags(0)[1]
    rt.cudaEventRecord(after, st.handle)
    deadline = time.monotonic() + 3.0
    while int(rt.cudaEventQuery(after)[0]) != 0 and time.monotonic() < deadline:
        time.sleep(0.01)
    return {"error": error, "drained": int(rt.cudaEventQuery(after)[0]) == 0, "state": comm.state}


@pytest.mark.timeout(60)
@pytest.mark.parametrize("kind", KIND_PARAMS)
def test_abort_from_the_watchdog_unblocks_the_stream(kind):
    res = H.run_ranks(_peer_missing, 2, H.uid(), kind)
    assert res[0] == {"error": "CommTimeout", "drained": True, "state": "aborted"}


def _group_on_several_streams(rank, n, uid):
    import pycoll.emulated as emu

    comm, rt = H.setup(rank, n, uid)
    s1, s2 = comm.device.create_stream(), comm.device.create_stream()
    if rank == 1:  # rank 1's first stream is busy for a while: its group must still meet rank 0's in issue order
        rt.launch(s1, lambda: time.sleep(0.3))
    out = []
    for _ in range(3):
        xs = [emu.TorchLikeTensor(rt, np.full(k, (rank + 1.0) * 10 ** i, np.float32)) for i, k in enumerate((4, 4, 4))]
        with comm.group():
            ws = [comm.all_reduce(x, stream=s, async_op=True) for x, s in zip(xs, (s1, s2, s1), strict=True)]
        for w in ws:
            w.wait()
        out.append([x.numpy().tolist() for x in xs])
    comm.destroy()
    return out


@pytest.mark.timeout(60)
def test_a_group_on_several_streams_matches_in_issue_order():
    """A group's operations on two streams meet the other rank's in the order they were issued (the host library
    joins the streams around the group, as NCCL does), not in an order its streams' timing picks: same-shaped
    operations paired wrongly gave wrong sums, silently."""
    want = [[[3.0 * 10 ** i] * 4 for i in range(3)]] * 3
    assert H.run_ranks(_group_on_several_streams, 2, H.uid()) == [want, want]
