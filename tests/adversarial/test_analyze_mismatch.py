"""Finding 10: pycoll-fr names reduction-op and root mismatches (from the host library's text in each dump)."""

from __future__ import annotations

import sys
import textwrap

import pytest

from pycoll.diagnostics import analyze

from ._helpers import Child, env

_JOB = textwrap.dedent("""
    import sys
    import numpy as np
    import pycoll
    comm = pycoll.init(backend="host", timeout=10)
    r, kind = comm.rank, sys.argv[1]
    x = np.ones(8, dtype=np.float32)
    try:
        if kind == "op":
            comm.all_reduce(x, op="sum" if r == 0 else "max")
        elif kind == "broadcast_root":
            comm.broadcast(x, root=r)
        elif kind == "reduce_root":
            comm.reduce(x, root=1 if r == 2 else 0)
        # the program goes on: a rank whose part of the mismatched call completed (a sender of a small rooted
        # collective writes its block and is done) fails at its next collective, and dumps then
        comm.all_reduce(x)
    except pycoll.CommFailure:
        pass
""")


def _dumps(tmp_path, kind: str, n: int) -> str:
    script = tmp_path / "job.py"
    script.write_text(_JOB)
    dump_dir = tmp_path / "dumps"
    with Child([sys.executable, "-m", "pycoll.run", "-n", str(n), "--grace", "1", str(script), kind],
               env(PYCOLL_FR_DUMP_DIR=str(dump_dir))) as child:
        child.communicate(60)
    return str(dump_dir)


@pytest.mark.timeout(90)
@pytest.mark.parametrize("kind,n,label,culprit", [
    ("op", 2, "reduction op mismatch", None),
    ("broadcast_root", 2, "root mismatch", None),
    ("reduce_root", 3, "root mismatch", 2),
])
def test_op_and_root_mismatches_are_named(tmp_path, kind: str, n: int, label: str, culprit) -> None:
    dump_dir = _dumps(tmp_path, kind, n)
    reports = analyze.analyze_dir(dump_dir)
    text = analyze.format_report(reports, stacks=False)
    assert "not a desync" not in text, text
    assert label in text, text
    (comm,) = [c for rep in reports for c in rep["communicators"]]
    m = comm["first_divergence"]["mismatch"]
    assert m["kind"] == ("op" if kind == "op" else "root")
    if culprit is not None:
        assert m["culprits"] == [culprit] and "culprit rank 2" in text, text
    values = {v["value"] for v in m["variants"]}
    assert len(values) == 2, values
