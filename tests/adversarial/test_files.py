"""Finding 9: no file pycoll creates is written through a planted symbolic link; dumps are private."""

from __future__ import annotations

import os
import stat

import pytest

from pycoll.diagnostics import files
from pycoll.errors import StoreError
from pycoll.store import FileStore

OTHER_UID = 54321  # "another local user": tests may run as root, so planted links are chowned to it


def _plant_link(target: str, link: str) -> None:
    os.symlink(target, link)
    if os.getuid() == 0:
        os.lchown(link, OTHER_UID, OTHER_UID)


def test_filestore_compaction_does_not_follow_a_planted_tmp_link(tmp_path, monkeypatch) -> None:
    victim = tmp_path / "victim"
    victim.write_bytes(b"precious")
    path = str(tmp_path / "store")
    monkeypatch.setattr(FileStore, "COMPACT_MIN_BYTES", 256)
    store = FileStore(path)
    try:
        _plant_link(str(victim), path + ".tmp")
        for i in range(200):
            store.set("k", str(i) * 10)  # overwrites: the log grows, compaction runs
        assert store.get("k") == b"199" * 10
        assert os.path.getsize(path) < 4096  # it did compact
    finally:
        store.close()
    assert victim.read_bytes() == b"precious"
    assert not os.path.islink(path + ".tmp")


@pytest.mark.parametrize("which", ["", ".lock"])
def test_filestore_refuses_linked_data_and_lock_files(tmp_path, which: str) -> None:
    victim = tmp_path / "victim"
    victim.write_bytes(b"")
    path = str(tmp_path / "store")
    _plant_link(str(victim), path + which)
    with pytest.raises(StoreError, match="symbolic link"):
        FileStore(path)
    assert victim.read_bytes() == b""


def test_filestore_files_are_private(tmp_path) -> None:
    old = os.umask(0o022)
    try:
        store = FileStore(str(tmp_path / "store"))
        store.set("a", "b")
        store.close()
    finally:
        os.umask(old)
    for name in ("store", "store.lock"):
        assert stat.S_IMODE(os.stat(tmp_path / name).st_mode) == 0o600


def test_dump_into_a_planted_generation_link_is_refused(tmp_path) -> None:
    dump_dir = tmp_path / "dumps"
    dump_dir.mkdir()
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    _plant_link(str(elsewhere), str(dump_dir / "generation_0"))
    path = os.path.join(files.generation_dir(str(dump_dir), 0), "pycoll_trace_rank_0")
    with pytest.raises(PermissionError):
        files.write_atomic(path, b"dump")
    assert os.listdir(elsewhere) == []


@pytest.mark.skipif(os.getuid() != 0, reason="needs root to make a folder owned by another user")
def test_dump_into_a_folder_of_another_user_is_refused(tmp_path) -> None:
    gen = tmp_path / "generation_0"
    gen.mkdir()
    os.chown(gen, OTHER_UID, OTHER_UID)
    with pytest.raises(PermissionError, match="another user"):
        files.write_atomic(str(gen / "pycoll_trace_rank_0"), b"dump")


def test_dump_through_a_link_in_a_parent_owned_by_another_user_is_refused(tmp_path) -> None:
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    _plant_link(str(elsewhere), str(tmp_path / "json"))
    if os.getuid() != 0:
        pytest.skip("a link of this user is allowed")
    with pytest.raises(PermissionError, match="another user"):
        files.write_atomic(str(tmp_path / "json" / "generation_0" / "x.json"), b"{}")
    assert os.listdir(elsewhere) == []


def test_dump_does_not_follow_a_planted_temporary_file_link(tmp_path) -> None:
    import threading

    folder = tmp_path / "generation_0"
    folder.mkdir(mode=0o700)
    victim = tmp_path / "victim"
    victim.write_bytes(b"precious")
    tmp = folder / f".pycoll-fr-{os.getpid()}-{threading.get_ident():x}.tmp"
    os.symlink(victim, tmp)  # predictable name: pid and thread id
    files.write_atomic(str(folder / "pycoll_trace_rank_0"), b"dump")
    assert victim.read_bytes() == b"precious"
    assert (folder / "pycoll_trace_rank_0").read_bytes() == b"dump"


def test_dumps_are_private(tmp_path) -> None:
    old = os.umask(0o022)
    try:
        base = tmp_path / "new" / "dumps"
        path = os.path.join(files.generation_dir(str(base), 3, json_form=True), "pycoll_trace_rank_0.json")
        files.write_atomic(path, b"{}")
    finally:
        os.umask(old)
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    for d in (tmp_path / "new", base, base / "json", base / "json" / "generation_3"):
        assert stat.S_IMODE(os.stat(d).st_mode) == 0o700, d


@pytest.mark.timeout(30)
def test_recorder_dump_refuses_a_planted_generation_link(tmp_path) -> None:
    """The whole path: a flight-recorder dump logs an error and writes nothing through the link."""
    from pycoll.diagnostics.recorder import FlightRecorder

    dump_dir = tmp_path / "dumps"
    dump_dir.mkdir()
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    _plant_link(str(elsewhere), str(dump_dir / "generation_0"))
    fr = FlightRecorder(16, dump_dir=str(dump_dir))
    fr.dump(reason="test")
    assert os.listdir(elsewhere) == []
