"""Per-call collective configuration: NCCL 2.31+'s ``ncclCollConfig_t`` (with its vendor-option
chain, ``ncclConfigExt_t``) as a validated, frozen record for the collectives' ``config=``.

A collective given a config calls the library's ``nccl*Config`` variant (``ncclAllReduceConfig``
...); a library without it raises :class:`pycoll.NotSupported` naming the function. Give every rank
the same config.
"""

from __future__ import annotations

import ctypes
import dataclasses
import operator
from typing import Any, List, Optional, Sequence, Union

from . import _bindings as B

__all__ = ["CollConfig", "VendorOption", "prepare"]

_INT_MIN, _INT_MAX = -(1 << 31), (1 << 31) - 1


class _ExtKey(ctypes.Structure):
    _fields_ = [("vendorId", ctypes.c_int), ("optionId", ctypes.c_int)]


class _ExtVal(ctypes.Union):
    _fields_ = [("i", ctypes.c_int), ("s", ctypes.c_char_p), ("raw", ctypes.c_void_p)]


class _Ext(ctypes.Structure):
    pass


_Ext._fields_ = [("next", ctypes.POINTER(_Ext)), ("key", _ExtKey), ("val", _ExtVal)]


@dataclasses.dataclass(frozen=True)
class VendorOption:
    """One ``ncclConfigExt_t`` entry: a vendor's option and its value (an int, a str, or a raw
    address given as ``Pointer``-like int through ``raw=True``)."""

    vendor_id: int
    option_id: int
    value: Union[int, str]
    raw: bool = False

    def __post_init__(self) -> None:
        for name in ("vendor_id", "option_id"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or not _INT_MIN <= v <= _INT_MAX:
                raise ValueError(f"VendorOption.{name} must be a C int, got {v!r}")
        if self.raw:
            if isinstance(self.value, bool) or not isinstance(self.value, int) or not 0 <= self.value < 1 << 64:
                raise ValueError(f"a raw VendorOption value must be an address (int >= 0), got {self.value!r}")
        elif isinstance(self.value, str):
            if "\0" in self.value:
                raise ValueError("a VendorOption string must not contain NUL characters")
        elif isinstance(self.value, bool) or not isinstance(self.value, int) or not _INT_MIN <= self.value <= _INT_MAX:
            raise ValueError(f"VendorOption.value must be a C int, a str, or an address with raw=True, "
                             f"got {self.value!r}")


def _opt_int(config: Any, name: str, lo: int = 0, hi: int = _INT_MAX) -> None:
    """Check field ``name`` of ``config``: None, or an int (numpy's too, kept as an int) in [lo, hi]."""
    value = getattr(config, name)
    if value is None:
        return
    if isinstance(value, bool) or not hasattr(type(value), "__index__") or not lo <= operator.index(value) <= hi:
        raise ValueError(f"CollConfig.{name} must be None or an int in [{lo}, {hi}], got {value!r}")
    object.__setattr__(config, name, operator.index(value))


@dataclasses.dataclass(frozen=True)
class CollConfig:
    """An ``ncclCollConfig_t``; None leaves a field at NCCL's default (NCCL_COLLCONFIG_INITIALIZER).

    ``min_ctas``/``max_ctas``/``nvls_ctas``/``cga_cluster_size``: the CTA bounds of this call;
    ``alg_selection``: NCCL's algorithm/protocol selection string (e.g. ``"ring,simple"``) and
    ``force_alg_selection`` whether it is a requirement (NCCL's default) or a hint; ``cta_policy``:
    ``CTA_POLICY_*``; ``user_profiler_tag``: a tag the profiler plugin sees; ``launch_completion_event``:
    a CUDA event handle NCCL records once the call's kernels are launched; ``vendor_options``: the
    ``ext`` chain, in order.
    """

    min_ctas: Optional[int] = None
    max_ctas: Optional[int] = None
    nvls_ctas: Optional[int] = None
    cga_cluster_size: Optional[int] = None
    alg_selection: Optional[str] = None
    force_alg_selection: Optional[bool] = None
    cta_policy: Optional[int] = None
    user_profiler_tag: int = 0
    launch_completion_event: Optional[int] = None
    vendor_options: Sequence[VendorOption] = ()  # kept as a tuple

    def __post_init__(self) -> None:
        for name in ("min_ctas", "max_ctas", "nvls_ctas", "cga_cluster_size"):  # NCCL refuses 0 and below
            _opt_int(self, name, 1)
        _opt_int(self, "cta_policy", 0, B.CTA_POLICY_EFFICIENCY | B.CTA_POLICY_ZERO)
        if self.min_ctas is not None and self.max_ctas is not None and self.min_ctas > self.max_ctas:
            raise ValueError(f"CollConfig.min_ctas ({self.min_ctas}) > max_ctas ({self.max_ctas})")
        if self.alg_selection is not None and (not isinstance(self.alg_selection, str) or "\0" in self.alg_selection):
            raise ValueError(f"CollConfig.alg_selection must be None or a str without NUL, got {self.alg_selection!r}")
        if self.force_alg_selection is not None and not isinstance(self.force_alg_selection, bool):
            raise ValueError(f"CollConfig.force_alg_selection must be None or a bool, got {self.force_alg_selection!r}")
        tag = self.user_profiler_tag
        if isinstance(tag, bool) or not isinstance(tag, int) or not 0 <= tag < 1 << 64:
            raise ValueError(f"CollConfig.user_profiler_tag must be an int in [0, 2**64), got {tag!r}")
        ev = self.launch_completion_event
        if ev is not None and (isinstance(ev, bool) or not isinstance(ev, int) or not 0 < ev < 1 << 64):
            raise ValueError(f"CollConfig.launch_completion_event must be None or an event handle, got {ev!r}")
        opts = tuple(self.vendor_options)
        for i, o in enumerate(opts):
            if not isinstance(o, VendorOption):
                raise TypeError(f"CollConfig.vendor_options[{i}] must be a VendorOption, not {type(o).__name__}")
        object.__setattr__(self, "vendor_options", opts)


class Prepared(tuple):
    """``()`` (the plain call) or ``(binding CollConfig,)``: the extra argument of the library call,
    holding the memory the ``ext`` chain points into; keep it alive across the call."""

    _keep: List[Any]


def prepare(config: Optional[CollConfig]) -> Prepared:
    """The library-call arguments for ``config`` (see Prepared)."""
    if config is None:
        return Prepared()
    if not isinstance(config, CollConfig):
        tp = type(config)
        where = "pycoll.bindings" if tp.__module__.startswith("pycoll._bindings") else tp.__module__
        hint = (" (the raw ncclCollConfig_t of the bindings' Library calls; pycoll.CollConfig takes the same settings "
                "as min_ctas=, max_ctas=, alg_selection=, ...)"
                if where == "pycoll.bindings" and tp.__name__ == "CollConfig" else "")
        name = tp.__qualname__ if where == "builtins" else f"{where}.{tp.__qualname__}"
        raise TypeError(f"config must be a pycoll.CollConfig or None, not {name}{hint}")
    c = B.CollConfig()
    for attr, field in (("min_ctas", "minCTAs"), ("max_ctas", "maxCTAs"), ("nvls_ctas", "nvlsCTAs"),
                        ("cga_cluster_size", "cgaClusterSize"), ("cta_policy", "CTAPolicy")):
        value = getattr(config, attr)
        if value is not None:
            setattr(c, field, value)
    if config.alg_selection is not None:
        c.algSelection = config.alg_selection
    if config.force_alg_selection is not None:
        c.forceAlgSelection = int(config.force_alg_selection)
    c.userProfilerTag = config.user_profiler_tag
    if config.launch_completion_event is not None:
        c.launchCompletionEvent = config.launch_completion_event
    keep: List[Any] = []
    head = None
    for o in reversed(config.vendor_options):
        node = _Ext()
        node.key.vendorId, node.key.optionId = o.vendor_id, o.option_id
        if o.raw:
            node.val.raw = o.value
        elif isinstance(o.value, str):
            data = o.value.encode()
            keep.append(data)
            node.val.s = data
        else:
            node.val.i = o.value
        node.next = ctypes.pointer(head) if head is not None else None
        keep.append(node)
        head = node
    if head is not None:
        c.ext = ctypes.addressof(head)
    out = Prepared((c,))
    out._keep = keep
    return out
