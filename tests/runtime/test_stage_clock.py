"""The compiled operations' stage clock (pycoll._core.stage_clock): what benchmarks/overhead.py --breakdown reads."""

import threading
import time

import numpy as np
import pytest

import pycoll
from pycoll import _core


@pytest.fixture
def comm():
    c = pycoll.init(0, 1, unique_id=pycoll.get_unique_id(backend="host"), backend="host", name="stage-clock")
    yield c
    _core.stage_clock(False)
    c.destroy()


@pytest.mark.timeout(60)
def test_the_stages_of_this_threads_operations_add_up_to_less_than_their_time(comm):
    a, b = np.ones(2, np.float32), np.zeros(2, np.float32)
    comm.all_reduce(a, b)
    assert _core.stage_clock()["operations"] == 0  # off until started
    _core.stage_clock(True)
    t0 = time.perf_counter_ns()
    for _ in range(200):
        comm.all_reduce(a, b)
    elapsed = time.perf_counter_ns() - t0
    # another thread's operations are not counted (nor are the watchdog's refreshes)
    done = []

    def elsewhere():
        for _ in range(50):
            comm.all_reduce(a, b)
        comm.hand_off()
        done.append(True)

    comm.hand_off()
    other = threading.Thread(target=elsewhere)
    other.start()
    other.join(30)
    assert done == [True]
    got = _core.stage_clock(False)
    assert got.pop("operations") == 200
    assert list(got) == list(_core.STAGES)
    assert all(v > 0 for v in got.values()), got
    assert sum(got.values()) < elapsed
    np.testing.assert_array_equal(b, a)
    # stopped: nothing more is counted; started again: counted from zero
    comm.all_reduce(a, b)
    assert _core.stage_clock()["operations"] == 200
    _core.stage_clock(True)
    comm.all_reduce(a, b)
    again = _core.stage_clock(False)
    assert again["operations"] == 1 and again["library call"] < got["library call"]


@pytest.mark.timeout(60)
def test_a_failing_operation_under_the_clock_raises_as_without_it(comm):
    _core.stage_clock(True)
    with pytest.raises(ValueError, match="contiguous"):
        comm.all_reduce(np.ones((4, 4), np.float32).T)
    with pytest.raises(TypeError, match="not supported"):
        comm.all_reduce(np.ones(2, np.complex64))
    b = np.ones(2, np.float32)
    comm.all_reduce(b)
    got = _core.stage_clock(False)
    assert got["operations"] == 3 and got["observers at completion"] > 0
    np.testing.assert_array_equal(b, np.ones(2, np.float32))


@pytest.mark.timeout(60)
def test_only_blocking_all_reduce_outside_a_group_is_followed(comm):
    a, b = np.ones(2, np.float32), np.zeros(2, np.float32)
    _core.stage_clock(True)
    comm.all_reduce(a, b)
    one = _core.stage_clock()
    comm.all_reduce(a, b, async_op=True).wait()
    with comm.group():
        comm.all_reduce(a, b)
    comm.broadcast(b, root=0)
    comm.barrier()
    comm.all_gather(a, np.zeros(2, np.float32))
    time.sleep(0.05)  # the stages of these are not counted, nor is the time they take
    assert _core.stage_clock(False) == one and one["operations"] == 1
