"""The store protocol: :class:`Store`, the :class:`PrefixStore` view, and what every store shares.

Semantics (those of torch's c10d stores): keys are ``str``; values are ``bytes`` (``str`` values are
UTF-8 encoded); :meth:`Store.add` keeps a counter as the decimal ASCII text of an int64 (a missing
key counts as 0); :meth:`Store.compare_set` swaps only when the current value equals ``expected``,
treats a missing key as matching an empty ``expected``, and returns the value after the operation
(``expected`` itself when the key is missing and ``expected`` is not empty).

Every blocking call takes ``timeout`` in seconds (``None``: the store's ``timeout`` attribute; 0: do
not wait) and raises :class:`~pycoll.errors.StoreTimeout` naming the key(s) and the time waited.
Other failures raise :class:`~pycoll.errors.StoreError`; a refused token raises
:class:`~pycoll.errors.StoreAuthError`. Every store is safe to use from several threads at once (a
blocked ``get`` in one thread does not delay another thread's calls).
"""

from __future__ import annotations

import abc
import re
import time
from datetime import timedelta
from typing import Any, Dict, Iterable, List, Optional, Sequence, Tuple, TypeVar, Union

from .. import _settings
from .._settings import Seconds
from ..errors import NotSupported, StoreError, StoreTimeout

_S = TypeVar("_S", bound="Store")

__all__ = ["Store", "PrefixStore", "DEFAULT_TIMEOUT", "Value", "Keys"]

#: Default timeout of blocking store calls, in seconds (torch's stores use the same).
DEFAULT_TIMEOUT = 300.0

_INT64_MIN, _INT64_MAX = -(1 << 63), (1 << 63) - 1

Value = Union[bytes, bytearray, memoryview, str]
Keys = Union[str, Iterable[str]]


# --------------------------------------------------------------------------------------------------
# argument checking shared by every store


_COUNTER = re.compile(rb"-?[0-9]+")


def _check_key(key: Any) -> str:
    if not isinstance(key, str):
        raise TypeError(f"store keys must be str, got {type(key).__name__}")
    if not key.isascii():  # every store keeps keys as UTF-8, which a lone surrogate has no form in
        try:
            key.encode("utf-8")
        except UnicodeEncodeError as e:
            raise ValueError(f"store key {key!r} is no valid text (UTF-8 cannot hold {e.object[e.start:e.end]!r})") \
                from None
    return key


def _check_keys(keys: Any) -> List[str]:
    if isinstance(keys, str):
        return [keys]
    if isinstance(keys, (bytes, bytearray)):
        raise TypeError("store keys must be str, got bytes")
    return [_check_key(k) for k in keys]


def _append_args(key: Any, value: Any) -> Tuple[str, bytes]:
    """``append``'s key and value, checked: a str key, and a value of at least one byte."""
    key, data = _check_key(key), _to_bytes(value)
    if not data:
        raise ValueError("append() needs a non-empty value")
    return key, data


def _to_bytes(value: Any, what: str = "value") -> bytes:
    if isinstance(value, bytes):
        return value
    if isinstance(value, str):
        return value.encode("utf-8")
    if isinstance(value, (bytearray, memoryview)):
        return bytes(value)
    raise TypeError(f"store {what} must be bytes or str, got {type(value).__name__}")


def _check_amount(amount: Any) -> int:
    if isinstance(amount, bool) or not isinstance(amount, int):
        raise TypeError(f"add() amount must be an int, got {type(amount).__name__}")
    if not _INT64_MIN <= amount <= _INT64_MAX:
        raise ValueError(f"add() amount {amount} does not fit in int64")
    return amount


def _check_timeout(timeout: Any, default: float, what: str = "timeout") -> float:
    if timeout is None:
        timeout = default
    if isinstance(timeout, timedelta):
        timeout = timeout.total_seconds()
    return _settings.seconds(timeout, what, positive=False)


def _check_size(size: Any) -> int:
    if isinstance(size, bool) or not isinstance(size, int):
        raise TypeError(f"wait_size() size must be an int, got {type(size).__name__}")
    if not 0 <= size <= _INT64_MAX:
        raise ValueError(f"wait_size() size must be in [0, 2**63), got {size}")
    return size


POLL_FIRST, POLL_MAX = 0.001, 0.05  # a polling wait's first pause, doubling up to the last


def _pause(delay: float, left: float, limit: float = POLL_MAX) -> float:
    """Sleep ``delay`` between two polls of a store's waiting loop (at most ``left``, what remains of its timeout);
    returns the next pause: doubled, at most ``limit``."""
    time.sleep(min(delay, left))
    return min(delay * 2, limit)


def _size_timeout(key: str, size: int, timeout: float, where: str = "") -> StoreTimeout:
    return StoreTimeout(f"timed out after {timeout:g} s waiting for key {key!r} to hold {size} bytes{where}",
                        keys=[key], missing=[key], timeout=timeout)


def _timeout_error(keys: Sequence[str], timeout: float, where: str = "", missing: Sequence[str] = ()) -> StoreTimeout:
    missing = list(missing) or list(keys)
    what = f"key {missing[0]!r}" if len(missing) == 1 else f"keys {missing!r}"
    if len(keys) > len(missing):
        what += f" (of {len(keys)} waited for)"
    return StoreTimeout(f"timed out after {timeout:g} s waiting for {what}{where}", keys=list(keys), missing=missing,
                        timeout=timeout)


# --------------------------------------------------------------------------------------------------
# the protocol


class Store(abc.ABC):
    """A key-value store shared by the ranks of a job.

    Attributes:
        timeout: default timeout of blocking calls, in seconds.
    """

    timeout: float = DEFAULT_TIMEOUT

    @abc.abstractmethod
    def set(self, key: str, value: Value) -> None:
        """Set ``key`` to ``value`` (bytes, or str encoded as UTF-8), waking every waiter on it."""

    def set_nowait(self, key: str, value: Value) -> None:
        """:meth:`set`, without waiting for the store's answer where the transport allows it: the
        request is on its way (in the kernel's buffers: it arrives even if this process stops or
        dies right after) when this returns, and a later request of this client sees its effect. An
        error the store answers later is logged, not raised. Here: :meth:`set`."""
        self.set(key, value)

    @abc.abstractmethod
    def get(self, key: str, timeout: Optional[Seconds] = None) -> bytes:
        """Return the value of ``key``, waiting up to ``timeout`` seconds for it to be set.

        Raises :class:`StoreTimeout` if the key does not exist when the timeout expires.
        """

    @abc.abstractmethod
    def add(self, key: str, amount: int) -> int:
        """Add ``amount`` to the int64 counter ``key`` (missing: 0) and return the new value.

        Raises :class:`StoreError` if ``key`` holds something other than a decimal integer.
        """

    @abc.abstractmethod
    def wait(self, keys: Keys, timeout: Optional[Seconds] = None) -> None:
        """Wait until every key in ``keys`` exists; :class:`StoreTimeout` names the missing ones."""

    @abc.abstractmethod
    def compare_set(self, key: str, expected: Value, desired: Value) -> bytes:
        """Set ``key`` to ``desired`` if its value is ``expected``; return the value afterwards.

        A missing key matches ``expected == b""`` (then it is created). When the key is missing and
        ``expected`` is not empty nothing is stored and ``expected`` is returned (torch's semantics).
        """

    @abc.abstractmethod
    def delete(self, key: str) -> bool:
        """Delete ``key``; return whether it existed."""

    @abc.abstractmethod
    def check(self, keys: Keys) -> bool:
        """Return whether every key in ``keys`` exists, without waiting."""

    @abc.abstractmethod
    def num_keys(self) -> int:
        """Return the number of keys in the store (in a :class:`PrefixStore`: under its prefix)."""

    def list_keys(self, prefix: str = "") -> List[str]:
        """Return the sorted keys that start with ``prefix``."""
        raise NotSupported("list_keys", library=type(self).__name__)

    def multi_get(self, keys: Keys, timeout: Optional[Seconds] = None) -> List[bytes]:
        """Return the values of ``keys``, waiting up to ``timeout`` seconds for all of them."""
        keys = _check_keys(keys)
        timeout = _check_timeout(timeout, self.timeout)
        self.wait(keys, timeout)
        return [self.get(k, 0) for k in keys]

    def append(self, key: str, value: Value) -> int:
        """Append ``value`` to the bytes of ``key`` (a missing key starts empty); return the new length.

        Atomic, and wakes the waiters on ``key``. This generic version is a compare-and-set loop (a
        store with a native append overrides it); two identical appends racing from the same old
        value may then land once, so give each writer's records something of its own (a slot).
        """
        key, data = _append_args(key, value)
        while True:
            try:
                old = self.get(key, 0)
            except StoreTimeout:
                old = b""
            new = old + data
            if self.compare_set(key, old, new) == new:
                return len(new)

    def append_get(self, key: str, value: Value, wait_key: str, timeout: Optional[Seconds] = None) -> bytes:
        """:meth:`append` ``value`` to ``key``, then return the value of ``wait_key`` once it exists, as
        :meth:`get` does (:class:`StoreTimeout` after ``timeout`` seconds; the append stays made).

        A vote and the wait for the decision it leads to, in one request on a store with a native
        form (the TCP store); this generic version makes the two calls.
        """
        wait_key = _check_key(wait_key)  # bad arguments raise before anything is appended
        t = _check_timeout(timeout, self.timeout)
        self.append(key, value)
        return self.get(wait_key, t)

    def wait_size(self, key: str, size: int, timeout: Optional[Seconds] = None) -> bytes:
        """Return the value of ``key`` once it holds at least ``size`` bytes (``append`` makes it grow),
        waiting up to ``timeout`` seconds: one request however many writers append, instead of one
        poll per writer. :class:`StoreTimeout` names the key and the size.

        This generic version polls (a store with a native wait overrides it).
        """
        key = _check_key(key)
        size = _check_size(size)
        t = _check_timeout(timeout, self.timeout)
        deadline = time.monotonic() + t
        delay = POLL_FIRST
        while True:
            left = deadline - time.monotonic()
            try:
                value = self.get(key, max(0.0, min(left, POLL_MAX)))
                if len(value) >= size:
                    return value
            except StoreTimeout:
                pass
            left = deadline - time.monotonic()
            if left <= 0:
                raise _size_timeout(key, size, t)
            delay = _pause(delay, left)

    def close(self) -> None:  # noqa: B027 -- a no-op by default: a store with nothing to release keeps it
        """Release the store's resources (connections, files). Further calls raise StoreError."""

    def close_idle(self) -> None:  # noqa: B027 -- a no-op by default: a store that keeps no connections
        """Close what the store keeps open between calls (a client's idle connections); it stays usable, a later call
        opens what it needs. For a store kept only for a late call (see :meth:`Watchdog.comm_closed`)."""

    def __enter__(self: _S) -> _S:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


class PrefixStore(Store):
    """A view of ``store`` in which every key is prefixed with ``prefix``.

    Views nest (``PrefixStore(PrefixStore(s, "a/"), "b/")`` uses ``"a/b/"``). Closing a view does not
    close the underlying store. :meth:`num_keys` counts only the keys under the prefix.
    """

    store: Store
    prefix: str

    def __init__(self, store: Store, prefix: str) -> None:
        if not isinstance(store, Store):
            raise TypeError(f"PrefixStore needs a pycoll Store, got {type(store).__name__} (see wrap_torch_store)")
        _check_key(prefix)
        if isinstance(store, PrefixStore):
            prefix = store.prefix + prefix
            store = store.store
        self.store = store
        self.prefix = prefix

    @property
    def root(self) -> Store:
        """The innermost store under this view (never a :class:`PrefixStore`): where unprefixed keys live."""
        store = self.store
        while isinstance(store, PrefixStore):
            store = store.store
        return store

    @property
    def timeout(self) -> float:
        return self.store.timeout

    @timeout.setter
    def timeout(self, value: float) -> None:
        self.store.timeout = _check_timeout(value, DEFAULT_TIMEOUT)

    def _k(self, key: str) -> str:
        return self.prefix + _check_key(key)

    def _strip(self, keys: Sequence[str]) -> List[str]:
        n = len(self.prefix)
        return [k[n:] if k.startswith(self.prefix) else k for k in keys]

    def _unprefixed(self, exc: StoreTimeout) -> StoreTimeout:
        keys = self._strip(exc.keys)
        if not keys:
            return exc
        return _timeout_error(keys, exc.timeout or 0.0, f" (under prefix {self.prefix!r})", self._strip(exc.missing))

    def set(self, key: str, value: Value) -> None:
        self.store.set(self._k(key), value)

    def set_nowait(self, key: str, value: Value) -> None:
        self.store.set_nowait(self._k(key), value)

    def get(self, key: str, timeout: Optional[Seconds] = None) -> bytes:
        try:
            return self.store.get(self._k(key), timeout)
        except StoreTimeout as exc:
            raise self._unprefixed(exc) from None

    def add(self, key: str, amount: int) -> int:
        return self.store.add(self._k(key), amount)

    def wait(self, keys: Keys, timeout: Optional[Seconds] = None) -> None:
        try:
            self.store.wait([self._k(k) for k in _check_keys(keys)], timeout)
        except StoreTimeout as exc:
            raise self._unprefixed(exc) from None

    def compare_set(self, key: str, expected: Value, desired: Value) -> bytes:
        return self.store.compare_set(self._k(key), expected, desired)

    def delete(self, key: str) -> bool:
        return self.store.delete(self._k(key))

    def check(self, keys: Keys) -> bool:
        return self.store.check([self._k(k) for k in _check_keys(keys)])

    def num_keys(self) -> int:
        return len(self.store.list_keys(self.prefix))

    def list_keys(self, prefix: str = "") -> List[str]:
        return self._strip(self.store.list_keys(self._k(prefix)))

    def multi_get(self, keys: Keys, timeout: Optional[Seconds] = None) -> List[bytes]:
        try:
            return self.store.multi_get([self._k(k) for k in _check_keys(keys)], timeout)
        except StoreTimeout as exc:
            raise self._unprefixed(exc) from None

    def append(self, key: str, value: Value) -> int:
        return self.store.append(self._k(key), value)

    def append_get(self, key: str, value: Value, wait_key: str, timeout: Optional[Seconds] = None) -> bytes:
        try:
            return self.store.append_get(self._k(key), value, self._k(wait_key), timeout)
        except StoreTimeout as exc:
            raise self._unprefixed(exc) from None

    def wait_size(self, key: str, size: int, timeout: Optional[Seconds] = None) -> bytes:
        try:
            return self.store.wait_size(self._k(key), size, timeout)
        except StoreTimeout as exc:
            raise _size_timeout(_check_key(key), size, exc.timeout or 0.0,
                                f" (under prefix {self.prefix!r})") from None

    def close_idle(self) -> None:
        self.store.close_idle()

    def __repr__(self) -> str:
        return f"PrefixStore({self.store!r}, {self.prefix!r})"


# --------------------------------------------------------------------------------------------------
# the semantics, once


class _Table:
    """A dict with the store semantics; callers do the locking and the waiting."""

    def __init__(self) -> None:
        self.data: Dict[str, bytes] = {}

    def add(self, key: str, amount: int) -> int:
        old = self.data.get(key)
        current = 0
        if old is not None:
            if not _COUNTER.fullmatch(old):  # decimal ASCII only (int() would take "1_000", " +5 ")
                raise StoreError(f"add({key!r}): the key holds {old[:40]!r}, not an integer counter")
            current = int(old)
        new = current + amount
        if not _INT64_MIN <= new <= _INT64_MAX:
            raise StoreError(f"add({key!r}): counter overflows int64 ({current} + {amount})")
        self.data[key] = str(new).encode("ascii")
        return new

    def append(self, key: str, value: bytes) -> int:
        new = self.data.get(key, b"") + value
        self.data[key] = new
        return len(new)

    def compare_set(self, key: str, expected: bytes, desired: bytes) -> bytes:
        old = self.data.get(key)
        if old is None:
            if expected:
                return expected
            self.data[key] = desired
            return desired
        if old == expected:
            self.data[key] = desired
            return desired
        return old

    def missing(self, keys: Iterable[str]) -> List[str]:
        return [k for k in keys if k not in self.data]

    def list_keys(self, prefix: str) -> List[str]:
        return sorted(k for k in self.data if k.startswith(prefix))
