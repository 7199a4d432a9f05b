"""Finding 1 and 8: the TCP store server cannot be killed, locked out or filled by a client."""

from __future__ import annotations

import socket
import textwrap
import threading
import time
from typing import List

import pytest

from pycoll.errors import StoreError
from pycoll.store import TCPStore, TCPStoreServer
from pycoll.store._wire import _OP_GET, _OP_LIST_KEYS, _OP_SET, _OP_WAIT, _ST_ERROR, _ST_OK

from ._helpers import frame, python, raw_client, read_reply, timeout_arg

TOKEN = b"adversarial-token"


@pytest.fixture
def server():
    srv = TCPStoreServer("127.0.0.1", 0, TOKEN).start()
    yield srv
    srv.close()


@pytest.mark.timeout(60)
def test_wake_chain_is_iterative(server: TCPStoreServer) -> None:
    """Connection i pipelines wait(k_i), set(k_i+1); one set(k_0) then answers every wait in a chain."""
    n = 400
    socks: List[socket.socket] = []
    try:
        for i in range(n):
            s = raw_client(server.port, TOKEN)
            s.sendall(frame(_OP_WAIT, timeout_arg(30.0), f"k{i}".encode())
                      + frame(_OP_SET, f"k{i + 1}".encode(), b"v"))
            socks.append(s)
        time.sleep(0.2)
        start = raw_client(server.port, TOKEN)
        socks.append(start)
        start.sendall(frame(_OP_SET, b"k0", b"v"))
        assert read_reply(start)[0] == _ST_OK
        for s in socks[:-1]:
            assert read_reply(s)[0] == _ST_OK  # the wait
            assert read_reply(s)[0] == _ST_OK  # the set behind it
        assert server.serving
        with server.client() as c:
            assert c.get(f"k{n}") == b"v"
    finally:
        for s in socks:
            s.close()


@pytest.mark.timeout(30)
def test_failing_request_closes_only_its_connection(server: TCPStoreServer) -> None:
    def boom(prefix: str) -> List[str]:
        raise RuntimeError("a bug in the server")

    server._table.list_keys = boom  # type: ignore[method-assign]
    bad = raw_client(server.port, TOKEN)
    good = server.client()
    try:
        bad.sendall(frame(_OP_LIST_KEYS, b""))
        assert bad.recv(100) == b""  # closed
        time.sleep(0.1)
        assert server.serving
        good.set("a", "1")
        assert good.get("a") == b"1"
    finally:
        bad.close()
        good.close()


@pytest.mark.timeout(30)
def test_memory_limits_give_clear_errors() -> None:
    with TCPStoreServer("127.0.0.1", 0, TOKEN, max_keys=4, max_bytes=200, max_waits=2).start() as srv:
        c = srv.client(timeout=5.0)
        try:
            for i in range(4):
                c.set(f"k{i}", b"x")
            with pytest.raises(StoreError, match="max_keys"):
                c.set("k4", b"x")
            c.set("k0", b"y")  # replacing a value needs no new key
            with pytest.raises(StoreError, match="max_bytes"):
                c.set("k1", b"x" * 500)
            with pytest.raises(StoreError, match="max_keys"):
                c.add("counter", 1)
            assert c.delete("k3")
            assert c.add("counter", 1) == 1
            waiting = [raw_client(srv.port, TOKEN) for _ in range(3)]
            try:
                for s in waiting[:2]:
                    s.sendall(frame(_OP_GET, b"never", timeout_arg(20.0)))
                time.sleep(0.2)
                waiting[2].sendall(frame(_OP_GET, b"never", timeout_arg(20.0)))
                status, args = read_reply(waiting[2])
                assert status == _ST_ERROR and b"max_waits" in args[0]
                assert srv.serving
            finally:
                for s in waiting:
                    s.close()
        finally:
            c.close()


_FLOOD_SERVER = textwrap.dedent("""
    import logging, resource, sys
    resource.setrlimit(resource.RLIMIT_NOFILE, (256, 256))
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr, format="%(message)s")
    from pycoll.store import TCPStoreServer
    srv = TCPStoreServer("127.0.0.1", 0, b"adversarial-token")
    print(srv.port, flush=True)
    srv.serve_forever()
""")


@pytest.mark.timeout(60)
def test_unauthenticated_flood_does_not_lock_out_the_token_holder() -> None:
    with python(_FLOOD_SERVER) as child:
        assert child.popen.stdout is not None
        port = int(child.popen.stdout.readline())
        flood: List[socket.socket] = []
        try:
            for _ in range(600):
                flood.append(socket.create_connection(("127.0.0.1", port), timeout=5.0))
            time.sleep(0.5)
            t0 = time.monotonic()
            store = TCPStore("127.0.0.1", port, TOKEN, timeout=5.0, connect_timeout=5.0)
            store.set("x", "1")
            assert store.get("x") == b"1"
            store.close()
            assert time.monotonic() - t0 < 5.0
            time.sleep(1.0)
        finally:
            for s in flood:
                s.close()
        child.popen.kill()
        _, err = child.popen.communicate(10)
    lines = [ln for ln in err.decode(errors="replace").splitlines() if ln.strip()]
    assert len(lines) < 20, lines[:40]


@pytest.mark.timeout(30)
def test_waiters_and_server_survive_many_threads(server: TCPStoreServer) -> None:
    """Many concurrent blocked gets are answered by one set each, and the server stays up."""
    c = server.client(timeout=10.0)
    results: List[bytes] = []
    threads = [threading.Thread(target=lambda: results.append(c.get("late"))) for _ in range(20)]
    for t in threads:
        t.start()
    time.sleep(0.3)
    c.set("late", b"ok")
    for t in threads:
        t.join(10)
    c.close()
    assert results == [b"ok"] * 20 and server.serving
