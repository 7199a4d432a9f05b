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


@pytest.fixture(scope="module")
def gloo_dumps(tmp_path_factory):
    """The dumps of a 3-rank gloo job (torch_gloo_job.py): rank 0 issued all_reduce #4, the others did not."""
    folder = tmp_path_factory.mktemp("gloo")
    procs = [subprocess.Popen([sys.executable, JOB, str(r), "3", str(folder)], stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT) for r in range(3)]
    try:
        outs = [p.communicate(timeout=120)[0].decode(errors="replace") for p in procs]
    finally:
        for p in procs:
            p.kill()
            p.wait()
    for r, p in enumerate(procs):
        assert p.returncode == 0 and os.path.exists(folder / f"rank_{r}"), f"rank {r}: {outs[r][-2000:]}"
    os.remove(folder / "store") if os.path.exists(folder / "store") else None
    return folder


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
    assert "taken as ranks 0-2, up to the highest rank with a dump" in text
    assert "taken as ranks 0-1, the ranks whose dumps know it" in text


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
