"""Alias of :mod:`pycoll.tools.info`, kept so that ``python -m pycoll.info`` and ``from pycoll import info`` work."""

import sys

if __name__ == "__main__":
    from pycoll.tools.info import main

    sys.exit(main())

from .tools.info import SPECS, __all__, _describe, _header, main, probe, probe_all, show_versions  # noqa: F401
