"""Allreduce (float32, sum) latency and bandwidth: pycoll next to Open MPI and gloo, in one run.

Usage (from the repository root, pycoll built in place or installed)::

    python benchmarks/allreduce_compare.py                        # 2 and 4 ranks, 8 B .. 64 MiB
    python benchmarks/allreduce_compare.py --ranks 2 --sizes 8,4K,64M --scale 0.5
    python benchmarks/allreduce_compare.py --json out.json --markdown out.md

What runs, one after the other, for each rank count N:

* **copy bound**: N processes each copy a private buffer of the size into another private buffer,
  all at the same time, with each of: ``numpy.copyto``, glibc ``memcpy``, an AVX2 loop and an AVX2
  loop with streaming (non-temporal) stores (the C routines are compiled here with gcc; without
  gcc, numpy only). t_copy is, for the fastest routine, the median over iterations of the slowest
  process's copy time. Every rank of an allreduce of private buffers has to read its whole input
  from memory and write its whole output, which is the memory traffic of one copy of the size;
  everything else (staging in shared memory, the reduction) can stay in cache when the work is cut
  into cache-sized pieces. The copy bound is the algbw an allreduce would reach if that one copy
  per rank were all it cost: ``algbw_bound = size / t_copy``. It counts no reduction and no
  synchronisation, so no allreduce of private buffers can beat it by more than measurement noise.
  It is a ceiling, not a target that is free to reach: the exchange itself is not in it. A
  reduce-scatter + all-gather over shared memory makes each rank write S bytes into the segment
  (its peers' pieces of its input, its reduced slice) and read 2(N-1)/N * S bytes of its peers'
  back; cached, that is CPU time and cross-core traffic, but no extra DRAM traffic.
  Below 256 KiB everything fits in cache and the bound means nothing (it is call overhead there):
  the tables leave it out (the JSON keeps it); the latency reference is Open MPI.
* **pycoll raw**: ``Library.all_reduce`` of the Cython bindings on raw addresses with the NULL
  stream (runs in the calling thread), N ranks started by ``pycoll-run``, host backend.
* **pycoll comm**: ``Communicator.all_reduce(send, recv)`` on numpy arrays in the same ranks.
* **pycoll window**: the same call on numpy arrays from a ``SymmetricPool`` (``ncclMemAlloc`` memory
  registered as a window, as NCCL's symmetric kernels want their buffers): from 32 KiB on, the host
  library then reduces straight from every rank's send buffer into every rank's receive buffer, with
  no staging in the segment -- the memory traffic of one copy per rank, which the copy bound counts.
* **Open MPI**: mpi4py ``Comm.Allreduce(send, recv)``, ``mpiexec --oversubscribe -n N``.
* **gloo**: ``torch.distributed.all_reduce`` (gloo, in place: torch has no out-of-place
  allreduce), ``torch.set_num_threads(1)``, N ranks started by ``pycoll-run``.

Every library runs the same loop (below, :func:`run_sizes`): for each size an untimed run whose
result is checked element by element, warm-up iterations, a barrier, then timed iterations with
the wall clock around each call; per iteration the slowest rank's time counts; the tables give
the median. algbw = size / time, busbw = algbw * 2(N-1)/N (nccl-tests), GB/s = 1e9 B/s. Ratios
are algbw ratios: above 1 means pycoll moved the data faster.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import signal
import socket
import subprocess
import sys
import time
from datetime import datetime, timezone
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
if HERE not in sys.path:  # also when loaded by file path, not run as a script
    sys.path.insert(0, HERE)
from _common import (  # noqa: E402
    MPI_MISSING,
    at_least,
    cache_line_round_trip,
    compile_c,
    env_with_pycoll,
    import_pycoll,
    mpiexec_command,
)

DEFAULT_SIZES = "8,64,512,4K,32K,256K,2M,16M,64M"
LIBS = ("copy", "pycoll", "mpi", "gloo")
_RESULT = "RESULT "
_NOTE = "NOTE "  # a line any rank may print: JSON the driver keeps beside the result ("notes")
BOUND_FROM = 256 << 10  # smallest size whose copy bound is shown in the tables
_UNITS = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30}


def parse_sizes(text: str) -> List[int]:
    """``"8,4K,64M"`` in bytes; a ValueError naming the item that is no positive whole size."""
    sizes = []
    for raw in text.split(","):
        item = raw.strip().upper().rstrip("B").rstrip("I")
        unit = item[-1] if item and item[-1] in "KMG" else ""
        try:
            size = int(item[: len(item) - len(unit)]) * _UNITS[unit]
        except ValueError:
            raise ValueError(f"--sizes: {raw.strip()!r} is no size (a whole number of bytes, K, M or G)") from None
        if size <= 0:
            raise ValueError(f"--sizes: {raw.strip()!r} is not a positive size")
        sizes.append(size)
    return sizes


def fmt_size(n: int) -> str:
    for unit, mult in (("G", 1 << 30), ("M", 1 << 20), ("K", 1 << 10)):
        if n >= mult and n % mult == 0:
            return f"{n // mult} {unit}iB"
    return f"{n} B"


#: The host library picks streaming or cached stores for outputs of 8 MiB and more (PYCOLL_HOST_STREAM_MIN
#: unset) by timing the first 6 operations of each size class in each process, alternately with each
#: (pycoll/_host/coll.c, STORE_TRIALS): half of those run with the slower stores (2-3x slower at 64 MiB).
STORE_TRIALS, STORE_MIN = 6, 8 << 20


def schedule(size: int, scale: float) -> Tuple[int, int]:
    """(warm-up, timed) iterations for a size; the same for every library. From ``STORE_MIN`` on, at least
    ``STORE_TRIALS`` warm-ups whatever the scale, so that the timed iterations see the host library's
    choice of stores rather than its trials (a one-time cost per process and size class, not the steady
    state a loop of collectives runs in)."""
    if size <= 64 << 10:
        warm, iters = 20, 300
    elif size <= 1 << 20:
        warm, iters = 10, 100
    elif size <= 16 << 20:
        warm, iters = 3, 20
    else:
        warm, iters = 2, 10
    warm = max(1, int(warm * scale))
    return (max(warm, STORE_TRIALS) if size >= STORE_MIN else warm), max(3, int(iters * scale))


# --------------------------------------------------------------------------------------------------
# the loop every library runs


def pattern(rank: int, count: int) -> np.ndarray:
    return (rank + 1 + np.arange(count) % 7).astype(np.float32)


def expected(nranks: int, count: int) -> np.ndarray:
    return (nranks * (nranks + 1) // 2 + nranks * (np.arange(count) % 7)).astype(np.float32)


def run_sizes(rank: int, nranks: int, sizes: Sequence[int], scale: float,
              variants: Sequence[Tuple[str, Callable[[int], Tuple[Callable[[], Any], Callable[[], int]]]]],
              barrier: Callable[[], Any], gather: Callable[[np.ndarray], Optional[np.ndarray]],
              batches: int = 0, rounds: int = 1, bandwidth: bool = True) -> Dict[str, list]:
    """Time every variant at every size. ``variants``: (name, setup(count) -> (call, check)).

    ``check()`` fills the inputs with :func:`pattern`, runs once and returns this rank's number of
    wrong output elements. ``gather(a)`` returns every rank's ``a`` stacked on rank 0 (None elsewhere).
    With ``batches``, the calls are also timed back to back: ``batches`` batches of a tenth of the
    timed iterations each, one clock read per batch; ``loop_us`` is the median over batches of the
    slowest rank's time per call. With ``rounds`` > 1 the variants of a size are interleaved: all are set
    up, checked and warmed first, then their timed iterations and batches run in ``rounds`` rounds, each
    variant's share of a round in turn, so that the machine's drift during a run hits every variant alike
    (with 1, each variant runs whole before the next is set up: one variant's buffers at a time).
    ``bandwidth``: the rows carry an allreduce's algbw and busbw of the size (callers timing other operations
    pass False and say what their sizes move themselves).
    """
    out: Dict[str, list] = {name: [] for name, _ in variants}
    clock = time.perf_counter_ns
    for size in sizes:
        warm, iters = schedule(size, scale)
        count = max(1, size // 4)
        per_batch = max(1, iters // 10)
        parts = max(1, min(rounds, iters, batches or iters))
        for together in ([list(variants)] if parts > 1 else [[v] for v in variants]):
            staged = []
            for name, setup in together:
                call, check = setup(count)
                ts = np.empty(iters + 1 + batches)
                ts[iters] = check()
                for _ in range(warm):
                    call()
                staged.append((name, call, ts))
            for part in range(parts):
                lo, hi = iters * part // parts, iters * (part + 1) // parts
                blo, bhi = batches * part // parts, batches * (part + 1) // parts
                for _, call, ts in staged:
                    barrier()
                    for i in range(lo, hi):
                        t0 = clock()
                        call()
                        ts[i] = clock() - t0
                    if bhi > blo:
                        barrier()
                    for i in range(blo, bhi):
                        t0 = clock()
                        for _ in range(per_batch):
                            call()
                        ts[iters + 1 + i] = (clock() - t0) / per_batch
            for name, _, ts in staged:
                table = gather(ts)
                if table is not None:
                    per_iter = table[:, :iters].max(axis=0) / 1e3
                    med = float(np.median(per_iter))
                    out[name].append({
                        "size": count * 4, "iters": iters, "time_us": med,
                        "time_us_p90": float(np.percentile(per_iter, 90)), "wrong": int(table[:, iters].sum()),
                    })
                    if bandwidth:
                        alg = count * 4 / (med * 1e-6) / 1e9
                        out[name][-1].update(algbw=alg, busbw=alg * 2 * (nranks - 1) / nranks)
                    if batches:
                        out[name][-1]["loop_us"] = float(np.median(table[:, iters + 1:].max(axis=0))) / 1e3
    return out


def _numpy_check(send: np.ndarray, recv: np.ndarray, rank: int, nranks: int, run: Callable[[], Any]) -> int:
    send[:] = pattern(rank, send.size)
    recv[:] = 0
    run()
    return int(np.count_nonzero(recv != expected(nranks, recv.size)))


# --------------------------------------------------------------------------------------------------
# workers (each runs as one rank)


def worker_pycoll(args: argparse.Namespace) -> None:
    import_pycoll()
    import pycoll

    comm = pycoll.init(backend="host", timeout=120, name="compare")
    rank, n = comm.rank, comm.size
    lib, h = comm.library, comm.handle

    def raw(count: int):
        send, recv = np.zeros(count, np.float32), np.zeros(count, np.float32)
        sp, rp = send.ctypes.data, recv.ctypes.data
        call = lambda: lib.all_reduce(sp, rp, count, 7, 0, h, 0)  # noqa: E731
        return call, lambda: _numpy_check(send, recv, rank, n, call)

    def method(count: int):
        send, recv = np.zeros(count, np.float32), np.zeros(count, np.float32)
        call = lambda: comm.all_reduce(send, recv)  # noqa: E731
        return call, lambda: _numpy_check(send, recv, rank, n, call)

    sizes = parse_sizes(args.sizes)
    pool = pycoll.SymmetricPool(comm, 2 * max(max(sizes), 4) + 1024)

    def window(count: int):
        send, recv = pool.empty(count, "float32"), pool.empty(count, "float32")
        call = lambda: comm.all_reduce(send, recv)  # noqa: E731
        return call, lambda: _numpy_check(send, recv, rank, n, call)

    def gather(ts: np.ndarray) -> Optional[np.ndarray]:
        everyone = np.empty(ts.size * n)
        comm.all_gather(ts, everyone)
        return everyone.reshape(n, ts.size) if rank == 0 else None

    rows = run_sizes(rank, n, sizes, args.scale,
                     [("pycoll_raw", raw), ("pycoll_comm", method), ("pycoll_window", window)], comm.barrier, gather)
    pool.close()
    if rank == 0:
        hv = lib.host_version()
        label = f"pycoll {pycoll.__version__} (host library {hv // 10000}.{hv // 100 % 100}.{hv % 100})"
        print(_RESULT + json.dumps({"label": label, "rows": rows}), flush=True)
    comm.barrier()
    try:
        comm.destroy()
    except pycoll.PycollError as exc:  # teardown only; the results are out
        print(f"teardown: {exc}", file=sys.stderr)
        comm.abort()


def worker_mpi(args: argparse.Namespace) -> None:
    from mpi4py import MPI

    comm = MPI.COMM_WORLD
    rank, n = comm.Get_rank(), comm.Get_size()

    def allreduce(count: int):
        send, recv = np.zeros(count, np.float32), np.zeros(count, np.float32)
        call = lambda: comm.Allreduce(send, recv, op=MPI.SUM)  # noqa: E731
        return call, lambda: _numpy_check(send, recv, rank, n, call)

    def gather(ts: np.ndarray) -> Optional[np.ndarray]:
        everyone = comm.gather(ts, root=0)
        return np.stack(everyone) if rank == 0 else None

    rows = run_sizes(rank, n, parse_sizes(args.sizes), args.scale, [("mpi", allreduce)], comm.Barrier, gather)
    if rank == 0:
        label = MPI.Get_library_version().splitlines()[0].strip()
        label = " ".join(label.replace(",", " ").split()[:3])
        print(_RESULT + json.dumps({"label": f"{label} (mpi4py)", "rows": rows}), flush=True)


def worker_gloo(args: argparse.Namespace) -> None:
    import torch
    import torch.distributed as dist

    import_pycoll()
    from pycoll import env

    info = env.discover()
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{args.port}", rank=info.rank,
                            world_size=info.world_size)
    rank, n = info.rank, info.world_size

    def allreduce(count: int):
        t = torch.zeros(count, dtype=torch.float32)
        call = lambda: dist.all_reduce(t)  # noqa: E731

        def check() -> int:
            t.copy_(torch.from_numpy(pattern(rank, count)))
            call()
            wrong = int(np.count_nonzero(t.numpy() != expected(n, count)))
            t.zero_()  # the timed runs reduce zeros in place, not ever-growing values
            return wrong

        return call, check

    def gather(ts: np.ndarray) -> Optional[np.ndarray]:
        everyone: List[Any] = [None] * n
        dist.all_gather_object(everyone, ts.tolist())
        return np.array(everyone) if rank == 0 else None

    rows = run_sizes(rank, n, parse_sizes(args.sizes), args.scale, [("gloo", allreduce)], dist.barrier, gather)
    if rank == 0:
        print(_RESULT + json.dumps({"label": f"torch {torch.__version__} gloo", "rows": rows}), flush=True)
    dist.destroy_process_group()


COPY_C = r"""
/* Copy routines for the copy bound; each returns 0, or -1 when this CPU cannot run it. */
#include <immintrin.h>
#include <stdint.h>
#include <string.h>

int copy_memcpy(void* d, const void* s, size_t n) { memcpy(d, s, n); return 0; }

__attribute__((target("avx2"))) static void avx2(char* d, const char* s, size_t n, int nt) {
  size_t i = 0;
  while (i < n && ((uintptr_t)(d + i) & 31)) { d[i] = s[i]; i++; }
  for (; i + 128 <= n; i += 128) {
    __m256i a = _mm256_loadu_si256((const __m256i*)(s + i));
    __m256i b = _mm256_loadu_si256((const __m256i*)(s + i + 32));
    __m256i c = _mm256_loadu_si256((const __m256i*)(s + i + 64));
    __m256i e = _mm256_loadu_si256((const __m256i*)(s + i + 96));
    if (nt) {
      _mm256_stream_si256((__m256i*)(d + i), a); _mm256_stream_si256((__m256i*)(d + i + 32), b);
      _mm256_stream_si256((__m256i*)(d + i + 64), c); _mm256_stream_si256((__m256i*)(d + i + 96), e);
    } else {
      _mm256_store_si256((__m256i*)(d + i), a); _mm256_store_si256((__m256i*)(d + i + 32), b);
      _mm256_store_si256((__m256i*)(d + i + 64), c); _mm256_store_si256((__m256i*)(d + i + 96), e);
    }
  }
  if (nt) _mm_sfence();
  if (i < n) memcpy(d + i, s + i, n - i);
}

int copy_avx2(void* d, const void* s, size_t n) {
  if (!__builtin_cpu_supports("avx2")) return -1;
  avx2(d, s, n, 0);
  return 0;
}

int copy_avx2_stream(void* d, const void* s, size_t n) {
  if (!__builtin_cpu_supports("avx2")) return -1;
  avx2(d, s, n, 1);
  return 0;
}
"""
COPY_METHODS = ("numpy.copyto", "memcpy", "avx2", "avx2_stream")


def compile_copies(workdir: str) -> Optional[str]:
    """Build the C copy routines as a shared library; None without a C compiler."""
    try:
        return compile_c(COPY_C, os.path.join(workdir, "libcopies.so"), "-shared", "-fPIC")
    except (OSError, subprocess.SubprocessError):
        return None


def _copy_proc(rank: int, sizes: List[int], scale: float, libpath: Optional[str], barrier: Any, queue: Any) -> None:
    import ctypes

    biggest = max(max(sizes), 64)  # the probe below copies 64 bytes (a latency run's sizes may all be smaller)
    src = np.ones(biggest, np.uint8)
    dst = np.zeros(biggest, np.uint8)
    fns: Dict[str, Callable[[np.ndarray, np.ndarray], Any]] = {"numpy.copyto": np.copyto}
    if libpath is not None:
        lib = ctypes.CDLL(libpath)
        for name in COPY_METHODS[1:]:
            fn = getattr(lib, "copy_" + name)
            fn.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t]
            if fn(dst.ctypes.data, src.ctypes.data, 64) == 0:  # this CPU can run it
                fns[name] = (lambda f: lambda d, s: f(d.ctypes.data, s.ctypes.data, d.size))(fn)
    clock = time.perf_counter_ns
    result: Dict[str, Dict[int, List[float]]] = {}
    for name, fn in fns.items():
        result[name] = {}
        for size in sizes:
            warm, iters = schedule(size, scale)
            s, d = src[:size], dst[:size]
            for _ in range(warm):
                fn(d, s)
            barrier.wait()
            ts = np.empty(iters)
            for i in range(iters):
                t0 = clock()
                fn(d, s)
                ts[i] = clock() - t0
            result[name][size] = ts.tolist()
    queue.put((rank, result))


def copy_bound(nranks: int, sizes: List[int], scale: float, timeout: float) -> Dict[str, Any]:
    import multiprocessing as mp
    import tempfile

    ctx = mp.get_context("spawn")
    barrier, queue = ctx.Barrier(nranks), ctx.Queue()
    with tempfile.TemporaryDirectory(prefix="pycoll-copies-") as tmp:
        libpath = compile_copies(tmp)
        procs = [ctx.Process(target=_copy_proc, args=(r, sizes, scale, libpath, barrier, queue), daemon=True)
                 for r in range(nranks)]
        for p in procs:
            p.start()
        try:
            got = dict(queue.get(timeout=timeout) for _ in procs)
        finally:
            for p in procs:
                p.join(5)
                if p.is_alive():
                    p.kill()
                    p.join()
    rows = []
    for size in sizes:
        per_method = {}
        for name in got[0]:
            per_iter = np.max(np.array([got[r][name][size] for r in range(nranks)]), axis=0) / 1e3
            per_method[name] = float(np.median(per_iter))
        best = min(per_method, key=per_method.get)
        t_copy = per_method[best]
        rows.append({"size": size, "copy_us": t_copy, "copy_GBps": size / (t_copy * 1e3), "method": best,
                     "copy_us_by_method": per_method, "algbw": size / (t_copy * 1e3)})
    methods = ", ".join(got[0])
    return {"label": f"fastest concurrent copy x{nranks} of: {methods}", "rows": rows}


# --------------------------------------------------------------------------------------------------
# the driver


def _run(cmd: List[str], env: Dict[str, str], timeout: float, what: str) -> Dict[str, Any]:
    proc = subprocess.Popen(cmd, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)
    try:
        stdout, stderr = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        _stop(proc)
        return {"error": f"{what}: no result within {timeout:.0f} s"}
    except BaseException:  # Ctrl-C: the launcher is told, not killed (below)
        _stop(proc)
        raise
    notes = [json.loads(line[len(_NOTE):]) for line in stdout.splitlines() if line.startswith(_NOTE)]
    for line in stdout.splitlines():
        if line.startswith(_RESULT):
            return {**json.loads(line[len(_RESULT):]), **({"notes": notes} if notes else {})}
    return {"error": f"{what} failed (exit {proc.returncode}): " + _what_it_said(stderr or stdout)}


def _stop(proc: subprocess.Popen[str]) -> None:
    """End a launcher (mpiexec, pycoll-run) as a terminal's Ctrl-C would: SIGINT, then SIGTERM, each given 5 s, and
    only then SIGKILL -- killed at once, mpiexec left its ranks' shared-memory segments in /dev/shm."""
    for sig in (signal.SIGINT, signal.SIGTERM):
        if proc.poll() is not None:
            break
        proc.send_signal(sig)
        try:
            proc.communicate(timeout=5)
            return
        except subprocess.TimeoutExpired:
            continue
    if proc.poll() is None:
        proc.kill()
    proc.communicate()


def _what_it_said(text: str, lines: int = 25) -> str:
    """The end of a failed run's output, one line: a rank's traceback, where there is one, from its start (a
    launcher such as mpiexec prints its own banner after the ranks' output), else the last ``lines`` lines."""
    out = [ln for ln in text.strip().splitlines() if ln.strip()]
    start = max((i for i, ln in enumerate(out) if ln.startswith("Traceback")), default=max(0, len(out) - lines))
    return " | ".join(out[start:start + lines])


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_library(lib: str, nranks: int, a: argparse.Namespace) -> Dict[str, Any]:
    script = os.path.abspath(__file__)
    me = [script]  # pycoll-run runs a script with this interpreter
    common = ["--sizes", a.sizes, "--scale", str(a.scale)]
    env = env_with_pycoll()
    launcher = [sys.executable, "-m", "pycoll.run", "-n", str(nranks), "--no-prefix", "--timeout", str(a.timeout)]
    if lib == "copy":
        try:
            return copy_bound(nranks, parse_sizes(a.sizes), a.scale, a.timeout)
        except Exception as exc:
            return {"error": f"copy bound failed: {exc!r}"}
    if lib == "pycoll":
        return _run(launcher + me + ["--worker", "pycoll"] + common, env, a.timeout + 10, "pycoll")
    if lib == "gloo":
        return _run(launcher + me + ["--worker", "gloo", "--port", str(_free_port())] + common, env,
                    a.timeout + 10, "gloo")
    cmd = mpiexec_command(nranks, [script, "--worker", "mpi", *common], env)
    if cmd is None:
        return {"error": MPI_MISSING}
    return _run(cmd, env, a.timeout, "Open MPI")


def combine(runs: List[Dict[str, Any]]) -> Dict[str, Any]:
    """Several runs of one library -> one result: per size, the median over runs of each run's median.

    The per-run times stay in ``time_us_runs``; wrong counts add up.
    """
    ok = [r for r in runs if "error" not in r]
    if not ok:
        return runs[-1]

    def merge(tables: List[List[Dict[str, Any]]]) -> List[Dict[str, Any]]:
        out = []
        for cells in zip(*tables, strict=False):
            row = dict(cells[0])
            if "time_us" in row:
                times = [c["time_us"] for c in cells]
                med = float(np.median(times))
                row.update(time_us=med, time_us_runs=times, wrong=sum(c["wrong"] for c in cells))
                if "algbw" in row:
                    row["algbw"] = row["size"] / (med * 1e3)
                    row["busbw"] = row["algbw"] * cells[0]["busbw"] / cells[0]["algbw"]
            else:  # copy bound
                t = float(np.median([c["copy_us"] for c in cells]))
                row.update(copy_us=t, copy_us_runs=[c["copy_us"] for c in cells], copy_GBps=row["size"] / (t * 1e3),
                           algbw=row["size"] / (t * 1e3), method_runs=[c["method"] for c in cells])
            out.append(row)
        return out

    first = ok[0]
    rows = first["rows"]
    merged = ({k: merge([r["rows"][k] for r in ok]) for k in rows} if isinstance(rows, dict)
              else merge([r["rows"] for r in ok]))
    return {"label": first["label"], "rows": merged, "runs": len(ok),
            "errors": [r["error"] for r in runs if "error" in r]}


def short_runs(res: Dict[str, Dict[str, Any]], repeat: int) -> str:
    """What the tables' "median of K runs" must take back: the libraries of which fewer runs succeeded."""
    short = [f"{lib} {r.get('runs', 0)} of {repeat}" for lib, r in res.items() if r.get("runs", 0) < max(1, repeat)]
    return "medians of fewer runs (the others failed, above): " + ", ".join(short) if short else ""


def wrong_results(res: Dict[str, Dict[str, Any]]) -> int:
    """Wrong output elements over every library, variant and size of one rank count."""
    total = 0
    for r in res.values():
        rows = r.get("rows", [])
        for row in (x for v in rows.values() for x in v) if isinstance(rows, dict) else rows:
            total += int(row.get("wrong", 0))
    return total


def _rows_by_size(result: Dict[str, Any], key: Optional[str] = None) -> Dict[int, Dict[str, Any]]:
    rows = result.get("rows", [])
    if isinstance(rows, dict):
        rows = rows.get(key, [])
    return {r["size"]: r for r in rows}


def _ratio(a: Optional[float], b: Optional[float]) -> str:
    return f"{a / b:.2f}x" if a and b else "-"


def build_table(nranks: int, res: Dict[str, Dict[str, Any]], sizes: List[int]) -> Tuple[List[str], List[List[str]]]:
    raw = _rows_by_size(res.get("pycoll", {}), "pycoll_raw")
    meth = _rows_by_size(res.get("pycoll", {}), "pycoll_comm")
    win = _rows_by_size(res.get("pycoll", {}), "pycoll_window")
    mpi = _rows_by_size(res.get("mpi", {}), "mpi")
    gloo = _rows_by_size(res.get("gloo", {}), "gloo")
    copy = _rows_by_size(res.get("copy", {}))
    head = ["size", "pycoll raw us", "algbw", "busbw", "pycoll comm us", "algbw", "pycoll window us", "algbw",
            "Open MPI us", "algbw", "busbw", "gloo us", "algbw", "copy bound algbw", "raw/OMPI", "comm/OMPI",
            "window/OMPI", "raw/gloo", "raw/bound", "window/bound"]
    body = []
    for s in sizes:
        count_bytes = max(4, s // 4 * 4)
        r, m, w, o, g, c = (t.get(count_bytes) for t in (raw, meth, win, mpi, gloo, copy))
        if count_bytes < BOUND_FROM:
            c = None  # the copy bound is numpy's call overhead there, not a bound (kept in the JSON)

        def t(x: Optional[Dict[str, Any]]) -> str:
            if x is None:
                return "-"
            flag = "" if x.get("wrong", 0) == 0 else f" ({x['wrong']} WRONG)"
            return f"{x['time_us']:.2f}{flag}"

        def bw(x: Optional[Dict[str, Any]], k: str = "algbw") -> str:
            return "-" if x is None else f"{x[k]:.3g}"

        body.append([
            fmt_size(count_bytes), t(r), bw(r), bw(r, "busbw"), t(m), bw(m), t(w), bw(w), t(o), bw(o), bw(o, "busbw"),
            t(g), bw(g), bw(c), _ratio(r and r["algbw"], o and o["algbw"]), _ratio(m and m["algbw"], o and o["algbw"]),
            _ratio(w and w["algbw"], o and o["algbw"]), _ratio(r and r["algbw"], g and g["algbw"]),
            _ratio(r and r["algbw"], c and c["algbw"]), _ratio(w and w["algbw"], c and c["algbw"]),
        ])
    return head, body


def _runs(row: Dict[str, Any], key: str = "time_us") -> List[float]:
    """Per-run times (us) of a combined row, or its one time."""
    return list(row.get(key + "_runs") or [row[key]])


def _spread(row: Dict[str, Any], key: str = "time_us") -> str:
    bws = sorted(row["size"] / (t * 1e3) for t in _runs(row, key))
    return f"{bws[0]:.3g}-{bws[-1]:.3g}" if len(bws) > 1 else f"{bws[0]:.3g}"


def targets(nranks: int, res: Dict[str, Dict[str, Any]], sizes: List[int]) -> List[str]:
    """The project's targets, met or not; with several runs, the per-run spread of each algbw
    (GB/s) and the median of the per-run ratios (runs are interleaved, so run k of each library
    ran at about the same time)."""
    raw = _rows_by_size(res.get("pycoll", {}), "pycoll_raw")
    meth = _rows_by_size(res.get("pycoll", {}), "pycoll_comm")
    win = _rows_by_size(res.get("pycoll", {}), "pycoll_window")
    mpi = _rows_by_size(res.get("mpi", {}), "mpi")
    copy = _rows_by_size(res.get("copy", {}))
    lines = []
    big, small = 64 << 20, 8

    def paired(a: Dict[str, Any], akey: str, b: Dict[str, Any], bkey: str) -> str:
        ta, tb = _runs(a, akey), _runs(b, bkey)
        if len(ta) < 2 or len(ta) != len(tb):
            return ""
        return (f"; per run {_spread(a, akey)} vs {_spread(b, bkey)} GB/s, median per-run ratio "
                f"{float(np.median([y / x for x, y in zip(ta, tb, strict=False)])):.2f}")

    if big in raw and big in mpi:
        x = raw[big]["algbw"] / mpi[big]["algbw"]
        lines.append(f"{nranks} ranks, 64 MiB: pycoll algbw {raw[big]['algbw']:.3g} GB/s = {x:.2f}x Open MPI's "
                     f"(target >= 1.5x: {'met' if x >= 1.5 else 'NOT met'})"
                     f"{paired(raw[big], 'time_us', mpi[big], 'time_us')}")
    for name, table in (("private buffers, bindings", raw), ("window buffers, Communicator", win)):
        if big in table and big in copy:
            x = table[big]["algbw"] / copy[big]["algbw"]
            lines.append(f"{nranks} ranks, 64 MiB: pycoll ({name}) algbw = {100 * x:.0f}% of the copy bound "
                         f"{copy[big]['algbw']:.3g} GB/s (target >= 80%: {'met' if x >= 0.8 else 'NOT met'})"
                         f"{paired(table[big], 'time_us', copy[big], 'copy_us')}")
    for name, table in (("bindings", raw), ("Communicator", meth)):
        if small in table and small in mpi:
            a, b = table[small]["time_us"], mpi[small]["time_us"]
            ra, rb = sorted(_runs(table[small])), sorted(_runs(mpi[small]))
            spread = f"; per run {ra[0]:.3g}-{ra[-1]:.3g} vs {rb[0]:.3g}-{rb[-1]:.3g} us" if len(ra) > 1 else ""
            lines.append(f"{nranks} ranks, 8 B: pycoll ({name}) {a:.2f} us vs Open MPI {b:.2f} us "
                         f"(target: no higher: {'met' if a <= b else 'NOT met'}){spread}")
    return lines


def markdown(head: List[str], body: List[List[str]]) -> str:
    lines = ["| " + " | ".join(head) + " |", "|" + "|".join("---:" for _ in head) + "|"]
    lines += ["| " + " | ".join(row) + " |" for row in body]
    return "\n".join(lines)


def plain(head: List[str], body: List[List[str]]) -> str:
    widths = [max(len(h), *(len(r[i]) for r in body)) if body else len(h) for i, h in enumerate(head)]
    fmt = lambda row: "  ".join(c.rjust(w) for c, w in zip(row, widths, strict=False))  # noqa: E731
    return "\n".join([fmt(head)] + [fmt(r) for r in body])


def main(argv: Optional[Sequence[str]] = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--ranks", type=at_least(1), nargs="+", default=[2, 4], help="rank counts (default 2 4)")
    p.add_argument("--sizes", default=DEFAULT_SIZES, help=f"comma-separated sizes (default {DEFAULT_SIZES})")
    p.add_argument("--scale", type=float, default=1.0, help="multiply every iteration count (default 1)")
    p.add_argument("--only", default=",".join(LIBS), help=f"subset of {','.join(LIBS)}")
    p.add_argument("--repeat", type=at_least(1), default=1,
                   help="run every library this many times, interleaved; report the median of the runs' medians")
    p.add_argument("--timeout", type=float, default=300.0, help="seconds per library and rank count (default 300)")
    p.add_argument("--json", help="write every measurement to this JSON file")
    p.add_argument("--markdown", help="write the tables as markdown to this file")
    p.add_argument("--worker", choices=("pycoll", "mpi", "gloo"), help=argparse.SUPPRESS)
    p.add_argument("--port", type=int, help=argparse.SUPPRESS)
    a = p.parse_args(argv)
    if a.worker:
        {"pycoll": worker_pycoll, "mpi": worker_mpi, "gloo": worker_gloo}[a.worker](a)
        return 0
    libs = [x.strip() for x in a.only.split(",") if x.strip()]
    unknown = set(libs) - set(LIBS)
    if unknown:
        p.error(f"unknown --only entries {sorted(unknown)}; choose from {LIBS}")
    try:
        sizes = parse_sizes(a.sizes)
    except ValueError as e:
        p.error(str(e))
    started = datetime.now(timezone.utc).isoformat(timespec="seconds")
    load0 = os.getloadavg()
    doc: Dict[str, Any] = {"started": started, "host": platform.node(), "cpus": os.cpu_count(),
                           "python": platform.python_version(), "loadavg_before": load0, "sizes": sizes,
                           "scale": a.scale, "repeat": a.repeat, "results": {}}
    print(f"# allreduce float32 sum -- {started}, {os.cpu_count()} CPUs, load average before: "
          f"{' '.join(f'{x:.2f}' for x in load0)}")
    print("# time: median over iterations of the slowest rank's wall-clock time per call (us)"
          + (f", median of {a.repeat} interleaved runs" if a.repeat > 1 else "")
          + "; algbw/busbw in GB/s; ratios are algbw ratios (> 1: pycoll faster)")
    md: List[str] = []
    wrong = 0
    for n in a.ranks:
        runs: Dict[str, List[Dict[str, Any]]] = {lib: [] for lib in libs}
        seconds: Dict[str, float] = dict.fromkeys(libs, 0.0)
        trips: List[str] = []
        for _ in range(max(1, a.repeat)):
            for lib in libs:
                trip = cache_line_round_trip()
                if trip:
                    trips.append(f"{trip.split()[0]} before {lib}")
                t0 = time.monotonic()
                one = run_library(lib, n, a)
                seconds[lib] += time.monotonic() - t0
                if "error" in one:
                    print(f"# {n} ranks, {lib}: {one['error']}", file=sys.stderr)
                runs[lib].append(one)
        res: Dict[str, Dict[str, Any]] = {}
        for lib in libs:
            res[lib] = combine(runs[lib])
            res[lib]["seconds"] = round(seconds[lib], 1)
        doc["results"][str(n)] = res
        head, body = build_table(n, res, sizes)
        labels = "; ".join(f"{k}: {v['label']}" for k, v in res.items() if "label" in v)
        print(f"\n## {n} ranks ({labels})")
        print(plain(head, body))
        for line in targets(n, res, sizes):
            print("# " + line)
        if short_runs(res, a.repeat):
            print("# " + short_runs(res, a.repeat))
        wrong += wrong_results(res)
        if trips:
            print(f"# cross-CPU cache-line round trip (ns) before each run: {', '.join(trips)}")
        md += [f"### {n} ranks", "", f"{labels}", "", markdown(head, body), ""]
        md += [f"- {line}" for line in targets(n, res, sizes)] + [""]
    load1 = os.getloadavg()
    doc["loadavg_after"] = load1
    print(f"\n# load average after: {' '.join(f'{x:.2f}' for x in load1)}")
    if a.json:
        with open(a.json, "w") as f:
            json.dump(doc, f, indent=2)
    if a.markdown:
        with open(a.markdown, "w") as f:
            f.write(f"Measured {started} on {os.cpu_count()} CPUs; load average before "
                    f"{' '.join(f'{x:.2f}' for x in load0)}, after {' '.join(f'{x:.2f}' for x in load1)}.\n\n")
            f.write("\n".join(md))
    if wrong:
        print(f"# PROBLEM: {wrong} wrong output elements (the cells marked WRONG)", file=sys.stderr)
    return 1 if wrong else 0


if __name__ == "__main__":
    sys.exit(main())
