"""ElasticGroup.maybe_grow() on the emulated GPU: the decision travels with the communicator (a device
buffer, copies ordered on its stream), so a step costs no store request; a joiner is admitted; rank 0
killed between steps or inside maybe_grow() makes the others raise CommFailure, not StoreTimeout."""

from __future__ import annotations

import ctypes
import os
import signal
import threading
import time

import emu_helpers as H
import numpy as np
import pytest
from helpers.mp import Died, run_ranks

import pycoll

pytestmark = pytest.mark.emulated_gpu

TOKEN = "emu-grow"
STEPS = 200


@pytest.fixture
def server():
    srv = pycoll.TCPStoreServer(token=TOKEN).start()
    yield srv
    srv.close()


def _group(rank, n, addr, *, joiner=False, timeout=10.0, spec=""):
    import pycoll.emulated as emu
    from pycoll import failpoints
    from pycoll.elastic import ElasticGroup

    failpoints.configure(spec, rank=rank)
    store = pycoll.TCPStore(addr[0], addr[1], TOKEN, timeout=30.0)
    kwargs = dict(backend="host", device=emu.device(0), timeout=timeout, name="g")
    if joiner:
        return ElasticGroup(store, rank, joiner=True, **kwargs)
    return ElasticGroup(store, rank, n, **kwargs)


def _tensor(data):
    import pycoll.emulated as emu

    return emu.TorchLikeTensor(emu.runtime(), np.asarray(data, np.float32), device=0)


# -- no joiner: no store request per step ---------------------------------------------------------


def _steps(rank, n, addr):
    group = _group(rank, n, addr)
    assert group.comm.device.kind == "cuda"  # the emulated GPU, not the host device
    group.comm.barrier()
    time.sleep(0.3)  # the watchers settle
    t0 = time.time()
    grew = [group.maybe_grow() for _ in range(STEPS)]
    group.comm.barrier()
    t1 = time.time()
    time.sleep(2 * (t1 - t0))  # an idle window twice as long: the background requests (watchers) alone, their
    # bursts averaged over more of them (an idle rate read over 0.8 s left 21 requests "extra" against 20)
    t2 = time.time()
    group.comm.barrier()
    copies = len(group.comm.device.runtime.calls("cudaMemcpyAsync"))
    group.close()
    return dict(grew=any(grew), window=(t0, t1, t2), copies=copies)


def _count_at(samples, t):
    best = samples[0][1]
    for ts, n in samples:
        if ts > t:
            break
        best = n
    return best


@pytest.mark.timeout(90)
def test_maybe_grow_without_joiner_makes_no_store_request(server):
    samples = []
    stop = threading.Event()

    def sample():
        while not stop.is_set():
            samples.append((time.time(), server.stats()["requests"]))
            time.sleep(0.002)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    try:
        res = H.run_ranks(_steps, 4, server.address, timeout=60)
    finally:
        stop.set()
        sampler.join(5)
    assert not any(r["grew"] for r in res)
    t0 = max(r["window"][0] for r in res)
    t1 = min(r["window"][1] for r in res)
    t2 = min(r["window"][2] for r in res)
    busy = _count_at(samples, t1) - _count_at(samples, t0)
    idle_rate = (_count_at(samples, t2) - _count_at(samples, t1)) / max(t2 - t1, 1e-3)
    extra = busy - idle_rate * (t1 - t0)
    # the store path made one request per member per step: 4 * STEPS = 800 here
    assert extra <= 0.05 * STEPS + 10, (busy, idle_rate, t1 - t0, extra)
    # every member copies the count out each step, rank 0 also copies it in (and the barriers copy nothing)
    assert res[0]["copies"] >= 2 * STEPS and all(r["copies"] >= STEPS for r in res[1:]), res


# -- a joiner is admitted -------------------------------------------------------------------------


def _grow(rank, n, addr):
    if rank == n - 1:
        group = _group(rank, n, addr, joiner=True)
    else:
        group = _group(rank, n - 1, addr)
        deadline = time.monotonic() + 30
        while not group.maybe_grow():
            assert time.monotonic() < deadline, "the joiner was never admitted"
            time.sleep(0.02)
    x = _tensor([group.rank + 1.0] * 4)
    group.comm.all_reduce(x)
    out = dict(members=group.members, rank=group.rank, kinds=[t.kind for t in group.transitions],
               x=x.numpy().tolist(), kind=group.comm.device.kind)
    group.close()
    return out


@pytest.mark.timeout(90)
def test_a_joiner_is_admitted_on_the_emulated_gpu(server):
    res = H.run_ranks(_grow, 4, server.address, timeout=60)
    for r in res:
        assert r["members"] == (0, 1, 2, 3) and r["x"] == [10.0] * 4 and r["kind"] == "cuda", r
    assert [r["rank"] for r in res] == [0, 1, 2, 3]
    assert all(r["kinds"] == ["grow"] for r in res[:3]), res


# -- rank 0 dies: CommFailure, not StoreTimeout ---------------------------------------------------


def _rank0_dies(rank, n, addr, where):
    spec = "elastic.grow.before_decision=kill@3;rank=0" if where == "before_decision" else ""
    if where == "copied":
        spec = "comm.broadcast_bytes.copied=kill@3;rank=0"
    group = _group(rank, n, addr, timeout=20.0, spec=spec)
    for step in range(6):
        t0 = time.monotonic()
        try:
            # as the README's loop: a failure may surface in the step's collective too (a member slow to
            # see it complete when the others' reshape revokes the communicator) -- the same step
            x = _tensor([1.0] * 4)
            group.comm.all_reduce(x)
            if where == "between_steps" and rank == 0 and step == 3:  # the others wait in maybe_grow()
                os.kill(os.getpid(), signal.SIGKILL)
            t0 = time.monotonic()
            group.maybe_grow()
        except pycoll.CommFailure as exc:
            took = time.monotonic() - t0
            group.reshape()
            y = _tensor([1.0] * 4)
            group.comm.all_reduce(y)
            out = dict(step=step, error="CommFailure", kind=type(exc).__name__, took=took, members=group.members,
                       y=y.numpy().tolist())
            group.close()
            return out
        except Exception as exc:  # StoreTimeout or anything else: the test fails on it
            return dict(step=step, error=f"{type(exc).__name__}: {exc}")
    return "no failure"


@pytest.mark.timeout(120)
@pytest.mark.parametrize("where", ["between_steps", "before_decision", "copied"])
def test_rank0_killed_makes_the_others_raise_comm_failure(server, where):
    res = run_ranks(_rank0_dies, 3, server.address, where, timeout=90, may_die=[0], hard_exit=True)
    assert isinstance(res[0], Died), res[0]
    for r in res[1:]:
        assert isinstance(r, dict) and r["error"] == "CommFailure", r
        assert r["step"] == (3 if where == "between_steps" else 2), r
        assert r["took"] < 10.0, r  # the liveness found it, not the 20 s deadline
        assert r["members"] == (1, 2) and r["y"] == [2.0] * 4, r


# -- the copies: ordered on the stream ------------------------------------------------------------


def test_emulated_copies_are_ordered_on_the_stream():
    import pycoll.emulated as emu

    rt = emu.runtime()
    dev = emu.device(0, rt)
    stream = dev.create_stream()
    dst = (ctypes.c_char * 8)()
    try:
        gate = rt.hang(stream)
        done = threading.Event()
        t = threading.Thread(target=lambda: (dev.copy_to_device(ctypes.addressof(dst), b"abcdefgh", stream),
                                             done.set()), daemon=True)
        t.start()
        time.sleep(0.1)
        # queued behind the hung kernel: neither run nor returned
        assert dst.raw == b"\0" * 8 and not done.is_set()
        gate.release()
        t.join(5)
        assert done.is_set() and dst.raw == b"abcdefgh"
        # a kernel queued before the read writes first; the read sees its bytes
        rt.launch(stream, lambda: (time.sleep(0.05), ctypes.memmove(dst, b"ZYXWVUTS", 8)))
        assert dev.copy_to_host(ctypes.addressof(dst), 8, stream) == b"ZYXWVUTS"
        assert dev.copy_to_host(ctypes.addressof(dst), 0, stream) == b""
        names = [c.name for c in rt.calls("cudaMemcpyAsync")]
        assert len(names) == 2
        kinds = [int(c.args[3]) for c in rt.calls("cudaMemcpyAsync")]
        assert kinds == [1, 2]  # host to device, device to host
        with pytest.raises(ValueError, match="device pointer"):
            dev.copy_to_device(0, b"x", stream)
        with pytest.raises(ValueError, match="size"):
            dev.copy_to_host(ctypes.addressof(dst), -1, stream)
        err = rt.cudaMemcpyAsync(ctypes.addressof(dst), ctypes.addressof(dst), 8, 9, stream)
        assert int(err[0]) == 21  # cudaErrorInvalidMemcpyDirection
        with pytest.raises(pycoll.devices.DeviceError, match="cudaMemcpyAsync"):
            dev._copy(ctypes.addressof(dst), ctypes.addressof(dst), 8, 9, stream)
    finally:
        dev.destroy_stream(stream)
        rt.close()


def test_host_device_copies():
    from pycoll import _bindings
    from pycoll.devices import HostDevice

    dev = HostDevice(_bindings.load("host"))
    s = dev.create_stream()
    buf = (ctypes.c_char * 4)()
    try:
        dev.copy_to_device(ctypes.addressof(buf), b"wxyz", s)
        assert buf.raw == b"wxyz" and dev.copy_to_host(ctypes.addressof(buf), 4, s) == b"wxyz"
    finally:
        dev.destroy_stream(s)


def _bytes(rank, n, uid, emulated):
    if emulated:
        comm, _ = H.setup(rank, n, uid)
    else:
        comm = pycoll.init(rank, n, backend="host", unique_id=uid, timeout=20.0)
    out = [comm.broadcast_bytes(b"root-one" if rank == 1 else None, 8, root=1)]
    out.append(comm.broadcast_bytes(bytes(range(100)) if rank == 0 else None, 100))  # grows the buffer
    out.append(comm.broadcast_bytes(b"x" * 8 if rank == 0 else None, 8))
    errors = []
    for args in ((None, 0), (b"abc", 8), (None, True)):
        try:
            comm.broadcast_bytes(*args) if rank == 0 else None
        except (ValueError, TypeError) as exc:  # TypeError: a bool is not a size
            errors.append(str(exc).split(":")[0])
    comm.destroy()
    return out, errors


@pytest.mark.timeout(60)
@pytest.mark.parametrize("emulated", [True, False], ids=["emulated", "host"])
def test_broadcast_bytes(emulated):
    res = H.run_ranks(_bytes, 2, H.uid(), emulated, timeout=40)
    for out, _ in res:
        assert out == [b"root-one", bytes(range(100)), b"x" * 8]
    assert res[0][1] == ["broadcast_bytes"] * 3 and res[1][1] == []
