"""The store keys of ``pycoll-run``, and the helpers other layers use to read and write them.

The launcher writes its keys at the root of the job's store, under :data:`RUN_KEY_PREFIX`:

* ``pycoll-run/exit/<rank>``: exit code (decimal text) of the rank slot's latest process, when it ends.
* ``pycoll-run/failures``: counter of failed processes; ``pycoll-run/failure/<n>`` (n from 1):
  ``"<rank> <exit code>"`` of the n-th failure. Waiting on ``failure/<n+1>`` learns of the next one.
* ``pycoll-run/replacement/<rank>``: k, set when the k-th replacement of that slot is started.
* ``pycoll-run/proc/<rank>``: ``"<boot id> <pid> <k>"`` of the slot's latest process (k: its replacement number, 0
  for the first), set as it is started: before a process has said who it is, the others can tell from it that the
  slot's first process exited or is stopped (:func:`launched_processes`).
* ``pycoll-run/lost/<rank>``: written by :func:`mark_lost` (removed by :func:`unmark_lost` when the slot is a
  member again), read by the launchers at the end, and while ranks run: a stopped process of a lost slot
  is hung, the launcher kills it.
* ``pycoll-run/group-lost``: why a group of the job lost every member, written by :func:`mark_group_lost` (a
  replacement that found nobody left to admit it); the launchers then exit non-zero.
* ``pycoll-run/abort``: ``"<node> <rank> <exit code>[ <why>]"``: a launcher stopping the job (rank -1: not for a
  rank's failure, e.g. ``--timeout`` or a node that never joined; ``<why>`` says why); the other launchers stop their
  ranks when it appears.
* ``pycoll-run/node/<i>/joined``: ``"<run id> <host> <pid> <boot id> <start time>"`` of the launcher that joined as
  node i > 0 (the first one: a second launcher with the same node rank is refused; the boot id and the process's
  start time, in clock ticks since boot, tell a launcher on the same host whether that one still runs).
* ``pycoll-run/node/<i>/heartbeat`` and ``pycoll-run/node/<i>/done``: multi-node bookkeeping.
* ``pycoll-run/shape``: ``"<nnodes> <nproc> <run id>"`` of node 0's launcher: a node that joins with other numbers
  is refused; the others take its run id.

This module imports only the store, never the launcher's command line, so that the runtime (the
elastic layer) can import it at module level.
"""

from __future__ import annotations

from typing import Dict, List, Sequence, Tuple

from ..store import PrefixStore, Store

__all__ = ["RUN_KEY_PREFIX", "mark_lost", "unmark_lost", "mark_group_lost", "mark_not_needed", "launched_processes",
           "failures"]

#: Prefix of every key ``pycoll-run`` keeps in the job's store.
RUN_KEY_PREFIX = "pycoll-run/"
KEY_EXIT = RUN_KEY_PREFIX + "exit/{rank}"
KEY_FAILURES = RUN_KEY_PREFIX + "failures"
KEY_FAILURE = RUN_KEY_PREFIX + "failure/{n}"
KEY_REPLACEMENT = RUN_KEY_PREFIX + "replacement/{rank}"
KEY_LOST = RUN_KEY_PREFIX + "lost/{rank}"
KEY_PROC = RUN_KEY_PREFIX + "proc/{rank}"
KEY_GROUP_LOST = RUN_KEY_PREFIX + "group-lost"
KEY_NOT_NEEDED = RUN_KEY_PREFIX + "not-needed/{rank}"
KEY_ABORT = RUN_KEY_PREFIX + "abort"
KEY_JOINED = RUN_KEY_PREFIX + "node/{node}/joined"
KEY_HEARTBEAT = RUN_KEY_PREFIX + "node/{node}/heartbeat"
KEY_DONE = RUN_KEY_PREFIX + "node/{node}/done"
KEY_RESULT = RUN_KEY_PREFIX + "result"  # the job's exit status, node 0's verdict, that every launcher exits with
KEY_RESULT_READ = RUN_KEY_PREFIX + "node/{node}/result-read"
KEY_SHAPE = RUN_KEY_PREFIX + "shape"


def _job_store(store: Store) -> Store:
    """The job's root store of ``store`` (a prefixed view's root): the launchers' keys are not under a prefix."""
    return store.root if isinstance(store, PrefixStore) else store


def mark_lost(store: Store, rank: int, reason: str = "") -> None:
    """Declare that the job goes on without rank slot ``rank`` (for ``pycoll-run --keep-going``).

    ``store`` is the job's root store (not a prefixed view). Survivors call this after they have
    reshaped without the rank; the launcher then does not count that rank's failure against the job.
    """
    store = _job_store(store)
    store.set(KEY_LOST.format(rank=int(rank)), reason or "lost")


def mark_not_needed(store: Store, rank: int, reason: str = "") -> None:
    """Declare that rank slot ``rank`` needs no replacement any more (its group finished before a replacement of it
    was admitted): ``pycoll-run --replace-failed`` then starts none when its process exits (it started one after
    another, each finding the group finished)."""
    _job_store(store).set(KEY_NOT_NEEDED.format(rank=int(rank)), reason or "not needed")


def unmark_lost(store: Store, rank: int) -> None:
    """Undo :func:`mark_lost`: rank slot ``rank`` takes part again (its replacement process was admitted).

    Until then the launcher takes a stopped process of the slot for a hung one of a lost slot and kills it.
    """
    store = _job_store(store)
    store.delete(KEY_LOST.format(rank=int(rank)))


def mark_group_lost(store: Store, reason: str) -> None:
    """Declare that the job failed as a whole although no process of it may have failed since: every member of
    one of its groups is gone (the elastic layer: a replacement that found nobody left to admit it). The launcher
    then exits non-zero even where every failed slot was replaced or marked lost (a replacement that was not
    needed, and exited 0, does not make the job a success)."""
    _job_store(store).compare_set(KEY_GROUP_LOST, b"", reason or "lost")  # the first reason stays


def launched_processes(store: Store, ranks: Sequence[int]) -> Dict[int, Tuple[str, int, int]]:
    """``{rank: (boot id, pid, k)}``: the latest process ``pycoll-run`` started for each of ``ranks`` (k: its
    replacement number, 0 for the first). Empty unless the launcher recorded every one of them (another launcher,
    or one still starting them)."""
    store = _job_store(store)
    keys = [KEY_PROC.format(rank=int(r)) for r in ranks]
    if not keys or not store.check(keys):
        return {}
    out: Dict[int, Tuple[str, int, int]] = {}
    for rank, raw in zip(ranks, store.multi_get(keys, timeout=1.0), strict=True):
        boot, pid, k = raw.decode().split(" ")  # the boot id may be empty
        out[int(rank)] = (boot, int(pid), int(k))
    return out


def failures(store: Store) -> List[Tuple[int, int]]:
    """The ``(rank, exit code)`` of every failed process the launchers have seen so far, in order."""
    store = _job_store(store)
    n = store.add(KEY_FAILURES, 0)
    out = []
    for value in store.multi_get([KEY_FAILURE.format(n=i) for i in range(1, n + 1)], timeout=10.0):
        rank, code = value.decode().split()
        out.append((int(rank), int(code)))
    return out
