"""Array arguments as raw buffers: address, size, NCCL datatype and device, never a copy.

:func:`as_buffer` accepts, in this order:

1. torch tensors (read directly: ``data_ptr``, ``is_contiguous``, ``dtype``, device);
2. numpy arrays, including the ml_dtypes ``bfloat16`` / ``float8_e4m3fn`` / ``float8_e5m2`` types;
3. anything implementing DLPack (``__dlpack__`` / ``__dlpack_device__``): versioned capsules
   first (``max_version=(1, 0)``), the legacy call for older producers;
4. anything implementing ``__cuda_array_interface__`` (versions 0 to 3);
5. anything implementing the Python buffer protocol (``bytearray``, ``array.array``, ``memoryview``,
   ``mmap``, ctypes arrays, ...).

Every path checks that the memory is C-contiguous (dimensions of size 1 and empty arrays may have
any strides), in native byte order, of a datatype NCCL has, and -- for outputs -- writable. A
failed check raises ``TypeError`` (an object or dtype pycoll cannot use) or ``ValueError``
(everything else), naming the argument and the problem.

The returned :class:`Buffer` keeps the producer's memory alive (the array, the unconsumed DLPack
capsule whose deleter runs when the buffer dies, or the memoryview) until the last reference to it
is dropped; whoever hands ``Buffer.ptr`` to a library must keep the ``Buffer`` until the operation
has completed.
"""

from __future__ import annotations

import ctypes
import enum
import operator
import platform
import sys
from typing import TYPE_CHECKING, Any, Dict, List, NamedTuple, Optional, Tuple

import numpy as np

from . import _dtypes
from .devices import torch_current_stream

__all__ = [
    "Buffer",
    "DeviceType",
    "DATATYPE_NAMES",
    "DATATYPE_ITEMSIZES",
    "BACKEND_DEVICE_TYPES",
    "as_buffer",
    "check_device",
    "check_count",
    "check_overlap",
    "check_same_dtype",
    "device_name",
    "integer",
]


class DeviceType(enum.IntEnum):
    """DLPack's ``DLDeviceType`` values (``Buffer.device_type`` holds the plain int)."""

    CPU = 1
    CUDA = 2
    CUDA_HOST = 3
    OPENCL = 4
    VULKAN = 7
    METAL = 8
    VPI = 9
    ROCM = 10
    ROCM_HOST = 11
    EXT_DEV = 12
    CUDA_MANAGED = 13
    ONEAPI = 14
    WEBGPU = 15
    HEXAGON = 16
    MAIA = 17
    TRN = 18


_CPU, _CUDA, _CUDA_HOST, _ROCM, _ROCM_HOST, _CUDA_MANAGED = 1, 2, 3, 10, 11, 13

_DEVICE_NAMES = {
    1: "cpu",
    2: "cuda",
    3: "cuda_host",
    4: "opencl",
    7: "vulkan",
    8: "metal",
    9: "vpi",
    10: "rocm",
    11: "rocm_host",
    12: "ext_dev",
    13: "cuda_managed",
    14: "oneapi",
    15: "webgpu",
    16: "hexagon",
    17: "maia",
    18: "trn",
}

#: ncclDataType_t -> the dtype's name as PyTorch's flight recorder writes it (c10::toString).
DATATYPE_NAMES: Dict[int, str] = _dtypes.FR_NAMES

#: ncclDataType_t -> bytes per element.
DATATYPE_ITEMSIZES: Dict[int, int] = _dtypes.ITEMSIZES

# (kind, itemsize) -> ncclDataType_t, kind as in numpy's dtype.kind ('i', 'u', 'f')
_KIND_SIZE: Dict[Tuple[str, int], int] = _dtypes.KIND_SIZE

#: Device types each backend can read and write (see :func:`check_device`).
BACKEND_DEVICE_TYPES: Dict[str, frozenset] = {
    "host": frozenset({_CPU, _CUDA_HOST, _ROCM_HOST}),
    "nccl": frozenset({_CUDA, _CUDA_MANAGED}),
    "rccl": frozenset({_ROCM}),
}

_SUPPORTED = _dtypes.SUPPORTED


def device_name(device_type: int, device_id: int = 0) -> str:
    """A short readable name for a DLPack device: ``"cpu"``, ``"cuda:0"``, ``"rocm:1"``, ``"cuda:?"``."""
    base = _DEVICE_NAMES.get(device_type, f"device_type={device_type}")
    if device_type == _CPU:
        return base
    return f"{base}:{device_id if device_id >= 0 else '?'}"


class Buffer(NamedTuple):
    """One contiguous array argument, described for a C call. Immutable; compares by identity.

    Attributes:
        ptr: address of the first element (``byte_offset`` already applied; may be 0 when empty).
        nbytes: size in bytes (``count * itemsize``).
        count: number of elements.
        datatype: the ``ncclDataType_t`` value.
        dtype_name: the dtype as PyTorch's flight recorder names it (``"Float"``, ``"BFloat16"``...).
        shape: the array's shape.
        device_type: DLPack ``DLDeviceType`` number (1 CPU, 2 CUDA, 3 CUDA host, 10 ROCm, ...).
        device_id: the device ordinal; -1 when the producer does not say (``__cuda_array_interface__``).
        readonly: the producer marked the memory read-only.
        owner: the object keeping the memory alive (array, DLPack capsule or memoryview).
        source: how it was read: ``"torch"``, ``"numpy"``, ``"dlpack"``, ``"cai"`` or ``"buffer"``.
        sync_stream: a producer stream (raw handle) whose pending work the collective's stream must
            wait for before touching the memory (the ``stream`` of ``__cuda_array_interface__`` v3
            when it differs from the consumer's stream), else None.
        name: the argument's name, used in error messages.
    """

    ptr: int
    nbytes: int
    count: int  # type: ignore[assignment]  # the element count; it shadows tuple.count on purpose
    datatype: int
    dtype_name: str
    shape: Tuple[int, ...]
    device_type: int
    device_id: int
    readonly: bool
    owner: Any
    source: str
    sync_stream: Optional[int]
    name: str

    # identity, not tuple, equality (hidden from mypy, which would take these assignments for fields)
    if not TYPE_CHECKING:  # type: ignore[misc]  # mypy allows only fields in a NamedTuple body
        __eq__ = object.__eq__
        __ne__ = object.__ne__
        __hash__ = object.__hash__

    @property
    def itemsize(self) -> int:
        """Bytes per element."""
        return DATATYPE_ITEMSIZES[self.datatype]

    @property
    def device(self) -> str:
        """The device as a short string, e.g. ``"cpu"`` or ``"cuda:0"``."""
        return device_name(self.device_type, self.device_id)

    def __repr__(self) -> str:
        return (
            f"Buffer({self.name}: {self.dtype_name}{list(self.shape)} on {self.device}, "
            f"ptr=0x{self.ptr:x}, nbytes={self.nbytes}{', readonly' if self.readonly else ''}, "
            f"from {self.source})"
        )


# Buffer(...) runs NamedTuple's generated __new__ (~0.4 us); the paths below build the
# tuple directly (~0.15 us), with the fields in declaration order.
_new_buffer = tuple.__new__


# --- numpy -------------------------------------------------------------------------------------

_ndarray = np.ndarray
_NP_TYPES: Dict[type, int] = {}  # numpy DType class -> ncclDataType_t
_NP_HAS_ML_DTYPES = False


def _build_numpy_table() -> None:
    global _NP_HAS_ML_DTYPES
    for code in np.typecodes["AllInteger"] + np.typecodes["Float"]:
        dt = np.dtype(code)
        nccl = _KIND_SIZE.get((dt.kind, dt.itemsize))
        if nccl is not None:
            _NP_TYPES[type(dt)] = nccl
    ml = sys.modules.get("ml_dtypes")
    if ml is not None:
        for attr, nccl in ((d.array_name, d.code) for d in _dtypes.DATATYPES if d.ml_dtypes):
            scalar = getattr(ml, attr, None)
            if scalar is not None:
                _NP_TYPES[type(np.dtype(scalar))] = nccl
        _NP_HAS_ML_DTYPES = True


_build_numpy_table()

# An ndarray's data pointer is the first field after the object header (PyArray_DATA reads it at
# that fixed offset in every compiled extension, so numpy's ABI keeps it there). Reading it
# directly costs ~0.3 us; numpy's own accessors (.ctypes.data, __array_interface__) cost ~2.5 us.
# The offset is verified on probe arrays at import; anything unexpected falls back to numpy's API.
_read_ptr = ctypes.c_void_p.from_address
_NP_DATA_OFFSET: Optional[int] = None


def _probe_numpy_data_offset() -> Optional[int]:
    if platform.python_implementation() != "CPython":
        return None
    offset = object.__basicsize__
    base = np.arange(16, dtype=np.float64)
    probes = (base, base[3:], base.reshape(4, 4)[1], np.zeros(0, np.int8), np.ones((), np.float32))
    for arr in probes:
        if (_read_ptr(id(arr) + offset).value or 0) != arr.__array_interface__["data"][0]:
            return None
    return offset


_NP_DATA_OFFSET = _probe_numpy_data_offset()


def _numpy_ptr(arr: np.ndarray) -> int:
    if _NP_DATA_OFFSET is not None:
        return _read_ptr(id(arr) + _NP_DATA_OFFSET).value or 0
    return arr.__array_interface__["data"][0]


def _numpy_dtype_error(name: str, dt: np.dtype) -> Exception:
    if not dt.isnative:
        return ValueError(
            f"{name}: dtype {dt.str!r} is not in native byte order; convert it first "
            f"(e.g. arr.astype(arr.dtype.newbyteorder('=')))"
        )
    return TypeError(f"{name}: dtype {dt} is not supported; supported: {_SUPPORTED}")


def _from_numpy(arr: np.ndarray, writable: bool, name: str) -> Buffer:
    dt = arr.dtype
    nccl = _NP_TYPES.get(type(dt))
    if nccl is None and not _NP_HAS_ML_DTYPES and "ml_dtypes" in sys.modules:
        _build_numpy_table()  # ml_dtypes was imported after pycoll.buffers
        nccl = _NP_TYPES.get(type(dt))
    if nccl is None or not dt.isnative:
        raise _numpy_dtype_error(name, dt)
    flags = arr.flags
    if not flags.c_contiguous:
        raise _not_contiguous(name, arr.shape, arr.strides, "bytes")
    readonly = not flags.writeable
    if writable and readonly:
        raise _read_only(name)
    return _new_buffer(
        Buffer,
        (_numpy_ptr(arr), arr.nbytes, arr.size, nccl, DATATYPE_NAMES[nccl], arr.shape, _CPU, 0, readonly, arr,
         "numpy", None, name),
    )


# --- torch -------------------------------------------------------------------------------------

_TORCH_TYPES: Optional[Dict[Any, int]] = None
_TORCH_GPU = _CUDA


_TORCH_TENSOR: Any = None


def _torch_tensor_type(torch: Any) -> Any:
    global _TORCH_TENSOR
    if _TORCH_TENSOR is None:
        tensor = getattr(torch, "Tensor", None)  # None while torch is still being imported
        if tensor is None:
            return ()
        _TORCH_TENSOR = tensor
    return _TORCH_TENSOR


def _torch_table(torch: Any) -> Dict[Any, int]:
    global _TORCH_TYPES, _TORCH_GPU
    table = {}
    for attr, nccl in ((d.array_name, d.code) for d in _dtypes.DATATYPES):
        dt = getattr(torch, attr, None)
        if dt is not None:
            table[dt] = nccl
    _TORCH_GPU = _ROCM if getattr(torch.version, "hip", None) else _CUDA
    _TORCH_TYPES = table
    return table


def _from_torch(t: Any, torch: Any, name: str, stream: Optional[int] = None) -> Buffer:
    if type(t).__name__ == "MaskedTensor":  # torch.masked's: as numpy's masked arrays
        raise ValueError(f"{name}: masked tensors are not supported: the mask would be ignored; pass "
                         "t.get_data() (or a filled tensor)")
    table = _TORCH_TYPES if _TORCH_TYPES is not None else _torch_table(torch)
    nccl = table.get(t.dtype)
    if nccl is None:
        raise TypeError(f"{name}: dtype {t.dtype} is not supported; supported: {_SUPPORTED}")
    if t.layout is not torch.strided:
        raise TypeError(f"{name}: a tensor with layout {t.layout} cannot be used; pass a dense tensor")
    if t.is_nested:  # strided nested tensors have no shape (torch raises an internal error for one)
        raise TypeError(f"{name}: a nested tensor cannot be used; pass a dense tensor")
    if t.is_cpu:
        device_type, device_id = _CPU, 0
    elif t.is_cuda:
        device_type, device_id = _TORCH_GPU, t.get_device()
    else:
        raise ValueError(f"{name}: tensors on device {t.device} are not supported (only cpu and cuda)")
    if not t.is_contiguous():
        raise _not_contiguous(name, tuple(t.shape), t.stride(), "elements", hint=".contiguous()")
    if t.is_neg():
        raise ValueError(f"{name}: the tensor has its negative bit set; call .resolve_neg() first")
    count = t.numel()
    try:
        ptr = t.data_ptr()
    except RuntimeError as e:  # a functorch tensor (inside torch.func.grad/vmap), a wrapper subclass
        raise ValueError(f"{name}: the tensor has no storage pycoll can read ({e}); inside a torch.func transform "
                         "(grad, vmap) call pycoll outside it") from None
    if count and not ptr:
        if type(t) not in (torch.Tensor, torch.nn.Parameter):
            raise ValueError(f"{name}: a {type(t).__name__} has no memory of its own (a wrapper subclass: data_ptr() "
                             "is 0); pass the tensor it holds (a DTensor's: d.to_local())")
        raise ValueError(f"{name}: the tensor has no memory (data_ptr() is 0: a ZeroTensor, as autograd makes for a "
                         "known-zero gradient, or a fake tensor); pass a tensor with storage (torch.zeros(...))")
    sync = None
    if device_type == _TORCH_GPU and stream is not None:
        # the kernels that wrote t run on torch's current stream of its device: a collective on
        # another stream must wait for them (as torch's own collectives make their stream wait)
        current = torch_current_stream(torch, t)
        if current != stream and not (current == 0 and stream == 1):
            sync = current
    return _new_buffer(
        Buffer,
        (ptr, count * DATATYPE_ITEMSIZES[nccl], count, nccl, DATATYPE_NAMES[nccl], t.shape,
         device_type, device_id, False, t, "torch", sync, name),
    )


# --- DLPack ------------------------------------------------------------------------------------


class _DLDevice(ctypes.Structure):
    _fields_ = [("device_type", ctypes.c_int32), ("device_id", ctypes.c_int32)]


class _DLDataType(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint8), ("bits", ctypes.c_uint8), ("lanes", ctypes.c_uint16)]


class _DLTensor(ctypes.Structure):
    _fields_ = [
        ("data", ctypes.c_void_p),
        ("device", _DLDevice),
        ("ndim", ctypes.c_int32),
        ("dtype", _DLDataType),
        ("shape", ctypes.POINTER(ctypes.c_int64)),
        ("strides", ctypes.POINTER(ctypes.c_int64)),
        ("byte_offset", ctypes.c_uint64),
    ]


class _DLManagedTensor(ctypes.Structure):
    _fields_ = [("dl_tensor", _DLTensor), ("manager_ctx", ctypes.c_void_p), ("deleter", ctypes.c_void_p)]


class _DLPackVersion(ctypes.Structure):
    _fields_ = [("major", ctypes.c_uint32), ("minor", ctypes.c_uint32)]


class _DLManagedTensorVersioned(ctypes.Structure):
    _fields_ = [
        ("version", _DLPackVersion),
        ("manager_ctx", ctypes.c_void_p),
        ("deleter", ctypes.c_void_p),
        ("flags", ctypes.c_uint64),
        ("dl_tensor", _DLTensor),
    ]


_DLPACK_READ_ONLY = 1
_DLPACK_IS_COPIED = 2
_DLPACK_MAX_NDIM = 1024

# private prototypes: setting argtypes on ctypes.pythonapi's shared function objects would leak
# into every other module using them
_capsule_is_valid = ctypes.PYFUNCTYPE(ctypes.c_int, ctypes.py_object, ctypes.c_char_p)(
    ("PyCapsule_IsValid", ctypes.pythonapi)
)
_capsule_pointer = ctypes.PYFUNCTYPE(ctypes.c_void_p, ctypes.py_object, ctypes.c_char_p)(
    ("PyCapsule_GetPointer", ctypes.pythonapi)
)

# (DLDataTypeCode, bits) -> ncclDataType_t
_DLPACK_TYPES: Dict[Tuple[int, int], int] = _dtypes.DLPACK
_DLPACK_CODE_NAMES = {
    0: "int",
    1: "uint",
    2: "float",
    3: "opaque handle",
    4: "bfloat",
    5: "complex",
    6: "bool",
    7: "float8_e3m4",
    8: "float8_e4m3",
    9: "float8_e4m3b11fnuz",
    10: "float8_e4m3fn",
    11: "float8_e4m3fnuz",
    12: "float8_e5m2",
    13: "float8_e5m2fnuz",
    14: "float8_e8m0fnu",
    15: "float6_e2m3fn",
    16: "float6_e3m2fn",
    17: "float4_e2m1fn",
}


def _dlpack_stream_arg(device_type: int, stream: Optional[int]) -> Optional[int]:
    """The ``stream`` argument for ``__dlpack__``: where the consumer will use the data.

    CPU-side producers get None (the standard requires it). GPU producers get the consumer's stream
    so they order their pending work before it, or -1 ("no synchronization") when the caller did
    not name one. CUDA forbids 0 (ambiguous) and spells the legacy default stream 1.
    """
    if device_type in (_CUDA, _CUDA_MANAGED):
        if stream is None:
            return -1
        return 1 if stream == 0 else stream
    if device_type == _ROCM:
        return -1 if stream is None else stream
    return None


def _call_dlpack(obj: Any, stream: Optional[int], name: str, versioned_tried: bool = False) -> Any:
    """The capsule of ``obj.__dlpack__``, asked as DLPack 1.0 (``max_version``, ``copy=False``), then as a 1.0
    producer without ``copy``, then as an older producer; ``versioned_tried``: the first form raised TypeError
    already (``pycoll._core`` asked it)."""
    dev = getattr(obj, "__dlpack_device__", None)
    try:
        device_type = int(dev()[0]) if dev is not None else _CPU
    except Exception as exc:
        raise _device_failed(obj, exc, name) from exc
    stream_arg = _dlpack_stream_arg(device_type, stream)
    forms: List[Dict[str, Any]] = [{"stream": stream_arg, "max_version": (1, 0), "copy": False},
                                   {"stream": stream_arg, "max_version": (1, 0)},
                                   {} if stream_arg is None else {"stream": stream_arg}]
    for kwargs in forms[1 if versioned_tried else 0:]:
        try:
            return obj.__dlpack__(**kwargs)
        except TypeError as exc:  # a keyword this producer does not take
            last = exc
        except Exception as exc:
            raise _refused(obj, exc, name) from exc
    raise TypeError(f"{name}: {type(obj).__name__}.__dlpack__ failed: {last}") from last


def _refused(obj: Any, exc: BaseException, name: str) -> ValueError:
    return ValueError(f"{name}: {type(obj).__name__}.__dlpack__ refused to export it: {exc}")


def _device_failed(obj: Any, exc: BaseException, name: str) -> ValueError:
    """The error of a producer whose ``__dlpack_device__`` failed: its ``__dlpack__`` usually says why (a deleted or
    donated jax.Array), else the device's failure."""
    try:
        obj.__dlpack__()
    except Exception as why:
        return _refused(obj, why, name)
    return ValueError(f"{name}: {type(obj).__name__}.__dlpack_device__() failed: {exc!r}")


#: top-level modules whose arrays are immutable (their DLPack capsules carry no read-only flag), and what to call them
_IMMUTABLE = {"jax": "jax.Array", "jaxlib": "jax.Array"}


def check_mutable(obj: Any, name: str) -> None:
    """ValueError where ``obj`` is an immutable array (a jax.Array) that an operation would write into: its readers
    would see old values, new ones or a mix (jax reads it asynchronously, caches it in compiled functions)."""
    kind = _IMMUTABLE.get(type(obj).__module__.partition(".")[0])
    if kind is not None:
        raise ValueError(f"{name}: a {kind} is immutable, and this operation writes its result into {name}. Pass a "
                         "numpy array to receive it (out = np.empty(x.shape, x.dtype)) and make a jax.Array of it "
                         "afterwards (jnp.asarray(out))")


def _from_dlpack(obj: Any, writable: bool, stream: Optional[int], name: str) -> Buffer:
    if writable:
        check_mutable(obj, name)
    return _capsule_buffer(obj, _call_dlpack(obj, stream, name), writable, name)


def _capsule_buffer(obj: Any, capsule: Any, writable: bool, name: str) -> Buffer:
    """The Buffer of the capsule ``obj.__dlpack__`` gave (``pycoll._core`` reads the usual ones in C, and hands
    this the others)."""
    if _capsule_is_valid(capsule, b"dltensor_versioned"):
        managed = _DLManagedTensorVersioned.from_address(_capsule_pointer(capsule, b"dltensor_versioned"))
        major = managed.version.major
        if major != 1:
            raise ValueError(
                f"{name}: the DLPack capsule has ABI version {major}.{managed.version.minor}; "
                "pycoll reads version 1"
            )
        flags = managed.flags
        tensor = managed.dl_tensor
        readonly = bool(flags & _DLPACK_READ_ONLY)
        if writable and flags & _DLPACK_IS_COPIED:
            raise ValueError(
                f"{name}: the producer exported a copy (DLPack IS_COPIED flag), so results written "
                "into it would be lost; pass the array's own memory"
            )
    elif _capsule_is_valid(capsule, b"dltensor"):
        tensor = _DLManagedTensor.from_address(_capsule_pointer(capsule, b"dltensor")).dl_tensor
        readonly = False
    else:
        raise TypeError(
            f"{name}: {type(obj).__name__}.__dlpack__ did not return an unconsumed DLPack capsule "
            f"(got {type(capsule).__name__})"
        )
    if writable and readonly:
        raise _read_only(name)
    return _dltensor_buffer(tensor, readonly, capsule, name)


def _dltensor_buffer(tensor: _DLTensor, readonly: bool, capsule: Any, name: str) -> Buffer:
    dtype = tensor.dtype
    code, bits, lanes = dtype.code, dtype.bits, dtype.lanes
    nccl = _DLPACK_TYPES.get((code, bits))
    if nccl is None or lanes != 1:
        kind = _DLPACK_CODE_NAMES.get(code, f"code {code}")
        vec = f" x{lanes} lanes" if lanes != 1 else ""
        raise TypeError(f"{name}: DLPack dtype {kind}{bits}{vec} is not supported; supported: {_SUPPORTED}")
    ndim = tensor.ndim
    if ndim < 0 or ndim > _DLPACK_MAX_NDIM:
        raise ValueError(f"{name}: the DLPack tensor has an invalid ndim {ndim}")
    if ndim and not tensor.shape:
        raise ValueError(f"{name}: the DLPack tensor has ndim {ndim} but no shape")
    shape = tuple(tensor.shape[:ndim])
    count = 1
    for n in shape:
        if n < 0:
            raise ValueError(f"{name}: the DLPack tensor has a negative dimension in shape {shape}")
        count *= n
    if tensor.strides and count:
        strides = tuple(tensor.strides[:ndim])
        if not _is_c_contiguous(shape, strides, 1):
            raise _not_contiguous(name, shape, strides, "elements")
    device = tensor.device
    return _new_buffer(
        Buffer,
        (
            (tensor.data or 0) + tensor.byte_offset,
            count * DATATYPE_ITEMSIZES[nccl],
            count,
            nccl,
            DATATYPE_NAMES[nccl],
            shape,
            device.device_type,
            device.device_id,
            readonly,
            capsule,
            "dlpack",
            None,
            name,
        ),
    )


# --- __cuda_array_interface__ ------------------------------------------------------------------

_NATIVE_ORDER = "<" if sys.byteorder == "little" else ">"


def _typestr_datatype(typestr: Any, name: str) -> int:
    if not isinstance(typestr, str) or len(typestr) < 3 or typestr[0] not in "<>|=":
        raise ValueError(f"{name}: invalid typestr {typestr!r} in __cuda_array_interface__")
    order, kind, size = typestr[0], typestr[1], typestr[2:]
    if not size.isdigit():
        raise ValueError(f"{name}: invalid typestr {typestr!r} in __cuda_array_interface__")
    itemsize = int(size)
    nccl = _KIND_SIZE.get((kind, itemsize))
    if nccl is None:
        raise TypeError(f"{name}: typestr {typestr!r} is not supported; supported: {_SUPPORTED}")
    if itemsize > 1 and order not in ("=", _NATIVE_ORDER):
        raise ValueError(f"{name}: typestr {typestr!r} is not in native byte order")
    return nccl


def _from_cai(obj: Any, writable: bool, stream: Optional[int], name: str) -> Buffer:
    cai = obj.__cuda_array_interface__
    if not isinstance(cai, dict):
        raise TypeError(f"{name}: __cuda_array_interface__ is a {type(cai).__name__}, not a dict")
    if cai.get("mask") is not None:
        raise ValueError(f"{name}: masked arrays (__cuda_array_interface__ 'mask') are not supported")
    try:
        shape = tuple(int(n) for n in cai["shape"])
        ptr, readonly = cai["data"]
        typestr = cai["typestr"]
    except (KeyError, TypeError, ValueError) as exc:
        raise ValueError(f"{name}: malformed __cuda_array_interface__ ({exc!r})") from None
    nccl = _typestr_datatype(typestr, name)
    count = 1
    for n in shape:
        if n < 0:
            raise ValueError(f"{name}: negative dimension in shape {shape}")
        count *= n
    strides = cai.get("strides")
    if strides is not None and count:
        strides = tuple(int(s) for s in strides)
        if len(strides) != len(shape):
            raise ValueError(f"{name}: __cuda_array_interface__ strides {strides} do not match shape {shape}")
        if not _is_c_contiguous(shape, strides, DATATYPE_ITEMSIZES[nccl]):
            raise _not_contiguous(name, shape, strides, "bytes")
    readonly = bool(readonly)
    if writable and readonly:
        raise _read_only(name)
    producer = cai.get("stream")
    if producer is not None:
        producer = int(producer)
        if producer == 0:
            raise ValueError(
                f"{name}: __cuda_array_interface__ stream 0 is ambiguous and disallowed by the "
                "interface; the producer must pass 1 (legacy default stream) or a stream handle"
            )
        if stream is not None and (producer == stream or (producer == 1 and stream == 0)):
            producer = None  # already the consumer's stream
    return _new_buffer(
        Buffer,
        (
            int(ptr or 0),
            count * DATATYPE_ITEMSIZES[nccl],
            count,
            nccl,
            DATATYPE_NAMES[nccl],
            shape,
            _CUDA,
            -1,
            readonly,
            obj,
            "cai",
            producer,
            name,
        ),
    )


# --- buffer protocol ---------------------------------------------------------------------------

# struct format character -> kind; the size comes from memoryview.itemsize
_FORMAT_KINDS = {
    "b": "i",
    "B": "u",
    "c": "u",
    "h": "i",
    "H": "u",
    "i": "i",
    "I": "u",
    "l": "i",
    "L": "u",
    "q": "i",
    "Q": "u",
    "n": "i",
    "N": "u",
    "e": "f",
    "f": "f",
    "d": "f",
}


def _format_datatype(fmt: str, itemsize: int, name: str) -> int:
    order = "@"
    if fmt and fmt[0] in "@=<>!":
        order, fmt = fmt[0], fmt[1:]
    kind = _FORMAT_KINDS.get(fmt)
    nccl = _KIND_SIZE.get((kind, itemsize)) if kind else None
    if nccl is None:
        raise TypeError(f"{name}: buffer format {order + fmt if order != '@' else fmt!r} is not supported; "
                        f"supported: {_SUPPORTED}")
    if itemsize > 1 and order in "<>!" and (order == "<") != (sys.byteorder == "little"):
        raise ValueError(f"{name}: buffer format {order + fmt!r} is not in native byte order")
    return nccl


def _from_buffer_protocol(obj: Any, writable: bool, name: str) -> Buffer:
    try:
        view = memoryview(obj)
    except ValueError as exc:  # a released memoryview, a closed mmap
        raise ValueError(f"{name}: {type(obj).__qualname__} cannot be read: {exc}") from None
    except TypeError:
        raise TypeError(
            f"{name}: cannot use an object of type {type(obj).__qualname__}; pass a torch tensor, a numpy "
            "array, an object implementing __dlpack__ or __cuda_array_interface__, or a buffer "
            "(bytearray, array.array, memoryview)"
        ) from None
    nccl = _format_datatype(view.format, view.itemsize, name)
    if not view.c_contiguous:
        raise _not_contiguous(name, view.shape, view.strides, "bytes")
    if writable and view.readonly:
        if isinstance(obj, np.generic):
            raise ValueError(f"{name}: a numpy scalar ({type(obj).__name__}) cannot receive a result; pass an array "
                             "(np.array(x) or np.empty(...))")
        raise _read_only(name)
    # a flat uint8 view of the same memory gives the address; it holds `view`, which holds the export
    flat = np.frombuffer(view, dtype=np.uint8)
    count = view.nbytes // view.itemsize
    return _new_buffer(
        Buffer,
        (
            _numpy_ptr(flat),
            view.nbytes,
            count,
            nccl,
            DATATYPE_NAMES[nccl],
            tuple(view.shape or ()),
            _CPU,
            0,
            view.readonly,
            flat,
            "buffer",
            None,
            name,
        ),
    )


# --- shared checks -----------------------------------------------------------------------------


def _is_c_contiguous(shape: Tuple[int, ...], strides: Tuple[int, ...], itemsize: int) -> bool:
    expected = itemsize
    for n, s in zip(reversed(shape), reversed(strides), strict=False):
        if n != 1 and s != expected:
            return False
        expected *= n
    return True


def _not_contiguous(name: str, shape: Any, strides: Any, unit: str, hint: str = "") -> ValueError:
    hint = hint or "np.ascontiguousarray(x) / x.contiguous() / x.copy()"
    return ValueError(
        f"{name}: the array is not C-contiguous (shape {tuple(shape)}, strides {tuple(strides)} in {unit}); "
        f"collectives need contiguous memory: pass {hint} (where it is an output, receive into a contiguous "
        f"array and copy that into yours: a contiguous copy passed as the output would not bring the result back)"
    )


def _read_only(name: str) -> ValueError:
    return ValueError(f"{name}: the array is read-only but the operation writes into it")


def as_buffer(obj: Any, *, writable: bool = False, stream: Optional[int] = None, name: str = "buffer") -> Buffer:
    """Describe ``obj``'s memory as a :class:`Buffer`, without copying it.

    Args:
        obj: a torch tensor, numpy array, DLPack producer, ``__cuda_array_interface__`` object,
            buffer-protocol object, or a :class:`Buffer` (returned as is after the writable check).
        writable: the collective writes into ``obj`` (an output): read-only memory is refused.
        stream: raw handle of the stream the collective will run on (see
            ``pycoll.devices.Device.resolve_stream``). GPU DLPack producers are asked to order
            their pending work before it; a ``__cuda_array_interface__`` stream that differs from
            it is returned in ``Buffer.sync_stream``. None: no synchronization is requested, the
            caller guarantees the data is ready.
        name: the argument's name for error messages (``"input"``, ``"output"``...).

    torch tensors and numpy arrays are read directly and never synchronized: work pending on a
    torch GPU tensor is ordered by running the collective on torch's current stream (what
    ``Device.resolve_stream`` picks for torch tensors when no stream is given).

    Raises:
        TypeError: ``obj`` is not an array pycoll can read, or its dtype has no NCCL datatype
            (bool, complex, int16, object...).
        ValueError: not C-contiguous, non-native byte order, read-only where ``writable``, a
            malformed DLPack capsule or array interface, a masked array, or an immutable array (a jax.Array)
            where ``writable``.
    """
    tp = type(obj)
    if tp is _ndarray:
        return _from_numpy(obj, writable, name)
    torch = sys.modules.get("torch")
    if torch is not None and isinstance(obj, _torch_tensor_type(torch)):
        return _from_torch(obj, torch, name, stream)
    if isinstance(obj, _ndarray):
        ma = sys.modules.get("numpy.ma")
        if ma is not None and isinstance(obj, ma.MaskedArray):
            raise ValueError(f"{name}: masked arrays are not supported: the mask would be ignored (the masked-out "
                             "values sent, results written under the mask); pass x.filled(fill) or the data")
        return _from_numpy(obj, writable, name)
    if tp is Buffer:
        if writable and obj.readonly:
            raise _read_only(obj.name)
        return obj
    if hasattr(tp, "__dlpack__"):
        return _from_dlpack(obj, writable, stream, name)
    if hasattr(obj, "__cuda_array_interface__"):
        return _from_cai(obj, writable, stream, name)
    return _from_buffer_protocol(obj, writable, name)


def check_device(buf: Buffer, backend: str, device_id: Optional[int] = None) -> None:
    """Check that ``buf`` lives where ``backend`` can use it.

    ``backend``: ``"host"`` (CPU memory, including pinned CUDA/ROCm host memory), ``"nccl"``
    (CUDA device or managed memory) or ``"rccl"`` (ROCm device memory; ``__cuda_array_interface__``
    buffers are accepted too, since that interface carries no device type and ROCm builds of CuPy
    use it for HIP memory). ``device_id``: the communicator's device; a GPU buffer on another
    device is refused (unknown device ids, -1, are not checked). Raises ``ValueError``.
    """
    allowed = BACKEND_DEVICE_TYPES.get(backend)
    if allowed is None:
        raise ValueError(f"unknown backend {backend!r}; expected one of {sorted(BACKEND_DEVICE_TYPES)}")
    dtype = buf.device_type
    if dtype not in allowed and not (backend == "rccl" and buf.source == "cai"):
        wants = {"host": "CPU memory", "nccl": "CUDA device memory", "rccl": "ROCm device memory"}[backend]
        raise ValueError(f"{buf.name}: the array is on {buf.device}, but the {backend} backend needs {wants}")
    if (
        device_id is not None
        and backend != "host"
        and buf.device_id >= 0
        and buf.device_id != device_id
    ):
        raise ValueError(
            f"{buf.name}: the array is on {buf.device}, but the communicator uses device {device_id}"
        )


def check_count(buf: Buffer, needed: int, *, exact: bool = False, op: str = "", why: str = "") -> None:
    """Check that ``buf`` holds at least (``exact``: exactly) ``needed`` elements; ``ValueError`` if not.

    ``op`` and ``why`` only shape the message, e.g. ``op="all_gather"``,
    ``why="4 elements per rank x 8 ranks"``.
    """
    if buf.count == needed or (not exact and buf.count > needed):
        return
    prefix = f"{op}: " if op else ""
    reason = f" ({why})" if why else ""
    amount = "exactly" if exact else "at least"
    raise ValueError(f"{prefix}{buf.name} has {buf.count} elements but needs {amount} {needed}{reason}")


def integer(value: Any, what: str, expected: str, minimum: Optional[int] = None) -> int:
    """``value`` as an int: an int or another integer (numpy's, a 0-d integer tensor: what ``operator.index``
    takes), never a bool; TypeError naming ``what`` and ``expected`` otherwise (a float is not rounded), and
    ValueError below ``minimum``."""
    if type(value) is not int:
        if isinstance(value, bool) or not hasattr(type(value), "__index__"):
            raise TypeError(f"{what} must be {expected}, got {type(value).__name__}")
        try:
            value = operator.index(value)
        except TypeError:  # an __index__ that refuses: numpy's bool, a tensor of several elements or of floats
            raise TypeError(f"{what} must be {expected}, got {type(value).__name__} {value!r}") from None
    if minimum is not None and value < minimum:
        raise ValueError(f"{what} must be {expected}, got {value!r}")
    return value


def check_overlap(src: Buffer, dst: Buffer, *, op: str, in_place: Optional[int] = 0, in_place_form: str = "") -> None:
    """Refuse an input ``src`` and an output ``dst`` that share memory other than in the collective's in-place
    layout; ``ValueError`` naming both if they do.

    A collective reads its input while it writes its output piece by piece, so an output that overlaps the
    input anywhere else makes it read what it already overwrote: wrong results, silently (NCCL leaves such
    calls undefined). ``in_place``: the byte offset into ``dst`` at which ``src`` may start and overlap it --
    0 for AllReduce (the same buffer), ``rank`` x the input's bytes for AllGather, minus ``rank`` x the output's
    bytes for ReduceScatter; None where there is no in-place form. ``in_place_form`` names that form in the
    message (e.g. ``"output=None"``).
    """
    if not src.nbytes or not dst.nbytes or src.device_type != dst.device_type:
        return
    if not (src.ptr < dst.ptr + dst.nbytes and dst.ptr < src.ptr + src.nbytes):
        return
    if in_place is not None and src.ptr == dst.ptr + in_place:
        return
    advice = "pass a separate output" if in_place is None else (
        f"pass separate buffers, or the in-place form{f' ({in_place_form})' if in_place_form else ''}")
    raise ValueError(
        f"{op}: {src.name} and {dst.name} overlap in memory ({src.nbytes} bytes at 0x{src.ptr:x}, "
        f"{dst.nbytes} bytes at 0x{dst.ptr:x}) other than in place: the {dst.name} would overwrite "
        f"{src.name} data still to be read; {advice}"
    )


def check_same_dtype(a: Buffer, b: Buffer, *, op: str = "") -> None:
    """Check that two buffers have the same datatype; ``ValueError`` naming both if not."""
    if a.datatype != b.datatype:
        prefix = f"{op}: " if op else ""
        raise ValueError(
            f"{prefix}{a.name} is {a.dtype_name} but {b.name} is {b.dtype_name}; they must have the same dtype"
        )
