"""pycoll's command-line tools: pycoll-bench, the self-check (info) and the demo.

Nothing here is imported by the library itself; the tools use the library's public surface.
"""

from __future__ import annotations

import os
from typing import Optional


def unwritable(path: str) -> Optional[str]:
    """Why a tool could not write its output file ``path`` -- its folder missing or not writable, or ``path`` a
    folder --, else None: checked before a run, not found once it is over."""
    folder = os.path.dirname(os.path.abspath(path))
    if not (os.path.isdir(folder) and os.access(folder, os.W_OK)):
        return f"{folder} is not a folder this process can write to"
    if os.path.isdir(path):
        return "a folder, not a file"
    return None
