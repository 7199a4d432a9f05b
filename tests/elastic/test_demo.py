"""The demo (pycoll's main job) and the fault-tolerant training example, end to end."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
from helpers import REPO

ROOT = REPO


def _run(args, timeout=90, **extra_env):
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""), **extra_env)
    return subprocess.run([sys.executable] + args, capture_output=True, text=True, timeout=timeout, env=env, cwd=ROOT)


@pytest.mark.timeout(120)
def test_demo_survives_a_killed_rank_and_grows_back(tmp_path):
    p = _run(["-m", "pycoll.demo", "--steps", "40", "--kill-step", "10", "--dump-dir", str(tmp_path)])
    out = p.stdout
    assert p.returncode == 0, out + p.stderr
    assert "slot 2: killing myself with SIGKILL at step 10" in out
    assert "generation 1 (shrink): members [0, 1, 2, 3] -> [0, 1, 3]" in out
    assert "generation 2 (grow): members [0, 1, 3] -> [0, 1, 3, 2]" in out
    assert "replacement for slot 2 joined as rank 3 of generation 2" in out
    assert "verdict: rank 2 (no dump)" in out  # the analyzer names the lost rank
    assert "PASS: 4 ranks (slots [0, 1, 3, 2]) hold identical parameters after 40 steps" in out
    dumps = sorted(os.listdir(tmp_path / "generation_0"))
    assert dumps == ["pycoll_trace_rank_0", "pycoll_trace_rank_1", "pycoll_trace_rank_3"]


@pytest.mark.timeout(120)
def test_example_under_pycoll_run(tmp_path):
    p = _run(["-m", "pycoll.run", "-n", "4", "--replace-failed", "1", "--timeout", "90",
              os.path.join(ROOT, "examples", "fault_tolerant_training.py"),
              "--steps", "300", "--kill-slot", "1", "--kill-step", "15"], PYCOLL_FR_DUMP_DIR=str(tmp_path))
    assert p.returncode == 0, p.stdout + p.stderr
    assert "generation 1 (shrink): members [0, 1, 2, 3] -> [0, 2, 3]" in p.stdout
    assert "generation 2 (grow): members [0, 2, 3] -> [0, 2, 3, 1]" in p.stdout
    assert "done: 4 ranks, generation 2" in p.stdout
