"""The per-call arguments read in compiled code: ``op=``, ``timeout=`` and a root or peer (the common values in C,
every other value where it always went -- ``Communicator._redop``, ``_settings.seconds``, ``Communicator._root`` --
with the same result or the same error), and the in-place forms of all_gather, reduce_scatter, gather and scatter
(this rank's block of the whole)."""

from __future__ import annotations

import datetime
import math
import time

import numpy as np
import pytest
from helpers.mp import run_ranks

import pycoll
from pycoll import _settings, hooks
from pycoll._bindings import RedOp
from pycoll.comm import Communicator

pytestmark = pytest.mark.timeout(60)


@pytest.fixture
def comm():
    c = pycoll.init(0, 1, unique_id=pycoll.get_unique_id(backend="host"), backend="host", name="arguments")
    try:
        yield c
    finally:
        c.destroy()


def _outcome(call):
    try:
        return call()
    except Exception as e:  # the exception is the outcome compared
        return type(e), str(e)


def _spy(fn):
    """``fn`` made through a wrapper that counts its calls (``wrapper.calls``); a function, so that it binds as a
    method where it stands in for one."""
    def wrapper(*args, **kwargs):
        wrapper.calls += 1
        return fn(*args, **kwargs)

    wrapper.calls = 0
    return wrapper


OPS = ["sum", "prod", "max", "min", "avg", 0, 1, 2, 3, 4, RedOp.Max, RedOp.Avg, np.int64(2), "MAX", "Sum",
       "median", "", 5, -1, 2 ** 70, True, False, 2.0, None, b"max", ["max"]]


@pytest.mark.parametrize("op", OPS, ids=repr)
def test_every_op_gives_what_the_communicator_gives(comm, op):
    """all_reduce, reduce and reduce_scatter take ``op`` as ``Communicator._redop`` reads it: the same
    operator, or the same exception and text."""
    expected = _outcome(lambda: comm._redop(op, 7))
    for call in (lambda x: comm.all_reduce(x, op=op), lambda x: comm.reduce(x, root=0, op=op),
                 lambda x: comm.reduce_scatter(x, op=op)):
        x = np.array([3.0, -2.0], np.float32)
        got = _outcome(lambda: call(x))
        if isinstance(expected, tuple):
            assert got == expected
        else:  # one rank: every operator leaves the values as they are
            assert isinstance(got, pycoll.Work) and got.is_completed() and x.tolist() == [3.0, -2.0]
    comm.all_reduce(np.ones(2, np.float32))  # usable afterwards


def test_builtin_operators_are_read_without_the_python_method(comm, monkeypatch):
    """The names and numbers of NCCL's five operators (and RedOp members) make no call of ``_redop``;
    another spelling, a PreMulSum and a wrong value do."""
    spy = _spy(Communicator._redop)
    monkeypatch.setattr(Communicator, "_redop", spy)
    x = np.ones(2, np.float32)
    for op in ("sum", "prod", "max", "min", "avg", 0, 4, RedOp.Min):
        comm.all_reduce(x, op=op)
        comm.reduce_scatter(x, op=op)
        comm.reduce(x, root=0, op=op)
    assert spy.calls == 0
    comm.all_reduce(x, op="MAX")
    with comm.pre_mul_sum(2.0, "float32") as pm:
        comm.all_reduce(x, op=pm)
    with pytest.raises(ValueError, match="unknown reduction op 'median'"):
        comm.all_reduce(x, op="median")
    with pytest.raises(ValueError, match="unknown reduction op 5"):
        comm.all_reduce(x, op=5)
    comm.all_reduce(x, op=np.int64(2))  # numpy's integers, as roots and peers take them
    with pytest.raises(ValueError, match="unknown reduction op np.True_"):
        comm.all_reduce(x, op=np.True_)
    with comm.pre_mul_sum(2.0, "float64") as pm, \
            pytest.raises(ValueError, match="PreMulSum operator was created for float64, the buffers are float32"):
        comm.all_reduce(x, op=pm)
    assert spy.calls == 7
    assert x.tolist() == [2.0, 2.0]  # the PreMulSum's factor applied


def _each_spelling(rank, n, uid):
    c = pycoll.init(rank, n, unique_id=uid, backend="host", name="spellings")
    results = {}
    try:
        for name, code in (("sum", 0), ("prod", 1), ("max", 2), ("min", 3), ("avg", 4)):
            for op in (name, name.upper(), code, RedOp(code)):
                x = np.array([rank + 1.0, 2.0 * rank - 1.0], np.float32)
                y = np.zeros(2, np.float32)
                c.all_reduce(x, y, op=op)
                r = np.zeros(1, np.float32)
                c.reduce_scatter(np.array([rank + 1.0] * n, np.float32), r, op=op)
                results[f"{name} as {op!r}"] = (y.tolist(), r.tolist())
    finally:
        c.destroy()
    return results


@pytest.mark.timeout(120)
def test_every_spelling_of_an_operator_reduces_with_it():
    """At 2 ranks (values 1, -1 and 2, 1): the name, its capitals, the number and the RedOp of each
    operator give that operator's result."""
    expected = {"sum": ([3.0, 0.0], [3.0]), "prod": ([2.0, -1.0], [2.0]), "max": ([2.0, 1.0], [2.0]),
                "min": ([1.0, -1.0], [1.0]), "avg": ([1.5, 0.0], [1.5])}
    for results in run_ranks(_each_spelling, 2, bytes(pycoll.get_unique_id(backend="host")), timeout=90):
        assert len(results) == 20
        for what, got in results.items():
            assert got == expected[what.split()[0]], what


class _Rank(int):
    pass


RANKS = [0, np.int64(0), np.int32(0), np.uint8(0), _Rank(0), RedOp.Sum, 1, -1, np.int64(1), np.int64(-1), 2 ** 70,
         True, False, np.bool_(False), 0.0, np.float32(0), "0", None, [0], complex(0)]


@pytest.mark.parametrize("root", RANKS, ids=repr)
def test_every_root_and_peer_gives_what_the_communicator_gives(comm, root):
    """broadcast, reduce, gather, scatter (root) and send, recv, sendrecv (peer) take a rank as ``Communicator._root``
    reads it (any integer ``operator.index`` takes, never a bool): the same rank, or the same exception and text."""
    x, y = np.ones(2, np.float32), np.zeros(2, np.float32)
    calls = {"root": [lambda: comm.broadcast(x, root=root), lambda: comm.reduce(x, root=root),
                      lambda: comm.gather(x, y, root=root), lambda: comm.scatter(x, y, root=root)],
             "peer": [lambda: comm.sendrecv(x, y, root)]}
    for what, fns in calls.items():
        expected = _outcome(lambda: comm._root(root, what))
        for call in fns:
            got = _outcome(call)
            if isinstance(expected, tuple):
                assert got == expected
            else:
                assert isinstance(got, pycoll.Work) and got.is_completed()
    with comm.group():  # send and recv: in a group (alone they would wait for each other)
        got = [_outcome(lambda: comm.send(x, root)), _outcome(lambda: comm.recv(y, root))]
    expected = _outcome(lambda: comm._root(root, "peer"))
    assert all(g == expected for g in got) if isinstance(expected, tuple) else all(
        isinstance(g, pycoll.Work) for g in got)
    comm.all_reduce(np.ones(2, np.float32))  # usable afterwards


def test_integer_roots_are_read_without_the_python_method(comm, monkeypatch):
    """An int, a numpy integer, an int subclass: no call of ``Communicator._root``; a bool, a float and a rank out of
    range go there (which refuses them)."""
    spy = _spy(Communicator._root)
    monkeypatch.setattr(Communicator, "_root", spy)
    x = np.ones(2, np.float32)
    for root in (0, np.int64(0), np.uint16(0), _Rank(0)):
        comm.broadcast(x, root=root)
        comm.sendrecv(x, np.zeros(2, np.float32), root)
    assert spy.calls == 0
    for root in (True, 0.0, 1, np.int64(-1)):
        with pytest.raises((TypeError, ValueError)):
            comm.broadcast(x, root=root)
    assert spy.calls == 4


def _numpy_roots(rank, n, uid):
    c = pycoll.init(rank, n, unique_id=uid, backend="host", name="numpy roots")
    try:
        got = []
        for root in (np.int64(1), np.uint8(0), np.int32(1)):
            x = np.full(2, 10.0 + rank, np.float32)
            c.broadcast(x, root=root)
            got.append(x.tolist())
        peer = np.int64(1 - rank)
        y = np.zeros(2, np.float32)
        c.sendrecv(np.full(2, float(rank), np.float32), y, peer)
        got.append(y.tolist())
    finally:
        c.destroy()
    return got


def test_numpy_integer_roots_and_peers_pick_that_rank():
    for rank, got in enumerate(run_ranks(_numpy_roots, 2, bytes(pycoll.get_unique_id(backend="host")), timeout=90)):
        assert got == [[11.0] * 2, [10.0] * 2, [11.0] * 2, [float(1 - rank)] * 2], got


TIMEOUTS = [5, 5.0, 0.25, 2 ** 53 - 1, 2 ** 53, 2 ** 80, np.float64(3), np.float32(2.5), np.int32(7),
            0, 0.0, -0.0, -1, -1.5, math.inf, -math.inf, math.nan, 1e309, True, False, "5", None, complex(1, 0),
            # torch.distributed's form: its seconds
            datetime.timedelta(seconds=30), datetime.timedelta(milliseconds=1), datetime.timedelta(0),
            datetime.timedelta(seconds=-1)]


@pytest.mark.parametrize("value", TIMEOUTS, ids=repr)
def test_every_timeout_gives_what_the_setting_gives(comm, value):
    """An operation's ``timeout=`` (> 0) and ``Work.wait(timeout=)`` (>= 0) take every value as
    ``_settings.seconds`` takes it: the same number of seconds on the Work, or the same exception and text."""
    x = np.ones(2, np.float32)
    if value is None:
        assert comm.all_reduce(x, timeout=value).timeout == comm.timeout
        return
    expected = _outcome(lambda: _settings.seconds(value, "timeout"))
    got = _outcome(lambda: comm.all_reduce(x, timeout=value))
    if isinstance(expected, tuple):
        assert got == expected
    else:
        assert isinstance(got, pycoll.Work) and type(got.timeout) is float and got.timeout == expected
    expected = _outcome(lambda: _settings.seconds(value, "timeout", positive=False))
    w = comm.all_reduce(x, async_op=True)
    got = _outcome(lambda: w.wait(timeout=value))
    assert got == expected if isinstance(expected, tuple) else got is None
    w.wait()
    assert x.tolist() == [1.0, 1.0]


def test_plain_timeouts_are_read_without_the_setting(comm, monkeypatch):
    """A float or an int timeout makes no call of ``_settings.seconds``; a numpy number, an int too large to be a
    float exactly and a wrong value do."""
    spy = _spy(_settings.seconds)
    monkeypatch.setattr(_settings, "seconds", spy)
    x = np.ones(2, np.float32)
    for t in (5, 0.5, 120, 1e6):
        assert comm.all_reduce(x, timeout=t).timeout == float(t)
        comm.all_reduce(x, async_op=True).wait(timeout=t)
    comm.all_reduce(x, async_op=True).wait(timeout=0)
    assert spy.calls == 0
    comm.all_reduce(x, timeout=np.float64(5))
    with pytest.raises(ValueError, match="timeout must be at most 1e"):  # past what threads and clocks can wait
        comm.all_reduce(x, timeout=2 ** 60)
    with pytest.raises(ValueError, match="timeout must be > 0 seconds"):
        comm.all_reduce(x, timeout=0)
    with pytest.raises(ValueError, match="finite number of seconds"):
        comm.all_reduce(x, timeout=math.nan)
    assert spy.calls == 4


def _in_place_forms(rank, n, uid):
    """Each in-place form, by None and by a view at this rank's block, with every rank as the root of the rooted
    ones: the results, and the block's Buffer as the operation recorded it next to the whole's."""
    c = pycoll.init(rank, n, unique_id=uid, backend="host", name="in place")
    k, got = 3, {}
    seen = {}

    class Arguments(hooks.CommObserver):  # the Buffers as the operation holds them when it is enqueued
        def work_enqueued(self, work):
            seen["inputs"], seen["outputs"] = list(work.inputs), list(work.outputs)

    observer = Arguments()
    hooks.add_observer(observer)

    def block_fields(w, which, whole):
        b = seen[which][0]
        item = whole.dtype.itemsize
        return (b.ptr == whole.ctypes.data + rank * k * item and b.nbytes == k * item and b.count == k
                and b.shape == (k,) and b.datatype == 7 and b.dtype_name == "Float" and b.owner is whole
                and b.source == "numpy" and b.device_type == 1 and b.readonly is False and b.sync_stream is None
                and b.name == which[:-1])

    try:
        for by_view in (False, True):
            form = "view" if by_view else "None"
            whole = np.zeros(k * n, np.float32)
            whole[rank * k:(rank + 1) * k] = rank + 1
            w = c.all_gather(whole[rank * k:(rank + 1) * k] if by_view else None, whole)
            got[f"all_gather {form}"] = (whole.tolist() == np.repeat(np.arange(1.0, n + 1), k).tolist(),
                                         by_view or block_fields(w, "inputs", whole))
            whole = np.full(k * n, rank + 1.0, np.float32)
            w = c.reduce_scatter(whole, whole[rank * k:(rank + 1) * k] if by_view else None)
            got[f"reduce_scatter {form}"] = (whole[rank * k:(rank + 1) * k].tolist() == [n * (n + 1) / 2] * k,
                                             by_view or block_fields(w, "outputs", whole))
            for root in range(n):
                whole = np.zeros(k * n, np.float32)
                whole[rank * k:(rank + 1) * k] = rank + 1
                if rank == root:
                    w = c.gather(whole[rank * k:(rank + 1) * k] if by_view else None, whole, root=root)
                    got[f"gather {form} root {root}"] = (
                        whole.tolist() == np.repeat(np.arange(1.0, n + 1), k).tolist(),
                        by_view or block_fields(w, "inputs", whole))
                else:
                    c.gather(whole[rank * k:(rank + 1) * k].copy(), None, root=root)
                if rank == root:
                    whole = np.repeat(np.arange(10.0, 10 + n), k).astype(np.float32)
                    w = c.scatter(whole, whole[rank * k:(rank + 1) * k] if by_view else None, root=root)
                    got[f"scatter {form} root {root}"] = (whole.tolist() == np.repeat(np.arange(10.0, 10 + n),
                                                                                      k).tolist(),
                                                          by_view or block_fields(w, "outputs", whole))
                else:
                    out = np.zeros(k, np.float32)
                    c.scatter(None, out, root=root)
                    got[f"scatter {form} received from {root}"] = (out.tolist() == [10.0 + rank] * k, True)
        whole = np.zeros(k * n, np.float32)  # a view one block off its rank's place is no in-place form
        other = (rank + 1) % n
        try:
            c.all_gather(whole[other * k:(other + 1) * k], whole)
            got["misplaced view refused"] = (False, False)
        except ValueError as e:
            got["misplaced view refused"] = ("overlap in memory" in str(e) and "input=None" in str(e), True)
        c.all_reduce(np.ones(1, np.float32))  # usable afterwards
    finally:
        hooks.remove_observer(observer)
        c.destroy()
    return got


@pytest.mark.timeout(120)
def test_in_place_forms_use_this_ranks_block():
    for got in run_ranks(_in_place_forms, 3, bytes(pycoll.get_unique_id(backend="host")), timeout=90):
        assert len(got) == 2 * (2 + 2 + 2) + 1, sorted(got)  # per form: 2, its own root (2), 2 other roots; 1
        bad = {what: ok for what, ok in got.items() if ok != (True, True)}
        assert not bad, bad


def _memory_taken_away(rank, n, uid, how, size):
    """A rank changes a torch tensor's memory while its asynchronous broadcast waits for the other rank (which issues
    0.5 s late): rank 1, a receiver, for ``set_``, ``data`` and ``kept`` (nothing changed); rank 0, the root, which only
    reads it, for ``resize_`` (a write into the freed block would corrupt the heap). Returns what wait() raised there,
    what exception() says, and the tensor's first elements."""
    import time

    import torch

    c = pycoll.init(rank, n, unique_id=uid, backend="host", name="taken")
    try:
        t = torch.arange(size, dtype=torch.float32) if rank == 0 else torch.zeros(size)
        changer = 0 if how == "resize_" else 1
        if rank != changer:
            time.sleep(0.5)
        if how == "group":  # a blocking operation of a group runs at the group's end: as an asynchronous one
            try:
                with c.group():
                    c.broadcast(t, root=0)
                    if rank == changer:
                        t.data = torch.full((size,), 7.0)
                raised = None
            except BufferError as e:
                raised = str(e)
            c.all_reduce(torch.ones(2))
            return raised, raised, t[:4].tolist()
        if how == "subclass":
            t = t.as_subclass(type("Sub", (torch.Tensor,), {}))
        w = c.broadcast(t, root=0, async_op=True)
        if rank == changer:
            if how in ("set_", "subclass"):
                t.set_(torch.full((size,), 7.0))  # the memory it was given is freed here, but for the Work's hold
            elif how == "data":
                t.data = torch.full((size,), 7.0)
            elif how == "resize_":
                t.resize_(4 * size)  # reallocated: the old block is freed whatever holds the storage
        try:
            w.wait()
            raised = None
        except BufferError as e:
            raised = str(e)
        exc = w.exception()
        c.all_reduce(torch.ones(2))  # usable afterwards
        return raised, None if exc is None else str(exc), t[:4].tolist()
    finally:
        c.destroy()


@pytest.mark.timeout(120)
@pytest.mark.parametrize("how, size", [("set_", 16 << 20), ("data", 16 << 20), ("resize_", 16 << 10),
                                       ("kept", 1024), ("group", 16 << 20), ("subclass", 1024)])
def test_a_tensor_whose_memory_is_taken_away_under_an_asynchronous_operation(how, size):
    """A set_ (or .data =) while an asynchronous broadcast of 64 MiB ran freed the memory under it: the receiver died
    of SIGSEGV (the host stream wrote into an unmapped block). The Work holds the storage now: the broadcast lands in
    the memory it was given, and wait() says the tensor has other memory. A resize_ frees the old block whatever
    holds the storage: wait() says the operation used freed memory. A blocking broadcast in a group (run at the
    group's end) crashed the same way: the group's end raises it; a subclass's set_ went unreported."""
    pytest.importorskip("torch")
    got = run_ranks(_memory_taken_away, 2, bytes(pycoll.get_unique_id(backend="host")), how, size, timeout=90)
    changer, other = (got[0], got[1]) if how == "resize_" else (got[1], got[0])
    assert other[:2] == (None, None), other
    raised, exc, data = changer
    assert exc == raised
    if how == "kept":
        assert raised is None and data == [0.0, 1.0, 2.0, 3.0]
    elif how == "resize_":
        assert ("broadcast (seq 1) on taken: the memory of its tensor (a torch tensor) was freed while the operation "
                "ran (a resize_ or share_memory_ of the tensor or of its storage): the operation read freed "
                "memory") in raised, raised
    else:
        assert raised is not None and ("its tensor (a torch tensor) was given other memory while the operation ran "
                                       "(set_, or an assignment to .data): the operation wrote into the memory the "
                                       "tensor had") in raised, raised
        assert data == [7.0] * 4  # the tensor's new memory: left as it was
        assert other[2] == [0.0, 1.0, 2.0, 3.0]


def _torch_in_place_forms_held(rank, n, uid):
    """The in-place forms of all_gather, reduce_scatter, gather and scatter on torch tensors, asynchronous and in a
    group (their storages held until they retire): what each raised, or its result."""
    import torch

    c = pycoll.init(rank, n, unique_id=uid, backend="host", name="held")
    got = {}
    try:
        for how in ("async", "group"):
            def run(call):
                if how == "async":
                    call(True).wait()
                else:
                    with c.group():
                        call(False)

            def record(what, call, result):
                try:
                    run(call)
                    got[f"{what} {how}"] = result()
                except Exception as e:
                    got[f"{what} {how}"] = f"{type(e).__name__}: {e}"

            whole = torch.zeros(2 * n)
            whole[2 * rank:2 * rank + 2] = rank + 1.0
            record("all_gather", lambda a: c.all_gather(None, whole, async_op=a), whole.tolist)
            x = torch.arange(2.0 * n) + rank
            record("reduce_scatter", lambda a: c.reduce_scatter(x, None, async_op=a),
                   lambda: x[2 * rank:2 * rank + 2].tolist())
            g = torch.zeros(2 * n)
            g[2 * rank:2 * rank + 2] = rank + 1.0
            root = n - 1  # the in-place forms of a gather and a scatter are the root's: the others send or receive
            if rank == root:
                record("gather", lambda a: c.gather(None, g, root=root, async_op=a), g.tolist)
                sc = torch.arange(2.0 * n)
                record("scatter", lambda a: c.scatter(sc, None, root=root, async_op=a),
                       lambda: sc[2 * rank:2 * rank + 2].tolist())
            else:
                record("gather", lambda a: c.gather(g[2 * rank:2 * rank + 2], None, root=root, async_op=a), g.tolist)
                sc = torch.zeros(2)
                record("scatter", lambda a: c.scatter(None, sc, root=root, async_op=a), sc.tolist)
    finally:
        c.destroy()
    return got


@pytest.mark.timeout(120)
def test_torch_in_place_forms_held_under_an_asynchronous_operation_raise_nothing():
    """A rank's block of an in-place form starts past the tensor's data pointer: the check at retirement compared
    the tensor's pointer with the block's and raised "given other memory" on every rank but 0 (or the root) for an
    asynchronous or grouped all_gather, reduce_scatter, gather or scatter of torch tensors that nothing touched."""
    pytest.importorskip("torch")
    n = 3
    for rank, got in enumerate(run_ranks(_torch_in_place_forms_held, n, bytes(pycoll.get_unique_id(backend="host")),
                                         timeout=90)):
        for how in ("async", "group"):
            assert got[f"all_gather {how}"] == [float(1 + r) for r in range(n) for _ in range(2)], (rank, got)
            assert got[f"reduce_scatter {how}"] == [float(sum(2 * rank + i + r for r in range(n))) for i in range(2)], (
                rank, got)
            if rank == n - 1:
                assert got[f"gather {how}"] == [float(1 + r) for r in range(n) for _ in range(2)], (rank, got)
            assert got[f"scatter {how}"] == [float(2 * rank + i) for i in range(2)], (rank, got)


def _storage_of_an_abandoned_operation(rank, n, uid):
    import weakref

    import torch

    c = pycoll.init(rank, n, unique_id=uid, backend="host", name="abandoned")
    if rank == 0:
        arr = np.zeros(1024, np.float32)
        ref = weakref.ref(arr)
        t = torch.from_numpy(arr)  # its storage's memory: the numpy array's, which it keeps alive
        w = c.broadcast(t, root=1, async_op=True)  # rank 1 never issues it
        del t, arr
        assert ref() is not None
        c.abort()
        kept = w._kept
        return kept is None and ref() is None
    time.sleep(1.0)
    c.abort()
    return True


@pytest.mark.timeout(60)
def test_an_aborted_asynchronous_operation_lets_its_torch_storage_go():
    """An abort drops an outstanding operation's arrays (release_arrays): the storage it held went only with the
    Work."""
    pytest.importorskip("torch")
    assert run_ranks(_storage_of_an_abandoned_operation, 2, bytes(pycoll.get_unique_id(backend="host")),
                     timeout=40) == [True, True]


def test_a_tensor_autograd_saved_and_written_in_place_makes_backward_raise(comm):
    """As torch's own in-place operations: the write bumps the tensor's version, so a backward that saved it raises
    (it computed wrong gradients silently); a subclass tensor too, an input only read is not bumped."""
    torch = pytest.importorskip("torch")

    class Sub(torch.Tensor):
        pass

    for make in (lambda t: t, lambda t: t.as_subclass(Sub)):
        x = torch.tensor([1.0, 2.0, 3.0], requires_grad=True)
        h = make(x * 1.0)
        loss = (h * h).sum()
        v = h._version
        comm.all_reduce(torch.ones(3), h)  # h is only written
        assert h._version > v
        with pytest.raises(RuntimeError, match="modified by an inplace operation"):
            loss.backward()
    x = torch.tensor([1.0, 2.0], requires_grad=True)
    h = x * 1.0
    loss = (h * h).sum()
    comm.all_reduce(h, torch.empty(2))  # h is only read
    loss.backward()
    assert x.grad.tolist() == [2.0, 4.0]
    # a refused call writes nothing and tells autograd nothing: it bumped the version before its checks, and the
    # backward of a program that caught the ValueError raised "modified by an inplace operation"
    x = torch.ones(3, requires_grad=True)
    h = torch.exp(x)
    f64 = torch.ones(3, dtype=torch.float64)
    for refused in (lambda: comm.all_reduce(h, op="mean"), lambda: comm.all_reduce(f64, h),
                    lambda: comm.all_reduce(h, op=comm.pre_mul_sum(2.0, "float64"))):
        with pytest.raises(ValueError):
            refused()
    assert h._version == 0
    h.sum().backward()
    ro = torch.exp(torch.ones(2, requires_grad=True))
    comm.broadcast(ro, root=comm.rank)  # the root only reads its tensor
    comm.broadcast(ro, root=comm.rank, output=ro)  # its own output: the same, in place
    assert ro._version == 0
    # out of place the root copies its tensor into its output, which autograd is told of (it was not: a backward
    # that saved the output gave wrong gradients)
    x = torch.tensor([1.0, 2.0, 3.0], requires_grad=True)
    h = x * 1.0
    loss = (h * h).sum()
    comm.broadcast(torch.tensor([10.0, 20.0, 30.0]), root=comm.rank, output=h)
    assert h.tolist() == [10.0, 20.0, 30.0] and h._version > 0
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        loss.backward()


def test_a_timedelta_is_its_seconds(comm):
    """torch.distributed's timeouts are timedeltas: ported code passes them (they were refused as "not a number")."""
    x = np.ones(2, np.float32)
    assert comm.all_reduce(x, timeout=datetime.timedelta(seconds=30)).timeout == 30.0
    comm.all_reduce(x, async_op=True).wait(timeout=datetime.timedelta(milliseconds=500))
    with pytest.raises(ValueError, match="timeout must be > 0 seconds"):
        comm.all_reduce(x, timeout=datetime.timedelta(0))
    assert _settings.seconds(datetime.timedelta(minutes=2), "init_timeout") == 120.0


def test_bad_arguments_are_refused_with_their_names(comm, tmp_path):
    # what a fuzz of the public API found taken silently (by truthiness, as a numpy value's type, a str as a
    # sequence) or refused by an AttributeError/OverflowError from deep inside
    def refused(exc, match, call):
        with pytest.raises(exc, match=match):
            call()

    x = np.ones(2, np.float32)
    refused(TypeError, "async_op must be True or False, got str 'no'", lambda: comm.all_reduce(x, async_op="no"))
    refused(TypeError, "async_op must be True or False", lambda: comm.barrier(async_op=[1]))
    refused(TypeError, "async_op must be True or False", lambda: comm.send(x, 0, async_op=0.5))
    comm.all_reduce(x, async_op=np.bool_(True)).wait()
    comm.all_reduce(x, async_op=1).wait()
    refused(TypeError, "config must be a pycoll.CommConfig or None, not str", lambda: comm.split(0, config="x"))
    refused(TypeError, "split: name must be a non-empty str or None, got 1.5", lambda: comm.split(0, name=1.5))
    refused(ValueError, "split: name must be a non-empty str or None, got ''", lambda: comm.split(0, name=""))
    refused(TypeError, "watch_stream: what must be a non-empty str", lambda: comm.watch_stream(None, what=[1]))
    refused(TypeError, "dtype must be a dtype .* got the value", lambda: comm.mem_alloc(4, dtype=np.int64(7)))
    refused(TypeError, "shape must be an int or a sequence of ints", lambda: comm.mem_alloc(b"ab"))
    refused(ValueError, "more than a size_t allocation holds", lambda: comm.mem_alloc(2**63))
    # more than the machine has: numpy's MemoryError, where the library's memfd took it and the first write past the
    # memory there was killed the process
    too_much = "more than the machine's memory and swap"
    refused(pycoll.NCCLSystemError, too_much, lambda: comm.mem_alloc(2**50, "uint8"))
    refused(pycoll.NCCLSystemError, too_much, lambda: pycoll.SymmetricPool(comm, 2**50))
    refused(TypeError, "dtype must be a dtype", lambda: comm.pre_mul_sum(2.0, dtype=np.int64(7)))
    # 1e-30 rounds to 0 in float16: every result would be 0 (1e6 was refused, as it would be inf there)
    refused(ValueError, "the scalar 1e-30 is not representable in float16 \\(it would be 0.0 there\\)",
            lambda: comm.pre_mul_sum(1e-30, np.float16))
    refused(ValueError, "the scalar 1000000.0 is not representable in float16 \\(it would be inf there\\)",
            lambda: comm.pre_mul_sum(1e6, np.float16))
    comm.pre_mul_sum(0.0, np.float16).destroy()  # zero itself is a scalar like any other
    comm.pre_mul_sum(1e-7, np.float16).destroy()  # subnormal there, not zero
    refused(ValueError, "CollConfig.min_ctas must be None or an int in \\[1,", lambda: pycoll.CollConfig(min_ctas=0))
    refused(ValueError, "CollConfig.cta_policy must be None or an int in \\[0, 3\\]",
            lambda: pycoll.CollConfig(cta_policy=4))
    assert type(pycoll.CommConfig(min_ctas=np.int64(2), max_ctas=4).min_ctas) is int  # numpy's ints, as the others
    assert type(pycoll.CollConfig(min_ctas=np.int64(2)).min_ctas) is int  # the same in a CollConfig
    refused(ValueError, "FileStore: path must name a file", lambda: pycoll.FileStore(""))
    init = {"rank": 0, "world_size": 1, "backend": "host", "name": "refused"}
    refused(ValueError, "on_failure must be one of", lambda: pycoll.init(**init, on_failure=""))
    refused(TypeError, "device must be a GPU ordinal >= 0", lambda: pycoll.init(**init, device=float("nan")))
    refused(TypeError, "unique_id must be a pycoll UniqueId or its 128 bytes", lambda: pycoll.init(**init, unique_id=5))
    refused(TypeError, "library must be a loaded pycoll Library, a path", lambda: pycoll.init(**init, library=1.5))
    refused(ValueError, "devices must be >= 1 and below 2\\*\\*31", lambda: pycoll.init_all(2**63, backend="host"))
    uid = np.frombuffer(bytes(pycoll.get_unique_id(backend="host")), np.uint8)  # its bytes in an array: taken
    pycoll.init(**init, unique_id=uid, device=np.int64(0)).destroy()
    comm.all_reduce(x)  # still usable
    assert x.tolist() == [1.0, 1.0]
