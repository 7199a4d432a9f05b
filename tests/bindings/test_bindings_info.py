"""python -m pycoll.info: a self-check that never shows a traceback and always exits 0."""

from __future__ import annotations

import io
import os
import subprocess
import sys

import pytest
from helpers import REPO

from pycoll import info

pytestmark = pytest.mark.timeout(120)

ROOT = REPO


def test_cli_reports_every_library(tmp_path):
    env = dict(os.environ, PYTHONPATH=ROOT, ROCM_PATH=str(tmp_path), NCCL_SOCKET_IFNAME="lo",
               PYCOLL_NCCL_LIBRARY=str(tmp_path / "libmissing.so"))
    out = subprocess.run([sys.executable, "-m", "pycoll.info"], capture_output=True, text=True, timeout=100,
                         env=env)
    assert out.returncode == 0
    assert "Traceback" not in out.stdout + out.stderr
    text = out.stdout
    assert "rccl: not found" in text
    assert "host:" in text
    assert f"$PYCOLL_NCCL_LIBRARY={tmp_path / 'libmissing.so'}: not found" in text
    assert "no such file" in text
    if info.probe("nccl")["found"]:
        assert "nccl: found" in text and "version  2." in text


def test_cli_takes_help_and_refuses_other_arguments():
    env = dict(os.environ, PYTHONPATH=ROOT)
    run = [sys.executable, "-m", "pycoll.info"]
    out = subprocess.run(run + ["--help"], capture_output=True, text=True, timeout=100, env=env)
    assert out.returncode == 0 and out.stdout.startswith("usage: python -m pycoll.info"), out.stdout
    assert "host:" not in out.stdout  # the help, not the report
    out = subprocess.run(run + ["--bogus"], capture_output=True, text=True, timeout=100, env=env)
    assert out.returncode == 2 and "unrecognized arguments: --bogus" in out.stderr, out.stderr


def test_probe_found_and_not_found(tmp_path):
    missing = info.probe(str(tmp_path / "nothing.so"))
    assert missing["found"] is False and "no such file" in missing["error"]
    nccl = info.probe("nccl")
    if nccl["found"]:
        assert nccl["kind"] == "nccl" and nccl["version"] >= 20000
        assert isinstance(nccl["missing"], dict)


def test_show_versions_writes_to_a_file():
    buf = io.StringIO()
    info.show_versions(buf)
    text = buf.getvalue()
    assert text.startswith("pycoll ") and "nccl:" in text and "rccl:" in text and "host:" in text
    assert info.main([]) == 0
