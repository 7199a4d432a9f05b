"""The README's fault-tolerant loop, as a rank of ``pycoll-run --keep-going`` (the failpoint tests run it).

Writes its pid to ``$FT_DIR/pid.<slot>`` and, when it finishes, its parameters to ``$FT_DIR/out.<slot>``.
"""

import os
import sys
import time

import numpy as np

import pycoll

STEPS = int(sys.argv[1]) if len(sys.argv) > 1 else 300
LR = 0.01


def send_state(group, params, step):
    """Rank 0's parameters and step to every member (a joiner too); returns the step."""
    state = np.append(params, float(step))
    group.comm.broadcast(state, root=0)
    params[:] = state[:-1]
    return int(state[-1])


def main():
    folder = os.environ["FT_DIR"]
    slot = int(os.environ["PYCOLL_RANK"])
    with open(os.path.join(folder, f"pid.{slot}"), "w") as f:
        f.write(str(os.getpid()))
    group = pycoll.ElasticGroup.from_env(timeout=5.0, name="ft")
    params, prev = np.zeros(8), np.zeros(8)
    step, sync = 0, group.joined  # a replacement first receives rank 0's model and step
    while step < STEPS or sync:
        try:
            if sync:  # a joiner, or every member after a reshape: rank 0's model and step
                step, sync = send_state(group, params, step), False
                continue
            grad = np.full(8, step + 1.0)
            group.comm.all_reduce(grad, op="avg")
            prev = params.copy()
            params -= LR * grad
            group.commit(step)
            step += 1
            if group.maybe_grow():
                send_state(group, params, step)
        except pycoll.CommFailure:
            mine = group.last_committed
            group.reshape()
            agreed = -1 if group.last_committed is None else group.last_committed
            if mine is not None and mine > agreed:
                params = prev
            step, sync = agreed + 1, True  # a joiner among the survivors may not have the state yet
        time.sleep(0.002)
    with open(os.path.join(folder, f"out.{slot}"), "w") as f:
        f.write(" ".join(repr(float(x)) for x in params) + f"\n{list(group.members)}\n")
    group.close()


if __name__ == "__main__":
    main()
