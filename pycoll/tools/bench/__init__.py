"""``pycoll-bench``: collective benchmarks in nccl-tests' format, with every result checked.

Usage::

    pycoll-bench all_reduce -n 2 -b 8 -e 64M -f 2          # 2 ranks of the host backend, 8 B..64 MiB
    pycoll-bench all -n 4 -b 1K -e 16M -f 4 -d float,half   # every collective, two datatypes
    pycoll-run -n 2 -m pycoll.bench reduce -r 1             # ranks started by a launcher
    python -m pycoll.bench all_gather -n 2 --json out.json --csv out.csv --plot out.png

Collectives are named as the :class:`~pycoll.Communicator` methods: ``all_reduce``,
``all_gather``, ``broadcast``, ``reduce_scatter``, ``reduce``, ``all_to_all``, ``gather``,
``scatter`` and ``send_recv`` (each rank sends to the next and receives from the previous one in
one group, as nccl-tests' ``sendrecv``); ``all`` runs every one. nccl-tests' names (``allreduce``,
``all_reduce_perf``...) are accepted too.

What it measures (the same conventions as nccl-tests):

* ``size``: bytes of the largest buffer one rank passes -- the buffer of all_reduce, broadcast,
  reduce, all_to_all and send_recv, the output of all_gather and gather, the input of
  reduce_scatter and scatter. Sizes run from ``-b`` to ``-e`` multiplying by ``-f`` (or adding
  ``-i`` bytes); ``8``, ``1K``, ``64M``, ``1G`` (powers of 1024) are accepted. A size is rounded
  down to whole elements and, where the buffer holds one block per rank, to a multiple of the
  number of ranks (at least one element per rank).
* ``time``: per iteration, the time of the slowest rank; the table shows the median over the
  iterations (JSON and CSV also give the mean, minimum and 90th percentile). On the host backend
  with no stream each call runs in the calling thread and is timed with the wall clock; on a GPU
  (or with ``--stream``) the ops of all iterations are queued back to back on one stream and
  every iteration is timed with events recorded around it.
* ``algbw`` = size / time; ``busbw`` = algbw x nccl-tests' bus factor: 2(n-1)/n for all_reduce,
  (n-1)/n for all_gather, reduce_scatter, all_to_all, gather and scatter, 1 for broadcast,
  reduce and send_recv. GB/s are 10^9 bytes per second.
* ``#wrong``: after the timed iterations the inputs are refilled with a known pattern, the
  operation runs once more and every element of every rank's output is compared with the
  expected values (exactly, or within a few units of the datatype's precision for reductions in
  floating point). The count is summed over ranks; ``-c 0`` skips the check (``N/A``).

Ranks: started by ``pycoll-run`` (or torchrun, SLURM, mpirun: see :mod:`pycoll.launch.discovery`) each process
is one rank and ``-n`` must match the job's size. Started directly with ``-n N > 1``, pycoll-bench
starts its own N ranks through ``pycoll-run`` and prints what rank 0 reports.

Exit status: 0 when every checked result was right, 1 when some value was wrong, 2 for bad
arguments, 3 when the run itself failed (a rank died, an operation failed or timed out).
"""

from __future__ import annotations

from .cli import main
from .spec import (
    COLLECTIVES,
    DTYPES,
    EXIT_FAILED,
    EXIT_OK,
    EXIT_USAGE,
    EXIT_WRONG,
    REDOPS,
    CollSpec,
    DType,
    format_size,
    parse_size,
    size_steps,
)

__all__ = [  # the stable surface; Case, build_case, measure... are building blocks that may change
    "COLLECTIVES",
    "DTYPES",
    "REDOPS",
    "CollSpec",
    "DType",
    "parse_size",
    "format_size",
    "size_steps",
    "main",
    "EXIT_OK",
    "EXIT_WRONG",
    "EXIT_USAGE",
    "EXIT_FAILED",
]
