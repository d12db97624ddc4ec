"""Rows skipped at ingest are read again under new [data] settings (Ledger.reread_skipped): a row
that now fits becomes a pending item (or a duplicate of one already there), one that still does
not keeps its row with the new reason, and the totals identity holds all along."""

from __future__ import annotations

import itertools
import json

from harvest.config import DataConfig
from harvest.dataset import iter_items
from harvest.ledger import Ledger, Status


def test_skipped_rows_read_again_become_items_duplicates_or_stay(tmp_path):
    rows = [{"id": "a", "prompt": "one"}, {"id": "b", "question": "two"}, {"id": "a", "question": "one"},
            {"id": "c", "text": "three"}, "not an object", {"id": "d", "question": "four"}]
    path = tmp_path / "in.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    with Ledger.open(tmp_path / "run", settings_hash="h") as led:
        led.ingest(iter_items(DataConfig(path=str(path))), batch_size=2)
        assert led.counts()[Status.SKIPPED] == 5 and led.check_totals().ok is False  # "a" pending
        by_class: dict[str, int] = {}
        for r in led.skip_reasons():
            by_class[r.error_class] = by_class.get(r.error_class, 0) + r.count
        assert by_class == {"shape": 4, "input": 1}  # the string row cannot be read as a row at all

        fixed = DataConfig(path=str(path), prompt_field="question")
        records = itertools.islice(iter_items(fixed), led.ingest_state()["rows"])
        recovered, still = led.reread_skipped(records, ("shape", "input"), reason="test", batch_size=2)
        # b and d are new items; the second "a" is a duplicate of the first; c and the string stay.
        assert (recovered, still) == (3, 2)
        counts = led.counts()
        assert counts[Status.PENDING] == 3 and counts[Status.SKIPPED] == 2
        totals = led.check_totals()
        assert totals.unique == 5 and totals.duplicates == 1 and totals.input_rows == 6
        assert sum(counts.values()) == totals.unique
        assert "pending" in " ".join(totals.problems)  # only the work left to do
        still_skipped = {r.source_line: r.last_error for r in led.iter_results(statuses=[Status.SKIPPED])}
        assert sorted(still_skipped) == [4, 5]
        assert "'question'" in still_skipped[4] and "the row has 'id', 'text'" in still_skipped[4]
        assert {r.item_id for r in led.iter_results(statuses=[Status.PENDING])} == {"a", "b", "d"}
        assert led.meta()["requeues"][-1]["what"] == "skipped" and led.meta()["requeues"][-1]["count"] == 3
        recount, results = led.recount()
        assert recount == counts and results == 0  # the tallies the triggers keep are exact


def test_skipped_rows_read_again_with_samples(tmp_path):
    """With [sampling] n = 3 every input has 3 rows: a skipped line's 3 rows become 3 pending
    samples of the item (or go, for a duplicate), and claims read the input at sample 0's seq."""
    rows = [{"id": "a", "prompt": "one"}, {"id": "b", "question": "two"}, {"id": "a", "question": "one"}]
    path = tmp_path / "in.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    with Ledger.open(tmp_path / "run", settings_hash="h", samples=3) as led:
        led.ingest(iter_items(DataConfig(path=str(path))))
        assert led.counts()[Status.SKIPPED] == 6 and led.counts()[Status.PENDING] == 3
        fixed = DataConfig(path=str(path), prompt_field="question")
        records = itertools.islice(iter_items(fixed), led.ingest_state()["rows"])
        assert led.reread_skipped(records, ("shape",), reason="test") == (2, 0)
        counts = led.counts()
        assert counts[Status.PENDING] == 6 and counts[Status.SKIPPED] == 0
        claimed = led.claim(10)
        assert sorted(r.key for r in claimed) == [(i, s) for i in ("a", "b") for s in range(3)]
        assert {r.item.messages[0].content for r in claimed if r.id == "b"} == {"two"}
        totals = led.check_totals()
        assert totals.unique == 2 and totals.duplicates == 1 and sum(counts.values()) == 6
        assert led.recount()[0] == led.counts()
