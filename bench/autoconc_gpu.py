"""`concurrency = "auto"` against a fixed sweep on a GPU: `transformers serve`, same server, same run.

    python bench/autoconc_gpu.py --model DIR [--gpu 0] [--requests 2048] [--max-tokens 64]
                                 [--fixed 256,512,1024] [--rounds 1]
    python bench/autoconc_gpu.py --sim            # the same sweep on bench/sim_engine.py modelled on the H200
    python bench/autoconc_gpu.py --dry            # a short run of the same code on vLLM CPU (tiny model)

For the GPU machine (see ``saturation_gpu.py``): ``transformers serve DIR --continuous-batching``
(a random 1B Llama from ``make_tiny_model.py DIR --size 1b``) is launched and stopped by harvest's
``Server``; after one untimed warm-up pass at the real size, every fixed concurrency of ``--fixed``
and ``auto`` send the same ``--requests`` chat requests through harvest's client, the order
reversed every other round. ``auto`` starts where ``harvest run`` would
(:func:`~harvest.client.autoconc.start_for` of the launched engine's batch limit,
:func:`~harvest.server.batch.batch_limit`). ``transformers serve`` has no ``/metrics`` (404), so
``auto`` steers on its answers alone (tok/s and latency per output token); it also rejects unknown
fields, so there is no ``ignore_eos`` and tok/s counts the completion tokens the server reports.

Printed per run: tok/s, p50 / p90 latency, failures (the server drops connections at very high
concurrency: those count as failed), auto's target over time, and the *ramp*: seconds from the
first request until the tok/s of the answers over a trailing ``--ramp-window`` first reaches 90 %
of the best fixed value's whole-run tok/s. Then the medians, auto against the best fixed value
(P7 A1's targets: tok/s >= x0.90 over a run of < 4096 requests, >= x0.95 from 4096, p50 <= x1.2
that value's, ramp <= 15 s) and a ``BENCH autoconc_gpu`` line.

``--sim`` runs ``bench/sim_engine.py`` without /metrics, modelled on the H200 measurements of
P7 A1 (a decode step of 50 ms + 0.19 ms per running request, at most ``--sim-batch`` at once:
tok/s 300 at 16 in flight, ~3500 at 512, no more above), so the controller is developed here and
the GPU run confirms. ``--dry`` runs the same sweep on a vLLM CPU server with the tiny model (a
few requests, two fixed values), to check the script end to end on a machine without a GPU.
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path

from autoconc import run_series_model, summarize  # bench/autoconc.py
from benchutil import exit_on_sigterm, load  # bench/benchutil.py

from harvest.client.autoconc import AutoSettings, start_for
from harvest.server.batch import batch_limit, has_metrics


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", help="model folder (make_tiny_model.py DIR --size 1b); not needed with --dry")
    ap.add_argument("--python", help="Python that runs transformers serve (default: this one)")
    ap.add_argument("--gpu", type=int, default=0, help="GPU index (default 0)")
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--requests", type=int, default=2048)
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--fixed", default="256,512,1024")
    ap.add_argument("--rounds", type=int, default=1)
    ap.add_argument("--max-concurrency", type=int, default=1024)
    ap.add_argument("--series", help='several sizes on one server: "2048:256,512,1024;4096:512,1024" '
                    "(REQUESTS:FIXED;...; replaces --requests and --fixed); a value ending in c (512c) or s "
                    "(512s) is a diagnostic arm, not a candidate for best: that fixed value with auto's canary "
                    "streamed beside it, or with one scrape of /metrics a second")
    ap.add_argument("--ramp-window", type=float, default=10.0, help="seconds of the trailing window of the ramp")
    ap.add_argument("--no-warm-up", action="store_true", help="skip the untimed warm-up pass")
    ap.add_argument("--warm-up-requests", type=int, help="requests of the warm-up pass (default: --requests)")
    ap.add_argument("--sim", action="store_true", help="bench/sim_engine.py modelled on the H200 instead")
    ap.add_argument("--sim-batch", type=int, default=560, help="with --sim: requests the engine runs at once")
    ap.add_argument("--sim-stream-cost", type=float, default=0.55,
                    help="with --sim: extra share of a step while a streamed request (the canary) runs")
    ap.add_argument("--interval", type=float, default=1.0, help="seconds per control step of auto")
    ap.add_argument("--cuda-graph", action="store_true", help="pass --cb-use-cuda-graph to the server")
    ap.add_argument("--force", action="store_true", help="launch even if harvest's preflight fails")
    ap.add_argument("--timeline", action="store_true",
                    help="print every arm's answers' tok/s and requests in flight per 2.5 s")
    ap.add_argument("--keep", type=Path, help="work folder to keep (default: a temporary one)")
    ap.add_argument("--dry", action="store_true", help="a short run on vLLM CPU with the tiny model instead")
    ap.add_argument("--engine-python", help="with --dry: Python of vLLM's CPU build")
    args = ap.parse_args(argv)
    if not args.dry and not args.sim and not args.model:
        ap.error("--model is required (or --sim, --dry)")

    exit_on_sigterm()
    work = args.keep or Path(tempfile.mkdtemp(prefix="harvest-autoconc-gpu-"))
    work.mkdir(parents=True, exist_ok=True)
    fixed = [s.strip() for s in args.fixed.split(",") if s.strip()]
    limit, metrics = None, True
    if args.sim:
        server = SimServer(args)
        model_name, label = "sim-model", f"sim_engine (H200 model, batch {args.sim_batch}, no /metrics)"
        limit, metrics = 1024, False  # what harvest knows of transformers serve (server/batch.py)
    elif args.dry:
        from autoconc import start_vllm
        from saturation import SERVED_NAME, engine_python

        from harvest.campaign.demo import ensure_tiny_model

        py = engine_python(args.engine_python)
        model_path = str(ensure_tiny_model(py))
        args.requests, args.max_tokens, fixed = min(args.requests, 48), min(args.max_tokens, 8), ["4", "64"]
        server = start_vllm(py, model_path, work, "dry", None)
        model_name, label = SERVED_NAME, "dry run on vLLM CPU (tiny model)"
        limit, metrics = batch_limit(server.config), has_metrics(server.config)
    else:
        from saturation_gpu import start_server

        model_path = str(Path(args.model).resolve())
        server = start_server(args, model_path, work)
        model_name, label = model_path, f"transformers serve {Path(model_path).name} (GPU {args.gpu}, {args.dtype})"
        limit, metrics = batch_limit(server.config), has_metrics(server.config)
    start = start_for(limit, metrics=metrics, max_concurrency=args.max_concurrency)
    auto = AutoSettings(start=start, max_concurrency=args.max_concurrency, interval_s=args.interval,
                        batch_hint=limit)
    series = parse_series(args.series) if args.series else [(args.requests, fixed)]
    print(f"auto concurrency on {label}: " + "; ".join(f"{n} requests, fixed {','.join(f)} and auto" for n, f in series)
          + f"; {args.max_tokens} tokens; auto start {auto.start}, interval {auto.interval_s} s; {args.rounds} round(s)",
          flush=True)
    print(f"machine: {platform.machine()}, {os.cpu_count()} CPUs, Python {platform.python_version()}, "
          f"{time.strftime('%Y-%m-%d %H:%M')}; {load()}; work folder {work}", flush=True)
    results = []
    try:
        print(f"server ready at {server.url} ({load()})", flush=True)
        for k, (requests, values) in enumerate(series):
            args.requests = requests
            res = run_series_model(args, [server.url], values + ["auto"], f"{requests} req", auto, model=model_name,
                                   extra_body={"ignore_eos": True} if args.dry else {},
                                   warm_up=k == 0 and not args.no_warm_up)
            results.append((requests, res))
            report_series(args, res, f"{label}, {requests} requests", auto)
    finally:
        report = server.shutdown()
        if report is not None:
            print(f"server stop: {report.verdict} in {report.total_s:.2f} s", flush=True)
    return 0


def parse_series(text: str) -> list[tuple[int, list[str]]]:
    """``"2048:256,512,1024;4096:512,1024"`` -> [(2048, ["256", "512", "1024"]), (4096, ["512", "1024"])]."""
    out = []
    for part in text.split(";"):
        n, _, values = part.strip().partition(":")
        out.append((int(n), [v.strip() for v in values.split(",") if v.strip()]))
    return out


def report_series(args: argparse.Namespace, res: dict, label: str, auto: AutoSettings) -> dict[str, float]:
    """The medians, auto against the best fixed value, the ramp, the verdict and the BENCH line."""
    out = summarize(res, label)
    best = str(int(out["best_fixed"]))
    ramps = [ramp_s(r["finished"], 0.9 * out["best_tok_s"], args.ramp_window) for r in res["auto"]]
    out["ramp_s"] = statistics.median(ramps)
    floor = 0.95 if args.requests >= 4096 else 0.90
    ok = out["ratio_tok_s"] >= floor and out["ratio_p50"] <= 1.2 and out["ramp_s"] <= 15.0
    print(f"  auto's ramp to 90 % of fixed {best}'s tok/s (trailing {args.ramp_window:.0f} s of answers): "
          f"{', '.join(f'{r:.1f} s' for r in ramps)}")
    # The same measure of every fixed arm, for scale: answers come in waves one answer latency
    # apart, so no setting can show its tok/s in answers before its first wave is back.
    for name, runs in res.items():
        if name != "auto":
            own = [ramp_s(r["finished"], 0.9 * out["best_tok_s"], args.ramp_window) for r in runs]
            print(f"  fixed {name}'s own ramp by the same measure: {', '.join(f'{r:.1f} s' for r in own)}")
    print(f"  target: auto >= x{floor:.2f} best fixed tok/s, p50 <= x1.2, ramp <= 15 s: {'met' if ok else 'MISSED'}")
    print("BENCH autoconc_gpu " + " ".join(f"{k}={v:.3f}" for k, v in out.items())
          + f" met={int(ok)} dry={int(args.dry)} sim={int(args.sim)} start={auto.start} requests={args.requests}"
          f" max_tokens={args.max_tokens} load1={os.getloadavg()[0]:.2f}", flush=True)
    return out


def ramp_s(finished: list[tuple[float, int]], rate: float, window: float) -> float:
    """Seconds from the first request until the answers' tok/s over the trailing ``window`` first
    reaches ``rate`` (inf: never)."""
    done = sorted(finished)
    tokens = 0
    lo = 0
    for t, n in done:
        tokens += n
        while done[lo][0] < t - window:
            tokens -= done[lo][1]
            lo += 1
        if t >= window and tokens / window >= rate:
            return t
        if t < window and tokens / window >= rate:  # a full window's worth before the window is over
            return t
    return float("inf")


class SimServer:
    """``bench/sim_engine.py`` as a child process, modelled on the H200 (see the module docstring)."""

    def __init__(self, args: argparse.Namespace):
        import subprocess

        argv = [sys.executable, str(Path(__file__).with_name("sim_engine.py")), "--port", "0",
                "--token-latency", "0.05", "--step-per-seq", "0.00019", "--max-batch", str(args.sim_batch),
                "--no-metrics", "--stream-cost", str(args.sim_stream_cost)]
        self.proc = subprocess.Popen(argv, stdout=subprocess.PIPE, text=True)
        line = self.proc.stdout.readline() if self.proc.stdout else ""
        if not line.startswith("listening on "):
            self.proc.kill()
            raise RuntimeError(f"sim_engine did not start: {line!r}")
        self.url = "http://" + line.split()[-1]

    def shutdown(self) -> None:
        self.proc.terminate()  # our own child, by its pid
        try:
            self.proc.wait(timeout=10)
        except Exception:  # noqa: BLE001
            self.proc.kill()
            self.proc.wait(timeout=10)


if __name__ == "__main__":
    sys.exit(main())
