"""A torch.distributed gloo job with torch's flight recorder on (the dumps pycoll-fr reads in test_analyze_torch.py).

    python torch_gloo_job.py RANK WORLD FOLDER [world|pairs]

``world`` (the default): every rank makes a second group of ranks 0 and 1 (whose two issue one all_reduce on it),
then three on the default group; rank 0 issues a fourth that no other rank does (asynchronously: it never completes).
``pairs`` (4 ranks): groups [0, 2] and [1, 3]; rank 2 issues a second broadcast on the first that rank 0 does not.
Each rank then writes torch's dump (``_dump_fr_trace``, a pickle) as ``FOLDER/rank_<RANK>``, and ends once every
rank's is written (an exit would end another's operation)."""

import os
import sys
import time

rank, world, folder = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
scenario = sys.argv[4] if len(sys.argv) > 4 else "world"
os.environ["TORCH_FR_BUFFER_SIZE"] = "100"

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
from torch._C._distributed_c10d import _dump_fr_trace  # noqa: E402

dist.init_process_group("gloo", init_method=f"file://{folder}/store", rank=rank, world_size=world)
t = torch.ones(4)
if scenario == "world":
    pair = dist.new_group([0, 1])
    if rank in (0, 1):
        dist.all_reduce(t, group=pair)
    for _ in range(3):
        dist.all_reduce(t)
    if rank == 0:
        dist.all_reduce(t, async_op=True)
else:  # "pairs", 4 ranks: groups [0, 2] and [1, 3] (each process numbers its groups on its own)
    evens, odds = dist.new_group([0, 2]), dist.new_group([1, 3])
    dist.all_reduce(t)
    if rank in (0, 2):
        dist.broadcast(t, 0, group=evens)
        if rank == 2:  # rank 0 never enters the second one
            dist.broadcast(t, 0, group=evens, async_op=True)
    else:
        dist.all_reduce(t, group=odds)
        dist.all_reduce(t, group=odds)
time.sleep(0.5)  # the completed operations retired
with open(os.path.join(folder, f"rank_{rank}.tmp"), "wb") as f:
    f.write(_dump_fr_trace(True, True, False))
os.rename(os.path.join(folder, f"rank_{rank}.tmp"), os.path.join(folder, f"rank_{rank}"))
deadline = time.monotonic() + 60  # every rank stays until all dumped: an exit would end another's operation
while not all(os.path.exists(os.path.join(folder, f"rank_{r}")) for r in range(world)) and time.monotonic() < deadline:
    time.sleep(0.05)
os._exit(0)
