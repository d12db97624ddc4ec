"""What the report costs a small run: the CPU of ``write_report`` in a fresh process, its imports
included, as every ``harvest run`` pays it at its end; this tree against another's (``--base``).

    python bench/report_cost.py --base DIR [--items 200] [--points 60] [--rounds 5]

A run folder is built once (``--items`` items driven through the ledger with the timeline
recording, then ``--points`` progress intervals of four endpoints with errors, as
``report_scale.py`` fills one), and each tree writes its page of it in a new Python process per
round (``DIR/src`` first on ``PYTHONPATH`` for the base), alternating. The figures are the
process's user + system CPU, split into the import of ``harvest.report`` and the page; medians.
A base before 2a73b7c draws with matplotlib: install it beside (``pip install matplotlib``).
No server, no GPU.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

from benchutil import exit_on_sigterm, load
from ledger_scale import synthetic
from report_scale import drive, fill_timeline, lines_to

from harvest.campaign.outputs.progress import Progress
from harvest.campaign.outputs.timeline import Timeline
from harvest.ledger import Ledger

HERE = Path(__file__).resolve().parent
SRC = HERE.parent / "src"
CHILD = """
import json, sys, time
t0 = time.process_time()
from harvest.report import write_report
t1 = time.process_time()
size = write_report(sys.argv[1], output=sys.argv[2]).stat().st_size
t2 = time.process_time()
print(json.dumps({"import_s": t1 - t0, "page_s": t2 - t1, "bytes": size}))
"""


def build(run: Path, items: int, points: int) -> None:
    with Ledger.open(run, settings_hash="bench") as ledger:
        ledger.ingest(synthetic(items))
    with Ledger.open(run, settings_hash="bench") as ledger, open(os.devnull, "w") as null:
        progress = Progress(run, total=items, already_final=0, watch=lines_to(null))
        progress.timeline = Timeline.open(run)
        asyncio.run(drive(ledger, progress, 0.05))
        progress.timeline.close("finished")
    fill_timeline(run, points)


def one(src: Path, run: Path, out: Path) -> dict[str, float]:
    env = {**os.environ, "PYTHONPATH": str(src)}
    proc = subprocess.run([sys.executable, "-c", CHILD, str(run), str(out)], capture_output=True, text=True,
                          timeout=300, env=env, check=False)
    if proc.returncode != 0:
        raise SystemExit(f"the report of {src} failed:\n{proc.stderr[-2000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def main() -> int:
    exit_on_sigterm()
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--base", type=Path, default=None, help="another tree (DIR/src) measured in the same rounds")
    ap.add_argument("--items", type=int, default=200)
    ap.add_argument("--points", type=int, default=60)
    ap.add_argument("--rounds", type=int, default=5)
    args = ap.parse_args()
    trees = {"this tree": SRC, **({"base": args.base.resolve() / "src"} if args.base else {})}
    with tempfile.TemporaryDirectory(prefix="harvest-report-cost-") as tmp:
        run = Path(tmp) / "run"
        build(run, args.items, args.points)
        print(f"a run of {args.items} items, {args.points} timeline intervals; start: {load()}")
        got: dict[str, list[dict[str, float]]] = {name: [] for name in trees}
        for r in range(args.rounds):
            for name in (list(trees) if r % 2 == 0 else list(trees)[::-1]):
                m = one(trees[name], run, Path(tmp) / f"{name.replace(' ', '-')}.html")
                got[name].append(m)
                print(f"round {r + 1} {name:9s}: import {m['import_s']:.3f} s, page {m['page_s']:.3f} s CPU, "
                      f"{m['bytes'] / 1024:.0f} KiB")
        med = {name: {k: sorted(x[k] for x in rows)[len(rows) // 2] for k in ("import_s", "page_s")}
               for name, rows in got.items()}
        for name, m in med.items():
            print(f"median {name:9s}: import {m['import_s']:.3f} s + page {m['page_s']:.3f} s = "
                  f"{m['import_s'] + m['page_s']:.3f} s CPU")
        if args.base:
            a, b = (sum(med[n].values()) for n in ("this tree", "base"))
            print(f"this tree / base: x{a / b:.3f} of the CPU ({b - a:+.3f} s a report)  end: {load()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
