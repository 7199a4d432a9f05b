"""Per-call overhead of an 8-byte allreduce on the host backend, layer by layer.

Usage (from the repository root, pycoll built in place or installed; needs gcc)::

    python benchmarks/overhead.py                  # 1 and 2 ranks
    python benchmarks/overhead.py --ranks 1 --batches 50 --batch 500 --json out.json
    python benchmarks/overhead.py --breakdown      # where the time of one call goes, stage by stage
    python benchmarks/overhead.py --instructions   # instructions per call, counted by valgrind's callgrind

Variants, all ``ncclAllReduce`` of 2 float32 (8 B, sum) with the NULL stream, so the host library
runs the operation in the calling thread:

* **C, blocking comm**: a small C program (compiled here with gcc, source below) that dlopens
  pycoll's host library, creates its communicator with ``ncclCommInitRank`` and calls
  ``ncclAllReduce`` through the function pointer in a loop.
* **C, nonblocking comm**: the same with ``ncclCommInitRankConfig(blocking=0)``, which is what
  pycoll creates (every pycoll communicator is nonblocking).
* **Cython binding**: ``Library.all_reduce(send_ptr, recv_ptr, 2, Float32, Sum, comm, 0)``.
* **Communicator.all_reduce (numpy)** and **(torch)**: ``comm.all_reduce(send, recv)`` on
  numpy arrays and on CPU torch tensors, through the one runtime path (start and end events on the
  communicator's stream, an outstanding Work): an idle host stream runs the blocking op in the
  caller's thread while the watchdog polls the communicator (pycoll's default).
* **async**: ``comm.all_reduce(send, recv, async_op=True).wait()`` (the stream's thread runs it; the
  caller blocks on the end event in C). **host stream**: ``stream=`` a host stream of the caller's.
  **watchdog off**: as with ``PYCOLL_WATCHDOG=0`` (nobody else enforces deadlines, so the stream's
  thread runs it).

1 rank isolates the cost of the call (the library still runs its whole protocol for one rank);
2 ranks add the synchronisation between two processes. Each variant is timed in batches of
``--batch`` consecutive calls (the clock is read once per batch, so timer cost is negligible);
with 2 ranks a batch counts the slower rank. The table gives the median over batches, in ns per
call, and the ratio to the C call on a nonblocking communicator; then a quarter as many calls are
timed one by one (the slower rank's time per call, median; it includes one clock read), which
shrugs off the scheduler hiccups a batch absorbs on a shared machine. Everything runs ``--repeat``
times, interleaved, and each cell is the median of the runs: on a shared 2-core machine the two
ranks sometimes land on one core for a whole run, which costs a context switch per handoff.
"""

from __future__ import annotations

import argparse
import ctypes
import gc
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from datetime import datetime, timezone
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
if HERE not in sys.path:  # also when loaded by file path, not run as a script
    sys.path.insert(0, HERE)
from _common import at_least, compile_c, env_with_pycoll, import_pycoll  # noqa: E402

C_DRIVER = r"""
/* Calls ncclAllReduce of pycoll's host library in a loop; prints "b NS" per batch, then
 * "c NS" per call for BATCHES*BATCH/4 individually timed calls. */
#include <dlfcn.h>
#include <limits.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

typedef struct { char internal[128]; } ncclUniqueId;
typedef void* ncclComm_t;
typedef struct { /* ncclConfig_t, NCCL 2.32 layout */
  size_t size; unsigned int magic, version; int blocking, cgaClusterSize, minCTAs, maxCTAs;
  const char* netName; int splitShare, trafficClass; const char* commName;
  int ints[15]; /* collnetEnable .. nvlsHostMode */
} config_t;
_Static_assert(sizeof(config_t) == 120, "ncclConfig_t is 120 bytes");

typedef int (*init_fn)(ncclComm_t*, int, ncclUniqueId, int);
typedef int (*init_config_fn)(ncclComm_t*, int, ncclUniqueId, int, config_t*);
typedef int (*async_fn)(ncclComm_t, int*);
typedef int (*allreduce_fn)(const void*, void*, size_t, int, int, ncclComm_t, void*);
typedef int (*comm_fn)(ncclComm_t);

static uint64_t now_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static void* sym(void* lib, const char* name) {
  void* p = dlsym(lib, name);
  if (!p) { fprintf(stderr, "driver: %s not found\n", name); exit(2); }
  return p;
}

static int wait_ready(async_fn get_async, ncclComm_t comm) {
  int state = 7;
  uint64_t deadline = now_ns() + 60ull * 1000000000ull;
  while (state == 7 /* ncclInProgress */) {
    if (get_async(comm, &state) != 0) return -1;
    if (now_ns() > deadline) return -1;
  }
  return state;
}

int main(int argc, char** argv) {
  if (argc != 9) {
    fprintf(stderr, "usage: %s LIB NRANKS RANK UID_HEX BLOCKING BATCHES BATCH WARMUP\n", argv[0]);
    return 2;
  }
  int nranks = atoi(argv[2]), rank = atoi(argv[3]), blocking = atoi(argv[5]);
  long batches = atol(argv[6]), batch = atol(argv[7]), warmup = atol(argv[8]);
  ncclUniqueId id;
  if (strlen(argv[4]) != 256) { fprintf(stderr, "driver: the unique id must be 256 hex digits\n"); return 2; }
  for (int i = 0; i < 128; i++) {
    unsigned v;
    sscanf(argv[4] + 2 * i, "%2x", &v);
    id.internal[i] = (char)v;
  }
  void* lib = dlopen(argv[1], RTLD_NOW | RTLD_LOCAL);
  if (!lib) { fprintf(stderr, "driver: %s\n", dlerror()); return 2; }
  allreduce_fn allreduce = (allreduce_fn)sym(lib, "ncclAllReduce");
  async_fn get_async = (async_fn)sym(lib, "ncclCommGetAsyncError");
  comm_fn destroy = (comm_fn)sym(lib, "ncclCommDestroy");
  ncclComm_t comm = NULL;
  int rc;
  if (blocking) {
    rc = ((init_fn)sym(lib, "ncclCommInitRank"))(&comm, nranks, id, rank);
  } else {
    config_t cfg;
    memset(&cfg, 0, sizeof cfg);
    cfg.size = sizeof cfg; cfg.magic = 0xcafebeef; cfg.version = 23203;
    cfg.cgaClusterSize = cfg.minCTAs = cfg.maxCTAs = cfg.splitShare = cfg.trafficClass = INT_MIN;
    for (int i = 0; i < 15; i++) cfg.ints[i] = INT_MIN;
    cfg.blocking = 0;
    rc = ((init_config_fn)sym(lib, "ncclCommInitRankConfig"))(&comm, nranks, id, rank, &cfg);
    if (rc == 7) rc = 0;
    if (rc == 0) rc = wait_ready(get_async, comm);
  }
  if (rc != 0) { fprintf(stderr, "driver: init failed: %d\n", rc); return 1; }
  float send[2] = {1.0f, 1.0f}, recv[2] = {0.0f, 0.0f};
  for (long i = 0; i < warmup; i++) rc |= allreduce(send, recv, 2, 7 /* float32 */, 0 /* sum */, comm, NULL);
  for (long b = 0; b < batches; b++) {
    uint64_t t0 = now_ns();
    for (long i = 0; i < batch; i++) rc |= allreduce(send, recv, 2, 7, 0, comm, NULL);
    printf("b %llu\n", (unsigned long long)(now_ns() - t0));
  }
  for (long i = 0; i < batches * batch / 4; i++) {
    uint64_t t0 = now_ns();
    rc |= allreduce(send, recv, 2, 7, 0, comm, NULL);
    printf("c %llu\n", (unsigned long long)(now_ns() - t0));
  }
  if (rc != 0 && rc != 7) { fprintf(stderr, "driver: ncclAllReduce returned %d\n", rc); return 1; }
  if (recv[0] != (float)nranks || recv[1] != (float)nranks) {
    fprintf(stderr, "driver: wrong result %g %g (expected %d)\n", recv[0], recv[1], nranks);
    return 1;
  }
  if (!blocking) wait_ready(get_async, comm);
  destroy(comm);
  return 0;
}
"""


def compile_driver(workdir: str) -> str:
    exe = compile_c(C_DRIVER, os.path.join(workdir, "allreduce_driver"), "-std=c11", "-D_POSIX_C_SOURCE=200809L",
                    "-ldl")
    if exe is None:
        raise RuntimeError("no C compiler (gcc/cc) on PATH")
    return exe


def run_c(exe: str, libpath: str, nranks: int, blocking: bool, a: argparse.Namespace) -> Dict[str, np.ndarray]:
    """Per-batch and per-call ns (the slower rank's each time) of the C driver."""
    from pycoll import _bindings

    uid = _bindings.load(libpath).get_unique_id().hex()
    procs = [subprocess.Popen([exe, libpath, str(nranks), str(r), uid, str(int(blocking)), str(a.batches),
                               str(a.batch), str(a.warmup)], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              text=True) for r in range(nranks)]
    outs = []
    try:
        for p in procs:
            out, err = p.communicate(timeout=a.timeout)
            if p.returncode != 0:
                raise RuntimeError(f"C driver failed ({p.returncode}): {err.strip()}")
            lines = [ln.split() for ln in out.splitlines()]
            outs.append({k: [float(v) for kk, v in lines if kk == k] for k in ("b", "c")})
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    return {"batch": np.max(np.array([o["b"] for o in outs]), axis=0),
            "call": np.max(np.array([o["c"] for o in outs]), axis=0)}


def worker(a: argparse.Namespace) -> None:
    import_pycoll()
    import pycoll

    comm = pycoll.init(backend="host", name="overhead")
    n, rank = comm.size, comm.rank
    lib, h = comm.library, comm.handle
    send, recv = np.ones(2, np.float32), np.zeros(2, np.float32)
    sp, rp = send.ctypes.data, recv.ctypes.data
    variants: Dict[str, Any] = {
        "binding": lambda: lib.all_reduce(sp, rp, 2, 7, 0, h, 0),
        "comm_numpy": lambda: comm.all_reduce(send, recv),
    }
    try:
        import torch

        ts, tr = torch.ones(2), torch.zeros(2)
        variants["comm_torch"] = lambda: comm.all_reduce(ts, tr)
    except ImportError:
        pass
    stream = comm.device.new_stream()
    variants["comm_async"] = lambda: comm.all_reduce(send, recv, async_op=True).wait()
    variants["comm_stream"] = lambda: comm.all_reduce(send, recv, stream=stream)
    variants["comm_no_watchdog"] = lambda: comm.all_reduce(send, recv)
    watchdog = pycoll.watchdog.get_watchdog()
    clock = time.perf_counter_ns
    result: Dict[str, Dict[str, List[float]]] = {}
    for name, call in variants.items():
        if name == "comm_no_watchdog":
            comm.barrier()
            watchdog.configure(enabled=False)  # as PYCOLL_WATCHDOG=0: nobody else enforces deadlines
            watchdog.stop()
        recv[:] = 0
        for _ in range(a.warmup):
            call()
        if name != "comm_torch" and not (recv == n).all():
            raise AssertionError(f"{name}: wrong result {recv} (expected {n})")
        comm.barrier()
        batches = np.empty(a.batches)
        for b in range(a.batches):
            t0 = clock()
            for _ in range(a.batch):
                call()
            batches[b] = clock() - t0
        calls = np.empty(a.batches * a.batch // 4)
        for i in range(calls.size):
            t0 = clock()
            call()
            calls[i] = clock() - t0
        mine = np.concatenate([batches, calls])
        everyone = np.empty(mine.size * n)
        comm.all_gather(mine, everyone)
        slowest = everyone.reshape(n, mine.size).max(axis=0)
        result[name] = {"batch": slowest[: a.batches].tolist(), "call": slowest[a.batches:].tolist()}
        if name == "comm_no_watchdog":
            watchdog.configure(enabled=True)
            watchdog.start()
    if rank == 0:  # a file: pycoll-run splits very long output lines
        with open(a.result_file, "w") as f:
            json.dump(result, f)
    comm.barrier()
    comm.destroy()


def run_python(nranks: int, a: argparse.Namespace, workdir: str) -> Dict[str, Dict[str, np.ndarray]]:
    result_file = os.path.join(workdir, f"python-{nranks}.json")
    env = env_with_pycoll()
    cmd = [sys.executable, "-m", "pycoll.run", "-n", str(nranks), "--no-prefix", "--timeout", str(a.timeout),
           os.path.abspath(__file__), "--worker", "--batches", str(a.batches), "--batch", str(a.batch),
           "--warmup", str(a.warmup), "--result-file", result_file]
    res = subprocess.run(cmd, env=env, stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=a.timeout + 10)
    if res.returncode != 0 or not os.path.exists(result_file):
        raise RuntimeError(f"python worker failed ({res.returncode}): {res.stderr.strip()[-800:]}")
    with open(result_file) as f:
        return {k: {kk: np.array(vv) for kk, vv in v.items()} for k, v in json.load(f).items()}


def breakdown(a: argparse.Namespace) -> Dict[str, float]:
    """Where the time of one blocking ``Communicator.all_reduce`` (8 B, 1 rank, defaults: watchdog and flight
    recorder with stacks on) goes, read on the path itself: the compiled operations' stage clock
    (``pycoll._core.stage_clock``) reads the monotonic clock where each stage ends, in the calling thread
    only. ``--batches`` batches of ``--batch`` calls, alternately with the clock off and on, the array kinds
    interleaved batch by batch; each figure is the median over batches of ns per call. Each stage includes
    one clock read: "clock reads" is what the clock added to the whole call (on minus off). "outside the
    stages" is the rest of the call with the clock on: the Python call of the method and its return, the
    Work's release by the caller. CPU torch tensors are described both ways the compiled path can (torch's
    DLPack C exchange API where this torch has it, the tensor's attributes:
    ``pycoll._core.torch_dlpack_view``). The bindings' call on the same arrays is the reference."""
    import_pycoll()
    import pycoll
    from pycoll import _core

    comm = pycoll.init(0, 1, unique_id=pycoll.get_unique_id(backend="host"), backend="host", name="breakdown")
    # (label, input, output, whether torch tensors are described through torch's DLPack C exchange API)
    arrays: List[Tuple[str, Any, Any, Optional[bool]]] = [
        ("numpy", np.ones(2, np.float32), np.zeros(2, np.float32), None)]
    try:
        import torch

        view_before = _core.torch_dlpack_view()
        for view in [True, False] if view_before else [False]:
            arrays.append((f"torch, {'DLPack view' if view else 'attributes'}", torch.ones(2), torch.zeros(2), view))
    except ImportError:
        view_before = None
    lib, h = comm.library, comm.handle
    sp, rp = arrays[0][1].ctypes.data, arrays[0][2].ctypes.data
    clock = time.perf_counter_ns
    out: Dict[str, float] = {}

    def batch(fn: Any) -> float:
        t0 = clock()
        for _ in range(a.batch):
            fn()
        return (clock() - t0) / a.batch

    def call_with(x: Any, y: Any) -> Callable[[], Any]:
        return lambda: comm.all_reduce(x, y)

    calls = {kind: call_with(x, y) for kind, x, y, _ in arrays}
    off: Dict[str, List[float]] = {kind: [] for kind in calls}
    on: Dict[str, List[float]] = {kind: [] for kind in calls}
    stages: Dict[str, List[Dict[str, float]]] = {kind: [] for kind in calls}
    try:
        for kind, _, _, view in arrays:
            if view is not None:
                _core.torch_dlpack_view(view)
            for _ in range(a.warmup):
                calls[kind]()
        for _ in range(a.batches):  # the variants interleaved, batch by batch: the machine's drift hits them alike
            for kind, _, _, view in arrays:
                if view is not None:
                    _core.torch_dlpack_view(view)
                off[kind].append(batch(calls[kind]))
                _core.stage_clock(True)
                on[kind].append(batch(calls[kind]))
                counted = _core.stage_clock(False)
                ops = counted.pop("operations")
                stages[kind].append({k: v / ops for k, v in counted.items()})
        for kind in calls:
            out[f"total: comm.all_reduce({kind}), clock off"] = float(np.median(off[kind]))
            total_on = float(np.median(on[kind]))
            parts = {k: float(np.median([st[k] for st in stages[kind]])) for k in _core.STAGES}
            if kind == "numpy":
                for k, v in parts.items():
                    out[k] = v
                out["outside the stages (method call and return, Work released)"] = total_on - sum(parts.values())
                out[f"clock reads ({len(parts) + 1} per call, inside the stages)"] = total_on - out[
                    "total: comm.all_reduce(numpy), clock off"]
            else:
                out[f"buffer description ({kind})"] = parts["buffer description"]
        out["reference: bindings' Library.all_reduce alone"] = float(np.median(
            [batch(lambda: lib.all_reduce(sp, rp, 2, 7, 0, h, 0)) for _ in range(a.batches)]))
        out.update(group_costs(comm, a, batch))
        out.update(argument_costs(comm, a, batch))
    finally:
        _core.stage_clock(False)
        if view_before is not None:
            _core.torch_dlpack_view(view_before)
        comm.destroy()
    return out


def interleaved(calls: Dict[str, Callable[[], Any]], a: argparse.Namespace,
                batch: Callable[[Any], float]) -> Dict[str, float]:
    """Each call warmed up, then timed batch by batch with the others interleaved (the machine's drift hits them
    alike); ns per call, the median of the batches."""
    times: Dict[str, List[float]] = {k: [] for k in calls}
    for fn in calls.values():
        for _ in range(a.warmup):
            fn()
    for _ in range(a.batches):
        for k, fn in calls.items():
            times[k].append(batch(fn))
    return {k: float(np.median(v)) for k, v in times.items()}


def group_costs(comm: Any, a: argparse.Namespace, batch: Callable[[Any], float]) -> Dict[str, float]:
    """What a ``with comm.group():`` adds: the group alone, one and four blocking all_reduce in it, and the
    bindings' ``group_start`` + ``group_end`` under it; batches interleaved, ns per group (median)."""
    lib = comm.library
    bufs = [(np.ones(2, np.float32), np.zeros(2, np.float32)) for _ in range(4)]

    def grouped(k: int) -> Callable[[], None]:
        def run() -> None:
            with comm.group():
                for x, y in bufs[:k]:
                    comm.all_reduce(x, y)
        return run

    def bindings_group() -> None:
        lib.group_start()
        lib.group_end()

    calls = {"group: `with comm.group(): pass`": grouped(0),
             "group: bindings' group_start() + group_end()": bindings_group,
             "group: one all_reduce in a group": grouped(1),
             "group: four all_reduce in a group": grouped(4)}
    return interleaved(calls, a, batch)


def argument_costs(comm: Any, a: argparse.Namespace, batch: Callable[[Any], float]) -> Dict[str, float]:
    """The same all_reduce with the per-call arguments users pass: another operator by name and by ``RedOp``, a
    ``timeout=`` of its own, an async call waited for with a ``timeout=`` and one never waited for; a reduce_scatter
    out of place and in place, an all_gather in place; batches interleaved, ns per call (median)."""
    from pycoll._bindings import RedOp

    x, y = np.ones(2, np.float32), np.zeros(2, np.float32)
    calls = {"arguments: all_reduce(x, y), for scale": lambda: comm.all_reduce(x, y),
             "arguments: op='max'": lambda: comm.all_reduce(x, y, op="max"),
             "arguments: op=RedOp.Max": lambda: comm.all_reduce(x, y, op=RedOp.Max),
             "arguments: timeout=5.0": lambda: comm.all_reduce(x, y, timeout=5.0),
             "arguments: async_op=True, then wait(timeout=5.0)":
                 lambda: comm.all_reduce(x, y, async_op=True).wait(timeout=5.0),
             "arguments: async_op=True, the Work dropped": lambda: comm.all_reduce(x, y, async_op=True),
             "arguments: reduce_scatter(x, y)": lambda: comm.reduce_scatter(x, y),
             "arguments: reduce_scatter(x), in place": lambda: comm.reduce_scatter(x),
             "arguments: all_gather(None, x), in place": lambda: comm.all_gather(None, x)}
    return interleaved(calls, a, batch)


CALLGRIND_CONTROL = r"""
/* Callgrind's client requests (valgrind/callgrind.h) for the instruction counts: zero the counters before a
 * variant's loop, dump them (labelled) after it. Outside valgrind they do nothing. */
#include <valgrind/callgrind.h>
void pycoll_cg_zero(void) { CALLGRIND_ZERO_STATS; }
void pycoll_cg_dump(const char* label) { CALLGRIND_DUMP_STATS_AT(label); }
"""


def instruction_variants(comm: Any) -> Dict[str, Callable[[], Any]]:
    """The calls ``--instructions`` counts, on a 1-rank host communicator (8 B, float32, sum)."""
    x, y, b = np.ones(2, np.float32), np.zeros(2, np.float32), np.zeros(2, np.float32)
    lib, h = comm.library, comm.handle
    xp, yp = x.ctypes.data, y.ctypes.data

    def pair() -> None:
        with comm.group():
            comm.send(x, 0)
            comm.recv(y, 0)

    def empty_group() -> None:
        with comm.group():
            pass

    def group4() -> None:
        with comm.group():
            comm.all_reduce(x, y)
            comm.all_reduce(x, y)
            comm.all_reduce(x, y)
            comm.all_reduce(x, y)

    variants: Dict[str, Callable[[], Any]] = {
        "loop (subtracted from the others)": lambda: None,
        "bindings: Library.all_reduce": lambda: lib.all_reduce(xp, yp, 2, 7, 0, h, 0),
        "bindings: group_start() + group_end()": lambda: (lib.group_start(), lib.group_end()),
        "all_reduce numpy": lambda: comm.all_reduce(x, y),
    }
    try:
        import torch

        t = torch.ones(2)
        variants["all_reduce torch, in place"] = lambda: comm.all_reduce(t)
    except ImportError:
        pass
    variants.update({
        "all_reduce async, then wait": lambda: comm.all_reduce(x, y, async_op=True).wait(),
        "broadcast": lambda: comm.broadcast(b, root=0),
        "sendrecv": lambda: comm.sendrecv(x, y, 0),
        "send/recv pair in a group": pair,
        "group of 4 all_reduce": group4,
        "with comm.group(): pass": empty_group,
    })
    return variants


def instructions(a: argparse.Namespace) -> Dict[str, float]:
    """Instructions per call of the :func:`instruction_variants`, counted by valgrind's callgrind in a child process
    (:func:`count_instructions`): exact and independent of the machine's load and speed, so that a change of a few
    percent shows on a noisy VM where the clock cannot (the instructions are not the time: a cache miss or a lock's
    contention costs time, not instructions). Python's hash seed is fixed: two runs of one build agree within a few
    tens of instructions per call."""
    valgrind = shutil.which("valgrind")
    if valgrind is None:
        raise SystemExit("--instructions needs valgrind (callgrind) on the PATH")
    with tempfile.TemporaryDirectory(prefix="pycoll-instructions-") as tmp:
        env = dict(env_with_pycoll(), PYCOLL_BENCH_CG_DIR=tmp, PYTHONHASHSEED="0")
        child = [sys.executable, os.path.abspath(__file__), "--count-instructions", "--batch", str(a.batch),
                 "--batches", str(a.batches), "--warmup", str(a.warmup)]
        r = subprocess.run([valgrind, "--tool=callgrind", "--separate-threads=yes",
                            f"--callgrind-out-file={os.path.join(tmp, 'cg.out')}", *child], env=env,
                           stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, timeout=a.timeout * 20)
        if r.returncode != 0:  # the child's own words (valgrind's lines around them left out)
            said = [ln for ln in r.stderr.decode(errors="replace").splitlines() if not ln.startswith("==")]
            raise SystemExit(f"--instructions: the counting child failed ({r.returncode}): "
                             + ("\n".join(said[-5:]) or "no message"))
        with open(os.path.join(tmp, "counts.json")) as f:
            return dict(json.load(f))


def count_instructions(a: argparse.Namespace) -> None:
    """The child of :func:`instructions`, under callgrind: per variant, ``--warmup`` calls, a garbage collection,
    the counters zeroed, ``--batch`` x ``--batches`` / 10 calls, the counters dumped; the empty loop's count
    subtracted. The counts go to ``counts.json`` in ``$PYCOLL_BENCH_CG_DIR``, beside callgrind's dumps."""
    folder = os.environ["PYCOLL_BENCH_CG_DIR"]
    ctl = compile_c(CALLGRIND_CONTROL, os.path.join(folder, "libcgctl.so"), "-shared", "-fPIC")
    if ctl is None:
        raise SystemExit("--instructions needs gcc (and valgrind's headers)")
    cg = ctypes.CDLL(ctl)
    cg.pycoll_cg_dump.argtypes = [ctypes.c_char_p]
    import_pycoll()
    import pycoll

    comm = pycoll.init(0, 1, unique_id=pycoll.get_unique_id(backend="host"), backend="host", name="instructions")
    calls = max(1, a.batch * a.batches // 10)
    totals: Dict[str, float] = {}
    try:
        for i, (label, f) in enumerate(instruction_variants(comm).items()):
            for _ in range(a.warmup):
                f()
            gc.collect()  # the counted calls start with the collector's generations empty: no full collection of
            cg.pycoll_cg_zero()  # everything the imports made lands in one variant's 1,000 calls (55,000 a call once)
            for _ in range(calls):
                f()
            cg.pycoll_cg_dump(f"variant {i}".encode())
            totals[label] = float(_dumped_total(folder, i))
    finally:
        comm.destroy()
    loop = totals.pop("loop (subtracted from the others)")
    with open(os.path.join(folder, "counts.json"), "w") as f:
        json.dump({k: (v - loop) / calls for k, v in totals.items()}, f)


def _dumped_total(directory: str, i: int) -> int:
    """The instruction total of this (the main) thread in callgrind's dump labelled ``variant i`` (the dumps go
    beside ``cg.out``, a file per thread: the library's threads, which wait by the clock, are left out)."""
    for name in os.listdir(directory):
        if not (name.startswith("cg.out") and name.endswith("-01")):
            continue
        with open(os.path.join(directory, name)) as f:
            text = f.read()
        if f"Client Request: variant {i}\n" in text:
            for line in text.splitlines():
                if line.startswith(("summary:", "totals:")):
                    return int(line.split()[1])
    raise RuntimeError(f"callgrind wrote no dump for variant {i}")


def print_instructions(counts: Dict[str, float]) -> None:
    print("# instructions per call, 1 rank, host backend, defaults (watchdog and flight recorder with stacks on), "
          "counted by callgrind (the empty loop subtracted)")
    width = max(len(k) for k in counts)
    for k, v in counts.items():
        print(f"{k.ljust(width)}  {v:>10,.0f}")


def print_breakdown(out: Dict[str, float]) -> None:
    w = max(len(k) for k in out)
    print(f"# one blocking Communicator.all_reduce of 8 B, 1 rank, host backend, defaults; ns per call, median "
          f"of batches; the stages as the path's own clock reads them (each includes one clock read); load "
          f"average {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    for k, v in out.items():
        print(f"{k.ljust(w)}  {v:9,.0f}")


LABELS = {
    "c_blocking": "C ncclAllReduce, blocking comm",
    "c_nonblocking": "C ncclAllReduce, nonblocking comm",
    "binding": "Cython Library.all_reduce",
    "comm_numpy": "Communicator.all_reduce (numpy)",
    "comm_torch": "Communicator.all_reduce (torch)",
    "comm_async": "Communicator.all_reduce(async_op=True).wait() (numpy)",
    "comm_stream": "Communicator.all_reduce on a host stream of the caller's (numpy)",
    "comm_no_watchdog": "Communicator.all_reduce, watchdog off (PYCOLL_WATCHDOG=0) (numpy)",
}


def main(argv: Optional[Sequence[str]] = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--ranks", type=at_least(1), nargs="+", default=[1, 2], help="rank counts (default 1 2)")
    p.add_argument("--batches", type=at_least(1), default=40, help="timed batches per variant (default 40)")
    p.add_argument("--batch", type=at_least(1), default=250, help="calls per batch (default 250)")
    p.add_argument("--warmup", type=at_least(1), default=500,
                   help="untimed calls first, the first checked for its result (default 500)")
    p.add_argument("--repeat", type=at_least(1), default=3,
                   help="run everything this many times, interleaved; report the median of the runs (default 3)")
    p.add_argument("--timeout", type=float, default=120.0, help="seconds per run (default 120)")
    p.add_argument("--json", help="write the per-batch numbers to this JSON file")
    p.add_argument("--markdown", help="write the table as markdown to this file")
    p.add_argument("--breakdown", action="store_true",
                   help="print where the time of one call goes, stage by stage (1 rank, this process)")
    p.add_argument("--instructions", action="store_true",
                   help="count the instructions of one call of each variant with valgrind's callgrind (1 rank)")
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--count-instructions", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--result-file", help=argparse.SUPPRESS)
    a = p.parse_args(argv)
    if a.worker:
        worker(a)
        return 0
    if a.count_instructions:
        count_instructions(a)
        return 0
    if a.instructions:
        counts = instructions(a)
        print_instructions(counts)
        if a.json:
            with open(a.json, "w") as f:
                json.dump({"instructions_per_call": counts}, f, indent=2)
        return 0
    if a.breakdown:
        out = breakdown(a)
        print_breakdown(out)
        if a.json:
            with open(a.json, "w") as f:
                json.dump({"breakdown_ns": out, "loadavg": os.getloadavg()}, f, indent=2)
        return 0
    import_pycoll()
    from pycoll import _bindings

    libpath = _bindings.load("host").path
    started = datetime.now(timezone.utc).isoformat(timespec="seconds")
    load0 = os.getloadavg()
    # per rank count, per variant: one (batch ns/call, median call ns) pair per run
    runs: Dict[int, Dict[str, List[Tuple[float, float]]]] = {n: {} for n in a.ranks}
    with tempfile.TemporaryDirectory(prefix="pycoll-overhead-") as tmp:
        exe = compile_driver(tmp)
        for _ in range(max(1, a.repeat)):
            for n in a.ranks:
                got: Dict[str, Dict[str, np.ndarray]] = {}
                got["c_blocking"] = run_c(exe, libpath, n, True, a)
                got["c_nonblocking"] = run_c(exe, libpath, n, False, a)
                got.update(run_python(n, a, tmp))
                for k, v in got.items():
                    runs[n].setdefault(k, []).append((float(np.median(v["batch"])) / a.batch,
                                                      float(np.median(v["call"]))))
    load1 = os.getloadavg()
    ns = {n: {k: float(np.median([x[0] for x in v])) for k, v in r.items()} for n, r in runs.items()}
    call_ns = {n: {k: float(np.median([x[1] for x in v])) for k, v in r.items()} for n, r in runs.items()}
    head = ["variant"]
    for n in a.ranks:
        r = f"{n} rank{'s' if n > 1 else ''}"
        head += [f"{r}: ns/call", "x C", f"{r}: median call ns"]
    body = []
    for key, label in LABELS.items():
        row = [label]
        for n in a.ranks:
            v, ref, c = ns[n].get(key), ns[n].get("c_nonblocking"), call_ns[n].get(key)
            row += ["-", "-", "-"] if v is None else [f"{v:,.0f}", f"{v / ref:.2f}" if ref else "-", f"{c:,.0f}"]
        body.append(row)
    widths = [max(len(h), *(len(r[i]) for r in body)) for i, h in enumerate(head)]
    print(f"# ncclAllReduce of 8 B (2 float32, sum), host backend, NULL stream -- {started}; "
          f"load average before {' '.join(f'{x:.2f}' for x in load0)}, after {' '.join(f'{x:.2f}' for x in load1)}")
    print(f"# ns/call: median over {a.batches} batches of {a.batch} calls (slower rank per batch) / {a.batch}, "
          f"median of {a.repeat} interleaved runs; "
          "'x C': ratio to the C call on a nonblocking communicator (what pycoll creates); "
          f"median call: median of {a.batches * a.batch // 4} calls timed one by one (includes one clock read)")
    print("  ".join(h.ljust(widths[0]) if i == 0 else h.rjust(widths[i]) for i, h in enumerate(head)))
    for r in body:
        print("  ".join(c.ljust(widths[0]) if i == 0 else c.rjust(widths[i]) for i, c in enumerate(r)))
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"started": started, "loadavg_before": load0, "loadavg_after": load1, "batch": a.batch,
                       "ns_per_call": {str(n): v for n, v in ns.items()},
                       "median_call_ns": {str(n): v for n, v in call_ns.items()},
                       "runs": {str(n): {k: [list(x) for x in v] for k, v in r.items()} for n, r in runs.items()}},
                      f, indent=2)
    if a.markdown:
        with open(a.markdown, "w") as f:
            f.write("| " + " | ".join(head) + " |\n|" + "---|" + "---:|" * (len(head) - 1) + "\n")
            for r in body:
                f.write("| " + " | ".join(r) + " |\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
