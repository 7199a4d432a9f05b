"""The wire protocol of pycoll's TCP store: framing, handshake, op and status codes.

TCP wire protocol (version 1; big-endian):

* Handshake. Server -> client: ``b"PYCSTORE"``, u16 version, 32-byte server nonce. Client -> server:
  ``b"PYCSTORE"``, u16 version, 32-byte client nonce, HMAC-SHA256(token, ``b"client"`` + server
  nonce + client nonce). Server -> client: u8 status (0 accepted, 1 bad token, 2 bad version) and
  HMAC-SHA256(token, ``b"server"`` + server nonce + client nonce), which the client checks in turn.
  The token never crosses the wire; digests are compared in constant time.
* Then request/response frames: u32 payload length, then the payload. A request payload is u8 op
  followed by arguments, each a u32 length and that many bytes (ints are ``!q``, timeouts ``!d``);
  a response payload is u8 status (0 ok, 1 timeout, 2 error) followed by arguments the same way.
  Operations 11 (append: key, value -> ``!q`` new length) and 12 (wait_size: timeout, key, ``!q``
  size -> the value once it holds at least size bytes) came later under the same version: a server
  without them answers status 2 ("unknown operation") and closes the connection, and the client
  then uses the generic implementation. So did operation 13 (append_get: timeout, key, value, wait
  key -> appends value to key, then answers as get does for the wait key: a vote and the wait for
  the decision in one request).
* A frame longer than the server's ``max_message`` (64 MiB by default) is answered with an error and its bytes
  dropped (one of more than 256 MiB, garbage, closes the connection); malformed payloads and stalled handshakes close
  that connection only.
"""

from __future__ import annotations

import hashlib
import hmac
import os
import struct
from typing import List, Sequence, Tuple, Union

from ..errors import StoreError
from .base import _to_bytes

#: Default limit on one TCP store message (request or response), in bytes.
DEFAULT_MAX_MESSAGE = 64 << 20

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
 _OP_LIST_KEYS, _OP_APPEND, _OP_WAIT_SIZE, _OP_APPEND_GET) = range(1, 14)
_OP_NAMES = {
    _OP_SET: "set", _OP_GET: "get", _OP_ADD: "add", _OP_WAIT: "wait", _OP_CAS: "compare_set",
    _OP_DELETE: "delete", _OP_CHECK: "check", _OP_NUM_KEYS: "num_keys", _OP_MULTI_GET: "multi_get",
    _OP_LIST_KEYS: "list_keys", _OP_APPEND: "append", _OP_WAIT_SIZE: "wait_size", _OP_APPEND_GET: "append_get",
}
#: operations added after version 1 without a version change: a server that predates them answers
#: "unknown operation" and closes that connection, and the client falls back to the generic
#: implementation of :class:`~pycoll.store.Store` (made of the version-1 operations)
_OP_ADDED = frozenset((_OP_APPEND, _OP_WAIT_SIZE, _OP_APPEND_GET))
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
