"""Elastic reshape and grow on the host backend: real processes, real SIGKILL/SIGSTOP."""

from __future__ import annotations

import os
import signal
import threading
import time

import numpy as np
import pytest
from helpers.mp import Died, run_ranks, shm_prefix

import pycoll
import pycoll.hooks
from pycoll import elastic, failpoints, membership
from pycoll._procs import boot_id, exiting, stat_fields
from pycoll.elastic import ElasticGroup, Excluded
from pycoll.launch.keys import KEY_GROUP_LOST, KEY_LOST, KEY_PROC


@pytest.fixture
def server():
    srv = pycoll.TCPStoreServer(token="elastic-test").start()
    yield srv.address
    srv.close()


def _store(addr):
    return pycoll.TCPStore(addr[0], addr[1], "elastic-test", timeout=30.0)


def _train(group: ElasticGroup, steps: int, die_at: dict, stop_at: dict, log: list) -> np.ndarray:
    """A data-parallel 'training' loop: every step all-reduces a gradient that depends on the step.

    Parameters stay identical on every member whatever the membership: the update uses the average
    gradient, every member commits each step it completed, and after a reshape every survivor goes on
    after the last step all of them completed (a member whose collective completed where another's
    failed takes that step back).
    """
    params, before = np.zeros(16, np.float64), np.zeros(16, np.float64)
    step = 0
    while step < steps:
        if die_at.get(group.slot) == step:
            os.kill(os.getpid(), signal.SIGKILL)
        if stop_at.get(group.slot) == step:
            os.kill(os.getpid(), signal.SIGSTOP)
        grad = np.full(16, step + 1.0)
        try:
            group.comm.all_reduce(grad, op="avg")
        except pycoll.CommFailure:
            mine = group.last_committed
            group.reshape()
            agreed = -1 if group.last_committed is None else group.last_committed
            if mine is not None and mine > agreed:
                params[:] = before
            step = agreed + 1
            log.append((step, group.generation, group.members))
            continue
        before[:] = params
        params -= 0.01 * grad
        group.commit(step)
        step += 1
    return params


def _elastic_run(rank, n, addr, steps, die_at, stop_at, timeout):
    store = _store(addr)
    group = ElasticGroup(store, rank, n, backend="host", timeout=timeout, name="t")
    log: list = []
    try:
        params = _train(group, steps, die_at, stop_at, log)
    except Excluded as e:
        return ("excluded", str(e))
    expect = -0.01 * sum(range(1, steps + 1))
    check = np.full(16, expect)
    out = dict(ok=bool(np.allclose(params, check)), generation=group.generation, members=group.members,
               log=log, phases=[t.phases_ms() for t in group.transitions])
    # every member holds the same parameters
    mx, mn = params.copy(), params.copy()
    group.comm.all_reduce(mx, op="max")
    group.comm.all_reduce(mn, op="min")
    out["identical"] = bool(np.array_equal(mx, mn))
    group.close()
    return out


@pytest.mark.timeout(90)
@pytest.mark.parametrize("victim", [0, 1, 2, 3])
def test_kill_each_rank_position(server, victim):
    res = run_ranks(_elastic_run, 4, server, 30, {victim: 10}, {}, 10.0, timeout=60, may_die=[victim])
    assert isinstance(res[victim], Died)
    survivors = [r for r in range(4) if r != victim]
    for r in survivors:
        out = res[r]
        assert out["ok"] and out["identical"], out
        assert out["generation"] == 1 and out["members"] == tuple(survivors), out
        assert out["phases"][0]["total"] < 5000, out["phases"]


@pytest.mark.timeout(90)
def test_two_failures_one_after_another(server):
    res = run_ranks(_elastic_run, 4, server, 40, {3: 10, 1: 25}, {}, 10.0, timeout=60, may_die=[1, 3])
    for r in (0, 2):
        out = res[r]
        assert out["ok"] and out["identical"], out
        assert out["generation"] == 2 and out["members"] == (0, 2), out


@pytest.mark.timeout(90)
def test_sigstop_instead_of_sigkill(server):
    t_timeout = 1.5
    res = run_ranks(_elastic_run, 4, server, 20, {}, {2: 8}, t_timeout, timeout=60, may_die=[2])
    for r in (0, 1, 3):
        out = res[r]
        assert out["ok"] and out["identical"], out
        assert out["members"] == (0, 1, 3), out


def _grid_with_a_death(rank, n, addr):
    """A 2x2 grid of communicators split from the group's (tensor- and data-parallel); slot 3 dies at step 2."""
    store = _store(addr)
    group = ElasticGroup(store, rank, n, backend="host", timeout=8.0, name="grid")

    def grid():
        c = group.comm
        return (c.split(c.rank // 2, name="tp"), c.split(c.rank % 2, name="dp")) if c.size == 4 else (c, c)

    tp, dp = grid()
    step, took, causes = 0, [], []
    while step < 4:
        if group.slot == 3 and step == 2:
            os.kill(os.getpid(), signal.SIGKILL)
        x = np.ones(4)
        try:
            tp.all_reduce(x)
            dp.all_reduce(x)
            group.comm.all_reduce(x)
        except pycoll.CommFailure:
            t0 = time.monotonic()
            group.reshape()
            took.append(time.monotonic() - t0)
            causes.append(group.transitions[-1].cause)
            olds = [tp.state, dp.state]  # the old generation's: revoked (or aborted), never left usable
            tp, dp = grid()
            causes.append(f"old states {olds}")
            step = (group.last_committed or -1) + 1
            continue
        group.commit(step)
        step += 1
    group.close()
    return took, causes


@pytest.mark.timeout(90)
def test_communicators_split_from_the_groups_fail_with_it(server):
    """A member blocked in a healthy tensor- or data-parallel communicator (split from the group's) waited there for
    a peer that was in the reshape: the reshape took two operation timeouts (16 s at timeout 8, a minute at the
    default). Now they are revoked with the group's, and the reshape's cause names the failure that started it."""
    res = run_ranks(_grid_with_a_death, 4, server, timeout=60, may_die=[3])
    assert isinstance(res[3], Died)
    for took, causes in res[:3]:
        assert len(took) == 1 and took[0] < 4.0, res[:3]
        assert "active" not in causes[-1], causes
    assert any("'tp' failed" in c or "'dp' failed" in c for _, causes in res[:3] for c in causes), res[:3]


def _split_failure_first(rank, n, addr):
    """Communicators {0, 2} and {1, 3} split from the group's; at step 2 slot 1 dies and slot 2 is busy for 6 s in a
    C call holding the GIL: slot 3 meets the failure in its split communicator first, slot 0 waits in its own for slot
    2. Returns how long slot 0's step took to fail, and the reshape's kind and members (slot 2: "excluded")."""
    import ctypes

    group = ElasticGroup(_store(addr), rank, n, backend="host", timeout=20.0, window=1.0, name="splitfirst")
    sub = group.comm.split(group.rank % 2)
    t0 = time.monotonic()
    for step in range(3):
        if step == 2 and group.slot == 1:
            os.kill(os.getpid(), signal.SIGKILL)
        if step == 2 and group.slot == 2:
            ctypes.PyDLL(None).usleep(6_000_000)
        t0 = time.monotonic()
        try:
            sub.all_reduce(np.ones(4))
            group.comm.all_reduce(np.ones(4))
        except pycoll.CommFailure:
            failed_after = time.monotonic() - t0
            try:
                group.reshape()
            except Excluded:
                return "excluded"
            out = (failed_after, time.monotonic() - t0, group.transitions[-1].kind, group.members)
            group.close()
            return out
        group.commit(step)
    return "no failure"


@pytest.mark.timeout(90)
def test_a_member_waiting_in_a_split_communicator_comes_to_a_reshape_a_split_failure_started(server):
    """The first failure met in a communicator split from the group's (slot 3's peer there died) made a "requested"
    reshape: the others only expected a revoke, and slot 0, waiting in its split communicator for slot 2 (busy, then
    left out), waited for slot 2's 6 s (its timeout, had slot 2 stayed away). A split's failure is the group's:
    every member's communicators made from it are revoked at the flag."""
    res = run_ranks(_split_failure_first, 4, server, timeout=60, may_die=[1])
    assert isinstance(res[1], Died) and res[2] == "excluded", res
    for slot in (0, 3):
        failed_after, reshaped_after, kind, members = res[slot]
        assert failed_after < 3.0 and reshaped_after < 4.5, res
        assert kind == "shrink" and members == (0, 3), res


def _reshape_failure(rank, n, addr):
    """Slot 3 dies; slot 2 dies while the others are reshaping (after vouching for itself). A member still finishing
    the first all_reduce when slot 0 begins the reshape has it failed by the reshape's revoke: that one too leads to
    the reshape."""
    store = _store(addr)
    group = ElasticGroup(store, rank, n, backend="host", timeout=10.0, name="t")
    x = np.ones(4)
    try:
        group.comm.all_reduce(x)
        if rank == 3:
            os.kill(os.getpid(), signal.SIGKILL)
        group.comm.all_reduce(x)
    except pycoll.CommFailure:
        if rank == 2:
            # vouch, then die in the middle of the reshape
            membership.vouch(store, "pycoll/elastic/t/g0/a0/", 2, -1)
            os.kill(os.getpid(), signal.SIGKILL)
        group.reshape()
    y = np.full(4, 1.0)
    group.comm.all_reduce(y)
    out = dict(members=group.members, y=y.tolist(), attempts=group.transitions[-1].attempts)
    group.close()
    return out


@pytest.mark.timeout(90)
def test_failure_during_the_reshape(server):
    res = run_ranks(_reshape_failure, 4, server, timeout=60, may_die=[2, 3])
    for r in (0, 1):
        assert res[r]["members"] == (0, 1) and res[r]["y"] == [2.0] * 4, res[r]


def _stopped_in_the_reshape(rank, n, addr, point):
    """Slot 3 dies; slot 1 stops at ``point`` of the survivors' reshape. The reshape's calls time out after 30 s:
    the others must not wait that out (a stopped member is known at once)."""
    store = _store(addr)
    group = ElasticGroup(store, rank, n, backend="host", timeout=30.0, name="t")
    if rank == 1:
        failpoints.configure(f"{point}=stop", rank=rank)
    x = np.ones(4)
    t0 = time.monotonic()
    try:  # the first all_reduce too: a member finishing it as the others begin the reshape has it revoked
        group.comm.all_reduce(x)
        if rank == 3:
            os.kill(os.getpid(), signal.SIGKILL)
        group.comm.all_reduce(x)
    except pycoll.CommFailure:
        group.reshape()
    while True:  # after the shrink slot 1 stops in the new communicator's first collective
        y = np.ones(4)
        try:
            group.comm.all_reduce(y)
            break
        except pycoll.CommFailure:
            group.reshape()
    out = dict(members=group.members, y=y.tolist(), took=time.monotonic() - t0)
    group.close()
    return out


@pytest.mark.timeout(90)
@pytest.mark.parametrize("point", ["elastic.shrink.before", "elastic.shrink.after"])
def test_a_member_stopped_in_the_reshape_costs_no_timeout(server, point):
    res = run_ranks(_stopped_in_the_reshape, 4, server, point, timeout=60, may_die=[1, 3])
    for r in (0, 2):
        assert res[r]["members"] == (0, 2) and res[r]["y"] == [2.0] * 4, res[r]
        assert res[r]["took"] < 10.0, res[r]  # not a 30 s timeout


def _gone_after_the_last_step(rank, n, addr, action, spec="", gone=2):
    """Every member completes its steps; slot ``gone`` then dies or stops before close(), which must neither raise
    nor wait out its 30 s timeout on the others, marks it lost for the launcher, and tells waiting joiners the group
    finished (``closed``)."""
    failpoints.configure(spec, rank=rank)
    store = _store(addr)
    group = ElasticGroup(store, rank, n, backend="host", timeout=30.0, name="t")
    for _ in range(3):
        group.comm.all_reduce(np.ones(4))
    group.comm.barrier()
    if rank == gone:
        os.kill(os.getpid(), signal.SIGSTOP if action == "stop" else signal.SIGKILL)
    time.sleep(0.3)
    t0 = time.monotonic()
    group.close()
    took = time.monotonic() - t0
    group.close()  # again: nothing
    with pytest.raises(pycoll.CommStateError, match="was closed"):
        group.reshape()
    return dict(took=took, lost=[m for m in range(n) if store.check([KEY_LOST.format(rank=m)])])


@pytest.mark.timeout(90)
@pytest.mark.parametrize("action", ["kill", "stop"])
@pytest.mark.parametrize("gone", [2, 0])
def test_close_with_a_member_gone_after_the_last_step(server, action, gone):
    # slot 0 is the member that tells waiting joiners the group finished: where it was the one gone, nobody did, and
    # its replacement found every member gone -- pycoll-run --replace-failed failed a job that had finished
    res = run_ranks(_gone_after_the_last_step, 4, server, action, "", gone, timeout=60, may_die=[gone])
    for r in set(range(4)) - {gone}:
        assert res[r]["took"] < 10.0 and res[r]["lost"] == [gone], res[r]
    assert _store(server).check(["pycoll/elastic/t/closed"])  # once every member closed (slot 1 tells, for slot 0)


def _closed_from_another_thread(rank, n, addr):
    """The main thread has the communicator; close() and maybe_grow() from another thread are refused, naming
    themselves, with nothing changed: the main thread's close then destroys the communicator."""
    group = ElasticGroup(_store(addr), rank, n, backend="host", timeout=30.0, name="t")
    group.comm.all_reduce(np.ones(4))
    errors = []

    def other():
        for call in (group.maybe_grow, group.close):
            try:
                call()
                errors.append(None)
            except pycoll.CommStateError as e:
                errors.append(str(e))

    t = threading.Thread(target=other, name="closer")
    t.start()
    t.join()
    assert not group.maybe_grow()  # the group still works
    group.close()
    return dict(errors=errors, state=group.comm.state)


@pytest.mark.timeout(60)
def test_close_from_another_thread_is_refused_before_it_changes_anything(server):
    # the group was half closed (watcher stopped, joiners told the group finished) and a second close() did nothing:
    # its communicator stayed active, never destroyed
    for r in run_ranks(_closed_from_another_thread, 2, server, timeout=40):
        assert r["state"] == "destroyed", r
        for call, e in zip(("maybe_grow", "close"), r["errors"], strict=True):
            assert e and f"thread 'closer' entered ElasticGroup.{call} while thread 'MainThread'" in e, r


def _closed_after_the_trainer_thread_ended(rank, n, addr):
    """A thread of its own trained and ended; the main thread closes (a destroy: allowed once that thread ended),
    first inside a group() by mistake (refused, nothing changed), then after it."""
    group = ElasticGroup(_store(addr), rank, n, backend="host", timeout=30.0, name="t")
    t = threading.Thread(target=lambda: [group.comm.all_reduce(np.ones(4)) for _ in range(3)], name="trainer")
    t.start()
    t.join()
    refused = None
    with group.comm.group():
        try:
            group.close()
        except pycoll.CommStateError as e:
            refused = str(e)
    group.close()
    return dict(refused=refused, state=group.comm.state)


@pytest.mark.timeout(60)
def test_close_after_the_training_thread_ended_and_after_a_refusal_in_a_group(server):
    # claim() refused the close as another thread's use (destroy allows it once that thread ended); a close refused
    # inside a group aborted the communicator on its way out (its peer's close then failed)
    for r in run_ranks(_closed_after_the_trainer_thread_ended, 2, server, timeout=40):
        assert r["state"] == "destroyed", r
        assert "ElasticGroup.close cannot be called inside a group" in r["refused"], r


def _own_abort_then_reshape(rank, n, addr):
    group = ElasticGroup(_store(addr), rank, n, backend="host", timeout=30.0, name="t")
    old = group.comm
    tp = old.split(0, name="tp")
    try:
        # rank 0 may still be in the first one when rank 1's abort and reshape flag come (a busy machine): its
        # watcher revokes the communicator under it, as under the second
        group.comm.all_reduce(np.ones(4))
        if rank == 1:
            group.comm.abort()
        group.comm.all_reduce(np.ones(4))
    except pycoll.CommFailure:
        group.reshape()
    y = np.ones(4)
    group.comm.all_reduce(y)
    out = dict(cause=group.transitions[-1].cause, y=y.tolist())
    for key, kept in (("stale", old), ("stale_split", tp)):
        try:  # a reference kept from before: it repeated its failure at every step, each taken for a new one
            kept.all_reduce(np.ones(4))
        except pycoll.CommStateError as e:
            out[key] = str(e)
    group.close()
    return out


@pytest.mark.timeout(60)
def test_a_reshape_after_the_member_s_own_abort_says_so(server):
    res = run_ranks(_own_abort_then_reshape, 2, server, timeout=40)
    assert all(r["y"] == [2.0] * 4 for r in res), res
    assert res[1]["cause"] == ("this member's communicator was aborted (no failure recorded: abort() called in this "
                               "process)"), res  # it was 'None'
    # rank 0 met the abort in its all_reduce, or (a busy machine: its watchdog came first) rank 1's reshape flag
    cause = res[0]["cause"]
    assert "rank 1 aborted" in cause or "by another member (slot 1 raised its flag, having met a failure)" in cause, res
    for r in res:
        assert r["stale"].startswith("all_reduce: communicator 't' of generation 0 of elastic group 't' was replaced "
                                     "by generation 1: use group.comm, not a reference kept from before the "
                                     "reshape"), r
        assert r["stale_split"].startswith("all_reduce: communicator 'tp' was made from generation 0 of elastic group "
                                           "'t', which generation 1 replaced: make it again from group.comm"), r


@pytest.mark.timeout(90)
def test_a_member_killed_before_it_marks_the_gone_one_lost(server):
    # slot 0 dies in close() where it would mark slot 2 lost: the others mark it (slot 0 too, when they find it gone)
    res = run_ranks(_gone_after_the_last_step, 4, server, "kill", "elastic.close.gone=kill;rank=0", timeout=60,
                    may_die=[0, 2])
    assert isinstance(res[0], Died)
    for r in (1, 3):
        assert res[r]["took"] < 10.0 and 2 in res[r]["lost"] and set(res[r]["lost"]) <= {0, 2}, res[r]


def _rank0_dies_before_it_marks(rank, n, addr):
    """Slot 3 dies; slot 0, rank 0 of the survivors, dies right after their reshape, before it marked slot 3 lost
    (that waits for the first operation); the next reshape's rank 0 marks both."""
    store = _store(addr)
    group = ElasticGroup(store, rank, n, backend="host", timeout=10.0, name="t")
    if rank == 0:
        failpoints.configure("elastic.reshape.done=kill", rank=rank)
    x = np.ones(4)
    # the first step, the failed one, the one slot 0's death fails, one on the last communicator (a member finishing
    # the first as the others begin the reshape has it revoked: it then reshapes one step earlier)
    first = True
    while True:
        try:
            group.comm.all_reduce(x)
            if rank == 3:
                os.kill(os.getpid(), signal.SIGKILL)
            if not first and group.members == (1, 2):
                break
        except pycoll.CommFailure:
            group.reshape()
        first = False
    deadline = time.monotonic() + 10.0
    lost = []
    while time.monotonic() < deadline:  # rank 0 marks them off the critical path
        lost = [m for m in range(n) if store.check([KEY_LOST.format(rank=m)])]
        if lost == [0, 3]:
            break
        time.sleep(0.05)
    out = dict(members=group.members, lost=lost)
    group.close()
    return out


@pytest.mark.timeout(90)
def test_a_slot_lost_while_its_marker_died_is_marked_by_the_next_rank_0(server):
    res = run_ranks(_rank0_dies_before_it_marks, 4, server, timeout=60, may_die=[0, 3])
    for r in (1, 2):
        assert res[r]["members"] == (1, 2) and res[r]["lost"] == [0, 3], res[r]


def _form_under_tag(rank, n, addr, tags):
    os.environ["PYCOLL_HOST_SHM_TAG"] = tags[rank]  # before this process's first segment or unique id
    t0 = time.monotonic()
    try:
        group = ElasticGroup(_store(addr), rank, n, backend="host", timeout=4.0, name="t")
    except pycoll.PycollError as e:
        return type(e).__name__, time.monotonic() - t0, str(e)
    members = group.members
    group.close()
    return "formed", time.monotonic() - t0, members


@pytest.mark.timeout(90)
def test_a_slot_of_another_host_tag_fails_at_once_and_the_group_forms_without_it(server):
    # its init's error (the unique id's creator had another PYCOLL_HOST_SHM_TAG) was retried for ever, the group
    # never formed and nothing was raised
    base = os.environ.get("PYCOLL_HOST_SHM_TAG", "t")[:10]
    res = run_ranks(_form_under_tag, 2, server, (base, base + "_x"), timeout=60)
    name, took, text = res[1]
    assert name == "InvalidUsage" and took < 3 and "PYCOLL_HOST_SHM_TAG" in text, res[1]
    assert res[0][0] == "formed" and res[0][2] == (0,), res[0]


def _joiner_of_another_tag(rank, n, addr):
    store = _store(addr)
    if rank == n - 1:  # the replacement of slot 2, started with another PYCOLL_HOST_SHM_TAG than the members'
        os.environ["PYCOLL_HOST_SHM_TAG"] = os.environ.get("PYCOLL_HOST_SHM_TAG", "t")[:10] + "_x"
        store.wait(["slot2-dead"], timeout=30)
        t0 = time.monotonic()
        try:
            ElasticGroup(store, 2, joiner=True, backend="host", timeout=10.0, name="t", join_timeout=40.0)
            return "joined", 0.0, ""
        except pycoll.PycollError as e:
            return type(e).__name__, time.monotonic() - t0, str(e)
    group = _without_slot_2(store, rank, n - 1, np.ones(4))
    for _ in range(160):  # about 8 s: the joiner's request comes, its grow fails on its side (a count, not each
        # member's clock: the loop's last maybe_grow() is a collective, and one more on one member was a mismatch)
        try:
            group.maybe_grow()
        except pycoll.CommFailure:
            group.reshape()
        time.sleep(0.05)
    y = np.ones(4)
    group.comm.all_reduce(y)
    out = dict(members=group.members, y=y.tolist(), grows=sum(t.kind.startswith("grow") for t in group.transitions))
    group.close()
    return out


@pytest.mark.timeout(90)
def test_a_joiner_of_another_host_tag_raises_at_once(server):
    # it asked again after every failed grow, holding the members' maybe_grow() for their whole timeout each time,
    # and ended with "slot 2 was not admitted within 40 s", naming no tag
    res = run_ranks(_joiner_of_another_tag, 4, server, timeout=70, may_die=[2])
    name, took, text = res[3]
    assert name == "InvalidUsage" and took < 8 and "PYCOLL_HOST_SHM_TAG" in text, res[3]
    for r in (0, 1):
        assert res[r]["members"] == (0, 1) and res[r]["y"] == [2.0] * 4, res[r]


def _wait_dead(pid, limit=20.0):
    """Until process ``pid`` is gone, a zombie or dying (as the elastic layer's liveness checks see it)."""
    deadline = time.monotonic() + limit
    while time.monotonic() < deadline:
        fields = stat_fields(pid)
        if fields is None or fields[0] in "ZX" or exiting(fields):
            return
        time.sleep(0.005)
    raise AssertionError(f"process {pid} is still alive after {limit} s")


def _late_policy(rank, n, addr):
    """Slot 3 dies. On slot 0 another thread records the failure but applies the failure policy (revoke)
    late -- as the watchdog does after a slow report and flight-recorder dump -- while slot 0 is
    already shrinking (slot 2 joins the shrink 0.3 s late). The late revoke must not break the shrink."""
    store = _store(addr)
    group = ElasticGroup(store, rank, n, backend="host", timeout=10.0, name="t")
    x = np.ones(4)
    try:
        group.comm.all_reduce(x)
        first_failed = False
    except pycoll.CommFailure:  # slot 0's reshape began before this member saw it complete: its revoke failed it
        first_failed = True
    if rank == 3:
        store.set("victim", str(os.getpid()))
        os.kill(os.getpid(), signal.SIGKILL)
    _wait_dead(int(store.get("victim", timeout=20)))  # a shrink: slot 3 is gone before anyone decides without it
    old = group.comm
    if rank == 0:
        release = threading.Event()

        class HoldPolicy(pycoll.hooks.CommObserver):
            def comm_failed(self, comm, exc, work):
                if comm is old and threading.current_thread().name == "late-policy":
                    release.wait(10.0)

        hold = HoldPolicy()
        pycoll.comm.add_observer(hold)
        late = threading.Thread(target=old.fail, args=(pycoll.CommFailure("slot 3 is gone"),), name="late-policy")
        late.start()
        while old.failure is None:
            time.sleep(0.001)
        threading.Timer(0.15, release.set).start()  # while this rank's shrink waits for slot 2
        group.reshape()
        late.join(10.0)
        pycoll.comm.remove_observer(hold)
    elif rank == 2:
        time.sleep(0.3)
        group.reshape()
    elif first_failed:
        group.reshape()
    else:
        try:
            group.comm.all_reduce(x)
        except pycoll.CommFailure:
            group.reshape()
    y = np.ones(4)
    group.comm.all_reduce(y)
    tr = group.transitions[-1]
    out = dict(members=group.members, y=y.tolist(), kind=tr.kind, attempts=tr.attempts)
    group.close()
    return out


@pytest.mark.timeout(90)
def test_late_failure_policy_does_not_break_the_shrink(server):
    res = run_ranks(_late_policy, 4, server, timeout=60, may_die=[3])
    for r in (0, 1, 2):
        assert res[r] == dict(members=(0, 1, 2), y=[3.0] * 4, kind="shrink", attempts=1), res[r]


def _without_slot_2(store, rank, size, x):
    """Group 't' of ``size`` slots, slot 2 killed (after it set ``slot2-dead``), the others' first all_reduce of
    ``x`` failed and reshaped: the group of the survivors."""
    group = ElasticGroup(store, rank, size, backend="host", timeout=10.0, name="t")
    if rank == 2:
        store.set("slot2-dead", b"1")
        os.kill(os.getpid(), signal.SIGKILL)
    try:
        group.comm.all_reduce(x)
    except pycoll.CommFailure:
        group.reshape()
    return group


def _grow_run(rank, n, addr):
    store = _store(addr)
    if rank == n - 1:  # the replacement: waits until slot 2 is gone, then joins with its slot
        while not store.check(["slot2-dead"]):
            time.sleep(0.01)
        group = ElasticGroup(store, 2, joiner=True, backend="host", timeout=10.0, name="t")
        state = np.empty(16)
        group.comm.broadcast(state, root=0)
        y = np.ones(4)
        group.comm.all_reduce(y)
        out = dict(members=group.members, rank=group.rank, generation=group.generation, state=state.tolist(),
                   y=y.tolist(), uid=group.comm.uid)
        group.close()
        return out
    x = np.ones(16)
    group = _without_slot_2(store, rank, n - 1, x)
    group.comm.all_reduce(x)  # the first operation after the reshape: rank 0 then marks slot 2 lost
    deadline = time.monotonic() + 20
    while not store.check([KEY_LOST.format(rank=2)]) and time.monotonic() < deadline:
        time.sleep(0.01)
    dp = group.comm.split(0, name="dp")  # made from generation 1's communicator: released by the grow
    grew = False
    while not grew and time.monotonic() < deadline:
        grew = group.maybe_grow()
        if not grew:
            time.sleep(0.05)
    dp_state = dp.state
    state = np.arange(16, dtype=np.float64)
    group.comm.broadcast(state, root=0)
    y = np.ones(4)
    group.comm.all_reduce(y)  # complete: rank 0 unmarked slot 2 (after the grow, before it issued this)
    out = dict(members=group.members, rank=group.rank, generation=group.generation, y=y.tolist(),
               kinds=[t.kind for t in group.transitions], uid=group.comm.uid, dp=dp_state,
               lost=[m for m in range(4) if store.check([KEY_LOST.format(rank=m)])],
               superseded=group.comm._superseded)
    group.close()
    return out


@pytest.mark.timeout(90)
def test_grow_back_to_four(server):
    res = run_ranks(_grow_run, 5, server, timeout=60, may_die=[2])
    for r in (0, 1, 3):
        assert res[r]["members"] == (0, 1, 3, 2) and res[r]["y"] == [4.0] * 4, res[r]
        assert res[r]["kinds"] == ["shrink", "grow"] and res[r]["generation"] == 2
        # made from the one it replaced (a shrink, a grow): it is not replaced itself (its next failure was raised
        # as a CommStateError, which the recovery loop does not catch)
        assert res[r]["superseded"] is None, res[r]
        assert res[r]["dp"] == "aborted", res[r]  # it kept its segment for the life of the process
        # slot 2 takes part again: not lost for the launcher (which would take a stop of it for a hang)
        assert res[r]["lost"] == [], res[r]
    joiner = res[4]
    assert joiner["rank"] == 3 and joiner["generation"] == 2 and joiner["state"] == list(range(16))
    assert joiner["y"] == [4.0] * 4
    # one name for the grown communicator on every member and the joiner (dumps match across ranks)
    assert len({res[r]["uid"] for r in (0, 1, 3, 4)}) == 1, res


def _joiner_lost_in_the_grow(rank, n, addr, spec, member_spec):
    """Slots 0-2 form; slot 3 asks to join and dies or stops inside the grow (``spec``: where). The members' grow
    must give up within about a second (not at its 10 s timeout); they go on as three, and admit slot 4 later.
    ``member_spec``: a failpoint armed in the members too."""
    store = _store(addr)
    if rank >= 3:  # the joiners; slot 4 asks once the others went on without slot 3
        while rank == 4 and not store.check(["t-test/second"]):
            time.sleep(0.01)
        if rank == 3:
            os.environ.update(PYCOLL_FAILPOINTS=spec, PYCOLL_RANK="3")  # the host library reads them
            failpoints.configure(spec, rank=3)
        group = ElasticGroup(store, rank, joiner=True, backend="host", timeout=10.0, name="t", join_timeout=30.0)
        y = np.ones(4)
        group.comm.all_reduce(y)
        out = dict(members=group.members, y=y.tolist())
        group.close()
        return out
    failpoints.configure(member_spec, rank=rank)
    group = ElasticGroup(store, rank, 3, backend="host", timeout=10.0, name="t")
    took = None
    deadline = time.monotonic() + 30
    while took is None and time.monotonic() < deadline:
        t0 = time.monotonic()
        try:
            group.maybe_grow()  # slot 3 is admitted (rank 0 decides), then lost inside the grow
        except pycoll.CommFailure:
            took = time.monotonic() - t0
            group.reshape()  # a fresh init (a grow failed): one without a member that voted, then died, too
            took = (took, time.monotonic() - t0)
        time.sleep(0.02)
    x = np.ones(4)
    group.comm.all_reduce(x)
    after = (group.members, x.tolist())
    if group.rank == 0:
        # as pycoll-run ends a hung rank: killed while stopped (continued first, it would go on into the grow's
        # rendezvous and could die there half-way through creating its segment)
        pid = int(store.get("pycoll/elastic/t/proc/3").split()[1])
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        store.set("t-test/second", b"")
    while not group.maybe_grow() and time.monotonic() < deadline:  # slot 4 joins: the group grows again
        time.sleep(0.02)
    y = np.ones(4)
    group.comm.all_reduce(y)
    out = dict(took=took, after=after, members=group.members, y=y.tolist())
    group.close()
    return out


@pytest.mark.timeout(90)
@pytest.mark.parametrize("spec,member_spec", [
    ("elastic.join.admitted=kill", ""),
    ("host.grow.begin=stop", ""),
    # and slot 1 dies as its grow fails; the others hold their failure 1.5 s: the decision and the id reach slot 1
    # without a step (rooted broadcasts: the eager lane), and a late slot 1 would otherwise learn of the failure
    # before it entered its grow (0.5 s was not enough in a fresh-clone CI run: slot 1's maybe_grow() failed at
    # once, and it reshaped with the others)
    ("elastic.join.admitted=kill", ("elastic.grow.failed=kill;rank=1,elastic.grow.failed=sleep(1500);rank=0,"
                                    "elastic.grow.failed=sleep(1500);rank=2")),
], ids=["joiner-killed", "joiner-stopped", "joiner-killed-then-member-1"])
def test_a_joiner_lost_inside_the_grow_costs_no_timeout(server, spec, member_spec):
    # rank 1 may die only where it is made to: a rank 1 that went on was killed once the others were done (Died)
    res = run_ranks(_joiner_lost_in_the_grow, 5, server, spec, member_spec, timeout=60,
                    may_die=[1, 3] if member_spec else [3])
    assert isinstance(res[3], Died), res[3]
    members = (0, 2) if member_spec else (0, 1, 2)
    assert isinstance(res[1], Died) == bool(member_spec), res[1]
    held = 1.5 if member_spec else 0.0  # the failpoint's hold
    for r in members:
        # the grow, then the grow and the reshape: not their 10 s timeout
        assert res[r]["took"] is not None and res[r]["took"][0] < 2.0 + held and res[r]["took"][1] < 4.0 + held, \
            res[r]
        assert res[r]["after"] == (members, [float(len(members))] * 4), res[r]
        assert res[r]["members"] == (*members, 4) and res[r]["y"] == [len(members) + 1.0] * 4, res[r]
    assert res[4] == dict(members=(*members, 4), y=[len(members) + 1.0] * 4), res[4]


def _late_joiner(rank, n, addr):
    store = _store(addr)
    if rank == n - 1:
        while not store.check(["pycoll/elastic/t/closed"]):
            time.sleep(0.01)
        t0 = time.monotonic()
        try:
            ElasticGroup(store, 7, joiner=True, backend="host", timeout=10.0, name="t")
            return "admitted"
        except Excluded as e:
            return ("excluded", "finished" in str(e), time.monotonic() - t0 < 2.0)
    group = ElasticGroup(store, rank, n - 1, backend="host", timeout=10.0, name="t")
    group.comm.barrier()
    group.close()
    return "closed"


@pytest.mark.timeout(60)
def test_a_joiner_after_the_end_is_told_so(server):
    res = run_ranks(_late_joiner, 3, server, timeout=30)
    assert res == ["closed", "closed", ("excluded", True, True)]


def _joiner_of_a_gone_group(rank, n, addr):
    store = _store(addr)
    if rank == n - 1:
        while not store.check(["t-test/members-gone"]):
            time.sleep(0.01)
        t0 = time.monotonic()
        try:
            ElasticGroup(store, 7, joiner=True, backend="host", timeout=10.0, join_timeout=60.0, name="t")
            return "admitted"
        except Excluded as e:
            return ("excluded", str(e), time.monotonic() - t0)
    group = ElasticGroup(store, rank, n - 1, backend="host", timeout=10.0, name="t")
    group.comm.barrier()
    if rank == 0:
        os.kill(os.getpid(), signal.SIGSTOP)  # stopped: it cannot admit anyone either
    time.sleep(0.5)
    store.set("t-test/members-gone", b"")
    os._exit(3)  # without close(): the group never says it finished


@pytest.mark.timeout(90)
def test_a_joiner_whose_group_is_gone_is_told_so(server):
    # every member exited or stopped without closing the group: the joiner is told at once, not at its 60 s
    res = run_ranks(_joiner_of_a_gone_group, 3, server, timeout=60, may_die=[0, 1])
    kind, text, took = res[2]
    assert kind == "excluded" and "every member of group 't' is gone (the processes of slots 0, 1" in text, res[2]
    assert took < 10.0, res[2]


def _mapped_segments():
    """The host library's segments this process has mapped (its communicators')."""
    with open("/proc/self/maps") as f:
        return len({line.split("/dev/shm/")[1].split()[0] for line in f if f"/dev/shm/{shm_prefix()}" in line})


def _requested_reshape(rank, n, addr, spec, split=False):
    """Nothing fails: slot 1 asks for a reshape between two steps, while the others wait for it in a collective.
    ``spec``: a failpoint armed in every member. ``split``: each step also reduces over a communicator split from the
    group's, made again after the reshape (the old one is released with its generation)."""
    failpoints.configure(spec, rank=rank)
    failures = []

    class Failures(pycoll.hooks.CommObserver):
        def comm_failed(self, comm, exc, work):  # what the watchdog reports and dumps
            failures.append(f"{type(exc).__name__}: {exc}")

    pycoll.comm.add_observer(Failures())
    group = ElasticGroup(_store(addr), rank, n, backend="host", timeout=10.0, name="t")
    step, sums, t0 = 0, [], time.monotonic()
    dps = [group.comm.split(0, name="dp")] if split else []
    while step < 5:
        if rank == 1 and step == 3 and group.generation == 0:
            group.reshape()
            if split:
                dps.append(group.comm.split(0, name="dp"))
        x = np.ones(4)
        try:
            if split:
                dps[-1].all_reduce(np.ones(2))
            group.comm.all_reduce(x)
        except pycoll.CommFailure:
            group.reshape()
            if split:
                dps.append(group.comm.split(0, name="dp"))
            continue
        sums.append(x[0])
        step += 1
    states = [d.state for d in dps]
    del dps[:-1]  # the program keeps no old one: released all the same (it was garbage, its segment leaked)
    deadline = time.monotonic() + 5
    while split and _mapped_segments() > 2 and time.monotonic() < deadline:
        time.sleep(0.05)  # released after the new generation's first operation (at most 2 s later)
    out = dict(members=group.members, generation=group.generation, sums=sums, failures=failures,
               transitions=[(t.kind, t.members_before, t.members_after, t.cause) for t in group.transitions],
               took=time.monotonic() - t0, dps=states, mapped=_mapped_segments())
    group.close()
    return out


def _many_reshapes(rank, n, addr):
    group = ElasticGroup(_store(addr), rank, n, backend="host", timeout=10.0, name="keys")
    while group.generation < 12:
        try:
            group.comm.all_reduce(np.ones(2))
            if rank == 0:
                group.reshape()
        except pycoll.CommFailure:
            group.reshape()
    kept: list = []
    deadline = time.monotonic() + 5
    while rank == 0 and time.monotonic() < deadline:  # the watcher forgets them as the generation changes
        kept = sorted({int(k.split("/")[3][1:]) for k in group.store.list_keys("pycoll/elastic/keys/g")})
        if kept and kept[0] >= 12 - elastic._KEYS_KEPT:
            break
        time.sleep(0.05)
    group.close()
    return kept


@pytest.mark.timeout(90)
def test_the_store_keeps_the_keys_of_the_last_generations_only():
    # every reshape left its flag, votes, decision and unique id in the job's store for ever: 4 keys a requested
    # reshape (a thousand reshapes: 4,000 keys, 312 KB), about 10 a failure
    srv = pycoll.TCPStoreServer(token="elastic-test").start()
    try:
        kept = run_ranks(_many_reshapes, 2, srv.address, timeout=60)[0]
    finally:
        srv.close()
    assert kept and kept[0] >= 12 - elastic._KEYS_KEPT and kept[-1] >= 11, kept


@pytest.mark.timeout(60)
@pytest.mark.parametrize("spec,split", [("", False), ("elastic.revoke.before=kill;rank=1", False), ("", True)])
def test_a_requested_reshape_is_no_failure(spec, split):
    """A reshape asked for with nothing failed builds a new communicator of the same members on every member, is
    recorded as such (kind "requested"), and is no failure: nothing is reported, no dump is made -- neither for a
    communicator split from the group's (its revoke was reported as a failure and dumped; and being never released,
    it kept its segment and its failed operation looked unfinished to the exit dump). Killed where it would revoke
    its communicator (after every member voted), the requester is left out at once."""
    srv = pycoll.TCPStoreServer(token="elastic-test").start()
    try:
        res = run_ranks(_requested_reshape, 3, srv.address, spec, split, timeout=40, may_die=[1] if spec else [])
    finally:
        srv.close()
    if spec:
        assert isinstance(res[1], Died), res[1]
        for out in (res[0], res[2]):
            assert out["members"] == (0, 2) and out["sums"][-1] == 2.0 and out["took"] < 5.0, out
        return
    for out in res:
        assert out["members"] == (0, 1, 2) and out["generation"] == 1 and out["sums"] == [3.0] * 5, out
        assert out["transitions"] == [("requested", (0, 1, 2), (0, 1, 2), "reshape requested by slot 1")], out
        assert out["failures"] == [], out
        # revoked quietly, then aborted as its generation is released
        assert out["dps"] in ((["revoked", "active"], ["aborted", "active"]) if split else ([],)), out["dps"]
        assert not split or out["mapped"] == 2, out["mapped"]  # the group's and the dp communicator of generation 1


@pytest.mark.timeout(60)
def test_a_store_whose_server_died_ends_the_group_with_store_lost():
    """torchrun-style, without a launcher: rank 0's process hosts torch's TCPStore. When it dies the survivors'
    reshape cannot agree on anything: StoreLost (no CommFailure, which a recovery loop would catch) that names the
    cause, at once -- not a bare torch error, nor a wait for torch's connect timeout."""
    import gc
    from datetime import timedelta

    dist = pytest.importorskip("torch.distributed")
    server = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False, timeout=timedelta(seconds=20))
    client = dist.TCPStore("127.0.0.1", server.port, is_master=False, timeout=timedelta(seconds=20))
    group = ElasticGroup(client, 0, 1, backend="host", timeout=20.0, name="storelost")
    try:
        time.sleep(0.3)  # the group's threads have their connections (a new one would wait for torch's timeout)
        del server
        gc.collect()  # the server stops with its store object, as with its process
        t0 = time.monotonic()
        with pytest.raises(pycoll.StoreLost, match="group 'storelost' .slot 0. lost its store during the reshape") \
                as info:
            group.reshape()
        assert time.monotonic() - t0 < 5.0 and not isinstance(info.value, pycoll.CommFailure)
        assert info.value.group == "storelost" and "Host the store outside the ranks" in str(info.value)
    finally:
        group.close()


@pytest.mark.timeout(90)
def test_the_store_work_of_a_recovery():
    """A kill of 1 of 4 costs the store the agreement and little else: one vote per survivor (which
    returns the votes so far), one reshape flag (raised by the member whose vote came first, not by
    every survivor), one proposal of the decision by the member whose vote completed the set (which
    then needs no wait for it), at most one more by the coordinator, and a wait for the decision on
    each of the others."""
    srv = pycoll.TCPStoreServer(token="elastic-test").start()
    try:
        res = run_ranks(_elastic_run, 4, srv.address, 20, {2: 10}, {}, 10.0, timeout=60, may_die=[2])
        for r in (0, 1, 3):
            assert res[r]["ok"] and res[r]["generation"] == 1, res[r]
        ops = srv.stats()
    finally:
        srv.close()
    # forming the group: its agreement proposes once or twice (coordinator and last voter); the recovery
    # adds one flag and one or two proposals
    assert ops.get("append_get", 0) == 3, ops  # the survivors' votes
    assert ops.get("compare_set", 0) <= 3, ops


def test_bad_arguments_are_refused_with_the_argument_named():
    store = pycoll.MemoryStore()
    for kwargs, exc, text in [
        (dict(store=None), TypeError, "store must be a pycoll store"),
        (dict(window="1"), TypeError, "window must be a number of seconds"),
        (dict(join_timeout=0), ValueError, "join_timeout must be > 0 seconds"),
        (dict(timeout=float("inf")), ValueError, "timeout must be a finite number of seconds"),
        (dict(slot=0.0), TypeError, "slot must be an int >= 0"),
        (dict(slot=-1), ValueError, "slot must be an int >= 0"),
        (dict(world_size=1.0), TypeError, "world_size must be an int > 0"),
        (dict(world_size=None), ValueError, "world_size is needed to form the group"),
        (dict(on_change=5), TypeError, "on_change must be None or callable"),
        (dict(name=""), ValueError, "name must be a non-empty str"),
        (dict(name=7), TypeError, "name must be a str, got int 7"),
        (dict(node_hub="yes"), TypeError, "node_hub must be True or False, got str 'yes'"),
        (dict(joiner="no"), TypeError, "joiner must be True or False, got str 'no'"),
    ]:
        args = dict(store=store, slot=0, world_size=1, backend="host", name="bad-args") | kwargs
        with pytest.raises(exc, match=text):
            ElasticGroup(**args)
    group = ElasticGroup(store, np.int64(0), np.int32(1), backend="host", name="bad-commit")  # numpy's ints too
    assert type(group.slot) is int
    try:
        for step, exc in [(-1, ValueError), (1.5, TypeError), ("3", TypeError), (True, TypeError)]:
            with pytest.raises(exc, match="commit: step must be an int >= 0"):
                group.commit(step)
        assert group.last_committed is None  # nothing refused was recorded
        group.commit(np.int64(4))
        assert group.last_committed == 4 and type(group.last_committed) is int
    finally:
        group.close()


# -- a slot lost while the group forms; every member gone while replacements wait ------------------


def _formed_without_a_stopped_slot(rank, n, addr, how):
    """Slot 2 stops while the group forms: registered (stopped inside the formation), or before it registered,
    with only pycoll-run's record of its process (as the launcher writes it when it starts a rank)."""
    store = _store(addr)
    store.set(KEY_PROC.format(rank=rank), f"{boot_id()} {os.getpid()} 0")  # what pycoll-run records
    if rank == 2:
        if how == "unregistered":
            os.kill(os.getpid(), signal.SIGSTOP)
        failpoints.configure("elastic.form.before_init=stop", rank=2)
        ElasticGroup(store, 2, n, backend="host", timeout=3.0, window=0.5, name="f")
        return "formed"
    if how == "marker dies":  # slot 0 dies as it marks slot 2 lost: slot 1, rank 0 after its reshape, marks it
        failpoints.configure("elastic.form.mark_lost=kill", rank=rank)
    t0 = time.monotonic()
    group = ElasticGroup(store, rank, n, backend="host", timeout=3.0, window=0.5, name="f")
    took = time.monotonic() - t0
    members = group.members
    try:
        group.comm.barrier()
    except pycoll.CommFailure:
        group.reshape()
    deadline = time.monotonic() + 5.0
    while not store.check([KEY_LOST.format(rank=2)]) and time.monotonic() < deadline:
        time.sleep(0.02)
    lost = store.check([KEY_LOST.format(rank=2)])
    group.close()
    return members, took, lost


@pytest.mark.timeout(60)
@pytest.mark.parametrize("how", ["registered", "unregistered", "marker dies"])
def test_a_slot_stopped_while_the_group_forms_is_left_out_at_once_and_marked_lost(server, how):
    """The others form without it within a fraction of the 3 s timeout (not after the timeout and the agreement's
    window: they know its process is stopped, from its registration or from pycoll-run's record) and mark it lost,
    so that pycoll-run kills it (and may replace it) instead of waiting for it until the job's --timeout."""
    res = run_ranks(_formed_without_a_stopped_slot, 3, server, how, timeout=40,
                    may_die=[0, 2] if how == "marker dies" else [2])
    survivors = [1] if how == "marker dies" else [0, 1]
    for r in survivors:
        members, took, lost = res[r]
        assert members == (0, 1) and lost, res
        assert took < 2.0, res  # before: 3 s of init and 3.5 s of agreement


def _replacements_of_a_gone_group(rank, n, addr, spec):
    """Slots 0 and 1 form, then both die at once; ranks 2 and 3 are their replacements (slots 0 and 1), started
    together as pycoll-run starts them: each must learn at once that nobody is left to admit it."""
    store = _store(addr)
    if rank < 2:
        group = ElasticGroup(store, rank, 2, backend="host", timeout=3.0, name="k")
        group.comm.barrier()
        store.add("k-test/formed", 1)
        while store.add("k-test/formed", 0) < 2:
            time.sleep(0.01)
        os._exit(9)
    while store.add("k-test/formed", 0) < 2:
        time.sleep(0.01)
    time.sleep(0.3)  # the members are gone
    if spec and rank == 2:
        failpoints.configure(spec, rank=2)
    t0 = time.monotonic()
    try:
        ElasticGroup(store, rank - 2, joiner=True, backend="host", timeout=3.0, join_timeout=20.0, name="k")
        return "admitted"
    except Excluded as e:
        return ("excluded", str(e), time.monotonic() - t0, store.check([KEY_GROUP_LOST]))


@pytest.mark.timeout(60)
@pytest.mark.parametrize("spec", ["", "elastic.join.nobody_left=kill", "elastic.join.nobody_left=stop"])
def test_replacements_of_a_group_whose_members_all_died_are_all_told_so(server, spec):
    """Every replacement is excluded within about a second (a slot whose joiner waits, or gave up, has no member
    to admit anyone), not the last one at its 20 s join_timeout; the group is marked lost for pycoll-run, which
    then exits non-zero. ``spec``: the first replacement dies or stops as it would mark the group lost."""
    res = run_ranks(_replacements_of_a_gone_group, 4, server, spec, timeout=40, may_die=[0, 1, 2] if spec else [0, 1])
    for r in ([3] if spec else [2, 3]):
        kind, text, took, group_lost = res[r]
        assert kind == "excluded" and "nobody is left to admit slot" in text, res
        assert took < 3.0 and group_lost, res
