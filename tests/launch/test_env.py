"""Rank discovery from launcher environments, and opening the job's store."""

from __future__ import annotations

import functools
import os
import re
import socket
import time

import pytest
from helpers.mp import run_ranks

import pycoll
from pycoll.env import (
    RankDiscoveryError,
    RankInfo,
    discover,
    expand_nodelist,
    expand_tasks_per_node,
    first_host,
    open_store,
)
from pycoll.store import MemoryStore, TCPStore

PYCOLL = {
    "PYCOLL_RANK": "5", "PYCOLL_WORLD_SIZE": "8", "PYCOLL_LOCAL_RANK": "1", "PYCOLL_LOCAL_WORLD_SIZE": "4",
    "PYCOLL_NODE_RANK": "1", "PYCOLL_NNODES": "2", "PYCOLL_STORE_ADDR": "node0", "PYCOLL_STORE_PORT": "29400",
    "PYCOLL_STORE_TOKEN": "tok", "PYCOLL_RUN_ID": "abc",
}
TORCHRUN = {
    "RANK": "3", "WORLD_SIZE": "4", "LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "2", "GROUP_RANK": "1",
    "MASTER_ADDR": "10.0.0.1", "MASTER_PORT": "29500",
}
SLURM = {
    "SLURM_PROCID": "6", "SLURM_NTASKS": "7", "SLURM_LOCALID": "0", "SLURM_NODEID": "3", "SLURM_NNODES": "4",
    "SLURM_STEP_TASKS_PER_NODE": "2(x3),1", "SLURM_STEP_NODELIST": "gpu[07-09,12]", "SLURM_JOB_ID": "1234",
    "SLURM_STEP_ID": "0", "PYCOLL_STORE_TOKEN": "tok",
}
OMPI = {
    "OMPI_COMM_WORLD_RANK": "2", "OMPI_COMM_WORLD_SIZE": "4", "OMPI_COMM_WORLD_LOCAL_RANK": "0",
    "OMPI_COMM_WORLD_LOCAL_SIZE": "2",
}


def test_pycoll_variables():
    info = discover(PYCOLL)
    assert info == RankInfo(rank=5, world_size=8, local_rank=1, local_world_size=4, node_rank=1, nnodes=2,
                            store_addr="node0", store_port=29400, store_token="tok", source="pycoll", run_id="abc")
    assert not info.is_replacement
    minimal = discover({"PYCOLL_RANK": "1", "PYCOLL_WORLD_SIZE": "3"})
    assert (minimal.local_rank, minimal.local_world_size, minimal.node_rank, minimal.nnodes) == (1, 3, 0, 1)
    repl = discover(dict(PYCOLL, PYCOLL_REPLACEMENT="2", PYCOLL_REPLACES="5"))
    assert repl.is_replacement and repl.replacement == 2 and repl.replaces == 5


def test_torchrun_variables():
    info = discover(TORCHRUN)
    assert (info.rank, info.world_size, info.local_rank, info.local_world_size) == (3, 4, 1, 2)
    assert (info.node_rank, info.nnodes, info.store_addr, info.store_port) == (1, 2, "10.0.0.1", 29500)
    assert info.source == "torchrun" and info.store_token is None
    bare = discover({"RANK": "0", "WORLD_SIZE": "1"})
    assert (bare.local_rank, bare.local_world_size, bare.nnodes, bare.store_addr) == (0, 1, 1, None)


def test_slurm_variables():
    info = discover(SLURM)
    assert (info.rank, info.world_size, info.local_rank, info.local_world_size) == (6, 7, 0, 1)
    assert (info.node_rank, info.nnodes, info.store_addr, info.source) == (3, 4, "gpu07", "slurm")
    assert 20000 <= info.store_port < 40000 and info.store_token == "tok"
    assert discover(dict(SLURM, SLURM_STEP_ID="1")).store_port != info.store_port
    explicit = discover(dict(SLURM, PYCOLL_STORE_ADDR="head", PYCOLL_STORE_PORT="1234"))
    assert (explicit.store_addr, explicit.store_port) == ("head", 1234)
    master = discover(dict(SLURM, MASTER_ADDR="m", MASTER_PORT="99"))
    assert (master.store_addr, master.store_port) == ("m", 99)
    job_only = {k: v for k, v in SLURM.items() if not k.startswith("SLURM_STEP_")}
    job_only.update(SLURM_JOB_NODELIST="a1,b[2-3]", SLURM_TASKS_PER_NODE="2(x3),1")
    assert discover(job_only).store_addr == "a1"


def test_openmpi_variables():
    info = discover(OMPI)
    assert (info.rank, info.world_size, info.local_rank, info.local_world_size) == (2, 4, 0, 2)
    assert (info.node_rank, info.nnodes, info.store_addr, info.source) == (None, None, None, "openmpi")
    single = discover(dict(OMPI, OMPI_COMM_WORLD_LOCAL_SIZE="4", OMPI_COMM_WORLD_LOCAL_RANK="2"))
    assert (single.store_addr, single.nnodes, single.node_rank) == ("127.0.0.1", 1, 0)


def test_nothing_means_one_process():
    info = discover({})
    assert (info.rank, info.world_size, info.source) == (0, 1, "single")
    assert isinstance(open_store(info), MemoryStore)


def test_first_source_wins():
    everything = {**OMPI, **SLURM, **TORCHRUN, **PYCOLL}
    assert discover(everything).source == "pycoll"
    del everything["PYCOLL_RANK"], everything["PYCOLL_WORLD_SIZE"]
    assert discover(everything).source == "torchrun"
    for k in TORCHRUN:
        del everything[k]
    assert discover(everything).source == "slurm"
    del everything["SLURM_PROCID"]
    assert discover(everything).source == "openmpi"


@pytest.mark.parametrize("env, message", [
    ({"PYCOLL_RANK": "0"}, "PYCOLL_WORLD_SIZE is not set"),
    ({"PYCOLL_WORLD_SIZE": "2"}, "PYCOLL_RANK is not"),
    ({"PYCOLL_RANK": "2", "PYCOLL_WORLD_SIZE": "2"}, "PYCOLL_RANK=2 must be smaller than PYCOLL_WORLD_SIZE=2"),
    ({"PYCOLL_RANK": "x", "PYCOLL_WORLD_SIZE": "2"}, "PYCOLL_RANK='x' is not an integer"),
    ({"PYCOLL_RANK": "-1", "PYCOLL_WORLD_SIZE": "2"}, "PYCOLL_RANK=-1 must be >= 0"),
    ({"PYCOLL_RANK": "+1", "PYCOLL_WORLD_SIZE": "2"}, "PYCOLL_RANK='+1' is not an integer (decimal digits 0-9)"),
    ({"PYCOLL_RANK": "0", "PYCOLL_WORLD_SIZE": "1_0"}, "PYCOLL_WORLD_SIZE='1_0' is not an integer"),
    ({"PYCOLL_RANK": "\u0661", "PYCOLL_WORLD_SIZE": "2"}, "PYCOLL_RANK='\u0661' is not an integer"),
    ({"PYCOLL_RANK": "0", "PYCOLL_WORLD_SIZE": "0"}, "PYCOLL_WORLD_SIZE=0 must be >= 1"),
    ({"PYCOLL_RANK": "0", "PYCOLL_WORLD_SIZE": "2", "PYCOLL_LOCAL_RANK": "0"}, "set together"),
    ({**PYCOLL, "PYCOLL_LOCAL_RANK": "4"}, "PYCOLL_LOCAL_RANK=4 must be smaller"),
    ({**PYCOLL, "PYCOLL_NODE_RANK": "2"}, "PYCOLL_NODE_RANK=2 must be smaller than PYCOLL_NNODES=2"),
    ({**PYCOLL, "PYCOLL_LOCAL_WORLD_SIZE": "9", "PYCOLL_LOCAL_RANK": "1"}, "exceeds PYCOLL_WORLD_SIZE"),
    ({**PYCOLL, "PYCOLL_STORE_PORT": "70000"}, "not a TCP port"),
    ({**PYCOLL, "PYCOLL_REPLACES": "3"}, "PYCOLL_REPLACES=3 differs"),
    ({"RANK": "0"}, "RANK is set but WORLD_SIZE is not"),
    ({"WORLD_SIZE": "2"}, "WORLD_SIZE is set but RANK is not"),
    ({"RANK": "4", "WORLD_SIZE": "4"}, "RANK=4 must be smaller than WORLD_SIZE=4"),
    ({**TORCHRUN, "LOCAL_WORLD_SIZE": ""}, "LOCAL_RANK is set but LOCAL_WORLD_SIZE is not"),
    ({**TORCHRUN, "MASTER_PORT": ""}, "MASTER_ADDR is set but MASTER_PORT is not"),
    ({**TORCHRUN, "MASTER_PORT": "http"}, "MASTER_PORT='http' is not an integer"),
    ({**TORCHRUN, "GROUP_RANK": "2"}, "GROUP_RANK=2 must be smaller"),
    ({**SLURM, "SLURM_NTASKS": ""}, "SLURM_NTASKS is not set"),
    ({**SLURM, "SLURM_PROCID": "7"}, "SLURM_PROCID=7 must be smaller than SLURM_NTASKS=7"),
    ({**SLURM, "SLURM_NODEID": "4"}, "SLURM_NODEID=4 must be smaller"),
    ({**SLURM, "SLURM_STEP_TASKS_PER_NODE": "2(x4)"}, "adds up to 8 tasks, but SLURM_NTASKS=7"),
    ({**SLURM, "SLURM_STEP_TASKS_PER_NODE": "two"}, "bad SLURM tasks-per-node entry"),
    ({**SLURM, "SLURM_STEP_NODELIST": "gpu[07-"}, "unbalanced"),
    ({**SLURM, "SLURM_STEP_NODELIST": "n[1-\u0662]"}, "bad range"),  # other scripts' digits: no node numbers
    ({**SLURM, "SLURM_STEP_TASKS_PER_NODE": "\u0662(x\u0662)"}, "bad SLURM tasks-per-node entry"),
    ({**OMPI, "OMPI_COMM_WORLD_SIZE": ""}, "OMPI_COMM_WORLD_SIZE is not set"),
    ({**OMPI, "OMPI_COMM_WORLD_LOCAL_RANK": "2"}, "OMPI_COMM_WORLD_LOCAL_RANK=2 must be smaller"),
])
def test_bad_environments(env, message):
    with pytest.raises(RankDiscoveryError, match=re.escape(message)):
        discover(env)


@pytest.mark.parametrize("text, hosts", [
    ("node01", ["node01"]),
    ("node[01-04,07]", ["node01", "node02", "node03", "node04", "node07"]),
    ("node[008-011]", ["node008", "node009", "node010", "node011"]),
    ("a[1-2],b3,c-d.e", ["a1", "a2", "b3", "c-d.e"]),
    ("rack[1-2]-n[01-02]", ["rack1-n01", "rack1-n02", "rack2-n01", "rack2-n02"]),
    ("gpu[7],cpu[1,3]", ["gpu7", "cpu1", "cpu3"]),
])
def test_nodelist_expansion(text, hosts):
    assert expand_nodelist(text) == hosts
    assert first_host(text) == hosts[0]


@pytest.mark.parametrize("text", ["", "node[01-", "node]1[", "node[3-1]", "node[a-b]", "a,,b", "n[[1]]"])
def test_bad_nodelists(text):
    with pytest.raises(RankDiscoveryError):
        expand_nodelist(text)


def test_first_host_does_not_expand_huge_lists():
    assert first_host("n[0-999999],m[1-2]") == "n0"


@pytest.mark.parametrize("text, counts", [("4", [4]), ("2(x3),1", [2, 2, 2, 1]), ("1,2(x2)", [1, 2, 2])])
def test_tasks_per_node(text, counts):
    assert expand_tasks_per_node(text) == counts


@pytest.mark.parametrize("env, message", [
    ({**SLURM, "PYCOLL_STORE_TOKEN": ""}, "PYCOLL_STORE_TOKEN is not set"),
    ({**OMPI, "PYCOLL_STORE_TOKEN": "t", "PYCOLL_STORE_PORT": "5"}, "PYCOLL_STORE_ADDR"),
    ({**OMPI, "OMPI_COMM_WORLD_LOCAL_SIZE": "4", "PYCOLL_STORE_TOKEN": "t"}, "no store port"),
    ({**PYCOLL, "PYCOLL_STORE_ADDR": ""}, "pycoll-run"),
    ({**PYCOLL, "PYCOLL_STORE_PORT": "", "MASTER_PORT": "5"}, "no store port: set PYCOLL_STORE_PORT$"),  # not read
    ({**TORCHRUN, "MASTER_ADDR": "", "MASTER_PORT": ""}, "MASTER_ADDR and MASTER_PORT"),
])
def test_open_store_explains_what_is_missing(env, message):
    with pytest.raises(RankDiscoveryError, match=message):
        open_store(environ=env, connect_timeout=1)


def _exchange(rank, n, env_for_rank):
    os.environ.update(env_for_rank(rank, n))
    info = discover()
    store = open_store(timeout=30, connect_timeout=30)
    store.set(f"r{info.rank}", str(info.local_rank))
    values = store.multi_get([f"r{r}" for r in range(info.world_size)], timeout=30)
    store.add("done", 1)
    if info.rank == 0:  # the host keeps the store up until everyone is done with it
        while int(store.get("done")) < n:
            time.sleep(0.01)
    kind = type(store).__name__, type(getattr(store, "store", store)).__name__
    store.close()
    return info.source, values, kind


def _free_port() -> int:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def _ompi_env(port, rank, n):
    return {"OMPI_COMM_WORLD_RANK": str(rank), "OMPI_COMM_WORLD_SIZE": str(n),
            "OMPI_COMM_WORLD_LOCAL_RANK": str(rank), "OMPI_COMM_WORLD_LOCAL_SIZE": str(n),
            "PYCOLL_STORE_PORT": str(port), "PYCOLL_STORE_TOKEN": "secret"}


def _slurm_env(port, rank, n):
    return {"SLURM_PROCID": str(rank), "SLURM_NTASKS": str(n), "SLURM_LOCALID": str(rank),
            "SLURM_NODEID": "0", "SLURM_NNODES": "1", "SLURM_STEP_TASKS_PER_NODE": str(n),
            "SLURM_STEP_NODELIST": "localhost", "PYCOLL_STORE_ADDR": "127.0.0.1",
            "PYCOLL_STORE_PORT": str(port), "PYCOLL_STORE_TOKEN": "secret"}


def _slurm_elsewhere_env(port, rank, n):
    # the node's name resolves to an address of this host other than 127.0.0.1 (its network's, Debian's 127.0.1.1):
    # rank 0 of a single-node job listens on the loopback address only
    return {**_slurm_env(port, rank, n), "PYCOLL_STORE_ADDR": "127.0.0.2"}


def _torchrun_env(port, rank, n):
    return {"RANK": str(rank), "WORLD_SIZE": str(n), "LOCAL_RANK": str(rank), "LOCAL_WORLD_SIZE": str(n),
            "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)}


@pytest.mark.timeout(90)
@pytest.mark.parametrize("launcher", ["openmpi", "slurm", "slurm-elsewhere", "torchrun"])
def test_open_store_across_processes(launcher):
    """Rank 0 hosts the store (pycoll's, or torch's for torchrun); every rank reaches it."""
    if launcher == "torchrun":
        pytest.importorskip("torch.distributed")
    make_env = functools.partial({"openmpi": _ompi_env, "slurm": _slurm_env, "slurm-elsewhere": _slurm_elsewhere_env,
                                  "torchrun": _torchrun_env}[launcher], _free_port())
    n = 2 if launcher == "torchrun" else 3  # every torchrun rank imports torch: keep it small
    results = run_ranks(_exchange, n, make_env, timeout=75)
    for source, values, _kind in results:
        assert source == launcher.split("-")[0]
        assert values == [str(r).encode() for r in range(n)]
    if launcher == "torchrun":
        assert results[1][2] == ("PrefixStore", "TorchStoreAdapter")
    else:
        assert results[1][2][0] == "TCPStore"


def _two_inits(rank, n, make_env):
    import numpy as np

    os.environ.update(make_env(rank, n))
    out = []
    for name in ("dp", "tp"):  # the second hosted a second store on the same port: "Address already in use"
        c = pycoll.init(name=name, backend="host", init_timeout=30)
        x = np.ones(2, np.float32)
        c.all_reduce(x)
        out.append(x.tolist())
        c.destroy()
    return out


def _two_jobs_one_port(rank, n, port):
    """Processes 0 and 1: SLURM job 100's ranks; process 2: job 200's rank 1, whose own rank 0 could not host the
    store on the same port (taken): it reaches job 100's store with the same token."""
    import numpy as np

    job = "200" if rank == 2 else "100"
    os.environ.update({**_slurm_env(port, min(rank, 1), 2), "SLURM_JOB_ID": job, "SLURM_STEP_ID": "0"})
    if rank == 2:
        time.sleep(0.5)  # job 100's rank 0 hosts the store first; job 100's rank 1 comes later
        try:
            pycoll.init(backend="host", init_timeout=3)
            return "joined another job"
        except pycoll.StoreError as e:
            return type(e).__name__
    if rank == 1:
        time.sleep(1.5)
    c = pycoll.init(backend="host", init_timeout=20)
    x = np.full(2, 10.0 * int(job) + c.rank, np.float32)
    c.all_reduce(x)
    c.destroy()
    return x.tolist()


@pytest.mark.timeout(60)
def test_two_jobs_whose_stores_meet_do_not_mix_their_ranks():
    # job 200's rank 1 took job 100's rank 1 place (job 100 reduced 1000 + 2000 + 1, job 200 got a timeout)
    res = run_ranks(_two_jobs_one_port, 3, _free_port(), timeout=50)
    # job 200's rank 1 waits for its own job's rank 0 in vain, until its timeout or job 100's store closes
    assert res[0] == res[1] == [2001.0, 2001.0] and res[2] in ("StoreTimeout", "StoreLost"), res


def test_the_store_token_is_taken_as_it_is():
    # pycoll-run and TCPStore take PYCOLL_STORE_TOKEN as it is; discovery stripped it, and every rank of a
    # multi-node job whose token ended in a space or a carriage return was refused by the launcher's store
    assert discover({**SLURM, "PYCOLL_STORE_TOKEN": " s3cret \r"}).store_token == " s3cret \r"


@pytest.mark.timeout(90)
@pytest.mark.parametrize("launcher", ["openmpi", "slurm"])
def test_two_inits_from_the_environment_share_the_jobs_store(launcher):
    make_env = functools.partial({"openmpi": _ompi_env, "slurm": _slurm_env}[launcher], _free_port())
    assert run_ranks(_two_inits, 2, make_env, timeout=75) == [[[2.0, 2.0], [2.0, 2.0]]] * 2


def test_open_store_under_pycoll_run_env():
    host = TCPStore.hosting(token="tok", timeout=5)
    try:
        env = {"PYCOLL_RANK": "1", "PYCOLL_WORLD_SIZE": "2", "PYCOLL_STORE_ADDR": "127.0.0.1",
               "PYCOLL_STORE_PORT": str(host.port), "PYCOLL_STORE_TOKEN": "tok"}
        store = open_store(environ=env, timeout=5)
        store.set("k", b"v")
        assert host.get("k") == b"v"
        store.close()
    finally:
        host.close()


@pytest.mark.timeout(60)
def test_a_torchrun_rank_whose_store_never_comes_keeps_init_timeout_and_ends_on_sigterm():
    # torch's TCPStore was opened with max(300 s, init_timeout) for its connect; and SIGTERM, while the main thread
    # was blocked in that connect, ran into a Python handler of pycoll's that could not run before it returned
    pytest.importorskip("torch.distributed")
    import signal
    import subprocess
    import sys

    from helpers import REPO

    # torch.distributed imported first: its import (2-8 s on a busy 2-CPU machine) counts in the first init's time,
    # which this test does not measure
    code = ("import pycoll, time, torch.distributed\nfor limit in (1.0, 30.0):\n    t0 = time.monotonic()\n    try:\n"
            "        pycoll.init(init_timeout=limit, backend='host')\n    except pycoll.StoreError as e:\n"
            "        print(f'refused after {time.monotonic() - t0:.1f} s:', e, flush=True)\n")
    env = dict(os.environ, PYTHONPATH=REPO, **_torchrun_env(_free_port(), 1, 2))
    p = subprocess.Popen([sys.executable, "-c", code], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                         text=True)
    try:
        line = p.stdout.readline()  # the first init, refused after its 1 s (not torch's 300 s)
        assert "could not open torch's TCPStore" in line, line + p.stderr.read()
        assert float(line.split()[2]) < 5, line
        time.sleep(0.5)  # the second one is connecting
        assert p.poll() is None
        p.send_signal(signal.SIGTERM)
        assert p.wait(10) == -signal.SIGTERM
    finally:
        p.kill()
        p.wait()
        p.stdout.close()
        p.stderr.close()


_SLOW_IMPORT = """
import importlib.abc, sys, time
class Slow(importlib.abc.MetaPathFinder):  # torch.distributed's first import as long as on a busy machine
    def find_spec(self, name, path=None, target=None):
        if name == "torch.distributed":
            time.sleep(1.5)
        return None
sys.meta_path.insert(0, Slow())
import pycoll
t0 = time.monotonic()
try:
    pycoll.init(init_timeout=1.0, backend="host")
except pycoll.StoreError as e:
    print(f"{time.monotonic() - t0:.2f}", e, flush=True)
"""


@pytest.mark.timeout(60)
def test_a_torchrun_inits_import_of_torch_distributed_counts_in_its_init_timeout():
    # the connect to torch's store was given the whole init_timeout after an import that took longer than it
    pytest.importorskip("torch.distributed")
    import subprocess
    import sys

    from helpers import REPO

    env = dict(os.environ, PYTHONPATH=REPO, **_torchrun_env(_free_port(), 1, 2))
    out = subprocess.run([sys.executable, "-c", _SLOW_IMPORT], env=env, capture_output=True, text=True, timeout=50)
    took, _, text = out.stdout.partition(" ")
    assert "importing torch.distributed took" in text and "of the 1 s given to reach it" in text, out
    imported = float(text.split("importing torch.distributed took ")[1].split(" s ")[0])
    assert imported >= 1.5 and float(took) < imported + 0.7, out  # the import (to 0.1 s), no connect (1 s) after it


def test_a_port_taken_by_another_store_says_how_to_share_it():
    # torch.distributed's env:// rank 0 hosts its store on MASTER_PORT, which pycoll takes too outside torchrun
    taken = socket.socket()
    taken.bind(("127.0.0.1", 0))
    taken.listen(1)
    try:
        info = discover(_slurm_env(taken.getsockname()[1], 0, 2))
        with pytest.raises(pycoll.StoreError, match=r"choose another port with PYCOLL_STORE_PORT \(if "
                                                    r"torch.distributed's init_process_group hosts its store"):
            open_store(info, connect_timeout=2)
    finally:
        taken.close()
