"""Bringing a ledger file to this harvest's schema when it is opened: the checks of a resume
(schema version, settings hash, samples per input), the migration of version 1, 2 and 3 files, and
the recovery of rows a crashed process left ``running``. The SQL itself is in ``schema.py``.

Everything a writable open changes happens in one transaction: it all commits or none does.
"""

from __future__ import annotations

import sqlite3
import time
from pathlib import Path
from typing import Any

from harvest.version import __version__
from harvest.errors import LedgerError
from harvest.ledger.handle import dumps, read_meta
from harvest.ledger.schema import DDL, MIGRATE_3, MIGRATE_4, RESULT_LP_COLUMNS, RETALLY, SCHEMA_VERSION

#: Schema versions this harvest opens: older ones are migrated on a writable open (see ``migrate``)
#: and read with full counts on a read-only one.
READABLE_VERSIONS = (1, 2, 3, SCHEMA_VERSION)


def prepare(conn: sqlite3.Connection, path: Path, settings_hash: str, meta: dict[str, Any],
            allow_mixed: bool, samples: int = 1) -> int:
    """Create or check the ledger's tables and meta for a writable open (``path`` names the file in
    messages); returns how many rows left ``running`` went back to ``pending``."""
    now = time.time()
    conn.executescript(DDL)  # idempotent, its own transaction
    conn.execute("BEGIN IMMEDIATE")
    try:
        stored = read_meta(conn)
        if not stored:
            stored = {"schema_version": SCHEMA_VERSION, "created_at": now, "settings_hash": settings_hash,
                      "settings_hashes": [settings_hash], "samples": samples,
                      "ingest": {"rows": 0, "duplicates": 0, "skipped": 0, "complete": False}}
        elif stored.get("schema_version") not in READABLE_VERSIONS:
            raise LedgerError(f"{path}: ledger schema version {stored.get('schema_version')!r},"
                              f" this harvest writes {SCHEMA_VERSION} (and migrates 1 to 3); open it"
                              " with the harvest that wrote it, or start a new run folder")
        _check_settings(stored, path, settings_hash, allow_mixed)
        _check_samples(stored, path, samples)
        if stored["schema_version"] != SCHEMA_VERSION:
            migrate(conn, stored["schema_version"])
            stored["schema_version"] = SCHEMA_VERSION
        stored.update(meta)
        stored["harvest_version"] = __version__
        conn.executemany("INSERT OR REPLACE INTO meta(key, value) VALUES (?, ?)",
                         [(k, dumps(v)) for k, v in stored.items()])
        recovered = conn.execute(
            "UPDATE items SET status = 'pending', updated_at = ? WHERE status = 'running'", (now,)
        ).rowcount
        conn.execute("COMMIT")
    except BaseException:
        if conn.in_transaction:
            conn.execute("ROLLBACK")
        raise
    return recovered


def _check_settings(stored: dict[str, Any], path: Path, settings_hash: str, allow_mixed: bool) -> None:
    """A resume under other settings is refused unless ``allow_mixed``; then the new hash is kept."""
    if stored.get("settings_hash") != settings_hash:
        if not allow_mixed:
            raise LedgerError(
                f"{path} holds results made with settings {stored.get('settings_hash')}; the"
                f" current settings hash to {settings_hash}. Resuming would mix outputs of"
                " different settings; use a new run folder, or allow mixed settings"
                " (--allow-mixed) to continue anyway."
            )
        stored["settings_hash"] = settings_hash
        if settings_hash not in stored["settings_hashes"]:
            stored["settings_hashes"].append(settings_hash)


def _check_samples(stored: dict[str, Any], path: Path, samples: int) -> None:
    """The rows of each input exist already: ``[sampling] n`` cannot change within a run."""
    if stored.get("samples", 1) != samples:
        raise LedgerError(
            f"{path} was created with [sampling] n = {stored.get('samples', 1)} samples per item;"
            f" this configuration asks for n = {samples}. The ledger holds one row per sample, so"
            " n cannot change within a run: use a new run folder (output dir).")
    stored["samples"] = samples


def migrate(conn: sqlite3.Connection, version: int) -> None:
    """Version 1/2/3 -> 4, inside the open's write transaction (all of it commits or none does).
    The DDL (run just before, its own transaction) added ``tallies`` and its triggers and
    ``lp_shards``. Below 3: ``items`` is rebuilt with its ``sample`` column (every old row sample
    0), ``results`` gains the logprob columns, and the tallies are counted once from scratch.
    Below 4: ``items`` gains ``raw_id`` (NULL: the rows skipped so far keep no id of their own)."""
    if version < 3:
        columns = {r[1] for r in conn.execute("PRAGMA table_info(items)")}
        if "sample" not in columns:
            for sql in MIGRATE_3:
                conn.execute(sql)
        columns = {r[1] for r in conn.execute("PRAGMA table_info(results)")}
        for column in RESULT_LP_COLUMNS:
            if column not in columns:
                conn.execute(f"ALTER TABLE results ADD COLUMN {column} INTEGER")
        for sql in RETALLY:
            conn.execute(sql)
    if "raw_id" not in {r[1] for r in conn.execute("PRAGMA table_info(items)")}:
        conn.execute(MIGRATE_4)


def status_counts(conn: sqlite3.Connection, *, tallied: bool = True) -> dict[str, int]:
    """Items per status name and ``results`` (rows in results): the tallies (schema 2 and 3), or a
    full count of a version 1 ledger."""
    if tallied:
        return {str(name): int(n) for name, n in conn.execute("SELECT name, n FROM tallies")}
    counts = {str(status): int(n) for status, n in conn.execute("SELECT status, COUNT(*) FROM items GROUP BY status")}
    counts["results"] = int(conn.execute("SELECT COUNT(*) FROM results").fetchone()[0])
    return counts


def readable_version(conn: sqlite3.Connection, path: Path) -> tuple[int, dict[str, Any]]:
    """The schema version and meta of a ledger opened read-only; :class:`LedgerError` when it is
    not a harvest ledger or a version this harvest cannot read. Closes ``conn`` when it raises."""
    try:
        stored = read_meta(conn)
        version = stored.get("schema_version")
    except sqlite3.Error as exc:
        conn.close()
        raise LedgerError(f"{path}: not a harvest ledger: {exc}") from exc
    if version not in READABLE_VERSIONS:
        conn.close()
        raise LedgerError(
            f"{path}: ledger schema version {version!r}, this harvest reads versions"
            f" {', '.join(map(str, READABLE_VERSIONS))}; open it with the harvest that wrote it")
    return version, stored


__all__ = ["READABLE_VERSIONS", "migrate", "prepare", "readable_version"]
