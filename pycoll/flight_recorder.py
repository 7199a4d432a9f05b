"""Alias of :mod:`pycoll.diagnostics.recorder` (the module moved there)."""

import sys

from .diagnostics import recorder as _module

sys.modules[__name__] = _module
