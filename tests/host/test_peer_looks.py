"""How often a waiting rank of the host library looks at its peers' processes (``PYCOLL_HOST_PEER_CHECK_NS``).

A waiter finds a peer of its host that dies at once through the peer's life word (a robust futex) and the exit
watcher; on top of that it looks at the peers' processes themselves (a zero-timeout ``poll`` of their pidfds)
every ``PYCOLL_HOST_PEER_CHECK_NS`` while it waits: the first look that interval into its wait, so that the
many short waits of ranks sharing CPUs make no system call for it. The looks are counted in the ranks by a
``poll`` wrapper preloaded into them (``LD_PRELOAD``; a zero-timeout poll of one descriptor is a look: the
library's other polls wait).
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from helpers.fake_nccl import preload_kit
from helpers.host_util import uid

pytestmark = pytest.mark.timeout(120)

SHIM = r"""
#define _GNU_SOURCE
#include <dlfcn.h>
#include <poll.h>
#define EXPORT __attribute__((visibility("default")))
static unsigned long looks;
EXPORT unsigned long peer_looks(void) { return __atomic_load_n(&looks, __ATOMIC_RELAXED); }
EXPORT int poll(struct pollfd* fds, nfds_t n, int timeout) {
  static int (*real)(struct pollfd*, nfds_t, int);
  if (!real) real = (int (*)(struct pollfd*, nfds_t, int))dlsym(RTLD_NEXT, "poll");
  if (n == 1 && timeout == 0) __atomic_add_fetch(&looks, 1, __ATOMIC_RELAXED);
  return real(fds, n, timeout);
}
"""

RANK = textwrap.dedent("""
    import ctypes, os, sys, time
    import numpy as np
    shim, idhex, mode = sys.argv[1], sys.argv[4], sys.argv[5]
    rank, n, cpu = int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[6])
    os.sched_setaffinity(0, {cpu})  # every rank on one CPU, before the library counts the CPUs: ranks outnumber them
    looks = ctypes.CDLL(shim).peer_looks
    looks.restype = ctypes.c_ulong
    from pycoll._bindings import DataType, RedOp, UniqueId, load
    lib = load("host")
    comm = lib.comm_init_rank(n, UniqueId(bytes.fromhex(idhex)), rank)
    a, b = np.ones(2, np.float32), np.zeros(2, np.float32)
    def all_reduce():
        lib.all_reduce(a.ctypes.data, b.ctypes.data, 2, int(DataType.Float32), int(RedOp.Sum), comm, 0)
        assert b[0] == n, b
    for _ in range(200):
        all_reduce()
    if mode == "short":
        before = looks()
        for _ in range(2000):
            all_reduce()
        print(looks() - before)
    else:  # one wait of half a second: rank 1 comes late
        if rank == 1:
            time.sleep(0.5)
        before, t0 = looks(), time.monotonic()
        all_reduce()
        print(looks() - before, time.monotonic() - t0)
    lib.comm_destroy(comm)
""")


@pytest.fixture(scope="module")
def shim(tmp_path_factory):
    return Path(preload_kit(str(tmp_path_factory.mktemp("looks")), SHIM, RANK, "poll wrapper"))


def _run(d, mode: str, env: dict) -> list:
    ident = uid().hex()
    cpu = str(min(os.sched_getaffinity(0)))
    full = dict(os.environ, LD_PRELOAD=str(d / "shim.so"), **env)
    procs = [subprocess.Popen([sys.executable, str(d / "rank.py"), str(d / "shim.so"), str(r), "2", ident, mode, cpu],
                              env=full, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for r in range(2)]
    try:
        outs = [p.communicate(timeout=60) for p in procs]
    finally:
        for p in procs:
            p.kill()
            p.wait()
    for p, (_, err) in zip(procs, outs, strict=True):
        assert p.returncode == 0, err
    return [[float(x) for x in out.split()] for out, _ in outs]


def test_short_waits_make_no_look_at_the_peers_processes(shim):
    """Two ranks on one CPU: every all_reduce waits for the other rank, which runs once this one yields (a few
    microseconds). Such waits used to look at the peers' processes on their first yield: about one system call
    per operation. Now a look comes a whole interval (1 ms) into a wait: almost never here."""
    per_rank = [r[0] for r in _run(shim, "short", {})]
    assert all(looks <= 50 for looks in per_rank), f"looks at the peers' processes in 2,000 operations: {per_rank}"


def test_a_long_wait_looks_at_the_peers_processes_every_interval(shim):
    """Rank 0 waits half a second for rank 1; with a 10 ms interval it looks at rank 1's process about 50
    times (the first look 10 ms into the wait), never more often."""
    (looks, waited), _ = _run(shim, "long", {"PYCOLL_HOST_PEER_CHECK_NS": "10000000"})
    assert waited > 0.4, waited
    most = waited / 0.01
    assert most * 0.4 <= looks <= most + 1, (looks, waited)
