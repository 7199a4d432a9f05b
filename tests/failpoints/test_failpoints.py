"""Failpoints: the module itself, the host library's points, and the elastic protocol under them.

The matrix (every elastic failpoint x kill/stop/raise x rank 0 and another process) is behind the
``failpoints`` marker; CI runs a rotating slice of it (chosen by the day), the whole of it runs
with ``--runslow`` or ``PYCOLL_TEST_FULL=1``.
"""

from __future__ import annotations

import datetime
import hashlib
import os
import re
import time

import numpy as np
import pytest
from helpers import REPO
from helpers.mp import Died, run_ranks, sweep_segments

import pycoll
import pycoll.elastic
from pycoll import failpoints
from pycoll.elastic import ElasticGroup, Excluded
from pycoll.failpoints import FailpointError

FULL = os.environ.get("PYCOLL_TEST_FULL") == "1"


@pytest.fixture
def server():
    srv = pycoll.TCPStoreServer(token="fp-test").start()
    yield srv.address
    srv.close()


def _store(addr):
    return pycoll.TCPStore(addr[0], addr[1], "fp-test", timeout=30.0)


def _arm(spec, slot):
    """Arm ``spec`` in this process as slot ``slot`` (the host library reads the environment)."""
    os.environ["PYCOLL_FAILPOINTS"] = spec
    os.environ["PYCOLL_RANK"] = str(slot)
    failpoints.configure(spec, rank=slot)


# -- the module ---------------------------------------------------------------------------------


def test_grammar():
    fps = failpoints.parse("elastic.agree.before_vote=kill@2;rank=0, host.*=raise@3+;replacement=any,x=stop")
    assert fps[0] == failpoints.Failpoint("elastic.agree.before_vote", "kill", 2, False, 0, 0)
    assert fps[1] == failpoints.Failpoint("host.*", "raise", 3, True, None, None)
    assert fps[1].matches("host.coll.done") and not fps[1].matches("elastic.commit")
    assert fps[2].action == "stop" and fps[2].nth == 1
    assert failpoints.parse("x=sleep(250)@3;rank=1")[0] == failpoints.Failpoint("x", "sleep", 3, False, 1, 0, None, 250)
    for bad in ("x", "x=explode", "x=kill@0", "x=kill@two", "x=kill;color=1", "=kill", "x=sleep", "x=sleep()",
                "x=sleep(-1)", "x=sleep(1.5)", "x=sleep(MS)",
                # what int() takes and the host library's parser (strtol) drops without a word
                "host.coll.done=note@0_2", "host.coll.done=note@\u0662", "x=kill;rank=0_0", "x=sleep(\u0662)",
                "host.coll.done=note@1++", "x=kill@\u00a01", "x=kill;rank=\u20030", "host.*=note;trace=/" + "t" * 255,
                "x=kill@+0000000000000000000000001", "x=kill@99999999999999999999",
                ",".join(f"host.coll.done=note;rank={r}" for r in range(33))):
        with pytest.raises(ValueError, match="PYCOLL_FAILPOINTS"):
            failpoints.parse(bad)


def test_nth_pass_rank_and_replacement_filters():
    try:
        failpoints.configure("a=raise@2;rank=1,b=raise;rank=0,c=raise@2+,d=raise;replacement=1", rank=1)
        failpoints.hit("a")
        with pytest.raises(FailpointError, match="failpoint a"):
            failpoints.hit("a")
        failpoints.hit("a")  # only the second pass
        failpoints.hit("b")  # another rank's
        failpoints.hit("b", rank=3)
        with pytest.raises(FailpointError):
            failpoints.hit("b", rank=0)  # a call site acting for rank 0 (the launcher)
        failpoints.hit("c")
        for _ in range(3):
            with pytest.raises(FailpointError):
                failpoints.hit("c")
        failpoints.hit("d")  # the original process, not the first replacement
    finally:
        failpoints.reset()
    failpoints.hit("a")


def test_sleep_delays_the_calling_thread_then_goes_on(tmp_path):
    trace = tmp_path / "fired"
    try:
        failpoints.configure(f"a=sleep(200)@2;trace={trace}", rank=0)
        t0 = time.monotonic()
        failpoints.hit("a")
        assert time.monotonic() - t0 < 0.1
        t0 = time.monotonic()
        failpoints.hit("a")  # the second pass sleeps, and raises nothing
        assert time.monotonic() - t0 >= 0.19
    finally:
        failpoints.reset()
    assert trace.read_text().split()[:2] == ["a", "sleep"]


def _host_sleep(rank, n, spec, uid):
    _arm(spec, rank)
    comm = pycoll.init(rank, n, backend="host", unique_id=uid, timeout=5.0)
    times = []
    for _ in range(3):
        x = np.ones(4)
        t0 = time.monotonic()
        comm.all_reduce(x)
        times.append((time.monotonic() - t0, x.tolist()))
    comm.destroy()
    return times


def test_host_failpoint_sleep_makes_a_slow_rank():
    """``host.coll.before_fill=sleep(300)@2`` on rank 1: its second all_reduce (and rank 0's, which waits
    for it) takes 0.3 s, and every result is still exact."""
    uid = bytes(pycoll.get_unique_id(backend="host"))
    res = run_ranks(_host_sleep, 2, "host.coll.before_fill=sleep(300)@2;rank=1", uid, timeout=60)
    for times in res:
        assert [x for _, x in times] == [[2.0] * 4] * 3, res
        assert times[1][0] >= 0.28 and times[0][0] < 0.25 and times[2][0] < 0.25, res


def _host_notes(rank, n, spec, uid):
    _arm(spec, rank)
    comm = pycoll.init(rank, n, backend="host", unique_id=uid, timeout=10.0)
    for _ in range(3):
        comm.all_reduce(np.ones(4))
    comm.destroy()


def test_the_host_library_reads_the_blanks_and_newlines_python_reads(tmp_path):
    # the host library took 'rank = 1' for an unknown filter and dropped it: the failpoint fired in every rank (a
    # kill killed the job); 'note @ 2' armed nothing, and a newline between entries joined them
    done, fill, never = tmp_path / "done", tmp_path / "fill", tmp_path / "never"
    spec = (f" host.coll.done = note @ 2+ ; rank = 1 ; trace = {done} \n"
            f"host.coll.before_fill =note;\trank=0;trace={fill},"
            f"host.coll.done=note;rank=-1;trace={never}")  # no rank is -1 (the library took it for any rank)
    assert len(failpoints.parse(spec)) == 3
    run_ranks(_host_notes, 2, spec, bytes(pycoll.get_unique_id(backend="host")), timeout=60)
    fired = [ln.split() for ln in done.read_text().splitlines()]
    assert [(f[0], f[2], f[4]) for f in fired] == [("host.coll.done", "1", "2"), ("host.coll.done", "1", "3")], fired
    assert [ln.split()[2] for ln in fill.read_text().splitlines()] == ["0"]
    assert not never.exists()


def test_trace_records_each_firing_and_note_only_records(tmp_path):
    trace = tmp_path / "fired"
    try:
        failpoints.configure(f"a=note@2+;trace={trace},b=raise;rank=3;trace={trace}", rank=3)
        for _ in range(3):
            failpoints.hit("a")  # note: never acts
        with pytest.raises(FailpointError):
            failpoints.hit("b")
    finally:
        failpoints.reset()
    pid = os.getpid()
    assert trace.read_text().splitlines() == [f"a note 3 {pid} 2", f"a note 3 {pid} 3", f"b raise 3 {pid} 1"]


def test_off_costs_a_bool_test():
    failpoints.reset()
    t0 = time.perf_counter()
    for _ in range(100_000):
        failpoints.hit("elastic.agree.before_vote")
    assert (time.perf_counter() - t0) / 100_000 < 2e-6


def test_every_host_failpoint_is_in_the_c_sources():
    src = ""
    folder = os.path.join(REPO, "pycoll", "_host")
    for f in os.listdir(folder):
        if f.endswith(".c"):
            src += open(os.path.join(folder, f)).read()
    header = open(os.path.join(folder, "failpoint.h")).read()
    for name in failpoints.HOST_POINTS:
        assert f'"{name}"' in src or name.rsplit(".", 1)[0] in src, name
        assert name in header, name
    assert set(re.findall(r'"(host\.[a-z_.]+)"', src)) <= set(failpoints.HOST_POINTS)


def test_elastic_failpoints_are_declared():
    names = failpoints.declared("elastic.")
    assert len(names) >= 20 and "elastic.grow.before_decision" in names and "elastic.join.request" in names
    assert set(failpoints.declared("store.")) == {"store.request.before", "store.request.after",
                                                  "store.connect.handshake"}


def test_an_entry_naming_no_failpoint_is_warned_about_once():
    """A typo arms nothing: the settings' check (made as a communicator is created) warns with the nearest names."""
    spec = "elastic.agree.befor_vote=kill, host.coll.done=note, store.*=note, nothing*=kill"
    assert failpoints.unknown(failpoints.parse(spec)) == ["elastic.agree.befor_vote", "nothing*"]
    with pytest.warns(UserWarning, match=r"named 'elastic.agree.befor_vote' \(did you mean "
                                         r"'elastic.agree.before_vote'.*'nothing\*'.*arms nothing"):
        _settings_get(spec)
    import warnings
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        _settings_get(spec)  # once per value
        _settings_get("elastic.agree.before_vote=kill;rank=3")


def _settings_get(spec):
    from pycoll import _settings
    return _settings.get("PYCOLL_FAILPOINTS", {"PYCOLL_FAILPOINTS": spec})


def test_the_declaring_modules_are_all_that_declare():
    """failpoints.unknown imports DECLARING_MODULES: with them every module of pycoll that declares a failpoint."""
    import subprocess
    import sys
    folder = os.path.join(REPO, "pycoll")
    declaring = set()
    for root, _, files in os.walk(folder):
        for f in files:
            path = os.path.join(root, f)
            if f.endswith(".py") and f != "failpoints.py" and re.search(r"\bdeclare\(", open(path).read()):
                declaring.add(os.path.relpath(path[:-3], REPO).replace(os.sep, ".").removesuffix(".__init__"))
    assert len(declaring) >= 8
    code = ("import sys, importlib; from pycoll import failpoints as f\n"
            "[importlib.import_module(m) for m in f.DECLARING_MODULES]; print(' '.join(sorted(sys.modules)))")
    loaded = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60,
                            check=True).stdout.split()
    assert declaring <= set(loaded), declaring - set(loaded)


def _host_raise(rank, n, spec, uid):
    _arm(spec, rank)
    comm = pycoll.init(rank, n, backend="host", unique_id=uid, timeout=5.0, on_failure="report")
    out = []
    for _ in range(3):
        x = np.ones(4)
        try:
            comm.all_reduce(x)
            out.append(x.tolist())
        except pycoll.CommFailure as exc:
            out.append(f"failed: {'failpoint host.coll.done' in str(exc)}")
            break
    comm.abort()
    return out


def test_host_failpoint_fails_one_rank_after_the_others_completed():
    """``host.coll.done=raise``: rank 1's all_reduce fails after the data moved; rank 0's succeeds --
    the split outcome that commit() resolves."""
    uid = bytes(pycoll.get_unique_id(backend="host"))
    res = run_ranks(_host_raise, 2, "host.coll.done=raise@2;rank=1", uid, timeout=60)
    assert res[1] == [[2.0] * 4, "failed: True"], res
    assert res[0][:2] == [[2.0] * 4, [2.0] * 4], res


# -- one outcome per step -----------------------------------------------------------------------

LR = 0.01


def _train(group, steps, log, pace=0.0, die=None):
    """The README's loop with commit(): returns the parameters (the same on every survivor)."""
    params, prev = np.zeros(8), np.zeros(8)
    applied = group.last_committed if group.last_committed is not None else -1
    sync = group.joined  # a joiner first receives rank 0's parameters
    step = applied + 1
    while step < steps or sync:
        if die is not None and step >= die:
            os.kill(os.getpid(), 9)
        try:
            if sync:  # a joiner, or every survivor after a reshape
                group.comm.broadcast(params, root=0)
                sync = False
                continue
            grad = np.full(8, step + 1.0)
            group.comm.all_reduce(grad, op="avg")
            prev = params.copy()
            params -= LR * grad
            applied = step
            group.commit(step)
            if group.maybe_grow():
                group.comm.broadcast(params, root=0)
            step += 1
        except pycoll.CommFailure:
            group.reshape()
            agreed = -1 if group.last_committed is None else group.last_committed
            if applied > agreed:
                assert applied == agreed + 1, (applied, agreed)
                params, applied = prev, agreed
                log.append(("rolled back", agreed + 1))
            step, sync = agreed + 1, True  # a joiner among the survivors may not have the parameters yet
            log.append((step, group.generation, group.members))
            log.append(("before the sync", params.tolist()))  # what the rollback alone made of them
        if pace:
            time.sleep(pace)
    return params


def _expected(steps):
    return -LR * sum(range(1, steps + 1))


def _split_outcome(rank, n, addr, spec):
    _arm(spec, rank)
    group = ElasticGroup(_store(addr), rank, n, backend="host", timeout=5.0, name="split")
    log = []
    params = _train(group, 12, log)
    out = dict(params=params.tolist(), members=group.members, log=log)
    group.close()
    return out


@pytest.mark.timeout(120)
def test_one_member_completes_the_failing_step_the_others_do_not(server):
    """Rank 0's 5th collective fails after it moved the data; ranks 1-3 complete it. Every member
    survives, agrees on the step before as the last one done everywhere, the others roll theirs back."""
    res = run_ranks(_split_outcome, 4, server, "host.coll.done=raise@5;rank=0", timeout=90)
    ref = res[0]["params"]
    assert np.allclose(ref, _expected(12)), res[0]
    for r in range(4):
        assert res[r]["params"] == ref, res  # identical bit for bit
        assert res[r]["members"] == (0, 1, 2, 3)
    # ranks 1-3 completed the step rank 0 failed (one may have been revoked before it finished it):
    # those that completed it rolled it back
    rolled = {r: [e for e in res[r]["log"] if e[0] == "rolled back"] for r in range(4)}
    assert rolled[0] == [] and any(rolled[r] for r in (1, 2, 3)), res
    assert len({tuple(rolled[r]) for r in (1, 2, 3) if rolled[r]}) == 1, res
    # identical before rank 0's parameters are sent again too: the rollback, not the sync, made them so
    before = [[e[1] for e in res[r]["log"] if e[0] == "before the sync"] for r in range(4)]
    assert before[0] and all(b == before[0] for b in before), before


@pytest.mark.failpoints
@pytest.mark.timeout(120)
def test_a_member_whose_own_grow_failed_rejoins_the_grown_group(server, tmp_path):
    """Rank 0's ncclCommGrow fails after the others' (and the joiner's) succeeded: it must reshape with them, as
    a member of the grown generation, not go on alone in the old one (a second group next to theirs)."""
    outcome = _run_case(server, "host.grow.end", "raise", 0, str(tmp_path / "fired"))
    assert outcome == "absorbed"  # rank 0 finished with the others, in their membership


# -- the matrix ---------------------------------------------------------------------------------

STEPS, JOIN_AT, JOINER_DIES_AT = 14, 2, 8
JOINER = 4


#: the cases of these failpoints keep every member on the direct store path (pycoll.membership's own
#: points: through node hubs most of them are passed in the hub's process, for the voter it speaks for)
DIRECT = ("elastic.agree.",)


def _node_hub(spec):
    """Whether the members of a case agree through slot 0's node hub (pycoll.nodeagg): all cases but
    the DIRECT ones; PYCOLL_TEST_NODE_HUB=1 or 0 turns the hubs on or off for every case (the
    elastic.node.* cases keep them: their points are the hubs')."""
    forced = os.environ.get("PYCOLL_TEST_NODE_HUB", "")
    if spec.startswith("elastic.node.") or forced == "1":
        return True
    return forced != "0" and not spec.startswith(DIRECT)


def _scenario(rank, n, addr, spec):
    """Slots 0-3 form, train, admit slot 4 at step 2 (a joiner), slot 4 dies at step 8 (the others
    reshape): every window of the protocol is passed once; ``spec`` adds a failure somewhere."""
    _arm(spec, rank)
    log: list = []
    hub = _node_hub(spec)
    try:
        store = _store(addr)  # store.connect.handshake raises here
        if rank == JOINER:
            deadline = time.monotonic() + 20
            while not store.check(["fp/go-join"]) and time.monotonic() < deadline:
                time.sleep(0.01)
            try:
                group = ElasticGroup(store, JOINER, joiner=True, backend="host", timeout=4.0, window=1.0,
                                     name="fp", join_timeout=15.0, node_hub=hub)
            except (Excluded, pycoll.StoreTimeout) as exc:
                return ("not joined", str(exc))
            _train(group, STEPS, log, pace=0.01, die=JOINER_DIES_AT)
            # admitted at the members' last step, it had no step left to die at: it closes with them
            group.close()
            return ("joiner finished",)
        group = ElasticGroup(store, rank, 4, backend="host", timeout=4.0, window=1.0, name="fp", node_hub=hub)
        params, prev = np.zeros(8), np.zeros(8)
        applied, step, grew, sync = -1, 0, False, False
        grow_deadline = None
        while step < STEPS or sync:
            try:
                if sync:  # after a reshape: the joiner may be a member without the parameters yet
                    group.comm.broadcast(params, root=0)
                    sync = False
                    continue
                grad = np.full(8, step + 1.0)
                group.comm.all_reduce(grad, op="avg")
                prev = params.copy()
                params -= LR * grad
                applied = step
                group.commit(step)
                if step == JOIN_AT and not grew:
                    if group.rank == 0:
                        store.set("fp/go-join", b"1")
                    grow_deadline = grow_deadline or time.monotonic() + 4.0
                    # wait here for the joiner (every member calls maybe_grow in step)
                    flag = np.zeros(1)
                    while True:
                        if group.maybe_grow():
                            grew = True
                            group.comm.broadcast(params, root=0)
                            break
                        flag[0] = 1.0 if time.monotonic() > grow_deadline else 0.0
                        group.comm.all_reduce(flag, op="max")
                        if flag[0]:
                            break
                        time.sleep(0.02)
                elif group.maybe_grow():
                    group.comm.broadcast(params, root=0)
                step += 1
            except pycoll.CommFailure:
                group.reshape()
                agreed = -1 if group.last_committed is None else group.last_committed
                if applied > agreed:
                    params, applied = prev, agreed
                step, sync = agreed + 1, True
                log.append((step, group.generation, group.members))
            time.sleep(0.01)
        out = dict(params=params.tolist(), members=group.members, log=log, generation=group.generation)
        group.close()
        return out
    except FailpointError as exc:
        return ("raised", str(exc))
    except Excluded as exc:
        return ("excluded", str(exc))


#: cases no scenario reaches, by construction: slot 0 is every agreement's first coordinator (it never
#: takes over) and the lowest slot of the host, whose process holds the node hub (it loses its hub only
#: with itself)
UNREACHABLE = {("elastic.agree.takeover", 0), ("elastic.node.fallback", 0)}

#: points that only rank 0, the coordinator or the node hub's process passes: on slot 1, slot 0 first
#: dies (at its first commit), and slot 1 has that part from the reshape on
SLOT0_ROLES = ("elastic.agree.before_decision", "elastic.grow.admit", "elastic.node.watch", "elastic.node.collect",
               "elastic.node.forward", "elastic.node.fanout")


def _second_failure(name, victim):
    """(a second failpoint, the slots it takes out): what puts the victim where ``name`` is passed."""
    if name == "elastic.agree.takeover":
        # the coordinator (slot 0) votes last (its vote is late), so it is the one to decide, and dies
        # about to: the victim, waiting for its decision, takes over
        return "elastic.agree.vote=sleep(300);rank=0,elastic.agree.before_decision=kill;rank=0", (0,)
    if name == "elastic.agree.wait":
        # slot 2's vote comes 300 ms late: it decides, and the victim waits for the decision (or, as the
        # coordinator, for the votes) meanwhile -- a member whose own vote completed the set waits for nothing
        return "elastic.agree.vote=sleep(300);rank=2", ()
    if name.startswith("elastic.watcher."):
        # slot 2 dies between two steps while the victim is slow (it sleeps 1.5 s in the same step's
        # commit): the others' collective fails and they reshape; the victim, in no collective, learns
        # it from its watcher, which fails at the point
        return f"elastic.commit=kill@5;rank=2,elastic.commit=sleep(1500)@5;rank={victim}", (2,)
    if name == "elastic.node.fallback":
        # the hub's process (slot 0) dies while it collects the votes: the others agree through the store
        return "elastic.node.collect=kill;rank=0", (0,)
    if name == "elastic.uid.before_publish" and victim != 0:
        # a fresh communicator's rank 0 publishes its id: slot 0 dies inside the shrink (at the joiner's
        # death), and the next attempt is an init of slots 1-3, whose rank 0 is the victim
        return "host.shrink.begin=kill;rank=0", (0,)
    if name in SLOT0_ROLES and victim != 0:
        return "elastic.commit=kill@1;rank=0", (0,)
    return "", ()


#: points the scenario does not pass, and where else a rank is killed or stopped there
ELSEWHERE = {"elastic.close.gone": "a member gone at close(): tests/elastic/test_elastic.py kills another one there",
             "elastic.grow.failed": "a joiner lost inside the grow: tests/elastic/test_elastic.py kills a member "
                                    "there (test_a_joiner_lost_inside_the_grow_costs_no_timeout)",
             "elastic.form.mark_lost": "a slot left out while the group forms: tests/elastic/test_elastic.py kills "
                                       "rank 0 there (test_a_slot_stopped_while_the_group_forms_is_left_out_...)",
             "elastic.join.nobody_left": "every member gone while replacements wait: tests/elastic/test_elastic.py "
                                         "kills and stops a replacement there (test_replacements_of_a_group_whose_...)"}


def _cases():
    names = [n for n in failpoints.declared("elastic.") if n not in ELSEWHERE]
    out = []
    for name in names:
        victims = [JOINER] if name.startswith("elastic.join.") else [0, 1]
        for action in ("kill", "stop", "raise"):
            for victim in victims:
                if (name, victim) not in UNREACHABLE:
                    out.append((name, action, victim))
    return out


CASES = _cases()


def _ci_slice(cases, k=4):
    """A rotating slice: k cases, chosen by the day (every case comes up within a few weeks)."""
    day = datetime.date.today().toordinal()
    ranked = sorted(cases, key=lambda c: hashlib.sha1(f"{day}{c}".encode()).hexdigest())
    return set(ranked[:k])


SLICE = _ci_slice(CASES)


def _check(res, victim, case, fired=True, also=()):
    """The outcome of a case: "not reached" when its failpoint never fired (``fired``: the trace),
    else "fired" (the victim is out) or "absorbed" (it finished with the others); asserts that the
    survivors finished with the exact, identical parameters and members. ``also``: slots that a
    second failpoint of the case takes out."""
    if not fired:
        return "not reached"
    finishers = {r: v for r, v in enumerate(res) if isinstance(v, dict)}
    for r in range(4):
        if r != victim and r not in also:
            assert r in finishers, (case, r, res)
    ref = finishers[min(finishers)]["params"]
    assert np.allclose(ref, _expected(STEPS)), (case, res)
    for v in finishers.values():
        assert v["params"] == ref, (case, res)
        assert v["members"] == finishers[min(finishers)]["members"], (case, res)
    final = finishers[min(finishers)]["members"]
    if victim not in finishers and victim in final:
        # the victim took part until the end (the failure was absorbed) and was still closing when
        # the others had reported: run_ranks ends such a rank
        assert isinstance(res[victim], Died) and res[victim].exitcode is None, (case, res)
        return "absorbed"
    return "fired" if victim not in finishers else "absorbed"


def _run_case(server, name, action, victim, trace, nth=1, extra="", also=()):
    spec = f"{name}={action}@{nth};rank={victim};trace={trace}" + (f",{extra}" if extra else "")
    try:
        res = run_ranks(_scenario, 5, server, spec, timeout=75, may_die=sorted({victim, JOINER, *also}))
    finally:  # a joiner that run_ranks ends while it still tries to join leaves its rendezvous's segment
        sweep_segments()
    fired = os.path.exists(trace) and any(line.startswith(name + " ") for line in open(trace))
    return _check(res, victim, (name, action, victim), fired, also)


@pytest.mark.failpoints
@pytest.mark.timeout(120)
@pytest.mark.parametrize("name,action,victim", CASES, ids=[f"{n}-{a}-r{v}" for n, a, v in CASES])
def test_failpoint_matrix(server, name, action, victim, request, tmp_path):
    if (name, action, victim) not in SLICE and not (FULL or request.config.getoption("--runslow")):
        pytest.skip("not in today's slice of the failpoint matrix (--runslow or PYCOLL_TEST_FULL=1: all)")
    extra, also = _second_failure(name, victim)
    outcome = _run_case(server, name, action, victim, str(tmp_path / "fired"), extra=extra, also=also)
    _report(name, action, victim, outcome)
    assert outcome != "not reached", f"{name} was not reached on slot {victim} in the scenario"


def _report(name, action, victim, outcome):
    path = os.environ.get("PYCOLL_FP_MATRIX_OUT")
    if path:
        with open(path, "a") as f:
            f.write(f"{name} {action} {victim} {outcome}\n")


@pytest.mark.failpoints
@pytest.mark.timeout(120)
def test_no_failure_baseline(server):
    res = run_ranks(_scenario, 5, server, "", timeout=75, may_die=[JOINER])
    assert _check(res, JOINER, "baseline") == "fired"
    assert res[0]["generation"] == 2 and res[0]["members"] == (0, 1, 2, 3), res[0]


# -- the matrix, part 2: the host library, the store client and the liveness checker -------------

#: the second failpoint of a case whose point is passed only while a peer is frozen: rank 2 stops
#: in its 20th collective, the liveness checker of the others finds it
STOP2 = "host.coll.before_fill=stop@20;rank=2"

#: name -> (the pass at which it fires, the victims, a second failpoint, the slots that one takes out).
#: host.init.*: the pass of the group's forming (its second is the shrink's child, host.shrink.* cover
#: that window); host.shrink.*: after the joiner's death at step 8; host.grow.*: admitting the joiner;
#: host.coll.* and store.request.*: in the middle of the training steps.
POINTS_2 = {
    "host.init.begin": (1, (0, 1), "", ()),
    "host.init.end": (1, (0, 1), "", ()),
    "host.grow.begin": (1, (0, 1, JOINER), "", ()),
    "host.grow.end": (1, (0, 1, JOINER), "", ()),
    "host.shrink.begin": (1, (0, 1), "", ()),
    "host.shrink.end": (1, (0, 1), "", ()),
    "host.coll.before_fill": (20, (0, 1), "", ()),
    "host.coll.after_arrive": (20, (0, 1), "", ()),
    "host.coll.done": (20, (0, 1), "", ()),
    "store.request.before": (20, (0, 1), "", ()),
    "store.request.after": (20, (0, 1), "", ()),
    # a rank's first connection to the store, as it starts
    "store.connect.handshake": (1, (0, 1), "", ()),
    "watchdog.liveness.check": (1, (0, 1), STOP2, (2,)),
    "watchdog.liveness.found": (1, (0, 1), STOP2, (2,)),
    # the joiner's death at step 8 makes the members ask each other for dumps and await the answers
    "watchdog.request.answer": (1, (0, 1), "", ()),
    "watchdog.report.await_answers": (1, (0, 1), "", ()),
    "watchdog.report.begin": (1, (0, 1), "", ()),
    # the store thread's first look at the dump requests, as the group forms
    "watchdog.request.first_look": (1, (0, 1), "", ()),
    # the first progress record, written as the group's communicator is made
    "watchdog.progress.created": (1, (0, 1), "", ()),
}


def _cases_2():
    return [(name, action, victim) for name, (_, victims, _, _) in POINTS_2.items()
            for action in ("kill", "stop", "raise") for victim in victims]


CASES_2 = _cases_2()
SLICE_2 = _ci_slice(CASES_2, k=2)


def test_matrix_2_covers_every_point_the_scenario_passes():
    import pycoll.diagnostics.liveness  # declares watchdog.*
    import pycoll.store  # noqa: F401  (declares store.*)

    scenario = [n for n in failpoints.declared() if n.startswith(("host.", "store.", "watchdog."))]
    # host.window.exchange and host.signal.wait: the scenario registers no window and waits on no
    # signal (tests/runtime/test_windows.py kills and fails ranks there); host.coll.after_consume:
    # passed only by the two-phase path of large reductions, which the scenario's 8-element
    # all_reduce does not take (every case of it was "not reached"); host.coll.window: only a collective over
    # windows (tests/host/test_window_collectives.py kills, stops and fails ranks there); host.coll.eager: only a small
    # rooted collective, which the scenario does not make (tests/host/test_eager_rooted.py kills and stops a root
    # there); host.coll.check_waited: only where a waiting collective finds a rank other than the one it waits for
    # late as well, which the scenario's ranks may or may not be (tests/host/test_eager_rooted.py holds a root there
    # while a sender sends and leaves); host.wait.check_peer: only where a waiter gets to yield or sleep, which the
    # scenario's ranks may or may not (tests/host/test_eager_rooted.py holds a root there while the sender it waits
    # for sends and leaves); host.wait.brief: only where a communicator's waits for its peers mostly slept of late,
    # which the scenario's need not (tests/host/test_yield_adapt.py kills and stops a rank there);
    # watchdog.report.signal_peer (only with PYCOLL_FR_DUMP_SIGNAL) and watchdog.exit.* (a rank leaving with an
    # operation outstanding): tests/diagnostics/test_exit_dumps.py kills and stops ranks there; host.stream.defer: only
    # where the ranks outnumber the CPUs, which the scenario's ranks do not (tests/runtime/test_oversubscribed.py);
    # host.stream.handback: only where a peer is later than PYCOLL_HOST_INLINE_NS, and host.stream.takeover: only where
    # the thread that handed work back does not come back for it within PYCOLL_HOST_DEFER_NS
    # (tests/runtime/test_inline_bound.py); host.stream.full: only where a stream holds PYCOLL_HOST_STREAM_DEPTH
    # operations not begun (tests/runtime/test_stream_depth.py); host.stream.order: only where a communicator's
    # operation goes to another stream than the one before it, which the scenario's do not
    # (tests/host/test_stream_order.py kills, stops and fails a rank there); watchdog.records.forget: only
    # PYCOLL_WATCHDOG_RECORDS_KEEP (120 s) after a communicator failed or was aborted
    # (tests/diagnostics/test_watchdog_ranks.py kills a rank there); watchdog.dump.write: the scenario's ranks write
    # their held dumps as they end, or not (tests/diagnostics/test_exit_dumps.py holds the monitor thread there while
    # its process ends); watchdog.peer_states.read: only a finalize or destroy that timed out
    # (tests/diagnostics/test_watchdog_ranks.py kills and fails a rank there)
    assert set(scenario) - set(POINTS_2) == {"host.window.exchange", "host.signal.wait", "host.coll.after_consume",
                                             "host.coll.window", "host.coll.eager", "host.coll.check_waited",
                                             "host.wait.check_peer", "host.wait.brief", "host.stream.defer",
                                             "host.stream.handback", "host.stream.takeover", "host.stream.full",
                                             "host.stream.order",
                                             "watchdog.report.signal_peer", "watchdog.exit.before_dump",
                                             "watchdog.exit.terminate", "watchdog.exit.deferred_sigterm",
                                             "watchdog.records.forget", "watchdog.dump.write",
                                             "watchdog.peer_states.read"}, scenario


@pytest.mark.failpoints
@pytest.mark.timeout(120)
@pytest.mark.parametrize("name,action,victim", CASES_2, ids=[f"{n}-{a}-r{v}" for n, a, v in CASES_2])
def test_failpoint_matrix_2(server, name, action, victim, request, tmp_path):
    if (name, action, victim) not in SLICE_2 and not (FULL or request.config.getoption("--runslow")):
        pytest.skip("not in today's slice of the failpoint matrix (--runslow or PYCOLL_TEST_FULL=1: all)")
    nth, _, extra, also = POINTS_2[name]
    outcome = _run_case(server, name, action, victim, str(tmp_path / "fired"), nth, extra, also)
    _report(name, action, victim, outcome)
    if outcome == "not reached" and name == "watchdog.liveness.found":
        # a race, not a gap: the first member whose checker finds rank 2 frozen fails the
        # communicator, and the others leave the collective before their checker looks
        pytest.skip("another member's liveness checker found the frozen rank first")
    assert outcome != "not reached", (name, action, victim)


@pytest.mark.timeout(60)
def test_the_launcher_leaves_the_names_a_program_declares_to_its_ranks(tmp_path):
    """A failpoint the user's program declares (declare is public) fired, and pycoll-run said it armed nothing."""
    import subprocess
    import sys
    script = tmp_path / "prog.py"
    script.write_text("import pycoll\nfrom pycoll import failpoints as f\nf.declare('myapp.train.step')\n"
                      "c = pycoll.init(backend='host')\nf.hit('myapp.train.step')\nc.destroy()\n")
    env = dict(os.environ, PYCOLL_FAILPOINTS="myapp.train.step=note;trace=" + str(tmp_path / "trace"))
    out = subprocess.run([sys.executable, "-m", "pycoll.launch.launcher", "-n", "1", str(script)], env=env,
                         capture_output=True, text=True, timeout=50)
    assert out.returncode == 0 and "no failpoint is named" not in out.stderr, out.stderr
    assert (tmp_path / "trace").read_text().startswith("myapp.train.step note 0 ")
