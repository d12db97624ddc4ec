"""bench/sim_engine.py, the simulated engine of the scaling benchmark: its batch and queue behave.

The server runs as a subprocess (as the benchmark runs it), stopped by its pid; every wait is bounded.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Iterator

import aiohttp
import pytest

from bench.sim_engine import parse_args, parse_metrics
from tests.engines import sim_engine
from tests.timing import SLACK_S

LATENCY, BATCH, OUTPUT = 0.05, 4, 10


@pytest.fixture
def sim() -> Iterator[str]:
    with sim_engine("--token-latency", str(LATENCY), "--max-batch", str(BATCH), "--output-tokens", str(OUTPUT)) as url:
        yield url


async def _chat(session: aiohttp.ClientSession, base: str, max_tokens: int = 20) -> dict:
    async with session.post(base + "/v1/chat/completions", json={
            "model": "sim-model", "max_tokens": max_tokens,
            "messages": [{"role": "user", "content": "three words here"}]}) as resp:
        assert resp.status == 200
        return await resp.json()


async def _steps(session: aiohttp.ClientSession, base: str) -> dict[str, float]:
    async with session.get(base + "/metrics") as resp:
        return parse_metrics(await resp.text())


async def test_requests_beyond_the_batch_wait_for_a_slot(sim: str) -> None:
    timeout = aiohttp.ClientTimeout(total=60)
    async with aiohttp.ClientSession(timeout=timeout) as session:
        t0 = time.monotonic()
        one = await _chat(session, sim)
        single = time.monotonic() - t0
        assert one["usage"] == {"prompt_tokens": 3, "completion_tokens": OUTPUT, "total_tokens": 3 + OUTPUT}
        assert one["choices"][0]["finish_reason"] == "stop"
        assert len(one["choices"][0]["message"]["content"].split()) == OUTPUT

        n = 3 * BATCH
        before = await _steps(session, sim)
        seen: list[tuple[float, float]] = []

        async def watch() -> None:
            while True:
                m = await _steps(session, sim)
                seen.append((m["vllm:num_requests_running"], m["vllm:num_requests_waiting"]))
                await asyncio.sleep(LATENCY)

        watcher = asyncio.create_task(watch())
        t0 = time.monotonic()
        answers = await asyncio.gather(*(_chat(session, sim) for _ in range(n)))
        many = time.monotonic() - t0
        watcher.cancel()
        after = await _steps(session, sim)

    waves = math.ceil(n / BATCH)
    steps = after["sim:steps_total"] - before["sim:steps_total"]
    # One step per token for the whole batch: 3 waves of 10 steps (a late arrival may add a step).
    assert waves * OUTPUT <= steps <= waves * OUTPUT + 3, steps
    assert after["vllm:generation_tokens_total"] - before["vllm:generation_tokens_total"] == n * OUTPUT
    assert all(a["usage"]["completion_tokens"] == OUTPUT for a in answers)
    # Wall time: never faster than `waves` batches of the engine's own token latency; batched, far
    # below one request after another (n * OUTPUT * LATENCY = 6 s) with a loaded machine's slack.
    # (The step counter above is the exact proof of batching; speed itself is for bench/.)
    assert waves * OUTPUT * LATENCY * 0.9 <= many <= waves * OUTPUT * LATENCY + SLACK_S, (many, single)
    # The gauges: never more than the batch running; a queue seen while the batch was full.
    assert max(r for r, _ in seen) <= BATCH
    assert any(r == BATCH and w > 0 for r, w in seen), seen


async def test_max_tokens_text_completions_and_the_other_routes(sim: str) -> None:
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=30)) as session:
        capped = await _chat(session, sim, max_tokens=3)
        assert capped["usage"]["completion_tokens"] == 3
        assert capped["choices"][0]["finish_reason"] == "length"
        async with session.post(sim + "/v1/completions",
                                json={"model": "sim-model", "prompt": "a b c d e", "max_tokens": 2}) as resp:
            doc = await resp.json()
        assert doc["usage"] == {"prompt_tokens": 5, "completion_tokens": 2, "total_tokens": 7}
        assert doc["choices"][0]["finish_reason"] == "length" and doc["choices"][0]["text"].strip()
        async with session.post(sim + "/v1/chat/completions",
                                json={"messages": [{"role": "user", "content": "x"}], "max_tokens": 0}) as resp:
            assert resp.status == 400
            assert "max_tokens" in (await resp.json())["error"]["message"]
        async with session.get(sim + "/v1/models") as resp:
            assert (await resp.json())["data"][0]["id"] == "sim-model"
        async with session.get(sim + "/health") as resp:
            assert resp.status == 200


def test_the_h100_endpoint_preset_is_the_curve_measured_there():
    """``--preset transformers-h100`` (measured 2026-12-06): a decode step of 0.117 s at 64 running that grows
    35 % by 512, a 0.27 s prefill, 1024 at once, and neither /metrics nor a capacity endpoint."""
    args = parse_args(["--preset", "transformers-h100"])

    def step(n: int) -> float:
        return args.token_latency + args.step_per_seq * n

    assert step(64) == pytest.approx(0.117, abs=5e-4) and step(512) / step(64) == pytest.approx(1.35, abs=0.01)
    assert (args.prefill, args.max_batch, args.dialect) == (0.27, 1024, "transformers")
    smaller = parse_args(["--preset", "transformers-h100", "--max-batch", "384"])  # a flag given wins
    assert (smaller.max_batch, smaller.token_latency) == (384, args.token_latency)
