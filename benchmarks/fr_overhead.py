"""Cost of the flight recorder and the watchdog: per recorded operation, and on an 8 B allreduce.

Usage (from the repository root, pycoll built in place or installed)::

    python benchmarks/fr_overhead.py                        # 2 ranks, table + benchmarks/results/fr_overhead.json
    python benchmarks/fr_overhead.py --ranks 2 --rounds 10 --batch 400 --json out.json

Part 1, **recording cost per operation**, in this process: ``FlightRecorder.work_enqueued`` (what
the communicator calls for every operation) and ``work_completed`` (what it calls when the
operation completes) on a new :class:`pycoll.Work` of a one-rank host communicator each time,
called from 40 frames deep so that the stack capture takes its full default
depth (16 frames; the runs of 2026-12-02 and 12-03 captured one more). Timed in batches of 1000
calls, interleaved with batches that only make the Works (subtracted); median over batches, in ns per call.

Part 2, **8 B allreduce** (2 float32, sum) on the host backend with ``--ranks`` processes, the
blocking call that the host library runs in the caller's thread, in five configurations that are
interleaved round by round in the same processes (so machine noise hits them alike):

* baseline: recording off and no watchdog threads,
* recording on (no stacks), then with stacks, still without watchdog threads,
* the watchdog (its threads, polling every 100 ms, a TCP store for progress), recording off,
* everything on (pycoll's defaults).

Each batch is ``--batch`` consecutive calls; a batch counts the slower rank. The table gives, per
configuration, the median and the 10th percentile over batches in microseconds per call, each with
its difference to the baseline. On a shared machine the median moves with the neighbours' load
between rounds; the 10th percentile shows the quiet moments.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import platform
import statistics
import sys
import time
from datetime import datetime, timezone
from typing import Any, Dict, List, Tuple

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
if HERE not in sys.path:  # also when loaded by file path, not run as a script
    sys.path.insert(0, HERE)
from _common import at_least, import_pycoll  # noqa: E402

CONFIGS: List[Tuple[str, Dict[str, Any]]] = [
    ("baseline: no recording, no watchdog threads", {"buffer_size": 0, "stacks": False, "watchdog": False}),
    ("recording", {"buffer_size": 2000, "stacks": False, "watchdog": False}),
    ("recording + stacks", {"buffer_size": 2000, "stacks": True, "watchdog": False}),
    ("watchdog", {"buffer_size": 0, "stacks": False, "watchdog": True}),
    ("recording + stacks + watchdog (defaults)", {"buffer_size": 2000, "stacks": True, "watchdog": True}),
]


def _nested(depth: int, fn: Any) -> Any:
    return fn() if depth <= 0 else _nested(depth - 1, fn)


def record_cost(batches: int, batch: int) -> Dict[str, float]:
    """Median ns per recorded operation, without and with stacks.

    Each call records a new :class:`pycoll.Work` (as a communicator does), so the cost of the weak
    reference the entry keeps and of keeping the ring's entries is included; the cost of making
    the Work itself is measured alone and subtracted.
    """
    pycoll = import_pycoll()
    from pycoll.buffers import as_buffer
    from pycoll.flight_recorder import _STACK as fr_STACK, FlightRecorder
    from pycoll.work import Work

    pycoll.watchdog.get_watchdog().configure(enabled=False)
    comm = pycoll.init(0, 1, backend="host", name="bench")
    try:
        buf = as_buffer(np.ones(2, np.float32), writable=True)
        args = (comm, "all_reduce", 1, 0, 1, False, None, 30.0, 0, [buf], [buf])
        recorders = {"without stacks": FlightRecorder(2000, stacks=False),
                     "with stacks": FlightRecorder(2000, stacks=True)}

        def timed(record: Any) -> float:
            completed = getattr(record, "__self__", None)
            done = completed.work_completed if completed is not None else record
            t = time.perf_counter_ns()
            for _ in range(batch):
                w = Work(*args)
                record(w)
                done(w)  # as the communicator does when the operation completes
            return (time.perf_counter_ns() - t) / batch

        def skip(w: Any) -> None:
            return None

        samples: Dict[str, List[float]] = {name: [] for name in ("bare", *recorders)}
        hooks = {"bare": skip, **{name: rec.work_enqueued for name, rec in recorders.items()}}
        for hook in hooks.values():
            _nested(40, lambda hook=hook: timed(hook))  # warm up, fill the rings
        for _ in range(batches):
            for name, hook in hooks.items():
                samples[name].append(_nested(40, lambda hook=hook: timed(hook)))
        def p10(v: List[float]) -> float:
            return sorted(v)[len(v) // 10]

        bare = statistics.median(samples["bare"])
        out: Dict[str, float] = {"work creation (subtracted)": bare}
        for name, rec in recorders.items():
            out[name] = statistics.median(samples[name]) - bare
            out[f"{name} p10"] = p10(samples[name]) - p10(samples["bare"])
            out[f"frames captured ({name})"] = len(rec.entries()[-1][fr_STACK]) // 2 if rec.stacks else 0
        return out
    finally:
        comm.destroy()


def _rank(rank: int, n: int, uid: bytes, addr: Tuple[str, int], token: str, rounds: int, batch: int,
          conn: Any) -> None:
    pycoll = import_pycoll()
    from pycoll.store import TCPStore

    wd = pycoll.watchdog.get_watchdog()
    rec = pycoll.flight_recorder.get_recorder()
    rec.configure(buffer_size=2000)
    store = TCPStore(addr[0], addr[1], token)
    comm = pycoll.init(rank, n, unique_id=uid, backend="host", store=store, name="bench")
    x = np.ones(2, np.float32)
    times: Dict[str, List[float]] = {name: [] for name, _ in CONFIGS}
    try:
        for _ in range(2500):  # fill the ring: the steady state replaces old entries
            comm.all_reduce(x)
        for r in range(rounds):
            # a different first configuration each round: no configuration always follows another
            for name, cfg in CONFIGS[r % len(CONFIGS):] + CONFIGS[:r % len(CONFIGS)]:
                # taking the recorder off the observers instead of resizing its ring keeps the ring (and the
                # garbage collector's view of it) the same in every configuration
                if cfg["buffer_size"]:
                    pycoll.hooks.add_observer(rec)
                else:
                    pycoll.hooks.remove_observer(rec)
                rec.configure(stacks=cfg["stacks"])
                if cfg["watchdog"]:
                    wd.configure(enabled=True)
                    wd.start()
                else:
                    wd.stop()
                    wd.configure(enabled=False)
                for _ in range(20):
                    comm.all_reduce(x)
                t = time.perf_counter_ns()
                for _ in range(batch):
                    comm.all_reduce(x)
                times[name].append((time.perf_counter_ns() - t) / batch)
        conn.send(("ok", times))
    except BaseException as e:  # reported by the parent
        conn.send(("error", f"{type(e).__name__}: {e}"))
    finally:
        wd.stop()
        comm.abort()


def allreduce_8b(ranks: int, rounds: int, batch: int) -> Dict[str, Dict[str, float]]:
    """Microseconds per 8 B allreduce for each configuration (the slower rank per batch): the median
    and the 10th percentile of the batches (the latter is closer to what a quiet machine shows)."""
    import_pycoll()
    from pycoll import _bindings as B
    from pycoll.store import TCPStoreServer

    uid = bytes(B.load("host").get_unique_id())
    ctx = mp.get_context("spawn")
    with TCPStoreServer() as server:
        server.start()
        pipes, procs = [], []
        for r in range(ranks):
            parent, child = ctx.Pipe(duplex=False)
            p = ctx.Process(target=_rank, args=(r, ranks, uid, server.address, server.token, rounds, batch, child))
            p.start()
            child.close()
            pipes.append(parent)
            procs.append(p)
        results = []
        try:
            for r, (conn, _p) in enumerate(zip(pipes, procs, strict=False)):
                if not conn.poll(600):
                    raise RuntimeError(f"rank {r} did not report within 600 s")
                kind, value = conn.recv()
                if kind != "ok":
                    raise RuntimeError(f"rank {r}: {value}")
                results.append(value)
            for p in procs:
                p.join(30)
        finally:  # an error, Ctrl-C: the ranks go too (else the exit waited for them, and they for the store gone)
            for p in procs:
                if p.is_alive():
                    p.kill()
                    p.join(5)
    out = {}
    for name, _ in CONFIGS:
        slower = sorted(max(res[name][i] for res in results) for i in range(rounds))
        out[name] = {"median": statistics.median(slower) / 1e3, "p10": slower[len(slower) // 10] / 1e3}
    return out


def main(argv: Any = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--ranks", type=at_least(1), default=2)
    parser.add_argument("--rounds", type=at_least(1), default=60, help="allreduce batches per configuration")
    parser.add_argument("--batch", type=at_least(1), default=200, help="calls per batch")
    parser.add_argument("--record-batches", type=at_least(1), default=60)
    parser.add_argument("--json", default=os.path.join(HERE, "results", "fr_overhead.json"))
    args = parser.parse_args(argv)

    cost = record_cost(args.record_batches, 1000)
    e2e = allreduce_8b(args.ranks, args.rounds, args.batch)
    base = e2e[CONFIGS[0][0]]
    lines = ["Recording cost per operation (FlightRecorder.work_enqueued on a new Work, ns per call, over batches):"]
    lines.append(f"  {'':<16} {'median':>8} {'p10':>8}")
    for label in ("without stacks", "with stacks"):
        extra = f"  ({cost[f'frames captured ({label})']} frames)" if label == "with stacks" else ""
        lines.append(f"  {label:<16} {cost[label]:8.0f} {cost[label + ' p10']:8.0f}{extra}")
    lines.append("")
    lines.append(f"8 B allreduce, host backend, {args.ranks} ranks (us per call, slower rank, "
                 f"{args.rounds} batches of {args.batch} per configuration):")
    width = max(len(name) for name, _ in CONFIGS)
    lines.append(f"  {'configuration':<{width}}  {'median':>7}  {'vs base':>7}  {'p10':>7}  {'vs base':>7}")
    for name, _ in CONFIGS:
        m, p = e2e[name]["median"], e2e[name]["p10"]
        lines.append(f"  {name:<{width}}  {m:7.2f}  {m - base['median']:+7.2f}  {p:7.2f}  {p - base['p10']:+7.2f}")
    print("\n".join(lines))
    result = {
        "benchmark": "fr_overhead",
        "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "machine": {"python": sys.version.split()[0], "platform": platform.platform(), "cpus": os.cpu_count()},
        "settings": {"ranks": args.ranks, "rounds": args.rounds, "batch": args.batch},
        "record_cost_ns": cost,
        "allreduce_8B_us": e2e,
    }
    if args.json:
        os.makedirs(os.path.dirname(os.path.abspath(args.json)), exist_ok=True)
        with open(args.json, "w") as f:
            json.dump(result, f, indent=2)
        print(f"\nwritten to {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
