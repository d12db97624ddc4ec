"""The ledger of a run: the single source of truth for which items exist, where each stands, and
the one result each produced.

    ledger = Ledger.open(run_dir, settings_hash=h, meta={"job": spec, "engine_version": v})
    ledger.ingest(iter_items(data_config))      # streaming, resumable, dedupes by id
    rows = ledger.claim(256)                      # pending -> running
    ledger.complete([Completion(row.id, output)]) # result + status in one transaction, exactly once
    ledger.fail(item_id, "HTTP 400: ...", "http_400")
    ledger.release(ids)                           # running -> pending, no attempt charged
    ledger.check_totals().ok

Guarantees:

- Exactly once: ``results`` is keyed by the item (primary key) and a result is inserted only while
  its item is pending/running/failed, in the same transaction that marks the item done/truncated.
  A second ``complete`` for the same id changes nothing.
- Crash safety: every operation is one transaction. Opening a ledger puts rows left ``running`` by a
  crashed process back to ``pending`` (one indexed UPDATE; ``recovered`` says how many).
- One writer: ``ledger.lock`` (an ``flock``) makes a second process opening the same run for writing
  fail at once, instead of resetting the first one's running rows. ``open_readonly`` takes no lock.
- Counts in constant time: items per status and results are kept in ``tallies`` by triggers that
  fire inside every statement changing them (schema.py), so ``counts()`` and ``check_totals()``
  never scan; ``recount()`` is the full count they always equal.
- Memory stays flat: ids are never loaded into Python in bulk (only those of claimed, unsettled
  items, which the runner holds anyway); duplicates are counted by the id's unique index.
- Files: ``ledger.sqlite`` is created 0600 (its -wal/-shm files inherit that); a run folder the
  ledger creates is 0700. SQLite and file-system failures (a full disk) surface as :class:`LedgerError`.

The store never generates, never retries, and never decides policy (what to retry, when a server is
sick): the runner does, through this API. A ``Ledger`` must be used by one thread at a time.
"""

from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import hashlib
import itertools
import json
import os
import sqlite3
import time
from collections.abc import Collection, Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

from harvest import __version__, safefiles
from harvest.dataset.records import Item, Skipped
from harvest.dataset.skips import REASON_KEY_SQL, SkipReason, reason_key
from harvest.errors import LedgerError
from harvest.ledger.records import (
    FINAL_STATUSES,
    RESULT_STATUSES,
    ApplyReport,
    Completion,
    Failure,
    IngestReport,
    ItemRow,
    Key,
    ResultRow,
    Status,
    Totals,
    as_key,
)
from harvest.ledger.logprobs import ShardStore, TurnLogprobs
from harvest.ledger.schema import DDL, LEDGER_FILE, LOCK_FILE, MIGRATE_3, RETALLY, SCHEMA_VERSION, connect

#: Schema versions this harvest opens: older ones are migrated on a writable open (see ``_migrate``)
#: and read with full counts on a read-only one.
_READABLE_VERSIONS = (1, 2, SCHEMA_VERSION)

#: Meta keys the ledger owns; callers cannot set them through ``meta``.
RESERVED_META = frozenset({"schema_version", "harvest_version", "settings_hash", "settings_hashes",
                           "created_at", "ingest", "samples"})

_SQL_INGEST = (
    "INSERT INTO items(id, sample, status, last_error, error_class, source, source_line, input_hash, updated_at)"
    " VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)"
    " ON CONFLICT(id, sample) DO UPDATE SET dup_count = dup_count + 1,"
    " dup_conflicts = dup_conflicts + (items.input_hash IS NOT excluded.input_hash)"
)
# Hot-path statements address items by ``seq`` (claimed items' seqs are remembered), so a batch
# walks the tables in input order instead of probing the id index at random. A result is inserted
# only for an item still waiting for one; _SQL_DONE, run after it in the same transaction with the
# same guard, marks exactly those items (one that already had a result is done/truncated, so not
# matched). Guards are OR chains: an IN list costs an ephemeral table per execution.
_SQL_RESULT = (
    "INSERT INTO results(item, status, output, settings_hash, finish_reason, prompt_tokens,"
    " completion_tokens, created_at, lp_shard, lp_offset, lp_bytes) SELECT seq, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?"
    " FROM items"
    " WHERE seq = ? AND (+status = 'pending' OR +status = 'running' OR +status = 'failed')"
    " ON CONFLICT(item) DO NOTHING"
)
_SQL_DONE = (
    "UPDATE items SET status = ?, last_error = NULL, error_class = NULL, updated_at = ?"
    " WHERE seq = ? AND (+status = 'pending' OR +status = 'running' OR +status = 'failed')"
)
_SQL_FAIL = (
    "UPDATE items SET status = 'failed', last_error = ?, error_class = ?, updated_at = ?"
    " WHERE seq = ? AND (+status = 'pending' OR +status = 'running')"
)
_SQL_SKIP = (
    "UPDATE items SET status = 'skipped', last_error = ?, error_class = ?, updated_at = ?"
    " WHERE seq = ? AND (+status = 'pending' OR +status = 'running')"
)
_SQL_RELEASE = "UPDATE items SET status = 'pending', updated_at = ? WHERE seq = ? AND +status = 'running'"
_SQL_CHARGE = "UPDATE items SET attempts = attempts + 1 WHERE seq = ?"
# An input lies at the seq of its sample 0: the samples of one input are inserted together, at
# consecutive seqs (a duplicate inserts none of them).
_SQL_SELECT = (
    "SELECT i.id, i.status, i.attempts, i.source, i.source_line, n.input, i.dup_count, i.last_error,"
    " i.error_class, r.output, r.settings_hash, r.finish_reason, r.prompt_tokens, r.completion_tokens,"
    " r.created_at, i.sample, r.lp_shard, r.lp_offset, r.lp_bytes FROM items AS i"
    " LEFT JOIN inputs AS n ON n.item = i.seq - i.sample LEFT JOIN results AS r ON r.item = i.seq "
)
# The same for a version 1/2 ledger opened read-only: every row is sample 0, no logprobs.
_SQL_SELECT_V2 = (
    "SELECT i.id, i.status, i.attempts, i.source, i.source_line, n.input, i.dup_count, i.last_error,"
    " i.error_class, r.output, r.settings_hash, r.finish_reason, r.prompt_tokens, r.completion_tokens,"
    " r.created_at, 0, NULL, NULL, NULL FROM items AS i LEFT JOIN inputs AS n ON n.item = i.seq"
    " LEFT JOIN results AS r ON r.item = i.seq "
)
_ENCODER = json.JSONEncoder(ensure_ascii=False, separators=(",", ":"))


def _dumps(value: Any) -> str:
    return _ENCODER.encode(value)


def _changed(conn: sqlite3.Connection, sql: str, params: list[tuple[Any, ...]]) -> int:
    """Run ``sql`` for each parameter row; the rows it changed. (``rowcount`` leaves out the rows the
    tally triggers change, which ``total_changes`` would count.)"""
    if not params:
        return 0
    return max(conn.executemany(sql, params).rowcount, 0)


def _input_hash(text: str) -> int:
    """64-bit hash of an item's stored input, to tell a true duplicate from an id collision."""
    return int.from_bytes(hashlib.blake2b(text.encode("utf-8"), digest_size=8).digest(), "big", signed=True)


@dataclasses.dataclass(frozen=True)
class IngestBatch:
    """Input records made ready for :meth:`Ledger.commit_ingest` (built off the ledger's thread)."""

    params: list[tuple[Any, ...]]
    #: id -> stored input JSON, first occurrence in the batch.
    inputs: dict[str, str]
    #: Records in the batch, skipped ones included.
    rows: int
    #: Records the readers skipped (bad rows).
    skipped: int
    #: The input ended with this batch.
    last: bool
    #: Items known by the user's own id (not a content hash).
    own_ids: int = 0
    #: (error class, reason) -> rows of this batch skipped for it.
    skip_reasons: dict[tuple[str, str], int] = dataclasses.field(default_factory=dict)


def prepare_ingest(records: Iterator[Item | Skipped], batch_size: int = 10_000, samples: int = 1) -> IngestBatch:
    """Read up to ``batch_size`` records from ``records`` and build their rows (any thread): ``samples``
    rows per record (sample 0..samples-1, at consecutive seqs once inserted)."""
    batch = list(itertools.islice(records, batch_size))
    now = time.time()
    params = []
    inputs: dict[str, str] = {}  # first occurrence in this batch wins, as in the table
    skipped = own_ids = 0
    reasons: dict[tuple[str, str], int] = {}
    for rec in batch:
        if isinstance(rec, Skipped):
            skipped += 1
            key = (rec.kind, reason_key(rec.reason))
            reasons[key] = reasons.get(key, 0) + 1
            params.extend((rec.id, k, Status.SKIPPED.value, rec.reason, rec.kind, rec.source, rec.line, None, now)
                          for k in range(samples))
        else:
            text = rec.to_json()
            own_ids += rec.id == rec.raw_id
            inputs.setdefault(rec.id, text)
            digest = _input_hash(text)
            params.extend((rec.id, k, Status.PENDING.value, None, None, rec.source, rec.source_line, digest, now)
                          for k in range(samples))
    return IngestBatch(params, inputs, len(batch), skipped, len(batch) < batch_size, own_ids, reasons)


class Ledger:
    """A run's ledger file. Create or resume with :meth:`open`; inspect with :meth:`open_readonly`."""

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
        self.shards = ShardStore(Path(folder.via()) if folder is not None else path.parent)
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

    # ---------------------------------------------------------------- opening and closing

    @classmethod
    def open(cls, run_dir: str | Path, *, settings_hash: str, meta: Mapping[str, Any] | None = None,
             allow_mixed: bool = False, samples: int = 1) -> Ledger:
        """Create the ledger of a new run in ``run_dir``, or resume the one there.

        ``meta`` (JSON-able values: job spec, engine version, ...) is stored; on resume its keys are
        updated. Resuming with another ``settings_hash`` raises :class:`LedgerError` naming both
        hashes, unless ``allow_mixed`` (then the new hash is recorded and results carry their own).
        Rows left ``running`` by a crash go back to ``pending``; see :attr:`recovered`. A second
        process opening the same run folder for writing gets :class:`LedgerError` at once.
        ``samples`` (``[sampling] n``) is fixed when the run is created: resuming with another
        number raises :class:`LedgerError` (the rows of each input exist already). Logprob shard
        bytes no committed result references (a crash mid-commit) are cut off here.
        """
        meta = dict(meta or {})
        bad = sorted(RESERVED_META & meta.keys())
        if bad:
            raise LedgerError(f"meta keys {bad} are reserved by the ledger")
        run_dir = Path(run_dir)
        path = run_dir / LEDGER_FILE
        try:
            # Held: created 0700, or this user's own and not group/other-writable, in parents no other
            # user can rename it out of; every file below is reached through this descriptor.
            folder = safefiles.hold(run_dir, create=True)
        except OSError as exc:  # a full disk, a read-only or missing parent folder
            raise LedgerError(f"{path}: cannot open the ledger: {exc.strerror or exc}") from None
        try:
            for name in (LEDGER_FILE, f"{LEDGER_FILE}-wal", f"{LEDGER_FILE}-shm", LOCK_FILE):
                folder.check_file(name)  # nothing SQLite would follow or share
            lock_fd = cls._lock(folder)
        except OSError as exc:
            folder.close()
            raise LedgerError(f"{path}: cannot open the ledger: {exc.strerror or exc}") from None
        except BaseException:
            folder.close()
            raise
        try:
            created = not folder.exists(LEDGER_FILE)
            if created:
                try:
                    folder.write_new(LEDGER_FILE, b"")  # -wal and -shm files take the database file's mode (0600)
                except OSError as exc:
                    raise LedgerError(f"{path}: cannot create the ledger: {exc.strerror or exc}") from None
            # SQLite takes a path: one through the held descriptor (it reads the link to the folder's
            # name once, at connect; the parents' rule above keeps that name the held folder's).
            conn = connect(Path(folder.via(LEDGER_FILE)))
            try:
                recovered = cls._prepare(conn, path, settings_hash, meta, allow_mixed, samples)
                committed = dict(conn.execute("SELECT shard, committed FROM lp_shards"))
            except sqlite3.Error as exc:
                conn.close()
                raise LedgerError(f"{path}: cannot prepare the ledger: {exc}") from exc
            except BaseException:
                conn.close()
                raise
        except BaseException:
            os.close(lock_fd)
            folder.close()
            raise
        ledger = cls(conn, path, settings_hash=settings_hash, readonly=False, lock_fd=lock_fd,
                     created=created, recovered=recovered, samples=samples, folder=folder)
        try:
            ledger.shards.trim(committed)
        except BaseException:
            ledger.close()
            raise
        return ledger

    @classmethod
    def open_readonly(cls, run_dir: str | Path) -> Ledger:
        """Open an existing ledger for reading only (``harvest status``/``export``), even while a
        run is writing to it. No lock, no recovery; every mutating call raises :class:`LedgerError`."""
        path = Path(run_dir) / LEDGER_FILE
        safefiles.check_no_links(path, f"{path}-wal", f"{path}-shm")  # read, not followed
        if not path.is_file():
            raise LedgerError(f"no ledger in {run_dir} (expected {LEDGER_FILE})")
        conn = connect(path, readonly=True)
        try:
            stored = cls._read_meta(conn)
            version = stored.get("schema_version")
        except sqlite3.Error as exc:
            conn.close()
            raise LedgerError(f"{path}: not a harvest ledger: {exc}") from exc
        if version not in _READABLE_VERSIONS:
            conn.close()
            raise LedgerError(
                f"{path}: ledger schema version {version!r}, this harvest reads versions"
                f" {', '.join(map(str, _READABLE_VERSIONS))}; open it with the harvest that wrote it")
        return cls(conn, path, settings_hash=None, readonly=True, lock_fd=None, created=False, recovered=0,
                   tallied=version != 1, version=version, samples=int(stored.get("samples", 1)))

    @staticmethod
    def _lock(folder: safefiles.Folder) -> int:
        run_dir = folder.path
        fd = folder.open(LOCK_FILE, os.O_CREAT | os.O_RDWR)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.read(fd, 64).decode("ascii", "replace").strip() or "unknown"
            os.close(fd)
            raise LedgerError(f"{run_dir} is in use by another harvest process (pid {holder})") from None
        try:
            os.ftruncate(fd, 0)
            os.pwrite(fd, str(os.getpid()).encode(), 0)
        except OSError:
            os.close(fd)
            raise
        return fd

    @staticmethod
    def _read_meta(conn: sqlite3.Connection) -> dict[str, Any]:
        return {k: json.loads(v) for k, v in conn.execute("SELECT key, value FROM meta")}

    @classmethod
    def _prepare(cls, conn: sqlite3.Connection, path: Path, settings_hash: str, meta: dict[str, Any],
                 allow_mixed: bool, samples: int = 1) -> int:
        now = time.time()
        conn.executescript(DDL)  # idempotent, its own transaction
        conn.execute("BEGIN IMMEDIATE")
        try:
            stored = cls._read_meta(conn)
            if not stored:
                stored = {"schema_version": SCHEMA_VERSION, "created_at": now, "settings_hash": settings_hash,
                          "settings_hashes": [settings_hash], "samples": samples,
                          "ingest": {"rows": 0, "duplicates": 0, "skipped": 0, "complete": False}}
            elif stored.get("schema_version") not in _READABLE_VERSIONS:
                raise LedgerError(f"{path}: ledger schema version {stored.get('schema_version')!r},"
                                  f" this harvest writes {SCHEMA_VERSION} (and migrates 1 and 2); open it"
                                  " with the harvest that wrote it, or start a new run folder")
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
            if stored.get("samples", 1) != samples:
                raise LedgerError(
                    f"{path} was created with [sampling] n = {stored.get('samples', 1)} samples per item;"
                    f" this configuration asks for n = {samples}. The ledger holds one row per sample, so"
                    " n cannot change within a run: use a new run folder (output dir).")
            stored["samples"] = samples
            if stored["schema_version"] != SCHEMA_VERSION:
                cls._migrate(conn, stored["schema_version"])
                stored["schema_version"] = SCHEMA_VERSION
            stored.update(meta)
            stored["harvest_version"] = __version__
            conn.executemany("INSERT OR REPLACE INTO meta(key, value) VALUES (?, ?)",
                             [(k, _dumps(v)) for k, v in stored.items()])
            recovered = conn.execute(
                "UPDATE items SET status = 'pending', updated_at = ? WHERE status = 'running'", (now,)
            ).rowcount
            conn.execute("COMMIT")
        except BaseException:
            if conn.in_transaction:
                conn.execute("ROLLBACK")
            raise
        return recovered

    @staticmethod
    def _migrate(conn: sqlite3.Connection, version: int) -> None:
        """Version 1/2 -> 3, inside the open's write transaction (all of it commits or none does).
        The DDL (run just before, its own transaction) added ``tallies`` and its triggers and
        ``lp_shards``; ``items`` is rebuilt with its ``sample`` column (every old row sample 0),
        ``results`` gains the logprob columns, and the tallies are counted once from scratch."""
        columns = {r[1] for r in conn.execute("PRAGMA table_info(items)")}
        if "sample" not in columns:
            for sql in MIGRATE_3:
                conn.execute(sql)
        columns = {r[1] for r in conn.execute("PRAGMA table_info(results)")}
        for column in ("lp_shard", "lp_offset", "lp_bytes"):
            if column not in columns:
                conn.execute(f"ALTER TABLE results ADD COLUMN {column} INTEGER")
        for sql in RETALLY:
            conn.execute(sql)

    def close(self) -> None:
        """Close the database and release the run folder's lock. Idempotent."""
        self.shards.close()
        if self._conn is not None:
            self._conn.close()
            self._conn = None  # type: ignore[assignment]
        if self._lock_fd is not None:
            os.close(self._lock_fd)
            self._lock_fd = None
        if self.folder is not None:
            self.folder.close()

    def __enter__(self) -> Ledger:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ---------------------------------------------------------------- helpers

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
        return self._read_meta(self.conn)

    def set_meta(self, key: str, value: Any) -> None:
        """Store one meta value (JSON-able). Reserved keys are refused."""
        if key in RESERVED_META:
            raise LedgerError(f"meta key {key!r} is reserved by the ledger")
        with self._write() as conn:
            conn.execute("INSERT OR REPLACE INTO meta(key, value) VALUES (?, ?)", (key, _dumps(value)))

    # ---------------------------------------------------------------- input

    def ingest(self, records: Iterable[Item | Skipped], batch_size: int = 10_000) -> IngestReport:
        """Insert the run's input, streaming, one transaction per ``batch_size`` records.

        An id seen before only increments that row's ``dup_count`` (and ``dup_conflicts`` when the
        input differs): it is generated once. Skipped rows become ``skipped`` items with id
        ``skip:<file>:<line>`` and the reason as ``last_error``. Resumable: the number of records
        committed is stored with each batch, and a later call skips that many records first, so
        ``records`` must be the same sequence each time (same dataset and config). Once complete,
        further calls read nothing.

        The same in two halves, for a caller that ingests while it generates: read the position
        with :meth:`ingest_state`, skip that many records itself, build batches with
        :func:`prepare_ingest` (any thread) and commit each with :meth:`commit_ingest`.
        """
        state = self.ingest_state()
        if state["complete"]:
            return self._ingest_report(state, rows_read=0, resumed_from=state["rows"])
        resumed_from = state["rows"]
        it = iter(records)
        for _ in itertools.islice(it, resumed_from):
            pass
        rows_read = 0
        while True:
            batch = prepare_ingest(it, batch_size, self.samples)
            report = self.commit_ingest(batch, resumed_from=resumed_from)
            rows_read += batch.rows
            if report.complete:
                return dataclasses.replace(report, rows_read=rows_read)

    def ingest_state(self) -> dict[str, Any]:
        """Where the ingest stands: ``rows`` committed, ``duplicates``, ``skipped``, ``complete``."""
        return dict(self.meta()["ingest"])

    def commit_ingest(self, batch: IngestBatch, resumed_from: int = 0) -> IngestReport:
        """Commit one prepared batch of input records, after those committed before, in one
        transaction with the new ingest position. A batch with ``last`` set completes the ingest."""
        state = self.ingest_state()
        if state["complete"]:
            raise LedgerError(f"{self.path}: the input is already fully ingested")
        with self._write() as conn:
            before = conn.execute("SELECT max(seq) FROM items").fetchone()[0] or 0
            conn.executemany(_SQL_INGEST, batch.params)
            # New rows get increasing seqs; the rest of the batch were duplicates.
            # Sample 0 of each new input carries its input (the other samples read it at seq - sample).
            new = conn.execute("SELECT seq, id FROM items WHERE seq > ? AND sample = 0", (before,)).fetchall()
            conn.executemany("INSERT INTO inputs(item, input) VALUES (?, ?)",
                             [(seq, batch.inputs[item_id]) for seq, item_id in new if item_id in batch.inputs])
            state["rows"] += batch.rows
            state["duplicates"] += batch.rows - len(new)
            state["skipped"] += batch.skipped
            state["own_ids"] = state.get("own_ids", 0) + batch.own_ids
            state["complete"] = batch.last
            conn.execute("INSERT OR REPLACE INTO meta(key, value) VALUES ('ingest', ?)", (_dumps(state),))
        # A skipped row's id names its file and line, so it is new unless that line was ingested
        # before, which resuming by position rules out.
        return self._ingest_report(state, rows_read=batch.rows, resumed_from=resumed_from,
                                   new=len(new), new_skipped=batch.skipped)

    def _ingest_report(self, state: Mapping[str, Any], rows_read: int, resumed_from: int, new: int = 0,
                       new_skipped: int = 0) -> IngestReport:
        return IngestReport(rows_read=rows_read, resumed_from=resumed_from, total_rows=state["rows"],
                            unique=state["rows"] - state["duplicates"], duplicates=state["duplicates"],
                            skipped=state["skipped"], complete=state["complete"], new_items=new,
                            new_skipped=new_skipped, own_ids=state.get("own_ids", 0))

    # ---------------------------------------------------------------- work

    def claim(self, n: int) -> list[ItemRow]:
        """Mark up to ``n`` pending items running, oldest input first, and return them.

        Attempts are not charged here (see :meth:`charge_attempt`).
        """
        return self.item_rows(self.claim_raw(n))

    def claim_raw(self, n: int) -> list[tuple[Any, ...]]:
        """:meth:`claim` without building the records: ``(id, attempts, source, line, input JSON)``
        tuples for :meth:`item_rows`. Lets the async writer decode inputs off the ledger thread."""
        if n <= 0:
            return []
        with self._write() as conn:
            rows = conn.execute(
                "SELECT i.seq, i.id, i.attempts, i.source, i.source_line, n.input, i.sample FROM items AS i"
                " JOIN inputs AS n ON n.item = i.seq - i.sample WHERE i.status = 'pending' ORDER BY i.seq"
                " LIMIT ?",
                (n,),
            ).fetchall()
            if rows:
                # The rows read are exactly the pending ones up to the last seq read.
                conn.execute("UPDATE items SET status = 'running', updated_at = ?"
                             " WHERE status = 'pending' AND seq <= ?", (time.time(), rows[-1][0]))
        self._seqs.update(((r[1], r[6]), r[0]) for r in rows)
        return [r[1:] for r in rows]

    @staticmethod
    def item_rows(raw: Iterable[tuple[Any, ...]]) -> list[ItemRow]:
        """Build :class:`ItemRow` records from :meth:`claim_raw` tuples (any thread)."""
        return [ItemRow(id=r[0], attempts=r[1], item=Item.from_json(r[0], r[2], r[3], r[4]),
                        sample=r[5] if len(r) > 5 else 0) for r in raw]

    def complete(self, results: Iterable[Completion]) -> int:
        """Commit results, each with its item's new status, in one transaction. Returns how many
        were newly committed; a result for an item that already has one is ignored (exactly once)."""
        return self.apply([("complete", r) for r in results]).committed

    def fail(self, item_id: str, error: str, error_class: str, sample: int = 0) -> bool:
        """Mark a pending/running item failed with its error. False when the item was not in flight."""
        return self.apply([("fail", Failure(item_id, error, error_class, sample))]).failed == 1

    def skip(self, item_id: str, reason: str, error_class: str) -> bool:
        """Mark a pending/running item skipped without sending it (e.g. its prompt cannot fit the
        model's context), ``reason`` saying why. False when the item was not in flight."""
        return self.apply([("skip", Failure(item_id, reason, error_class))]).skipped == 1

    def charge_attempt(self, ids: Iterable[str | Key]) -> int:
        """Count one attempt against each item (an attempt that failed for the item's own reason)."""
        return self.apply([("charge", i) for i in ids]).charged

    def release(self, ids: Iterable[str | Key]) -> int:
        """Put running items back to pending without charging an attempt (a sick-server pause)."""
        return self.apply([("release", i) for i in ids]).released

    def apply(self, ops: Sequence[tuple[str, Any]]) -> ApplyReport:
        """Apply a batch of operations in order, in one transaction.

        Each op is ``("complete", Completion)``, ``("fail", Failure)``, ``("skip", Failure)``,
        ``("charge", key)`` or ``("release", key)`` (a key: ``(id, sample)`` or a bare id for sample
        0). Runs of the same kind go through one ``executemany``. This is the async writer's entry
        point; the single-operation methods above use it too.

        Completions that carry logprobs: their records are appended to the run's current shard and
        fdatasync-ed before the transaction; the transaction inserts the rows that reference them
        and moves the shard's committed length (ledger/logprobs.py explains the order).
        """
        counts = {"committed": 0, "ignored": 0, "failed": 0, "released": 0, "charged": 0, "skipped": 0}
        if not ops:
            return ApplyReport()
        settings_hash = self.settings_hash
        settled: list[Key] = []  # keys whose claim ends with this batch
        with_lp = [op[1] for op in ops if op[0] == "complete" and op[1].logprobs is not None]
        lp_refs: dict[int, tuple[int, int, int]] = {}  # id(completion) -> (shard, offset, bytes)
        if with_lp:
            first_free = self.conn.execute("SELECT COALESCE(MAX(shard), -1) + 1 FROM lp_shards").fetchone()[0]
            refs = self.shards.append([c.logprobs for c in with_lp], first_free)
            lp_refs = {id(c): (shard, offset, len(c.logprobs)) for c, (shard, offset) in zip(with_lp, refs)}
        with self._write() as conn:
            now = time.time()
            for kind, group in itertools.groupby(ops, key=lambda op: op[0]):
                payloads = [op[1] for op in group]
                if kind == "complete":
                    known = [(c, seq) for c in payloads
                             if (seq := self._seq(conn, (c.item_id, c.sample))) is not None]
                    new = _changed(conn, _SQL_RESULT, [
                        (c.status.value, _dumps(c.output), settings_hash, c.finish_reason,
                         c.prompt_tokens, c.completion_tokens, now, *lp_refs.get(id(c), (None, None, None)), seq)
                        for c, seq in known])
                    conn.executemany(_SQL_DONE, [(c.status.value, now, seq) for c, seq in known])
                    counts["committed"] += new
                    counts["ignored"] += len(payloads) - new
                    settled.extend((c.item_id, c.sample) for c in payloads)
                elif kind == "fail":
                    counts["failed"] += _changed(conn, _SQL_FAIL, [
                        (f.error, f.error_class, now, seq) for f in payloads
                        if (seq := self._seq(conn, (f.item_id, f.sample))) is not None])
                    settled.extend((f.item_id, f.sample) for f in payloads)
                elif kind == "skip":
                    counts["skipped"] += _changed(conn, _SQL_SKIP, [
                        (f.error, f.error_class, now, seq) for f in payloads
                        if (seq := self._seq(conn, (f.item_id, f.sample))) is not None])
                    settled.extend((f.item_id, f.sample) for f in payloads)
                elif kind == "release":
                    counts["released"] += _changed(conn, _SQL_RELEASE, [
                        (now, seq) for i in payloads if (seq := self._seq(conn, i)) is not None])
                    settled.extend(as_key(i) for i in payloads)
                elif kind == "charge":
                    counts["charged"] += _changed(conn, _SQL_CHARGE, [
                        (seq,) for i in payloads if (seq := self._seq(conn, i)) is not None])
                else:
                    raise LedgerError(f"unknown ledger operation {kind!r}")
            for shard in {ref[0] for ref in lp_refs.values()}:
                conn.execute("INSERT INTO lp_shards(shard, committed) VALUES (?, ?) ON CONFLICT(shard)"
                             " DO UPDATE SET committed = excluded.committed", (shard, self.shards.end))
        for key in settled:
            self._seqs.pop(key, None)
        return ApplyReport(**counts)

    def _seq(self, conn: sqlite3.Connection, key: str | Key) -> int | None:
        """The seq of a row: remembered from its claim, else looked up (None: not in the ledger)."""
        key = as_key(key)
        seq = self._seqs.get(key)
        if seq is None:
            row = conn.execute("SELECT seq FROM items WHERE id = ? AND sample = ?", key).fetchone()
            seq = row[0] if row else None
        return seq

    def requeue_failed(self) -> int:
        """Give failed items another chance: back to pending with attempts reset. Returns how many."""
        with self._write() as conn:
            return conn.execute(
                "UPDATE items SET status = 'pending', attempts = 0, updated_at = ? WHERE status = 'failed'",
                (time.time(),),
            ).rowcount

    def requeue(self, what: str, *, reason: str) -> int:
        """Put finished items back to pending for another try; returns how many.

        ``what``: ``"failed"`` (every failed item), ``"truncated"`` (truncated items; their results
        are deleted, so each gets exactly one new result) or an error class (``"http_400"``, ...:
        the failed items of that class). Attempts stay as they were. The requeue is recorded in
        meta ``requeues`` (time, what, reason, count, the settings hash of this handle), in the
        same transaction.
        """
        if what in (Status.FAILED.value, Status.TRUNCATED.value):
            where, params = "status = ?", (what,)
        elif what == Status.SKIPPED.value:
            # Items skipped after ingest (their input is stored: e.g. a prompt too long for the
            # context); rows skipped at ingest have none and are read again by reread_skipped.
            where, params = "status = 'skipped' AND seq - sample IN (SELECT item FROM inputs)", ()
        elif what in {s.value for s in Status}:
            raise LedgerError(f"cannot requeue {what!r} items (only failed, truncated, skipped or an error class)")
        else:
            where, params = "status = 'failed' AND error_class = ?", (what,)
        with self._write() as conn:
            if what == Status.TRUNCATED.value:
                conn.execute("DELETE FROM results WHERE item IN"
                             " (SELECT seq FROM items WHERE status = 'truncated')")
            count = conn.execute(f"UPDATE items SET status = 'pending', updated_at = ? WHERE {where}",
                                 (time.time(), *params)).rowcount
            row = conn.execute("SELECT value FROM meta WHERE key = 'requeues'").fetchone()
            log = json.loads(row[0]) if row else []
            log.append({"at": time.time(), "what": what, "reason": reason, "count": count,
                        "settings_hash": self.settings_hash})
            conn.execute("INSERT OR REPLACE INTO meta(key, value) VALUES ('requeues', ?)", (_dumps(log),))
        return count

    def reread_skipped(self, records: Iterable[Item | Skipped], classes: Collection[str], *,
                       reason: str, batch_size: int = 10_000) -> tuple[int, int]:
        """Read rows skipped at ingest again: ``records`` is the input read again from its start
        (under the current ``[data]`` settings, at most as many records as were ingested). A
        skipped row of one of ``classes`` whose record is now an item becomes that item (pending,
        or a duplicate of an item already there); one still skipped keeps its row with the new
        reason. Returns ``(items recovered, rows still skipped)``; recorded in meta ``requeues``."""
        wanted = dict(self.conn.execute(
            f"SELECT id, seq FROM items WHERE status = 'skipped' AND sample = 0 AND error_class IN "
            f"({', '.join('?' * len(classes))}) AND seq NOT IN (SELECT item FROM inputs)", tuple(classes)))
        if not wanted:
            return 0, 0
        recovered = still = 0
        it = iter(records)
        while wanted:
            batch = list(itertools.islice(it, batch_size))
            if not batch:
                break
            found: list[tuple[int, Item | Skipped]] = []
            for rec in batch:
                key = rec.id if isinstance(rec, Skipped) else Skipped(rec.source, rec.source_line, "").id
                seq = wanted.pop(key, None)
                if seq is not None:
                    found.append((seq, rec))
            if not found:
                continue
            items = [rec for _, rec in found if isinstance(rec, Item)]
            now = time.time()
            with self._write() as conn:
                # Every sample row of the skipped line: its id names the file and line.
                conn.executemany("UPDATE items SET last_error = ?, error_class = ?, updated_at = ? WHERE id = ?",
                                 [(rec.reason, rec.kind, now, rec.id) for seq, rec in found
                                  if isinstance(rec, Skipped)])
                conn.executemany("DELETE FROM items WHERE id = (SELECT id FROM items WHERE seq = ?)",
                                 [(seq,) for seq, rec in found if isinstance(rec, Item)])
                before = conn.execute("SELECT max(seq) FROM items").fetchone()[0] or 0
                inputs: dict[str, str] = {}
                params = []
                for rec in items:
                    text = rec.to_json()
                    inputs.setdefault(rec.id, text)
                    digest = _input_hash(text)
                    params.extend((rec.id, k, Status.PENDING.value, None, None, rec.source, rec.source_line,
                                   digest, now) for k in range(self.samples))
                conn.executemany(_SQL_INGEST, params)
                new = conn.execute("SELECT seq, id FROM items WHERE seq > ? AND sample = 0", (before,)).fetchall()
                conn.executemany("INSERT INTO inputs(item, input) VALUES (?, ?)",
                                 [(q, inputs[i]) for q, i in new if i in inputs])
                state = self._read_meta(conn)["ingest"]
                state["skipped"] -= len(items)
                state["duplicates"] += len(items) - len(new)
                conn.execute("INSERT OR REPLACE INTO meta(key, value) VALUES ('ingest', ?)", (_dumps(state),))
            recovered += len(items)
            still += len(found) - len(items)
        with self._write() as conn:
            row = conn.execute("SELECT value FROM meta WHERE key = 'requeues'").fetchone()
            log = json.loads(row[0]) if row else []
            log.append({"at": time.time(), "what": "skipped", "reason": reason, "count": recovered,
                        "settings_hash": self.settings_hash})
            conn.execute("INSERT OR REPLACE INTO meta(key, value) VALUES ('requeues', ?)", (_dumps(log),))
        return recovered, still

    # ---------------------------------------------------------------- reading

    def skip_reasons(self, limit: int = 20) -> list[SkipReason]:
        """Skipped items grouped by error class and reason, most frequent first, each with the file
        and line of its first row (reads the skipped rows only, through the status index)."""
        rows = self.conn.execute(
            f"SELECT COALESCE(error_class, 'input'), {REASON_KEY_SQL}, COUNT(*), MIN(seq) FROM items"
            " WHERE status = 'skipped'" + self._sample0 + " GROUP BY 1, 2 ORDER BY 3 DESC, 4 LIMIT ?", (limit,)).fetchall()
        out = []
        for error_class, reason, count, seq in rows:
            where = self.conn.execute("SELECT source, source_line FROM items WHERE seq = ?", (seq,)).fetchone()
            out.append(SkipReason(error_class, reason, count, *(where or (None, None))))
        return out

    def counts(self) -> dict[Status, int]:
        """Items per status (every status present, zeros included). Reads the tallies the triggers
        keep (a few rows, whatever the ledger's size); see :meth:`recount` for a full count."""
        if not self._tallied:
            return self.recount()[0]
        found = dict(self.conn.execute("SELECT name, n FROM tallies"))
        return {s: found.get(s.value, 0) for s in Status}

    def recount(self) -> tuple[dict[Status, int], int]:
        """Items per status and results, counted in full (scans: seconds at 10^7 items). What the
        tallies must always equal; for checks and version-1 ledgers opened read-only."""
        found = dict(self.conn.execute("SELECT status, COUNT(*) FROM items GROUP BY status"))
        results = self.conn.execute("SELECT COUNT(*) FROM results").fetchone()[0]
        return {s: found.get(s.value, 0) for s in Status}, results

    def _result_count(self) -> int:
        if not self._tallied:
            return self.recount()[1]
        row = self.conn.execute("SELECT n FROM tallies WHERE name = 'results'").fetchone()
        return row[0] if row else 0

    def check_totals(self) -> Totals:
        """Check that every unique input item ended in a final status and results match statuses.
        Reads the tallies (constant time)."""
        counts = self.counts()
        rows = sum(counts.values())
        results = self._result_count()
        state = self.meta()["ingest"]
        unique = rows // self.samples  # unique inputs in the ledger (each has ``samples`` rows)
        problems = []
        if not state["complete"]:
            problems.append("the input was not fully ingested")
        expected = state["rows"] - state["duplicates"]
        if rows != expected * self.samples:
            if self.samples > 1:
                problems.append(f"{rows} item rows in the ledger, the input had {expected} unique rows"
                                f" x {self.samples} samples")
            else:
                problems.append(f"{rows} items in the ledger, the input had {expected} unique rows")
        unfinished = counts[Status.PENDING] + counts[Status.RUNNING]
        if unfinished:
            problems.append(
                f"{counts[Status.PENDING]} pending and {counts[Status.RUNNING]} running items left")
        with_result = sum(counts[s] for s in RESULT_STATUSES)
        if results != with_result:
            problems.append(f"{results} results for {with_result} done/truncated items")
        assert sum(counts[s] for s in FINAL_STATUSES) + unfinished == rows
        return Totals(input_rows=state["rows"], unique=unique, duplicates=state["duplicates"], counts=counts,
                      results=results, ingest_complete=state["complete"], problems=tuple(problems),
                      id_conflicts=self.id_conflicts(), samples=self.samples)

    def iter_results(self, statuses: Iterable[Status | str] = RESULT_STATUSES,
                     fetch: int = 1000) -> Iterator[ResultRow]:
        """Stream items of the given statuses in input order, with their results when they have one.

        Reads the items table in order (no sort) so memory stays flat for any ledger size.
        """
        wanted = [Status(s).value for s in statuses]
        if not wanted:
            return
        marks = ", ".join("?" * len(wanted))
        # "+i.status" keeps SQLite from using the status index, which would need a sort by seq.
        yield from self._select(f"WHERE +i.status IN ({marks}) ORDER BY i.seq", wanted, fetch)

    def get(self, item_id: str, sample: int = 0) -> ResultRow | None:
        """One item row with its result, or None when the id (and sample) is not in the ledger."""
        if self._version < 3:
            return next(self._select("WHERE i.id = ?", (item_id,)), None) if sample == 0 else None
        return next(self._select("WHERE i.id = ? AND i.sample = ?", (item_id, sample)), None)

    @property
    def _sample0(self) -> str:
        """A WHERE clause part keeping one row per input (none needed before schema 3)."""
        return " AND sample = 0" if self._version >= 3 else ""

    def logprobs(self, row: ResultRow) -> list[TurnLogprobs] | None:
        """The token log-probabilities of a result row, one entry per assistant turn (None: none)."""
        if row.logprobs_at is None:
            return None
        return self.shards.read(*row.logprobs_at)

    def logprob_usage(self) -> tuple[int, int]:
        """``(shards, bytes)`` of logprob storage that committed results cover (a tiny table)."""
        if self._version < 3:
            return 0, 0
        shards, size = self.conn.execute("SELECT COUNT(*), COALESCE(SUM(committed), 0) FROM lp_shards").fetchone()
        return int(shards), int(size)

    def errors(self, limit: int = 10) -> tuple[dict[str, int], list[ResultRow]]:
        """Failed items per error class, and the ``limit`` most recent failures."""
        by_class = dict(self.conn.execute(
            "SELECT COALESCE(error_class, '?'), COUNT(*) FROM items WHERE status = 'failed' GROUP BY 1"))
        recent = list(self._select(
            "WHERE i.status = 'failed' ORDER BY i.updated_at DESC LIMIT ?", (limit,)))
        return by_class, recent

    def _select(self, where: str, params: Sequence[Any], fetch: int = 1000) -> Iterator[ResultRow]:
        cur = self.conn.execute((_SQL_SELECT if self._version >= 3 else _SQL_SELECT_V2) + where, params)
        try:
            while True:
                rows = cur.fetchmany(fetch)
                if not rows:
                    return
                for r in rows:
                    yield ResultRow(
                        item_id=r[0], status=Status(r[1]), attempts=r[2], source=r[3], source_line=r[4],
                        item=Item.from_json(r[0], r[3], r[4], r[5]) if r[5] is not None else None,
                        dup_count=r[6], last_error=r[7], error_class=r[8],
                        output=json.loads(r[9]) if r[9] is not None else None, settings_hash=r[10],
                        finish_reason=r[11], prompt_tokens=r[12], completion_tokens=r[13],
                        created_at=r[14], sample=r[15],
                        logprobs_at=(r[16], r[17], r[18]) if r[16] is not None else None)
        finally:
            cur.close()

    def id_conflicts(self) -> int:
        """Duplicate rows whose content differed from the first row with their id (a tally: constant
        time; a version-1 ledger opened read-only counts in full)."""
        if not self._tallied:
            return int(self.conn.execute("SELECT total(dup_conflicts) FROM items").fetchone()[0])
        row = self.conn.execute("SELECT n FROM tallies WHERE name = 'id_conflicts'").fetchone()
        return row[0] if row else 0

    def conflicting_ids(self, limit: int = 5) -> list[str]:
        """Up to ``limit`` ids seen again with different content, in input order (a scan: for the
        end of an ingest and for reports, not a hot path)."""
        return [r[0] for r in self.conn.execute(
            "SELECT id FROM items WHERE dup_conflicts > 0" + self._sample0 + " ORDER BY seq LIMIT ?", (limit,))]

    def duplicates(self, limit: int = 20) -> list[tuple[str, int, int]]:
        """Up to ``limit`` ids seen more than once: ``(id, extra occurrences, with different input)``.
        Scans the items table (a report at the end of ingest, not a hot path)."""
        return list(self.conn.execute(
            "SELECT id, dup_count, dup_conflicts FROM items WHERE dup_count > 0" + self._sample0 + " ORDER BY seq LIMIT ?",
            (limit,)))


__all__ = ["IngestBatch", "Ledger", "RESERVED_META", "prepare_ingest"]
