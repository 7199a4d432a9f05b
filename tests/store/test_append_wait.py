"""append() and wait_size(): one request for many writers (the elastic agreement's votes), on every store;
the TCP server's request counters; a server that predates the operations; a server that dies mid-wait."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time

import pytest

from pycoll.errors import StoreError, StoreTimeout
from pycoll.store import (
    FileStore,
    MemoryStore,
    PrefixStore,
    Store,
    TCPStore,
    TCPStoreServer,
    _wire as wire,
    wrap_torch_store,
)

KINDS = ["memory", "tcp", "file", "prefix", "legacy-tcp", "torch-tcp", "torch-hash"]


class _LegacyServer(TCPStoreServer):
    """A server as it was before append/wait_size: it answers them "unknown operation" and closes."""

    def _dispatch(self, conn, payload):
        if payload[0] in wire._OP_ADDED:
            raise wire._ProtocolError(f"unknown operation {payload[0]}")
        super()._dispatch(conn, payload)


@pytest.fixture
def make_store(tmp_path):
    cleanup = []

    def make(kind: str) -> Store:
        if kind == "memory":
            s: Store = MemoryStore(timeout=5)
        elif kind in ("tcp", "prefix", "legacy-tcp"):
            server = (_LegacyServer if kind == "legacy-tcp" else TCPStoreServer)().start()
            cleanup.append(server.close)
            s = server.client(timeout=5)
            if kind == "prefix":
                cleanup.append(s.close)
                s = PrefixStore(s, "ns/")
        elif kind.startswith("torch"):
            dist = pytest.importorskip("torch.distributed")
            from datetime import timedelta

            ts = dist.HashStore() if kind == "torch-hash" else dist.TCPStore(
                "127.0.0.1", 0, is_master=True, wait_for_workers=False, timeout=timedelta(seconds=5))
            s = wrap_torch_store(ts, timeout=5)
        else:
            s = FileStore(tmp_path / "fs", timeout=5)
        cleanup.append(s.close)
        return s

    yield make
    for fn in reversed(cleanup):
        fn()


@pytest.mark.timeout(60)
@pytest.mark.parametrize("kind", KINDS)
def test_append_and_wait_size(make_store, kind):
    s = make_store(kind)
    assert s.append("v", b"ab") == 2
    assert s.append("v", "cd") == 4
    assert s.get("v") == b"abcd"
    assert s.wait_size("v", 3, timeout=0) == b"abcd"
    assert s.wait_size("v", 0) == b"abcd"
    with pytest.raises(StoreTimeout, match=r"'v' to hold 5 bytes") as info:
        s.wait_size("v", 5, timeout=0.2)
    assert info.value.keys == ["v"]
    with pytest.raises(StoreTimeout, match="'missing' to hold 0 bytes"):
        s.wait_size("missing", 0, timeout=0.1)  # a missing key holds nothing, not even 0 bytes

    # many writers, one waiter: it returns once the last one has appended
    got = []
    waiter = threading.Thread(target=lambda: got.append(s.wait_size("votes", 12 * 16, timeout=20)))
    waiter.start()
    writers = [threading.Thread(target=s.append, args=("votes", f"{i:012d}")) for i in range(16)]
    for w in writers:
        w.start()
    for w in writers:
        w.join()
    waiter.join(30)
    assert got and len(got[0]) == 12 * 16
    assert sorted(got[0][i:i + 12] for i in range(0, len(got[0]), 12)) == [f"{i:012d}".encode() for i in range(16)]
    # a set that makes the key long enough wakes a size waiter too
    t = threading.Timer(0.2, s.set, args=("late", b"xxxxxx"))
    t.start()
    assert s.wait_size("late", 6, timeout=10) == b"xxxxxx"
    t.join()


@pytest.mark.parametrize("kind", ["memory", "tcp", "file", "prefix", "torch-hash"])
def test_bad_inputs(make_store, kind):
    s = make_store(kind)
    with pytest.raises(ValueError, match="non-empty"):
        s.append("k", b"")
    with pytest.raises(TypeError, match="store keys must be str"):
        s.append(b"k", b"v")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="must be bytes or str"):
        s.append("k", 5)  # type: ignore[arg-type]
    for bad, exc in ((-1, ValueError), (True, TypeError), ("3", TypeError), (1 << 63, ValueError)):
        with pytest.raises(exc, match="wait_size"):
            s.wait_size("k", bad)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="timeout"):
        s.wait_size("k", 1, timeout=-1)
    s.set("counter", b"x")
    with pytest.raises(StoreTimeout):
        s.wait_size("counter", 2, timeout=0)


def test_append_respects_the_servers_limits():
    server = TCPStoreServer(max_bytes=64).start()
    try:
        s = server.client(timeout=5)
        s.append("k", b"x" * 40)
        with pytest.raises(StoreError, match="max_bytes"):
            s.append("k", b"x" * 40)
        assert s.get("k") == b"x" * 40  # nothing appended
        s.close()
    finally:
        server.close()


def test_wait_size_on_the_wire_rejects_malformed_requests():
    server = TCPStoreServer().start()
    try:
        s = server.client(timeout=5)
        s.set("k", b"v")
        for args, why in (([wire._D.pack(1.0), b"k"], b"wait_size takes 3 arguments"),
                          ([wire._D.pack(-1.0), b"k", wire._Q.pack(1)], b"bad timeout"),
                          ([wire._D.pack(1.0), b"k", b"short"], b"bad integer")):
            conn = s._acquire()  # an authenticated connection of the client itself
            try:
                conn.sock.sendall(wire._encode(wire._OP_WAIT_SIZE, args))
                status, out = _read_reply(conn)
                assert status == wire._ST_ERROR and why in out[0], out
            finally:
                s._discard(conn)
        with pytest.raises(StoreError, match="the size must be >= 0"):
            s._call(wire._OP_WAIT_SIZE, [wire._D.pack(1.0), b"k", wire._Q.pack(-5)])
        assert s.get("k") == b"v"  # the server keeps serving the others
        s.close()
    finally:
        server.close()


def _read_reply(conn):
    (n,) = wire._LEN.unpack(conn._recv_exact(wire._LEN.size))
    return wire._decode(memoryview(conn._recv_exact(n)))


def test_server_counts_requests():
    server = TCPStoreServer().start()
    try:
        s = server.client(timeout=5)
        before = server.stats()
        s.append("v", b"1")
        s.wait_size("v", 1)
        s.set("k", b"x")
        s.multi_get(["k", "v"])
        after = server.stats()
        assert after["requests"] - before["requests"] == 4
        assert after["append"] - before["append"] == 1 and after["wait_size"] - before["wait_size"] == 1
        assert after["arguments"] - before["arguments"] == 2 + 3 + 2 + 3
        assert after["connections"] == 1 and after["waiting"] == 0
        s.close()
    finally:
        server.close()


def test_legacy_server_falls_back_once(make_store):
    s = make_store("legacy-tcp")
    assert s.append("v", b"ab") == 2 and s.append("v", b"c") == 3
    assert s._legacy_server
    assert s.wait_size("v", 3, timeout=1) == b"abc"
    s.set("other", b"1")  # the connection the old server closed was not reused
    assert s.get("other") == b"1"


@pytest.mark.timeout(60)
def test_server_that_dies_during_a_wait_size_is_a_clear_store_error():
    env = dict(os.environ, PYCOLL_STORE_TOKEN="dies")
    proc = subprocess.Popen([sys.executable, "-m", "pycoll.store", "--port", "0"], stdout=subprocess.PIPE,
                            stderr=subprocess.DEVNULL, env=env, text=True)
    try:
        lines = dict(proc.stdout.readline().strip().split("=", 1) for _ in range(2))
        client = TCPStore(lines["PYCOLL_STORE_ADDR"], int(lines["PYCOLL_STORE_PORT"]), "dies", timeout=30,
                          connect_timeout=2)
        client.append("v", b"x")
        threading.Timer(0.3, os.kill, args=(proc.pid, signal.SIGKILL)).start()
        t0 = time.monotonic()
        with pytest.raises(StoreError, match="wait_size: lost the connection") as info:
            client.wait_size("v", 100, timeout=30)
        assert not isinstance(info.value, StoreTimeout)
        assert time.monotonic() - t0 < 10
        with pytest.raises(StoreError):  # and the next call says so too, within its connect timeout
            client.append("v", b"y")
        client.close()
    finally:
        proc.kill()
        proc.wait(10)
        proc.stdout.close()


@pytest.mark.timeout(60)
@pytest.mark.parametrize("kind", KINDS)
def test_append_get_votes_and_waits_in_one_call(make_store, kind):
    s = make_store(kind)
    s.set("decision", b"early")
    assert s.append_get("votes", b"a", "decision", timeout=1) == b"early"
    # the vote lands at once (another waiter sees it) while the caller still waits for the decision
    got = []
    t = threading.Thread(target=lambda: got.append(s.append_get("votes", b"b", "decision2", timeout=20)))
    t.start()
    assert s.wait_size("votes", 2, timeout=10) == b"ab"
    s.set("decision2", b"late")
    t.join(30)
    assert got == [b"late"]
    with pytest.raises(StoreTimeout, match="'missing'") as info:
        s.append_get("votes", b"c", "missing", timeout=0.2)
    assert info.value.keys == ["missing"]
    assert s.get("votes") == b"abc"  # a wait that timed out keeps its append
    with pytest.raises(ValueError, match="non-empty"):
        s.append_get("votes", b"", "decision")
    with pytest.raises(TypeError, match="store keys must be str"):
        s.append_get("votes", b"d", b"decision")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="timeout"):
        s.append_get("votes", b"d", "decision", timeout=-1)
    assert s.get("votes") == b"abc"  # bad arguments append nothing


def test_append_get_is_one_request():
    server = TCPStoreServer().start()
    try:
        s = server.client(timeout=5)
        s.set("d", b"x")
        before = server.stats()
        assert s.append_get("v", b"1", "d") == b"x"
        after = server.stats()
        assert after["requests"] - before["requests"] == 1 and after["append_get"] - before["append_get"] == 1
        s.close()
    finally:
        server.close()


def test_a_new_connection_counts_against_the_calls_own_bound():
    # the client's connection was dropped (a timeout) and its server stopped: it still accepts connections (the
    # kernel does) and never answers. The next get(timeout=1) reconnected within connect_timeout (60 s; the handshake
    # alone waited 30 s), not within its own bound (timeout + REPLY_GRACE)
    import socket

    server = TCPStoreServer().start()
    silent = socket.socket()
    try:
        silent.bind(("127.0.0.1", 0))
        silent.listen(8)  # accepts, never greets
        s = server.client(timeout=5, connect_timeout=60)
        s.REPLY_GRACE = 0.5
        s.set("k", b"v")
        for c in s._idle:
            c.close()
        s._idle.clear()
        s.port = silent.getsockname()[1]
        t0 = time.monotonic()
        with pytest.raises(StoreTimeout):
            s.get("k", timeout=0.5)
        assert time.monotonic() - t0 < 3.0
        s.close()
    finally:
        silent.close()
        server.close()
