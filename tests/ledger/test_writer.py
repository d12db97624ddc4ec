"""The async single writer: many tasks, one thread, batched commits visible to other connections."""

from __future__ import annotations

import asyncio
import time

import pytest

from harvest.errors import LedgerError
from harvest.ledger import Completion, Failure, Ledger, LedgerWriter, Status
from tests.ledger.ledger_testdata import synthetic


def done_count(run_dir) -> int:
    """Done items as another process (``harvest status``) would see them."""
    reader = Ledger.open_readonly(run_dir)
    try:
        return reader.counts()[Status.DONE]
    finally:
        reader.close()


async def wait_for_done(run_dir, n: int, timeout: float) -> float:
    """Poll a separate read-only connection until ``n`` items are done; returns the seconds it took."""
    t0 = time.monotonic()
    while done_count(run_dir) < n:
        if time.monotonic() - t0 > timeout:
            pytest.fail(f"{n} results were not committed within {timeout} s")
        await asyncio.sleep(0.01)
    return time.monotonic() - t0


async def test_many_tasks_complete_everything(run_dir):
    with Ledger.open(run_dir, settings_hash="h") as ledger:
        ledger.ingest(synthetic(3000))
        async with LedgerWriter(ledger, batch_size=256, max_delay=0.01) as writer:

            async def worker(k: int) -> None:
                while rows := await writer.claim(37):
                    for row in rows:
                        await asyncio.sleep(0)  # interleave with the other tasks
                        if row.item.source_line % 100 == 0:
                            writer.charge_attempt(row.id)
                            writer.fail(Failure(row.id, "HTTP 400: nope", "http_400"))
                        else:
                            writer.complete(Completion(row.id, {"by": k}))

            await asyncio.gather(*(worker(k) for k in range(16)))
        assert writer.committed == 2970 and writer.failed == 30 and writer.ignored == 0
        totals = ledger.check_totals()
        assert totals.ok, totals.describe()
        assert totals.counts[Status.FAILED] == 30
        failed = next(iter(ledger.iter_results([Status.FAILED])))
        assert failed.attempts == 1 and failed.error_class == "http_400"


async def test_full_batch_commits_without_waiting_for_the_delay(run_dir):
    with Ledger.open(run_dir, settings_hash="h") as ledger:
        ledger.ingest(synthetic(20))
        async with LedgerWriter(ledger, batch_size=10, max_delay=30.0) as writer:
            rows = await writer.claim(20)
            for row in rows[:10]:
                writer.complete(Completion(row.id, "x"))
            took = await wait_for_done(run_dir, 10, timeout=10)
            assert took < 5  # far below max_delay: the full batch went at once
            writer.complete(Completion(rows[10].id, "y"))
            await asyncio.sleep(0.3)
            assert done_count(run_dir) == 10  # a lone op waits for its batch or the delay...
            await writer.flush()
            assert done_count(run_dir) == 11  # ...or an explicit flush


async def test_lone_op_commits_after_max_delay(run_dir):
    with Ledger.open(run_dir, settings_hash="h") as ledger:
        ledger.ingest(synthetic(3))
        async with LedgerWriter(ledger, batch_size=10_000, max_delay=0.05) as writer:
            (row,) = await writer.claim(1)
            writer.complete(Completion(row.id, "x"))
            await wait_for_done(run_dir, 1, timeout=10)


async def test_claim_sees_releases_submitted_before_it(run_dir):
    with Ledger.open(run_dir, settings_hash="h") as ledger:
        ledger.ingest(synthetic(5))
        async with LedgerWriter(ledger) as writer:
            rows = await writer.claim(5)
            assert await writer.claim(5) == []
            assert await writer.release([r.id for r in rows[:2]]) == 2
            again = await writer.claim(5)
            assert [r.id for r in again] == [r.id for r in rows[:2]]
            assert all(r.attempts == 0 for r in again)  # a release charges nothing
            writer.complete(Completion(rows[0].id, "a"))
            writer.complete(Completion(rows[0].id, "b"))
            counts = await writer.counts()
        assert counts[Status.DONE] == 1
        assert writer.committed == 1 and writer.ignored == 1


async def test_a_failed_commit_stops_the_writer_loudly(run_dir):
    with Ledger.open(run_dir, settings_hash="h") as ledger:
        ledger.ingest(synthetic(3))
        writer = await LedgerWriter(ledger, max_delay=0.01).start()
        a, b, _ = await writer.claim(3)
        writer.complete(Completion(a.id, {"not json": object()}))  # cannot be encoded
        with pytest.raises(LedgerError, match="failed"):
            await writer.flush()
        with pytest.raises(LedgerError):
            writer.complete(Completion(b.id, "fine"))
        with pytest.raises(LedgerError):
            await writer.close()
        assert ledger.counts()[Status.DONE] == 0  # the batch rolled back as a whole


async def test_close_is_idempotent_and_refuses_late_work(run_dir):
    with Ledger.open(run_dir, settings_hash="h") as ledger:
        ledger.ingest(synthetic(2))
        writer = LedgerWriter(ledger)
        await writer.start()
        (row,) = await writer.claim(1)
        writer.complete(Completion(row.id, "x"))
        await writer.close()
        await writer.close()
        assert ledger.counts()[Status.DONE] == 1  # close committed what was waiting
        with pytest.raises(LedgerError, match="not running"):
            writer.complete(Completion(row.id, "late"))


def test_writer_needs_a_writable_ledger(run_dir):
    Ledger.open(run_dir, settings_hash="h").close()
    reader = Ledger.open_readonly(run_dir)
    try:
        with pytest.raises(LedgerError, match="opened for writing"):
            LedgerWriter(reader)
    finally:
        reader.close()
