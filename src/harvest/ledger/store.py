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

Where each part lives: this module opens and closes the file (``Ledger``); ``handle.py`` holds the
connection, the write transaction and the meta; ``migrate.py`` checks a resume and migrates older
schemas; ``ingest.py`` the input; ``claims.py`` claims and their settling (``apply``) and requeues;
``results.py`` results, counts and totals; ``shards.py`` the ``lp_shards`` table beside the logprob
files of ``logprobs.py``.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import sqlite3
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from harvest import safefiles
from harvest.errors import LedgerError
from harvest.ledger.claims import Claims
from harvest.ledger.handle import RESERVED_META
from harvest.ledger.ingest import Ingest, IngestBatch, prepare_ingest
from harvest.ledger.migrate import prepare, readable_version, status_counts
from harvest.ledger.records import PRODUCED_STATUSES
from harvest.ledger.results import Results
from harvest.ledger.schema import LEDGER_FILE, LOCK_FILE, connect
from harvest.ledger.shards import committed_lengths


def _check_sqlite_files(conn: sqlite3.Connection, folder: safefiles.Folder, path: Path) -> None:
    """Refuse a ledger whose ``-wal`` or ``-shm`` SQLite opened anywhere but in the held folder.

    SQLite opens them by the folder's name, resolved from the descriptor's path at connect: a
    rename of the run folder in the instant between the two would have them opened in whatever
    folder then has that name. Measured before any row is written: a first read opens both, and
    each must be a file this process has open (SQLite's descriptors) that is also the one the held
    folder has under that name."""
    conn.execute("SELECT count(*) FROM sqlite_master").fetchone()  # opens the -wal and the -shm
    ours: set[tuple[int, int]] = set()
    for entry in os.listdir("/proc/self/fd"):
        with contextlib.suppress(OSError, ValueError):
            st = os.fstat(int(entry))
            ours.add((st.st_dev, st.st_ino))
    for suffix in ("-wal", "-shm"):
        held = folder.lstat(LEDGER_FILE + suffix)
        if held is None or (held.st_dev, held.st_ino) not in ours:
            raise LedgerError(f"{path}{suffix}: SQLite did not open the one in the run folder held (the folder was "
                              f"renamed while the ledger opened); nothing was written; run again")


class Ledger(Ingest, Claims, Results):
    """A run's ledger file. Create or resume with :meth:`open`; inspect with :meth:`open_readonly`.

    Its verbs come from its parts: :class:`~harvest.ledger.ingest.Ingest` (the input),
    :class:`~harvest.ledger.claims.Claims` (claims, results, failures, requeues) and
    :class:`~harvest.ledger.results.Results` (reading and counts)."""

    #: What the ledger this one replaced held (:meth:`open`'s ``other_job``): items per status name,
    #: every result count 0. None when nothing was replaced.
    replaced: dict[str, int] | None = None

    @classmethod
    def open(cls, run_dir: str | Path, *, settings_hash: str, meta: Mapping[str, Any] | None = None,
             allow_mixed: bool = False, samples: int = 1, other_job: str | None = None) -> Ledger:
        """Create the ledger of a new run in ``run_dir``, or resume the one there.

        ``meta`` (JSON-able values: job spec, engine version, ...) is stored; on resume its keys are
        updated. Resuming with another ``settings_hash`` raises :class:`LedgerError` naming both
        hashes, unless ``allow_mixed`` (then the new hash is recorded and results carry their own).
        Rows left ``running`` by a crash go back to ``pending``; see :attr:`recovered`. A second
        process opening the same run folder for writing gets :class:`LedgerError` at once.
        ``samples`` (``[sampling] n``) is fixed when the run is created: resuming with another
        number raises :class:`LedgerError` (the rows of each input exist already). Logprob shard
        bytes no committed result references (a crash mid-commit) are cut off here.

        ``other_job``: why the folder's run is another job's (the caller found its settings or its
        dataset differ). Checked under the lock: a ledger that holds no result (no item done,
        truncated or failed: nothing an engine produced) is replaced by a new one for this job,
        and :attr:`replaced` says what it held; one that holds results is :class:`LedgerError`
        with ``other_job`` as its message.
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
            replaced = cls._replace_resultless(folder, path, other_job) if other_job is not None else None
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
                _check_sqlite_files(conn, folder, path)
                recovered = prepare(conn, path, settings_hash, meta, allow_mixed, samples)
                committed = committed_lengths(conn)
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
        ledger.replaced = replaced
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
        version, stored = readable_version(conn, path)
        return cls(conn, path, settings_hash=None, readonly=True, lock_fd=None, created=False, recovered=0,
                   tallied=version != 1, version=version, samples=int(stored.get("samples", 1)))

    @staticmethod
    def _replace_resultless(folder: safefiles.Folder, path: Path, other_job: str) -> dict[str, int] | None:
        """Under the run folder's lock: the items per status of a ledger that holds no result,
        removed (the file and its -wal and -shm) so that a new one is created in its place;
        LedgerError(``other_job``) when it holds results; None when there is no ledger."""
        if not folder.exists(LEDGER_FILE):
            return None
        try:
            conn = connect(Path(folder.via(LEDGER_FILE)))
        except sqlite3.Error as exc:
            raise LedgerError(f"{path}: cannot read the ledger: {exc}") from exc
        try:
            version, _ = readable_version(conn, path)  # closes conn when it raises
            held = status_counts(conn, tallied=version != 1)
        except sqlite3.Error as exc:
            raise LedgerError(f"{path}: cannot read the ledger: {exc}") from exc
        finally:
            conn.close()  # the last connection: SQLite checkpoints and removes its -wal
        if any(held.get(s.value, 0) for s in PRODUCED_STATUSES) or held.get("results", 0):
            raise LedgerError(other_job)
        for name in (f"{LEDGER_FILE}-wal", f"{LEDGER_FILE}-shm", LEDGER_FILE):
            folder.unlink(name)
        return {name: n for name, n in held.items() if name not in ("results", "id_conflicts")}

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


__all__ = ["IngestBatch", "Ledger", "RESERVED_META", "prepare_ingest"]
