"""One rank of tests/diagnostics/test_exit_dumps.py, run as a plain process (so that an uncaught
exception, an exit or a signal takes the interpreter's own path, not a test harness's).

argv: rank n uid_hex host port token dump_dir scenario timeout
"""

from __future__ import annotations

import os
import signal
import sys
import time

import numpy as np

import pycoll
from pycoll.store import TCPStore

K = 5  # the operation the scenario is about
PREFIX = "pycoll_trace_rank_"


def _dump_of(dump_dir: str, rank: int) -> str:
    return os.path.join(dump_dir, "generation_0", f"{PREFIX}{rank}")


def _wait_for(path: str, limit: float = 60.0) -> None:
    deadline = time.monotonic() + limit
    while not os.path.exists(path) and time.monotonic() < deadline:
        time.sleep(0.02)


def _mark(dump_dir: str, rank: int, what: str) -> None:
    with open(os.path.join(dump_dir, f"mark-{rank}-{what}"), "w"):
        pass


def stuck_busy() -> None:
    while True:
        pass


def stuck_sleeping() -> None:
    time.sleep(100)


def stuck_holding_the_gil() -> None:
    import ctypes

    libc = ctypes.PyDLL(None)
    # as a C call that retries on EINTR: the signal goes to another thread (whose faulthandler still writes)
    signal.pthread_sigmask(signal.SIG_BLOCK, [signal.SIGUSR1])
    while True:  # libc sleep() through PyDLL: the GIL stays held, no Python thread runs (a signal ends one)
        libc.sleep(100)


def main() -> int:
    rank, n = int(sys.argv[1]), int(sys.argv[2])
    uid = bytes.fromhex(sys.argv[3])
    host, port, token = sys.argv[4], int(sys.argv[5]), sys.argv[6]
    dump_dir, scenario, timeout = sys.argv[7], sys.argv[8], float(sys.argv[9])
    if scenario == "sigterm_user" and rank == 1:
        def users_handler(signum: int, frame: object) -> None:
            _mark(dump_dir, rank, "users-handler")
            sys.exit(3)

        signal.signal(signal.SIGTERM, users_handler)
    os.environ["PYCOLL_FR_DUMP_DIR"] = dump_dir
    store = TCPStore(host, port, token)
    comm = pycoll.init(rank, n, unique_id=uid, backend="host", store=store, timeout=timeout)
    x = np.ones(2, np.float32)
    for _ in range(K - 1):
        comm.all_reduce(x)
    victim = 1
    if scenario in ("raise", "exit", "sigterm", "sigterm_user", "sigint", "timeout_sigterm") and rank != victim:
        # enter #K only once the victim is gone (or has dumped): its #K stays outstanding until then
        _wait_for(_dump_of(dump_dir, victim))
        time.sleep(0.2)
        try:
            comm.all_reduce(x)
            print(f"rank {rank}: all_reduce #{K} completed (the victim had posted its part)", flush=True)
        except pycoll.CommFailure as e:
            print(f"rank {rank}: all_reduce #{K} failed: {type(e).__name__}", flush=True)
        pycoll.watchdog.get_watchdog().wait_for_dumps()
        if not os.path.exists(_dump_of(dump_dir, rank)):
            pycoll.dump_flight_recorder("after the victim went")
        comm.abort()
        return 0
    if scenario == "raise":
        comm.all_reduce(x, async_op=True)
        raise ValueError("boom in the user's code")
    if scenario == "exit":
        comm.all_reduce(x, async_op=True)
        sys.exit(0)
    if scenario == "timeout_sigterm":  # #K times out here alone; a SIGTERM comes while the failure is reported
        comm.all_reduce(x)
        return 0
    if scenario in ("sigterm", "sigterm_user", "sigint"):
        _mark(dump_dir, rank, "entering")
        comm.all_reduce(x)  # blocks: the others wait for this rank's dump
        time.sleep(5)  # the user's handler runs once the call returns
        return 0
    if scenario == "held":  # rank 1 dies; rank 0's report of it is held by a recovery that never ends (a gate)
        if rank == 1:
            os.kill(os.getpid(), signal.SIGKILL)
        pycoll.watchdog.get_watchdog().add_dump_gate(lambda: False)
        try:
            comm.all_reduce(x)
        except pycoll.CommFailure:
            _mark(dump_dir, rank, "failed")
        # blocked where SIGTERM's Python handler cannot run (as inside a recovery's wait): another thread takes the
        # signal, and the watchdog's monitor thread acts on it
        signal.pthread_sigmask(signal.SIG_BLOCK, [signal.SIGTERM])
        time.sleep(100)
        return 0
    if scenario == "gil":
        if rank == 2:
            _mark(dump_dir, rank, "stuck")
            stuck_holding_the_gil()
        try:
            comm.all_reduce(x)
        except pycoll.CommFailure:
            pass
        pycoll.watchdog.get_watchdog().wait_for_dumps()
        comm.abort()
        return 0
    if scenario == "stuck":
        if rank == 2:
            _mark(dump_dir, rank, "stuck")
            stuck_busy()
        if rank == 3:
            _mark(dump_dir, rank, "stuck")
            stuck_sleeping()
        try:
            comm.all_reduce(x)
        except pycoll.CommFailure:
            pass
        pycoll.watchdog.get_watchdog().wait_for_dumps()
        for r in (2, 3):
            _wait_for(_dump_of(dump_dir, r), 20.0)
        comm.abort()
        return 0
    raise SystemExit(f"unknown scenario {scenario!r}")


if __name__ == "__main__":
    sys.exit(main())
