"""A DLPack producer written with ctypes, for testing consumers without a GPU.

:class:`FakeDLPack` builds real ``DLManagedTensor`` / ``DLManagedTensorVersioned`` structs in memory
and hands them out in real PyCapsules named ``"dltensor"`` / ``"dltensor_versioned"``, with a
capsule destructor that -- like every conforming producer -- calls the struct's ``deleter`` when the
capsule dies unconsumed. Any device type, dtype code, shape, strides, byte offset, flags and ABI
version can be described; the data address is either a numpy array's memory (CPU) or an arbitrary
integer that is never dereferenced (a "GPU" pointer).

The struct layouts are declared here independently of pycoll, from the DLPack header.
"""

from __future__ import annotations

import ctypes
from typing import Any, Dict, List, Optional, Sequence, Tuple

import numpy as np

KDL_CPU, KDL_CUDA, KDL_CUDA_HOST, KDL_ROCM, KDL_ROCM_HOST, KDL_CUDA_MANAGED = 1, 2, 3, 10, 11, 13
READ_ONLY, IS_COPIED = 1, 2

INT, UINT, FLOAT, BFLOAT, COMPLEX, BOOL, F8_E4M3FN, F8_E5M2, F8_E4M3FNUZ = 0, 1, 2, 4, 5, 6, 10, 12, 11


class DLDevice(ctypes.Structure):
    _fields_ = [("device_type", ctypes.c_int), ("device_id", ctypes.c_int32)]


class DLDataType(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint8), ("bits", ctypes.c_uint8), ("lanes", ctypes.c_uint16)]


class DLTensor(ctypes.Structure):
    _fields_ = [
        ("data", ctypes.c_void_p),
        ("device", DLDevice),
        ("ndim", ctypes.c_int32),
        ("dtype", DLDataType),
        ("shape", ctypes.c_void_p),
        ("strides", ctypes.c_void_p),
        ("byte_offset", ctypes.c_uint64),
    ]


DELETER = ctypes.CFUNCTYPE(None, ctypes.c_void_p)


class DLManagedTensor(ctypes.Structure):
    _fields_ = [("dl_tensor", DLTensor), ("manager_ctx", ctypes.c_void_p), ("deleter", DELETER)]


class DLPackVersion(ctypes.Structure):
    _fields_ = [("major", ctypes.c_uint32), ("minor", ctypes.c_uint32)]


class DLManagedTensorVersioned(ctypes.Structure):
    _fields_ = [
        ("version", DLPackVersion),
        ("manager_ctx", ctypes.c_void_p),
        ("deleter", DELETER),
        ("flags", ctypes.c_uint64),
        ("dl_tensor", DLTensor),
    ]


_NAME_V0 = b"dltensor"
_NAME_V1 = b"dltensor_versioned"

_new_capsule = ctypes.PYFUNCTYPE(ctypes.py_object, ctypes.c_void_p, ctypes.c_char_p, ctypes.c_void_p)(
    ("PyCapsule_New", ctypes.pythonapi)
)
_raw_is_valid = ctypes.PYFUNCTYPE(ctypes.c_int, ctypes.c_void_p, ctypes.c_char_p)(
    ("PyCapsule_IsValid", ctypes.pythonapi)
)
_raw_get_pointer = ctypes.PYFUNCTYPE(ctypes.c_void_p, ctypes.c_void_p, ctypes.c_char_p)(
    ("PyCapsule_GetPointer", ctypes.pythonapi)
)

# managed-struct address -> the export that owns it (the struct, its shape/strides arrays, the data)
_LIVE: Dict[int, _Export] = {}


class _Export:
    def __init__(self, producer: FakeDLPack, struct: Any, keep: List[Any]) -> None:
        self.producer = producer
        self.struct = struct
        self.keep = keep


def _deleter(address: int) -> None:
    export = _LIVE.pop(address, None)
    if export is None:  # a second call: record it so tests can see it
        FakeDLPack.stray_deletes += 1
        return
    export.producer.deleted += 1


_DELETER_FN = DELETER(_deleter)


def _capsule_destructor(capsule: int) -> None:
    # what producers do: an unconsumed capsule (name unchanged) still owns the tensor
    for name, struct_type in ((_NAME_V1, DLManagedTensorVersioned), (_NAME_V0, DLManagedTensor)):
        if _raw_is_valid(capsule, name):
            address = _raw_get_pointer(capsule, name)
            struct_type.from_address(address).deleter(address)
            return


_DESTRUCTOR = ctypes.CFUNCTYPE(None, ctypes.c_void_p)(_capsule_destructor)
_DESTRUCTOR_ADDR = ctypes.cast(_DESTRUCTOR, ctypes.c_void_p).value


def live_exports() -> int:
    """How many exported tensors have not been deleted yet (all producers)."""
    return len(_LIVE)


class FakeDLPack:
    """An array-like object that exports itself through DLPack.

    Args:
        data: a numpy array whose memory is exported (its shape/dtype are the defaults), or an
            int address that is never dereferenced.
        shape, strides (in elements, None for NULL), byte_offset: the DLTensor fields.
        dtype: ``(code, bits, lanes)``; default from ``data`` when it is a numpy array.
        device: ``(device_type, device_id)``.
        versioned: "auto" (v1 capsule when max_version is passed, else v0), "v0" (a producer that
            only knows the old call: ``max_version`` raises TypeError), "v1" (always versioned).
        version: ABI version written into versioned capsules.
        flags: versioned-capsule flags (READ_ONLY, IS_COPIED).
        raise_on_export: an exception ``__dlpack__`` raises instead of exporting.
        capsule: return this object instead of a capsule (to test garbage).

    ``calls`` records the keyword arguments of every ``__dlpack__`` call, ``deleted`` how often
    the deleter ran for this producer's exports.
    """

    stray_deletes = 0

    def __init__(
        self,
        data: Any,
        shape: Optional[Sequence[int]] = None,
        *,
        strides: Optional[Sequence[int]] = None,
        byte_offset: int = 0,
        dtype: Optional[Tuple[int, int, int]] = None,
        device: Tuple[int, int] = (KDL_CPU, 0),
        versioned: str = "auto",
        version: Tuple[int, int] = (1, 0),
        flags: int = 0,
        ndim: Optional[int] = None,
        raise_on_export: Optional[BaseException] = None,
        capsule: Any = None,
    ) -> None:
        if isinstance(data, np.ndarray):
            self.address = data.__array_interface__["data"][0]
            shape = data.shape if shape is None else shape
            dtype = dtype or _numpy_dltype(data.dtype)
        else:
            self.address = int(data)
        self.array = data
        self.shape = tuple(shape if shape is not None else ())
        self.strides = None if strides is None else tuple(strides)
        self.byte_offset = byte_offset
        self.dtype = dtype or (FLOAT, 32, 1)
        self.device = device
        self.versioned = versioned
        self.version = version
        self.flags = flags
        self.ndim = len(self.shape) if ndim is None else ndim
        self.raise_on_export = raise_on_export
        self.capsule = capsule
        self.calls: List[Dict[str, Any]] = []
        self.deleted = 0

    def __dlpack_device__(self) -> Tuple[int, int]:
        return self.device

    def __dlpack__(self, stream: Any = None, **kwargs: Any) -> Any:
        if self.versioned == "v0" and kwargs:
            raise TypeError(f"__dlpack__() got unexpected keyword arguments {sorted(kwargs)}")
        self.calls.append(dict(stream=stream, **kwargs))
        if self.raise_on_export is not None:
            raise self.raise_on_export
        if self.capsule is not None:
            return self.capsule
        use_v1 = self.versioned == "v1" or (self.versioned == "auto" and kwargs.get("max_version") is not None)
        return self._export(use_v1)

    def _export(self, versioned: bool) -> Any:
        keep: List[Any] = []
        tensor = DLTensor()
        tensor.data = self.address
        tensor.device = DLDevice(*self.device)
        tensor.ndim = self.ndim
        tensor.dtype = DLDataType(*self.dtype)
        if self.shape:
            shape = (ctypes.c_int64 * len(self.shape))(*self.shape)
            keep.append(shape)
            tensor.shape = ctypes.addressof(shape)
        if self.strides is not None:
            strides = (ctypes.c_int64 * max(1, len(self.strides)))(*self.strides)
            keep.append(strides)
            tensor.strides = ctypes.addressof(strides)
        tensor.byte_offset = self.byte_offset
        if versioned:
            struct = DLManagedTensorVersioned()
            struct.version = DLPackVersion(*self.version)
            struct.flags = self.flags
            name = _NAME_V1
        else:
            struct = DLManagedTensor()
            name = _NAME_V0
        struct.dl_tensor = tensor
        struct.deleter = _DELETER_FN
        address = ctypes.addressof(struct)
        _LIVE[address] = _Export(self, struct, keep)
        return _new_capsule(address, name, _DESTRUCTOR_ADDR)


def _numpy_dltype(dt: np.dtype) -> Tuple[int, int, int]:
    kind = {"i": INT, "u": UINT, "f": FLOAT, "b": BOOL, "c": COMPLEX}[dt.kind]
    return (kind, dt.itemsize * 8, 1)


class FakeCAI:
    """An object exposing a given ``__cuda_array_interface__`` dict."""

    def __init__(self, **interface: Any) -> None:
        interface.setdefault("version", 3)
        self.__cuda_array_interface__ = interface


def cai(shape=(4,), typestr="<f4", data=(0x7F0000001000, False), **extra: Any) -> FakeCAI:
    """A fake CUDA array (the pointer is never dereferenced)."""
    return FakeCAI(shape=shape, typestr=typestr, data=data, **extra)
