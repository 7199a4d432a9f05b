"""pycoll-run: start ranks, prefix their output, propagate failures, replace ranks, leave nothing behind.

Every test runs the real launcher (``python -m pycoll.run``) on small scripts that import nothing heavy.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import socket
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Dict, List, Optional

import pytest

import pycoll

REPO = str(Path(pycoll.__file__).resolve().parent.parent)


def _env(extra: Optional[Dict[str, str]] = None) -> Dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYCOLL_")}
    env["PYTHONPATH"] = REPO + os.pathsep + env.get("PYTHONPATH", "")
    env.update(extra or {})
    return env


def _script(tmp_path: Path, *parts: str, name: str = "rank.py") -> str:
    """Write the (each dedented) parts into one script."""
    path = tmp_path / name
    path.write_text("\n".join(textwrap.dedent(p) for p in parts))
    return str(path)


def _cmd(args: List[str]) -> List[str]:
    return [sys.executable, "-m", "pycoll.run"] + args


def launch(args: List[str], tmp_path: Path, timeout: float = 60, env=None) -> subprocess.CompletedProcess:
    return subprocess.run(_cmd(args), capture_output=True, text=True, timeout=timeout, env=_env(env),
                          cwd=str(tmp_path))


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            state = f.read().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state not in ("Z", "X")


def _wait_files(paths: List[Path], timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while not all(p.exists() and p.read_text() for p in paths):
        assert time.monotonic() < deadline, f"timed out waiting for {[str(p) for p in paths]}"
        time.sleep(0.02)


def _pids(tmp_path: Path, pattern: str = "pid*") -> List[int]:
    return [int(p.read_text()) for p in sorted(tmp_path.glob(pattern)) if p.read_text()]


def _assert_all_gone(pids: List[int], timeout: float = 10) -> None:
    deadline = time.monotonic() + timeout
    while any(_alive(p) for p in pids) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not [p for p in pids if _alive(p)], "processes outlived the launcher"


WRITE_PID = """
import os, sys, time
RANK = int(os.environ["PYCOLL_RANK"])
def write(name, text):
    tmp = name + ".tmp"
    with open(tmp, "w") as f:
        f.write(text)
    os.replace(tmp, name)
write(f"pid{RANK}", str(os.getpid()))
"""


def test_output_is_prefixed_line_by_line(tmp_path):
    script = _script(tmp_path, """
        import os, sys
        r = int(os.environ["PYCOLL_RANK"])
        for i in range(300):
            sys.stdout.write(f"out {r} {i} " + "x" * 300 + "\\n")
            sys.stderr.write(f"err {r} {i}\\n")
        sys.stdout.write(f"tail {r}")
    """)
    res = launch(["-n", "3", script], tmp_path)
    assert res.returncode == 0, res.stderr
    seen: Dict[int, List[int]] = {0: [], 1: [], 2: []}
    tails = set()
    for line in res.stdout.splitlines():
        m = re.fullmatch(r"\[rank(\d)\]: (?:out (\d) (\d+) x{300}|tail (\d))", line)
        assert m, f"mangled line: {line[:120]!r}"
        if m.group(4) is not None:
            assert m.group(4) == m.group(1)
            tails.add(int(m.group(1)))
        else:
            assert m.group(2) == m.group(1)
            seen[int(m.group(1))].append(int(m.group(3)))
    assert tails == {0, 1, 2}
    assert all(v == list(range(300)) for v in seen.values())
    err = [line for line in res.stderr.splitlines() if line.startswith("[rank")]
    assert len(err) == 900 and all(re.fullmatch(r"\[rank(\d)\]: err \1 \d+", line) for line in err)


def test_ranks_get_their_environment_and_reach_the_store(tmp_path):
    script = _script(tmp_path, """
        import os
        from pycoll.env import discover, open_store
        info = discover()
        store = open_store(timeout=30)
        store.set(f"rank{info.rank}", str(info.rank * 10))
        values = store.multi_get([f"rank{r}" for r in range(info.world_size)], timeout=30)
        print(info.source, info.rank, info.world_size, info.local_rank, info.local_world_size, info.node_rank,
              info.nnodes, info.replacement, info.store_addr, sum(int(v) for v in values),
              os.environ["PYTHONUNBUFFERED"], sep=",")
    """)
    res = launch(["-n", "3", script], tmp_path)
    assert res.returncode == 0, res.stderr
    lines = sorted(res.stdout.splitlines())
    assert lines == [f"[rank{r}]: pycoll,{r},3,{r},3,0,1,0,127.0.0.1,30,1" for r in range(3)]


@pytest.mark.timeout(60)
def test_first_failure_sets_exit_code_and_stops_the_others(tmp_path):
    script = _script(tmp_path, WRITE_PID, """
        if RANK == 1:
            while not all(os.path.exists(f"pid{r}") for r in (0, 2)):
                time.sleep(0.01)
            sys.exit(3)
        time.sleep(300)
    """)
    t0 = time.monotonic()
    res = launch(["-n", "3", script], tmp_path)
    assert res.returncode == 3
    assert time.monotonic() - t0 < 40
    assert "rank 1 exited with code 3; stopping the other ranks" in res.stderr
    _assert_all_gone(_pids(tmp_path))


def test_rank_killed_by_a_signal(tmp_path):
    script = _script(tmp_path, """
        import os, signal, time
        if os.environ["PYCOLL_RANK"] == "1":
            os.kill(os.getpid(), signal.SIGKILL)
        time.sleep(300)
    """)
    res = launch(["-n", "2", script], tmp_path)
    assert res.returncode == 128 + signal.SIGKILL
    assert "rank 1 was killed by SIGKILL (exit code 137)" in res.stderr


def test_a_rank_that_exits_with_a_code_above_128_is_no_signal(tmp_path):
    # sys.exit(137) was reported "killed by SIGKILL (exit code 137)": an operator went looking for an OOM kill
    script = _script(tmp_path, """
        import os, sys, time
        if os.environ["PYCOLL_RANK"] == "1":
            sys.exit(137)
        time.sleep(300)
    """)
    res = launch(["-n", "2", script], tmp_path)
    assert res.returncode == 137
    assert "rank 1 exited with code 137; stopping the other ranks" in res.stderr, res.stderr


@pytest.mark.timeout(60)
def test_ranks_ignoring_sigterm_are_killed_after_the_grace_period(tmp_path):
    script = _script(tmp_path, WRITE_PID, """
        import signal
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        if RANK == 1:
            while not os.path.exists("pid0"):
                time.sleep(0.01)
            sys.exit(2)
        time.sleep(300)
    """)
    t0 = time.monotonic()
    res = launch(["-n", "2", "--grace", "0.5", script], tmp_path)
    assert res.returncode == 2
    assert "killing them" in res.stderr
    assert time.monotonic() - t0 < 40
    _assert_all_gone(_pids(tmp_path))


KEEP_GOING = """
import os, sys
from pycoll.env import open_store
from pycoll.run import mark_lost
RANK = int(os.environ["PYCOLL_RANK"])
store = open_store(timeout=30)
if RANK == 1:
    sys.exit(5)
store.get("pycoll-run/exit/1", timeout=30)  # the survivors outlive rank 1's failure
print("survived", store.get("pycoll-run/failure/1").decode())
if RANK == 0 and MARK:
    mark_lost(store, 1, "reshaped without it")
"""


@pytest.mark.parametrize("mark, flags", [(False, ["--keep-going"]), (True, ["--keep-going"]),
                                         (False, ["--replace-failed", "0"])])  # it implies --keep-going, K=0 too
def test_keep_going(tmp_path, mark, flags):
    script = _script(tmp_path, f"MARK = {mark}", KEEP_GOING)
    res = launch(["-n", "3", *flags, script], tmp_path)
    assert sorted(res.stdout.splitlines()) == ["[rank0]: survived 1 5", "[rank2]: survived 1 5"]
    if mark:
        assert res.returncode == 0, res.stderr
        assert "marked lost" in res.stderr
    else:
        assert res.returncode == 5
        assert "neither replaced nor marked lost" in res.stderr


GROUP_LOST = """
import os, sys
from pycoll.env import discover, open_store
from pycoll.launch.keys import launched_processes, mark_group_lost
info = discover()
store = open_store(timeout=30)
if info.replacement == 0:
    sys.exit(7)  # every original process dies
if info.rank == 1:  # its replacement finds nobody left to admit it, says so, and is not needed (exit 0)
    print("recorded", launched_processes(store, [0, 1])[1][1:] == (os.getpid(), 1))
    mark_group_lost(store, "every member of group 'g' is gone")
"""


def test_a_job_whose_group_was_lost_fails_although_its_replacements_exit_0(tmp_path):
    """Every failed slot was replaced and every replacement ended with 0, but a group of the job lost every member
    (its replacements were not needed): the job failed, with the earliest failure's code."""
    script = _script(tmp_path, GROUP_LOST)
    res = launch(["-n", "2", "--replace-failed", "2", script], tmp_path)
    assert res.stdout.splitlines() == ["[rank1]: recorded True"], res.stdout
    assert res.returncode == 7, res.stderr
    assert "the job failed: every member of group 'g' is gone (exit code 7)" in res.stderr, res.stderr


def test_a_lost_group_whose_ranks_all_ended_on_their_own_is_no_failure(tmp_path):
    """A group marked lost while no rank failed: its members ended (without close()) while a replacement waited."""
    script = _script(tmp_path, "from pycoll.env import open_store\nfrom pycoll.launch.keys import mark_group_lost\n"
                               "mark_group_lost(open_store(timeout=30), 'nobody is left to admit slot 1')\n")
    res = launch(["-n", "1", "--replace-failed", "1", script], tmp_path)
    assert res.returncode == 0, res.stderr
    assert "nobody is left to admit slot 1, but no rank failed" in res.stderr, res.stderr


LATE_JOINER = """
import os, numpy as np, pycoll
group = pycoll.ElasticGroup.from_env(backend="host", timeout=10.0)
if group.slot == 2 and not group.joined:
    os._exit(7)  # its replacement comes once the others have finished
for step in range(20):
    try:
        group.comm.all_reduce(np.ones(2))
    except pycoll.CommFailure:
        group.reshape()
group.close()
"""


def test_a_replacement_whose_group_finished_is_not_replaced_again(tmp_path):
    """--replace-failed 30: each replacement found the group finished, exited, and was replaced, 30 times over."""
    script = _script(tmp_path, LATE_JOINER)
    res = launch(["-n", "3", "--replace-failed", "30", script], tmp_path)
    assert res.returncode == 0, res.stderr
    assert res.stderr.count("starting replacement") == 1, res.stderr
    assert "rank 2 exited with code 1: its group finished before it was admitted; no replacement" in res.stderr


REPLACE = """
import os, sys
from pycoll.env import discover, open_store
from pycoll.run import failures
info = discover()
store = open_store(timeout=30)
if info.rank == 1:
    if info.replacement == 0 or ALWAYS_FAIL:
        sys.exit(9)
    print("replacement", info.replacement, "replaces", info.replaces, os.environ["PYCOLL_REPLACES"])
    store.set("replacement-ready", "1")
else:
    if not ALWAYS_FAIL:
        store.get("replacement-ready", timeout=30)
        print("replacement key", store.get("pycoll-run/replacement/1").decode(), "failures", failures(store))
"""


def test_replace_failed(tmp_path):
    script = _script(tmp_path, "ALWAYS_FAIL = False", REPLACE)
    res = launch(["-n", "2", "--replace-failed", "1", script], tmp_path)
    assert res.returncode == 0, res.stderr
    assert sorted(res.stdout.splitlines()) == ["[rank0]: replacement key 1 failures [(1, 9)]",
                                               "[rank1]: replacement 1 replaces 1 1"]
    assert "starting replacement 1 for it" in res.stderr


def test_replacement_budget_runs_out(tmp_path):
    script = _script(tmp_path, "ALWAYS_FAIL = True", REPLACE)
    res = launch(["-n", "2", "--replace-failed", "2", script], tmp_path)
    assert res.returncode == 9
    assert res.stderr.count("starting replacement") == 2
    assert "the other ranks go on" in res.stderr


HUNG = """
import os, signal, time
from pycoll.env import discover, open_store
from pycoll.run import failures, mark_lost
info = discover()
store = open_store(timeout=30)
if info.rank == 1 and info.replacement == 0:
    store.set("hung-pid", str(os.getpid()))
    os.kill(os.getpid(), signal.SIGSTOP)  # hangs: nobody continues it
    print("continued")
elif info.rank == 1:
    print("replacement", info.replacement)
    store.set("replacement-ready", "1")
else:
    pid = int(store.get("hung-pid", timeout=30))
    while open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()[0] != "T":
        time.sleep(0.01)
    mark_lost(store, 1, "left out")  # as the elastic layer's survivors do: the launcher kills it now
    store.get("pycoll-run/exit/1", timeout=30)
    if REPLACE:
        store.get("replacement-ready", timeout=30)
    print("failures", failures(store))
"""


@pytest.mark.timeout(60)
@pytest.mark.parametrize("replace", [0, 1])
def test_a_hung_rank_marked_lost_is_killed_and_replaced(tmp_path, replace):
    """A stopped rank whose slot is marked lost is killed; that is the rank's failure, replaced as a crash is."""
    script = _script(tmp_path, f"REPLACE = {replace}", HUNG)
    res = launch(["-n", "2", "--replace-failed", str(replace), "--keep-going", script], tmp_path)
    assert res.returncode == 0, res.stderr
    assert "rank 1 is stopped and was marked lost (hung); killing it" in res.stderr
    assert "[rank0]: failures [(1, 137)]" in res.stdout.splitlines()
    if replace:
        assert "[rank1]: replacement 1" in res.stdout.splitlines(), res.stdout
        assert "rank 1 hung (stopped) and was killed; starting replacement 1 for it" in res.stderr
    else:
        assert "rank 1 hung (stopped) and was killed; the other ranks go on" in res.stderr
    assert "continued" not in res.stdout


@pytest.mark.timeout(60)
def test_a_hung_rank_marked_lost_fails_a_fail_fast_job(tmp_path):
    """Without --keep-going the killed hung rank fails the job, as a rank killed by SIGKILL does."""
    script = _script(tmp_path, "REPLACE = 0", HUNG)
    res = launch(["-n", "2", script], tmp_path)
    assert res.returncode == 137, res.stderr
    assert "rank 1 is stopped and was marked lost (hung); killing it" in res.stderr
    assert "rank 1 hung (stopped) and was killed; stopping the other ranks" in res.stderr
    assert "continued" not in res.stdout


ALONE = """
import os, signal
if os.environ["PYCOLL_RANK"] == "1":
    os.kill(os.getpid(), signal.SIGSTOP)  # the others end meanwhile
    print("continued", flush=True)
"""


@pytest.mark.timeout(60)
@pytest.mark.parametrize("keep_going", [False, pytest.param(True, marks=pytest.mark.slow)])
def test_a_rank_stopped_after_every_other_ended_is_killed_as_hung(tmp_path, keep_going):
    """Nobody is left to continue it: killed as hung (a failure) instead of waited for forever."""
    script = _script(tmp_path, ALONE)
    t0 = time.monotonic()
    res = launch(["-n", "3", *(["--keep-going"] if keep_going else []), script], tmp_path, timeout=40)
    took = time.monotonic() - t0
    assert res.returncode == 137, res.stderr
    assert ("rank 1 is stopped (SIGSTOP) and every other rank has ended: nobody is left to continue it (hung); "
            "killing it") in res.stderr
    assert "rank 1 hung (stopped) and was killed" in res.stderr
    assert "continued" not in res.stdout
    assert took < 20, took


@pytest.mark.timeout(60)
def test_a_rank_stopped_for_less_than_the_hung_bound_is_not_killed(tmp_path):
    """Continued 1 s after it stopped (the other rank ended at once): it finishes, nothing is killed."""
    script = _script(tmp_path, ALONE)
    proc = subprocess.Popen(_cmd(["-n", "2", script]), env=_env(), cwd=str(tmp_path),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 20
        stopped = []
        while time.monotonic() < deadline and not stopped:
            stopped = [pid for pid in _descendants(proc.pid) if _state(pid) == "T"]
            time.sleep(0.01)
        assert stopped
        time.sleep(1.0)
        os.kill(stopped[0], signal.SIGCONT)
        out, err = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 0, err
    assert "[rank1]: continued" in out.splitlines(), out
    assert "hung" not in err


def _state(pid: int) -> str:
    try:
        return open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()[0]
    except OSError:
        return ""


def _descendants(pid: int) -> List[int]:
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        try:
            kids = [int(k) for t in os.listdir(f"/proc/{p}/task")
                    for k in open(f"/proc/{p}/task/{t}/children").read().split()]
        except OSError:
            kids = []
        out += kids
        todo += kids
    return out


def test_module_target(tmp_path):
    pkg = tmp_path / "mypkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "hello.py").write_text(
        "import os, sys\nprint('module', __name__, os.environ['PYCOLL_RANK'], sys.argv[1:])\n"
    )
    res = launch(["-n", "2", "-m", "mypkg.hello", "a", "--flag"], tmp_path)
    assert res.returncode == 0, res.stderr
    assert sorted(res.stdout.splitlines()) == [f"[rank{r}]: module __main__ {r} ['a', '--flag']" for r in range(2)]


def test_no_python_target(tmp_path):
    # rank 1 fails (and the launcher stops the others) only once rank 0 has written its line
    res = launch(["-n", "2", "--no-python", "sh", "-c",
                  "echo rank=$PYCOLL_RANK; [ $PYCOLL_RANK = 0 ] || sleep 1; exit $PYCOLL_RANK"], tmp_path)
    assert res.returncode == 1
    assert "[rank0]: rank=0" in res.stdout.splitlines()
    assert "Warning" not in res.stderr  # e.g. `python -m pycoll.run` finding itself imported by `pycoll`


def test_nothing_outlives_the_job(tmp_path):
    """Grandchildren left running -- in the rank's process group or in a new session -- are killed."""
    script = _script(tmp_path, WRITE_PID, """
        import subprocess
        same_group = subprocess.Popen(["sleep", "300"])
        own_session = subprocess.Popen(["sleep", "300"], start_new_session=True)
        write(f"pidg{RANK}", str(same_group.pid))
        write(f"pids{RANK}", str(own_session.pid))
    """)
    res = launch(["-n", "2", script], tmp_path)
    assert res.returncode == 0, res.stderr
    pids = _pids(tmp_path, "pid*")
    assert len(pids) == 6
    _assert_all_gone(pids)


_CHILDREN = """
import os, subprocess, sys, time
from pycoll.launch import launcher as L
L._prctl(L._PR_SET_CHILD_SUBREAPER, 1)
kid = subprocess.Popen(["sleep", "30"])
mid = subprocess.Popen([sys.executable, "-c", "import subprocess; print(subprocess.Popen(['sleep', '30']).pid)"],
                       stdout=subprocess.PIPE, text=True)
orphan = int(mid.stdout.readline())
mid.wait()  # the orphan's parent is gone: it is re-parented to this process, the subreaper
end = time.monotonic() + 10
while orphan not in L._children_by_scan(os.getpid()) and time.monotonic() < end:
    time.sleep(0.01)
print(sorted(L._children_of(os.getpid())), sorted(L._children_by_scan(os.getpid())), sorted([kid.pid, orphan]))
for p in (kid.pid, orphan):
    os.kill(p, 9)
kid.wait()
os.waitpid(orphan, 0)
"""


@pytest.mark.timeout(60)
def test_the_launcher_finds_its_children_and_the_orphans_it_adopted():
    """``_children_of`` (the threads' /proc children lists, read every 0.5 s for stray descendants) finds what a
    scan of every process finds: a child, and a grandchild re-parented to the subreaper after its parent exited."""
    res = subprocess.run([sys.executable, "-c", _CHILDREN], env=_env(), capture_output=True, text=True, timeout=50)
    assert res.returncode == 0, res.stderr
    fast, scan, expected = (json.loads(x) for x in re.findall(r"\[[\d, ]*\]", res.stdout))
    assert fast == scan == expected and len(expected) == 2, res.stdout


@pytest.mark.timeout(60)
def test_ranks_die_with_the_launcher(tmp_path):
    script = _script(tmp_path, WRITE_PID, "time.sleep(300)\n")
    proc = subprocess.Popen(_cmd(["-n", "2", script]), cwd=str(tmp_path), env=_env(), stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    try:
        _wait_files([tmp_path / "pid0", tmp_path / "pid1"])
        proc.kill()
        proc.wait(10)
        _assert_all_gone(_pids(tmp_path))
    finally:
        proc.kill()
        proc.wait(10)


@pytest.mark.timeout(60)
@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_signals_are_forwarded(tmp_path, sig):
    script = _script(tmp_path, WRITE_PID, f"""
        import signal
        def handler(signum, frame):
            write(f"got{{RANK}}", signal.Signals(signum).name)
            sys.exit(0)
        signal.signal({int(sig)}, handler)
        write(f"ready{{RANK}}", "1")
        time.sleep(300)
    """)
    proc = subprocess.Popen(_cmd(["-n", "2", script]), cwd=str(tmp_path), env=_env(), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    try:
        _wait_files([tmp_path / "ready0", tmp_path / "ready1"])
        proc.send_signal(sig)
        out, err = proc.communicate(timeout=30)
    finally:
        proc.kill()
        proc.wait(10)
    assert proc.returncode == 128 + sig, err
    assert [(tmp_path / f"got{r}").read_text() for r in range(2)] == [sig.name] * 2
    _assert_all_gone(_pids(tmp_path))


@pytest.mark.timeout(60)
@pytest.mark.parametrize("sig", [signal.SIGUSR1, signal.SIGUSR2])
def test_user_signals_go_only_to_the_ranks_that_handle_them(tmp_path, sig):
    # SIGUSR1 went to every rank's process group: a rank without a handler (pycoll's dump signal is off by default)
    # was killed by it, and the job with it
    script = _script(tmp_path, WRITE_PID, f"""
        import signal
        if RANK == 0:
            signal.signal(signal.{sig.name}, lambda s, f: write("got0", "{sig.name}"))
        write(f"ready{{RANK}}", "1")
        deadline = time.monotonic() + 30
        while not os.path.exists("got0") and time.monotonic() < deadline:
            time.sleep(0.01)
        time.sleep(0.2)
        write(f"done{{RANK}}", "1")
    """)
    proc = subprocess.Popen(_cmd(["-n", "2", script]), cwd=str(tmp_path), env=_env(), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    try:
        _wait_files([tmp_path / "ready0", tmp_path / "ready1"])
        proc.send_signal(sig)
        out, err = proc.communicate(timeout=40)
    finally:
        proc.kill()
        proc.wait(10)
    assert proc.returncode == 0, err
    assert (tmp_path / "got0").read_text() == sig.name and (tmp_path / "done1").exists()
    assert "not forwarded to rank 1, which does not handle it" in err, err
    # the advice names the signal received (it said PYCOLL_FR_DUMP_SIGNAL=1, SIGUSR1, for a SIGUSR2 too)
    assert f"PYCOLL_FR_DUMP_SIGNAL={sig.name} makes it" in err, err
    _assert_all_gone(_pids(tmp_path))


def test_job_timeout(tmp_path):
    script = _script(tmp_path, WRITE_PID, "time.sleep(300)\n")
    res = launch(["-n", "2", "--timeout", "1", script], tmp_path)
    assert res.returncode == 124
    assert "exceeded --timeout" in res.stderr
    _assert_all_gone(_pids(tmp_path))


@pytest.mark.parametrize("args, message", [
    (["-n", "2", "missing.py"], "no such script"),
    (["-n", "2"], "no target given: a script"),  # it said "required: target, args", args being optional
    (["-n", "2", "."], "is a folder without a __main__.py"),
    (["-n", "0", "x.py"], "-n must be at least 1"),
    (["--nnodes", "2", "--node-rank", "2", "--master-addr", "h", "x.py"], "--node-rank must be in"),
    (["--nnodes", "2", "x.py"], "--master-addr is required"),
    (["-m", "--no-python", "x"], "exclude each other"),
    (["--no-python", "surely-not-a-command-xyz"], "cannot find executable"),
    # durations as everywhere in pycoll (README: finite, at most 1e9 s); --timeout and --grace took inf and 2e9
    (["--timeout", "inf", "x.py"], "--timeout must be a finite number of seconds, got inf"),
    (["--grace", "2e9", "x.py"], "--grace must be at most 1e+09 seconds"),
    (["--grace", "-1", "x.py"], "--grace must be >= 0 seconds"),
    (["--join-timeout", "0", "x.py"], "--join-timeout must be > 0 seconds"),
])
def test_usage_errors(tmp_path, args, message):
    (tmp_path / "x.py").write_text("")
    res = launch(args, tmp_path, timeout=30)
    assert res.returncode == 2
    assert message in res.stderr


def test_a_folder_with_a_main_runs_as_python_runs_it(tmp_path):
    (tmp_path / "app").mkdir()
    (tmp_path / "app" / "__main__.py").write_text(
        "import os, sys; print('app', os.environ['PYCOLL_RANK'], sys.argv[1:])")
    res = launch(["-n", "2", "app", "--x"], tmp_path, timeout=30)
    assert res.returncode == 0, res.stderr
    assert sorted(res.stdout.splitlines()) == ["[rank0]: app 0 ['--x']", "[rank1]: app 1 ['--x']"]


def test_multi_node_needs_a_shared_token(tmp_path):
    script = _script(tmp_path, "")
    res = launch(["--nnodes", "2", "--node-rank", "0", "--master-addr", "127.0.0.1", "--master-port", "1", script],
                 tmp_path, timeout=30)
    assert res.returncode != 0 and "PYCOLL_STORE_TOKEN must be set" in res.stderr


def _free_port() -> int:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


MULTI_NODE = """
import os, sys, time
from pycoll.env import discover, open_store
info = discover()
store = open_store(timeout=30)
store.set(f"rank{info.rank}", str(info.node_rank))
store.set(f"run{info.rank}", os.environ["PYCOLL_RUN_ID"])
values = store.multi_get([f"rank{r}" for r in range(info.world_size)], timeout=30)
runs = {v.decode() for v in store.multi_get([f"run{r}" for r in range(info.world_size)], timeout=30)}
print(info.rank, info.local_rank, info.node_rank, info.nnodes, [v.decode() for v in values], len(runs))
if FAIL and info.rank == 3:
    sys.exit(4)
if FAIL:
    time.sleep(300)
"""


@pytest.mark.timeout(90)
@pytest.mark.parametrize("fail", [False, True])
def test_two_nodes_on_one_machine(tmp_path, fail):
    script = _script(tmp_path, f"FAIL = {fail}", MULTI_NODE)
    port = _free_port()
    env = _env({"PYCOLL_STORE_TOKEN": "shared-secret"})
    procs = []
    try:
        for node in (1, 0):  # node 1 first: its launcher must wait for node 0's store
            args = ["-n", "2", "--nnodes", "2", "--node-rank", str(node), "--master-addr", "127.0.0.1",
                    "--master-port", str(port), script]
            procs.append(subprocess.Popen(_cmd(args), cwd=str(tmp_path), env=env, stdout=subprocess.PIPE,
                                          stderr=subprocess.PIPE, text=True))
        outs = [p.communicate(timeout=75) for p in procs]
    finally:
        for p in procs:
            p.kill()
            p.wait(10)
    codes = [p.returncode for p in procs]
    lines = sorted(line for out, _ in outs for line in out.splitlines())
    # one run id on every node (the job's dumps in one folder)
    expected = [f"[rank{r}]: {r} {r % 2} {r // 2} 2 ['0', '0', '1', '1'] 1" for r in range(4)]
    assert lines == expected, outs
    if fail:
        assert codes == [4, 4], outs
        assert "node 1 stopped the job (rank 3 exited with code 4)" in outs[1][1]
    else:
        assert codes == [0, 0], outs


FLOOD = """
line = "x" * 99 + "\\n"
while True:
    sys.stdout.write(line * 100)
"""


@pytest.mark.timeout(30)
@pytest.mark.parametrize("stop", ["timeout", "sigterm"])
def test_a_reader_that_does_not_read_holds_up_neither_timeout_nor_signals(tmp_path, stop):
    """The launcher's stdout is a pipe nobody reads: --timeout and SIGTERM still end the job at once, and what could
    not be written is dropped with a note."""
    script = _script(tmp_path, WRITE_PID, FLOOD)
    args = ["-n", "1", "--timeout", "1", script] if stop == "timeout" else ["-n", "1", script]
    with open(tmp_path / "err", "w") as err:
        proc = subprocess.Popen(_cmd(args), cwd=str(tmp_path), env=_env(), stdout=subprocess.PIPE, stderr=err)
    try:
        if stop == "sigterm":
            _wait_files([tmp_path / "pid0"])
            time.sleep(0.3)  # the pipe and the launcher's queue fill in a few ms
            proc.send_signal(signal.SIGTERM)
        t0 = time.monotonic()
        code = proc.wait(timeout=10)
        took = time.monotonic() - t0
    finally:
        proc.kill()
        proc.wait(10)
        assert proc.stdout is not None
        proc.stdout.close()
    err_text = (tmp_path / "err").read_text()
    assert code == (124 if stop == "timeout" else 128 + signal.SIGTERM), err_text
    assert took < 5, took
    assert re.search(r"dropped \d+ bytes of output to stdout: nothing read it", err_text), err_text
    _assert_all_gone(_pids(tmp_path))


@pytest.mark.skipif(not os.path.exists("/dev/full"), reason="needs /dev/full")
def test_output_lost_to_a_write_error_is_said_and_fails_the_job(tmp_path):
    """stdout on a full disk (/dev/full): the ranks' lines were dropped without a word and the job exited 0. Now the
    loss is said on stderr and the exit status is 1 (a rank's own failure keeps its code); a reader gone (`| head`)
    is still no error."""
    script = _script(tmp_path, WRITE_PID, """
        print("line of rank", RANK)
        sys.exit(3 if RANK == 1 and len(sys.argv) > 1 else 0)
    """)
    for args, code in (([], 1), (["fail"], 3)):
        with open("/dev/full", "w") as full:
            res = subprocess.run(_cmd(["-n", "2", script, *args]), stdout=full, stderr=subprocess.PIPE, text=True,
                                 timeout=60, env=_env(), cwd=str(tmp_path))
        assert res.returncode == code, res.stderr
        assert re.search(r"writing the output to stdout failed \(No space left on device\): dropped \d+ bytes",
                         res.stderr), res.stderr
    proc = subprocess.Popen(_cmd(["-n", "2", script]), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=_env(), cwd=str(tmp_path))
    assert proc.stdout is not None
    proc.stdout.close()  # the reader went away before the first line
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 0 and "failed" not in err, err


def test_a_slow_reader_loses_no_line(tmp_path):
    """Output the launcher's stdout takes slowly holds up the ranks'
    pipes (once it took none for 0.3 s), without losing or mixing a line."""
    script = _script(tmp_path, """
        import os, sys
        r = int(os.environ["PYCOLL_RANK"])
        for i in range(6000):
            sys.stdout.write(f"{r} {i} " + "y" * 200 + "\\n")
    """)
    slow = {"PYCOLL_FAILPOINTS": "launch.output.write.stdout=sleep(300)@1"}
    res = launch(["-v", "-n", "2", script], tmp_path, env=slow)
    assert res.returncode == 0, res.stderr[-2000:]
    assert "the reader of stdout is behind" in res.stderr
    seen: Dict[int, List[int]] = {0: [], 1: []}
    for line in res.stdout.splitlines():
        m = re.fullmatch(r"\[rank(\d)\]: (\d) (\d+) y{200}", line)
        assert m and m.group(1) == m.group(2), f"mangled line: {line[:120]!r}"
        seen[int(m.group(1))].append(int(m.group(3)))
    assert seen == {0: list(range(6000)), 1: list(range(6000))}


def test_ranks_get_torchruns_variables_not_an_outer_jobs(tmp_path):
    """Stale torchrun variables of an outer job are replaced (or removed); MASTER_PORT is left as given."""
    script = _script(tmp_path, """
        import os
        names = ["RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK", "GROUP_WORLD_SIZE",
                 "MASTER_ADDR", "MASTER_PORT", "ROLE_RANK", "TORCHELASTIC_USE_AGENT_STORE"]
        print(" ".join(f"{n}={os.environ.get(n)}" for n in names))
    """)
    outer = {"RANK": "7", "WORLD_SIZE": "9", "LOCAL_RANK": "3", "LOCAL_WORLD_SIZE": "4", "GROUP_RANK": "2",
             "GROUP_WORLD_SIZE": "3", "MASTER_ADDR": "10.9.9.9", "MASTER_PORT": "1234", "ROLE_RANK": "7",
             "TORCHELASTIC_USE_AGENT_STORE": "True"}
    res = launch(["-n", "2", script], tmp_path, env=outer)
    assert res.returncode == 0, res.stderr
    assert sorted(res.stdout.splitlines()) == [
        f"[rank{r}]: RANK={r} WORLD_SIZE=2 LOCAL_RANK={r} LOCAL_WORLD_SIZE=2 GROUP_RANK=0 GROUP_WORLD_SIZE=1 "
        f"MASTER_ADDR=127.0.0.1 MASTER_PORT=1234 ROLE_RANK=None TORCHELASTIC_USE_AGENT_STORE=None" for r in range(2)]


# -- multi-node: joining, timeouts, stopping -----------------------------------------------------------------------


def _node(tmp_path: Path, node: int, port: int, script: str, *extra: str, argv: List[str] = (), name: str = "",
          env: Optional[Dict[str, str]] = None) -> subprocess.Popen:
    """Start node ``node``'s launcher (-n 1, two nodes; ``extra``: its options, ``argv``: the script's arguments);
    its stderr goes to the file err<node><name>."""
    args = ["-n", "1", "--nnodes", "2", "--node-rank", str(node), "--master-addr", "127.0.0.1", "--master-port",
            str(port), *extra, script, *argv]
    with open(tmp_path / f"err{node}{name}", "w") as err:
        return subprocess.Popen(_cmd(args), cwd=str(tmp_path), env=_env({"PYCOLL_STORE_TOKEN": "t", **(env or {})}),
                                stdout=subprocess.DEVNULL, stderr=err)


def _end(procs: List[subprocess.Popen]) -> None:
    for p in procs:
        p.kill()
        p.wait(10)


def _wait_text(path: Path, text: str, timeout: float = 20) -> None:
    deadline = time.monotonic() + timeout
    while not (path.exists() and text in path.read_text()):
        assert time.monotonic() < deadline, f"{text!r} not in {path}: {path.read_text() if path.exists() else ''}"
        time.sleep(0.02)


@pytest.mark.timeout(30)
@pytest.mark.parametrize("end", ["SIGINT", "SIGTERM", "join-timeout"])
def test_a_node_waiting_for_node_0_says_so_and_ends_on_a_signal_or_its_join_timeout(tmp_path, end):
    script = _script(tmp_path, "")
    port = _free_port()
    trace = tmp_path / "trace"
    proc = _node(tmp_path, 1, port, script, "--join-timeout", "0.5" if end == "join-timeout" else "60",
                 env={"PYCOLL_FAILPOINTS": f"launch.store.wait=note;trace={trace}"})
    try:
        _wait_text(tmp_path / "err1", f"waiting for node 0's store at 127.0.0.1:{port} (up to")
        assert trace.read_text().startswith("launch.store.wait note")
        t0 = time.monotonic()
        if end != "join-timeout":
            proc.send_signal(getattr(signal, end))
        code = proc.wait(10)
        took = time.monotonic() - t0
    finally:
        _end([proc])
    err = (tmp_path / "err1").read_text()
    if end == "join-timeout":
        assert code == 1 and f"node 0's store at 127.0.0.1:{port} did not answer within 0.5 s (--join-timeout)" in err
    else:
        assert code == 128 + getattr(signal, end), err
        assert took < 3 and f"received {end} before any rank started; exiting" in err, (took, err)


SLEEPER = WRITE_PID + "time.sleep(float(sys.argv[1]))\n"


@pytest.mark.timeout(30)
def test_a_timeout_stops_every_node_and_node_0_waits_for_the_others_no_longer_than_the_grace(tmp_path):
    """Node 0's --timeout stops node 1 too (through the store). Node 1's launcher is stopped (SIGSTOP) as it learns
    of it: node 0 still exits once --grace and 2 s have passed; continued, node 1 exits with 124 too."""
    script = _script(tmp_path, SLEEPER)
    port = _free_port()
    trace = tmp_path / "trace"
    procs = [_node(tmp_path, 0, port, script, "--timeout", "0.8", "--grace", "0.2", argv=["30"]),
             _node(tmp_path, 1, port, script, argv=["30"],
                   env={"PYCOLL_FAILPOINTS": f"launch.abort.receive=stop;trace={trace}"})]
    try:
        t0 = time.monotonic()
        code0 = procs[0].wait(15)
        took = time.monotonic() - t0
        assert trace.exists() and "launch.abort.receive stop" in trace.read_text()
        os.kill(procs[1].pid, signal.SIGCONT)
        code1 = procs[1].wait(10)
    finally:
        _end(procs)
    err0, err1 = (tmp_path / "err0").read_text(), (tmp_path / "err1").read_text()
    assert code0 == 124 and took < 6, (took, err0)
    assert "node 1 did not finish within 2.2 s of the job's stop" in err0
    assert code1 == 124, err1
    assert "node 0 stopped the job (it exceeded --timeout 0.8 s; exit code 124)" in err1
    _assert_all_gone(_pids(tmp_path))


@pytest.mark.timeout(30)
@pytest.mark.parametrize("ranks", ["running", "done"])
def test_a_node_that_never_joins_fails_the_job(tmp_path, ranks):
    """Node 1's launcher dies as it reaches node 0's store, before it joins: node 0 fails the job after
    --join-timeout, whether its ranks still run then (it stops them) or are done."""
    script = _script(tmp_path, SLEEPER)
    port = _free_port()
    trace = tmp_path / "trace"
    kill = {"PYCOLL_FAILPOINTS": f"launch.node.join=kill;trace={trace}"}
    procs = [_node(tmp_path, 1, port, script, argv=["30"], env=kill),
             _node(tmp_path, 0, port, script, "--join-timeout", "0.8", argv=["30" if ranks == "running" else "0"])]
    try:
        codes = [p.wait(15) for p in procs]
    finally:
        _end(procs)
    err0 = (tmp_path / "err0").read_text()
    assert codes == [-signal.SIGKILL, 1], err0
    assert trace.read_text().startswith("launch.node.join kill")
    if ranks == "running":
        assert "node 1 never joined within 0.8 s (--join-timeout); stopping the job" in err0
    else:
        assert "the job failed: node 1 never joined within 0.8 s (--join-timeout)" in err0
    _assert_all_gone(_pids(tmp_path))


@pytest.mark.timeout(30)
def test_a_node_rank_joined_twice_is_refused(tmp_path):
    script = _script(tmp_path, WRITE_PID, """
        end = time.monotonic() + 20
        while not os.path.exists("go") and time.monotonic() < end:
            time.sleep(0.02)
    """)
    port = _free_port()
    procs = [_node(tmp_path, 0, port, script), _node(tmp_path, 1, port, script)]
    try:
        _wait_files([tmp_path / "pid1"])  # node 1 joined and started its rank
        procs.append(_node(tmp_path, 1, port, script, name="again"))
        code = procs[2].wait(10)
        (tmp_path / "go").write_text("1")
        codes = [p.wait(10) for p in procs[:2]]
    finally:
        _end(procs)
    err = (tmp_path / "err1again").read_text()
    assert code == 1 and re.search(r"node rank 1 joined twice: the launcher on \S+ \(pid \d+\) joined as node 1 first",
                                   err), err
    assert codes == [0, 0]
    _assert_all_gone(_pids(tmp_path))


@pytest.mark.timeout(30)
@pytest.mark.parametrize("node, sig", [(1, signal.SIGTERM), (0, signal.SIGINT)])
def test_a_signal_to_any_nodes_launcher_stops_every_node(tmp_path, node, sig):
    """SIGTERM to node 1's launcher (SIGINT to node 0's) stops the whole job at once: every launcher exits with
    128+N, and the other node says which node was signalled."""
    script = _script(tmp_path, SLEEPER)
    port = _free_port()
    procs = [_node(tmp_path, 0, port, script, "--timeout", "20", argv=["30"]), _node(tmp_path, 1, port, script,
                                                                                  argv=["30"])]
    try:
        _wait_files([tmp_path / "pid0", tmp_path / "pid1"])
        procs[node].send_signal(sig)
        codes = [p.wait(10) for p in procs]
    finally:
        _end(procs)
    errs = [(tmp_path / f"err{i}").read_text() for i in (0, 1)]
    assert codes == [128 + sig] * 2, errs
    assert f"received {sig.name}; forwarding it to the ranks and stopping the job on every node" in errs[node]
    assert (f"node {node} stopped the job (its launcher received {sig.name}; exit code {128 + sig}); stopping this "
            f"node's ranks") in errs[1 - node], errs
    _assert_all_gone(_pids(tmp_path))


# rank 0 (node 0) ends at once with 0, rank 1 (node 1) after argv[1] s with argv[2]
ENDS = WRITE_PID + "if RANK == 1:\n    time.sleep(float(sys.argv[1]))\n    sys.exit(int(sys.argv[2]))\n"


@pytest.mark.timeout(40)
@pytest.mark.parametrize("how", ["rank", "signal"])
def test_node_0_whose_ranks_ended_exits_with_the_jobs_status(tmp_path, how):
    """Node 0's ranks end with 0 and it waits for node 1 to finish; then node 1's rank fails (or node 0's launcher is
    sent SIGTERM): every launcher exits with that status (node 0 exited 0, and waited out the other node)."""
    script = _script(tmp_path, ENDS)
    port = _free_port()
    procs = [_node(tmp_path, 0, port, script, argv=["1.5" if how == "rank" else "30", "7"]),
             _node(tmp_path, 1, port, script, argv=["1.5" if how == "rank" else "30", "7"])]
    try:
        _wait_files([tmp_path / "pid0", tmp_path / "pid1"])
        if how == "signal":
            _wait_text(tmp_path / "err0", "waiting for nodes [1] to finish")
            procs[0].send_signal(signal.SIGTERM)
        t0 = time.monotonic()
        codes = [p.wait(20) for p in procs]
        took = time.monotonic() - t0
    finally:
        _end(procs)
    errs = [(tmp_path / f"err{i}").read_text() for i in (0, 1)]
    assert codes == ([7, 7] if how == "rank" else [143, 143]), errs
    assert took < 8, (took, errs)


# each rank ends after argv[1 + 2*RANK] s with argv[2 + 2*RANK]
ENDS_EACH = WRITE_PID + "time.sleep(float(sys.argv[1 + 2 * RANK]))\nsys.exit(int(sys.argv[2 + 2 * RANK]))\n"


@pytest.mark.timeout(60)
@pytest.mark.parametrize("ends,keep_going,codes", [
    (["1.5", "5", "0", "0"], False, [5, 5]),  # node 0's rank fails after node 1's ended: node 1 exited 0
    (["0", "5", "0", "0"], True, [5, 5]),  # --keep-going: each node counted its own ranks only
    (["1", "5", "0", "3"], True, [3, 3]),  # --keep-going, both fail: the earliest failure's (node 0 said 5)
])
def test_every_nodes_launcher_exits_with_the_jobs_status(tmp_path, ends, keep_going, codes):
    script = _script(tmp_path, ENDS_EACH)
    port = _free_port()
    extra = ["--keep-going"] if keep_going else []
    procs = [_node(tmp_path, node, port, script, *extra, argv=ends) for node in (0, 1)]
    try:
        got = [p.wait(30) for p in procs]
    finally:
        _end(procs)
    assert got == codes, "\n".join((tmp_path / f"err{i}").read_text() for i in (0, 1))


@pytest.mark.timeout(30)
def test_a_node_given_other_nnodes_or_n_than_node_0_is_refused(tmp_path):
    """Node 1 with -n 2 where node 0 has -n 1: its ranks would take numbers node 0's have, with another world size."""
    script = _script(tmp_path, SLEEPER)
    port = _free_port()
    procs = [_node(tmp_path, 0, port, script, "--join-timeout", "1.5", argv=["30"])]
    args = ["-n", "2", "--nnodes", "2", "--node-rank", "1", "--master-addr", "127.0.0.1", "--master-port", str(port),
            script, "30"]
    try:
        res = subprocess.run(_cmd(args), cwd=str(tmp_path), env=_env({"PYCOLL_STORE_TOKEN": "t"}),
                             capture_output=True, text=True, timeout=20)
        code0 = procs[0].wait(20)
    finally:
        _end(procs)
    assert res.returncode == 1 and ("node 1 was started with --nnodes 2 -n 2 but node 0 with --nnodes 2 -n 1: give "
                                    "every node's launcher the same") in res.stderr, res.stderr
    assert code0 == 1 and "node 1 never joined within 1.5 s" in (tmp_path / "err0").read_text()


@pytest.mark.timeout(30)
def test_a_blank_store_token_is_refused_by_the_launcher(tmp_path):
    # it was taken, and every rank then refused it as unset ("pycoll-run sets it for every rank")
    script = _script(tmp_path, SLEEPER)
    args = ["-n", "1", "--nnodes", "2", "--node-rank", "0", "--master-addr", "127.0.0.1", "--master-port",
            str(_free_port()), script, "1"]
    res = subprocess.run(_cmd(args), cwd=str(tmp_path), env=_env({"PYCOLL_STORE_TOKEN": "  "}), capture_output=True,
                         text=True, timeout=20)
    assert res.returncode != 0 and "PYCOLL_STORE_TOKEN must be set" in res.stderr and "(it is blank)" in res.stderr, \
        res.stderr


@pytest.mark.slow
@pytest.mark.timeout(90)
def test_a_node_whose_launcher_dies_fails_the_job_after_its_heartbeats_stop(tmp_path):
    """Node 1's launcher is SIGKILLed while the ranks run (they exchange nothing): node 0 stops the job once node 1
    sent no heartbeat for 30 s, and exits 1 (it let its rank run on, then exited 0)."""
    script = _script(tmp_path, SLEEPER)
    port = _free_port()
    procs = [_node(tmp_path, 0, port, script, argv=["70"]), _node(tmp_path, 1, port, script, argv=["70"])]
    try:
        _wait_files([tmp_path / "pid0", tmp_path / "pid1"])
        procs[1].kill()
        t0 = time.monotonic()
        code0 = procs[0].wait(60)
        took = time.monotonic() - t0
    finally:
        _end(procs)
        for pid in _pids(tmp_path):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
    err = (tmp_path / "err0").read_text()
    assert code0 == 1 and "node 1 sent no heartbeat for 30 s (its launcher is gone or hangs); stopping the job" in err
    assert 28 < took < 45, took


# -- the launcher's failpoints: killed or stopped there, the job still ends as documented ---------------------------


def _fired(trace: Path, name: str, timeout: float = 20) -> None:
    _wait_text(trace, f"{name} ", timeout)


@pytest.mark.timeout(30)
@pytest.mark.parametrize("action", ["kill", "stop"])
def test_a_launcher_killed_or_stopped_as_it_tells_the_other_nodes(tmp_path, action):
    """kill: node 0's launcher dies as it tells node 1 of its --timeout: its rank dies with it, node 1 loses the store
    and stops its rank (exit 1). stop: node 1's launcher, signalled, has forwarded the signal to its rank and stops
    before it tells node 0, which runs on; continued, it tells, and both exit 128+SIGTERM."""
    script = _script(tmp_path, SLEEPER)
    port = _free_port()
    trace = tmp_path / "trace"
    fp = {"PYCOLL_FAILPOINTS": f"launch.abort.send={action};trace={trace}"}
    if action == "kill":
        procs = [_node(tmp_path, 0, port, script, "--timeout", "0.5", argv=["30"], env=fp),
                 _node(tmp_path, 1, port, script, argv=["30"])]
    else:
        procs = [_node(tmp_path, 0, port, script, argv=["30"]), _node(tmp_path, 1, port, script, argv=["30"], env=fp)]
    try:
        if action == "stop":
            _wait_files([tmp_path / "pid0", tmp_path / "pid1"])
            procs[1].send_signal(signal.SIGTERM)
            _fired(trace, "launch.abort.send stop")
            _assert_all_gone(_pids(tmp_path, "pid1"))  # the signal reached node 1's rank before the failpoint
            assert procs[0].poll() is None and _alive(_pids(tmp_path, "pid0")[0])  # node 0 not told yet
            os.kill(procs[1].pid, signal.SIGCONT)
        codes = [p.wait(10) for p in procs]
    finally:
        _end(procs)
    errs = [(tmp_path / f"err{i}").read_text() for i in (0, 1)]
    _fired(trace, f"launch.abort.send {action}", 0)
    if action == "kill":
        assert codes == [-signal.SIGKILL, 1], errs
        assert "lost the job's store (node 0's store:" in errs[1]
    else:
        assert codes == [128 + signal.SIGTERM] * 2, errs
        assert "node 1 stopped the job (its launcher received SIGTERM; exit code 143)" in errs[0]
    _assert_all_gone(_pids(tmp_path))


@pytest.mark.timeout(30)
def test_node_0_killed_while_it_waits_for_the_other_nodes_to_finish(tmp_path):
    """Node 0's rank is done and its launcher dies as it waits for node 1 to finish: node 1 loses the store, stops its
    rank and exits 1; no rank is left."""
    script = _script(tmp_path, WRITE_PID, """
        while RANK == 0 and not os.path.exists("pid1"):  # node 0's rank ends once node 1 has joined
            time.sleep(0.01)
        time.sleep(0 if RANK == 0 else 30)
    """)
    port = _free_port()
    trace = tmp_path / "trace"
    procs = [_node(tmp_path, 0, port, script, env={"PYCOLL_FAILPOINTS": f"launch.nodes.finish=kill;trace={trace}"}),
             _node(tmp_path, 1, port, script)]
    try:
        codes = [p.wait(10) for p in procs]
    finally:
        _end(procs)
    err1 = (tmp_path / "err1").read_text()
    _fired(trace, "launch.nodes.finish kill", 0)
    assert codes == [-signal.SIGKILL, 1], err1
    assert "lost the job's store (node 0's store:" in err1
    _assert_all_gone(_pids(tmp_path))


@pytest.mark.timeout(30)
@pytest.mark.parametrize("action", ["kill", "stop"])
def test_a_launcher_killed_or_stopped_as_it_flushes_its_output_at_exit(tmp_path, action):
    """The ranks are done and their output still queued (a slow reader) when the launcher exits. kill: it dies there,
    and no rank outlives it. stop: continued, it writes every line and exits with the job's status."""
    script = _script(tmp_path, WRITE_PID, """
        for i in range(200):
            print(RANK, i)
        sys.exit(RANK)
    """)
    trace = tmp_path / "trace"
    fp = f"launch.output.write.stdout=sleep(300)@1,launch.output.flush={action};trace={trace}"
    proc = subprocess.Popen(_cmd(["-n", "2", "--keep-going", script]), cwd=str(tmp_path), env=_env(
        {"PYCOLL_FAILPOINTS": fp}), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        if action == "stop":
            _fired(trace, "launch.output.flush stop")
            os.kill(proc.pid, signal.SIGCONT)
        out, err = proc.communicate(timeout=20)
    finally:
        proc.kill()
        proc.wait(10)
    _fired(trace, f"launch.output.flush {action}", 0)
    if action == "kill":
        assert proc.returncode == -signal.SIGKILL, err
    else:
        assert proc.returncode == 1, err  # rank 1's exit code, neither replaced nor marked lost
        assert sorted(out.splitlines()) == sorted(f"[rank{r}]: {r} {i}" for r in range(2) for i in range(200))
    _assert_all_gone(_pids(tmp_path))


def _stop_node_0(tmp_path: Path, proc: subprocess.Popen) -> int:
    """SIGTERM node 0's launcher, and if it then waits for node 1 to finish, a second one (it waits no longer)."""
    proc.send_signal(signal.SIGTERM)
    deadline = time.monotonic() + 10
    while proc.poll() is None and "waiting for nodes [1] to finish" not in (tmp_path / "err0").read_text():
        assert time.monotonic() < deadline, (tmp_path / "err0").read_text()
        time.sleep(0.02)
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
    return proc.wait(10)


@pytest.mark.timeout(30)
@pytest.mark.parametrize("how", ["killed", "finished"])
def test_a_restarted_node_is_told_it_already_ran(tmp_path, how):
    """Node 1's launcher is killed (or finished), then started again in the same job: refused, not as a node rank
    joined twice, but as a node that already ran, which the running job cannot take; node 0 goes on."""
    script = _script(tmp_path, WRITE_PID, "time.sleep(30 if RANK == 0 or not os.path.exists('quick') else 0)\n")
    if how == "finished":
        (tmp_path / "quick").write_text("1")
    port = _free_port()
    procs = [_node(tmp_path, 0, port, script, "--grace", "0.2"), _node(tmp_path, 1, port, script)]
    try:
        _wait_files([tmp_path / "pid0", tmp_path / "pid1"])
        if how == "killed":
            procs[1].kill()
            assert procs[1].wait(10) == -signal.SIGKILL
        else:  # its ranks ended: it waits for node 0's verdict on the job, to exit with it
            _wait_text(tmp_path / "err1", "waiting for node 0's verdict on the job")
        first = procs[1].pid
        procs.append(_node(tmp_path, 1, port, script, name="again"))
        code = procs[2].wait(10)
        assert procs[0].poll() is None  # node 0's rank runs on
        code0 = _stop_node_0(tmp_path, procs[0])
        code1 = procs[1].wait(10)
    finally:
        _end(procs)
    err = (tmp_path / "err1again").read_text()
    gone = "is gone (its process exited)" if how == "killed" else "finished (exit code 0)"
    assert code == 1 and re.search(rf"node rank 1 already ran in this job: the launcher on \S+ \(pid {first}\) joined "
                                   rf"as node 1 and {re.escape(gone)}\. A running job cannot take a restarted node",
                                   err), err
    assert "joined twice" not in err and code0 == 128 + signal.SIGTERM
    if how == "finished":
        assert code1 == 128 + signal.SIGTERM, (tmp_path / "err1").read_text()  # the job's status, node 0's verdict
    _assert_all_gone(_pids(tmp_path))


@pytest.mark.timeout(30)
@pytest.mark.parametrize("action", ["note", "kill"])
def test_a_node_rank_joined_from_another_host_is_judged_by_its_heartbeats(tmp_path, action):
    """Node 1's rank was joined by a launcher on another host (written here into node 0's store): the second launcher
    watches that one's heartbeats. note: a heartbeat comes, so it runs: "joined twice". kill: the launcher dies at
    launch.node.rejoin, having started no rank; node 0 goes on."""
    script = _script(tmp_path, SLEEPER)
    port = _free_port()
    trace = tmp_path / "trace"
    procs = [_node(tmp_path, 0, port, script, "--grace", "0.2", argv=["30"])]
    try:
        _wait_files([tmp_path / "pid0"])
        store = pycoll.TCPStore("127.0.0.1", port, "t", timeout=10)
        store.set("pycoll-run/node/1/joined", "0123 elsewhere 4242 another-boot 17")
        procs.append(_node(tmp_path, 1, port, script, argv=["30"],
                           env={"PYCOLL_FAILPOINTS": f"launch.node.rejoin={action};trace={trace}"}))
        _fired(trace, f"launch.node.rejoin {action}")
        store.add("pycoll-run/node/1/heartbeat", 1)
        code = procs[1].wait(10)
        store.close()
        code0 = _stop_node_0(tmp_path, procs[0])
    finally:
        _end(procs)
    err = (tmp_path / "err1").read_text()
    if action == "kill":
        assert code == -signal.SIGKILL and not (tmp_path / "pid1").exists(), err
    else:
        assert code == 1 and ("node rank 1 joined twice: the launcher on elsewhere (pid 4242) joined as node 1 first "
                              "and is running") in err, err
    assert code0 == 128 + signal.SIGTERM
    _assert_all_gone(_pids(tmp_path))


def test_main_called_from_a_program_leaves_its_logging_as_it_was(tmp_path):
    """pycoll.run.main() left the 'pycoll' logger at INFO (later INFO records reached the program's handlers) and its
    lines came twice, once through the program's root handler."""
    script = _script(tmp_path, "import sys\nsys.exit(3)\n")
    code = (f"import logging, pycoll.run\nlogging.basicConfig(level=logging.WARNING, format='ROOT %(message)s')\n"
            f"logging.getLogger('pycoll').setLevel(logging.ERROR)\n"
            f"rc = pycoll.run.main(['-n', '1', {script!r}])\n"
            f"lg = logging.getLogger('pycoll')\nprint('after', rc, lg.level, lg.propagate)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert "after 3 40 True" in out.stdout, out
    assert "ROOT" not in out.stderr and out.stderr.count("rank 0 exited with code 3") == 1, out.stderr
