"""The synchronous ledger on a real SQLite file: ingest, claim, exactly-once results, recovery,
settings-hash refusal, totals, export streaming."""

from __future__ import annotations

import os
import sqlite3
import stat

import pytest
from tests.ledger.ledger_testdata import make_item, synthetic

from harvest import __version__
from harvest.dataset import Skipped
from harvest.errors import LedgerError
from harvest.ledger import LEDGER_FILE, Completion, Ledger, Status, hash_settings


def test_new_ledger_files_modes_and_meta(run_dir):
    meta = {"job": {"model": "m"}, "engine_version": "0.9"}
    with Ledger.open(run_dir, settings_hash="h1", meta=meta) as led:
        assert led.created and led.recovered == 0
        meta = led.meta()
    assert stat.S_IMODE(os.stat(run_dir).st_mode) == 0o700
    assert stat.S_IMODE(os.stat(run_dir / LEDGER_FILE).st_mode) == 0o600
    assert meta["settings_hash"] == "h1" and meta["settings_hashes"] == ["h1"]
    assert meta["harvest_version"] == __version__
    assert meta["job"] == {"model": "m"} and meta["engine_version"] == "0.9"
    journal = sqlite3.connect(run_dir / LEDGER_FILE).execute("PRAGMA journal_mode").fetchone()[0]
    assert journal == "wal"


def test_reserved_meta_keys_are_refused(run_dir):
    with pytest.raises(LedgerError, match="reserved"):
        Ledger.open(run_dir, settings_hash="h", meta={"settings_hash": "x"})


def test_ingest_counts_duplicates_and_records_skipped_rows(run_dir):
    with Ledger.open(run_dir, settings_hash="h") as led:
        report = led.ingest(synthetic(100, dup_every=10, skip_every=7), batch_size=16)
        counts = led.counts()
        dups = led.duplicates()
        skipped = list(led.iter_results([Status.SKIPPED]))
    # 100 rows: 14 bad (every 7th), 9 more repeat row 1's prompt (10, 20, ..., 90 minus 70).
    assert report.total_rows == 100 and report.skipped == 14
    assert report.duplicates == 9 and report.unique == 91 and report.complete
    assert counts[Status.PENDING] == 77 and counts[Status.SKIPPED] == 14
    assert dups[0][1:] == (9, 0)  # one id seen 9 extra times, same input each time
    assert skipped[0].item_id == "skip:data.jsonl:7" and skipped[0].last_error == "bad JSON: test"
    assert skipped[0].item is None and skipped[0].source_line == 7


def test_same_user_id_with_different_input_is_a_conflict(run_dir):
    rows = [make_item("a", 1, item_id="u1"), make_item("b", 2, item_id="u1")]
    with Ledger.open(run_dir, settings_hash="h") as led:
        led.ingest(rows)
        assert led.duplicates() == [("u1", 1, 1)]
        (row,) = led.claim(5)
    assert row.item.user_turns() == ("a",)  # the first occurrence is the one generated


def test_interrupted_ingest_resumes_without_double_counting(run_dir):
    def failing():
        for n, rec in enumerate(synthetic(50, dup_every=5)):
            if n == 25:
                raise RuntimeError("reader died")
            yield rec

    with Ledger.open(run_dir, settings_hash="h") as led:
        with pytest.raises(RuntimeError):
            led.ingest(failing(), batch_size=10)
        assert led.meta()["ingest"]["rows"] == 20  # two whole batches were committed
    with Ledger.open(run_dir, settings_hash="h") as led:
        report = led.ingest(synthetic(50, dup_every=5), batch_size=10)
        assert report.resumed_from == 20 and report.rows_read == 30
        assert report.total_rows == 50 and report.duplicates == 10 and report.unique == 40
        assert sum(led.counts().values()) == 40
        assert led.ingest(synthetic(50, dup_every=5)).rows_read == 0  # complete: nothing re-read


def test_claim_marks_running_in_input_order_without_charging(run_dir):
    with Ledger.open(run_dir, settings_hash="h") as led:
        led.ingest(synthetic(10))
        rows = led.claim(4)
        assert [r.item.source_line for r in rows] == [1, 2, 3, 4]
        assert all(r.attempts == 0 for r in rows)
        assert led.counts()[Status.RUNNING] == 4
        assert led.charge_attempt([rows[0].id, rows[0].id]) == 2
        assert [r.item.source_line for r in led.claim(100)] == [5, 6, 7, 8, 9, 10]
        assert led.claim(1) == []
        assert led.get(rows[0].id).attempts == 2  # type: ignore[union-attr]


def test_complete_is_exactly_once(run_dir):
    with Ledger.open(run_dir, settings_hash="h") as led:
        led.ingest(synthetic(3))
        a, b, c = led.claim(3)
        assert led.complete([Completion(a.id, {"text": "first"}, finish_reason="stop", prompt_tokens=3,
                                        completion_tokens=5)]) == 1
        assert led.complete([Completion(a.id, {"text": "second"})]) == 0
        # Twice in one batch, too: the first wins, status and result agree.
        assert led.complete([Completion(b.id, {"text": "b1"}, Status.TRUNCATED, "length"),
                             Completion(b.id, {"text": "b2"}, Status.DONE, "stop")]) == 1
        rows = {r.item_id: r for r in led.iter_results()}
        n_results = led.conn.execute("SELECT COUNT(*) FROM results").fetchone()[0]
    assert n_results == 2
    assert rows[a.id].output == {"text": "first"} and rows[a.id].status is Status.DONE
    assert rows[a.id].prompt_tokens == 3 and rows[a.id].completion_tokens == 5
    assert rows[a.id].settings_hash == "h"
    assert rows[b.id].output == {"text": "b1"} and rows[b.id].status is Status.TRUNCATED
    assert c.id not in rows


def test_complete_ignores_unknown_and_skipped_ids(run_dir):
    with Ledger.open(run_dir, settings_hash="h") as led:
        led.ingest([Skipped("data.jsonl", 1, "bad")])
        report = led.apply([("complete", Completion("skip:data.jsonl:1", "x")),
                            ("complete", Completion("no-such-id", "x"))])
        assert report.committed == 0 and report.ignored == 2
        assert led.counts()[Status.SKIPPED] == 1
        assert led.conn.execute("SELECT COUNT(*) FROM results").fetchone()[0] == 0


def test_fail_release_and_requeue(run_dir):
    with Ledger.open(run_dir, settings_hash="h") as led:
        led.ingest(synthetic(4))
        a, b, c, d = led.claim(4)
        assert led.fail(a.id, "HTTP 400: prompt too long", "http_400")
        assert not led.fail(a.id, "again", "http_400")  # no longer in flight
        assert led.release([b.id, c.id]) == 2
        assert led.release([b.id]) == 0  # already pending
        counts = led.counts()
        assert (counts[Status.FAILED], counts[Status.PENDING], counts[Status.RUNNING]) == (1, 2, 1)
        by_class, recent = led.errors()
        assert by_class == {"http_400": 1} and recent[0].last_error == "HTTP 400: prompt too long"
        assert {r.id for r in led.claim(10)} == {b.id, c.id}
        assert led.requeue_failed() == 1
        assert [r.id for r in led.claim(10)] == [a.id]
        # A result arriving for an item that had failed is accepted, and clears the error.
        assert led.fail(a.id, "x", "http_400")
        assert led.complete([Completion(a.id, "late success")]) == 1
        assert led.get(a.id).last_error is None  # type: ignore[union-attr]


def test_running_rows_go_back_to_pending_on_reopen(run_dir):
    with Ledger.open(run_dir, settings_hash="h") as led:
        led.ingest(synthetic(10))
        led.claim(6)
        led.complete([Completion(led.claim(1)[0].id, "ok")])
    with Ledger.open(run_dir, settings_hash="h") as led:
        assert not led.created and led.recovered == 6
        counts = led.counts()
        assert counts[Status.RUNNING] == 0 and counts[Status.PENDING] == 9 and counts[Status.DONE] == 1


def test_settings_hash_change_is_refused_naming_both(run_dir):
    with Ledger.open(run_dir, settings_hash="aaaa1111") as led:
        led.ingest(synthetic(2))
        led.complete([Completion(led.claim(1)[0].id, "old")])
    with pytest.raises(LedgerError) as err:
        Ledger.open(run_dir, settings_hash="bbbb2222")
    assert "aaaa1111" in str(err.value) and "bbbb2222" in str(err.value)
    with Ledger.open(run_dir, settings_hash="bbbb2222", allow_mixed=True) as led:
        led.complete([Completion(led.claim(1)[0].id, "new")])
        hashes = sorted(r.settings_hash for r in led.iter_results())  # type: ignore[type-var]
        assert led.meta()["settings_hashes"] == ["aaaa1111", "bbbb2222"]
    assert hashes == ["aaaa1111", "bbbb2222"]
    with Ledger.open(run_dir, settings_hash="bbbb2222") as led:  # the new hash is now the run's
        assert led.settings_hash == "bbbb2222"


def test_hash_settings_is_canonical():
    assert hash_settings({"a": 1, "b": [1, 2]}) == hash_settings({"b": [1, 2], "a": 1})
    assert hash_settings({"a": 1}) != hash_settings({"a": 2})


def test_second_writer_is_refused_and_readers_see_commits(run_dir):
    with Ledger.open(run_dir, settings_hash="h") as led:
        led.ingest(synthetic(5))
        with pytest.raises(LedgerError, match="in use by another harvest process"):
            Ledger.open(run_dir, settings_hash="h")
        rows = led.claim(2)
        reader = Ledger.open_readonly(run_dir)
        try:
            assert reader.counts()[Status.RUNNING] == 2
            led.complete([Completion(rows[0].id, "x")])
            assert reader.counts()[Status.DONE] == 1
            with pytest.raises(LedgerError, match="read-only"):
                reader.claim(1)
        finally:
            reader.close()
    with Ledger.open(run_dir, settings_hash="h") as led:  # the lock went with the first handle
        assert led.recovered == 1


def test_open_readonly_needs_a_ledger(tmp_path):
    with pytest.raises(LedgerError, match="no ledger"):
        Ledger.open_readonly(tmp_path)


def test_check_totals(run_dir):
    with Ledger.open(run_dir, settings_hash="h") as led:
        led.ingest(synthetic(20, dup_every=6, skip_every=9))
        totals = led.check_totals()
        assert not totals.ok and "pending" in totals.describe()
        rows = led.claim(100)
        led.fail(rows[0].id, "bad", "http_400")
        led.complete([Completion(r.id, "ok") for r in rows[1:]])
        totals = led.check_totals()
    assert totals.ok, totals.describe()
    c = totals.counts
    assert c[Status.DONE] + c[Status.TRUNCATED] + c[Status.FAILED] + c[Status.SKIPPED] == totals.unique
    assert totals.input_rows == 20 and totals.unique == 20 - totals.duplicates
    assert totals.results == c[Status.DONE]


def test_iter_results_streams_in_input_order_with_inputs(run_dir):
    with Ledger.open(run_dir, settings_hash="h") as led:
        led.ingest(synthetic(30))
        rows = led.claim(30)
        led.complete([Completion(r.id, {"reply": r.item.user_turns()[0].upper()}) for r in reversed(rows)])
        out = list(led.iter_results(fetch=7))
        assert list(led.iter_results([])) == []
    assert [r.source_line for r in out] == list(range(1, 31))
    assert all(r.output == {"reply": r.item.user_turns()[0].upper()} for r in out)  # type: ignore[union-attr]


def test_ingest_from_a_real_dataset_file(tmp_path, run_dir):
    from harvest.config import DataConfig
    from harvest.dataset import iter_items

    data = tmp_path / "d.jsonl"
    data.write_text('{"prompt": "a"}\n{"prompt": "b"}\n{"prompt": "a"}\nnot json\n{"messages": []}\n')
    with Ledger.open(run_dir, settings_hash="h") as led:
        report = led.ingest(iter_items(DataConfig(path=str(data))))
        skipped = {r.item_id: r.last_error for r in led.iter_results([Status.SKIPPED])}
    assert (report.total_rows, report.unique, report.duplicates, report.skipped) == (5, 4, 1, 2)
    assert set(skipped) == {"skip:d.jsonl:4", "skip:d.jsonl:5"}
    assert "empty conversation" in skipped["skip:d.jsonl:5"]


def test_skip_marks_a_claimed_item_skipped_with_its_reason_never_twice(run_dir):
    with Ledger.open(run_dir, settings_hash=hash_settings({})) as ledger:
        ledger.ingest([make_item("short", 1, item_id="a"), make_item("huge", 2, item_id="b")])
        assert {r.id for r in ledger.claim(2)} == {"a", "b"}
        assert ledger.skip("b", "prompt of 9000 tokens + max_tokens 16 does not fit", "context_length")
        assert not ledger.skip("b", "again", "context_length")  # already final
        assert ledger.complete([Completion("a", {"messages": []})]) == 1
        assert not ledger.skip("a", "too late", "context_length")  # a result is never undone
        row = ledger.get("b")
        assert (row.status, row.error_class, row.attempts) == (Status.SKIPPED, "context_length", 0)
        assert row.last_error.startswith("prompt of 9000 tokens")
        assert ledger.get("a").status is Status.DONE
        assert ledger.check_totals().ok


def test_a_wal_sqlite_opened_outside_the_held_folder_is_refused_before_any_write(tmp_path):
    """SQLite opens ``-wal`` and ``-shm`` by the folder's name: when that name led elsewhere at the
    instant they were opened (a rename of the run folder while the ledger opened), the open is
    refused, naming the file, before a row is written; the files in the held folder pass."""
    from pathlib import Path

    from harvest import safefiles
    from harvest.ledger.schema import connect
    from harvest.ledger.store import _check_sqlite_files

    held_dir, elsewhere = tmp_path / "held", tmp_path / "elsewhere"
    for d in (held_dir, elsewhere):
        d.mkdir(mode=0o700)
        sqlite3.connect(d / LEDGER_FILE).execute("PRAGMA journal_mode=WAL").fetchone()
    with safefiles.hold(held_dir) as held:
        conn = connect(elsewhere / LEDGER_FILE)  # as if the name had led there
        try:
            with pytest.raises(LedgerError, match=r"held/ledger\.sqlite-wal: SQLite did not open the one in the run"):
                _check_sqlite_files(conn, held, held_dir / LEDGER_FILE)
        finally:
            conn.close()
        conn = connect(Path(held.via(LEDGER_FILE)))
        try:
            _check_sqlite_files(conn, held, held_dir / LEDGER_FILE)  # its own: passes
        finally:
            conn.close()


def test_a_reader_never_creates_a_ledger_where_its_name_leads(tmp_path):
    """A read-only open of a name that leads to no ledger (a run folder swapped for a link to
    another folder between a reader's check and its open) fails and leaves that folder as it was:
    no empty database, no -wal or -shm."""
    from harvest.ledger.schema import connect

    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    with pytest.raises(LedgerError, match="cannot open the ledger"):
        connect(elsewhere / "ledger.sqlite", readonly=True)
    assert list(elsewhere.iterdir()) == []
