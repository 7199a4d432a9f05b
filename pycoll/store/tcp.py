"""The client of pycoll's TCP store."""

from __future__ import annotations

import hmac
import logging
import os
import random
import secrets
import socket
import threading
import time
from typing import Any, List, Optional, Sequence, Set, Tuple, Union

from .. import failpoints as _fp
from .._settings import Seconds, request_deadline
from ..errors import StoreAuthError, StoreError, StoreLost, StoreTimeout
from ._wire import (
    _AUTH_BAD_TOKEN,
    _AUTH_BAD_VERSION,
    _AUTH_OK,
    _CLIENT_HELLO,
    _D,
    _LEN,
    _MAGIC,
    _NONCE,
    _OP_ADD,
    _OP_ADDED,
    _OP_APPEND,
    _OP_APPEND_GET,
    _OP_CAS,
    _OP_CHECK,
    _OP_DELETE,
    _OP_GET,
    _OP_LIST_KEYS,
    _OP_MULTI_GET,
    _OP_NAMES,
    _OP_NUM_KEYS,
    _OP_SET,
    _OP_WAIT,
    _OP_WAIT_SIZE,
    _Q,
    _SERVER_HELLO,
    _SERVER_REPLY,
    _ST_OK,
    _ST_TIMEOUT,
    _VERSION,
    DEFAULT_MAX_MESSAGE,
    _decode,
    _encode,
    _mac,
    _ProtocolError,
    _token_bytes,
)
from .base import (
    DEFAULT_TIMEOUT,
    Keys,
    Store,
    Value,
    _check_amount,
    _check_key,
    _check_keys,
    _check_size,
    _check_timeout,
    _size_timeout,
    _timeout_error,
    _to_bytes,
)
from .tcp_server import DEFAULT_MAX_UNAUTHENTICATED, TCPStoreServer

__all__ = ["TCPStore"]

_log = logging.getLogger("pycoll.store")


FP_BEFORE_REQUEST = _fp.declare("store.request.before", "the TCP store client, before a request")
FP_AFTER_REQUEST = _fp.declare("store.request.after", "the TCP store client, after the reply")
FP_HANDSHAKE = _fp.declare("store.connect.handshake", "the TCP store client, a new connection greeted by the server, "
                           "before the client's answer")


class _ReplyTooLarge(Exception):
    """A reply larger than the client's ``max_message``: the store is there, the client refuses what it sent."""


class _Shed(StoreError):
    """The server closed a new connection before it answered the handshake: it sheds load (tried again)."""


class _UnknownOp(StoreError):
    """The server does not know an operation added after version 1 of the protocol."""


class _ClientConn:
    """One authenticated client connection; used by one thread at a time."""

    def __init__(self, sock: socket.socket, max_message: int) -> None:
        self.sock = sock
        self.max_message = max_message
        self.buf = bytearray()
        self.rbuf = bytearray(1 << 16)
        self.rview = memoryview(self.rbuf)
        self.io_timeout: Optional[float] = None
        self.posted: List[str] = []  # operations sent without reading their answers (oldest first)

    def _recv_exact(self, n: int) -> bytes:
        while len(self.buf) < n:
            need = n - len(self.buf)
            if need > len(self.rbuf):  # a large value: read it whole
                chunk = self.sock.recv(need)
                got = len(chunk)
                self.buf += chunk
            else:  # a usual reply: into a buffer of its own (recv() allocates 64 KiB per read)
                got = self.sock.recv_into(self.rbuf)
                self.buf += self.rview[:got]
            if not got:
                raise ConnectionResetError("the store server closed the connection")
        out = bytes(self.buf[:n])
        del self.buf[:n]
        return out

    def send(self, frame: bytes, io_timeout: float) -> None:
        if io_timeout != self.io_timeout:
            self.sock.settimeout(io_timeout)
            self.io_timeout = io_timeout
        self.sock.sendall(frame)

    def _reply(self) -> Tuple[int, List[bytes]]:
        (n,) = _LEN.unpack(self._recv_exact(_LEN.size))
        if n > self.max_message:
            raise _ReplyTooLarge(f"the reply of {n} bytes exceeds this client's limit of {self.max_message} bytes "
                                 "(its max_message)")
        return _decode(memoryview(self._recv_exact(n)))

    def request(self, frame: bytes, io_timeout: float) -> Tuple[int, List[bytes]]:
        self.send(frame, io_timeout)
        while self.posted:  # the answers to the requests posted before this one come first
            what = self.posted.pop(0)
            status, out = self._reply()
            if status != _ST_OK:
                _log.warning("store: %s sent without waiting failed: %s", what,
                             out[0].decode("utf-8", "replace") if out else "unknown error")
        return self._reply()

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
    ``connect_timeout`` since ranks may start before the server, and connections the server closes
    before it answers the handshake (it sheds them while more than its ``max_unauthenticated`` wait,
    as when hundreds of ranks connect at once). Threads share the client: each
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

    Once the client has reached its server, a call whose connection fails raises :class:`~pycoll.StoreLost`, and so
    does a call that must connect again while nothing listens at the server's address any more (every try refused
    for ``REFUSED_GONE`` seconds): it does not wait ``connect_timeout`` for a server that stopped.
    """

    #: Extra seconds a client waits for the server's answer beyond a wait's own timeout.
    REPLY_GRACE = 10.0
    #: Seconds a client that reached its server before goes on connecting while every try is refused (nothing
    #: listens there any more) before it raises StoreLost.
    REFUSED_GONE = 0.5

    def __init__(
        self,
        host: str,
        port: int,
        token: Union[str, bytes, None] = None,
        *,
        timeout: Seconds = DEFAULT_TIMEOUT,
        connect_timeout: Seconds = 60.0,
        max_message: int = DEFAULT_MAX_MESSAGE,
    ) -> None:
        if not isinstance(port, int) or not 0 < port <= 65535:
            raise ValueError(f"store port must be an int in [1, 65535], got {port!r}")
        self.host = host
        self.port = port
        self._token = _token_bytes(token, "TCPStore")
        self.timeout = _check_timeout(timeout, DEFAULT_TIMEOUT)
        self.connect_timeout = _check_timeout(connect_timeout, 60.0, "connect_timeout")
        self.max_message = int(max_message)
        self._lock = threading.Lock()
        self._idle: List[_ClientConn] = []
        self._busy: Set[_ClientConn] = set()
        self._pid = os.getpid()
        self._closed = False
        self._legacy_server = False  # the server predates append/wait_size/append_get: use the generic versions
        #: the server this client hosts (see :meth:`hosting`), else None
        self.server: Optional[TCPStoreServer] = None
        self._connected = False  # reached the server once: a refused connection then means it is gone
        self._release(self._connect())

    @classmethod
    def hosting(
        cls,
        bind: str = "127.0.0.1",
        port: int = 0,
        token: Union[str, bytes, None] = None,
        *,
        max_message: int = DEFAULT_MAX_MESSAGE,
        max_unauthenticated: int = DEFAULT_MAX_UNAUTHENTICATED,
        **kwargs: Any,
    ) -> TCPStore:
        """Start a :class:`TCPStoreServer` in this process and return a client that owns it.

        Closing the returned client stops the server: every other client then loses the store.
        The server is available as the client's ``server`` attribute. ``max_message`` and
        ``max_unauthenticated`` are the server's (and ``max_message`` the client's) limits.
        """
        server = TCPStoreServer(bind, port, token, max_message=max_message,
                                max_unauthenticated=max_unauthenticated).start()
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

    def _connect(self, limit: Optional[float] = None) -> _ClientConn:
        """A new connection, within ``connect_timeout`` (and ``limit``: what the call needing it may take)."""
        bound = self.connect_timeout if limit is None else min(self.connect_timeout, limit)
        deadline = time.monotonic() + bound
        delay = 0.01
        last: Optional[BaseException] = None
        refused_since: Optional[float] = None
        while True:
            remaining = deadline - time.monotonic()
            try:
                sock = socket.create_connection((self.host, self.port), timeout=max(0.05, min(remaining, 10.0)))
            except (OSError, socket.gaierror) as exc:
                last = exc
                if isinstance(exc, ConnectionRefusedError) and self._connected:
                    # nothing listens where this client's server answered before: it is gone (a server that has not
                    # started yet is waited for until connect_timeout, one that stopped is not)
                    now = time.monotonic()
                    refused_since = now if refused_since is None else refused_since
                    if now - refused_since >= self.REFUSED_GONE:
                        raise StoreLost(f"the store at {self._where()} refuses connections: its server, which this "
                                        f"client reached before, is gone (refused for {now - refused_since:.1f} s)"
                                        ) from None
                else:
                    refused_since = None
            else:
                try:
                    # the handshake counts against the same deadline (a floor keeps a last try possible)
                    conn = self._handshake(sock, max(deadline - time.monotonic(), 0.5))
                    self._connected = True
                    return conn
                except _Shed as exc:
                    # closed before it answered: a pycoll server sheds connections that have not authenticated
                    # when more than its max_unauthenticated wait (hundreds of ranks connecting at once, a round
                    # trip apart), or when it is out of descriptors or connections; it takes this one later
                    sock.close()
                    last = exc
                except BaseException:
                    sock.close()
                    raise
            if time.monotonic() + delay >= deadline:
                raise StoreTimeout(f"could not connect to the store at {self._where()} within "
                                   f"{bound:g} s (last error: {last})") from None
            time.sleep(delay * random.uniform(0.5, 1.5))  # the ones refused or shed together come back spread out
            delay = min(delay * 2, 0.5)

    def _handshake(self, sock: socket.socket, timeout: float) -> _ClientConn:
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
        sock.settimeout(min(timeout, 30.0))  # callers pass what is left of their connect deadline
        conn = _ClientConn(sock, self.max_message)
        try:
            magic, version, server_nonce = _SERVER_HELLO.unpack(conn._recv_exact(_SERVER_HELLO.size))
            if magic != _MAGIC:
                raise StoreError(f"{self._where()} is not a pycoll store (unexpected greeting)")
            if version != _VERSION:
                raise StoreError(f"the store at {self._where()} speaks protocol {version}, this client {_VERSION}")
            _fp.hit(FP_HANDSHAKE)
            client_nonce = secrets.token_bytes(_NONCE)
            sock.sendall(_CLIENT_HELLO.pack(_MAGIC, _VERSION, client_nonce,
                                            _mac(self._token, b"client", server_nonce, client_nonce)))
            status, mac = _SERVER_REPLY.unpack(conn._recv_exact(_SERVER_REPLY.size))
        except TimeoutError:
            raise StoreTimeout(f"the store at {self._where()} did not complete the handshake in time") from None
        except ConnectionError as exc:
            raise _Shed(f"the store at {self._where()} closed the connection during the handshake ({exc})") from None
        if status == _AUTH_BAD_TOKEN:
            raise StoreAuthError(f"the store at {self._where()} refused this client's token")
        if status == _AUTH_BAD_VERSION:
            raise StoreError(f"the store at {self._where()} does not speak protocol version {_VERSION}")
        if status != _AUTH_OK or not hmac.compare_digest(mac, _mac(self._token, b"server", server_nonce,
                                                                     client_nonce)):
            raise StoreAuthError(f"the server at {self._where()} could not prove it knows the token")
        return conn

    def _acquire(self, limit: Optional[float] = None) -> _ClientConn:
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
        conn = self._connect(limit)
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

    def close_idle(self) -> None:
        """Close the connections kept for later calls; the next call opens one (see :meth:`Store.close_idle`)."""
        with self._lock:
            idle, self._idle = (self._idle, []) if self._pid == os.getpid() else ([], self._idle)
        for c in idle:
            c.close()

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

    def _frame(self, op: int, args: Sequence[bytes]) -> bytes:
        frame = _encode(op, args)
        if len(frame) - _LEN.size > self.max_message:
            raise StoreError(f"{_OP_NAMES[op]}: the request ({len(frame)} bytes) exceeds the limit of "
                             f"{self.max_message} bytes")
        return frame

    def _lost(self, op: int, exc: BaseException) -> StoreError:
        """The error for a request whose connection failed (it was discarded)."""
        if self._closed:
            return StoreError(f"{_OP_NAMES[op]}: the store client for {self._where()} was closed")
        return StoreLost(f"{_OP_NAMES[op]}: lost the connection to the store at {self._where()}: {exc}")

    def _call(self, op: int, args: Sequence[bytes], wait: float = 0.0, keys: Sequence[str] = ()) -> List[bytes]:
        frame = self._frame(op, args)
        _fp.hit(FP_BEFORE_REQUEST)
        io_timeout = (wait + self.REPLY_GRACE) if op in (_OP_GET, _OP_WAIT, _OP_MULTI_GET, _OP_WAIT_SIZE,
                                                          _OP_APPEND_GET) else self.timeout
        bound = request_deadline()
        if bound is not None:  # a waiting request keeps a second past it for the server's own timeout reply, which
            # says what was missing (cut at the deadline, it read as a store that did not answer)
            left = max(1.0, bound - time.monotonic())
            io_timeout = min(io_timeout, left + 1.0 if wait else left)
        # a new connection (the last one was dropped: a timeout, a lost server) counts against the call's own bound,
        # not the client's connect_timeout: a server that accepts but does not answer (stopped) held get(timeout=1) 30 s
        conn = self._acquire(max(io_timeout, 1.0))
        try:
            status, out = conn.request(frame, max(io_timeout, 1.0))
        except TimeoutError:
            self._discard(conn)
            raise StoreTimeout(f"{_OP_NAMES[op]}: the store at {self._where()} did not answer within "
                               f"{io_timeout:g} s") from None
        except _ReplyTooLarge as exc:
            self._discard(conn)  # the reply is left unread: the connection is out of step
            raise StoreError(f"{_OP_NAMES[op]}: {exc}") from None
        except (_ProtocolError, OSError) as exc:
            self._discard(conn)
            raise self._lost(op, exc) from None
        except BaseException:
            self._discard(conn)  # e.g. KeyboardInterrupt mid-reply: the connection is out of step
            raise
        message = out[0].decode("utf-8", "replace") if out and status not in (_ST_OK, _ST_TIMEOUT) else ""
        if message.startswith("malformed request"):
            self._discard(conn)  # the server closes the connection after such an answer
            if op in _OP_ADDED and "unknown operation" in message:
                raise _UnknownOp(f"{_OP_NAMES[op]}: the store at {self._where()} predates it")
        else:
            self._release(conn)
        _fp.hit(FP_AFTER_REQUEST)
        if status == _ST_OK:
            return out
        if status == _ST_TIMEOUT:
            missing = [m.decode("utf-8", "replace") for m in out]
            raise _timeout_error(list(keys), wait, missing=missing)
        raise StoreError(f"{_OP_NAMES[op]}: {message or 'unknown error'}")

    # ---- the protocol

    def set(self, key: str, value: Value) -> None:
        self._call(_OP_SET, [_check_key(key).encode(), _to_bytes(value)])

    def set_nowait(self, key: str, value: Value) -> None:
        """:meth:`set`, sent without waiting for the answer: a connection's requests are answered in
        order, and its next request reads this answer first (and logs it if it is an error)."""
        frame = self._frame(_OP_SET, [_check_key(key).encode(), _to_bytes(value)])
        _fp.hit(FP_BEFORE_REQUEST)
        conn = self._acquire(max(self.timeout, 1.0))
        try:
            conn.send(frame, max(self.timeout, 1.0))
            conn.posted.append(f"set of {key!r}")
        except OSError as exc:
            self._discard(conn)
            raise self._lost(_OP_SET, exc) from None
        except BaseException:
            self._discard(conn)  # e.g. KeyboardInterrupt mid-send: the connection is out of step
            raise
        self._release(conn)
        _fp.hit(FP_AFTER_REQUEST)

    def get(self, key: str, timeout: Optional[Seconds] = None) -> bytes:
        key = _check_key(key)
        t = _check_timeout(timeout, self.timeout)
        return self._call(_OP_GET, [key.encode(), _D.pack(t)], t, [key])[0]

    def add(self, key: str, amount: int) -> int:
        out = self._call(_OP_ADD, [_check_key(key).encode(), _Q.pack(_check_amount(amount))])
        return _Q.unpack(out[0])[0]

    def wait(self, keys: Keys, timeout: Optional[Seconds] = None) -> None:
        keys = _check_keys(keys)
        t = _check_timeout(timeout, self.timeout)
        self._call(_OP_WAIT, [_D.pack(t)] + [k.encode() for k in keys], t, keys)

    def multi_get(self, keys: Keys, timeout: Optional[Seconds] = None) -> List[bytes]:
        keys = _check_keys(keys)
        t = _check_timeout(timeout, self.timeout)
        return self._call(_OP_MULTI_GET, [_D.pack(t)] + [k.encode() for k in keys], t, keys)

    def compare_set(self, key: str, expected: Value, desired: Value) -> bytes:
        args = [_check_key(key).encode(), _to_bytes(expected, "expected value"), _to_bytes(desired, "desired value")]
        return self._call(_OP_CAS, args)[0]

    def append(self, key: str, value: Value) -> int:
        data = _to_bytes(value)
        if not data:
            raise ValueError("append() needs a non-empty value")
        if not self._legacy_server:
            try:
                return _Q.unpack(self._call(_OP_APPEND, [_check_key(key).encode(), data])[0])[0]
            except _UnknownOp:
                self._legacy_server = True
        return super().append(key, data)

    def append_get(self, key: str, value: Value, wait_key: str, timeout: Optional[Seconds] = None) -> bytes:
        data = _to_bytes(value)
        if not data:
            raise ValueError("append_get() needs a non-empty value")
        key, wait_key = _check_key(key), _check_key(wait_key)
        t = _check_timeout(timeout, self.timeout)
        if not self._legacy_server:
            try:
                args = [_D.pack(t), key.encode(), data, wait_key.encode()]
                return self._call(_OP_APPEND_GET, args, t, [wait_key])[0]
            except _UnknownOp:
                self._legacy_server = True
        return super().append_get(key, data, wait_key, t)

    def wait_size(self, key: str, size: int, timeout: Optional[Seconds] = None) -> bytes:
        key, size = _check_key(key), _check_size(size)
        t = _check_timeout(timeout, self.timeout)
        if not self._legacy_server:
            try:
                return self._call(_OP_WAIT_SIZE, [_D.pack(t), key.encode(), _Q.pack(size)], t, [key])[0]
            except _UnknownOp:
                self._legacy_server = True
            except StoreTimeout:
                raise _size_timeout(key, size, t) from None
        return super().wait_size(key, size, t)

    def delete(self, key: str) -> bool:
        return self._call(_OP_DELETE, [_check_key(key).encode()])[0] == b"\x01"

    def check(self, keys: Keys) -> bool:
        return self._call(_OP_CHECK, [k.encode() for k in _check_keys(keys)])[0] == b"\x01"

    def num_keys(self) -> int:
        return _Q.unpack(self._call(_OP_NUM_KEYS, [])[0])[0]

    def list_keys(self, prefix: str = "") -> List[str]:
        return [k.decode("utf-8") for k in self._call(_OP_LIST_KEYS, [_check_key(prefix).encode()])]


TCPStoreServer._client_class = TCPStore


def _rebuild_tcp_store(host: str, port: int, token: bytes, timeout: float, connect_timeout: float,
                       max_message: int) -> TCPStore:
    return TCPStore(host, port, token, timeout=timeout, connect_timeout=connect_timeout, max_message=max_message)
