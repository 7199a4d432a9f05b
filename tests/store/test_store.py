"""The store protocol, the same for every implementation; then TCP- and file-specific behaviour."""

from __future__ import annotations

import os
import pickle
import signal
import socket
import struct
import subprocess
import sys
import threading
import time

import pytest
from helpers.mp import held_by_another_thread, in_a_fork, run_ranks

from pycoll import failpoints
from pycoll._procs import stat_fields
from pycoll._settings import requests_until
from pycoll.errors import NotSupported, StoreAuthError, StoreError, StoreLost, StoreTimeout
from pycoll.store import (
    FileStore,
    MemoryStore,
    PrefixStore,
    Store,
    TCPStore,
    TCPStoreServer,
    TorchStoreAdapter,
    wrap_torch_store,
)
from pycoll.store.tcp_server import unauthenticated_for

KINDS = ["memory", "tcp", "file", "prefix", "torch-hash", "torch-tcp"]


def _blocked_get(store, timeout=30):
    """``store.get("never", timeout)`` in a thread of its own, started: (the thread, the StoreErrors it ended with)."""
    errors = []

    def blocked():
        try:
            store.get("never", timeout)
        except StoreError as exc:
            errors.append(exc)

    t = threading.Thread(target=blocked, daemon=True)
    t.start()
    return t, errors


@pytest.fixture
def make_store(tmp_path):
    """make_store(kind) -> a fresh store of that kind; everything is closed at the end."""
    cleanup = []

    def make(kind: str) -> Store:
        if kind == "memory":
            s: Store = MemoryStore(timeout=5)
        elif kind in ("tcp", "prefix"):
            server = TCPStoreServer().start()
            cleanup.append(server.close)
            s = server.client(timeout=5)
            if kind == "prefix":
                cleanup.append(s.close)  # closing a view leaves the store open
                s.set("outside", b"x")  # a key the view must not see
                s = PrefixStore(s, "ns/")
        elif kind == "file":
            s = FileStore(tmp_path / f"store{len(cleanup)}", timeout=5)
        elif kind.startswith("torch"):
            dist = pytest.importorskip("torch.distributed")
            from datetime import timedelta

            if kind == "torch-hash":
                ts = dist.HashStore()
            else:
                ts = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False,
                                   timeout=timedelta(seconds=5))
            s = wrap_torch_store(ts, timeout=5)
        else:
            raise AssertionError(kind)
        cleanup.append(s.close)
        return s

    yield make
    for fn in reversed(cleanup):
        fn()


@pytest.mark.parametrize("kind", KINDS)
def test_semantics(make_store, kind):
    s = make_store(kind)
    base_keys = s.num_keys()
    s.set("a", b"\x00\xffbin")
    s.set("b", "text")
    assert s.get("a") == b"\x00\xffbin"
    assert s.get("b") == b"text"
    s.set("a", b"")
    assert s.get("a") == b""
    assert s.check(["a", "b"]) and s.check("a")
    assert not s.check(["a", "nope"])
    assert s.add("n", 5) == 5
    assert s.add("n", -7) == -2
    assert s.get("n") == b"-2"
    assert s.num_keys() - base_keys == 3
    # compare_set, torch semantics
    assert s.compare_set("c", "", "first") == b"first"
    assert s.compare_set("c", "wrong", "second") == b"first"
    assert s.compare_set("c", "first", "second") == b"second"
    assert s.get("c") == b"second"
    assert s.compare_set("missing", "expected", "x") == b"expected"
    assert not s.check(["missing"])
    # delete
    assert s.delete("c") is True
    assert s.delete("c") is False
    assert not s.check(["c"])
    s.wait(["a", "b"], timeout=1)
    assert s.multi_get(["b", "n"]) == [b"text", b"-2"]
    assert s.num_keys() - base_keys == 3
    assert [k for k in s.list_keys() if k in ("a", "b", "n")] == ["a", "b", "n"]
    assert s.list_keys("n") == ["n"]


@pytest.mark.parametrize("kind", KINDS)
def test_set_nowait(make_store, kind):
    """set_nowait: the value is there for this client's next request and for the others (the TCP
    client reads the answer with its next request; the other stores set it at once)."""
    s = make_store(kind)
    s.set_nowait("posted", b"1")
    s.set_nowait("posted", b"2")
    s.set_nowait("other", "text")
    assert s.get("posted") == b"2" and s.get("other") == b"text"  # answered in order on its connection
    with pytest.raises(TypeError):
        s.set_nowait("k", 42)  # type: ignore[arg-type]  # refused at once, as by set()
    with pytest.raises(TypeError):
        s.set_nowait(b"bytes-key", b"v")  # type: ignore[arg-type]


def test_set_nowait_reaches_the_store_before_the_sender_goes_on_and_reports_late_errors(caplog):
    with TCPStoreServer(max_bytes=1 << 16) as server:
        server.start()
        sender, reader = server.client(timeout=5), server.client(timeout=5)
        sender.set_nowait("k", b"v")
        assert reader.get("k", timeout=5) == b"v"  # another client sees it without the sender's next request
        sender.set_nowait("big", b"x" * (1 << 17))  # over the server's byte budget: answered with an error
        with caplog.at_level("WARNING", logger="pycoll.store"):
            assert sender.get("k") == b"v"  # the next request reads that answer first and logs it
        assert any("set of 'big' sent without waiting failed" in r.getMessage() for r in caplog.records)
        assert not reader.check(["big"])
        sender.close()
        reader.close()


@pytest.mark.parametrize("kind", KINDS)
def test_timeouts_name_keys(make_store, kind):
    s = make_store(kind)
    s.set("here", b"1")
    t0 = time.monotonic()
    with pytest.raises(StoreTimeout) as info:
        s.get("absent-key", timeout=0.2)
    assert 0.15 < time.monotonic() - t0 < 15
    assert "absent-key" in str(info.value) and "0.2" in str(info.value)
    assert isinstance(info.value, TimeoutError) and isinstance(info.value, StoreError)
    with pytest.raises(StoreTimeout, match="absent-2"):
        s.wait(["here", "absent-2"], timeout=0.1)
    with pytest.raises(StoreTimeout, match="zero"):
        s.get("zero", timeout=0)
    assert s.get("here", timeout=0) == b"1"
    s.timeout = 0.1
    with pytest.raises(StoreTimeout):
        s.get("absent-key")


@pytest.mark.parametrize("kind", KINDS)
def test_get_wakes_when_another_thread_sets(make_store, kind):
    s = make_store(kind)
    timer = threading.Timer(0.2, s.set, args=("late", b"v"))
    timer.start()
    assert s.get("late", timeout=10) == b"v"
    timer.join(10)
    # (torch's HashStore.add wakes no wait(): the torch adapter polls check() instead)
    timer = threading.Timer(0.2, s.add, args=("late-counter", 1))
    timer.start()
    t0 = time.monotonic()
    s.wait(["late", "late-counter"], timeout=10)
    assert time.monotonic() - t0 < 8
    timer.join(10)


@pytest.mark.parametrize("kind", ["memory", "tcp", "file", "prefix"])
def test_bad_arguments(make_store, kind):
    s = make_store(kind)
    with pytest.raises(TypeError):
        s.set(b"bytes-key", b"v")  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        s.set("k", 42)  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        s.add("k", 1.5)  # type: ignore[arg-type]
    with pytest.raises(ValueError):
        s.add("k", 1 << 64)
    with pytest.raises(ValueError):
        s.get("k", timeout=-1)
    with pytest.raises(ValueError):
        s.get("k", timeout=float("nan"))
    s.set("text", b"abc")
    with pytest.raises(StoreError, match="not an integer"):
        s.add("text", 1)
    s.set("big", str((1 << 63) - 1))
    with pytest.raises(StoreError, match="overflow"):
        s.add("big", 1)


@pytest.mark.parametrize("kind", ["memory", "tcp", "file"])
def test_threads_share_one_store(make_store, kind):
    s = make_store(kind)
    n_threads, per_thread = 4, 50
    errors = []

    def worker():
        try:
            for _ in range(per_thread):
                s.add("counter", 1)
        except Exception as exc:  # pragma: no cover - reported below
            errors.append(exc)

    threads = [threading.Thread(target=worker) for _ in range(n_threads)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not errors
    assert s.get("counter") == str(n_threads * per_thread).encode()


def test_blocked_get_does_not_delay_other_threads(make_store):
    s = make_store("tcp")
    got = []
    t = threading.Thread(target=lambda: got.append(s.get("later", timeout=30)))
    t.start()
    time.sleep(0.1)
    t0 = time.monotonic()
    for i in range(20):
        s.set(f"k{i}", b"x")
        assert s.get(f"k{i}") == b"x"
    assert time.monotonic() - t0 < 10  # far below the 30 s the other thread waits
    s.set("later", b"done")
    t.join(10)
    assert got == [b"done"]


def test_wait_needs_every_key_at_once(make_store):
    s = make_store("tcp")
    done = threading.Event()

    def waiter():
        s.wait(["x", "y"], timeout=10)
        done.set()

    t = threading.Thread(target=waiter)
    t.start()
    s.set("x", b"1")
    s.delete("x")
    s.set("y", b"1")
    assert not done.wait(0.3)  # x was deleted again: still waiting
    s.set("x", b"2")
    assert done.wait(10)
    t.join(10)


def test_prefix_store_namespaces(make_store):
    root = make_store("tcp")
    a = PrefixStore(root, "a/")
    ab = PrefixStore(a, "b/")
    assert ab.prefix == "a/b/" and ab.store is root
    a.set("k", b"1")
    ab.set("k", b"2")
    assert root.get("a/k") == b"1" and root.get("a/b/k") == b"2"
    assert a.list_keys() == ["b/k", "k"] and ab.list_keys() == ["k"]
    assert a.num_keys() == 2 and ab.num_keys() == 1
    with pytest.raises(StoreTimeout) as info:
        ab.get("nope", timeout=0.05)
    assert "'nope'" in str(info.value) and "a/b/" in str(info.value)
    ab.close()  # a view does not close the store under it
    assert root.get("a/k") == b"1"
    with pytest.raises(TypeError):
        PrefixStore(object(), "x")  # type: ignore[arg-type]


# --------------------------------------------------------------------------------------------------
# TCP


def _raw_connect(server: TCPStoreServer) -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", server.port), timeout=5)
    return sock


def _recv_exact(sock: socket.socket, n: int) -> bytes:
    out = b""
    while len(out) < n:
        chunk = sock.recv(n - len(out))
        if not chunk:
            break
        out += chunk
    return out


def _raw_authenticated(server: TCPStoreServer) -> socket.socket:
    from pycoll.store import _wire as st

    sock = _raw_connect(server)
    magic, version, snonce = st._SERVER_HELLO.unpack(_recv_exact(sock, st._SERVER_HELLO.size))
    cnonce = os.urandom(32)
    mac = st._mac(st._to_bytes(server.token), b"client", snonce, cnonce)
    sock.sendall(st._CLIENT_HELLO.pack(magic, version, cnonce, mac))
    status, _ = st._SERVER_REPLY.unpack(_recv_exact(sock, st._SERVER_REPLY.size))
    assert status == 0
    return sock


def _is_closed(sock: socket.socket, timeout: float = 5.0) -> bool:
    """Whether the peer closed the connection (after any data it sent)."""
    sock.settimeout(timeout)
    try:
        while True:
            data = sock.recv(65536)
            if not data:
                return True
    except ConnectionResetError:
        return True
    except TimeoutError:
        return False


def test_bytes_token():
    with TCPStoreServer(token=b"\x00\xffraw") as server:
        server.start()
        client = server.client(timeout=5)
        client.set("k", b"v")
        other = TCPStore("127.0.0.1", server.port, b"\x00\xffraw")
        assert other.get("k") == b"v"
        other.close()
        client.close()


def test_wrong_token_is_refused_and_server_keeps_serving():
    with TCPStoreServer(token="right") as server:
        server.start()
        good = server.client(timeout=5)
        good.set("k", b"v")
        with pytest.raises(StoreAuthError, match="refused"):
            TCPStore("127.0.0.1", server.port, "wrong", connect_timeout=5)
        with pytest.raises(StoreAuthError):
            TCPStore("127.0.0.1", server.port, b"right!", connect_timeout=5)
        assert good.get("k") == b"v"
        again = TCPStore("127.0.0.1", server.port, "right")
        assert again.get("k") == b"v"
        again.close()
        good.close()


def test_token_never_crosses_the_wire():
    """A fake server records what the client sends: the token is not in it."""
    token = "s3cret-token-value"
    listener = socket.create_server(("127.0.0.1", 0))
    captured = []

    def fake_server():
        from pycoll.store import _wire as st

        conn, _ = listener.accept()
        with conn:
            conn.sendall(st._SERVER_HELLO.pack(st._MAGIC, st._VERSION, os.urandom(32)))
            captured.append(_recv_exact(conn, st._CLIENT_HELLO.size))
            conn.sendall(st._SERVER_REPLY.pack(0, os.urandom(32)))  # does not know the token
            _recv_exact(conn, 1)

    t = threading.Thread(target=fake_server)
    t.start()
    with pytest.raises(StoreAuthError, match="could not prove"):
        TCPStore("127.0.0.1", listener.getsockname()[1], token, connect_timeout=5)
    t.join(10)
    listener.close()
    assert captured and token.encode() not in captured[0]


def test_missing_token_is_an_error(monkeypatch):
    monkeypatch.delenv("PYCOLL_STORE_TOKEN", raising=False)
    with pytest.raises(StoreError, match="PYCOLL_STORE_TOKEN"):
        TCPStore("127.0.0.1", 1, None)
    with pytest.raises(StoreError, match="empty"):
        TCPStore("127.0.0.1", 1, "")


@pytest.mark.parametrize("garbage", [
    "not-a-client",      # wrong magic in place of the handshake
    "unknown-op",        # a valid frame with an unknown operation
    "overrun",           # an argument longer than its frame
    "wrong-arity",       # set with one argument
    "bad-utf8-key",
    "oversized",         # a length header above the limit
    "truncated",         # half a frame, then the client goes away
])
def test_malformed_messages_close_only_that_connection(garbage):
    from pycoll.store import _wire as st

    with TCPStoreServer(max_message=4096) as server:
        server.start()
        bystander = server.client(timeout=5)
        bystander.set("k", b"v")
        waiting = []
        t = threading.Thread(target=lambda: waiting.append(bystander.get("w", timeout=20)))
        t.start()
        if garbage == "not-a-client":
            sock = _raw_connect(server)
            _recv_exact(sock, st._SERVER_HELLO.size)
            sock.sendall(b"GET / HTTP/1.1\r\n" * 8)
        else:
            sock = _raw_authenticated(server)
            if garbage == "unknown-op":
                sock.sendall(st._encode(99, [b"x"]))
            elif garbage == "overrun":
                sock.sendall(struct.pack("!IBI", 5, st._OP_GET, 1000))
            elif garbage == "wrong-arity":
                sock.sendall(st._encode(st._OP_SET, [b"only-key"]))
            elif garbage == "bad-utf8-key":
                sock.sendall(st._encode(st._OP_SET, [b"\xff\xfe", b"v"]))
            elif garbage == "oversized":
                sock.sendall(struct.pack("!I", 1 << 30) + b"x" * 100)
            elif garbage == "truncated":
                sock.sendall(st._encode(st._OP_SET, [b"key", b"v" * 1000])[:50])
                sock.close()
        if garbage != "truncated":
            assert _is_closed(sock), "the server kept a misbehaving connection open"
            sock.close()
        # the server and its other clients are unharmed
        assert bystander.get("k") == b"v"
        other = server.client(timeout=5)
        other.set("w", b"woken")
        t.join(10)
        assert waiting == [b"woken"]
        assert not other.check(["key"])
        other.close()
        bystander.close()


def test_oversized_value_is_refused_without_harm():
    with TCPStoreServer(max_message=4096) as server:
        server.start()
        small = server.client(timeout=5, max_message=4096)
        with pytest.raises(StoreError, match="exceeds"):
            small.set("k", b"x" * 10000)  # refused by the client itself
        big = server.client(timeout=5)
        for size in (10000, 1 << 20):  # refused by the server with its reason, however much is still being sent
            with pytest.raises(StoreError, match="exceeds the server's limit of 4096 bytes") as e:
                big.set("k", b"x" * size)
            assert not isinstance(e.value, StoreLost)
        big.set("k", b"fits")  # its connection goes on
        assert small.get("k") == b"fits"
        tiny = server.client(timeout=5, max_message=1024)
        big.set("big", b"y" * 2000)
        with pytest.raises(StoreError, match="exceeds this client's limit of 1024 bytes") as e:
            tiny.get("big")  # the store is there: its reply is refused, no lost store
        assert not isinstance(e.value, StoreLost)
        assert tiny.get("k") == b"fits"
        tiny.close()
        # an append that would grow a value past what a reply may hold is refused: the value stays readable
        big.set("grow", b"a" * 3000)
        with pytest.raises(StoreError, match=r"the value under 'grow' would grow to 6000 bytes, more than a reply "
                                             r"may hold \(the server's max_message, 4096 bytes\)"):
            big.append("grow", b"b" * 3000)
        with pytest.raises(StoreError, match="would grow to"):
            big.append_get("grow", b"b" * 3000, "grow", 1.0)
        assert big.get("grow") == b"a" * 3000 and big.append("grow", b"c") == 3001
        small.close()
        big.close()


def test_stalled_handshake_is_dropped():
    with TCPStoreServer(handshake_timeout=0.3) as server:
        server.start()
        sock = _raw_connect(server)
        t0 = time.monotonic()
        assert _is_closed(sock, timeout=10)
        assert time.monotonic() - t0 < 8
        sock.close()
        client = server.client(timeout=5)
        client.set("k", b"v")
        client.close()


@pytest.mark.parametrize("kind", ["memory", "tcp", "file", "prefix"])
def test_keys_are_text_and_counters_decimal(make_store, kind):
    s = make_store(kind)
    with pytest.raises(ValueError, match="is no valid text"):
        s.set("\udc80", b"1")  # a lone surrogate: UTF-8 has no form for it (it raised UnicodeEncodeError, or not)
    s.set("é", b"1")
    for held in (b"1_000", b" 12 ", b"+5", b"0x10"):  # what int() would take, or half of it
        s.set("c", held)
        with pytest.raises(StoreError, match="not an integer counter"):
            s.add("c", 1)
    s.set("c", b"-7")
    assert s.add("c", 1) == -6


def test_a_file_store_whose_file_or_folder_goes_says_so(tmp_path):
    """Its file removed while in use: a StoreError that says the keys are gone (it was silently made again, empty);
    its folder missing: a StoreError naming the path (was a bare FileNotFoundError)."""
    path = tmp_path / "d" / "s"
    with pytest.raises(StoreError, match="cannot open the FileStore at .*: No such file or directory"):
        FileStore(path)
    os.makedirs(path.parent)
    s = FileStore(path, timeout=1)
    s.set("k", b"v")
    os.unlink(path)
    for call in (lambda: s.get("k", 0), lambda: s.set("k", b"w"), lambda: s.append("k", b"w")):
        with pytest.raises(StoreError, match="was removed while the store was in use: its keys are gone"):
            call()
    s.close()


@pytest.mark.parametrize("kind", KINDS)
def test_identical_appends_racing_all_land(make_store, kind):
    """Four threads append the same record 150 times each: every append lands (a compare-and-set loop lost some:
    two appends from the same old value give the same new one)."""
    s = make_store(kind)
    threads = [threading.Thread(target=lambda: [s.append("log", b"x") for _ in range(150)]) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert s.get("log") == b"x" * 600


def test_a_wait_of_30_days_leaves_the_server_serving_the_others():
    """The OS's wait takes at most 2**31 - 1 ms: a client's wait due in 30 days (or a handshake timeout as long) made
    the server's loop fail and retry without serving anyone until its deadline came within that."""
    from datetime import timedelta

    for srv in (TCPStoreServer(), TCPStoreServer(handshake_timeout=30 * 86400)):
        srv.start()
        try:
            a, b = srv.client(timeout=5), srv.client(timeout=2)
            _blocked_get(a, timedelta(days=30))  # the server's close ends it
            time.sleep(0.2)
            b.set("k", b"v")
            assert b.get("k") == b"v"
        finally:
            srv.close()


def test_a_bad_connect_timeout_is_named_as_itself():
    # it said "timeout must be >= 0 seconds, got -1": the call has a timeout= of its own
    with pytest.raises(ValueError, match="^connect_timeout must be >= 0 seconds, got -1$"):
        TCPStore("127.0.0.1", 1, "tok", connect_timeout=-1)


def test_unreachable_server_fails_after_connect_timeout():
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    sock.close()  # nothing listens there now
    t0 = time.monotonic()
    with pytest.raises(StoreTimeout, match=f"127.0.0.1:{port}.*0.5 s"):
        TCPStore("127.0.0.1", port, "tok", connect_timeout=0.5)
    assert time.monotonic() - t0 < 10


def test_client_may_start_before_server():
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    sock.close()
    servers = []

    def start_later():
        time.sleep(0.4)
        servers.append(TCPStoreServer("127.0.0.1", port, "tok").start())

    t = threading.Thread(target=start_later)
    t.start()
    try:
        client = TCPStore("127.0.0.1", port, "tok", connect_timeout=30)
        client.set("k", b"v")
        assert client.get("k") == b"v"
        client.close()
    finally:
        t.join()
        for s in servers:
            s.close()


def test_server_going_away_fails_blocked_calls_quickly():
    server = TCPStoreServer().start()
    client = server.client(timeout=30, connect_timeout=0.5)
    t, errors = _blocked_get(client)
    time.sleep(0.2)
    t0 = time.monotonic()
    server.close()
    t.join(10)
    assert errors and not isinstance(errors[0], StoreTimeout)
    assert time.monotonic() - t0 < 5
    with pytest.raises(StoreError):
        client.set("k", b"v")
    client.close()


def test_a_server_that_stopped_is_lost_at_once_not_waited_for_until_the_connect_timeout():
    # a client that reached its server before: every call after the server stopped raises StoreLost within about
    # REFUSED_GONE s, where it kept connecting for its connect_timeout (60 s) and then raised StoreTimeout
    server = TCPStoreServer().start()
    client = server.client(timeout=30)  # connect_timeout: the default, 60 s
    client.set("k", b"v")
    server.close()
    for _ in range(3):  # the pooled connection's loss, then calls that must connect again
        t0 = time.monotonic()
        with pytest.raises(StoreLost):
            client.get("k", 0)
        assert time.monotonic() - t0 < 5
    with pytest.raises(StoreLost, match=r"refuses connections: its server, which this client reached before, is gone"):
        client.check(["k"])
    client.close()


def test_close_unblocks_waiting_threads():
    with TCPStoreServer() as server:
        server.start()
        client = server.client(timeout=30)
        t, errors = _blocked_get(client)
        time.sleep(0.2)
        client.close()
        t.join(10)
        assert not t.is_alive() and errors
        with pytest.raises(StoreError, match="closed"):
            client.get("k", 0)


def test_a_closed_memory_store_refuses_calls_and_wakes_its_waiters():
    # Store.close() says later calls raise StoreError: a MemoryStore went on serving them
    store = MemoryStore(timeout=30)
    store.set("k", b"v")
    t, errors = _blocked_get(store)
    sized: list = []

    def wait_size():
        try:
            store.wait_size("k", 10)
        except StoreError as exc:
            sized.append(exc)

    waiter = threading.Thread(target=wait_size, daemon=True)
    waiter.start()
    time.sleep(0.2)
    store.close()
    store.close()
    t.join(10)
    waiter.join(10)
    assert not t.is_alive() and "closed" in str(errors[0]), errors
    assert not waiter.is_alive() and "closed" in str(sized[0]), sized
    for call in (lambda: store.get("k", 0), lambda: store.set("k", b"w"), lambda: store.add("n", 1),
                 lambda: store.num_keys()):
        with pytest.raises(StoreError, match="the MemoryStore is closed"):
            call()


def test_hosting_client_owns_its_server():
    client = TCPStore.hosting(token="tok", timeout=5)
    other = TCPStore("127.0.0.1", client.port, "tok", timeout=5)
    other.set("k", b"v")
    assert client.get("k") == b"v"
    client.close()
    with pytest.raises(StoreError):
        other.get("k", 1)
    other.close()


def _rank_counts(rank, n, store):
    store.add("arrived", 1)
    store.set(f"rank{rank}", str(rank))
    values = store.multi_get([f"rank{r}" for r in range(n)], timeout=30)
    assert store.get("arrived", 0) >= b"1"
    total = 0
    for _ in range(100):
        total = store.add("total", 1)
    store.add("done", 1)
    return [int(v) for v in values], total


@pytest.mark.timeout(60)
@pytest.mark.parametrize("kind", ["tcp", "file"])
def test_processes_share_a_store(kind, tmp_path):
    """Real processes: the store pickles by address (TCP) or path (file) and reconnects."""
    if kind == "tcp":
        server = TCPStoreServer().start()
        store: Store = server.client(timeout=30)
    else:
        server = None
        store = FileStore(tmp_path / "shared", timeout=30)
    try:
        results = run_ranks(_rank_counts, 3, store, timeout=45)
        assert all(values == [0, 1, 2] for values, _ in results)
        assert store.get("total") == b"300"
        assert store.get("done") == b"3"
    finally:
        store.close()
        if server is not None:
            server.close()


def test_tcp_store_pickles_by_address():
    with TCPStoreServer() as server:
        server.start()
        client = server.client(timeout=5)
        copy = pickle.loads(pickle.dumps(client))
        copy.set("k", b"v")
        assert client.get("k") == b"v"
        copy.close()
        client.close()


def test_standalone_server_cli():
    env = dict(os.environ, PYCOLL_STORE_TOKEN="cli-token", PYTHONPATH=_repo_root())
    proc = subprocess.Popen([sys.executable, "-m", "pycoll.store", "--port", "0"], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, env=env, text=True)
    try:
        lines = dict(proc.stdout.readline().strip().split("=", 1) for _ in range(2))
        client = TCPStore(lines["PYCOLL_STORE_ADDR"], int(lines["PYCOLL_STORE_PORT"]), "cli-token", timeout=5)
        client.set("k", b"v")
        assert client.get("k") == b"v"
        client.close()
    finally:
        proc.terminate()
        proc.wait(10)
        proc.stdout.close()
        proc.stderr.close()


def test_standalone_server_cli_refuses_bad_arguments_in_a_line():
    env = dict(os.environ, PYTHONPATH=_repo_root())
    run = [sys.executable, "-m", "pycoll.store"]
    bad = subprocess.run(run + ["--max-message", "10"], capture_output=True, text=True, timeout=30, env=env)
    assert bad.returncode == 2 and "max_message must be at least 1024 bytes" in bad.stderr, bad.stderr
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        busy = subprocess.run(run + ["--port", str(taken.getsockname()[1])], capture_output=True, text=True,
                              timeout=30, env=env)
    assert busy.returncode == 1 and "cannot listen on 127.0.0.1:" in busy.stderr, busy.stderr
    assert "Traceback" not in bad.stderr + busy.stderr


def _repo_root() -> str:
    import pycoll

    return os.path.dirname(os.path.dirname(os.path.abspath(pycoll.__file__)))


# --------------------------------------------------------------------------------------------------
# file store


def test_file_store_compacts_and_survives_torn_writes(tmp_path):
    path = tmp_path / "fs"
    a = FileStore(path, timeout=5)
    b = FileStore(path, timeout=5)
    for i in range(3000):
        a.set("hot", str(i))
    a.set("keep", b"k")
    assert os.path.getsize(path) < 64 * 1024 + 100  # compacted at least once
    assert b.get("hot") == b"2999" and b.get("keep") == b"k"
    # a writer that died in the middle of a record leaves a torn tail: it is dropped
    with open(path, "ab") as f:
        f.write(struct.pack("!BII", 1, 3, 100) + b"abc" + b"partial")
    assert b.get("keep") == b"k"
    b.set("after", b"ok")
    assert a.get("after") == b"ok" and a.num_keys() == 3
    a.close()
    b.close()
    FileStore.remove_files(path)
    assert not os.path.exists(path) and not os.path.exists(f"{path}.lock")


_HOLD_AND_STOP = """
import os, signal, sys
from pycoll.store import FileStore
s = FileStore(sys.argv[1])
s.set("k", b"v")
s._plock.acquire(5, "test")  # as if stopped in the middle of a write
print("held", flush=True)
os.kill(os.getpid(), signal.SIGSTOP)
s._plock.release()
s.set("after", b"continued")
"""


def test_a_file_store_reads_past_a_stopped_writer_and_names_it_as_its_writes_time_out(tmp_path):
    path = str(tmp_path / "fs")
    child = subprocess.Popen([sys.executable, "-c", _HOLD_AND_STOP, path], stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout.readline() == "held\n"
        deadline = time.monotonic() + 10
        while stat_fields(child.pid)[0] != "T" and time.monotonic() < deadline:
            time.sleep(0.01)
        s = FileStore(path, timeout=0.5)  # an existing store opens without its lock
        # reads take no lock (they would wait for it until the child is continued)
        assert s.get("k") == b"v" and s.check(["k"]) and s.list_keys() == ["k"] and s.num_keys() == 1
        s.wait(["k"])
        with pytest.raises(StoreTimeout, match=rf"lock file .*fs.lock was held for 0.5 s by pid {child.pid} "
                                               r"\(stopped: SIGSTOP"):
            s.set("x", b"1")
        os.kill(child.pid, signal.SIGCONT)
        assert child.wait(10) == 0
        assert s.get("after", timeout=5) == b"continued"
        s.set("x", b"1")
        s.close()
    finally:
        child.kill()
        child.wait()
        child.stdout.close()


def test_a_file_store_gives_up_by_the_threads_request_deadline_while_a_stopped_writer_holds_its_lock(tmp_path):
    """``requests_until`` bounds a FileStore's requests as a TCPStore's (at least 1 s each): a communicator's closing,
    whose observers' store requests are best effort, waited for the lock file a stopped peer held for the store's
    own timeout, and its failure was not handled meanwhile."""
    path = str(tmp_path / "fs")
    child = subprocess.Popen([sys.executable, "-c", _HOLD_AND_STOP, path], stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout.readline() == "held\n"
        s = FileStore(path, timeout=30)
        for call in (lambda: s.set("x", b"1"), lambda: s.wait(["missing"], timeout=30)):
            t0 = time.monotonic()
            with requests_until(t0 + 0.2), pytest.raises(StoreTimeout):
                call()
            assert 0.9 < time.monotonic() - t0 < 5
        t0 = time.monotonic()
        with requests_until(t0 + 30), pytest.raises(StoreTimeout, match="held for 0.5 s"):
            FileStore(path, timeout=0.5).set("x", b"1")  # the store's own timeout, where it comes first
        assert time.monotonic() - t0 < 5
        os.kill(child.pid, signal.SIGCONT)
        assert child.wait(10) == 0
        with requests_until(time.monotonic() + 0.2):
            s.set("x", b"1")  # within the bound: done
        assert s.get("x") == b"1"
        s.close()
    finally:
        child.kill()
        child.wait()
        child.stdout.close()


def test_a_file_store_request_cut_short_behind_a_thread_names_what_held_the_lock(tmp_path):
    """A request bounded by ``requests_until`` that timed out waiting behind another thread of its process blamed that
    thread ("another thread of this process held its lock") where the thread was itself only waiting for the lock file
    a stopped process held: it names that process, as the unbounded wait does; a thread really inside a write is
    named as such."""
    path = str(tmp_path / "fs")
    child = subprocess.Popen([sys.executable, "-c", _HOLD_AND_STOP, path], stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout.readline() == "held\n"
        s = FileStore(path, timeout=30)
        waiting = threading.Thread(target=s.set, args=("a", b"1"))  # waits for the lock file, holding the thread lock
        waiting.start()
        deadline = time.monotonic() + 10
        while not s._plock.lock.locked() and time.monotonic() < deadline:
            time.sleep(0.01)
        with requests_until(time.monotonic() + 0.2), pytest.raises(StoreTimeout) as info:
            s.set("b", b"1")
        assert f"held by pid {child.pid} (stopped: SIGSTOP or a debugger)" in str(info.value), info.value
        assert "another thread of this process held" not in str(info.value), info.value
        os.kill(child.pid, signal.SIGCONT)
        waiting.join(10)
        assert not waiting.is_alive() and s.get("a") == b"1"
        assert child.wait(10) == 0
        # a thread of this process inside a write (holding the lock file)
        with held_by_another_thread(_PlockHeld(s)), requests_until(time.monotonic() + 0.2), \
                pytest.raises(StoreTimeout) as info:
            s.set("b", b"1")
        assert "another thread of this process held its lock file" in str(info.value), info.value
        assert "inside a write" in str(info.value), info.value
        s.set("b", b"1")
        assert s.get("b") == b"1"
        s.close()
    finally:
        child.kill()
        child.wait()
        child.stdout.close()


class _PlockHeld:
    """A FileStore's process lock taken as a write takes it: the thread lock and the lock file."""

    def __init__(self, store: FileStore) -> None:
        self.plock = store._plock

    def __enter__(self) -> None:
        self.plock.acquire(5, "test")

    def __exit__(self, *exc: object) -> None:
        self.plock.release()


def test_file_store_rejects_foreign_files(tmp_path):
    path = tmp_path / "not-a-store"
    path.write_bytes(b"hello world, definitely not a store")
    with pytest.raises(StoreError, match="not a pycoll FileStore"):
        FileStore(path)


def test_file_store_close(tmp_path):
    s = FileStore(tmp_path / "fs")
    s.set("k", b"v")
    s.close()
    s.close()
    with pytest.raises(StoreError, match="closed"):
        s.get("k")


# --------------------------------------------------------------------------------------------------
# torch adapter


def test_torch_adapter_is_duck_typed():
    class Fake:
        def __init__(self):
            self.d = {}

        def set(self, k, v):
            self.d[k] = v

        def get(self, k):
            return self.d[k]

        def add(self, k, n):
            self.d[k] = str(int(self.d.get(k, b"0")) + n).encode()
            return int(self.d[k])

        def wait(self, keys, td):
            if any(k not in self.d for k in keys):
                raise RuntimeError("Wait timeout")

        def compare_set(self, k, e, d):
            raise NotImplementedError

        def delete_key(self, k):
            return self.d.pop(k, None) is not None

        def check(self, keys):
            return all(k in self.d for k in keys)

        def num_keys(self):
            return len(self.d)

    s = wrap_torch_store(Fake(), timeout=1)
    assert isinstance(s, TorchStoreAdapter)
    s.set("k", "v")
    assert s.get("k") == b"v" and s.add("n", 2) == 2
    with pytest.raises(StoreTimeout, match="'absent'"):
        s.get("absent", timeout=0.05)
    with pytest.raises(NotSupported):
        s.list_keys()
    with pytest.raises(TypeError, match="lacks"):
        wrap_torch_store(object())
    assert wrap_torch_store(s) is s


def test_store_module_does_not_import_torch():
    code = "import sys, pycoll.store, pycoll.env, pycoll.run; assert 'torch' not in sys.modules, 'torch imported'"
    subprocess.run([sys.executable, "-c", code], check=True, env=dict(os.environ, PYTHONPATH=_repo_root()),
                   timeout=60)


def test_torch_adapter_polls_instead_of_torch_wait(capfd):
    """torch's TCPStore logs a c10d warning ("waitForInput: ... timed out") for every wait() that times out,
    and pycoll's threads wait with short timeouts all the time: the adapter polls check() instead, and its
    timeouts name the keys still missing."""
    dist = pytest.importorskip("torch.distributed")
    from datetime import timedelta

    ts = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False, timeout=timedelta(seconds=5))
    s = wrap_torch_store(ts, timeout=5)
    s.set("here", b"1")
    for _ in range(3):
        with pytest.raises(StoreTimeout) as info:
            s.wait(["here", "absent"], timeout=0.1)
        assert info.value.missing == ["absent"]
        with pytest.raises(StoreTimeout, match="'absent'"):
            s.get("absent", timeout=0.05)
    timer = threading.Timer(0.05, s.set, args=("late", b"v"))
    timer.start()
    t0 = time.monotonic()
    assert s.get("late", timeout=5) == b"v"
    assert time.monotonic() - t0 < 1.0  # seen within a poll's pause (at most 50 ms) of being set
    timer.join(5)
    assert "waitForInput" not in capfd.readouterr().err


def test_torch_adapter_multi_get_is_one_read_and_close_ends_its_use():
    dist = pytest.importorskip("torch.distributed")
    calls = []

    class Counting(dist.HashStore):
        def get(self, key):
            calls.append(("get", key))
            return super().get(key)

        def multi_get(self, keys):
            calls.append(("multi_get", list(keys)))
            return super().multi_get(keys)

    ts = Counting()
    s = wrap_torch_store(ts, timeout=5)
    for i in range(4):
        s.set(f"k/{i}", f"v{i}")
    assert s.multi_get([f"k/{i}" for i in range(4)]) == [b"v0", b"v1", b"v2", b"v3"]
    assert calls == [("multi_get", ["k/0", "k/1", "k/2", "k/3"])]  # not one get per key
    assert s.multi_get([]) == []
    t, errors = _blocked_get(s)
    time.sleep(0.1)
    s.close()
    t.join(5)
    assert not t.is_alive() and errors and not isinstance(errors[0], StoreTimeout)
    with pytest.raises(StoreError, match="closed"):
        s.get("k/0", 0)
    assert ts.get("k/0") == b"v0"  # the torch store itself stays open


_EXIT_WITH_TORCH_STORE = r"""
import threading, numpy as np, pycoll, torch.distributed as dist
from datetime import timedelta
from pycoll.errors import StoreError
server = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False, timeout=timedelta(seconds=5))
client = dist.TCPStore("127.0.0.1", server.port, is_master=False, timeout=timedelta(seconds=5))
comm = pycoll.init(0, 1, store=client, timeout=5)  # the watchdog's threads use the store from now on
comm.all_reduce(np.ones(4))
store = pycoll.store.wrap_torch_store(client)

def poll():  # as pycoll's own threads do, only without a pause: a torch call is in flight at any moment
    while True:
        try:
            store.check(["never"])
        except StoreError:
            pass

for _ in range(2):
    threading.Thread(target=poll, daemon=True).start()
"""


def test_process_using_a_torch_store_exits_cleanly():
    """A daemon thread inside a torch call when the interpreter finalizes dies as the call returns, through
    pybind11's noexcept GIL guard: std::terminate, SIGABRT. The adapter's exit gate lets no other thread start
    a torch call once the exit handlers run, and waits for those in flight."""
    pytest.importorskip("torch.distributed")
    env = dict(os.environ, PYTHONPATH=_repo_root(), PYCOLL_FR_DUMP_ON_FAILURE="0")
    for _ in range(2):  # without the gate, 8 runs of 8 ended by SIGABRT
        proc = subprocess.run([sys.executable, "-c", _EXIT_WITH_TORCH_STORE], env=env, capture_output=True,
                              text=True, timeout=60)
        assert proc.returncode == 0, proc.stderr[-2000:]


def test_a_client_the_server_sheds_during_its_handshake_connects_again():
    """A server sheds the oldest connection that has not authenticated while more than its max_unauthenticated wait
    (hundreds of ranks connecting at once over a network, a round trip each): a client shed there connects again
    (it failed with "closed the connection during the handshake", and its rank with it)."""
    with TCPStoreServer(token="t", max_unauthenticated=1) as server:
        server.start()
        failpoints.configure("store.connect.handshake=sleep(400)")  # the client's first try stays unanswered
        try:
            out: dict = {}
            t = threading.Thread(target=lambda: out.update(c=server.client(timeout=5, connect_timeout=20)))
            t.start()
            deadline = time.monotonic() + 10
            while server.stats()["connections"] < 1 and time.monotonic() < deadline:
                time.sleep(0.005)
            raw = _raw_connect(server)  # one more without a handshake: the client's, the oldest, is shed
            t.join(20)
        finally:
            failpoints.reset()
        assert server.stats()["shed"] >= 1
        out["c"].set("k", b"v")
        assert out["c"].get("k") == b"v"
        out["c"].close()
        raw.close()


def test_a_client_shed_until_its_connect_timeout_says_why():
    """A server that greets and then closes every connection: the client tries again until its connect_timeout,
    then a StoreTimeout names the last error."""
    from pycoll.store import _wire as st

    listener = socket.create_server(("127.0.0.1", 0))
    port = listener.getsockname()[1]
    stop = threading.Event()

    def serve():
        listener.settimeout(0.1)
        while not stop.is_set():
            try:
                sock, _ = listener.accept()
            except TimeoutError:
                continue
            sock.sendall(st._SERVER_HELLO.pack(st._MAGIC, st._VERSION, os.urandom(st._NONCE)))
            sock.close()

    t = threading.Thread(target=serve, daemon=True)
    t.start()
    t0 = time.monotonic()
    try:
        with pytest.raises(StoreTimeout, match=r"within 1 s \(last error: .*closed the connection during the hand"):
            TCPStore("127.0.0.1", port, "t", connect_timeout=1)
        assert 0.3 < time.monotonic() - t0 < 5  # it gives up where its next try would come past the deadline
    finally:
        stop.set()
        t.join(5)
        listener.close()


def test_a_job_store_takes_every_rank_handshaking_at_once():
    """pycoll-run's store and a SLURM/Open MPI rank 0's take twice the job's ranks in handshakes at once."""
    assert unauthenticated_for(4) == 64 and unauthenticated_for(1000) == 2000
    host = TCPStore.hosting(token="t", timeout=5, max_unauthenticated=300)
    try:
        assert host.server.max_unauthenticated == 300
    finally:
        host.close()


def test_a_torch_store_whose_server_is_gone_is_not_asked_again_at_once(caplog):
    # the watchdog's rounds went on calling a torch store whose server had died: torch logged a warning with a C++
    # backtrace for each call (about two a second per rank) and pycoll said nothing
    from pycoll.store import wrap_torch_store

    class DistNetworkError(RuntimeError):
        pass

    class Gone:
        calls = 0

        def __getattr__(self, name):
            if name not in ("set", "get", "add", "wait", "compare_set", "delete_key", "check", "num_keys"):
                raise AttributeError(name)

            def call(*args):
                Gone.calls += 1
                raise DistNetworkError("Broken pipe")
            return call

    s = wrap_torch_store(Gone(), timeout=5)
    with caplog.at_level("WARNING", logger="pycoll.store"):
        for _ in range(5):
            with pytest.raises(StoreLost):
                s.set("k", b"v")
    assert Gone.calls == 1  # asked once; the others fail at once for LOST_RETRY seconds
    assert sum("cannot be reached" in r.getMessage() for r in caplog.records) == 1
    s._lost_at -= 10.0  # 10 s later
    with pytest.raises(StoreLost, match="lost the connection"):
        s.set("k", b"v")  # asked again after it
    assert Gone.calls == 2
    s._lost_at -= 10.0  # still gone: asked again after 20 s, not 10 (an idle rank logged a backtrace every 10 s)
    with pytest.raises(StoreLost, match="asked again 20 s after"):
        s.set("k", b"v")
    s._lost_at -= 10.0
    with pytest.raises(StoreLost, match="lost the connection"):
        s.set("k", b"v")
    assert Gone.calls == 3


@pytest.mark.timeout(60)
def test_a_forked_child_uses_a_file_store_of_its_own_while_a_parent_thread_holds_its_locks(tmp_path):
    """A parent's thread inside the store at the fork held its locks there for good: the child's first write waited
    forever, holding the lock file, and every other process of the job timed out."""
    path = str(tmp_path / "store")
    s = FileStore(path, timeout=5)
    s.set("a", b"1")
    for held in ("reader", "writer", "registry"):
        lock = {"reader": s._mu, "writer": s._plock.lock, "registry": type(s._plock)._registry_lock}[held]
        with held_by_another_thread(lock):  # a reading or writing thread at the fork
            got = in_a_fork(lambda: (s.set("k", held), s.get("a"), FileStore(path, timeout=5).get("k")))
        assert got == f"ok (None, b'1', b'{held}')", (held, got)
        assert s.get("k", timeout=5) == held.encode()  # the parent goes on
    s.close()


def test_a_memory_store_stays_in_its_process():
    """Forked, a MemoryStore was another store (the ranks waited out their init timeout blaming each other);
    pickled for a spawned process, a message about an RLock."""
    s = MemoryStore()
    s.set("a", b"1")
    assert "StoreError: a MemoryStore lives in the process that made it" in in_a_fork(lambda: s.get("a"))
    with pytest.raises(TypeError, match="a MemoryStore cannot be pickled .* use a TCPStore or a FileStore"):
        pickle.dumps(s)
    assert s.get("a") == b"1"


def test_a_connect_timeout_has_the_attributes_a_wait_timeout_has():
    # a handler reading e.timeout/e.missing (declared on the class) got AttributeError from a connect timeout
    import socket

    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    with pytest.raises(StoreTimeout) as ei:
        TCPStore("127.0.0.1", port, "tok", connect_timeout=0.3)
    assert ei.value.keys == [] and ei.value.missing == [] and ei.value.timeout is None
    with pytest.raises(StoreTimeout) as ei:
        MemoryStore().get("k", timeout=0.05)
    assert ei.value.keys == ["k"] and ei.value.missing == ["k"] and ei.value.timeout == 0.05
