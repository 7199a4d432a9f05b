"""Communicator properties: ``ncclCommQueryProperties`` as a typed, frozen record."""

from __future__ import annotations

import dataclasses
from typing import Any, Tuple

from . import _bindings as B

__all__ = ["CommProperties", "query_properties"]

_GIN_NAMES = {B.GIN_TYPE_NONE: "none", B.GIN_TYPE_PROXY: "proxy", B.GIN_TYPE_GDAKI: "gdaki",
              B.GIN_TYPE_GPI: "gpi", B.GIN_TYPE_EFA_GDA: "efa_gda"}
_CONNECTION_NAMES = {B.GIN_CONNECTION_NONE: "none", B.GIN_CONNECTION_FULL: "full", B.GIN_CONNECTION_RAIL: "rail",
                     B.GIN_CONNECTION_CUSTOM_STRIDE: "custom_stride"}


def gin_type_name(value: int) -> str:
    """NCCL's ncclGinType_t value as a short name ("none", "proxy", "gdaki", "gpi", "efa_gda")."""
    return _GIN_NAMES.get(value, f"unknown({value})")


@dataclasses.dataclass(frozen=True)
class CommProperties:
    """What the library says about one communicator (``ncclCommProperties_t``, NCCL 2.29+).

    The struct is passed to the library initialised as ``NCCL_COMM_PROPERTIES_INITIALIZER`` (size,
    magic, the 2.32.3 layout's version); a library with an older layout fills only its prefix and
    leaves the rest zero.
    """

    #: this process's rank, and the number of ranks
    rank: int
    n_ranks: int
    #: the CUDA device ordinal, and the NVML index of the same device (the host library: its
    #: simulated device number for both)
    cuda_dev: int
    nvml_dev: int
    #: whether device communicators (``ncclDevCommCreate``) and multimem (NVLink SHARP) work
    device_api_support: bool
    multimem_support: bool
    #: the GPU-initiated-networking backend (an ncclGinType_t value; ``gin_type_name``), and the
    #: one used across rails
    gin_type: int
    railed_gin_type: int
    #: the number of load/store-accessible (LSA) teams: NVLink domains the communicator spans
    n_lsa_teams: int
    #: whether host-initiated one-sided operations (put_signal, signal, wait_signal) are supported
    host_rma_support: bool
    #: a value equal on every rank of the communicator (NCCL derives it from the unique id)
    comm_hash: int
    gin_min_stride: int
    #: an ncclGinConnectionType_t value ("none", "full", "rail", "custom_stride")
    gin_connection_type: int
    #: the ncclGinType_t values this communicator supports
    gin_supported: Tuple[int, ...]
    #: bytes a device communicator needs when created with ``useRuntimeVersion``
    dev_comm_runtime_version_size: int
    #: collective fabric transport (CFT): supported at all, with multicast, with counted windows
    cft_support: bool
    cft_multicast_support: bool
    cft_counted_support: bool

    @property
    def gin_type_name(self) -> str:
        """``gin_type`` as a name."""
        return gin_type_name(self.gin_type)

    @property
    def gin_connection_type_name(self) -> str:
        """``gin_connection_type`` as a name."""
        return _CONNECTION_NAMES.get(self.gin_connection_type, f"unknown({self.gin_connection_type})")

    @classmethod
    def from_struct(cls, fields: Any) -> CommProperties:
        """From the dict of NCCL field names that ``Library.comm_query_properties`` returns."""
        return cls(
            rank=fields["rank"], n_ranks=fields["nRanks"], cuda_dev=fields["cudaDev"], nvml_dev=fields["nvmlDev"],
            device_api_support=fields["deviceApiSupport"], multimem_support=fields["multimemSupport"],
            gin_type=fields["ginType"], railed_gin_type=fields["railedGinType"], n_lsa_teams=fields["nLsaTeams"],
            host_rma_support=fields["hostRmaSupport"], comm_hash=fields["commHash"],
            gin_min_stride=fields["ginMinStride"], gin_connection_type=fields["ginConnectionType"],
            gin_supported=tuple(fields["ginSupport"]),
            dev_comm_runtime_version_size=fields["devCommRuntimeVersionSize"], cft_support=fields["cftSupport"],
            cft_multicast_support=fields["cftMulticastSupport"], cft_counted_support=fields["cftCountedSupport"],
        )


def query_properties(library: Any, handle: int) -> CommProperties:
    """``ncclCommQueryProperties`` on a raw handle (raises NotSupported before NCCL 2.29)."""
    return CommProperties.from_struct(library.comm_query_properties(handle))
