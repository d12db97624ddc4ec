"""``transformers serve`` 5.17 (the GPU machine's version) on the CPU, started as harvest's adapter
starts it, and what its routes answer; the start check against each answer of its ``/v1/models``.

What this version answers (docs/engines.md): ``/health`` 200 once the model is loaded; ``GET
/v1/models`` scans the Hugging Face hub cache instead of naming the model it serves: 500 where the
cache folder does not exist (the GPU machine's answer, there while it scans), else 200 with the
generative models cached there, never the folder it was started on; ``/metrics`` 404; a request
naming another model 400 ("Server is pinned to ..."). The start check must call it up in both cases
(a 500 is not "down") and take its model from the request that answers, not from that list.
"""

from __future__ import annotations

import asyncio
import json
import urllib.error
import urllib.request
import pytest

from harvest.client import Client
from harvest.config import ServerConfig
from harvest.server.engines.transformers import TransformersAdapter
from tests import engines
from tests.hf_cache import CACHED_ID, cache_other_model

pytestmark = pytest.mark.slow


def get(url: str) -> tuple[int, bytes]:
    try:
        with urllib.request.urlopen(url, timeout=30) as response:
            return response.status, response.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()


def post(url: str, body: dict) -> tuple[int, dict]:
    request = urllib.request.Request(url, data=json.dumps(body).encode(), method="POST",
                                     headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=60) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read() or b"{}")


async def start_check(url: str, model: str):
    async with Client([url]) as client:
        return (await client.start_check(model, 60.0))[0]


def test_the_start_check_calls_transformers_serve_up_whatever_its_model_list_answers(
        tmp_path, transformers_python, tiny_model):
    hub = tmp_path / "hub"  # not there yet: this version answers /v1/models with a 500
    port = engines.free_port()
    # On the CPU its paged cache takes this share of the host's RAM (by default most of it: 20 GB here).
    config = ServerConfig(engine="transformers", model=str(tiny_model), python=transformers_python, port=port,
                          gpu_memory_utilization=0.02)
    argv = TransformersAdapter().argv(config)
    server = engines.start_engine(argv, port=port, model=str(tiny_model), log_path=tmp_path / "serve.log",
                                  health="/health", env={"HF_HUB_CACHE": str(hub)}, timeout=300)
    try:
        assert get(f"{server.url}/health")[0] == 200
        assert get(f"{server.url}/metrics")[0] == 404
        status, body = get(f"{server.url}/v1/models")
        assert status == 500, (status, body[:300], server.log_tail())

        listing = asyncio.run(start_check(server.url, str(tiny_model)))
        # Up, shown by /health, and the model checked by one answered request: a 500 is not "down".
        assert listing.up, listing
        assert listing.ids is None and listing.models_answer == "answered 500", listing
        assert listing.shown_by == "/health answered 200" and listing.first is not None
        assert listing.first.status == 200, listing.first

        # The hub cache appears: the list names what is cached there, not the model served.
        cache_other_model(hub)
        status, body = get(f"{server.url}/v1/models")
        assert status == 200 and [m["id"] for m in json.loads(body)["data"]] == [CACHED_ID], body[:300]
        listing = asyncio.run(start_check(server.url, str(tiny_model)))
        assert listing.up and listing.ids == (CACHED_ID,), listing
        # Asking for a model from that list is refused; asking for the folder it serves is answered.
        status, doc = post(f"{server.url}/v1/chat/completions",
                           {"model": CACHED_ID, "messages": [{"role": "user", "content": "hi"}],
                            "max_tokens": 2})
        assert status == 400 and "pinned" in json.dumps(doc), (status, doc)
        status, doc = post(f"{server.url}/v1/chat/completions",
                           {"model": str(tiny_model), "messages": [{"role": "user", "content": "hi"}],
                            "max_tokens": 2})
        assert status == 200 and doc["usage"]["completion_tokens"] == 2, (status, doc)
    finally:
        server.stop()
    assert server.proc.poll() is not None
