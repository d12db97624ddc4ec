"""The path-level functions: a file named by its path, used through its folder held as it is (no
owner rule for the folder), and the checks of files harvest only reads."""

from __future__ import annotations

import contextlib
import os
import stat
from pathlib import Path

from harvest.errors import UnsafePathError
from harvest.safefiles.folder import Folder
from harvest.safefiles.rules import FILE_MODE, _check_stat, _readlink


def check_file(path: Path | str) -> bool:
    """Whether ``path`` exists; raise :class:`UnsafePathError` when it is a symlink, not a regular
    file, owned by another user, or hard-linked elsewhere (``lstat``: nothing is followed)."""
    path = Path(path)
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return False
    except OSError as exc:
        raise UnsafePathError(path, f"cannot be examined: {exc.strerror or exc}") from None
    _check_stat(path, st, lambda: _readlink(path))
    return True


class _Loose(Folder):
    """The folder of a path given to the path-level functions below: held as it is (no owner rule),
    so that what follows happens in the one folder that was looked at."""

    @classmethod
    def of(cls, path: Path) -> _Loose:
        fd = os.open(path.parent, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)  # OSError as it comes
        return cls(fd, path.parent)


def open_fd(path: Path | str, flags: int, mode: int = FILE_MODE) -> int:
    """:meth:`Folder.open` of ``path`` in its folder, held as it is."""
    path = Path(path)
    with _Loose.of(path) as folder:
        return folder.open(path.name, flags, mode)


def open_text(path: Path | str, mode: str = "w", *, encoding: str = "utf-8", newline: str | None = None):
    """A text file handle (``"w"``, ``"a"`` or ``"r"``) opened through :func:`open_fd`."""
    path = Path(path)
    with _Loose.of(path) as folder:
        return folder.open_text(path.name, mode, encoding=encoding, newline=newline)


def read_text(path: Path | str, encoding: str = "utf-8") -> str:
    """The text of this user's own regular file at ``path`` (no symlink followed)."""
    with open_text(path, "r", encoding=encoding) as fh:
        return fh.read()


def write_atomic(path: Path | str, data: str | bytes, *, encoding: str = "utf-8", fsync: bool = True) -> Path:
    """Replace ``path`` with ``data`` atomically: a temp file created ``O_EXCL`` 0600 in the held
    folder of ``path``, then renamed there."""
    path = Path(path)
    with _Loose.of(path) as folder:
        folder.write_atomic(path.name, data, encoding=encoding, fsync=fsync)
    return path


def write_new(path: Path | str, data: str | bytes, *, encoding: str = "utf-8") -> Path:
    """Create ``path`` (``O_EXCL``, 0600) holding ``data``; an existing one is an error."""
    path = Path(path)
    with _Loose.of(path) as folder:
        folder.write_new(path.name, data, encoding=encoding)
    return path


def check_no_links(*paths: Path | str) -> None:
    """Refuse a symlink at any of ``paths`` (``lstat``; absent paths pass). For files harvest only
    reads, which may belong to another user (``harvest status`` of someone's run, as root)."""
    for p in map(Path, paths):
        with contextlib.suppress(FileNotFoundError):
            if stat.S_ISLNK(os.lstat(p).st_mode):
                raise UnsafePathError(p, f"is a symlink (to {_readlink(p)}); harvest does not follow links in "
                                         f"run folders")


def check_ledger(path: Path | str, lock: Path | str | None = None) -> None:
    """``lstat`` the SQLite file, its ``-wal`` and ``-shm`` (and the lock) before SQLite opens
    them: each absent, or this user's own regular file."""
    path = Path(path)
    for p in (path, Path(f"{path}-wal"), Path(f"{path}-shm"), *([Path(lock)] if lock else [])):
        check_file(p)
