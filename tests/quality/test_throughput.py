"""The throughput probe's gauge peaks: only readings of /metrics asked for while the requests ran and
answered before the last one count. A busy server that answers a scrape only once the run has
drained (vLLM CPU on two cores: 3.9 s, with 0 running) leaves the peak unknown, not 0."""

from __future__ import annotations

import asyncio
import json

import pytest
from aiohttp import web

from harvest.config import ServerConfig
from harvest.quality.probe import ProbePrompt
from harvest.quality.throughput import ThroughputSettings, throughput_probe
from harvest.server.base import adapter_for
from tests import engines

PROMPTS = [ProbePrompt(f"p{i}", (("user", f"Question {i}"),)) for i in range(12)]


async def probe_against(late: bool):
    """A loopback OpenAI-style server whose /metrics shows the requests it holds; ``late``: every
    scrape after the probe's first (its counter reading before the run) is answered only after the
    last answer went out."""
    running, answered, scrapes, drained = 0, 0, 0, asyncio.Event()

    async def chat(request: web.Request) -> web.Response:
        nonlocal running, answered
        running += 1
        await asyncio.sleep(0.4)
        running -= 1
        answered += 1
        if answered == len(PROMPTS):
            drained.set()
        return web.json_response({"choices": [{"index": 0, "finish_reason": "length",
                                               "message": {"role": "assistant", "content": "x"}}],
                                  "usage": {"prompt_tokens": 3, "completion_tokens": 4}})

    async def metrics(request: web.Request) -> web.Response:
        nonlocal scrapes
        scrapes += 1
        if late and scrapes > 1:
            await drained.wait()
            await asyncio.sleep(0.3)  # the client has had the last answer
        return web.Response(text=f"vllm:num_requests_running {running}\nvllm:num_requests_waiting 0\n"
                                 f"vllm:generation_tokens_total {4 * answered}\n")

    app = web.Application()
    app.router.add_post("/v1/chat/completions", chat)
    app.router.add_get("/metrics", metrics)
    runner = web.AppRunner(app)
    await runner.setup()
    port = engines.free_port()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    try:
        server = ServerConfig(engine="vllm", model="/m", served_model_name="m", port=port)
        return await throughput_probe(server, PROMPTS, ThroughputSettings(prompts=12, concurrency=4,
                                                                          metrics_interval=0.05),
                                      metrics=adapter_for("vllm").metrics)
    finally:
        await runner.cleanup()


@pytest.mark.parametrize("late", [False, True])
async def test_a_peak_counts_only_readings_taken_while_the_requests_ran(late):
    result = await probe_against(late)
    assert result.requests == 12 and result.failed == 0 and result.completion_tokens == 48
    if late:
        # every scrape during the run came back after it: nothing was seen of the run
        assert result.peak_running is None and result.peak_waiting is None, result
    else:
        assert result.peak_running is not None and 1 <= result.peak_running <= 4, result
        assert result.peak_waiting == 0, result
    print(json.dumps(result.to_dict()))
