"""The few array operations pycoll-bench needs: numpy (host), torch (host or GPU), cupy (GPU)."""

from __future__ import annotations

from typing import Any, Optional

import numpy as np

from ... import _dtypes
from .spec import DType


class _ArrayLib:
    """The few array operations the benchmark needs, for one array library and device."""

    name = "abstract"

    def empty(self, count: int, dt: DType) -> Any:  # zero-filled, pages touched
        raise NotImplementedError

    def assign(self, view: Any, values: np.ndarray) -> None:  # int64 or float64 values
        raise NotImplementedError

    def fetch(self, view: Any, dt: DType) -> np.ndarray:  # float64 (floats) or int64 copy
        raise NotImplementedError

    def sync(self) -> None:
        pass


class _NumpyKit(_ArrayLib):
    name = "numpy"

    @staticmethod
    def dtype(dt: DType) -> Any:
        if _dtypes.BY_CODE[dt.nccl].ml_dtypes:
            try:
                import ml_dtypes
            except ImportError:
                raise RuntimeError(f"datatype {dt.name} with numpy arrays needs the ml_dtypes package") from None
            return np.dtype(getattr(ml_dtypes, dt.array_name))
        return np.dtype(dt.array_name)

    def empty(self, count: int, dt: DType) -> Any:
        arr = np.empty(count, dtype=self.dtype(dt))
        arr[...] = 0  # fault the pages in now, not in the first timed iteration
        return arr

    def assign(self, view: Any, values: np.ndarray) -> None:
        if np.issubdtype(view.dtype, np.integer):
            view[...] = values.astype(view.dtype)  # wraps around, as the datatype does
        else:  # float, and the ml_dtypes types (converted through float64)
            view[...] = values.astype(np.float64).astype(view.dtype)

    def fetch(self, view: Any, dt: DType) -> np.ndarray:
        return view.astype(np.float64 if dt.is_float else np.int64)


class _TorchKit(_ArrayLib):
    name = "torch"

    def __init__(self, device: str) -> None:
        import torch

        self.torch = torch
        self.device = torch.device(device)

    def dtype(self, dt: DType) -> Any:
        tdt = getattr(self.torch, dt.array_name, None)
        if tdt is None:
            raise RuntimeError(f"this torch ({self.torch.__version__}) has no dtype {dt.array_name}")
        return tdt

    def empty(self, count: int, dt: DType) -> Any:
        return self.torch.zeros(count, dtype=self.dtype(dt), device=self.device)

    def assign(self, view: Any, values: np.ndarray) -> None:
        src = self.torch.from_numpy(np.ascontiguousarray(values)).to(self.device)
        view.copy_(src.to(view.dtype))

    def fetch(self, view: Any, dt: DType) -> np.ndarray:
        wide = self.torch.float64 if dt.is_float else self.torch.int64
        return view.to(wide).cpu().numpy()

    def sync(self) -> None:
        if self.device.type == "cuda":
            self.torch.cuda.synchronize(self.device)


class _CupyKit(_ArrayLib):
    name = "cupy"

    def __init__(self, device_id: int) -> None:
        import cupy

        self.cupy = cupy
        self.device_id = device_id

    def empty(self, count: int, dt: DType) -> Any:
        if _dtypes.BY_CODE[dt.nccl].ml_dtypes:
            raise RuntimeError(f"cupy has no {dt.name} arrays; use --array torch")
        with self.cupy.cuda.Device(self.device_id):
            return self.cupy.zeros(count, dtype=dt.array_name)

    def assign(self, view: Any, values: np.ndarray) -> None:
        with self.cupy.cuda.Device(self.device_id):
            view[...] = self.cupy.asarray(values).astype(view.dtype)

    def fetch(self, view: Any, dt: DType) -> np.ndarray:
        return self.cupy.asnumpy(view).astype(np.float64 if dt.is_float else np.int64)

    def sync(self) -> None:
        with self.cupy.cuda.Device(self.device_id):
            self.cupy.cuda.runtime.deviceSynchronize()


def array_refusal(array: str, backend: str) -> Optional[str]:
    """Why ``--array array`` cannot be used on ``backend`` (resolved: not "auto"), else None."""
    if backend == "host" and array not in ("auto", "numpy", "torch"):
        return f"--array {array} needs a GPU backend; the host backend takes numpy or torch arrays"
    if backend != "host" and array == "numpy":
        return f"the {backend} backend needs GPU arrays: --array torch or cupy"
    return None


def _make_kit(array: str, backend: str, device_id: int) -> _ArrayLib:
    why = array_refusal(array, backend)
    if why:
        raise ValueError(why)
    if backend == "host":
        return _TorchKit("cpu") if array == "torch" else _NumpyKit()
    if array in ("auto", "torch"):
        try:
            return _TorchKit(f"cuda:{device_id}")
        except ImportError:
            if array == "torch":
                raise
    return _CupyKit(device_id)


def _ptr(arr: Any) -> int:
    from ...buffers import as_buffer

    return as_buffer(arr).ptr
