"""The server of pycoll's TCP store: one selector thread serving every client, waits included."""

from __future__ import annotations

import errno
import heapq
import hmac
import itertools
import logging
import math
import secrets
import selectors
import socket
import threading
import time
from collections import deque
from typing import TYPE_CHECKING, Any, Callable, Deque, Dict, List, Optional, Sequence, Set, Tuple, Union

from .. import _settings
from .._settings import Seconds
from ..errors import StoreError
from ._wire import (
    _AUTH_BAD_TOKEN,
    _AUTH_BAD_VERSION,
    _AUTH_OK,
    _CLIENT_HELLO,
    _D,
    _LEN,
    _MAC,
    _MAGIC,
    _NONCE,
    _OP_ADD,
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
    _ST_ERROR,
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
from .base import _Table

if TYPE_CHECKING:
    from .tcp import TCPStore

__all__ = ["TCPStoreServer", "unauthenticated_for"]

log = logging.getLogger("pycoll.store")

#: Defaults of the server's limits (see :class:`TCPStoreServer`).
DEFAULT_MAX_UNAUTHENTICATED = 64
DEFAULT_MAX_CONNECTIONS = 16384
DEFAULT_MAX_KEYS = 1_000_000
DEFAULT_MAX_BYTES = 1 << 30
DEFAULT_MAX_WAITS = 65536


_REPLY_OVERHEAD = len(_encode(_ST_OK, [b""])) - _LEN.size  # a reply of one value: its bytes beside the value's


def unauthenticated_for(world_size: int) -> int:
    """A job's server's ``max_unauthenticated``: every rank of a job may connect at once (two connections each: its
    main thread's and its watchdog's), and a handshake takes a round trip, so hundreds of ranks over a network have
    more handshakes under way than the default allows; shed ones try again (:class:`TCPStore`), but take longer."""
    return max(DEFAULT_MAX_UNAUTHENTICATED, 2 * world_size)


class _RateLimitedLog:
    """Log a warning at most once per ``interval`` seconds per kind, counting what was held back."""

    def __init__(self, interval: float = 5.0) -> None:
        self.interval = interval
        self._last: Dict[str, float] = {}
        self._held: Dict[str, int] = {}

    def warning(self, kind: str, msg: str, *args: Any, exc_info: bool = False) -> None:
        now = time.monotonic()
        last = self._last.get(kind)
        if last is not None and now - last < self.interval:
            self._held[kind] = self._held.get(kind, 0) + 1
            return
        self._last[kind] = now
        held = self._held.pop(kind, 0)
        if held:
            msg += f" (and {held} more like it in the last {self.interval:g} s)"
        log.warning(msg, *args, exc_info=exc_info)


class _Conn:
    """Server-side state of one client connection."""

    __slots__ = ("sock", "peer", "inbuf", "outbuf", "authed", "nonce", "waiter", "closed", "opened", "skip")

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
        self.skip = 0  # bytes of a refused (too large) request still to come, discarded as they arrive


class _Waiter:
    """A blocked get/wait/multi_get/wait_size on the server."""

    __slots__ = ("conn", "op", "keys", "missing", "deadline", "timeout", "done", "size")

    def __init__(self, conn: _Conn, op: int, keys: List[str], missing: Set[str], timeout: float,
                 size: int = -1) -> None:
        self.conn = conn
        self.size = size  # wait_size: the least number of bytes the key must hold
        self.op = op
        self.keys = keys
        self.missing = missing
        self.timeout = timeout
        self.deadline = time.monotonic() + timeout
        self.done = False


_SKIP_MAX = 1 << 28  # a request up to this size over the server's limit is refused and skipped, a larger one closes
_LONGEST_WAIT_S = 3600.0  # the longest the server's loop waits for the next deadline at a time


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
        max_message: largest accepted request, in bytes; a larger one (of up to 256 MiB: a client's own limit may
            be larger) is refused with an error and its bytes dropped as they come, the connection staying usable.
        handshake_timeout: seconds a new connection has to authenticate before it is closed.
        max_unauthenticated: most connections that have not completed the handshake; a new one beyond
            it closes the oldest of them, so that unauthenticated clients can never hold the file
            descriptors an authenticated client needs (when the process runs out of descriptors the
            oldest unauthenticated connection is closed too).
        max_connections: most connections in all; beyond it new connections are closed at once.
        max_keys, max_bytes: most keys, and most bytes of keys and values, the server holds; a request
            that would exceed them fails with a StoreError for that client only.
        max_waits: most blocked get/wait/multi_get requests at once; one more fails with a StoreError.

    A request that raises inside the server (a bug) closes that client's connection only and is
    logged; nothing a client sends stops the server. :attr:`serving` says whether it still serves.
    """

    # The class client() makes: TCPStore, which sets it (pycoll.store.tcp imports this module, not the reverse).
    _client_class: Optional[Callable[..., TCPStore]] = None

    def __init__(
        self,
        host: str = "127.0.0.1",
        port: int = 0,
        token: Union[str, bytes, None] = None,
        *,
        max_message: int = DEFAULT_MAX_MESSAGE,
        handshake_timeout: Seconds = 10.0,
        backlog: int = 1024,
        max_unauthenticated: int = DEFAULT_MAX_UNAUTHENTICATED,
        max_connections: int = DEFAULT_MAX_CONNECTIONS,
        max_keys: int = DEFAULT_MAX_KEYS,
        max_bytes: int = DEFAULT_MAX_BYTES,
        max_waits: int = DEFAULT_MAX_WAITS,
    ) -> None:
        if token is None:
            token = secrets.token_hex(32)
        #: the shared secret, as given (or the random one made)
        self.token: Union[str, bytes] = token
        self._token = _token_bytes(token, "TCPStoreServer")
        if max_message < 1024:
            raise ValueError(f"max_message must be at least 1024 bytes, got {max_message}")
        self.max_message = int(max_message)
        self.handshake_timeout = _settings.seconds(handshake_timeout, "handshake_timeout")
        for what, value in (("max_unauthenticated", max_unauthenticated), ("max_connections", max_connections),
                            ("max_keys", max_keys), ("max_bytes", max_bytes), ("max_waits", max_waits)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{what} must be a positive int, got {value!r}")
        self.max_unauthenticated = max_unauthenticated
        self.max_connections = max_connections
        self.max_keys = max_keys
        self.max_bytes = max_bytes
        self.max_waits = max_waits
        self._sock = self._bind(host, port, backlog)
        self.host = host
        self.port: int = self._sock.getsockname()[1]
        self._table = _Table()
        self._by_key: Dict[str, Set[_Waiter]] = {}
        self._by_size: Dict[str, Set[_Waiter]] = {}  # wait_size waiters, by key
        self._deadlines: List[Tuple[float, int, _Waiter]] = []
        self._seq = itertools.count()
        self._conns: Set[_Conn] = set()
        # insertion-ordered, so the first is the oldest
        self._unauthed: Dict[_Conn, None] = {}
        self._ready: Deque[_Conn] = deque()
        self._bytes = 0
        self._waits = 0
        self._ops: Dict[str, int] = dict.fromkeys(_OP_NAMES.values(), 0)
        self._keys_in = 0
        self._shed = 0  # connections closed before they authenticated (_evict_unauthed)
        self._warn = _RateLimitedLog()
        #: what stopped the serving thread when it ended by an error, else None
        self.error: Optional[BaseException] = None
        self._sel = selectors.DefaultSelector()
        self._rbuf = bytearray(1 << 18)  # every connection's reads land here first (one thread reads)
        self._rview = memoryview(self._rbuf)
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

    def client(self, **kwargs: Any) -> TCPStore:
        """A :class:`~pycoll.store.TCPStore` connected to this server over loopback (or its bound address)."""
        host = self.host if self.host not in ("", "0.0.0.0", "::") else "127.0.0.1"
        assert self._client_class is not None
        return self._client_class(host, self.port, self.token, **kwargs)

    def stats(self) -> Dict[str, int]:
        """Counters since the server started: ``requests`` (every request served), one entry per
        operation name, ``arguments`` (request arguments parsed: keys, values, timeouts), and the
        current ``waiting`` (blocked requests) and ``connections``, and ``shed``: connections closed before they
        authenticated because too many had not (``max_unauthenticated``) or descriptors ran out (their clients
        connect again). Read from any thread (a snapshot that may be one request behind)."""
        ops = dict(self._ops)
        out = {"requests": sum(ops.values()), "arguments": self._keys_in, "waiting": self._waits,
               "connections": len(self._conns), "shed": self._shed}
        out.update(ops)
        return out

    @property
    def serving(self) -> bool:
        """Whether the server still serves (False once closed, or if its thread ended)."""
        if self._closed.is_set():
            return False
        return self._thread is None or self._thread.is_alive()

    # ---- lifecycle

    def start(self) -> TCPStoreServer:
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
                try:
                    self._serve_once()
                except Exception:  # not tied to one connection: log, and keep serving the others
                    self._warn.warning("loop", "store server: unexpected error (it keeps serving)", exc_info=True)
                    time.sleep(0.01)
        except BaseException as exc:
            self.error = exc
            log.error("store server stopped by %r; its clients lose the store", exc)
            raise
        finally:
            self._shutdown()

    def _serve_once(self) -> None:
        timeout = self._next_timeout()
        for key, events in self._sel.select(timeout):
            if key.fileobj is self._sock:
                self._accept()
            elif key.fileobj is self._wake_r:
                self._drain_wake()
            else:
                conn = key.data
                if events & selectors.EVENT_WRITE and not conn.closed:
                    self._guarded(conn, self._flush)
                if events & selectors.EVENT_READ and not conn.closed:
                    self._guarded(conn, self._on_readable)
            self._run_ready()
        self._expire()
        self._run_ready()

    def _guarded(self, conn: _Conn, step: Callable[[_Conn], None]) -> None:
        """Run one step for ``conn``; an error in it closes that connection only."""
        try:
            step(conn)
        except Exception:
            self._warn.warning("request", "store: closing connection from %s: the server failed on its request",
                               conn.peer, exc_info=True)
            try:
                self._close_conn(conn)
            except Exception:
                conn.closed = True

    def _run_ready(self) -> None:
        """Serve the connections whose pending wait was answered (iteratively: answering one may
        answer others, which join the queue instead of recursing)."""
        while self._ready:
            conn = self._ready.popleft()
            if not conn.closed:
                self._guarded(conn, self._process)

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

    def __enter__(self) -> TCPStoreServer:
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
            t = next(iter(self._unauthed)).opened + self.handshake_timeout
            nxt = t if nxt is None else min(nxt, t)
        if self._accept_paused_until:
            nxt = self._accept_paused_until if nxt is None else min(nxt, self._accept_paused_until)
        if nxt is None:
            return None
        # the OS's wait takes at most 2**31 - 1 ms (and Python refuses more): a far deadline is looked at again
        return min(max(0.0, nxt - now), _LONGEST_WAIT_S)

    def _drain_wake(self) -> None:
        try:
            while self._wake_r.recv(4096):
                pass
        except (BlockingIOError, InterruptedError):
            pass

    def _evict_unauthed(self, why: str) -> bool:
        """Close the oldest connection that has not authenticated; False when there is none."""
        if not self._unauthed:
            return False
        conn = next(iter(self._unauthed))
        self._shed += 1
        self._warn.warning("evict", "store: closing unauthenticated connection from %s (%s)", conn.peer, why)
        self._close_conn(conn)
        return True

    def _accept(self) -> None:
        for _ in range(64):
            try:
                sock, peer = self._sock.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError as exc:
                if exc.errno in (errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM):
                    if self._evict_unauthed(f"out of file descriptors: {exc.strerror}"):
                        continue
                    self._warn.warning("accept", "store server cannot accept connections (%s); pausing accepts "
                                       "for 0.1 s", exc)
                    self._sel.unregister(self._sock)
                    self._accept_paused_until = time.monotonic() + 0.1
                return
            if len(self._conns) >= self.max_connections:
                self._warn.warning("full", "store: refusing a connection from %s: %d connections already open",
                                   peer, len(self._conns))
                sock.close()
                continue
            try:
                sock.setblocking(False)
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
            except OSError:
                sock.close()
                continue
            if len(self._unauthed) >= self.max_unauthenticated:
                self._evict_unauthed(f"more than {self.max_unauthenticated} connections without a handshake")
            conn = _Conn(sock, peer)
            self._conns.add(conn)
            self._unauthed[conn] = None
            self._sel.register(sock, selectors.EVENT_READ, conn)
            self._send(conn, _SERVER_HELLO.pack(_MAGIC, _VERSION, conn.nonce))

    def _close_conn(self, conn: _Conn) -> None:
        if conn.closed:
            return
        conn.closed = True
        if conn.waiter is not None:
            self._drop_waiter(conn.waiter)
        self._conns.discard(conn)
        self._unauthed.pop(conn, None)
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
            n = conn.sock.recv_into(self._rbuf)  # not recv(): a fresh 256 KiB object per read is an mmap
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            self._close_conn(conn)
            return
        if not n:
            self._close_conn(conn)
            return
        if conn.skip:  # the rest of a request refused for its size: dropped, the connection stays usable
            k = min(conn.skip, n)
            conn.skip -= k
            if k == n:
                return
            conn.inbuf += self._rview[k:n]
        else:
            conn.inbuf += self._rview[:n]
        # Input is read even while a request is pending (to notice a closed peer), but a client
        # may have at most one maximal frame queued behind it.
        limit = self.max_message + 2 * _LEN.size + _CLIENT_HELLO.size
        if len(conn.inbuf) > limit:
            self._process(conn)  # a request refused for its size is dropped there: what is left may fit
            if len(conn.inbuf) > limit and not conn.closed:
                self._warn.warning("input", "store: closing connection from %s: too much unanswered input",
                                   conn.peer)
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
            if n > _SKIP_MAX:  # no client sends such a frame: garbage
                self._warn.warning("size", "store: closing connection from %s: a message of %d bytes", conn.peer, n)
                self._close_conn(conn)
                return
            if n > self.max_message:
                # refused with an error reply; its bytes are dropped as they come (closing the connection under a
                # client still sending would reset it before the client reads why: a lost store, to the client)
                self._warn.warning("size", "store: refusing a message of %d bytes from %s: it exceeds the %d-byte "
                                   "limit", n, conn.peer, self.max_message)
                k = min(n, len(conn.inbuf) - _LEN.size)
                del conn.inbuf[:_LEN.size + k]
                conn.skip = n - k
                self._send(conn, _encode(_ST_ERROR, [f"message of {n} bytes exceeds the server's limit of "
                                                     f"{self.max_message} bytes".encode()]))
                continue
            if len(conn.inbuf) < _LEN.size + n:
                return
            payload = memoryview(bytes(conn.inbuf[_LEN.size:_LEN.size + n]))
            del conn.inbuf[:_LEN.size + n]
            try:
                self._dispatch(conn, payload)
            except _ProtocolError as exc:
                self._warn.warning("malformed", "store: closing connection from %s: %s", conn.peer, exc)
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
            self._warn.warning("magic", "store: closing connection from %s: not a pycoll store client", conn.peer)
            self._close_conn(conn)
            return
        if version != _VERSION:
            self._send(conn, _SERVER_REPLY.pack(_AUTH_BAD_VERSION, bytes(_MAC)))
            self._close_conn_after_flush(conn)
            return
        expected = _mac(self._token, b"client", conn.nonce, client_nonce)
        if not hmac.compare_digest(expected, mac):
            self._warn.warning("token", "store: rejected a client from %s: wrong token", conn.peer)
            self._send(conn, _SERVER_REPLY.pack(_AUTH_BAD_TOKEN, bytes(_MAC)))
            self._close_conn_after_flush(conn)
            return
        conn.authed = True
        self._unauthed.pop(conn, None)
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
        self._ops[name] += 1
        self._keys_in += len(args)
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
                amount_i = self._int(amount)
                old = self._table.data.get(key_s)
                self._reserve(key_s, old, 21)  # an int64's decimal text is at most 20 bytes and a sign
                new = self._table.add(key_s, amount_i)
                self._account(key_s, old)
                self._wake(key_s)
                self._reply(conn, [_Q.pack(new)])
            elif op in (_OP_WAIT, _OP_MULTI_GET):
                if not args:
                    raise _ProtocolError(f"{name}: missing timeout")
                self._wait(conn, op, [self._key(k) for k in args[1:]], self._timeout(args[0]))
            elif op == _OP_APPEND:
                key, value = self._args(args, 2, name)
                self._reply(conn, [_Q.pack(self._append(self._key(key), value))])
            elif op == _OP_APPEND_GET:
                t, key, value, wait_key = self._args(args, 4, name)
                timeout, wait_s = self._timeout(t), self._key(wait_key)
                self._append(self._key(key), value)
                self._wait(conn, _OP_GET, [wait_s], timeout)
            elif op == _OP_WAIT_SIZE:
                t, key, size = self._args(args, 3, name)
                self._wait_size(conn, self._key(key), self._int(size), self._timeout(t))
            elif op == _OP_CAS:
                key, expected, desired = self._args(args, 3, name)
                key_s = self._key(key)
                old = self._table.data.get(key_s)
                self._reserve(key_s, old, len(desired))
                value = self._table.compare_set(key_s, expected, desired)
                self._account(key_s, old)
                self._wake(key_s)
                self._reply(conn, [value])
            elif op == _OP_DELETE:
                (key,) = self._args(args, 1, name)
                key_s = self._key(key)
                old = self._table.data.pop(key_s, None)
                existed = old is not None
                if old is not None:
                    self._bytes -= len(key_s.encode("utf-8")) + len(old)
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

    def _reserve(self, key: str, old: Optional[bytes], new_len: int) -> None:
        """StoreError when storing ``new_len`` bytes under ``key`` (now ``old``) would exceed the limits."""
        if old is None and len(self._table.data) >= self.max_keys:
            raise StoreError(f"the store is full: it holds {len(self._table.data)} keys, the server's limit "
                             f"(max_keys)")
        grow = new_len - (len(old) if old is not None else -len(key.encode("utf-8")))
        if grow > 0 and self._bytes + grow > self.max_bytes:
            raise StoreError(f"the store is full: storing {new_len} bytes under {key[:80]!r} would exceed the "
                             f"server's limit of {self.max_bytes} bytes of keys and values (max_bytes)")

    def _account(self, key: str, old: Optional[bytes]) -> None:
        new = self._table.data.get(key)
        klen = len(key.encode("utf-8"))
        self._bytes += (len(new) + klen if new is not None else 0) - (len(old) + klen if old is not None else 0)

    def _append(self, key: str, value: bytes) -> int:
        old = self._table.data.get(key)
        total = len(value) + (len(old) if old is not None else 0)
        if _REPLY_OVERHEAD + total > self.max_message:  # a get could not return it
            raise StoreError(f"the value under {key[:80]!r} would grow to {total} bytes, more than a reply "
                             f"may hold (the server's max_message, {self.max_message} bytes)")
        self._reserve(key, old, total)
        new_len = self._table.append(key, value)
        self._account(key, old)
        self._wake(key)
        return new_len

    def _set(self, key: str, value: bytes) -> None:
        old = self._table.data.get(key)
        self._reserve(key, old, len(value))
        self._table.data[key] = value
        self._account(key, old)
        self._wake(key)

    def _wait(self, conn: _Conn, op: int, keys: List[str], timeout: float) -> None:
        missing = set(self._table.missing(keys))
        if not missing:
            self._answer_wait(conn, op, keys)
            return
        if timeout <= 0:
            self._reply(conn, [k.encode() for k in keys if k in missing], _ST_TIMEOUT)
            return
        if self._waits >= self.max_waits:
            raise StoreError(f"the store server already holds {self._waits} blocked requests, its limit "
                             f"(max_waits); try again later")
        w = _Waiter(conn, op, keys, missing, timeout)
        self._waits += 1
        conn.waiter = w
        for k in missing:
            self._by_key.setdefault(k, set()).add(w)
        heapq.heappush(self._deadlines, (w.deadline, next(self._seq), w))

    def _wait_size(self, conn: _Conn, key: str, size: int, timeout: float) -> None:
        if size < 0:
            raise StoreError(f"wait_size({key!r}): the size must be >= 0, got {size}")
        value = self._table.data.get(key)
        if value is not None and len(value) >= size:
            self._reply(conn, [value])
            return
        if timeout <= 0:
            self._reply(conn, [key.encode()], _ST_TIMEOUT)
            return
        if self._waits >= self.max_waits:
            raise StoreError(f"the store server already holds {self._waits} blocked requests, its limit "
                             f"(max_waits); try again later")
        w = _Waiter(conn, _OP_WAIT_SIZE, [key], set(), timeout, size)
        self._waits += 1
        conn.waiter = w
        self._by_size.setdefault(key, set()).add(w)
        heapq.heappush(self._deadlines, (w.deadline, next(self._seq), w))

    def _answer_wait(self, conn: _Conn, op: int, keys: List[str]) -> None:
        if op == _OP_WAIT:
            self._reply(conn, [])
        else:
            self._reply(conn, [self._table.data[k] for k in keys])

    def _drop_waiter(self, w: _Waiter) -> None:
        if not w.done:
            self._waits -= 1
        w.done = True
        w.conn.waiter = None
        if w.size >= 0:
            by_size = self._by_size.get(w.keys[0])
            if by_size is not None:
                by_size.discard(w)
                if not by_size:
                    del self._by_size[w.keys[0]]
            return
        for k in w.missing:
            s = self._by_key.get(k)
            if s is not None:
                s.discard(w)
                if not s:
                    del self._by_key[k]

    def _wake(self, key: str) -> None:
        if key in self._by_size:
            value = self._table.data.get(key)
            if value is not None:
                for w in [w for w in self._by_size[key] if len(value) >= w.size]:
                    self._drop_waiter(w)
                    self._reply(w.conn, [value])
                    self._ready.append(w.conn)
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
            self._ready.append(conn)  # _run_ready serves its next requests: no recursion through _set

    def _expire(self) -> None:
        now = time.monotonic()
        while self._deadlines and (self._deadlines[0][2].done or self._deadlines[0][0] <= now):
            _, _, w = heapq.heappop(self._deadlines)
            if w.done:
                continue
            missing = [k for k in w.keys if k in w.missing]
            self._drop_waiter(w)
            self._reply(w.conn, [k.encode() for k in missing], _ST_TIMEOUT)
            self._ready.append(w.conn)
        while self._unauthed:
            conn = next(iter(self._unauthed))
            if now - conn.opened <= self.handshake_timeout:
                break
            self._warn.warning("handshake", "store: closing connection from %s: no handshake within %.1f s",
                               conn.peer, self.handshake_timeout)
            self._close_conn(conn)
        if self._accept_paused_until and now >= self._accept_paused_until:
            self._accept_paused_until = 0.0
            self._sel.register(self._sock, selectors.EVENT_READ, None)
