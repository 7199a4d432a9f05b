"""pycoll.diagnostics.exits in one process: the reason, once per kind, the previous hooks still run."""

from __future__ import annotations

import os
import pickle
import subprocess
import sys
import threading

import numpy as np
import pytest
from helpers.fakes import FakeComm

from pycoll import flight_recorder as fr, watchdog as wdm
from pycoll.diagnostics import exits


def _setup(tmp_path):
    rec = fr.FlightRecorder(16, dump_dir=str(tmp_path))
    c = FakeComm(rec, 0, 2)
    c.op("all_reduce", np.ones(2, np.float32), np.ones(2, np.float32))
    c.op("all_reduce", np.ones(2, np.float32), np.ones(2, np.float32), state="started")
    wd = wdm.Watchdog(rec, enabled=False, communicators=lambda: [c])  # not running: dumps in the caller
    return rec, c, wd, exits.ExitDumps(wd)


def _reason(tmp_path):
    with open(tmp_path / "generation_0" / f"{fr.DEFAULT_FILE_PREFIX}0", "rb") as f:
        return pickle.load(f)["pycoll"]


def test_thread_exception_dumps_once_and_leaves_the_process_its_own(tmp_path, monkeypatch):
    rec, c, wd, ed = _setup(tmp_path)
    seen = []
    ed._prev_thread_hook = seen.append
    monkeypatch.setattr(threading, "excepthook", ed._thread_excepthook)

    def boom():
        raise ValueError("in a worker")

    for _ in range(2):
        t = threading.Thread(target=boom, name="worker")
        t.start()
        t.join()
    assert len(seen) == 2  # the previous hook ran every time
    assert rec.dump_count == 1  # once for threads
    pyc = _reason(tmp_path)
    assert pyc["reason"] == ("uncaught ValueError in thread 'worker' in rank 0 while all_reduce #2 on 'world' "
                             "(started) outstanding")
    assert pyc["exit"]["exception"]["frames"][0]["name"] == "boom"
    ed.dump("exit")  # the process's own end still dumps
    assert rec.dump_count == 2 and _reason(tmp_path)["reason"].startswith("exit in rank 0 while all_reduce #2")
    ed.dump("SIGTERM")
    assert rec.dump_count == 2  # once per process


def test_sys_exit_in_a_thread_ends_it_quietly(tmp_path, monkeypatch):
    """sys.exit() in a thread other than the main one ends that thread, silently in Python: no dump, no line."""
    rec, c, wd, ed = _setup(tmp_path)
    seen = []
    ed._prev_thread_hook = seen.append
    monkeypatch.setattr(threading, "excepthook", ed._thread_excepthook)
    t = threading.Thread(target=lambda: sys.exit(3), name="leaver")
    t.start()
    t.join()
    assert [a.exc_type for a in seen] == [SystemExit]  # the previous hook still runs (Python's ignores it)
    assert rec.dump_count == 0 and ed.reason is None


def test_excepthook_chains_and_no_outstanding_op_is_said(tmp_path):
    rec, c, wd, ed = _setup(tmp_path)
    c.pending.clear()  # the started all_reduce left the outstanding list: it completed
    seen = []
    ed._prev_excepthook = lambda *a: seen.append(a)
    try:
        raise KeyError("k")
    except KeyError as e:
        ed._excepthook(KeyError, e, e.__traceback__)
    assert len(seen) == 1 and seen[0][0] is KeyError
    assert _reason(tmp_path)["reason"] == "uncaught KeyError in rank 0 with no operation outstanding"
    ed._at_exit()  # nothing outstanding, already dumped: nothing more
    assert rec.dump_count == 1


def test_an_exit_dump_with_recording_off_does_not_say_nothing_was_outstanding(tmp_path):
    # PYCOLL_FR_BUFFER_SIZE=0: it said 'with no operation outstanding' of a rank whose all_reduce had just failed
    rec, c, wd, ed = _setup(tmp_path)
    rec.configure(buffer_size=0)
    ed.dump("uncaught CommTimeout")
    assert _reason(tmp_path)["reason"] == ("uncaught CommTimeout in rank 0 (its operations unknown: recording is off, "
                                           "PYCOLL_FR_BUFFER_SIZE=0)")


def test_an_exit_after_the_failed_communicator_was_closed_keeps_the_failure_dump(tmp_path):
    """A rank that caught a failure (its communicator aborted, then destroyed) and exits: nothing is outstanding,
    so no exit dump replaces the failure's (same file); a later event's reason says what failed, in its rank."""
    rec = fr.FlightRecorder(16, dump_dir=str(tmp_path))
    c = FakeComm(rec, 1, 2)
    c.op("all_reduce", np.ones(2, np.float32), np.ones(2, np.float32))
    w = c.op("all_reduce", np.ones(2, np.float32), np.ones(2, np.float32), state="started")
    rec.comm_failed(c, RuntimeError("peer gone"), w)
    rec.dump("failure in all_reduce #2", trigger="failure")
    rec.comm_closed(c)
    ed = exits.ExitDumps(wdm.Watchdog(rec, enabled=False, communicators=list))
    ed._at_exit()
    assert rec.dump_count == 1
    with open(tmp_path / "generation_0" / f"{fr.DEFAULT_FILE_PREFIX}1", "rb") as f:
        assert pickle.load(f)["pycoll"]["trigger"] == "failure"
    ed.dump("SIGTERM")
    assert ed.reason == "SIGTERM in rank 1 after all_reduce #2 on 'world' (started) failed"


def test_no_communicator_no_dump(tmp_path):
    rec = fr.FlightRecorder(16, dump_dir=str(tmp_path))
    ed = exits.ExitDumps(wdm.Watchdog(rec, enabled=False, communicators=list))
    assert ed.dump("exit") == [] and rec.dump_count == 0


def test_a_forked_child_does_not_dump_in_its_parents_name(tmp_path):
    import os

    rec, c, wd, ed = _setup(tmp_path)
    pid = os.fork()
    if pid == 0:  # the child: the hooks are inherited, the rank is not
        os._exit(0 if ed.dump("SIGTERM") == [] and rec.dump_count == 0 else 1)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    assert not (tmp_path / "generation_0").exists()
    assert ed.dump("SIGTERM") and rec.dump_count == 1  # the parent still dumps


def test_a_dump_that_fails_at_once_is_not_said_to_have_timed_out(tmp_path, caplog):
    blocker = tmp_path / "a-file"
    blocker.write_text("x")
    rec, c, wd, ed = _setup(tmp_path)
    rec.dump_dir = str(blocker / "sub")  # a file where a folder should be: the write fails at once
    with caplog.at_level("WARNING", logger="pycoll.watchdog"):
        assert ed.dump("exit") == []
    said = [r.getMessage() for r in caplog.records if "the dump for exit" in r.getMessage()]
    assert said == ["pycoll watchdog: the dump for exit was not written (see the error above)"], said


_FORKS = r"""
import multiprocessing as mp, os, signal, sys, time
import pycoll
comm = pycoll.init(0, 1, backend="host")
survived = 0
for i in range(30):  # a SIGTERM right after fork(): lost to the inherited Python handler, the child lived on
    pid = os.fork()
    if pid == 0:
        time.sleep(3)
        os._exit(7)
    os.kill(pid, signal.SIGTERM)
    _, st = os.waitpid(pid, 0)
    survived += os.WIFEXITED(st) and os.WEXITSTATUS(st) == 7
for i in range(10):  # Pool.__exit__ terminates its workers: it waited for ever for one that lived on
    with mp.Pool(2) as pool:
        pool.map(abs, [-1, -2])
r, w = os.pipe()
pid = os.fork()
if pid == 0:  # a child has SIGTERM's action as it was before pycoll's, until a communicator of its own
    os.write(w, b"dfl" if signal.getsignal(signal.SIGTERM) is signal.SIG_DFL else b"ours")
    os._exit(0)
os.waitpid(pid, 0)
print("survived", survived, "child", os.read(r, 8).decode(), "parent",
      "ours" if signal.getsignal(signal.SIGTERM) is not signal.SIG_DFL else "dfl", flush=True)
comm.destroy()
"""


@pytest.mark.timeout(90)
def test_forked_children_end_by_sigterm_as_without_pycoll(tmp_path):
    env = dict(os.environ, PYCOLL_FR_DUMP_DIR=str(tmp_path))
    p = subprocess.run([sys.executable, "-c", _FORKS], capture_output=True, text=True, timeout=80, env=env)
    assert p.returncode == 0, p.stdout + p.stderr
    assert "survived 0 child dfl parent ours" in p.stdout, p.stdout + p.stderr
