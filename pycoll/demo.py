"""Alias of :mod:`pycoll.tools.demo`, kept so that ``python -m pycoll.demo`` (README's first command) works."""

import sys

if __name__ == "__main__":
    from pycoll.tools.demo import main

    sys.exit(main())

from .tools.demo import __all__, main  # noqa: F401
