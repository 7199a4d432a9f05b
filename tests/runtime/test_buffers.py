"""pycoll.buffers: every acquisition path, every rejection, the helper checks."""

from __future__ import annotations

import array
import ctypes
import gc
import subprocess
import sys
import weakref

import ml_dtypes
import numpy as np
import pytest
import torch
from helpers.dlpack_fake import (
    BFLOAT,
    BOOL,
    COMPLEX,
    F8_E4M3FN,
    F8_E4M3FNUZ,
    F8_E5M2,
    FLOAT,
    INT,
    IS_COPIED,
    KDL_CPU,
    KDL_CUDA,
    KDL_CUDA_HOST,
    KDL_CUDA_MANAGED,
    KDL_ROCM,
    READ_ONLY,
    UINT,
    FakeDLPack,
    cai,
    live_exports,
)

from pycoll.buffers import (
    DATATYPE_ITEMSIZES,
    DATATYPE_NAMES,
    DeviceType,
    as_buffer,
    check_count,
    check_device,
    check_overlap,
    check_same_dtype,
)

GPU_PTR = 0x7F0000001000

# numpy dtype -> (ncclDataType_t, c10 name)
NUMPY_CASES = [
    (np.int8, 0, "Char"),
    (np.uint8, 1, "Byte"),
    (np.int32, 2, "Int"),
    (np.intc, 2, "Int"),
    (np.uint32, 3, "UInt32"),
    (np.int64, 4, "Long"),
    (np.longlong, 4, "Long"),
    (np.intp, 4, "Long"),
    (np.uint64, 5, "UInt64"),
    (np.ulonglong, 5, "UInt64"),
    (np.float16, 6, "Half"),
    (np.float32, 7, "Float"),
    (np.float64, 8, "Double"),
    (ml_dtypes.bfloat16, 9, "BFloat16"),
    (ml_dtypes.float8_e4m3fn, 10, "Float8_e4m3fn"),
    (ml_dtypes.float8_e5m2, 11, "Float8_e5m2"),
]

TORCH_CASES = [
    (torch.int8, 0),
    (torch.uint8, 1),
    (torch.int32, 2),
    (torch.uint32, 3),
    (torch.int64, 4),
    (torch.uint64, 5),
    (torch.float16, 6),
    (torch.float32, 7),
    (torch.float64, 8),
    (torch.bfloat16, 9),
    (torch.float8_e4m3fn, 10),
    (torch.float8_e5m2, 11),
]


def np_ptr(a: np.ndarray) -> int:
    return a.__array_interface__["data"][0]


# --- numpy -------------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype,nccl,c10", NUMPY_CASES, ids=lambda c: getattr(c, "__name__", str(c)))
def test_numpy_dtypes(dtype, nccl, c10):
    a = np.zeros((3, 5), dtype=dtype)
    b = as_buffer(a, writable=True, name="output")
    assert (b.datatype, b.dtype_name) == (nccl, c10)
    assert b.ptr == np_ptr(a)
    assert b.nbytes == a.nbytes and b.count == 15 and b.shape == (3, 5)
    assert b.itemsize == a.itemsize == DATATYPE_ITEMSIZES[nccl]
    assert (b.device_type, b.device_id, b.device) == (DeviceType.CPU, 0, "cpu")
    assert b.readonly is False and b.owner is a and b.source == "numpy" and b.name == "output"
    assert b.sync_stream is None


def test_numpy_views_offsets_and_odd_shapes():
    base = np.arange(100, dtype=np.float32)
    view = base[10:30]
    assert as_buffer(view).ptr == np_ptr(base) + 40
    row = base.reshape(10, 10)[3]
    assert as_buffer(row).ptr == np_ptr(base) + 120 and as_buffer(row).count == 10
    scalar = np.array(7.0)
    b = as_buffer(scalar)
    assert b.shape == () and b.count == 1 and b.nbytes == 8
    empty = np.zeros((0, 4), np.int32)
    assert as_buffer(empty).count == 0 and as_buffer(empty).nbytes == 0
    # size-1 dimensions may carry any stride; empty arrays any strides
    odd = np.lib.stride_tricks.as_strided(base, shape=(1, 10), strides=(999 * 4, 4))
    assert as_buffer(odd).count == 10
    empty_strided = np.lib.stride_tricks.as_strided(base, shape=(0, 3), strides=(4, 40))
    assert as_buffer(empty_strided).count == 0
    sub = np.zeros((2, 2), np.float32).view(type("Sub", (np.ndarray,), {}))
    assert as_buffer(sub).count == 4 and as_buffer(sub).source == "numpy"


def test_numpy_non_contiguous_rejected():
    a = np.zeros((4, 6), np.float32)
    with pytest.raises(ValueError, match=r"input: the array is not C-contiguous \(shape \(4, 3\), strides \(24, 8\)"):
        as_buffer(a[:, ::2], name="input")
    with pytest.raises(ValueError, match="not C-contiguous"):
        as_buffer(np.asfortranarray(a))
    with pytest.raises(ValueError, match="not C-contiguous"):
        as_buffer(a.T)


def test_numpy_read_only():
    a = np.ones(8, np.float64)
    a.setflags(write=False)
    b = as_buffer(a, name="input")
    assert b.readonly is True
    with pytest.raises(ValueError, match="output: the array is read-only but the operation writes into it"):
        as_buffer(a, writable=True, name="output")


def test_numpy_byte_order_rejected():
    with pytest.raises(ValueError, match="native byte order"):
        as_buffer(np.zeros(4, ">f4"), name="x")
    swapped = np.zeros(4, np.float32).view(np.float32().dtype.newbyteorder())
    with pytest.raises(ValueError, match=r"x: dtype '>f4' is not in native byte order"):
        as_buffer(swapped, name="x")
    # one-byte types have no byte order
    assert as_buffer(np.zeros(4, "|u1")).datatype == 1


@pytest.mark.parametrize(
    "dtype",
    [
        np.bool_,
        np.complex64,
        np.complex128,
        np.int16,
        np.uint16,
        np.longdouble,
        object,
        "datetime64[s]",
        "U3",
        "S3",
        [("a", np.int32), ("b", np.float32)],
        ml_dtypes.float8_e4m3fnuz,
        ml_dtypes.int4,
    ],
    ids=str,
)
def test_numpy_unsupported_dtypes(dtype):
    a = np.zeros(4, dtype=dtype)
    with pytest.raises(TypeError, match=r"input: dtype .* is not supported; supported: int8, uint8"):
        as_buffer(a, name="input")


def test_ml_dtypes_imported_after_pycoll():
    code = (
        "import numpy as np, pycoll.buffers as b, sys; assert 'ml_dtypes' not in sys.modules; "
        "import ml_dtypes; print(b.as_buffer(np.zeros(3, ml_dtypes.bfloat16)).dtype_name)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "BFloat16"


def test_buffer_keeps_numpy_alive():
    class Sub(np.ndarray):
        pass

    a = np.arange(16, dtype=np.float32).view(Sub)
    ref = weakref.ref(a)
    b = as_buffer(a)
    del a
    gc.collect()
    assert ref() is not None
    del b
    gc.collect()
    assert ref() is None


# --- torch -------------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype,nccl", TORCH_CASES, ids=str)
def test_torch_dtypes(dtype, nccl):
    t = torch.zeros((2, 3), dtype=dtype)
    b = as_buffer(t, writable=True, name="output")
    assert b.datatype == nccl
    # c10::toString name, read from torch itself: "torch.BFloat16Tensor" -> "BFloat16"
    assert b.dtype_name == t.type()[len("torch.") : -len("Tensor")]
    assert b.ptr == t.data_ptr() and b.count == 6 and b.nbytes == 6 * t.element_size()
    assert tuple(b.shape) == (2, 3) and b.owner is t and b.source == "torch"
    assert (b.device_type, b.device_id) == (DeviceType.CPU, 0) and not b.readonly


def test_numpy_and_torch_names_agree():
    for _np_dtype, nccl, c10 in NUMPY_CASES:
        assert DATATYPE_NAMES[nccl] == c10
    for dtype, nccl in TORCH_CASES:
        assert DATATYPE_NAMES[nccl] == torch.zeros(1, dtype=dtype).type()[6:-6]


def test_torch_views_and_layouts():
    base = torch.arange(60, dtype=torch.float32).reshape(6, 10)
    row = base[2]
    assert as_buffer(row).ptr == base.data_ptr() + 80
    assert as_buffer(base[2:4]).count == 20
    odd = torch.as_strided(base, (1, 10), (777, 1))
    assert as_buffer(odd).count == 10
    assert as_buffer(torch.zeros(0, 5)).count == 0
    assert as_buffer(torch.tensor(3.0)).shape == ()
    param = torch.nn.Parameter(torch.zeros(4))
    assert as_buffer(param).ptr == param.data_ptr()
    with pytest.raises(ValueError, match=r"t: the array is not C-contiguous .*\.contiguous\(\)"):
        as_buffer(base.T, name="t")
    with pytest.raises(ValueError, match="not C-contiguous"):
        as_buffer(base[:, ::2])


@pytest.mark.parametrize(
    "dtype", [torch.bool, torch.complex64, torch.int16, torch.uint16, torch.float8_e4m3fnuz], ids=str
)
def test_torch_unsupported_dtypes(dtype):
    with pytest.raises(TypeError, match=r"grad: dtype torch\.\w+ is not supported"):
        as_buffer(torch.zeros(3, dtype=dtype), name="grad")


def test_torch_other_rejections():
    with pytest.raises(TypeError, match="layout torch.sparse_coo"):
        as_buffer(torch.zeros(4, 4).to_sparse())
    with pytest.raises(ValueError, match="device meta"):
        as_buffer(torch.empty(4, device="meta"))
    neg = torch._neg_view(torch.ones(4))
    with pytest.raises(ValueError, match="negative bit"):
        as_buffer(neg)
    with pytest.raises(TypeError, match="a nested tensor cannot be used"):
        as_buffer(_nested())


def _nested():
    import warnings

    with warnings.catch_warnings():  # torch warns that nested tensors are a prototype
        warnings.simplefilter("ignore")
        return torch.nested.nested_tensor([torch.zeros(2), torch.zeros(3)])


@pytest.mark.parametrize("view", [True, False], ids=["dlpack-view", "attributes"])
def test_the_compiled_path_describes_torch_and_numpy_as_as_buffer_does(view):
    """A Communicator describes its arrays in compiled code (pycoll._core), with fast paths for numpy arrays
    and CPU torch tensors (through torch's DLPack C exchange API, or through the tensor's attributes): the same
    Buffer fields as as_buffer, and the same errors for what they do not take."""
    import pycoll
    from pycoll import _core

    if tuple(int(x) for x in torch.__version__.split(".")[:2]) >= (2, 13):  # torch 2.13 has the API (DLPack 1.3)
        assert _core.torch_dlpack_view()
    if view and not _core.torch_dlpack_view():
        pytest.skip("this torch has no DLPack C exchange API (torch 2.10 and later)")
    comm = pycoll.init(0, 1, backend="host", unique_id=pycoll.get_unique_id(backend="host"))
    before = _core.torch_dlpack_view(view)
    try:
        base = torch.arange(60, dtype=torch.float32).reshape(6, 10)
        arrays = [torch.zeros((2, 3), dtype=d) for d, _ in TORCH_CASES] + [
            base[2], base[2:4], base[2:3, 4:5], torch.as_strided(base, (1, 10), (777, 1)), torch.zeros(0, 5),
            torch.tensor(3.0), torch.zeros(4, requires_grad=True), torch.nn.Parameter(torch.zeros(4)),
            torch.nn.Parameter(torch.zeros(3, dtype=torch.bfloat16), requires_grad=False),
            torch.ones(3).expand(1, 3), np.arange(6, dtype=np.float64).reshape(2, 3), np.zeros(0, np.int8)]
        for x in arrays:
            for _ in range(2):  # the first call may take the general path (it learns the tensor type)
                got = _core.buf(comm, x, 0, writable=True, name="t")
            want = as_buffer(x, writable=True, stream=0, name="t")
            assert tuple(got) == tuple(want), (x, got, want)
        bad = [(base.T, ValueError, "not C-contiguous"), (torch.zeros(3, dtype=torch.bool), TypeError, "not supported"),
               (torch._neg_view(torch.ones(4)), ValueError, "negative bit"),
               (torch.zeros(4, 4).to_sparse(), TypeError, "layout"), (_nested(), TypeError, "nested tensor"),
               (torch.empty(4, device="meta"), ValueError, "device meta"),
               (torch._neg_view(torch.ones(1)), ValueError, "negative bit"),  # one element: contiguous
               (torch.ones(3).expand(2, 3), ValueError, "not C-contiguous"),  # a stride of 0
               (torch.zeros(2, dtype=torch.uint16), TypeError, "not supported"),
               (torch.zeros(2, dtype=torch.complex64), TypeError, "not supported"),
               (torch.nn.Parameter(base.T), ValueError, "not C-contiguous"),
               (torch.nn.Parameter(torch._neg_view(torch.ones(2))), ValueError, "negative bit")]
        for x, exc, text in bad:
            with pytest.raises(exc, match=text):
                _core.buf(comm, x, 0, writable=True, name="t")
            with pytest.raises(exc, match=text):
                comm.all_reduce(x)
        assert comm.state == "active"
    finally:
        _core.torch_dlpack_view(before)
        comm.destroy()


# --- DLPack ------------------------------------------------------------------------------------


def test_dlpack_v1_cpu_from_numpy_memory():
    a = np.arange(12, dtype=np.float32)
    f = FakeDLPack(a, (3, 4))
    b = as_buffer(f, writable=True, name="out")
    assert f.calls == [{"stream": None, "max_version": (1, 0), "copy": False}]
    assert b.ptr == np_ptr(a) and b.shape == (3, 4) and b.count == 12 and b.nbytes == 48
    assert (b.datatype, b.device_type, b.source, b.readonly) == (7, KDL_CPU, "dlpack", False)


def test_dlpack_legacy_producer_fallback():
    f = FakeDLPack(GPU_PTR, (2, 3), dtype=(BFLOAT, 16, 1), device=(KDL_CUDA, 3), versioned="v0")
    b = as_buffer(f, stream=0xABC0)
    # first the versioned call (refused with TypeError), then the legacy one
    assert f.calls == [{"stream": 0xABC0}]
    assert (b.ptr, b.datatype, b.dtype_name, b.device_type, b.device_id) == (GPU_PTR, 9, "BFloat16", 2, 3)
    assert b.device == "cuda:3"


@pytest.mark.parametrize(
    "device,stream,expected",
    [
        ((KDL_CUDA, 0), None, -1),  # no stream named: no synchronization
        ((KDL_CUDA, 0), 0, 1),  # legacy default stream is spelled 1 for CUDA
        ((KDL_CUDA, 0), 0x5555, 0x5555),
        ((KDL_CUDA_MANAGED, 0), 0x77, 0x77),
        ((KDL_ROCM, 1), 0, 0),  # ROCm's default stream is 0
        ((KDL_ROCM, 1), None, -1),
        ((KDL_CPU, 0), 0x5555, None),  # CPU producers must get None
        ((KDL_CUDA_HOST, 0), 0x5555, None),
    ],
)
def test_dlpack_stream_argument(device, stream, expected):
    f = FakeDLPack(GPU_PTR, (4,), device=device)
    b = as_buffer(f, stream=stream)
    assert f.calls[0]["stream"] == expected
    assert b.device_type == device[0] and b.device_id == device[1]


def test_dlpack_strides_and_offsets():
    a = np.arange(24, dtype=np.int64)
    ok = FakeDLPack(a, (2, 3, 4), strides=(12, 4, 1), byte_offset=0)
    assert as_buffer(ok).count == 24
    offset = FakeDLPack(a, (2, 4), strides=(4, 1), byte_offset=64)
    assert as_buffer(offset).ptr == np_ptr(a) + 64
    size_one = FakeDLPack(a, (1, 4, 1), strides=(1000, 1, 5))
    assert as_buffer(size_one).count == 4
    empty = FakeDLPack(a, (0, 4), strides=(1, 100))
    assert as_buffer(empty).count == 0 and as_buffer(empty).nbytes == 0
    transposed = FakeDLPack(a, (4, 6), strides=(1, 4))
    with pytest.raises(
        ValueError, match=r"x: the array is not C-contiguous \(shape \(4, 6\), strides \(1, 4\) in elements\)"
    ):
        as_buffer(transposed, name="x")
    gapped = FakeDLPack(a, (3, 4), strides=(8, 1))
    with pytest.raises(ValueError, match="not C-contiguous"):
        as_buffer(gapped)
    scalar = FakeDLPack(a, ())
    assert as_buffer(scalar).count == 1 and as_buffer(scalar).shape == ()


def test_dlpack_read_only_flag():
    f = FakeDLPack(GPU_PTR, (8,), device=(KDL_CUDA, 0), flags=READ_ONLY)
    assert as_buffer(f, name="input").readonly is True
    with pytest.raises(ValueError, match="output: the array is read-only"):
        as_buffer(f, writable=True, name="output")
    copied = FakeDLPack(GPU_PTR, (8,), device=(KDL_CUDA, 0), flags=IS_COPIED)
    assert as_buffer(copied).readonly is False
    with pytest.raises(ValueError, match="IS_COPIED"):
        as_buffer(copied, writable=True, name="output")
    # legacy capsules have no flags: writable
    assert as_buffer(FakeDLPack(GPU_PTR, (8,), versioned="v0"), writable=True).readonly is False


def test_dlpack_deleter_runs_exactly_once_when_buffer_dies():
    gc.collect()  # exports an earlier test's exceptions still held
    before = live_exports()
    for versioned in ("v1", "v0"):
        f = FakeDLPack(GPU_PTR, (8,), device=(KDL_CUDA, 0), versioned=versioned)
        b = as_buffer(f)
        c = b  # a second reference to the same Buffer
        gc.collect()
        assert f.deleted == 0, "the capsule was released while the Buffer is alive"
        del b
        gc.collect()
        assert f.deleted == 0
        del c
        gc.collect()
        assert f.deleted == 1
    assert live_exports() == before
    assert FakeDLPack.stray_deletes == 0


@pytest.mark.parametrize(
    "kwargs,exc,message",
    [
        (dict(dtype=(BOOL, 8, 1)), TypeError, "DLPack dtype bool8 is not supported"),
        (dict(dtype=(COMPLEX, 64, 1)), TypeError, "DLPack dtype complex64 is not supported"),
        (dict(dtype=(FLOAT, 32, 4)), TypeError, "float32 x4 lanes is not supported"),
        (dict(dtype=(INT, 16, 1)), TypeError, "int16 is not supported"),
        (dict(dtype=(F8_E4M3FNUZ, 8, 1)), TypeError, "float8_e4m3fnuz8 is not supported"),
        (dict(strides=(1, 2)), ValueError, "not C-contiguous"),
        (dict(version=(2, 0), versioned="v1"), ValueError, "ABI version 2.0; pycoll reads version 1"),
        (dict(ndim=-1), ValueError, "invalid ndim -1"),
        (dict(shape=(2, -3)), ValueError, "negative dimension"),
    ],
)
def test_dlpack_rejections_still_delete_once(kwargs, exc, message):
    shape = kwargs.pop("shape", (2, 3))
    f = FakeDLPack(GPU_PTR, shape, device=(KDL_CUDA, 0), **kwargs)
    with pytest.raises(exc, match=message):
        as_buffer(f, name="arg")
    gc.collect()
    assert f.deleted == 1


def test_dlpack_fp8_and_bfloat_codes():
    for code, nccl in ((F8_E4M3FN, 10), (F8_E5M2, 11)):
        assert as_buffer(FakeDLPack(GPU_PTR, (4,), dtype=(code, 8, 1), device=(KDL_CUDA, 0))).datatype == nccl
    assert as_buffer(FakeDLPack(GPU_PTR, (4,), dtype=(BFLOAT, 16, 1))).datatype == 9
    assert as_buffer(FakeDLPack(GPU_PTR, (4,), dtype=(UINT, 64, 1))).datatype == 5


def test_dlpack_bad_producers():
    with pytest.raises(TypeError, match="did not return an unconsumed DLPack capsule"):
        as_buffer(FakeDLPack(GPU_PTR, (4,), capsule="nope"))
    with pytest.raises(ValueError, match="refused to export it: cannot export"):
        as_buffer(FakeDLPack(GPU_PTR, (4,), raise_on_export=BufferError("cannot export")))
    with pytest.raises(TypeError, match=r"arg: FakeDLPack.__dlpack__ failed: no stream for you"):
        as_buffer(FakeDLPack(GPU_PTR, (4,), raise_on_export=TypeError("no stream for you")), name="arg")


class _Wrap:
    """Exposes only the DLPack protocol of a real producer (numpy or torch)."""

    def __init__(self, inner):
        self.inner = inner

    def __dlpack__(self, **kwargs):
        return self.inner.__dlpack__(**kwargs)

    def __dlpack_device__(self):
        return self.inner.__dlpack_device__()


def test_dlpack_real_producers():
    a = np.arange(10, dtype=np.float64)[2:]
    b = as_buffer(_Wrap(a), writable=True)
    assert b.ptr == np_ptr(a) and b.count == 8 and b.datatype == 8
    ro = np.arange(4, dtype=np.int32)
    ro.setflags(write=False)
    assert as_buffer(_Wrap(ro)).readonly is True
    with pytest.raises(ValueError, match="read-only"):
        as_buffer(_Wrap(ro), writable=True)
    t = torch.arange(20, dtype=torch.bfloat16).reshape(4, 5)[1:3]
    bt = as_buffer(_Wrap(t))
    assert (bt.ptr, bt.count, bt.datatype, bt.shape) == (t.data_ptr(), 10, 9, (2, 5))
    with pytest.raises(ValueError, match="not C-contiguous"):
        as_buffer(_Wrap(torch.zeros(4, 4).T))


class _JaxLike(_Wrap):
    """A jax.Array as pycoll sees it: a legacy capsule (no read-only flag) of memory jax treats as immutable."""

    __module__ = "jaxlib._jax"

    def __dlpack__(self, **kwargs):
        kwargs.pop("max_version", None)
        kwargs.pop("copy", None)
        return self.inner.__dlpack__(**kwargs)


class _Odd:
    """A producer whose __dlpack_device__ gives ``device`` (or raises it) and whose __dlpack__ raises ``export``
    (else exports ``array`` as a DLPack 1.0 producer without the ``copy`` keyword); counts the export calls."""

    def __init__(self, device=(1, 0), export=None, array=None):
        self.device, self.export, self.array, self.calls = device, export, array, 0

    def __dlpack__(self, stream=None, max_version=None):
        self.calls += 1
        if self.export is not None:
            raise self.export
        return self.array.__dlpack__(stream=stream, max_version=max_version)

    def __dlpack_device__(self):
        if isinstance(self.device, Exception):
            raise self.device
        return self.device


def test_odd_producers_and_objects_are_refused_naming_the_argument():
    """A jax.Array as an output (immutable: written in place its readers saw a mix), a deleted (donated) jax array,
    a broken __dlpack_device__, a masked array (its mask was ignored), released memory, a numpy scalar as an output:
    each a ValueError naming the argument; an input that is a jax.Array works."""
    a = np.arange(4, dtype=np.float32)
    assert as_buffer(_JaxLike(a)).ptr == np_ptr(a)
    with pytest.raises(ValueError, match=r"^arg: a jax.Array is immutable.*np.empty\(x.shape, x.dtype\)"):
        as_buffer(_JaxLike(a), writable=True, name="arg")
    deleted = _Odd(device=TypeError("object of type 'NoneType' has no len()"),
                   export=RuntimeError("Array has been deleted with shape=float32[4]."))
    cases = [(deleted, "_Odd.__dlpack__ refused to export it: Array has been deleted"),
             (_Odd(device="cpu", array=a), r"_Odd.__dlpack_device__\(\) failed: ValueError"),
             (_Odd(export=KeyError("k"), array=a), "_Odd.__dlpack__ refused to export it: 'k'"),
             (np.ma.array([1.0, 1e30], mask=[False, True]), "masked arrays are not supported"),
             (np.float32(2.0), "a numpy scalar .float32. cannot receive a result")]
    released = memoryview(bytearray(8))
    released.release()
    cases.append((released, "memoryview cannot be read: operation forbidden on released memoryview"))
    for x, message in cases:
        with pytest.raises(ValueError, match="^arg: " + message):
            as_buffer(x, writable=True, name="arg")
    ro = np.arange(2.0)
    ro.setflags(write=False)
    no_copy = _Odd(array=ro)  # a DLPack 1.0 producer without ``copy``: still asked for a versioned capsule
    assert as_buffer(no_copy).readonly and no_copy.calls == 1  # (asked with ``copy``: a TypeError before it ran)


def _compiled_and_general(comm, x, writable):
    """What the Communicator's compiled path (pycoll._core) and as_buffer (with the host backend's device check) give
    for ``x``: a Buffer or the exception, each."""
    out = []
    for describe in (lambda: _core_buf(comm, x, writable),
                     lambda: check_device(b := as_buffer(x, writable=writable, stream=0, name="t"), "host") or b):
        try:
            out.append(describe())
        except Exception as exc:  # compared by the caller
            out.append(exc)
    return out


def _dlpack_and_buffer_cases():
    a = np.arange(24, dtype=np.int64)
    f32 = np.arange(12, dtype=np.float32)
    ro = np.arange(4, dtype=np.int32)
    ro.setflags(write=False)
    good = [FakeDLPack(f32, (3, 4)), FakeDLPack(f32, (3, 4), versioned="v0"), FakeDLPack(f32, (12,)),
            FakeDLPack(a, (2, 3, 4), strides=(12, 4, 1)), FakeDLPack(a, (2, 4), strides=(4, 1), byte_offset=64),
            FakeDLPack(a, (1, 4, 1), strides=(1000, 1, 5)), FakeDLPack(a, (0, 4), strides=(1, 100)), FakeDLPack(a, ()),
            FakeDLPack(a, (8,), flags=READ_ONLY), FakeDLPack(a, (8,), flags=IS_COPIED),
            FakeDLPack(a, (8,), device=(KDL_CUDA_HOST, 3)), FakeDLPack(a, (2,), device=(11, 1)),
            FakeDLPack(a, (4,), dtype=(BFLOAT, 16, 1)),
            FakeDLPack(a, (4,), dtype=(F8_E4M3FN, 8, 1)), FakeDLPack(a, (4,), dtype=(F8_E5M2, 8, 1)),
            FakeDLPack(a, (4,), dtype=(UINT, 64, 1)), FakeDLPack(a, (4,), dtype=(INT, 8, 1)),
            _Wrap(np.arange(10, dtype=np.float64)[2:]), _Wrap(ro), _Wrap(torch.arange(20.0).reshape(4, 5)[1:3]),
            bytearray(range(16)), bytearray(), b"abcd", memoryview(bytearray(48)).cast("f", (3, 4)),
            memoryview(np.zeros(3, np.float16)), memoryview(np.zeros(2, "<f4")), (ctypes.c_double * 5)(),
            memoryview(bytearray(8)).cast("B")] + [array.array(c, [1, 2, 3, 4]) for c in "bBiIlLqQfd"]
    released = memoryview(bytearray(8))
    released.release()
    bad = [FakeDLPack(a, (4, 6), strides=(1, 4)), FakeDLPack(a, (3, 4), strides=(8, 1)),
           FakeDLPack(a, (2, 3), dtype=(BOOL, 8, 1)), FakeDLPack(a, (2, 3), dtype=(COMPLEX, 64, 1)),
           FakeDLPack(a, (2, 3), dtype=(FLOAT, 32, 4)), FakeDLPack(a, (2, 3), dtype=(INT, 16, 1)),
           FakeDLPack(a, (2, 3), version=(2, 0), versioned="v1"), FakeDLPack(a, (2, 3), ndim=-1),
           FakeDLPack(a, (2, -3)), FakeDLPack(GPU_PTR, (4,), device=(KDL_CUDA, 0)),
           FakeDLPack(GPU_PTR, (4,), capsule="nope"), FakeDLPack(GPU_PTR, (4,), raise_on_export=BufferError("no")),
           FakeDLPack(GPU_PTR, (4,), raise_on_export=TypeError("no stream for you")),
           _Wrap(torch.zeros(4, 4).T), memoryview(bytearray(48))[::2], memoryview(bytearray(8)).cast("?"),
           (ctypes.c_int16 * 4)(), memoryview(np.zeros(2, ">f4")), array.array("h", [1, 2]), [1, 2], "text", None,
           _JaxLike(np.zeros(2)), _Odd(device="cpu"), _Odd(device=TypeError("len"), export=RuntimeError("deleted")),
           _Odd(export=KeyError("k")), np.ma.array([1.0, 2.0], mask=[0, 1]), np.float32(1.0), released]
    return good, bad


def test_the_compiled_path_describes_dlpack_and_buffer_objects_as_as_buffer_does(monkeypatch):
    """The Communicator reads DLPack capsules and buffer-protocol objects in compiled code: the same fields as
    as_buffer (the owner: the capsule, or a memoryview holding the export where as_buffer has a numpy view of it),
    the same errors for what it does not take, each DLPack export deleted once."""
    import pycoll
    from pycoll import buffers

    general = []  # what the compiled path left to the general one

    def counted(name, fn):
        return lambda *args: general.append(name) or fn(*args)

    for name in ("_call_dlpack", "_capsule_buffer", "_from_buffer_protocol"):
        monkeypatch.setattr(buffers, name, counted(name, getattr(buffers, name)))
    comm = pycoll.init(0, 1, backend="host", unique_id=pycoll.get_unique_id(backend="host"))
    before = live_exports()
    try:
        good, bad = _dlpack_and_buffer_cases()
        for x in good:
            for writable in (False, True):
                del general[:]
                try:
                    _core_buf(comm, x, writable)
                    # all in C; a producer older than DLPack 1.0 refuses max_version: the general path calls it
                    assert general == (["_call_dlpack"] if getattr(x, "versioned", "") == "v0" else []), (x, general)
                except ValueError:  # read-only memory as an output: the general path says so
                    assert writable
                got, want = _compiled_and_general(comm, x, writable)
                if isinstance(want, Exception):  # read-only memory as an output
                    assert type(got) is type(want) and str(got) == str(want), (x, writable, got, want)
                    continue
                assert tuple(got)[:9] + tuple(got)[10:] == tuple(want)[:9] + tuple(want)[10:], (x, got, want)
                assert got.source == "dlpack" or isinstance(got.owner, memoryview), got
        for x in bad:
            got, want = _compiled_and_general(comm, x, True)
            assert isinstance(want, Exception), (x, want)
            assert type(got) is type(want) and str(got) == str(want), (x, got, want)
        ba = bytearray(8)
        b = _core_buf(comm, ba)
        with pytest.raises(BufferError):
            ba.append(1)  # the Buffer pins the memory: no reallocation while it lives
        del b
        gc.collect()
        ba.append(1)
        del good, bad, x, got, want
        gc.collect()
        assert live_exports() == before and FakeDLPack.stray_deletes == 0
        assert comm.state == "active"
    finally:
        comm.destroy()


def _core_buf(comm, x, writable=True):
    from pycoll import _core

    return _core.buf(comm, x, 0, writable=writable, name="t")


def test_the_compiled_dlpack_path_deletes_each_export_once():
    import pycoll

    comm = pycoll.init(0, 1, backend="host", unique_id=pycoll.get_unique_id(backend="host"))
    try:
        a = np.arange(8, dtype=np.float32)
        for versioned in ("v1", "v0"):
            f = FakeDLPack(a, (8,), versioned=versioned)
            b = _core_buf(comm, f)
            gc.collect()
            assert f.deleted == 0, "the capsule was released while the Buffer is alive"
            comm.all_reduce(f)  # a Buffer of its own, released with its Work
            del b
            gc.collect()
            assert f.deleted == 2 and len(f.calls) == 2
        refused = FakeDLPack(a, (2, 3), dtype=(BOOL, 8, 1))
        with pytest.raises(TypeError, match="bool8 is not supported"):
            _core_buf(comm, refused)
        gc.collect()
        assert refused.deleted == 1 and len(refused.calls) == 1  # read once, from the one capsule
    finally:
        comm.destroy()


# --- __cuda_array_interface__ ------------------------------------------------------------------


def test_cai_basic():
    obj = cai(shape=(2, 8), typestr="<f2")
    b = as_buffer(obj, writable=True, name="x")
    assert (b.ptr, b.count, b.nbytes, b.datatype, b.shape) == (GPU_PTR, 16, 32, 6, (2, 8))
    assert (b.device_type, b.device_id, b.device, b.source) == (KDL_CUDA, -1, "cuda:?", "cai")
    assert b.owner is obj and b.sync_stream is None


@pytest.mark.parametrize(
    "typestr,nccl",
    [("|i1", 0), ("|u1", 1), ("<i4", 2), ("<u4", 3), ("<i8", 4), ("=u8", 5), ("<f2", 6), ("<f4", 7), ("<f8", 8)],
)
def test_cai_typestr(typestr, nccl):
    assert as_buffer(cai(typestr=typestr)).datatype == nccl


@pytest.mark.parametrize(
    "typestr,exc,message",
    [
        (">f4", ValueError, "not in native byte order"),
        ("|b1", TypeError, "typestr '|b1' is not supported"),
        ("<c8", TypeError, "not supported"),
        ("<i2", TypeError, "not supported"),
        ("<V2", TypeError, "not supported"),
        ("f4", ValueError, "invalid typestr"),
        ("<fx", ValueError, "invalid typestr"),
    ],
)
def test_cai_bad_typestr(typestr, exc, message):
    with pytest.raises(exc, match=message):
        as_buffer(cai(typestr=typestr))


def test_cai_strides_mask_readonly():
    assert as_buffer(cai(shape=(3, 4), strides=(16, 4))).count == 12
    assert as_buffer(cai(shape=(3, 4), strides=None)).count == 12
    assert as_buffer(cai(shape=(1, 4), strides=(4000, 4))).count == 4
    assert as_buffer(cai(shape=(0, 4), strides=(4, 400))).count == 0
    with pytest.raises(ValueError, match=r"not C-contiguous \(shape \(3, 4\), strides \(4, 12\) in bytes\)"):
        as_buffer(cai(shape=(3, 4), strides=(4, 12)))
    with pytest.raises(ValueError, match="do not match shape"):
        as_buffer(cai(shape=(3, 4), strides=(16,)))
    with pytest.raises(ValueError, match="masked arrays"):
        as_buffer(cai(mask=cai(typestr="|b1")))
    ro = cai(data=(GPU_PTR, True))
    assert as_buffer(ro).readonly is True
    with pytest.raises(ValueError, match="out: the array is read-only"):
        as_buffer(ro, writable=True, name="out")
    with pytest.raises(ValueError, match="malformed __cuda_array_interface__"):
        as_buffer(cai(data=None))
    with pytest.raises(TypeError, match="not a dict"):

        class Bad:
            __cuda_array_interface__ = [1, 2]  # noqa: RUF012 -- deliberately not a dict

        as_buffer(Bad())


@pytest.mark.parametrize(
    "producer,consumer,expected",
    [
        (None, 0x10, None),  # producer says nothing to wait for
        (0x20, 0x20, None),  # same stream: already ordered
        (0x20, 0x10, 0x20),  # other stream: the consumer must wait on it
        (1, 0, None),  # legacy default stream on both sides
        (2, 0x10, 2),  # per-thread default stream
        (0x20, None, 0x20),  # consumer unknown: report it
    ],
)
def test_cai_stream(producer, consumer, expected):
    b = as_buffer(cai(stream=producer), stream=consumer)
    assert b.sync_stream == expected


def test_cai_stream_zero_rejected():
    with pytest.raises(ValueError, match="stream 0 is ambiguous"):
        as_buffer(cai(stream=0))


# --- buffer protocol ---------------------------------------------------------------------------


def test_bytearray_and_bytes():
    ba = bytearray(range(16))
    b = as_buffer(ba, writable=True, name="out")
    assert b.ptr == ctypes.addressof(ctypes.c_char.from_buffer(ba))
    assert (b.count, b.nbytes, b.datatype, b.shape, b.source, b.readonly) == (16, 16, 1, (16,), "buffer", False)
    with pytest.raises(BufferError):
        ba.append(1)  # the Buffer pins the memory: no reallocation while it lives
    del b
    gc.collect()
    ba.append(1)
    ro = as_buffer(b"abcd")
    assert ro.readonly is True and ro.count == 4
    with pytest.raises(ValueError, match="out: the array is read-only"):
        as_buffer(b"abcd", writable=True, name="out")
    assert as_buffer(bytearray()).count == 0


@pytest.mark.parametrize(
    "code,nccl", [("b", 0), ("B", 1), ("i", 2), ("I", 3), ("l", 4), ("L", 5), ("q", 4), ("Q", 5), ("f", 7), ("d", 8)]
)
def test_array_array(code, nccl):
    arr = array.array(code, [1, 2, 3, 4])
    b = as_buffer(arr, writable=True)
    assert b.datatype == nccl and b.count == 4 and b.nbytes == 4 * arr.itemsize
    assert b.ptr == arr.buffer_info()[0]


@pytest.mark.parametrize("code", ["h", "H", "u"])
def test_array_array_unsupported(code):
    arr = array.array(code, "ab" if code == "u" else [1, 2])
    with pytest.raises(TypeError, match="buffer format '[hHuw]' is not supported"):
        as_buffer(arr)


def test_memoryview_shapes_and_formats():
    raw = bytearray(48)
    mv = memoryview(raw).cast("f", (3, 4))
    b = as_buffer(mv)
    assert (b.shape, b.count, b.datatype) == ((3, 4), 12, 7)
    assert b.ptr == ctypes.addressof(ctypes.c_char.from_buffer(raw))
    with pytest.raises(ValueError, match="not C-contiguous"):
        as_buffer(memoryview(raw)[::2])
    assert as_buffer(memoryview(np.zeros(3, np.float16))).datatype == 6
    with pytest.raises(TypeError, match="'\\?' is not supported"):
        as_buffer(memoryview(raw).cast("?"))
    carr = (ctypes.c_double * 5)()
    assert as_buffer(carr).datatype == 8 and as_buffer(carr).ptr == ctypes.addressof(carr)
    with pytest.raises(TypeError, match="not supported"):
        as_buffer((ctypes.c_int16 * 4)())


def test_buffer_format_byte_order():
    big = memoryview(bytearray(8)).cast("B")
    # struct formats with an explicit order: build them through numpy's buffer export
    be = np.zeros(2, ">f4")
    with pytest.raises(ValueError, match="not in native byte order"):
        as_buffer(memoryview(be))
    assert as_buffer(memoryview(np.zeros(2, "<f4"))).datatype == 7
    assert as_buffer(big).datatype == 1


@pytest.mark.parametrize("obj", [[1, 2, 3], 3.0, "text", None, {"a": 1}])
def test_unsupported_objects(obj):
    with pytest.raises(TypeError, match=f"input: cannot use an object of type {type(obj).__qualname__}"):
        as_buffer(obj, name="input")


# --- Buffer itself and the helper checks -------------------------------------------------------


def test_buffer_passthrough_and_identity():
    a = np.zeros(4, np.float32)
    b = as_buffer(a)
    assert as_buffer(b) is b
    assert b != as_buffer(a)  # compares by identity, never element-wise
    assert len({b, as_buffer(a)}) == 2
    ro = as_buffer(b"xy", name="in")
    with pytest.raises(ValueError, match="in: the array is read-only"):
        as_buffer(ro, writable=True)
    assert "Float[4] on cpu" in repr(b) and "from numpy" in repr(b)
    with pytest.raises(AttributeError):
        b.ptr = 0


def test_check_device():
    host = as_buffer(np.zeros(2, np.float32), name="x")
    cuda = as_buffer(FakeDLPack(GPU_PTR, (2,), device=(KDL_CUDA, 1)), name="y")
    managed = as_buffer(FakeDLPack(GPU_PTR, (2,), device=(KDL_CUDA_MANAGED, 1)), name="m")
    pinned = as_buffer(FakeDLPack(GPU_PTR, (2,), device=(KDL_CUDA_HOST, 0)), name="p")
    rocm = as_buffer(FakeDLPack(GPU_PTR, (2,), device=(KDL_ROCM, 0)), name="z")
    gpu_cai = as_buffer(cai(), name="c")
    check_device(host, "host")
    check_device(pinned, "host")
    check_device(cuda, "nccl", 1)
    check_device(managed, "nccl")
    check_device(rocm, "rccl", 0)
    check_device(gpu_cai, "nccl", 5)  # unknown device id: not checked
    check_device(gpu_cai, "rccl")
    with pytest.raises(ValueError, match="y: the array is on cuda:1, but the host backend needs CPU memory"):
        check_device(cuda, "host")
    with pytest.raises(ValueError, match="m: the array is on cuda_managed:1, but the host backend"):
        check_device(managed, "host")
    with pytest.raises(ValueError, match="x: the array is on cpu, but the nccl backend needs CUDA device memory"):
        check_device(host, "nccl")
    with pytest.raises(ValueError, match="z: the array is on rocm:0, but the nccl backend"):
        check_device(rocm, "nccl")
    with pytest.raises(ValueError, match="y: the array is on cuda:1, but the rccl backend needs ROCm"):
        check_device(cuda, "rccl")
    with pytest.raises(ValueError, match="y: the array is on cuda:1, but the communicator uses device 0"):
        check_device(cuda, "nccl", 0)
    with pytest.raises(ValueError, match="unknown backend 'gloo'"):
        check_device(host, "gloo")


def test_check_count_and_dtype():
    out = as_buffer(np.zeros(12, np.float32), name="output")
    check_count(out, 12, exact=True)
    check_count(out, 8)
    with pytest.raises(
        ValueError, match=r"all_gather: output has 12 elements but needs at least 16 \(4 per rank x 4 ranks\)"
    ):
        check_count(out, 16, op="all_gather", why="4 per rank x 4 ranks")
    with pytest.raises(ValueError, match="needs exactly 8"):
        check_count(out, 8, exact=True)
    inp = as_buffer(np.zeros(3, np.float16), name="input")
    check_same_dtype(out, as_buffer(np.zeros(1, np.float32)))
    with pytest.raises(
        ValueError, match="all_reduce: input is Half but output is Float; they must have the same dtype"
    ):
        check_same_dtype(inp, out, op="all_reduce")


def test_datatypes_match_the_bindings():
    nccl = pytest.importorskip("pycoll._bindings._nccl", reason="bindings not built")
    for member in nccl.DataType:
        assert DATATYPE_NAMES[int(member)]  # every binding datatype has a name here
    assert len(DATATYPE_NAMES) == len(nccl.DataType)
    assert int(nccl.DataType.Bfloat16) == 9 and int(nccl.DataType.Float8e5m2) == 11


def test_check_overlap():
    z = np.zeros(16, np.float32)
    a, b = as_buffer(z[:8], name="input"), as_buffer(z[8:], name="output")
    check_overlap(a, b, op="x")  # adjacent
    check_overlap(a, as_buffer(z[:8], name="output"), op="x")  # the same start: in place
    check_overlap(as_buffer(z[4:8], name="input"), as_buffer(z, name="output"), op="x", in_place=16)  # at its slot
    check_overlap(as_buffer(z[:0], name="input"), as_buffer(z, name="output"), op="x")  # empty
    with pytest.raises(ValueError, match=r"x: input and output overlap in memory \(32 bytes at 0x[0-9a-f]+, 32 bytes"
                       r" at 0x[0-9a-f]+\) other than in place.*in-place form \(output=None\)"):
        check_overlap(a, as_buffer(z[4:12], name="output"), op="x", in_place_form="output=None")
    with pytest.raises(ValueError, match="pass a separate output"):
        check_overlap(a, as_buffer(z[:8], name="output"), op="sendrecv", in_place=None)  # no in-place form at all
    with pytest.raises(ValueError, match="overlap"):  # overlapping, but not at the in-place slot
        check_overlap(as_buffer(z[4:8], name="input"), as_buffer(z, name="output"), op="x", in_place=0)
    gpu = a._replace(device_type=DeviceType.CUDA)  # another address space: never compared
    check_overlap(gpu, as_buffer(z[4:12], name="output"), op="x")


def test_a_tensor_without_memory_is_refused_naming_the_argument():
    """A ZeroTensor (autograd's known-zero gradient) has data_ptr() 0: the library said 'sendbuff argument is NULL',
    and the peers waited out their timeout."""
    import pycoll

    z = torch._efficientzerotensor(3)
    with pytest.raises(ValueError, match="^arg: the tensor has no memory .data_ptr.. is 0: a ZeroTensor"):
        as_buffer(z, name="arg")
    import warnings
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # torch.masked is a prototype
        from torch.masked import masked_tensor
        m = masked_tensor(torch.ones(3), torch.tensor([True, False, True]))
    with pytest.raises(ValueError, match="^arg: masked tensors are not supported"):
        as_buffer(m, name="arg")

    class Wrapper(torch.Tensor):  # as DTensor: a wrapper subclass, no storage of its own
        @staticmethod
        def __new__(cls, inner):
            return torch.Tensor._make_wrapper_subclass(cls, inner.shape, dtype=inner.dtype)

        @classmethod
        def __torch_dispatch__(cls, func, types, args=(), kwargs=None):
            raise NotImplementedError

    with pytest.raises(ValueError, match=r"^arg: a Wrapper has no memory of its own .*d.to_local\(\)"):
        as_buffer(Wrapper(torch.ones(3)), name="arg")
    seen = []

    def loss(x):  # torch's RuntimeError about the data pointer escaped, naming no argument
        with pytest.raises(ValueError, match="^arg: the tensor has no storage .* inside a torch.func transform"):
            as_buffer(x, name="arg")
        seen.append(1)
        return x.sum()

    torch.func.grad(loss)(torch.ones(3))
    assert seen == [1]
    comm = pycoll.init(0, 1, backend="host")
    try:
        for call in (lambda: comm.all_reduce(z, torch.empty(3)), lambda: comm.all_reduce(torch.ones(3), z)):
            with pytest.raises(ValueError, match="has no memory"):
                call()
        assert comm.state == "active" and as_buffer(torch.empty(0)).count == 0
    finally:
        comm.abort()
