"""The run's input in the ledger: records read from the dataset become item rows (``samples`` rows
per input, at consecutive seqs), deduplicated by the id's unique index, one transaction per batch
with the ingest position, so an interrupted ingest resumes where it stopped. Rows skipped at ingest
can be read again under new ``[data]`` settings (:meth:`Ingest.reread_skipped`).

Batches are built off the ledger's thread (:func:`prepare_ingest`); only the commit touches SQLite.
"""

from __future__ import annotations

import dataclasses
import hashlib
import itertools
import time
from collections.abc import Collection, Iterable, Iterator, Mapping
from typing import Any

from harvest.dataset.records import Item, Skipped
from harvest.dataset.skips import reason_key
from harvest.errors import LedgerError
from harvest.ledger.handle import LedgerHandle, dumps, read_meta
from harvest.ledger.records import IngestReport, Status

SQL_INGEST = (
    "INSERT INTO items(id, sample, status, last_error, error_class, source, source_line, input_hash, updated_at,"
    " raw_id) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)"
    " ON CONFLICT(id, sample) DO UPDATE SET dup_count = dup_count + 1,"
    " dup_conflicts = dup_conflicts + (items.input_hash IS NOT excluded.input_hash)"
)


def input_hash(text: str) -> int:
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
    params: list[tuple[Any, ...]] = []
    inputs: dict[str, str] = {}  # first occurrence in this batch wins, as in the table
    skipped = own_ids = 0
    reasons: dict[tuple[str, str], int] = {}
    for rec in batch:
        if isinstance(rec, Skipped):
            skipped += 1
            key = (rec.kind, reason_key(rec.reason))
            reasons[key] = reasons.get(key, 0) + 1
            params.extend((rec.id, k, Status.SKIPPED.value, rec.reason, rec.kind, rec.source, rec.line, None, now,
                           rec.raw_id) for k in range(samples))
        else:
            text = rec.to_json()
            own_ids += rec.id == rec.raw_id
            inputs.setdefault(rec.id, text)
            digest = input_hash(text)
            params.extend((rec.id, k, Status.PENDING.value, None, None, rec.source, rec.source_line, digest, now,
                           None) for k in range(samples))
    return IngestBatch(params, inputs, len(batch), skipped, len(batch) < batch_size, own_ids, reasons)


class Ingest(LedgerHandle):
    """The input half of :class:`harvest.ledger.store.Ledger`."""

    def ingest(self, records: Iterable[Item | Skipped], batch_size: int = 10_000) -> IngestReport:
        """Insert the run's input, streaming, one transaction per ``batch_size`` records.

        An id seen before only increments that row's ``dup_count`` (and ``dup_conflicts`` when the
        input differs): it is generated once. Skipped rows become ``skipped`` items with id
        ``skip:<file>:<line>``, the reason as ``last_error`` and the row's own id, where it had one, as
        ``raw_id``. Resumable: the number of records
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
            conn.executemany(SQL_INGEST, batch.params)
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
            conn.execute("INSERT OR REPLACE INTO meta(key, value) VALUES ('ingest', ?)", (dumps(state),))
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
            self._recover(found, items)
            recovered += len(items)
            still += len(found) - len(items)
        with self._write() as conn:
            self._log_requeue(conn, "skipped", reason, recovered)
        return recovered, still

    def _recover(self, found: list[tuple[int, Item | Skipped]], items: list[Item]) -> None:
        """One transaction of :meth:`reread_skipped`: the ``found`` rows still skipped get their new
        reason; those now ``items`` are deleted and ingested again as pending (or duplicates)."""
        now = time.time()
        with self._write() as conn:
            # Every sample row of the skipped line: its id names the file and line.
            conn.executemany("UPDATE items SET last_error = ?, error_class = ?, raw_id = ?, updated_at = ? WHERE id = ?",
                             [(rec.reason, rec.kind, rec.raw_id, now, rec.id) for seq, rec in found
                              if isinstance(rec, Skipped)])
            conn.executemany("DELETE FROM items WHERE id = (SELECT id FROM items WHERE seq = ?)",
                             [(seq,) for seq, rec in found if isinstance(rec, Item)])
            before = conn.execute("SELECT max(seq) FROM items").fetchone()[0] or 0
            inputs: dict[str, str] = {}
            params: list[tuple[Any, ...]] = []
            for rec in items:
                text = rec.to_json()
                inputs.setdefault(rec.id, text)
                digest = input_hash(text)
                params.extend((rec.id, k, Status.PENDING.value, None, None, rec.source, rec.source_line,
                               digest, now, None) for k in range(self.samples))
            conn.executemany(SQL_INGEST, params)
            new = conn.execute("SELECT seq, id FROM items WHERE seq > ? AND sample = 0", (before,)).fetchall()
            conn.executemany("INSERT INTO inputs(item, input) VALUES (?, ?)",
                             [(q, inputs[i]) for q, i in new if i in inputs])
            state = read_meta(conn)["ingest"]
            state["skipped"] -= len(items)
            state["duplicates"] += len(items) - len(new)
            conn.execute("INSERT OR REPLACE INTO meta(key, value) VALUES ('ingest', ?)", (dumps(state),))


__all__ = ["Ingest", "IngestBatch", "SQL_INGEST", "input_hash", "prepare_ingest"]
