"""Alias of :mod:`pycoll.launch.discovery` (rank discovery; the module moved there)."""

import sys
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # what type checkers see: the module's public names (at run time this module is that module)
    from .launch.discovery import *  # noqa: F403

from .launch import discovery as _module

sys.modules[__name__] = _module
