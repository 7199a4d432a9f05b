"""The elastic agreement and the grow admission with 64 to 1,024 members, no collectives.

Members are plain store clients: a few worker processes each run many member threads, every member
with its own connection to one TCP store server (in this process, on its own thread). Each member
runs the code :class:`pycoll.ElasticGroup` runs (:mod:`pycoll.membership`), not a copy of it.

* **agreement**: one member is killed (it does not answer; the liveness rule knows it is gone, as
  ``/proc`` tells ElasticGroup about a same-host process that exited). Every member is waiting on the
  generation's reshape flag, as its watcher thread does; the clock starts when the flag is set and
  stops when the last survivor holds the decision (checked: the right members, the same on all).
* **grow**: a joiner has asked to join and waits for its admission; every member is at a step
  boundary (waiting on the same flag); rank 0 reads the join requests, admits the joiner and
  publishes the decision through the store (the device-backend path; on the host backend the
  decision is a broadcast on the communicator and the members' store cost is zero). The clock stops
  when every member holds the decision and the joiner its admission.

Store requests are counted at the server (:meth:`pycoll.TCPStoreServer.stats`) between the start and
the end of each repetition; the members' flag waits, issued before the start, are not in the count
(one per member: the watcher's, re-armed after each reshape). Repetitions of the different sizes are
interleaved; the table gives medians and p90.

* **agreement / grow through node hubs** (``--per-node K``, default 8): the members are grouped into
  nodes of K (threads of one worker process, as the processes of one host); one
  :class:`pycoll.nodeagg.NodeHub` per node waits for the flag in the store, collects its members' votes
  (a Unix socket each), sends them in one request, agrees for them and hands the decision back --
  what :class:`pycoll.ElasticGroup` does when members share a host. The hubs run in
  ``--hub-procs`` processes of their own (``--hub-placement``): a real hub shares its interpreter
  with one member, not with hundreds of member threads. The direct cases run in the same
  interleaved repetitions. Every one of the 1,024 member threads still has to wake twice (the flag,
  the decision) on this machine's cores: the "1 local wake" column is that floor, once.
* **store side of the node hubs** (``--aggregate K``): one store client per K members whose votes
  it already holds -- what the store serves when the nodes run in parallel on their own cores.
* **one node** (``--node-reps``): K member *processes* and their hub, one store client: the local
  round every node adds, in parallel with the others.

    python benchmarks/agreement_scale.py [--sizes 64,256,1024] [--reps 7] [--workers 4] [--per-node 8]
                                         [--aggregate 8] [--hub-placement apart] [--node-reps 15] [--json out]
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import queue
import random
import sys
import threading
import time
from typing import Any, Dict, List, Sequence, Tuple

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _common import at_least, import_pycoll

NS = "pycoll/elastic/bench"
WINDOW = 5.0  # the agreement's window: only members that are neither vouched nor provably gone wait for it
TIMEOUT = 30.0



def _admit_joiners(mb: Any, store: Any, base: str, key: str, members: Tuple[int, ...], dead_set: Any,
                   n: int) -> List[int]:
    """Rank 0's part of a grow: decide on the pending joiners, publish the new communicator's id, admit them."""
    joiners = [j for j in mb.pending_joiners(store, NS + base, members) if j not in dead_set]
    mb.grow_decision(store, key, joiners, 0, dead_set.__contains__, TIMEOUT, n)
    store.set(f"{NS}{base}g1/uid", b"u" * 128)
    mb.admit(store, NS + base, joiners, 1, members + tuple(joiners), "grow", 7, TIMEOUT)
    return joiners

def _member(slot: int, addr: Tuple[str, int], token: str, jobs: queue.SimpleQueue[Any],
            results: queue.SimpleQueue[Any], hub: str) -> None:
    import pycoll
    from pycoll import membership as mb, nodeagg

    store = pycoll.TCPStore(addr[0], addr[1], token, timeout=TIMEOUT)
    link = nodeagg.NodeLink(hub, slot) if hub else None
    while True:
        job = jobs.get()
        if job is None:
            store.close()
            if link is not None:
                link.close()
            return
        kind, base, n, dead, joiner, k = job
        dead_set = set(dead)
        members = tuple(range(n))
        try:
            if kind == "agree-node":  # through the node's hub (pycoll.nodeagg), as ElasticGroup on one host
                if slot in dead_set:
                    results.put((slot, 0.0, "dead"))
                    continue
                nodeagg.watch_key(link, store, f"{base}flag", TIMEOUT)  # the watcher, through the hub
                got, step = nodeagg.agree(link, store, base, slot, members, 7, dead_set.__contains__,
                                          window=WINDOW, timeout=TIMEOUT)
                t = time.monotonic()
                ok = len(got) == n - len(dead_set) and not dead_set.intersection(got) and step == 7
                results.put((slot, t, "ok" if ok else f"wrong decision {got[:8]}... step {step}"))
            elif kind == "floor-node":  # the least through the hubs: one local wake per member
                nodeagg.watch_key(link, store, f"{base}flag", TIMEOUT)
                results.put((slot, time.monotonic(), "ok"))
            elif kind == "grow-node" and slot != joiner:
                nodeagg.watch_key(link, store, f"{base}flag", TIMEOUT)
                key = f"{NS}{base}grow/1"
                if slot == 0:
                    joiners = _admit_joiners(mb, store, base, key, members, dead_set, n)
                else:
                    raw = nodeagg.watch_key(link, store, key, TIMEOUT)
                    joiners = list(mb.parse_members(raw or b""))
                t = time.monotonic()
                results.put((slot, t, "ok" if joiners == [joiner] else f"wrong joiners {joiners}"))
            elif kind == "floor":  # the least any protocol costs a member: the wake and one request
                store.wait([f"{base}flag"], timeout=TIMEOUT)
                store.get(f"{base}flag", timeout=TIMEOUT)
                results.put((slot, time.monotonic(), "ok"))
            elif kind == "agree":
                # this client speaks for k members (k > 1: a node's aggregator), those of them alive
                mine = [m for m in range(slot * k, min(n, slot * k + k)) if m not in dead_set]
                if not mine:
                    results.put((slot, 0.0, "dead"))
                    continue
                store.wait([f"{base}flag"], timeout=TIMEOUT)  # the watcher's wait for the reshape flag
                if k == 1:  # the member's vote (its watcher sends it as it wakes), then the agreement
                    mb.vouch(store, base, mine[0], 7)
                    got, step = mb.agree(store, base, mine[0], members, 7, dead_set.__contains__, window=WINDOW,
                                         timeout=TIMEOUT)
                else:  # a node hub: the votes it holds go with its wait for the decision (as NodeHub sends them)
                    got, step = mb.agree(store, base, mine[0], members, 7, dead_set.__contains__, window=WINDOW,
                                         timeout=TIMEOUT, speaks_for=mine[1:], votes=dict.fromkeys(mine, 7))
                t = time.monotonic()
                ok = len(got) == n - len(dead_set) and not dead_set.intersection(got) and step == 7
                results.put((slot, t, "ok" if ok else f"wrong decision {got[:8]}... step {step}"))
            elif slot == joiner:  # grow: the joiner
                admitted = mb.request_join(store, NS + base, slot)
                raw = mb.await_admission(store, NS + base, slot, admitted, time.monotonic() + TIMEOUT, TIMEOUT)
                t = time.monotonic()
                _, rank, got, _, _ = mb.parse_admission(raw)
                ok = rank == n and got == (*members, slot)
                results.put((slot, t, "ok" if ok else f"wrong admission rank {rank}"))
            else:  # grow: a member at the step boundary
                store.wait([f"{base}flag"], timeout=TIMEOUT)
                key = f"{NS}{base}grow/1"
                if slot == 0:
                    joiners = _admit_joiners(mb, store, base, key, members, dead_set, n)
                else:
                    joiners = mb.grow_decision(store, key, None, 0, dead_set.__contains__, TIMEOUT, n)
                t = time.monotonic()
                results.put((slot, t, "ok" if joiners == [joiner] else f"wrong joiners {joiners}"))
        except Exception as exc:  # reported, and the repetition counts as failed
            results.put((slot, time.monotonic(), f"{type(exc).__name__}: {exc}"))


def nodes_of(slots: Sequence[int], per_node: int) -> List[List[int]]:
    """The nodes of one worker process: its slots in groups of ``per_node``."""
    return [list(slots[i:i + per_node]) for i in range(0, len(slots), per_node)] if per_node > 1 else []


def _worker(slots: Sequence[int], addr: Tuple[str, int], token: str, conn: Any, per_node: int,
            hosted: Sequence[Sequence[int]], run: str) -> None:
    pycoll = import_pycoll()
    from pycoll import nodeagg

    queues = {s: queue.SimpleQueue() for s in slots}  # type: ignore[var-annotated]
    results: queue.SimpleQueue[Any] = queue.SimpleQueue()
    dead: set[int] = set()  # this repetition's killed member: the hubs' liveness rule (as /proc is ElasticGroup's)
    hub_store = pycoll.TCPStore(addr[0], addr[1], token, timeout=TIMEOUT)
    hubs = [nodeagg.NodeHub(hub_store, f"pycoll-bench:{run}:{node[0]}", node[0], dead.__contains__)
            for node in hosted]
    conn.send("hubs")
    assert conn.recv() == "go"  # every process's hubs are up
    address = {s: f"pycoll-bench:{run}:{node[0]}" for node in nodes_of(slots, per_node) for s in node}
    threads = [threading.Thread(target=_member, args=(s, addr, token, queues[s], results, address.get(s, "")),
                                daemon=True) for s in slots]
    for t in threads:
        t.start()
    conn.send("ready")
    while True:
        job = conn.recv()
        if job is None:
            break
        n, joiner, k = job[2], job[4], job[5]
        dead.clear()
        dead.update(job[3])
        mine = [s for s in slots if s * k < n or s == joiner]
        for s in mine:
            queues[s].put(job)
        conn.send([results.get() for _ in mine])
    for q in queues.values():
        q.put(None)
    for t in threads:
        t.join(5)
    for h in hubs:
        h.close()
    hub_store.close()


def percentile(values: Sequence[float], q: float) -> float:
    """The ``q`` quantile of ``values``, interpolated between the two nearest (0.5 of two values: their mean)."""
    v = sorted(values)
    x = min(len(v) - 1.0, max(0.0, q * (len(v) - 1)))
    lo = int(x)
    return v[lo] + (v[min(lo + 1, len(v) - 1)] - v[lo]) * (x - lo)


def _node_member(slot: int, k: int, addr: Tuple[str, int], token: str, run: str, conn: Any) -> None:
    """One member process of the one-node case; slot 0's process hosts the node's hub."""
    pycoll = import_pycoll()
    from pycoll import nodeagg

    store = pycoll.TCPStore(addr[0], addr[1], token, timeout=TIMEOUT)
    hub = nodeagg.NodeHub(store, f"pycoll-bench-node:{run}", 0, lambda m: False) if slot == 0 else None
    conn.send("hub")
    assert conn.recv() == "go"
    link = nodeagg.NodeLink(f"pycoll-bench-node:{run}", slot)
    members = tuple(range(k))
    while True:
        conn.send("ready")
        base = conn.recv()
        if base is None:
            break
        nodeagg.watch_key(link, store, f"{base}flag", TIMEOUT)
        got, _ = nodeagg.agree(link, store, base, slot, members, 7, lambda m: False, window=WINDOW, timeout=TIMEOUT)
        conn.send((time.monotonic(), got == members))
    link.close()
    if hub is not None:
        hub.close()
    store.close()


def one_node(server: Any, driver: Any, token: str, k: int, reps: int) -> List[float]:
    """The agreement of one node of ``k`` member processes through its hub (the store sees one
    client): what every node of a job pays in parallel on its own cores, ms per repetition."""
    ctx = mp.get_context("spawn")
    run = f"{os.getpid()}-{time.monotonic_ns()}"
    pipes, procs = [], []
    for s in range(k):
        mine, theirs = ctx.Pipe()
        proc = ctx.Process(target=_node_member, args=(s, k, server.address, token, run, theirs), daemon=True)
        proc.start()
        pipes.append(mine)
        procs.append(proc)
    out: List[float] = []
    try:
        for c in pipes:
            assert c.recv() == "hub"
        for c in pipes:
            c.send("go")
        for r in range(reps + 1):
            for c in pipes:
                assert c.recv() == "ready"
            base = f"bench/node/r{r}/"
            for c in pipes:
                c.send(base)
            time.sleep(0.05)  # every member asked the hub for the flag
            t0 = time.monotonic()
            driver.set(f"{base}flag", b"1")
            res = [c.recv() for c in pipes]
            if not all(ok for _, ok in res):
                raise SystemExit(f"one node: a wrong decision {res}")
            if r:
                out.append((max(t for t, _ in res) - t0) * 1e3)
        for c in pipes:
            assert c.recv() == "ready"
            c.send(None)
    finally:
        for p in procs:
            p.join(10)
            if p.is_alive():
                p.kill()
                p.join()
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--sizes", default="64,256,1024")
    ap.add_argument("--reps", type=at_least(1), default=7)
    ap.add_argument("--workers", type=at_least(1), default=4)
    ap.add_argument("--aggregate", type=int, default=8,
                    help="also run the agreement with one store client per this many members (0: no)")
    ap.add_argument("--per-node", type=int, default=8,
                    help="also run the agreement and the grow through node hubs (pycoll.nodeagg) of this many "
                         "members each (0: no)")
    ap.add_argument("--hub-placement", choices=("same", "other", "apart"), default="apart",
                    help="a node's hub runs in the process of its members' threads, in another member process, "
                         "or in one of --hub-procs processes of their own")
    ap.add_argument("--hub-procs", type=int, default=4)
    ap.add_argument("--json", default="")
    ap.add_argument("--node-reps", type=int, default=15,
                    help="repetitions of the one-node case (--per-node member processes, one hub; 0: none)")
    a = ap.parse_args()
    try:
        sizes = [int(x) for x in a.sizes.split(",")]
    except ValueError:
        ap.error(f"--sizes: not a comma-separated list of group sizes: {a.sizes!r}")
    if min(sizes) < 2:
        ap.error(f"--sizes: a group has at least 2 members, got {min(sizes)}")
    pycoll = import_pycoll()
    top = max(sizes)
    token = "agreement-bench"
    server = pycoll.TCPStoreServer(token=token, backlog=4096, max_unauthenticated=4096).start()
    driver = server.client(timeout=TIMEOUT)
    ctx = mp.get_context("spawn")
    slots = list(range(top + 1))  # slot `top` is the joiner of the largest size; each size's joiner is slot n
    joiner_slots = set(sizes)
    per = [slots[i::a.workers] for i in range(a.workers)]
    for s in joiner_slots:
        if not any(s in p for p in per):
            per[0].append(s)
    pipes, procs = [], []
    run = f"{os.getpid()}-{time.monotonic_ns()}"  # the hubs' socket names
    # the hubs of a process's nodes: in that process (one of K members shares the hub's interpreter),
    # in the next one, or in processes of their own (none does, as with member processes of their own)
    node_lists = [nodes_of(p, a.per_node) for p in per]
    hosted = [node_lists[(i + (a.hub_placement == "other")) % len(per)] for i in range(len(per))]
    if a.hub_placement == "apart":
        every = [node for nodes in node_lists for node in nodes]
        hosted = [[] for _ in per] + [every[i::a.hub_procs] for i in range(a.hub_procs)]
        per = per + [[] for _ in range(a.hub_procs)]
    for p, h in zip(per, hosted, strict=True):
        mine, theirs = ctx.Pipe()
        proc = ctx.Process(target=_worker, daemon=True, args=(p, server.address, token, theirs, a.per_node, h, run))
        proc.start()
        pipes.append(mine)
        procs.append(proc)
    for c in pipes:
        assert c.recv() == "hubs"
    for c in pipes:
        c.send("go")
    for c in pipes:
        assert c.recv() == "ready"
    rng = random.Random(17)
    out: Dict[str, Dict[int, Dict[str, List[float]]]] = {
        k: {} for k in ("agree", "grow", "agree-aggregated", "floor", "agree-node", "grow-node", "floor-node")}
    cases = [("agree", 1), ("grow", 1), ("floor", 1)] + (
        [("agree-aggregated", a.aggregate)] if a.aggregate > 1 else []) + (
        [("agree-node", 1), ("grow-node", 1), ("floor-node", 1)] if a.per_node > 1 else [])
    nodes = [node for p in per for node in nodes_of(p, a.per_node)]
    try:
        for r in range(a.reps + 1):  # the first round warms up (connections, code paths)
            for n in sizes:
                for kind, k in cases:
                    base = f"bench/r{r}/n{n}/{kind}/"
                    dead = [rng.randrange(1, n)] if kind in ("agree", "agree-aggregated", "agree-node") else []
                    joiner = n if kind in ("grow", "grow-node") else -1
                    clients = -(-n // k)
                    expect = clients - (1 if k == 1 and dead else 0) + (1 if kind == "grow" else 0)
                    if kind.endswith("-node"):  # the hubs wait in the store (and the joiner)
                        expect = sum(1 for node in nodes if any(s < n and s not in dead for s in node)) + (
                            1 if kind == "grow-node" else 0)
                    for c in pipes:
                        c.send(("agree" if kind == "agree-aggregated" else kind, base, n, dead, joiner, k))
                    # every member is waiting (and the joiner too) before the clock starts
                    deadline = time.monotonic() + 30
                    while server.stats()["waiting"] < expect and time.monotonic() < deadline:
                        time.sleep(0.002)
                    time.sleep(0.05 if kind.endswith("-node") else 0.02)  # the members' local requests too
                    before = server.stats()
                    cpu0 = time.process_time()
                    t0 = time.monotonic()
                    driver.set(f"{base}flag", b"1")
                    res = [x for c in pipes for x in c.recv()]
                    after = server.stats()
                    cpu = (time.process_time() - cpu0) * 1e3
                    bad = [x for x in res if x[2] not in ("ok", "dead")]
                    if bad:
                        raise SystemExit(f"{kind} n={n} rep {r}: {len(bad)} members failed, e.g. {bad[:3]}")
                    if r == 0:
                        continue
                    lat = (max(x[1] for x in res if x[2] == "ok") - t0) * 1e3
                    row = out[kind].setdefault(n, {"ms": [], "requests": [], "arguments": [], "server_cpu_ms": []})
                    row["ms"].append(lat)
                    row["server_cpu_ms"].append(cpu)
                    row["requests"].append(after["requests"] - before["requests"] - 1)  # less the driver's set
                    row["arguments"].append(after["arguments"] - before["arguments"] - 2)
    finally:
        for c in pipes:
            try:
                c.send(None)
            except OSError:
                pass
        for p in procs:
            p.join(10)
            if p.is_alive():
                p.kill()
                p.join()
        driver.close()
        server.close()
    node_ms: List[float] = []
    if a.per_node > 1 and a.node_reps > 0:
        server = pycoll.TCPStoreServer(token=token).start()
        driver = server.client(timeout=TIMEOUT)
        try:
            node_ms = one_node(server, driver, token, a.per_node, a.node_reps)
        finally:
            driver.close()
            server.close()
    load = os.getloadavg()
    print(f"# agreement and grow admission vs members (load average {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}, "
          f"{os.cpu_count()} CPUs, {a.reps} interleaved repetitions, {a.workers} member processes)")
    print("| N | agreement median ms | p90 ms | store requests / failure | request args | server CPU ms | "
          "grow median ms | p90 ms | store requests / admission |"
          + (f" agreement, 1 client per {a.aggregate} members: median ms | p90 ms | requests | server CPU ms |"
             if a.aggregate > 1 else "") + " floor: wake + 1 request per member, median ms |")
    print("|---|---|---|---|---|---|---|---|---|" + ("---|---|---|---|" if a.aggregate > 1 else "") + "---|")
    summary: Dict[str, Any] = {"load": load, "rows": []}
    for n in sizes:
        ag, gr = out["agree"][n], out["grow"][n]
        row = {"n": n, "agree_ms_median": percentile(ag["ms"], 0.5), "agree_ms_p90": percentile(ag["ms"], 0.9),
               "agree_requests": percentile(ag["requests"], 0.5), "agree_arguments": percentile(ag["arguments"], 0.5),
               "agree_server_cpu_ms": percentile(ag["server_cpu_ms"], 0.5),
               "grow_ms_median": percentile(gr["ms"], 0.5), "grow_ms_p90": percentile(gr["ms"], 0.9),
               "grow_requests": percentile(gr["requests"], 0.5), "raw": {"agree": ag, "grow": gr}}
        agg = out["agree-aggregated"].get(n)
        extra = ""
        if agg:
            row.update(aggregated_per_client=a.aggregate, aggregated_ms_median=percentile(agg["ms"], 0.5),
                       aggregated_ms_p90=percentile(agg["ms"], 0.9),
                       aggregated_requests=percentile(agg["requests"], 0.5),
                       aggregated_server_cpu_ms=percentile(agg["server_cpu_ms"], 0.5))
            row["raw"]["agree-aggregated"] = agg
            extra = (f" {row['aggregated_ms_median']:.1f} | {row['aggregated_ms_p90']:.1f} | "
                     f"{row['aggregated_requests']:.0f} | {row['aggregated_server_cpu_ms']:.1f} |")
        row["floor_ms_median"] = percentile(out["floor"][n]["ms"], 0.5)
        extra += f" {row['floor_ms_median']:.1f} |"
        summary["rows"].append(row)
        print(f"| {n} | {row['agree_ms_median']:.1f} | {row['agree_ms_p90']:.1f} | {row['agree_requests']:.0f} | "
              f"{row['agree_arguments']:.0f} | {row['agree_server_cpu_ms']:.1f} | {row['grow_ms_median']:.1f} | "
              f"{row['grow_ms_p90']:.1f} | "
              f"{row['grow_requests']:.0f} |" + extra)
    if a.per_node > 1:
        print(f"\n# direct (one store connection per member) vs through node hubs of {a.per_node} members "
              f"(pycoll.nodeagg: one store client per node), same run")
        print("| N | agreement direct median ms | p90 | node hubs median ms | p90 | ratio | "
              "store requests / failure direct | node hubs | grow direct median ms | p90 | node hubs median ms | p90 | "
              "store requests / admission direct | node hubs | floor direct: wake + 1 request ms | "
              "floor node hubs: 1 local wake ms |")
        print("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
        for row in summary["rows"]:
            n = row["n"]
            an, gn, fn = out["agree-node"][n], out["grow-node"][n], out["floor-node"][n]
            row.update(node_per=a.per_node, node_agree_ms_median=percentile(an["ms"], 0.5),
                       node_agree_ms_p90=percentile(an["ms"], 0.9), node_agree_requests=percentile(an["requests"], 0.5),
                       node_grow_ms_median=percentile(gn["ms"], 0.5), node_grow_ms_p90=percentile(gn["ms"], 0.9),
                       node_grow_requests=percentile(gn["requests"], 0.5),
                       node_floor_ms_median=percentile(fn["ms"], 0.5))
            row["raw"].update({"agree-node": an, "grow-node": gn, "floor-node": fn})
            print(f"| {n} | {row['agree_ms_median']:.1f} | {row['agree_ms_p90']:.1f} | "
                  f"{row['node_agree_ms_median']:.1f} | {row['node_agree_ms_p90']:.1f} | "
                  f"{row['agree_ms_median'] / row['node_agree_ms_median']:.1f}x | {row['agree_requests']:.0f} | "
                  f"{row['node_agree_requests']:.0f} | {row['grow_ms_median']:.1f} | {row['grow_ms_p90']:.1f} | "
                  f"{row['node_grow_ms_median']:.1f} | {row['node_grow_ms_p90']:.1f} | {row['grow_requests']:.0f} | "
                  f"{row['node_grow_requests']:.0f} | {row['floor_ms_median']:.1f} | "
                  f"{row['node_floor_ms_median']:.1f} |")
    if node_ms:
        summary["one_node"] = {"per_node": a.per_node, "ms": node_ms, "median": percentile(node_ms, 0.5),
                               "p90": percentile(node_ms, 0.9)}
        print(f"\n# one node: {a.per_node} member processes through their hub (one store client), flag to every "
              f"member holding the decision: median {percentile(node_ms, 0.5):.1f} ms, p90 "
              f"{percentile(node_ms, 0.9):.1f} ms ({len(node_ms)} repetitions)")
    if a.json:
        with open(a.json, "w") as f:
            json.dump(summary, f, indent=1)


if __name__ == "__main__":
    main()
