"""Shared test helpers (not tests): run ranks as processes, host-library references, fakes.

``tests/conftest.py`` puts ``tests/`` on ``sys.path``, so test modules import these as
``from helpers.mp import run_ranks``. ``REPO`` is the repository root, whatever folder a test sits in.
"""

from __future__ import annotations

import os

TESTS = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
REPO = os.path.dirname(TESTS)


def mpi_ready() -> bool:
    """Open MPI's mpiexec (beside this interpreter or on PATH) and mpi4py for this interpreter: the benchmarks' ranks
    run this interpreter, so another environment's mpiexec on PATH alone is not enough."""
    import importlib.util
    import shutil
    import sys

    if importlib.util.find_spec("mpi4py") is None:
        return False
    where = os.path.dirname(sys.executable) + os.pathsep + os.environ.get("PATH", "")
    return shutil.which("mpiexec", path=where) is not None
