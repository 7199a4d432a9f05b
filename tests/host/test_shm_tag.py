"""``PYCOLL_HOST_SHM_TAG``: the host library's segments of processes with different tags are apart -- named
``pycoll_<tag>-...``, and each rendezvous sweeps the dead processes' segments of its own tag only -- and a rank of
another tag than the unique id's creator fails its init at once, naming both (it would wait for a segment under a name
nobody makes)."""

from __future__ import annotations

import os
import signal
import time

import pytest
from helpers.host_util import lib
from helpers.mp import Died, run_ranks, shm_entries

from pycoll import _settings, errors
from pycoll._bindings import Config


def _tag(suffix: str) -> str:
    return f"{os.environ.get('PYCOLL_HOST_SHM_TAG', 't')[:11]}_{suffix}"[-15:]


def _die_in_a_rendezvous(rank, n):
    l = lib()
    l.comm_init_rank_config(2, l.get_unique_id(), 0, Config(blocking=0))  # rank 1 never comes
    time.sleep(0.1)
    os.kill(os.getpid(), signal.SIGKILL)


def _sweep(rank, n):
    lib().get_unique_id()  # a process's first sweep is in its first unique id
    return sorted(e for e in os.listdir("/dev/shm") if e.startswith("pycoll"))


@pytest.mark.timeout(60)
def test_a_tag_names_the_segments_and_only_its_own_processes_sweep_them():
    mine, theirs = _tag("a"), _tag("b")
    (died,) = run_ranks(_die_in_a_rendezvous, 1, env={"PYCOLL_HOST_SHM_TAG": theirs}, timeout=30, may_die=[0])
    assert isinstance(died, Died)
    left = shm_entries(f"pycoll_{theirs}-")
    assert len(left) == 1, left  # the killed creator's segment, named by its tag
    try:
        # processes of another tag, and of none, leave it
        for other in (mine, ""):
            (seen,) = run_ranks(_sweep, 1, env={"PYCOLL_HOST_SHM_TAG": other}, timeout=30)
            assert left[0] in seen, other
        assert shm_entries(f"pycoll_{theirs}-") == left
        # one of its own tag sweeps it
        (seen,) = run_ranks(_sweep, 1, env={"PYCOLL_HOST_SHM_TAG": theirs}, timeout=30)
        assert left[0] not in seen
    finally:
        for name in shm_entries(f"pycoll_{theirs}-"):
            os.unlink(os.path.join("/dev/shm", name))


def _init_under(rank, n, idb, tag):
    os.environ["PYCOLL_HOST_SHM_TAG"] = tag
    l = lib()
    t0 = time.monotonic()
    try:
        l.comm_init_rank(2, idb if idb else l.get_unique_id(), 1)
    except errors.InvalidUsage as e:
        return e.last_error, time.monotonic() - t0
    return "no error", time.monotonic() - t0


@pytest.mark.timeout(60)
@pytest.mark.parametrize("tag", ["other", ""])
def test_a_rank_of_another_tag_fails_its_init_at_once_naming_both(tag):
    from pycoll._bindings import UniqueId

    uid = UniqueId(bytes(lib().get_unique_id()))  # made under this process's tag
    here = os.environ["PYCOLL_HOST_SHM_TAG"]
    (res,) = run_ranks(_init_under, 1, uid, _tag(tag) if tag else "", timeout=30)
    text, took = res
    assert took < 2.0, res
    assert f"PYCOLL_HOST_SHM_TAG={here}" in text, text
    assert (f"PYCOLL_HOST_SHM_TAG={_tag(tag)}" if tag else "this one has it unset") in text, text


@pytest.mark.parametrize("value", ["a-b", "x" * 16, "é", "a b"])
def test_an_invalid_tag_is_refused_naming_it(value):
    with pytest.raises(ValueError, match="PYCOLL_HOST_SHM_TAG must be 1 to 15 of A-Z"):
        _settings.check_host_library({"PYCOLL_HOST_SHM_TAG": value})
    _settings.check_host_library({"PYCOLL_HOST_SHM_TAG": " ok_1 \n"})  # the blanks the library skips too
