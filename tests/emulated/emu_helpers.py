"""Helpers of the emulated-GPU tests: ranks as real processes, and the streams a test runs on.

``run_ranks(fn, n, *args)`` calls ``fn(rank, n, *args)`` in ``n`` processes started from a
forkserver and returns their results; a rank that raises, dies or outlives ``timeout`` fails the
call. Every child is killed and joined before it returns, whatever happens (modelled on
tests/mp_helpers.py, kept here so that this folder stands alone).
"""

from __future__ import annotations

import os
import subprocess
import sys
from typing import Any, Callable, Dict, List, Optional, Tuple

import numpy as np
from helpers.mp import RankFailure, run_ranks as _run_ranks  # noqa: F401

PREFIX = "pycoll_trace_rank_"
KINDS = ("default_stream", "torch_current", "cupy_current", "side_stream", "stream_object")


def run_ranks(fn: Callable[..., Any], n: int, *args: Any, timeout: float = 30.0,
              env: Optional[Dict[str, str]] = None) -> List[Any]:
    """helpers.mp.run_ranks, each rank leaving at once after it reported (hung emulated kernels)."""
    return _run_ranks(fn, n, *args, timeout=timeout, env=env, hard_exit=True)


def uid() -> bytes:
    from pycoll import _bindings

    return bytes(_bindings.load("host").get_unique_id())


def setup(rank: int, n: int, unique_id: bytes, *, timeout: float = 20.0, dump_dir: Optional[str] = None,
          device: int = 0, **kwargs: Any) -> Tuple[Any, Any]:
    """In a rank: an emulated-GPU communicator on ``device``, and the runtime."""
    if dump_dir is not None:
        os.environ["PYCOLL_FR_DUMP_DIR"] = dump_dir
    import pycoll.emulated as emu

    comm = emu.init(rank, n, unique_id=unique_id, device=device, timeout=timeout, **kwargs)
    return comm, emu.runtime()


class Streams:
    """Where a test's operations run: ``arg`` is the ``stream=`` to pass with arrays, ``plain`` the one for
    operations without arrays (barrier), ``handle`` the raw stream (for hangs), ``array(data)`` makes an
    input of the right flavour."""

    def __init__(self, kind: str, comm: Any, rt: Any) -> None:
        import pycoll.emulated as emu

        self.kind, self.rt = kind, rt
        dev = comm.device
        self.flavour = emu.CupyLikeArray if kind == "cupy_current" else emu.TorchLikeTensor
        self.keep: Any = None
        if kind == "default_stream":
            self.arg = self.plain = 0
            self.handle = 0
        elif kind in ("torch_current", "cupy_current"):
            self.handle = dev.create_stream()
            getattr(rt, "cupy" if kind == "cupy_current" else "torch").set_stream(self.handle, dev.device_id)
            self.arg, self.plain = None, self.handle
        elif kind == "side_stream":
            self.handle = dev.create_stream()
            self.arg = self.plain = self.handle
        elif kind == "stream_object":
            self.keep = dev.new_stream()
            self.handle = self.keep.handle
            self.arg = self.plain = self.keep
        else:
            raise ValueError(kind)
        self.device_id = dev.device_id

    def array(self, data: Any) -> Any:
        return self.flavour(self.rt, np.asarray(data, np.float32), device=self.device_id)


def all_collectives(comm: Any, st: Streams, *, async_op: bool) -> Tuple[List[Any], Callable[[], Dict[str, Any]]]:
    """Every collective (and a send/recv) on ``st``; returns the Works and a function giving the results."""
    r, n = comm.rank, comm.size
    a = st.array(np.full(4, r + 1.0))
    b = st.array(np.full(4, 10.0 * (r + 1)))
    red = st.array(np.full(4, r + 1.0))
    ag_out = st.array(np.zeros(2 * n))
    rs_in = st.array(np.arange(2 * n) + r)
    rs_out = st.array(np.zeros(2))
    a2a_in = st.array(np.arange(n) + 10 * r)
    a2a_out = st.array(np.zeros(n))
    g_out = st.array(np.zeros(2 * n))
    sc_in = st.array(np.arange(2 * n) * (1.0 if r == 0 else 0.0))
    sc_out = st.array(np.zeros(2))
    p2p = st.array(np.full(3, 5.0 if r == 0 else 0.0))
    sr_in, sr_out = st.array(np.full(2, 7.0 + r)), st.array(np.zeros(2))
    kw = dict(stream=st.arg, async_op=async_op)
    works = [
        comm.all_reduce(a, **kw),
        comm.broadcast(b, root=0, **kw),
        comm.reduce(red, root=0, **kw),
        comm.all_gather(st.array(np.full(2, r + 1.0)), ag_out, **kw),
        comm.reduce_scatter(rs_in, rs_out, **kw),
        comm.all_to_all(a2a_in, a2a_out, **kw),
        comm.gather(st.array(np.full(2, r + 1.0)), g_out if r == 0 else None, root=0, **kw),
        comm.scatter(sc_in if r == 0 else None, sc_out, root=0, **kw),
        comm.send(p2p, 1, **kw) if r == 0 else comm.recv(p2p, 0, **kw),
        comm.sendrecv(sr_in, sr_out, r ^ 1 if (r ^ 1) < n else r, **kw),
        comm.barrier(stream=st.plain, async_op=async_op),
    ]

    def results() -> Dict[str, Any]:
        return {name: arr.numpy().tolist() for name, arr in
                (("all_reduce", a), ("broadcast", b), ("reduce", red), ("all_gather", ag_out),
                 ("reduce_scatter", rs_out), ("all_to_all", a2a_out), ("gather", g_out), ("scatter", sc_out),
                 ("p2p", p2p), ("sendrecv", sr_out))}

    return works, results


def expected(rank: int, n: int = 2) -> Dict[str, Any]:
    total = sum(range(1, n + 1))
    rs_full = [sum(i + q for q in range(n)) for i in range(2 * n)]
    return {
        "all_reduce": [float(total)] * 4,
        "broadcast": [10.0] * 4,
        "reduce": [float(total)] * 4 if rank == 0 else [1.0 + rank] * 4,
        "all_gather": [float(q + 1) for q in range(n) for _ in range(2)],
        "reduce_scatter": [float(v) for v in rs_full[2 * rank:2 * rank + 2]],
        "all_to_all": [float(rank + 10 * q) for q in range(n)],
        "gather": [float(q + 1) for q in range(n) for _ in range(2)] if rank == 0 else [0.0] * (2 * n),
        "scatter": [float(2 * rank), float(2 * rank + 1)],
        "p2p": [5.0] * 3,
        "sendrecv": [7.0 + (rank ^ 1 if (rank ^ 1) < n else rank)] * 2,
    }


def dumped_ranks(dump_dir: str) -> set:
    folder = os.path.join(dump_dir, "generation_0")
    if not os.path.isdir(folder):
        return set()
    return {int(f[len(PREFIX):]) for f in os.listdir(folder) if f.startswith(PREFIX) and f[len(PREFIX):].isdigit()}


def torch_fr_trace(dump_dir: str) -> str:
    """torch's flight-recorder analyzer on the dumps; its report."""
    import pytest

    pytest.importorskip("torch.distributed.flight_recorder.fr_trace")
    folder = os.path.join(dump_dir, "generation_0")
    out = subprocess.run([sys.executable, "-m", "torch.distributed.flight_recorder.fr_trace", folder, "-p", PREFIX],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stdout + out.stderr
    return out.stdout + out.stderr
