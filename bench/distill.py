"""Distillation outputs on one vLLM CPU server: samples per request and logprob cost.

    .venv/bin/python bench/distill.py                       # tiny model, 32 prompts, n = 4
    .venv/bin/python bench/distill.py --items 64 --max-tokens 64 --rounds 2

Starts one vLLM CPU server (prefix caching on) on the tests' tiny random Llama and drives it through
harvest's own client and ``generate_samples`` (what ``harvest run`` does per item):

1. n = 4 samples per prompt as ONE request with ``n`` against FOUR requests (distinct seeds) per
   prompt, the same number of prompts in flight (so the engine holds the same number of sequences),
   each phase on its own prompts of the same length (no prefix shared across phases). Prints
   generated tok/s of each and their ratio, and the engine's prefix-cache hit rate in each phase
   (``vllm:prefix_cache_hits`` / ``vllm:prefix_cache_queries`` from /metrics, deltas).
2. logprobs = 20 against none, n = 1: generated tok/s and the client's CPU seconds per generated
   token (this process: HTTP, JSON, logprob parsing and record encoding; the server is another
   process).
3. Storage at logprobs = 20: record bytes per generated token, and the Parquet export's
   (``harvest export --format logprobs``) bytes per generated token.

Phases alternate (A B, then B A on the next round) so drift of a shared machine falls on both.
Prints one ``BENCH distill ...`` line with the figures.
"""

from __future__ import annotations

import argparse
import asyncio
import random
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tests.engines import build_tiny_model, install_engine, start_vllm  # noqa: E402

from harvest.campaign.outputs.export import export_run  # noqa: E402
from harvest.campaign.run.generate import generate_samples  # noqa: E402
from harvest.client import Client  # noqa: E402
from harvest.config import parse_config  # noqa: E402
from harvest.dataset import Item, Message  # noqa: E402
from harvest.ledger import Completion, Ledger  # noqa: E402

WORDS = ("river stone apple cloud engine paper violet orbit candle harbor meadow signal copper "
         "lantern quartz willow falcon ember glacier pepper").split()


def prompts(tag: str, n: int, words: int, seed: int) -> list[Item]:
    rng = random.Random(seed)
    out = []
    for i in range(n):
        text = f"[{tag} {i}] " + " ".join(rng.choice(WORDS) for _ in range(words)) + " Continue the list."
        out.append(Item(f"{tag}-{i}", "bench", i + 1, (Message("user", text),)))
    return out


def prefix_counters(metrics: dict[str, dict[str, float]]) -> tuple[float, float]:
    hits = queries = 0.0
    for values in metrics.values():
        for name, value in values.items():
            if name.startswith("vllm:prefix_cache_hits"):
                hits += value
            elif name.startswith("vllm:prefix_cache_queries"):
                queries += value
    return hits, queries


async def phase(url: str, items: list[Item], *, n: int, one_request: bool, logprobs: int, max_tokens: int,
                in_flight: int) -> dict[str, float]:
    """Generate ``n`` samples of every item, ``in_flight`` items at a time; figures of the phase."""
    config = parse_config({
        "client": {"endpoints": [url], "concurrency": in_flight * n, "health_deadline": 60},
        # No seed: vLLM 0.32's CPU build kills its engine core on a seeded n > 1 request once prefix
        # caching is on ("RuntimeError: CPU Generator does not use offset", seen here).
        "sampling": {"max_tokens": max_tokens, "temperature": 1.0, "n": n, "logprobs": logprobs},
    })
    gate = asyncio.Semaphore(in_flight)
    records: list[tuple[str, int, bytes | None, int]] = []
    async with Client.from_config(config) as client:
        await client.chat([{"role": "user", "content": "warm up"}], max_tokens=4)
        h0, q0 = prefix_counters(await client.scrape_metrics())
        cpu0, t0 = time.process_time(), time.perf_counter()

        async def one(item: Item) -> None:
            async with gate:
                found = await generate_samples(client, item, list(range(n)), run=config.run,
                                               sampling=config.sampling, settings_hash="bench",
                                               one_request=one_request)
            for gen in found:
                if isinstance(gen, BaseException):
                    raise gen
                records.append((item.id, gen.sample, gen.logprobs, gen.completion_tokens))

        await asyncio.gather(*(one(item) for item in items))
        wall, cpu = time.perf_counter() - t0, time.process_time() - cpu0
        h1, q1 = prefix_counters(await client.scrape_metrics())
    tokens = sum(r[3] for r in records)
    return {"tok_s": tokens / wall, "tokens": tokens, "wall_s": wall, "cpu_per_tok_us": 1e6 * cpu / tokens,
            "hit_rate": (h1 - h0) / (q1 - q0) if q1 > q0 else float("nan"), "records": records}  # type: ignore[dict-item]


def storage(items: list[Item], records: list[tuple[str, int, bytes | None, int]], k: int) -> tuple[float, float]:
    """Record bytes per token, and Parquet export bytes per token, through a real ledger and export."""
    with tempfile.TemporaryDirectory(prefix="harvest-distill-bench-") as tmp:
        run = Path(tmp) / "run"
        with Ledger.open(run, settings_hash="bench") as ledger:
            ledger.ingest(iter(items))
            ledger.claim(len(items))
            ledger.complete([Completion(i, {"messages": []}, sample=s, logprobs=rec, completion_tokens=t)
                             for i, s, rec, t in records])
            _, shard_bytes = ledger.logprob_usage()
        out = Path(tmp) / "lp.parquet"
        export_run(run, "logprobs", output=out)
        tokens = sum(r[3] for r in records)
        return shard_bytes / tokens, out.stat().st_size / tokens


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--items", type=int, default=32, help="prompts per phase")
    ap.add_argument("--n", type=int, default=4)
    ap.add_argument("--max-tokens", type=int, default=32)
    ap.add_argument("--prompt-words", type=int, default=300, help="words per prompt (prefill to share)")
    ap.add_argument("--in-flight", type=int, default=4, help="prompts in flight at once")
    ap.add_argument("--logprobs", type=int, default=20)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--python", default=None, help="vLLM's Python (default: scripts/install-engines vllm)")
    args = ap.parse_args()
    python = args.python or install_engine("vllm")
    work = Path(tempfile.mkdtemp(prefix="harvest-distill-"))
    model = build_tiny_model(python, work / "model", gguf=False)
    server = start_vllm(python, model, work, "--max-model-len", "4096", "--enable-prefix-caching",
                        "--max-logprobs", str(max(20, args.logprobs)), timeout=600)
    figures: dict[str, list[float]] = {}

    def note(key: str, value: float) -> None:
        figures.setdefault(key, []).append(value)

    try:
        seed = 0
        for rnd in range(args.rounds):
            order = [True, False] if rnd % 2 == 0 else [False, True]
            for one_request in order:
                seed += 1
                tag = "one" if one_request else "sep"
                f = asyncio.run(phase(server.url, prompts(f"{tag}{rnd}", args.items, args.prompt_words, seed),
                                      n=args.n, one_request=one_request, logprobs=0,
                                      max_tokens=args.max_tokens, in_flight=args.in_flight))
                print(f"round {rnd} n={args.n} {'one request ' if one_request else 'n requests  '}: "
                      f"{f['tok_s']:7.1f} tok/s ({f['tokens']} tokens, {f['wall_s']:.1f} s), prefix-cache hit rate"
                      f" {f['hit_rate']:.1%}", flush=True)
                note(f"{tag}_tok_s", f["tok_s"])
                note(f"{tag}_hit", f["hit_rate"])
            order = [0, args.logprobs] if rnd % 2 == 0 else [args.logprobs, 0]
            for k in order:
                seed += 1
                items = prompts(f"lp{k}-{rnd}", args.items * args.n, args.prompt_words // 10, seed)
                f = asyncio.run(phase(server.url, items, n=1, one_request=True, logprobs=k,
                                      max_tokens=args.max_tokens, in_flight=args.in_flight * args.n))
                print(f"round {rnd} logprobs={k:<2}: {f['tok_s']:7.1f} tok/s, client CPU"
                      f" {f['cpu_per_tok_us']:.0f} us per generated token", flush=True)
                note(f"lp{k}_tok_s", f["tok_s"])
                note(f"lp{k}_cpu", f["cpu_per_tok_us"])
                if k and rnd == 0:
                    rec, parquet = storage(items, f["records"], k)  # type: ignore[arg-type]
                    print(f"storage at logprobs={k}: {rec:.1f} B per generated token in shards,"
                          f" Parquet export {parquet:.1f} B per generated token", flush=True)
                    note("shard_b_tok", rec)
                    note("parquet_b_tok", parquet)
    finally:
        server.stop()

    def mean(key: str) -> float:
        return sum(figures[key]) / len(figures[key])

    k = args.logprobs
    print(f"BENCH distill n={args.n} items={args.items} max_tokens={args.max_tokens} rounds={args.rounds}"
          f" one_tok_s={mean('one_tok_s'):.1f} sep_tok_s={mean('sep_tok_s'):.1f}"
          f" n_ratio={mean('one_tok_s') / mean('sep_tok_s'):.3f}"
          f" one_hit={mean('one_hit'):.3f} sep_hit={mean('sep_hit'):.3f}"
          f" lp{k}_tok_s={mean(f'lp{k}_tok_s'):.1f} lp0_tok_s={mean('lp0_tok_s'):.1f}"
          f" lp_tok_ratio={mean(f'lp{k}_tok_s') / mean('lp0_tok_s'):.3f}"
          f" lp{k}_cpu_us_tok={mean(f'lp{k}_cpu'):.0f} lp0_cpu_us_tok={mean('lp0_cpu'):.0f}"
          f" lp_cpu_ratio={mean(f'lp{k}_cpu') / mean('lp0_cpu'):.2f}"
          f" shard_b_tok={mean('shard_b_tok'):.1f} parquet_b_tok={mean('parquet_b_tok'):.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
