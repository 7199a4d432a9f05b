"""The recovery-latency harness (benchmarks/recovery.py) runs, recovers and reports a full breakdown.

One trial per case with a short warm-up: these tests look at what the harness produces, never at
speed (the only time bounds are sanity bounds of tens of seconds).
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys

import pytest
from helpers import REPO, mpi_ready

import pycoll

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(pycoll.__file__)))
SCRIPT = os.path.join(REPO, "benchmarks", "recovery.py")
PYCOLL_PHASES = ["detection", "to_reshape", "agreement", "revoke", "shrink", "first_allreduce"]
MPI_PHASES = ["detection", "revoke", "shrink", "first_allreduce"]


def _load():
    spec = importlib.util.spec_from_file_location("recovery_bench", SCRIPT)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _run(args, timeout=100):
    env = dict(os.environ)
    env["PYTHONPATH"] = ROOT + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    for var in ("PYCOLL_RANK", "PYCOLL_WORLD_SIZE"):
        env.pop(var, None)
    return subprocess.run([sys.executable, SCRIPT, *args], env=env, capture_output=True, text=True, timeout=timeout)


def _check_trial(trial, phases, victim):
    assert "error" not in trial, trial
    assert trial["victim"] == victim and trial["correct"] is True
    assert trial["left_running"] == [] and trial["killed_after_grace"] == 0, trial
    got = trial["phases"]
    assert list(got) == phases + ["total"], got
    assert all(v >= 0 for v in got.values()), got
    # the phases are consecutive intervals of the slowest survivor's timeline: they add up to the total
    assert sum(got[p] for p in phases) == pytest.approx(got["total"], abs=0.01)
    assert 0 < got["total"] < 30_000
    assert set(trial["per_rank"]) == {str(r) for r in range(4) if r != victim}


@pytest.mark.timeout(150)
def test_pycoll_kill_and_stop_one_trial_each(tmp_path):
    out = tmp_path / "r.json"
    md = tmp_path / "r.md"
    res = _run(["--cases", "pycoll-kill", "pycoll-stop", "--trials", "1", "--warmup", "50", "--victim", "2",
                "--stop-timeout", "30", "--trial-timeout", "40", "--json", str(out), "--markdown", str(md)],
               timeout=130)
    assert res.returncode == 0, res.stdout + res.stderr
    doc = json.loads(out.read_text())
    assert doc["ranks"] == 4 and doc["warmup"] == 50
    for case in ("pycoll-kill", "pycoll-stop"):
        r = doc["results"][case]
        assert r["ok"] == 1 and r["failed"] == 0, r["errors"]
        trial = r["trials"][0]
        _check_trial(trial, PYCOLL_PHASES, victim=2)
        assert trial["exit_codes"][2] == -9  # the victim (SIGCONT + SIGKILL after a SIGSTOP)
        assert [c for i, c in enumerate(trial["exit_codes"]) if i != 2] == [0, 0, 0]  # survivors closed and exited
        for raw in trial["raw"].values():
            assert raw["members"] == [0, 1, 3] and raw["kind"] == "shrink"
        assert set(r["summary"]) == set(PYCOLL_PHASES) | {"total", "fr_dump", "fr_dump_after"}
        # the watchdog dumped the flight recorder (50 warm-up entries and more), after the recovery
        assert trial["fr_dump_entries"] >= 50 and trial["fr_dump_after"] > 0, trial
        assert trial["fr_dump"] < 1.0, trial
    stop = doc["results"]["pycoll-stop"]
    # the survivors' watchdogs find the stopped rank (its process state) long before the 30 s timeout
    assert stop["trials"][0]["phases"]["detection"] < 1500 and stop["before_timeout"] == 1
    assert "overhead" not in stop
    assert doc["shm_left"] == []
    assert "first allreduce" in res.stdout and "found within about 1 s, before T: met" in res.stdout
    assert "| total |" in md.read_text()


@pytest.mark.timeout(120)
@pytest.mark.skipif(not mpi_ready(), reason="needs mpi4py and Open MPI's mpiexec")
def test_mpi_ulfm_kill_one_trial(tmp_path):
    out = tmp_path / "m.json"
    res = _run(["--cases", "mpi-kill", "--trials", "1", "--warmup", "50", "--victim", "1", "--trial-timeout", "40",
                "--json", str(out)], timeout=100)
    doc = json.loads(out.read_text())
    r = doc["results"]["mpi-kill"]
    if r["failed"] and "ulfm" in " ".join(r["errors"]).lower():
        pytest.skip(f"this Open MPI has no ULFM: {r['errors']}")
    assert res.returncode == 0, res.stdout + res.stderr
    trial = r["trials"][0]
    _check_trial(trial, MPI_PHASES, victim=1)
    assert trial["exit_codes"] == [0]  # mpiexec ended by itself once the survivors exited
    assert trial["proc_failed_ranks"], trial  # at least one survivor saw MPI_ERR_PROC_FAILED itself


def test_statistics_and_table():
    mod = _load()
    assert mod.percentile([5, 1, 4, 2, 3], 90) == 5  # nearest rank
    assert mod.percentile(list(range(1, 11)), 90) == 9
    s = mod.stats([3.0, 1.0, 2.0])
    assert s == {"median": 2.0, "min": 1.0, "p90": 3.0, "max": 3.0, "n": 3}
    with pytest.raises(SystemExit):
        mod.main(["--ranks", "2"])  # a shrink needs two survivors

    class A:
        stop_timeout = 1.0

    def summary(total, **extra):
        d = {"total": mod.stats([total])}
        d.update({k: mod.stats([v]) for k, v in extra.items()})
        return d

    results = {
        "pycoll-kill": {"summary": summary(40.0, detection=8.0), "ok": 1, "failed": 0},
        "mpi-kill": {"summary": summary(20.0, detection=10.0), "ok": 1, "failed": 0},
    }
    head, body = mod.build_table(results, A())
    assert head[1].startswith("pycoll SIGKILL") and head[3] == "pycoll / Open MPI"
    rows = {r[0]: r for r in body}
    assert rows["total"][3] == "2.00x" and rows["detection"][3] == "0.80x"
    assert "to reshape" not in rows  # no case measured it
    lines = mod.verdicts(results, A())
    assert "median 40.0 ms (target <= 100 ms: met)" in lines[0] and "ratio 2.00x (target below 1: NOT met)" in lines[0]
