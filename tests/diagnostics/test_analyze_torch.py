"""pycoll-fr on torch's own dumps of a gloo job (torch 2.13): its ``pg_config`` names no group the entries name,
and its entries never leave the state ``scheduled``."""

from __future__ import annotations

import os
import pickle
import shutil
import subprocess
import sys

import pytest

from pycoll import analyze

pytest.importorskip("torch.distributed")
JOB = os.path.join(os.path.dirname(os.path.abspath(__file__)), "torch_gloo_job.py")


def _job(folder, world, scenario):
    procs = [subprocess.Popen([sys.executable, JOB, str(r), str(world), str(folder), scenario], stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT) for r in range(world)]
    try:
        outs = [p.communicate(timeout=120)[0].decode(errors="replace") for p in procs]
    finally:
        for p in procs:
            p.kill()
            p.wait()
    for r, p in enumerate(procs):
        assert p.returncode == 0 and os.path.exists(folder / f"rank_{r}"), f"rank {r}: {outs[r][-2000:]}"
    if os.path.exists(folder / "store"):
        os.remove(folder / "store")
    return folder


@pytest.fixture(scope="module")
def gloo_dumps(tmp_path_factory):
    """The dumps of a 3-rank gloo job (torch_gloo_job.py): rank 0 issued all_reduce #4, the others did not."""
    return _job(tmp_path_factory.mktemp("gloo"), 3, "world")


def test_the_dumps_are_torchs_gloo_dumps(gloo_dumps):
    """What the analysis must read past (if a later torch fixes it, the other tests still hold)."""
    with open(gloo_dumps / "rank_0", "rb") as f:
        d = pickle.load(f)
    named = {e["process_group"][0] for e in d["entries"]}
    assert named == {"0", "1"} and not named & set(d["pg_config"])
    assert {e["state"] for e in d["entries"]} == {"scheduled"}


def test_the_rank_that_never_entered_is_found(gloo_dumps):
    reps = analyze.analyze_dir(str(gloo_dumps))
    comms = {c["uid"]: c for c in reps[0]["communicators"]}
    assert set(comms) == {"0", "1"}  # not the '' pg_config names
    world, pair = comms["0"], comms["1"]
    assert world["members"] == [0, 1, 2] and pair["members"] == [0, 1]
    div = world["first_divergence"]
    assert div["seq"] == 4 and world["matched_through"] == 3
    assert sorted(div["never_entered"]) == [1, 2] and sorted(div["in_flight"]) == [0]
    assert analyze._culprits(world) == [1, 2]
    assert pair["first_divergence"] is None and pair["matched_through"] == 1
    text = analyze.format_report(reps)
    assert "verdict: ranks 1-2 never entered all_reduce #4" in text, text
    sites = [ln.split("issued at ")[1] for ln in text.splitlines() if "issued at " in ln]
    assert len(sites) == 3 and all(s.startswith("torch_gloo_job.py:") for s in sites), sites  # not torch's frames
    assert ("note: group 0 (default_pg): its dumps list no members (torch's gloo dumps); taken as ranks 0-2, up to "
            "the highest rank with a dump") in text
    assert ("note: group 1 (undefined): its dumps list no members (torch's gloo dumps); taken as ranks 0-1, the "
            "ranks whose dumps know it") in text
    assert "note: torch's gloo dumps say that an operation ended, not how" in text


def test_a_missing_dump_is_a_rank_without_one(gloo_dumps, tmp_path):
    """Rank 1's dump gone (a killed rank): the default group still spans it (rank 2's dump is there), the pair
    group is taken as rank 0 alone -- the report says its members are a guess."""
    for r in (0, 2):
        shutil.copy(gloo_dumps / f"rank_{r}", tmp_path / f"rank_{r}")
    reps = analyze.analyze_dir(str(tmp_path))
    world = next(c for c in reps[0]["communicators"] if c["uid"] == "0")
    assert world["members"] == [0, 1, 2] and world["missing_dumps"] == [1]
    assert sorted(world["first_divergence"]["never_entered"]) == [2]
    assert analyze.main([str(tmp_path)]) == 1


def test_groups_numbered_apart_in_each_process_are_told_apart(tmp_path):
    """Groups [0, 2] and [1, 3]: each process numbers its groups itself (pg_status's keys), rank 1's first group is
    the second one; taking those numbers for the groups' uids put ranks 1 and 3 into [0, 2] and blamed them for
    the broadcast rank 0 never entered."""
    reps = analyze.analyze_dir(str(_job(tmp_path, 4, "pairs")))
    comms = {c["uid"]: c for c in reps[0]["communicators"]}
    assert comms["1"]["members"] == [0, 2] and comms["2"]["members"] == [1, 3], comms
    div = comms["1"]["first_divergence"]
    assert div["seq"] == 2 and sorted(div["never_entered"]) == [0] and sorted(div["in_flight"]) == [2], div
    assert comms["2"]["first_divergence"] is None and comms["2"]["matched_through"] == 2
    assert comms["0"]["first_divergence"] is None
    assert not reps[0]["problems"], reps[0]["problems"]  # the guesses are notes


def test_a_healthy_jobs_dumps_exit_0(gloo_dumps, tmp_path):
    """The guessed members are a note, no problem: a job whose operations all matched exits 0 (it exited 1)."""
    for r in range(3):  # the dumps without rank 0's last all_reduce: every operation matched
        with open(gloo_dumps / f"rank_{r}", "rb") as f:
            d = pickle.load(f)
        d["entries"] = [e for e in d["entries"] if not (r == 0 and e["collective_seq_id"] == 4)]
        with open(tmp_path / f"rank_{r}", "wb") as f:
            pickle.dump(d, f)
    assert analyze.main([str(tmp_path)]) == 0


def test_the_only_groups_members_come_from_its_config(tmp_path):
    """With the default group alone, pg_config's '' entry is its own (torch 2.13): its ranks are the members, so a
    killed rank 2 without a dump is one (it was left out, 'up to the highest rank with a dump')."""
    def entry(seq, retired):
        return {"record_id": seq, "pg_id": 0, "process_group": ("0", "default_pg"), "collective_seq_id": seq,
                "p2p_seq_id": 0, "op_id": seq, "profiling_name": "gloo:all_reduce", "input_sizes": [[4]],
                "input_dtypes": ["Float"], "output_sizes": [[4]], "output_dtypes": ["Float"], "state": "scheduled",
                "retired": retired, "is_p2p": False, "frames": [], "time_created_ns": seq}

    for r in (0, 1):
        d = {"version": "2.10", "pg_config": {"": {"name": "", "desc": "", "ranks": "[0, 1, 2]"}},
             "pg_status": {"0": {"last_enqueued_collective": 3}},
             "entries": [entry(1, True), entry(2, True), entry(3, False)]}
        with open(tmp_path / f"rank_{r}", "wb") as f:
            pickle.dump(d, f)
    rep = analyze.analyze_dir(str(tmp_path))[0]
    (c,) = rep["communicators"]
    assert c["members"] == [0, 1, 2] and c["missing_dumps"] == [2], c
    assert not any("taken as ranks" in n for n in rep["notes"]), rep["notes"]
    assert analyze.main([str(tmp_path)]) == 1
