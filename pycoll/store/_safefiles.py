"""Creating files and folders safely in places other local users may write to.

Every file pycoll creates (FileStore's data, lock and compaction files, flight-recorder dumps) goes
through here, so that a symbolic link planted by someone else is never followed and what is
written stays private: folders are made ``0o700``, files ``0o600``, temporary files are created
exclusively (``O_EXCL | O_NOFOLLOW``), and a folder path is refused when it passes through a
symbolic link owned by another user (other than root), the rule Linux's ``protected_symlinks``
applies in sticky folders, here applied everywhere.

It imports nothing of pycoll (it sits in the store layer, the lowest that writes files).
"""

from __future__ import annotations

import errno
import os
import stat

__all__ = ["private_dirs", "create_exclusive", "open_nofollow", "write_private_atomic"]

_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)
_CLOEXEC = getattr(os, "O_CLOEXEC", 0)


def _check_component(path: str) -> bool:
    """Whether ``path`` exists; PermissionError for a symbolic link owned by another user."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return False
    if stat.S_ISLNK(st.st_mode) and st.st_uid not in (0, os.getuid()):
        raise PermissionError(errno.EPERM, f"refusing to follow a symbolic link owned by another user "
                                           f"(uid {st.st_uid})", path)
    return True


def private_dirs(folder: str, *, final_must_be_real: bool = True) -> None:
    """Make ``folder`` (and missing parents) with mode ``0o700``, refusing unsafe existing ones.

    Each existing component may be a symbolic link only when it belongs to this user or root. With
    ``final_must_be_real``, ``folder`` itself must be a real folder (not a link) owned by this user.
    """
    folder = os.path.abspath(folder)
    parts = folder.split(os.sep)
    current = os.sep
    for part in parts[1:]:
        if not part:
            continue
        current = os.path.join(current, part)
        if _check_component(current):
            continue
        try:
            os.mkdir(current, 0o700)
        except FileExistsError:  # made meanwhile by someone else: check it like any existing one
            _check_component(current)
    st = os.stat(folder)
    if not stat.S_ISDIR(st.st_mode):
        raise NotADirectoryError(errno.ENOTDIR, "not a folder", folder)
    if final_must_be_real:
        lst = os.lstat(folder)
        if stat.S_ISLNK(lst.st_mode):
            raise PermissionError(errno.EPERM, "refusing to write into a folder that is a symbolic link", folder)
        if st.st_uid != os.getuid():
            raise PermissionError(errno.EPERM, f"refusing to write into a folder owned by another user "
                                               f"(uid {st.st_uid})", folder)


def create_exclusive(path: str, mode: int = 0o600) -> int:
    """A new file at ``path`` open for writing (never through a link): a leftover file or link there
    is removed first (unlink does not follow links)."""
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | _NOFOLLOW | _CLOEXEC
    try:
        return os.open(path, flags, mode)
    except FileExistsError:
        os.unlink(path)
        return os.open(path, flags, mode)


def open_nofollow(path: str, flags: int, mode: int = 0o600) -> int:
    """``os.open`` that refuses a symbolic link as the last component (OSError ELOOP)."""
    return os.open(path, flags | _NOFOLLOW | _CLOEXEC, mode)


def write_private_atomic(path: str, data: bytes, tmp: str) -> None:
    """Write ``data`` to ``path`` (mode ``0o600``) through the new file ``tmp`` and a rename."""
    fd = create_exclusive(tmp)
    try:
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view):]
        finally:
            os.close(fd)
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
