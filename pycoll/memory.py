"""Symmetric memory (``ncclMemAlloc``) as arrays, a pool of them over one window, and the
communicator's memory controls (suspend, resume, statistics).

``comm.mem_alloc(shape, dtype, like=...)`` returns a numpy array, a torch tensor or a CuPy array
over its own ``ncclMemAlloc`` block; ``SymmetricPool(comm, nbytes)`` allocates one block,
registers one window over it (collective) and hands out many small arrays from it, each with its
byte offset in the window (what :meth:`~pycoll.Communicator.put_signal` takes).

Lifetimes: an allocation is freed (``ncclMemFree``) when the last array viewing it is garbage
collected -- never earlier, so an array may outlive its communicator (``ncclMemFree`` needs no
communicator). Destroying or aborting the communicator releases its windows and registrations
first; the arrays stay valid memory. A pool's array returns its block to the pool when it dies.
On the host backend the memory is anonymous shared memory (memfd): nothing appears under
/dev/shm, and nothing outlives the processes; an ``all_reduce`` past 32 KiB whose input and output
are a pool's arrays (or lie in other windows) on every rank reduces straight between the ranks'
memory, with no staging copy (``PYCOLL_HOST_WINDOW_ALLREDUCE``); so do a ``reduce`` past 32 KiB and a
``broadcast``, ``all_gather``, ``reduce_scatter``, ``all_to_all``, ``gather`` or ``scatter`` past one step of
the segment (``PYCOLL_HOST_WINDOW_COLLECTIVES``).
"""

from __future__ import annotations

import collections
import dataclasses
import logging
import threading
import weakref
from typing import Any, Deque, List, Optional, Sequence, Tuple, Union

import numpy as np

from . import _bindings as B, _settings
from ._settings import Seconds
from .buffers import integer
from .errors import CommStateError
from .windows import Window, register_window

__all__ = ["SymmetricPool", "MemoryStats", "mem_alloc"]

_log = logging.getLogger("pycoll.memory")

Shape = Union[int, Sequence[int]]


class _Allocation:
    """One ``ncclMemAlloc`` block, freed when the last object holding it goes."""

    def __init__(self, comm: Any, nbytes: int) -> None:
        nbytes = integer(nbytes, "nbytes", "an int > 0", 1)
        lib = comm.library
        previous = comm.device.swap_current() if comm._guard_device else None  # ncclMemAlloc: the current device
        try:
            self.ptr = int(lib.mem_alloc(nbytes))
        finally:
            if previous is not None:
                comm.device.restore_current(previous)
        self.nbytes = nbytes
        self.backend = comm.backend
        self.device_id = -1 if comm.backend == "host" else comm.device.device_id
        # a runtime that stands in for CUDA (pycoll.emulated) makes its own arrays over device memory
        self.device_array = getattr(getattr(comm.device, "runtime", None), "device_array", None)
        self._finalizer = weakref.finalize(self, _free, lib, self.ptr)

    @property
    def freed(self) -> bool:
        return not self._finalizer.alive


def _free(lib: Any, ptr: int) -> None:
    try:
        lib.mem_free(ptr)
    except Exception:  # at interpreter exit the library may be gone
        _log.debug("ncclMemFree(%#x) failed", ptr, exc_info=True)


def _shape(shape: Shape) -> Tuple[int, ...]:
    """An int or a sequence of ints (numpy's too) >= 0: TypeError for anything else, ValueError below 0."""
    expected = "an int or a sequence of ints >= 0"
    items: Any = shape
    if isinstance(shape, (str, bytes, bytearray, memoryview)):  # a sequence, but of characters or bytes
        raise TypeError(f"shape must be {expected}, got {type(shape).__name__} {shape!r}")
    if hasattr(type(shape), "__index__"):
        items = (shape,)
    try:
        items = tuple(items)
    except TypeError:
        raise TypeError(f"shape must be {expected}, got {type(shape).__name__} {shape!r}") from None
    dims = tuple(integer(d, "shape", expected) for d in items)
    if any(d < 0 for d in dims):
        raise ValueError(f"shape must be ints >= 0, got {shape!r}")
    return dims


def _nbytes(dims: Tuple[int, ...], itemsize: int) -> int:
    n = itemsize
    for d in dims:
        n *= d
    if n >= 1 << 63:
        raise ValueError(f"shape {dims} of {itemsize}-byte items is {n} bytes: more than a size_t allocation holds")
    return n


def _itemsize(dtype: Any, like: str) -> int:
    """The size of ``dtype`` as the array ``like`` is made reads it (torch's "float" is float32, numpy's float64)."""
    if isinstance(dtype, (np.generic, int, float)) and not isinstance(dtype, type):  # numpy takes a value's type
        raise TypeError(f"dtype must be a dtype (a name, a numpy or torch dtype), got the value {dtype!r}")
    if like == "torch":
        import torch

        return int(torch.empty((), dtype=_torch_dtype(dtype)).element_size())
    return int(_np_dtype(dtype).itemsize)


def _np_dtype(dtype: Any) -> Any:
    """``dtype`` as numpy's (a torch dtype by its name, as the torch arrays' take a numpy one), refusing what holds
    Python objects (references cannot live in communicator memory)."""
    if type(dtype).__module__ == "torch":
        from ._dtypes import datatype_of, numpy_dtype

        dt = numpy_dtype(datatype_of(dtype))
    else:
        try:
            dt = np.dtype(dtype)
        except TypeError:  # a name numpy knows once ml_dtypes registered it ("bfloat16", "float8_e4m3fn")
            import ml_dtypes  # noqa: F401

            dt = np.dtype(dtype)
    if dt.hasobject:
        raise TypeError(f"dtype {dt} holds Python objects: it cannot be allocated in a communicator's memory")
    return dt


def _torch_dtype(dtype: Any) -> Any:
    import torch

    if isinstance(dtype, torch.dtype):
        return dtype
    name = dtype if isinstance(dtype, str) else np.dtype(dtype).name
    t = getattr(torch, name, None)
    if not isinstance(t, torch.dtype):
        raise ValueError(f"unknown torch dtype {dtype!r}")
    return t


class _HostView:
    """What a numpy array over allocated memory keeps alive (its ``base``)."""

    def __init__(self, owner: Any, ptr: int, nbytes: int) -> None:
        self.owner = owner
        self.__array_interface__ = {"data": (ptr, False), "shape": (nbytes,), "typestr": "|u1", "version": 3}


class _DeviceView:
    """A GPU block as ``__cuda_array_interface__`` (what torch/CuPy keep alive)."""

    def __init__(self, owner: Any, ptr: int, nbytes: int) -> None:
        self.owner = owner
        self.__cuda_array_interface__ = {"data": (ptr, False), "shape": (nbytes,), "typestr": "|u1",
                                         "version": 3, "strides": None, "stream": None}


def _array(owner: Any, alloc: _Allocation, ptr: int, dims: Tuple[int, ...], dtype: Any, like: Optional[str]) -> Any:
    host = alloc.backend == "host"
    if like is None:
        like = "numpy" if host else "torch"
    nbytes = _nbytes(dims, _itemsize(dtype, like))
    if not host and callable(alloc.device_array):
        return alloc.device_array(owner, ptr, dims, dtype, like, alloc.device_id)
    if like == "numpy":
        if not host:
            raise ValueError("like='numpy' needs the host backend: this memory is on a GPU (use 'torch' or 'cupy')")
        raw = np.asarray(_HostView(owner, ptr, max(nbytes, 1)))[:nbytes]
        return raw.view(_np_dtype(dtype)).reshape(dims)
    if like == "torch":
        import torch

        tdt = _torch_dtype(dtype)
        if host:
            raw_t = torch.from_numpy(np.asarray(_HostView(owner, ptr, max(nbytes, 1)))[:nbytes])
        else:
            raw_t = torch.as_tensor(_DeviceView(owner, ptr, max(nbytes, 1)), device=f"cuda:{alloc.device_id}")
            raw_t = raw_t[:nbytes]
        return raw_t.view(tdt).reshape(dims)
    if like == "cupy":
        if host:
            raise ValueError("like='cupy' needs a GPU backend")
        import cupy

        mem = cupy.cuda.UnownedMemory(ptr, max(nbytes, 1), owner, alloc.device_id)
        return cupy.ndarray(dims, dtype=dtype, memptr=cupy.cuda.MemoryPointer(mem, 0))
    raise ValueError(f"like must be 'numpy', 'torch' or 'cupy', got {like!r}")


def mem_alloc(comm: Any, shape: Shape, dtype: Any = "float32", like: Optional[str] = None) -> Any:
    """An array of ``shape`` and ``dtype`` over its own ``ncclMemAlloc`` block (zero-filled on the
    host backend). ``like``: ``"numpy"`` (host backend default), ``"torch"`` (GPU default) or
    ``"cupy"``. Freed when the last view of it is garbage collected."""
    comm._check_alive()
    dims = _shape(shape)
    nbytes = _nbytes(dims, _itemsize(dtype, like or ("numpy" if comm.backend == "host" else "torch")))
    alloc = _Allocation(comm, max(nbytes, 1))
    return _array(alloc, alloc, alloc.ptr, dims, dtype, like)


class _Block:
    """One block handed out by a pool: returned to it when the array viewing it dies."""

    def __init__(self, alloc: Any, pool: SymmetricPool, offset: int, nbytes: int) -> None:
        self.alloc = alloc
        self.offset = offset
        weakref.finalize(self, pool._give_back, offset, nbytes)


class SymmetricPool:
    """Many small arrays from one ``ncclMemAlloc`` block registered as one window (collective).

    ``pool.empty(shape, dtype)`` returns an array; ``pool.offset_of(array)`` its byte offset in
    ``pool.window``, for :meth:`~pycoll.Communicator.put_signal`. Blocks are handed out first-fit
    at ``alignment`` bytes; an array's block goes back to the pool when the array dies (also when the cyclic
    garbage collector frees it, in whatever thread). Offsets match across ranks when every rank allocates (and frees)
    in the same order. ``close()`` releases the window; the memory goes when its last array does.
    """

    def __init__(self, comm: Any, nbytes: int, *, flags: int = 0, alignment: int = 256,
                 timeout: Optional[Seconds] = None) -> None:
        if isinstance(alignment, bool) or not isinstance(alignment, int) or alignment <= 0 \
                or alignment & (alignment - 1):
            raise ValueError(f"alignment must be a power of two, got {alignment!r}")
        if timeout is not None:
            timeout = _settings.seconds(timeout, "SymmetricPool: timeout")
        comm._outside_group("SymmetricPool")  # a collective registration, with its result needed now
        comm._check_usable("SymmetricPool")
        self.comm = comm
        self.alignment = alignment
        alloc = _Allocation(comm, nbytes)
        # held by the window (its array over the whole block) and by the arrays handed out, not by the pool: once
        # the window is released (close(), or the communicator's end) the block goes with its last array
        self._alloc = weakref.ref(alloc)
        self.nbytes = nbytes = alloc.nbytes
        self._ptr = alloc.ptr
        self._mu = threading.Lock()
        self._free: List[Tuple[int, int]] = [(0, nbytes)]  # (offset, size), sorted
        # blocks given back by dead arrays, taken into _free under _mu: a block's finalizer may run inside empty()
        # (the cyclic collector runs where an allocation starts it), where taking _mu deadlocked the thread
        self._returned: Deque[Tuple[int, int]] = collections.deque()
        whole = _array(alloc, alloc, alloc.ptr, (nbytes,), "uint8",
                       "numpy" if comm.backend == "host" else "torch")
        self.window: Window = register_window(comm, whole, flags, timeout)

    @property
    def ptr(self) -> int:
        """The address of the pool's block."""
        return self._ptr

    def empty(self, shape: Shape, dtype: Any = "float32", like: Optional[str] = None) -> Any:
        """An uninitialised array from the pool (MemoryError when no free block is big enough)."""
        if self.window.closed:
            state = getattr(self.comm, "state", "active")
            raise CommStateError("this SymmetricPool was closed" + (
                f" (its communicator {self.comm.name!r} is {state})" if state != "active" else ""))
        dims = _shape(shape)
        size = max(_nbytes(dims, _itemsize(dtype, like or ("numpy" if self.comm.backend == "host" else "torch"))), 1)
        # a block takes the size rounded up to the alignment (the next block starts aligned), but the pool's last
        # bytes may hold an array of exactly their size: a pool sized for an array has room for it
        rounded = -(-size // self.alignment) * self.alignment
        with self._mu:
            self._reclaim()
            for i, (off, n) in enumerate(self._free):
                if n >= size:
                    need = min(rounded, n)
                    self._free[i:i + 1] = [(off + need, n - need)] if n > need else []
                    break
            else:
                raise MemoryError(f"SymmetricPool: no free block of {size} bytes in {self.nbytes} "
                                  f"(free: {sum(n for _, n in self._free)} bytes in {len(self._free)} blocks)")
        alloc = self._alloc()
        assert alloc is not None  # the open window holds it
        block = _Block(alloc, self, off, need)
        return _array(block, alloc, alloc.ptr + off, dims, dtype, like)

    def offset_of(self, array: Any) -> int:
        """The byte offset of ``array`` (from :meth:`empty`, or a view into it) in the window. An array of no element
        that gives no address in the pool (torch's say 0) is at offset 0: a transfer of it moves nothing."""
        p = _data_ptr(array)
        if not self._ptr <= p < self._ptr + self.nbytes:
            if p == 0 and _no_element(array):
                return 0
            raise ValueError("this array does not lie in the pool")
        return p - self._ptr

    def _give_back(self, offset: int, size: int) -> None:
        self._returned.append((offset, size))  # no lock: see _returned

    def _reclaim(self) -> None:
        """The blocks given back since, into the free list, merged with their neighbours (``_mu`` held)."""
        if not self._returned:
            return
        while self._returned:
            self._free.append(self._returned.popleft())
        self._free.sort()
        merged: List[Tuple[int, int]] = []
        for off, n in self._free:
            if merged and merged[-1][0] + merged[-1][1] == off:
                merged[-1] = (merged[-1][0], merged[-1][1] + n)
            else:
                merged.append((off, n))
        self._free = merged

    @property
    def free_bytes(self) -> int:
        """Bytes not handed out."""
        with self._mu:
            self._reclaim()
            return sum(n for _, n in self._free)

    def close(self) -> None:
        """Release the window (local; idempotent). The arrays stay valid memory; the pool's block goes with the
        last of them (the pool object does not hold it)."""
        self.window.close()

    def __enter__(self) -> SymmetricPool:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


def _no_element(array: Any) -> bool:
    """Whether ``array`` (a torch tensor, a numpy or CUDA array interface) holds no element."""
    numel = getattr(array, "numel", None)
    if callable(numel):
        return int(numel()) == 0
    return 0 in tuple(getattr(array, "shape", (1,)))


def _data_ptr(array: Any) -> int:
    if hasattr(array, "data_ptr"):
        return int(array.data_ptr())
    if hasattr(array, "__array_interface__"):
        return int(array.__array_interface__["data"][0])
    if hasattr(array, "__cuda_array_interface__"):
        return int(array.__cuda_array_interface__["data"][0])
    raise TypeError(f"cannot find the address of a {type(array).__name__}")


# -- suspend, resume, statistics -------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class MemoryStats:
    """``ncclCommMemStats``: bytes NCCL allocated for the communicator.

    ``suspendable``: released by ``suspend()``; ``persistent``: kept; ``total``: both;
    ``suspended``: whether the communicator is suspended now. The host library allocates no GPU
    memory: its sizes are 0.
    """

    suspendable: int
    suspended: bool
    persistent: int
    total: int


def memory_stats(comm: Any) -> MemoryStats:
    comm._check_alive()
    lib, h = comm.library, comm.handle
    with comm._lock:
        vals = [int(lib.comm_mem_stats(h, s)) for s in range(4)]
    return MemoryStats(suspendable=vals[0], suspended=bool(vals[1]), persistent=vals[2], total=vals[3])


def suspend(comm: Any, flags: int = B.SUSPEND_MEM) -> None:
    comm._check_usable("suspend")
    flags = integer(flags, "suspend: flags", "an int of pycoll.bindings.SUSPEND_* bits")
    if flags & ~B.SUSPEND_MEM or not flags:  # NCCL's only flag; without it, ncclCommSuspend suspends nothing
        raise ValueError(f"suspend: flags must be pycoll.bindings.SUSPEND_MEM ({B.SUSPEND_MEM}), got {flags}")
    if comm.outstanding():
        raise CommStateError(f"suspend: communicator {comm.name!r} has outstanding operations; wait for them first")
    with comm._lock:
        comm.library.comm_suspend(comm.handle, flags)


def resume(comm: Any) -> None:
    comm._check_usable("resume")
    with comm._lock:
        comm.library.comm_resume(comm.handle)
