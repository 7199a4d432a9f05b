"""Alias of :mod:`pycoll.diagnostics.analyze` (the module moved there); ``python -m pycoll.analyze`` runs it."""

import sys
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # what type checkers see: the module's public names (at run time this module is that module)
    from .diagnostics.analyze import *  # noqa: F403

if __name__ == "__main__":
    from pycoll.diagnostics.analyze import main

    sys.exit(main())
else:
    from .diagnostics import analyze as _module

    sys.modules[__name__] = _module
