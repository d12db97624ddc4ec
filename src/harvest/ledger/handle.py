"""One open ledger file: its connection, the write transaction every change goes through, and the
run's metadata. The parts of :class:`harvest.ledger.store.Ledger` (``ingest.py``, ``claims.py``,
``results.py``) are built on this handle; ``store.py`` opens and closes it.

Nothing here decides what a run does; it only holds the connection and the state of the handle.
"""

from __future__ import annotations

import contextlib
import json
import sqlite3
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from harvest import safefiles
from harvest.errors import LedgerError
from harvest.ledger.logprobs import ShardStore
from harvest.ledger.records import Key
from harvest.ledger.schema import SCHEMA_VERSION

#: Meta keys the ledger owns; callers cannot set them through ``meta``.
RESERVED_META = frozenset({"schema_version", "harvest_version", "settings_hash", "settings_hashes",
                           "created_at", "ingest", "samples"})

_ENCODER = json.JSONEncoder(ensure_ascii=False, separators=(",", ":"))


def dumps(value: Any) -> str:
    """Compact JSON, as every meta value and output is stored."""
    return _ENCODER.encode(value)


def read_meta(conn: sqlite3.Connection) -> dict[str, Any]:
    """Every meta key with its JSON-decoded value."""
    return {k: json.loads(v) for k, v in conn.execute("SELECT key, value FROM meta")}


class LedgerHandle:
    """The state of one open ledger: connection, run folder, schema version, samples per input,
    logprob shards, and the seqs of the rows claimed through it."""

    def __init__(self, conn: sqlite3.Connection, path: Path, *, settings_hash: str | None,
                 readonly: bool, lock_fd: int | None, created: bool, recovered: int,
                 tallied: bool = True, version: int = SCHEMA_VERSION, samples: int = 1,
                 folder: safefiles.Folder | None = None):
        self._conn = conn
        #: The run folder, held while the ledger is open (None when opened read-only): the run's other
        #: records (progress, timeline) are written through it.
        self.folder = folder
        self._version = version
        #: Rows per unique input (``[sampling] n`` when the run began).
        self.samples = samples
        #: The run's logprob shards (ledger/logprobs.py).
        self.shards = ShardStore(Path(folder.via()) if folder is not None else path.parent, path.parent)
        # False only for a version-1 ledger opened read-only: no tallies, so counts are full counts.
        self._tallied = tallied
        self._lock_fd = lock_fd
        #: The ledger file.
        self.path = path
        #: Hash stamped on every result committed through this handle (None when read-only).
        self.settings_hash = settings_hash
        self.readonly = readonly
        #: True when :meth:`open` created the ledger (a new run), False on resume.
        self.created = created
        #: Rows found ``running`` at open (left by a crash) and put back to ``pending``.
        self.recovered = recovered
        # (id, sample) -> seq of the rows claimed through this handle and not yet settled (bounded by
        # what is in flight): lets the hot path address rows by seq.
        self._seqs: dict[Key, int] = {}

    @property
    def conn(self) -> sqlite3.Connection:
        if self._conn is None:
            raise LedgerError(f"{self.path}: the ledger is closed")
        return self._conn

    @contextlib.contextmanager
    def _write(self) -> Iterator[sqlite3.Connection]:
        """One write transaction (BEGIN IMMEDIATE ... COMMIT, ROLLBACK on any error)."""
        if self.readonly:
            raise LedgerError(f"{self.path}: opened read-only")
        conn = self.conn
        try:
            conn.execute("BEGIN IMMEDIATE")
            try:
                yield conn
                conn.execute("COMMIT")
            except BaseException:
                if conn.in_transaction:  # some errors (disk full) have already rolled back
                    conn.execute("ROLLBACK")
                raise
        except sqlite3.Error as exc:
            raise LedgerError(f"{self.path}: ledger write failed: {exc}") from exc

    def meta(self) -> dict[str, Any]:
        """Every meta key with its JSON-decoded value."""
        return read_meta(self.conn)

    def set_meta(self, key: str, value: Any) -> None:
        """Store one meta value (JSON-able). Reserved keys are refused."""
        if key in RESERVED_META:
            raise LedgerError(f"meta key {key!r} is reserved by the ledger")
        with self._write() as conn:
            conn.execute("INSERT OR REPLACE INTO meta(key, value) VALUES (?, ?)", (key, dumps(value)))

    def _log_requeue(self, conn: sqlite3.Connection, what: str, reason: str, count: int) -> None:
        """Append one entry to meta ``requeues``, inside the caller's write transaction."""
        row = conn.execute("SELECT value FROM meta WHERE key = 'requeues'").fetchone()
        log = json.loads(row[0]) if row else []
        log.append({"at": time.time(), "what": what, "reason": reason, "count": count,
                    "settings_hash": self.settings_hash})
        conn.execute("INSERT OR REPLACE INTO meta(key, value) VALUES ('requeues', ?)", (dumps(log),))

    @property
    def _sample0(self) -> str:
        """A WHERE clause part keeping one row per input (none needed before schema 3)."""
        return " AND sample = 0" if self._version >= 3 else ""


__all__ = ["LedgerHandle", "RESERVED_META", "dumps", "read_meta"]
