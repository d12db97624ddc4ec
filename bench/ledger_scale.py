"""Ledger at scale: N synthetic items through ingest, claim and complete with an instant fake backend.

    python bench/ledger_scale.py                 # 10^6 items in a temporary folder
    python bench/ledger_scale.py --items 100000 --dir ./ledger-bench
    python bench/ledger_scale.py --items 1000000,10000000   # each size in its own process, in turn;
                                                            # ratios against the first (the baseline)

Prints: ingest rate, committed results/s through the async ``LedgerWriter`` (many tasks claiming and
completing at once, as the runner does), the time to reopen the full ledger, recover the rows a
"crash" left running and claim the first batch, the end-of-run totals check, and peak RSS.
No server, no GPU. Ingest and complete print their rate per tenth of the run (the trend as the
ledger grows). ``--no-tallies`` drops the tally triggers after the ledger is created (to measure what
they cost; counts() then falls back to nothing useful, so only the rates mean anything).

Distillation outputs: ``--samples K`` makes K rows per input (``[sampling] n``; --items
counts samples, so inputs = items / K), ``--logprobs k --tokens T`` completes every sample with a
synthetic logprob record of T generated tokens at top-k (written to the run's shards and fsynced
before each commit, as the runner does). Compare against a text-only run of the same size:

    python bench/ledger_scale.py --items 1000000 --samples 4
    python bench/ledger_scale.py --items 1000000 --samples 4 --logprobs 20 --tokens 16
    python bench/ledger_scale.py --items 1000000 --samples 4 --logprobs 20 --tokens 16 --compare-logprobs
        # both in one process: two ledgers, completed in alternating tenths (the same-run baseline)
"""

from __future__ import annotations

import argparse
import asyncio
import ctypes
import ctypes.util
import re
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

from harvest.dataset import Item, Message, content_hash
import numpy as np

from harvest.ledger import Completion, Ledger, LedgerWriter, Status, prepare_ingest
from harvest.ledger.logprobs import TurnLogprobs, encode

#: Rows per input, and the synthetic logprob record each result carries (None: text only).
SAMPLES = 1
RECORD: bytes | None = None


def make_record(k: int, tokens: int) -> bytes:
    rng = np.random.default_rng(0)
    turn = TurnLogprobs(rng.integers(0, 150_000, tokens).astype(np.int32),
                        (-rng.random(tokens) * 5).astype(np.float16),
                        rng.integers(0, 150_000, (tokens, k)).astype(np.int32),
                        (-rng.random((tokens, k)) * 10).astype(np.float16))
    return encode([turn], k)


def rss_mib() -> float:
    """Peak resident set size of this process so far, MiB (Linux reports KiB)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def synthetic(n: int) -> Iterator[Item]:
    for i in range(n // SAMPLES):
        messages = (Message("user", f"Write a short answer to question number {i}."),)
        yield Item(content_hash(messages), "synthetic.jsonl", i + 1, messages)


async def drive(ledger: Ledger, workers: int, claim_size: int, limit: int,
                record: bytes | None | bool = True) -> tuple[int, float]:
    """Workers claim batches and complete every item at once (reading its prompt, as a backend
    would) until ``limit`` items were claimed or none is left; returns (committed, seconds)."""
    if record is True:
        record = RECORD
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
                                               len(prompt) // 4, 4, sample=row.sample, logprobs=record))

        await asyncio.gather(*(worker() for _ in range(workers)))
    return writer.committed, time.perf_counter() - t0


class CacheStats:
    """SQLite's page-cache counters of one connection (``sqlite3_db_status`` CACHE_HIT, CACHE_MISS,
    CACHE_WRITE), read through ctypes: CPython's Connection object holds its ``sqlite3 *`` right
    after the object header. A measuring aid for this benchmark only."""

    HIT, MISS, WRITE = 7, 8, 9

    def __init__(self, conn: object):
        self._lib = ctypes.CDLL(ctypes.util.find_library("sqlite3"))
        self._db = ctypes.c_void_p.from_address(id(conn) + object.__basicsize__).value
        self._last = self.read()

    def read(self) -> tuple[int, int, int]:
        out = []
        for op in (self.HIT, self.MISS, self.WRITE):
            cur, high = ctypes.c_int(), ctypes.c_int()
            self._lib.sqlite3_db_status(ctypes.c_void_p(self._db), op, ctypes.byref(cur),
                                        ctypes.byref(high), 0)
            out.append(cur.value)
        return out[0], out[1], out[2]

    def since_last(self, items: int) -> str:
        now = self.read()
        hit, miss, write = (a - b for a, b in zip(now, self._last))
        self._last = now
        per = max(items, 1)
        return (f"  cache: {miss / per:.2f} misses, {write / per:.2f} page writes per item"
                f" ({hit / max(hit + miss, 1):.1%} hits)")


def ingest(run: Path, n: int, no_tallies: bool, cache_stats: bool = False) -> tuple[int, float]:
    """Ingest ``n`` items batch by batch, printing the rate of each tenth; (unique items, seconds)."""
    t0 = last = time.perf_counter()
    tenth = max(n // 10, 10_000)
    mark, last_rows = tenth, 0
    with Ledger.open(run, settings_hash="bench", samples=SAMPLES) as ledger:
        if no_tallies:
            for trigger in ("items_tally_insert", "items_tally_update", "items_tally_delete",
                            "results_tally_insert", "results_tally_delete"):
                ledger.conn.execute(f"DROP TRIGGER {trigger}")
        records = synthetic(n)
        stats = CacheStats(ledger.conn) if cache_stats else None
        while True:
            report = ledger.commit_ingest(prepare_ingest(records, samples=SAMPLES))
            if report.total_rows >= mark or (report.complete and report.total_rows > last_rows):
                now = time.perf_counter()
                rate = (report.total_rows - last_rows) / (now - last)
                print(f"  ingest   {report.total_rows:>11,}: {rate:9,.0f} items/s"
                      + (stats.since_last(report.total_rows - last_rows) if stats else ""), flush=True)
                last, last_rows, mark = now, report.total_rows, mark + tenth
            if report.complete:
                return report.unique, time.perf_counter() - t0


def complete_all(ledger: Ledger, workers: int, claim_size: int, limit: int) -> tuple[int, float]:
    """``drive`` in tenths of ``limit``, printing each tenth's rate; (committed, seconds)."""
    tenth = max(limit // 10, 10_000)
    committed = 0
    secs = 0.0
    while committed < limit:
        c, s = asyncio.run(drive(ledger, workers, claim_size, min(tenth, limit - committed)))
        committed, secs = committed + c, secs + s
        print(f"  complete {committed:>11,}: {c / s:9,.0f} results/s", flush=True)
        if c == 0:
            break
    return committed, secs


def one_size(args: argparse.Namespace, n: int) -> int:
    base = args.dir or Path(tempfile.mkdtemp(prefix="harvest-ledger-bench-"))
    run = base / "run"
    if run.exists():
        shutil.rmtree(run)
    try:
        print(f"items {n:,}  (RSS at start {rss_mib():.0f} MiB)", flush=True)
        unique, t_ingest = ingest(run, n, args.no_tallies, args.cache_stats)
        unique *= SAMPLES  # item rows
        rate = unique / t_ingest
        print(f"ingest      {unique:,} items in {t_ingest:.1f} s = {rate:,.0f} items/s"
              f"  (peak RSS {rss_mib():.0f} MiB)", flush=True)

        in_flight = min(10_000, n // 10)
        with Ledger.open(run, settings_hash="bench", samples=SAMPLES) as ledger:
            committed, secs = complete_all(ledger, args.workers, args.claim, n - in_flight)
            # Leave work in flight, as a crash would: these rows stay "running" in the file.
            left_running = len(ledger.claim(in_flight))
        rate = committed / secs
        print(f"complete    {committed:,} results in {secs:.1f} s = {rate:,.0f} committed results/s"
              f" (claim + complete, {args.workers} tasks)  (peak RSS {rss_mib():.0f} MiB)", flush=True)

        t0 = time.perf_counter()
        with Ledger.open(run, settings_hash="bench", samples=SAMPLES) as ledger:
            rows = ledger.claim(256)
            t_reopen = time.perf_counter() - t0
            recovered = ledger.recovered
            ledger.release([r.key for r in rows])
            t1 = time.perf_counter()
            counts = ledger.counts()
            t_counts = time.perf_counter() - t1
            t1 = time.perf_counter()
            totals = ledger.check_totals()
            t_totals = time.perf_counter() - t1
            print(f"reopen      {t_reopen * 1000:.0f} ms to open the {n:,}-item ledger, recover"
                  f" {recovered:,} of {left_running:,} running rows and claim {len(rows)};"
                  f" counts() {t_counts * 1000:.1f} ms ({counts[Status.PENDING]:,} pending);"
                  f" check_totals() {t_totals * 1000:.1f} ms", flush=True)
            asyncio.run(drive(ledger, args.workers, args.claim, n))
            totals = ledger.check_totals()
            if not args.no_tallies:
                t1 = time.perf_counter()
                full, results = ledger.recount()
                t_full = time.perf_counter() - t1
                exact = full == totals.counts and results == totals.results
                print(f"recount     {t_full * 1000:.0f} ms for a full count; tallies"
                      f" {'equal it' if exact else 'DIFFER: ' + str((full, results))}", flush=True)
        print(f"totals      {'OK' if totals.ok else 'WRONG'}: {totals.describe()}")
        size = sum(p.stat().st_size for p in run.iterdir() if p.is_file()) / 2**20
        lp = sum(p.stat().st_size for p in (run / "logprobs").iterdir()) if (run / "logprobs").is_dir() else 0
        print(f"logprobs    {lp / 2**20:,.0f} MiB in shards"
              + (f" ({lp / max(totals.results, 1):,.0f} B per result, {len(RECORD or b'')} B per record)"
                 if lp else ""))
        print(f"ledger size {size:.0f} MiB;  peak RSS {rss_mib():.0f} MiB", flush=True)
    finally:
        if args.dir is None:
            shutil.rmtree(base, ignore_errors=True)
        else:
            shutil.rmtree(run, ignore_errors=True)
    return 0


def compare(args: argparse.Namespace, n: int) -> int:
    """Two ledgers of ``n`` item rows, text-only and with logprob records, completed in alternating
    tenths (so the load of a shared machine falls on both alike); their commit rates and sizes."""
    base = args.dir or Path(tempfile.mkdtemp(prefix="harvest-ledger-bench-"))
    runs = {"text": base / "run-text", "logprobs": base / "run-logprobs"}
    try:
        for run in runs.values():
            if run.exists():
                shutil.rmtree(run)
            ingest(run, n, False)
        spent = {"text": 0.0, "logprobs": 0.0}
        done = {"text": 0, "logprobs": 0}
        tenth = max(n // 10, 10_000)
        ledgers = {k: Ledger.open(run, settings_hash="bench", samples=SAMPLES) for k, run in runs.items()}
        try:
            rnd = 0
            while min(done.values()) < n:
                order = ["text", "logprobs"] if rnd % 2 == 0 else ["logprobs", "text"]
                for kind in order:
                    c, secs = asyncio.run(drive(ledgers[kind], args.workers, args.claim, tenth,
                                                None if kind == "text" else RECORD))
                    done[kind] += c
                    spent[kind] += secs
                    print(f"  {kind:<8} {done[kind]:>11,}: {c / secs:9,.0f} results/s", flush=True)
                rnd += 1
            totals = {k: ledger.check_totals() for k, ledger in ledgers.items()}
        finally:
            for ledger in ledgers.values():
                ledger.close()
        rates = {k: done[k] / spent[k] for k in runs}
        sizes = {k: sum(p.stat().st_size for p in run.iterdir() if p.is_file()) for k, run in runs.items()}
        shards = sum(p.stat().st_size for p in (runs["logprobs"] / "logprobs").iterdir())
        for k in runs:
            print(f"{k:<9} {done[k]:,} results in {spent[k]:.1f} s = {rates[k]:,.0f} committed results/s;"
                  f" ledger {sizes[k] / 2**20:.0f} MiB; totals {'OK' if totals[k].ok else 'WRONG'}")
        print(f"logprobs  {shards / 2**20:,.0f} MiB in shards ({shards / done['logprobs']:,.0f} B per result)")
        print(f"BENCH ledger_logprobs items={n} samples={SAMPLES} k={args.logprobs} tokens={args.tokens}"
              f" text_rate={rates['text']:.0f} lp_rate={rates['logprobs']:.0f}"
              f" rate_ratio={rates['logprobs'] / rates['text']:.3f}"
              f" text_ledger_mib={sizes['text'] / 2**20:.0f} lp_ledger_mib={sizes['logprobs'] / 2**20:.0f}"
              f" size_ratio={sizes['logprobs'] / sizes['text']:.3f} shard_mib={shards / 2**20:.0f}")
    finally:
        if args.dir is None:
            shutil.rmtree(base, ignore_errors=True)
        else:
            for run in runs.values():
                shutil.rmtree(run, ignore_errors=True)
    return 0


FIGURES = {
    "ingest": r"^ingest .* = ([\d,]+) items/s",
    "complete": r"^complete .* = ([\d,]+) committed",
    "reopen_ms": r"^reopen +(\d+) ms",
    "counts_ms": r"counts\(\) ([\d.]+) ms",
    "rss_mib": r"^ledger size .* peak RSS (\d+) MiB",
}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--items", default="1000000",
                    help="items, or sizes separated by commas (each run in its own process, in turn)")
    ap.add_argument("--dir", type=Path, default=None, help="run folder (default: a temporary one)")
    ap.add_argument("--workers", type=int, default=8)
    ap.add_argument("--claim", type=int, default=1024)
    ap.add_argument("--no-tallies", action="store_true", help="drop the tally triggers (cost measurement)")
    ap.add_argument("--samples", type=int, default=1, help="rows per input ([sampling] n)")
    ap.add_argument("--logprobs", type=int, default=0, help="top-k of a synthetic logprob record per result")
    ap.add_argument("--tokens", type=int, default=16, help="generated tokens of that record")
    ap.add_argument("--compare-logprobs", action="store_true",
                    help="text-only vs --logprobs records, two ledgers completed in alternating tenths")
    ap.add_argument("--cache-stats", action="store_true",
                    help="print SQLite page-cache misses and page writes per ingested item, per tenth")
    args = ap.parse_args()
    global SAMPLES, RECORD
    SAMPLES = args.samples
    RECORD = make_record(args.logprobs, args.tokens) if args.logprobs else None
    sizes = [int(x) for x in args.items.split(",")]
    if args.compare_logprobs:
        if not args.logprobs:
            ap.error("--compare-logprobs needs --logprobs K")
        return compare(args, sizes[0])
    if len(sizes) == 1:
        return one_size(args, sizes[0])
    found: list[dict[str, float]] = []
    for n in sizes:
        argv = [sys.executable, __file__, "--items", str(n), "--workers", str(args.workers),
                "--claim", str(args.claim), "--samples", str(args.samples), "--logprobs", str(args.logprobs),
                "--tokens", str(args.tokens)] + (["--dir", str(args.dir)] if args.dir else []) + (
                ["--no-tallies"] if args.no_tallies else []) + (["--cache-stats"] if args.cache_stats else [])
        lines = []
        with subprocess.Popen(argv, stdout=subprocess.PIPE, text=True) as proc:
            assert proc.stdout is not None
            for line in proc.stdout:  # passed on as it comes: a long run shows its trend
                print(line, end="", flush=True)
                lines.append(line)
        if proc.returncode != 0:
            return proc.returncode
        out = "".join(lines)
        figures = {}
        for key, pattern in FIGURES.items():
            m = re.search(pattern, out, re.M)
            figures[key] = float(m.group(1).replace(",", "")) if m else float("nan")
        found.append(figures)
    first = found[0]
    for n, f in zip(sizes[1:], found[1:]):
        print(f"BENCH ledger_scale items={n} baseline_items={sizes[0]}"
              f" ingest_ratio={f['ingest'] / first['ingest']:.2f}"
              f" complete_ratio={f['complete'] / first['complete']:.2f}"
              f" counts_ms={f['counts_ms']:.1f} reopen_ms={f['reopen_ms']:.0f} rss_mib={f['rss_mib']:.0f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
