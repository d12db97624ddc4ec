"""`concurrency = "auto"` against a fixed sweep on a GPU: `transformers serve`, same server, same run.

    python bench/autoconc_gpu.py --model DIR [--gpu 0] [--requests 512] [--max-tokens 128]
                                 [--fixed 4,16,64,128,256,512] [--rounds 1]
    python bench/autoconc_gpu.py --dry            # a short run of the same code on vLLM CPU (tiny model)

For the GPU machine (see ``saturation_gpu.py``): ``transformers serve DIR --continuous-batching``
(a random 1B Llama from ``make_tiny_model.py DIR --size 1b``) is launched and stopped by harvest's
``Server``; after one untimed warm-up pass at the real size, every fixed concurrency of ``--fixed``
and ``auto`` send the same ``--requests`` chat requests through harvest's client, the order
reversed every other round. ``transformers serve`` has no ``/metrics`` (404), so ``auto`` steers on
its answers alone (tok/s and latency per output token); it also rejects unknown fields, so there is
no ``ignore_eos`` and tok/s counts the completion tokens the server reports.

Printed per run: tok/s, p50 / p90 latency, failures (the server drops connections at very high
concurrency: those count as failed), and auto's target over time; then the medians, auto against
the best fixed value (target: tok/s >= x0.98 with p50 <= x1.2) and against fixed 64, and a
``BENCH autoconc_gpu`` line.

``--dry`` runs the same sweep on a vLLM CPU server with the tiny model (a few requests, two fixed
values), to check the script end to end on a machine without a GPU.
"""

from __future__ import annotations

import argparse
import os
import platform
import sys
import tempfile
import time
from pathlib import Path

from autoconc import run_series_model, summarize  # bench/autoconc.py
from benchutil import exit_on_sigterm, load  # bench/benchutil.py

from harvest.client.autoconc import AutoSettings


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", help="model folder (make_tiny_model.py DIR --size 1b); not needed with --dry")
    ap.add_argument("--python", help="Python that runs transformers serve (default: this one)")
    ap.add_argument("--gpu", type=int, default=0, help="GPU index (default 0)")
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--requests", type=int, default=512)
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--fixed", default="4,16,64,128,256,512")
    ap.add_argument("--rounds", type=int, default=1)
    ap.add_argument("--max-concurrency", type=int, default=512)
    ap.add_argument("--interval", type=float, default=1.0, help="seconds per control step of auto")
    ap.add_argument("--cuda-graph", action="store_true", help="pass --cb-use-cuda-graph to the server")
    ap.add_argument("--force", action="store_true", help="launch even if harvest's preflight fails")
    ap.add_argument("--keep", type=Path, help="work folder to keep (default: a temporary one)")
    ap.add_argument("--dry", action="store_true", help="a short run on vLLM CPU with the tiny model instead")
    ap.add_argument("--engine-python", help="with --dry: Python of vLLM's CPU build")
    args = ap.parse_args(argv)
    if not args.dry and not args.model:
        ap.error("--model is required (or --dry)")

    exit_on_sigterm()
    work = args.keep or Path(tempfile.mkdtemp(prefix="harvest-autoconc-gpu-"))
    work.mkdir(parents=True, exist_ok=True)
    auto = AutoSettings(start=8, max_concurrency=args.max_concurrency, interval_s=args.interval)
    fixed = [s.strip() for s in args.fixed.split(",") if s.strip()]
    if args.dry:
        from autoconc import start_vllm
        from saturation import SERVED_NAME, engine_python

        from harvest.campaign.demo import ensure_tiny_model

        py = engine_python(args.engine_python)
        model_path = str(ensure_tiny_model(py))
        args.requests, args.max_tokens, fixed = min(args.requests, 48), min(args.max_tokens, 8), ["4", "64"]
        server = start_vllm(py, model_path, work, "dry", None)
        model_name, label = SERVED_NAME, "dry run on vLLM CPU (tiny model)"
    else:
        from saturation_gpu import start_server

        model_path = str(Path(args.model).resolve())
        server = start_server(args, model_path, work)
        model_name, label = model_path, f"transformers serve {Path(model_path).name} (GPU {args.gpu}, {args.dtype})"
    print(f"auto concurrency on {label}: {args.requests} requests x {args.max_tokens} tokens, fixed "
          f"{','.join(fixed)} and auto (start {auto.start}, interval {auto.interval_s} s), {args.rounds} round(s)",
          flush=True)
    print(f"machine: {platform.machine()}, {os.cpu_count()} CPUs, Python {platform.python_version()}, "
          f"{time.strftime('%Y-%m-%d %H:%M')}; {load()}; work folder {work}", flush=True)
    try:
        print(f"server ready at {server.url} ({load()})", flush=True)
        res = run_series_model(args, [server.url], fixed + ["auto"], "gpu", auto, model=model_name,
                               extra_body={"ignore_eos": True} if args.dry else {}, warm_up=True)
    finally:
        report = server.shutdown()
        if report is not None:
            print(f"server stop: {report.verdict} in {report.total_s:.2f} s", flush=True)
    out = summarize(res, label)
    ok = out["ratio_tok_s"] >= 0.98 and out["ratio_p50"] <= 1.2
    print(f"  target: auto >= x0.98 best fixed tok/s with p50 <= x1.2: {'met' if ok else 'MISSED'}")
    print("BENCH autoconc_gpu " + " ".join(f"{k}={v:.3f}" for k, v in out.items())
          + f" met={int(ok)} dry={int(args.dry)} requests={args.requests} max_tokens={args.max_tokens}"
          f" load1={os.getloadavg()[0]:.2f}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
