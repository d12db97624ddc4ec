"""/metrics parsing cost on engines' real output: a whole exposition, and the steering loop's share.

    python bench/metrics_parse.py FILE_OR_URL [...] [--repeat 200] [--hand-written FILE]

Each argument is a saved ``/metrics`` answer (a file) or a live engine's base URL (``/metrics`` is
fetched once and can be saved with ``--save DIR``). For each, ``--repeat`` parses, alternating, of:

    full          harvest's ``parse_prometheus_text`` (``prometheus_client``'s parser) on the whole text
    steering      ``keep_only`` the controller's gauges, then the same parser (what auto concurrency pays)
    hand-written  with ``--hand-written FILE``: the parser harvest had before (a ``metrics.py`` saved
                  from git, e.g. ``git show 81b67cc:src/harvest/client/metrics.py > /tmp/old.py``)

Printed: microseconds per parse (median of 5 batches) and whether full and hand-written agree on
every sample summed by name (what harvest uses). Prints one ``BENCH`` line per source.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
import urllib.request
from pathlib import Path

from benchutil import load  # bench/benchutil.py

from harvest.client.autoconc import GAUGE_NAMES
from harvest.client.metrics import keep_only, parse_prometheus_text, sum_by_name


def full(text: str) -> dict[str, float]:
    return sum_by_name(parse_prometheus_text(text))


def steering(text: str) -> dict[str, float]:
    return sum_by_name(parse_prometheus_text(keep_only(text, GAUGE_NAMES)))


def load_hand_written(path: Path):
    """``sum_by_name(parse_prometheus_text(...))`` of a saved older metrics.py."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("old_metrics", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules["old_metrics"] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return lambda text: module.sum_by_name(module.parse_prometheus_text(text))


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
    ap.add_argument("--hand-written", type=Path, help="an older metrics.py with the hand-written parser")
    args = ap.parse_args(argv)
    parsers = {"full": full, "steering": steering}
    if args.hand_written:
        parsers["hand-written"] = load_hand_written(args.hand_written)
    for source in args.sources:
        if source.startswith("http"):
            with urllib.request.urlopen(source.rstrip("/") + "/metrics", timeout=30) as response:
                text = response.read().decode("utf-8")
            if args.save:
                args.save.mkdir(parents=True, exist_ok=True)
                (args.save / (source.split("//", 1)[1].replace(":", "_").replace("/", "_") + ".txt")).write_text(text)
        else:
            text = Path(source).read_text(encoding="utf-8")
        ours = full(text)
        other = parsers.get("hand-written")
        differ = sorted(k for k in set(ours) | set(other(text)) if ours.get(k) != other(text).get(k)) if other else []
        batches: dict[str, list[float]] = {name: [] for name in parsers}
        for _ in range(5):
            for name, fn in parsers.items():
                batches[name].append(timed(fn, text, args.repeat))
        us = {name: statistics.median(b) for name, b in batches.items()}
        lines = sum(1 for line in text.splitlines() if line and not line.startswith("#"))
        shown = ", ".join(f"{name} {v:.0f} us" for name, v in us.items())
        agree = "" if other is None else (" sums by name agree" if not differ else " DIFFER on " + ", ".join(differ[:5]))
        print(f"{source}: {len(text)} bytes, {lines} samples; per parse: {shown};{agree} ({load()})")
        print(f"BENCH metrics_parse source={Path(source).name} bytes={len(text)} "
              + " ".join(f"{name.replace('-', '_')}_us={v:.1f}" for name, v in us.items())
              + (f" ratio_full_vs_hand={us['full'] / us['hand-written']:.3f} agree={int(not differ)}" if other else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
