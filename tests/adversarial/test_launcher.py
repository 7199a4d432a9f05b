"""Finding 1 (launcher side) and 12: pycoll-run fails a job whose store died, bounds -n, reports spawn errors."""

from __future__ import annotations

import sys
import textwrap
import time

import pytest

from ._helpers import Child, python

_RANK = textwrap.dedent("""
    import os, sys, time
    open(os.path.join(sys.argv[1], os.environ["PYCOLL_RANK"]), "w").write(str(os.getpid()))
    time.sleep(60)
""")

_LAUNCH_AND_KILL_STORE = textwrap.dedent("""
    import sys, threading
    from pycoll.launch import launcher as L
    orig = L._Launcher.open_store
    def open_store(self):
        opened = orig(self)
        threading.Timer(1.5, self.server.close).start()  # the store server stops under the job
        return opened
    L._Launcher.open_store = open_store
    sys.exit(L.main(sys.argv[1:]))
""")


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


@pytest.mark.timeout(60)
def test_dead_store_server_fails_the_job(tmp_path) -> None:
    script = tmp_path / "rank.py"
    script.write_text(_RANK)
    t0 = time.monotonic()
    with python(_LAUNCH_AND_KILL_STORE, "-n", "2", "--grace", "1", str(script), str(tmp_path)) as child:
        rc, _, err = child.communicate(40)
    assert time.monotonic() - t0 < 30, err
    assert rc != 0, err
    assert "lost the job's store" in err and "stopping the job" in err, err
    pids = [int((tmp_path / str(r)).read_text()) for r in range(2) if (tmp_path / str(r)).exists()]
    assert pids and not any(_alive(p) for p in pids)


@pytest.mark.timeout(30)
def test_nproc_has_an_upper_bound(tmp_path) -> None:
    script = tmp_path / "rank.py"
    script.write_text("pass\n")
    with python("import sys; from pycoll.launch.launcher import main; sys.exit(main(sys.argv[1:]))",
                "-n", "100000000", str(script)) as child:
        rc, _, err = child.communicate(20)
    assert rc == 2 and "-n must be at most" in err, err


_LOW_FDS = textwrap.dedent("""
    import resource, sys
    resource.setrlimit(resource.RLIMIT_NOFILE, (48, 48))
    from pycoll.launch.launcher import main
    sys.exit(main(sys.argv[1:]))
""")


@pytest.mark.timeout(30)
def test_running_out_of_file_descriptors_is_a_clear_error(tmp_path) -> None:
    script = tmp_path / "rank.py"
    script.write_text(_RANK)
    with python(_LOW_FDS, "-n", "40", "--grace", "0.5", str(script), str(tmp_path)) as child:
        rc, _, err = child.communicate(20)
    assert rc != 0
    assert "Traceback" not in err and "file descriptors" in err, err
    pids = [int(p.read_text()) for p in tmp_path.iterdir() if p.name.isdigit() and p.read_text()]
    assert not any(_alive(p) for p in pids)


@pytest.mark.timeout(30)
def test_spawn_failure_is_a_clear_error(tmp_path) -> None:
    """Spawning can fail past the up-front check (here: Popen raises on the third rank)."""
    script = tmp_path / "rank.py"
    script.write_text(_RANK)
    code = textwrap.dedent("""
        import errno, subprocess, sys
        from pycoll.launch import launcher as L
        real, calls = subprocess.Popen, []
        def popen(*a, **k):
            calls.append(1)
            if len(calls) == 3:
                raise OSError(errno.EMFILE, "Too many open files")
            return real(*a, **k)
        L.subprocess.Popen = popen
        sys.exit(L.main(sys.argv[1:]))
    """)
    with python(code, "-n", "4", "--grace", "0.5", str(script), str(tmp_path)) as child:
        rc, _, err = child.communicate(20)
    assert rc == 1 and "Traceback" not in err and "cannot start rank 2 of 4" in err, err
    time.sleep(0.2)
    pids = [int(p.read_text()) for p in tmp_path.iterdir() if p.name.isdigit() and p.read_text()]
    assert not any(_alive(p) for p in pids)


def test_python_m_pycoll_store_prints_no_warning() -> None:
    with Child([sys.executable, "-m", "pycoll.store", "--help"]) as child:
        rc, _, err = child.communicate(20)
    assert rc == 0 and "RuntimeWarning" not in err, err
