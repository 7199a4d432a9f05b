"""Helpers for the host-library tests: loading, datatypes, inputs and numpy/ml_dtypes references.

The references are what the host library promises to match bit for bit: reductions fold the
ranks' arrays left to right, rounding to the element type after every step, i.e.
``functools.reduce(op, arrays)``; Avg premultiplies floating inputs by 1/n (rounded to the type
through float32, as NCCL does) and divides integer sums, truncating towards zero. Where NCCL's arithmetic
differs from numpy's, the reference is NCCL's: max and min ignore a NaN operand, and float8 results saturate to
the largest finite value (``__NV_SATFINITE``) instead of becoming NaN or infinity.
"""

from __future__ import annotations

import functools
import os
import signal
import time
from typing import Callable, List, Optional, Sequence

import ml_dtypes
import numpy as np

from pycoll import _dtypes
from pycoll._bindings import DataType, RedOp, UniqueId, load

PREMUL_HOST = 100  # test-only codes for PreMulSum with a host-immediate / "device" scalar
PREMUL_DEVICE = 101

NP_DTYPES = {DataType(d.code): _dtypes.numpy_dtype(d.code) for d in _dtypes.DATATYPES}
FLOATS = {DataType(d.code) for d in _dtypes.DATATYPES if d.is_float}
UINT_VIEW = {1: np.uint8, 2: np.uint16, 4: np.uint32, 8: np.uint64}


def lib():
    return load("host")


def init(n: int, rank: int, uid: bytes, config=None) -> int:
    """A blocking communicator (config=None) or comm_init_rank_config's comm (polled to done)."""
    l = lib()
    if config is None:
        return l.comm_init_rank(n, UniqueId(uid), rank)
    comm, _ = l.comm_init_rank_config(n, UniqueId(uid), rank, config)
    wait_ready(comm)
    return comm


def wait_ready(comm: int, timeout: float = 30.0) -> int:
    """Polls ncclCommGetAsyncError until it is not IN_PROGRESS; returns the final state."""
    l = lib()
    deadline = time.monotonic() + timeout
    while True:
        st = l.comm_get_async_error(comm)
        if st != 7:
            return st
        if time.monotonic() > deadline:
            raise TimeoutError("communicator still in progress")
        time.sleep(0.001)


def bits(a: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(a).view(UINT_VIEW[a.dtype.itemsize])


def assert_bits_equal(got: np.ndarray, want: np.ndarray, what: str = "") -> None:
    g, w = bits(got), bits(want)
    if not np.array_equal(g, w):
        i = int(np.argmax(g != w))
        raise AssertionError(
            f"{what}: {int(np.sum(g != w))} of {g.size} elements differ; first at {i}: got {got.reshape(-1)[i]!r} "
            f"(0x{int(g.reshape(-1)[i]):x}) want {want.reshape(-1)[i]!r} (0x{int(w.reshape(-1)[i]):x})"
        )


def make_input(dtype: int, count: int, seed: int, rank: int, op: Optional[int] = None) -> np.ndarray:
    """Deterministic input of `rank`; values suit `op` (small magnitudes for products)."""
    rng = np.random.default_rng([seed, rank, int(dtype)])
    npd = NP_DTYPES[dtype]
    if dtype in FLOATS:
        if op == RedOp.Prod:
            v = rng.uniform(0.5, 1.5, count)
        elif dtype in (DataType.Float8e4m3, DataType.Float8e5m2):
            v = rng.normal(0, 8, count)
        else:
            v = rng.normal(0, 100, count)
        return v.astype(np.float32).astype(npd)
    info = np.iinfo(npd)
    if op == RedOp.Prod:
        lo, hi = (0, 4) if info.min == 0 else (-3, 4)
    else:
        lo, hi = max(info.min, -(2**40)), min(info.max, 2**40)
    return rng.integers(lo, hi, count, dtype=np.int64 if info.min < 0 else np.uint64, endpoint=True).astype(npd)


def premul_scalar(dtype: int, rank: int) -> np.ndarray:
    """The PreMulSum scalar rank `rank` uses in the tests (a 1-element array of `dtype`)."""
    if dtype in FLOATS:
        return np.array([0.5 + 0.25 * rank], np.float32).astype(NP_DTYPES[dtype])
    return np.array([rank + 2], NP_DTYPES[dtype])


FLOAT8 = (DataType.Float8e4m3, DataType.Float8e5m2)


def _ignoring_nan(select: Callable) -> Callable:
    """numpy's maximum/minimum (their choice on ties), but a NaN operand loses (NCCL's fmaxf/fminf, __hmax/__hmin)."""
    return lambda a, b: np.where(np.isnan(b), a, np.where(np.isnan(a), b, select(a, b)))


def _nccl_step(dtype: int, fn: Callable) -> Callable:
    """One binary step of NCCL's arithmetic in `dtype`: numpy's, except that a float8 result saturates to the
    largest finite value with its sign (NCCL's __NV_SATFINITE conversions; an e5m2 infinity too), NaN kept."""
    if dtype not in FLOAT8:
        return fn
    npd = NP_DTYPES[dtype]
    top = float(ml_dtypes.finfo(npd).max)

    def step(a, b):
        r = np.asarray(fn(np.asarray(a).astype(np.float32), np.asarray(b).astype(np.float32)), np.float32)
        return np.where(np.isnan(r), r, np.clip(r, -top, top)).astype(npd)

    return step


def reduce_ref(dtype: int, op: int, arrays: Sequence[np.ndarray]) -> np.ndarray:
    """The reduction of `arrays` (rank order) that the library must reproduce bit for bit."""
    n = len(arrays)
    npd = NP_DTYPES[dtype]
    add, mul = _nccl_step(dtype, np.add), _nccl_step(dtype, np.multiply)
    with np.errstate(all="ignore"):
        if op in (RedOp.Sum, RedOp.Prod, RedOp.Max, RedOp.Min):
            fn = {RedOp.Sum: add, RedOp.Prod: mul, RedOp.Max: _nccl_step(dtype, _ignoring_nan(np.maximum)),
                  RedOp.Min: _nccl_step(dtype, _ignoring_nan(np.minimum))}[op]
            return functools.reduce(fn, arrays)
        if op == RedOp.Avg:
            if dtype in FLOATS:
                if dtype == DataType.Float64:
                    s = np.array([1.0 / n], np.float64)
                else:
                    s = np.array([1.0 / n], np.float64).astype(np.float32).astype(npd)
                return functools.reduce(add, [mul(a, s) for a in arrays])
            total = functools.reduce(np.add, arrays)
            if np.iinfo(npd).min < 0:
                t = total.astype(np.int64)
                q = np.where(t < 0, -((-t) // n), t // n)
            else:
                q = total.astype(np.uint64) // np.uint64(n)
            return q.astype(npd)
        if op in (PREMUL_HOST, PREMUL_DEVICE):
            return functools.reduce(add, [mul(a, premul_scalar(dtype, r)) for r, a in enumerate(arrays)])
    raise ValueError(op)


class Scalar:
    """A PreMulSum operator of one rank: keeps the scalar's memory alive while the op exists."""

    def __init__(self, comm: int, dtype: int, rank: int, device: bool) -> None:
        self.value = premul_scalar(dtype, rank)
        self.op = lib().red_op_create_pre_mul_sum(self.value.ctypes.data, int(dtype), 0 if device else 1, comm)

    def destroy(self, comm: int) -> None:
        lib().red_op_destroy(self.op, comm)


def ptr(a: Optional[np.ndarray]) -> int:
    return 0 if a is None else a.ctypes.data


def wait_until(pred: Callable[[], bool], timeout: float, what: str = "condition") -> None:
    deadline = time.monotonic() + timeout
    while not pred():
        if time.monotonic() > deadline:
            raise TimeoutError(f"{what} not reached within {timeout} s")
        time.sleep(0.002)


def stop(pid: int) -> None:
    os.kill(pid, signal.SIGSTOP)


def kill(pid: int) -> None:
    os.kill(pid, signal.SIGKILL)


def kill_when_done(victims: Sequence[int]):
    """An ``on_start`` for run_ranks: SIGKILLs the `victims` (e.g. stopped ranks) once every other
    rank has exited, so the test does not wait for run_ranks' deadline."""
    import threading

    def on_start(procs):
        def watch():
            others = [p for r, p in enumerate(procs) if r not in victims]
            while any(p.is_alive() for p in others):
                time.sleep(0.01)
            for r in victims:
                try:
                    os.kill(procs[r].pid, signal.SIGKILL)  # not SIGCONT first: see run_ranks
                except ProcessLookupError:
                    pass

        threading.Thread(target=watch, daemon=True).start()

    return on_start


def uid() -> bytes:
    return bytes(lib().get_unique_id())


__all__: List[str] = [name for name in dir() if not name.startswith("_")]
