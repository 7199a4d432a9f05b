"""The watchdog in this process: deadline-aligned polling, the stall monitor, bounded failure handling,
the failure line, the store exchange, configuration. (Multi-rank scenarios: test_watchdog_ranks.py.)"""

from __future__ import annotations

import logging
import os
import pickle
import signal
import socket
import threading
import time
import types

import numpy as np
import pytest
from helpers.fakes import FakeComm

from pycoll import flight_recorder as fr, watchdog as wdm
from pycoll.diagnostics import watchdog as watchdog_mod
from pycoll.diagnostics.records import FailureRecord, ProgressRecord
from pycoll.diagnostics.report import FailureReport
from pycoll.diagnostics.signals import signal_number
from pycoll.errors import CommTimeout
from pycoll.store import MemoryStore


def _wait_for(cond, timeout):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if cond():
            return True
        time.sleep(0.01)
    return cond()


class Watched(FakeComm):
    """A FakeComm the watchdog can poll: ``check`` is recorded (and may block once)."""

    def __init__(self, *a, block_first_check=0.0, **kw):
        super().__init__(*a, **kw)
        self._block = block_first_check

    def check(self, now=None):
        self.checks.append(time.monotonic())
        if self._block:
            block, self._block = self._block, 0.0
            time.sleep(block)


@pytest.fixture
def make_wd(tmp_path):
    made = []

    def make(comms, **kw):
        rec = kw.pop("recorder", None) or fr.FlightRecorder(16, dump_dir=str(tmp_path))
        wd = wdm.Watchdog(rec, enabled=True, communicators=lambda: list(comms), **kw)
        made.append(wd)
        return wd

    yield make
    for wd in made:
        wd.stop()


def test_polls_at_the_earliest_deadline_not_the_interval(make_wd):
    rec = fr.FlightRecorder(16)
    c = Watched(rec, 0, 2)
    t0 = time.monotonic()
    w = c.op("all_reduce", np.ones(1, np.float32), np.ones(1, np.float32), state="started", timeout=0.3)
    w.t0 = t0
    wd = make_wd([c], interval=5.0, recorder=rec)
    wd.start()
    assert _wait_for(lambda: any(t > t0 + 0.3 for t in c.checks), 3.0)
    late = min(t for t in c.checks if t > t0 + 0.3) - (t0 + 0.3)
    assert late < 1.0  # with a 5 s interval only the deadline can have woken it
    assert wd.status()["running"] and wd.beats >= 2


def test_an_operation_wakes_the_polling_thread_only_while_one_runs(make_wd):
    """``work_enqueued`` sets the polling thread's wake-up only when one runs to be woken: without it (never
    started, stopped, PYCOLL_WATCHDOG=0) it costs no Event.set() per operation, which is Python code."""
    rec = fr.FlightRecorder(16)
    c = Watched(rec, 0, 2)
    wd = make_wd([c], interval=5.0, recorder=rec)
    w = c.op("all_reduce", np.ones(1, np.float32), np.ones(1, np.float32), state="started", timeout=0.3)
    wd._poll_wake.clear()  # (configure() sets it for a thread that may run)
    wd.work_enqueued(w)
    assert not wd._poll_wake.is_set()  # never started
    wd.start()
    assert _wait_for(lambda: wd._wake_at > 0, 3.0)  # asleep until its 5 s round
    wd.work_enqueued(w)  # due in 0.3 s: before the round
    assert wd._poll_wake.is_set() or wd._wake_at == 0  # set, or already awake and cleared it
    wd.stop()
    wd._poll_wake.clear()
    wd.work_enqueued(w)
    assert not wd._poll_wake.is_set()  # stopped


class SlowScan(Watched):
    """Its check lets the issuing thread run meanwhile (the GIL released), as a contended lock or a slow event query
    does."""

    def check(self, now=None):
        super().check(now)
        time.sleep(0.002)


def test_operations_issued_during_a_scan_do_not_keep_the_polling_thread_scanning(make_wd):
    """An operation issued while the polling thread scans leaves its deadline for the thread to read before it sleeps;
    it does not wake it: woken by each, the thread scanned again at once, never slept under a steady stream of
    operations (one round per scan: 51 in half a second here with the old hook) and took the GIL from the issuing
    thread."""
    rec = fr.FlightRecorder(16)
    c = SlowScan(rec, 0, 2)
    w = c.op("all_reduce", np.ones(1, np.float32), np.ones(1, np.float32), state="started", timeout=30.0)
    wd = make_wd([c], interval=0.1, recorder=rec)
    wd.start()
    assert _wait_for(lambda: wd.beats >= 1, 3.0)
    b0, t0 = wd.beats, time.monotonic()
    while time.monotonic() - t0 < 0.5:
        wd.work_enqueued(w)  # operations issued back to back, each due in 30 s: after the next round
    rounds = wd.beats - b0
    assert rounds <= 12, rounds  # one round per 0.1 s interval (5 here)


def test_an_operation_issued_during_a_scan_is_checked_at_its_deadline(make_wd):
    """The deadline an operation issued during a scan leaves behind wakes the thread (its interval is 5 s), also
    where the scan could not see the operation itself (here: of a communicator the watchdog had not listed)."""
    rec = fr.FlightRecorder(16)
    c = Watched(rec, 0, 2)
    other = Watched(rec, 0, 2)
    wd = make_wd([c], interval=5.0, recorder=rec)
    wd.start()
    assert _wait_for(lambda: wd._wake_at > 0, 3.0)  # its first round done: asleep until the next, 5 s later
    n = len(c.checks)
    c._block = 0.5
    wd._poll_wake.set()  # a round now, whose scan takes 0.5 s
    assert _wait_for(lambda: len(c.checks) > n, 3.0)
    time.sleep(0.05)  # scanning: its round began before the operation below was issued
    t0 = time.monotonic()
    w = other.op("all_reduce", np.ones(1, np.float32), np.ones(1, np.float32), state="started", timeout=1.0)
    wd.work_enqueued(w)
    assert _wait_for(lambda: any(t > t0 + 1.0 for t in c.checks), 4.0)
    late = min(t for t in c.checks if t > t0 + 1.0) - (t0 + 1.0)
    assert late < 0.5, late  # at its deadline, not at the next 5 s round


def test_stalled_polling_thread_is_reported_and_dumped(make_wd, caplog):
    rec = fr.FlightRecorder(16)
    c = Watched(rec, 0, 2, block_first_check=1.2)
    wd = make_wd([c], interval=0.05, stall_timeout=0.3, recorder=rec)
    with caplog.at_level(logging.WARNING, logger="pycoll"):
        wd.start()
        assert _wait_for(lambda: any("has not completed a round" in r.getMessage() for r in caplog.records), 5.0)
        assert _wait_for(lambda: any("running again" in r.getMessage() for r in caplog.records), 5.0)
    msg = next(r.getMessage() for r in caplog.records if "has not completed a round" in r.getMessage())
    assert "checking communicator 'world'" in msg and "in check" in msg  # what it was doing, and its stack
    assert _wait_for(lambda: rec.last_dump is not None, 2.0) and rec.last_dump["trigger"] == "stall"


def test_an_idle_polling_thread_sleeping_its_interval_is_no_stall(make_wd, caplog):
    # an interval of at least the stall timeout (PYCOLL_WATCHDOG_INTERVAL=20, the default 15 s) reported the idle
    # thread's own sleep as a stall, and dumped, over and over
    rec = fr.FlightRecorder(16)
    c = Watched(rec, 0, 2)
    wd = make_wd([c], interval=1.0, stall_timeout=0.3, recorder=rec)
    with caplog.at_level(logging.WARNING, logger="pycoll"):
        wd.start()
        time.sleep(2.5)
    assert not [r.getMessage() for r in caplog.records if "has not completed a round" in r.getMessage()]
    assert rec.last_dump is None


class HangingStore(MemoryStore):
    def set(self, key, value):
        time.sleep(1.5)
        super().set(key, value)


class SlowRecorder(fr.FlightRecorder):
    def dump(self, *a, **kw):
        time.sleep(1.5)
        return super().dump(*a, **kw)


def test_failure_handling_is_bounded_and_never_waits_for_the_dump(make_wd, tmp_path, caplog):
    rec = SlowRecorder(16, dump_dir=str(tmp_path))
    c = Watched(rec, 0, 4, store=HangingStore())
    w = c.op("all_reduce", np.ones(1, np.float32), np.ones(1, np.float32), state="started", timeout=1.0)
    wd = make_wd([], report_timeout=0.3, dump_timeout=0.3, recorder=rec)
    wd.start()
    exc = CommTimeout("all_reduce timed out", comm_name="world", op="all_reduce", seq=1, elapsed=1.0, timeout=1.0)
    with caplog.at_level(logging.ERROR, logger="pycoll.watchdog"):
        t = time.monotonic()
        wd.comm_failed(c, exc, w)
        took = time.monotonic() - t
    assert took < 0.3 + 0.5  # the store's bound; the 1.5 s dump is written by the monitor thread meanwhile
    lines = [r.getMessage() for r in caplog.records if r.name == "pycoll.watchdog"]
    assert len(lines) == 1
    assert "the store did not answer within 0.3 s" in lines[0] and "all_reduce #1" in lines[0]
    assert rec.last_dump is None and not wd.wait_for_dumps(0.1)
    assert wd.wait_for_dumps(5.0) and rec.last_dump["trigger"] == "failure"


def _started_watchdog_and_op(make_wd, tmp_path, dump_hold):
    """A running watchdog with its own recorder, and an outstanding operation to fail."""
    rec = fr.FlightRecorder(16, dump_dir=str(tmp_path))
    c = Watched(rec, 0, 2)
    w = c.op("all_reduce", np.ones(1, np.float32), np.ones(1, np.float32), state="started", timeout=1.0)
    wd = make_wd([], recorder=rec, dump_hold=dump_hold)
    wd.start()
    return rec, c, w, wd


def test_dump_gate_holds_failure_dumps_until_it_opens(make_wd, tmp_path):
    rec, c, w, wd = _started_watchdog_and_op(make_wd, tmp_path, 30.0)
    open_ = []
    token = wd.add_dump_gate(lambda: bool(open_))
    wd.comm_failed(c, RuntimeError("remote process exited"), w)  # not a timeout: reported after the policy
    time.sleep(0.3)
    assert rec.last_dump is None  # held: neither the report nor the dump has run
    wd.dump("by hand")  # a manual dump is never held
    assert rec.last_dump["trigger"] == "manual"
    open_.append(1)
    wd.release_dumps()
    assert _wait_for(lambda: rec.last_dump["trigger"] == "failure", 3.0)
    wd.remove_dump_gate(token)


def test_a_failure_dump_held_through_a_reshape_goes_to_the_failed_generation(make_wd, tmp_path):
    # recording off: the failed generation-0 communicator was closed and generation 1 made while the gate held the
    # dump; the dump went to generation_1/ only, generation 0's failure in no dump of its own generation
    rec = fr.FlightRecorder(0, dump_dir=str(tmp_path))
    old = Watched(rec, 0, 3)
    w = old.op("all_reduce", np.ones(1, np.float32), np.ones(1, np.float32), state="started", timeout=1.0)
    wd = make_wd([], recorder=rec, dump_hold=30.0)
    wd.start()
    open_ = []
    token = wd.add_dump_gate(lambda: bool(open_))
    exc = RuntimeError("remote process exited")
    for observer in (rec, wd):  # as a communicator tells its observers
        observer.comm_failed(old, exc, w)
    time.sleep(0.2)
    assert rec.last_dump is None  # held
    old.state = "aborted"
    rec.comm_closed(old)
    del old, w
    new = Watched(rec, 0, 2, uid="fedcba9876543210", generation=1)
    new.op("all_reduce", np.ones(1, np.float32), np.ones(1, np.float32))
    open_.append(1)
    wd.release_dumps()
    assert _wait_for(lambda: rec.last_dump is not None and rec.last_dump["trigger"] == "failure", 3.0)
    wd.remove_dump_gate(token)
    path = os.path.join(tmp_path, "generation_0", f"{fr.DEFAULT_FILE_PREFIX}0")
    assert os.path.exists(path), os.listdir(tmp_path)
    with open(path, "rb") as f:
        dump = pickle.load(f)
    assert [f["message"] for f in dump["pycoll"]["failures"]] == ["remote process exited"], dump["pycoll"]["failures"]
    assert list(dump["pycoll"]["comms"]) == ["0123456789abcdef"]


def test_dump_hold_is_bounded_and_exit_writes_held_dumps(make_wd, tmp_path):
    rec, c, w, wd = _started_watchdog_and_op(make_wd, tmp_path, 0.5)
    wd.add_dump_gate(lambda: False)
    t0 = time.monotonic()
    wd.comm_failed(c, RuntimeError("remote process exited"), w)
    assert _wait_for(lambda: rec.last_dump is not None, 5.0)
    assert 0.5 <= time.monotonic() - t0 < 1.0 + 0.5  # held for dump_hold (from the failure), then written anyway
    w2 = c.op("all_reduce", np.ones(1, np.float32), np.ones(1, np.float32), state="started", timeout=1.0)
    wd.comm_failed(c, RuntimeError("again"), w2)
    assert wd.wait_for_dumps(5.0) and rec.dump_count == 2  # what exit does: write held dumps now


def test_the_failing_thread_does_not_format_the_issuing_stack(make_wd, tmp_path, monkeypatch):
    """A remote failure is reported after the policy acts: the failing thread only keeps the recorded
    stack, and the report thread formats it (once) for the line and the record."""
    rec = fr.FlightRecorder(16, dump_dir=str(tmp_path))
    c = Watched(rec, 0, 2, store=MemoryStore())  # with a store: the report follows in the report thread
    w = c.op("all_reduce", np.ones(1, np.float32), np.ones(1, np.float32), state="started", timeout=1.0)
    wd = make_wd([], recorder=rec, dump_hold=30.0, abort_grace=0.0)
    wd.start()
    threads = []
    real = watchdog_mod.format_issue

    def spy(record):
        threads.append(threading.current_thread().name)
        return real(record)

    monkeypatch.setattr(watchdog_mod, "format_issue", spy)
    open_ = []
    wd.add_dump_gate(lambda: bool(open_))
    wd.comm_failed(c, RuntimeError("remote process exited"), w)
    assert threads == []
    open_.append(1)
    wd.release_dumps()
    assert wd.wait_for_dumps(5.0)
    assert len(threads) == 1 and threads[0] != threading.current_thread().name, threads
    (report,) = rec._failures[c.generation]
    assert report["site"] == rec.issued_at(w)[0] and report["site"]  # the test's own line


def test_a_report_formats_its_site_when_first_asked():
    calls = []

    def site():
        calls.append(1)
        return "x.py:3 in f", "Float(2,)"

    rec = fr.FlightRecorder(8)
    c = FakeComm(rec, 0, 2)
    w = c.op("all_reduce", np.ones(2, np.float32), np.ones(2, np.float32), state="started", timeout=2.0)
    r = FailureReport(c, RuntimeError("remote"), w, site)
    assert calls == []
    assert (r.site, r.sizes) == ("x.py:3 in f", "Float(2,)") and r.as_dict(1.0)["site"] == "x.py:3 in f"
    assert calls == [1]


def test_a_report_names_the_other_communicators_operations_its_group_ends_with():
    # a group holding operations of tp and dp ends as one: tp's operation timed out waiting for dp's, and its report
    # said "no rank is behind" of tp alone, which blamed nothing (the healthy communicator was the one aborted)
    import pycoll

    tp = pycoll.init(0, 1, backend="host", name="tp")
    dp = pycoll.init(0, 1, backend="host", name="dp")
    try:
        with tp.group():
            wa = tp.all_reduce(np.ones(2, np.float32), async_op=True)
            wb = dp.all_reduce(np.ones(2, np.float32), async_op=True)
        wa.wait()
        wb.wait()
        exc = CommTimeout("timed out", comm_name="tp", op="all_reduce", seq=1, elapsed=3.0, timeout=3.0)
        r = FailureReport(tp, exc, wa)
        r.peers, r.seq = {}, 1
        held = "(its group held operations of other communicators too, which the library ends with it: "
        assert held + "all_reduce #1 on 'dp')" in r.line(1.0)
        with tp.group():  # one communicator's group: nothing of the kind
            wc = tp.all_reduce(np.ones(2, np.float32), async_op=True)
        wc.wait()
        assert "other communicators" not in FailureReport(tp, exc, wc).line(1.0)
    finally:
        tp.destroy()
        dp.destroy()


def _report(peers, *, seq=5, failures=None, is_p2p=False, peer=None, answered=(), op=None):
    rec = fr.FlightRecorder(8)
    c = FakeComm(rec, 0, 4, uid="feedbeef")
    c.coll_seq = seq - 1
    op = op or ("send" if is_p2p else "all_reduce")
    w = c.op(op, np.ones(2, np.float32), None if is_p2p else np.ones(2, np.float32),
             state="started", peer=peer, timeout=2.0)
    issued_at = rec.issued_at(w)
    exc = CommTimeout("timed out", comm_name="world", op=w.op, seq=seq, elapsed=2.05, timeout=2.0)
    w.t0 = time.monotonic() - 2.05  # 2.05 s as the report reads it next, also on a busy machine (it read 2.06)
    r = FailureReport(c, exc, w, issued_at)
    now = time.time_ns()
    r.peers = {k: {"coll_enqueued": v[0], "coll_started": v[1], "coll_completed": v[1], "p2p_enqueued": v[2],
                   "p2p_completed": v[2], "state": "active", "time_ns": now - int(v[3] * 1e9), "beats": 1,
                   "origin": "h:1", "request": 1 if k in answered else -1} for k, v in peers.items()}
    r.request = 1  # the dump request this report made; ranks in `answered` answered it
    r.peer_failures = {k: FailureRecord("RemoteError", "peer failed", "all_reduce", int(v.split("#")[1].split()[0]),
                                        elapsed=float(v.split("after ")[1].split()[0]))
                       for k, v in (failures or {}).items()}
    return r


def test_failure_line_names_the_ranks_behind():
    r = _report({1: (5, 4, 0, 0.2), 2: (5, 4, 0, 0.3), 3: (4, 4, 0, 2.6)})
    line = r.line(1.75)
    assert line.startswith("pycoll watchdog: CommTimeout on communicator 'world' (uid feedbeef, generation 0) rank 0/4")
    assert "all_reduce #5 [Float(2,)] not completed after 2.05 s (timeout 2 s, state started)" in line
    assert "behind: rank 3 (last reported #4 2.6 s ago: stopped, hung or dead)" in line
    assert "also in #5: ranks 1, 2" in line and line.endswith("policy: abort")
    assert "issued at " in line and "fakes.py:" in line  # the innermost frame outside pycoll (FakeComm.op)
    d = r.as_dict(1.75)
    assert d["behind"]["3"]["last_issued"] == 4 and d["in_op"] == [1, 2] and "3" in d["silent"]


def test_failure_line_gives_every_rank_its_global_rank_where_they_differ():
    # a reversed split: "also in", "never reported", "silent" and "failed too" gave the communicator's ranks bare,
    # beside "behind" giving the job's: rank 0 seemed both behind and in the operation
    r = _report({1: (5, 4, 0, 0.2), 2: (5, 4, 0, 3.0)}, failures={1: "RemoteError in all_reduce #5 after 1.0 s"})
    r.global_ranks = [3, 2, 1, 0]
    line = r.line(1.75)
    assert "also in #5: ranks 1 (global 2), 2 (global 1); silent: rank 2 (global 1) (no report for 3.0 s)" in line
    assert "never reported: ranks 3 (global 0); failed too: rank 1 (global 2): RemoteError" in line, line
    p2p = _report({2: (4, 4, 0, 0.1)}, is_p2p=True, peer=2, answered={2})
    p2p.global_ranks = [3, 2, 1, 0]
    assert "send #1 with peer 2 (global 1)" in p2p.line(1.75)


def test_failure_line_alive_but_behind_and_unknown():
    # issue 17 changed this: only a fresh answer to the report's request makes a rank "behind"
    r = _report({1: (5, 4, 0, 0.2), 2: (3, 3, 0, -0.01)}, answered={2})
    line = r.line(1.75)
    assert "behind: rank 2 (alive, answered: last issued #3)" in line and "never reported: ranks 3" in line
    assert r.as_dict(1.75)["behind"]["2"]["report_age_s"] == 0.0  # answered after the failure: not -0.01 s old
    r2 = _report({1: (5, 4, 0, 0.2), 2: (5, 4, 0, 0.1), 3: (5, 4, 0, 0.1)})
    assert "no rank is behind: every rank issued #5" in r2.line(1.75)
    # a rank that never reported (its watchdog off) may be behind: not said to have issued #5
    r4 = _report({1: (5, 4, 0, 0.2), 2: (5, 4, 0, 0.1)})
    line4 = r4.line(1.75)
    assert "never reported: ranks 3" in line4 and "no rank is behind" not in line4, line4
    r3 = _report({1: (4, 4, 0, 0.1), 2: (4, 4, 0, 0.1)}, is_p2p=True, peer=2, answered={2})
    line3 = r3.line(1.75)
    assert "send #1 with peer 2" in line3 and "peer: rank 2 (alive, answered: last issued p2p #0)" in line3


def test_a_stale_report_is_given_with_its_age_not_as_a_fact():
    # the demo's case: a report published at start-up says #0, the failure comes 0.8 s later
    r = _report({1: (0, 0, 0, 0.8), 2: (5, 4, 0, -0.01), 3: (0, 0, 0, 0.8)}, answered={2, 3})
    r.answer_wait = 0.5
    line = r.line(1.75)
    a = r.analysis(1.75)
    assert list(a["behind"]) == [3] and list(a["unconfirmed"]) == [1] and a["in_op"] == [2]
    assert "not confirmed: rank 1 (last report 0.8 s old said #0; no answer within 0.5 s)" in line
    assert "behind: rank 3 (alive, answered: last issued #0)" in line
    assert "rank 1 (alive" not in line
    d = r.as_dict(1.75)
    assert d["unconfirmed"]["1"] == {"last_issued": 0, "report_age_s": 0.8} or \
        abs(d["unconfirmed"]["1"]["report_age_s"] - 0.8) < 0.01
    assert d["behind"]["3"]["answered"] and sorted(d["answered"]) == [2, 3]


def test_a_rank_that_failed_in_this_operation_is_not_behind():
    # progress is published once a second: a rank that failed in #5 may still have reported #1 before
    r = _report({1: (1, 1, 0, 0.5), 2: (1, 1, 0, 0.5)},
                failures={1: "RemoteError in all_reduce #5 after 0.01 s",
                          2: "RemoteError in all_reduce #4 after 1.00 s"})
    a = r.analysis(1.75)
    # issue 17: where rank 2 failed comes from its own failure record (#4), not its older report (#1)
    assert list(a["behind"]) == [2] and a["behind"][2][0] == 4 and a["in_op"] == [1]
    assert "behind: rank 2 (failed in all_reduce #4; last issued #4)" in r.line(1.75)


def test_a_peer_that_failed_in_a_collective_is_not_said_to_fail_at_a_send():
    # rank 0's send timed out; its peer failed in all_reduce #2 and never sent: "failed at p2p #0" read as a
    # point-to-point failure
    r = _report({1: (2, 1, 0, 0.5)}, is_p2p=True, peer=1, failures={1: "CommTimeout in all_reduce #2 after 3.0 s"},
                answered={1})
    assert "peer: rank 1 (failed in all_reduce #2; last issued p2p #0)" in r.line(1.75), r.line(1.75)


def test_exchange_through_a_store(make_wd):
    store = MemoryStore()
    rec = fr.FlightRecorder(8)
    c = Watched(rec, 0, 3, uid="cafe", store=store)
    peer = FakeComm(fr.FlightRecorder(0), 1, 3, uid="cafe", store=store)
    peer.coll_seq = 7
    wd = make_wd([], recorder=rec, abort_grace=0.0)
    wd._publish(peer)
    c.coll_seq = 7
    w = c.op("all_reduce", np.ones(1, np.float32), np.ones(1, np.float32), state="started")
    store.set("pycoll/fr/failure/cafe/2",
              FailureRecord("CommTimeout", "timed out", "all_reduce", 8, elapsed=2.0).encode())
    exc = CommTimeout("timed out", comm_name="world", op="all_reduce", seq=8, elapsed=2.0, timeout=2.0)
    r = FailureReport(c, exc, w, rec.issued_at(w))
    wd._exchange(store, r)
    assert r.exchanged.is_set() and not r.store_error
    assert r.peers[1]["coll_enqueued"] == 7
    assert {k: v.brief() for k, v in r.peer_failures.items()} == {2: "CommTimeout in all_reduce #8 after 2.00 s"}
    assert FailureRecord.decode(store.get("pycoll/fr/failure/cafe/0")).brief().startswith(
        "CommTimeout in all_reduce #8")
    assert store.add("pycoll/fr/dump_signal", 0) == 1
    assert b"rank 0: CommTimeout in all_reduce #8" in store.get("pycoll/fr/dump_signal/1")
    # published before the request: not an answer, so given with its age (issue 17)
    assert "not confirmed: rank 1 (last report " in r.line(1.75) and "said #7" in r.line(1.75)


def test_dump_request_from_another_process_is_served(make_wd, tmp_path):
    store = MemoryStore()
    rec = fr.FlightRecorder(8, dump_dir=str(tmp_path))
    c = Watched(rec, 0, 2, store=store)
    wd = make_wd([c], recorder=rec, publish_interval=0.1)
    wd.start()
    assert _wait_for(lambda: store.check([f"pycoll/fr/progress/{c.uid}/0"]), 3.0)
    time.sleep(0.2)  # let it read the current request counter
    n = store.add("pycoll/fr/dump_signal", 1)
    store.set(f"pycoll/fr/dump_signal/{n}", b"otherhost:1 request rank 1: please dump")
    assert _wait_for(lambda: rec.last_dump is not None, 5.0)
    assert rec.last_dump["trigger"] == "remote" and "rank 1: please dump" in rec.last_dump["reason"]
    assert rec.last_dump["reason"] == "requested by rank 1: please dump"  # the request's kind is not its text
    # its own requests are not served twice
    count = rec.dump_count
    wd.signal_all("mine")
    time.sleep(0.5)
    assert rec.dump_count == count


def test_dumps_on_failure_off_skip_the_dump_another_rank_failure_asks_for(make_wd, tmp_path):
    # PYCOLL_FR_DUMP_ON_FAILURE=0 here: a failure elsewhere is answered (the failing rank reads this rank's progress)
    # but makes no dump; a dump a user asks for (dump_flight_recorder(all_ranks=True)) is still made
    store = MemoryStore()
    rec = fr.FlightRecorder(8, dump_dir=str(tmp_path))
    c = Watched(rec, 0, 2, store=store)
    wd = make_wd([c], recorder=rec, publish_interval=0.1, dump_on_failure=False)
    wd.start()
    progress = f"pycoll/fr/progress/{c.uid}/0"
    assert _wait_for(lambda: store.check([progress]), 3.0)
    time.sleep(0.2)  # let it read the current request counter

    def post(value):  # as another process's watchdog posts it (this process's own requests are not served)
        n = store.add("pycoll/fr/dump_signal", 1)
        store.set(f"pycoll/fr/dump_signal/{n}", value)
        return n

    n = post(b"otherhost:1 failure rank 1: CommTimeout in all_reduce #3")
    assert _wait_for(lambda: ProgressRecord.decode(store.get(progress)).request == n, 3.0)  # answered
    time.sleep(0.3)
    assert rec.dump_count == 0
    post(b"otherhost:1 request rank 1: have a look")
    assert _wait_for(lambda: rec.dump_count == 1, 5.0)
    assert rec.last_dump["trigger"] == "remote" and rec.last_dump["reason"] == "requested by rank 1: have a look"


def test_configuration(monkeypatch):
    monkeypatch.setenv("PYCOLL_WATCHDOG", "0")
    monkeypatch.setenv("PYCOLL_WATCHDOG_INTERVAL", "0.05")
    wd = wdm.Watchdog(fr.FlightRecorder(0))
    assert not wd.enabled and wd.interval == 0.05 and wd.publish_interval == 1.0 and wd.stall_timeout == 15.0
    wd.comm_created(FakeComm(wd.recorder, 0, 1))
    assert not wd.running
    monkeypatch.setenv("PYCOLL_WATCHDOG_INTERVAL", "soon")
    with pytest.raises(ValueError, match="PYCOLL_WATCHDOG_INTERVAL"):
        wdm.Watchdog(fr.FlightRecorder(0))
    with pytest.raises(ValueError, match="interval"):
        wdm.Watchdog(fr.FlightRecorder(0), interval=0)
    with pytest.raises(TypeError, match="stall_timeout"):
        wdm.Watchdog(fr.FlightRecorder(0), interval=0.1, stall_timeout="1")
    assert signal_number(None) is None and signal_number("0") is None
    assert signal_number(True) == signal_number("1") == signal_number("SIGUSR1") == signal.SIGUSR1
    assert signal_number("usr2") == signal.SIGUSR2
    with pytest.raises(ValueError, match="unknown signal"):
        signal_number("SIGNOPE")


def test_defaults_fit_interactive_work(monkeypatch):
    for var in list(os.environ):
        if var.startswith(("PYCOLL_WATCHDOG", "PYCOLL_FR_DUMP_")):
            monkeypatch.delenv(var)
    wd = wdm.Watchdog(fr.FlightRecorder(0))
    assert wd.enabled and wd.interval <= 0.1 and wd.stall_timeout <= 30 and wd.dump_timeout <= 10
    assert wd.report_timeout + wd.dump_timeout <= 10 and wd.dump_on_failure and wd.status()["dump_signal"] is None


def test_threads_are_named_and_stop(make_wd):
    wd = make_wd([])
    wd.start()
    threads = list(wd._threads)
    assert [t.name for t in threads] == ["pycoll-watchdog", "pycoll-watchdog-monitor", "pycoll-watchdog-store",
                                        "pycoll-watchdog-report", "pycoll-watchdog-liveness"]
    assert all(t.daemon and t.is_alive() for t in threads)
    wd.stop()
    assert not wd.running and not any(t.is_alive() for t in threads)


def test_stop_releases_the_wake_up_fd_also_without_a_dump_signal(make_wd):
    """The watchdog makes its socket the signals' wake-up fd whether or not a dump signal is installed (the default:
    none); stop() released it only with one, then closed the socket: the next file opened took its number, and every
    signal with a Python handler wrote a byte into it. Stopped off the main thread, it keeps the socket."""
    prev = signal.set_wakeup_fd(-1)
    try:
        wd = make_wd([])
        wd.start()
        fd = wd._wake_w.fileno()
        assert signal.set_wakeup_fd(fd) == fd and wd.dump_signal is None  # its own, no dump signal
        wd.stop()
        assert signal.set_wakeup_fd(-1) == -1 and wd._wake_w is None
        wd.start()
        fd = wd._wake_w.fileno()
        t = threading.Thread(target=wd.stop)
        t.start()
        t.join(10)
        assert signal.set_wakeup_fd(fd) == fd and wd._wake_w is not None and wd._wake_w.fileno() == fd
        wd.start()  # takes it up again
        assert wd._wake_w.fileno() == fd
        wd.stop()
        assert signal.set_wakeup_fd(-1) == -1
    finally:
        signal.set_wakeup_fd(prev)


def test_a_stopped_watchdog_leaves_its_dump_signal_ignored(make_wd):
    """A peer may still send the dump signal it read from this rank's published state after the watchdog stopped (at
    exit): the signal's default action then killed a rank that was ending normally (exit 138)."""
    prev = signal.signal(signal.SIGUSR2, signal.SIG_DFL)
    try:
        wd = make_wd([])
        wd.enable_signal("SIGUSR2")
        assert signal.getsignal(signal.SIGUSR2) not in (signal.SIG_DFL, signal.SIG_IGN)
        wd.stop()
        assert signal.getsignal(signal.SIGUSR2) is signal.SIG_IGN
        os.kill(os.getpid(), signal.SIGUSR2)  # this test process lives on
        time.sleep(0.05)
    finally:
        signal.signal(signal.SIGUSR2, prev)


def test_the_dump_signal_comes_back_with_a_restart_and_goes_when_turned_off_or_switched(make_wd, caplog):
    """The signal a stop left ignored was taken for another's handler: a restarted watchdog had none ("SIGUSR2
    already has a handler (SIG_IGN)"). ``configure(dump_signal=False)`` left it installed (it still dumped, and was
    still published to the peers); a switch to another signal left the first one's handler and stacks."""
    prev = {s: signal.signal(s, signal.SIG_DFL) for s in (signal.SIGUSR1, signal.SIGUSR2)}
    try:
        wd = make_wd([])
        wd.enable_signal("SIGUSR2")
        wd.stop()
        with caplog.at_level(logging.WARNING, "pycoll.watchdog"):
            wd.start()
        assert wd.dump_signal == signal.SIGUSR2 and not caplog.records, caplog.text
        assert signal.getsignal(signal.SIGUSR2) not in (signal.SIG_DFL, signal.SIG_IGN)
        wd.configure(dump_signal=False)
        assert wd.dump_signal is None and signal.getsignal(signal.SIGUSR2) is signal.SIG_IGN
        wd.enable_signal("SIGUSR2")
        wd.enable_signal("SIGUSR1")
        assert wd.dump_signal == signal.SIGUSR1 and signal.getsignal(signal.SIGUSR2) is signal.SIG_IGN
        wd.stop()
    finally:
        for s, h in prev.items():
            signal.signal(s, h)


def test_after_fork_releases_the_parents_wake_up_fd_and_a_stale_one_is_taken_over():
    """A forked child closes its parent's watchdog socket: it must not stay the signals' wake-up fd (its number goes
    to the next file the child opens). A wake-up fd someone else closed is replaced, not restored (it cannot be)."""
    prev = signal.set_wakeup_fd(-1)
    pairs = [socket.socketpair() for _ in range(3)]
    for s in (s for p in pairs for s in p):
        s.setblocking(False)
    (r, w), (_, other), (_, mine) = pairs
    try:
        wd = wdm.Watchdog(fr.FlightRecorder(4), enabled=False, communicators=list)
        wd._wake_r, wd._wake_w = r, w  # as a started watchdog has them
        signal.set_wakeup_fd(w.fileno())
        wd.after_fork()
        assert signal.set_wakeup_fd(-1) == -1 and w.fileno() == -1  # released, then closed
        signal.set_wakeup_fd(other.fileno())  # someone else's (asyncio's) stays
        wd._signal.after_fork(mine.fileno())
        assert signal.set_wakeup_fd(other.fileno()) == other.fileno()
        other.close()  # ... until its owner closes it without a word
        assert wd._signal.watch_interrupts(mine)
        assert signal.set_wakeup_fd(-1) == mine.fileno()
    finally:
        try:
            signal.set_wakeup_fd(prev)
        except (ValueError, OSError):
            signal.set_wakeup_fd(-1)
        for s in (s for p in pairs for s in p):
            s.close()


def test_started_before_tells_a_reused_pid():
    from pycoll.diagnostics.answers import started_before as _started_before

    assert _started_before(os.getpid(), time.time_ns())  # this process published "now"
    assert not _started_before(os.getpid(), 0)  # a record from 1970 cannot be this process's
    assert not _started_before(2 ** 22 + 12345, time.time_ns())  # no such process


def test_gone_needs_this_host_and_a_dead_process():
    import socket
    import subprocess
    import sys

    from pycoll.diagnostics.answers import gone as _gone

    p = subprocess.Popen([sys.executable, "-c", "pass"])
    p.wait()
    now = time.time_ns()
    host = socket.gethostname()
    assert _gone({"origin": f"{host}:{p.pid}", "time_ns": now})  # exited (or its pid reused since)
    assert not _gone({"origin": f"{host}:{os.getpid()}", "time_ns": now})
    assert not _gone({"origin": f"another-host:{p.pid}", "time_ns": now})
    assert not _gone(None)


def test_the_dump_signal_is_sent_to_a_silent_peer_but_not_to_one_that_closed_the_communicator():
    """A peer whose last record says it aborted the communicator is not stuck in it and may be ending: the dump signal
    sent to it (as to a peer that did not answer) killed it as its interpreter finished (exit -10)."""
    import socket
    import subprocess
    import sys

    from pycoll.diagnostics.answers import signal_unanswered

    procs = [subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"]) for _ in range(2)]
    try:
        time.sleep(0.2)  # the records below are published after the processes started
        r = _report({1: (5, 4, 0, 0.0), 2: (5, 4, 0, 0.0)})
        for k, p in zip((1, 2), procs, strict=True):
            r.peers[k].update(origin=f"{socket.gethostname()}:{p.pid}", dump_signal=int(signal.SIGUSR1),
                              time_ns=time.time_ns())
        r.peers[2]["state"] = "aborted"
        signal_unanswered(r, 10.0)
        assert r.signalled == {1: (procs[0].pid, "SIGUSR1")}
        assert procs[0].wait(10) == -signal.SIGUSR1 and procs[1].poll() is None
    finally:
        for p in procs:
            p.kill()
            p.wait()


def test_configure_takes_bools_as_bools_and_bounds_the_stack_depth():
    # configure(enabled="no") switched the watchdog on (a str's truth); stack_depth had no bound (every ring entry
    # keeps a buffer of that many frames: 100000 took 2.9 GB), where PYCOLL_FR_STACK_DEPTH stops at 1000
    wd = wdm.Watchdog(fr.FlightRecorder(4), enabled=False, communicators=list)
    for kw in ({"enabled": "no"}, {"liveness": "no"}, {"dump_on_failure": 2}):
        with pytest.raises(TypeError, match="must be True or False"):
            wd.configure(**kw)
    wd.configure(liveness=False, dump_on_failure=np.bool_(True))
    assert wd.liveness is False and wd.dump_on_failure is True
    rec = fr.FlightRecorder(4)
    for kw in ({"stacks": "no"}, {"write_json": "false"}):
        with pytest.raises(TypeError, match="must be True or False"):
            rec.configure(**kw)
    with pytest.raises(ValueError, match=r"stack_depth must be an int in \[1, 1000\]"):
        rec.configure(stack_depth=100000)
    rec.configure(stacks=False, stack_depth=1000)
    assert rec.stacks is False and rec.stack_depth == 1000


def test_a_second_ctrl_c_at_exit_is_said_not_a_traceback(monkeypatch, caplog):
    # the exit's wait for the reports and dumps, interrupted by a second Ctrl-C, printed "Exception ignored in atexit
    # callback" with this wait's traceback, and the failure line was lost
    class Interrupted:
        owned_by_this_process = True

        def wait_for_dumps(self):
            raise KeyboardInterrupt

    monkeypatch.setattr(watchdog_mod, "_watchdog", Interrupted())
    with caplog.at_level(logging.WARNING, logger="pycoll.watchdog"):
        watchdog_mod._wait_for_dumps_at_exit()
    assert "interrupted (SIGINT) while waiting at exit" in caplog.text


def test_a_send_whose_peer_waits_in_one_of_its_own_says_to_group_them():
    # two ranks that each send (or receive) first, outside a group: each waited out its timeout and was told only
    # "peer: rank 1 (alive, answered: last issued p2p #1)", nothing of the deadlock or of comm.group()
    r = _report({2: (4, 4, 1, 0.1)}, is_p2p=True, peer=2, answered={2})
    r.peers[2]["p2p_completed"] = 0  # its own send #1 is outstanding
    line = r.line(1.75)
    assert "rank 2 waits in a send or receive of its own" in line and "one comm.group() (or use sendrecv)" in line
    r.peers[2]["p2p_completed"] = 1  # it completed its own: it waits in none
    assert "of its own" not in r.line(1.75)
    assert "of its own" not in _report({2: (4, 4, 0, 0.1)}, is_p2p=True, peer=2, answered={2}).line(1.75)  # behind


def test_a_wait_signal_whose_peer_waits_for_one_of_its_own_says_to_send_the_signal():
    # two ranks that each wait for the other's signal were told to group a send and a receive (or use sendrecv)
    r = _report({2: (4, 4, 1, 0.1)}, is_p2p=True, peer=2, answered={2}, op="wait_signal")
    r.peers[2]["p2p_completed"] = 0
    line = r.line(1.75)
    assert "rank 2 waits for a signal of its own (wait_signal)" in line and "sendrecv" not in line, line
    assert "check that every wait_signal has its signal (signal or put_signal) sent" in line


def test_a_process_held_up_as_a_whole_is_no_stall_of_the_polling_thread(make_wd, caplog, monkeypatch):
    """The main thread holding the GIL in a C call for 22 s, the job idle: the monitor, held up as long, woke first
    and reported the polling thread stalled (with its stack, parked in a wait), and dumped."""
    wd = make_wd([], interval=0.05, stall_timeout=0.3)
    monkeypatch.setattr(type(wd), "running", property(lambda self: True))
    now = time.monotonic()
    wd._beat_t = wd._monitor_t = now - 1.0  # neither ran for a second
    with caplog.at_level(logging.WARNING, logger="pycoll"):
        wd._check_stall()
        assert not wd._stalled and not any("has not completed a round" in r.getMessage() for r in caplog.records)
        wd._beat_t = time.monotonic() - 1.0  # the monitor ran since, the polling thread did not: a stall
        monkeypatch.setattr(wd, "_dumps", types.SimpleNamespace(run=lambda jobs, dump: None))
        wd._check_stall()
        assert wd._stalled and any("has not completed a round" in r.getMessage() for r in caplog.records)


def test_the_dump_signal_asked_for_off_the_main_thread_is_refused(make_wd):
    # it returned after a log line, the signal left to its default action: the first SIGUSR1 killed the process
    wd = make_wd([])
    caught = []

    def ask():
        try:
            wd.enable_signal("SIGUSR2")
        except ValueError as e:
            caught.append(str(e))

    t = threading.Thread(target=ask)
    t.start()
    t.join(10)
    assert caught and "main thread" in caught[0]
    assert signal.getsignal(signal.SIGUSR2) in (signal.SIG_DFL, None)


def test_the_watchdogs_waits_take_timedeltas_as_every_timeout_does(make_wd):
    # dump(wait=), wait_for_dumps(timeout=) and stop(timeout=) raised TypeError on a timedelta (stop() after it had
    # half stopped the watchdog)
    import datetime

    wd = make_wd([])
    wd.dump("td", wait=datetime.timedelta(seconds=5))
    assert wd.wait_for_dumps(datetime.timedelta(seconds=5))
    wd.stop(datetime.timedelta(seconds=5))
    assert not wd.running


@pytest.mark.parametrize("what", ["fd", "thread"])
def test_an_init_whose_watchdog_cannot_start_raises_naming_why(what):
    # no fd left for its socketpair (RLIMIT_NOFILE), no thread (a pids limit): a logged traceback, and init returned a
    # communicator that turned no hang into an error and found a stopped peer only at its timeout
    import subprocess
    import sys

    from helpers import REPO

    break_it = ("import socket\ndef refuse(*a, **k): raise OSError(24, 'Too many open files')\n"
                "socket.socketpair = refuse\n" if what == "fd" else
                "import threading\nstart = threading.Thread.start\n"
                "def refuse(self):\n    if self.name == 'pycoll-watchdog-store': raise RuntimeError(\"can't start new "
                "thread\")\n    start(self)\nthreading.Thread.start = refuse\n")
    code = (break_it + "import pycoll, threading\ntry:\n"
            "    pycoll.init(0, 1, unique_id=pycoll.get_unique_id(backend='host'), backend='host')\n"
            "    print('init returned')\nexcept pycoll.PycollError as e:\n    print('refused:', e)\n"
            "print('threads:', sorted(t.name for t in threading.enumerate() if t.name.startswith('pycoll')))\n")
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60,
                       env=dict(os.environ, PYTHONPATH=REPO))
    reason = "OSError: [Errno 24] Too many open files" if what == "fd" else "RuntimeError: can't start new thread"
    assert f"refused: communicator 'world': the watchdog could not start its threads ({reason})" in p.stdout, \
        p.stdout + p.stderr
    assert "PYCOLL_WATCHDOG=0" in p.stdout
    assert "pycoll-watchdog-store" not in p.stdout.split("threads: ")[1], p.stdout
