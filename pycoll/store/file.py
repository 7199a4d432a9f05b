"""The store protocol over a file, for processes on one machine or a shared filesystem."""

from __future__ import annotations

import contextlib
import errno
import fcntl
import logging
import os
import struct
import threading
import time
from typing import Any, Callable, ClassVar, Dict, Iterator, List, Optional, Tuple, Union

from .._procs import stat_fields
from .._settings import Seconds, request_deadline
from ..errors import StoreError, StoreTimeout
from . import _safefiles
from .base import (
    DEFAULT_TIMEOUT,
    POLL_FIRST,
    Keys,
    Store,
    Value,
    _append_args,
    _check_amount,
    _check_key,
    _check_keys,
    _check_timeout,
    _pause,
    _Table,
    _timeout_error,
    _to_bytes,
)

__all__ = ["FileStore"]

log = logging.getLogger("pycoll.store")


_FILE_MAGIC = b"PYCOLLFS\x01"
_FLOCK = struct.Struct("@hhqqi4x")  # struct flock: type, whence, start, len, pid
_HOLDER_STATES = {"T": " (stopped: SIGSTOP or a debugger)", "t": " (stopped by a tracer)", "Z": " (exiting)"}
_LOCK_POLL_FIRST, _LOCK_POLL_MAX = 50e-6, 0.005  # the lock's polls: the first pause, doubling up to the last
_REC = struct.Struct("!BII")  # kind, key length, value length
_REC_SET, _REC_DELETE = 1, 2


def _bounded(timeout: float) -> float:
    """``timeout`` cut to this thread's :class:`pycoll._settings.requests_until` deadline, where one is set (at least
    1 s, as a TCPStore's requests). A process stopped holding the lock file (a SIGSTOP that caught its watchdog's store
    thread in the middle of a write) otherwise held a caller bounded as a whole for the store's own timeout: a failed
    communicator's closing, whose observers' store requests are best effort, and with it the failure's handling that
    the failed operations wait for before they raise."""
    bound = request_deadline()
    return timeout if bound is None else min(timeout, max(1.0, bound - time.monotonic()))


def _open_store_file(path: str, flags: int) -> int:
    """Open one of a FileStore's files (mode ``0o600``); StoreError when it is a symbolic link."""
    try:
        return _safefiles.open_nofollow(path, flags)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise StoreError(f"FileStore: {path} is a symbolic link; refusing to follow it (give the real path)") \
                from None
        raise


def _has_magic(path: str) -> bool:
    try:
        return os.path.getsize(path) >= len(_FILE_MAGIC)
    except OSError:
        return False


class _PathLock:
    """Process-wide lock for one lock file: a thread lock plus an fcntl lock on a shared fd.

    POSIX record locks belong to the process and vanish when *any* descriptor of the file is
    closed, so every FileStore on the same path in this process shares one descriptor.
    """

    _registry: ClassVar[Dict[str, _PathLock]] = {}
    _registry_lock = threading.Lock()

    def __init__(self, path: str) -> None:
        self.path = path
        self.fd = _open_store_file(path, os.O_RDWR | os.O_CREAT)
        self.pid = os.getpid()
        self.lock = threading.Lock()
        self.file_held = False  # the thread holding ``lock`` has taken the lock file too (it is inside a write)
        self.refs = 0

    @classmethod
    def acquire_ref(cls, path: str) -> _PathLock:
        with cls._registry_lock:
            pl = cls._registry.get(path)
            if pl is None or pl.pid != os.getpid():
                pl = cls._registry[path] = _PathLock(path)
            pl.refs += 1
            return pl

    def release_ref(self) -> None:
        with self._registry_lock, self.lock:
            self.refs -= 1
            if self.refs == 0 and self._registry.get(self.path) is self:
                del self._registry[self.path]
                os.close(self.fd)

    def acquire(self, timeout: float, where: str) -> None:
        """Take the lock within ``timeout`` seconds, else :class:`StoreTimeout` naming who holds it: a
        process stopped (SIGSTOP, a debugger) holding it would otherwise hang every process of the store."""
        deadline = time.monotonic() + timeout
        if not self.lock.acquire(timeout=timeout):
            raise StoreTimeout(f"{where}: {self._waited_in_process(timeout)}")
        try:
            delay = _LOCK_POLL_FIRST
            while True:
                try:
                    fcntl.lockf(self.fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    self.file_held = True
                    return
                except OSError as e:
                    if e.errno not in (errno.EACCES, errno.EAGAIN):
                        raise
                left = deadline - time.monotonic()
                if left <= 0:
                    raise StoreTimeout(f"{where}: its lock file {self.path} was held for {timeout:g} s by "
                                       f"{self.holder()}")
                delay = _pause(delay, left, _LOCK_POLL_MAX)
        except BaseException:
            self.lock.release()
            raise

    def _waited_in_process(self, timeout: float) -> str:
        """What held a request that waited ``timeout`` seconds for the in-process lock: the thread holding it may be
        inside a write (holding the lock file), or itself waiting for the lock file another process holds -- a process
        stopped holding it (SIGSTOP, a debugger) is what the request waited for, and is named as by the lock file's
        own wait."""
        if self.file_held:
            return (f"another thread of this process held its lock file {self.path} (inside a write) while this "
                    f"request waited {timeout:g} s")
        holder = self._file_holder()
        if holder is None:  # the holding thread has not asked for the lock file yet, or took it just now
            return f"another thread of this process held its lock for {timeout:g} s"
        return (f"its lock file {self.path} was held by {holder} while this request waited {timeout:g} s (queued "
                "behind another thread of this process, itself waiting for the lock file)")

    def holder(self) -> str:
        """Who holds the lock file's lock, as far as this host can tell."""
        got = self._file_holder()
        return "a process that released it just now" if got is None else got

    def _file_holder(self) -> Optional[str]:
        """Who holds the lock file's lock, as far as this host can tell; None where no other process does (a lock of
        this process's own is not reported)."""
        try:
            got = fcntl.fcntl(self.fd, fcntl.F_GETLK, _FLOCK.pack(fcntl.F_WRLCK, os.SEEK_SET, 0, 0, 0))
            kind, _, _, _, pid = _FLOCK.unpack(got)
        except OSError:
            return "another process"
        if kind == fcntl.F_UNLCK:
            return None
        if pid <= 0:
            return "a process on another host"
        fields = stat_fields(pid)
        state = _HOLDER_STATES.get(fields[0], "") if fields else " (not in this pid namespace)"
        return f"pid {pid}{state}"

    def release(self) -> None:
        self.file_held = False
        try:
            fcntl.lockf(self.fd, fcntl.LOCK_UN)
        finally:
            self.lock.release()


def _forked() -> None:
    """After a fork, in the child: the path locks are the child's own (a parent's thread may hold the registry's)."""
    _PathLock._registry_lock = threading.Lock()
    _PathLock._registry = {}


os.register_at_fork(after_in_child=_forked)


class FileStore(Store):
    """The store protocol over a file, for processes on one machine or a shared filesystem.

    The data file ``path`` is an append-only log (compacted when mostly stale, by an atomic rename);
    ``path + ".lock"`` serialises the writers with POSIX ``fcntl`` locks, which also work over NFS;
    a writer that cannot take it within ``timeout`` raises :class:`StoreTimeout` naming the process
    holding it (one stopped by SIGSTOP or a debugger holds it until it is continued). Readers take no
    lock: every process caches what it has read and reads only the complete records appended since, so
    reads and waits go on whatever a writer does. Waits poll the file (every 1 ms at first, then at
    most every ``poll_interval`` seconds).

    The files stay when the store is closed; :meth:`remove_files` deletes them once no process
    uses them. Every process must use the same path.
    """

    COMPACT_MIN_BYTES = 1 << 16

    def __init__(self, path: Union[str, os.PathLike], timeout: Seconds = DEFAULT_TIMEOUT,
                 poll_interval: float = 0.02) -> None:
        if not os.fspath(path):
            raise ValueError("FileStore: path must name a file, got ''")
        self.path = os.path.abspath(os.fspath(path))
        self.timeout = _check_timeout(timeout, DEFAULT_TIMEOUT)
        self.poll_interval = _check_timeout(poll_interval, 0.02, "poll_interval")
        try:
            self._plock = _PathLock.acquire_ref(self.path + ".lock")
        except OSError as e:
            raise StoreError(f"cannot open the FileStore at {self.path}: {e.strerror or e}") from None
        self._mu = threading.RLock()  # this object's cache and descriptor (a writer takes it after the file lock)
        self._pid = os.getpid()
        self._fd = -1
        self._ino: Optional[Tuple[int, int]] = None
        self._offset = 0
        self._table = _Table()
        self._live_bytes = 0
        self._closed = False
        try:
            with self._locked(write=not _has_magic(self.path)):  # made (its magic written) under the lock
                pass
        except BaseException:
            self.close()
            raise

    def __reduce__(self) -> Any:
        return (FileStore, (self.path, self.timeout, self.poll_interval))

    def __repr__(self) -> str:
        return f"FileStore({self.path!r})"

    @staticmethod
    def remove_files(path: Union[str, os.PathLike]) -> None:
        """Delete a FileStore's data and lock files (missing ones are ignored)."""
        p = os.path.abspath(os.fspath(path))
        for name in (p, p + ".lock", p + ".tmp"):
            try:
                os.unlink(name)
            except FileNotFoundError:
                pass

    def close(self) -> None:
        if self._closed:
            return
        if self._pid != os.getpid():
            self._after_fork()
        with self._mu:
            if self._closed:
                return
            self._closed = True
            if self._fd >= 0:
                os.close(self._fd)
                self._fd = -1
        self._plock.release_ref()

    # ---- file access (writers hold the file lock and self._mu, readers self._mu)

    def _after_fork(self) -> None:
        """In a forked child: locks, descriptor and cache of its own -- the parent's locks stay held where a parent's
        thread held them at the fork (a child that wrote waited forever and held the lock file: every other process
        of the job timed out), and its descriptors' offsets are the parent's."""
        self._pid = os.getpid()
        self._mu = threading.RLock()
        self._plock = _PathLock.acquire_ref(self.path + ".lock")
        self._fd, self._ino, self._offset, self._table, self._live_bytes = -1, None, 0, _Table(), 0

    @contextlib.contextmanager
    def _locked(self, write: bool = True) -> Iterator[None]:
        """Hold this object's cache (and for a writer the file's lock first); the cache synced with the file."""
        if self._pid != os.getpid():
            self._after_fork()
        if self._closed:
            raise StoreError(f"the FileStore on {self.path} is closed")
        if write:
            self._plock.acquire(_bounded(self.timeout), f"the FileStore on {self.path}")
        try:
            with self._mu:
                if self._closed:
                    raise StoreError(f"the FileStore on {self.path} is closed")
                try:
                    self._sync(write)
                    yield
                except OSError as e:  # its folder removed, a full disk, ...: a store error, naming the file
                    raise StoreError(f"the FileStore on {self.path}: {e.strerror or e}") from None
        finally:
            if write:
                self._plock.release()

    def _open_data(self, locked: bool) -> None:
        fd = _open_store_file(self.path, os.O_RDWR | os.O_CREAT | os.O_APPEND)
        st = os.fstat(fd)
        if st.st_size == 0 and locked:
            os.write(fd, _FILE_MAGIC)
        elif (locked or st.st_size >= len(_FILE_MAGIC)) and os.pread(fd, len(_FILE_MAGIC), 0) != _FILE_MAGIC:
            os.close(fd)
            raise StoreError(f"{self.path} is not a pycoll FileStore file")
        if self._fd >= 0:
            os.close(self._fd)
        self._fd = fd
        self._ino = (st.st_dev, st.st_ino)
        self._offset = len(_FILE_MAGIC)
        self._table = _Table()
        self._live_bytes = 0

    def _sync(self, locked: bool = False) -> None:
        """Bring the cache up to date with the file's complete records (``locked``: this process holds the file
        lock, no record is being written: an incomplete one at the end is a dead writer's, and goes)."""
        if self._closed:
            raise StoreError(f"the FileStore on {self.path} is closed")
        try:
            st = os.stat(self.path)
        except FileNotFoundError:
            st = None
        if st is None and self._fd >= 0:  # never gone by a compaction (an atomic rename): removed, keys and all
            raise StoreError(f"the FileStore file {self.path} was removed while the store was in use: its keys "
                             "are gone (remove_files() only once no process uses it)")
        if st is None or self._fd < 0 or (st.st_dev, st.st_ino) != self._ino or st.st_size < self._offset:
            self._open_data(locked)
            st = os.fstat(self._fd)
        if st.st_size <= self._offset:  # nothing new (or, to a reader, a file its maker is still writing)
            return
        data = os.pread(self._fd, st.st_size - self._offset, self._offset)
        pos = 0
        while pos + _REC.size <= len(data):
            kind, klen, vlen = _REC.unpack_from(data, pos)
            end = pos + _REC.size + klen + vlen
            if kind not in (_REC_SET, _REC_DELETE) or end > len(data):
                break
            try:
                key = data[pos + _REC.size:pos + _REC.size + klen].decode("utf-8")
            except UnicodeDecodeError:
                break
            if kind == _REC_SET:
                self._put_cached(key, data[pos + _REC.size + klen:end])
            else:
                self._pop_cached(key)
            pos = end
        if pos < len(data) and locked:
            # a writer died in the middle of a record (we hold the lock): drop the torn tail
            log.warning("FileStore %s: dropping %d bytes of an incomplete record", self.path, len(data) - pos)
            os.ftruncate(self._fd, self._offset + pos)
        self._offset += pos

    def _put_cached(self, key: str, value: bytes) -> None:
        old = self._table.data.get(key)
        if old is not None:
            self._live_bytes -= _REC.size + len(key.encode()) + len(old)
        self._table.data[key] = value
        self._live_bytes += _REC.size + len(key.encode()) + len(value)

    def _pop_cached(self, key: str) -> Optional[bytes]:
        old = self._table.data.pop(key, None)
        if old is not None:
            self._live_bytes -= _REC.size + len(key.encode()) + len(old)
        return old

    @staticmethod
    def _record(kind: int, key: str, value: bytes = b"") -> bytes:
        k = key.encode("utf-8")
        return _REC.pack(kind, len(k), len(value)) + k + value

    def _append(self, rec: bytes) -> None:
        view = memoryview(rec)
        while view:
            n = os.write(self._fd, view)
            view = view[n:]
        self._offset += len(rec)
        if self._offset > self.COMPACT_MIN_BYTES and self._offset > 4 * (self._live_bytes + len(_FILE_MAGIC)):
            self._compact()

    def _compact(self) -> None:
        tmp = self.path + ".tmp"
        parts = [_FILE_MAGIC] + [self._record(_REC_SET, k, v) for k, v in self._table.data.items()]
        # a new file (never a link someone planted at the .tmp name), then a rename over the data file
        _safefiles.write_private_atomic(self.path, b"".join(parts), tmp)
        table, live = self._table, self._live_bytes
        self._open_data(True)
        self._table, self._live_bytes = table, live
        self._offset = os.fstat(self._fd).st_size

    def _set_locked(self, key: str, value: bytes) -> None:
        self._put_cached(key, value)
        self._append(self._record(_REC_SET, key, value))

    def _poll(self, keys: List[str], timeout: float, done: Callable[[], Any]) -> Any:
        timeout = _bounded(timeout)
        deadline = time.monotonic() + timeout
        delay = POLL_FIRST
        while True:
            with self._locked(write=False):
                if not self._table.missing(keys):
                    return done()
                missing = self._table.missing(keys)
            now = time.monotonic()
            if now >= deadline:
                raise _timeout_error(keys, timeout, f" in {self.path}", missing)
            delay = _pause(delay, deadline - now, self.poll_interval)

    # ---- the protocol

    def set(self, key: str, value: Value) -> None:
        key, value = _check_key(key), _to_bytes(value)
        with self._locked():
            self._set_locked(key, value)

    def get(self, key: str, timeout: Optional[Seconds] = None) -> bytes:
        key = _check_key(key)
        return self._poll([key], _check_timeout(timeout, self.timeout), lambda: self._table.data[key])

    def add(self, key: str, amount: int) -> int:
        key, amount = _check_key(key), _check_amount(amount)
        with self._locked():
            scratch = _Table()
            scratch.data = {key: self._table.data[key]} if key in self._table.data else {}
            value = scratch.add(key, amount)
            self._set_locked(key, scratch.data[key])
            return value

    def append(self, key: str, value: Value) -> int:
        """Native: under the file's lock (the generic compare-and-set loop may lose one of two identical appends)."""
        key, data = _append_args(key, value)
        with self._locked():
            new = self._table.data.get(key, b"") + data
            self._set_locked(key, new)
            return len(new)

    def wait(self, keys: Keys, timeout: Optional[Seconds] = None) -> None:
        keys = _check_keys(keys)
        self._poll(keys, _check_timeout(timeout, self.timeout), lambda: None)

    def multi_get(self, keys: Keys, timeout: Optional[Seconds] = None) -> List[bytes]:
        keys = _check_keys(keys)
        return self._poll(keys, _check_timeout(timeout, self.timeout), lambda: [self._table.data[k] for k in keys])

    def compare_set(self, key: str, expected: Value, desired: Value) -> bytes:
        key = _check_key(key)
        expected, desired = _to_bytes(expected, "expected value"), _to_bytes(desired, "desired value")
        with self._locked():
            old = self._table.data.get(key)
            scratch = _Table()
            scratch.data = {} if old is None else {key: old}
            value = scratch.compare_set(key, expected, desired)
            if key in scratch.data and scratch.data[key] is not old:
                self._set_locked(key, scratch.data[key])
            return value

    def delete(self, key: str) -> bool:
        key = _check_key(key)
        with self._locked():
            if self._pop_cached(key) is None:
                return False
            self._append(self._record(_REC_DELETE, key))
            return True

    def check(self, keys: Keys) -> bool:
        keys = _check_keys(keys)
        with self._locked(write=False):
            return not self._table.missing(keys)

    def num_keys(self) -> int:
        with self._locked(write=False):
            return len(self._table.data)

    def list_keys(self, prefix: str = "") -> List[str]:
        prefix = _check_key(prefix)
        with self._locked(write=False):
            return self._table.list_keys(prefix)
