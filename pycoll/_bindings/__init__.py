"""Thin Cython bindings to the NCCL C API, loaded at run time (see _nccl.pyi for the contract)."""

from ._nccl import *  # noqa: F403
