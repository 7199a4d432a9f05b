"""The GPU tests and the GPU check script, seen from a machine without a GPU.

On a machine with a CUDA GPU the skip test is itself skipped (the GPU tests then run for real).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import pytest
from helpers import REPO

import pycoll
from pycoll.devices import cuda_device_count

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(pycoll.__file__)))


def _env():
    env = dict(os.environ)
    env["PYTHONPATH"] = ROOT + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    return env


@pytest.mark.timeout(60)
@pytest.mark.skipif(cuda_device_count() > 0, reason="this machine has a CUDA GPU: the GPU tests run for real")
def test_gpu_tests_skip_cleanly_without_a_gpu(tmp_path):
    res = subprocess.run([sys.executable, "-m", "pytest", "-q", "-rs", "-p", "no:cacheprovider",
                          os.path.join(REPO, "tests", "gpu", "test_gpu.py")],
                         cwd=tmp_path, env=_env(), capture_output=True, text=True, timeout=50)
    assert res.returncode in (0, 5), res.stdout + res.stderr  # 5: a module-level skip collects no test
    assert "1 skipped" in res.stdout and "no CUDA GPU" in res.stdout, res.stdout
    for bad in ("passed", "failed", "error", "Traceback"):
        assert bad not in res.stdout.lower().replace("skipped", ""), res.stdout


@pytest.mark.skipif(shutil.which("bash") is None, reason="no bash")
def test_gpu_check_script_parses():
    res = subprocess.run(["bash", "-n", os.path.join(REPO, "benchmarks", "gpu_check.sh")],
                         capture_output=True, text=True, timeout=10)
    assert res.returncode == 0, res.stderr


@pytest.mark.timeout(60)
def test_gpu_check_env_report_never_fails(tmp_path):
    """The environment report records what is missing instead of failing (here: the GPU)."""
    res = subprocess.run([sys.executable, os.path.join(REPO, "benchmarks", "gpu_check.py"), "env", "--out",
                          str(tmp_path)], env=_env(), capture_output=True, text=True, timeout=50)
    assert res.returncode == 0, res.stderr
    report = json.loads((tmp_path / "env.json").read_text())
    assert set(report) >= {"python", "platform", "nvidia_smi", "distributions", "pycoll", "torch"}
    libs = {lib["spec"]: lib for lib in report["pycoll"]["libraries"]}
    assert libs["host"]["found"] is True


@pytest.mark.timeout(60)
def test_gpu_tests_write_each_failure_before_a_crash_can_hide_it(tmp_path):
    """tests/gpu/conftest.py: a failure's traceback is in the output when the test ends, so a later
    segfault of the process (seen on an H200: a library crashed at ncclDevCommCreate) cannot hide it."""
    shutil.copy(os.path.join(REPO, "tests", "gpu", "conftest.py"), tmp_path / "conftest.py")
    (tmp_path / "test_crash.py").write_text(
        "import ctypes\n\n\n"
        "def test_fails():\n    assert 1 == 2, 'the first failure'\n\n\n"
        "def test_crashes():\n    ctypes.string_at(0)\n")
    res = subprocess.run([sys.executable, "-m", "pytest", "-v", "-p", "no:cacheprovider", "-p", "no:xdist",
                          "test_crash.py"], cwd=tmp_path, capture_output=True, text=True, timeout=50)
    assert res.returncode != 0
    out = res.stdout
    assert "the first failure" in out, out  # written before the crash ended the process
    assert out.index("the first failure") < out.index("test_crashes"), out
