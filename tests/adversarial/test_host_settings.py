"""Finding 2 and 12: every host-library variable is validated, in C (the library alone) and from Python."""

from __future__ import annotations

import textwrap
from typing import List, Tuple, Union

import pytest
from helpers.mp import shm_prefix

from pycoll import _settings
from pycoll.store import TCPStoreServer

from ._helpers import env, python

TOKEN = "adversarial-host"

# Rank script: argv = rank, port, skip-python-check (1/0). All-reduces 1 MiB (above the one-shot size).
_RANK = textwrap.dedent("""
    import sys
    import numpy as np
    rank, port, skip = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3] == "1"
    import pycoll
    from pycoll import _settings
    if skip:  # as if another program used the library alone: only its C checks remain
        _settings.check_host_library = lambda environ=None: None
    from pycoll.store import TCPStore
    store = TCPStore("127.0.0.1", port, "adversarial-host", timeout=20)
    try:
        comm = pycoll.init(rank, 2, store=store, backend="host", timeout=20, init_timeout=20)
    except ValueError as exc:
        print("VALUEERROR", exc, flush=True)
        sys.exit(3)
    x = np.full(1 << 18, rank + 1.0, dtype=np.float32)
    comm.all_reduce(x)
    assert (x == 3.0).all(), x[:4]
    print("OK", flush=True)
    comm.destroy()
""")


# Rank script for the store choice: eight allreduces of 9 MiB (past PYCOLL_HOST_STREAM_MIN's 8 MiB), checked.
_LARGE = textwrap.dedent("""
    import sys
    import numpy as np
    rank, port = int(sys.argv[1]), int(sys.argv[2])
    import pycoll
    from pycoll.store import TCPStore
    store = TCPStore("127.0.0.1", port, "adversarial-host", timeout=20)
    comm = pycoll.init(rank, 2, store=store, backend="host", timeout=20, init_timeout=20)
    for i in range(8):
        x = np.full((9 << 20) // 4 + 5, rank + i + 1.0, dtype=np.float32)
        y = np.empty_like(x)
        comm.all_reduce(x, y)
        assert (y == 2 * i + 3.0).all(), (i, y[:4])
    print("OK", flush=True)
    comm.destroy()
""")


def _run(extra: Union[dict, List[dict]], skip: bool, script: str = _RANK) -> List[Tuple[int, str, str]]:
    """Both ranks of ``script`` with the variables ``extra`` (a list: each rank's own)."""
    each = extra if isinstance(extra, list) else [extra, extra]
    with TCPStoreServer("127.0.0.1", 0, TOKEN).start() as srv:
        args = ("1" if skip else "0",) if script is _RANK else ()
        children = [python(script, str(r), str(srv.port), *args, environ=env(**each[r])) for r in range(2)]
        try:
            return [c.communicate(40) for c in children]
        finally:
            for c in children:
                c.kill()
                for f in (c.popen.stdout, c.popen.stderr):
                    if f is not None:
                        f.close()


@pytest.mark.timeout(60)
@pytest.mark.parametrize("value", ["0", "7", "abc"])
def test_bad_chunk_bytes_is_refused_in_c(value: str) -> None:
    """The library alone: a WARN naming the variable, the default used, a correct result; no SIGFPE."""
    for rc, out, err in _run({"PYCOLL_HOST_CHUNK_BYTES": value}, skip=True):
        assert rc == 0 and "OK" in out, (rc, out, err)
        assert f"PYCOLL_HOST_CHUNK_BYTES={value} is invalid" in err, err


@pytest.mark.timeout(90)
def test_the_stores_for_large_outputs_are_measured_unless_set() -> None:
    """Unset, the process's first six AllReduce past 8 MiB alternate streaming and cached stores and it keeps the
    faster (NCCL_DEBUG=INFO says which, once); PYCOLL_HOST_STREAM_MIN set decides without measuring. Results
    are right either way."""
    for extra, measured in (({}, True), ({"PYCOLL_HOST_STREAM_MIN": "8388608"}, False),
                            ({"PYCOLL_HOST_STREAM_MIN": "0"}, False)):
        for rc, out, err in _run({"NCCL_DEBUG": "INFO", **extra}, skip=False, script=_LARGE):
            assert rc == 0 and "OK" in out, (extra, rc, out, err)
            said = [ln for ln in err.splitlines() if "outputs of 8388608 to 16777215 bytes:" in ln]
            if measured:
                assert len(said) == 1 and ("streaming stores" in said[0] or "cached stores" in said[0]), err
                assert "at best over 6 operations" in said[0], said
            else:
                assert said == [], (extra, said)


@pytest.mark.timeout(60)
def test_bad_init_timeout_fails_init_in_c() -> None:
    for rc, out, err in _run({"PYCOLL_HOST_INIT_TIMEOUT": "inf"}, skip=True):
        assert rc != 0 and "OK" not in out
        assert "PYCOLL_HOST_INIT_TIMEOUT=inf is invalid" in err, err


@pytest.mark.timeout(60)
@pytest.mark.parametrize("name,value", [
    ("PYCOLL_HOST_CHUNK_BYTES", "1"), ("PYCOLL_HOST_ONESHOT_MAX", "-1"), ("PYCOLL_HOST_SPIN_NS", "1e3"),
    ("PYCOLL_HOST_YIELD_NS", "99999999999999999999"), ("PYCOLL_HOST_INIT_TIMEOUT", "nan"),
    ("PYCOLL_HOST_BIND", "yes"),
])
def test_python_refuses_bad_host_settings_before_loading(name: str, value: str) -> None:
    results = _run({name: value}, skip=False)
    for rc, out, err in results:
        assert rc == 3 and "VALUEERROR" in out and name in out, (rc, out, err)
        assert "pycoll host library: WARN" not in err  # refused before the library read it


@pytest.mark.timeout(60)
@pytest.mark.parametrize("name,values", [("PYCOLL_HOST_ONESHOT_MAX", ("0", "32768")),
                                         ("PYCOLL_HOST_CHUNK_BYTES", ("64", "1048576")),
                                         ("PYCOLL_HOST_EAGER_ROOTED", ("1", "0"))])
def test_ranks_that_would_plan_collectives_apart_fail_their_init_naming_the_variable(name: str,
                                                                                    values: Tuple[str, str]) -> None:
    # PYCOLL_HOST_ONESHOT_MAX=0 on one rank: it reduced in two phases where the other reduced in one, and returned
    # unreduced data ([2.] where 3.); CHUNK_BYTES apart: a mismatch error naming a Reduce nobody called
    for rc, out, err in _run([{name: values[0]}, {name: values[1]}], skip=False):
        assert rc != 0 and "OK" not in out, (rc, out, err)
        assert f"{name} is" in err and "must be the same in every rank's environment" in err, err


@pytest.mark.timeout(60)
def test_the_library_takes_the_blanks_around_bind_that_python_takes() -> None:
    for rc, out, err in _run({"PYCOLL_HOST_BIND": " 1\n"}, skip=False):  # " 1" passed Python, the library warned
        assert rc == 0 and "OK" in out and "WARN" not in err, (rc, out, err)


@pytest.mark.parametrize("name,good,bad", [
    ("PYCOLL_HOST_CHUNK_BYTES", ["64", "524288", str(1 << 30)], ["0", "1", "7", "63", "abc", "1_000", str(2 << 30)]),
    ("PYCOLL_HOST_ONESHOT_MAX", ["0", "32768"], ["-1", "x", "1.5"]),
    ("PYCOLL_HOST_STREAM_MIN", ["0", "8388608", str(1 << 62)], ["-1", "8M", "1e6", str((1 << 62) + 1)]),
    # what C's parser takes and refuses alike: blanks it skips (spaces and tabs before, newlines too after), no
    # sign, ASCII digits ('-0' and '5\r' passed here while the library warned and took its default)
    ("PYCOLL_HOST_SPIN_NS", ["0", "50000", " \t50000 \n"], ["-5", "1e3", "10000000001", "-0", "+5", "5\r", "\n5",
                                                           "\u0665"]),
    ("PYCOLL_HOST_YIELD_NS", ["0", "300000"], ["inf", "-1"]),
    ("PYCOLL_HOST_YIELD_ADAPT", ["0", "1"], ["2", "-1", "on"]),
    ("PYCOLL_HOST_DEFER_NS", ["0", "1000000", "1000000000"], ["-1", "1e6", "1000000001"]),
    ("PYCOLL_HOST_INLINE_NS", ["100000", "10000000", "10000000000"], ["0", "99999", "1e7", "10000000001"]),
    ("PYCOLL_HOST_PEER_CHECK_NS", ["100000", "1000000", "10000000000"], ["0", "99999", "1e6", "10000000001"]),
    ("PYCOLL_HOST_STREAM_DEPTH", ["0", "1", "1024", str(1 << 24)], ["-1", "1e3", "1k", str((1 << 24) + 1)]),
    ("PYCOLL_HOST_INIT_TIMEOUT", ["0", "0.5", "300", ".5", "1e2", " 5\n"],
     ["-1", "inf", "nan", "1e8", "soon", "1_0", "5\r", "\u0661\u0660", "1e-320", "0x10"]),
    ("PYCOLL_HOST_BIND", ["0", "1"], ["2", "yes", "true"]),
    ("PYCOLL_HOST_WINDOW_ALLREDUCE", ["0", "1"], ["2", "-1", "on"]),
    ("PYCOLL_HOST_WINDOW_COLLECTIVES", ["0", "1"], ["2", "-1", "on"]),
    ("PYCOLL_HOST_GROUP_BATCH", ["0", "1"], ["2", "-1", "on"]),
    ("PYCOLL_HOST_EAGER", ["0", "1"], ["2", "-1", "on"]),
    ("PYCOLL_HOST_EAGER_ROOTED", ["0", "1"], ["2", "-1", "on"]),
    ("PYCOLL_HOST_SPREAD", ["0", "1"], ["2", "-1", "on"]),
    ("PYCOLL_HOST_IDLE_DEAD", ["0", "1"], ["2", "-1", "on", "-0"]),
])
def test_settings_bounds_match_the_c_rules(name: str, good: List[str], bad: List[str]) -> None:
    for v in good:
        _settings.check_host_library({name: v})
    for v in bad:
        with pytest.raises(ValueError, match=name):
            _settings.check_host_library({name: v})


@pytest.mark.parametrize("value", ["SIGTERM", "SIGSEGV", "15", "9", "KILL"])
def test_dump_signal_only_usr1_usr2(value: str) -> None:
    from pycoll.diagnostics.signals import signal_number

    with pytest.raises(ValueError, match="PYCOLL_FR_DUMP_SIGNAL"):
        _settings.get("PYCOLL_FR_DUMP_SIGNAL", {"PYCOLL_FR_DUMP_SIGNAL": value})
    with pytest.raises(ValueError, match="SIGUSR1 or SIGUSR2"):
        signal_number(value)


def test_dump_signal_accepts_its_spellings() -> None:
    import signal

    from pycoll.diagnostics.signals import signal_number

    for v, want in (("SIGUSR1", signal.SIGUSR1), ("usr2", signal.SIGUSR2), ("1", signal.SIGUSR1), ("0", None),
                    (str(int(signal.SIGUSR2)), signal.SIGUSR2)):
        _settings.get("PYCOLL_FR_DUMP_SIGNAL", {"PYCOLL_FR_DUMP_SIGNAL": v})
        assert signal_number(v) == want
    with pytest.raises(ValueError):
        signal_number(int(signal.SIGTERM))
    # an int as its text: 1 is SIGUSR1 as '1' is (it was refused as SIGHUP), 0 off; a negative one was off silently
    assert (signal_number(1), signal_number(0), signal_number(int(signal.SIGUSR2))) == (signal.SIGUSR1, None,
                                                                                       signal.SIGUSR2)
    with pytest.raises(ValueError, match="must be SIGUSR1 or SIGUSR2 .* got -1"):
        signal_number(-1)
    for other in (signal.SIGHUP, "\u0661\u0662"):  # a signal that is 1 is SIGHUP, not "on"; other scripts' digits
        with pytest.raises(ValueError):
            signal_number(other)


@pytest.mark.timeout(30)
def test_huge_fr_buffer_size_is_a_clear_error() -> None:
    code = "import pycoll.diagnostics.recorder as r; r.get_recorder()"
    with python(code, environ=env(PYCOLL_FR_BUFFER_SIZE="1000000000000")) as child:
        rc, _, err = child.communicate(20)
    assert rc != 0 and "MemoryError" not in err and "PYCOLL_FR_BUFFER_SIZE" in err, err


@pytest.mark.timeout(60)
def test_a_rank_of_another_segment_layout_is_told_the_two_layouts() -> None:
    # another build of the library (its segment layout changed) joining: it said "is not a segment of this host
    # library version", naming neither build
    import glob
    import struct
    import time

    before = set(glob.glob(f"/dev/shm/{shm_prefix()}*"))
    with TCPStoreServer("127.0.0.1", 0, TOKEN).start() as srv:
        first = python(_RANK, "0", str(srv.port), "0", environ=env())
        with first:
            deadline, made = time.monotonic() + 30, []
            while not made and time.monotonic() < deadline and first.popen.poll() is None:
                made = sorted(set(glob.glob(f"/dev/shm/{shm_prefix()}*")) - before)
                time.sleep(0.01)
            assert made, "rank 0 made no segment"
            with open(made[0], "r+b") as f:  # magic (8 bytes), then the layout version
                f.seek(8)
                ours = struct.unpack("<I", f.read(4))[0]
                f.seek(8)
                f.write(struct.pack("<I", ours + 1))
            with python(_RANK, "1", str(srv.port), "0", environ=env()) as second:
                rc, out, err = second.communicate(40)
            first.communicate(40)
    assert rc != 0 and "OK" not in out, (rc, out, err)
    assert f"was made by a host library of segment layout {ours + 1}, this one is of layout {ours}" in err, err
