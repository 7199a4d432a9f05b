import copy
import pickle

import pytest

import pycoll
from pycoll import errors


@pytest.mark.parametrize("code", range(1, 9))
def test_one_class_per_result_code(code):
    cls = errors.error_class(code)
    assert cls.code == code
    assert issubclass(cls, pycoll.NCCLError)
    exc = cls(None, "ncclFoo", "some string", "last error text", "/lib.so")
    assert exc.code == code
    assert "ncclFoo" in str(exc) and "last error text" in str(exc)
    back = pickle.loads(pickle.dumps(exc))
    assert type(back) is cls and str(back) == str(exc) and back.last_error == "last error text"


def test_an_init_errors_handle_and_notes_survive_pickling():
    # the handle an init's error carries for its caller to abort (comm, or comms for comm_init_all) was dropped: a
    # supervisor in another process could not abort the communicator left behind
    exc = pycoll.InProgressError(None, "ncclCommInitRank", "in progress", "", "/lib.so")
    exc.comm = 0x55C08188E2B0
    exc.add_note("while starting rank 3")
    back = pickle.loads(pickle.dumps(exc))
    assert back.comm == 0x55C08188E2B0 and back.__notes__ == ["while starting rank 3"] and str(back) == str(exc)
    many = pycoll.InvalidUsage(None, "ncclCommInitAll")
    many.comms = [1, 2]
    assert pickle.loads(pickle.dumps(many)).comms == [1, 2]
    assert not hasattr(pickle.loads(pickle.dumps(pycoll.InvalidUsage(None, "x"))), "comm")


_EXAMPLES = {  # one of each class of pycoll.errors with its own constructor arguments
    "CommTimeout": lambda: pycoll.CommTimeout("late", "world", "all_reduce", 3, 1.5, 1.0, None, [1]),
    "PeerFailure": lambda: pycoll.PeerFailure("rank 2 is stopped", rank=2, pid=1, reason="stopped"),
    "NotSupported": lambda: pycoll.NotSupported("ncclCommShrink", "2.27", "/x/libnccl.so.2"),
}


@pytest.mark.parametrize("name", sorted(set(errors.__all__) - {"error_class", "RESULT_NAMES"}))
def test_every_error_pickles_and_copies_with_its_notes_and_attributes(name):
    # the classes with a __reduce__ of their own dropped what was set on them -- the notes pycoll adds (a split's, a
    # group's "none of the N operations ran") among them
    cls = getattr(errors, name)
    if not (isinstance(cls, type) and issubclass(cls, BaseException)):
        return
    if name in _EXAMPLES:
        exc = _EXAMPLES[name]()
    elif issubclass(cls, pycoll.NCCLError):
        exc = cls(None, "ncclFoo", "some string", "last error text", "/lib.so")
    else:
        exc = cls("text")
    exc.add_note("pycoll: a note")
    exc.extra = 7
    for back in (pickle.loads(pickle.dumps(exc)), copy.copy(exc), copy.deepcopy(exc)):
        assert type(back) is cls and str(back) == str(exc), name
        assert back.__notes__ == ["pycoll: a note"] and back.extra == 7, name


def test_builtin_bases():
    assert issubclass(pycoll.InvalidArgument, ValueError)
    assert issubclass(pycoll.RemoteError, ConnectionError)
    assert issubclass(pycoll.RemoteError, pycoll.CommFailure)
    assert issubclass(pycoll.NCCLTimeoutError, TimeoutError)
    assert issubclass(pycoll.CommTimeout, TimeoutError)
    assert issubclass(pycoll.NotSupported, NotImplementedError)
    assert errors.error_class(99) is pycoll.NCCLError


def test_not_supported_message():
    exc = pycoll.NotSupported("ncclCommShrink", "2.27", "/x/libnccl.so.2")
    assert "ncclCommShrink" in str(exc) and "2.27" in str(exc)
    assert pickle.loads(pickle.dumps(exc)).introduced == "2.27"
