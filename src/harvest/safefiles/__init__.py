"""Folders and files nobody else can plant in: every file harvest writes goes through here.

harvest usually runs as root on a shared GPU box, and users point it at folders such as
``/tmp/run``. A folder another user can write to lets that user plant a symlink
(``ledger.lock -> /etc/shadow``) or a forged launch record before harvest opens it. The rules:

- A folder harvest writes in (a run folder, ``--run-dir``, the state dir, tune and compare
  folders) must be owned by the user running harvest and not writable by group or others.
  An existing folder is never chmod-ed; a folder harvest creates is created 0700. A symlink as
  the folder itself is accepted only when the user owns the link (as ``fs.protected_symlinks``
  does in sticky folders); the folder it points to must pass the same check.
- Every parent of such a folder, up to ``/``, must be the user's or root's, and not writable by
  group or others unless sticky (``/tmp`` is fine): otherwise another user could rename the folder
  away and put a symlink in its place between two uses. The check walks ``..`` from the folder
  itself, so it sees the folders it really sits in; and the name as given is walked as the kernel
  resolves it, so every folder it passes through obeys the same rule and every symlink on the way
  is the user's or root's (another user's link, even in sticky ``/tmp``, can be re-pointed).
- A folder is held: opened once (``O_DIRECTORY | O_NOFOLLOW``) and checked on its descriptor, then
  every file in it is created, opened, renamed, ``fchmod``-ed and ``lstat``-ed relative to that
  descriptor (:class:`Folder`), never again by the folder's name.
- Files in them are opened without following symlinks (``O_NOFOLLOW``) and without ``O_TRUNC``;
  an existing file must be a regular file owned by the user, with one link, checked on the open
  descriptor before anything (``ftruncate`` included) changes it. New files are created
  ``O_EXCL`` 0600, and a replacement is a temp file created ``O_EXCL`` in the held folder,
  ``fchmod``-ed through its descriptor, then renamed over the old one relative to the folder.
- An explicit output folder (``export -o``, ``report -o``) may be root's or a sticky shared one
  such as ``/tmp``, but never one another user owns or can rename things in; missing ones are
  created 0700.
- The ledger (and its ``-wal``, ``-shm`` and lock) is ``lstat``-ed before SQLite opens it.

A refusal is :class:`UnsafePathError`, naming the path and what is wrong with it. This package
sits below everything but :mod:`harvest.errors`: it never imports another harvest module, and
it never changes the mode or owner of anything it did not create.
"""

from harvest.errors import UnsafePathError
from harvest.safefiles.folder import Folder, check_dir, ensure_dir, hold
from harvest.safefiles.paths import (check_file, check_ledger, check_no_links, open_fd, open_text, read_text,
                                     write_atomic, write_new)
from harvest.safefiles.rules import DIR_MODE, FILE_MODE

__all__ = [
    "DIR_MODE",
    "FILE_MODE",
    "Folder",
    "UnsafePathError",
    "check_dir",
    "check_file",
    "check_ledger",
    "check_no_links",
    "ensure_dir",
    "hold",
    "open_fd",
    "open_text",
    "read_text",
    "write_atomic",
    "write_new",
]
