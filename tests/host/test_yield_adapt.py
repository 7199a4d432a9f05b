"""How long a wait for the peers yields before it sleeps, adapted to how such waits ended of late (the host library's
PYCOLL_HOST_YIELD_ADAPT, pycoll/_host/wait.h). Where most waits of a communicator that yielded the whole
PYCOLL_HOST_YIELD_NS slept anyway -- other processes compete for the CPUs, or the peers are that late -- its waits
yield only 25 us before they sleep (woken by the post they wait for); where they end while yielding again, they yield
the whole budget again. NCCL_DEBUG=INFO logs each change. A rank killed or stopped where a brief wait begins (failpoint
host.wait.brief) fails its peer promptly."""

from __future__ import annotations

import os
import time

import numpy as np
import pytest
from helpers.host_util import uid
from helpers.mp import Died, run_ranks

import pycoll

pytestmark = pytest.mark.timeout(60)

MARK = "PYCOLL_HOST_YIELD_ADAPT"


def _late_then_prompt(rank, n, idb, folder):
    """Rank 1 is 10 ms late for 80 all_reduce (rank 0's waits yield 0.3 ms and sleep, also where a yield hands its CPU
    to another process for a time slice), then 0.12 ms late for 4,000 (rank 0's waits that yield the whole budget end
    while they yield: each rank on a CPU of its own, so that they run at the same time -- sharing one, a yield hands
    the CPU over for a time slice and the wait sleeps after all). Returns rank 0's log lines of the changes."""
    if hasattr(os, "sched_setaffinity") and (os.cpu_count() or 1) >= 2:
        try:
            os.sched_setaffinity(0, {rank})
        except OSError:  # that CPU is not this process's to use
            pass
    log = os.path.join(folder, f"err{rank}")
    fd = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    os.dup2(fd, 2)  # the host library logs to stderr
    os.close(fd)
    comm = pycoll.init(rank, n, unique_id=idb, backend="host", timeout=30)
    x = np.ones(2, np.float32)
    for late, calls in ((10e-3, 80), (120e-6, 4000)):
        for _ in range(calls):
            if rank == 1:
                t = time.perf_counter() + late
                while time.perf_counter() < t:  # busy: a sleep of 0.12 ms would take longer
                    pass
            x[:] = 1
            comm.all_reduce(x)
            assert x[0] == n, x
    comm.destroy()
    with open(log) as f:
        return [line for line in f if MARK in line]


@pytest.mark.parametrize("adapt", ["1", "0"])
def test_waits_that_slept_yield_briefly_then_again_the_whole_budget(adapt, tmp_path):
    env = {"NCCL_DEBUG": "INFO", "PYCOLL_HOST_YIELD_ADAPT": adapt}
    lines = run_ranks(_late_then_prompt, 2, uid(), str(tmp_path), env=env, timeout=50)[0]
    if adapt == "0":
        assert lines == [], lines
        return
    brief = [i for i, line in enumerate(lines) if "yield 25 us before they sleep now" in line]
    whole = [i for i, line in enumerate(lines) if "yield the whole PYCOLL_HOST_YIELD_NS" in line]
    assert brief and whole and whole[-1] > brief[0], lines


def _killed_or_stopped_while_brief(rank, n, idb, folder, action):
    if rank == 0:
        os.environ["PYCOLL_FAILPOINTS"] = f"host.wait.brief={action}@1"
    # a store: the watchdog's liveness checks find a stopped peer through the process record it publishes there
    comm = pycoll.init(rank, n, unique_id=idb, store=pycoll.FileStore(os.path.join(folder, "store")), backend="host",
                       timeout=20)
    x = np.ones(2, np.float32)
    try:
        for _ in range(300):  # rank 0 waits 10 ms each time: its waits sleep, and turn brief within 50 or so
            if rank == 1:
                time.sleep(10e-3)
            t0 = time.monotonic()  # when the call that fails began
            comm.all_reduce(x)
    except pycoll.CommFailure as e:
        return type(e).__name__, time.monotonic() - t0, str(e)
    return "no error", 0.0, ""


@pytest.mark.parametrize("action", ["kill", "stop"])
def test_a_rank_killed_or_stopped_where_a_brief_wait_begins_fails_its_peer(action, tmp_path):
    out = run_ranks(_killed_or_stopped_while_brief, 2, uid(), str(tmp_path), action, timeout=50, may_die=[0])
    assert isinstance(out[0], Died), out
    name, took, text = out[1]
    assert name != "no error" and took < 8 and "rank 0" in text, out
