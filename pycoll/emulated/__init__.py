"""An emulated GPU: rehearse pycoll's GPU code path on a laptop, multi-rank, with no GPU.

The emulated GPU is an :class:`EmulatedCudaRuntime` with the call shapes of cuda-bindings'
``cuda.bindings.runtime`` (``cudaStreamCreateWithFlags``, ``cudaEventQuery`` -> ``(err, ...)``),
whose streams and events are pycoll's host-library streams. A communicator built by :func:`init`
has a real :class:`pycoll.devices.CudaDevice` on that runtime and the host library as its NCCL:
the GPU stream resolution, the event-based completion tracking, the watchdog, the flight recorder
and its dumps all run exactly as on a GPU, with host memory standing in for device memory::

    import pycoll, pycoll.emulated as emu

    comm = emu.init(rank, world_size, unique_id=uid, device=0)   # one process per rank
    rt = emu.runtime()
    x = emu.TorchLikeTensor(rt, [1.0, 2.0], device=0)            # DLPack, kDLCUDA
    gate = rt.hang(0)                                            # a kernel stuck on stream 0
    w = comm.all_reduce(x, async_op=True)                        # queued behind it
    assert not w.is_completed() and comm.outstanding() == [w]
    gate.release(); w.wait()

What is emulated: the legacy default stream (handles 0 and ``cudaStreamLegacy`` = 1) and its
implicit synchronisation with blocking streams, per-thread default streams (2), created streams,
events (query, synchronize, elapsed time; ``cudaEventDisableTiming``), ``cudaStreamWaitEvent``, a
per-thread current device over ``ndev`` devices, stream capture (status, capture id, invalidation,
``cudaErrorCapturedEvent`` for an event recorded while capturing, ``cudaErrorStreamCaptureImplicit``
for the legacy stream during a global-mode capture) and graphs whose launch re-runs the captured
collectives. Arrays: :class:`TorchLikeTensor` (DLPack), :class:`CupyLikeArray`
(``__cuda_array_interface__`` v3), each with its framework's current stream (``rt.torch``,
``rt.cupy``) and writes queued on a stream as kernels. Test controls: ``rt.launch(stream, fn)``,
``rt.hang(stream)``, ``rt.inject_error(700)`` and the call log ``rt.log``.

What is not: device memory (pointers are host pointers), kernels inside graphs, one legacy stream
per device (the emulated devices share one), NCCL's performance.
"""

from __future__ import annotations

from typing import Any, Optional

from .. import create
from ..devices import CudaDevice
from .arrays import KDL_CUDA, CupyLikeArray, TorchLikeTensor
from .runtime import Call, EmulatedCudaRuntime, EmulatedFramework, Gate, cudaError_t

__all__ = [
    "EmulatedCudaRuntime",
    "EmulatedFramework",
    "TorchLikeTensor",
    "CupyLikeArray",
    "Gate",
    "Call",
    "cudaError_t",
    "KDL_CUDA",
    "init",
    "runtime",
    "device",
]

_runtime: Optional[EmulatedCudaRuntime] = None


def runtime(ndev: int = 2) -> EmulatedCudaRuntime:
    """This process's emulated runtime, opened on first use with ``ndev`` devices."""
    global _runtime
    if _runtime is None or _runtime.closed:
        _runtime = EmulatedCudaRuntime(ndev)
    return _runtime


def device(device_id: int = 0, rt: Optional[EmulatedCudaRuntime] = None) -> Any:
    """A :class:`pycoll.devices.CudaDevice` for emulated GPU ``device_id``, with the runtime's driver table
    (the compiled operation path calls it as it calls the CUDA driver)."""
    rt = rt if rt is not None else runtime()
    return CudaDevice(device_id, runtime=rt, driver=rt.driver())


def init(rank: Optional[int] = None, world_size: Optional[int] = None, *, device: Any = 0,
         ndev: int = 2, **kwargs: Any) -> Any:
    """:func:`pycoll.init` on an emulated GPU: a communicator whose device is a ``CudaDevice`` on this
    process's :func:`runtime` and whose library is pycoll's host library.

    ``device``: the emulated GPU ordinal (made current in the calling thread) or a ``CudaDevice``.
    The other arguments are :func:`pycoll.init`'s (``unique_id``, ``store``, ``timeout``, ``name``...;
    ``backend`` is ``"host"``).
    """
    rt = runtime(ndev)
    dev = device if isinstance(device, CudaDevice) else CudaDevice(device, runtime=rt, driver=rt.driver())
    dev.make_current()
    kwargs.setdefault("backend", "host")
    return create.init(rank, world_size, device=dev, **kwargs)
