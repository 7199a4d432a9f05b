"""Key-value stores: how ranks find each other and agree on things outside the collectives.

One small protocol, :class:`Store`, with four implementations and one view:

* :class:`TCPStoreServer` / :class:`TCPStore` -- pycoll's embedded TCP store. The server runs in a
  background thread of the process that hosts it (``pycoll-run`` hosts it, so a rank's death never
  takes the store with it) or standalone (``python -m pycoll.store``). Clients authenticate with a
  shared secret token by challenge-response; blocking waits are served by the server, not polled.
* :class:`FileStore` -- the same protocol over a file, for processes on one machine or a shared
  filesystem (POSIX ``fcntl`` locks).
* :class:`MemoryStore` -- in-process (threads only); the reference for the semantics.
* :class:`TorchStoreAdapter` -- any object with torch's c10d ``Store`` methods (``wrap_torch_store``).
* :class:`PrefixStore` -- a namespace view of another store (per communicator, per generation).

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

TCP wire protocol (version 1; big-endian):

* Handshake. Server -> client: ``b"PYCSTORE"``, u16 version, 32-byte server nonce. Client -> server:
  ``b"PYCSTORE"``, u16 version, 32-byte client nonce, HMAC-SHA256(token, ``b"client"`` + server
  nonce + client nonce). Server -> client: u8 status (0 accepted, 1 bad token, 2 bad version) and
  HMAC-SHA256(token, ``b"server"`` + server nonce + client nonce), which the client checks in turn.
  The token never crosses the wire; digests are compared in constant time.
* Then request/response frames: u32 payload length, then the payload. A request payload is u8 op
  followed by arguments, each a u32 length and that many bytes (ints are ``!q``, timeouts ``!d``);
  a response payload is u8 status (0 ok, 1 timeout, 2 error) followed by arguments the same way.
  Frames longer than the server's ``max_message`` (64 MiB by default), malformed payloads and stalled
  handshakes close that connection only.
"""

from __future__ import annotations

import abc
import argparse
import contextlib
import errno
import fcntl
import hashlib
import heapq
import hmac
import itertools
import logging
import math
import os
import secrets
import selectors
import socket
import struct
import sys
import threading
import time
from datetime import timedelta
from typing import Any, Callable, Dict, Iterable, Iterator, List, Optional, Sequence, Set, Tuple, Union

from .errors import NotSupported, StoreAuthError, StoreError, StoreTimeout

__all__ = [
    "Store",
    "PrefixStore",
    "MemoryStore",
    "TCPStore",
    "TCPStoreServer",
    "FileStore",
    "TorchStoreAdapter",
    "wrap_torch_store",
    "DEFAULT_TIMEOUT",
    "DEFAULT_MAX_MESSAGE",
]

log = logging.getLogger("pycoll.store")

#: Default timeout of blocking store calls, in seconds (torch's stores use the same).
DEFAULT_TIMEOUT = 300.0
#: Default limit on one TCP store message (request or response), in bytes.
DEFAULT_MAX_MESSAGE = 64 << 20

_INT64_MIN, _INT64_MAX = -(1 << 63), (1 << 63) - 1

Value = Union[bytes, bytearray, memoryview, str]
Keys = Union[str, Iterable[str]]


# --------------------------------------------------------------------------------------------------
# argument checking shared by every store


def _check_key(key: Any) -> str:
    if not isinstance(key, str):
        raise TypeError(f"store keys must be str, got {type(key).__name__}")
    return key


def _check_keys(keys: Any) -> List[str]:
    if isinstance(keys, str):
        return [keys]
    if isinstance(keys, (bytes, bytearray)):
        raise TypeError("store keys must be str, got bytes")
    return [_check_key(k) for k in keys]


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


def _check_timeout(timeout: Any, default: float) -> float:
    if timeout is None:
        timeout = default
    if isinstance(timeout, timedelta):
        timeout = timeout.total_seconds()
    if isinstance(timeout, bool) or not isinstance(timeout, (int, float)):
        raise TypeError(f"timeout must be a number of seconds, got {type(timeout).__name__}")
    timeout = float(timeout)
    if not math.isfinite(timeout) or timeout < 0:
        raise ValueError(f"timeout must be a finite number of seconds >= 0, got {timeout}")
    return timeout


def _timeout_error(keys: Sequence[str], timeout: float, where: str = "", missing: Sequence[str] = ()) -> StoreTimeout:
    missing = list(missing) or list(keys)
    what = f"key {missing[0]!r}" if len(missing) == 1 else f"keys {missing!r}"
    if len(keys) > len(missing):
        what += f" (of {len(keys)} waited for)"
    exc = StoreTimeout(f"timed out after {timeout:g} s waiting for {what}{where}")
    exc.keys = list(keys)  # type: ignore[attr-defined]
    exc.missing = missing  # type: ignore[attr-defined]
    exc.timeout = timeout  # type: ignore[attr-defined]
    return exc


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

    @abc.abstractmethod
    def get(self, key: str, timeout: Optional[float] = None) -> bytes:
        """Return the value of ``key``, waiting up to ``timeout`` seconds for it to be set.

        Raises :class:`StoreTimeout` if the key does not exist when the timeout expires.
        """

    @abc.abstractmethod
    def add(self, key: str, amount: int) -> int:
        """Add ``amount`` to the int64 counter ``key`` (missing: 0) and return the new value.

        Raises :class:`StoreError` if ``key`` holds something other than a decimal integer.
        """

    @abc.abstractmethod
    def wait(self, keys: Keys, timeout: Optional[float] = None) -> None:
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

    def multi_get(self, keys: Keys, timeout: Optional[float] = None) -> List[bytes]:
        """Return the values of ``keys``, waiting up to ``timeout`` seconds for all of them."""
        keys = _check_keys(keys)
        timeout = _check_timeout(timeout, self.timeout)
        self.wait(keys, timeout)
        return [self.get(k, 0) for k in keys]

    def close(self) -> None:
        """Release the store's resources (connections, files). Further calls raise StoreError."""

    def __enter__(self) -> "Store":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


class PrefixStore(Store):
    """A view of ``store`` in which every key is prefixed with ``prefix``.

    Views nest (``PrefixStore(PrefixStore(s, "a/"), "b/")`` uses ``"a/b/"``). Closing a view does not
    close the underlying store. :meth:`num_keys` counts only the keys under the prefix.
    """

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
    def timeout(self) -> float:  # type: ignore[override]
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
        keys = self._strip(getattr(exc, "keys", []))
        if not keys:
            return exc
        new = _timeout_error(keys, getattr(exc, "timeout", 0.0), f" (under prefix {self.prefix!r})",
                             self._strip(getattr(exc, "missing", [])))
        return new

    def set(self, key: str, value: Value) -> None:
        self.store.set(self._k(key), value)

    def get(self, key: str, timeout: Optional[float] = None) -> bytes:
        try:
            return self.store.get(self._k(key), timeout)
        except StoreTimeout as exc:
            raise self._unprefixed(exc) from None

    def add(self, key: str, amount: int) -> int:
        return self.store.add(self._k(key), amount)

    def wait(self, keys: Keys, timeout: Optional[float] = None) -> None:
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

    def multi_get(self, keys: Keys, timeout: Optional[float] = None) -> List[bytes]:
        try:
            return self.store.multi_get([self._k(k) for k in _check_keys(keys)], timeout)
        except StoreTimeout as exc:
            raise self._unprefixed(exc) from None

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
            try:
                current = int(old.decode("ascii").strip())
            except (UnicodeDecodeError, ValueError):
                raise StoreError(f"add({key!r}): the key holds {old[:40]!r}, not an integer counter") from None
        new = current + amount
        if not _INT64_MIN <= new <= _INT64_MAX:
            raise StoreError(f"add({key!r}): counter overflows int64 ({current} + {amount})")
        self.data[key] = str(new).encode("ascii")
        return new

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


class MemoryStore(Store):
    """A store held in this process; threads share it. Useful for one-process jobs and tests."""

    def __init__(self, timeout: float = DEFAULT_TIMEOUT) -> None:
        self.timeout = _check_timeout(timeout, DEFAULT_TIMEOUT)
        self._table = _Table()
        self._cond = threading.Condition()

    def set(self, key: str, value: Value) -> None:
        key, value = _check_key(key), _to_bytes(value)
        with self._cond:
            self._table.data[key] = value
            self._cond.notify_all()

    def _wait_locked(self, keys: List[str], timeout: float) -> None:
        if not self._cond.wait_for(lambda: not self._table.missing(keys), timeout):
            raise _timeout_error(keys, timeout, missing=self._table.missing(keys))

    def get(self, key: str, timeout: Optional[float] = None) -> bytes:
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

    def wait(self, keys: Keys, timeout: Optional[float] = None) -> None:
        keys = _check_keys(keys)
        timeout = _check_timeout(timeout, self.timeout)
        with self._cond:
            self._wait_locked(keys, timeout)

    def multi_get(self, keys: Keys, timeout: Optional[float] = None) -> List[bytes]:
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


# --------------------------------------------------------------------------------------------------
# TCP wire format


_MAGIC = b"PYCSTORE"
_VERSION = 1
_NONCE = 32
_MAC = 32
_SERVER_HELLO = struct.Struct("!8sH32s")  # magic, version, server nonce
_CLIENT_HELLO = struct.Struct("!8sH32s32s")  # magic, version, client nonce, mac
_SERVER_REPLY = struct.Struct("!B32s")  # status, mac
_LEN = struct.Struct("!I")
_Q = struct.Struct("!q")
_D = struct.Struct("!d")

_AUTH_OK, _AUTH_BAD_TOKEN, _AUTH_BAD_VERSION = 0, 1, 2

(_OP_SET, _OP_GET, _OP_ADD, _OP_WAIT, _OP_CAS, _OP_DELETE, _OP_CHECK, _OP_NUM_KEYS, _OP_MULTI_GET,
 _OP_LIST_KEYS) = range(1, 11)
_OP_NAMES = {
    _OP_SET: "set", _OP_GET: "get", _OP_ADD: "add", _OP_WAIT: "wait", _OP_CAS: "compare_set",
    _OP_DELETE: "delete", _OP_CHECK: "check", _OP_NUM_KEYS: "num_keys", _OP_MULTI_GET: "multi_get",
    _OP_LIST_KEYS: "list_keys",
}
_ST_OK, _ST_TIMEOUT, _ST_ERROR = 0, 1, 2


class _ProtocolError(Exception):
    """A peer sent something that is not a valid message; the connection must be closed."""


def _mac(token: bytes, role: bytes, server_nonce: bytes, client_nonce: bytes) -> bytes:
    return hmac.new(token, role + server_nonce + client_nonce, hashlib.sha256).digest()


def _encode(head: int, args: Sequence[bytes]) -> bytes:
    parts = [b"", bytes((head,))]
    for a in args:
        parts.append(_LEN.pack(len(a)))
        parts.append(a)
    body_len = sum(len(p) for p in parts)
    parts[0] = _LEN.pack(body_len)
    return b"".join(parts)


def _decode(payload: memoryview) -> Tuple[int, List[bytes]]:
    """Split a frame payload into (head byte, arguments); _ProtocolError if it is malformed."""
    if len(payload) < 1:
        raise _ProtocolError("empty message")
    head = payload[0]
    args = []
    pos, end = 1, len(payload)
    while pos < end:
        if end - pos < 4:
            raise _ProtocolError("truncated argument length")
        (n,) = _LEN.unpack_from(payload, pos)
        pos += 4
        if n > end - pos:
            raise _ProtocolError(f"argument of {n} bytes overruns the message")
        args.append(bytes(payload[pos:pos + n]))
        pos += n
    return head, args


def _token_bytes(token: Union[str, bytes, None], what: str) -> bytes:
    if token is None:
        token = os.environ.get("PYCOLL_STORE_TOKEN")
        if not token:
            raise StoreError(f"{what} needs a token: pass token= or set PYCOLL_STORE_TOKEN")
    tok = _to_bytes(token, "token")
    if not tok:
        raise StoreError(f"{what}: the token must not be empty")
    return tok


# --------------------------------------------------------------------------------------------------
# TCP server


class _Conn:
    """Server-side state of one client connection."""

    __slots__ = ("sock", "peer", "inbuf", "outbuf", "authed", "nonce", "waiter", "closed", "opened")

    def __init__(self, sock: socket.socket, peer: Any) -> None:
        self.sock = sock
        self.peer = peer
        self.inbuf = bytearray()
        self.outbuf = bytearray()
        self.authed = False
        self.nonce = secrets.token_bytes(_NONCE)
        self.waiter: Optional[_Waiter] = None
        self.closed = False
        self.opened = time.monotonic()


class _Waiter:
    """A blocked get/wait/multi_get on the server."""

    __slots__ = ("conn", "op", "keys", "missing", "deadline", "timeout", "done")

    def __init__(self, conn: _Conn, op: int, keys: List[str], missing: Set[str], timeout: float) -> None:
        self.conn = conn
        self.op = op
        self.keys = keys
        self.missing = missing
        self.timeout = timeout
        self.deadline = time.monotonic() + timeout
        self.done = False


class TCPStoreServer:
    """The server of pycoll's TCP store.

    Binds at construction (so :attr:`port` is known at once, port 0 picks a free one); serves after
    :meth:`start` (a daemon thread) or in :meth:`serve_forever` (the calling thread) until
    :meth:`close`. Data lives only in this process and is lost when the server closes.

    Args:
        host: address to bind; loopback by default. ``""`` or ``"0.0.0.0"`` binds every interface.
        port: TCP port; 0 picks a free one.
        token: shared secret the clients must know (str or bytes); a random one is made if None
            (read it from :attr:`token`).
        max_message: largest accepted request, in bytes; larger ones close the connection.
        handshake_timeout: seconds a new connection has to authenticate before it is closed.
    """

    def __init__(
        self,
        host: str = "127.0.0.1",
        port: int = 0,
        token: Union[str, bytes, None] = None,
        *,
        max_message: int = DEFAULT_MAX_MESSAGE,
        handshake_timeout: float = 10.0,
        backlog: int = 1024,
    ) -> None:
        if token is None:
            token = secrets.token_hex(32)
        #: the shared secret, as given (or the random one made)
        self.token: Union[str, bytes] = token
        self._token = _token_bytes(token, "TCPStoreServer")
        if max_message < 1024:
            raise ValueError(f"max_message must be at least 1024 bytes, got {max_message}")
        self.max_message = int(max_message)
        self.handshake_timeout = float(handshake_timeout)
        self._sock = self._bind(host, port, backlog)
        self.host = host
        self.port: int = self._sock.getsockname()[1]
        self._table = _Table()
        self._by_key: Dict[str, Set[_Waiter]] = {}
        self._deadlines: List[Tuple[float, int, _Waiter]] = []
        self._seq = itertools.count()
        self._conns: Set[_Conn] = set()
        self._unauthed: Set[_Conn] = set()
        self._sel = selectors.DefaultSelector()
        self._wake_r, self._wake_w = socket.socketpair()
        self._wake_r.setblocking(False)
        self._wake_w.setblocking(False)
        self._stop = False
        self._thread: Optional[threading.Thread] = None
        self._closed = threading.Event()
        self._accept_paused_until = 0.0

    @staticmethod
    def _bind(host: str, port: int, backlog: int) -> socket.socket:
        if not isinstance(port, int) or not 0 <= port <= 65535:
            raise ValueError(f"port must be an int in [0, 65535], got {port!r}")
        try:
            infos = socket.getaddrinfo(host or None, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
        except socket.gaierror as exc:
            raise StoreError(f"cannot resolve store address {host!r}: {exc}") from None
        last: Optional[OSError] = None
        for family, socktype, proto, _, addr in infos:
            sock = socket.socket(family, socktype, proto)
            try:
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                sock.bind(addr)
                sock.listen(backlog)
                sock.setblocking(False)
                return sock
            except OSError as exc:
                sock.close()
                last = exc
        raise StoreError(f"cannot listen on {host or '*'}:{port}: {last}")

    @property
    def address(self) -> Tuple[str, int]:
        """``(host, port)`` the server listens on."""
        return (self.host, self.port)

    def client(self, **kwargs: Any) -> "TCPStore":
        """A :class:`TCPStore` connected to this server over loopback (or its bound address)."""
        host = self.host if self.host not in ("", "0.0.0.0", "::") else "127.0.0.1"
        return TCPStore(host, self.port, self.token, **kwargs)

    # ---- lifecycle

    def start(self) -> "TCPStoreServer":
        """Serve in a daemon thread; returns self."""
        if self._thread is not None:
            raise StoreError("TCPStoreServer already started")
        self._thread = threading.Thread(target=self.serve_forever, name="pycoll-store-server", daemon=True)
        self._thread.start()
        return self

    def serve_forever(self) -> None:
        """Serve in the calling thread until :meth:`close` is called (from another thread)."""
        self._sel.register(self._sock, selectors.EVENT_READ, None)
        self._sel.register(self._wake_r, selectors.EVENT_READ, None)
        log.debug("store server listening on %s:%d", self.host, self.port)
        try:
            while not self._stop:
                timeout = self._next_timeout()
                for key, events in self._sel.select(timeout):
                    if key.fileobj is self._sock:
                        self._accept()
                    elif key.fileobj is self._wake_r:
                        self._drain_wake()
                    else:
                        conn = key.data
                        if events & selectors.EVENT_WRITE and not conn.closed:
                            self._flush(conn)
                        if events & selectors.EVENT_READ and not conn.closed:
                            self._on_readable(conn)
                self._expire()
        finally:
            self._shutdown()

    def close(self) -> None:
        """Stop serving and close every connection (clients then get StoreError). Idempotent."""
        self._stop = True
        try:
            self._wake_w.send(b"x")
        except OSError:
            pass
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(10.0)
        if self._thread is None:
            self._shutdown()

    def _shutdown(self) -> None:
        if self._closed.is_set():
            return
        self._closed.set()
        for conn in list(self._conns):
            self._close_conn(conn)
        for s in (self._sock, self._wake_r, self._wake_w):
            try:
                self._sel.unregister(s)
            except (KeyError, ValueError):
                pass
            s.close()
        self._sel.close()

    def __enter__(self) -> "TCPStoreServer":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"TCPStoreServer({self.host!r}, {self.port})"

    # ---- loop helpers

    def _next_timeout(self) -> Optional[float]:
        now = time.monotonic()
        nxt: Optional[float] = None
        while self._deadlines and self._deadlines[0][2].done:
            heapq.heappop(self._deadlines)
        if self._deadlines:
            nxt = self._deadlines[0][0]
        if self._unauthed:
            t = min(c.opened for c in self._unauthed) + self.handshake_timeout
            nxt = t if nxt is None else min(nxt, t)
        if self._accept_paused_until:
            nxt = self._accept_paused_until if nxt is None else min(nxt, self._accept_paused_until)
        if nxt is None:
            return None
        return max(0.0, nxt - now)

    def _drain_wake(self) -> None:
        try:
            while self._wake_r.recv(4096):
                pass
        except (BlockingIOError, InterruptedError):
            pass

    def _accept(self) -> None:
        for _ in range(64):
            try:
                sock, peer = self._sock.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError as exc:
                if exc.errno in (errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM):
                    log.warning("store server cannot accept connections (%s); pausing accepts for 0.1 s", exc)
                    self._sel.unregister(self._sock)
                    self._accept_paused_until = time.monotonic() + 0.1
                return
            sock.setblocking(False)
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
            conn = _Conn(sock, peer)
            self._conns.add(conn)
            self._unauthed.add(conn)
            self._sel.register(sock, selectors.EVENT_READ, conn)
            self._send(conn, _SERVER_HELLO.pack(_MAGIC, _VERSION, conn.nonce))

    def _close_conn(self, conn: _Conn) -> None:
        if conn.closed:
            return
        conn.closed = True
        if conn.waiter is not None:
            self._drop_waiter(conn.waiter)
        self._conns.discard(conn)
        self._unauthed.discard(conn)
        try:
            self._sel.unregister(conn.sock)
        except (KeyError, ValueError):
            pass
        conn.sock.close()

    def _send(self, conn: _Conn, data: bytes) -> None:
        if conn.closed:
            return
        if not conn.outbuf:
            try:
                n = conn.sock.send(data)
            except (BlockingIOError, InterruptedError):
                n = 0
            except OSError:
                self._close_conn(conn)
                return
            if n == len(data):
                return
            data = data[n:]
            self._sel.modify(conn.sock, selectors.EVENT_READ | selectors.EVENT_WRITE, conn)
        conn.outbuf += data

    def _flush(self, conn: _Conn) -> None:
        try:
            n = conn.sock.send(conn.outbuf)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            self._close_conn(conn)
            return
        del conn.outbuf[:n]
        if not conn.outbuf:
            self._sel.modify(conn.sock, selectors.EVENT_READ, conn)
            self._process(conn)

    def _on_readable(self, conn: _Conn) -> None:
        try:
            data = conn.sock.recv(1 << 18)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            self._close_conn(conn)
            return
        if not data:
            self._close_conn(conn)
            return
        conn.inbuf += data
        # Input is read even while a request is pending (to notice a closed peer), but a client
        # may have at most one maximal frame queued behind it.
        if len(conn.inbuf) > self.max_message + 2 * _LEN.size + _CLIENT_HELLO.size:
            log.warning("store: closing connection from %s: too much unanswered input", conn.peer)
            self._close_conn(conn)
            return
        self._process(conn)

    def _process(self, conn: _Conn) -> None:
        while not conn.closed and conn.waiter is None and not conn.outbuf:
            if not conn.authed:
                if len(conn.inbuf) < _CLIENT_HELLO.size:
                    return
                self._handshake(conn, bytes(conn.inbuf[:_CLIENT_HELLO.size]))
                del conn.inbuf[:_CLIENT_HELLO.size]
                continue
            if len(conn.inbuf) < _LEN.size:
                return
            (n,) = _LEN.unpack_from(conn.inbuf, 0)
            if n > self.max_message:
                log.warning("store: closing connection from %s: message of %d bytes exceeds the %d-byte limit",
                            conn.peer, n, self.max_message)
                self._send(conn, _encode(_ST_ERROR, [f"message of {n} bytes exceeds the server's limit of "
                                                     f"{self.max_message} bytes".encode()]))
                self._close_conn_after_flush(conn)
                return
            if len(conn.inbuf) < _LEN.size + n:
                return
            payload = memoryview(bytes(conn.inbuf[_LEN.size:_LEN.size + n]))
            del conn.inbuf[:_LEN.size + n]
            try:
                self._dispatch(conn, payload)
            except _ProtocolError as exc:
                log.warning("store: closing connection from %s: %s", conn.peer, exc)
                self._send(conn, _encode(_ST_ERROR, [f"malformed request: {exc}".encode()]))
                self._close_conn_after_flush(conn)
                return

    def _close_conn_after_flush(self, conn: _Conn) -> None:
        """Close ``conn`` after one last non-blocking attempt to send what is queued (a short error)."""
        if conn.outbuf and not conn.closed:
            try:
                conn.sock.send(conn.outbuf)
                conn.sock.shutdown(socket.SHUT_WR)
            except OSError:
                pass
        self._close_conn(conn)

    def _handshake(self, conn: _Conn, hello: bytes) -> None:
        magic, version, client_nonce, mac = _CLIENT_HELLO.unpack(hello)
        if magic != _MAGIC:
            log.warning("store: closing connection from %s: not a pycoll store client", conn.peer)
            self._close_conn(conn)
            return
        if version != _VERSION:
            self._send(conn, _SERVER_REPLY.pack(_AUTH_BAD_VERSION, bytes(_MAC)))
            self._close_conn_after_flush(conn)
            return
        expected = _mac(self._token, b"client", conn.nonce, client_nonce)
        if not hmac.compare_digest(expected, mac):
            log.warning("store: rejected a client from %s: wrong token", conn.peer)
            self._send(conn, _SERVER_REPLY.pack(_AUTH_BAD_TOKEN, bytes(_MAC)))
            self._close_conn_after_flush(conn)
            return
        conn.authed = True
        self._unauthed.discard(conn)
        self._send(conn, _SERVER_REPLY.pack(_AUTH_OK, _mac(self._token, b"server", conn.nonce, client_nonce)))

    # ---- requests

    def _reply(self, conn: _Conn, args: Sequence[bytes], status: int = _ST_OK) -> None:
        frame = _encode(status, args)
        if len(frame) - _LEN.size > self.max_message:
            frame = _encode(_ST_ERROR, [f"the reply ({len(frame)} bytes) exceeds the limit of {self.max_message} "
                                        f"bytes".encode()])
        self._send(conn, frame)

    def _dispatch(self, conn: _Conn, payload: memoryview) -> None:
        op, args = _decode(payload)
        name = _OP_NAMES.get(op)
        if name is None:
            raise _ProtocolError(f"unknown operation {op}")
        try:
            if op == _OP_SET:
                key, value = self._args(args, 2, name)
                self._set(self._key(key), value)
                self._reply(conn, [])
            elif op == _OP_GET:
                key, t = self._args(args, 2, name)
                self._wait(conn, op, [self._key(key)], self._timeout(t))
            elif op == _OP_ADD:
                key, amount = self._args(args, 2, name)
                key_s = self._key(key)
                new = self._table.add(key_s, self._int(amount))
                self._wake(key_s)
                self._reply(conn, [_Q.pack(new)])
            elif op in (_OP_WAIT, _OP_MULTI_GET):
                if not args:
                    raise _ProtocolError(f"{name}: missing timeout")
                self._wait(conn, op, [self._key(k) for k in args[1:]], self._timeout(args[0]))
            elif op == _OP_CAS:
                key, expected, desired = self._args(args, 3, name)
                key_s = self._key(key)
                value = self._table.compare_set(key_s, expected, desired)
                self._wake(key_s)
                self._reply(conn, [value])
            elif op == _OP_DELETE:
                (key,) = self._args(args, 1, name)
                existed = self._table.data.pop(self._key(key), None) is not None
                self._reply(conn, [b"\x01" if existed else b"\x00"])
            elif op == _OP_CHECK:
                ok = not self._table.missing(self._key(k) for k in args)
                self._reply(conn, [b"\x01" if ok else b"\x00"])
            elif op == _OP_NUM_KEYS:
                self._args(args, 0, name)
                self._reply(conn, [_Q.pack(len(self._table.data))])
            elif op == _OP_LIST_KEYS:
                (prefix,) = self._args(args, 1, name)
                self._reply(conn, [k.encode("utf-8") for k in self._table.list_keys(self._key(prefix))])
        except StoreError as exc:
            self._reply(conn, [str(exc).encode("utf-8", "replace")], _ST_ERROR)

    @staticmethod
    def _args(args: List[bytes], n: int, name: str) -> List[bytes]:
        if len(args) != n:
            raise _ProtocolError(f"{name} takes {n} arguments, got {len(args)}")
        return args

    @staticmethod
    def _key(raw: bytes) -> str:
        try:
            return raw.decode("utf-8")
        except UnicodeDecodeError:
            raise _ProtocolError("key is not valid UTF-8") from None

    @staticmethod
    def _int(raw: bytes) -> int:
        if len(raw) != _Q.size:
            raise _ProtocolError("bad integer argument")
        return _Q.unpack(raw)[0]

    @staticmethod
    def _timeout(raw: bytes) -> float:
        if len(raw) != _D.size:
            raise _ProtocolError("bad timeout argument")
        (t,) = _D.unpack(raw)
        if not math.isfinite(t) or t < 0:
            raise _ProtocolError(f"bad timeout {t}")
        return t

    def _set(self, key: str, value: bytes) -> None:
        self._table.data[key] = value
        self._wake(key)

    def _wait(self, conn: _Conn, op: int, keys: List[str], timeout: float) -> None:
        missing = set(self._table.missing(keys))
        if not missing:
            self._answer_wait(conn, op, keys)
            return
        if timeout <= 0:
            self._reply(conn, [k.encode() for k in keys if k in missing], _ST_TIMEOUT)
            return
        w = _Waiter(conn, op, keys, missing, timeout)
        conn.waiter = w
        for k in missing:
            self._by_key.setdefault(k, set()).add(w)
        heapq.heappush(self._deadlines, (w.deadline, next(self._seq), w))

    def _answer_wait(self, conn: _Conn, op: int, keys: List[str]) -> None:
        if op == _OP_WAIT:
            self._reply(conn, [])
        else:
            self._reply(conn, [self._table.data[k] for k in keys])

    def _drop_waiter(self, w: _Waiter) -> None:
        w.done = True
        w.conn.waiter = None
        for k in w.missing:
            s = self._by_key.get(k)
            if s is not None:
                s.discard(w)
                if not s:
                    del self._by_key[k]

    def _wake(self, key: str) -> None:
        waiters = self._by_key.pop(key, None)
        if not waiters:
            return
        for w in waiters:
            if w.done:
                continue
            w.missing.discard(key)
            if w.missing:
                continue
            # a key seen earlier may have been deleted since; wait for it again
            still = set(self._table.missing(w.keys))
            if still:
                w.missing = still
                for k in still:
                    self._by_key.setdefault(k, set()).add(w)
                continue
            self._drop_waiter(w)
            conn = w.conn
            self._answer_wait(conn, w.op, w.keys)
            self._process(conn)

    def _expire(self) -> None:
        now = time.monotonic()
        while self._deadlines and (self._deadlines[0][2].done or self._deadlines[0][0] <= now):
            _, _, w = heapq.heappop(self._deadlines)
            if w.done:
                continue
            missing = [k for k in w.keys if k in w.missing]
            self._drop_waiter(w)
            self._reply(w.conn, [k.encode() for k in missing], _ST_TIMEOUT)
            self._process(w.conn)
        for conn in [c for c in self._unauthed if now - c.opened > self.handshake_timeout]:
            log.warning("store: closing connection from %s: no handshake within %.1f s", conn.peer,
                        self.handshake_timeout)
            self._close_conn(conn)
        if self._accept_paused_until and now >= self._accept_paused_until:
            self._accept_paused_until = 0.0
            self._sel.register(self._sock, selectors.EVENT_READ, None)


# --------------------------------------------------------------------------------------------------
# TCP client


class _ClientConn:
    """One authenticated client connection; used by one thread at a time."""

    def __init__(self, sock: socket.socket, max_message: int) -> None:
        self.sock = sock
        self.max_message = max_message
        self.buf = bytearray()
        self.io_timeout: Optional[float] = None

    def _recv_exact(self, n: int) -> bytes:
        while len(self.buf) < n:
            chunk = self.sock.recv(max(1 << 16, n - len(self.buf)))
            if not chunk:
                raise ConnectionResetError("the store server closed the connection")
            self.buf += chunk
        out = bytes(self.buf[:n])
        del self.buf[:n]
        return out

    def request(self, frame: bytes, io_timeout: float) -> Tuple[int, List[bytes]]:
        if io_timeout != self.io_timeout:
            self.sock.settimeout(io_timeout)
            self.io_timeout = io_timeout
        self.sock.sendall(frame)
        (n,) = _LEN.unpack(self._recv_exact(_LEN.size))
        if n > self.max_message:
            raise _ProtocolError(f"reply of {n} bytes exceeds the client's limit of {self.max_message} bytes")
        return _decode(memoryview(self._recv_exact(n)))

    def close(self, shutdown: bool = True) -> None:
        if shutdown:
            try:
                self.sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
        self.sock.close()


class TCPStore(Store):
    """A client of a :class:`TCPStoreServer`.

    Connects (and authenticates) at construction, retrying refused connections until
    ``connect_timeout`` since ranks may start before the server. Threads share the client: each
    concurrent call uses its own connection from a small pool, so one thread's blocked ``get`` never
    delays another's ``set``. After ``fork`` the child opens its own connections.

    Args:
        host, port: the server's address.
        token: the server's token (str or bytes); ``None`` reads ``PYCOLL_STORE_TOKEN``.
        timeout: default timeout of blocking calls, and how long to wait for any reply, in seconds.
        connect_timeout: how long to keep trying to reach the server, in seconds (default: 60).
        max_message: largest request or reply this client sends or accepts, in bytes.

    Raises:
        StoreTimeout: the server could not be reached within ``connect_timeout``.
        StoreAuthError: the server refused the token (or could not prove it knows it).
        StoreError: anything else that prevents talking to the server.
    """

    #: Extra seconds a client waits for the server's answer beyond a wait's own timeout.
    REPLY_GRACE = 10.0

    def __init__(
        self,
        host: str,
        port: int,
        token: Union[str, bytes, None] = None,
        *,
        timeout: float = DEFAULT_TIMEOUT,
        connect_timeout: float = 60.0,
        max_message: int = DEFAULT_MAX_MESSAGE,
    ) -> None:
        if not isinstance(port, int) or not 0 < port <= 65535:
            raise ValueError(f"store port must be an int in [1, 65535], got {port!r}")
        self.host = host
        self.port = port
        self._token = _token_bytes(token, "TCPStore")
        self.timeout = _check_timeout(timeout, DEFAULT_TIMEOUT)
        self.connect_timeout = _check_timeout(connect_timeout, 60.0)
        self.max_message = int(max_message)
        self._lock = threading.Lock()
        self._idle: List[_ClientConn] = []
        self._busy: Set[_ClientConn] = set()
        self._pid = os.getpid()
        self._closed = False
        #: the server this client hosts (see :meth:`hosting`), else None
        self.server: Optional[TCPStoreServer] = None
        self._release(self._connect())

    @classmethod
    def hosting(
        cls,
        bind: str = "127.0.0.1",
        port: int = 0,
        token: Union[str, bytes, None] = None,
        *,
        max_message: int = DEFAULT_MAX_MESSAGE,
        **kwargs: Any,
    ) -> "TCPStore":
        """Start a :class:`TCPStoreServer` in this process and return a client that owns it.

        Closing the returned client stops the server: every other client then loses the store.
        The server is available as the client's ``server`` attribute.
        """
        server = TCPStoreServer(bind, port, token, max_message=max_message).start()
        try:
            client = server.client(max_message=max_message, **kwargs)
        except BaseException:
            server.close()
            raise
        client.server = server
        return client

    def __reduce__(self) -> Any:
        return (_rebuild_tcp_store, (self.host, self.port, self._token, self.timeout, self.connect_timeout,
                                     self.max_message))

    def __repr__(self) -> str:
        return f"TCPStore({self.host!r}, {self.port})"

    # ---- connections

    def _where(self) -> str:
        return f"{self.host}:{self.port}"

    def _connect(self) -> _ClientConn:
        deadline = time.monotonic() + self.connect_timeout
        delay = 0.01
        last: Optional[BaseException] = None
        while True:
            remaining = deadline - time.monotonic()
            try:
                sock = socket.create_connection((self.host, self.port), timeout=max(0.05, min(remaining, 10.0)))
            except (OSError, socket.gaierror) as exc:
                last = exc
                if time.monotonic() + delay >= deadline:
                    raise StoreTimeout(f"could not connect to the store at {self._where()} within "
                                       f"{self.connect_timeout:g} s (last error: {last})") from None
                time.sleep(delay)
                delay = min(delay * 2, 0.5)
                continue
            try:
                return self._handshake(sock, max(remaining, 5.0))
            except BaseException:
                sock.close()
                raise

    def _handshake(self, sock: socket.socket, timeout: float) -> _ClientConn:
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
        sock.settimeout(min(timeout, 30.0))
        conn = _ClientConn(sock, self.max_message)
        try:
            magic, version, server_nonce = _SERVER_HELLO.unpack(conn._recv_exact(_SERVER_HELLO.size))
            if magic != _MAGIC:
                raise StoreError(f"{self._where()} is not a pycoll store (unexpected greeting)")
            if version != _VERSION:
                raise StoreError(f"the store at {self._where()} speaks protocol {version}, this client {_VERSION}")
            client_nonce = secrets.token_bytes(_NONCE)
            sock.sendall(_CLIENT_HELLO.pack(_MAGIC, _VERSION, client_nonce,
                                            _mac(self._token, b"client", server_nonce, client_nonce)))
            status, mac = _SERVER_REPLY.unpack(conn._recv_exact(_SERVER_REPLY.size))
        except socket.timeout:
            raise StoreTimeout(f"the store at {self._where()} did not complete the handshake in time") from None
        except ConnectionError as exc:
            raise StoreError(f"the store at {self._where()} closed the connection during the handshake "
                             f"({exc})") from None
        if status == _AUTH_BAD_TOKEN:
            raise StoreAuthError(f"the store at {self._where()} refused this client's token")
        if status == _AUTH_BAD_VERSION:
            raise StoreError(f"the store at {self._where()} does not speak protocol version {_VERSION}")
        if status != _AUTH_OK or not hmac.compare_digest(mac, _mac(self._token, b"server", server_nonce,
                                                                     client_nonce)):
            raise StoreAuthError(f"the server at {self._where()} could not prove it knows the token")
        return conn

    def _acquire(self) -> _ClientConn:
        with self._lock:
            if self._closed:
                raise StoreError(f"the store client for {self._where()} is closed")
            if self._pid != os.getpid():
                for c in self._idle + list(self._busy):
                    c.close(shutdown=False)  # the parent still uses these connections
                self._idle, self._busy, self._pid = [], set(), os.getpid()
            if self._idle:
                conn = self._idle.pop()
                self._busy.add(conn)
                return conn
        conn = self._connect()
        with self._lock:
            if self._closed:
                conn.close()
                raise StoreError(f"the store client for {self._where()} is closed")
            self._busy.add(conn)
        return conn

    def _release(self, conn: _ClientConn) -> None:
        with self._lock:
            self._busy.discard(conn)
            if self._closed:
                conn.close()
            else:
                self._idle.append(conn)

    def _discard(self, conn: _ClientConn) -> None:
        with self._lock:
            self._busy.discard(conn)
        conn.close()

    def close(self) -> None:
        """Close every connection; calls blocked in other threads raise StoreError. Idempotent."""
        with self._lock:
            self._closed = True
            conns = self._idle + list(self._busy)
            self._idle = []
        for c in conns:
            c.close(shutdown=self._pid == os.getpid())
        if self.server is not None and self._pid == os.getpid():
            self.server.close()

    def _call(self, op: int, args: Sequence[bytes], wait: float = 0.0, keys: Sequence[str] = ()) -> List[bytes]:
        frame = _encode(op, args)
        if len(frame) - _LEN.size > self.max_message:
            raise StoreError(f"{_OP_NAMES[op]}: the request ({len(frame)} bytes) exceeds the limit of "
                             f"{self.max_message} bytes")
        conn = self._acquire()
        io_timeout = (wait + self.REPLY_GRACE) if op in (_OP_GET, _OP_WAIT, _OP_MULTI_GET) else self.timeout
        try:
            status, out = conn.request(frame, max(io_timeout, 1.0))
        except socket.timeout:
            self._discard(conn)
            raise StoreTimeout(f"{_OP_NAMES[op]}: the store at {self._where()} did not answer within "
                               f"{io_timeout:g} s") from None
        except (_ProtocolError, OSError) as exc:
            self._discard(conn)
            if self._closed:
                raise StoreError(f"{_OP_NAMES[op]}: the store client for {self._where()} was closed") from None
            raise StoreError(f"{_OP_NAMES[op]}: lost the connection to the store at {self._where()}: "
                             f"{exc}") from None
        except BaseException:
            self._discard(conn)  # e.g. KeyboardInterrupt mid-reply: the connection is out of step
            raise
        self._release(conn)
        if status == _ST_OK:
            return out
        if status == _ST_TIMEOUT:
            missing = [m.decode("utf-8", "replace") for m in out]
            raise _timeout_error(list(keys), wait, missing=missing)
        message = out[0].decode("utf-8", "replace") if out else "unknown error"
        raise StoreError(f"{_OP_NAMES[op]}: {message}")

    # ---- the protocol

    def set(self, key: str, value: Value) -> None:
        self._call(_OP_SET, [_check_key(key).encode(), _to_bytes(value)])

    def get(self, key: str, timeout: Optional[float] = None) -> bytes:
        key = _check_key(key)
        t = _check_timeout(timeout, self.timeout)
        return self._call(_OP_GET, [key.encode(), _D.pack(t)], t, [key])[0]

    def add(self, key: str, amount: int) -> int:
        out = self._call(_OP_ADD, [_check_key(key).encode(), _Q.pack(_check_amount(amount))])
        return _Q.unpack(out[0])[0]

    def wait(self, keys: Keys, timeout: Optional[float] = None) -> None:
        keys = _check_keys(keys)
        t = _check_timeout(timeout, self.timeout)
        self._call(_OP_WAIT, [_D.pack(t)] + [k.encode() for k in keys], t, keys)

    def multi_get(self, keys: Keys, timeout: Optional[float] = None) -> List[bytes]:
        keys = _check_keys(keys)
        t = _check_timeout(timeout, self.timeout)
        return self._call(_OP_MULTI_GET, [_D.pack(t)] + [k.encode() for k in keys], t, keys)

    def compare_set(self, key: str, expected: Value, desired: Value) -> bytes:
        args = [_check_key(key).encode(), _to_bytes(expected, "expected value"), _to_bytes(desired, "desired value")]
        return self._call(_OP_CAS, args)[0]

    def delete(self, key: str) -> bool:
        return self._call(_OP_DELETE, [_check_key(key).encode()])[0] == b"\x01"

    def check(self, keys: Keys) -> bool:
        return self._call(_OP_CHECK, [k.encode() for k in _check_keys(keys)])[0] == b"\x01"

    def num_keys(self) -> int:
        return _Q.unpack(self._call(_OP_NUM_KEYS, [])[0])[0]

    def list_keys(self, prefix: str = "") -> List[str]:
        return [k.decode("utf-8") for k in self._call(_OP_LIST_KEYS, [_check_key(prefix).encode()])]


def _rebuild_tcp_store(host: str, port: int, token: bytes, timeout: float, connect_timeout: float,
                       max_message: int) -> TCPStore:
    return TCPStore(host, port, token, timeout=timeout, connect_timeout=connect_timeout, max_message=max_message)


# --------------------------------------------------------------------------------------------------
# file store


_FILE_MAGIC = b"PYCOLLFS\x01"
_REC = struct.Struct("!BII")  # kind, key length, value length
_REC_SET, _REC_DELETE = 1, 2


class _PathLock:
    """Process-wide lock for one lock file: a thread lock plus an fcntl lock on a shared fd.

    POSIX record locks belong to the process and vanish when *any* descriptor of the file is
    closed, so every FileStore on the same path in this process shares one descriptor.
    """

    _registry: Dict[str, "_PathLock"] = {}
    _registry_lock = threading.Lock()

    def __init__(self, path: str) -> None:
        self.path = path
        self.fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        self.pid = os.getpid()
        self.lock = threading.Lock()
        self.refs = 0

    @classmethod
    def acquire_ref(cls, path: str) -> "_PathLock":
        with cls._registry_lock:
            pl = cls._registry.get(path)
            if pl is None or pl.pid != os.getpid():
                pl = cls._registry[path] = _PathLock(path)
            pl.refs += 1
            return pl

    def release_ref(self) -> None:
        with self._registry_lock, self.lock:
            self.refs -= 1
            if self.refs == 0 and self._registry.get(self.path) is self:
                del self._registry[self.path]
                os.close(self.fd)

    def __enter__(self) -> None:
        self.lock.acquire()
        try:
            fcntl.lockf(self.fd, fcntl.LOCK_EX)
        except BaseException:
            self.lock.release()
            raise

    def __exit__(self, *exc: Any) -> None:
        try:
            fcntl.lockf(self.fd, fcntl.LOCK_UN)
        finally:
            self.lock.release()


class FileStore(Store):
    """The store protocol over a file, for processes on one machine or a shared filesystem.

    The data file ``path`` is an append-only log (compacted when mostly stale, by an atomic rename);
    ``path + ".lock"`` serialises access with POSIX ``fcntl`` locks, which also work over NFS.
    Every process caches what it has read and reads only what was appended since. Waits poll the
    file (every 1 ms at first, then at most every ``poll_interval`` seconds).

    The files stay when the store is closed; :meth:`remove_files` deletes them once no process
    uses them. Every process must use the same path.
    """

    COMPACT_MIN_BYTES = 1 << 16

    def __init__(self, path: Union[str, os.PathLike], timeout: float = DEFAULT_TIMEOUT,
                 poll_interval: float = 0.02) -> None:
        self.path = os.path.abspath(os.fspath(path))
        self.timeout = _check_timeout(timeout, DEFAULT_TIMEOUT)
        self.poll_interval = _check_timeout(poll_interval, 0.02)
        self._plock = _PathLock.acquire_ref(self.path + ".lock")
        self._fd = -1
        self._ino: Optional[Tuple[int, int]] = None
        self._offset = 0
        self._table = _Table()
        self._live_bytes = 0
        self._closed = False
        with self._locked():
            self._sync()

    def __reduce__(self) -> Any:
        return (FileStore, (self.path, self.timeout, self.poll_interval))

    def __repr__(self) -> str:
        return f"FileStore({self.path!r})"

    @staticmethod
    def remove_files(path: Union[str, os.PathLike]) -> None:
        """Delete a FileStore's data and lock files (missing ones are ignored)."""
        p = os.path.abspath(os.fspath(path))
        for name in (p, p + ".lock", p + ".tmp"):
            try:
                os.unlink(name)
            except FileNotFoundError:
                pass

    def close(self) -> None:
        if self._closed:
            return
        with self._plock:
            if self._closed:
                return
            self._closed = True
            if self._fd >= 0:
                os.close(self._fd)
                self._fd = -1
        self._plock.release_ref()

    # ---- file access (callers hold self._plock)

    @contextlib.contextmanager
    def _locked(self) -> Iterator[None]:
        if self._closed:
            raise StoreError(f"the FileStore on {self.path} is closed")
        with self._plock:
            yield

    def _open_data(self) -> None:
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC, 0o600)
        st = os.fstat(fd)
        if st.st_size == 0:
            os.write(fd, _FILE_MAGIC)
        elif os.pread(fd, len(_FILE_MAGIC), 0) != _FILE_MAGIC:
            os.close(fd)
            raise StoreError(f"{self.path} is not a pycoll FileStore file")
        if self._fd >= 0:
            os.close(self._fd)
        self._fd = fd
        self._ino = (st.st_dev, st.st_ino)
        self._offset = len(_FILE_MAGIC)
        self._table = _Table()
        self._live_bytes = 0

    def _sync(self) -> None:
        """Bring the cache up to date with the file."""
        if self._closed:
            raise StoreError(f"the FileStore on {self.path} is closed")
        try:
            st = os.stat(self.path)
        except FileNotFoundError:
            st = None
        if st is None or self._fd < 0 or (st.st_dev, st.st_ino) != self._ino or st.st_size < self._offset:
            self._open_data()
            st = os.fstat(self._fd)
        if st.st_size == self._offset:
            return
        data = os.pread(self._fd, st.st_size - self._offset, self._offset)
        pos = 0
        while pos + _REC.size <= len(data):
            kind, klen, vlen = _REC.unpack_from(data, pos)
            end = pos + _REC.size + klen + vlen
            if kind not in (_REC_SET, _REC_DELETE) or end > len(data):
                break
            try:
                key = data[pos + _REC.size:pos + _REC.size + klen].decode("utf-8")
            except UnicodeDecodeError:
                break
            if kind == _REC_SET:
                self._put_cached(key, data[pos + _REC.size + klen:end])
            else:
                self._pop_cached(key)
            pos = end
        if pos < len(data):
            # a writer died in the middle of a record (we hold the lock): drop the torn tail
            log.warning("FileStore %s: dropping %d bytes of an incomplete record", self.path, len(data) - pos)
            os.ftruncate(self._fd, self._offset + pos)
        self._offset += pos

    def _put_cached(self, key: str, value: bytes) -> None:
        old = self._table.data.get(key)
        if old is not None:
            self._live_bytes -= _REC.size + len(key.encode()) + len(old)
        self._table.data[key] = value
        self._live_bytes += _REC.size + len(key.encode()) + len(value)

    def _pop_cached(self, key: str) -> Optional[bytes]:
        old = self._table.data.pop(key, None)
        if old is not None:
            self._live_bytes -= _REC.size + len(key.encode()) + len(old)
        return old

    @staticmethod
    def _record(kind: int, key: str, value: bytes = b"") -> bytes:
        k = key.encode("utf-8")
        return _REC.pack(kind, len(k), len(value)) + k + value

    def _append(self, rec: bytes) -> None:
        view = memoryview(rec)
        while view:
            n = os.write(self._fd, view)
            view = view[n:]
        self._offset += len(rec)
        if self._offset > self.COMPACT_MIN_BYTES and self._offset > 4 * (self._live_bytes + len(_FILE_MAGIC)):
            self._compact()

    def _compact(self) -> None:
        tmp = self.path + ".tmp"
        parts = [_FILE_MAGIC] + [self._record(_REC_SET, k, v) for k, v in self._table.data.items()]
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o600)
        try:
            data = memoryview(b"".join(parts))
            while data:
                data = data[os.write(fd, data):]
        finally:
            os.close(fd)
        os.replace(tmp, self.path)
        table, live = self._table, self._live_bytes
        self._open_data()
        self._table, self._live_bytes = table, live
        self._offset = os.fstat(self._fd).st_size

    def _set_locked(self, key: str, value: bytes) -> None:
        self._put_cached(key, value)
        self._append(self._record(_REC_SET, key, value))

    def _poll(self, keys: List[str], timeout: float, done: Callable[[], Any]) -> Any:
        deadline = time.monotonic() + timeout
        delay = 0.001
        while True:
            with self._locked():
                self._sync()
                if not self._table.missing(keys):
                    return done()
                missing = self._table.missing(keys)
            now = time.monotonic()
            if now >= deadline:
                raise _timeout_error(keys, timeout, f" in {self.path}", missing)
            time.sleep(min(delay, deadline - now))
            delay = min(delay * 2, self.poll_interval)

    # ---- the protocol

    def set(self, key: str, value: Value) -> None:
        key, value = _check_key(key), _to_bytes(value)
        with self._locked():
            self._sync()
            self._set_locked(key, value)

    def get(self, key: str, timeout: Optional[float] = None) -> bytes:
        key = _check_key(key)
        return self._poll([key], _check_timeout(timeout, self.timeout), lambda: self._table.data[key])

    def add(self, key: str, amount: int) -> int:
        key, amount = _check_key(key), _check_amount(amount)
        with self._locked():
            self._sync()
            scratch = _Table()
            scratch.data = {key: self._table.data[key]} if key in self._table.data else {}
            value = scratch.add(key, amount)
            self._set_locked(key, scratch.data[key])
            return value

    def wait(self, keys: Keys, timeout: Optional[float] = None) -> None:
        keys = _check_keys(keys)
        self._poll(keys, _check_timeout(timeout, self.timeout), lambda: None)

    def multi_get(self, keys: Keys, timeout: Optional[float] = None) -> List[bytes]:
        keys = _check_keys(keys)
        return self._poll(keys, _check_timeout(timeout, self.timeout), lambda: [self._table.data[k] for k in keys])

    def compare_set(self, key: str, expected: Value, desired: Value) -> bytes:
        key = _check_key(key)
        expected, desired = _to_bytes(expected, "expected value"), _to_bytes(desired, "desired value")
        with self._locked():
            self._sync()
            old = self._table.data.get(key)
            scratch = _Table()
            scratch.data = {} if old is None else {key: old}
            value = scratch.compare_set(key, expected, desired)
            if key in scratch.data and scratch.data[key] is not old:
                self._set_locked(key, scratch.data[key])
            return value

    def delete(self, key: str) -> bool:
        key = _check_key(key)
        with self._locked():
            self._sync()
            if self._pop_cached(key) is None:
                return False
            self._append(self._record(_REC_DELETE, key))
            return True

    def check(self, keys: Keys) -> bool:
        keys = _check_keys(keys)
        with self._locked():
            self._sync()
            return not self._table.missing(keys)

    def num_keys(self) -> int:
        with self._locked():
            self._sync()
            return len(self._table.data)

    def list_keys(self, prefix: str = "") -> List[str]:
        prefix = _check_key(prefix)
        with self._locked():
            self._sync()
            return self._table.list_keys(prefix)


# --------------------------------------------------------------------------------------------------
# torch adapter


_TORCH_METHODS = ("set", "get", "add", "wait", "compare_set", "delete_key", "check", "num_keys")


class TorchStoreAdapter(Store):
    """The pycoll protocol over any object with torch's c10d ``Store`` methods.

    Duck-typed: torch is never imported here. Per-call timeouts use the torch store's
    ``wait(keys, timedelta)``; torch's timeout errors become :class:`StoreTimeout`, its other
    errors :class:`StoreError`. ``list_keys`` needs a torch store that has it.

    torch's TCPStore client serialises calls on one socket, so a blocked ``wait`` would hold up
    every other thread; when the store has ``clone()`` (torch >= 2.3), blocking calls run on a
    per-thread clone (a separate connection) instead.
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
        td = timedelta(seconds=timeout)
        store = self._blocking_store()
        self._run("wait", lambda: store.wait(keys, td), keys, timeout)

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


# --------------------------------------------------------------------------------------------------
# standalone server


def _serve_main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m pycoll.store",
        description="Run a standalone pycoll TCP store. The token comes from PYCOLL_STORE_TOKEN "
                    "(a random one is made and printed when it is unset).")
    parser.add_argument("--host", default="127.0.0.1", help="address to bind (default: loopback)")
    parser.add_argument("--port", type=int, default=0, help="TCP port (default: a free one)")
    parser.add_argument("--max-message", type=int, default=DEFAULT_MAX_MESSAGE, help="request size limit, bytes")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="pycoll.store: %(message)s")
    token = os.environ.get("PYCOLL_STORE_TOKEN") or None
    server = TCPStoreServer(args.host, args.port, token, max_message=args.max_message)
    sys.stdout.write(f"PYCOLL_STORE_ADDR={server.host}\nPYCOLL_STORE_PORT={server.port}\n")
    if token is None:
        sys.stdout.write(f"PYCOLL_STORE_TOKEN={server.token}\n")
    sys.stdout.flush()
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    return 0


if __name__ == "__main__":
    sys.exit(_serve_main())
