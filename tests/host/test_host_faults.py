"""Lifecycle and failure semantics of the host library, with real processes and real signals.

Nonblocking init, abort and revoke of operations stuck behind a stopped peer, a killed peer (also
as an unreaped zombie), peers that abort, shrink/split/grow, finalize, and misuse that must end
in an error rather than a hang.
"""

from __future__ import annotations

import contextlib
import mmap
import os
import select
import signal
import threading
import time

import numpy as np
import pytest
from helpers.host_util import init, kill_when_done, lib, ptr, uid, wait_ready, wait_until
from helpers.mp import Died, run_ranks, shm_prefix

from pycoll import errors
from pycoll._bindings import SHRINK_ABORT, Config, DataType, RedOp, UniqueId

F32 = int(DataType.Float32)
SUM = int(RedOp.Sum)


def _allreduce(l, comm, n_expected=None, count=1024, value=1.0, stream=0):
    a = np.full(count, value, np.float32)
    b = np.empty_like(a)
    l.all_reduce(ptr(a), ptr(b), count, F32, SUM, comm, stream)
    if n_expected is not None and stream == 0:
        assert b[0] == n_expected * value and b[-1] == n_expected * value, (b[0], n_expected)
    return b


def _stop_self_after_init(l, comm, n):
    _allreduce(l, comm, n)
    os.kill(os.getpid(), signal.SIGSTOP)
    time.sleep(60)


# ---- nonblocking init -------------------------------------------------------------------------


def _nonblocking_init(rank, n, idb):
    l = lib()
    comm, status = l.comm_init_rank_config(n, UniqueId(idb), rank, Config(blocking=0))
    assert comm != 0 and status in (0, 7)
    seen = [l.comm_get_async_error(comm)]
    state = wait_ready(comm)
    assert state == 0
    _allreduce(l, comm, n)
    assert l.comm_count(comm) == n and l.comm_user_rank(comm) == rank
    l.comm_destroy(comm)
    return seen[0]


@pytest.mark.timeout(60)
def test_nonblocking_init_completes_through_async_error():
    states = run_ranks(_nonblocking_init, 3, uid(), timeout=30)
    assert set(states) <= {0, 7}
    assert 7 in states  # at least the first rank to arrive waited in the background

def _wait_ready(rank, n, idb, mark):
    l = lib()
    if rank == 1:
        # rank 0's init cannot end before rank 1 comes: only once rank 0 has begun it (its process may
        # start late on a loaded machine), and 0.3 s later
        deadline = time.monotonic() + 20.0
        while not os.path.exists(mark) and time.monotonic() < deadline:
            time.sleep(0.01)
        time.sleep(0.3)
    comm, status = l.comm_init_rank_config(n, UniqueId(idb), rank, Config(blocking=0))
    assert comm != 0 and status in (0, 7)
    if rank == 0:
        open(mark, "w").close()
    t0 = time.monotonic()
    early = l.comm_wait_ready(comm, 0.05) if rank == 0 else None
    t_early = time.monotonic() - t0
    done = l.comm_wait_ready(comm, 20.0)
    state = l.comm_get_async_error(comm)
    _allreduce(l, comm, n)
    l.comm_destroy(comm)
    return early, t_early, done, state


@pytest.mark.timeout(60)
def test_wait_ready_returns_as_the_nonblocking_init_ends(tmp_path):
    """pycollCommWaitReady (what pycoll's poll of a nonblocking init/shrink waits with on the host
    library): False after its timeout while the init is still in progress, True once it has ended."""
    (early, t_early, done0, st0), (_, _, done1, st1) = run_ranks(_wait_ready, 2, uid(), str(tmp_path / "rank0-init"),
                                                                 timeout=30)
    assert early is False and 0.04 < t_early < 0.25, (early, t_early)
    assert done0 and done1 and st0 == st1 == 0
    l = lib()
    with pytest.raises(ValueError, match="timeout"):
        l.comm_wait_ready(1, -1.0)
    with pytest.raises(errors.InvalidArgument):
        l.comm_wait_ready(12345, 0.0)  # not a communicator


def test_peer_open_counts_a_ranks_sends_and_receives_with_a_peer_until_each_is_done():
    """pycollCommPeerOpen: the sends and receives with a peer enqueued (an open group's too) and not done; 0 as soon
    as they are, also while the group's other operations are still open (what the liveness check asks before it
    takes a peer that left for a failure); pycollCommPeerProcess: the peer's process; a bad peer or communicator is
    refused."""
    l = lib()
    comm = init(1, 0, uid())
    a, b = np.arange(4, dtype=np.float32), np.zeros(4, np.float32)
    assert l.comm_peer_open(comm, 0) == 0
    l.group_start()
    l.send(ptr(a), 4, F32, 0, comm)
    l.recv(ptr(b), 4, F32, 0, comm)
    assert l.comm_peer_open(comm, 0) == 2  # enqueued in the open group
    l.group_end()
    assert l.comm_peer_open(comm, 0) == 0 and b.tolist() == a.tolist()
    with pytest.raises(errors.InvalidArgument):
        l.comm_peer_open(comm, 1)  # not a rank of it
    with pytest.raises(errors.InvalidArgument):
        l.comm_peer_open(comm, -1)
    pid, start, pidns = l.comm_peer_process(comm, 0)  # what the liveness check watches a silent peer by
    assert pid == os.getpid() and start > 0 and pidns == os.stat("/proc/self/ns/pid").st_ino
    with pytest.raises(errors.InvalidArgument):
        l.comm_peer_process(comm, 1)
    l.comm_destroy(comm)
    with pytest.raises(errors.InvalidArgument):
        l.comm_peer_open(comm, 0)  # destroyed
    with pytest.raises(errors.InvalidArgument):
        l.comm_peer_process(comm, 0)


def test_events_clean_says_whether_the_operation_between_two_events_completed_without_failing():
    """pycollCommEventsClean: both events complete and the communicator healthy: clean; an event not complete yet:
    not; a bad event or communicator is refused (the failed case: tests/runtime, two ranks with a mismatch)."""
    l = lib()
    comm = init(1, 0, uid())
    s = l.host_stream_create()
    start, end, never = l.host_event_create(), l.host_event_create(), l.host_event_create()
    try:
        a, b = np.arange(4, dtype=np.float32), np.zeros(4, np.float32)
        l.host_event_record(start, s)
        l.all_reduce(ptr(a), ptr(b), 4, F32, SUM, comm, s)
        l.host_event_record(end, s)
        l.host_stream_synchronize(s)
        assert l.comm_events_clean(comm, start, end) is True and b.tolist() == a.tolist()
        l.host_event_arm(never)  # incomplete until fired
        assert l.comm_events_clean(comm, start, never) is False
        l.host_event_fire(never)
        assert l.comm_events_clean(comm, start, never) is True
        with pytest.raises(errors.InvalidArgument):
            l.comm_events_clean(comm, start, 12345)  # not an event
    finally:
        for e in (start, end, never):
            l.host_event_destroy(e)
        l.host_stream_destroy(s)
        l.comm_destroy(comm)
    with pytest.raises(errors.InvalidArgument):
        l.comm_events_clean(comm, start, end)  # destroyed


def _env_nonblocking(rank, n, idb):
    l = lib()
    comm, status = l.comm_init_rank_config(n, UniqueId(idb), rank, None)
    state = wait_ready(comm)
    assert state == 0, (state, l.get_last_error(comm))
    l.comm_destroy(comm)
    return status, True


@pytest.mark.timeout(60)
def test_comm_blocking_env_overrides_config():
    out = run_ranks(_env_nonblocking, 2, uid(), timeout=30, env={"NCCL_COMM_BLOCKING": "0"})
    assert all(ok for _, ok in out) and any(st == 7 for st, _ in out)


# ---- abort / revoke of an operation stuck behind a stopped peer --------------------------------


def _stuck_then(rank, n, idb, action, use_stream):
    l = lib()
    comm = init(n, rank, idb)
    if rank == n - 1:
        _stop_self_after_init(l, comm, n)
    _allreduce(l, comm, n)  # everyone initialised; the last rank now stops itself
    time.sleep(0.05)
    box = {}

    def watchdog():
        time.sleep(0.3)
        box["t"] = time.monotonic()
        box["r"] = l.comm_abort(comm) if action == "abort" else l.comm_revoke(comm)

    th = threading.Thread(target=watchdog)
    th.start()
    t0 = time.monotonic()
    if use_stream:
        stream = l.host_stream_create()
        ev = l.host_event_create()
        a = np.ones(4096, np.float32)
        b = np.empty_like(a)
        l.all_reduce(ptr(a), ptr(b), a.size, F32, SUM, comm, stream)
        l.host_event_record(ev, stream)
        assert not l.host_event_query(ev)
        l.host_event_synchronize(ev)  # completes once the op was stopped
        err = None
    else:
        try:
            _allreduce(l, comm)
            err = None
        except errors.NCCLError as exc:
            err = exc
    t_ret = time.monotonic()
    th.join()
    latency = t_ret - box["t"]
    assert t_ret - t0 >= 0.25, "the operation must have waited for the stopped peer"
    if not use_stream:  # its own abort or revoke, or the other waiting rank's where that came first
        done = "aborted" if action == "abort" else "revoked"
        assert (isinstance(err, errors.InvalidUsage) and done in err.last_error) or (
            isinstance(err, errors.RemoteError) and f"rank {1 - rank} {done} the communicator" in err.last_error), err
    if use_stream:
        l.host_stream_synchronize(stream)
        l.host_event_destroy(ev)
        l.host_stream_destroy(stream)
    if action == "abort":
        with pytest.raises(errors.InvalidArgument):  # the handle is gone
            l.comm_count(comm)
    else:
        with pytest.raises(errors.InvalidUsage):
            _allreduce(l, comm)
        with pytest.raises(errors.InvalidArgument):
            l.comm_revoke(comm)  # second revoke
        with pytest.raises(errors.InvalidUsage):
            l.comm_finalize(comm)
        l.comm_destroy(comm)
    return latency


@pytest.mark.timeout(60)
@pytest.mark.parametrize("action", ["abort", "revoke"])
@pytest.mark.parametrize("use_stream", [False, True], ids=["null-stream", "host-stream"])
def test_stopped_peer_unblocked_from_another_thread(action, use_stream):
    out = run_ranks(_stuck_then, 3, uid(), action, use_stream, timeout=30, may_die=[2], on_start=kill_when_done([2]))
    assert isinstance(out[2], Died)
    for latency in out[:2]:
        assert latency < 1.0, f"op returned {latency * 1e3:.0f} ms after {action} (must be well under 100 ms unloaded)"


# ---- a killed peer ----------------------------------------------------------------------------


def _kill_mid_allreduce_then_shrink(rank, n, idb):
    l = lib()
    comm = init(n, rank, idb)
    victim = n - 1
    count = 256 * 1024  # two-phase algorithm: the victim dies between steps
    i = 0
    t_fail = None
    while True:
        if rank == victim and i == 20:
            os.kill(os.getpid(), signal.SIGKILL)
        t0 = time.monotonic()
        try:
            _allreduce(l, comm, n, count=count)
        except errors.RemoteError as exc:
            t_fail = time.monotonic() - t0
            assert str(victim) in exc.last_error
            break
        i += 1
    assert l.comm_get_async_error(comm) == int(errors.RemoteError.code)
    with pytest.raises(errors.RemoteError):  # the error is sticky
        _allreduce(l, comm)
    exclude = [victim]
    slot, status = l.comm_shrink(comm, exclude, None, SHRINK_ABORT)
    assert status == 0 and exclude == [victim]
    small = slot.value
    assert l.comm_count(small) == n - 1 and l.comm_user_rank(small) == rank
    _allreduce(l, small, n - 1, count=count)
    _allreduce(l, small, n - 1, count=3)
    l.comm_destroy(small)
    l.comm_abort(comm)
    return t_fail


@pytest.mark.timeout(60)
def test_sigkill_mid_allreduce_then_shrink_with_abort():
    out = run_ranks(_kill_mid_allreduce_then_shrink, 4, uid(), timeout=40, may_die=[3])
    assert isinstance(out[3], Died)
    assert all(t < 1.0 for t in out[:3]), out  # detection itself takes < 100 ms unloaded


def _a_peer_killed_meanwhile(rank, n, idb, victim, kill_after, late, late_by, match):
    """Everyone initialised, rank ``victim`` is SIGKILLed ``kill_after`` seconds in and rank ``late`` (None: none)
    comes ``late_by`` seconds late: how long this rank's next allreduce takes to fail with a RemoteError (its text
    matching ``match``)."""
    l = lib()
    comm = init(n, rank, idb)
    _allreduce(l, comm, n)
    if rank == victim:
        time.sleep(kill_after)
        os.kill(os.getpid(), signal.SIGKILL)
    if rank == late:
        time.sleep(late_by)
    t0 = time.monotonic()
    with pytest.raises(errors.RemoteError, match=match):
        _allreduce(l, comm)
    took = time.monotonic() - t0
    l.comm_abort(comm)
    return took


@pytest.mark.timeout(60)
def test_the_exit_watcher_wakes_a_waiter_as_its_peer_exits():
    """Rank 1 waits in an allreduce that rank 0 never joins; rank 0 is SIGKILLed half a second later. With
    the waiters' own looks at their peers 10 s apart, only the exit watcher (a thread asleep on the peers'
    pidfds) can end the wait soon: it marks the peer gone and rings the communicator's doorbell."""
    # rank 1 is asleep in its wait by the time rank 0 dies
    out = run_ranks(_a_peer_killed_meanwhile, 2, uid(), 0, 0.5, None, 0.0, None, timeout=40, may_die=[0],
                    env={"PYCOLL_HOST_PEER_CHECK_NS": "10000000000"})
    assert isinstance(out[0], Died)
    assert 0.4 < out[1] < 3.0, out  # rank 0's half second, then its exit: not the 10 s between looks


@pytest.mark.timeout(60)
def test_a_collective_fails_as_any_rank_it_waits_for_dies_not_only_the_first():
    """Rank 1 waits for the arrivals of ranks 0 (alive, 2 s late) and 2 (SIGKILLed 0.3 s in): it fails as rank 2
    dies, not when rank 0 comes (the collective can never complete without rank 2)."""
    # rank 0 alive and late: rank 1 first waits for that one
    out = run_ranks(_a_peer_killed_meanwhile, 3, uid(), 2, 0.3, 0, 2.0, "rank 2 .* exited", timeout=40, may_die=[2])
    assert isinstance(out[2], Died)
    assert 0.2 < out[1] < 1.2, out
    assert out[0] < 1.0, out  # it finds rank 2 gone at once when it comes


def _pidfd_readable(pid):
    try:
        fd = os.pidfd_open(pid)
    except ProcessLookupError:
        return True
    try:
        return bool(select.select([fd], [], [], 0)[0])
    finally:
        os.close(fd)


def _killed_with_a_slow_teardown(rank, n, idb, pidfile, churn):
    l = lib()
    comm = init(n, rank, idb)
    if rank == 0 and churn:
        # communicators made after this one (the kernel walks the robust list from the newest) and
        # destroyed from its head, middle and tail: a node left behind in an unmapped segment would stop
        # the walk before it reaches this communicator's life word
        alone = [init(1, 0, uid()) for _ in range(12)]
        for i in (11, 5, 0, 7, 3, 9):
            l.comm_destroy(alone[i])
    if rank == 0:
        heap = mmap.mmap(-1, 2 << 30)
        heap.madvise(mmap.MADV_NOHUGEPAGE)
        np.frombuffer(heap, np.uint8)[::4096] = 1  # 2 GiB of 4 KiB pages, freed one by one at the exit
        with open(pidfile, "w") as f:
            f.write(str(os.getpid()))
    _allreduce(l, comm, n)
    if rank == 0:
        time.sleep(0.3)  # rank 1 is asleep in its wait by then
        os.kill(os.getpid(), signal.SIGKILL)
    with open(pidfile) as f:
        victim = int(f.read())
    with pytest.raises(errors.RemoteError) as ei:
        _allreduce(l, comm)
    torn_down = _pidfd_readable(victim)  # first thing after the failure
    policies = {}  # the scheduling policy of each thread of the dying process still there
    for tid in os.listdir(f"/proc/{victim}/task") if os.path.isdir(f"/proc/{victim}/task") else ():
        with contextlib.suppress(OSError):
            policies[int(tid)] = os.sched_getscheduler(int(tid))
    l.comm_abort(comm)
    return torn_down, ei.value.last_error, policies


@pytest.mark.timeout(90)
@pytest.mark.parametrize("churn,idle", [
    pytest.param(False, True, id="one-comm"),
    pytest.param(True, True, id="after-12-comms", marks=pytest.mark.slow),
    pytest.param(False, False, id="teardown-not-idled", marks=pytest.mark.slow)])
def test_a_killed_peer_is_found_before_the_kernel_has_torn_it_down(tmp_path, churn, idle):
    """A killed process turns into a zombie (its pidfd readable) only after the kernel has freed its
    memory: about 0.1 s for 2 GiB of small pages here, milliseconds for any process with torch loaded.
    Its life word (a robust futex of its exit watcher thread) is marked before that, and the peer asleep
    in an allreduce wakes on it, with the periodic looks at the peers 10 s apart: when its allreduce has
    failed, the dead peer's pidfd is not readable yet. Also when the dead process had made and destroyed
    other communicators before (its robust list changed under it).

    The survivor has put the dying process's threads on SCHED_IDLE (its teardown then runs on idle
    CPU, not the survivors' recovery), unless PYCOLL_HOST_IDLE_DEAD=0."""
    env = {"PYCOLL_HOST_PEER_CHECK_NS": "10000000000"}
    if not idle:
        env["PYCOLL_HOST_IDLE_DEAD"] = "0"
    out = run_ranks(_killed_with_a_slow_teardown, 2, uid(), str(tmp_path / "pid"), churn, timeout=60, may_die=[0],
                    env=env)
    assert isinstance(out[0], Died)
    torn_down, text, policies = out[1]
    assert "rank 0" in text and "exited" in text, text
    assert not torn_down
    assert policies, "the dying process had no thread left when the survivor looked"
    want = os.SCHED_IDLE if idle else os.SCHED_OTHER
    assert set(policies.values()) == {want}, policies


def _zombie_peer(rank, n, idb):
    """Rank 0 forks rank 1 itself and never reaps it before the check: a killed rank 1 stays a
    zombie, which kill(pid, 0) cannot tell from a live process."""
    l = lib()
    pid = os.fork()
    if pid == 0:
        try:
            c = init(2, 1, idb)
            _allreduce(l, c, 2)
            os.kill(os.getpid(), signal.SIGKILL)
        finally:
            os._exit(1)
    comm = init(2, 0, idb)
    _allreduce(l, comm, 2)
    wait_until(lambda: open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()[0] == "Z", 10, "zombie")
    t0 = time.monotonic()
    with pytest.raises(errors.RemoteError):
        _allreduce(l, comm)
    took = time.monotonic() - t0
    os.waitpid(pid, 0)
    l.comm_abort(comm)
    return took


@pytest.mark.timeout(60)
def test_zombie_peer_is_noticed():
    (took,) = run_ranks(_zombie_peer, 1, uid(), timeout=30)
    assert took < 1.0


def _peer_aborts(rank, n, idb):
    l = lib()
    comm = init(n, rank, idb)
    _allreduce(l, comm, n)
    if rank == 1:
        time.sleep(0.2)
        l.comm_abort(comm)
        return None
    with pytest.raises(errors.RemoteError) as ei:
        _allreduce(l, comm)
    assert "aborted" in ei.value.last_error
    l.comm_abort(comm)
    return ei.value.last_error


@pytest.mark.timeout(60)
def test_peer_that_aborts_surfaces_as_remote_error():
    run_ranks(_peer_aborts, 2, uid(), timeout=30)


def _peer_aborts_while_another_is_late(rank, n, idb, count):
    l = lib()
    comm = init(n, rank, idb)
    _allreduce(l, comm, n, count=count)
    if rank == 0:  # arrives, then aborts inside the operation (Ctrl-C there)
        threading.Timer(0.3, lambda: l.comm_abort(comm)).start()
        with pytest.raises(errors.NCCLError):
            _allreduce(l, comm, count=count)
        return None
    if rank == 1:
        time.sleep(3.0)  # late
    t0 = time.monotonic()
    with pytest.raises(errors.RemoteError) as ei:
        _allreduce(l, comm, count=count)
    waited = time.monotonic() - t0
    l.comm_abort(comm)
    return waited, ei.value.last_error


@pytest.mark.timeout(60)
@pytest.mark.parametrize("count", [4, 1 << 16])
def test_a_peer_that_aborts_inside_an_operation_fails_the_ranks_waiting_for_another(count):
    # rank 2 waited for the late rank 1, and learned of rank 0's abort only once rank 1 arrived: never, where rank 1
    # did not (its own call failed at once, seeing the abort), so rank 2 waited out its timeout
    res = run_ranks(_peer_aborts_while_another_is_late, 3, uid(), count, timeout=30)
    waited, text = res[2]
    assert waited < 2.0 and "rank 0 aborted the communicator" in text, res[2]
    assert "rank 0 aborted the communicator" in res[1][1], res[1]


# ---- reshape ------------------------------------------------------------------------------------


def _split(rank, n, idb):
    l = lib()
    comm = init(n, rank, idb)
    color = -1 if rank == 4 else rank % 2
    slot, status = l.comm_split(comm, color, -rank)  # key -rank: reversed order
    assert status == 0
    if color < 0:
        assert slot.value == 0
        l.comm_destroy(comm)
        return None
    sub = slot.value
    members = [r for r in range(n) if r % 2 == color and r != 4]
    assert l.comm_count(sub) == len(members)
    assert l.comm_user_rank(sub) == sorted(members, reverse=True).index(rank)
    b = _allreduce(l, sub, None, value=float(rank + 1))
    assert b[0] == sum(r + 1 for r in members)
    l.comm_destroy(sub)
    l.comm_destroy(comm)
    return True


@pytest.mark.timeout(60)
def test_split_by_color():
    run_ranks(_split, 5, uid(), timeout=30)


def _revoke_then_shrink(rank, n, idb):
    l = lib()
    comm = init(n, rank, idb)
    if rank == n - 1:
        _stop_self_after_init(l, comm, n)
    _allreduce(l, comm, n)
    threading.Timer(0.2, lambda: l.comm_revoke(comm)).start()
    with pytest.raises(errors.InvalidUsage):
        _allreduce(l, comm)
    assert wait_ready(comm) == 0  # the revoke completes (IN_PROGRESS until every op stopped)
    slot, status = l.comm_shrink(comm, [n - 1])
    small = slot.value
    _allreduce(l, small, n - 1)
    l.comm_destroy(small)
    l.comm_destroy(comm)


@pytest.mark.timeout(60)
def test_revoke_then_shrink():
    run_ranks(_revoke_then_shrink, 3, uid(), timeout=30, may_die=[2], on_start=kill_when_done([2]))


def _grow(rank, n, idb, id_path, blocking):
    l = lib()
    cfg = None if blocking else Config(blocking=0)
    if rank < 3:
        comm = init(3, rank, idb, cfg)
        _allreduce(l, comm, 3)
        grow_id = None
        if rank == 0:
            grow_id = l.comm_get_unique_id(comm)
            with pytest.raises(errors.InvalidUsage):  # one id at a time
                l.comm_get_unique_id(comm)
            tmp = id_path + ".tmp"
            with open(tmp, "wb") as f:
                f.write(bytes(grow_id))
            os.rename(tmp, id_path)
        slot, status = l.comm_grow(comm, 4, grow_id, -1)
        assert status == (0 if blocking else 7)
    else:
        wait_until(lambda: os.path.exists(id_path), 20, "grow id")
        with open(id_path, "rb") as f:
            grow_id = UniqueId(f.read())
        with pytest.raises(errors.InvalidArgument):
            l.comm_grow(None, 4, grow_id, 1)  # collides with an existing rank
        slot, status = l.comm_grow(None, 4, grow_id, 3, cfg)
        comm = None
    big = slot.value
    assert big, "grow sets *newcomm at once"
    if not blocking:
        assert wait_ready(big) == 0
    assert big and l.comm_count(big) == 4 and l.comm_user_rank(big) == rank
    b = _allreduce(l, big, None, value=float(rank + 1))
    assert b[0] == 10.0
    if rank == 0:
        with pytest.raises(errors.InvalidArgument):  # each grow id is usable once
            l.comm_grow(comm, 4, grow_id, -1)
    l.comm_destroy(big)
    if comm:
        l.comm_destroy(comm)


@pytest.mark.timeout(60)
@pytest.mark.parametrize("blocking", [True, False])
def test_grow_from_three_to_four_with_a_fresh_process(tmp_path, blocking):
    run_ranks(_grow, 4, uid(), str(tmp_path / "grow.id"), blocking, timeout=40)


def _shrink_misuse(rank, n, idb):
    l = lib()
    comm = init(n, rank, idb)
    lst = [3, 2]  # unsorted: NCCL sorts the caller's list in place, the host library must not
    if rank == 3:
        l.comm_destroy(comm)
        return
    if rank == 2:
        with pytest.raises(errors.InvalidArgument) as ei:
            l.comm_shrink(comm, lst)  # an excluded rank calling shrink
        assert "exclude list" in ei.value.last_error
        l.comm_destroy(comm)
        return
    slot, _ = l.comm_shrink(comm, lst)
    assert lst == [3, 2]
    assert l.comm_count(slot.value) == 2
    _allreduce(l, slot.value, 2)
    l.comm_destroy(slot.value)
    l.comm_destroy(comm)


@pytest.mark.timeout(60)
def test_shrink_argument_checks():
    run_ranks(_shrink_misuse, 4, uid(), timeout=30)


def _death_during_shrink(rank, n, idb):
    l = lib()
    comm = init(n, rank, idb)
    _allreduce(l, comm, n)
    if rank == 2:
        time.sleep(0.2)
        os.kill(os.getpid(), signal.SIGKILL)
    if rank == 3:  # excluded: leaves
        l.comm_abort(comm)
        return 0.0
    t0 = time.monotonic()
    with pytest.raises(errors.RemoteError):  # rank 2 never joins the shrink: it died
        l.comm_shrink(comm, [3])
    took = time.monotonic() - t0
    l.comm_abort(comm)
    return took


@pytest.mark.timeout(60)
def test_rank_dying_during_shrink_is_an_error():
    out = run_ranks(_death_during_shrink, 4, uid(), timeout=30, may_die=[2])
    assert all(t < 2.0 for t in out[:2])


def _nonblocking_reshape(rank, n, idb):
    l = lib()
    comm = init(n, rank, idb, Config(blocking=0))
    slot, status = l.comm_split(comm, 0, rank)
    assert status in (0, 7)
    assert wait_ready(comm) == 0
    sub = slot.value
    assert sub
    _allreduce(l, sub, n)
    slot2, status = l.comm_shrink(sub, [n - 1]) if rank != n - 1 else (None, None)
    if slot2 is not None:
        assert wait_ready(sub) == 0
        _allreduce(l, slot2.value, n - 1)
        l.comm_destroy(slot2.value)
    l.comm_destroy(sub)
    l.comm_destroy(comm)


@pytest.mark.timeout(60)
def test_nonblocking_split_and_shrink_complete_through_the_parent():
    run_ranks(_nonblocking_reshape, 3, uid(), timeout=30)


# ---- finalize, mismatches, rendezvous misuse ------------------------------------------------------


def _finalize(rank, n, idb, blocking):
    l = lib()
    comm = init(n, rank, idb, None if blocking else Config(blocking=0))
    _allreduce(l, comm, n)
    time.sleep(0.05 * rank)
    st = l.comm_finalize(comm)
    if not blocking:
        assert wait_ready(comm) == 0
    with pytest.raises(errors.InvalidArgument):
        l.comm_finalize(comm)  # second finalize
    l.comm_destroy(comm)
    return st


@pytest.mark.timeout(60)
@pytest.mark.parametrize("blocking", [True, False])
def test_finalize_synchronises_and_destroy_is_local(blocking):
    out = run_ranks(_finalize, 3, uid(), blocking, timeout=30)
    assert all(st in (0, 7) for st in out)


def _mismatch(rank, n, idb, what):
    l = lib()
    comm = init(n, rank, idb)
    a = np.ones(64, np.float32)
    b = np.empty_like(a)
    args = {"count": (10 if rank == 0 else 20, F32, SUM), "dtype": (10, F32 if rank == 0 else int(DataType.Int32), SUM),
            "op": (10, F32, SUM if rank == 0 else int(RedOp.Max))}
    if what == "root":
        call = lambda: l.broadcast(ptr(a), ptr(b), 10, F32, rank, comm)  # noqa: E731
    else:
        cnt, dt, op = args[what]
        call = lambda: l.all_reduce(ptr(a), ptr(b), cnt, dt, op, comm)  # noqa: E731
    for count in (0, 10):  # the mismatch is the third collective: the text counts from 1, as pycoll's seq does,
        l.all_reduce(ptr(a), ptr(b), count, F32, SUM, comm)  # the zero-element one too
    if what == "root":  # two roots of a small broadcast: each only sends (the eager lane); one that finds no peer
        try:  # in it yet runs ahead, the other finds the mismatch, and the first fails at its next wait for it
            call()
        except errors.InvalidUsage as e:
            text = e.last_error
        else:
            with pytest.raises(errors.NCCLError) as ei:
                l.all_reduce(ptr(a), ptr(b), 10, F32, SUM, comm)
            assert "rank 1" in ei.value.last_error or "rank 0" in ei.value.last_error, ei.value.last_error
            l.comm_abort(comm)
            return None
    else:
        with pytest.raises(errors.InvalidUsage) as ei:
            call()
        text = ei.value.last_error
    assert "mismatch" in text and "rank 0" in text and "rank 1" in text, text
    assert "collective #3:" in text, text
    l.comm_abort(comm)
    return text


@pytest.mark.timeout(60)
@pytest.mark.parametrize("what", ["count", "dtype", "op", "root"])
def test_descriptor_mismatch_is_invalid_usage(what):
    texts = run_ranks(_mismatch, 2, uid(), what, timeout=30)
    assert all(texts) if what != "root" else any(texts), texts


def _failed_then_unrelated(rank, n, idb):
    l = lib()
    comm = init(n, rank, idb)
    a = np.ones(64, np.float32)
    b = np.empty_like(a)
    with pytest.raises(errors.InvalidUsage) as ei:
        l.all_reduce(ptr(a), ptr(b), 10 + rank, F32, SUM, comm)  # a mismatch: the communicator is in error now
    first = ei.value.last_error
    with pytest.raises(errors.InvalidArgument, match="not registered"):
        l.comm_deregister(comm, 0x999)  # an unrelated call's own error: the communicator's last error for a while
    texts = []
    for call in (lambda: l.all_reduce(ptr(a), ptr(b), 10, F32, SUM, comm), lambda: l.comm_count(comm),
                 lambda: l.comm_split(comm, 0, rank)):
        with pytest.raises(errors.InvalidUsage) as ei:
            call()
        texts.append(ei.value.last_error)
    last = l.get_last_error(comm)
    l.comm_abort(comm)
    return first, texts, last


@pytest.mark.timeout(60)
def test_calls_a_failed_communicator_refuses_name_its_failure_not_a_later_calls_error():
    for first, texts, last in run_ranks(_failed_then_unrelated, 2, uid(), timeout=30):
        assert "collective mismatch at collective #1" in first, first
        assert texts == [first] * 3 and last == first, (first, texts, last)


def _init_expect(rank, n, idb, nranks, myrank, code):
    l = lib()
    with pytest.raises(errors.NCCLError) as ei:
        l.comm_init_rank(nranks, UniqueId(idb), myrank)
    assert ei.value.code == code, ei.value
    return ei.value.last_error


@pytest.mark.timeout(60)
def test_mismatched_nranks_is_invalid_usage():
    before = set(os.listdir("/dev/shm"))  # taken here: rank 0 may have made its segment before rank 1 starts
    texts = run_ranks(_mismatched_nranks, 2, uid(), before, timeout=30)
    assert any("nranks" in t for t in texts), texts


def _mismatched_nranks(rank, n, idb, before):
    if rank == 1:  # rank 0 creates the communicator with nranks=2, rank 1 says 3: wait for its segment
        deadline = time.monotonic() + 10.0
        while time.monotonic() < deadline and not any(
                e.startswith(shm_prefix()) for e in set(os.listdir("/dev/shm")) - before):
            time.sleep(0.01)
    return _init_expect(rank, n, idb, 2 + rank, rank, 5)


def _double_claim(rank, n, idb):
    if rank == 1:
        time.sleep(0.1)
    return _init_expect(rank, n, idb, 2, 0, 5)  # both processes say they are rank 0 of 2


@pytest.mark.timeout(60)
def test_two_processes_claiming_one_rank():
    texts = run_ranks(_double_claim, 2, uid(), timeout=30)
    assert any("claimed by two" in t for t in texts), texts


def test_unique_id_from_another_host():
    l = lib()
    raw = bytearray(bytes(l.get_unique_id()))
    raw[8] ^= 0xFF  # the host identity (boot_id) lives right after magic/version/kind
    with pytest.raises(errors.InvalidUsage) as ei:
        l.comm_init_rank(2, UniqueId(bytes(raw)), 0)
    assert "another host" in ei.value.last_error
    with pytest.raises(errors.InvalidArgument):
        l.comm_init_rank(1, UniqueId(bytes(128)), 0)  # not an id of this library


def _rendezvous_timeout(rank, n, idb):
    return _init_expect(rank, n, idb, 2, 0, 8)  # ncclTimeout (it said ncclRemoteError: "remote process exited")


@pytest.mark.timeout(60, method="thread")
@pytest.mark.parametrize("seconds", ["0.5", "1e-10"])  # a positive timeout under 1 ns was taken for "none"
def test_missing_rank_times_out_with_an_error(seconds):
    (text,) = run_ranks(_rendezvous_timeout, 1, uid(), timeout=30, env={"PYCOLL_HOST_INIT_TIMEOUT": seconds})
    assert "timed out" in text and "1" in text
    if seconds == "0.5":
        assert "timed out after 0.5 s waiting for ranks 1 to join" in text, text  # it said "after 0 s"


# ---- more lifecycle --------------------------------------------------------------------------------


def _scalable(rank, n, ids, bad_rank):
    l = lib()
    mine = [UniqueId(i) for i in ids]
    if rank == bad_rank:
        mine[1] = l.get_unique_id()
        with pytest.raises(errors.InvalidUsage) as ei:
            l.comm_init_rank_scalable(n, rank, mine)
        return ei.value.last_error
    if bad_rank >= 0:
        with pytest.raises(errors.InvalidUsage):
            l.comm_init_rank_scalable(n, rank, mine)
        return None
    comm, status = l.comm_init_rank_scalable(n, rank, mine)
    assert status == 0
    _allreduce(l, comm, n)
    l.comm_destroy(comm)
    return None


@pytest.mark.timeout(60)
@pytest.mark.parametrize("bad_rank", [-1, 2])
def test_init_rank_scalable(bad_rank):
    ids = [uid(), uid()]
    if bad_rank >= 0:
        out = run_ranks(_scalable, 3, ids, bad_rank, timeout=30, env={"PYCOLL_HOST_INIT_TIMEOUT": "5"})
        assert "different set of unique ids" in out[bad_rank] or out[bad_rank]
    else:
        run_ranks(_scalable, 3, ids, bad_rank, timeout=30)


def _shrink_abort_stream(rank, n, idb):
    l = lib()
    comm = init(n, rank, idb)
    if rank == n - 1:
        _stop_self_after_init(l, comm, n)
    _allreduce(l, comm, n)
    stream = l.host_stream_create()
    ev = l.host_event_create()
    a = np.ones(1 << 16, np.float32)
    l.all_reduce(ptr(a), ptr(a), a.size, F32, SUM, comm, stream)  # stuck behind the stopped rank
    l.host_event_record(ev, stream)
    time.sleep(0.2)
    assert not l.host_event_query(ev)
    slot, status = l.comm_shrink(comm, [n - 1], None, SHRINK_ABORT)
    assert status == 0
    l.host_event_synchronize(ev)
    small = slot.value
    _allreduce(l, small, n - 1)
    with pytest.raises(errors.NCCLError):  # the parent is not for collectives any more
        _allreduce(l, comm)
    l.host_stream_destroy(stream)
    l.host_event_destroy(ev)
    l.comm_destroy(small)
    l.comm_abort(comm)


@pytest.mark.timeout(60)
def test_shrink_abort_stops_ops_stuck_on_a_stream():
    run_ranks(_shrink_abort_stream, 3, uid(), timeout=30, may_die=[2], on_start=kill_when_done([2]))


def _die_in_rendezvous(rank, n, idb):
    l = lib()
    l.comm_init_rank_config(2, UniqueId(idb), 0, Config(blocking=0))
    time.sleep(0.1)  # the segment exists; rank 1 never comes
    os.kill(os.getpid(), signal.SIGKILL)


@pytest.mark.timeout(60)
def test_stale_segment_of_a_dead_creator_is_swept():
    from helpers.mp import shm_entries

    before = set(shm_entries())
    run_ranks(_die_in_rendezvous, 1, uid(), timeout=30, may_die=[0])
    assert set(shm_entries()) - before, "the killed rank left its rendezvous segment (to be swept)"
    time.sleep(0.06)
    lib().get_unique_id()  # sweeps segments whose creator is dead
    assert not set(shm_entries()) - before


def test_a_handle_no_longer_a_communicator_is_refused_alike_by_every_call():
    # a destroyed (or aborted, or another library's) handle: destroy said "has already been destroyed" where every
    # other call says what is known, that it is not a valid communicator
    l = lib()
    c = l.comm_init_rank(1, l.get_unique_id(), 0)
    l.comm_destroy(c)
    for call in (lambda: l.comm_destroy(c), lambda: l.comm_count(c), lambda: l.comm_abort(c)):
        with pytest.raises(errors.InvalidArgument) as ei:
            call()
        assert "is not a valid communicator (it was destroyed or aborted, or never created)" in ei.value.last_error
