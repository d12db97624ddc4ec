"""P6 Ray scaling: one `harvest run` over N simulated engines placed as Ray actors.

    python bench/ray_scale.py [--servers 1,2,4,8] [--rounds 2] [--seconds 20]
                              [--token-latency 0.05] [--max-batch 8] [--output-tokens 32]

Starts a local Ray instance of its own (``ray.init(address="local")``: never an existing cluster,
dashboard off, a small object store) and places the largest N simulated engines
(``bench/sim_engine.py``: a fixed per-token latency and a maximum batch) as Ray actors, one engine
per actor; each actor starts its engine as a subprocess in its own process group and reports its
endpoint. For each N (rotating order per round: 1 2 4 8, then 8 4 2 1, ...) the real ``harvest
run JOB.toml --no-live`` drives a fresh JSON Lines dataset over the first N endpoints (``[client]
endpoints``, concurrency ``--queue-factor`` (2) x batch per endpoint, so every engine keeps a full
batch and a queue),
with ``--seconds`` of work per engine. While it runs the benchmark samples, twice a second, every
engine's ``/metrics`` counters (generated tokens, finished requests) and the CPU time of the
``harvest run`` process (psutil, with its children); the steady window is from 10 % to 90 % of the
items finished, so the driver's start-up and the tail are outside it. Reported per N:

    aggregate generation tok/s (steady window)    against N x the N = 1 figure of the same round
    driver CPU ms per request (steady window)     against the N = 1 figure of the same round
    whole-command figures (start-up and tail included), the load average

Each engine's ceiling is ``max_batch / token_latency`` tokens/s; the defaults keep the aggregate
request rate at N = 8 well below what harvest's client does on one core (P2), so that what is
measured is harvest's scaling, not this two-core machine. The driver's per-request cost is printed
so that the plan for many nodes (BENCHMARKS.md) can use it.

Placement: this script places the actors itself (:func:`place_engines`). Once ``[cluster] backend =
"ray"`` exists, the same measurement is a job with ``[cluster] servers = N`` and a ``[server] engine
= "command"`` running ``sim_engine.py``; only :func:`place_engines` and the job writer change.

Ray workers import what they need from this folder (the actor class is defined here and pickled by
value); ``PYTHONPATH`` in the ``runtime_env`` makes harvest's own source importable there too. Cleanup:
every engine is stopped by its actor (SIGTERM to its process group, SIGKILL after a grace), then
killed here by (pid, create time) if it still runs, then ``ray.shutdown()`` ends the processes this
script's ``ray.init`` started. Nothing is stopped by name; every wait is bounded.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import aiohttp
import psutil
from benchutil import exit_on_sigterm, load  # bench/benchutil.py
from sim_engine import parse_metrics  # bench/sim_engine.py

HERE = Path(__file__).resolve().parent
SRC = HERE.parent / "src"


# ------------------------------------------------------------------------------------- placement

class EngineActor:
    """One simulated engine in a Ray actor: started as a subprocess (own process group) on the
    actor's node, stopped by its pid and group. Wrapped with ``ray.remote`` in :func:`place_engines`."""

    def __init__(self) -> None:
        self.proc: subprocess.Popen[str] | None = None

    def start(self, argv: list[str], timeout: float) -> dict[str, Any]:
        import queue
        import threading

        import ray

        self.proc = subprocess.Popen(argv, stdout=subprocess.PIPE, text=True, start_new_session=True)
        lines: queue.Queue[str] = queue.Queue()
        threading.Thread(target=lambda: lines.put(self.proc.stdout.readline()), daemon=True).start()  # type: ignore[union-attr]
        try:
            line = lines.get(timeout=timeout)
        except queue.Empty:
            self.stop(5.0)
            raise RuntimeError(f"the engine did not report its port within {timeout:g} s") from None
        if not line.startswith("listening on "):
            self.stop(5.0)
            raise RuntimeError(f"the engine did not start: {line!r}")
        ctx = ray.get_runtime_context()
        return {"url": "http://" + line.split("listening on ", 1)[1].strip(), "pid": self.proc.pid,
                "create_time": psutil.Process(self.proc.pid).create_time(), "node_id": ctx.get_node_id(),
                "ip": ray.util.get_node_ip_address(), "actor_pid": os.getpid()}

    def stop(self, grace: float) -> int | None:
        import signal

        proc = self.proc
        if proc is None:
            return None
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(timeout=grace)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(timeout=grace)
        return proc.returncode


def start_ray(num_cpus: int) -> Any:
    import ray

    return ray.init(address="local", num_cpus=num_cpus, include_dashboard=False, log_to_driver=False,
                    object_store_memory=80 * 1024 * 1024, configure_logging=False,
                    runtime_env={"env_vars": {"PYTHONPATH": os.pathsep.join([str(SRC), str(HERE)])}})


def place_engines(n: int, args: argparse.Namespace, *, batch: int | None = None) -> tuple[list[Any], list[dict[str, Any]]]:
    """``n`` actors (one CPU each), each running one simulated engine of ``batch``; their handles and
    endpoints. With ``[cluster] backend = "ray"`` this is what the run's cluster backend does instead."""
    import ray

    actor_cls = ray.remote(num_cpus=1, max_restarts=0)(EngineActor)
    argv = [sys.executable, str(HERE / "sim_engine.py"), "--port", "0", "--token-latency", str(args.token_latency),
            "--max-batch", str(batch or args.max_batch), "--output-tokens", str(args.output_tokens)]
    actors = [actor_cls.remote() for _ in range(n)]
    infos = ray.get([a.start.remote(argv, 60.0) for a in actors], timeout=args.place_timeout)
    return actors, infos


def stop_engines(actors: list[Any], infos: list[dict[str, Any]]) -> None:
    """Each actor stops its engine; an engine still alive after that is killed by (pid, create time)."""
    import ray

    try:
        ray.get([a.stop.remote(5.0) for a in actors], timeout=30)
    except Exception as exc:  # noqa: BLE001 - the pid check below still runs
        print(f"  actors did not stop their engines: {exc!r}", file=sys.stderr)
    for info in infos:
        try:
            p = psutil.Process(info["pid"])
            if abs(p.create_time() - info["create_time"]) < 0.01:
                p.kill()
                p.wait(timeout=5)
        except psutil.NoSuchProcess:
            pass
    for a in actors:
        ray.kill(a)


# ------------------------------------------------------------------------------------- one run

def write_job(out: Path, tag: str, urls: list[str], items: int, args: argparse.Namespace, *, batch: int) -> Path:
    data = out / f"prompts-{tag}.jsonl"
    with data.open("w") as fh:
        for i in range(items):
            fh.write(json.dumps({"id": f"{tag}-{i}", "prompt": f"Item {i} of {tag}: say something short."}) + "\n")
    q = json.dumps
    job = out / f"job-{tag}.toml"
    job.write_text(
        f"[data]\npath = {q(str(data))}\nid_field = \"id\"\n\n"
        f"[sampling]\nmax_tokens = {2 * args.output_tokens}\ntemperature = 0.0\n\n"
        f"[client]\nendpoints = [{', '.join(q(u) for u in urls)}]\n"
        f"concurrency = {args.queue_factor * batch * len(urls)}\nmax_retries = 3\nhealth_deadline = 60\n\n"
        "[run]\nreasoning = \"none\"\nprogress_interval = 5.0\n\n"
        f"[output]\ndir = {q(str(out / f'run-{tag}'))}\n")
    return job


async def _sample(urls: list[str]) -> tuple[float, float]:
    """Generated tokens and finished requests, summed over the engines' /metrics."""
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=5)) as session:
        async def one(url: str) -> dict[str, float]:
            async with session.get(url + "/metrics") as resp:
                return parse_metrics(await resp.text())

        docs = await asyncio.gather(*(one(u) for u in urls))
    return (sum(d["vllm:generation_tokens_total"] for d in docs), sum(d["vllm:request_success_total"] for d in docs))


def _cpu(proc: psutil.Process) -> tuple[float, float]:
    """User and system CPU seconds of ``proc`` and its children."""
    t = proc.cpu_times()
    return t.user + t.children_user, t.system + t.children_system


def run_once(urls: list[str], out: Path, tag: str, args: argparse.Namespace, *, batch: int | None = None,
             items: int | None = None) -> dict[str, Any]:
    """One `harvest run` over ``urls`` (engines of ``batch``); steady-window and whole-command figures."""
    batch = batch or args.max_batch
    per_engine = int(args.seconds * batch / (args.token_latency * args.output_tokens))
    items = items or per_engine * len(urls)
    job = write_job(out, tag, urls, items, args, batch=batch)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(args.src), os.environ.get("PYTHONPATH", "")])}
    tokens0, done0 = asyncio.run(_sample(urls))
    load_before = os.getloadavg()[0]
    log = (out / f"harvest-{tag}.log").open("w")
    t0 = time.monotonic()
    proc = subprocess.Popen([sys.executable, "-m", "harvest", "run", str(job), "--no-live"], stdout=log,
                            stderr=subprocess.STDOUT, env=env, cwd=out)
    ps = psutil.Process(proc.pid)
    samples: list[tuple[float, float, float, float, float]] = []  # (time, tokens, requests, user, sys)
    cpu_last = (0.0, 0.0)
    try:
        deadline = t0 + args.timeout
        while proc.poll() is None:
            if time.monotonic() > deadline:
                raise RuntimeError(f"harvest run {tag} did not finish within {args.timeout:g} s")
            try:
                cpu_last = _cpu(ps)
            except psutil.NoSuchProcess:
                break
            tokens, done = asyncio.run(_sample(urls))
            samples.append((time.monotonic(), tokens - tokens0, done - done0, *cpu_last))
            time.sleep(0.5)
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait(timeout=30)
        log.close()
    wall = time.monotonic() - t0
    if proc.returncode != 0:
        raise RuntimeError(f"harvest run {tag} failed (exit {proc.returncode}); see {out / f'harvest-{tag}.log'}")
    tokens, done = asyncio.run(_sample(urls))
    tokens, done = tokens - tokens0, done - done0
    lo = next(s for s in samples if s[2] >= 0.1 * items)
    hi = next((s for s in samples if s[2] >= 0.9 * items), samples[-1])
    span = hi[0] - lo[0]
    requests = max(1.0, hi[2] - lo[2])
    return {
        "servers": len(urls), "items": items, "finished": done, "tokens": tokens, "command_s": wall,
        "tok_s": (hi[1] - lo[1]) / span, "req_s": (hi[2] - lo[2]) / span,
        "cpu_ms_per_req": 1000 * (hi[3] + hi[4] - lo[3] - lo[4]) / requests,
        "sys_ms_per_req": 1000 * (hi[4] - lo[4]) / requests,
        "whole_cpu_ms_per_req": 1000 * sum(cpu_last) / max(1.0, done),
        "whole_tok_s": tokens / wall, "window_s": span, "load_before": load_before, "load_after": os.getloadavg()[0],
    }


# ------------------------------------------------------------------------------------- main

def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="P6: harvest over N simulated engines placed as Ray actors")
    parser.add_argument("--servers", default="1,2,4,8", help="comma-separated values of N")
    parser.add_argument("--rounds", type=int, default=2, help="rounds over every N, order reversed each round")
    parser.add_argument("--seconds", type=float, default=20.0, help="seconds of work per engine and run")
    parser.add_argument("--token-latency", type=float, default=0.05, help="the engines' seconds per decode step")
    parser.add_argument("--max-batch", type=int, default=8, help="the engines' batch")
    parser.add_argument("--output-tokens", type=int, default=32, help="tokens per answer (max_tokens is 2x)")
    parser.add_argument("--queue-factor", type=int, default=2,
                        help="harvest's concurrency per engine, in batches (2: a full batch and as many queued)")
    parser.add_argument("--place-timeout", type=float, default=180.0, help="seconds to place all actors")
    parser.add_argument("--timeout", type=float, default=600.0, help="seconds one harvest run may take")
    parser.add_argument("--no-control", dest="control", action="store_false",
                        help="skip the control run (one engine of N_max x batch, the same aggregate rate)")
    parser.add_argument("--src", type=Path, default=SRC,
                        help="the harvest source `harvest run` is driven with (default: this checkout's; another "
                             "folder compares a change)")
    parser.add_argument("--keep", type=Path, default=None, help="keep jobs, logs and run folders here")
    args = parser.parse_args(argv)
    ns = sorted({int(x) for x in args.servers.split(",") if x.strip()})
    exit_on_sigterm()

    per_engine_tok = args.max_batch / args.token_latency
    print(f"P6 Ray scaling: engines of {args.max_batch} x {args.output_tokens} tokens at "
          f"{args.token_latency * 1000:g} ms/token (ceiling {per_engine_tok:.0f} tok/s, "
          f"{per_engine_tok / args.output_tokens:.1f} req/s each); N = {ns}, {args.rounds} rounds; {load()}",
          flush=True)
    out = args.keep or Path(tempfile.mkdtemp(prefix="ray-scale-"))
    out.mkdir(parents=True, exist_ok=True)
    import ray

    t0 = time.monotonic()
    start_ray(max(ns) + 2)
    actors: list[Any] = []
    infos: list[dict[str, Any]] = []
    runs: list[dict[str, Any]] = []
    big = max(ns)
    try:
        actors, infos = place_engines(big, args)
        if args.control:  # one engine as big as N_max of them: the same aggregate rate on one endpoint
            more, more_infos = place_engines(1, args, batch=big * args.max_batch)
            actors, infos = actors + more, infos + more_infos
        print(f"placed {len(actors)} actors in {time.monotonic() - t0:.1f} s (Ray start included): "
              + ", ".join(f"{i['url']} (node {i['node_id'][:8]} {i['ip']}, pid {i['pid']})" for i in infos),
              flush=True)
        for r in range(args.rounds):
            plan: list[Any] = list(ns) + (["1x"] if args.control else [])
            for n in plan if r % 2 == 0 else list(reversed(plan)):
                if n == "1x":
                    items = int(args.seconds * args.max_batch / (args.token_latency * args.output_tokens)) * big
                    res = run_once([infos[big]["url"]], out, f"r{r}-control", args, batch=big * args.max_batch,
                                   items=items)
                    res["servers"] = "1x"
                else:
                    res = run_once([i["url"] for i in infos[:n]], out, f"r{r}-n{n}", args)
                res["round"] = r
                runs.append(res)
                print(f"  round {r} N={n}: {res['tok_s']:8.0f} tok/s  {res['req_s']:6.1f} req/s  driver "
                      f"{res['cpu_ms_per_req']:.3f} CPU ms/req ({res['sys_ms_per_req']:.3f} system; whole command "
                      f"{res['whole_cpu_ms_per_req']:.3f})  {res['finished']:.0f}/{res['items']} in "
                      f"{res['command_s']:.1f} s  load {res['load_before']:.2f}->{res['load_after']:.2f}", flush=True)
    finally:
        if actors:
            stop_engines(actors, infos)
        ray.shutdown()
        if args.keep is None:
            import shutil

            shutil.rmtree(out, ignore_errors=True)
    return report(runs, ns, args)


def report(runs: list[dict[str, Any]], ns: list[int], args: argparse.Namespace) -> int:
    import ray

    med = statistics.median
    print(f"\nmachine: {platform.machine()}, {os.cpu_count()} CPUs, Python {platform.python_version()}, "
          f"Ray {ray.__version__}, {time.strftime('%Y-%m-%d %H:%M')}; {load()}\n")
    print(f"{'N':>4}{'tok/s':>10}{'N x one':>10}{'ratio':>8}{'req/s':>8}{'CPU ms/req':>12}{'system':>8}"
          f"{'vs one':>8}{'whole ms/req':>14}{'load1':>8}")
    bench = "BENCH p6_ray_scale"
    worst = float("inf")
    base = ns[0]
    for n in [*ns, *(["1x"] if args.control else [])]:
        mine = [x for x in runs if x["servers"] == n]
        ratios, cpu_ratios = [], []
        for x in mine:  # ratios within a round, then the median over rounds
            one = next(y for y in runs if y["servers"] == base and y["round"] == x["round"])
            width = max(ns) if n == "1x" else n
            ratios.append(x["tok_s"] / (width / base * one["tok_s"]))
            cpu_ratios.append(x["cpu_ms_per_req"] / one["cpu_ms_per_req"])
        tok, ratio, cpu_ratio = med(x["tok_s"] for x in mine), med(ratios), med(cpu_ratios)
        width = max(ns) if n == "1x" else n
        one_tok = med(y["tok_s"] for y in runs if y["servers"] == base)
        if n != "1x":
            worst = min(worst, ratio)
        cpu = med(x["cpu_ms_per_req"] for x in mine)
        label = f"1x{max(ns)}" if n == "1x" else str(n)
        print(f"{label:>4}{tok:>10.0f}{width / base * one_tok:>10.0f}{ratio:>8.3f}{med(x['req_s'] for x in mine):>8.1f}"
              f"{cpu:>12.3f}{med(x['sys_ms_per_req'] for x in mine):>8.3f}{cpu_ratio:>8.2f}"
              f"{med(x['whole_cpu_ms_per_req'] for x in mine):>14.3f}{med(x['load_after'] for x in mine):>8.2f}")
        bench += f" n{label}_tok_s={tok:.0f} n{label}_ratio={ratio:.3f} n{label}_cpu_ms={cpu:.3f}"
    print("(ratio: tok/s / (N x the N=1 figure of the same round); vs one: driver CPU per request / N=1's; "
          "median over rounds)")
    if args.control:
        print(f"1x{max(ns)}: one engine of {max(ns)} x {args.max_batch} slots, the N={max(ns)} request rate on "
              "one endpoint: the driver's cost at that rate without the extra endpoints")
    verdict = "met" if worst >= 0.9 else "MISSED"
    print(f"\naggregate >= 0.9 x N x one: {verdict} (worst ratio {worst:.3f})")
    print(bench + f" load1={os.getloadavg()[0]:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
