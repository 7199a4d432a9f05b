"""pycoll-fr says only what is known: a rank's own dump wins over a stale store report, and a report
is given with its age (issue 17)."""

from __future__ import annotations

import os
import pickle
import re
import threading
import time

import numpy as np
import pytest
from helpers.fakes import FakeComm

from pycoll import RemoteError, analyze, flight_recorder as fr
from pycoll.diagnostics import plot

PREFIX = fr.DEFAULT_FILE_PREFIX
UID = "abcdef0123456789"


def _dumps(folder, *, report):
    """4 ranks in all_reduce #21 except rank 2 (which left no dump); rank 1 carries ``report``."""
    for r in range(4):
        rec = fr.FlightRecorder(64, dump_dir=str(folder))
        c = FakeComm(rec, r, 4, uid=UID, name="demo")
        for _ in range(20):
            c.op("all_reduce", np.ones(2, np.float32), np.ones(2, np.float32))
        if r != 2:
            c.op("all_reduce", np.ones(2, np.float32), np.ones(2, np.float32), state="started")
        if r == 1:
            rec.add_failure(0, report)
        assert rec.dump("test")
    os.unlink(os.path.join(folder, "generation_0", f"{PREFIX}2"))
    os.unlink(os.path.join(folder, "json", "generation_0", f"{PREFIX}2.json"))
    return str(folder)


def _progress(enqueued, t_ns, request=-1):
    return {"coll_enqueued": enqueued, "coll_started": enqueued, "coll_completed": enqueued, "p2p_enqueued": 0,
            "p2p_started": 0, "p2p_completed": 0, "state": "active", "time_ns": t_ns, "beats": 1,
            "origin": "h:1", "request": request}


def test_own_dump_wins_over_a_stale_report_and_ages_are_printed(tmp_path):
    now = time.time()
    stale = int((now - 0.8) * 1e9)
    # what the old watchdog wrote: ranks 0 and 2 "behind" from reports published at start-up
    report = {"time": now, "uid": UID, "rank": 1, "error_type": "RemoteError", "op": "all_reduce", "seq": 21,
              "message": "rank 2 exited", "elapsed_s": 0.01, "request": 3,
              "behind": {"0": {"last_issued": 0, "report_age_s": 0.8}, "2": {"last_issued": 0, "report_age_s": 0.8}},
              "peers": {"0": _progress(0, stale), "2": _progress(0, stale), "3": _progress(0, stale)},
              "silent": {}, "peer_failures": {}}
    d = _dumps(tmp_path, report=report)
    rep = analyze.analyze_dir(d)[0]
    text = analyze.format_report([rep], stacks=False)
    line = next(ln for ln in text.splitlines() if "watchdog on rank 1" in ln)
    assert "rank 0 (its own dump: last all_reduce #21 [Float(2,)] started)" in line
    assert "rank 2 (report 0.8 s old said #0)" in line
    assert "rank 0 (last reported #0)" not in text
    missing = next(ln for ln in text.splitlines() if ln.strip().startswith("rank 2: no dump"))
    assert "its last report in the store, 0.8 s old when rank 1 failed, said #0" in missing
    assert "verdict: rank 2 (no dump) was not seen entering all_reduce #21" in text


def test_an_answer_is_a_fact(tmp_path):
    now = time.time()
    report = {"time": now, "uid": UID, "rank": 1, "error_type": "CommTimeout", "op": "all_reduce", "seq": 21,
              "message": "timed out", "elapsed_s": 2.0, "request": 3,
              "behind": {"2": {"last_issued": 20, "report_age_s": -0.01, "answered": True}},
              "peers": {"2": _progress(20, int((now + 0.01) * 1e9), request=3)}, "silent": {}, "peer_failures": {}}
    d = _dumps(tmp_path, report=report)
    reps = analyze.analyze_dir(d)
    text = analyze.format_report(reps, stacks=False)
    assert "it saw behind: rank 2 (answered: #20)" in text
    # an answer made after the failure is 0 s old at it, not -0.01
    assert reps[0]["communicators"][0]["failures"][0]["behind"]["2"]["report_age_s"] == 0.0
    assert "its answer to rank 1's dump request said #20" in text


def _unrecorded_failure(folder, *, closed):
    """Two ranks dump with recording off (PYCOLL_FR_BUFFER_SIZE=0); rank 0's communicator failed in all_reduce #11
    (a CommTimeout report), and with ``closed`` it was closed before the dump (as its abort does before an exit
    dump). Returns pycoll-fr's report of the folder."""
    report = {"time": time.time(), "uid": UID, "rank": 0, "error_type": "CommTimeout", "op": "all_reduce", "seq": 11,
              "message": "timed out", "elapsed_s": 2.0, "request": 1, "behind": {}, "peers": {}, "silent": {},
              "peer_failures": {}}
    for r in range(2):
        rec = fr.FlightRecorder(0, dump_dir=str(folder))
        c = FakeComm(rec, r, 2, uid=UID, name="world")
        c.op("all_reduce", np.ones(2, np.float32), np.ones(2, np.float32))  # not recorded
        if r == 0:
            rec.comm_failed(c, RuntimeError("timed out"), None)
            rec.add_failure(0, report)
            if closed:
                rec.comm_closed(c)
                del c
        assert rec.dump("test")
    return analyze.analyze_dir(str(folder))[0]


def test_a_failure_whose_operations_were_not_recorded_is_no_all_clear(tmp_path):
    # the dumps hold no operation, only the watchdog's report of the failure; the analyzer said "no problem found"
    # and exited 0
    rep = _unrecorded_failure(tmp_path, closed=False)
    assert not rep["ok"]
    text = analyze.format_report([rep], stacks=False)
    assert "no operation recorded (recording off)" in text
    assert "verdict: 'world' failed on rank 0, but no dump holds its operations (recording was off" in text, text
    assert analyze.main([str(tmp_path)]) == 1


def test_a_failed_communicator_closed_before_the_dump_is_in_it_with_recording_off(tmp_path):
    # the exit dump of an uncaught CommTimeout comes after the abort closed the communicator: with no entry referring
    # to it, the dump named no communicator, and pycoll-fr said the failing ranks "left no dump"
    text = analyze.format_report([_unrecorded_failure(tmp_path, closed=True)], stacks=False)
    assert "missing dumps" not in text and "left no dump" not in text, text
    assert "verdict: 'world' failed on rank 0, but no dump holds its operations (recording was off" in text, text


def test_a_failed_communicator_kept_for_the_dumps_does_not_make_its_old_generation_dumped_again(tmp_path):
    # generation 0 failed and dumped; the reshape's generation 1 goes on; a dump at exit wrote generation 0 again from
    # what was left of it (no entry, a ring that had wrapped) over its failure dump, and pycoll-fr blamed a survivor
    rec = fr.FlightRecorder(0, dump_dir=str(tmp_path))
    old = FakeComm(rec, 0, 3, uid=UID, name="world")
    rec.comm_failed(old, RuntimeError("rank 2 exited"), None)
    first = rec.dump("failure")
    assert [os.path.basename(os.path.dirname(p)) for p in first if "json" not in p] == ["generation_0"]
    rec.comm_closed(old)
    new = FakeComm(rec, 0, 2, uid="0123456789abcdef", name="world", generation=1)
    written = rec.dump("exit")
    assert written and all("generation_1" in p for p in written), written
    assert new.generation == 1
    # with nothing live or recorded, a dump goes to the latest failed communicator's generation (it went to
    # generation_0, apart from its generation's other dumps)
    rec.comm_failed(new, RuntimeError("rank 1 exited"), None)
    rec.comm_closed(new)
    del new
    written = rec.dump("exit")
    assert written and all("generation_1" in p for p in written), written


@pytest.mark.parametrize("state", ["started", "scheduled"])  # failed still queued: it was "a hung kernel"
def test_a_rank_that_entered_only_after_the_timeout_is_late_not_the_transport(tmp_path, state):
    # rank 1 slept through rank 0's timeout, then entered all_reduce #21 on the aborted communicator (a RemoteError):
    # its failure dump replaced the one it made at rank 0's request, and pycoll-fr said "every rank entered it and
    # none completed it: suspect the transport"
    now = time.time()
    for r in range(2):
        rec = fr.FlightRecorder(64, dump_dir=str(tmp_path))
        c = FakeComm(rec, r, 2, uid=UID, name="world")
        for _ in range(20):
            c.op("all_reduce", np.ones(2, np.float32), np.ones(2, np.float32))
        w = c.op("all_reduce", np.ones(2, np.float32), np.ones(2, np.float32),
                 state="started" if r == 0 else state)
        timed_out = r == 0
        if not timed_out:  # its late entry failed on the communicator rank 0's timeout aborted
            w._exc = RemoteError(6, "ncclAllReduce", "remote process exited", "rank 0 aborted the communicator")
        rec.add_failure(0, {"time": now - (2.0 if timed_out else 0.0), "uid": UID, "rank": r,
                            "error_type": "CommTimeout" if timed_out else "RemoteError", "op": "all_reduce", "seq": 21,
                            "message": "timed out" if timed_out else "rank 0 aborted the communicator",
                            "elapsed_s": 1.0, "behind": {}, "peers": {}, "silent": {}, "peer_failures": {}})
        assert rec.dump("test")
    reps = analyze.analyze_dir(str(tmp_path))
    assert reps[0]["communicators"][0]["culprits"] == [1]  # --json names it too
    text = analyze.format_report(reps, stacks=False)
    assert ("verdict: rank 1 entered all_reduce #21 [Float(2,)] on 'world' only 2.0 s after rank 0 gave it up at its "
            "timeout: late, not stuck in it (not the transport)") in text, text
    assert "suspect the transport" not in text
    # not where the late rank's entry was not ended by the timeout (on_failure="report": it waited in a live
    # collective that did not complete either), nor across hosts (their clocks differ; the dumps' times are raw)
    for r, change in ((1, "error"), (0, "host")):
        path = os.path.join(tmp_path, "generation_0", f"{PREFIX}{r}")
        with open(path, "rb") as f:
            original = f.read()
        dump = pickle.loads(original)
        if change == "error":
            for e in dump["entries"]:
                e.pop("pycoll_error", None)
        else:
            dump["pycoll"]["hostname"] = "another-host"
        with open(path, "wb") as f:
            pickle.dump(dump, f)
        text = analyze.format_report(analyze.analyze_dir(str(tmp_path)), stacks=False)
        assert "late, not stuck" not in text, (change, text)
        assert ("suspect the transport" if state == "started" else "its operation never started") in text, text
        with open(path, "wb") as f:
            f.write(original)


def _dump_from_a_thread(rec, reason, trigger):
    """``rec``'s dump made in another thread, as the watchdog's monitor makes one a peer asked for: it says where the
    main thread -- this test, here -- was."""
    t = threading.Thread(target=rec.dump, args=(reason,), kwargs={"trigger": trigger})
    t.start()
    t.join()  # the main thread's site: this line


def _check_from_a_thread(rec, reason):
    _dump_from_a_thread(rec, reason, "manual")


def test_a_late_rank_s_replaced_dump_still_says_where_it_was_when_asked(tmp_path):
    # rank 1 dumped at rank 0's request while it was elsewhere, then entered all_reduce #21 late and failed: its
    # failure dump replaced the first, and with it where its main thread had been
    now = time.time()
    line = _dump_from_a_thread.__code__.co_firstlineno + 5
    for r in range(2):
        rec = fr.FlightRecorder(64, dump_dir=str(tmp_path))
        c = FakeComm(rec, r, 2, uid=UID, name="world")
        for _ in range(20):
            c.op("all_reduce", np.ones(2, np.float32), np.ones(2, np.float32))
        if r == 1:
            rec.dump("a dump of another folder", dump_dir=str(tmp_path / "elsewhere"))  # replaces nothing here
            _check_from_a_thread(rec, "user dump at start-up")  # older, where the main thread was elsewhere
            _dump_from_a_thread(rec, "requested by rank 0: CommTimeout in all_reduce #21", "remote")
        w = c.op("all_reduce", np.ones(2, np.float32), np.ones(2, np.float32), state="started")
        if r == 1:
            w._exc = RemoteError(6, "ncclAllReduce", "remote process exited", "rank 0 aborted the communicator")
        rec.add_failure(0, {"time": now - (2.0 if r == 0 else 0.0), "uid": UID, "rank": r,
                            "error_type": "CommTimeout" if r == 0 else "RemoteError", "op": "all_reduce", "seq": 21,
                            "message": "failed", "elapsed_s": 1.0, "behind": {}, "peers": {}, "silent": {},
                            "peer_failures": {}})
        assert rec.dump("failure in all_reduce #21", trigger="failure")
        if r == 1:  # the failure dump carries what the one it replaced said
            with open(rec.last_dump["path"], "rb") as f:
                earlier = pickle.load(f)["pycoll"]["earlier_dumps"]
            assert [e["trigger"] for e in earlier] == ["manual", "remote"], earlier
    text = analyze.format_report(analyze.analyze_dir(str(tmp_path)), stacks=False)
    # the main thread waits in the thread's start or join
    assert re.search(r"late, not stuck in it \(not the transport\) -- look at what that rank did before it \(rank 1's "
                     rf"main thread was at test_analyze_facts.py:(?:{line - 1}|{line}) in _dump_from_a_thread \(in "
                     r"threading.(start|join)\) at its earlier dump \(remote: requested by rank 0: CommTimeout in "
                     r"all_reduce #21\)\)", text), text
    assert ("rank 1: failure: failure in all_reduce #21 (replacing its dumps of manual: user dump at start-up; "
            "remote: requested by rank 0: CommTimeout in all_reduce #21)") in text, text


def test_a_communicator_with_no_operation_is_not_said_to_have_recording_off(tmp_path):
    # recording on, nothing issued on it: pycoll-fr said "no operation recorded (recording off)"
    kept = []
    for r in range(2):
        rec = fr.FlightRecorder(16, dump_dir=str(tmp_path))
        kept.append(FakeComm(rec, r, 2, uid=UID, name="idle"))
        assert rec.dump("test")
    text = analyze.format_report(analyze.analyze_dir(str(tmp_path)), stacks=False)
    assert "no operation recorded: none was issued on it" in text and "recording off" not in text, text


def _revoked_report(now, rank):
    """What the watchdog reports of a rank whose generation the elastic layer revoked for a reshape another member
    began, between two of its operations."""
    return {"time": now, "uid": UID, "rank": rank, "error_type": "CommRevoked", "op": None, "seq": None,
            "message": "generation 0 of 'demo' is being reshaped by another member", "elapsed_s": None,
            "behind": {}, "peers": {}, "silent": {}, "peer_failures": {}}


def _stopped_between_ops(folder, *, ranks, in_flight, reports):
    """``ranks`` of 4 dump 20 completed all_reduces, those of ``in_flight`` a 21st one in flight; ``reports``: rank
    -> its failure report."""
    for r in ranks:
        rec = fr.FlightRecorder(64, dump_dir=str(folder))
        c = FakeComm(rec, r, 4, uid=UID, name="demo")
        for _ in range(20):
            c.op("all_reduce", np.ones(2, np.float32), np.ones(2, np.float32))
        if r in in_flight:
            c.op("all_reduce", np.ones(2, np.float32), np.ones(2, np.float32), state="started")
        rec.add_failure(0, reports[r])
        assert rec.dump("test")
    return analyze.analyze_dir(str(folder))[0]


def test_a_rank_the_recovery_stopped_before_it_issued_the_operation_is_no_culprit(tmp_path):
    # rank 2 died between #20 and #21; rank 3 saw it in #21 and began the reshape, whose revoke stopped rank 0
    # before it issued #21 (seen in the demo under load: the verdict named rank 0 first, as a rank that never entered)
    now = time.time()
    gone = {"time": now, "uid": UID, "rank": 3, "error_type": "RemoteError", "op": "all_reduce", "seq": 21,
            "message": "rank 2 exited", "elapsed_s": 0.0, "behind": {}, "peers": {"2": _progress(0, int(now * 1e9))},
            "silent": {}, "peer_failures": {}, "gone": {"2": 4242}}
    rep = _stopped_between_ops(tmp_path, ranks=[0, 1, 3], in_flight=[1, 3],
                               reports={0: _revoked_report(now, 0), 1: _revoked_report(now, 1), 3: gone})
    c = rep["communicators"][0]
    assert c["verdict"].startswith("rank 2 (no dump) was not seen entering all_reduce #21"), c["verdict"]
    assert "rank 0" not in c["verdict"]
    assert c["culprits"] == [2]
    text = analyze.format_report([rep], stacks=False)
    line = next(ln for ln in text.splitlines() if ln.strip().startswith("rank 0: never entered it"))
    assert "the recovery revoked it first (a reshape another member began)" in line
    pytest.importorskip("matplotlib")
    drawn = plot.plot_trace(analyze.trace_dir(str(tmp_path)), str(tmp_path / "p.png"))
    assert drawn["notes"][0].endswith("all_reduce #21 [Float(2,)] (the recovery revoked it first)"), drawn["notes"]


def test_ranks_the_recovery_stopped_stay_culprits_where_nothing_else_explains_the_others_wait(tmp_path):
    # every rank dumped; rank 0 was late (the others timed out in #21 and reshaped, which revoked it): it is the one
    now = time.time()
    timeout = {"time": now, "uid": UID, "error_type": "CommTimeout", "op": "all_reduce", "seq": 21,
               "message": "timed out", "elapsed_s": 30.0, "behind": {}, "peers": {}, "silent": {},
               "peer_failures": {}}
    c = _stopped_between_ops(tmp_path, ranks=[0, 1, 2, 3], in_flight=[1, 2, 3],
                             reports={0: _revoked_report(now, 0), **{r: {**timeout, "rank": r} for r in (1, 2, 3)}}
                             )["communicators"][0]
    assert c["verdict"].startswith("rank 0 never entered all_reduce #21"), c["verdict"]
    assert c["culprits"] == [0]


def test_a_report_piped_into_a_reader_that_stops_ends_quietly(tmp_path, monkeypatch):
    # `pycoll-fr DIR --json | head` ended with a BrokenPipeError traceback
    import sys

    for r in range(2):
        rec = fr.FlightRecorder(64, dump_dir=str(tmp_path))
        c = FakeComm(rec, r, 2, uid=UID, name="world")
        c.op("all_reduce", np.ones(2, np.float32), np.ones(2, np.float32))
        assert rec.dump("test")

    class Closed:  # a pipe whose reader has gone
        def write(self, text):
            raise BrokenPipeError(32, "Broken pipe")

        def flush(self):
            raise BrokenPipeError(32, "Broken pipe")

    for args in ([str(tmp_path), "--json"], [str(tmp_path)]):
        monkeypatch.setattr(sys, "stdout", Closed())
        assert analyze.main(args) in (0, 1)
