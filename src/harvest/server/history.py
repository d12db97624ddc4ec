"""Every launch in a run folder kept: its log, launch record and stop report, numbered per launch.

    number = keep_last_launch(folder)     # before a launch: the last one's files moved aside
    log_of(server_dir, 2)                 # where launch 2's log is now (None when not kept)

A run folder holds the files of its current launch by their usual names (``server.log``,
``launch.json``, ``stop.json``: what ``harvest stop``, ``ps`` and a resumed run read). Before the
next launch into the same folder (a relaunch after a crash or a hang, a later session, another
``harvest serve``), the last launch's files are moved, never copied or truncated, into
``launches/N/`` (N: that launch's number, recorded in its ``launch.json``), so the log of an engine
that crashed is still there in the morning. Bounds: at most :data:`KEPT_LAUNCHES` launches are kept
(the first one and the latest ones: the first failure is often the one that explains the rest), and
a log longer than :data:`KEPT_LOG_BYTES` is kept as its head and tail with a line saying what was cut.

Everything goes through the held folder (:class:`harvest.safefiles.Folder`): nothing is followed,
nothing overwritten. It never signals anything and never measures a process.
"""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path

from harvest import safefiles
from harvest.errors import UnsafePathError
from harvest.server.state import LOG_FILE, STATE_FILE, STOP_FILE

log = logging.getLogger("harvest.server")

#: The subfolder of a run folder that holds earlier launches, one numbered folder each.
LAUNCHES_DIR = "launches"
#: Launches kept: the first and the latest (this many in all).
KEPT_LAUNCHES = 20
#: A kept log longer than this keeps its first :data:`HEAD_BYTES` and its last bytes up to it.
KEPT_LOG_BYTES = 32 << 20
HEAD_BYTES = 1 << 20
#: The files of one launch, as its run folder names them while it is the current one.
LAUNCH_FILES = (LOG_FILE, STATE_FILE, STOP_FILE)


def _number_of(folder: safefiles.Folder) -> int | None:
    """The number the current ``launch.json`` records (0 when it predates numbering), None without one."""
    if not folder.check_file(STATE_FILE):
        return None
    try:
        doc = json.loads(folder.read_text(STATE_FILE))
        return int(doc["record"].get("launch") or 0)
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return 0


def kept_numbers(folder: safefiles.Folder) -> list[int]:
    """The numbers of the launches kept under ``launches/``, in order."""
    if folder.lstat(LAUNCHES_DIR) is None:
        return []
    with folder.subfolder(LAUNCHES_DIR, create=False) as kept:
        return sorted(int(n) for n in os.listdir(kept.fd) if n.isdigit())


def keep_last_launch(folder: safefiles.Folder) -> int:
    """Move the last launch's files (if any) into ``launches/N/``; return the number of the launch
    about to be made. Refuses (:class:`UnsafePathError`) what it may not move or write."""
    numbers = kept_numbers(folder)
    present = [name for name in LAUNCH_FILES if folder.check_file(name)]
    recorded = _number_of(folder)
    if not present:
        return max([*numbers, recorded or 0]) + 1
    number = recorded if recorded else max(numbers, default=0) + 1
    if number in numbers:  # a record copied from elsewhere, or numbered before: never overwrite
        number = max(numbers) + 1
    with folder.subfolder(LAUNCHES_DIR) as kept, kept.subfolder(str(number)) as one:
        for name in present:
            _keep(folder, name, one)
        _drop_beyond_bound(kept, [*numbers, number])
    return number + 1


def _keep(folder: safefiles.Folder, name: str, dest: safefiles.Folder) -> None:
    """Move ``name`` into ``dest``; a log past :data:`KEPT_LOG_BYTES` is kept as head and tail."""
    st = folder.lstat(name)
    if st is None:
        return
    if name != LOG_FILE or st.st_size <= KEPT_LOG_BYTES:
        folder.move_to(name, dest, name)
        return
    fd = folder.open(name, os.O_RDONLY)
    try:
        head = os.pread(fd, HEAD_BYTES, 0)
        tail_len = KEPT_LOG_BYTES - HEAD_BYTES
        tail = os.pread(fd, tail_len, st.st_size - tail_len)
    finally:
        os.close(fd)
    cut = st.st_size - len(head) - len(tail)
    dest.write_new(name, head + f"\n[harvest: {cut:,} bytes of this log cut here to keep it within "
                                f"{KEPT_LOG_BYTES >> 20} MiB]\n".encode() + tail)
    folder.unlink(name)


def _drop_beyond_bound(kept: safefiles.Folder, numbers: list[int]) -> None:
    """Keep the first launch and the latest ones, :data:`KEPT_LAUNCHES` in all."""
    ordered = sorted(set(numbers))
    if len(ordered) <= KEPT_LAUNCHES:
        return
    for number in ordered[1:len(ordered) - KEPT_LAUNCHES + 1]:
        try:
            kept.remove_folder(str(number))
        except UnsafePathError as exc:
            log.warning("an earlier launch's files were not removed: %s", exc)


def log_of(server_dir: Path | str, number: int) -> Path | None:
    """Where the log of launch ``number`` is now: ``launches/N/server.log`` once a later launch
    moved it there, ``server.log`` while it is the current launch's; None when it is not kept."""
    server_dir = Path(server_dir)
    kept = server_dir / LAUNCHES_DIR / str(number) / LOG_FILE
    if kept.is_file():
        return kept
    try:
        doc = json.loads((server_dir / STATE_FILE).read_text(encoding="utf-8"))
        current = int(doc["record"].get("launch") or 0)
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return None
    live = server_dir / LOG_FILE
    return live if current == number and live.is_file() else None


__all__ = ["HEAD_BYTES", "KEPT_LAUNCHES", "KEPT_LOG_BYTES", "LAUNCHES_DIR", "LAUNCH_FILES", "keep_last_launch",
           "kept_numbers", "log_of"]
