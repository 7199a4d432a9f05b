"""Alias of :mod:`pycoll.launch.discovery` (rank discovery; the module moved there)."""

import sys

from .launch import discovery as _module

sys.modules[__name__] = _module
