"""benchmarks/recovery.py --plot: the recovery phases of pycoll and Open MPI ULFM side by side, as a PNG."""

from __future__ import annotations

import importlib.util
import json
import os
import struct
import subprocess
import sys

import pytest
from helpers import REPO

SCRIPT = os.path.join(REPO, "benchmarks", "recovery.py")
RESULTS = os.path.join(REPO, "benchmarks", "results", "recovery.json")


def _png_size(path):
    with open(path, "rb") as f:
        head = f.read(24)
    assert head[:8] == b"\x89PNG\r\n\x1a\n" and head[12:16] == b"IHDR"
    return struct.unpack(">II", head[16:24])


def test_plot_from_a_results_file(tmp_path):
    out = tmp_path / "r.png"
    env = dict(os.environ, PYTHONPATH=REPO + os.pathsep + os.environ.get("PYTHONPATH", ""))
    p = subprocess.run([sys.executable, SCRIPT, "--plot", str(out), "--from-json", RESULTS], capture_output=True,
                       text=True, timeout=60, env=env)
    assert p.returncode == 0, p.stdout + p.stderr
    assert "# drew pycoll-kill, pycoll-kill-nofr, mpi-kill" in p.stdout
    w, h = _png_size(out)
    assert w == 1000 and h > 300 and os.path.getsize(out) < 150_000


def test_plot_draws_only_cases_with_results(tmp_path):
    spec = importlib.util.spec_from_file_location("recovery_bench_plot", SCRIPT)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    with open(RESULTS) as f:
        doc = json.load(f)
    doc["results"] = {k: v for k, v in doc["results"].items() if k in ("pycoll-kill", "mpi-kill")}
    assert mod.plot_phases(doc, str(tmp_path / "a.png")) == ["pycoll-kill", "mpi-kill"]
    _png_size(tmp_path / "a.png")
    with pytest.raises(SystemExit, match="no case with results"):
        mod.plot_phases({"results": {}}, str(tmp_path / "b.png"))
    with pytest.raises(SystemExit):
        mod.main(["--from-json", RESULTS])  # --from-json needs --plot
