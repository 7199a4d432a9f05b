"""Random programs on the emulated GPU: pycoll's GPU path over several streams, every result checked.

The same program on every rank -- all_reduce (in place or not), broadcast, all_gather, reduce_scatter and a
send/recv ring, of 1 to 50,000 elements and three dtypes, on torch-like or CuPy-like arrays; blocking,
asynchronous or in groups of up to five; on the framework's current stream (which the program moves now and
then), the legacy stream 0 or one of two created streams; with kernels of 2 ms launched on the streams between
them -- and the outstanding operations waited for in a random order now and then. One communicator's operations
meet in the order they were issued whatever their streams (NCCL orders them; the host library as well).
"""

from __future__ import annotations

import random

import emu_helpers as H
import numpy as np
import pytest
from helpers.programs import drive, value

pytestmark = pytest.mark.emulated_gpu


def _program(rank, n, uid, seed, length):
    import pycoll.emulated as emu

    comm, rt = H.setup(rank, n, uid, timeout=30)
    dev = comm.device
    rng = random.Random(seed)
    streams = [None, 0, dev.create_stream(), dev.create_stream()]
    wrong = []

    def issue(i, async_op):
        kind, count = rng.choice(("all_reduce", "in_place", "broadcast", "all_gather", "reduce_scatter", "ring")), \
            rng.choice([1, 7, 64, 4096, 50000])
        dtype, stream, root = rng.choice([np.float32, np.float64, np.int32]), rng.choice(streams), rng.randrange(n)
        flavour = rng.choice([emu.TorchLikeTensor, emu.CupyLikeArray])
        if rng.random() < 0.15:
            rt.sleep(rng.choice(streams[1:]), 0.002)
        if rng.random() < 0.1:
            rt.torch.set_stream(rng.choice(streams[1:]), dev.device_id)

        def arr(a):
            return flavour(rt, a, device=dev.device_id)

        mine, kw = value(rank, i, count, dtype), dict(stream=stream, async_op=async_op)
        total = sum(value(k, i, count, dtype) for k in range(n))
        if kind == "all_reduce":
            x, out = arr(mine), arr(np.zeros(count, dtype))
            w, want = comm.all_reduce(x, out, **kw), total
        elif kind == "in_place":
            out = arr(mine)
            w, want = comm.all_reduce(out, **kw), total
        elif kind == "broadcast":
            out = arr(mine)
            w, want = comm.broadcast(out, root=root, **kw), value(root, i, count, dtype)
        elif kind == "all_gather":
            x, out = arr(mine), arr(np.zeros(count * n, dtype))
            w, want = comm.all_gather(x, out, **kw), np.concatenate([value(k, i, count, dtype) for k in range(n)])
        elif kind == "reduce_scatter":
            whole = [value(k, i, count * n, dtype) for k in range(n)]
            x, out = arr(whole[rank]), arr(np.zeros(count, dtype))
            w, want = comm.reduce_scatter(x, out, **kw), sum(whole)[rank * count:(rank + 1) * count]
        else:
            x, out = arr(mine), arr(np.zeros(count, dtype))
            with comm.group():
                comm.send(x, (rank + 1) % n, **kw)
                w = comm.recv(out, (rank - 1) % n, **kw)
            want = value((rank - 1) % n, i, count, dtype)
        return w, (kind, i, out, want.astype(dtype))

    def check(w, item):
        w.wait()
        kind, i, out, want = item
        if not np.array_equal(out.host, want):
            wrong.append((kind, i))

    drive(comm, rng, length, issue, check)
    comm.destroy()
    return wrong


@pytest.mark.timeout(90)
@pytest.mark.parametrize("n,seed", [(2, 1), (3, 2)])
def test_random_programs_over_four_streams_give_every_result(n, seed):
    assert H.run_ranks(_program, n, H.uid(), seed, 150, timeout=80) == [[]] * n
