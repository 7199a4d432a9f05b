"""pycoll-bench's command line: arguments, one rank's run, starting the ranks, ``main``."""

from __future__ import annotations

import argparse
import importlib.util
import json
import logging
import os
import platform
import socket
import subprocess
import sys
import threading
import traceback
from datetime import datetime, timezone
from typing import Any, Dict, List, Optional, Sequence, Tuple, cast

import numpy as np

from ... import _dtypes, _settings
from ...devices import auto_backend
from ...errors import RankDiscoveryError
from ...launch import discovery
from .. import unwritable
from .arrays import _ArrayLib, _make_kit, _TorchKit, array_refusal
from .cases import build_case
from .report import _dispatch, _EventReporter, _Reporter, _TableReporter
from .runner import _Runner, measure
from .spec import (
    _DTYPE_ALIASES,
    _EVENT_MARK,
    COLLECTIVES,
    DTYPES,
    EXIT_FAILED,
    EXIT_OK,
    EXIT_USAGE,
    EXIT_WRONG,
    MODES,
    REDOPS,
    _collectives,
    _element_count,
    _pick,
    _size_arg,
    _size_plan,
    format_size,
    parse_size,
    size_steps,
)

_log = logging.getLogger("pycoll.bench")


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="pycoll-bench",
        description="Benchmark pycoll collectives and print nccl-tests' table; every result is checked. "
                    "See `pydoc pycoll.tools.bench` for the definitions of size, time, algbw and busbw.",
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
    p.add_argument("-r", "--root", type=int, default=0,
                   help="root rank of broadcast, reduce, gather, scatter (default 0)")
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
                   help="host backend: queue the ops on a host stream and time them with events "
                        "(GPU backends always do)")
    p.add_argument("--json", metavar="FILE", help="write every result as JSON ('-': to stdout instead of the table)")
    p.add_argument("--csv", metavar="FILE", help="write every result as CSV ('-': to stdout instead of the table)")
    p.add_argument("--plot", metavar="PNG",
                   help="write a plot of time and bus bandwidth against size (needs matplotlib)")
    prog = p.add_mutually_exclusive_group()
    prog.add_argument("--progress", dest="progress", action="store_true", default=None,
                      help="show progress on stderr (default: when stderr is a terminal)")
    prog.add_argument("--no-progress", dest="progress", action="store_false")
    p.add_argument("--op-timeout", type=float, default=60.0, metavar="SECONDS",
                   help="deadline of every operation and of initialisation (default 60)")
    p.add_argument("--timeout", type=float, default=None, metavar="SECONDS",
                   help="stop the whole run after this many seconds (exit status 3)")
    p.add_argument("--emit-events", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--debug-corrupt-rank", type=int, default=None, help=argparse.SUPPRESS)
    return p


_PLOT_FORMATS = {"png", "pdf", "svg", "svgz", "jpg", "jpeg", "eps", "ps", "tif", "tiff", "webp", "pgf"}  # matplotlib's


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
    for opt, value in (("--op-timeout", a.op_timeout), ("--timeout", a.timeout)):
        try:  # pycoll's rule for every duration: finite, > 0, at most 1e9 s (inf overflowed a timer's thread)
            if value is not None:
                _settings.seconds(value, opt)
        except ValueError as exc:
            p.error(str(exc))
    if a.modes is None:
        a.modes = MODES
    if a.modes == ("in-place",):
        without = [c for c in a.collective if not COLLECTIVES[c].in_place]
        if len(without) == len(a.collective):
            p.error(f"--in-place: {', '.join(without)} has no in-place variant: nothing to run")
    if a.json and a.csv and a.json == "-" and a.csv == "-":
        p.error("--json - and --csv - cannot both go to stdout")
    if a.plot == "-":
        p.error("--plot needs a file name ('-', standard output, is for --json and --csv)")
    if a.plot and os.path.splitext(a.plot)[1].lower().lstrip(".") not in _PLOT_FORMATS:
        p.error(f"--plot {a.plot}: the file name must end in one of "
                f"{', '.join('.' + f for f in sorted(_PLOT_FORMATS))}")
    # found now, not once every size has run (the results would be lost)
    for flag, path in (("--json", a.json), ("--csv", a.csv), ("--plot", a.plot)):
        why = unwritable(path) if path and path != "-" else None
        if why:
            p.error(f"{flag} {path}: {why}")
    backend = a.backend if a.backend != "auto" else auto_backend()
    why = array_refusal(a.array, backend)
    if why:
        p.error(why)
    # what would fail only once the run reached it (the results before it lost)
    if a.plot and importlib.util.find_spec("matplotlib") is None:
        p.error(f"--plot {a.plot} needs matplotlib (pip install matplotlib)")
    if backend == "host" and a.array in ("auto", "numpy") and importlib.util.find_spec("ml_dtypes") is None:
        need = [d for d in a.datatype if _dtypes.BY_CODE[DTYPES[d].nccl].ml_dtypes]
        if need:
            p.error(f"{', '.join(need)} with numpy arrays need the ml_dtypes package (pip install ml_dtypes), or "
                    f"--array torch")


def _rank_meta(comm: Any, kit: _ArrayLib) -> Dict[str, Any]:
    dev = comm.device
    label = "host" if dev.kind == "host" else f"{dev.kind}:{dev.device_id}"
    if dev.kind != "host" and kit.name == "torch":
        try:
            label += " " + cast(_TorchKit, kit).torch.cuda.get_device_name(dev.device_id)
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
    deadline = _deadline(comm, a.timeout)
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
                        # nccl-tests' count column: the count argument, a rank's block for the blocks collectives
                        "collective": coll, "size": count * dt.itemsize,
                        "count": count // n if spec.blocks else count, "type": dt.name,
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
        if deadline is not None:
            deadline.cancel()
        if runner is not None:
            runner.close()
        _teardown(comm, clean=status != EXIT_FAILED)
    return status


def _deadline(comm: Any, seconds: Optional[float]) -> Optional[threading.Timer]:
    """``--timeout`` in a rank's own process (one rank, or ranks another launcher started; pycoll-run enforces it
    for the ranks pycoll-bench starts): once it passes, the communicator is aborted, so that the rank's operation
    raises and the run ends with status 3."""
    if not seconds:
        return None

    def expire() -> None:
        sys.stderr.write(f"pycoll-bench: rank {comm.rank}: --timeout {seconds:g} s passed; stopping the run\n")
        comm.abort()

    timer = threading.Timer(seconds, expire)
    timer.daemon = True
    timer.start()
    return timer


def _teardown(comm: Any, clean: bool) -> None:
    """Destroy the communicator; a failure after the results are complete is a warning, not a failure."""
    from ...errors import PycollError

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
    cmd += ["-m", "pycoll.tools.bench", *argv, "--emit-events"]
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
    try:
        info = discovery.discover()
    except RankDiscoveryError as exc:
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
            sys.stdout = open(os.devnull, "w")  # noqa: SIM115 -- stdout for the rest of the process
        except OSError:
            pass
        return EXIT_FAILED
    except Exception as exc:
        from ...errors import PycollError

        if not isinstance(exc, (PycollError, RuntimeError, ValueError, TimeoutError, ImportError, OSError,
                                MemoryError)):
            traceback.print_exc()  # a defect: its traceback, but the run's status all the same (1 is wrong values)
        sys.stderr.write(f"pycoll-bench: rank {info.rank}: {type(exc).__name__}: {exc}\n")
        return EXIT_FAILED
