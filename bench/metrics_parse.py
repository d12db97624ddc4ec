"""/metrics parsing: ``prometheus_client``'s parser against harvest's hand-written one, on engines' real output.

    python bench/metrics_parse.py FILE_OR_URL [...] [--repeat 200]

Each argument is a saved ``/metrics`` answer (a file) or a live engine's base URL (``/metrics`` is
fetched once and can be saved with ``--save DIR``). For each, both parsers run ``--repeat`` times
on the same text, alternating; printed: microseconds per parse (median of 5 batches), and whether
the two agree on every sample summed by name (what harvest uses). Prints one ``BENCH`` line each.
"""

from __future__ import annotations

import argparse
import math
import statistics
import sys
import time
import urllib.request
from pathlib import Path

from benchutil import load  # bench/benchutil.py

from harvest.client.metrics import parse_prometheus_text, sum_by_name


def by_prometheus_client(text: str) -> dict[str, float]:
    from prometheus_client.parser import text_string_to_metric_families

    totals: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if math.isnan(sample.value):
                continue
            totals[sample.name] = totals.get(sample.name, 0.0) + sample.value
    return totals


def by_harvest(text: str) -> dict[str, float]:
    return sum_by_name(parse_prometheus_text(text))


def timed(fn, text: str, repeat: int) -> float:
    t0 = time.perf_counter()
    for _ in range(repeat):
        fn(text)
    return (time.perf_counter() - t0) / repeat * 1e6


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("sources", nargs="+", help="a saved /metrics file or an engine base URL")
    ap.add_argument("--repeat", type=int, default=200)
    ap.add_argument("--save", type=Path, help="save fetched /metrics texts in this folder")
    args = ap.parse_args(argv)
    for source in args.sources:
        if source.startswith("http"):
            with urllib.request.urlopen(source.rstrip("/") + "/metrics", timeout=30) as response:
                text = response.read().decode("utf-8")
            if args.save:
                args.save.mkdir(parents=True, exist_ok=True)
                (args.save / (source.split("//", 1)[1].replace(":", "_").replace("/", "_") + ".txt")).write_text(text)
        else:
            text = Path(source).read_text(encoding="utf-8")
        ours, theirs = by_harvest(text), by_prometheus_client(text)
        differ = sorted(k for k in set(ours) | set(theirs) if ours.get(k) != theirs.get(k))
        batches = {"harvest": [], "prometheus_client": []}
        for _ in range(5):
            batches["harvest"].append(timed(by_harvest, text, args.repeat))
            batches["prometheus_client"].append(timed(by_prometheus_client, text, args.repeat))
        h = statistics.median(batches["harvest"])
        p = statistics.median(batches["prometheus_client"])
        lines = sum(1 for line in text.splitlines() if line and not line.startswith("#"))
        print(f"{source}: {len(text)} bytes, {lines} samples; harvest {h:.0f} us, prometheus_client {p:.0f} us "
              f"per parse (x{p / h:.2f}); sums by name {'agree' if not differ else 'DIFFER on ' + ', '.join(differ[:5])}"
              f" ({load()})")
        print(f"BENCH metrics_parse source={Path(source).name} bytes={len(text)} harvest_us={h:.1f} "
              f"prometheus_client_us={p:.1f} ratio={p / h:.3f} agree={int(not differ)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
