"""Alias of :mod:`pycoll.launch.launcher` (``pycoll-run``; the module moved there): ``python -m pycoll.run``
runs it. Besides the launcher's names it offers those of :mod:`pycoll.launch.keys` it used to hold."""

import sys

if __name__ == "__main__":
    from pycoll.launch.launcher import main

    sys.exit(main())

from .launch.keys import RUN_KEY_PREFIX, failures, mark_lost
from .launch.launcher import *  # noqa: F403
from .launch.launcher import EXIT_TIMEOUT, main

KEY_PREFIX = RUN_KEY_PREFIX

__all__ = ["main", "mark_lost", "failures", "KEY_PREFIX", "RUN_KEY_PREFIX", "EXIT_TIMEOUT"]
