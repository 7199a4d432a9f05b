"""Shared test helpers (not tests): run ranks as processes, host-library references, fakes.

``tests/conftest.py`` puts ``tests/`` on ``sys.path``, so test modules import these as
``from helpers.mp import run_ranks``. ``REPO`` is the repository root, whatever folder a test sits in.
"""

from __future__ import annotations

import os

TESTS = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
REPO = os.path.dirname(TESTS)


def mpi_ready() -> bool:
    """The benchmarks would run Open MPI here: ``benchmarks/_common.find_mpiexec`` (an mpiexec beside this interpreter
    or on PATH, and mpi4py for this interpreter) finds one."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("_bench_common", os.path.join(REPO, "benchmarks", "_common.py"))
    assert spec is not None and spec.loader is not None
    common = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(common)
    return common.find_mpiexec() is not None
