"""The comparison and overhead harnesses in benchmarks/ still run and still check results.

Tiny sizes and iteration counts: these tests look at what the harnesses produce, never at speed.
"""

from __future__ import annotations

import itertools
import json
import os
import re
import shutil
import subprocess
import sys
import time

import pytest
from helpers import REPO, mpi_ready

import pycoll
from pycoll._procs import stat_fields

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(pycoll.__file__)))


def _run(script, args, timeout=100):
    env = dict(os.environ)
    env["PYTHONPATH"] = ROOT + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    for var in ("PYCOLL_RANK", "PYCOLL_WORLD_SIZE"):
        env.pop(var, None)
    return subprocess.run([sys.executable, os.path.join(REPO, "benchmarks", script), *args], env=env,
                          capture_output=True, text=True, timeout=timeout)


@pytest.mark.timeout(120)
def test_allreduce_compare_runs_and_checks(tmp_path):
    libs = "copy,pycoll" + (",mpi" if mpi_ready() else "")
    out = tmp_path / "c.json"
    res = _run("allreduce_compare.py", ["--ranks", "2", "--sizes", "8,4K,256K", "--scale", "0.05", "--only", libs,
                                        "--json", str(out), "--markdown", str(tmp_path / "c.md"), "--timeout", "60"])
    assert res.returncode == 0, res.stderr
    doc = json.loads(out.read_text())
    res2 = doc["results"]["2"]
    for key in ("pycoll_raw", "pycoll_comm"):
        rows = res2["pycoll"]["rows"][key]
        assert [r["size"] for r in rows] == [8, 4096, 256 << 10]
        assert all(r["wrong"] == 0 and r["time_us"] > 0 for r in rows), rows
    if "mpi" in libs:
        assert all(r["wrong"] == 0 for r in res2["mpi"]["rows"]["mpi"]), res2["mpi"]
    copy = res2["copy"]["rows"]
    for c in copy:
        assert c["algbw"] == pytest.approx(c["size"] / (c["copy_us"] * 1e3))
        assert c["copy_us"] == min(c["copy_us_by_method"].values()) and c["method"] in c["copy_us_by_method"]
        assert "numpy.copyto" in c["copy_us_by_method"]
        if shutil.which("gcc") or shutil.which("cc"):
            assert "memcpy" in c["copy_us_by_method"]
    assert "| 256 KiB |" in (tmp_path / "c.md").read_text()
    assert "64 MiB" not in res.stdout  # no target lines for sizes that were not run


@pytest.mark.timeout(120)
def test_window_collectives_runs_and_checks(tmp_path):
    libs = "copy,pycoll" + (",mpi" if mpi_ready() else "")
    out = tmp_path / "w.json"
    res = _run("window_collectives.py", ["--ranks", "2", "--sizes", "2M", "--scale", "0.1", "--repeat", "1", "--only",
                                         libs, "--json", str(out), "--markdown", str(tmp_path / "w.md"),
                                         "--timeout", "60"])
    assert res.returncode == 0, res.stdout + res.stderr
    res2 = json.loads(out.read_text())["results"]["2"]
    for op in ("broadcast", "all_gather", "reduce_scatter", "all_to_all", "reduce", "gather", "scatter"):
        for kind in ("private", "window"):
            (row,) = res2["pycoll"]["rows"][f"{op} {kind}"]
            assert row["wrong"] == 0 and row["time_us"] > 0, (op, kind, row)
        if "mpi" in libs:
            assert res2["mpi"]["rows"][f"{op} mpi"][0]["wrong"] == 0, res2["mpi"]
    # half a block, each rank's share of a broadcast's output; a gather's and a scatter's block; an all_gather's and
    # an all_to_all's output (2 blocks)
    assert [r["size"] for r in res2["copy"]["rows"]] == [1 << 20, 2 << 20, 4 << 20]
    md = (tmp_path / "w.md").read_text()
    assert md.count("| 2 MiB |") == 7 and "| reduce_scatter | 2 MiB |" in md and "| scatter | 2 MiB |" in md, md


@pytest.mark.timeout(120)
@pytest.mark.skipif(shutil.which("gcc") is None and shutil.which("cc") is None, reason="no C compiler")
def test_overhead_layers(tmp_path):
    out = tmp_path / "o.json"
    res = _run("overhead.py", ["--ranks", "1", "--batches", "3", "--batch", "20", "--warmup", "10", "--repeat", "1",
                               "--json", str(out)])
    assert res.returncode == 0, res.stderr
    ns = json.loads(out.read_text())["ns_per_call"]["1"]
    assert {"c_blocking", "c_nonblocking", "binding", "comm_numpy"} <= set(ns)
    assert all(v > 0 for v in ns.values())
    assert "Cython Library.all_reduce" in res.stdout


@pytest.mark.timeout(120)
def test_overhead_breakdown_reads_the_stages_of_the_path_itself(tmp_path):
    from pycoll._core import STAGES

    out = tmp_path / "b.json"
    res = _run("overhead.py", ["--breakdown", "--batches", "3", "--batch", "20", "--warmup", "10", "--json", str(out)])
    assert res.returncode == 0, res.stderr
    ns = json.loads(out.read_text())["breakdown_ns"]
    assert all(ns[k] > 0 for k in STAGES), ns
    assert ns["reference: bindings' Library.all_reduce alone"] > 0
    groups = [k for k in ns if k.startswith("group: ")]
    assert len(groups) == 4 and all(ns[k] > 0 for k in groups), ns
    assert ns["group: four all_reduce in a group"] > ns["group: `with comm.group(): pass`"], ns
    arguments = [k for k in ns if k.startswith("arguments: ")]
    assert len(arguments) == 9 and all(ns[k] > 0 for k in arguments), ns
    assert "library call" in res.stdout and "outside the stages" in res.stdout


@pytest.mark.timeout(120)
def test_small_ops_runs_and_checks(tmp_path):
    libs = "pycoll" + (",mpi" if mpi_ready() else "")
    out = tmp_path / "s.json"
    res = _run("small_ops.py", ["--ranks", "2", "--repeat", "1", "--scale", "0.02", "--only", libs,
                                "--json", str(out), "--markdown", str(tmp_path / "s.md"), "--timeout", "60"])
    assert res.returncode == 0, res.stdout + res.stderr
    assert "PROBLEM" not in res.stdout, res.stdout
    runs = json.loads(out.read_text())["2"]["pycoll"]
    rows = runs[0]["rows"]
    for v in ("bindings", "all_reduce numpy", "all_reduce torch", "all_reduce DLPack", "all_reduce async", "broadcast",
              "send/recv pair", "sendrecv", "group of 4 all_reduce", "send/recv pair async", "4 all_reduce async",
              "all_to_all", "gather", "scatter"):
        assert rows[v]["wrong"] == 0 and rows[v]["time_us"] > 0 and rows[v]["loop_us"] > 0, (v, rows.get(v))
    cpu = runs[0]["cpu"]  # the steady phase: % of one CPU, the busiest rank's
    assert set(cpu) == {"caller_pct", "threads_pct", "launcher_pct"}, cpu
    assert 1 < cpu["caller_pct"] <= 105 and 0 <= cpu["threads_pct"] < 100 and 0 <= cpu["launcher_pct"] < 100, cpu
    notes = runs[0]["notes"]  # each rank names its busiest other threads (pycoll's watchdog among them)
    assert sorted(n["rank"] for n in notes) == [0, 1], notes
    assert any(name.startswith("pycoll-watchdog") for n in notes for name, _ in n["threads"]), notes
    md = (tmp_path / "s.md").read_text()
    assert md.count("| group of 4 all_reduce |") == 2 and "back to back" in md, md
    assert "| the library's other threads |" in md and "| launcher (pycoll-run / prterun) |" in md, md


def _marked_processes(mark):
    """Pids of the processes whose command line holds ``mark`` (zombies have none: reaped or not, they are gone)."""
    pids = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                if mark.encode() in f.read():
                    pids.append(int(pid))
        except (FileNotFoundError, ProcessLookupError, PermissionError):
            pass
    return pids


def test_busy_load_runs_its_processes_and_reaps_them_however_the_block_ends(monkeypatch):
    """small_ops' --load: N busy processes while the block runs, none left after it, also when it raises."""
    monkeypatch.setattr(sys, "path", [os.path.join(REPO, "benchmarks"), *sys.path])  # undone after the test
    from small_ops import LOAD_MARK, busy_load

    with busy_load(0) as pids:
        assert pids == []
    def utime(pid):
        return int(stat_fields(pid)[11])

    with pytest.raises(RuntimeError, match="inside"), busy_load(2) as pids:
        assert len(pids) == 2
        deadline = time.monotonic() + 10
        while sorted(_marked_processes(LOAD_MARK)) != sorted(pids) and time.monotonic() < deadline:
            time.sleep(0.01)  # a child just started may show its command line a moment later
        assert sorted(_marked_processes(LOAD_MARK)) == sorted(pids)
        used = {p: utime(p) for p in pids}
        while time.monotonic() < deadline and any(utime(p) <= used[p] for p in pids):
            time.sleep(0.05)  # each one burns CPU: its utime grows
        assert time.monotonic() < deadline, "the busy processes used no CPU"
        raise RuntimeError("inside")
    assert _marked_processes(LOAD_MARK) == []
    for p in pids:
        assert not os.path.exists(f"/proc/{p}"), p  # reaped, not left a zombie


@pytest.mark.timeout(120)
def test_small_ops_under_load_says_so(tmp_path, monkeypatch):
    monkeypatch.setattr(sys, "path", [os.path.join(REPO, "benchmarks"), *sys.path])  # undone after the test
    from small_ops import LOAD_MARK

    out = tmp_path / "s.json"
    res = _run("small_ops.py", ["--ranks", "2", "--repeat", "1", "--scale", "0.02", "--only", "pycoll", "--load", "1",
                                "--json", str(out), "--markdown", str(tmp_path / "s.md"), "--timeout", "60"])
    assert res.returncode == 0, res.stdout + res.stderr
    assert "1 busy process running throughout (--load)" in res.stdout.splitlines()[0], res.stdout
    run = json.loads(out.read_text())["2"]["pycoll"][0]
    assert run["load"] == 1 and run["rows"]["all_reduce numpy"]["wrong"] == 0, run
    assert (tmp_path / "s.md").read_text().startswith("Under a load of 1 busy process (`--load 1`).")
    assert _marked_processes(LOAD_MARK) == []


@pytest.mark.parametrize("rounds", [1, 4])
def test_run_sizes_interleaves_the_variants_in_rounds(rounds, monkeypatch):
    """run_sizes(rounds=k): every variant checked and warmed first, then its timed calls and batches in k shares,
    the variants in turn; with 1 round each variant runs whole before the next is set up. Every iteration and
    every batch is timed exactly once either way."""
    monkeypatch.setattr(sys, "path", [os.path.join(REPO, "benchmarks"), *sys.path])  # undone after the test
    from allreduce_compare import run_sizes, schedule

    log = []

    def variant(name, wrong):
        def setup(count):
            log.append((name, "setup"))
            return (lambda: log.append((name, "call"))), (lambda: log.append((name, "check")) or wrong)
        return setup

    rows = run_sizes(0, 1, [8], 0.1, [("a", variant("a", 0)), ("b", variant("b", 3))], lambda: log.append("barrier"),
                     lambda ts: ts[None, :], batches=10, rounds=rounds)
    warm, iters = schedule(8, 0.1)
    per_batch = max(1, iters // 10)
    for name, wrong in (("a", 0), ("b", 3)):
        assert log.count((name, "call")) == warm + iters + 10 * per_batch
        (row,) = rows[name]
        assert row["wrong"] == wrong and row["iters"] == iters and row["time_us"] >= 0 and row["loop_us"] >= 0
    calls = [step[0] for step in log if step != "barrier" and step[1] == "call"]
    switches = sum(1 for x, y in itertools.pairwise(calls) if x != y)
    if rounds == 1:
        assert log.index(("b", "setup")) > max(i for i, step in enumerate(log) if step == ("a", "call"))
        assert switches == 1
    else:
        assert log.index(("b", "check")) < log.index("barrier")  # both set up and checked before any timing
        assert switches == 1 + 2 * rounds  # a warmed, then b; then a and b in turn in every round


def test_the_schedule_warms_up_past_the_host_librarys_store_trials(monkeypatch):
    """From the size on which the host library times its first operations to choose its stores (half of them
    with the slower ones), the warm-ups cover those trials at every scale: the timed iterations see the choice.
    The two numbers are the host library's own (pycoll/_host/coll.c)."""
    monkeypatch.setattr(sys, "path", [os.path.join(REPO, "benchmarks"), *sys.path])
    from allreduce_compare import STORE_MIN, STORE_TRIALS, schedule

    with open(os.path.join(REPO, "pycoll", "_host", "coll.c")) as f:
        src = f.read()
    assert re.search(r"#define STORE_TRIALS (\d+)\n", src).group(1) == str(STORE_TRIALS)
    assert int(re.search(r"static size_t stream_min = (\d+) << 20;", src).group(1)) << 20 == STORE_MIN
    for scale in (0.05, 0.5, 1.0):
        for size in (STORE_MIN, 64 << 20, 1 << 30):
            assert schedule(size, scale)[0] >= STORE_TRIALS
    assert schedule(STORE_MIN - 1, 0.05)[0] == 1 and schedule(64 << 20, 1.0) == (STORE_TRIALS, 10)


def test_a_failed_run_reports_the_ranks_traceback_before_the_launchers_banner(monkeypatch):
    """mpiexec prints its banner after the ranks' output: the error keeps the rank's traceback, not only the
    banner's last lines."""
    monkeypatch.setattr(sys, "path", [os.path.join(REPO, "benchmarks"), *sys.path])
    from allreduce_compare import _what_it_said

    banner = ["-" * 20, "prterun detected that one or more processes exited with non-zero status,",
              "thus causing the job to be terminated. The first process to do so was:", "",
              "   Process name: [prterun-host-1@1,1]", "   Exit code:    1", "-" * 20]
    said = _what_it_said("\n".join(["startup noise", "Traceback (most recent call last):", '  File "w.py", line 3',
                                    "OSError: no such device", *banner]))
    assert said.startswith("Traceback (most recent call last): | ") and "OSError: no such device" in said
    assert _what_it_said("\n".join(f"line {i}" for i in range(40)), lines=3) == "line 37 | line 38 | line 39"


def test_open_mpi_is_used_only_where_this_interpreter_has_mpi4py(monkeypatch):
    """Another environment's mpiexec on PATH starts ranks that die at ``import mpi4py`` (exit 1, only the launcher's
    banner to read): without mpi4py here the harnesses report Open MPI missing instead, and the tests leave it out."""
    monkeypatch.setattr(sys, "path", [os.path.join(REPO, "benchmarks"), *sys.path])
    import importlib.util

    import _common

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "mpi4py" else real(name, *a))
    assert _common.find_mpiexec() is None and _common.mpiexec_command(2, ["w.py"], {}) is None
    assert not mpi_ready()


def test_wrong_cells_and_failed_runs_are_shown(monkeypatch):
    """A wrong result is a WRONG cell (it printed "-", as not run), a library with fewer successful runs than asked
    for is named, and only the allreduce rows carry an allreduce's bandwidth."""
    monkeypatch.setattr(sys, "path", [os.path.join(REPO, "benchmarks"), *sys.path])  # undone after the test
    from allreduce_compare import combine, run_sizes, short_runs, wrong_results
    from window_collectives import table

    def rows(wrong):
        return {"label": "x", "rows": {"broadcast private": [{"size": 4096, "time_us": 10.0, "wrong": 0}],
                                       "broadcast window": [{"size": 4096, "time_us": 5.0, "wrong": wrong}]}}

    res = {"pycoll": combine([rows(3), {"error": "rank 1 died"}, rows(0)])}
    _, body = table(2, res, [4096], ["broadcast"])
    assert body[0][3] == "WRONG (3)" and body[0][2] == "0.01", body
    assert wrong_results(res) == 3
    assert short_runs(res, 3) == "medians of fewer runs (the others failed, above): pycoll 2 of 3"
    assert short_runs(res, 2) == ""

    def setup(count):
        return (lambda: None), (lambda: 0)

    got = run_sizes(0, 2, [8], 0.01, [("v", setup)], lambda: None, lambda a: a[None, :], bandwidth=False)
    assert "algbw" not in got["v"][0] and "busbw" not in got["v"][0]
    assert "algbw" not in combine([{"label": "x", "rows": got}] * 2)["rows"]["v"][0]


@pytest.mark.parametrize("script, args, text", [
    ("allreduce_compare.py", ["--ranks", "0"], "--ranks: must be at least 1, got 0"),
    ("allreduce_compare.py", ["--sizes", "1.5K"], "--sizes: '1.5K' is no size"),
    ("allreduce_compare.py", ["--sizes", "-8"], "--sizes: '-8' is not a positive size"),
    ("window_collectives.py", ["--sizes", "abc"], "--sizes: 'abc' is no size"),
    ("small_ops.py", ["--ranks", "-1"], "--ranks: must be at least 1, got -1"),
    ("overhead.py", ["--warmup", "0"], "--warmup: must be at least 1, got 0"),
    ("overhead.py", ["--batch", "0"], "--batch: must be at least 1, got 0"),
    ("fr_overhead.py", ["--rounds", "0"], "--rounds: must be at least 1, got 0"),
    ("agreement_scale.py", ["--sizes", "1"], "--sizes: a group has at least 2 members, got 1"),
    ("agreement_scale.py", ["--reps", "0"], "--reps: must be at least 1, got 0"),
])
def test_bad_arguments_are_usage_errors(script, args, text):
    # they ran and labelled 2 ranks "0 ranks", printed tables of nan, or ended in a traceback of a division by zero
    r = _run(script, args, timeout=60)
    assert r.returncode == 2 and text in r.stderr, (r.returncode, r.stderr[-1500:])


def test_the_copy_bound_of_sizes_under_64_bytes_stays_in_its_buffers():
    # the probe of each copy routine copied 64 bytes into buffers of the biggest size: 8 B here, a heap overflow
    # ("double free or corruption"); glibc's malloc checking makes it a crash every time
    debug = "/usr/lib/x86_64-linux-gnu/libc_malloc_debug.so.0"
    if not os.path.exists(debug):
        pytest.skip("no glibc malloc debugging library")
    r = subprocess.run([sys.executable, os.path.join(REPO, "benchmarks", "allreduce_compare.py"), "--ranks", "2",
                        "--sizes", "8", "--only", "copy"], capture_output=True, text=True, timeout=100,
                       env={**os.environ, "LD_PRELOAD": debug, "MALLOC_CHECK_": "3"})
    assert r.returncode == 0 and "copy bound failed" not in r.stdout + r.stderr, (r.stdout[-1500:], r.stderr[-1500:])
    assert "corruption" not in r.stderr and "free()" not in r.stderr, r.stderr[-1500:]
