"""Claims and their settling: pending rows claimed (running) oldest first, and each claim ended by
a result (done/truncated, exactly once), a failure, a skip or a release back to pending, with
attempts charged only for an item's own failures; finished rows put back for another try
(requeue). Every batch of operations is one transaction (:meth:`Claims.apply`, the async writer's
entry point).

Exactly once: a result is inserted only while its item is pending/running/failed, in the same
transaction that marks it done/truncated; a second result for the same row changes nothing.
"""

from __future__ import annotations

import itertools
import sqlite3
import time
from collections.abc import Iterable, Sequence
from typing import Any

from harvest.dataset.records import Item
from harvest.errors import LedgerError
from harvest.ledger.handle import LedgerHandle, dumps
from harvest.ledger.records import ApplyReport, Completion, Failure, ItemRow, Key, Status, as_key
from harvest.ledger.shards import append_records, mark_committed

# Hot-path statements address items by ``seq`` (claimed items' seqs are remembered), so a batch
# walks the tables in input order instead of probing the id index at random. A result is inserted
# only for an item still waiting for one; SQL_DONE, run after it in the same transaction with the
# same guard, marks exactly those items (one that already had a result is done/truncated, so not
# matched). Guards are OR chains: an IN list costs an ephemeral table per execution.
SQL_RESULT = (
    "INSERT INTO results(item, status, output, settings_hash, finish_reason, prompt_tokens,"
    " completion_tokens, created_at, lp_shard, lp_offset, lp_bytes) SELECT seq, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?"
    " FROM items"
    " WHERE seq = ? AND (+status = 'pending' OR +status = 'running' OR +status = 'failed')"
    " ON CONFLICT(item) DO NOTHING"
)
SQL_DONE = (
    "UPDATE items SET status = ?, last_error = NULL, error_class = NULL, updated_at = ?"
    " WHERE seq = ? AND (+status = 'pending' OR +status = 'running' OR +status = 'failed')"
)
SQL_FAIL = (
    "UPDATE items SET status = 'failed', last_error = ?, error_class = ?, updated_at = ?"
    " WHERE seq = ? AND (+status = 'pending' OR +status = 'running')"
)
SQL_SKIP = (
    "UPDATE items SET status = 'skipped', last_error = ?, error_class = ?, updated_at = ?"
    " WHERE seq = ? AND (+status = 'pending' OR +status = 'running')"
)
SQL_RELEASE = "UPDATE items SET status = 'pending', updated_at = ? WHERE seq = ? AND +status = 'running'"
SQL_CHARGE = "UPDATE items SET attempts = attempts + 1 WHERE seq = ?"


def changed(conn: sqlite3.Connection, sql: str, params: list[tuple[Any, ...]]) -> int:
    """Run ``sql`` for each parameter row; the rows it changed. (``rowcount`` leaves out the rows the
    tally triggers change, which ``total_changes`` would count.)"""
    if not params:
        return 0
    return max(conn.executemany(sql, params).rowcount, 0)


class Claims(LedgerHandle):
    """The work half of :class:`harvest.ledger.store.Ledger`: claims, settling, requeues."""

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
        # id(completion) -> (shard, offset, bytes): appended and synced before the transaction
        lp_refs = append_records(self.conn, self.shards, with_lp) if with_lp else {}
        with self._write() as conn:
            now = time.time()
            for kind, group in itertools.groupby(ops, key=lambda op: op[0]):
                payloads = [op[1] for op in group]
                if kind == "complete":
                    known = [(c, seq) for c in payloads
                             if (seq := self._seq(conn, (c.item_id, c.sample))) is not None]
                    new = changed(conn, SQL_RESULT, [
                        (c.status.value, dumps(c.output), settings_hash, c.finish_reason,
                         c.prompt_tokens, c.completion_tokens, now, *lp_refs.get(id(c), (None, None, None)), seq)
                        for c, seq in known])
                    conn.executemany(SQL_DONE, [(c.status.value, now, seq) for c, seq in known])
                    counts["committed"] += new
                    counts["ignored"] += len(payloads) - new
                    settled.extend((c.item_id, c.sample) for c in payloads)
                elif kind == "fail":
                    counts["failed"] += changed(conn, SQL_FAIL, [
                        (f.error, f.error_class, now, seq) for f in payloads
                        if (seq := self._seq(conn, (f.item_id, f.sample))) is not None])
                    settled.extend((f.item_id, f.sample) for f in payloads)
                elif kind == "skip":
                    counts["skipped"] += changed(conn, SQL_SKIP, [
                        (f.error, f.error_class, now, seq) for f in payloads
                        if (seq := self._seq(conn, (f.item_id, f.sample))) is not None])
                    settled.extend((f.item_id, f.sample) for f in payloads)
                elif kind == "release":
                    counts["released"] += changed(conn, SQL_RELEASE, [
                        (now, seq) for i in payloads if (seq := self._seq(conn, i)) is not None])
                    settled.extend(as_key(i) for i in payloads)
                elif kind == "charge":
                    counts["charged"] += changed(conn, SQL_CHARGE, [
                        (seq,) for i in payloads if (seq := self._seq(conn, i)) is not None])
                else:
                    raise LedgerError(f"unknown ledger operation {kind!r}")
            mark_committed(conn, lp_refs, self.shards.end)
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
        params: tuple[str, ...]
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
            self._log_requeue(conn, what, reason, count)
        return count


__all__ = ["Claims"]
