"""One record format for "where a run's servers are": ``placement.json``, owner-only, with a kind tag.

    write(folder, "ssh", {...})          # folder made 0700, file 0600, replaced atomically
    read(folder)                          # the doc (with "kind"), or None
    found = find(run_dir)                 # (folder, doc) records under a run folder, wherever they sit

A far server launched from here (kind ``ssh``) and the servers of a Ray run (kind ``ray``) keep
this record on the near side; a server launched on this machine keeps the supervisor's own
``launch.json`` (:mod:`harvest.server.state`), which is what the ``local`` kind stops by. This module
is the only place that knows the file names and where they sit in a run folder: the run folder
itself, its ``server/`` folder, or one ``host-N/`` folder per host of ``[[hosts]]``.

It reads and writes files only: it never connects anywhere or signals anything.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from harvest import safefiles, schemas
from harvest.errors import UnsafePathError
from harvest.server.state import STATE_FILE, make_run_dir

RECORD = "placement.json"
#: The server folder inside a campaign's run folder.
SERVER_DIR = "server"


def read(folder: Path | str) -> dict[str, Any] | None:
    """The placement record in ``folder`` (None when it holds none, it does not parse, or it is not
    this user's own regular file: a link there is never followed)."""
    try:
        doc = json.loads(safefiles.read_text(Path(folder) / RECORD))
    except (OSError, ValueError, UnsafePathError):
        return None
    return doc if isinstance(doc, dict) and "kind" in doc else None


def write(folder: Path | str, kind: str, doc: dict[str, Any]) -> None:
    """Write ``doc`` tagged with ``kind``: the folder 0700, the file 0600, replaced atomically."""
    body = {"schema": schemas.PLACEMENT_RECORD, **doc, "kind": kind}
    with make_run_dir(Path(folder)) as held:
        held.write_atomic(RECORD, json.dumps(body, indent=2) + "\n")


def check(folder: Path | str) -> None:
    """Refuse (:class:`UnsafePathError`) a record :func:`write` would be refused to replace in
    ``folder`` or its ``host-*`` folders (a link, another user's file, a hard-linked one), before
    anything is launched; an absent folder passes (it is created 0700)."""
    folder = Path(folder)
    if not folder.exists():
        return
    with make_run_dir(folder) as held:
        held.check_file(RECORD)
    for sub in sorted(folder.glob("host-*")):
        check(sub)


def candidates(run_dir: Path | str) -> list[Path]:
    """The folders of a run folder that may hold a record, in the order they are looked at."""
    run_dir = Path(run_dir)
    out = [run_dir, run_dir / SERVER_DIR]
    for base in out[:]:
        if base.is_dir():
            out += sorted(base.glob("host-*"))
    return out


def find(run_dir: Path | str) -> list[tuple[Path, dict[str, Any]]]:
    """Every placement record under ``run_dir`` (the folder, ``server/``, ``host-*``)."""
    return [(f, doc) for f in candidates(run_dir) if (doc := read(f)) is not None]


def local_record_dir(run_dir: Path | str) -> Path | None:
    """The folder holding a local supervisor's ``launch.json`` (the run folder or its ``server/``)."""
    for f in (Path(run_dir), Path(run_dir) / SERVER_DIR):
        if (f / STATE_FILE).exists():
            return f
    return None


__all__ = ["RECORD", "SERVER_DIR", "candidates", "check", "find", "local_record_dir", "read", "write"]
