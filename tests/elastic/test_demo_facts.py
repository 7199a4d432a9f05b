"""The demo's diagnosis rests on facts (issue 17): the ranks that were inside the failing all_reduce
are never called behind on the strength of a report from start-up, and a stale report is given with
its age."""

from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest
from helpers import REPO


@pytest.mark.timeout(120)
def test_demo_lines_say_only_what_is_known(tmp_path):
    env = dict(os.environ, PYTHONPATH=REPO + os.pathsep + os.environ.get("PYTHONPATH", ""))
    p = subprocess.run([sys.executable, "-m", "pycoll.demo", "--steps", "30", "--kill-step", "10", "--dump-dir",
                        str(tmp_path)], capture_output=True, text=True, timeout=100, env=env, cwd=REPO)
    out = p.stdout + p.stderr
    assert p.returncode == 0, out
    lines = [ln for ln in out.splitlines() if "pycoll watchdog: " in ln and "communicator 'demo'" in ln]
    assert len(lines) == 3, out  # ranks 0, 1 and 3
    for ln in lines:
        for r in (0, 1, 3):  # they were alive to the end: never a stale claim, never failed in an operation
            assert f"rank {r} (last report" not in ln and f"rank {r} (failed in " not in ln, ln
    # a survivor may see its communicator revoked by another's watcher before its own remote error (then
    # its line names no operation); the ones that failed inside the all_reduce say where each live rank was:
    # in it too, or (where the error came before that rank issued it) behind by one, by that rank's own answer
    # or its own record of the reshape's revoke, which stopped it between steps (a failure in no operation)
    in_op = [ln for ln in lines if "in flight: all_reduce #" in ln]
    assert in_op, lines
    for ln in in_op:
        me = int(re.search(r"\) rank (\d)/4", ln).group(1))
        seq = int(re.search(r"in flight: all_reduce #(\d+)", ln).group(1))
        also = re.search(rf"also in #{seq}: ranks ([\d, ]+)", ln)
        inside = {int(r) for r in also.group(1).split(", ")} if also else set()
        one_behind = rf"rank (\d) \((?:alive, answered: |failed )last issued #{seq - 1}\)"
        behind = {int(r) for r in re.findall(one_behind, ln)}
        assert not inside & behind and inside | behind == {0, 1, 3} - {me}, ln
        claims = re.findall(r"rank [013] \((?:alive, answered|failed )", ln)
        assert len(claims) == len(behind), ln  # no other claim of a live rank
        # rank 2 died: what is known of it is its last report, with its age
        assert re.search(r"rank 2 \((last report \d+\.\d s old said #\d+; (no answer within \d+\.\d s|"
                         r"its process \(pid \d+, this host\) is gone)|"
                         r"last reported #\d+ \d+\.\d s ago: stopped, hung or dead)\)", ln), ln
    fr_lines = [ln for ln in out.splitlines() if "watchdog on rank" in ln]
    assert fr_lines and not any(re.search(r"rank [013] \(last report", ln) for ln in fr_lines), fr_lines
    assert "verdict: rank 2 (no dump)" in out
    assert re.search(r"rank 2: no dump; (its process \(pid \d+\) was gone when rank \d looked; )?not seen entering "
                     r"it: its last report in the store, \d+\.\d s old when rank \d failed, said #\d+", out), out
