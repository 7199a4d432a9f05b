"""Run test code as several real processes (ranks), with a hard deadline and guaranteed reaping.

``run_ranks(fn, n, *args)`` starts ``n`` processes from a forkserver (cheap and safe: no threads of
the pytest process are inherited), calls ``fn(rank, n, *args)`` in each and returns what each
returned. A rank that raises, dies from a signal, or is still running at the deadline makes the
call raise ``RankFailure`` -- unless that rank is listed in ``may_die``, in which case its entry is a
:class:`Died` record. Every child is SIGCONT'ed, SIGKILL'ed and joined before the call returns,
whatever happens.
"""

from __future__ import annotations

import contextlib
import multiprocessing as mp
import os
import signal
import threading
import time
import traceback
from dataclasses import dataclass
from typing import Any, Callable, Dict, Iterable, Iterator, List, Optional

_CTX = None


def _context():
    global _CTX
    if _CTX is None:
        _CTX = mp.get_context("forkserver")
        _CTX.set_forkserver_preload(["numpy", "pycoll", "pycoll._bindings", "helpers.mp"])
    return _CTX


@dataclass
class Died:
    """A rank that ended without returning (killed by a signal or exited early)."""

    rank: int
    exitcode: Optional[int]


class RankFailure(AssertionError):
    """A rank raised, died unexpectedly, or missed the deadline."""


def _child(fn, rank, n, args, env, conn, hard_exit=False):
    if env:
        os.environ.update(env)
    try:
        out = ("ok", fn(rank, n, *args))
    except BaseException as exc:  # report everything, including SystemExit
        out = ("err", f"{type(exc).__name__}: {exc}\n{traceback.format_exc()}")
    try:
        conn.send(out)
    finally:
        conn.close()
    if hard_exit:
        os._exit(0)  # e.g. hung emulated kernels or stuck streams must not keep the process alive


def run_ranks(
    fn: Callable[..., Any],
    n: int,
    *args: Any,
    timeout: float = 60.0,
    env: Optional[Dict[str, str]] = None,
    may_die: Iterable[int] = (),
    on_start: Optional[Callable[[List[Any]], None]] = None,
    hard_exit: bool = False,
) -> List[Any]:
    """Run ``fn(rank, n, *args)`` in ``n`` processes; return the per-rank results.

    ``on_start(processes)`` runs in the parent once all children have started (it may signal them;
    ``processes[r].pid`` is rank r's pid). ``may_die`` lists ranks allowed to die or to be killed; once
    every other rank has reported, the ones still running are killed (their entry is a :class:`Died`
    with exit code None). ``hard_exit``: a rank leaves with ``os._exit(0)`` right after reporting
    (no exit handlers: for ranks that leave stuck threads behind on purpose).
    """
    ctx = _context()
    may_die = set(may_die)
    pipes, procs = [], []
    try:
        for rank in range(n):
            recv_end, send_end = ctx.Pipe(duplex=False)
            p = ctx.Process(target=_child, args=(fn, rank, n, args, env, send_end, hard_exit), daemon=True)
            p.start()
            send_end.close()
            pipes.append(recv_end)
            procs.append(p)
        if on_start is not None:
            on_start(procs)
        deadline = time.monotonic() + timeout
        results: List[Any] = [None] * n
        pending = set(range(n))
        # ranks that may die are not waited for once every other rank has reported (when all may
        # die, all are waited for)
        waited = (lambda: pending - may_die) if set(range(n)) - may_die else (lambda: pending)
        while waited() and time.monotonic() < deadline:
            for rank in sorted(pending):
                conn = pipes[rank]
                if conn.poll(0.01):
                    try:
                        results[rank] = conn.recv()
                    except EOFError:
                        procs[rank].join(1.0)
                        results[rank] = ("died", procs[rank].exitcode)
                    pending.discard(rank)
                elif not procs[rank].is_alive() and not conn.poll(0):
                    results[rank] = ("died", procs[rank].exitcode)
                    pending.discard(rank)
        errors = []
        out: List[Any] = [None] * n
        for rank in range(n):
            if rank in pending:
                if rank in may_die:
                    out[rank] = Died(rank, None)
                    continue
                errors.append(f"rank {rank}: still running after {timeout:.1f} s")
                continue
            kind, value = results[rank]
            if kind == "ok":
                out[rank] = value
            elif kind == "died":
                if rank in may_die:
                    out[rank] = Died(rank, value)
                else:
                    errors.append(f"rank {rank}: died with exit code {value}")
            else:
                errors.append(f"rank {rank}: {value}")
        if errors:
            raise RankFailure("\n".join(errors))
        return out
    finally:
        for p in procs:
            if p.pid is not None and p.is_alive():
                # SIGKILL alone: it ends a stopped rank too, where a SIGCONT first let the rank run on for a moment
                # into what it was stopped before (a segment half made, left in /dev/shm by the kill)
                try:
                    os.kill(p.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
        for p in procs:
            p.join(5.0)
        for conn in pipes:
            conn.close()


def shm_prefix() -> str:
    """How the names of this process's host-library segments begin: ``pycoll-``, or ``pycoll_<tag>-`` under
    ``PYCOLL_HOST_SHM_TAG`` (which tests/conftest.py sets for each test process: the processes of another test run
    on the machine, or of another xdist worker, then neither show up in its checks nor sweep its segments)."""
    tag = os.environ.get("PYCOLL_HOST_SHM_TAG", "").lstrip(" \t").rstrip(" \t\n")
    return f"pycoll_{tag}-" if tag else "pycoll-"


def shm_entries(prefix: Optional[str] = None) -> List[str]:
    """Names in /dev/shm that start with ``prefix`` (default :func:`shm_prefix`: this test run's segments)."""
    prefix = shm_prefix() if prefix is None else prefix
    try:
        return sorted(e for e in os.listdir("/dev/shm") if e.startswith(prefix))
    except FileNotFoundError:
        return []


def error_and_time(fn: Callable[[], Any]) -> tuple:
    """Call ``fn()`` in a rank: the name of the pycoll error it raised ("no error" when none) and the seconds it
    took."""
    import pycoll

    t0 = time.monotonic()
    try:
        fn()
    except pycoll.PycollError as e:
        return type(e).__name__, time.monotonic() - t0
    return "no error", time.monotonic() - t0


def sweep_segments() -> None:
    """Have the host library sweep the /dev/shm segments whose creators are gone, as it does at every
    rendezvous: a rank killed inside a rendezvous it created leaves that segment for the next one on the
    host, which a test that killed it runs itself."""
    import pycoll

    comm = pycoll.init(0, 1, backend="host", unique_id=pycoll.get_unique_id(backend="host"))
    comm.destroy()


@contextlib.contextmanager
def held_by_another_thread(lock: Any) -> Iterator[None]:
    """``lock`` held by another thread for the block: as a thread inside a library or store call holds it at a fork."""
    taken, done = threading.Event(), threading.Event()

    def hold() -> None:
        with lock:
            taken.set()
            done.wait(30)

    t = threading.Thread(target=hold, daemon=True)
    t.start()
    taken.wait(10)
    try:
        yield
    finally:
        done.set()
        t.join()


def in_a_fork(fn: Callable[[], Any], limit: float = 8.0) -> str:
    """``fn()`` in a forked child of this process (whose other threads may hold locks at the fork): ``"ok <repr of
    what it returned>"``, ``"<type>: <text>"`` of what it raised, or ``"hung"`` (killed after ``limit`` seconds)."""
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(r)
        try:
            out = f"ok {fn()!r}"
        except BaseException as e:  # the parent reads it
            out = f"{type(e).__name__}: {e}"
        os.write(w, out.encode())
        os._exit(0)
    os.close(w)
    try:
        deadline = time.monotonic() + limit
        while os.waitpid(pid, os.WNOHANG) == (0, 0):
            if time.monotonic() > deadline:
                os.kill(pid, signal.SIGKILL)
                os.waitpid(pid, 0)
                return "hung"
            time.sleep(0.01)
        return os.read(r, 4096).decode()
    finally:
        os.close(r)
