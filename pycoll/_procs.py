"""This host's processes as Linux's /proc describes them: the one reader of ``/proc/<pid>/stat`` and
of the boot id that the watchdog, the elastic layer and the launcher use to watch their peers."""

from __future__ import annotations

from typing import List, Optional

__all__ = ["boot_id", "stat_fields"]


def boot_id() -> str:
    """This boot's id (``/proc/sys/kernel/random/boot_id``); "" where it cannot be read."""
    try:
        with open("/proc/sys/kernel/random/boot_id") as f:
            return f.read().strip()
    except OSError:
        return ""


def stat_fields(pid: int) -> Optional[List[str]]:
    """The fields of ``/proc/<pid>/stat`` after the command name, from the state on (``[0]``: the
    state letter, ``[1]``: the parent's pid, ``[19]``: the start time in clock ticks since boot);
    None when there is no such process in this pid namespace (or /proc cannot be read)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            text = f.read()
    except OSError:
        return None
    _, sep, rest = text.rpartition(")")  # the command name may hold spaces and parentheses
    return rest.split() if sep else None
