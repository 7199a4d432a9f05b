"""One benchmark case on one rank: its buffers, input patterns, expected results and the check."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Iterable, List, Optional, Tuple

import numpy as np

from .arrays import _ArrayLib
from .spec import CollSpec, DType, _element_count


def _mix(i: np.ndarray, rank: int) -> np.ndarray:
    """A hash of each element index (and ``rank``): no period, so a block in the wrong place or from the wrong rank
    shows, where a pattern repeating every few elements would give the same values there."""
    x = (i.astype(np.uint64) + np.uint64(rank << 40)) * np.uint64(0x9E3779B97F4A7C15)
    x ^= x >> np.uint64(31)
    x *= np.uint64(0xBF58476D1CE4E5B9)
    x ^= x >> np.uint64(29)
    return x


def _reduce_range(dt: DType, nranks: int) -> int:
    """The reduction pattern's values are 1..this: where it can, small enough that any sum of ``nranks`` of them,
    in any order, is an integer the datatype holds exactly."""
    return max(2, min(8, dt.exact // max(nranks, 1)))


def _exact_sums(dt: DType, nranks: int, op: Optional[int]) -> bool:
    """Whether reducing the patterns of ``nranks`` ranks with ``op`` rounds nowhere (so the check allows nothing):
    the products of 1s and 2s are powers of two; max and min pick an input; a sum stays exact where ``nranks``
    times the pattern's largest value fits ``exact``; an average of such a sum where ``nranks`` is a power of two
    (dividing, or multiplying each input by 1/n, is then exact)."""
    if not dt.is_float or op in (1, 2, 3):
        return True
    if op == 4 and nranks & (nranks - 1):
        return False
    return nranks * _reduce_range(dt, nranks) <= dt.exact


def _pattern(kind: str, dt: DType, rank: int, start: int, length: int, nranks: int) -> np.ndarray:
    """Rank ``rank``'s input values at elements ``[start, start+length)``: small exact integers >= 1, unlike at
    every other element and on every other rank, so misplaced data is wrong data."""
    i = np.arange(start, start + length, dtype=np.int64)
    if kind == "prod":  # 1s and 2s, products exact (powers of two): rank r has a 2 where (hash + r) mod 8 is 0 or 1,
        # so two neighbouring ranks share each 2 (a product is no maximum) and about n/4 ranks give an element 2s
        return 1 + ((_mix(i, 0) + np.uint64(rank)) % np.uint64(8) < np.uint64(2)).astype(np.int64)
    if kind == "reduce":
        return 1 + (_mix(i, rank) % np.uint64(_reduce_range(dt, nranks))).astype(np.int64)
    return 1 + (_mix(i, rank) % np.uint64(dt.exact)).astype(np.int64)  # data movement: ranks and positions apart


def _reduce_ref(parts: Iterable[np.ndarray], op: int, dt: DType, nranks: int) -> np.ndarray:
    """What reducing ``parts`` (one per rank, in rank order) must give, as float64 or int64."""
    acc: Optional[np.ndarray] = None
    for p in parts:
        p = p.astype(np.float64 if dt.is_float else np.int64)
        if acc is None:
            acc = p.copy()
        elif op in (0, 4):
            acc += p
        elif op == 1:
            acc *= p
        elif op == 2:
            np.maximum(acc, p, out=acc)
        elif op == 3:
            np.minimum(acc, p, out=acc)
        else:
            raise ValueError(f"unknown reduction op {op}")
    assert acc is not None
    if op == 4:
        acc = acc / nranks if dt.is_float else acc // nranks
    if not dt.is_float:  # wrap around exactly as the datatype does
        acc = acc.astype(np.dtype(dt.array_name)).astype(np.int64)
    return acc


def _count_wrong(got: np.ndarray, want: np.ndarray, dt: DType, nranks: int, reduced: bool) -> int:
    if got.shape != want.shape:
        return int(max(got.size, want.size))
    if not dt.is_float:
        return int(np.count_nonzero(got != want))
    # ``reduced``: the result may round (an average; a sum beyond what the datatype holds exactly, _exact_sums). The
    # inputs are positive: each of the n - 1 additions (and an average's division) rounds by at most half an ulp of
    # a partial result no larger than the result (4 n eps allowed fp8 results of any value: zeros passed)
    tol = 0.5 * nranks * dt.eps * np.abs(want) if reduced else 0.0
    return int(np.count_nonzero(~(np.abs(got - want) <= tol)))  # NaN counts as wrong


# --------------------------------------------------------------------------------------------------
# one benchmark case on one rank


@dataclass
class Case:
    """One collective at one size, datatype, op, root and mode, set up on one rank.

    ``send``/``recv`` are this rank's views (the same memory in place, laid out as nccl-tests
    does: the input sits at this rank's block of the output or the other way round).
    """

    spec: CollSpec
    dt: DType
    op: Optional[int]
    root: int
    nranks: int
    rank: int
    count: int  # elements of the size column (for the blocks collectives, n times nccl-tests' count column)
    block: int  # elements per rank block (blocks collectives), else == count
    in_place: bool
    kit: _ArrayLib
    buffers: List[Any]  # what owns the memory
    send: Any
    recv: Any

    @property
    def nbytes(self) -> int:
        return self.count * self.dt.itemsize

    @property
    def kind(self) -> str:
        if not self.spec.reduces:
            return "data"
        return "prod" if self.op == 1 else "reduce"

    def inputs_of(self, rank: int, start: int, length: int) -> np.ndarray:
        return _pattern(self.kind, self.dt, rank, start, length, self.nranks)

    def fill(self) -> None:
        """Write the check pattern into this rank's input and zeros into its output."""
        for buf in self.buffers:
            self.kit.assign(buf, np.zeros(_length(buf), np.int64))
        self.kit.assign(self.send, self.inputs_of(self.rank, 0, _length(self.send)))
        self.kit.sync()

    def expected(self) -> Optional[np.ndarray]:
        """What this rank's ``recv`` must hold after the operation; None when nothing is defined."""
        n, r, c, name = self.nranks, self.rank, self.block, self.spec.name
        red = lambda start, length: _reduce_ref(  # noqa: E731
            (self.inputs_of(s, start, length) for s in range(n)), self.op or 0, self.dt, n
        )
        if name == "all_reduce":
            return red(0, self.count)
        if name == "reduce":
            return red(0, self.count) if r == self.root else None
        if name == "reduce_scatter":
            return red(r * c, c)
        if name == "broadcast":
            return self._wide(self.inputs_of(self.root, 0, self.count))
        if name in ("all_gather", "gather"):
            if name == "gather" and r != self.root:
                return None
            return self._wide(np.concatenate([self.inputs_of(s, 0, c) for s in range(n)]))
        if name == "all_to_all":
            return self._wide(np.concatenate([self.inputs_of(s, r * c, c) for s in range(n)]))
        if name == "scatter":
            return self._wide(self.inputs_of(self.root, r * c, c))
        if name == "send_recv":
            return self._wide(self.inputs_of((r - 1) % n, 0, self.count))
        raise AssertionError(name)

    def _wide(self, values: np.ndarray) -> np.ndarray:
        return values.astype(np.float64) if self.dt.is_float else values

    def check(self, corrupt: bool = False) -> int:
        """Count the wrong elements of this rank's output (after the operation has completed)."""
        want = self.expected()
        if want is None:
            return 0
        got = self.kit.fetch(self.recv, self.dt)
        if corrupt and got.size:
            got[got.size // 2] += 1  # the fault injected by --debug-corrupt-rank
        rounds = self.spec.reduces and not _exact_sums(self.dt, self.nranks, self.op)
        return _count_wrong(got, want, self.dt, self.nranks, rounds)


def _length(arr: Any) -> int:
    shape = arr.shape
    return int(shape[0]) if len(shape) else 1


def _layout(spec: CollSpec, nranks: int, rank: int, count: int) -> Tuple[int, int, int, int]:
    """(send elements, recv elements, send offset, recv offset) -- the offsets apply in place."""
    c = count // nranks if spec.blocks else count
    return {
        "all_gather": (c, count, rank * c, 0),
        "gather": (c, count, rank * c, 0),
        "reduce_scatter": (count, c, 0, rank * c),
        "scatter": (count, c, 0, rank * c),
    }.get(spec.name, (count, count, 0, 0))


def build_case(spec: CollSpec, dt: DType, op: Optional[int], root: int, nranks: int, rank: int, nbytes: int,
               in_place: bool, kit: _ArrayLib) -> Case:
    """Allocate this rank's buffers for one case (nothing is filled or run yet)."""
    if in_place and not spec.in_place:
        raise ValueError(f"{spec.name} has no in-place variant")
    count = _element_count(spec, nbytes, dt, nranks)
    scount, rcount, soff, roff = _layout(spec, nranks, rank, count)
    if in_place:
        buf = kit.empty(max(scount + soff, rcount + roff), dt)
        buffers = [buf]
        send, recv = buf[soff:soff + scount], buf[roff:roff + rcount]
    else:
        send, recv = kit.empty(scount, dt), kit.empty(rcount, dt)
        buffers = [send, recv]
    block = count // nranks if spec.blocks else count
    kit.sync()  # GPU arrays are zero-filled on the framework's stream; the ops may run on another
    return Case(spec, dt, op, root, nranks, rank, count, block, in_place, kit, buffers, send, recv)
