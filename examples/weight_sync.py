"""Weight synchronisation from a trainer to inference ranks with pycoll, over symmetric memory.

Run it on the host backend (no GPU needed)::

    pycoll-run -n 3 examples/weight_sync.py --mib 64 --steps 20
    pycoll-run -n 3 examples/weight_sync.py --mib 64 --steps 20 --private   # the same on private arrays

Rank 0 trains (here: it writes the next version of the weights), the other ranks serve; after every
training step the trainer broadcasts the weights. The weights live in a ``SymmetricPool``: memory every
rank registered as a window (``WIN_COLL_SYMMETRIC``), so on the host backend the broadcast goes
straight between the ranks' memory instead of through the shared segment
(``PYCOLL_HOST_WINDOW_COLLECTIVES``), and on NCCL they are the buffers its symmetric kernels want.
Each serving rank checks the version it got before it "serves" it. Every broadcast has the
communicator's deadline, and the watchdog turns a trainer or server that dies or stops into a clear
error on the others instead of a hang. This script fills and checks numpy arrays, so it runs on the
host backend; on GPUs the same calls take the pool's torch CUDA tensors (``PYCOLL_BACKEND=nccl``).
"""

import argparse
import time

import numpy as np

import pycoll
from pycoll.bindings import WIN_COLL_SYMMETRIC


def version(step: int, count: int, stride: int) -> np.ndarray:
    """The weights of training step ``step``, every ``stride``-th element (all the checks need)."""
    return (np.arange(0, count, stride) % 1000 + step).astype(np.float32)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--mib", type=float, default=64.0, help="size of the weights in MiB (default 64)")
    p.add_argument("--steps", type=int, default=20, help="training steps, one broadcast each (default 20)")
    p.add_argument("--private", action="store_true", help="plain numpy arrays instead of a SymmetricPool")
    p.add_argument("--timeout", type=float, default=60.0, help="deadline of every operation, seconds")
    a = p.parse_args()

    comm = pycoll.init(timeout=a.timeout, name="weights")
    if comm.backend != "host":
        raise SystemExit(f"this example fills and checks numpy arrays: run it on the host backend, not {comm.backend}")
    rank, n = comm.rank, comm.size
    count = max(1, int(a.mib * (1 << 20)) // 4)
    stride = max(1, count // 4096)
    # WIN_COLL_SYMMETRIC: on NCCL, what its symmetric kernels ask of a window (the host backend takes any flags)
    pool = None if a.private else pycoll.SymmetricPool(comm, count * 4 + 4096, flags=WIN_COLL_SYMMETRIC)
    weights = np.empty(count, np.float32) if pool is None else pool.empty(count, "float32")
    times = np.zeros(a.steps)
    for step in range(a.steps):
        if rank == 0:
            # a training step: the trainer writes the new weights in place
            weights[:] = np.arange(count, dtype=np.float32) % 1000 + step
        comm.barrier()  # time the broadcast alone, not the trainer's step
        t0 = time.perf_counter()
        comm.broadcast(weights, root=0)
        times[step] = time.perf_counter() - t0
        if rank != 0 and not np.array_equal(np.asarray(weights)[::stride], version(step, count, stride)):
            raise RuntimeError(f"rank {rank}: step {step}: the weights received are not the trainer's")
    slowest = np.empty(n * a.steps)
    comm.all_gather(times, slowest)
    if rank == 0:
        per_step = slowest.reshape(n, a.steps).max(axis=0)
        med = float(np.median(per_step))
        kind = "private arrays" if pool is None else "a SymmetricPool"
        print(f"{a.steps} weight syncs of {count * 4 / (1 << 20):.1f} MiB from rank 0 to {n - 1} ranks on {kind}: "
              f"median {med * 1e3:.2f} ms per sync, {count * 4 / med / 1e9:.2f} GB/s; every version checked")
    del weights
    if pool is not None:
        pool.close()
    comm.destroy()


if __name__ == "__main__":
    main()
