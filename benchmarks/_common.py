"""What the benchmark scripts share: finding the pycoll to benchmark and the environment for its ranks."""

from __future__ import annotations

import os
import shutil
import sys
from typing import Any, Dict, List, Optional

HERE = os.path.dirname(os.path.abspath(__file__))
CHECKOUT = os.path.dirname(HERE)


def import_pycoll() -> Any:
    """The pycoll package to benchmark: the importable one, else this checkout's (added to ``sys.path``)."""
    try:
        import pycoll
    except ImportError:
        sys.path.insert(0, CHECKOUT)
        import pycoll
    return pycoll


def pycoll_path() -> str:
    """The directory holding the pycoll package to benchmark (see :func:`import_pycoll`)."""
    return os.path.dirname(os.path.dirname(os.path.abspath(import_pycoll().__file__)))


def env_with_pycoll() -> Dict[str, str]:
    """A copy of the environment whose ``PYTHONPATH`` starts with :func:`pycoll_path`, for child processes."""
    env = dict(os.environ)
    env["PYTHONPATH"] = pycoll_path() + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    return env


def mpiexec_command(nranks: int, argv: List[str], env: Dict[str, str]) -> Optional[List[str]]:
    """``mpiexec --oversubscribe -n N python argv...`` with Open MPI's mpiexec (beside this interpreter or
    on PATH), ``env`` made fit for it (root allowed); None when there is no mpiexec."""
    mpiexec = shutil.which("mpiexec", path=os.path.dirname(sys.executable) + os.pathsep + os.environ.get("PATH", ""))
    if mpiexec is None:
        return None
    if hasattr(os, "geteuid") and os.geteuid() == 0:
        env.update(OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")
    return [mpiexec, "--oversubscribe", "-n", str(nranks), sys.executable, *argv]
