"""The watchdog's peer liveness: a stopped, killed or silent peer fails the outstanding work within
about a second, whatever the timeout; a slow but live one gets its whole timeout. Real processes."""

from __future__ import annotations

import contextlib
import os
import select
import signal
import subprocess
import sys
import threading
import time

import numpy as np
import pytest
from helpers.mp import Died, run_ranks

import pycoll
from pycoll import failpoints
from pycoll.diagnostics import liveness, watchdog
from pycoll.elastic import ElasticGroup

TOKEN = "liveness-test"


@pytest.fixture
def server():
    srv = pycoll.TCPStoreServer(token=TOKEN).start()
    yield srv.address
    srv.close()


def _loop(rank, n, addr, steps, victim, action, at, timeout, remote, watcher=None, spec=""):
    """Every member all-reduces ``steps`` times; at step ``at`` the victim stops, kills itself or sleeps 3 s.

    ``watcher``: only that rank watches its peers, with the failpoints ``spec`` armed.
    """
    if remote:
        liveness.simulate_remote(True)
    if watcher is not None:
        watchdog.configure(liveness=rank == watcher)
        failpoints.configure(spec if rank == watcher else "", rank=rank)
    store = pycoll.TCPStore(addr[0], addr[1], TOKEN, timeout=30.0)
    group = ElasticGroup(store, rank, n, backend="host", timeout=timeout, name="lv")
    failures = []
    step = 0
    while step < steps:
        if rank == victim and step == at:
            store.set("lv-test/fault", repr(time.time()))
            if action == "sleep":
                time.sleep(3.0)
            else:
                os.kill(os.getpid(), signal.SIGSTOP if action == "stop" else signal.SIGKILL)
        x = np.full(64, float(step + 1))
        try:
            group.comm.all_reduce(x)
        except pycoll.CommFailure as exc:
            failures.append((time.time(), type(exc).__name__, str(exc), group.comm.failure is not None
                             and type(group.comm.failure).__name__))
            group.reshape()
            # a member may have completed the step the others failed (a death mid-collective): every
            # survivor goes on from the last step all of them completed, as the README's loop does
            step = 0 if group.last_committed is None else group.last_committed + 1
            continue
        assert np.all(x == (step + 1) * group.size), (step, x[0], group.size)
        group.commit(step)
        step += 1
    fault = float(store.get("lv-test/fault", timeout=1.0)) if store.check(["lv-test/fault"]) else None
    causes = [str(group.comm.failure)] if group.comm.failure is not None else []
    out = dict(failures=failures, members=group.members, fault=fault, generation=group.generation,
               causes=causes + [t.cause for t in group.transitions])
    group.close()
    return out


def _survivors(res, victim):
    assert isinstance(res[victim], Died), res[victim]
    return [res[r] for r in range(len(res)) if r != victim]


@pytest.mark.timeout(90)
@pytest.mark.parametrize("victim", [0, 2])
def test_stopped_rank_is_found_within_a_second_whatever_the_timeout(server, victim):
    res = run_ranks(_loop, 4, server, 40, victim, "stop", 10, 30.0, False, timeout=60, may_die=[victim])
    outs = _survivors(res, victim)
    for out in outs:
        assert out["members"] == tuple(r for r in range(4) if r != victim) and out["generation"] == 1
        assert len(out["failures"]) == 1, out
        delay = out["failures"][0][0] - out["fault"]
        assert delay < 1.5, f"the survivors waited {delay:.2f} s (T = 30 s): {out['failures']}"
    causes = " ".join(" ".join(out["causes"]) for out in outs)
    assert f"rank {victim} (pid " in causes and "is stopped (SIGSTOP)" in causes, causes


def _p2p_beside_a_stopped_rank(rank, n, addr):
    comm = pycoll.init(rank, n, store=pycoll.TCPStore(addr[0], addr[1], TOKEN, timeout=30.0), backend="host",
                       timeout=10.0)
    comm.barrier()
    if rank == 1:  # takes part in nothing: the transfer between ranks 0 and 2 does not wait for it
        os.kill(os.getpid(), signal.SIGSTOP)
    x = np.arange(4.0) if rank == 0 else np.zeros(4)
    try:
        if rank == 0:
            time.sleep(1.5)  # past the liveness check's verdict on rank 1 (0.4 s)
            comm.send(x, 2)
        else:
            comm.recv(x, 0)
        out = x.tolist()
    except pycoll.CommFailure as e:
        out = str(e)
    comm.abort()
    return out


@pytest.mark.timeout(60)
def test_a_send_and_receive_between_live_ranks_goes_on_while_a_third_is_stopped(server):
    # the liveness check failed every outstanding operation when any rank of the communicator was stopped or gone:
    # rank 2's receive from rank 0 failed 0.4 s in ("rank 1 ... is stopped (SIGSTOP); recv #0 failed"), though
    # rank 0 then sent
    res = run_ranks(_p2p_beside_a_stopped_rank, 3, server, timeout=40, may_die=[1])
    assert res[0] == [0.0, 1.0, 2.0, 3.0] and res[2] == [0.0, 1.0, 2.0, 3.0], res


def _late_root_beside_a_stopped_rank(rank, n, addr):
    comm = pycoll.init(rank, n, store=pycoll.TCPStore(addr[0], addr[1], TOKEN, timeout=30.0), backend="host",
                       timeout=20.0, name="weights")
    w = np.zeros(1024, np.float32)
    comm.broadcast(w, root=0)
    if rank == 2:
        os.kill(os.getpid(), signal.SIGSTOP)
    if rank == 0:
        time.sleep(1.0)  # rank 1's liveness check finds rank 2 stopped first, and its policy aborts
    try:
        comm.broadcast(w, root=0)
        return "completed"
    except pycoll.CommFailure as e:
        return f"{type(e).__name__}: {e}"


@pytest.mark.timeout(60)
def test_a_rank_whose_peer_aborted_on_finding_a_stopped_rank_is_told_which(server):
    # rank 0 got "rank 1 aborted the communicator" (a RemoteError naming the rank that found the fault, not the one
    # at fault: a trainer deciding whom to drop would drop the healthy rank 1)
    res = run_ranks(_late_root_beside_a_stopped_rank, 3, server, timeout=40, may_die=[2])
    for r in (0, 1):
        assert "rank 2 (pid " in res[r] and "is stopped (SIGSTOP)" in res[r], res


def _wait_signal_from_two(rank, n, addr):
    store = pycoll.TCPStore(addr[0], addr[1], TOKEN, timeout=30.0)
    comm = pycoll.init(rank, n, store=store, backend="host", timeout=20.0)
    comm.barrier()
    if rank == 2:  # one of the two rank 0 waits for: never signals
        os.kill(os.getpid(), signal.SIGSTOP)
    out = None
    if rank == 1:
        comm.signal(0)
        store.get("done")  # alive (a peer gone counts as failed, its signal sent or not) until rank 0 has its answer
    elif rank == 0:
        t0 = time.monotonic()
        try:
            comm.wait_signal([(1, 1, 0, 0), (2, 1, 0, 0)])
            out = "no error"
        except pycoll.CommFailure as e:
            out = (type(e).__name__, time.monotonic() - t0, str(e))
        store.set("done", b"1")
    comm.abort()
    return out


@pytest.mark.timeout(60)
def test_a_wait_for_signals_of_several_peers_fails_when_any_of_them_is_stopped(server):
    # the liveness check watched only the first row's peer of a wait_signal over several (rank 1, which signalled):
    # rank 2, stopped, held rank 0 for its whole 20 s timeout
    res = run_ranks(_wait_signal_from_two, 3, server, timeout=45, may_die=[2])
    name, took, text = res[0]
    assert name == "PeerFailure" and took < 8 and "rank 2 (pid " in text, res[0]
    assert "wait_signal #1 with peers 1, 2 failed" in text, text


def _group_receive_from_one_that_left(rank, n, addr, third):
    comm = pycoll.init(rank, n, store=pycoll.TCPStore(addr[0], addr[1], TOKEN, timeout=30.0), backend="host",
                       timeout=20.0)
    comm.barrier()
    if rank == 1:  # sends its part, then its process ends without destroying the communicator
        comm.send(np.full(4, 1.0), 0)
        os._exit(0)
    if rank == 2:
        if third == "stopped":
            os.kill(os.getpid(), signal.SIGSTOP)
        time.sleep(2.0)  # past the liveness check's verdict on rank 1 (0.4 s)
        comm.send(np.full(4, 2.0), 0)
        return None
    a, b = np.zeros(4), np.zeros(4)
    t0 = time.monotonic()
    try:
        with comm.group():
            comm.recv(a, 1)
            comm.recv(b, 2)
        out = (a.tolist(), b.tolist(), comm.open_with(1), comm.open_with(2))
    except pycoll.CommFailure as e:
        out = (type(e).__name__, time.monotonic() - t0, str(e))
    comm.abort()
    return out


@pytest.mark.timeout(60)
@pytest.mark.parametrize("third", ["late", "stopped"])
def test_a_group_whose_part_with_a_peer_that_left_is_done_waits_for_the_others(server, third):
    # a group's operations share their completion: rank 0's receive from rank 1, which had sent and whose process
    # had ended, looked outstanding while the group waited for rank 2, and failed with "rank 1 ... is gone (exited);
    # recv #1 with peer 1 failed" -- though it had its data and rank 2 sent a second later
    res = run_ranks(_group_receive_from_one_that_left, 3, server, third, timeout=45, may_die=[1, 2])
    if third == "late":
        assert res[0] == ([1.0] * 4, [2.0] * 4, 0, 0), res[0]
    else:  # the rank that holds the group back is the one named, with the receive that waits for it
        name, took, text = res[0]
        assert name == "PeerFailure" and took < 8 and "rank 2 (pid " in text, res[0]
        assert "recv #2 with peer 2 failed" in text, text


def _stopped_as_the_library_made_it(rank, n, addr, point):
    """Rank 2 stops (``point``'s failpoint) as the library has made its communicator, before its watchdog published
    its process: the others' first all_reduce. Returns (error type, seconds, text)."""
    if rank == 2:  # the host library reads its failpoints from the environment as it makes a communicator
        os.environ["PYCOLL_FAILPOINTS"] = f"{point}=stop"
    comm = pycoll.init(rank, n, store=pycoll.TCPStore(addr[0], addr[1], TOKEN, timeout=30.0), backend="host",
                       timeout=20.0)
    t0 = time.monotonic()
    try:
        comm.all_reduce(np.ones(4))
        out = ("completed", 0.0, "")
    except pycoll.CommFailure as e:
        out = (type(e).__name__, time.monotonic() - t0, str(e))
    comm.abort()
    return out


@pytest.mark.timeout(60)
def test_a_rank_stopped_as_the_library_made_its_communicator_is_found_within_a_second(server):
    # before it had published its process record nobody watched it: its peers' first operation waited its whole
    # timeout (20 s here, 30 s by default) and named no stopped rank; the host library knows its peers' processes
    res = run_ranks(_stopped_as_the_library_made_it, 3, server, "host.init.end", timeout=45, may_die=[2])
    # the first to find it aborts: the other may meet that abort first
    assert all(res[r][0] in ("PeerFailure", "RemoteError") and res[r][1] < 5.0 for r in (0, 1)), res
    assert any(res[r][0] == "PeerFailure" and "rank 2 (pid " in res[r][2] and "stopped" in res[r][2]
               for r in (0, 1)), res


@pytest.mark.timeout(90)
def test_killed_rank_is_found_fast(server):
    res = run_ranks(_loop, 4, server, 30, 1, "kill", 10, 30.0, False, timeout=60, may_die=[1])
    for out in _survivors(res, 1):
        assert out["members"] == (0, 2, 3) and len(out["failures"]) == 1
        assert out["failures"][0][0] - out["fault"] < 1.5, out["failures"]


@pytest.mark.timeout(90)
def test_slow_but_alive_rank_gets_its_whole_timeout(server):
    res = run_ranks(_loop, 4, server, 12, 2, "sleep", 5, 10.0, False, timeout=60)
    for out in res:
        assert out["failures"] == [] and out["members"] == (0, 1, 2, 3) and out["generation"] == 0, out


@pytest.mark.timeout(90)
@pytest.mark.parametrize("period,bound", [("0.2", 4.0), ("1.0", 7.0)])
def test_remote_peer_whose_heartbeat_stops_is_found_before_the_timeout(server, period, bound):
    # with the default period (1 s: heartbeats read once a second, rounds every 0.2 s) the rounds between two reads
    # cleared the suspicion, and a silent peer was never found: the survivors waited out their timeout
    env = {"PYCOLL_WATCHDOG_PUBLISH_INTERVAL": period, "PYCOLL_WATCHDOG_HEARTBEAT_TIMEOUT": "1.0"}
    res = run_ranks(_loop, 4, server, 30, 3, "stop", 10, 30.0, True, timeout=60, may_die=[3], env=env)
    outs = _survivors(res, 3)
    for out in outs:
        assert out["members"] == (0, 1, 2) and len(out["failures"]) == 1, out
        delay = out["failures"][0][0] - out["fault"]
        # silent for max(heartbeat timeout, 3 periods) + one period + a read
        assert delay < bound, f"{delay:.2f} s: {out['failures']}"
    causes = " ".join(" ".join(out["causes"]) for out in outs)
    assert "rank 3 (pid " in causes and "no heartbeat for" in causes, causes


@pytest.mark.timeout(90)
def test_slow_remote_peer_keeps_its_heartbeat(server):
    env = {"PYCOLL_WATCHDOG_PUBLISH_INTERVAL": "0.2", "PYCOLL_WATCHDOG_HEARTBEAT_TIMEOUT": "1.0"}
    res = run_ranks(_loop, 4, server, 12, 1, "sleep", 5, 10.0, True, timeout=60, env=env)
    for out in res:
        assert out["failures"] == [] and out["generation"] == 0, out


@pytest.mark.timeout(90)
def test_liveness_off_leaves_a_stopped_rank_to_the_timeout(server):
    env = {"PYCOLL_WATCHDOG_LIVENESS": "0"}
    res = run_ranks(_loop, 3, server, 20, 2, "stop", 5, 3.0, False, timeout=60, may_die=[2], env=env)
    for out in _survivors(res, 2):
        assert out["failures"][0][0] - out["fault"] >= 2.9, out["failures"]


@pytest.mark.timeout(90)
@pytest.mark.parametrize("spec", ["watchdog.liveness.found=kill",
                                  pytest.param("watchdog.liveness.check=kill@2", marks=pytest.mark.slow)])
def test_watcher_dies_at_the_liveness_check(server, spec):
    """Rank 3 stops; rank 1, the only one watching, dies in its check: the others still go on (without
    a watcher, rank 3's stop costs them their timeout, 3 s here)."""
    res = run_ranks(_loop, 4, server, 30, 3, "stop", 10, 3.0, False, 1, spec, timeout=60, may_die=[1, 3])
    assert isinstance(res[1], Died) and isinstance(res[3], Died)
    for r in (0, 2):
        assert res[r]["members"] == (0, 2) and res[r]["failures"], res[r]


@pytest.mark.timeout(30)
def test_process_state():
    p = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        rec = liveness._stat(p.pid)
        assert rec is not None
        assert liveness.process_state(p.pid, rec[1]) is None
        os.kill(p.pid, signal.SIGSTOP)
        deadline = time.monotonic() + 5
        while liveness.process_state(p.pid, rec[1]) is None and time.monotonic() < deadline:
            time.sleep(0.01)
        assert liveness.process_state(p.pid, rec[1]) == "stopped (SIGSTOP)"
        assert liveness.process_state(p.pid, rec[1] + 1).startswith("gone")  # another process with that pid
        os.kill(p.pid, signal.SIGCONT)
        os.kill(p.pid, signal.SIGKILL)
        while liveness.process_state(p.pid, rec[1]) is None and time.monotonic() < deadline:
            time.sleep(0.01)
        assert liveness.process_state(p.pid, rec[1]) in ("exited (a zombie)", "exited", "gone (exited)")
    finally:
        p.kill()
        p.wait()
    assert liveness.process_state(p.pid, rec[1]) is not None
    me = liveness.this_process(1.0)
    assert me.pid == os.getpid() and me.start > 0 and me.period == 1.0


_SLOW_TEARDOWN = (
    "import mmap, sys, time\n"
    "heap = mmap.mmap(-1, 2 << 30)\n"
    "heap.madvise(mmap.MADV_NOHUGEPAGE)\n"
    "for i in range(0, len(heap), 4096): heap[i] = 1\n"  # 2 GiB of 4 KiB pages, freed one by one at the exit
    "print('ready', flush=True)\n"
    "time.sleep(60)\n"
)


@pytest.mark.timeout(60)
def test_a_dying_process_counts_as_exited_before_it_is_a_zombie():
    """After SIGKILL a process is torn down (here 2 GiB of small pages: about 0.1 s) before it turns
    into a zombie; its main thread is marked exiting at once. Both the watchdog's liveness and the
    elastic layer's take that mark for an exit."""
    from pycoll.elastic import _local_process_gone

    p = subprocess.Popen([sys.executable, "-c", _SLOW_TEARDOWN], stdout=subprocess.PIPE)
    try:
        assert p.stdout is not None and p.stdout.readline().strip() == b"ready"
        rec = liveness._stat(p.pid)
        assert rec is not None and liveness.process_state(p.pid, rec[1]) is None and not _local_process_gone(p.pid)
        fd = os.pidfd_open(p.pid)
        try:
            os.kill(p.pid, signal.SIGKILL)
            seen = []
            deadline = time.monotonic() + 10
            while not select.select([fd], [], [], 0)[0] and time.monotonic() < deadline:
                seen.append((liveness.process_state(p.pid, rec[1]), _local_process_gone(p.pid)))
            assert ("exited", True) in seen, seen[:5]  # while still tearing down: the pidfd is not readable
        finally:
            os.close(fd)
    finally:
        p.kill()
        p.wait()


def test_settings_are_validated():
    wd = watchdog.Watchdog(enabled=False, liveness_interval=0.05, heartbeat_timeout=2.0)
    assert wd.status()["liveness_interval"] == 0.05 and wd.status()["heartbeat_timeout"] == 2.0
    with pytest.raises(ValueError, match="liveness_interval"):
        wd.configure(liveness_interval=0)
    os.environ["PYCOLL_WATCHDOG_HEARTBEAT_TIMEOUT"] = "-1"
    try:
        with pytest.raises(ValueError, match="PYCOLL_WATCHDOG_HEARTBEAT_TIMEOUT"):
            watchdog.Watchdog(enabled=False)
    finally:
        del os.environ["PYCOLL_WATCHDOG_HEARTBEAT_TIMEOUT"]


def test_a_gone_peer_fails_only_work_still_pending_one_round_later(monkeypatch):
    """A peer that exits right after its part of an operation: that operation may still complete
    here; only work pending on two rounds in a row fails."""
    import dataclasses

    from helpers.fakes import FakeComm

    from pycoll.diagnostics.recorder import FlightRecorder
    from pycoll.store import MemoryStore

    lv = liveness
    store = MemoryStore(timeout=1)
    c = FakeComm(FlightRecorder(), 0, 2, store=store)
    peer = dataclasses.replace(lv.this_process(1.0), pid=999_999)  # this host: its process state is read
    store.set(f"{lv.proc_prefix(c.uid)}1", peer.encode())
    monkeypatch.setattr(lv, "process_state", lambda pid, start: "exited")
    live = lv.Liveness(0.2, 5.0, 1.0)
    w1 = c.op("all_reduce", state="started")
    live.round(c, 1.0)
    assert c.failure is None  # first sight: w1 may still complete
    w1._state = "completed"
    c.pending.remove(w1)
    live.round(c, 1.2)
    assert c.failure is None  # it did: nothing fails
    c.op("all_reduce", state="started")
    live.round(c, 1.4)
    assert c.failure is None
    live.round(c, 1.401)  # a round woken early (a new communicator, a configure) is not a round later
    assert c.failure is None
    live.round(c, 1.6)  # the same operation still pending one round later: the peer cannot finish it
    assert isinstance(c.failure, pycoll.PeerFailure) and "rank 1 (pid 999999) is exited" in str(c.failure)


def test_a_store_that_takes_no_writes_is_no_verdict_on_a_remote_peers_silence(monkeypatch):
    """A process stopped holding a FileStore's lock stops every heartbeat, this rank's own too: a remote peer's
    unchanged heartbeat then says nothing of the peer (a slow one keeps its whole timeout)."""
    import dataclasses

    from helpers.fakes import FakeComm

    from pycoll.diagnostics.recorder import FlightRecorder
    from pycoll.diagnostics.records import ProgressRecord, progress_prefix
    from pycoll.store import MemoryStore

    lv = liveness
    monkeypatch.setattr(lv, "_all_remote", True)
    store = MemoryStore(timeout=1)
    c = FakeComm(FlightRecorder(), 0, 2, store=store)
    store.set(f"{lv.proc_prefix(c.uid)}1", dataclasses.replace(lv.this_process(0.2), pid=999_999).encode())

    def beat(rank, n):
        store.set(f"{progress_prefix(c.uid)}{rank}", ProgressRecord(c.progress(), "active", n, n, "x").encode())

    beat(0, 1)
    beat(1, 1)
    live = lv.Liveness(0.2, 1.0, 0.2)
    t0 = c.op("all_reduce", state="started").t0
    for i in range(12):  # neither heartbeat moves for 2.4 s: the store takes no writes
        live.round(c, t0 + 1.0 + 0.2 * i)
    assert c.failure is None
    for i in range(12):  # this rank's own moves again, the peer's does not: the peer is silent
        beat(0, 2 + i)
        live.round(c, t0 + 3.6 + 0.2 * i)
    assert isinstance(c.failure, pycoll.PeerFailure) and "rank 1 (pid 999999" in str(c.failure), c.failure
    assert "silent: no heartbeat for" in str(c.failure)


def test_a_silent_remote_peer_is_found_beside_one_that_left_with_its_part_done(monkeypatch):
    """Ranks 1 and 2 of another host both stop beating while rank 0's group receives from each; the library says the
    receive from rank 1 is done (it sent, then its process ended). The heartbeat read is kept between reads: the
    round found rank 1 first, left it out (its part done), and the cached answer -- rank 1 again -- hid rank 2, which
    the group waited for its whole timeout."""
    import dataclasses

    from helpers.fakes import FakeComm

    from pycoll.diagnostics.recorder import FlightRecorder
    from pycoll.diagnostics.records import ProgressRecord, progress_prefix
    from pycoll.store import MemoryStore

    lv = liveness
    monkeypatch.setattr(lv, "_all_remote", True)
    store = MemoryStore(timeout=1)
    c = FakeComm(FlightRecorder(), 0, 3, store=store)
    for r in (1, 2):
        store.set(f"{lv.proc_prefix(c.uid)}{r}", dataclasses.replace(lv.this_process(0.2), pid=999_990 + r).encode())

    def beat(rank, n):
        store.set(f"{progress_prefix(c.uid)}{rank}", ProgressRecord(c.progress(), "active", n, n, "x").encode())

    for r in range(3):
        beat(r, 1)
    c.open = {1: 0, 2: 1}
    live = lv.Liveness(0.2, 1.0, 0.2)
    t0 = c.op("recv", None, np.zeros(2, np.float32), peer=1, state="started").t0
    c.op("recv", None, np.zeros(2, np.float32), peer=2, state="started")
    for i in range(16):  # this rank beats, ranks 1 and 2 do not
        beat(0, 2 + i)
        live.round(c, t0 + 1.0 + 0.2 * i)
    assert isinstance(c.failure, pycoll.PeerFailure) and "rank 2 (pid 999992" in str(c.failure), c.failure
    assert "recv #2 with peer 2 failed" in str(c.failure), c.failure


def _stopped_peer(monkeypatch, store, c):
    """Rank 1 of ``c`` is a process of this host that its record says is stopped."""
    import dataclasses

    lv = liveness
    store.set(f"{lv.proc_prefix(c.uid)}1", dataclasses.replace(lv.this_process(1.0), pid=999_999).encode())
    monkeypatch.setattr(lv, "process_state", lambda pid, start: "stopped (SIGSTOP)" if pid == 999_999 else None)


@contextlib.contextmanager
def _lock_held(store):
    """A FileStore's lock taken by another thread of this process (as a process stopped inside a write holds it)
    while the block runs."""
    held, done = threading.Event(), threading.Event()

    def hold():
        store._plock.acquire(5, "test")
        held.set()
        done.wait(30)
        store._plock.release()

    holder = threading.Thread(target=hold)
    holder.start()
    try:
        assert held.wait(5)
        yield
    finally:
        done.set()
        holder.join(5)


def test_a_round_leaves_the_record_being_written_by_another_thread_to_it_and_checks_the_peers(monkeypatch):
    """The creating thread and the liveness thread's first round both found this process's record unwritten and both
    wrote it: the round's write came after a peer stopped holding a FileStore's lock file and waited for it for the
    store's timeout, and no peer was checked meanwhile (the stopped root was found at the broadcast's timeout only)."""
    from helpers.fakes import FakeComm

    from pycoll.diagnostics.recorder import FlightRecorder
    from pycoll.store import MemoryStore

    class HeldWrites(MemoryStore):
        def __init__(self):
            super().__init__(timeout=10)
            self.writes, self.go = [], threading.Event()

        def set(self, key, value):
            if key.startswith(liveness.proc_prefix(c.uid)):
                self.writes.append(threading.current_thread().name)
                self.go.wait(5.0)  # the write of this process's record waits for the store (a lock file held)
            super().set(key, value)

    store = HeldWrites()
    c = FakeComm(FlightRecorder(), 0, 2, store=store)
    store.go.set()
    _stopped_peer(monkeypatch, store, c)  # the peer's record is there
    store.writes.clear()
    store.go.clear()
    live = liveness.Liveness(0.2, 5.0, 1.0)
    creating = threading.Thread(target=live.announce, args=(c,), name="creating")
    creating.start()
    while not store.writes:
        time.sleep(0.001)
    c.op("broadcast", state="started", root=1)
    t0 = time.monotonic()
    live.round(c, 1.0)
    live.round(c, 1.2)
    took = time.monotonic() - t0
    assert took < 1.0 and store.writes == ["creating"], (took, store.writes)
    assert isinstance(c.failure, pycoll.PeerFailure) and "rank 1 (pid 999999) is stopped" in str(c.failure)
    store.go.set()
    creating.join(5.0)
    assert live.announce(c) is not None and store.writes == ["creating"]  # written once
    assert store.check([f"{liveness.proc_prefix(c.uid)}0"])


def test_a_rounds_retry_of_the_records_write_gives_up_within_a_second_and_checks_the_peers(monkeypatch, tmp_path):
    """Where the creating thread could not write this process's record, the liveness thread's rounds write it: a
    write of theirs waits for a FileStore's lock file (held by a stopped peer) a second at most, not the store's
    timeout, and the round goes on to its checks."""

    from helpers.fakes import FakeComm

    from pycoll.diagnostics.recorder import FlightRecorder

    store = pycoll.FileStore(str(tmp_path / "store"), timeout=30)
    c = FakeComm(FlightRecorder(), 0, 2, store=store)
    _stopped_peer(monkeypatch, store, c)
    with _lock_held(store):  # as a peer stopped inside a write holds it
        live = liveness.Liveness(0.2, 5.0, 1.0)
        c.op("broadcast", state="started", root=1)
        t0 = time.monotonic()
        live.round(c, 1.0)
        live.round(c, 1.2)
        took = time.monotonic() - t0
        assert isinstance(c.failure, pycoll.PeerFailure) and "rank 1 (pid 999999) is stopped" in str(c.failure)
        assert took < 4.0, took  # two writes of a second at most each
        assert not store.check([f"{liveness.proc_prefix(c.uid)}0"])
    live.round(c, 1.4)  # the lock free again: written
    assert store.check([f"{liveness.proc_prefix(c.uid)}0"])
    store.close()


def _stop_after_grow(rank, n, addr, spec, victim):
    """Slots 0-2 form and admit slot 3; ``spec`` stops one of them (a member or the joiner) as soon as the
    grown communicator is built. The others' next collective (the grow's own barrier, or the first
    all_reduce) must fail within about a second (T = 30 s): (error type, seconds in the failing call, text)."""
    failpoints.configure(spec, rank=rank)
    store = pycoll.TCPStore(addr[0], addr[1], TOKEN, timeout=30.0)
    if rank == n - 1:
        while not store.check(["lv-test/go-join"]):
            time.sleep(0.01)
        try:
            group = ElasticGroup(store, rank, joiner=True, backend="host", timeout=30.0, name="lvg", join_timeout=3.0)
        except (pycoll.CommFailure, pycoll.StoreTimeout) as exc:  # a member stopped: nobody admits it again
            store.set(f"lv-test/done/{rank}", b"1")
            return ("not joined", type(exc).__name__)
        grown = True
    else:
        group = ElasticGroup(store, rank, n - 1, backend="host", timeout=30.0, name="lvg")
        store.set("lv-test/go-join", b"1")
        grown = False
    deadline = time.monotonic() + 20
    t0 = time.monotonic()
    try:
        while not grown:
            assert time.monotonic() < deadline
            t0 = time.monotonic()
            grown = group.maybe_grow()
            time.sleep(0.02)
        t0 = time.monotonic()
        x = np.ones(4)
        group.comm.all_reduce(x)
        out = ("completed", x.tolist())
    except pycoll.CommFailure as exc:
        out = (type(exc).__name__, time.monotonic() - t0, str(exc))
    # the survivors leave together: one that left early would be a second failure for the others to find
    store.set(f"lv-test/done/{rank}", b"1")
    store.wait([f"lv-test/done/{r}" for r in range(n) if r != victim], timeout=30.0)
    group.comm.abort()
    return out


@pytest.mark.timeout(90)
@pytest.mark.parametrize("spec,victim", [("elastic.grow.after_comm=stop;rank=1", 1),
                                         ("elastic.join.after_comm=stop;rank=3", 3)])
def test_a_rank_stopped_right_after_a_grow_is_found_within_a_second(server, spec, victim):
    """The stopped rank had no time to publish its process for the new communicator from its watchdog's
    thread: its peers must still know it (published as the communicator was made), and the grow must not
    wait for it while it releases the old communicator."""
    res = run_ranks(_stop_after_grow, 4, server, spec, victim, timeout=60, may_die=[victim])
    assert isinstance(res[victim], Died), res[victim]
    if victim != 3:  # the joiner's grow failed with the others': it asked again, and nobody admitted it
        assert res[3] == ("not joined", "StoreTimeout"), res[3]
    survivors = [res[r] for r in range(4) if r != victim and not (r == 3 and victim != 3)]
    for out in survivors:  # each failed fast: its own liveness check, another's reshape flag (its watcher), or the
        # revoke of a peer that revoked first (a RemoteError naming it)
        assert out[0] in ("PeerFailure", "CommRevoked", "RemoteError") and out[1] < 2.0, (victim, res)
        if out[0] == "RemoteError":
            assert "revoked the communicator" in out[2], (victim, res)
    found = [out for out in survivors if out[0] == "PeerFailure"]
    assert found, res  # and the first to fail named the stopped rank
    for out in found:
        assert f"rank {victim} (pid " in out[2] and "is stopped (SIGSTOP)" in out[2], (victim, res)


def _stopped_peer_at_teardown(rank, n, addr, what, spec=""):
    """Rank 2 stops once every rank completed one all_reduce; the others then make a collective call that is no
    operation (a finalize through destroy, a shrink without rank 3, which leaves), whose 30 s timeout
    must not be waited out: returns (seconds it took, the exception's type, text and rank)."""
    failpoints.configure(spec, rank=rank)
    store = pycoll.TCPStore(addr[0], addr[1], TOKEN, timeout=30.0)
    comm = pycoll.init(rank, n, backend="host", store=store, timeout=30.0, name="teardown")
    comm.all_reduce(np.ones(4))
    comm.barrier()
    if rank == 2:
        os.kill(os.getpid(), signal.SIGSTOP)
    if rank == 3 and what == "shrink":
        return None  # excluded: it leaves (gone, as the shrink's excluded ranks may be)
    time.sleep(0.3)  # rank 2 is stopped by now
    t0 = time.monotonic()
    try:
        if what == "destroy":
            comm.destroy()
        else:
            comm.shrink([3])
    except pycoll.CommFailure as exc:
        out = time.monotonic() - t0, type(exc).__name__, str(exc), getattr(exc, "rank", None)
    else:
        out = time.monotonic() - t0, None, "", None
    comm.abort()
    # stay until every rank that made the call has ended it: a rank that left would be found gone by the others
    store.set(f"teardown-{what}/{rank}", b"")
    gone = {2, 3} if what == "shrink" else {2}
    if spec:
        gone.add(0)  # killed at the failpoint
    store.wait([f"teardown-{what}/{r}" for r in range(n) if r not in gone])
    return out


@pytest.mark.timeout(120)
@pytest.mark.parametrize("what", ["destroy", "shrink"])
def test_a_peer_stopped_during_a_collective_call_that_is_no_operation_is_found_within_a_second(server, what):
    # no Work is outstanding in a finalize, shrink or grow (a split on the host backend exchanges the members'
    # ranks in an all_gather first, which the rounds watch): the waiting thread asks the watchdog's liveness
    res = run_ranks(_stopped_peer_at_teardown, 4, server, what, timeout=90,
                    may_die=[2, 3] if what == "shrink" else [2])  # rank 3 is waited for where it is read
    for r in (0, 1) if what == "shrink" else (0, 1, 3):
        took, kind, text, rank = res[r]
        assert kind == "PeerFailure" and rank == 2, res[r]
        assert "rank 2 (pid" in text and "is stopped (SIGSTOP)" in text and "given up after" in text, text
        assert took < 10.0, res[r]  # the timeout is 30 s
        if what == "destroy":  # the timeout given, not what was left of it after the drain (29.9997 s)
            assert "of its 30 s timeout" in text, text


@pytest.mark.timeout(120)
def test_a_rank_killed_as_it_gives_up_leaves_the_others_to_give_up_too(server):
    # rank 0 dies at the give-up (before its abort): ranks 1 and 3 still end their destroy within a second, on
    # rank 2 stopped or on rank 0 gone, whichever they see first
    res = run_ranks(_stopped_peer_at_teardown, 4, server, "destroy", "comm.poll.give_up=kill;rank=0", timeout=90,
                    may_die=[0, 2])
    assert isinstance(res[0], Died)
    for r in (1, 3):
        took, kind, text, rank = res[r]
        assert kind == "PeerFailure" and rank in (0, 2) and took < 10.0, res[r]


@pytest.mark.timeout(60)
def test_a_new_communicators_records_wait_for_a_held_file_store_a_few_seconds_only(tmp_path, monkeypatch):
    """A peer stopped while it held the FileStore's lock file right after the init: the creating thread's two writes
    (this process, its progress) each waited the store's whole timeout, and pycoll.init() returned after twice that
    (40 s with a 20 s store); they give up by watchdog._CREATED_WRITES_S now, the threads' rounds write them later."""

    from helpers.fakes import FakeComm

    from pycoll.diagnostics.recorder import FlightRecorder

    monkeypatch.setattr(watchdog, "_CREATED_WRITES_S", 1.0)
    store = pycoll.FileStore(str(tmp_path / "store"), timeout=30)
    wd = watchdog.Watchdog(FlightRecorder(4), communicators=list)
    try:
        with _lock_held(store):
            c = FakeComm(wd.recorder, 0, 2, store=store)
            t0 = time.monotonic()
            wd.comm_created(c)
            took = time.monotonic() - t0
        assert took < 4.0, took  # the bound (a request takes at least 1 s)
    finally:
        wd.stop()
        store.close()
