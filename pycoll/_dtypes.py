"""The one table of NCCL datatypes and reduction operators (a leaf: imports nothing of pycoll).

Every other table of datatype codes, names, item sizes and array-library dtypes is derived from
:data:`DATATYPES`; every reduction-operator code from :data:`REDUCE_OPS`. The codes are
``ncclDataType_t`` / ``ncclRedOp_t`` values, identical in NCCL and RCCL (``pycoll._bindings``'
``DataType`` and ``RedOp`` have the same numbers).
"""

from __future__ import annotations

import sys
from typing import Any, Dict, NamedTuple, Optional, Tuple

__all__ = [
    "Datatype",
    "DATATYPES",
    "BY_CODE",
    "BY_NAME",
    "BY_ARRAY_NAME",
    "INT32",
    "FLOAT64",
    "ITEMSIZES",
    "FR_NAMES",
    "KIND_SIZE",
    "DLPACK",
    "REDUCE_OPS",
    "SUM",
    "PREMUL_SUM_MIN",
    "SUPPORTED",
    "datatype_of",
    "numpy_code",
    "numpy_dtype",
]


class Datatype(NamedTuple):
    """One ``ncclDataType_t``.

    Attributes:
        code: the enum value (``ncclInt8`` = 0 ... ``ncclFloat8e5m2`` = 11).
        nccl_name: the enum's name in nccl.h.
        name: the short name pycoll-bench prints (nccl-tests' name).
        aliases: other short names accepted for it on command lines.
        itemsize: bytes per element.
        kind: numpy's ``dtype.kind`` for the builtin numpy types (``"i"``, ``"u"``, ``"f"``), else ``""``.
        array_name: the dtype's attribute name in numpy, ml_dtypes, torch and cupy.
        ml_dtypes: the type lives in ml_dtypes, not numpy itself.
        fr_name: the name PyTorch's flight recorder writes (``c10::toString``).
        dlpack: DLPack's ``(DLDataTypeCode, bits)``.
    """

    code: int
    nccl_name: str
    name: str
    aliases: Tuple[str, ...]
    itemsize: int
    kind: str
    array_name: str
    ml_dtypes: bool
    fr_name: str
    dlpack: Tuple[int, int]

    @property
    def is_float(self) -> bool:
        """A floating-point type (float16/32/64, bfloat16, the float8 types)."""
        return self.kind == "f" or self.ml_dtypes


DATATYPES: Tuple[Datatype, ...] = (
    Datatype(0, "ncclInt8", "int8", ("char",), 1, "i", "int8", False, "Char", (0, 8)),
    Datatype(1, "ncclUint8", "uint8", (), 1, "u", "uint8", False, "Byte", (1, 8)),
    Datatype(2, "ncclInt32", "int32", ("int",), 4, "i", "int32", False, "Int", (0, 32)),
    Datatype(3, "ncclUint32", "uint32", (), 4, "u", "uint32", False, "UInt32", (1, 32)),
    Datatype(4, "ncclInt64", "int64", (), 8, "i", "int64", False, "Long", (0, 64)),
    Datatype(5, "ncclUint64", "uint64", (), 8, "u", "uint64", False, "UInt64", (1, 64)),
    Datatype(6, "ncclFloat16", "half", ("float16", "fp16"), 2, "f", "float16", False, "Half", (2, 16)),
    Datatype(7, "ncclFloat32", "float", ("float32", "fp32"), 4, "f", "float32", False, "Float", (2, 32)),
    Datatype(8, "ncclFloat64", "double", ("float64", "fp64"), 8, "f", "float64", False, "Double", (2, 64)),
    Datatype(9, "ncclBfloat16", "bfloat16", ("bf16",), 2, "", "bfloat16", True, "BFloat16", (4, 16)),
    Datatype(10, "ncclFloat8e4m3", "f8e4m3", ("float8_e4m3fn", "fp8_e4m3"), 1, "", "float8_e4m3fn", True,
             "Float8_e4m3fn", (10, 8)),
    Datatype(11, "ncclFloat8e5m2", "f8e5m2", ("float8_e5m2", "fp8_e5m2"), 1, "", "float8_e5m2", True,
             "Float8_e5m2", (12, 8)),
)

#: code -> Datatype (a tuple indexed by the code).
BY_CODE: Tuple[Datatype, ...] = DATATYPES
#: pycoll-bench's short names and aliases, and the array names -> Datatype (``"float"`` is float32 here).
BY_NAME: Dict[str, Datatype] = {n: d for d in DATATYPES for n in (d.name, d.array_name, *d.aliases)}
#: numpy / ml_dtypes / torch / cupy attribute name -> Datatype.
BY_ARRAY_NAME: Dict[str, Datatype] = {d.array_name: d for d in DATATYPES}

UINT8 = 1
INT32 = 2
FLOAT64 = 8

#: code -> bytes per element.
ITEMSIZES: Dict[int, int] = {d.code: d.itemsize for d in DATATYPES}
#: code -> the flight recorder's dtype name (``"Float"``, ``"BFloat16"``...).
FR_NAMES: Dict[int, str] = {d.code: d.fr_name for d in DATATYPES}
#: (numpy dtype kind, itemsize) -> code, for the builtin numpy integer and float types.
KIND_SIZE: Dict[Tuple[str, int], int] = {(d.kind, d.itemsize): d.code for d in DATATYPES if d.kind}
#: DLPack (DLDataTypeCode, bits) -> code.
DLPACK: Dict[Tuple[int, int], int] = {d.dlpack: d.code for d in DATATYPES}

#: Readable list of the supported dtypes, for error messages.
SUPPORTED = ", ".join(d.array_name for d in DATATYPES)

#: Built-in reduction operator name -> ``ncclRedOp_t``.
REDUCE_OPS: Dict[str, int] = {"sum": 0, "prod": 1, "max": 2, "min": 3, "avg": 4}
SUM = 0
#: ``ncclNumOps``: operators created by ``ncclRedOpCreatePreMulSum`` have ids from here on.
PREMUL_SUM_MIN = 5


def numpy_dtype(code: int) -> Any:
    """The numpy dtype of datatype ``code`` (bfloat16 and float8 need the ml_dtypes package).

    Raises ``ValueError`` for an unknown code, ``ImportError`` when ml_dtypes is missing.
    """
    import numpy as np

    if not 0 <= code < len(BY_CODE):
        raise ValueError(f"unknown NCCL datatype {code}")
    d = BY_CODE[code]
    if not d.ml_dtypes:
        return np.dtype(d.array_name)
    import ml_dtypes

    return np.dtype(getattr(ml_dtypes, d.array_name))


def datatype_of(dtype: Any) -> int:
    """The datatype code of a numpy or torch dtype, anything ``numpy.dtype()`` accepts, or a code.

    Names are numpy's (``"float32"``, ``"bfloat16"`` with ml_dtypes installed), not pycoll-bench's.
    Raises ``ValueError`` for an unknown code or a non-native byte order, ``TypeError`` for anything
    that is no NCCL datatype.
    """
    if isinstance(dtype, int) and not isinstance(dtype, bool):
        if not 0 <= dtype < len(BY_CODE):
            raise ValueError(f"unknown NCCL datatype {dtype}")
        return dtype
    if type(dtype).__module__ == "torch":
        name = str(dtype)
        d = BY_ARRAY_NAME.get(name[len("torch."):]) if name.startswith("torch.") else None
        if d is None:
            raise TypeError(f"dtype {dtype} is not supported; supported: {SUPPORTED}")
        return d.code
    import numpy as np

    if isinstance(dtype, np.generic):  # numpy would take the value's type (np.int64(7): int64, not datatype 7)
        raise TypeError(f"dtype must be a dtype, a name or an NCCL datatype code (a Python int), got the numpy value "
                        f"{dtype!r}")
    try:
        npdt = np.dtype(dtype)
    except TypeError:
        try:
            import ml_dtypes  # noqa: F401  (registers bfloat16 / float8 names with numpy)

            npdt = np.dtype(dtype)
        except (ImportError, TypeError):
            raise TypeError(f"cannot interpret {dtype!r} as a dtype") from None
    if not npdt.isnative:
        raise ValueError(f"dtype {npdt.str!r} is not in native byte order")
    code = numpy_code(npdt)
    if code is None:
        raise TypeError(f"dtype {npdt} is not supported; supported: {SUPPORTED}")
    return code


def numpy_code(npdt: Any) -> Optional[int]:
    """The datatype code of a numpy dtype (byte order ignored), or None when NCCL has no such type."""
    code = KIND_SIZE.get((npdt.kind, npdt.itemsize))
    if code is not None:
        return code
    ml = sys.modules.get("ml_dtypes")
    if ml is None:
        return None
    for d in DATATYPES:
        if d.ml_dtypes and npdt.type is getattr(ml, d.array_name, None):
            return d.code
    return None
