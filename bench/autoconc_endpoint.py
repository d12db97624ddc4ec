"""The default concurrency on an endpoint harvest did not launch, against fixed values (simulated).

    python bench/autoconc_endpoint.py [--sizes 1024,4096] [--stream off,on] [--rounds 5]
                                      [--fixed 512,1024] [--preset transformers-h100] [--sim-batch N]
                                      [--dialect transformers] [--stream-cost F]

One ``bench/sim_engine.py`` server (``--preset transformers-h100``: the curve of ``transformers
serve`` on an H100 as an endpoint, no /metrics, nothing that publishes its capacity) is started once
and every run is sent to it, back to back, as ``harvest run`` sends a job with ``engine = "openai"``
pointed at it: the client is built by ``Client.from_config`` from that job (the default ``[client]``
but ``concurrency`` and ``stream``), asks the endpoint what it serves and publishes
(``Client.start_check``, as ``harvest run`` does before any item), then sends ``--size`` chat
requests of 64 tokens (answers of equal length). Per run: generation tok/s (completion tokens over
the first request to the last answer), p50 and mean latency, and for the default its level over
time with the level's reason (what the panel and ``status --json`` show).

Per stream mode and size: every fixed value and the default once per round, the order reversed
every other round; then the medians, the default's median over the best fixed value's median, each
default run over that median (the lowest one is the "no run below" figure), and the level each
default run settled at (its target over the last third of the run; "stable" when every run's is
within one step, x1.25, of every other's). Targets: the default's median >= 0.90 x the
best fixed value at 1024 requests, >= 0.97 x at 4096, and no run below 0.85 x; a fixed value above
``[client] max_concurrency`` (1024, the most the default holds) is also shown against the best one
within it. One ``BENCH autoconc_endpoint`` line per stream mode and size.

The script only measures the client against the simulation: the simulation sleeps (one asyncio
sleep per decode step for the whole batch, on a drift-free clock), so its pace does not depend on
this machine's load beyond the CPU its HTTP handling takes; the load average is printed beside
each run.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from benchutil import exit_on_sigterm, load  # bench/benchutil.py

from harvest.campaign.run import engine_limit
from harvest.client import Client
from harvest.config import parse_config
from harvest.errors import RequestError

MODEL = "sim-model"
MAX_TOKENS = 64
#: ``[client] max_concurrency``'s default: the most the default holds per endpoint.
MAX_CONCURRENCY = 1024
#: One step of the controller's settled probes: levels this close count as the same.
STEP = 1.25


def prompt(i: int) -> str:
    """12-22 words, as the issue's prompts."""
    words = ["tell", "me", "a", "short", "story", "about", "the", "number", str(i), "and", "why", "it",
             "matters", "to", "a", "curious", "reader", "on", "a", "quiet", "winter", "morning"]
    return " ".join(words[:12 + i % 11])


async def one_run(url: str, size: int, concurrency: int | None, stream: bool) -> dict[str, Any]:
    """``size`` requests through a client built from an ``engine = "openai"`` job, as ``harvest run``."""
    client_table: dict[str, Any] = {"request_timeout": 600, "stream": stream}
    if concurrency is not None:
        client_table["concurrency"] = concurrency
    cfg = parse_config({"server": {"engine": "openai", "base_url": url + "/v1", "model": MODEL},
                        "sampling": {"max_tokens": MAX_TOKENS, "temperature": 0.0}, "client": client_table})
    assert cfg.server is not None
    async with Client.from_config(cfg, engine=engine_limit(cfg.server)) as client:
        listings = await client.start_check(MODEL, 60.0)
        if not all(x.up for x in listings):
            raise SystemExit(f"the simulated engine at {url} did not answer")
        trace: list[tuple[float, int, str]] = []
        tokens = 0
        latencies: list[float] = []
        failed = 0
        t0 = time.monotonic()
        last = t0

        async def ask(i: int) -> None:
            nonlocal tokens, failed, last
            try:
                done = await client.chat([{"role": "user", "content": prompt(i)}])
            except RequestError:
                failed += 1
                return
            tokens += done.completion_tokens or 0
            latencies.append(done.latency_s)
            last = time.monotonic()

        async def sample() -> None:
            while True:
                for t in client.concurrency_targets():
                    trace.append((time.monotonic() - t0, t.target, t.why))
                await asyncio.sleep(1.0)

        watch = asyncio.create_task(sample()) if concurrency is None else None
        try:
            await asyncio.gather(*(ask(i) for i in range(size)))
        finally:
            if watch is not None:
                watch.cancel()
                await asyncio.gather(watch, return_exceptions=True)
    window = max(last - t0, 1e-9)
    ordered = sorted(latencies)
    tail = [n for t, n, _ in trace if t >= 2 * window / 3] or [n for _, n, _ in trace[-1:]]
    return {"arm": "default" if concurrency is None else str(concurrency), "tok_s": tokens / window,
            "window_s": window, "tokens": tokens, "failed": failed,
            "p50": ordered[len(ordered) // 2] if ordered else float("nan"),
            "mean": statistics.fmean(latencies) if latencies else float("nan"),
            "level": statistics.median(tail) if tail else None, "trace": trace, "load": load()}


def reasons(trace: list[tuple[float, int, str]]) -> str:
    """The level and its reason each time either changed."""
    out, seen = [], None
    for t, n, why in trace:
        if (n, why) != seen:
            out.append(f"{t:.0f}s {n} ({why})")
            seen = (n, why)
    return "; ".join(out)


def describe(r: dict[str, Any]) -> str:
    return (f"{r['arm']:>7}: {r['tok_s']:7.1f} tok/s in {r['window_s']:6.1f} s, p50 {r['p50']:6.2f} s, "
            f"mean {r['mean']:6.2f} s, {r['failed']} failed; {r['load']}")


def summarize(results: dict[str, list[dict[str, Any]]], label: str, size: int) -> dict[str, float]:
    med = {arm: statistics.median(r["tok_s"] for r in runs) for arm, runs in results.items()}
    fixed = {arm: v for arm, v in med.items() if arm != "default"}
    best = max(fixed, key=lambda a: fixed[a])
    ratio = med["default"] / fixed[best]
    # The default never holds more than [client] max_concurrency (1024): the best value it may take.
    bounded = {arm: v for arm, v in fixed.items() if int(arm) <= MAX_CONCURRENCY}
    best_bounded = max(bounded, key=lambda a: bounded[a]) if bounded else best
    ratio_bounded = med["default"] / fixed[best_bounded]
    each = [r["tok_s"] / fixed[best] for r in results["default"]]
    levels = [r["level"] for r in results["default"] if r["level"] is not None]
    stable = bool(levels) and max(levels) <= min(levels) * STEP
    floor = 0.97 if size >= 4096 else 0.90
    met = ratio >= floor and min(each) >= 0.85
    mean_ratio = statistics.median(r["mean"] for r in results["default"]) / \
        statistics.median(r["mean"] for r in results[best])
    print(f"\n{label}: medians over {len(results['default'])} rounds")
    for arm, v in med.items():
        p50 = statistics.median(r["p50"] for r in results[arm])
        print(f"  {arm:>7}: {v:8.1f} tok/s, p50 {p50:6.2f} s")
    print(f"  default / best fixed ({best}): x{ratio:.3f} (target x{floor:.2f}); each run: "
          + ", ".join(f"x{e:.3f}" for e in each) + f" (lowest x{min(each):.3f}, target x0.85); "
          f"mean latency x{mean_ratio:.3f}")
    if best_bounded != best:
        print(f"  default / best fixed within max_concurrency {MAX_CONCURRENCY} ({best_bounded}): x{ratio_bounded:.3f}; "
              f"each run: " + ", ".join(f"x{r['tok_s'] / fixed[best_bounded]:.3f}" for r in results["default"]))
    print(f"  levels the default settled at: {', '.join(f'{x:.0f}' for x in levels)} "
          f"({'stable: within one step' if stable else 'NOT within one step'})")
    print(f"  target: {'met' if met else 'MISSED'}")
    out = {"ratio": ratio, "lowest": min(each), "best_fixed": float(best), "ratio_bounded": ratio_bounded,
           "best_bounded": float(best_bounded), "default_tok_s": med["default"],
           "best_tok_s": fixed[best], "mean_latency_ratio": mean_ratio,
           "level_min": min(levels) if levels else float("nan"), "level_max": max(levels) if levels else float("nan")}
    print(f"BENCH autoconc_endpoint {label.replace(' ', '_')} " + " ".join(f"{k}={v:.3f}" for k, v in out.items())
          + f" stable={int(stable)} met={int(met)} load1={os.getloadavg()[0]:.2f}", flush=True)
    return out


class Sim:
    """``bench/sim_engine.py`` as a child process, stopped by its pid."""

    def __init__(self, argv: list[str]):
        cmd = [sys.executable, str(Path(__file__).with_name("sim_engine.py")), "--port", "0", *argv]
        self.proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True)
        line = self.proc.stdout.readline() if self.proc.stdout else ""
        if not line.startswith("listening on "):
            self.stop()
            raise SystemExit(f"sim_engine did not start: {line!r}")
        self.url = "http://" + line.split()[-1]

    def stop(self) -> None:
        self.proc.terminate()  # our own child, by its pid
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(timeout=10)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", default="1024,4096")
    ap.add_argument("--stream", default="off,on", help="[client] stream of every run: off, on or both")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--fixed", default="1024:512,1024;4096:512,1024,2048",
                    help="fixed values (512,1024), or per size (SIZE:VALUES;...); 2048 at 1024 requests is 1024")
    ap.add_argument("--preset", default="transformers-h100", help="sim_engine.py --preset ('' for none)")
    ap.add_argument("--sim-batch", type=int, help="requests the engine runs at once (the preset's: 1024)")
    ap.add_argument("--dialect", help="sim_engine.py --dialect (overrides the preset's)")
    ap.add_argument("--stream-cost", type=float, default=0.0, help="sim_engine.py --stream-cost")
    args = ap.parse_args(argv)
    exit_on_sigterm()
    sim_args = (["--preset", args.preset] if args.preset else []) + ["--stream-cost", str(args.stream_cost)]
    if args.sim_batch:
        sim_args += ["--max-batch", str(args.sim_batch)]
    if args.dialect:
        sim_args += ["--dialect", args.dialect]
    sizes = [int(s) for s in args.sizes.split(",") if s.strip()]
    fixed_for = parse_fixed(args.fixed, sizes)
    streams = [s.strip() for s in args.stream.split(",") if s.strip()]
    print(f"default concurrency on an endpoint (engine = \"openai\") vs fixed: sim_engine {' '.join(sim_args)}; "
          f"sizes {sizes} x {MAX_TOKENS} tokens; stream {streams}; {args.rounds} round(s)", flush=True)
    print(f"machine: {platform.machine()}, {os.cpu_count()} CPUs, Python {platform.python_version()}, "
          f"{time.strftime('%Y-%m-%d %H:%M')}; {load()}", flush=True)
    sim = Sim(sim_args)
    try:
        for stream in streams:
            for size in sizes:
                arms: list[int | None] = [*fixed_for[size], None]
                results: dict[str, list[dict[str, Any]]] = {}
                label = f"stream {stream} {size}"
                for k in range(args.rounds):
                    for conc in (arms if k % 2 == 0 else arms[::-1]):
                        r = asyncio.run(one_run(sim.url, size, conc, stream == "on"))
                        results.setdefault(r["arm"], []).append(r)
                        print(f"  {label} round {k} {describe(r)}", flush=True)
                        if conc is None:
                            print(f"    level: {reasons(r['trace'])}; settled {r['level']}", flush=True)
                summarize(results, label, size)
    finally:
        sim.stop()
    return 0


def parse_fixed(text: str, sizes: list[int]) -> dict[int, list[int]]:
    if ":" not in text:
        values = [int(v) for v in text.split(",") if v.strip()]
        return {size: values for size in sizes}
    out = {}
    for part in text.split(";"):
        n, _, values = part.partition(":")
        out[int(n)] = [int(v) for v in values.split(",") if v.strip()]
    missing = [s for s in sizes if s not in out]
    if missing:
        raise SystemExit(f"--fixed names no values for size(s) {missing}")
    return out


if __name__ == "__main__":
    sys.exit(main())
