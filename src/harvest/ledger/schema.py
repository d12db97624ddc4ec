"""The ledger's SQLite schema and connection settings.

One file, ``ledger.sqlite``, in the run folder:

    meta     key -> JSON value: schema version, harvest version, settings hash(es), job spec,
             engine version, creation time, ingest progress
    items    one row per unique input id: status, attempts, last error, source and line,
             duplicate counts (small rows: status changes are cheap)
    inputs   the normalized input (JSON) of each item, by item seq
    results  at most one row per item (the item's seq is the primary key): the output, the
             settings hash it came from, finish reason, token usage

Invariant kept by every write (each in one transaction): an item has a row in ``results`` if and
only if its status is done or truncated.

This module only defines SQL and opens connections; it never decides what a run does.
"""

from __future__ import annotations

import sqlite3
from pathlib import Path

from harvest.errors import LedgerError

SCHEMA_VERSION = 1
LEDGER_FILE = "ledger.sqlite"
LOCK_FILE = "ledger.lock"

#: SQLite 3.24 brought upserts (INSERT ... ON CONFLICT DO UPDATE), which dedupe during ingest.
MIN_SQLITE = (3, 24, 0)

DDL = """
BEGIN IMMEDIATE;
CREATE TABLE IF NOT EXISTS meta (
    key   TEXT PRIMARY KEY,
    value TEXT NOT NULL
);
-- Small rows that change as items move; the (possibly large) input lives in ``inputs`` so that a
-- status change never rewrites a prompt.
-- ``seq`` is the input order; an explicit INTEGER PRIMARY KEY never changes (not even by VACUUM),
-- so ``inputs`` and ``results`` can key on it.
CREATE TABLE IF NOT EXISTS items (
    seq           INTEGER PRIMARY KEY,
    id            TEXT NOT NULL UNIQUE,
    status        TEXT NOT NULL,
    attempts      INTEGER NOT NULL DEFAULT 0,
    last_error    TEXT,
    error_class   TEXT,
    source        TEXT,
    source_line   INTEGER,
    input_hash    INTEGER,
    dup_count     INTEGER NOT NULL DEFAULT 0,
    dup_conflicts INTEGER NOT NULL DEFAULT 0,
    updated_at    REAL
);
CREATE INDEX IF NOT EXISTS items_status ON items(status);
-- The normalized input of each item (Item.to_json), keyed by the item's seq; none for skipped rows.
CREATE TABLE IF NOT EXISTS inputs (
    item  INTEGER PRIMARY KEY,
    input TEXT NOT NULL
);
-- At most one result per item: the primary key is the item's seq (results are appended in claim
-- order, which keeps this b-tree sequential where a text id would scatter it).
CREATE TABLE IF NOT EXISTS results (
    item              INTEGER PRIMARY KEY,
    status            TEXT NOT NULL,
    output            TEXT NOT NULL,
    settings_hash     TEXT NOT NULL,
    finish_reason     TEXT,
    prompt_tokens     INTEGER,
    completion_tokens INTEGER,
    created_at        REAL NOT NULL
);
COMMIT;
"""


def connect(path: Path, *, readonly: bool = False) -> sqlite3.Connection:
    """Open the ledger database with the settings every harvest connection uses.

    Autocommit mode (``isolation_level=None``): transactions are explicit ``BEGIN IMMEDIATE`` /
    ``COMMIT`` in the store. The connection may be handed between threads but must be used by one
    thread at a time (the async writer runs every call on its own single thread).
    """
    if sqlite3.sqlite_version_info < MIN_SQLITE:
        raise LedgerError(
            f"SQLite {sqlite3.sqlite_version} is too old for the ledger (needs "
            f"{'.'.join(map(str, MIN_SQLITE))} or newer)"
        )
    try:
        conn = sqlite3.connect(str(path), timeout=30.0, isolation_level=None, check_same_thread=False)
        # WAL: readers (``harvest status``) never block the writer. synchronous=NORMAL in WAL mode
        # still makes every committed transaction survive a crash of the *process* (the commit is in
        # the WAL file once COMMIT returns); only an OS crash or power loss can roll back the last
        # few commits, and the database stays consistent: those items are simply regenerated.
        mode = conn.execute("PRAGMA journal_mode=WAL").fetchone()[0]
        if str(mode).lower() != "wal":
            raise LedgerError(f"{path}: cannot switch the ledger to WAL mode (got {mode!r})")
        conn.execute("PRAGMA synchronous=NORMAL")
        conn.execute("PRAGMA busy_timeout=30000")
        conn.execute("PRAGMA cache_size=-65536")  # 64 MiB page cache: id lookups hit random pages
        conn.execute("PRAGMA temp_store=FILE")
        if readonly:
            conn.execute("PRAGMA query_only=ON")
    except sqlite3.Error as exc:
        raise LedgerError(f"{path}: cannot open the ledger: {exc}") from exc
    return conn


__all__ = ["DDL", "LEDGER_FILE", "LOCK_FILE", "MIN_SQLITE", "SCHEMA_VERSION", "connect"]
