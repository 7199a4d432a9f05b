"""``python -m pycoll.demo --trace``: the whole demo run (a killed rank, the shrink, the grow) as one trace."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from helpers import REPO

from pycoll.diagnostics import trace


@pytest.mark.timeout(150)
def test_demo_writes_a_trace_with_the_recovery(tmp_path):
    out = tmp_path / "demo.json"
    env = dict(os.environ, PYTHONPATH=REPO + os.pathsep + os.environ.get("PYTHONPATH", ""))
    p = subprocess.run([sys.executable, "-m", "pycoll.demo", "--steps", "30", "--kill-step", "8", "--dump-dir",
                        str(tmp_path / "dumps"), "--trace", str(out)], capture_output=True, text=True, timeout=120,
                       env=env, cwd=REPO)
    assert p.returncode == 0, p.stdout + p.stderr
    assert f"pycoll demo: wrote {out}: 4 ranks" in p.stdout
    # the failure's dumps of generation 0 are kept as they were; the later generations were dumped at the end
    assert sorted(os.listdir(tmp_path / "dumps" / "generation_0")) == [f"pycoll_trace_rank_{r}" for r in (0, 1, 3)]
    assert len(os.listdir(tmp_path / "dumps" / "generation_2")) == 4
    t = json.loads(out.read_text())
    assert trace.check_trace(t) == []
    evs = t["traceEvents"]
    procs = {e["pid"]: e["args"]["name"] for e in evs if e["ph"] == "M" and e["name"] == "process_name"}
    assert sorted(procs) == [0, 1, 2, 3]
    threads = {(e["pid"], e["tid"]): e["args"]["name"] for e in evs if e["ph"] == "M" and e["name"] == "thread_name"}
    for r in (0, 1, 3):  # the survivors: every generation's communicator, and the recovery
        names = {n for (pid, _), n in threads.items() if pid == r}
        assert any(n.startswith("demo gen 0") for n in names) and any(n.startswith("demo gen 1") for n in names)
        assert any(n.startswith("demo gen 2") for n in names) and "elastic (recovery phases)" in names
    el = [e for e in evs if e["ph"] == "X" and e["cat"] == "elastic"]
    assert sorted(e["pid"] for e in el if e["name"] == "shrink -> generation 1") == [0, 1, 3]
    assert sorted(e["pid"] for e in el if e["name"] == "grow -> generation 2") == [0, 1, 2, 3]
    phases = {e["name"] for e in el}
    assert {"agreement", "shrink", "grow", "first collective"} <= phases
    ops = [e for e in evs if e["ph"] == "X" and e["cat"] == "collective"]
    failed = [e for e in ops if e["args"]["in_flight"]]
    # the survivors' operations in flight as slot 2 died (a survivor the failure reached between two operations --
    # rank 0's broadcasts in maybe_grow() run ahead of the others, so it meets the death first -- has none)
    assert failed and {e["pid"] for e in failed} <= {0, 1, 3} and all(e["args"]["generation"] == 0 for e in failed)
    assert all(e["args"].get("first_divergence") for e in failed)
    assert sorted(e["pid"] for e in evs if e["ph"] == "i" and e["cat"] == "failure") == [0, 1, 3]
    verdicts = [e["args"]["verdict"] for e in evs if e["ph"] == "i" and e["name"].startswith("verdict")]
    assert any("rank 2 (no dump) was not seen entering" in v for v in verdicts), verdicts
    # the slices of generation 1 come after the shrink, on every survivor: the recovery ends when the shrunk
    # communicator is ready (reshape() runs no collective of its own), and every one of them starts after it
    for r in (0, 1, 3):
        def phase(name):
            return [e for e in el if e["pid"] == r and e["name"] == name and e["args"].get("generation") == 1]
        (ready,) = phase("shrink")
        (whole,) = phase("shrink -> generation 1")
        assert not phase("first collective")
        assert abs(ready["ts"] + ready["dur"] - (whole["ts"] + whole["dur"])) <= 1
        gen1 = sorted(e["ts"] for e in ops if e["pid"] == r and e["args"]["generation"] == 1)
        assert gen1 and all(t >= whole["ts"] + whole["dur"] - 1 for t in gen1)  # ts in us, rounded
