"""``pycoll-bench``: collective benchmarks in nccl-tests' format, with every result checked.

Usage::

    pycoll-bench all_reduce -n 2 -b 8 -e 64M -f 2          # 2 ranks of the host backend, 8 B..64 MiB
    pycoll-bench all -n 4 -b 1K -e 16M -f 4 -d float,half   # every collective, two datatypes
    pycoll-run -n 2 -m pycoll.bench reduce -r 1             # ranks started by a launcher
    python -m pycoll.bench all_gather -n 2 --json out.json --csv out.csv --plot out.png

Collectives are named as the :class:`~pycoll.Communicator` methods: ``all_reduce``,
``all_gather``, ``broadcast``, ``reduce_scatter``, ``reduce``, ``all_to_all``, ``gather``,
``scatter`` and ``send_recv`` (each rank sends to the next and receives from the previous one in
one group, as nccl-tests' ``sendrecv``); ``all`` runs every one. nccl-tests' names (``allreduce``,
``all_reduce_perf``...) are accepted too.

What it measures (the same conventions as nccl-tests):

* ``size``: bytes of the largest buffer one rank passes -- the buffer of all_reduce, broadcast,
  reduce, all_to_all and send_recv, the output of all_gather and gather, the input of
  reduce_scatter and scatter. Sizes run from ``-b`` to ``-e`` multiplying by ``-f`` (or adding
  ``-i`` bytes); ``8``, ``1K``, ``64M``, ``1G`` (powers of 1024) are accepted. A size is rounded
  down to whole elements and, where the buffer holds one block per rank, to a multiple of the
  number of ranks (at least one element per rank).
* ``time``: per iteration, the time of the slowest rank; the table shows the median over the
  iterations (JSON and CSV also give the mean, minimum and 90th percentile). On the host backend
  with no stream each call runs in the calling thread and is timed with the wall clock; on a GPU
  (or with ``--stream``) the ops of all iterations are queued back to back on one stream and
  every iteration is timed with events recorded around it.
* ``algbw`` = size / time; ``busbw`` = algbw x nccl-tests' bus factor: 2(n-1)/n for all_reduce,
  (n-1)/n for all_gather, reduce_scatter, all_to_all, gather and scatter, 1 for broadcast,
  reduce and send_recv. GB/s are 10^9 bytes per second.
* ``#wrong``: after the timed iterations the inputs are refilled with a known pattern, the
  operation runs once more and every element of every rank's output is compared with the
  expected values (exactly, or within a few units of the datatype's precision for reductions in
  floating point). The count is summed over ranks; ``-c 0`` skips the check (``N/A``).

Ranks: started by ``pycoll-run`` (or torchrun, SLURM, mpirun: see :mod:`pycoll.env`) each process
is one rank and ``-n`` must match the job's size. Started directly with ``-n N > 1``, pycoll-bench
starts its own N ranks through ``pycoll-run`` and prints what rank 0 reports.

Exit status: 0 when every checked result was right, 1 when some value was wrong, 2 for bad
arguments, 3 when the run itself failed (a rank died, an operation failed or timed out).
"""

from __future__ import annotations

import argparse
import csv
import json
import logging
import math
import os
import platform
import re
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any, Callable, Dict, Iterable, List, Optional, Sequence, TextIO, Tuple

import numpy as np

__all__ = [  # the stable surface; Case, build_case, measure... are building blocks that may change
    "COLLECTIVES",
    "DTYPES",
    "REDOPS",
    "CollSpec",
    "DType",
    "parse_size",
    "format_size",
    "size_steps",
    "main",
    "EXIT_OK",
    "EXIT_WRONG",
    "EXIT_USAGE",
    "EXIT_FAILED",
]

_log = logging.getLogger("pycoll.bench")

EXIT_OK = 0
EXIT_WRONG = 1
EXIT_USAGE = 2
EXIT_FAILED = 3

MODES = ("out-of-place", "in-place")
_EVENT_MARK = "@@pycoll-bench@@ "


# --------------------------------------------------------------------------------------------------
# collectives, datatypes, reduction operators


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


DTYPES: Dict[str, DType] = {
    d.name: d
    for d in (
        DType("int8", 0, 1, False, 127, 0.0, "int8"),
        DType("uint8", 1, 1, False, 255, 0.0, "uint8"),
        DType("int32", 2, 4, False, 1 << 20, 0.0, "int32"),
        DType("uint32", 3, 4, False, 1 << 20, 0.0, "uint32"),
        DType("int64", 4, 8, False, 1 << 20, 0.0, "int64"),
        DType("uint64", 5, 8, False, 1 << 20, 0.0, "uint64"),
        DType("half", 6, 2, True, 2048, 2.0**-10, "float16"),
        DType("float", 7, 4, True, 1 << 20, 2.0**-23, "float32"),
        DType("double", 8, 8, True, 1 << 20, 2.0**-52, "float64"),
        DType("bfloat16", 9, 2, True, 256, 2.0**-7, "bfloat16"),
        DType("f8e4m3", 10, 1, True, 16, 2.0**-3, "float8_e4m3fn"),
        DType("f8e5m2", 11, 1, True, 8, 2.0**-2, "float8_e5m2"),
    )
}

_DTYPE_ALIASES = {
    "char": "int8",
    "int": "int32",
    "float16": "half",
    "fp16": "half",
    "float32": "float",
    "fp32": "float",
    "float64": "double",
    "fp64": "double",
    "bf16": "bfloat16",
    "float8_e4m3fn": "f8e4m3",
    "fp8_e4m3": "f8e4m3",
    "float8_e5m2": "f8e5m2",
    "fp8_e5m2": "f8e5m2",
}

#: Reduction operator names (nccl-tests') -> ncclRedOp_t.
REDOPS: Dict[str, int] = {"sum": 0, "prod": 1, "max": 2, "min": 3, "avg": 4}


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
    """nccl-tests' ``count`` for a size: whole elements, whole blocks per rank, never 0."""
    count = max(1, nbytes // dt.itemsize)
    if spec.blocks:
        count = max(1, count // nranks) * nranks
    return count


# --------------------------------------------------------------------------------------------------
# arrays: numpy (host), torch (host or GPU), cupy (GPU)


class _Kit:
    """The few array operations the benchmark needs, for one array library and device."""

    name = "abstract"

    def empty(self, count: int, dt: DType) -> Any:  # zero-filled, pages touched
        raise NotImplementedError

    def assign(self, view: Any, values: np.ndarray) -> None:  # int64 or float64 values
        raise NotImplementedError

    def fetch(self, view: Any, dt: DType) -> np.ndarray:  # float64 (floats) or int64 copy
        raise NotImplementedError

    def sync(self) -> None:
        pass


class _NumpyKit(_Kit):
    name = "numpy"

    @staticmethod
    def dtype(dt: DType) -> Any:
        if dt.name in ("bfloat16", "f8e4m3", "f8e5m2"):
            try:
                import ml_dtypes
            except ImportError:
                raise RuntimeError(f"datatype {dt.name} with numpy arrays needs the ml_dtypes package") from None
            return np.dtype(getattr(ml_dtypes, dt.array_name))
        return np.dtype(dt.array_name)

    def empty(self, count: int, dt: DType) -> Any:
        arr = np.empty(count, dtype=self.dtype(dt))
        arr[...] = 0  # fault the pages in now, not in the first timed iteration
        return arr

    def assign(self, view: Any, values: np.ndarray) -> None:
        if np.issubdtype(view.dtype, np.integer):
            view[...] = values.astype(view.dtype)  # wraps around, as the datatype does
        else:  # float, and the ml_dtypes types (converted through float64)
            view[...] = values.astype(np.float64).astype(view.dtype)

    def fetch(self, view: Any, dt: DType) -> np.ndarray:
        return view.astype(np.float64 if dt.is_float else np.int64)


class _TorchKit(_Kit):
    name = "torch"

    def __init__(self, device: str) -> None:
        import torch

        self.torch = torch
        self.device = torch.device(device)

    def dtype(self, dt: DType) -> Any:
        tdt = getattr(self.torch, dt.array_name, None)
        if tdt is None:
            raise RuntimeError(f"this torch ({self.torch.__version__}) has no dtype {dt.array_name}")
        return tdt

    def empty(self, count: int, dt: DType) -> Any:
        return self.torch.zeros(count, dtype=self.dtype(dt), device=self.device)

    def assign(self, view: Any, values: np.ndarray) -> None:
        src = self.torch.from_numpy(np.ascontiguousarray(values)).to(self.device)
        view.copy_(src.to(view.dtype))

    def fetch(self, view: Any, dt: DType) -> np.ndarray:
        wide = self.torch.float64 if dt.is_float else self.torch.int64
        return view.to(wide).cpu().numpy()

    def sync(self) -> None:
        if self.device.type == "cuda":
            self.torch.cuda.synchronize(self.device)


class _CupyKit(_Kit):
    name = "cupy"

    def __init__(self, device_id: int) -> None:
        import cupy

        self.cupy = cupy
        self.device_id = device_id

    def empty(self, count: int, dt: DType) -> Any:
        if dt.name in ("bfloat16", "f8e4m3", "f8e5m2"):
            raise RuntimeError(f"cupy has no {dt.name} arrays; use --array torch")
        with self.cupy.cuda.Device(self.device_id):
            return self.cupy.zeros(count, dtype=dt.array_name)

    def assign(self, view: Any, values: np.ndarray) -> None:
        with self.cupy.cuda.Device(self.device_id):
            view[...] = self.cupy.asarray(values).astype(view.dtype)

    def fetch(self, view: Any, dt: DType) -> np.ndarray:
        return self.cupy.asnumpy(view).astype(np.float64 if dt.is_float else np.int64)

    def sync(self) -> None:
        with self.cupy.cuda.Device(self.device_id):
            self.cupy.cuda.runtime.deviceSynchronize()


def _make_kit(array: str, backend: str, device_id: int) -> _Kit:
    if backend == "host":
        if array in ("auto", "numpy"):
            return _NumpyKit()
        if array == "torch":
            return _TorchKit("cpu")
        raise ValueError(f"--array {array} needs a GPU backend; the host backend takes numpy or torch arrays")
    if array == "numpy":
        raise ValueError(f"the {backend} backend needs GPU arrays: --array torch or cupy")
    if array in ("auto", "torch"):
        try:
            return _TorchKit(f"cuda:{device_id}")
        except ImportError:
            if array == "torch":
                raise
    return _CupyKit(device_id)


def _ptr(arr: Any) -> int:
    from .buffers import as_buffer

    return as_buffer(arr).ptr


# --------------------------------------------------------------------------------------------------
# patterns and reference results


def _pattern(kind: str, dt: DType, rank: int, start: int, length: int) -> np.ndarray:
    """Rank ``rank``'s input values at elements ``[start, start+length)``: small exact integers >= 1."""
    i = np.arange(start, start + length, dtype=np.int64)
    if kind == "prod":
        return 1 + ((i + rank) % 4 == 0).astype(np.int64)  # 1s and 2s: exact products
    if kind == "reduce":
        return 1 + (i + 3 * rank) % min(8, dt.exact)
    return 1 + (i * 7 + rank * 131) % dt.exact  # data movement: tells ranks and positions apart


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
    tol = 4.0 * nranks * dt.eps * np.abs(want) if reduced else 0.0
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
    count: int  # nccl-tests' count: elements of the size column
    block: int  # elements per rank block (blocks collectives), else == count
    in_place: bool
    kit: _Kit
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
        return _pattern(self.kind, self.dt, rank, start, length)

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
        return _count_wrong(got, want, self.dt, self.nranks, self.spec.reduces)


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
               in_place: bool, kit: _Kit) -> Case:
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


# --------------------------------------------------------------------------------------------------
# running a case: Communicator methods or the raw bindings


def _comm_call(comm: Any, case: Case, stream: Optional[int], async_op: bool) -> Callable[[], Any]:
    """A no-argument callable running the case once through the Communicator's method."""
    name, root, op, n, r = case.spec.name, case.root, case.op, case.nranks, case.rank
    send, recv, ip = case.send, case.recv, case.in_place
    kw: Dict[str, Any] = {"stream": stream, "async_op": async_op}
    is_root = r == root
    if name == "all_reduce":
        out = None if ip else recv
        return lambda: comm.all_reduce(send, out, op, **kw)
    if name == "broadcast":
        out = None if ip else recv
        return lambda: comm.broadcast(send, root, out, **kw)
    if name == "reduce":
        out = None if ip else recv
        return lambda: comm.reduce(send, root, out, op, **kw)
    if name == "all_gather":
        inp = None if ip else send
        return lambda: comm.all_gather(inp, recv, **kw)
    if name == "reduce_scatter":
        out = None if ip else recv
        return lambda: comm.reduce_scatter(send, out, op, **kw)
    if name == "all_to_all":
        out = None if ip else recv
        return lambda: comm.all_to_all(send, out, **kw)
    if name == "gather":
        inp = None if (ip and is_root) else send
        out = recv if is_root else None
        return lambda: comm.gather(inp, out, root, **kw)
    if name == "scatter":
        inp = send if is_root else None
        out = None if (ip and is_root) else recv
        return lambda: comm.scatter(inp, out, root, **kw)
    if name == "send_recv":
        nxt, prv = (r + 1) % n, (r - 1) % n

        def sendrecv() -> Any:
            with comm.group():
                a = comm.send(send, nxt, **kw)
                b = comm.recv(recv, prv, **kw)
            return [a, b]

        return sendrecv
    raise AssertionError(name)


def _raw_call(comm: Any, case: Case, stream: int, timeout: float) -> Callable[[], Any]:
    """A no-argument callable running the case once through the bindings (``Library`` methods)."""
    from . import _bindings as B

    lib, h = comm.library, comm.handle
    name, root, op, n, r = case.spec.name, case.root, case.op or 0, case.nranks, case.rank
    sp, rp, dtc, count, c = _ptr(case.send), _ptr(case.recv), case.dt.nccl, case.count, case.block
    in_progress = B.IN_PROGRESS

    def settle(status: int) -> None:
        # a nonblocking communicator may answer ncclInProgress; it must be polled before the next call
        if status == in_progress:
            deadline = time.monotonic() + timeout
            while lib.comm_get_async_error(h) == in_progress:
                if time.monotonic() > deadline:
                    raise TimeoutError(f"{name}: the communicator stayed in progress for {timeout:.3g} s")
                time.sleep(0)
            code = lib.comm_get_async_error(h)
            if code != 0:
                from .errors import error_class

                raise error_class(code)(code, name, lib.get_error_string(code), lib.get_last_error(h), lib.path)

    calls: Dict[str, Callable[[], int]] = {
        "all_reduce": lambda: lib.all_reduce(sp, rp, count, dtc, op, h, stream),
        "broadcast": lambda: lib.broadcast(sp, rp, count, dtc, root, h, stream),
        "reduce": lambda: lib.reduce(sp, rp, count, dtc, op, root, h, stream),
        "all_gather": lambda: lib.all_gather(sp, rp, c, dtc, h, stream),
        "reduce_scatter": lambda: lib.reduce_scatter(sp, rp, c, dtc, op, h, stream),
        "all_to_all": lambda: lib.all_to_all(sp, rp, c, dtc, h, stream),
        "gather": lambda: lib.gather(sp, rp, c, dtc, root, h, stream),
        "scatter": lambda: lib.scatter(sp, rp, c, dtc, root, h, stream),
    }
    if name == "send_recv":
        nxt, prv = (r + 1) % n, (r - 1) % n

        def sendrecv() -> None:
            lib.group_start()
            try:
                settle(lib.send(sp, count, dtc, nxt, h, stream))
                settle(lib.recv(rp, count, dtc, prv, h, stream))
            finally:
                status = lib.group_end()
            settle(status)

        return sendrecv
    fn = calls[name]

    def call() -> None:
        status = fn()
        if status:
            settle(status)

    return call


@dataclass
class Measurement:
    """The result of one case: per-iteration times (ns, slowest rank each) and the wrong count."""

    times_ns: np.ndarray
    wrong: Optional[int]

    @property
    def median_us(self) -> float:
        return float(np.median(self.times_ns)) / 1e3

    def summary(self, nbytes: int, bus_factor: float) -> Dict[str, Any]:
        t = self.times_ns / 1e3
        med = float(np.median(t))
        algbw = nbytes / (med * 1e-6) / 1e9 if med > 0 else float("inf")
        return {
            "time_us": med,
            "time_us_mean": float(np.mean(t)),
            "time_us_min": float(np.min(t)),
            "time_us_p90": float(np.percentile(t, 90)),
            "iters": int(t.size),
            "algbw_GBps": algbw,
            "busbw_GBps": algbw * bus_factor,
            "wrong": self.wrong,
        }


class _Runner:
    """Runs cases on one rank's communicator: timing, checking, aggregation over ranks."""

    def __init__(self, comm: Any, kit: _Kit, *, api: str, use_stream: bool, op_timeout: float) -> None:
        self.comm = comm
        self.kit = kit
        self.api = api
        self.op_timeout = op_timeout
        self.device = comm.device
        self.stream: Optional[int] = self.device.create_stream() if use_stream else None
        self._events: List[Tuple[int, int]] = []

    def close(self) -> None:
        for a, b in self._events:
            self.device.destroy_event(a)
            self.device.destroy_event(b)
        self._events = []
        if self.stream is not None:
            stream, self.stream = self.stream, None
            self.device.destroy_stream(stream)

    def _call(self, case: Case) -> Callable[[], Any]:
        if self.api == "raw":
            return _raw_call(self.comm, case, self.stream or 0, self.op_timeout)
        return _comm_call(self.comm, case, self.stream, async_op=self.stream is not None)

    def _complete(self, pending: List[Any]) -> None:
        if self.stream is not None:
            self.device.synchronize_stream(self.stream)
        for item in pending:
            for w in item if isinstance(item, list) else [item]:
                if w is not None and hasattr(w, "wait"):
                    w.wait()

    def _event_pairs(self, n: int) -> List[Tuple[int, int]]:
        while len(self._events) < n:
            self._events.append((self.device.create_event(timing=True), self.device.create_event(timing=True)))
        return self._events[:n]

    def time_case(self, case: Case, iters: int, warmup: int) -> np.ndarray:
        """This rank's time of each iteration in ns (after ``warmup`` untimed ones)."""
        call = self._call(case)
        stream = self.stream
        pending = [call() for _ in range(warmup)]
        self._complete(pending)
        self.comm.barrier(timeout=self.op_timeout)
        times = np.empty(iters, dtype=np.float64)
        if stream is None:
            clock = time.perf_counter_ns
            for i in range(iters):
                t0 = clock()
                call()
                times[i] = clock() - t0
            return times
        dev = self.device
        pairs = self._event_pairs(iters)
        pending = []
        for start, end in pairs:
            dev.record_event(start, stream)
            pending.append(call())
            dev.record_event(end, stream)
        self._complete(pending)
        for i, (start, end) in enumerate(pairs):
            times[i] = dev.elapsed_ms(start, end) * 1e6
        return times

    def check_case(self, case: Case, corrupt: bool) -> int:
        case.fill()
        call = self._call(case)
        self._complete([call()])
        return case.check(corrupt)

    def allgather_f64(self, values: np.ndarray) -> np.ndarray:
        """Every rank's ``values`` (same length everywhere), one row per rank."""
        n = self.comm.size
        dbl = DTYPES["double"]
        src, dst = self.kit.empty(values.size, dbl), self.kit.empty(values.size * n, dbl)
        self.kit.assign(src, values)
        self.kit.sync()
        self.comm.all_gather(src, dst, timeout=self.op_timeout)
        self.kit.sync()
        return self.kit.fetch(dst, dbl).reshape(n, values.size)


def measure(runner: _Runner, case: Case, *, iters: int, warmup: int, check: bool,
            corrupt: bool = False) -> Measurement:
    """Time ``case`` on every rank, check it, and combine: every rank gets the same Measurement.

    Collective: every rank of the communicator must call it with the same case parameters.
    """
    mine = runner.time_case(case, iters, warmup)
    wrong = runner.check_case(case, corrupt) if check else 0
    table = runner.allgather_f64(np.append(mine, float(wrong)))
    return Measurement(times_ns=table[:, :iters].max(axis=0), wrong=int(table[:, iters].sum()) if check else None)


# --------------------------------------------------------------------------------------------------
# reporting: the nccl-tests table, JSON, CSV, plot, progress


def _fmt_time(us: float) -> str:
    if us < 1e4:
        return f"{us:8.2f}"
    if us < 1e6:
        return f"{us:8.1f}"
    return f"{us:8.0f}"


def _fmt_bw(gbps: float) -> str:
    return f"{gbps:7.2f}" if gbps < 1e4 else f"{gbps:7.0f}"


class _Reporter:
    """Receives what rank 0 learns, in order: start(meta), section(...), row(...), progress(...), finish(...)."""

    def start(self, meta: Dict[str, Any]) -> None: ...
    def section(self, collective: str, modes: Sequence[str]) -> None: ...
    def row(self, row: Dict[str, Any]) -> None: ...
    def progress(self, done: int, total: int, label: str) -> None: ...
    def finish(self, summary: Dict[str, Any]) -> None: ...


class _EventReporter(_Reporter):
    """Rank 0 of a job pycoll-bench started itself: events as JSON lines for the parent."""

    def __init__(self, out: TextIO) -> None:
        self.out = out

    def _emit(self, kind: str, **data: Any) -> None:
        self.out.write(_EVENT_MARK + json.dumps({"event": kind, **data}) + "\n")
        self.out.flush()

    def start(self, meta: Dict[str, Any]) -> None:
        self._emit("start", meta=meta)

    def section(self, collective: str, modes: Sequence[str]) -> None:
        self._emit("section", collective=collective, modes=list(modes))

    def row(self, row: Dict[str, Any]) -> None:
        self._emit("row", row=row)

    def progress(self, done: int, total: int, label: str) -> None:
        self._emit("progress", done=done, total=total, label=label)

    def finish(self, summary: Dict[str, Any]) -> None:
        self._emit("finish", summary=summary)


def _dispatch(reporter: _Reporter, event: Dict[str, Any]) -> None:
    kind = event.get("event")
    if kind == "start":
        reporter.start(event["meta"])
    elif kind == "section":
        reporter.section(event["collective"], event["modes"])
    elif kind == "row":
        reporter.row(event["row"])
    elif kind == "progress":
        reporter.progress(event["done"], event["total"], event["label"])
    elif kind == "finish":
        reporter.finish(event["summary"])


class _Progress:
    """A one-line progress display on stderr, redrawn at most 10 times a second."""

    def __init__(self, stream: TextIO) -> None:
        self.stream = stream
        self.t0 = time.monotonic()
        self.last = 0.0
        self.shown = False

    def update(self, done: int, total: int, label: str) -> None:
        now = time.monotonic()
        if now - self.last < 0.1 and done < total:
            return
        self.last = now
        el = int(now - self.t0)
        self.stream.write(f"\r\033[Kpycoll-bench [{done}/{total}] {label}  {el // 60}:{el % 60:02d}")
        self.stream.flush()
        self.shown = True

    def clear(self) -> None:
        if self.shown:
            self.stream.write("\r\033[K")
            self.stream.flush()
            self.shown = False


class _TableReporter(_Reporter):
    """Prints nccl-tests' table and writes the --json / --csv / --plot files at the end."""

    def __init__(self, args: argparse.Namespace, out: TextIO, err: TextIO, progress: bool) -> None:
        self.args = args
        self.table = args.json != "-" and args.csv != "-"
        self.out = out
        self.meta: Dict[str, Any] = {}
        self.rows: List[Dict[str, Any]] = []
        self.modes: Sequence[str] = MODES
        self.progress_bar = _Progress(err) if progress else None
        self.summary: Dict[str, Any] = {}

    def _print(self, text: str) -> None:
        if self.progress_bar is not None:
            self.progress_bar.clear()
        if self.table:
            self.out.write(text + "\n")
            self.out.flush()

    def start(self, meta: Dict[str, Any]) -> None:
        self.meta = meta
        m = meta
        lib = m["library"]
        if lib["kind"] == "host":
            what = f"pycoll host library {lib.get('host_version', '?')}, NCCL API {lib['version']}"
        else:
            what = f"{lib['kind'].upper()} {lib['version']}"
        self._print(
            f"# pycoll-bench {','.join(m['collectives'])}: nRanks {m['nranks']} backend {m['backend']} ({what}) "
            f"api {m['api']} arrays {m['arrays']}"
        )
        step = f"{m['stepfactor']}(factor)" if m.get("stepfactor") else f"{m['stepbytes']}(bytes)"
        self._print(
            f"# minBytes {m['minbytes']} maxBytes {m['maxbytes']} step: {step} warmup iters: {m['warmup']} "
            f"iters: {m['iters']} validation: {int(m['check'])} stream: {'yes' if m['stream'] else 'no (inline, NULL stream)'}"
        )
        self._print(f"# time: {m['time_method']}")
        self._print(f"# library: {lib['path']}")
        self._print(f"# started {m['started']} on {m['hostname']}, load average {m['loadavg']}")
        self._print("#")
        self._print("# Using devices")
        for r in m["ranks"]:
            self._print(f"#  Rank {r['rank']:2d} Pid {r['pid']:7d} on {r['hostname']:>10s} device {r['device']}")
        self._print("#")

    def section(self, collective: str, modes: Sequence[str]) -> None:
        self.modes = modes
        left = "#       size         count      type   redop    root"
        units = "#        (B)    (elements)                          "
        top = "#" + " " * (len(left) - 1)
        cols, cunits = "", ""
        for mode in modes:
            top += f"{mode:^36s}"
            cols += "     time   algbw   busbw #wrong"
            cunits += "     (us)  (GB/s)  (GB/s)       "
        self._print(f"# Collective: {collective}")
        self._print(top.rstrip())
        self._print(left + cols)
        self._print(units + cunits)

    def row(self, row: Dict[str, Any]) -> None:
        self.rows.append(row)
        text = f"{row['size']:12d}  {row['count']:12d}  {row['type']:>8s}  {row['redop']:>6s}  {row['root']:6d}"
        for mode in self.modes:
            res = row["results"].get(mode)
            if res is None:
                text += f" {'N/A':>8s} {'N/A':>7s} {'N/A':>7s} {'N/A':>6s}"
                continue
            wrong = "N/A" if res["wrong"] is None else str(res["wrong"])
            text += f" {_fmt_time(res['time_us'])} {_fmt_bw(res['algbw_GBps'])} {_fmt_bw(res['busbw_GBps'])} {wrong:>6s}"
        self._print(text)

    def progress(self, done: int, total: int, label: str) -> None:
        if self.progress_bar is not None:
            self.progress_bar.update(done, total, label)

    def finish(self, summary: Dict[str, Any]) -> None:
        self.summary = summary
        if self.progress_bar is not None:
            self.progress_bar.clear()
        wrong = summary["wrong"]
        self._print(f"# Out of bounds values : {wrong} {'OK' if wrong == 0 else 'FAILED'}")
        self._print(f"# Avg bus bandwidth    : {summary['avg_busbw_GBps']:.6g}")
        self._print("#")
        self.write_files()

    # -- files ----------------------------------------------------------------------------------

    def flat_results(self) -> List[Dict[str, Any]]:
        out = []
        for row in self.rows:
            for mode, res in row["results"].items():
                if res is None:
                    continue
                flat = {k: v for k, v in row.items() if k != "results"}
                flat["mode"] = mode
                flat.update(res)
                out.append(flat)
        return out

    def document(self) -> Dict[str, Any]:
        from . import __version__

        return {"tool": "pycoll-bench", "version": __version__, "meta": self.meta,
                "results": self.flat_results(), "summary": self.summary}

    def write_files(self) -> None:
        a = self.args
        if a.json:
            text = json.dumps(self.document(), indent=2) + "\n"
            if a.json == "-":
                self.out.write(text)
            else:
                with open(a.json, "w") as f:
                    f.write(text)
        if a.csv:
            if a.csv == "-":
                self._write_csv(self.out)
            else:
                with open(a.csv, "w", newline="") as f:
                    self._write_csv(f)
        if a.plot:
            write_plot(self.flat_results(), self.meta, a.plot)

    _CSV_FIELDS = ("collective", "nranks", "backend", "api", "size", "count", "type", "redop", "root", "mode",
                   "time_us", "algbw_GBps", "busbw_GBps", "wrong", "time_us_mean", "time_us_min", "time_us_p90", "iters")

    def _write_csv(self, f: TextIO) -> None:
        w = csv.DictWriter(f, fieldnames=self._CSV_FIELDS, extrasaction="ignore")
        w.writeheader()
        for r in self.flat_results():
            w.writerow({**r, "nranks": self.meta.get("nranks"), "backend": self.meta.get("backend"),
                        "api": self.meta.get("api"), "wrong": "" if r["wrong"] is None else r["wrong"]})


def write_plot(results: List[Dict[str, Any]], meta: Dict[str, Any], path: str) -> None:
    """A PNG of time and bus bandwidth against size, one line per collective/type/op/mode."""
    import matplotlib

    matplotlib.use("Agg", force=False)
    import matplotlib.pyplot as plt

    series: Dict[str, List[Tuple[int, float, float]]] = {}
    for r in results:
        label = f"{r['collective']} {r['type']}" + (f" {r['redop']}" if r["redop"] != "none" else "") + f" ({r['mode']})"
        series.setdefault(label, []).append((r["size"], r["time_us"], r["busbw_GBps"]))
    rows = max(1, math.ceil(len(series) / 3))
    fig, (ax_t, ax_b) = plt.subplots(1, 2, figsize=(12, 4.5 + 0.22 * rows), layout="constrained")
    for label, pts in series.items():
        pts.sort()
        xs = [p[0] for p in pts]
        ax_t.plot(xs, [p[1] for p in pts], marker="o", ms=3, label=label)
        ax_b.plot(xs, [p[2] for p in pts], marker="o", ms=3, label=label)
    ticks = sorted({p[0] for pts in series.values() for p in pts})
    for ax in (ax_t, ax_b):
        ax.set_xscale("log", base=2)
        ax.set_xlabel("size (bytes)")
        ax.grid(True, which="both", alpha=0.3)
        if ticks and len(ticks) <= 16:
            ax.set_xticks(ticks)
            ax.set_xticklabels([format_size(t) for t in ticks], rotation=45)
    ax_t.set_yscale("log")
    ax_t.set_ylabel("time (us, median of the slowest rank)")
    ax_b.set_ylabel("bus bandwidth (GB/s)")
    handles, labels = ax_t.get_legend_handles_labels()
    fig.legend(handles, labels, loc="outside lower center", ncol=min(3, max(1, len(labels))), fontsize="small")
    fig.suptitle(f"pycoll-bench: {meta.get('nranks')} ranks, backend {meta.get('backend')}, api {meta.get('api')}")
    fig.savefig(path, dpi=110)
    plt.close(fig)


# --------------------------------------------------------------------------------------------------
# command line


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="pycoll-bench",
        description="Benchmark pycoll collectives and print nccl-tests' table; every result is checked. "
                    "See `pydoc pycoll.bench` for the definitions of size, time, algbw and busbw.",
    )
    p.add_argument("collective", type=_collectives,
                   help=f"one of {', '.join(COLLECTIVES)}, a comma-separated list, or 'all'")
    p.add_argument("-n", "--nranks", type=int, default=None,
                   help="number of ranks (default: the launcher's world size, else 1); started without a "
                        "launcher, pycoll-bench starts them itself")
    p.add_argument("-b", "--minbytes", type=_size_arg, default=parse_size("8"), help="smallest size (default 8)")
    p.add_argument("-e", "--maxbytes", type=_size_arg, default=parse_size("64M"), help="largest size (default 64M)")
    g = p.add_mutually_exclusive_group()
    g.add_argument("-f", "--stepfactor", type=int, default=None, help="multiply the size by this (default 2)")
    g.add_argument("-i", "--stepbytes", type=_size_arg, default=None, help="add this many bytes instead")
    p.add_argument("-d", "--datatype", default="float",
                   type=lambda v: _pick(v, DTYPES, _DTYPE_ALIASES, "datatype"),
                   help=f"{', '.join(DTYPES)} (or numpy names), a list, or 'all' (default float)")
    p.add_argument("-o", "--op", default="sum", type=lambda v: _pick(v, REDOPS, {}, "reduction op"),
                   help="sum, prod, max, min, avg, a list, or 'all' (default sum; reductions only)")
    p.add_argument("-r", "--root", type=int, default=0, help="root rank of broadcast, reduce, gather, scatter (default 0)")
    p.add_argument("-N", "--iters", type=int, default=20, help="timed iterations per size (default 20)")
    p.add_argument("-w", "--warmup", type=int, default=5, help="untimed iterations before them (default 5)")
    p.add_argument("-c", "--check", type=int, choices=(0, 1), default=1, help="check results (default 1)")
    mode = p.add_mutually_exclusive_group()
    mode.add_argument("--in-place", dest="modes", action="store_const", const=("in-place",),
                      help="only the in-place variant")
    mode.add_argument("--out-of-place", dest="modes", action="store_const", const=("out-of-place",),
                      help="only the out-of-place variant (default: both, as nccl-tests)")
    p.add_argument("--backend", default="auto", choices=("auto", "host", "nccl", "rccl"),
                   help="library to benchmark (default auto: nccl with CUDA GPUs, rccl with ROCm GPUs, else host)")
    p.add_argument("--api", default="comm", choices=("comm", "raw"),
                   help="comm: Communicator methods on arrays (default); raw: the bindings' Library calls on addresses")
    p.add_argument("--array", default="auto", choices=("auto", "numpy", "torch", "cupy"),
                   help="array library (default: numpy on the host, torch, else cupy, on GPUs)")
    p.add_argument("--stream", action="store_true",
                   help="host backend: queue the ops on a host stream and time them with events (GPU backends always do)")
    p.add_argument("--json", metavar="FILE", help="write every result as JSON ('-': to stdout instead of the table)")
    p.add_argument("--csv", metavar="FILE", help="write every result as CSV ('-': to stdout instead of the table)")
    p.add_argument("--plot", metavar="PNG", help="write a plot of time and bus bandwidth against size (needs matplotlib)")
    prog = p.add_mutually_exclusive_group()
    prog.add_argument("--progress", dest="progress", action="store_true", default=None,
                      help="show progress on stderr (default: when stderr is a terminal)")
    prog.add_argument("--no-progress", dest="progress", action="store_false")
    p.add_argument("--op-timeout", type=float, default=60.0, metavar="SECONDS",
                   help="deadline of every operation and of initialisation (default 60)")
    p.add_argument("--timeout", type=float, default=None, metavar="SECONDS",
                   help="stop the whole run after this many seconds (ranks pycoll-bench starts itself)")
    p.add_argument("--emit-events", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--debug-corrupt-rank", type=int, default=None, help=argparse.SUPPRESS)
    return p


def _check_args(p: argparse.ArgumentParser, a: argparse.Namespace) -> None:
    if a.nranks is not None and a.nranks < 1:
        p.error(f"-n must be at least 1, got {a.nranks}")
    if a.iters < 1:
        p.error(f"--iters must be at least 1, got {a.iters}")
    if a.warmup < 0:
        p.error(f"--warmup must be >= 0, got {a.warmup}")
    if a.maxbytes < a.minbytes:
        p.error(f"-e ({a.maxbytes}) is smaller than -b ({a.minbytes})")
    if a.minbytes < 1:
        p.error("-b must be at least 1 byte")
    if a.stepfactor is None and a.stepbytes is None:
        a.stepfactor = 2
    try:
        a.sizes = size_steps(a.minbytes, a.maxbytes, a.stepfactor, a.stepbytes)
    except ValueError as exc:
        p.error(str(exc))
    if not a.op_timeout > 0:
        p.error("--op-timeout must be > 0")
    if a.timeout is not None and not a.timeout > 0:
        p.error("--timeout must be > 0")
    if a.modes is None:
        a.modes = MODES
    if a.json and a.csv and a.json == "-" and a.csv == "-":
        p.error("--json - and --csv - cannot both go to stdout")


def _rank_meta(comm: Any, kit: _Kit) -> Dict[str, Any]:
    dev = comm.device
    label = "host" if dev.kind == "host" else f"{dev.kind}:{dev.device_id}"
    if dev.kind != "host" and kit.name == "torch":
        try:
            label += " " + kit.torch.cuda.get_device_name(dev.device_id)  # type: ignore[attr-defined]
        except Exception:  # the name is decoration only
            pass
    return {"rank": comm.rank, "pid": os.getpid(), "hostname": socket.gethostname(), "device": label}


def _exchange_meta(runner: _Runner, mine: Dict[str, Any]) -> List[Dict[str, Any]]:
    width = 512
    raw = json.dumps(mine).encode()[:width].ljust(width, b" ")
    rows = runner.allgather_f64(np.frombuffer(raw, dtype=np.uint8).astype(np.float64))
    return [json.loads(bytes(r.astype(np.uint8)).decode().strip() or "{}") for r in rows]


def _library_meta(lib: Any) -> Dict[str, Any]:
    major, minor, patch = lib.version_tuple
    meta = {"kind": lib.kind, "path": lib.path, "version": f"{major}.{minor}.{patch}"}
    if lib.kind == "host":
        try:
            hv = lib.host_version()
            meta["host_version"] = f"{hv // 10000}.{hv // 100 % 100}.{hv % 100}"
        except Exception:
            pass
    return meta


def _cases(a: argparse.Namespace) -> List[Tuple[str, str, Optional[str]]]:
    out = []
    for coll in a.collective:
        for dt in a.datatype:
            for op in (a.op if COLLECTIVES[coll].reduces else [None]):
                out.append((coll, dt, op))
    return out


def _run_rank(a: argparse.Namespace, reporter: _Reporter, *, rank: Optional[int], world: Optional[int]) -> int:
    """The benchmark as one rank of the job; rank 0 reports. Returns the exit status."""
    import pycoll

    comm = pycoll.init(rank, world, backend=a.backend, timeout=a.op_timeout, init_timeout=a.op_timeout,
                       name="pycoll-bench")
    runner: Optional[_Runner] = None
    status = EXIT_FAILED
    try:
        n, me = comm.size, comm.rank
        if not 0 <= a.root < n:
            raise ValueError(f"--root {a.root} is out of range for {n} ranks")
        gpu = comm.backend != "host"
        kit = _make_kit(a.array, comm.backend, comm.device.device_id)
        runner = _Runner(comm, kit, api=a.api, use_stream=gpu or a.stream, op_timeout=a.op_timeout)
        ranks = _exchange_meta(runner, _rank_meta(comm, kit))
        cases = _cases(a)
        total = sum(len(_size_plan(COLLECTIVES[c], DTYPES[d], n, a.sizes))
                    * len([m for m in a.modes if m == "out-of-place" or COLLECTIVES[c].in_place])
                    for c, d, _ in cases)
        if me == 0:
            reporter.start({
                "collectives": list(a.collective), "nranks": n, "backend": comm.backend, "api": a.api,
                "arrays": kit.name, "stream": runner.stream is not None, "library": _library_meta(comm.library),
                "datatypes": list(a.datatype), "ops": list(a.op), "root": a.root,
                "minbytes": a.minbytes, "maxbytes": a.maxbytes, "stepfactor": a.stepfactor, "stepbytes": a.stepbytes,
                "iters": a.iters, "warmup": a.warmup, "check": bool(a.check), "modes": list(a.modes),
                "time_method": ("median over iterations of the slowest rank's time per iteration; "
                                + ("each iteration timed with events on the stream"
                                   if runner.stream is not None else "wall clock around each call")),
                "started": datetime.now(timezone.utc).isoformat(timespec="seconds"),
                "hostname": socket.gethostname(), "loadavg": " ".join(f"{x:.2f}" for x in os.getloadavg()),
                "python": platform.python_version(), "ranks": ranks,
            })
        done = 0
        wrong_total = 0
        busbws: List[float] = []
        section = None
        for coll, dtname, opname in cases:
            spec, dt = COLLECTIVES[coll], DTYPES[dtname]
            modes = list(a.modes)
            if me == 0 and section != coll:
                reporter.section(coll, modes)
                section = coll
            for nbytes in _size_plan(spec, dt, n, a.sizes):
                count = _element_count(spec, nbytes, dt, n)
                results: Dict[str, Any] = {}
                for mode in modes:
                    in_place = mode == "in-place"
                    if in_place and not spec.in_place:
                        results[mode] = None
                        continue
                    op = REDOPS[opname] if opname else None
                    case = build_case(spec, dt, op, a.root, n, me, nbytes, in_place, kit)
                    corrupt = a.debug_corrupt_rank == me
                    m = measure(runner, case, iters=a.iters, warmup=a.warmup, check=bool(a.check), corrupt=corrupt)
                    res = m.summary(case.nbytes, spec.bus_factor(n))
                    results[mode] = res
                    wrong_total += m.wrong or 0
                    busbws.append(res["busbw_GBps"])
                    done += 1
                    if me == 0:
                        reporter.progress(done, total, " ".join(
                            x for x in (coll, dt.name, opname, format_size(case.nbytes), mode) if x))
                    del case
                if me == 0:
                    reporter.row({
                        "collective": coll, "size": count * dt.itemsize, "count": count, "type": dt.name,
                        "redop": opname or "none", "root": a.root if spec.rooted else -1, "results": results,
                    })
        if me == 0:
            reporter.finish({
                "wrong": wrong_total,
                "avg_busbw_GBps": float(np.mean(busbws)) if busbws else 0.0,
                "ok": wrong_total == 0,
                "finished": datetime.now(timezone.utc).isoformat(timespec="seconds"),
            })
        status = EXIT_OK if wrong_total == 0 else EXIT_WRONG
    finally:
        if runner is not None:
            runner.close()
        _teardown(comm, clean=status != EXIT_FAILED)
    return status


def _teardown(comm: Any, clean: bool) -> None:
    """Destroy the communicator; a failure after the results are complete is a warning, not a failure."""
    from .errors import PycollError

    if not clean:
        comm.abort()
        return
    try:
        comm.barrier()
        comm.destroy()
    except PycollError as exc:
        _log.warning("pycoll-bench: tearing down the communicator failed (results above are complete): %s", exc)
        comm.abort()


def _launch(argv: Sequence[str], a: argparse.Namespace, reporter: _Reporter) -> int:
    """Start ``a.nranks`` ranks of this benchmark through pycoll-run; relay rank 0's events."""
    import pycoll

    root = os.path.dirname(os.path.dirname(os.path.abspath(pycoll.__file__)))
    env = dict(os.environ)
    env["PYTHONPATH"] = root + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    cmd = [sys.executable, "-m", "pycoll.run", "-n", str(a.nranks), "--no-prefix"]
    if a.timeout:
        cmd += ["--timeout", str(a.timeout)]
    cmd += ["-m", "pycoll.bench", *argv, "--emit-events"]
    finished = False
    proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, env=env, text=True, bufsize=1)
    try:
        assert proc.stdout is not None
        for line in proc.stdout:
            if line.startswith(_EVENT_MARK):
                event = json.loads(line[len(_EVENT_MARK):])
                _dispatch(reporter, event)
                finished = finished or event.get("event") == "finish"
            else:
                sys.stdout.write(line)
                sys.stdout.flush()
        rc = proc.wait()
    except BaseException:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        raise
    if rc in (EXIT_OK, EXIT_WRONG) and finished:
        return rc
    sys.stderr.write(f"pycoll-bench: the ranks failed (pycoll-run exit status {rc})\n")
    return EXIT_FAILED


def main(argv: Optional[Sequence[str]] = None) -> int:
    """Entry point of ``pycoll-bench``; returns the exit status (see the module docstring)."""
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = _parser()
    try:
        a = parser.parse_args(argv)
        _check_args(parser, a)
    except SystemExit as exc:
        return int(exc.code) if isinstance(exc.code, int) else EXIT_USAGE
    if not logging.getLogger("pycoll").handlers:
        logging.basicConfig(level=logging.WARNING, format="%(message)s")
    from . import env as _env

    try:
        info = _env.discover()
    except _env.RankDiscoveryError as exc:
        sys.stderr.write(f"pycoll-bench: {exc}\n")
        return EXIT_USAGE
    launched = info.source != "single"
    if launched and a.nranks is not None and a.nranks != info.world_size:
        sys.stderr.write(f"pycoll-bench: started as {info.world_size} ranks (by {info.source}) but -n is {a.nranks}\n")
        return EXIT_USAGE
    nranks = info.world_size if launched else (a.nranks or 1)
    a.nranks = nranks
    if not 0 <= a.root < nranks:
        sys.stderr.write(f"pycoll-bench: --root {a.root} is out of range for {nranks} ranks\n")
        return EXIT_USAGE
    progress = a.progress if a.progress is not None else sys.stderr.isatty()
    if a.emit_events:
        reporter: _Reporter = _EventReporter(sys.stdout) if info.rank == 0 else _Reporter()
    else:
        reporter = _TableReporter(a, sys.stdout, sys.stderr, progress) if info.rank == 0 else _Reporter()
    try:
        if launched:
            return _run_rank(a, reporter, rank=None, world=None)
        if nranks == 1:
            return _run_rank(a, reporter, rank=0, world=1)
        return _launch(argv, a, reporter)
    except KeyboardInterrupt:
        sys.stderr.write("pycoll-bench: interrupted\n")
        return EXIT_FAILED
    except BrokenPipeError:  # e.g. `pycoll-bench ... | head`: stop quietly
        try:
            sys.stdout = open(os.devnull, "w")
        except OSError:
            pass
        return EXIT_FAILED
    except Exception as exc:
        from .errors import PycollError

        if not isinstance(exc, (PycollError, RuntimeError, ValueError, TimeoutError, ImportError, OSError)):
            raise
        sys.stderr.write(f"pycoll-bench: rank {info.rank}: {type(exc).__name__}: {exc}\n")
        return EXIT_FAILED


if __name__ == "__main__":
    sys.exit(main())
