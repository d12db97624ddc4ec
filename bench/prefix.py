"""Prefix-aware order and routing against FIFO and round-robin: `harvest run` on vLLM CPU.

    python bench/prefix.py [--prefixes 40] [--per-prefix 25] [--prefix-tokens 1500] [--none-items N]
                           [--conversations 500] [--turns 3] [--sets shared,none,conv]
                           [--arms one,two] [--rounds 1] [--concurrency 32] [--max-tokens 16]
                           [--kv-space 1] [--kv-tokens N]

A random Llama of ~100M parameters (``make_tiny_model.py --size 100m``: prefill costs on a CPU)
served by vLLM's CPU build (prefix caching on, its default; ``--kv-space`` GiB of KV cache,
``VLLM_CPU_KVCACHE_SPACE``). What the order can win depends on that size against the prefixes'
working set: this model's KV takes 12 KiB a token (12 layers x 4 KV heads x 64 x K and V, bf16),
so 1 GiB holds 87,296 tokens, the 40 x 1,500 = 60,000 of the default set and more; then FIFO
finds every prefix cached after its first use too, and order has nothing to win. A dataset with
more distinct prefixes than the engine's cache holds (the GPU case: thousands of system prompts or
conversations) is reproduced here with a smaller cache: ``--kv-tokens`` (vLLM's
``--num-gpu-blocks-override`` in blocks of 128 tokens, the CPU build's block size, set explicitly;
``VLLM_CPU_KVCACHE_SPACE`` takes whole GiB only). Three datasets, each item's prompt
tokens counted by the server's ``/tokenize``:

    shared  ``--prefixes`` system prompts of ~``--prefix-tokens`` tokens x ``--per-prefix`` short
            questions each, shuffled
    none    ``--none-items`` items (default: as many as ``shared``), each with a system prompt of its
            own of the same length (nothing to share: the order must cost nothing)
    conv    ``--conversations`` conversations of ``--turns`` user turns (a ~300-token opening, then
            short follow-ups): harvest sends each next turn after the previous answer

Arms, each one ``harvest run`` (a subprocess, fixed ``--concurrency``, ``ignore_eos``), the prefix
cache reset before each (``POST /reset_prefix_cache``, vLLM's dev mode), the order of the two arms
swapped every other round (A/B then B/A):

    one     one server: ``[run] prefix_order = true`` against ``false`` (FIFO), no routing
    two     two servers as two endpoints: prefix order + ``[client] prefix_affinity = true`` against
            FIFO + least-outstanding (``prefix_affinity = false``)

Printed per arm: items/s, generation and prompt tok/s over the whole run (first claim to last
commit, from the run's own log), and the prefix-cache hit rate measured by the engines' counters
over the arm (``vllm:prefix_cache_hits`` / ``vllm:prefix_cache_queries`` deltas). Then, per set and
pairing, the ratio (P7 A3's target: >= x1.3 on ``shared``, >= x0.98 on ``none``; ``conv``
recorded) and a ``BENCH prefix`` line.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import aiohttp
from autoconc import start_vllm  # bench/autoconc.py
from benchutil import exit_on_sigterm, load  # bench/benchutil.py
from saturation import SERVED_NAME, VLLM_ENV, engine_python

HERE = Path(__file__).resolve().parent
#: vLLM CPU's KV block (its default, passed explicitly): the unit of its prefix cache and of --kv-tokens.
BLOCK = 128
SRC = HERE.parent / "src"
WORDS = ("river", "stone", "lantern", "orbit", "velvet", "quartz", "meadow", "signal", "harbor", "cinder",
         "prism", "tundra", "falcon", "ember", "glacier", "mosaic", "nectar", "pylon", "saffron", "timber")


def text(rng: random.Random, words: int) -> str:
    return " ".join(rng.choice(WORDS) + str(rng.randrange(100)) for _ in range(words))


async def tokens_of(url: str, content: str) -> int:
    async with aiohttp.ClientSession() as s, s.post(url + "/tokenize", json={"model": SERVED_NAME,
                                                                          "prompt": content}) as r:
        return int((await r.json())["count"])


def datasets(args: argparse.Namespace, url: str, work: Path) -> dict[str, Path]:
    """The JSONL files of the sets asked for, with prompts sized by the server's tokenizer."""
    rng = random.Random(23)
    probe = text(rng, 200)
    per_word = asyncio.run(tokens_of(url, probe)) / 200
    words = max(1, int(args.prefix_tokens / per_word))
    out: dict[str, Path] = {}
    sets = args.sets.split(",")
    n = args.prefixes * args.per_prefix
    if "shared" in sets:
        prefixes = [f"You are assistant {k}. " + text(rng, words) for k in range(args.prefixes)]
        rows = [{"id": f"s{k}-{q}", "messages": [{"role": "system", "content": prefixes[k]},
                                                 {"role": "user", "content": f"Question {q}: " + text(rng, 12)}]}
                for k in range(args.prefixes) for q in range(args.per_prefix)]
        rng.shuffle(rows)
        out["shared"] = write(work / "shared.jsonl", rows)
    if "none" in sets:
        rows = [{"id": f"n{i}", "messages": [{"role": "system", "content": f"You are assistant {i}. " + text(rng, words)},
                                             {"role": "user", "content": f"Question {i}: " + text(rng, 12)}]}
                for i in range(args.none_items or n)]
        out["none"] = write(work / "none.jsonl", rows)
    if "conv" in sets:
        opening = max(1, int(300 / per_word))
        rows = []
        for i in range(args.conversations):  # the input's assistant turns are placeholders: regenerated
            messages = [{"role": "user", "content": f"Conversation {i}. " + text(rng, opening)}]
            for t in range(1, args.turns):
                messages += [{"role": "assistant", "content": "-"},
                             {"role": "user", "content": f"Follow-up {t}: " + text(rng, 10)}]
            rows.append({"id": f"c{i}", "messages": messages})
        out["conv"] = write(work / "conv.jsonl", rows)
    print(f"datasets: {per_word:.2f} tokens per word; prefix {words} words (~{words * per_word:.0f} tokens); "
          + ", ".join(f"{k}: {sum(1 for _ in v.open())} items" for k, v in out.items()), flush=True)
    return out


def write(path: Path, rows: list[dict[str, Any]]) -> Path:
    with path.open("w") as fh:
        for row in rows:
            fh.write(json.dumps(row) + "\n")
    return path


def job(work: Path, tag: str, data: Path, urls: list[str], args: argparse.Namespace, *, order: bool,
        affinity: bool) -> Path:
    q = json.dumps
    path = work / f"job-{tag}.toml"
    path.write_text(
        f"[data]\npath = {q(str(data))}\nid_field = \"id\"\n\n"
        f"[sampling]\nmax_tokens = {args.max_tokens}\ntemperature = 0.0\nextra_body = {{ ignore_eos = true }}\n\n"
        f"[client]\nendpoints = [{', '.join(q(u) for u in urls)}]\nconcurrency = {args.concurrency * len(urls)}\n"
        f"max_retries = 3\nhealth_deadline = 120\nprefix_affinity = {str(affinity).lower()}\n\n"
        f"[run]\nreasoning = \"none\"\nprogress_interval = 5.0\nprefix_order = {str(order).lower()}\n\n"
        f"[output]\ndir = {q(str(work / f'run-{tag}'))}\n")
    return path


async def cache_counters(urls: list[str]) -> tuple[float, float, float, float]:
    """Prefix-cache hits and queries, generation and prompt tokens, summed over the servers."""
    from harvest.client.metrics import parse_prometheus_text, sum_by_name

    totals = [0.0, 0.0, 0.0, 0.0]
    async with aiohttp.ClientSession() as s:
        for url in urls:
            async with s.get(url + "/metrics") as r:
                m = sum_by_name(parse_prometheus_text(await r.text()))
            for i, name in enumerate(("vllm:prefix_cache_hits_total", "vllm:prefix_cache_queries_total",
                                      "vllm:generation_tokens_total", "vllm:prompt_tokens_total")):
                totals[i] += m.get(name, 0.0)
    return totals[0], totals[1], totals[2], totals[3]


async def reset_cache(urls: list[str]) -> None:
    async with aiohttp.ClientSession() as s:
        for url in urls:
            async with s.post(url + "/reset_prefix_cache") as r:
                if r.status != 200:
                    raise RuntimeError(f"{url}/reset_prefix_cache answered {r.status} (VLLM_SERVER_DEV_MODE=1?)")


def run_arm(work: Path, tag: str, data: Path, urls: list[str], args: argparse.Namespace, *, order: bool,
            affinity: bool) -> dict[str, float]:
    asyncio.run(reset_cache(urls))
    before = asyncio.run(cache_counters(urls))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(SRC), os.environ.get("PYTHONPATH", "")])}
    path = job(work, tag, data, urls, args, order=order, affinity=affinity)
    t0 = time.monotonic()
    with (work / f"harvest-{tag}.log").open("w") as log:
        done = subprocess.run([sys.executable, "-m", "harvest", "run", str(path), "--no-live"], stdout=log,
                              stderr=subprocess.STDOUT, env=env, cwd=work, timeout=args.timeout, check=False)
    wall = time.monotonic() - t0
    after = asyncio.run(cache_counters(urls))
    hits, queries, gen, prompt = (a - b for a, b in zip(after, before))
    items = sum(1 for _ in data.open())
    out = {"items": float(items), "wall_s": wall, "items_per_s": items / wall, "gen_tok_s": gen / wall, "prompt_tok_s": prompt / wall,
           "hit_rate": hits / queries if queries else float("nan"), "rc": float(done.returncode)}
    print(f"  {tag:<28} rc {done.returncode}  {wall:7.1f} s  {out['items_per_s']:6.2f} items/s  gen "
          f"{out['gen_tok_s']:7.1f} tok/s  prompt {out['prompt_tok_s']:8.1f} tok/s  prefix cache hits "
          f"{out['hit_rate']:.1%}  ({load()})", flush=True)
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--prefixes", type=int, default=40)
    ap.add_argument("--per-prefix", type=int, default=25)
    ap.add_argument("--prefix-tokens", type=int, default=1500)
    ap.add_argument("--none-items", type=int, default=0, help="items of the none set (0: prefixes x per-prefix)")
    ap.add_argument("--conversations", type=int, default=500)
    ap.add_argument("--turns", type=int, default=3)
    ap.add_argument("--sets", default="shared,none,conv")
    ap.add_argument("--arms", default="one,two")
    ap.add_argument("--rounds", type=int, default=1)
    ap.add_argument("--concurrency", type=int, default=32, help="fixed, per server")
    ap.add_argument("--max-tokens", type=int, default=16)
    ap.add_argument("--kv-space", default="1", help="VLLM_CPU_KVCACHE_SPACE (GiB) of each server")
    ap.add_argument("--kv-tokens", type=int, default=0,
                    help="KV cache of each server in tokens (--num-gpu-blocks-override x 128); 0: all of --kv-space")
    ap.add_argument("--timeout", type=float, default=3600.0, help="seconds one harvest run may take")
    ap.add_argument("--engine-python", help="Python of vLLM's CPU build (default: scripts/install-engines vllm)")
    ap.add_argument("--model", help="model folder (default: make_tiny_model.py --size 100m, built here)")
    ap.add_argument("--keep", type=Path, help="work folder to keep")
    args = ap.parse_args(argv)
    exit_on_sigterm()
    py = engine_python(args.engine_python)
    work = args.keep or Path(tempfile.mkdtemp(prefix="harvest-prefix-"))
    work.mkdir(parents=True, exist_ok=True)
    model = args.model
    if model is None:
        model = str(work / "m100")
        if not (Path(model) / "config.json").exists():
            t = time.monotonic()
            subprocess.run([py, str(SRC / "harvest/demo/make_tiny_model.py"), model, "--size", "100m"], check=True,
                           capture_output=True, timeout=900)
            print(f"model: built in {time.monotonic() - t:.0f} s", flush=True)
    print(f"prefix benchmark: sets {args.sets}, arms {args.arms}, {args.rounds} round(s), concurrency "
          f"{args.concurrency} per server, {args.max_tokens} tokens; KV {args.kv_space} GiB per server"
          + (f", {args.kv_tokens} tokens used" if args.kv_tokens else ""), flush=True)
    print(f"machine: {platform.machine()}, {os.cpu_count()} CPUs, {time.strftime('%Y-%m-%d %H:%M')}; {load()}",
          flush=True)
    VLLM_ENV.update({"VLLM_CPU_KVCACHE_SPACE": str(args.kv_space), "VLLM_SERVER_DEV_MODE": "1"})
    arms = args.arms.split(",")
    servers: list[Any] = []
    results: dict[tuple[str, str, bool], list[dict[str, float]]] = {}
    try:
        more = ("--block-size", str(BLOCK)) + (("--num-gpu-blocks-override", str(-(-args.kv_tokens // BLOCK)))
                                                if args.kv_tokens else ())
        servers.append(start_vllm(py, model, work, "a", None, max_model_len=4096, more_args=more))
        if "two" in arms:
            servers.append(start_vllm(py, model, work, "b", None, max_model_len=4096, more_args=more))
        urls = [s.url for s in servers]
        sets = datasets(args, urls[0], work)
        for k in range(args.rounds):
            for name, data in sets.items():
                for arm in arms:
                    using = urls[:1] if arm == "one" else urls[:2]
                    pair = [True, False] if k % 2 == 0 else [False, True]
                    for aware in pair:
                        tag = f"{name}-{arm}-{'aware' if aware else 'fifo'}-r{k}"
                        res = run_arm(work, tag, data, using, args, order=aware, affinity=aware and arm == "two")
                        results.setdefault((name, arm, aware), []).append(res)
    finally:
        for server in servers:
            report = server.shutdown()
            if report is not None:
                print(f"server stop: {report.verdict} in {report.total_s:.2f} s", flush=True)
    print("\nmedians over rounds (aware / fifo):")
    for (name, arm, aware), rs in sorted(results.items()):
        if not aware:
            continue
        fifo = results.get((name, arm, False))
        if not fifo:
            continue
        a = {k: statistics.median(r[k] for r in rs) for k in rs[0]}
        f = {k: statistics.median(r[k] for r in fifo) for k in fifo[0]}
        ratio = a["gen_tok_s"] / f["gen_tok_s"] if f["gen_tok_s"] else float("nan")
        target = {"shared": 1.3, "none": 0.98}.get(name)
        label = "prefix order" if arm == "one" else "prefix order + affinity vs FIFO + least-outstanding"
        print(f"  {name:<6} {arm}: {label}: tok/s x{ratio:.3f} (aware {a['gen_tok_s']:.1f}, fifo {f['gen_tok_s']:.1f});"
              f" hit rate {a['hit_rate']:.1%} vs {f['hit_rate']:.1%}; "
              + (f"target x{target}: {'met' if ratio >= target else 'MISSED'}" if target else "recorded"))
        print(f"BENCH prefix set={name} arm={arm} ratio={ratio:.3f} aware_tok_s={a['gen_tok_s']:.1f} "
              f"fifo_tok_s={f['gen_tok_s']:.1f} aware_hit={a['hit_rate']:.4f} fifo_hit={f['hit_rate']:.4f} "
              f"items={a['items']:.0f} kv_gib={args.kv_space} kv_tokens={args.kv_tokens or 'all'} rounds={len(rs)} load1={os.getloadavg()[0]:.2f}",
              flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
