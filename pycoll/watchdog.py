"""Alias of :mod:`pycoll.diagnostics.watchdog` (the module moved there)."""

import sys

from .diagnostics import watchdog as _module

sys.modules[__name__] = _module
