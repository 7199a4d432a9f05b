"""Alias of :mod:`pycoll.diagnostics.watchdog` (the module moved there)."""

import sys
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # what type checkers see: the module's public names (at run time this module is that module)
    from .diagnostics.watchdog import *  # noqa: F403

from .diagnostics import watchdog as _module

sys.modules[__name__] = _module
