"""The source distribution holds what a build from it needs: setup.py cythonizes the .pyx (with their .pxi and
.pxd) and compiles the host library's C sources and headers (an sdist without them failed to install)."""

from __future__ import annotations

import glob
import os
import subprocess
import sys

import pytest

import pycoll

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(pycoll.__file__)))


@pytest.mark.timeout(120)
def test_the_sdist_lists_every_build_source(tmp_path):
    res = subprocess.run([sys.executable, "setup.py", "-q", "egg_info", "--egg-base", str(tmp_path)], cwd=ROOT,
                         capture_output=True, text=True, timeout=100)
    assert res.returncode == 0, res.stderr
    (sources,) = glob.glob(str(tmp_path / "*.egg-info" / "SOURCES.txt"))
    listed = set(open(sources).read().split())
    needed = {os.path.relpath(p, ROOT) for ext in ("pyx", "pxi", "pxd", "pyi", "h")
              for p in glob.glob(os.path.join(ROOT, "pycoll", "**", f"*.{ext}"), recursive=True)}
    needed |= {os.path.relpath(p, ROOT) for p in glob.glob(os.path.join(ROOT, "pycoll", "_host", "*.c"))}
    assert {"pycoll/_core.pyx", "pycoll/_bindings/_nccl.pyx", "pycoll/_host/comm.h"} <= needed
    assert sorted(needed - listed) == []
