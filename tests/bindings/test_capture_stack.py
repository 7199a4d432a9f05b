"""The flight recorder's stack capture in C gives what a Python loop over the frames gives."""

import sys

import pytest

from pycoll._bindings import capture_stack


def _python_loop(skip, depth):
    out, f = [], sys._getframe(skip + 1)
    for _ in range(depth):
        if f is None:
            break
        out += [f.f_code, f.f_lasti]
        f = f.f_back
    return out


def _nested(n, fn):
    return fn() if n == 0 else _nested(n - 1, fn)


def test_capture_matches_the_frames_from_the_caller_on():
    def probe():
        return capture_stack(1, 6), _python_loop(1, 6)

    got, ref = _nested(8, probe)
    assert len(got) == 12
    assert got[0::2] == ref[0::2]  # the same code objects, innermost first
    assert [c.co_name for c in got[0::2]] == ["_nested"] * 6
    assert got[1::2] == ref[1::2]  # the callers' instruction offsets (each waits in the same call)


def test_capture_stops_at_the_outermost_frame_and_depth_zero_is_empty():
    everything = capture_stack(0, 10_000)
    assert len(everything) == len(_python_loop(0, 10_000))
    assert capture_stack(0, 0) == []
    assert capture_stack(10_000, 5) == []


def test_negative_arguments_are_refused():
    with pytest.raises(ValueError, match="must be >= 0"):
        capture_stack(-1, 3)
    with pytest.raises(ValueError, match="must be >= 0"):
        capture_stack(0, -3)


def test_capture_matches_through_generators_coroutines_and_calls_from_c():
    """Frames entered through C (map, sorted's key, a property), a generator and a coroutine: the frames the capture
    walks in place are the ones Python's own frame objects list, with the same offsets."""
    seen = []

    def probe(*_):
        seen.append((capture_stack(1, 50), _python_loop(1, 50)))  # from the caller on: probe calls the two apart
        return 0

    def gen():
        yield probe()

    async def coro():
        return probe()

    class Holder:
        @property
        def value(self):
            return probe()

    list(map(probe, [1]))
    sorted([2, 1], key=probe)
    next(gen())
    c = coro()
    try:
        c.send(None)
    except StopIteration:
        pass
    _nested(3, lambda: Holder().value)
    assert len(seen) == 6
    for got, ref in seen:
        assert got == ref
