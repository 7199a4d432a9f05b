"""Python stacks of recorded operations: captured as code objects, formatted only when dumping."""

from __future__ import annotations

import functools
import os
import re
from typing import Any, Dict, FrozenSet, List, Optional, Sequence, Tuple

__all__ = ["format_stack", "is_runtime_frame"]

_PKG_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep
_TOOLS_DIR = os.path.join(_PKG_DIR, "tools") + os.sep


def _line_of(code: Any, lasti: int, cache: Dict[Tuple[Any, int], int]) -> int:
    key = (code, lasti)
    line = cache.get(key)
    if line is None:
        line = code.co_firstlineno
        try:
            for start, end, ln in code.co_lines():
                if start <= lasti < end:
                    if ln is not None:
                        line = ln
                    break
        except Exception:
            pass
        cache[key] = line
    return line


# a module of the package or of one of its subpackages, as another host's dump names it (its install path elsewhere)
_RUNTIME_FRAME = re.compile(r"[/\\]pycoll[/\\]((?:[A-Za-z_]+[/\\])?[A-Za-z_]+\.py)$")


@functools.lru_cache(maxsize=1)
def _modules() -> FrozenSet[str]:
    """The package's modules outside its tools, as paths under it (``'comm.py'``, ``'store/tcp.py'``)."""
    found: set = set()
    for root, _, files in os.walk(_PKG_DIR):
        rel = os.path.relpath(root, _PKG_DIR)
        parts = [] if rel == os.curdir else rel.split(os.sep)
        if parts[:1] != ["tools"]:
            found.update("/".join([*parts, f]) for f in files if f.endswith(".py"))
    return frozenset(found)


def is_runtime_frame(filename: str) -> bool:
    """True for a frame of pycoll's runtime (not the caller's code): the 'issued at' site skips them.

    The rule is the path: a module of the ``pycoll`` package, except its tools (the bench tool
    and the demo issue operations as users do). A path elsewhere -- another host's install -- is one where it ends
    in ``pycoll/`` and the name of one of the package's modules: a user's ``pycoll/examples/train.py`` (a clone of
    this repository) is the user's.
    """
    if filename.startswith(_PKG_DIR):
        return not filename.startswith(_TOOLS_DIR)
    m = _RUNTIME_FRAME.search(filename)
    return m is not None and m.group(1).replace("\\", "/") in _modules()


def format_stack(stack: Optional[Sequence[Any]], cache: Dict[Tuple[Any, int], int]) -> List[Dict[str, Any]]:
    """Frames innermost first, as torch writes them; pycoll's own private frames are left out."""
    if not stack:
        return []
    frames = []
    for i in range(0, len(stack), 2):
        code = stack[i]
        filename = code.co_filename
        if code.co_name.startswith("_") and filename.startswith(_PKG_DIR):
            continue  # the observer dispatch and _launch; the public call (all_reduce, ...) stays
        frames.append({"name": code.co_name, "filename": filename, "line": _line_of(code, stack[i + 1], cache)})
    return frames
