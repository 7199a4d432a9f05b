"""pycoll-fr --trace / --plot: dumps as a Chrome trace-event file and a PNG.

* a real hang on the host backend (one rank never enters an all-reduce, the others time out and dump),
  converted by the CLI, the trace checked against the trace-event format;
* the checker itself finds what is wrong in broken traces;
* operations in flight are drawn to the dump and marked;
* dumps from two (three, four) hosts whose clocks differ are aligned;
* Transition records in a dump become nested phase slices;
* the PNG is a PNG; without matplotlib the error says so.
"""

from __future__ import annotations

import json
import os
import struct
import sys
import time

import numpy as np
import pytest
from helpers.fakes import FakeComm
from helpers.mp import run_ranks

import pycoll
from pycoll import _bindings as B, flight_recorder as fr
from pycoll.diagnostics import analyze, plot, trace
from pycoll.store import TCPStore, TCPStoreServer

PREFIX = fr.DEFAULT_FILE_PREFIX
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def png_size(path):
    """(width, height) of a PNG file, after checking its signature and IHDR chunk."""
    with open(path, "rb") as f:
        head = f.read(24)
    assert head[:8] == PNG_MAGIC and head[12:16] == b"IHDR", head
    return struct.unpack(">II", head[16:24])


def tracks(t):
    """(pid, tid) -> thread name."""
    return {(e["pid"], e["tid"]): e["args"]["name"] for e in t["traceEvents"]
            if e["ph"] == "M" and e["name"] == "thread_name"}


def slices(t, cat=None):
    return [e for e in t["traceEvents"] if e["ph"] == "X" and (cat is None or e["cat"] == cat)]


def instants(t, cat=None):
    return [e for e in t["traceEvents"] if e["ph"] == "i" and (cat is None or e["cat"] == cat)]


# -- a real hang, end to end -----------------------------------------------------------------------

K = 4  # the operation the last rank never enters


@pytest.fixture
def server():
    srv = TCPStoreServer().start()
    yield srv
    srv.close()


def _hung_rank(rank, n, uid, addr, token, dump_dir):
    os.environ["PYCOLL_FR_DUMP_DIR"] = dump_dir
    comm = pycoll.init(rank, n, unique_id=uid, backend="host", store=TCPStore(addr[0], addr[1], token), timeout=1.5)
    x = np.ones(3, np.float32)
    for _ in range(K - 1):
        comm.all_reduce(x)
    rec = pycoll.flight_recorder.get_recorder()
    if rank == n - 1:  # never enters #K: busy elsewhere until the others' dump request reaches it
        deadline = time.monotonic() + 30
        while rec.dump_count == 0 and time.monotonic() < deadline:
            time.sleep(0.02)
        comm.abort()
        return rec.dump_count
    try:
        comm.all_reduce(x)
    except pycoll.CommFailure:
        pass
    comm.abort()
    assert pycoll.watchdog.get_watchdog().wait_for_dumps()
    return rec.dump_count


@pytest.mark.timeout(120)
def test_real_hang_as_a_trace_and_a_plot(server, tmp_path, capsys):
    n = 3
    d = str(tmp_path / "dumps")
    res = run_ranks(_hung_rank, n, bytes(B.load("host").get_unique_id()), server.address, server.token, d,
                    timeout=60)
    assert all(r >= 1 for r in res), res
    out, png = tmp_path / "t.json", tmp_path / "t.png"
    assert analyze.main([d, "--trace", str(out), "--plot", str(png), "--no-stacks"]) == 1  # problems found
    err = capsys.readouterr().err
    assert f"wrote {out}" in err and f"wrote {png}" in err
    t = json.loads(out.read_text())
    assert trace.check_trace(t) == []
    assert t["displayTimeUnit"] == "ms" and t["otherData"]["ranks"] == list(range(n))
    names = {e["pid"]: e["args"]["name"] for e in t["traceEvents"] if e["ph"] == "M" and e["name"] == "process_name"}
    assert sorted(names) == list(range(n)) and all(names[r].startswith(f"rank {r}") for r in range(n))
    ops = slices(t, "collective")
    for r in range(n):
        mine = sorted((e for e in ops if e["pid"] == r), key=lambda e: e["ts"])
        assert [e["args"]["seq"] for e in mine] == list(range(1, K + (r != n - 1)))
        assert all(e["args"]["collective"] == "all_reduce" and e["args"]["input_sizes"] == [[3]]
                   and e["args"]["input_dtypes"] == ["Float"] for e in mine)
        assert all(e["args"]["state"] == "completed" and not e["args"]["in_flight"] for e in mine[:K - 1])
        assert "comm" not in tracks(t)[(r, mine[0]["tid"])] and "gen 0" in tracks(t)[(r, mine[0]["tid"])]
        if r != n - 1:
            last = mine[-1]  # the one the others sat in: marked, drawn to the failure (the timeout)
            assert last["args"]["in_flight"] and last["args"]["first_divergence"]
            assert last["args"]["state"] != "completed"
            assert last["name"].endswith(("(failed)", "(in flight)"))
            assert last["dur"] >= 1.0e6  # at least most of the 1.5 s timeout, in microseconds
    failures = instants(t, "failure")
    assert sorted(e["pid"] for e in failures) == list(range(n - 1))
    assert all(f"all_reduce #{K}" in e["name"] for e in failures)
    assert {e["pid"] for e in instants(t, "dump")} == set(range(n))
    assert {e["args"]["trigger"] for e in instants(t, "dump") if e["pid"] == n - 1} == {"remote"}
    verdicts = [e for e in instants(t, "analysis") if e["name"].startswith("verdict")]
    assert len(verdicts) == 1 and verdicts[0]["s"] == "g"
    assert f"rank {n - 1} never entered all_reduce #{K}" in verdicts[0]["args"]["verdict"]
    assert png_size(png)[0] >= 400


# -- the checker -----------------------------------------------------------------------------------


def _ev(ph, ts, name="x", pid=0, tid=1, **kw):
    return {"ph": ph, "ts": ts, "pid": pid, "tid": tid, "name": name, **kw}


@pytest.mark.parametrize("events,problem", [
    ([{"ph": "X", "ts": 0, "pid": 0, "name": "a", "dur": 1}], "missing ['tid']"),
    ([_ev("X", 0, dur=-1)], "dur >= 0"),
    ([_ev("X", 0)], "dur >= 0"),
    ([_ev("B", 0), _ev("B", 1)], "B without E"),
    ([_ev("E", 0)], "E without B"),
    ([_ev("X", 5, dur=1), _ev("X", 3, dur=1)], "before the previous event"),
    ([_ev("X", 0, dur=10), _ev("X", 5, dur=10)], "without nesting"),
    ([_ev("i", 0, s="q")], "instant scope"),
    ([_ev("X", "0", dur=1)], "not a number"),
])
def test_checker_finds_what_is_wrong(events, problem):
    found = trace.check_trace({"traceEvents": events})
    assert any(problem in p for p in found), found


def test_checker_accepts_nesting_other_tracks_and_object_form():
    ok = [_ev("M", 0, "thread_name", args={"name": "t"}), _ev("X", 0, dur=10), _ev("X", 2, dur=3),
          _ev("X", 5, dur=5), _ev("B", 11), _ev("i", 11, s="t"), _ev("E", 12), _ev("X", 1, tid=2, dur=50)]
    assert trace.check_trace({"traceEvents": ok, "displayTimeUnit": "ms"}) == []
    assert trace.check_trace([]) == ["not a JSON object with a 'traceEvents' list"]
    assert any("serialisable" in p for p in trace.check_trace({"traceEvents": [_ev("i", 0, args={1: object()})]}))


# -- in flight, dump time ---------------------------------------------------------------------------


def f32(k):
    return np.ones(k, np.float32)


def _dumps(folder, n, script, **kw):
    for r in range(n):
        rec = fr.FlightRecorder(64, dump_dir=str(folder))
        c = FakeComm(rec, r, n, uid="abcdef0123456789", **kw)
        script(r, c, rec)
        assert rec.dump("test")
    return str(folder)


def test_in_flight_operations_end_at_the_dump_and_are_marked(tmp_path):
    def script(r, c, rec):
        for _ in range(3):
            c.op("all_reduce", f32(2), f32(2))
        if r != 1:
            c.op("all_gather", f32(2), f32(4), state="started")
            c.op("all_gather", f32(2), f32(4), state="scheduled")  # queued behind it: a second lane
        time.sleep(0.01)

    t = analyze.trace_dir(_dumps(tmp_path, 2, script))
    assert trace.check_trace(t) == []
    dumps = {e["pid"]: e["ts"] for e in instants(t, "dump")}
    flying = [e for e in slices(t) if e["args"]["in_flight"]]
    assert sorted((e["pid"], e["args"]["seq"], e["args"]["state"]) for e in flying) == [
        (0, 4, "started"), (0, 5, "scheduled")]
    for e in flying:
        assert e["name"] == f"all_gather #{e['args']['seq']} (in flight)" and e["args"]["drawn_to"] == "the dump"
        assert e["ts"] + e["dur"] == pytest.approx(dumps[0], abs=0.01)
        assert e["args"]["input_sizes"] == [[2]] and e["args"]["output_sizes"] == [[4]]
    lanes = {tracks(t)[(0, e["tid"])] for e in flying}
    assert len(lanes) == 2 and any(name.endswith("lane 2") for name in lanes)  # overlapping ops do not share a lane
    done = [e for e in slices(t) if not e["args"]["in_flight"]]
    assert len(done) == 6 and all(e["dur"] >= 0 for e in done)
    assert t["otherData"]["counts"]["in_flight"] == 2


# -- several hosts ---------------------------------------------------------------------------------

T0 = 1_700_000_000_000_000_000
MS = 1_000_000


def _synthetic(rank, host, skew, ops, uid="u1", name="world", members=(0, 1, 2, 3)):
    """A dump of ``rank`` on ``host`` whose clock is ``skew`` ns ahead; ``ops``: (seq, true enqueue, true end)."""
    entries = [{
        "record_id": i, "pg_id": 0, "process_group": [uid, name], "collective_seq_id": seq, "p2p_seq_id": 0,
        "op_id": seq, "profiling_name": "nccl:all_reduce", "time_created_ns": enq + skew,
        "input_sizes": [[4]], "input_dtypes": ["Float"], "output_sizes": [[4]], "output_dtypes": ["Float"],
        "state": "completed", "time_discovered_started_ns": enq + skew, "time_discovered_completed_ns": end + skew,
        "retired": True, "timeout_ms": 1000, "is_p2p": False, "thread_id": "1", "thread_name": "main",
    } for i, (seq, enq, end) in enumerate(ops)]
    for e in entries:
        if e["time_discovered_completed_ns"] <= skew:  # end 0: still in flight
            e.update(state="started", time_discovered_completed_ns=None, retired=False)
    return {"version": "2.10", "pg_config": {uid: {"name": uid, "desc": name, "ranks": str(list(members))}},
            "pg_status": {}, "entries": entries,
            "pycoll": {"rank": rank, "hostname": host, "time_ns": T0 + 200 * MS + skew, "generation": 0,
                       "trigger": "manual", "reason": "test", "failures": []}}


def _collectives(rank, k=20):
    rng = np.random.default_rng(rank)
    out = []
    for s in range(1, k + 1):
        enq = T0 + s * 5 * MS + int(rng.integers(0, 2 * MS))  # the ranks arrive apart
        out.append((s, enq, T0 + s * 5 * MS + 3 * MS + int(rng.integers(0, 50_000))))  # and leave together
    return out


def test_clocks_of_several_hosts_are_aligned(tmp_path):
    skew_b, skew_c = 5_123_456_789, -2_000_000_000
    dumps = {0: _synthetic(0, "hostA", 0, _collectives(0)), 1: _synthetic(1, "hostA", 0, _collectives(1)),
             2: _synthetic(2, "hostB", skew_b, _collectives(2)), 3: _synthetic(3, "hostB", skew_b, _collectives(3))}
    # host C shares a communicator with host B only; host D with nobody
    dumps[2]["entries"] += _synthetic(2, "hostB", skew_b, _collectives(12), uid="u2", members=(2, 4))["entries"]
    dumps[4] = _synthetic(4, "hostC", skew_c, _collectives(14), uid="u2", members=(2, 4))
    dumps[5] = _synthetic(5, "hostD", 77 * MS, _collectives(15), uid="u3", members=(5,))
    offsets, notes = trace.clock_offsets([(0, dumps)])
    assert notes["reference"] == "hostA" and offsets["hostA"] == 0
    assert offsets["hostB"] == pytest.approx(skew_b, abs=100_000)  # within 0.1 ms
    assert offsets["hostC"] == pytest.approx(skew_c, abs=200_000)  # through host B
    assert notes["unaligned"] == ["hostD"] and offsets["hostD"] == 0
    assert notes["pairs"]["hostA->hostB"]["within_bounds"] and notes["pairs"]["hostA->hostB"]["samples"] == 20

    t = trace.build_trace([(0, dumps)])
    assert trace.check_trace(t) == []
    ends = {(e["pid"], e["args"]["uid"], e["args"]["seq"]): e["ts"] + e["dur"] for e in slices(t)}
    for s in range(1, 21):  # completions line up again across hosts (microseconds)
        assert abs(ends[(0, "u1", s)] - ends[(3, "u1", s)]) < 150
        assert abs(ends[(2, "u2", s)] - ends[(4, "u2", s)]) < 250
    assert t["otherData"]["clock"]["offsets_ns"]["hostB"] == offsets["hostB"]
    dump_ts = {e["pid"]: e["ts"] for e in instants(t, "dump")}
    assert dump_ts[0] == pytest.approx(dump_ts[2], abs=100)  # the dumps' own times are shifted too
    # without the correction they would be 5 s apart: the same dumps, one host
    for d in dumps.values():
        d["pycoll"]["hostname"] = "one"
    flat = trace.build_trace([(0, dumps)])
    flat_ends = {(e["pid"], e["args"]["uid"], e["args"]["seq"]): e["ts"] + e["dur"] for e in slices(flat)}
    assert abs(flat_ends[(0, "u1", 1)] - flat_ends[(3, "u1", 1)]) > 5e6


def test_one_host_and_torch_dumps_need_no_offsets():
    d = _synthetic(0, "h", 0, _collectives(0, 3))
    del d["pycoll"]  # torch's own dumps have no pycoll section: no host, no dump time
    offsets, notes = trace.clock_offsets([(0, {0: d})])
    assert offsets == {"": 0} and notes["unaligned"] == []
    t = trace.build_trace([(0, {0: d})])
    assert trace.check_trace(t) == [] and len(slices(t)) == 3 and not instants(t, "dump")


# -- elastic transitions -----------------------------------------------------------------------------


def test_transitions_in_the_dumps_become_phase_slices(tmp_path):
    now = time.time()
    shrink = {"kind": "shrink", "generation": 1, "members_before": [0, 1, 2], "members_after": [0, 1],
              "cause": "RemoteError", "detected": now, "agreement_started": now + 0.002, "agreed": now + 0.009,
              "revoked": now + 0.0091, "comm_ready": now + 0.013, "first_collective": now + 0.014, "attempts": 1,
              "committed": None, "slot": 0}

    def script(r, c, rec):
        c.op("all_reduce", f32(2), f32(2))
        if r == 0:
            rec.add_transition(shrink)
            rec.add_transition({**shrink, "kind": "grow", "generation": 2, "detected": now + 1,
                                "agreement_started": now + 1, "agreed": now + 1.001, "revoked": now + 1.001,
                                "comm_ready": now + 1.005, "first_collective": now + 1.006})

    d = _dumps(tmp_path, 2, script)
    with open(os.path.join(d, "json", "generation_0", f"{PREFIX}0.json")) as f:
        assert [t["kind"] for t in json.load(f)["pycoll"]["transitions"]] == ["shrink", "grow"]
    t = analyze.trace_dir(d)
    assert trace.check_trace(t) == []
    el = slices(t, "elastic")
    assert {e["pid"] for e in el} == {0} and tracks(t)[(0, el[0]["tid"])] == "elastic (recovery phases)"
    names = [e["name"] for e in el]
    assert names == ["shrink -> generation 1", "to agreement", "agreement", "revoke", "shrink", "first collective",
                     "grow -> generation 2", "agreement", "grow", "first collective"]
    top = el[0]
    assert top["dur"] == pytest.approx(14_000, abs=2) and top["args"]["members_after"] == [0, 1]
    assert [round(e["dur"]) for e in el[1:6]] == [2000, 7000, 100, 3900, 1000]
    assert sum(e["dur"] for e in el[1:6]) == pytest.approx(top["dur"], abs=0.01)  # consecutive, inside it
    assert t["otherData"]["counts"]["phases"] == 10


def test_transitions_are_recorded_by_the_elastic_layer():
    import inspect

    from pycoll import elastic

    assert "add_transition" in inspect.getsource(elastic.ElasticGroup._record)  # the demo test runs it for real


# -- the picture -----------------------------------------------------------------------------------


def test_plot_is_a_png_around_the_divergence(tmp_path):
    d = tmp_path / "d" / "generation_0"
    d.mkdir(parents=True)
    for r in range(3):
        ops = _collectives(r, 12) + ([(13, T0 + 13 * 5 * MS, 0)] if r != 2 else [])  # rank 2 never enters #13
        (d / f"{PREFIX}{r}.json").write_text(json.dumps(_synthetic(r, "h", 0, ops, members=(0, 1, 2))))
    t = analyze.trace_dir(str(tmp_path / "d"))
    assert trace.check_trace(t) == []
    start, end, div = plot.plot_window(t)
    first_div = min(e["ts"] for e in instants(t, "analysis") if e["name"].startswith("first divergence"))
    assert div == first_div and start < div < end
    early = sorted(e["ts"] for e in slices(t) if e["pid"] == 0)[0]
    assert start > early  # the window starts a few operations before the divergence, not at the beginning
    drawn = plot.plot_trace(t, str(tmp_path / "p.png"))
    assert drawn["ranks"] == [0, 1, 2] and drawn["ops"]["in flight"] == 2 and drawn["ops"]["completed"] >= 6
    w, h = png_size(tmp_path / "p.png")
    assert w == 1100 and h > 200
    assert os.path.getsize(tmp_path / "p.png") < 150_000


def test_plot_goes_through_where_ranks_that_ran_ahead_are_held(tmp_path):
    # small broadcasts on the host library's eager lane: rank 2 never enters #5, while its root, rank 0, runs 16
    # ahead and waits in #21 for it and rank 1 waits in #22 for the root; no operation is under way at the
    # divergence, and the picture ended 0.1 ms after it, with no in-flight operation and no failure in it
    d = tmp_path / "d" / "generation_0"
    d.mkdir(parents=True)
    for r, last in ((0, 20), (1, 21), (2, 4)):
        ops = [(s, T0 + s * MS // 10 + r * 50_000, T0 + s * MS // 10 + r * 50_000 + 20_000) for s in range(1, last + 1)]
        if r != 2:
            ops.append((last + 1, T0 + (last + 1) * MS // 10 + r * 50_000, 0))
        dump = _synthetic(r, "h", 0, ops, members=(0, 1, 2))
        for e in dump["entries"]:
            e["profiling_name"] = "nccl:broadcast"
        (d / f"{PREFIX}{r}.json").write_text(json.dumps(dump))
    t = analyze.trace_dir(str(tmp_path / "d"))
    start, end, div = plot.plot_window(t)
    held = [e for e in slices(t) if e["args"]["in_flight"]]
    assert sorted(e["args"]["seq"] for e in held) == [21, 22] and all(e["ts"] > div for e in held), held
    assert all(e["ts"] + e["dur"] <= end for e in held), (end, held)
    drawn = plot.plot_trace(t, str(tmp_path / "p.png"))
    assert drawn["ops"]["in flight"] == 2 and sorted(drawn["labels"]) == [0, 1], drawn


def test_plot_names_the_communicator_of_each_divergence_and_held_operation(tmp_path):
    # s9's subhang: rank 2 waits in its pair's all_reduce #2 (rank 3 never calls it), ranks 0-1 in world's #2: the
    # picture names each communicator, as the text does, instead of one unnamed 'all_reduce #2' line
    recs = [fr.FlightRecorder(64, dump_dir=str(tmp_path)) for _ in range(4)]
    world = [FakeComm(recs[r], r, 4, uid="w000000000000000", name="world") for r in range(4)]
    pair = [FakeComm(recs[r], r % 2, 2, uid=f"p{r // 2}00000000000000", name="pair",
                     global_ranks=[2 * (r // 2), 2 * (r // 2) + 1]) for r in range(4)]
    for comms in (world, pair):  # the ranks side by side, as in a run
        for c in comms:
            c.op("all_reduce", f32(2), f32(2))
    for r in range(3):
        pair[r].op("all_reduce", f32(2), f32(2), state="started" if r == 2 else "completed")
    for r in range(2):
        world[r].op("all_reduce", f32(2), f32(2), state="started")
    for rec in recs:
        assert rec.dump("test")
    drawn = plot.plot_trace(analyze.trace_dir(str(tmp_path)), str(tmp_path / "p.png"))
    assert drawn["labels"][2] == ["'pair' all_reduce #2 (in flight)"], drawn["labels"]
    assert drawn["labels"][0] == ["'world' all_reduce #2 (in flight)"], drawn["labels"]
    assert sorted(drawn["divergence"].split("; ")) == ["'pair' (ranks 2-3) all_reduce #2 [Float(2,)]",
                                                       "'world' (ranks 0-3) all_reduce #2 [Float(2,)]"], drawn
    assert drawn["notes"][2] == "never entered 'world' (ranks 0-3) all_reduce #2 [Float(2,)]", drawn["notes"]
    assert "'pair' (ranks 2-3) all_reduce #2" in drawn["notes"][3] and "'world'" in drawn["notes"][3]


def test_plot_without_matplotlib_says_so(tmp_path, monkeypatch, capsys):
    d = _dumps(tmp_path / "d", 2, lambda r, c, rec: c.op("all_reduce", f32(2), f32(2)))
    for name in [m for m in sys.modules if m == "matplotlib" or m.startswith("matplotlib.")]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    with pytest.raises(ImportError, match="needs matplotlib"):
        plot.plot_trace(analyze.trace_dir(d), str(tmp_path / "p.png"))
    assert analyze.main([d, "--plot", str(tmp_path / "p.png")]) == 2
    assert "needs matplotlib" in capsys.readouterr().err
    assert not os.path.exists(tmp_path / "p.png")


def test_collectives_of_no_element_do_not_set_the_clocks():
    # they meet nothing (each rank's returns at once): a host late to five of them was shifted by its lateness
    ops = [(s, T0 + s * 5 * MS, T0 + s * 5 * MS + 100_000) for s in range(1, 4)]
    late = [(s, T0 + s * 5 * MS + 400 * MS, T0 + s * 5 * MS + 400 * MS + 10_000) for s in range(4, 9)]
    early = [(s, T0 + s * 5 * MS, T0 + s * 5 * MS + 10_000) for s in range(4, 9)]
    dumps = {0: _synthetic(0, "hostA", 0, ops + early, members=(0, 1)),
             1: _synthetic(1, "hostB", 0, ops + late, members=(0, 1))}
    for d in dumps.values():
        for e in d["entries"]:
            if e["collective_seq_id"] >= 4:
                e["input_sizes"] = e["output_sizes"] = [[0]]
    offsets, notes = trace.clock_offsets([(0, dumps)])
    assert offsets["hostB"] == pytest.approx(0, abs=200_000) and notes["pairs"]["hostA->hostB"]["samples"] == 3


def test_operations_that_failed_without_their_communicator_are_not_drawn_in_flight(tmp_path):
    # an abort's or a dropped group's operations were drawn '(in flight)' up to the dump
    from pycoll import CommAborted, CommStateError

    def script(r, c, rec):
        c.op("all_reduce", f32(2), f32(2))
        w = c.op("all_reduce", f32(2), f32(2), state="scheduled")
        w._exc = CommStateError("all_reduce (seq 2) never ran: its block raised")
        w = c.op("all_reduce", f32(2), f32(2), state="started")
        w._exc = CommAborted("all_reduce #3 on communicator 'world' did not complete: the communicator was aborted")

    t = analyze.trace_dir(_dumps(tmp_path, 1, script))
    assert trace.check_trace(t) == []
    by_seq = {e["args"]["seq"]: e for e in slices(t)}
    assert by_seq[2]["name"].endswith("(never ran)") and by_seq[2]["dur"] == 0 and not by_seq[2]["args"]["in_flight"]
    assert by_seq[3]["name"].endswith("(failed)") and not by_seq[3]["args"]["in_flight"]
    assert t["otherData"]["counts"]["in_flight"] == 0
    # the plot drew both as completed (and its window could cut them off)
    pytest.importorskip("matplotlib")
    drawn = plot.plot_trace(t, str(tmp_path / "p.png"))
    assert drawn["ops"]["failed"] == 2 and drawn["ops"]["completed"] == 1, drawn


def test_a_verdict_without_a_collective_keeps_the_trace_s_time_origin(tmp_path):
    # a point-to-point hang: the verdict had no collective slice to go to, was put at time 0, and every other event
    # came 56 years after it (durations rounded to 0.25 us)
    from pycoll import CommTimeout

    def script(r, c, rec):
        if r == 0:
            c.op("recv", None, f32(2), peer=1)
            w = c.op("recv", None, f32(2), peer=1, state="started")
            w._exc = CommTimeout("recv did not complete")
        else:
            c.op("send", f32(2), None, peer=0)

    t = analyze.trace_dir(_dumps(tmp_path, 2, script))
    assert trace.check_trace(t) == []
    assert t["otherData"]["time_origin_unix_ns"] > T0
    assert max(e["ts"] for e in t["traceEvents"] if "ts" in e) < 60e6  # microseconds: within a minute
    assert any(e["name"].startswith("verdict") for e in instants(t, "analysis"))


def test_a_rank_without_a_dump_has_a_row_and_replaced_dumps_are_markers(tmp_path):
    def script(r, c, rec):
        for _ in range(3):
            c.op("all_reduce", f32(2), f32(2))
        if r == 0:
            rec.dump("asked by a peer", trigger="remote")  # replaced by the test's dump (below)
        c.op("all_reduce", f32(2), f32(2), state="started")

    folder = _dumps(tmp_path, 3, script)
    os.unlink(os.path.join(folder, "generation_0", f"{fr.DEFAULT_FILE_PREFIX}2"))  # rank 2 was killed
    t = analyze.trace_dir(folder)
    assert trace.check_trace(t) == []
    assert sorted(e["name"] for e in instants(t, "dump") if e["pid"] == 0) == ["dump (manual)",
                                                                               "dump (remote, replaced)"]
    pytest.importorskip("matplotlib")
    drawn = plot.plot_trace(t, str(tmp_path / "p.png"))
    assert drawn["ranks"] == [0, 1, 2] and drawn["notes"] == {2: "no dump: not seen entering it"}, drawn


def test_a_verdict_of_another_communicator_puts_no_note_on_the_ranks_drawn(tmp_path):
    # an elastic run: generation 2's verdict (slot 2 left no dump there) lay in the window of generation 0's
    # divergence, and rank 2's row there said "no dump: not seen entering it" beside its own dump and failure
    pytest.importorskip("matplotlib")

    def op(pid, ts, name, **args):
        return {"ph": "X", "name": name, "cat": "collective", "pid": pid, "tid": 10, "ts": ts, "dur": 5.0,
                "args": {"communicator": "elastic", **args}}

    evs = [op(r, 0.0, "all_reduce #21 (in flight)", in_flight=True, first_divergence=True) for r in range(3)]
    evs += [{"ph": "i", "s": "t", "name": "first divergence: all_reduce #21", "cat": "analysis", "pid": r, "tid": 10,
             "ts": 0.0, "args": {"uid": "gen0", "members": [0, 1, 2], "never_entered": []}} for r in range(3)]
    evs += [{"ph": "i", "s": "g", "name": "verdict (elastic, generation 0): ...", "cat": "analysis", "pid": 0,
             "tid": 0, "ts": 0.0, "args": {"uid": "gen0", "missing_dumps": []}},
            {"ph": "i", "s": "g", "name": "verdict (elastic, generation 2): ...", "cat": "analysis", "pid": 0,
             "tid": 0, "ts": 3.0, "args": {"uid": "gen2", "missing_dumps": [2]}}]
    drawn = plot.plot_trace({"traceEvents": evs}, str(tmp_path / "p.png"))
    assert drawn["ranks"] == [0, 1, 2] and drawn["notes"] == {}, drawn
