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

Modules: :mod:`~pycoll.store.base` (the protocol, its semantics, :class:`PrefixStore`),
:mod:`~pycoll.store.memory`, :mod:`~pycoll.store._wire` (the TCP wire protocol),
:mod:`~pycoll.store.tcp_server`, :mod:`~pycoll.store.tcp`, :mod:`~pycoll.store.file`,
:mod:`~pycoll.store.torch` and :mod:`~pycoll.store.__main__` (the standalone server's command line).
"""

# ruff: noqa: F401
# The private names below are those of the single module pycoll.store was, kept importable from here.

from __future__ import annotations

from ..errors import NotSupported, StoreAuthError, StoreError, StoreTimeout
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
from .base import (
    _INT64_MAX,
    _INT64_MIN,
    DEFAULT_TIMEOUT,
    Keys,
    PrefixStore,
    Store,
    Value,
    _check_amount,
    _check_key,
    _check_keys,
    _check_timeout,
    _Table,
    _timeout_error,
    _to_bytes,
)
from .file import _FILE_MAGIC, _REC, _REC_DELETE, _REC_SET, FileStore, _PathLock
from .memory import MemoryStore
from .tcp import TCPStore, _ClientConn, _rebuild_tcp_store
from .tcp_server import TCPStoreServer, _Conn, _Waiter, log
from .torch import _TORCH_METHODS, TorchStoreAdapter, wrap_torch_store

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
