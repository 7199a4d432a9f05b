"""Alias of :mod:`pycoll.launch.launcher` (``pycoll-run``) and :mod:`pycoll.launch.keys`.

Kept so that ``python -m pycoll.run`` and imports from ``pycoll.run`` keep working.
"""

from __future__ import annotations

import sys

from .launch.keys import RUN_KEY_PREFIX, failures, mark_lost
from .launch.launcher import EXIT_TIMEOUT, main  # noqa: F401

KEY_PREFIX = RUN_KEY_PREFIX

__all__ = ["main", "mark_lost", "failures", "KEY_PREFIX"]

if __name__ == "__main__":
    sys.exit(main())
