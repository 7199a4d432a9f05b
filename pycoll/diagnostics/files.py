"""Where flight-recorder dumps go and how they are written (atomically: a temporary file, then a rename).

Dumps hold host names, pids, paths and stacks: their folders are made ``0o700`` and the files ``0o600``,
and nothing is written through a symbolic link planted by someone else (:mod:`pycoll._safefiles`).
"""

from __future__ import annotations

import contextlib
import os
import threading
from typing import Any, Dict, Set

from .. import _settings, hooks
from ..store import _safefiles

__all__ = ["default_dump_dir", "generation_dir", "json_form", "remove_unfinished", "write_atomic"]


def _run_id() -> str:
    for var in ("PYCOLL_RUN_ID", "TORCHELASTIC_RUN_ID", "SLURM_JOB_ID"):
        value = os.environ.get(var, "").strip()
        if value:
            if var == "TORCHELASTIC_RUN_ID":  # a restarted attempt's dumps apart from those that explain the restart
                attempt = os.environ.get("TORCHELASTIC_RESTART_COUNT", "").strip()
                if attempt.isdigit() and int(attempt) > 0:
                    value += f".attempt{int(attempt)}"
            return "".join(c if c.isalnum() or c in "-_." else "_" for c in value)
    return "default"


def default_dump_dir() -> str:
    """``$PYCOLL_FR_DUMP_DIR``, else ``${XDG_CACHE_HOME:-~/.cache}/pycoll/fr/<run id>``; in a forked child of a process
    that held communicators (a rank's data-loader or pool worker), its subfolder ``fork-<pid>``: the child's
    communicators are its own, and its rank numbers would overwrite its parent's (and its parent's peers') dumps.

    The run id is ``$PYCOLL_RUN_ID`` (set by pycoll-run), ``$TORCHELASTIC_RUN_ID`` (with ``.attempt<n>`` after a
    torchrun restart, ``$TORCHELASTIC_RESTART_COUNT``: the dumps that explain a restart are not overwritten by the
    next attempt's) or ``$SLURM_JOB_ID``, else ``default`` (set ``PYCOLL_FR_DUMP_DIR`` per job to keep runs apart).
    """
    explicit = _settings.get("PYCOLL_FR_DUMP_DIR")
    if explicit:
        base = os.path.expanduser(explicit)  # as its check reads it: '~/dumps' went to a folder named '~'
    else:
        cache = os.environ.get("XDG_CACHE_HOME", "").strip() or os.path.join(os.path.expanduser("~"), ".cache")
        base = os.path.join(cache, "pycoll", "fr", _run_id())
    return os.path.join(base, f"fork-{os.getpid()}") if hooks.forked_from_a_rank() else base


def generation_dir(dump_dir: str, generation: int, *, json_form: bool = False) -> str:
    """The folder holding generation ``generation``'s dumps (pickle, or JSON with ``json_form``)."""
    if json_form:
        return os.path.join(dump_dir, "json", f"generation_{generation}")
    return os.path.join(dump_dir, f"generation_{generation}")


def _json_entries(entries: Any) -> Any:
    return [{**e, "time_discovered_started_ns": e.get("time_discovered_started_ns") or 0,
             "time_discovered_completed_ns": e.get("time_discovered_completed_ns") or 0} for e in entries]


def json_form(data: Dict[str, Any]) -> Dict[str, Any]:
    """The JSON variant of a dump dict: unset timestamps 0 (in ``pycoll.other_entries`` too), ``pg_status`` values
    as strings."""
    out = dict(data)
    out["entries"] = _json_entries(data.get("entries", []))
    pyc = data.get("pycoll")
    if isinstance(pyc, dict) and "other_entries" in pyc:
        out["pycoll"] = {**pyc, "other_entries": _json_entries(pyc["other_entries"])}
    out["pg_status"] = {k: {kk: str(vv) for kk, vv in v.items()} for k, v in data.get("pg_status", {}).items()}
    return out  # json writes tuples as arrays and int keys as strings


def write_atomic(path: str, data: bytes) -> None:
    """Write ``data`` to ``path`` (mode ``0o600``) through a new temporary file in the same folder and a rename.

    Missing folders are made ``0o700``; the folder written into must be a real folder of this user
    (not a symbolic link), and the path to it may pass only through links of this user or root:
    PermissionError otherwise.
    """
    folder = os.path.dirname(path) or "."
    _safefiles.private_dirs(folder)
    # the temporary name must not contain the dump prefix nor end in a digit: torch's analyzer
    # reads every file whose name contains the prefix
    tmp = os.path.join(folder, f".pycoll-fr-{os.getpid()}-{threading.get_ident():x}.tmp")
    _writing.add(tmp)
    try:
        _safefiles.write_private_atomic(path, data, tmp)
    finally:
        _writing.discard(tmp)


#: the temporary files of the dumps being written (write_atomic)
_writing: Set[str] = set()


def remove_unfinished() -> None:
    """Remove the temporary files of dumps still being written: the process ends before they are (its exit waited
    ``dump_timeout``), and its daemon thread's half-written file (tens of MB for a big ring) stayed in the folder."""
    for tmp in list(_writing):
        with contextlib.suppress(OSError):
            os.unlink(tmp)
