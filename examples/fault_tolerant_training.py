"""Fault-tolerant data-parallel training with pycoll: lose a rank, shrink, go on, grow back.

Run it on the host backend (no GPU needed)::

    pycoll-run -n 4 --replace-failed 1 examples/fault_tolerant_training.py

Kill any rank while it runs (``kill -9 <pid>``; the script also has ``--kill-slot``/``--kill-step``
to do it itself): the others agree on who is gone, shrink the communicator and carry on; the
launcher starts a replacement, which joins at a step boundary and receives the model (where it is up
before training ends: 1000 steps by default, about 6 s).
On GPUs, run it with ``PYCOLL_BACKEND=nccl`` and torch CUDA tensors instead of numpy arrays.
"""

import argparse
import os
import signal
import time

import numpy as np

import pycoll


def send_state(group, params, step):
    """Rank 0 broadcasts the model and the step; every other member (a joiner too) receives them."""
    state = np.append(params, float(step))
    group.comm.broadcast(state, root=0)
    params[:] = state[:-1]
    return int(state[-1])


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=1000)  # ~6 s: a replacement is up before the end (~2 s to start)
    p.add_argument("--kill-slot", type=int, default=-1, help="this slot kills itself once (-1: none)")
    p.add_argument("--kill-step", type=int, default=50)
    args = p.parse_args()

    try:
        group = pycoll.ElasticGroup.from_env(timeout=10.0)
    except pycoll.Excluded as e:  # a replacement that came after the end of training
        print(f"not needed any more: {e}", flush=True)
        return
    rng = np.random.default_rng(group.slot)  # this slot's shard of the data
    true_w = np.arange(4.0)
    x = rng.standard_normal((256, 4))
    y = x @ true_w

    params, step = np.zeros(4), 0
    prev = params.copy()
    sync = group.joined  # a replacement process first receives the model and the step
    while step < args.steps or sync:
        if group.slot == args.kill_slot and step == args.kill_step and not os.environ.get("PYCOLL_REPLACES"):
            os.kill(os.getpid(), signal.SIGKILL)
        try:
            if sync:  # a joiner, or every survivor after a reshape: rank 0's model and step
                step, sync = send_state(group, params, step), False
                continue
            grad = x.T @ (x @ params - y) / len(y)
            group.comm.all_reduce(grad, op="avg")
            prev = params.copy()
            params -= 0.05 * grad
            group.commit(step)  # this member completed the step
            step += 1
            if group.maybe_grow():  # a step boundary: admit replacements, send them the model
                send_state(group, params, step)
                if group.rank == 0:
                    print(group.transitions[-1].describe(), flush=True)
        except pycoll.CommFailure:  # a member died or stopped: in a collective, in maybe_grow(), in the sync
            mine = group.last_committed
            group.reshape()  # the survivors agree on the members and on the last step all of them completed
            agreed = -1 if group.last_committed is None else group.last_committed
            if mine is not None and mine > agreed:
                params = prev  # this member was one step ahead (its all_reduce succeeded): undo it
            step, sync = agreed + 1, True  # a replacement among the survivors may not have the model yet
            if group.rank == 0:
                print(group.transitions[-1].describe(), flush=True)
        time.sleep(0.005)
    if group.rank == 0:
        print(f"done: {group.size} ranks, generation {group.generation}, w = {np.round(params, 3)}", flush=True)
    group.close()


if __name__ == "__main__":
    main()
