"""Flight-recorder dumps (and the elastic layer's recoveries) as one Chrome trace-event file.

The file opens unchanged in Perfetto (ui.perfetto.dev) and ``chrome://tracing``: a JSON object
``{"traceEvents": [...], "displayTimeUnit": "ms", "otherData": {...}}``. What it holds:

* one process track per rank (``pid`` = the rank in the job, named ``rank R (host)``) and, in it, one
  thread track per communicator and generation (``tid``; a second lane when asynchronous operations
  overlap), plus an ``elastic`` track when the rank took part in a recovery;
* every recorded operation as a complete (``"X"``) slice from its enqueue to its completion as the rank saw it
  (``time_discovered_completed_ns``: a blocking call's return, an asynchronous one's ``wait()``, poll or watchdog
  round; ``args.device_duration_ms`` is the device's own time, where events timed it), with its
  sequence numbers, sizes, dtypes and state in ``args``; an operation not completed when the dump was
  written is drawn to the dump's time (or to its communicator's failure, when it failed), its name ends
  in ``(in flight)`` or ``(failed)`` and ``args.in_flight`` is true; one that failed where its communicator did
  not (an abort, a revoke) ends in ``(failed)``, drawn to the dump (when it ended is not recorded), and one that
  never ran (its group dropped or refused) is a zero-length slice at its enqueue ending in ``(never ran)``,
  ``args.never_ran`` true; an operation captured in a CUDA graph
  (it runs only at the graph's replays) is a zero-length slice at its enqueue ending in ``(captured)``,
  ``args.captured`` true;
* the failures the watchdog recorded, the dump triggers (a dump a later one replaced too, named so) and the
  analyzer's first divergence and verdict as instant (``"i"``) events;
* each :class:`pycoll.elastic.Transition` a rank's dumps carry (``pycoll.transitions``) as nested
  slices on its ``elastic`` track: the recovery, then its phases (to agreement, agreement, revoke,
  shrink / grow / init, first collective).

**Clocks.** Dumps record wall-clock times only (the entries' enqueue, start and completion times --
the monotonic clock plus its offset from the wall clock, measured again every second, so one clock
read serves an operation -- and ``time.time_ns()`` for the dump's ``time_ns``, the failures' and
transitions' ``time``) and the host name; no monotonic time (it would mean nothing on another host).
Ranks on one host share its clock; across hosts the rule is: a synchronising collective (all-reduce,
all-gather, reduce-scatter, all-to-all, barrier; one of no element meets nothing) completes on no rank
before every rank has entered it. So for every such collective that completed on a rank ``a`` of host A
and a rank ``b`` of host B, the offset of B's clock from A's, ``off``, satisfies ``enqueue_b - completed_a <= off <=
completed_b - enqueue_a``. The estimate is the median of ``completed_b - completed_a`` (completions
are close together), clamped into the intersection of those bounds when it is not empty. Hosts are
aligned to the host of the lowest rank, through other hosts when they share no communicator with it;
a host that shares no completed collective with any aligned host keeps its clock
(``otherData.clock.unaligned`` names it). Times in the file are microseconds since the earliest
event (``otherData.time_origin_unix_ns``).

This module works on loaded dumps; :func:`pycoll.diagnostics.analyze.trace_dir` reads a dump folder
and calls it (``pycoll-fr DIR --trace out.json``).
"""

from __future__ import annotations

import json
import math
import statistics
from collections import defaultdict
from typing import Any, Dict, Iterable, List, Optional, Sequence, Tuple

__all__ = ["build_trace", "clock_offsets", "check_trace", "write_trace", "events_of", "never_ran", "SYNC_OPS",
           "CLOCK_RULE"]

#: collectives that complete on no rank before every rank entered them (used to align host clocks)
SYNC_OPS = frozenset({"all_reduce", "all_gather", "reduce_scatter", "all_to_all", "barrier", "allreduce",
                      "allgather", "reduce_scatter_tensor", "all_gather_into_tensor", "_allgather_base",
                      "_reduce_scatter_base", "alltoall", "alltoall_base", "all_to_all_single"})
CLOCK_RULE = ("per host: median of completion-time differences of synchronising collectives, clamped to "
              "[max(enqueue_b - completed_a), min(completed_b - enqueue_a)]; aligned to the host of the lowest rank")

Dumps = Dict[int, Dict[str, Any]]
Generations = Sequence[Tuple[Optional[int], Dumps]]

# phase slices of a Transition: (name, start field, end field)
_PHASES = (("to agreement", "detected", "agreement_started"), ("agreement", "agreement_started", "agreed"),
           ("revoke", "agreed", "revoked"), ("{comm}", "revoked", "comm_ready"),
           ("first collective", "comm_ready", "first_collective"))


def _pyc(d: Dict[str, Any]) -> Dict[str, Any]:
    p = d.get("pycoll")
    return p if isinstance(p, dict) else {}


def _host(d: Dict[str, Any]) -> str:
    return str(_pyc(d).get("hostname") or "")


def _op(e: Dict[str, Any]) -> str:
    return str(e.get("profiling_name", "")).split(":", 1)[-1].split(" ", 1)[0]


def _uid(e: Dict[str, Any]) -> str:
    pg = e.get("process_group") or [""]
    return str(pg[0])


def _ns(v: Any) -> Optional[int]:
    """A recorded time in ns (0 and None: unset)."""
    try:
        n = int(v)
    except (TypeError, ValueError):
        return None
    return n if n > 0 else None


# -- clocks ----------------------------------------------------------------------------------------


def _pair_offset(samples: List[Tuple[int, int, int, int]]) -> Tuple[float, bool]:
    """(offset of B from A in ns, within bounds) from (enqueue_a, completed_a, enqueue_b, completed_b) samples."""
    lo = max(eb - ca for ea, ca, eb, cb in samples)
    hi = min(cb - ea for ea, ca, eb, cb in samples)
    est = float(statistics.median(cb - ca for ea, ca, eb, cb in samples))
    if lo <= hi:
        return min(max(est, float(lo)), float(hi)), True
    return est, False


def clock_offsets(generations: Generations) -> Tuple[Dict[str, int], Dict[str, Any]]:
    """``({host: offset ns}, notes)``: subtract a host's offset from its times to put them on the reference clock.

    See the module's docstring for the rule. ``notes`` holds the reference host, the samples per host
    pair, whether each estimate fell within its bounds, and the hosts left unaligned.
    """
    hosts: Dict[str, int] = {}  # host -> lowest rank seen on it
    # (generation, uid, seq) -> host -> [(enqueue, completed)]
    times: Dict[Tuple[Any, str, int], Dict[str, List[Tuple[int, int]]]] = defaultdict(lambda: defaultdict(list))
    for gen, dumps in generations:
        for rank, d in dumps.items():
            h = _host(d)
            hosts[h] = min(rank, hosts.get(h, rank))
            for e in d.get("entries") or []:
                if e.get("is_p2p") or e.get("state") != "completed" or _op(e) not in SYNC_OPS:
                    continue
                if _op(e) != "barrier" and not any(math.prod(s) for s in (e.get("input_sizes") or []) +
                                                   (e.get("output_sizes") or [])):
                    continue  # no element: it meets nothing (NCCL's empty collectives return at once)
                enq, done = _ns(e.get("time_created_ns")), _ns(e.get("time_discovered_completed_ns"))
                if enq is None or done is None or done < enq:
                    continue
                times[(gen, _uid(e), int(e.get("collective_seq_id") or 0))][h].append((enq, done))
    notes: Dict[str, Any] = {"rule": CLOCK_RULE, "reference": None, "pairs": {}, "unaligned": []}
    if not hosts:
        return {}, notes
    ref = min(hosts, key=lambda h: (hosts[h], h))
    notes["reference"] = ref
    if len(hosts) == 1:
        return {ref: 0}, notes
    pairs: Dict[Tuple[str, str], List[Tuple[int, int, int, int]]] = defaultdict(list)
    for per_host in times.values():
        hs = sorted(per_host)
        for i, a in enumerate(hs):
            for b in hs[i + 1:]:
                # the widest bounds of this op: the earliest enqueue and latest completion of each host
                ea, ca = min(t[0] for t in per_host[a]), max(t[1] for t in per_host[a])
                eb, cb = min(t[0] for t in per_host[b]), max(t[1] for t in per_host[b])
                pairs[(a, b)].append((ea, ca, eb, cb))
    estimates: Dict[Tuple[str, str], float] = {}
    for (a, b), samples in pairs.items():
        off, inside = _pair_offset(samples)
        estimates[(a, b)] = off
        estimates[(b, a)] = -off
        notes["pairs"][f"{a}->{b}"] = {"offset_ns": round(off), "samples": len(samples), "within_bounds": inside}
    offsets: Dict[str, float] = {ref: 0.0}
    frontier = [ref]
    while frontier:  # breadth first from the reference host, the pair with the most samples first
        nxt = []
        for a in frontier:
            for b in sorted(hosts, key=lambda h: -len(pairs.get((min(a, h), max(a, h)), []))):
                if b not in offsets and (a, b) in estimates:
                    offsets[b] = offsets[a] + estimates[(a, b)]
                    nxt.append(b)
        frontier = nxt
    for h in sorted(hosts):
        if h not in offsets:
            notes["unaligned"].append(h)
            offsets[h] = 0.0
    return {h: round(v) for h, v in offsets.items()}, notes


# -- building ------------------------------------------------------------------------------------


class _Tracks:
    """Integer thread ids per rank: one per (communicator, lane), one for the elastic phases."""

    def __init__(self) -> None:
        self.names: Dict[Tuple[int, int], Tuple[str, int]] = {}  # (pid, tid) -> (name, sort index)
        self._ids: Dict[Tuple[int, Any], int] = {}
        self._next: Dict[int, int] = defaultdict(lambda: 1)

    def tid(self, pid: int, key: Any, name: str, sort: int) -> int:
        t = self._ids.get((pid, key))
        if t is None:
            t = self._ids[(pid, key)] = self._next[pid]
            self._next[pid] += 1
            self.names[(pid, t)] = (name, sort)
        return t


def never_ran(e: Dict[str, Any]) -> bool:
    """Whether entry ``e`` was enqueued and never run: its ``group()`` was dropped (its block raised) or refused by
    the library. Such an entry stays ``scheduled`` with the CommStateError that says so (``'all_reduce (seq 2) never
    ran: ...'``), whether or not its communicator failed later."""
    error = str(e.get("pycoll_error") or "")
    return e.get("state") == "scheduled" and error.startswith("CommStateError") and " never ran" in error


def _slice_name(e: Dict[str, Any]) -> str:
    name = str(e.get("profiling_name", "")).split(":", 1)[-1]
    if e.get("is_p2p"):
        return f"{name} #{e.get('p2p_seq_id')}"
    return f"{name} #{e.get('collective_seq_id')}"


def _failure_times(d: Dict[str, Any]) -> Dict[str, int]:
    """uid -> the earliest failure time (ns) this dump records for it."""
    out: Dict[str, int] = {}
    for rep in _pyc(d).get("failures") or []:
        t = rep.get("time")
        if isinstance(t, (int, float)) and t > 0:
            uid = str(rep.get("uid"))
            out[uid] = min(out.get(uid, int(t * 1e9)), int(t * 1e9))
    return out


def _dump_time(d: Dict[str, Any]) -> Optional[int]:
    t = _ns(_pyc(d).get("time_ns"))
    if t is not None:
        return t
    seen = [t for e in d.get("entries") or [] for t in (_ns(e.get("time_created_ns")),
                                                        _ns(e.get("time_discovered_completed_ns"))) if t]
    return max(seen) if seen else None


def build_trace(generations: Generations, reports: Optional[Sequence[Dict[str, Any]]] = None) -> Dict[str, Any]:
    """The trace-event object of a run: ``generations`` is ``[(generation, {rank: dump})]``.

    ``reports`` are :func:`pycoll.diagnostics.analyze.analyze_dir`'s reports of the same folders (their
    first divergences and verdicts become instant events; communicators may carry a ``verdict`` text).
    """
    offsets, clock = clock_offsets(generations)
    raw: List[Dict[str, Any]] = []  # events with absolute ns times under "_t0"/"_t1", converted at the end
    tracks = _Tracks()
    procs: Dict[int, str] = {}
    comm_track: Dict[Tuple[int, Any, str], int] = {}  # (rank, generation, uid) -> lane-0 tid
    lanes: Dict[Tuple[int, Any, str], List[int]] = {}  # -> end ns of each lane's last slice
    slices_at: Dict[Tuple[Any, str, int], List[Dict[str, Any]]] = defaultdict(list)  # (gen, uid, seq) -> slices
    seen_transitions: set = set()
    seen_failures: set = set()
    counts = {"slices": 0, "in_flight": 0, "instants": 0, "phases": 0}

    for gen, dumps in generations:
        for rank, d in sorted(dumps.items()):
            pyc = _pyc(d)
            host = _host(d)
            off = offsets.get(host, 0)
            procs.setdefault(rank, f"rank {rank}" + (f" ({host})" if host else ""))
            dump_t = _dump_time(d)
            failed_at = _failure_times(d)
            names = {k: str(cfg.get("desc") or k) for k, cfg in (d.get("pg_config") or {}).items()}
            entries = sorted(d.get("entries") or [], key=lambda e: (_ns(e.get("time_created_ns")) or 0,
                                                                   e.get("record_id", 0)))
            for e in entries:
                uid = _uid(e)
                t0 = _ns(e.get("time_created_ns"))
                if t0 is None:
                    continue
                state = str(e.get("state", ""))
                done = _ns(e.get("time_discovered_completed_ns"))
                args: Dict[str, Any] = {
                    "collective": _op(e), "seq": e.get("collective_seq_id"), "p2p_seq": e.get("p2p_seq_id"),
                    "op_id": e.get("op_id"), "record_id": e.get("record_id"), "state": state,
                    "input_sizes": e.get("input_sizes"), "input_dtypes": e.get("input_dtypes"),
                    "output_sizes": e.get("output_sizes"), "output_dtypes": e.get("output_dtypes"),
                    "timeout_ms": e.get("timeout_ms"), "generation": gen, "communicator": names.get(uid, uid),
                    "uid": uid, "in_flight": False,
                }
                started = _ns(e.get("time_discovered_started_ns"))
                if started is not None:
                    args["started_after_ms"] = round((started - t0) / 1e6, 6)
                if e.get("duration_ms") is not None:
                    args["device_duration_ms"] = e.get("duration_ms")
                if e.get("pycoll_error"):
                    args["error"] = str(e["pycoll_error"])[:500]
                name = _slice_name(e)
                if state == "captured":
                    # recorded into a CUDA graph: it runs at the graph's replays, never as this entry
                    done, name = t0, name + " (captured)"
                    args["captured"] = True
                    if e.get("pycoll_capture_id") is not None:
                        args["capture_id"] = e["pycoll_capture_id"]
                elif state == "completed":
                    if done is None:
                        dur_ms = e.get("duration_ms")
                        done = t0 + int(float(dur_ms) * 1e6) if isinstance(dur_ms, (int, float)) else t0
                        args["completion_time"] = "not recorded"
                elif never_ran(e) or (e.get("pycoll_error") and failed_at.get(uid) is None and state == "scheduled"):
                    # never issued: its group was dropped or refused (its communicator's later failure, if any, is
                    # not when it ended: nothing of it ran)
                    done, name = t0, name + " (never ran)"
                    args["never_ran"] = True
                elif e.get("pycoll_error") and failed_at.get(uid) is None:
                    # stopped without its communicator failing (an abort, a revoke): when is not recorded
                    done, name = max(t0, dump_t or t0), name + " (failed)"
                    args["drawn_to"] = "the dump (when it ended is not recorded)"
                else:
                    args["in_flight"] = True
                    counts["in_flight"] += 1
                    f = failed_at.get(uid)
                    if e.get("pycoll_error") and f is not None and f >= t0:
                        done, name = f, name + " (failed)"
                        args["drawn_to"] = "the communicator's failure"
                    else:
                        done = max(t0, dump_t or t0)
                        name = name + " (in flight)"
                        args["drawn_to"] = "the dump"
                done = max(done, t0)
                key = (rank, gen, uid)
                if key not in comm_track:
                    gen_txt = "" if gen is None else f" gen {gen}"
                    label = f"{names.get(uid, uid)}{gen_txt} (uid {uid[:8]})"
                    comm_track[key] = tracks.tid(rank, (gen, uid, 0), label, 10 + 10 * (gen or 0))
                    lanes[key] = []
                ends = lanes[key]
                lane = next((i for i, end in enumerate(ends) if end <= t0), len(ends))
                if lane == len(ends):
                    ends.append(0)
                ends[lane] = done
                tid = comm_track[key] if lane == 0 else tracks.tid(
                    rank, (gen, uid, lane), f"{tracks.names[(rank, comm_track[key])][0]} lane {lane + 1}",
                    10 + 10 * (gen or 0) + lane)
                ev: Dict[str, Any] = {"ph": "X", "name": name, "cat": "p2p" if e.get("is_p2p") else "collective",
                                      "pid": rank, "tid": tid, "_t0": t0 - off, "_t1": done - off, "args": args}
                raw.append(ev)
                counts["slices"] += 1
                # a send's or receive's under -1: no divergence is at it, a verdict without a collective goes there
                slices_at[(gen, uid, -1 if e.get("is_p2p") else int(e.get("collective_seq_id") or 0))].append(ev)
            # the failures (each report once per rank: later dumps of the generation repeat it)
            for rep in pyc.get("failures") or []:
                t = rep.get("time")
                if not isinstance(t, (int, float)) or (rank, rep.get("uid"), t) in seen_failures:
                    continue
                seen_failures.add((rank, rep.get("uid"), t))
                uid = str(rep.get("uid"))
                tid = comm_track.get((rank, gen, uid)) or tracks.tid(
                    rank, (gen, uid, 0), f"{rep.get('comm', uid)} gen {gen}", 10 + 10 * (gen or 0))
                what = f"{rep.get('op')} #{rep.get('seq')}" if rep.get("op") else ""
                raw.append({"ph": "i", "s": "t", "name": f"failure: {rep.get('error_type')}" + (
                    f" in {what}" if what else ""), "cat": "failure", "pid": rank, "tid": tid,
                    "_t0": int(t * 1e9) - off, "args": {"uid": uid, "generation": gen, **{
                        k: rep.get(k) for k in ("error_type", "message", "op", "seq", "elapsed_s", "policy",
                                                "behind", "in_op", "silent", "unknown", "unable", "peer_failures")}}})
                counts["instants"] += 1
            if pyc and dump_t is not None:
                tid = tracks.tid(rank, "dumps", "flight recorder", 1)
                raw.append({"ph": "i", "s": "t", "name": f"dump ({pyc.get('trigger', '?')})", "cat": "dump",
                            "pid": rank, "tid": tid, "_t0": dump_t - off,
                            "args": {"trigger": pyc.get("trigger"), "reason": str(pyc.get("reason", ""))[:500],
                                     "generation": gen, "entries": len(d.get("entries") or []),
                                     "host": host, "os_pid": pyc.get("pid")}})
                counts["instants"] += 1
                for e in pyc.get("earlier_dumps") or []:  # the dumps this file replaced: what they said of themselves
                    if isinstance(e.get("time_ns"), int):
                        raw.append({"ph": "i", "s": "t", "name": f"dump ({e.get('trigger', '?')}, replaced)",
                                    "cat": "dump", "pid": rank, "tid": tid, "_t0": e["time_ns"] - off,
                                    "args": {"trigger": e.get("trigger"), "reason": str(e.get("reason", ""))[:500],
                                             "generation": gen, "replaced_by": pyc.get("trigger"), "host": host,
                                             "os_pid": pyc.get("pid")}})
                        counts["instants"] += 1
            for tr in pyc.get("transitions") or []:
                k = (rank, tr.get("kind"), tr.get("generation"), tr.get("detected"))
                if k in seen_transitions:
                    continue
                seen_transitions.add(k)
                n = _transition(raw, tracks, rank, tr, off)
                counts["phases"] += n

    for rep in reports or []:
        gen = rep.get("generation")
        for c in rep.get("communicators") or []:
            _verdict_events(raw, c, gen, slices_at, counts)

    origin = min((ev["_t0"] for ev in raw), default=0)
    events: List[Dict[str, Any]] = []
    for pid, name in sorted(procs.items()):
        events.append({"ph": "M", "name": "process_name", "pid": pid, "tid": 0, "ts": 0, "args": {"name": name}})
        events.append({"ph": "M", "name": "process_sort_index", "pid": pid, "tid": 0, "ts": 0,
                       "args": {"sort_index": pid}})
    for (pid, tid), (name, sort) in sorted(tracks.names.items()):
        procs.setdefault(pid, f"rank {pid}")
        events.append({"ph": "M", "name": "thread_name", "pid": pid, "tid": tid, "ts": 0, "args": {"name": name}})
        events.append({"ph": "M", "name": "thread_sort_index", "pid": pid, "tid": tid, "ts": 0,
                       "args": {"sort_index": sort}})
    timed: List[Dict[str, Any]] = []
    for ev in raw:
        a: int = ev.pop("_t0")
        b: Optional[int] = ev.pop("_t1", None)
        ev["ts"] = round((a - origin) / 1e3, 3)
        if b is not None:  # from the rounded end, so that a slice ends exactly where the next begins
            ev["dur"] = max(0.0, round(round((max(a, b) - origin) / 1e3, 3) - ev["ts"], 3))
        timed.append(ev)
    # parents (longer) before their children at the same start: what viewers expect
    timed.sort(key=lambda ev: (ev["ts"], -ev.get("dur", 0.0)))
    events.extend(timed)
    return {
        "traceEvents": events,
        "displayTimeUnit": "ms",
        "otherData": {
            "producer": "pycoll-fr --trace",
            "time_origin_unix_ns": origin,
            "clock": {**clock, "offsets_ns": offsets},
            "generations": [g for g, _ in generations],
            "ranks": sorted(procs),
            "counts": {**counts, "tracks": len(tracks.names), "processes": len(procs)},
        },
    }


def _transition(raw: List[Dict[str, Any]], tracks: _Tracks, rank: int, tr: Dict[str, Any], off: int) -> int:
    """The recovery slice and its phase slices on the rank's elastic track; returns how many slices."""
    def ns(field: str) -> Optional[int]:
        v = tr.get(field)
        return int(float(v) * 1e9) if isinstance(v, (int, float)) and v > 0 else None

    tid = tracks.tid(rank, "elastic", "elastic (recovery phases)", 2)
    kind = str(tr.get("kind", "?"))
    start = ns("detected")
    marks = [ns(f) for f in ("detected", "agreement_started", "agreed", "revoked", "comm_ready", "first_collective")]
    known = [m for m in marks if m is not None]
    if start is None or not known:
        return 0
    end = max(known)
    args = {k: tr.get(k) for k in ("kind", "generation", "members_before", "members_after", "cause", "attempts",
                                   "committed", "phases_ms", "slot")}
    raw.append({"ph": "X", "name": f"{kind} -> generation {tr.get('generation')}", "cat": "elastic", "pid": rank,
                "tid": tid, "_t0": start - off, "_t1": end - off, "args": args})
    n = 1
    comm = "shrink" if kind == "shrink" else "grow" if kind == "grow" else "init"
    prev = start
    for name, a, b in _PHASES:
        ta, tb = ns(a), ns(b)
        if a == "revoked" and ta is None:
            ta = ns("agreed")
        if ta is None or tb is None:
            continue
        ta = max(ta, prev)  # phases are consecutive: never before the previous one ended
        tb = max(tb, ta)
        if tb > ta:
            raw.append({"ph": "X", "name": name.format(comm=comm), "cat": "elastic", "pid": rank, "tid": tid,
                        "_t0": ta - off, "_t1": tb - off, "args": {"generation": tr.get("generation"),
                                                                   "ms": round((tb - ta) / 1e6, 3)}})
            n += 1
        prev = tb
    return n


def _verdict_events(raw: List[Dict[str, Any]], c: Dict[str, Any], gen: Any,
                    slices_at: Dict[Tuple[Any, str, int], List[Dict[str, Any]]], counts: Dict[str, int]) -> None:
    uid = str(c.get("uid"))
    div = None if c.get("not_a_divergence") else c.get("first_divergence")
    at: List[Dict[str, Any]] = []
    if div is not None:
        at = slices_at.get((gen, uid, int(div.get("seq") or 0)), [])
        for ev in at:
            ev["args"]["first_divergence"] = True
    verdict = c.get("verdict")
    if div is None and not verdict:
        return
    times = [ev["_t0"] for ev in at]
    if not times:  # at the end of what the dumps hold of the communicator: its slices, else its failure reports
        # (a ring that wrapped over its entries), else its ranks' dumps of the generation
        ranks = {int(r) for r in c.get("members") or []}
        ends = ([ev.get("_t1", ev["_t0"]) for (g, u, _), evs in slices_at.items() if g == gen and u == uid
                 for ev in evs]
                or [ev["_t0"] for ev in raw if ev.get("cat") == "failure" and ev["args"].get("uid") == uid
                    and ev["args"].get("generation") == gen]
                or [ev["_t0"] for ev in raw if ev.get("cat") == "dump" and ev["args"].get("generation") == gen
                    and ev.get("pid") in ranks])
        if not ends:  # nothing to place it at: left out (a time of 0 made the whole trace start at 1970)
            return
        times = [max(ends)]
    t = min(times)
    if div is not None:
        for ev in at:
            raw.append({"ph": "i", "s": "t", "name": f"first divergence: {div.get('op')}", "cat": "analysis",
                        "pid": ev["pid"], "tid": ev["tid"], "_t0": ev["_t0"],
                        "args": {"communicator": c.get("name"), "uid": uid, "members": c.get("members"),
                                 "never_entered": sorted(int(r) for r in div.get("never_entered") or {}),
                                 "revoked_first": sorted(int(r) for r, i in (div.get("never_entered") or {}).items()
                                                         if i.get("revoked")),
                                 "in_flight": sorted(int(r) for r in div.get("in_flight") or {}),
                                 "completed": div.get("completed"), "mismatch": div.get("mismatch")}})
            counts["instants"] += 1
    members = c.get("members") or [0]
    raw.append({"ph": "i", "s": "g", "name": f"verdict ({c.get('name')!s}, generation {gen}): {verdict or ''}"[:300],
                "cat": "analysis", "pid": int(min(members)), "tid": 0, "_t0": t,
                "args": {"verdict": verdict, "communicator": c.get("name"), "uid": uid, "generation": gen,
                         "first_divergence": None if div is None else div.get("op"),
                         "missing_dumps": c.get("missing_dumps")}})
    counts["instants"] += 1


# -- checking and writing ------------------------------------------------------------------------

_PHASES_KNOWN = {"X", "B", "E", "i", "I", "M", "C", "b", "e", "n", "s", "t", "f", "P", "O", "N", "D"}


def check_trace(obj: Any) -> List[str]:
    """Problems with ``obj`` as a trace-event file (empty: none).

    Checks: the object form with a ``traceEvents`` list; ``ph``, ``ts``, ``pid``, ``tid`` and ``name``
    on every event; ``dur >= 0`` on ``X`` events; ``B``/``E`` pairs matching per track; timestamps
    not decreasing per track; ``X`` slices of one track properly nested (none ends inside another
    without being inside it); and that it survives a JSON round trip.
    """
    problems: List[str] = []
    if not isinstance(obj, dict) or not isinstance(obj.get("traceEvents"), list):
        return ["not a JSON object with a 'traceEvents' list"]
    try:
        json.loads(json.dumps(obj))
    except (TypeError, ValueError) as e:
        problems.append(f"not JSON-serialisable: {e}")
    if obj.get("displayTimeUnit", "ms") not in ("ms", "ns"):
        problems.append(f"displayTimeUnit must be 'ms' or 'ns', got {obj.get('displayTimeUnit')!r}")
    last: Dict[Tuple[Any, Any], float] = {}
    open_b: Dict[Tuple[Any, Any], List[str]] = defaultdict(list)
    open_x: Dict[Tuple[Any, Any], List[float]] = defaultdict(list)
    for i, ev in enumerate(obj["traceEvents"]):
        if not isinstance(ev, dict):
            problems.append(f"event {i}: not an object")
            continue
        missing = [k for k in ("ph", "ts", "pid", "tid", "name") if k not in ev]
        if missing:
            problems.append(f"event {i} ({ev.get('name')!r}): missing {missing}")
            continue
        ph = ev["ph"]
        if ph not in _PHASES_KNOWN:
            problems.append(f"event {i}: unknown phase {ph!r}")
        if not isinstance(ev["ts"], (int, float)) or isinstance(ev["ts"], bool):
            problems.append(f"event {i}: ts {ev['ts']!r} is not a number")
            continue
        if ph == "M":
            continue
        track = (ev["pid"], ev["tid"])
        ts = float(ev["ts"])
        if ts < last.get(track, float("-inf")):
            problems.append(f"event {i} ({ev['name']!r}): ts {ts} before the previous event of track {track}")
        last[track] = ts
        if ph == "X":
            dur = ev.get("dur")
            if not isinstance(dur, (int, float)) or dur < 0:
                problems.append(f"event {i} ({ev['name']!r}): X event needs dur >= 0, got {dur!r}")
                continue
            stack = open_x[track]
            while stack and stack[-1] <= ts + 2e-3:
                stack.pop()
            if stack and ts + dur > stack[-1] + 2e-3:
                problems.append(f"event {i} ({ev['name']!r}): overlaps the slice it starts in on track {track} "
                                "without nesting")
            stack.append(ts + dur)
        elif ph == "B":
            open_b[track].append(str(ev["name"]))
        elif ph == "E":
            if not open_b[track]:
                problems.append(f"event {i}: E without B on track {track}")
            else:
                open_b[track].pop()
        elif ph in ("i", "I") and ev.get("s", "t") not in ("g", "p", "t"):
            problems.append(f"event {i}: instant scope {ev.get('s')!r} is not g, p or t")
    for track, names in open_b.items():
        if names:
            problems.append(f"track {track}: B without E: {names}")
    return problems


def write_trace(path: str, trace: Dict[str, Any]) -> None:
    """Write ``trace`` as JSON to ``path``."""
    with open(path, "w", encoding="utf-8") as f:
        json.dump(trace, f, separators=(",", ":"), default=str)


def events_of(trace: Dict[str, Any], *, ph: Optional[str] = None,
              cat: Optional[str] = None) -> Iterable[Dict[str, Any]]:
    """The trace's events, by phase and category (for tests and the plot)."""
    for ev in trace.get("traceEvents", []):
        if (ph is None or ev.get("ph") == ph) and (cat is None or ev.get("cat") == cat):
            yield ev
