"""pycoll._bindings._locate, the library search policy, on its own (no library is opened)."""

from __future__ import annotations

import os

import pytest

from pycoll._bindings import _locate


def test_normalize_spec(monkeypatch):
    monkeypatch.delenv(_locate.ENV_VAR, raising=False)
    assert _locate.normalize_spec(None) == "nccl"
    monkeypatch.setenv(_locate.ENV_VAR, "/x/libnccl.so.2")
    assert _locate.normalize_spec(None) == "/x/libnccl.so.2"
    assert _locate.normalize_spec(b"host") == "host"
    with pytest.raises(TypeError):
        _locate.normalize_spec(5)
    with pytest.raises(ValueError):
        _locate.normalize_spec("")


def test_nccl_order_prefers_what_is_loaded(monkeypatch):
    monkeypatch.setattr(_locate, "wheel_nccl_paths", list)
    got = list(
        _locate.candidates("nccl", ["/usr/lib/libc.so.6", "/opt/t/libnccl.so.2"])
    )
    assert [label for label, _ in got] == [
        "already loaded",
        "cuda.pathfinder",
        "nvidia-nccl wheel",
        "system",
    ]
    assert got[0][1] == "/opt/t/libnccl.so.2" and got[1][1] is _locate.pathfinder_nccl
    assert isinstance(got[2][1], _locate.Nothing) and got[3][1] == "libnccl.so.2"


def test_rccl_and_host(monkeypatch, tmp_path):
    monkeypatch.setenv("ROCM_PATH", str(tmp_path))
    got = list(_locate.candidates("rccl", []))
    assert got[0] == ("already loaded", "none") and got[1] == ("system", "librccl.so.1")
    assert got[2][1] == os.path.join(str(tmp_path), "lib", "librccl.so.1")
    assert got[-1][1] == "/opt/rocm/lib/librccl.so.1"
    assert list(_locate.candidates("host")) == [("pycoll", _locate.HOST_LIBRARY)]
    assert os.path.basename(_locate.HOST_LIBRARY) == "libpycoll_host.so"
