"""CommConfig: every ncclConfig_t field as a validated Python dataclass.

``None`` leaves a field at NCCL's default (``NCCL_CONFIG_UNDEF_INT`` / NULL). Each field names the
NCCL release that introduced it; asking for a field the loaded library is too old to know raises
:class:`pycoll.NotSupported` instead of being silently ignored by NCCL.
"""

from __future__ import annotations

import dataclasses
import operator
from dataclasses import dataclass, field
from typing import Any, Dict, Optional, Tuple

from . import _settings
from .errors import NotSupported

__all__ = ["CommConfig"]

_INT_MAX = 2**31 - 1


def _f(nccl_name: str, since: str, doc: str, kind: type = int, lo: Optional[int] = None,
       hi: Optional[int] = None, choices: Optional[Tuple[int, ...]] = None) -> Any:
    return field(default=None, metadata={"nccl": nccl_name, "since": since, "doc": doc, "kind": kind,
                                           "lo": lo, "hi": hi, "choices": choices})


@dataclass
class CommConfig:
    """Configuration of a communicator (``ncclConfig_t``), validated before it reaches NCCL.

    Every field defaults to None, meaning NCCL's own default. pycoll creates communicators
    nonblocking (``blocking=False``) unless ``blocking=True`` is given explicitly: a blocking communicator's
    library calls return only once every rank made them, so pycoll makes its init (and its split, shrink, grow,
    finalize and window registration) in a thread of its own and bounds the wait by the call's timeout; an init
    given up there leaves that thread in the library until the library's own deadline.
    """

    blocking: Optional[bool] = _f(
        "blocking", "2.14", "False: calls return ncclInProgress and complete in the background", bool)
    cga_cluster_size: Optional[int] = _f(
        "cgaClusterSize", "2.17", "CUDA cooperative group array cluster size (0-8)", int, 0, 8)
    min_ctas: Optional[int] = _f(
        "minCTAs", "2.17", "minimum number of CTAs (channels) per collective", int, 1, _INT_MAX)
    max_ctas: Optional[int] = _f(
        "maxCTAs", "2.17", "maximum number of CTAs (channels) per collective", int, 1, _INT_MAX)
    net_name: Optional[str] = _f("netName", "2.17", "network module to use: 'IB', 'Socket' or a plugin's name", str)
    split_share: Optional[bool] = _f(
        "splitShare", "2.18", "children of ncclCommSplit share the parent's resources", bool)
    traffic_class: Optional[int] = _f(
        "trafficClass", "2.26", "network traffic class (QoS) for this communicator", int, 0, _INT_MAX)
    comm_name: Optional[str] = _f("commName", "2.27", "user-visible communicator name (NCCL logs, profiler)", str)
    collnet_enable: Optional[bool] = _f("collnetEnable", "2.27", "enable CollNet (in-network reduction)", bool)
    cta_policy: Optional[int] = _f("CTAPolicy", "2.27", "CTA policy flags: 0 default, 1 efficiency, 2 zero", int, 0, 3)
    shrink_share: Optional[bool] = _f(
        "shrinkShare", "2.27", "children of ncclCommShrink share the parent's resources", bool)
    nvls_ctas: Optional[int] = _f("nvlsCTAs", "2.27", "number of CTAs for NVLS collectives", int, 1, _INT_MAX)
    n_channels_per_net_peer: Optional[int] = _f(
        "nChannelsPerNetPeer", "2.28", "channels per network peer for p2p (1-64)", int, 1, 64)
    nvlink_centric_sched: Optional[bool] = _f("nvlinkCentricSched", "2.28", "NVLink-centric scheduling", bool)
    graph_usage_mode: Optional[int] = _f(
        "graphUsageMode", "2.29", "how the communicator is used with CUDA graphs (0-2)", int, 0, 2)
    num_rma_ctx: Optional[int] = _f("numRmaCtx", "2.29", "number of RMA contexts", int, 0, _INT_MAX)
    max_p2p_peers: Optional[int] = _f("maxP2pPeers", "2.30.3", "maximum number of p2p peers per rank", int, 1, _INT_MAX)
    graph_stream_ordering: Optional[int] = _f(
        "graphStreamOrdering", "2.30.7", "stream ordering of captured operations (0 or 1)", int, 0, 1)
    launch_order_implicit: Optional[bool] = _f(
        "launchOrderImplicit", "2.31", "order operations of several communicators by host issue order", bool)
    num_rma_sig: Optional[int] = _f("numRmaSig", "2.31", "number of RMA signals", int, 0, _INT_MAX)
    rma_eager_init: Optional[bool] = _f("rmaEagerInit", "2.31", "initialise RMA resources eagerly", bool)
    host_cft_mode: Optional[int] = _f(
        "hostCftMode", "2.31", "host CFT mode: 1 enable, 2 disable, 3 fallback", int, choices=(1, 2, 3))
    nvls_host_mode: Optional[int] = _f(
        "nvlsHostMode", "2.32", "NVLS host mode: 0 enable, 1 disable transport, 2 disable symmetric multimem, "
        "2**31-1 disable", int, choices=(0, 1, 2, _INT_MAX))

    def __post_init__(self) -> None:
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if value is None:
                continue
            m = f.metadata
            kind = m["kind"]
            if kind is bool:
                try:  # a numpy bool too, as the other flags take it
                    setattr(self, f.name, _settings.flag(value, f"CommConfig.{f.name}"))
                except TypeError as e:
                    raise ValueError(str(e)) from None
            elif kind is int:
                if isinstance(value, bool) or not hasattr(type(value), "__index__"):
                    raise TypeError(f"CommConfig.{f.name} must be an int, got {type(value).__name__}")
                if type(value) is not int:  # numpy's integers, as the other int arguments take them
                    value = operator.index(value)
                    setattr(self, f.name, value)
                if m["choices"] is not None and value not in m["choices"]:
                    raise ValueError(f"CommConfig.{f.name} must be one of {m['choices']}, got {value}")
                if m["lo"] is not None and not (m["lo"] <= value <= m["hi"]):
                    raise ValueError(f"CommConfig.{f.name} must be in [{m['lo']}, {m['hi']}], got {value}")
            elif kind is str:
                if not isinstance(value, str):
                    raise TypeError(f"CommConfig.{f.name} must be a str, got {type(value).__name__}")
                if "\0" in value:
                    raise ValueError(f"CommConfig.{f.name} must not contain NUL characters")
        if self.min_ctas is not None and self.max_ctas is not None and self.min_ctas > self.max_ctas:
            raise ValueError(f"CommConfig.min_ctas ({self.min_ctas}) is larger than max_ctas ({self.max_ctas})")
        if self.min_ctas is not None and self.max_ctas is None:  # NCCL compares min with its unset max, INT_MIN
            raise ValueError(f"CommConfig.min_ctas ({self.min_ctas}) needs max_ctas too: NCCL compares the two and "
                             "refuses the init where max_ctas is unset ('Invalid config min/max channels attribute "
                             "value')")

    def replace(self, **changes: Any) -> CommConfig:
        """A copy with some fields changed (validated again)."""
        return dataclasses.replace(self, **changes)

    def as_dict(self) -> Dict[str, Any]:
        """The fields that are set (not None), by pycoll name."""
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self) if getattr(self, f.name) is not None}

    @staticmethod
    def field_release(name: str) -> str:
        """The NCCL release that introduced field ``name`` (e.g. ``"2.27"``)."""
        for f in dataclasses.fields(CommConfig):
            if f.name == name:
                return f.metadata["since"]
        raise KeyError(name)

    def to_nccl(self, library: Any, *, blocking_default: bool = False) -> Any:
        """Build the binding-level ``Config`` for ``library``.

        Raises NotSupported when a set field needs a newer NCCL than ``library`` reports.
        ``blocking`` falls back to ``blocking_default`` when unset.
        """
        from ._bindings import Config  # local: keep this module importable without the extension

        self.__post_init__()  # a field set after construction is checked too
        lib_version = library.version
        cfg = Config()
        values = self.as_dict()
        values.setdefault("blocking", blocking_default)
        for f in dataclasses.fields(self):
            if f.name not in values:
                continue
            since = f.metadata["since"]
            if _code(since) > lib_version:
                raise NotSupported(
                    f"ncclConfig_t.{f.metadata['nccl']}",
                    since,
                    getattr(library, "path", ""),
                    f"CommConfig.{f.name} is set but the loaded library reports version {lib_version}",
                )
            value = values[f.name]
            setattr(cfg, f.metadata["nccl"], int(value) if f.metadata["kind"] in (bool, int) else value)
        return cfg


def _code(release: str) -> int:
    parts = [int(p) for p in release.split(".")] + [0, 0]
    major, minor, patch = parts[:3]
    return major * 1000 + minor * 100 + patch if (major <= 2 and minor <= 8) else major * 10000 + minor * 100 + patch
