"""Arrays that present themselves as CUDA device memory, backed by host memory.

* :class:`TorchLikeTensor` -- DLPack (``__dlpack__`` / ``__dlpack_device__``: kDLCUDA and a device
  id), ordered through the ``stream`` argument of ``__dlpack__`` as the array API says; its
  framework's current stream is :attr:`EmulatedFramework.current_stream` of ``rt.torch``.
* :class:`CupyLikeArray` -- ``__cuda_array_interface__`` v3 whose ``stream`` is the stream of its
  last write (a producer), else its framework's current stream (1 for the legacy default stream).

Both keep their data in a numpy array (:attr:`host`); :meth:`fill` queues the write as a kernel on
a stream, so a consumer that does not synchronise with the producer reads the old values.
"""

from __future__ import annotations

import ctypes
import threading
from typing import Any, Dict, List, Optional, Tuple

import numpy as np

from .._core import DLPACK_CAPSULE_DESTRUCTOR
from .._dtypes import BY_CODE, numpy_code
from ..devices import register_framework_stream
from ..memory import _np_dtype, _torch_dtype
from .runtime import EmulatedCudaRuntime, EmulatedFramework

__all__ = ["EmulatedFramework", "TorchLikeTensor", "CupyLikeArray", "KDL_CUDA"]

KDL_CUDA = 2


class _EmulatedArray:
    framework_attr = ""

    def __init__(self, rt: EmulatedCudaRuntime, data: Any, *, device: int = 0, dtype: Any = None) -> None:
        self.rt = rt
        self.host = np.ascontiguousarray(np.array(data, dtype=dtype))
        self.device = int(device)
        self.producer: Optional[int] = None  # the stream of the last queued write, until synchronised

    @property
    def framework(self) -> EmulatedFramework:
        return getattr(self.rt, self.framework_attr)

    @property
    def shape(self) -> Tuple[int, ...]:
        return self.host.shape

    @property
    def is_cuda(self) -> bool:
        return True

    def numpy(self) -> np.ndarray:
        """A copy of the data once everything queued on its producer stream has run (``.cpu()``)."""
        if self.producer is not None:
            self.rt.cudaStreamSynchronize(self.producer)
        return self.host.copy()

    def fill(self, value: Any, *, stream: Optional[int] = None, delay: float = 0.0) -> None:
        """Queue ``self[:] = value`` as a kernel on ``stream`` (default: the current stream), after ``delay`` s."""
        s = self.framework.current_stream(self.device) if stream is None else int(stream)
        gate = threading.Event()

        def kernel() -> None:
            if delay:
                gate.wait(delay)
            self.host[...] = value

        self.rt.launch(s, kernel)
        self.producer = s

    def _current(self) -> int:
        return self.framework.current_stream(self.device)

    def data_ptr(self) -> int:
        """The address of the data (torch's ``Tensor.data_ptr()``)."""
        return int(self.host.ctypes.data)

    @classmethod
    def over(cls, rt: EmulatedCudaRuntime, owner: Any, ptr: int, shape: Tuple[int, ...], dtype: Any, *,
             device: int = 0) -> Any:
        """An array over existing "device" memory at ``ptr`` (no copy), keeping ``owner`` alive. ``dtype`` is read
        as the framework this array stands for reads it (:func:`_host_dtype`)."""
        dt = _host_dtype(dtype, cls.framework_attr)
        nbytes = dt.itemsize * int(np.prod(shape, dtype=np.int64))
        raw = np.asarray(_Memory(owner, ptr, max(nbytes, 1)))[:nbytes]
        self = cls.__new__(cls)
        _EmulatedArray.__init__(self, rt, np.zeros(0, dt), device=device)
        self.host = raw.view(dt).reshape(shape)
        if isinstance(self, TorchLikeTensor):
            self.dlpack_calls = []
        return self


def _host_dtype(dtype: Any, framework: str) -> np.dtype:
    """The numpy dtype in which an emulated array of ``framework`` (``"torch"``, ``"cupy"``) keeps elements of
    ``dtype``: whatever the GPU path (:mod:`pycoll.memory`) takes, read as that framework reads it (torch's
    ``"float"`` is float32, numpy's float64), bfloat16 and the float8 types as ml_dtypes' types (as pycoll's numpy
    buffers have them). TypeError naming ``dtype`` for one that has no such type."""
    torch_size = None
    wanted = dtype
    if framework == "torch" or type(dtype).__module__ == "torch":
        try:
            import torch
        except ImportError:  # no torch to read the name: numpy reads it
            pass
        else:
            try:
                t = _torch_dtype(dtype)
            except (TypeError, ValueError):
                raise TypeError(f"dtype {dtype!r} is no torch dtype") from None
            wanted, torch_size = str(t)[len("torch."):], torch.empty((), dtype=t).element_size()
    try:
        dt = _np_dtype(wanted)  # as the host backend's: bfloat16 and the float8 names through ml_dtypes
    except ImportError:
        raise TypeError(f"dtype {dtype!r} has no numpy type for the emulated GPU to keep its data in (bfloat16 "
                        "and the float8 types need the ml_dtypes package, which is not installed)") from None
    except TypeError:  # no such type, or one holding Python objects
        raise TypeError(f"dtype {dtype!r} has no numpy or ml_dtypes type for the emulated GPU to keep its data "
                        "in") from None
    if framework == "cupy" and dt.type.__module__ != "numpy":  # ml_dtypes' bfloat16 and float8 types
        raise TypeError(f"dtype {dtype!r}: CuPy has no {dt} arrays (torch tensors do: like='torch')")
    if torch_size is not None and dt.itemsize != torch_size:
        raise TypeError(f"dtype {dtype!r} has no numpy or ml_dtypes type for the emulated GPU to keep its data in "
                        f"(numpy's {dt} has {dt.itemsize}-byte elements, torch's {torch_size})")
    return dt


class _Memory:
    """What an array over foreign memory keeps alive (its numpy ``base``)."""

    def __init__(self, owner: Any, ptr: int, nbytes: int) -> None:
        self.owner = owner
        self.__array_interface__ = {"data": (ptr, False), "shape": (nbytes,), "typestr": "|u1", "version": 3}


# --- DLPack ------------------------------------------------------------------------------------


class _DLDevice(ctypes.Structure):
    _fields_ = [("device_type", ctypes.c_int), ("device_id", ctypes.c_int32)]


class _DLDataType(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint8), ("bits", ctypes.c_uint8), ("lanes", ctypes.c_uint16)]


class _DLTensor(ctypes.Structure):
    _fields_ = [("data", ctypes.c_void_p), ("device", _DLDevice), ("ndim", ctypes.c_int32),
                ("dtype", _DLDataType), ("shape", ctypes.c_void_p), ("strides", ctypes.c_void_p),
                ("byte_offset", ctypes.c_uint64)]


_DELETER = ctypes.CFUNCTYPE(None, ctypes.c_void_p)


class _DLVersion(ctypes.Structure):
    _fields_ = [("major", ctypes.c_uint32), ("minor", ctypes.c_uint32)]


class _DLManagedVersioned(ctypes.Structure):
    _fields_ = [("version", _DLVersion), ("manager_ctx", ctypes.c_void_p), ("deleter", _DELETER),
                ("flags", ctypes.c_uint64), ("dl_tensor", _DLTensor)]


class _DLManaged(ctypes.Structure):
    _fields_ = [("dl_tensor", _DLTensor), ("manager_ctx", ctypes.c_void_p), ("deleter", _DELETER)]


_capsule_new = ctypes.PYFUNCTYPE(ctypes.py_object, ctypes.c_void_p, ctypes.c_char_p, ctypes.c_void_p)(
    ("PyCapsule_New", ctypes.pythonapi))
_LIVE: Dict[int, List[Any]] = {}  # managed struct address -> what it keeps alive
_LIVE_LOCK = threading.Lock()


def _delete(address: int) -> None:
    with _LIVE_LOCK:
        _LIVE.pop(address, None)


_DELETER_FN = _DELETER(_delete)


# in C: a capsule may die while an exception propagates, and Python code must not run then
_DESTRUCTOR_ADDR = DLPACK_CAPSULE_DESTRUCTOR
_DL_CODES = {"i": 0, "u": 1, "f": 2, "c": 5, "b": 6}  # numpy's builtin kinds -> DLDataTypeCode


def _dl_dtype(dt: np.dtype) -> _DLDataType:
    code = numpy_code(dt)  # NCCL's types first: ml_dtypes' float8_e5m2 has numpy's kind "f", DLPack's code is 12
    if code is not None:
        dl, bits = BY_CODE[code].dlpack
    elif dt.kind in _DL_CODES and dt.type.__module__ == "numpy":
        dl, bits = _DL_CODES[dt.kind], dt.itemsize * 8
    else:
        raise BufferError(f"__dlpack__: the emulated GPU has no DLPack type code for dtype {dt}")
    return _DLDataType(dl, bits, 1)


def _capsule(arr: np.ndarray, device: int, versioned: bool) -> Any:
    shape = (ctypes.c_int64 * max(arr.ndim, 1))(*arr.shape)
    managed: Any = _DLManagedVersioned() if versioned else _DLManaged()
    t = managed.dl_tensor
    t.data = arr.ctypes.data
    t.device = _DLDevice(KDL_CUDA, device)
    t.ndim = arr.ndim
    t.dtype = _dl_dtype(arr.dtype)
    t.shape = ctypes.addressof(shape)
    t.strides = None
    t.byte_offset = 0
    managed.deleter = _DELETER_FN
    if versioned:
        managed.version = _DLVersion(1, 0)
    address = ctypes.addressof(managed)
    with _LIVE_LOCK:
        _LIVE[address] = [managed, shape, arr]
    return _capsule_new(address, b"dltensor_versioned" if versioned else b"dltensor", _DESTRUCTOR_ADDR)


class TorchLikeTensor(_EmulatedArray):
    """A CUDA tensor in torch's style: DLPack export, its framework's current stream is ``rt.torch``'s.

    ``__dlpack__(stream=s)`` makes ``s`` wait for the tensor's pending write (its producer stream),
    as the array API asks of a producer (``-1``: no synchronisation; ``None``: the legacy stream).
    ``dlpack_calls`` records the ``stream`` arguments received.
    """

    framework_attr = "torch"

    def __init__(self, rt: EmulatedCudaRuntime, data: Any, *, device: int = 0, dtype: Any = None) -> None:
        super().__init__(rt, data, device=device, dtype=dtype)
        self.dlpack_calls: List[Any] = []

    def __dlpack_device__(self) -> Tuple[int, int]:
        return (KDL_CUDA, self.device)

    def __dlpack__(self, *, stream: Any = None, max_version: Any = None, dl_device: Any = None,
                   copy: Any = None) -> Any:
        self.dlpack_calls.append(stream)
        if stream == 0:
            raise BufferError("__dlpack__: stream 0 is ambiguous for CUDA (pass 1 for the legacy stream)")
        consumer = 1 if stream is None else int(stream)
        if consumer != -1 and self.producer is not None and self.producer != consumer:
            ev = self.rt.cudaEventCreateWithFlags(self.rt.cudaEventDisableTiming)[1]
            self.rt.cudaEventRecord(ev, self.producer)
            self.rt.cudaStreamWaitEvent(consumer, ev, 0)
            self.rt.cudaEventDestroy(ev)
        versioned = max_version is not None and tuple(max_version) >= (1, 0)
        return _capsule(self.host, self.device, versioned)


class CupyLikeArray(_EmulatedArray):
    """A CUDA array in CuPy's style: ``__cuda_array_interface__`` v3 with its ``stream``.

    The ``stream`` is that of its last queued write, else ``rt.cupy``'s current stream.
    """

    framework_attr = "cupy"

    @property
    def __cuda_array_interface__(self) -> Dict[str, Any]:
        stream = self.producer if self.producer is not None else self._current()
        return {
            "shape": self.host.shape,
            "typestr": self.host.dtype.str,
            "data": (self.host.ctypes.data, False),
            "version": 3,
            "strides": None,
            "stream": 1 if stream == 0 else stream,
        }


EmulatedCudaRuntime.array_types.update(torch=TorchLikeTensor, cupy=CupyLikeArray)
register_framework_stream(TorchLikeTensor, "emulated torch", lambda a: a.framework.current_stream(a.device))
register_framework_stream(CupyLikeArray, "emulated CuPy", lambda a: a.framework.current_stream(a.device))
