"""pycoll-bench's vocabulary: exit statuses, collectives, datatypes, reduction ops and sizes."""

from __future__ import annotations

import argparse
import re
from dataclasses import dataclass
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

from ... import _dtypes

EXIT_OK = 0
EXIT_WRONG = 1
EXIT_USAGE = 2
EXIT_FAILED = 3

MODES = ("out-of-place", "in-place")
_EVENT_MARK = "@@pycoll-bench@@ "


def _ring(n: int) -> float:
    return (n - 1) / n


@dataclass(frozen=True)
class CollSpec:
    """What pycoll-bench needs to know about one collective.

    ``bus_factor(n)`` is nccl-tests' busbw/algbw ratio; ``blocks``: the size is ``n`` blocks of
    ``size/n`` bytes (all_gather, reduce_scatter, all_to_all, gather, scatter).
    """

    name: str
    bus_factor: Callable[[int], float]
    reduces: bool = False
    rooted: bool = False
    blocks: bool = False
    in_place: bool = True


COLLECTIVES: Dict[str, CollSpec] = {
    s.name: s
    for s in (
        CollSpec("all_reduce", lambda n: 2 * (n - 1) / n, reduces=True),
        CollSpec("all_gather", _ring, blocks=True),
        CollSpec("broadcast", lambda n: 1.0, rooted=True),
        CollSpec("reduce_scatter", _ring, reduces=True, blocks=True),
        CollSpec("reduce", lambda n: 1.0, reduces=True, rooted=True),
        CollSpec("all_to_all", _ring, blocks=True),
        CollSpec("gather", _ring, rooted=True, blocks=True),
        CollSpec("scatter", _ring, rooted=True, blocks=True),
        CollSpec("send_recv", lambda n: 1.0, in_place=False),
    )
}

_COLL_ALIASES = {
    "allreduce": "all_reduce",
    "allgather": "all_gather",
    "bcast": "broadcast",
    "reducescatter": "reduce_scatter",
    "alltoall": "all_to_all",
    "sendrecv": "send_recv",
}




@dataclass(frozen=True)
class DType:
    """A datatype: its nccl-tests name, NCCL code, element size and how exactly it holds integers.

    ``exact``: every integer in ``[0, exact]`` is representable, so patterns stay exact;
    ``eps``: the machine epsilon (0 for integers).
    """

    name: str
    nccl: int
    itemsize: int
    is_float: bool
    exact: int
    eps: float
    array_name: str  # numpy / ml_dtypes / torch / cupy attribute name




# what the check allows per datatype: every integer in [0, exact] is representable; eps: machine epsilon
_PRECISION: Dict[int, Tuple[int, float]] = {
    0: (127, 0.0), 1: (255, 0.0), 2: (1 << 20, 0.0), 3: (1 << 20, 0.0), 4: (1 << 20, 0.0), 5: (1 << 20, 0.0),
    6: (2048, 2.0**-10), 7: (1 << 20, 2.0**-23), 8: (1 << 20, 2.0**-52), 9: (256, 2.0**-7),
    10: (16, 2.0**-3), 11: (8, 2.0**-2),
}

DTYPES: Dict[str, DType] = {
    d.name: DType(d.name, d.code, d.itemsize, d.is_float, *_PRECISION[d.code], d.array_name)
    for d in _dtypes.DATATYPES
}

_DTYPE_ALIASES: Dict[str, str] = {alias: d.name for d in _dtypes.DATATYPES for alias in d.aliases}

#: Reduction operator names (nccl-tests') -> ncclRedOp_t.
REDOPS: Dict[str, int] = _dtypes.REDUCE_OPS


def _pick(values: str, table: Dict[str, Any], aliases: Dict[str, str], what: str) -> List[str]:
    """Resolve a comma-separated list of names (or "all") against ``table``."""
    out: List[str] = []
    for raw in values.split(","):
        name = raw.strip().lower()
        if name == "all":
            out.extend(k for k in table if k not in out)
            continue
        name = aliases.get(name, name)
        if name not in table:
            raise argparse.ArgumentTypeError(
                f"unknown {what} {raw.strip()!r}; expected one of {', '.join(table)} or 'all'"
            )
        if name not in out:
            out.append(name)
    if not out:
        raise argparse.ArgumentTypeError(f"no {what} given")
    return out


def _collectives(value: str) -> List[str]:
    names = []
    for raw in value.split(","):
        name = raw.strip().lower()
        if name.endswith("_perf"):
            name = name[: -len("_perf")]
        names.append(name)
    return _pick(",".join(names), COLLECTIVES, _COLL_ALIASES, "collective")


# --------------------------------------------------------------------------------------------------
# sizes

_SIZE_RE = re.compile(r"^\s*(\d+)\s*([kmgt]?)(i?b)?\s*$", re.IGNORECASE)
_UNITS = {"": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40}


def parse_size(text: str) -> int:
    """``"8"``, ``"1K"``, ``"64M"``, ``"1G"``, ``"4KiB"``, ``"2MB"`` -> bytes (powers of 1024)."""
    m = _SIZE_RE.match(str(text))
    if not m:
        raise ValueError(f"not a size: {text!r} (expected e.g. 8, 1K, 64M, 1G)")
    return int(m.group(1)) * _UNITS[m.group(2).lower()]


def _size_arg(text: str) -> int:
    try:
        return parse_size(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def format_size(nbytes: int) -> str:
    """The shortest exact form: ``8``, ``1K``, ``64M``; a size that is no whole unit stays in bytes."""
    for unit, mult in (("G", 1 << 30), ("M", 1 << 20), ("K", 1 << 10)):
        if nbytes >= mult and nbytes % mult == 0:
            return f"{nbytes // mult}{unit}"
    return str(nbytes)


def size_steps(minbytes: int, maxbytes: int, factor: Optional[int] = None, step: Optional[int] = None) -> List[int]:
    """Sizes from ``minbytes`` to ``maxbytes`` (inclusive), multiplying by ``factor`` or adding ``step``."""
    if minbytes < 0 or maxbytes < minbytes:
        raise ValueError(f"need 0 <= minbytes <= maxbytes, got {minbytes} and {maxbytes}")
    if factor is not None and step is not None:
        raise ValueError("give a step factor or a step size, not both")
    sizes = [minbytes]
    if factor is not None:
        if factor < 2:
            raise ValueError(f"the step factor must be >= 2, got {factor}")
        if minbytes == 0 and maxbytes > 0:
            raise ValueError("a step factor needs minbytes > 0")
        while minbytes and sizes[-1] * factor <= maxbytes:
            sizes.append(sizes[-1] * factor)
    else:
        inc = step if step is not None else max(1, maxbytes - minbytes)
        if inc < 1:
            raise ValueError(f"the step size must be >= 1 byte, got {inc}")
        while sizes[-1] + inc <= maxbytes:
            sizes.append(sizes[-1] + inc)
    return sizes


def _size_plan(spec: CollSpec, dt: DType, nranks: int, sizes: Sequence[int]) -> List[int]:
    """The sizes to run: those that round to a distinct element count."""
    seen, out = set(), []
    for nbytes in sizes:
        count = _element_count(spec, nbytes, dt, nranks)
        if count not in seen:
            seen.add(count)
            out.append(nbytes)
    return out


def _element_count(spec: CollSpec, nbytes: int, dt: DType, nranks: int) -> int:
    """The elements of a size (whole elements, whole blocks per rank, never 0): the size column's; nccl-tests'
    count column is a rank's block of them for the blocks collectives."""
    count = max(1, nbytes // dt.itemsize)
    if spec.blocks:
        count = max(1, count // nranks) * nranks
    return count
