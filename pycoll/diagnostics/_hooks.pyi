"""Stubs of the compiled per-operation observer hooks (pycoll/diagnostics/_hooks.pyx)."""

import itertools
import threading
from typing import Any, Dict, List

__all__ = ["RecorderCore", "WatchdogCore", "recorder_work_enqueued", "recorder_work_completed",
           "watchdog_work_enqueued", "watchdog_watching"]

class RecorderCore:
    _ring: List[Any]
    _infos: Dict[int, Any]
    _pos: itertools.count[int]
    stacks: bool
    stack_depth: int

class WatchdogCore:
    _next_due: float
    _wake_at: float
    _poll_wake: threading.Event
    _active: bool

def recorder_work_enqueued(self: Any, work: Any) -> None: ...
def recorder_work_completed(self: Any, work: Any) -> None: ...
def watchdog_work_enqueued(self: Any, work: Any) -> None: ...
def watchdog_watching(self: Any) -> bool: ...
