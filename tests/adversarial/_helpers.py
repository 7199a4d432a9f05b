"""Helpers of the adversarial tests: raw store clients, child processes that are always reaped."""

from __future__ import annotations

import os
import secrets
import signal
import socket
import subprocess
import sys
from typing import Any, List, Optional, Sequence

from pycoll.store._wire import (
    _CLIENT_HELLO,
    _D,
    _LEN,
    _MAGIC,
    _NONCE,
    _SERVER_HELLO,
    _SERVER_REPLY,
    _VERSION,
    _decode,
    _encode,
    _mac,
)

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def raw_client(port: int, token: bytes, timeout: float = 10.0) -> socket.socket:
    """A socket that completed the store handshake with ``token``."""
    sock = socket.create_connection(("127.0.0.1", port), timeout=timeout)
    hello = recv_exact(sock, _SERVER_HELLO.size)
    _, _, server_nonce = _SERVER_HELLO.unpack(hello)
    client_nonce = secrets.token_bytes(_NONCE)
    sock.sendall(_CLIENT_HELLO.pack(_MAGIC, _VERSION, client_nonce, _mac(token, b"client", server_nonce, client_nonce)))
    status, _ = _SERVER_REPLY.unpack(recv_exact(sock, _SERVER_REPLY.size))
    assert status == 0, status
    return sock


def recv_exact(sock: socket.socket, n: int) -> bytes:
    buf = bytearray()
    while len(buf) < n:
        chunk = sock.recv(n - len(buf))
        if not chunk:
            raise ConnectionResetError("closed")
        buf += chunk
    return bytes(buf)


def frame(op: int, *args: bytes) -> bytes:
    return _encode(op, list(args))


def timeout_arg(seconds: float) -> bytes:
    return _D.pack(seconds)


def read_reply(sock: socket.socket) -> tuple[int, List[bytes]]:
    (n,) = _LEN.unpack(recv_exact(sock, _LEN.size))
    return _decode(memoryview(recv_exact(sock, n)))


def env(**extra: str) -> dict:
    e = dict(os.environ)
    e["PYTHONPATH"] = ROOT + os.pathsep + e.get("PYTHONPATH", "")
    e.update(extra)
    return e


class Child:
    """A child process in its own session; :meth:`kill` kills its group and reaps it."""

    def __init__(self, args: Sequence[str], environ: Optional[dict] = None, **kw: Any) -> None:
        self.popen = subprocess.Popen(list(args), env=environ or env(), start_new_session=True,
                                      stdout=subprocess.PIPE, stderr=subprocess.PIPE, **kw)

    def communicate(self, timeout: float) -> tuple[int, str, str]:
        try:
            out, err = self.popen.communicate(timeout=timeout)
        except subprocess.TimeoutExpired as exc:
            self.kill()
            out, err = self.popen.communicate()
            raise AssertionError(
                f"child did not finish in {timeout} s; stderr:\n{err.decode(errors='replace')}"
            ) from exc
        return self.popen.returncode, out.decode(errors="replace"), err.decode(errors="replace")

    def kill(self) -> None:
        try:
            os.killpg(self.popen.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        try:
            self.popen.wait(10)
        except subprocess.TimeoutExpired:
            pass

    def __enter__(self) -> Child:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.kill()
        for f in (self.popen.stdout, self.popen.stderr):
            if f is not None:
                f.close()


def python(code: str, *args: str, environ: Optional[dict] = None) -> Child:
    return Child([sys.executable, "-c", code, *args], environ)
