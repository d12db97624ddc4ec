"""Rows skipped at ingest are read again under new [data] settings (Ledger.reread_skipped): a row
that now fits becomes a pending item (or a duplicate of one already there), one that still does
not keeps its row with the new reason, and the totals identity holds all along. A skipped row keeps
its own id where it had one (``raw_id``), also in a schema 3 ledger resumed by this harvest."""

from __future__ import annotations

import itertools
import json
import sqlite3

from harvest.config import DataConfig
from harvest.dataset import iter_items
from harvest.ledger import SCHEMA_VERSION, Ledger, Status, prepare_ingest


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
        own = {r.source_line: (r.raw_id, r.join_id) for r in led.iter_results(statuses=[Status.SKIPPED])}
        assert own == {2: ("b", "b"), 3: ("a", "a"), 4: ("c", "c"), 5: (None, "skip:in.jsonl:5"), 6: ("d", "d")}

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
        assert [r.join_id for r in led.iter_results(statuses=[Status.SKIPPED])] == ["c", "skip:in.jsonl:5"]
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


def test_a_schema_3_ledger_is_read_and_resumed_its_skipped_rows_keeping_their_ledger_ids(tmp_path):
    """A ledger written before skipped rows kept their own ids (schema 3: no ``items.raw_id``) is read
    read-only as it is, and on a resume gains the column: the rows it skipped keep ``skip:<file>:<line>``,
    those skipped after the resume keep their own id, and the ingest goes on where it stopped."""
    rows = [{"id": "a", "prompt": "one"}, {"id": "b", "question": "two"}, {"id": "c", "prompt": "three"},
            {"id": "d", "question": "four"}]
    path = tmp_path / "in.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    run = tmp_path / "run"
    with Ledger.open(run, settings_hash="h") as led:
        batch = itertools.islice(iter_items(DataConfig(path=str(path))), 2)
        led.commit_ingest(prepare_ingest(batch, 2))
    conn = sqlite3.connect(run / "ledger.sqlite", isolation_level=None)
    conn.executescript("BEGIN; ALTER TABLE items DROP COLUMN raw_id;"
                       " UPDATE meta SET value = '3' WHERE key = 'schema_version'; COMMIT;")
    conn.close()
    with Ledger.open_readonly(run) as ro:
        assert [(r.raw_id, r.join_id) for r in ro.iter_results(statuses=[Status.SKIPPED])] == \
            [(None, "skip:in.jsonl:2")]
    with Ledger.open(run, settings_hash="h") as led:
        assert led.meta()["schema_version"] == SCHEMA_VERSION
        report = led.ingest(iter_items(DataConfig(path=str(path))))
        assert report.resumed_from == 2 and report.complete and report.total_rows == 4
        skipped = [(r.source_line, r.join_id) for r in led.iter_results(statuses=[Status.SKIPPED])]
        assert skipped == [(2, "skip:in.jsonl:2"), (4, "d")]
        assert {r.item_id for r in led.iter_results(statuses=[Status.PENDING])} == {"a", "c"}
