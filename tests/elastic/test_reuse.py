"""Group names used again on one store, and joiners that give up: no key an earlier group (or an earlier request)
left behind is taken for the current one's."""

from __future__ import annotations

import time

import numpy as np
import pytest
from helpers.mp import Died, run_ranks

import pycoll
from pycoll import elastic, failpoints
from pycoll.elastic import ElasticGroup


@pytest.fixture
def server():
    srv = pycoll.TCPStoreServer(token="reuse-test").start()
    yield srv.address
    srv.close()


def _store(addr):
    return pycoll.TCPStore(addr[0], addr[1], "reuse-test", timeout=30.0)


def _phases(rank, n, addr):
    """Two groups of the same (default) name one after the other on one store; slot 0 comes late to the second."""
    store = _store(addr)
    out = []
    for phase in range(2):
        if rank == 0 and phase == 1:
            time.sleep(0.5)  # it saved a checkpoint, say: the others find the first group's keys first
        t0 = time.monotonic()
        group = ElasticGroup(store, rank, n, backend="host", timeout=8.0)
        took = time.monotonic() - t0
        x = np.full(4, rank + 1.0)
        group.comm.all_reduce(x)
        out.append((took, x.tolist(), group.members, group._ns))
        group.close()
    return out


@pytest.mark.timeout(90)
def test_a_second_group_of_the_same_name_forms_promptly(server):
    # the non-zero slots took the first group's unique id and waited out the 8 s timeout for slot 0
    res = run_ranks(_phases, 3, server, timeout=60)
    for r in range(3):
        for took, x, members, _ in res[r]:
            assert took < 4.0 and x == [6.0] * 4 and members == (0, 1, 2), res[r]
    assert len({res[r][0][3] for r in range(3)}) == 1 and len({res[r][1][3] for r in range(3)}) == 1, res
    assert res[0][0][3] != res[0][1][3]  # each group has keys of its own


def _one_run(rank, n, path, close):
    if rank == 0:
        time.sleep(0.5)
    t0 = time.monotonic()
    group = ElasticGroup(pycoll.FileStore(path), rank, n, backend="host", timeout=8.0)
    took = time.monotonic() - t0
    x = np.ones(2)
    group.comm.all_reduce(x)
    if close:
        group.close()
    return took, x.tolist()


@pytest.mark.timeout(120)
@pytest.mark.parametrize("close", [True, False], ids=["closed", "killed"])
def test_a_second_run_on_the_same_file_store_forms_promptly(tmp_path, close):
    """A FileStore's files stay after a run: the next run of the job (after one that closed its group, or one that
    ended without closing it, as a killed job does) must not take the keys it finds for its own."""
    path = str(tmp_path / "store")
    for _ in range(2):
        res = run_ranks(_one_run, 3, path, close, timeout=60, hard_exit=not close)
        for took, x in res:
            assert took < 4.0 and x == [3.0, 3.0], res


def _joiner_of_a_second_group(rank, n, addr):
    """Slots 0-1 form a group, close it and form another of the same name; slot 2 joins the second one."""
    store = _store(addr)
    if rank == 2:
        while not store.check(["t-test/second"]):
            time.sleep(0.01)
        t0 = time.monotonic()
        group = ElasticGroup(store, 2, joiner=True, backend="host", timeout=8.0, join_timeout=20.0)
        group.comm.all_reduce(np.ones(1))  # the members' first collective after the grow
        out = (group.members, time.monotonic() - t0)
        group.close()
        return out
    ElasticGroup(store, rank, 2, backend="host", timeout=8.0).close()
    group = ElasticGroup(store, rank, 2, backend="host", timeout=8.0)
    store.set("t-test/second", b"")
    deadline = time.monotonic() + 20
    while not group.maybe_grow() and time.monotonic() < deadline:
        time.sleep(0.02)
    group.comm.all_reduce(np.ones(1))
    out = (group.members, 0.0)
    group.close()
    return out


@pytest.mark.timeout(90)
def test_a_joiner_of_a_second_group_of_the_same_name_is_admitted(server):
    # the first group's close() told waiting joiners it had finished: the second group's joiner was turned away
    res = run_ranks(_joiner_of_a_second_group, 3, server, timeout=60)
    assert [m for m, _ in res] == [(0, 1, 2)] * 3, res
    assert res[2][1] < 10.0, res


def _joiner_gives_up(rank, n, addr, spec, action):
    """Slot 2 asks to join with a 1 s join_timeout while the members run steps without a grow boundary; it gives up
    and lives on. The members' next maybe_grow() must not wait for it."""
    store = _store(addr)
    if rank == 2:
        failpoints.configure(spec, rank=2)
        store.wait(["t-test/formed"], timeout=20)
        try:
            ElasticGroup(store, 2, joiner=True, backend="host", timeout=10.0, join_timeout=1.0)
            out = "joined"
        except pycoll.StoreTimeout as exc:
            out = f"gave up: {exc}"
        store.set("t-test/joiner", out)
        time.sleep(15)  # it lives on
        return out
    group = ElasticGroup(store, rank, 2, backend="host", timeout=10.0)
    store.set("t-test/formed", b"")
    if action == "wait":
        store.wait(["t-test/joiner"], timeout=20)
    elif action in ("kill", "stop"):  # the joiner was killed or stopped as it withdrew
        pid = int(store.get(f"{elastic.formation_prefix(store)}/proc/2", timeout=20).split()[1])
        deadline = time.monotonic() + 20
        while not elastic._local_process_gone(pid) and time.monotonic() < deadline:
            time.sleep(0.02)
    t0 = time.monotonic()
    grew = group.maybe_grow()
    took = time.monotonic() - t0
    x = np.ones(1)
    group.comm.all_reduce(x)
    pending = group.pending_joiners()
    group.close()
    return dict(grew=grew, took=took, x=x.tolist(), pending=pending)


@pytest.mark.timeout(90)
def test_a_joiner_that_gave_up_is_not_admitted(server):
    # its join request stayed: the members admitted it, waited out their 10 s timeout in the grow and failed
    res = run_ranks(_joiner_gives_up, 3, server, "", "wait", timeout=60, may_die=[2])
    for r in (0, 1):
        assert res[r]["grew"] is False and res[r]["took"] < 2.0 and res[r]["x"] == [2.0], res[r]
        assert res[r]["pending"] == [], res[r]


@pytest.mark.timeout(90)
@pytest.mark.parametrize("action", ["kill", "stop"])
def test_a_joiner_killed_or_stopped_as_it_withdraws_is_not_admitted(server, action):
    res = run_ranks(_joiner_gives_up, 3, server, f"elastic.join.withdraw={action}", action, timeout=60, may_die=[2])
    for r in (0, 1):
        assert res[r]["grew"] is False and res[r]["took"] < 2.0 and res[r]["x"] == [2.0], res[r]


def _admitted_as_it_gives_up(rank, n, addr, spec):
    """Slot 2's join_timeout ends, and it is slow to withdraw (2 s): meanwhile the members' rank 0 admits it. The
    joiner must then join, not leave the members waiting for it."""
    store = _store(addr)
    if rank == 2:
        failpoints.configure(spec, rank=2)
        store.wait(["t-test/formed"], timeout=20)
        store.set("t-test/asking", b"")
        try:
            group = ElasticGroup(store, 2, joiner=True, backend="host", timeout=10.0, join_timeout=1.0)
        except pycoll.StoreTimeout as exc:
            return f"gave up: {exc}"
        except failpoints.FailpointError as exc:
            time.sleep(12)  # it lives on
            return f"raised: {exc}"
        group.comm.all_reduce(np.ones(1))
        out = dict(members=group.members)
        group.close()
        return out
    group = ElasticGroup(store, rank, 2, backend="host", timeout=10.0)
    store.set("t-test/formed", b"")
    store.wait(["t-test/asking"], timeout=20)
    time.sleep(1.6)  # the joiner's deadline passed: it sleeps before it withdraws
    t0 = time.monotonic()
    error = ""
    try:
        grew = group.maybe_grow()
    except pycoll.CommFailure as exc:
        grew, error = False, str(exc)
        group.reshape()
    took = time.monotonic() - t0
    group.comm.all_reduce(np.ones(1))
    out = dict(grew=grew, took=took, members=group.members, error=error)
    group.close()
    return out


@pytest.mark.timeout(90)
def test_a_joiner_admitted_as_it_gives_up_joins(server):
    res = run_ranks(_admitted_as_it_gives_up, 3, server, "elastic.join.withdraw=sleep(2000)", timeout=60)
    for r in (0, 1):
        assert res[r]["grew"] is True and res[r]["took"] < 6.0 and res[r]["members"] == (0, 1, 2), res[r]
    assert res[2] == dict(members=(0, 1, 2)), res[2]


@pytest.mark.timeout(90)
def test_a_joiner_that_leaves_once_admitted_is_named_at_once(server):
    # admitted, it raises before it joins (as Ctrl-C would) and lives on: the members' grow ended at their 10 s
    # timeout, naming nobody
    spec = "elastic.join.withdraw=sleep(2000),elastic.join.admitted=raise"
    res = run_ranks(_admitted_as_it_gives_up, 3, server, spec, timeout=60, may_die=[2])
    assert isinstance(res[2], Died), res[2]  # alive (it sleeps) until the members were done: ended then
    for r in (0, 1):
        assert res[r]["grew"] is False and res[r]["took"] < 6.0 and res[r]["members"] == (0, 1), res[r]
        assert "slot 2, a joiner, left" in res[r]["error"], res[r]


def test_formation_prefix_names_the_current_formation():
    store = pycoll.MemoryStore()
    assert elastic.formation_prefix(store, "x") is None
    store.set("pycoll/elastic/x/formation", "abc 3")
    assert elastic.formation_prefix(store, "x") == "pycoll/elastic/x/f/abc"


def _forming_killed(rank, n, path):
    """Slots 0-2 of a 4-slot group forming without slot 3, which never comes: killed there by the test."""
    ElasticGroup(pycoll.FileStore(path), rank, 4, backend="host", timeout=30.0)
    return "formed"


def _rerun(rank, n, path):
    if rank != 3:
        time.sleep(0.5)  # slot 3, the one the killed run never saw, comes first
    group = ElasticGroup(pycoll.FileStore(path), rank, n, backend="host", timeout=8.0)
    x = np.ones(2)
    group.comm.all_reduce(x)
    out = (group.members, x.tolist())
    group.close()
    return out


@pytest.mark.timeout(120)
def test_a_rerun_after_a_run_killed_while_forming_forms_one_group(tmp_path):
    """Slot 3 of the rerun came first to the formation the killed run's slots 0-2 had begun, took their dead
    processes for its group's slots gone, and formed a group of itself (the others formed apart, after a timeout):
    a formation with a process known gone is a killed run's, and the rerun starts the next."""
    import multiprocessing as mp
    import os
    import signal

    path = str(tmp_path / "store")
    ctx = mp.get_context("spawn")
    procs = [ctx.Process(target=_forming_killed, args=(r, 4, path), daemon=True) for r in range(3)]
    for p in procs:
        p.start()
    store = pycoll.FileStore(path)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:  # all three registered in the formation
        prefix = elastic.formation_prefix(store)
        if prefix and len(list(store.list_keys(f"{prefix}/proc/"))) == 3:
            break
        time.sleep(0.05)
    for p in procs:
        os.kill(p.pid, signal.SIGKILL)
        p.join(10)
    res = run_ranks(_rerun, 4, path, timeout=60)
    assert all(r == ((0, 1, 2, 3), [4.0, 4.0]) for r in res), res


def _restarted_slot(rank, n, addr):
    store = _store(addr)
    if rank == 3:
        time.sleep(2.0)  # the others formed without it meanwhile
        out = []
        for _ in range(2):  # the slot's process, then the process restarted in its place (not as a joiner)
            try:
                ElasticGroup(store, 3, 4, backend="host", timeout=3.0)
                out.append("formed")
            except elastic.Excluded as e:
                out.append(str(e))
        store.set("t/done", b"1")
        return out
    group = ElasticGroup(store, rank, n if rank != 3 else 4, backend="host", timeout=1.0)
    store.wait(["t/done"], timeout=40)
    x = np.ones(2)
    group.comm.all_reduce(x)
    out = (group.members, x.tolist(), elastic.formation_prefix(store) == group._ns)
    group.close()
    return out


@pytest.mark.timeout(120)
def test_a_slot_restarted_after_its_group_formed_without_it_is_excluded_again(server):
    """A slot excluded for coming late, started again as a forming slot, found its claim taken (by its first
    process), took the formation for stale, formed a group of itself and moved the formation key (joiners then
    went to it, told the real group had finished)."""
    res = run_ranks(_restarted_slot, 4, server, timeout=90)
    assert all(r == ((0, 1, 2), [3.0, 3.0], True) for r in res[:3]), res
    first, again = res[3]  # the first process came late or during the forming's agreement: left out either way
    assert "slot 3 was left out while group 'elastic' formed" in first or "came after group" in first, first
    assert "slot 3 came after group 'elastic' had formed without it (members [0, 1, 2])" in again, again
