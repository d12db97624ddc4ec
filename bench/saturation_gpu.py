"""P1 on a GPU: `harvest run` generation tok/s against a plain asyncio loop on `transformers serve`.

    python bench/saturation_gpu.py --model DIR [--gpu 0] [--requests 256] [--concurrency 64]
                                   [--max-tokens 256] [--rounds 2]

For the GPU machine, where vLLM and SGLang cannot be installed: ``transformers serve DIR
--continuous-batching`` (a random 1B Llama from ``make_tiny_model.py DIR --size 1b``) is launched
and stopped through harvest's ``Server`` (engine ``transformers``; readiness on ``/health`` only),
and the same prompts go through it, alternating (A B, B A, A B, ...):

    raw-loop   a plain aiohttp + semaphore loop, non-streaming, in a fresh process
    harvest    ``harvest run job.toml`` in a fresh process, its ``[server]`` an ``openai`` endpoint at
               that server with the model name given explicitly (``/v1/models`` answers 500 for
               minutes after start-up), a fresh run folder each round

Both send chat completions only, with the model name, ``max_tokens``, temperature 0, and the same
concurrency. ``transformers serve`` rejects unknown fields (422), so there is no ``ignore_eos``:
tok/s counts the completion tokens the server reports. Window: the raw loop's first request sent to
last response; harvest's from its ledger (first request sent = a result's commit time minus that
request's latency, to the last result committed), as in ``saturation.py``.

Prints ``BENCH`` lines: the tok/s of both, their ratio, the load average, and the verified stop of
the server (its StopReport, also written to ``stop-report.json`` in the work folder).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import saturation  # bench/saturation.py: the script's folder is on sys.path
from benchutil import exit_on_sigterm, load  # bench/benchutil.py
from saturation import children_cpu, ledger_window, rate, run_raw_loop, write_prompts


def write_job(path: Path, *, prompts: Path, url: str, model: str, run_dir: Path, max_tokens: int,
              concurrency: int) -> None:
    q = json.dumps
    path.write_text(
        "[server]\n"
        'engine = "openai"\n'
        f"base_url = {q(url)}\n"
        f"served_model_name = {q(model)}\n\n"
        "[data]\n"
        f"path = {q(str(prompts))}\n"
        'shape = "sharegpt"\n'
        'id_field = "id"\n\n'
        "[sampling]\n"
        f"max_tokens = {max_tokens}\n"
        "temperature = 0.0\n"
        "top_p = 1.0\n\n"
        "[client]\n"
        f"concurrency = {concurrency}\n"
        "max_retries = 3\n"
        "health_deadline = 120\n\n"
        "[run]\n"
        'reasoning = "none"\n\n'
        "[output]\n"
        f"dir = {q(str(run_dir))}\n"
    )


def run_harvest(args: argparse.Namespace, url: str, model: str, prompts: Path, out: Path, tag: str) -> dict:
    run_dir = out / f"harvest-{tag}"
    job = out / f"job-{tag}.toml"
    write_job(job, prompts=prompts, url=url, model=model, run_dir=run_dir, max_tokens=args.max_tokens,
              concurrency=args.concurrency)
    load_before = load()
    cpu0 = children_cpu()
    t0 = time.perf_counter()
    done = subprocess.run([sys.executable, "-m", "harvest", "run", str(job), "--no-live"], check=False,
                          capture_output=True,
                          text=True, timeout=args.timeout, cwd=out)
    wall = time.perf_counter() - t0
    cpu = children_cpu() - cpu0
    (out / f"harvest-{tag}.log").write_text(done.stdout + done.stderr)
    if done.returncode != 0:
        raise RuntimeError(f"harvest run failed (exit {done.returncode}):\n{(done.stdout + done.stderr)[-3000:]}")
    figures = ledger_window(run_dir)
    figures.update(command_s=wall, client_cpu_s=cpu, load_before=load_before, load_after=load())
    return figures


def start_server(args: argparse.Namespace, model: str, work: Path):
    """harvest's supervised launch of ``transformers serve``; retried when the port was taken."""
    import socket

    from harvest.config import ServerConfig
    from harvest.errors import LaunchError
    from harvest.server import Server

    last: Exception | None = None
    for attempt in range(3):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        extra = ["--cb-use-cuda-graph"] if args.cuda_graph else []
        if args.gpu is None:
            extra += ["--device", "cpu"]  # the adapter's "auto" needs accelerate; the last --device wins
        cfg = ServerConfig(engine="transformers", model=model, python=args.python or sys.executable, port=port,
                           gpus=[args.gpu] if args.gpu is not None else [], dtype=args.dtype, extra_args=extra,
                           env={"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}, ready_timeout=900.0,
                           stop_grace=30.0, stop_deadline=90.0)
        server = Server(cfg, run_dir=work / f"server-{attempt}", force=args.force)
        try:
            return server.launch()
        except LaunchError as exc:
            last = exc
            if "address already in use" not in str(exc).lower():
                raise
    raise RuntimeError(f"could not start transformers serve: {last}")



def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", required=True, help="model folder (make_tiny_model.py DIR --size 1b)")
    ap.add_argument("--python", help="Python that runs transformers serve (default: this one)")
    ap.add_argument("--gpu", type=int, default=0, help="GPU index (default 0); -1 for none (CPU smoke test)")
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--requests", type=int, default=256)
    ap.add_argument("--max-tokens", type=int, default=256)
    ap.add_argument("--concurrency", type=int, default=64)
    ap.add_argument("--rounds", type=int, default=2, help="pairs of runs, alternating raw-loop and harvest")
    ap.add_argument("--cuda-graph", action="store_true", help="pass --cb-use-cuda-graph to the server")
    ap.add_argument("--force", action="store_true", help="launch even if harvest's preflight fails")
    ap.add_argument("--timeout", type=float, default=1800.0, help="seconds one run may take")
    ap.add_argument("--keep", type=Path, help="work folder to keep (default: a temporary one)")
    args = ap.parse_args(argv)
    if args.gpu is not None and args.gpu < 0:
        args.gpu = None

    exit_on_sigterm()
    model = str(Path(args.model).resolve())
    work = args.keep or Path(tempfile.mkdtemp(prefix="harvest-p1gpu-"))
    work.mkdir(parents=True, exist_ok=True)
    prompts = work / "prompts.json"
    write_prompts(prompts, args.requests)
    print(f"P1 GPU saturation: {args.requests} requests, max_tokens {args.max_tokens}, concurrency "
          f"{args.concurrency}, {args.rounds} rounds; transformers serve --continuous-batching {Path(model).name} "
          f"(GPU {args.gpu}, {args.dtype})", flush=True)
    print(f"machine: {platform.machine()}, {os.cpu_count()} CPUs, Python {platform.python_version()}, "
          f"{time.strftime('%Y-%m-%d %H:%M')}; {load()}; work folder {work}", flush=True)

    t0 = time.monotonic()
    server = start_server(args, model, work)
    results: dict[str, list[dict]] = {"raw-loop": [], "harvest": []}
    report = None
    try:
        print(f"server ready at {server.url} after {time.monotonic() - t0:.1f} s ({load()})", flush=True)
        # The first requests set up continuous batching (its paged cache, kernels for each batch
        # shape): one untimed pass at the real size, so that neither side pays that. A pass with
        # 16 tokens was not enough on the H200: the first timed round still ran at half speed.
        w = run_raw_loop(args, server.url, prompts, work, "warmup", model=model, extra={})
        print(f"warm-up: {w['completed']} requests in {w['command_s']:.1f} s", flush=True)
        for k in range(args.rounds):
            for kind in (("raw-loop", "harvest") if k % 2 == 0 else ("harvest", "raw-loop")):
                if kind == "raw-loop":
                    r = run_raw_loop(args, server.url, prompts, work, str(k), model=model, extra={})
                else:
                    r = run_harvest(args, server.url, model, prompts, work, str(k))
                results[kind].append(r)
                print(f"  round {k} {kind:<9} {rate(r):9.1f} tok/s  ({r['tokens']} tokens in {r['window_s']:.2f} s;"
                      f" command {r['command_s']:.2f} s; client CPU {r['client_cpu_s']:.1f} s; {r['completed']} done,"
                      f" {r['failed']} failed{saturation.retried(r)}; {r['load_before']} -> {r['load_after']})",
                      flush=True)
    finally:
        report = server.shutdown()
        if report is not None:
            (work / "stop-report.json").write_text(json.dumps(report.to_dict(), indent=1))
            steps = ", ".join(f"{s.name} {s.duration_s:.3f} s" for s in report.steps)
            print(f"server stop: {report.verdict} in {report.total_s:.2f} s ({steps}); escalated "
                  f"{report.escalated}; GPU MiB baseline {report.baseline_mib} final {report.final_mib}"
                  + (f"; problems: {'; '.join(report.problems)}" if report.problems else ""), flush=True)

    h = statistics.median(rate(r) for r in results["harvest"])
    b = statistics.median(rate(r) for r in results["raw-loop"])
    pairs = [rate(a) / rate(c) for a, c in zip(results["harvest"], results["raw-loop"])]
    print(f"\nmedians: harvest {h:.1f} tok/s, raw loop {b:.1f} tok/s; ratio x{h / b:.3f} (per round: "
          f"{', '.join(f'x{p:.3f}' for p in pairs)}); target >= x0.97: {'met' if h / b >= 0.97 else 'MISSED'}; "
          f"{load()}")
    print(f"BENCH p1_gpu_saturation harvest_tok_s={h:.1f} raw_loop_tok_s={b:.1f} ratio={h / b:.3f} "
          f"requests={args.requests} concurrency={args.concurrency} max_tokens={args.max_tokens} "
          f"load1={os.getloadavg()[0]:.2f}")
    if report is not None:
        print(f"BENCH p1_gpu_stop verdict={report.verdict} total_s={report.total_s:.3f} escalated={report.escalated} "
              f"final_mib={json.dumps({str(k): v for k, v in report.final_mib.items()})}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
