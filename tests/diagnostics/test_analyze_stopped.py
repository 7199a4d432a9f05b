"""A rank the liveness check found stopped inside a collective is the cause, not a slow rank that had not entered it
yet: the failure report keeps whom it found (``unable``), and pycoll-fr names that rank first (issue 86)."""

from __future__ import annotations

import os
import pickle

import numpy as np
import pytest
from helpers.fakes import FakeComm

from pycoll import analyze, flight_recorder as fr
from pycoll.diagnostics.report import FailureReport
from pycoll.errors import CommTimeout, PeerFailure

PREFIX = fr.DEFAULT_FILE_PREFIX
UID = "0123456789abcdef"
WHY = "stopped (SIGSTOP)"


def _peer_failure(comm, work):
    return PeerFailure(f"communicator 'world' rank {comm.rank}: rank 2 (pid 4242) is {WHY}; all_reduce #4 failed "
                       "after 1.40 s of its 20 s timeout", 2, 4242, WHY)


def test_a_peer_failure_report_keeps_whom_the_liveness_check_found_unable():
    rec = fr.FlightRecorder(8)
    c = FakeComm(rec, 1, 3)
    w = c.op("all_reduce", np.ones(2, np.float32), np.ones(2, np.float32), state="started", timeout=20.0)
    d = FailureReport(c, _peer_failure(c, w), w).as_dict(1.0)
    assert d["unable"] == {"2": {"pid": 4242, "why": WHY}}
    # a failure that is no peer found unable names none
    assert FailureReport(c, CommTimeout("timed out"), w).as_dict(1.0)["unable"] == {}


def _stopped_in_it(folder, *, elapsed=None, old=False):
    """all_reduce #1-#3 complete on ranks 0-2; rank 0 is slow and has not issued #4; rank 1's liveness check found
    rank 2 stopped inside #4 (rank 1's PeerFailure report; ``elapsed``: how far into its 20 s timeout; ``old``: as an
    earlier pycoll wrote it, without ``unable``). Returns pycoll-fr's report of the folder."""
    for r in range(3):
        rec = fr.FlightRecorder(64, dump_dir=str(folder))
        c = FakeComm(rec, r, 3, uid=UID, name="world")
        for _ in range(3):
            c.op("all_reduce", np.ones(4, np.float32), np.ones(4, np.float32))
        if r != 0:
            w = c.op("all_reduce", np.ones(4, np.float32), np.ones(4, np.float32), state="started", timeout=20.0)
        if r == 1:
            exc = _peer_failure(c, w)
            w._exc = exc
            report = FailureReport(c, exc, w).as_dict(1.0)
            if elapsed is not None:
                report["elapsed_s"] = elapsed
            if old:
                del report["unable"]
            rec.add_failure(0, report)
        assert rec.dump("test")
    return analyze.analyze_dir(str(folder))[0]


def test_a_rank_found_stopped_in_the_collective_is_the_cause_not_a_rank_that_had_not_entered_it_yet(tmp_path):
    # rank 0 slept 3 s (of a 20 s timeout); rank 2 was SIGSTOPped inside all_reduce #4 and rank 1's watchdog failed it
    # for that after 1.4 s: pycoll-fr said "verdict: rank 0 never entered all_reduce #4" and never named rank 2
    rep = _stopped_in_it(tmp_path)
    c = rep["communicators"][0]
    d = c["first_divergence"]
    assert {k: d["found_unable"][2][k] for k in ("why", "pid", "by")} == {"why": WHY, "pid": 4242, "by": 1}
    assert list(d["not_yet"]) == [0]
    assert c["culprits"] == [2]  # --json names it too
    assert c["failures"][0]["unable"] == {"2": {"pid": 4242, "why": WHY}}
    text = analyze.format_report([rep], stacks=False)
    verdict = next(ln for ln in text.splitlines() if ln.strip().startswith("verdict:"))
    assert verdict.strip().startswith(f"verdict: rank 2 was found {WHY} (pid 4242) inside all_reduce #4 [Float(4,)] "
                                      "on 'world' by rank 1's watchdog"), verdict
    assert "rank 0 never entered" not in verdict and "rank 0 had not entered it yet" in verdict, verdict
    assert f"rank 2: found {WHY} (pid 4242) by rank 1's watchdog" in text, text
    assert f"it found unable to take part: rank 2 (pid 4242, {WHY})" in text, text
    assert "not yet when rank 1 gave it up" in text, text


def test_a_rank_that_had_not_entered_when_the_timeout_was_nearly_up_stays_a_culprit(tmp_path):
    c = _stopped_in_it(tmp_path, elapsed=19.5)["communicators"][0]
    assert c["culprits"] == [0, 2]
    assert not c["first_divergence"]["not_yet"]
    assert c["verdict"].startswith(f"rank 2 was found {WHY}") and "rank 0 never entered all_reduce #4" in c["verdict"]


def test_a_dump_without_unable_still_analyses_as_before(tmp_path):
    c = _stopped_in_it(tmp_path, old=True)["communicators"][0]
    assert c["verdict"] == "rank 0 never entered all_reduce #4 [Float(4,)] on 'world'"
    assert c["culprits"] == [0] and c["first_divergence"]["found_unable"] == {}


@pytest.mark.parametrize("bad", ["stopped", {"2": "stopped"}, {"2": {"pid": "x"}}])
def test_an_unable_field_of_another_type_is_an_unreadable_dump(tmp_path, bad):
    _stopped_in_it(tmp_path)
    path = os.path.join(tmp_path, "generation_0", f"{PREFIX}1")
    with open(path, "rb") as f:
        dump = pickle.load(f)
    dump["pycoll"]["failures"][0]["unable"] = bad
    with open(path, "wb") as f:
        pickle.dump(dump, f)
    os.unlink(os.path.join(tmp_path, "json", "generation_0", f"{PREFIX}1.json"))
    dumps, problems = analyze.load_generation(os.path.join(tmp_path, "generation_0"))
    assert 1 not in dumps and sorted(dumps) == [0, 2]
    assert any("unable" in p for p in problems), problems
