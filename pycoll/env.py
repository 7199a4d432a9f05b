"""Alias of :mod:`pycoll.launch.discovery` (rank discovery), kept so that imports from ``pycoll.env`` work."""

from __future__ import annotations

from .launch.discovery import (
    ENV_LOCAL_RANK,
    ENV_LOCAL_WORLD_SIZE,
    ENV_NNODES,
    ENV_NODE_RANK,
    ENV_RANK,
    ENV_REPLACEMENT,
    ENV_REPLACES,
    ENV_RUN_ID,
    ENV_STORE_ADDR,
    ENV_STORE_BIND,
    ENV_STORE_PORT,
    ENV_STORE_TOKEN,
    ENV_WORLD_SIZE,
    RankDiscoveryError,
    RankInfo,
    discover,
    expand_nodelist,
    expand_tasks_per_node,
    first_host,
    open_store,
)

__all__ = [
    "RankInfo",
    "RankDiscoveryError",
    "discover",
    "open_store",
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
