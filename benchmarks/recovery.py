"""Recovery latency after a failed rank: pycoll's elastic layer next to Open MPI ULFM, in one run.

Usage (from the repository root, pycoll built in place or installed)::

    python benchmarks/recovery.py                          # 4 ranks, 10 trials of each case
    python benchmarks/recovery.py --trials 20 --stop-timeout 0.5 --json out.json
    python benchmarks/recovery.py --cases pycoll-kill --trials 1 --env PYCOLL_FR_DUMP_JSON=0

Cases (each trial starts fresh processes; ``--ranks`` of them, default 4, host backend):

* ``pycoll-kill``: every rank forms an :class:`pycoll.elastic.ElasticGroup` and all-reduces 1024
  float32 in a loop. This driver process sends SIGKILL to one rank (the victim rotates over the
  ranks from trial to trial) at a random moment of the loop and takes the wall-clock time just
  before ``os.kill``. Each survivor catches the :class:`pycoll.CommFailure`, calls
  :meth:`~pycoll.elastic.ElasticGroup.reshape` (agreement through the store, revoke,
  ``ncclCommShrink(NCCL_SHRINK_ABORT)``), then all-reduces a buffer of ones on
  the new communicator and checks every element (== number of survivors). Latency: kill -> that
  allreduce completed and checked, on the slowest survivor.
* ``pycoll-stop``: the same, with SIGSTOP instead of SIGKILL and a communicator timeout of
  ``--stop-timeout`` T seconds (default 30, pycoll's default timeout): the survivors' watchdogs see
  the stopped process (its state in /proc, read every ``PYCOLL_WATCHDOG_LIVENESS_INTERVAL``) and
  fail the allreduce long before T (``PYCOLL_WATCHDOG_LIVENESS=0``: at T, then reported as T +
  overhead); reshape sees the stopped process as gone.
* ``mpi-kill``: Open MPI with ULFM (``mpiexec --with-ft ulfm --oversubscribe -n N``, mpi4py), the
  same loop with ``Comm.Allreduce`` and ``ERRORS_RETURN``; on ``MPI_ERR_PROC_FAILED`` (or
  ``MPI_ERR_REVOKED``, when a peer revoked first) each survivor calls ``Revoke()``, ``Shrink()``
  and an ``Allreduce`` of ones on the shrunk communicator, checked the same way, then
  ``os._exit(0)`` (Open MPI's teardown after a failure can hang).
* ``mpi-stop``: the ULFM case with SIGSTOP. Open MPI finds a process that exited (its daemon
  reaps it) but not a stopped one, unless its heartbeat failure detector is on (``mpi_ft_detector``,
  off by default): this case turns it on, with ``--mpi-detector-period`` and
  ``--mpi-detector-timeout`` (default: Open MPI's defaults, 3 s and 10 s).
* ``pycoll-kill-nofr``, ``pycoll-stop-nofr``: the pycoll cases with the flight recorder off
  (``PYCOLL_FR_BUFFER_SIZE=0``): what the recovery costs without the watchdog's flight-recorder
  dump on failure.

Before the fault every rank runs ``--warmup`` allreduces (default 2000: pycoll's flight-recorder
ring, 2000 entries by default, is full, as in a job that has run for a while). The watchdog dumps
that ring on every survivor when the communicator fails; the elastic layer holds the dumps (and the
failure report's store traffic) until the new communicator has completed its first operation, so
that they do not slow the recovery. The row "FR dump inside the total" is the time the slowest
survivor spent in dumps between the fault and its first correct allreduce (measured by wrapping the
recorder's ``dump``: 0 when the hold works); "FR dump after it" is the time its dumps took
afterwards (each survivor waits for them before reporting).

Phases (wall clock, ``time.time()``; one host, so every process reads the same clock), for the
slowest survivor of each trial:

================  ====================================================================================
detection         kill -> the survivor's communicator records the failure (pycoll: ``failed_at``;
                  Open MPI: the Allreduce returned the error)
to reshape        failure recorded -> ``reshape()`` starts (pycoll: the watchdog's failure report and
                  the revoke that unblocks the collective, the exception reaching the caller)
agreement         reshape starts -> survivors agreed (store round trips)
revoke            agreed -> the old communicator revoked (pycoll); ``Comm.Revoke()`` (Open MPI)
shrink            revoked -> the new communicator ready (``ncclCommShrink``; ``Comm.Shrink()``)
first allreduce   new communicator ready -> the first allreduce on it completed and checked
                  (pycoll: the new communicator's first collective; ``reshape()`` runs none)
total             kill -> first correct allreduce
================  ====================================================================================

Each cell: median over trials, with min, p90 (nearest rank) and max; the ratio columns divide
medians. Trials are interleaved: trial i of every case runs before trial i + 1 of any, so that a
change of the machine's load falls on every case alike. Every process started here is killed and
reaped whatever happens: hard deadlines, SIGCONT + SIGKILL of each rank by pid and of the
launcher's process group, ranks that die with the driver (``PR_SET_PDEATHSIG``; Open MPI's
ranks, children of mpiexec, look for the driver themselves).
Flight-recorder dumps go to a temporary folder that is removed (``--keep DIR`` keeps every trial's
logs and dumps), and shared-memory segments that appeared in /dev/shm during the run are reported.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from datetime import datetime, timezone
from typing import Any, Dict, List, Optional, Sequence, Tuple

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
if HERE not in sys.path:  # also when loaded by file path, not run as a script
    sys.path.insert(0, HERE)
from _common import MPI_MISSING, find_mpiexec, import_pycoll, pycoll_path  # noqa: E402

CASES = ("pycoll-kill", "pycoll-stop", "mpi-kill", "mpi-stop", "pycoll-kill-nofr", "pycoll-stop-nofr")
#: the ``-nofr`` variants: the flight recorder records nothing, so its dump on failure costs nothing
NOFR_ENV = {"PYCOLL_FR_BUFFER_SIZE": "0"}
PHASES = ("detection", "to_reshape", "agreement", "revoke", "shrink", "first_allreduce", "total")
PHASE_LABELS = {"detection": "detection", "to_reshape": "to reshape", "agreement": "agreement", "revoke": "revoke",
                "shrink": "shrink", "first_allreduce": "first allreduce", "total": "total",
                "fr_dump": "FR dump inside the total", "fr_dump_after": "FR dump after it"}
COUNT = 1024  # float32 elements per allreduce
TOKEN = "pycoll-recovery-bench"


# -- the ranks ---------------------------------------------------------------------------------------


def _write_json(path: str, obj: Dict[str, Any]) -> None:
    """Write atomically (the driver polls for the file)."""
    tmp = f"{path}.tmp{os.getpid()}"
    with open(tmp, "w") as f:
        json.dump(obj, f)
    os.replace(tmp, path)


def _die_with_parent(expected_parent: Optional[int]) -> None:
    """Have the kernel SIGKILL this process when its parent dies (Linux), so no rank outlives the driver."""
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, int(signal.SIGKILL), 0, 0, 0)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        return
    if expected_parent and os.getppid() != expected_parent:
        os._exit(3)  # the parent died before the request took effect


def _exit_if_orphaned(driver: Optional[int]) -> None:
    """Open MPI ranks are children of mpiexec, not of the driver: they look for the driver themselves."""
    if driver and not _alive(driver):
        os._exit(3)


def _time_dumps() -> List[Tuple[float, float, int]]:
    """Record (start, end, entries) of every flight-recorder dump of this process (the watchdog's too)."""
    from pycoll.flight_recorder import get_recorder

    rec = get_recorder()
    dump = rec.dump
    out: List[Tuple[float, float, int]] = []

    def timed(*args: Any, **kwargs: Any) -> Any:
        t0 = time.time()
        try:
            return dump(*args, **kwargs)
        finally:
            out.append((t0, time.time(), len(rec.entries())))

    rec.dump = timed  # type: ignore[method-assign]
    return out


def worker_pycoll(a: argparse.Namespace) -> None:
    _die_with_parent(a.parent)
    import pycoll
    from pycoll.elastic import ElasticGroup

    dumps = _time_dumps()
    host, port = a.store.rsplit(":", 1)
    store = pycoll.TCPStore(host, int(port), TOKEN, timeout=30.0)
    group = ElasticGroup(store, a.rank, a.nranks, backend="host", timeout=a.group_timeout, name=f"{a.tag}-{a.trial}",
                         window=a.window)
    x = np.empty(COUNT, np.float32)
    for _ in range(a.warmup):
        x.fill(1.0)
        group.comm.all_reduce(x)
        if not np.all(x == a.nranks):
            raise SystemExit(f"rank {a.rank}: wrong warm-up result")
    _write_json(os.path.join(a.outdir, f"ready.{a.rank}"), {"pid": os.getpid(), "time": time.time()})
    deadline = time.monotonic() + a.deadline
    loops = 0
    while True:
        x.fill(1.0)
        try:
            group.comm.all_reduce(x, timeout=a.op_timeout)
        except pycoll.CommFailure as exc:
            t_seen = time.time()
            cause = f"{type(exc).__name__}: {exc}"[:300]
            break
        if not np.all(x == a.nranks):
            raise SystemExit(f"rank {a.rank}: wrong result in the loop")
        loops += 1
        if time.monotonic() > deadline:
            raise SystemExit(f"rank {a.rank}: no failure within {a.deadline} s")
    old = group.comm
    group.reshape()
    y = np.ones(COUNT, np.float32)
    group.comm.all_reduce(y)
    t_done = time.time()
    tr = group.transitions[-1]
    from pycoll.watchdog import get_watchdog

    get_watchdog().wait_for_dumps()  # the held failure dumps, written after the recovery
    out = {
        "rank": a.rank, "pid": os.getpid(), "loops": loops, "cause": cause, "t_seen": t_seen, "t_done": t_done,
        "correct": bool(np.all(y == group.size)), "size_after": group.size, "members": list(group.members),
        "kind": tr.kind, "attempts": tr.attempts, "failed_at": old.failed_at or 0.0,
        "detected": tr.detected, "agreement_started": tr.agreement_started, "agreed": tr.agreed,
        "revoked": tr.revoked, "comm_ready": tr.comm_ready,
        "dumps": [d for d in dumps if d[1] >= (old.failed_at or 0.0)],
    }
    _write_json(os.path.join(a.outdir, f"result.{a.rank}"), out)
    group.close()


def worker_mpi(a: argparse.Namespace) -> None:
    _die_with_parent(None)  # the parent is Open MPI's launcher
    from mpi4py import MPI

    comm = MPI.COMM_WORLD
    comm.Set_errhandler(MPI.ERRORS_RETURN)
    rank, n = comm.Get_rank(), comm.Get_size()
    send = np.ones(COUNT, np.float32)
    recv = np.empty(COUNT, np.float32)
    for i in range(a.warmup):
        comm.Allreduce(send, recv)
        if not np.all(recv == n):
            raise SystemExit(f"rank {rank}: wrong warm-up result")
        if i % 256 == 0:
            _exit_if_orphaned(a.parent)
    comm.Barrier()
    _write_json(os.path.join(a.outdir, f"ready.{rank}"), {"pid": os.getpid(), "time": time.time()})
    deadline = time.monotonic() + a.deadline
    loops = 0
    while True:
        try:
            comm.Allreduce(send, recv)
        except MPI.Exception as exc:
            t_seen = time.time()
            err_class = exc.Get_error_class()
            cause = exc.Get_error_string()[:300]
            break
        if not np.all(recv == n):
            raise SystemExit(f"rank {rank}: wrong result in the loop")
        loops += 1
        if time.monotonic() > deadline:
            raise SystemExit(f"rank {rank}: no failure within {a.deadline} s")
        if loops % 256 == 0:
            _exit_if_orphaned(a.parent)
    comm.Revoke()
    t_revoked = time.time()
    new = comm.Shrink()
    new.Set_errhandler(MPI.ERRORS_RETURN)
    t_shrunk = time.time()
    recv.fill(0)
    new.Allreduce(send, recv)
    t_done = time.time()
    size = new.Get_size()
    out = {
        "rank": rank, "pid": os.getpid(), "loops": loops, "cause": cause, "error_class": err_class,
        "proc_failed": err_class == MPI.ERR_PROC_FAILED, "t_seen": t_seen, "revoked": t_revoked,
        "comm_ready": t_shrunk, "t_done": t_done, "correct": bool(np.all(recv == size)), "size_after": size,
    }
    _write_json(os.path.join(a.outdir, f"result.{rank}"), out)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)  # MPI_Finalize after a failure can hang (a few percent of runs)


# -- the driver ----------------------------------------------------------------------------------------


def _shm_entries() -> set:
    try:
        return {e for e in os.listdir("/dev/shm") if e.startswith(("pycoll", "sm_segment."))}  # ours, Open MPI's
    except FileNotFoundError:
        return set()


def _alive(pid: int) -> bool:
    """True while ``pid`` exists and is not a zombie."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] not in ("Z", "X")
    except (OSError, IndexError):
        return False


def _signal(pid: int, sig: int) -> None:
    try:
        os.kill(pid, sig)
    except (ProcessLookupError, PermissionError):
        pass


class Trial:
    """One trial: start the ranks, wait until they loop, inject the fault, collect the survivors' results.

    Whatever happens, :meth:`cleanup` SIGCONTs and SIGKILLs every rank (by pid and by process
    group) and reaps what this process started.
    """

    def __init__(self, case: str, index: int, nranks: int, victim: int, a: argparse.Namespace,
                 store_addr: Optional[Tuple[str, int]]) -> None:
        self.case, self.index, self.nranks, self.victim, self.a = case, index, nranks, victim, a
        self.store_addr = store_addr
        self._stop = "-stop" in case
        self.dir = tempfile.mkdtemp(prefix="pycoll-recovery-")
        self.procs: List[subprocess.Popen] = []
        self.pids: Dict[int, int] = {}
        self.logs: List[Any] = []

    def _env(self) -> Dict[str, str]:
        env = dict(os.environ)
        env["PYTHONPATH"] = pycoll_path() + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
        env["PYCOLL_FR_DUMP_DIR"] = os.path.join(self.dir, "fr")
        env.setdefault("OMP_NUM_THREADS", "1")
        if self.case.startswith("pycoll"):
            env.update(self.a.env)
            if self.case.endswith("-nofr"):
                env.update(NOFR_ENV)
        if self.case.startswith("mpi") and hasattr(os, "geteuid") and os.geteuid() == 0:
            env.update(OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")
        return env

    def _popen(self, cmd: List[str], tag: str) -> None:
        log = open(os.path.join(self.dir, f"{tag}.log"), "w")  # noqa: SIM115 -- open while the process runs
        self.logs.append(log)
        self.procs.append(subprocess.Popen(cmd, env=self._env(), stdin=subprocess.DEVNULL, stdout=log,
                                           stderr=subprocess.STDOUT, start_new_session=True))

    def start(self) -> None:
        me = [sys.executable, os.path.abspath(__file__)]
        common = ["--outdir", self.dir, "--trial", str(self.index), "--deadline", str(self.a.trial_timeout),
                  "--tag", self.case, "--warmup", str(self.a.warmup), "--parent", str(os.getpid())]
        if self.case.startswith("pycoll"):
            assert self.store_addr is not None
            timeout = self.a.stop_timeout if self._stop else self.a.op_timeout
            for r in range(self.nranks):
                self._popen([*me, "--worker", "pycoll", "--rank", str(r), "--nranks", str(self.nranks),
                             "--store", f"{self.store_addr[0]}:{self.store_addr[1]}",
                             "--op-timeout", str(timeout), "--group-timeout", str(self.a.group_timeout),
                             "--window", str(self.a.window), *common], f"rank{r}")
        else:
            mpiexec = find_mpiexec()
            if mpiexec is None:
                raise RuntimeError(MPI_MISSING)
            detector: List[str] = []
            if self._stop:  # the heartbeat failure detector: without it a stopped process is never found
                detector = ["--mca", "mpi_ft_detector", "true", "--mca", "mpi_ft_detector_thread", "true",
                            "--mca", "mpi_ft_detector_period", str(self.a.mpi_detector_period),
                            "--mca", "mpi_ft_detector_timeout", str(self.a.mpi_detector_timeout)]
            self._popen([mpiexec, "--with-ft", "ulfm", *detector, "--oversubscribe", "-n", str(self.nranks), *me,
                         "--worker", "mpi", *common], "mpiexec")

    def _launchers_dead(self, victim_gone: bool) -> Optional[str]:
        for i, p in enumerate(self.procs):
            if victim_gone and self.case.startswith("pycoll") and i == self.victim:
                continue
            if p.poll() is not None and p.returncode != 0:
                return f"a launched process exited with status {p.returncode}"
        return None

    def _wait_files(self, prefix: str, ranks: Sequence[int], deadline: float) -> Dict[int, Dict[str, Any]]:
        got: Dict[int, Dict[str, Any]] = {}
        while True:
            for r in ranks:
                if r not in got:
                    path = os.path.join(self.dir, f"{prefix}.{r}")
                    if os.path.exists(path):
                        with open(path) as f:
                            got[r] = json.load(f)
            if len(got) == len(ranks):
                return got
            why = self._launchers_dead(prefix == "result")
            if why is None and prefix == "ready":
                for r, info in got.items():
                    if not _alive(info["pid"]):
                        why = f"rank {r} exited before the fault"
            if why is not None:
                raise RuntimeError(f"{why}; {self._tail()}")
            if time.monotonic() > deadline:
                missing = sorted(set(ranks) - set(got))
                raise RuntimeError(f"no {prefix} file from ranks {missing} within the deadline; {self._tail()}")
            # the ranks take the times themselves; polling slowly keeps this process's GIL free for
            # the store server thread, which is on the critical path of pycoll's recovery
            time.sleep(0.05)

    def _tail(self) -> str:
        lines: List[str] = []
        for name in sorted(os.listdir(self.dir)):
            if name.endswith(".log"):
                with open(os.path.join(self.dir, name), errors="replace") as f:
                    tail = [ln.rstrip() for ln in f.readlines() if ln.strip()][-3:]
                if tail:
                    lines.append(f"{name}: " + " | ".join(tail))
        return "; ".join(lines)[-1500:] or "no output"

    def run(self) -> Dict[str, Any]:
        deadline = time.monotonic() + self.a.trial_timeout
        self.start()
        ready = self._wait_files("ready", range(self.nranks), deadline)
        self.pids = {r: int(v["pid"]) for r, v in ready.items()}
        time.sleep(random.uniform(0.02, 0.08))  # a random moment of the allreduce loop
        sig = signal.SIGSTOP if self._stop else signal.SIGKILL
        t_fault = time.time()
        os.kill(self.pids[self.victim], sig)
        survivors = [r for r in range(self.nranks) if r != self.victim]
        results = self._wait_files("result", survivors, deadline)
        return self._analyse(t_fault, results)

    def _analyse(self, t0: float, results: Dict[int, Dict[str, Any]]) -> Dict[str, Any]:
        per_rank: Dict[int, Dict[str, float]] = {}
        for r, v in results.items():
            if self.case.startswith("pycoll"):
                failed = v["failed_at"] or v["detected"]
                marks = [failed, v["agreement_started"], v["agreed"], v["revoked"], v["comm_ready"], v["t_done"]]
                names = ["detection", "to_reshape", "agreement", "revoke", "shrink", "first_allreduce"]
            else:
                marks = [v["t_seen"], v["revoked"], v["comm_ready"], v["t_done"]]
                names = ["detection", "revoke", "shrink", "first_allreduce"]
            ph: Dict[str, float] = {}
            prev = t0
            for name, t in zip(names, marks, strict=False):
                ph[name] = round((t - prev) * 1e3, 3)
                prev = t
            ph["total"] = round((v["t_done"] - t0) * 1e3, 3)
            per_rank[r] = ph
        slowest = max(per_rank, key=lambda r: per_rank[r]["total"])
        out = {
            "trial": self.index, "victim": self.victim, "slowest": slowest, "phases": per_rank[slowest],
            "per_rank": {str(r): p for r, p in per_rank.items()},
            "correct": all(v["correct"] and v["size_after"] == self.nranks - 1 for v in results.values()),
            "raw": {str(r): v for r, v in results.items()}, "t_fault": t0,
        }
        if self.case.startswith("pycoll"):
            # time the slowest survivor spent writing flight-recorder dumps between the fault and the end
            v = results[slowest]
            busy = sum(max(0.0, min(e, v["t_done"]) - max(b, t0)) for b, e, _ in v["dumps"])
            out["fr_dump"] = round(busy * 1e3, 3)
            out["fr_dump_after"] = round(sum(max(0.0, e - max(b, v["t_done"])) for b, e, _ in v["dumps"]) * 1e3, 3)
            out["fr_dump_entries"] = max((n for _, _, n in v["dumps"]), default=0)
        if self.case.startswith("mpi"):
            out["proc_failed_ranks"] = sorted(r for r, v in results.items() if v["proc_failed"])
        else:
            out["kinds"] = sorted({v["kind"] for v in results.values()})
        return out

    def cleanup(self) -> Dict[str, Any]:
        """Stop everything this trial started; report how the survivors ended."""
        clean_deadline = time.monotonic() + self.a.exit_grace
        if self.victim in self.pids:
            _signal(self.pids[self.victim], signal.SIGCONT)
            _signal(self.pids[self.victim], signal.SIGKILL)
        while time.monotonic() < clean_deadline and any(p.poll() is None for p in self.procs):
            time.sleep(0.01)
        unclean = [i for i, p in enumerate(self.procs) if p.poll() is None]
        for p in self.procs:
            if p.poll() is None:
                try:
                    os.killpg(p.pid, signal.SIGCONT)
                    os.killpg(p.pid, signal.SIGKILL)
                except (ProcessLookupError, PermissionError):
                    pass
        for pid in self.pids.values():
            if _alive(pid):
                _signal(pid, signal.SIGCONT)
                _signal(pid, signal.SIGKILL)
        for p in self.procs:
            try:
                p.wait(10.0)
            except subprocess.TimeoutExpired:
                pass
        for log in self.logs:
            log.close()
        left = [pid for pid in self.pids.values() if _alive(pid)]
        left += [p.pid for p in self.procs if p.poll() is None]
        codes = [p.returncode for p in self.procs]
        if self.a.keep:
            dest = os.path.join(self.a.keep, f"{self.case}-{self.index}")
            shutil.rmtree(dest, ignore_errors=True)
            shutil.copytree(self.dir, dest)
        shutil.rmtree(self.dir, ignore_errors=True)
        return {"exit_codes": codes, "killed_after_grace": len(unclean), "left_running": left}


def percentile(values: Sequence[float], q: float) -> float:
    """Nearest-rank percentile (q in 0..100)."""
    s = sorted(values)
    k = max(1, math.ceil(q / 100.0 * len(s)))
    return s[k - 1]


def stats(values: Sequence[float]) -> Dict[str, float]:
    if not values:
        return {}
    return {"median": float(np.median(values)), "min": min(values), "p90": percentile(values, 90),
            "max": max(values), "n": len(values)}


def run_trial(case: str, i: int, a: argparse.Namespace, store_addr: Optional[Tuple[str, int]]) -> Dict[str, Any]:
    """Trial ``i`` of ``case``: its result (with ``error`` when it failed), everything started reaped."""
    victim = (i % a.ranks) if a.victim == "rotate" else (a.ranks - 1 if a.victim == "last" else int(a.victim))
    t = Trial(case, i, a.ranks, victim, a, store_addr)
    try:
        res = t.run()
    except Exception as exc:  # one failed trial does not end the run; it is reported
        res = {"trial": i, "victim": victim, "error": f"{type(exc).__name__}: {exc}"}
    finally:
        end = t.cleanup()
    res.update(end)
    if end["left_running"]:
        res.setdefault("error", f"processes still running after cleanup: {end['left_running']}")
    if "error" in res:
        print(f"#   {case} trial {i} (victim {victim}): FAILED: {res['error']}", file=sys.stderr)
    else:
        p = res["phases"]
        print(f"#   {case} trial {i} (victim {victim}): total {p['total']:.1f} ms  "
              + "  ".join(f"{k} {v:.1f}" for k, v in p.items() if k != "total")
              + ("" if res["correct"] else "  WRONG RESULT"), file=sys.stderr)
    return res


def run_cases(cases: Sequence[str], a: argparse.Namespace, store_addr: Optional[Tuple[str, int]],
              trials: Optional[Dict[str, int]] = None) -> Dict[str, Dict[str, Any]]:
    """Run the cases' trials interleaved (trial i of each case in turn); ``trials``: per-case counts
    (default ``a.trials``). Returns case -> summary (:func:`summarise`)."""
    counts = {c: (trials or {}).get(c, a.trials) for c in cases}
    done: Dict[str, List[Dict[str, Any]]] = {c: [] for c in cases}
    seconds = dict.fromkeys(cases, 0.0)
    for i in range(max(counts.values(), default=0)):
        for case in cases:
            if i < counts[case]:
                t0 = time.monotonic()
                done[case].append(run_trial(case, i, a, store_addr))
                seconds[case] += time.monotonic() - t0
    out = {}
    for case in cases:
        out[case] = summarise(case, done[case], a)
        out[case]["seconds"] = round(seconds[case], 1)
    return out


def run_case(case: str, a: argparse.Namespace, store_addr: Optional[Tuple[str, int]]) -> Dict[str, Any]:
    return run_cases([case], a, store_addr)[case]


def summarise(case: str, trials: List[Dict[str, Any]], a: argparse.Namespace) -> Dict[str, Any]:
    errors = [f"trial {t['trial']}: {t['error']}" for t in trials if "error" in t]
    ok = [t for t in trials if "error" not in t and t["correct"]]
    phases = [ph for ph in PHASES if ok and ph in ok[0]["phases"]]
    summary = {ph: stats([t["phases"][ph] for t in ok]) for ph in phases}
    for key in ("fr_dump", "fr_dump_after"):
        if ok and key in ok[0]:
            summary[key] = stats([t[key] for t in ok])
    out: Dict[str, Any] = {"trials": trials, "summary": summary, "ok": len(ok), "failed": len(trials) - len(ok),
                           "errors": errors}
    if case.startswith("pycoll-stop"):
        out["timeout_s"] = a.stop_timeout
        totals = [t["phases"]["total"] for t in ok]
        out["before_timeout"] = sum(1 for x in totals if x < a.stop_timeout * 1e3)
        if totals and out["before_timeout"] < len(totals):  # found at the timeout (liveness off)
            out["overhead"] = stats([x - a.stop_timeout * 1e3 for x in totals])
    return out


def _cell(s: Optional[Dict[str, float]]) -> str:
    """``median (min / p90 / max)`` in ms."""
    if not s:
        return "-"
    return f"{s['median']:.1f} ({s['min']:.1f} / {s['p90']:.1f} / {s['max']:.1f})"


def _title(case: str, a: argparse.Namespace) -> str:
    t = {"pycoll-kill": "pycoll SIGKILL", "pycoll-stop": f"pycoll SIGSTOP, T = {a.stop_timeout:g} s",
         "mpi-kill": "Open MPI ULFM SIGKILL",
         "mpi-stop": "Open MPI ULFM SIGSTOP, heartbeat detector {} s / {} s".format(
             getattr(a, "mpi_detector_period", "?"), getattr(a, "mpi_detector_timeout", "?")),
         }[case.replace("-nofr", "")]
    return t + (", FR off" if case.endswith("-nofr") else "")


def _ratio(num: Optional[Dict[str, float]], den: Optional[Dict[str, float]]) -> str:
    if not num or not den or den["median"] <= 0:
        return "-"
    return f"{num['median'] / den['median']:.2f}x"


def build_table(results: Dict[str, Dict[str, Any]], a: argparse.Namespace) -> Tuple[List[str], List[List[str]]]:
    """Rows: phases; columns: cases (median (min / p90 / max), ms), and pycoll / Open MPI ratios of medians."""
    cols: List[Tuple[str, Optional[str], Optional[str]]] = []  # (header, case, ratio-over case)
    order = [c for c in ("pycoll-kill", "mpi-kill", "pycoll-kill-nofr", "pycoll-stop", "mpi-stop", "pycoll-stop-nofr")
             if c in results]
    for case in order:
        res = results[case]
        cols.append((f"{_title(case, a)} [{res['ok']}/{res['ok'] + res['failed']}]", case, None))
        if "mpi-kill" in results:
            if case == "mpi-kill" and "pycoll-kill" in results:
                cols.append(("pycoll / Open MPI", None, "pycoll-kill"))
            elif case == "pycoll-kill-nofr":
                cols.append(("FR off / Open MPI", None, case))
        if case == "mpi-stop" and "pycoll-stop" in results:
            cols.append(("pycoll / Open MPI (SIGSTOP)", None, "pycoll-stop"))
    head = ["phase (ms)"] + [c[0] for c in cols]
    body: List[List[str]] = []
    for ph in (*PHASES, "total - T", "fr_dump", "fr_dump_after"):
        row = [PHASE_LABELS.get(ph, ph)]
        for _, case, over in cols:
            if case is not None:
                res = results[case]
                row.append(_cell(res.get("overhead") if ph == "total - T" else res["summary"].get(ph)))
            else:
                assert over is not None
                mpi = results.get("mpi-stop" if "-stop" in over else "mpi-kill", {}).get("summary", {})
                row.append(_ratio(results[over]["summary"].get(ph), mpi.get(ph)) if ph in PHASES else "-")
        if any(c != "-" for c in row[1:]):
            body.append(row)
    return head, body


def verdicts(results: Dict[str, Dict[str, Any]], a: argparse.Namespace) -> List[str]:
    """The project's targets, met or not, in words."""
    lines: List[str] = []
    mk = results.get("mpi-kill", {}).get("summary", {}).get("total")
    for case in ("pycoll-kill", "pycoll-kill-nofr"):
        pk = results.get(case, {}).get("summary", {}).get("total")
        if not pk:
            continue
        line = (f"{_title(case, a)} -> first correct allreduce: median {pk['median']:.1f} ms "
                f"(target <= 100 ms: {'met' if pk['median'] <= 100 else 'NOT met'})")
        if mk:
            ratio = pk["median"] / mk["median"]
            line += (f"; Open MPI ULFM {mk['median']:.1f} ms; ratio {ratio:.2f}x "
                     f"(target below 1: {'met' if ratio < 1 else 'NOT met'})")
        lines.append(line)
    ms = results.get("mpi-stop", {}).get("summary", {}).get("total")
    for case in ("pycoll-stop", "pycoll-stop-nofr"):
        res = results.get(case, {})
        ps = res.get("summary", {}).get("total")
        if ps and "overhead" not in res:
            lines.append(f"{_title(case, a)} -> first correct allreduce: median {ps['median']:.1f} ms, max "
                         f"{ps['max']:.1f} ms (target: the stopped rank found within about 1 s, before T: "
                         f"{'met' if ps['max'] <= 1500 else 'NOT met'})"
                         + (f"; Open MPI ULFM with its heartbeat detector {ms['median']:.1f} ms" if ms else ""))
        o = res.get("overhead")
        if o:
            lines.append(f"{_title(case, a)}: T + {o['median']:.1f} ms median (max T + {o['max']:.1f} ms) "
                         f"(target T + <= 100 ms: {'met' if o['median'] <= 100 else 'NOT met'})")
    return lines


def markdown(head: List[str], body: List[List[str]]) -> str:
    rows = ["| " + " | ".join(head) + " |", "|" + "|".join(["---"] + ["---:"] * (len(head) - 1)) + "|"]
    rows += ["| " + " | ".join(r) + " |" for r in body]
    return "\n".join(rows)


def plain(head: List[str], body: List[List[str]]) -> str:
    widths = [max(len(h), *(len(r[i]) for r in body)) if body else len(h) for i, h in enumerate(head)]
    def fmt(row: List[str]) -> str:
        cells = enumerate(zip(row, widths, strict=False))
        return "  ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in cells)

    return "\n".join([fmt(head)] + [fmt(r) for r in body])


PLOT_PHASE_COLOURS = {"detection": "#d03030", "to_reshape": "#b8b8b8", "agreement": "#6a5acd", "revoke": "#c71585",
                      "shrink": "#2e8b57", "first_allreduce": "#1e90ff"}


def plot_phases(doc: Dict[str, Any], path: str) -> List[str]:
    """Draw the recovery phases of each case (median per phase, stacked) side by side into the PNG ``path``.

    One horizontal bar per case, one segment per phase; the SIGSTOP cases (dominated by the timeout)
    get their own panel. Medians of the phases need not add up to the median total, which is written
    at the end of each bar. Returns the cases drawn. Needs matplotlib (the bench extra).
    """
    try:
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure
        from matplotlib.patches import Patch
    except ImportError as e:
        raise SystemExit(f"--plot needs matplotlib (pip install matplotlib): {e}") from e
    a = argparse.Namespace(stop_timeout=doc.get("stop_timeout_s", 1.0))
    results = doc.get("results", {})
    panels = [[c for c in ("pycoll-kill", "pycoll-kill-nofr", "mpi-kill") if results.get(c, {}).get("summary")],
              [c for c in ("pycoll-stop", "pycoll-stop-nofr") if results.get(c, {}).get("summary")]]
    panels = [p for p in panels if p]
    if not panels:
        raise SystemExit("--plot: no case with results to draw")
    fig = Figure(figsize=(10, 1.4 + 0.55 * sum(len(p) for p in panels) + 0.5 * len(panels)), dpi=100)
    FigureCanvasAgg(fig)
    axes = fig.subplots(len(panels), 1, squeeze=False, gridspec_kw={"height_ratios": [len(p) for p in panels]})
    for ax, cases in zip(axes[:, 0], panels, strict=False):
        for y, case in enumerate(cases):
            summary = results[case]["summary"]
            left = 0.0
            for ph in PHASES[:-1]:
                if ph in summary:
                    width = summary[ph]["median"]
                    ax.barh(y, width, left=left, color=PLOT_PHASE_COLOURS[ph], height=0.6)
                    left += width
            total = summary["total"]["median"]
            ax.text(left, y, f"  total {total:.1f} ms (median of {summary['total'].get('n', '?')})", va="center",
                    fontsize=8)
        ax.set_yticks(range(len(cases)))
        ax.set_yticklabels([_title(c, a) for c in cases], fontsize=8)
        ax.invert_yaxis()
        ax.set_xlim(0, max(results[c]["summary"]["total"]["median"] for c in cases) * 1.45)
        ax.set_xlabel("ms after the fault (median of each phase)", fontsize=8)
        ax.grid(axis="x", color="#e0e0e0", linewidth=0.5)
        ax.set_axisbelow(True)
    axes[0, 0].legend(handles=[Patch(color=c, label=PHASE_LABELS[p]) for p, c in PLOT_PHASE_COLOURS.items()],
                      loc="lower center", bbox_to_anchor=(0.5, 1.02), ncol=6, fontsize=7, frameon=False)
    fig.suptitle(f"recovery after a failed rank, {doc.get('ranks', '?')} ranks, {doc.get('host', '')}: pycoll and "
                 "Open MPI ULFM", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, format="png")
    return [c for p in panels for c in p]


def main(argv: Optional[Sequence[str]] = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--trials", type=int, default=10, help="trials per case (default 10)")
    p.add_argument("--ranks", type=int, default=4, help="ranks per trial (default 4)")
    p.add_argument("--cases", nargs="+", default=list(CASES), choices=CASES, help="cases to run (default: all)")
    p.add_argument("--warmup", type=int, default=2000,
                   help="allreduces before the fault (default 2000: pycoll's flight-recorder ring is full, as in a "
                        "job that has run for a while; its dump on failure is part of the recovery)")
    p.add_argument("--victim", default="rotate",
                   help="rank to fail: 'rotate' over the trials (default), 'last', or a rank")
    p.add_argument("--stop-timeout", type=float, default=30.0,
                   help="pycoll's operation timeout T in the SIGSTOP case, seconds (default 30, pycoll's default)")
    p.add_argument("--mpi-detector-period", type=float, default=3.0,
                   help="Open MPI's heartbeat period in the mpi-stop case (mpi_ft_detector_period; default 3)")
    p.add_argument("--mpi-detector-timeout", type=float, default=10.0,
                   help="Open MPI's heartbeat timeout in the mpi-stop case (mpi_ft_detector_timeout; default 10)")
    p.add_argument("--stop-trials", type=int, default=None,
                   help="trials of the SIGSTOP cases (default: --trials)")
    p.add_argument("--op-timeout", type=float, default=10.0,
                   help="pycoll's operation timeout in the SIGKILL case, seconds (default 10)")
    p.add_argument("--group-timeout", type=float, default=10.0,
                   help="the ElasticGroup's timeout (init, store, shrink), seconds (default 10)")
    p.add_argument("--window", type=float, default=1.0, help="ElasticGroup window, seconds (default 1)")
    p.add_argument("--trial-timeout", type=float, default=60.0, help="hard deadline of one trial, seconds (default 60)")
    p.add_argument("--exit-grace", type=float, default=5.0,
                   help="seconds the survivors get to exit by themselves after a trial before they are killed")
    p.add_argument("--env", action="append", default=[], metavar="NAME=VALUE",
                   help="extra environment of the pycoll ranks, e.g. PYCOLL_FR_DUMP_ON_FAILURE=0 (repeatable)")
    p.add_argument("--keep", metavar="DIR", help="copy each trial's folder (rank logs, flight-recorder dumps) here")
    p.add_argument("--seed", type=int, default=None, help="seed of the random fault moments")
    p.add_argument("--json", help="write every trial and the summary to this JSON file")
    p.add_argument("--markdown", help="write the table as markdown to this file")
    p.add_argument("--plot", metavar="OUT.png",
                   help="draw the phases of each case side by side (with --from-json: of an earlier run's JSON)")
    p.add_argument("--from-json", metavar="JSON", help="with --plot: draw this --json file, run nothing")
    p.add_argument("--worker", choices=("pycoll", "mpi"), help=argparse.SUPPRESS)
    p.add_argument("--rank", type=int, help=argparse.SUPPRESS)
    p.add_argument("--nranks", type=int, help=argparse.SUPPRESS)
    p.add_argument("--store", help=argparse.SUPPRESS)
    p.add_argument("--outdir", help=argparse.SUPPRESS)
    p.add_argument("--trial", type=int, default=0, help=argparse.SUPPRESS)
    p.add_argument("--deadline", type=float, default=60.0, help=argparse.SUPPRESS)
    p.add_argument("--tag", default="trial", help=argparse.SUPPRESS)
    p.add_argument("--parent", type=int, default=None, help=argparse.SUPPRESS)
    a = p.parse_args(argv)
    if a.worker == "pycoll":
        worker_pycoll(a)
        return 0
    if a.worker == "mpi":
        worker_mpi(a)
        return 0
    if a.from_json:
        if not a.plot:
            p.error("--from-json needs --plot")
        with open(a.from_json) as f:
            print(f"# drew {', '.join(plot_phases(json.load(f), a.plot))} into {a.plot}")
        return 0
    if a.trials < 1 or a.ranks < 3 or a.warmup < 1:
        p.error("--trials and --warmup must be >= 1 and --ranks >= 3 (a shrink needs at least 2 survivors)")
    if a.victim not in ("rotate", "last") and not (a.victim.isdigit() and int(a.victim) < a.ranks):
        p.error(f"--victim must be 'rotate', 'last' or a rank below {a.ranks}")
    try:
        a.env = dict(item.split("=", 1) for item in a.env)
    except ValueError:
        p.error("--env takes NAME=VALUE")
    random.seed(a.seed)
    started = datetime.now(timezone.utc).isoformat(timespec="seconds")
    load0 = os.getloadavg()
    shm0 = _shm_entries()
    doc: Dict[str, Any] = {
        "started": started, "host": platform.node(), "cpus": os.cpu_count(), "python": platform.python_version(),
        "loadavg_before": load0, "ranks": a.ranks, "trials": a.trials, "count": COUNT, "dtype": "float32",
        "warmup": a.warmup,
        "stop_timeout_s": a.stop_timeout, "mpi_detector": [a.mpi_detector_period, a.mpi_detector_timeout],
        "op_timeout_s": a.op_timeout, "victim": a.victim,
        "pycoll_env": a.env, "command": " ".join(["python", "benchmarks/recovery.py",
                                          *(argv if argv is not None else sys.argv[1:])]),
        "results": {},
    }
    print(f"# recovery latency, {a.ranks} ranks, {a.trials} trials per case -- {started}, {os.cpu_count()} CPUs, "
          f"load average before: {' '.join(f'{x:.2f}' for x in load0)}")
    server = None
    if any(c.startswith("pycoll") for c in a.cases):
        import_pycoll()
        import pycoll

        server = pycoll.TCPStoreServer(token=TOKEN).start()
    try:
        addr = (server.host, server.port) if server is not None else None
        counts = {c: a.stop_trials for c in a.cases if "-stop" in c and a.stop_trials is not None}
        doc["results"].update(run_cases(a.cases, a, addr, counts))
    finally:
        if server is not None:
            server.close()
    load1 = os.getloadavg()
    doc["loadavg_after"] = load1
    doc["shm_left"] = sorted(_shm_entries() - shm0)
    head, body = build_table(doc["results"], a)
    lines = verdicts(doc["results"], a)
    doc["verdicts"] = lines
    print("\n" + plain(head, body))
    for line in lines:
        print("# " + line)
    print(f"# load average after: {' '.join(f'{x:.2f}' for x in load1)}")
    if doc["shm_left"]:
        print(f"# /dev/shm entries that appeared during the run and remain: {doc['shm_left']}", file=sys.stderr)
    if a.json:
        with open(a.json, "w") as f:
            json.dump(doc, f, indent=1)
    if a.markdown:
        with open(a.markdown, "w") as f:
            f.write(markdown(head, body) + "\n\n" + "\n".join(f"- {ln}" for ln in lines) + "\n")
    if a.plot:
        print(f"# drew {', '.join(plot_phases(doc, a.plot))} into {a.plot}")
    failed = sum(r["failed"] for r in doc["results"].values())
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
