"""P2 client cost: how much CPU harvest's client spends per request, against the usual alternatives.

Starts ``bench/null_server.py`` (fixed reply, no model) as a subprocess, then runs each client in a
fresh subprocess against it with the same requests and concurrency, and prints requests/s, CPU
seconds per 1000 requests (user + system of the client process, all its threads) and the ratios of
harvest's requests per CPU second against the baselines measured in the same run:

    harvest          harvest.client.Client (aiohttp transport)
    harvest-uvloop   the same client on uvloop's event loop (``pip install -e .[fast]``; how
                     ``harvest run`` runs when uvloop is installed); not in the default set
    harvest-auto     the same client with ``concurrency = "auto"`` started at ``--concurrency`` (an
                     engine whose batch is known exactly, no /metrics) under a bound of 4x it, every
                     request asked for at once, so that thousands wait for room in the pool (the
                     auto arm of ``bench/autoconc.py``); not in the default set
    harvest-stream   the same client with ``[client] stream = true``: each answer streamed (seven token
                     events and a usage event), assembled and timed; not in the default set
    openai-async     a plain ``AsyncOpenAI`` + ``asyncio.Semaphore`` loop
    openai-threads   a thread pool of synchronous ``openai.OpenAI`` clients (one per thread)
    raw-aiohttp      a bare aiohttp loop: the floor for an aiohttp-based client
    raw-httpx        a bare httpx.AsyncClient loop: the alternative HTTP library (a competitor only:
                     harvest uses aiohttp throughout; httpx comes with the ``bench`` extra)
    harvest-base     ``harvest`` on another tree's code (``--base DIR``: ``DIR/src`` first on
                     ``PYTHONPATH``), in the same rounds: a change against the commit before it
    wrk              the loopback HTTP limit (``apt-get install wrk``; one thread, the same
                     connections, ``--wrk-seconds``; its CPU is measured as a reaped child's)

Run: ``python bench/client_cost.py [--requests 20000] [--concurrency 64] [--rounds 3] [--base DIR]``.
``--instructions`` counts instead the instructions each client (``harvest-base`` included) executes
per request under valgrind's callgrind (``apt-get install valgrind``): a figure the other work on a
shared machine does not move, where CPU seconds do (two runs of the worker, ``--requests`` apart,
the difference over ``--requests``; 1000 requests take about a minute). Needs the
``bench`` extra (``pip install -e .[bench]``). With ``--rounds`` every client (and wrk) runs once per
round, alternating, and the median round of each is shown with the load average it ran under. Every
subprocess it starts is stopped by its pid; every wait is bounded.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import queue
import resource
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import psutil
from benchutil import load, stop  # bench/benchutil.py

HERE = Path(__file__).resolve().parent
ALL_CLIENTS = ["harvest", "openai-async", "openai-threads", "raw-aiohttp", "raw-httpx"]
MESSAGES = [{"role": "user", "content": "Say hello."}]
MAX_TOKENS = 16
MODEL = "null-model"


# ---------------------------------------------------------------------------------------- workers

async def _harvest(base: str, n: int, concurrency: int) -> None:
    from harvest.client import Client
    from harvest.config import ClientConfig, SamplingConfig

    config = ClientConfig(concurrency=concurrency, max_retries=0, request_timeout=60)
    async with Client([base], config, SamplingConfig(max_tokens=MAX_TOKENS), model=MODEL) as client:
        await asyncio.gather(*(client.chat(MESSAGES) for _ in range(n)))


async def _harvest_stream(base: str, n: int, concurrency: int) -> None:
    """``[client] stream = true``: every answer streamed (one event per token, the usage event, as
    vLLM sends them), assembled and timed (TTFT, TPOT, ITL)."""
    from harvest.client import Client
    from harvest.config import ClientConfig, SamplingConfig

    config = ClientConfig(concurrency=concurrency, max_retries=0, request_timeout=60, stream=True)
    async with Client([base], config, SamplingConfig(max_tokens=MAX_TOKENS), model=MODEL) as client:
        answers = await asyncio.gather(*(client.chat(MESSAGES) for _ in range(n)))
    assert all(a.ttft_s is not None and a.completion_tokens == 7 for a in answers)


async def _harvest_auto(base: str, n: int, concurrency: int) -> None:
    """``concurrency = "auto"`` started at ``concurrency`` (an engine whose batch is known to be exactly
    that) under a ``max_concurrency`` of 4x it, every request asked for at once: the callers over the
    target, up to that bound, wait for room in the pool (the rest for a slot under the bound)."""
    from harvest.client import Client
    from harvest.client.autoconc import AutoSettings
    from harvest.client.engine import EngineLimit
    from harvest.config import ClientConfig, SamplingConfig

    config = ClientConfig(concurrency="auto", max_concurrency=4 * concurrency, max_retries=0, request_timeout=60,
                          auto_start=concurrency)
    auto = AutoSettings(max_concurrency=4 * concurrency, interval_s=1.0)
    async with Client([base], config, SamplingConfig(max_tokens=MAX_TOKENS), model=MODEL, auto=auto,
                      limits={base: EngineLimit(concurrency, exact=True, metrics=False)}) as client:
        await asyncio.gather(*(client.chat(MESSAGES) for _ in range(n)))


async def _openai_async(base: str, n: int, concurrency: int) -> None:
    import openai

    client = openai.AsyncOpenAI(base_url=base + "/v1", api_key="none", max_retries=0, timeout=60)
    sem = asyncio.Semaphore(concurrency)

    async def one() -> None:
        async with sem:
            await client.chat.completions.create(model=MODEL, messages=MESSAGES, max_tokens=MAX_TOKENS)

    await asyncio.gather(*(one() for _ in range(n)))
    await client.close()


def _openai_threads(base: str, n: int, concurrency: int) -> None:
    from concurrent.futures import ThreadPoolExecutor

    import openai

    local = threading.local()

    def one(_: int) -> None:
        client = getattr(local, "client", None)
        if client is None:
            client = local.client = openai.OpenAI(base_url=base + "/v1", api_key="none", max_retries=0, timeout=60)
        client.chat.completions.create(model=MODEL, messages=MESSAGES, max_tokens=MAX_TOKENS)

    with ThreadPoolExecutor(max_workers=concurrency) as pool:
        list(pool.map(one, range(n)))


async def _raw_aiohttp(base: str, n: int, concurrency: int) -> None:
    import aiohttp

    sem = asyncio.Semaphore(concurrency)
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=concurrency)) as session:
        async def one() -> None:
            body = json.dumps({"model": MODEL, "messages": MESSAGES, "max_tokens": MAX_TOKENS}).encode()
            async with sem:
                async with session.post(base + "/v1/chat/completions", data=body,
                                        headers={"Content-Type": "application/json"}) as resp:
                    json.loads(await resp.read())

        await asyncio.gather(*(one() for _ in range(n)))


async def _raw_httpx(base: str, n: int, concurrency: int) -> None:
    import httpx

    sem = asyncio.Semaphore(concurrency)
    limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)
    async with httpx.AsyncClient(limits=limits, timeout=httpx.Timeout(60.0)) as client:
        async def one() -> None:
            body = json.dumps({"model": MODEL, "messages": MESSAGES, "max_tokens": MAX_TOKENS}).encode()
            async with sem:
                resp = await client.post(base + "/v1/chat/completions", content=body,
                                         headers={"Content-Type": "application/json"})
                resp.json()

        await asyncio.gather(*(one() for _ in range(n)))


def _cpu(proc: psutil.Process) -> float:
    times = proc.cpu_times()
    return times.user + times.system


def worker(kind: str, base: str, n: int, warmup: int, concurrency: int, server_pid: int) -> dict[str, float]:
    """Run ``warmup`` then ``n`` requests with one client kind; time and CPU (client's and the
    server's) of the ``n`` only."""
    server = psutil.Process(server_pid)
    runners = {"harvest": _harvest, "openai-async": _openai_async, "raw-aiohttp": _raw_aiohttp,
               "raw-httpx": _raw_httpx, "harvest-uvloop": _harvest, "harvest-auto": _harvest_auto,
               "harvest-stream": _harvest_stream}
    if kind == "harvest-uvloop":
        import uvloop  # the ``fast`` extra

        uvloop.run(_harvest(base, warmup, concurrency))
        wall0, cpu0, server0 = time.perf_counter(), time.process_time(), _cpu(server)
        uvloop.run(_harvest(base, n, concurrency))
    elif kind == "openai-threads":
        _openai_threads(base, warmup, concurrency)
        wall0, cpu0, server0 = time.perf_counter(), time.process_time(), _cpu(server)
        _openai_threads(base, n, concurrency)
    else:
        asyncio.run(runners[kind](base, warmup, concurrency))
        wall0, cpu0, server0 = time.perf_counter(), time.process_time(), _cpu(server)
        asyncio.run(runners[kind](base, n, concurrency))
    return {"wall_s": time.perf_counter() - wall0, "cpu_s": time.process_time() - cpu0, "requests": n,
            "server_cpu_s": _cpu(server) - server0}


# ---------------------------------------------------------------------------------------- driver

def start_null_server(timeout: float = 15.0) -> tuple[subprocess.Popen[str], str]:
    """Start the null server; return it and its base URL (it binds, then prints the port)."""
    proc = subprocess.Popen([sys.executable, str(HERE / "null_server.py"), "--port", "0"],
                            stdout=subprocess.PIPE, text=True)
    lines: queue.Queue[str] = queue.Queue()
    threading.Thread(target=lambda: lines.put(proc.stdout.readline() if proc.stdout else ""), daemon=True).start()
    try:
        line = lines.get(timeout=timeout)
    except queue.Empty:
        stop(proc)
        raise RuntimeError(f"null server did not report its port within {timeout:g} s") from None
    if not line.startswith("listening on "):
        stop(proc)
        raise RuntimeError(f"null server did not start: {line!r}")
    host_port = line.split("listening on ", 1)[1].strip()
    return proc, f"http://{host_port}"


def run_client(kind: str, base: str, args: argparse.Namespace, server_pid: int) -> dict[str, float]:
    env = None
    if kind == "harvest-base":  # harvest, on the code of the tree ``--base`` names
        env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(Path(args.base).resolve() / "src"),
                                                            *filter(None, [os.environ.get("PYTHONPATH")])])}
        kind = "harvest"
    cmd = [sys.executable, str(Path(__file__).resolve()), "--worker", kind, "--url", base,
           "--server-pid", str(server_pid), "--requests", str(args.requests), "--warmup", str(args.warmup),
           "--concurrency", str(args.concurrency)]
    done = subprocess.run(cmd, check=False, capture_output=True, text=True, timeout=args.timeout, env=env)
    if done.returncode != 0:
        raise RuntimeError(f"{kind} worker failed (exit {done.returncode}):\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def run_wrk(base: str, args: argparse.Namespace) -> dict[str, float] | None:
    """``wrk`` (one thread, the same connections) for ``--wrk-seconds``; its requests/s and CPU."""
    wrk = shutil.which("wrk")
    if wrk is None:
        return None
    body = json.dumps({"model": MODEL, "messages": MESSAGES, "max_tokens": MAX_TOKENS})
    script = ('wrk.method = "POST"\nwrk.headers["Content-Type"] = "application/json"\n'
              f"wrk.body = {json.dumps(body)}\n")
    with tempfile.NamedTemporaryFile("w", suffix=".lua", delete=False) as fh:
        fh.write(script)
    try:
        cpu0 = _children_cpu()
        done = subprocess.run([wrk, "-t1", f"-c{args.concurrency}", f"-d{args.wrk_seconds:g}s", "-s", fh.name,
                               base + "/v1/chat/completions"], check=False, capture_output=True, text=True,
                              timeout=args.wrk_seconds + 60)
        cpu = _children_cpu() - cpu0
    finally:
        os.unlink(fh.name)
    requests = errors = None
    for line in done.stdout.splitlines():
        line = line.strip()
        if " requests in " in line:
            requests = int(line.split()[0])
        elif line.startswith(("Non-2xx or 3xx responses:", "Socket errors:")):
            errors = line
    for line in done.stdout.splitlines():
        if line.startswith("Requests/sec:"):
            out = {"req_s": float(line.split()[1]), "cpu_s": cpu, "requests": float(requests or 0)}
            if errors:
                print(f"  wrk reported: {errors}", file=sys.stderr)
            return out
    raise RuntimeError(f"wrk printed no Requests/sec (exit {done.returncode}):\n{done.stdout}{done.stderr}")


def run_instructions(kind: str, base: str, args: argparse.Namespace, server_pid: int) -> float:
    """Instructions per request of one client kind, counted by callgrind: the worker at ``--warmup``
    requests and at ``--warmup + --requests`` (the same start-up and warm-up in both), the difference
    over ``--requests``."""
    valgrind = shutil.which("valgrind")
    if valgrind is None:
        raise SystemExit("--instructions needs valgrind (apt-get install valgrind)")
    env = None
    if kind == "harvest-base":
        env = {**os.environ, "PYTHONPATH": str(Path(args.base).resolve() / "src")}
    counts = []
    for n in (args.warmup, args.warmup + args.requests):
        cmd = [valgrind, "--tool=callgrind", "--callgrind-out-file=/dev/null", sys.executable,
               str(Path(__file__).resolve()), "--worker", "harvest" if kind == "harvest-base" else kind, "--url", base,
               "--server-pid", str(server_pid), "--requests", str(n), "--warmup", str(args.warmup),
               "--concurrency", str(args.concurrency)]
        done = subprocess.run(cmd, check=False, capture_output=True, text=True, timeout=args.timeout, env=env)
        found = [line for line in done.stderr.splitlines() if "Collected :" in line]
        if done.returncode != 0 or not found:
            raise RuntimeError(f"{kind} under callgrind failed (exit {done.returncode}):\n{done.stderr[-3000:]}")
        counts.append(int(found[-1].split("Collected :", 1)[1].strip()))
    return (counts[1] - counts[0]) / args.requests


def _children_cpu() -> float:
    """User + system CPU seconds of the child processes reaped so far."""
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime



def _median(runs: list[dict[str, float]]) -> dict[str, float]:
    """The run with the median requests/s (a real run, so its CPU and wall belong together)."""
    ranked = sorted(runs, key=lambda r: r["requests"] / r["wall_s"] if "wall_s" in r else r["req_s"])
    return ranked[len(ranked) // 2]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="P2: client CPU cost per request against a null server")
    parser.add_argument("--requests", type=int, default=20000)
    parser.add_argument("--warmup", type=int, default=1000)
    parser.add_argument("--concurrency", type=int, default=64)
    parser.add_argument("--clients", default=",".join(ALL_CLIENTS), help="comma-separated subset of " + ",".join(ALL_CLIENTS))
    parser.add_argument("--timeout", type=float, default=600.0, help="seconds one client run may take")
    parser.add_argument("--rounds", type=int, default=1, help="runs of every client, alternating (A B A B)")
    parser.add_argument("--wrk-seconds", type=float, default=10.0, help="duration of each wrk run")
    parser.add_argument("--no-wrk", action="store_true", help="skip wrk even when it is installed")
    parser.add_argument("--base", default=None, help="another tree (DIR/src first on PYTHONPATH: "
                        "`git archive COMMIT src | tar -x -C DIR`), run as harvest-base beside harvest")
    parser.add_argument("--instructions", action="store_true",
                        help="count each client's instructions per request under callgrind instead")
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    parser.add_argument("--url", help=argparse.SUPPRESS)
    parser.add_argument("--server-pid", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)

    if args.worker:
        print(json.dumps(worker(args.worker, args.url, args.requests, args.warmup, args.concurrency,
                                args.server_pid)))
        return 0

    kinds = [k.strip() for k in args.clients.split(",") if k.strip()]
    if args.base:
        if not (Path(args.base) / "src" / "harvest").is_dir():
            parser.error(f"--base {args.base}: no src/harvest there")
        kinds.insert(kinds.index("harvest") + 1 if "harvest" in kinds else 0, "harvest-base")
    unknown = sorted(set(kinds) - set(ALL_CLIENTS) - {"harvest-uvloop", "harvest-auto", "harvest-stream", "harvest-base"})
    if unknown:
        parser.error(f"unknown clients: {', '.join(unknown)}")
    proc, base = start_null_server()
    if args.instructions:
        try:
            for k in range(args.rounds):
                for kind in kinds:
                    per = run_instructions(kind, base, args, proc.pid)
                    print(f"round {k} {kind:<15} {per:10.0f} instructions per request "
                          f"(callgrind, {args.requests} requests at {args.concurrency} in flight)", flush=True)
        finally:
            stop(proc)
        return 0
    runs: dict[str, list[dict[str, float]]] = {kind: [] for kind in kinds}
    wrk_runs: list[dict[str, float]] = []
    try:
        for k in range(args.rounds):  # each round runs every client once, in order: A B C A B C ...
            for kind in kinds:
                before = load()
                r = run_client(kind, base, args, proc.pid)
                r["load"] = os.getloadavg()[0]
                runs[kind].append(r)
                print(f"  round {k} {kind:<15} {r['requests'] / r['wall_s']:8.0f} req/s  "
                      f"{r['requests'] / r['cpu_s']:8.0f} req per CPU s  ({before})", file=sys.stderr, flush=True)
            if not args.no_wrk:
                before = load()
                w = run_wrk(base, args)
                if w is not None:
                    w["load"] = os.getloadavg()[0]
                    wrk_runs.append(w)
                    print(f"  round {k} {'wrk':<15} {w['req_s']:8.0f} req/s  "
                          f"{w['requests'] / w['cpu_s']:8.0f} req per CPU s  ({before})", file=sys.stderr, flush=True)
    finally:
        stop(proc)
    results = {kind: _median(rs) for kind, rs in runs.items()}
    wrk = _median(wrk_runs) if wrk_runs else None

    print(f"\nP2 client cost: {args.requests} chat requests, concurrency {args.concurrency}, null server on "
          "loopback; "
          f"{args.rounds} round(s), the median round shown")
    print(f"machine: {platform.machine()}, {os.cpu_count()} CPUs, Python {platform.python_version()}, "
          f"{time.strftime('%Y-%m-%d %H:%M')}; {load()}\n")
    print(f"{'client':<16}{'req/s':>10}{'CPU s/1000 req':>16}{'req per CPU s':>15}{'server CPU %':>14}{'load1':>8}")
    for kind, r in results.items():
        per_cpu = r["requests"] / r["cpu_s"] if r["cpu_s"] > 0 else float("inf")
        server_pct = 100 * r["server_cpu_s"] / r["wall_s"]
        print(f"{kind:<16}{r['requests'] / r['wall_s']:>10.0f}{1000 * r['cpu_s'] / r['requests']:>16.3f}"
              f"{per_cpu:>15.0f}{server_pct:>13.0f}%{r['load']:>8.2f}")
    if wrk is not None:
        print(f"{'wrk (1 thread)':<16}{wrk['req_s']:>10.0f}{1000 * wrk['cpu_s'] / wrk['requests']:>16.3f}"
              f"{wrk['requests'] / wrk['cpu_s']:>15.0f}{'-':>14}{wrk['load']:>8.2f}")
    elif not args.no_wrk:
        print("wrk: not installed (apt-get install wrk) - loopback HTTP limit not measured")

    bench = ""
    if "harvest" in results:
        h = results["harvest"]
        h_eff = h["requests"] / h["cpu_s"]
        bench = (f"BENCH p2_client_cost harvest_req_s={h['requests'] / h['wall_s']:.0f} "
                 f"harvest_req_per_cpu_s={h_eff:.0f}")
        print("\nratios (harvest / baseline):")
        targets = {"openai-threads": 3.0, "openai-async": 1.5}
        for kind, r in results.items():
            if kind in ("harvest", "harvest-base"):
                continue
            eff = r["requests"] / r["cpu_s"]
            line = (f"  vs {kind:<15} requests per CPU s x{h_eff / eff:6.2f}   "
                    f"requests/s x{(h['requests'] / h['wall_s']) / (r['requests'] / r['wall_s']):6.2f}")
            if kind in targets:
                line += f"   (target >= x{targets[kind]:g}: {'met' if h_eff / eff >= targets[kind] else 'MISSED'})"
            print(line)
            bench += f" ratio_cpu_vs_{kind.replace('-', '_')}={h_eff / eff:.2f}"
            if "harvest-base" in results:
                b = results["harvest-base"]
                b_eff = b["requests"] / b["cpu_s"]
                print(f"  base ({args.base}) vs {kind:<15} requests per CPU s x{b_eff / eff:6.2f}")
                bench += f" base_ratio_cpu_vs_{kind.replace('-', '_')}={b_eff / eff:.2f}"
        if wrk is not None:
            ratio = (h["requests"] / h["wall_s"]) / wrk["req_s"]
            print(f"  vs wrk             requests/s x{ratio:6.2f}   "
                  f"(target >= x0.3: {'met' if ratio >= 0.3 else 'MISSED'})")
            bench += f" wrk_req_s={wrk['req_s']:.0f} ratio_req_s_vs_wrk={ratio:.2f}"
            if "raw-aiohttp" in results:
                r = results["raw-aiohttp"]
                print(f"  (bare aiohttp loop / wrk: requests/s x{(r['requests'] / r['wall_s']) / wrk['req_s']:.2f})")
        if "harvest-uvloop" in results:
            u = results["harvest-uvloop"]
            ratio = (u["requests"] / u["cpu_s"]) / h_eff
            print(f"  harvest on uvloop / on asyncio: requests per CPU s x{ratio:.2f}")
            bench += f" uvloop_req_per_cpu_s={u['requests'] / u['cpu_s']:.0f} ratio_uvloop={ratio:.2f}"
        if "openai-async" in runs and args.rounds > 1:
            for kind in ("harvest", "harvest-base"):
                if kind not in runs:
                    continue
                per_round = [(h["requests"] / h["cpu_s"]) / (o["requests"] / o["cpu_s"])
                             for h, o in zip(runs[kind], runs["openai-async"], strict=True)]
                middle = sorted(per_round)[len(per_round) // 2]
                print(f"  {kind} vs openai-async, each round's ratio: "
                      f"{', '.join(f'x{r:.2f}' for r in per_round)}; median x{middle:.2f}")
                bench += f" {kind.replace('-', '_')}_rounds_median_vs_openai_async={middle:.2f}"
        print(bench + f" load1={os.getloadavg()[0]:.2f}")
    return 0

if __name__ == "__main__":
    sys.exit(main())
