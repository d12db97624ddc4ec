"""Reading a ledger: results in input order, one row by id, counts per status, the totals check
(``done + truncated + failed + skipped == unique input``), errors, skip reasons, duplicates and id
conflicts, and a result's token log-probabilities.

Counts read the tallies the schema's triggers keep (constant time); ``recount`` is the full count
they always equal. Rows stream in batches (``fetch``), so memory stays flat for any ledger size.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator, Sequence
from typing import Any

from harvest.dataset.records import Item
from harvest.dataset.skips import REASON_KEY_SQL, SkipReason
from harvest.ledger.handle import LedgerHandle
from harvest.ledger.logprobs import TurnLogprobs
from harvest.ledger.records import FINAL_STATUSES, RESULT_STATUSES, ResultRow, Status, Totals
from harvest.ledger.shards import committed_usage

# An input lies at the seq of its sample 0: the samples of one input are inserted together, at
# consecutive seqs (a duplicate inserts none of them).
SQL_SELECT = (
    "SELECT i.id, i.status, i.attempts, i.source, i.source_line, n.input, i.dup_count, i.last_error,"
    " i.error_class, r.output, r.settings_hash, r.finish_reason, r.prompt_tokens, r.completion_tokens,"
    " r.created_at, i.sample, r.lp_shard, r.lp_offset, r.lp_bytes, i.raw_id FROM items AS i"
    " LEFT JOIN inputs AS n ON n.item = i.seq - i.sample LEFT JOIN results AS r ON r.item = i.seq "
)
# The same for a version 3 ledger opened read-only: no skipped row's own id.
SQL_SELECT_V3 = SQL_SELECT.replace("i.raw_id", "NULL")
# The same for a version 1/2 ledger opened read-only: every row is sample 0, no logprobs.
SQL_SELECT_V2 = (
    "SELECT i.id, i.status, i.attempts, i.source, i.source_line, n.input, i.dup_count, i.last_error,"
    " i.error_class, r.output, r.settings_hash, r.finish_reason, r.prompt_tokens, r.completion_tokens,"
    " r.created_at, 0, NULL, NULL, NULL, NULL FROM items AS i LEFT JOIN inputs AS n ON n.item = i.seq"
    " LEFT JOIN results AS r ON r.item = i.seq "
)


class Results(LedgerHandle):
    """The reading half of :class:`harvest.ledger.store.Ledger`: results, counts, totals."""

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

    def logprobs(self, row: ResultRow) -> list[TurnLogprobs] | None:
        """The token log-probabilities of a result row, one entry per assistant turn (None: none)."""
        if row.logprobs_at is None:
            return None
        return self.shards.read(*row.logprobs_at)

    def logprob_usage(self) -> tuple[int, int]:
        """``(shards, bytes)`` of logprob storage that committed results cover (a tiny table)."""
        if self._version < 3:
            return 0, 0
        return committed_usage(self.conn)

    def errors(self, limit: int = 10) -> tuple[dict[str, int], list[ResultRow]]:
        """Failed items per error class, and the ``limit`` most recent failures."""
        by_class = dict(self.conn.execute(
            "SELECT COALESCE(error_class, '?'), COUNT(*) FROM items WHERE status = 'failed' GROUP BY 1"))
        recent = list(self._select(
            "WHERE i.status = 'failed' ORDER BY i.updated_at DESC LIMIT ?", (limit,)))
        return by_class, recent

    def _select(self, where: str, params: Sequence[Any], fetch: int = 1000) -> Iterator[ResultRow]:
        sql = SQL_SELECT if self._version >= 4 else SQL_SELECT_V3 if self._version == 3 else SQL_SELECT_V2
        cur = self.conn.execute(sql + where, params)
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
                        logprobs_at=(r[16], r[17], r[18]) if r[16] is not None else None, raw_id=r[19])
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


__all__ = ["Results"]
