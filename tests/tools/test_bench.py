"""pycoll-bench: argument handling, nccl-tests' definitions, output formats and result checking.

The multi-rank runs start the real CLI (which starts its ranks through pycoll-run) on the host
backend with tiny sizes and few iterations; they check what is printed and written, never how fast
anything was.
"""

from __future__ import annotations

import csv
import json
import os
import subprocess
import sys

import numpy as np
import pytest

import pycoll
from pycoll import bench
from pycoll.bench import COLLECTIVES, DTYPES, parse_size, size_steps

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(pycoll.__file__)))


def run_cli(args, tmp_path, timeout=90):
    env = dict(os.environ)
    env["PYTHONPATH"] = ROOT + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    for var in ("PYCOLL_RANK", "PYCOLL_WORLD_SIZE", "RANK", "WORLD_SIZE", "SLURM_PROCID", "OMPI_COMM_WORLD_RANK"):
        env.pop(var, None)
    return subprocess.run([sys.executable, "-m", "pycoll.bench", *args], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=timeout)


def table_rows(stdout):
    return [line.split() for line in stdout.splitlines() if line.strip() and not line.startswith("#")]


# -- sizes and names --------------------------------------------------------------------------------


@pytest.mark.parametrize("text, value", [("8", 8), ("1K", 1024), ("1k", 1024), ("64M", 64 << 20), ("1G", 1 << 30),
                                         ("4KiB", 4096), ("2MB", 2 << 20), (" 16 ", 16)])
def test_parse_size(text, value):
    assert parse_size(text) == value


@pytest.mark.parametrize("text", ["", "K", "1.5K", "-8", "8X", "1KK", "one"])
def test_parse_size_rejects(text):
    with pytest.raises(ValueError, match="not a size"):
        parse_size(text)


def test_size_steps():
    assert size_steps(8, 64, factor=2) == [8, 16, 32, 64]
    assert size_steps(8, 100, factor=4) == [8, 32]
    assert size_steps(100, 1000, step=450) == [100, 550, 1000]
    assert size_steps(64, 64, factor=2) == [64]
    with pytest.raises(ValueError, match=">= 2"):
        size_steps(8, 64, factor=1)
    with pytest.raises(ValueError, match="not both"):
        size_steps(8, 64, factor=2, step=8)
    with pytest.raises(ValueError, match="minbytes <= maxbytes"):
        size_steps(64, 8, factor=2)


def test_format_size():
    assert [bench.format_size(x) for x in (8, 1024, 1536, 64 << 20, 1 << 30)] == ["8", "1K", "1536", "64M", "1G"]


def test_collective_names_and_aliases():
    assert bench._collectives("all") == list(COLLECTIVES)
    assert bench._collectives("allreduce,all_gather_perf,bcast,sendrecv") == [
        "all_reduce", "all_gather", "broadcast", "send_recv"]
    with pytest.raises(Exception, match="unknown collective 'allgether'"):
        bench._collectives("allgether")


def test_bus_bandwidth_factors_are_nccl_tests():
    n = 4
    factors = {name: spec.bus_factor(n) for name, spec in COLLECTIVES.items()}
    assert factors == {
        "all_reduce": 1.5, "all_gather": 0.75, "broadcast": 1.0, "reduce_scatter": 0.75, "reduce": 1.0,
        "all_to_all": 0.75, "gather": 0.75, "scatter": 0.75, "send_recv": 1.0,
    }


def test_element_counts_round_to_whole_blocks():
    f32, f64 = DTYPES["float"], DTYPES["double"]
    assert bench._element_count(COLLECTIVES["all_reduce"], 10, f32, 3) == 2
    assert bench._element_count(COLLECTIVES["all_reduce"], 1, f64, 3) == 1  # never 0
    assert bench._element_count(COLLECTIVES["all_gather"], 40, f32, 3) == 9  # 10 elements -> 3 blocks of 3
    assert bench._element_count(COLLECTIVES["all_gather"], 4, f32, 3) == 3  # at least one per rank
    # 8 B and 16 B both give one float per rank with 4 ranks: the duplicate size is run once
    assert bench._size_plan(COLLECTIVES["all_gather"], f32, 4, [8, 16, 32]) == [8, 32]


# -- the reference and the comparison ------------------------------------------------------------


def test_count_wrong_integers_exact_floats_within_precision():
    f32, i8 = DTYPES["float"], DTYPES["int8"]
    want = np.array([1.0, 2.0, 3.0, 4.0])
    assert bench._count_wrong(want.copy(), want, f32, 2, reduced=False) == 0
    got = want.copy()
    got[1] = np.nan
    got[3] += 1e-3
    assert bench._count_wrong(got, want, f32, 2, reduced=True) == 2  # NaN and a real difference
    assert bench._count_wrong(want * (1 + 1e-7), want, f32, 2, reduced=True) == 0  # rounding
    assert bench._count_wrong(want * (1 + 3e-7), want, f32, 2, reduced=True) == 4  # more than 2 roundings' worth
    for name in ("f8e4m3", "f8e5m2", "bfloat16"):  # low precision: zeros, or one rank's half, are wrong
        assert bench._count_wrong(np.zeros(4), want, DTYPES[name], 2, reduced=True) == 4, name
        assert bench._count_wrong(want / 2, want, DTYPES[name], 2, reduced=True) == 4, name
    assert bench._count_wrong(np.array([1, 2, 4]), np.array([1, 2, 3]), i8, 2, reduced=True) == 1
    assert bench._count_wrong(np.zeros(3), np.zeros(4), f32, 2, reduced=False) == 4  # wrong length


@pytest.mark.parametrize("n", [2, 3, 4])
@pytest.mark.parametrize("name", ["float", "int32", "bfloat16", "f8e4m3", "f8e5m2"])
def test_the_check_sees_misplaced_blocks_a_wrong_op_and_a_missing_rank(name, n):
    """What a faulty collective gives is counted wrong: another block's (or a rolled) result, max where prod was
    asked, and a sum without one rank's part (fp8 at 4 ranks included: the patterns' sums are exact there)."""
    dt, count = DTYPES[name], 256

    def parts(kind, ranks=range(n)):
        return [bench._pattern(kind, dt, r, 0, count, n) for r in ranks]

    def wrong(got, op):
        rounds = not bench._exact_sums(dt, n, op)
        return bench._count_wrong(got, bench._reduce_ref(parts("prod" if op == 1 else "reduce"), op, dt, n), dt,
                                  n, rounds)

    for op in (0, 1, 2, 3, 4):
        want = bench._reduce_ref(parts("prod" if op == 1 else "reduce"), op, dt, n)
        assert wrong(want, op) == 0
        for shift in (8, 16, count // 2):  # a block of the result in another block's place
            assert wrong(np.roll(want, shift), op) > count // 16, (op, shift)
    assert wrong(bench._reduce_ref(parts("prod"), 2, dt, n), 1) > count // 8  # max computed for prod
    assert wrong(bench._reduce_ref(parts("reduce", range(n - 1)), 0, dt, n), 0) == count  # one rank left out
    data = parts("data")
    assert all(bench._count_wrong(data[r], data[s], dt, n, False) > count // 2 for r in range(n) for s in range(n)
               if r != s)  # another rank's block
    assert bench._count_wrong(np.roll(data[0], 8), data[0], dt, n, False) > count // 2


def test_reference_wraps_integers_and_truncates_avg():
    i8 = DTYPES["int8"]
    parts = [np.array([100, 7, 3]), np.array([100, 6, 4])]
    assert bench._reduce_ref(parts, 0, i8, 2).tolist() == [-56, 13, 7]  # 200 wraps in int8
    assert bench._reduce_ref(parts, 4, i8, 2).tolist() == [100, 6, 3]  # sum // n, as NCCL
    assert bench._reduce_ref(parts, 2, i8, 2).tolist() == [100, 7, 4]
    assert bench._reduce_ref(parts, 3, i8, 2).tolist() == [100, 6, 3]


@pytest.mark.parametrize("name", list(COLLECTIVES))
def test_expected_values_follow_the_collective(name):
    """Build every rank's case for 3 ranks and check expected() against a direct definition."""
    spec, dt, n, root = COLLECTIVES[name], DTYPES["int32"], 3, 1
    kit = bench._NumpyKit()
    cases = [bench.build_case(spec, dt, 0 if spec.reduces else None, root, n, r, 4 * 12, False, kit) for r in range(n)]
    for c in cases:
        c.fill()
    ins = [c.send.astype(np.int64) for c in cases]
    blk = cases[0].block
    for r, c in enumerate(cases):
        want = {
            "all_reduce": sum(ins), "reduce": sum(ins) if r == root else None,
            "broadcast": ins[root], "all_gather": np.concatenate(ins),
            "gather": np.concatenate(ins) if r == root else None,
            "reduce_scatter": sum(ins)[r * blk:(r + 1) * blk],
            "all_to_all": np.concatenate([i[r * blk:(r + 1) * blk] for i in ins]),
            "scatter": ins[root][r * blk:(r + 1) * blk], "send_recv": ins[(r - 1) % n],
        }[name]
        got = c.expected()
        if want is None:
            assert got is None
        else:
            assert got.tolist() == want.tolist()
        assert c.check() == (0 if want is None else want.size)  # outputs are still zero: all wrong


def test_in_place_layout_matches_nccl_tests():
    kit, dt = bench._NumpyKit(), DTYPES["float"]
    ag = bench.build_case(COLLECTIVES["all_gather"], dt, None, 0, 4, 2, 64, True, kit)
    assert len(ag.buffers) == 1 and np.shares_memory(ag.send, ag.recv)
    assert ag.send.ctypes.data == ag.recv.ctypes.data + 2 * 4 * 4  # this rank's block of the output
    rs = bench.build_case(COLLECTIVES["reduce_scatter"], dt, 0, 0, 4, 3, 64, True, kit)
    assert rs.recv.ctypes.data == rs.send.ctypes.data + 3 * 4 * 4
    with pytest.raises(ValueError, match="no in-place"):
        bench.build_case(COLLECTIVES["send_recv"], dt, None, 0, 2, 0, 64, True, kit)


# -- argument errors (no ranks are started) ------------------------------------------------------


@pytest.mark.parametrize("args, message", [
    (["nope"], "unknown collective"),
    (["all_reduce", "-b", "1X"], "not a size"),
    (["all_reduce", "-b", "1K", "-e", "8"], "smaller than -b"),
    (["all_reduce", "-f", "1"], ">= 2"),
    (["all_reduce", "-f", "2", "-i", "8"], "not allowed with"),
    (["all_reduce", "-d", "float,complex"], "unknown datatype 'complex'"),
    (["all_reduce", "-o", "xor"], "unknown reduction op"),
    (["all_reduce", "-n", "0"], "at least 1"),
    (["all_reduce", "-N", "0"], "--iters"),
    (["all_reduce", "-n", "2", "-r", "2"], "--root 2 is out of range"),
    (["all_reduce", "--json", "-", "--csv", "-"], "cannot both"),
    # refused before anything runs, not after every size ran (and the results are lost)
    (["all_reduce", "--json", "/nonexistent-folder/out.json"], "--json /nonexistent-folder/out.json: /nonexistent"),
    (["all_reduce", "--csv", "/nonexistent-folder/out.csv"], "is not a folder this process can write to"),
    (["all_reduce", "--plot", "/nonexistent-folder/out.png"], "--plot /nonexistent-folder/out.png"),
    (["all_reduce", "--plot", "out.txt"], "--plot out.txt: the file name must end in one of .eps"),
    (["all_reduce", "--plot", "-"], "--plot needs a file name"),
    (["all_reduce", "--json", "/"], "--json /: a folder, not a file"),
    (["all_reduce", "--backend", "host", "--array", "cupy"], "--array cupy needs a GPU backend"),
    (["send_recv", "--in-place"], "send_recv has no in-place variant: nothing to run"),
    # durations as everywhere in pycoll: --timeout inf ran, and each rank's timer thread died of an OverflowError;
    # --op-timeout inf failed the run (exit 3) at the init
    (["all_reduce", "--timeout", "inf"], "--timeout must be a finite number of seconds, got inf"),
    (["all_reduce", "--timeout", "1e12"], "--timeout must be at most 1e+09 seconds"),
    (["all_reduce", "--op-timeout", "inf"], "--op-timeout must be a finite number of seconds, got inf"),
    (["all_reduce", "--op-timeout", "0"], "--op-timeout must be > 0 seconds"),
    # found before the run, not once it reached them
    (["all_reduce", "--backend", "host", "--plot", "out.png", "--no-matplotlib"], "--plot out.png needs matplotlib"),
    (["all_reduce", "--backend", "host", "-d", "float,bfloat16", "--no-ml_dtypes"],
     "bfloat16 with numpy arrays need the ml_dtypes package (pip install ml_dtypes), or --array torch"),
])
def test_bad_arguments(args, message, capsys, monkeypatch):
    import importlib.util

    for missing in ("matplotlib", "ml_dtypes"):
        if f"--no-{missing}" in args:  # as on a machine without it
            args = [a for a in args if a != f"--no-{missing}"]
            real = importlib.util.find_spec
            monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a, m=missing: None if name == m
                                else real(name, *a))
    assert bench.main(args) == bench.EXIT_USAGE
    assert message in capsys.readouterr().err


def test_nranks_must_match_the_launcher(monkeypatch, capsys):
    monkeypatch.setenv("PYCOLL_RANK", "0")
    monkeypatch.setenv("PYCOLL_WORLD_SIZE", "2")
    assert bench.main(["all_reduce", "-n", "3"]) == bench.EXIT_USAGE
    assert "started as 2 ranks" in capsys.readouterr().err


# -- one rank, in this process --------------------------------------------------------------------


def _single(monkeypatch):
    for var in ("PYCOLL_RANK", "PYCOLL_WORLD_SIZE", "RANK", "WORLD_SIZE", "SLURM_PROCID", "OMPI_COMM_WORLD_RANK"):
        monkeypatch.delenv(var, raising=False)


@pytest.mark.timeout(60)
def test_one_rank_in_process_with_progress(monkeypatch, capsys, tmp_path):
    _single(monkeypatch)
    out = tmp_path / "r.json"
    rc = bench.main(["all_reduce,all_to_all", "-b", "8", "-e", "64", "-f", "8", "-N", "3", "-w", "1",
                     "--backend", "host", "--progress", "--json", str(out)])
    cap = capsys.readouterr()
    assert rc == bench.EXIT_OK, cap.err
    assert "# Out of bounds values : 0 OK" in cap.out
    # 2 collectives x 2 sizes x 2 modes; redrawn at most 10 times a second, the last step always
    assert "\r" in cap.err and "pycoll-bench [1/8] all_reduce float sum 8 out-of-place" in cap.err
    assert "pycoll-bench [8/8] all_to_all float 64 in-place" in cap.err
    doc = json.loads(out.read_text())
    assert doc["meta"]["nranks"] == 1 and doc["summary"]["wrong"] == 0
    assert len(doc["results"]) == 8


@pytest.mark.timeout(60)
def test_a_wrong_reference_is_counted_and_fails_the_run(monkeypatch, capsys):
    """The checker really compares: a reference that is off by one makes every element wrong."""
    _single(monkeypatch)
    real = bench._reduce_ref
    monkeypatch.setattr(bench, "_reduce_ref", lambda *a: real(*a) + 1)
    rc = bench.main(["all_reduce", "-b", "64", "-e", "64", "-N", "2", "-w", "0", "--backend", "host",
                     "--out-of-place", "--json", "-"])
    cap = capsys.readouterr()
    assert rc == bench.EXIT_WRONG
    doc = json.loads(cap.out)
    assert doc["summary"] == {**doc["summary"], "wrong": 16, "ok": False}
    assert doc["results"][0]["wrong"] == 16


@pytest.mark.timeout(60)
def test_check_can_be_disabled(monkeypatch, capsys):
    _single(monkeypatch)
    monkeypatch.setattr(bench, "_reduce_ref", lambda *a: (_ for _ in ()).throw(AssertionError("checked")))
    rc = bench.main(["all_reduce", "-b", "64", "-e", "64", "-N", "2", "-c", "0", "--backend", "host", "--csv", "-"])
    cap = capsys.readouterr()
    assert rc == bench.EXIT_OK, cap.err
    rows = list(csv.DictReader(cap.out.splitlines()))
    assert [r["wrong"] for r in rows] == ["", ""]


@pytest.mark.timeout(60)
def test_timeout_stops_a_rank_in_this_process(monkeypatch, capsys):
    """--timeout holds where pycoll-bench starts no ranks (one rank here; ranks another launcher started)."""
    _single(monkeypatch)
    rc = bench.main(["all_reduce", "-b", "8", "-e", "8", "-N", "100000000", "-w", "0", "--backend", "host",
                     "--out-of-place", "--timeout", "0.5", "--no-progress"])
    err = capsys.readouterr().err
    assert rc == bench.EXIT_FAILED, err
    assert "--timeout 0.5 s passed" in err and "CommAborted" in err


@pytest.mark.timeout(60)
def test_a_crash_is_a_failed_run_not_wrong_values(monkeypatch, capsys):
    """An exception pycoll-bench does not expect ends the run with status 3 and its traceback, not 1."""
    _single(monkeypatch)
    from pycoll.tools.bench import cli

    def broken(*args, **kwargs):
        raise KeyError("a defect")

    monkeypatch.setattr(cli, "measure", broken)
    rc = bench.main(["all_reduce", "-b", "8", "-e", "8", "-N", "1", "-w", "0", "--backend", "host"])
    err = capsys.readouterr().err
    assert rc == bench.EXIT_FAILED
    assert "Traceback" in err and "KeyError: 'a defect'" in err


# -- two ranks through the real CLI --------------------------------------------------------------


@pytest.mark.timeout(120)
def test_two_ranks_table_json_csv_plot(tmp_path):
    res = run_cli(["all_reduce,all_gather,send_recv", "-n", "2", "-b", "8", "-e", "1K", "-f", "4", "-N", "3",
                   "-w", "1", "--json", "r.json", "--csv", "r.csv", "--plot", "r.png", "--no-progress"], tmp_path)
    assert res.returncode == 0, res.stderr
    out = res.stdout
    assert "nRanks 2 backend host" in out and "# Out of bounds values : 0 OK" in out
    assert out.count("#  Rank ") == 2
    assert "out-of-place" in out and "in-place" in out and "#wrong" in out
    rows = table_rows(out)
    # 8, 32, 128, 512 B for all_reduce and send_recv; all_gather's 8 B is one float per rank
    assert [r[0] for r in rows] == ["8", "32", "128", "512"] * 3
    # the count column is the call's count argument, as nccl-tests prints it: a rank's block for all_gather
    assert [r[1] for r in rows] == ["2", "8", "32", "128", "1", "4", "16", "64", "2", "8", "32", "128"]
    assert all(r[2] == "float" for r in rows)
    assert all(r[-4:] == ["N/A"] * 4 for r in rows[-4:])  # send_recv has no in-place variant

    doc = json.loads((tmp_path / "r.json").read_text())
    assert doc["meta"]["nranks"] == 2 and doc["meta"]["library"]["kind"] == "host"
    assert doc["summary"]["wrong"] == 0 and doc["summary"]["ok"] is True
    assert len(doc["results"]) == 4 * 2 + 4 * 2 + 4
    for r in doc["results"]:
        factor = COLLECTIVES[r["collective"]].bus_factor(2)
        assert r["algbw_GBps"] == pytest.approx(r["size"] / (r["time_us"] * 1e3))
        assert r["busbw_GBps"] == pytest.approx(r["algbw_GBps"] * factor)
        assert r["time_us_min"] <= r["time_us"] <= r["time_us_p90"] and r["iters"] == 3 and r["wrong"] == 0

    with open(tmp_path / "r.csv", newline="") as f:
        rows_csv = list(csv.DictReader(f))
    assert len(rows_csv) == len(doc["results"])
    assert {r["mode"] for r in rows_csv} == {"out-of-place", "in-place"}
    assert rows_csv[0]["collective"] == "all_reduce" and rows_csv[0]["nranks"] == "2"

    png = (tmp_path / "r.png").read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 10000


@pytest.mark.timeout(120)
def test_a_corrupted_result_is_flagged(tmp_path):
    """--debug-corrupt-rank changes one output element on that rank before the comparison."""
    res = run_cli(["all_reduce", "-n", "2", "-b", "64", "-e", "256", "-f", "4", "-N", "2", "-w", "0",
                   "--debug-corrupt-rank", "1", "--json", "r.json"], tmp_path)
    assert res.returncode == bench.EXIT_WRONG, res.stderr
    assert "# Out of bounds values : 4 FAILED" in res.stdout  # 2 sizes x 2 modes, one element each
    doc = json.loads((tmp_path / "r.json").read_text())
    assert [r["wrong"] for r in doc["results"]] == [1, 1, 1, 1]


@pytest.mark.timeout(120)
def test_every_collective_datatype_and_op_checks_out(tmp_path):
    """The reference agrees with the host library for every collective, both modes, and the raw API."""
    res = run_cli(["all", "-n", "2", "-b", "8", "-e", "4K", "-f", "8", "-N", "1", "-w", "0", "-r", "1",
                   "-d", "float,int8,bfloat16", "-o", "sum,prod,max,avg", "--json", "r.json"], tmp_path)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr
    doc = json.loads((tmp_path / "r.json").read_text())
    assert {r["collective"] for r in doc["results"]} == set(COLLECTIVES)
    assert {r["redop"] for r in doc["results"]} == {"sum", "prod", "max", "avg", "none"}
    assert all(r["wrong"] == 0 for r in doc["results"])
    raw = run_cli(["all_reduce,scatter,send_recv", "-n", "2", "-b", "8", "-e", "4K", "-f", "8", "-N", "2",
                   "--api", "raw", "-d", "half"], tmp_path)
    assert raw.returncode == 0, raw.stderr
    assert "api raw" in raw.stdout and "Out of bounds values : 0 OK" in raw.stdout


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_three_ranks_odd_sizes_streams_and_all_types(tmp_path):
    res = run_cli(["all", "-n", "3", "-b", "100", "-e", "1000", "-i", "450", "-N", "2", "-w", "0", "-r", "2",
                   "-d", "all", "-o", "all", "--stream", "--json", "r.json"], tmp_path, timeout=280)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr
    doc = json.loads((tmp_path / "r.json").read_text())
    assert doc["meta"]["stream"] is True and doc["summary"]["wrong"] == 0
    assert {r["type"] for r in doc["results"]} == set(DTYPES)
