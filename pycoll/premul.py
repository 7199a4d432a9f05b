"""PreMulSum: the reduction operator ``sum(scalar * x_r)`` (``ncclRedOpCreatePreMulSum``)."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any, Tuple

from ._dtypes import DATATYPES, datatype_of, numpy_dtype
from .buffers import as_buffer, check_device

if TYPE_CHECKING:  # pragma: no cover
    from .comm import Communicator

__all__ = ["PreMulSum", "datatype_of", "scalar_argument"]

# the integer datatypes' ranges, from the one table
_INT_RANGES = {d.code: ((-(2 ** (8 * d.itemsize - 1)), 2 ** (8 * d.itemsize - 1) - 1) if d.kind == "i"
                        else (0, 2 ** (8 * d.itemsize) - 1)) for d in DATATYPES if d.kind in ("i", "u")}


class PreMulSum:
    """A reduction operator that multiplies every input by ``scalar`` before summing.

    Created by :meth:`Communicator.pre_mul_sum`; pass it as ``op=``. Only valid on its
    communicator and for its datatype. Release it with :meth:`destroy` (or use it as a context
    manager); the communicator's destroy/abort releases it too.
    """

    def __init__(self, comm: Communicator, op: int, datatype: int, scalar: Any) -> None:
        self.comm = comm
        self.op = op
        self.datatype = datatype
        self._scalar = scalar  # keeps a device scalar alive

    def destroy(self) -> None:
        """Release the operator (``ncclRedOpDestroy``). Idempotent."""
        if self.op >= 0:
            op, self.op = self.op, -1
            self.comm.release_red_op(self, op)

    def __enter__(self) -> PreMulSum:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.destroy()

    def __repr__(self) -> str:
        return f"<PreMulSum op={self.op} datatype={self.datatype} on {self.comm.name}>"


def _numpy_dtype(datatype: int) -> Any:
    try:
        return numpy_dtype(datatype)
    except ImportError:
        raise NotImplementedError("a bfloat16/float8 pre_mul_sum scalar needs the ml_dtypes package") from None


def scalar_argument(scalar: Any, datatype: int, backend: str, device_id: Any) -> Tuple[Any, int, int]:
    """``(holder, pointer, residence)`` for ``ncclRedOpCreatePreMulSum``.

    A Python number (or a numpy or ml_dtypes scalar, taken as its value) is stored in ``datatype`` on the host
    (residence ``ncclScalarHostImmediate``) and must be representable in it; an array must hold one element of
    ``datatype`` on the communicator's device (``ncclScalarDevice``: read when the operation runs).
    """
    import numpy as np

    if isinstance(scalar, (bool, np.bool_, complex, np.complexfloating, str, np.bytes_)):
        raise TypeError(f"pre_mul_sum: the scalar must be a real number or a one-element array, not "
                        f"{type(scalar).__name__} {scalar!r}")
    if isinstance(scalar, np.number) or (isinstance(scalar, np.generic) and type(scalar).__module__ == "ml_dtypes"):
        # a number numpy code gave (np.float32(1 / world), ml_dtypes' bfloat16(0.5)): a number, as Python's are,
        # not a device array (which must be of the operation's dtype)
        scalar = scalar.item() if isinstance(scalar, np.integer) else float(scalar)
    if isinstance(scalar, (int, float)) and not isinstance(scalar, bool):
        if datatype in _INT_RANGES:
            lo, hi = _INT_RANGES[datatype]
            if isinstance(scalar, float) and not (math.isfinite(scalar) and scalar.is_integer()):
                raise ValueError(f"pre_mul_sum: the scalar {scalar!r} is not an integer, and the datatype is an "
                                 "integer type: it would be truncated")
            if not lo <= int(scalar) <= hi:
                raise ValueError(f"pre_mul_sum: the scalar {scalar!r} is out of range [{lo}, {hi}] for the datatype")
        else:
            try:
                finite = math.isfinite(float(scalar))
            except OverflowError:  # an int past any float
                raise ValueError(f"pre_mul_sum: the scalar (an integer of {int(scalar).bit_length()} bits) is too "
                                 "large for any floating-point datatype") from None
            if not finite:
                raise ValueError(f"pre_mul_sum: the scalar must be finite, got {scalar!r}")
        dtype = _numpy_dtype(datatype)
        with np.errstate(over="ignore", invalid="ignore"):
            holder = np.array([scalar], dtype=dtype)
        held = holder.astype(np.float64)[0]
        if datatype not in _INT_RANGES and (not np.isfinite(held) or (held == 0 and scalar != 0)):
            # a scalar that rounds to 0 there (1e-30 in float16) would zero every result, as one past the range
            # would make it inf
            raise ValueError(f"pre_mul_sum: the scalar {scalar!r} is not representable in {dtype.name} (it would be "
                             f"{held} there)")
        return holder, holder.ctypes.data, 1
    buf = as_buffer(scalar, name="scalar")
    check_device(buf, backend, device_id)
    if buf.count != 1 or buf.datatype != datatype:
        raise ValueError(f"pre_mul_sum: the scalar array must hold one element of the same dtype, got {buf!r}")
    return buf, buf.ptr, 0
