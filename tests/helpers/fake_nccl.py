"""Fake NCCL-ABI libraries (tests/bindings/fake_nccl.c) built with gcc, with scripted behaviour.

``Fake(path)`` loads one: ``.lib`` is the pycoll Library, ``.ctl`` the ctypes handle of its control
functions (``fakeSetNextResult``, ``fakeSetAsyncState``, ``fakeSetDelayMs``, ``fakeLastArgs``...).
"""

from __future__ import annotations

import ctypes
import os
import shutil
import subprocess
from typing import Dict, List

import pytest

from pycoll._bindings import _nccl

from . import TESTS

SOURCE = os.path.join(TESTS, "bindings", "fake_nccl.c")


def _gcc(out_dir: str, name: str, source: str, *flags: str) -> str:
    path = os.path.join(out_dir, name)
    cmd = ["gcc", "-shared", "-fPIC", "-O1", "-pthread", "-fvisibility=hidden", "-o", path, source, *flags]
    subprocess.run(cmd, check=True, capture_output=True, timeout=60)
    return path


def preload_kit(d: str, shim: str, rank: str, what: str) -> str:
    """Folder ``d`` with ``shim.so`` (C source ``shim``: a wrapper to preload into ranks, LD_PRELOAD) and ``rank.py``
    (the ranks' script ``rank``); skips the test without gcc, naming ``what`` the wrapper is."""
    if shutil.which("gcc") is None:
        pytest.skip(f"gcc is needed to build the {what}")
    with open(os.path.join(d, "shim.c"), "w") as f:
        f.write(shim)
    _gcc(d, "shim.so", os.path.join(d, "shim.c"), "-ldl")
    with open(os.path.join(d, "rank.py"), "w") as f:
        f.write(rank)
    return d


def build_fakes(d: str) -> Dict[str, str]:
    """Build the fakes into folder ``d``: paths of "nccl", "host", "rccl" and "plain" (not NCCL at all)."""
    if shutil.which("gcc") is None:
        pytest.skip("gcc is needed to build the fake libraries")
    plain_src = os.path.join(d, "plain.c")
    with open(plain_src, "w") as f:
        f.write("__attribute__((visibility(\"default\"))) int notNccl(void) { return 0; }\n")
    return {
        "nccl": _gcc(d, "libfake_nccl.so", SOURCE),
        "host": _gcc(d, "libfake_host.so", SOURCE, "-DFAKE_HOST", "-DFAKE_VERSION=23203"),
        "rccl": _gcc(d, "libfake_rccl.so", SOURCE, "-DFAKE_RCCL", "-DFAKE_VERSION=23004"),
        "plain": _gcc(d, "libplain.so", plain_src),
    }


class Fake:
    """A loaded fake: the Library plus ctypes access to its control functions."""

    def __init__(self, path: str) -> None:
        self.lib = _nccl.load(path)
        self.ctl = ctypes.CDLL(path)
        self.ctl.fakeSetNextResult(0)
        self.ctl.fakeSetDelayMs(0)
        self.ctl.fakeSetAsyncState(0)
        self.ctl.fakeSetAbortDelayMs(0)

    def last_args(self) -> List[int]:
        buf = (ctypes.c_uint64 * 12)()
        self.ctl.fakeLastArgs(buf)
        return list(buf)

    def sorted_exclude(self) -> List[int]:
        buf = (ctypes.c_int * 64)()
        n = self.ctl.fakeSortedExclude(buf)
        return list(buf[:n]) if n > 0 else []
