"""Finding 11: init's deadline bounds reaching the store (connect and handshake included)."""

from __future__ import annotations

import socket
import time

import pytest

from pycoll.errors import StoreError
from pycoll.store import TCPStore

from ._helpers import env, python


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


_INIT = (
    "import pycoll, time\nt = time.monotonic()\ntry:\n    pycoll.init(backend='host', init_timeout=3)\n"
    "except Exception as exc:\n    print('FAILED', type(exc).__name__, round(time.monotonic() - t, 1), exc)\n"
)


def _rank_env(port: int) -> dict:
    return env(PYCOLL_RANK="1", PYCOLL_WORLD_SIZE="2", PYCOLL_LOCAL_RANK="1", PYCOLL_LOCAL_WORLD_SIZE="2",
               PYCOLL_NODE_RANK="0", PYCOLL_NNODES="1", PYCOLL_STORE_ADDR="127.0.0.1", PYCOLL_STORE_PORT=str(port),
               PYCOLL_STORE_TOKEN="t" * 32, PYCOLL_RUN_ID="adversarial")


@pytest.mark.timeout(30)
def test_init_timeout_bounds_an_unreachable_store() -> None:
    t0 = time.monotonic()
    with python(_INIT, environ=_rank_env(_closed_port())) as child:
        rc, out, err = child.communicate(25)
    assert "FAILED" in out and "3 s" in out, (out, err)
    assert time.monotonic() - t0 < 12, out


@pytest.mark.timeout(30)
def test_init_timeout_bounds_a_store_that_never_answers() -> None:
    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen(16)  # accepts connections (in the kernel), never says hello
        t0 = time.monotonic()
        with python(_INIT, environ=_rank_env(silent.getsockname()[1])) as child:
            rc, out, err = child.communicate(25)
        assert "FAILED" in out, (out, err)
        assert time.monotonic() - t0 < 12, out


@pytest.mark.timeout(20)
def test_connect_timeout_includes_the_handshake() -> None:
    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen(16)
        t0 = time.monotonic()
        with pytest.raises(StoreError):
            TCPStore("127.0.0.1", silent.getsockname()[1], "t", connect_timeout=1.0)
        assert time.monotonic() - t0 < 2.5


@pytest.mark.timeout(60)
@pytest.mark.parametrize("rank", [0, 1])
def test_init_timeout_bounds_the_requests_to_a_store_that_stopped_answering(rank: int) -> None:
    # connected, then the server stopped (a rank 0's host under a debugger, a partition): rank 1 waited 73 s for
    # init_timeout=3 (a get, then two give-up notes of 30 s each), rank 0 330 s (its publishing request took the
    # client's 300 s timeout)
    import os
    import signal
    import subprocess
    import sys

    server = subprocess.Popen([sys.executable, "-m", "pycoll.store", "--port", "0"], stdout=subprocess.PIPE,
                              env={**os.environ, "PYCOLL_STORE_TOKEN": "t" * 32})
    try:
        port = int([server.stdout.readline() for _ in range(2)][1].split(b"=")[1])  # type: ignore[union-attr]
        store = TCPStore("127.0.0.1", port, "t" * 32)  # the client's timeout: 300 s
        os.kill(server.pid, signal.SIGSTOP)
        import pycoll

        t0 = time.monotonic()
        with pytest.raises(StoreError, match="did not answer"):
            pycoll.init(rank, 2, store=store, backend="host", init_timeout=2)
        assert time.monotonic() - t0 < 8.0
    finally:
        server.kill()
        server.wait()


def test_a_rank_0_that_does_not_come_is_not_taken_for_a_store_that_does_not_answer() -> None:
    # bounded by init_timeout, the wait for the unique id gave up a moment before the store's own timeout reply (1 run
    # in 2): "the store did not answer", where it had, that rank 0 had published nothing
    import pycoll

    host = TCPStore.hosting("127.0.0.1", 0, "t" * 32)
    try:
        for _ in range(3):
            with pytest.raises(StoreError, match="rank 0 published no unique id"):
                pycoll.init(1, 2, store=TCPStore("127.0.0.1", host.port, "t" * 32), backend="host", init_timeout=1)
    finally:
        host.close()


@pytest.mark.timeout(60)
def test_a_destroy_is_not_held_by_a_store_that_stopped_answering() -> None:
    # the watchdog's deletes of the communicator's store records, made as it closes, held destroy(timeout=5) 60 s
    import os
    import signal
    import subprocess
    import sys

    import pycoll

    server = subprocess.Popen([sys.executable, "-m", "pycoll.store", "--port", "0"], stdout=subprocess.PIPE,
                              env={**os.environ, "PYCOLL_STORE_TOKEN": "t" * 32})
    try:
        port = int([server.stdout.readline() for _ in range(2)][1].split(b"=")[1])  # type: ignore[union-attr]
        comm = pycoll.init(0, 1, store=TCPStore("127.0.0.1", port, "t" * 32), backend="host", init_timeout=10)
        comm.all_reduce(__import__("numpy").ones(2))
        os.kill(server.pid, signal.SIGSTOP)
        t0 = time.monotonic()
        comm.destroy(timeout=5)
        assert time.monotonic() - t0 < 8.0 and comm.state == "destroyed"
    finally:
        server.kill()
        server.wait()
