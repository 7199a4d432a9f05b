"""The store protocol over any object with torch's c10d ``Store`` methods; torch is never imported."""

from __future__ import annotations

import atexit
import contextlib
import logging
import os
import threading
import time
from datetime import timedelta
from typing import Any, Callable, Iterator, List, Optional, Sequence

from .._settings import Seconds
from ..errors import NotSupported, StoreError, StoreLost
from .base import (
    DEFAULT_TIMEOUT,
    POLL_FIRST,
    Keys,
    Store,
    Value,
    _append_args,
    _check_amount,
    _check_key,
    _check_keys,
    _check_timeout,
    _pause,
    _timeout_error,
    _to_bytes,
)

__all__ = ["TorchStoreAdapter", "wrap_torch_store"]


_TORCH_METHODS = ("set", "get", "add", "wait", "compare_set", "delete_key", "check", "num_keys")

_log = logging.getLogger("pycoll.store")


# --------------------------------------------------------------------------------------------------
# the process's exit
#
# A daemon thread that is inside a torch call (its GIL released) while the interpreter finalizes dies
# when that call returns: Python ends it with pthread_exit as it takes the GIL back, and the unwinding
# through pybind11's GIL guard (a noexcept destructor) is std::terminate -- SIGABRT, "terminate called
# without an active exception", the process's exit status lost. pycoll's threads (watchdog, elastic,
# node hubs) call the store until the end, so the exit gate below, the last of pycoll's exit handlers,
# lets no thread but the exiting one start a torch call any more and waits for those in flight (each
# one short request: the waits poll).

EXIT_DRAIN = 1.0  # longest wait at exit for the torch calls in flight, seconds
EXIT_PARK = 1.0  # a call another thread tries during the exit waits this long, then raises StoreError


class _ExitGate:
    def __init__(self) -> None:
        self.cond = threading.Condition(threading.Lock())
        self.calls = 0  # torch calls in flight
        self.exiting: Optional[int] = None  # the thread that runs the exit handlers, once they run

    @contextlib.contextmanager
    def call(self) -> Iterator[None]:
        with self.cond:
            refused = self.exiting is not None and self.exiting != threading.get_ident()
            if not refused:
                self.calls += 1
        if refused:
            time.sleep(EXIT_PARK)  # not at once: a thread that retries on errors must not spin
            raise StoreError("the interpreter is exiting: torch store calls from pycoll's threads are refused")
        try:
            yield
        finally:
            with self.cond:
                self.calls -= 1
                if self.calls == 0:
                    self.cond.notify_all()

    def close(self) -> None:
        with self.cond:
            self.exiting = threading.get_ident()
            if not self.cond.wait_for(lambda: self.calls == 0, EXIT_DRAIN):
                _log.debug("store: %d torch store call(s) still in flight at exit", self.calls)


_gate = _ExitGate()
_gate_registered = False
_gate_lock = threading.Lock()


def register_exit_gate() -> None:
    """Make the exit wait for pycoll's torch store calls (idempotent; the first call registers it, so
    that the exit handlers registered later -- the watchdog's reports and dumps -- run before it)."""
    global _gate_registered
    with _gate_lock:
        if not _gate_registered:
            _gate_registered = True
            atexit.register(lambda: _gate.close())


def _new_gate_after_fork() -> None:
    global _gate, _gate_lock
    _gate, _gate_lock = _ExitGate(), threading.Lock()  # no thread was inherited, nor a call in flight


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_new_gate_after_fork)


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

    def __init__(self, store: Any, timeout: Optional[Seconds] = None) -> None:
        missing = [m for m in _TORCH_METHODS if not callable(getattr(store, m, None))]
        if missing:
            raise TypeError(f"{type(store).__name__} is not a torch-style store: it lacks {', '.join(missing)}")
        self.torch_store = store
        if timeout is None:
            t = getattr(store, "timeout", None)
            timeout = t.total_seconds() if isinstance(t, timedelta) else DEFAULT_TIMEOUT
        self.timeout = _check_timeout(timeout, DEFAULT_TIMEOUT)
        self._local = threading.local()
        self._closed = False
        self._lost = False  # a call found the server gone: no new connection (a clone) is tried for it
        self._lost_at = 0.0  # when: calls fail at once for _retry_in seconds (each of torch's logs a warning)
        self._retry_in = self.LOST_RETRY
        register_exit_gate()

    def __repr__(self) -> str:
        return f"TorchStoreAdapter({self.torch_store!r})"

    def _blocking_store(self) -> Any:
        self._check_open()
        clone = getattr(self._local, "store", None)
        if clone is None:
            clone = self.torch_store
            if callable(getattr(self.torch_store, "clone", None)) and not self._lost:
                # a clone connects anew, and torch retries a refused connection for the store's whole timeout:
                # first one request on the existing connection, which fails at once when the server is gone
                self._run("check", lambda: self.torch_store.check(["pycoll/clone-probe"]))
                with _gate.call():
                    try:
                        clone = self.torch_store.clone()
                    except Exception:  # a store that cannot clone: share the original
                        clone = self.torch_store
            self._local.store = clone
        return clone

    def _check_open(self) -> None:
        if self._closed:
            raise StoreError(f"the adapter of {type(self.torch_store).__name__} is closed")

    #: seconds a lost server is not asked again (torch logs a warning with a backtrace for each failed call), doubled
    #: at each try that finds it still gone, up to LOST_RETRY_MAX (an idle rank's heartbeats asked it every 10 s,
    #: logging a C++ backtrace each time, for as long as the rank lived)
    LOST_RETRY = 10.0
    LOST_RETRY_MAX = 300.0

    def _run(self, what: str, fn: Callable[[], Any], keys: Sequence[str] = (), timeout: float = 0.0) -> Any:
        self._check_open()
        if self._lost and time.monotonic() - self._lost_at < self._retry_in:
            raise StoreLost(f"{what}: the {type(self.torch_store).__name__}'s server was lost "
                            f"{time.monotonic() - self._lost_at:.1f} s ago (asked again {self._retry_in:g} s after)")
        try:
            with _gate.call():
                result = fn()
            self._lost = False
            return result
        except StoreError:
            raise
        except (TypeError, ValueError) as exc:
            if isinstance(exc, ValueError) and what == "add":
                raise StoreError(f"add({keys[0]!r}): {exc}") from exc
            raise
        except Exception as exc:  # torch raises DistStoreError (a RuntimeError) and friends
            text = str(exc).lower()
            if "timeout" in type(exc).__name__.lower() or "timeout" in text or "timed out" in text:
                raise _timeout_error(list(keys), timeout, f" in {type(self.torch_store).__name__}") from exc
            if any(c.__name__ == "DistNetworkError" for c in type(exc).__mro__):  # its server is gone (or unreachable)
                if not self._lost:
                    _log.warning("the %s's server cannot be reached (%s): its calls fail at once for %g s, then "
                                 "longer each time it is still gone (up to %g s)", type(self.torch_store).__name__,
                                 str(exc).splitlines()[0][:200], self.LOST_RETRY, self.LOST_RETRY_MAX)
                    self._retry_in = self.LOST_RETRY
                else:
                    self._retry_in = min(self.LOST_RETRY_MAX, 2 * self._retry_in)
                self._lost, self._lost_at = True, time.monotonic()
                raise StoreLost(f"{what}: lost the connection to the {type(self.torch_store).__name__}'s server: "
                                f"{exc}") from exc
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
            delay = _pause(delay, left)

    def _has(self, store: Any, key: str, timeout: float) -> bool:
        return bool(self._run("wait", lambda: store.check([key]), [key], timeout))

    def set(self, key: str, value: Value) -> None:
        key, value = _check_key(key), _to_bytes(value)
        self._run("set", lambda: self.torch_store.set(key, value))

    def get(self, key: str, timeout: Optional[Seconds] = None) -> bytes:
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

    def wait(self, keys: Keys, timeout: Optional[Seconds] = None) -> None:
        keys = _check_keys(keys)
        t = _check_timeout(timeout, self.timeout)
        if t == 0:
            if not self.check(keys):
                raise _timeout_error(keys, 0.0, f" in {type(self.torch_store).__name__}",
                                     [k for k in keys if not self.check([k])])
            return
        self._wait(keys, t)

    def multi_get(self, keys: Keys, timeout: Optional[Seconds] = None) -> List[bytes]:
        """Poll until every key exists, then read them in one request (torch's ``multi_get``) where the
        torch store has it."""
        keys = _check_keys(keys)
        t = _check_timeout(timeout, self.timeout)
        self.wait(keys, t)
        fn = getattr(self.torch_store, "multi_get", None)
        if not keys or not callable(fn):
            return [self.get(k, 0) for k in keys]
        return [bytes(v) for v in self._run("multi_get", lambda: fn(keys), keys, t)]

    def compare_set(self, key: str, expected: Value, desired: Value) -> bytes:
        key = _check_key(key)
        expected, desired = _to_bytes(expected, "expected value"), _to_bytes(desired, "desired value")
        return bytes(self._run("compare_set", lambda: self.torch_store.compare_set(key, expected, desired), [key]))

    def append(self, key: str, value: Value) -> int:
        """torch's native ``append`` where the store has it (the generic compare-and-set loop may lose one of two
        identical appends); the length returned is the key's just after (later appends of others may be in it)."""
        key, data = _append_args(key, value)
        fn = getattr(self.torch_store, "append", None)
        if not callable(fn):
            return super().append(key, data)
        self._run("append", lambda: fn(key, data), [key])
        return len(self.get(key, 0))

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
        """Stop using the torch store: further calls raise :class:`StoreError` (a wait in another thread at
        its next poll) and the per-thread clones are released. The torch store itself is the caller's and
        stays open (torch stores close when garbage collected)."""
        self._closed = True
        self._local = threading.local()


def wrap_torch_store(store: Any, timeout: Optional[Seconds] = None) -> Store:
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
