"""pycoll-fr: the analyzer on dumps written by the real flight recorder (fed FakeComm operations)."""

from __future__ import annotations

import json
import os
import pickle
import shutil
import subprocess
import sys

import numpy as np
import pytest
from helpers.fakes import FakeComm

from pycoll import analyze, flight_recorder as fr
from pycoll.diagnostics.analyze import trace_dir

PREFIX = fr.DEFAULT_FILE_PREFIX


def f32(n, dtype=np.float32):
    return np.ones(n, dtype)


def make_dumps(folder, n, script, *, uid="abcdef0123456789", name="world", generation=0, buffer_size=64,
               write_json=True):
    """Each rank's ops come from ``script(rank, comm)``; each rank dumps like a real process would."""
    for r in range(n):
        rec = fr.FlightRecorder(buffer_size if isinstance(buffer_size, int) else buffer_size[r], dump_dir=str(folder))
        c = FakeComm(rec, r, n, uid=uid, name=name, generation=generation)
        script(r, c)
        assert rec.dump("test", write_json=write_json)
    return str(folder)


def allreduces(c, k, **kw):
    for _ in range(k):
        c.op("all_reduce", f32(2), f32(2), **kw)


def run_cli(*args):
    return analyze.main([str(a) for a in args])


def torch_fr_trace(folder, *extra):
    pytest.importorskip("torch.distributed.flight_recorder.fr_trace")
    out = subprocess.run([sys.executable, "-m", "torch.distributed.flight_recorder.fr_trace", folder, "-p", PREFIX,
                          *extra], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stdout + out.stderr
    return out.stdout + out.stderr


def one(folder):
    reps = analyze.analyze_dir(folder)
    assert len(reps) == 1
    return reps[0], reps[0]["communicators"][0]


def stopped_rank(r, c):
    allreduces(c, 4)
    if r != 3:
        c.op("all_reduce", f32(2), f32(2), state="started")


def test_rank_that_never_entered(tmp_path, capsys):
    d = make_dumps(tmp_path, 4, stopped_rank)
    rep, c = one(d)
    assert rep["ranks"] == [0, 1, 2, 3] and rep["generation"] == 0 and not rep["ok"]
    div = c["first_divergence"]
    assert div["seq"] == 5 and list(div["never_entered"]) == [3] and sorted(div["in_flight"]) == [0, 1, 2]
    assert div["never_entered"][3]["last_op"] == "all_reduce #4 [Float(2,)]"
    assert c["matched_through"] == 4
    assert run_cli(d) == 1
    text = capsys.readouterr().out
    assert "FIRST DIVERGENCE at all_reduce #5 [Float(2,)]" in text
    assert "rank 3: never entered it (last op all_reduce #4 [Float(2,)] completed, issued at fakes.py:" in text
    assert "ranks 0-2: still in flight (state started)" in text
    assert "verdict: rank 3 never entered all_reduce #5 [Float(2,)] on 'world'" in text
    assert "stopped_rank at " in text  # the stack of the in-flight operation
    assert run_cli(d, "--no-stacks") == 1 and "stopped_rank at " not in capsys.readouterr().out
    assert run_cli(d, "--stack-depth", "0") == 1 and "stopped_rank at " not in capsys.readouterr().out
    for flags in (["--no-stacks"], ["--stack-depth", "0"]):  # the JSON form leaves them out alike
        assert run_cli(d, "--json", *flags) == 1 and "stopped_rank at " not in capsys.readouterr().out
    assert run_cli(d, "--json") == 1 and "stopped_rank at " in capsys.readouterr().out
    for bad in ("-1", "x"):
        with pytest.raises(SystemExit) as e:
            run_cli(d, "--stack-depth", bad)
        assert e.value.code == 2 and "--stack-depth: " in capsys.readouterr().err


def test_missing_dump_is_reported_not_fatal(tmp_path, capsys):
    d = make_dumps(tmp_path, 4, stopped_rank)
    os.unlink(os.path.join(d, "generation_0", f"{PREFIX}3"))
    rep, c = one(d)
    assert c["missing_dumps"] == [3] and c["first_divergence"]["seq"] == 5
    assert "no dump and no store report" in c["first_divergence"]["missing_dumps"][3]
    assert run_cli(d) == 1
    assert "missing dumps: ranks 3" in capsys.readouterr().out


def _rooted_loop(op, ops_done, *, ar_at=(), roots=True):
    """A script: all_reduce #1, then ``op`` (small: the host library's eager lane) until rank r has completed
    ``ops_done[r]`` operations after #1 (all_reduce at the sequence ids in ``ar_at``); each rank's next one is left
    in flight. Rank 0 is the root: it has a gather's output and a scatter's input, and the entries record it as the
    root (``roots``; False: as an earlier pycoll's dumps, without)."""
    root = 0 if roots else None

    def script(r, c):
        c.op("all_reduce", f32(2), f32(2))
        for i in range(ops_done[r] + 1):
            state = "completed" if i < ops_done[r] else "started"
            if i + 2 in ar_at:
                c.op("all_reduce", f32(2), f32(2), state=state)
            elif op == "gather":
                c.op("gather", f32(2), f32(2 * 3) if r == 0 else None, state=state, root=root)
            elif op == "scatter":
                c.op("scatter", f32(2 * 3) if r == 0 else None, f32(2), state=state, root=root)
            else:
                c.op(op, f32(2), f32(2), state=state, root=root)
    return script


# (op, operations each rank completed after all_reduce #1, the rank whose dump is missing, all_reduce's seq ids,
#  the collectives its part in is not shown: (from, through) or None, the entries record the root)
RAN_AHEAD = {
    # a broadcast's receiver killed: its root ran ahead, the other receiver with it, and the root waits at #8
    "broadcast receiver": ("broadcast", [6, 7, 2], 2, (), (2, 7), True),
    # an all_reduce in between shows that it got that far (#4), not further
    "broadcast receiver, all_reduce": ("broadcast", [6, 7, 4], 2, (4,), (5, 7), True),
    # a broadcast's root killed: its receivers' completions show its part
    "broadcast root": ("broadcast", [2, 5, 4], 0, (), None, True),
    # a gather's root killed: its other ranks completed #2-#6 without it
    "gather root": ("gather", [2, 5, 5], 0, (), (2, 6), True),
    # a gather's other rank killed: the root's completions show its part
    "gather sender": ("gather", [2, 5, 1], 2, (), None, True),
    # a scatter's root killed: its receivers' completions show its part
    "scatter root": ("scatter", [2, 4, 4], 0, (), None, True),
    # a reduce's other rank killed: the root's completions show its part
    "reduce sender": ("reduce", [3, 5, 1], 2, (), None, True),
    # dumps without the roots (an earlier pycoll's): a scatter's root only where it is the only rank without a dump
    # (its input tells), a reduce's or broadcast's root nowhere, so nothing shows a reduce's sender's part
    "scatter root, no roots": ("scatter", [2, 4, 4], 0, (), None, False),
    "reduce sender, no roots": ("reduce", [3, 5, 1], 2, (), (2, 4), False),
}


@pytest.mark.parametrize("case", list(RAN_AHEAD))
def test_a_rank_without_a_dump_is_not_taken_to_have_done_what_senders_ran_ahead_with(tmp_path, case, capsys):
    # a rooted collective's senders complete without waiting for the ranks they send to (up to 16 operations ahead
    # on the host library's eager lane): their completions must not pass for the part of a rank without a dump,
    # which the report said took part in every operation before the ranks with dumps got stuck
    op, done, missing, ar_at, unshown, roots = RAN_AHEAD[case]
    d = make_dumps(tmp_path, 3, _rooted_loop(op, done, ar_at=ar_at, roots=roots), write_json=False)
    os.unlink(os.path.join(d, "generation_0", f"{PREFIX}{missing}"))
    _, c = one(d)
    assert c["missing_dumps"] == [missing]
    if unshown is None:
        assert c["unshown"] == {} and "may have stopped" not in c["verdict"], c
        return
    first, through = unshown
    assert c["unshown"] == {missing: {"from": first, "through": through,
                                      "ops": sorted({op} | ({"all_reduce"} if first in ar_at else set()))}}, c
    assert c["matched_through"] == through and c["first_divergence"]["seq"] == through + 1, c
    assert missing in c["culprits"], c["culprits"]
    assert (f"rank {missing} (no dump) may have stopped as early as #{first}: {op} #{first}-#{through} completed "
            "on the ranks with dumps, which shows its part only where it sent to them") in c["verdict"], c["verdict"]
    # after what the verdict says of the operation where the ranks with dumps are held, not instead of it
    assert c["verdict"].startswith(f"{op} #{through + 1} [Float("), c["verdict"]
    assert run_cli(d) == 1
    text = capsys.readouterr().out
    assert f"rank {missing} (no dump): its part is shown only through #{first - 1}: {op} #{first}-#{through}" in text
    assert ("a broadcast's or scatter's root completes without waiting for its receivers" if op == "broadcast"
            else "a gather's or reduce's other ranks complete without waiting for the root") in text


@pytest.mark.parametrize("kind,culprit", [("size", 2), ("dtype", 1), ("type", 0)])
def test_mismatches_name_the_culprit(tmp_path, kind, culprit):
    def script(r, c):
        allreduces(c, 2)
        if r == culprit and kind == "size":
            c.op("all_reduce", f32(8), f32(8), state="started")
        elif r == culprit and kind == "dtype":
            c.op("all_reduce", f32(2, np.float64), f32(2, np.float64), state="started")
        elif r == culprit and kind == "type":
            c.op("all_gather", f32(2), f32(8), state="started")
        else:
            c.op("all_reduce", f32(2), f32(2), state="started")

    _, c = one(make_dumps(tmp_path, 4, script))
    m = c["first_divergence"]["mismatch"]
    assert c["first_divergence"]["seq"] == 3 and m["kind"] == kind and m["culprits"] == [culprit]
    assert [v["ranks"] for v in m["variants"]] == [sorted(set(range(4)) - {culprit}), [culprit]]
    text = analyze.format_report(analyze.analyze_dir(str(tmp_path)))
    assert f"{kind.upper() if kind != 'type' else 'OPERATION TYPE'} MISMATCH: culprit rank {culprit}" in text


PASSED = ("Broadcast : collective mismatch at collective #2: rank 2 called Broadcast(count=2, datatype=ncclFloat32, "
          "root=1) but rank 1 went past it (to its collective with data #4) without doing its part for rank 2: it "
          "called another operation or other arguments there")
ROOTS = ("Broadcast : collective mismatch at collective #2: rank 1 called Broadcast(count=2, datatype=ncclFloat32, "
         "root=1) but rank 0 called Broadcast(count=2, datatype=ncclFloat32, root=0)")


@pytest.mark.parametrize("case", ["went past", "roots of two"])
def test_a_mismatch_that_only_the_waiting_rank_found_is_named(tmp_path, case, capsys):
    # the host library's eager lane: a broadcast's root completes without its receivers and runs ahead, so only the
    # rank that waits finds the mismatch. "went past": rank 2 called root=1 (it waits for rank 1's message) while
    # ranks 0-1 called root=0 and went on; the library's text names no call of rank 1's, and the report said only
    # "completed on ranks 0-1 but not on 2". "roots of two": rank 1 called root=1; its error gives ranks 0's and
    # 1's roots, ranks 2-3 completed it: "no majority" is among the ranks whose root is known
    n, odd, text = (3, 2, PASSED) if case == "went past" else (4, 1, ROOTS)

    def script(r, c):
        allreduces(c, 1)
        w = c.op("broadcast", f32(2), f32(2), state="started" if r == odd else "completed")
        if r == odd:
            w._exc = RuntimeError(text)
            c.recorder.comm_failed(c, w._exc, w)
        else:
            c.op("broadcast", f32(2), f32(2), state="started")

    _, c = one(make_dumps(tmp_path, n, script, write_json=False))
    m = c["first_divergence"]["mismatch"]
    if case == "went past":
        assert m["kind"] == "call" and m["culprits"] == [2], m
        assert c["verdict"] == "collective call mismatch in broadcast #2 [Float(2,)] on 'world': rank 2 differs"
        assert run_cli(tmp_path) == 1
        assert ("rank 2: called Broadcast(count=2, datatype=ncclFloat32, root=1); rank 1 went past it without doing "
                "its part for rank 2 (it called another operation or other arguments there)") in capsys.readouterr().out
    else:
        assert m["kind"] == "root" and m["culprits"] == [] and m["known"] == [0, 1], m
        assert c["verdict"] == ("root mismatch in broadcast #2 [Float(2,)] on 'world': no majority among ranks 0-1, "
                                "whose root the library's errors give (ranks 2-3 completed it: what they called is "
                                "not in the dumps)"), c["verdict"]


def test_no_majority_names_no_culprit(tmp_path):
    def script(r, c):
        c.op("all_reduce", f32(4 if r < 2 else 8), f32(4 if r < 2 else 8), state="started")

    _, c = one(make_dumps(tmp_path, 4, script))
    assert c["first_divergence"]["mismatch"]["culprits"] == []
    assert "no majority" in analyze._verdict(c)


def test_a_rank_whose_operation_failed_is_not_said_to_be_in_flight(tmp_path, capsys):
    # "rank 0: still in flight (state started)" was said of an operation that had failed there (its error recorded)
    from pycoll import CommTimeout

    def script(r, c):
        allreduces(c, 2)
        if r != 2:
            w = c.op("all_reduce", f32(2), f32(2), state="started")
            if r == 0:
                w._exc = CommTimeout("all_reduce (seq 3) did not complete within 2 s")

    assert run_cli(make_dumps(tmp_path, 3, script)) == 1
    text = capsys.readouterr().out
    assert "rank 0: failed in it (CommTimeout; state started)" in text, text
    assert "rank 1: still in flight (state started)" in text, text


def test_everyone_stuck_is_not_a_desync(tmp_path):
    def script(r, c):
        allreduces(c, 2)
        c.op("all_reduce", f32(2), f32(2), state="started")

    _, c = one(make_dumps(tmp_path, 3, script))
    assert "every rank entered all_reduce #3" in analyze._verdict(c) and "not a desync" in analyze._verdict(c)


@pytest.mark.parametrize("waiting", [[1], [0, 2]])
def test_an_operation_that_never_started_names_its_rank(tmp_path, waiting):
    # every rank entered #3, but on some its operation is still scheduled (queued behind a hung kernel on its
    # stream): those ranks are named, not "not a desync"
    def script(r, c):
        allreduces(c, 2)
        c.op("all_reduce", f32(2), f32(2), state="scheduled" if r in waiting else "started")

    _, c = one(make_dumps(tmp_path, 3, script))
    v = analyze._verdict(c)
    started = [r for r in range(3) if r not in waiting]
    who = "rank 1 entered" if waiting == [1] else "ranks 0, 2 entered"
    assert v.startswith(f"{who} all_reduce #3 [Float(2,)] on 'world' but"), v
    assert "never started" in v and "not a desync" not in v, v
    assert f"rank{'s' if len(started) > 1 else ''} {', '.join(map(str, started))} started it" in v, v


def test_an_operation_failed_before_it_started_is_not_said_to_wait_for_its_stream(tmp_path):
    # rank 1's all_reduce #3 failed after its data moved (ranks 2-3 completed it), and rank 0's was failed by a revoke
    # before it was seen starting (scheduled): the verdict blamed rank 0's stream ("never started: work queued before
    # it ... has not finished") and had rank 1 "started it and waits for it", and the culprits said rank 0. A
    # collective completed on some ranks had every rank's part run
    def script(r, c):
        allreduces(c, 2)
        w = c.op("all_reduce", f32(2), f32(2), state={0: "scheduled", 1: "started"}.get(r, "completed"))
        if r < 2:
            w._exc = RuntimeError("CommRevoked: revoked" if r == 0 else "AsyncCommError: failed")
            c.recorder.comm_failed(c, w._exc, w)

    _, c = one(make_dumps(tmp_path, 4, script, write_json=False))
    assert c["verdict"] == "all_reduce #3 [Float(2,)] on 'world' completed on ranks 2-3 but not on 0-1", c["verdict"]
    assert analyze._culprits(c) == []


def test_an_operation_held_in_an_open_group_is_named_not_issued(tmp_path):
    # rank 0's all_reduce #3 waits in a group() it has not ended (its dump's progress does not count it as issued):
    # it was "every rank entered ... not a desync", or its stream was blamed
    def script(r, c):
        allreduces(c, 2)
        c.op("all_reduce", f32(2), f32(2), state="scheduled" if r == 0 else "started", grouped=r == 0)

    _, c = one(make_dumps(tmp_path, 3, script))
    v = analyze._verdict(c)
    assert v.startswith("rank 0 never issued all_reduce #3 [Float(2,)] on 'world': it waited in a group() that had "
                        "not ended there"), v
    assert "ranks 1-2 started it and wait for it" in v, v
    assert c["first_divergence"]["in_flight"][0]["grouped"] and not c["first_divergence"]["in_flight"][1]["grouped"]


def test_a_root_mismatch_on_a_reordered_split_gives_the_roots_job_wide_rank_too(tmp_path):
    # 'half' holds jobs ranks 3 and 2 in that order; both meant job rank 3 as the root, rank 2 passed 1 (itself):
    # "rank 3: root=0" read as job rank 0, no member at all
    members = [3, 2]
    for local, g in enumerate(members):
        rec = fr.FlightRecorder(16, dump_dir=str(tmp_path))
        c = FakeComm(rec, local, 2, uid="0123456789abcdef", name="half", global_ranks=members)
        c.op("broadcast", f32(2), f32(2), state="started", root=1 if g == 2 else 0)
        assert rec.dump("test")
    _, c = one(str(tmp_path))
    m = c["first_divergence"]["mismatch"]
    assert m["kind"] == "root", m
    texts = json.dumps(m)
    assert "root=1 (global 2)" in texts and "root=0 (global 3)" in texts, texts


def test_a_group_waiting_for_a_transfer_with_no_sender_names_that_transfer_not_its_delivered_send(tmp_path):
    # rank 0 groups a send to rank 1 (delivered: rank 1's recv completed) and a recv from rank 2, which never sends:
    # the verdict named the send 0->1 ("not completed (send started, recv completed)") and ranks 0 and 1
    def script(r, c):
        allreduces(c, 1)
        if r == 0:
            c.op("send", f32(4), peer=1, state="started")
            c.op("recv", None, f32(4), peer=2, state="started")
        elif r == 1:
            c.op("recv", None, f32(4), peer=0)

    _, c = one(make_dumps(tmp_path, 3, script))
    assert c["verdict"] == ("point-to-point problem on 'world': recv #1 on rank 0 from rank 2 has no matching send "
                            "on rank 2"), c["verdict"]
    assert c["culprits"] == [0, 2]


def test_an_operation_started_on_no_rank_points_at_the_streams_not_the_transport(tmp_path):
    # every rank behind a hung kernel of its own (an SPMD job): the transport cannot be what holds it
    def script(r, c):
        allreduces(c, 2)
        c.op("all_reduce", f32(2), f32(2), state="scheduled")

    _, c = one(make_dumps(tmp_path, 3, script))
    v = analyze._verdict(c)
    assert v.startswith("every rank entered all_reduce #3 [Float(2,)] on 'world' and on none did it start"), v
    assert "not a desync" not in v and "transport" in v and c["culprits"] == [], (v, c["culprits"])


def test_a_captured_operation_is_neither_in_flight_nor_a_divergence(tmp_path, capsys):
    # an all_reduce captured in a CUDA graph (its entry stays "captured": it runs at the graph's replays), the
    # replay watched and done, then rank 0's stream hangs under all_reduce #5: the verdict is on #5
    def script(r, c):
        allreduces(c, 1)
        c.op("all_reduce", f32(2), f32(2), state="captured")
        c.op("graph_replay")
        c.op("barrier")
        c.op("all_reduce", f32(2), f32(2), state="scheduled" if r == 0 else "started")
        c.op("send", f32(2), peer=1 - r, state="captured")  # a captured send and recv pair: no P2P issue
        c.op("recv", None, f32(2), peer=1 - r, state="captured")

    d = make_dumps(tmp_path, 2, script)
    rep, c = one(d)
    div = c["first_divergence"]
    assert div["seq"] == 5 and c["matched_through"] == 4 and not c["p2p"], c
    assert c["verdict"].startswith("rank 0 entered all_reduce #5 [Float(2,)] on 'world' but its operation never "
                                   "started"), c["verdict"]
    assert c["culprits"] == [0]
    first = c["captured"][0]
    assert (first["seq"], first["ranks"], first["capture_ids"]) == (2, [0, 1], [1])
    run_cli(d)
    out = capsys.readouterr().out
    assert "state captured" not in out and "captured in a CUDA graph, not in flight" in out, out
    assert "all_reduce #2 [Float(2,)] (capture 1)" in out, out
    # the trace draws it as captured at its enqueue, not in flight to the dump
    slices = [e for e in analyze.trace_dir(d)["traceEvents"] if e.get("ph") == "X"]
    captured = [e for e in slices if e["args"].get("captured")]
    assert sorted(e["name"] for e in captured if e["pid"] == 0) == [
        "all_reduce #2 (captured)", "recv 0<-1 #2 (captured)", "send 0->1 #1 (captured)"], captured
    assert not any(e["args"]["in_flight"] for e in captured) and all(e["dur"] == 0 for e in captured)


def test_a_hung_graph_replay_is_named_not_the_operations_captured_in_it(tmp_path):
    # the graph's two all_reduces were captured on every rank; its replay (watch_stream's graph_replay #4) is
    # still to finish everywhere: the replay is the divergence
    def script(r, c):
        allreduces(c, 1)
        c.op("all_reduce", f32(2), f32(2), state="captured")
        c.op("all_reduce", f32(2), f32(2), state="captured")
        c.op("graph_replay", state="scheduled")

    _, c = one(make_dumps(tmp_path, 2, script))
    assert c["first_divergence"]["seq"] == 4 and c["first_divergence"]["op"].startswith("graph_replay #4"), c
    assert c["verdict"].startswith("every rank entered graph_replay #4"), c["verdict"]
    assert [i["seq"] for i in c["captured"]] == [2, 3]


def test_a_rank_whose_last_operation_was_captured_is_not_held_in_it(tmp_path):
    # rank 2 never entered all_reduce #3; its last operation, a send captured in a graph, holds nothing
    def script(r, c):
        allreduces(c, 2)
        if r == 2:
            c.op("send", f32(2), peer=0, state="captured")
        else:
            c.op("all_reduce", f32(2), f32(2), state="started")

    _, c = one(make_dumps(tmp_path, 3, script))
    info = c["first_divergence"]["never_entered"][2]
    assert info["last_state"] == "captured" and info["blocked_in"] is None, info
    assert c["verdict"].startswith("rank 2 never entered all_reduce #3"), c["verdict"]


@pytest.mark.parametrize("case", ["dtype", "some_ranks"])
def test_captured_operations_are_still_matched_across_ranks(tmp_path, case):
    # a capture of another dtype on one rank is a mismatch; a capture on one rank of what another issued directly
    # (and is still waiting in) is said to be that
    def script(r, c):
        allreduces(c, 1)
        if case == "dtype":
            c.op("all_reduce", f32(2, np.float64 if r == 1 else np.float32), f32(2), state="captured")
        else:
            c.op("all_reduce", f32(2), f32(2), state="captured" if r == 0 else "started")

    _, c = one(make_dumps(tmp_path, 3 if case == "dtype" else 2, script))
    div = c["first_divergence"]
    assert div is not None and div["seq"] == 2, c
    if case == "dtype":
        assert div["mismatch"]["kind"] == "dtype" and c["culprits"] == [1], div
    else:
        assert div["captured"] == [0] and list(div["in_flight"]) == [1], div
        assert ("was captured in a graph on rank 0 (it runs there only when the graph is replayed) but issued "
                "directly on rank 1") in c["verdict"], c["verdict"]


def test_dumps_of_two_runs_in_one_folder_are_said_to_be_and_not_mixed(tmp_path, capsys):
    # rank 2's dump is from another run (another communicator): it must not count as rank 2 never entering
    # the first run's operations, and the report says the folder mixes runs
    d = make_dumps(tmp_path / "a", 3, stopped_rank, uid="aaaa000000000000")
    other = make_dumps(tmp_path / "b", 3, lambda r, c: allreduces(c, 2), uid="bbbb000000000000")
    name = f"{PREFIX}2"
    shutil.copy(os.path.join(other, "generation_0", name), os.path.join(d, "generation_0", name))
    shutil.rmtree(os.path.join(d, "json"))
    rep = analyze.analyze_dir(d)[0]
    assert any("share no communicator across ranks 0-1 and rank 2" in p for p in rep["problems"]), rep["problems"]
    a = next(c for c in rep["communicators"] if c["uid"] == "aaaa000000000000")
    assert a["missing_dumps"] == [2] and a["foreign_dumps"] == [2], a
    div = a["first_divergence"]
    assert 2 not in div["never_entered"] and "does not know this communicator" in div["missing_dumps"][2], div
    assert run_cli(d) == 1
    assert "dumps of different runs in one folder?" in capsys.readouterr().out


def test_dumps_of_another_generation_in_a_generations_folder_are_said_to_be(tmp_path, capsys):
    # rank 2's dump is of generation 1 (an elastic group's next communicator), copied among generation 0's
    d = make_dumps(tmp_path / "a", 3, stopped_rank, uid="aaaa000000000000")
    other = make_dumps(tmp_path / "b", 3, lambda r, c: allreduces(c, 2), uid="bbbb000000000000", generation=1)
    name = f"{PREFIX}2"
    shutil.copy(os.path.join(other, "generation_1", name), os.path.join(d, "generation_0", name))
    shutil.rmtree(os.path.join(d, "json"))
    rep = analyze.analyze_dir(d)[0]
    assert any("share no communicator across ranks 0-1 (generation 0) and rank 2 (generation 1): dumps of "
               "different generations in one folder?" in p for p in rep["problems"]), rep["problems"]
    assert run_cli(d) == 1
    assert "dumps of different runs" not in capsys.readouterr().out


@pytest.mark.parametrize("trigger", ["failure", "manual", "remote for another", "remote for it", "remote asked"])
def test_a_communicator_dumped_for_another_ones_failure_is_a_bystander(tmp_path, trigger):
    # an elastic group's later generation, dumped (at different moments) for an earlier one's failure: its broadcast
    # done on ranks 1-2 and in flight on rank 0 is no divergence; dumped by hand while it hangs, it is one. The same
    # for a rank's other communicator (a trainers' group beside the failed weights one), dumped at another rank's
    # request: the request names the failed communicators (it said "FIRST DIVERGENCE" on the healthy one); a request
    # for this one's failure, or one a user made, is no such dump
    failed = {"remote for another": ["dddd000000000000"], "remote for it": ["cccc000000000000"]}.get(trigger)
    for r in range(3):
        rec = fr.FlightRecorder(64, dump_dir=str(tmp_path))
        c = FakeComm(rec, r, 3, uid="cccc000000000000", name="elastic", generation=2)
        allreduces(c, 2)
        c.op("broadcast", f32(2), f32(2), state="started" if r == 0 else "completed")
        assert rec.dump("failure of generation 0", trigger=trigger.split()[0],
                        extra={"failed_uids": failed} if failed else None)
    rep, c = one(str(tmp_path))
    v = analyze._verdict(c)
    trace = trace_dir(str(tmp_path))
    instants = [e["name"] for e in trace["traceEvents"] if e.get("ph") == "i"]
    if trigger in ("failure", "remote for another"):
        assert c["bystander"] and rep["ok"] and v.startswith("no failure of 'elastic'"), (c, v)
        text = analyze.format_report([rep])
        assert "not a divergence" in text
        assert "    rank 0: in flight (state started); ranks 1-2: completed" in text, text  # where each rank was
        # the timeline draws no divergence there either (it drew one, and the plot titled it so)
        assert not any(n.startswith("first divergence") for n in instants), instants
    else:
        assert not c["bystander"] and not rep["ok"] and "completed on ranks 1-2 but not on 0" in v, v
        assert any(n.startswith("first divergence: broadcast #3") for n in instants), instants


def test_a_dump_that_knows_no_communicator_is_no_other_run():
    dumps = {r: {"pg_config": {"aaaa": {"ranks": "[0, 1]", "desc": "w"}}} for r in (0, 1)}
    dumps[2] = {"pg_config": {}}  # a process without communicators: nothing says it belongs elsewhere
    problems: list = []
    analyze._apart(dumps, problems)
    assert problems == []
    dumps[3] = {"pg_config": {"bbbb": {"ranks": "[3]", "desc": "w"}}}
    analyze._apart(dumps, problems)
    assert problems and "across ranks 0-1 and rank 3" in problems[0], problems


def test_healthy_run(tmp_path, capsys):
    def script(r, c):
        allreduces(c, 3)
        c.op("gather", f32(2), f32(6) if r == 0 else None)  # root-only buffers are no mismatch
        c.op("scatter", f32(6) if r == 1 else None, f32(2))
        c.op("broadcast", f32(3), f32(3))
        shaped = np.ones((2, 3), np.float32) if r == 1 else f32(6)  # the library matches counts: no size mismatch
        c.op("all_reduce", shaped, shaped)

    d = make_dumps(tmp_path, 3, script)
    rep, c = one(d)
    assert rep["ok"] and c["first_divergence"] is None and c["matched_through"] == 7
    assert run_cli(d) == 0
    out = capsys.readouterr().out
    assert "no problem found on 'world'" in out


def test_a_send_and_its_receive_of_other_shapes_but_as_many_elements_match(tmp_path):
    def script(r, c):
        if r == 0:
            c.op("send", np.ones((2, 3), np.float32), peer=1)
        else:
            c.op("recv", None, f32(6), peer=0)
        allreduces(c, 1)

    rep, c = one(make_dumps(tmp_path, 2, script))
    assert rep["ok"] and not c["p2p"], c["p2p"]


def test_unmatched_send(tmp_path):
    def script(r, c):
        allreduces(c, 1)
        if r == 0:
            c.op("send", f32(4), peer=1, state="started")
        if r == 2:
            c.op("send", f32(4), peer=0)
        if r == 0:
            c.op("recv", None, f32(4), peer=2)

    _, c = one(make_dumps(tmp_path, 3, script))
    issues = [p["issue"] for p in c["p2p"]]
    assert issues == ["send #1 from rank 0 to rank 1 has no matching recv on rank 1"]
    assert "point-to-point problem" in analyze._verdict(c)


@pytest.mark.parametrize("case", ["nomatch", "wrongpeer", "sizemm"])
def test_a_rank_held_in_a_send_or_recv_is_named_with_it(tmp_path, capsys, case):
    # the rank that never entered all_reduce #2 is in a send or recv that cannot complete: its last operation is
    # that p2p operation, and the verdict names it (peer, p2p number) and why it cannot complete
    stuck = 0 if case == "nomatch" else 1

    def script(r, c):
        allreduces(c, 1)
        if r == 0:
            c.op("send", f32(4), peer=1, state="started" if case == "nomatch" else "completed")
        if r == 1 and case != "nomatch":
            c.op("recv", None, f32(2 if case == "sizemm" else 4), peer=2 if case == "wrongpeer" else 0,
                 state="started")
        if r != stuck:
            c.op("all_reduce", f32(2), f32(2), state="started")

    d = make_dumps(tmp_path, 3, script)
    _, c = one(d)
    info = c["first_divergence"]["never_entered"][stuck]
    peer, towards = {"nomatch": (1, "send to"), "wrongpeer": (2, "recv from"), "sizemm": (0, "recv from")}[case]
    held = f"{towards} rank {peer} (p2p #1) [Float({2 if case == 'sizemm' else 4},)]"
    assert info["last_op"] == held and info["last_state"] == "started", info
    v = analyze._verdict(c)
    assert v.startswith(f"rank {stuck} never entered all_reduce #2 [Float(2,)] on 'world': it is stuck in {held} "
                        "issued at fakes.py:"), v
    why = {"nomatch": "rank 1 posted no matching recv",
           "wrongpeer": "rank 2 posted no matching send; rank 0 sent to rank 1 (p2p #1, issued at fakes.py:",
           "sizemm": "size or dtype mismatch between rank 0's send (p2p #1, issued at fakes.py:"}[case]
    assert why in v and (case != "wrongpeer" or v.endswith("a wrong peer?")), v
    assert c["verdict"] == v and c["culprits"] == [stuck]
    assert run_cli(d, "--no-stacks") == 1
    assert f"rank {stuck}: never entered it (last op {held} started" in capsys.readouterr().out


def test_a_receive_whose_sender_sent_elsewhere_says_where_the_send_went(tmp_path):
    # "rank 0 posted no matching send" where rank 0 had sent -- to rank 2, which received nothing
    def script(r, c):
        allreduces(c, 1)
        if r == 0:
            c.op("send", f32(4), peer=2, state="started")
        if r == 1:
            c.op("recv", None, f32(4), peer=0, state="started")
        if r != 1:
            c.op("all_reduce", f32(2), f32(2), state="started")

    _, c = one(make_dumps(tmp_path, 3, script))
    v = analyze._verdict(c)
    assert "rank 0 posted no matching send; it sent to rank 2 instead (p2p #1, issued at fakes.py:" in v, v
    assert v.endswith("which received nothing: a wrong peer?"), v


def test_a_rank_whose_ring_overwrote_a_communicators_operations_says_it_issued_them(tmp_path):
    # "no operation recorded" of a rank that had issued three operations on the communicator, its ring (4 entries)
    # since filled by another communicator's
    def script(r, c):
        allreduces(c, 3)
        if r != 0:
            c.op("all_reduce", f32(2), f32(2), state="started")
        other = FakeComm(c.recorder, r, 3, uid="0ther00000000000", name="other")
        allreduces(other, 4)

    _, world = next((rep, c) for rep in analyze.analyze_dir(make_dumps(tmp_path, 3, script, buffer_size=4))
                for c in rep["communicators"] if c["name"] == "world")
    assert world["own_dump"][0] == ("no operation recorded: its ring no longer holds the 3 it issued (a bigger "
                                    "PYCOLL_FR_BUFFER_SIZE keeps more)"), world["own_dump"]


def split_dumps(folder, script, *, report=None):
    """4 ranks, each with 'world' and its 'pair' ({0, 1} or {2, 3}); ``script(rank, world, pair)`` issues the
    operations; rank 2 keeps failure report ``report`` (of its 'pair') when given."""
    for r in range(4):
        rec = fr.FlightRecorder(64, dump_dir=str(folder))
        world = FakeComm(rec, r, 4, uid="w000000000000000", name="world")
        pair = FakeComm(rec, r % 2, 2, uid=f"p{r // 2}00000000000000", name="pair",
                        global_ranks=[2 * (r // 2), 2 * (r // 2) + 1])
        world.op("all_reduce", f32(2), f32(2))
        pair.op("all_reduce", f32(2), f32(2))
        script(r, world, pair)
        if r == 2 and report is not None:
            rec.add_failure(0, report)
        assert rec.dump("test")
    return analyze.analyze_dir(str(folder))[0]


@pytest.mark.parametrize("case", ["subhang", "mixed"])
def test_a_rank_in_another_communicators_operation_is_said_to_be_there(tmp_path, case):
    # subhang: rank 2 waits in its pair's all_reduce #2 (rank 3 never calls it) while ranks 0-1 wait in world's #2;
    # mixed: rank 1 calls its pair's #2 while the others call world's #2
    def script(r, world, pair):
        if case == "subhang":
            if r != 3:
                pair.op("all_reduce", f32(2), f32(2), state="started" if r == 2 else "completed")
            if r < 2:
                world.op("all_reduce", f32(2), f32(2), state="started")
        elif r == 1:
            pair.op("all_reduce", f32(2), f32(2), state="started")
        else:
            world.op("all_reduce", f32(2), f32(2), state="started")

    rep = split_dumps(tmp_path, script)
    by = {(c["name"], tuple(c["members"])): c for c in rep["communicators"]}
    world = by[("world", (0, 1, 2, 3))]
    held, there = (2, "'pair' (ranks 2-3)") if case == "subhang" else (1, "'pair' (ranks 0-1)")
    b = world["first_divergence"]["never_entered"][held]["blocked_in"]
    assert b["comm"] == "pair" and b["members"] == ([2, 3] if case == "subhang" else [0, 1]) and not b["here"], b
    v = analyze._verdict(world)
    assert (f"rank {held} never entered all_reduce #2 [Float(2,)] on 'world': it is in {there} all_reduce #2 "
            "[Float(2,)] issued at fakes.py:") in v and v.endswith(", still in flight (state started)"), v
    if case == "mixed":  # and the pair's verdict says where rank 0 is
        v = analyze._verdict(by[("pair", (0, 1))])
        assert v.startswith("rank 0 never entered all_reduce #2 [Float(2,)] on 'pair': it is in 'world' "
                            "(ranks 0-3) all_reduce #2"), v
    # what the watchdogs' claims quote of the rank's own dump
    assert world["own_dump"][held].endswith(f"completed, then {there} all_reduce #2 [Float(2,)] started"), world


def test_a_rank_whose_operation_on_another_communicator_failed_is_not_said_to_be_in_flight_there(tmp_path):
    from pycoll import CommTimeout

    def script(r, world, pair):
        if r == 1:
            w = pair.op("all_reduce", f32(2), f32(2), state="started")
            w._exc = CommTimeout("all_reduce (seq 2) did not complete within 2 s")
        else:
            world.op("all_reduce", f32(2), f32(2), state="started")

    world = next(c for c in split_dumps(tmp_path, script)["communicators"] if c["name"] == "world")
    v = analyze._verdict(world)
    assert "it failed in 'pair' (ranks 0-1) all_reduce #2 [Float(2,)] issued at fakes.py:" in v, v
    assert v.endswith("(CommTimeout; state started)"), v


def test_a_sub_communicators_watchdog_claims_name_global_ranks(tmp_path):
    # rank 2's failure report on its pair {2, 3} names its peer by the pair's own rank (1): the analyzer's text, in
    # global ranks everywhere else, names it rank 3 and finds rank 3's own dump
    report = {"time": 1.0, "uid": "p100000000000000", "rank": 0, "error_type": "CommTimeout", "op": "all_reduce",
              "seq": 2, "message": "timed out", "elapsed_s": 3.0, "request": 1,
              "behind": {"1": {"last_issued": 1, "report_age_s": 0.0, "answered": True}}, "unconfirmed": {},
              "gone": {"1": 4242}, "peers": {}, "silent": {}, "peer_failures": {}}

    def script(r, world, pair):
        if r == 2:
            pair.op("all_reduce", f32(2), f32(2), state="started")

    rep = split_dumps(tmp_path, script, report=report)
    c = next(c for c in rep["communicators"] if c["members"] == [2, 3])
    assert list(c["failures"][0]["behind"]) == ["3"] and list(c["failures"][0]["gone"]) == ["3"], c["failures"]
    line = next(ln for ln in analyze.format_report([rep]).splitlines() if "watchdog on rank 2" in ln)
    assert line.endswith("it saw behind: rank 3 (its own dump: last all_reduce #1 [Float(2,)] completed)"), line


def test_a_failed_transfer_says_what_the_library_said(tmp_path):
    # rank 0 sent and left without a dump; rank 1's recv failed with the library's size-mismatch text
    def script(r, c):
        allreduces(c, 1)
        if r == 1:
            w = c.op("recv", None, f32(4), peer=0, state="started")
            w._exc = RuntimeError("Recv : size mismatch: rank 1 receives 16 bytes from rank 0, which sends 32 bytes")
            c.recorder.comm_failed(c, w._exc, w)

    d = make_dumps(tmp_path, 3, script)
    os.unlink(os.path.join(d, "generation_0", f"{PREFIX}0"))
    shutil.rmtree(os.path.join(d, "json"))
    _, c = one(d)
    issue = c["p2p"][0]["issue"]
    assert issue.startswith("transfer #1 0->1 not completed (send unknown: no dump from rank 0, recv started): "
                            "the recv failed with RuntimeError: Recv : size mismatch"), issue


def test_a_sendrecv_pairs_with_the_peers_send_and_recv(tmp_path):
    """A sendrecv 0<->1 is a send 0->1 and a recv at 0 from 1: rank 1's group of a recv and a send matches it, and a
    sendrecv whose peer posted nothing is reported in both directions."""
    def script(r, c):
        allreduces(c, 1)
        if r == 0:
            c.op("sendrecv", f32(4), f32(2), peer=1)
        if r == 1:
            c.op("recv", None, f32(4), peer=0)
            c.op("send", f32(2), peer=0)
        if r == 2:
            c.op("sendrecv", f32(4), f32(4), peer=0, state="started")

    _, c = one(make_dumps(tmp_path, 3, script))
    assert [p["issue"] for p in c["p2p"]] == [
        "recv #1 on rank 2 from rank 0 has no matching send on rank 0",
        "send #1 from rank 2 to rank 0 has no matching recv on rank 0"]
    names = set()
    for f in (tmp_path / "json" / "generation_0").iterdir():
        d = json.loads(f.read_text())  # the sendrecvs are kept out of torch's analyzer's reach (the recorder says why)
        names |= {e["profiling_name"].split(":", 1)[-1] for e in d["entries"] + d["pycoll"]["other_entries"]}
    assert {"sendrecv 0<->1", "sendrecv 2<->0"} <= names


def test_wrapped_buffers_are_aligned(tmp_path):
    def script(r, c):
        allreduces(c, 10)

    d = make_dumps(tmp_path, 3, script, buffer_size=[4, 8, 10])
    _, c = one(d)
    assert c["first_divergence"] is None and c["matched_through"] == 10
    assert "history starts at #7 (older entries were overwritten on some rank)" in c["problems"]


def test_json_only_and_generation_folders(tmp_path):
    make_dumps(tmp_path, 2, lambda r, c: allreduces(c, 2), generation=0, uid="g0")
    make_dumps(tmp_path, 2, lambda r, c: (allreduces(c, 1), c.op("all_reduce", f32(2), f32(2), state="started")
                                           if r == 0 else None), generation=1, uid="g1")
    shutil.rmtree(tmp_path / "generation_1")  # generation 1 only as JSON now
    reps = analyze.analyze_dir(str(tmp_path))
    assert [r["generation"] for r in reps] == [0, 1]
    assert reps[0]["ok"] and reps[1]["folder"].endswith(os.path.join("json", "generation_1"))
    div = reps[1]["communicators"][0]["first_divergence"]
    assert div["seq"] == 2 and list(div["never_entered"]) == [1]
    # one generation's folder can be given directly, too
    assert analyze.analyze_dir(str(tmp_path / "generation_0"))[0]["generation"] == 0


class Boom:
    def __reduce__(self):
        return (os.system, ("echo pwned > /dev/null",))


def test_dump_that_would_run_code_is_refused(tmp_path):
    d = make_dumps(tmp_path, 2, lambda r, c: allreduces(c, 1), write_json=False)
    with open(os.path.join(d, "generation_0", f"{PREFIX}1"), "wb") as f:
        pickle.dump({"version": "2.10", "entries": [], "pg_config": {}, "x": Boom()}, f)
    reps = analyze.analyze_dir(d)
    assert any("refusing to load posix.system" in p or "refusing to load os.system" in p for p in reps[0]["problems"])
    assert reps[0]["ranks"] == [0]


def test_cli_errors_and_json(tmp_path, capsys):
    assert run_cli(tmp_path / "nope") == 2
    assert "is not a directory" in capsys.readouterr().err
    (tmp_path / "empty").mkdir()
    assert run_cli(tmp_path / "empty") == 2
    # rank 1 waits in all_reduce #3, which rank 0 never entered (had rank 1 completed it, rank 0 would have entered it
    # after its dump: test_a_dump_older_than_what_the_others_completed_is_not_taken_for_a_rank_that_stopped)
    d = make_dumps(tmp_path / "d", 2, lambda r, c: (allreduces(c, 2), r and allreduces(c, 1, state="started")))
    capsys.readouterr()
    assert run_cli(d, "--json") == 1
    data = json.loads(capsys.readouterr().out)
    assert data[0]["communicators"][0]["first_divergence"]["never_entered"] == {"0": {
        "last_op": "all_reduce #2 [Float(2,)]", "last_state": "completed",
        "last_site": data[0]["communicators"][0]["first_divergence"]["never_entered"]["0"]["last_site"],
        "issued": 2, "blocked_in": None, "revoked": False}}
    # the verdict and the ranks it points at, as the text has them
    c = data[0]["communicators"][0]
    assert c["verdict"] == "rank 0 never entered all_reduce #3 [Float(2,)] on 'world'" and c["culprits"] == [0], c


def test_python_dash_m_and_console_script_entry(tmp_path):
    d = make_dumps(tmp_path, 2, lambda r, c: allreduces(c, 1))
    root = os.path.dirname(os.path.dirname(os.path.abspath(analyze.__file__)))
    out = subprocess.run([sys.executable, "-m", "pycoll.analyze", d], capture_output=True, text=True, timeout=60,
                         env={**os.environ, "PYTHONPATH": root})
    assert out.returncode == 0, out.stderr
    assert "no problem found" in out.stdout and "torch" not in sys.modules.get("pycoll.analyze").__dict__


def test_torch_analyzer_reads_the_same_dumps(tmp_path):
    def script(r, c):
        allreduces(c, 2)
        c.op("all_reduce", f32(2, np.float64) if r == 1 else f32(2), f32(2, np.float64) if r == 1 else f32(2),
             state="started")

    d = make_dumps(tmp_path, 3, script)
    out = torch_fr_trace(os.path.join(d, "generation_0"))
    assert "Culprit rank 1; Error type: COLLECTIVE_DTYPE_MISMATCH" in out


def mixed_ops(r, c, stuck=None):
    """3 ranks: what README's quickstart issues and more that torch's analyzer does not know: ranks 0 and 1 exchange
    (sendrecv) before any collective, rank 0 sends to rank 1 right after all_reduce #2 (p2p #2: torch would read the
    collective and the send as a coalesced group), rank 0 signals rank 2 (one-sided), a CUDA graph's capture and
    its replay's watch (graph_replay #4), a barrier and a broadcast_bytes on a device (no buffer described), then
    all_reduce #7: rank ``stuck`` never enters it (it waits for a signal that never comes)."""
    if r < 2:
        c.op("sendrecv", f32(4), f32(4), peer=1 - r)
    allreduces(c, 2)
    if r == 0:
        c.op("send", f32(2), peer=1)
        c.op("put_signal", f32(4), peer=2)
        c.op("signal", peer=2)
    if r == 1:
        c.op("recv", None, f32(2), peer=0)
    if r == 2:
        c.op("wait_signal", peer=0)
    c.op("all_reduce", f32(2), f32(2), state="captured")
    c.op("graph_replay")
    c.op("barrier")
    c.op("broadcast")
    if r == stuck:
        c.op("wait_signal", peer=0, state="started")
    else:
        c.op("all_reduce", f32(2), f32(2), state="completed" if stuck is None else "started")


def test_torch_analyzer_reads_dumps_of_operations_it_does_not_know(tmp_path):
    # it crashed on them ("sendrecv is not a supported operation", "can't get dst of non-p2p op"), and a transfer
    # between two ranks of three read as the third one missing
    d = make_dumps(tmp_path / "ok", 3, mixed_ops)
    rep, c = one(d)
    assert rep["ok"] and c["matched_through"] == 7 and not c["p2p"], c
    out = torch_fr_trace(os.path.join(d, "generation_0"))
    for problem in ("Traceback", "Not all ranks joining", "Culprit", "Error", "coalesced"):
        assert problem not in out, out


def test_torch_analyzer_finds_the_rank_that_never_entered_after_such_operations(tmp_path):
    d = make_dumps(tmp_path, 3, lambda r, c: mixed_ops(r, c, stuck=2))
    _, c = one(d)
    assert c["verdict"].startswith("rank 2 never entered all_reduce #7 [Float(2,)] on 'world': it is in wait_signal "
                                   "from rank 0 (p2p #2)"), c["verdict"]
    out = torch_fr_trace(os.path.join(d, "generation_0"))
    assert "Not all ranks joining collective, sequence number: 7" in out and "missing ranks: {2}" in out, out
    assert "Traceback" not in out and out.count("Not all ranks joining") == 1, out


def test_main_thread_site_skips_the_standard_library_pycoll_waits_in():
    # a SIGTERM or exit dump: the main thread waits in threading.py for the dump pycoll's hook asked for; the site
    # is the user's line around it, while a wait the user's own code makes stays the user's
    lib, hook = "/usr/lib/python3.11/threading.py", "/srv/env/lib/python3.11/site-packages/pycoll/diagnostics/exits.py"
    user, pkg = "/job/train.py", "/srv/env/lib/python3.11/site-packages/tqdm/std.py"

    def site(*names):
        return analyze._main_site({"pycoll": {"main_thread": [
            {"filename": n, "line": i + 1, "name": f"f{i}"} for i, n in enumerate(names)]}})

    assert site(lib, lib, hook, hook, user, user) == "train.py:5 in f4"
    assert site(lib, user) == "train.py:2 in f1 (in threading.f0)"
    assert site(lib, hook) == ""  # the exit handler, after the main module ended: no user frame
    assert site(pkg, hook, user) == "std.py:1 in f0"
    # the user's line that holds the GIL in a call of the standard library's (re.match's C loop, issue 5 of the
    # probe), seen from the SIGTERM hook: the user's line, with the call it is in
    pkg_re = "/usr/lib/python3.11/re/__init__.py"
    assert site(lib, lib, hook, hook, pkg_re, user) == "train.py:6 in f5 (in re.f4)"
    assert site(lib, lib, "/usr/lib/python3.11/importlib/__init__.py") == "threading.py:1 in f0"  # no user frame


def test_a_send_s_peers_are_not_said_to_be_behind():
    # a send's watchdog lists its peers ("peer:") whether they are behind or not, by their point-to-point numbers:
    # pycoll-fr gave them as "it saw behind: rank 1 (answered: #0)"
    f = {"is_p2p": True, "behind": {"1": {"last_issued": 3, "report_age_s": 0.1, "answered": True}}}
    assert analyze._claims(f, {"own_dump": {}}) == "; its peers: rank 1 (answered: p2p #3)"
    f = {"is_p2p": False, "behind": {"2": {"last_issued": 4, "report_age_s": 0.1, "answered": True}}}
    assert analyze._claims(f, {"own_dump": {}}) == "; it saw behind: rank 2 (answered: #4)"
