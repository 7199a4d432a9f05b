"""Rank discovery: who am I, how many are we, and where is the store.

:func:`discover` reads the environment a launcher left and returns a :class:`RankInfo`. Sources,
first match wins:

1. **pycoll** (``pycoll-run``), when ``PYCOLL_RANK`` is set:

   ============================  ==================================================================
   ``PYCOLL_RANK``               global rank of this process's slot, ``0 <= rank < world size``
   ``PYCOLL_WORLD_SIZE``         number of ranks in the job
   ``PYCOLL_LOCAL_RANK``         rank on this node
   ``PYCOLL_LOCAL_WORLD_SIZE``   ranks on this node
   ``PYCOLL_NODE_RANK``          index of this node, ``0 <= node rank < nnodes``
   ``PYCOLL_NNODES``             number of nodes
   ``PYCOLL_STORE_ADDR``         host of the job's TCP store (hosted by the launcher of node 0)
   ``PYCOLL_STORE_PORT``         its port
   ``PYCOLL_STORE_TOKEN``        its shared secret (also read by SLURM/Open MPI jobs, see below)
   ``PYCOLL_RUN_ID``             random id of this launch, the same on every node (for file names, logs)
   ``PYCOLL_REPLACEMENT``        0 for a rank started with the job; k >= 1 for the k-th process
                                 started to replace a dead process of the same rank slot
   ``PYCOLL_REPLACES``           set on replacements only: the rank slot whose process died
                                 (equal to ``PYCOLL_RANK``). A replacement's rank in a communicator
                                 is decided when it joins (see the elastic layer).
   ============================  ==================================================================

2. **torchrun**, when ``RANK`` or ``WORLD_SIZE`` is set: ``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``,
   ``LOCAL_WORLD_SIZE``, ``GROUP_RANK`` (node rank), ``MASTER_ADDR``, ``MASTER_PORT``.
3. **SLURM** (an ``srun`` step), when ``SLURM_PROCID`` is set: ``SLURM_PROCID``, ``SLURM_NTASKS``,
   ``SLURM_LOCALID``, ``SLURM_NODEID``, ``SLURM_STEP_NUM_NODES``/``SLURM_NNODES``,
   ``SLURM_STEP_TASKS_PER_NODE``/``SLURM_TASKS_PER_NODE`` (e.g. ``2(x3),1``) and the first host of
   ``SLURM_STEP_NODELIST``/``SLURM_JOB_NODELIST`` (e.g. ``node[01-04,07]``) as the store host.
4. **Open MPI** (``mpirun``), when ``OMPI_COMM_WORLD_RANK`` is set: ``OMPI_COMM_WORLD_RANK``,
   ``OMPI_COMM_WORLD_SIZE``, ``OMPI_COMM_WORLD_LOCAL_RANK``, ``OMPI_COMM_WORLD_LOCAL_SIZE``. Open MPI
   does not say which node a process is on, so ``node_rank`` and ``nnodes`` are None.
5. Nothing: a single process (rank 0 of 1, source ``"single"``).

Partial or inconsistent variables (``RANK`` without ``WORLD_SIZE``, a rank not below the size, a
non-integer) raise :class:`RankDiscoveryError` naming the variable.

For SLURM and Open MPI jobs rank 0 hosts a pycoll TCP store (:func:`open_store`). Its address is
``PYCOLL_STORE_ADDR``, else ``MASTER_ADDR``, else (SLURM) the first host of the step or
(single-node Open MPI) loopback; its port ``PYCOLL_STORE_PORT``, else ``MASTER_PORT``, else one
derived from ``SLURM_JOB_ID``/``SLURM_STEP_ID`` (SLURM). ``PYCOLL_STORE_TOKEN`` is required there:
every rank must know the same secret, e.g. ``export PYCOLL_STORE_TOKEN=$(openssl rand -hex 32)``
before ``sbatch``/``mpirun``. ``PYCOLL_STORE_BIND`` overrides the address rank 0 binds (default:
every interface for a multi-node job, loopback otherwise).
"""

from __future__ import annotations

import os
import re
import threading
import time
import zlib
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, Dict, Iterator, List, Literal, Mapping, Optional, Tuple, overload

from ..errors import RankDiscoveryError, StoreError
from ..store import DEFAULT_TIMEOUT, MemoryStore, PrefixStore, Store, TCPStore, wrap_torch_store
from ..store.tcp_server import unauthenticated_for

__all__ = [
    "RankInfo",
    "RankDiscoveryError",
    "discover",
    "open_store",
    "job_store",
    "expand_nodelist",
    "first_host",
    "expand_tasks_per_node",
    "ENV_RANK",
    "ENV_WORLD_SIZE",
    "ENV_LOCAL_RANK",
    "ENV_LOCAL_WORLD_SIZE",
    "ENV_NODE_RANK",
    "ENV_NNODES",
    "ENV_STORE_ADDR",
    "ENV_STORE_PORT",
    "ENV_STORE_TOKEN",
    "ENV_RUN_ID",
    "ENV_REPLACEMENT",
    "ENV_REPLACES",
    "ENV_STORE_BIND",
]

ENV_RANK = "PYCOLL_RANK"
ENV_WORLD_SIZE = "PYCOLL_WORLD_SIZE"
ENV_LOCAL_RANK = "PYCOLL_LOCAL_RANK"
ENV_LOCAL_WORLD_SIZE = "PYCOLL_LOCAL_WORLD_SIZE"
ENV_NODE_RANK = "PYCOLL_NODE_RANK"
ENV_NNODES = "PYCOLL_NNODES"
ENV_STORE_ADDR = "PYCOLL_STORE_ADDR"
ENV_STORE_PORT = "PYCOLL_STORE_PORT"
ENV_STORE_TOKEN = "PYCOLL_STORE_TOKEN"
ENV_STORE_BIND = "PYCOLL_STORE_BIND"
ENV_RUN_ID = "PYCOLL_RUN_ID"
ENV_REPLACEMENT = "PYCOLL_REPLACEMENT"
ENV_REPLACES = "PYCOLL_REPLACES"

_LOOPBACK = "127.0.0.1"
_DIGITS = re.compile(r"-?[0-9]+")


@dataclass(frozen=True)
class RankInfo:
    """Where this process stands in the job.

    Attributes:
        rank, world_size: global rank and number of ranks.
        local_rank, local_world_size: rank on this node and ranks on this node.
        node_rank, nnodes: this node's index and the number of nodes (None when the launcher does
            not say, e.g. Open MPI).
        store_addr, store_port, store_token: where the job's store is (None when unknown).
        source: ``"pycoll"``, ``"torchrun"``, ``"slurm"``, ``"openmpi"`` or ``"single"``.
        replacement: 0, or k >= 1 for the k-th replacement process of this rank slot (pycoll-run).
        replaces: the rank slot a replacement process replaces (None otherwise).
        run_id: the launcher's id of this run, if it gives one (SLURM: ``<job id>.<step id>``); pycoll.init's ranks
            meet under it in the store.
    """

    rank: int
    world_size: int
    local_rank: int
    local_world_size: int
    node_rank: Optional[int]
    nnodes: Optional[int]
    store_addr: Optional[str]
    store_port: Optional[int]
    store_token: Optional[str]
    source: str
    replacement: int = 0
    replaces: Optional[int] = None
    run_id: Optional[str] = None

    @property
    def is_replacement(self) -> bool:
        """Whether this process was started to replace a dead one."""
        return self.replacement > 0


# --------------------------------------------------------------------------------------------------
# SLURM list formats


def _split_top(text: str) -> List[str]:
    """Split at commas that are not inside brackets."""
    parts, depth, start = [], 0, 0
    for i, ch in enumerate(text):
        if ch == "[":
            depth += 1
            if depth > 1:
                raise RankDiscoveryError(f"nested brackets in SLURM node list {text!r}")
        elif ch == "]":
            depth -= 1
            if depth < 0:
                raise RankDiscoveryError(f"unbalanced ']' in SLURM node list {text!r}")
        elif ch == "," and depth == 0:
            parts.append(text[start:i])
            start = i + 1
    if depth:
        raise RankDiscoveryError(f"unbalanced '[' in SLURM node list {text!r}")
    parts.append(text[start:])
    return parts


def _expand_range_list(body: str, text: str) -> Iterator[str]:
    """Yield the numbers of a bracket body (``01-04,07``) lazily, keeping zero padding."""
    ranges = []
    for item in body.split(","):  # validate everything before yielding anything
        m = re.fullmatch(r"([0-9]+)(?:-([0-9]+))?", item.strip())
        if not m:
            raise RankDiscoveryError(f"bad range {item!r} in SLURM node list {text!r}")
        lo_s, hi_s = m.group(1), m.group(2) or m.group(1)
        if int(hi_s) < int(lo_s):
            raise RankDiscoveryError(f"descending range {item!r} in SLURM node list {text!r}")
        ranges.append((int(lo_s), int(hi_s), len(lo_s)))
    for lo, hi, width in ranges:
        for i in range(lo, hi + 1):
            yield str(i).zfill(width)


def _expand_host(expr: str, text: str) -> Iterator[str]:
    m = re.search(r"\[([^\]]*)\]", expr)
    if m is None:
        if "[" in expr or "]" in expr:
            raise RankDiscoveryError(f"unbalanced brackets in SLURM node list {text!r}")
        yield expr
        return
    head, tail = expr[:m.start()], expr[m.end():]
    for item in _expand_range_list(m.group(1), text):
        for rest in _expand_host(tail, text):
            yield head + item + rest


def expand_nodelist(text: str) -> List[str]:
    """Expand a SLURM host list: ``"node[01-03,07],gpu1"`` -> node01 node02 node03 node07 gpu1."""
    text = text.strip()
    if not text:
        raise RankDiscoveryError("empty SLURM node list")
    hosts: List[str] = []
    for part in _split_top(text):
        part = part.strip()
        if not part:
            raise RankDiscoveryError(f"empty entry in SLURM node list {text!r}")
        hosts.extend(_expand_host(part, text))
    return hosts


def first_host(text: str) -> str:
    """The first host of a SLURM host list, without expanding the rest."""
    text = text.strip()
    if not text:
        raise RankDiscoveryError("empty SLURM node list")
    first = _split_top(text)[0].strip()
    if not first:
        raise RankDiscoveryError(f"empty entry in SLURM node list {text!r}")
    return next(_expand_host(first, text))


def expand_tasks_per_node(text: str) -> List[int]:
    """Expand SLURM's tasks-per-node format: ``"2(x3),1"`` -> [2, 2, 2, 1]."""
    out: List[int] = []
    for item in text.strip().split(","):
        m = re.fullmatch(r"\s*([0-9]+)(?:\(x([0-9]+)\))?\s*", item)
        if not m:
            raise RankDiscoveryError(f"bad SLURM tasks-per-node entry {item!r} in {text!r}")
        count = int(m.group(2)) if m.group(2) else 1
        if count > 1_000_000:
            raise RankDiscoveryError(f"implausible repeat count in SLURM tasks-per-node {text!r}")
        out.extend([int(m.group(1))] * count)
    return out


# --------------------------------------------------------------------------------------------------
# parsing helpers


def _get(env: Mapping[str, str], name: str) -> Optional[str]:
    value = env.get(name)
    if value is None or value.strip() == "":
        return None
    return value.strip()


def _token(env: Mapping[str, str]) -> Optional[str]:
    """``PYCOLL_STORE_TOKEN`` as it is, spaces and all (None where unset or blank): pycoll-run, the standalone store
    and ``TCPStore`` take it so, and a secret read with ``$(cat file)`` may end in a carriage return."""
    value = env.get(ENV_STORE_TOKEN)
    return None if value is None or value.strip() == "" else value


@overload
def _int(env: Mapping[str, str], name: str, *, required: Literal[True] = True, minimum: int = 0,
         why: str = "") -> int: ...
@overload
def _int(env: Mapping[str, str], name: str, *, required: bool, minimum: int = 0, why: str = "") -> Optional[int]: ...


def _int(env: Mapping[str, str], name: str, *, required: bool = True, minimum: int = 0,
         why: str = "") -> Optional[int]:
    raw = _get(env, name)
    if raw is None:
        if required:
            raise RankDiscoveryError(f"{name} is not set{why}")
        return None
    # launchers write plain decimal numbers: int() would also take '+1', '1_0' and other scripts' digits
    if not _DIGITS.fullmatch(raw.strip()):
        raise RankDiscoveryError(f"{name}={raw!r} is not an integer (decimal digits 0-9)")
    value = int(raw)
    if value < minimum:
        raise RankDiscoveryError(f"{name}={value} must be >= {minimum}")
    return value


def _port(env: Mapping[str, str], name: str) -> Optional[int]:
    port = _int(env, name, required=False, minimum=1)
    if port is not None and port > 65535:
        raise RankDiscoveryError(f"{name}={port} is not a TCP port (1..65535)")
    return port


def _below(what: str, value: Optional[int], what_n: str, n: Optional[int]) -> None:
    if value is not None and n is not None and value >= n:
        raise RankDiscoveryError(f"{what}={value} must be smaller than {what_n}={n}")


def _check_sizes(info: RankInfo, names: Mapping[str, str]) -> RankInfo:
    _below(names["rank"], info.rank, names["world_size"], info.world_size)
    _below(names["local_rank"], info.local_rank, names["local_world_size"], info.local_world_size)
    if info.local_world_size > info.world_size:
        raise RankDiscoveryError(f"{names['local_world_size']}={info.local_world_size} exceeds "
                                 f"{names['world_size']}={info.world_size}")
    if info.node_rank is not None and info.nnodes is not None:
        _below(names["node_rank"], info.node_rank, names["nnodes"], info.nnodes)
    if info.nnodes is not None and info.nnodes > info.world_size:
        raise RankDiscoveryError(f"{names['nnodes']}={info.nnodes} exceeds {names['world_size']}={info.world_size}")
    return info


# --------------------------------------------------------------------------------------------------
# sources


def _from_pycoll(env: Mapping[str, str]) -> RankInfo:
    why = " (PYCOLL_RANK is set, so the pycoll-run variables must be complete)"
    rank = _int(env, ENV_RANK)
    world = _int(env, ENV_WORLD_SIZE, minimum=1, why=why)
    local_rank = _int(env, ENV_LOCAL_RANK, required=False)
    local_world = _int(env, ENV_LOCAL_WORLD_SIZE, required=False, minimum=1)
    if (local_rank is None) != (local_world is None):
        raise RankDiscoveryError(f"{ENV_LOCAL_RANK} and {ENV_LOCAL_WORLD_SIZE} must be set together")
    node_rank = _int(env, ENV_NODE_RANK, required=False)
    nnodes = _int(env, ENV_NNODES, required=False, minimum=1)
    if local_rank is None or local_world is None:  # both are None (checked above)
        local_rank, local_world = rank, world
        node_rank = 0 if node_rank is None else node_rank
        nnodes = 1 if nnodes is None else nnodes
    replacement = _int(env, ENV_REPLACEMENT, required=False) or 0
    replaces = _int(env, ENV_REPLACES, required=False)
    if replaces is not None and replaces != rank:
        raise RankDiscoveryError(f"{ENV_REPLACES}={replaces} differs from {ENV_RANK}={rank}")
    if replacement and replaces is None:
        replaces = rank
    info = RankInfo(
        rank=rank, world_size=world, local_rank=local_rank, local_world_size=local_world,
        node_rank=node_rank, nnodes=nnodes,
        store_addr=_get(env, ENV_STORE_ADDR), store_port=_port(env, ENV_STORE_PORT),
        store_token=_token(env), source="pycoll",
        replacement=replacement, replaces=replaces, run_id=_get(env, ENV_RUN_ID),
    )
    return _check_sizes(info, {"rank": ENV_RANK, "world_size": ENV_WORLD_SIZE, "local_rank": ENV_LOCAL_RANK,
                               "local_world_size": ENV_LOCAL_WORLD_SIZE, "node_rank": ENV_NODE_RANK,
                               "nnodes": ENV_NNODES})


def _from_torchrun(env: Mapping[str, str]) -> RankInfo:
    if _get(env, "RANK") is None or _get(env, "WORLD_SIZE") is None:
        have, lack = ("RANK", "WORLD_SIZE") if _get(env, "RANK") is not None else ("WORLD_SIZE", "RANK")
        raise RankDiscoveryError(f"{have} is set but {lack} is not: torchrun-style launchers set both")
    rank = _int(env, "RANK")
    world = _int(env, "WORLD_SIZE", minimum=1)
    local_rank = _int(env, "LOCAL_RANK", required=False)
    local_world = _int(env, "LOCAL_WORLD_SIZE", required=False, minimum=1)
    if local_rank is None and local_world is None:
        local_rank, local_world = rank, world
    elif local_rank is None or local_world is None:
        have, lack = ("LOCAL_RANK", "LOCAL_WORLD_SIZE") if local_rank is not None else ("LOCAL_WORLD_SIZE",
                                                                                        "LOCAL_RANK")
        raise RankDiscoveryError(f"{have} is set but {lack} is not")
    node_rank = _int(env, "GROUP_RANK", required=False)
    nnodes: Optional[int] = None
    if local_world == world:
        nnodes, node_rank = 1, 0 if node_rank is None else node_rank
    elif world % local_world == 0:
        nnodes = world // local_world
    addr, port = _get(env, "MASTER_ADDR"), _port(env, "MASTER_PORT")
    if (addr is None) != (port is None):
        have, lack = ("MASTER_ADDR", "MASTER_PORT") if addr is not None else ("MASTER_PORT", "MASTER_ADDR")
        raise RankDiscoveryError(f"{have} is set but {lack} is not")
    info = RankInfo(
        rank=rank, world_size=world, local_rank=local_rank, local_world_size=local_world,
        node_rank=node_rank, nnodes=nnodes, store_addr=addr, store_port=port, store_token=None,
        source="torchrun", run_id=_get(env, "TORCHELASTIC_RUN_ID"),
    )
    return _check_sizes(info, {"rank": "RANK", "world_size": "WORLD_SIZE", "local_rank": "LOCAL_RANK",
                               "local_world_size": "LOCAL_WORLD_SIZE", "node_rank": "GROUP_RANK",
                               "nnodes": "the node count (WORLD_SIZE / LOCAL_WORLD_SIZE)"})


def _store_location(env: Mapping[str, str], default_addr: Optional[str],
                    default_port: Optional[int]) -> tuple:
    addr = _get(env, ENV_STORE_ADDR) or _get(env, "MASTER_ADDR") or default_addr
    port = _port(env, ENV_STORE_PORT) or _port(env, "MASTER_PORT") or default_port
    return addr, port


def _from_slurm(env: Mapping[str, str]) -> RankInfo:
    why = " (SLURM_PROCID is set: is this an srun step?)"
    rank = _int(env, "SLURM_PROCID")
    world = _int(env, "SLURM_NTASKS", minimum=1, why=why)
    local_rank = _int(env, "SLURM_LOCALID", why=why)
    node_rank = _int(env, "SLURM_NODEID", why=why)
    nnodes = _int(env, "SLURM_STEP_NUM_NODES", required=False, minimum=1)
    if nnodes is None:
        nnodes = _int(env, "SLURM_NNODES", minimum=1, why=why)
    tpn_var = "SLURM_STEP_TASKS_PER_NODE" if _get(env, "SLURM_STEP_TASKS_PER_NODE") else "SLURM_TASKS_PER_NODE"
    tpn_raw = _get(env, tpn_var)
    if tpn_raw is not None:
        per_node = expand_tasks_per_node(tpn_raw)
        _below("SLURM_NODEID", node_rank, f"the number of entries in {tpn_var}={tpn_raw!r}", len(per_node))
        local_world = per_node[node_rank]
        if sum(per_node) != world and tpn_var == "SLURM_STEP_TASKS_PER_NODE":
            raise RankDiscoveryError(f"{tpn_var}={tpn_raw!r} adds up to {sum(per_node)} tasks, "
                                     f"but SLURM_NTASKS={world}")
    else:
        local_world = _int(env, "SLURM_NTASKS_PER_NODE", minimum=1,
                           why=" (nor SLURM_STEP_TASKS_PER_NODE or SLURM_TASKS_PER_NODE)")
    nodelist_var = "SLURM_STEP_NODELIST" if _get(env, "SLURM_STEP_NODELIST") else "SLURM_JOB_NODELIST"
    nodelist = _get(env, nodelist_var)
    host = first_host(nodelist) if nodelist else None
    default_port = None
    job = _get(env, "SLURM_JOB_ID") or _get(env, "SLURM_JOBID")
    if job is not None:
        step = _get(env, "SLURM_STEP_ID") or _get(env, "SLURM_STEPID") or "0"
        job = f"{job}.{step}"
        default_port = 20000 + zlib.crc32(job.encode()) % 20000
    addr, port = _store_location(env, host, default_port)
    info = RankInfo(
        rank=rank, world_size=world, local_rank=local_rank, local_world_size=local_world,
        node_rank=node_rank, nnodes=nnodes, store_addr=addr, store_port=port,
        store_token=_token(env), source="slurm", run_id=job,
    )
    return _check_sizes(info, {"rank": "SLURM_PROCID", "world_size": "SLURM_NTASKS", "local_rank": "SLURM_LOCALID",
                               "local_world_size": "the tasks on this node", "node_rank": "SLURM_NODEID",
                               "nnodes": "SLURM_NNODES"})


def _from_openmpi(env: Mapping[str, str]) -> RankInfo:
    why = " (OMPI_COMM_WORLD_RANK is set: was this started by Open MPI's mpirun?)"
    rank = _int(env, "OMPI_COMM_WORLD_RANK")
    world = _int(env, "OMPI_COMM_WORLD_SIZE", minimum=1, why=why)
    local_rank = _int(env, "OMPI_COMM_WORLD_LOCAL_RANK", why=why)
    local_world = _int(env, "OMPI_COMM_WORLD_LOCAL_SIZE", minimum=1, why=why)
    single_node = local_world == world
    addr, port = _store_location(env, _LOOPBACK if single_node else None, None)
    info = RankInfo(
        rank=rank, world_size=world, local_rank=local_rank, local_world_size=local_world,
        node_rank=0 if single_node else None, nnodes=1 if single_node else None,
        store_addr=addr, store_port=port, store_token=_token(env), source="openmpi",
    )
    return _check_sizes(info, {"rank": "OMPI_COMM_WORLD_RANK", "world_size": "OMPI_COMM_WORLD_SIZE",
                               "local_rank": "OMPI_COMM_WORLD_LOCAL_RANK",
                               "local_world_size": "OMPI_COMM_WORLD_LOCAL_SIZE", "node_rank": "node rank",
                               "nnodes": "nnodes"})


def discover(environ: Optional[Mapping[str, str]] = None) -> RankInfo:
    """Return this process's :class:`RankInfo` from the environment (``os.environ`` by default).

    Raises :class:`RankDiscoveryError` when the variables of the first matching launcher are
    partial or inconsistent (see the module docstring for the order and the variables).
    """
    env = os.environ if environ is None else environ
    if _get(env, ENV_RANK) is not None or _get(env, ENV_WORLD_SIZE) is not None:
        if _get(env, ENV_RANK) is None:
            raise RankDiscoveryError(f"{ENV_WORLD_SIZE} is set but {ENV_RANK} is not")
        return _from_pycoll(env)
    if _get(env, "RANK") is not None or _get(env, "WORLD_SIZE") is not None:
        return _from_torchrun(env)
    if _get(env, "SLURM_PROCID") is not None:
        return _from_slurm(env)
    if _get(env, "OMPI_COMM_WORLD_RANK") is not None:
        return _from_openmpi(env)
    return RankInfo(rank=0, world_size=1, local_rank=0, local_world_size=1, node_rank=0, nnodes=1,
                    store_addr=None, store_port=None, store_token=None, source="single")


# --------------------------------------------------------------------------------------------------
# the store of the discovered job


def open_store(
    info: Optional[RankInfo] = None,
    *,
    timeout: float = DEFAULT_TIMEOUT,
    connect_timeout: float = 120.0,
    environ: Optional[Mapping[str, str]] = None,
) -> Store:
    """Connect to the store of the job ``info`` describes (default: :func:`discover`).

    * pycoll-run: the launcher's TCP store (``PYCOLL_STORE_*``).
    * torchrun: torch's ``TCPStore`` at ``MASTER_ADDR:MASTER_PORT`` through the adapter, under the
      prefix ``pycoll/attempt_<TORCHELASTIC_RESTART_COUNT>/``. When torchrun's agent hosts the store
      (``TORCHELASTIC_USE_AGENT_STORE=True``) every rank is a client; otherwise rank 0 hosts it, as
      torch's ``env://`` does. Needs torch.
    * SLURM / Open MPI: rank 0 starts a pycoll TCP store in a background thread of its own process
      and every rank connects to it. ``PYCOLL_STORE_TOKEN`` is required. The store lives as long as
      rank 0's store object: rank 0 must keep it open until the other ranks are done with it.
    * a single process: a :class:`~pycoll.store.MemoryStore`.

    Every rank must call this. ``connect_timeout`` bounds reaching the store (connect and handshake;
    :func:`pycoll.init` passes its ``init_timeout``). Raises :class:`RankDiscoveryError` for missing
    settings and :class:`~pycoll.errors.StoreError` (or its subclasses) when the store cannot be reached.
    """
    env = os.environ if environ is None else environ
    if info is None:
        info = discover(env)
    if info.source == "single":
        return MemoryStore(timeout=timeout)
    if info.source == "torchrun":
        return _open_torch_store(info, env, timeout, connect_timeout)
    if info.store_addr is None:
        hint = {
            "pycoll": f"{ENV_STORE_ADDR} is not set: was this process started by pycoll-run?",
            "openmpi": f"set {ENV_STORE_ADDR} (or MASTER_ADDR) to rank 0's host: Open MPI does not say "
                       "where rank 0 runs in a multi-node job",
            "slurm": f"set {ENV_STORE_ADDR} (or MASTER_ADDR): the SLURM node list is not in the environment",
        }[info.source]
        raise RankDiscoveryError(f"no store address: {hint}")
    if info.store_port is None:
        raise RankDiscoveryError(f"no store port: set {ENV_STORE_PORT}"
                                 + (" (or MASTER_PORT)" if info.source != "pycoll" else ""))
    if not info.store_token:
        raise RankDiscoveryError(
            f"{ENV_STORE_TOKEN} is not set: pycoll's TCP store needs a shared secret. "
            + ("pycoll-run sets it for every rank." if info.source == "pycoll" else
               f"Export the same random token to every rank, e.g. export {ENV_STORE_TOKEN}=$(openssl rand -hex 32) "
               "before starting the job."))
    bind = _get(env, ENV_STORE_BIND)
    single_node = info.nnodes == 1 or info.local_world_size == info.world_size
    if info.source == "pycoll" or info.rank != 0:
        # a single-node job's rank 0 listens on the loopback address only (below): the node's name may resolve to
        # another address of it (its network's, Debian's 127.0.1.1), where nothing listens
        addr = _LOOPBACK if info.source != "pycoll" and bind is None and single_node else info.store_addr
        return TCPStore(addr, info.store_port, info.store_token, timeout=timeout, connect_timeout=connect_timeout)
    if bind is None:
        bind = _LOOPBACK if single_node else "0.0.0.0"
    try:
        return TCPStore.hosting(bind, info.store_port, info.store_token, timeout=timeout,
                                connect_timeout=connect_timeout,
                                max_unauthenticated=unauthenticated_for(info.world_size))
    except StoreError as exc:
        text = str(exc)
        if "assign requested address" in text or "not known" in text or "resolution" in text:
            raise StoreError(f"rank 0 could not host the store on {bind}:{info.store_port} ({exc}): {bind} is no "
                             f"address of this host; set {ENV_STORE_BIND} to one of its addresses (or unset it)"
                             ) from None
        raise StoreError(f"rank 0 could not host the store on {bind}:{info.store_port} ({exc}); "
                         f"choose another port with {ENV_STORE_PORT}{_SHARED_PORT_HINT}") from None


# where rank 0 cannot host the store on the port: torch.distributed's env:// store (init_process_group) takes
# MASTER_PORT too, outside torchrun's agent
_SHARED_PORT_HINT = (" (if torch.distributed's init_process_group hosts its store on that port -- env:// with the "
                     "same MASTER_PORT --, pass it to pycoll: init(store=torch.distributed.distributed_c10d."
                     "_get_default_store()))")

_job_stores: Dict[Tuple[Any, ...], Store] = {}
_job_lock = threading.Lock()


def job_store(info: RankInfo, *, connect_timeout: float = 120.0) -> Store:
    """The store of the job ``info`` describes, opened once per process (:func:`open_store`) and shared by every
    :func:`pycoll.init` and ``ElasticGroup.from_env()`` that reads the environment: under SLURM, Open MPI and a
    torch ``env://`` launch rank 0 hosts it, and a second one on the same port failed ("Address already in use");
    each also held its connections. A store closed since (``close()``) is opened again."""
    key = (os.getpid(), info.source, info.store_addr, info.store_port, info.rank, info.world_size)
    with _job_lock:
        store = _job_stores.get(key)
        inner = getattr(store, "root", store)
        if store is None or getattr(inner, "_closed", False):
            store = _job_stores[key] = open_store(info, connect_timeout=connect_timeout)
        return store


def _open_torch_store(info: RankInfo, env: Mapping[str, str], timeout: float, connect_timeout: float) -> Store:
    if info.store_addr is None or info.store_port is None:
        raise RankDiscoveryError("MASTER_ADDR and MASTER_PORT are not set: torchrun sets them for every rank")
    started = time.monotonic()
    try:
        import torch.distributed as dist
    except ImportError as exc:
        raise StoreError(f"a torchrun job's store is torch's TCPStore, but torch.distributed cannot be "
                         f"imported ({exc})") from None
    # its first import (2-8 s on a busy machine) is part of the time given to reach the store (init's init_timeout)
    imported = time.monotonic() - started
    if imported >= connect_timeout:
        raise StoreError(f"could not open torch's TCPStore at {info.store_addr}:{info.store_port}: importing "
                         f"torch.distributed took {imported:.1f} s of the {connect_timeout:g} s given to reach it")
    connect_timeout -= imported
    agent = (_get(env, "TORCHELASTIC_USE_AGENT_STORE") or "").lower() in ("1", "true")
    attempt = _get(env, "TORCHELASTIC_RESTART_COUNT") or "0"
    try:
        # torch's timeout bounds the connect (init_timeout's share), then each call (``timeout``)
        tcp = dist.TCPStore(info.store_addr, info.store_port, world_size=None,
                            is_master=info.rank == 0 and not agent,
                            timeout=timedelta(seconds=connect_timeout), wait_for_workers=False)
        tcp.set_timeout(timedelta(seconds=timeout))
    except Exception as exc:  # torch raises DistNetworkError/RuntimeError
        raise StoreError(f"could not open torch's TCPStore at {info.store_addr}:{info.store_port}: {exc}"
                         + (_SHARED_PORT_HINT if "in use" in str(exc).lower() else "")) from None
    adapter = wrap_torch_store(tcp, timeout=timeout)
    return PrefixStore(adapter, f"pycoll/attempt_{attempt}/")
