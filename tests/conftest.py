"""Shared test fixtures: every test is checked for leaked /dev/shm segments and stray children.

The suite runs in one process or in pytest-xdist workers (``-n 2``, README's test command); each test process has
a segment tag and a dump folder of its own (pytest_configure)."""

from __future__ import annotations

import atexit
import os
import shutil
import tempfile
import time

import pytest
from helpers.fake_nccl import build_fakes
from helpers.mp import shm_entries


@pytest.fixture(scope="session")
def fakes(tmp_path_factory):
    """Paths of the fake NCCL-ABI libraries (helpers/fake_nccl.py), built once per session."""
    return build_fakes(str(tmp_path_factory.mktemp("fakenccl")))


def pytest_addoption(parser):
    parser.addoption("--runslow", action="store_true", default=False, help="also run tests marked slow")


def pytest_configure(config):
    # Each test process (this one, or each pytest-xdist worker: PYTEST_XDIST_WORKER) has a host-library segment tag
    # and a dump folder of its own: the leak checks then see this process's own segments only, a rendezvous of
    # another worker (or of another pycoll job on the machine) does not sweep a segment a test expects to find, and
    # no test reads another's dumps. The run's tag and folder are the caller's (PYCOLL_HOST_SHM_TAG,
    # PYCOLL_FR_DUMP_DIR), else its own (t<pid>, a temporary folder); a worker adds its name to both (the controller
    # decides them first: the workers inherit PYCOLL_TESTS_OWN_*).
    worker = os.environ.get("PYTEST_XDIST_WORKER", "")
    tag = os.environ.get("PYCOLL_TESTS_OWN_TAG")
    if tag is None:
        tag = os.environ.get("PYCOLL_HOST_SHM_TAG", "").lstrip(" \t").rstrip(" \t\n") or f"t{os.getpid()}"
        os.environ["PYCOLL_TESTS_OWN_TAG"] = tag
    suffix = f"_{worker}" if worker else ""
    os.environ["PYCOLL_HOST_SHM_TAG"] = tag[:15 - len(suffix)] + suffix
    # failing communicators dump their flight recorder; keep the dumps out of the home directory
    folder = os.environ.get("PYCOLL_TESTS_OWN_FR_DIR")
    if folder is None:
        folder = os.environ.get("PYCOLL_FR_DUMP_DIR", "").strip()  # empty: unset, as pycoll reads it
        if not folder:
            folder = config._pycoll_fr_dir = tempfile.mkdtemp(prefix="pycoll-fr-tests-")
            # a communicator of a test that failed and was closed can still be alive when the session ends:
            # pycoll's exit dump (its handler registered later, so run earlier) then writes into the folder again
            atexit.register(shutil.rmtree, folder, True)
        os.environ["PYCOLL_TESTS_OWN_FR_DIR"] = folder
    if worker:
        folder = os.path.join(folder, worker)
        os.makedirs(folder, exist_ok=True)
    os.environ["PYCOLL_FR_DUMP_DIR"] = folder


def pytest_unconfigure(config):
    folder = getattr(config, "_pycoll_fr_dir", None)
    if folder:
        shutil.rmtree(folder, ignore_errors=True)


def pytest_collection_modifyitems(config, items):
    if config.getoption("--runslow") or os.environ.get("PYCOLL_TEST_FULL") == "1":
        return
    skip = pytest.mark.skip(reason="slow: run with --runslow or PYCOLL_TEST_FULL=1")
    for item in items:
        if "slow" in item.keywords:
            item.add_marker(skip)


def _children():
    """Live descendants of this process (zombies excluded)."""
    me = os.getpid()
    kids = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        state, ppid = fields[0], int(fields[1])
        if ppid == me and state != "Z":
            kids.append(int(entry))
    return kids


@pytest.fixture(autouse=True)
def no_leaks(request):
    """Fail a test that leaves pycoll shared-memory segments or child processes behind."""
    before = set(shm_entries())
    kids_before = set(_children())
    yield
    deadline = time.monotonic() + 2.0
    while True:
        leaked = sorted(set(shm_entries()) - before)
        kids = sorted(set(_children()) - kids_before)
        # the multiprocessing forkserver and resource tracker are long-lived helpers, not leaks
        kids = [k for k in kids if not _is_forkserver(k)]
        if (not leaked and not kids) or time.monotonic() > deadline:
            break
        time.sleep(0.05)
    assert not leaked, f"/dev/shm segments left behind: {leaked}"
    assert not kids, f"child processes left behind: {kids}"


def _is_forkserver(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            cmdline = f.read()
        return b"multiprocessing.forkserver" in cmdline or b"multiprocessing.resource_tracker" in cmdline
    except OSError:
        return False
