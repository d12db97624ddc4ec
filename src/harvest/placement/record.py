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
import os
from pathlib import Path
from typing import Any

from harvest import safefiles, schemas
from harvest.errors import UnsafePathError
from harvest.server.state import STATE_FILE, make_run_dir

RECORD = "placement.json"
#: The server folder inside a campaign's run folder.
SERVER_DIR = "server"


#: A record folder as given: by its name, or held (a campaign's ``server/``, read and written
#: through its descriptor only).
Where = Path | str | safefiles.Folder


def read(folder: Where) -> dict[str, Any] | None:
    """The placement record in ``folder`` (None when it holds none, it does not parse, or it is not
    this user's own regular file: a link there is never followed)."""
    try:
        if isinstance(folder, safefiles.Folder):
            folder.check_file(RECORD)
            doc = json.loads(folder.read_text(RECORD))
        else:
            doc = json.loads(safefiles.read_text(Path(folder) / RECORD))
    except (OSError, ValueError, UnsafePathError):
        return None
    return doc if isinstance(doc, dict) and "kind" in doc else None


def write(folder: Where, kind: str, doc: dict[str, Any]) -> None:
    """Write ``doc`` tagged with ``kind``: the folder 0700, the file 0600, replaced atomically."""
    body = {"schema": schemas.PLACEMENT_RECORD, **doc, "kind": kind}
    if isinstance(folder, safefiles.Folder):
        folder.write_atomic(RECORD, json.dumps(body, indent=2) + "\n")
        return
    with make_run_dir(Path(folder)) as held:
        held.write_atomic(RECORD, json.dumps(body, indent=2) + "\n")


def hosts_in(folder: safefiles.Folder) -> list[safefiles.Folder]:
    """The ``host-*`` folders in a held folder, each held (a link there is refused, not followed)."""
    return [folder.subfolder(name, create=False) for name in sorted(os.listdir(folder.fd))
            if name.startswith("host-")]


def check(folder: Where) -> None:
    """Refuse (:class:`UnsafePathError`) a record :func:`write` would be refused to replace in
    ``folder`` or its ``host-*`` folders (a link, another user's file, a hard-linked one), before
    anything is launched; an absent folder passes (it is created 0700)."""
    if not isinstance(folder, safefiles.Folder):
        if not Path(folder).exists():
            return
        with make_run_dir(Path(folder)) as held:
            check(held)
        return
    folder.check_file(RECORD)
    for sub in hosts_in(folder):
        with sub:
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


def find_held(server_dir: safefiles.Folder) -> list[tuple[safefiles.Folder, dict[str, Any]]]:
    """Every placement record in a held server folder and its ``host-*`` folders, each with the
    folder it was read through (a later write goes there, never by name)."""
    return [(f, doc) for f in (server_dir, *hosts_in(server_dir)) if (doc := read(f)) is not None]


def local_record_dir(run_dir: Path | str) -> Path | None:
    """The folder holding a local supervisor's ``launch.json`` (the run folder or its ``server/``)."""
    for f in (Path(run_dir), Path(run_dir) / SERVER_DIR):
        if (f / STATE_FILE).exists():
            return f
    return None


__all__ = ["RECORD", "SERVER_DIR", "Where", "candidates", "check", "find", "find_held", "hosts_in", "local_record_dir",
           "read", "write"]
