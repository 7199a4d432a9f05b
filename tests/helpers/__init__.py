"""Shared test helpers (not tests): run ranks as processes, host-library references, fakes.

``tests/conftest.py`` puts ``tests/`` on ``sys.path``, so test modules import these as
``from helpers.mp import run_ranks``. ``REPO`` is the repository root, whatever folder a test sits in.
"""

from __future__ import annotations

import os

TESTS = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
REPO = os.path.dirname(TESTS)
