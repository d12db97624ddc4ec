"""Ledger at scale: N synthetic items through ingest, claim and complete with an instant fake backend.

    python bench/ledger_scale.py                 # 10^6 items in a temporary folder
    python bench/ledger_scale.py --items 100000 --dir ./ledger-bench

Prints: ingest rate, committed results/s through the async ``LedgerWriter`` (many tasks claiming and
completing at once, as the runner does), the time to reopen the full ledger, recover the rows a
"crash" left running and claim the first batch, the end-of-run totals check, and peak RSS.
No server, no GPU.
"""

from __future__ import annotations

import argparse
import asyncio
import resource
import shutil
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

from harvest.dataset import Item, Message, content_hash
from harvest.ledger import Completion, Ledger, LedgerWriter, Status


def rss_mib() -> float:
    """Peak resident set size of this process so far, MiB (Linux reports KiB)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def synthetic(n: int) -> Iterator[Item]:
    for i in range(n):
        messages = (Message("user", f"Write a short answer to question number {i}."),)
        yield Item(content_hash(messages), "synthetic.jsonl", i + 1, messages)


async def drive(ledger: Ledger, workers: int, claim_size: int, limit: int) -> tuple[int, float]:
    """Workers claim batches and complete every item at once (reading its prompt, as a backend
    would) until ``limit`` items were claimed or none is left; returns (committed, seconds)."""
    t0 = time.perf_counter()
    claimed = 0
    async with LedgerWriter(ledger, batch_size=4096, max_delay=0.05) as writer:

        async def worker() -> None:
            nonlocal claimed
            while claimed < limit:
                take = min(claim_size, limit - claimed)
                claimed += take  # reserved before the await, so workers together stop at the limit
                rows = await writer.claim(take)
                if not rows:
                    return
                for row in rows:
                    prompt = row.item.user_turns()[-1]
                    writer.complete(Completion(row.id, {"turns": [prompt[-8:]]}, Status.DONE, "stop",
                                               len(prompt) // 4, 4))

        await asyncio.gather(*(worker() for _ in range(workers)))
    return writer.committed, time.perf_counter() - t0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--items", type=int, default=1_000_000)
    ap.add_argument("--dir", type=Path, default=None, help="run folder (default: a temporary one)")
    ap.add_argument("--workers", type=int, default=8)
    ap.add_argument("--claim", type=int, default=1024)
    args = ap.parse_args()
    base = args.dir or Path(tempfile.mkdtemp(prefix="harvest-ledger-bench-"))
    run = base / "run"
    if run.exists():
        shutil.rmtree(run)
    try:
        print(f"items {args.items:,}  (RSS at start {rss_mib():.0f} MiB)")
        t0 = time.perf_counter()
        with Ledger.open(run, settings_hash="bench") as ledger:
            report = ledger.ingest(synthetic(args.items))
        t_ingest = time.perf_counter() - t0
        rate = report.unique / t_ingest
        print(f"ingest      {report.unique:,} items in {t_ingest:.1f} s = {rate:,.0f} items/s"
              f"  (peak RSS {rss_mib():.0f} MiB)")

        in_flight = min(10_000, args.items // 10)
        with Ledger.open(run, settings_hash="bench") as ledger:
            committed, secs = asyncio.run(drive(ledger, args.workers, args.claim, args.items - in_flight))
            # Leave work in flight, as a crash would: these rows stay "running" in the file.
            left_running = len(ledger.claim(in_flight))
        rate = committed / secs
        print(f"complete    {committed:,} results in {secs:.1f} s = {rate:,.0f} committed results/s"
              f" (claim + complete, {args.workers} tasks)  (peak RSS {rss_mib():.0f} MiB)")

        t0 = time.perf_counter()
        with Ledger.open(run, settings_hash="bench") as ledger:
            rows = ledger.claim(256)
            t_reopen = time.perf_counter() - t0
            recovered = ledger.recovered
            ledger.release([r.id for r in rows])
            t1 = time.perf_counter()
            counts = ledger.counts()
            t_counts = time.perf_counter() - t1
            print(f"reopen      {t_reopen * 1000:.0f} ms to open the {args.items:,}-item ledger, recover"
                  f" {recovered:,} of {left_running:,} running rows and claim {len(rows)};"
                  f" counts() {t_counts * 1000:.0f} ms ({counts[Status.PENDING]:,} pending)")
            asyncio.run(drive(ledger, args.workers, args.claim, args.items))
            totals = ledger.check_totals()
        print(f"totals      {'OK' if totals.ok else 'WRONG'}: {totals.describe()}")
        size = sum(p.stat().st_size for p in run.iterdir()) / 2**20
        print(f"ledger size {size:.0f} MiB;  peak RSS {rss_mib():.0f} MiB")
    finally:
        if args.dir is None:
            shutil.rmtree(base, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
