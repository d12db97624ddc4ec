"""The ledger's SQLite schema and connection settings.

One file, ``ledger.sqlite``, in the run folder:

    meta     key -> JSON value: schema version, harvest version, settings hash(es), job spec,
             engine version, creation time, ingest progress
    items    one row per unique input id and sample (``[sampling] n`` rows per input, samples
             0..n-1 at consecutive seqs): status, attempts, last error, source and line,
             duplicate counts, and for a row skipped at ingest its own id where it had one
             (schema version 4) (small rows: status changes are cheap)
    inputs   the normalized input (JSON) of each input, keyed by the seq of its sample 0 (a
             sample's input is at ``seq - sample``)
    results  at most one row per item row (the row's seq is the primary key): the output, the
             settings hash it came from, finish reason, token usage, and where its token
             log-probabilities lie in the run's logprob shards (schema version 3)
    lp_shards the logprob shard files of the run and the bytes of each that committed results
             cover (schema version 3; ledger/logprobs.py)
    tallies  name -> count: items per status (one row per status name) and ``results`` (rows in
             results), kept by triggers (schema version 2)

Invariants kept by every write (each in one transaction): an item has a row in ``results`` if and
only if its status is done or truncated; ``tallies`` equals a full count of ``items`` by status and
of ``results``. The triggers fire inside the statement that changes a status, so any statement
(an ingest, a claim, a requeue a later version adds) keeps the tallies exact without knowing of
them, and ``counts()`` reads a handful of rows instead of scanning 10^7 index entries.

This module only defines SQL and opens connections; it never decides what a run does.
"""

from __future__ import annotations

import sqlite3
import urllib.parse
from pathlib import Path

from harvest.errors import LedgerError

#: 2 added ``tallies`` and its triggers; a version-1 ledger is migrated when opened for writing
#: (tallies built once by a full count) and read with full counts when opened read-only.
#: 3 added samples (``items.sample``, unique with the id) and the logprob references (``results``
#: lp_* columns, ``lp_shards``); older ledgers are migrated on a writable open (the items table is
#: rebuilt once, every row sample 0) and read as sample 0 without logprobs when opened read-only.
#: 4 added ``items.raw_id``: a row skipped at ingest keeps its own id (an OpenAI batch line's
#: ``custom_id``), which ``inputs`` cannot hold: there an input means a runnable item (requeue and
#: re-reading of skipped rows go by it), so an older harvest would take such a row for one. Older
#: ledgers gain the column on a writable open (``ALTER TABLE ... ADD COLUMN``: no rewrite; their
#: skipped rows keep no id) and read NULL for it when opened read-only.
SCHEMA_VERSION = 4
LEDGER_FILE = "ledger.sqlite"
LOCK_FILE = "ledger.lock"

#: SQLite 3.24 brought upserts (INSERT ... ON CONFLICT DO UPDATE), which dedupe during ingest.
MIN_SQLITE = (3, 24, 0)

#: The tally triggers on ``items`` (recreated by the version 3 migration, which rebuilds the table).
ITEMS_TRIGGERS = """
CREATE TRIGGER IF NOT EXISTS items_tally_insert AFTER INSERT ON items BEGIN
    INSERT INTO tallies(name, n) VALUES (new.status, 1) ON CONFLICT(name) DO UPDATE SET n = n + 1;
END;
CREATE TRIGGER IF NOT EXISTS items_tally_update AFTER UPDATE OF status ON items
WHEN old.status IS NOT new.status BEGIN
    UPDATE tallies SET n = n - 1 WHERE name = old.status;
    INSERT INTO tallies(name, n) VALUES (new.status, 1) ON CONFLICT(name) DO UPDATE SET n = n + 1;
END;
CREATE TRIGGER IF NOT EXISTS items_tally_delete AFTER DELETE ON items BEGIN
    UPDATE tallies SET n = n - 1 WHERE name = old.status;
END;
-- Rows whose id was seen before with another content (``id_conflicts``; the first row is kept),
-- counted on sample 0's row (every sample row of the input counts the same duplicate).
CREATE TRIGGER IF NOT EXISTS items_conflict_tally AFTER UPDATE OF dup_conflicts ON items
WHEN new.dup_conflicts > old.dup_conflicts AND new.sample = 0 BEGIN
    INSERT INTO tallies(name, n) VALUES ('id_conflicts', new.dup_conflicts - old.dup_conflicts)
    ON CONFLICT(name) DO UPDATE SET n = n + new.dup_conflicts - old.dup_conflicts;
END;
"""

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
    id            TEXT NOT NULL,
    sample        INTEGER NOT NULL DEFAULT 0,
    status        TEXT NOT NULL,
    attempts      INTEGER NOT NULL DEFAULT 0,
    last_error    TEXT,
    error_class   TEXT,
    source        TEXT,
    source_line   INTEGER,
    input_hash    INTEGER,
    dup_count     INTEGER NOT NULL DEFAULT 0,
    dup_conflicts INTEGER NOT NULL DEFAULT 0,
    updated_at    REAL,
    -- A row skipped at ingest: the id it gave (an OpenAI batch line's custom_id, a row's id field)
    -- where it could be read, else NULL; an item's own id is in its input (schema version 4).
    raw_id        TEXT,
    UNIQUE(id, sample)
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
    created_at        REAL NOT NULL,
    lp_shard          INTEGER,
    lp_offset         INTEGER,
    lp_bytes          INTEGER
);
-- Logprob shard files (logprobs/shard-NNNNNN.bin) and the bytes of each that committed results
-- reference; bytes past ``committed`` were written by a batch that never committed (schema 3).
CREATE TABLE IF NOT EXISTS lp_shards (
    shard     INTEGER PRIMARY KEY,
    committed INTEGER NOT NULL
);
-- Items per status and results in all, kept in the transaction of every change (schema version 2).
CREATE TABLE IF NOT EXISTS tallies (
    name TEXT PRIMARY KEY,
    n    INTEGER NOT NULL
) WITHOUT ROWID;
""" + ITEMS_TRIGGERS + """CREATE TRIGGER IF NOT EXISTS results_tally_insert AFTER INSERT ON results BEGIN
    INSERT INTO tallies(name, n) VALUES ('results', 1) ON CONFLICT(name) DO UPDATE SET n = n + 1;
END;
CREATE TRIGGER IF NOT EXISTS results_tally_delete AFTER DELETE ON results BEGIN
    UPDATE tallies SET n = n - 1 WHERE name = 'results';
END;
COMMIT;
"""

#: Version 1/2 -> 3 (inside the open's write transaction, after the DDL): rebuild ``items`` with a
#: ``sample`` column (every old row is sample 0) and the (id, sample) key; add the logprob columns.
#: (The version 4 column is added after it, as for a version 3 ledger: :data:`MIGRATE_4`.)
MIGRATE_3 = (
    "DROP TABLE IF EXISTS items_v3",
    "CREATE TABLE items_v3 (seq INTEGER PRIMARY KEY, id TEXT NOT NULL, sample INTEGER NOT NULL DEFAULT 0,"
    " status TEXT NOT NULL, attempts INTEGER NOT NULL DEFAULT 0, last_error TEXT, error_class TEXT,"
    " source TEXT, source_line INTEGER, input_hash INTEGER, dup_count INTEGER NOT NULL DEFAULT 0,"
    " dup_conflicts INTEGER NOT NULL DEFAULT 0, updated_at REAL, UNIQUE(id, sample))",
    "INSERT INTO items_v3(seq, id, sample, status, attempts, last_error, error_class, source, source_line,"
    " input_hash, dup_count, dup_conflicts, updated_at) SELECT seq, id, 0, status, attempts, last_error,"
    " error_class, source, source_line, input_hash, dup_count, dup_conflicts, updated_at FROM items",
    "DROP TABLE items",
    "ALTER TABLE items_v3 RENAME TO items",
    "CREATE INDEX IF NOT EXISTS items_status ON items(status)",
    *[t.strip() + "\nEND;" for t in ITEMS_TRIGGERS.split("END;") if t.strip()],
)
#: Columns the version 3 results table has beyond version 2's (added by the migration).
RESULT_LP_COLUMNS = ("lp_shard", "lp_offset", "lp_bytes")
#: Version 3 -> 4: the skipped rows' own ids (NULL for every row there already).
MIGRATE_4 = "ALTER TABLE items ADD COLUMN raw_id TEXT"

#: Rebuild the tallies from full counts (the version 1 -> 2 migration; inside a write transaction).
RETALLY = (
    "DELETE FROM tallies",
    "INSERT INTO tallies(name, n) SELECT status, COUNT(*) FROM items GROUP BY status",
    "INSERT INTO tallies(name, n) SELECT 'results', COUNT(*) FROM results",
    "INSERT INTO tallies(name, n) SELECT 'id_conflicts', total(dup_conflicts) FROM items WHERE sample = 0",
)


#: SQLite's page cache per connection, KiB. The ingest's random id-index pages need it most: one
#: batch of 10,000 new ids dirties about 10,000 index leaves at 10^7 items (40 MiB), which must stay
#: in the cache until the commit; the rest of the index is read through the OS cache (a miss costs a
#: pread, measured to be minor next to the writes). Larger caches or mmap count in the process's
#: RSS (target <= 300 MB at 10^7) without cutting the writes: see BENCHMARKS.md, P3 at 10^7.
CACHE_KIB = 65536
#: WAL pages before an automatic checkpoint (SQLite's default is 1,000: every ingest batch).
WAL_CHECKPOINT_PAGES = 16384


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
        # A reader never creates a database (``mode=ro``): a name that led elsewhere between the
        # caller's check and this open (a run folder swapped for a link) fails here instead of
        # leaving an empty ledger, and its -wal and -shm, in whatever folder the name led to.
        target = f"file:{urllib.parse.quote(str(path))}?mode=ro" if readonly else str(path)
        conn = sqlite3.connect(target, timeout=30.0, isolation_level=None, check_same_thread=False, uri=readonly)
        # WAL: readers (``harvest status``) never block the writer. synchronous=NORMAL in WAL mode
        # still makes every committed transaction survive a crash of the *process* (the commit is in
        # the WAL file once COMMIT returns); only an OS crash or power loss can roll back the last
        # few commits, and the database stays consistent: those items are simply regenerated.
        if not readonly:  # a reader takes the journal as the writer set it
            mode = conn.execute("PRAGMA journal_mode=WAL").fetchone()[0]
            if str(mode).lower() != "wal":
                raise LedgerError(f"{path}: cannot switch the ledger to WAL mode (got {mode!r})")
        conn.execute("PRAGMA synchronous=NORMAL")
        conn.execute("PRAGMA busy_timeout=30000")
        conn.execute(f"PRAGMA cache_size=-{CACHE_KIB}")
        # A larger WAL between checkpoints: an id-index page dirtied by several ingest batches is
        # copied into the database once per checkpoint, not once per batch; the WAL file is cut
        # back to the same size after a checkpoint.
        conn.execute(f"PRAGMA wal_autocheckpoint={WAL_CHECKPOINT_PAGES}")
        conn.execute(f"PRAGMA journal_size_limit={WAL_CHECKPOINT_PAGES * 4096}")
        conn.execute("PRAGMA temp_store=FILE")
        if readonly:
            conn.execute("PRAGMA query_only=ON")
    except sqlite3.Error as exc:
        raise LedgerError(f"{path}: cannot open the ledger: {exc}") from exc
    return conn


__all__ = ["DDL", "ITEMS_TRIGGERS", "MIGRATE_3", "MIGRATE_4", "RESULT_LP_COLUMNS", "LEDGER_FILE", "LOCK_FILE", "MIN_SQLITE", "RETALLY", "SCHEMA_VERSION", "connect"]
