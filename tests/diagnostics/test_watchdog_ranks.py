"""Hangs and failures across real ranks on the host backend: the watchdog turns each into a diagnosis.

* a SIGSTOPped rank: the others time out within timeout + 1 s, say who is behind, dump, and ask the
  stopped rank to dump once it runs again; pycoll-fr and torch's analyzer both name it;
* a size mismatch is reported as a size mismatch (by both analyzers);
* a SIGKILLed rank: the survivors dump too (remote-error path);
* the manual trigger, SIGUSR1 (while the main thread is blocked inside a collective) and a dump request
  from another rank dump without stopping anything.
"""

from __future__ import annotations

import logging
import os
import pickle
import signal
import subprocess
import sys
import threading
import time

import numpy as np
import pytest
from helpers.mp import Died, run_ranks

import pycoll
from pycoll import _bindings as B, analyze
from pycoll.store import TCPStore, TCPStoreServer

PREFIX = "pycoll_trace_rank_"


def _uid() -> bytes:
    return bytes(B.load("host").get_unique_id())


@pytest.fixture
def server():
    srv = TCPStoreServer().start()
    yield srv
    srv.close()


class _Lines(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.lines = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append((record.name, record.levelname, record.getMessage()))


def _setup(rank, n, uid, dump_dir, addr=None, token=None, timeout=30.0):
    """In a rank: dumps into dump_dir, pycoll's log lines captured, a host communicator (with a store)."""
    os.environ["PYCOLL_FR_DUMP_DIR"] = dump_dir
    lines = _Lines()
    log = logging.getLogger("pycoll")
    log.addHandler(lines)
    log.setLevel(logging.INFO)
    store = TCPStore(addr[0], addr[1], token) if addr else None
    comm = pycoll.init(rank, n, unique_id=uid, backend="host", store=store, timeout=timeout)
    return comm, lines


def _gen0(dump_dir):
    return os.path.join(dump_dir, "generation_0")


def _dumped_ranks(dump_dir):
    folder = _gen0(dump_dir)
    if not os.path.isdir(folder):
        return set()
    return {int(f[len(PREFIX):]) for f in os.listdir(folder) if f.startswith(PREFIX)}


def _torch_fr_trace(folder, *extra):
    """torch's own analyzer on ``folder``; its report (it logs to stdout/stderr)."""
    pytest.importorskip("torch.distributed.flight_recorder.fr_trace")
    out = subprocess.run([sys.executable, "-m", "torch.distributed.flight_recorder.fr_trace",
                          folder, "-p", PREFIX, *extra],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stdout + out.stderr
    return out.stdout + out.stderr


# -- a stopped rank --------------------------------------------------------------------------------

K = 5  # the operation the stopped rank never reaches
T = 2.0  # per-operation timeout


def _stopped_rank(rank, n, uid, addr, token, dump_dir):
    comm, lines = _setup(rank, n, uid, dump_dir, addr, token, timeout=T)
    x = np.ones(2, np.float32)
    for _ in range(K - 1):
        comm.all_reduce(x)
    rec = pycoll.flight_recorder.get_recorder()
    if rank == n - 1:
        os.kill(os.getpid(), signal.SIGSTOP)
        # resumed by the test once the others have dumped: the dump request is waiting in the store
        deadline = time.monotonic() + 20
        while rec.dump_count == 0 and time.monotonic() < deadline:
            time.sleep(0.02)
        comm.abort()
        return {"dumps": rec.dump_count, "last": rec.last_dump}
    t0 = time.monotonic()
    try:
        comm.all_reduce(x)
        error = None
    except pycoll.CommFailure as e:
        error = e
    elapsed = time.monotonic() - t0
    comm.abort()
    assert pycoll.watchdog.get_watchdog().wait_for_dumps()  # written while the policy acted
    return {"error": type(error).__name__, "elapsed": elapsed, "lines": lines.lines, "last": rec.last_dump}


def _resume_after_dumps(procs, dump_dir, ranks, victim, limit=40.0):
    def run():
        deadline = time.monotonic() + limit
        while time.monotonic() < deadline and not ranks <= _dumped_ranks(dump_dir):
            time.sleep(0.02)
        os.kill(procs[victim].pid, signal.SIGCONT)

    threading.Thread(target=run, daemon=True).start()


@pytest.mark.timeout(150)
def test_sigstopped_rank_is_named_by_the_others_and_by_both_analyzers(server, tmp_path):
    n = 4
    d = str(tmp_path)
    # the timeout path: with liveness on, the stopped rank is found before the timeout (test_liveness.py)
    res = run_ranks(_stopped_rank, n, _uid(), server.address, server.token, d, timeout=90,
                    env={"PYCOLL_WATCHDOG_LIVENESS": "0"},
                    on_start=lambda procs: _resume_after_dumps(procs, d, {0, 1, 2}, n - 1))
    for r in range(n - 1):
        assert res[r]["error"] == "CommTimeout", res[r]
        assert res[r]["elapsed"] < T + 1.0, res[r]
        errors = [m for (name, level, m) in res[r]["lines"] if level == "ERROR"]
        assert len(errors) == 1, res[r]["lines"]  # ONE line (the communicator itself stays quiet)
        line = errors[0]
        assert line.startswith("pycoll watchdog: CommTimeout on communicator 'world'")
        assert f"rank {r}/4" in line and f"all_reduce #{K}" in line and "not completed after 2.0" in line
        assert "behind: rank 3 (last reported" in line and "stopped, hung or dead" in line
        assert "_stopped_rank" in line  # where the operation was issued
        assert res[r]["last"]["trigger"] in ("failure", "remote")
    assert res[n - 1]["dumps"] >= 1 and res[n - 1]["last"]["trigger"] == "remote"
    assert _dumped_ranks(d) == {0, 1, 2, 3}
    for r in range(n):
        with open(os.path.join(_gen0(d), f"{PREFIX}{r}"), "rb") as f:
            dump = pickle.load(f)
        assert dump["version"] == "2.10" and dump["pycoll"]["rank"] == r
        seqs = [e["collective_seq_id"] for e in dump["entries"]]
        assert seqs == (list(range(1, K)) if r == n - 1 else list(range(1, K + 1)))
        if r < n - 1:
            assert dump["entries"][-1]["state"] == "started"
            assert dump["pycoll"]["failures"][0]["behind"]["3"]["last_issued"] < K

    reports = analyze.analyze_dir(d)
    assert len(reports) == 1
    comm = reports[0]["communicators"][0]
    div = comm["first_divergence"]
    assert div["seq"] == K and list(div["never_entered"]) == [3] and sorted(div["in_flight"]) == [0, 1, 2]
    assert comm["matched_through"] == K - 1 and not comm["missing_dumps"]
    text = analyze.format_report(reports)
    assert f"verdict: rank 3 never entered all_reduce #{K} [Float(2,)] on 'world'" in text

    torch_out = _torch_fr_trace(_gen0(d))
    assert f"Not all ranks joining collective, sequence number: {K}" in torch_out
    assert "missing ranks: {3}" in torch_out


# -- a size mismatch -------------------------------------------------------------------------------


def _mismatch_rank(rank, n, uid, dump_dir):
    comm, _ = _setup(rank, n, uid, dump_dir, timeout=5.0)
    comm.all_reduce(np.ones(4, np.float32))
    try:
        comm.all_reduce(np.ones(8 if rank == 2 else 4, np.float32))
        error = None
    except pycoll.CommFailure as e:
        error = type(e).__name__
    comm.abort()
    if not os.path.exists(os.path.join(_gen0(dump_dir), f"{PREFIX}{rank}")):
        pycoll.dump_flight_recorder("after the mismatch")  # a library that did not notice: dump by hand
    return error


@pytest.mark.timeout(120)
def test_size_mismatch_is_reported_as_such(tmp_path):
    d = str(tmp_path)
    run_ranks(_mismatch_rank, 3, _uid(), d, timeout=60)
    assert _dumped_ranks(d) == {0, 1, 2}
    rep = analyze.analyze_dir(d)[0]
    div = rep["communicators"][0]["first_divergence"]
    assert div["seq"] == 2 and div["mismatch"]["kind"] == "size" and div["mismatch"]["culprits"] == [2]
    assert "SIZE MISMATCH: culprit rank 2" in analyze.format_report([rep])
    torch_out = _torch_fr_trace(_gen0(d))
    assert "Culprit rank 2; Error type: SIZE_OR_SYNTAX_MISMATCH" in torch_out


# -- a killed rank ---------------------------------------------------------------------------------


def _killed_rank(rank, n, uid, addr, token, dump_dir):
    comm, lines = _setup(rank, n, uid, dump_dir, addr, token, timeout=10.0)
    x = np.ones(2, np.float32)
    for _ in range(K - 1):
        comm.all_reduce(x)
    if rank == n - 1:
        os.kill(os.getpid(), signal.SIGKILL)
    t0 = time.monotonic()
    try:
        comm.all_reduce(x)
        error = None
    except pycoll.CommFailure as e:
        error = e
    elapsed = time.monotonic() - t0
    comm.abort()
    assert pycoll.watchdog.get_watchdog().wait_for_dumps()
    return {"error": type(error).__name__, "elapsed": elapsed, "lines": lines.lines,
            "last": pycoll.flight_recorder.get_recorder().last_dump}


@pytest.mark.timeout(120)
def test_killed_rank_survivors_dump(server, tmp_path):
    n = 4
    d = str(tmp_path)
    res = run_ranks(_killed_rank, n, _uid(), server.address, server.token, d, timeout=60, may_die=[n - 1])
    assert isinstance(res[n - 1], Died)
    for r in range(n - 1):
        # the host library's remote error, or the watchdog's liveness check finding the dead process first
        assert res[r]["error"] in ("RemoteError", "AsyncCommError", "CommAborted", "PeerFailure"), res[r]
        assert res[r]["elapsed"] < 10.0  # the remote error, not the timeout
        errors = [m for (_, level, m) in res[r]["lines"] if level == "ERROR"]
        assert len(errors) == 1 and "pycoll watchdog:" in errors[0] and f"all_reduce #{K}" in errors[0]
    assert _dumped_ranks(d) == {0, 1, 2}
    rep = analyze.analyze_dir(d)[0]
    comm = rep["communicators"][0]
    assert comm["missing_dumps"] == [3]
    div = comm["first_divergence"]
    assert div["seq"] == K and "not seen entering it" in div["missing_dumps"][3]
    assert "missing dumps: ranks 3" in analyze.format_report([rep])


# -- manual, signal and remote triggers stop nothing -----------------------------------------------


def _triggered_rank(rank, n, uid, dump_dir, marker):
    comm, _ = _setup(rank, n, uid, dump_dir)
    x = np.ones(4, np.float32)
    comm.all_reduce(x)
    comm.all_reduce(x)
    rec = pycoll.flight_recorder.get_recorder()
    out = {}
    if rank == 1:
        pycoll.enable_dump_signal()
        open(marker, "w").close()
        comm.all_reduce(x)  # blocks here until rank 0 joins, which waits for our signal dump
    else:
        out["manual"] = pycoll.dump_flight_recorder("a look")
        peer = os.path.join(_gen0(dump_dir), f"{PREFIX}1")
        deadline = time.monotonic() + 30
        while not os.path.exists(peer) and time.monotonic() < deadline:
            time.sleep(0.02)
        with open(peer, "rb") as f:
            out["peer_dump"] = pickle.load(f)
        comm.all_reduce(x)
    for _ in range(2):
        comm.all_reduce(x)
    out["value"] = x.tolist()
    # rank 0 goes on once the signal dump's pickle exists; its JSON form and the count follow it
    deadline = time.monotonic() + 20
    while rank == 1 and rec.dump_count == 0 and time.monotonic() < deadline:
        time.sleep(0.02)
    out["dumps"] = rec.dump_count
    out["last"] = rec.last_dump
    comm.abort()
    return out


def _signal_when_ready(procs, marker):
    def run():
        deadline = time.monotonic() + 30
        while not os.path.exists(marker) and time.monotonic() < deadline:
            time.sleep(0.01)
        time.sleep(0.3)  # rank 1 is now inside the blocking all_reduce
        os.kill(procs[1].pid, signal.SIGUSR1)

    threading.Thread(target=run, daemon=True).start()


@pytest.mark.timeout(120)
def test_manual_and_signal_dumps_stop_nothing(tmp_path):
    d = str(tmp_path / "dumps")
    marker = str(tmp_path / "ready")
    res = run_ranks(_triggered_rank, 2, _uid(), d, marker, timeout=60,
                    on_start=lambda procs: _signal_when_ready(procs, marker))
    # every operation completed, with the right values: nothing was stopped
    assert res[0]["value"] == res[1]["value"] == [2.0 ** 5] * 4
    manual = res[0]["manual"]
    assert manual and manual[0].endswith(os.path.join("generation_0", f"{PREFIX}0"))
    assert res[0]["dumps"] == 1 and res[0]["last"]["trigger"] == "manual"
    peer = res[0]["peer_dump"]
    assert peer["pycoll"]["trigger"] == "signal" and peer["pycoll"]["reason"] == "signal SIGUSR1"
    # dumped while its main thread was blocked inside op #3
    assert [(e["collective_seq_id"], e["state"]) for e in peer["entries"]] == [(1, "completed"), (2, "completed"),
                                                                                (3, "started")]
    assert res[1]["dumps"] == 1  # the Python-level handler, run later, did not dump again


def _requested_rank(rank, n, uid, addr, token, dump_dir):
    if rank == 2:  # its store thread first looks at the requests after rank 0 posted its own: still served
        pycoll.failpoints.configure("watchdog.request.first_look=sleep(1000)")
    comm, _ = _setup(rank, n, uid, dump_dir, addr, token)
    x = np.ones(4, np.float32)
    for _ in range(3):
        comm.all_reduce(x)
    # every rank out of its third all_reduce before the request: a rank still inside it as its store thread answers
    # dumps it as started, and the dumps then match through #2 only
    comm.store.set(f"test/third_done/{rank}", b"1")
    rec = pycoll.flight_recorder.get_recorder()
    if rank == 0:
        comm.store.wait([f"test/third_done/{r}" for r in range(n)], timeout=20)
        pycoll.dump_flight_recorder("have a look", all_ranks=True)
    deadline = time.monotonic() + 20
    while rec.dump_count == 0 and time.monotonic() < deadline:
        time.sleep(0.02)
    comm.all_reduce(x)  # still healthy
    last = rec.last_dump
    comm.abort()
    return {"value": x.tolist(), "last": last, "dumps": rec.dump_count}


@pytest.mark.timeout(120)
def test_dump_request_makes_healthy_ranks_dump(server, tmp_path):
    d = str(tmp_path)
    res = run_ranks(_requested_rank, 3, _uid(), server.address, server.token, d, timeout=60)
    assert all(r["value"] == [3.0 ** 4] * 4 for r in res)
    assert res[0]["last"]["trigger"] == "manual"
    for r in (1, 2):
        assert res[r]["dumps"] == 1 and res[r]["last"]["trigger"] == "remote"
        assert "requested by rank 0: have a look" in res[r]["last"]["reason"]
    assert _dumped_ranks(d) == {0, 1, 2}
    rep = analyze.analyze_dir(d)[0]
    assert rep["ok"] and rep["communicators"][0]["matched_through"] == 3


# -- a forked child's own communicator -------------------------------------------------------------


def _forked_kid(rank, uid, dump_dir, done, conn):
    """A fork of a process whose watchdog runs: its own communicator gets its own watchdog."""
    lines = _Lines()
    logging.getLogger("pycoll").addHandler(lines)
    pycoll.flight_recorder.configure(dump_dir=dump_dir)
    c = pycoll.init(rank, 2, unique_id=uid, backend="host", name="kid", timeout=1.0)
    if rank == 1:  # never joins the all_reduce
        done.wait(20)
        c.abort()
        return
    wd = pycoll.watchdog.get_watchdog()
    fd = signal.set_wakeup_fd(-1)
    signal.set_wakeup_fd(fd)
    t0 = time.monotonic()
    c.all_reduce(np.ones(4, np.float32), async_op=True)  # nobody waits for it: only the watchdog sees the timeout
    while c.state == "active" and time.monotonic() - t0 < 10:
        time.sleep(0.01)
    elapsed = time.monotonic() - t0
    wd.wait_for_dumps()
    done.set()
    with open(os.path.join(_gen0(dump_dir), f"{PREFIX}0"), "rb") as f:
        failure = pickle.load(f)
    conn.send({"state": c.state, "elapsed": elapsed, "wake_fd_ours": fd == wd._wake_w.fileno(),
               "threads": sorted(t.name for t in threading.enumerate() if t.name.startswith("pycoll-watchdog")),
               "errors": [m for _, level, m in lines.lines if level == "ERROR" and "CommTimeout" not in m],
               "failure": (failure["pycoll"]["trigger"], sorted(g["desc"] for g in failure["pg_config"].values()))})
    conn.close()
    os.kill(os.getpid(), signal.SIGTERM)  # its exit dump is its own too


@pytest.mark.timeout(120)
def test_a_forked_child_gets_its_own_watchdog(tmp_path):
    """multiprocessing's fork children of a process with a communicator (this one: its watchdog runs, the wake-up
    fd is its socket) make their own: their watchdog starts, times out what nobody waits for, dumps in their
    name; the parent goes on unaffected."""
    import multiprocessing as mp

    d, uid = str(tmp_path), _uid()
    solo = pycoll.init(0, 1, backend="host", name="parent")
    x = np.ones(2, np.float32)
    ctx = mp.get_context("fork")
    done = ctx.Event()
    r, w = ctx.Pipe(duplex=False)
    kids = [ctx.Process(target=_forked_kid, args=(k, uid, d, done, w)) for k in range(2)]
    try:
        solo.all_reduce(x)
        for p in kids:
            p.start()
        w.close()
        try:
            kid = r.recv() if r.poll(30) else None
        except EOFError:  # the child failed before it sent anything
            kid = None
        for p in kids:
            p.join(20)
        solo.all_reduce(x)  # the parent is unaffected
        running = pycoll.watchdog.get_watchdog().running
    finally:
        done.set()
        for p in kids:
            if p.is_alive():
                p.kill()
            p.join(5)
        r.close()
        solo.destroy()
    assert kid is not None, [p.exitcode for p in kids]
    assert kid["errors"] == [], kid["errors"]  # no observer failed in comm_created
    assert kid["threads"] == ["pycoll-watchdog", "pycoll-watchdog-liveness", "pycoll-watchdog-monitor",
                              "pycoll-watchdog-report", "pycoll-watchdog-store"]
    assert kid["wake_fd_ours"]  # not the parent's socket's number, inherited
    assert kid["state"] == "aborted" and 0.9 < kid["elapsed"] < 2.0, kid  # the watchdog's timeout, unwaited for
    assert kid["failure"] == ("failure", ["kid"])  # its dump holds its own communicator only
    assert [p.exitcode for p in kids] == [-signal.SIGTERM, 0]
    with open(os.path.join(_gen0(d), f"{PREFIX}0"), "rb") as f:
        exit_dump = pickle.load(f)
    assert exit_dump["pycoll"]["reason"].startswith("SIGTERM in rank 0 ")  # the child's own rank
    assert sorted(g["desc"] for g in exit_dump["pg_config"].values()) == ["kid"]
    assert x.tolist() == [1.0, 1.0] and running


def _made_with_the_store_thread_held(rank, n, path):
    """A communicator made while this process's watchdog store thread does nothing (its loop replaced): which of
    this rank's records the store holds as init returns."""
    from pycoll.diagnostics import watchdog as wd
    from pycoll.diagnostics.records import proc_prefix, progress_prefix

    wd.Watchdog._store_loop = lambda self, stop: stop.wait()
    store = pycoll.FileStore(path)
    c = pycoll.init(rank, n, store=store, backend="host", name="held")
    there = [store.check([f"{proc_prefix(c.uid)}{rank}"]), store.check([f"{progress_prefix(c.uid)}{rank}"])]
    c.barrier()
    c.destroy()
    return there


@pytest.mark.timeout(60)
def test_a_communicator_is_published_before_its_init_returns(tmp_path):
    """A rank's process and progress records are in the store as its init returns, not only once the watchdog's
    threads publish them: a rank killed or stopped before then (the store thread not yet scheduled, on busy CPUs) is
    known to its peers' liveness checks and failure reports ("not seen entering" their operation)."""
    res = run_ranks(_made_with_the_store_thread_held, 2, str(tmp_path / "store"), timeout=40)
    assert res == [[True, True]] * 2, res


def _aborted_records(rank, n, path, spec):
    from pycoll import failpoints
    from pycoll.diagnostics.records import proc_prefix, progress_prefix

    failpoints.configure(spec, rank=rank)
    store = pycoll.FileStore(path)
    c = pycoll.init(rank, n, store=store, backend="host", name="kept")
    c.all_reduce(np.ones(2, np.float32))
    keys = [f"{proc_prefix(c.uid)}{rank}", f"{progress_prefix(c.uid)}{rank}"]
    store.wait(keys, timeout=10)  # published: the process at once, the progress by the store thread
    c.barrier()
    c.abort()
    kept = store.check(keys)
    t0 = time.monotonic()
    while store.check(keys[:1]) or store.check(keys[1:]):
        if time.monotonic() - t0 > 10:
            return kept, None
        time.sleep(0.01)
    return kept, time.monotonic() - t0


@pytest.mark.timeout(60)
@pytest.mark.parametrize("spec", ["", "watchdog.records.forget=kill;rank=1"])
def test_the_records_of_an_aborted_communicator_go_after_records_keep(tmp_path, spec):
    """A rank's records in the store (its process, its progress) of a communicator it aborted stay for its peers
    PYCOLL_WATCHDOG_RECORDS_KEEP seconds, then the store thread deletes them: a loop of aborts (or failures and
    recoveries) over one store does not fill it up. Killed just before it deletes them, a rank's stay; the others'
    go as before."""
    env = {"PYCOLL_WATCHDOG_RECORDS_KEEP": "0.5", "PYCOLL_WATCHDOG_PUBLISH_INTERVAL": "0.05"}
    path = str(tmp_path / "store")
    res = run_ranks(_aborted_records, 2, path, spec, env=env, timeout=40, may_die=[1] if spec else [])
    for rank, r in enumerate(res):
        if spec and rank == 1:
            assert isinstance(r, Died), r
            continue
        kept, gone_after = r
        assert kept and gone_after is not None and gone_after < 5.0, (rank, r)
    left = [k for k in pycoll.FileStore(path).list_keys("pycoll/fr/") if not k.startswith("pycoll/fr/dump_signal")]
    assert sorted(k.rsplit("/", 1)[1] for k in left) == (["1", "1"] if spec else []), left


@pytest.mark.timeout(30)
def test_an_aborted_communicators_store_keeps_no_connection_while_its_records_wait():
    """The watchdog keeps an aborted communicator's store records_keep seconds (120) for one late deletion: its client
    kept its connections meanwhile, and a loop of inits (each with a client of its own, as pycoll.init() opens one
    from the launcher's environment) and aborts ran out of descriptors in the ranks and in the launcher's server."""
    from pycoll.store import TCPStoreServer

    with TCPStoreServer().start() as server:
        client = server.client(timeout=10)
        c = pycoll.init(0, 1, store=client, backend="host", name="kept-store")
        c.all_reduce(np.ones(2, np.float32))
        deadline = time.monotonic() + 10.0  # published through it (the store thread's publication may be under way)
        while not client._idle and time.monotonic() < deadline:
            time.sleep(0.01)
        assert client._idle
        c.abort()
        assert client._idle == []
        client.set("after", b"1")  # still usable: a call opens a connection
        assert client.get("after") == b"1"
        client.close()


def _reports_of_aborted_peers(rank, n, path, k):
    store = pycoll.FileStore(path)
    comms = [pycoll.init(rank, n, store=store, backend="host", name=f"gone{i}", timeout=20) for i in range(k)]
    for c in comms:
        c.all_reduce(np.ones(2, np.float32))
    flag = f"{path}.aborted"
    if rank == 1:
        for c in comms:
            c.abort()
        open(flag, "w").close()
        time.sleep(3.0)
        return None
    while not os.path.exists(flag):
        time.sleep(0.01)
    lines = []
    handler = logging.Handler()
    handler.emit = lambda rec: lines.append(rec.getMessage())  # type: ignore[method-assign]
    logging.getLogger("pycoll.watchdog").addHandler(handler)
    t0 = time.monotonic()
    for c in comms:
        with pytest.raises(pycoll.RemoteError):
            c.all_reduce(np.ones(2, np.float32))
    pycoll.watchdog.get_watchdog().wait_for_dumps()
    took = time.monotonic() - t0
    for c in comms:
        c.abort()
    return took, [m for m in lines if m.startswith("pycoll watchdog: RemoteError")]


@pytest.mark.timeout(60)
def test_reports_do_not_wait_for_the_answers_of_a_peer_that_aborted(tmp_path):
    """A peer that aborted its communicator answers no dump request for it: each failure report waited its whole
    bound (0.5 s) for it, one report at a time (8 communicators: 4 s, 1000: minutes)."""
    res = run_ranks(_reports_of_aborted_peers, 2, str(tmp_path / "store"), 6, timeout=40)
    took, lines = res[0]
    assert took < 2.0, (took, lines)
    assert len(lines) == 6 and all("rank 1 (last report" in m and "it aborted the communicator since" in m
                                   for m in lines), lines


def _group_differs(rank, n, uid, dump_dir, how):
    """``how`` "raises": rank 0's group block raises (its group is dropped there); "mismatch": rank 2 leaves the group's
    second all_reduce out (its #3 is the broadcast). Every rank dumps."""
    comm, _ = _setup(rank, n, uid, dump_dir, timeout=1.0 if how == "raises" else 3.0)
    x = np.ones(4, np.float32)
    comm.all_reduce(x)
    try:
        with comm.group():
            comm.all_reduce(x)  # #2: the same on every rank
            if how == "raises":
                comm.all_reduce(x)
                if rank == 0:
                    raise ValueError("a bug in rank 0's group block")
            else:
                if rank != 2:
                    comm.all_reduce(np.ones(2, np.float32))  # #3 on ranks 0 and 1
                comm.broadcast(x, root=0)  # rank 2's #3
    except (ValueError, pycoll.CommFailure):
        pass
    time.sleep(1.5 if how == "raises" and rank == 0 else 0.0)  # rank 1 times out meanwhile
    pycoll.flight_recorder.get_recorder().dump("test")
    comm.abort()


def test_operations_of_a_dropped_group_are_not_recorded_as_completed(tmp_path):
    # a group whose block raised runs none of its operations; the recorder took them (no longer outstanding, not
    # frozen) for completed, and pycoll-fr said rank 0 completed #2 where rank 1 waited for it
    run_ranks(_group_differs, 2, _uid(), str(tmp_path), "raises", timeout=40)
    text = analyze.format_report(analyze.analyze_dir(_gen0(str(tmp_path))), stacks=False)
    assert "verdict: rank 0 never ran all_reduce #2" in text and "the group was dropped" in text, text
    assert "completed on rank" not in text, text


def test_a_mismatch_inside_a_group_is_placed_at_the_collective_that_differs(tmp_path):
    # every operation of the group carries the library's mismatch text, which names collective #3: pycoll-fr took it
    # for the group's first one (#2, the same everywhere) and called it a count mismatch there
    run_ranks(_group_differs, 3, _uid(), str(tmp_path), "mismatch", timeout=40)
    text = analyze.format_report(analyze.analyze_dir(_gen0(str(tmp_path))), stacks=False)
    assert "FIRST DIVERGENCE at all_reduce #3" in text, text
    assert "verdict: operation type mismatch in all_reduce #3 [Float(2,)] on 'world': rank 2 differs" in text, text


def _dropped_with_work_outstanding(rank, n, uid, dump_dir):
    import gc

    comm, _ = _setup(rank, n, uid, dump_dir)
    x = np.ones(4, np.float32)
    comm.all_reduce(x)
    marker = os.path.join(dump_dir, "checked")
    if rank == 0:
        deadline = time.monotonic() + 20
        while not os.path.exists(marker) and time.monotonic() < deadline:
            time.sleep(0.01)
        comm.all_reduce(x)
        comm.abort()
        return None
    comm.all_reduce(x, async_op=True)
    del comm  # the user dropped it (and the Work) with the operation outstanding, as a process about to exit does
    gc.collect()
    unfinished = pycoll.flight_recorder.get_recorder().unfinished()
    alive = [c.name for c in pycoll.hooks.live_communicators()]
    open(marker, "w").close()
    c = pycoll.hooks.live_communicators()[0]
    c.outstanding()[0].wait()
    c.abort()
    return unfinished, alive


def test_a_dropped_communicator_stays_alive_and_outstanding_while_an_operation_is(tmp_path):
    out = run_ranks(_dropped_with_work_outstanding, 2, _uid(), str(tmp_path), timeout=40)
    unfinished, alive = out[1]
    assert unfinished in (["all_reduce #2 on 'world' (scheduled)"], ["all_reduce #2 on 'world' (started)"])
    assert alive == ["world"]


def _group_one_skips(rank, n, uid, addr, token, dump_dir, kind):
    """kind "p2p": rank 0 groups a send to rank 1 and a recv from rank 2; rank 1 receives; rank 2 sends nothing.
    kind "coll": rank 0 groups two all_reduce, rank 1 issues one; "deadlines": the same, the first with a 0.5 s
    timeout and the second with 20 s. The skipping rank waits for the others' dumps."""
    comm, lines = _setup(rank, n, uid, dump_dir, addr, token, timeout=1.0)
    a, b = np.full(4, 7, np.float32), np.zeros(4, np.float32)
    err = None
    try:
        if rank == 0:
            with comm.group():
                if kind == "p2p":
                    comm.send(a, 1)
                    comm.recv(b, 2)
                elif kind == "deadlines":
                    comm.all_reduce(a, timeout=0.5)
                    comm.all_reduce(b, timeout=20)
                else:
                    comm.all_reduce(a)
                    comm.all_reduce(b)
        elif rank == 1:
            if kind == "p2p":
                comm.recv(b, 0)
            else:
                comm.all_reduce(a)
    except pycoll.CommTimeout as e:
        err = (str(e), e.behind)
    if rank != 0:
        time.sleep(3.0)  # answers rank 0's dump request
    else:
        pycoll.watchdog.get_watchdog().wait_for_dumps()
    comm.abort()
    return err, [m for _, _, m in lines.lines if m.startswith("pycoll watchdog: CommTimeout")]


@pytest.mark.timeout(60)
@pytest.mark.parametrize("kind,n", [("p2p", 3), ("coll", 2), ("deadlines", 2)])
def test_a_group_that_times_out_is_reported_whole_with_every_peer_it_waits_for(server, tmp_path, kind, n):
    # its operations complete together, so which one it waits for is unknown: the report named its first one (a send
    # already delivered) and only that one's peer, or a collective every rank had entered ("no rank is behind")
    res = run_ranks(_group_one_skips, n, _uid(), server.address, server.token, str(tmp_path), kind, timeout=45)
    (err, behind), lines = res[0]
    line = lines[0] if lines else ""
    if kind == "p2p":
        assert "it completes with its group: send #1 with peer 1, recv #2 with peer 2" in err, err
        verdict = "peers: rank 1 (alive, answered: last issued p2p #1); rank 2 (alive, answered: last issued p2p #0)"
        assert behind == (1, 2), behind
    else:
        assert "all_reduce (seq 2) did not complete" in err and "its group: all_reduce #1, all_reduce #2" in err, err
        assert "all_reduce #2 [Float(4,)] (it completes with its group" in line, line
        if kind == "deadlines":  # the deadline that passed is the first one's: it said "within 20 s" after 0.5 s
            assert "did not complete within 0.5 s, the timeout of all_reduce #1 of its group (issued " in err, err
            assert "(timeout 0.5 s, state" in line, line
        verdict = "behind: rank 1 (alive, answered: last issued #1)"
        assert behind == (1,), behind
    # the caller's exception ends with the line's verdict on the other ranks
    assert verdict in line, line
    assert "; " + verdict in err, err


def _late_to_destroy(rank, n, path, spec):
    from pycoll import failpoints

    failpoints.configure(spec, rank=rank)
    c = pycoll.init(rank, n, store=pycoll.FileStore(path), backend="host", name="late")
    c.all_reduce(np.ones(2, np.float32))
    if rank == n - 1:
        time.sleep(5)  # busy elsewhere: not in destroy() while the others wait in theirs
    t0 = time.monotonic()
    try:
        c.destroy(timeout=2)
        return None
    except pycoll.CommFailure as e:
        return type(e).__name__, str(e), getattr(e, "behind", None), time.monotonic() - t0


@pytest.mark.timeout(60)
@pytest.mark.parametrize("spec", ["", "watchdog.peer_states.read=raise;rank=0",
                                  "watchdog.peer_states.read=kill;rank=0"])
def test_a_destroy_that_times_out_names_the_rank_that_had_not_begun_its_own(tmp_path, spec):
    """A destroy() waiting for a rank busy elsewhere said only 'ncclCommFinalize ... did not complete within 2 s':
    it names that rank now (its last progress record in the store says it is active), in the message and ``behind``.
    A failure to read the records (raise) leaves the timeout as it was; a rank killed as it reads them leaves the
    others' alone."""
    env = {"PYCOLL_WATCHDOG_PUBLISH_INTERVAL": "0.2"}
    res = run_ranks(_late_to_destroy, 3, str(tmp_path / "store"), spec, env=env, timeout=40,
                    may_die=[0] if "kill" in spec else [])
    for rank in (0, 1):
        if "kill" in spec and rank == 0:
            assert isinstance(res[0], Died), res[0]
            continue
        kind, text, behind, took = res[rank]
        assert kind == "CommTimeout" and "did not complete within 2 s" in text and took < 4.5, (rank, res[rank])
        if "raise" in spec and rank == 0:
            assert behind is None and "had not begun" not in text, text
        else:
            assert behind == (2,), (rank, res[rank])
            assert "; rank 2 had not begun to finalize (destroy() or finalize()), as its last record says (" in text
    assert res[2] is not None and res[2][0] != "CommTimeout", res[2]  # aborted by the others meanwhile
