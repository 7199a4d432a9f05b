"""A torch.distributed gloo job with torch's flight recorder on (the dumps pycoll-fr reads in test_analyze_torch.py).

    python torch_gloo_job.py RANK WORLD FOLDER

Every rank makes a second group of ranks 0 and 1 (whose two issue one all_reduce on it), then three on the default
group; rank 0 issues a fourth that no other rank does (asynchronously: it never completes). Each rank then writes
torch's dump (``_dump_fr_trace``, a pickle) as ``FOLDER/rank_<RANK>``; the others end once rank 0's is written."""

import os
import sys
import time

rank, world, folder = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
os.environ["TORCH_FR_BUFFER_SIZE"] = "100"

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
from torch._C._distributed_c10d import _dump_fr_trace  # noqa: E402

dist.init_process_group("gloo", init_method=f"file://{folder}/store", rank=rank, world_size=world)
pair = dist.new_group([0, 1])
t = torch.ones(4)
if rank in (0, 1):
    dist.all_reduce(t, group=pair)
for _ in range(3):
    dist.all_reduce(t)
if rank == 0:
    dist.all_reduce(t, async_op=True)
time.sleep(0.5)  # the completed operations retired
with open(os.path.join(folder, f"rank_{rank}.tmp"), "wb") as f:
    f.write(_dump_fr_trace(True, True, False))
os.rename(os.path.join(folder, f"rank_{rank}.tmp"), os.path.join(folder, f"rank_{rank}"))
deadline = time.monotonic() + 60  # the others stay until rank 0 dumped: their exit would end its all_reduce
while rank != 0 and not os.path.exists(os.path.join(folder, "rank_0")) and time.monotonic() < deadline:
    time.sleep(0.05)
os._exit(0)
