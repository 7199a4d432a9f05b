"""The in-process store (threads only); the reference for the semantics of :mod:`pycoll.store.base`."""

from __future__ import annotations

import os
import threading
from typing import Any, List, Optional

from .._settings import Seconds
from ..errors import StoreError
from .base import (
    DEFAULT_TIMEOUT,
    Keys,
    Store,
    Value,
    _append_args,
    _check_amount,
    _check_key,
    _check_keys,
    _check_size,
    _check_timeout,
    _size_timeout,
    _Table,
    _timeout_error,
    _to_bytes,
)

__all__ = ["MemoryStore"]


class MemoryStore(Store):
    """A store held in this process; threads share it. Useful for one-process jobs and tests."""

    def __init__(self, timeout: Seconds = DEFAULT_TIMEOUT) -> None:
        self.timeout = _check_timeout(timeout, DEFAULT_TIMEOUT)
        self._table = _Table()
        self._cond_ = threading.Condition()
        self._pid = os.getpid()
        self._closed = False

    @property
    def _cond(self) -> threading.Condition:
        """The store's lock (every call takes it), once :meth:`_check_usable` passed."""
        self._check_usable()
        return self._cond_

    def _check_usable(self) -> None:
        """In the process that made the store only: a forked child's copy is another store (its ranks waited out
        their timeouts for each other's keys, blaming the ranks). A closed store refuses every call, as the other
        stores do."""
        if os.getpid() != self._pid:
            raise StoreError("a MemoryStore lives in the process that made it (its threads share it), not in a "
                             "forked child: between processes use a TCPStore or a FileStore")
        if self._closed:
            raise StoreError("the MemoryStore is closed")

    def close(self) -> None:
        """Close the store: later calls raise StoreError; calls waiting for keys now raise it too."""
        with self._cond_:
            self._closed = True
            self._cond_.notify_all()

    def __reduce__(self) -> Any:
        raise TypeError("a MemoryStore cannot be pickled (passed to another process): it lives in one process, whose "
                        "threads share it; between processes use a TCPStore or a FileStore")

    def set(self, key: str, value: Value) -> None:
        key, value = _check_key(key), _to_bytes(value)
        with self._cond:
            self._table.data[key] = value
            self._cond.notify_all()

    def _wait_locked(self, keys: List[str], timeout: float) -> None:
        if not self._cond.wait_for(lambda: self._closed or not self._table.missing(keys), timeout):
            raise _timeout_error(keys, timeout, missing=self._table.missing(keys))
        self._check_usable()  # closed while it waited

    def get(self, key: str, timeout: Optional[Seconds] = None) -> bytes:
        key = _check_key(key)
        timeout = _check_timeout(timeout, self.timeout)
        with self._cond:
            self._wait_locked([key], timeout)
            return self._table.data[key]

    def add(self, key: str, amount: int) -> int:
        key, amount = _check_key(key), _check_amount(amount)
        with self._cond:
            value = self._table.add(key, amount)
            self._cond.notify_all()
            return value

    def wait(self, keys: Keys, timeout: Optional[Seconds] = None) -> None:
        keys = _check_keys(keys)
        timeout = _check_timeout(timeout, self.timeout)
        with self._cond:
            self._wait_locked(keys, timeout)

    def multi_get(self, keys: Keys, timeout: Optional[Seconds] = None) -> List[bytes]:
        keys = _check_keys(keys)
        timeout = _check_timeout(timeout, self.timeout)
        with self._cond:
            self._wait_locked(keys, timeout)
            return [self._table.data[k] for k in keys]

    def compare_set(self, key: str, expected: Value, desired: Value) -> bytes:
        key = _check_key(key)
        expected, desired = _to_bytes(expected, "expected value"), _to_bytes(desired, "desired value")
        with self._cond:
            value = self._table.compare_set(key, expected, desired)
            self._cond.notify_all()
            return value

    def append(self, key: str, value: Value) -> int:
        key, data = _append_args(key, value)
        with self._cond:
            n = self._table.append(key, data)
            self._cond.notify_all()
            return n

    def wait_size(self, key: str, size: int, timeout: Optional[Seconds] = None) -> bytes:
        key, size = _check_key(key), _check_size(size)
        t = _check_timeout(timeout, self.timeout)
        with self._cond:
            if not self._cond.wait_for(lambda: self._closed or (len(self._table.data.get(key, b"")) >= size
                                                                and key in self._table.data), t):
                raise _size_timeout(key, size, t)
            self._check_usable()  # closed while it waited
            return self._table.data[key]

    def delete(self, key: str) -> bool:
        key = _check_key(key)
        with self._cond:
            return self._table.data.pop(key, None) is not None

    def check(self, keys: Keys) -> bool:
        keys = _check_keys(keys)
        with self._cond:
            return not self._table.missing(keys)

    def num_keys(self) -> int:
        with self._cond:
            return len(self._table.data)

    def list_keys(self, prefix: str = "") -> List[str]:
        prefix = _check_key(prefix)
        with self._cond:
            return self._table.list_keys(prefix)

    def __repr__(self) -> str:
        return f"MemoryStore(num_keys={len(self._table.data)})"
