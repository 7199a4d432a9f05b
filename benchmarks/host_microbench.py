"""Allreduce (float32, sum) latency and bandwidth of pycoll's host library, optionally side by side
with Open MPI (mpi4py) in the same run. For tuning the host library; not the comparison harness.

    python benchmarks/host_microbench.py -n 2 -n 4 [--mpi] [--bind] [--sizes 8,1M,64M]

Each size: warm-up, then back-to-back timed calls through the bindings with a NULL stream; the
time of an iteration is the max over ranks, the table shows the median (and p90). algbw is
bytes / time. A single-process memcpy of the largest size is printed as the copy reference.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import shutil
import subprocess
import sys
import time

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))

UNITS = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}


def parse_size(s: str) -> int:
    s = s.strip().upper().rstrip("B")
    return int(s[:-1]) * UNITS[s[-1]] if s[-1] in UNITS else int(s)


def iterations(size: int) -> int:
    if size <= 64 << 10:
        return 3000
    if size <= 1 << 20:
        return 300
    if size <= 8 << 20:
        return 40
    return 10


def timed_loop(call, size, sync):
    n_iter = iterations(size)
    for _ in range(max(3, n_iter // 10)):
        call()
    sync()
    ts = np.empty(n_iter)
    for i in range(n_iter):
        t = time.perf_counter()
        call()
        ts[i] = time.perf_counter() - t
    return ts


def host_rank(rank, n, uid_bytes, sizes, bind, out):
    if bind:
        os.environ["PYCOLL_HOST_BIND"] = "1"
    from pycoll._bindings import UniqueId, load

    lib = load("host")
    comm = lib.comm_init_rank(n, UniqueId(uid_bytes), rank)
    res = {}
    one = np.ones(1, np.float32)
    for size in sizes:
        count = max(1, size // 4)
        send = np.ones(count, np.float32)
        recv = np.empty_like(send)
        sp, rp = send.ctypes.data, recv.ctypes.data
        call = lambda sp=sp, rp=rp, count=count: lib.all_reduce(sp, rp, count, 7, 0, comm)  # noqa: E731
        sync = lambda: lib.all_reduce(one.ctypes.data, one.ctypes.data, 1, 7, 0, comm)  # noqa: E731
        res[size] = timed_loop(call, size, sync).tolist()
        assert np.all(recv == n), f"wrong all_reduce result at {size} B"
    lib.comm_destroy(comm)
    out.put((rank, res))


def run_host(n, sizes, bind):
    from pycoll._bindings import load

    lib = load("host")
    ctx = mp.get_context("fork")
    q = ctx.Queue()
    uid = bytes(lib.get_unique_id())
    procs = [ctx.Process(target=host_rank, args=(r, n, uid, sizes, bind, q)) for r in range(n)]
    for p in procs:
        p.start()
    per_rank = dict(q.get(timeout=900) for _ in procs)
    for p in procs:
        p.join(10)
    return {s: np.max(np.stack([per_rank[r][s] for r in range(n)]), axis=0) for s in sizes}


MPI_SCRIPT = r"""
import json, sys, time, numpy as np
from mpi4py import MPI
sys.path.insert(0, sys.argv[1])
from host_microbench import timed_loop
comm = MPI.COMM_WORLD
sizes = json.loads(sys.argv[2])
out = {}
for size in sizes:
    count = max(1, size // 4)
    s = np.ones(count, np.float32); r = np.empty_like(s)
    ts = timed_loop(lambda: comm.Allreduce(s, r), size, comm.Barrier)
    assert np.all(r == comm.Get_size()), f"wrong Allreduce result at {size} B"
    allts = comm.gather(ts, root=0)
    if comm.Get_rank() == 0:
        out[size] = np.max(np.stack(allts), axis=0).tolist()
if comm.Get_rank() == 0:
    print("RESULT " + json.dumps(out))
"""


def run_mpi(n, sizes):
    mpiexec = shutil.which("mpiexec", path=os.path.dirname(sys.executable))
    if not mpiexec:
        return None
    env = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")
    cmd = [mpiexec, "--oversubscribe", "-n", str(n), sys.executable, "-c", MPI_SCRIPT, HERE, json.dumps(sizes)]
    out = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=1800)
    for line in out.stdout.splitlines():
        if line.startswith("RESULT "):
            return {int(k): np.array(v) for k, v in json.loads(line[7:]).items()}
    sys.stderr.write(out.stderr[-2000:])
    return None


def memcpy_reference(size):
    a = np.ones(size // 4, np.float32)
    b = np.empty_like(a)
    ts = []
    for _ in range(7):
        t = time.perf_counter()
        np.copyto(b, a)
        ts.append(time.perf_counter() - t)
    return size / np.median(ts) / 1e9


def fmt(ts, size):
    med = float(np.median(ts))
    return f"{med * 1e6:10.1f} us {size / med / 1e9:7.3f} GB/s (p90 {np.percentile(ts, 90) * 1e6:.1f} us)"


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("-n", type=int, action="append", help="ranks (repeatable); default 2 and 4")
    ap.add_argument("--sizes", default="8,1K,32K,256K,4M,64M")
    ap.add_argument("--mpi", action="store_true", help="also run Open MPI (mpi4py) in the same run")
    ap.add_argument("--bind", action="store_true",
                    help="PYCOLL_HOST_BIND=1: rank r on CPU r mod ncpus (Open MPI runs here with --oversubscribe, "
                         "which leaves its ranks unbound)")
    args = ap.parse_args()
    sizes = [max(4, parse_size(s) // 4 * 4) for s in args.sizes.split(",")]  # whole float32 elements: what moves
    print(f"memcpy reference at {max(sizes)} B: {memcpy_reference(max(sizes)):.2f} GB/s (one process)")
    for n in args.n or [2, 4]:
        host = run_host(n, sizes, args.bind)
        mpi = run_mpi(n, sizes) if args.mpi else None
        if args.mpi and mpi is None:
            print(f"n={n}: Open MPI did not run (no mpiexec beside this Python, or it failed: above)", file=sys.stderr)
        for size in sizes:
            line = f"n={n} {size:>10} B  host {fmt(host[size], size)}"
            if mpi is not None:
                line += f"  |  mpi {fmt(mpi[size], size)}"
            print(line, flush=True)


if __name__ == "__main__":
    main()
