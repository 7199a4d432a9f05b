"""This host's processes as Linux's /proc describes them: the one reader of ``/proc/<pid>/stat``, of its
threads' files and of the boot id that the watchdog, the elastic layer and the launcher use to watch their
peers."""

from __future__ import annotations

import os
from typing import Dict, List, Optional

__all__ = ["boot_id", "stat_fields", "exiting", "task_files"]

_PF_EXITING = 0x4  # the kernel's task flag: the task is in do_exit
_SIGKILL_PENDING = 1 << (9 - 1)  # SIGKILL in the pending-signals bitmap


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


def task_files(pid: int | str, name: str) -> Dict[int, bytes]:
    """The file ``name`` of each thread of process ``pid`` (``/proc/<pid>/task/<tid>/<name>``; ``"self"``
    names this process) by thread id; empty where the process's threads cannot be listed, without a
    thread whose file cannot be read (it ended meanwhile)."""
    out: Dict[int, bytes] = {}
    try:
        tids = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return out
    for tid in tids:
        try:
            with open(f"/proc/{pid}/task/{tid}/{name}", "rb") as f:
                out[int(tid)] = f.read()
        except OSError:
            continue
    return out


def exiting(fields: List[str]) -> bool:
    """True when the process whose :func:`stat_fields` these are is dying and cannot take it back: a
    SIGKILL is pending for its main thread (the kernel queues it there as the signal is sent, also for
    any other fatal signal it turns into one), or that thread has begun to exit (``PF_EXITING``). Both
    come milliseconds before the process turns into a zombie: the kernel tears its memory down in
    between, and it has to be scheduled first."""
    try:
        return bool(int(fields[6]) & _PF_EXITING or int(fields[28]) & _SIGKILL_PENDING)
    except (IndexError, ValueError):
        return False
