"""Work: the handle of one enqueued collective or point-to-point operation.

The class is compiled with the rest of the per-call path (``pycoll/_core.pyx``); this module is
where it is documented and imported from.
"""

from __future__ import annotations

from ._core import Work

__all__ = ["Work"]
