"""``concurrency = "auto"`` on a real vLLM CPU server: the target rises from its start and settles.

Shape only: the controller is fed by the engine's own /metrics and answers; the test keeps the
client busy until the controller leaves its starting phase (bounded by a generous deadline that is
a guard, not a measurement) and asserts what the targets did, never how long it took.
"""

from __future__ import annotations

import asyncio
import time

import pytest

from harvest.client import Client
from harvest.client.autoconc import AutoSettings
from harvest.config import ClientConfig, SamplingConfig

# The shared server's start (tests/conftest.py, up to its 900 s readiness bound on a loaded machine)
# counts against the test when it is the first of the session to ask for it.
pytestmark = [pytest.mark.engine, pytest.mark.slow, pytest.mark.timeout(1800)]

START = 2
#: Polls (0.5 s apart) to watch after the controller left its starting phase.
AFTER = 10
#: A guard against a hang, not a timing assertion.
DEADLINE_S = 300.0


async def test_auto_target_rises_from_start_and_settles_on_vllm(vllm_server):
    config = ClientConfig(concurrency="auto", auto_start=START, max_concurrency=64, request_timeout=300)
    sampling = SamplingConfig(max_tokens=16, temperature=0.0, extra_body={"ignore_eos": True})
    auto = AutoSettings(start=START, max_concurrency=64, interval_s=1.0)
    decisions = []
    failures: list[BaseException] = []
    async with Client([vllm_server.url], config, sampling, model=vllm_server.model, auto=auto) as client:
        stop = asyncio.Event()

        async def one(i: int) -> None:
            try:
                await client.chat([{"role": "user", "content": f"Tell me about the number {i}."}])
            except Exception as exc:  # noqa: BLE001 - collected and asserted below
                failures.append(exc)

        async def feed() -> None:
            """Keep twice the current capacity of requests waiting, as the campaign does."""
            pending: set[asyncio.Task[None]] = set()
            i = 0
            while not stop.is_set():
                while len(pending) < 2 * client.capacity():
                    pending.add(asyncio.create_task(one(i)))
                    i += 1
                done, pending = await asyncio.wait(pending, timeout=0.2, return_when=asyncio.FIRST_COMPLETED)
            await asyncio.gather(*pending)

        feeder = asyncio.create_task(feed())
        deadline = time.monotonic() + DEADLINE_S
        settled_at = None
        polls = 0
        try:
            while time.monotonic() < deadline and not feeder.done():
                await asyncio.sleep(0.5)
                polls += 1
                (target,) = client.concurrency_targets()
                if not decisions or decisions[-1] != (target.target, target.phase, target.reason):
                    decisions.append((target.target, target.phase, target.reason))
                if settled_at is None and target.phase != "start":
                    settled_at = polls
                if settled_at is not None and polls >= settled_at + AFTER:
                    break
        finally:
            stop.set()
            await asyncio.wait_for(feeder, 300)
        gauges_fed = client.concurrency_targets()[0].gauges
    assert not failures, failures[:3]
    targets = [d[0] for d in decisions]
    assert targets[0] == START, decisions
    assert max(targets) > START, decisions  # it rose from the start value
    assert settled_at is not None, f"the controller never left its starting phase: {decisions}"
    assert decisions[-1][1] in ("settled", "probe", "backoff"), decisions
    assert all(1 <= t <= 64 for t in targets), decisions
    assert gauges_fed, "vLLM's /metrics should feed the controller"


async def test_vllm_pointed_at_publishes_no_batch_but_its_gauges_and_kv(vllm_server):
    """vLLM 0.32 as an endpoint harvest did not launch: no ``/server_info`` outside its development
    mode, no ``/props``; its /metrics has the queue gauges and ``vllm:cache_config_info``, whose
    ``num_gpu_blocks`` x ``block_size`` labels are its KV capacity in tokens."""
    from harvest.client.capacity import GAUGED_START, ask_capacity
    from harvest.client.metrics import parse_prometheus_text
    from harvest.aiohttp_transport import AiohttpTransport

    transport = AiohttpTransport(max_connections=4)
    try:
        limit = await ask_capacity(transport, {}, vllm_server.url, 30.0)
        text = (await transport.request("GET", vllm_server.url + "/metrics", timeout=30.0)).body.decode()
    finally:
        await transport.aclose()
    info = [dict(s.labels) for s in parse_prometheus_text(text) if s.name == "vllm:cache_config_info"]
    assert len(info) == 1, info
    kv = int(info[0]["num_gpu_blocks"]) * int(info[0]["block_size"])
    assert (limit.batch, limit.exact, limit.metrics) == (GAUGED_START, False, True)
    assert limit.source.startswith(f"no batch limit published (KV {kv} tokens): 256"), limit.source
