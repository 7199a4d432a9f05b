"""pycoll-fr on a dump older than what the other ranks did (a rank that dumped on demand, then was killed), and on
files that parse but are no dump of the schema it reads."""

from __future__ import annotations

import json
import os
import shutil
import time

import numpy as np
import pytest
from helpers.fakes import FakeComm

from pycoll import analyze, flight_recorder as fr

PREFIX = fr.DEFAULT_FILE_PREFIX
UID = "abcdef0123456789"


def _allreduces(c, k, **kw):
    for _ in range(k):
        c.op("all_reduce", np.ones(2, np.float32), np.ones(2, np.float32), **kw)


def _killed_after_its_dump(folder, *, dumped_at, done, failed_in, late_by=0.0, trigger="manual"):
    """3 ranks: rank 2 dumps (``trigger``) after ``dumped_at`` all_reduces and is killed; ranks 0-1 complete ``done``,
    then fail in #``failed_in`` and record that rank 2's process is gone (their failure ``late_by`` s after the
    dump)."""
    for r in (2, 0, 1):
        rec = fr.FlightRecorder(64, dump_dir=str(folder))
        c = FakeComm(rec, r, 3, uid=UID, name="world")
        if r == 2:
            _allreduces(c, dumped_at)
            assert rec.dump("checkpoint look", trigger=trigger)
            continue
        _allreduces(c, done)
        _allreduces(c, failed_in - done, state="started")
        now = time.time() + late_by
        peer = {"coll_enqueued": done, "coll_started": done, "coll_completed": done, "p2p_enqueued": 0,
                "p2p_started": 0, "p2p_completed": 0, "state": "active", "time_ns": int(now * 1e9), "beats": 9,
                "origin": "h:7", "request": -1}
        rec.add_failure(0, {"time": now, "uid": UID, "rank": r, "error_type": "RemoteError", "op": "all_reduce",
                            "seq": failed_in, "message": "rank 2 (pid 4242) exited", "elapsed_s": 0.001,
                            "peers": {"2": peer}, "unconfirmed": {"2": {"last_issued": done, "report_age_s": 0.0}},
                            "gone": {"2": 4242}, "silent": {}, "peer_failures": {}})
        assert rec.dump("failure", trigger="failure")
    return str(folder)


def test_a_dump_older_than_what_the_others_completed_is_not_taken_for_a_rank_that_stopped(tmp_path):
    # rank 2 dumped after all_reduce #2; ranks 0-1 completed #3-#10 (which took rank 2's part) and failed in #11
    d = _killed_after_its_dump(tmp_path, dumped_at=2, done=10, failed_in=11)
    rep = analyze.analyze_dir(d)[0]
    c = rep["communicators"][0]
    div = c["first_divergence"]
    assert div["seq"] == 11 and div["never_entered"] == {} and c["matched_through"] == 10, div
    assert sorted(div["in_flight"]) == [0, 1] and list(div["stale_dumps"]) == [2]
    assert c["stale_dumps"][2]["through"] == 2
    assert "ranks 0-1 completed all_reduce #3-#10 after it, which took its part" in c["stale_dumps"][2]["why"]
    assert "its process (pid 4242) was gone when rank 1 looked; not seen entering it" in div["stale_dumps"][2]
    assert c["verdict"] == "rank 2 (its dump predates it) was not seen entering all_reduce #11 [Float(2,)] on 'world'"
    assert c["culprits"] == [2] and not rep["ok"]
    text = analyze.format_report([rep], stacks=False)
    assert "never entered" not in text, text
    assert "rank 2: its dump predates what the others did (manual: checkpoint look; ends at #2;" in text
    # the store's report of rank 2, fresher than its dump, is what the watchdogs' lines give
    assert "not confirmed: rank 2 (report 0.0 s old said #10) (its process is gone)" in text


def test_a_dump_written_well_before_the_others_failed_does_not_show_the_rank_stopped_there(tmp_path):
    # killed right after its dump: the others failed in #3 two seconds later; the dump cannot say whether it entered it
    d = _killed_after_its_dump(tmp_path, dumped_at=2, done=2, failed_in=3, late_by=2.0)
    c = analyze.analyze_dir(d)[0]["communicators"][0]
    div = c["first_divergence"]
    assert div["seq"] == 3 and div["never_entered"] == {} and list(div["stale_dumps"]) == [2], div
    assert "written 2.0 s before rank 0's failure" in c["stale_dumps"][2]["why"]
    assert c["verdict"] == "rank 2 (its dump predates it) was not seen entering all_reduce #3 [Float(2,)] on 'world'"


@pytest.mark.parametrize("case", ["exit dump", "just before"])
def test_a_dump_that_shows_where_its_rank_stopped_still_says_it_never_entered(tmp_path, case):
    # written as its rank exited, or at the others' failure: its rank was where its dump says
    kw = {"trigger": "exit", "late_by": 2.0} if case == "exit dump" else {}
    d = _killed_after_its_dump(tmp_path, dumped_at=2, done=2, failed_in=3, **kw)
    c = analyze.analyze_dir(d)[0]["communicators"][0]
    assert c["stale_dumps"] == {} and list(c["first_divergence"]["never_entered"]) == [2]
    assert c["verdict"] == "rank 2 never entered all_reduce #3 [Float(2,)] on 'world'"


def test_an_older_dump_of_a_job_that_ended_well_is_no_problem(tmp_path):
    # rank 2's dump on demand after #2; all ranks then completed #3-#5 and dumped no more: nothing went wrong
    for r in (2, 0, 1):
        rec = fr.FlightRecorder(64, dump_dir=str(tmp_path))
        c = FakeComm(rec, r, 3, uid=UID, name="world")
        _allreduces(c, 2 if r == 2 else 5)
        assert rec.dump("look")
    rep = analyze.analyze_dir(str(tmp_path))[0]
    c = rep["communicators"][0]
    assert c["first_divergence"] is None and c["matched_through"] == 5 and rep["ok"], c["verdict"]
    assert analyze.main([str(tmp_path)]) == 0


# -- files of odd structure ------------------------------------------------------------------------


def _three_ranks(folder):
    for r in range(3):
        rec = fr.FlightRecorder(64, dump_dir=str(folder))
        c = FakeComm(rec, r, 3, uid=UID, name="world")
        _allreduces(c, 3)
        if r != 2:
            _allreduces(c, 1, state="started")
        assert rec.dump("test", write_json=True)
    shutil.rmtree(os.path.join(folder, "generation_0"))  # the JSON files are read
    return str(folder)


def _set(path, value):
    def mut(d):
        *head, last = path
        for k in head:
            d = d[k]
        d[last] = value
    return mut


MUTATIONS = {
    "an int among the entries": lambda d: d["entries"].append(7),
    "an entry without its collective_seq_id": lambda d: d["entries"][0].pop("collective_seq_id"),
    "a string main_thread": _set(["pycoll", "main_thread"], "x"),
    "an int pg_config": _set(["pg_config"], 5),
    "a string entries": _set(["entries"], "abc"),
    "a string seq id": lambda d: d["entries"][0].__setitem__("collective_seq_id", "3"),
    "a string shape": lambda d: d["entries"][0].__setitem__("input_sizes", ["ab"]),
    "a string record id": lambda d: d["entries"][1].__setitem__("pycoll_record_id", "x"),
    "a string record id of another entry": lambda d: d["pycoll"]["other_entries"].append({"record_id": "x"}),
    "a string time of an entry": lambda d: d["entries"][2].__setitem__("time_created_ns", "x"),
    "a pg_config entry not an object": lambda d: d["pg_config"].__setitem__(UID, 3),
    "a string pycoll": _set(["pycoll"], "x"),
    "string comms": _set(["pycoll", "comms"], "x"),
    "a progress of strings": lambda d: d["pycoll"]["comms"][UID].__setitem__("progress", {"coll_enqueued": "x"}),
    "a failure not an object": _set(["pycoll", "failures"], [1]),
    "a failure's peers a list": _set(["pycoll", "failures"], [{"uid": UID, "peers": [1]}]),
    "earlier dumps of strings": _set(["pycoll", "earlier_dumps"], ["x"]),
    "string frames": lambda d: d["entries"][0].__setitem__("frames", "x"),
    "other_entries an int": _set(["pycoll", "other_entries"], 3),
}


def _mutate(path, what):
    """Rewrite the JSON dump at ``path`` with mutation ``what`` of :data:`MUTATIONS` applied."""
    with open(path) as f:
        data = json.load(f)
    MUTATIONS[what](data)
    with open(path, "w") as f:
        json.dump(data, f)


@pytest.mark.parametrize("what", sorted(MUTATIONS))
def test_a_well_formed_file_of_odd_structure_is_reported_and_the_other_ranks_analysed(tmp_path, capsys, what):
    d = _three_ranks(tmp_path)
    _mutate(os.path.join(d, "json", "generation_0", f"{PREFIX}1.json"), what)
    rep = analyze.analyze_dir(d)[0]
    assert rep["ranks"] == [0, 2]
    assert any(p.startswith(f"{PREFIX}1.json: unreadable (InvalidDump: invalid dump: ") for p in rep["problems"]), rep
    c = rep["communicators"][0]
    assert c["missing_dumps"] == [1] and c["first_divergence"]["seq"] == 4
    assert list(c["first_divergence"]["never_entered"]) == [2]
    assert analyze.main([d]) == 1  # problems found, as for any rank without a readable dump
    assert f"{PREFIX}1.json: unreadable (InvalidDump" in capsys.readouterr().out
    assert analyze.main([d, "--trace", str(tmp_path / "t.json")]) == 1
    # every file invalid: nothing could be analysed
    for r in (0, 2):
        _mutate(os.path.join(d, "json", "generation_0", f"{PREFIX}{r}.json"), what)
    assert analyze.main([d]) == 2
