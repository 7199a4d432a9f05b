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

from __future__ import annotations

from ..errors import NotSupported, StoreAuthError, StoreError, StoreTimeout
from ._wire import DEFAULT_MAX_MESSAGE
from .base import DEFAULT_TIMEOUT, Keys, PrefixStore, Store, Value
from .file import FileStore
from .memory import MemoryStore
from .tcp import TCPStore, _rebuild_tcp_store  # the latter: TCPStores pickled when this was one module
from .tcp_server import TCPStoreServer
from .torch import TorchStoreAdapter, wrap_torch_store

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
