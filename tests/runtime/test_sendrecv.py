"""``Communicator.sendrecv``: a send and a receive with one peer as one operation."""

from __future__ import annotations

import os
import signal
import time

import numpy as np
import pytest
from helpers.mp import Died, run_ranks

import pycoll
from pycoll import _bindings as B


def _uid() -> bytes:
    return bytes(B.load("host").get_unique_id())


def _partner(rank: int, n: int) -> int:
    return rank ^ 1 if (rank ^ 1) < n else rank


def _exchanges(rank, n, uid, use_torch):
    c = pycoll.init(rank, n, unique_id=uid, backend="host")
    peer = _partner(rank, n)
    out = {}
    # sizes differ per direction: rank r sends r + 1 elements and receives its peer's peer + 1
    if use_torch:
        import torch

        s, o = torch.full((rank + 1,), float(rank)), torch.zeros(peer + 1)
        w = c.sendrecv(s, o, peer)
        out["torch"] = o.tolist() == [float(peer)] * (peer + 1) and w.is_completed() and w.op == "sendrecv"
    else:
        s, o = np.full(rank + 1, float(rank), np.float32), np.zeros(peer + 1, np.float32)
        w = c.sendrecv(s, o, peer)
        out["numpy"] = o.tolist() == [float(peer)] * (peer + 1) and w.is_completed() and w.peer == peer
    # the two directions in different dtypes
    s8, o8 = np.full(3, rank, np.int64), np.zeros(3, np.int64)
    c.sendrecv(s8, o8, peer)
    out["int64"] = o8.tolist() == [peer] * 3
    # asynchronous, then waited for
    a, b = np.full(5, rank + 10.0), np.zeros(5)
    w = c.sendrecv(a, b, peer, async_op=True)
    w.wait(timeout=30)
    out["async"] = b.tolist() == [peer + 10.0] * 5
    # the peer may post a send and a receive in a group instead, in either order
    b[:] = 0
    if rank % 2 == 0:
        c.sendrecv(a, b, peer)
    else:
        with c.group():
            c.recv(b, peer)
            c.send(a, peer)
    out["mixed"] = b.tolist() == [peer + 10.0] * 5
    # two exchanges in one group (with the partner and with the rank two away), then a collective
    if n >= 4:
        far = rank ^ 2
        x, y = np.zeros(2), np.zeros(2)
        with c.group():
            c.sendrecv(np.full(2, float(rank)), x, peer)
            c.sendrecv(np.full(2, 100.0 + rank), y, far)
        out["grouped"] = x.tolist() == [float(peer)] * 2 and y.tolist() == [100.0 + far] * 2
    total = np.ones(1)
    c.all_reduce(total)
    out["after"] = total.tolist() == [float(n)]
    out["p2p_seq"] = c.progress().p2p_enqueued == (6 if n >= 4 else 4) + (rank % 2 == 1)
    c.destroy()
    return out


@pytest.mark.timeout(90)
@pytest.mark.parametrize("n", [1, 2, 3, 4])
def test_sendrecv_exchanges_with_the_partner(n):
    for res in run_ranks(_exchanges, n, _uid(), False, timeout=60):
        assert all(res.values()), {k: v for k, v in res.items() if not v}


@pytest.mark.timeout(90)
def test_sendrecv_torch():
    for res in run_ranks(_exchanges, 2, _uid(), True, timeout=60):
        assert all(res.values()), {k: v for k, v in res.items() if not v}


def test_bad_arguments_are_refused_and_the_communicator_stays_usable():
    c = pycoll.init(0, 1, backend="host")
    try:
        x = np.arange(8, dtype=np.float32)
        with pytest.raises(ValueError, match="sendrecv: tensor and output overlap in memory"):
            c.sendrecv(x, x, 0)
        with pytest.raises(ValueError, match="overlap"):
            c.sendrecv(x[:5], x[4:], 0)
        ro = np.zeros(8, np.float32)
        ro.setflags(write=False)
        with pytest.raises(ValueError, match="output: the array is read-only"):
            c.sendrecv(x, ro, 0)
        with pytest.raises(ValueError, match="peer 1 is out of range"):
            c.sendrecv(x, np.zeros(8, np.float32), 1)
        with pytest.raises(TypeError, match="output: cannot use an object of type list"):
            c.sendrecv(x, [0.0] * 8, 0)
        out = np.zeros(8, np.float32)
        c.sendrecv(x[:4], out[4:], 0)  # adjacent, not overlapping: fine
        assert out.tolist() == [0.0] * 4 + [0.0, 1.0, 2.0, 3.0]
        assert c.progress().p2p_enqueued == 1
    finally:
        c.destroy()


def _size_mismatch(rank, n, uid):
    c = pycoll.init(rank, n, unique_id=uid, backend="host", timeout=10)
    try:
        c.sendrecv(np.ones(8), np.zeros(8 if rank == 0 else 4), 1 - rank)
        return "completed"
    except pycoll.CommFailure as exc:
        return f"{type(exc).__name__}: {exc}"


@pytest.mark.timeout(60)
def test_a_receive_smaller_than_the_peers_send_is_an_error_that_names_both_sizes():
    res = run_ranks(_size_mismatch, 2, _uid(), timeout=30)
    assert "size mismatch: rank 1 receives 32 bytes (count=4, ncclFloat64) from rank 0, which sends 64 bytes" in res[1]


def _dead_partner(rank, n, uid):
    c = pycoll.init(rank, n, unique_id=uid, backend="host", timeout=30)
    c.barrier()
    if rank == 1:
        os.kill(os.getpid(), signal.SIGKILL)
    t0 = time.monotonic()
    try:
        c.sendrecv(np.ones(4), np.zeros(4), _partner(rank, n))
        return "no exception"
    except pycoll.RemoteError as exc:
        return time.monotonic() - t0, str(exc)


@pytest.mark.timeout(60)
def test_a_killed_partner_is_a_remote_error_at_once():
    res = run_ranks(_dead_partner, 2, _uid(), timeout=30, may_die=[1])
    assert isinstance(res[1], Died)
    elapsed, text = res[0]
    assert elapsed < 5.0 and "rank 1" in text and "exited" in text, text


def _stopped_partner(rank, n, uid):
    c = pycoll.init(rank, n, unique_id=uid, backend="host")
    c.barrier()
    c.barrier()  # collective #2; the sendrecv is point-to-point #1
    if rank == 1:
        os.kill(os.getpid(), signal.SIGSTOP)
        return None
    t0 = time.monotonic()
    try:
        c.sendrecv(np.ones(4), np.zeros(4), 1, timeout=1.0)
        return "no exception"
    except pycoll.CommTimeout as exc:
        return time.monotonic() - t0, str(exc), c.state, (exc.op, exc.seq, exc.peer)


@pytest.mark.timeout(60)
def test_a_stopped_partner_times_out_with_the_operation_named():
    res = run_ranks(_stopped_partner, 2, _uid(), timeout=30, may_die=[1])
    elapsed, text, state, attrs = res[0]
    assert 1.0 <= elapsed < 3.0 and state == "aborted", (elapsed, text, state)
    # its own number and its peer (it was "(seq 1)" with the attribute seq the collectives' count, 2, no peer)
    assert "sendrecv (p2p seq 1 with peer 1) did not complete" in text and attrs == ("sendrecv", 1, 1), (text, attrs)


def test_a_group_refuses_a_transfer_whose_memory_another_of_its_operations_writes():
    """A group's operations run together, unordered: a receive into memory being sent got the sender's own data or the
    peer's, varying by size (134,528 of 200,000 elements wrong, no error). Refused as sendrecv refuses its own pair;
    the block's exception drops the group, the communicator goes on. Disjoint parts of one array (a ring) and sends
    of one array to several peers stay allowed, as do collectives on one array (they run in their order)."""
    c = pycoll.init(0, 1, backend="host")
    try:
        x = np.arange(8, dtype=np.float32)
        n = r"#\d+"
        bad = [(lambda: (c.send(x, 0), c.recv(x, 0)), f"recv: its output overlaps .* the input of send {n}"),
               (lambda: (c.recv(x[:5], 0), c.send(x[4:], 0)), f"send: its input .* the output of recv {n} with peer 0"),
               (lambda: (c.recv(x[:4], 0), c.recv(x[3:7], 0)), f"recv: its output .* the output of recv {n}"),
               (lambda: (c.all_reduce(x, async_op=True), c.send(x, 0)), "send: its input .* output of all_reduce #1")]
        for issue, message in bad:
            with pytest.raises(ValueError, match=message + ".* a group's operations run together"), c.group():
                issue()
            assert c.outstanding() == [] and c.state == "active"
        y = np.zeros(8, np.float32)
        with c.group():
            c.send(x[:4], 0)
            c.send(x[:4], 0)
            c.recv(y[:4], 0)
            c.recv(y[4:], 0)
            z = np.ones(3)
            c.all_reduce(z, async_op=True)
            c.all_reduce(z, async_op=True)
        assert y.tolist() == list(range(4)) * 2
    finally:
        c.abort()


def test_an_asyncio_task_cannot_join_another_tasks_open_group():
    """The open group is the thread's: a blocking operation of one asyncio task joined another task's group (it
    returned at once, its data came later or never) and two tasks' groups ended each other's. Both refused."""
    import asyncio

    c = pycoll.init(0, 1, backend="host")
    out = {}

    async def a():
        with c.group():
            c.all_reduce(np.ones(2), async_op=True)
            await asyncio.sleep(0.05)
        out["a"] = "ended"

    async def b(make_group):
        await asyncio.sleep(0.01)
        try:
            if make_group:
                with c.group():
                    pass
            else:
                c.all_reduce(np.ones(2))
            out["b"] = "joined"
        except pycoll.CommStateError as e:
            out["b"] = str(e)

    async def main(make_group):
        await asyncio.gather(a(), b(make_group))

    try:
        for make_group in (False, True):
            asyncio.run(main(make_group))
            assert out["a"] == "ended" and "opened by another asyncio task" in out["b"], out
        y = np.ones(2)
        c.all_reduce(y, output=y)
        assert y.tolist() == [1.0, 1.0] and c.state == "active"
    finally:
        c.abort()


def test_group_blocks_that_end_out_of_order_are_dropped_with_an_error():
    """The first block ended while a later one was open: it waited for nothing and returned "completed" before its
    data came. Now it raises; the group is dropped where its last block ends."""
    c = pycoll.init(0, 1, backend="host")
    try:
        x = np.ones(2)
        ga, gb = c.group(), c.group()
        ga.__enter__()
        w1 = c.all_reduce(x, async_op=True)
        gb.__enter__()
        w2 = c.all_reduce(x, async_op=True)
        with pytest.raises(pycoll.CommStateError, match="ended out of order"):
            ga.__exit__(None, None, None)
        with pytest.raises(pycoll.CommStateError, match="dropped"):
            gb.__exit__(None, None, None)
        for w in (w1, w2):
            with pytest.raises(pycoll.CommStateError, match="never ran"):
                w.wait()
        c.all_reduce(x)
    finally:
        c.abort()


def test_a_group_whose_block_ends_in_another_thread_is_dropped_by_the_opening_threads_next_call():
    """A generator suspended inside ``with comm.group()`` and closed in another thread: its block's end raised a bare
    TypeError there, and the opening thread's group stayed open for good -- its blocking calls returned without
    running, destroy() said it was inside a group."""
    import threading

    c = pycoll.init(0, 1, backend="host")
    try:
        def stage():
            with c.group():
                c.all_reduce(np.ones(2), async_op=True)
                yield

        g = stage()
        next(g)
        raised = []

        def close():
            try:
                g.close()
            except pycoll.CommStateError as e:
                raised.append(str(e))

        t = threading.Thread(target=close)
        t.start()
        t.join(10)
        assert raised and "ended in another thread" in raised[0], raised
        y = np.ones(2)
        with pytest.raises(pycoll.CommStateError, match="was dropped, none of its 1 operations ran"):
            c.all_reduce(y)
        c.all_reduce(y)
        assert y.tolist() == [1.0, 1.0] and c.ops_issued == 2  # the dropped one and this one
    finally:
        c.destroy()


def test_a_groups_memory_check_knows_what_each_operation_writes_and_checks_big_groups_whole():
    """Collectives of two communicators on one array in one group run unordered too (each rank got another wrong
    value); a broadcast's root in place and a reduce's other ranks do not write their buffer (a send of it alongside was
    refused), a broadcast's root out of place does; a big group is checked whole as it ends."""
    c = pycoll.init(0, 1, backend="host")
    d = c.split(0, name="d")
    try:
        x = np.ones(4, np.float32)
        with pytest.raises(ValueError, match=r"all_reduce on 'd': its output overlaps .* of all_reduce #\d+ on "
                                             r"'world' in"), c.group():  # their numbers are their communicators'
            c.all_reduce(x, async_op=True)
            d.all_reduce(x, async_op=True)
        # a big group is checked as it ends: the block raised nothing, its operations say why the group was dropped
        works = []
        with pytest.raises(ValueError, match=r"all_reduce #\d+ on 'd': its (in|out)put overlaps .* of all_reduce #\d+ "
                                             r"on 'world' in"), c.group():  # the later one first: in issue order
            works.append(c.all_reduce(x[:2], async_op=True))
            works += [c.all_reduce(np.ones(2, np.float32), async_op=True) for _ in range(17)]
            works.append(d.all_reduce(x[1:3], async_op=True))
        with pytest.raises(pycoll.CommStateError, match="never ran: the group was dropped at its end .*overlaps"):
            works[0].wait()
        ro = np.ones(4, np.float32)
        ro.setflags(write=False)
        with c.group():  # nothing writes it: a broadcast's root reads its buffer
            c.broadcast(ro, root=0, async_op=True)
            c.send(ro, 0, async_op=True)
            c.recv(x, 0, async_op=True)
        assert x.tolist() == [1.0] * 4
        out = np.zeros(4, np.float32)  # out of place the root writes its output: a send of it alongside is refused
        with pytest.raises(ValueError, match=r"send: its input overlaps .* with the output of broadcast #\d+ in"), \
                c.group():
            c.broadcast(ro, root=0, output=out, async_op=True)
            c.send(out, 0, async_op=True)
        for clash in (False, True):  # 40 operations: the last one's receive meets the first send
            src = np.arange(40, dtype=np.float32)
            dst = np.zeros(40, np.float32)
            try:
                with c.group():
                    for i in range(20):
                        c.send(src[i:i + 1], 0, async_op=True)
                        c.recv(src[:1] if clash and i == 19 else dst[i:i + 1], 0, async_op=True)
            except ValueError as e:
                assert clash and "recv #" in str(e) and "overlaps in memory with the input of send #" in str(e), e
                assert dst.tolist() == [0.0] * 40  # the group was dropped: nothing ran
            else:
                assert not clash and dst[:20].tolist() == list(range(20))
        assert c.state == "active" and d.state == "active"
    finally:
        d.abort()
        c.abort()


def test_a_task_made_inside_a_groups_block_does_not_join_it():
    """A task copies the context of the one that made it: made inside the group's block, its blocking receive joined
    the group and returned before its data came."""
    import asyncio

    c = pycoll.init(0, 1, backend="host")
    seen = []

    async def child():
        try:
            c.all_reduce(np.ones(2))
            seen.append("joined")
        except pycoll.CommStateError as e:
            seen.append(str(e))

    async def main():
        with c.group():
            c.all_reduce(np.ones(2), async_op=True)
            t = asyncio.get_running_loop().create_task(child())
            await asyncio.sleep(0)
        await t

    try:
        asyncio.run(main())
        assert len(seen) == 1 and "opened by another asyncio task" in seen[0], seen
    finally:
        c.abort()


def test_a_first_contextvar_use_inside_a_group_does_not_make_it_anothers():
    """A thread that had used no contextvars opened a group with no context; the first ContextVar use inside the block
    (numpy's errstate: pre_mul_sum uses it) made the thread's context, and the group's later operations were refused
    as another asyncio task's."""
    import threading

    c = pycoll.init(0, 1, backend="host")
    seen = []

    def body(touch):
        x = np.ones(2, np.float32)
        try:
            with c.group():
                c.all_reduce(x)
                if touch == "errstate":
                    with np.errstate(over="ignore"):
                        pass
                    c.all_reduce(x)
                else:
                    c.all_reduce(x, op=c.pre_mul_sum(2.0, np.float32))
            seen.append(x.tolist())
        except Exception as e:
            seen.append(repr(e))
        c.hand_off()

    try:
        for touch in ("errstate", "premul"):
            t = threading.Thread(target=body, args=(touch,))  # a new thread: no context yet
            t.start()
            t.join(30)
        assert seen == [[1.0, 1.0], [2.0, 2.0]], seen
    finally:
        c.abort()


def _send_of_a_temporary_under_report(rank, n, uid):
    """Under on_failure="report" a failed operation stays queued in the library and may run later: rank 0's send of a
    temporary array, failed with the receive before it, ran once rank 1 came -- reading an array the failure had
    released (SIGSEGV)."""
    import gc

    comm = pycoll.init(rank, n, unique_id=uid, backend="host", timeout=1.5, on_failure="report")
    if rank == 0:
        wr = comm.recv(np.zeros(4), 1, async_op=True)
        ws = comm.send(np.full(1 << 20, 7, np.uint8), 1, async_op=True)  # the Work holds the only reference
        try:
            wr.wait()
        except pycoll.CommFailure:
            pass
        gc.collect()
        time.sleep(3.0)  # rank 1 receives meanwhile
        return ws.error is not None
    time.sleep(2.5)
    comm.send(np.zeros(4), 0)
    got = np.zeros(1 << 20, np.uint8)
    comm.recv(got, 0)
    return int(got[0]), int(got[-1])


@pytest.mark.timeout(60)
def test_a_failed_operation_that_still_runs_keeps_its_arrays():
    assert run_ranks(_send_of_a_temporary_under_report, 2, bytes(B.load("host").get_unique_id()),
                     timeout=40) == [True, (7, 7)]
