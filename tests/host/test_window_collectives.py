"""Collectives over windows on the host backend: an all_reduce or reduce past PYCOLL_HOST_ONESHOT_MAX, and a
broadcast, all_gather, reduce_scatter, all_to_all, gather or scatter of more than one step of the segment (1 MiB
per rank and step up to 8 ranks; an all_to_all's and a scatter's blocks 1/N of that),
whose buffers lie in windows (SymmetricPool, register_window) on every rank go straight between the ranks'
windows.

Whether an operation took that path is seen through its failpoint, ``host.coll.window`` (passed only
there): armed with ``raise`` on every rank, an operation over windows fails naming it and any other
does not. Results are compared element by element (bit for bit: both paths reduce in rank order) with
the same operation on private arrays, which always goes through the segment.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time

import numpy as np
import pytest
from helpers import REPO
from helpers.mp import Died, run_ranks

import pycoll
from pycoll import _bindings as B

pytestmark = pytest.mark.timeout(120)

def _uid() -> bytes:
    return bytes(B.load("host").get_unique_id())


def _comm(rank, n, uid, **kw):
    return pycoll.init(rank, n, unique_id=uid, backend="host", **kw)


def _inputs(rank, count, dtype, seed):
    rng = np.random.default_rng(seed * 100 + rank)
    if np.dtype(dtype).kind == "f":
        return rng.uniform(-4, 4, count).astype(dtype)
    info = np.iinfo(dtype)
    return rng.integers(max(info.min, -1000), min(info.max, 1000), count, endpoint=True).astype(dtype)


CASES = [("float32", "sum"), ("float64", "prod"), ("int32", "max"), ("uint8", "min"), ("float16", "sum"),
         ("int64", "avg"), ("float32", "avg")]


def _freed_under_window(rank, n, uid):
    """Rank 0 frees its window's memory (ncclMemFree, the window still registered) and maps private memory at
    the same address: its all_reduce there must not go through the window (the peers would write into the
    freed pages, not into the new memory) but through the segment, with the right result."""
    import ctypes

    os.environ["PYCOLL_FAILPOINTS"] = "host.coll.window=raise"
    lib = B.load("host")
    comm = lib.comm_init_rank(n, B.UniqueId(uid), rank)
    size = 1 << 20
    ptr = lib.mem_alloc(size)
    win, _ = lib.comm_window_register(comm, ptr, size)
    if rank == 0:
        lib.mem_free(ptr)
        libc = ctypes.CDLL(None, use_errno=True)
        libc.mmap.restype = ctypes.c_void_p
        libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int,
                              ctypes.c_long]
        MAP_FIXED_NOREPLACE = 0x100000
        got = libc.mmap(ptr, size, 3, 0x02 | 0x20 | MAP_FIXED_NOREPLACE, -1, 0)  # RW, private, anonymous
        if got != ptr:
            return "could not map at the same address"
    count = size // 8
    arr = (ctypes.c_float * (2 * count)).from_address(ptr)
    x = np.frombuffer(arr, np.float32)
    x[:count] = rank + 1
    x[count:] = 0
    try:
        lib.all_reduce(ptr, ptr + size // 2, count, B.DataType.Float32, B.RedOp.Sum, comm, 0)
    except pycoll.PycollError as e:
        return f"error: {e}"
    ok = bool((x[count:] == n * (n + 1) / 2).all())
    lib.comm_window_deregister(comm, win)
    lib.comm_destroy(comm)
    return "segment" if ok else "WRONG"


def test_a_window_over_freed_memory_is_not_used():
    assert run_ranks(_freed_under_window, 2, _uid()) == ["segment"] * 2


# ---- every kind: results, the path taken, lost ranks, pieces, step counts ---------------------------------

BIG = (1 << 20) // 4 + 1001  # float32: just past one step of the segment (1 MiB)


def _big(dt):
    """Elements of ``dt`` just past one step of the segment."""
    return (1 << 20) // np.dtype(dt).itemsize + 1001


KINDS = ["all_reduce", "broadcast", "all_gather", "reduce_scatter", "all_to_all", "reduce", "gather", "scatter"]
ROOTED = ("broadcast", "reduce", "gather", "scatter")


def _blocks(kind, n):
    """Blocks of ``kind``'s input and output at ``n`` ranks."""
    return {"all_reduce": (1, 1), "broadcast": (1, 1), "all_gather": (1, n), "reduce_scatter": (n, 1),
            "all_to_all": (n, n), "reduce": (1, 1), "gather": (1, n), "scatter": (n, 1)}[kind]


def _defined(c, kind, root):
    """Whether this rank's output of ``kind`` has a defined value (a reduce's and a gather's: the root's only)."""
    return kind not in ("reduce", "gather") or c.rank == root


def _collectives(rank, n, uid, layout, misalign):
    """An all_reduce and a reduce_scatter (every op), every root of a broadcast, a reduce (every op), a gather and
    a scatter, an all_gather and an all_to_all of several dtypes, over windows and, for the expected values, on
    private arrays (an all_to_all in place: through the segment, checked all the same). A reduce's and a
    gather's outputs are compared on the root only."""
    c = _comm(rank, n, uid)
    most = (1 << 20) + 8 * 1001  # bytes of the largest block: _big's of float64
    pool = pycoll.SymmetricPool(c, (3 * n + 2) * most + 4096, alignment=4)
    if misalign and rank == 1:
        pool.empty(3, "uint8")  # rank 1's blocks sit 4 bytes further on: the ranks' alignments differ
    other = c.mem_alloc(n * most, "uint8")
    win = c.register_window(other) if layout == "two windows" else None
    wrong = []

    def output(count, dt):
        return other.view(dt)[:count] if layout == "two windows" else pool.empty(count, dt)

    def check(what, got, want):
        if not np.array_equal(got, want, equal_nan=True):
            wrong.append((what, int(np.count_nonzero(got != want))))

    rooted = [(kind, r) for r in range(n) for kind in ROOTED]  # every root
    for seed, (dt, op) in enumerate(CASES):
        big = _big(dt)
        mine = _inputs(rank, n * big, dt, seed)
        for kind, root in [("all_reduce", 0), ("all_gather", 0), ("reduce_scatter", 0), ("all_to_all", 0), *rooted]:
            blocks_in, blocks_out = _blocks(kind, n)
            want = np.empty(blocks_out * big, dt)
            _issue(c, kind, mine[:blocks_in * big].copy(), want, op=op, root=root)
            inp = pool.empty(blocks_in * big, dt)
            inp[:] = mine[:blocks_in * big]
            if layout == "in place":
                inp, out = _in_place(c, kind, inp, pool.empty(blocks_out * big, dt))
            else:
                out = output(blocks_out * big, dt)
            _issue(c, kind, inp, out, op=op, root=root)
            if _defined(c, kind, root):
                check((kind, dt, op, root), inp if out is None else out, want)
            del inp, out
    if win is not None:
        win.close()
    pool.close()
    c.destroy()
    return wrong


@pytest.mark.parametrize("n,layout,misalign,stores", [
    (2, "one pool", False, None), (3, "one pool", True, "65536"), (4, "in place", False, None),
    (3, "two windows", False, "0"), (2, "in place", True, "65536"), (2, "in place", False, "65536"),
])
def test_collectives_over_windows_equal_the_segments(n, layout, misalign, stores):
    """Streaming stores from 64 KiB on ("65536"), never ("0"), or as the process measures (None: the outputs here
    are below its 8 MiB)."""
    env = {"PYCOLL_HOST_STREAM_MIN": stores} if stores is not None else None
    assert run_ranks(_collectives, n, _uid(), layout, misalign, env=env, timeout=240) == [[]] * n




def _arrays(c, kind, count, empty):
    """The (input, output) of one ``kind`` operation of ``count`` elements per block, made by ``empty(size)``, the
    input filled so that :func:`_expected` knows the result (block k of rank r's input: r + 1 + 10 * k)."""
    r, blocks = c.rank, _blocks(kind, c.size)
    inp, out = empty(blocks[0] * count), empty(blocks[1] * count)
    inp[:] = np.repeat(r + 1 + 10 * np.arange(blocks[0], dtype=np.float32), count)
    return inp, out


def _in_place(c, kind, inp, out):
    """The same operation in place: (input, output) with the output holding the input (None: the input itself)."""
    r, count = c.rank, out.size // (c.size if kind in ("all_gather", "all_to_all", "gather") else 1)
    if kind in ("all_gather", "gather"):
        out[r * count:(r + 1) * count] = inp
        return out[r * count:(r + 1) * count], out
    if kind in ("reduce_scatter", "scatter"):
        return inp, inp[r * count:(r + 1) * count]
    return inp, None


def _issue(c, kind, inp, out, op="sum", async_op=False, root=None):
    """One ``kind`` operation (a rooted one from ``root``, by default the last rank), waited for."""
    root = c.size - 1 if root is None else root
    w = {"all_reduce": lambda: c.all_reduce(inp, out, op=op, async_op=async_op),
         "broadcast": lambda: c.broadcast(inp, root=root, output=out, async_op=async_op),
         "all_gather": lambda: c.all_gather(inp, out, async_op=async_op),
         "reduce_scatter": lambda: c.reduce_scatter(inp, out, op=op, async_op=async_op),
         "all_to_all": lambda: c.all_to_all(inp, out, async_op=async_op),
         "reduce": lambda: c.reduce(inp, root=root, output=out, op=op, async_op=async_op),
         "gather": lambda: c.gather(inp, out, root=root, async_op=async_op),
         "scatter": lambda: c.scatter(inp, out, root=root, async_op=async_op)}[kind]()
    w.wait()


def _expected(c, kind, count, scale=1.0):
    """This rank's output of :func:`_arrays`' ``kind`` operation from the last rank (where :func:`_defined`)."""
    n, r = c.size, c.rank
    ranks = np.arange(1, n + 1, dtype=np.float32)
    full = {"all_reduce": [ranks.sum() * scale], "broadcast": [n], "all_gather": ranks,
            "reduce_scatter": [(ranks + 10 * r).sum() * scale], "all_to_all": ranks + 10 * r,
            "reduce": [ranks.sum() * scale], "gather": ranks, "scatter": [n + 10 * r]}[kind]
    return np.repeat(np.asarray(full, np.float32), count)


def _which_path(rank, n, uid, kind, case):
    """Runs one ``kind`` operation of ``case`` with host.coll.window=raise armed on every rank: "windows" where it
    failed naming the failpoint, "segment" where it succeeded with the right result."""
    family = "PYCOLL_HOST_WINDOW_ALLREDUCE" if kind == "all_reduce" else "PYCOLL_HOST_WINDOW_COLLECTIVES"
    others = "PYCOLL_HOST_WINDOW_COLLECTIVES" if kind == "all_reduce" else "PYCOLL_HOST_WINDOW_ALLREDUCE"
    if case == "rank 1 opts out" and rank == 1:
        os.environ[family] = "0"
    if case == "the other family opted out":
        os.environ[others] = "0"
    os.environ["PYCOLL_FAILPOINTS"] = "host.coll.window=raise@1+"  # every pass: the cases share a process
    c = _comm(rank, n, uid, timeout=30, on_failure="report")
    count = 1000 if case == "one step" else BIG
    pool = pycoll.SymmetricPool(c, 2 * (2 * n + 1) * count * 4 + 4096)
    empty = pool.empty
    if case == "rank 1 private" and rank == 1:
        empty = lambda size: np.empty(size, np.float32)  # noqa: E731
    inp, out = _arrays(c, kind, count, empty)
    if case == "in place":
        inp, out = _in_place(c, kind, inp, out)
    if case == "window closed on rank 1" and rank == 1:
        pool.close()
    op = c.pre_mul_sum(2.0, "float32") if case == "premul" else "sum"
    reducing = kind in ("all_reduce", "reduce_scatter", "reduce")
    try:
        _issue(c, kind, inp, out, op=op if reducing else "sum")
    except pycoll.PycollError as e:
        res = "windows" if "failpoint host.coll.window" in str(e) else f"error: {e}"
    else:
        res = "segment"
    if res == "segment" and _defined(c, kind, n - 1):
        got = np.asarray(inp if out is None else out)
        want = _expected(c, kind, count, 2.0 if case == "premul" and reducing else 1.0)
        res = "segment" if np.array_equal(got, want) else "WRONG"
    c.abort()
    return res


def _path(kind, case):
    if case in ("one step", "rank 1 private", "rank 1 opts out", "window closed on rank 1"):
        return "segment"
    if case == "premul":  # PreMulSum's per-rank scalars: applied by the rank that publishes
        return "segment" if kind in ("all_reduce", "reduce_scatter", "reduce") else "windows"
    if case == "in place":  # a peer would overwrite a block of an all_to_all's rank before it sends it
        return "segment" if kind == "all_to_all" else "windows"
    return "windows"


def _which_paths(rank, n, uids, kind, cases):
    """:func:`_which_path` of each case in turn, a communicator each, in one process."""
    return [_which_path(rank, n, uid, kind, case) for uid, case in zip(uids, cases, strict=True)]


# the cases that set no switch for the whole process run one after the other in one pair of processes
CASES_TOGETHER = ("windows", "one step", "rank 1 private", "premul", "in place", "window closed on rank 1")


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("cases", [CASES_TOGETHER, ("the other family opted out",), ("rank 1 opts out",)],
                         ids=["together", "other family opted out", "rank 1 opts out"])
def test_the_path_taken(kind, cases):
    """Past PYCOLL_HOST_ONESHOT_MAX (all_reduce, reduce) or one step of the segment (the others: ``one step`` is
    below it), with every rank's buffers in windows; PYCOLL_HOST_WINDOW_ALLREDUCE governs all_reduce,
    PYCOLL_HOST_WINDOW_COLLECTIVES the others."""
    res = run_ranks(_which_paths, 2, [_uid() for _ in cases], kind, cases)
    for case, got in zip(cases, zip(*res, strict=True), strict=True):
        if _path(kind, case) == "windows":  # a rank may instead see the other's failure first
            assert "windows" in got and all(r == "windows" or r.startswith("error") for r in got), (case, got)
        else:
            assert got == ("segment",) * 2, (case, got)


def _victim(rank, n, uid, kind, action):
    if rank == 1:
        os.environ["PYCOLL_FAILPOINTS"] = f"host.coll.window={action}"
    c = _comm(rank, n, uid, timeout=4, on_failure="report")
    pool = pycoll.SymmetricPool(c, 2 * (2 * n + 1) * BIG * 4 + 4096)
    inp, out = _arrays(c, kind, BIG, pool.empty)
    t0 = time.monotonic()
    try:
        _issue(c, kind, inp, out, root=1)  # a broadcast's root stops while the others copy its buffer
    except pycoll.PycollError as e:
        res = (type(e).__name__, time.monotonic() - t0, str(e)[:300])
    else:
        res = ("no error", time.monotonic() - t0, "")
    c.abort()
    return res


@pytest.mark.parametrize("kind,action", [("all_reduce", "kill"), ("all_reduce", "stop"), ("all_reduce", "raise"),
                                         ("broadcast", "kill"), ("all_gather", "kill"), ("reduce_scatter", "kill"),
                                         ("all_to_all", "kill"), ("reduce", "kill"), ("gather", "kill"),
                                         ("scatter", "kill")])
def test_a_rank_lost_over_windows_fails_its_peers(kind, action):
    """Rank 1 killed, stopped or failed after its share (written into every rank's window, for most kinds),
    before the last arrival: the others do not hang -- a death or failure is reported at once, a stopped rank
    when the watchdog's timeout (4 s) runs out (the wait is the one every operation over windows ends with, so
    one kind is stopped)."""
    res = run_ranks(_victim, 3, _uid(), kind, action, may_die=[1] if action != "raise" else [], timeout=60)
    if action != "raise":
        assert isinstance(res[1], Died), res
    for name, elapsed, text in (res[0], res[2]):
        assert name != "no error", res
        if action == "stop":  # its timeout, or the other survivor's abort after its own timeout
            assert (name == "CommTimeout" or (name == "RemoteError" and "aborted the communicator" in text)) \
                and 3.5 < elapsed < 16, res
        else:  # at once, not at the timeout
            assert name != "CommTimeout" and elapsed < 3, res
            assert "failpoint host.coll.window" in text or "exited" in text or "rank 1" in text, res


def _large(rank, n, uid):
    """12 MB per block: each rank's share takes several pieces (4 MiB each), resumed between them; blocking and
    async_op (on the communicator's stream)."""
    c = _comm(rank, n, uid)
    count = 3 << 20
    pool = pycoll.SymmetricPool(c, (2 * n + 1) * count * 4 + 4096)
    ok = []
    for kind in KINDS:
        for async_op in (False, True):
            inp, out = _arrays(c, kind, count, pool.empty)
            _issue(c, kind, inp, out, async_op=async_op)
            ok.append(not _defined(c, kind, n - 1) or bool(np.array_equal(out, _expected(c, kind, count))))
            del inp, out
    pool.close()
    c.destroy()
    return ok


def test_large_operations_in_pieces():
    assert run_ranks(_large, 2, _uid()) == [[True] * 2 * len(KINDS)] * 2


def _step_counts(rank, n, uid):
    """all_reduce of 1 to 4 pipeline chunks (2 to 5 steps), broadcast and all_gather of 2 to 5 steps: the skipped
    steps end on either parity. Back to back and between operations through the segment, which must find the
    step numbering and descriptors as the windows' path leaves them."""
    c = _comm(rank, n, uid)
    chunk, step = (512 << 10) // 4, (1 << 20) // 4  # float32 elements of a pipeline chunk, of a step
    shapes = [(1, -3), (2, -7), (3, -5), (4, 1), (2, -7), (1, -3)]
    pool = pycoll.SymmetricPool(c, (n + 2) * (5 * step + 1) * 4 + 4096)
    wrong = []
    for i, (k, d) in enumerate(shapes):
        for kind, count in (("all_reduce", k * chunk + d), ("broadcast", (k + 1) * step + d),
                            ("all_gather", (k + 1) * step + d)):
            x = np.arange(count, dtype=np.float32) % 89 + i
            inp = pool.empty(count)
            inp[:] = x + rank
            out = pool.empty(n * count if kind == "all_gather" else count)
            _issue(c, kind, inp, out, root=i % n)
            want = {"all_reduce": n * x + n * (n - 1) / 2, "broadcast": x + i % n,
                    "all_gather": np.concatenate([x + r for r in range(n)])}[kind]
            private = np.full(1000 + i, rank + 1.0, np.float32)
            c.all_reduce(private)  # through the segment, between two operations over windows
            if not (np.array_equal(out, want) and (private == n * (n + 1) / 2).all()):
                wrong.append((kind, count))
            del inp, out
    pool.close()
    c.destroy()
    return wrong


@pytest.mark.parametrize("n", [2, 3])
def test_operations_of_every_step_count(n):
    assert run_ranks(_step_counts, n, _uid()) == [[]] * n


# ---- the weight-sync example ------------------------------------------------------------------------------


def _weight_sync(tmp_path, *args, **env):
    env = dict(os.environ, PYTHONPATH=REPO + os.pathsep + os.environ.get("PYTHONPATH", ""),
               PYCOLL_FR_DUMP_DIR=str(tmp_path), **env)
    cmd = [sys.executable, "-m", "pycoll.run", "-n", "3", "--timeout", "60",
           os.path.join(REPO, "examples", "weight_sync.py"), "--mib", "4", "--steps", "6", *args]
    t0 = time.monotonic()
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=90, env=env, cwd=REPO)
    return p, time.monotonic() - t0


@pytest.mark.parametrize("private", [False, True])
def test_the_weight_sync_example(tmp_path, private):
    p, _ = _weight_sync(tmp_path, *(["--private"] if private else []))
    assert p.returncode == 0, p.stdout + p.stderr
    kind = "private arrays" if private else "a SymmetricPool"
    assert f"6 weight syncs of 4.0 MiB from rank 0 to 2 ranks on {kind}" in p.stdout, p.stdout
    assert "every version checked" in p.stdout


def test_the_weight_sync_example_with_a_server_stopped(tmp_path):
    """A serving rank stopped inside a broadcast over windows: the trainer and the other server fail with the
    watchdog's error naming it, long before the 3 s deadline, and the run ends."""
    p, elapsed = _weight_sync(tmp_path, "--timeout", "3", PYCOLL_FAILPOINTS="host.coll.window=stop@3;rank=2")
    out = p.stdout + p.stderr
    assert p.returncode != 0, out
    assert "rank 2" in out and "is stopped (SIGSTOP)" in out and "broadcast" in out, out
    assert elapsed < 30, (elapsed, out)

