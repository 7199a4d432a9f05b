"""The going rank's own dump, and ranks stuck in user code answering the others' dump requests.

Each rank is a plain process (tests/diagnostics/exit_rank.py) on the host backend, so that an
uncaught exception, ``sys.exit`` and SIGTERM take the interpreter's own path:

* a rank raises while its all_reduce #5 is outstanding: its dump exists, with the reason and the op;
* a rank exits (``sys.exit``) with #5 outstanding: the same, from the exit handler;
* SIGTERM while the rank's main thread is blocked inside #5: the monitor thread dumps, then the
  process ends by SIGTERM as it would have without pycoll; a user's SIGTERM handler still runs, and
  not before that dump is written (a failpoint slows the dump); SIGTERM during a slow exception dump
  ends the process once that dump is written and the traceback printed;
* ranks stuck in ``while True: pass`` and in ``time.sleep(100)`` while the others time out in #5:
  their watchdogs answer the dump request (fresh progress, then a dump showing where the main thread
  is), the failing ranks' line says they are behind from those answers, and pycoll-fr uses the dumps;
* failpoints at the new waits: a rank killed before its exit dump, a rank stopped while its report
  waits for answers, a rank killed before it answers.
"""

from __future__ import annotations

import ctypes
import json
import os
import pickle
import re
import signal
import subprocess
import sys
import time

import pytest
from helpers import REPO
from helpers.mp import shm_entries, shm_prefix

from pycoll import _bindings as B, analyze
from pycoll.store import TCPStoreServer

HERE = os.path.dirname(os.path.abspath(__file__))
SCRIPT = os.path.join(HERE, "exit_rank.py")
PREFIX = "pycoll_trace_rank_"
K = 5
TOKEN = "exit-dumps"


@pytest.fixture
def server():
    srv = TCPStoreServer("127.0.0.1", 0, TOKEN).start()
    yield srv
    srv.close()


class Ranks:
    """n rank processes of exit_rank.py; always killed and reaped."""

    def __init__(self, server, n, dump_dir, scenario, timeout=10.0, env=None):
        uid = bytes(B.load("host").get_unique_id()).hex()
        host, port = server.address
        base = dict(os.environ, PYTHONPATH=REPO + os.pathsep + os.environ.get("PYTHONPATH", ""))
        self.procs = []
        for r in range(n):
            e = dict(base, PYCOLL_RANK=str(r), **(env or {}))
            self.procs.append(subprocess.Popen(
                [sys.executable, SCRIPT, str(r), str(n), uid, host, str(port), TOKEN, dump_dir, scenario,
                 str(timeout)], env=e, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True))

    def wait(self, ranks, limit=60.0):
        deadline = time.monotonic() + limit
        for r in ranks:
            self.procs[r].wait(max(0.1, deadline - time.monotonic()))
        return [self.procs[r].returncode for r in ranks]

    def output(self, r):
        p = self.procs[r]
        if p.poll() is None:
            return "(running)"
        return p.stdout.read() if p.stdout else ""

    def close(self):
        for p in self.procs:
            if p.poll() is None:
                try:
                    p.send_signal(signal.SIGKILL)  # alone: a SIGCONT first let a stopped rank run on (run_ranks)
                except ProcessLookupError:
                    pass
        for p in self.procs:
            try:
                p.wait(10)
            except subprocess.TimeoutExpired:
                pass
            if p.stdout:
                p.stdout.close()


def _run(server, tmp_path, scenario, n=3, env=None, timeout=10.0, during=None, limit=60.0):
    d = str(tmp_path / "dumps")
    os.makedirs(d, exist_ok=True)
    ranks = Ranks(server, n, d, scenario, timeout=timeout, env=env)
    try:
        if during is not None:
            during(ranks, d)
        codes = ranks.wait(range(n), limit)
        outs = [ranks.output(r) for r in range(n)]
    finally:
        ranks.close()
    return d, codes, outs


def _dump(d, r):
    with open(os.path.join(d, "generation_0", f"{PREFIX}{r}"), "rb") as f:
        return pickle.load(f)


def _wait_for(path, limit=30.0):
    deadline = time.monotonic() + limit
    while not os.path.exists(path) and time.monotonic() < deadline:
        time.sleep(0.02)
    return os.path.exists(path)


def _entry(dump, seq):
    return next(e for e in dump["entries"] if e["collective_seq_id"] == seq)


@pytest.mark.timeout(120)
def test_uncaught_exception_mid_collective_dumps(server, tmp_path):
    d, codes, outs = _run(server, tmp_path, "raise")
    assert codes[1] == 1, outs[1]
    assert "ValueError: boom in the user's code" in outs[1]  # the previous excepthook still ran
    dump = _dump(d, 1)
    pyc = dump["pycoll"]
    assert pyc["trigger"] == "exit"
    assert pyc["reason"].startswith(f"uncaught ValueError in rank 1 while all_reduce #{K} on 'world' (")
    assert pyc["reason"].endswith(") outstanding")
    assert _entry(dump, K)["state"] in ("scheduled", "started")
    assert pyc["exit"]["exception"]["type"] == "ValueError"
    frames = pyc["exit"]["exception"]["frames"]
    assert any(f["name"] == "main" and f["filename"].endswith("exit_rank.py") for f in frames)
    # the others found rank 1 gone in #5 and dumped too; pycoll-fr reads rank 1's own dump
    rep = analyze.analyze_dir(d)[0]
    c = rep["communicators"][0]
    assert not c["missing_dumps"] and c["matched_through"] == K - 1
    assert rep["triggers"][1].startswith("exit: uncaught ValueError in rank 1")
    assert any(f"all_reduce #{K}" in o for o in (outs[0], outs[2]))


@pytest.mark.timeout(120)
def test_exit_with_an_outstanding_collective_dumps(server, tmp_path):
    d, codes, outs = _run(server, tmp_path, "exit")
    assert codes[1] == 0, outs[1]
    dump = _dump(d, 1)
    pyc = dump["pycoll"]
    assert pyc["trigger"] == "exit" and pyc["reason"].startswith(f"exit in rank 1 while all_reduce #{K} on 'world'")
    # the reason names the state the dump gives (it said "scheduled" of an operation its dump had as "started")
    assert f"on 'world' ({_entry(dump, K)['state']}) outstanding" in pyc["reason"], (pyc["reason"], _entry(dump, K))


def _sigterm_when_entered(ranks, d):
    assert _wait_for(os.path.join(d, "mark-1-entering"))
    time.sleep(0.4)  # rank 1's main thread is now blocked inside all_reduce #5
    ranks.procs[1].send_signal(signal.SIGTERM)


@pytest.mark.timeout(120)
def test_sigterm_while_blocked_in_a_collective_dumps_then_ends_by_sigterm(server, tmp_path):
    d, codes, outs = _run(server, tmp_path, "sigterm", during=_sigterm_when_entered)
    assert codes[1] == -signal.SIGTERM, outs[1]  # as without pycoll
    dump = _dump(d, 1)
    assert dump["pycoll"]["trigger"] == "exit"
    assert dump["pycoll"]["reason"] == f"SIGTERM in rank 1 while all_reduce #{K} on 'world' (started) outstanding"
    assert _entry(dump, K)["state"] == "started"


@pytest.mark.timeout(120)
def test_sigterm_while_a_recovery_holds_a_failures_report_ends_the_rank_at_once(server, tmp_path):
    # the process ends: the report a recovery holds back (up to PYCOLL_FR_DUMP_HOLD, 60 s here) goes ahead, and its
    # SIGTERM acts once it is made, not PYCOLL_FR_DUMP_TIMEOUT later (30 s here; with the defaults it took 4 s more,
    # past a launcher's --grace of 1 or 2 s)
    took = []

    def sigterm(ranks, d):
        assert _wait_for(os.path.join(d, "mark-0-failed"))
        time.sleep(0.3)
        t0 = time.monotonic()
        ranks.procs[0].send_signal(signal.SIGTERM)
        ranks.procs[0].wait(60)
        took.append(time.monotonic() - t0)

    d, codes, outs = _run(server, tmp_path, "held", n=2, during=sigterm,
                          env={"PYCOLL_FR_DUMP_HOLD": "60", "PYCOLL_FR_DUMP_TIMEOUT": "30"})
    assert codes[0] == -signal.SIGTERM, outs[0]
    assert took[0] < 5, (took, outs[0])
    assert "rank 1" in outs[0] and "exited" in outs[0], outs[0]  # the failure's line was written before it ended
    dump = _dump(d, 0)
    assert dump["pycoll"]["trigger"].startswith("exit") and "SIGTERM in rank 0" in dump["pycoll"]["reason"], dump


@pytest.mark.timeout(120)
def test_ctrl_c_while_blocked_in_a_collective_dumps(server, tmp_path):
    def sigint(ranks, d):
        assert _wait_for(os.path.join(d, "mark-1-entering"))
        time.sleep(0.4)
        ranks.procs[1].send_signal(signal.SIGINT)

    d, codes, outs = _run(server, tmp_path, "sigint", during=sigint)
    assert codes[1] == -signal.SIGINT and "KeyboardInterrupt" in outs[1], outs[1]
    pyc = _dump(d, 1)["pycoll"]
    # the watchdog or the interrupted call failed the communicator (a failure dump), then the uncaught
    # KeyboardInterrupt dumped again, naming the operation: outstanding, or failed where the failure's abort has
    # closed the communicator by then
    assert pyc["trigger"] == "exit"
    assert re.fullmatch(rf"uncaught KeyboardInterrupt in rank 1 (while all_reduce #{K} on 'world' \(\w+\) "
                        rf"outstanding|after all_reduce #{K} on 'world' \(\w+\) failed)", pyc["reason"]), pyc["reason"]
    assert pyc["failures"] and "interrupted (SIGINT)" in pyc["failures"][0]["message"]


_WAITING_IN_INIT = """
import sys, pycoll
pycoll.init(0, 2, unique_id=bytes.fromhex(sys.argv[1]), backend="host", init_timeout=60)
"""
_WAITING_IN_GROW = """
import sys, pycoll
comm = pycoll.init(0, 1, unique_id=bytes.fromhex(sys.argv[1]), backend="host")
comm.grow(2, comm.get_unique_id(), timeout=60)
"""


def _mapped_segment(pid):
    """The name in /dev/shm of the pycoll segment process ``pid`` maps (by inode: it mapped it under a temporary
    name, linked under its own since)."""
    try:
        with open(f"/proc/{pid}/maps") as f:
            inodes = {int(line.split()[4]) for line in f if f"/dev/shm/{shm_prefix()}" in line}
    except OSError:
        return None
    for name in shm_entries():
        try:
            if os.stat(os.path.join("/dev/shm", name)).st_ino in inodes:
                return name
        except OSError:
            pass
    return None


@pytest.mark.timeout(60)
def test_a_first_communicator_made_outside_the_main_thread_warns_that_sigterm_has_no_handler():
    # an inference server that made its communicator in a serving thread got none of pycoll's SIGTERM behaviour (no
    # dump, no abort of an init under way, no note at its store), silently; a communicator the main thread makes
    # later installs it, and no warning comes then
    code = ("import threading, warnings, pycoll\n"
            "warnings.simplefilter('always')\n"
            "def make():\n"
            "    pycoll.init(0, 1, backend='host', name='t').destroy()\n"
            "t = threading.Thread(target=make); t.start(); t.join()\n"
            "t = threading.Thread(target=make); t.start(); t.join()\n"
            "pycoll.init(0, 1, backend='host', name='main').destroy()\n"
            "import signal; print('handler', signal.getsignal(signal.SIGTERM) not in (signal.SIG_DFL, None))\n")
    out = subprocess.run([sys.executable, "-c", code], env=dict(os.environ, PYTHONPATH=REPO), capture_output=True,
                         text=True, timeout=60)
    assert out.returncode == 0, out
    assert out.stderr.count("RuntimeWarning: pycoll: a communicator is made outside the main thread") == 1, out.stderr
    assert "handler True" in out.stdout, out


@pytest.mark.timeout(60)
@pytest.mark.parametrize("script", [_WAITING_IN_INIT, _WAITING_IN_GROW], ids=["init", "grow"])
def test_sigterm_while_waiting_in_init_removes_the_segment_it_created(tmp_path, script):
    """The first rank to arrive creates the rendezvous segment and waits in it for the others (a new
    communicator's, or the child's of a grow whose joiner is late); SIGTERM (pycoll's handler, SIGTERM's default
    action) aborts that init, so the segment goes with the process, not at a later init's sweep."""
    lib = B.load("host")
    env = dict(os.environ, PYTHONPATH=REPO + os.pathsep + os.environ.get("PYTHONPATH", ""),
               PYCOLL_FR_DUMP_DIR=str(tmp_path))
    p = subprocess.Popen([sys.executable, "-c", script, bytes(lib.get_unique_id()).hex()], env=env,
                         stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        seg, deadline = None, time.monotonic() + 30
        while seg is None and p.poll() is None and time.monotonic() < deadline:
            time.sleep(0.02)
            seg = _mapped_segment(p.pid)
        assert seg is not None, p.communicate(timeout=10)[0] if p.poll() is not None else "no segment"
        p.send_signal(signal.SIGTERM)
        assert p.wait(20) == -signal.SIGTERM
        assert not os.path.exists(os.path.join("/dev/shm", seg))
    finally:
        if p.poll() is None:
            p.kill()
        p.wait(10)
        p.stdout.close()
        lib.get_unique_id()  # sweeps a segment whose creator is gone, should the test fail


@pytest.mark.timeout(120)
def test_sigterm_chains_to_the_users_handler(server, tmp_path):
    d, codes, outs = _run(server, tmp_path, "sigterm_user", during=_sigterm_when_entered)
    # the dump was written while the main thread was blocked; the user's handler ran once the call returned
    assert codes[1] == 3, outs[1]
    assert os.path.exists(os.path.join(d, "mark-1-users-handler"))
    assert _dump(d, 1)["pycoll"]["reason"].startswith(f"SIGTERM in rank 1 while all_reduce #{K}")


@pytest.mark.timeout(120)
def test_sigterm_users_handler_waits_for_a_slow_dump(server, tmp_path):
    # the monitor thread's dump takes 1.5 s: the user's handler (sys.exit) must not end the process
    # before it is written, whichever thread reached SIGTERM's handler first
    env = {"PYCOLL_FAILPOINTS": "watchdog.exit.before_dump=sleep(1500);rank=1"}
    d, codes, outs = _run(server, tmp_path, "sigterm_user", env=env, during=_sigterm_when_entered)
    assert codes[1] == 3, outs[1]
    assert _dump(d, 1)["pycoll"]["reason"].startswith(f"SIGTERM in rank 1 while all_reduce #{K}")


def _sigterm_during_exception_dump(server, tmp_path, failpoints):
    """Rank 1 raises with #K outstanding; its exception dump is slowed (2 s) and SIGTERM comes meanwhile, as
    pycoll-run's fail-fast sends it to the other ranks of a job one of whose ranks died. Returns the dump
    directory, rank 1's exit code, the seconds from the SIGTERM to its end, and its output."""
    trace = tmp_path / "trace"
    d = str(tmp_path / "dumps")
    os.makedirs(d)
    env = {"PYCOLL_FAILPOINTS": f"watchdog.exit.before_dump=sleep(2000);rank=1;trace={trace}" + failpoints}
    ranks = Ranks(server, 3, d, "raise", env=env)
    try:
        assert _wait_for(str(trace))
        t0 = time.monotonic()
        ranks.procs[1].send_signal(signal.SIGTERM)
        code = ranks.wait([1], 30)[0]
        took = time.monotonic() - t0
        out = ranks.output(1)
    finally:
        ranks.close()
    return d, code, took, out


@pytest.mark.timeout(120)
def test_sigterm_during_an_exception_dump_acts_once_the_dump_and_traceback_are_out(server, tmp_path):
    # the SIGTERM waits for the ending thread: its dump is written, the previous excepthook prints the
    # traceback, then the process ends by SIGTERM -- neither the main thread (the handler runs inside its
    # dump) nor the monitor thread (which writes that dump) may end the process under it, and neither waits
    # for the other (bounded: the dump's 2 s, not the 30 s limit)
    d, code, took, out = _sigterm_during_exception_dump(server, tmp_path, "")
    assert code == -signal.SIGTERM, out
    assert took < 15.0, (took, out)
    assert _dump(d, 1)["pycoll"]["reason"].startswith("uncaught ValueError in rank 1"), out
    assert "ValueError: boom in the user's code" in out, out


@pytest.mark.timeout(120)
def test_killed_before_a_deferred_sigterm_acts(server, tmp_path):
    # a kill where the deferred SIGTERM is about to act: the dump and the traceback are out already
    d, code, took, out = _sigterm_during_exception_dump(server, tmp_path, ",watchdog.exit.deferred_sigterm=kill;rank=1")
    assert code == -signal.SIGKILL, out
    assert _dump(d, 1)["pycoll"]["reason"].startswith("uncaught ValueError in rank 1"), out
    assert "ValueError: boom in the user's code" in out, out


@pytest.mark.timeout(120)
def test_sigterm_while_a_timeout_is_being_reported_waits_for_the_report(server, tmp_path):
    # rank 1's #K times out; while the watchdog reports it (slowed by a failpoint: the store exchange of a rank that
    # waits for a peer's answer), SIGTERM comes, as pycoll-run's fail-fast sends it when another rank has ended.
    # Whichever thread found the timeout (the main thread in its wait, the polling thread), the line is logged, the
    # dump holds the failure, and the process still ends by SIGTERM. Before, a handler in the main thread waited
    # (4 s) for the report under itself, and the monitor's dump had no failure: no line, no failure in the dump.
    trace = tmp_path / "trace"
    env = {"PYCOLL_FAILPOINTS": f"watchdog.report.begin=sleep(1500);rank=1;trace={trace}"}

    def sigterm(ranks, d):
        assert _wait_for(str(trace))
        time.sleep(0.2)
        ranks.procs[1].send_signal(signal.SIGTERM)

    d, codes, outs = _run(server, tmp_path, "timeout_sigterm", env=env, timeout=1.0, during=sigterm)
    assert codes[1] == -signal.SIGTERM, outs[1]
    assert "pycoll watchdog: CommTimeout on communicator 'world'" in outs[1], outs[1]
    pyc = _dump(d, 1)["pycoll"]
    # the timeout failed it before the SIGTERM came: not outstanding any more
    assert pyc["reason"].startswith(f"SIGTERM in rank 1 after all_reduce #{K} on 'world'"), pyc["reason"]
    assert pyc["reason"].endswith(" failed"), pyc["reason"]
    assert [f["error_type"] for f in pyc["failures"]] == ["CommTimeout"], pyc["failures"]


@pytest.mark.timeout(150)
def test_ranks_stuck_in_user_code_answer_the_dump_request(server, tmp_path):
    n = 4
    d, codes, outs = _run(server, tmp_path, "stuck", n=n, timeout=2.0,
                          during=lambda ranks, d: _stop_stuck_after(ranks, d), limit=90)
    assert codes[:2] == [0, 0], outs[:2]
    for r, where in ((2, "stuck_busy"), (3, "stuck_sleeping")):
        pyc = _dump(d, r)["pycoll"]
        assert pyc["trigger"] == "remote" and "requested by rank" in pyc["reason"]
        assert pyc["main_thread"][0]["name"] == where  # where the user's code was when it answered
    for r in (0, 1):
        fail = _dump(d, r)["pycoll"]["failures"][0]
        assert set(fail["behind"]) == {"2", "3"} and all(v["answered"] for v in fail["behind"].values()), fail
        assert not fail["unconfirmed"]
    rep = analyze.analyze_dir(d)[0]
    c = rep["communicators"][0]
    assert not c["missing_dumps"]
    div = c["first_divergence"]
    assert div["seq"] == K and sorted(div["never_entered"]) == [2, 3]
    text = analyze.format_report([rep])
    assert "rank 2: never entered it" in text and "its main thread was at exit_rank.py" in text
    assert "in stuck_busy" in text and "in stuck_sleeping" in text
    assert "it saw behind: rank 2 (its own dump: last all_reduce #4" in text
    assert f"verdict: ranks 2-3 never entered all_reduce #{K}" in text


def _stop_stuck_after(ranks, d):
    # ranks 0 and 1 end by themselves once the stuck ranks have dumped; the stuck ones are killed then
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and any(ranks.procs[r].poll() is None for r in (0, 1)):
        time.sleep(0.05)
    for r in (2, 3):
        ranks.procs[r].kill()


@pytest.mark.timeout(150)
def test_a_rank_holding_the_gil_in_a_c_call_leaves_its_stacks(server, tmp_path):
    # no Python thread of rank 2 can run: it cannot answer; the failing ranks (same host) send it the dump
    # signal it published, and its faulthandler writes every thread's stack from C
    d = str(tmp_path / "dumps")
    os.makedirs(d)
    ranks = Ranks(server, 3, d, "gil", timeout=2.0, env={"PYCOLL_FR_DUMP_SIGNAL": "SIGUSR1"})
    try:
        assert ranks.wait([0, 1], 60) == [0, 0], [ranks.output(r) for r in (0, 1)]
        stacks = os.path.join(d, "stacks")
        files = [os.path.join(stacks, f) for f in os.listdir(stacks)]
        text = ""
        deadline = time.monotonic() + 20
        while "stuck_holding_the_gil" not in text and time.monotonic() < deadline:
            text = "".join(open(f).read() for f in files)
            time.sleep(0.05)
        assert "stuck_holding_the_gil" in text and "pycoll rank 2 pid" in text, text
        assert ranks.procs[2].poll() is None  # the signal dumped, it did not kill
    finally:
        ranks.close()
    fail = _dump(d, 0)["pycoll"]["failures"][0]
    assert "2" in fail["signalled"] and fail["signalled"]["2"]["signal"] == "SIGUSR1", fail
    rep = analyze.analyze_dir(d)[0]
    text = analyze.format_report([rep], stacks=False)
    assert "rank 2: its Python stacks, written from C on the dump signal:" in text
    assert "(main thread at exit_rank.py:" in text and "in stuck_holding_the_gil)" in text


# -- failpoints at the new waits ----------------------------------------------------------------


@pytest.mark.timeout(120)
def test_killed_before_its_exit_dump_leaves_none_and_the_others_go_on(server, tmp_path):
    env = {"PYCOLL_FAILPOINTS": "watchdog.exit.before_dump=kill;rank=1"}
    d = str(tmp_path / "dumps")
    os.makedirs(d)
    ranks = Ranks(server, 3, d, "raise", env=env)
    try:
        assert ranks.wait([1])[0] == -signal.SIGKILL
        # the others wait for rank 1's dump, which never comes: a placeholder tells them it is gone
        os.makedirs(os.path.join(d, "generation_0"), mode=0o700, exist_ok=True)
        open(os.path.join(d, "generation_0", f"{PREFIX}1"), "wb").close()
        assert ranks.wait([0, 2]) == [0, 0]
    finally:
        ranks.close()
    os.unlink(os.path.join(d, "generation_0", f"{PREFIX}1"))
    rep = analyze.analyze_dir(d)[0]
    assert rep["communicators"][0]["missing_dumps"] == [1]


@pytest.mark.timeout(150)
def test_a_rank_stopped_while_awaiting_answers_and_one_killed_before_answering(server, tmp_path):
    # rank 0 stops while its report waits for the answers; rank 3 (stuck in time.sleep) dies before it
    # answers: rank 1's report says what it knows of rank 3 -- its last report, with its age
    env = {"PYCOLL_FAILPOINTS": "watchdog.report.await_answers=stop;rank=0,watchdog.request.answer=kill;rank=3"}
    d = str(tmp_path / "dumps")
    os.makedirs(d)
    ranks = Ranks(server, 4, d, "stuck", timeout=2.0, env=env)
    try:
        assert ranks.wait([3])[0] == -signal.SIGKILL
        assert _wait_for(os.path.join(d, "generation_0", f"{PREFIX}1"), 30)
        ranks.procs[0].send_signal(signal.SIGCONT)
        time.sleep(0.5)
        for r in (0, 1, 2):
            ranks.procs[r].kill()
    finally:
        ranks.close()
    fail = _dump(d, 1)["pycoll"]["failures"][0]
    assert "3" in fail["unconfirmed"] or ("3" in fail["behind"] and not fail["behind"]["3"]["answered"]), fail
    assert fail["behind"]["2"]["answered"]
    text = json.dumps(fail)
    assert "report_age_s" in text


@pytest.mark.timeout(120)
def test_killed_after_its_sigterm_dump(server, tmp_path):
    # the dump is written before SIGTERM's default action is restored: a kill there leaves the dump
    env = {"PYCOLL_FAILPOINTS": "watchdog.exit.terminate=kill;rank=1"}
    d, codes, outs = _run(server, tmp_path, "sigterm", env=env, during=_sigterm_when_entered)
    assert codes[1] == -signal.SIGKILL, outs[1]
    assert _dump(d, 1)["pycoll"]["reason"].startswith(f"SIGTERM in rank 1 while all_reduce #{K}")


@pytest.mark.timeout(150)
def test_a_rank_stopped_before_it_signals_a_silent_peer(server, tmp_path):
    # rank 0 stops just before it signals rank 2 (which holds the GIL); rank 1 signals it all the same
    env = {"PYCOLL_FR_DUMP_SIGNAL": "SIGUSR1", "PYCOLL_FAILPOINTS": "watchdog.report.signal_peer=stop;rank=0"}
    d = str(tmp_path / "dumps")
    os.makedirs(d)
    ranks = Ranks(server, 3, d, "gil", timeout=2.0, env=env)
    try:
        assert ranks.wait([1], 60) == [0], ranks.output(1)
        assert ranks.procs[0].poll() is None  # stopped
        stacks = os.path.join(d, "stacks")
        deadline = time.monotonic() + 20
        text = ""
        while "stuck_holding_the_gil" not in text and time.monotonic() < deadline:
            text = "".join(open(os.path.join(stacks, f)).read() for f in os.listdir(stacks))
            time.sleep(0.05)
        assert "stuck_holding_the_gil" in text
    finally:
        ranks.close()
    assert "2" in _dump(d, 1)["pycoll"]["failures"][0]["signalled"]


_SIGNAL_THEN_EXIT = """
import os, signal
import numpy as np, pycoll
comm = pycoll.init(0, 1, unique_id=pycoll.get_unique_id(backend="host"), backend="host")
comm.all_reduce(np.ones(2, np.float32))
os.kill(os.getpid(), signal.SIGUSR1)
"""


# glibc's on_exit() calls raise(exit status) once the interpreter has ended: the dump signal comes after Python's end
_SIGNAL_AFTER_EXIT = """
import ctypes, os, signal, sys
import numpy as np, pycoll
how = os.environ["HOW"]
if how == "no communicator":
    pycoll.enable_dump_signal("SIGUSR1")
else:  # $PYCOLL_FR_DUMP_SIGNAL
    comm = pycoll.init(0, 1, unique_id=pycoll.get_unique_id(backend="host"), backend="host")
    comm.all_reduce(np.ones(2, np.float32))
if how == "switched":  # SIGUSR1, the one used before, is what comes
    pycoll.enable_dump_signal("SIGUSR2")
libc = ctypes.CDLL(None)
libc.on_exit.argtypes = [ctypes.c_void_p, ctypes.c_void_p]
libc.on_exit(ctypes.cast(libc["raise"], ctypes.c_void_p), None)
sys.exit(int(signal.SIGUSR1))
"""


def _signal_env(d, env=None):
    """A script's environment: this checkout's pycoll, SIGUSR1 its dump signal, dumps into ``d``."""
    return dict(os.environ, PYTHONPATH=REPO + os.pathsep + os.environ.get("PYTHONPATH", ""),
                PYCOLL_FR_DUMP_SIGNAL="SIGUSR1", PYCOLL_FR_DUMP_DIR=str(d), **(env or {}))


def _signal_then_exit(tmp_path, env, script=_SIGNAL_THEN_EXIT):
    d = tmp_path / "dumps"
    t0 = time.monotonic()
    p = subprocess.run([sys.executable, "-c", script], env=_signal_env(d, env), capture_output=True, text=True,
                       timeout=60)
    return p, time.monotonic() - t0, d / "generation_0"


@pytest.mark.timeout(90)
@pytest.mark.parametrize("slow_ms", [0, 600])
def test_a_dump_signal_right_before_a_normal_exit_is_written(tmp_path, slow_ms):
    # the process ends right after the signal: exit waits for the monitor thread to read it and write the dump
    # (failpoint watchdog.dump.write: the dump starts 0.6 s late), not only for the dumps queued when it looked
    env = {"PYCOLL_FAILPOINTS": f"watchdog.dump.write=sleep({slow_ms})"} if slow_ms else {}
    p, _, gen = _signal_then_exit(tmp_path, env)
    assert p.returncode == 0, p.stdout + p.stderr
    with open(gen / f"{PREFIX}0", "rb") as f:
        dump = pickle.load(f)
    assert dump["pycoll"]["trigger"] == "signal" and dump["pycoll"]["reason"] == "signal SIGUSR1"
    assert [e["state"] for e in dump["entries"]] == ["completed"]
    assert os.listdir(gen) == [f"{PREFIX}0"]  # no temporary file left


@pytest.mark.timeout(90)
def test_a_dump_signal_whose_dump_outlasts_the_dump_timeout_delays_exit_by_that_long(tmp_path):
    p, took, gen = _signal_then_exit(tmp_path, {"PYCOLL_FAILPOINTS": "watchdog.dump.write=sleep(20000)",
                                                "PYCOLL_FR_DUMP_TIMEOUT": "1"})
    assert p.returncode == 0, p.stdout + p.stderr
    assert took < 15, took
    assert "a flight-recorder dump was still being written at exit (dump_timeout 1 s)" in p.stderr, p.stderr
    assert not gen.exists() or not os.listdir(gen)


@pytest.mark.timeout(90)
@pytest.mark.skipif(not hasattr(ctypes.CDLL(None), "on_exit"), reason="needs glibc's on_exit()")
@pytest.mark.parametrize("how", ["communicator", "switched", "no communicator"])
def test_a_dump_signal_that_comes_as_the_interpreter_ends_is_ignored(tmp_path, how):
    # a peer that read this rank's published dump signal may send it while the rank ends normally: the interpreter's
    # end gave the handler back its default action (killed: exit -10) or left faulthandler's chained to it (SIGSEGV);
    # also the signal used before another was enabled, and one enabled where no communicator was made
    p, _, _ = _signal_then_exit(tmp_path, {"HOW": how}, _SIGNAL_AFTER_EXIT)
    assert p.returncode == signal.SIGUSR1, p.stdout + p.stderr  # the exit status the script gave


_WAITING_IN_INIT = """
import sys, pycoll
try:
    pycoll.init(1, 2, store=pycoll.FileStore(sys.argv[1]), backend="host", init_timeout=6, global_ranks=[4, 7])
except pycoll.StoreTimeout as e:  # rank 0 never came with the unique id
    print("init:", type(e).__name__)
"""


@pytest.mark.timeout(60)
def test_the_dump_signal_dumps_a_rank_waiting_in_its_init(tmp_path):
    # PYCOLL_FR_DUMP_SIGNAL was installed with the first communicator: sent to a rank waiting for its peers in init
    # (a rank stuck in init: the case to send it for), its default action ended the rank (exit -10). Its dump and
    # stacks are named by the rank its init gives it (they said rank 0: two such ranks wrote one file)
    d = tmp_path / "dumps"
    p = subprocess.Popen([sys.executable, "-c", _WAITING_IN_INIT, str(tmp_path / "store")], env=_signal_env(d),
                         stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        deadline = time.monotonic() + 20
        while not (d / "stacks").is_dir() and time.monotonic() < deadline:  # made as the signal is installed
            time.sleep(0.02)
        time.sleep(0.3)
        os.kill(p.pid, signal.SIGUSR1)
        out, _ = p.communicate(timeout=30)
    finally:
        p.kill()
        p.wait()
    assert p.returncode == 0 and "init: StoreTimeout" in out, out
    assert "rank 7 dumped 0 entries" in out and "(signal: signal SIGUSR1)" in out, out
    [stacks] = list((d / "stacks").iterdir())
    assert " in init" in stacks.read_text()  # where it waited
    assert list(analyze.find_stacks(str(d))) == [7]


_SIGNAL_BEFORE_INIT = """
import os, signal, time
import numpy as np, pycoll
pycoll.enable_dump_signal()
comm = pycoll.init(0, 1, unique_id=pycoll.get_unique_id(backend="host"), backend="host", global_ranks=[3])
os.kill(os.getpid(), signal.SIGUSR1)
pycoll.watchdog.get_watchdog().wait_for_dumps()
"""


def test_stacks_of_a_signal_enabled_before_the_communicator_name_its_rank(tmp_path):
    # the stacks file's first line, written as the signal was installed, named rank 0 (no communicator yet), and
    # pycoll-fr filed the stacks of global rank 3 under rank 0
    p, _, gen = _signal_then_exit(tmp_path, {}, _SIGNAL_BEFORE_INIT)
    assert p.returncode == 0, p.stdout + p.stderr
    assert os.listdir(gen) == [f"{PREFIX}3"]
    assert list(analyze.find_stacks(str(tmp_path / "dumps"))) == [3]  # was rank 0, the header written at install


_WHOSE_SIGNAL = """
import os, signal, sys, threading, time
import numpy as np, pycoll
how, seen = os.environ["HOW"], []
if how == "ignored before":  # as a child of a process that turned its dump signal off inherits it across exec
    signal.signal(signal.SIGUSR1, signal.SIG_IGN)
if how == "program's own before":
    signal.signal(signal.SIGUSR1, lambda s, f: seen.append(s))
if how == "thread first":  # the watchdog started there, where the signal cannot be installed
    t = threading.Thread(target=lambda: pycoll.init(0, 1, unique_id=pycoll.get_unique_id(backend="host"),
                                                    backend="host", name="worker").destroy())
    t.start()
    t.join()
comm = pycoll.init(0, 1, unique_id=pycoll.get_unique_id(backend="host"), backend="host")
comm.all_reduce(np.ones(2, np.float32))
if how == "program's own after":
    signal.signal(signal.SIGUSR1, lambda s, f: seen.append(s))
os.kill(os.getpid(), signal.SIGUSR1)
time.sleep(0.5)
pycoll.watchdog.get_watchdog().wait_for_dumps()
print("dump signal", pycoll.watchdog.get_watchdog().dump_signal, "program's handler ran", len(seen))
"""


@pytest.mark.timeout(90)
@pytest.mark.parametrize("how", ["ignored before", "thread first", "program's own after", "program's own before"])
def test_whose_the_dump_signal_is(tmp_path, how):
    # "ignored before": SIG_IGN was taken for another's handler, so a process started by one that had turned its dump
    # signal off (left ignored) could not have one. "thread first": an init in the main thread after one in another
    # thread left it uninstalled, and the signal killed the process. "program's own after": a handler the program
    # installed after pycoll's had its deliveries dumped by pycoll as well, which still published the signal
    p, _, gen = _signal_then_exit(tmp_path, {"HOW": how}, _WHOSE_SIGNAL)
    assert p.returncode == 0, p.stdout + p.stderr
    if how == "program's own after":
        assert "dump signal None program's handler ran 1" in p.stdout, p.stdout
        assert "SIGUSR1 has another handler now" in p.stderr and not gen.exists(), p.stderr
    elif how == "program's own before":  # kept, and said once (the watchdog's start said it twice)
        assert "dump signal None program's handler ran 1" in p.stdout, p.stdout
        assert p.stderr.count("SIGUSR1 already has a handler") == 1 and not gen.exists(), p.stderr
    else:
        assert "dump signal 10 program's handler ran 0" in p.stdout and "already has a handler" not in p.stderr
        assert os.listdir(gen) == [f"{PREFIX}0"]
