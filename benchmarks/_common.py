"""What the benchmark scripts share: finding the pycoll to benchmark and the environment for its ranks."""

from __future__ import annotations

import os
import sys
from typing import Any, Dict

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
