"""Python side of benchmarks/gpu_check.sh: the environment report and the per-call overhead on a GPU.

Usage::

    python benchmarks/gpu_check.py env --out DIR        # env.json: versions, GPUs, which libnccl pycoll loads
    python benchmarks/gpu_check.py overhead --out DIR   # overhead.json / overhead.txt

The overhead check times an 8-byte allreduce (2 float32, sum) on one rank and one GPU, issued
from Python on torch's current stream, by:

* **pycoll bindings**: ``Library.all_reduce(ptr, ptr, 2, Float32, Sum, comm, stream)``, the stream read from
  torch as the Communicator reads it (``torch._C._cuda_getCurrentRawStream``);
* **pycoll Communicator, async_op=True**: ``comm.all_reduce(x, async_op=True)`` -- returns once the
  operation is queued, like torch.distributed's call; once with its Works kept and waited for, once with them
  dropped (retired by the issuing thread's looks at every eighth operation and the watchdog);
* **pycoll Communicator, blocking**: ``comm.all_reduce(x)`` -- waits until the GPU has finished;
* the Communicator's two forms again with its GPU calls through the runtime module (``_core.gpu_driver_calls(False)``:
  cuda-bindings' Python layer for the event records and queries, the capture check and the current device)
  and torch tensors described by the general path (``_core.torch_dlpack_view(False)``): the path before the
  driver table, in rounds alternated with the current one (``old`` / ``new``);
* **torch.distributed NCCL**: ``dist.all_reduce(x)`` on a one-rank ``nccl`` process group, and the same
  followed by a synchronisation of torch's stream per call (what a blocking Communicator call includes);
* **nccl4py**, when it is installed (its API is tried defensively; a failure is recorded, not fatal).

and writes where the Communicator's asynchronous call spends its host time (cProfile, own time per
function) to ``overhead_profile.txt``.

pycoll and torch use the same libnccl here: torch loads its own when imported, and pycoll's
loader takes the libnccl already loaded. For each variant: ``enqueue_ns`` is the host time to
issue one call (a batch of calls, divided), ``total_ns`` adds waiting for the batch to finish;
median over batches. Every call here returns a result or raises; nothing waits without a deadline.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import time
import traceback
from typing import Any, Callable, Dict, List, Optional, Sequence


def _write(out: str, name: str, data: Any) -> None:
    with open(os.path.join(out, name), "w") as f:
        if isinstance(data, str):
            f.write(data)
        else:
            json.dump(data, f, indent=2, default=str)


def _try(fn: Callable[[], Any]) -> Any:
    try:
        return fn()
    except Exception as exc:  # the report must never stop at a missing piece
        return f"unavailable: {type(exc).__name__}: {exc}"


def env_report(out: str) -> Dict[str, Any]:
    from importlib import metadata

    def dist_versions() -> Dict[str, str]:
        keep = ("torch", "cupy", "cuda", "nvidia-nccl", "nccl4py", "pycoll", "cython", "numpy", "pytest")
        found = {}
        for d in metadata.distributions():
            name = (d.metadata.get("Name") or "").lower()
            if any(name.startswith(k) for k in keep):
                found[name] = d.version
        return dict(sorted(found.items()))

    def smi() -> str:
        res = subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version,memory.total,compute_cap",
                              "--format=csv,noheader"], capture_output=True, text=True, timeout=20)
        return res.stdout.strip() or res.stderr.strip()

    def torch_info() -> Dict[str, Any]:
        import torch

        info = {"version": torch.__version__, "cuda": torch.version.cuda, "available": torch.cuda.is_available()}
        if torch.cuda.is_available():
            info["device"] = torch.cuda.get_device_name(0)
            info["nccl"] = ".".join(map(str, torch.cuda.nccl.version()))
        return info

    def pycoll_info() -> Any:
        import pycoll
        from pycoll import info

        return {"version": pycoll.__version__, "file": pycoll.__file__, "libraries": info.probe_all()}

    report = {
        "python": sys.version,
        "platform": platform.platform(),
        "nvidia_smi": _try(smi),
        "distributions": _try(dist_versions),
        "pycoll": _try(pycoll_info),
        "torch": _try(torch_info),
    }
    _write(out, "env.json", report)
    return report


def _median(xs: List[float]) -> float:
    s = sorted(xs)
    n = len(s)
    return s[n // 2] if n % 2 else 0.5 * (s[n // 2 - 1] + s[n // 2])


def _time(issue: Callable[[], Any], finish: Callable[[List[Any]], None], calls: int, batches: int,
          warmup: int) -> Dict[str, float]:
    """Median per-call host time to issue (enqueue_ns) and to issue and finish (total_ns)."""
    pending = [issue() for _ in range(warmup)]
    finish(pending)
    enq, tot = [], []
    clock = time.perf_counter_ns
    for _ in range(batches):
        t0 = clock()
        pending = [issue() for _ in range(calls)]
        t1 = clock()
        finish(pending)
        t2 = clock()
        enq.append((t1 - t0) / calls)
        tot.append((t2 - t0) / calls)
    return {"enqueue_ns": _median(enq), "total_ns": _median(tot), "calls": calls, "batches": batches}


def overhead(out: str, calls: int, batches: int) -> Dict[str, Any]:
    os.environ.setdefault("NCCL_SOCKET_IFNAME", "lo")
    import torch

    import pycoll

    dev = torch.device("cuda", 0)
    torch.cuda.set_device(dev)
    x = torch.ones(2, device=dev)
    sync = lambda pending: torch.cuda.synchronize(dev)  # noqa: E731
    results: Dict[str, Any] = {}

    comm = pycoll.init(0, 1, backend="nccl", device=0, timeout=60, init_timeout=60, name="overhead")
    lib, h = comm.library, comm.handle
    results["libnccl"] = {"path": lib.path, "version": ".".join(map(str, lib.version_tuple))}
    results["driver"] = repr(comm.device.driver)
    try:
        ptr = x.data_ptr()
        raw_stream = getattr(torch._C, "_cuda_getCurrentRawStream", None)  # torch's current stream in one C call
        current = ((lambda: raw_stream(0)) if raw_stream is not None
                   else (lambda: torch.cuda.current_stream(dev).cuda_stream))

        def raw() -> None:
            status = lib.all_reduce(ptr, ptr, 2, 7, 0, h, current())
            if status == 7:  # nonblocking communicator still setting up: poll, with a deadline
                deadline = time.monotonic() + 60
                while lib.comm_get_async_error(h) == 7:
                    if time.monotonic() > deadline:
                        raise TimeoutError("ncclAllReduce stayed in progress for 60 s")

        results["pycoll bindings"] = _try(lambda: _time(raw, sync, calls, batches, 50))

        def finish_works(works: List[Any]) -> None:
            for w in works:
                w.wait(timeout=60)
            torch.cuda.synchronize(dev)

        from pycoll import _core

        def paths(new: bool) -> None:
            _core.gpu_driver_calls(new)
            _core.torch_dlpack_view(new)

        rounds: Dict[str, List[Dict[str, float]]] = {}
        try:
            for _ in range(5):  # old and new alternated: the machine's drift falls on both
                for label, new in (("", True), (" (old path)", False)):
                    paths(new)
                    for name, issue, finish, n in (
                            ("async_op=True", lambda: comm.all_reduce(x, async_op=True), finish_works, calls),
                            ("async_op=True, the Work dropped", lambda: comm.all_reduce(x, async_op=True) and None,
                             sync, calls),
                            ("blocking", lambda: comm.all_reduce(x), sync, max(1, calls // 5))):
                        r = _try(lambda i=issue, f=finish, k=n: _time(i, f, k, batches, 20))
                        if isinstance(r, dict):
                            rounds.setdefault(f"pycoll Communicator {name}{label}", []).append(r)
        finally:
            paths(True)
        for name, rs in rounds.items():
            results[name] = {k: _median([r[k] for r in rs]) for k in ("enqueue_ns", "total_ns")}
            results[name].update(calls=rs[0]["calls"], batches=rs[0]["batches"], rounds=len(rs))
        _try(lambda: _profile(out, lambda: comm.all_reduce(x, async_op=True), finish_works, calls))
        results["pieces"] = _try(lambda: _pieces(comm, x, torch))
        results["stages"] = _try(lambda: _stages(comm, x, torch))
    finally:
        comm.destroy()

    def torch_dist() -> Dict[str, float]:
        import torch.distributed as dist

        store = dist.HashStore()
        try:
            dist.init_process_group("nccl", store=store, rank=0, world_size=1, device_id=dev)
        except TypeError:  # torch without device_id
            dist.init_process_group("nccl", store=store, rank=0, world_size=1)
        try:
            stream = torch.cuda.current_stream(dev)

            def synced() -> None:
                dist.all_reduce(x)
                stream.synchronize()

            return {"plain": _time(lambda: dist.all_reduce(x), sync, calls, batches, 50),
                    "synced": _time(synced, sync, max(1, calls // 5), batches, 20)}
        finally:
            dist.destroy_process_group()

    ran = _try(torch_dist)
    results["torch.distributed nccl"] = ran["plain"] if isinstance(ran, dict) else ran
    results["torch.distributed nccl + stream sync"] = ran["synced"] if isinstance(ran, dict) else ran
    results["nccl4py"] = _try(lambda: _nccl4py(x, dev, sync, calls, batches))
    ref = results.get("torch.distributed nccl")
    lines = [(f"# 8-byte allreduce, 1 rank, {torch.cuda.get_device_name(dev)}, libnccl {results['libnccl']}, "
              f"driver table {results['driver']}"),
             "# enqueue: host ns per call to issue it; total: issue + finish the batch; median over batches",
             f"{'variant':64s} {'enqueue ns':>11s} {'total ns':>10s} {'enqueue / torch':>16s}"]
    for name, r in results.items():
        if name in ("libnccl", "pieces", "driver", "stages"):
            continue
        if not isinstance(r, dict):
            lines.append(f"{name:64s} {r}")
            continue
        ratio = (f"{r['enqueue_ns'] / ref['enqueue_ns']:.2f}" if isinstance(ref, dict) and ref["enqueue_ns"] else "-")
        lines.append(f"{name:64s} {r['enqueue_ns']:11,.0f} {r['total_ns']:10,.0f} {ratio:>16s}")
    for key, title in (("pieces", "the pieces of one operation's path: host ns per call, median of 5 rounds"),
                       ("stages", ("a blocking comm.all_reduce(x) by stage (_core.stage_clock): host ns per call, "
                                  "median of 5"))):
        found = results.get(key)
        if isinstance(found, dict):
            lines.append(f"# {title}")
            lines.extend(f"{name:52s} {ns:9,.0f}" for name, ns in found.items())
        else:
            lines.append(f"{key}: {found}")
    text = "\n".join(lines) + "\n"
    _write(out, "overhead.json", results)
    _write(out, "overhead.txt", text)
    sys.stdout.write(text)
    return results


def _pieces(comm: Any, x: Any, torch: Any, n: int = 20000) -> Dict[str, float]:
    """Host ns per call of the pieces of one operation's path on this GPU (median of 5 rounds of ``n``)."""
    from pycoll import _core
    from pycoll.buffers import as_buffer

    dev = comm.device
    stream = torch.cuda.current_stream().cuda_stream
    ev = dev.create_event()
    raw = getattr(torch._C, "_cuda_getCurrentRawStream", None)
    drv = dev.driver
    pieces: Dict[str, Callable[[], Any]] = {
        "_core.buf(tensor) (compiled, DLPack view)": lambda: _core.buf(comm, x, stream, writable=True, name="x"),
        "_core.begin(tensor) (the stream chosen)": lambda: _core.begin(comm, "all_reduce", None, False, (x, x)),
        "torch.cuda.current_stream().cuda_stream": lambda: torch.cuda.current_stream(x.device).cuda_stream,
        "torch._C._cuda_getCurrentRawStream": (lambda: raw(0)) if raw is not None else (lambda: None),
        "as_buffer(tensor, stream=current)": lambda: as_buffer(x, stream=stream),
        "device.resolve_stream(None, [tensor])": lambda: dev.resolve_stream(None, [x]),
        "device.record_event (cudaEventRecord)": lambda: dev.record_event(ev, stream),
        "device.query_event (cudaEventQuery)": lambda: dev.query_event(ev),
        "device.capture_status (cudaStreamGetCaptureInfo)": lambda: dev.capture_status(stream),
        "device.swap_current + restore_current": lambda: dev.restore_current(dev.swap_current()),
    }
    if drv is not None:  # the same calls through the driver table (from Python: a method call more than _core's)
        pieces.update({
            "driver.record (cuEventRecord)": lambda: drv.record(ev, stream),
            "driver.query (cuEventQuery)": lambda: drv.query(ev),
            "driver.capture_status (cuStreamIsCapturing)": lambda: drv.capture_status(stream),
            "driver.current_device (cuCtxGetDevice)": lambda: drv.current_device(),
        })
    found: Dict[str, float] = {}
    clock = time.perf_counter_ns
    try:
        for name, fn in pieces.items():
            rounds = []
            for _ in range(5):
                t0 = clock()
                for _ in range(n):
                    fn()
                rounds.append((clock() - t0) / n)
            found[name] = _median(rounds)
    finally:
        torch.cuda.synchronize()
        dev.destroy_event(ev)
    return found


def _stages(comm: Any, x: Any, torch: Any, n: int = 2000) -> Dict[str, float]:
    """Where a blocking ``comm.all_reduce(x)`` spends its host time, stage by stage (``_core.stage_clock``, the
    clock of ``benchmarks/overhead.py --breakdown``): ns per call, median of 5 rounds of ``n``."""
    from pycoll import _core

    rounds = []
    try:
        for _ in range(5):
            _core.stage_clock(True)
            for _ in range(n):
                comm.all_reduce(x)
            counted = _core.stage_clock(False)
            ops = counted.pop("operations")
            rounds.append({k: v / ops for k, v in counted.items()})
    finally:
        _core.stage_clock(False)
        torch.cuda.synchronize()
    return {k: _median([r[k] for r in rounds]) for k in _core.STAGES}


def _profile(out: str, issue: Callable[[], Any], finish: Callable[[List[Any]], None], calls: int) -> None:
    """Where the host time of ``calls`` issues goes: cProfile's top functions by own time, in overhead_profile.txt."""
    import cProfile
    import io
    import pstats

    prof = cProfile.Profile()
    prof.enable()
    pending = [issue() for _ in range(calls)]
    prof.disable()
    finish(pending)
    text = io.StringIO()
    pstats.Stats(prof, stream=text).sort_stats("tottime").print_stats(40)
    _write(out, "overhead_profile.txt", f"# {calls} calls of comm.all_reduce(x, async_op=True) under cProfile\n"
           + text.getvalue())


def _nccl4py(x: Any, dev: Any, sync: Callable[[List[Any]], None], calls: int, batches: int) -> Dict[str, float]:
    """nccl4py's Communicator, if installed. Its API is not pinned here: any mismatch is reported."""
    import torch
    from nccl import core as nc  # nccl4py's Pythonic layer

    uid = nc.get_unique_id()
    comm = nc.Communicator.init(1, 0, uid)
    try:
        op = getattr(nc, "SUM", None) or getattr(getattr(nc, "RedOp", None), "Sum", None) or "sum"
        stream = torch.cuda.current_stream(dev).cuda_stream
        return _time(lambda: comm.all_reduce(x, x, op, stream=stream), sync, calls, batches, 50)
    finally:
        comm.destroy()


def main(argv: Optional[Sequence[str]] = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("what", choices=("env", "overhead"))
    p.add_argument("--out", default=os.environ.get("OUT", "."), help="directory for the result files")
    p.add_argument("--calls", type=int, default=500, help="calls per batch (overhead; default 500)")
    p.add_argument("--batches", type=int, default=7, help="batches per variant (overhead; default 7)")
    a = p.parse_args(argv)
    os.makedirs(a.out, exist_ok=True)
    try:
        if a.what == "env":
            json.dump(env_report(a.out), sys.stdout, indent=2, default=str)
            sys.stdout.write("\n")
        else:
            overhead(a.out, a.calls, a.batches)
    except Exception:
        _write(a.out, f"{a.what}_error.txt", traceback.format_exc())
        traceback.print_exc()
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
