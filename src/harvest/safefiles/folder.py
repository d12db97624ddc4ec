"""A folder held once (``O_DIRECTORY | O_NOFOLLOW``) after its checks, and every file in it used
through that descriptor (see the package docstring)."""

from __future__ import annotations

import contextlib
import errno
import os
import secrets
import stat
from pathlib import Path
from typing import Self

from harvest.errors import UnsafePathError
from harvest.safefiles.rules import (DIR_MODE, FILE_MODE, _check_parents, _check_route, _check_stat, _fd_name,
                                     _folder_stat_problem, _NOFOLLOW, _parent_problem, _who)


#: Random temporary names drawn before giving up (each is free but by a 2^-128 chance of a plant).
TEMP_TRIES = 16
#: The part of a file's name its temporary name keeps: a name of 255 bytes, plus the random part,
#: would be too long for the system.
_TEMP_STEM_BYTES = 200


class Folder:
    """A folder held open (``O_DIRECTORY | O_NOFOLLOW``) once it passed its checks: every file in it
    is created, opened, renamed and ``lstat``-ed relative to the held descriptor (``dir_fd``), so a
    rename or a symlink swapped in for the folder's name afterwards changes nothing harvest does.

    ``path`` is how the folder was named (for messages and records); :meth:`via` gives a path that
    resolves through the descriptor, for APIs that need one (SQLite). Close it with :meth:`close`
    (or ``with``); it is closed when garbage-collected too.
    """

    def __init__(self, fd: int, path: Path):
        self.fd = fd
        self.path = path

    # --- holding ----------------------------------------------------------------------------------

    @classmethod
    def hold(cls, path: Path | str, *, create: bool = False, strict: bool = True) -> Folder:
        """Hold ``path``: a folder of this user's own, not writable by group or others, none of whose
        parents up to ``/`` another user could rename it out of (see the module docstring).

        ``create``: make it (and missing parents) 0700 when absent, whatever the umask. ``strict``
        False is for an explicit output folder (``export -o``, ``report -o``): it may also be root's
        or a sticky shared folder such as ``/tmp``; only its parents' rule and "no other user's
        folder, nor one another user can rename things in" apply to it.
        """
        path = Path(os.path.abspath(path))
        with contextlib.suppress(OSError):  # the folder's own fault first: the one to fix is named
            pre = os.lstat(path)
            why = (_folder_stat_problem(pre) if strict else _parent_problem(pre)) if stat.S_ISDIR(pre.st_mode) else None
            if why is not None:
                raise UnsafePathError(path, why)
        _check_route(path)
        fd = _open_dir(path, create)
        try:
            st = os.fstat(fd)
            why = _folder_stat_problem(st) if strict else _parent_problem(st)
            if why is not None:
                raise UnsafePathError(path, why)
            _check_parents(fd, path)
        except BaseException:
            os.close(fd)
            raise
        return cls(fd, path)

    def subfolder(self, name: str, *, create: bool = True) -> Folder:
        """The folder ``name`` inside this one, held the same way (created 0700 when absent)."""
        made = False
        if create:
            try:
                os.mkdir(name, DIR_MODE, dir_fd=self.fd)
                made = True
            except FileExistsError:
                pass
            except OSError as exc:
                raise UnsafePathError(self.path / name, f"cannot be created: {exc.strerror or exc}") from None
        fd = _open_nofollow_dir(self.path / name, name, self.fd)
        try:
            if made:
                os.fchmod(fd, DIR_MODE)  # ours, new: mkdir's mode went through the umask
            why = _folder_stat_problem(os.fstat(fd))
            if why is not None:
                raise UnsafePathError(self.path / name, why)
        except BaseException:
            os.close(fd)
            raise
        return Folder(fd, self.path / name)

    def dup(self) -> Folder:
        """The same folder held by a second descriptor (closed on its own)."""
        return Folder(os.dup(self.fd), self.path)

    def where_now(self) -> Path:
        """Where the held folder is now (it may have been renamed since it was held); its name
        when the system cannot say."""
        try:
            now = os.readlink(f"/proc/self/fd/{self.fd}")
        except OSError:
            return self.path
        return Path(now) if now.startswith("/") else self.path

    def moved(self) -> str | None:
        """None while :attr:`path` still names the held folder; otherwise what it names now (for a
        run to say why it stopped): a folder swapped in by a rename or a symlink changes nothing
        harvest writes, which all goes through the descriptor."""
        try:
            st = os.lstat(self.path)
        except FileNotFoundError:
            return f"{self.path} is gone (the folder held is now at {self.where_now()})"
        except OSError as exc:
            return f"{self.path} cannot be examined ({exc.strerror or exc})"
        held = os.fstat(self.fd)
        if (st.st_dev, st.st_ino) == (held.st_dev, held.st_ino):
            return None
        what = "a symlink" if stat.S_ISLNK(st.st_mode) else "another folder" if stat.S_ISDIR(st.st_mode) else "a file"
        return f"{self.path} now names {what}, not the folder held (now at {self.where_now()})"

    def close(self) -> None:
        fd, self.fd = self.fd, -1
        if fd >= 0:
            os.close(fd)

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __del__(self) -> None:
        with contextlib.suppress(Exception):
            self.close()

    def __repr__(self) -> str:
        return f"Folder({str(self.path)!r}, fd={self.fd})"

    # --- files in it ------------------------------------------------------------------------------

    def via(self, name: str = "") -> str:
        """A path to ``name`` that resolves through the held descriptor, not through the folder's
        name (for SQLite and other APIs that take a path)."""
        return f"/proc/self/fd/{self.fd}/{name}" if name else f"/proc/self/fd/{self.fd}"

    def lstat(self, name: str) -> os.stat_result | None:
        """``lstat`` of ``name`` in the folder (``None`` when absent); nothing is followed."""
        try:
            return os.stat(name, dir_fd=self.fd, follow_symlinks=False)
        except FileNotFoundError:
            return None
        except OSError as exc:
            raise UnsafePathError(self.path / name, f"cannot be examined: {exc.strerror or exc}") from None

    def exists(self, name: str) -> bool:
        return self.lstat(name) is not None

    def check_file(self, name: str) -> bool:
        """Whether ``name`` exists; refuse it unless it is this user's own regular file, one link."""
        st = self.lstat(name)
        if st is None:
            return False
        _check_stat(self.path / name, st, lambda: self._readlink(name))
        return True

    def _readlink(self, name: str) -> str:
        try:
            return os.readlink(name, dir_fd=self.fd)
        except OSError:
            return "?"

    def open(self, name: str, flags: int, mode: int = FILE_MODE) -> int:
        """``os.open`` of ``name`` relative to the folder, never following a symlink. The file must be
        this user's own regular file with one link, checked on the open descriptor *before* anything
        changes it: ``O_TRUNC`` is applied (``ftruncate``) only after the checks passed. A file
        created here gets ``mode`` (0600) whatever the umask."""
        shown = self.path / name
        try:
            fd = os.open(name, (flags & ~os.O_TRUNC) | _NOFOLLOW, mode, dir_fd=self.fd)
        except OSError as exc:
            if exc.errno == errno.ELOOP:
                raise UnsafePathError(shown, f"is a symlink (to {self._readlink(name)}); harvest does not "
                                             f"follow links in its folders") from None
            raise
        try:
            st = os.fstat(fd)
            _check_stat(shown, st, lambda: self._readlink(name))
            if flags & os.O_CREAT and stat.S_IMODE(st.st_mode) & 0o077:
                os.fchmod(fd, FILE_MODE)  # created by us under a loose umask, or an old file of ours
            if flags & os.O_TRUNC:
                os.ftruncate(fd, 0)
        except BaseException:
            os.close(fd)
            raise
        return fd

    def open_text(self, name: str, mode: str = "w", *, encoding: str = "utf-8", newline: str | None = None):
        """A file handle (``"w"``, ``"a"``, ``"r"``, each with ``"b"`` too) opened through :meth:`open`."""
        fd = self.open(name, _TEXT_FLAGS[mode.replace("b", "")])
        try:
            if "b" in mode:
                return os.fdopen(fd, mode)
            return os.fdopen(fd, mode, encoding=encoding, newline=newline)
        except BaseException:
            os.close(fd)
            raise

    def read_text(self, name: str, encoding: str = "utf-8") -> str:
        """The text of this user's own regular file ``name`` (no symlink followed)."""
        with self.open_text(name, "r", encoding=encoding) as fh:
            return fh.read()

    def temp(self, name: str) -> tuple[str, int]:
        """A new 0600 file beside ``name``: its name and descriptor, for :meth:`replace`.

        The name carries 128 random bits (``.NAME.<32 hex>.tmp``), so no one can plant it in
        advance, and it is created ``O_CREAT | O_EXCL | O_NOFOLLOW`` in the held folder: a name that
        is taken (a file or a link, planted or not) is never opened, another is drawn."""
        stem = os.fsencode(name)[:_TEMP_STEM_BYTES].decode("utf-8", "surrogateescape")
        for _ in range(TEMP_TRIES):
            tmp = f".{stem}.{secrets.token_hex(16)}.tmp"
            try:
                fd = os.open(tmp, os.O_RDWR | os.O_CREAT | os.O_EXCL | _NOFOLLOW, FILE_MODE, dir_fd=self.fd)
            except FileExistsError:
                continue
            os.fchmod(fd, FILE_MODE)
            return tmp, fd
        raise UnsafePathError(self.path / name, f"no free temporary name beside it in {TEMP_TRIES} random draws")

    def replace(self, tmp: str, name: str) -> None:
        """Rename ``tmp`` over ``name`` in the folder; an existing ``name`` must be this user's own
        file (a symlink there would be replaced, never followed, but it is refused so the plant is
        reported)."""
        self.check_file(name)
        os.replace(tmp, name, src_dir_fd=self.fd, dst_dir_fd=self.fd)

    def unlink(self, name: str) -> None:
        """Remove ``name`` from the folder (absent: nothing to do)."""
        with contextlib.suppress(FileNotFoundError):
            os.unlink(name, dir_fd=self.fd)

    def move_to(self, name: str, dest: Folder, new_name: str) -> None:
        """Rename ``name`` of this folder to ``new_name`` in ``dest`` (another held folder on the same
        file system), both relative to their descriptors: ``name`` must be this user's own regular
        file, and ``new_name`` must not exist (nothing is overwritten)."""
        self.check_file(name)
        if dest.lstat(new_name) is not None:
            raise UnsafePathError(dest.path / new_name, "exists already; harvest does not overwrite it")
        os.rename(name, new_name, src_dir_fd=self.fd, dst_dir_fd=dest.fd)

    def remove_folder(self, name: str) -> None:
        """Remove the folder ``name`` in this folder and the regular files in it (nothing is
        followed; a folder holding anything else is left, and so said by the error)."""
        with self.subfolder(name, create=False) as inner:
            for entry in os.listdir(inner.fd):
                st = inner.lstat(entry)
                if st is not None and stat.S_ISREG(st.st_mode):
                    inner.unlink(entry)
        try:
            os.rmdir(name, dir_fd=self.fd)
        except OSError as exc:
            raise UnsafePathError(self.path / name, f"cannot be removed: {exc.strerror or exc}") from None

    def write_atomic(self, name: str, data: str | bytes, *, encoding: str = "utf-8", fsync: bool = True) -> Path:
        """Replace ``name`` with ``data`` atomically: a temp file created ``O_EXCL`` 0600, renamed."""
        self.check_file(name)
        tmp, fd = self.temp(name)
        try:
            with os.fdopen(fd, "wb") as fh:
                fh.write(data.encode(encoding) if isinstance(data, str) else data)
                fh.flush()
                if fsync:
                    os.fsync(fh.fileno())
            self.replace(tmp, name)
        except BaseException:
            self.unlink(tmp)
            raise
        return self.path / name

    def write_new(self, name: str, data: str | bytes, *, encoding: str = "utf-8") -> Path:
        """Create ``name`` (``O_EXCL``, 0600) holding ``data``; an existing one is an error."""
        fd = os.open(name, os.O_WRONLY | os.O_CREAT | os.O_EXCL | _NOFOLLOW, FILE_MODE, dir_fd=self.fd)
        with os.fdopen(fd, "wb") as fh:
            os.fchmod(fh.fileno(), FILE_MODE)
            fh.write(data.encode(encoding) if isinstance(data, str) else data)
        return self.path / name


_TEXT_FLAGS = {"w": os.O_WRONLY | os.O_CREAT | os.O_TRUNC, "a": os.O_WRONLY | os.O_CREAT | os.O_APPEND,
               "r": os.O_RDONLY}


def _open_nofollow_dir(shown: Path, name: str | Path, dir_fd: int | None = None) -> int:
    try:
        return os.open(name, os.O_RDONLY | os.O_DIRECTORY | _NOFOLLOW, dir_fd=dir_fd)
    except FileNotFoundError:
        raise UnsafePathError(shown, "does not exist") from None
    except OSError as exc:
        if exc.errno in (errno.ELOOP, errno.ENOTDIR):
            try:
                if stat.S_ISLNK(os.stat(name, dir_fd=dir_fd, follow_symlinks=False).st_mode):
                    raise UnsafePathError(shown, "is a symlink; harvest does not follow links in its folders") from None
            except OSError:
                pass
            raise UnsafePathError(shown, "is not a folder") from None
        raise UnsafePathError(shown, f"cannot be opened: {exc.strerror or exc}") from None


def _open_dir(path: Path, create: bool) -> int:
    """A descriptor of the folder ``path`` (made 0700 with its missing parents when ``create``). A
    symlink as the folder itself is followed only when this user owns the link."""
    if create:
        _make_missing(path)
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        raise UnsafePathError(path, "does not exist") from None
    except OSError as exc:
        raise UnsafePathError(path, f"cannot be examined: {exc.strerror or exc}") from None
    if not stat.S_ISLNK(st.st_mode):
        return _open_nofollow_dir(path, path)
    uid = os.geteuid()
    if st.st_uid != uid:
        raise UnsafePathError(path, f"is a symlink owned by {_who(st.st_uid)}, not by {_who(uid)}")
    try:  # the user's own link: hold what it resolves to (that folder is checked like any other)
        return os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except FileNotFoundError:
        raise UnsafePathError(path, "is a symlink to nothing") from None
    except OSError as exc:
        raise UnsafePathError(path, f"cannot be opened: {exc.strerror or exc}") from None


def _make_missing(path: Path) -> None:
    """Create the missing folders of ``path`` 0700 (each ``mkdir`` relative to its held parent, and
    ``fchmod``-ed through its own descriptor: the umask changes nothing)."""
    missing: list[str] = []
    p = path
    while not os.path.lexists(p) and p != p.parent:
        missing.append(p.name)
        p = p.parent
    if not missing:
        return
    try:
        cur = os.open(p, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except OSError as exc:
        raise UnsafePathError(p, f"cannot be opened: {exc.strerror or exc}") from None
    try:
        # The folder that exists must already be one nobody else can rename things in: refused here,
        # before anything is created in it.
        why = _parent_problem(os.fstat(cur))
        if why is not None:
            raise UnsafePathError(_fd_name(cur, p), f"{why} (it would hold {path})")
        _check_parents(cur, p)
        for name in reversed(missing):
            p = p / name
            made = False
            try:
                os.mkdir(name, DIR_MODE, dir_fd=cur)
                made = True
            except FileExistsError:
                pass  # made meanwhile by someone: checked below like any existing folder
            except OSError as exc:
                raise UnsafePathError(p, f"cannot be created: {exc.strerror or exc}") from None
            nxt = _open_nofollow_dir(p, name, cur)
            os.close(cur)
            cur = nxt
            if made:
                os.fchmod(cur, DIR_MODE)
            elif p != path:
                why = _folder_stat_problem(os.fstat(cur))
                if why is not None:
                    raise UnsafePathError(p, why)
    finally:
        os.close(cur)


def hold(path: Path | str, *, create: bool = False) -> Folder:
    """:meth:`Folder.hold` (strict): a folder harvest writes its records in."""
    return Folder.hold(path, create=create)


def check_dir(path: Path | str) -> Path:
    """Raise :class:`UnsafePathError` unless ``path`` is a folder :meth:`Folder.hold` accepts."""
    with Folder.hold(path):
        return Path(path)


def ensure_dir(path: Path | str) -> Path:
    """``path`` as a safe folder: created 0700 when absent (missing parents too), else checked
    (never chmod-ed)."""
    with Folder.hold(path, create=True):
        return Path(path)
