"""``python -m pycoll.tools.bench``: pycoll-bench."""

import sys

from .cli import main

sys.exit(main())
