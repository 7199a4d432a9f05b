"""The driver of a random program of operations, shared by the tests that issue one (tests/host/test_stream_order.py,
tests/emulated/test_emulated_random.py): the same on every rank given the same seed."""

from __future__ import annotations

import random
from typing import Any, Callable, List, Tuple

import numpy as np


def value(rank: int, i: int, count: int, dtype: Any) -> np.ndarray:
    """Rank ``rank``'s input of ``count`` elements to operation ``i``: small integers, exact in every dtype and sum."""
    return ((np.arange(count) % 13) * (rank + 1) + i % 7).astype(dtype)


def drive(comm: Any, rng: random.Random, length: int, issue: Callable[[int, bool], Tuple[Any, Any]],
          check: Callable[[Any, Any], None]) -> None:
    """Issue ``length`` operations one by one or in groups of up to five, blocking or not, and wait for the
    outstanding ones in a random order now and then and all at the end. ``issue(i, async_op)`` issues operation
    ``i`` and returns its Work and what ``check(work, item)`` needs, which waits for the Work and checks the result."""
    pending: List[Tuple[Any, Any]] = []
    i = 0
    while i < length:
        mode = rng.choice(["blocking", "async", "group", "wait"])
        if mode == "wait":
            rng.shuffle(pending)
            k = rng.randrange(len(pending) + 1)
            for w, item in pending[:k]:
                check(w, item)
            del pending[:k]
            continue
        async_op = mode == "async" or (mode == "group" and rng.random() < 0.5)
        issued = []
        if mode == "group":
            with comm.group():
                for _ in range(rng.randint(1, 5)):
                    issued.append(issue(i, async_op))
                    i += 1
        else:
            issued.append(issue(i, async_op))
            i += 1
        for w, item in issued:
            if async_op:
                pending.append((w, item))
            else:
                check(w, item)
    for w, item in pending:
        check(w, item)
