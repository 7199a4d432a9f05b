"""The loader and the Library against small fake NCCL-ABI libraries built here with gcc.

The fakes (tests/bindings/fake_nccl.c) export a few functions with scripted behaviour and lack most, which
shows what the bindings do with missing symbols, errors, ncclInProgress, background writes into a
CommSlot and a slow call (the GIL must be released).
"""

from __future__ import annotations

import ctypes
import os
import shutil
import subprocess
import sys
import threading
import time

import pytest
from helpers import REPO
from helpers.fake_nccl import SOURCE, Fake, _gcc
from helpers.mp import held_by_another_thread, in_a_fork

import pycoll
from pycoll._bindings import _nccl

pytestmark = pytest.mark.timeout(60)

HERE = os.path.dirname(os.path.abspath(__file__))


@pytest.fixture
def fake(fakes):
    f = Fake(fakes["nccl"])
    yield f
    f.ctl.fakeSetNextResult(0)
    f.ctl.fakeSetDelayMs(0)


# --- loading ---------------------------------------------------------------------------------
def test_load_kind_version_and_cache(fakes):
    lib = _nccl.load(fakes["nccl"])
    assert lib.kind == "nccl"
    assert lib.version == 22703 and lib.version_tuple == (2, 27, 3)
    assert lib.path == os.path.realpath(fakes["nccl"])
    assert _nccl.load(fakes["nccl"]) is lib
    # another spelling of the same file resolves to the same Library
    other = os.path.join(os.path.dirname(fakes["nccl"]), ".", os.path.basename(fakes["nccl"]))
    assert _nccl.load(other) is lib
    assert lib in _nccl.loaded()


def test_has_and_missing(fakes):
    lib = _nccl.load(fakes["nccl"])
    assert lib.has("ncclAllReduce") and lib.has("ncclCommShrink")
    assert not lib.has("ncclCommRevoke") and not lib.has("ncclCommGrow")
    assert lib.has("fakeSetDelayMs")  # any symbol can be asked about
    assert not lib.has("noSuchSymbolAnywhere")
    missing = lib.missing
    assert "ncclCommRevoke" in missing and "ncclCommGrow" in missing and "ncclAlltoAll" in missing
    assert "ncclAllReduce" not in missing and "ncclGetVersion" not in missing
    assert set(missing) <= set(_nccl.FUNCTIONS)
    assert missing == sorted(missing)


def test_missing_function_raises_not_supported(fakes):
    lib = _nccl.load(fakes["nccl"])
    with pytest.raises(pycoll.NotSupported) as info:
        lib.comm_revoke(0x1000)
    exc = info.value
    assert exc.function == "ncclCommRevoke" and exc.introduced == "2.28.7"
    assert exc.library == lib.path
    assert "ncclCommRevoke" in str(exc) and "2.28.7" in str(exc) and lib.path in str(exc)
    assert isinstance(exc, NotImplementedError)
    with pytest.raises(pycoll.NotSupported, match="ncclCommGrow.*2.29"):
        lib.comm_grow(0x1000, 4, None, -1)
    with pytest.raises(pycoll.NotSupported, match="ncclAlltoAll.*2.28"):
        lib.all_to_all(1, 2, 3, 7, 0x1000)
    # the Communicator's compiled call of a function the library lacks: the binding's method says so
    from pycoll import _core

    for what, function in (("all_to_all", "ncclAlltoAll"), ("gather", "ncclGather"), ("scatter", "ncclScatter")):
        with pytest.raises(pycoll.NotSupported, match=f"{function}.*2.28"):
            _core.library_call(lib, what, (), 1, 2, 3, 7)(0x1000, 0)
    with pytest.raises(pycoll.NotSupported, match="pycollStreamCreate"):
        lib.host_stream_create()


def test_library_without_nccl_get_version(fakes):
    with pytest.raises(pycoll.LibraryError, match="ncclGetVersion") as info:
        _nccl.load(fakes["plain"])
    assert info.value.path == os.path.realpath(fakes["plain"])
    assert all(lib.path != info.value.path for lib in _nccl.loaded())


def test_missing_path(tmp_path):
    path = str(tmp_path / "nowhere" / "libnccl.so.2")
    with pytest.raises(pycoll.LibraryError, match="no such file") as info:
        _nccl.load(path)
    assert path in str(info.value)
    assert isinstance(info.value, OSError)


def test_a_library_cut_short_is_refused_before_dlopen(tmp_path):
    """dlopen of a half-copied library maps past its end: the process died of SIGBUS (pycoll.info too)."""
    whole = open(os.path.join(REPO, "pycoll", "_bindings", "libpycoll_host.so"), "rb").read()
    for size in (100, 1000, 4096, 20000, 150000):  # (its loadable segments end before its last quarter)
        path = str(tmp_path / f"libcut{size}.so")
        open(path, "wb").write(whole[:size])
        code = ("import sys, pycoll; from pycoll import _bindings as B\n"
                "try: B.load(sys.argv[1])\nexcept pycoll.LibraryError as e: print(e)")
        out = subprocess.run([sys.executable, "-c", code, path], capture_output=True, text=True, timeout=60)
        assert out.returncode == 0 and out.stdout.startswith(path), (size, out)
        if size >= 64:  # long enough to hold the ELF header that says how long it should be
            assert "the file is cut short" in out.stdout, (size, out.stdout)


def test_unknown_name_says_what_the_linker_said():
    with pytest.raises(pycoll.LibraryError, match="libpycoll_does_not_exist.so"):
        _nccl.load("libpycoll_does_not_exist.so")
    with pytest.raises(pycoll.LibraryError, match="-weird-name"):
        _nccl.load("-weird-name")


def test_environment_variable_selects_the_library(fakes, monkeypatch):
    monkeypatch.setenv("PYCOLL_NCCL_LIBRARY", fakes["rccl"])
    lib = _nccl.load()
    assert lib.path == os.path.realpath(fakes["rccl"])
    monkeypatch.setenv("PYCOLL_NCCL_LIBRARY", fakes["plain"])
    with pytest.raises(pycoll.LibraryError):
        _nccl.load()


def test_two_libraries_at_once(fakes):
    a = _nccl.load(fakes["nccl"])
    b = _nccl.load(fakes["host"])
    c = _nccl.load(fakes["rccl"])
    assert (a.kind, b.kind, c.kind) == ("nccl", "host", "rccl")
    # each Library calls into its own object (same symbol names, RTLD_LOCAL)
    assert (a.get_version(), b.get_version(), c.get_version()) == (22703, 23203, 23004)
    assert b.host_version() == 4242
    with pytest.raises(pycoll.NotSupported, match="pycollHostGetVersion"):
        a.host_version()
    assert {a, b, c} <= set(_nccl.loaded())


def test_library_cannot_be_built_directly():
    with pytest.raises(TypeError):
        _nccl.Library()
    with pytest.raises(TypeError):
        _nccl.CommSlot()


def test_library_pickles_by_path(fakes):
    import pickle

    lib = _nccl.load(fakes["nccl"])
    assert pickle.loads(pickle.dumps(lib)) is lib


# --- calls, errors, statuses --------------------------------------------------------------------
def test_arguments_reach_the_library(fake):
    lib = fake.lib
    assert lib.all_reduce(0x10, 0x20, 1000, _nccl.DataType.Float32, _nccl.RedOp.Max, 0x1000, 0x99) == 0
    assert fake.last_args()[:7] == [0x10, 0x20, 1000, 7, 2, 0x1000, 0x99]
    assert lib.all_reduce(0x10, 0x20, 5, 9, 5, 0x1000) == 0  # dynamic op id, default stream 0
    assert fake.last_args()[:7] == [0x10, 0x20, 5, 9, 5, 0x1000, 0]
    assert lib.send(0x10, 3, 0, 2, 0x1000) == 0
    assert fake.last_args()[:6] == [0x10, 3, 0, 2, 0x1000, 0]


def test_error_carries_code_function_strings_and_library(fake):
    fake.ctl.fakeSetNextResult(5)
    with pytest.raises(pycoll.InvalidUsage) as info:
        fake.lib.comm_count(0x1000)
    exc = info.value
    assert exc.code == 5 and exc.function == "ncclCommCount"
    assert exc.error_string == "fake: invalid usage"
    assert exc.last_error == "fake: CommCount failed on purpose"
    assert exc.library == fake.lib.path
    fake.ctl.fakeSetNextResult(6)
    with pytest.raises(pycoll.RemoteError) as info:
        fake.lib.all_reduce(1, 2, 3, 7, 0, 0x1000)
    assert isinstance(info.value, pycoll.CommFailure)
    assert info.value.last_error == "fake: all-reduce failed on purpose"


def test_in_progress_is_a_status_not_success(fake):
    fake.ctl.fakeSetNextResult(7)
    assert fake.lib.group_end() == _nccl.IN_PROGRESS
    assert fake.lib.all_reduce(1, 2, 3, 7, 0, 0x1000) == _nccl.IN_PROGRESS
    comm, status = fake.lib.comm_init_rank_config(2, _nccl.UniqueId(), 0, _nccl.Config(blocking=0))
    assert (comm, status) == (0x2000, _nccl.IN_PROGRESS)
    # a call whose output is needed cannot return IN_PROGRESS silently
    with pytest.raises(pycoll.InProgressError):
        fake.lib.comm_count(0x1000)
    with pytest.raises(pycoll.InProgressError) as info:
        fake.lib.comm_init_rank(2, _nccl.UniqueId(), 1)
    assert info.value.comm == 0x1000
    # an init error names the communicator NCCL left behind (to be aborted), 0 if none
    fake.ctl.fakeSetNextResult(2)
    with pytest.raises(pycoll.NCCLSystemError) as info:
        fake.lib.comm_init_rank_config(2, _nccl.UniqueId(), 0, _nccl.Config(blocking=0))
    assert info.value.comm == 0x2000
    with pytest.raises(pycoll.NCCLSystemError) as info:
        fake.lib.comm_init_rank(2, _nccl.UniqueId(), 1)
    assert info.value.comm == 0 and info.value.last_error == "fake: init failed on purpose"
    fake.ctl.fakeSetNextResult(0)
    assert fake.lib.group_end() == _nccl.SUCCESS


def test_async_error_is_returned_not_raised(fake):
    fake.ctl.fakeSetAsyncState(6)
    assert fake.lib.comm_get_async_error(0x1000) == 6
    fake.ctl.fakeSetAsyncState(7)
    assert fake.lib.comm_get_async_error(0x1000) == _nccl.IN_PROGRESS
    with pytest.raises(pycoll.InvalidArgument, match="GetAsyncError on NULL"):
        fake.lib.comm_get_async_error(0)


def test_config_bytes_reach_the_library(fake):
    cfg = _nccl.Config(blocking=0, commName="pycoll-test", maxCTAs=8)
    fake.lib.comm_init_rank_config(4, _nccl.UniqueId(), 3, cfg)
    args = fake.last_args()
    assert args[:3] == [4, 3, cfg.address]
    buf = (ctypes.c_ubyte * 256)()
    size = fake.ctl.fakeConfigCopy(buf)
    assert size == _nccl.CONFIG_SIZE == 120
    assert bytes(buf[:size]) == ctypes.string_at(cfg.address, size)
    fake.lib.comm_init_rank_config(4, _nccl.UniqueId(), 3)
    assert fake.last_args()[2] == 0  # config None -> NULL


def test_unique_id_passed_by_value(fake):
    uid = fake.lib.get_unique_id()
    assert bytes(uid) == bytes(range(128))
    assert fake.lib.comm_init_rank(2, uid, 1) == 0x1000
    assert fake.last_args()[:4] == [2, 1, 0, 127]


@pytest.mark.parametrize("version", [22809, 22903])
def test_dev_comm_create_only_where_the_requirements_are_versioned(tmp_path, version):
    """NCCL 2.28 reads ncclDevCommRequirements without the size/magic/version header that pycoll fills
    (2.29's layout): its first word would be taken for a list pointer. 2.28 is refused before the call."""
    path = _gcc(str(tmp_path), f"libfake_{version}.so", SOURCE, "-DFAKE_DEVAPI", f"-DFAKE_VERSION={version}")
    f = Fake(path)
    reqs = _nccl.DevCommRequirements(lsaBarrierCount=1)
    if version < 22900:
        with pytest.raises(pycoll.NotSupported, match=r"ncclDevCommRequirements .*2\.29") as exc:
            f.lib.dev_comm_create(0x1000, reqs)
        assert "NCCL 2.28.9" in str(exc.value) and f.last_args()[:3] == [0, 0, 0]  # never called
    else:
        dc = f.lib.dev_comm_create(0x1000, reqs)
        assert f.last_args()[:3] == [0x1000, _nccl.DEV_COMM_REQUIREMENTS_SIZE, 0xCAFEBEEF]  # size, NCCL_API_MAGIC
        f.lib.dev_comm_destroy(0x1000, dc)


# --- CommSlot: the library writes the new communicator later ------------------------------------
def test_blocking_split_writes_slot_at_once(fake):
    slot, status = fake.lib.comm_split(0x1000, 3, 0)
    assert status == 0 and slot.value == 0x3003 and not slot.pending
    slot, status = fake.lib.comm_split(0x1000, _nccl.SPLIT_NOCOLOR, 0)
    assert status == 0 and slot.value == 0


def test_nonblocking_split_slot_written_in_background(fake):
    fake.ctl.fakeSetNextResult(7)
    fake.ctl.fakeSetDelayMs(200)
    slot, status = fake.lib.comm_split(0x1000, 2, 1)
    assert status == _nccl.IN_PROGRESS
    assert slot.value == 0 and slot.pending
    assert slot in fake.lib.pending_slots
    deadline = time.monotonic() + 10
    while slot.value == 0 and time.monotonic() < deadline:
        time.sleep(0.01)
    assert slot.value == 0x3002 and not slot.pending
    assert slot not in fake.lib.pending_slots


def test_a_group_is_its_threads_own(fake):
    """A split in this thread's open group is the group's (tracked from its end); another thread's split at the same
    time is not in any group (tracked at once); a group that ends still issuing tracks its slots until written."""
    fake.ctl.fakeSetNextResult(7)
    fake.ctl.fakeSetDelayMs(300)
    assert fake.lib.group_start() == 0
    try:
        mine, status = fake.lib.comm_split(0x1000, 2, 1)
        assert status == _nccl.IN_PROGRESS and not mine.pending  # the group's: nothing is tracked before its end
        other = {}
        t = threading.Thread(target=lambda: other.update(r=fake.lib.comm_split(0x1000, 3, 0)))
        t.start()
        t.join(10)
        theirs, status = other["r"]
        assert status == _nccl.IN_PROGRESS and theirs.pending and theirs in fake.lib.pending_slots
        assert mine not in fake.lib.pending_slots
    finally:
        assert fake.lib.group_end() == _nccl.IN_PROGRESS  # still issuing
    assert mine.pending and mine in fake.lib.pending_slots
    deadline = time.monotonic() + 10
    while (mine.value == 0 or theirs.value == 0) and time.monotonic() < deadline:
        time.sleep(0.01)
    assert (mine.value, theirs.value) == (0x3002, 0x3003) and not fake.lib.pending_slots
    fake.ctl.fakeSetNextResult(0)
    fake.ctl.fakeSetDelayMs(0)
    assert fake.lib.group_start() == 0 and fake.lib.group_end() == 0  # a new group, nothing left of the last


def test_a_thread_gone_inside_a_group_leaves_it_to_nobody(fake):
    """A thread that ended with its group open takes the group with it: the threads after it (which may get its
    ident again) and the thread that opened a group before it are each in their own group or none."""
    fake.ctl.fakeSetNextResult(7)  # a split in progress: tracked at once outside a group, at the group's end inside
    fake.ctl.fakeSetDelayMs(300)
    slots = []

    def split_outside_a_group(key):
        slot, status = fake.lib.comm_split(0x1000, key, 0)
        slots.append(slot)
        assert status == _nccl.IN_PROGRESS
        return slot.pending and slot in fake.lib.pending_slots

    assert fake.lib.group_start() == 0
    try:
        outside = []
        opener = threading.Thread(target=fake.lib.group_start)  # its group never ends
        opener.start()
        opener.join(10)
        for key in range(11, 31):  # threads one after the other: glibc gives the next the ident of the last gone
            t = threading.Thread(target=lambda k=key: outside.append(split_outside_a_group(k)))
            t.start()
            t.join(10)
        assert outside == [True] * 20
        mine, _ = fake.lib.comm_split(0x1000, 10, 0)
        assert not mine.pending  # still this thread's group
    finally:
        assert fake.lib.group_end() == _nccl.IN_PROGRESS
    assert split_outside_a_group(31)  # this thread's group ended
    deadline = time.monotonic() + 10
    while any(slot.value == 0 for slot in slots + [mine]) and time.monotonic() < deadline:
        time.sleep(0.01)
    assert not fake.lib.pending_slots
    fake.ctl.fakeSetNextResult(0)
    fake.ctl.fakeSetDelayMs(0)


def test_pending_slot_survives_being_dropped(fake):
    import gc

    fake.ctl.fakeSetNextResult(7)
    fake.ctl.fakeSetDelayMs(300)
    before = len(fake.lib.pending_slots)
    slot, _ = fake.lib.comm_split(0x1000, 5, 0)
    del slot
    gc.collect()
    # the library still holds the slot, so the background write lands in live memory
    held = fake.lib.pending_slots
    assert len(held) == before + 1
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and any(s.value == 0 for s in held):
        time.sleep(0.01)
    assert [s.value for s in held if s.value == 0x3005], "the background write did not land"
    assert len(fake.lib.pending_slots) <= before  # reading the value non-zero released it


def test_shrink_exclude_list_is_copied_and_sorted_in_background(fake):
    fake.ctl.fakeSetNextResult(7)
    fake.ctl.fakeSetDelayMs(200)
    ranks = [7, 2, 5]
    slot, status = fake.lib.comm_shrink(0x1000, ranks, None, _nccl.SHRINK_ABORT)
    assert status == _nccl.IN_PROGRESS
    assert fake.last_args()[:3] == [0x1000, 3, 1]
    del ranks
    deadline = time.monotonic() + 10
    while slot.value == 0 and time.monotonic() < deadline:
        time.sleep(0.01)
    assert slot.value == 0x4000
    assert fake.sorted_exclude() == [2, 5, 7]


# --- the GIL ---------------------------------------------------------------------------------
def test_gil_released_during_a_slow_call(fake):
    """A watchdog-style thread polls and aborts while another thread sleeps 0.8 s inside the library."""
    fake.ctl.fakeSetDelayMs(800)
    ticks = []
    span = []
    stop = threading.Event()

    aborted = []

    def spin():
        while not stop.is_set():
            fake.lib.comm_get_async_error(0x1000)
            ticks.append(time.monotonic())
            if not aborted and len(ticks) > 1000:
                fake.lib.comm_abort(0x1000)
                aborted.append(time.monotonic())

    def call():
        t0 = time.monotonic()
        fake.lib.all_reduce(1, 2, 3, 7, 0, 0x1000)
        span.extend([t0, time.monotonic()])

    watcher = threading.Thread(target=spin)
    watcher.start()
    caller = threading.Thread(target=call)
    caller.start()
    caller.join(10)
    stop.set()
    watcher.join(10)
    t0, t1 = span
    assert t1 - t0 >= 0.7
    inside = [t for t in ticks if t0 + 0.1 < t < t1 - 0.1]
    # with the GIL held, the watcher could not run at all between t0 and t1
    assert len(inside) >= 50, f"only {len(inside)} calls while another thread was inside ncclAllReduce"
    assert aborted and aborted[0] < t1, "comm_abort could not run while another thread was inside a call"


def test_load_in_a_fresh_interpreter(fakes):
    code = (
        "import sys; from pycoll._bindings import load; lib = load(sys.argv[1]);"
        "print(lib.kind, lib.get_version())"
    )
    env = dict(os.environ, PYTHONPATH=REPO)
    out = subprocess.run([sys.executable, "-c", code, fakes["host"]], capture_output=True, text=True,
                         timeout=60, env=env)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["host", "23203"]


# --- bad input: a clear Python exception before any C call ---------------------------------------
U = _nccl.UniqueId()
BAD_INPUT = [
    ("all_reduce", (1, 2, -1, 7, 0, 0x1000), ValueError, "count must be >= 0"),
    ("all_reduce", (1, 2, 2**64, 7, 0, 0x1000), ValueError, "count is too large"),
    ("all_reduce", (1, 2, 3, 12, 0, 0x1000), ValueError, "unknown datatype 12"),
    ("all_reduce", (1, 2, 3, -1, 0, 0x1000), ValueError, "unknown datatype -1"),
    ("all_reduce", (1, 2, 3, 7, -1, 0x1000), ValueError, "unknown op -1"),
    ("all_reduce", (1, 2, 3, 7, 2**31, 0x1000), ValueError, "unknown op"),
    ("all_reduce", (1, 2, 3, 7, 0, None), TypeError, "comm must be"),
    ("all_reduce", (1, 2, 3, 7, 0, "0x1000"), TypeError, "comm must be"),
    ("all_reduce", (-5, 2, 3, 7, 0, 0x1000), ValueError, "sendbuff must be"),
    ("all_reduce", (1, 2**64, 3, 7, 0, 0x1000), ValueError, "recvbuff must be"),
    ("all_reduce", (1, 2, 3, 7, 0, 0x1000, 1.5), TypeError, "stream must be"),
    ("all_reduce", (1, 2, 3.0, 7, 0, 0x1000), TypeError, "count must be"),
    ("all_reduce", (1, 2, 3, "float32", 0, 0x1000), TypeError, "datatype must be"),
    ("broadcast", (1, 2, 3, 7, -1, 0x1000), ValueError, "root must be >= 0"),
    ("reduce", (1, 2, 3, 7, 0, -2, 0x1000), ValueError, "root must be >= 0"),
    ("send", (1, 3, 7, -1, 0x1000), ValueError, "peer must be >= 0"),
    ("recv", (1, 3, 7, 0, None), TypeError, "comm must be"),
    ("all_gather", (1, 2, -3, 7, 0x1000), ValueError, "sendcount must be >= 0"),
    ("reduce_scatter", (1, 2, -3, 7, 0, 0x1000), ValueError, "recvcount must be >= 0"),
    ("comm_init_rank", (0, U, 0), ValueError, "nranks must be in"),
    ("comm_init_rank", (2, U, -1), ValueError, "rank must be >= 0"),
    ("comm_init_rank", (2, U, 2), ValueError, "rank must be < nranks"),
    ("comm_init_rank", (2, bytes(128), 0), TypeError, "unique_id must be a UniqueId"),
    ("comm_init_rank", (2, None, 0), TypeError, "unique_id must be a UniqueId"),
    ("comm_init_rank_config", (2, U, 0, "blocking=0"), TypeError, "config must be a Config"),
    ("comm_init_rank_scalable", (2, 0, []), ValueError, "at least one UniqueId"),
    ("comm_init_rank_scalable", (2, 0, [U, U, U]), ValueError, "more than nranks"),
    ("comm_init_rank_scalable", (2, 0, [U, b"x"]), TypeError, r"unique_ids\[1\]"),
    ("comm_init_all", (0,), ValueError, "ndev must be in"),
    ("comm_init_all", (2, [0]), ValueError, "devlist holds 1"),
    ("comm_init_all", (1, [-1]), ValueError, r"devlist\[0\] must be >= 0"),
    ("comm_split", (0x1000, -2, 0), ValueError, "color must be >= 0 or SPLIT_NOCOLOR"),
    ("comm_split", (None, 0, 0), TypeError, "comm must be"),
    ("comm_shrink", (0x1000, []), ValueError, "at least one rank"),
    ("comm_shrink", (0x1000, [-1]), ValueError, "must be >= 0"),
    ("comm_shrink", (0x1000, "12"), TypeError, "sequence of ints"),
    ("comm_shrink", (0x1000, [1, None]), TypeError, "sequence of ints"),
    ("comm_shrink", (0x1000, [1, 1]), ValueError, "duplicates"),
    ("comm_shrink", (0x1000, [1], None, -1), ValueError, "flags must be >= 0"),
    ("comm_grow", (0x1000, 4, None, -2), ValueError, "rank must be in"),
    ("comm_grow", (0x1000, 4, None, 3), ValueError, "existing rank"),
    ("comm_grow", (0, 4, None, 3), ValueError, "new rank"),
    ("comm_grow", (0, 4, U, 4), ValueError, "rank must be < nranks"),
    ("comm_mem_stats", (0x1000, 4), ValueError, "stat must be in"),
    ("comm_revoke", (0x1000, -1), ValueError, "flags must be >= 0"),
    ("red_op_create_pre_mul_sum", (0x10, 7, 2, 0x1000), ValueError, "residence must be in"),
    ("red_op_create_pre_mul_sum", (0, 7, 1, 0x1000), ValueError, "scalar must be the address"),
    ("red_op_destroy", (-1, 0x1000), ValueError, "unknown op -1"),
    ("wait_signal", ([], 0x1000), ValueError, "at least one"),
    ("wait_signal", ([(1, 2)], 0x1000), TypeError, r"descs\[0\]"),
    ("comm_window_register", (0x1000, 0x10, -1), ValueError, "size must be >= 0"),
    ("get_error_string", ("x",), TypeError, "result must be"),
    ("has", (5,), TypeError, "function must be a str"),
    ("host_stream_destroy", (0,), ValueError, "not 0"),
    ("host_event_record", (None, 0), TypeError, "event must be"),
    ("param_get", (5,), TypeError, "key must be a str"),
    ("set_encryption", (2,), ValueError, "mode must be in"),
    ("set_encryption", (1,), ValueError, "needs a non-empty psk"),
    ("set_encryption", (1, 5), TypeError, "psk must be"),
]


@pytest.mark.parametrize("method, args, exc, text", BAD_INPUT, ids=[f"{m}-{i}" for i, (m, *_) in enumerate(BAD_INPUT)])
def test_bad_input(fake, method, args, exc, text):
    fake.lib.all_reduce(0xAA, 0xBB, 1, 0, 0, 0xCC)  # a recorded call to compare against
    before = fake.last_args()
    with pytest.raises(exc, match=text):
        getattr(fake.lib, method)(*args)
    assert fake.last_args() == before, "the C function was called despite the bad input"


@pytest.mark.parametrize("spec, exc", [(123, TypeError), ("", ValueError), (None, None)])
def test_load_bad_spec(spec, exc, monkeypatch, fakes):
    if exc is None:
        monkeypatch.setenv("PYCOLL_NCCL_LIBRARY", fakes["nccl"])
        assert _nccl.load(spec).path == os.path.realpath(fakes["nccl"])
        return
    with pytest.raises(exc):
        _nccl.load(spec)


# --- keyword lookups, in fresh interpreters (the "nccl"/"rccl" keywords are cached per process) ---
def _run(code, *args, env=None):
    full_env = dict(os.environ, PYTHONPATH=REPO)
    full_env.pop("PYCOLL_NCCL_LIBRARY", None)
    full_env.update(env or {})
    out = subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True, timeout=60,
                         env=full_env)
    assert out.returncode == 0, out.stderr
    return out.stdout.split()


def test_nccl_keyword_prefers_an_already_loaded_libnccl(fakes, tmp_path):
    # e.g. torch's: any object named libnccl.so* already in the process wins over the wheel
    fake_nccl = tmp_path / "libnccl.so.2"
    shutil.copy(fakes["nccl"], fake_nccl)
    code = (
        "import ctypes, sys; ctypes.CDLL(sys.argv[1]);"
        "from pycoll._bindings import load; lib = load('nccl'); print(lib.path, lib.version)"
    )
    assert _run(code, str(fake_nccl)) == [str(fake_nccl), "22703"]


def test_rccl_keyword(fakes, tmp_path):
    lib_dir = tmp_path / "rocm" / "lib"
    lib_dir.mkdir(parents=True)
    shutil.copy(fakes["rccl"], lib_dir / "librccl.so.1")
    code = "from pycoll._bindings import load; lib = load('rccl'); print(lib.kind, lib.path)"
    assert _run(code, env={"ROCM_PATH": str(tmp_path / "rocm")}) == ["rccl", str(lib_dir / "librccl.so.1")]
    # already loaded under another directory: that one is used
    other = tmp_path / "librccl.so.1"
    shutil.copy(fakes["rccl"], other)
    code = "import ctypes, sys; ctypes.CDLL(sys.argv[1]); from pycoll._bindings import load; print(load('rccl').path)"
    assert _run(code, str(other)) == [str(other)]


def test_keyword_failure_lists_what_was_tried(tmp_path):
    code = (
        "from pycoll._bindings import load\n"
        "from pycoll.errors import LibraryError\n"
        "try:\n    load('rccl')\nexcept LibraryError as e:\n    print(str(e).replace(' ', '_'))\n"
    )
    (text,) = _run(code, env={"ROCM_PATH": str(tmp_path)})
    assert "already_loaded:_none" in text and "librccl.so.1" in text and str(tmp_path) in text


def test_host_keyword_names_the_host_library():
    try:
        lib = _nccl.load("host")
    except pycoll.LibraryError as exc:
        assert "libpycoll_host.so" in str(exc)
    else:
        assert lib.kind == "host" and os.path.basename(lib.path) == "libpycoll_host.so"


def test_collective_with_a_per_call_config(fakes):
    cc = _nccl.CollConfig(maxCTAs=4, algSelection="ring")
    plain = Fake(fakes["nccl"])
    with pytest.raises(pycoll.NotSupported, match="ncclAllReduceConfig.*2.31"):
        plain.lib.all_reduce(1, 2, 3, 7, 0, 0x1000, 0, cc)
    host = Fake(fakes["host"])
    assert host.lib.all_reduce(1, 2, 3, 7, 0, 0x1000, 0x5, config=cc) == 0
    assert host.last_args()[:8] == [1, 2, 3, 7, 0, 0x1000, 0x5, cc.address]
    with pytest.raises(TypeError, match="CollConfig"):
        host.lib.all_reduce(1, 2, 3, 7, 0, 0x1000, 0, _nccl.Config())


def test_host_stream_and_event_wrappers(fakes):
    host = Fake(fakes["host"])
    lib = host.lib
    s = lib.host_stream_create()
    e1, e2 = lib.host_event_create(), lib.host_event_create()
    assert s and e1 and e2 and len({s, e1, e2}) == 3
    assert [lib.host_stream_query(s) for _ in range(3)] == [False, False, True]
    lib.host_event_record(e1, s)
    assert host.last_args()[:2] == [e1, s]
    lib.host_event_record(e2, 0)  # stream 0 (NULL) is allowed here
    assert host.last_args()[:2] == [e2, 0]
    assert [lib.host_event_query(e1) for _ in range(3)] == [False, False, True]
    lib.host_stream_wait_event(s, e1)
    assert host.last_args()[:2] == [s, e1]
    lib.host_stream_synchronize(s)
    lib.host_event_synchronize(e2)
    assert host.last_args()[0] == e2
    assert lib.host_event_elapsed_ms(e1, e2) == pytest.approx(1.5)
    with pytest.raises(pycoll.InvalidArgument, match="same event twice"):
        lib.host_event_elapsed_ms(e1, e1)
    lib.host_event_destroy(e1)
    lib.host_event_destroy(e2)
    lib.host_stream_destroy(s)


def test_fake_and_real_libnccl_side_by_side(fakes):
    """cuda.pathfinder loads libnccl RTLD_GLOBAL; calls through each Library still reach its own object."""
    try:
        real = _nccl.load("nccl")
    except pycoll.LibraryError:
        pytest.skip("no real libnccl here")
    fake = _nccl.load(fakes["nccl"])
    assert real is not fake and real.path != fake.path
    assert fake.get_version() == 22703 and real.get_version() == real.version != 22703
    assert fake.get_error_string(4) == "fake: invalid argument"
    assert real.get_error_string(4).startswith("invalid argument")


@pytest.mark.timeout(60)
def test_a_forked_child_loads_while_a_parent_thread_was_loading():
    """A thread of the parent inside load() at the fork: the child's first load waited forever for its lock."""
    with held_by_another_thread(_nccl._lock):  # as load() holds it across dlopen
        assert in_a_fork(lambda: _nccl.load("host").version).startswith("ok "), "the child's load"


def test_a_relative_path_is_loaded_from_the_working_folder_of_the_call(tmp_path, monkeypatch):
    """load('./libx.so') was remembered by its text: after a chdir it gave the other folder's library."""
    whole = os.path.join(REPO, "pycoll", "_bindings", "libpycoll_host.so")
    for d in "ab":
        (tmp_path / d).mkdir()
        shutil.copy(whole, tmp_path / d / "libx.so")
    monkeypatch.chdir(tmp_path / "a")
    a = _nccl.load("./libx.so")
    monkeypatch.chdir(tmp_path / "b")
    b = _nccl.load("./libx.so")
    assert (a.path, b.path) == (str(tmp_path / "a" / "libx.so"), str(tmp_path / "b" / "libx.so"))
