"""`concurrency = "auto"` against a sweep of fixed values, same servers, same run (vLLM CPU).

    python bench/autoconc.py [--scenarios sweep,small-batch,two-speeds] [--requests 256]
                             [--max-tokens 32] [--fixed 4,16,64,256,512]

Every run sends the same ``--requests`` chat requests (``ignore_eos``: each generates exactly
``--max-tokens``) through harvest's :class:`~harvest.client.Client` at one concurrency setting,
then reports generation tok/s (completion tokens / first request sent to last answer), the p50 and
p90 latency of the answers (send to full body; the wait for a client slot is not in it), and for
``auto`` the target of each endpoint over time and the engine's queue (``num_requests_waiting``).

Scenarios (each launches its servers through harvest's supervised ``Server``, verified stop after):

    sweep        one vLLM CPU server (tiny model): fixed values then auto, alternating order per round
    small-batch  one server with ``--max-num-seqs 8``: auto's settled target and the queue it left,
                 beside fixed 64
    two-speeds   two servers, ``--max-num-seqs 4`` and ``32``, as two endpoints of one client: the
                 fixed values (least-outstanding over both) then auto; ``own`` in ``--two-speed-fixed``
                 adds every engine held full: each endpoint at twice its own batch, a client each

The machine's load average is printed beside every figure. Prints one ``BENCH`` line per scenario.
The functions :func:`drive` and :func:`summarize` are reused by ``autoconc_gpu.py``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from benchutil import exit_on_sigterm, load  # bench/benchutil.py
from saturation import SERVED_NAME, TOPICS, VLLM_ENV, engine_python

from harvest.client import Client
from harvest.campaign.run import engine_limit
from harvest.client.engine import EngineLimit
from harvest.client.autoconc import AutoSettings, start_for
from harvest.config import ClientConfig, SamplingConfig
from harvest.errors import RequestError


def prompts(n: int) -> list[str]:
    return [f"Question {i}: explain how {TOPICS[i % len(TOPICS)]} works and when you would choose something else."
            for i in range(n)]


class Tally:
    """The answers of one arm: tokens, failures, latencies and when each answer came."""

    def __init__(self) -> None:
        self.t0 = time.monotonic()
        self.tokens = self.failed = 0
        self.latencies: list[float] = []
        self.finished: list[tuple[float, int]] = []

    async def ask(self, client: Client, text: str) -> None:
        try:
            done = await client.chat([{"role": "user", "content": text}])
        except RequestError:
            self.failed += 1
            return
        n = done.completion_tokens or 0
        self.tokens += n
        self.latencies.append(done.latency_s)
        self.finished.append((time.monotonic() - self.t0, n))

    def result(self, concurrency: int | str, in_flight: list[tuple[float, int]], **more: Any) -> dict[str, Any]:
        window = time.monotonic() - self.t0
        return {"concurrency": concurrency, "tok_s": self.tokens / window, "window_s": window,
                "tokens": self.tokens, "tok_s_late": late_rate(self.finished), "finished": self.finished,
                "failed": self.failed, "p50": _pct(self.latencies, 50), "p90": _pct(self.latencies, 90),
                "mean": statistics.fmean(self.latencies) if self.latencies else float("nan"),
                "in_flight": in_flight, "load": load(), **more}


async def drive(urls: list[str], concurrency: int | str, requests: int, max_tokens: int, *, model: str,
                extra_body: dict[str, Any] | None = None, auto: AutoSettings | None = None,
                max_concurrency: int = 512, sample_s: float = 1.0, timeout: float = 600.0,
                canary: bool = False, scrape: bool = False,
                limits: dict[str, EngineLimit] | None = None) -> dict[str, Any]:
    """Send ``requests`` chat requests through one Client; tok/s, latencies and (auto) the targets.
    ``canary``: a diagnostic arm, a fixed value with auto's canary streamed beside it the whole run
    (what the canary alone costs the engine). Every arm pays what it pays in ``harvest run``: auto
    its steering's scrape of /metrics every control step (its queue in the trace is that scrape's),
    a fixed value none. ``scrape``: a diagnostic, one more scrape of /metrics every ``sample_s`` in
    every arm (what a scrape costs the engine). ``limits``: each endpoint's engine as ``harvest run``
    knows it for servers launched with settings of their own (each starts and stops at its batch)."""
    config = ClientConfig(concurrency=concurrency, max_concurrency=max_concurrency, max_retries=2,
                          request_timeout=timeout, health_deadline=60.0,
                          auto_start=min(auto.start, max_concurrency) if auto and not limits else None)
    sampling = SamplingConfig(max_tokens=max_tokens, temperature=0.0, extra_body=extra_body or {})
    trace: list[tuple[float, dict[str, int], dict[str, float | None]]] = []
    in_flight: list[tuple[float, int]] = []
    decisions: dict[str, list[tuple[float, int, str, str, float | None]]] = {}
    async with Client(urls, config, sampling, model=model, auto=auto, limits=limits) as client:
        tally = Tally()
        t0 = tally.t0

        async def sampler() -> None:
            while True:
                await asyncio.sleep(sample_s)
                # No scrape of its own: a /metrics scrape costs vLLM CPU's HTTP server real CPU on 2
                # cores (sampling the auto arms only made them pay twice: the auto arm of a
                # 16,384-request sweep held fixed 256's target from 7 s on at x0.74 of its tok/s).
                targets = client.concurrency_targets()
                waiting = {t.url: t.queue for t in targets}
                if scrape:
                    await client.scrape_metrics()
                trace.append((time.monotonic() - t0, {t.url: t.target for t in targets}, waiting))
                in_flight.append((time.monotonic() - t0, client.stats().in_flight))
                for t in targets:
                    if not decisions.get(t.url) or decisions[t.url][-1][1:4] != (t.target, t.phase, t.reason):
                        decisions.setdefault(t.url, []).append((round(time.monotonic() - t0, 1), t.target,
                                                                t.phase, t.reason, t.tok_s))

        async def canaries() -> None:
            while True:  # one at a time, back to back, as the steering loop keeps them
                try:
                    await client._send_canary(urls[0], [])  # noqa: SLF001 - the diagnostic arm
                except Exception:  # noqa: BLE001 - a lost canary is only a lost reading
                    await asyncio.sleep(sample_s)

        watch = asyncio.create_task(sampler())
        side = asyncio.create_task(canaries()) if canary else None
        try:
            # The campaign's own dispatch claims 2 x capacity ahead; here every request waits in the client.
            await asyncio.wait_for(asyncio.gather(*(tally.ask(client, p) for p in prompts(requests))),
                                   timeout * 4)
        finally:
            for task in (watch, side):
                if task is not None:
                    task.cancel()
            await asyncio.gather(*(t for t in (watch, side) if t is not None), return_exceptions=True)
        return tally.result(concurrency, in_flight, trace=trace, decisions=decisions)


async def drive_each(held: dict[str, int], requests: int, max_tokens: int, *, model: str,
                     extra_body: dict[str, Any] | None = None, sample_s: float = 1.0,
                     timeout: float = 600.0) -> dict[str, Any]:
    """Every engine held full: one client per endpoint, each holding its endpoint at its own fixed
    value (``held``: URL -> concurrency; 2 x its batch keeps the batch full with a queue behind it),
    all taking the next request from one list. What a better split of the work over the endpoints
    could make, beside which a fixed value for the whole pool is judged."""
    sampling = SamplingConfig(max_tokens=max_tokens, temperature=0.0, extra_body=extra_body or {})
    texts = iter(prompts(requests))
    in_flight: list[tuple[float, int]] = []
    async with contextlib.AsyncExitStack() as stack:
        clients = [await stack.enter_async_context(
            Client([url], ClientConfig(concurrency=n, max_retries=2, request_timeout=timeout, health_deadline=60.0),
                   sampling, model=model)) for url, n in held.items()]
        tally = Tally()

        async def worker(client: Client) -> None:
            for text in texts:
                await tally.ask(client, text)

        async def sampler() -> None:
            while True:
                await asyncio.sleep(sample_s)
                in_flight.append((time.monotonic() - tally.t0, sum(c.stats().in_flight for c in clients)))

        watch = asyncio.create_task(sampler())
        try:
            await asyncio.wait_for(asyncio.gather(*(worker(c) for c, n in zip(clients, held.values())
                                                    for _ in range(n))), timeout * 4)
        finally:
            watch.cancel()
            await asyncio.gather(watch, return_exceptions=True)
        return tally.result("+".join(map(str, held.values())), in_flight, trace=[], decisions={})


def late_rate(finished: list[tuple[float, int]], lo: float = 0.5, hi: float = 0.9) -> float:
    """tok/s between the answers at ``lo`` and ``hi`` of the run (by count): after auto's ramp and
    before the last wave drains, the rate a long campaign runs at. The same cut for every setting."""
    if len(finished) < 10:
        return float("nan")
    done = sorted(finished)
    a, b = int(len(done) * lo), int(len(done) * hi)
    span = done[b][0] - done[a][0]
    return sum(n for _, n in done[a + 1:b + 1]) / span if span > 0 else float("nan")


def _pct(values: list[float], p: int) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(len(ordered) * p / 100))]


def describe(r: dict[str, Any]) -> str:
    return (f"{str(r.get('arm', r['concurrency'])):>5}: {r['tok_s']:8.1f} tok/s  p50 {r['p50']:6.2f} s  p90 {r['p90']:6.2f} s  "
            f"({r['tokens']} tokens in {r['window_s']:.1f} s, {r['failed']} failed; answers 50-90 %: "
            f"{r.get('tok_s_late', float('nan')):.1f} tok/s; {r['load']})")


def targets_over_time(r: dict[str, Any], points: int = 12) -> str:
    """The auto targets (and the engine queue) at a dozen moments of the run."""
    trace = r["trace"]
    if not trace:
        return "  (no samples)"
    step = max(1, len(trace) // points)
    out = []
    for t, targets, waiting in trace[::step]:
        parts = [f"{targets.get(u, '-')}" + (f"/q{waiting[u]:.0f}" if waiting.get(u) is not None else "")
                 for u in targets]
        out.append(f"{t:5.1f}s " + "+".join(parts))
    moves = "; ".join(f"{url.rsplit(':', 1)[-1]}: " + ", ".join(
        f"{t}s {n} {phase} ({why}" + (f", {tok_s:.0f} tok/s)" if tok_s is not None else ")")
        for t, n, phase, why, tok_s in d)
        for url, d in r.get("decisions", {}).items())
    return "  targets (target/queue): " + ", ".join(out) + "\n  decisions: " + moves


def timeline(r: dict[str, Any], bucket_s: float = 2.5) -> str:
    """Answers' tok/s and the requests in flight per ``bucket_s`` of the run: where a setting lost time."""
    end = max((t for t, _ in r["finished"]), default=0.0)
    cells = []
    for k in range(int(end // bucket_s) + 1):
        lo, hi = k * bucket_s, (k + 1) * bucket_s
        tok = sum(n for t, n in r["finished"] if lo <= t < hi) / bucket_s
        held = [n for t, n in r.get("in_flight", []) if lo <= t < hi]
        cells.append(f"{lo:g}s {tok:.0f}/{max(held) if held else '-'}")
    return "  timeline (tok/s / in flight per " + f"{bucket_s} s): " + ", ".join(cells)


def settled(r: dict[str, Any]) -> tuple[dict[str, float], dict[str, float]]:
    """Median target and mean queue of each endpoint over the second half of the run."""
    half = r["trace"][len(r["trace"]) // 2:]
    urls = half[-1][1].keys() if half else ()
    targets = {u: statistics.median(s[1][u] for s in half) for u in urls}
    queues = {u: statistics.mean(s[2][u] for s in half if s[2].get(u) is not None)
              for u in urls if any(s[2].get(u) is not None for s in half)}
    return targets, queues


def summarize(results: dict[str, list[dict[str, Any]]], label: str) -> dict[str, float]:
    """Median tok/s and p50 per setting; auto against the best fixed one and against fixed 64."""
    med = {k: {"tok_s": statistics.median(r["tok_s"] for r in rs), "p50": statistics.median(r["p50"] for r in rs),
               "mean": statistics.median(r.get("mean", float("nan")) for r in rs)}
           for k, rs in results.items()}
    fixed = {k: v for k, v in med.items() if k.isdigit()}  # not auto, a diagnostic arm ("512c") or "own"
    best = max(fixed, key=lambda k: fixed[k]["tok_s"])
    a = med["auto"]
    out = {"auto_tok_s": a["tok_s"], "auto_p50": a["p50"], "best_fixed": float(best),
           "best_tok_s": fixed[best]["tok_s"], "best_p50": fixed[best]["p50"],
           "ratio_tok_s": a["tok_s"] / fixed[best]["tok_s"], "ratio_p50": a["p50"] / fixed[best]["p50"],
           "auto_mean": a["mean"], "best_mean": fixed[best]["mean"], "ratio_mean": a["mean"] / fixed[best]["mean"]}
    print(f"\n{label}: medians over rounds")
    for k, v in med.items():
        print(f"  {k:>5}: {v['tok_s']:8.1f} tok/s  p50 {v['p50']:6.2f} s  mean {v['mean']:6.2f} s")
    print(f"  auto / best fixed ({best}): tok/s x{out['ratio_tok_s']:.3f}, p50 x{out['ratio_p50']:.3f}, "
          f"mean latency x{out['ratio_mean']:.3f}")
    late = {k: statistics.median(r.get("tok_s_late", float("nan")) for r in rs) for k, rs in results.items()}
    best_late = max((k for k in late if k.isdigit()), key=lambda k: late[k])
    out["ratio_late"] = late["auto"] / late[best_late]
    print(f"  answers 50-90 % of the run (after auto's ramp, before the drain): auto {late['auto']:.1f} tok/s, "
          f"best fixed ({best_late}) {late[best_late]:.1f}: x{out['ratio_late']:.3f}")
    if "64" in fixed:
        out["ratio_vs_64"] = a["tok_s"] / fixed["64"]["tok_s"]
        print(f"  auto / fixed 64 (the old default): tok/s x{out['ratio_vs_64']:.3f}")
    if "own" in med:
        # Every engine held full for the whole run by a client of its own: the most a better split of
        # the work can make. A best fixed value near it (or past it) leaves auto nothing to win.
        own = med["own"]["tok_s"]
        out.update(own_tok_s=own, best_over_own=fixed[best]["tok_s"] / own, auto_over_own=a["tok_s"] / own,
                   own_over_best=own / fixed[best]["tok_s"])
        print(f"  every engine held full (own: each endpoint at 2x its batch, a client each): {own:.1f} tok/s; "
              f"best fixed x{out['best_over_own']:.3f} of it, auto x{out['auto_over_own']:.3f}; "
              f"own / best fixed x{out['own_over_best']:.3f}")
    return out


# ----------------------------------------------------------------------------------------- servers

def start_vllm(py: str, model: str, work: Path, name: str, max_num_seqs: int | None, *, max_model_len: int = 1024,
               more_args: tuple[str, ...] = (), cpus: str | None = None):
    import socket

    from harvest.config import PreflightConfig, ServerConfig
    from harvest.errors import LaunchError
    from harvest.server import Server

    extra = (["--max-model-len", str(max_model_len)] + (["--max-num-seqs", str(max_num_seqs)] if max_num_seqs else [])
             + list(more_args))
    last: Exception | None = None
    for attempt in range(3):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        cfg = ServerConfig(engine="vllm", model=model, python=py, port=port, served_model_name=SERVED_NAME,
                           env={**VLLM_ENV, **({"VLLM_CPU_OMP_THREADS_BIND": cpus} if cpus else {})},
                           extra_args=extra, ready_timeout=600.0, stop_grace=20.0,
                           stop_deadline=60.0)
        server = Server(cfg, run_dir=work / f"{name}-{attempt}",
                        preflight=PreflightConfig(min_disk_free_gib=1, ram_reserve_gib=1))
        try:
            return server.launch()
        except LaunchError as exc:
            last = exc
            if "address already in use" not in str(exc).lower():
                raise
    raise RuntimeError(f"could not start vLLM: {last}")


def stop_all(servers: list[Any]) -> None:
    for server in servers:
        report = server.shutdown()
        if report is not None:
            print(f"server stop: {report.verdict} in {report.total_s:.2f} s", flush=True)


# ----------------------------------------------------------------------------------------- scenarios

def run_series(args: argparse.Namespace, urls: list[str], settings: list[str], label: str,
               auto: AutoSettings, limits: dict[str, EngineLimit] | None = None
               ) -> dict[str, list[dict[str, Any]]]:
    return run_series_model(args, urls, settings, label, auto, model=SERVED_NAME,
                            extra_body={"ignore_eos": True}, limits=limits)


def run_series_model(args: argparse.Namespace, urls: list[str], settings: list[str], label: str,
                     auto: AutoSettings, *, model: str, extra_body: dict[str, Any],
                     warm_up: bool = False, limits: dict[str, EngineLimit] | None = None
                     ) -> dict[str, list[dict[str, Any]]]:
    """Every setting once per round (order reversed every other round); ``warm_up``: one untimed
    pass at the real size first, at the middle fixed value."""
    if warm_up:
        fixed = [int(s) for s in settings if s.isdigit()]
        w = asyncio.run(drive(urls, fixed[len(fixed) // 2], getattr(args, "warm_up_requests", None) or args.requests,
                              args.max_tokens, model=model, extra_body=extra_body))
        print(f"  warm-up: {describe(w)}", flush=True)
    results: dict[str, list[dict[str, Any]]] = {s: [] for s in settings}
    for k in range(args.rounds):
        order = settings if k % 2 == 0 else settings[::-1]
        for s in order:
            # A fixed value with a suffix is a diagnostic arm: "c" auto's canary beside it, "s" one
            # scrape of /metrics a second beside it. "own": every engine held full, a client each.
            if s == "own":
                batches = {u: limits[u].batch if limits else None for u in urls}
                if None in batches.values():
                    raise SystemExit("the 'own' arm needs every endpoint's batch limit")
                r = asyncio.run(drive_each({u: 2 * b for u, b in batches.items() if b}, args.requests,
                                           args.max_tokens, model=model, extra_body=extra_body))
            else:
                conc: int | str = s if s == "auto" else int(s.rstrip("cs"))
                r = asyncio.run(drive(urls, conc, args.requests, args.max_tokens, model=model,
                                      extra_body=extra_body, auto=auto, max_concurrency=args.max_concurrency,
                                      canary=s.endswith("c"), scrape=s.endswith("s"),
                                      limits=limits))
            r["arm"] = s  # a diagnostic arm ("512c") shows as such, not as the fixed value it runs
            results[s].append(r)
            print(f"  {label} round {k} {describe(r)}", flush=True)
            if getattr(args, "timeline", False):
                print(timeline(r), flush=True)
            if s == "auto":
                print(targets_over_time(r), flush=True)
    return results


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--scenarios", default="sweep,small-batch,two-speeds")
    ap.add_argument("--requests", type=int, default=256)
    ap.add_argument("--max-tokens", type=int, default=32)
    ap.add_argument("--fixed", default="4,16,64,256,512",
                    help='fixed concurrency values of the sweep; "256s" is a diagnostic arm, fixed 256 '
                    "with one scrape of /metrics a second beside it (what auto's steering scrape costs)")
    ap.add_argument("--two-speed-fixed", default="8,32,64,128",
                    help="fixed values of the two-speeds scenario; \"own\" adds every engine held full, a client each")
    ap.add_argument("--pin", action="store_true",
                    help="two-speeds: bind each engine's compute threads to a CPU of its own "
                         "(VLLM_CPU_OMP_THREADS_BIND), as two servers have their own hardware; sweep: "
                         "the engine's to the last CPU and this client to the others, so that "
                         "neither takes the other's CPU (as on a GPU box)")
    ap.add_argument("--rounds", type=int, default=1)
    ap.add_argument("--timeline", action="store_true",
                    help="print every arm's answers' tok/s and requests in flight per 2.5 s")
    ap.add_argument("--max-concurrency", type=int, default=1024)
    ap.add_argument("--interval", type=float, default=1.0, help="seconds per control step of auto")
    ap.add_argument("--engine-python", help="Python of vLLM's CPU build (default: scripts/install-engines vllm)")
    ap.add_argument("--model", help="model folder (default: harvest's tiny model, built when missing)")
    ap.add_argument("--keep", type=Path, help="keep server logs in this folder")
    args = ap.parse_args(argv)
    scenarios = [s.strip() for s in args.scenarios.split(",") if s.strip()]
    unknown = set(scenarios) - {"sweep", "small-batch", "two-speeds"}
    if unknown:
        ap.error(f"--scenarios: unknown {', '.join(sorted(unknown))}")

    exit_on_sigterm()
    py = engine_python(args.engine_python)
    if args.model:
        model = str(Path(args.model).resolve())
    else:
        from harvest.campaign.demo import ensure_tiny_model

        model = str(ensure_tiny_model(py))
    work = args.keep or Path(tempfile.mkdtemp(prefix="harvest-autoconc-"))
    work.mkdir(parents=True, exist_ok=True)
    def auto_for(*servers: Any) -> tuple[AutoSettings, dict[str, EngineLimit]]:
        """The knobs of auto and what ``harvest run`` knows of each launched server's engine
        (``Client.from_config``): each endpoint starts and stops at its own batch limit."""
        limits = {s.url: engine_limit(s.config) for s in servers}
        described = []
        for url, x in limits.items():
            start = start_for(x.batch, metrics=x.metrics, max_concurrency=args.max_concurrency, exact=x.exact)
            described.append(f"{start} ({url}: batch {x.batch}"
                             + (", known exactly, and a short queue)" if x.exact else ")"))
        print("  auto starts at " + ", ".join(described), flush=True)
        return AutoSettings(max_concurrency=args.max_concurrency, interval_s=args.interval), limits

    print(f"auto concurrency: {args.requests} requests x {args.max_tokens} tokens (ignore_eos), "
          f"{args.rounds} round(s); vLLM CPU, tiny model; auto interval {args.interval} s", flush=True)
    print(f"machine: {platform.machine()}, {os.cpu_count()} CPUs, Python {platform.python_version()}, "
          f"{time.strftime('%Y-%m-%d %H:%M')}; {load()}", flush=True)
    fixed = [s.strip() for s in args.fixed.split(",") if s.strip()]

    if "sweep" in scenarios:
        everywhere = os.sched_getaffinity(0)
        cpus = sorted(everywhere) if args.pin else []
        if args.pin and len(cpus) < 2:
            raise SystemExit("--pin needs two CPUs at least")
        servers = [start_vllm(py, model, work, "sweep", None, cpus=str(cpus[-1]) if cpus else None)]
        try:
            if cpus:
                # The engine's compute on one CPU, this client on the others: as on a GPU box, where
                # the engine's work does not take the CPU that sends and reads the requests.
                os.sched_setaffinity(0, cpus[:-1])
                print(f"  engine pinned to CPU {cpus[-1]}, this client to CPU "
                      f"{','.join(map(str, cpus[:-1]))}", flush=True)
            url = servers[0].url
            asyncio.run(drive([url], 16, 32, 8, model=SERVED_NAME, extra_body={"ignore_eos": True}))  # warm-up
            res = run_series(args, [url], fixed + ["auto"], "sweep", *auto_for(*servers))
        finally:
            stop_all(servers)
            os.sched_setaffinity(0, everywhere)
        out = summarize(res, "sweep (one server)")
        ok = out["ratio_tok_s"] >= 0.95  # P7 A2
        ok_p5 = out["ratio_tok_s"] >= 0.98 and out["ratio_p50"] <= 1.2  # the older P5 line
        print(f"  target (P7 A2): auto >= x0.95 best fixed tok/s: {'met' if ok else 'MISSED'}; "
              f"(P5: x0.98 with p50 <= x1.2: {'met' if ok_p5 else 'MISSED'})")
        print("BENCH autoconc_sweep " + " ".join(f"{k}={v:.3f}" for k, v in out.items())
              + f" met={int(ok)} met_p5={int(ok_p5)} load1={os.getloadavg()[0]:.2f}", flush=True)

    if "small-batch" in scenarios:
        servers = [start_vllm(py, model, work, "seqs8", 8)]
        try:
            url = servers[0].url
            asyncio.run(drive([url], 8, 16, 8, model=SERVED_NAME, extra_body={"ignore_eos": True}))
            res = run_series(args, [url], ["64", "auto"], "max-num-seqs 8", *auto_for(*servers))
        finally:
            stop_all(servers)
        targets, queues = settled(res["auto"][-1])
        t, q = next(iter(targets.values())), next(iter(queues.values()), float("nan"))
        print(f"\nmax-num-seqs 8: auto settled at target {t:.0f} with the engine queue at {q:.1f} on average "
              f"(second half of the run); fixed 64: p50 {res['64'][-1]['p50']:.2f} s vs auto "
              f"{res['auto'][-1]['p50']:.2f} s")
        print(f"BENCH autoconc_small_batch settled_target={t:.1f} mean_queue={q:.2f} "
              f"auto_tok_s={res['auto'][-1]['tok_s']:.1f} fixed64_tok_s={res['64'][-1]['tok_s']:.1f} "
              f"auto_p50={res['auto'][-1]['p50']:.3f} fixed64_p50={res['64'][-1]['p50']:.3f} "
              f"load1={os.getloadavg()[0]:.2f}", flush=True)

    if "two-speeds" in scenarios:
        servers = []
        try:
            cpus = sorted(os.sched_getaffinity(0)) if args.pin else []
            if args.pin and len(cpus) < 2:
                raise SystemExit("--pin needs two CPUs at least")
            servers.append(start_vllm(py, model, work, "seqs4", 4, cpus=str(cpus[0]) if cpus else None))
            servers.append(start_vllm(py, model, work, "seqs32", 32, cpus=str(cpus[1]) if cpus else None))
            if cpus:
                print(f"  engines pinned: seqs4 to CPU {cpus[0]}, seqs32 to CPU {cpus[1]}", flush=True)
            urls = [s.url for s in servers]
            for url in urls:
                asyncio.run(drive([url], 8, 16, 8, model=SERVED_NAME, extra_body={"ignore_eos": True}))
            two = [s.strip() for s in args.two_speed_fixed.split(",") if s.strip()]
            res = run_series(args, urls, two + ["auto"], "two speeds", *auto_for(*servers))
        finally:
            stop_all(servers)
        out = summarize(res, "two endpoints (max-num-seqs 4 and 32)")
        ok = out["ratio_tok_s"] >= 1.2
        print(f"  target: auto >= x1.2 the best fixed tok/s: {'met' if ok else 'MISSED'}")
        print("BENCH autoconc_two_speeds " + " ".join(f"{k}={v:.3f}" for k, v in out.items())
              + f" met={int(ok)} load1={os.getloadavg()[0]:.2f}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
