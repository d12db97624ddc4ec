"""Folders and files nobody else can plant in: every file harvest writes goes through here.

harvest usually runs as root on a shared GPU box, and users point it at folders such as
``/tmp/run``. A folder another user can write to lets that user plant a symlink
(``ledger.lock -> /etc/shadow``) or a forged launch record before harvest opens it. The rules:

- A folder harvest writes in (a run folder, ``--run-dir``, the state dir, tune and compare
  folders) must be owned by the user running harvest and not writable by group or others.
  An existing folder is never chmod-ed; a folder harvest creates is created 0700. A symlink as
  the folder itself is accepted only when the user owns the link (as ``fs.protected_symlinks``
  does in sticky folders); the folder it points to must pass the same check.
- Files in them are opened without following symlinks (``O_NOFOLLOW``); an existing file must be
  a regular file owned by the user, with one link. New files are created ``O_EXCL`` 0600, and a
  replacement is a temp file created ``O_EXCL`` then renamed over the old one.
- The ledger (and its ``-wal``, ``-shm`` and lock) is ``lstat``-ed before SQLite opens it.

A refusal is :class:`UnsafePathError`, naming the path and what is wrong with it. This module
sits below everything but :mod:`harvest.errors`: it never imports another harvest module, and
it never changes the mode or owner of anything it did not create.
"""

from __future__ import annotations

import contextlib
import errno
import os
import stat
from pathlib import Path

from harvest.errors import UnsafePathError

#: Mode of every folder harvest creates, and of every file it writes.
DIR_MODE = 0o700
FILE_MODE = 0o600
_NOFOLLOW = os.O_NOFOLLOW | os.O_CLOEXEC


def _who(uid: int) -> str:
    try:
        import pwd

        return f"{pwd.getpwuid(uid).pw_name} (uid {uid})"
    except (KeyError, ImportError):
        return f"uid {uid}"


def check_dir(path: Path | str) -> Path:
    """Raise :class:`UnsafePathError` unless ``path`` is a folder owned by this user and not
    writable by group or others (a symlink to one is accepted when this user owns the link)."""
    path = Path(path)
    uid = os.geteuid()
    try:
        st = os.lstat(path)
        if stat.S_ISLNK(st.st_mode):
            if st.st_uid != uid:
                raise UnsafePathError(path, f"is a symlink owned by {_who(st.st_uid)}, not by {_who(uid)}")
            st = os.stat(path)
    except FileNotFoundError:
        raise UnsafePathError(path, "does not exist") from None
    except OSError as exc:
        raise UnsafePathError(path, f"cannot be examined: {exc.strerror or exc}") from None
    if not stat.S_ISDIR(st.st_mode):
        raise UnsafePathError(path, "is not a folder")
    if st.st_uid != uid:
        raise UnsafePathError(path, f"is owned by {_who(st.st_uid)}, not by {_who(uid)} who runs harvest; "
                                    f"use a folder of your own")
    if st.st_mode & 0o022:
        who = " and ".join(w for w, bit in (("group", 0o020), ("others", 0o002)) if st.st_mode & bit)
        raise UnsafePathError(path, f"is writable by {who} "
                                    f"(mode {stat.S_IMODE(st.st_mode):04o}); harvest does not change it: "
                                    f"use a folder only you can write to (e.g. a new one, created 0700)")
    return path


def ensure_dir(path: Path | str) -> Path:
    """``path`` as a safe folder: created 0700 when absent (missing parents too), else checked
    with :func:`check_dir` (never chmod-ed)."""
    path = Path(path)
    missing: list[Path] = []
    p = path
    while not os.path.lexists(p) and p != p.parent:
        missing.append(p)
        p = p.parent
    for folder in reversed(missing):  # the missing parents too: 0700, made by us
        try:
            os.mkdir(folder, DIR_MODE)
            os.chmod(folder, DIR_MODE)  # mkdir's mode is filtered by the umask; this folder is ours, new
        except FileExistsError:
            pass  # made meanwhile by someone: the folder itself is checked below like any existing one
        except OSError as exc:
            raise UnsafePathError(folder, f"cannot be created: {exc.strerror or exc}") from None
    return check_dir(path)


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
    _check_stat(path, st)
    return True


def _check_stat(path: Path, st: os.stat_result) -> None:
    if stat.S_ISLNK(st.st_mode):
        raise UnsafePathError(path, f"is a symlink (to {_readlink(path)}); harvest does not follow links in "
                                    f"its folders")
    if not stat.S_ISREG(st.st_mode):
        raise UnsafePathError(path, "is not a regular file")
    if st.st_uid != os.geteuid():
        raise UnsafePathError(path, f"is owned by {_who(st.st_uid)}, not by {_who(os.geteuid())}")
    if st.st_nlink > 1:
        raise UnsafePathError(path, f"has {st.st_nlink} hard links; harvest writes only files of its own")


def _readlink(path: Path) -> str:
    try:
        return os.readlink(path)
    except OSError:
        return "?"


def open_fd(path: Path | str, flags: int, mode: int = FILE_MODE) -> int:
    """``os.open`` that never follows a symlink and refuses a file that is not this user's own
    regular file. With ``O_CREAT`` a new file gets ``mode`` (0600) from its first byte."""
    path = Path(path)
    try:
        fd = os.open(path, flags | _NOFOLLOW, mode)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise UnsafePathError(path, f"is a symlink (to {_readlink(path)}); harvest does not follow links "
                                        f"in its folders") from None
        raise
    try:
        _check_stat(path, os.fstat(fd))
        if flags & os.O_CREAT and stat.S_IMODE(os.fstat(fd).st_mode) & 0o077:
            os.fchmod(fd, FILE_MODE)  # created by us under a loose umask, or an old file of ours
    except BaseException:
        os.close(fd)
        raise
    return fd


def open_text(path: Path | str, mode: str = "w", *, encoding: str = "utf-8", newline: str | None = None):
    """A text file handle (``"w"``, ``"a"`` or ``"r"``) opened through :func:`open_fd`."""
    flags = {"w": os.O_WRONLY | os.O_CREAT | os.O_TRUNC, "a": os.O_WRONLY | os.O_CREAT | os.O_APPEND,
             "r": os.O_RDONLY}[mode.replace("b", "")]
    fd = open_fd(path, flags)
    try:
        if "b" in mode:
            return os.fdopen(fd, mode)
        return os.fdopen(fd, mode, encoding=encoding, newline=newline)
    except BaseException:
        os.close(fd)
        raise


def read_text(path: Path | str, encoding: str = "utf-8") -> str:
    """The text of this user's own regular file at ``path`` (no symlink followed)."""
    with open_text(path, "r", encoding=encoding) as fh:
        return fh.read()


def temp_beside(path: Path | str) -> tuple[Path, int]:
    """A new 0600 file next to ``path`` (created ``O_EXCL``) and its descriptor, for an atomic
    replace of ``path`` by :func:`replace`."""
    path = Path(path)
    for n in range(100):
        tmp = path.with_name(f".{path.name}.{os.getpid()}.{n}.tmp")
        try:
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | _NOFOLLOW, FILE_MODE)
        except FileExistsError:
            continue
        os.fchmod(fd, FILE_MODE)
        return tmp, fd
    raise UnsafePathError(path, "no free temporary name beside it")


def replace(tmp: Path | str, path: Path | str) -> None:
    """Rename ``tmp`` over ``path``; an existing ``path`` must be this user's own file (a symlink
    there is replaced by the rename, never followed, but it is refused so the plant is reported)."""
    check_file(path)
    os.replace(tmp, path)


def write_atomic(path: Path | str, data: str | bytes, *, encoding: str = "utf-8", fsync: bool = True) -> Path:
    """Replace ``path`` with ``data`` atomically: a temp file created ``O_EXCL`` 0600, then renamed."""
    path = Path(path)
    check_file(path)
    tmp, fd = temp_beside(path)
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data.encode(encoding) if isinstance(data, str) else data)
            fh.flush()
            if fsync:
                os.fsync(fh.fileno())
        replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    return path


def write_new(path: Path | str, data: str | bytes, *, encoding: str = "utf-8") -> Path:
    """Create ``path`` (``O_EXCL``, 0600) holding ``data``; an existing one is an error."""
    path = Path(path)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | _NOFOLLOW, FILE_MODE)
    with os.fdopen(fd, "wb") as fh:
        os.fchmod(fh.fileno(), FILE_MODE)
        fh.write(data.encode(encoding) if isinstance(data, str) else data)
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


__all__ = [
    "DIR_MODE",
    "FILE_MODE",
    "UnsafePathError",
    "check_dir",
    "check_file",
    "check_ledger",
    "check_no_links",
    "ensure_dir",
    "open_fd",
    "open_text",
    "read_text",
    "replace",
    "temp_beside",
    "write_atomic",
    "write_new",
]
