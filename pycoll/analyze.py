"""Alias of :mod:`pycoll.diagnostics.analyze` (the module moved there); ``python -m pycoll.analyze`` runs it."""

import sys

if __name__ == "__main__":
    from pycoll.diagnostics.analyze import main

    sys.exit(main())
else:
    from .diagnostics import analyze as _module

    sys.modules[__name__] = _module
