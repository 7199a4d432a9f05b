"""Every collective of the host library against numpy / ml_dtypes, bit for bit, at 1-8 ranks.

The default set covers every collective at 1, 2, 3, 4 and 8 ranks with a few datatypes and ops;
the full datatype x op x in/out-of-place matrix is marked slow (--runslow).
"""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from helpers.host_util import (
    NP_DTYPES,
    PREMUL_DEVICE,
    PREMUL_HOST,
    Scalar,
    assert_bits_equal,
    init,
    lib,
    make_input,
    ptr,
    reduce_ref,
    uid,
)
from helpers.mp import run_ranks

from pycoll._bindings import DataType, RedOp

REDUCING = ("allreduce", "reduce", "reducescatter")
MOVING = ("broadcast", "bcast", "allgather", "alltoall", "gather", "scatter", "sendrecv")
BLOCKED = ("reducescatter", "alltoall", "scatter")  # the send buffer holds one block per rank


def _run_case(l, comm, rank, n, seed, kind, dtype, op, inplace, count, root):
    npd = NP_DTYPES[dtype]
    rop = op
    scalar = None
    if op in (PREMUL_HOST, PREMUL_DEVICE):
        scalar = Scalar(comm, dtype, rank, device=op == PREMUL_DEVICE)
        rop = scalar.op
    blocks = n if kind in BLOCKED else 1
    xs = [make_input(dtype, count * blocks, seed, r, op if op in (RedOp.Prod,) else None) for r in range(n)]
    me = xs[rank].copy()
    dt = int(dtype)
    if kind == "allreduce":
        recv = me if inplace else np.empty(count, npd)
        l.all_reduce(ptr(me), ptr(recv), count, dt, rop, comm)
        got, want = recv, reduce_ref(dtype, op, xs)
    elif kind == "reduce":
        recv = me if inplace else (np.empty(count, npd) if rank == root else None)
        l.reduce(ptr(me), ptr(recv), count, dt, rop, root, comm)
        got, want = (recv, reduce_ref(dtype, op, xs)) if rank == root else (None, None)
    elif kind == "reducescatter":
        recv = me[rank * count : (rank + 1) * count] if inplace else np.empty(count, npd)
        l.reduce_scatter(ptr(me), ptr(recv), count, dt, rop, comm)
        got, want = recv, reduce_ref(dtype, op, [x[rank * count : (rank + 1) * count] for x in xs])
    elif kind in ("broadcast", "bcast"):
        buf = me if (inplace or kind == "bcast") else np.empty(count, npd)
        if kind == "bcast":
            l.bcast(ptr(buf), count, dt, root, comm)
        else:
            l.broadcast(ptr(me) if rank == root else 0, ptr(buf), count, dt, root, comm)
        got, want = buf, xs[root]
    elif kind == "allgather":
        recv = np.empty(n * count, npd)
        if inplace:
            recv[rank * count : (rank + 1) * count] = me
            send = recv[rank * count : (rank + 1) * count]
        else:
            send = me
        l.all_gather(ptr(send), ptr(recv), count, dt, comm)
        got, want = recv, np.concatenate(xs)
    elif kind == "alltoall":
        recv = me if inplace else np.empty(n * count, npd)
        l.all_to_all(ptr(me), ptr(recv), count, dt, comm)
        got, want = recv, np.concatenate([x[rank * count : (rank + 1) * count] for x in xs])
    elif kind == "gather":
        recv = np.empty(n * count, npd) if rank == root else None
        send = me
        if inplace and rank == root:
            recv[rank * count : (rank + 1) * count] = me
            send = recv[rank * count : (rank + 1) * count]
        l.gather(ptr(send), ptr(recv), count, dt, root, comm)
        got, want = (recv, np.concatenate(xs)) if rank == root else (None, None)
    elif kind == "scatter":
        send = me if rank == root else None
        recv = me[rank * count : (rank + 1) * count] if (inplace and rank == root) else np.empty(count, npd)
        l.scatter(ptr(send), ptr(recv), count, dt, root, comm)
        got, want = recv, xs[root][rank * count : (rank + 1) * count]
    elif kind == "sendrecv":
        recv = np.empty(count, npd)
        nxt, prv = (rank + 1) % n, (rank - 1) % n
        l.group_start()
        if rank % 2:  # half of the ranks post the receive first: any order must work
            l.recv(ptr(recv), count, dt, prv, comm)
            l.send(ptr(me), count, dt, nxt, comm)
        else:
            l.send(ptr(me), count, dt, nxt, comm)
            l.recv(ptr(recv), count, dt, prv, comm)
        l.group_end()
        got, want = recv, xs[prv]
    else:
        raise ValueError(kind)
    if scalar is not None:
        scalar.destroy(comm)
    if got is not None:
        what = f"{kind} {DataType(dtype).name} op={op} inplace={inplace} count={count} root={root} rank={rank}/{n}"
        assert_bits_equal(got, want, what)


def _worker(rank, n, id_bytes, cases):
    l = lib()
    comm = init(n, rank, id_bytes)
    failures = []
    try:
        for seed, case in enumerate(cases):
            try:
                _run_case(l, comm, rank, n, seed, *case)
            except AssertionError as exc:
                failures.append(str(exc))
            except Exception as exc:  # an error code from the library: the comm is unusable now
                failures.append(f"{case}: {type(exc).__name__}: {exc}")
                break
    finally:
        l.comm_destroy(comm)
    return failures


def _cases(n, kinds, dtypes, ops, sizes, inplaces=(False, True)):
    out = []
    for kind, dtype, inplace, count in itertools.product(kinds, dtypes, inplaces, sizes):
        root = (count + int(dtype)) % n
        if kind in REDUCING:
            for op in ops:
                out.append((kind, dtype, op, inplace, count, root))
        else:
            out.append((kind, dtype, RedOp.Sum, inplace, count, root))
    return out


def _check(n, cases, timeout, env=None):
    results = run_ranks(_worker, n, uid(), cases, timeout=timeout, env=env)
    failures = [f for per_rank in results for f in per_rank]
    assert not failures, "\n".join(failures[:20])


FAST_DTYPES = (DataType.Float32, DataType.Float16, DataType.Bfloat16, DataType.Int8, DataType.Float8e4m3)
FAST_OPS = (RedOp.Sum, RedOp.Avg, RedOp.Max, PREMUL_HOST)


@pytest.mark.timeout(240)
@pytest.mark.parametrize("n", [1, 2, 3, 4, 8])
def test_every_collective(n):
    """Every collective, small and multi-step sizes, in and out of place, a few types and ops."""
    big = 150_000 if n <= 4 else 40_000  # multi-step for every algorithm; 8 ranks share 2 CPUs in CI
    cases = _cases(n, REDUCING + MOVING, (DataType.Float32,), (RedOp.Sum, RedOp.Avg), (1, 1000, big))
    cases += _cases(n, REDUCING, FAST_DTYPES, FAST_OPS, (17,), inplaces=(False,))
    cases += _cases(n, ("allreduce",), (DataType.Float16, DataType.Int64), (RedOp.Prod, RedOp.Min), (300_000,),
                    inplaces=(True,))
    _check(n, cases, timeout=90)


@pytest.mark.timeout(240)
@pytest.mark.parametrize("n, scale", [(2, "default"), (2, "small"), (3, "small"), (4, "small")])
def test_large_reductions_streaming_stores(n, scale):
    """AllReduce/Reduce outputs past the streaming-store threshold: odd counts (vector tails, unaligned
    slice ends), in and out of place, the one-pass float32 sum and the blockwise kernels. "default": past
    8 MiB, once; "small": PYCOLL_HOST_STREAM_MIN and PYCOLL_HOST_CHUNK_BYTES lowered so that outputs of
    about 300 KB stream through several chunks."""
    env = None if scale == "default" else {"PYCOLL_HOST_STREAM_MIN": "65536", "PYCOLL_HOST_CHUNK_BYTES": "65536"}
    size = 9 << 20 if scale == "default" else 300_000
    f32 = size // 4 + 3
    cases = _cases(n, ("allreduce",), (DataType.Float32,), (RedOp.Sum, RedOp.Avg, PREMUL_HOST), (f32,))
    cases += _cases(n, ("reduce",), (DataType.Float32,), (RedOp.Sum,), (f32,), inplaces=(False,))
    f64 = size // 8 + 5
    cases += _cases(n, ("allreduce",), (DataType.Float64, DataType.Int32), (RedOp.Sum, RedOp.Max), (f64,),
                    inplaces=(False,))
    _check(n, cases, timeout=180, env=env)


@pytest.mark.slow
@pytest.mark.timeout(1800)
@pytest.mark.parametrize("n", [1, 2, 3, 4, 8])
def test_full_matrix(n):
    """Every collective x datatype x op (incl. PreMulSum host/device) x in/out-of-place."""
    ops = (RedOp.Sum, RedOp.Prod, RedOp.Max, RedOp.Min, RedOp.Avg, PREMUL_HOST, PREMUL_DEVICE)
    cases = _cases(n, REDUCING + MOVING, tuple(NP_DTYPES), ops, (3, 4099, 70_000))
    _check(n, cases, timeout=1200)


def test_one_rank_premul_and_avg_apply_locally():
    """A 1-rank comm still applies PreMulSum scalars and Avg (x * 1.0)."""
    l = lib()
    comm = init(1, 0, uid())
    try:
        for dtype in (DataType.Float32, DataType.Bfloat16, DataType.Int32):
            x = make_input(dtype, 64, 7, 0)
            s = Scalar(comm, dtype, 0, device=False)
            out = np.empty_like(x)
            l.all_reduce(ptr(x), ptr(out), x.size, int(dtype), s.op, comm)
            assert_bits_equal(out, reduce_ref(dtype, PREMUL_HOST, [x]), "premul n=1")
            s.destroy(comm)
    finally:
        l.comm_destroy(comm)


@pytest.mark.timeout(60)
def test_the_reduction_kernels_take_unaligned_arrays_without_undefined_behaviour(tmp_path):
    # they read and wrote int64/float arrays at odd addresses through plain typed pointers: undefined behaviour
    # (UBSan: "store to misaligned address ... for type 'int64_t'") that gcc's x86 code happened to forgive
    import os
    import shutil
    import subprocess

    from helpers import REPO

    cc = shutil.which("gcc") or shutil.which("cc")
    if cc is None:
        pytest.skip("no C compiler")
    host = os.path.join(REPO, "pycoll", "_host")
    exe = str(tmp_path / "unaligned")
    build = subprocess.run([cc, "-O1", "-std=gnu11", "-pthread", "-fsanitize=alignment,undefined",
                            "-fno-sanitize-recover=all", "-I", host, os.path.join(REPO, "tests", "host",
                            "unaligned_kernels.c"), os.path.join(host, "datatype.c"), os.path.join(host, "copy.c"),
                            "-o", exe, "-lm"], capture_output=True, text=True, timeout=50)
    if build.returncode != 0 and "sanitize" in build.stderr:
        pytest.skip(f"the compiler has no UBSan: {build.stderr[-300:]}")
    assert build.returncode == 0, build.stderr[-3000:]
    run = subprocess.run([exe], capture_output=True, text=True, timeout=30)
    assert run.returncode == 0 and run.stdout.strip() == "ok", run.stderr[-2000:]
