"""The bindings against the real libnccl of the nvidia-nccl-cu13 wheel, on a machine without a GPU.

What NCCL does here is in the research note (§3): the library loads, reports its version and error
strings, makes unique ids (starting a bootstrap listener, hence NCCL_SOCKET_IFNAME=lo), and fails
every call that needs CUDA with ncclUnhandledCudaError.
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys

import pytest
from helpers import REPO

import pycoll
from pycoll._bindings import _nccl

pytestmark = pytest.mark.timeout(60)


def _wheel_installed():
    try:
        return importlib.util.find_spec("nvidia.nccl") is not None
    except (ImportError, ValueError):
        return False


if not _wheel_installed():
    pytest.skip("the nvidia-nccl-cu13 wheel (the real libnccl) is not installed", allow_module_level=True)

HAS_GPU = os.path.exists("/dev/nvidia0") or os.path.exists("/dev/nvidiactl")

ERROR_STRINGS = [
    "no error",
    "unhandled cuda error (run with NCCL_DEBUG=INFO for details)",
    "unhandled system error (run with NCCL_DEBUG=INFO for details)",
    "internal error - please report this issue to the NCCL developers",
    "invalid argument (run with NCCL_DEBUG=WARN for details)",
    "invalid usage (run with NCCL_DEBUG=WARN for details)",
    "remote process exited or there was a network error",
    "NCCL operation in progress",
    "timeout",
    "unknown result code",
]


@pytest.fixture(scope="module")
def nccl():
    # ncclGetUniqueId starts a bootstrap listener on the interface NCCL picks; keep it on loopback
    old = os.environ.get("NCCL_SOCKET_IFNAME")
    os.environ["NCCL_SOCKET_IFNAME"] = "lo"
    try:
        yield _nccl.load("nccl")
    finally:
        if old is None:
            os.environ.pop("NCCL_SOCKET_IFNAME", None)
        else:
            os.environ["NCCL_SOCKET_IFNAME"] = old


def test_loads_the_wheel(nccl):
    assert nccl.kind == "nccl"
    assert os.path.basename(nccl.path) == "libnccl.so.2"
    assert os.path.join("nvidia", "nccl", "lib") in nccl.path
    assert _nccl.load("nccl") is nccl and _nccl.load(nccl.path) is nccl


def test_version(nccl):
    assert nccl.get_version() == nccl.version
    major, minor, _ = nccl.version_tuple
    assert (major, minor) == (2, 32)
    assert nccl.version >= 23200


def test_exports_every_declared_function(nccl):
    assert nccl.missing == []
    assert all(nccl.has(name) for name in _nccl.FUNCTIONS)
    assert not any(nccl.has(name) for name in _nccl.HOST_FUNCTIONS + _nccl.RCCL_FUNCTIONS)


def test_error_strings(nccl):
    assert [nccl.get_error_string(i) for i in range(10)] == ERROR_STRINGS


def test_unique_id(nccl):
    uid = nccl.get_unique_id()
    raw = bytes(uid)
    assert isinstance(uid, _nccl.UniqueId) and len(raw) == 128
    assert raw != bytes(128)
    assert raw[8:10] == b"\x02\x00"  # after 8 bytes of random magic, a sockaddr_in (AF_INET)
    assert nccl.get_unique_id() != uid


def test_unique_id_and_parameters_in_a_fresh_process():
    # NCCL picks its bootstrap interface once per process, so check it where nothing ran before
    code = (
        "from pycoll._bindings import load; import sys; lib = load('nccl');"
        "print(lib.param_get('NCCL_DEBUG_SUBSYS'), lib.param_get('PYCOLL_NO_SUCH_PARAMETER'));"
        "print(bytes(lib.get_unique_id()).hex())"
    )
    env = dict(os.environ, NCCL_SOCKET_IFNAME="lo", NCCL_DEBUG_SUBSYS="INIT,ENV", PYTHONPATH=REPO)
    env.pop("PYCOLL_NCCL_LIBRARY", None)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, env=env)
    assert out.returncode == 0, out.stderr
    params, uid = out.stdout.splitlines()[-2:]
    raw = bytes.fromhex(uid)
    assert len(raw) == 128 and raw[12:16] == bytes([127, 0, 0, 1])
    assert params.split() == ["INIT,ENV", "None"]  # ncclParamGetParameter reads NCCL's parameters


@pytest.mark.skipif(HAS_GPU, reason="this machine has a GPU: init would succeed")
def test_init_without_gpu_is_an_unhandled_cuda_error(nccl):
    uid = nccl.get_unique_id()
    with pytest.raises(pycoll.UnhandledCudaError) as info:
        nccl.comm_init_rank(1, uid, 0)
    exc = info.value
    assert exc.code == 1 and exc.function == "ncclCommInitRank"
    assert exc.error_string == ERROR_STRINGS[1]
    assert "Cuda failure" in exc.last_error and exc.last_error in str(exc)
    assert exc.library == nccl.path
    assert "Cuda failure" in nccl.get_last_error(0)


@pytest.mark.skipif(HAS_GPU, reason="this machine has a GPU: init would succeed")
def test_nonblocking_init_config_without_gpu(nccl):
    with pytest.raises(pycoll.UnhandledCudaError, match="ncclCommInitRankConfig"):
        nccl.comm_init_rank_config(1, nccl.get_unique_id(), 0, _nccl.Config(blocking=0))


def test_null_handles(nccl):
    assert nccl.comm_abort(0) == _nccl.SUCCESS
    assert nccl.comm_destroy(0) == _nccl.SUCCESS
    with pytest.raises(pycoll.InvalidArgument) as info:
        nccl.comm_count(0)
    assert info.value.code == 4 and "comm argument is NULL" in info.value.last_error
    assert isinstance(info.value, ValueError)
    with pytest.raises(pycoll.InvalidArgument):
        nccl.comm_get_async_error(0)


def test_group_start_end(nccl):
    assert nccl.group_start() == _nccl.SUCCESS
    assert nccl.group_end() == _nccl.SUCCESS


def test_parameters(nccl):
    keys = nccl.param_keys()
    assert isinstance(keys, list) and all(isinstance(k, str) for k in keys)
    assert any(k.startswith("NCCL_DEBUG") for k in keys)
