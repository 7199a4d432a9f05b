"""The host library's bound on a stream's queue through its C functions (pycoll_host.h): a collective queued onto a
stream that holds PYCOLL_HOST_STREAM_DEPTH operations not begun waits in the call until one is taken
(pycollStreamWaitRoom tells whether it would), and that wait ends with the error the queued work meets when the
communicator is aborted or its peer dies, nothing queued, or with the operation queued past the bound on a signal."""

from __future__ import annotations

import os
import signal
import threading
import time

import numpy as np
import pytest
from helpers.host_util import init, lib, uid, wait_until
from helpers.mp import Died, run_ranks

from pycoll._bindings import DataType, RedOp
from pycoll.errors import NCCLError

pytestmark = pytest.mark.timeout(60)

DEPTH = 8
ENV = {"PYCOLL_HOST_STREAM_DEPTH": str(DEPTH)}


def _held(rank, n, uid_, trace):
    """1 rank: the stream waits for an armed event, so the all_reduce queued behind it are not begun; the (DEPTH+1)-th
    waits in its call until a thread fires the event once the wait began (the failpoint's note)."""
    os.environ["PYCOLL_FAILPOINTS"] = f"host.stream.full=note;trace={trace}"
    l = lib()
    comm = init(n, rank, uid_)
    s, ev = l.host_stream_create(), l.host_event_create()
    l.host_event_arm(ev)
    l.host_stream_wait_event(s, ev)
    xs = [np.full(2, float(i), np.float32) for i in range(DEPTH + 1)]
    for x in xs[:DEPTH]:
        l.all_reduce(x.ctypes.data, x.ctypes.data, 2, DataType.Float32, RedOp.Sum, comm, s)
    room_before = l.host_stream_wait_room(s, 0.01)
    fired = []

    def fire():
        wait_until(lambda: os.path.exists(trace), 30, "the wait for room")
        fired.append(time.monotonic())
        l.host_event_fire(ev)

    threading.Thread(target=fire, daemon=True).start()
    x = xs[DEPTH]
    l.all_reduce(x.ctypes.data, x.ctypes.data, 2, DataType.Float32, RedOp.Sum, comm, s)
    returned = time.monotonic()
    l.host_stream_synchronize(s)
    out = {"room before": room_before, "room after": l.host_stream_wait_room(s, 0), "waited": bool(fired),
           "returned after the fire": bool(fired) and returned >= fired[0],
           "right": [x.tolist() for x in xs] == [[float(i)] * 2 for i in range(DEPTH + 1)]}
    l.host_stream_destroy(s)
    l.host_event_destroy(ev)
    l.comm_destroy(comm)
    return out


def test_a_call_onto_a_full_stream_waits_until_one_is_taken(tmp_path):
    (res,) = run_ranks(_held, 1, uid(), str(tmp_path / "full"), env=ENV, timeout=50)
    assert res == {"room before": False, "room after": True, "waited": True, "returned after the fire": True,
                   "right": True}, res


def _raw_issuer(rank, n, uid_, trace, done, what):
    """Rank 0 queues all_reduce on a host stream through the C API until a call waits for room (rank 1 issues none);
    then rank 1 is killed, or a thread of rank 0 aborts the communicator or sends SIGINT. Returns how the call that
    waited ended."""
    if rank == 0:
        os.environ["PYCOLL_FAILPOINTS"] = f"host.stream.full=note;trace={trace}"
    l = lib()
    comm = init(n, rank, uid_)
    if rank == 1:
        wait_until(lambda: os.path.exists(trace), 30, "rank 0 waiting for room")
        if what == "kill":
            os.kill(os.getpid(), signal.SIGKILL)
        wait_until(lambda: os.path.exists(done), 30, "rank 0 done")
        l.comm_abort(comm)
        return None
    s = l.host_stream_create()

    def act():
        wait_until(lambda: os.path.exists(trace), 30, "the wait for room")
        if what == "abort":
            l.comm_abort(comm)
        elif what == "sigint":
            os.kill(os.getpid(), signal.SIGINT)

    threading.Thread(target=act, daemon=True).start()
    x = np.ones(2, np.float32)
    out = "no error"
    try:
        for _ in range(4 * DEPTH):
            l.all_reduce(x.ctypes.data, x.ctypes.data, 2, DataType.Float32, RedOp.Sum, comm, s)
    except NCCLError as e:
        out = type(e).__name__
    except KeyboardInterrupt:
        out = "KeyboardInterrupt"
    took = time.time() - os.path.getmtime(trace)  # since the wait began (the failpoint's note)
    open(done, "w").close()
    if what != "abort":
        l.comm_abort(comm)
    l.host_stream_destroy(s)
    return out, took


@pytest.mark.parametrize("what,raised", [("kill", "RemoteError"), ("abort", "InvalidUsage"),
                                         ("sigint", "KeyboardInterrupt")])
def test_the_wait_in_the_call_ends_when_the_peer_dies_the_communicator_is_aborted_or_a_signal_comes(tmp_path, what,
                                                                                                    raised):
    res = run_ranks(_raw_issuer, 2, uid(), str(tmp_path / "full"), str(tmp_path / "done"), what, env=ENV, may_die=[1],
                    timeout=50)
    out, took = res[0]
    assert out == raised and took < 0.5, res
    if what == "kill":
        assert isinstance(res[1], Died), res
