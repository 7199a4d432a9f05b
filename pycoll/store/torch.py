"""The store protocol over any object with torch's c10d ``Store`` methods; torch is never imported."""

from __future__ import annotations

import threading
import time
from datetime import timedelta
from typing import Any, Callable, List, Optional, Sequence

from ..errors import NotSupported, StoreError
from .base import (
    DEFAULT_TIMEOUT,
    Keys,
    Store,
    Value,
    _check_amount,
    _check_key,
    _check_keys,
    _check_timeout,
    _timeout_error,
    _to_bytes,
)

__all__ = ["TorchStoreAdapter", "wrap_torch_store"]


_TORCH_METHODS = ("set", "get", "add", "wait", "compare_set", "delete_key", "check", "num_keys")

# a wait polls check(): first at once, then after 1 ms, the pause doubling up to 50 ms (as Store.wait_size)
POLL_FIRST, POLL_MAX = 0.001, 0.05


class TorchStoreAdapter(Store):
    """The pycoll protocol over any object with torch's c10d ``Store`` methods.

    Duck-typed: torch is never imported here. A wait with a timeout (``wait``, ``get``,
    ``multi_get``) polls the torch store's ``check()`` -- at once, then after 1 ms, the pause doubling
    up to 50 ms -- instead of calling its ``wait(keys, timedelta)``: torch's TCPStore logs a c10d
    warning ("waitForInput: socket ... timed out") for every wait that times out, and pycoll's threads
    wait with short timeouts all the time. Every call this adapter makes on the torch store is then
    one short request. torch's errors become :class:`StoreError` (:class:`StoreTimeout` where they
    say they timed out). ``list_keys`` needs a torch store that has it.

    torch's TCPStore client serialises calls on one socket, so a user's blocked ``wait`` on it would
    hold up the polls; when the store has ``clone()`` (torch >= 2.3), they run on a per-thread clone
    (a separate connection) instead.
    """

    def __init__(self, store: Any, timeout: Optional[float] = None) -> None:
        missing = [m for m in _TORCH_METHODS if not callable(getattr(store, m, None))]
        if missing:
            raise TypeError(f"{type(store).__name__} is not a torch-style store: it lacks {', '.join(missing)}")
        self.torch_store = store
        if timeout is None:
            t = getattr(store, "timeout", None)
            timeout = t.total_seconds() if isinstance(t, timedelta) else DEFAULT_TIMEOUT
        self.timeout = _check_timeout(timeout, DEFAULT_TIMEOUT)
        self._local = threading.local()

    def __repr__(self) -> str:
        return f"TorchStoreAdapter({self.torch_store!r})"

    def _blocking_store(self) -> Any:
        clone = getattr(self._local, "store", None)
        if clone is None:
            clone = self.torch_store
            if callable(getattr(self.torch_store, "clone", None)):
                try:
                    clone = self.torch_store.clone()
                except Exception:  # a store that cannot clone: share the original
                    clone = self.torch_store
            self._local.store = clone
        return clone

    def _run(self, what: str, fn: Callable[[], Any], keys: Sequence[str] = (), timeout: float = 0.0) -> Any:
        try:
            return fn()
        except (TypeError, ValueError) as exc:
            if isinstance(exc, ValueError) and what == "add":
                raise StoreError(f"add({keys[0]!r}): {exc}") from exc
            raise
        except Exception as exc:  # torch raises DistStoreError (a RuntimeError) and friends
            text = str(exc).lower()
            if "timeout" in type(exc).__name__.lower() or "timeout" in text or "timed out" in text:
                raise _timeout_error(list(keys), timeout, f" in {type(self.torch_store).__name__}") from exc
            raise StoreError(f"{what}: {type(self.torch_store).__name__} failed: {exc}") from exc

    def _wait(self, keys: List[str], timeout: float) -> None:
        """Return once every key exists, polling ``check()``; StoreTimeout naming the missing keys after
        ``timeout`` seconds. Never torch's ``wait()``: each one that times out logs a c10d warning."""
        store = self._blocking_store()
        deadline = time.monotonic() + timeout
        delay = POLL_FIRST
        while not self._run("wait", lambda: store.check(keys), keys, timeout):
            left = deadline - time.monotonic()
            if left <= 0:
                missing = keys if len(keys) == 1 else [k for k in keys if not self._has(store, k, timeout)]
                raise _timeout_error(keys, timeout, f" in {type(self.torch_store).__name__}", missing)
            time.sleep(min(delay, left))
            delay = min(delay * 2, POLL_MAX)

    def _has(self, store: Any, key: str, timeout: float) -> bool:
        return bool(self._run("wait", lambda: store.check([key]), [key], timeout))

    def set(self, key: str, value: Value) -> None:
        key, value = _check_key(key), _to_bytes(value)
        self._run("set", lambda: self.torch_store.set(key, value))

    def get(self, key: str, timeout: Optional[float] = None) -> bytes:
        key = _check_key(key)
        t = _check_timeout(timeout, self.timeout)
        if t == 0:
            if not self.check([key]):
                raise _timeout_error([key], 0.0, f" in {type(self.torch_store).__name__}")
        else:
            self._wait([key], t)
        return bytes(self._run("get", lambda: self.torch_store.get(key), [key], t))

    def add(self, key: str, amount: int) -> int:
        key, amount = _check_key(key), _check_amount(amount)
        return int(self._run("add", lambda: self.torch_store.add(key, amount), [key]))

    def wait(self, keys: Keys, timeout: Optional[float] = None) -> None:
        keys = _check_keys(keys)
        t = _check_timeout(timeout, self.timeout)
        if t == 0:
            if not self.check(keys):
                raise _timeout_error(keys, 0.0, f" in {type(self.torch_store).__name__}",
                                     [k for k in keys if not self.check([k])])
            return
        self._wait(keys, t)

    def compare_set(self, key: str, expected: Value, desired: Value) -> bytes:
        key = _check_key(key)
        expected, desired = _to_bytes(expected, "expected value"), _to_bytes(desired, "desired value")
        return bytes(self._run("compare_set", lambda: self.torch_store.compare_set(key, expected, desired), [key]))

    def delete(self, key: str) -> bool:
        key = _check_key(key)
        return bool(self._run("delete", lambda: self.torch_store.delete_key(key), [key]))

    def check(self, keys: Keys) -> bool:
        keys = _check_keys(keys)
        return bool(self._run("check", lambda: self.torch_store.check(keys), keys))

    def num_keys(self) -> int:
        return int(self._run("num_keys", self.torch_store.num_keys))

    def list_keys(self, prefix: str = "") -> List[str]:
        prefix = _check_key(prefix)
        fn = getattr(self.torch_store, "list_keys", None)
        if not callable(fn):
            raise NotSupported("list_keys", library=type(self.torch_store).__name__)
        return sorted(k for k in self._run("list_keys", fn) if k.startswith(prefix))

    def close(self) -> None:
        """Drop the reference to the torch store (torch stores close when garbage collected)."""


def wrap_torch_store(store: Any, timeout: Optional[float] = None) -> Store:
    """Return ``store`` as a pycoll :class:`Store`: pycoll stores unchanged, torch-style ones adapted."""
    if isinstance(store, Store):
        return store
    return TorchStoreAdapter(store, timeout)


def store_argument(store: Any) -> Store:
    """A ``store=`` argument as a pycoll :class:`Store` (:func:`wrap_torch_store`); TypeError naming it for
    anything without a ``set`` method, None included."""
    if not hasattr(store, "set"):
        raise TypeError(f"store must be a pycoll store or have torch's Store methods, got {type(store).__name__}")
    return wrap_torch_store(store)
