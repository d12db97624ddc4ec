"""3 x 10^4 items through ingest, claim and complete (async writer, real file: eight batches of the
writer's 4,096), then resume checks. Larger ledgers (10^6, 10^7): bench/ledger_scale.py."""

from __future__ import annotations

import asyncio

import pytest

from harvest.ledger import Completion, Ledger, LedgerWriter, Status
from tests.ledger.ledger_testdata import synthetic

N = 30_000


@pytest.mark.slow
def test_round_trip_of_30k_items(run_dir):
    with Ledger.open(run_dir, settings_hash="h") as ledger:
        report = ledger.ingest(synthetic(N, dup_every=1000, skip_every=997))
        assert report.total_rows == N and report.complete

        async def drive() -> int:
            async with LedgerWriter(ledger, batch_size=4096) as writer:

                async def worker() -> None:
                    while rows := await writer.claim(1000):
                        for row in rows:
                            writer.complete(Completion(row.id, {"n": row.item.source_line}))

                await asyncio.gather(*(worker() for _ in range(8)))
            return writer.committed

        committed = asyncio.run(drive())
        totals = ledger.check_totals()
    assert totals.ok, totals.describe()
    assert committed == totals.unique - totals.counts[Status.SKIPPED]
    assert totals.counts[Status.SKIPPED] == N // 997
    assert totals.duplicates == report.duplicates > 0

    # (How fast a large ledger reopens is measured by bench/ledger_scale.py, not asserted here.)
    with Ledger.open(run_dir, settings_hash="h") as ledger:
        assert ledger.claim(10) == []  # nothing left: every item finished exactly once
        seen = sum(1 for _ in ledger.iter_results())
    assert seen == committed
