"""The flight recorder: what it records, the dump format (PyTorch's schema 2.10), buffers off/empty/wrapped.

Most tests feed the recorder :class:`helpers.fakes.FakeComm` operations (real :class:`pycoll.Work` objects and
real buffers, without a library), so they run in this process and quickly; one test records a real
one-rank host communicator. The fakes are reused by the analyzer's tests.
"""

from __future__ import annotations

import json
import logging
import os
import pickle
import subprocess
import sys
import threading
import types
import warnings
import weakref

import numpy as np
import pytest
from helpers.fakes import FakeComm

import pycoll
import pycoll.diagnostics
import pycoll.hooks
from pycoll import analyze, flight_recorder as fr


def f32(n):
    return np.ones(n, np.float32)


def load(path):
    with open(path, "rb") as f:
        return pickle.load(f)


@pytest.fixture
def rec(tmp_path):
    return fr.FlightRecorder(16, dump_dir=str(tmp_path))


# -- what is recorded -------------------------------------------------------------------------------


def test_entry_fields_follow_torch_schema(rec):
    c = FakeComm(rec, 1, 4, global_ranks=[4, 5, 6, 7])
    works = [c.op("all_reduce", f32(3), f32(3)), c.op("all_gather", f32(2), f32(8), state="started"),
             c.op("send", f32(5), peer=2), c.op("recv", None, np.ones(5, np.float64), peer=0)]
    d = rec.as_dict(0)
    assert d["version"] == "2.10" == fr.SCHEMA_VERSION
    assert d["comm_lib_version"] == "2.32.3"
    assert d["pg_config"] == {c.uid: {"name": c.uid, "desc": "world", "ranks": "[4, 5, 6, 7]"}}
    e = d["entries"]
    assert [x["record_id"] for x in e] == [0, 1, 2, 3]
    assert all(x["process_group"] == (c.uid, "world") for x in e)
    assert [x["profiling_name"] for x in e] == [
        "nccl:all_reduce", "nccl:all_gather", "nccl:send 1->2", "nccl:recv 1<-0"
    ]
    assert [x["collective_seq_id"] for x in e] == [1, 2, 2, 2]
    assert [x["p2p_seq_id"] for x in e] == [0, 0, 1, 2]
    assert [x["is_p2p"] for x in e] == [False, False, True, True]
    assert e[0]["input_sizes"] == [[3]] and e[0]["output_sizes"] == [[3]]
    assert e[0]["input_dtypes"] == ["Float"] and e[0]["output_dtypes"] == ["Float"]
    assert e[1]["input_sizes"] == [[2]] and e[1]["output_sizes"] == [[8]]
    assert e[2]["output_sizes"] == [] and e[3]["input_sizes"] == [] and e[3]["output_dtypes"] == ["Double"]
    assert [x["state"] for x in e] == ["completed", "started", "completed", "completed"]
    assert e[0]["retired"] and not e[1]["retired"]
    assert e[0]["duration_ms"] == pytest.approx(0.001) and "duration_ms" not in e[1]
    assert e[1]["time_discovered_completed_ns"] is None
    assert e[0]["timeout_ms"] == 30000
    assert e[0]["thread_name"] == threading.current_thread().name
    status = d["pg_status"]["0"]
    assert status == {"last_enqueued_collective": 2, "last_started_collective": 2, "last_completed_collective": 1}
    assert d["pycoll"]["rank"] == 5 and d["pycoll"]["comms"][c.uid]["rank"] == 1
    assert works[0].fr_entry.snapshot() == rec.entries()[0] and works[0].fr_pos == 0


def test_an_entry_names_the_thread_that_issued_it_as_it_was_named_then(rec):
    # the name was looked up by ident at dump time: a later thread given the same ident was named for the ended
    # thread's operations, and an ended thread's were blank
    c = FakeComm(rec, 0, 1)
    issuer = threading.Thread(target=lambda: c.op("all_reduce", f32(1), f32(1)), name="loader")
    issuer.start()
    issuer.join()
    later = threading.Thread(target=threading.Event().wait, args=(0.5,), name="idle-logger")
    later.start()  # may well have the loader's ident
    try:
        c.op("all_reduce", f32(1), f32(1))
        threading.current_thread().name, was = "renamed", threading.current_thread().name
        try:
            names = [e["thread_name"] for e in rec.as_dict(0)["entries"]]
        finally:
            threading.current_thread().name = was
    finally:
        later.join()
    assert names == ["loader", was]


def test_entries_do_not_keep_works_or_communicators_alive(rec):
    c = FakeComm(rec, 0, 2)
    c.op("all_reduce", f32(3), f32(3))  # completed, and dropped by everyone
    kept = c.op("all_reduce", f32(3), f32(3))
    pending = c.op("all_reduce", f32(3), f32(3), state="started")
    e = rec.as_dict(0)["entries"]
    # completed operations keep their times, whether their Work is gone or not
    assert e[0]["state"] == "completed" and e[0]["duration_ms"] == pytest.approx(0.001)
    assert e[0]["time_discovered_completed_ns"] == e[0]["time_created_ns"] + 1000
    assert e[1]["state"] == "completed" and e[1]["duration_ms"] == pytest.approx(0.001)
    assert e[2]["state"] == "started" and e[0]["input_sizes"] == [[3]]
    ref = weakref.ref(c)
    c.pending.clear()
    del c, kept, pending
    assert ref() is None  # the ring holds no path to the communicator


def test_entries_cost_the_garbage_collector_nothing(rec):
    """The ring keeps thousands of entries alive: no entry is tracked by the cyclic collector (nothing in
    one can refer back to it), and a collection still frees what they do not hold."""
    import gc

    c = FakeComm(rec, 0, 2)
    w = c.op("all_reduce", f32(3), f32(3))
    assert not gc.is_tracked(w.fr_entry) and w.fr_entry.snapshot() == rec.entries()[0]
    ref = weakref.ref(c)
    c.pending.clear()
    del c, w
    gc.collect()
    assert ref() is None and rec.as_dict(0)["entries"][0]["state"] == "completed"


def test_failed_names_the_operation_of_a_failed_closed_communicator_without_successor(rec):
    """What a process was doing when it went: also on a communicator a failure's abort closed before the dump
    (Ctrl-C inside a collective), but not on one a later communicator of the same name replaced; never as
    outstanding (unfinished), and its rank stays the process's."""
    c = FakeComm(rec, 1, 2, uid="aaaa000000000000")
    c.op("all_reduce", f32(3), f32(3))
    w = c.op("all_reduce", f32(3), f32(3), state="started")
    rec.comm_failed(c, RuntimeError("interrupted"), w)
    rec.comm_closed(c)
    assert rec.unfinished() == [] and rec.global_rank() == 1  # closed: nothing outstanding; the rank it had
    assert rec.failed() == ["all_reduce #2 on 'world' (started)"]
    ok = FakeComm(rec, 0, 2, uid="bbbb000000000000", name="other")  # another name: no successor
    ok.op("all_reduce", f32(3), f32(3))
    assert rec.failed() == ["all_reduce #2 on 'world' (started)"]
    nxt = FakeComm(rec, 0, 2, uid="cccc000000000000", generation=1)  # the next generation of 'world'
    assert rec.failed() == [] and nxt.name == "world"
    clean = FakeComm(rec, 0, 2, uid="dddd000000000000", name="clean")  # closed without a failure
    clean.op("all_reduce", f32(3), f32(3), state="started")
    assert rec.unfinished() == ["all_reduce #1 on 'clean' (started)"]
    rec.comm_closed(clean)
    assert rec.unfinished() == [] and rec.failed() == []


def test_an_operation_a_failure_ended_on_a_communicator_left_open_is_failed_not_outstanding(rec):
    """Under on_failure="revoke" (an ElasticGroup's) or "report" the failed communicator stays open and its failed
    operation in its outstanding list: a SIGTERM after the caught failure named it "outstanding" in the exit dump
    ("while all_reduce #1 ... outstanding"), and an exit wrote a dump over the failure's."""
    c = FakeComm(rec, 0, 2, uid="eeee000000000000")
    w = c.op("all_reduce", f32(3), f32(3), state="started")
    w._exc = RuntimeError("peer gone")
    rec.comm_failed(c, RuntimeError("peer gone"), w)
    assert rec.unfinished() == []
    assert rec.failed() == ["all_reduce #1 on 'world' (started)"]


def test_failure_freezes_the_state_of_outstanding_operations(rec):
    c = FakeComm(rec, 0, 2)
    w = c.op("all_reduce", f32(3), f32(3), state="started")
    w._exc = RuntimeError("boom")  # as the communicator records it
    rec.comm_failed(c, RuntimeError("boom"), w)
    c.pending.clear()
    del w
    e = rec.as_dict(0)["entries"][0]
    assert e["state"] == "started" and e["pycoll_error"] == "RuntimeError: boom" and e["retired"]
    assert rec.as_dict(0)["pycoll"]["comms"][c.uid]["failure"] == "RuntimeError: boom"


def test_stack_is_captured_cheaply_and_formatted_at_dump(rec):
    c = FakeComm(rec, 0, 2)
    line = sys._getframe().f_lineno + 1
    c.op("all_reduce", f32(1), f32(1))
    entry = rec.entries()[0]
    raw = entry[fr._STACK]
    assert all(isinstance(x, (types.CodeType, int)) for x in raw)  # nothing formatted yet
    frames = rec.as_dict(0)["entries"][0]["frames"]
    me = [f for f in frames if f["name"] == "test_stack_is_captured_cheaply_and_formatted_at_dump"]
    assert me and me[0]["line"] == line and me[0]["filename"] == __file__
    assert frames[0]["name"] == "op"  # innermost first
    assert len(frames) == rec.stack_depth  # pytest's stack is deeper: exactly the frames asked for


@pytest.mark.parametrize("depth", [1, 3])
def test_stack_depth_is_the_number_of_frames_kept(tmp_path, depth):
    rec = fr.FlightRecorder(8, stack_depth=depth, dump_dir=str(tmp_path))
    c = FakeComm(rec, 0, 2)

    def nested(n):
        return c.op("all_reduce", f32(1), f32(1)) if n == 0 else nested(n - 1)

    nested(5)
    frames = rec.as_dict(0)["entries"][0]["frames"]
    assert [f["name"] for f in frames] == ["op", "nested", "nested"][:depth]


def test_stacks_off(tmp_path):
    rec = fr.FlightRecorder(8, stacks=False, dump_dir=str(tmp_path))
    c = FakeComm(rec, 0, 2)
    c.op("all_reduce", f32(1), f32(1))
    assert rec.entries()[0][fr._STACK] is None
    assert "frames" not in rec.as_dict(0)["entries"][0]
    rec2 = fr.FlightRecorder(8, dump_dir=str(tmp_path))
    c2 = FakeComm(rec2, 0, 2, uid="other")
    c2.op("all_reduce", f32(1), f32(1))
    assert "frames" not in rec2.as_dict(0, stacks=False)["entries"][0]


def test_rccl_prefix_and_barrier(rec):
    c = FakeComm(rec, 0, 2, backend="rccl")
    c.op("barrier")
    e = rec.as_dict(0)["entries"][0]
    assert e["profiling_name"] == "rccl:barrier" and e["input_sizes"] == [] and e["output_sizes"] == []


# -- buffer sizes -----------------------------------------------------------------------------------


def test_recording_off_still_dumps(tmp_path):
    rec = fr.FlightRecorder(0, dump_dir=str(tmp_path))
    c = FakeComm(rec, 0, 2)
    w = c.op("all_reduce", f32(1), f32(1))
    assert not rec.enabled and w.fr_entry is None and rec.entries() == []
    paths = rec.dump("test")
    d = load(paths[0])
    assert d["entries"] == [] and c.uid in d["pg_config"] and d["pycoll"]["buffer_size"] == 0


def test_buffer_size_from_environment(monkeypatch):
    monkeypatch.setenv("PYCOLL_FR_BUFFER_SIZE", "0")
    assert fr.FlightRecorder().buffer_size == 0
    monkeypatch.setenv("PYCOLL_FR_BUFFER_SIZE", "7")
    monkeypatch.setenv("PYCOLL_FR_STACKS", "0")
    rec = fr.FlightRecorder()
    assert rec.buffer_size == 7 and rec.stacks is False
    monkeypatch.setenv("PYCOLL_FR_BUFFER_SIZE", "lots")
    with pytest.raises(ValueError, match="PYCOLL_FR_BUFFER_SIZE"):
        fr.FlightRecorder()
    monkeypatch.delenv("PYCOLL_FR_BUFFER_SIZE")
    monkeypatch.setenv("PYCOLL_FR_STACKS", "maybe")
    with pytest.raises(ValueError, match="PYCOLL_FR_STACKS"):
        fr.FlightRecorder()


@pytest.mark.parametrize("bad", [-1, 1.5, True, "3"])
def test_bad_settings(bad):
    with pytest.raises(ValueError, match="buffer_size"):
        fr.FlightRecorder(bad)
    with pytest.raises(ValueError, match="file_prefix"):
        fr.FlightRecorder(4, file_prefix="rank7")


def test_empty_buffer_dump(tmp_path):
    rec = fr.FlightRecorder(4, dump_dir=str(tmp_path))
    c = FakeComm(rec, 0, 2)
    d = load(rec.dump("empty")[0])
    assert c.uid in d["pg_config"]
    assert d["entries"] == [] and d["version"] == "2.10" and len(d["pg_config"]) == 1
    assert d["pg_status"]["0"]["last_enqueued_collective"] == -1


def test_full_and_wrapped_buffer(tmp_path):
    rec = fr.FlightRecorder(5, dump_dir=str(tmp_path))
    c = FakeComm(rec, 0, 2)
    for _ in range(5):
        c.op("all_reduce", f32(1), f32(1))
    assert [e["record_id"] for e in rec.as_dict(0)["entries"]] == [0, 1, 2, 3, 4]
    for _ in range(7):
        c.op("all_reduce", f32(1), f32(1))
    d = load(rec.dump("wrapped")[0])
    assert [e["record_id"] for e in d["entries"]] == [7, 8, 9, 10, 11]
    assert [e["collective_seq_id"] for e in d["entries"]] == [8, 9, 10, 11, 12]
    assert d["pycoll"]["recorded"] == 12 and d["pycoll"]["buffer_size"] == 5
    rec.configure(buffer_size=3)  # a new size starts afresh
    assert rec.entries() == []


# -- dump files -------------------------------------------------------------------------------------


def test_a_dump_file_gives_torch_only_the_collectives_its_analyzer_models(tmp_path):
    """Torch's analyzer refuses operation types it does not know and cannot pair sends and receives outside its
    own coalesced batches: a dump file's ``entries`` hold the collectives it knows, renumbered to count only
    these (torch aligns ranks by their first record ids); every other entry is under ``pycoll.other_entries``
    (pickle and JSON alike), and pycoll-fr's loader puts the dump back together as the recorder holds it."""
    rec = fr.FlightRecorder(32, dump_dir=str(tmp_path))
    c = FakeComm(rec, 0, 2)
    c.op("sendrecv", f32(4), f32(4), peer=1)
    c.op("all_reduce", f32(2), f32(2))
    c.op("put_signal", f32(4), peer=1)
    c.op("signal", peer=1)
    c.op("wait_signal", peer=1, state="started")
    c.op("all_reduce", f32(2), f32(2), state="captured")
    c.op("graph_replay")  # Communicator.watch_stream's entry
    c.op("barrier")
    c.op("broadcast")  # broadcast_bytes on a device: no buffer described
    c.op("send", f32(2), peer=1)
    c.op("recv", None, f32(2), peer=1)
    c.op("all_gather", f32(2), f32(4))
    whole = rec.as_dict(0)["entries"]  # in memory: every entry, as recorded
    assert [e["record_id"] for e in whole] == list(range(12))
    paths = rec.dump("split")
    for d in (load(paths[0]), json.load(open(paths[1]))):
        torch_view = d["entries"]
        assert [e["profiling_name"] for e in torch_view] == [
            "nccl:all_reduce", "nccl:all_reduce", "nccl:barrier", "nccl:broadcast", "nccl:all_gather"]
        assert [e["record_id"] for e in torch_view] == [0, 1, 2, 3, 4]
        assert [e["pycoll_record_id"] for e in torch_view] == [1, 5, 7, 8, 11]
        other = d["pycoll"]["other_entries"]
        assert [e["profiling_name"] for e in other] == [
            "nccl:sendrecv 0<->1", "nccl:put_signal 0->1", "nccl:signal 0->1", "nccl:wait_signal 0<-1",
            "nccl:graph_replay", "nccl:send 0->1", "nccl:recv 0<-1"]
        assert [e["record_id"] for e in other] == [0, 2, 3, 4, 6, 9, 10]
    assert other[3]["time_discovered_completed_ns"] == 0  # the JSON form's unset timestamps, there too
    assert rec.last_dump["entries"] == 12
    dumps, problems = analyze.load_generation(os.path.dirname(paths[0]))
    assert not problems and "other_entries" not in dumps[0]["pycoll"]
    assert dumps[0]["entries"] == whole


def test_the_record_ids_torch_reads_count_only_its_entries_also_after_a_wrap(tmp_path):
    # the left-out entries a wrapped ring lost were not subtracted: a rank that had sent 30 times before its
    # collectives numbered them 30 higher than a rank that had not, and torch's analyzer, which aligns the ranks at
    # their first record ids, threw away the other rank's history and reported completed collectives as missing
    dumps = []
    for rank, sends in ((0, 30), (1, 0)):
        rec = fr.FlightRecorder(20, dump_dir=str(tmp_path / str(rank)))
        c = FakeComm(rec, rank, 2)
        for _ in range(sends):
            c.op("sendrecv", f32(4), f32(4), peer=1 - rank)
        for _ in range(40):
            c.op("all_reduce", f32(2), f32(2))
        dumps.append(load(rec.dump("wrap")[0])["entries"])
    for entries in dumps:
        assert [(e["collective_seq_id"], e["record_id"]) for e in entries] == [(k, k - 1) for k in range(21, 41)]


def test_dump_files_are_atomic_and_logged(tmp_path, caplog):
    rec = fr.FlightRecorder(8, dump_dir=str(tmp_path))
    c = FakeComm(rec, 2, 4)
    c.op("all_reduce", f32(2), f32(2), state="scheduled")
    with caplog.at_level(logging.WARNING, logger="pycoll.flight_recorder"):
        paths = rec.dump("why not", trigger="manual")
    pkl = os.path.join(str(tmp_path), "generation_0", "pycoll_trace_rank_2")
    js = os.path.join(str(tmp_path), "json", "generation_0", "pycoll_trace_rank_2.json")
    assert paths == [pkl, js]
    assert sorted(os.listdir(os.path.dirname(pkl))) == ["pycoll_trace_rank_2"]  # no temporary file left
    assert any(pkl in r.getMessage() and "why not" in r.getMessage() for r in caplog.records)
    d = load(pkl)
    assert d["pycoll"]["reason"] == "why not" and d["pycoll"]["trigger"] == "manual"
    j = json.load(open(js))
    e = j["entries"][0]
    assert e["process_group"] == [c.uid, "world"] and e["state"] == "scheduled"
    assert e["time_discovered_started_ns"] == 0 and e["time_discovered_completed_ns"] == 0
    assert j["pg_status"]["0"]["last_enqueued_collective"] == "1"
    assert rec.last_dump["path"] == pkl and rec.dump_count == 1


def test_dump_io_error_is_logged_not_raised(tmp_path, caplog):
    blocker = tmp_path / "file"
    rec = fr.FlightRecorder(4, dump_dir=str(blocker))  # a folder to be: a file when the dump comes
    blocker.write_text("x")
    c = FakeComm(rec, 0, 1)  # noqa: F841  (kept alive: dumps list live communicators)
    with caplog.at_level(logging.ERROR, logger="pycoll.flight_recorder"):
        assert rec.dump("x") == []
    assert any("could not write" in r.getMessage() for r in caplog.records)


def test_each_generation_has_its_folder_and_record_ids(tmp_path):
    rec = fr.FlightRecorder(16, dump_dir=str(tmp_path))
    old = FakeComm(rec, 0, 2, uid="aaaa", generation=0)
    for _ in range(3):
        old.op("all_reduce", f32(1), f32(1))
    new = FakeComm(rec, 0, 1, uid="bbbb", name="world.shrink1", generation=1)
    new.op("all_reduce", f32(1), f32(1))
    paths = rec.dump("gens", write_json=False)
    assert [os.path.basename(os.path.dirname(p)) for p in paths] == ["generation_0", "generation_1"]
    d0, d1 = load(paths[0]), load(paths[1])
    assert list(d0["pg_config"]) == ["aaaa"] and list(d1["pg_config"]) == ["bbbb"]
    assert [e["record_id"] for e in d1["entries"]] == [0]  # record ids restart per generation
    assert d1["pg_config"]["bbbb"]["desc"] == "world.shrink1"


def test_closed_communicator_releases_arrays_and_stays_in_dumps(rec):
    c = FakeComm(rec, 0, 2)
    w = c.op("all_reduce", f32(4), f32(4), state="started")
    assert w.inputs
    rec.comm_closed(c)
    assert w.inputs == [] and w.outputs == []
    d = rec.as_dict(0)
    assert d["entries"][0]["input_sizes"] == [[4]] and c.uid in d["pg_config"]


def test_a_wrapped_ring_reuses_entries_and_forgets_the_oldest_operations(tmp_path):
    """Entries are written in place: once the ring wraps, an old Work's entry holds a newer operation, and
    nothing about the old one (its site, its failure) is read from or written into it."""
    rec = fr.FlightRecorder(4, dump_dir=str(tmp_path))
    c = FakeComm(rec, 0, 2)
    old = c.op("all_reduce", f32(3), f32(3), state="started")
    first = old.fr_entry
    assert rec.issued_at(old)[1] == "Float(3,)"
    news = [c.op("all_gather", f32(1), f32(2)) for _ in range(4)]
    assert news[-1].fr_entry is first and news[-1].fr_pos == 4 and old.fr_pos == 0
    assert rec.issued_at(old) == ("", "")  # its entry is the newest operation's now
    rec.comm_failed(c, RuntimeError("boom"), old)  # freezes the outstanding Works: not old's reused entry
    e = rec.as_dict(0)["entries"]
    assert [x["profiling_name"] for x in e] == ["nccl:all_gather"] * 4 and rec.recorded == 5
    assert [x["state"] for x in e] == ["completed"] * 4 and all("pycoll_error" not in x for x in e)


def test_recording_from_many_threads(tmp_path):
    rec = fr.FlightRecorder(64, stacks=False, dump_dir=str(tmp_path))
    comms = [FakeComm(rec, 0, 1, uid=f"u{i}") for i in range(4)]

    def work(c):
        for _ in range(100):
            c.op("all_reduce", f32(1), f32(1))

    threads = [threading.Thread(target=work, args=(c,)) for c in comms]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    entries = rec.entries()
    assert len(entries) == 64 and rec.recorded == 400
    assert [e[fr._POS] for e in entries] == list(range(336, 400))


# -- a real communicator ----------------------------------------------------------------------------


def test_real_host_communicator_is_recorded(tmp_path):
    rec = fr.FlightRecorder(32, dump_dir=str(tmp_path))
    pycoll.diagnostics.install()  # the process's recorder first: a Work carries the last recorder's entry
    with pytest.warns(RuntimeWarning, match="a second flight recorder"):  # documented as one per process
        pycoll.hooks.add_observer(rec)
    c = pycoll.init(0, 1, backend="host", name="solo")
    try:
        x = np.ones(3, np.float32)
        works = [c.all_reduce(x), c.broadcast(x, root=0), c.reduce(x, root=0), c.all_reduce(x, async_op=True)]
        works[-1].wait()
        works.append(c.barrier())
        d = rec.as_dict(0)
    finally:
        pycoll.comm.remove_observer(rec)
        c.destroy()
    names = [e["profiling_name"] for e in d["entries"]]
    assert names == ["nccl:all_reduce", "nccl:broadcast", "nccl:reduce", "nccl:all_reduce", "nccl:barrier"]
    assert all(e["state"] == "completed" and e["duration_ms"] >= 0 for e in d["entries"])
    assert d["pg_config"][c.uid] == {"name": c.uid, "desc": "solo", "ranks": "[0]"}
    # a rooted collective's root (pycoll-fr compares them across ranks); none for the others
    assert [e.get("pycoll_root") for e in d["entries"]] == [None, 0, 0, None, None]
    # the stack starts at the innermost Python frame: the caller's for the compiled all_reduce, broadcast and
    # reduce (they have no frame of their own), the public method's for one written in Python (barrier)
    for i in range(4):
        assert d["entries"][i]["frames"][0]["name"] == "test_real_host_communicator_is_recorded", i
    assert d["entries"][4]["frames"][0]["name"] == "barrier"
    assert any(f["name"] == "test_real_host_communicator_is_recorded" for f in d["entries"][4]["frames"])
    assert all(w.fr_entry is not None for w in works)


def test_a_subclass_that_overrides_a_hook_has_it_called(tmp_path):
    """The recorder's hooks are called through C, unless a subclass replaces one in Python: then the
    communicator calls that one (which may still call the compiled one)."""
    seen = []

    class Counting(fr.FlightRecorder):
        def work_enqueued(self, w):
            seen.append(w.op)
            super().work_enqueued(w)

    rec = Counting(8, dump_dir=str(tmp_path))
    assert not rec.compiled_hooks and fr.FlightRecorder(8, dump_dir=str(tmp_path)).compiled_hooks
    with warnings.catch_warnings():  # a second recorder, where the process's is registered (one per process)
        warnings.simplefilter("ignore", RuntimeWarning)
        pycoll.hooks.add_observer(rec)
    c = pycoll.init(0, 1, backend="host", name="subclass")
    try:
        c.all_reduce(np.ones(3, np.float32))
        c.broadcast(np.ones(3, np.float32), root=0)
        entries = rec.as_dict(0)["entries"]
    finally:
        pycoll.hooks.remove_observer(rec)
        c.destroy()
    assert seen == ["all_reduce", "broadcast"]
    assert [e["profiling_name"] for e in entries] == ["nccl:all_reduce", "nccl:broadcast"]
    assert all(e["state"] == "completed" for e in entries)


def test_an_observer_that_only_says_its_hooks_are_compiled_is_called_through_python():
    """The path calls compiled observers through C with no type test per operation: an observer that says
    ``compiled_hooks`` without being a compiled hook (a Python class) is called through its Python methods, and
    the operations go on."""
    seen = []

    class Claims(pycoll.hooks.CommObserver):
        compiled_hooks = True

        def work_enqueued(self, w):
            seen.append(("enqueued", w.op))

        def work_completed(self, w):
            seen.append(("completed", w.op))

    obs = Claims()
    pycoll.hooks.add_observer(obs)
    c = pycoll.init(0, 1, backend="host", name="claims")
    try:
        x = np.ones(3, np.float32)
        c.all_reduce(x)
        c.broadcast(x, root=0)
    finally:
        pycoll.hooks.remove_observer(obs)
        c.destroy()
    assert seen == [("enqueued", "all_reduce"), ("completed", "all_reduce"), ("enqueued", "broadcast"),
                    ("completed", "broadcast")]
    assert x.tolist() == [1.0] * 3


def test_the_first_communicator_registers_the_recorder_and_the_watchdog():
    code = (
        "import threading, pycoll, pycoll.hooks as h, pycoll.diagnostics as d\n"
        "assert h.observers() == () and threading.active_count() == 1, 'importing pycoll has side effects'\n"
        "c = pycoll.init(0, 1, backend='host')\n"
        "assert h.observers() == (d.get_recorder(), d.get_watchdog()), h.observers()\n"
        "assert d.get_watchdog().recorder is d.get_recorder() and d.get_watchdog().running\n"
        "c.destroy()\n"
        "print('ok')\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr
    assert callable(pycoll.dump_flight_recorder)


def test_generation_given_at_creation_names_the_dump_folder(tmp_path):
    rec = fr.FlightRecorder(8, dump_dir=str(tmp_path))
    c = FakeComm(rec, 0, 1, uid="late", generation=3)  # communicators are built with their generation
    c.op("all_reduce", f32(1), f32(1))
    paths = rec.dump("x", write_json=False)
    assert [os.path.basename(os.path.dirname(p)) for p in paths] == ["generation_3"]
    assert [e["record_id"] for e in load(paths[0])["entries"]] == [0]


def test_each_entry_names_its_own_communicator_also_when_an_address_is_reused(rec):
    """The recorder remembers the communicator it recorded last (no lookup per operation); a communicator made
    at the address of one that was closed must not inherit that one's process group."""
    a, b = FakeComm(rec, 0, 2, uid="a" * 16), FakeComm(rec, 0, 2, uid="b" * 16)
    for c in (a, a, b, a, b, b):
        c.op("all_reduce", f32(2), f32(2))
    groups = [e["process_group"][0] for e in rec.as_dict(0)["entries"]]
    assert groups == [u * 16 for u in "aabab" + "b"]
    b.op("all_reduce", f32(2), f32(2))
    rec.comm_closed(b)
    # what a new communicator at b's address looks like to the recorder: the same id, a new comm_created
    b.uid = "c" * 16
    rec.comm_created(b)
    b.op("all_reduce", f32(2), f32(2))
    assert rec.as_dict(0)["entries"][-1]["process_group"][0] == "c" * 16


def test_a_torchrun_restart_dumps_apart_from_the_attempt_it_restarted(monkeypatch):
    # every attempt dumped into ~/.cache/pycoll/fr/<TORCHELASTIC_RUN_ID>: the next attempt's exit dumps overwrote
    # the ones that explained the restart, and pycoll-fr found no problem
    from pycoll.diagnostics import files

    monkeypatch.delenv("PYCOLL_FR_DUMP_DIR", raising=False)
    monkeypatch.delenv("PYCOLL_RUN_ID", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", "/cache")
    monkeypatch.setenv("TORCHELASTIC_RUN_ID", "job7")
    monkeypatch.setenv("TORCHELASTIC_RESTART_COUNT", "0")
    assert files.default_dump_dir() == "/cache/pycoll/fr/job7"
    monkeypatch.setenv("TORCHELASTIC_RESTART_COUNT", "2")
    assert files.default_dump_dir() == "/cache/pycoll/fr/job7.attempt2"


def test_a_dump_folder_under_home_is_home_s(monkeypatch, tmp_path):
    # PYCOLL_FR_DUMP_DIR='~/dumps' passed its check (which expands it) and the dumps went to a folder named '~'
    from pycoll.diagnostics import files

    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.setenv("PYCOLL_FR_DUMP_DIR", "~/dumps")
    assert files.default_dump_dir() == str(tmp_path / "dumps")


def test_a_fork_of_a_rank_dumps_apart_from_it(monkeypatch, tmp_path):
    """A rank's forked worker that made its own communicators dumped under its own rank numbers into the job's folder:
    its dumps replaced its parent's (and the parent's peers'), and pycoll-fr blamed the wrong run."""
    import os

    from helpers.mp import in_a_fork

    import pycoll
    from pycoll.diagnostics import files

    monkeypatch.setenv("PYCOLL_FR_DUMP_DIR", str(tmp_path))
    assert in_a_fork(files.default_dump_dir) == f"ok {str(tmp_path)!r}"  # no communicator here: the same folder
    c = pycoll.init(0, 1, backend="host")
    try:
        got = in_a_fork(lambda: (files.default_dump_dir(), os.getpid()))
        folder, pid = eval(got[3:])
        assert folder == str(tmp_path / f"fork-{pid}"), got
        assert files.default_dump_dir() == str(tmp_path)
    finally:
        c.destroy()


def test_a_users_file_in_a_folder_named_pycoll_is_the_users():
    # any path ending in pycoll/<dir>/<name>.py was taken for pycoll's own code: the README's examples run from a
    # clone of the repository (a folder named pycoll) lost their 'issued at' site in every report
    from pycoll.diagnostics.stacks import is_runtime_frame

    assert not is_runtime_frame("/home/u/pycoll/examples/train.py")
    assert not is_runtime_frame("/home/u/pycoll/train.py")
    assert is_runtime_frame(pycoll.comm.__file__)
    assert is_runtime_frame("/elsewhere/site-packages/pycoll/comm.py")  # another host's install, in its dump
    assert is_runtime_frame("C:\\py\\site-packages\\pycoll\\store\\tcp.py")
    assert not is_runtime_frame("/elsewhere/site-packages/pycoll/tools/bench/cli.py")  # issues operations as users do


@pytest.mark.timeout(30)
def test_a_dump_from_a_signal_handler_that_ran_inside_a_dump_is_written(tmp_path):
    # the handler's dump waited for the lock of the dump it interrupted, in the same thread: for ever
    rec = fr.FlightRecorder(16, dump_dir=str(tmp_path))
    FakeComm(rec, 0, 1).op("all_reduce", f32(2), f32(2))
    with rec._dump_lock, rec._lock:  # where the handler ran
        assert rec.dump("handler")


def test_a_dropped_groups_operations_are_not_outstanding_at_exit(rec):
    # the exit dump said 'exit in rank 0 while all_reduce #2 (scheduled) ... outstanding' of operations that had
    # failed with their dropped group and left the outstanding list
    c = FakeComm(rec, 0, 1)
    w = c.op("all_reduce", f32(2), f32(2), state="scheduled")
    w._exc = pycoll.CommStateError("all_reduce (seq 1) never ran: its block raised")
    c.pending.remove(w)
    rec.work_withdrawn(w)
    assert rec.unfinished() == []
    assert rec.as_dict(0)["entries"][0]["pycoll_error"].startswith("CommStateError")


def test_an_exit_after_an_abort_names_the_operation_the_abort_stopped(rec):
    # an exit dump after a user's abort() of a blocking operation said 'with no operation outstanding': only
    # communicators with a recorded failure were looked at
    c = FakeComm(rec, 0, 1)
    w = c.op("all_reduce", f32(2), f32(2), state="started")
    w._exc = pycoll.CommAborted("all_reduce #1 on communicator 'world' did not complete: the communicator was aborted")
    rec.comm_closed(c)
    assert rec.failed() == ["all_reduce #1 on 'world' (started)"]


def test_a_dump_says_what_the_dump_it_replaced_said_however_its_folder_is_spelled(tmp_path):
    rec = fr.FlightRecorder(16, dump_dir=str(tmp_path))
    FakeComm(rec, 0, 1).op("all_reduce", np.ones(2, np.float32), np.ones(2, np.float32))
    rec.dump("first", dump_dir=str(tmp_path / "a"))
    rec.dump("elsewhere", dump_dir=str(tmp_path / "b"))  # replaces nothing in a/
    path = rec.dump("second", dump_dir=str(tmp_path / "a") + "/")[0]  # the same folder
    with open(path, "rb") as f:
        earlier = pickle.load(f)["pycoll"]["earlier_dumps"]
    assert [e["reason"] for e in earlier] == ["first"], earlier


def test_an_unfinished_dump_file_is_removed_as_the_process_ends(tmp_path, monkeypatch):
    # a big ring's dump still being written when exit's wait ended left its temporary file (tens of MB) behind
    import contextlib
    import threading

    from pycoll.diagnostics import files
    from pycoll.store import _safefiles

    writing, release = threading.Event(), threading.Event()

    def slow(path, data, tmp):
        with open(tmp, "wb") as f:
            f.write(data[:10])
        writing.set()
        release.wait(10)
        raise FileNotFoundError(tmp)  # its rename, once the file went

    monkeypatch.setattr(_safefiles, "write_private_atomic", slow)
    def write():
        with contextlib.suppress(FileNotFoundError):
            files.write_atomic(str(tmp_path / "dump"), b"x" * 100)

    t = threading.Thread(target=write)
    t.start()
    assert writing.wait(10)
    assert [p.name for p in tmp_path.iterdir() if p.name.endswith(".tmp")]
    files.remove_unfinished()
    assert [p.name for p in tmp_path.iterdir()] == []
    release.set()
    t.join(10)
