"""The store keys of ``pycoll-run``, and the helpers other layers use to read and write them.

The launcher writes its keys at the root of the job's store, under :data:`RUN_KEY_PREFIX`:

* ``pycoll-run/exit/<rank>``: exit code (decimal text) of the rank slot's latest process, when it ends.
* ``pycoll-run/failures``: counter of failed processes; ``pycoll-run/failure/<n>`` (n from 1):
  ``"<rank> <exit code>"`` of the n-th failure. Waiting on ``failure/<n+1>`` learns of the next one.
* ``pycoll-run/replacement/<rank>``: k, set when the k-th replacement of that slot is started.
* ``pycoll-run/lost/<rank>``: written by :func:`mark_lost` (removed by :func:`unmark_lost` when the slot is a
  member again), read by the launchers at the end, and while ranks run: a stopped process of a lost slot
  is hung, the launcher kills it.
* ``pycoll-run/abort``: ``"<node> <rank> <exit code>"``: a launcher stopping the job; the other
  launchers stop their ranks when it appears.
* ``pycoll-run/node/<i>/heartbeat`` and ``pycoll-run/node/<i>/done``: multi-node bookkeeping.

This module imports only the store, never the launcher's command line, so that the runtime (the
elastic layer) can import it at module level.
"""

from __future__ import annotations

from typing import List, Tuple

from ..store import PrefixStore, Store

__all__ = ["RUN_KEY_PREFIX", "mark_lost", "unmark_lost", "failures"]

#: Prefix of every key ``pycoll-run`` keeps in the job's store.
RUN_KEY_PREFIX = "pycoll-run/"
KEY_EXIT = RUN_KEY_PREFIX + "exit/{rank}"
KEY_FAILURES = RUN_KEY_PREFIX + "failures"
KEY_FAILURE = RUN_KEY_PREFIX + "failure/{n}"
KEY_REPLACEMENT = RUN_KEY_PREFIX + "replacement/{rank}"
KEY_LOST = RUN_KEY_PREFIX + "lost/{rank}"
KEY_ABORT = RUN_KEY_PREFIX + "abort"
KEY_HEARTBEAT = RUN_KEY_PREFIX + "node/{node}/heartbeat"
KEY_DONE = RUN_KEY_PREFIX + "node/{node}/done"


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


def unmark_lost(store: Store, rank: int) -> None:
    """Undo :func:`mark_lost`: rank slot ``rank`` takes part again (its replacement process was admitted).

    Until then the launcher takes a stopped process of the slot for a hung one of a lost slot and kills it.
    """
    store = _job_store(store)
    store.delete(KEY_LOST.format(rank=int(rank)))


def failures(store: Store) -> List[Tuple[int, int]]:
    """The ``(rank, exit code)`` of every failed process the launchers have seen so far, in order."""
    store = _job_store(store)
    n = store.add(KEY_FAILURES, 0)
    out = []
    for value in store.multi_get([KEY_FAILURE.format(n=i) for i in range(1, n + 1)], timeout=10.0):
        rank, code = value.decode().split()
        out.append((int(rank), int(code)))
    return out
