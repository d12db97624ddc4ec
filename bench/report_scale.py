"""The report's two costs: recording the timeline while running, and building the page of a big run.

    python bench/report_scale.py                       # overhead rounds of 2x10^5 items, then a 10^6 report
    python bench/report_scale.py --overhead-items 100000 --rounds 2 --report-items 0

1. Recording overhead on P3's committed results/s (same run, alternating rounds, fresh ledgers of
   the same size): ledger_scale.py's drive (many tasks claiming and completing through the async
   LedgerWriter, instant fake backend) with the runner's Progress fed per result and updated every
   ``--interval`` seconds (progress.json written), without and with the timeline recorder.
2. ``harvest report`` of a 10^6-item run: the ledger driven to the end with recording on (1 % of
   items failed), its timeline then filled as a 14-hour run of four endpoints at 5 s intervals
   would fill it (the bounded worst case), then ``write_report`` timed; page size and peak RSS.
No server, no GPU.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import TextIO

from benchutil import exit_on_sigterm, load
from ledger_scale import rss_mib, synthetic
from rich.console import Console

from harvest.campaign.outputs.progress import Progress
from harvest.campaign.outputs.timeline import Timeline
from harvest.cli.panel import RunPanel
from harvest.ledger import Completion, Failure, Ledger, LedgerWriter, Status


def lines_to(stream: TextIO) -> RunPanel:
    """The run's display off a terminal (its periodic lines), printed to ``stream``, as a log gets it."""
    return RunPanel(Console(file=stream), live=False)


async def drive(ledger: Ledger, progress: Progress, interval: float, workers: int = 8, claim: int = 1024) -> float:
    """Every pending item claimed and completed (1 in 100 failed); results/s."""
    t0 = time.perf_counter()
    stop = asyncio.Event()

    async def updates() -> None:
        while not stop.is_set():
            await asyncio.sleep(interval)
            progress.update()

    ticker = asyncio.create_task(updates())
    async with LedgerWriter(ledger, batch_size=4096, max_delay=0.05) as writer:

        async def worker() -> None:
            while True:
                rows = await writer.claim(claim)
                if not rows:
                    return
                for row in rows:
                    t = time.monotonic()
                    prompt = row.item.user_turns()[-1]
                    if row.item.source_line % 100 == 0:
                        writer.fail(Failure(row.id, f"HTTP 400: prompt {row.id[:8]} is too long", "http_400"))
                        progress.error("http_400")
                        progress.record(Status.FAILED.value, latency_s=time.monotonic() - t)
                        continue
                    writer.complete(Completion(row.id, {"turns": [prompt[-8:]]}, Status.DONE, "stop",
                                               len(prompt) // 4, 4))
                    progress.record(Status.DONE.value, len(prompt) // 4, 4, time.monotonic() - t)

        await asyncio.gather(*(worker() for _ in range(workers)))
    committed = writer.committed
    stop.set()
    await ticker
    return committed / (time.perf_counter() - t0)


def one_round(base: Path, items: int, record: bool, interval: float) -> tuple[float, float]:
    """(committed results/s, CPU microseconds of this process per committed result)."""
    run = base / ("rec" if record else "plain")
    shutil.rmtree(run, ignore_errors=True)
    with Ledger.open(run, settings_hash="bench") as ledger:
        ledger.ingest(synthetic(items))
    with Ledger.open(run, settings_hash="bench") as ledger, open(os.devnull, "w") as null:
        progress = Progress(run, total=items, already_final=0, watch=lines_to(null))
        if record:
            progress.timeline = Timeline.open(run)
        cpu0 = time.process_time()
        rate = asyncio.run(drive(ledger, progress, interval))
        cpu = (time.process_time() - cpu0) / items * 1e6
        if progress.timeline is not None:
            progress.timeline.close("finished")
    shutil.rmtree(run, ignore_errors=True)
    return rate, cpu


def record_cost(base: Path, n: int = 300_000) -> tuple[float, float]:
    """CPU microseconds per ``Progress.record`` (what the runner calls per result), without and with
    the timeline (its buffer binned included), alternating three times; medians."""
    out: dict[bool, list[float]] = {False: [], True: []}
    with open(os.devnull, "w") as null:
        for _ in range(3):
            for with_timeline in (False, True):
                progress = Progress(base, total=n, already_final=0, watch=lines_to(null))
                if with_timeline:
                    progress.timeline = Timeline.open(base)
                t0 = time.process_time()
                for i in range(n):
                    progress.record("done", 20 + (i & 63), 4 + (i & 255), 0.01 * (i & 1023))
                if progress.timeline is not None:
                    progress.timeline.close("finished")
                out[with_timeline].append((time.process_time() - t0) / n * 1e6)
    return tuple(sorted(v)[1] for v in (out[False], out[True]))  # type: ignore[return-value]


def fill_timeline(run: Path, points: int) -> None:
    """A long run's timeline: ``points`` progress updates of four endpoints, with a relaunch."""
    clock = [time.time()]
    tl = Timeline.open(run, clock=lambda: clock[0])
    tl.write_every_s = 1e9
    urls = [f"http://10.0.0.{i}:30000" for i in range(4)]
    for i in range(points):
        clock[0] += 5.0
        tl.observe_metrics({u: {"sglang:num_running_reqs": 60 + (i + j) % 9, "sglang:num_queue_reqs": (i * j) % 20,
                                "sglang:token_usage": 0.5 + ((i + j) % 40) / 100} for j, u in enumerate(urls)})
        tl.interval({"errors_by_class": {"http_400": i // 100}, "items_per_s": 20.0 + i % 7,
                     "gen_tokens_per_s": 1300.0 + (i % 50) * 3, "prompt_tokens_per_s": 700.0, "in_flight": 256,
                     "total": 10**6, "final_before_session": 0, "done_this_session": i * 100})
    tl.close("finished")


def main() -> int:
    exit_on_sigterm()
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--overhead-items", type=int, default=200_000)
    ap.add_argument("--rounds", type=int, default=3, help="rounds of each variant (alternating)")
    ap.add_argument("--interval", type=float, default=0.5, help="progress interval, s (the runner's default: 5)")
    ap.add_argument("--report-items", type=int, default=1_000_000, help="0: no report benchmark")
    ap.add_argument("--timeline-points", type=int, default=10_000)
    ap.add_argument("--dir", type=Path, default=None)
    args = ap.parse_args()
    base = args.dir or Path(tempfile.mkdtemp(prefix="harvest-report-bench-"))
    try:
        print(f"start: {load()}")
        without, with_tl = record_cost(base)
        print(f"Progress.record per result: {without:.3f} CPU us, with the timeline {with_tl:.3f} CPU us "
              f"(+{with_tl - without:.3f} us)")
        plain: list[float] = []
        rec: list[float] = []
        cpu: dict[bool, list[float]] = {False: [], True: []}
        for r in range(args.rounds):
            order = (False, True) if r % 2 == 0 else (True, False)
            for record in order:
                rate, us = one_round(base, args.overhead_items, record, args.interval)
                (rec if record else plain).append(rate)
                cpu[record].append(us)
                print(f"round {r + 1} {'timeline' if record else 'plain   '}: {rate:,.0f} committed results/s,"
                      f" {us:.1f} CPU us per result")
        if plain and rec:
            mp, mr = sorted(plain)[len(plain) // 2], sorted(rec)[len(rec) // 2]
            print(f"median plain {mp:,.0f}/s, with the timeline {mr:,.0f}/s: ratio {mr / mp:.3f} "
                  f"(overhead {100 * (1 - mr / mp):+.1f} %)  {load()}")
            cp, cr = (sorted(cpu[k])[len(cpu[k]) // 2] for k in (False, True))
            print(f"median CPU per result: plain {cp:.1f} us, with the timeline {cr:.1f} us: "
                  f"{100 * (cr / cp - 1):+.1f} %")
        if args.report_items:
            run = base / "big"
            shutil.rmtree(run, ignore_errors=True)
            t0 = time.perf_counter()
            with Ledger.open(run, settings_hash="bench") as ledger:
                ledger.ingest(synthetic(args.report_items))
            with Ledger.open(run, settings_hash="bench") as ledger, open(os.devnull, "w") as null:
                progress = Progress(run, total=args.report_items, already_final=0, watch=lines_to(null))
                progress.timeline = Timeline.open(run)
                asyncio.run(drive(ledger, progress, args.interval))
                progress.timeline.close("finished")
            fill_timeline(run, args.timeline_points)
            print(f"built a {args.report_items:,}-item run in {time.perf_counter() - t0:.0f} s;"
                  f" timeline.json {(run / 'timeline.json').stat().st_size / 1024:.0f} KiB")
            from harvest.report import write_report

            rss0 = rss_mib()
            t0 = time.perf_counter()
            out = write_report(run)
            secs = time.perf_counter() - t0
            print(f"report of {args.report_items:,} items: {secs:.2f} s, {out.stat().st_size / 1024:.0f} KiB,"
                  f" peak RSS {rss_mib():.0f} MiB (before: {rss0:.0f})  {load()}")
        bench = {"record_us": [round(without, 3), round(with_tl, 3)]}
        if plain and rec:
            bench["results_per_s"] = [round(mp), round(mr)]
        if args.report_items:
            bench["report"] = {"items": args.report_items, "s": round(secs, 2),
                               "kib": round(out.stat().st_size / 1024)}
        print("BENCH report_scale " + json.dumps(bench))
    finally:
        if args.dir is None:
            shutil.rmtree(base, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
