"""What an engine harvest did not launch publishes of its capacity (``client/capacity.py``), and the
first level of ``concurrency = "auto"`` it gives: the shapes read (SGLang 0.5.23's ``/server_info``,
an older SGLang's ``/get_server_info``, vLLM's development-mode ``/server_info`` and its
``vllm:cache_config_info`` gauge, llama-server's ``/props``), the simulated engines of
``bench/sim_engine.py`` in each dialect on loopback, a real llama-server, and who is asked."""

from __future__ import annotations

import asyncio
import contextlib
import json
import socket
from collections.abc import AsyncIterator

import pytest
from aiohttp import web

from bench.sim_engine import KV_TOKENS, N_CTX, SimEngine, build_app
from harvest.campaign.run import engine_limit
from harvest.client import Client, MockTransport, RawResponse
from harvest.client.autoconc.settings import UNKNOWN_START
from harvest.client.capacity import (GAUGED_START, ask_capacity, metrics_reading, props_batch, server_info_batch,
                                     verdict)
from harvest.client.engine import EngineLimit
from harvest.config import parse_config

URL = "http://e:1"

#: SGLang 0.5.23's /server_info, cut to what harvest reads (srt/entrypoints/http_server.py
#: server_info: the resolved server args, the scheduler's init info, one internal state per
#: data-parallel rank from scheduler_components/internal_state.py).
SGLANG_0_5_23 = {"model_path": "/m", "max_running_requests": None, "dp_size": 2, "max_total_num_tokens": 500_000,
                 "max_req_input_len": 32767, "internal_states": [
                     {"effective_max_running_requests_per_dp": 160, "last_gen_throughput": 0.0},
                     {"effective_max_running_requests_per_dp": 160, "last_gen_throughput": 0.0}],
                 "version": "0.5.23"}
#: vLLM 0.32 in its development mode (VLLM_SERVER_DEV_MODE=1), GET /server_info?config_format=json
#: (entrypoints/serve/dev/server_info/api_router.py: the VllmConfig dumped as JSON).
VLLM_DEV = {"vllm_config": {"scheduler_config": {"max_num_seqs": 96, "max_num_batched_tokens": 2048},
                            "cache_config": {"block_size": 16}}, "vllm_env": {}, "system_env": {}}
#: vLLM 0.32's /metrics lines harvest reads (v1/metrics/loggers.py; the cache config's fields as the
#: labels of an info gauge, log_metrics_info).
VLLM_METRICS = ('vllm:num_requests_running{engine="0",model_name="m"} 0.0\n'
                'vllm:num_requests_waiting{engine="0",model_name="m"} 0.0\n'
                'vllm:cache_config_info{block_size="16",cache_dtype="auto",engine="0",num_gpu_blocks="4096",'
                'num_cpu_blocks="None"} 1.0\n')
#: llama-server's GET /props (tools/server: default_generation_settings, total_slots, ...).
LLAMA_PROPS = {"default_generation_settings": {"id": 0, "n_ctx": 2048, "params": {}}, "total_slots": 8,
               "model_path": "/m/model.gguf", "chat_template": "", "build_info": "b11434"}


def answering(routes: dict[str, tuple[int, object]], asked: list[str] | None = None):
    """A MockTransport handler: GET PATH -> (status, JSON or text); any other request 404."""

    async def handler(method: str, url: str, body: bytes | None, headers: dict[str, str]) -> RawResponse:
        path = "/" + url.split("://", 1)[1].split("/", 1)[1]
        if asked is not None:
            asked.append(f"{method} {url}")
        status, doc = routes.get(path, (404, {"detail": "Not Found"}))
        raw = doc.encode() if isinstance(doc, str) else json.dumps(doc).encode()
        return RawResponse(status, raw)
    return handler


async def asked_of(routes: dict[str, tuple[int, object]]) -> EngineLimit:
    transport = MockTransport(answering(routes))
    try:
        return await ask_capacity(transport, {}, URL, 5.0)
    finally:
        await transport.aclose()


async def test_sglang_0_5_23_publishes_what_its_schedulers_run_summed_over_data_parallel_ranks():
    limit = await asked_of({"/server_info?config_format=json": (200, SGLANG_0_5_23)})
    assert (limit.batch, limit.exact, limit.metrics) == (320, True, False)
    assert limit.source == "engine capacity 320 from /server_info over 2 data-parallel ranks, KV 500000 tokens"


async def test_an_older_sglang_answers_only_get_server_info_and_its_flag():
    old = {"max_running_requests": 64, "max_total_num_tokens": 90_000}  # no internal states of that shape
    limit = await asked_of({"/get_server_info": (200, old)})
    assert (limit.batch, limit.exact) == (64, True)
    assert limit.source == "engine capacity 64 from /get_server_info max_running_requests, KV 90000 tokens"


async def test_vllm_publishes_max_num_seqs_only_in_its_development_mode():
    dev = await asked_of({"/server_info?config_format=json": (200, VLLM_DEV), "/metrics": (200, VLLM_METRICS)})
    assert (dev.batch, dev.exact, dev.metrics) == (96, True, True)
    assert dev.source == "max_num_seqs 96 on /server_info (vLLM)"
    usual = await asked_of({"/metrics": (200, VLLM_METRICS)})
    assert (usual.batch, usual.exact, usual.metrics) == (GAUGED_START, False, True)
    assert usual.source.startswith("no batch limit published (KV 65536 tokens): 256, vLLM's default on a GPU")


async def test_llama_server_publishes_its_slots():
    limit = await asked_of({"/props": (200, LLAMA_PROPS)})
    assert (limit.batch, limit.exact, limit.metrics) == (8, True, False)
    assert limit.source == "engine capacity 8 from /props, 2048 tokens of context each"


async def test_an_engine_that_publishes_nothing_starts_high_and_says_so():
    limit = await asked_of({"/v1/models": (500, {"error": "scanning the cache"})})  # transformers serve
    assert limit == EngineLimit(None, exact=False, metrics=False, hint=False,
                                source="nothing published (/server_info, /props, /metrics): starting high")


@pytest.mark.parametrize("doc", [
    {"total_slots": "8"}, {"total_slots": True}, {"total_slots": 0}, {"total_slots": -4}, ["total_slots", 8],
    {"default_generation_settings": {"n_ctx": 2048}},
])
def test_props_of_another_shape_publish_nothing(doc):
    assert props_batch(doc) is None


@pytest.mark.parametrize("doc", [
    {"internal_states": [{"effective_max_running_requests_per_dp": "160"}]},
    {"internal_states": [{"effective_max_running_requests_per_dp": 160}, {}]},  # one rank silent: not a sum
    {"max_running_requests": None}, {"vllm_config": "max_num_seqs=96"}, {"vllm_config": {"scheduler_config": {}}},
    "<html>not found</html>", None,
])
def test_server_info_of_another_shape_publishes_nothing(doc):
    assert server_info_batch(doc, "/server_info") is None


def test_metrics_without_queue_gauges_are_no_gauges_to_steer_on():
    assert metrics_reading("process_cpu_seconds_total 1.0\n") == (False, None)
    assert metrics_reading("llamacpp:requests_processing 1\nllamacpp:requests_deferred 0\n") == (True, None)
    assert metrics_reading("vllm:num_requests_running 1 2 3 4\n") == (False, None)  # not the text format
    assert verdict(None, None, True, None).source.startswith("no batch limit published: 256")


async def test_a_proxy_that_answers_every_path_with_a_page_publishes_nothing():
    page = (200, "<html><body>gateway</body></html>")
    limit = await asked_of({"/server_info?config_format=json": page, "/props": page, "/metrics": page})
    assert limit.batch is None and not limit.metrics


# -- the first level, from the client's start check --------------------------------------------

def openai_job(url: str, **client: object):
    return parse_config({"server": {"engine": "openai", "base_url": url + "/v1", "model": "sim-model"},
                         "client": client})


async def first_level(url: str, **client: object) -> tuple[int, str]:
    """The default's first level on ``url`` as ``harvest run`` makes it (``engine = "openai"``)."""
    cfg = openai_job(url, **client)
    assert cfg.server is not None
    async with Client.from_config(cfg, engine=engine_limit(cfg.server)) as c:
        listing, = await c.start_check("sim-model", 10.0)
        assert listing.up
        target, = c.concurrency_targets()
        assert c.capacity() == target.target  # the pool lets that many out from the first item
        return target.target, target.why


@contextlib.asynccontextmanager
async def simulated(dialect: str, batch: int, *, metrics: bool = True, dev_mode: bool = False) -> AsyncIterator[str]:
    """``bench/sim_engine.py``'s engine in ``dialect`` served on loopback in this process."""
    engine = SimEngine(0.01, batch)
    app = build_app(engine, model="sim-model", output_tokens=4, metrics_on=metrics, dialect=dialect,
                    dev_mode=dev_mode)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    site = web.SockSite(runner, sock)
    await site.start()
    loop = asyncio.create_task(engine.loop())
    try:
        yield f"http://127.0.0.1:{sock.getsockname()[1]}"
    finally:
        loop.cancel()
        await asyncio.gather(loop, return_exceptions=True)
        await runner.cleanup()


@pytest.mark.parametrize(("dialect", "batch", "metrics", "dev", "level", "why"), [
    ("sglang", 48, True, False, 54, f"engine capacity 48 from /server_info, KV {KV_TOKENS} tokens, +6 queued"),
    ("sglang", 48, False, False, 48, f"engine capacity 48 from /server_info, KV {KV_TOKENS} tokens"),
    ("vllm", 96, True, True, 108, "max_num_seqs 96 on /server_info (vLLM), +12 queued"),
    ("vllm", 96, True, False, GAUGED_START,
     f"no batch limit published (KV {KV_TOKENS} tokens): 256, vLLM's default on a GPU, steered on its /metrics gauges"),
    ("llamacpp", 3, True, False, 5, f"engine capacity 3 from /props, {N_CTX} tokens of context each, +2 queued"),
    ("llamacpp", 3, False, False, 3, f"engine capacity 3 from /props, {N_CTX} tokens of context each"),
    ("transformers", 1024, False, False, UNKNOWN_START, "nothing published (/server_info, /props, /metrics): "
                                                        "starting high"),
])
async def test_the_first_level_on_a_simulated_engine_is_what_it_publishes(dialect, batch, metrics, dev, level, why):
    async with simulated(dialect, batch, metrics=metrics, dev_mode=dev) as url:
        assert await first_level(url) == (level, why)
    if dialect != "transformers" and not (dialect == "vllm" and not dev):
        assert batch <= level <= 2 * batch  # its capacity, up to x2 for a queue


async def test_auto_start_or_a_fixed_concurrency_asks_nothing():
    async with simulated("llamacpp", 3) as url:
        assert await first_level(url, auto_start=40) == (40, "[client] auto_start 40")
        cfg = openai_job(url, concurrency=7)
        assert cfg.server is not None
        async with Client.from_config(cfg, engine=engine_limit(cfg.server)) as c:
            await c.start_check("sim-model", 10.0)
            assert c.concurrency_targets() == () and c.capacity() == 7


async def test_a_launched_engine_is_not_asked_but_a_client_endpoint_beside_it_is():
    asked: list[str] = []
    routes = {"/v1/models": (200, {"data": [{"id": "m"}]}), "/props": (200, LLAMA_PROPS)}
    cfg = parse_config({"server": {"engine": "vllm", "model": "/m", "max_running_requests": 16, "port": 8000},
                        "client": {"endpoints": ["http://c:1"]}})
    assert cfg.server is not None
    client = Client.from_config(cfg, engine=engine_limit(cfg.server), transport=MockTransport(answering(routes, asked)))
    async with client:
        await client.start_check("m", 10.0)
        levels = {t.url: (t.target, t.why) for t in client.concurrency_targets()}
    assert levels == {"http://127.0.0.1:8000": (18, "batch limit 16 of the engine harvest launched, +2 queued"),
                      "http://c:1": (8, "engine capacity 8 from /props, 2048 tokens of context each")}
    assert [a for a in asked if "127.0.0.1:8000" in a] == ["GET http://127.0.0.1:8000/v1/models"], asked
    assert sorted(a for a in asked if "c:1" in a and "/v1/" not in a) == [
        "GET http://c:1/get_server_info", "GET http://c:1/metrics", "GET http://c:1/props",
        "GET http://c:1/server_info?config_format=json"], asked


async def test_a_real_llama_server_with_parallel_slots_starts_at_its_slots(llama_server):
    """llama-server (tests/engines.py: ``-np 8 -c 16384 --metrics``) pointed at as ``engine = "openai"``:
    its ``/props`` says 8 slots of 2048 tokens, its /metrics has llama.cpp's queue gauges, so the first
    level is the 8 slots plus a short queue, and the answers come back at that level."""
    cfg = parse_config({"server": {"engine": "openai", "base_url": llama_server.url + "/v1",
                                   "model": llama_server.model}, "sampling": {"max_tokens": 4}})
    assert cfg.server is not None
    async with Client.from_config(cfg, engine=engine_limit(cfg.server)) as client:
        listing, = await client.start_check(None, 30.0)
        assert listing.up
        target, = client.concurrency_targets()
        assert (target.target, target.why) == (10, "engine capacity 8 from /props, 2048 tokens of context each, "
                                                    "+2 queued")
        answers = await asyncio.wait_for(asyncio.gather(*(client.chat([{"role": "user", "content": f"say {i}"}])
                                                          for i in range(12))), 60)
        assert all(a.completion_tokens for a in answers)
