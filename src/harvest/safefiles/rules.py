"""The rules a folder, its parents, the way to it and a file in it must pass (see the package
docstring), each answering what is wrong or raising :class:`~harvest.errors.UnsafePathError`."""

from __future__ import annotations

import os
import stat
from collections.abc import Callable
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


def _folder_stat_problem(st: os.stat_result) -> str | None:
    """What makes a folder harvest writes in unsafe (``None``: nothing)."""
    uid = os.geteuid()
    if not stat.S_ISDIR(st.st_mode):
        return "is not a folder"
    if st.st_uid != uid:
        return f"is owned by {_who(st.st_uid)}, not by {_who(uid)} who runs harvest; use a folder of your own"
    if st.st_mode & 0o022:
        who = " and ".join(w for w, bit in (("group", 0o020), ("others", 0o002)) if st.st_mode & bit)
        return (f"is writable by {who} (mode {stat.S_IMODE(st.st_mode):04o}); harvest does not change it: "
                f"use a folder only you can write to (e.g. a new one, created 0700)")
    return None


def _parent_problem(st: os.stat_result) -> str | None:
    """What lets another user rename a folder's entry away (``None``: nothing): a parent another
    user owns, or one that group or others can write to without the sticky bit."""
    uid = os.geteuid()
    if st.st_uid not in (uid, 0):
        return (f"is owned by {_who(st.st_uid)}: that user can rename the folders in it; "
                f"use a folder whose parents are yours or root's")
    if st.st_mode & 0o022 and not st.st_mode & stat.S_ISVTX:
        who = " and ".join(w for w, bit in (("group", 0o020), ("others", 0o002)) if st.st_mode & bit)
        return (f"is writable by {who} without the sticky bit (mode {stat.S_IMODE(st.st_mode):04o}): "
                f"they can rename the folders in it; use a folder whose parents only you (or root) can write")
    return None


def _fd_name(fd: int, fallback: Path) -> str:
    try:
        return os.readlink(f"/proc/self/fd/{fd}")
    except OSError:
        return str(fallback)


def _check_parents(fd: int, path: Path) -> None:
    """Walk ``..`` from the held folder up to ``/`` (the folders it really sits in, whatever links
    led to it) and refuse any that another user could rename it out of."""
    cur = os.dup(fd)
    shown = path
    try:
        while True:
            st = os.fstat(cur)
            parent = os.open("..", os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC, dir_fd=cur)
            os.close(cur)
            cur = parent
            pst = os.fstat(cur)
            if (pst.st_dev, pst.st_ino) == (st.st_dev, st.st_ino):
                return  # "/": its own parent
            shown = shown.parent
            why = _parent_problem(pst)
            if why is not None:
                raise UnsafePathError(_fd_name(cur, shown), f"{why} (it holds {path})")
    finally:
        os.close(cur)


#: Symlinks followed on the way to one folder before the name is refused (the kernel's own limit).
_MAX_LINKS = 40


def _check_route(path: Path) -> None:
    """Refuse a name that another user could re-point between two uses: walk ``path`` as the kernel
    resolves it, component by component, and require of every folder passed through what
    :func:`_check_parents` requires of the held folder's real parents (the user's or root's, not
    writable by others unless sticky), and of every symlink on the way that it is the user's or
    root's own. The held descriptor never needs the name again, but an engine's log, a watcher and
    an engine's config file are handed the path by name. Stops at the first missing component (the
    rest is created relative to held descriptors)."""
    uid = os.geteuid()
    pending = list(reversed(path.parts[1:]))
    cur = Path("/")  # always a real folder: no symlink in it
    links = 0
    while pending:
        name = pending.pop()
        if name in ("", "."):
            continue
        if name == "..":
            cur = cur.parent
            continue
        nxt = cur / name
        try:
            st = os.lstat(nxt)
        except (FileNotFoundError, NotADirectoryError):
            return
        except OSError as exc:
            raise UnsafePathError(nxt, f"cannot be examined: {exc.strerror or exc}") from None
        try:
            why = _parent_problem(os.stat(cur))
        except OSError as exc:
            raise UnsafePathError(cur, f"cannot be examined: {exc.strerror or exc}") from None
        if why is not None:
            raise UnsafePathError(cur, f"{why} (the way to {path} goes through it)")
        if not stat.S_ISLNK(st.st_mode):
            cur = nxt
            continue
        links += 1
        if links > _MAX_LINKS:
            raise UnsafePathError(path, f"goes through more than {_MAX_LINKS} symlinks")
        if st.st_uid not in (uid, 0):
            raise UnsafePathError(nxt, f"is a symlink owned by {_who(st.st_uid)}: that user can point it "
                                       f"elsewhere between two uses of {path}; use a path whose links are "
                                       f"yours or root's")
        target = Path(os.readlink(nxt))
        if target.is_absolute():
            cur = Path("/")
            pending.extend(reversed(target.parts[1:]))
        else:
            pending.extend(reversed(target.parts))


def _check_stat(path: Path, st: os.stat_result, link: Callable[[], str]) -> None:
    if stat.S_ISLNK(st.st_mode):
        raise UnsafePathError(path, f"is a symlink (to {link()}); harvest does not follow links in "
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
