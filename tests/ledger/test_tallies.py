"""The tallies (items per status, results) kept by triggers always equal a full count.

A property test drives a real ledger file through random sequences of every status-changing
operation, crash recovery included, and after each step compares ``counts()`` and the totals check
with ``SELECT status, COUNT(*) ... GROUP BY status``. Version-1 ledgers (no tallies) are migrated on
open.
"""

from __future__ import annotations

import json
import sqlite3
import tempfile
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from harvest.dataset import Skipped
from harvest.errors import LedgerError
from harvest.ledger import LEDGER_FILE, SCHEMA_VERSION, Completion, Ledger, Status, prepare_ingest
from tests.ledger.ledger_testdata import make_item


def full_count(run_dir: Path) -> tuple[dict[str, int], int]:
    """Items per status and results, counted in full on a connection of the test's own."""
    conn = sqlite3.connect(run_dir / LEDGER_FILE)
    try:
        statuses = dict(conn.execute("SELECT status, COUNT(*) FROM items GROUP BY status"))
        results = conn.execute("SELECT COUNT(*) FROM results").fetchone()[0]
    finally:
        conn.close()
    return {s.value: statuses.get(s.value, 0) for s in Status}, results


def assert_exact(ledger: Ledger, run_dir: Path) -> None:
    statuses, results = full_count(run_dir)
    assert {s.value: n for s, n in ledger.counts().items()} == statuses
    totals = ledger.check_totals()
    assert totals.results == results
    assert totals.unique == sum(statuses.values())


# One operation: (name, a number the operation interprets: how many, or which item).
OPS = st.one_of(
    st.tuples(st.just("ingest"), st.integers(1, 12)),
    st.tuples(st.sampled_from(["claim", "complete", "truncate", "fail", "release", "charge", "twice"]),
              st.integers(0, 40)),
    st.tuples(st.sampled_from(["retry_failed", "retry_truncated", "crash", "crash_mid_write", "delete"]),
              st.just(0)),
)


class Driver:
    """Applies operations to a ledger in ``run_dir``, reopening it as a crashed runner would."""

    def __init__(self, run_dir: Path):
        self.run_dir = run_dir
        self.ledger = Ledger.open(run_dir, settings_hash="h")
        self.lines = 0
        self.claimed: list[str] = []

    def ids(self) -> list[str]:
        return [r[0] for r in self.ledger.conn.execute("SELECT id FROM items ORDER BY seq")]

    def pick(self, k: int) -> str | None:
        pool = self.claimed or self.ids()
        return pool[k % len(pool)] if pool else None

    def apply(self, op: str, k: int) -> None:
        led = self.ledger
        if op == "ingest":
            records = []
            for _ in range(k):
                self.lines += 1
                line = self.lines
                if line % 7 == 0:
                    records.append(Skipped("data.jsonl", line, "bad JSON: test"))
                elif line % 5 == 0:  # a duplicate of an earlier prompt
                    records.append(make_item(f"prompt {line // 2}", line))
                else:
                    records.append(make_item(f"prompt {line}", line))
            led.commit_ingest(prepare_ingest(iter(records), batch_size=len(records)))
        elif op == "claim":
            self.claimed.extend(r.id for r in led.claim(k % 9))
        elif op in ("complete", "truncate", "twice"):
            item_id = self.pick(k)
            if item_id is not None:
                status = Status.TRUNCATED if op == "truncate" else Status.DONE
                done = Completion(item_id, {"k": k}, status, "length" if op == "truncate" else "stop")
                led.complete([done, done] if op == "twice" else [done])
        elif op == "fail":
            item_id = self.pick(k)
            if item_id is not None:
                led.fail(item_id, "HTTP 400: test", "http_400")
        elif op == "release":
            led.release(self.claimed[: k % 5])
            del self.claimed[: k % 5]
        elif op == "charge":
            item_id = self.pick(k)
            if item_id is not None:
                led.charge_attempt([item_id])
        elif op == "retry_failed":
            led.requeue_failed()
        elif op == "retry_truncated":
            # What any other retry statement does (a method this module does not know of): the
            # tallies follow because the triggers fire inside the statements themselves.
            with led._write() as conn:
                conn.execute("DELETE FROM results WHERE item IN"
                             " (SELECT seq FROM items WHERE status = 'truncated')")
                conn.execute("UPDATE items SET status = 'pending' WHERE status = 'truncated'")
        elif op == "delete":
            with led._write() as conn:
                first = "(SELECT min(seq) FROM items WHERE status = 'pending')"
                conn.execute(f"DELETE FROM inputs WHERE item = {first}")
                conn.execute(f"DELETE FROM items WHERE seq = {first}")
        elif op == "crash":
            led.close()  # running rows stay running in the file, as after a SIGKILL
            self.ledger = Ledger.open(self.run_dir, settings_hash="h")
            self.claimed = []
        elif op == "crash_mid_write":
            # A process dies inside a write transaction: nothing of it (tallies included) survives.
            led.conn.execute("BEGIN IMMEDIATE")
            led.conn.execute("UPDATE items SET status = 'done' WHERE status = 'pending'")
            led.conn.execute("DELETE FROM results")
            led.close()
            self.ledger = Ledger.open(self.run_dir, settings_hash="h")
            self.claimed = []
        else:
            raise AssertionError(op)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(OPS, min_size=1, max_size=30))
def test_tallies_equal_a_full_count_after_any_sequence(ops):
    with tempfile.TemporaryDirectory() as tmp:
        run_dir = Path(tmp) / "run"
        driver = Driver(run_dir)
        try:
            for op, k in ops:
                driver.apply(op, k)
                assert_exact(driver.ledger, run_dir)
        finally:
            driver.ledger.close()
        with Ledger.open_readonly(run_dir) as ro:
            assert_exact(ro, run_dir)


def make_v1(run_dir: Path) -> dict[str, int]:
    """A ledger as schema version 1 left it: no tallies table, no triggers, version 1 in meta."""
    with Ledger.open(run_dir, settings_hash="h") as led:
        led.commit_ingest(prepare_ingest(iter([make_item(f"p {i}", i) for i in range(1, 31)]), batch_size=30))
        rows = led.claim(12)
        led.complete([Completion(r.id, {"ok": 1}) for r in rows[:6]])
        led.fail(rows[6].id, "HTTP 400: x", "http_400")
        # rows[7:] stay running, as a crash leaves them
    conn = sqlite3.connect(run_dir / LEDGER_FILE)
    conn.executescript(
        "BEGIN; DROP TRIGGER items_tally_insert; DROP TRIGGER items_tally_update;"
        " DROP TRIGGER items_tally_delete; DROP TRIGGER results_tally_insert;"
        " DROP TRIGGER results_tally_delete; DROP TABLE tallies;"
        " UPDATE meta SET value = '1' WHERE key = 'schema_version'; COMMIT;")
    conn.close()
    return {"pending": 18, "running": 5, "done": 6, "failed": 1}


def test_a_version_1_ledger_reads_without_tallies_and_migrates_on_open(run_dir):
    expected = make_v1(run_dir)
    with Ledger.open_readonly(run_dir) as ro:  # read-only: no migration, full counts
        assert {s.value: n for s, n in ro.counts().items() if n} == expected
        assert ro.check_totals().results == 6
        assert ro.meta()["schema_version"] == 1
    with Ledger.open(run_dir, settings_hash="h") as led:
        assert led.recovered == 5
        assert led.meta()["schema_version"] == SCHEMA_VERSION
        assert_exact(led, run_dir)
        rows = led.claim(100)
        led.complete([Completion(r.id, {"ok": 2}) for r in rows])
        assert_exact(led, run_dir)
        assert led.counts()[Status.DONE] == 6 + 23
    conn = sqlite3.connect(run_dir / LEDGER_FILE)
    names = {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type = 'trigger'")}
    conn.close()
    assert {"items_tally_insert", "items_tally_update", "results_tally_insert"} <= names


def test_an_unknown_schema_version_is_refused_naming_the_file(run_dir):
    with Ledger.open(run_dir, settings_hash="h"):
        pass
    conn = sqlite3.connect(run_dir / LEDGER_FILE)
    conn.execute("UPDATE meta SET value = ? WHERE key = 'schema_version'", (json.dumps(99),))
    conn.commit()
    conn.close()
    for opener in (lambda: Ledger.open(run_dir, settings_hash="h"), lambda: Ledger.open_readonly(run_dir)):
        with pytest.raises(LedgerError, match=r"ledger\.sqlite.*schema version 99"):
            opener()
