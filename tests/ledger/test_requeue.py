"""``Ledger.requeue``: failed, truncated or one error class back to pending, recorded with its reason;
the invariant (a result iff done/truncated) and exactly-once results hold across the retry."""

from __future__ import annotations

import pytest
from tests.ledger.ledger_testdata import synthetic

from harvest.errors import LedgerError
from harvest.ledger import Completion, Ledger, Status


def _settled(led: Ledger) -> list[str]:
    """Six items: 2 done, 1 truncated, 2 failed http_400, 1 failed empty."""
    led.ingest(synthetic(6))
    a, b, c, d, e, g = led.claim(6)
    led.complete([Completion(a.id, "ok"), Completion(b.id, "ok"),
                  Completion(c.id, "cut", Status.TRUNCATED, "length")])
    led.fail(d.id, "HTTP 400: bad stop", "http_400")
    led.fail(e.id, "HTTP 400: bad stop", "http_400")
    led.fail(g.id, "empty answer at turn 0", "empty")
    return [x.id for x in (a, b, c, d, e, g)]


def test_requeue_one_class_then_all_failed_then_truncated(run_dir):
    with Ledger.open(run_dir, settings_hash="h") as led:
        a, b, c, d, e, g = _settled(led)
        assert led.requeue("http_400", reason="r1") == 2
        assert {r.id for r in led.claim(10)} == {d, e}
        assert led.get(g).status is Status.FAILED  # another class: untouched
        led.complete([Completion(d, "now ok"), Completion(e, "now ok")])
        assert led.requeue("failed", reason="r2") == 1
        assert [r.id for r in led.claim(10)] == [g]
        led.fail(g, "empty answer at turn 0", "empty")
        # truncated: the old result goes, so the item can get exactly one new one
        assert led.requeue("truncated", reason="r3") == 1
        assert led.get(c).output is None and led.get(c).status is Status.PENDING
        assert [r.id for r in led.claim(10)] == [c]
        assert led.complete([Completion(c, "longer")]) == 1
        assert led.complete([Completion(c, "again")]) == 0
        assert led.get(c).output == "longer"
        counts = led.counts()
        assert (counts[Status.DONE], counts[Status.TRUNCATED], counts[Status.FAILED]) == (5, 0, 1)
        assert led.conn.execute("SELECT COUNT(*) FROM results").fetchone()[0] == 5
        log = led.meta()["requeues"]
        assert [(x["what"], x["reason"], x["count"], x["settings_hash"]) for x in log] == [
            ("http_400", "r1", 2, "h"), ("failed", "r2", 1, "h"), ("truncated", "r3", 1, "h")]


def test_requeue_of_nothing_counts_zero_and_other_statuses_are_refused(run_dir):
    with Ledger.open(run_dir, settings_hash="h") as led:
        _settled(led)
        assert led.requeue("http_404", reason="none of these") == 0
        for status in ("done", "pending", "running"):
            with pytest.raises(LedgerError, match="cannot requeue"):
                led.requeue(status, reason="x")
        assert led.counts()[Status.DONE] == 2
